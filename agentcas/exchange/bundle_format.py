"""The bundle file: layout, manifest, and a bounded streaming reader.

    magic   16 bytes  "AGENTCAS-BUNDLE\\n"
    u32 BE  manifest length (<= MAX_MANIFEST_BYTES), then the manifest's canonical JSON
    N x     object record: u8 kind | 32-byte id | u32 BE length | framed value (cas/framing)
    u32 BE  signature count (<= MAX_SIGNATURES), then per signature: u32 BE length | envelope
    trailer "AGCB-END" | u64 BE total file length | BLAKE3 of every byte before this hash

The manifest names N and the byte length of the object records, so a reader knows
where each section ends before it reads it; nothing is trusted until checked. The
reader streams: it holds structured objects (trees, checkpoints, chunk lists,
segments; small) in memory up to a cap and remembers only (offset, length) of chunks,
so memory is bounded by metadata, not by the bundle's size.
"""

from __future__ import annotations

import os
import struct
import zlib
from dataclasses import dataclass, field

import blake3

from agentcas.cas import encoding, framing
from agentcas.cas.digest import Digest
from agentcas.cas.names import BadName, check_relpath, collision_key
from agentcas.cas.objects import JSON_FORMAT, MODE_EXEC, MODE_FILE, OBJECT_FORMAT, HistoryPosition, InvalidObject
from agentcas.cas.source import verify_object
from agentcas.errors import IntegrityError
from agentcas.refs.names import check_thread_name

MAGIC = b"AGENTCAS-BUNDLE\n"
TRAILER_MAGIC = b"AGCB-END"
BUNDLE_FORMAT = "agentcas-bundle"
BUNDLE_VERSION = 1
RECORD_HEAD = struct.Struct(">B32sI")
TRAILER = struct.Struct(">8sQ32s")
U32 = struct.Struct(">I")
MAX_MANIFEST_BYTES = 32 * 1024 * 1024
MAX_MANIFEST_DEPTH = 4
MAX_RECORD_BYTES = 64 * 1024 * 1024
MAX_OBJECT_BYTES = 64 * 1024 * 1024  # uncompressed; chunks are far smaller (cas/chunking.py)
MAX_STRUCTURED_BYTES = 512 * 1024 * 1024
MAX_SIGNATURES = 16
MAX_ENVELOPE_BYTES = 4096
BUNDLE_KINDS = (framing.KIND_CHUNK, framing.KIND_TREE, framing.KIND_CHECKPOINT,
                framing.KIND_CHUNKLIST, framing.KIND_SEGMENT)
MANIFEST_KEYS = {"format", "version", "object_format", "checkpoint", "thread", "checkpoints",
                 "history", "files", "objects", "created_at"}
FILE_KEYS = {"path", "type", "size", "mode", "id"}


class BundleCorrupt(IntegrityError):
    """A bundle that is damaged, truncated, malformed or not self-consistent."""


@dataclass(frozen=True)
class ManifestFile:
    path: str
    size: int
    mode: int
    id: Digest

    def to_doc(self):
        return {"path": self.path, "type": "file", "size": self.size, "mode": f"{self.mode:04o}",
                "id": self.id.hex()}


@dataclass(frozen=True)
class Manifest:
    """What a bundle claims to hold; every claim is checked against the objects."""

    checkpoint: Digest
    thread: str
    checkpoints: tuple[Digest, ...]
    history: HistoryPosition
    files: tuple[ManifestFile, ...]
    object_count: int
    object_bytes: int
    created_at: str

    def to_doc(self):
        return {"format": BUNDLE_FORMAT, "version": BUNDLE_VERSION, "object_format": OBJECT_FORMAT,
                "checkpoint": self.checkpoint.hex(), "thread": self.thread,
                "checkpoints": [c.hex() for c in self.checkpoints], "history": self.history.to_doc(),
                "files": [f.to_doc() for f in self.files],
                "objects": {"count": self.object_count, "bytes": self.object_bytes},
                "created_at": self.created_at}

    def encode(self) -> bytes:
        return encoding.encode(self.to_doc())

    @classmethod
    def decode(cls, data: bytes) -> Manifest:
        try:
            doc = encoding.decode(data)
        except encoding.NotCanonical as exc:
            raise BundleCorrupt(f"bundle manifest is malformed: {exc}") from None
        try:
            return cls._from_doc(doc)
        except (InvalidObject, BadName) as exc:
            raise BundleCorrupt(f"bundle manifest is invalid: {exc}") from None

    @classmethod
    def _from_doc(cls, doc) -> Manifest:
        _check_depth(doc, 0)
        if not isinstance(doc, dict):
            raise InvalidObject("manifest must be a JSON object")
        if set(doc) != MANIFEST_KEYS:
            raise InvalidObject(f"manifest keys must be exactly {sorted(MANIFEST_KEYS)}; "
                                f"unknown {sorted(set(doc) - MANIFEST_KEYS)[:5]}, "
                                f"missing {sorted(MANIFEST_KEYS - set(doc))[:5]}")
        if doc["format"] != BUNDLE_FORMAT:
            raise InvalidObject(f"not an agentcas bundle manifest (format {str(doc['format'])[:40]!r})")
        if doc["version"] != BUNDLE_VERSION:
            raise InvalidObject(f"bundle version {str(doc['version'])[:20]} is not one this agentcas reads "
                                f"({BUNDLE_VERSION}); upgrade agentcas")
        # Format 1 bundles (JSON objects) and format 2 (packed objects) are both read.
        if doc["object_format"] not in (JSON_FORMAT, OBJECT_FORMAT) or isinstance(doc["object_format"], bool):
            raise InvalidObject(f"bundle object format {str(doc['object_format'])[:20]} is not "
                                f"{JSON_FORMAT} or {OBJECT_FORMAT} (a newer agentcas may read it: upgrade agentcas)")
        try:
            check_thread_name(doc["thread"])
        except Exception as exc:  # noqa: BLE001 - a UsageError here is the bundle's fault
            raise InvalidObject(f"manifest thread: {exc}") from None
        if not isinstance(doc["checkpoints"], list) or not doc["checkpoints"]:
            raise InvalidObject("manifest checkpoints must be a non-empty list")
        checkpoints = tuple(_digest(c, "checkpoint id") for c in doc["checkpoints"])
        if len(set(checkpoints)) != len(checkpoints):
            raise InvalidObject("manifest lists a checkpoint twice")
        objects = doc["objects"]
        if not isinstance(objects, dict) or set(objects) != {"count", "bytes"}:
            raise InvalidObject("manifest objects must be {count, bytes}")
        if not isinstance(doc["files"], list):
            raise InvalidObject("manifest files must be a list")
        files = tuple(_file(f) for f in doc["files"])
        _check_paths(files)
        if not isinstance(doc["created_at"], str) or len(doc["created_at"]) > 64:
            raise InvalidObject("manifest created_at must be a short string")
        return cls(_digest(doc["checkpoint"], "checkpoint"), doc["thread"], checkpoints,
                   HistoryPosition.from_doc(doc["history"]), files,
                   _int(objects["count"], "object count"), _int(objects["bytes"], "object bytes"),
                   doc["created_at"])


def _check_depth(value, depth: int) -> None:
    if depth > MAX_MANIFEST_DEPTH:
        raise InvalidObject(f"manifest nested deeper than {MAX_MANIFEST_DEPTH} levels")
    if isinstance(value, dict):
        for item in value.values():
            _check_depth(item, depth + 1)
    elif isinstance(value, list):
        for item in value:
            _check_depth(item, depth + 1)


def _digest(value, what: str) -> Digest:
    if not isinstance(value, str) or len(value) != 64:
        raise InvalidObject(f"{what} is not a 64-hex id")
    try:
        return Digest.parse(value)
    except Exception:  # noqa: BLE001
        raise InvalidObject(f"{what} is not a 64-hex id") from None


def _int(value, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InvalidObject(f"{what} must be a non-negative integer")
    return value


def _file(doc) -> ManifestFile:
    if not isinstance(doc, dict) or set(doc) != FILE_KEYS:
        raise InvalidObject(f"manifest file entries have exactly the keys {sorted(FILE_KEYS)} "
                            f"(got {sorted(doc)[:8] if isinstance(doc, dict) else type(doc).__name__})")
    if doc["type"] != "file":
        raise InvalidObject(f"manifest entry {str(doc['path'])[:80]!r} has type {str(doc['type'])[:20]!r}; "
                            "only regular files (no symlinks, hardlinks or devices)")
    if doc["mode"] not in ("0644", "0755"):
        raise InvalidObject(f"manifest entry {str(doc['path'])[:80]!r} has mode {str(doc['mode'])[:12]!r}; "
                            "only 0644 and 0755")
    if not isinstance(doc["path"], str):
        raise InvalidObject("manifest path must be a string")
    if "\\" in doc["path"] or (len(doc["path"]) >= 2 and doc["path"][1] == ":"):
        raise InvalidObject(f"manifest path {doc['path'][:80]!r} has a backslash or drive letter")
    check_relpath(doc["path"])
    return ManifestFile(doc["path"], _int(doc["size"], "file size"),
                        MODE_EXEC if doc["mode"] == "0755" else MODE_FILE, _digest(doc["id"], "file id"))


def _check_paths(files: tuple[ManifestFile, ...]) -> None:
    """No duplicate paths, no case/NFC collisions, no file that is also a directory."""
    seen: dict[str, str] = {}
    dirs: dict[str, str] = {}
    for item in files:
        parts = item.path.split("/")
        for depth in range(1, len(parts)):
            prefix = "/".join(collision_key(p) for p in parts[:depth])
            dirs.setdefault(prefix, "/".join(parts[:depth]))
        key = "/".join(collision_key(p) for p in parts)
        if key in seen:
            if seen[key] == item.path:
                raise InvalidObject(f"manifest lists {item.path!r} twice")
            raise InvalidObject(f"manifest paths collide by case or Unicode normalisation: "
                                f"{seen[key]!r} and {item.path!r}")
        seen[key] = item.path
    for key, path in seen.items():
        if key in dirs:
            raise InvalidObject(f"manifest path {path!r} is both a file and a directory")
    # Two directory spellings that collide (A/x and a/y) would merge on some file systems.
    for item in files:
        parts = item.path.split("/")
        for depth in range(1, len(parts)):
            key = "/".join(collision_key(p) for p in parts[:depth])
            if dirs[key] != "/".join(parts[:depth]):
                raise InvalidObject(f"manifest directories collide by case or Unicode normalisation: "
                                    f"{dirs[key]!r} and {'/'.join(parts[:depth])!r}")


# --- reading --------------------------------------------------------------------------------

@dataclass
class ObjectIndex:
    """Where each object of a bundle is: structured ones in memory, chunks by offset."""

    kinds: dict            # raw id -> kind
    structured: dict       # raw id -> framed bytes (trees, checkpoints, chunk lists, segments)
    chunks: dict           # raw id -> (offset of the framed value, its length)
    order: list            # raw ids in file order
    sizes: dict = field(default_factory=dict)  # raw id -> a chunk's uncompressed size (verified)


@dataclass
class ParsedBundle:
    manifest: Manifest
    index: ObjectIndex
    envelopes: list        # raw envelope bytes
    size: int
    objects_start: int


class _Reader:
    """Exact reads from a file object, hashing everything read; short reads are truncation."""

    def __init__(self, handle, size: int):
        self.handle = handle
        self.size = size
        self.pos = 0
        self.hasher = blake3.blake3()

    def read(self, n: int, what: str) -> bytes:
        if n < 0 or self.pos + n > self.size:
            raise BundleCorrupt(f"bundle is truncated (ends inside the {what})")
        data = self.handle.read(n)
        if len(data) != n:
            raise BundleCorrupt(f"bundle is truncated (ends inside the {what})")
        self.pos += n
        self.hasher.update(data)
        return data


def read_record_value(framed: bytes, kind: int, digest: Digest) -> bytes:
    """Unframe (bounded) and verify one object record; return its bytes."""
    try:
        declared = framing.read_header(framed)[2]
        if declared > MAX_OBJECT_BYTES:
            # Checked before decompressing: a small zstd frame must not become gigabytes.
            raise framing.CorruptValue(f"it declares {declared} bytes; a bundle object holds at most "
                                       f"{MAX_OBJECT_BYTES}")
        got_kind, data = framing.unframe(framed)
    except framing.CorruptValue as exc:
        raise BundleCorrupt(f"object {digest.hex()} in the bundle is corrupt: {exc}") from None
    if got_kind != kind:
        raise BundleCorrupt(f"object {digest.hex()} is framed as {framing.KIND_NAMES[got_kind]} "
                            f"but recorded as {framing.KIND_NAMES[kind]}")
    try:
        verify_object(kind, digest, data)
    except IntegrityError as exc:
        raise BundleCorrupt(f"bundle object hash mismatch: {exc}") from None
    return data


def parse(handle, progress=None) -> ParsedBundle:
    """Pass 1: read and check the whole file (layout, every hash, lengths, trailer).

    Checks everything that needs only the file itself; closure, manifest-vs-objects and
    signatures are checked by the caller on the result.
    """
    size = os.fstat(handle.fileno()).st_size
    reader = _Reader(handle, size)
    if reader.read(len(MAGIC), "header") != MAGIC:
        raise BundleCorrupt("not an agentcas bundle (bad magic bytes)")
    (manifest_len,) = U32.unpack(reader.read(4, "header"))
    if manifest_len > MAX_MANIFEST_BYTES:
        raise BundleCorrupt(f"bundle manifest of {manifest_len} bytes exceeds {MAX_MANIFEST_BYTES}")
    manifest = Manifest.decode(reader.read(manifest_len, "manifest"))
    objects_start = reader.pos
    if manifest.object_bytes > size - objects_start:
        raise BundleCorrupt("bundle is truncated (shorter than the object bytes its manifest declares)")
    index = ObjectIndex({}, {}, {}, [])
    structured_bytes = 0
    for _ in range(manifest.object_count):
        kind, raw, length = RECORD_HEAD.unpack(reader.read(RECORD_HEAD.size, "object records"))
        if kind not in BUNDLE_KINDS:
            raise BundleCorrupt(f"bundle record has object kind {kind}, not one a bundle may carry")
        if length > MAX_RECORD_BYTES or length < framing.HEADER_SIZE:
            raise BundleCorrupt(f"bundle record of {length} bytes is out of bounds")
        if raw in index.kinds:
            raise BundleCorrupt(f"bundle carries object {raw.hex()} twice")
        offset = reader.pos
        framed = reader.read(length, "object records")
        data = read_record_value(framed, kind, Digest(raw))
        index.kinds[raw] = kind
        index.order.append(raw)
        if kind == framing.KIND_CHUNK:
            index.chunks[raw] = (offset, length)
            index.sizes[raw] = len(data)
        else:
            structured_bytes += length
            if structured_bytes > MAX_STRUCTURED_BYTES:
                raise BundleCorrupt("bundle metadata exceeds what this importer holds in memory")
            index.structured[raw] = framed
        if reader.pos - objects_start > manifest.object_bytes:
            raise BundleCorrupt("bundle object records are longer than the manifest declares")
        if progress:
            progress(reader.pos, size)
    if reader.pos - objects_start != manifest.object_bytes:
        raise BundleCorrupt(f"bundle object records take {reader.pos - objects_start} bytes; "
                            f"the manifest declares {manifest.object_bytes}")
    (count,) = U32.unpack(reader.read(4, "signature section"))
    if count > MAX_SIGNATURES:
        raise BundleCorrupt(f"bundle carries {count} signatures; at most {MAX_SIGNATURES}")
    envelopes = []
    for _ in range(count):
        (length,) = U32.unpack(reader.read(4, "signature section"))
        if length > MAX_ENVELOPE_BYTES:
            raise BundleCorrupt(f"bundle signature of {length} bytes exceeds {MAX_ENVELOPE_BYTES}")
        envelopes.append(reader.read(length, "signature section"))
    magic_and_length = reader.read(16, "trailer")
    digest = reader.hasher.digest()
    tail = handle.read(32 + 1)
    if len(tail) < 32:
        raise BundleCorrupt("bundle is truncated (ends inside the trailer)")
    magic, total, stored_hash = TRAILER.unpack(magic_and_length + tail[:32])
    if magic != TRAILER_MAGIC:
        raise BundleCorrupt("bundle trailer is missing or damaged")
    if total != size or len(tail) > 32:
        raise BundleCorrupt(f"bundle length is {size} bytes but its trailer says {total} "
                            "(truncated, or trailing bytes appended)")
    if stored_hash != digest:
        raise BundleCorrupt("bundle checksum does not match its contents")
    return ParsedBundle(manifest, index, envelopes, size, objects_start)


def iter_records(handle, parsed: ParsedBundle):
    """Pass 2: re-read every object record, re-verifying it; yields (digest, kind, framed)."""
    handle.seek(parsed.objects_start)
    for expected in parsed.index.order:
        head = handle.read(RECORD_HEAD.size)
        if len(head) != RECORD_HEAD.size:
            raise BundleCorrupt("bundle changed while it was being imported")
        kind, raw, length = RECORD_HEAD.unpack(head)
        if raw != expected or kind != parsed.index.kinds[raw]:
            raise BundleCorrupt("bundle changed while it was being imported")
        framed = handle.read(length)
        if len(framed) != length:
            raise BundleCorrupt("bundle changed while it was being imported")
        try:
            read_record_value(framed, kind, Digest(raw))
        except BundleCorrupt as exc:  # pass 1 found it whole: the file changed since
            raise BundleCorrupt(f"bundle changed while it was being imported ({exc})") from None
        yield Digest(raw), kind, framed


def restamp(framed: bytes, written_at: int) -> bytes:
    """The same stored value with a new `written_at` (and header CRC); body untouched."""
    kind, codec, size, _, _ = framing.HEADER.unpack_from(framed)
    head = framing.HEADER.pack(kind, codec, size, written_at, 0)[:-4]
    return head + struct.pack(">I", zlib.crc32(head)) + framed[framing.HEADER_SIZE:]
