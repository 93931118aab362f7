"""A store written by format 1 still opens, reads, verifies, collects and grows under format 2.

`tests/data/store-v1.tar.gz` is a frozen store written by agentcas at commit 0eb7735
(format 1: JSON objects, JSON reflog rows) by `tests/data/make_store_v1.py`: two commits
(the second with a multi-chunk file and a rollout record over a chunk), an append, a fork,
a branch and a revert. The facts below were read from it with that same code.
"""

import os
import shutil
import tarfile
from contextlib import contextmanager

import blake3
import pytest

from agentcas import Store
from agentcas.cas import encoding, framing, packs
from agentcas.cas.sealed import unseal
from agentcas.cas.store_format import STORE_FORMAT

HERE = os.path.dirname(os.path.abspath(__file__))
MAIN = "dab635a3e35aceea72881e22fcd82966be116fa363a18cbbf9ce3c50a415d772"
SECOND = "2523d2adb9f91122ccc09c4ac52e9b54b0fb53485b513823b515aca228c54a1a"
ROLLOUTS = {"main": "2c2c6787896ecf3ee4adfa05d6658f1582fe87a460f04963d2d07430b2d9a74e",
            "old": "2c2c6787896ecf3ee4adfa05d6658f1582fe87a460f04963d2d07430b2d9a74e",
            "explore": "a72d69bb3b4d3d7dd3fd0bfd0286a1f3aa47961a54e651005efbbb8794960206",
            "main@{1}": "72a0d5d97b88c43e1fa0c15cfd01f6c8885241b3c59ef4d6b924a822957b2782",
            "main@{2}": "b74bbcfd44e2ffcb7723dd671eaba554af580222f02cbdce4ab059d06aa54c73"}
FILES = [("big.bin", "6fdf969e6a8fbb9601278cc01e5418de35d800fa8969bb7a4c167415897e5212"),
         ("memory/notes.md", "d353494df2e181a97d1fd20c50f67e1ed9cdacd60a26f4f387c9549457a2e936"),
         ("task.json", "c2a778eee3950111a125e1ff56be1271f07e3b52316cfca8a218003904ec74ec")]


@pytest.fixture
def v1_store(tmp_path):
    with tarfile.open(os.path.join(HERE, "data", "store-v1.tar.gz")) as tar:
        tar.extractall(tmp_path, filter="data")
    return str(tmp_path / "v1store")


def meta_format(store: Store) -> dict:
    with store.environment.reader() as txn:
        return encoding.decode(unseal("meta", b"format", txn.get("meta", b"format")))


def b3(pieces) -> str:
    return blake3.blake3(b"".join(pieces)).hexdigest()


def test_v1_store_reads_as_it_did(v1_store):
    store = Store.open(v1_store)
    assert meta_format(store)["format"] == STORE_FORMAT and meta_format(store)["upgraded_from"] == 1
    assert {t["thread"]: t["checkpoint"] for t in [item.to_json() for item in store.threads.list()]} == {"main": MAIN, "old": MAIN, "explore": None}
    for rev, digest in ROLLOUTS.items():
        assert b3(store.history.read(rev)) == digest, rev
    assert store.resolve("main@{2}").hex() == SECOND
    assert [(f["path"], f["id"]) for f in [item.to_json() for item in store.checkpoints.files("main@{2}")]] == FILES
    assert [e["action"] for e in [item.to_json() for item in store.threads.reflog("main")]] == ["revert", "append", "commit", "commit"]
    assert [item.to_json() for item in store.threads.log("main")][0]["checkpoint"] == MAIN and store.checkpoints.show(SECOND).to_json()["format"] == 1
    assert store.gc.fsck().to_json()["ok"]


def test_v1_store_grows_in_format_2_and_keeps_every_guarantee(v1_store, tmp_path):
    store = Store.open(v1_store)
    out = tmp_path / "out"
    store.checkpoints.checkout("main@{2}", str(out))
    for path, digest in FILES:
        assert blake3.blake3((out / path).read_bytes()).hexdigest() == digest
    (out / "task.json").write_text('{"step": 3}\n')
    rollout = tmp_path / "r.jsonl"
    rollout.write_bytes(b"".join(store.history.read("main")) + b'{"role":"user","i":9}\n')
    new = store.checkpoints.commit(str(out), "third", rollout_file=str(rollout)).to_json()
    assert store.checkpoints.show("main").to_json()["format"] == 2 and store.checkpoints.show("main").to_json()["parents"] == [MAIN]
    with store.environment.reader() as txn:
        cp = framing.unframe(packs.get(txn, bytes.fromhex(new["checkpoint"])))[1]
        row = next(txn.scan("reflog", b"threads/main\0", reverse=True))
    assert cp[:1] != b"{" and unseal("reflog", bytes(row[0]), row[1])[:1] == b"\x02"
    # Old and new reflog rows side by side; old revisions still resolve.
    assert [e["action"] for e in [item.to_json() for item in store.threads.reflog("main")]][:2] == ["commit", "revert"]
    assert store.resolve("main@{3}").hex() == SECOND
    store.threads.fork("main@{3}", "again")
    assert b3(store.history.read("again")) == ROLLOUTS["main@{2}"]
    assert store.gc.fsck().to_json()["ok"]
    plan = store.gc.run(grace=0, expire_reflog=10**9).to_json()
    assert plan["result"]["deleted"]["objects"] == 0 and store.gc.fsck().to_json()["ok"]
    # A bundle of the mixed history (format 1 ancestors, a format 2 head) imports elsewhere.
    bundle = tmp_path / "b.bundle"
    store.remotes.export_bundle("main", str(bundle))
    other, _ = Store.init(str(tmp_path / "other"))
    other.remotes.import_bundle(str(bundle), allow_unsigned=True)
    assert b3(other.history.read("main")) == b3(store.history.read("main"))
    assert [item.to_json() for item in other.checkpoints.files("main~1")] == [item.to_json() for item in store.checkpoints.files(MAIN)] and other.gc.fsck().to_json()["ok"]
    assert other.resolve("main~1").hex() == MAIN and other.checkpoints.show(MAIN).to_json()["format"] == 1  # unchanged


def test_a_read_only_v1_store_opens_without_being_marked(v1_store):
    os.chmod(os.path.join(v1_store, "data.mdb"), 0o444)
    os.chmod(v1_store, 0o555)
    try:
        store = Store.open(v1_store)
        assert meta_format(store)["format"] == 1
        assert b3(store.history.read("main")) == ROLLOUTS["main"]
    finally:
        os.chmod(v1_store, 0o755)
        os.chmod(os.path.join(v1_store, "data.mdb"), 0o644)


# --- format 2 -> 3: objects move into packs ------------------------------------------------------
#
# `tests/data/store-v2.tar.gz` is a frozen store written by format 2 (the last release that kept
# one row per object) by `tests/data/make_store_v2.py`: the history above, then 40 small commits
# on a thread `steps`. The facts below were read from it with that same code.

V2_THREADS = {"explore": None, "main": "b0ba99c57d6ba39a44ecd37a21cca6398d08a58adbe8c6a8da4c3e5fb52b2461",
              "old": "b0ba99c57d6ba39a44ecd37a21cca6398d08a58adbe8c6a8da4c3e5fb52b2461",
              "steps": "a12b21761098b2016f0bb3b0c805d16d5514a0246921e99ae85d8e9eed3fc383"}
V2_ROLLOUTS = dict(ROLLOUTS, steps="78218fbeeb9f7ba8161a837e7a2acb79c3e150afacf6b3c716bb457db089ca05",
                   **{"steps~20": "756cc427156c771ee7c2abff7ade92ffb53516d947008a0c134f0cfee7d32647"})
V2_SECOND = "74940f22e2938ace432b4747f18ec7b3f71156e98646f34350a3959e5757a67e"
V2_STEPS_FILES = [("memory/notes.md", "d353494df2e181a97d1fd20c50f67e1ed9cdacd60a26f4f387c9549457a2e936"),
                  ("memory/state.json", "25847ba75c59183913c41fdc01525b70e5d7b11e4d23f0e046a4ee9bebe039c0"),
                  ("task.json", "c2a778eee3950111a125e1ff56be1271f07e3b52316cfca8a218003904ec74ec")]
V2_OBJECTS = 215


@pytest.fixture
def v2_store(tmp_path):
    with tarfile.open(os.path.join(HERE, "data", "store-v2.tar.gz")) as tar:
        tar.extractall(tmp_path, filter="data")
    return str(tmp_path / "v2store")


def assert_v2_facts(store: Store) -> None:
    assert {t.thread: t.checkpoint for t in store.threads.list()} == V2_THREADS
    for rev, digest in V2_ROLLOUTS.items():
        assert b3(store.history.read(rev)) == digest, rev
    assert store.resolve("main@{2}").hex() == V2_SECOND
    assert [(f.path, f.id) for f in store.checkpoints.files("main@{2}")] == FILES
    assert [(f.path, f.id) for f in store.checkpoints.files("steps")] == V2_STEPS_FILES
    assert store.blobs.count() == V2_OBJECTS and store.gc.fsck().ok


def raw_tables(store: Store) -> dict:
    with store.environment.reader() as txn:
        return {table: txn.count(table) for table in ("objects",) + packs.TABLES}


@contextmanager
def read_only(path: str):
    os.chmod(os.path.join(path, "data.mdb"), 0o444)
    os.chmod(path, 0o555)
    try:
        yield
    finally:
        os.chmod(path, 0o755)
        os.chmod(os.path.join(path, "data.mdb"), 0o644)


def test_v2_store_upgrades_in_place_and_reads_as_it_did(v2_store):
    store = Store.open(v2_store)
    assert meta_format(store)["format"] == STORE_FORMAT and meta_format(store)["upgraded_from"] == 2
    counts = raw_tables(store)
    assert counts["objects"] == 0 and counts["packindex"] == V2_OBJECTS
    assert counts["packs"] < V2_OBJECTS / 2  # small objects share packs
    assert_v2_facts(store)
    doc = store.gc.run(grace=0, expire_reflog=10**9)
    assert doc.result.deleted_objects == 0
    store.close()
    assert_v2_facts(Store.open(v2_store))  # opening again changes nothing


def test_a_read_only_v2_store_reads_without_being_upgraded(v2_store):
    with read_only(v2_store):
        store = Store.open(v2_store)
        assert meta_format(store)["format"] == 2
        assert_v2_facts(store)
        store.close()


def test_an_older_agentcas_stops_at_an_upgraded_store(v2_store, monkeypatch):
    Store.open(v2_store).close()
    from agentcas.cas import store_format
    monkeypatch.setattr(store_format, "STORE_FORMAT", 2)
    with pytest.raises(store_format.StoreFormatError, match=f"store format {STORE_FORMAT} is newer"):
        Store.open(v2_store)


def test_a_format_3_store_is_marked_4_so_an_agentcas_from_before_compressed_packs_stops(tmp_path, monkeypatch):
    """Compressed packs are unreadable to an agentcas of format 3: the first writable open
    marks the store before writing any, and that agentcas stops at the mark (exit 4),
    instead of reading the new packs as damaged."""
    from agentcas.cas import store_format
    path = str(tmp_path / "s")
    with monkeypatch.context() as old:
        old.setattr(store_format, "STORE_FORMAT", 3)
        Store.init(path)[0].close()
        ws = tmp_path / "ws"
        ws.mkdir()
        (ws / "a.txt").write_text("one\n")
        made = Store.open(path)
        made.checkpoints.commit(str(ws), "made by format 3")
        assert meta_format(made)["format"] == 3
        made.close()
    with read_only(path):  # a store this agentcas cannot write is read as it is, and keeps its format
        unwritable = Store.open(path)
        assert meta_format(unwritable)["format"] == 3
        unwritable.close()
    store = Store.open(path)
    assert meta_format(store)["format"] == 4 and meta_format(store)["upgraded_from"] == 3
    assert [e.to_json()["reason"] for e in store.threads.log("main")] == ["made by format 3"]
    store.close()
    monkeypatch.setattr(store_format, "STORE_FORMAT", 3)
    with pytest.raises(store_format.StoreFormatError, match="store format 4 is newer than this agentcas reads \\(3\\)"):
        Store.open(path)


def test_an_upgrade_killed_at_every_step_resumes_and_loses_nothing(v2_store, tmp_path):
    """SIGKILL at every durable step of the upgrade (the format mark, each batch of objects
    moved): the store reads as before at every point, fsck passes, and the next open finishes."""
    from support.cli import run_cli
    pristine = tmp_path / "pristine"
    shutil.copytree(v2_store, pristine)
    env = {"AGENTCAS_CRASH_BATCH": "16"}
    count = tmp_path / "count"
    assert run_cli("log", "main", store=v2_store, env=dict(env, AGENTCAS_CRASH_COUNT=str(count))).code == 0
    labels = count.read_text().split()
    assert len(labels) >= 2 * (1 + V2_OBJECTS // 16)  # the mark, then batches: two points each
    for point in range(1, len(labels) + 1):
        shutil.rmtree(v2_store)
        shutil.copytree(pristine, v2_store)
        killed = run_cli("log", "main", store=v2_store, env=dict(env, AGENTCAS_CRASH_AT=str(point)))
        assert killed.code == -9, (point, killed)
        with read_only(v2_store):  # as the crash left it: reads fall back to rows not yet moved
            halfway = Store.open(v2_store)
            assert_v2_facts(halfway)
            halfway.close()
        store = Store.open(v2_store)  # finishes the upgrade
        assert raw_tables(store)["objects"] == 0 and meta_format(store)["format"] == STORE_FORMAT
        assert_v2_facts(store)
        store.close()
