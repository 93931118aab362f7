"""The shared store on localhost servers: refs in PostgreSQL, objects in S3 (SeaweedFS).

1. Ref CAS throughput: 8 processes moving one ref through the PostgreSQL metadata store
   directly (each move: read, compare-and-set, a reflog row, one transaction), all
   started together; moves/s in all, CAS attempts lost to the race, and a check that
   no move was lost (the counter and the reflog rows equal the moves made).
2. The blob-store side of gc on S3: N objects written, then listed (streamed: peak
   Python memory by tracemalloc, at N/10 and N to show it does not grow), their
   existence checked in one batch, and half of them deleted; requests counted by the
   gateway (its Prometheus metrics), not by the client.
2b. A whole `agentcas gc` on a shared store of 10,000 and 100,000 objects (--quick: 2,000
   and 10,000; --gc-sizes N,N,...): wall time, peak RSS and its growth per stored object
   from one size to the next (bounded memory: it falls towards 0), S3 requests by type
   and PostgreSQL statements.
3. Through the CLI, once `agentcas --store s3://... --refs postgresql://...` exists:
   first commit of 1 GiB in 1,000 files (--quick: 64 MiB in 100; --commit-size
   FILES,MiB) beside `restic backup` to a restic repository on the same SeaweedFS, an
   unchanged recommit, and a restore of it (checkout from an empty cache) beside `restic
   restore`: wall time, PUTs and requests to each service (gateway metrics; PostgreSQL
   statements from its log, log_statement=all); --repeat N runs, medians.
   Skipped with a note while the CLI lacks `--refs`.

    python bench/bench_shared.py            # full
    python bench/bench_shared.py --quick    # smaller
    python bench/bench_shared.py --only commit --repeat 3   # packs vs restic
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import shutil
import struct
import subprocess
import sys
import time
import tracemalloc

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

from agentcas.cas import framing  # noqa: E402
from agentcas.cas.digest import hash_blob  # noqa: E402

from harness import AGENTCAS, env_for, fmt_bytes, fmt_time, load_note, machine_note, table, work_dir  # noqa: E402
from support.services import PostgresServer, SeaweedServer  # noqa: E402

# --- 1. ref CAS throughput -----------------------------------------------------------------

def _move(txn, worker: int, lock: bool) -> bool:
    current = txn.get("refs", b"threads/bench", for_update=lock)
    new = struct.pack(">Q", struct.unpack(">Q", current)[0] + 1)
    if not txn.compare_and_set("refs", b"threads/bench", current, new):
        return False
    txn.put("reflog", b"threads/bench\x00" + new, b"%d" % worker)
    return True


_SEEN: dict = {}  # worker's last view of the ref: a landing that lost says what it found


def _exchange_move(store, worker: int) -> bool:
    """A move as lineage/moves.py lands it: one exchange lands the new value only if the ref
    and the next reflog key are as last seen, and reads both (so a lost race re-plans from
    its answer, with no separate read)."""
    from agentcas.cas.metastore.base import Read
    reads = [Read("refs", b"threads/bench"), Read("reflog", b"threads/bench\x00", last=True)]
    if "ref" not in _SEEN:
        _SEEN["ref"] = store.exchange(reads=reads)[1][0]
    current = _SEEN["ref"]
    new = struct.pack(">Q", struct.unpack(">Q", current)[0] + 1)
    log_key = b"threads/bench\x00" + new
    applied, values = store.exchange(reads=reads,
                                     expect=[("refs", b"threads/bench", current), ("reflog", log_key, None)],
                                     writes=[("refs", b"threads/bench", new), ("reflog", log_key, b"%d" % worker)])
    _SEEN["ref"] = new if applied else values[0]
    return applied


def _cas_worker(url: str, env: dict, worker: int, moves: int, lock, ready, go, queue) -> None:
    os.environ.update(env)
    from agentcas.cas.metastore.postgres import PostgresMetadataStore
    store = PostgresMetadataStore(url)
    store.write(lambda txn: txn.get("refs", b"threads/bench"))  # connected before the start
    ready.put(worker)
    go.wait()
    done = lost = 0
    started = time.perf_counter()
    while done < moves:
        if (_exchange_move(store, worker) if lock == "exchange" else store.write(lambda txn: _move(txn, worker, lock))):
            done += 1
        else:
            lost += 1
    queue.put((worker, done, lost, time.perf_counter() - started, store.statements))
    store.close()


def cas_throughput(pg: PostgresServer, workers: int, moves: int, lock: bool) -> tuple[list, list]:
    from agentcas.cas.metastore.postgres import PostgresMetadataStore
    url = pg.create_database()
    store = PostgresMetadataStore(url, create=True)
    store.write(lambda txn: txn.put("refs", b"threads/bench", struct.pack(">Q", 0)))
    ctx = multiprocessing.get_context("spawn")
    ready, queue, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=_cas_worker, args=(url, pg.env(), w, moves, lock, ready, go, queue))
             for w in range(workers)]
    for proc in procs:
        proc.start()
    for _ in procs:
        ready.get(timeout=120)
    started = time.perf_counter()
    go.set()
    results = [queue.get(timeout=600) for _ in procs]
    wall = time.perf_counter() - started
    for proc in procs:
        proc.join()
    total = sum(r[1] for r in results)
    lost = sum(r[2] for r in results)
    with store.reader() as txn:
        counter = struct.unpack(">Q", txn.get("refs", b"threads/bench"))[0]
        logged = txn.count("reflog")
    store.close()
    ok = counter == total == logged == workers * moves
    how = {"exchange": "one exchange per attempt (land if unchanged, read what is there), as a real move",
           True: "SELECT ... FOR UPDATE, then CAS", False: "plain read, then CAS (optimistic)"}[lock]
    rows = [[f"{workers} processes x {moves} moves, one ref: {how}", f"{total:,}", f"{lost:,}", fmt_time(wall),
             f"{total / wall:,.0f}", f"{'none' if ok else 'LOST'} (counter {counter:,}, reflog rows {logged:,})"]]
    return rows, sum(r[4] for r in results) / max(1, total + lost)


# --- 2. the blob-store side of gc --------------------------------------------------------------

def _listing(blobs) -> tuple[int, float, int]:
    """(objects, seconds, peak Python memory): timed alone, then measured in a second pass
    (tracemalloc slows botocore's XML parsing several times over)."""
    started = time.perf_counter()
    count = sum(1 for _ in blobs.list())
    seconds = time.perf_counter() - started
    tracemalloc.start()
    assert sum(1 for _ in blobs.list()) == count
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return count, seconds, peak


def blob_gc_side(s3: SeaweedServer, objects: int) -> tuple[list, list]:
    from agentcas.cas.blobstore.s3 import S3BlobStore
    rows = []
    for n in (objects // 10, objects):
        url = s3.url(f"gc-{n}-{os.getpid()}")
        blobs = S3BlobStore(url, create=True)
        keys = [struct.pack(">Q", i) + os.urandom(24) for i in range(n)]
        started = time.perf_counter()
        for i in range(0, n, 2000):
            blobs.put_many({k: framing.frame(framing.KIND_CHUNK, k * 4) for k in keys[i:i + 2000]})
        put_seconds = time.perf_counter() - started
        before = sum(s3.request_counts().values())
        count, list_seconds, peak = _listing(blobs)
        after_list = sum(s3.request_counts().values())
        before += (after_list - before) // 2  # the requests of one of the two passes
        started = time.perf_counter()
        present = blobs.has_many(keys)
        has_seconds = time.perf_counter() - started
        after_has = sum(s3.request_counts().values())
        started = time.perf_counter()
        deleted = blobs.delete_many(keys[::2])
        delete_seconds = time.perf_counter() - started
        after_delete = sum(s3.request_counts().values())
        assert count == n and len(present) == n and deleted == len(keys[::2])
        rows.append([f"{n:,} objects", fmt_time(put_seconds), f"{fmt_time(list_seconds)} / {after_list - before:,}",
                     fmt_bytes(peak), f"{fmt_time(has_seconds)} / {after_has - after_list:,}",
                     f"{fmt_time(delete_seconds)} / {after_delete - after_has:,}"])
        blobs.close()
    notes = ["columns: wall time / requests the gateway served; delete_many checks existence first "
             "(a listing) so it can count what it deleted, then DeleteObjects 1,000 keys a request",
             "peak memory: Python allocations while streaming the listing (tracemalloc), without the keys "
             "the benchmark itself holds"]
    return rows, notes


# --- 2b. a whole gc on the shared store ----------------------------------------------------------

GC_MEASURE = r"""
import json, resource, subprocess, sys, time
# Peak RSS (the kernel's), and peaks of its two parts sampled every 20 ms from
# /proc/PID/status: RssAnon (the process's own memory) and RssFile (mapped file pages:
# the local cache's LMDB map, page cache the kernel can drop).
start = time.perf_counter()
proc = subprocess.Popen(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
peaks = {"RssAnon": 0, "RssFile": 0}
import threading
def sample():
    while proc.poll() is None:
        try:
            with open(f"/proc/{proc.pid}/status") as f:
                for line in f:
                    name = line.split(":")[0]
                    if name in peaks:
                        peaks[name] = max(peaks[name], int(line.split()[1]) * 1024)
        except OSError:
            return
        time.sleep(0.02)
threading.Thread(target=sample, daemon=True).start()
out, err = proc.communicate()
print(json.dumps({"rc": proc.returncode, "seconds": time.perf_counter() - start,
                  "max_rss": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024,
                  "max_anon": peaks["RssAnon"], "max_file": peaks["RssFile"],
                  "out": out.decode(errors="replace")[-20000:], "err": err.decode(errors="replace")[-2000:]}))
"""


def _small_files(root: str, count: int, seed: int) -> None:
    rng = random.Random(seed)
    for i in range(count):
        path = os.path.join(root, f"d{i % 50:02d}", f"f{i:06d}.txt")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as handle:
            handle.write(rng.randbytes(60 + i % 200))


def full_gc(work: str, s3: SeaweedServer, pg: PostgresServer, objects: int) -> list:
    """`agentcas --json gc --grace 0s --expire-reflog now` on a shared store of `objects`
    objects: a fifth live (one thread's commit of small files), the rest garbage (chunks
    uploaded and never referenced). Run from a second machine's empty cache, so marking
    downloads the live closure. Wall time, peak RSS of the gc process, requests by type."""
    from agentcas.cas.blobstore.s3 import S3BlobStore
    env = env_for(work)
    env.update(s3.env())
    env.update(pg.env())
    env["AGENTCAS_STORE"], env["AGENTCAS_REFS"] = s3.url(f"gcfull-{objects}-{os.getpid()}"), pg.create_database()
    env["AGENTCAS_CACHE_DIR"] = os.path.join(work, f"cache-a-{objects}")
    subprocess.run([AGENTCAS, "init"], env=env, check=True, capture_output=True)
    data = os.path.join(work, f"live-{objects}")
    _small_files(data, objects // 5, seed=objects)
    subprocess.run([AGENTCAS, "commit", data, "-m", "live"], env=env, check=True, capture_output=True)
    os.environ["AGENTCAS_CACHE_DIR"] = env["AGENTCAS_CACHE_DIR"]
    blobs = S3BlobStore(env["AGENTCAS_STORE"])
    live = sum(1 for _ in blobs.list())
    rng = random.Random(-objects)
    garbage = objects - live
    for start in range(0, garbage, 2000):
        chunk = [rng.randbytes(100) for _ in range(min(2000, garbage - start))]
        blobs.put_many({bytes(hash_blob(b).raw): framing.frame(framing.KIND_CHUNK, b) for b in chunk})
    stored = sum(1 for _ in blobs.list())
    env["AGENTCAS_CACHE_DIR"] = os.path.join(work, f"cache-b-{objects}")  # another machine
    s3_before, pg_before = s3.request_counts(), pg.logged_statements()
    doc = json.loads(subprocess.run([sys.executable, "-c", GC_MEASURE, AGENTCAS, "--json", "gc", "--grace", "0s",
                                     "--expire-reflog", "now"], env=env, capture_output=True, check=True).stdout)
    if doc["rc"]:
        raise RuntimeError(f"gc exited {doc['rc']}: {doc['err']}")
    time.sleep(0.5)  # the server log is written asynchronously
    s3_after, pg_after = s3.request_counts(), pg.logged_statements()
    after = sum(1 for _ in blobs.list())
    blobs.close()
    by_type = {k: s3_after.get(k, 0) - s3_before.get(k, 0) for k in s3_after}
    s3_text = ", ".join(f"{k} {v:,}" for k, v in sorted(by_type.items()) if v)
    assert after == live, f"gc left {after:,} objects, {live:,} are live"
    return {"stored": stored, "max_rss": doc["max_rss"], "max_anon": doc["max_anon"],
            "row": [f"{stored:,} objects ({live:,} live)", fmt_time(doc["seconds"]), fmt_bytes(doc["max_rss"]),
                    f"{fmt_bytes(doc['max_anon'])} / {fmt_bytes(doc['max_file'])}",
                    f"{sum(by_type.values()):,} ({s3_text})", f"{pg_after - pg_before:,}", f"{stored - after:,}"]}


def growth_per_object(runs: list, field: str = "max_rss") -> list[str]:
    """Peak memory (`field`) added per stored object from each run to the next (bytes), '-' for the first."""
    out = ["-"]
    for before, after in zip(runs, runs[1:]):
        out.append(f"{(after[field] - before[field]) / max(1, after['stored'] - before['stored']):,.0f} B")
    return out


# --- 3. commits through the CLI --------------------------------------------------------------

def cli_has_shared_store() -> bool:
    proc = subprocess.run([AGENTCAS, "--help"], capture_output=True, text=True)
    return "--refs" in proc.stdout


def make_files(root: str, files: int, total: int) -> None:
    os.makedirs(root)
    each = total // files
    for i in range(files):
        with open(os.path.join(root, f"f{i:04d}.bin"), "wb") as handle:
            handle.write(os.urandom(each))


def cli_commits(work: str, s3: SeaweedServer, pg: PostgresServer, files: int, total: int,
                repeat: int = 1) -> tuple[list, list]:
    """First commit, unchanged recommit and restore (checkout from an empty cache) through
    the CLI, beside `restic backup` and `restic restore` of the same files to the same
    SeaweedFS; `repeat` runs of each, alternating, each into a new store and repository,
    medians reported. PUTs and all requests are the gateway's counts."""
    env = env_for(work)
    env.update(s3.env())
    env.update(pg.env())
    data = os.path.join(work, "data")
    make_files(data, files, total)
    restic_env = dict(env, AWS_ACCESS_KEY_ID=s3.env()["AWS_ACCESS_KEY_ID"],
                      AWS_SECRET_ACCESS_KEY=s3.env()["AWS_SECRET_ACCESS_KEY"], RESTIC_PASSWORD="bench")
    has_restic = shutil.which("restic") is not None
    runs: dict[str, list] = {}

    def timed(name, cmd, run_env, count_pg=True) -> None:
        before, pg_before = s3.request_counts(), pg.logged_statements() if count_pg else 0
        started = time.perf_counter()
        proc = subprocess.run(cmd, env=run_env, capture_output=True, text=True)
        seconds = time.perf_counter() - started
        if proc.returncode:
            raise RuntimeError(f"{name} exited {proc.returncode}: {proc.stderr[-400:]}")
        time.sleep(0.5)  # the server log is written asynchronously
        after = s3.request_counts()
        puts = after.get("PUT", 0) - before.get("PUT", 0)
        requests = sum(after.values()) - sum(before.values())
        statements = pg.logged_statements() - pg_before if count_pg else 0
        runs.setdefault(name, []).append((seconds, requests, puts, statements))

    for rep in range(repeat):
        store, refs = s3.url(f"agentcas-bench-{rep}-{os.getpid()}"), pg.create_database()
        shared = [AGENTCAS, "--store", store, "--refs", refs]
        run_env = dict(env, AGENTCAS_CACHE_DIR=os.path.join(work, f"cache-{rep}"))
        subprocess.run(shared + ["init"], env=run_env, check=True, capture_output=True)
        timed("agentcas first commit", shared + ["commit", data, "-m", "first"], run_env)
        timed("agentcas unchanged recommit", shared + ["commit", data, "-m", "unchanged"], run_env)
        out = os.path.join(work, f"out-agentcas-{rep}")
        timed("agentcas restore (checkout, empty cache)", shared + ["checkout", "main", out],
              dict(env, AGENTCAS_CACHE_DIR=os.path.join(work, f"cache-fresh-{rep}")))
        shutil.rmtree(out)
        shutil.rmtree(os.path.join(work, f"cache-fresh-{rep}"), ignore_errors=True)
        if has_restic:
            repo = f"s3:{s3.endpoint}/agentcas-test/restic-bench-{rep}-{os.getpid()}"
            subprocess.run(["restic", "-r", repo, "init", "-q"], env=restic_env, check=True, capture_output=True)
            timed("restic backup", ["restic", "-r", repo, "backup", "-q", data], restic_env, count_pg=False)
            out = os.path.join(work, f"out-restic-{rep}")
            timed("restic restore", ["restic", "-r", repo, "restore", "latest", "--target", out, "-q"],
                  restic_env, count_pg=False)
            shutil.rmtree(out)

    def median(name, field):
        values = sorted(run[field] for run in runs[name])
        return values[len(values) // 2]

    rows = []
    for name in runs:
        rows.append([f"{name} ({files:,} files, {fmt_bytes(total)})", fmt_time(median(name, 0)),
                     " / ".join(f"{run[0]:.2f}" for run in runs[name]), f"{median(name, 1):,}",
                     f"{median(name, 2):,}", "-" if name.startswith("restic") else f"{median(name, 3):,}"])
    if has_restic:
        rows.append(["ratio restic / agentcas: backup vs first commit",
                     f"{median('restic backup', 0) / median('agentcas first commit', 0):.2f}", "", "", "", ""])
        rows.append(["ratio restic / agentcas: restore",
                     f"{median('restic restore', 0) / median('agentcas restore (checkout, empty cache)', 0):.2f}",
                     "", "", "", ""])
    else:
        rows.append(["restic", "restic not installed (make bench installs it)", "", "", "", ""])
    return rows, [f"median of {repeat} runs, alternating agentcas and restic, each into a new store/repository"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes")
    parser.add_argument("--gc-sizes", default=None, help="object counts of the whole-gc runs (default 10000,100000)")
    parser.add_argument("--only", choices=("cas", "gc", "gc-full", "commit"), action="append", default=[])
    parser.add_argument("--commit-size", default=None, help="FILES,MiB of the commit runs (default 1000,1024)")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each commit and restore (medians)")
    args = parser.parse_args(argv)
    parts = args.only or ["cas", "gc", "gc-full", "commit"]
    notes = [machine_note(), load_note()]
    logged = "commit" in parts or "gc-full" in parts
    pg = PostgresServer(options=("log_statement=all",)) if logged else PostgresServer()
    s3 = SeaweedServer()
    os.environ.update(pg.env())
    os.environ.update(s3.env())
    try:
        if "cas" in parts:
            rows = []
            for lock in (False, True, "exchange"):
                got, per_attempt = cas_throughput(pg, workers=8, moves=150 if args.quick else 500, lock=lock)
                rows += got
            more = ["each move: BEGIN, SELECT [FOR UPDATE], UPDATE ... WHERE value = old (the row count decides), "
                    "INSERT reflog row, COMMIT: one transaction; BEGIN goes with the SELECT and the INSERT with the COMMIT (3 round trips; 2 with FOR UPDATE, whose UPDATE goes with the COMMIT too)",
                    "exchange: one agentcas_exchange call lands the move only if the ref and the next reflog key are as last seen, and reads both, so a lost race plans again from its answer (1 round trip an attempt; what every commit, append, fork and revert does)"]
            print(table("Ref CAS throughput (PostgreSQL metadata store, localhost)",
                        ["run", "moves", "lost CAS attempts", "wall", "moves/s", "moves lost"], rows, more + notes))
        if "gc" in parts:
            rows, more = blob_gc_side(s3, 10_000 if args.quick else 100_000)
            print(table("Blob-store side of gc on S3 (SeaweedFS, localhost)",
                        ["store", "write", "list (time / requests)", "list peak memory", "has_many",
                         "delete half"], rows, more + notes))
        if "gc-full" in parts:
            with work_dir("shared-gc") as work:
                sizes = [int(n) for n in args.gc_sizes.split(",")] if args.gc_sizes else \
                    ((2_000, 10_000) if args.quick else (10_000, 100_000))
                runs = [full_gc(work, s3, pg, n) for n in sizes]
                rows = [run["row"][:4] + [growth, anon] + run["row"][4:]
                        for run, growth, anon in zip(runs, growth_per_object(runs),
                                                     growth_per_object(runs, "max_anon"))]
            print(table("A whole gc on the shared store (`agentcas --json gc --grace 0s --expire-reflog now`)",
                        ["store", "wall", "peak RSS (gc process)", "peak anonymous / file-backed",
                         "RSS growth per object (from the row above)", "anonymous growth per object",
                         "S3 requests (by type)", "PostgreSQL statements", "objects deleted"], rows,
                        ["a fifth of the objects live (one commit of small files), the rest unreferenced chunks; "
                         "gc runs from a second machine's empty cache (marking downloads the live closure); "
                         "requests counted by the servers (gateway metrics, log_statement=all)"] + notes))
        if "commit" in parts:
            if not cli_has_shared_store():
                print(table("Shared-store commits", ["run"], [["skipped: this agentcas has no --refs option yet"]]))
            else:
                with work_dir("shared") as work:
                    files, total = (100, 64 << 20) if args.quick else (1000, 1 << 30)
                    if args.commit_size:
                        count, mib = args.commit_size.split(",")
                        files, total = int(count), int(mib) << 20
                    rows, more = cli_commits(work, s3, pg, files, total, args.repeat)
                print(table("Shared store: first commit, unchanged recommit and restore, beside restic "
                            "(localhost servers)",
                            ["run", "wall (median)", "walls", "S3 requests", "PUTs", "PostgreSQL statements"],
                            rows, more + notes))
    finally:
        s3.close()
        pg.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
