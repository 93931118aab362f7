"""Packed canonical form: the binary byte form of structured objects, version 2.

Objects of format version 2 (docs/FORMAT.md section 2b) are positional lists encoded here
instead of JSON: ids are 32 raw bytes instead of 64 hex characters and there are no key
names, so a checkpoint or a segment is about half its JSON size. Each value is a tag byte
and a payload:

    0x00 null   0x01 false   0x02 true
    0x03 uint   minimal LEB128 varint (0 .. 2^64 - 1)
    0x04 id     32 raw bytes
    0x05 text   varint byte length, UTF-8
    0x06 list   varint count, the items
    0x07 map    varint count, then (varint length, UTF-8 key, value) pairs, keys sorted by
                their UTF-8 bytes, no key twice
    0x08 bytes  varint length, raw bytes

There is one encoding per value, so `decode` accepts only bytes that `encode` produces: a
non-minimal varint, unsorted or repeated keys, invalid UTF-8, unknown tags, nesting deeper
than 32 or bytes after the value are rejected.
"""

from __future__ import annotations

from agentcas.cas.digest import Digest
from agentcas.cas.encoding import MAX_DEPTH, MAX_OBJECT_BYTES, NotCanonical

NULL, FALSE, TRUE, UINT, ID, TEXT, LIST, MAP, BYTES = range(9)
MAX_UINT = 2**64 - 1


def varint(n: int) -> bytes:
    """Minimal unsigned LEB128."""
    if n < 0x80:
        return _BYTE[n]
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_BYTE = [bytes((i,)) for i in range(256)]
_UINTS = [bytes((UINT, i)) for i in range(128)]
_UINT_TAG, _TEXT_TAG = bytes((UINT,)), bytes((TEXT,))


def encode_uint(n: int) -> bytes:
    """`encode(n)` of an int known to be >= 0, without the general walk (hot paths)."""
    if n < 0x80:
        return _UINTS[n]
    if n > MAX_UINT:
        raise NotCanonical("packed integers are in 0 .. 2^64 - 1")
    return _UINT_TAG + varint(n)


def encode_text(data: bytes) -> bytes:
    """`encode(s)` of a str `s`, given `data = s.encode("utf-8")` (hot paths)."""
    return b"".join((_TEXT_TAG, varint(len(data)), data))


def encode(value) -> bytes:
    """Packed bytes of `value` (None, bool, int >= 0, Digest, str, bytes, list/tuple, dict of str)."""
    out = bytearray()
    _encode(value, out, 0)
    return bytes(out)


def _encode(value, out: bytearray, depth: int) -> None:
    # Dispatch on the exact type first: this runs once per field of every tree entry, so
    # it is on the path of every commit (a 1,000-file recommit encodes ~6,000 values).
    kind = type(value)
    if kind is Digest:
        out.append(ID)
        out += value.raw
    elif kind is str:
        try:
            data = value.encode("utf-8")
        except UnicodeEncodeError:
            raise NotCanonical("strings must be valid Unicode (no lone surrogates)") from None
        out.append(TEXT)
        out += varint(len(data))
        out += data
    elif kind is int:
        if 0 <= value < 0x80:
            out += _UINTS[value]
        elif 0 <= value <= MAX_UINT:
            out.append(UINT)
            out += varint(value)
        else:
            raise NotCanonical("packed integers are in 0 .. 2^64 - 1")
    elif value is None:
        out.append(NULL)
    elif kind is list or kind is tuple:
        if depth >= MAX_DEPTH:
            raise NotCanonical(f"object nested deeper than {MAX_DEPTH} levels")
        out.append(LIST)
        out += varint(len(value))
        for item in value:
            _encode(item, out, depth + 1)
    elif value is True:
        out.append(TRUE)
    elif value is False:
        out.append(FALSE)
    elif isinstance(value, (bytes, bytearray, memoryview)):
        out.append(BYTES)
        out += varint(len(value))
        out += value
    elif isinstance(value, dict):
        if depth >= MAX_DEPTH:
            raise NotCanonical(f"object nested deeper than {MAX_DEPTH} levels")
        items = []
        for key, item in value.items():
            if not isinstance(key, str):
                raise NotCanonical("map keys must be strings")
            items.append((key.encode("utf-8"), item))
        items.sort(key=lambda pair: pair[0])
        out.append(MAP)
        out += varint(len(items))
        for key, item in items:
            out += varint(len(key))
            out += key
            _encode(item, out, depth + 1)
    elif isinstance(value, int) and not isinstance(value, bool):
        _encode(int(value), out, depth)
    elif isinstance(value, Digest):
        _encode(Digest(value.raw), out, depth)
    elif isinstance(value, str):
        _encode(str(value), out, depth)
    elif isinstance(value, (list, tuple)):
        _encode(list(value), out, depth)
    else:
        raise NotCanonical(f"type {type(value).__name__} has no packed encoding")


def _truncated():
    return NotCanonical("packed value is truncated")


def _varint(data, at: int) -> tuple[int, int]:
    """(value, position after it) of the minimal LEB128 varint at `at`."""
    try:
        byte = data[at]
    except IndexError:
        raise _truncated() from None
    if byte < 0x80:  # one byte: nearly every count, length and small integer
        return byte, at + 1
    value, shift = 0, 0
    while True:
        try:
            byte = data[at]
        except IndexError:
            raise _truncated() from None
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            break
        shift += 7
        if shift > 63:
            raise NotCanonical("varint longer than 64 bits")
    if byte == 0 or value > MAX_UINT:
        raise NotCanonical("varint not in its shortest form")
    return value, at


def _text(data, at: int) -> tuple[str, int]:
    n, at = _varint(data, at)
    end = at + n
    if end > len(data):
        raise _truncated()
    try:
        return str(data[at:end], "utf-8"), end
    except UnicodeDecodeError:
        raise NotCanonical("text is not valid UTF-8") from None


def _value(data, at: int, depth: int):
    """(value, position after it): one recursive function with the position in a local, no
    reader object (this decodes every checkpoint, tree and segment a command reads)."""
    if depth > MAX_DEPTH:
        raise NotCanonical(f"object nested deeper than {MAX_DEPTH} levels")
    try:
        tag = data[at]
    except IndexError:
        raise _truncated() from None
    at += 1
    if tag == UINT:
        return _varint(data, at)
    if tag == ID:
        end = at + 32
        if end > len(data):
            raise _truncated()
        return Digest(bytes(data[at:end])), end
    if tag == TEXT:
        return _text(data, at)
    if tag == LIST:
        count, at = _varint(data, at)
        items: list = []
        append = items.append
        for _ in range(count):
            item, at = _value(data, at, depth + 1)
            append(item)
        return items, at
    if tag == NULL:
        return None, at
    if tag == FALSE:
        return False, at
    if tag == TRUE:
        return True, at
    if tag == BYTES:
        n, at = _varint(data, at)
        end = at + n
        if end > len(data):
            raise _truncated()
        return bytes(data[at:end]), end
    if tag == MAP:
        count, at = _varint(data, at)
        doc, previous = {}, None
        for _ in range(count):
            key, at = _text(data, at)
            raw = key.encode("utf-8")
            if previous is not None and raw <= previous:
                raise NotCanonical("map keys must be sorted and unique")
            previous = raw
            doc[key], at = _value(data, at, depth + 1)
        return doc, at
    raise NotCanonical(f"unknown packed tag {tag}")


def decode(data):
    """The value of packed bytes; NotCanonical unless they are exactly `encode(value)`."""
    if len(data) > MAX_OBJECT_BYTES:
        raise NotCanonical(f"object of {len(data)} bytes exceeds {MAX_OBJECT_BYTES}")
    value, at = _value(data, 0, 0)
    if at != len(data):
        raise NotCanonical("bytes after the packed value")
    return value
