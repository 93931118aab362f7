"""The stored form of one object: a 22-byte header, then raw or zstd bytes.

    kind u8 | codec u8 | size u64 BE | written_at u64 BE | crc32(previous 18 bytes) u32 BE

`size` is the object's uncompressed length; a zstd frame is accepted only if its header
declares exactly that size, and it is decompressed into at most that many bytes, so a
frame that claims or expands to more is rejected, never allocated. `written_at` (unix
seconds) feeds gc's grace period. The header has its own CRC because the object's
digest covers only its bytes; together they catch a flipped bit anywhere in the value.
"""

from __future__ import annotations

import struct
import threading
import time
import zlib
from dataclasses import dataclass
from typing import cast

import zstandard

from agentcas.errors import IntegrityError

HEADER = struct.Struct(">BBQQI")
HEADER_SIZE = HEADER.size
_HEAD, _CRC = struct.Struct(">BBQQ"), struct.Struct(">I")  # a header before its CRC; the CRC

KIND_CHUNK = 1
KIND_TREE = 2
KIND_CHECKPOINT = 3
KIND_CHUNKLIST = 4
KIND_SEGMENT = 5
KIND_SIGNATURE = 6
KIND_NAMES = {KIND_CHUNK: "chunk", KIND_TREE: "tree", KIND_CHECKPOINT: "checkpoint",
              KIND_CHUNKLIST: "chunklist", KIND_SEGMENT: "segment", KIND_SIGNATURE: "signature"}
KIND_BY_NAME = {name: kind for kind, name in KIND_NAMES.items()}

CODEC_RAW = 0
CODEC_ZSTD = 1
ZSTD_LEVEL = 3
# Workspace chunks favour speed (level 1: ~300 MB/s per core on text, ratio 2.3 vs 2.5
# at level 3); rollout chunks, written once per append, favour size (level 7).
FILE_ZSTD_LEVEL = 1
ROLLOUT_ZSTD_LEVEL = 7
MAX_OBJECT_SIZE = 1 << 31


@dataclass(frozen=True)
class SmallTables:
    """A zstd level whose match finder keeps 2**hash_log and 2**chain_log table entries
    instead of the level's own (a `level` wherever frame takes one)."""

    level: int
    hash_log: int
    chain_log: int


# Harness logs (ingest): level 3's match finder (double fast) with 2^15 and 2^14 entries
# instead of 2^17 and 2^16. Its tables, 192 KiB instead of 768, stay in a core's 1 MiB L2
# cache beside the chunk being compressed: on ~500 KB chunks, median of 5 alternating runs,
# 21% less CPU on the bench's sessions (2.67 vs 3.38 s a GB) for 0.5% more bytes (ratio
# 5.454 vs 5.481), and 10% less on logs of source-code tool outputs (3.18 vs 3.54 s a GB,
# ratio 5.399 vs 5.430). The frames are ordinary zstd frames; nothing reads them differently.
INGEST_ZSTD = SmallTables(3, 15, 14)


class CorruptValue(IntegrityError):
    """A stored value whose header or compressed body is damaged."""


_LOCAL = threading.local()
PROBE_BYTES = 8192


def _compressor(level: int | SmallTables) -> zstandard.ZstdCompressor:
    """One compressor per thread and level (they are not thread-safe, and cost to build)."""
    cache = getattr(_LOCAL, "compressors", None)
    if cache is None:
        cache = _LOCAL.compressors = {}
    compressor = cache.get(level)
    if compressor is None:
        if isinstance(level, SmallTables):
            compressor = zstandard.ZstdCompressor(compression_params=zstandard.ZstdCompressionParameters.from_level(
                level.level, hash_log=level.hash_log, chain_log=level.chain_log, write_content_size=True,
                write_checksum=False))
        else:
            compressor = zstandard.ZstdCompressor(level=level, write_content_size=True, write_checksum=False)
        cache[level] = compressor
    return compressor


def _decompressor() -> zstandard.ZstdDecompressor:
    """One decompressor per thread (building one per chunk costs more than small chunks)."""
    decompressor = getattr(_LOCAL, "decompressor", None)
    if decompressor is None:
        decompressor = _LOCAL.decompressor = zstandard.ZstdDecompressor()
    return decompressor


def _worth_compressing(data) -> bool:
    """Large values are probed first: 8 KiB from the middle that zstd cannot shrink by
    3% means incompressible (random, already compressed), so the value is stored raw
    without paying for a full compression attempt."""
    if len(data) <= 4 * PROBE_BYTES:
        return True
    middle = len(data) // 2
    return len(_compressor(1).compress(data[middle:middle + PROBE_BYTES])) < PROBE_BYTES * 0.97


def frame(kind: int, data, compress: bool = True, written_at: int | None = None,
          level: int | SmallTables = ZSTD_LEVEL) -> bytes:
    """Frame `data` for storage, zstd-compressing it when that saves space."""
    size = len(data)
    body, codec = data, CODEC_RAW
    if compress and size >= 64 and _worth_compressing(data):
        packed = _compressor(level).compress(data)
        if len(packed) + 8 < size:
            body, codec = packed, CODEC_ZSTD
    when = int(time.time()) if written_at is None else written_at
    return make_header(kind, codec, size, when) + body


def compress_checked(data, level: int = ZSTD_LEVEL) -> bytes:
    """One zstd frame of `data`, its content size declared and with zstd's checksum of it
    (for bytes that no id covers: a damaged frame fails to decompress, never reads wrong)."""
    cache = getattr(_LOCAL, "checked", None)
    if cache is None:
        cache = _LOCAL.checked = {}
    compressor = cache.get(level)
    if compressor is None:
        compressor = cache[level] = zstandard.ZstdCompressor(level=level, write_content_size=True,
                                                             write_checksum=True)
    return compressor.compress(data)


def make_header(kind: int, codec: int, size: int, written_at: int) -> bytes:
    """The 22-byte header of a stored value (its CRC computed here)."""
    head = _HEAD.pack(kind, codec, size, written_at)
    return head + _CRC.pack(zlib.crc32(head))


def read_header(value) -> tuple[int, int, int, int]:
    """(kind, codec, size, written_at) of a stored value; CorruptValue if damaged."""
    if len(value) < HEADER_SIZE:
        raise CorruptValue("stored value is shorter than its header")
    kind, codec, size, when, crc = HEADER.unpack_from(value)
    if zlib.crc32(bytes(value[: HEADER_SIZE - 4])) != crc:
        raise CorruptValue("stored value header fails its checksum")
    if kind not in KIND_NAMES or codec not in (CODEC_RAW, CODEC_ZSTD) or size > MAX_OBJECT_SIZE:
        raise CorruptValue("stored value header names an unknown kind or codec")
    return kind, codec, size, when


def unframe(value, copy: bool = True) -> tuple[int, bytes]:
    """(kind, bytes) of a stored value, decompressing within the declared size.

    `copy=False` returns a raw body as a view into `value` instead of a copy.
    """
    kind, codec, size, _ = read_header(value)
    body = value[HEADER_SIZE:]
    if codec == CODEC_RAW:
        if len(body) != size:
            raise CorruptValue("stored value length differs from its header")
        # A view serves wherever the body is only read (the bytes-like protocol).
        return kind, bytes(body) if copy else cast(bytes, memoryview(body))
    return kind, decompress_bounded(body, size)


def decompress_bounded(body, size: int) -> bytes:
    """Decompress one zstd frame that must expand to exactly `size` bytes."""
    try:
        declared = zstandard.frame_content_size(body) if len(body) >= 4 else -2
    except zstandard.ZstdError:
        raise CorruptValue("zstd frame header is damaged") from None
    if declared != size:
        raise CorruptValue(f"zstd frame declares {declared} bytes, expected {size}")
    try:
        # allow_extra_data=False: bytes after the frame make the value corrupt, so one
        # object has exactly one stored form and damage there is not silently ignored.
        data = _decompressor().decompress(body, max_output_size=size, allow_extra_data=False)
    except zstandard.ZstdError as exc:
        raise CorruptValue(f"zstd frame does not decompress: {exc}") from None
    if len(data) != size:
        raise CorruptValue(f"zstd frame expands to {len(data)} bytes, expected {size}")
    return data
