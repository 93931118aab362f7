"""Canonical JSON: round-trips, and every non-canonical form is rejected."""

import json

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from agentcas.cas.encoding import MAX_DEPTH, NotCanonical, decode, encode

# Values encode() accepts: no floats, ints in [-2^63, 2^64), valid Unicode strings.
_text = st.text(st.characters(exclude_categories=("Cs",)), max_size=20)
_ints = st.integers(min_value=-(2**63), max_value=2**64 - 1)
values = st.recursive(
    st.none() | st.booleans() | _ints | _text,
    lambda children: st.lists(children, max_size=5) | st.dictionaries(_text, children, max_size=5),
    max_leaves=30)


@settings(max_examples=150, deadline=None)
@given(values)
@example({"b": 1, "a": [True, None, "é\u2028\x7f"]})
@example({"\U0001f600": 1, "\uffff": 2, "z": 3})  # code-point order, not UTF-16 order
@example(-(2**63))
@example(2**64 - 1)
@example("\x00\x1f\"\\")
def test_round_trip(value):
    data = encode(value)
    assert decode(data) == value
    assert encode(decode(data)) == data


def test_exact_bytes():
    assert encode({"b": [1, "é"], "a": None, "c": True}) == '{"a":null,"b":[1,"é"],"c":true}'.encode()
    assert encode("\n\x01") == b'"\\n\\u0001"'
    # keys sorted by code point: U+FFFF < U+1F600 (UTF-16 order would put the emoji first)
    assert encode({"\U0001f600": 1, "\uffff": 2}) == '{"\uffff":2,"\U0001f600":1}'.encode()


@pytest.mark.parametrize("data", [
    b'{"a":1,"a":2}',                 # duplicate key
    b'{"a":1.5}', b'1e3', b'1.0', b'-0.0',  # floats
    b'NaN', b'Infinity', b'-Infinity',
    b'{"b":1,"a":2}',                 # unsorted keys
    b'{"a": 1}', b' 1', b'1 ', b'[1, 2]',  # whitespace
    b'"\\u00e9"',                     # escape where the raw character is canonical
    b'"\\/"',                         # needless escape
    b'-0', b'01',                     # non-canonical integers
    b'"\\ud800"',                     # lone surrogate
    b'\xff', b'"\xc3"',               # not UTF-8
    b'', b'{', b'[1,]',               # not JSON
    str(2**64).encode(), str(-(2**63) - 1).encode(),  # out of the 64-bit range
    b'\xef\xbb\xbf1',                 # BOM
])
def test_rejects_non_canonical(data):
    with pytest.raises(NotCanonical):
        decode(data)


def test_rejects_deep_nesting():
    ok = [0]
    for _ in range(MAX_DEPTH - 1):
        ok = [ok]
    assert decode(encode(ok)) == ok
    deep = b"[" * (MAX_DEPTH + 2) + b"]" * (MAX_DEPTH + 2)
    with pytest.raises(NotCanonical):
        decode(deep)
    with pytest.raises(NotCanonical):
        decode(b"[" * 100_000 + b"]" * 100_000)  # would blow the recursion limit
    too_deep = []
    for _ in range(MAX_DEPTH + 1):
        too_deep = [too_deep]
    with pytest.raises(NotCanonical):
        encode(too_deep)


@pytest.mark.parametrize("value", [1.0, float("nan"), {"a": 0.5}, {1: "a"}, b"bytes", {"a": {1, 2}},
                                   2**64, -(2**63) - 1, "\udc80"])
def test_encode_refuses(value):
    with pytest.raises(NotCanonical):
        encode(value)


def test_huge_integer_literal_is_rejected_not_crashing():
    with pytest.raises(NotCanonical):
        decode(b"9" * 5000)


@given(values)
@settings(max_examples=50, deadline=None)
def test_python_json_spacing_is_rejected(value):
    spaced = json.dumps(value, sort_keys=True, ensure_ascii=False, indent=1).encode()
    if spaced != encode(value):
        with pytest.raises(NotCanonical):
            decode(spaced)


# --- the packed form (format 2, cas/packed.py) --------------------------------------------------

from agentcas.cas import packed  # noqa: E402
from agentcas.cas.digest import Digest  # noqa: E402

packed_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=0, max_value=packed.MAX_UINT)
    | st.binary(min_size=32, max_size=32).map(Digest) | st.text() | st.binary(),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=5),
    max_leaves=30)


@given(packed_values)
def test_packed_round_trips(value):
    data = packed.encode(value)
    assert packed.decode(data) == value
    assert packed.decode(memoryview(data)) == value   # stores hand out views of their map


@given(st.binary(max_size=64) | packed_values.map(packed.encode).flatmap(
    lambda data: st.integers(0, len(data)).map(lambda cut: data[:cut] + b"\x00" * (cut % 2))))
@example(bytes([packed.UINT, 0x82, 0x00]))          # a varint not in its shortest form
@example(bytes([packed.UINT]) + b"\xff" * 10 + b"\x01")  # longer than 64 bits
@example(bytes([packed.MAP, 2, 1, 98, 0, 1, 97, 0]))  # keys out of order
@example(bytes([packed.TEXT, 1, 0xff]))              # not UTF-8
def test_packed_accepts_only_its_own_encoding(data):
    """One encoding per value: bytes that decode at all are exactly the encoding of what they
    decode to (truncated, padded, reordered or non-minimal bytes raise NotCanonical)."""
    try:
        value = packed.decode(data)
    except NotCanonical:
        return
    assert packed.encode(value) == data


def test_packed_refuses_nesting_deeper_than_the_limit():
    with pytest.raises(NotCanonical, match="nested deeper"):
        packed.decode(bytes([packed.LIST, 1]) * (MAX_DEPTH + 1) + bytes([packed.NULL]))
    nested = bytes([packed.LIST, 1]) * MAX_DEPTH + bytes([packed.NULL])   # at the limit: fine
    assert packed.encode(packed.decode(nested)) == nested


@given(st.integers(min_value=0, max_value=packed.MAX_UINT), st.text())
@example(127, "")
@example(128, "\u00e9" * 200)
def test_packed_hot_path_encoders_equal_encode(n, text):
    """encode_uint and encode_text (CheckpointSeries's) write what encode writes."""
    assert packed.encode_uint(n) == packed.encode(n)
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError:
        return
    assert packed.encode_text(data) == packed.encode(text)


def test_packed_encode_uint_refuses_what_does_not_fit():
    with pytest.raises(NotCanonical):
        packed.encode_uint(packed.MAX_UINT + 1)
