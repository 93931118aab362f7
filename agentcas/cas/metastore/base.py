"""The metadata-store interface: small mutable tables in atomic transactions.

Tables (names below): `meta` (format record, counters), `refs` (threads/NAME), `reflog`,
`leases` (writers in progress, see gc/leases.py), `trust`, `remotes`, `signatures`
(checkpoint || signature id -> nothing: an index), `imports`. Keys and values are
bytes; values of every table are sealed by the layer that owns them (cas/sealed.py).

`write(fn)` runs `fn(txn)` as one atomic transaction and may run it again after a
retryable failure (a resized LMDB map, a PostgreSQL serialization failure or a
dropped connection), so `fn` must have no side effects outside `txn`.
`compare_and_set` is the one primitive a ref move needs: it changes a row only if
it still holds `old`, atomically with respect to every other writer (LMDB: writers
are serialised; PostgreSQL: `UPDATE ... WHERE value = old`, the row count decides).
Backends: memory.py, ../lmdb_store.py, postgres.py.
"""

from __future__ import annotations

from agentcas.errors import AgentcasError

from abc import ABC, abstractmethod
from contextlib import AbstractContextManager
from typing import Callable, Iterator, TypeVar

T = TypeVar("T")

TABLES = ("meta", "refs", "reflog", "leases", "trust", "remotes", "signatures", "imports")


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


class MetadataStore(ABC):
    """Transactional metadata tables; implementations: memory, LMDB, PostgreSQL."""

    url: str

    @abstractmethod
    def reader(self) -> AbstractContextManager[MetaTxn]:
        """A consistent read-only snapshot."""

    @abstractmethod
    def write(self, fn: Callable[[MetaTxn], T]) -> T:
        """Run `fn` in one atomic write transaction (may re-run it; see module doc)."""

    def close(self) -> None:
        pass
