"""Commit: a workspace directory (and the new tail of a rollout file) as a checkpoint.

1. Checks that need no lease: the reason, the thread name, the workspace is a directory
   and not the store itself, and a stale `--expect` (refused before anything is stored).
2. Under the writer's lease: snapshot the workspace (workspace/snapshot.py: new chunks
   and trees stored, unchanged files reused through the stat cache) and prepare the
   rollout file's new complete lines (lineage/tail.py), starting where the head
   checkpoint's `rollout_file` says the history stands in the file.
3. One ref move (lineage/moves.py): the plan builds the checkpoint on the thread's
   current head (lineage/checkpoints.py) with its own `rollout_file` (the file's place
   after the new lines, and its path if it lies in the workspace), links the prepared
   records after the history the tail was read against, and checks `--expect` again; the move stores the
   checkpoint, checks that every reused object is still stored and lands by
   compare-and-swap. A shared store's cache may believe in objects another machine's gc
   deleted: then the snapshot runs once more asking the bucket.

A harness session's checkpoint (`commit_session`: what `agentcas hook claude|codex`
lands, and `rewind` before it rewinds) is the same walk with the session's lines instead
of a rollout tail:
1. Under a lease, the workspace is snapshot as a git user sees it (`.git` never read,
   `.gitignore` and `.agentcasignore` honoured; workspace/snapshot.py `git_aware`), a file
   that looks like a credential left out and named (`skip_secrets`), with the directory
   cache keyed by the gc epoch (the sweep batches begun).
2. The move's plan reads `new_lines(state)`, the session's complete lines after the
   thread's stored history (it may raise an AgentcasError, e.g. ingest's SessionRefused:
   the workspace then lands alone and the refusal is reported; for a new thread forking
   another, lineage/marks.py ForkLines), stores them, and builds one checkpoint at their
   end whose tree is the workspace's (lineage/marks.py `marks_plan`). A lost race (a
   parallel tool call's hook appended meanwhile) re-plans on the new head: the snapshot
   is kept, the lines are read again, so both checkpoints land.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable

from agentcas import testing_hooks
from agentcas.cas.backends import Backends
from agentcas.cas.digest import Digest
from agentcas.cas.objects import EMPTY_POSITION, check_reason
from agentcas.cas.store_format import utc_now
from agentcas.cas.writer import BatchWriter
from agentcas.errors import AgentcasError, ConflictError, UsageError
from agentcas.lineage import checkpoints, rollout
from agentcas.lineage.checkpoints import CommitResult, SessionCheckpoint, default_author, runtime_description
from agentcas.lineage.marks import ForkLines, IngestedThread, marks_plan, prepare_lines
from agentcas.lineage.moves import Move, VanishedObject, lease_for, move_thread, read_state
from agentcas.refs import revisions, threads
from agentcas.refs.names import check_thread_name
from agentcas.refs.threads import ThreadState


def _within(path: str, directory: str) -> bool:
    """Whether `path` is `directory` or below it (both real paths)."""
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def commit_workspace(backends: Backends, store_path: str | None, workspace: str, reason: str, thread: str = "main",
                     rollout_file: str | None = None, expect: str | None = None, allow_secrets=(),
                     author: str | None = None, progress=None) -> CommitResult:
    """Snapshot `workspace` (and the new tail of `rollout_file`) as a checkpoint on `thread`."""
    check_reason(reason)
    from agentcas.workspace.snapshot import check_reason_secret, snapshot  # lazy: only commit reads a workspace
    check_reason_secret(reason, allow_secrets)
    check_thread_name(thread)
    source = backends.source
    expected = _resolve(backends, expect) if expect else None
    if not os.path.isdir(workspace):
        raise UsageError(f"workspace is not a directory: {workspace}")
    if store_path and _within(os.path.realpath(workspace), os.path.realpath(store_path)):
        raise UsageError(f"workspace {workspace} is the store itself, or inside it; nothing was committed")
    if expect is not None:
        # Refuse a stale --expect before storing anything; the plan checks again, for a
        # thread that moves while we snapshot.
        _check_expected(backends, thread, expected, expect)
    with lease_for(backends, f"commit {thread}", thread) as lease:
        skip = [store_path] if store_path else []
        # A rollout file inside the workspace is stored once, as history, not as a file too.
        skip_files = [rollout_file] if rollout_file else []
        known = backends.known
        head = read_state(backends, thread, lease)  # only counts unchanged files: may be stale
        previous_tree = None if head is None or head.checkpoint is None else \
            revisions.load_checkpoint(source, head.checkpoint).tree  # to count unchanged files
        # On a shared store the last batch of new objects (the snapshot's, the tail's) is
        # held back and stored by the move itself: one pack, one upload, for a small step.
        held: dict[bytes, bytes] | None = {} if backends.packed is not None else None
        tail_held: dict[bytes, bytes] | None = {} if backends.packed is not None else None
        tree, stats, needed = snapshot(source, backends.local, workspace, allow_secrets,
                                       progress, skip, skip_files, lease, known, previous_tree, held=held)
        tail = file_path = None
        if rollout_file is not None:
            from agentcas.lineage.tail import prepare_tail, workspace_path
            writer = BatchWriter(source, lease=lease, held=tail_held)
            state = read_state(backends, thread)
            mark = None if state is None or state.checkpoint is None else \
                revisions.load_checkpoint(source, state.checkpoint).rollout_file  # where it stands in the file
            tail = prepare_tail(source, writer, thread, state, rollout_file, mark)
            file_path = workspace_path(rollout_file, workspace)
        created_at, who, runtime = utc_now(), author or default_author(), runtime_description()

        def plan(state: ThreadState | None) -> Move:
            current = None if state is None else state.checkpoint
            if expect is not None and current != expected:
                raise ConflictError(f"thread {thread!r} is at "
                                    f"{current.hex() if current else 'nothing'}, not at {expect!r}; "
                                    "nothing was committed")
            history = EMPTY_POSITION if state is None else state.history
            appended = 0
            new_objects: dict[bytes, bytes] = {}
            in_file = None
            if tail is not None:
                if history != tail.based_on:
                    raise ConflictError(f"thread {thread!r} history moved while the rollout was read; "
                                        "nothing was committed, retry")
                history, new_objects = rollout.link_segments(source, history, tail.segments, tail_held or ())
                appended = history.seq - tail.based_on.seq
                in_file = tail.rollout_file(history, file_path)
            digest, cp, framed = checkpoints.build_checkpoint(
                source, tree, (current,) if current else (), thread, reason, who, created_at, runtime, history,
                rollout_file=in_file)
            new_objects = {**(held or {}), **(tail_held or {}), **new_objects}
            new_objects[digest.raw] = framed
            # The parent's own tree is held by the ref we compare against; anything
            # else the snapshot reused must still be stored.
            same_tree = current is not None and revisions.load_checkpoint(source, current).tree == tree
            return Move(ThreadState(digest, history, None if state is None else state.forked_from),
                        "commit", reason, new_objects, set() if same_tree else set(needed) - new_objects.keys(),
                        (digest, cp, appended), history_implied=True)  # cp.history is `history`

        testing_hooks.reached("commit.before_land")
        try:
            _, move = move_thread(backends, lease, thread, plan)
        except VanishedObject:
            if known is None:
                raise
            # This machine's cache (a shared store's) knew objects that gc on another
            # machine has deleted since: every rerun would trust it again and fail. So
            # snapshot once more asking the bucket, which stores again what is gone.
            known = None
            if held is not None:
                held.clear()
            tree, stats, needed = snapshot(source, backends.local, workspace, allow_secrets,
                                           progress, skip, skip_files, lease, known, previous_tree, held=held)
            _, move = move_thread(backends, lease, thread, plan)
    assert move is not None and isinstance(move.result, tuple)  # a commit always moves its thread
    digest, cp, appended = move.result
    return CommitResult(digest.hex(), tree.hex(), thread, [p.hex() for p in cp.parents], cp.history,
                        stats.files, stats.bytes, stats.cached_files, stats.new_objects, stats.new_bytes,
                        appended, stats.unchanged_files)


NewLines = Callable[[ThreadState | None], "bytes | ForkLines"]


def commit_session(backends: Backends, store_path: str | None, workspace: str, thread: str, reason: str,
                   new_lines: NewLines, skip_files: Iterable[str] = (),
                   author: str | None = None) -> SessionCheckpoint:
    """Checkpoint `workspace` with `new_lines(state)` at the head of `thread` (see the module doc)."""
    from agentcas.cas.leases import Lease, sweeps_begun
    from agentcas.workspace.snapshot import snapshot  # lazy: only a commit reads a workspace
    check_reason(reason)
    check_thread_name(thread)
    if not os.path.isdir(workspace):
        raise UsageError(f"workspace is not a directory: {workspace}")
    real = os.path.realpath(workspace)
    if store_path and _within(real, os.path.realpath(store_path)):
        raise UsageError(f"workspace {workspace} is the store itself, or inside it; nothing was committed")
    who, runtime = author or default_author(), dict(runtime_description(), workspace=real)
    with Lease(backends.meta, f"checkpoint {thread}") as lease:
        with backends.meta.reader() as txn:
            epoch = sweeps_begun(txn).to_bytes(8, "big")
        snapper: list = []
        tree, stats, needed = snapshot(backends.source, backends.local, workspace, (), None,
                                       [store_path] if store_path else [], skip_files, lease, backends.known,
                                       git_aware=True, skip_secrets=True, snapshotter=snapper,
                                       dir_cache_epoch=epoch)
        refused: list[str] = []  # why the session's lines were refused (then every attempt lands none)

        def plan(state: ThreadState | None) -> Move | None:
            try:
                lines = b"" if refused else new_lines(state)
            except AgentcasError as exc:
                refused.append(str(exc))
                lines = b""
            data, origin, segments = prepare_lines(backends, lease, lines)
            testing_hooks.reached("session.before_land")
            return marks_plan(backends, thread, segments, [(data.count(b"\n"), reason)],
                              None if state is None else state.history, origin, who, utc_now(), runtime,
                              tree, frozenset(needed))(state)

        _, move = move_thread(backends, lease, thread, plan, keep_lease=True)
    assert move is not None  # a mark at the lines' end always makes a checkpoint
    landed = move.result
    assert isinstance(landed, IngestedThread)
    return SessionCheckpoint(landed.checkpoints[-1], tree.hex(), thread, landed.appended, landed.history,
                             stats.files, stats.cached_files, stats.new_bytes,
                             tuple(snapper[0].skipped_secrets), refused[0] if refused else None, real)


def _resolve(backends: Backends, rev: str) -> Digest:
    with backends.meta.reader() as txn:
        digest = revisions.resolve(txn, backends.source, rev)
    revisions.load_checkpoint(backends.source, digest)
    return digest


def _check_expected(backends: Backends, thread: str, expected: Digest | None, expect: str) -> None:
    with backends.meta.reader() as txn:
        state = threads.read_thread(txn, thread)
    if (None if state is None else state.checkpoint) != expected:
        raise ConflictError(f"thread {thread!r} is not at {expect!r}; nothing was committed")
