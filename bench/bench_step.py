"""The per-step hot path, each figure beside its peer in one run.

1. Bytes per checkpoint. One step appends one ~400-byte message to a JSONL rollout and
   rewrites one small file (`memory/state.json`), then checkpoints: agentcas through the
   CLI (`commit WS --rollout WS/rollout.jsonl`), agentcas through the Python API (a
   `Store` held open), and git (`git add -A && git commit`, the rollout being a tracked
   file). Growth is what `du` shows: data.mdb against the .git directory.
2. Start-up and the unchanged recommit of 1,000 files: `agentcas commit` (CLI) and
   `store.checkpoints.commit` (API, store held open) against `git add -A && git commit` on the same tree.
   `--help` and `--version` beside `python -c pass`.
3. Reading history: `rollout cat` of a ~100 MB history against `zstd -dc` of the same bytes
   compressed at the same level piped into `b3sum`; a `--from/--to` slice of 1% of it.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness as h  # noqa: E402
from datasets import Rollout, _Text, text_tree  # noqa: E402

STEPS = 300
TARGET_STEP_BYTES = 1024
ROUNDS = 7
CLICK = "python -c 'import click'"
API_READ_ROW = "Store.rollout_read to /dev/null (API, in process)"


CPU: dict = {}  # label -> CPU seconds (user + sys) of each timed run, children included


def timed(label: str, cmd, **kw) -> float:
    """h.run, also recording the CPU time the command (and its children) used: on a loaded
    machine wall time mostly measures the scheduler, CPU time what the work costs."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall = h.run(cmd, **kw)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    CPU.setdefault(label, []).append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return wall


def md(text: str) -> str:
    return text.replace("|", "\\|")


def step_message(text: _Text, step: int) -> bytes:
    """One ~400-byte chat message as a JSONL line."""
    content = text.sentence(40, 55)
    while len(content) < 320:
        content += " " + text.sentence(3, 6)
    doc = {"role": "user" if step % 2 == 0 else "assistant", "content": content[:330],
           "id": f"msg_{text.hexid(20)}", "step": step}
    return json.dumps(doc, separators=(",", ":")).encode() + b"\n"


def state_file(step: int) -> bytes:
    """The small file each step rewrites (~150 bytes of agent memory)."""
    return json.dumps({"step": step, "next_action": f"continue with item {step + 1}",
                       "partial_sum": step * (step + 1) // 2, "notes": "steady progress"},
                      indent=1).encode() + b"\n"


def make_workspace(path: str) -> None:
    os.makedirs(os.path.join(path, "memory"))
    with open(os.path.join(path, "AGENTS.md"), "w") as handle:
        handle.write("# Instructions\n\nSum the squares, one step at a time.\n")
    with open(os.path.join(path, "rollout.jsonl"), "wb"):
        pass


def do_step(workspace: str, text: _Text, step: int) -> int:
    line = step_message(text, step)
    with open(os.path.join(workspace, "rollout.jsonl"), "ab") as handle:
        handle.write(line)
    with open(os.path.join(workspace, "memory", "state.json"), "wb") as handle:
        handle.write(state_file(step))
    return len(line)


def bench_steps(work: str, steps: int) -> list[dict]:
    env = h.env_for(work)
    rows = []

    # agentcas through the CLI
    ws = os.path.join(work, "ws-cli")
    make_workspace(ws)
    store = os.path.join(work, "cli.agentcas")
    h.run([h.AGENTCAS, "init", store], env=env)
    data = os.path.join(store, "data.mdb")
    start_disk, times, text, msg = h.disk_bytes(data), [], _Text(13), 0
    for i in range(steps):
        msg += do_step(ws, text, i)
        times.append(h.run([h.AGENTCAS, "--store", store, "commit", ws, "-m", f"step {i}",
                                    "--rollout", os.path.join(ws, "rollout.jsonl")], env=env))
        if (i + 1) % 100 == 0:
            h.progress(f"step/cli: {i + 1}/{steps}")
    stats = h.store_stats(store)
    rows.append({"tool": "agentcas (CLI)", "growth": h.disk_bytes(data) - start_disk,
                 "times": times, "messages": msg, "payload": stats["payload"],
                 "pages": stats["used_bytes"]})

    # agentcas through the Python API, the store held open (in a child process, so this
    # process never holds an LMDB environment another process writes)
    ws = os.path.join(work, "ws-api")
    make_workspace(ws)
    store = os.path.join(work, "api.agentcas")
    out = h.output([h.PYTHON, "-c", API_STEPS, os.path.dirname(os.path.abspath(__file__)), store, ws,
                    str(steps)], env=env)
    api = json.loads(out)
    stats = h.store_stats(store)
    rows.append({"tool": "agentcas (Python API)", "growth": api["growth"], "times": api["times"],
                 "messages": api["messages"], "payload": stats["payload"], "pages": stats["used_bytes"]})

    # git: the same steps, the rollout a tracked file
    ws = os.path.join(work, "ws-git")
    make_workspace(ws)
    gitdir = os.path.join(work, "step.git")
    h.run(["git", "init", "-q", "--bare", gitdir], env=env)
    h.run(["git", f"--git-dir={gitdir}", "config", "core.bare", "false"], env=env)
    genv = dict(env, GIT_DIR=gitdir, GIT_WORK_TREE=ws)
    start_disk, times, text, msg = h.disk_bytes(gitdir), [], _Text(13), 0
    for i in range(steps):
        msg += do_step(ws, text, i)
        times.append(h.run(f"git add -A && git commit -q -m 'step {i}'", env=genv, cwd=ws,
                                   shell=True))
    rows.append({"tool": "git add -A && git commit", "growth": h.disk_bytes(gitdir) - start_disk,
                 "times": times, "messages": msg})
    h.run(["git", "gc", "-q", "--aggressive", "--prune=now"], env=genv, cwd=ws)
    rows.append({"tool": "git, after git gc --aggressive", "growth": h.disk_bytes(gitdir) - start_disk,
                 "times": None, "messages": msg})
    return rows


API_STEPS = r"""
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
from bench_step import _Text, do_step
from agentcas.repository import Store
store_path, ws, steps = sys.argv[2], sys.argv[3], int(sys.argv[4])
store, _ = Store.init(store_path)
data = os.path.join(store_path, "data.mdb")
disk = lambda: os.stat(data).st_blocks * 512
start, times, text, msg = disk(), [], _Text(13), 0
for i in range(steps):
    msg += do_step(ws, text, i)
    t = time.perf_counter()
    store.checkpoints.commit(ws, f"step {i}", rollout_file=os.path.join(ws, "rollout.jsonl"))
    times.append(time.perf_counter() - t)
print(json.dumps({"growth": disk() - start, "times": times, "messages": msg}))
"""


def report_steps(steps: int, rows: list[dict]) -> dict:
    table = []
    for r in rows:
        per = r["growth"] / steps
        t = r["times"]
        table.append([r["tool"], h.fmt_bytes(r["growth"]), h.fmt_bytes(per),
                      h.fmt_ratio(per / (rows[0]["growth"] / steps)) if rows[0]["growth"] else "-",
                      h.fmt_bytes(r.get("payload")) if r.get("payload") else "-",
                      h.fmt_time(statistics.median(t)) if t else "-",
                      h.fmt_time(max(t)) if t else "-"])
    table = [[md(row[0])] + row[1:] for row in table]
    h.table(f"{steps} steps: append one ~400-byte message to the rollout, rewrite one small file, "
            f"checkpoint ({h.fmt_bytes(rows[0]['messages'])} of messages)",
            ["tool", "store growth (du)", "per step", "per step / agentcas CLI",
             "keys+values (all tables)", "step time (median)", "step time (max)"], table,
            ["Growth: allocated blocks of data.mdb (agentcas) or of the git directory (git), "
             "from the empty store to the last step. The rollout file is inside the workspace "
             "(agentcas stores it once, as history; git tracks it as a file)."])
    return {"cli": rows[0]["growth"] / steps, "api": rows[1]["growth"] / steps}


# --- 2. start-up and the unchanged recommit ---------------------------------------------------

API_RECOMMIT = r"""
import json, sys, time
from agentcas.repository import Store
store = Store.open(sys.argv[1])
store.checkpoints.commit(sys.argv[2], "warm")
times = []
for _ in range(int(sys.argv[3])):
    t = time.perf_counter()
    doc = store.checkpoints.commit(sys.argv[2], "again").to_json()
    times.append(time.perf_counter() - t)
print(json.dumps({"times": times, "cached": doc["cached_files"], "files": doc["files"]}))
"""


def bench_recommit(work: str, rounds: int) -> dict:
    env = h.env_for(work)
    data = os.path.join(work, "tree")
    text_tree(data, 4 * 1024 * 1024, 1000)
    for root, _dirs, names in os.walk(data):  # old files: every one in agentcas's stat cache
        for name in names:
            os.utime(os.path.join(root, name), (1_600_000_000, 1_600_000_000))
    store = os.path.join(work, "rc.agentcas")
    gitdir = os.path.join(work, "rc.git")
    h.run([h.AGENTCAS, "init", store], env=env)
    h.run([h.AGENTCAS, "--store", store, "commit", data, "-m", "first"], env=env)
    genv = dict(env, GIT_DIR=gitdir, GIT_WORK_TREE=data)
    h.run(["git", "init", "-q"], env=genv, cwd=data)
    h.run("git add -A && git commit -q -m first", env=genv, cwd=data, shell=True)
    cli = [h.AGENTCAS, "--store", store, "commit", data, "-m", "again"]
    git = "git add -A && git commit -q --allow-empty --no-verify -m again"
    times = {"agentcas commit (CLI)": [], "git add -A && git commit": [], "agentcas --version": [],
             "agentcas --help": [], "python -c pass": [], "python -S -c pass": [],
             CLICK: []}
    for k in range(rounds):
        order = [("agentcas commit (CLI)", cli, False), ("git add -A && git commit", git, True)]
        for label, cmd, shell in (order if k % 2 == 0 else order[::-1]):
            times[label].append(timed(label, cmd, env=genv if shell else env, cwd=data, shell=shell))
        for label, cmd in (("agentcas --version", [h.AGENTCAS, "--version"]),
                           ("agentcas --help", [h.AGENTCAS, "--help"]),
                           ("python -c pass", [h.PYTHON, "-c", "pass"]),
                           ("python -S -c pass", [h.PYTHON, "-S", "-c", "pass"]),
                           # the CLI framework alone: a floor for any click command here
                           (CLICK, [h.PYTHON, "-c", "import click"])):
            times[label].append(timed(label, cmd, env=env))
    api = json.loads(h.output([h.PYTHON, "-c", API_RECOMMIT, store, data, str(3 * rounds)], env=env))
    times["agentcas checkpoints.commit (API, store open)"] = api["times"]
    return {"times": times, "cached": api["cached"], "files": api["files"]}


def report_recommit(r: dict) -> dict:
    t = {k: statistics.median(v) for k, v in r["times"].items()}
    git = t["git add -A && git commit"]
    cpu = {k: statistics.median(v) for k, v in CPU.items()}
    rows = [[md(label), h.fmt_time(t[label]), f"{h.fmt_time(min(v))}–{h.fmt_time(max(v))} of {len(v)}",
             h.fmt_ratio(t[label] / git), h.fmt_time(cpu.get(label)),
             h.fmt_ratio(cpu[label] / cpu["git add -A && git commit"]) if label in cpu else "-"]
            for label, v in r["times"].items()]
    h.table(f"Unchanged recommit of {r['files']} files (4 MiB of text), and start-up",
            ["command", "time (median)", "range", "time / git", "CPU (median)", "CPU / git"], rows,
            [f"The API row is checkpoints.commit in a process holding the store open ({r['cached']} of "
             f"{r['files']} files from the stat cache; its time is wall time in that process); the "
             "others are whole processes. CPU = user + sys of the process and its children. Rounds "
             "alternate which of agentcas and git goes first."])
    return t


# --- 3. reading history ---------------------------------------------------------------------------

def bench_read(work: str, size: int, rounds: int) -> dict:
    env = h.env_for(work)
    path = os.path.join(work, "history.jsonl")
    with open(path, "wb") as handle:
        handle.write(Rollout(3).take(size))
    store = os.path.join(work, "read.agentcas")
    h.run([h.AGENTCAS, "init", store], env=env)
    h.run([h.AGENTCAS, "--store", store, "rollout", "append", "big", path], env=env)
    from agentcas.cas.framing import ROLLOUT_ZSTD_LEVEL
    packed = path + ".zst"
    h.run(["zstd", "-q", f"-{ROLLOUT_ZSTD_LEVEL}", "-f", path, "-o", packed], env=env)
    out = os.path.join(work, "cat.out")
    h.run(f"{h.AGENTCAS} --store {store} rollout cat big > {out}", env=env, shell=True)
    identical = open(out, "rb").read() == open(path, "rb").read()
    os.unlink(out)
    records = sum(1 for _ in open(path, "rb"))
    lo, hi = records // 2, records // 2 + records // 100
    cmds = {"agentcas rollout cat > /dev/null": f"{h.AGENTCAS} --store {store} rollout cat big > /dev/null",
            f"zstd -dc (level {ROLLOUT_ZSTD_LEVEL}) | b3sum": f"zstd -dc {packed} | b3sum > /dev/null",
            "agentcas rollout cat | b3sum": f"{h.AGENTCAS} --store {store} rollout cat big | b3sum > /dev/null",
            f"agentcas rollout cat --from {lo} --to {hi} (1%)":
                f"{h.AGENTCAS} --store {store} rollout cat big --from {lo} --to {hi} > /dev/null",
            "agentcas --version": f"{h.AGENTCAS} --version > /dev/null"}
    times = {label: [] for label in cmds}
    for k in range(rounds):
        items = list(cmds.items())
        for label, cmd in (items if k % 2 == 0 else items[::-1]):
            times[label].append(timed(label, cmd, env=env, shell=True))
    # The same read inside one process (no start-up): what the command's own work costs.
    times[API_READ_ROW] = json.loads(
        h.output([h.PYTHON, "-c", API_READ, store, str(rounds)], env=env))
    return {"times": times, "size": os.path.getsize(path), "packed": os.path.getsize(packed),
            "identical": identical, "records": records}


API_READ = r"""
import json, os, sys, time
from agentcas.repository import Store
store, times = Store.open(sys.argv[1]), []
fd = os.open(os.devnull, os.O_WRONLY)
for _ in range(int(sys.argv[2])):
    t = time.perf_counter()
    for piece in store.history.read("big", 0, None):
        os.write(fd, piece)
    times.append(time.perf_counter() - t)
print(json.dumps(times))
"""


def report_read(r: dict) -> dict:
    t = {k: statistics.median(v) for k, v in r["times"].items()}
    floor = next(v for k, v in t.items() if k.startswith("zstd"))
    cpu = {k: statistics.median(CPU[k]) for k in r["times"] if k in CPU}
    cpu_floor = next(v for k, v in cpu.items() if k.startswith("zstd"))
    rows = [[md(label), h.fmt_time(t[label]), f"{h.fmt_time(min(v))}–{h.fmt_time(max(v))} of {len(v)}",
             h.fmt_ratio(t[label] / floor), h.fmt_time(cpu.get(label)),
             h.fmt_ratio(cpu[label] / cpu_floor) if label in cpu else "-"]
            for label, v in r["times"].items()]
    t["cpu"] = cpu
    h.table(f"Read a {h.fmt_bytes(r['size'])} history ({r['records']} records; zstd file "
            f"{h.fmt_bytes(r['packed'])})", ["command", "time (median)", "range", "time / zstd \\| b3sum",
                                              "CPU (median)", "CPU / zstd \\| b3sum"],
            rows, [f"Output identical to the appended file: {'yes' if r['identical'] else 'NO'}. "
                   "agentcas verifies every chunk (BLAKE3) while decompressing; the peer is "
                   "`zstd -dc` of the same bytes compressed at the level agentcas uses for rollouts, "
                   "piped into `b3sum`. The API row is the same read in a process holding the "
                   "store open (wall time in that process): the command's own work without start-up."])
    return t


def main(argv: list[str]) -> int:
    quick = "--quick" in argv
    load = h.load_note()
    with h.work_dir("step") as work:
        h.progress(f"step: {STEPS} steps through the CLI, the API and git")
        per = report_steps(STEPS, bench_steps(work, STEPS))
    with h.work_dir("recommit") as work:
        h.progress("step: unchanged recommit of 1,000 files")
        rc = report_recommit(bench_recommit(work, 5 if quick else ROUNDS))
    with h.work_dir("read") as work:
        size = (20 if quick else 100) * 1000 * 1000
        h.progress(f"step: reading a {h.fmt_bytes(size)} history")
        rd = report_read(bench_read(work, size, 3 if quick else 5))
    git = rc["git add -A && git commit"]
    cat = rd["agentcas rollout cat > /dev/null"]
    floor = next(v for k, v in rd.items() if k.startswith("zstd"))
    cpu_cat = rd["cpu"]["agentcas rollout cat > /dev/null"]
    cpu_floor = next(v for k, v in rd["cpu"].items() if k.startswith("zstd"))
    cpu_git = statistics.median(CPU["git add -A && git commit"])
    cpu_cli = statistics.median(CPU["agentcas commit (CLI)"])
    targets = [["bytes per step ≤ 1 KiB (CLI, du of data.mdb)", h.fmt_bytes(per["cli"]),
                h.verdict(per["cli"] <= TARGET_STEP_BYTES)],
               ["bytes per step ≤ 1 KiB (API, du of data.mdb)", h.fmt_bytes(per["api"]),
                h.verdict(per["api"] <= TARGET_STEP_BYTES)],
               ["unchanged recommit (CLI) ≤ 4× git add -A && git commit",
                f"{h.fmt_time(rc['agentcas commit (CLI)'])} vs {h.fmt_time(git)} "
                f"({h.fmt_ratio(rc['agentcas commit (CLI)'] / git)})",
                h.verdict(rc["agentcas commit (CLI)"] <= 4 * git)],
               ["... in CPU time (user + sys)", f"{h.fmt_time(cpu_cli)} vs {h.fmt_time(cpu_git)} "
                f"({h.fmt_ratio(cpu_cli / cpu_git)})", h.verdict(cpu_cli <= 4 * cpu_git)],
               ["unchanged recommit (API, store open) ≤ git's whole process",
                f"{h.fmt_time(rc['agentcas checkpoints.commit (API, store open)'])} vs {h.fmt_time(git)}",
                h.verdict(rc["agentcas checkpoints.commit (API, store open)"] <= git)],
               ["rollout cat ≤ zstd -dc \\| b3sum", f"{h.fmt_time(cat)} vs {h.fmt_time(floor)} "
                f"({h.fmt_ratio(cat / floor)})", h.verdict(cat <= floor)],
               ["... in CPU time (user + sys)", f"{h.fmt_time(cpu_cat)} vs {h.fmt_time(cpu_floor)} "
                f"({h.fmt_ratio(cpu_cat / cpu_floor)})", h.verdict(cpu_cat <= cpu_floor)],
               ["(for scale: python -c 'import click', the CLI framework alone, vs git's recommit)",
                f"{h.fmt_time(rc[CLICK])} ({h.fmt_ratio(rc[CLICK] / git)})", "-"],
               ["(for scale: the same read in process, vs zstd -dc \\| b3sum)",
                f"{h.fmt_time(rd[API_READ_ROW])} ({h.fmt_ratio(rd[API_READ_ROW] / floor)})", "-"]]
    h.table("Per-step targets", ["target", "measured", "met"], targets)
    print(f"Load: {load} at start, {h.load_note()} at end.\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
