"""Rollout storage (agentcas/lineage/rollout.py) through the Store API.

Records, batches, whole-or-nothing appends, exact reads, what an append costs in new
objects, and how many segments a read loads.
"""

from __future__ import annotations

import json
import math
import os

import pytest

from agentcas import Store
from agentcas.cas import framing, packs
from agentcas.cas.digest import Digest
from agentcas.cas.objects import EMPTY_POSITION
from agentcas.errors import IntegrityError, UsageError
from agentcas.lineage import rollout
from agentcas.refs import threads

from support import raw_objects
from support.store_state import views


def records(count: int, start: int = 0, size: int = 0, tag: str = "m") -> list[bytes]:
    """`count` distinct JSONL records, each padded with about `size` bytes of noise."""
    out = []
    for i in range(start, start + count):
        doc = {"role": "assistant", "tag": tag, "i": i}
        if size:
            doc["text"] = os.urandom(size // 2).hex()
        out.append(json.dumps(doc).encode() + b"\n")
    return out


def state_of(store: Store, thread: str):
    """(thread state, reflog, objects) — everything an append may touch."""
    with views(store) as txn:
        return (threads.read_thread(txn, thread),
                [e.to_json() for e in threads.read_reflog(txn, thread)],
                packs.count(txn), raw_objects.values(txn))  # the embedded environment's objects


@pytest.fixture(params=["memory", "lmdb"])
def any_store(request, tmp_path):
    if request.param == "memory":
        yield Store.memory()
    else:
        store, _ = Store.init(str(tmp_path / "store"))
        yield store
        store.environment.close()


# --- records ------------------------------------------------------------------------------

@pytest.mark.parametrize("line, why", [
    (b"[1, 2]", "got list"),
    (b"42", "got int"),
    (b'"text"', "got str"),
    (b"null", "got NoneType"),
    (b"true", "got bool"),
    (b"", "not a JSON object"),
    (b"   ", "not a JSON object"),
    (b'{"a": 1', "not a JSON object"),
    (b'{"a": 1} {"b": 2}', "not a JSON object"),
    (b'{"a": NaN}', "not a JSON object"),
    (b'{"a": Infinity}', "not a JSON object"),
    (b'{"a": -Infinity}', "not a JSON object"),
    (b'{"a": "\xff\xfe"}', "not a JSON object"),
    (b'{"a": "\xed\xa0\x80"}', "not a JSON object"),  # an encoded surrogate is not UTF-8
])
def test_bad_line_is_named_by_its_1_based_number(any_store, line, why):
    any_store.history.append("t", b'{"ok": 0}\n')
    before = state_of(any_store, "t")
    batch = b'{"ok": 1}\n{"ok": 2}\n' + line + b'\n{"ok": 4}\n'
    with pytest.raises(rollout.BadRecord) as caught:
        any_store.history.append("t", batch)
    assert str(caught.value).startswith("line 3: ")
    assert why in str(caught.value)
    assert caught.value.exit_code == 1
    assert state_of(any_store, "t") == before  # whole batch refused: no record, ref, reflog, chunk


def test_bad_first_line_of_a_new_thread_creates_nothing(any_store):
    with pytest.raises(rollout.BadRecord, match="^line 1: "):
        any_store.history.append("new", b"[]\n")
    with views(any_store) as txn:
        assert threads.read_thread(txn, "new") is None
        assert packs.count(txn) == 0
        assert txn.count("leases") == 0


def test_final_line_without_newline_gets_one(any_store):
    any_store.history.append("t", b'{"a": 1}\n{"b": 2}')
    any_store.history.append("t", b'{"c": 3}')
    assert b"".join(any_store.history.read("t")) == b'{"a": 1}\n{"b": 2}\n{"c": 3}\n'


def test_records_are_stored_byte_for_byte(any_store):
    odd = [b'{ "spaced" : [1,2 ,3] }\n', '{"ü": "naïve ✓"}\n'.encode(), b'{"a":1,"a":2}\n',
           b'{"big": 123456789012345678901234567890}\n', b'{"esc": "\\ud83d\\ude00 \\n"}\r\n',
           b'{"deep": {"x": [[[{}]]]}}\n']
    any_store.history.append("t", b"".join(odd))
    assert list(any_store.history.read("t", 0)) and b"".join(any_store.history.read("t")) == b"".join(odd)
    for i, line in enumerate(odd):
        assert b"".join(any_store.history.read("t", i, i + 1)) == line


def test_sequence_numbers_are_contiguous_across_batches(any_store):
    seen = 0
    for size in (1, 3, 1, 7, 2):
        result = any_store.history.append("t", b"".join(records(size, seen))).to_json()
        assert (result["first_seq"], result["appended"], result["history"]["seq"]) == (seen, size, seen + size)
        seen += size
    lines = b"".join(any_store.history.read("t")).splitlines()
    assert [json.loads(line)["i"] for line in lines] == list(range(seen))


def test_append_to_a_new_thread_creates_it(any_store):
    result = any_store.history.append("agents/new", b'{"hello": 1}\n').to_json()
    assert result["first_seq"] == 0
    state = any_store.threads.get("agents/new")
    assert state.checkpoint is None and state.history.seq == 1


def test_empty_append_changes_nothing(any_store):
    any_store.history.append("t", b'{"a": 1}\n')
    before = state_of(any_store, "t")
    result = any_store.history.append("t", b"").to_json()
    assert result["appended"] == 0 and result["first_seq"] == 1
    assert state_of(any_store, "t") == before


def test_bad_thread_name_is_a_usage_error(any_store):
    with pytest.raises(UsageError):
        any_store.history.append("main@{1}", b'{"a": 1}\n')


# --- reads --------------------------------------------------------------------------------

def test_read_ranges_are_exact(any_store):
    lines = records(40, size=100)
    for i in range(0, 40, 8):
        any_store.history.append("t", b"".join(lines[i:i + 8]))
    for start, stop in [(0, 40), (0, 1), (39, 40), (7, 9), (8, 16), (5, 5), (40, 40), (12, None), (30, 1000)]:
        want = b"".join(lines[start: 40 if stop is None else stop])
        assert b"".join(any_store.history.read("t", start, stop)) == want


@pytest.mark.parametrize("start, stop, message", [
    (-1, None, "must not be negative"),
    (0, -3, "must not be negative"),
    (11, None, "beyond the end of the history (10 records)"),
    (6, 5, "before --from"),
])
def test_bad_ranges_raise_before_any_byte(any_store, start, stop, message):
    any_store.history.append("t", b"".join(records(10)))
    with pytest.raises(UsageError) as caught:
        any_store.history.read("t", start, stop)  # raises on the call, not on iteration
    assert message in str(caught.value)


def test_a_stop_past_the_end_raises_unless_clamped(any_store):
    """`rollout cat --to` past the end is refused, as `fork --at` and `replay --at` are."""
    any_store.history.append("t", b"".join(records(10)))
    with pytest.raises(UsageError, match=r"--to 11 is beyond the end of the history \(10 records\)"):
        any_store.history.read("t", 0, 11, clamp=False)
    assert b"".join(any_store.history.read("t", 0, 10, clamp=False)) == b"".join(records(10))


def test_reading_an_unknown_thread_is_not_found(any_store):
    with pytest.raises(Exception) as caught:
        list(any_store.history.read("nobody"))
    assert caught.value.exit_code == 1 and "nobody" in str(caught.value)


def test_big_batches_span_segments_and_read_back(any_store):
    lines = records(12, size=300_000)  # ~3.6 MB: several 1 MiB segments in one append
    any_store.history.append("t", b"".join(lines))
    head = any_store.threads.get("t").history
    with any_store.source.reading() as txn:
        history = rollout.History(txn)
        count, position = 0, head
        while position.segment is not None:
            segment = history.segment(position.segment)
            assert segment.length <= rollout.MAX_SEGMENT_BYTES
            count += 1
            position = segment.base
        assert count >= 3
        assert history.verify(head) == 12
    assert b"".join(any_store.history.read("t", 3, 9)) == b"".join(lines[3:9])


def test_a_record_larger_than_a_segment_gets_its_own(any_store):
    big = json.dumps({"blob": os.urandom(1_500_000).hex()}).encode() + b"\n"
    batch = b'{"a": 1}\n' + big + b'{"b": 2}\n'
    any_store.history.append("t", batch)
    assert b"".join(any_store.history.read("t", 1, 2)) == big
    assert b"".join(any_store.history.read("t")) == batch


def test_corrupt_chunk_is_named_on_read():
    store = Store.memory()
    lines = records(5, size=20000)  # over rollout.INLINE_BYTES: stored as chunks
    store.history.append("t", b"".join(lines))
    head = store.threads.get("t").history
    with store.source.reading() as txn:
        chunk = rollout.History(txn).segment(head.segment).chunks[0].id
    store.environment.write(lambda txn: raw_objects.edit(txn, chunk.raw, flip_byte(-5)))
    with pytest.raises(IntegrityError) as caught:
        list(store.history.read("t"))
    assert chunk.hex() in str(caught.value) and caught.value.exit_code == 4


def flip_byte(at: int):
    def edit(value: bytearray):
        value[at] ^= 0x01
        return value
    return edit


def test_missing_chunk_is_named_on_read():
    store = Store.memory()
    store.history.append("t", b"".join(records(5, size=20000)))
    head = store.threads.get("t").history
    with store.source.reading() as txn:
        chunk = rollout.History(txn).segment(head.segment).chunks[0].id
    store.environment.write(lambda txn: raw_objects.edit(txn, chunk.raw, lambda value: None))
    with pytest.raises(rollout.MissingHistory) as caught:
        list(store.history.read("t"))
    assert chunk.hex() in str(caught.value) and caught.value.exit_code == 4


def test_small_append_is_one_segment_with_its_records_inline():
    store = Store.memory()
    before = store.environment.used_bytes()
    data = b"".join(records(3, size=100))
    store.history.append("t", data)
    head = store.threads.get("t").history
    with store.source.reading() as objects:
        segment = rollout.History(objects).segment(head.segment)
    with views(store) as txn:
        kinds = raw_objects.keys(txn)
    assert segment.inline == data and segment.chunks == () and len(kinds) == 1
    assert b"".join(store.history.read("t")) == data
    assert b"".join(store.history.read("t", 1, 2)) == data.split(b"\n", 2)[1] + b"\n"
    assert store.environment.used_bytes() > before
    big = b"".join(records(5, size=20000, start=3))
    store.history.append("t", big)
    with store.source.reading() as objects:
        segment = rollout.History(objects).segment(store.threads.get("t").history.segment)
    assert segment.inline == b"" and segment.chunks
    assert b"".join(store.history.read("t")) == data + big


def test_corrupt_inline_segment_is_an_integrity_error():
    store = Store.memory()
    store.history.append("t", b"".join(records(3)))
    head = store.threads.get("t").history
    store.environment.write(lambda txn: raw_objects.edit(txn, head.segment.raw, flip_byte(-3)))
    with pytest.raises(IntegrityError) as caught:
        list(store.history.read("t"))
    assert head.segment.hex() in str(caught.value) and caught.value.exit_code == 4


def test_verify_rejects_a_position_that_lies():
    store = Store.memory()
    store.history.append("t", b"".join(records(5)))
    head = store.threads.get("t").history
    forged = type(head)(head.segment, head.seq, head.offset, Digest(bytes(range(32))))
    with store.source.reading() as txn:
        with pytest.raises(IntegrityError, match="does not match its position"):
            rollout.History(txn).verify(forged)


# --- costs --------------------------------------------------------------------------------

def objects_table(store: Store) -> dict:
    with views(store) as txn:
        return {k: len(v) for k, v in raw_objects.values(txn).items()}


def test_an_append_costs_storage_proportional_to_its_size(tmp_path):
    store, _ = Store.init(str(tmp_path / "store"))
    try:
        for _ in range(5):  # ~5 MB of history in 1 MB appends
            store.history.append("t", b"".join(records(10, size=100_000)))
        assert store.threads.get("t").history.offset > 4_900_000
        before = objects_table(store)
        store.history.append("t", b"".join(records(1, size=1000)))  # ~1 KiB
        after = objects_table(store)
        new = {k: size for k, size in after.items() if k not in before}
        assert set(before) <= set(after)
        assert len(new) <= 3  # a chunk and a segment
        assert sum(new.values()) < 16 * 1024
        # And a later 1 KiB append costs the same, whatever the length: no re-hash, no copy.
        store.history.append("t", b"".join(records(20, size=100_000)))
        before = objects_table(store)
        store.history.append("t", b"".join(records(1, size=1000)))
        new_again = {k: s for k, s in objects_table(store).items() if k not in before}
        assert len(new_again) == len(new)
    finally:
        store.environment.close()


class SegmentLoads:
    """Counts segment objects loaded from the store (History caches within one instance)."""

    def __init__(self, monkeypatch):
        self.count = 0
        original = rollout.load_object

        def counting(txn, digest, kind=None):
            if kind == framing.KIND_SEGMENT:
                self.count += 1
            return original(txn, digest, kind)
        monkeypatch.setattr(rollout, "load_object", counting)


def one_record_segments(store, count: int, base=EMPTY_POSITION, tag: str = "r"):
    head, lines = base, []
    for i in range(count):
        line = json.dumps({"tag": tag, "i": i}).encode() + b"\n"
        chunks = {}
        prepared = rollout.prepare(line, lambda digest, framed: chunks.__setitem__(digest.raw, framed))
        store.source.put_many(chunks)
        head, segments = rollout.link_segments(store.source, head, prepared)
        store.source.put_many(segments)
        lines.append(line)
    return head, lines


def test_reads_load_segments_proportional_to_records_read_plus_log_n(monkeypatch):
    store = Store.memory()
    n = 1024
    head, lines = one_record_segments(store, n)
    loads = SegmentLoads(monkeypatch)
    bound = 6 * math.log2(n) + 8
    with store.source.reading() as txn:
        for start in (0, 1, 17, 500, 512, 513, 1000, n - 1):
            for width in (1, 10):
                stop = min(n, start + width)
                loads.count = 0
                got = b"".join(rollout.History(txn).read(head, start, stop))
                assert got == b"".join(lines[start:stop])
                assert loads.count <= (stop - start) + bound, (start, width, loads.count)
            loads.count = 0
            rollout.History(txn).position(head, start)
            assert loads.count <= bound
        # A whole read loads each segment once.
        loads.count = 0
        assert rollout.History(txn).verify(head) == n
        assert loads.count <= n + bound


def test_appends_load_log_n_segments(monkeypatch):
    """Linking segment n walks to its skip target in at most ceil(log2 n) + 2 segment loads,
    for every n up to 1100 (measured: at most ceil(log2 n) + 1). An off-by-one in the skip
    walk (ancestor_at_index taking `skip_at > index`) costs 40 loads at n = 1025."""
    store = Store.memory()
    loads = SegmentLoads(monkeypatch)
    head, over = EMPTY_POSITION, []
    for n in range(1100):
        loads.count = 0
        head, _ = one_record_segments(store, 1, base=head, tag=f"n{n}")
        if n >= 2 and loads.count > math.ceil(math.log2(n)) + 2:
            over.append((n, loads.count))
    assert over == []


def test_deep_fork_chains_read_right_with_cost_in_depth(monkeypatch):
    """Fork of a fork of ... (depth 40), each cut inside a segment of several records."""
    store = Store.memory()
    model = []
    thread = "d0"
    store.history.append(thread, b"".join(records(6, tag=thread)))
    model = records(6, tag=thread)
    for depth in range(1, 41):
        cut = len(model) - 2  # inside the last segment, which holds several records
        child = f"d{depth}"
        store.threads.fork(thread, child, at=cut)
        added = records(5, tag=child)
        store.history.append(child, b"".join(added))
        model = model[:cut] + added
        thread = child
    assert b"".join(store.history.read(thread)) == b"".join(model)
    head = store.threads.get(thread).history
    loads = SegmentLoads(monkeypatch)
    with store.source.reading() as txn:
        for seq in (0, 3, len(model) // 2, len(model) - 1):
            loads.count = 0
            assert b"".join(rollout.History(txn).read(head, seq, seq + 1)) == model[seq]
            assert loads.count <= 6 * math.log2(41) + 8


def test_a_store_keeps_decoded_segments_across_reads_within_a_byte_bound(tmp_path, monkeypatch):
    """Store reads share one SegmentCache: a second read of the same history decodes no
    segment again, and the cache empties itself rather than grow past MAX_BYTES."""
    store, _ = Store.init(str(tmp_path / "s"))
    for i in range(6):
        store.history.append("t", b"".join(b'{"n":%d,"pad":"%s"}\n' % (i * 10 + j, b"x" * 300) for j in range(10)))
    expected = b"".join(store.history.read("t"))
    decoded = []
    real = rollout.Segment.decode
    monkeypatch.setattr(rollout.Segment, "decode", classmethod(lambda cls, data: decoded.append(1) or real(data)))
    assert b"".join(store.history.read("t")) == expected
    assert decoded == []  # every segment came from the cache
    monkeypatch.setattr(rollout.SegmentCache, "MAX_BYTES", 8_000)  # about two of these segments
    store.history.segments = rollout.SegmentCache()
    assert b"".join(store.history.read("t")) == expected
    assert len(decoded) == 6 and store.history.segments.bytes <= 8_000 and 0 < len(store.history.segments.segments) < 6


# --- prefix chain computed ahead (harness ingest's workers) ---------------------------------

@pytest.mark.parametrize("existing", [False, True])
def test_segments_chained_ahead_link_exactly_like_segments_chained_when_linked(tmp_path, existing):
    store, _ = Store.init(str(tmp_path / "store"))
    base = EMPTY_POSITION
    if existing:
        store.history.append("t", b'{"n": 0}\n{"n": 1}\n')
        base = store.threads.get("t").history
    lines = [b'{"n": %d, "pad": "%s"}\n' % (n, b"x" * (n * 37 % 9000)) for n in range(700)]
    data = b"".join(lines)
    plain = rollout.prepare(data, lambda digest, framed: None, raw_lines=True, level=3)
    sizes = [len(plain_segment.record_hashes) for plain_segment in plain]
    assert len(plain) >= 3
    ends = [sum(sizes[:i + 1]) for i in range(len(sizes))]
    marks = sorted({1, 5, ends[0], ends[0] + 1, ends[1] - 1, 400, len(lines) - 1, len(lines)})
    packed = rollout.pack_raw_lines(data, 3, base.digest.raw, marks[:-1])
    assert all(not s.record_hashes for s in packed.segments)   # only chain values travel
    store.backends.source.put_many({digest.raw: framed for digest, framed in packed.objects})
    assert _without_write_times(rollout.link_segments_at(store.source, base, packed.segments, marks)) == \
        _without_write_times(rollout.link_segments_at(store.source, base, plain, marks))
    other = rollout.pack_raw_lines(data, 3, bytes(32) if existing else b"\x01" * 32, marks[:-1])
    with pytest.raises(UsageError, match="does not continue"):
        rollout.link_segments_at(store.source, base, other.segments, marks)
    with pytest.raises(UsageError, match="not chained ahead"):
        rollout.link_segments_at(store.source, base, packed.segments, [2])
    store.environment.close()


def _without_write_times(linked):
    """`link_segments_at`'s answer with each framed object's write time (whole seconds,
    so two calls may differ) taken out of its header."""
    head, objects, positions = linked

    def unstamped(framed: bytes):
        kind, codec, size, _written_at, _crc = framing.HEADER.unpack_from(framed)
        return kind, codec, size, framed[framing.HEADER_SIZE:]
    return head, {raw: unstamped(framed) for raw, framed in objects.items()}, positions


def _lines_of(shape: str) -> list[bytes]:
    if shape == "small":     # several segments of many records
        return [b'{"n": %d, "pad": "%s"}\n' % (n, b"x" * (n * 37 % 9000)) for n in range(700)]
    if shape == "stamped":   # lines of 32 KiB or more whose body is chunked apart from its timestamp
        return [b'{"timestamp":"2026-11-0%dT10:00:00Z","body":"%s"}\n' % (n % 9, b"y" * (n * 7919 % 90_000))
                for n in range(40)]
    if shape == "exact":     # segments of exactly MAX_SEGMENT_BYTES (a record ends right at the limit)
        return [b'{"n": "%s"}\n' % b"e".ljust(1024 - 10, b"e") for _ in range(2500)]
    # a record longer than a segment, alone in its own, between small ones
    return [b'{"n": 1}\n', b'{"big": "%s"}\n' % (b"z" * (rollout.MAX_SEGMENT_BYTES + 5)), b'{"n": 2}\n',
            b"not json\n", b'{"n": 3}\n']


@pytest.mark.parametrize("shape", ["small", "exact", "stamped", "huge"])
@pytest.mark.parametrize("threads", [1, 2])
def test_pack_raw_lines_chains_as_chain_ahead_of_prepare(shape, threads):
    """pack_raw_lines chains while it packs (no record hashes kept): the same segments, chain
    values and chunk objects as `prepare` then `chain_ahead`, with the line ends given or not."""
    lines = _lines_of(shape)
    data, count = b"".join(lines), len(lines)
    marks = sorted({1, 2, count // 3, count // 2, count - 1, count} - {0})
    chain_from = b"\x07" * 32
    objects = []
    plain = rollout.chain_ahead(rollout.prepare(data, lambda d, framed: objects.append((d, framed)), raw_lines=True,
                                                level=3), chain_from, marks)
    for ends in (None, rollout.line_ends(data)):
        packed = rollout.pack_raw_lines(data, 3, chain_from, marks, ends=ends, threads=threads)
        assert packed.segments == plain
        assert [(d, framing.unframe(v)) for d, v in packed.objects] == [(d, framing.unframe(v)) for d, v in objects]
    assert len(plain) > 1 and (shape != "stamped" or len(objects) > len(plain))


def test_raw_lines_cut_only_long_bodies_into_content_defined_chunks():
    """Ingest's chunking (rollout._stamp_regions): a segment's short lines are one chunk (no
    harness repeats a run of them byte for byte), a long timestamped line's body is cut by
    content so a fork's copy (new timestamp) shares its chunks, and a region over
    ROLLOUT_MAX_SIZE without a timestamp is still cut."""
    import random

    from agentcas.cas import chunking
    rng = random.Random(4)
    short = b"".join(b'{"n": %d, "text": "%s"}\n' % (n, rng.randbytes(400).hex().encode()) for n in range(1000))
    assert 512 * 1024 < len(short) <= rollout.MAX_SEGMENT_BYTES
    packed = rollout.pack_raw_lines(short, 3, b"\x07" * 32, [])
    assert len(packed.segments) == 1 and len(packed.objects) == 1

    body = random.Random(5).randbytes(3 * 1024 * 1024).hex().encode()

    def stamped(day: int) -> bytes:
        return b'{"timestamp":"2026-11-0%dT10:00:00Z","body":"%s"}\n' % (day, body)
    first = rollout.pack_raw_lines(stamped(1), 3, b"\x07" * 32, [])
    copy = rollout.pack_raw_lines(stamped(2), 3, b"\x07" * 32, [])
    cut = {d for d, _ in first.objects} & {d for d, _ in copy.objects}
    assert len(first.objects) > 3 and len(cut) >= len(first.objects) - 3   # all but the chunks at the stamp

    plain = b'{"body":"%s"}\n' % body
    assert len(rollout.pack_raw_lines(plain, 3, b"\x07" * 32, []).objects) >= len(plain) // chunking.ROLLOUT_MAX_SIZE


@pytest.mark.parametrize("lie", ["digest", "seq"])
def test_history_verify_refuses_a_head_position_that_lies_about_its_prefix(store, lie):
    """History.verify re-reads the whole history at a head and recomputes its prefix digest
    and record count: a position whose digest or count is not its bytes' is refused (the
    bundle import's re-check of the head, guarded here on its own)."""
    import dataclasses

    from agentcas.errors import IntegrityError
    from agentcas.lineage.rollout import History
    records = b"".join(json.dumps({"n": n}).encode() + b"\n" for n in range(50))
    store.history.append("main", records)
    head = store.threads.get("main").history
    lying = (dataclasses.replace(head, digest=bytes(32)) if lie == "digest"
             else dataclasses.replace(head, seq=head.seq + 1))
    with store.source.reading() as txn:
        assert History(txn).verify(head) == 50
        with pytest.raises(IntegrityError, match="does not match its position"):
            History(txn).verify(lying)
