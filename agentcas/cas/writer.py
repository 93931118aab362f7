"""Batched object writes under a lease.

One durable transaction (or one round of uploads) costs a fixed fee, so objects are
collected and written in batches of about BATCH_BYTES. Objects already stored are
skipped: one batched existence question, then put-if-absent. The question is asked
only while it pays: a batch in which fewer than 1/PAYS_EVERY of the objects asked
about were stored makes the next batches skip it (put-if-absent alone keeps the
stored bytes; on S3 the question lists every stored key in the batch's range, so a
first commit would list the store once per batch), and a batch whose put-if-absent
found that many already stored turns it back on. Each flush refreshes the writer's
lease (cas/leases.py), so a long commit keeps gc from sweeping. A writer made with
`background` (a shared store's commit) writes each full batch on a thread while the
caller goes on adding, up to IN_FLIGHT batches at a time (some upload while another
lands in the local cache); flush() waits for them all. A writer made with `held` (a dict)
stores full batches as usual but leaves the last, partial one in `held` (minus what
`known` says is stored) for the caller's ref move to store with its own objects: on a
shared store the move's one pack then carries them, so a small step is one upload.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import TYPE_CHECKING

from agentcas import testing_hooks
from agentcas.cas import crashpoints
from agentcas.cas.digest import Digest
from agentcas.cas.leases import Lease
from agentcas.cas.source import ObjectSource

if TYPE_CHECKING:
    from concurrent.futures import ThreadPoolExecutor

BATCH_BYTES = 64 * 1024 * 1024  # measured here: 32 MiB 0.9 s, 64 MiB 0.55 s, 256 MiB 0.85 s per 256 MB
BATCH_OBJECTS = crashpoints.batch_objects(4096)  # a test-only override makes more crash points
PAYS_EVERY = 16  # the existence question pays while at least 1 in 16 objects asked about is stored
# Background batches written at once (a commit then holds up to 1 + IN_FLIGHT batches of
# framed objects, 256 MiB). With one, the uploads stopped while each batch was copied into
# the cache (a quarter of the writer thread's time on a 1 GiB commit to S3); 1 GiB first
# commit to localhost SeaweedFS, 8 connections: 2 in flight 13.1 / 14.4 s, 3 12.9 / 11.7 s
# (restic 12.9-13.8 s in the same runs).
IN_FLIGHT = 3


class BatchWriter:
    """Collects framed objects and writes them in a few large batches."""

    def __init__(self, objects: ObjectSource, batch_bytes: int = BATCH_BYTES, lease: Lease | None = None,
                 known=None, background: bool = False, held: dict | None = None):
        # `known(keys)`: objects this machine knows are stored (a shared store's local cache),
        # skipped without asking the server; only for writers that re-check everything they
        # rely on before their ref moves (a commit's `needed`).
        self.objects = objects
        self.lease = lease
        self.known = known
        self.batch_bytes = batch_bytes
        self._pending: dict[bytes, bytes] = {}
        self._pending_bytes = 0
        self.written_objects = 0
        self.written_bytes = 0
        self.asking = True  # ask which objects are stored before writing (see the module doc)
        # `background`: a full batch is written on a thread while the caller goes on adding
        # (uploads to a remote store overlap hashing); at most IN_FLIGHT batches are in
        # flight, and flush() waits for them, so everything added is stored when it returns.
        self.background = background
        self.held = held  # the last batch, left for the caller's move (see the module doc)
        self._pool: ThreadPoolExecutor | None = None
        self._in_flight: deque = deque()
        self._lock = threading.Lock()  # the lease and the counters, shared by the batches

    def add(self, digest: Digest, framed: bytes) -> None:
        if digest.raw in self._pending:
            return
        self._pending[digest.raw] = framed
        self._pending_bytes += len(framed)
        if self._pending_bytes >= self.batch_bytes or len(self._pending) >= BATCH_OBJECTS:
            self._flush(wait=not self.background)

    def flush(self) -> None:
        """Store everything added so far (waiting for a batch still being written); with
        `held`, the last partial batch goes there instead, for the caller to store."""
        if self.held is not None and self._pending:
            batch, self._pending, self._pending_bytes = self._pending, {}, 0
            batch = self._unstored(batch)
            with self._lock:
                for raw, framed in batch.items():
                    if raw not in self.held:
                        self.held[raw] = framed
                        self.written_objects += 1
                        self.written_bytes += len(framed)
        self._flush(wait=True)
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def _flush(self, wait: bool) -> None:
        # Earlier batches first (their errors are raised here): all of them before writing
        # in the foreground, else until there is room for one more.
        try:
            while self._in_flight and (wait or len(self._in_flight) >= IN_FLIGHT):
                self._in_flight.popleft().result()
        except BaseException:
            self._abandon()
            raise
        if not self._pending:
            return
        batch = self._pending
        self._pending = {}
        self._pending_bytes = 0
        if wait:
            self._write(batch)
            return
        if self._pool is None:
            from concurrent.futures import ThreadPoolExecutor
            self._pool = ThreadPoolExecutor(IN_FLIGHT, thread_name_prefix="agentcas-writer")
        self._in_flight.append(self._pool.submit(self._write, batch))

    def _abandon(self) -> None:
        """After a batch failed: let the others end (their errors are moot) before raising,
        so no upload goes on behind a caller that has been told the write failed."""
        for future in self._in_flight:
            future.cancel()
            try:
                future.result()
            except BaseException:
                pass
        self._in_flight.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def _unstored(self, batch: dict) -> dict:
        """The part of `batch` not known to be stored (asking the store while it pays)."""
        present = self.known(batch.keys()) if self.known is not None else set()
        if self.asking and len(present) < len(batch):
            asked = [raw for raw in batch if raw not in present]
            stored = self.objects.blobs.has_many(asked)
            present |= stored
            self.asking = len(stored) * PAYS_EVERY >= len(asked)
        return {raw: framed for raw, framed in batch.items() if raw not in present}

    def _write(self, batch: dict) -> None:
        batch = self._unstored(batch)
        if self.lease is not None:
            with self._lock:
                self.lease.refresh()
        if not batch:
            return
        count, size = self.objects.put_many(batch)
        with self._lock:
            self.written_objects += count
            self.written_bytes += size
        if (len(batch) - count) * PAYS_EVERY >= len(batch):
            self.asking = True
        testing_hooks.reached("writer.after_batch")
