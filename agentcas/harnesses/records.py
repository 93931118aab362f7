"""Log lines as records: (1-based line number, JSON object or None for a damaged line).

Both harnesses skip lines they cannot parse (Codex `get_rollout_history`, the Claude
SDK's `_parse_transcript_entries`), so a line that is blank, not UTF-8, not JSON or not
a JSON object becomes None here and replay skips it. Nothing read is ever executed.

Ingest reads every line but needs only this from most of them: whether the line is a
JSON object, its `type` and its `payload.type` (Codex). `line_kind` answers without
building the record: msgspec validates the whole line while decoding only those (the
other values are skipped, not built: ~6x faster than orjson on Codex logs), and a line that is not ASCII
is checked to be UTF-8 (msgspec does not check the bytes of the strings it skips). Any
line msgspec refuses gets `parse_line`'s own answer, so the two never disagree: msgspec
refuses some lines that `parse_line` accepts (a lone surrogate escape, an exponent out of
range, nesting deeper than its limit), never the other way round (tests/test_records.py).
"""

from __future__ import annotations

import json

import msgspec
import orjson

CODEX = "codex"
CLAUDE = "claude"
FORMATS = (CODEX, CLAUDE)
CODEX_TYPES = frozenset({"session_meta", "response_item", "compacted", "turn_context", "event_msg"})
CLAUDE_TYPES = frozenset({"user", "assistant", "system", "summary", "file-history-snapshot", "progress",
                          "attachment", "queue-operation"})
PREVIEW_CHARS = 120


def _reject_constant(name):
    raise ValueError(f"{name} is not JSON")


_DECODER = json.JSONDecoder(parse_constant=_reject_constant)


def parse_line(raw: bytes, fast: bool = False) -> dict | None:
    """The JSON object on one line, or None if the line is damaged or not an object.

    Replay uses the standard library (exact values: integers of any size). `fast` (ingest,
    which only classifies lines and reads turn ids) tries orjson first, ~10x faster; what
    orjson refuses gets the standard library's answer, so both agree on what is damaged.
    """
    if fast:
        try:
            value = orjson.loads(raw)
            return value if isinstance(value, dict) else None
        except orjson.JSONDecodeError:
            pass
    try:
        value = _DECODER.decode(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


class _Payload(msgspec.Struct):
    type: object = None


class _Head(msgspec.Struct):
    """The fields of a record ingest reads from every line (others are skipped, not built)."""

    type: object = None
    payload: "_Payload | None" = None   # any other JSON value: decoded by parse_line instead


_HEAD = msgspec.json.Decoder(_Head)


def line_kind(raw, ascii: bool = False) -> tuple[bool, str | None, str | None]:
    """(whether `raw` is a JSON object line, its `type`, its `payload.type`); a type is None
    unless it is a string (and `payload.type` unless `payload` is an object).

    Exactly what `parse_line(raw, fast=True)` says, without building the record. `raw` is
    bytes or a memoryview of bytes; `ascii`: the caller knows they are ASCII (one
    `isascii` of a whole file beats one per line).
    """
    try:
        head = _HEAD.decode(raw)
    except (msgspec.DecodeError, RecursionError):   # ValidationError too: a payload that is not an object
        record = parse_line(bytes(raw), fast=True)
        if record is None:
            return False, None, None
        kind, payload = record.get("type"), record.get("payload")
        inner = payload.get("type") if isinstance(payload, dict) else None
    else:
        if not ascii and not _is_utf8(raw):
            return False, None, None
        kind, inner = head.type, None if head.payload is None else head.payload.type
    return True, kind if isinstance(kind, str) else None, inner if isinstance(inner, str) else None


def _is_utf8(raw) -> bool:
    try:
        str(raw, "utf-8")
    except UnicodeDecodeError:
        return False
    return True


def iter_lines(data: bytes, first_line: int = 1):
    """(line number, raw bytes with newline) for each newline-terminated line of `data`."""
    start, line, size = 0, first_line, len(data)
    while start < size:
        end = data.find(b"\n", start)
        end = size if end < 0 else end + 1
        yield line, data[start:end]
        start, line = end, line + 1


def parse_records(data: bytes, first_line: int = 1) -> list[tuple[int, dict | None]]:
    """Every line of `data` as (line number, record or None)."""
    return [(line, parse_line(raw)) for line, raw in iter_lines(data, first_line)]


def detect_format(records) -> str | None:
    """"codex" or "claude" from the first records that say, else None."""
    for _, record in records:
        if record is None:
            continue
        kind = record.get("type")
        if kind in CODEX_TYPES and "payload" in record:
            return CODEX
        if "sessionId" in record or (kind in CLAUDE_TYPES and ("uuid" in record or "leafUuid" in record
                                                                 or "messageId" in record)):
            return CLAUDE
    return None


def preview(text, limit: int = PREVIEW_CHARS) -> str:
    """`text` on one line, at most `limit` characters (an ellipsis marks a cut)."""
    if not isinstance(text, str):
        text = json.dumps(text, ensure_ascii=False, sort_keys=True)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 1] + "\u2026"
