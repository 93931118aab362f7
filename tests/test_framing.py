"""Stored value framing: header fields, CRC, codecs, bounded decompression."""

import os
import struct
import zlib

import pytest
import zstandard
from hypothesis import example, given, settings
from hypothesis import strategies as st

from agentcas.cas import framing
from agentcas.cas.framing import (
    CODEC_RAW,
    CODEC_ZSTD,
    HEADER_SIZE,
    KIND_CHUNK,
    KIND_TREE,
    CorruptValue,
    decompress_bounded,
    frame,
    read_header,
    unframe,
)
from agentcas.errors import IntegrityError


def raw_value(kind, codec, size, body, written_at=0):
    """A value with a correct header CRC around an arbitrary body."""
    head = struct.pack(">BBQQ", kind, codec, size, written_at)
    return head + struct.pack(">I", zlib.crc32(head)) + body


def test_header_layout_vector():
    value = frame(KIND_CHUNK, b"hello\n", written_at=0)
    assert HEADER_SIZE == 22
    assert value.hex() == "010000000000000000060000000000000000fb53002668656c6c6f0a"
    assert value[:18] == bytes([1, 0]) + (6).to_bytes(8, "big") + bytes(8)
    assert value[18:22] == zlib.crc32(value[:18]).to_bytes(4, "big")
    assert read_header(value) == (KIND_CHUNK, CODEC_RAW, 6, 0)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(sorted(framing.KIND_NAMES)), st.binary(max_size=3000) | st.just(b"a" * 5000))
@example(KIND_CHUNK, b"")
@example(KIND_CHUNK, b"x" * 64)
def test_round_trip(kind, data):
    value = frame(kind, data, written_at=1_700_000_000)
    assert unframe(value) == (kind, data)
    k, codec, size, when = read_header(value)
    assert (k, size, when) == (kind, len(data), 1_700_000_000)


def test_compresses_only_when_it_saves_space():
    text = b"the same line again\n" * 1000
    assert read_header(frame(KIND_CHUNK, text))[1] == CODEC_ZSTD
    assert len(frame(KIND_CHUNK, text)) < len(text) // 10
    noise = os.urandom(5000)
    assert read_header(frame(KIND_CHUNK, noise))[1] == CODEC_RAW
    assert len(frame(KIND_CHUNK, noise)) == HEADER_SIZE + 5000
    assert read_header(frame(KIND_CHUNK, b"a" * 63))[1] == CODEC_RAW
    assert read_header(frame(KIND_CHUNK, text, compress=False))[1] == CODEC_RAW


def test_small_tables_write_ordinary_zstd_frames_with_their_own_match_tables():
    """framing.INGEST_ZSTD (harness logs) is level 3 with smaller match tables: its frames
    read back like any other and declare their size, and they are not level 3's own (the
    tables are applied, not dropped), at most a few percent larger."""
    import random
    rng = random.Random(3)
    words = [b"def", b"return", b"thread", b"replay", b"chunk", b"value", b"json", b"store", b"line"]
    text = b" ".join(rng.choice(words) + str(rng.randrange(10_000)).encode() for _ in range(90_000))
    small = frame(KIND_CHUNK, text, written_at=0, level=framing.INGEST_ZSTD)
    default = frame(KIND_CHUNK, text, written_at=0, level=3)
    assert unframe(small) == (KIND_CHUNK, text)
    assert read_header(small) == (KIND_CHUNK, CODEC_ZSTD, len(text), 0)
    assert zstandard.get_frame_parameters(small[HEADER_SIZE:]).content_size == len(text)
    assert small != default and len(small) <= len(default) * 1.05   # 3.3% here: dense numbers, a worst case
    assert framing.INGEST_ZSTD == framing.SmallTables(3, 15, 14)


def test_every_flipped_header_bit_is_caught():
    value = frame(KIND_TREE, b'{"entries":[]}', written_at=12345)
    for i in range(HEADER_SIZE):
        for bit in range(8):
            bad = bytearray(value)
            bad[i] ^= 1 << bit
            with pytest.raises(CorruptValue):
                unframe(bytes(bad))


@pytest.mark.parametrize("value", [
    b"", b"\x01" * 21,                                   # shorter than the header
    raw_value(99, CODEC_RAW, 1, b"x"),                   # unknown kind
    raw_value(KIND_CHUNK, 7, 1, b"x"),                   # unknown codec
    raw_value(KIND_CHUNK, CODEC_RAW, 2, b"x"),           # raw body shorter than size
    raw_value(KIND_CHUNK, CODEC_RAW, 0, b"x"),           # raw body longer than size
    raw_value(KIND_CHUNK, CODEC_RAW, (1 << 31) + 1, b"x"),  # size beyond the object limit
    raw_value(KIND_CHUNK, CODEC_ZSTD, 10, b""),          # empty zstd body
    raw_value(KIND_CHUNK, CODEC_ZSTD, 10, b"garbage garbage"),  # not a zstd frame
])
def test_damaged_values_are_rejected(value):
    with pytest.raises(CorruptValue) as info:
        unframe(value)
    assert isinstance(info.value, IntegrityError)


DATA = b"a" * 100_000


def _zstd(data, content_size=True):
    return zstandard.ZstdCompressor(write_content_size=content_size).compress(data)


def test_frame_claiming_more_than_the_header_is_rejected_before_allocating():
    body = _zstd(DATA)
    with pytest.raises(CorruptValue, match="declares 100000 bytes, expected 1000"):
        unframe(raw_value(KIND_CHUNK, CODEC_ZSTD, 1000, body))
    # A frame claiming 1 TiB against a header claiming 1 TiB would still be capped by the header limit.
    huge = bytearray(_zstd(b"x" * 1000))
    with pytest.raises(CorruptValue):
        unframe(raw_value(KIND_CHUNK, CODEC_ZSTD, 1 << 40, bytes(huge)))


def test_frame_without_declared_size_is_rejected():
    with pytest.raises(CorruptValue, match="declares -1"):
        unframe(raw_value(KIND_CHUNK, CODEC_ZSTD, len(DATA), _zstd(DATA, content_size=False)))


def test_frame_expanding_past_its_declared_size_is_rejected():
    body = bytearray(_zstd(DATA))
    # Single-segment frame header: magic(4) FHD(1) then a 4-byte little-endian content size.
    assert body[4] & 0xC0 == 0x80 and int.from_bytes(body[5:9], "little") == len(DATA)
    body[5:9] = (1000).to_bytes(4, "little")  # now it declares 1000 but expands to 100000
    with pytest.raises(CorruptValue):
        decompress_bounded(bytes(body), 1000)
    with pytest.raises(CorruptValue):
        unframe(raw_value(KIND_CHUNK, CODEC_ZSTD, 1000, bytes(body)))


def test_frame_shorter_than_declared_is_rejected():
    body = bytearray(_zstd(DATA))
    body[5:9] = (200_000).to_bytes(4, "little")
    with pytest.raises(CorruptValue):
        decompress_bounded(bytes(body), 200_000)


def test_trailing_bytes_or_a_second_frame_are_rejected():
    body = _zstd(DATA)
    assert decompress_bounded(body, len(DATA)) == DATA
    for extra in (b"junk", _zstd(b"more")):
        with pytest.raises(CorruptValue):
            unframe(raw_value(KIND_CHUNK, CODEC_ZSTD, len(DATA), body + extra))


def test_flipped_body_byte_in_a_compressed_value_is_rejected_or_changes_bytes():
    data = b"".join(b"line %d of a log\n" % i for i in range(3000))
    value = frame(KIND_CHUNK, data)
    assert read_header(value)[1] == CODEC_ZSTD
    for offset in range(HEADER_SIZE, len(value), max(1, len(value) // 50)):
        bad = bytearray(value)
        bad[offset] ^= 0x40
        try:
            _, got = unframe(bytes(bad))
        except CorruptValue:
            continue
        assert got != data or bytes(bad) == value  # the digest check then catches it


def test_sealed_values_bind_table_key_and_payload():
    import blake3

    from agentcas.cas.sealed import seal, unseal
    value = seal("refs", b"threads/main", b'{"x":1}')
    expected_tag = blake3.blake3(b"\x00\x04refs" + b"\x00\x00\x00\x0cthreads/main" + b'{"x":1}',
                                 derive_key_context="agentcas 2026-11 sealed table value v1").digest()[:8]
    assert value == b'{"x":1}' + expected_tag  # docs/FORMAT.md, "Sealed values"
    assert unseal("refs", b"threads/main", value) == b'{"x":1}'
    for table, key, bad in [("reflog", b"threads/main", value), ("refs", b"threads/other", value),
                            ("refs", b"threads/main", value[:-1] + bytes([value[-1] ^ 1])),
                            ("refs", b"threads/main", b"x" + value[1:]), ("refs", b"threads/main", b"short")]:
        with pytest.raises(IntegrityError, match="corrupt"):
            unseal(table, key, bad)
