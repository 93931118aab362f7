"""First-parent chains of checkpoints, searched in O(log n) with skip pointers.

A checkpoint committed on top of a parent gets generation = parent's + 1 and, from
generation 2, a skip pointer to its first-parent ancestor at generation
skip_index(generation) (the same deterministic skip list as rollout segments). Along a
first-parent chain the history seq never decreases (a commit records its thread's
history, which only grows from its parent's, or is reset to a checkpoint's by
revert/branch/fork), so "the newest checkpoint at or before seq S" is found by walking
back from the tip and jumping to the skip target whenever it still lies after S.
Checkpoints without an index (generation 0) are walked parent by parent.
"""

from __future__ import annotations

import os
from collections.abc import Container, Iterable
from dataclasses import dataclass

from agentcas import __version__
from agentcas.cas import framing
from agentcas.cas.digest import Digest
from agentcas.cas.objects import Checkpoint, HistoryPosition
from agentcas.cas.source import ObjectSource
from agentcas.errors import IntegrityError, NotFound
from agentcas.lineage.rollout import SkipLinks, search_skip_list, skip_index
from agentcas.refs.revisions import load_checkpoint
from agentcas.result import Result


@dataclass(frozen=True)
class CommitResult(Result):
    """A commit that landed (workspace/commit.py): the checkpoint, its tree and history, what it stored."""

    checkpoint: str
    tree: str
    thread: str
    parents: list[str]
    history: HistoryPosition
    files: int
    bytes: int
    cached_files: int
    new_objects: int
    new_bytes: int
    appended_records: int
    unchanged_files: int = 0  # the cached ones and those read again that equal the previous tree's

@dataclass(frozen=True)
class SessionCheckpoint:
    """A harness session's checkpoint that landed (workspace/commit.py `commit_session`):
    the workspace's tree and the session's new lines, in one move."""

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


CHECKPOINT_LINKS = SkipLinks()  # checkpoints: (generation, skip, first parent)


def links_of(checkpoint: Checkpoint) -> tuple:
    return checkpoint.generation, checkpoint.skip, checkpoint.parents[0] if checkpoint.parents else None


def index_for_child(objects: ObjectSource, parent: Digest | None, load=None,
                    memo: bool = False) -> tuple[int, Digest | None]:
    """(generation, skip) for a new checkpoint whose first parent is `parent`.

    `load(digest) -> Checkpoint` may replace load_checkpoint (a caching reader); `memo`
    (writers) keeps the links of what it loads in CHECKPOINT_LINKS for the next commit."""
    if parent is None:
        return 0, None
    load = load or (lambda digest: load_checkpoint(objects, digest))

    def links(digest: Digest) -> tuple:
        if memo:
            return CHECKPOINT_LINKS.get(digest.raw, lambda raw: links_of(load(digest)))
        return links_of(load(digest))
    generation, _, first_parent = links(parent)
    if first_parent is not None and generation == 0:
        return 0, None  # the parent's chain is not indexed, so neither is the child
    generation += 1
    if generation < 2:
        return generation, None
    return generation, search_skip_list(links, parent, skip_index(generation))


def runtime_description() -> dict:
    """The runtime a checkpoint records (agentcas, Python, OS): facts, never re-executed."""
    import platform  # lazy: only commits describe their runtime
    return {"agentcas": __version__, "python": platform.python_version(),
            "os": f"{platform.system()} {platform.release()} {platform.machine()}"}


def default_author() -> str:
    """A checkpoint's author: $AGENTCAS_AUTHOR, else user@host."""
    name = os.environ.get("AGENTCAS_AUTHOR")
    if name:
        return name
    import getpass  # lazy (it imports termios): only a commit without $AGENTCAS_AUTHOR needs it
    try:
        return f"{getpass.getuser()}@{os.uname().nodename}"  # socket.gethostname(), without socket
    except Exception:  # noqa: BLE001 - no user database in some containers
        return "unknown"


def build_checkpoint(objects: ObjectSource, tree: Digest, parents: tuple, thread: str, reason: str,
                     author: str, created_at: str, runtime: dict, history: HistoryPosition,
                     load=None, rollout_file=None) -> tuple[Digest, Checkpoint, bytes]:
    """A new checkpoint on `parents` with its skip index: (id, checkpoint, framed object).

    The one place a checkpoint object is made for a ref move (a commit, a group write);
    its links are remembered in CHECKPOINT_LINKS for the next commit on top of it.
    `load` as in `index_for_child` (a writer's view that also sees objects not yet stored).
    `rollout_file`: where `history` stands in a committed rollout file (cas.objects.RolloutFile).
    """
    generation, skip = index_for_child(objects, parents[0] if parents else None, load, memo=True)
    cp = Checkpoint(tree, tuple(parents), thread, reason, author, created_at, runtime, history,
                    generation=generation, skip=skip, rollout_file=rollout_file)
    body, digest = cp.encode_with_id()
    CHECKPOINT_LINKS.put(digest.raw, links_of(cp))
    return digest, cp, framing.frame(framing.KIND_CHECKPOINT, body)


def ancestor_at(objects: ObjectSource, digest: Digest, checkpoint: Checkpoint, generation: int,
                load=None) -> Digest | None:
    """The first-parent ancestor of `digest` (whose checkpoint is `checkpoint`) at
    `generation` (None if the chain is not indexed)."""
    load = load or (lambda digest: load_checkpoint(objects, digest))
    return search_skip_list(lambda d: links_of(checkpoint if d == digest else load(d)), digest, generation)


def newest_at_or_before(objects: ObjectSource, tip: Digest | None, seq: int) -> Digest | None:
    """The newest checkpoint on `tip`'s first-parent chain whose history has <= seq records."""
    node_id = tip
    while node_id is not None:
        node = load_checkpoint(objects, node_id)
        if node.history.seq <= seq:
            return node_id
        if node.skip is not None and load_checkpoint(objects, node.skip).history.seq > seq:
            node_id = node.skip
        else:
            node_id = node.parents[0] if node.parents else None
    return None


def check_index(objects: ObjectSource, digest: Digest, checkpoint: Checkpoint, cache: dict | None = None) -> None:
    """Raise IntegrityError unless the checkpoint's (generation, skip) follow from its first
    parent's, as index_for_child would have written them (absent is always allowed).

    `cache` (raw id -> Checkpoint, kept by the caller across calls) saves re-reading the
    ancestors that many checkpoints' skip searches share."""
    if cache is None:
        cache = {}

    def load(node: Digest) -> Checkpoint:
        found = cache.get(node.raw)
        if found is None:
            if len(cache) > 16384:
                cache.clear()
            found = cache[node.raw] = load_checkpoint(objects, node)
        return found

    if checkpoint.generation == 0:
        return
    if not checkpoint.parents:
        raise IntegrityError(f"checkpoint {digest.hex()} has generation {checkpoint.generation} "
                             "but no parent")
    try:
        expected = index_for_child(objects, checkpoint.parents[0], load)
    except (NotFound, IntegrityError):
        return  # a missing or damaged ancestor: the closure walk reports it where it is
    if (checkpoint.generation, checkpoint.skip) != expected:
        raise IntegrityError(f"checkpoint {digest.hex()} has generation {checkpoint.generation} and skip "
                             f"{checkpoint.skip.hex() if checkpoint.skip else None}, but its first parent "
                             f"implies {expected[0]} and {expected[1].hex() if expected[1] else None}")


def reachable(objects: ObjectSource, heads: Iterable[Digest | None],
              known: Container[bytes] = frozenset()) -> list[tuple[Digest, Checkpoint]]:
    """Checkpoints reachable from `heads` along all parents, stopping at `known` raw ids;
    each once, verified, a head before its parents."""
    out: list[tuple[Digest, Checkpoint]] = []
    seen: set[bytes] = set()
    stack = [h for h in heads if h is not None and h.raw not in known]
    while stack:
        digest = stack.pop()
        if digest.raw in seen:
            continue
        seen.add(digest.raw)
        cp = load_checkpoint(objects, digest)
        out.append((digest, cp))
        stack.extend(p for p in reversed(cp.parents) if p.raw not in seen and p.raw not in known)
    return out
