"""Ref moves: every change of threads goes through one engine, `Mover`.

A move never needs one transaction spanning objects and refs:
1. Under a lease (cas/leases.py), an attempt reads the refs it moves from a metadata
   snapshot and plans against them: a `Landing` (the compare-and-swaps, the new objects
   they need, the stored objects they rely on, the other refs they read).
2. Store the new objects (idempotent, create-if-absent), then check that every object
   relied on is still stored (a batched existence question). A shared store may instead
   upload them and hand back the index rows that make them stored (`stage_many`: its
   packs, cas/blobstore/s3_packs.py), which step 3 writes with the refs: a step is then
   one upload and no extra request.
3. One metadata exchange or transaction: the lease still holds, every ref is still at
   the state read in 1 (compare-and-swap), each moves with its reflog row, the lease is
   released (unless the writer keeps it for further moves).
A race lost in 3 (`LostRace`) plans again from 1, so a move defined against the head (an
append, a commit without --expect) lands on whatever the head became, while a move that
named what it expected (--expect, a rollout file's stored prefix, "must not exist")
raises a conflict from its plan. Objects stored by a lost attempt are unreferenced; gc
collects them after the grace period.

Three ways in, one loop: `move_thread` (one thread, one `Move`; its landing is a single
exchange that also reads the thread back, so a lost race re-plans with no extra
request, and a lease from `lease_for` brings the first state), `move_threads` (several
threads' `Move`s in one transaction, all or none: a batch of N harness sessions costs
two durable writes, not 2N), and lineage/group_moves.py's `GroupWriter` (a plan over a
view of many refs, the LangGraph saver's writes).

On an embedded store (objects and refs in one environment) a `Mover` may go without a
lease: with a `SweepWatch` (cas/leases.py) step 2 and 3 are one transaction that stores
the objects, checks what else the plan relies on and that no gc sweep began meanwhile,
and moves the refs. A sweep that did begin makes the writer take a lease and plan again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

from agentcas import testing_hooks
from agentcas.cas.backends import Backends
from agentcas.cas.digest import Digest
from agentcas.cas.leases import Lease, SweepWatch, SweptMeanwhile
from agentcas.cas.metastore.base import Read
from agentcas.cas.store import has_object, save_object
from agentcas.errors import ConflictError, IntegrityError
from agentcas.refs import threads
from agentcas.refs.threads import ThreadState

MAX_ATTEMPTS = 32


class VanishedObject(IntegrityError):
    """An object a move relied on was deleted before it landed (a concurrent gc)."""


class LostRace(Exception):
    """A ref a move read or moves changed before it landed: abandon the landing, plan again.

    The engine's one retry signal, raised by a landing or by a plan that saw a state it
    cannot build on; never seen by a caller: after MAX_ATTEMPTS lost races the move raises
    ConflictError. `now`: the ref as the landing found it, when it read it (the next plan
    starts from there without another request).
    """

    def __init__(self, name: str, now: threads.MoveBase | None = None):
        super().__init__(name)
        self.now = now


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


# (name, old state, new state or None to delete, action, message, history_implied)
RefMove = tuple[str, "ThreadState | None", "ThreadState | None", str, str, bool]


@dataclass
class Landing:
    """One attempt's plan, as the engine lands it."""

    moves: list[RefMove]                # compare-and-swaps in order (may be empty: objects only)
    objects: dict[bytes, bytes]         # {raw id: framed value}: new objects, stored before any ref moves
    needed: set[bytes]                  # raw ids of stored objects the moves rely on
    action: str                         # names the write in errors ("commit", "write", ...)
    unchanged: dict[str, ThreadState | None] = field(default_factory=dict)  # refs read: still so at landing
    base: threads.MoveBase | None = None  # one move's rows as read: land it in one exchange
    result: object = None               # the planner's, handed back by `Mover.run`


class Mover:
    """A writer's engine: plan, store, land; plan again after a lost race.

    `lease` is the writer's (released by the landing unless `keep_lease`); `watch`, on an
    embedded store, lets the writer go without one (see the module doc) until a sweep
    begins."""

    def __init__(self, backends: Backends, lease: Lease, keep_lease: bool = False, watch: SweepWatch | None = None):
        self.backends = backends
        self.lease = lease
        self.keep_lease = keep_lease
        self.watch = watch

    def run(self, attempt: Callable[[LostRace | None], Landing | None], what: str,
            point: str | None = None) -> Landing | None:
        """Land `attempt(the last lost race or None)`'s Landing; None from it: nothing to
        store or move. Returns the Landing that landed (or None). `what` names the refs in
        the conflict after MAX_ATTEMPTS; `point` is the testing hook reached before landing."""
        lost: LostRace | None = None
        for _ in range(MAX_ATTEMPTS):
            try:
                landing = attempt(lost)
                if landing is None:
                    return None
                self._land(landing, point)
            except LostRace as race:
                lost = race
                continue
            except SweptMeanwhile:
                self.watch, lost = None, None  # a gc swept meanwhile: plan again under a lease
                self.hold_lease()
                continue
            return landing
        raise ConflictError(f"{what} kept moving under {MAX_ATTEMPTS} attempts; nothing was changed, retry")

    def hold_lease(self) -> None:
        """Take the lease now if going without one (the watch, if any, stays: what was
        looked at before the lease still needs that no sweep began since)."""
        if self.lease.row is None:
            self.lease.acquire()

    def _land(self, landing: Landing, point: str | None) -> None:
        """Steps 2 and 3: LostRace if a ref moved, SweptMeanwhile if a leaseless writer met a sweep."""
        if self.watch is not None:
            if point is not None:
                testing_hooks.reached(point)
            self.backends.meta.write(partial(self._land_at_once, landing=landing))
            return
        self.lease.refresh()
        staged = store_objects(self.backends, landing.objects, landing.needed - landing.objects.keys(),
                               landing.action)
        if not landing.moves:
            if staged:
                self.backends.meta.exchange(writes=staged)
            return
        if point is not None:
            testing_hooks.reached(point)
        if landing.base is not None:
            self._exchange(landing, staged)
        else:
            self.backends.meta.write(partial(self._final, landing=landing, staged=staged))

    def _final(self, txn, landing: Landing, staged: list[tuple]) -> None:
        """The landing transaction of a leased writer (with the rows of its staged objects)."""
        self.lease.check(txn)
        move_refs(txn, landing)
        for table, key, value in staged:
            txn.put(table, key, value)
        if not self.keep_lease:
            self.lease.release(txn)

    def _land_at_once(self, txn, landing: Landing) -> None:
        """The whole landing in the environment's one write transaction (a SweepWatch writer)."""
        assert self.watch is not None  # only a SweepWatch writer lands in one transaction
        self.watch.check(txn)
        if self.lease.row is not None:
            self.lease.check(txn)
        missing = sorted(raw for raw in landing.needed - landing.objects.keys() if not has_object(txn, raw))
        if missing:
            raise VanishedObject(f"object {missing[0].hex()} is missing from the store; nothing was changed")
        for raw, framed in landing.objects.items():
            save_object(txn, Digest(raw), framed)
        move_refs(txn, landing)
        if self.lease.row is not None and not self.keep_lease:
            self.lease.release(txn)

    def _exchange(self, landing: Landing, staged: list[tuple]) -> None:
        """One move in one metadata exchange: it lands only if the lease row, the ref row
        and the next reflog entry are as read, and reads the thread back, so a move that
        lost a race plans again without another request."""
        base = landing.base
        assert base is not None and len(landing.moves) == 1 and not landing.unchanged
        name, _, new, action, message, implied = landing.moves[0]
        assert new is not None  # a deletion clears the reflog: a transaction (`_final`)
        self.lease.check_clock()
        expect, writes = threads.move_rows(base, new, action, message, implied)
        expect.append(self.lease.expect())
        writes += staged  # the new objects' index rows, if staged (a lost race stages them again)
        if not self.keep_lease:
            writes.append(("leases", self.lease.key, None))
        reads = [Read("leases", self.lease.key)] + threads.base_reads(name)
        applied, values = self.backends.meta.exchange(reads=reads, expect=expect, writes=writes)
        if applied:
            if not self.keep_lease:
                self.lease.released = True
            return
        if values[0] != self.lease.value:
            self.lease.raise_expired()
        raise LostRace(name, threads.decode_base(name, values[1:]))


def move_refs(txn, landing: Landing) -> None:
    """Inside a landing transaction: every ref the plan read is unchanged, then each move
    by compare-and-swap with its reflog row; LostRace, aborting the whole transaction, at
    the first ref that is not as planned."""
    for name, state in landing.unchanged.items():
        if threads.read_thread(txn, name) != state:
            raise LostRace(name)
    for name, old, new, action, message, implied in landing.moves:
        if not threads.set_if_equals(txn, name, old, new, action, message, implied):
            raise LostRace(name)


def store_objects(backends: Backends, objects: dict, needed: set, action: str) -> list[tuple]:
    """Step 2 of a move: store its new objects, then check that what it relies on is
    stored; VanishedObject (nothing moved) if a concurrent gc took any. Returns the
    metadata writes that make the new objects stored, for the landing to carry, where the
    store staged them (see the module doc; usually none: stored now)."""
    staged = backends.source.stage_many(objects)
    missing = backends.source.missing(needed)
    if missing:
        nothing = "nothing was committed" if action == "commit" else "nothing was changed"
        raise VanishedObject(f"object {sorted(missing)[0].hex()} vanished before the {action} "
                             f"landed (concurrent gc?); {nothing}, retry")
    return staged


def read_state(backends: Backends, thread: str, lease: Lease | None = None) -> ThreadState | None:
    """`thread`'s state: as a lease from `lease_for(..., thread)` found it (no request;
    `move_thread` checks it again when it lands), else read now."""
    if lease is not None and lease.prefetched is not None and lease.reads == threads.base_reads(thread):
        return threads.decode_base(thread, lease.prefetched).state
    return threads.read_base(backends.meta, thread).state


def lease_for(backends: Backends, what: str, thread: str) -> Lease:
    """A lease that also fetches `thread` for the move it will make (one request)."""
    return Lease(backends.meta, what, reads=threads.base_reads(thread))


def move_thread(backends: Backends, lease: Lease, thread: str,
                plan: Callable[[ThreadState | None], Move | None],
                keep_lease: bool = False) -> tuple[ThreadState | None, Move | None]:
    """Move one thread as `plan(its current state)` says; re-plan on a lost race.

    `plan` returns None when there is nothing to do (no ref move), or raises to refuse.
    The lease is released with the move unless `keep_lease` (a writer moving several
    threads under one lease releases it when done). Returns (the state the move started
    from, the move landed or None). A move lands in one metadata exchange (a deletion,
    which clears the reflog, in one transaction).
    """
    base: threads.MoveBase | None = None
    early = False  # base is the state as the lease found it, maybe since moved
    if lease.prefetched is not None and lease.reads == threads.base_reads(thread):
        base, early = threads.decode_base(thread, lease.prefetched), True
        lease.prefetched = None
    planned: Move | None = None

    def attempt(lost: LostRace | None) -> Landing | None:
        nonlocal base, early, planned
        if lost is not None:
            base, early = lost.now, False
        if base is None:
            base = threads.read_base(backends.meta, thread)
        try:
            planned = plan(base.state)
        except ConflictError:
            if early:  # judged on the state as the lease found it: judge the current one
                base, early = None, False
                raise LostRace(thread) from None
            raise
        early = False
        if planned is None:
            return None
        move = planned
        return Landing([(thread, base.state, move.new, move.action, move.message, move.history_implied)],
                       move.objects, move.needed, move.action, base=base if move.new is not None else None)

    Mover(backends, lease, keep_lease).run(attempt, f"thread {thread!r}")
    assert base is not None  # every attempt reads it
    return base.state, planned


def move_threads(backends: Backends, lease: Lease, plans: list, keep_lease: bool = False) -> list:
    """`move_thread` for several threads at once: [(thread, plan)] -> [(state read, move or None)].

    The threads' moves land in one metadata transaction or not at all; a lost race on any
    of them re-plans all. A plan that raises refuses the whole batch (a caller that wants
    the others to land retries them one by one).
    """
    names = [name for name, _ in plans]
    if len(set(names)) != len(names):
        twice = next(n for n in names if names.count(n) > 1)
        raise ConflictError(f"thread {twice!r} is moved twice in one batch; nothing was changed")
    outcome: list = []

    def attempt(lost: LostRace | None) -> Landing | None:
        nonlocal outcome
        with backends.meta.reader() as txn:
            states = [threads.read_thread(txn, name) for name in names]
        outcome = [(state, plan(state)) for (_, plan), state in zip(plans, states)]
        landing = [(name, state, move) for name, (state, move) in zip(names, outcome) if move is not None]
        if not landing:
            return None
        objects: dict[bytes, bytes] = {}
        needed: set[bytes] = set()
        for _, _, move in landing:
            objects.update(move.objects)
            needed |= move.needed
        return Landing([(name, state, move.new, move.action, move.message, move.history_implied)
                        for name, state, move in landing],
                       objects, needed, landing[0][2].action if len(landing) == 1 else "moves")

    shown = ", ".join(repr(n) for n in names[:3]) + (" ..." if len(names) > 3 else "")
    Mover(backends, lease, keep_lease).run(attempt, f"thread{'s' if len(names) > 1 else ''} {shown}")
    return outcome
