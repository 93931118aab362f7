"""What a test compares before and after: a tree's files, a store's raw rows, and views
over a store's metadata and objects."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path


def tree_bytes(root: Path) -> dict:
    """{relative path: (bytes, mode)} of every file under root, for byte-for-byte comparison."""
    out = {}
    for path in sorted(root.rglob("*")):
        if path.is_file():
            out[str(path.relative_to(root))] = (path.read_bytes(), path.stat().st_mode & 0o777)
    return out


def store_rows(store_dir: Path) -> dict:
    """Every (table, key) -> value in a store, read raw through LMDB, to assert nothing changed."""
    import lmdb

    from agentcas.cas.store import TABLES
    env = lmdb.open(str(store_dir), readonly=True, lock=False, max_dbs=len(TABLES) + 2)
    rows = {}
    try:
        with env.begin() as txn:
            for name in TABLES:
                if name in ("statcache", "leases"):  # a cache and writers' leases: hints
                    continue
                db = env.open_db(name.encode(), txn=txn, create=False)
                for key, value in txn.cursor(db=db):
                    rows[(name, bytes(key))] = bytes(value)
    finally:
        env.close()
    return rows


def objects_of(env):
    """An ObjectSource over a table environment (MemoryEnvironment / LMDB), for tests that
    build stores by hand."""
    from agentcas.cas.source import ObjectSource
    from agentcas.cas.store import TableBlobStore
    return ObjectSource(TableBlobStore(env))


class View:
    """Test glue: a metadata snapshot and the store's object source in one handle, for tests
    that inspect refs and objects together (the layers take them separately)."""

    _SOURCE = {"raw", "load", "has", "missing", "kind", "keys_from", "blobs", "reading", "put_many"}

    def __init__(self, txn, objects):
        self._txn, self._objects = txn, objects

    def __getattr__(self, name):
        return getattr(self._objects if name in self._SOURCE else self._txn, name)



@contextmanager
def views(store):
    """`with views(store) as view:` -> View over store.meta.reader() and store.source."""
    with store.meta.reader() as txn, store.source.reading() as objects:
        yield View(txn, objects)
