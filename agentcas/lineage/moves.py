"""Thread moves: commit, append, branch, fork, revert, delete, all of one shape.

A move never needs one transaction spanning objects and refs:
1. Under a lease (cas/leases.py), read the thread's state from a metadata snapshot
   and plan the move against it: the new state, the new objects it needs (segments,
   the checkpoint), and the existing objects it relies on.
2. Store the new objects (idempotent, create-if-absent), then check that every
   object relied on is still stored (a batched existence question).
3. One metadata transaction: the lease still holds, the thread is still at the state
   read in 1 (compare-and-swap), move it with its reflog row, release the lease.
`move_threads` lands the moves of several threads the same way with one object write
and one metadata transaction (all or none: a lost compare-and-swap on any thread
abandons the transaction and every plan runs again), so a batch of N harness sessions
costs two durable writes, not 2N.
A race lost in 3 re-plans from 1, so a move defined against the head (an append, a
commit without --expect) lands on whatever the head became, while a move that named
what it expected (--expect, a rollout file's stored prefix, "must not exist") raises
a conflict from its plan. Objects stored by a lost attempt are unreferenced; gc
collects them after the grace period.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from agentcas.cas.backends import Stores
from agentcas.cas.leases import Lease
from agentcas.cas.metastore.base import Read
from agentcas.errors import ConflictError, IntegrityError
from agentcas.refs import threads
from agentcas.refs.threads import ThreadState

MAX_ATTEMPTS = 32


class VanishedObject(IntegrityError):
    """An object a move relied on was deleted before it landed (a concurrent gc)."""


class LostRace(Exception):
    """A ref a move read or moves changed before it landed: abandon the transaction, plan again.

    The one retry signal of both move engines (this module's and lineage/group_moves.py's);
    never seen by a caller: after MAX_ATTEMPTS lost races the move raises ConflictError.
    """


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


def read_state(stores: Stores, thread: str, lease: Lease | None = None) -> ThreadState | None:
    """`thread`'s state: as a lease from `lease_for(..., thread)` found it (no request;
    `move_thread` checks it again when it lands), else read now."""
    if lease is not None and lease.prefetched is not None and lease.reads == threads.base_reads(thread):
        return threads.decode_base(thread, lease.prefetched).state
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
    base, early = None, False  # early: the state as the lease found it, maybe since moved
    if lease.prefetched is not None and lease.reads == threads.base_reads(thread):
        base, early = threads.decode_base(thread, lease.prefetched), True
        lease.prefetched = None
    for _ in range(MAX_ATTEMPTS):
        if base is None:
            base = threads.read_base(stores.meta, thread)
        try:
            move = plan(base.state)
        except ConflictError:
            if early:  # judged on the state as the lease found it: judge the current one
                base, early = None, False
                continue
            raise
        early = False
        if move is None:
            return base.state, None
        staged = store_objects(stores, move.objects, move.needed, move.action, stage=True)
        landed, after = _land(stores, lease, base, move, keep_lease, staged)
        if landed:
            assert after is not None  # a landed move returns its base
            return after.state, move
        base = after
    raise ConflictError(f"thread {thread!r} kept moving under {MAX_ATTEMPTS} attempts; "
                        "nothing was changed, retry")


def store_objects(stores: Stores, objects: dict, needed: set, action: str, stage: bool = False) -> list[tuple]:
    """Step 2 of a move (of either engine): store its new objects, then check that what it
    relies on is stored; VanishedObject (nothing moved) if a concurrent gc took any. With
    `stage`, a store may instead return the metadata writes that make the new objects
    stored (a shared store's pack index), for the landing exchange to carry."""
    staged = stores.objects.stage_many(objects) if stage else []
    if not stage:
        stores.objects.put_many(objects)
    missing = stores.objects.missing(needed)
    if missing:
        nothing = "nothing was committed" if action == "commit" else "nothing was changed"
        raise VanishedObject(f"object {sorted(missing)[0].hex()} vanished before the {action} "
                             f"landed (concurrent gc?); {nothing}, retry")
    return staged


def _land(stores: Stores, lease: Lease, base: threads.MoveBase, move: Move,
          keep_lease: bool, staged: list[tuple]) -> tuple[bool, threads.MoveBase | None]:
    """The move's final step: (True, base) if it landed, else (False, the thread as it is
    now, or None to read it again). The landing reads the thread too, so a move that
    lost a race plans again without another request."""
    if move.new is None:
        def final(txn):
            lease.check(txn)
            if not threads.set_if_equals(txn, base.name, base.state, None, move.action, move.message):
                return False
            for table, key, value in staged:
                txn.put(table, key, value)
            if not keep_lease:
                lease.release(txn)
            return True
        return (True, base) if stores.meta.write(final) else (False, None)
    lease.check_clock()
    expect, writes = threads.move_rows(base, move.new, move.action, move.message, move.history_implied)
    expect.append(lease.expect())
    writes += staged  # the new objects' index rows, if the store staged them (lost race: written again)
    if not keep_lease:
        writes.append(("leases", lease.key, None))
    reads = [Read("leases", lease.key)] + threads.base_reads(base.name)
    applied, values = stores.meta.exchange(reads=reads, expect=expect, writes=writes)
    if applied:
        if not keep_lease:
            lease.released = True
        return True, base
    if values[0] != lease.value:
        lease.raise_expired()
    return False, threads.decode_base(base.name, values[1:])


def move_threads(stores: Stores, lease: Lease, plans: list, keep_lease: bool = False) -> list:
    """`move_thread` for several threads at once: [(thread, plan)] -> [(state read, move or None)].

    The threads' moves land in one metadata transaction or not at all; a lost race on any
    of them re-plans all. A plan that raises refuses the whole batch (a caller that wants
    the others to land retries them one by one).
    """
    names = [name for name, _ in plans]
    if len(set(names)) != len(names):
        twice = next(n for n in names if names.count(n) > 1)
        raise ConflictError(f"thread {twice!r} is moved twice in one batch; nothing was changed")
    for _ in range(MAX_ATTEMPTS):
        with stores.meta.reader() as txn:
            states = [threads.read_thread(txn, name) for name in names]
        moves = [plan(state) for (_, plan), state in zip(plans, states)]
        landing = [move for move in moves if move is not None]
        if not landing:
            return list(zip(states, moves))
        objects, needed = {}, set()
        for move in landing:
            objects.update(move.objects)
            needed |= move.needed
        store_objects(stores, objects, needed, landing[0].action if len(landing) == 1 else "moves")

        def final(txn, states=states, moves=moves):
            lease.check(txn)
            land_moves(txn, [(name, state, move.new, move.action, move.message, move.history_implied)
                             for name, state, move in zip(names, states, moves) if move is not None])
            if not keep_lease:
                lease.release(txn)

        try:
            stores.meta.write(final)
        except LostRace:
            continue
        return list(zip(states, moves))
    shown = ", ".join(repr(n) for n in names[:3]) + (" ..." if len(names) > 3 else "")
    raise ConflictError(f"thread{'s' if len(names) > 1 else ''} {shown} kept moving under {MAX_ATTEMPTS} "
                        "attempts; nothing was changed, retry")


def land_moves(txn, moves) -> None:
    """Inside a landing transaction (of either engine): each (name, old, new, action, message,
    history_implied) by compare-and-swap with its reflog row; LostRace, aborting the whole
    transaction, at the first ref no longer at `old`."""
    for name, old, new, action, message, implied in moves:
        if not threads.set_if_equals(txn, name, old, new, action, message, implied):
            raise LostRace(name)
