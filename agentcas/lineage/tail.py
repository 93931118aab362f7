"""A rollout file's new tail: check it continues the stored history, prepare its new lines.

`commit --rollout FILE` stores only the complete lines appended to FILE since the
thread's history head. Before anything is stored, the file must still start with
that history: it must be at least as long, and its bytes must equal the stored bytes
of the last segment and the first 64 KiB of the first (a truncated or rewritten file
is refused by name). The new lines are prepared as segments against the head read
here; the commit's plan refuses to land if the history moved meanwhile.
"""

from __future__ import annotations

import os

from agentcas.cas.objects import EMPTY_POSITION, HistoryPosition
from agentcas.cas.source import ObjectSource
from agentcas.cas.writer import BatchWriter
from agentcas.errors import UsageError
from agentcas.lineage import rollout
from agentcas.refs.threads import ThreadState

COMPARED_HEAD_BYTES = 65536


def prepare_tail(objects: ObjectSource, writer: BatchWriter, thread: str, state: ThreadState | None,
                 path: str) -> tuple[list, HistoryPosition]:
    """(prepared segments of the new complete lines of `path`, the head they continue)."""
    head = EMPTY_POSITION if state is None else state.history
    history = rollout.History(objects)
    try:
        handle = open(path, "rb")
    except OSError as exc:
        raise UsageError(f"cannot read rollout file {path}: {exc.strerror}") from None
    with handle:
        size = os.fstat(handle.fileno()).st_size
        if size < head.offset:
            raise rollout.RolloutMismatch(
                f"rollout file {path} is shorter ({size} bytes) than the {head.offset} bytes "
                f"already stored for thread {thread!r}: it was truncated or rewritten; "
                "nothing was committed")
        if head.seq and not _starts_with_history(handle, history, head):
            raise rollout.RolloutMismatch(
                f"rollout file {path} differs from the history already stored for thread "
                f"{thread!r} (it was rewritten or edited); nothing was committed")
        handle.seek(head.offset)
        tail = handle.read()
    cut = tail.rfind(b"\n") + 1
    prepared = rollout.prepare(tail[:cut], writer.add, first_line=head.seq + 1)
    writer.flush()
    return prepared, head


def _starts_with_history(handle, history: rollout.History, head: HistoryPosition) -> bool:
    """Compare the stored bytes of the last segment and the first 64 KiB of the first."""
    _, seg, cut = history.locate(head, head.seq - 1)
    stored = history.segment_bytes(seg, cut)
    handle.seek(seg.base.offset)
    same = handle.read(len(stored)) == stored
    if seg.base.seq:
        _, first_seg, first_cut = history.locate(head, 0)
        first = history.segment_bytes(first_seg, first_cut)[:COMPARED_HEAD_BYTES]
        handle.seek(0)
        same = same and handle.read(len(first)) == first
    return same
