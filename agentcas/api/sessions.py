"""`store.sessions`: a harness session checkpointed while it works, the workspace and the
session's new lines in one move (workspace/commit.py `commit_session`; the CLI's `hook`).
Rewinding a session and resuming it on this machine need the harnesses' session files:
they are harness operations over this API (agentcas/harnesses/rewind.py)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agentcas.lineage.checkpoints import SessionCheckpoint
    from agentcas.repository import Store
    from agentcas.workspace.commit import NewLines


class Sessions:
    """Checkpoint harness sessions (`store.sessions`)."""

    def __init__(self, store: Store) -> None:
        self._store = store

    def checkpoint(self, workspace: str, thread: str, reason: str, new_lines: NewLines,
                   skip_files: Iterable[str] = (), author: str | None = None) -> SessionCheckpoint:
        """Checkpoint `workspace` with `new_lines(state)` (a session's lines after the thread's
        stored history) at the head of `thread`, in one move; a parallel writer makes it read
        the lines again and retry."""
        from agentcas.workspace.commit import commit_session
        return commit_session(self._store.backends, self._store.path, workspace, thread, reason, new_lines,
                              skip_files, author)
