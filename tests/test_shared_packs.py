"""A shared store's objects in packs on S3 (a real SeaweedFS) indexed in PostgreSQL (a real
server): uploads per commit and per step, ranged reads, gc of dead and unnamed packs, fsck
of damaged packs, and a store made before packs (one S3 object per id) read and upgraded."""

from __future__ import annotations

import os
import random

import pytest

from agentcas import Store
from agentcas.cas import encoding, framing
from agentcas.cas.blobstore.s3_packs import INDEX, PACK_BYTES, PACKS, build_packs, pack_members
from agentcas.cas.sealed import seal, unseal
from agentcas.cas.store_format import FORMAT_KEY

from support.cli import run_cli
from support.files import write
from support.services import S3_BUCKET
from support.store_state import tree_bytes


@pytest.fixture
def shared(tmp_path, s3_url, postgres_url, monkeypatch):
    """(run on machine `name`, open the store through machine `name`'s cache) of a new store."""
    def run(*args, machine="a"):
        env = {"AGENTCAS_STORE": s3_url, "AGENTCAS_REFS": postgres_url,
               "AGENTCAS_CACHE_DIR": str(tmp_path / f"cache-{machine}")}
        return run_cli(*args, env=env)

    def open_store(machine="a"):
        monkeypatch.setenv("AGENTCAS_CACHE_DIR", str(tmp_path / f"cache-{machine}"))
        return Store.open(s3_url, refs=postgres_url)

    assert run("init").code == 0
    run.open = open_store
    run.url = s3_url
    return run


def s3_names(s3_server, url: str, folder: str) -> dict[str, bytes]:
    """{name: bytes} of the S3 objects under the store's `folder` (objects/ or packs/)."""
    prefix = url.split(f"s3://{S3_BUCKET}/", 1)[1].strip("/") + f"/{folder}/"
    client = s3_server.client()
    found = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=S3_BUCKET, Prefix=prefix):
        for item in page.get("Contents", []):
            found[item["Key"]] = client.get_object(Bucket=S3_BUCKET, Key=item["Key"])["Body"].read()
    return found


def s3_requests(store) -> dict:
    return dict(store.backends.packed.remote.requests)


def many_files(root, count: int, seed: int = 0) -> None:
    write(root, {f"d{i % 7}/f{i}.txt": f"file {i} of {seed}\n" * (1 + i % 9) for i in range(count)})


def test_a_commit_of_many_files_is_one_upload(shared, tmp_path, s3_server):
    many_files(tmp_path / "ws", 300)
    store = shared.open()
    try:
        before = s3_requests(store)
        result = store.checkpoints.commit(str(tmp_path / "ws"), "many").to_json()
        puts = s3_requests(store).get("PutObject", 0) - before.get("PutObject", 0)
    finally:
        store.close()
    assert result["new_objects"] > 300
    assert puts == 1  # the snapshot's objects and the checkpoint: one pack
    assert s3_names(s3_server, shared.url, "objects") == {}
    assert len(s3_names(s3_server, shared.url, "packs")) == 1
    assert shared("--json", "fsck").json()["ok"]


def test_a_step_is_one_upload(shared, tmp_path):
    ws = tmp_path / "ws"
    many_files(ws, 20)
    rollout = ws / "rollout.jsonl"
    rollout.write_text('{"role":"user","text":"hi"}\n')
    assert shared("commit", ws, "-m", "first", "--rollout", rollout).code == 0
    store = shared.open()
    try:
        with rollout.open("a") as handle:
            handle.write('{"role":"assistant","text":"a new message"}\n')
        (ws / "state.json").write_text('{"step": 2}\n')
        before = s3_requests(store)
        store.checkpoints.commit(str(ws), "step", rollout_file=str(rollout))
        puts = s3_requests(store).get("PutObject", 0) - before.get("PutObject", 0)
        print(f"\n[packs] a step: {puts} PUT, {store.meta.round_trips} PostgreSQL round trips")
    finally:
        store.close()
    assert puts == 1
    out = tmp_path / "out"
    assert shared("checkout", "main", out, machine="b").code == 0
    assert tree_bytes(out) == tree_bytes(ws)


def test_a_checkout_on_another_machine_reads_ranges_of_packs(shared, tmp_path):
    many_files(tmp_path / "ws", 300)
    write(tmp_path / "ws", {"big.bin": os.urandom(3_000_000)})
    assert shared("commit", tmp_path / "ws", "-m", "many").code == 0
    store = shared.open("b")
    try:
        store.checkpoints.checkout("main", str(tmp_path / "out"))
        gets = s3_requests(store).get("GetObject", 0)
    finally:
        store.close()
    assert tree_bytes(tmp_path / "out") == tree_bytes(tmp_path / "ws")
    assert gets <= 16  # the checkpoint and 8 trees one by one, then ~300 files' objects in a few ranged GETs


def test_a_batchs_trees_and_chunk_lists_lie_together_after_its_chunks(shared, tmp_path, s3_server):
    ws = tmp_path / "ws"
    for d in range(3):  # files of several chunks (a chunk list each) in three directories
        write(ws, {f"d{d}/big{i}.bin": os.urandom(2_500_000) for i in range(2)})
        write(ws, {f"d{d}/note{i}.txt": f"note {d} {i}\n" for i in range(3)})
    assert shared("commit", ws, "-m", "big files").code == 0
    packs = s3_names(s3_server, shared.url, "packs")
    assert len(packs) == 1
    data = next(iter(packs.values()))
    kinds = [data[offset] for _, offset, _ in sorted(pack_members(data), key=lambda member: member[1])]
    small = [kind != framing.KIND_CHUNK for kind in kinds]
    assert framing.KIND_CHUNKLIST in kinds and framing.KIND_TREE in kinds
    assert small == sorted(small)  # every chunk, then every tree, chunk list and the checkpoint
    store = shared.open("b")
    try:
        store.checkpoints.checkout("main", str(tmp_path / "out"))
        gets = s3_requests(store).get("GetObject", 0)
        print(f"\n[packs] checkout of 6 files of several chunks in 3 directories: {gets} GETs")
    finally:
        store.close()
    assert tree_bytes(tmp_path / "out") == tree_bytes(ws)
    # the checkpoint, the root tree, the three trees below it at once, the six chunk lists
    # at once, then the 15 MB of chunks in ranges of at most 8 MiB
    assert gets <= 11


def test_a_batch_is_cut_into_even_packs_with_its_small_values_in_the_last():
    rng = random.Random(0)
    items, total = {}, 0
    while total < 64 << 20:  # a writer's batch: chunks of 512 KiB to 8 MiB, then small values
        size = int(min(8 << 20, max(512 << 10, rng.expovariate(1 / (1 << 20)))))
        items[rng.randbytes(32)] = bytes([framing.KIND_CHUNK]) + bytes(size - 1)
        total += size
    for _ in range(300):
        items[rng.randbytes(32)] = bytes([framing.KIND_CHUNKLIST]) + bytes(rng.randint(150, 600))
    packs = build_packs(items)
    assert len(packs) == 4  # not four and a fifth of small values alone
    assert all(len(data) <= 1.5 * PACK_BYTES for _, data, _ in packs)
    kinds = [[data[offset] for _, offset, _ in pack_members(data)] for _, data, _ in packs]
    assert all(kind == framing.KIND_CHUNK for pack in kinds[:-1] for kind in pack)
    assert kinds[-1].count(framing.KIND_CHUNKLIST) == 300


def test_gc_deletes_the_packs_of_dead_objects_and_keeps_the_rest(shared, tmp_path, s3_server):
    many_files(tmp_path / "a", 30, seed=1)
    many_files(tmp_path / "b", 30, seed=2)
    assert shared("commit", tmp_path / "a", "-m", "a", "--thread", "a").code == 0
    packs_of_a = set(s3_names(s3_server, shared.url, "packs"))
    assert shared("commit", tmp_path / "b", "-m", "b", "--thread", "b").code == 0
    assert shared("branch", "-d", "b").code == 0
    done = shared("--json", "gc", "--grace", "0s", "--expire-reflog", "now")
    assert done.code == 0, done
    swept = done.json()["result"]
    assert swept["deleted"]["objects"] > 30 and swept["packs"]["deleted"] == 1, swept
    assert set(s3_names(s3_server, shared.url, "packs")) == packs_of_a
    assert shared("--json", "fsck", machine="c").json()["ok"]
    assert shared("checkout", "a", tmp_path / "out", machine="c").code == 0
    assert tree_bytes(tmp_path / "out") == tree_bytes(tmp_path / "a")


def test_a_pack_no_row_names_is_reclaimable_and_gc_deletes_it(shared, tmp_path, s3_server):
    many_files(tmp_path / "ws", 10)
    assert shared("commit", tmp_path / "ws", "-m", "kept").code == 0
    kept = set(s3_names(s3_server, shared.url, "packs"))
    store = shared.open()
    try:  # as a writer killed between its upload and its rows would leave it
        [(name, data, _)] = build_packs({bytes(32): b"x" * 100})
        store.backends.packed.remote.put_pack(name.hex(), data)
    finally:
        store.close()
    checked = shared("--json", "fsck", machine="b").json()
    assert checked["ok"] and checked["packs"]["reclaimable_bytes"] == len(data)
    swept = shared("--json", "gc", "--grace", "0s").json()["result"]
    assert swept["packs"] == {"deleted": 0, "unnamed": 1, "unnamed_bytes": len(data)}, swept
    assert set(s3_names(s3_server, shared.url, "packs")) == kept
    assert shared("--json", "fsck", machine="c").json()["packs"]["reclaimable_bytes"] == 0


def damage_the_pack(s3_server, url: str, change) -> str:
    client = s3_server.client()
    [(key, data)] = s3_names(s3_server, url, "packs").items()
    client.put_object(Bucket=S3_BUCKET, Key=key, Body=change(data))
    return key.rsplit("/", 1)[1]


def test_fsck_and_reads_name_a_pack_cut_short(shared, tmp_path, s3_server):
    many_files(tmp_path / "ws", 40)
    assert shared("commit", tmp_path / "ws", "-m", "one").code == 0
    name = damage_the_pack(s3_server, shared.url, lambda data: data[:len(data) // 2])
    checked = shared("fsck", machine="b")
    assert checked.code == 4 and f"pack {name} is cut short" in checked.out, checked
    read = shared("checkout", "main", tmp_path / "out", machine="c")
    assert read.code == 4 and f"pack {name} is cut short" in read.err, read
    assert not (tmp_path / "out").exists()


def test_fsck_names_the_pack_of_a_corrupted_object(shared, tmp_path, s3_server):
    many_files(tmp_path / "ws", 40)
    assert shared("commit", tmp_path / "ws", "-m", "one").code == 0
    name = damage_the_pack(s3_server, shared.url, lambda data: data[:100] + bytes([data[100] ^ 1]) + data[101:])
    checked = shared("fsck", machine="b")
    assert checked.code == 4 and f"(in pack {name})" in checked.out, checked


# -- a store made before packs (shared format 2: one S3 object per id) ----------------------

def unpack_to_format_2(store) -> None:
    """Rewrite a store as format 2 wrote it: each object its own S3 object, no pack index,
    the format record 2."""
    packed = store.backends.packed
    with store.meta.reader() as txn:
        ids = [bytes(key) for key, _ in txn.scan(INDEX)]
        packs = [bytes(key) for key, _ in txn.scan(PACKS)]
    values = packed.get_many(ids)
    packed.remote.put_many(values)
    store.meta.exchange(writes=[(INDEX, key, None) for key in ids] + [(PACKS, key, None) for key in packs])
    packed.remote.delete_packs([pack.hex() for pack in packs])
    with store.meta.reader() as txn:
        doc = encoding.decode(unseal("meta", FORMAT_KEY, txn.get("meta", FORMAT_KEY)))
    doc["format"] = 2
    store.meta.exchange(writes=[("meta", FORMAT_KEY, seal("meta", FORMAT_KEY, encoding.encode(doc)))])


def test_a_store_made_before_packs_reads_upgrades_and_collects(shared, tmp_path, s3_server):
    many_files(tmp_path / "a", 30, seed=1)
    many_files(tmp_path / "b", 30, seed=2)
    assert shared("commit", tmp_path / "a", "-m", "a", "--thread", "a").code == 0
    assert shared("commit", tmp_path / "b", "-m", "b", "--thread", "b").code == 0
    store = shared.open()
    try:
        unpack_to_format_2(store)
    finally:
        store.close()
    assert s3_names(s3_server, shared.url, "packs") == {}
    legacy = len(s3_names(s3_server, shared.url, "objects"))
    # read (its first open marks it format 3), from a machine that has read nothing
    assert shared("checkout", "b", tmp_path / "out-b", machine="b").code == 0
    assert tree_bytes(tmp_path / "out-b") == tree_bytes(tmp_path / "b")
    # a write upgrades it: new objects go to packs, old ones stay where they are
    many_files(tmp_path / "c", 5, seed=3)
    assert shared("commit", tmp_path / "c", "-m", "c", "--thread", "c", machine="c").code == 0
    assert len(s3_names(s3_server, shared.url, "packs")) == 1
    store = shared.open("c")
    try:
        with store.meta.reader() as txn:
            doc = encoding.decode(unseal("meta", FORMAT_KEY, txn.get("meta", FORMAT_KEY)))
    finally:
        store.close()
    assert (doc["format"], doc["upgraded_from"]) == (3, 2)
    assert shared("--json", "fsck", machine="d").json()["ok"]
    # gc collects old-layout objects as before
    assert shared("branch", "-d", "b").code == 0
    assert shared("gc", "--grace", "0s", "--expire-reflog", "now").code == 0
    assert len(s3_names(s3_server, shared.url, "objects")) < legacy
    assert shared("--json", "fsck", machine="e").json()["ok"]
    for thread in ("a", "c"):
        assert shared("checkout", thread, tmp_path / f"out2-{thread}", machine="e").code == 0
        assert tree_bytes(tmp_path / f"out2-{thread}") == tree_bytes(tmp_path / thread)


def test_gc_at_grace_zero_keeps_the_pack_a_writer_has_uploaded_but_not_yet_indexed(shared, tmp_path, s3_server):
    """A writer holds its lease from its upload to the move that lands its rows: gc at grace
    0 meanwhile must not take its pack for an unnamed one."""
    from agentcas.cas.leases import Lease
    many_files(tmp_path / "ws", 10)
    assert shared("commit", tmp_path / "ws", "-m", "kept").code == 0
    store = shared.open()
    try:
        with Lease(store.meta, "a writer between its upload and its move"):
            [(name, data, _)] = build_packs({bytes(32): b"x" * 100})
            store.backends.packed.remote.put_pack(name.hex(), data)
            swept = shared("--json", "gc", "--grace", "0s", machine="b").json()["result"]
            assert swept["packs"] == {"deleted": 0, "skipped": "writers"}, swept
            assert f"{name.hex()}" in "".join(s3_names(s3_server, shared.url, "packs"))
    finally:
        store.close()
    swept = shared("--json", "gc", "--grace", "0s", machine="b").json()["result"]
    assert swept["packs"]["unnamed"] == 1, swept  # its writer gone: now it is unnamed
