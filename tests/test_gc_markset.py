"""gc in bounded memory: the mark set and candidate spool (gc/markset.py), and whole gcs with
a memory budget so small that both spill to disk, on LMDB and on the shared store."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentcas import Store
from agentcas.gc import markset
from agentcas.gc.markset import KeySpool, MarkSet

from support.cli import run_cli
from support.gc_stores import all_keys, closure_of_threads, later, records, write_files

TINY = 4096  # bytes: the in-memory table is moved to disk every ~48 ids (64 slots, 3/4 full)

ids = st.one_of(st.binary(min_size=32, max_size=32), st.just(bytes(32)), st.just(b"\xff" * 32))


@settings(max_examples=60, deadline=None)
@given(pool=st.lists(ids, min_size=60, max_size=400, unique=True),
       ops=st.lists(st.tuples(st.booleans(), st.integers(min_value=0)), min_size=100, max_size=1500),
       budget=st.sampled_from([TINY, 12_000, 1 << 20]))
def test_markset_membership_equals_a_python_set_across_spills(pool, ops, budget):
    marks, model = MarkSet(budget), set()
    try:
        for add, index in ops:
            raw = pool[index % len(pool)]
            if add:
                marks.add(raw)
                model.add(raw)
            assert (raw in marks) == (raw in model)
        assert len(marks) == len(model)
        assert all(raw in marks for raw in model)
        assert not any(raw in marks for raw in pool if raw not in model)
    finally:
        marks.close()


def test_markset_spills_past_its_budget_and_finds_every_id_in_both_tables():
    marks = MarkSet(TINY)
    added = [os.urandom(32) for _ in range(5000)]
    absent = [os.urandom(32) for _ in range(5000)]
    for raw in added:
        assert raw not in marks
        marks.add(raw)
        marks.add(raw)  # twice: still one id
    assert marks.spilled and marks.spills > 50
    assert len(marks) == 5000
    assert all(raw in marks for raw in added)
    assert all(bytearray(raw) in marks for raw in added[:100])  # any bytes-like id
    assert not any(raw in marks for raw in absent)
    directory = marks._dir
    assert os.path.isdir(directory)
    marks.close()
    assert not os.path.exists(directory)  # the on-disk table goes with the set
    with pytest.raises(ValueError):
        marks.add(b"short")


def test_a_spilled_markset_reads_its_on_disk_table_for_few_absent_ids():
    marks = MarkSet(TINY)
    added = [os.urandom(32) for _ in range(5000)]
    for raw in added:
        marks.add(raw)
    assert marks.spilled
    before = marks.disk_lookups
    assert not any(os.urandom(32) in marks for _ in range(5000))
    assert marks.disk_lookups - before < 100  # its Bloom filter answers the rest
    assert all(raw in marks for raw in added)
    marks.close()


def test_markset_grows_in_memory_under_its_budget():
    marks = MarkSet(1 << 20)
    added = [os.urandom(32) for _ in range(10_000)]
    for raw in added:
        marks.add(raw)
    assert not marks.spilled and all(raw in marks for raw in added)
    assert len(marks._table) <= (1 << 20)
    assert len(marks._table) / len(marks) < 80  # bytes an id, all in one bytearray


@settings(max_examples=30, deadline=None)
@given(pairs=st.lists(st.tuples(st.binary(min_size=32, max_size=32), st.integers(0, 2**64 - 1)), max_size=300),
       buffer=st.sampled_from([40, 400, 1 << 20]), size=st.integers(1, 50))
def test_keyspool_gives_back_every_pair_in_order_across_its_file(pairs, buffer, size):
    spool = KeySpool(buffer)
    for raw, number in pairs:
        spool.append(raw, number)
    assert len(spool) == len(pairs)
    got = []
    for _ in range(2):  # readable more than once (a sweep may retry a level)
        got = []
        for keys, numbers in spool.batches(size):
            assert 0 < len(numbers) <= size and len(keys) == 32 * len(numbers)
            got += [(keys[i * 32:(i + 1) * 32], n) for i, n in enumerate(numbers)]
        assert got == pairs
    spool.close()


def test_keyspool_keeps_a_fixed_part_in_memory_whatever_the_budget(monkeypatch):
    """SPOOL_BUFFER bounds a spool's memory even under the default 32 MiB budget (an eighth of
    it, 4 MiB, kept the candidates of ~100,000 objects in memory: gc grew with the store)."""
    monkeypatch.setattr(markset, "MEMORY_BUDGET", 32 << 20)
    spool = KeySpool()
    pairs = [(os.urandom(32), n) for n in range(20_000)]  # 800,000 bytes packed
    held = 0
    for raw, number in pairs:
        spool.append(raw, number)
        held = max(held, len(spool._keys) + 8 * len(spool._numbers))
    assert held <= markset.SPOOL_BUFFER < 20_000 * 40 and spool._file is not None
    got = [(keys[i * 32:(i + 1) * 32], n) for keys, numbers in spool.batches(3000) for i, n in enumerate(numbers)]
    assert got == pairs
    spool.close()


def _many_objects(store: Store, root) -> None:
    """Threads of small files (hundreds of objects), forks, rollouts, and deleted threads."""
    for t in range(6):
        files = {f"d{i % 7}/f{t}-{i}.txt": os.urandom(50 + i) for i in range(60)}
        files["shared.txt"] = b"shared by all threads"
        store.checkpoints.commit(write_files(root / f"ws{t}", files), f"t{t}", thread=f"t{t}")
        store.history.append(f"t{t}", records(40, f"t{t}"))
    store.threads.fork("t1", "fork-of-t1", at=20)
    store.history.append("fork-of-t1", records(5, "own"))
    for name in ("t1", "t3", "t4"):
        store.threads.delete(name)


def _gc_with_budget(store: Store, monkeypatch) -> tuple[dict, int]:
    monkeypatch.setattr(markset, "MEMORY_BUDGET", TINY)
    plan = store.gc.plan(grace=0, expire_reflog=0, now=later())
    try:
        spills = plan.marked.spills
        assert all(len(spool) < 200 or spool._file is not None for spool in plan.candidates)
        result = store.gc.execute(plan).to_json()
    finally:
        plan.close()
    return result, spills


def test_gc_with_a_tiny_memory_budget_deletes_exactly_the_garbage_on_lmdb(tmp_path, monkeypatch):
    store, _ = Store.init(str(tmp_path / "store"))
    _many_objects(store, tmp_path)
    live = closure_of_threads(store)
    before = all_keys(store)
    assert len(live) > 200 and len(before - live) > 100
    result, spills = _gc_with_budget(store, monkeypatch)
    assert spills > 0  # the marks did go to disk
    assert all_keys(store) == live
    assert result["deleted"]["objects"] == len(before - live) and result["complete"]
    assert store.gc.fsck().to_json()["ok"]
    assert b"".join(store.history.read("fork-of-t1")).count(b"\n") == 25


def _shared_keys(store: Store) -> set[bytes]:
    return {bytes(info.key) for info in store.backends.blobs.list()}


def test_gc_with_a_tiny_memory_budget_deletes_exactly_the_garbage_on_the_shared_store(
        tmp_path, s3_url, postgres_url, monkeypatch):
    monkeypatch.setenv("AGENTCAS_CACHE_DIR", str(tmp_path / "cache"))
    store, _ = Store.init(s3_url, refs=postgres_url)
    _many_objects(store, tmp_path)
    live = closure_of_threads(store)
    before = _shared_keys(store)
    assert len(live) > 200 and len(before - live) > 100
    result, spills = _gc_with_budget(store, monkeypatch)
    assert spills > 0
    assert _shared_keys(store) == live
    assert result["deleted"]["objects"] == len(before - live) and result["complete"]
    assert store.gc.fsck().to_json()["ok"]


def test_the_cli_reads_its_gc_memory_budget_from_the_environment(tmp_path):
    store, _ = Store.init(str(tmp_path / "store"))
    _many_objects(store, tmp_path)
    live = closure_of_threads(store)
    store.close()
    out = run_cli("--json", "gc", "--grace", "0s", "--expire-reflog", "now", store=tmp_path / "store",
                  env={"AGENTCAS_GC_MEMORY": str(TINY), "TMPDIR": str(tmp_path)})
    assert out.code == 0, out
    assert all_keys(Store.open(str(tmp_path / "store"))) == live
    assert not [p for p in os.listdir(tmp_path) if p.startswith("agentcas-gc-")]  # temporary files removed


def test_scratch_tables_of_killed_gcs_are_removed_by_the_next(tmp_path, monkeypatch):
    import subprocess
    import sys
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    orphan = tmp_path / f"agentcas-gc-marks-{gone}-k1ll3d_x"
    running = tmp_path / f"agentcas-gc-marks-{os.getpid()}-st1lll1v"
    unrelated = tmp_path / "agentcas-gc-notes"
    for directory in (orphan, running, unrelated):
        directory.mkdir()
        (directory / "data.mdb").write_bytes(b"x" * 100)
    marks = MarkSet(budget=4096)
    for i in range(1, 400):  # past the budget: the spill makes a scratch table
        marks.add(i.to_bytes(32, "big"))
    assert marks.spilled
    assert not orphan.exists() and running.exists() and unrelated.exists()
    sizes = markset.KeySizes()
    sizes.update([(bytes(32), 7)])
    assert sizes.get(bytes(32)) == 7 and sizes.get(b"\1" * 32, -1) == -1
    scratch = [p for p in tmp_path.iterdir() if p.name.startswith(f"agentcas-gc-sizes-{os.getpid()}-")]
    sizes.close()
    marks.close()
    assert len(scratch) == 1 and not scratch[0].exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([running.name, unrelated.name])
