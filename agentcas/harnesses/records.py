"""Log lines as records: (1-based line number, JSON object or None for a damaged line).

Both harnesses skip lines they cannot parse (Codex `get_rollout_history`, the Claude
SDK's `_parse_transcript_entries`), so a line that is blank, not UTF-8, not JSON or not
a JSON object becomes None here and replay skips it. Nothing read is ever executed.

Ingest classifies lines without building them: line_kinds.py.
"""

from __future__ import annotations

import json

import orjson

from agentcas.terminal_text import escape_controls

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


def record_type(value) -> str | None:
    """`value`'s `type` if it is a string, else None. Neither harness reads a record (or a
    Codex payload) whose tag is a list, an object or a number (serde refuses the line, the
    Claude SDK matches no type), so such a record is of no known type; and a string is what
    the type sets here can look up (a list in a frozenset lookup raises TypeError)."""
    kind = value.get("type") if isinstance(value, dict) else None
    return kind if isinstance(kind, str) else None


def detect_format(records) -> str | None:
    """"codex" or "claude" from the first records that say, else None."""
    for _, record in records:
        if record is None:
            continue
        kind = record_type(record)
        if kind in CODEX_TYPES and "payload" in record:
            return CODEX
        if "sessionId" in record or (kind in CLAUDE_TYPES and ("uuid" in record or "leafUuid" in record
                                                                 or "messageId" in record)):
            return CLAUDE
    return None


def preview(text, limit: int = PREVIEW_CHARS) -> str:
    """`text` on one line, at most `limit` characters (an ellipsis marks a cut): runs of
    whitespace become one space and any other control or bidi character, or lone surrogate,
    is escaped (`\\x1b`, `\\u202e`, `\\udcff`): valid text that never drives the terminal
    it is shown on."""
    if not isinstance(text, str):
        text = json.dumps(text, ensure_ascii=False, sort_keys=True)
    text = " ".join(text.split())
    shown = escape_controls(text[:limit])
    if len(text) <= limit and len(shown) <= limit:
        return shown
    return shown[:limit - 1] + "\u2026"
