"""`store.threads`: list, create, delete, fork and revert threads; their log, reflog and fork tree.

The moves are lineage/thread_moves.py's (each a compare-and-swap on the thread's ref,
with its reflog row); the revision grammar is refs/revisions.py's, the fork tree
lineage/fork_tree.py's.
"""

from __future__ import annotations

import builtins
from typing import TYPE_CHECKING

from agentcas.api.results import BranchResult, DeleteResult, ForkResult, LogEntry, ReflogItem, RevertResult, ThreadInfo
from agentcas.cas.digest import Digest
from agentcas.errors import NotFound
from agentcas.lineage.fork_tree import Lineage, fork_tree
from agentcas.lineage.group_moves import GroupWriter, refs_under
from agentcas.lineage.thread_moves import branch_thread, delete_thread, fork_thread, revert_thread
from agentcas.refs import revisions, threads
from agentcas.refs.names import check_thread_name
from agentcas.refs.threads import ThreadState

if TYPE_CHECKING:
    from agentcas.repository import Store

UNRELATED_NOTE = "the target checkpoint is not in this thread's ancestry (a checkpoint of an unrelated thread)"
WORLD_NOTE = ("revert moves the thread's pointer only: files written, requests sent and money spent "
              "by the agent are not undone")


def _hex(digest: Digest | None) -> str | None:
    return None if digest is None else digest.hex()


class Threads:
    """The threads of a store (`store.threads`)."""

    def __init__(self, store: Store):
        self._store = store
        self._backends = store.backends

    # -- reading ---------------------------------------------------------------------------------
    def get(self, name: str) -> ThreadState:
        """A thread's state; NotFound if there is none of that name."""
        check_thread_name(name)
        with self._backends.meta.reader() as txn:
            state = threads.read_thread(txn, name)
        if state is None:
            raise NotFound(f"no thread named {name!r}")
        return state

    def names(self) -> set[str]:
        """Every thread's name (cheaper than `list`: no ref row is decoded)."""
        with self._backends.meta.reader() as txn:
            return threads.thread_names(txn)

    def list(self) -> list[ThreadInfo]:
        """Every thread, by name."""
        with self._backends.meta.reader() as txn:
            return [ThreadInfo(name, _hex(s.checkpoint), s.history, s.forked_from)
                    for name, s in threads.list_threads(txn)]

    def under(self, prefix: str) -> dict[str, ThreadState]:
        """Every thread named `prefix` or starting with `prefix/`, with its state."""
        with self._backends.meta.reader() as txn:
            return dict(refs_under(txn, prefix))

    def log(self, thread: str | None = None, limit: int | None = None) -> builtins.list[LogEntry]:
        """Checkpoints newest first along first parents from a thread (or revision)."""
        out: builtins.list[LogEntry] = []
        with self._backends.meta.reader() as txn:
            digest: Digest | None = revisions.resolve(txn, self._backends.source, thread or "main")
        with self._backends.source.reading() as objects:
            while digest is not None and (limit is None or len(out) < limit):
                cp = revisions.load_checkpoint(objects, digest)
                out.append(LogEntry(digest.hex(), cp.reason, cp.thread, cp.created_at, cp.author,
                                    [p.hex() for p in cp.parents], cp.history))
                digest = cp.parents[0] if cp.parents else None
        return out

    def reflog(self, thread: str, limit: int | None = None) -> builtins.list[ReflogItem]:
        """Every move of a thread's ref, newest first, each named as a revision (THREAD@{N})."""
        check_thread_name(thread)
        with self._backends.meta.reader() as txn:
            if threads.read_thread(txn, thread) is None:
                raise NotFound(f"no thread named {thread!r}")
            return [ReflogItem(f"{thread}@{{{index}}}", entry)
                    for index, entry in enumerate(threads.read_reflog(txn, thread, limit, self._backends.source))]

    def lineage(self, thread: str | None = None) -> Lineage:
        """The fork tree of every thread (or of `thread` and the threads forked from it)."""
        with self._backends.meta.reader() as txn:
            states = threads.list_threads(txn)
        return fork_tree(states, thread)

    # -- moves -----------------------------------------------------------------------------------
    def create(self, name: str, rev: str | None = None) -> BranchResult:
        """A new thread at a checkpoint (default: main's head), with that checkpoint's history."""
        return BranchResult(name, branch_thread(self._backends, name, rev).hex())

    def delete(self, name: str) -> DeleteResult:
        """Delete a thread and its reflog (the objects stay until gc finds them unreachable)."""
        return DeleteResult(name, True, _hex(delete_thread(self._backends, name).checkpoint))

    def fork(self, source: str, name: str, at: int | None = None) -> ForkResult:
        """A new thread sharing the first `at` records (default: all) of `source`'s history."""
        new = fork_thread(self._backends, self._store.history.history(), source, name, at)
        return ForkResult(name, source, new.history.seq, _hex(new.checkpoint), new.history)

    def revert(self, thread: str, rev: str, expect: str | None = None) -> RevertResult:
        """Move `thread` to checkpoint `rev` by compare-and-swap; the old head stays in the reflog.

        The result lists the pending and unknown effects recorded after the target, which
        a revert does not undo."""
        old, new, related = revert_thread(self._backends, thread, rev, expect)
        notes = [WORLD_NOTE] + ([] if related else [UNRELATED_NOTE])
        # The revert has landed: a failure to list the effects it did not undo must not
        # turn it into an error.
        try:
            open_effects = self._store.effects.open_after(old.history, thread, True, new.history)
        except Exception as exc:  # noqa: BLE001 - reported in the result instead
            open_effects = None
            notes.append(f"could not list the effects after the target ({exc}); "
                         f"see: agentcas effects {thread}@{{1}} --since {thread} --state pending,unknown")
        assert new.checkpoint is not None  # a revert moves the thread to a checkpoint
        return RevertResult(thread, new.checkpoint.hex(), _hex(old.checkpoint), new.history, related, notes,
                            open_effects)

    def group_writer(self, what: str) -> GroupWriter:
        """A lease-holding writer: in-memory content first, then several ref moves in one
        compare-and-swap transaction (lineage/group_moves.py)."""
        from agentcas.cas.store_format import utc_now
        from agentcas.lineage.checkpoints import runtime_description
        return GroupWriter(self._backends, what, lambda: (utc_now(), runtime_description()))
