"""What keeps objects alive: roots, write pins, and the mark walk from the roots.

Roots, by kind:
  thread     every ref `threads/NAME`: its checkpoint with all its ancestors, and its
             history head (which may be ahead of the checkpoint).
  reflog     every reflog entry gc keeps: entries younger than --expire-reflog and the
             newest entry of each thread; the state each set (checkpoint and history)
             and the checkpoint each left.
  signature  a signature object whose checkpoint is live (`signatures` rows are keyed
             checkpoint(32) || signature id(32)).
  recent     an object written less than --grace ago, with its closure (found by the
             plan's scan of `objects`, see plan.py).
Leases (cas/leases.py: writers in progress) name no object; no sweep batch runs
while one is live (see sweep.py). A dead lease (expired, or of a dead local pid) is
dropped.

Mark: one `MarkWalker` (lineage/closure.Walker) shares a single `seen` mark set of raw
32-byte digests across all roots (a markset.MarkSet in gc: bounded memory, spilling to
disk), so each object is visited once however many threads share it. Interior objects
(checkpoints, trees, chunk lists, segments) decide what else is alive, so they are
verified against their ids; chunks are leaves and are only checked for presence. A
history is followed back through segment `base` links only, so a fork that shares the
first N records of a deleted parent keeps exactly the segments up to the one holding
record N-1 (that segment whole) and nothing after it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass

from agentcas.cas import framing
from agentcas.cas.digest import Digest
from agentcas.cas.leases import LeaseRow, read_leases
from agentcas.cas.metastore.base import MetaTxn
from agentcas.cas.objects import EMPTY_POSITION, ChunkList, HistoryPosition, Segment, Tree
from agentcas.cas.source import ObjectSource, load_object
from agentcas.errors import IntegrityError
from agentcas.lineage.closure import MarkSetLike, MissingObject, Walker
from agentcas.refs import threads
from agentcas.refs.threads import ThreadState

SIGNATURE_KEY_SIZE = 64


class GcAborted(IntegrityError):
    """A root reaches a missing or damaged object: gc deletes nothing."""


@dataclass(frozen=True)
class Root:
    """One reason for objects to be alive: a thread ref or a kept reflog state."""

    kind: str  # "thread" | "reflog"
    name: str  # "main", "main@{3}" (the reflog entry `agentcas reflog` numbers 3, 0 the newest)
    thread: str
    checkpoint: Digest | None
    history: HistoryPosition = EMPTY_POSITION
    left: bool = False  # a reflog entry's checkpoint it moved away from (not the state it set)

    def to_doc(self) -> dict:
        doc = {"kind": self.kind, "name": self.name, "thread": self.thread,
               "checkpoint": None if self.checkpoint is None else self.checkpoint.hex(),
               "seq": self.history.seq,
               "segment": None if self.history.segment is None else self.history.segment.hex()}
        if self.left:
            doc["left"] = True
        return doc

    def describe(self) -> str:
        what = "thread" if self.kind == "thread" else "reflog entry"
        return f"{what} {self.name}{' (the checkpoint it left)' if self.left else ''}"


def read_pins(txn: MetaTxn) -> list[LeaseRow]:
    """Every lease row; a damaged row aborts gc (we cannot tell whether its writer is alive)."""
    try:
        return read_leases(txn)
    except IntegrityError as exc:
        raise GcAborted(f"{exc}; gc deleted nothing (run 'agentcas fsck')") from None


def state_roots(kind: str, name: str, thread: str, state: ThreadState | None) -> list[Root]:
    if state is None or (state.checkpoint is None and state.history.segment is None):
        return []
    return [Root(kind, name, thread, state.checkpoint, state.history)]


def entry_roots(name: str, index: int, entry, older_kept: bool = False) -> list[Root]:
    """Roots of one kept reflog entry, named `NAME@{index}` as `agentcas reflog` numbers it
    (0 the newest): the state it set, and the checkpoint it left unless the next older
    entry, kept too, names that state already."""
    label = f"{name}@{{{index}}}"
    roots = state_roots("reflog", label, name, entry.new)
    if entry.old is not None and not older_kept:
        roots.append(Root("reflog", label, name, entry.old, left=True))
    return roots


def thread_roots(txn: MetaTxn) -> Iterator[Root]:
    for name, state in threads.list_threads(txn):
        yield from state_roots("thread", name, name, state)


def reflog_roots(txn: MetaTxn, reflog_cutoff: float) -> tuple[list[Root], int, int]:
    """Roots from the reflog entries gc keeps; also (entries, entries that will expire).

    An entry is kept if it is younger than the cutoff or is the newest of its thread.
    The scan is in key order, thread by thread, oldest entry first; each thread's
    entries are then numbered newest first, as `agentcas reflog` and THREAD@{N} do.
    """
    roots: list[Root] = []
    total = expiring = 0

    def judge(name: str, entries: list) -> None:
        nonlocal expiring
        newest_first = entries[::-1]
        kept = [index == 0 or entry.time >= reflog_cutoff for index, entry in enumerate(newest_first)]
        expiring += kept.count(False)
        for index, entry in enumerate(newest_first):
            if kept[index]:
                older = newest_first[index + 1] if index + 1 < len(kept) and kept[index + 1] else None
                older_kept = older is not None and older.new is not None and older.new.checkpoint == entry.old
                roots.extend(entry_roots(name, index, entry, older_kept))

    current: tuple[str, list] | None = None
    try:
        for name, entry in threads.all_reflog_entries(txn):
            total += 1
            if current is None or current[0] != name:
                if current is not None:
                    judge(*current)
                current = (name, [])
            current[1].append(entry)
    except IntegrityError as exc:
        raise GcAborted(f"{exc}; gc deleted nothing (run 'agentcas fsck')") from None
    if current is not None:
        judge(*current)
    return roots, total, expiring


def all_roots(txn: MetaTxn, reflog_cutoff: float) -> tuple[list[Root], int, int]:
    """Thread roots then reflog roots; (roots, reflog entries, reflog entries expiring)."""
    try:
        roots = list(thread_roots(txn))
    except IntegrityError as exc:
        raise GcAborted(f"{exc}; gc deleted nothing (run 'agentcas fsck')") from None
    logged, total, expiring = reflog_roots(txn, reflog_cutoff)
    return roots + logged, total, expiring


class MarkWalker(Walker):
    """closure.Walker that verifies interior objects and only checks chunks for presence.

    Trees and chunk lists, by far the most numerous interior objects, are read with a
    lean parse that extracts only the ids they name: their bytes have just been hashed
    against their ids, so they are exactly what a validating writer stored (fsck
    re-validates every object in full). A malformed one still stops gc (GcAborted).
    """

    def __init__(self, objects: ObjectSource, seen: MarkSetLike | None = None, pages=None):
        super().__init__(objects, seen, verify=True, follow_parents=True)
        self.pages = pages  # a gc.pages.PageReleaser ticked per object read, or None

    def _data(self, digest: Digest, kind: int, referrer: Digest | None) -> bytes:
        if self.pages is not None:
            self.pages.tick()
        return super()._data(digest, kind, referrer)

    def tree(self, digest: Digest, referrer: Digest | None = None) -> Iterator[tuple]:
        seen, stack = self.seen, [(digest, referrer)]
        while stack:
            current, by = stack.pop()
            if current.raw in seen:
                continue
            seen.add(current.raw)
            data = self._data(current, framing.KIND_TREE, by)
            if data[:1] != b"{":  # format 2 (packed): a full decode is as quick as the lean parse
                yield current, framing.KIND_TREE, by
                for entry in Tree.decode(data).entries:
                    if entry.type == "dir":
                        stack.append((entry.id, current))
                    elif entry.size == 0:
                        continue
                    elif entry.chunks is None:
                        yield from self._leaf(entry.id, framing.KIND_CHUNK, current)
                    else:
                        yield from self._chunk_list(entry.chunks, current)
                continue
            entries = _parse(data, current, "tree")["entries"]
            yield current, framing.KIND_TREE, by
            try:
                for entry in entries:
                    if entry["type"] == "dir":
                        stack.append((_id(entry["id"]), current))
                    elif entry["size"] == 0:
                        continue
                    elif "chunks" not in entry:
                        yield from self._leaf(_id(entry["id"]), framing.KIND_CHUNK, current)
                    else:
                        yield from self._chunk_list(_id(entry["chunks"]), current)
            except (KeyError, TypeError, ValueError):
                raise IntegrityError(f"tree {current.hex()} is malformed") from None

    def _chunk_list(self, digest: Digest, referrer: Digest) -> Iterator[tuple]:
        if digest.raw in self.seen:
            return
        self.seen.add(digest.raw)
        data = self._data(digest, framing.KIND_CHUNKLIST, referrer)
        if data[:1] != b"{":  # format 2 (packed)
            yield digest, framing.KIND_CHUNKLIST, referrer
            refs = [ref.id for ref in ChunkList.decode(data).chunks]
        else:
            doc = _parse(data, digest, "chunk list")
            yield digest, framing.KIND_CHUNKLIST, referrer
            try:
                refs = [_id(item[0]) for item in doc["chunks"]]
            except (KeyError, TypeError, ValueError, IndexError):
                raise IntegrityError(f"chunk list {digest.hex()} is malformed") from None
        for ref in refs:
            yield from self._leaf(ref, framing.KIND_CHUNK, digest)

    def _leaf(self, digest: Digest, kind: int, referrer: Digest | None, size: int | None = None,
              hasher=None):
        if digest.raw in self.seen:
            return
        self.seen.add(digest.raw)
        if self.pages is not None:
            self.pages.tick()
        if not self.objects.has(digest):
            raise MissingObject(digest, kind, referrer)
        yield digest, kind, referrer

    def root(self, root: Root) -> Iterator[tuple]:
        """Every not-yet-seen object reachable from a root, as (digest, kind, referrer)."""
        if root.checkpoint is not None:
            yield from self.checkpoint(root.checkpoint)
        if root.history.segment is not None:
            yield from self.history(root.history)


def _parse(data: bytes, digest: Digest, what: str) -> dict:
    try:
        doc = json.loads(data)
    except ValueError:
        raise IntegrityError(f"{what} {digest.hex()} is not JSON") from None
    if not isinstance(doc, dict):
        raise IntegrityError(f"{what} {digest.hex()} is malformed")
    return doc


def _id(text) -> Digest:
    """A 64-hex id from a verified object (ValueError/TypeError if it is not one)."""
    if not isinstance(text, str) or len(text) != 64:
        raise ValueError("not an id")
    return Digest(bytes.fromhex(text))


def mark_root(walker: MarkWalker, root: Root) -> int:
    """Mark everything reachable from `root`; the number of objects newly marked."""
    count = 0
    try:
        for _ in walker.root(root):
            count += 1
    except MissingObject as exc:
        raise GcAborted(f"{exc}, reachable from {root.describe()}; gc deleted nothing") from None
    except IntegrityError as exc:
        raise GcAborted(f"{exc} (reachable from {root.describe()}); gc deleted nothing") from None
    return count


def mark_signatures(txn: MetaTxn, objects: ObjectSource, seen: MarkSetLike) -> int:
    """Mark signature objects whose checkpoint is marked; the number newly marked."""
    count = 0
    for key, _ in txn.scan("signatures"):
        if len(key) < SIGNATURE_KEY_SIZE:
            continue
        checkpoint, signature = bytes(key[:32]), bytes(key[32:64])
        if checkpoint in seen and signature not in seen and objects.has(Digest(signature)):
            seen.add(signature)
            count += 1
    return count


def young_closure(walker: MarkWalker, digest: Digest, kind: int) -> Iterator[tuple]:
    """Objects reachable from a recently written object (a `recent` root)."""
    if kind == framing.KIND_CHECKPOINT:
        yield from walker.checkpoint(digest)
    elif kind == framing.KIND_TREE:
        yield from walker.tree(digest)
    elif kind == framing.KIND_SEGMENT:
        data = load_object(walker.objects, digest, kind)
        if data is not None:
            yield from walker.history(Segment.decode(data).end(digest))
    elif kind == framing.KIND_CHUNKLIST:
        if digest.raw in walker.seen:
            return
        walker.seen.add(digest.raw)
        data = load_object(walker.objects, digest, kind)
        if data is None:
            return
        yield digest, kind, None
        for ref in ChunkList.decode(data).chunks:
            yield from walker._leaf(ref.id, framing.KIND_CHUNK, digest)
    elif digest.raw not in walker.seen:
        walker.seen.add(digest.raw)
        yield digest, kind, None
