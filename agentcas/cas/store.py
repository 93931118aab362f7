"""The object-store interface: named tables of bytes, read and write transactions.

Objects (chunks, trees, checkpoints, ...) and the mutable tables (refs, reflog, trust,
...) live in one store so that a checkpoint, its ref move and its reflog entry commit
in a single write transaction. `write(fn)` runs `fn(txn)` atomically and may run it
again (after growing an LMDB map), so `fn` must have no side effects outside `txn`.
Every object read goes through `load_object`, which verifies the id; missing is None.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from contextlib import contextmanager
from typing import Callable, Iterator, TypeVar

import blake3

from agentcas.cas import framing
from agentcas.cas.digest import OBJECT_CONTEXTS, Digest, DigestMismatch
from agentcas.errors import IntegrityError

T = TypeVar("T")

TABLES = ("meta", "objects", "refs", "reflog", "statcache", "trust", "remotes", "pins",
          "signatures", "imports")


class Txn(ABC):
    """One transaction over the store's tables. Keys and values are bytes."""

    @abstractmethod
    def get(self, table: str, key: bytes) -> bytes | None: ...

    @abstractmethod
    def scan(self, table: str, prefix: bytes = b"", start: bytes | None = None,
             reverse: bool = False) -> Iterator[tuple[bytes, bytes]]:
        """Keys with `prefix` in key order (from `start` if given; descending if reverse)."""

    @abstractmethod
    def put(self, table: str, key: bytes, value: bytes) -> None: ...

    @abstractmethod
    def put_new(self, table: str, key: bytes, value: bytes) -> bool:
        """Insert unless present; True if inserted."""

    @abstractmethod
    def delete(self, table: str, key: bytes) -> bool: ...

    @abstractmethod
    def count(self, table: str) -> int: ...


class ObjectStore(ABC):
    """A transactional store of tables; implementations: memory and LMDB."""

    url: str

    @abstractmethod
    def reader(self, buffers: bool = False) -> "contextmanager[Txn]":
        """A consistent read-only snapshot.

        With `buffers=True`, values may be memoryviews into the store that are valid
        only until the transaction ends (zero-copy reads for large restores).
        """

    @abstractmethod
    def write(self, fn: Callable[[Txn], T]) -> T:
        """Run `fn` in one atomic write transaction (serialised across processes)."""

    def close(self) -> None:
        pass

    def used_bytes(self) -> int:
        """Bytes the store occupies (pages in use), for reports and benchmarks."""
        return 0


# --- object helpers: every object read verifies its id -------------------------------

def verify_object(kind: int, digest: Digest, data: bytes) -> None:
    """Raise DigestMismatch unless `data` hashes to `digest` under `kind`'s rule."""
    if kind == framing.KIND_CHUNK:
        got = blake3.blake3(data, max_threads=1).digest()
    else:
        got = blake3.blake3(data, derive_key_context=OBJECT_CONTEXTS[framing.KIND_NAMES[kind]]).digest()
    if got != digest.raw:
        raise DigestMismatch(digest, Digest(got), framing.KIND_NAMES[kind])


def load_object(txn: Txn, digest: Digest, kind: int | None = None) -> bytes | None:
    """The verified bytes of an object, or None if it is not stored."""
    value = txn.get("objects", digest.raw)
    if value is None:
        return None
    try:
        got_kind, data = framing.unframe(value)
    except framing.CorruptValue as exc:
        raise IntegrityError(f"object {digest.hex()} is corrupt: {exc}") from None
    verify_object(got_kind, digest, data)
    if kind is not None and got_kind != kind:
        raise IntegrityError(f"object {digest.hex()} is a {framing.KIND_NAMES[got_kind]}, "
                             f"expected a {framing.KIND_NAMES[kind]}")
    return data


def has_object(txn: Txn, digest: Digest) -> bool:
    return txn.get("objects", digest.raw) is not None


def object_kind(txn: Txn, digest: Digest) -> int | None:
    value = txn.get("objects", digest.raw)
    if value is None:
        return None
    try:
        return framing.read_header(value)[0]
    except framing.CorruptValue as exc:
        raise IntegrityError(f"object {digest.hex()} is corrupt: {exc}") from None


def save_object(txn: Txn, digest: Digest, framed: bytes) -> bool:
    """Store a framed object under its id unless present; True if it was new."""
    return txn.put_new("objects", digest.raw, framed)


# --- in-memory implementation ------------------------------------------------------------

class _MemoryTxn(Txn):
    def __init__(self, tables: dict, writable: bool):
        self._tables = tables
        self._writable = writable

    def get(self, table, key):
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


class MemoryObjectStore(ObjectStore):
    """Tables in dicts; a write runs on a copy that replaces the original on success."""

    def __init__(self) -> None:
        self.url = "memory://"
        self._tables = {name: {} for name in TABLES}
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
