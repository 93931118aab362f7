"""Packed objects (format 3, cas/packs.py): how objects are appended, found, told apart and dropped."""

from __future__ import annotations

import os
import time

import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

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


def test_small_writes_fill_the_open_pack_up_to_one_page(tmp_path):
    """A step's few small objects extend the last pack while it fits one overflow page, so
    the pages the packs take are nearly full (the open pack is overwritten in place, not
    deleted and re-appended)."""
    env = open_lmdb(str(tmp_path / "store"), create=True)
    blobs = TableBlobStore(env)
    for step in range(200):  # a step: five objects of ~60-300 bytes, one transaction
        blobs.put_many({key(step * 5 + i): value(os.urandom(60 + 60 * i)) for i in range(5)})
    with env.reader() as txn:
        count = txn.count(packs.PACKS)
        sizes = [len(v) for _, v in txn.scan(packs.PACKS)]
    with env.env.begin() as raw:
        stat = raw.stat(env.dbs[packs.PACKS])
    limit = packs.small_pack_limit(env.leaf_bytes)
    record_bytes = 200 * (5 * (32 + 4 + framing.HEADER_SIZE) + sum(60 + 60 * i for i in range(5)))
    assert count <= record_bytes // (limit - 400) + 1 and max(sizes) <= limit
    pages = stat["leaf_pages"] + stat["overflow_pages"]
    assert sum(sizes) >= 0.85 * pages * stat["psize"], (sum(sizes), pages)
    env.close()


def test_a_small_pack_is_compressed_as_a_whole(tmp_path):
    """Objects that repeat each other's ids and text (a step's checkpoint, trees and segment)
    are stored once in a compressed pack, and read back as they were written."""
    env = open_lmdb(str(tmp_path / "store"), create=True)
    blobs = TableBlobStore(env)
    written = {}
    previous = os.urandom(32)
    for step in range(100):
        raw = key(step)
        doc = b'{"parent":"%s","message":"step %d of the same task","author":"agent"}' % (previous.hex().encode(), step)
        written[raw] = framing.frame(framing.KIND_CHECKPOINT, doc, written_at=1_700_000_000 + step)
        blobs.put_many({raw: written[raw]})
        previous = raw
    with env.reader() as txn:
        stored = [bytes(v) for _, v in txn.scan(packs.PACKS)]
    assert all(pack[0] == packs.COMPRESSED_VERSION for pack in stored)
    plain = sum(packs.plain_size(pack) for pack in stored)
    assert sum(map(len, stored)) < 0.6 * plain, (sum(map(len, stored)), plain)
    for raw, framed in written.items():
        assert framing.unframe(blobs.get(raw)) == framing.unframe(framed)
        assert framing.read_header(blobs.get(raw))[3] == framing.read_header(framed)[3]
    env.close()


def test_a_damaged_compressed_pack_is_named_on_read_and_by_fsck(tmp_path):
    env = open_lmdb(str(tmp_path / "store"), create=True)
    blobs = TableBlobStore(env)
    raws = [key(i) for i in range(4)]
    blobs.put_many({raw: value(b"hello %d " % i * 30) for i, raw in enumerate(raws)})

    def damage(txn):
        (number, pack), = ((packs.pack_number(k), bytearray(v)) for k, v in txn.scan(packs.PACKS))
        assert pack[0] == packs.COMPRESSED_VERSION
        pack[len(pack) // 2] ^= 0x40
        txn.put(packs.PACKS, packs.pack_key(number), bytes(pack))
    env.write(damage)
    with pytest.raises(IntegrityError, match=raws[1].hex()):
        blobs.get(raws[1])
    with env.reader() as txn:
        found = packs.check_packs(txn)
    assert any("compressed pack is damaged" in message for _, message, _ in found.problems)
    assert {raw for _, _, raw in found.problems if raw} == {raw[:packs.INDEX_KEY].hex() for raw in raws}
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

    def damage(txn):  # (written back plain: a plain pack is still read as one)
        (number, pack), = ((packs.pack_number(k), bytearray(packs.plain(packs.pack_number(k), v)))
                           for k, v in txn.scan(packs.PACKS))
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


def test_every_flipped_bit_of_a_compressed_pack_is_named_as_damage(tmp_path):
    """No id covers a pack's own bytes: its frame carries zstd's checksum, so a flip that
    still decompresses is refused too, never read as other records."""
    env = open_lmdb(str(tmp_path / "store"), create=True)
    blobs = TableBlobStore(env)
    blobs.put_many({key(i): value(b"record %d of a small pack " % i * 8) for i in range(6)})
    with env.reader() as txn:
        (number, stored), = ((packs.pack_number(k), bytes(v)) for k, v in txn.scan(packs.PACKS))
    assert stored[0] == packs.COMPRESSED_VERSION
    packs.plain(number, stored)  # whole, it inflates
    for at in range(packs.PACK_HEADER.size, len(stored)):
        for bit in (0x01, 0x80):
            damaged = bytearray(stored)
            damaged[at] ^= bit
            with pytest.raises(packs.CorruptPack):
                packs.plain(number, bytes(damaged))
    env.close()


def test_packs_of_the_same_number_in_two_stores_read_each_their_own(tmp_path):
    """Inflated packs are remembered by number for the next read, and serve only a pack of
    the very same bytes: another store's pack 0, or the open pack once extended, is inflated
    again."""
    first, second = (open_lmdb(str(tmp_path / name), create=True) for name in ("a", "b"))
    a_raw, b_raw = key(1, b"sameprefix"), key(2, b"sameprefix")
    TableBlobStore(first).put_many({a_raw: value(b"first store's object " * 5)})
    TableBlobStore(second).put_many({b_raw: value(b"second store's object " * 5)})
    for _ in range(2):
        assert TableBlobStore(first).get(a_raw) == value(b"first store's object " * 5)
        assert TableBlobStore(second).get(a_raw) is None
        assert TableBlobStore(second).get(b_raw) == value(b"second store's object " * 5)
    TableBlobStore(first).put_many({key(3): value(b"extends the open pack " * 5)})
    assert TableBlobStore(first).get(a_raw) == value(b"first store's object " * 5)
    first.close()
    second.close()


_PIECES = [b"step ", b'{"role":"user","content":"', b"the same task ", b"\x00\x01", b"tree entry "]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(st.tuples(st.integers(0, 4), st.integers(0, 2500), st.booleans(), st.booleans(),
                                   st.integers(-300, 300)),
                         min_size=1, max_size=8), min_size=1, max_size=12),
       st.data())
def test_any_writes_read_back_and_check_out_in_both_directions(batches, data):
    """Batches of small and large, compressible and random, raw and zstd objects, written one
    transaction each and partly deleted: every object reads back with its bytes and its
    written_at, the listing is the stored ids, and the packs check out both ways."""
    env = MemoryEnvironment()
    blobs = TableBlobStore(env)
    stored: dict[bytes, tuple[bytes, int]] = {}
    for batch in batches:
        items = {}
        for piece, size, random_bytes, compress, age in batch:
            body = os.urandom(size) if random_bytes else (_PIECES[piece] * (size // 4 + 1))[:size]
            when = 1_700_000_000 + age
            raw = key(len(stored) + len(items))
            items[raw] = framing.frame(framing.KIND_CHUNK, body, compress=compress, written_at=when)
            stored[raw] = (body, when)
        blobs.put_many(items)
    doomed = data.draw(st.sets(st.sampled_from(sorted(stored)), max_size=len(stored) // 2))
    blobs.delete_many(list(doomed))
    for raw in doomed:
        del stored[raw]
    for raw, (body, when) in stored.items():
        framed = blobs.get(raw)
        assert framing.unframe(framed) == (framing.KIND_CHUNK, body)
        assert framing.read_header(framed)[3] == when
    assert [info.key for info in blobs.list()] == sorted(stored)
    with env.reader() as txn:
        found = packs.check_packs(txn)
        assert found.problems == [] and found.indexed == len(stored)
        for number, pack in ((packs.pack_number(k), v) for k, v in txn.scan(packs.PACKS)):
            plain = packs.plain(number, pack)
            assert packs.plain_size(pack) == len(plain)
            assert pack[0] == packs.PACK_VERSION or len(pack) <= packs.small_pack_limit(packs.LEAF_BYTES)


def test_a_compressed_pack_whose_frame_has_no_checksum_is_refused(env):
    """The checksum is what stands for an id over a pack's bytes: a frame without one is damage."""
    blobs = TableBlobStore(env)
    raw = key(5)
    blobs.put_many({raw: value(b"a record in a compressed pack " * 6)})

    def strip(txn):
        (number, stored), = ((packs.pack_number(k), bytes(v)) for k, v in txn.scan(packs.PACKS))
        plain = packs.plain(number, stored)
        bare = zstandard.ZstdCompressor(level=3, write_content_size=True, write_checksum=False)
        txn.put(packs.PACKS, packs.pack_key(number), stored[:packs.PACK_HEADER.size]
                + bare.compress(plain[packs.PACK_HEADER.size:]))
    env.write(strip)
    with pytest.raises(IntegrityError, match="no checksum"):
        blobs.get(raw)
