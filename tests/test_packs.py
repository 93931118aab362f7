"""Packed objects (format 3, cas/packs.py): how objects are appended, found, told apart and dropped."""

from __future__ import annotations

import os
import time

import pytest

from agentcas.cas import framing, packs
from agentcas.cas import store as store_module
from agentcas.cas.lmdb_store import open_lmdb
from agentcas.cas.store import MemoryEnvironment, TableBlobStore
from agentcas.errors import IntegrityError


@pytest.fixture(params=["memory", "lmdb"])
def env(request, tmp_path):
    if request.param == "memory":
        yield MemoryEnvironment()
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
    store.checkpoints.commit(str(ws), "one")
    return store


def test_fsck_counts_unindexed_pack_bytes_as_reclaimable(tmp_path):
    store = committed_store(tmp_path)
    doc = store.gc.fsck().to_json()
    assert doc["ok"] and doc["packs"]["reclaimable_bytes"] == 0 and doc["packs"]["count"] >= 1
    orphan = key(9)
    store.environment.write(lambda txn: packs.put_new(txn, {orphan: value(b"orphan" * 20)}))
    with store.environment.reader() as txn:
        (number, record), = [packs.locate(txn, orphan)]
    # Forget it the way a crash between two tables would not: only the index row goes.
    store.environment.write(lambda txn: txn.delete(packs.INDEX, orphan[:packs.INDEX_KEY]))
    store.environment.write(lambda txn: txn.put(packs.LIVE, packs.pack_key(number), bytes(
        _minus_one(txn.get(packs.LIVE, packs.pack_key(number)), record.length))))
    doc = store.gc.fsck().to_json()
    assert doc["ok"], doc["problems"]
    assert doc["packs"]["reclaimable_bytes"] == record.length


def _minus_one(row, length):
    from agentcas.cas.packed import varint
    count, size = packs._live(row)
    return varint(count - 1) + varint(size - length)


def test_fsck_names_an_index_row_whose_pack_is_gone_and_a_wrong_live_row(tmp_path):
    store = committed_store(tmp_path)
    with store.environment.reader() as txn:
        last = max(packs.pack_number(k) for k, _ in txn.scan(packs.PACKS))
    store.environment.write(lambda txn: txn.delete(packs.PACKS, packs.pack_key(last)))
    doc = store.gc.fsck().to_json()
    assert not doc["ok"]
    assert any(p["what"] == "index" and f"pack {last}, which is missing" in p["message"] for p in doc["problems"])
    store2 = committed_store(tmp_path / "two")
    store2.environment.write(lambda txn: txn.put(packs.LIVE, packs.pack_key(0), b"\x63\x01"))
    doc = store2.gc.fsck().to_json()
    assert any(p["what"] == "pack" and "live row" in p["message"] for p in doc["problems"])


def test_fsck_names_an_index_row_that_names_a_location_twice(tmp_path):
    # fsck counts index locations against the records found where their rows name them, and
    # resolves rows only when the two differ: a location named twice must still be named.
    store = committed_store(tmp_path)
    with store.environment.reader() as txn:
        row_key, row = next((bytes(k), bytes(v)) for k, v in txn.scan(packs.INDEX))
    store.environment.write(lambda txn: txn.put(packs.INDEX, row_key, row + row))
    doc = store.gc.fsck().to_json()
    assert not doc["ok"]
    assert [p for p in doc["problems"] if p["what"] == "index"] == [
        {"what": "index", "message": f"index row {row_key.hex()}: names one location twice", "id": row_key.hex()}]


# --- gc repacks ------------------------------------------------------------------------------------

def half_dead_store(tmp_path):
    """A store whose six ~65 KB packs each hold a live chunk and a chunk only a deleted thread named."""
    from agentcas import Store
    store, _ = Store.init(str(tmp_path / "store"))
    ws = tmp_path / "ws"
    ws.mkdir()
    for i in range(6):  # each first commit stores a kept and a doomed chunk in one pack
        (ws / f"kept{i}.bin").write_bytes(os.urandom(20_000))
        (ws / "doomed.bin").write_bytes(os.urandom(45_000))
        store.checkpoints.commit(str(ws), f"step {i}", thread=f"side{i}")
        (ws / "doomed.bin").unlink()
        store.checkpoints.commit(str(ws), f"kept {i}")
        store.threads.delete(f"side{i}")
    return store, ws


def test_gc_rewrites_mostly_dead_packs_and_keeps_every_live_object(tmp_path):
    store, ws = half_dead_store(tmp_path)
    before = store.gc.fsck().to_json()
    assert before["ok"] and before["packs"]["reclaimable_bytes"] == 0
    doc = store.gc.run(grace=0, expire_reflog=0, now=time.time() + 3600).to_json()
    assert doc["result"]["deleted"]["objects"] >= 6
    repacked = doc["result"]["repack"]
    after = store.gc.fsck().to_json()
    assert after["ok"] and after["packs"]["reclaimable_bytes"] == 0
    assert repacked["packs_rewritten"] >= 6 and repacked["objects_moved"] >= 6
    assert repacked["bytes_reclaimed"] >= 6 * 45_000
    assert after["packs"]["bytes"] <= before["packs"]["bytes"] - 6 * 45_000
    out = tmp_path / "out"
    store.checkpoints.checkout("main", str(out))
    assert sorted(p.name for p in out.iterdir()) == [f"kept{i}.bin" for i in range(6)]


@pytest.mark.parametrize("how", ["SIGKILL", "ENOSPC"])
def test_a_repack_killed_or_out_of_space_loses_nothing_and_the_next_gc_finishes(tmp_path, how):
    from support.cli import run_cli
    store, ws = half_dead_store(tmp_path)
    expected = {f.name: f.read_bytes() for f in ws.iterdir()}
    store.close()
    path = tmp_path / "store"
    gc = ("gc", "--grace", "0s", "--expire-reflog", "now")
    env = {"AGENTCAS_CRASH_AT": "gc.repack:1"} if how == "SIGKILL" else \
        {"AGENTCAS_FAULT_AT": "gc.repack:1", "AGENTCAS_FAULT": "ENOSPC"}
    failed = run_cli(*gc, store=path, env=env)
    if how == "SIGKILL":
        assert failed.code == -9, failed
    else:
        assert failed.code == 1 and failed.err.count("\n") == 1, failed
        assert failed.err.startswith("agentcas: error: no space left on device"), failed.err
    fsck = run_cli("--json", "fsck", store=path)
    assert fsck.code == 0 and fsck.json()["packs"]["reclaimable_bytes"] > 0, fsck
    out = tmp_path / "out"
    assert run_cli("checkout", "main", out, store=path).code == 0
    assert {f.name: f.read_bytes() for f in out.iterdir()} == expected
    again = run_cli("--json", *gc, store=path)
    assert again.code == 0 and again.json()["result"]["repack"]["packs_rewritten"] >= 6, again
    fsck = run_cli("--json", "fsck", store=path)
    assert fsck.code == 0 and fsck.json()["packs"]["reclaimable_bytes"] == 0, fsck


def test_a_listing_in_pack_order_lists_exactly_what_the_id_order_listing_does(env, monkeypatch):
    """Pack by pack, resumed across read transactions (a write extending the open pack
    between two), skipping the dead records of a partly dead pack, then the objects a store
    being upgraded still keeps in `objects`."""
    monkeypatch.setattr(store_module, "LIST_BATCH", 3)
    blobs = TableBlobStore(env)
    small = {key(i): value(os.urandom(40 + i), written_at=1_700_000_000 + i) for i in range(20)}
    big = {key(100 + i): value(os.urandom(10_000)) for i in range(9)}
    blobs.put_many(small)
    blobs.put_many(big)
    blobs.delete_many(list(small)[2:5] + list(big)[1:3])  # dead records left in live packs
    legacy = key(999)
    env.write(lambda txn: txn.put(packs.LEGACY, legacy, value(b"not yet upgraded")))
    listed = blobs.list_unordered()
    first = [next(listed) for _ in range(4)]
    late = {key(200 + i): value(os.urandom(30)) for i in range(2)}
    blobs.put_many(late)  # appended to the open pack the listing has not reached yet
    got = first + list(listed)
    assert len(got) == len({info.key for info in got})
    assert sorted(got, key=lambda info: info.key) == list(blobs.list())
    assert legacy in {info.key for info in got} and set(late) <= {info.key for info in got}
