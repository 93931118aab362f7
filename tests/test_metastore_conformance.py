"""One conformance suite for every MetadataStore backend (memory, PostgreSQL on a real server).

Backends are built by `make_metastore(kind, ...)` from META_BACKENDS; the process races
reopen the same store from its URL in other processes (SHARED_BACKENDS).
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import struct
import threading

import pytest

from agentcas.cas.metastore.base import TABLES, MetadataStore, Read
from agentcas.cas.metastore.memory import MemoryMetadataStore
from agentcas.cas.metastore.postgres import PostgresMetadataStore

# Every backend this suite runs over. "lmdb" is the embedded store's metadata tables
# (TableMetadataStore over an LmdbEnvironment), present once the storage split has landed.
_SPLIT = hasattr(importlib.import_module("agentcas.cas.store"), "TableMetadataStore")
META_BACKENDS = ["memory", "postgres"] + (["lmdb"] if _SPLIT else [])
# Backends another process can open again (for the multi-process races).
SHARED_BACKENDS = ["postgres"] + (["lmdb"] if _SPLIT else [])


def make_metastore(kind: str, request, tmp_path) -> MetadataStore:
    if kind == "memory":
        return MemoryMetadataStore()
    if kind == "postgres":
        return PostgresMetadataStore(request.getfixturevalue("postgres_url"), create=True)
    if kind == "lmdb":
        from agentcas.cas.lmdb_store import LmdbEnvironment
        from agentcas.cas.store import TableMetadataStore
        store = TableMetadataStore(LmdbEnvironment(str(tmp_path / "lmdb"), create=True, map_size=1 << 26))
        store.url = str(tmp_path / "lmdb")
        return store
    raise AssertionError(f"unknown metadata backend {kind}")


def reopen_metastore(spec: tuple) -> MetadataStore:
    """The same store, opened again (in another process)."""
    kind, where = spec
    if kind == "postgres":
        return PostgresMetadataStore(where)
    if kind == "lmdb":
        from agentcas.cas.lmdb_store import LmdbEnvironment
        from agentcas.cas.store import TableMetadataStore
        return TableMetadataStore(LmdbEnvironment(where))
    raise AssertionError(f"backend {kind} cannot be reopened")


@pytest.fixture(params=META_BACKENDS)
def meta(request, tmp_path):
    store = make_metastore(request.param, request, tmp_path)
    yield store
    store.close()


@pytest.fixture(params=SHARED_BACKENDS)
def shared_meta(request, tmp_path):
    store = make_metastore(request.param, request, tmp_path)
    yield (request.param, store.url), store
    store.close()


def fill(meta, table, keys):
    def put(txn):
        for key in keys:
            txn.put(table, key, b"v" + key)
    meta.write(put)


def scan(meta, table, **kw):
    with meta.reader() as txn:
        return [k for k, _ in txn.scan(table, **kw)]


def test_every_table_exists_and_starts_empty(meta):
    with meta.reader() as txn:
        for table in TABLES:
            assert txn.count(table) == 0
            assert txn.get(table, b"k") is None
            assert list(txn.scan(table)) == [] and list(txn.scan(table, reverse=True)) == []


def test_put_get_overwrite_delete(meta):
    meta.write(lambda txn: txn.put("refs", b"a", b"1"))
    with meta.reader() as txn:
        assert txn.get("refs", b"a") == b"1" and txn.get("meta", b"a") is None
    meta.write(lambda txn: txn.put("refs", b"a", b"2"))
    with meta.reader() as txn:
        assert txn.get("refs", b"a") == b"2" and txn.count("refs") == 1
    assert meta.write(lambda txn: txn.delete("refs", b"a")) is True
    assert meta.write(lambda txn: txn.delete("refs", b"a")) is False
    with meta.reader() as txn:
        assert txn.get("refs", b"a") is None and txn.count("refs") == 0


def test_put_new_never_overwrites(meta):
    assert meta.write(lambda txn: txn.put_new("leases", b"k", b"first")) is True
    assert meta.write(lambda txn: txn.put_new("leases", b"k", b"second")) is False
    with meta.reader() as txn:
        assert txn.get("leases", b"k") == b"first"


def test_compare_and_set(meta):
    cas = lambda old, new: meta.write(lambda txn: txn.compare_and_set("refs", b"t", old, new))  # noqa: E731
    get = lambda: meta.write(lambda txn: txn.get("refs", b"t", for_update=True))  # noqa: E731
    assert cas(b"x", b"y") is False and get() is None           # not there: old must be None
    assert cas(None, b"1") is True and get() == b"1"            # create
    assert cas(None, b"2") is False and get() == b"1"           # exists already
    assert cas(b"other", b"2") is False and get() == b"1"       # someone else moved it
    assert cas(b"1", b"2") is True and get() == b"2"            # move
    assert cas(b"2", b"2") is True and get() == b"2"            # to the same value
    assert cas(b"1", None) is False and get() == b"2"           # delete with a stale old
    assert cas(b"2", None) is True and get() is None            # delete
    assert cas(b"2", b"3") is False and get() is None


def test_compare_and_set_on_a_row_locked_for_update(meta):
    meta.write(lambda txn: txn.put("refs", b"t", b"1"))

    def moves(txn):
        assert txn.get("refs", b"t", for_update=True) == b"1"
        out = [txn.compare_and_set("refs", b"t", b"0", b"x"),   # stale old
               txn.compare_and_set("refs", b"t", b"1", b"2"),   # the move
               txn.get("refs", b"t"),
               txn.compare_and_set("refs", b"t", b"1", b"3")]   # stale again: its own move
        txn.put("refs", b"t", b"4")
        out.append(txn.compare_and_set("refs", b"t", b"4", b"5"))
        return out
    assert meta.write(moves) == [False, True, b"2", False, True]
    with meta.reader() as txn:
        assert txn.get("refs", b"t") == b"5"

    def deletes(txn):
        txn.get("refs", b"t", for_update=True)
        return txn.compare_and_set("refs", b"t", b"5", None), txn.compare_and_set("refs", b"t", b"5", b"6")
    assert meta.write(deletes) == (True, False)
    with meta.reader() as txn:
        assert txn.get("refs", b"t") is None


def test_write_returns_fn_result_and_sees_its_own_writes(meta):
    fill(meta, "reflog", [b"a", b"c"])

    def fn(txn):
        txn.put("meta", b"x", b"1")
        txn.put("reflog", b"b", b"vb")
        txn.delete("reflog", b"c")
        return txn.get("meta", b"x"), txn.count("meta"), [k for k, _ in txn.scan("reflog")]
    assert meta.write(fn) == (b"1", 1, [b"a", b"b"])


def test_write_is_atomic_when_fn_raises(meta):
    fill(meta, "refs", [b"keep", b"moved"])

    def fails(txn):
        txn.put("refs", b"new", b"1")
        txn.put("reflog", b"entry", b"2")
        assert txn.compare_and_set("refs", b"moved", b"vmoved", b"elsewhere")
        assert txn.put_new("leases", b"l", b"3")
        txn.delete("refs", b"keep")
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        meta.write(fails)
    with meta.reader() as txn:
        assert txn.get("refs", b"new") is None and txn.get("reflog", b"entry") is None
        assert txn.get("leases", b"l") is None
        assert txn.get("refs", b"keep") == b"vkeep" and txn.get("refs", b"moved") == b"vmoved"


def test_reader_is_a_snapshot(meta):
    fill(meta, "refs", [b"a"])
    with meta.reader() as txn:
        meta.write(lambda w: (w.put("refs", b"b", b"1"), w.delete("refs", b"a")))
        assert txn.get("refs", b"a") == b"va" and txn.get("refs", b"b") is None
        assert [k for k, _ in txn.scan("refs")] == [b"a"] and txn.count("refs") == 1
    with meta.reader() as txn:
        assert txn.get("refs", b"a") is None and txn.get("refs", b"b") == b"1"


def test_reader_cannot_write(meta):
    with meta.reader() as txn:
        with pytest.raises(Exception):  # noqa: B017 - each backend refuses in its own way
            txn.put("refs", b"a", b"1")
    with meta.reader() as txn:
        assert txn.get("refs", b"a") is None


def test_big_values_and_binary_keys(meta):
    big = os.urandom(3 << 20)
    keys = [b"\x00", b"\x00\x00", b"\xff" * 40, bytes(range(256))]
    meta.write(lambda txn: [txn.put("signatures", k, big) for k in keys])
    with meta.reader() as txn:
        assert all(txn.get("signatures", k) == big for k in keys)
        assert [k for k, _ in txn.scan("signatures")] == sorted(keys)


# --- scan: the same meaning as the LMDB store's (agentcas/cas/lmdb_store.py _LmdbTxn.scan) --------
# KEYS, SCANS and reference_scan are those of tests/test_environment_conformance.py, which
# pins the LMDB cursor semantics against the same reference.

KEYS = [b"a", b"ab", b"ab\x00", b"ab\x00\x01", b"ab\xff", b"ab\xff\xff", b"abc", b"abd", b"b", b"\xff", b"\xff\xff\x00"]


def reference_scan(keys, prefix=b"", start=None, reverse=False):
    """The documented meaning of scan, over a plain list."""
    out = sorted(k for k in keys if k.startswith(prefix))
    if start is not None:
        out = [k for k in out if (k <= start if reverse else k >= start)]
    return out[::-1] if reverse else out


SCANS = [
    {}, {"prefix": b"ab"}, {"prefix": b"ab\xff"}, {"prefix": b"\xff"}, {"prefix": b"zz"},
    {"prefix": b"ab", "start": b"ab\x01"}, {"prefix": b"ab", "start": b"abc"},
    {"prefix": b"ab", "start": b"a"}, {"prefix": b"ab", "start": b"b"}, {"start": b"abc"},
    {"reverse": True}, {"prefix": b"ab", "reverse": True}, {"prefix": b"ab\xff", "reverse": True},
    {"prefix": b"\xff", "reverse": True}, {"prefix": b"ab", "start": b"abc", "reverse": True},
    {"prefix": b"ab", "start": b"ab\x80", "reverse": True}, {"prefix": b"ab", "start": b"zz", "reverse": True},
    {"prefix": b"ab", "start": b"a", "reverse": True}, {"start": b"ab\x00", "reverse": True},
    {"prefix": b"zz", "reverse": True}, {"prefix": b"ab\x00", "reverse": True},
]


@pytest.mark.parametrize("kw", SCANS)
def test_scan(meta, kw):
    fill(meta, "reflog", KEYS)
    fill(meta, "refs", [b"ab-other-table"])
    assert scan(meta, "reflog", **kw) == reference_scan(KEYS, **kw)
    with meta.reader() as txn:
        assert all(v == b"v" + k for k, v in txn.scan("reflog", **kw))


def test_long_scans_page_through_every_key(meta):
    keys = [b"t/" + struct.pack(">I", i) for i in range(2600)] + [b"u", b"s"]
    fill(meta, "reflog", keys)
    for kw in ({"prefix": b"t/"}, {"prefix": b"t/", "reverse": True},
               {"prefix": b"t/", "start": b"t/" + struct.pack(">I", 1234)},
               {"prefix": b"t/", "start": b"t/" + struct.pack(">I", 2345), "reverse": True}, {}):
        assert scan(meta, "reflog", **kw) == reference_scan(keys, **kw)


def test_scan_while_deleting_in_the_same_write(meta):
    keys = [b"k%04d" % i for i in range(1500)]
    fill(meta, "leases", keys)

    def expire(txn):
        seen = 0
        for key, _ in txn.scan("leases", prefix=b"k"):
            seen += 1
            if int(key[1:]) % 2:
                txn.delete("leases", key)
        return seen
    assert meta.write(expire) == 1500
    assert scan(meta, "leases") == keys[::2]


# --- concurrency ------------------------------------------------------------------------------

def test_racing_threads_on_one_key_have_exactly_one_winner(meta):
    meta.write(lambda txn: txn.put("refs", b"t", b"start"))
    wins, barrier = [], threading.Barrier(8)

    def move(i):
        barrier.wait()
        if meta.write(lambda txn: txn.compare_and_set("refs", b"t", b"start", b"by %d" % i)):
            wins.append(b"by %d" % i)
        if meta.write(lambda txn: txn.put_new("leases", b"l", b"%d" % i)):
            wins.append(b"lease")
    threads = [threading.Thread(target=move, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len([w for w in wins if w.startswith(b"by")]) == 1 and wins.count(b"lease") == 1
    with meta.reader() as txn:
        assert txn.get("refs", b"t") in wins


def _move(txn, worker: int, lock: bool = False):
    """One ref move, as a commit does it: CAS the counter, log the move in the same transaction."""
    current = txn.get("refs", b"counter", for_update=lock)
    n = struct.unpack(">Q", current)[0]
    new = struct.pack(">Q", n + 1)
    if not txn.compare_and_set("refs", b"counter", current, new):
        return False
    assert txn.put_new("reflog", new, b"%d" % worker), "two moves got the same number"
    return True


def _cas_worker(spec, worker: int, moves: int, queue):
    store = reopen_metastore(spec)
    done = lost = 0
    while done < moves:
        if store.write(lambda txn: _move(txn, worker)):
            done += 1
        else:
            lost += 1
    store.close()
    queue.put((worker, done, lost))


def _race(store, spawn_workers, workers: int, moves: int):
    store.write(lambda txn: txn.put("refs", b"counter", struct.pack(">Q", 0)))
    results = spawn_workers(workers, moves)
    assert sorted(w for w, _, _ in results) == list(range(workers))
    assert all(done == moves for _, done, _ in results)
    with store.reader() as txn:
        assert txn.get("refs", b"counter") == struct.pack(">Q", workers * moves)
        log = [(k, v) for k, v in txn.scan("reflog")]
    assert [k for k, _ in log] == [struct.pack(">Q", n) for n in range(1, workers * moves + 1)]
    assert {int(v): 0 for _, v in log}.keys() == set(range(workers))
    assert all([v for _, v in log].count(b"%d" % w) == moves for w in range(workers))


def test_eight_processes_moving_one_ref_lose_no_move(shared_meta):
    spec, store = shared_meta

    def spawn(workers, moves):
        ctx = multiprocessing.get_context("spawn")
        queue = ctx.Queue()
        procs = [ctx.Process(target=_cas_worker, args=(spec, w, moves, queue)) for w in range(workers)]
        for proc in procs:
            proc.start()
        results = [queue.get(timeout=300) for _ in procs]
        for proc in procs:
            proc.join(60)
            assert proc.exitcode == 0
        return results
    _race(store, spawn, workers=8, moves=25)


@pytest.mark.parametrize("lock", [False, True, "exchange"], ids=["optimistic", "for-update", "exchange"])
def test_eight_threads_moving_one_ref_lose_no_move(meta, lock):
    """Moves by transaction (compare_and_set, with or without FOR UPDATE) or by exchange."""
    def one_move(worker) -> bool:
        if lock == "exchange":
            return _exchange_move(meta, worker)
        return meta.write(lambda txn: _move(txn, worker, lock))

    def spawn(workers, moves):
        results = []

        def run(worker):
            done = lost = 0
            while done < moves:
                if one_move(worker):
                    done += 1
                else:
                    lost += 1
            results.append((worker, done, lost))
        threads = [threading.Thread(target=run, args=(w,)) for w in range(workers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return results
    _race(meta, spawn, workers=8, moves=20)


# --- exchange: conditional reads and writes in one request ---------------------------------------

def test_exchange_reads_expects_and_writes_atomically(meta):
    meta.write(lambda txn: [txn.put("refs", b"a", b"1"), txn.put("reflog", b"t\x00\x01", b"x"),
                            txn.put("reflog", b"t\x00\x02", b"y"), txn.put("reflog", b"u\x00\x01", b"z")])
    reads = [Read("refs", b"a"), Read("refs", b"missing"), Read("reflog", b"t\x00", last=True),
             Read("reflog", b"v\x00", last=True)]
    applied, values = meta.exchange(reads=reads)
    assert applied and values == [b"1", None, (b"t\x00\x02", b"y"), None]
    # A failed expectation writes nothing, and says what was there.
    applied, values = meta.exchange(reads=[Read("refs", b"a")], expect=[("refs", b"a", b"0")],
                                    writes=[("refs", b"a", b"2"), ("refs", b"b", b"new")])
    assert not applied and values == [b"1"]
    with meta.reader() as txn:
        assert txn.get("refs", b"a") == b"1" and txn.get("refs", b"b") is None
    # An absent row is expected with None; None as a value deletes.
    applied, values = meta.exchange(reads=[Read("refs", b"a")],
                                    expect=[("refs", b"a", b"1"), ("refs", b"b", None)],
                                    writes=[("refs", b"a", b"2"), ("refs", b"b", b"new"),
                                            ("reflog", b"t\x00\x01", None)])
    assert applied and values == [b"1"]  # values are read before the writes
    with meta.reader() as txn:
        assert (txn.get("refs", b"a"), txn.get("refs", b"b"), txn.get("reflog", b"t\x00\x01")) == \
            (b"2", b"new", None)
    assert not meta.exchange(expect=[("refs", b"b", None)], writes=[("refs", b"c", b"!")])[0]
    with meta.reader() as txn:
        assert txn.get("refs", b"c") is None
    # A value expected on a row that is absent does not hold (nor is the row made to hold it).
    assert not meta.exchange(expect=[("refs", b"absent", b"1")], writes=[("refs", b"c", b"!")])[0]
    with meta.reader() as txn:
        assert txn.get("refs", b"c") is None and txn.get("refs", b"absent") is None


def test_exchange_keeps_binary_keys_and_values_exact(meta):
    key, value = bytes(range(256)), bytes(range(255, -1, -1)) * 64
    assert meta.exchange(expect=[("refs", key, None)], writes=[("refs", key, value)])[0]
    assert meta.exchange(reads=[Read("refs", key), Read("refs", key[:10], last=True)])[1] == [value, (key, value)]
    assert meta.exchange(reads=[Read("refs", b"\xff\xff", last=True)])[1] == [None]


def _exchange_move(store, worker: int) -> bool:
    """One ref move as lineage/moves.py lands it: read, then one exchange expecting the read."""
    _, (current, last) = store.exchange(reads=[Read("refs", b"counter"), Read("reflog", b"", last=True)])
    n = struct.unpack(">Q", current)[0]
    new = struct.pack(">Q", n + 1)
    applied, _ = store.exchange(expect=[("refs", b"counter", current), ("reflog", new, None)],
                                writes=[("refs", b"counter", new), ("reflog", new, b"%d" % worker)])
    return applied
