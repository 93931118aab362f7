"""Branch, delete, fork and revert: the plans of the thread moves a user names.

Each is one ref move by lineage/moves.py (plan against the thread's state, store what
is new, compare-and-swap with its reflog row; a lost race plans again). None of them
writes an object: a branch, fork or revert points at objects already stored, and the
move checks they still are before it lands (a concurrent gc may have taken them).

- branch: a new thread at a checkpoint, with that checkpoint's history (or, for
  THREAD@{N}, the whole history that reflog entry recorded).
- fork: a new thread sharing the first `at` records of a history, at the newest
  checkpoint at or before the cut; it records where it came from (ForkOrigin).
- revert: the thread moves to a checkpoint (its history with it); the old head stays in
  the reflog. `related` says whether the target is in the thread's ancestry or fork
  family (a revert to an unrelated thread's checkpoint is allowed, and said).
"""

from __future__ import annotations

from agentcas.cas.backends import Backends
from agentcas.cas.digest import Digest
from agentcas.cas.objects import HistoryPosition
from agentcas.errors import ConflictError, NotFound, UsageError
from agentcas.lineage import checkpoints, rollout
from agentcas.lineage.moves import Move, lease_for, move_thread
from agentcas.refs import revisions
from agentcas.refs.names import check_thread_name
from agentcas.refs.threads import ForkOrigin, ThreadState


def _state_objects(checkpoint: Digest | None, history: HistoryPosition) -> set[bytes]:
    """The objects a thread state points at directly (its checkpoint and head segment)."""
    return {d.raw for d in (checkpoint, history.segment) if d is not None}


def _move(backends: Backends, thread: str, what: str, plan):
    with lease_for(backends, what, thread) as lease:
        return move_thread(backends, lease, thread, plan)


def branch_thread(backends: Backends, name: str, rev: str | None) -> Digest:
    """Make thread `name` at checkpoint `rev` (default: main's head); the checkpoint's id."""
    check_thread_name(name)
    source = backends.source

    def plan(state):
        if state is not None:
            raise ConflictError(f"thread {name!r} already exists")
        with backends.meta.reader() as txn:
            digest = revisions.resolve(txn, source, rev or "main")
            entry = revisions.reflog_state(txn, source, rev)  # THREAD@{N}: with records appended after its checkpoint
        cp = revisions.load_checkpoint(source, digest)
        history = entry.history if entry is not None and entry.checkpoint == digest else cp.history
        return Move(ThreadState(digest, history), "branch", f"branch from {rev or 'main'}",
                    needed=_state_objects(digest, history), result=digest)

    _, move = _move(backends, name, f"branch {name}", plan)
    return move.result


def delete_thread(backends: Backends, name: str) -> ThreadState:
    """Delete thread `name` and its reflog; the state it had."""
    check_thread_name(name)

    def plan(state):
        if state is None:
            raise NotFound(f"no thread named {name!r}")
        return Move(None, "delete")

    state, _ = _move(backends, name, f"delete {name}", plan)
    return state


def fork_state(objects, history: rollout.History, head: HistoryPosition, tip: Digest | None, origin: str,
               source: str, at: int | None) -> tuple[ThreadState, str]:
    """(state, reflog message) of a new thread sharing the first `at` records (all if None) of
    the history at `head`, whose newest checkpoint is `tip`, of thread `origin` (`source` as
    the user named it): at the newest checkpoint at or before the cut, its origin recorded."""
    position = history.position(head, head.seq if at is None else at)
    checkpoint = checkpoints.newest_at_or_before(objects, tip, position.seq)
    return (ThreadState(checkpoint, position, ForkOrigin(origin, checkpoint, position.seq)),
            f"fork of {source} at {position.seq}")


def fork_thread(backends: Backends, history: rollout.History, source: str, name: str,
                at: int | None) -> ThreadState:
    """Make thread `name` sharing the first `at` records (default: all) of `source`'s history."""
    check_thread_name(name)
    if at is not None and at < 0:
        raise UsageError(f"--at must not be negative: {at}")
    objects = backends.source

    def plan(state):
        with backends.meta.reader() as txn:
            head, tip, origin = revisions.source_state(txn, objects, source)
        if at is not None and at > head.seq:
            raise UsageError(f"--at {at} is beyond the end of the history of {source!r} "
                             f"({head.seq} records)")
        if state is not None:
            raise ConflictError(f"thread {name!r} already exists")
        new, message = fork_state(objects, history, head, tip, origin, source, at)
        return Move(new, "fork", message, needed=_state_objects(new.checkpoint, new.history), result=new)

    _, move = _move(backends, name, f"fork {name}", plan)
    return move.result


def revert_thread(backends: Backends, thread: str, rev: str,
                  expect: str | None) -> tuple[ThreadState, ThreadState, bool]:
    """Move `thread` to checkpoint `rev` (only if at `expect`, when given): (old state, new state, related)."""
    check_thread_name(thread)
    objects = backends.source

    def plan(state):
        if state is None:
            raise NotFound(f"no thread named {thread!r}")
        with backends.meta.reader() as txn:
            if expect is not None:
                expected = revisions.resolve(txn, objects, expect)
                if state.checkpoint != expected:
                    raise ConflictError(f"thread {thread!r} is not at {expect!r}; nothing was changed")
            target = revisions.resolve(txn, objects, rev)
            cp = revisions.load_checkpoint(objects, target)
            related = (cp.thread == thread or revisions.is_ancestor(objects, target, state.checkpoint)
                       or bool(revisions.fork_ancestry(txn, thread) & revisions.fork_ancestry(txn, cp.thread)))
            entry = revisions.reflog_state(txn, objects, rev)
        history = entry.history if entry is not None and entry.checkpoint == target else cp.history
        new = ThreadState(target, history, state.forked_from)
        return Move(new, "revert", f"revert to {rev}", needed=_state_objects(target, history),
                    result=(new, related))

    old, move = _move(backends, thread, f"revert {thread}", plan)
    new, related = move.result
    return old, new, related
