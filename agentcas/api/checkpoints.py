"""`store.checkpoints`: commit a workspace, show, list files, diff, check out, scan.

A commit is workspace/commit.py's; a checkout restores a tree into a new directory
(workspace/restore.py); the rest reads checkpoints (refs/revisions.py) and their trees.
"""

from __future__ import annotations

import os
from collections.abc import Container, Iterable
from typing import TYPE_CHECKING

from agentcas.api.results import (
    CheckoutResult,
    CheckpointInfo,
    CommitResult,
    DiffResult,
    FileInfo,
    FileResize,
    FileSize,
    RecordsDiff,
    ScanReport,
)
from agentcas.cas.digest import Digest
from agentcas.cas.objects import Checkpoint
from agentcas.errors import NotFound
from agentcas.lineage import rollout
from agentcas.lineage.checkpoints import default_author, runtime_description  # noqa: F401 - part of the API
from agentcas.refs import revisions

if TYPE_CHECKING:
    from agentcas.api import Progress
    from agentcas.repository import Store


class Checkpoints:
    """The checkpoints of a store (`store.checkpoints`)."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._backends = store.backends

    def commit(self, workspace: str, reason: str, thread: str = "main", rollout_file: str | None = None,
               expect: str | None = None, allow_secrets: Iterable[str] = (), author: str | None = None,
               progress: Progress | None = None) -> CommitResult:
        """Snapshot `workspace` (and the new tail of `rollout_file`) as a checkpoint on `thread`."""
        from agentcas.workspace.commit import commit_workspace
        return commit_workspace(self._backends, self._store.path, workspace, reason, thread, rollout_file, expect,
                                allow_secrets, author, progress)

    def get(self, rev: str) -> tuple[Digest, Checkpoint]:
        """The checkpoint `rev` names: (id, verified Checkpoint)."""
        with self._backends.meta.reader() as txn:
            digest = revisions.resolve(txn, self._backends.source, rev)
        return digest, revisions.load_checkpoint(self._backends.source, digest)

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
        with self._backends.source.reading() as objects:
            return [FileInfo(path, entry.size, entry.mode, entry.id.hex())
                    for path, entry in list_files(objects, cp.tree) if entry.type == "file"]

    def tree_files(self, tree: Digest, content: bool = True) -> dict:
        """Every file under `tree` by '/'-separated path: its verified bytes, or (without
        `content`) its TreeEntry."""
        from agentcas.workspace.restore import list_files, read_file
        with self._backends.source.reading() as objects:
            return {path: read_file(objects, entry, path) if content else entry
                    for path, entry in list_files(objects, tree) if entry.type == "file"}

    def reachable(self, heads: Iterable[Digest | None],
                  known: Container[bytes] = frozenset()) -> list[tuple[Digest, Checkpoint]]:
        """Checkpoints reachable from `heads` along all parents, stopping at `known` raw ids
        (only read, never copied); each once, verified."""
        from agentcas.lineage.checkpoints import reachable
        with self._backends.source.reading() as objects:
            return reachable(objects, heads, known)

    def diff(self, rev1: str, rev2: str) -> DiffResult:
        """Files added, removed and changed, and how the two histories compare."""
        from agentcas.workspace.restore import compare_trees  # lazy: restore pulls in shutil and threads
        d1, c1 = self.get(rev1)
        d2, c2 = self.get(rev2)
        with self._backends.source.reading() as objects:
            added, removed, changed = compare_trees(objects, c1.tree, c2.tree)
            common = rollout.common_prefix(self._store.history.history(objects), c1.history, c2.history)
        records = RecordsDiff(c1.history.seq, c2.history.seq, common, c2.history.seq - common,
                              [common, c2.history.seq], c1.history.seq - common)
        return DiffResult(d1.hex(), d2.hex(), [FileSize(*f) for f in added], [FileSize(*f) for f in removed],
                          [FileResize(*f) for f in changed], records)

    def checkout(self, rev: str, dest: str, progress: Progress | None = None) -> CheckoutResult:
        """Restore checkpoint `rev` into `dest`, which must not exist."""
        from agentcas.lineage.tail import rollout_file_pieces
        from agentcas.workspace.restore import restore_tree  # lazy: only checkout writes files
        digest, cp = self.get(rev)
        open_effects = self._store.effects.after_checkpoint(rev)  # what restoring files does not undo
        mark = cp.rollout_file  # the rollout file committed with it, written back where it was
        extra = None if mark is None or mark.path is None else \
            (mark.path, rollout_file_pieces(self._backends.source, cp.history, mark))
        count = restore_tree(self._backends.source, cp.tree, dest, progress, extra)
        return CheckoutResult(digest.hex(), cp.tree.hex(), os.path.abspath(dest), count, open_effects,
                              None if extra is None else extra[0])

    def scan(self, rev: str) -> ScanReport:
        """Likely secrets in REV's files and history (a thread: its whole history), by the
        commit's rules."""
        from agentcas.exchange.secret_scan import file_findings, history_findings
        with self._backends.meta.reader() as txn:
            try:
                history, digest, thread = revisions.source_state(txn, self._backends.source, rev)
            except NotFound:
                raise NotFound(f"no thread or checkpoint named {rev!r}") from None
        with self._backends.source.reading() as objects:
            tree = None if digest is None else revisions.load_checkpoint(objects, digest).tree
            files = [] if tree is None else file_findings(objects, tree)
            records = history_findings(objects, history, thread)
        return ScanReport(None if digest is None else digest.hex(), thread, history.seq,
                          not files and not records,
                          [{"path": f.path, "line": f.line, "rule": f.rule} for f in files],
                          [r.to_json() for r in records])
