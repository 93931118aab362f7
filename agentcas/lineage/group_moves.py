"""Group moves: several refs moved together, with in-memory content (the LangGraph saver's writes).

A `GroupWriter` prepares content, then lands a plan through lineage/moves.py's engine
(`Mover`), for a plan that touches more than one ref (a put that keeps the old head as
a branch, a copy of every ref of a thread, a rewrite):
1. Under a lease, content is prepared first: in-memory files become blobs and trees
   (`store_tree`), JSONL records become chunks (`prepare_records`); their objects wait
   in memory (a large write flushes batches early, still under the lease).
2. `land(plan)` runs `plan(view)` against a metadata snapshot. The view reads refs
   (remembering each state it read), links records onto a history and builds
   checkpoints (their objects join the waiting ones), and queues ref moves, each a
   compare-and-swap from the state the view shows (which includes moves queued before).
   Its `Landing`: the queued moves, the waiting objects, what the plan relies on, and
   every ref it read (all must be unchanged when it lands).
3. The engine stores the objects, checks what the plan relies on and lands the moves in
   one metadata transaction; a ref that moved meanwhile aborts it (nothing lands) and
   the plan runs again on a new snapshot, as it does when the plan itself raises
   `LostRace` (it saw a state it cannot build on).

Content cut against what the writer read before the plan (the LangGraph saver's put: its
records carry their places in the history they continue) lands with `prepare_and_land`:
each attempt, the first and every one after a lost race, prepares the content again.

On an embedded store the writer starts with a `SweepWatch` instead of a lease (the
engine then lands objects and refs in one transaction); content large enough to be
stored early makes it take the lease.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from typing import TypeVar

from agentcas.cas import framing
from agentcas.cas.backends import Backends
from agentcas.cas.digest import Digest, hash_blob
from agentcas.cas.leases import Lease, SweepWatch
from agentcas.cas.objects import Checkpoint, ChunkList, ChunkRef, HistoryPosition, Tree, TreeEntry
from agentcas.cas.source import ObjectSource, unframe_verified
from agentcas.cas.writer import BATCH_BYTES
from agentcas.lineage import checkpoints, rollout
from agentcas.lineage.moves import Landing, LostRace, Mover, RefMove
from agentcas.refs import threads
from agentcas.refs.names import check_thread_name
from agentcas.refs.revisions import load_checkpoint
from agentcas.refs.threads import ThreadState

_R = TypeVar("_R")


class _Overlay(ObjectSource):
    """An ObjectSource that also sees the objects waiting to be stored."""

    def __init__(self, source: ObjectSource, waiting: dict[bytes, bytes]):
        super().__init__(source.blobs)
        self.waiting = waiting

    def raw(self, digest: Digest):
        value = self.waiting.get(digest.raw)
        return value if value is not None else super().raw(digest)

    def load(self, digest: Digest, kind: int | None = None) -> bytes | None:
        value = self.waiting.get(digest.raw)
        return super().load(digest, kind) if value is None else unframe_verified(digest, value, kind)

    def has(self, digest: Digest) -> bool:
        return digest.raw in self.waiting or super().has(digest)

    def missing(self, raws) -> set[bytes]:
        return super().missing(set(raws) - self.waiting.keys())

    @contextmanager
    def reading(self, buffers: bool = False):
        yield self  # the waiting objects stay visible (no pinned snapshot)


def refs_under(txn, prefix: str) -> list[tuple[str, ThreadState]]:
    """(name, state) of ref `prefix` and of every ref below it (`prefix/...`), by name."""
    out: list[tuple[str, ThreadState]] = []
    for key, _ in txn.scan("refs", threads.PREFIX + prefix.encode("utf-8")):
        name = bytes(key)[len(threads.PREFIX):].decode("utf-8")
        if name == prefix or name.startswith(prefix + "/"):
            state = threads.read_thread(txn, name)
            if state is not None:  # a listed row is never absent
                out.append((name, state))
    return out


class GroupView:
    """What a plan may do: read refs and checkpoints, link records, build checkpoints, queue moves."""

    def __init__(self, txn, objects: _Overlay, author_runtime: Callable[[], tuple[str, dict]]):
        self._txn = txn
        self.objects = objects
        self._now_runtime = author_runtime
        self.read: dict[str, ThreadState | None] = {}    # ref -> the state the snapshot showed
        self.current: dict[str, ThreadState | None] = {}  # ref -> its state after the queued moves
        self.moves: list[RefMove] = []
        self.needed: set[bytes] = set()
        self._checkpoints: dict[bytes, Checkpoint] = {}

    def thread(self, name: str) -> ThreadState | None:
        if name in self.current:
            return self.current[name]
        state = self.read[name] = self.current[name] = threads.read_thread(self._txn, name)
        return state

    def threads(self, prefix: str) -> dict[str, ThreadState]:
        """Ref `prefix` and every ref below it (`prefix/...`), as the queued moves leave them."""
        for name, state in refs_under(self._txn, prefix):
            if name not in self.current:
                self.read[name] = self.current[name] = state
        return {name: state for name, state in sorted(self.current.items())
                if state is not None and (name == prefix or name.startswith(prefix + "/"))}

    def checkpoint(self, digest: Digest) -> Checkpoint:
        found = self._checkpoints.get(digest.raw)
        return found if found is not None else load_checkpoint(self.objects, digest)

    def link(self, base: HistoryPosition, prepared: list) -> HistoryPosition:
        """Continue the history at `base` with prepared records; the new position."""
        return self.link_marked(base, prepared, ())[0]

    def link_marked(self, base: HistoryPosition, prepared: list, marks) -> tuple[HistoryPosition, list]:
        """`link`, also returning the position after each of `marks` new records (ascending
        counts), e.g. a checkpoint's own position inside the segment that also holds the
        records after it: (new head, [positions])."""
        if not prepared:
            return base, [base for _ in marks]
        if base.segment is not None:
            self.needed.add(base.segment.raw)
        head, segments, positions = rollout.link_segments_at(self.objects, base, prepared, marks)
        self.objects.waiting.update(segments)
        return head, positions

    def commit(self, thread: str, tree: Digest, parents: tuple, reason: str, history: HistoryPosition,
               author: str, created_at: str | None = None) -> Digest:
        """Build a checkpoint object (stored before the refs move); its id."""
        now, runtime = self._now_runtime()
        digest, cp, framed = checkpoints.build_checkpoint(self.objects, tree, tuple(parents), thread, reason,
                                                          author, created_at or now, runtime, history,
                                                          load=self.checkpoint)
        self._checkpoints[digest.raw] = cp
        self.objects.waiting[digest.raw] = framed
        self.needed.add(tree.raw)
        self.needed.update(p.raw for p in parents)
        if history.segment is not None:
            self.needed.add(history.segment.raw)
        return digest

    def set_thread(self, name: str, old: ThreadState | None, new: ThreadState | None, action: str,
                   message: str = "", history_implied: bool = False) -> bool:
        """Queue a compare-and-swap of ref `name` from `old` to `new` (None: absent / delete);
        False (nothing queued) if the view shows another state. `history_implied`: `new.history`
        is `new.checkpoint`'s own (the reflog row leaves it out, as a commit's does)."""
        if self.thread(name) != old:
            return False
        check_thread_name(name)
        if history_implied and (new is None or new.checkpoint is None
                                or self.checkpoint(new.checkpoint).history != new.history):
            raise ValueError(f"the history of {name}'s new state is not its checkpoint's own")
        self.moves.append((name, old, new, action, message, history_implied))
        self.current[name] = new
        if new is not None and new.checkpoint is not None:
            self.needed.add(new.checkpoint.raw)
        return True


class GroupWriter:
    """Content first, then `land(plan)`; a context manager holding the writer's lease
    (or, on an embedded store, its SweepWatch: see the module doc)."""

    optimistic = True  # go without a lease where one transaction holds objects and refs

    def __init__(self, backends: Backends, what: str, author_runtime: Callable[[], tuple[str, dict]]):
        self.backends = backends
        self.lease = Lease(backends.meta, what)
        self.mover = Mover(backends, self.lease)  # its watch is set while the writer goes without a lease
        self.author_runtime = author_runtime
        self.waiting: dict[bytes, bytes] = {}
        self._waiting_bytes = 0
        self.needed: set[bytes] = set()

    def __enter__(self) -> GroupWriter:
        # Taken before anything stored is looked at, as every writer's lease (Lease.__enter__).
        if self.optimistic and self.backends.embedded is not None:
            watch = SweepWatch()
            with self.backends.meta.reader() as txn:
                if watch.start(txn):
                    self.mover.watch = watch
                    return self
        self.lease.__enter__()
        return self

    def __exit__(self, *exc):
        return self.lease.__exit__(*exc)

    def _add(self, digest: Digest, framed: bytes) -> None:
        if digest.raw in self.waiting:
            return
        self.waiting[digest.raw] = framed
        self._waiting_bytes += len(framed)
        if self._waiting_bytes >= BATCH_BYTES:
            self._flush()

    def _flush(self) -> None:
        self.mover.hold_lease()  # objects stored before the landing are a lease's to protect
        self.lease.refresh()
        self.backends.source.put_many(self.waiting)
        self.needed.update(self.waiting)  # stored early: gc must not have taken them by the landing
        self.waiting, self._waiting_bytes = {}, 0
    def store_tree(self, files: dict) -> Digest:
        """In-memory files ('dir/name' -> bytes, or a stored file's TreeEntry to reuse it) as
        blobs and trees; the root tree's id."""
        dirs: dict[str, list] = {"": []}
        for path in sorted(files):
            parts = path.split("/")
            for depth in range(1, len(parts)):
                parent, name, here = "/".join(parts[:depth - 1]), parts[depth - 1], "/".join(parts[:depth])
                if here not in dirs:
                    dirs[here] = []
                    dirs[parent].append((name, None))
            data, where, name = files[path], "/".join(parts[:-1]), parts[-1]
            if isinstance(data, TreeEntry):  # a stored file, reused by id
                if data.size:
                    self.needed.add((data.chunks or data.id).raw)
                dirs[where].append((name, TreeEntry(name, "file", data.id, data.mode, data.size, data.chunks)))
            elif not data:  # the empty file: no chunk at all (as a commit stores it)
                dirs[where].append((name, TreeEntry(name, "file", hash_blob(b""))))
            else:
                dirs[where].append((name, self._file_entry(name, data)))
        ids: dict[str, Digest] = {}
        for rel in sorted(dirs, key=lambda d: d.count("/") + (1 if d else 0), reverse=True):
            tree = Tree.of(entry if entry is not None else
                           TreeEntry(name, "dir", ids[f"{rel}/{name}" if rel else name])
                           for name, entry in dirs[rel])
            digest = tree.digest()
            self._add(digest, framing.frame(framing.KIND_TREE, tree.encode()))
            ids[rel] = digest
        return ids[""]

    def _file_entry(self, name: str, data: bytes) -> TreeEntry:
        from agentcas.cas import chunking  # lazy: pyfastcdc is for writers (reading commands never load it)
        pieces = [data] if len(data) <= chunking.MAX_SIZE else [bytes(p) for p in chunking.cut(data)]
        refs = []
        for piece in pieces:
            digest = hash_blob(piece)
            self._add(digest, framing.frame(framing.KIND_CHUNK, piece, level=framing.FILE_ZSTD_LEVEL))
            refs.append(ChunkRef(digest, len(piece)))
        if len(refs) < 2:
            return TreeEntry(name, "file", refs[0].id, size=len(data))
        chunk_list = ChunkList(tuple(refs))
        list_id = chunk_list.digest()
        self._add(list_id, framing.frame(framing.KIND_CHUNKLIST, chunk_list.encode()))
        return TreeEntry(name, "file", hash_blob(data), size=len(data), chunks=list_id)

    def prepare_records(self, data: bytes) -> list:
        """Chunk JSONL records for a later `GroupView.link`."""
        return rollout.prepare(data, self._add)

    def land(self, plan: Callable[[GroupView], object]):
        """Plan on a snapshot, store, check, one compare-and-swap transaction; `plan`'s result.
        A lost race re-plans (the waiting content is kept; only what the plan built is redone)."""
        content = dict(self.waiting)
        return self._land_attempts(lambda: (dict(content), plan))

    def prepare_and_land(self, prepare: Callable[[], Callable[[GroupView], _R]]) -> _R:
        """`land`, with content cut against what it read: each attempt runs `prepare()`,
        which reads what it needs, prepares its content through this writer and returns the
        plan. A lost race (the plan raising LostRace, the refs having moved since `prepare`
        read them, or a lost landing) runs `prepare` again: the content is never reused."""
        def fresh() -> tuple[dict, Callable[[GroupView], _R]]:
            self.waiting, self._waiting_bytes = {}, 0
            plan = prepare()
            return self.waiting, plan

        return self._land_attempts(fresh)  # what `plan` returned

    def _land_attempts(self, content_and_plan: Callable[[], tuple[dict, Callable[[GroupView], object]]]):
        """The move engine over attempts that each take (the objects to store, the plan) from
        `content_and_plan()`, run the plan on a metadata snapshot and land what it moved."""
        def attempt(lost: LostRace | None) -> Landing:
            waiting, plan = content_and_plan()
            with self.backends.meta.reader() as txn:
                view = GroupView(txn, _Overlay(self.backends.source, waiting), self.author_runtime)
                result = plan(view)
            return Landing(view.moves, waiting, self.needed | view.needed, "write", unchanged=view.read,
                           result=result)

        landed = self.mover.run(attempt, f"{self.lease.what}: the refs", point="group.before_land")
        assert landed is not None  # a group attempt always lands (its objects, if no ref moves)
        return landed.result
