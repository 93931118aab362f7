"""Appending records to a thread's history: one ref move (lineage/moves.py) per append.

The records are chunked and stored under the writer's lease first; the move then links
them after whatever the thread's head is when it lands (an append is defined against
the head, so a lost race re-plans on the new head). A `guard(state)` run in each plan
makes the append conditional: it raises to refuse the move (the effects ledger uses it
for `effect add --id`). An empty append moves nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from agentcas.cas.backends import Backends
from agentcas.cas.objects import EMPTY_POSITION, HistoryPosition
from agentcas.cas.writer import BatchWriter
from agentcas.lineage import rollout
from agentcas.lineage.moves import Move, lease_for, move_thread
from agentcas.refs.names import check_thread_name
from agentcas.refs.threads import ThreadState
from agentcas.result import Result


@dataclass(frozen=True)
class AppendResult(Result):
    """Records appended to a thread's history."""

    thread: str
    appended: int
    first_seq: int
    history: HistoryPosition


def append_records(backends: Backends, thread: str, data: bytes,
                   guard: Callable[[ThreadState | None], None] | None = None) -> AppendResult:
    """Append JSONL records to `thread`'s history (creating the thread if new)."""
    check_thread_name(thread)
    with lease_for(backends, f"append {thread}", thread) as lease:
        writer = BatchWriter(backends.source, lease=lease)
        prepared = rollout.prepare(data, writer.add)
        writer.flush()

        def plan(state: ThreadState | None) -> Move | None:
            if guard is not None:
                guard(state)
            base = EMPTY_POSITION if state is None else state.history
            head, segments = rollout.link_segments(backends.source, base, prepared)
            if state is not None and head == base:  # nothing to append: no ref move
                return None
            new = ThreadState(None if state is None else state.checkpoint, head,
                              None if state is None else state.forked_from)
            return Move(new, "append", f"append {head.seq - base.seq} records", segments,
                        result=(base, head))

        state, move = move_thread(backends, lease, thread, plan)
    if move is None:
        assert state is not None  # no move only when the thread exists and nothing was new
        return AppendResult(thread, 0, state.history.seq, state.history)
    assert isinstance(move.result, tuple)
    base, head = move.result
    return AppendResult(thread, head.seq - base.seq, base.seq, head)
