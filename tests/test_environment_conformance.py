"""One conformance suite for the table environments (memory and LMDB) that embedded stores run on,
and for the ObjectSource read path over them."""

import os
import subprocess
import sys
import textwrap

import pytest

from agentcas.cas import framing
from agentcas.cas.digest import Digest, DigestMismatch, hash_blob, hash_object
from agentcas.cas.lmdb_store import LmdbEnvironment, StoreUnavailable
from agentcas.cas.store import TABLES, MemoryEnvironment, save_object
from agentcas.errors import IntegrityError

from support.store_state import objects_of


@pytest.fixture(params=["memory", "lmdb"])
def objects(request, tmp_path):
    if request.param == "memory":
        yield MemoryEnvironment()
        return
    store = LmdbEnvironment(str(tmp_path / "lmdb"), create=True, map_size=1 << 20)
    yield store
    store.close()


def fill(objects, table, keys):
    def put(txn):
        for key in keys:
            txn.put(table, key, b"v" + key)
    objects.write(put)


def scan(objects, table, **kw):
    with objects.reader() as txn:
        return [k for k, _ in txn.scan(table, **kw)]


def test_every_table_exists_and_starts_empty(objects):
    with objects.reader() as txn:
        for table in TABLES:
            assert txn.count(table) == 0
            assert txn.get(table, b"k") is None
            assert list(txn.scan(table)) == []


def test_put_get_overwrite_delete(objects):
    objects.write(lambda txn: txn.put("refs", b"a", b"1"))
    with objects.reader() as txn:
        assert txn.get("refs", b"a") == b"1" and txn.get("meta", b"a") is None
    objects.write(lambda txn: txn.put("refs", b"a", b"2"))
    with objects.reader() as txn:
        assert txn.get("refs", b"a") == b"2" and txn.count("refs") == 1
    assert objects.write(lambda txn: txn.delete("refs", b"a")) is True
    assert objects.write(lambda txn: txn.delete("refs", b"a")) is False
    with objects.reader() as txn:
        assert txn.get("refs", b"a") is None and txn.count("refs") == 0


def test_put_new_never_overwrites(objects):
    assert objects.write(lambda txn: txn.put_new("objects", b"k", b"first")) is True
    assert objects.write(lambda txn: txn.put_new("objects", b"k", b"second")) is False
    with objects.reader() as txn:
        assert txn.get("objects", b"k") == b"first"


def test_write_returns_fn_result_and_sees_its_own_writes(objects):
    def fn(txn):
        txn.put("meta", b"x", b"1")
        return txn.get("meta", b"x"), txn.count("meta")
    assert objects.write(fn) == (b"1", 1)


def test_write_is_atomic_when_fn_raises(objects):
    fill(objects, "refs", [b"keep"])

    def fails(txn):
        txn.put("refs", b"new", b"1")
        txn.put("objects", b"obj", b"2")
        txn.delete("refs", b"keep")
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        objects.write(fails)
    with objects.reader() as txn:
        assert txn.get("refs", b"new") is None and txn.get("objects", b"obj") is None
        assert txn.get("refs", b"keep") == b"vkeep"


def test_reader_is_a_snapshot(objects):
    fill(objects, "refs", [b"a"])
    with objects.reader() as txn:
        objects.write(lambda w: (w.put("refs", b"b", b"1"), w.delete("refs", b"a")))
        assert txn.get("refs", b"a") == b"va" and txn.get("refs", b"b") is None
    with objects.reader() as txn:
        assert txn.get("refs", b"a") is None and txn.get("refs", b"b") == b"1"


KEYS = [b"a", b"ab", b"ab\x00", b"ab\x00\x01", b"ab\xff", b"ab\xff\xff", b"abc", b"abd", b"b", b"\xff", b"\xff\xff\x00"]


def reference_scan(keys, prefix=b"", start=None, reverse=False):
    """The documented meaning of TableTxn.scan, over a plain list."""
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


def test_reference_scan_spot_checks():
    assert reference_scan(KEYS, prefix=b"ab", reverse=True)[:3] == [b"ab\xff\xff", b"ab\xff", b"abd"]
    assert reference_scan(KEYS, start=b"ab\x00", reverse=True) == [b"ab\x00", b"ab", b"a"]
    assert reference_scan(KEYS, prefix=b"ab", start=b"a") == reference_scan(KEYS, prefix=b"ab")


@pytest.mark.parametrize("kw", SCANS)
def test_scan(objects, kw):
    fill(objects, "reflog", KEYS)
    fill(objects, "refs", [b"ab-other-table"])
    assert scan(objects, "reflog", **kw) == reference_scan(KEYS, **kw)
    with objects.reader() as txn:
        assert all(v == b"v" + k for k, v in txn.scan("reflog", **kw))


def test_scan_of_empty_table(objects):
    assert scan(objects, "leases", reverse=True) == [] == scan(objects, "leases", prefix=b"x", reverse=True)


def test_object_helpers_verify_every_read(objects):
    data = b"some chunk bytes"
    chunk = hash_blob(data)
    tree_bytes = b'{"entries":[]}'
    tree = hash_object("tree", tree_bytes)

    def put(txn):
        assert save_object(txn, chunk, framing.frame(framing.KIND_CHUNK, data)) is True
        assert save_object(txn, chunk, framing.frame(framing.KIND_CHUNK, data)) is False
        save_object(txn, tree, framing.frame(framing.KIND_TREE, tree_bytes))
        # Wrong bytes under an id, and a chunk stored under the tree rule's id.
        save_object(txn, hash_blob(b"other"), framing.frame(framing.KIND_CHUNK, b"not other"))
        save_object(txn, hash_object("tree", data), framing.frame(framing.KIND_CHUNK, data))
    objects.write(put)
    for source in (objects_of(objects), ):
        with source.reading() as txn:
            assert txn.load(chunk) == data
            assert txn.load(chunk, framing.KIND_CHUNK) == data
            assert txn.load(tree, framing.KIND_TREE) == tree_bytes
            assert txn.has(chunk) and txn.kind(tree) == framing.KIND_TREE
            missing = Digest(b"\x07" * 32)
            assert txn.load(missing) is None and not txn.has(missing)
            assert txn.kind(missing) is None
            with pytest.raises(IntegrityError, match="expected a checkpoint"):
                txn.load(tree, framing.KIND_CHECKPOINT)
            with pytest.raises(DigestMismatch):
                txn.load(hash_blob(b"other"))
            with pytest.raises(DigestMismatch):
                txn.load(hash_object("tree", data))


def test_damaged_stored_value_is_an_integrity_error(objects):
    data = b"x" * 100
    digest = hash_blob(data)
    value = bytearray(framing.frame(framing.KIND_CHUNK, data, compress=False))
    value[3] ^= 1  # in the header
    objects.write(lambda txn: txn.put("objects", digest.raw, bytes(value)))
    source = objects_of(objects)
    with pytest.raises(IntegrityError, match="corrupt"):
        source.load(digest)
    with pytest.raises(IntegrityError, match="corrupt"):
        source.kind(digest)


# --- LMDB only ---------------------------------------------------------------------------------

def test_lmdb_map_grows_by_itself(tmp_path):
    store = LmdbEnvironment(str(tmp_path / "s"), create=True, map_size=64 * 1024)
    try:
        start = store.env.info()["map_size"]
        payload = os.urandom(256 * 1024)

        def put(i):
            return lambda txn: txn.put("objects", i.to_bytes(4, "big"), payload)
        for i in range(12):  # 3 MiB into a 64 KiB map, some values in one transaction
            store.write(put(i))
        assert store.env.info()["map_size"] >= 3 * 1024 * 1024 > start
        with store.reader() as txn:
            assert txn.count("objects") == 12 and txn.get("objects", (5).to_bytes(4, "big")) == payload
    finally:
        store.close()


def test_lmdb_map_grown_by_another_process_is_adopted(tmp_path):
    path = str(tmp_path / "s")
    store = LmdbEnvironment(path, create=True, map_size=64 * 1024)
    try:
        store.write(lambda txn: txn.put("refs", b"before", b"1"))
        script = textwrap.dedent(f"""
            import os
            from agentcas.cas.lmdb_store import LmdbEnvironment
            s = LmdbEnvironment({path!r}, map_size=64 * 1024)
            for i in range(8):
                s.write(lambda txn: txn.put("objects", bytes([i]), os.urandom(512 * 1024)))
            s.close()
        """)
        subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
        store.write(lambda txn: txn.put("refs", b"after", os.urandom(300 * 1024)))
        with store.reader() as txn:
            assert txn.count("objects") == 8 and txn.get("refs", b"before") == b"1"
    finally:
        store.close()


def test_lmdb_data_survives_reopen(tmp_path):
    path = str(tmp_path / "s")
    store = LmdbEnvironment(path, create=True, map_size=1 << 20)
    store.write(lambda txn: txn.put("trust", b"k", b"v"))
    store.close()
    store = LmdbEnvironment(path)
    try:
        with store.reader() as txn:
            assert txn.get("trust", b"k") == b"v"
    finally:
        store.close()


def test_lmdb_refuses_missing_store_and_file(tmp_path):
    with pytest.raises(StoreUnavailable, match="not an agentcas store"):
        LmdbEnvironment(str(tmp_path))
    (tmp_path / "f").write_text("x")
    with pytest.raises(StoreUnavailable, match="is a file"):
        LmdbEnvironment(str(tmp_path / "f"))


def test_lmdb_map_grows_while_other_threads_read(tmp_path):
    """py-lmdb invalidates open transactions when the map is resized: readers in worker threads
    (snapshot, restore) must neither fail nor see garbage while the writer grows the map."""
    import threading
    import time
    store = LmdbEnvironment(str(tmp_path / "s"), create=True, map_size=64 * 1024)
    store.write(lambda txn: txn.put("objects", b"k0", b"x" * 1000))
    stop, errors, reads = threading.Event(), [], [0]

    def read():
        try:
            while not stop.is_set():
                with store.reader() as txn:
                    assert txn.get("objects", b"k0") == b"x" * 1000
                    time.sleep(0.002)  # hold the transaction open while the writer works
                    for _, (_, value) in zip(range(3), txn.scan("objects", start=b"k1")):
                        assert value == b"y" * 50_000
                    assert txn.get("objects", b"k0") == b"x" * 1000
                reads[0] += 1
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(repr(exc))

    threads = [threading.Thread(target=read) for _ in range(2)]
    for thread in threads:
        thread.start()
    try:
        start = store.env.info()["map_size"]
        for i in range(1, 120):  # ~6 MB: the map doubles several times under the readers
            store.write(lambda txn: txn.put("objects", b"k%d" % i, b"y" * 50_000))
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        size = store.env.info()["map_size"]
        store.close()
    assert errors == [] and reads[0] > 0 and size >= 8 * start
