"""The metadata-store interface: small mutable tables in atomic transactions.

Tables (names below): `meta` (format record, counters), `refs` (threads/NAME), `reflog`,
`leases` (writers in progress, see cas/leases.py), `trust`, `remotes`, `signatures`
(checkpoint || signature id -> nothing: an index), `imports`, and a shared store's pack
index, `s3index` (object id -> where in which pack) and `s3packs` (pack -> its size, time
and members; cas/blobstore/s3_packs.py). Keys and values are
bytes; values of every table are sealed by the layer that owns them (cas/sealed.py).

`write(fn)` runs `fn(txn)` as one atomic transaction and may run it again after a
retryable failure (a resized LMDB map, a PostgreSQL serialization failure or a
dropped connection), so `fn` must have no side effects outside `txn`.
`compare_and_set` is the one primitive a ref move needs: it changes a row only if
it still holds `old`, atomically with respect to every other writer (LMDB: writers
are serialised; PostgreSQL: `UPDATE ... WHERE value = old`, the row count decides).

`exchange(reads, expect, writes)` gives the same guarantee in one request: read some
rows (or the last row under a prefix), and apply `writes` only if every row in
`expect` holds exactly the value given (None: absent), all atomically. Its default
runs in a `write` transaction; PostgreSQL runs it as one function call (one round
trip), which is what lets opening a store, taking a lease and moving a ref cost one
request each.
Backends: memory.py, ../lmdb_store.py, postgres.py.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TypeVar

from agentcas.errors import AgentcasError

T = TypeVar("T")

TABLES = ("meta", "refs", "reflog", "leases", "trust", "remotes", "signatures", "imports", "s3index", "s3packs")


class MetadataUnavailable(AgentcasError):
    """The backend could not be reached after its retries: one line naming the service, exit 1."""


class MetaTxn(ABC):
    """One transaction over the metadata tables."""

    @abstractmethod
    def get(self, table: str, key: bytes, for_update: bool = False) -> bytes | None:
        """The value, or None. `for_update` locks the row until the transaction ends
        (PostgreSQL `SELECT ... FOR UPDATE`; a no-op where writers are serialised)."""

    @abstractmethod
    def scan(self, table: str, prefix: bytes = b"", start: bytes | None = None,
             reverse: bool = False) -> Iterator[tuple[bytes, bytes]]:
        """Keys with `prefix` in byte order (from `start` if given; descending if reverse)."""

    @abstractmethod
    def put(self, table: str, key: bytes, value: bytes) -> None: ...

    @abstractmethod
    def put_new(self, table: str, key: bytes, value: bytes) -> bool:
        """Insert unless present; True if inserted."""

    @abstractmethod
    def delete(self, table: str, key: bytes) -> bool: ...

    @abstractmethod
    def compare_and_set(self, table: str, key: bytes, old: bytes | None, new: bytes | None) -> bool:
        """Set `key` to `new` only if it holds `old` (None: absent / delete); True if changed."""

    @abstractmethod
    def count(self, table: str) -> int: ...


@dataclass(frozen=True)
class Read:
    """One row to read in an `exchange`: `key` exactly, or with `last` the greatest key
    starting with `key` (the answer is then (key, value) or None)."""

    table: str
    key: bytes
    last: bool = False


def prefix_end(prefix: bytes) -> bytes | None:
    """The smallest key greater than every key starting with `prefix` (None: no bound)."""
    trimmed = prefix.rstrip(b"\xff")
    if not trimmed:
        return None
    return trimmed[:-1] + bytes([trimmed[-1] + 1])


def run_exchange(txn: MetaTxn, reads, expect, writes) -> tuple[bool, list]:
    """`exchange` inside a write transaction (the default for every backend)."""
    values: list = []
    for read in reads:
        if read.last:
            row = next(txn.scan(read.table, read.key, reverse=True), None)
            values.append(None if row is None else (bytes(row[0]), bytes(row[1])))
        else:
            value = txn.get(read.table, read.key, for_update=True)  # a no-op in readers
            values.append(None if value is None else bytes(value))
    for table, key, value in expect:
        held = txn.get(table, key, for_update=True)
        if (None if held is None else bytes(held)) != value:
            return False, values
    for table, key, value in writes:
        if value is None:
            txn.delete(table, key)
        else:
            txn.put(table, key, value)
    return True, values


class MetadataStore(ABC):
    """Transactional metadata tables; implementations: memory, LMDB, PostgreSQL."""

    url: str

    def exchange(self, reads: Sequence[Read] = (), expect: Sequence[tuple] = (),
                 writes: Sequence[tuple] = ()) -> tuple[bool, list]:
        """Atomically: read `reads`, then apply `writes` ((table, key, value); None
        deletes) if every (table, key, value) of `expect` holds (None: absent).

        Returns (whether the writes were applied, the values read before any write:
        bytes or None, or for a `last` read (key, value) or None). Reads lock their
        rows like `get(for_update=True)`. Like `write`, it may be re-run after a
        retryable failure, so after a lost connection it may find its own success.
        """
        if not expect and not writes:
            with self.reader() as txn:  # nothing to apply: a snapshot suffices (no write lock)
                return run_exchange(txn, reads, (), ())
        return self.write(lambda txn: run_exchange(txn, reads, expect, writes))

    def read_many(self, table: str, keys: Sequence[bytes]) -> dict[bytes, bytes]:
        """{key: value} of the given keys that hold a row, from one snapshot (PostgreSQL: one
        statement, one round trip)."""
        with self.reader() as txn:
            found = {}
            for key in keys:
                value = txn.get(table, key)
                if value is not None:
                    found[bytes(key)] = bytes(value)
            return found

    @abstractmethod
    def reader(self) -> AbstractContextManager[MetaTxn]:
        """A consistent read-only snapshot."""

    @abstractmethod
    def write(self, fn: Callable[[MetaTxn], T]) -> T:
        """Run `fn` in one atomic write transaction (may re-run it; see module doc)."""

    def close(self) -> None:
        pass
