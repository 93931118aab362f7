"""Rollout numbers: rollouts (append, fork, snapshots of a growing JSONL file, cat).

1. Append 1 KiB to a 100 MB rollout vs to a 1 MB rollout: new storage and time.
2. Fork of a thread with 100 MB of history: new storage, in-process time (store.threads.fork).
3. A 200 MB JSONL rollout snapshotted 11 times, 1 MB appended between snapshots
   (`commit --rollout`), vs restic, borg and git on the same sequence of files.
4. `rollout cat` of 100 MB vs `cat` of the same file.
(The LangGraph workload is bench_langgraph.py.)

"CLI" times run the real `agentcas` executable (Python start-up included, ~0.3 s here);
"in-process" times run the Python API in a separate worker process that opened the
store once (`python bench_rollout.py --worker ...`), as a harness embedding agentcas does.
Sizes are LMDB pages in use (`used_bytes`) and the sum of stored object sizes.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness as h  # noqa: E402
from datasets import Rollout  # noqa: E402

MB = 1_000_000


def kib_record(rollout: Rollout, size: int = 1024) -> bytes:
    """One JSONL record of exactly `size` bytes (an assistant message padded with text)."""
    base = {"type": "message", "role": "assistant", "seq": rollout.seq, "content": ""}
    rollout.seq += 1
    text = ""
    while True:
        base["content"] = text
        line = json.dumps(base, separators=(",", ":")).encode() + b"\n"
        if len(line) >= size:
            break
        text += " " + rollout.text.pooled_sentence()
    over = len(line) - size
    base["content"] = text[:len(text) - over]
    line = json.dumps(base, separators=(",", ":")).encode() + b"\n"
    assert len(line) == size, len(line)
    return line


# --- workers: in-process measurements in a fresh process ---------------------------------------

def worker(name: str, args: list[str]) -> None:
    from agentcas.cas.store import TABLES
    from agentcas.repository import Store
    store = Store.open(args[0])
    used = store.environment.used_bytes

    def payload() -> int:
        with store.environment.reader() as txn:
            return sum(len(k) + len(v) for table in TABLES for k, v in txn.scan(table))

    out: dict = {}
    if name == "append":  # store thread file repeat
        thread, path, repeat = args[1], args[2], int(args[3])
        data = open(path, "rb").read().splitlines(keepends=True)
        times, deltas = [], []
        for i in range(repeat):
            before = used()
            start = time.perf_counter()
            store.history.append(thread, data[i])
            times.append(time.perf_counter() - start)
            deltas.append(used() - before)
        out = {"times": times, "used_deltas": deltas}
    elif name == "fork":  # store thread repeat
        thread, repeat = args[1], int(args[2])
        seq = store.threads.get(thread).history.seq
        times, deltas, mid_times, payloads = [], [], [], []
        for i in range(repeat):
            before, before_payload = used(), payload()
            start = time.perf_counter()
            store.threads.fork(thread, f"{thread}-fork{i}")
            times.append(time.perf_counter() - start)
            deltas.append(used() - before)
            payloads.append(payload() - before_payload)
            start = time.perf_counter()
            store.threads.fork(thread, f"{thread}-mid{i}", at=seq // 2 + i)
            mid_times.append(time.perf_counter() - start)
        out = {"times": times, "used_deltas": deltas, "mid_times": mid_times, "seq": seq,
               "payload_deltas": payloads}
    elif name == "cat":  # store thread
        start = time.perf_counter()
        total = sum(len(piece) for piece in store.history.read(args[1]))
        out = {"time": time.perf_counter() - start, "bytes": total}
    elif name == "snapshots":  # store workspace rollout_file steps step_bytes seed
        workspace, path, steps, step_bytes, seed = args[1], args[2], int(args[3]), int(args[4]), int(args[5])
        rollout = Rollout(seed)
        times = []
        for i in range(steps):
            if i:
                rollout.write(path, step_bytes)
            start = time.perf_counter()
            store.checkpoints.commit(workspace, f"snapshot {i}", thread="main", rollout_file=path)
            times.append(time.perf_counter() - start)
        out = {"times": times}
    print(json.dumps(out))


def run_worker(name: str, *args) -> dict:
    return json.loads(h.output([h.PYTHON, os.path.abspath(__file__), "--worker", name, *map(str, args)]))


# --- the benchmark ---------------------------------------------------------------------------

def bench_append_fork_cat(work: str, env: dict, big_bytes: int, quick: bool) -> dict:
    r: dict = {}
    store = os.path.join(work, "s.agentcas")
    h.run([h.AGENTCAS, "init", store], env=env)
    files = {}
    for thread, size in (("big", big_bytes), ("small", MB)):
        path = os.path.join(work, f"{thread}.jsonl")
        h.progress(f"rollout: writing a {h.fmt_bytes(size)} rollout for thread {thread}")
        Rollout(seed=10 if thread == "big" else 11).write(path, size, mode="wb")
        files[thread] = path
        before = h.store_stats(store)
        t = h.run([h.AGENTCAS, "--store", store, "rollout", "append", thread, path], env=env)
        after = h.store_stats(store)
        r[f"{thread}_initial"] = {"bytes": os.path.getsize(path), "time": t,
                                  "used": after["used_bytes"] - before["used_bytes"],
                                  "objects": after["object_bytes"] - before["object_bytes"]}

    # 1. append 1 KiB -------------------------------------------------------------------
    repeat = 5
    for thread in ("big", "small"):
        h.progress(f"rollout: 1 KiB appends to {thread}")
        rollout = Rollout(seed=20)
        cli_times, cli_used, cli_objects = [], [], []
        for i in range(repeat):
            record = kib_record(rollout)
            one = os.path.join(work, "one.jsonl")
            with open(one, "wb") as handle:
                handle.write(record)
            with open(files[thread], "ab") as handle:  # keep the file == the history, for cat
                handle.write(record)
            before = h.store_stats(store)
            cli_times.append(h.run([h.AGENTCAS, "--store", store, "rollout", "append", thread, one], env=env))
            after = h.store_stats(store)
            cli_used.append(after["used_bytes"] - before["used_bytes"])
            cli_objects.append(after["payload"] - before["payload"])
        batch = os.path.join(work, "batch.jsonl")
        records = [kib_record(rollout) for _ in range(3 * repeat)]  # in-process: cheap, so more samples
        with open(batch, "wb") as handle:
            handle.write(b"".join(records))
        with open(files[thread], "ab") as handle:
            handle.write(b"".join(records))
        inproc = run_worker("append", store, thread, batch, 3 * repeat)
        r[f"append_{thread}"] = {"cli_time": statistics.median(cli_times), "cli_used": max(cli_used),
                                 "cli_objects": max(cli_objects),
                                 "inproc_time": statistics.median(inproc["times"]),
                                 "inproc_used": max(inproc["used_deltas"])}

    # 2. fork ---------------------------------------------------------------------------
    h.progress("rollout: forks")
    r["fork"] = run_worker("fork", store, "big", repeat)
    before = h.store_stats(store)
    r["fork"]["cli_time"] = h.run([h.AGENTCAS, "--store", store, "fork", "big", "big-cli"], env=env)
    r["fork"]["cli_used"] = h.store_stats(store)["used_bytes"] - before["used_bytes"]

    # 4. cat ----------------------------------------------------------------------------
    h.progress("rollout: cat")
    path = files["big"]
    size = os.path.getsize(path)
    out = os.path.join(work, "cat.out")
    h.run(f"{h.AGENTCAS} --store {store} rollout cat big > {out}", env=env, shell=True)
    r["cat_identical"] = open(out, "rb").read() == open(path, "rb").read()
    os.unlink(out)
    cat = {}
    reps = 5
    for label, cmd in (("agentcas rollout cat > /dev/null", f"{h.AGENTCAS} --store {store} rollout cat big > /dev/null"),
                       ("cat > /dev/null", f"cat {path} > /dev/null"),
                       ("agentcas rollout cat | wc -c", f"{h.AGENTCAS} --store {store} rollout cat big | wc -c"),
                       ("cat | wc -c", f"cat {path} | wc -c")):
        cat[label] = h.median_time(lambda: h.run(cmd, env=env, shell=True), reps)
    cat["in-process Store.rollout_read"] = statistics.median(run_worker("cat", store, "big")["time"]
                                                             for _ in range(3))
    r["cat"] = cat
    r["cat_bytes"] = size
    return r


def bench_snapshots(work: str, env: dict, initial: int, step: int, count: int, quick: bool) -> dict:
    """A growing rollout snapshotted `count` times by every tool (same files, same order)."""
    r: dict = {"initial": initial, "step": step, "count": count}
    agent = os.path.join(work, "agent")
    workspace = os.path.join(agent, "workspace")
    os.makedirs(workspace)
    for name, text in (("notes.md", "# task\nfix the failing test\n"), ("plan.json", '{"step": 1}\n')):
        with open(os.path.join(workspace, name), "w") as handle:
            handle.write(text)
    path = os.path.join(agent, "rollout.jsonl")
    h.progress(f"snapshots: writing the initial {h.fmt_bytes(initial)} rollout")
    rollout = Rollout(seed=30)
    rollout.write(path, initial, mode="wb")
    with open(path, "rb") as handle:
        first_bytes = handle.read()
    time.sleep(2.2)  # the workspace files are older than the racy window, as in real use

    store, gitdir, restic_repo, borg_repo = h.init_repos(work, "s.agentcas", env)

    times = {"agentcas": [], "git": [], "restic": [], "borg": []}
    for i in range(count):
        if i:
            rollout.write(path, step)
        h.progress(f"snapshots: snapshot {i + 1}/{count} ({h.fmt_bytes(os.path.getsize(path))})")
        # warm_paths: borg evicts what it reads from the page cache; everyone reads warm.
        times["agentcas"].append(h.run([h.AGENTCAS, "--store", store, "commit", workspace, "-m", f"s{i}",
                                        "--rollout", path], env=env, warm_paths=(agent,)))
        t = h.run(["git", f"--git-dir={gitdir}", f"--work-tree={agent}", "add", "-A"], env=env, warm_paths=(agent,))
        times["git"].append(t + h.run(["git", f"--git-dir={gitdir}", f"--work-tree={agent}", "commit", "-q",
                                       "--no-verify", "-m", f"s{i}"], env=env))
        times["restic"].append(h.run(["restic", "-q", "--repo", restic_repo, "backup", agent], env=env,
                                     warm_paths=(agent,)))
        times["borg"].append(h.run(["borg", "create", f"{borg_repo}::s{i}", agent], env=env, warm_paths=(agent,)))
    r["times"] = times
    r["final_bytes"] = os.path.getsize(path)
    r["agentcas_stats"] = h.store_stats(store)
    r["sizes"] = {"agentcas": h.disk_bytes(store), "git": h.disk_bytes(gitdir),
                  "restic": h.disk_bytes(restic_repo), "borg": h.disk_bytes(borg_repo)}
    h.progress("snapshots: git gc")
    r["git_gc_time"] = h.run(["git", f"--git-dir={gitdir}", "gc", "-q"], env=env)
    r["sizes"]["git after gc"] = h.disk_bytes(gitdir)

    # The same sequence in-process (a fresh store; same bytes: rewind the file).
    h.progress("snapshots: the same sequence through the Python API")
    with open(path, "wb") as handle:
        handle.write(first_bytes)
    store2 = os.path.join(work, "s2.agentcas")
    h.run([h.AGENTCAS, "init", store2], env=env)
    r["inproc_times"] = run_worker("snapshots", store2, workspace, path, count, step, 30)["times"]
    r["agentcas_inproc_stats"] = h.store_stats(store2)
    return r


def report(r: dict, s: dict) -> None:
    big, small = r["append_big"], r["append_small"]
    rows = []
    for label, a in ((f"{h.fmt_bytes(r['big_initial']['bytes'])} rollout", big),
                     (f"{h.fmt_bytes(r['small_initial']['bytes'])} rollout", small)):
        rows.append([label, h.fmt_bytes(a["cli_used"]), h.fmt_bytes(a["cli_objects"]), h.fmt_time(a["cli_time"]),
                     h.fmt_bytes(a["inproc_used"]), h.fmt_time(a["inproc_time"])])
    rows.append(["big / small", "", "", h.fmt_ratio(h.ratio(big["cli_time"], small["cli_time"])), "",
                 h.fmt_ratio(h.ratio(big["inproc_time"], small["inproc_time"]))])
    bi, si = r["big_initial"], r["small_initial"]
    h.table("Append one 1 KiB record (median of 5 CLI runs, of 15 in-process appends)",
            ["history", "new pages (CLI)", "new keys+values (CLI)", "CLI time", "new pages (in-process)",
             "in-process time"], rows,
            [f"The histories were loaded with one `rollout append` each: {h.fmt_bytes(bi['bytes'])} in "
             f"{h.fmt_time(bi['time'])} ({h.fmt_bytes(bi['used'])} of pages), {h.fmt_bytes(si['bytes'])} in "
             f"{h.fmt_time(si['time'])}. New pages = growth of LMDB pages in use (4 KiB granularity, "
             f"freed pages are reused); new keys+values = growth of every table's keys and values (chunk, "
             f"segment, ref, reflog entry)."])

    f = r["fork"]
    rows = [["agentcas threads.fork (whole history)", h.fmt_time(statistics.median(f["times"])),
             h.fmt_time(max(f["times"])), h.fmt_bytes(max(f["used_deltas"])), h.fmt_bytes(max(f["payload_deltas"]))],
            [f"agentcas threads.fork --at {f['seq'] // 2}", h.fmt_time(statistics.median(f["mid_times"])),
             h.fmt_time(max(f["mid_times"])), "-", "-"],
            ["agentcas fork (CLI)", h.fmt_time(f["cli_time"]), "-", h.fmt_bytes(f["cli_used"]), "-"],
            ["a copy of the rollout file", "-", "-", h.fmt_bytes(r["big_initial"]["bytes"]), ""]]
    h.table(f"Fork of a thread with {h.fmt_bytes(r['big_initial']['bytes'])} of history ({f['seq']} records)",
            ["operation", "median time", "max time", "new pages (max)", "new keys+values (max)"], rows,
            ["In-process = the Python API in a process that has the store open (median/max of 5). New keys+values = "
             "growth of every table's keys and values (the ref and its reflog entry); pages = LMDB pages in use "
             "(freed pages are reused, so 0 is possible)."])

    c = r["cat"]
    rows = []
    for label, t in c.items():
        rows.append([label, h.fmt_time(t), f"{r['cat_bytes'] / t / 2**20:.0f} MiB/s"])
    rows.append(["speed agentcas / cat (> /dev/null)", h.fmt_ratio(c["cat > /dev/null"] / c["agentcas rollout cat > /dev/null"]), ""])
    rows.append(["speed agentcas / cat (| wc -c)", h.fmt_ratio(c["cat | wc -c"] / c["agentcas rollout cat | wc -c"]), ""])
    h.table(f"Read a {h.fmt_bytes(r['cat_bytes'])} rollout (median of 5)", ["command", "time", "throughput"], rows,
            [f"Output identical to the file: {'yes' if r['cat_identical'] else 'NO'}. Every chunk read is verified "
             f"(BLAKE3) and, if compressed, decompressed."])

    t = s["times"]
    later = {tool: t[tool][1:] for tool in t}
    rows = []
    for tool in ("agentcas", "restic", "borg", "git", "git after gc"):
        size = s["sizes"][tool]
        tt = t.get(tool)
        rows.append([tool, h.fmt_bytes(size), h.fmt_ratio(h.ratio(size, s["sizes"]["agentcas"])),
                     h.fmt_time(tt[0]) if tt else h.fmt_time(s["git_gc_time"]) + " (gc)",
                     h.fmt_time(statistics.median(later[tool])) if tt else "-",
                     h.fmt_time(max(later[tool])) if tt else "-"])
    inproc = s["inproc_times"]
    rows.append(["agentcas (Python API)", h.fmt_bytes(s["agentcas_inproc_stats"]["used_bytes"]) + " (pages)", "",
                 h.fmt_time(inproc[0]), h.fmt_time(statistics.median(inproc[1:])), h.fmt_time(max(inproc[1:]))])
    st = s["agentcas_stats"]
    h.table(f"A {h.fmt_bytes(s['initial'])} rollout snapshotted {s['count']} times, "
            f"{h.fmt_bytes(s['step'])} appended between snapshots (final file {h.fmt_bytes(s['final_bytes'])})",
            ["tool", "store on disk", "size / agentcas", "first snapshot", "later: median", "later: max"], rows,
            [f"agentcas: {h.fmt_bytes(st['used_bytes'])} of LMDB pages in use, {st['objects']} objects holding "
             f"{h.fmt_bytes(st['object_bytes'])}. agentcas commits a 2-file workspace with `--rollout FILE`; "
             f"the other tools back up the directory holding both."])

    rows = [
        ["append 1 KiB to 100 MB: new storage < 256 KiB",
         f"{h.fmt_bytes(max(big['cli_used'], big['inproc_used']))} pages, {h.fmt_bytes(big['cli_objects'])} keys+values",
         h.verdict(max(big["cli_used"], big["inproc_used"], big["cli_objects"]) < 256 << 10)],
        ["append 1 KiB: time 100 MB ≤ 2× time 1 MB (in-process)",
         f"{h.fmt_time(big['inproc_time'])} vs {h.fmt_time(small['inproc_time'])}",
         h.verdict(big["inproc_time"] <= 2 * small["inproc_time"])],
        ["append 1 KiB: time 100 MB ≤ 2× time 1 MB (CLI)",
         f"{h.fmt_time(big['cli_time'])} vs {h.fmt_time(small['cli_time'])}",
         h.verdict(big["cli_time"] <= 2 * small["cli_time"])],
        ["fork of 100 MB: new storage < 16 KiB",
         f"{h.fmt_bytes(max(f['used_deltas']))} pages, {h.fmt_bytes(max(f['payload_deltas']))} keys+values",
         h.verdict(max(max(f["used_deltas"]), max(f["payload_deltas"])) < 16 << 10)],
        ["fork of 100 MB: < 50 ms in-process", f"median {h.fmt_time(statistics.median(f['times']))}, "
         f"max {h.fmt_time(max(f['times']))}", h.verdict(max(f["times"]) < 0.05)],
        [f"{s['count']} snapshots: store ≤ restic",
         f"{h.fmt_bytes(s['sizes']['agentcas'])} vs {h.fmt_bytes(s['sizes']['restic'])}",
         h.verdict(s["sizes"]["agentcas"] <= s["sizes"]["restic"])],
        ["later snapshots < 0.25 s (in-process)", f"max {h.fmt_time(max(inproc[1:]))}",
         h.verdict(max(inproc[1:]) < 0.25)],
        ["later snapshots < 0.25 s (CLI, start-up included)", f"max {h.fmt_time(max(later['agentcas']))}",
         h.verdict(max(later["agentcas"]) < 0.25)],
        ["rollout cat ≥ ½ the speed of cat (> /dev/null)",
         f"{h.fmt_ratio(c['cat > /dev/null'] / c['agentcas rollout cat > /dev/null'])}",
         h.verdict(c["agentcas rollout cat > /dev/null"] <= 2 * c["cat > /dev/null"])],
        ["rollout cat ≥ ½ the speed of cat (| wc -c)",
         f"{h.fmt_ratio(c['cat | wc -c'] / c['agentcas rollout cat | wc -c'])}",
         h.verdict(c["agentcas rollout cat | wc -c"] <= 2 * c["cat | wc -c"])],
    ]
    h.table("Rollout targets", ["target", "measured", "met"], rows)


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--worker":
        worker(argv[1], argv[2:])
        return 0
    quick = "--quick" in argv
    big = 10 * MB if quick else 100 * MB
    initial, step, count = (20 * MB, MB, 4) if quick else (200 * MB, MB, 11)
    load = h.load_note()
    with h.work_dir("rollout") as work:
        r = bench_append_fork_cat(work, h.env_for(work), big, quick)
    with h.work_dir("snapshots") as work:
        s = bench_snapshots(work, h.env_for(work), initial, step, count, quick)
    report(r, s)
    print(f"Load: {load} at start, {h.load_note()} at end.\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
