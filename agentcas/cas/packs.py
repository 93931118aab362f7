"""Packed objects (store formats 3 and 4): objects appended into packs, found through a compact index.

An embedded store used to keep one B-tree row per object under its random 32-byte id; the
pages of such a tree are about 60% full, and every object paid its key and a 22-byte header.
Format 3 appends objects instead, and finds them through a small index (docs/FORMAT.md
section 4.2, docs/PACKS.md):

  packs      u64be pack number -> u8 3 | u64be base time | record*          (plain)
                                or u8 4 | u64be base time | zstd(record*)    (compressed)
  packindex  the id's first INDEX_KEY bytes -> (varint pack, varint offset)+
  packlive   u64be pack number -> varint live records | varint live bytes

  record := id (32) | u8 kind << 4 | codec | varint size | zigzag varint (written_at - base time)
            | varint body length | body

Pack numbers only grow, and packs are written with LMDB's append mode, so their pages are
full. A write transaction appends its small records to the last pack while that pack,
compressed as a whole, stays within one overflow page (`small_pack_limit`): a step's objects
name each other's ids and repeat the previous step's fields, which one zstd frame over the
records stores once (`plain` inflates such a pack; offsets are those of its plain form).
Larger records go into plain packs of about BIG_PACK_BYTES; each pack is one value, so a
read is one index lookup and one slice (and, for a compressed pack, one inflation, cached).
An index row holds every location whose id starts with its key; a reader compares the full
id stored in the record (a collision of short keys costs a second look, never a wrong
object). `packlive` counts what the index still points at in each pack: a delete decrements
it and drops a pack that has nothing left, and a repack rewrites packs whose dead share is
high (gc/repack.py). A record read back is given the header of a stored value
(cas/framing.py) with its own `written_at`, so the layers above see what they saw before.

A store being upgraded from format 2 still holds rows in the `objects` table: reads fall
back to it and `upgrade_step` moves them into packs in bounded transactions.
"""

from __future__ import annotations

import heapq
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import zstandard

from agentcas.cas import crashpoints, framing
from agentcas.cas.blobstore.base import BlobInfo
from agentcas.cas.encoding import NotCanonical
from agentcas.cas.packed import read_varint, varint
from agentcas.errors import IntegrityError

PACKS, INDEX, LIVE, LEGACY = "packs", "packindex", "packlive", "objects"
TABLES = (PACKS, INDEX, LIVE)
PACK_VERSION = 3                     # a plain pack: records as they are
COMPRESSED_VERSION = 4               # a small pack: its records in one zstd frame
SMALL_PACK_LEVEL = 3                 # zstd level of a compressed pack (rewritten per write)
MAX_PLAIN_BYTES = 1 << 20            # a compressed pack's records inflate to at most this
SMALL_PACK_PAGES = 1                 # LMDB pages a compressed pack fills (a read inflates it)
INFLATED_PACKS = 256                 # compressed packs kept inflated (checked by their bytes)
PACK_HEADER = struct.Struct(">BQ")   # version, base time (its first record's written_at)
INDEX_KEY = 8                        # id bytes an index key keeps
ID_SIZE = 32
BIG_PACK_BYTES = 64 * 1024           # a pack of large records closes once it holds this much
LEAF_BYTES = 2016                    # the largest value kept inside a 4 KiB LMDB leaf page
RECENT_PACKS = 256                   # packs a reader keeps at hand within one transaction
_U64 = struct.Struct(">Q")


class CorruptPack(IntegrityError):
    """A pack or index row that does not parse, or disagrees with the other."""


def pack_key(number: int) -> bytes:
    return _U64.pack(number)


def pack_number(key: bytes) -> int:
    return _U64.unpack(bytes(key))[0]


class Record:
    """One object as stored in a pack (a plain class: one is made per object read)."""

    __slots__ = ("id", "kind", "codec", "size", "written_at", "body", "offset", "end")

    def __init__(self, id: bytes, kind: int, codec: int, size: int, written_at: int, body, offset: int, end: int):
        self.id = id                  # the object's full id
        self.kind = kind
        self.codec = codec
        self.size = size              # the object's length (uncompressed)
        self.written_at = written_at
        self.body = body              # raw or one zstd frame
        self.offset = offset          # where the record starts in its pack
        self.end = end                # where it ends

    @property
    def length(self) -> int:
        return self.end - self.offset

    def framed(self) -> bytes:
        """The stored value of section 3.1 (what BlobStore.get returns)."""
        return framing.make_header(self.kind, self.codec, self.size, self.written_at) + bytes(self.body)

    def header(self) -> bytes:
        return framing.make_header(self.kind, self.codec, self.size, self.written_at)


def encode_record(raw: bytes, kind: int, codec: int, size: int, written_at: int, body, base: int) -> bytes:
    """A record for a pack whose base time is `base`."""
    age = written_at - base
    zigzag = age * 2 if age >= 0 else -age * 2 - 1
    return b"".join((bytes(raw), bytes((kind << 4 | codec,)), varint(size), varint(zigzag), varint(len(body)), body))


def record_of_value(raw: bytes, framed, base: int) -> bytes:
    """The record of a stored value (section 3.1; its header checked)."""
    kind, codec, size, written_at = framing.read_header(framed)
    return encode_record(raw, kind, codec, size, written_at, framed[framing.HEADER_SIZE:], base)


def read_record(pack, offset: int) -> Record:
    """The record at `offset` of a pack value; CorruptPack if it does not parse."""
    kind, codec, size, written_at, at, end = record_fields(pack, offset)
    return Record(bytes(pack[offset:offset + ID_SIZE]), kind, codec, size, written_at, pack[at:end], offset, end)


def record_fields(pack, offset: int) -> tuple[int, int, int, int, int, int]:
    """(kind, codec, size, written_at, body start, record end) of the record at `offset` of a
    pack value, without copying anything; CorruptPack if it does not parse. Every read of a
    record goes through here, so one-byte varints (most ages, many sizes) are read inline."""
    if not pack or pack[0] != PACK_VERSION:
        raise CorruptPack("pack header is damaged or of an unknown version")
    try:
        at = offset + ID_SIZE
        flags = pack[at]
        size = pack[at + 1]
        at += 2
        if size >= 0x80:
            second = pack[at]
            if 0 < second < 0x80:
                size, at = (size & 0x7F) | second << 7, at + 1
            else:
                size, at = read_varint(pack, at - 1)
        age = pack[at]
        at += 1
        if age >= 0x80:
            age, at = read_varint(pack, at - 1)
        length = pack[at]
        at += 1
        if length >= 0x80:
            second = pack[at]
            if 0 < second < 0x80:
                length, at = (length & 0x7F) | second << 7, at + 1
            else:
                length, at = read_varint(pack, at - 1)
        base = _U64.unpack_from(pack, 1)[0]
    except (NotCanonical, IndexError, struct.error) as exc:
        raise CorruptPack(f"pack record at offset {offset} is damaged: {exc or 'truncated'}") from None
    kind, codec = flags >> 4, flags & 0x0F
    end = at + length
    if end > len(pack) or kind not in framing.KIND_NAMES or codec > framing.CODEC_ZSTD:
        raise CorruptPack(f"pack record at offset {offset} is damaged: bad kind, codec or length")
    return kind, codec, size, base + (age >> 1 if not age & 1 else -((age + 1) >> 1)), at, end


def pack_base(pack) -> int:
    if len(pack) < PACK_HEADER.size or pack[0] not in (PACK_VERSION, COMPRESSED_VERSION):
        raise CorruptPack("pack header is damaged or of an unknown version")
    return PACK_HEADER.unpack_from(pack)[1]


# Compressed packs inflated lately: pack number -> (stored bytes, plain form). An entry
# serves only a pack whose stored bytes equal its own, so it is right for any store and
# transaction; a writer extending the open pack, and readers of recent objects, inflate once.
_INFLATED: dict[int, tuple[bytes, bytes]] = {}


def plain(number: int, pack):
    """The plain form (version 3) of pack `number`'s stored value: itself, or a compressed
    pack inflated (its header with version 3, then its records); CorruptPack if damaged."""
    if pack and pack[0] == PACK_VERSION:
        return pack
    if len(pack) < PACK_HEADER.size or pack[0] != COMPRESSED_VERSION:
        raise CorruptPack("pack header is damaged or of an unknown version")
    stored = bytes(pack)  # (a memoryview compares with bytes item by item: 50x slower)
    known = _INFLATED.get(number)
    if known is not None and known[0] == stored:
        return known[1]
    size = plain_size(stored) - PACK_HEADER.size
    try:
        if not zstandard.get_frame_parameters(stored[PACK_HEADER.size:]).has_checksum:
            raise framing.CorruptValue("its frame has no checksum")
        data = framing.decompress_bounded(stored[PACK_HEADER.size:], size)
    except (framing.CorruptValue, zstandard.ZstdError) as exc:
        raise CorruptPack(f"compressed pack is damaged: {exc}") from None
    out = bytes((PACK_VERSION,)) + stored[1:PACK_HEADER.size] + data
    if len(_INFLATED) >= INFLATED_PACKS:
        _INFLATED.clear()
    _INFLATED[number] = (stored, out)
    return out


def plain_size(pack) -> int:
    """The length of a pack's plain form, read from its header (nothing inflated)."""
    if len(pack) < PACK_HEADER.size or pack[0] not in (PACK_VERSION, COMPRESSED_VERSION):
        raise CorruptPack("pack header is damaged or of an unknown version")
    if pack[0] == PACK_VERSION:
        return len(pack)
    try:
        size = zstandard.frame_content_size(pack[PACK_HEADER.size:])
    except zstandard.ZstdError:
        size = -1
    if not 0 < size <= MAX_PLAIN_BYTES:
        raise CorruptPack(f"compressed pack declares {size} bytes of records")
    return PACK_HEADER.size + size


def small_pack_limit(leaf_bytes: int) -> int:
    """The most a compressed pack may take: SMALL_PACK_PAGES overflow pages less their
    16-byte header (leaf_bytes is a little under half a page: lmdb_store.leaf_value_limit)."""
    return SMALL_PACK_PAGES * (2 * (leaf_bytes + 24) + 16) - 16


def stored_form(number: int, pack: bytes) -> bytes:
    """What small pack `number` (its plain form) is stored as: compressed (version 4) when
    that is shorter, and then kept inflated for the next write or read of it."""
    squeezed = (bytes((COMPRESSED_VERSION,)) + pack[1:PACK_HEADER.size]
                + framing.compress_checked(pack[PACK_HEADER.size:], SMALL_PACK_LEVEL))
    if len(squeezed) >= len(pack):
        return pack
    if len(_INFLATED) >= INFLATED_PACKS:
        _INFLATED.clear()
    _INFLATED[number] = (squeezed, pack)
    return squeezed


def records(pack) -> Iterator[Record]:
    """Every record of a pack value, in order."""
    at = PACK_HEADER.size
    while at < len(pack):
        record = read_record(pack, at)
        yield record
        at = record.end


def record_offsets(pack) -> Iterator[tuple[int, int]]:
    """(offset, end) of every record of a pack value, in order (nothing copied)."""
    at, size = PACK_HEADER.size, len(pack)
    while at < size:
        end = record_fields(pack, at)[5]
        yield at, end
        at = end


def decode_locations(value) -> list[tuple[int, int]]:
    """The (pack, offset) locations of an index row."""
    out, at, end = [], 0, len(value)
    while at < end:
        pack, at = _small_varint(value, at)
        offset, at = _small_varint(value, at)
        out.append((pack, offset))
    return out


def encode_locations(locations) -> bytes:
    return b"".join(varint(pack) + varint(offset) for pack, offset in locations)


def _live(value) -> tuple[int, int]:
    count, at = read_varint(value, 0)
    size, _ = read_varint(value, at)
    return count, size


# -- reading -----------------------------------------------------------------------------------

def locate(txn, raw: bytes) -> tuple[int, Record] | None:
    """(pack number, record) of the object `raw`, or None."""
    found = _find(txn, raw)
    return None if found is None else (found[0], read_record(found[1], found[2]))


def _find(txn, raw: bytes, fields: bool = True, recent: dict | None = None):
    """(pack number, pack value, record offset, record fields or None without `fields`) of
    object `raw`, or None; CorruptPack if its index row or record is damaged. The one lookup
    behind every read: an index row, a pack (a view into the store when the reader has
    buffers) and one record's fields, with nothing copied and no object made. `recent`
    ({pack number: pack}, kept by a reader for one transaction) spares a walk the pack
    lookup when it reads objects written together, as walks do."""
    row = txn.get(INDEX, raw[:INDEX_KEY])
    if row is None:
        return None
    at, end = 0, len(row)
    while at < end:
        number, at = _small_varint(row, at)
        offset, at = _small_varint(row, at)
        pack = None if recent is None else recent.get(number)
        if pack is None:
            pack = txn.get(PACKS, _U64.pack(number))
            if pack is None:
                raise CorruptPack(f"the index names pack {number}, which is missing")
            pack = plain(number, pack)
            if recent is not None:
                if len(recent) >= RECENT_PACKS:
                    recent.clear()
                recent[number] = pack
        held = pack[offset:offset + ID_SIZE]
        if held == raw:
            return number, pack, offset, record_fields(pack, offset) if fields else None
        if held[:INDEX_KEY] != raw[:INDEX_KEY]:
            record_fields(pack, offset)  # a damaged record is named as such
            raise CorruptPack(f"the index row of {raw[:INDEX_KEY].hex()} names pack {number} offset {offset}, "
                              f"which holds {bytes(held).hex()}")
    return None


def _small_varint(data, at: int) -> tuple[int, int]:
    """(value, position after it) of the varint at `at`, one and two bytes read here (pack
    numbers and offsets, sizes); CorruptPack if damaged."""
    try:
        first = data[at]
        if first < 0x80:
            return first, at + 1
        second = data[at + 1]
        if 0 < second < 0x80:
            return (first & 0x7F) | second << 7, at + 2
        return read_varint(data, at)
    except (NotCanonical, IndexError) as exc:
        raise CorruptPack(f"index row is damaged: {exc or 'truncated'}") from None


def get(txn, raw: bytes, recent: dict | None = None):
    """The stored value (section 3.1) of object `raw`, or None; IntegrityError naming it if damaged."""
    raw = bytes(raw)
    try:
        found = _find(txn, raw, recent=recent)
    except CorruptPack as exc:
        raise IntegrityError(f"object {raw.hex()} is corrupt: {exc}") from None
    if found is not None:
        _, pack, _, (kind, codec, size, written_at, at, end) = found
        return framing.make_header(kind, codec, size, written_at) + pack[at:end]
    value = txn.get(LEGACY, raw)
    return None if value is None else bytes(value)


def has(txn, raw: bytes, recent: dict | None = None) -> bool:
    raw = bytes(raw)
    try:
        return _find(txn, raw, fields=False, recent=recent) is not None or txn.get(LEGACY, raw) is not None
    except CorruptPack:
        return True  # something is stored there: a read names the damage


def header(txn, raw: bytes, recent: dict | None = None) -> bytes | None:
    raw = bytes(raw)
    try:
        found = _find(txn, raw, recent=recent)
    except CorruptPack as exc:
        raise IntegrityError(f"object {raw.hex()} is corrupt: {exc}") from None
    if found is not None:
        return framing.make_header(*found[3][:4])
    value = txn.get(LEGACY, raw)
    return None if value is None else bytes(value[:framing.HEADER_SIZE])


def count(txn) -> int:
    """Objects stored (an index row per short key: a collision of short keys counts once)."""
    return txn.count(INDEX) + txn.count(LEGACY)


def list_objects(txn, start: bytes | None = None) -> Iterator[BlobInfo]:
    """Every stored object from `start` on, in id order (packed ones and any not yet upgraded)."""
    return heapq.merge(_list_packed(txn, start), list_legacy(txn, start), key=lambda info: info.key)


def _list_packed(txn, start):
    first = None if start is None else bytes(start[:INDEX_KEY])
    for _, row in txn.scan(INDEX, start=first):
        at, end, infos = 0, len(row), []
        while at < end:
            try:
                number, at = _small_varint(row, at)
                offset, at = _small_varint(row, at)
            except CorruptPack:
                break  # fsck names the row; a listing lists what it can read
            try:
                pack = plain(number, txn.get(PACKS, _U64.pack(number)))
                kind, _, _, written_at, body, stop = record_fields(pack, offset)
            except (CorruptPack, TypeError):
                continue
            raw = bytes(pack[offset:offset + ID_SIZE])
            if start is None or raw >= start:
                # The size of its stored value (section 3.1), as a read returns it.
                infos.append(BlobInfo(raw, framing.HEADER_SIZE + stop - body, float(written_at), kind))
        if len(infos) > 1:
            infos.sort(key=lambda info: info.key)
        yield from infos


def scan_packed(txn, after: tuple[int, int] | None = None) -> Iterator[tuple[tuple[int, int], BlobInfo]]:
    """((pack number, offset), info) of every packed object after position `after`, in pack
    order: each pack read once, front to back, so a whole-store pass reads the file
    sequentially where a listing in id order reads one pack at random per object (gc's plan).

    A record is an object where its index row names it (as `stored_values` decides); a pack
    whose live row counts every record byte as live is all objects, with no index read. The
    live row is only trusted to skip lookups: a record it wrongly calls live is one a sweep
    re-reads through the index before deleting anything. A damaged pack or record is skipped
    (fsck names it), as a listing lists what it can read."""
    start = None if after is None else _U64.pack(after[0])
    for key, pack in txn.scan(PACKS, start=start):
        number = pack_number(key)
        try:
            pack = plain(number, pack)
        except CorruptPack:
            continue
        at, size = PACK_HEADER.size, len(pack)
        if after is not None and number == after[0]:
            try:  # past the record at `after` (a pack only grows where it is)
                at = record_fields(pack, after[1])[5]
            except CorruptPack:
                continue
        row = txn.get(LIVE, key)
        try:
            all_live = row is not None and _live(row)[1] == size - PACK_HEADER.size
        except (NotCanonical, IndexError):
            all_live = False
        while at < size:
            try:
                kind, _, _, written_at, body, end = record_fields(pack, at)
            except CorruptPack:
                break
            raw = bytes(pack[at:at + ID_SIZE])
            if all_live or _indexed_at(txn, raw, number, at):
                # The size of its stored value (section 3.1), as a read returns it.
                yield (number, at), BlobInfo(raw, framing.HEADER_SIZE + end - body, float(written_at), kind)
            at = end


def list_legacy(txn, start):
    """Every object of a store being upgraded that is still in its `objects` table, from
    `start` on, in id order."""
    for key, value in txn.scan(LEGACY, start=start):
        try:
            kind, _, _, written_at = framing.read_header(value)
        except framing.CorruptValue:
            kind, written_at = None, 0  # a damaged header: whoever reads it names the object
        yield BlobInfo(bytes(key), len(value), float(written_at), kind)


# -- writing -----------------------------------------------------------------------------------

def _last_pack(txn) -> tuple[int, bytes] | None:
    for key, value in txn.scan(PACKS, reverse=True):
        return pack_number(key), value
    return None


def _add_location(txn, raw: bytes, number: int, offset: int) -> None:
    key = raw[:INDEX_KEY]
    row = txn.get(INDEX, key)
    location = varint(number) + varint(offset)
    txn.put(INDEX, key, location if row is None else bytes(row) + location)


def put_new(txn, items, leaf_bytes: int = LEAF_BYTES) -> tuple[int, int]:
    """Store each {raw id: stored value} that is not stored yet: (objects written, their values' bytes).

    Small records go to the last pack while, compressed, it fits one overflow page (else to
    new small packs), larger ones into plain packs of about BIG_PACK_BYTES, so every page
    written is full. A small record keeps its object's bytes uncompressed: the pack's one
    frame compresses them together with the records around them.
    """
    new: dict[bytes, tuple[int, int, int, int, Any]] = {}  # raw -> kind, codec, size, written_at, body
    for raw, value in items.items():
        raw = bytes(raw)
        if raw not in new and not has(txn, raw):
            kind, codec, size, written_at = framing.read_header(value)
            new[raw] = (kind, codec, size, written_at, value[framing.HEADER_SIZE:])
    if not new:
        return 0, 0
    # Small: a record that fits a leaf-page pack (6 spare bytes for its age varint).
    small_limit = leaf_bytes - PACK_HEADER.size - ID_SIZE - 6 - 16
    small = [(raw, fields) for raw, fields in new.items() if len(fields[4]) <= small_limit]
    big = [(raw, fields) for raw, fields in new.items() if len(fields[4]) > small_limit]
    last = _last_pack(txn)
    next_number = 0 if last is None else last[0] + 1
    limit = small_pack_limit(leaf_bytes)
    groups: list[_Group] = []

    def start_group(base: int, small_pack: bool) -> _Group:
        nonlocal next_number
        groups.append(_Group(next_number, b"", base, small_pack, limit))
        next_number += 1
        return groups[-1]

    group: _Group | None = None
    if small and last is not None and len(last[1]) <= limit:
        opened = plain(last[0], last[1])  # the open pack, extended
        group = _Group(last[0], bytes(opened), pack_base(opened), True, limit, bytes(last[1]))
        groups.append(group)
    for raw, (kind, codec, size, written_at, body) in small:
        if codec == framing.CODEC_ZSTD and size <= small_limit:
            body, codec = framing.decompress_bounded(body, size), framing.CODEC_RAW
        if group is None:
            group = start_group(written_at, True)
        rec = encode_record(raw, kind, codec, size, written_at, body, group.base)
        if not group.takes(rec):
            group = start_group(written_at, True)
            rec = encode_record(raw, kind, codec, size, written_at, body, group.base)
        group.add(raw, rec)
    group = None
    for raw, fields in big:
        if group is None or group.size() >= BIG_PACK_BYTES:
            group = start_group(fields[3], False)
        group.add(raw, encode_record(raw, *fields, group.base))
    for group in groups:
        _write_pack(txn, group)
    # Bytes as the BlobStore interface counts them: the stored values (section 3.1) written.
    return len(new), sum(framing.HEADER_SIZE + len(fields[4]) for fields in new.values())


class _Group:
    """The records one write transaction adds to one pack (the open pack or a new one), and
    for a small pack its stored form as last measured, so that filling a pack to its limit
    compresses it a few times, not once per record."""

    def __init__(self, number: int, existing: bytes, base: int, small: bool, limit: int, stored: bytes = b""):
        self.number, self.base, self.small, self.limit = number, base, small, limit
        self.body = bytearray(existing or PACK_HEADER.pack(PACK_VERSION, base))
        self.existing = len(existing)   # bytes of it already stored (0: a new pack)
        self.recs: list[tuple[bytes, int]] = []  # (raw id, offset) of each record added
        self.stored = stored or None    # the stored form of `body`, if known
        self.measured: tuple[int, bytes] | None = None  # (body length, its stored form)
        # Bytes that may still be added without measuring: a frame grows by at most what
        # it is given, and a little (64: ample for a block header and a literals header).
        self.room = limit - len(stored or self.body) - 64

    def size(self) -> int:
        return len(self.body)

    def takes(self, rec: bytes) -> bool:
        """Whether a small record still fits (a new pack takes its first one whatever it is)."""
        if len(self.body) == PACK_HEADER.size:
            return True
        if len(self.body) + len(rec) > MAX_PLAIN_BYTES:
            return False
        if len(rec) <= self.room:
            return True
        stored = stored_form(self.number, bytes(self.body) + rec)
        if len(stored) > self.limit:
            return False
        self.measured = (len(self.body) + len(rec), stored)
        self.room = self.limit - len(stored) - 64 + len(rec)  # add() takes len(rec) off again
        return True

    def add(self, raw: bytes, rec: bytes) -> None:
        self.recs.append((raw, len(self.body)))
        self.body += rec
        self.room -= len(rec)
        measured = self.measured
        self.stored = measured[1] if measured is not None and measured[0] == len(self.body) else None


def append_pack(txn, recs: list[tuple[bytes, bytes]], base: int) -> int:
    """Write `recs` ([(raw id, record made for `base`)]) as one new plain pack after the last
    and index them; its number."""
    last = _last_pack(txn)
    number = 0 if last is None else last[0] + 1
    group = _Group(number, b"", base, False, 0)
    for raw, rec in recs:
        group.add(raw, rec)
    _write_pack(txn, group)
    return number


def _write_pack(txn, group: _Group) -> None:
    """Write a group's pack (compressed if small and shorter so), its index rows and live row."""
    number = group.number
    live_count, live_bytes = (0, 0)
    if group.existing:
        row = txn.get(LIVE, pack_key(number))
        live_count, live_bytes = (0, 0) if row is None else _live(row)
    for raw, offset in group.recs:
        _add_location(txn, raw, number, offset)
    live_count += len(group.recs)
    live_bytes += len(group.body) - max(group.existing, PACK_HEADER.size)
    body = bytes(group.body)
    value = group.stored if group.stored is not None else stored_form(number, body) if group.small else body
    # A new pack is appended; the open pack is overwritten where it is (measured: deleting
    # it and appending it again leaves one pack a page, overwriting keeps two).
    store = txn.put if group.existing else txn.append
    store(PACKS, pack_key(number), value)
    store(LIVE, pack_key(number), varint(live_count) + varint(live_bytes))


def delete(txn, raw: bytes) -> bool:
    """Forget object `raw` (its index location; its pack's live count). A pack with nothing
    live left is deleted at once; partly dead packs wait for a repack. True if it was stored."""
    raw = bytes(raw)
    removed = txn.delete(LEGACY, raw)
    row = txn.get(INDEX, raw[:INDEX_KEY])
    if row is None:
        return removed
    locations = decode_locations(row)
    for i, (number, offset) in enumerate(locations):
        pack = txn.get(PACKS, pack_key(number))
        record = None if pack is None else read_record(plain(number, pack), offset)
        if record is None or record.id != raw:
            continue
        rest = locations[:i] + locations[i + 1:]
        if rest:
            txn.put(INDEX, raw[:INDEX_KEY], encode_locations(rest))
        else:
            txn.delete(INDEX, raw[:INDEX_KEY])
        _forget_bytes(txn, number, record.length)
        return True
    return removed


def _forget_bytes(txn, number: int, length: int) -> None:
    row = txn.get(LIVE, pack_key(number))
    count, size = (1, length) if row is None else _live(row)
    if count <= 1:
        txn.delete(LIVE, pack_key(number))
        txn.delete(PACKS, pack_key(number))
    else:
        txn.put(LIVE, pack_key(number), varint(count - 1) + varint(max(0, size - length)))


# -- upgrading a format-2 store ----------------------------------------------------------------

UPGRADE_BATCH = crashpoints.batch_objects(2048)  # objects moved per transaction


def upgrade_objects(env) -> int:
    """Move every object a format-1 or format-2 store keeps in its `objects` table into packs,
    in transactions of UPGRADE_BATCH objects; how many transactions ran. Each one is whole or
    nothing, and a store killed between two is read as it is (reads fall back to `objects`)
    and resumed by its next writable open, which calls this again."""
    with env.reader() as txn:
        if not txn.count(LEGACY):
            return 0
    start, steps = b"", 0
    while start is not None:
        start = env.write(lambda txn, at=start: upgrade_step(txn, at, UPGRADE_BATCH, env.leaf_bytes))
        steps += 1
    return steps


def upgrade_step(txn, start: bytes = b"", batch: int = UPGRADE_BATCH,
                 leaf_bytes: int = LEAF_BYTES) -> bytes | None:
    """Move up to `batch` objects of the `objects` table from `start` on into packs, in this
    transaction; where the next step starts, or None when none are left after `start`.

    Each object keeps its written_at. A value whose header is damaged
    stays in `objects` (reads and fsck name it there), so a step skips past it.
    """
    moved: dict[bytes, bytes] = {}
    last = None
    taken = 0
    for key, value in txn.scan(LEGACY, start=start or None):
        last = bytes(key)
        taken += 1
        try:
            framing.read_header(value)
        except framing.CorruptValue:
            continue
        moved[last] = bytes(value)
        if taken >= batch:
            break
    for key in moved:
        txn.delete(LEGACY, key)
    put_new(txn, moved, leaf_bytes)
    return None if taken < batch or last is None else last + b"\0"


# -- checking (fsck) ---------------------------------------------------------------------------

@dataclass
class PackCheck:
    """What a pass over every pack and index row found (fsck's second direction)."""

    packs: int = 0
    pack_bytes: int = 0          # bytes of every pack value
    reclaimable_bytes: int = 0   # records no index row names (a repack drops them)
    problems: list = field(default_factory=list)  # [(what, message, raw id hex or None)]
    indexed: int = 0             # records found where their index row names them


def check_packs(txn) -> PackCheck:
    """Every pack byte is a record, indexed or counted reclaimable; every index row names
    records that exist under its key; every live row agrees with the index. Streams the
    tables (memory does not grow with the store)."""
    found = PackCheck()
    for _ in stored_values(txn, found, values=False):
        pass
    return found


def stored_values(txn, check: PackCheck, values: bool = True) -> Iterator[tuple[BlobInfo, bytes]]:
    """(info, stored value) of every stored object, read pack by pack (each pack once, in
    order, where a read by id costs an index row, a pack and a record), then the objects not
    yet upgraded; `check` gathers check_packs' findings on the way (complete once the stream
    is). What a walk over every object reads (fsck).

    Each record looks up its own index row: one found where its row names it is live and
    accounts for that location; any other is dead (reclaimable, skipped). So when the index
    holds exactly as many locations as were accounted for, and no row names one twice, every
    location names a record of its key, and the index is only counted; otherwise each row
    is resolved, to name the ones that are wrong."""
    for key, pack in txn.scan(PACKS):
        number = pack_number(key)
        check.packs += 1
        check.pack_bytes += len(pack)
        live_count = live_bytes = 0
        damaged = False
        try:
            pack = plain(number, pack)
        except CorruptPack as exc:
            check.problems.append(("pack", f"pack {number}: {exc}", None))
            continue
        at, size = PACK_HEADER.size, len(pack)
        while at < size:
            try:
                kind, codec, length, written_at, start, end = record_fields(pack, at)
            except CorruptPack as exc:
                check.problems.append(("pack", f"pack {number}: {exc}", None))
                damaged = True
                break
            raw = bytes(pack[at:at + ID_SIZE])
            if _indexed_at(txn, raw, number, at):
                live_count += 1
                live_bytes += end - at
                if values:
                    yield (BlobInfo(raw, framing.HEADER_SIZE + end - start, float(written_at), kind),
                           framing.make_header(kind, codec, length, written_at) + pack[start:end])
            else:
                check.reclaimable_bytes += end - at
            at = end
        if damaged:
            continue
        check.indexed += live_count
        row = txn.get(LIVE, key)
        counted = None if row is None else _live(row)
        if counted != (live_count, live_bytes):
            check.problems.append(("pack", f"pack {number}: its live row says {counted}, the index names "
                                   f"{live_count} records of {live_bytes} bytes", None))
    locations, suspect = 0, False
    for _, row in txn.scan(INDEX):
        try:
            named = _location_count(row)
        except CorruptPack:
            named = None
        if named is None:
            suspect = True
            break
        locations += named
    if suspect or locations != check.indexed:
        _check_index_rows(txn, check)
    if values:
        for info in list_legacy(txn, None):
            value = txn.get(LEGACY, info.key)
            if value is not None:
                yield info, bytes(value)


def _check_index_rows(txn, found: PackCheck) -> None:
    """Resolve every location of every index row, naming each row that is wrong."""
    for key, row in txn.scan(INDEX):
        try:
            named = decode_locations(row)
            for number, offset in named:
                pack = txn.get(PACKS, pack_key(number))
                if pack is None:
                    raise CorruptPack(f"names pack {number}, which is missing")
                pack = plain(number, pack)
                record_fields(pack, offset)
                if pack[offset:offset + INDEX_KEY] != bytes(key):
                    raise CorruptPack(f"names pack {number} offset {offset}, which holds "
                                      f"{bytes(pack[offset:offset + ID_SIZE]).hex()}")
            if len(set(named)) != len(named):
                raise CorruptPack("names one location twice")
        except CorruptPack as exc:
            found.problems.append(("index", f"index row {bytes(key).hex()}: {exc}", bytes(key).hex()))


def _indexed_at(txn, raw, number: int, offset: int) -> bool:
    """Whether the index row of `raw` names (number, offset); False for a damaged row (the
    index pass of check_packs names it)."""
    row = txn.get(INDEX, bytes(raw[:INDEX_KEY]))
    if row is None:
        return False
    location = varint(number) + varint(offset)
    if row == location:  # a row of one location: nearly every row
        return True
    try:
        return len(row) > len(location) and (number, offset) in decode_locations(row)
    except CorruptPack:
        return False


_VARINT_ENDS = bytes(range(0x80))  # the last byte of a varint is under 0x80


def _location_count(row) -> int | None:
    """How many locations an index row holds (two varint ends each), or None if it may be
    damaged or name one location twice (then check_packs resolves every row)."""
    row = bytes(row)
    if not row or row[-1] >= 0x80:
        return None
    ends = len(row) - len(row.translate(None, _VARINT_ENDS))
    if ends == 2:
        return 1
    if ends % 2:
        return None
    named = decode_locations(row)
    return len(named) if len(set(named)) == len(named) else None


# -- repacking (gc) ----------------------------------------------------------------------------

REPACK_DEAD_SHARE = 0.25          # a pack is rewritten once this share of its record bytes is dead
REPACK_BATCH_BYTES = 8 << 20      # live record bytes moved per transaction
# Live records moved per transaction: each moved record rewrites its index row, and a write
# transaction holds every page it dirties in memory (LMDB keeps that memory for later ones).
REPACK_BATCH_OBJECTS = 1024


@dataclass
class RepackCandidates:
    """Packs worth rewriting, found by streaming `packlive` (one row per pack)."""

    numbers: list            # at most one batch of pack numbers, in order
    dead_bytes: int          # what rewriting them reclaims
    live_bytes: int          # what rewriting them moves
    next_start: bytes | None  # where the next batch's scan starts (None: no more packs)


def repack_candidates(txn, start: bytes = b"", dead_share: float = REPACK_DEAD_SHARE,
                      batch_bytes: int = REPACK_BATCH_BYTES, batch_objects: int = REPACK_BATCH_OBJECTS,
                      tick=None) -> RepackCandidates:
    """The next packs from `start` on whose dead share reaches `dead_share`, up to about
    `batch_bytes` of live bytes or `batch_objects` live records to move. A pack's size is read
    from its value's length (no record is parsed): memory and time per pack are constant;
    `tick()`, if given, is called per pack read (gc's PageReleaser)."""
    found = RepackCandidates([], 0, 0, None)
    objects = 0
    for key, row in txn.scan(LIVE, start=start or None):
        if tick is not None:
            tick()
        number = pack_number(key)
        pack = txn.get(PACKS, key)
        if pack is None:
            continue  # fsck names a live row without its pack
        count, live = _live(row)
        try:
            total = plain_size(pack) - PACK_HEADER.size
        except CorruptPack:
            continue  # fsck names a damaged pack; a repack leaves it as it is
        dead = total - live
        if total > 0 and dead >= dead_share * total and dead > 0:
            found.numbers.append(number)
            found.dead_bytes += dead
            found.live_bytes += live
            objects += count
            if found.live_bytes >= batch_bytes or objects >= batch_objects:
                found.next_start = pack_key(number + 1)
                break
    return found


def repack(txn, numbers, leaf_bytes: int = LEAF_BYTES, tick=None) -> tuple[int, int, int]:
    """Rewrite packs `numbers` in this transaction: their live records are stored again
    (appended to the open pack or new packs, each keeping its bytes and written_at), their
    index locations moved, the packs deleted; (packs rewritten, bytes reclaimed, objects
    moved). Only what the index names is kept, so this decides nothing about liveness: the
    sweep did, under its fence. `tick(n)`, if given, is called with each pack's records."""
    rewritten = reclaimed = moved = 0
    for number in numbers:
        pack = txn.get(PACKS, pack_key(number))
        if pack is None:
            continue
        pack = bytes(plain(number, pack))
        kept = [record for record in records(pack) if _indexed_at(txn, record.id, number, record.offset)]
        live = {record.id: record.framed() for record in kept}
        for raw in live:
            delete(txn, raw)  # the last one deletes the pack and its live row
        txn.delete(PACKS, pack_key(number))
        txn.delete(LIVE, pack_key(number))
        if live:
            put_new(txn, live, leaf_bytes)
        if tick is not None:
            tick(len(kept) + 1)
        rewritten += 1
        reclaimed += len(pack) - sum(record.length for record in kept)  # the moved records take as much again
        moved += len(live)
    return rewritten, reclaimed, moved
