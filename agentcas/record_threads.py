"""Record threads: agentcas threads used as lists of JSON records (the session adapters' store).

The Agents SDK session (agentcas/openai_agents) and the ADK session service (agentcas/adk)
keep each session as one agentcas thread whose history holds one JSONL record per item or
event, and no checkpoint. Everything they do is built from four moves on such threads:

- append records at a thread's head (creating the thread if it is absent),
- cut a thread back to its first `seq` records (its history position after them: the
  records past the cut stay in the store, named by the reflog entry before the cut),
- delete a thread,
- fork a thread at a seq (as `agentcas fork`: one position shared, nothing copied),
- checkpoint a thread as it is (an empty tree, its history: what `export` and `sign` name).

How a change lands: `RecordStore.change(what, build)` calls `build(snapshot)`, which reads
the states it needs through the snapshot and returns the edits (appends, cuts, deletes) of
one or more threads. Their records are chunked first; then one group move
(lineage/group_moves.py) checks that every thread the build read is still at the state it
read and moves each edited thread by compare-and-swap, all in one metadata transaction.
If any of them moved meanwhile nothing lands and `build` runs again on fresh states, so
two processes appending to one session both land, one after the other, and nothing is
lost. On an embedded store a change, a fork included, is one write transaction (one
durable commit: lineage/group_moves.py goes without a lease there). Reads go through the
public `Store` API; only a cut's position is computed here (lineage/rollout.py's
`History.position`), and a fork's state (lineage/thread_moves.py's `fork_state`, as
`agentcas fork` makes it).
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field

from agentcas.cas.objects import EMPTY_POSITION, HistoryPosition, check_reason
from agentcas.errors import ConflictError, NotFound, UsageError
from agentcas.lineage import checkpoints, rollout
from agentcas.lineage.thread_moves import fork_state
from agentcas.refs.names import BadThreadName, check_thread_name
from agentcas.refs.threads import ThreadState

# How often a change is rebuilt when the threads it read keep moving (each rebuild means
# another writer landed, so this bounds only pathological contention).
MAX_REBUILDS = 1000


def open_store(store, refs: str | None = None):
    """(Store, owned): `store` itself, or the store at a path or s3:// URL (created if absent;
    a shared store needs `refs`, its postgresql:// URL), then owned by the caller to close."""
    from agentcas.repository import Store  # the adapters are clients of the public Store API
    if isinstance(store, str) or hasattr(store, "__fspath__"):
        opened, _ = Store.init(str(store), refs=refs)
        return opened, opened
    return store, None


@dataclass(frozen=True)
class Append:
    """Add `data` (complete JSONL records) at the head of `thread`."""

    thread: str
    data: bytes
    message: str


@dataclass(frozen=True)
class Cut:
    """Move `thread` back to its first `seq` records."""

    thread: str
    seq: int
    message: str


@dataclass(frozen=True)
class Checkpoint:
    """Make a checkpoint of `thread` at its head: an empty tree, the thread's history.
    `made` holds its id once landed."""

    thread: str
    reason: str
    made: list = field(default_factory=list)

    def __post_init__(self):
        check_reason(self.reason)  # UsageError before anything is stored


@dataclass(frozen=True)
class Fork:
    """Make `thread` (absent) share the first `at` records of `source` (all if None)."""

    source: str
    thread: str
    at: int | None


@dataclass(frozen=True)
class Delete:
    """Delete `thread` (and its reflog)."""

    thread: str


class _Moved(Exception):
    """A thread the build read moved before its edits landed: build again."""


class Snapshot:
    """What a build reads: thread states (remembered, so the landing can check them) and records."""

    def __init__(self, records: RecordStore):
        self._records = records
        self.read: dict[str, ThreadState | None] = {}

    def state(self, thread: str) -> ThreadState | None:
        if thread not in self.read:
            self.read[thread] = self._records.state(thread)
        return self.read[thread]

    def count(self, thread: str) -> int:
        state = self.state(thread)
        return 0 if state is None else state.history.seq

    def lines(self, thread: str, start: int, stop: int) -> list[bytes]:
        state = self.state(thread)
        return [] if state is None else self._records.lines(state.history, start, stop)


class RecordStore:
    """The session adapters' one door to a Store: reads, changes, forks (see the module doc)."""

    def __init__(self, store, refs: str | None = None):
        self.store, self._owned = open_store(store, refs)
        self._lock = threading.Lock()  # one change at a time per adapter (threads of one process)

    def close(self) -> None:
        if self._owned is not None:
            self._owned.close()
            self._owned = None

    # -- reads -------------------------------------------------------------------------------
    def state(self, thread: str) -> ThreadState | None:
        """The thread's state; None if it is absent, or its name too long to exist."""
        try:
            return self.store.threads.get(thread)
        except (NotFound, BadThreadName):
            return None

    def states(self, prefix: str) -> dict[str, ThreadState]:
        """Every thread named `prefix` or below `prefix/`."""
        return self.store.threads.under(prefix)

    def lines(self, history: HistoryPosition, start: int, stop: int) -> list[bytes]:
        """Records start <= seq < stop of the history at `history`, one bytes line each, verified."""
        stop = min(stop, history.seq)
        if start >= stop:
            return []
        return self.store.history.read_at(history, start, stop).splitlines()

    def extends(self, history: HistoryPosition, known: HistoryPosition) -> bool:
        """Whether the history at `history` begins with the one at `known` (prefix digests)."""
        if known.seq > history.seq:
            return False
        return self.store.history.history().position(history, known.seq).digest == known.digest

    def reflog(self, thread: str) -> list:
        return self.store.threads.reflog(thread)

    # -- changes -----------------------------------------------------------------------------
    def change(self, what: str, build):
        """Run `build(snapshot) -> (edits, result)` and land its edits in one compare-and-swap
        transaction, rebuilding while the threads it read move; `result`."""
        with self._lock:
            for _ in range(MAX_REBUILDS):
                snapshot = Snapshot(self)
                edits, result = build(snapshot)
                if not edits:
                    return result
                try:
                    self._land(what, snapshot.read, edits)
                except _Moved:
                    continue
                return result
        raise ConflictError(f"{what}: the session kept moving under {MAX_REBUILDS} attempts; nothing was changed")

    def _land(self, what: str, read: dict, edits: list) -> None:
        with self.store.threads.group_writer(what) as writer:
            prepared = {id(edit): writer.prepare_records(edit.data) for edit in edits if isinstance(edit, Append)}
            empty_tree = writer.store_tree({}) if any(isinstance(edit, Checkpoint) for edit in edits) else None

            def plan(view):
                for name, state in read.items():
                    if view.thread(name) != state:
                        raise _Moved()
                for edit in edits:
                    old = view.thread(edit.thread)
                    if isinstance(edit, Checkpoint):
                        self._commit(view, old, edit, empty_tree)
                        continue
                    if isinstance(edit, Fork):
                        self._fork(view, edit)
                        continue
                    view.set_thread(edit.thread, old, self._moved_state(view, old, edit, prepared),
                                    *self._action(edit))

            writer.land(plan)

    @staticmethod
    def _moved_state(view, old: ThreadState | None, edit, prepared: dict) -> ThreadState | None:
        if isinstance(edit, Delete):
            return None
        history = EMPTY_POSITION if old is None else old.history
        if isinstance(edit, Append):
            history = view.link(history, prepared[id(edit)])
        else:
            history = rollout.History(view.objects).position(history, edit.seq)
            if history.segment is not None:  # a stored segment the new state relies on
                view.needed.add(history.segment.raw)
            if old is not None and old.checkpoint is not None:  # (a user's `agentcas commit` made one)
                checkpoint = checkpoints.newest_at_or_before(view.objects, old.checkpoint, edit.seq)
                return ThreadState(checkpoint, history, old.forked_from)
        return ThreadState(None if old is None else old.checkpoint, history,
                           None if old is None else old.forked_from)

    @staticmethod
    def _commit(view, old: ThreadState, edit: Checkpoint, tree) -> None:
        parents = () if old.checkpoint is None else (old.checkpoint,)
        digest = view.commit(edit.thread, tree, parents, edit.reason, old.history, checkpoints.default_author())
        edit.made[:] = [digest]  # (a re-plan replaces it)
        view.set_thread(edit.thread, old, ThreadState(digest, old.history, old.forked_from), "commit",
                        edit.reason, history_implied=True)

    @staticmethod
    def _fork(view, edit: Fork) -> None:
        source = view.thread(edit.source)
        assert source is not None  # the build saw it, and the landing checks it is unchanged
        objects = view.objects
        new, message = fork_state(objects, rollout.History(objects), source.history, source.checkpoint,
                                  edit.source, edit.source, edit.at)
        view.needed.update(d.raw for d in (new.checkpoint, new.history.segment) if d is not None)
        view.set_thread(edit.thread, None, new, "fork", message)

    @staticmethod
    def _action(edit) -> tuple[str, str]:
        if isinstance(edit, Append):
            return "append", edit.message
        if isinstance(edit, Cut):
            return "revert", edit.message  # a move back, as `agentcas revert` makes
        return "delete", ""

    def fork(self, source: str, name: str, at: int | None) -> None:
        """Thread `name` sharing the first `at` records of `source` (all if None), as `agentcas
        fork` makes it, in one change. Raises NotFound (no `source`), ConflictError (`name`
        exists), UsageError (`at` beyond `source`'s records), BadThreadName."""
        check_thread_name(name)

        def build(snapshot):
            if snapshot.state(name) is not None:
                raise ConflictError(f"thread {name!r} already exists")
            count = snapshot.count(source)
            if snapshot.state(source) is None:
                raise NotFound(f"no thread named {source!r}")
            if at is not None and not 0 <= at <= count:
                raise UsageError(f"--at {at} is outside the history of {source!r} ({count} records)")
            return [Fork(source, name, at)], None

        self.change(f"fork {name}", build)


# -- the adapters' async side ----------------------------------------------------------------
async def in_thread(function, *args):
    """`function(*args)` in a worker thread (store work blocks: LMDB, fsync, network)."""
    return await asyncio.to_thread(function, *args)


async def to_completion(function, *args):
    """`in_thread`, finished even when the caller is cancelled meanwhile (then re-raised):
    a change either lands and is reported, or is not started, never left half-seen."""
    # The executor's future itself, shielded: no task around it (~30 µs less per call).
    future = asyncio.get_running_loop().run_in_executor(None, function, *args)
    cancelled: asyncio.CancelledError | None = None
    while not future.done():
        try:
            await asyncio.shield(future)
        except asyncio.CancelledError as exc:
            if not future.cancelled():  # the caller was cancelled: finish the call first
                cancelled = cancelled or exc
        except Exception:  # noqa: BLE001 - the call's own error, raised by result() below
            pass
    if cancelled is not None:
        raise cancelled
    return future.result()
