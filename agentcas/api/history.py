"""`store.history`: append records to a thread's history and read them back.

Appends are lineage/appends.py's ref moves; reads walk lineage/rollout.py's segments
(verified as they are read), with one decoded-segment cache per store.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from agentcas.cas import framing
from agentcas.cas.leases import Lease
from agentcas.cas.objects import HistoryPosition
from agentcas.cas.writer import BatchWriter
from agentcas.errors import NotFound, UsageError
from agentcas.lineage import rollout
from agentcas.lineage.appends import AppendResult, append_records
from agentcas.refs import revisions
from agentcas.refs.names import check_thread_name
from agentcas.refs.threads import ForkOrigin

if TYPE_CHECKING:
    from agentcas.lineage.marks import IngestedThread
    from agentcas.repository import Store

# Harness logs: level 3 (small tables), 4x faster than the rollout level 7, ~3% larger.
INGEST_ZSTD_LEVEL = framing.INGEST_ZSTD


@dataclass(frozen=True)
class SessionAppend:
    """One thread's part of `store.history.ingest`: new complete lines and where to checkpoint."""

    thread: str
    data: bytes
    marks: tuple[tuple[int, str], ...] = ()
    based_on: HistoryPosition | None = None
    forked_from: ForkOrigin | None = None
    # `data` prepared ahead (rollout.pack_raw_lines at INGEST_ZSTD_LEVEL, chained from
    # `based_on`'s digest at these marks), e.g. in an ingest worker; `data` may then be empty.
    packed: rollout.PackedLines | None = None
    # Lines of `data` that copy another history's records (a Codex fork's copy of its
    # parent): those that are copies are stored as copies (rollout.prepare_with_copies),
    # `packed` is then not used.
    copies: rollout.CopyClaim | None = None


class Histories:
    """The rollout histories of a store's threads (`store.history`)."""

    def __init__(self, store: Store):
        self._store = store
        self._backends = store.backends
        self.segments = rollout.SegmentCache()  # decoded segments, kept across reads

    def history(self, objects=None) -> rollout.History:
        """A reader of histories over this store's objects (or `objects`, a pinned reader)."""
        return rollout.History(objects or self._backends.source, self.segments)

    def append(self, thread: str, data: bytes) -> AppendResult:
        """Append JSONL records to a thread's history (creating the thread if new)."""
        return append_records(self._backends, thread, data)

    def read(self, rev: str, start: int = 0, stop: int | None = None,
             whole_records: bool = True, clamp: bool = True) -> Iterator[bytes]:
        """An iterator over the bytes of records start <= seq < stop of a thread's history.

        `rev` may also be a revision: a checkpoint's prefix, or for THREAD@{N} the
        whole history that reflog entry recorded. A `stop` past the end reads to the end
        (`clamp=False`: raises, as `rollout cat --to` does); a bad range raises UsageError
        here, before any byte is produced. Each piece holds whole
        records unless `whole_records=False` (pieces as stored, for copying bytes out).
        """
        if start < 0 or (stop is not None and stop < 0):
            raise UsageError("--from and --to must not be negative")
        with self._backends.meta.reader() as txn:
            try:
                head, _, _ = revisions.source_state(txn, self._backends.source, rev)
            except NotFound:
                raise NotFound(f"no thread or checkpoint named {rev!r}") from None
        if start > head.seq:
            raise UsageError(f"--from {start} is beyond the end of the history ({head.seq} records)")
        if not clamp and stop is not None and stop > head.seq:  # as fork --at and replay --at
            raise UsageError(f"--to {stop} is beyond the end of the history ({head.seq} records)")
        if stop is not None and stop < start:
            raise UsageError(f"--to {stop} is before --from {start}")
        return self._read(head, start, stop, whole_records)

    def read_at(self, position: HistoryPosition, start: int, stop: int | None) -> bytes:
        """The verified bytes of records start <= seq < stop of the history ending at `position`."""
        return b"".join(self._read(position, start, stop))

    def _read(self, head: HistoryPosition, start: int, stop: int | None, whole_records: bool = True):
        # buffers=True: chunk values are views into the map (LMDB), decompressed from there by
        # the workers, instead of a copy of every compressed chunk made in this thread first.
        with self._backends.source.reading(buffers=True) as objects:
            yield from self.history(objects).read(head, start, stop, whole_records)

    def ingest(self, appends: list[SessionAppend], author: str | None = None) -> list[IngestedThread]:
        """Append raw log lines to several threads, with a checkpoint at each mark.

        Each SessionAppend's lines are stored byte for byte (no JSON check); each mark
        (records after the append's start, reason) becomes a checkpoint with an empty
        tree at that position, chained on the thread's checkpoints. The threads land
        together or not at all, in one metadata transaction (lineage/marks.py); a thread
        no longer at `based_on` (None: must not exist) raises ConflictError and nothing lands.
        """
        from agentcas.cas.store_format import utc_now
        from agentcas.lineage.checkpoints import default_author, runtime_description
        from agentcas.lineage.marks import append_many_with_marks, prepare_raw
        for item in appends:   # reasons are checked by Checkpoint itself, in the plan
            check_thread_name(item.thread)
        who, created_at, runtime = author or default_author(), utc_now(), runtime_description()
        with Lease(self._backends.meta, "ingest") as lease:
            writer = BatchWriter(self._backends.source, lease=lease)
            prepared = prepare_raw([b"" if item.copies is not None else item.data if item.packed is None
                                    else item.packed for item in appends], writer, INGEST_ZSTD_LEVEL)
            for number, item in enumerate(appends):
                if item.copies is not None:
                    prepared[number] = rollout.prepare_with_copies(self.history(), item.data, item.copies,
                                                                   writer.add, INGEST_ZSTD_LEVEL)
            writer.flush()
            return append_many_with_marks(
                self._backends, lease, [(item.thread, segments, item.marks, item.based_on, item.forked_from)
                                      for item, segments in zip(appends, prepared)], who, created_at, runtime)
