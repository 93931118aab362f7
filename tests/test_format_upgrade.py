"""A store written by format 1 still opens, reads, verifies, collects and grows under format 2.

`tests/data/store-v1.tar.gz` is a frozen store written by agentcas at commit 0eb7735
(format 1: JSON objects, JSON reflog rows) by `tests/data/make_store_v1.py`: two commits
(the second with a multi-chunk file and a rollout record over a chunk), an append, a fork,
a branch and a revert. The facts below were read from it with that same code.
"""

import os
import tarfile

import blake3
import pytest

from agentcas import Store
from agentcas.cas import encoding, framing
from agentcas.cas.sealed import unseal

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
    with store.objects.reader() as txn:
        return encoding.decode(unseal("meta", b"format", txn.get("meta", b"format")))


def b3(pieces) -> str:
    return blake3.blake3(b"".join(pieces)).hexdigest()


def test_v1_store_reads_as_it_did(v1_store):
    store = Store.open(v1_store)
    assert meta_format(store)["format"] == 2 and meta_format(store)["upgraded_from"] == 1
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
    with store.objects.reader() as txn:
        cp = framing.unframe(txn.get("objects", bytes.fromhex(new["checkpoint"])))[1]
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
