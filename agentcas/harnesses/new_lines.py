"""The new lines of one session file: read, classified and packed, without the store.

What an ingest does with a file once it knows what is already stored (`NewLinesJob`: the
bytes and records stored, the digest they end in, a turn tracker primed with the open
turn). `read_new_lines` then:

1. reads the file from the stored offset to its last newline (a partial last line waits);
2. classifies every line in one pass over a memoryview (no copy per line): whether it is
   a JSON object, its `type` and `payload.type` (line_kinds.classify_lines), finding the
   line ends on the way; only a line whose types the tracker `wants` is parsed whole and
   fed to it, which places a mark after each turn boundary;
3. packs the lines as the rollout layer stores them (rollout.pack_raw_lines, given those
   line ends: content-defined chunks, zstd) with the prefix chain computed ahead from the
   stored digest (one BLAKE3 per record and one chain step, kept only at every mark and
   segment end), so landing them needs no per-record work.

It needs no store, so a large ingest runs it in worker processes (packing_workers.py)
while the parent alone writes; a small one runs it in-process. Either way the result is
the same `NewLines`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from agentcas.harnesses.line_kinds import classify_lines
from agentcas.harnesses.records import parse_line
from agentcas.lineage.rollout import PackedLines, pack_raw_lines


@dataclass
class NewLinesJob:
    """One file's part of an ingest, as planned against the store (picklable)."""

    path: str
    ino: int                 # the file whose stored prefix was checked: another one there is refused
    offset: int              # bytes already stored
    seq: int                 # records already stored
    chain_from: bytes        # the digest the stored history ends in
    tracker: Any             # turns.CodexTurns | turns.ClaudeTurns, primed with the open turn
    turn_seq: int            # where the open turn starts (a seq)
    closes_before: bool      # a boundary record opens the next turn (Claude), so that turn starts at it
    level: Any               # zstd level of new chunks (int or framing.SmallTables)
    size: int                # bytes to read, as of the stat that planned the job
    keep_data: bool = False  # return the new lines' bytes too (a Codex fork measures its copy)
    # The whole-bytes BLAKE3 of the stored prefix (bytes 0..offset), as the last run left it:
    # the prefix is read and hashed again and a file whose bytes there differ is refused (a
    # same-length edit inside a file that also grew). `hash_prefix` without it: just hash.
    prefix_digest: bytes | None = None
    hash_prefix: bool = False
    thread: str = ""         # for messages
    threads: int = 2         # zstd threads of the packing (1 in a worker process: its sibling has the other core)


@dataclass
class NewLines:
    """What `read_new_lines` found: the new complete lines, packed, and their turn marks."""

    count: int = 0                                   # new complete lines (= records)
    size: int = 0                                    # their bytes
    partial_bytes: int = 0                           # a partial last line, not read
    skipped: list = field(default_factory=list)      # 1-based line numbers of damaged lines
    marks: list = field(default_factory=list)        # (records into the new lines, reason)
    turn_seq: int = 0
    packed: PackedLines | None = None
    data: bytes = b""                                # the new lines, if the job keeps them
    error: str | None = None                         # why the file was refused instead
    prefix_digest: bytes | None = None               # BLAKE3 of bytes 0 .. offset + size (hash_prefix)


def read_new_lines(job: NewLinesJob) -> NewLines:
    """Read, classify and pack the lines of `job.path` after its stored prefix."""
    try:
        with open(job.path, "rb") as handle:
            if os.fstat(handle.fileno()).st_ino != job.ino:
                return NewLines(error=f"{job.path} was replaced while it was read; run ingest again")
            hasher = _hash_prefix(handle, job.offset) if job.hash_prefix or job.prefix_digest else None
            if job.prefix_digest is not None and hasher is not None and hasher.digest() != job.prefix_digest:
                return NewLines(error=f"{job.path} differs from what was already ingested into {job.thread} "
                                      "(it was rewritten or edited, not appended to); not ingested")
            handle.seek(job.offset)
            tail = handle.read()
    except OSError as exc:
        return NewLines(error=f"cannot read {job.path}: {exc.strerror}")
    cut = tail.rfind(b"\n") + 1
    data = tail[:cut] if cut < len(tail) else tail
    result = NewLines(size=cut, partial_bytes=len(tail) - cut, turn_seq=job.turn_seq)
    if hasher is not None:
        hasher.update(data)
        result.prefix_digest = hasher.digest()
    ends = scan_lines(job, data, result)
    if result.count:
        result.packed = pack_raw_lines(data, job.level, job.chain_from, [m for m, _ in result.marks], ends,
                                       job.threads)
    if job.keep_data:
        result.data = data
    return result


PREFIX_PIECE = 8 * 1024 * 1024


def _hash_prefix(handle, size: int):
    """A BLAKE3 hasher over the file's first `size` bytes (read in pieces); short reads
    hash what is there, so a file cut below `size` never matches a stored digest."""
    import blake3
    hasher = blake3.blake3(max_threads=blake3.blake3.AUTO)
    handle.seek(0)
    remaining = size
    while remaining > 0:
        piece = handle.read(min(remaining, PREFIX_PIECE))
        if not piece:
            break
        hasher.update(piece)
        remaining -= len(piece)
    return hasher


def scan_lines(job: NewLinesJob, data: bytes, result: NewLines) -> list[int]:
    """Count, classify and mark the newline-terminated lines of `data` into `result`; the
    end offset of each line (packing reuses them: rollout.line_ends)."""
    ends, damaged, wanted = classify_lines(data, job.tracker.wants)
    line0, feed, marks = job.seq, job.tracker.feed, result.marks
    result.skipped = [line0 + number + 1 for number in damaged]
    for number in wanted:
        reason = feed(None, parse_line(data[ends[number - 1] if number else 0:ends[number]], fast=True))
        if reason:
            marks.append((number + 1, reason))
            result.turn_seq = line0 + number + 1 - (1 if job.closes_before else 0)
    result.count = len(ends)
    return ends
