"""gc's mark set and candidate lists in bounded memory, however many objects are stored.

A Python set of 32-byte ids costs ~100 bytes an id (a bytes object and its set slot),
so marking a million objects took ~100 MB. `MarkSet` holds the same ids packed:
- In memory, an open-addressing table: one bytearray of 32-byte slots, an all-zero
  slot empty (the all-zero id itself is a flag). An id lives in the first empty slot at
  or after slot `hash(id) % capacity` (linear probing; Python's hash of bytes is keyed
  per process, so ids chosen to collide cannot crowd one run). A run of full slots is
  contiguous bytes, so a lookup is two C searches: `find` the run's end (the first
  aligned empty slot), then `find` the id inside the run (a hit must be slot-aligned).
  The table grows by half once it is 3/4 full: 43 to 64 bytes an id, no Python object.
- Past `MEMORY_BUDGET` bytes (AGENTCAS_GC_MEMORY, default 16 MiB) the table does not
  grow: its ids are moved into a table of a temporary LMDB environment (in a directory
  of its own under $TMPDIR, removed when the set is closed or collected, or by the next
  gc on this host if the process was killed) and the
  emptied table takes new ids again, moved in turn whenever it is full. An id is
  marked if either table holds it; ids are never unmarked. A Bloom filter of the ids on
  disk (BLOOM_BITS_PER_ID bits an id, at most an eighth of the budget) answers most
  lookups of ids that are not there without reading the table: a walk asks about every
  object before marking it, and gc's scan about every candidate, so about half the
  lookups are misses, and each read of the table faults pages back in. The environment is mapped
  with writemap and never synced (it dies with gc), so its pages are file-backed: the
  kernel may write them out, and a PageReleaser drops them from gc's resident set
  when the file-backed total passes pages.MAPPED_BUDGET.
`KeySpool` keeps a list of (32-byte id, u64) pairs, gc's candidates and young objects,
packed in memory up to SPOOL_BUFFER bytes (or MEMORY_BUDGET/8 if smaller) and in a
temporary file beyond, read back in order in batches. `KeySizes` maps ids to a u64 (a
shared store's listed sizes, for the report) in a temporary LMDB table from the start,
its pages released like the spilled mark table's. So gc's memory for marks, candidates and
sizes is bounded by constants.
"""

from __future__ import annotations

import array
import os
import shutil
import struct
import tempfile
import weakref
from typing import Any

import lmdb

from agentcas.gc import pages
from agentcas.gc.pages import PageReleaser

KEY_SIZE = 32
MEMORY_BUDGET = int(os.environ.get("AGENTCAS_GC_MEMORY", str(16 << 20)))  # bytes of in-memory ids
# A spool's in-memory part: 256 KiB (~6,500 pairs), then a temporary file. It was
# MEMORY_BUDGET/8 (4 MiB): the candidates of up to ~100,000 objects in memory, so gc's peak
# grew ~40 B per stored object until then; the file's pages are the kernel's page cache.
SPOOL_BUFFER = 256 << 10
SPILL_BATCH = 128         # ids moved to the on-disk table per write transaction (a page written maps ~32-256 KiB)
SPILL_MAP_SIZE = 1 << 36  # the on-disk table's address space (sparse): ~10^9 ids
BLOOM_BITS_PER_ID = 10    # about 1% of absent ids still read the table (5 bits tested)
_BLOOM_HASHES = 5
_BLOOM_MIN_BITS = 1 << 16
_BLOOM_MAX_SHIFT = 25      # five positions of 25 bits from 16 bytes of the id
_MIN_SLOTS = 64
_OVERFLOW_SLOTS = 256     # slots past the last home slot, so a run never wraps around
_WINDOW = 64 * KEY_SIZE    # bytes searched at a time for a run's end
_EMPTY = bytes(KEY_SIZE)
_ZERO = _EMPTY


def _table_bytes(capacity: int) -> int:
    """Bytes of a table with `capacity` home slots and its overflow slots."""
    return (capacity + min(_OVERFLOW_SLOTS, capacity)) * KEY_SIZE


class MarkSet:
    """A set of 32-byte ids (`in`, `add`, `len`) in at most ~`budget` bytes of memory."""

    def __init__(self, budget: int | None = None, expected: int = 0):
        """`expected`: about how many ids will be added (0: unknown), so the table can start
        at the size it would grow to (within the budget) instead of growing step by step."""
        self.budget = MEMORY_BUDGET if budget is None else budget
        self._count = 0          # ids held, both tables
        self._has_zero = False
        capacity = _MIN_SLOTS
        while capacity * 3 // 4 < expected and \
                _table_bytes(capacity + capacity // 2) + _table_bytes(capacity) <= self.budget:
            capacity += capacity // 2
        self._capacity = capacity
        self._expected = expected
        self._table = bytearray(_table_bytes(capacity))
        self._bloom = bytearray()  # bits of the ids on disk (sized at the first spill)
        self._bloom_shift = 0      # log2 of its bits
        self.disk_lookups = 0      # reads of the on-disk table
        self._in_table = 0       # ids in the in-memory table
        self._env: Any = None     # the spill environment (lmdb), once the table spilled
        self._reader: Any = None  # its read transaction
        self._dir: str | None = None
        self._pages: PageReleaser | None = None
        self.spills = 0          # times the in-memory table was moved to disk
        self._missed: tuple[bytes, int, int] | None = None  # (id, start, end) of the last `in` that found nothing

    # -- the in-memory table --------------------------------------------------------------
    def _run(self, raw: bytes) -> tuple[int, int]:
        """(start, end) byte offsets of the run of full slots where `raw` lives or would
        (end -1: the run reaches the table's end)."""
        table = self._table
        start = (hash(raw) % self._capacity) * KEY_SIZE
        if table.startswith(_EMPTY, start):
            return start, start
        # Bounded windows: CPython searches a long haystack with a costlier algorithm.
        low, size = start + KEY_SIZE, len(table)
        while low < size:
            high = min(size, low + _WINDOW)
            end = table.find(_EMPTY, low, high + KEY_SIZE - 1)
            while end != -1 and (end - start) % KEY_SIZE:
                end = table.find(_EMPTY, end + 1, high + KEY_SIZE - 1)
            if end != -1:
                return start, end
            low = high
        return start, -1

    def _in_memory(self, raw: bytes, start: int, end: int) -> bool:
        if start == end:
            return False
        table = self._table
        if table.startswith(raw, start):
            return True
        limit = len(table) if end == -1 else end
        found = table.find(raw, start + KEY_SIZE, limit)
        while found != -1 and (found - start) % KEY_SIZE:
            found = table.find(raw, found + 1, limit)
        return found != -1

    def _on_disk(self, raw: bytes) -> bool:
        if self._reader is None or not self._maybe_on_disk(raw):
            return False
        self.disk_lookups += 1
        if self._pages is not None:
            self._pages.tick()
        return self._reader.get(raw) is not None

    def _maybe_on_disk(self, raw: bytes) -> bool:
        """False if `raw` is certainly not in the on-disk table (its Bloom filter: bit
        positions from the id's own bytes, which are a hash)."""
        bits, shift = self._bloom, self._bloom_shift
        mask = (1 << shift) - 1
        positions = int.from_bytes(raw[8:24], "little")
        for _ in range(_BLOOM_HASHES):
            bit = positions & mask
            if not bits[bit >> 3] >> (bit & 7) & 1:
                return False
            positions >>= shift
        return True

    def _remember_on_disk(self, raw: bytes) -> None:
        bits, shift = self._bloom, self._bloom_shift
        mask = (1 << shift) - 1
        positions = int.from_bytes(raw[8:24], "little")
        for _ in range(_BLOOM_HASHES):
            bit = positions & mask
            bits[bit >> 3] |= 1 << (bit & 7)
            positions >>= shift

    def __contains__(self, raw) -> bool:
        raw = bytes(raw)
        if raw == _ZERO:
            return self._has_zero
        start, end = self._run(raw)
        if self._in_memory(raw, start, end) or (self._reader is not None and self._on_disk(raw)):
            return True
        self._missed = (raw, start, end)  # a walk asks `in` and then adds: add reuses this
        return False

    def add(self, raw) -> None:
        raw = bytes(raw)
        if len(raw) != KEY_SIZE:
            raise ValueError(f"a mark is a {KEY_SIZE}-byte id, not {len(raw)} bytes")
        if raw == _ZERO:
            self._count += not self._has_zero
            self._has_zero = True
            return
        missed, self._missed = self._missed, None
        if missed is not None and missed[0] is raw:
            _, start, end = missed
        else:
            start, end = self._run(raw)
            if self._in_memory(raw, start, end) or (self._reader is not None and self._on_disk(raw)):
                return
        if end == -1 or end + KEY_SIZE > len(self._table):  # the run reached the table's end
            self._place(raw)
        else:
            self._table[end:end + KEY_SIZE] = raw
            self._in_table += 1
        self._count += 1
        if self._in_table * 4 >= self._capacity * 3:
            self._make_room()

    def _place(self, raw: bytes) -> None:
        """Put an id known to be absent into the in-memory table, making room if needed."""
        start, end = self._run(raw)
        while end == -1 or end + KEY_SIZE > len(self._table):
            self._make_room()
            start, end = self._run(raw)
        self._table[end:end + KEY_SIZE] = raw
        self._in_table += 1

    def _slots(self, table: bytearray):
        for offset in range(0, len(table), KEY_SIZE):
            if not table.startswith(_EMPTY, offset):
                yield bytes(table[offset:offset + KEY_SIZE])

    def _make_room(self) -> None:
        """Grow the table by half, or, if the old and the new table together would pass the
        budget, move its ids to disk."""
        capacity = self._capacity + self._capacity // 2
        if _table_bytes(capacity) + _table_bytes(self._capacity) > self.budget:
            self._spill()
            return
        old = self._table
        self._capacity = capacity
        self._table = bytearray(_table_bytes(capacity))
        self._in_table = 0
        for raw in self._slots(old):
            table = self._table  # (a _place below may have grown it again)
            home = (hash(raw) % self._capacity) * KEY_SIZE
            if table.startswith(_EMPTY, home):  # most ids land in their home slot
                table[home:home + KEY_SIZE] = raw
                self._in_table += 1
            else:
                self._place(raw)

    # -- the on-disk table ----------------------------------------------------------------
    def _spill(self) -> None:
        if self._env is None:
            self._dir, self._env, self._pages, self._finalizer = _scratch_table(self, "marks")
            # Sized for the ids expected (or four tables' worth), within an eighth of the budget.
            wanted = max(self._expected, 4 * self._in_table) * BLOOM_BITS_PER_ID
            shift = min(_BLOOM_MAX_SHIFT, max(_BLOOM_MIN_BITS, wanted).bit_length())
            while shift > 16 and (1 << shift) > self.budget:  # bits: an eighth of the budget in bytes
                shift -= 1
            self._bloom, self._bloom_shift = bytearray((1 << shift) // 8), shift
        if self._reader is not None:
            self._reader.abort()
            self._reader = None
        batch: list[bytes] = []
        for raw in self._slots(self._table):
            batch.append(raw)
            if len(batch) >= SPILL_BATCH:
                self._put(batch)
        self._put(batch)
        self._table = bytearray()  # freed before the empty one is allocated
        self._table = bytearray(_table_bytes(self._capacity))
        self._in_table = 0
        self.spills += 1
        if self._pages is not None:
            self._pages.release()
        self._reader = self._env.begin(buffers=True)

    def _put(self, batch: list[bytes]) -> None:
        """Write a batch of ids to the on-disk table (sorted: neighbouring leaf pages), then
        let the releaser look: a write maps every page it touches."""
        batch.sort()
        for raw in batch:
            self._remember_on_disk(raw)
        with self._env.begin(write=True) as txn:
            txn.cursor().putmulti(((raw, b"") for raw in batch), overwrite=False)
        batch.clear()
        if self._pages is not None:
            self._pages.tick(self._pages.every)

    @property
    def spilled(self) -> bool:
        return self._env is not None

    def __len__(self) -> int:
        return self._count

    def close(self) -> None:
        """Remove the on-disk table, if any (the set is empty afterwards)."""
        if self._reader is not None:
            self._reader.abort()
            self._reader = None
        if self._env is not None:
            _close_scratch(self._env, self._dir)
            self._env = None
            self._finalizer()
        self._table = bytearray(_table_bytes(_MIN_SLOTS))
        self._bloom, self._bloom_shift = bytearray(), 0
        self._capacity, self._in_table, self._count, self._has_zero = _MIN_SLOTS, 0, 0, False
        self._missed = None


def _remove(path: str) -> None:
    pages.forget(os.path.join(path, "data.mdb"))
    shutil.rmtree(path, ignore_errors=True)


SCRATCH_PREFIX = "agentcas-gc-"


def _scratch_table(owner, kind: str):
    """(directory, LMDB environment, PageReleaser, finalizer) of a temporary table that dies
    with `owner`: mapped with writemap and never synced, so its pages are file-backed.
    The directory is named after this process (agentcas-gc-KIND-PID-RANDOM under $TMPDIR);
    those of processes that are gone (a gc killed by SIGKILL) are removed first."""
    remove_orphaned_scratch()
    path = tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{kind}-{os.getpid()}-")
    finalizer = weakref.finalize(owner, _remove, path)
    env = lmdb.open(path, map_size=SPILL_MAP_SIZE, subdir=True, writemap=True, sync=False,
                    metasync=False, lock=False, readahead=False, max_dbs=0, meminit=False)
    return path, env, PageReleaser(None, data_file=os.path.join(path, "data.mdb")), finalizer


def _close_scratch(env, path: str | None) -> None:
    """Close a scratch table's environment; its mapping is no longer released (the
    addresses it held may be reused by other memory)."""
    if path is not None:
        pages.forget(os.path.join(path, "data.mdb"))
    env.close()


def remove_orphaned_scratch(directory: str | None = None) -> int:
    """Remove scratch directories left by gc processes of this host that no longer run."""
    directory = directory or tempfile.gettempdir()
    removed = 0
    try:
        names = os.listdir(directory)
    except OSError:
        return 0
    for name in names:
        if not name.startswith(SCRATCH_PREFIX):
            continue
        parts = name[len(SCRATCH_PREFIX):].split("-")
        if len(parts) != 3 or not parts[1].isdigit() or _running(int(parts[1])):
            continue
        _remove(os.path.join(directory, name))
        removed += 1
    return removed


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # another user's process: it exists
    return True


class KeySizes:
    """A map of 32-byte id -> u64 on disk (`update`, then `get`), in bounded memory."""

    _U64 = struct.Struct(">Q")

    def __init__(self):
        self._dir, self._env, self._pages, self._finalizer = _scratch_table(self, "sizes")
        self._reader = None

    def update(self, pairs) -> None:
        """Add (id, number) pairs, 1,024 per write transaction."""
        if self._reader is not None:
            self._reader.abort()
            self._reader = None
        batch = []
        for raw, number in pairs:
            batch.append((bytes(raw), self._U64.pack(number)))
            if len(batch) >= 1024:
                self._put(batch)
        self._put(batch)

    def _put(self, batch: list) -> None:
        with self._env.begin(write=True) as txn:
            txn.cursor().putmulti(batch)
        batch.clear()
        self._pages.release()

    def get(self, raw, default: int = 0) -> int:
        if self._reader is None:
            self._reader = self._env.begin(buffers=True)
        self._pages.tick()
        value = self._reader.get(bytes(raw))
        return default if value is None else self._U64.unpack(value)[0]

    def close(self) -> None:
        if self._reader is not None:
            self._reader.abort()
            self._reader = None
        _close_scratch(self._env, self._dir)
        self._finalizer()


class KeySpool:
    """An append-only list of (32-byte id, u64 number) in bounded memory, read back in order."""

    _PAIR = struct.Struct(f">{KEY_SIZE}sQ")

    def __init__(self, buffer: int | None = None):
        self.buffer = max(KEY_SIZE + 8, min(SPOOL_BUFFER, MEMORY_BUDGET // 8)) if buffer is None else buffer
        self._keys = bytearray()
        self._numbers = array.array("Q")
        self._file: Any = None  # the temporary file past `buffer` bytes
        self._spooled = 0
        self._count = 0

    def append(self, raw: bytes, number: int) -> None:
        self._keys += raw
        self._numbers.append(number)
        self._count += 1
        if len(self._keys) + 8 * len(self._numbers) >= self.buffer:
            self._spool()

    def _spool(self) -> None:
        if self._file is None:
            self._file = tempfile.TemporaryFile(prefix="agentcas-gc-spool-")
        self._file.seek(0, os.SEEK_END)
        self._file.write(b"".join(self._PAIR.pack(bytes(self._keys[i * KEY_SIZE:(i + 1) * KEY_SIZE]), n)
                                  for i, n in enumerate(self._numbers)))
        self._spooled += len(self._numbers)
        self._keys = bytearray()
        self._numbers = array.array("Q")

    def __len__(self) -> int:
        return self._count

    def batches(self, size: int):
        """(packed keys, array of numbers) of up to `size` pairs at a time, in append order."""
        pair = self._PAIR.size
        if self._file is not None:
            self._file.seek(0)
            left = self._spooled
            while left:
                take = min(size, left)
                data = self._file.read(take * pair)
                left -= take
                keys, numbers = bytearray(), array.array("Q")
                for raw, number in self._PAIR.iter_unpack(data):
                    keys += raw
                    numbers.append(number)
                yield bytes(keys), numbers
        for start in range(0, len(self._numbers), size):
            yield (bytes(self._keys[start * KEY_SIZE:(start + size) * KEY_SIZE]),
                   self._numbers[start:start + size])

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
