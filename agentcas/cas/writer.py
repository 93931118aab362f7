"""Batched object writes, and the pin that tells gc a write is in progress.

One durable LMDB transaction costs a fixed fee, so objects are collected and written
in batches of about BATCH_BYTES. Objects already stored are skipped (`put_new`).
A `WritePin` row (start time, pid) is written before or with the first object and
removed in the final transaction; gc keeps every object written since the oldest
live pin started, so a writer's fresh objects survive even `gc --grace 0s`. A lazy
pin is written by its BatchWriter in the same transaction as the first batch (gc
sees both or neither), so a write that stores nothing new costs no pin at all.
"""

from __future__ import annotations

import os
import time

from agentcas.cas import crashpoints, encoding
from agentcas.cas.digest import Digest
from agentcas.cas.sealed import seal
from agentcas.cas.store import ObjectStore, Txn, save_object

BATCH_BYTES = 64 * 1024 * 1024  # measured here: 32 MiB 0.9 s, 64 MiB 0.55 s, 256 MiB 0.85 s per 256 MB
BATCH_OBJECTS = crashpoints.batch_objects(4096)  # a test-only override makes more crash points


class BatchWriter:
    """Collects framed objects and writes them in a few large transactions."""

    def __init__(self, store: ObjectStore, batch_bytes: int = BATCH_BYTES, pin: "WritePin | None" = None):
        self.store = store
        self.pin = pin
        self.batch_bytes = batch_bytes
        self._pending: dict[bytes, bytes] = {}
        self._pending_bytes = 0
        self.written_objects = 0
        self.written_bytes = 0

    def add(self, digest: Digest, framed: bytes) -> None:
        if digest.raw in self._pending:
            return
        self._pending[digest.raw] = framed
        self._pending_bytes += len(framed)
        if self._pending_bytes >= self.batch_bytes or len(self._pending) >= BATCH_OBJECTS:
            self.flush()

    def flush(self) -> None:
        if not self._pending:
            return
        batch = self._pending
        with self.store.reader() as txn:
            batch = {raw: framed for raw, framed in batch.items() if txn.get("objects", raw) is None}
        self._pending = {}
        self._pending_bytes = 0
        if not batch:
            return
        pin = self.pin if self.pin is not None and not self.pin.written else None
        count, size = put_objects(self.store, batch, pin)
        if pin is not None:
            pin.written = True
        self.written_objects += count
        self.written_bytes += size


def put_objects(store: ObjectStore, batch: dict, pin: "WritePin | None" = None) -> tuple[int, int]:
    """Store {raw id: framed value} in one transaction (with a lazy pin's row, if given),
    skipping objects already present; (objects written, bytes written)."""
    def put_all(txn: Txn):
        if pin is not None:
            pin.put(txn)
        count = size = 0
        for raw, framed in batch.items():
            if save_object(txn, Digest(raw), framed):
                count += 1
                size += len(framed)
        return count, size

    return store.write(put_all)


class WritePin:
    """A row in `pins` for the duration of a write; use as a context manager."""

    def __init__(self, store: ObjectStore, what: str, lazy: bool = False):
        self.store = store
        self.key = os.urandom(16)
        self.doc = {"what": what, "pid": os.getpid(), "started_at": int(time.time()) - 1}
        self.lazy = lazy
        self.written = False
        self.released = False

    def put(self, txn: Txn) -> None:
        """Write the pin row in `txn` (a lazy pin's first batch)."""
        txn.put("pins", self.key, seal("pins", self.key, encoding.encode(self.doc)))

    def __enter__(self):
        if not self.lazy:
            self.store.write(self.put)
            self.written = True
        return self

    def release(self, txn: Txn) -> None:
        """Remove the pin inside the writer's final transaction."""
        txn.delete("pins", self.key)
        self.released = True

    def __exit__(self, *exc):
        if not self.written or (self.released and exc[0] is None):
            return False
        try:
            self.store.write(lambda txn: txn.delete("pins", self.key))
        except Exception:  # noqa: BLE001 - a stale pin is harmless: gc drops dead pids
            pass
        return False


