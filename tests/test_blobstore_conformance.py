"""One conformance suite for every BlobStore backend (memory, S3 on a real SeaweedFS, the cache).

Backends are built by `make_blobstore(kind, ...)` from BLOB_BACKENDS; processes that race
reopen the same store from `reopen_spec` (backends a child process can reach again).
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import threading
import time

import pytest

from agentcas.cas import framing
from agentcas.cas.blobstore.base import BlobInfo
from agentcas.cas.blobstore.cached import CachedBlobStore
from agentcas.cas.blobstore.memory import MemoryBlobStore
from agentcas.cas.blobstore.s3 import S3BlobStore

# Every backend this suite runs over. "lmdb" is the embedded store's objects table
# (TableBlobStore over an LmdbEnvironment), present once the storage split has landed.
_SPLIT = hasattr(importlib.import_module("agentcas.cas.store"), "TableBlobStore")
BLOB_BACKENDS = ["memory", "s3", "cached-s3", "cached-memory"] + (["lmdb"] if _SPLIT else [])
# Backends another process can open again (for the multi-process races).
SHARED_BACKENDS = ["s3"] + (["lmdb"] if _SPLIT else [])


def make_blobstore(kind: str, request, tmp_path):
    if kind == "memory":
        return MemoryBlobStore()
    if kind == "s3":
        return S3BlobStore(request.getfixturevalue("s3_url"), create=True)
    if kind == "lmdb":
        from agentcas.cas.lmdb_store import LmdbEnvironment
        from agentcas.cas.store import TableBlobStore
        store = TableBlobStore(LmdbEnvironment(str(tmp_path / "lmdb"), create=True, map_size=1 << 26))
        store.url = str(tmp_path / "lmdb")
        return store
    if kind == "cached-s3":
        return CachedBlobStore(S3BlobStore(request.getfixturevalue("s3_url"), create=True), str(tmp_path / "cache"))
    if kind == "cached-memory":
        return CachedBlobStore(MemoryBlobStore(), str(tmp_path / "cache"))
    raise AssertionError(f"unknown blob backend {kind}")


def reopen_blobstore(spec: tuple):
    """The same store, opened again (in another process)."""
    kind, where = spec
    if kind == "s3":
        return S3BlobStore(where)
    if kind == "lmdb":
        from agentcas.cas.lmdb_store import LmdbEnvironment
        from agentcas.cas.store import TableBlobStore
        return TableBlobStore(LmdbEnvironment(where))
    raise AssertionError(f"backend {kind} cannot be reopened")


def reopen_spec(kind: str, blobs) -> tuple:
    return (kind, blobs.url)


@pytest.fixture(params=BLOB_BACKENDS)
def blobs(request, tmp_path):
    store = make_blobstore(request.param, request, tmp_path)
    store.kind = request.param
    yield store
    store.close()


@pytest.fixture(params=SHARED_BACKENDS)
def shared_blobs(request, tmp_path):
    store = make_blobstore(request.param, request, tmp_path)
    yield request.param, store
    store.close()


def key(n: int) -> bytes:
    """A 32-byte key whose order follows n (the first bytes are n, big-endian)."""
    return n.to_bytes(4, "big") + bytes(28)


WHEN = 1_780_000_000  # a fixed written_at: processes that frame the same bytes get the same value


def value(data: bytes, when: int = WHEN) -> bytes:
    return framing.frame(framing.KIND_CHUNK, data, written_at=when)


def same_object(got: bytes | None, put: bytes) -> bool:
    """`got` is the value `put` stored: the same kind, size, written_at and bytes. The codec
    may differ: an embedded store keeps small values raw inside a compressed pack
    (docs/FORMAT.md 4.2), so a zstd-coded value put may read back raw."""
    if got is None:
        return False
    kind, _, size, written_at = framing.read_header(got)
    put_kind, _, put_size, put_written_at = framing.read_header(put)
    return ((kind, size, written_at) == (put_kind, put_size, put_written_at)
            and framing.unframe(got) == framing.unframe(put))


def test_an_empty_store_has_nothing(blobs):
    assert blobs.get(key(1)) is None
    assert not blobs.has(key(1)) and blobs.has_many([key(1), key(2)]) == set()
    assert blobs.get_many([key(1)]) == {}
    assert list(blobs.list()) == [] and blobs.count() == 0
    assert blobs.header(key(1)) is None
    assert blobs.delete_many([key(1)]) == 0


def test_put_if_absent_is_idempotent_and_the_first_write_wins(blobs):
    first, second = value(b"first"), value(b"second")
    assert blobs.put_if_absent(key(1), first) is True
    assert blobs.put_if_absent(key(1), first) is False
    assert blobs.put_if_absent(key(1), second) is False
    assert blobs.get(key(1)) == first
    assert blobs.has(key(1)) and blobs.count() == 1


def test_put_many_counts_only_what_it_wrote(blobs):
    old = value(b"old")
    blobs.put_if_absent(key(1), old)
    items = {key(1): value(b"ignored"), key(2): value(b"two"), key(3): value(b"three" * 50)}
    assert blobs.put_many(items) == (2, len(items[key(2)]) + len(items[key(3)]))
    assert blobs.put_many(items) == (0, 0)
    assert same_object(blobs.get(key(1)), old) and same_object(blobs.get(key(3)), items[key(3)])
    assert blobs.put_many({}) == (0, 0)


def test_get_many_returns_the_stored_keys_only(blobs):
    blobs.put_many({key(i): value(b"%d" % i) for i in range(0, 10, 2)})
    got = blobs.get_many([key(i) for i in range(10)] + [key(2)])
    assert got == {key(i): value(b"%d" % i) for i in range(0, 10, 2)}


@pytest.mark.parametrize("count", [5, 2500])
def test_has_many_answers_exactly_small_and_large_batches(blobs, count):
    """A few keys (HEADs on S3) and many more than a listing page (listing on S3)."""
    stored = [key(i) for i in range(0, count, 2)]
    blobs.put_many({k: value(k) for k in stored})
    asked = [key(i) for i in range(count)] + [key(10 ** 6), b"\x00" * 32, b"\xff" * 32]
    assert blobs.has_many(asked) == set(stored)
    assert blobs.has_many(iter(stored[:3])) == set(stored[:3])
    assert blobs.has_many([key(i) for i in range(1, count, 2)]) == set()
    assert [info.key for info in blobs.list()] == stored  # past one listing page, in key order


def test_delete_removes_and_ignores_absent_keys(blobs):
    blobs.put_many({key(i): value(b"%d" % i) for i in range(4)})
    assert blobs.delete_many([key(0), key(2), key(9)]) == 2
    assert blobs.has_many([key(i) for i in range(4)]) == {key(1), key(3)}
    assert blobs.get(key(0)) is None and blobs.header(key(0)) is None
    assert blobs.delete_many([key(0)]) == 0
    # A deleted key can be written again (gc deleted it, a later commit needs it back).
    assert blobs.put_if_absent(key(0), value(b"again")) is True
    assert blobs.get(key(0)) == value(b"again")


def test_list_is_in_key_order_with_sizes_and_times(blobs):
    t0 = int(time.time())
    items = {key(n): value(os.urandom(n * 10), when=t0) for n in (7, 3, 900, 1, 42)}
    blobs.put_many(items)
    t1 = time.time()
    infos = list(blobs.list())
    assert [info.key for info in infos] == sorted(items)
    for info in infos:
        assert isinstance(info, BlobInfo) and info.size == len(items[info.key])
        assert t0 - 5 <= info.written_at <= t1 + 5
        assert info.kind in (None, framing.KIND_CHUNK)
    assert blobs.count() == 5


def test_header_is_the_framing_header(blobs):
    stored = value(os.urandom(5000))
    blobs.put_if_absent(key(1), stored)
    head = blobs.header(key(1))
    assert head == stored[:framing.HEADER_SIZE]
    assert framing.read_header(head)[2] == 5000


def test_big_values_round_trip(blobs):
    big = {key(1): value(os.urandom(5 << 20)), key(2): value(b"z" * (3 << 20))}
    assert blobs.put_many(big)[0] == 2
    assert blobs.get(key(1)) == big[key(1)]
    assert blobs.get_many([key(1), key(2)]) == big


def test_racing_threads_have_exactly_one_winner(blobs):
    for round_ in range(2):
        k = key(100 + round_)
        wins, barrier = [], threading.Barrier(8)

        def put(i):
            mine = value(b"writer %d" % i)
            barrier.wait()
            if blobs.put_if_absent(k, mine):
                wins.append(mine)
        threads = [threading.Thread(target=put, args=(i,)) for i in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(wins) == 1 and blobs.get(k) == wins[0]


def _race_puts(spec, worker, keys, queue):
    store = reopen_blobstore(spec)
    won = [k for k in keys if store.put_if_absent(k, value(b"from %d" % worker))]
    store.close()
    queue.put((worker, won))


def test_racing_processes_have_exactly_one_winner_per_key(shared_blobs):
    kind, blobs = shared_blobs
    keys = [key(i) for i in range(40)]
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_race_puts, args=(reopen_spec(kind, blobs), w, keys, queue)) for w in range(4)]
    for proc in procs:
        proc.start()
    results = [queue.get(timeout=120) for _ in procs]
    for proc in procs:
        proc.join(60)
        assert proc.exitcode == 0
    winners = {}
    for worker, won in results:
        for k in won:
            assert k not in winners, "two processes both wrote one key"
            winners[k] = worker
    assert set(winners) == set(keys)
    for k, worker in winners.items():
        assert blobs.get(k) == value(b"from %d" % worker)
