"""Remotes through the Python API: the remotes table, push and pull, and the transfer's checks.

Both stores are opened in this process (different paths, so one LMDB environment each);
"unchanged" is asserted by reading every table through the store's own environment.
"""

from __future__ import annotations

import base64
import json
import os
import random
import time

import pytest

from agentcas import Store
from agentcas.cas import framing
from agentcas.cas.store import TABLES
from agentcas.errors import ConflictError, IntegrityError, NotFound, UsageError
from agentcas.exchange import remote as remote_table
from agentcas.exchange.transfer import CorruptTransfer, LocalStoreEndpoint, NotFastForward, restamp, transfer
from agentcas.lineage.closure import Walker

from support import raw_objects
from support.store_state import tree_bytes, views


def rows(store: Store) -> dict:
    """Every row of every table (but the stat cache), read through the store's environment."""
    out = {}
    with views(store) as txn:
        for table in TABLES:
            if table != "statcache":
                out.update({(table, bytes(k)): bytes(v) for k, v in txn.scan(table)})
    return out


def records(count: int, size: int = 100, tag: str = "r") -> bytes:
    """`count` JSONL records of about `size` bytes of incompressible text each. Seeded: random
    base64 of a few MB now and then holds a run the secret scanner rightly takes for an API
    key (`AIza` + 35 characters), which made a push test refuse at random."""
    rng = random.Random(f"{tag}/{count}/{size}")
    lines = []
    for i in range(count):
        text = base64.b64encode(rng.randbytes(size * 3 // 4)).decode()
        lines.append(json.dumps({"seq": i, "tag": tag, "text": text}))
    return ("\n".join(lines) + "\n").encode()


@pytest.fixture
def pair(tmp_path, workspace):
    """(local store, remote store) with remote 'other' -> remote; local main has a checkpoint."""
    local, _ = Store.init(str(tmp_path / "local"))
    remote, _ = Store.init(str(tmp_path / "remote"))
    local.remotes.add("other", str(tmp_path / "remote"))
    local.history.append("main", records(20))
    local.checkpoints.commit(str(workspace), "first")
    return local, remote


def assert_complete(store: Store, thread: str) -> None:
    """The thread's whole closure is present and every object verifies."""
    state = store.threads.get(thread)
    with views(store) as txn:
        walker = Walker(txn, verify=True)
        if state.checkpoint is not None:
            list(walker.checkpoint(state.checkpoint))
        list(walker.history(state.history))


# --- the remotes table ----------------------------------------------------------------------

def test_normalise_url_accepts_paths_and_file_urls(tmp_path):
    assert remote_table.normalise_url("rel/dir", cwd="/base") == "file:///base/rel/dir"
    assert remote_table.normalise_url("/a/b/../c") == "file:///a/c"
    assert remote_table.normalise_url("file:///a/b") == "file:///a/b"
    assert remote_table.normalise_url("file://localhost/a/b") == "file:///a/b"
    url = remote_table.normalise_url("/a dir/%x")
    assert url == "file:///a%20dir/%25x" and remote_table.url_path(url) == "/a dir/%x"
    assert remote_table.normalise_url("file:///a%20dir") == "file:///a%20dir"


@pytest.mark.parametrize("url", ["s3://key:secret@bucket/x", "s3://bad bucket/x", "s3://bucket/x?q=1", "http://host/x", "file://otherhost/x",
                                 "file:///a?x=1", "file:///a#frag", "", "a\0b"])
def test_normalise_url_rejects_other_urls(url):
    with pytest.raises(UsageError):
        remote_table.normalise_url(url)


def test_remote_add_list_remove(tmp_path, store, monkeypatch):
    other, _ = Store.init(str(tmp_path / "o"))
    monkeypatch.chdir(tmp_path)
    added = store.remotes.add("o", "o")  # relative: resolved now, against the current directory
    assert added.to_json() == {"name": "o", "url": "file://" + str(tmp_path / "o"), "created": False}
    store.remotes.add("p", "file://" + str(tmp_path / "o"))
    assert [r["name"] for r in [item.to_json() for item in store.remotes.list()]] == ["o", "p"]
    assert store.remotes.remove("o").to_json()["removed"] is True
    assert [item.to_json() for item in store.remotes.list()] == [{"name": "p", "url": "file://" + str(tmp_path / "o")}]


def test_remote_add_refusals_change_nothing(tmp_path, store):
    Store.init(str(tmp_path / "o"))
    (tmp_path / "plain").mkdir()
    (tmp_path / "file").write_text("x")
    store.remotes.add("o", str(tmp_path / "o"))
    before = rows(store)
    with pytest.raises(ConflictError, match="already exists"):
        store.remotes.add("o", str(tmp_path / "o"))
    for bad_name in ["", "-x", "a/b", "a b", "x" * 65, "é"]:
        with pytest.raises(UsageError, match="invalid remote name"):
            store.remotes.add(bad_name, str(tmp_path / "o"))
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "notes.md").write_text("mine")
    for not_store in ["full", "file"]:  # a missing or empty directory gets a store (test_remote_cli.py)
        with pytest.raises(Exception) as info:
            store.remotes.add("n", str(tmp_path / not_store))
        assert info.value.exit_code == 1 and "remote 'n'" in str(info.value)
    assert os.listdir(tmp_path / "full") == ["notes.md"]
    with pytest.raises(UsageError, match="this store itself"):
        store.remotes.add("me", store.path)
    with pytest.raises(NotFound, match="no remote named"):
        store.remotes.remove("nope")
    assert rows(store) == before


# --- push --------------------------------------------------------------------------------------

def test_push_creates_the_remote_thread(pair, tmp_path):
    local, remote = pair
    result = local.remotes.push("other", "main").to_json()
    assert result["old_checkpoint"] is None and result["old_seq"] is None
    assert result["new_checkpoint"] == local.threads.get("main").checkpoint.hex()
    assert result["objects_sent"] == result["objects_total"] > 0 and result["bytes_sent"] > 0
    assert remote.threads.get("main") == local.threads.get("main")
    assert_complete(remote, "main")
    assert b"".join(remote.history.read("main")) == b"".join(local.history.read("main"))
    remote.checkpoints.checkout("main", str(tmp_path / "out"))
    assert tree_bytes(tmp_path / "out") == tree_bytes(tmp_path / "ws")
    entry = [item.to_json() for item in remote.threads.reflog("main")][0]
    assert entry["action"] == "push" and local.path in entry["message"]
    with views(remote) as txn:  # no write pin left behind
        assert txn.count("leases") == 0


def test_second_push_sends_nothing(pair):
    local, remote = pair
    local.remotes.push("other", "main")
    before = rows(remote)
    again = local.remotes.push("other", "main").to_json()
    assert (again["objects_sent"], again["bytes_sent"], again["up_to_date"]) == (0, 0, True)
    assert rows(remote) == before


def test_push_after_one_megabyte_append_sends_under_two_megabytes(pair, capsys):
    local, remote = pair
    local.history.append("main", records(3000, 2000))  # ~6 MB of history already pushed
    local.remotes.push("other", "main")
    appended = records(500, 2000, tag="new")  # one ~1 MB append
    assert 0.95e6 < len(appended) < 1.05e6
    local.history.append("main", appended)
    result = local.remotes.push("other", "main").to_json()
    with capsys.disabled():
        print(f"\n[remote] push after a {len(appended)}-byte append: {result['objects_sent']} objects, "
              f"{result['bytes_sent']} bytes sent (closure {result['objects_total']} objects)")
    assert result["bytes_sent"] < 2_000_000
    assert result["bytes_sent"] > 700_000  # it did send the new records (incompressible text)
    assert remote.threads.get("main") == local.threads.get("main")
    assert b"".join(remote.history.read("main", 3020)) == appended


def test_push_of_a_fork_sends_only_its_own_records(pair):
    local, remote = pair
    local.remotes.push("other", "main")
    local.threads.fork("main", "explore", at=10)
    local.history.append("explore", records(3, tag="fork"))
    result = local.remotes.push("other", "explore").to_json()
    # The new segment (its records inline, or in chunks); the shared prefix and checkpoint are
    # already there.
    assert 1 <= result["objects_sent"] <= 4
    assert remote.threads.get("explore") == local.threads.get("explore")
    assert b"".join(remote.history.read("explore")) == b"".join(local.history.read("explore"))


def test_push_a_thread_with_history_only(pair):
    local, remote = pair
    local.history.append("notes", records(5))
    local.remotes.push("other", "notes")
    assert remote.threads.get("notes").checkpoint is None
    assert b"".join(remote.history.read("notes")) == b"".join(local.history.read("notes"))


def test_push_unknown_thread_or_remote(pair):
    local, remote = pair
    before = rows(remote)
    with pytest.raises(NotFound, match="no thread named 'nope'"):
        local.remotes.push("other", "nope")
    with pytest.raises(NotFound, match="no remote named"):
        local.remotes.push("elsewhere", "main")
    with pytest.raises(UsageError):
        local.remotes.push("other", "bad..name")
    assert rows(remote) == before


def test_non_fast_forward_push_is_refused_then_forced(pair, workspace):
    local, remote = pair
    local.remotes.push("other", "main")
    first = local.threads.get("main").checkpoint
    (workspace / "task.json").write_text('{"step": 2}\n')
    local.checkpoints.commit(str(workspace), "second")
    local.remotes.push("other", "main")
    local.threads.revert("main", first.hex())                 # local main is now behind the remote
    (workspace / "task.json").write_text('{"step": 3}\n')
    local.checkpoints.commit(str(workspace), "diverging")          # ... and diverges from it
    before = rows(remote)
    with pytest.raises(NotFastForward, match="not an ancestor"):
        local.remotes.push("other", "main")
    assert rows(remote) == before
    result = local.remotes.push("other", "main", force=True).to_json()
    assert result["forced"] and result["new_checkpoint"] == local.threads.get("main").checkpoint.hex()
    assert remote.threads.get("main") == local.threads.get("main")
    assert [item.to_json() for item in remote.threads.reflog("main")][1]["action"] == "push"  # the replaced head stays in the reflog


def test_diverged_history_is_not_a_fast_forward(pair):
    local, remote = pair
    checkpoint = local.threads.get("main").checkpoint.hex()
    local.history.append("main", records(10, tag="a"))
    local.remotes.push("other", "main")                        # remote: same checkpoint, 30 records
    local.threads.revert("main", checkpoint)                   # back to 20 records
    local.history.append("main", records(12, tag="b"))  # 32 records, diverging at 20
    before = rows(remote)
    with pytest.raises(NotFastForward, match="first 30 records differ"):
        local.remotes.push("other", "main")
    assert rows(remote) == before
    local.threads.revert("main", checkpoint)                   # 20 records: a prefix, but shorter
    with pytest.raises(NotFastForward, match="more than"):
        local.remotes.push("other", "main")
    assert rows(remote) == before


# --- pull ----------------------------------------------------------------------------------------

def test_pull_creates_and_fast_forwards_the_local_thread(pair, tmp_path, workspace):
    local, remote = pair
    remote.remotes.add("back", local.path)
    remote.history.append("theirs", records(7, tag="t"))
    remote.checkpoints.commit(str(workspace), "their work", thread="theirs")
    result = local.remotes.pull("other", "theirs").to_json()
    assert result["objects_received"] > 0 and result["old_seq"] is None
    assert local.threads.get("theirs") == remote.threads.get("theirs")
    assert_complete(local, "theirs")
    assert [item.to_json() for item in local.threads.reflog("theirs")][0]["action"] == "pull"
    remote.history.append("theirs", records(2, tag="t2"))
    again = local.remotes.pull("other", "theirs").to_json()
    assert 1 <= again["objects_received"] <= 3 and again["old_seq"] == 7 and again["new_seq"] == 9
    assert local.remotes.pull("other", "theirs").to_json()["up_to_date"]
    assert b"".join(local.history.read("theirs")) == b"".join(remote.history.read("theirs"))


def test_non_fast_forward_pull_is_refused_then_forced(pair):
    local, remote = pair
    local.remotes.push("other", "main")
    local.history.append("main", records(3, tag="mine"))
    remote.history.append("main", records(3, tag="theirs"))
    before = rows(local)
    with pytest.raises(NotFastForward):
        local.remotes.pull("other", "main")
    assert rows(local) == before
    local.remotes.pull("other", "main", force=True)
    assert local.threads.get("main") == remote.threads.get("main")


# --- the transfer's own checks ------------------------------------------------------------------

class FlippingSource(LocalStoreEndpoint):
    """A source whose transport damages one object in flight."""

    def get_objects(self, ids):
        for i, (digest, framed) in enumerate(super().get_objects(ids)):
            if i == 1:
                framed = framed[:-1] + bytes([framed[-1] ^ 1])
            yield digest, framed


class WrongObjectSource(LocalStoreEndpoint):
    def get_objects(self, ids):
        objects = list(super().get_objects(ids))
        yield from reversed(objects)


class ShortSource(LocalStoreEndpoint):
    def get_objects(self, ids):
        yield from list(super().get_objects(ids))[:-1]


@pytest.mark.parametrize("source_class", [FlippingSource, WrongObjectSource, ShortSource])
def test_bad_objects_in_flight_are_refused_and_nothing_lands(pair, source_class):
    local, remote = pair
    before = rows(remote)
    source = source_class(local.backends, "file://" + local.path)
    target = LocalStoreEndpoint(remote.backends, "file://" + remote.path)
    with pytest.raises(CorruptTransfer) as info:
        transfer(source, target, "main", action="push")
    assert info.value.exit_code == 4
    assert rows(remote) == before


def test_lost_race_moves_nothing(pair, workspace):
    local, remote = pair

    class RacedTarget(LocalStoreEndpoint):
        def put_objects(self, stream):
            result = super().put_objects(stream)
            remote.checkpoints.commit(str(workspace), "racing commit")  # someone moves the ref meanwhile
            return result

    source = LocalStoreEndpoint(local.backends, "local")
    with pytest.raises(ConflictError, match="moved during the transfer"):
        transfer(source, RacedTarget(remote.backends, "remote"), "main", action="push")
    assert [item.to_json() for item in remote.threads.log("main")][0]["reason"] == "racing commit"
    assert len(remote.threads.log("main")) == 1


def test_received_objects_carry_the_receivers_time(pair, workspace, monkeypatch):
    local, remote = pair
    monkeypatch.setattr(framing.time, "time", lambda: 1000.0)
    (workspace / "new.txt").write_text("written long ago\n")
    local.checkpoints.commit(str(workspace), "old objects")
    monkeypatch.undo()
    started = int(time.time())
    local.remotes.push("other", "main")
    with views(remote) as txn:
        stamps = {framing.read_header(value)[3] for value in raw_objects.values(txn).values()}
    assert min(stamps) >= started - 1


def test_restamp_keeps_the_object():
    framed = framing.frame(framing.KIND_CHUNK, b"abc" * 100, written_at=5)
    again = restamp(framed, 77)
    assert framing.read_header(again)[3] == 77
    assert framing.unframe(again) == framing.unframe(framed)


def test_missing_object_in_target_after_transfer_is_caught(pair):
    """A target that claims to hold objects it lacks: the final closure check refuses."""
    local, remote = pair

    class LyingTarget(LocalStoreEndpoint):
        def has_many(self, ids):
            return {d.raw for d in ids}

    before = rows(remote)
    source = LocalStoreEndpoint(local.backends, "local")
    with pytest.raises(IntegrityError, match="is missing"):
        transfer(source, LyingTarget(remote.backends, "remote"), "main", action="push")
    assert rows(remote) == before


def test_target_rechecks_fast_forward_in_its_final_transaction(pair, workspace):
    """Even if the source's check were skipped, the target refuses a non-fast-forward."""
    local, remote = pair
    local.remotes.push("other", "main")
    (workspace / "task.json").write_text('{"step": "theirs"}\n')
    remote.checkpoints.commit(str(workspace), "theirs")
    (workspace / "task.json").write_text('{"step": "mine"}\n')
    local.checkpoints.commit(str(workspace), "mine")

    class CarelessSource(LocalStoreEndpoint):
        def fast_forward_problem(self, old, new):
            return None

    state = remote.threads.get("main")
    reflog = [item.to_json() for item in remote.threads.reflog("main")]
    with pytest.raises(NotFastForward, match="not an ancestor"):
        transfer(CarelessSource(local.backends, "local"), LocalStoreEndpoint(remote.backends, "remote"),
                 "main", action="push")
    assert remote.threads.get("main") == state and [item.to_json() for item in remote.threads.reflog("main")] == reflog
    with views(remote) as txn:
        assert txn.count("leases") == 0
