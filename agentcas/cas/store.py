"""A transactional table environment (memory or LMDB) and the two stores over it.

An embedded store keeps everything in one environment of named tables: `objects`
(the blob store), the metadata tables (metastore/base.TABLES) and `statcache` (this
machine's stat cache). `write(fn)` runs `fn(txn)` atomically and may run it again
(after growing an LMDB map), so `fn` must have no side effects outside `txn`.
`TableBlobStore` and `TableMetadataStore` present the environment as the two
interfaces the layers use (cas/blobstore/base.py, cas/metastore/base.py); the layers
never see its raw tables.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from contextlib import AbstractContextManager, contextmanager
from typing import TypeVar

from agentcas.cas import packs
from agentcas.cas.blobstore.base import BlobStore
from agentcas.cas.metastore.base import TABLES as METADATA_TABLES
from agentcas.cas.metastore.base import MetadataStore, MetaTxn

T = TypeVar("T")

TABLES = ("objects", "statcache") + packs.TABLES + METADATA_TABLES


class TableTxn(MetaTxn):
    """One transaction over the environment's tables (the MetaTxn methods, over every table,
    `objects` and `statcache` included). Keys and values are bytes."""

    def compare_and_set(self, table, key, old, new):
        # Writers are serialised (LMDB's lock, the memory store's), so this is a read,
        # a compare and a write.
        current = self.get(table, key)
        if (None if current is None else bytes(current)) != old:
            return False
        if new is None:
            self.delete(table, key)
        else:
            self.put(table, key, new)
        return True

    def append(self, table, key, value):
        """put(), for a key greater than every key of the table (LMDB then fills its pages)."""
        self.put(table, key, value)


class TableEnvironment(ABC):
    """A transactional environment of tables; implementations: memory and LMDB."""

    url: str
    leaf_bytes: int = packs.LEAF_BYTES  # the largest value that stays inside a B-tree page

    @abstractmethod
    def reader(self, buffers: bool = False) -> AbstractContextManager[TableTxn]:
        """A consistent read-only snapshot.

        With `buffers=True`, values may be memoryviews into the store that are valid
        only until the transaction ends (zero-copy reads for large restores).
        """

    @abstractmethod
    def write(self, fn: Callable[[TableTxn], T]) -> T:
        """Run `fn` in one atomic write transaction (serialised across processes)."""

    def close(self) -> None:
        pass

    def used_bytes(self) -> int:
        """Bytes the store occupies (pages in use), for reports and benchmarks."""
        return 0


# --- in-memory implementation ------------------------------------------------------------

class _MemoryTxn(TableTxn):
    def __init__(self, tables: dict, writable: bool):
        self._tables = tables
        self._writable = writable

    def get(self, table, key, for_update=False):
        return self._tables[table].get(bytes(key))

    def scan(self, table, prefix=b"", start=None, reverse=False):
        keys = sorted(k for k in self._tables[table] if k.startswith(prefix))
        if start is not None:
            keys = [k for k in keys if (k <= start if reverse else k >= start)]
        if reverse:
            keys.reverse()
        for key in keys:
            if key in self._tables[table]:
                yield key, self._tables[table][key]

    def put(self, table, key, value):
        assert self._writable
        self._tables[table][bytes(key)] = bytes(value)

    def put_new(self, table, key, value):
        if bytes(key) in self._tables[table]:
            return False
        self.put(table, key, value)
        return True

    def delete(self, table, key):
        assert self._writable
        return self._tables[table].pop(bytes(key), None) is not None

    def count(self, table):
        return len(self._tables[table])


class MemoryEnvironment(TableEnvironment):
    """Tables in dicts; a write runs on a copy that replaces the original on success."""

    def __init__(self) -> None:
        self.url = "memory://"
        self._tables: dict[str, dict] = {name: {} for name in TABLES}
        self._lock = threading.RLock()

    @contextmanager
    def reader(self, buffers: bool = False):
        with self._lock:
            snapshot = {name: dict(rows) for name, rows in self._tables.items()}
        yield _MemoryTxn(snapshot, writable=False)

    def write(self, fn):
        with self._lock:
            draft = {name: dict(rows) for name, rows in self._tables.items()}
            result = fn(_MemoryTxn(draft, writable=True))
            self._tables = draft
            return result

    def used_bytes(self):
        return sum(len(k) + len(v) for rows in self._tables.values() for k, v in rows.items())


def save_object(txn: TableTxn, digest, framed: bytes) -> bool:
    """Store a framed object in the environment's packs unless present; True if new."""
    return packs.put_new(txn, {digest.raw: framed})[0] == 1


def has_object(txn: TableTxn, raw: bytes) -> bool:
    """Whether the environment holds the object with this raw id."""
    return packs.has(txn, raw)


# --- the two stores over one environment ----------------------------------------------------

class _SnapshotBlobs(BlobStore):
    """Blob reads inside one read transaction of the environment (see `snapshot`)."""

    def __init__(self, txn: TableTxn, url: str, read_only: bool = False):
        self._txn = txn
        self.url = url
        # Packs read in this transaction, kept at hand (packs.RECENT_PACKS of them): only in
        # a read-only one, where a pack cannot change under the reader.
        self._recent: dict | None = {} if read_only else None

    def get(self, key):
        return packs.get(self._txn, key, self._recent)

    def has_many(self, keys):
        return {bytes(k) for k in keys if packs.has(self._txn, k, self._recent)}

    def header(self, key):
        return packs.header(self._txn, key, self._recent)

    def put_many(self, items):
        raise TypeError("a read snapshot cannot store objects")

    def delete_many(self, keys):
        raise TypeError("a read snapshot cannot delete objects")

    def list(self):
        return packs.list_objects(self._txn)

    def list_from(self, start):
        return packs.list_objects(self._txn, start)

    def count(self):
        return packs.count(self._txn)


LIST_BATCH = 128  # objects listed per read transaction (see TableBlobStore.list_from)


class TableBlobStore(BlobStore):
    """The objects of an environment (packs, cas/packs.py) as a BlobStore."""

    def __init__(self, env: TableEnvironment):
        self.env = env
        self.url = env.url

    # Reads look at packs through buffers (no copy of a pack); what they return is a copy.
    def get(self, key):
        with self.env.reader(buffers=True) as txn:
            return packs.get(txn, key)

    def get_many(self, keys):
        out = {}
        with self.env.reader(buffers=True) as txn:
            for key in keys:
                value = packs.get(txn, key)
                if value is not None:
                    out[bytes(key)] = value
        return out

    def has_many(self, keys):
        # buffers=True: a value is looked at, not copied out (a chunk is ~100 KB)
        with self.env.reader(buffers=True) as txn:
            return {bytes(k) for k in keys if packs.has(txn, k)}

    def header(self, key):
        with self.env.reader(buffers=True) as txn:
            return packs.header(txn, key)

    def put_many(self, items):
        if not items:
            return 0, 0
        return self.env.write(lambda txn: packs.put_new(txn, items, self.env.leaf_bytes))

    def delete_many(self, keys):
        keys = list(keys)
        if not keys:
            return 0
        return self.env.write(lambda txn: sum(1 for key in keys if packs.delete(txn, key)))

    def list(self):
        return self.list_from(None)

    def list_from(self, start):
        # Streamed in read transactions of bounded length, so a long listing (gc's scan)
        # does not pin old pages for its whole duration. Batches start small and grow, so
        # a caller that stops early (prefix resolution reads a key or two) reads a few rows;
        # at most LIST_BATCH, so the batch a caller has not yet seen (BlobInfo objects, and
        # the store pages its reading mapped: gc's PageReleaser looks only between objects
        # it is given) stays small.
        after, size = start, 64
        while True:
            batch = []
            with self.env.reader(buffers=True) as txn:
                for info in packs.list_objects(txn, after):
                    batch.append(info)
                    if len(batch) >= size:
                        break
            yield from batch
            if len(batch) < size:
                return
            after, size = batch[-1].key + b"\0", min(size * 8, LIST_BATCH)

    def list_unordered(self):
        # Pack order (packs.scan_packed: the file read front to back), then the objects a
        # store being upgraded still keeps in its `objects` table; in read transactions of
        # LIST_BATCH objects each, as list_from.
        after: tuple[int, int] | None = None
        while True:
            batch = []
            with self.env.reader(buffers=True) as txn:
                for position, info in packs.scan_packed(txn, after):
                    batch.append(info)
                    if len(batch) >= LIST_BATCH:
                        after = position
                        break
            yield from batch
            if len(batch) < LIST_BATCH:
                break
        start = None
        while True:
            batch = []
            with self.env.reader(buffers=True) as txn:
                for info in packs.list_legacy(txn, start):
                    batch.append(info)
                    if len(batch) >= LIST_BATCH:
                        break
            yield from batch
            if len(batch) < LIST_BATCH:
                return
            start = batch[-1].key + b"\0"

    def count(self):
        with self.env.reader() as txn:
            return packs.count(txn)

    def used_bytes(self):
        return self.env.used_bytes()

    @contextmanager
    def snapshot(self, buffers: bool = False):
        # Always through buffers: packs are sliced in place and every value returned is a copy.
        with self.env.reader(buffers=True) as txn:
            yield _SnapshotBlobs(txn, self.url, read_only=True)


class TableMetadataStore(MetadataStore):
    """The metadata tables of an environment as a MetadataStore (same transactions)."""

    def __init__(self, env: TableEnvironment):
        self.env = env
        self.url = env.url

    def reader(self):
        return self.env.reader()

    def write(self, fn):
        return self.env.write(fn)
