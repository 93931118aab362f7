"""Thread moves: commit, append, branch, fork, revert, delete, all of one shape.

A move never needs one transaction spanning objects and refs:
1. Under a lease (cas/leases.py), read the thread's state from a metadata snapshot
   and plan the move against it: the new state, the new objects it needs (segments,
   the checkpoint), and the existing objects it relies on.
2. Store the new objects (idempotent, create-if-absent), then check that every
   object relied on is still stored (a batched existence question).
3. One metadata transaction: the lease still holds, the thread is still at the state
   read in 1 (compare-and-swap), move it with its reflog row, release the lease.
A race lost in 3 re-plans from 1, so a move defined against the head (an append, a
commit without --expect) lands on whatever the head became, while a move that named
what it expected (--expect, a rollout file's stored prefix, "must not exist") raises
a conflict from its plan. Objects stored by a lost attempt are unreferenced; gc
collects them after the grace period.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from agentcas.cas.backends import Stores
from agentcas.cas.leases import Lease
from agentcas.cas.metastore.base import Read
from agentcas.errors import ConflictError, IntegrityError
from agentcas.refs import threads
from agentcas.refs.threads import ThreadState

MAX_ATTEMPTS = 32


class VanishedObject(IntegrityError):
    """An object a move relied on was deleted before it landed (a concurrent gc)."""


@dataclass
class Move:
    """What a move will do to one thread, planned against its state."""

    new: ThreadState | None
    action: str
    message: str = ""
    objects: dict = field(default_factory=dict)   # {raw id: framed value} to store first
    needed: set = field(default_factory=set)      # raw ids of stored objects it relies on
    result: object = None
    history_implied: bool = False  # new.history is new.checkpoint's own (the reflog row omits it)


def read_state(stores: Stores, thread: str) -> ThreadState | None:
    return threads.read_base(stores.meta, thread).state


def lease_for(stores: Stores, what: str, thread: str) -> Lease:
    """A lease that also fetches `thread` for the move it will make (one request)."""
    return Lease(stores.meta, what, reads=threads.base_reads(thread))


def move_thread(stores: Stores, lease: Lease, thread: str,
                plan: Callable[[ThreadState | None], Move | None],
                keep_lease: bool = False) -> tuple[ThreadState | None, Move | None]:
    """Plan against the current state, store, check, compare-and-swap; re-plan on a lost race.

    `plan` returns None when there is nothing to do (no ref move), or raises to refuse.
    The lease is released with the move unless `keep_lease` (a writer moving several
    threads under one lease releases it when done). Returns (the state the move started
    from, the move landed or None).

    The last step is one metadata exchange: it lands only if the lease row, the ref row
    and the next reflog entry are as read (a deletion, which clears the reflog, is one
    transaction instead). A lease from `lease_for(..., thread)` brings the first state.
    """
    base = None
    if lease.prefetched is not None and lease.reads == threads.base_reads(thread):
        base = threads.decode_base(thread, lease.prefetched)
        lease.prefetched = None
    for _ in range(MAX_ATTEMPTS):
        prefetched, base = base is not None, base or threads.read_base(stores.meta, thread)
        try:
            move = plan(base.state)
        except ConflictError:
            if prefetched:  # judged on the state as the lease found it: judge the current one
                base = None
                continue
            raise
        if move is None:
            return base.state, None
        stores.objects.put_many(move.objects)
        missing = stores.objects.missing(move.needed)
        if missing:
            nothing = "nothing was committed" if move.action == "commit" else "nothing was changed"
            raise VanishedObject(f"object {sorted(missing)[0].hex()} vanished before the {move.action} "
                                 f"landed (concurrent gc?); {nothing}, retry")
        if _land(stores, lease, base, move, keep_lease):
            return base.state, move
        base = None
    raise ConflictError(f"thread {thread!r} kept moving under {MAX_ATTEMPTS} attempts; "
                        "nothing was changed, retry")


def _land(stores: Stores, lease: Lease, base: threads.MoveBase, move: Move, keep_lease: bool) -> bool:
    """The move's final step; False if the thread moved since `base` was read."""
    if move.new is None:
        def final(txn):
            lease.check(txn)
            if not threads.set_if_equals(txn, base.name, base.state, None, move.action, move.message):
                return False
            if not keep_lease:
                lease.release(txn)
            return True
        return stores.meta.write(final)
    lease.check_clock()
    expect, writes = threads.move_rows(base, move.new, move.action, move.message, move.history_implied)
    expect.append(lease.expect())
    if not keep_lease:
        writes.append(("leases", lease.key, None))
    applied, (held,) = stores.meta.exchange(reads=[Read("leases", lease.key)], expect=expect, writes=writes)
    if not applied and held != lease.value:
        lease.raise_expired()
    if applied and not keep_lease:
        lease.released = True
    return applied
