"""Appending raw lines with checkpoints at marks: how harness sessions land.

A harness log (Codex, Claude Code) is stored byte for byte as the thread's rollout, and
each turn boundary becomes a checkpoint whose tree is empty (a session has no
workspace) and whose HistoryPosition is the prefix up to and including the boundary
record. The positions are computed from the prepared record hashes while the segments
are linked (rollout.link_segments_at), so a whole file's new lines and all its
checkpoints are one move of the thread (lineage/moves.py): planned against the state
read, re-planned if that state was stale, a conflict if the thread is no longer where
the ingest state said it was (`based_on`). A batch of files is one `move_threads`: one
object write and one metadata transaction for all of them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from agentcas.cas import framing
from agentcas.cas.backends import Backends
from agentcas.cas.digest import Digest
from agentcas.cas.leases import Lease
from agentcas.cas.objects import EMPTY_POSITION, CheckpointSeries, HistoryPosition, Tree
from agentcas.cas.writer import BatchWriter
from agentcas.errors import ConflictError
from agentcas.lineage import checkpoints, rollout
from agentcas.lineage.moves import Move, move_thread, move_threads
from agentcas.refs.revisions import load_checkpoint
from agentcas.refs.threads import ForkOrigin, ThreadState
from agentcas.result import Result

EMPTY_TREE = Tree.of([])
# A turn's checkpoint (~470 bytes, 42,000 in the 1 GB ingest of bench_harnesses.py) is stored
# raw. zstd kept 6.5% of its bytes off disk (1.3 MB a GB ingested, 0.6% of the store) for
# ~4 µs, but each compress releases the GIL, and with the reader threads wanting it that was a
# thread switch per checkpoint: raw, the ingest's context switches fell from 34-45k to 24-25k,
# its parent's CPU by 0.3-0.5 s and its wall by 0.15-0.5 s in each of 4 alternating pairs.


@dataclass(frozen=True)
class IngestedThread(Result):
    """One thread's part of an ingest landing: the records appended and the checkpoints made."""

    thread: str
    appended: int
    first_seq: int
    checkpoints: list[str]   # ids of the checkpoints made at the marks, oldest first
    history: HistoryPosition


@dataclass(frozen=True)
class SessionAppend:
    """One thread's part of `store.history.ingest`: new complete lines and where to checkpoint."""

    thread: str
    data: bytes
    marks: tuple[tuple[int, str], ...] = ()
    based_on: HistoryPosition | None = None
    forked_from: ForkOrigin | None = None
    # `data` prepared ahead (rollout.pack_raw_lines at framing.INGEST_ZSTD, chained from
    # `based_on`'s digest at these marks), e.g. in an ingest worker; `data` may then be empty.
    packed: rollout.PackedLines | None = None
    # Lines of `data` that copy another history's records (a Codex fork's copy of its
    # parent): those that are copies are stored as copies (rollout.prepare_with_copies),
    # `packed` is then not used.
    copies: rollout.CopyClaim | None = None


def ingest_sessions(backends: Backends, history: rollout.History, appends: list[SessionAppend],
                    author: str | None = None) -> list[IngestedThread]:
    """`store.history.ingest`: each append's lines stored raw (prepared ahead, or copies as
    copies), then all threads landed together with their checkpoints (`append_many_with_marks`)."""
    from agentcas.cas.store_format import utc_now
    from agentcas.refs.names import check_thread_name
    for item in appends:   # reasons are checked by Checkpoint itself, in the plan
        check_thread_name(item.thread)
    who, created_at, runtime = author or checkpoints.default_author(), utc_now(), checkpoints.runtime_description()
    with Lease(backends.meta, "ingest") as lease:
        writer = BatchWriter(backends.source, lease=lease)
        prepared = prepare_raw([b"" if item.copies is not None else item.data if item.packed is None
                                else item.packed for item in appends], writer, framing.INGEST_ZSTD)
        for number, item in enumerate(appends):
            if item.copies is not None:
                prepared[number] = rollout.prepare_with_copies(history, item.data, item.copies, writer.add,
                                                               framing.INGEST_ZSTD)
        writer.flush()
        return append_many_with_marks(
            backends, lease, [(item.thread, segments, item.marks, item.based_on, item.forked_from)
                              for item, segments in zip(appends, prepared)], who, created_at, runtime)


def prepare_raw(datas: list, writer: BatchWriter, level: int | framing.SmallTables) -> list[list]:
    """Prepared segments of each data's complete lines (stored raw), chunks into `writer`.

    An item of `datas` is bytes, or a rollout.PackedLines prepared ahead (its objects are
    only written here)."""
    lock = threading.Lock()

    def add(digest, framed):
        with lock:
            writer.add(digest, framed)

    def prepare(data):
        return rollout.prepare(data, add, raw_lines=True, level=level) if data else []

    raw = [data for data in datas if not isinstance(data, rollout.PackedLines)]
    # zstd and BLAKE3 release the GIL: many small session files pack on two threads.
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(2 if len(raw) > 1 else 1) as pool:
        done = iter(list(pool.map(prepare, raw)))
    prepared = []
    for data in datas:
        if isinstance(data, rollout.PackedLines):
            for digest, framed in data.objects:
                writer.add(digest, framed)
            prepared.append(data.segments)
        else:
            prepared.append(next(done))
    writer.flush()
    return prepared


def append_with_marks(backends: Backends, lease: Lease, thread: str, segments: list, marks,
                      based_on: HistoryPosition | None, forked_from: ForkOrigin | None,
                      who: str, created_at: str, runtime: dict, tree: Digest | None = None,
                      needed: frozenset = frozenset()) -> IngestedThread:
    """Land `segments` on `thread` with a checkpoint at each (records, reason) mark.

    `tree`: the checkpoints' tree, already stored (a workspace snapshot: the harness hooks),
    instead of the empty tree; `needed`: the stored objects it relies on (checked before
    the move lands, as a commit checks its snapshot's)."""
    plan = marks_plan(backends, thread, segments, marks, based_on, forked_from, who, created_at, runtime,
                      tree, needed)
    state, move = move_thread(backends, lease, thread, plan, keep_lease=True)
    return _landed(thread, state, move)


def append_many_with_marks(backends: Backends, lease: Lease, items: list, who: str, created_at: str,
                           runtime: dict) -> list[IngestedThread]:
    """`append_with_marks` of several threads, landing in one move (lineage/moves.move_threads).

    `items`: (thread, segments, marks, based_on, forked_from). All land or none; a thread
    no longer at its `based_on` raises ConflictError for the batch.
    """
    plans = [(thread, marks_plan(backends, thread, segments, marks, based_on, forked_from, who, created_at,
                                 runtime))
             for thread, segments, marks, based_on, forked_from in items]
    landed = move_threads(backends, lease, plans, keep_lease=True)
    return [_landed(thread, state, move) for (thread, _), (state, move) in zip(plans, landed)]


@dataclass(frozen=True)
class ForkLines:
    """A session's first lines when it forks another thread (a Codex fork): the lines, the
    thread's fork origin, and the claim of the lines that copy the origin's records
    (rollout.CopyClaim, or None), stored as copies as ingest stores them."""

    data: bytes
    origin: ForkOrigin
    copies: rollout.CopyClaim | None = None


def prepare_lines(backends: Backends, lease: Lease, lines: bytes | ForkLines) -> tuple[bytes, ForkOrigin | None, list]:
    """(the lines, the fork origin or None, their prepared segments) of a session's new
    lines, stored raw (copies as copies), their chunks written under `lease`."""
    writer = BatchWriter(backends.source, lease=lease)
    if isinstance(lines, ForkLines) and lines.copies is not None:
        segments = rollout.prepare_with_copies(rollout.History(backends.source), lines.data, lines.copies,
                                               writer.add, framing.INGEST_ZSTD)
        writer.flush()
    else:
        data = lines.data if isinstance(lines, ForkLines) else lines
        segments = prepare_raw([data], writer, framing.INGEST_ZSTD)[0]
    if isinstance(lines, ForkLines):
        return lines.data, lines.origin, segments
    return lines, None, segments


def _landed(thread: str, state, move) -> IngestedThread:
    if move is None:
        base = EMPTY_POSITION if state is None else state.history
        return IngestedThread(thread, 0, base.seq, [], base)
    return move.result


def marks_plan(backends: Backends, thread: str, segments: list, marks, based_on: HistoryPosition | None,
               forked_from: ForkOrigin | None, who: str, created_at: str, runtime: dict,
               tree: Digest | None = None, needed: frozenset = frozenset()) -> Callable[[ThreadState | None],
                                                                                         Move | None]:
    """The move plan of `append_with_marks` (see there)."""
    tree_id = EMPTY_TREE.digest() if tree is None else tree

    def plan(state: ThreadState | None) -> Move | None:
        if (None if state is None else state.history) != based_on:
            raise ConflictError(f"thread {thread!r} moved while its session file was read; "
                                "nothing was ingested, retry")
        base = EMPTY_POSITION if state is None else state.history
        head, new_objects, positions = rollout.link_segments_at(backends.source, base, segments,
                                                                [m for m, _ in marks])
        current = None if state is None else state.checkpoint
        made: list = []
        indexed: dict = {}        # raw id -> _Indexed, of the checkpoints made here
        by_generation: dict = {}  # generation -> id, of the checkpoints made here (one first-parent chain)

        def load(digest: Digest):  # one made here is not stored yet: its index, else the stored one
            return indexed.get(digest.raw) or load_checkpoint(backends.source, digest)

        def index(parent: Digest | None) -> tuple[int, Digest | None]:
            """checkpoints.index_for_child, without its skip-list walk when the skip target
            was made here: the checkpoints made here follow one another, so the one at
            generation skip_index(g) is the target (the walk was 0.5 of the 2.7 s that
            cProfile gave planning the 42,000 turn checkpoints of the 1 GB bench)."""
            made_here = indexed.get(parent.raw) if parent is not None else None
            if made_here is not None and made_here.generation:
                generation = made_here.generation + 1
                skip = by_generation.get(rollout.skip_index(generation))
                if skip is not None:
                    return generation, skip
            return checkpoints.index_for_child(backends.source, parent, load)
        if positions and tree is None:
            new_objects[tree_id.raw] = framing.frame(framing.KIND_TREE, EMPTY_TREE.encode())
        if positions:
            series = CheckpointSeries(tree_id, thread, who, created_at, runtime)
        for position, (_, reason) in zip(positions, marks):
            generation, skip = index(current)
            parents = (current,) if current else ()
            body, current = series.encode_with_id(parents, reason, position, generation, skip)
            indexed[current.raw] = _Indexed(parents, generation, skip)
            by_generation[generation] = current
            new_objects[current.raw] = framing.frame(framing.KIND_CHECKPOINT, body, compress=False)
            made.append(current.hex())
        result = IngestedThread(thread, head.seq - base.seq, base.seq, made, head)
        if state is not None and head == base and not made:
            return None  # nothing new: no ref move
        origin = forked_from if state is None else state.forked_from
        return Move(ThreadState(current, head, origin), "ingest",
                    f"ingest {head.seq - base.seq} records, {len(made)} checkpoints", new_objects,
                    set(needed), result=result)

    return plan


@dataclass(frozen=True)
class _Indexed:
    """What indexing a child reads of a checkpoint just made (checkpoints.index_for_child
    reads these fields of a Checkpoint)."""

    parents: tuple
    generation: int
    skip: Digest | None
