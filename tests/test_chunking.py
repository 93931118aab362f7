"""Content-defined chunking: chunks concatenate to the input; edits move only nearby cuts."""

import io
import random

from hypothesis import example, given, settings
from hypothesis import strategies as st

from agentcas.cas.chunking import MAX_SIZE, MIN_SIZE, cut, cut_stream


def noise(seed: int, size: int) -> bytes:
    return random.Random(seed).randbytes(size)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32), st.integers(0, 1_500_000))
@example(0, 0)
@example(1, 1)
@example(2, MIN_SIZE)
@example(3, MAX_SIZE + 1)
def test_chunks_concatenate_to_the_input(seed, size):
    data = noise(seed, size)
    chunks = [bytes(c) for c in cut(data)]
    assert b"".join(chunks) == data
    assert all(0 < len(c) <= MAX_SIZE for c in chunks)
    assert all(len(c) >= MIN_SIZE for c in chunks[:-1])
    assert [bytes(c) for c in cut_stream(io.BytesIO(data))] == chunks


def test_zero_bytes_and_repetitive_data():
    assert list(cut(b"")) == []
    data = b"\0" * 1_000_000
    chunks = [bytes(c) for c in cut(data)]
    assert b"".join(chunks) == data and max(map(len, chunks)) <= MAX_SIZE


@settings(max_examples=15, deadline=None, derandomize=True)
@given(st.integers(0, 2**32), st.integers(0, 2_000_000 - 4096), st.binary(min_size=1, max_size=4096),
       st.sampled_from(["replace", "insert", "delete"]))
@example(7, 1_000_000, b"edit", "insert")
def test_an_edit_changes_only_nearby_chunks(seed, where, patch, how):
    data = noise(seed, 2_000_000)
    if how == "replace":
        edited = data[:where] + patch + data[where + len(patch):]
    elif how == "insert":
        edited = data[:where] + patch + data[where:]
    else:
        edited = data[:where] + data[where + len(patch):]
    before = [bytes(c) for c in cut(data)]
    after = [bytes(c) for c in cut(edited)]
    assert b"".join(after) == edited
    # Chunks wholly before the edit are untouched; after it, cuts resynchronise quickly.
    offset, untouched = 0, 0
    for chunk in before:
        if offset + len(chunk) > where:
            break
        offset += len(chunk)
        untouched += 1
    assert after[:untouched] == before[:untouched]
    old = set(before)
    offsets, offset = [], 0
    for chunk in after:
        if chunk not in old:
            offsets.append((offset, offset + len(chunk)))
        offset += len(chunk)
    # The new chunks sit in one window around the edit (cuts resynchronise after it).
    assert 1 <= len(offsets) <= 6, f"{len(offsets)} new chunks for one edit of {len(patch)} bytes"
    assert offsets[0][0] <= where and offsets[-1][1] >= min(where + 1, len(edited))
    assert offsets[-1][1] - offsets[0][0] <= len(patch) + 4 * MAX_SIZE


def test_cuts_do_not_depend_on_buffer_type():
    data = noise(11, 500_000)
    assert [bytes(c) for c in cut(memoryview(data))] == [bytes(c) for c in cut(bytearray(data))]
