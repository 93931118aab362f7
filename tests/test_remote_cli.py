"""`agentcas remote`, `push` and `pull` run the way a user runs them (subprocesses only,
so `store_rows` may read the stores raw between commands)."""

from __future__ import annotations

import base64
import json
import os
import random
import subprocess
import sys

import pytest

from agentcas.cas import framing

from support import raw_objects
from support.cli import AGENTCAS, run_cli
from support.store_state import store_rows


def jsonl(count: int, size: int, tag: str) -> str:
    """Incompressible records, seeded (as test_remote.records: random base64 may hold what the
    rollout secret scanner takes for an API key, and a push then refuses)."""
    rng = random.Random(f"{tag}/{count}/{size}")
    return "".join(json.dumps({"i": i, "tag": tag,
                               "text": base64.b64encode(rng.randbytes(size * 3 // 4)).decode()}) + "\n"
                   for i in range(count))


@pytest.fixture
def backends(tmp_path, workspace):
    """(local, other): local main has a checkpoint and 50 records; remote 'other' -> other."""
    local, other = tmp_path / "local", tmp_path / "other"
    # Set-up through the API in one child process (each CLI start costs a few tenths of a second).
    script = ("import sys; from agentcas import Store\n"
              "local, other, ws, records = sys.argv[1:]\n"
              "store, _ = Store.init(local); Store.init(other)\n"
              "store.history.append('main', records.encode()); store.checkpoints.commit(ws, 'first')\n"
              "store.remotes.add('other', other)\n")
    subprocess.run([sys.executable, "-c", script, str(local), str(other), str(workspace),
                    jsonl(50, 100, "a")], check=True)
    return local, other


def check_error(result, code: int, text: str) -> None:
    assert result.code == code, result
    assert result.err.startswith("agentcas: error: ") and text in result.err, result
    assert result.err.count("\n") == 1 and "Traceback" not in result.err


def test_remote_add_list_remove(tmp_path, backends):
    local, other = backends
    (tmp_path / "sub").mkdir()
    added = run_cli("--json", "remote", "add", "rel", "../other", store=local, cwd=tmp_path / "sub")
    assert added.code == 0 and added.json() == {"name": "rel", "url": f"file://{other}", "created": False}
    assert run_cli("remote", "add", "url", f"file://{other}", store=local).code == 0
    listed = run_cli("--json", "remote", "list", store=local)
    assert [r["name"] for r in listed.json()["remotes"]] == ["other", "rel", "url"]
    assert f"other\tfile://{other}" in run_cli("remote", "list", store=local).out
    assert run_cli("remote", "remove", "rel", store=local).code == 0
    assert [r["name"] for r in run_cli("--json", "remote", "list", store=local).json()["remotes"]] \
        == ["other", "url"]


def test_remote_add_errors_change_nothing(tmp_path, backends):
    local, other = backends
    (tmp_path / "not-a-store").mkdir()
    (tmp_path / "not-a-store" / "notes.md").write_text("mine\n")
    before = store_rows(local)
    check_error(run_cli("remote", "add", "other", other, store=local), 3, "already exists")
    check_error(run_cli("remote", "add", "other", tmp_path / "new", store=local), 3, "already exists")
    assert not (tmp_path / "new").exists()  # the name was taken: no store made for it
    check_error(run_cli("remote", "add", "x", tmp_path / "not-a-store", store=local), 1, "not an agentcas store")
    assert os.listdir(tmp_path / "not-a-store") == ["notes.md"]
    check_error(run_cli("remote", "add", "x", "http://host/p", store=local), 2, "unsupported remote URL")
    check_error(run_cli("remote", "add", "x", "s3://bucket/p", store=local), 2, "needs its refs database")
    check_error(run_cli("remote", "add", "x", "s3://bucket/p", "--refs", "postgresql://u:pw@h/db", store=local), 2,
                "must not hold a password")
    check_error(run_cli("remote", "add", "a/b", other, store=local), 2, "invalid remote name")
    check_error(run_cli("remote", "add", "me", local, store=local), 2, "this store itself")
    check_error(run_cli("remote", "remove", "nope", store=local), 1, "no remote named 'nope'")
    assert store_rows(local) == before


def test_push_then_push_again_then_pull(tmp_path, backends, workspace):
    local, other = backends
    pushed = run_cli("--json", "push", "other", "main", store=local)
    assert pushed.code == 0, pushed
    doc = pushed.json()
    assert doc["objects_sent"] == doc["objects_total"] > 0 and doc["old_checkpoint"] is None
    shown = run_cli("--json", "show", "main", store=other).json()
    assert shown["checkpoint"] == doc["new_checkpoint"]
    assert run_cli("rollout", "cat", "main", store=other).out == \
        run_cli("rollout", "cat", "main", store=local).out
    before = store_rows(other)
    again = run_cli("--json", "push", "other", "main", store=local)
    assert again.code == 0
    assert {k: again.json()[k] for k in ("objects_sent", "bytes_sent")} == {"objects_sent": 0, "bytes_sent": 0}
    assert store_rows(other) == before
    assert "up to date" in run_cli("push", "other", "main", store=local).out

    # Someone works on the other store; pull brings it back.
    (workspace / "task.json").write_text('{"step": 2}\n')
    assert run_cli("commit", workspace, "-m", "their step", store=other).code == 0
    pulled = run_cli("--json", "pull", "other", "main", store=local)
    assert pulled.code == 0, pulled
    assert pulled.json()["old_checkpoint"] == doc["new_checkpoint"]
    assert 0 < pulled.json()["objects_received"] < doc["objects_sent"]
    assert run_cli("--json", "show", "main", store=local).json()["reason"] == "their step"
    assert run_cli("checkout", "main", tmp_path / "out", store=local).code == 0
    assert (tmp_path / "out" / "task.json").read_text() == '{"step": 2}\n'
    text = run_cli("pull", "other", "main", store=local)
    assert text.code == 0 and "up to date" in text.out


def test_push_of_one_megabyte_append_sends_under_two_megabytes(backends, capsys):
    local, other = backends
    assert run_cli("push", "other", "main", store=local).code == 0
    appended = jsonl(500, 2000, "new")
    assert run_cli("rollout", "append", "main", "-", store=local, input=appended).code == 0
    doc = run_cli("--json", "push", "other", "main", store=local).json()
    with capsys.disabled():
        print(f"\n[remote cli] push after a {len(appended)}-byte append: {doc['bytes_sent']} bytes, "
              f"{doc['objects_sent']} objects")
    assert 700_000 < doc["bytes_sent"] < 2_000_000


def test_non_fast_forward_push_exits_3_and_force_replaces(backends, workspace):
    local, other = backends
    assert run_cli("push", "other", "main", store=local).code == 0
    (workspace / "task.json").write_text('{"step": "theirs"}\n')
    assert run_cli("commit", workspace, "-m", "theirs", store=other).code == 0
    (workspace / "task.json").write_text('{"step": "mine"}\n')
    assert run_cli("commit", workspace, "-m", "mine", store=local).code == 0
    before = store_rows(other)
    check_error(run_cli("push", "other", "main", store=local), 3, "not a fast-forward")
    assert store_rows(other) == before
    forced = run_cli("--json", "push", "other", "main", "--force", store=local)
    assert forced.code == 0 and forced.json()["forced"] is True
    assert run_cli("--json", "show", "main", store=other).json()["reason"] == "mine"


def test_non_fast_forward_pull_exits_3_and_leaves_local_unchanged(backends, workspace):
    local, other = backends
    assert run_cli("push", "other", "main", store=local).code == 0
    assert run_cli("rollout", "append", "main", "-", store=other, input=jsonl(2, 50, "x")).code == 0
    assert run_cli("rollout", "append", "main", "-", store=local, input=jsonl(2, 50, "y")).code == 0
    before = store_rows(local)
    check_error(run_cli("pull", "other", "main", store=local), 3, "not a fast-forward")
    assert store_rows(local) == before
    assert run_cli("pull", "other", "main", "--force", store=local).code == 0


def test_unknown_remote_missing_remote_store_and_unknown_thread(tmp_path, backends):
    local, other = backends
    check_error(run_cli("push", "nowhere", "main", store=local), 1, "no remote named 'nowhere'")
    check_error(run_cli("pull", "nowhere", "main", store=local), 1, "no remote named 'nowhere'")
    check_error(run_cli("push", "other", "nope", store=local), 1, "no thread named 'nope'")
    check_error(run_cli("pull", "other", "main", store=local), 1, "no thread named 'main'")
    check_error(run_cli("push", "other", "bad..name", store=local), 2, "invalid thread name")
    os.rename(other, tmp_path / "moved")
    check_error(run_cli("push", "other", "main", store=local), 1, "remote 'other'")


def corrupt_largest_object(store_dir) -> bytes:
    """Flip the last byte of the store's largest object, below agentcas's checks; its key."""
    with raw_objects.writing(store_dir) as env:
        with env.reader() as txn:
            key, value = max(raw_objects.values(txn).items(), key=lambda kv: len(kv[1]))
        assert framing.read_header(value)[0] == framing.KIND_CHUNK
        env.write(lambda txn: raw_objects.plant(txn, key, value[:-1] + bytes([value[-1] ^ 0x40])))
    return key


def test_corrupt_object_in_sender_exits_4_and_nothing_lands(backends):
    local, other = backends
    key = corrupt_largest_object(local)
    before = store_rows(other)
    result = run_cli("--json", "push", "other", "main", store=local)
    assert result.code == 4 and "corrupt" in result.err, result
    assert key.hex() in result.err and json.loads(result.out)["exit_code"] == 4  # the failure, as JSON
    assert store_rows(other) == before


def test_corrupt_object_in_remote_exits_4_on_pull_and_nothing_lands(backends, workspace):
    local, other = backends
    (workspace / "artifacts" / "more.bin").write_bytes(os.urandom(200_000))
    assert run_cli("commit", workspace, "-m", "theirs", "--thread", "theirs", store=other).code == 0
    corrupt_largest_object(other)
    before = store_rows(local)
    check_error(run_cli("pull", "other", "theirs", store=local), 4, "corrupt")
    assert store_rows(local) == before


def test_concurrent_pushes_to_one_thread_exactly_one_wins(tmp_path, workspace):
    """Three stores with unrelated histories push to one remote thread at once."""
    other = tmp_path / "other"
    locals_ = [tmp_path / f"local{i}" for i in range(3)]
    script = ("import sys, pathlib; from agentcas import Store\n"
              "ws, other, *locals_ = sys.argv[1:]\n"
              "Store.init(other)\n"
              "for i, path in enumerate(locals_):\n"
              "    store, _ = Store.init(path)\n"
              "    pathlib.Path(ws, 'task.json').write_text(str(i))\n"
              "    store.checkpoints.commit(ws, f'store {i}'); store.remotes.add('other', other)\n")
    subprocess.run([sys.executable, "-c", script, str(workspace), str(other)] + [str(p) for p in locals_],
                   check=True)
    procs = [subprocess.Popen([AGENTCAS, "--store", str(path), "--json", "push", "other", "main"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for path in locals_]
    results = [(proc.wait(timeout=120), proc.stdout.read(), proc.stderr.read()) for proc in procs]
    for proc in procs:
        proc.stdout.close()
        proc.stderr.close()
    codes = sorted(code for code, _, _ in results)
    assert codes == [0, 3, 3], results
    winner = next(json.loads(out) for code, out, _ in results if code == 0)
    shown = run_cli("--json", "show", "main", store=other).json()
    assert shown["checkpoint"] == winner["new_checkpoint"]
    assert len(run_cli("--json", "reflog", "main", store=other).json()["entries"]) == 1
    for code, _, err in results:
        if code == 3:
            assert "nothing was changed" in err and "Traceback" not in err


@pytest.mark.parametrize("bucket", ["bucket", "My_Bucket", "a", "b.c-d_e", "x" * 255, "x" * 256, "bad bucket", "b/",
                                    "b?q", "b#f"])
def test_remote_add_takes_the_bucket_names_store_takes(bucket):
    """A remote is another store's URL: `remote add` accepts a bucket name exactly when
    `--store s3://BUCKET/...` does (it refused e.g. `My_Bucket`, which boto3 and --store take)."""
    from agentcas.cas.blobstore.s3 import parse_url
    from agentcas.errors import UsageError
    from agentcas.exchange.remote import BadRemote, normalise_s3_url
    url = f"s3://{bucket}/team"
    try:
        parse_url(url)
        store_takes = "?" not in bucket and "#" not in bucket   # a query or fragment is never a remote
    except UsageError:
        store_takes = False
    try:
        normalise_s3_url(url)
        remote_takes = True
    except BadRemote:
        remote_takes = False
    assert remote_takes == store_takes


def test_remote_add_creates_a_store_in_a_new_or_empty_directory(tmp_path, backends, workspace):
    """As the README's first push is written: `remote add backup DIR` on a DIR that does not
    exist (or is empty) makes an empty store there, says so, and the push works."""
    local, _ = backends
    assert run_cli("commit", workspace, "-m", "one", store=local).code == 0
    (tmp_path / "empty").mkdir()
    for name, target in (("backup", tmp_path / "mnt" / "backup"), ("spare", tmp_path / "empty")):
        added = run_cli("remote", "add", name, target, store=local)
        assert added.code == 0 and f"Created an empty store at file://{target}" in added.out, added
        assert (target / "data.mdb").exists()
        pushed = run_cli("push", name, "main", store=local)
        assert pushed.code == 0, pushed
        assert run_cli("log", "main", store=target).code == 0
    assert run_cli("--json", "remote", "add", "third", tmp_path / "third", store=local).json()["created"] is True
