"""gc through the Python API, over the memory and the LMDB store: plan, sweep, roots, lineage."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from agentcas import Store
from agentcas.cas import encoding, framing, packs
from agentcas.cas.digest import Digest, hash_blob, hash_object
from agentcas.cas.leases import Lease, LeaseRow, this_host
from agentcas.cas.objects import Tree, TreeEntry
from agentcas.cas.sealed import seal
from agentcas.cas.store import save_object
from agentcas.errors import UsageError
from agentcas.gc.plan import parse_duration, plan_gc
from agentcas.gc.roots import GcAborted
from agentcas.gc.sweep import execute
from agentcas.lineage import rollout

from support import raw_objects
from support.gc_stores import all_keys, closure_of_threads, later, records, write_files
from support.store_state import views


@pytest.fixture(params=["memory", "lmdb"])
def any_store(request, tmp_path) -> Store:
    if request.param == "memory":
        return Store.memory()
    store, _ = Store.init(str(tmp_path / "store"))
    return store






def stored_bytes(store: Store) -> int:
    with views(store) as txn:
        return raw_objects.stored_bytes(txn)






def test_parse_duration():
    assert [parse_duration(t) for t in ("0s", "90s", "15m", "1h", "7d", "2w", "45")] == \
        [0, 90, 900, 3600, 7 * 86400, 14 * 86400, 45]
    assert parse_duration("now", allow_now=True) == 0
    for bad in ("", "1y", "-1s", "1.5h", "now", "h", "\u0665s", "\uff15m"):   # Arabic-Indic, fullwidth digits
        with pytest.raises(UsageError):
            parse_duration(bad)


def test_gc_frees_a_deleted_thread_and_keeps_the_rest(any_store, tmp_path):
    store = any_store
    ws = write_files(tmp_path / "ws", {"keep.bin": os.urandom(200_000), "notes.md": b"hello\n"})
    kept = store.checkpoints.commit(ws, "kept").to_json()["checkpoint"]
    ws2 = write_files(tmp_path / "ws2", {"big.bin": os.urandom(400_000), "notes.md": b"hello\n"})
    store.checkpoints.commit(ws2, "doomed", thread="side")
    store.history.append("side", records(50, "side"))
    live_before = closure_of_threads(store)
    store.threads.delete("side")
    live = closure_of_threads(store)
    assert live < live_before

    doc = store.gc.run(grace=0, expire_reflog=0, now=later()).to_json()
    assert doc["result"]["complete"]
    assert doc["plan"]["reclaimable"]["objects"] == len(live_before - live)
    assert doc["result"]["deleted"]["objects"] == len(live_before - live)
    assert doc["result"]["deleted"]["bytes"] >= 400_000
    assert all_keys(store) == live
    assert store.gc.fsck().to_json()["ok"]
    out = tmp_path / "out"
    store.checkpoints.checkout(kept, str(out))
    assert (out / "notes.md").read_bytes() == b"hello\n"
    again = store.gc.run(grace=0, expire_reflog=0, now=later()).to_json()
    assert again["plan"]["reclaimable"]["objects"] == 0


def test_dry_run_deletes_nothing(any_store, tmp_path):
    store = any_store
    store.checkpoints.commit(write_files(tmp_path / "ws", {"a": os.urandom(100_000)}), "x", thread="t")
    store.threads.delete("t")
    before = all_keys(store)
    doc = store.gc.run(grace=0, expire_reflog=0, dry_run=True, now=later()).to_json()
    assert doc["result"] is None
    assert doc["plan"]["reclaimable"]["objects"] == len(before) > 0
    assert all_keys(store) == before


def test_grace_holds_recent_objects(any_store, tmp_path):
    store = any_store
    store.checkpoints.commit(write_files(tmp_path / "ws", {"a": os.urandom(100_000)}), "x", thread="t")
    store.threads.delete("t")
    before = all_keys(store)
    doc = store.gc.run(grace=3600, expire_reflog=0).to_json()
    held = doc["plan"]["held_by_grace"]
    assert held["objects"] == len(before) and held["bytes"] > 100_000
    assert 3590 <= doc["plan"]["held_by_grace"]["releases_by_seconds"] <= 3602
    assert doc["result"]["deleted"]["objects"] == 0
    assert all_keys(store) == before


def test_recent_object_keeps_what_it_refers_to(any_store):
    """A fresh tree (of a write without a pin) keeps the old chunk it names."""
    store = any_store
    old = int(time.time()) - 7200
    chunk = os.urandom(5000)
    chunk_id = hash_blob(chunk)
    tree = Tree.of([TreeEntry("f", "file", chunk_id, size=len(chunk))])
    orphan = os.urandom(3000)

    def put(txn):
        save_object(txn, chunk_id, framing.frame(framing.KIND_CHUNK, chunk, written_at=old))
        save_object(txn, hash_blob(orphan), framing.frame(framing.KIND_CHUNK, orphan, written_at=old))
        save_object(txn, tree.digest(), framing.frame(framing.KIND_TREE, tree.encode()))
    store.environment.write(put)
    doc = store.gc.run(grace=600, expire_reflog=0).to_json()
    assert doc["plan"]["roots"]["recent"] == 1
    assert doc["result"]["deleted"]["objects"] == 1
    assert all_keys(store) == {chunk_id.raw, tree.digest().raw}


def test_reflog_keeps_reverted_head_until_it_expires(any_store, tmp_path):
    store = any_store
    ws = tmp_path / "ws"
    first = store.checkpoints.commit(write_files(ws, {"a": os.urandom(50_000)}), "one").to_json()["checkpoint"]
    second = store.checkpoints.commit(write_files(ws, {"a": os.urandom(60_000)}), "two").to_json()["checkpoint"]
    store.threads.revert("main", first)
    store.gc.run(grace=0, expire_reflog=3600, now=later())
    assert store.resolve("main@{1}") == Digest.parse(second)
    out = tmp_path / "out"
    store.checkpoints.checkout("main@{1}", str(out))  # still whole

    doc = store.gc.run(grace=0, expire_reflog=0, now=later()).to_json()
    assert doc["result"]["reflog_expired"] == 2
    assert len(store.threads.reflog("main")) == 1  # the newest entry is never expired ...
    assert Digest.parse(second).raw in all_keys(store)  # ... and keeps the checkpoint it left
    explained = store.gc.explain(second, grace=0, expire_reflog=0).to_json()
    assert explained["root"]["kind"] == "reflog" and explained["root"]["name"] == "main@{0}"

    third = store.checkpoints.commit(write_files(ws, {"a": os.urandom(70_000)}), "three").to_json()["checkpoint"]
    store.gc.run(grace=0, expire_reflog=0, now=later())
    assert Digest.parse(second).raw not in all_keys(store)
    assert Digest.parse(first).raw in all_keys(store)
    assert store.gc.fsck().to_json()["ok"]
    assert store.resolve("main") == Digest.parse(third)


def test_every_threads_newest_reflog_entry_is_a_root_not_only_the_last_threads(any_store, tmp_path):
    """Roots (gc/roots.py reflog_roots): the reflog is scanned thread by thread in key order,
    and each thread's newest entry keeps the checkpoint it left, for the first thread as
    for the last: a revert of `alpha` is undoable after gc --expire-reflog now."""
    store = any_store
    ws = tmp_path / "ws"
    first = store.checkpoints.commit(write_files(ws, {"a": os.urandom(50_000)}), "one", thread="alpha").to_json()
    second = store.checkpoints.commit(write_files(ws, {"a": os.urandom(60_000)}), "two", thread="alpha").to_json()
    store.checkpoints.commit(write_files(ws, {"b": b"beta's\n"}), "beta's", thread="beta")
    store.threads.revert("alpha", first["checkpoint"])
    store.gc.run(grace=0, expire_reflog=0, now=later())
    out = tmp_path / "out"
    store.checkpoints.checkout(second["checkpoint"], str(out))  # the checkpoint the revert left
    assert (out / "a").stat().st_size == 60_000
    assert store.gc.fsck().to_json()["ok"]


def _segments(store: Store, head) -> list[Digest]:
    with views(store) as txn:
        history = rollout.History(txn)
        out, current = [], head.segment
        while current is not None:
            out.append(current)
            current = history.segment(current).base.segment
    return out


def test_deleted_parent_keeps_exactly_the_prefix_its_forks_share(any_store, tmp_path):
    store = any_store
    for batch in range(3):  # ~1.5 MB each: two segments per append
        store.history.append("parent", records(4500, f"b{batch}"))
    parent = store.threads.get("parent")
    parent_segments = _segments(store, parent.history)
    assert len(parent_segments) >= 5
    store.checkpoints.commit(write_files(tmp_path / "ws", {"early": os.urandom(80_000)}), "early", thread="parent")
    at = parent.history.seq // 2
    store.threads.fork("parent", "fork1", at=at)
    store.threads.fork("fork1", "fork2", at=at // 3)
    store.history.append("fork1", records(10, "own"))
    store.checkpoints.commit(write_files(tmp_path / "ws2", {"late": os.urandom(90_000)}), "late", thread="parent")

    fork1_chain = _segments(store, store.threads.get("fork1").history)
    fork2_chain = _segments(store, store.threads.get("fork2").history)
    shared = [s for s in parent_segments if s in fork1_chain]
    freed_segments = [s for s in parent_segments if s not in fork1_chain]
    assert shared and freed_segments  # the cut is strictly inside the parent's history
    late_file = [item.to_json() for item in store.checkpoints.files("parent")]
    store.threads.delete("parent")
    before = stored_bytes(store)
    expected_live = closure_of_threads(store)

    doc = store.gc.run(grace=0, expire_reflog=0, now=later()).to_json()
    keys = all_keys(store)
    assert keys == expected_live
    assert all(s.raw in keys for s in shared)                # the prefix chain, cut segment whole
    assert not any(s.raw in keys for s in freed_segments)     # the parent's later segments go
    assert not any(bytes.fromhex(f["id"]) in keys for f in late_file if f["path"] == "late")
    assert doc["result"]["deleted"]["bytes"] == before - stored_bytes(store)
    assert doc["result"]["deleted"]["bytes"] > 700_000       # later segments' records + files
    assert store.gc.fsck().to_json()["ok"]
    data = b"".join(store.history.read("fork1"))
    assert data.count(b"\n") == at + 10

    # fork of a fork: deleting fork1 leaves exactly fork2's shorter prefix
    store.threads.delete("fork1")
    store.gc.run(grace=0, expire_reflog=0, now=later())
    keys = all_keys(store)
    assert keys == closure_of_threads(store)
    assert all(s.raw in keys for s in fork2_chain)
    assert not any(s.raw in keys for s in set(fork1_chain) - set(fork2_chain))
    assert b"".join(store.history.read("fork2")).count(b"\n") == at // 3
    assert store.gc.fsck().to_json()["ok"]


def test_missing_referenced_object_aborts_and_deletes_nothing(any_store, tmp_path):
    store = any_store
    store.checkpoints.commit(write_files(tmp_path / "ws", {"a": os.urandom(10_000)}), "x")  # one chunk
    store.checkpoints.commit(write_files(tmp_path / "ws2", {"b": os.urandom(50_000)}), "garbage", thread="g")
    store.threads.delete("g")
    chunk = bytes.fromhex([item.to_json() for item in store.checkpoints.files("main")][0]["id"])
    assert store.environment.write(lambda txn: packs.delete(txn, chunk))
    before = all_keys(store)
    with pytest.raises(GcAborted) as info:
        store.gc.run(grace=0, expire_reflog=0, now=later())
    assert info.value.exit_code == 4
    assert chunk.hex() in str(info.value) and "thread main" in str(info.value)
    assert all_keys(store) == before


def test_live_pin_stops_the_sweep_and_dead_pin_is_dropped(any_store, tmp_path):
    store = any_store
    store.checkpoints.commit(write_files(tmp_path / "ws", {"a": os.urandom(50_000)}), "x", thread="t")
    store.threads.delete("t")
    before = all_keys(store)
    with Lease(store.meta, "test write"):
        result = store.gc.run(grace=0, expire_reflog=0, wait=0.2, now=later()).to_json()["result"]
    assert not result["complete"] and result["blocked_by"][0]["what"] == "test write"
    assert all_keys(store) == before

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    key = b"0123456789abcdef"
    row = LeaseRow(key, "crashed commit", this_host(), int(dead), time.time(), time.time() + 600)
    store.meta.write(lambda txn: txn.put("leases", key, row.encode()))
    result = store.gc.run(grace=0, expire_reflog=0, wait=0.2, now=later()).to_json()["result"]
    assert result["complete"] and result["pins_dropped"] == 1
    assert all_keys(store) == set()
    with views(store) as txn:
        assert txn.count("leases") == 0


def test_a_dead_writers_lease_is_no_write_in_progress_in_the_plan(any_store, tmp_path):
    """The plan counts only live leases as writes in progress: a lease left by a process of
    this host that is gone is neither a pin root nor a note that the sweep will wait."""
    store = any_store
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    key = b"fedcba9876543210"
    row = LeaseRow(key, "crashed commit", this_host(), int(dead), time.time(), time.time() + 600)
    store.meta.write(lambda txn: txn.put("leases", key, row.encode()))
    plan = store.gc.run(grace=0, expire_reflog=0, dry_run=True, now=later()).plan
    assert plan["roots"]["pin"] == 0
    assert not any("in progress" in note for note in plan["notes"])
    with Lease(store.meta, "live write"):
        plan = store.gc.run(grace=0, expire_reflog=0, dry_run=True, now=later()).plan
    assert plan["roots"]["pin"] == 1 and any("1 write(s) in progress" in note for note in plan["notes"])


def test_ref_moved_during_gc_is_marked_before_sweeping(any_store, tmp_path):
    """A branch created between plan and sweep onto an unreachable checkpoint keeps it whole."""
    store = any_store
    orphan = store.checkpoints.commit(write_files(tmp_path / "ws", {"a": os.urandom(120_000)}), "x", thread="t").to_json()
    store.threads.delete("t")
    plan = store.gc.plan(grace=0, expire_reflog=0, now=later())
    assert plan.reclaimable["objects"] > 0
    store.threads.create("rescued", orphan["checkpoint"][:12])
    result = execute(store.backends, plan)
    assert result["deleted"]["objects"] == 0 and result["remarked"] > 0
    assert store.gc.fsck().to_json()["ok"]
    store.checkpoints.checkout("rescued", str(tmp_path / "out"))


def test_a_signed_checkpoint_brought_back_during_gc_keeps_its_signature(any_store, tmp_path):
    """The sweep marks the signatures of checkpoints that threads reach again since the plan
    (gc/sweep.py sweep_batch): the signature object is kept with its checkpoint, not only
    its `signatures` row, so the rescued checkpoint still verifies and fsck stays clean."""
    from agentcas.signing import keys
    store = any_store
    made = keys.write_keypair("alice", str(tmp_path / "k"))
    store.trust.add("alice", made["public_key"])
    orphan = store.checkpoints.commit(write_files(tmp_path / "ws", {"a": os.urandom(20_000)}), "x",
                                      thread="t").to_json()["checkpoint"]
    store.trust.sign(orphan, made["private_key"])
    store.threads.delete("t")
    plan = store.gc.plan(grace=0, expire_reflog=0, now=later())
    assert plan.reclaimable["objects"] >= 4  # chunk, tree, checkpoint, signature
    store.threads.create("rescued", orphan[:12])
    result = execute(store.backends, plan)
    assert result["deleted"]["objects"] == 0
    assert store.gc.fsck().to_json()["ok"]
    assert store.trust.verify(orphan).signature == "valid"


def test_signatures_live_with_their_checkpoint(any_store, tmp_path):
    store = any_store
    cp = Digest.parse(store.checkpoints.commit(write_files(tmp_path / "ws", {"a": b"x" * 100}), "x", thread="t").to_json()["checkpoint"])
    body = b'{"fake": "envelope"}'
    sig = hash_object("signature", body)
    key = cp.raw + sig.raw

    def put(txn):
        save_object(txn, sig, framing.frame(framing.KIND_SIGNATURE, body))
        txn.put("signatures", key, seal("signatures", key, encoding.encode({"key_id": "k"})))
    store.environment.write(put)
    doc = store.gc.run(grace=0, expire_reflog=0, now=later()).to_json()
    assert doc["plan"]["roots"]["signature"] == 1 and sig.raw in all_keys(store)
    store.threads.delete("t")
    store.gc.run(grace=0, expire_reflog=0, now=later())
    assert all_keys(store) == set()
    with views(store) as txn:
        assert txn.count("signatures") == 0


def test_report_names_shared_bytes_and_pinned_prefixes(any_store, tmp_path):
    store = any_store
    store.history.append("main", records(4000, "m"))
    store.checkpoints.commit(write_files(tmp_path / "ws", {"a": os.urandom(100_000)}), "m")
    store.threads.fork("main", "child", at=1000)
    store.threads.delete("main")
    doc = store.gc.run(grace=0, expire_reflog=0, report=True, now=later()).to_json()
    rows = {r["thread"]: r for r in doc["report"]["threads"]}
    prefix = rows["child"]["pins_prefix"]
    assert prefix["parent"] == "main" and not prefix["parent_exists"] and prefix["seq"] == 1000
    assert prefix["segment"] == store.threads.get("child").history.segment.hex()
    assert rows["child"]["live_bytes"] == stored_bytes(store)
    assert doc["report"]["reclaimable"]["objects"] == doc["result"]["deleted"]["objects"] > 0
    assert doc["report"]["roots"]["thread"][0]["name"] == "child"

    store.threads.fork("child", "sibling")
    report = store.gc.run(grace=0, expire_reflog=0, report=True, now=later()).to_json()["report"]
    rows = {r["thread"]: r for r in report["threads"]}
    assert rows["child"]["shared_bytes"] == rows["sibling"]["shared_bytes"] == rows["child"]["live_bytes"]
    assert rows["child"]["unique_bytes"] == 0


def test_explain_gives_a_path_from_a_root(any_store, tmp_path):
    store = any_store
    store.checkpoints.commit(write_files(tmp_path / "ws", {"d/f.bin": os.urandom(12_000)}), "x")
    chunk = [item.to_json() for item in store.checkpoints.files("main")][0]["id"]
    doc = store.gc.explain(chunk[:10], grace=0).to_json()
    assert doc["alive"] and doc["root"]["kind"] == "thread" and doc["root"]["name"] == "main"
    kinds = [step["kind"] for step in doc["path"]]
    assert kinds[0] == "checkpoint" and kinds[-1] == "chunk"
    assert doc["path"][-1]["id"] == chunk and "tree" in kinds
    store.checkpoints.commit(write_files(tmp_path / "ws2", {"g": os.urandom(10_000)}), "g", thread="g")
    gone = [item.to_json() for item in store.checkpoints.files("g")][0]["id"]
    store.threads.delete("g")
    assert not store.gc.explain(gone, grace=0).to_json()["alive"]
    assert store.gc.explain(gone, grace=3600).to_json()["root"]["kind"] == "recent"
    with pytest.raises(UsageError):
        store.gc.explain("abc")
    with pytest.raises(Exception) as info:
        store.gc.explain("00000000" if not chunk.startswith("00000000") else "ffffffff")
    assert info.value.exit_code == 1


def test_churn_keeps_the_store_bounded(tmp_path):
    store, _ = Store.init(str(tmp_path / "store"))
    ws = tmp_path / "ws"
    sizes = []
    for round_ in range(10):
        write_files(ws, {f"f{i}.bin": os.urandom(250_000) for i in range(8)})
        store.checkpoints.commit(str(ws), f"round {round_}", thread="churn")
        store.threads.delete("churn")
        result = store.gc.run(grace=0, expire_reflog=0, now=later()).to_json()["result"]
        assert result["deleted"]["bytes"] >= 2_000_000
        sizes.append(store.environment.used_bytes())
    assert sizes[-1] < 1.5 * sizes[0], sizes  # without the settle writes it doubles
    assert store.gc.fsck().to_json()["ok"]


def test_plan_is_json_and_counts_add_up(any_store, tmp_path):
    store = any_store
    store.checkpoints.commit(write_files(tmp_path / "ws", {"a": os.urandom(70_000)}), "x")
    store.checkpoints.commit(write_files(tmp_path / "ws2", {"b": os.urandom(70_000)}), "y", thread="t")
    store.threads.delete("t")
    plan = plan_gc(store.backends, later(), 0, 0)
    doc = plan.to_json()
    encoding.encode(doc)  # plain JSON types only (no floats)
    assert doc["objects"] == doc["live"]["objects"] + doc["reclaimable"]["objects"] + doc["held_by_grace"]["objects"]
    assert sum(k["objects"] for k in doc["reclaimable"]["by_kind"].values()) == doc["reclaimable"]["objects"]
    assert doc["roots"]["thread"] == 1


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self")
def test_scan_does_not_keep_the_store_mapped(tmp_path):
    from agentcas.cas.writer import BatchWriter
    from agentcas.gc.pages import PageReleaser
    store, _ = Store.init(str(tmp_path / "store"))
    writer = BatchWriter(store.source)
    for _ in range(1200):
        data = os.urandom(40_000)
        writer.add(hash_blob(data), framing.frame(framing.KIND_CHUNK, data, compress=False))
    writer.flush()

    def mapped() -> int:
        data_file = os.path.realpath(str(tmp_path / "store" / "data.mdb"))
        with open("/proc/self/smaps") as smaps:
            inside, total = False, 0
            for line in smaps:
                if "-" in line.split()[0] and len(line.split()) >= 5:
                    inside = line.rstrip().endswith(data_file)
                elif inside and line.startswith("Rss:"):
                    total += int(line.split()[1]) * 1024
        return total

    pages = PageReleaser(store.environment, every=64, budget=2 * 1024 * 1024)
    with views(store) as txn:
        for _ in txn.scan(packs.PACKS):
            pages.tick()
        assert pages._releases > 0  # the budget was exceeded and the mapping dropped on the way
        assert mapped() > 0
        pages.release()
        assert mapped() < 1024 * 1024
        assert sum(len(v) for _, v in txn.scan(packs.PACKS)) > 48_000_000  # and reads still work


def test_report_splits_unique_and_shared_bytes_per_thread(any_store, tmp_path):
    store = any_store
    store.checkpoints.commit(write_files(tmp_path / "a", {"a.bin": os.urandom(50_000)}), "a", thread="a")
    store.checkpoints.commit(write_files(tmp_path / "b", {"b.bin": os.urandom(70_000)}), "b", thread="b")
    store.threads.fork("a", "c")
    store.checkpoints.commit(write_files(tmp_path / "c", {"c.bin": os.urandom(30_000)}), "c", thread="c")
    rows = {r["thread"]: r for r in store.gc.run(grace=0, expire_reflog=0, report=True, now=later()).to_json()["report"]["threads"]}
    assert rows["b"]["unique_bytes"] == rows["b"]["live_bytes"] and rows["b"]["shared_bytes"] == 0
    assert rows["a"]["unique_bytes"] == 0 and rows["a"]["shared_bytes"] == rows["a"]["live_bytes"]
    assert rows["c"]["shared_bytes"] == rows["a"]["live_bytes"]
    assert rows["c"]["unique_bytes"] == rows["c"]["live_bytes"] - rows["a"]["live_bytes"] > 30_000
    assert sum(r["unique_bytes"] for r in rows.values()) + rows["a"]["live_bytes"] == stored_bytes(store)


def test_report_memory_does_not_grow_with_the_objects_it_counts(tmp_path, monkeypatch):
    # The report's marks and spool are gc's bounded structures, not a dict of every live
    # object and its owner thread. With a 64 KiB budget, 12,000 live objects
    # (a dict of them: over 1 MiB of Python objects) must fit in well under that.
    import tracemalloc

    from agentcas.gc import markset, report
    store, _ = Store.init(str(tmp_path / "store"))
    files = {f"d{i % 40}/f{i}": b"%d" % i * 3 for i in range(12_000)}
    store.checkpoints.commit(write_files(tmp_path / "ws", files), "many", thread="t")
    plan = plan_gc(store.backends, now=later(), grace=0, expire_reflog=0)
    monkeypatch.setattr(markset, "MEMORY_BUDGET", 64 << 10)
    tracemalloc.start()
    try:
        doc = report.build_report(store.backends, plan)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert doc["threads"][0]["live_objects"] > 12_000
    assert peak < 700_000, f"the report peaked at {peak:,} bytes of Python objects"
