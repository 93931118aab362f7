"""What a checkpoint needs: the objects reachable from it, streamed.

From a checkpoint: its tree, every subtree, every chunk list and chunk of every file,
and its history: the segment chain back from its HistoryPosition (following `base`
only; `skip` targets are on that chain already) and each segment's chunks. Parents
are followed only when asked (a bundle may carry one checkpoint, gc needs all).
Objects are yielded once each as (digest, kind, referrer) so a caller can explain why
an object is needed; a missing object raises MissingObject naming its referrer.
"""

from __future__ import annotations

from typing import Iterator

from agentcas.cas import framing
from agentcas.cas.digest import Digest
from agentcas.cas.objects import Checkpoint, ChunkList, HistoryPosition, Segment, Tree
from agentcas.cas.source import ObjectSource, load_object
from agentcas.errors import IntegrityError


class MissingObject(IntegrityError):
    """A referenced object is not in the store."""

    def __init__(self, digest: Digest, kind: int, referrer: Digest | None):
        self.digest, self.kind, self.referrer = digest, kind, referrer
        by = f" (referenced by {referrer.hex()})" if referrer else ""
        super().__init__(f"{framing.KIND_NAMES[kind]} {digest.hex()} is missing{by}")


class Walker:
    """Streams reachable objects, each once; `seen` may be shared across many roots."""

    def __init__(self, objects: ObjectSource, seen: set | None = None, verify: bool = True,
                 follow_parents: bool = True):
        self.objects = objects
        self.seen = set() if seen is None else seen
        self.verify = verify
        self.follow_parents = follow_parents

    def _data(self, digest: Digest, kind: int, referrer: Digest | None) -> bytes:
        if self.verify:
            data = load_object(self.objects, digest, kind)
        else:
            value = self.objects.raw(digest)
            data = None if value is None else framing.unframe(value)[1]
        if data is None:
            raise MissingObject(digest, kind, referrer)
        return data

    def _leaf(self, digest: Digest, kind: int, referrer: Digest | None):
        """A chunk: check presence (and hash, if verifying) without decoding."""
        if digest.raw in self.seen:
            return
        self.seen.add(digest.raw)
        if self.verify:
            self._data(digest, kind, referrer)
        elif not self.objects.has(digest):
            raise MissingObject(digest, kind, referrer)
        yield digest, kind, referrer

    def checkpoint(self, digest: Digest, referrer: Digest | None = None) -> Iterator[tuple]:
        stack = [(digest, referrer)]
        while stack:
            current, by = stack.pop()
            if current.raw in self.seen:
                continue
            self.seen.add(current.raw)
            cp = Checkpoint.decode(self._data(current, framing.KIND_CHECKPOINT, by))
            yield current, framing.KIND_CHECKPOINT, by
            yield from self.tree(cp.tree, current)
            yield from self.history(cp.history, current)
            if self.follow_parents:
                stack.extend((parent, current) for parent in cp.parents)

    def tree(self, digest: Digest, referrer: Digest | None = None) -> Iterator[tuple]:
        stack = [(digest, referrer)]
        while stack:
            current, by = stack.pop()
            if current.raw in self.seen:
                continue
            self.seen.add(current.raw)
            tree = Tree.decode(self._data(current, framing.KIND_TREE, by))
            yield current, framing.KIND_TREE, by
            for entry in tree.entries:
                if entry.type == "dir":
                    stack.append((entry.id, current))
                elif entry.size == 0:
                    continue
                elif entry.chunks is None:
                    yield from self._leaf(entry.id, framing.KIND_CHUNK, current)
                elif entry.chunks.raw not in self.seen:
                    self.seen.add(entry.chunks.raw)
                    chunk_list = ChunkList.decode(self._data(entry.chunks, framing.KIND_CHUNKLIST, current))
                    yield entry.chunks, framing.KIND_CHUNKLIST, current
                    for ref in chunk_list.chunks:
                        yield from self._leaf(ref.id, framing.KIND_CHUNK, entry.chunks)

    def history(self, position: HistoryPosition, referrer: Digest | None = None) -> Iterator[tuple]:
        current, by = position.segment, referrer
        while current is not None and current.raw not in self.seen:
            self.seen.add(current.raw)
            segment = Segment.decode(self._data(current, framing.KIND_SEGMENT, by))
            yield current, framing.KIND_SEGMENT, by
            for ref in segment.chunks:
                yield from self._leaf(ref.id, framing.KIND_CHUNK, current)
            current, by = segment.base.segment, current
