"""Packed objects (format 3, cas/packs.py): how objects are appended, found, told apart and dropped."""

from __future__ import annotations

import os

import pytest

from agentcas.cas import framing, packs
from agentcas.cas.lmdb_store import open_lmdb
from agentcas.cas.store import MemoryObjectStore, TableBlobStore
from agentcas.errors import IntegrityError


@pytest.fixture(params=["memory", "lmdb"])
def env(request, tmp_path):
    if request.param == "memory":
        yield MemoryObjectStore()
        return
    store = open_lmdb(str(tmp_path / "store"), create=True)
    yield store
    store.close()


def value(data: bytes, written_at: int = 1_700_000_000) -> bytes:
    return framing.frame(framing.KIND_CHUNK, data, compress=False, written_at=written_at)


def key(i: int, prefix: bytes = b"") -> bytes:
    return (prefix + i.to_bytes(4, "big") + os.urandom(32))[:32]


def test_objects_read_back_with_their_own_written_at(env):
    blobs = TableBlobStore(env)
    items = {key(i): value(b"x%d" % i * 30, written_at=1_700_000_000 + i * 1000) for i in range(50)}
    assert blobs.put_many(items)[0] == 50
    assert blobs.put_many(items) == (0, 0)  # create-if-absent
    for raw, stored in items.items():
        assert blobs.get(raw) == stored
        assert blobs.header(raw) == stored[:framing.HEADER_SIZE]
    listed = list(blobs.list())
    assert [info.key for info in listed] == sorted(items)
    assert {info.key: info.written_at for info in listed} == {raw: framing.read_header(v)[3] for raw, v in items.items()}
    start = sorted(items)[10]
    assert [info.key for info in blobs.list_from(start)] == sorted(items)[10:]


def test_short_key_collision_is_told_apart_by_the_full_id(env):
    blobs = TableBlobStore(env)
    twins = [key(1, b"same8byt"), key(2, b"same8byt"), key(3, b"same8byt")]
    blobs.put_many({twins[0]: value(b"first"), twins[1]: value(b"second")})
    with env.reader() as txn:
        assert txn.count(packs.INDEX) == 1  # one index row holds both locations
    assert blobs.get(twins[0]) == value(b"first") and blobs.get(twins[1]) == value(b"second")
    assert blobs.get(twins[2]) is None and blobs.has_many(twins) == set(twins[:2])
    assert blobs.delete_many([twins[0]]) == 1
    assert blobs.get(twins[0]) is None and blobs.get(twins[1]) == value(b"second")
    assert [info.key for info in blobs.list()] == [twins[1]]


def test_small_writes_fill_the_open_pack_and_leaf_pages(tmp_path):
    """A step's few small objects extend the last pack while it fits a leaf page, and each leaf
    page holds two packs (the open pack is overwritten in place, not deleted and re-appended)."""
    env = open_lmdb(str(tmp_path / "store"), create=True)
    blobs = TableBlobStore(env)
    for step in range(200):  # a step: five objects of ~60-300 bytes, one transaction
        blobs.put_many({key(step * 5 + i): value(os.urandom(60 + 60 * i)) for i in range(5)})
    with env.reader() as txn:
        count = txn.count(packs.PACKS)
        sizes = [len(v) for _, v in txn.scan(packs.PACKS)]
    with env.env.begin() as raw:
        leaf_pages = raw.stat(env.dbs[packs.PACKS])["leaf_pages"]
    record_bytes = 200 * (5 * (32 + 4 + framing.HEADER_SIZE) + sum(60 + 60 * i for i in range(5)))
    assert count <= record_bytes // 1500 and max(sizes) <= env.leaf_bytes
    assert leaf_pages <= count // 2 + 2, (leaf_pages, count)
    env.close()


def test_large_objects_share_packs_of_about_64_kib(env):
    blobs = TableBlobStore(env)
    blobs.put_many({key(i): value(os.urandom(10_000)) for i in range(40)})
    with env.reader() as txn:
        sizes = [len(v) for _, v in txn.scan(packs.PACKS)]
    assert len(sizes) == 6 and all(size < packs.BIG_PACK_BYTES + 11_000 for size in sizes)  # 7 + ... + 5


def test_a_pack_is_dropped_with_its_last_object_and_live_bytes_are_counted(env):
    blobs = TableBlobStore(env)
    items = {key(i): value(os.urandom(10_000)) for i in range(10)}  # packs of 7 and 3
    blobs.put_many(items)
    raws = list(items)
    blobs.delete_many(raws[5:8])
    with env.reader() as txn:
        assert [packs._live(row)[0] for _, row in txn.scan(packs.LIVE)] == [5, 2]
    blobs.delete_many(raws[8:])  # the second pack's last objects: the pack goes with them
    with env.reader() as txn:
        assert txn.count(packs.PACKS) == 1
    blobs.delete_many(raws[:5])
    with env.reader() as txn:
        assert txn.count(packs.PACKS) == 0 and txn.count(packs.LIVE) == 0 and txn.count(packs.INDEX) == 0


def test_a_damaged_record_is_named_on_read(env):
    blobs = TableBlobStore(env)
    raw = key(7)
    blobs.put_many({raw: value(b"hello" * 40)})

    def damage(txn):
        (number, pack), = ((packs.pack_number(k), bytearray(v)) for k, v in txn.scan(packs.PACKS))
        pack[packs.PACK_HEADER.size + 32] = 0xF0  # the kind/codec byte: no such kind
        txn.put(packs.PACKS, packs.pack_key(number), bytes(pack))
    env.write(damage)
    with pytest.raises(IntegrityError, match=raw.hex()):
        blobs.get(raw)


def test_an_index_row_pointing_at_another_object_is_named(env):
    blobs = TableBlobStore(env)
    a, b = key(1, b"aaaaaaaa"), key(2, b"bbbbbbbb")
    blobs.put_many({a: value(b"a" * 50), b: value(b"b" * 50)})
    env.write(lambda txn: txn.put(packs.INDEX, a[:packs.INDEX_KEY], txn.get(packs.INDEX, b[:packs.INDEX_KEY])))
    with pytest.raises(IntegrityError, match=a.hex()):
        blobs.get(a)


# --- fsck in both directions ------------------------------------------------------------------------

def committed_store(tmp_path):
    from agentcas import Store
    store, _ = Store.init(str(tmp_path / "store"))
    ws = tmp_path / "ws"
    ws.mkdir()
    for i in range(5):
        (ws / f"f{i}.txt").write_bytes(os.urandom(300 + i))
    store.commit(str(ws), "one")
    return store


def test_fsck_counts_unindexed_pack_bytes_as_reclaimable(tmp_path):
    store = committed_store(tmp_path)
    doc = store.fsck()
    assert doc["ok"] and doc["packs"]["reclaimable_bytes"] == 0 and doc["packs"]["count"] >= 1
    orphan = key(9)
    store.objects.write(lambda txn: packs.put_new(txn, {orphan: value(b"orphan" * 20)}))
    with store.objects.reader() as txn:
        (number, record), = [packs.locate(txn, orphan)]
    # Forget it the way a crash between two tables would not: only the index row goes.
    store.objects.write(lambda txn: txn.delete(packs.INDEX, orphan[:packs.INDEX_KEY]))
    store.objects.write(lambda txn: txn.put(packs.LIVE, packs.pack_key(number), bytes(
        _minus_one(txn.get(packs.LIVE, packs.pack_key(number)), record.length))))
    doc = store.fsck()
    assert doc["ok"], doc["problems"]
    assert doc["packs"]["reclaimable_bytes"] == record.length


def _minus_one(row, length):
    from agentcas.cas.packed import varint
    count, size = packs._live(row)
    return varint(count - 1) + varint(size - length)


def test_fsck_names_an_index_row_whose_pack_is_gone_and_a_wrong_live_row(tmp_path):
    store = committed_store(tmp_path)
    with store.objects.reader() as txn:
        last = max(packs.pack_number(k) for k, _ in txn.scan(packs.PACKS))
    store.objects.write(lambda txn: txn.delete(packs.PACKS, packs.pack_key(last)))
    doc = store.fsck()
    assert not doc["ok"]
    assert any(p["what"] == "index" and f"pack {last}, which is missing" in p["message"] for p in doc["problems"])
    store2 = committed_store(tmp_path / "two")
    store2.objects.write(lambda txn: txn.put(packs.LIVE, packs.pack_key(0), b"\x63\x01"))
    doc = store2.fsck()
    assert any(p["what"] == "pack" and "live row" in p["message"] for p in doc["problems"])
