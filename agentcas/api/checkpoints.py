"""`store.checkpoints`: commit a workspace, show, list files, diff, check out, scan.

A commit snapshots the workspace (workspace/snapshot.py), links the new tail of a
rollout file (lineage/tail.py), builds the checkpoint (lineage/checkpoints.py) and moves
the thread by compare-and-swap (lineage/moves.py); a checkout restores a tree into a new
directory (workspace/restore.py).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from agentcas import __version__, testing_hooks
from agentcas.api.results import (CheckoutResult, CheckpointInfo, CommitResult, DiffResult, FileInfo, FileResize,
                                  FileSize, RecordsDiff, ScanReport)
from agentcas.cas.digest import Digest
from agentcas.cas.objects import EMPTY_POSITION, Checkpoint, check_reason
from agentcas.cas.store_format import utc_now
from agentcas.cas.writer import BatchWriter
from agentcas.errors import ConflictError, NotFound, UsageError
from agentcas.lineage import checkpoints, rollout
from agentcas.lineage.moves import Move, VanishedObject, lease_for, move_thread, read_state
from agentcas.refs import revisions, threads
from agentcas.refs.names import check_thread_name
from agentcas.refs.threads import ThreadState

if TYPE_CHECKING:
    from agentcas.repository import Store


def runtime_description() -> dict:
    import platform  # lazy: only commits describe their runtime
    return {"agentcas": __version__, "python": platform.python_version(),
            "os": f"{platform.system()} {platform.release()} {platform.machine()}"}


def default_author() -> str:
    name = os.environ.get("AGENTCAS_AUTHOR")
    if name:
        return name
    import getpass  # lazy (it imports termios): only a commit without $AGENTCAS_AUTHOR needs it
    try:
        return f"{getpass.getuser()}@{os.uname().nodename}"  # socket.gethostname(), without socket
    except Exception:  # noqa: BLE001 - no user database in some containers
        return "unknown"


def _within(path: str, directory: str) -> bool:
    """Whether `path` is `directory` or below it (both real paths)."""
    return path == directory or path.startswith(directory.rstrip("/") + "/")


class Checkpoints:
    """The checkpoints of a store (`store.checkpoints`)."""

    def __init__(self, store: "Store"):
        self._store = store
        self._stores = store.stores

    def get(self, rev: str) -> tuple[Digest, Checkpoint]:
        """The checkpoint `rev` names: (id, verified Checkpoint)."""
        with self._stores.meta.reader() as txn:
            digest = revisions.resolve(txn, self._stores.objects, rev)
        return digest, revisions.load_checkpoint(self._stores.objects, digest)

    def show(self, rev: str, files: bool = False) -> CheckpointInfo:
        """A checkpoint's fields (with `files`, its files too)."""
        digest, cp = self.get(rev)
        return CheckpointInfo(digest.hex(), cp.tree.hex(), [p.hex() for p in cp.parents], cp.thread, cp.reason,
                              cp.author, cp.created_at, cp.runtime, cp.history, cp.format,
                              self.files(digest.hex()) if files else None)

    def files(self, rev: str) -> list[FileInfo]:
        """Every file of checkpoint `rev`, by path."""
        from agentcas.workspace.restore import list_files  # lazy: restore pulls in shutil and threads
        digest, cp = self.get(rev)
        with self._stores.objects.reading() as objects:
            return [FileInfo(path, entry.size, entry.mode, entry.id.hex())
                    for path, entry in list_files(objects, cp.tree) if entry.type == "file"]

    def tree_files(self, tree: Digest, content: bool = True) -> dict:
        """Every file under `tree` by '/'-separated path: its verified bytes, or (without
        `content`) its TreeEntry."""
        from agentcas.workspace.restore import list_files, read_file
        with self._stores.objects.reading() as objects:
            return {path: read_file(objects, entry, path) if content else entry
                    for path, entry in list_files(objects, tree) if entry.type == "file"}

    def reachable(self, heads, known=frozenset()) -> list[tuple[Digest, Checkpoint]]:
        """Checkpoints reachable from `heads` along all parents, stopping at `known` raw ids
        (only read, never copied); each once, verified."""
        out, seen = [], set()
        with self._stores.objects.reading() as objects:
            stack = [h for h in heads if h is not None and h.raw not in known]
            while stack:
                digest = stack.pop()
                if digest.raw in seen:
                    continue
                seen.add(digest.raw)
                cp = revisions.load_checkpoint(objects, digest)
                out.append((digest, cp))
                stack.extend(p for p in reversed(cp.parents) if p.raw not in seen and p.raw not in known)
        return out

    def diff(self, rev1: str, rev2: str) -> DiffResult:
        """Files added, removed and changed, and how the two histories compare."""
        from agentcas.workspace.restore import list_files  # lazy: restore pulls in shutil and threads
        d1, c1 = self.get(rev1)
        d2, c2 = self.get(rev2)
        with self._stores.objects.reading() as objects:
            files1 = {p: e for p, e in list_files(objects, c1.tree) if e.type == "file"}
            files2 = {p: e for p, e in list_files(objects, c2.tree) if e.type == "file"}
            common = rollout.common_prefix(self._store.history.history(objects), c1.history, c2.history)
        added = [FileSize(p, files2[p].size) for p in sorted(files2.keys() - files1.keys())]
        removed = [FileSize(p, files1[p].size) for p in sorted(files1.keys() - files2.keys())]
        changed = [FileResize(p, files1[p].size, files2[p].size) for p in sorted(files1.keys() & files2.keys())
                   if (files1[p].id, files1[p].mode) != (files2[p].id, files2[p].mode)]
        records = RecordsDiff(c1.history.seq, c2.history.seq, common, c2.history.seq - common,
                              [common, c2.history.seq], c1.history.seq - common)
        return DiffResult(d1.hex(), d2.hex(), added, removed, changed, records)

    def checkout(self, rev: str, dest: str, progress=None) -> CheckoutResult:
        """Restore checkpoint `rev` into `dest`, which must not exist."""
        from agentcas.workspace.restore import restore_tree  # lazy: only checkout writes files
        digest, cp = self.get(rev)
        open_effects = self._store.effects.after_checkpoint(rev)  # what restoring files does not undo
        count = restore_tree(self._stores.objects, cp.tree, dest, progress)
        return CheckoutResult(digest.hex(), cp.tree.hex(), os.path.abspath(dest), count, open_effects)

    def scan(self, rev: str) -> ScanReport:
        """Likely secrets in REV's files and history (a thread: its whole history), by the
        commit's rules."""
        from agentcas.exchange.secret_scan import file_findings, history_findings
        with self._stores.meta.reader() as txn:
            try:
                history, digest, thread = revisions.source_state(txn, self._stores.objects, rev)
            except NotFound:
                raise NotFound(f"no thread or checkpoint named {rev!r}") from None
        with self._stores.objects.reading() as objects:
            tree = None if digest is None else revisions.load_checkpoint(objects, digest).tree
            files = [] if tree is None else file_findings(objects, tree)
            records = history_findings(objects, history, thread)
        return ScanReport(None if digest is None else digest.hex(), thread, history.seq,
                          not files and not records,
                          [{"path": f.path, "line": f.line, "rule": f.rule} for f in files],
                          [r.to_json() for r in records])

    # -- committing ------------------------------------------------------------------------------
    def commit(self, workspace: str, reason: str, thread: str = "main", rollout_file: str | None = None,
               expect: str | None = None, allow_secrets=(), author: str | None = None,
               progress=None) -> CommitResult:
        """Snapshot `workspace` (and the new tail of `rollout_file`) as a checkpoint on `thread`."""
        check_reason(reason)
        check_thread_name(thread)
        stores, source, path = self._stores, self._stores.objects, self._store.path
        expected = self._store.resolve(expect) if expect else None
        if not os.path.isdir(workspace):
            raise UsageError(f"workspace is not a directory: {workspace}")
        if path and _within(os.path.realpath(workspace), os.path.realpath(path)):
            raise UsageError(f"workspace {workspace} is the store itself, or inside it; nothing was committed")
        if expect is not None:
            # Refuse a stale --expect before storing anything; the plan checks again, for a
            # thread that moves while we snapshot.
            self._check_expected(thread, expected, expect)
        from agentcas.workspace.snapshot import snapshot  # lazy: only commit reads a workspace
        with lease_for(stores, f"commit {thread}", thread) as lease:
            skip = [path] if path else []
            # A rollout file inside the workspace is stored once, as history, not as a file too.
            skip_files = [rollout_file] if rollout_file else []
            known = stores.known
            tree, stats, needed = snapshot(source, stores.local, workspace, allow_secrets,
                                           progress, skip, skip_files, lease, known)
            tail = None
            if rollout_file is not None:
                from agentcas.lineage.tail import prepare_tail
                writer = BatchWriter(source, lease=lease)
                tail = prepare_tail(source, writer, thread, read_state(stores, thread), rollout_file)
            created_at, who, runtime = utc_now(), author or default_author(), runtime_description()

            def plan(state: ThreadState | None) -> Move:
                current = None if state is None else state.checkpoint
                if expect is not None and current != expected:
                    raise ConflictError(f"thread {thread!r} is at "
                                        f"{current.hex() if current else 'nothing'}, not at {expect!r}; "
                                        "nothing was committed")
                history = EMPTY_POSITION if state is None else state.history
                appended, new_objects = 0, {}
                if tail is not None:
                    prepared, based_on = tail
                    if history != based_on:
                        raise ConflictError(f"thread {thread!r} history moved while the rollout was read; "
                                            "nothing was committed, retry")
                    history, new_objects = rollout.link_segments(source, history, prepared)
                    appended = history.seq - based_on.seq
                digest, cp, framed = checkpoints.build_checkpoint(
                    source, tree, (current,) if current else (), thread, reason, who, created_at, runtime, history)
                new_objects[digest.raw] = framed
                # The parent's own tree is held by the ref we compare against; anything
                # else the snapshot reused must still be stored.
                same_tree = current is not None and revisions.load_checkpoint(source, current).tree == tree
                return Move(ThreadState(digest, history, None if state is None else state.forked_from),
                            "commit", reason, new_objects, set() if same_tree else set(needed),
                            (digest, cp, appended), history_implied=True)  # cp.history is `history`

            testing_hooks.reached("commit.before_land")
            try:
                _, move = move_thread(stores, lease, thread, plan)
            except VanishedObject:
                if known is None:
                    raise
                # This machine's cache (a shared store's) knew objects that gc on another
                # machine has deleted since: every rerun would trust it again and fail. So
                # snapshot once more asking the bucket, which stores again what is gone.
                known = None
                tree, stats, needed = snapshot(source, stores.local, workspace, allow_secrets,
                                               progress, skip, skip_files, lease, known)
                _, move = move_thread(stores, lease, thread, plan)
        digest, cp, appended = move.result
        return CommitResult(digest.hex(), tree.hex(), thread, [p.hex() for p in cp.parents], cp.history,
                            stats.files, stats.bytes, stats.cached_files, stats.new_objects, stats.new_bytes,
                            appended)

    def _check_expected(self, thread: str, expected: Digest | None, expect: str) -> None:
        with self._stores.meta.reader() as txn:
            state = threads.read_thread(txn, thread)
        if (None if state is None else state.checkpoint) != expected:
            raise ConflictError(f"thread {thread!r} is not at {expect!r}; nothing was committed")
