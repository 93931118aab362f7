"""Harness numbers: ingest of real-format harness sessions, and replay at the head.

1. Ingest of N Codex session files (full: 2,000 files, 1 GB) with `agentcas ingest codex DIR`
   vs `restic backup DIR` of the same directory, three times alternating (medians; each
   into an empty store and repo); then a second run with nothing changed (both tools), and
   the agentcas second run in-process (no Python start-up).
2. Replay at the head of a 100 MB Codex session whose last compaction is 1 MB from the end,
   vs the same replay on a 10 MB session (the cost should follow the tail, not the file).
3. A Codex fork that copies 90% of a 20 MB parent: the bytes the fork adds to the store
   (copied lines carry new timestamps, so only the content-defined chunks of long bodies dedupe).
4. (`--parts=cpu`, not in the default parts) Where the first ingest's CPU goes: the CPU of
   all its processes beside restic's, and the library floor, the calls into C libraries that
   any ingest storing these files with this format makes (one process), beside restic on one
   core (GOMAXPROCS=1). Both tools keep 2 cores busy, so wall time follows total CPU: the
   floor says how much CPU is left for everything written in Python.

Sessions are built by tests/support/harness_samples.py (the shapes of docs/HARNESSES.md), with
tool outputs sliced from a pool of pseudo-random words (text-like, compressible, not
repeated across files). `--quick` uses 200 files / 100 MB and 20 MB / 4 MB sessions;
`--parts=replay,fork,ingest` runs only some parts (`cpu` only when named).
"""

from __future__ import annotations

import glob
import json
import os
import random
import resource
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

import harness as h  # noqa: E402
from support.harness_samples import CodexSession  # noqa: E402

MB = 1_000_000
WORDS = ("def return import self value error test file path the of and to in is for with data "
         "line result assert class object json store thread replay ingest chunk write read").split()


class TextPool:
    """Text-like bytes: random words, sliced at random places (seeded, reproducible)."""

    def __init__(self, seed: int, size: int = 4 * 1024 * 1024):
        rng = random.Random(seed)
        words = [rng.choice(WORDS) + ("\n" if rng.random() < 0.08 else " ") for _ in range(size // 5)]
        self.text = "".join(words)
        self.rng = random.Random(seed + 1)

    def take(self, size: int) -> str:
        start = self.rng.randrange(0, len(self.text) - size - 1)
        return self.text[start:start + size]


def build_session(thread_id: str, size: int, pool: TextPool, compaction_from_end: int | None = None,
                  forked_from: str | None = None, turn_bytes: int = 40_000) -> CodexSession:
    """A Codex session of about `size` bytes; a manual compaction `compaction_from_end` before its end."""
    s = CodexSession(thread_id, forked_from=forked_from)
    compacted = compaction_from_end is None
    n, done, counted = 0, 0, 0

    def written() -> int:   # running total: summing every line each turn is quadratic
        nonlocal done, counted
        done += sum(map(len, s.lines[counted:]))
        counted = len(s.lines)
        return done

    while written() < size:
        n += 1
        if not compacted and written() >= size - compaction_from_end:
            s.compact(pool.take(2000))
            compacted = True
        turn = s.start(prompt=f"step {n}: " + pool.take(200))
        for _ in range(3):
            s.tool_call(command="pytest -q", output=pool.take(turn_bytes // 4))
        s.reply(pool.take(turn_bytes // 8))
        s.complete(turn)
    return s


def write_sessions(root: str, count: int, total: int, pool: TextPool) -> int:
    """`count` session files of `total` bytes in all, in Codex's dated layout; bytes written."""
    written = 0
    for i in range(count):
        directory = os.path.join(root, "2026", "11", f"{1 + i % 28:02d}")
        os.makedirs(directory, exist_ok=True)
        thread_id = f"0199a0b1-{i:04x}-7000-8000-{i:012x}"
        s = build_session(thread_id, total // count, pool, turn_bytes=20_000)
        data = s.data()
        with open(os.path.join(directory, f"rollout-2026-11-{1 + i % 28:02d}T10-00-00-{thread_id}.jsonl"),
                  "wb") as handle:
            handle.write(data)
        written += len(data)
    return written


IN_PROCESS = r"""
import json, sys, time
from agentcas import Store
from agentcas.harnesses.ingest import Ingest
from agentcas.harnesses import replay
store = Store.open(sys.argv[1])
what = sys.argv[2]
if what == "ingest":
    start = time.perf_counter(); reports = Ingest(store, "codex", [sys.argv[3]]).run()
    print(json.dumps({"seconds": time.perf_counter() - start,
                      "statuses": sorted({r.status for r in reports})}))
else:
    times = []
    for _ in range(5):
        start = time.perf_counter(); doc = replay.replay(store, sys.argv[3]); times.append(time.perf_counter() - start)
    times.sort()
    print(json.dumps({"seconds": times[2], "items": len(doc.items), "compaction_line": doc.compaction_line,
                      "at": doc.at}))
"""


def in_process(store: str, *args) -> dict:
    return json.loads(h.output([sys.executable, "-c", IN_PROCESS, store, *args]))


FIRST_RUNS = 3   # first ingests (and restic backups), alternating: this host's speed drifts by ±20%


def bench_sessions(work: str, count: int, total: int) -> tuple[str, int]:
    """The ingest parts' session directory (written once a run) and its size in bytes."""
    sessions = os.path.join(work, "sessions")
    if not os.path.isdir(sessions):
        h.progress(f"writing {count} Codex sessions, {total / MB:.0f} MB")
        write_sessions(sessions, count, total, TextPool(1))
    return sessions, sum(os.path.getsize(p) for p in glob.glob(os.path.join(sessions, "**", "*.jsonl"),
                                                               recursive=True))


def bench_ingest(work: str, env: dict, count: int, total: int) -> None:
    sessions, size = bench_sessions(work, count, total)
    firsts, restic_firsts = [], []
    for run in range(FIRST_RUNS):   # each pair into an empty store and an empty restic repo
        store, restic_repo = os.path.join(work, f"store-{run}"), os.path.join(work, f"restic-{run}")
        h.run([h.AGENTCAS, "init", store], env=env)
        h.run(["restic", "init", "-q", "--repository-version", "2", "--repo", restic_repo], env=env)
        h.progress(f"agentcas ingest ({run + 1}/{FIRST_RUNS})")
        firsts.append(h.run([h.AGENTCAS, "--store", store, "ingest", "codex", sessions], env=env,
                            warm_paths=[sessions]))
        h.progress(f"restic backup ({run + 1}/{FIRST_RUNS})")
        restic_firsts.append(h.run(["restic", "backup", "-q", "--repo", restic_repo, sessions], env=env,
                                   warm_paths=[sessions]))
        if run < FIRST_RUNS - 1:
            h.run(["rm", "-rf", store, restic_repo])
    first, restic_first = statistics.median(firsts), statistics.median(restic_firsts)
    pairs = sorted(a / b for a, b in zip(firsts, restic_firsts))
    second = h.median_time(lambda: h.run([h.AGENTCAS, "--store", store, "ingest", "codex", sessions], env=env), 3)
    second_in = sorted(in_process(store, "ingest", sessions)["seconds"] for _ in range(3))[1]
    restic_second = h.run(["restic", "backup", "-q", "--repo", restic_repo, sessions], env=env)
    stats = h.store_stats(store)
    h.table(f"Ingest of {count} Codex session files, {h.fmt_bytes(size)} (`agentcas ingest codex DIR` vs "
            "`restic backup DIR`)",
            ["run", "agentcas", "restic", "agentcas / restic", "target met"],
            [[f"first ingest (median of {FIRST_RUNS}, alternating)", h.fmt_time(first), h.fmt_time(restic_first),
              h.fmt_ratio(h.ratio(first, restic_first)), h.verdict(first <= restic_first)],
             ["second, nothing changed (CLI)", h.fmt_time(second), h.fmt_time(restic_second),
              h.fmt_ratio(h.ratio(second, restic_second)), h.verdict(second < 0.5)],
             ["second, nothing changed (in-process)", h.fmt_time(second_in), "-", "-",
              h.verdict(second_in < 0.5)]],
            [f"First ingests: agentcas {', '.join(map(h.fmt_time, firsts))}; restic "
             f"{', '.join(map(h.fmt_time, restic_firsts))}; pair ratios {pairs[0]:.2f}–{pairs[-1]:.2f}×. "
             f"Store after ingest: {h.fmt_bytes(stats['used_bytes'])} LMDB pages in use, "
             f"{stats['objects']} objects, {h.fmt_bytes(stats['object_bytes'])} stored; restic repo "
             f"{h.fmt_bytes(h.disk_bytes(restic_repo))}. Target: first ingest at most restic; second "
             f"under 0.5 s. {h.load_note()}."])


def cpu_run(cmd, env: dict, warm_paths=()) -> tuple[float, float]:
    """(wall, CPU seconds: user + system of the command and every process it waited for)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall = h.run(cmd, env=env, warm_paths=warm_paths)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


FLOOR = r"""
import glob, json, sys, time
from agentcas.cas import chunking, framing
from agentcas.cas.digest import hash_blob
from agentcas.harnesses.line_kinds import _HEAD
from agentcas.api.history import INGEST_ZSTD_LEVEL
parts = dict.fromkeys(["read", "UTF-8 check", "msgspec validation", "content-defined cut", "BLAKE3 of chunks",
                       "zstd framing"], 0.0)
for path in sorted(glob.glob(sys.argv[1] + "/**/*.jsonl", recursive=True)):
    clock = time.process_time
    t = clock(); data = open(path, "rb").read(); parts["read"] += clock() - t
    t = clock(); data.isascii() or str(data, "utf-8"); parts["UTF-8 check"] += clock() - t
    t = clock(); _HEAD.decode_lines(data); parts["msgspec validation"] += clock() - t
    t = clock()
    pieces = list(chunking.cut(memoryview(data), chunking.ROLLOUT_AVG_SIZE, chunking.ROLLOUT_MIN_SIZE,
                               chunking.ROLLOUT_MAX_SIZE))
    parts["content-defined cut"] += clock() - t
    t = clock(); [hash_blob(piece) for piece in pieces]; parts["BLAKE3 of chunks"] += clock() - t
    t = clock(); [framing.frame(framing.KIND_CHUNK, piece, level=INGEST_ZSTD_LEVEL) for piece in pieces]
    parts["zstd framing"] += clock() - t
print(json.dumps(parts))
"""


def bench_cpu(work: str, env: dict, count: int, total: int) -> None:
    """The first ingest as CPU: see the module's point 4."""
    sessions, size = bench_sessions(work, count, total)
    runs = {"agentcas": [], "restic": [], "restic, 1 core": []}
    for run in range(FIRST_RUNS):
        store, repo, repo1 = (os.path.join(work, f"cpu-{name}-{run}") for name in ("store", "restic", "restic1"))
        h.run([h.AGENTCAS, "init", store], env=env)
        for path in (repo, repo1):
            h.run(["restic", "init", "-q", "--repository-version", "2", "--repo", path], env=env)
        h.progress(f"CPU of the first ingest ({run + 1}/{FIRST_RUNS})")
        runs["agentcas"].append(cpu_run([h.AGENTCAS, "--store", store, "ingest", "codex", sessions], env,
                                        [sessions]))
        runs["restic"].append(cpu_run(["restic", "backup", "-q", "--repo", repo, sessions], env, [sessions]))
        runs["restic, 1 core"].append(cpu_run(["restic", "backup", "-q", "--repo", repo1, sessions],
                                              dict(env, GOMAXPROCS="1"), [sessions]))
        h.run(["rm", "-rf", store, repo, repo1])
    h.progress("library floor")
    h.settle()
    h.warm(sessions)
    floor_parts = json.loads(h.output([sys.executable, "-c", FLOOR, sessions], env=env))
    floor = sum(floor_parts.values())
    wall = {name: statistics.median(w for w, _ in values) for name, values in runs.items()}
    cpu = {name: statistics.median(c for _, c in values) for name, values in runs.items()}
    h.table(f"Where the first ingest's CPU goes: {count} Codex session files, {h.fmt_bytes(size)} "
            f"(medians of {FIRST_RUNS}, alternating)",
            ["measure", "agentcas", "restic", "agentcas / restic"],
            [["wall, first ingest vs `restic backup`", h.fmt_time(wall["agentcas"]), h.fmt_time(wall["restic"]),
              h.fmt_ratio(h.ratio(wall["agentcas"], wall["restic"]))],
             ["CPU, all processes (user + system)", h.fmt_time(cpu["agentcas"]), h.fmt_time(cpu["restic"]),
              h.fmt_ratio(h.ratio(cpu["agentcas"], cpu["restic"]))],
             ["library floor, one process vs restic's CPU on one core (GOMAXPROCS=1)", h.fmt_time(floor),
              h.fmt_time(cpu["restic, 1 core"]), h.fmt_ratio(h.ratio(floor, cpu["restic, 1 core"]))],
             ["CPU above the floor (Python: per line, record, checkpoint, file; pipes; start-up)",
              h.fmt_time(cpu["agentcas"] - floor), "-", "-"]],
            ["Library floor, by part: " + ", ".join(f"{name} {h.fmt_time(value)}" for name, value in floor_parts.items())
             + ". It leaves out the per-record chain (one BLAKE3 of each record and one chain step, which the "
             "format needs) and the turn checkpoints. restic, 1 core: wall "
             f"{h.fmt_time(wall['restic, 1 core'])}. {h.load_note()}."])


def bench_replay(work: str, env: dict, big: int, small: int) -> None:
    pool = TextPool(2)
    store = os.path.join(work, "store-replay")
    h.run([h.AGENTCAS, "init", store], env=env)
    rows, seconds = [], {}
    for label, size in (("big", big), ("small", small)):
        h.progress(f"building a {size / MB:.0f} MB session")
        s = build_session(f"replay-{label}", size, pool, compaction_from_end=1 * MB)
        path = os.path.join(work, f"rollout-2026-11-30T10-00-00-replay-{label}.jsonl")
        with open(path, "wb") as handle:
            handle.write(s.data())
        h.run([h.AGENTCAS, "--store", store, "ingest", "codex", path], env=env)
        doc = in_process(store, "replay", f"codex/replay-{label}")
        cli = h.median_time(lambda: h.run([h.AGENTCAS, "--store", store, "--json", "replay",
                                           f"codex/replay-{label}"], env=env), 3)
        seconds[label] = doc["seconds"]
        tail = sum(map(len, s.lines[doc["compaction_line"]:]))
        rows.append([f"{h.fmt_bytes(os.path.getsize(path))} session", h.fmt_bytes(tail), doc["at"], doc["items"],
                     h.fmt_time(doc["seconds"]), h.fmt_time(cli)])
    rows.append(["ratio big / small", "", "", "", h.fmt_ratio(h.ratio(seconds["big"], seconds["small"])), ""])
    h.table("Replay at the head of a Codex session whose last compaction is 1 MB from the end",
            ["session", "after the compaction", "records", "items replayed", "replay (in-process, median of 5)",
             "`agentcas --json replay` (CLI, median of 3)"], rows,
            [f"Target: big within 1.5× of small ({h.verdict(seconds['big'] <= 1.5 * seconds['small'])}) "
             f"and under 1 s ({h.verdict(seconds['big'] < 1)}). {h.load_note()}."])


def bench_fork(work: str, env: dict, size: int) -> None:
    rows = []
    for output_bytes in (10_000, 40_000):
        pool = TextPool(3)
        store = os.path.join(work, f"store-fork-{output_bytes}")
        h.run([h.AGENTCAS, "init", store], env=env)
        parent = build_session(f"fork-parent-{output_bytes}", size, pool, turn_bytes=output_bytes * 4)
        child = CodexSession(f"fork-child-{output_bytes}", forked_from=f"fork-parent-{output_bytes}")
        copied = int(len(parent.lines) * 0.9)
        child.copy_lines(parent, copied)
        turn = child.start(prompt="a new direction")
        child.reply(pool.take(5000))
        child.complete(turn)
        paths = []
        for s, name in ((parent, "parent"), (child, "child")):
            path = os.path.join(work, f"rollout-2026-11-30T10-00-00-fork-{name}-{output_bytes}.jsonl")
            with open(path, "wb") as handle:
                handle.write(s.data())
            paths.append(path)
        h.run([h.AGENTCAS, "--store", store, "ingest", "codex", paths[0]], env=env)
        before = h.store_stats(store)["object_bytes"]
        h.run([h.AGENTCAS, "--store", store, "ingest", "codex", paths[1]], env=env)
        after = h.store_stats(store)["object_bytes"]
        alone = os.path.join(work, f"store-fork-alone-{output_bytes}")
        h.run([h.AGENTCAS, "init", alone], env=env)
        h.run([h.AGENTCAS, "--store", alone, "ingest", "codex", paths[1]], env=env)
        alone_bytes = h.store_stats(alone)["object_bytes"]
        rows.append([h.fmt_bytes(output_bytes), h.fmt_bytes(os.path.getsize(paths[1])), copied,
                     h.fmt_bytes(after - before), h.fmt_bytes(alone_bytes),
                     f"{100 * (after - before) / alone_bytes:.0f}%"])
    h.table("A Codex fork copying 90% of its parent's records (Codex gives every copied line a new timestamp)",
            ["tool output per call", "fork file", "copied records", "stored for the fork beside its parent",
             "fork stored alone", "copy cost (beside / alone)"], rows,
            ["A copied line is never byte-identical to its source (new `timestamp`), so only line bodies can "
             "dedupe: ingest chunks the body of a line of 32 KiB or more on its own (lineage/rollout.py "
             "`_stamp_regions`); shorter lines are one chunk a segment (up to 1 MiB) and are stored again."])


def main(argv) -> int:
    quick = "--quick" in argv
    count, total = (200, 100 * MB) if quick else (2000, 1000 * MB)
    big, small = (20 * MB, 4 * MB) if quick else (100 * MB, 10 * MB)
    print(f"## Harness sessions{' — quick sizes' if quick else ''}\n\n{h.machine_note()}\n")
    parts = next((a.split("=", 1)[1].split(",") for a in argv if a.startswith("--parts=")),
                 ["replay", "fork", "ingest"])
    with h.work_dir("harnesses") as work:
        env = h.env_for(work)
        if "replay" in parts:
            bench_replay(work, env, big, small)
        if "fork" in parts:
            bench_fork(work, env, 20 * MB if not quick else 5 * MB)
        if "ingest" in parts:
            bench_ingest(work, env, count, total)
        if "cpu" in parts:
            bench_cpu(work, env, count, total)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
