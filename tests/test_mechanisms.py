"""Safety mechanisms that must stay caught: one test per mechanism.

Twelve mechanisms of the write, import, restore and gc paths (the record limit also at
its exact boundary), then eight of the lease protocol (cas/leases.py); their numbers are
those of docs/RELIABILITY.md.

A mutation audit found that each of these could be deleted with every other test still
passing. Each test below fails when its mechanism is removed (each was checked by
removing it once; see docs/RELIABILITY.md, "Mechanisms that must stay caught").

Tests drive the public `Store` API or the real CLI. Where a command must be paused
mid-way (a thread moved during a snapshot, gc between a snapshot and its landing, DEST
created mid-checkout) they act at a named point of `agentcas.testing_hooks`. Where a
store must hold something no command writes (a tree that lies about its file), one
helper, `plant`, writes raw objects, so that one place moves when the storage does.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time

import pytest

from agentcas import Store, testing_hooks
from agentcas.cas import framing, leases
from agentcas.cas.digest import Digest, hash_blob, hash_object
from agentcas.cas.leases import LeaseExpired, LeaseRow, begin_sweep, end_sweep, read_leases
from agentcas.cas.objects import Checkpoint, ChunkList, ChunkRef, Segment, Tree, TreeEntry
from agentcas.errors import AgentcasError, ConflictError, IntegrityError
from agentcas.gc import sweep

from support.bundles import Craft, good_craft, snapshot
from support.store_state import tree_bytes

CREATED = "2026-12-01T09:00:00.000000Z"


def once(action):
    """A hook callback that runs `action` the first time only (the action may reach the point again)."""
    calls = []

    def callback():
        if not calls:
            calls.append(True)
            action()
    return callback


def plant(store: Store, kind: int, data: bytes) -> Digest:
    """Store one object as it is, bypassing every writer's checks (for objects no command writes)."""
    digest = hash_blob(data) if kind == framing.KIND_CHUNK else hash_object(framing.KIND_NAMES[kind], data)
    framed = framing.frame(kind, data)
    store.environment.write(lambda txn: txn.put_new("objects", digest.raw, framed))
    return digest


def write_files(root, files: dict) -> None:
    root.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (root / name).write_bytes(data)


def records(count: int, tag: str) -> bytes:
    return b"".join(b'{"tag": "%s", "i": %d}\n' % (tag.encode(), i) for i in range(count))


# --- 1. the writer's lease, taken before it stores anything -----------------------------------------

def test_commit_pin_is_live_after_its_first_batch_and_holds_gc_off(store, tmp_path):
    """Mechanism 1 (cas/leases.py): a writer takes its lease before it stores anything
    (it was a lazy pin), so gc --grace 0s during a commit deletes none of its objects."""
    ws = tmp_path / "ws"
    write_files(ws, {"a.bin": os.urandom(3000), "b.txt": b"pinned while committing\n"})
    seen = {}

    def gc_mid_commit():
        plan = store.gc.plan(grace=0, expire_reflog=0).to_json()
        seen["pins"] = [p for p in plan["pins"] if p["live"]]
        seen["result"] = store.gc.run(grace=0, expire_reflog=0, wait=0).to_json()["result"]

    with testing_hooks.on("writer.after_batch", once(gc_mid_commit)):
        done = store.checkpoints.commit(str(ws), "under gc").to_json()
    assert [p["what"] for p in seen["pins"]] == ["commit main"]
    assert seen["result"]["deleted"]["objects"] == 0 and not seen["result"]["complete"]
    assert store.gc.plan(grace=0).to_json()["pins"] == []  # released when the commit landed
    assert store.gc.fsck().to_json()["ok"]
    store.checkpoints.checkout(done["checkpoint"], str(tmp_path / "out"))
    assert tree_bytes(tmp_path / "out") == tree_bytes(ws)


# --- 2. checkout's whole-file check -------------------------------------------------------------

def test_checkout_refuses_a_chunk_list_of_other_bytes_with_the_same_sizes(store, store_dir, tmp_path, run):
    """Mechanism 2 (workspace/restore.py): every chunk is valid, but together they are
    not the file the tree names; checkout exits 4 and creates nothing."""
    ws = tmp_path / "ws"
    write_files(ws, {"a.txt": b"A" * 100, "b.txt": b"B" * 100})
    store.checkpoints.commit(str(ws), "two one-chunk files")
    chunk_list = ChunkList((ChunkRef(hash_blob(b"A" * 100), 100), ChunkRef(hash_blob(b"B" * 100), 100)))
    list_id = plant(store, framing.KIND_CHUNKLIST, chunk_list.encode())
    claimed = hash_blob(b"B" * 100 + b"A" * 100)  # other bytes, same sizes
    tree = Tree.of([TreeEntry("f.txt", "file", claimed, 0o644, 200, list_id)])
    tree_id = plant(store, framing.KIND_TREE, tree.encode())
    cp = Checkpoint(tree_id, (), "lying", "crafted", "test", CREATED, {})
    plant(store, framing.KIND_CHECKPOINT, cp.encode())
    store.threads.create("lying", cp.digest().hex())
    dest = tmp_path / "out" / "dest"
    result = run("checkout", "lying", dest, store=store_dir)
    assert result.code == 4, result
    assert result.err.startswith("agentcas: error:") and "f.txt" in result.err
    assert not dest.exists() and os.listdir(tmp_path / "out") == []


# --- 3. bundle pass 1 checks every chunk's hash ---------------------------------------------------

def test_bundle_with_its_last_chunk_flipped_is_refused_before_anything_is_written(receiver, tmp_path):
    """Mechanism 3 (exchange/bundle_format.py): pass 1 checks chunk hashes, so a bad
    last chunk is found before pass 2 writes a single batch."""
    craft = good_craft()
    last = craft.find(framing.KIND_CHUNK)[-1]
    craft.records.remove(last)
    framed = bytearray(last[2])
    framed[-1] ^= 0x01  # an uncompressed body: one byte of the chunk itself
    craft.records.append([last[0], last[1], bytes(framed)])  # the very last record of the file
    path = tmp_path / "flipped.bundle"
    path.write_bytes(craft.bytes())
    before = snapshot(receiver)
    writes = []
    with testing_hooks.on("import.before_write", lambda: writes.append(True)):
        with pytest.raises(IntegrityError) as info:
            receiver.remotes.import_bundle(str(path))
    assert "hash mismatch" in str(info.value) and info.value.exit_code == 4
    assert writes == [], "the bundle reached the write phase before its last chunk was checked"
    assert snapshot(receiver) == before


# --- 4. import re-verifies the head history --------------------------------------------------------

def _lying_history_bundle(tmp_path, change: dict) -> bytes:
    """An exported bundle whose one segment is re-hashed with `change` (digest or count lying),
    its checkpoint and manifest rebuilt to match, unsigned."""
    src, _ = Store.init(str(tmp_path / "src"))
    ws = tmp_path / "src-ws"
    write_files(ws, {"task.json": b'{"step": 1}\n'})
    rollout_file = tmp_path / "r.jsonl"
    rollout_file.write_bytes(records(5, "real"))
    src.checkpoints.commit(str(ws), "one", rollout_file=str(rollout_file))
    src.remotes.export_bundle("main", str(tmp_path / "real.bundle"))
    craft = Craft.explode(str(tmp_path / "real.bundle"))
    (seg_record,) = craft.find(framing.KIND_SEGMENT)
    (cp_record,) = craft.find(framing.KIND_CHECKPOINT)
    seg = Segment.decode(framing.unframe(seg_record[2])[1])
    doc = {f: getattr(seg, f) for f in ("base", "index", "skip", "count", "length", "digest", "chunks", "inline")}
    lying = Segment(**dict(doc, **change))
    lying_id = lying.digest_id()
    seg_record[1], seg_record[2] = lying_id.raw, framing.frame(framing.KIND_SEGMENT, lying.encode())
    cp = Checkpoint.decode(framing.unframe(cp_record[2])[1])
    rebuilt = Checkpoint(cp.tree, cp.parents, cp.thread, cp.reason, cp.author, cp.created_at, cp.runtime,
                         lying.end(lying_id), cp.format, cp.generation, cp.skip)
    cp_id = rebuilt.digest()
    cp_record[1], cp_record[2] = cp_id.raw, framing.frame(framing.KIND_CHECKPOINT, rebuilt.encode())
    craft.manifest.update(checkpoint=cp_id.hex(), checkpoints=[cp_id.hex()], history=rebuilt.history.to_doc())
    craft.envelopes = []
    return craft.bytes()


@pytest.mark.parametrize("lie", ["digest", "count"])
def test_import_reverifies_a_rehashed_segment_whose_digest_or_count_lies(lie, store, tmp_path):
    """Mechanism 4 (exchange/bundle.py): the history is recomputed from the bundle's
    bytes, so a consistent-looking rebuilt segment and checkpoint are refused. The closure
    walk recomputes every segment first ("does not match its bytes"); the head history's
    re-verification stays behind it."""
    change = {"digest": Digest(bytes(32))} if lie == "digest" else {"count": 4}
    path = tmp_path / "lying.bundle"
    path.write_bytes(_lying_history_bundle(tmp_path, change))
    before = snapshot(store)
    with pytest.raises(IntegrityError) as info:
        store.remotes.import_bundle(str(path), allow_unsigned=True)
    message = str(info.value)
    assert info.value.exit_code == 4 and ("history" in message or "does not match its bytes" in message), message
    assert snapshot(store) == before


# --- 5. reflog expiry keeps every thread's newest entry -----------------------------------------------

def test_expire_reflog_now_keeps_each_threads_newest_entry(run, store_dir, tmp_path):
    """Mechanism 5 (gc/sweep.py): expiring the reflog never touches another thread's
    newest entry; with two threads, each THREAD@{0} still exists."""
    ws = tmp_path / "ws"
    for thread in ("alpha", "beta"):
        for step in range(2):
            write_files(ws, {"step.txt": f"{thread} {step}\n".encode()})
            assert run("commit", ws, "-m", f"{thread} {step}", "--thread", thread, store=store_dir).code == 0
    heads = {t: run("--json", "show", t, store=store_dir).json()["checkpoint"] for t in ("alpha", "beta")}
    result = run("--json", "gc", "--grace", "0s", "--expire-reflog", "now", store=store_dir)
    assert result.code == 0, result
    assert result.json()["result"]["reflog_expired"] == 2
    for thread in ("alpha", "beta"):
        reflog = run("--json", "reflog", thread, store=store_dir)
        assert reflog.code == 0 and len(reflog.json()["entries"]) == 1, reflog
        shown = run("--json", "show", f"{thread}@{{0}}", store=store_dir)
        assert shown.code == 0, shown
        assert shown.json()["checkpoint"] == heads[thread]


# --- 6. commit re-checks that every object it needs is still there ---------------------------------

def test_commit_reusing_only_old_garbage_fails_cleanly_when_gc_runs_before_it_lands(store, tmp_path):
    """Mechanism 6 (lineage/moves.py): before the ref moves, a commit checks that every
    object it relies on is still stored. Here its lease is lost (as a writer paused past its
    expiry loses it), so gc at grace 0 deletes the old objects it reuses; the re-check fails
    the commit cleanly (without it, the lease check would raise a conflict instead)."""
    ws = tmp_path / "ws"
    write_files(ws, {"x.txt": b"reused from a deleted thread\n"})
    store.checkpoints.commit(str(ws), "soon garbage", thread="tmp")
    store.threads.delete("tmp")  # its chunk and tree are now unreferenced
    gc_results = []

    def lose_lease_then_gc():
        store.meta.write(lambda txn: [txn.delete("leases", key) for key, _ in list(txn.scan("leases"))])
        gc_results.append(store.gc.run(grace=0, expire_reflog=0).to_json()["result"])

    with testing_hooks.on("commit.before_land", once(lose_lease_then_gc)):
        with pytest.raises(IntegrityError) as info:
            store.checkpoints.commit(str(ws), "reuses garbage")
    assert "vanished" in str(info.value) and "nothing was committed" in str(info.value)
    assert gc_results[0]["deleted"]["objects"] >= 2  # the reused chunk and tree really went
    assert [item.to_json() for item in store.threads.list()] == []  # the ref never moved
    assert store.gc.fsck().to_json()["ok"]
    store.checkpoints.commit(str(ws), "retry")
    store.checkpoints.checkout("main", str(tmp_path / "out"))
    assert tree_bytes(tmp_path / "out") == tree_bytes(ws)


# --- 7. commit --expect is re-checked when landing ------------------------------------------------

def test_commit_expect_is_rechecked_when_the_thread_moves_during_the_snapshot(store, tmp_path):
    """Mechanism 7 (workspace/commit.py): `commit --expect` compares again in the final
    transaction; a thread moved during the snapshot is a conflict (exit 3)."""
    ws, other = tmp_path / "ws", tmp_path / "other"
    write_files(ws, {"a.txt": b"one\n"})
    first = store.checkpoints.commit(str(ws), "one").to_json()["checkpoint"]
    write_files(other, {"a.txt": b"someone else\n"})
    moved = {}
    write_files(ws, {"a.txt": b"two\n"})
    meanwhile = once(lambda: moved.update(store.checkpoints.commit(str(other), "meanwhile").to_json()))
    with testing_hooks.on("commit.before_land", meanwhile):
        with pytest.raises(ConflictError) as info:
            store.checkpoints.commit(str(ws), "two", expect=first)
    assert info.value.exit_code == 3 and "nothing was committed" in str(info.value)
    assert store.threads.get("main").checkpoint.hex() == moved["checkpoint"]
    assert [e["reason"] for e in [item.to_json() for item in store.threads.log("main")]] == ["meanwhile", "one"]


# --- 8. commit --rollout is re-checked when landing -----------------------------------------------

def test_commit_rollout_is_rechecked_when_the_history_moves_during_the_commit(store, tmp_path):
    """Mechanism 8 (workspace/commit.py): the rollout tail was read against one history; if the
    thread's history moved meanwhile, the commit is a conflict and nothing lands."""
    ws = tmp_path / "ws"
    write_files(ws, {"a.txt": b"one\n"})
    rollout_file = tmp_path / "r.jsonl"
    rollout_file.write_bytes(records(2, "file"))
    store.checkpoints.commit(str(ws), "one", rollout_file=str(rollout_file))
    with open(rollout_file, "ab") as out:
        out.write(b'{"tag": "file", "i": 2}\n')
    meanwhile = once(lambda: store.history.append("main", b'{"tag": "elsewhere"}\n'))
    with testing_hooks.on("commit.before_land", meanwhile):
        with pytest.raises(ConflictError) as info:
            store.checkpoints.commit(str(ws), "two", rollout_file=str(rollout_file))
    assert info.value.exit_code == 3 and "history moved" in str(info.value)
    assert b"".join(store.history.read("main")) == records(2, "file") + b'{"tag": "elsewhere"}\n'
    assert [e["reason"] for e in [item.to_json() for item in store.threads.log("main")]] == ["one"]


# --- 9. import re-checks the thread when landing ----------------------------------------------------

def test_import_is_a_conflict_when_the_thread_moves_while_it_writes(store, tmp_path):
    """Mechanism 9 (exchange/bundle.py): the final transaction compares the thread with
    what import planned from; a commit landing meanwhile is never overwritten."""
    src, _ = Store.init(str(tmp_path / "src"))
    write_files(tmp_path / "src-ws", {"a.txt": b"from the bundle\n"})
    src.checkpoints.commit(str(tmp_path / "src-ws"), "exported")
    src.remotes.export_bundle("main", str(tmp_path / "b.bundle"))
    write_files(tmp_path / "ws", {"a.txt": b"local work\n"})
    local = {}
    meanwhile = once(lambda: local.update(store.checkpoints.commit(str(tmp_path / "ws"), "local").to_json()))
    with testing_hooks.on("import.before_land", meanwhile):
        with pytest.raises(ConflictError) as info:
            store.remotes.import_bundle(str(tmp_path / "b.bundle"), allow_unsigned=True)
    assert info.value.exit_code == 3 and "moved" in str(info.value)
    assert store.threads.get("main").checkpoint.hex() == local["checkpoint"]
    assert [e["reason"] for e in [item.to_json() for item in store.threads.log("main")]] == ["local"]


# --- 10. checkout re-checks DEST before the final rename ----------------------------------------

def test_checkout_never_replaces_a_dest_created_while_it_ran(store, tmp_path):
    """Mechanism 10 (workspace/restore.py): DEST is checked again just before the
    temporary directory is renamed; an (empty) DEST made meanwhile is a conflict, kept as it is."""
    ws = tmp_path / "ws"
    write_files(ws, {"a.txt": b"checkout me\n"})
    store.checkpoints.commit(str(ws), "one")
    parent = tmp_path / "out"
    parent.mkdir()
    dest = parent / "dest"
    with testing_hooks.on("checkout.before_rename", once(lambda: dest.mkdir())):
        with pytest.raises(ConflictError) as info:
            store.checkpoints.checkout("main", str(dest))
    assert info.value.exit_code == 3
    assert dest.is_dir() and os.listdir(dest) == []  # untouched, not replaced by the checkout
    assert os.listdir(parent) == ["dest"]  # and the temporary directory is gone


# --- 11. the sweep re-checks grace ---------------------------------------------------------------

def test_sweep_keeps_an_object_stored_again_after_planning(store, tmp_path):
    """Mechanism 11 (gc/sweep.py): each sweep transaction re-reads an object's write
    time; one deleted and stored again after the plan was made is young, so it is kept."""
    ws = tmp_path / "ws"
    write_files(ws, {"x.txt": b"stored, deleted, stored again\n"})
    store.checkpoints.commit(str(ws), "garbage soon", thread="tmp")
    written = int(time.time())  # every object of that commit was written at or before this second
    store.threads.delete("tmp")

    def restore_meanwhile():
        store.gc.run(grace=0, expire_reflog=0)  # another gc deletes them
        while int(time.time()) <= written:  # so the objects stored again are stamped later
            time.sleep(0.02)
        store.checkpoints.commit(str(ws), "again", thread="tmp2")  # the same chunk and tree, stored again
        store.threads.delete("tmp2")

    with testing_hooks.on("gc.sweep.before_batch", once(restore_meanwhile)):
        # Planned with the clock half a second after the first write: old then, young after.
        result = store.gc.run(grace=0, expire_reflog=0, now=written + 0.5).to_json()["result"]
    assert result["deleted"]["objects"] == 0, result
    assert store.checkpoints.commit(str(ws), "still there").to_json()["new_objects"] == 0  # chunk and tree were kept


# --- 12. the rollout record size limit --------------------------------------------------------------

def test_a_record_longer_than_the_limit_is_refused_by_its_line_number():
    """Mechanism 12 (lineage/rollout.py): a line over 64 MiB is refused, naming its
    line, before anything is parsed or stored."""
    store = Store.memory()
    limit = 64 * 1024 * 1024  # MAX_RECORD_BYTES, as README/FORMAT state it
    huge = b'{"blob": "' + b"x" * limit + b'"}\n'
    with pytest.raises(AgentcasError) as info:
        store.history.append("main", records(2, "ok") + huge)
    assert "line 3" in str(info.value) and "longer than" in str(info.value)
    assert [item.to_json() for item in store.threads.list()] == []


def test_a_record_of_exactly_the_limit_is_accepted_and_one_byte_more_refused():
    """Mechanism 12 at its boundary: the limit counts a record's bytes with its newline; a
    line of exactly 64 MiB is appended whole, one of 64 MiB + 1 byte refused."""
    store = Store.memory()
    limit = 64 * 1024 * 1024
    exact = b'{"blob": "' + b"x" * (limit - 13) + b'"}\n'
    assert len(exact) == limit
    assert store.history.append("main", exact).to_json()["appended"] == 1
    assert b"".join(store.history.read("main")) == exact
    with pytest.raises(AgentcasError) as info:
        store.history.append("main", exact[:10] + b"x" + exact[10:])
    assert str(info.value) == f"line 1: record longer than {limit} bytes"
    assert b"".join(store.history.read("main")) == exact


# --- the lease protocol's own mechanisms (cas/leases.py, lineage/moves.py, gc/sweep.py) ----------

def garbage(store: Store, tmp_path, tag: str = "garbage") -> int:
    """Commit a thread of new objects and delete it; how many objects gc at grace 0 may now delete."""
    ws = tmp_path / f"ws-{tag}"
    write_files(ws, {"g.bin": os.urandom(5000), "g.txt": f"{tag}\n".encode()})
    store.checkpoints.commit(str(ws), tag, thread=f"{tag}-tmp")
    store.threads.delete(f"{tag}-tmp")
    reclaimable = store.gc.plan(grace=0, expire_reflog=0).reclaimable["objects"]
    assert reclaimable >= 3  # chunks, tree, checkpoint
    return reclaimable


def lease_rows(store: Store) -> list[LeaseRow]:
    with store.meta.reader() as txn:
        return read_leases(txn)


@pytest.mark.parametrize("lost", ["deleted", "expired"])
def test_a_writer_whose_lease_is_lost_fails_with_lease_expired_and_moves_nothing(lost, store, tmp_path):
    """Lease (a) (lineage/moves.py move_thread): the final transaction checks the writer's
    lease; a lease deleted (by a gc that judged it dead) or run out while the commit was
    paused fails the commit with LeaseExpired (exit 3), the thread and reflog unchanged."""
    ws = tmp_path / "ws"
    write_files(ws, {"a.txt": b"one\n"})
    store.checkpoints.commit(str(ws), "one")
    before = (store.threads.list(), store.threads.reflog("main"))
    write_files(ws, {"a.txt": b"two\n"})

    def lose_lease():
        (row,) = lease_rows(store)
        assert row.what == "commit main"
        if lost == "deleted":
            store.meta.write(lambda txn: txn.delete("leases", row.key))
        else:  # still there, but its time ran out (a writer paused past its expiry)
            past = dataclasses.replace(row, expires_at=time.time() - 1)
            store.meta.write(lambda txn: txn.put("leases", row.key, past.encode()))

    with testing_hooks.on("commit.before_land", once(lose_lease)):
        with pytest.raises(LeaseExpired) as info:
            store.checkpoints.commit(str(ws), "two")
    assert info.value.exit_code == 3 and "nothing was changed" in str(info.value)
    assert (store.threads.list(), store.threads.reflog("main")) == before
    assert [e["reason"] for e in [item.to_json() for item in store.threads.log("main")]] == ["one"]
    assert lease_rows(store) == []  # the failed writer removed what was left of its lease
    assert store.gc.fsck().to_json()["ok"]


def test_gc_at_grace_zero_deletes_nothing_while_a_lease_is_live(store, tmp_path):
    """Lease (b) (cas/leases.py begin_sweep): a sweep batch does not begin while any live
    lease exists (a write in progress may reuse ANY stored object), so gc at grace 0
    during a commit deletes not even unrelated garbage, and reports what blocked it."""
    reclaimable = garbage(store, tmp_path)
    ws = tmp_path / "ws"
    write_files(ws, {"a.txt": b"in progress\n"})
    seen = {}

    def gc_meanwhile():
        seen.update(store.gc.run(grace=0, expire_reflog=0, wait=0).to_json()["result"])

    with testing_hooks.on("commit.before_land", once(gc_meanwhile)):
        store.checkpoints.commit(str(ws), "writing while gc runs")
    assert seen["deleted"]["objects"] == 0 and seen["batches"] == 0 and not seen["complete"]
    assert [row["what"] for row in seen["blocked_by"]] == ["commit main"]
    # With the writer gone, the same gc deletes the garbage: it really was deletable.
    result = store.gc.run(grace=0, expire_reflog=0, wait=0).to_json()["result"]
    assert result["complete"] and result["deleted"]["objects"] == reclaimable
    assert store.gc.fsck().to_json()["ok"]


def test_a_writer_waiting_for_a_sweep_batch_already_holds_off_the_next_batch(store, tmp_path):
    """Lease (c) (cas/leases.py Lease.acquire): a writer's lease row is written even while
    it waits for an active sweep batch, so gc begins no further batch: a writer waits for
    at most the batch in progress, never for a whole gc."""
    reclaimable = garbage(store, tmp_path)
    live, _ = store.meta.write(lambda txn: begin_sweep(txn, time.time()))
    assert live == []  # a sweep batch is now active
    seen = {}

    def batch_ends_then_gc_tries_the_next():
        store.meta.write(end_sweep)  # the active batch finishes
        seen.update(store.gc.run(grace=0, expire_reflog=0, wait=0).to_json()["result"])

    with testing_hooks.on("lease.waiting", once(batch_ends_then_gc_tries_the_next)):
        appended = store.history.append("main", records(3, "waited")).to_json()
    assert seen["deleted"]["objects"] == 0 and seen["batches"] == 0 and not seen["complete"]
    assert [row["what"] for row in seen["blocked_by"]] == ["append main"]
    assert appended["appended"] == 3  # the writer then took its lease and landed
    assert b"".join(store.history.read("main")) == records(3, "waited")
    assert store.gc.run(grace=0, expire_reflog=0, wait=0).to_json()["result"]["deleted"]["objects"] == reclaimable


def test_an_expired_lease_of_another_host_does_not_hold_gc_off(store, tmp_path):
    """Lease (f) (cas/leases.py LeaseRow.live): a lease is dead once expired (beyond the
    clock margin), also where its pid cannot be asked (another host's writer, gone for
    good): gc drops its row and sweeps. Unexpired, the same row holds gc off."""
    reclaimable = garbage(store, tmp_path)
    now = time.time()
    row = LeaseRow(os.urandom(16), "commit main", "another-host.example", 4242, now - 900,
                   now - leases.CLOCK_MARGIN - 60)
    live = dataclasses.replace(row, key=os.urandom(16), expires_at=now + 600)
    store.meta.write(lambda txn: txn.put("leases", live.key, live.encode()))
    held = store.gc.run(grace=0, expire_reflog=0, wait=0).to_json()["result"]
    assert held["deleted"]["objects"] == 0 and [r["host"] for r in held["blocked_by"]] == ["another-host.example"]
    store.meta.write(lambda txn: [txn.delete("leases", live.key), txn.put("leases", row.key, row.encode())])
    result = store.gc.run(grace=0, expire_reflog=0, wait=0).to_json()["result"]
    assert result["complete"] and result["pins_dropped"] == 1 and result["blocked_by"] == []
    assert result["deleted"]["objects"] == reclaimable and lease_rows(store) == []


def test_a_landing_whose_own_lease_ran_out_raises_before_it_sends_anything(store, tmp_path, monkeypatch):
    """Lease (g) (lineage/moves.py: an embedded landing checks the lease in its transaction;
    a shared one by its clock, tests/test_shared_store.py): a writer paused past its own
    lease's end, its row untouched in the store (gc may have judged it dead and swept
    without yet deleting it), fails with LeaseExpired without sending its exchange."""
    monkeypatch.setattr(leases, "LEASE_SECONDS", 1.0)
    ws = tmp_path / "ws"
    write_files(ws, {"a.txt": b"one\n"})
    store.checkpoints.commit(str(ws), "one")
    before = (store.threads.list(), store.threads.reflog("main"))
    write_files(ws, {"a.txt": b"two\n"})
    sent = []

    def outlive_the_lease():
        (row,) = lease_rows(store)
        while time.time() <= row.expires_at + 0.05:
            time.sleep(0.05)
        assert lease_rows(store) == [row]  # still there, as written: only the clock says it ran out
        exchange = store.meta.exchange
        monkeypatch.setattr(store.meta, "exchange", lambda *a, **kw: sent.append(kw) or exchange(*a, **kw))

    with testing_hooks.on("commit.before_land", once(outlive_the_lease)):
        with pytest.raises(LeaseExpired) as info:
            store.checkpoints.commit(str(ws), "two")
    assert info.value.exit_code == 3 and "took longer than its lease" in str(info.value)
    assert sent == []
    assert (store.threads.list(), store.threads.reflog("main")) == before
    assert store.gc.fsck().to_json()["ok"]


def test_a_long_commit_refreshes_its_lease_and_lands_while_gc_runs(store, tmp_path, monkeypatch):
    """Lease (h) (cas/writer.py: each batch refreshes the writer's lease): a commit that takes
    longer than its lease, one object a batch, stays live for gc, which deletes nothing
    while it runs (not even older garbage), and lands; the garbage goes afterwards."""
    from agentcas.cas import writer
    monkeypatch.setattr(leases, "LEASE_SECONDS", 2.0)
    monkeypatch.setattr(leases, "CLOCK_MARGIN", 0.5)
    monkeypatch.setattr(writer, "BATCH_OBJECTS", 1)
    reclaimable = garbage(store, tmp_path)
    ws = tmp_path / "ws"
    write_files(ws, {f"f{i}.bin": os.urandom(3000) for i in range(6)})
    began, seen = time.time(), []

    def slow_batch():
        time.sleep(0.8)
        if time.time() > began + leases.LEASE_SECONDS + leases.CLOCK_MARGIN and not seen:
            # Unrefreshed, the lease would be dead by now.
            seen.append(store.gc.run(grace=0, expire_reflog=0, wait=0).to_json()["result"])

    with testing_hooks.on("writer.after_batch", slow_batch):
        done = store.checkpoints.commit(str(ws), "longer than a lease").to_json()
    (during,) = seen
    assert during["deleted"]["objects"] == 0 and [r["what"] for r in during["blocked_by"]] == ["commit main"]
    assert time.time() - began > 2 * leases.LEASE_SECONDS  # it did outlast its first lease
    store.checkpoints.checkout(done["checkpoint"], str(tmp_path / "out"))
    assert tree_bytes(tmp_path / "out") == tree_bytes(ws)
    assert store.gc.run(grace=0, expire_reflog=0, wait=0).to_json()["result"]["deleted"]["objects"] == reclaimable


KILLED_WRITER = r"""
import os, signal, sys
from agentcas import Store, testing_hooks
store = Store.open(sys.argv[1])
# Killed between storing its objects and landing: its lease row stays behind.
with testing_hooks.on("commit.before_land", lambda: os.kill(os.getpid(), signal.SIGKILL)):
    store.checkpoints.commit(sys.argv[2], "never lands")
"""


def test_the_lease_of_a_killed_local_writer_is_dead_at_once(store, store_dir, tmp_path):
    """Lease (d) (cas/leases.py LeaseRow.live): a lease of a process on this host whose pid
    is gone is dead although unexpired, so a killed writer does not hold gc off for
    LEASE_SECONDS: gc drops its row and deletes the garbage, the writer's objects too."""
    reclaimable = garbage(store, tmp_path)
    ws = tmp_path / "ws"
    write_files(ws, {"a.bin": os.urandom(4000)})
    proc = subprocess.run([sys.executable, "-c", KILLED_WRITER, str(store_dir), str(ws)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    (row,) = lease_rows(store)
    assert row.what == "commit main" and row.expires_at > time.time() + 10  # unexpired, long
    result = store.gc.run(grace=0, expire_reflog=0, wait=0).to_json()["result"]
    assert result["complete"] and result["pins_dropped"] == 1 and result["blocked_by"] == []
    assert result["deleted"]["objects"] > reclaimable  # the garbage and what the killed commit stored
    assert lease_rows(store) == [] and [item.to_json() for item in store.threads.list()] == []
    assert store.gc.fsck().to_json()["ok"]


def test_a_sweep_batch_past_its_window_deletes_nothing(store, tmp_path, monkeypatch):
    """Lease (e) (gc/sweep.py sweep_batch): a batch deletes only within its window; once
    it has passed (writers may then take leases again), the batch deletes nothing and gc
    retries it. The window is shortened here so that a short pause outlasts it."""
    reclaimable = garbage(store, tmp_path)
    monkeypatch.setattr(sweep, "SWEEP_WINDOW", sweep.WINDOW_MARGIN + 0.2)

    def outlast_the_window():
        time.sleep(0.3)

    with testing_hooks.on("gc.sweep.in_batch", once(outlast_the_window)):
        result = store.gc.run(grace=0, expire_reflog=0, wait=0).to_json()["result"]
    assert result["deleted"]["objects"] == 0 and result["batches"] == 0 and not result["complete"]
    assert store.gc.plan(grace=0, expire_reflog=0).reclaimable["objects"] == reclaimable  # all still there
    result = store.gc.run(grace=0, expire_reflog=0, wait=0).to_json()["result"]  # a batch within its window
    assert result["complete"] and result["deleted"]["objects"] == reclaimable
