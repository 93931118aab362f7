"""The lineage page's picture: the fork tree, folded to a bounded size, laid out as SVG rows.

Folding (so a page's size does not grow with the store): the page shows a *frame*, either
the whole forest or one thread (`?root=NAME`) with its forks. The frame's top items (the
forest's roots, or the root's forks) are taken in order from the cursor; each is expanded
depth first while the page has room, at most MAX_ROWS rows in all, at most MAX_CHILDREN
forks per thread and MAX_DEPTH levels. A thread whose forks were not all shown carries a
count of the threads hidden below it and a link that unfolds it (its own frame); the
frame's top items that did not fit continue on the next page (`?after=NAME`).

Layout: one row per shown thread, in that depth-first order. A row's bar runs along the
history axis from the thread's fork point (its ForkOrigin seq; 0 for a thread that was
not forked) to its length in records, on one linear scale for the page. A fork edge runs
from the parent's row at the fork point's x down to the child's row, so the picture reads
like `git log --graph` turned sideways: where a thread left its parent, and how far each
got since.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MAX_ROWS = 200
MAX_CHILDREN = 25
MAX_DEPTH = 24
ROW_HEIGHT = 26
TOP = 30
LABEL_WIDTH = 300
TIMELINE_X = LABEL_WIDTH + 20
TIMELINE_WIDTH = 560
INFO_X = TIMELINE_X + TIMELINE_WIDTH + 20
WIDTH = INFO_X + 380
LABEL_CHARS = 38
INDENT = 12
MAX_INDENT_LEVELS = 10


@dataclass
class Row:
    """One shown thread: its place in the tree and on the page."""
    thread: str
    depth: int
    records: int
    checkpoint: str | None
    forked_from: dict | None
    parent: str | None          # the parent's name when the parent is shown on this page
    forks: int                  # every thread forked from it, directly or not
    hidden: int = 0             # threads below it that this page does not show
    y: float = 0.0
    x_start: float = 0.0
    x_end: float = 0.0
    label: str = ""
    label_x: float = 0.0


@dataclass(frozen=True)
class Edge:
    parent: str
    child: str
    x: float
    y_parent: float
    y_child: float


@dataclass
class LineageView:
    """What the lineage page draws, with the counts that say how much is folded away."""
    root: str | None
    rows: list[Row] = field(default_factory=list)
    edges: list[Edge] = field(default_factory=list)
    total_threads: int = 0
    next_after: str | None = None
    max_records: int = 0

    @property
    def height(self) -> int:
        return TOP + ROW_HEIGHT * max(len(self.rows), 1) + 10

    width = WIDTH
    timeline_x = TIMELINE_X
    timeline_width = TIMELINE_WIDTH
    info_x = INFO_X


def _subtree_sizes(trees: list[dict]) -> dict[int, int]:
    """id(node) -> number of threads below it (iterative: a fork chain may be deep)."""
    sizes: dict[int, int] = {}
    stack = [(node, False) for node in trees]
    while stack:
        node, done = stack.pop()
        if done:
            sizes[id(node)] = sum(1 + sizes[id(c)] for c in node["children"])
        else:
            stack.append((node, True))
            stack.extend((c, False) for c in node["children"])
    return sizes


def fold(lineage: dict, total_threads: int, root: str | None = None, after: str | None = None) -> LineageView:
    """The rows and edges of one page of `lineage` (Store.lineage's document; of `root` if given)."""
    trees = lineage["threads"]
    sizes = _subtree_sizes(trees)
    view = LineageView(root=root, total_threads=total_threads)

    def add(node: dict, depth: int, parent: Row | None) -> Row:
        row = Row(node["thread"], depth, node["records"], node["checkpoint"], node["forked_from"],
                  parent.thread if parent is not None else None, sizes[id(node)])
        view.rows.append(row)
        return row

    def expand(node: dict, depth: int, parent: Row | None) -> None:
        # Depth first with an explicit stack: (node, depth, parent row).
        stack = [(node, depth, parent)]
        while stack:
            item, level, above = stack.pop()
            row = add(item, level, above)
            children = item["children"]
            room = MAX_ROWS - len(view.rows) - sum(1 for _ in stack)
            take = 0 if level + 1 > MAX_DEPTH else max(0, min(len(children), MAX_CHILDREN, room))
            row.hidden = sum(1 + sizes[id(c)] for c in children[take:])
            stack.extend((c, level + 1, row) for c in reversed(children[:take]))

    if root is not None and trees:
        frame = trees[0]
        head = add(frame, 0, None)
        items, base_depth, parent = frame["children"], 1, head
    else:
        items, base_depth, parent, head = trees, 0, None, None
    start = 0
    if after is not None:
        names = [item["thread"] for item in items]
        start = names.index(after) + 1 if after in names else sum(1 for n in names if n <= after)
    shown = 0
    for item in items[start:]:
        if len(view.rows) >= MAX_ROWS:
            view.next_after = items[start + shown - 1]["thread"] if shown else None
            break
        expand(item, base_depth, parent)
        shown += 1
    if head is not None:
        head.hidden = sum(1 + sizes[id(c)] for c in items) - sum(1 for r in view.rows if r is not head)
    _lay_out(view)
    return view


def _lay_out(view: LineageView) -> None:
    """Coordinates for every row and fork edge (see the module's docstring)."""
    view.max_records = max([r.records for r in view.rows] + [r.forked_from["seq"] for r in view.rows
                                                              if r.forked_from] + [1])

    def x(seq: int) -> float:
        return round(TIMELINE_X + TIMELINE_WIDTH * min(seq, view.max_records) / view.max_records, 1)

    by_name = {}
    for index, row in enumerate(view.rows):
        row.y = TOP + ROW_HEIGHT * index + ROW_HEIGHT / 2
        start = row.forked_from["seq"] if row.forked_from else 0
        row.x_start, row.x_end = x(start), x(max(row.records, start))
        row.label_x = 8 + INDENT * min(row.depth, MAX_INDENT_LEVELS)
        room = LABEL_CHARS - 2 * min(row.depth, MAX_INDENT_LEVELS)
        row.label = row.thread if len(row.thread) <= room else row.thread[:room - 1] + "…"
        by_name[row.thread] = row
    for row in view.rows:
        if row.parent is not None and row.parent in by_name:
            above = by_name[row.parent]
            view.edges.append(Edge(row.parent, row.thread, row.x_start, above.y, row.y))
