"""`store.sessions`: harness sessions (Claude Code, Codex) checkpointed while they work,
rewound to a step, and resumed on this machine (agentcas/harnesses/: session_checkpoint.py,
rewind.py; the CLI's `hook`, `rewind` and `resume`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agentcas.api.results import RewindResult, SessionPlacement
    from agentcas.harnesses.session_checkpoint import SessionCheckpoint
    from agentcas.repository import Store


class Sessions:
    """Checkpoint, rewind and resume harness sessions (`store.sessions`)."""

    def __init__(self, store: Store):
        self._store = store

    def checkpoint(self, workspace: str, thread: str, reason: str, new_lines, skip_files=(),
                   author: str | None = None) -> SessionCheckpoint:
        """Checkpoint `workspace` with `new_lines(state)` (a session's lines after the thread's
        stored history) at the head of `thread`, in one move; a parallel writer makes it read
        the lines again and retry."""
        from agentcas.harnesses.session_checkpoint import session_checkpoint
        return session_checkpoint(self._store, workspace, thread, reason, new_lines, skip_files, author)

    def rewind(self, thread: str, rev: str, only: str | None = None,
               workspace: str | None = None) -> RewindResult:
        """Rewind a session's workspace (after checkpointing it: `undo`) and/or conversation
        (a forked session the harness resumes) to checkpoint `rev`."""
        from agentcas.harnesses.rewind import rewind
        return rewind(self._store, thread, rev, only, workspace)

    def resume(self, thread: str, at: str | None = None, cwd: str | None = None) -> SessionPlacement:
        """Write a thread's stored session where this machine's harness resumes it, under its
        own id; ConflictError (exit 3) if a different file is there."""
        from agentcas.harnesses.rewind import resume
        return resume(self._store, thread, at, cwd)
