"""line_kinds.line_kind, ingest's fast line classifier, against parse_line (agentcas/harnesses/records.py).

line_kind must say exactly what parse_line(raw, fast=True) says: whether a line is a JSON
object (else ingest reports it as damaged) and its `type` (what finds turn boundaries).
Hypothesis builds JSON lines, then damages them the ways disks and writers do (cut, glued
to the next line, bytes flipped, inserted or removed, escapes rewritten).
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from agentcas.harnesses import line_kinds
from agentcas.harnesses.line_kinds import classify_lines, line_kind
from agentcas.harnesses.records import parse_line


def expected(raw: bytes) -> tuple[bool, str | None, str | None]:
    record = parse_line(raw, fast=True)
    if record is None:
        return False, None, None
    kind, payload = record.get("type"), record.get("payload")
    inner = payload.get("type") if isinstance(payload, dict) else None
    return True, kind if isinstance(kind, str) else None, inner if isinstance(inner, str) else None


def check(raw: bytes) -> None:
    want = expected(raw)
    assert line_kind(raw) == want, raw
    assert line_kind(memoryview(raw)) == want, raw
    if raw.isascii():
        assert line_kind(raw, ascii=True) == want, raw


LEAVES = st.one_of(st.none(), st.booleans(), st.integers(), st.integers(min_value=-2**80, max_value=2**80),
                   st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=20),
                   st.sampled_from(["event_msg", "task_complete", "user", "\ud800x", "é", "\x00", "\u2028"]))
KEYS = st.sampled_from(["type", "payload", "typ\u0065", "x", "type "])
VALUES = st.recursive(LEAVES, lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(KEYS | st.text(max_size=8), inner, max_size=4), max_leaves=12)
OBJECTS = st.dictionaries(KEYS | st.text(max_size=6), VALUES, max_size=5)


def encode(value, ascii_only: bool, spaced: bool) -> bytes:
    text = json.dumps(value, ensure_ascii=ascii_only, separators=(", ", ": ") if spaced else (",", ":"))
    return text.encode("utf-8", "surrogatepass")


@st.composite
def lines(draw) -> bytes:
    """A JSON line (object or not), then none or some damage."""
    value = draw(OBJECTS | VALUES)
    raw = encode(value, draw(st.booleans()), draw(st.booleans()))
    if draw(st.booleans()):
        raw = raw.replace(b'"type"', b'"t\\u0079pe"').replace(b'"event_msg"', b'"event\\u005fmsg"')
    damage = draw(st.sampled_from(["none", "none", "cut", "glue", "flip", "insert", "delete", "wrap"]))
    if damage == "cut" and raw:
        raw = raw[:draw(st.integers(0, len(raw) - 1))]
    elif damage == "glue":
        raw += encode(draw(OBJECTS), True, False)[draw(st.integers(0, 3)):]
    elif damage in ("flip", "insert", "delete") and raw:
        at = draw(st.integers(0, len(raw) - 1))
        byte = bytes([draw(st.integers(0, 255))])
        raw = raw[:at] + (byte if damage != "delete" else b"") + raw[at + (damage != "insert"):]
    elif damage == "wrap":
        raw = draw(st.sampled_from([b" ", b"\t", b"\r", b"\x0c", b"\xef\xbb\xbf", b""])) + raw + \
            draw(st.sampled_from([b" ", b"\r", b"\x00", b"\x85", b"", b"}"]))
    return raw + draw(st.sampled_from([b"\n", b"\r\n", b""]))


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lines())
@example(b'{"type":"event_msg"}\n')
@example(b'{"type":"event_msg","payload":{"type":"task_complete","turn_id":"t"}}\n')
@example(b'{"type":"event_msg","payload":["task_complete"]}\n')   # not an object: msgspec refuses it
@example(b'{"type":"event_msg","payload":{"type":1e400}}\n')
@example(b'{"payload":{"type":"a"},"payload":null}\n')
@example(b'{"type":"event_msg","payload":{"type":"task_complete"}}{"type":"response_item"}\n')  # glued
@example(b'{"type":"event_msg","payload":{"type":"task_compl')                                   # cut
@example(b'{"a":"\xff"}\n')                    # not UTF-8 inside a string msgspec skips
@example(b'{"\xc3\xa9":"\xed\xa0\x80"}\n')      # a surrogate encoded in UTF-8
@example(b'{"a":"\\ud800"}\n')                  # a lone surrogate escape: stdlib accepts it
@example(b'{"type":1e400}\n')                   # out of msgspec's range: stdlib reads inf
@example(b'{"type":123456789012345678901234567890}\n')
@example(b'{"type":"a","type":"user"}\n')       # duplicate keys: the last one counts
@example(b'{"t\\u0079pe":"user"}\n')
@example(b'{"a":' + b"[" * 3000 + b"]" * 3000 + b"}\n")   # deeper than any decoder's limit
@example(b'{"a":' + b"[" * 900 + b"]" * 900 + b"}\n")
@example(b"[" + b"{" * 10 + b"\n")
@example(b'{"a":NaN}\n')
@example(b'\xef\xbb\xbf{"a":1}\n')
@example(b"\n")
@example(b"")
def test_line_kind_agrees_with_parse_line(raw):
    check(raw)


@pytest.mark.parametrize("raw", [bytes([b]) + b'{"type":"user"}\n' for b in range(256)]
                         + [b'{"type":"user"}' + bytes([b]) + b"\n" for b in range(256)])
def test_line_kind_agrees_on_every_byte_around_an_object(raw):
    check(raw)


# --- classify_lines: line_kind of every line of a file, in one pass --------------------------

def wants_all(kind, payload_kind) -> bool:
    return kind is not None or payload_kind is not None


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(lines(), max_size=12))
@example([b'{"type":"event_msg","payload":{"type":"a\xc3\xa9"}}', b'{"type":"user","a":"\xff"}', b'{"type":"x"}'])
@example([b'{"type":"user","a":"\xc3\xa9"}', b"\n", b'{"type":"x"}'])
@example([b'{"a":"\xed\xa0\x80"}', b'{"type":"user"}'])
def test_classify_lines_says_what_line_kind_says_of_each_line(raws):
    """One file's lines: valid UTF-8 whole, or with a line that is not (the whole-file check
    then fails and each line is checked), damaged lines among good ones."""
    data = b"".join(raw if raw.endswith(b"\n") else raw + b"\n" for raw in raws)
    starts_of = [0] + [i + 1 for i, byte in enumerate(data) if byte == 0x0A]
    kinds = [line_kind(data[s:e]) for s, e in zip(starts_of, starts_of[1:])]
    for piece in (line_kinds.UTF8_PIECE, 1):   # the whole-file UTF-8 check in one piece, or a line at a time
        saved, line_kinds.UTF8_PIECE = line_kinds.UTF8_PIECE, piece
        try:
            ends, damaged, wanted = classify_lines(data, wants_all)
        finally:
            line_kinds.UTF8_PIECE = saved
        assert ends == starts_of[1:]
        assert damaged == [n for n, (is_object, _, _) in enumerate(kinds) if not is_object]
        assert wanted == [n for n, (is_object, kind, inner) in enumerate(kinds)
                          if is_object and wants_all(kind, inner)]


# --- the whole-log path: one decode_lines when every line is a compact object ----------------

def classified_line_by_line(data: bytes) -> tuple[list, list]:
    starts = [0] + [i + 1 for i, byte in enumerate(data) if byte == 0x0A]
    kinds = [line_kind(data[s:e]) for s, e in zip(starts, starts[1:])]
    return ([n for n, (is_object, _, _) in enumerate(kinds) if not is_object],
            [n for n, (is_object, kind, inner) in enumerate(kinds) if is_object and wants_all(kind, inner)])


@pytest.mark.parametrize("raws", [
    # two values on one line (damaged) beside a good one: as many values as lines is not enough
    [b'{"a":1} {"type":"user"}', b'{"type":"user"}', b'{"type":"x"}'],
    [b'{"type":"user"}', b'{"a":1}{"type":"user"}'],
    # an object spread over two lines, and a line of two values: the counts agree, the lines do not
    [b'{"type":"user","a":', b'1}', b'{"x":1} {"type":"y"}'],
    [b'{"a":{"type":"user"}', b',"b":{}}', b'{}{}'],
    # whitespace decode_lines skips but a line is not: blank, spaces, CR LF
    [b'{"type":"user"}', b'', b'{"type":"x"}'],
    [b'{"type":"user"} ', b'{"type":"x"}'],
    [b'{"type":"user"}\r', b'{"type":"x"}'],
    [b' {"type":"user"}', b'{"type":"x"}'],
    # a payload that is not an object, and values msgspec refuses inside a good shape
    [b'{"type":"event_msg","payload":[1]}', b'{"type":"user"}'],
    [b'{"type":"user","n":1e999}', b'{"type":"x"}'],
    [b'{"type":"user","s":"\\ud800"}', b'{"type":"x"}'],
])
def test_classify_lines_whole_log_path_agrees_with_each_line(raws):
    data = b"".join(raw + b"\n" for raw in raws)
    damaged, wanted = classified_line_by_line(data)
    ends, got_damaged, got_wanted = classify_lines(data, wants_all)
    assert (got_damaged, got_wanted) == (damaged, wanted)


def test_a_log_of_compact_objects_is_decoded_whole():
    """The common case takes the one-call path (else the examples above test nothing new)."""
    data = b'{"type":"event_msg","payload":{"type":"task_complete"}}\n{"type":"response_item"}\n{}\n'
    ends = [56, 81, 84]
    assert line_kinds.line_ends(data) == ends
    assert line_kinds._classify_objects(data, ends, wants_all) == [0, 1]
    assert line_kinds._classify_objects(data[:-1] + b" \n", ends, wants_all) is None


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(OBJECTS, st.booleans()), min_size=1, max_size=10),
       st.lists(st.sampled_from([b'{"a":1} {"type":"user"}', b'{"type":"user","x":', b'1}', b"{}{}", b"{} ",
                                 b'{"type":"user","s":"\\ud800"}', b'{"payload":3}', b"", b' {"type":"x"}',
                                 b'{"type":"user","x":\n1}']), max_size=4),
       st.randoms(use_true_random=False))
def test_classify_lines_of_compact_objects_agrees_with_each_line(objects, odd, rng):
    """Logs of compact objects (the whole-file path), with now and then a line that only
    looks like one: the same answer as line_kind of each line."""
    raws = [encode(value, ascii_only, False) for value, ascii_only in objects]
    for raw in odd:
        raws.insert(rng.randrange(len(raws) + 1), raw)
    data = b"".join(raw + b"\n" for raw in raws)
    damaged, wanted = classified_line_by_line(data)
    ends, got_damaged, got_wanted = classify_lines(data, wants_all)
    assert ends == [i + 1 for i, byte in enumerate(data) if byte == 0x0A]
    assert (got_damaged, got_wanted) == (damaged, wanted)
