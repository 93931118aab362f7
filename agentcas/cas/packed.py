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


class _Reader:
    def __init__(self, data):
        self.data = data
        self.at = 0

    def take(self, n: int):
        end = self.at + n
        if end > len(self.data):
            raise NotCanonical("packed value is truncated")
        chunk = self.data[self.at:end]
        self.at = end
        return chunk

    def varint(self) -> int:
        data, at, shift, value = self.data, self.at, 0, 0
        while True:
            if at >= len(data):
                raise NotCanonical("packed value is truncated")
            byte = data[at]
            at += 1
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                break
            shift += 7
            if shift > 63:
                raise NotCanonical("varint longer than 64 bits")
        if (byte == 0 and shift) or value > MAX_UINT:
            raise NotCanonical("varint not in its shortest form")
        self.at = at
        return value

    def text(self) -> str:
        try:
            return bytes(self.take(self.varint())).decode("utf-8")
        except UnicodeDecodeError:
            raise NotCanonical("text is not valid UTF-8") from None

    def value(self, depth: int):
        if depth > MAX_DEPTH:
            raise NotCanonical(f"object nested deeper than {MAX_DEPTH} levels")
        tag = self.take(1)[0]
        if tag == NULL:
            return None
        if tag == FALSE:
            return False
        if tag == TRUE:
            return True
        if tag == UINT:
            return self.varint()
        if tag == ID:
            return Digest(bytes(self.take(32)))
        if tag == TEXT:
            return self.text()
        if tag == BYTES:
            return bytes(self.take(self.varint()))
        if tag == LIST:
            return [self.value(depth + 1) for _ in range(self.varint())]
        if tag == MAP:
            doc, previous = {}, None
            for _ in range(self.varint()):
                key = self.text()
                raw = key.encode("utf-8")
                if previous is not None and raw <= previous:
                    raise NotCanonical("map keys must be sorted and unique")
                previous = raw
                doc[key] = self.value(depth + 1)
            return doc
        raise NotCanonical(f"unknown packed tag {tag}")


def decode(data):
    """The value of packed bytes; NotCanonical unless they are exactly `encode(value)`."""
    if len(data) > MAX_OBJECT_BYTES:
        raise NotCanonical(f"object of {len(data)} bytes exceeds {MAX_OBJECT_BYTES}")
    reader = _Reader(data)
    value = reader.value(0)
    if reader.at != len(data):
        raise NotCanonical("bytes after the packed value")
    return value
