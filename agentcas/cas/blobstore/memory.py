"""The in-memory blob store: a dict of framed objects (tests, `memory://` stores).

`written_at` and `kind` of a listing come from each value's framing header, as the
LMDB backend reports them; a value whose header is damaged lists with kind None and
written_at 0 (fsck reads it and reports the damage).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence

from agentcas.cas import framing
from agentcas.cas.blobstore.base import BlobInfo, BlobStore


class MemoryBlobStore(BlobStore):
    """Objects in a dict; a lock makes put-if-absent atomic across threads."""

    def __init__(self) -> None:
        self.url = "memory://"
        self._objects: dict[bytes, bytes] = {}
        self._lock = threading.Lock()

    def get(self, key):
        return self._objects.get(bytes(key))

    def get_many(self, keys: Sequence[bytes]) -> dict[bytes, bytes]:
        objects = self._objects
        return {bytes(k): objects[bytes(k)] for k in keys if bytes(k) in objects}

    def has_many(self, keys: Iterable[bytes]) -> set[bytes]:
        objects = self._objects
        return {bytes(k) for k in keys if bytes(k) in objects}

    def put_many(self, items: Mapping[bytes, bytes]) -> tuple[int, int]:
        written = self.put_many_written(items)
        return len(written), sum(len(items[k]) for k in written)

    def put_many_written(self, items: Mapping[bytes, bytes]) -> set[bytes]:
        """put_many, answering which keys were written now."""
        written = set()
        with self._lock:
            for key, value in items.items():
                key = bytes(key)
                if key not in self._objects:
                    self._objects[key] = bytes(value)
                    written.add(key)
        return written

    def delete_many(self, keys: Iterable[bytes]) -> int:
        with self._lock:
            return sum(1 for k in keys if self._objects.pop(bytes(k), None) is not None)

    def list(self) -> Iterator[BlobInfo]:
        with self._lock:
            keys = sorted(self._objects)
        for key in keys:
            value = self._objects.get(key)
            if value is not None:
                yield _info(key, value)

    def count(self) -> int:
        return len(self._objects)

    def used_bytes(self) -> int:
        return sum(len(v) for v in list(self._objects.values()))


def _info(key: bytes, value: bytes) -> BlobInfo:
    try:
        kind, _, _, written_at = framing.read_header(value)
    except framing.CorruptValue:
        return BlobInfo(key, len(value), 0.0, None)
    return BlobInfo(key, len(value), float(written_at), kind)
