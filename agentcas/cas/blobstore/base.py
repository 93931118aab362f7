"""The blob-store interface: immutable objects keyed by their raw 32-byte id.

A blob store holds framed objects (cas/framing.py: header, then raw or zstd bytes) and
nothing else. It has no transactions: every operation is idempotent, an object is
written only if absent (create-if-absent), and a reader that finds a key gets the
bytes that were first written under it. It does not verify: callers read objects
through `cas.source.ObjectSource`, which checks every value against its id.
Backends: memory.py, ../lmdb_store.py (in the store's one LMDB environment), s3.py.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from agentcas.cas.chunking import LOCAL, ChunkSizes
from agentcas.errors import AgentcasError

KEY_SIZE = 32


@dataclass(frozen=True)
class BlobInfo:
    """One stored object as a listing sees it, without reading its body."""

    key: bytes           # raw 32-byte object id
    size: int            # stored (framed) bytes
    written_at: float    # unix seconds when it was first stored (gc's grace period)
    kind: int | None     # framing.KIND_* when the backend knows it cheaply, else None


class BlobUnavailable(AgentcasError):
    """The backend could not be reached after its retries: one line naming the service, exit 1."""


class BlobStore(ABC):
    """Immutable framed objects by raw id: has / get / put-if-absent / delete / list."""

    url: str
    # How a commit cuts workspace files for this store (cas/chunking.py: a backend where
    # every object is a request cuts larger chunks).
    chunk_sizes: ChunkSizes = LOCAL
    # Whether one get_many of many keys costs far less than a get each (a shared store's
    # packs: a few ranged GETs), so a restore fetches ahead in batches.
    batched_reads: bool = False

    @abstractmethod
    def get(self, key: bytes) -> bytes | None:
        """The framed value stored under `key`, or None (not verified here)."""

    def get_many(self, keys: Sequence[bytes]) -> dict[bytes, bytes]:
        """{key: framed value} for the keys that are stored (backends may fetch in parallel)."""
        out = {}
        for key in keys:
            value = self.get(key)
            if value is not None:
                out[bytes(key)] = value
        return out

    def fetch_many(self, keys: Sequence[bytes]) -> dict[bytes, bytes]:
        """get_many for a one-pass bulk read (a restore): a cache in front of a remote store
        passes what it fetches through without keeping it (it would only evict what this
        machine reads again). Values may be read-only views (memoryview) into larger
        buffers: a caller reads them, hashes them, writes them out."""
        return self.get_many(keys)

    @abstractmethod
    def has_many(self, keys: Iterable[bytes]) -> set[bytes]:
        """The subset of `keys` that is stored (batched where the backend can)."""

    def has(self, key: bytes) -> bool:
        return bool(self.has_many([key]))

    @abstractmethod
    def put_many(self, items: Mapping[bytes, bytes]) -> tuple[int, int]:
        """Store each {key: framed value} unless present; (objects written, bytes written)."""

    def stage_many(self, items: Mapping[bytes, bytes]) -> list[tuple]:
        """Store `items` for a ref move: either stored now (the default: put_many; nothing is
        returned), or written where they will live, with the metadata writes (table, key,
        value) that make them stored returned to go in the move's own exchange (packs on S3:
        blobstore/s3_packs.py). Until those land, the objects are not stored."""
        if items:
            self.put_many(items)
        return []

    def put_if_absent(self, key: bytes, value: bytes) -> bool:
        """Store one object unless present; True if it was written now."""
        return self.put_many({bytes(key): value})[0] == 1

    @abstractmethod
    def delete_many(self, keys: Iterable[bytes]) -> int:
        """Delete the given keys (absent ones are ignored); how many were deleted."""

    @abstractmethod
    def list(self) -> Iterator[BlobInfo]:
        """Every stored object, streamed (in key order where the backend can)."""

    def list_unordered(self) -> Iterator[BlobInfo]:
        """Every stored object, streamed in whatever order the backend reads fastest (a
        whole-store pass that needs no order: gc's plan); `list()` unless a backend knows better."""
        return self.list()

    def header(self, key: bytes) -> bytes | None:
        """The first framing.HEADER_SIZE bytes of an object (kind, size, written_at), or None."""
        from agentcas.cas import framing
        value = self.get(key)
        return None if value is None else bytes(value[:framing.HEADER_SIZE])

    def headers(self, keys: Sequence[bytes]) -> dict[bytes, bytes]:
        """{key: header} of the stored ones among `keys` (a remote backend asks in parallel)."""
        found = {}
        for key in keys:
            head = self.header(key)
            if head is not None:
                found[bytes(key)] = head
        return found

    def count(self) -> int:
        return sum(1 for _ in self.list())

    def get_many_stored(self, keys: Sequence[bytes]) -> dict[bytes, bytes]:
        """get_many from the store itself, never from a copy (a cache in front of a shared
        store asks what it fronts): what fsck verifies."""
        return self.get_many(keys)

    def used_bytes(self) -> int:
        """Bytes the objects occupy, for reports and benchmarks (0 if unknown)."""
        return 0

    def close(self) -> None:
        pass

    # A shared store's prefix holds a marker naming the store that owns it (cas/backends.py);
    # only the backends a shared store is made of have one.
    def read_marker(self) -> bytes | None:
        """The marker's bytes, or None if the prefix has none."""
        raise NotImplementedError(f"{type(self).__name__} has no store marker")

    def create_marker(self, data: bytes) -> bool:
        """Write the marker unless one exists; True if written now."""
        raise NotImplementedError(f"{type(self).__name__} has no store marker")
