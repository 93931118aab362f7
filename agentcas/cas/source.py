"""`ObjectSource`: the one read-only, verifying way the layers read objects by id.

Every layer above cas/ (lineage, workspace, gc marking, bundles, transfer) reads an
object through `load(digest, kind)`: the stored value is unframed and its bytes are
checked against the id under the kind's hashing rule before anyone decodes them;
missing is None. The source wraps a BlobStore (memory, LMDB, S3, or a cache over S3);
with LMDB, `reading()` pins one read snapshot for a burst of reads.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import blake3

from agentcas.cas import framing
from agentcas.cas.blobstore.base import BlobStore
from agentcas.cas.digest import Digest, DigestMismatch, object_context
from agentcas.errors import IntegrityError


def verify_object(kind: int, digest: Digest, data: bytes) -> None:
    """Raise DigestMismatch unless `data` hashes to `digest` under `kind`'s rule."""
    if kind == framing.KIND_CHUNK:
        got = blake3.blake3(data, max_threads=1).digest()
    else:
        name = framing.KIND_NAMES[kind]
        got = blake3.blake3(data, derive_key_context=object_context(name, bytes(data[:1]))).digest()
    if got != digest.raw:
        raise DigestMismatch(digest, Digest(got), framing.KIND_NAMES[kind])


def unframe_verified(digest: Digest, value, kind: int | None = None) -> bytes:
    """The verified bytes of a stored value read under `digest` (of `kind`, if given)."""
    try:
        got_kind, data = framing.unframe(value)
    except framing.CorruptValue as exc:
        raise IntegrityError(f"object {digest.hex()} is corrupt: {exc}") from None
    verify_object(got_kind, digest, data)
    if kind is not None and got_kind != kind:
        raise IntegrityError(f"object {digest.hex()} is a {framing.KIND_NAMES[got_kind]}, "
                             f"expected a {framing.KIND_NAMES[kind]}")
    return data


class ObjectSource:
    """Verified reads by id over a blob store; also the place writes of objects go."""

    def __init__(self, blobs: BlobStore):
        self.blobs = blobs

    def raw(self, digest: Digest):
        """The stored (framed) value, unverified, or None."""
        return self.blobs.get(digest.raw)

    def load(self, digest: Digest, kind: int | None = None) -> bytes | None:
        """The verified bytes of an object, or None if it is not stored."""
        value = self.blobs.get(digest.raw)
        return None if value is None else unframe_verified(digest, value, kind)

    def has(self, digest: Digest) -> bool:
        return self.blobs.has(digest.raw)

    def missing(self, raws: Iterable[bytes]) -> set[bytes]:
        """The raw ids among `raws` that are not stored (one batched question)."""
        wanted = set(raws)
        return wanted - self.blobs.has_many(wanted) if wanted else set()

    def kind(self, digest: Digest) -> int | None:
        header = self.blobs.header(digest.raw)
        if header is None:
            return None
        try:
            return framing.read_header(header)[0]
        except framing.CorruptValue as exc:
            raise IntegrityError(f"object {digest.hex()} is corrupt: {exc}") from None

    def keys_from(self, start: bytes) -> Iterator[bytes]:
        """Stored ids >= `start` in order (prefix resolution)."""
        lister = getattr(self.blobs, "list_from", None)
        if lister is not None:
            yield from (info.key for info in lister(start))
            return
        yield from sorted(info.key for info in self.blobs.list() if info.key >= start)

    def put_many(self, items: dict) -> tuple[int, int]:
        """Store framed objects unless present: (objects written, bytes written)."""
        return self.blobs.put_many(items) if items else (0, 0)

    def stage_many(self, items: dict) -> list[tuple]:
        """Store framed objects for a ref move (BlobStore.stage_many): the metadata writes
        that must land in the move's exchange for them to be stored (often none)."""
        return self.blobs.stage_many(items) if items else []

    @contextmanager
    def reading(self, buffers: bool = False):
        """A source pinned to one read snapshot where the backend has them (LMDB).

        With `buffers`, raw values may be memoryviews valid until the block ends.
        """
        snapshot = getattr(self.blobs, "snapshot", None)
        if snapshot is None:
            yield self
            return
        with snapshot(buffers) as view:
            yield ObjectSource(view)


def load_object(objects: ObjectSource, digest: Digest, kind: int | None = None) -> bytes | None:
    """The verified bytes of an object, or None (module-level form of `ObjectSource.load`)."""
    return objects.load(digest, kind)
