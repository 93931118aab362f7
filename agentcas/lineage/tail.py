"""A rollout file's new tail: check it continues the stored history, prepare its new lines.

`commit --rollout FILE` stores only the complete lines appended to FILE since the last
commit. The thread's history holds the file's lines and, between them, records agentcas
appended itself (effect records, `agentcas effect add`), which the file never holds. The
checkpoint of each such commit records where the history stands in the file (RolloutFile:
the file's first `offset` bytes are records of the history's first `seq`, record `seq - 1`
being the file's last), so the next commit finds its place without reading all of either:

1. Place. With the head checkpoint's RolloutFile, start there: the file must be at least
   `offset` bytes long, end those bytes with the records of the segment holding record
   `seq - 1` (the last append it came in), and begin like the history (the first
   segment's records in its first 64 KiB), both matched as in step 2. Without one (an older store, a first commit,
   a head committed without --rollout): if the file starts with the whole history byte
   for byte (its last segment and its first 64 KiB compared, as before effects existed),
   the place is the history's end; otherwise the match of step 2 runs from record 0.
2. Match the records after the place, in order, against the file's next bytes: a record
   equal to them is the file's (the place moves past both); an effect record that is not
   is agentcas's own and is skipped; anything else means the file was truncated,
   rewritten or edited, and the commit is refused by name before anything is stored.
   These are the records appended since the last commit, usually a few effects.
3. The complete lines after the place are prepared as segments against the head read
   here; the commit's plan refuses to land if the history moved meanwhile.
So effects and a growing rollout file can be recorded in any order, forever, and the
effects stay in the history as evidence.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from agentcas.cas.objects import EMPTY_POSITION, HistoryPosition, RolloutFile
from agentcas.cas.source import ObjectSource
from agentcas.cas.writer import BatchWriter
from agentcas.errors import UsageError
from agentcas.lineage import rollout
from agentcas.lineage.effects import parse_record
from agentcas.refs.threads import ThreadState

COMPARED_HEAD_BYTES = 65536
_COUNT_BLOCK = 1 << 20


@dataclass(frozen=True)
class PreparedTail:
    """The new lines of a rollout file, prepared as segments, and where they go."""

    segments: list            # rollout.PreparedSegment of the new complete lines
    based_on: HistoryPosition  # the thread's history head they continue
    offset: int               # the file's bytes already in that history (its place)
    seq: int                  # the history position just after the file's last record there
    new_bytes: int            # bytes of the new complete lines

    def rollout_file(self, head: HistoryPosition, path: str | None) -> RolloutFile:
        """The checkpoint's RolloutFile once the new lines landed, ending history `head`."""
        if self.new_bytes:
            return RolloutFile(self.offset + self.new_bytes, head.seq, path)
        return RolloutFile(self.offset, self.seq, path)


def prepare_tail(objects: ObjectSource, writer: BatchWriter, thread: str, state: ThreadState | None,
                 path: str, mark: RolloutFile | None = None) -> PreparedTail:
    """The new complete lines of `path` prepared against the thread's head; `mark` is the
    head checkpoint's RolloutFile, if it has one."""
    head = EMPTY_POSITION if state is None else state.history
    history = rollout.History(objects)
    try:
        handle = open(path, "rb")
    except OSError as exc:
        raise UsageError(f"cannot read rollout file {path}: {exc.strerror}") from None
    with handle:
        file = _File(handle, path, thread)
        if mark is not None and mark.seq <= head.seq:
            offset, seq = mark.offset, mark.seq
            if file.size < offset:
                raise file.shorter(offset)
            if seq:
                _, last_segment, last_cut = history.locate(head, seq - 1)
                last = list(_records([history.segment_bytes(last_segment, last_cut)]))
                _match_backwards(file, last[:seq - last_segment.base.seq], offset)
                _, first_segment, first_cut = history.locate(head, 0)
                first = history.segment_bytes(first_segment, first_cut)
                _match(file, _records([first]), 0, 0, stop_at=min(offset, COMPARED_HEAD_BYTES), last_seq=seq)
        elif file.size >= head.offset and (not head.seq or _starts_with_history(handle, history, head)):
            offset, seq = head.offset, head.seq
        else:
            offset, seq = 0, 0
        if seq < head.seq:
            offset, seq = _match(file, _records(history.read(head, seq, head.seq)), offset, seq)
        handle.seek(offset)
        tail = handle.read()
        cut = tail.rfind(b"\n") + 1
        try:
            prepared = rollout.prepare(tail[:cut], writer.add)
        except rollout.BadRecord as exc:
            raise rollout.BadRecord(f"rollout file {path} line {exc.line + file.lines_before(offset)}: "
                                    f"{exc.detail}; nothing was committed", exc.line, exc.detail) from None
    writer.flush()
    return PreparedTail(prepared, head, offset, seq, cut)


class _File:
    """The rollout file being committed, with its errors."""

    def __init__(self, handle, path: str, thread: str):
        self.handle, self.path, self.thread = handle, path, thread
        self.size = os.fstat(handle.fileno()).st_size

    def read_at(self, offset: int, length: int) -> bytes:
        self.handle.seek(offset)
        return self.handle.read(length)

    def lines_before(self, offset: int) -> int:
        """Newlines in the file's first `offset` bytes (only to name a bad line)."""
        self.handle.seek(0)
        count, left = 0, offset
        while left:
            block = self.handle.read(min(left, _COUNT_BLOCK))
            if not block:
                break
            count += block.count(b"\n")
            left -= len(block)
        return count

    def shorter(self, stored: int) -> rollout.RolloutMismatch:
        return rollout.RolloutMismatch(
            f"rollout file {self.path} is shorter ({self.size} bytes) than the {stored} bytes "
            f"already stored for thread {self.thread!r}: it was truncated or rewritten; nothing was committed")

    def differs(self) -> rollout.RolloutMismatch:
        return rollout.RolloutMismatch(
            f"rollout file {self.path} differs from the history already stored for thread "
            f"{self.thread!r} (it was rewritten or edited); nothing was committed")


def _records(pieces):
    """Each record (a newline-terminated line) of an iterable of whole-record pieces."""
    for piece in pieces:
        for start, stop in rollout.split_lines(piece):
            yield bytes(piece[start:stop])


def _match(file: _File, records, offset: int, seq: int, stop_at: int | None = None,
           last_seq: int | None = None) -> tuple[int, int]:
    """Step 2: `records` are the history's from `seq` on, the file read from `offset`;
    return the place after the file's last record among them, or raise RolloutMismatch
    where they part. `stop_at`: stop once the file's first `stop_at` bytes are matched;
    `last_seq`: stop at that record (both for the bounded check of the file's start)."""
    place = (offset, seq)
    for record in records:
        if (stop_at is not None and offset >= stop_at) or (last_seq is not None and seq >= last_seq):
            break
        seq += 1
        found = file.read_at(offset, len(record))
        if found == record:
            offset += len(record)
            place = (offset, seq)
        elif parse_record(record) is None:  # not agentcas's own record: the file is not the history's
            raise file.shorter(offset + len(record)) if record.startswith(found) else file.differs()
    return place


def _match_backwards(file: _File, records: list, offset: int) -> None:
    """Check that the file's bytes before `offset` end with `records` (effect records not
    there skipped, as in `_match`); raise RolloutMismatch where they part."""
    for record in reversed(records):
        if offset >= len(record) and file.read_at(offset - len(record), len(record)) == record:
            offset -= len(record)
        elif parse_record(record) is None:
            raise file.differs()


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


def workspace_path(rollout_file: str, workspace: str) -> str | None:
    """`rollout_file`'s path relative to `workspace`, "/"-separated, if it lies inside it
    (and is a name a tree could hold); else None."""
    from agentcas.cas.objects import InvalidObject
    relative = os.path.relpath(os.path.realpath(rollout_file), os.path.realpath(workspace))
    if relative == os.curdir or relative.startswith(os.pardir + os.sep) or relative == os.pardir \
            or os.path.isabs(relative):
        return None
    relative = relative.replace(os.sep, "/")
    try:
        RolloutFile(0, 0, relative)
    except InvalidObject:
        return None
    return relative


def rollout_file_pieces(objects: ObjectSource, history: HistoryPosition, mark: RolloutFile):
    """The bytes of the rollout file as it was at a checkpoint with RolloutFile `mark`:
    the history's first `mark.seq` records without the effect records agentcas added
    (a file holds none; a commit of it matches them as agentcas's own, step 2)."""
    if not mark.seq:
        return
    for record in _records(rollout.History(objects).read(history, 0, mark.seq)):
        if parse_record(record) is None:
            yield record
