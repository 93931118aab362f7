"""A shared store's objects in pack objects on S3, indexed in the metadata store (format 3).

A write batch becomes a few pack objects, `PREFIX/packs/<64 hex of BLAKE3(pack)>`, each
the batch's framed objects one after another (cas/framing.py) up to PACK_BYTES (16 MiB:
restic's default; one object larger than that is a pack alone), then a trailer naming
them (docs/FORMAT.md section 4.3). The batch's chunks come first, its small objects
(trees, chunk lists, checkpoints) together at the end, as restic keeps tree blobs apart
from data blobs: a restore reads all of a batch's chunk lists in one GET. A pack is
written once (create-if-absent) and never changed; it is deleted whole when nothing the
index names lives in it.

The index lives in the metadata store (PostgreSQL), two tables of sealed rows:

    s3index  id -> pack (32) | offset u64 | length u32 | the object's 22-byte header
    s3packs  pack -> size u64 | written_at u64 | member ids (32 bytes each)

An object is stored once its `s3index` row is: a pack nothing indexes yet is invisible.
So a write is: pack PUT(s) first, then the rows, in one metadata request (`put_many`),
or handed to the caller (`stage_many`) to go in the very exchange that moves a ref: a
step on a shared store is then one PUT and no extra round trip. A writer killed between
the two leaves a pack nothing names, which fsck reports as reclaimable and gc deletes.
Readers look rows up in one statement (`read_many`) and fetch ranged GETs, one per run
of wanted objects that lie together in a pack; headers come from the rows, with no
request to S3. A store made before packs (shared format 2, one S3 object per id under
`objects/`) is read both ways while `legacy` is set (cas/store_format.py sets it from
the store's format record): an id the index lacks is looked for there.

Deleting (gc, inside a fenced sweep batch, cas/leases.py): an object's row goes first;
a pack whose members' rows all point elsewhere or are gone is then dead, its `s3packs`
row is removed and the pack object deleted. A pack is judged by its members, not by a
counter, so two writers that raced to store the same object (each in its own pack,
the later row winning) cannot leave a count that never reaches zero. Killed between the
row and the S3 delete, a pack is left unnamed: `sweep_unnamed_packs` (gc) deletes packs
no `s3packs` row names and older than the grace period, in a fenced batch, when no
writer holds a lease, so a pack whose writer is still to land its rows is never taken.
Crash point (cas/crashpoints.py): `s3.pack` after each pack object written.
"""

from __future__ import annotations

import heapq
import struct
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import cast

import blake3

from agentcas.cas import framing
from agentcas.cas.blobstore.base import KEY_SIZE, BlobInfo, BlobStore
from agentcas.cas.metastore.base import MetadataStore
from agentcas.cas.sealed import seal, unseal
from agentcas.errors import IntegrityError

PACK_BYTES = 16 * 1024 * 1024  # restic's default pack size: 1 GiB is ~64 PUTs
GAP_BYTES = 64 * 1024          # wanted objects this close together in a pack are one ranged GET
RUN_BYTES = 8 * 1024 * 1024    # ... up to this many bytes a GET (a restore window of 32 MiB: 4 GETs)
INDEX = "s3index"
PACKS = "s3packs"
_LOCATION = struct.Struct(">32sQI")
_PACK_ROW = struct.Struct(">QQ")
_TRAILER_ENTRY = struct.Struct(">32sQI")
_TRAILER_END = struct.Struct(">I16s")
PACK_MAGIC = b"agentcas-pack-s3"  # 16 bytes, the last of every pack


@dataclass(frozen=True)
class Location:
    """Where an object is: its pack (raw 32-byte hash), offset and length, and its header."""

    pack: bytes
    offset: int
    length: int
    header: bytes

    def encode(self) -> bytes:
        return _LOCATION.pack(self.pack, self.offset, self.length) + self.header

    @classmethod
    def decode(cls, value: bytes) -> Location:
        pack, offset, length = _LOCATION.unpack_from(value)
        return cls(pack, offset, length, bytes(value[_LOCATION.size:_LOCATION.size + framing.HEADER_SIZE]))


@dataclass(frozen=True)
class PackRow:
    """A pack as the index knows it: its size, when it was written, the ids it holds."""

    size: int
    written_at: int
    members: tuple[bytes, ...]

    def encode(self) -> bytes:
        return _PACK_ROW.pack(self.size, self.written_at) + b"".join(self.members)

    @classmethod
    def decode(cls, value: bytes) -> PackRow:
        size, written_at = _PACK_ROW.unpack_from(value)
        ids = value[_PACK_ROW.size:]
        return cls(size, written_at, tuple(bytes(ids[i:i + KEY_SIZE]) for i in range(0, len(ids), KEY_SIZE)))


def location_of(key: bytes, value: bytes) -> Location:
    return Location.decode(unseal(INDEX, key, value))


def pack_row_of(pack: bytes, value: bytes) -> PackRow:
    return PackRow.decode(unseal(PACKS, pack, value))


def build_packs(items: Mapping[bytes, bytes], pack_bytes: int = PACK_BYTES):
    """Cut `items` ({id: framed value}) into packs of about `pack_bytes`:
    [(pack hash, pack bytes, {id: Location})]. Chunks come first in the order given, then
    every other object (trees, chunk lists, checkpoints: small, and read before the chunks
    they name), together at the end of the last pack, so a reader gets all of a batch's
    in one ranged GET. The batch is shared evenly among the nearest whole number of packs
    (a 64.5 MiB batch: four packs, not four and a small fifth), so a pack is at most
    ~1.5 x `pack_bytes` (or one larger object alone)."""
    total = sum(len(value) for value in items.values())
    target = total / max(1, round(total / pack_bytes))
    packs = []
    group: list[tuple[bytes, bytes]] = []
    size = 0
    ordered = [item for item in items.items() if item[1][0] == framing.KIND_CHUNK]
    ordered += [item for item in items.items() if item[1][0] != framing.KIND_CHUNK]
    for key, value in ordered:
        # A value that would overfill the pack opens the next, with a slack of half of it
        # or of a quarter pack, whichever is more: the small values at a batch's end
        # never spill into a pack of their own.
        if group and size + len(value) > target + max(len(value), target / 4) / 2:
            packs.append(_pack(group))
            group, size = [], 0
        group.append((bytes(key), value))
        size += len(value)
    if group:
        packs.append(_pack(group))
    return packs


def _pack(group: list[tuple[bytes, bytes]]):
    body, entries, offset = [], [], 0
    for key, value in group:
        body.append(value)
        entries.append((key, offset, len(value), bytes(value[:framing.HEADER_SIZE])))
        offset += len(value)
    body += [_TRAILER_ENTRY.pack(key, at, length) for key, at, length, _ in entries]
    data = b"".join(body + [_TRAILER_END.pack(len(entries), PACK_MAGIC)])  # one copy of the values
    name = blake3.blake3(data).digest()
    return name, data, {key: Location(name, at, length, header) for key, at, length, header in entries}


def pack_members(data: bytes) -> list[tuple[bytes, int, int]]:
    """The (id, offset, length) a pack's trailer lists; IntegrityError if it has none."""
    if len(data) < _TRAILER_END.size:
        raise IntegrityError("pack is shorter than its trailer")
    count, magic = _TRAILER_END.unpack_from(data, len(data) - _TRAILER_END.size)
    start = len(data) - _TRAILER_END.size - count * _TRAILER_ENTRY.size
    if magic != PACK_MAGIC or start < 0:
        raise IntegrityError("pack has no trailer")
    return [_TRAILER_ENTRY.unpack_from(data, start + i * _TRAILER_ENTRY.size) for i in range(count)]


class PackedBlobStore(BlobStore):
    """Objects in packs on `remote` (an S3BlobStore), indexed in `meta` (see the module doc)."""

    def __init__(self, remote, meta: MetadataStore, pack_bytes: int = PACK_BYTES):
        self.remote = remote
        self.meta = meta
        self.url = remote.url
        self.chunk_sizes = remote.chunk_sizes
        self.pack_bytes = pack_bytes
        self.legacy = True  # objects may also be one S3 object each (format 2); see store_format
        self.packs_deleted = 0  # by delete_many, for gc's report

    # -- the index -------------------------------------------------------------------------

    def locations(self, keys: Iterable[bytes]) -> dict[bytes, Location]:
        """{id: Location} of the indexed ones among `keys` (one metadata request)."""
        keys = list(dict.fromkeys(bytes(k) for k in keys))
        if not keys:
            return {}
        return {key: location_of(key, value) for key, value in self.meta.read_many(INDEX, keys).items()}

    def _written(self, items: Mapping[bytes, bytes]) -> tuple[list[tuple], int]:
        """Write `items` as packs: (the metadata writes that index them, bytes written)."""
        packs = build_packs(items, self.pack_bytes)
        self.remote.put_packs([(name.hex(), data) for name, data, _ in packs])
        now = int(time.time())
        writes: list[tuple] = []
        for name, data, where in packs:
            writes.append((PACKS, name, seal(PACKS, name, PackRow(len(data), now, tuple(where)).encode())))
            writes += [(INDEX, key, seal(INDEX, key, location.encode())) for key, location in where.items()]
        return writes, sum(len(data) for _, data, _ in packs)

    def stage_many(self, items: Mapping[bytes, bytes]) -> list[tuple]:
        """Write `items` as packs and return the metadata writes that make them stored, for
        the caller's own exchange (a ref move): until they land the objects are not stored."""
        if not items:
            return []
        return self._written(items)[0]

    # -- BlobStore -------------------------------------------------------------------------

    def put_many(self, items):
        written = self.put_many_written(items)
        return len(written), sum(len(items[k]) for k in written)

    def put_many_written(self, items: Mapping[bytes, bytes]) -> set[bytes]:
        """Store the objects not yet stored: packs, then their rows (one metadata request)."""
        items = {bytes(k): v for k, v in items.items()}
        present = self.has_many(items) if items else set()
        new = {k: v for k, v in items.items() if k not in present}
        if new:
            writes, _ = self._written(new)
            self.meta.exchange(writes=writes)
        return set(new)

    def has_many(self, keys: Iterable[bytes]) -> set[bytes]:
        keys = list(dict.fromkeys(bytes(k) for k in keys))
        found = set(self.locations(keys))
        rest = [k for k in keys if k not in found]
        if self.legacy and rest:
            found |= self.remote.has_many(rest)
        return found

    def get(self, key):
        return self.get_many([key]).get(bytes(key))

    def get_many(self, keys: Sequence[bytes]) -> dict[bytes, bytes]:
        return self._fetch(keys, strict=True)

    def fetch_many(self, keys: Sequence[bytes]) -> dict[bytes, bytes]:
        """get_many whose values are read-only views into the GETs' bodies (a restore
        checks and writes each once: no copy of every chunk)."""
        return self._fetch(keys, strict=True, views=True)

    def get_many_stored(self, keys: Sequence[bytes]) -> dict[bytes, bytes]:
        """What the bucket holds, damaged or not (fsck judges; `check_packs` names the pack)."""
        return self._fetch(keys, strict=False)

    def _fetch(self, keys: Sequence[bytes], strict: bool, views: bool = False) -> dict[bytes, bytes]:
        """Values by id: the indexed ones by ranged GETs in parallel (a run of wanted objects
        close together in one pack, up to RUN_BYTES, is one GET), the rest from `objects/` if `legacy`. `strict`:
        a pack that is missing or cut short under an indexed object is an IntegrityError
        naming it; else what was there is returned (short, or absent). `views`: values are
        memoryviews into the GETs' bodies instead of copies."""
        keys = list(dict.fromkeys(bytes(k) for k in keys))
        where = self.locations(keys)
        runs: list[list[tuple[bytes, Location]]] = []
        by_pack: dict[bytes, list[tuple[bytes, Location]]] = {}
        for key, location in where.items():
            by_pack.setdefault(location.pack, []).append((key, location))
        for members in by_pack.values():
            members.sort(key=lambda item: item[1].offset)
            run = [members[0]]
            for item in members[1:]:
                last = run[-1][1]
                end = item[1].offset + item[1].length
                if item[1].offset - (last.offset + last.length) <= GAP_BYTES and \
                        end - run[0][1].offset <= RUN_BYTES:
                    run.append(item)
                else:
                    runs.append(run)
                    run = [item]
            runs.append(run)
        requests = [(run[0][1].pack.hex(), run[0][1].offset,
                     run[-1][1].offset + run[-1][1].length - run[0][1].offset) for run in runs]
        found: dict[bytes, bytes] = {}
        for run, request, data in zip(runs, requests, self.remote.read_pack_ranges(requests)):
            body = data if data is None or not views else cast(bytes, memoryview(data))
            for key, location in run:
                start = location.offset - request[1]
                value = None if body is None else body[start:start + location.length]
                if value is not None and len(value) == location.length:
                    found[key] = value
                elif strict:
                    size = self.remote.pack_size(location.pack.hex())
                    state = "missing" if size is None else f"cut short ({size} bytes)"
                    raise IntegrityError(f"pack {location.pack.hex()} is {state}: object {key.hex()} "
                                         f"at bytes {location.offset}-{location.offset + location.length - 1} "
                                         "cannot be read (run 'agentcas fsck')")
                elif value:
                    found[key] = value  # short: fsck reports it corrupt
        rest = [k for k in keys if k not in where]
        if self.legacy and rest:
            found.update(self.remote.get_many(rest))
        return found

    def header(self, key):
        return self.headers([key]).get(bytes(key))

    def headers(self, keys: Sequence[bytes]) -> dict[bytes, bytes]:
        keys = list(dict.fromkeys(bytes(k) for k in keys))
        found = {key: location.header for key, location in self.locations(keys).items()}
        rest = [k for k in keys if k not in found]
        if self.legacy and rest:
            found.update(self.remote.headers(rest))
        return found

    def list(self) -> Iterator[BlobInfo]:
        """Every object in id order: the index's rows, merged with `objects/` if `legacy`
        (an id in both is listed once)."""
        listings = [self._indexed()]
        if self.legacy:
            listings.append(self.remote.list())
        last = None
        for info in heapq.merge(*listings, key=lambda info: info.key):
            if info.key != last:
                yield info
            last = info.key

    def _indexed(self) -> Iterator[BlobInfo]:
        with self.meta.reader() as txn:
            for key, value in txn.scan(INDEX):
                location = location_of(key, value)
                kind, _, _, written_at = framing.read_header(location.header)
                yield BlobInfo(bytes(key), location.length, written_at, kind)

    def count(self) -> int:
        return sum(1 for _ in self.list())

    def used_bytes(self) -> int:
        with self.meta.reader() as txn:
            packed = sum(pack_row_of(key, value).size for key, value in txn.scan(PACKS))
        return packed + (self.remote.used_bytes() if self.legacy else 0)

    def delete_many(self, keys: Iterable[bytes]) -> int:
        """Delete objects (gc's sweep batch: no writer is between its writes and its ref
        move): their rows, then the packs left with no member indexed there; how many."""
        keys = list(dict.fromkeys(bytes(k) for k in keys))
        where = self.locations(keys)
        deleted = len(where)
        dead = self._dead_packs(where)
        writes = [(INDEX, key, None) for key in where] + [(PACKS, pack, None) for pack in dead]
        if writes:
            self.meta.exchange(writes=writes)
        if dead:
            self.remote.delete_packs([pack.hex() for pack in sorted(dead)])
            self.packs_deleted += len(dead)
        if self.legacy:
            deleted += self.remote.delete_many([k for k in keys if k not in where])
        return deleted

    def _dead_packs(self, going: dict[bytes, Location]) -> set[bytes]:
        """The packs of `going` in which, once those rows are gone, no member is indexed."""
        packs = {location.pack for location in going.values()}
        if not packs:
            return set()
        rows = {pack: pack_row_of(pack, value) for pack, value in self.meta.read_many(PACKS, list(packs)).items()}
        others = {m for row in rows.values() for m in row.members if m not in going}
        live = {location.pack for location in self.locations(others).values()}
        return {pack for pack in rows if pack not in live}

    def sweep_unnamed_packs(self, cutoff: float) -> tuple[int, int]:
        """Delete pack objects no `s3packs` row names, written before `cutoff` (a writer
        killed before its rows landed; a sweep killed before its delete): (packs, bytes).
        Only inside a fenced sweep batch (see the module doc)."""
        unnamed = self.unnamed_packs(cutoff)
        self.remote.delete_packs([name for name, _ in unnamed])
        return len(unnamed), sum(size for _, size in unnamed)

    def unnamed_packs(self, cutoff: float | None = None) -> Sequence[tuple[str, int]]:
        """(name, size) of the pack objects no `s3packs` row names (written before `cutoff`)."""
        listed = [(name, size) for name, size, written_at in self.remote.list_packs()
                  if cutoff is None or written_at < cutoff]
        named: set[bytes] = set()
        for start in range(0, len(listed), 1000):
            batch = [bytes.fromhex(name) for name, _ in listed[start:start + 1000]]
            named |= set(self.meta.read_many(PACKS, batch))
        return [(name, size) for name, size in listed if bytes.fromhex(name) not in named]

    def check_packs(self) -> tuple[Sequence[tuple[str, str, str]], dict]:
        """fsck's pack pass: every `s3packs` row's pack is in the bucket at its size, and every
        pack in the bucket is named by a row or reclaimable. (problems as (what, message,
        pack hex), {"count", "bytes", "reclaimable_bytes"})."""
        listed = {name: size for name, size, _ in self.remote.list_packs()}
        problems: list[tuple[str, str, str]] = []
        count = size = 0
        with self.meta.reader() as txn:
            rows = list(txn.scan(PACKS))
        for key, value in rows:
            name = bytes(key).hex()
            try:
                row = pack_row_of(key, value)
            except IntegrityError as exc:
                problems.append(("row", f"s3packs entry {name}: {exc}", name))
                continue
            count += 1
            size += row.size
            stored = listed.pop(name, None)
            if stored is None:
                problems.append(("pack", f"pack {name} is missing from {self.url}", name))
            elif stored != row.size:
                state = "cut short" if stored < row.size else "longer than written"
                problems.append(("pack", f"pack {name} is {state}: {stored} of {row.size} bytes", name))
        return problems, {"count": count, "bytes": size, "reclaimable_bytes": sum(listed.values())}

    def request_count(self) -> int:
        """S3 requests sent (the S3 store's count)."""
        return self.remote.request_count()

    def close(self) -> None:
        self.remote.close()

    def read_marker(self) -> bytes | None:
        return self.remote.read_marker()

    def create_marker(self, data: bytes) -> bool:
        return self.remote.create_marker(data)
