"""Rollouts: append-only JSONL histories stored as a chain of segments.

An append of k records becomes one or more segments (at most MAX_SEGMENT_BYTES each,
cut at record boundaries). A segment holds its records' bytes as content-defined
chunks, or, when they are at most INLINE_BYTES (a step's message or two), inside the
segment object itself, so a small append stores one object. It continues from a `base`
HistoryPosition: the end of the previous segment,
or, after a fork or revert, a cut inside one. So a history is the chain of segments
back from its head, and two threads that share a prefix share those segments.

Copied records: a harness may copy another session's records into a new log with a new
head each (a Codex fork re-writes its parent's lines with new timestamps), so the two
histories share no prefix. A segment may instead hold a RecordCopy: a position in the
source history and one head per record; its records are the source's last len(heads)
records before that position, each with its head (`record_head`) replaced. Reading it reads
the source (at most MAX_COPY_DEPTH copies deep); its prefix digest covers the records as
rebuilt, so every check of a segment checks a copy too (`prepare_with_copies` writes them).

Prefix digest: d_0 = 32 zero bytes, d_i = BLAKE3_derive(ctx, d_{i-1} || BLAKE3(record_i)).
An append hashes only its own records; anyone holding the bytes can recompute d_seq.

Lookup by seq: segment n also points to an ancestor at index skip_index(n) (the
deterministic skip list of Bitcoin's CBlockIndex). Walking back, we jump to the skip
target whenever it still starts after the seq sought, otherwise step to the base:
O(log n) loads. The segment holding seq is always reached by a base step, so the cut
of that segment in *this* history (its successor's base) is known.
"""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass, field

import blake3

from agentcas.cas import framing
from agentcas.cas.digest import Digest, chain_prefix, chain_raw, chain_step_hasher, chain_values, hash_blob, hash_object
from agentcas.cas.objects import EMPTY_POSITION, ChunkRef, HistoryPosition, RecordCopy, Segment
from agentcas.cas.source import ObjectSource, load_object, verify_object
from agentcas.errors import AgentcasError, IntegrityError, UsageError

MAX_SEGMENT_BYTES = 1024 * 1024
# Appends up to this size are stored inside their segment (format 2): measured on 300
# one-message steps, a separate chunk object cost ~340 B of keys and values a step.
INLINE_BYTES = 64 * 1024
MAX_RECORD_BYTES = 64 * 1024 * 1024
READ_WORKERS = 2
READ_BATCH_BYTES = 8 * 1024 * 1024
# A copied record's source may itself be a copy (a fork of a fork): readers follow at most
# this many copies deep, writers store bytes rather than go deeper.
MAX_COPY_DEPTH = 32
# A run of copied records shorter than this is stored as bytes: a copy segment costs ~150
# bytes of its own, and reading it a lookup in its source.
COPY_MIN_BYTES = 1024


class BadRecord(AgentcasError):
    """An input line that is not a JSON object: its 1-based `line` and what is wrong."""

    def __init__(self, message: str, line: int = 0, detail: str = ""):
        super().__init__(message)
        self.line, self.detail = line, detail

    @classmethod
    def at(cls, line: int, detail: str) -> BadRecord:
        return cls(f"line {line}: {detail}", line, detail)


class MissingHistory(IntegrityError):
    """A segment or chunk a history needs is not in the store."""


class CopyTooDeep(IntegrityError):
    """Copied records whose sources are copies more than MAX_COPY_DEPTH deep."""


# --- parsing ------------------------------------------------------------------------------

def _reject_constant(name):
    raise ValueError(f"{name} is not JSON")


def split_records(data: bytes, first_line: int = 1) -> list[tuple[int, int]]:
    """(start, end) of each record; every line must be one JSON object.

    A final line without a newline is a record too (its newline is added by the
    caller via `normalise`). Raises BadRecord naming the 1-based input line.
    """
    records = []
    start = 0
    line = first_line
    size = len(data)
    decoder = json.JSONDecoder(parse_constant=_reject_constant)
    while start < size:
        end = data.find(b"\n", start)
        end = size if end < 0 else end + 1
        raw = data[start:end]
        if len(raw) > MAX_RECORD_BYTES:
            raise BadRecord.at(line, f"record longer than {MAX_RECORD_BYTES} bytes")
        try:
            value = decoder.decode(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise BadRecord.at(line, f"not a JSON object ({str(exc)[:80]})") from None
        if not isinstance(value, dict):
            raise BadRecord.at(line, f"a record must be a JSON object, got {type(value).__name__}")
        records.append((start, end))
        start = end
        line += 1
    return records


def split_lines(data: bytes) -> list[tuple[int, int]]:
    """(start, end) of each newline-terminated line, unvalidated (ingest of harness logs).

    A harness log is stored byte for byte, so a damaged line (not JSON, not UTF-8) is
    kept as one record; readers of the rollout decide what to skip.
    """
    ends = line_ends(data)
    return list(zip([0] + ends[:-1], ends))


def normalise(data: bytes) -> bytes:
    """Records end with a newline: add one to a final unterminated line."""
    return data if not data or data.endswith(b"\n") else data + b"\n"


# --- preparing segments (outside the final transaction) ----------------------------------

@dataclass
class PreparedSegment:
    """Chunks and record hashes of one future segment; its chain values come later
    (when it is linked), or were computed ahead from a known base (`chained`)."""

    chunks: tuple[ChunkRef, ...]
    length: int
    record_hashes: list[bytes]
    record_sizes: list[int] = field(default_factory=list)
    inline: bytes = b""
    chained: ChainedRecords | None = None
    copy: RecordCopy | None = None   # its records copied from another history (no chunks, no inline)

    @property
    def count(self) -> int:
        return len(self.record_hashes) if self.chained is None else self.chained.count


@dataclass(frozen=True)
class ChainedRecords:
    """A segment's prefix-chain values, computed ahead from `base` (the chain value before its
    first record) where the history it continues is known: harness ingest computes them in
    a worker process, so the final transaction only reads them. `at` maps a record count
    into the segment to (bytes into it, chain value) for each mark that falls inside."""

    base: bytes
    count: int
    end: bytes
    at: dict


def chain_ahead(prepared: list[PreparedSegment], base: bytes, marks) -> list[PreparedSegment]:
    """`prepared` with their chain values computed from `base` (the digest the history they
    will continue ends in) at each of `marks` (counts of records, ascending) and at each
    segment's end; the record hashes are dropped (linking needs only these values)."""
    marks = [m for m in marks if m > 0]
    out, done, chain = [], 0, base
    for item in prepared:
        values, count, at = chain_values(chain, item.record_hashes), len(item.record_hashes), {}
        while marks and marks[0] <= done + count:
            number = marks.pop(0) - done
            at[number] = (sum(item.record_sizes[:number]), values[number - 1])
        out.append(PreparedSegment(item.chunks, item.length, [], [], item.inline,
                                   ChainedRecords(chain, count, values[-1] if values else chain, at), item.copy))
        chained = out[-1].chained
        assert chained is not None  # made just above
        chain, done = chained.end, done + count
    return out


def prepare(data: bytes, add_object, first_line: int = 1, raw_lines: bool = False,
            level: int | framing.SmallTables = framing.ROLLOUT_ZSTD_LEVEL) -> list[PreparedSegment]:
    """Validate, group and chunk new records; `add_object(digest, framed)` stores chunks.

    `first_line` numbers the first line of `data` in error messages (a file's tail).
    With `raw_lines`, every newline-terminated line is a record as it is (harness ingest).
    `level` is the zstd level of new chunks (ids hash the raw bytes, so it is free).
    """
    # Lazy: only appends chunk (pyfastcdc) and pack on threads (concurrent.futures, logging),
    # ~10 ms of imports that log, show and checkout do not need.
    from concurrent.futures import ThreadPoolExecutor

    data = normalise(data)
    records = split_lines(data) if raw_lines else split_records(data, first_line)
    groups: list[list[tuple[int, int]]] = []
    for record in records:
        if groups and record[1] - groups[-1][0][0] <= MAX_SEGMENT_BYTES:
            groups[-1].append(record)
        else:
            groups.append([record])
    view = memoryview(data)

    def pack(group):
        start, end = group[0][0], group[-1][1]
        hashes = [blake3.blake3(view[s:e]).digest() for s, e in group]
        sizes = [e - s for s, e in group]
        refs, inline, objects = _chunk_records(data, view, group, raw_lines, level)
        return PreparedSegment(refs, end - start, hashes, sizes, inline), objects

    def packed():
        # zstd and BLAKE3 release the GIL: a large append packs its segments on two threads
        # (one segment is packed here: even an idle pool costs more than a small append).
        if len(groups) <= 1:
            yield from map(pack, groups)
            return
        with ThreadPoolExecutor(READ_WORKERS if len(groups) > 2 else 1) as pool:
            yield from pool.map(pack, groups)

    prepared = []
    for segment, objects in packed():
        for digest, framed in objects:
            add_object(digest, framed)
        prepared.append(segment)
    return prepared


def _chunk_records(data: bytes, view: memoryview, records, raw_lines: bool, level: int | framing.SmallTables):
    """(chunk refs, inline bytes, [(digest, framed chunk)]) of one segment's records, given
    as (start, end) pairs: inline if they are at most INLINE_BYTES, else content-defined
    chunks (of each stamp region, for raw lines)."""
    from agentcas.cas import chunking
    start, end = records[0][0], records[-1][1]
    if end - start <= INLINE_BYTES:
        return (), bytes(view[start:end]), []
    refs, objects = [], []
    regions = _stamp_regions(data, records) if raw_lines else [(start, end, True)]
    for region_start, region_end, cut in regions:
        region = view[region_start:region_end]
        pieces = chunking.cut(region, chunking.ROLLOUT_AVG_SIZE, chunking.ROLLOUT_MIN_SIZE,
                              chunking.ROLLOUT_MAX_SIZE) if cut or len(region) > chunking.ROLLOUT_MAX_SIZE \
            else (region,)
        for piece in pieces:
            digest = hash_blob(piece)
            objects.append((digest, framing.frame(framing.KIND_CHUNK, piece, level=level)))
            refs.append(ChunkRef(digest, len(piece)))
    return tuple(refs), b"", objects


@dataclass
class PackedLines:
    """Raw lines prepared without a store (an ingest worker's part): their segments, and the
    framed chunk objects (digest, stored value) the segments need."""

    segments: list[PreparedSegment]
    objects: list[tuple[Digest, bytes]]


def line_ends(data: bytes) -> list[int]:
    """The end offset (after its newline) of each line of newline-terminated `data`."""
    ends, start, size, find = [], 0, len(data), data.find
    while start < size:
        start = find(b"\n", start) + 1 or size
        ends.append(start)
    return ends


def pack_raw_lines(data: bytes, level: int | framing.SmallTables, chain_from: bytes | None = None, marks=(),
                   ends: list[int] | None = None, threads: int = READ_WORKERS) -> PackedLines:
    """`prepare` of `data`'s newline-terminated lines stored raw, collecting the chunk objects;
    with `chain_from` (the digest of the history they will continue), `chain_ahead` too.

    `ends`: `line_ends(data)`, if the caller has them (ingest's scan of the lines). With
    `chain_from`, the chain is computed here directly, one pass over the lines without lists
    of record hashes (a record hash is only a step of the chain), while the segments' chunks
    are compressed on `threads` threads (zstd releases the GIL; 1 in an ingest worker
    process, whose sibling has the other core). The result is the same as `chain_ahead` of
    `prepare`'s (tests/test_rollout.py).
    """
    objects: list = []
    if chain_from is None or not data:
        segments = prepare(data, lambda digest, framed: objects.append((digest, framed)), raw_lines=True,
                           level=level) if data else []
        if chain_from is not None:
            segments = chain_ahead(segments, chain_from, marks)
        return PackedLines(segments, objects)
    if not data.endswith(b"\n"):
        data, ends = normalise(data), None
    ends = line_ends(data) if ends is None else ends
    view = memoryview(data)
    groups = _segment_groups(ends)

    def chunk(group):
        first, stop = group
        return _chunk_records(data, view, list(zip([ends[first - 1] if first else 0] + ends[first:stop - 1],
                                                   ends[first:stop])), True, level)

    pool = None
    if threads > 1 and len(groups) > 1:
        from concurrent.futures import ThreadPoolExecutor
        pool = ThreadPoolExecutor(threads)
    try:
        # The chunks are compressed in the pool while this thread computes the chain.
        chunked = pool.map(chunk, groups) if pool is not None else None
        marks, chain, chained = [m for m in marks if m > 0], chain_from, []
        for first, stop in groups:
            base = chain
            chain, at = _chain_lines(view, ends, first, stop, chain, marks)
            chained.append(ChainedRecords(base, stop - first, chain, at))
        segments = []
        for (first, stop), records, (refs, inline, group_objects) in zip(
                groups, chained, chunked if chunked is not None else map(chunk, groups)):
            objects += group_objects
            segments.append(PreparedSegment(refs, ends[stop - 1] - (ends[first - 1] if first else 0), [], [],
                                            inline, records))
    finally:
        if pool is not None:
            pool.shutdown()
    return PackedLines(segments, objects)


@dataclass(frozen=True)
class CopyClaim:
    """Lines of an append said to copy another history's records, one for one (a Codex
    fork's copy of its parent): lines first .. first + count - 1 of the append are records
    start .. start + count - 1 of the history at `source`, each perhaps with a new head."""

    source: HistoryPosition
    first: int
    count: int
    start: int = 0


def prepare_with_copies(history: History, data: bytes, claim: CopyClaim, add_object,
                        level: int | framing.SmallTables = framing.ROLLOUT_ZSTD_LEVEL) -> list[PreparedSegment]:
    """`prepare` of raw lines `data`, the claimed lines that are copies stored as copies.

    A claimed line is a copy when its bytes after its head (`record_head`) equal its source
    record's after its head: it is stored as that head alone, in a segment copying the
    source's records (RecordCopy). A line that differs (an edited copy), a run of copies
    shorter than COPY_MIN_BYTES, every line outside the claim, and every line when the
    source's records are copies MAX_COPY_DEPTH deep (or are no longer stored), is stored as
    bytes. Either way the records are `data`'s lines byte for byte, and a copy segment is
    cut at MAX_SEGMENT_BYTES.
    """
    data = normalise(data)
    ends = line_ends(data)
    starts = [0] + ends[:-1]
    first = claim.first
    count = max(0, min(claim.count, len(ends) - first, claim.source.seq - claim.start))
    heads: list[bytes | None] = [None] * count   # per claimed line: its head, if it is a copy
    try:
        line = first
        for piece in (history.read(claim.source, claim.start, claim.start + count, depth=1) if count else ()):
            at, size = 0, len(piece)
            while at < size:
                end = piece.index(b"\n", at) + 1
                mine = starts[line] + record_head(data, starts[line], ends[line])
                if memoryview(piece)[at + record_head(piece, at, end):end] == memoryview(data)[mine:ends[line]]:
                    heads[line - first] = data[starts[line]:mine]
                line, at = line + 1, end
    except (CopyTooDeep, MissingHistory):   # too deep, or the source deleted meanwhile (its thread and a gc)
        heads = [None] * count
    # Runs of lines: (first line, stop line, copied), short runs of copies stored as bytes.
    runs: list[list] = []
    for number in range(len(ends)):
        copied = first <= number < first + count and heads[number - first] is not None
        if runs and runs[-1][2] == copied:
            runs[-1][1] = number + 1
        else:
            runs.append([number, number + 1, copied])
    merged: list[list] = []
    for run in runs:
        if run[2] and ends[run[1] - 1] - starts[run[0]] < COPY_MIN_BYTES:
            run[2] = False
        if merged and merged[-1][2] == run[2]:
            merged[-1][1] = run[1]
        else:
            merged.append(run)
    out: list[PreparedSegment] = []
    for lo, hi, copied in merged:
        if not copied:
            out += prepare(data[starts[lo]:ends[hi - 1]], add_object, raw_lines=True, level=level)
            continue
        for group_lo, group_hi in _segment_groups(ends[lo:hi], starts[lo]):
            a, b = lo + group_lo, lo + group_hi
            records = [memoryview(data)[starts[n]:ends[n]] for n in range(a, b)]
            source = history.position(claim.source, claim.start + b - first)
            out.append(PreparedSegment((), ends[b - 1] - starts[a], [blake3.blake3(r).digest() for r in records],
                                       [len(r) for r in records], b"", None,
                                       RecordCopy(source, tuple(heads[n - first] or b"" for n in range(a, b)))))
    return out


def _segment_groups(ends: list[int], origin: int = 0) -> list[tuple[int, int]]:
    """(first, stop) record numbers of each segment `prepare` makes of lines ending at `ends`:
    records are added to a segment while it spans at most MAX_SEGMENT_BYTES (a longer record
    is a segment alone); each segment's end is found by bisection, not record by record.
    `origin`: where the first line starts."""
    groups, first, count = [], 0, len(ends)
    while first < count:
        start = ends[first - 1] if first else origin
        stop = max(bisect.bisect_right(ends, start + MAX_SEGMENT_BYTES, first), first + 1)
        groups.append((first, stop))
        first = stop
    return groups


def _chain_lines(view: memoryview, ends: list[int], first: int, stop: int, chain: bytes, marks: list):
    """The prefix chain from `chain` over records first .. stop - 1 (the lines ending at
    `ends[first:stop]`): (the value after them, {records into them: (bytes into them, value)}
    at each of `marks` (counts of records into the append, ascending, consumed here) that
    falls among them). Two hashers are reset per record instead of two made (~25% of the
    per-record cost), and only the values at marks are kept."""
    record, step = blake3.blake3(), chain_step_hasher()
    at, start = {}, ends[first - 1] if first else 0
    segment_start, count, mark = start, first, marks[0] if marks else 0
    for end in ends[first:stop]:
        record.reset()
        record.update(view[start:end])
        step.reset()
        step.update(chain + record.digest())
        chain = step.digest()
        count += 1
        if count == mark:
            at[count - first] = (end - segment_start, chain)
            while marks and marks[0] <= count:
                marks.pop(0)
            mark = marks[0] if marks else 0
        start = end
    return chain, at


STAMP_SPLIT_BYTES = 32 * 1024
_STAMP = b'{"timestamp":"'


def _stamp_regions(data: bytes, group: list[tuple[int, int]]) -> list[tuple[int, int, bool]]:
    """Byte ranges of a segment of raw lines to chunk on their own, and whether each is
    cut into content-defined chunks: only the bodies of long lines are.

    A harness that copies records into another log (a Codex fork re-persists its parent's
    items) gives each copy a new `{"timestamp":"..."` prefix. A line of STAMP_SPLIT_BYTES
    or more that starts so is cut after its timestamp value: the body after it is chunked
    on its own (content-defined), so the copy's body chunks equal the source's. The
    shorter lines between (and a long line's timestamp prefix) are one chunk per region,
    not cut: no harness repeats a run of them byte for byte (a copy has new timestamps),
    so cutting found nothing to share and cost ~1.1 s of CPU per GB (FastCDC's rolling
    hash); a region over ROLLOUT_MAX_SIZE (a long line without a timestamp) is still cut.
    """
    regions, region_start = [], group[0][0]
    for start, end in group:
        if end - start < STAMP_SPLIT_BYTES:
            continue
        head = record_head(data, start, end)
        if not head:
            continue
        regions.append((region_start, start + head, False))
        regions.append((start + head, end, True))
        region_start = end
    if region_start < group[-1][1]:
        regions.append((region_start, group[-1][1], False))
    return regions


def record_head(data, start: int, end: int) -> int:
    """The length of the head of record data[start:end]: through the closing quote of a
    leading `{"timestamp":"...` value (within its first 96 bytes), else 0. A harness gives a
    copied record a new head (a Codex fork's copies of its parent's lines), and a copy
    segment stores only the heads (docs/FORMAT.md 5.6)."""
    if not data.startswith(_STAMP, start, end):
        return 0
    quote = data.find(b'"', start + len(_STAMP), min(start + 96, end))
    return 0 if quote < 0 else quote + 1 - start


def skip_index(n: int) -> int:
    """Bitcoin's GetSkipHeight: where segment n's skip pointer lands."""
    def drop_lowest(x):
        return x & (x - 1)
    if n < 2:
        return 0
    return drop_lowest(drop_lowest(n - 1)) + 1 if n & 1 else drop_lowest(n)


class SkipLinks:
    """What a skip-pointer search needs of an object, by id: (index, skip id, previous id).

    Appending to a chain looks up the skip target of every new segment or checkpoint, O(log n)
    objects back; each lookup loaded, verified and decoded those objects again (~5 of them
    per LangGraph put). The links are a few dozen bytes each, and never go stale: an id is
    its content's hash, and only links of objects loaded verified (or about to be written)
    are kept. Bounded by count: the whole memo is dropped when it reaches MAX entries.
    Writers only; readers (fsck) load what they check."""

    MAX = 1024

    def __init__(self):
        self.links: dict[bytes, tuple] = {}

    def get(self, raw: bytes, load) -> tuple:
        """(index, skip, previous) of object `raw`; `load(raw)` gives them when not kept."""
        found = self.links.get(raw)
        if found is None:
            found = load(raw)
            self.put(raw, found)
        return found

    def put(self, raw: bytes, links: tuple) -> None:
        if len(self.links) >= self.MAX:
            self.links = {}
        self.links[raw] = links


SEGMENT_LINKS = SkipLinks()  # rollout segments: (index, skip, base segment)


def search_skip_list(links, digest: Digest, index: int) -> Digest | None:
    """The object at `index` on the chain back from `digest` (O(log n) hops), following
    `links(digest) -> (index, skip, previous)`; None if the chain ends before it."""
    node_id = digest
    at, skip, previous = links(node_id)
    while at > index:
        if skip is not None and skip_index(at) >= index:
            node_id = skip
        elif previous is not None:
            node_id = previous
        else:
            return None
        at, skip, previous = links(node_id)
    return node_id if at == index else None


class SegmentCache:
    """Decoded segments by id, bounded in bytes: a segment is immutable (its id is its
    content's hash, verified when it was loaded), so a process that reads the same history
    again and again (a LangGraph listing, an MCP server) may keep them across reads."""

    MAX_BYTES = 32 * 1024 * 1024

    def __init__(self):
        self.segments: dict[bytes, Segment] = {}
        self.bytes = 0

    def get(self, raw: bytes) -> Segment | None:
        return self.segments.get(raw)

    def put(self, raw: bytes, segment: Segment) -> None:
        size = 200 + len(segment.inline) + 40 * len(segment.chunks)  # roughly what it holds
        if segment.copy is not None:
            size += sum(map(len, segment.copy.heads)) + 40 * len(segment.copy.heads)
        if size > self.MAX_BYTES:
            return
        if self.bytes + size > self.MAX_BYTES:
            self.segments.clear()
            self.bytes = 0
        self.segments[raw] = segment
        self.bytes += size


class History:
    """Reads over the segment chain through one object source, with a cache of segments
    (its own, or a longer-lived `SegmentCache` the caller keeps)."""

    def __init__(self, objects: ObjectSource, cache: SegmentCache | None = None):
        self.objects = objects
        self._segments = SegmentCache() if cache is None else cache

    def segment(self, digest: Digest) -> Segment:
        cached = self._segments.get(digest.raw)
        if cached is not None:
            return cached
        data = load_object(self.objects, digest, framing.KIND_SEGMENT)
        if data is None:
            raise MissingHistory(f"rollout segment {digest.hex()} is missing from the store")
        segment = Segment.decode(data)
        self._segments.put(digest.raw, segment)
        return segment

    def ancestor_at_index(self, digest: Digest, index: int) -> Digest:
        """The segment with `index` on the chain back from `digest` (O(log n))."""
        return _ancestor_at_index(self.segment, digest, index)

    def locate(self, head: HistoryPosition, seq: int) -> tuple[Digest, Segment, HistoryPosition]:
        """The segment holding record `seq` of the history ending at `head`, and its cut.

        The cut is the position where this history leaves that segment (the head,
        or the base of the following segment).
        """
        if not 0 <= seq < head.seq:
            raise UsageError(f"seq {seq} is outside the history (0..{head.seq - 1})")
        node_id: Digest | None = head.segment
        assert node_id is not None  # seq < head.seq: the history is not empty
        node, cut = self.segment(node_id), head
        while node.base.seq > seq:
            if node.skip is not None:
                skip = self.segment(node.skip)
                if skip.base.seq > seq:
                    node_id, node = node.skip, skip
                    continue
            cut = node.base
            node_id = node.base.segment
            assert node_id is not None  # a base holding records ends in a segment
            node = self.segment(node_id)
        return node_id, node, cut

    def segment_bytes(self, node: Segment, cut: HistoryPosition, depth: int = 0) -> bytes:
        """The bytes of `node` that belong to a history leaving it at `cut`, verified."""
        return decode_segment(self.stored_chunks(node, cut, depth))

    def stored_chunks(self, node: Segment, cut: HistoryPosition, depth: int = 0):
        """(chunk ref, stored value) pairs of the chunks a cut segment needs, unverified.

        Split from decoding so that readers can fetch in their transaction's thread and
        decompress and verify in worker threads (zstd and BLAKE3 release the GIL). A segment
        that copies records has no chunks: its records are rebuilt here, from its source
        (`depth`: how many copies deep this read already is).
        """
        want = cut.offset - node.base.offset
        if node.copy is not None:
            return want, self.copied_bytes(node, depth + 1), []
        refs, have = [], len(node.inline)
        for ref in node.chunks:
            if have >= want:
                break
            refs.append(ref)
            have += ref.size
        stored = self.objects.blobs.get_many([ref.id.raw for ref in refs])
        values = []
        for ref in refs:
            value = stored.get(ref.id.raw)
            if value is None:
                raise MissingHistory(f"rollout chunk {ref.id.hex()} is missing from the store")
            values.append((ref, value))
        return want, node.inline, values

    def copied_bytes(self, node: Segment, depth: int = 1) -> bytes:
        """The records of a segment that copies them: each source record with its head
        (`record_head`) replaced by the segment's, read from the source history (verified
        as any read is: chunks against their ids). IntegrityError if they are not
        `node.length` bytes, or the copies nest deeper than MAX_COPY_DEPTH."""
        copy = node.copy
        assert copy is not None  # called for copy segments only
        if depth > MAX_COPY_DEPTH:
            raise CopyTooDeep(f"copied rollout records nest more than {MAX_COPY_DEPTH} copies deep")
        source = b"".join(self.read(copy.source, copy.start, copy.source.seq, depth=depth))
        parts: list[bytes] = []
        start, find, stamped, append = 0, source.find, source.startswith, parts.append
        for head in copy.heads:   # record_head, inlined: this loop is most of a copy's read
            end = find(b"\n", start) + 1
            if not end:
                raise IntegrityError(f"a copy segment names {len(copy.heads)} records of segment "
                                     f"{copy.source.segment.hex() if copy.source.segment else None}, which holds fewer")
            tail = start
            if stamped(_STAMP, start):
                quote = find(b'"', start + len(_STAMP), min(start + 96, end))
                if quote >= 0:
                    tail = quote + 1
            append(head)
            append(source[tail:end])
            start = end
        data = b"".join(parts)
        if len(data) != node.length:
            raise IntegrityError(f"a copy segment's records are {len(data)} bytes, but it gives its length as "
                                 f"{node.length}")
        return data

    def position(self, head: HistoryPosition, seq: int) -> HistoryPosition:
        """The HistoryPosition after the first `seq` records of the history at `head`."""
        if seq == head.seq:
            return head
        if seq == 0:
            return EMPTY_POSITION
        if not 0 < seq < head.seq:
            raise UsageError(f"seq {seq} is beyond the end of the history ({head.seq} records)")
        node_id, node, cut = self.locate(head, seq - 1)
        if seq == node.base.seq + node.count:
            return node.end(node_id)
        data = self.segment_bytes(node, cut)
        digest, offset, start = node.base.digest, node.base.offset, 0
        for _ in range(seq - node.base.seq):
            end = data.index(b"\n", start) + 1
            digest = chain_prefix(digest, blake3.blake3(data[start:end]).digest())
            start = end
        return HistoryPosition(node_id, seq, offset + start, digest)

    def read(self, head: HistoryPosition, start: int = 0, stop: int | None = None,
             whole_records: bool = True, depth: int = 0):
        """Yield the bytes of records start <= seq < stop, in verified pieces.

        Each piece holds whole records; with `whole_records=False` a piece may end inside a
        record (a segment's chunks are yielded as they are, without joining them). `depth`:
        how many copies deep this read is (a copy segment reads its source through here).
        """
        stop = head.seq if stop is None else min(stop, head.seq)
        start = max(0, start)
        if start >= stop:
            return
        node_id, node, cut = self.locate(head, stop - 1)
        chain = [(node, cut)]
        while node.base.seq > start:
            cut = node.base
            assert cut.segment is not None  # a base holding records ends in a segment
            node = self.segment(cut.segment)
            chain.append((node, cut))
        chain.reverse()
        stored = (self.stored_chunks(node, cut, depth) for node, cut in chain)
        if len(chain) <= 2:
            yield from self._slice(chain, map(decode_pieces, stored), start, stop, whole_records)
            return
        # Fetch in this thread, decode a few batches ahead in workers.
        # Batches of READ_BATCH_BYTES, not single segments: on a loaded machine every hand-off
        # between threads waits for a time slice (measured at load 16: 100 MB read in 0.8 s
        # by segment, in ~0.3 s by 8 MiB batch, for the same 0.17 s of CPU).
        from concurrent.futures import ThreadPoolExecutor  # lazy: short reads need no workers

        def batches():
            batch, size = [], 0
            for item in stored:
                batch.append(item)
                size += item[0]
                if size >= READ_BATCH_BYTES:
                    yield batch
                    batch, size = [], 0
            if batch:
                yield batch

        with ThreadPoolExecutor(READ_WORKERS) as pool:
            window: list = []

            def decoded():
                for batch in batches():
                    window.append(pool.submit(lambda b: [decode_pieces(item) for item in b], batch))
                    if len(window) > READ_WORKERS:
                        yield from window.pop(0).result()
                while window:
                    yield from window.pop(0).result()

            try:
                yield from self._slice(chain, decoded(), start, stop, whole_records)
            finally:
                for future in window:
                    future.cancel()

    @staticmethod
    def _slice(chain, decoded, start: int, stop: int, whole_records: bool):
        for (node, cut), pieces in zip(chain, decoded):
            first, last = node.base.seq, cut.seq
            if start <= first and stop >= last and (not whole_records or len(pieces) == 1):
                yield from pieces  # a whole segment: its chunks as they are, no join
                continue
            data = b"".join(pieces)
            lo = 0
            for _ in range(max(0, start - first)):
                lo = data.index(b"\n", lo) + 1
            if stop < last:
                hi = lo
                for _ in range(stop - max(start, first)):
                    hi = data.index(b"\n", hi) + 1
            else:
                hi = len(data)
            yield data[lo:hi]

    def check_segment(self, digest: Digest, segment: Segment) -> None:
        """Recompute a segment from its bytes and base: chunk sizes, length, record count,
        prefix digest, index and skip pointer; IntegrityError if it states anything else."""
        data = self.segment_bytes(segment, segment.end(digest))
        chain, start, count = segment.base.digest, 0, 0
        while start < len(data):
            end = data.find(b"\n", start)
            if end < 0:
                raise IntegrityError(f"segment {digest.hex()} ends inside a record")
            chain = chain_prefix(chain, blake3.blake3(data[start:end + 1]).digest())
            start, count = end + 1, count + 1
        if (len(data), count, chain) != (segment.length, segment.count, segment.digest):
            raise IntegrityError(f"segment {digest.hex()} does not match its bytes "
                                 f"({count} records, {len(data)} bytes recomputed)")
        if segment.copy is not None:
            self.check_position(segment.copy.source)
        if segment.base.segment is not None:
            base = self.segment(segment.base.segment)
            if base.index + 1 != segment.index:
                raise IntegrityError(f"segment {digest.hex()} has index {segment.index} after a base "
                                     f"with index {base.index}")
            self.check_position(segment.base)
        if (segment.skip is None) != (segment.index < 2) or (
                segment.skip is not None
                and (segment.base.segment is None
                     or self.ancestor_at_index(segment.base.segment, skip_index(segment.index)) != segment.skip)):
            raise IntegrityError(f"segment {digest.hex()} has a skip pointer that is not its ancestor at "
                                 f"index {skip_index(segment.index)}")

    def check_position(self, position: HistoryPosition) -> None:
        """A position must be its segment's end, or a cut recomputable inside it."""
        if position.segment is None:
            return
        segment = self.segment(position.segment)
        end = segment.end(position.segment)
        if not segment.base.seq < position.seq <= end.seq:
            raise IntegrityError(f"seq {position.seq} is outside segment {position.segment.hex()}")
        recomputed = end if position.seq == end.seq else self.position(end, position.seq)
        if recomputed != position:
            raise IntegrityError(f"position seq {position.seq} in segment {position.segment.hex()} "
                                 "does not match the segment's bytes")

    def verify(self, head: HistoryPosition) -> int:
        """Re-read the whole history at `head`, recompute its prefix digest; records read."""
        if head.seq == 0:
            return 0
        digest = EMPTY_POSITION.digest
        seq = offset = 0
        for piece in self.read(head):
            start = 0
            while start < len(piece):
                end = piece.index(b"\n", start) + 1
                digest = chain_prefix(digest, blake3.blake3(piece[start:end]).digest())
                start = end
                seq += 1
            offset += len(piece)
        if (seq, offset, digest) != (head.seq, head.offset, head.digest):
            raise IntegrityError(
                f"history at segment {head.segment.hex() if head.segment else None} does not match its position "
                f"(seq {seq} vs {head.seq}, offset {offset} vs {head.offset})")
        return seq


def decode_segment(stored) -> bytes:
    """Join a segment's inline bytes and stored chunks (from `History.stored_chunks`), verifying each."""
    return b"".join(decode_pieces(stored))


def decode_pieces(stored) -> list:
    """A segment's inline bytes and verified chunk bytes, in order, cut to the bytes it needs."""
    want, inline, values = stored
    if not values:
        return [inline[:want]]
    parts = [inline] if inline else []
    for ref, value in values:
        digest = ref.id
        try:
            kind, data = framing.unframe(value)
        except framing.CorruptValue as exc:
            raise IntegrityError(f"rollout chunk {digest.hex()} is corrupt: {exc}") from None
        if kind != framing.KIND_CHUNK:
            raise IntegrityError(f"object {digest.hex()} is not a chunk")
        verify_object(kind, digest, data)
        if len(data) != ref.size:
            # The segment's cut offsets are computed from the declared sizes.
            raise IntegrityError(f"rollout chunk {digest.hex()} holds {len(data)} bytes, but its segment "
                                 f"gives its size as {ref.size}")
        parts.append(data)
    extra = sum(map(len, parts)) - want
    if extra:  # a cut inside the last chunk
        parts[-1] = parts[-1][:len(parts[-1]) - extra]
    return parts


def link_segments(objects: ObjectSource, head: HistoryPosition, prepared: list[PreparedSegment],
                  with_move=frozenset()) -> tuple[HistoryPosition, dict[bytes, bytes]]:
    """Turn prepared segments into objects continuing from `head`.

    Returns the new head and the framed segment objects {raw id: value} to store. The
    caller stores them, then moves the ref from the state whose head it passed here by
    compare-and-swap (and links again on the new head if it lost the race), so seq
    numbers and prefix digests always continue the head the ref really had. `with_move`:
    ids of record chunks the caller stores with the move itself (not stored yet).
    """
    head, new_objects, _ = link_segments_at(objects, head, prepared, (), with_move)
    return head, new_objects


def link_segments_at(objects: ObjectSource, head: HistoryPosition, prepared: list[PreparedSegment],
                     marks, with_move=frozenset()) -> tuple[HistoryPosition, dict[bytes, bytes], list[HistoryPosition]]:
    """`link_segments`, also returning the position after each of `marks` new records.

    `marks` are counts of appended records, ascending, each in 0..appended (the
    prefix digest and offset of each are computed from the prepared record hashes).
    Returns (new head, segment objects to store, positions at the marks).
    """
    history = History(objects)
    chunk_ids = {ref.id.raw for item in prepared for ref in item.chunks} - set(with_move)
    chunk_ids |= {item.copy.source.segment.raw for item in prepared
                  if item.copy is not None and item.copy.source.segment is not None}
    missing = objects.missing(chunk_ids)
    if missing:
        raise MissingHistory(f"rollout chunk or segment {next(iter(missing)).hex()} vanished before the append "
                             "landed (concurrent gc?); nothing was changed, retry")
    new_objects: dict[bytes, bytes] = {}
    pending: dict[bytes, Segment] = {}

    def segment_of(digest: Digest) -> Segment:
        return pending[digest.raw] if digest.raw in pending else history.segment(digest)

    def links(digest: Digest) -> tuple:
        return SEGMENT_LINKS.get(digest.raw, lambda raw: _segment_links(segment_of(digest)))

    marks = list(marks)
    positions: list[HistoryPosition] = []
    start_seq = head.seq
    while marks and marks[0] == 0:
        positions.append(head)
        marks.pop(0)
    for item in prepared:
        index = 0 if head.segment is None else links(head.segment)[0] + 1
        skip = None
        if index >= 2:
            assert head.segment is not None  # index >= 2: two segments below
            skip = search_skip_list(links, head.segment, skip_index(index))
            if skip is None:
                raise IntegrityError(f"the segment chain back from {head.segment.hex()} has no segment "
                                     f"{skip_index(index)}; nothing was appended")
        chain, seq, inside = head.digest.raw, head.seq, []
        if item.chained is not None:
            if item.chained.base != chain:
                raise UsageError("a segment chained ahead does not continue the history it is linked to")
            chain = item.chained.end
            while marks and marks[0] <= seq + item.chained.count - start_seq:
                number = marks.pop(0) + start_seq - seq
                if number == item.chained.count:
                    offset, value = item.length, chain
                elif number in item.chained.at:
                    offset, value = item.chained.at[number]
                else:
                    raise UsageError(f"mark {seq + number} was not chained ahead with its segment")
                inside.append((seq + number, head.offset + offset, Digest(value)))
        else:
            for number, record_hash in enumerate(item.record_hashes):
                chain = chain_raw(chain, record_hash)
                if marks and marks[0] == seq + number + 1 - start_seq:
                    offset = head.offset + sum(item.record_sizes[:number + 1])
                    while marks and marks[0] == seq + number + 1 - start_seq:
                        inside.append((seq + number + 1, offset, Digest(chain)))
                        marks.pop(0)
        segment = Segment(head, index, skip, item.count, item.length, Digest(chain), item.chunks, item.inline,
                          copy=item.copy)
        body = segment.encode()
        segment_id = hash_object("segment", body)
        # A segment that lists chunks is ids and counts: zstd never shrinks it, so it is not
        # tried (a compress is a GIL release, a thread switch for a busy ingest); inline
        # bytes are records, and a copy's heads timestamps, compressed at the rollout level.
        new_objects[segment_id.raw] = framing.frame(framing.KIND_SEGMENT, body,
                                                    compress=bool(item.inline) or item.copy is not None,
                                                    level=framing.ROLLOUT_ZSTD_LEVEL)
        pending[segment_id.raw] = segment
        SEGMENT_LINKS.put(segment_id.raw, _segment_links(segment))
        positions += [HistoryPosition(segment_id, s, o, d) for s, o, d in inside]
        head = segment.end(segment_id)
    if marks:
        raise UsageError(f"mark {marks[0] + start_seq} is beyond the appended records")
    return head, new_objects, positions


def _segment_links(segment: Segment) -> tuple:
    return segment.index, segment.skip, segment.base.segment


def _ancestor_at_index(segment_of, digest: Digest, index: int) -> Digest:
    """The segment with `index` on the chain back from `digest` (O(log n) loads)."""
    found = search_skip_list(lambda d: _segment_links(segment_of(d)), digest, index)
    if found is None:
        raise IntegrityError(f"the segment chain back from {digest.hex()} has no segment {index}")
    return found


class RolloutMismatch(AgentcasError):
    """The rollout file no longer starts with the history already stored."""


def common_prefix(history: History, a: HistoryPosition, b: HistoryPosition) -> int:
    """The number of leading records two histories share (binary search on prefix digests)."""
    short, long_ = (a, b) if a.seq <= b.seq else (b, a)
    if short.seq == 0:
        return 0
    if history.position(long_, short.seq).digest == short.digest:
        return short.seq
    lo, hi = 0, short.seq  # lo shared, hi not shared
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if history.position(a, mid).digest == history.position(b, mid).digest:
            lo = mid
        else:
            hi = mid
    return lo
