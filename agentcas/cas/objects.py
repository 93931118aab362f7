"""Domain objects with one canonical byte form each (docs/FORMAT.md).

Frozen dataclasses: the constructor validates, so an invalid object cannot exist;
`encode()` gives canonical bytes, `digest()` the id, `decode()` parses and validates.
None of them touches storage.

Two byte forms exist (docs/FORMAT.md): format 1, canonical JSON (bytes start with `{`),
and format 2, the packed binary form (cas/packed.py): a positional list whose first item
is 2. Writers produce format 2; readers accept both, and an object keeps the form it was
read in (its `format`), so re-encoding a stored object always gives back its id.
"""

from __future__ import annotations

import re
from collections.abc import Set
from dataclasses import dataclass, field

from agentcas.cas import encoding, framing, packed
from agentcas.cas.digest import EMPTY, EMPTY_HISTORY, Digest, hash_object
from agentcas.cas.names import BadName, check_name, check_unique
from agentcas.errors import IntegrityError, UsageError

FORMAT_VERSION = 1  # the version signed statements carry (signing/envelope.py)
JSON_FORMAT = 1
PACKED_FORMAT = 2
OBJECT_FORMAT = PACKED_FORMAT  # what writers produce
MODE_FILE = 0o644
MODE_EXEC = 0o755
MAX_REASON_CHARS = 512
MAX_REASON_BYTES = 1024
# A path in a checkpoint, relative to its root, holds at most PATH_MAX - 1 bytes (Linux):
# deeper trees could be neither committed nor restored, so readers refuse them.
MAX_PATH_BYTES = 4095
_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", re.ASCII)


class InvalidObject(IntegrityError):
    """Decoded bytes that do not form a valid object."""


def _digest(value, what: str) -> Digest:
    try:
        return Digest.parse(value)
    except UsageError:
        raise InvalidObject(f"{what} is not a 64-hex id") from None


def _int(value, what: str, low: int = 0) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise InvalidObject(f"{what} must be an integer >= {low}")
    return value


def _keys(doc, required: set, optional: Set[str] = frozenset(), what: str = "object") -> None:
    if not isinstance(doc, dict):
        raise InvalidObject(f"{what} must be a JSON object")
    missing = required - doc.keys()
    if missing:
        raise InvalidObject(f"{what} lacks {sorted(missing)}")
    # Readers ignore unknown keys (forward compatibility) except in the closed sets below.


_TREE_HEAD = bytes((packed.LIST, 2, packed.UINT, PACKED_FORMAT, packed.LIST))
_FILE_HEAD = bytes((packed.LIST, 6, packed.UINT, 0, packed.TEXT))
_DIR_HEAD = bytes((packed.LIST, 3, packed.UINT, 1, packed.TEXT))


def _uint(n: int) -> bytes:
    cached = _UINT_BYTES.get(n)
    if cached is None:
        cached = bytes((packed.UINT,)) + packed.varint(n)
        if len(_UINT_BYTES) < 65536:  # modes and common sizes
            _UINT_BYTES[n] = cached
    return cached


_UINT_BYTES: dict = {}


def _is_json(data) -> bool:
    return bytes(data[:1]) == b"{"


def _packed_row(data, what: str, fields: int | tuple[int, ...]) -> list:
    """The items after the leading format number of a packed object; exactly `fields` of
    them (or one of the counts `fields` lists: an object with an optional last item)."""
    counts = (fields,) if isinstance(fields, int) else fields
    row = packed.decode(data)
    if not isinstance(row, list) or not row or not isinstance(row[0], int) or isinstance(row[0], bool):
        raise InvalidObject(f"{what} is not a packed object")
    if row[0] > PACKED_FORMAT:
        raise InvalidObject(f"{what} format {row[0]} is newer than this agentcas reads "
                            f"({PACKED_FORMAT}); upgrade agentcas")
    if row[0] != PACKED_FORMAT or len(row) - 1 not in counts:
        raise InvalidObject(f"{what} has the wrong shape for format {PACKED_FORMAT}")
    return row[1:]


def _id(value, what: str) -> Digest:
    if not isinstance(value, Digest):
        raise InvalidObject(f"{what} must be an id")
    return value


def _opt_id(value, what: str) -> Digest | None:
    return None if value is None else _id(value, what)


def _text(value, what: str) -> str:
    if not isinstance(value, str):
        raise InvalidObject(f"{what} must be text")
    return value


def _packed_chunks(value, what: str) -> tuple[ChunkRef, ...]:
    if not isinstance(value, list):
        raise InvalidObject(f"{what} must be a list")
    refs = []
    for item in value:
        if not isinstance(item, list) or len(item) != 2:
            raise InvalidObject(f"{what} entries are [id, size]")
        refs.append(ChunkRef(_id(item[0], what), _int(item[1], what, 1)))
    return tuple(refs)


def check_reason(reason: str) -> str:
    """A checkpoint reason: 1..512 characters and at most 1,024 UTF-8 bytes."""
    if not isinstance(reason, str) or len(reason.strip()) == 0:
        raise UsageError("reason must not be empty")
    if len(reason) > MAX_REASON_CHARS:
        raise UsageError(f"reason is {len(reason)} characters; at most {MAX_REASON_CHARS} allowed")
    size = len(reason.encode("utf-8", "surrogatepass"))
    if size > MAX_REASON_BYTES:
        raise UsageError(f"reason is {size} UTF-8 bytes; at most {MAX_REASON_BYTES} allowed")
    try:
        reason.encode("utf-8")  # strict UTF-8 fails exactly on surrogates (C speed, not a char loop)
    except UnicodeEncodeError:
        raise UsageError("reason is not valid Unicode text") from None
    return reason


class PathTooLong(InvalidObject):
    """A tree nests a path longer than MAX_PATH_BYTES."""

    def __init__(self, length: int, where: str):
        super().__init__(f"{where} is {length} bytes long; a checkpoint's paths hold at most "
                         f"{MAX_PATH_BYTES} bytes (the file system's PATH_MAX)")


@dataclass(frozen=True)
class ChunkRef:
    id: Digest
    size: int

    def __post_init__(self):
        if not isinstance(self.id, Digest):
            raise InvalidObject("chunk id must be a Digest")
        if not isinstance(self.size, int) or isinstance(self.size, bool) or self.size < 1:
            raise InvalidObject("a chunk holds at least one byte")


def _chunk_refs(doc, what: str) -> tuple[ChunkRef, ...]:
    if not isinstance(doc, list):
        raise InvalidObject(f"{what} must be a list")
    refs = []
    for item in doc:
        if not isinstance(item, list) or len(item) != 2:
            raise InvalidObject(f"{what} entries are [id, size]")
        refs.append(ChunkRef(_digest(item[0], what), _int(item[1], what, 1)))
    return tuple(refs)


@dataclass(frozen=True)
class ChunkList:
    """The chunks of one file larger than a chunk, in order."""

    chunks: tuple[ChunkRef, ...]
    format: int = OBJECT_FORMAT

    KIND = framing.KIND_CHUNKLIST

    def __post_init__(self):
        if len(self.chunks) < 2:
            raise InvalidObject("a chunk list has at least two chunks")

    @property
    def size(self) -> int:
        return sum(c.size for c in self.chunks)

    def to_doc(self):
        return {"chunks": [[c.id.hex(), c.size] for c in self.chunks]}

    def encode(self) -> bytes:
        if self.format == JSON_FORMAT:
            return encoding.encode(self.to_doc(), check=False)
        return packed.encode([PACKED_FORMAT, [[c.id, c.size] for c in self.chunks]])

    def digest(self) -> Digest:
        return hash_object("chunklist", self.encode())

    @classmethod
    def decode(cls, data: bytes) -> ChunkList:
        if not _is_json(data):
            (chunks,) = _packed_row(data, "chunklist", 1)
            return cls(_packed_chunks(chunks, "chunklist"))
        doc = encoding.decode(data)
        _keys(doc, {"chunks"}, what="chunklist")
        return cls(_chunk_refs(doc["chunks"], "chunklist"), JSON_FORMAT)


@dataclass(frozen=True)
class TreeEntry:
    """A file (mode, size, b3sum id, optional chunk list) or a directory (tree id)."""

    name: str
    type: str  # "file" | "dir"
    id: Digest
    mode: int = MODE_FILE
    size: int = 0
    chunks: Digest | None = None  # chunk list id when the file spans several chunks

    def __post_init__(self):
        check_name(self.name)
        if not isinstance(self.id, Digest) or not (self.chunks is None or isinstance(self.chunks, Digest)):
            raise InvalidObject(f"entry {self.name!r} ids must be Digests")
        if self.type == "dir":
            if self.chunks is not None or self.size or self.mode != MODE_FILE:
                raise InvalidObject(f"directory entry {self.name!r} carries file fields")
        elif self.type == "file":
            if self.mode not in (MODE_FILE, MODE_EXEC):
                raise InvalidObject(f"file {self.name!r} has mode {oct(self.mode)}; only 0644 and 0755")
            if self.size < 0 or (self.size == 0 and self.id != EMPTY):
                raise InvalidObject(f"file {self.name!r} has an inconsistent size")
            if self.chunks is not None and self.size < 2:
                # A chunk list holds at least two chunks of at least one byte each.
                raise InvalidObject(f"file {self.name!r} of size {self.size} cannot have a chunk list")
        else:
            raise InvalidObject(f"entry {self.name!r} has type {self.type!r}; only file and dir")

    def to_doc(self):
        if self.type == "dir":
            return {"name": self.name, "type": "dir", "id": self.id.hex()}
        doc = {"name": self.name, "type": "file", "id": self.id.hex(), "mode": self.mode,
               "size": self.size}
        if self.chunks is not None:
            doc["chunks"] = self.chunks.hex()
        return doc

    def to_row(self) -> list:
        """[1, name, id] for a directory, [0, name, id, mode, size, chunks or null] for a file."""
        if self.type == "dir":
            return [1, self.name, self.id]
        return [0, self.name, self.id, self.mode, self.size, self.chunks]

    @classmethod
    def from_row(cls, row) -> TreeEntry:
        if not isinstance(row, list) or not row or row[0] not in (0, 1) or isinstance(row[0], bool) \
                or len(row) != (3 if row[0] == 1 else 6):
            raise InvalidObject("tree entry has the wrong shape")
        try:
            if row[0] == 1:
                return cls(_text(row[1], "entry name"), "dir", _id(row[2], "entry id"))
            return cls(_text(row[1], "entry name"), "file", _id(row[2], "entry id"),
                       _int(row[3], "mode"), _int(row[4], "size"), _opt_id(row[5], "chunk list id"))
        except BadName as exc:
            raise InvalidObject(str(exc)) from None

    @classmethod
    def from_doc(cls, doc) -> TreeEntry:
        if not isinstance(doc, dict):
            raise InvalidObject("tree entry must be an object")
        allowed = {"name", "type", "id", "mode", "size", "chunks"}
        if set(doc) - allowed:
            raise InvalidObject(f"tree entry has unknown fields {sorted(set(doc) - allowed)}")
        _keys(doc, {"name", "type", "id"}, what="tree entry")
        if doc["type"] == "dir" and set(doc) != {"name", "type", "id"}:
            raise InvalidObject("directory entry carries file fields")
        if doc["type"] == "file" and not {"mode", "size"} <= set(doc):
            raise InvalidObject("file entry lacks mode or size")
        chunks = doc.get("chunks")
        try:
            return cls(doc["name"], doc["type"], _digest(doc["id"], "entry id"),
                       _int(doc.get("mode", MODE_FILE), "mode"), _int(doc.get("size", 0), "size"),
                       None if chunks is None else _digest(chunks, "chunk list id"))
        except BadName as exc:
            raise InvalidObject(str(exc)) from None


@dataclass(frozen=True)
class Tree:
    """One directory: entries sorted by the UTF-8 bytes of their names."""

    entries: tuple[TreeEntry, ...]
    format: int = OBJECT_FORMAT

    KIND = framing.KIND_TREE

    def __post_init__(self):
        names = [e.name.encode("utf-8") for e in self.entries]
        if names != sorted(names) or len(set(names)) != len(names):
            raise InvalidObject("tree entries must be sorted by name and unique")
        try:
            check_unique([e.name for e in self.entries])
        except BadName as exc:
            raise InvalidObject(str(exc)) from None

    @classmethod
    def of(cls, entries) -> Tree:
        return cls(tuple(sorted(entries, key=lambda e: e.name.encode("utf-8"))))

    def encode(self) -> bytes:
        if self.format == JSON_FORMAT:
            return encoding.encode({"entries": [e.to_doc() for e in self.entries]}, check=False)
        # packed.encode([2, [e.to_row() for e in entries]]), spelled out: trees are encoded on
        # every commit (111 of them for 1,000 files), and the generic walk was ~40% of an
        # unchanged recommit's work. tests/test_objects.py checks the two agree.
        parts = [_TREE_HEAD, packed.varint(len(self.entries))]
        varint = packed.varint
        for e in self.entries:
            name = e.name.encode("utf-8")
            if e.type == "dir":
                parts += (_DIR_HEAD, varint(len(name)), name, b"\x04", e.id.raw)
            else:
                parts += (_FILE_HEAD, varint(len(name)), name, b"\x04", e.id.raw, _uint(e.mode),
                          _uint(e.size), b"\x00" if e.chunks is None else b"\x04" + e.chunks.raw)
        return b"".join(parts)

    def digest(self) -> Digest:
        return hash_object("tree", self.encode())

    @classmethod
    def decode(cls, data: bytes) -> Tree:
        if not _is_json(data):
            (entries,) = _packed_row(data, "tree", 1)
            if not isinstance(entries, list):
                raise InvalidObject("tree entries must be a list")
            return cls(tuple(TreeEntry.from_row(e) for e in entries))
        doc = encoding.decode(data)
        _keys(doc, {"entries"}, what="tree")
        if not isinstance(doc["entries"], list):
            raise InvalidObject("tree entries must be a list")
        return cls(tuple(TreeEntry.from_doc(e) for e in doc["entries"]), JSON_FORMAT)


@dataclass(frozen=True)
class HistoryPosition:
    """An immutable prefix of a thread's rollout: its first `seq` records.

    `segment` is the rollout segment holding record seq-1 (None for the empty
    history), `offset` the prefix's length in bytes, `digest` the prefix chain value
    after its last record (docs/FORMAT.md, "History prefix digest").
    """

    segment: Digest | None
    seq: int
    offset: int
    digest: Digest

    def __post_init__(self):
        if self.seq < 0 or self.offset < 0:
            raise InvalidObject("history position must not be negative")
        if self.offset < self.seq:
            raise InvalidObject("history position has fewer bytes than records (a record has at least one)")
        if (self.segment is None) != (self.seq == 0):
            raise InvalidObject("history position has a segment exactly when seq > 0")
        if self.seq == 0 and (self.offset != 0 or self.digest != EMPTY_HISTORY):
            raise InvalidObject("the empty history has offset 0 and the zero digest")

    def to_doc(self):
        return {"segment": None if self.segment is None else self.segment.hex(),
                "seq": self.seq, "offset": self.offset, "digest": self.digest.hex()}

    def to_row(self) -> list:
        return [self.segment, self.seq, self.offset, self.digest]

    @classmethod
    def from_row(cls, row) -> HistoryPosition:
        if not isinstance(row, list) or len(row) != 4:
            raise InvalidObject("history position has the wrong shape")
        return cls(_opt_id(row[0], "segment"), _int(row[1], "seq"), _int(row[2], "offset"),
                   _id(row[3], "digest"))

    @classmethod
    def from_doc(cls, doc) -> HistoryPosition:
        _keys(doc, {"segment", "seq", "offset", "digest"}, what="history position")
        segment = None if doc["segment"] is None else _digest(doc["segment"], "segment")
        return cls(segment, _int(doc["seq"], "seq"), _int(doc["offset"], "offset"),
                   _digest(doc["digest"], "digest"))


EMPTY_POSITION = HistoryPosition(None, 0, 0, EMPTY_HISTORY)


@dataclass(frozen=True)
class RecordCopy:
    """Records a segment copies from another history instead of storing their bytes
    (docs/FORMAT.md 5.6): the `len(heads)` records ending at `source`, each with its head
    (the `{"timestamp":"..."` a harness gives a copied line) replaced by `heads[i]`."""

    source: HistoryPosition
    heads: tuple[bytes, ...]

    def __post_init__(self):
        if not isinstance(self.source, HistoryPosition) or not self.heads or len(self.heads) > self.source.seq:
            raise InvalidObject("a record copy names at least one record of the history it copies from")
        for head in self.heads:
            if not isinstance(head, bytes) or b"\n" in head:
                raise InvalidObject("a copied record's head must be bytes without a newline")

    @property
    def start(self) -> int:
        """The source's seq of the first copied record."""
        return self.source.seq - len(self.heads)

    def to_row(self) -> list:
        return [self.source.to_row(), list(self.heads)]

    @classmethod
    def from_row(cls, row) -> RecordCopy:
        if not isinstance(row, list) or len(row) != 2 or not isinstance(row[1], list):
            raise InvalidObject("segment copy must be [SOURCE-POSITION, [HEAD, ...]]")
        return cls(HistoryPosition.from_row(row[0]), tuple(row[1]))


@dataclass(frozen=True)
class Segment:
    """A run of whole rollout records appended at once, continuing from `base`.

    `index` counts segments from the start of the history (0 for the first); `skip`
    points further back (see lineage/rollout.py) so a lookup by seq costs O(log n).
    """

    base: HistoryPosition
    index: int
    skip: Digest | None
    count: int
    length: int
    digest: Digest
    chunks: tuple[ChunkRef, ...]
    # Format 2 only: a short run of records stored in the segment itself, before any chunks
    # (a small append then costs one object, not a segment and a chunk).
    inline: bytes = b""
    format: int = OBJECT_FORMAT
    # Format 2 only: the records are copies of another history's records (neither inline
    # bytes nor chunks then), so a fork that copies its parent's records stores them once.
    copy: RecordCopy | None = None

    KIND = framing.KIND_SEGMENT

    def __post_init__(self):
        if self.count < 1 or self.length < self.count:
            raise InvalidObject("a segment holds at least one record of at least one byte")
        if not isinstance(self.inline, bytes):
            raise InvalidObject("segment inline bytes must be bytes")
        if (self.inline or self.copy is not None) and self.format == JSON_FORMAT:
            raise InvalidObject("a format 1 segment has no inline bytes and copies no records")
        if self.copy is not None:
            if not isinstance(self.copy, RecordCopy):
                raise InvalidObject("segment copy must be a RecordCopy")
            if self.inline or self.chunks or len(self.copy.heads) != self.count:
                raise InvalidObject("a segment that copies records holds no bytes of its own and one head "
                                    "per record")
        elif len(self.inline) + sum(c.size for c in self.chunks) != self.length:
            raise InvalidObject("segment chunk sizes do not add up to its length")
        if (self.index == 0) != (self.base.segment is None):
            raise InvalidObject("only the first segment continues from the empty history")

    def end(self, segment_id: Digest) -> HistoryPosition:
        """The position after this segment's last record; `segment_id` is this segment's id."""
        return HistoryPosition(segment_id, self.base.seq + self.count,
                               self.base.offset + self.length, self.digest)

    def to_doc(self):
        return {"base": self.base.to_doc(), "index": self.index,
                "skip": None if self.skip is None else self.skip.hex(), "count": self.count,
                "length": self.length, "digest": self.digest.hex(),
                "chunks": [[c.id.hex(), c.size] for c in self.chunks]}

    def encode(self) -> bytes:
        if self.format == JSON_FORMAT:
            return encoding.encode(self.to_doc(), check=False)
        row = [PACKED_FORMAT, self.base.to_row(), self.index, self.skip, self.count, self.length, self.digest,
               [[c.id, c.size] for c in self.chunks], self.inline]
        if self.copy is not None:
            row.append(self.copy.to_row())
        return packed.encode(row)

    def digest_id(self) -> Digest:
        return hash_object("segment", self.encode())

    @classmethod
    def decode(cls, data: bytes) -> Segment:
        if not _is_json(data):
            row = _packed_row(data, "segment", (8, 9))
            base, index, skip, count, length, digest, chunks, inline = row[:8]
            if not isinstance(inline, bytes):
                raise InvalidObject("segment inline bytes must be bytes")
            return cls(HistoryPosition.from_row(base), _int(index, "index"), _opt_id(skip, "skip"),
                       _int(count, "count", 1), _int(length, "length", 1), _id(digest, "digest"),
                       _packed_chunks(chunks, "segment chunks"), inline,
                       copy=RecordCopy.from_row(row[8]) if len(row) == 9 else None)
        doc = encoding.decode(data)
        _keys(doc, {"base", "index", "skip", "count", "length", "digest", "chunks"}, what="segment")
        return cls(HistoryPosition.from_doc(doc["base"]), _int(doc["index"], "index"),
                   None if doc["skip"] is None else _digest(doc["skip"], "skip"),
                   _int(doc["count"], "count", 1), _int(doc["length"], "length", 1),
                   _digest(doc["digest"], "digest"), _chunk_refs(doc["chunks"], "segment chunks"),
                   format=JSON_FORMAT)


@dataclass(frozen=True)
class RolloutFile:
    """Where a checkpoint's history stands in the rollout file committed with it (`commit
    --rollout`): the file's first `offset` bytes are, line for line, records of the history's
    first `seq` records (the others there were added by agentcas, effects), record
    `seq - 1` being the file's last. `path` is the file's place relative to the workspace,
    "/"-separated, when it was inside it: checkout writes the file back there."""

    offset: int
    seq: int
    path: str | None = None

    def __post_init__(self):
        for name in ("offset", "seq"):
            value = getattr(self, name)
            if type(value) is not int or value < 0:
                raise InvalidObject(f"rollout_file {name} must be an integer >= 0")
        if self.path is not None:
            if not isinstance(self.path, str) or len(self.path.encode("utf-8", "surrogatepass")) > MAX_PATH_BYTES:
                raise InvalidObject("rollout_file path must be text of at most 4,095 bytes")
            try:
                for part in self.path.split("/"):
                    check_name(part)
            except BadName as exc:
                raise InvalidObject(f"rollout_file path {self.path!r}: {exc}") from None

    def to_doc(self) -> dict:
        doc: dict[str, int | str] = {"offset": self.offset, "seq": self.seq}
        if self.path is not None:
            doc["path"] = self.path
        return doc

    def to_row(self) -> list:
        return [self.path, self.offset, self.seq]

    @classmethod
    def from_doc(cls, doc) -> RolloutFile:
        if not isinstance(doc, dict):
            raise InvalidObject("rollout_file must be a map")
        _keys(doc, {"offset", "seq"}, optional={"path"}, what="rollout_file")
        return cls(doc["offset"], doc["seq"], doc.get("path"))

    @classmethod
    def from_row(cls, row) -> RolloutFile:
        if not isinstance(row, list) or len(row) != 3:
            raise InvalidObject("rollout_file must be [PATH | null, OFFSET, SEQ]")
        path, offset, seq = row
        if path is not None and not isinstance(path, str):
            raise InvalidObject("rollout_file path must be text")
        return cls(offset, seq, path)


@dataclass(frozen=True)
class Checkpoint:
    """A commit: a tree, its parents, its thread, why, who, when, where, and the history."""

    tree: Digest
    parents: tuple[Digest, ...]
    thread: str
    reason: str
    author: str
    created_at: str
    runtime: dict = field(default_factory=dict, hash=False, compare=False)
    history: HistoryPosition = EMPTY_POSITION
    format: int = OBJECT_FORMAT  # 1: canonical JSON, 2: packed (the byte form it is encoded in)
    # Optional first-parent index (lineage/checkpoints.py): the depth along first parents
    # and a pointer further back, so "newest checkpoint at or before seq S" is O(log n).
    # 0 / None (the keys omitted) mean "not indexed": readers then step parent by parent.
    generation: int = 0
    skip: Digest | None = None
    # Optional (absent before `commit --rollout` recorded it): see RolloutFile.
    rollout_file: RolloutFile | None = None

    KIND = framing.KIND_CHECKPOINT

    def __post_init__(self):
        try:
            check_reason(self.reason)
        except UsageError as exc:
            raise InvalidObject(str(exc)) from None
        if not isinstance(self.created_at, str) or not _TIME.fullmatch(self.created_at):
            raise InvalidObject("created_at must be RFC 3339 UTC with microseconds")
        if not isinstance(self.runtime, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in self.runtime.items()):
            raise InvalidObject("runtime must map names to version strings")
        if not isinstance(self.thread, str) or not self.thread:
            raise InvalidObject("checkpoint thread must be a name")
        if not isinstance(self.generation, int) or isinstance(self.generation, bool) or self.generation < 0:
            raise InvalidObject("generation must be an integer >= 0")
        if self.generation and not self.parents:
            raise InvalidObject("a checkpoint without parents has generation 0")
        if self.skip is not None and (self.generation < 2 or not isinstance(self.skip, Digest)):
            raise InvalidObject("only a checkpoint of generation >= 2 has a skip pointer")
        if self.format not in (JSON_FORMAT, PACKED_FORMAT):
            raise InvalidObject(f"checkpoint format {self.format} is not 1 or 2")
        if self.rollout_file is not None and (not isinstance(self.rollout_file, RolloutFile)
                                              or self.rollout_file.seq > self.history.seq):
            raise InvalidObject("rollout_file must be a RolloutFile within the checkpoint's history")

    def to_doc(self):
        doc = {"format": self.format, "tree": self.tree.hex(),
               "parents": [p.hex() for p in self.parents], "thread": self.thread,
               "reason": self.reason, "author": self.author, "created_at": self.created_at,
               "runtime": dict(self.runtime), "history": self.history.to_doc()}
        if self.generation:
            doc["generation"] = self.generation
        if self.skip is not None:
            doc["skip"] = self.skip.hex()
        if self.rollout_file is not None:
            doc["rollout_file"] = self.rollout_file.to_doc()
        return doc

    def encode(self) -> bytes:
        if self.format == JSON_FORMAT:
            return encoding.encode(self.to_doc(), check=False)
        row = [PACKED_FORMAT, self.tree, list(self.parents), self.thread, self.reason,
               self.author, self.created_at, dict(self.runtime), self.history.to_row(),
               self.generation, self.skip]
        if self.rollout_file is not None:  # an optional last item: without it, the bytes (and id) of before
            row.append(self.rollout_file.to_row())
        return packed.encode(row)

    def digest(self) -> Digest:
        return hash_object("checkpoint", self.encode())

    def encode_with_id(self) -> tuple[bytes, Digest]:
        """(canonical bytes, id) with one encoding: a writer stores the one and keys by the other."""
        body = self.encode()
        return body, hash_object("checkpoint", body)

    @classmethod
    def decode(cls, data: bytes) -> Checkpoint:
        if not _is_json(data):
            row = _packed_row(data, "checkpoint", (10, 11))
            (tree, parents, thread, reason, author, created_at, runtime, history, generation,
             skip) = row[:10]
            if not isinstance(parents, list) or not isinstance(runtime, dict):
                raise InvalidObject("checkpoint parents must be a list and runtime a map")
            return cls(_id(tree, "tree"), tuple(_id(p, "parent") for p in parents),
                       _text(thread, "thread"), _text(reason, "reason"), _text(author, "author"),
                       _text(created_at, "created_at"), runtime, HistoryPosition.from_row(history),
                       PACKED_FORMAT, _int(generation, "generation"), _opt_id(skip, "skip"),
                       RolloutFile.from_row(row[10]) if len(row) == 11 else None)
        doc = encoding.decode(data)
        _keys(doc, {"format", "tree", "parents", "thread", "reason", "author", "created_at",
                    "runtime", "history"}, optional={"generation", "skip", "rollout_file"}, what="checkpoint")
        if _int(doc["format"], "format") > FORMAT_VERSION:
            raise InvalidObject(f"checkpoint format {doc['format']} is newer than this agentcas "
                                f"reads ({FORMAT_VERSION}); upgrade agentcas")
        if not isinstance(doc["parents"], list):
            raise InvalidObject("parents must be a list")
        if not isinstance(doc["author"], str):
            raise InvalidObject("author must be a string")
        if "generation" in doc and not doc["generation"]:
            raise InvalidObject("generation 0 is written by omitting the key")
        skip = doc.get("skip")
        return cls(_digest(doc["tree"], "tree"), tuple(_digest(p, "parent") for p in doc["parents"]),
                   doc["thread"], doc["reason"], doc["author"], doc["created_at"],
                   doc["runtime"], HistoryPosition.from_doc(doc["history"]), doc["format"],
                   _int(doc.get("generation", 0), "generation"),
                   None if skip is None else _digest(skip, "skip"),
                   None if "rollout_file" not in doc else RolloutFile.from_doc(doc["rollout_file"]))


class CheckpointSeries:
    """Checkpoints that share their tree, thread, author, time and runtime (those one ingest
    makes of a session file, one per turn): each one's packed bytes and id, the shared
    fields encoded once instead of once per checkpoint.

    A packed list is its tag, its count and its items' bytes one after another, so the
    bytes are those of `Checkpoint(...).encode()` with the same fields (tests/test_objects.py);
    the fields are checked as Checkpoint checks them (the shared ones once).
    """

    def __init__(self, tree: Digest, thread: str, author: str, created_at: str, runtime: dict):
        Checkpoint(tree, (), thread, "-", author, created_at, runtime)   # checks the shared fields
        self._head = bytes((packed.LIST,)) + packed.varint(11) + packed.encode(PACKED_FORMAT) + packed.encode(tree)
        self._thread = packed.encode(thread)
        self._shared = packed.encode(author) + packed.encode(created_at) + packed.encode(dict(runtime))

    def encode_with_id(self, parents: tuple, reason: str, history: HistoryPosition, generation: int = 0,
                       skip: Digest | None = None) -> tuple[bytes, Digest]:
        """`Checkpoint(tree, parents, thread, reason, author, created_at, runtime, history,
        generation=generation, skip=skip).encode_with_id()`."""
        try:
            check_reason(reason)
        except UsageError as exc:
            raise InvalidObject(str(exc)) from None
        if type(generation) is not int or generation < 0 or (generation and not parents) \
                or (skip is not None and (generation < 2 or type(skip) is not Digest)):
            raise InvalidObject(f"checkpoint generation {generation!r} and skip {skip!r} do not fit its parents")
        # The ids of the varying fields are written by packed's rules (a tag byte, then the
        # payload) rather than through its general walk: one parent, the position, the skip.
        if len(parents) == 1:
            parents_bytes = _ONE_ID + parents[0].raw
        else:
            parents_bytes = packed.encode(list(parents))
        if history.segment is not None:
            position = b"".join((_POSITION, history.segment.raw, packed.encode_uint(history.seq),
                                 packed.encode_uint(history.offset), _ID, history.digest.raw))
        else:
            position = packed.encode(history.to_row())
        body = b"".join((self._head, parents_bytes, self._thread, packed.encode_text(reason.encode("utf-8")),
                         self._shared, position, packed.encode_uint(generation),
                         _NULL if skip is None else _ID + skip.raw))
        return body, hash_object("checkpoint", body)


_ID, _NULL = bytes((packed.ID,)), bytes((packed.NULL,))
_ONE_ID = bytes((packed.LIST, 1, packed.ID))          # a list of one id, before the id
_POSITION = bytes((packed.LIST, 4, packed.ID))        # a position's row, before its segment id
