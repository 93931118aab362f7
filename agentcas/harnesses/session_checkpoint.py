"""A harness session's checkpoint: the workspace and the session's new lines, in one move.

What `agentcas hook claude|codex` lands (and `rewind` before it rewinds, with no lines);
the API is `store.sessions.checkpoint` (agentcas/api/sessions.py):

1. Under a lease, the workspace is snapshot as a git user sees it (`.git` never read,
   `.gitignore` and `.agentcasignore` honoured; workspace/snapshot.py `git_aware`), a file
   that looks like a credential left out and named (`skip_secrets`), with the directory
   cache keyed by the gc epoch (the sweep batches begun).
2. The thread's state is read and `new_lines(state)` gives the session's complete lines
   after its stored history (it may raise an AgentcasError, e.g. ingest's SessionRefused:
   the workspace then lands alone and the refusal is reported); for a new thread that forks
   another (a Codex fork), ForkLines: its origin, and its copy of the origin's records,
   stored as copies (lineage/rollout.py prepare_with_copies) as ingest stores them.
3. The lines and one checkpoint at their end, whose tree is the workspace's, land by
   compare-and-swap on the history read in 2 (lineage/marks.append_with_marks). If another
   writer appended meanwhile (parallel tool calls fire two hooks), 2 and 3 run again after
   its head: the snapshot is kept, the lines are read again, so both checkpoints land.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from agentcas import testing_hooks
from agentcas.cas.objects import HistoryPosition, check_reason
from agentcas.cas.writer import BatchWriter
from agentcas.errors import AgentcasError, ConflictError, UsageError
from agentcas.refs import threads
from agentcas.refs.names import check_thread_name

SESSION_ATTEMPTS = 64


@dataclass(frozen=True)
class ForkLines:
    """What `new_lines(state)` returns for the first lines of a session that forks another
    thread (a Codex fork): the lines, the thread's fork origin, and the lines that copy the
    origin's records (rollout.CopyClaim, or None), stored as copies as ingest stores them."""

    data: bytes
    origin: threads.ForkOrigin
    copies: Any = None


@dataclass(frozen=True)
class SessionCheckpoint:
    """What `session_checkpoint` landed."""

    checkpoint: str
    tree: str
    thread: str
    appended: int                     # session lines appended with it
    history: HistoryPosition
    files: int
    cached_files: int
    new_bytes: int
    skipped_secrets: tuple = ()       # "path: why" of files left out as likely credentials
    refused: str | None = None        # why the session's lines were not appended (the workspace was)
    workspace: str = ""

    def to_json(self) -> dict:
        return {"checkpoint": self.checkpoint, "tree": self.tree, "thread": self.thread,
                "appended": self.appended, "history": self.history.to_doc(), "files": self.files,
                "cached_files": self.cached_files, "new_bytes": self.new_bytes,
                "skipped_secrets": list(self.skipped_secrets), "refused": self.refused,
                "workspace": self.workspace}


def session_checkpoint(store, workspace: str, thread: str, reason: str, new_lines, skip_files=(),
                       author: str | None = None) -> SessionCheckpoint:
    """Checkpoint `workspace` with `new_lines(state)` at the head of `thread` (see the module doc)."""
    from agentcas.cas.framing import INGEST_ZSTD
    from agentcas.cas.leases import Lease, sweeps_begun
    from agentcas.cas.store_format import utc_now
    from agentcas.lineage.checkpoints import default_author, runtime_description
    from agentcas.lineage.marks import append_with_marks, prepare_raw
    from agentcas.workspace.snapshot import snapshot
    check_reason(reason)
    check_thread_name(thread)
    if not os.path.isdir(workspace):
        raise UsageError(f"workspace is not a directory: {workspace}")
    real = os.path.realpath(workspace)
    store_dir = os.path.realpath(store.path) if store.path else None
    if store_dir and (real == store_dir or real.startswith(store_dir.rstrip("/") + "/")):
        raise UsageError(f"workspace {workspace} is the store itself, or inside it; nothing was committed")
    backends = store.backends
    who, runtime = author or default_author(), dict(runtime_description(), workspace=real)
    with Lease(backends.meta, f"checkpoint {thread}") as lease:
        with backends.meta.reader() as txn:
            epoch = sweeps_begun(txn).to_bytes(8, "big")
        snapper: list = []
        tree, stats, needed = snapshot(backends.source, backends.local, workspace, (), None,
                                       [store.path] if store.path else [], skip_files, lease, backends.known,
                                       git_aware=True, skip_secrets=True, snapshotter=snapper,
                                       dir_cache_epoch=epoch)
        refused = None
        for _ in range(SESSION_ATTEMPTS):
            with backends.meta.reader() as txn:
                state = threads.read_thread(txn, thread)
            origin = copies = None
            try:
                lines = b"" if refused else new_lines(state)
            except AgentcasError as exc:
                refused, lines = str(exc), b""
            if isinstance(lines, ForkLines):
                data, origin, copies = lines.data, lines.origin, lines.copies
            else:
                data = lines
            writer = BatchWriter(backends.source, lease=lease)
            if copies is not None:
                from agentcas.lineage.rollout import History, prepare_with_copies
                segments = prepare_with_copies(History(backends.source), data, copies, writer.add, INGEST_ZSTD)
                writer.flush()
            else:
                segments = prepare_raw([data], writer, INGEST_ZSTD)[0]
            testing_hooks.reached("session.before_land")
            try:
                result = append_with_marks(backends, lease, thread, segments, [(data.count(b"\n"), reason)],
                                           None if state is None else state.history, origin, who, utc_now(),
                                           runtime, tree, frozenset(needed))
            except ConflictError:
                continue   # another writer appended to the thread: read the lines after its head
            return SessionCheckpoint(result.checkpoints[-1], tree.hex(), thread, result.appended, result.history,
                                     stats.files, stats.cached_files, stats.new_bytes,
                                     tuple(snapper[0].skipped_secrets), refused, real)
    raise ConflictError(f"thread {thread!r} kept moving under {SESSION_ATTEMPTS} attempts; nothing was changed, "
                        "retry")
