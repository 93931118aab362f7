"""The saver's record format: what it appends to a thread's rollout and how it reads it back.

A LangGraph checkpoint's own records in its thread's rollout end with a record
`{"k":"cp",...}` (ids, channels, the serde bytes of the checkpoint without its values and of
the metadata); before it come its small channel values (`{"k":"val",...}`, whole values up to
4 KiB) and the new items of list channels that extend their parent's (`{"k":"item",...}`, the
message list: a value is a base plus the items between `from` and the checkpoint's position).
Pending writes are records `{"k":"write","cp":ID,...}` appended to a line through their
checkpoint. A value's serde bytes are inline (`"x"`, latin-1 text; `"v"` base64 in records
written before) or a reference (`"r"` seq, `"o"` offset, `"n"` length) to an earlier record of
the same history holding the same bytes. A checkpoint put before 2 Dec 2026 (layout 1) keeps
its document as a tree file `langgraph` instead of a `cp` record. docs/LANGGRAPH.md has the
format in full.
"""

from __future__ import annotations

import base64
import bisect
import json
from collections.abc import Callable, Iterable
from typing import Any

import msgspec

from agentcas.errors import IntegrityError

RECORD = "langgraph"  # the tree file of a layout-1 checkpoint's document
# A checkpoint's or its metadata's serde bytes over RECORD_VALUE_BYTES: a file of its tree
# (content addressed, chunked, no record size limit), named by its checkpoint record.
SERDE_FILES = {"checkpoint": "langgraph-checkpoint", "metadata": "langgraph-metadata"}
VALUES = "values"  # the tree folder of channel values stored as files
FORMAT = 1
RECORD_KINDS = ("item", "write", "val", "cp")
MIN_REFERENCE = 48  # shorter values are stored inline (a reference is ~30 bytes)
RECORD_VALUE_BYTES = 4096  # a whole value up to this size is a record; a larger one a file (deduplicated)
_decode_json = msgspec.json.Decoder().decode  # ~2x json.loads; its DecodeError is a ValueError

# The earlier records a new record may name: [(seq, inline serde bytes)], newest first.
Earlier = Callable[[], Iterable[tuple[int, bytes]]]


class CorruptCheckpoint(IntegrityError):
    """A stored LangGraph checkpoint whose objects are damaged or inconsistent."""


def _unb64(text: str) -> bytes:
    """Strict base64 (the value field of records written before the latin-1 form)."""
    return base64.b64decode(text.encode("ascii"), validate=True)


def record_value(data: bytes) -> dict:
    """A record's value field: the serde bytes as a latin-1 string ("x": one character per
    byte, JSON-escaped only where it must be; serde bytes are mostly text, so this stays
    near their size and compresses like them, where base64 costs 4/3 and compresses badly)."""
    return {"x": data.decode("latin-1")}


def value_bytes(record: dict) -> bytes:
    """A record's serde bytes: "x" (latin-1 text) or "v" (base64, records written before)."""
    if "x" in record:
        text = record["x"]
        if not isinstance(text, str):
            raise ValueError("a record's value is not a string")
        return text.encode("latin-1")  # a character above U+00FF raises ValueError
    return _unb64(record["v"])


def jsonl(record: dict) -> bytes:
    """One record as a rollout line (compact JSON, UTF-8)."""
    return json.dumps(record, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n"


def decode_layout1(data: bytes) -> dict:
    """A tree's `langgraph` file (layout 1, written before 2 Dec 2026): one JSON line (ids,
    channels, serde types and lengths), then the serde bytes of the checkpoint (without its
    values) and of the metadata, raw."""
    line, _, rest = data.partition(b"\n")
    doc = json.loads(line)
    n = doc["checkpoint"]["n"]
    if n + doc["metadata"]["n"] != len(rest):
        raise ValueError("the record's lengths do not add up")
    doc["checkpoint"]["v"], doc["metadata"]["v"] = rest[:n], rest[n:]
    return doc


def checkpoint_record(doc: dict, filed: Iterable[str] = frozenset()) -> bytes:
    """The rollout record `{"k":"cp",...}` that ends a checkpoint's own records (layout 2):
    its ids, its channels, and the serde bytes of the checkpoint (without its values) and of
    the metadata as latin-1 text ("c", "m"), like a value record's "x"; a part in `filed` is
    instead the tree file the record names ("cf", "mf": SERDE_FILES)."""
    record = {"k": "cp", "id": doc["checkpoint_id"], "parent": doc["parent_checkpoint_id"],
              "thread": doc["thread_id"], "ns": doc["checkpoint_ns"], "chans": doc["channels"]}
    for part, key in (("checkpoint", "c"), ("metadata", "m")):
        record[key + "t"] = doc[part]["t"]
        if part in filed:
            record[key + "f"] = SERDE_FILES[part]
        else:
            record[key] = doc[part]["v"].decode("latin-1")
    return jsonl(record)


def doc_of_checkpoint_record(record: dict, files: dict[str, bytes]) -> dict:
    """A `cp` record (and its tree's `files`) as the document `decode_layout1` gives (one
    shape for both layouts)."""
    def serde(key: str) -> dict:
        kind, text, file = record.get(key + "t"), record.get(key), record.get(key + "f")
        if file is not None:
            if file not in SERDE_FILES.values() or file not in files:
                raise ValueError(f"the checkpoint record names a file its tree does not hold: {str(file)[:80]!r}")
            data = files[file]
        elif isinstance(text, str):
            data = text.encode("latin-1")  # a character above U+00FF raises ValueError
        else:
            raise ValueError("a checkpoint record's serde fields are not text")
        if not isinstance(kind, str):
            raise ValueError("a checkpoint record's serde type is not text")
        return {"t": kind, "v": data}
    if not isinstance(record.get("chans"), dict):
        raise ValueError("a checkpoint record's channels are not a map")
    return {"format": FORMAT, "checkpoint_id": record.get("id"), "parent_checkpoint_id": record.get("parent"),
            "thread_id": record.get("thread"), "checkpoint_ns": record.get("ns"), "channels": record["chans"],
            "checkpoint": serde("c"), "metadata": serde("m")}


def value_fields(data: bytes, earlier: Earlier) -> dict:
    """A record's value: the serde bytes inline, or, when an earlier record of the same history
    (`earlier()`: [(seq, its inline bytes)]) holds exactly these bytes, where: `"r"` its seq,
    `"o"` the offset, `"n"` the length (a message is its input's value, then a write, then an item)."""
    if len(data) >= MIN_REFERENCE:
        for seq, value in earlier():
            at = value.find(data)
            if at >= 0:
                return {"r": seq, "o": at, "n": len(data)}
    return record_value(data)


_UNDECODED = object()  # an item of LineRecords.decoded not decoded yet (None is a value)


class LineRecords:
    """One line's saver records from `start`, indexed: items by channel, writes by checkpoint."""

    def __init__(self, records: list[tuple[int, dict]], start: int):
        self.start = start
        self.item_seqs: dict[Any, list[int]] = {}  # keyed by the records' "ch" (a str when well formed)
        self.item_records: dict[Any, list[dict]] = {}
        self.decoded: dict[str, list] = {}
        self.done: dict[str, tuple[int, int]] = {}  # per channel: items lo <= i < hi all decoded
        self.writes: dict[Any, list[tuple[int, dict]]] = {}
        self.by_seq: dict[int, dict] = dict(records)  # what an item's reference ("r") names
        for seq, record in records:
            if record["k"] == "item":
                self.item_seqs.setdefault(record.get("ch"), []).append(seq)
                self.item_records.setdefault(record.get("ch"), []).append(record)
            elif record["k"] == "write":
                self.writes.setdefault(record.get("cp"), []).append((seq, record))
            # "val" (a channel value) and "cp" (a checkpoint) are read by seq

    def items(self, channel: str, start: int, stop: int, load: Callable[[dict], Any]) -> list:
        """The decoded items of `channel` with start <= seq < stop (each decoded once).

        A listing asks for nearly the same range once per checkpoint (newest first, each a
        little shorter), so the range known to be decoded is kept per channel and a request
        inside it is one list slice, not a loop over the items: O(n) per checkpoint in C
        instead of in Python.
        """
        seqs = self.item_seqs.get(channel, [])
        lo, hi = bisect.bisect_left(seqs, start), bisect.bisect_left(seqs, stop)
        decoded = self.decoded.setdefault(channel, [_UNDECODED] * len(seqs))
        done_lo, done_hi = self.done.get(channel, (0, 0))
        if not done_lo <= lo <= hi <= done_hi:
            records = self.item_records[channel]
            for i in range(lo, hi):
                if decoded[i] is _UNDECODED:
                    decoded[i] = load(records[i])
            if hi > lo:
                touching = done_lo < done_hi and lo <= done_hi and hi >= done_lo
                self.done[channel] = (min(lo, done_lo), max(hi, done_hi)) if touching else (lo, hi)
        return decoded[lo:hi]


def parse_records(data: bytes, start: int) -> list[tuple[int, dict]]:
    """(seq, record) of the saver's records among rollout lines `data` whose first is `start`
    (other lines, and lines that are no strict JSON object, are another writer's: skipped)."""
    out = []
    for seq, line in enumerate(data.splitlines(), start):
        try:
            record = _decode_json(line)  # strict JSON, as the saver writes it
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("k") in RECORD_KINDS:
            out.append((seq, record))
    return out
