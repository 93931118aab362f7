"""The fork tree: which thread was forked from which, as `agentcas lineage` shows it.

Each thread with a `forked_from` whose parent still exists hangs below that parent;
the others are roots, shown by name. Children are ordered by name. A thread on a fork
cycle (A forked from B forked from A, possible after deletes and re-creates) is never
reached from a root: it is shown as a root of its own, from its smallest name, and a
node never repeats a thread already on its path.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from agentcas.errors import NotFound
from agentcas.refs.threads import ForkOrigin, ThreadState
from agentcas.result import Result


@dataclass(frozen=True)
class LineageNode(Result):
    """A thread in the fork tree, with the threads forked from it."""

    thread: str
    checkpoint: str | None
    records: int
    forked_from: ForkOrigin | None
    children: list["LineageNode"] = field(default_factory=list)


@dataclass(frozen=True)
class Lineage(Result):
    """The fork tree of the store's threads (or of one thread)."""

    threads: list[LineageNode]


def fork_tree(states: list[tuple[str, ThreadState]], thread: str | None = None) -> Lineage:
    """The fork tree of (name, state) threads; with `thread`, that thread's subtree only."""
    by_name = dict(states)
    children: dict[str, list[str]] = {}
    roots = []
    for name, state in states:
        parent = state.forked_from.thread if state.forked_from else None
        if parent in by_name and parent != name:
            children.setdefault(parent, []).append(name)
        else:
            roots.append(name)

    def node(name: str, path: tuple = ()) -> LineageNode:
        state = by_name[name]
        return LineageNode(name, None if state.checkpoint is None else state.checkpoint.hex(),
                           state.history.seq, state.forked_from,
                           [node(c, path + (name,)) for c in sorted(children.get(name, [])) if c not in path])

    if thread is not None:
        if thread not in by_name:
            raise NotFound(f"no thread named {thread!r}")
        return Lineage([node(thread)])
    trees = [node(r) for r in sorted(roots)]
    reached: set[str] = set()

    def mark(tree: LineageNode) -> None:
        stack = [tree]
        while stack:
            item = stack.pop()
            reached.add(item.thread)
            stack.extend(item.children)

    for tree in trees:
        mark(tree)
    for name in sorted(by_name):  # on a fork cycle: shown from its smallest name
        if name not in reached:
            trees.append(node(name))
            mark(trees[-1])
    return Lineage(trees)
