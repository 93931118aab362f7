"""fsck: every stored byte verified; damage named with what refers to it; exit 4; checkout refuses."""

from __future__ import annotations

import os

import lmdb
import pytest

from agentcas import Store
from agentcas.cas import framing, packs
from agentcas.cas.digest import Digest, hash_blob
from agentcas.cas.objects import ChunkRef, HistoryPosition, Segment
from agentcas.cas.store import TABLES, save_object
from agentcas.refs import threads

from support import raw_objects
from support.cli import run_cli
from support.store_state import store_rows, views


def build(tmp_path, rollout: bool = True) -> tuple:
    """A closed LMDB store with main (files + history) and a fork; (store dir, facts)."""
    store_dir = tmp_path / "store"
    store, _ = Store.init(str(store_dir))
    ws = tmp_path / "ws"
    (ws / "sub").mkdir(parents=True)
    (ws / "small.txt").write_bytes(os.urandom(6000))          # one chunk: its id is the file id
    (ws / "sub" / "big.bin").write_bytes(os.urandom(1_200_000))  # a chunk list (max chunk 512 KiB)
    if rollout:
        store.history.append("main", b"".join(b'{"n": %d, "pad": "%s"}\n' % (i, b"y" * 200) for i in range(3000)))
    store.checkpoints.commit(str(ws), "first")
    store.threads.fork("main", "side", at=1234 if rollout else None)
    facts = {"tree": store.checkpoints.show("main").to_json()["tree"],
             "small": next(f["id"] for f in [item.to_json() for item in store.checkpoints.files("main")] if f["path"] == "small.txt"),
             "history": store.threads.get("main").history}
    with views(store) as txn:
        from agentcas.lineage.rollout import History
        facts["segment"] = History(txn).segment(facts["history"].segment) if rollout else None
    store.environment.close()
    return store_dir, facts


def raw_edit(store_dir, table: str, key: bytes, fn) -> None:
    """Rewrite one stored value through LMDB itself (no agentcas code), e.g. flip a byte."""
    env = lmdb.open(str(store_dir), max_dbs=len(TABLES) + 2)
    try:
        with env.begin(write=True) as txn:
            db = env.open_db(table.encode(), txn=txn, create=False)
            value = txn.get(key, db=db)
            assert value is not None
            new = fn(bytearray(value))
            if new is None:
                txn.delete(key, db=db)
            else:
                txn.put(key, bytes(new), db=db)
    finally:
        env.close()


def flip(index: int):
    def edit(value: bytearray):
        value[index] ^= 0x04
        return value
    return edit


def test_clean_store(tmp_path):
    store_dir, _ = build(tmp_path)
    result = run_cli("--json", "fsck", store=store_dir)
    assert result.code == 0, result
    doc = result.json()
    assert doc["ok"] and doc["problems"] == [] and doc["objects"] >= 8 and doc["roots"] >= 2
    text = run_cli("fsck", store=store_dir)
    assert text.code == 0 and "fsck: ok" in text.out


@pytest.mark.parametrize("where", ["chunk body", "chunk header", "tree", "chunk list"])
def test_flipped_object_byte_is_named_and_checkout_refuses(tmp_path, where):
    store_dir, facts = build(tmp_path, rollout=False)
    if where.startswith("chunk list"):
        store = Store.open(str(store_dir))
        with views(store) as txn:
            from agentcas.cas.objects import Tree
            from agentcas.cas.source import load_object
            sub = Tree.decode(load_object(txn, Digest.parse(facts["tree"]))).entries[1].id
            target = Tree.decode(load_object(txn, sub)).entries[0].chunks.hex()
        store.environment.close()
    else:
        target = facts["tree"] if where == "tree" else facts["small"]
    index = 3 if where == "chunk header" else -2
    raw_objects.edit_at(store_dir, bytes.fromhex(target), flip(index))

    result = run_cli("--json", "fsck", store=store_dir)
    assert result.code == 4, result
    assert target in result.err
    problem = next(p for p in result.json()["problems"] if p.get("id") == target)
    assert problem["what"] == "corrupt" and problem["root"].startswith(("thread", "reflog"))
    if where != "tree":
        assert problem["referenced_by"]  # the tree (or chunk list) that names it

    dest = tmp_path / "restored"
    checkout = run_cli("checkout", "main", dest, store=store_dir)
    assert checkout.code == 4, checkout
    assert not dest.exists() and not [p for p in tmp_path.iterdir() if ".restored" in p.name]


def test_flipped_ref_byte(tmp_path):
    store_dir, _ = build(tmp_path, rollout=False)
    raw_edit(store_dir, "refs", b"threads/main", flip(5))
    result = run_cli("fsck", store=store_dir)
    assert result.code == 4 and "threads/main" in result.err, result
    dest = tmp_path / "restored"
    assert run_cli("checkout", "main", dest, store=store_dir).code == 4
    assert not dest.exists()


def test_flipped_reflog_and_meta_bytes(tmp_path):
    store_dir, _ = build(tmp_path, rollout=False)
    raw_edit(store_dir, "reflog", b"threads/side\0" + (0).to_bytes(8, "big"), flip(10))
    result = run_cli("--json", "fsck", store=store_dir)
    assert result.code == 4 and "threads/side" in result.err, result
    assert result.json()["problems"][0]["table"] == "reflog"


def test_missing_object_names_its_referrer(tmp_path):
    store_dir, facts = build(tmp_path, rollout=False)
    raw_objects.edit_at(store_dir, bytes.fromhex(facts["small"]), lambda value: None)
    result = run_cli("--json", "fsck", store=store_dir)
    assert result.code == 4, result
    problem = result.json()["problems"][0]
    assert problem["what"] == "missing" and problem["id"] == facts["small"]
    assert problem["referenced_by"] == facts["tree"]
    assert facts["small"] in result.err and facts["tree"] in result.err


def test_corrupt_rollout_chunk(tmp_path):
    store_dir, facts = build(tmp_path)
    chunk = facts["segment"].chunks[0].id.hex()
    raw_objects.edit_at(store_dir, bytes.fromhex(chunk), flip(-3))
    cat = run_cli("rollout", "cat", "main", store=store_dir)
    assert cat.code == 4 and chunk in cat.err, cat
    result = run_cli("--json", "fsck", store=store_dir)
    assert result.code == 4 and chunk in result.err
    assert any(p.get("id") == chunk for p in result.json()["problems"])


def test_segment_that_lies_about_its_records(tmp_path):
    """A well-formed segment object (its id matches) whose count/digest do not match its bytes."""
    store = Store.memory()
    data = b'{"a": 1}\n{"a": 2}\n'
    chunk = hash_blob(data)
    from agentcas.cas.objects import EMPTY_POSITION
    wrong = Segment(EMPTY_POSITION, 0, None, 3, len(data), Digest(bytes(32)), (ChunkRef(chunk, len(data)),))

    def put(txn):
        save_object(txn, chunk, framing.frame(framing.KIND_CHUNK, data))
        save_object(txn, wrong.digest_id(), framing.frame(framing.KIND_SEGMENT, wrong.encode()))
    store.environment.write(put)
    doc = store.gc.fsck().to_json()
    assert not doc["ok"]
    assert doc["problems"][0]["id"] == wrong.digest_id().hex()
    assert "does not match its bytes" in doc["problems"][0]["message"]


def test_position_cut_inside_a_segment_is_recomputed(tmp_path):
    store = Store.memory()
    store.history.append("main", b"".join(b'{"n": %d}\n' % i for i in range(100)))
    store.threads.fork("main", "good", at=40)
    assert store.gc.fsck().to_json()["ok"]
    head = store.threads.get("good").history
    bogus = HistoryPosition(head.segment, head.seq, head.offset + 1, head.digest)

    def land(txn):
        state = threads.read_thread(txn, "good")
        assert threads.set_if_equals(txn, "good", state, threads.ThreadState(None, bogus), "test")
    store.environment.write(land)
    doc = store.gc.fsck().to_json()
    assert not doc["ok"]
    assert any(p["what"] == "position" and "good" in p["message"] for p in doc["problems"])


def test_damaged_database_file(tmp_path):
    store_dir, _ = build(tmp_path, rollout=False)
    path = store_dir / "data.mdb"
    with open(path, "r+b") as handle:
        handle.write(b"\xa5" * 8192)  # both meta pages
    result = run_cli("fsck", store=store_dir)
    assert result.code == 4, result
    assert "store database is corrupt" in result.err
    assert "Traceback" not in result.err


# --- an interrupted write (the crash-point walk) leaves orphans, not corruption ----------

def test_orphans_of_an_interrupted_import_are_not_corruption(tmp_path):
    """A killed import can land a checkpoint and a segment before the segment's chunks and
    base: unreachable, they are gc's garbage; fsck must pass (found by test_crashpoints)."""
    store_dir, facts = build(tmp_path)
    segment_id = facts["history"].segment
    with_chunk_missing = facts["segment"].chunks[0].id
    other = tmp_path / "other"
    Store.init(str(other))[0].close()
    opened = Store.open(str(store_dir))
    checkpoint = bytes.fromhex(opened.checkpoints.show("main").to_json()["checkpoint"])
    opened.close()
    with raw_objects.writing(store_dir) as source:
        with source.reader() as read:
            copied = {raw: packs.get(read, raw) for raw in (checkpoint, segment_id.raw)}  # no tree, no chunks, no base
    with raw_objects.writing(other) as target:
        target.write(lambda write: [raw_objects.plant(write, raw, value) for raw, value in copied.items()])
    result = run_cli("--json", "fsck", store=other)
    assert result.code == 0 and result.json()["ok"], result
    assert with_chunk_missing  # the segment's first chunk really is absent there


def test_reachable_segment_missing_its_chunk_is_still_reported(tmp_path):
    """The other side: the same missing chunk under a thread is a fsck failure (exit 4)."""
    store_dir, facts = build(tmp_path)
    chunk = facts["segment"].chunks[0].id.hex()
    raw_objects.edit_at(store_dir, bytes.fromhex(chunk), lambda value: None)
    result = run_cli("--json", "fsck", store=store_dir)
    assert result.code == 4 and chunk in result.err, result
    assert any(p["what"] == "missing" and p.get("id") == chunk for p in result.json()["problems"])


# --- objects that lie about what they name ------------------------------------------------------

def plant_lie(store: Store, kind: str) -> None:
    """Write, straight into the store, a thread `lies` whose checkpoint holds one file that lies."""
    from agentcas.cas.digest import hash_object
    from agentcas.cas.objects import EMPTY_POSITION, Checkpoint, ChunkList, Tree, TreeEntry
    from agentcas.refs.threads import ThreadState
    objects = {}

    def put(k, data):
        digest = hash_blob(data) if k == framing.KIND_CHUNK else hash_object(framing.KIND_NAMES[k], data)
        objects[digest.raw] = framing.frame(k, data)
        return digest

    a, b = put(framing.KIND_CHUNK, b"abcd"), put(framing.KIND_CHUNK, b"efgh")
    if kind in ("6-2", "10e15"):
        sizes = (6, 2) if kind == "6-2" else (10 ** 15, 4)
        chunk_list = put(framing.KIND_CHUNKLIST, ChunkList((ChunkRef(a, sizes[0]), ChunkRef(b, sizes[1]))).encode())
        entry = TreeEntry("lies", "file", hash_blob(b"abcdefgh"), 0o644, sum(sizes), chunk_list)
    elif kind == "single":
        entry = TreeEntry("lies", "file", a, 0o644, 10)
    elif kind == "file-hash":
        chunk_list = put(framing.KIND_CHUNKLIST, ChunkList((ChunkRef(a, 4), ChunkRef(b, 4))).encode())
        entry = TreeEntry("lies", "file", hash_blob(b"something else"), 0o644, 8, chunk_list)
    elif kind == "tree-as-chunk":
        tree = put(framing.KIND_TREE, Tree(()).encode())
        entry = TreeEntry("lies", "file", tree, 0o644, len(Tree(()).encode()))
    root = put(framing.KIND_TREE, Tree((entry,)).encode())
    cp = Checkpoint(root, (), "lies", "planted", "test", "2026-11-29T10:00:00.000000Z", {}, EMPTY_POSITION)
    cp_id = put(framing.KIND_CHECKPOINT, cp.encode())

    def land(txn):
        for raw, framed in objects.items():
            save_object(txn, Digest(raw), framed)
        threads.set_if_equals(txn, "lies", None, ThreadState(cp_id, EMPTY_POSITION), "test", "planted")

    store.environment.write(land)


LIES = {"6-2": "size", "10e15": "size", "single": "size", "file-hash": "does not hash to its id",
        "tree-as-chunk": "expected a chunk"}


@pytest.mark.parametrize("kind", sorted(LIES))
def test_fsck_finds_objects_that_lie_so_a_clean_store_checks_out(kind, tmp_path):
    store, _ = Store.init(str(tmp_path / "store"))
    plant_lie(store, kind)
    store.environment.close()
    result = run_cli("fsck", store=tmp_path / "store")
    assert result.code == 4, result
    assert LIES[kind] in result.err, result
    assert run_cli("checkout", "lies", tmp_path / "out", store=tmp_path / "store").code == 4


@pytest.mark.parametrize("kind", sorted(LIES))
def test_pull_from_a_store_whose_objects_lie_is_refused_and_writes_nothing(kind, tmp_path):
    from support.store_state import store_rows
    src, _ = Store.init(str(tmp_path / "src"))
    plant_lie(src, kind)
    src.environment.close()
    assert run_cli("init", tmp_path / "dst").code == 0
    assert run_cli("remote", "add", "them", tmp_path / "src", store=tmp_path / "dst").code == 0
    before = store_rows(tmp_path / "dst")
    result = run_cli("pull", "them", "lies", store=tmp_path / "dst")
    assert result.code == 4, result
    assert LIES[kind] in result.err and "Traceback" not in result.err
    assert store_rows(tmp_path / "dst") == before


def _two_segments_and_a_checkpoint(tmp_path):
    """A store at tmp_path/src whose thread main has two one-record segments and a
    checkpoint; (the store, main's history head)."""
    store, _ = Store.init(str(tmp_path / "src"))
    for i in range(2):
        store.history.append("main", b'{"n": %d}\n' % i)
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a").write_text("a\n")
    store.checkpoints.commit(str(ws), "one")
    return store, store.threads.get("main").history


def test_fsck_and_pull_refuse_lying_skip_pointers_and_generations(tmp_path):
    """A segment whose skip pointer is not its ancestor at skip_index, and a checkpoint whose
    generation does not follow its parent's: fsck names both, pull refuses them."""
    import blake3

    from agentcas.cas.digest import chain_prefix
    from agentcas.cas.objects import Checkpoint
    from agentcas.lineage.rollout import History
    from agentcas.refs.threads import ThreadState
    store, head = _two_segments_and_a_checkpoint(tmp_path)
    record = b'{"n": 2}\n'
    chunk = hash_blob(record)
    seg1 = History(store.source).segment(head.segment)
    # index 2 must skip to index 0 (skip_index(2) == 0); point it at index 1 instead.
    lying = Segment(head, 2, head.segment, 1, len(record), chain_prefix(head.digest, blake3.blake3(record).digest()),
                    (ChunkRef(chunk, len(record)),))
    assert seg1.index == 1
    seg_id = lying.digest_id()
    cp = store.checkpoints.get("main")[1]
    bad_generation = Checkpoint(cp.tree, (store.resolve("main"),), "main", "two", "t", cp.created_at, {},
                                cp.history, generation=5)

    def land(txn):
        save_object(txn, chunk, framing.frame(framing.KIND_CHUNK, record))
        save_object(txn, seg_id, framing.frame(framing.KIND_SEGMENT, lying.encode()))
        save_object(txn, bad_generation.digest(), framing.frame(framing.KIND_CHECKPOINT, bad_generation.encode()))
        threads.set_if_equals(txn, "skips", None, ThreadState(None, lying.end(seg_id)), "test", "planted")
        threads.set_if_equals(txn, "gens", None, ThreadState(bad_generation.digest(), cp.history), "test", "planted")

    store.environment.write(land)
    store.environment.close()
    result = run_cli("fsck", store=tmp_path / "src")
    assert result.code == 4
    assert "skip pointer" in result.out and "generation 5" in result.out, result
    assert run_cli("init", tmp_path / "dst").code == 0
    assert run_cli("remote", "add", "them", tmp_path / "src", store=tmp_path / "dst").code == 0
    for thread, fragment in (("skips", "skip pointer"), ("gens", "generation 5")):
        pulled = run_cli("pull", "them", thread, store=tmp_path / "dst")
        assert pulled.code == 4 and fragment in pulled.err, pulled


def test_a_segment_whose_index_does_not_follow_its_base_is_reported_and_refused(tmp_path):
    """A segment's index is its base's + 1 (lineage/rollout.py check_segment). One that says
    3 after a base with index 1, its skip pointer consistent with the 3 it claims (so that
    check alone would pass it): fsck names it, and a bundle carrying it is not imported."""
    import blake3

    from agentcas.cas.digest import chain_prefix
    from agentcas.cas.objects import Checkpoint
    from agentcas.lineage.rollout import History, skip_index
    from agentcas.refs.threads import ThreadState
    store, head = _two_segments_and_a_checkpoint(tmp_path)
    assert History(store.source).segment(head.segment).index == 1 and skip_index(3) == 1
    record = b'{"n": 2}\n'
    chunk = hash_blob(record)
    lying = Segment(head, 3, head.segment, 1, len(record), chain_prefix(head.digest, blake3.blake3(record).digest()),
                    (ChunkRef(chunk, len(record)),))
    seg_id = lying.digest_id()
    cp = store.checkpoints.get("main")[1]
    rooted = Checkpoint(cp.tree, (), "indexed", "a lying index", "t", cp.created_at, {}, lying.end(seg_id))

    def land(txn):
        save_object(txn, chunk, framing.frame(framing.KIND_CHUNK, record))
        save_object(txn, seg_id, framing.frame(framing.KIND_SEGMENT, lying.encode()))
        save_object(txn, rooted.digest(), framing.frame(framing.KIND_CHECKPOINT, rooted.encode()))
        threads.set_if_equals(txn, "indexed", None, ThreadState(rooted.digest(), rooted.history), "test", "planted")

    store.environment.write(land)
    store.environment.close()
    said = f"segment {seg_id.hex()} has index 3 after a base with index 1"
    result = run_cli("fsck", store=tmp_path / "src")
    assert result.code == 4 and said in result.out, result
    exported = run_cli("export", "indexed", "-o", tmp_path / "indexed.bundle", store=tmp_path / "src")
    assert exported.code == 0, exported
    assert run_cli("init", tmp_path / "dst").code == 0
    before = store_rows(tmp_path / "dst")
    imported = run_cli("import", tmp_path / "indexed.bundle", "--allow-unsigned", store=tmp_path / "dst")
    assert imported.code == 4 and said in imported.err and imported.err.count("\n") == 1, imported
    assert store_rows(tmp_path / "dst") == before


def test_fsck_finds_a_signature_listed_for_another_checkpoint(tmp_path):
    from agentcas.cas.sealed import seal, unseal
    from agentcas.signing import envelope, keys
    store_dir, _ = build(tmp_path, rollout=False)
    store = Store.open(str(store_dir))
    made = envelope.sign(keys.generate(), store.resolve("main"), "main")
    signed, framed = envelope.envelope_object(made)
    store.source.put_many({signed.raw: framed})
    store.meta.write(lambda txn: envelope.save_index_row(txn, made, signed))
    other = Digest(b"\x07" * 32)

    def move(txn):
        ((key, value),) = list(txn.scan("signatures"))
        key = bytes(key)
        payload = unseal("signatures", key, value)
        txn.delete("signatures", key)
        txn.put("signatures", other.raw + signed.raw, seal("signatures", other.raw + signed.raw, payload))

    store.environment.write(move)
    store.environment.close()
    result = run_cli("fsck", store=store_dir)
    assert result.code == 4 and "but it signs" in result.out, result


def test_fsck_reports_a_signature_listed_but_not_stored(tmp_path):
    """A `signatures` row naming a signature object the store does not hold is reported as
    missing, naming the signature and its checkpoint."""
    from agentcas.signing import envelope, keys
    store_dir, _ = build(tmp_path, rollout=False)
    store = Store.open(str(store_dir))
    checkpoint = store.resolve("main")
    made = envelope.sign(keys.generate(), checkpoint, "main")
    signed, _ = envelope.envelope_object(made)
    store.meta.write(lambda txn: envelope.save_index_row(txn, made, signed))  # the row, not the object
    store.environment.close()
    result = run_cli("fsck", store=store_dir)
    assert result.code == 4, result
    assert f"signature {signed.hex()} is missing (listed for checkpoint {checkpoint.hex()})" in result.out, result
