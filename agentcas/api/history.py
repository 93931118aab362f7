"""`store.history`: append records to a thread's history and read them back.

Appends are lineage/appends.py's ref moves; reads walk lineage/rollout.py's segments
(verified as they are read), with one decoded-segment cache per store.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from agentcas.cas import framing
from agentcas.cas.objects import HistoryPosition
from agentcas.errors import NotFound, UsageError
from agentcas.lineage import rollout
from agentcas.lineage.appends import AppendResult, append_records
from agentcas.lineage.marks import SessionAppend  # noqa: F401 - part of the API (`ingest`'s argument)
from agentcas.refs import revisions

if TYPE_CHECKING:
    from agentcas.cas.source import ObjectSource
    from agentcas.lineage.marks import IngestedThread
    from agentcas.repository import Store

# Harness logs: level 3 (small tables), 4x faster than the rollout level 7, ~3% larger.
INGEST_ZSTD_LEVEL = framing.INGEST_ZSTD


class Histories:
    """The rollout histories of a store's threads (`store.history`)."""

    def __init__(self, store: Store):
        self._store = store
        self._backends = store.backends
        self.segments = rollout.SegmentCache()  # decoded segments, kept across reads

    def history(self, objects: ObjectSource | None = None) -> rollout.History:
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

    def _read(self, head: HistoryPosition, start: int, stop: int | None,
              whole_records: bool = True) -> Iterator[bytes]:
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
        from agentcas.lineage.marks import ingest_sessions
        return ingest_sessions(self._backends, self.history(), appends, author)
