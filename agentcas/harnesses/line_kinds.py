"""What ingest reads from every line of a log: whether it is a JSON object, and its types.

Ingest needs only this from most lines: whether the line is a JSON object (else it is
damaged: records.parse_line is None), its `type` and its `payload.type` (Codex).
`line_kind` answers without building the record: msgspec validates the whole line while
decoding only those fields (the other values are skipped, not built: several times
faster than orjson on Codex logs), and a line that is not ASCII is checked to be UTF-8
(msgspec does not check the bytes of the strings it skips). Any line msgspec refuses gets
`parse_line`'s own answer, so the two never disagree: msgspec refuses some lines that
`parse_line` accepts (a lone surrogate escape, a number out of its range, nesting deeper
than its limit, a `payload` that is not an object), never the other way round
(tests/test_harness_line_kinds.py). `classify_lines` is `line_kind` of every line of a file
(what ingest calls): one msgspec call for a file of compact objects, else one loop, with the
UTF-8 check made once for the whole file. A module of its own because importing msgspec costs
~50 ms, which an ingest with nothing new to read does not pay.
"""

from __future__ import annotations

from itertools import repeat
from operator import sub

import msgspec

from agentcas.harnesses.records import parse_line
from agentcas.lineage.rollout import line_ends


class _Payload(msgspec.Struct):
    type: object = None


class _Head(msgspec.Struct):
    """The fields of a record ingest reads from every line (others are skipped, not built)."""

    type: object = None
    payload: _Payload | None = None   # any other JSON value: decoded by parse_line instead


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


def classify_lines(data: bytes, wants) -> tuple[list[int], list[int], list[int]]:
    """(the end offset of each line, the numbers of the damaged lines, those of the lines
    whose types `wants(type, payload_type)`), numbers 0-based, of newline-terminated `data`.

    `line_kind` of every line. UTF-8 is checked once for the whole of `data` (a newline
    byte is never inside a UTF-8 sequence, so every line of valid UTF-8 is valid), per line
    only if that fails. A log whose lines are all compact objects is decoded in one
    msgspec call (`_classify_objects`); any other is decoded a line at a time, with
    `line_kind`'s common case inline.
    """
    valid_utf8 = data.isascii() or _is_utf8_lines(data)
    ends = line_ends(data)
    if valid_utf8:
        found = _classify_objects(data, ends, wants)
        if found is not None:
            return ends, [], found
    decode, view = _HEAD.decode, memoryview(data)
    damaged, wanted = [], []
    start = 0
    for number, end in enumerate(ends):
        try:
            head = decode(view[start:end])
        except (msgspec.DecodeError, RecursionError):   # and ValidationError: parse_line decides
            is_object, kind, inner = line_kind(view[start:end], valid_utf8)
        else:
            if valid_utf8 or _is_utf8(view[start:end]):
                head_kind, inner_kind = head.type, None if head.payload is None else head.payload.type
                is_object = True
                kind = head_kind if type(head_kind) is str else None
                inner = inner_kind if type(inner_kind) is str else None
            else:
                is_object, kind, inner = False, None, None
        if not is_object:
            damaged.append(number)
        elif wants(kind, inner):
            wanted.append(number)
        start = end
    return ends, damaged, wanted


def _classify_objects(data: bytes, ends: list[int], wants) -> list[int] | None:
    """The wanted lines of UTF-8 `data` if every line is a JSON object from its first byte
    `{` to a `}` just before its newline (what harnesses write), else None.

    One `decode_lines` of the whole buffer instead of a decode per line (the loop's Python:
    on the bench's sessions, each file read once, the median of 10 alternating runs went
    from 1.63 to 1.46 s of CPU per GB; msgspec's parse is most of what is left).
    decode_lines splits values at whitespace, not at lines, so the shape check makes the
    two the same: a `}` ends no line inside a value
    (after a `}` inside one comes `,` `}` or `]`, never `{`; inside a string a newline is
    not JSON), so every newline ends a value, each line holds one value or more, and as
    many values as lines means one each. A log that fails anything here (a damaged line,
    a value msgspec refuses, `\r\n` endings) is classified line by line instead.
    """
    if not ends or ends[-1] != len(data) or data[0] != 0x7B:
        return None
    byte = data.__getitem__
    if bytes(map(byte, ends[:-1])).strip(b"{") or bytes(map(byte, map(sub, ends, repeat(2)))).strip(b"}"):
        return None
    try:
        heads = _HEAD.decode_lines(data)
    except (msgspec.DecodeError, RecursionError):   # ValidationError is a DecodeError
        return None
    if len(heads) != len(ends):
        return None
    wanted = []
    for number, head in enumerate(heads):
        kind, payload = head.type, head.payload
        inner = None if payload is None else payload.type
        if wants(kind if type(kind) is str else None, inner if type(inner) is str else None):
            wanted.append(number)
    return wanted


UTF8_PIECE = 1024 * 1024


def _is_utf8_lines(data: bytes) -> bool:
    """Whether newline-terminated `data` is UTF-8, decoded a piece of about UTF8_PIECE at a
    time, each cut after a newline (no sequence spans one), so no whole-file copy is made."""
    view, start, size = memoryview(data), 0, len(data)
    while start < size:
        end = data.find(b"\n", start + UTF8_PIECE) + 1 or size
        if not _is_utf8(view[start:end]):
            return False
        start = end
    return True


def _is_utf8(raw) -> bool:
    try:
        str(raw, "utf-8")
    except UnicodeDecodeError:
        return False
    return True
