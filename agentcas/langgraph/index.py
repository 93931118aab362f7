"""The index of a LangGraph thread's checkpoints, per agentcas thread (a "line" set).

For each agentcas thread the saver keeps in memory its refs (the thread and its kept
branches), every commit reached from them with its parents, and which commits are saver
checkpoints (`Node`: LangGraph id, history position, tree) with `by_id` from LangGraph id to
the newest version of that checkpoint (a version that seals writes is a child of the one
before it, same id). Built by walking parents from every head; when heads only moved
forward (the usual case) a refresh walks just the new commits and indexes them, O(new);
when a head left its line (a rewrite, a deleted branch) the unreachable commits are dropped
and the ids re-indexed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from agentcas.cas.digest import Digest
from agentcas.cas.objects import HistoryPosition
from agentcas.errors import IntegrityError
from agentcas.langgraph.names import BRANCHES, is_branch_of, parse_reason, thread_root
from agentcas.langgraph.records import CorruptCheckpoint
from agentcas.refs.threads import ThreadState

if TYPE_CHECKING:
    from agentcas.repository import Store


@dataclass(slots=True)
class Node:
    """One LangGraph checkpoint as the index knows it."""

    digest: Digest
    lg_id: str
    parents: tuple[Digest, ...]
    history: HistoryPosition
    tree: Digest
    created_at: str
    sealed: bool = False  # a version made by put_writes sealing writes into it (reason + SEALED)


@dataclass
class Line:
    """The index of one agentcas thread: its refs (thread + branches) and checkpoints."""

    name: str
    refs: dict[str, ThreadState] = field(default_factory=dict)  # ref name -> its state
    nodes: dict[bytes, Node] = field(default_factory=dict)      # digest raw -> LangGraph checkpoint
    parents: dict[bytes, tuple[Digest, ...]] = field(default_factory=dict)  # digest raw -> parents (all walked)
    by_id: dict[str, bytes] = field(default_factory=dict)       # LangGraph id -> digest raw

    def head(self) -> ThreadState | None:
        """The state of the thread itself (not its branches); None once deleted."""
        return self.refs.get(self.name)

    def newest(self, digest: Digest | None) -> bytes | None:
        """The newest LangGraph checkpoint at or below `digest` (skipping foreign commits)."""
        while digest is not None:
            if digest.raw in self.nodes:
                return digest.raw
            parents = self.parents.get(digest.raw, ())
            digest = parents[0] if parents else None
        return None

    def first_version(self, node: Node) -> Node:
        """The oldest agentcas checkpoint of `node`'s LangGraph checkpoint (sealed writes make
        newer versions: same tree, the writes in their history)."""
        while node.sealed and node.parents and node.parents[0].raw in self.nodes \
                and self.nodes[node.parents[0].raw].lg_id == node.lg_id:
            node = self.nodes[node.parents[0].raw]
        return node

    def lg_parent(self, node: Node) -> str | None:
        """The LangGraph id of `node`'s parent checkpoint, if it is in this thread."""
        first = self.first_version(node)
        if first.parents and first.parents[0].raw in self.nodes:
            return self.nodes[first.parents[0].raw].lg_id
        return None

    def membership(self) -> dict[bytes, list[tuple[str, ThreadState]]]:
        """For every checkpoint, the refs whose first-parent chain holds it (one walk per ref)."""
        out: dict[bytes, list[tuple[str, ThreadState]]] = {}
        for ref in sorted(self.refs, key=lambda r: (r != self.name, r)):
            state = self.refs[ref]
            digest = state.checkpoint
            while digest is not None:
                out.setdefault(digest.raw, []).append((ref, state))
                parents = self.parents.get(digest.raw, ())
                digest = parents[0] if parents else None
        return out

    def lines_through(self, node: Node) -> list[tuple[str, ThreadState]]:
        """Refs whose first-parent chain passes through `node` (the thread itself first)."""
        out: list[tuple[str, ThreadState]] = []
        for ref in sorted(self.refs, key=lambda r: (r != self.name, r)):
            state = self.refs[ref]
            digest = state.checkpoint
            while digest is not None:
                if digest.raw == node.digest.raw:
                    out.append((ref, state))
                    break
                known = self.nodes.get(digest.raw)
                if known is not None and known.history.seq < node.history.seq:
                    break  # histories only grow along parents: this line left `node` behind
                parents = self.parents.get(digest.raw, ())
                digest = parents[0] if parents else None
        return out


def _index(line: Line, node: Node) -> None:
    """Point `node`'s LangGraph id at it unless a newer version of that checkpoint holds it."""
    other = line.by_id.get(node.lg_id)
    if other is None or other == node.digest.raw:
        line.by_id[node.lg_id] = node.digest.raw
        return
    held = line.nodes.get(other)
    # A sealed version is a child of the version before it: the descendant wins.
    if held is None or (node.parents and node.parents[0].raw == other) or \
            (held.history.seq, held.created_at) < (node.history.seq, node.created_at):
        line.by_id[node.lg_id] = node.digest.raw


def _mark(line: Line) -> None:
    """Drop the commits no ref of the line reaches any more."""
    reached: set[bytes] = set()
    stack = [s.checkpoint.raw for s in line.refs.values() if s.checkpoint is not None]
    while stack:
        raw = stack.pop()
        if raw in reached:
            continue
        reached.add(raw)
        stack.extend(p.raw for p in line.parents.get(raw, ()))
    line.nodes = {raw: n for raw, n in line.nodes.items() if raw in reached}
    line.parents = {raw: p for raw, p in line.parents.items() if raw in reached}


class CheckpointIndex:
    """The lines of one store, each brought up to date with its refs when asked for."""

    def __init__(self, store: Store):
        self.store = store
        self.lines: dict[str, Line] = {}

    def refresh(self, name: str, states: dict[str, ThreadState] | None = None) -> Line:
        """The index of agentcas thread `name`, brought up to date with its refs (`states`:
        the refs under it, if already read)."""
        if states is None:
            states = self.store.threads.under(name)
        refs = {ref: state for ref, state in states.items() if ref == name or is_branch_of(ref, name)}
        line = self.lines.get(name)
        if line is None:
            line = self.lines[name] = Line(name)
        if refs == line.refs:
            return line
        old_heads = {s.checkpoint.raw for s in line.refs.values() if s.checkpoint is not None}
        heads = [s.checkpoint for s in refs.values() if s.checkpoint is not None]
        added: list[Node] = []
        boundary: set[bytes] = set()
        try:
            walked = self.store.checkpoints.reachable(heads, line.parents.keys())
        except IntegrityError as exc:
            raise CorruptCheckpoint(f"LangGraph checkpoints of agentcas thread {name}: {exc}") from None
        for digest, cp in walked:
            line.parents[digest.raw] = cp.parents
            boundary.update(p.raw for p in cp.parents)
            parsed = parse_reason(cp.reason)
            if parsed is not None:
                lg_id, sealed = parsed
                node = Node(digest, lg_id, cp.parents, cp.history, cp.tree, cp.created_at, sealed)
                line.nodes[digest.raw] = node
                added.append(node)
        line.refs = dict(refs)
        if old_heads <= {d.raw for d in heads} | boundary:
            # Heads only moved forward (the usual case): index just what was added, O(new).
            for node in reversed(added):  # oldest first, so a sealed version replaces its original
                _index(line, node)
        else:
            _mark(line)  # a head left its line (a rewrite, a deleted branch): re-index
            line.by_id = {}
            for node in sorted(line.nodes.values(), key=lambda n: (n.history.seq, n.created_at)):
                _index(line, node)
        return line

    def lines_of(self, thread_id: str) -> dict[str, Line]:
        """Every agentcas thread (root and namespaces) of a LangGraph thread, refreshed."""
        root = thread_root(thread_id)
        states = self.store.threads.under(root)
        names = [n for n in states if BRANCHES not in n[len(root):]]
        return {n: self.refresh(n, {k: v for k, v in states.items() if k == n or k.startswith(n + BRANCHES)})
                for n in names}

    def forget(self, name: str) -> None:
        """Drop the index of agentcas thread `name` (rebuilt from the store when next asked for)."""
        self.lines.pop(name, None)

    def forget_under(self, root: str) -> None:
        """Drop the index of `root` and of every thread below it."""
        for name in [n for n in self.lines if n == root or n.startswith(root + "/")]:
            del self.lines[name]
