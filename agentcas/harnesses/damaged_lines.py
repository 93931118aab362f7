"""Every damaged line of a stored history up to record N, without re-reading it each time.

Replay's `skipped_lines` lists every line of the file up to the record asked for that is
not a JSON object (records.parse_line is None), not only the lines the reducer happened
to read. Finding them means parsing every record once; what was found is kept as one
cache row per thread in this machine's stat cache (`statcache` of `Backends.local`, key
DAMAGED_KEY + thread name, sealed): the HistoryPosition the row covers and the seqs of
the damaged records before it. A position names an immutable prefix, so a row stays true
for its prefix forever, and for the first `at` records of a history `head`:

  - if `at` <= the row's seq and both histories have the same prefix digest at `at`, the
    answer is the row's seqs below `at` (no record is read);
  - if the row's position is a prefix of `head` (same digest at the row's seq), only the
    records from the row's seq to `at` are read, and the row moves forward to `at`;
  - otherwise (a checkpoint of another line, a revert that diverged, no row yet) the
    first `at` records are read, and the row is replaced when `head` is the thread's.

Digests are compared with `History.position` (O(log n) segment loads). Ingest writes the
row as it lands new lines (it parses every line anyway), so replay of an ingested thread
starts warm. The row is a cache: deleting it costs one scan, never a wrong answer.
"""

from __future__ import annotations

import json

from agentcas.cas.objects import HistoryPosition
from agentcas.cas.sealed import seal, unseal
from agentcas.errors import IntegrityError
from agentcas.harnesses.records import iter_lines, parse_line
from agentcas.lineage.rollout import History

DAMAGED_KEY = b"\x02damaged\0"   # statcache rows (workspace rows start with "/" or NUL, ingest's with \x01)
SCAN_RECORDS = 4096


def _key(thread: str) -> bytes:
    return DAMAGED_KEY + thread.encode("utf-8")


def read_row(local, thread: str) -> tuple[HistoryPosition, list[int]] | None:
    """(position covered, damaged seqs before it) of `thread`'s row, or None."""
    key = _key(thread)
    with local.reader() as txn:
        value = txn.get("statcache", key)
    if value is None:
        return None
    try:
        doc = json.loads(unseal("statcache", key, value))
        return HistoryPosition.from_doc(doc["position"]), [int(s) for s in doc["damaged"]]
    except (ValueError, KeyError, TypeError, IntegrityError):
        return None   # a damaged row only costs a scan


def row_value(thread: str, position: HistoryPosition, damaged: list[int]) -> tuple[bytes, bytes]:
    """The (key, sealed value) of a row."""
    key = _key(thread)
    payload = json.dumps({"position": position.to_doc(), "damaged": damaged}, sort_keys=True,
                         separators=(",", ":")).encode()
    return key, seal("statcache", key, payload)


def write_rows(local, rows: list[tuple[bytes, bytes]]) -> None:
    if not rows:
        return

    def put(txn):
        for key, value in rows:
            txn.put("statcache", key, value)
    local.write(put)


def scan(store, rev: str, start: int, stop: int) -> list[int]:
    """The seqs of damaged records among records start <= seq < stop of `rev`'s history."""
    damaged = []
    for block in range(start, stop, SCAN_RECORDS):
        end = min(stop, block + SCAN_RECORDS)
        data = b"".join(store.history.read(rev, block, end))
        for line, raw in iter_lines(data, block + 1):
            if parse_line(raw, fast=True) is None:
                damaged.append(line - 1)
    return damaged


def damaged_lines(store, rev: str, head: HistoryPosition, at: int, thread: str, is_head: bool) -> list[int]:
    """1-based line numbers of the damaged records among the first `at` records of `head`
    (the history `rev` names; `thread` the line whose row to use, `is_head` whether `head`
    is that thread's current head, so the row may move to it)."""
    local = store.backends.local
    row = read_row(local, thread)
    history = History(store.source)

    def digest_at(position: HistoryPosition, seq: int):
        # A position's own end needs no segment loads (replay at the head: the common case).
        return position.digest if seq == position.seq else history.position(position, seq).digest

    known, covered, extends = [], 0, False
    if row is not None:
        position, seqs = row
        if at <= position.seq:
            if at == 0 or digest_at(head, at) == digest_at(position, at):
                return [s + 1 for s in seqs if s < at]
        elif position.seq == 0 or digest_at(head, position.seq) == position.digest:
            known, covered, extends = seqs, position.seq, True
    found = known + scan(store, rev, covered, at)
    if is_head and (not extends or at > covered):   # a longer row, or one for the thread's new history
        write_rows(local, [row_value(thread, head if at == head.seq else history.position(head, at), found)])
    return [s + 1 for s in found]


def advance(local, thread: str, based_on: HistoryPosition | None, head: HistoryPosition,
            new_damaged: list[int]) -> tuple[bytes, bytes] | None:
    """The row after an append from `based_on` to `head` whose damaged seqs are `new_damaged`
    (ingest), or None when the row does not cover `based_on` exactly (replay will scan)."""
    if based_on is None or based_on.seq == 0:
        return row_value(thread, head, list(new_damaged))
    row = read_row(local, thread)
    if row is None or row[0] != based_on:
        return None
    return row_value(thread, head, row[1] + list(new_damaged))
