"""What a checkpoint needs: the objects reachable from it, streamed and checked.

From a checkpoint: its tree, every subtree, every chunk list and chunk of every file,
and its history: the segment chain back from its HistoryPosition (following `base`,
and a copy segment's source position; `skip` targets are on that chain already) and each
segment's chunks. Parents
are followed only when asked (a bundle may carry one checkpoint, gc needs all).
Objects are yielded once each as (digest, kind, referrer) so a caller can explain why
an object is needed; a missing object raises MissingObject naming its referrer.

Every walk iterates with an explicit stack (trees may nest thousands deep), and
checks the facts an object states about the objects it names, on every reference
(not only the first, since one chunk may be named by several lists):
  - each referenced object has the kind its referrer expects (a file's chunk is a
    chunk, a directory's id a tree...), read from the stored header;
  - each chunk's stored size equals the size its tree entry, chunk list or segment
    declares, and a chunk list adds up to its file's size;
with `deep=True` (fsck, import, pull/push) also what needs the bytes:
  - a multi-chunk file's chunks hash together to the file id (once per file and list);
  - no path through the trees is longer than MAX_PATH_BYTES (PATH_MAX - 1), so every
    tree can be restored (tracked as byte lengths on the walk's stack);
  - with `deep_history` (import, pull/push; fsck checks these on every object itself)
    each segment is recomputed from its bytes and base (rollout.History.check_segment),
    every history position is checked against its segment, and each checkpoint's
    first-parent index (generation, skip) against its parent (checkpoints.check_index).
So import, transfer and fsck refuse the same lies, and a store that fsck passes checks out.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

import blake3

from agentcas.cas import framing
from agentcas.cas.digest import Digest
from agentcas.cas.objects import MAX_PATH_BYTES, Checkpoint, ChunkList, HistoryPosition, PathTooLong, Segment, Tree
from agentcas.cas.source import ObjectSource, load_object, verify_object
from agentcas.errors import IntegrityError


class MarkSetLike(Protocol):
    """What a walk marks objects in: a set of raw ids, or gc's bounded `MarkSet`."""

    def __contains__(self, raw: object) -> bool: ...

    def add(self, raw: bytes) -> None: ...


class MissingObject(IntegrityError):
    """A referenced object is not in the store."""

    def __init__(self, digest: Digest, kind: int, referrer: Digest | None):
        self.digest, self.kind, self.referrer = digest, kind, referrer
        by = f" (referenced by {referrer.hex()})" if referrer else ""
        super().__init__(f"{framing.KIND_NAMES[kind]} {digest.hex()} is missing{by}")


class InconsistentObject(IntegrityError):
    """An object states something about another that the other contradicts (size, kind, hash)."""


def _by(referrer: Digest | None) -> str:
    return f" (referenced by {referrer.hex()})" if referrer else ""


class Walker:
    """Streams reachable objects, each once; `seen` may be shared across many roots."""

    def __init__(self, objects: ObjectSource, seen: MarkSetLike | None = None, verify: bool = True,
                 follow_parents: bool = True, deep: bool = False, deep_history: bool | None = None):
        self.objects = objects
        self.seen = set() if seen is None else seen
        self.verify = verify
        self.follow_parents = follow_parents
        self.deep = deep
        self.deep_history = deep if deep_history is None else deep_history
        self._sizes: dict[bytes, int] = {}          # chunk or chunk list id -> bytes it holds
        self._files: set = set()                    # (file id, chunk list id) pairs hashed
        self._positions: set = set()                # positions checked
        self._shapes: dict = {}                     # tree id -> (deepest prefix, longest name, dirs)
        self._checkpoints: dict = {}                # ancestors read by check_index
        self._history = None

    # -- reading -------------------------------------------------------------------------
    def _header(self, digest: Digest) -> tuple[int, int] | None:
        """(kind, uncompressed size) of a stored object from its header, or None if absent."""
        value = self.objects.raw(digest)
        if value is None:
            return None
        try:
            kind, _, size, _ = framing.read_header(value)
        except framing.CorruptValue as exc:
            raise IntegrityError(f"object {digest.hex()} is corrupt: {exc}") from None
        return kind, size

    def _data(self, digest: Digest, kind: int, referrer: Digest | None) -> bytes:
        if self.verify:
            data = load_object(self.objects, digest, kind)
        else:
            value = self.objects.raw(digest)
            data = None
            if value is not None:
                try:
                    got, data = framing.unframe(value)
                except framing.CorruptValue as exc:
                    raise IntegrityError(f"object {digest.hex()} is corrupt: {exc}") from None
                if got != kind:
                    raise InconsistentObject(f"object {digest.hex()} is a {framing.KIND_NAMES[got]}, "
                                             f"expected a {framing.KIND_NAMES[kind]}{_by(referrer)}")
        if data is None:
            raise MissingObject(digest, kind, referrer)
        return data

    def _chunk_bytes(self, digest: Digest, referrer: Digest | None) -> bytes:
        """A chunk's bytes for a whole-file hash (verified against its id if verifying)."""
        value = self.objects.raw(digest)
        if value is None:
            raise MissingObject(digest, framing.KIND_CHUNK, referrer)
        try:
            kind, data = framing.unframe(value)
        except framing.CorruptValue as exc:
            raise IntegrityError(f"chunk {digest.hex()} is corrupt: {exc}") from None
        if self.verify:
            verify_object(kind, digest, data)
        return data

    def _check_size(self, digest: Digest, actual: int, declared: int | None, referrer: Digest | None,
                    what: str = "chunk") -> None:
        if declared is not None and actual != declared:
            raise InconsistentObject(f"{what} {digest.hex()} holds {actual} bytes, but its referrer gives its "
                                     f"size as {declared}{_by(referrer)}")

    def _leaf(self, digest: Digest, kind: int, referrer: Digest | None, size: int | None = None,
              hasher=None):
        """A chunk: check presence, kind and size (and hash, if verifying) without decoding;
        with `hasher`, its bytes are fed to it (a deep walk's whole-file hash)."""
        if digest.raw in self.seen:
            known = self._sizes.get(digest.raw)
            if known is not None:
                self._check_size(digest, known, size, referrer)
            if hasher is not None:
                hasher.update(self._chunk_bytes(digest, referrer))
            return
        header = self._header(digest)
        if header is None:
            raise MissingObject(digest, kind, referrer)
        if header[0] != kind:
            raise InconsistentObject(f"object {digest.hex()} is a {framing.KIND_NAMES[header[0]]}, "
                                     f"expected a {framing.KIND_NAMES[kind]}{_by(referrer)}")
        self._check_size(digest, header[1], size, referrer)
        self.seen.add(digest.raw)
        self._sizes[digest.raw] = header[1]
        if hasher is not None:
            hasher.update(self._chunk_bytes(digest, referrer))  # verified, if verifying
        elif self.verify:
            self._data(digest, kind, referrer)
        yield digest, kind, referrer

    # -- walks ---------------------------------------------------------------------------
    def checkpoint(self, digest: Digest, referrer: Digest | None = None) -> Iterator[tuple]:
        stack = [(digest, referrer)]
        while stack:
            current, by = stack.pop()
            if current.raw in self.seen:
                continue
            self.seen.add(current.raw)
            cp = Checkpoint.decode(self._data(current, framing.KIND_CHECKPOINT, by))
            yield current, framing.KIND_CHECKPOINT, by
            if self.deep_history:
                from agentcas.lineage.checkpoints import check_index  # lineage sibling
                check_index(self.objects, current, cp, self._checkpoints)
            yield from self.tree(cp.tree, current)
            yield from self.history(cp.history, current)
            if self.follow_parents:
                stack.extend((parent, current) for parent in cp.parents)

    def _check_path(self, length: int, tree_id: Digest) -> None:
        if length > MAX_PATH_BYTES:
            raise PathTooLong(length, f"a path through tree {tree_id.hex()}")

    def tree(self, digest: Digest, referrer: Digest | None = None) -> Iterator[tuple]:
        # Stack items carry the byte length of the directory's path ("a/b/" is 4), so a
        # deep walk can refuse paths over MAX_PATH_BYTES. A tree met again deeper than
        # before (shared subtrees) is re-checked from its remembered shape, not re-read.
        stack = [(digest, referrer, 0)]
        while stack:
            current, by, where = stack.pop()
            if current.raw in self.seen:
                shape = self._shapes.get(current.raw)
                if shape is not None and where > shape[0]:
                    _, longest, dirs = shape
                    self._shapes[current.raw] = (where, longest, dirs)
                    self._check_path(where + longest, current)
                    stack.extend((child, current, where + n + 1) for n, child in dirs)
                continue
            self.seen.add(current.raw)
            tree = Tree.decode(self._data(current, framing.KIND_TREE, by))
            yield current, framing.KIND_TREE, by
            if self.deep:
                lengths = [len(e.name.encode("utf-8")) for e in tree.entries]
                longest = max(lengths, default=0)
                self._check_path(where + longest, current)
                self._shapes[current.raw] = (where, longest, [(n, e.id) for n, e in zip(lengths, tree.entries)
                                                             if e.type == "dir"])
            for entry in tree.entries:
                if entry.type == "dir":
                    stack.append((entry.id, current, where + len(entry.name.encode("utf-8")) + 1))
                elif entry.size == 0:
                    continue
                elif entry.chunks is None:
                    yield from self._leaf(entry.id, framing.KIND_CHUNK, current, entry.size)
                else:
                    yield from self._file(entry, current)

    def _file(self, entry, tree_id: Digest) -> Iterator[tuple]:
        """A multi-chunk file: its chunk list, that list's chunks, sizes and (deep) the file id.

        A deep walk hashes the file from the bytes its chunk checks read anyway, so a new
        chunk is read once; chunks met before (shared by another file) are read again."""
        list_id = entry.chunks
        fresh = list_id.raw not in self.seen
        chunk_list = None
        if fresh:
            self.seen.add(list_id.raw)
            chunk_list = ChunkList.decode(self._data(list_id, framing.KIND_CHUNKLIST, tree_id))
            self._sizes[list_id.raw] = chunk_list.size
            yield list_id, framing.KIND_CHUNKLIST, tree_id
        hasher = None
        if self.deep and (entry.id.raw, list_id.raw) not in self._files:
            self._files.add((entry.id.raw, list_id.raw))
            if chunk_list is None:
                chunk_list = ChunkList.decode(self._data(list_id, framing.KIND_CHUNKLIST, tree_id))
            if self._hashable(chunk_list):
                hasher = blake3.blake3()
        if fresh or hasher is not None:
            assert chunk_list is not None  # decoded above whenever it is fresh or hashed
            for ref in chunk_list.chunks:
                if fresh:
                    yield from self._leaf(ref.id, framing.KIND_CHUNK, list_id, ref.size, hasher)
                elif hasher is not None:
                    hasher.update(self._chunk_bytes(ref.id, list_id))
        total = self._sizes.get(list_id.raw)
        if total is not None and total != entry.size:
            raise InconsistentObject(f"chunk list {list_id.hex()} adds up to {total} bytes, but file "
                                     f"{entry.name!r} gives its size as {entry.size}{_by(tree_id)}")
        if hasher is not None and hasher.digest() != entry.id.raw:
            raise InconsistentObject(f"file {entry.name!r} (chunk list {list_id.hex()}) does not hash "
                                     f"to its id {entry.id.hex()}{_by(tree_id)}")

    def _hashable(self, chunk_list: ChunkList) -> bool:
        """Whether a file's chunks can be hashed together (fsck skips files with a corrupt chunk,
        already reported where it is)."""
        return True

    def _histories(self):
        if self._history is None:
            from agentcas.lineage.rollout import History  # lineage sibling
            self._history = History(self.objects)
        return self._history

    def history(self, position: HistoryPosition, referrer: Digest | None = None) -> Iterator[tuple]:
        # A segment that copies records needs its source's chain too (a stack, not recursion:
        # a fork of a fork of ... nests), walked before the copy is checked.
        stack: list = [(position.segment, referrer)]
        checks = []
        while stack:
            current, by = stack.pop()
            while current is not None and current.raw not in self.seen:
                self.seen.add(current.raw)
                segment = Segment.decode(self._data(current, framing.KIND_SEGMENT, by))
                yield current, framing.KIND_SEGMENT, by
                for ref in segment.chunks:
                    yield from self._leaf(ref.id, framing.KIND_CHUNK, current, ref.size)
                checks.append((current, segment))
                if segment.copy is not None:
                    stack.append((segment.copy.source.segment, current))
                current, by = segment.base.segment, current
        if self.deep_history:
            # Oldest first (a copy's source was walked after it), once the chain's objects are
            # known to be present.
            history = self._histories()
            for digest, segment in reversed(checks):
                history.check_segment(digest, segment)
            self.check_position(position)

    def check_position(self, position: HistoryPosition) -> None:
        """A position must be its segment's end, or a cut recomputable inside it (once each)."""
        key = (None if position.segment is None else position.segment.raw, position.seq,
               position.offset, position.digest.raw)
        if key in self._positions:
            return
        self._positions.add(key)
        self._histories().check_position(position)
