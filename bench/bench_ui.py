"""The web view (`agentcas ui`) on a large store: 1,000 threads and 100,000 checkpoints
(--quick: 100 threads, 10,000 checkpoints).

The store (bench-only generator, `build`): `main` holds a fifth of the checkpoints (the long
thread), the other threads share the rest. Thread k forks from an earlier thread (main with
probability 0.3, else one of the earlier threads, seeded) at a random record of its history
with the real `store.threads.fork`; each thread then gets one own rollout record per checkpoint (one
append each, so one history segment each, as commits with a rollout make them) and its
checkpoints in one group write through the public `store.threads.group_writer` (the LangGraph
saver's write path: objects in memory, one transaction per thread), so no workspace is
snapshotted 100,000 times. Every checkpoint shares one small tree.

Measured, against a real `agentcas ui` process over HTTP on 127.0.0.1: the first request of
each page, then REPEAT more: p50 and p95 time to the full answer, and the answer's size,
for the lineage page (folded), the long thread's page (the newest 50 checkpoints and its
effects), an ordinary thread's page, and /api/threads (a 200-row page). Beside them, what a user
would otherwise run: `agentcas lineage` and `agentcas log main -n 50` (each a new process,
the whole tree / the same 50 checkpoints as text), p50 of REPEAT_CLI runs, as ratios.
Pass: the lineage and the long thread's page p50 under 300 ms, and their sizes bounded (the
same order at --quick and full size: compare the two runs' tables).
"""

from __future__ import annotations

import http.client
import os
import random
import statistics
import subprocess
import sys
import time
from urllib.parse import urlsplit

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness as h  # noqa: E402

REPEAT = 30
REPEAT_CLI = 5
BUDGET = 0.300
SEED = 30


def build(store, threads: int, checkpoints: int) -> dict:
    """The store described in the module's docstring; {thread: number of its checkpoints}."""
    from agentcas.cas.objects import EMPTY_POSITION
    from agentcas.refs.threads import ThreadState
    rng = random.Random(SEED)
    long_thread = checkpoints // 5
    per_thread = [long_thread] + [(checkpoints - long_thread) // (threads - 1)] * (threads - 1)
    per_thread[-1] += checkpoints - sum(per_thread)
    names = ["main"] + [f"agent-{k:04d}/try" for k in range(1, threads)]
    files = {f"memory/note{i:02d}.md": f"note {i}\n".encode() for i in range(20)}
    files["task.json"] = b'{"step": 1}\n'
    made = {}
    for k, name in enumerate(names):
        if k:
            parent = "main" if rng.random() < 0.3 else names[rng.randrange(k)]
            records = store.threads.get(parent).history.seq
            store.threads.fork(parent, name, rng.randint(0, records))
        count = per_thread[k]
        with store.threads.group_writer(f"bench {name}") as writer:
            tree = writer.store_tree(files)
            # One record appended per checkpoint, each append its own segment, as commits make them.
            appends = [writer.prepare_records(b'{"type":"message","role":"assistant","thread":%d,"step":%d}\n'
                                              % (k, i)) for i in range(count)]

            def plan(view, name=name, tree=tree, appends=appends):
                state = view.thread(name)   # None for main: a new thread
                head = state.history if state is not None else EMPTY_POSITION
                parent = state.checkpoint if state is not None else None
                for i, prepared in enumerate(appends):
                    head = view.link(head, prepared)
                    parent = view.commit(name, tree, (parent,) if parent is not None else (),
                                         f"step {i} of {name}", head, "bench")
                view.set_thread(name, state, ThreadState(parent, head, state.forked_from if state else None),
                                "commit", f"bench: {len(appends)} checkpoints", history_implied=True)
            writer.land(plan)
        made[name] = count
        if k % 100 == 0:
            h.progress(f"  {k + 1} threads, {sum(made.values())} checkpoints")
    return made


def get(base: str, path: str) -> tuple[float, int]:
    """(seconds to the whole answer, body bytes) of one GET (a new connection, as a browser's first)."""
    parts = urlsplit(base)
    start = time.perf_counter()
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=120)
    conn.request("GET", path)
    response = conn.getresponse()
    body = response.read()
    elapsed = time.perf_counter() - start
    conn.close()
    assert response.status == 200, (path, response.status, body[:300])
    return elapsed, len(body)


def percentile(times: list[float], q: float) -> float:
    ordered = sorted(times)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def main(argv: list[str]) -> int:
    quick = "--quick" in argv
    threads, checkpoints = (100, 10_000) if quick else (1_000, 100_000)
    from agentcas import Store
    rows, ok = [], True
    with h.work_dir("ui") as work:
        path = os.path.join(work, "store")
        store, _ = Store.init(path)
        h.progress(f"building {threads} threads, {checkpoints} checkpoints")
        t0 = time.perf_counter()
        made = build(store, threads, checkpoints)
        build_time = time.perf_counter() - t0
        ordinary = sorted(made)[len(made) // 2]
        store.close()
        proc = subprocess.Popen([h.AGENTCAS, "--store", path, "ui", "--no-browser"], stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True)
        try:
            url = proc.stdout.readline().strip()
            parts = urlsplit(url)
            base, token = f"http://{parts.netloc}", parts.query
            pages = [("lineage (folded)", f"/?{token}", True),
                     ("thread main (long: newest 50 of " + str(made["main"]) + ")", f"/thread/main?{token}", True),
                     (f"thread {ordinary} ({made[ordinary]} checkpoints)", f"/thread/{ordinary}?{token}", False),
                     ("/api/threads (first 200)", f"/api/threads?{token}", False),
                     ("/api/thread/main (first 200)", f"/api/thread/main?{token}", False)]
            for label, page, judged in pages:
                h.progress(f"GET {label}")
                first, _ = get(base, page)
                samples = [get(base, page) for _ in range(REPEAT)]
                times = [t for t, _ in samples]
                size = samples[-1][1]
                p50 = statistics.median(times)
                passed = p50 < BUDGET if judged else None
                ok = ok and passed is not False
                rows.append([label, h.fmt_time(first), h.fmt_time(p50), h.fmt_time(percentile(times, 0.95)),
                             h.fmt_bytes(size), h.verdict(passed)])
        finally:
            proc.terminate()
            proc.wait(timeout=30)
        cli_rows = []
        for label, args, page_p50 in (("agentcas lineage", ["lineage"], rows[0][2]),
                                      ("agentcas log main -n 50", ["log", "main", "-n", "50"], rows[1][2])):
            h.progress(f"CLI: {label}")
            times, size = [], 0
            for _ in range(REPEAT_CLI):
                start = time.perf_counter()
                out = subprocess.run([h.AGENTCAS, "--store", path, *args], capture_output=True, check=True).stdout
                times.append(time.perf_counter() - start)
                size = len(out)
            cli_rows.append([label, h.fmt_time(statistics.median(times)), h.fmt_bytes(size), page_p50])
    h.table(f"Web view on {threads:,} threads / {checkpoints:,} checkpoints (built in {h.fmt_time(build_time)})",
            ["page", "first GET", "p50", "p95", "size", f"p50 < {int(BUDGET * 1000)} ms"], rows,
            [f"The first GET of each page (in this order, on a server that has answered nothing before), "
             f"then {REPEAT} more, each on a new connection; {h.load_note()}. The server keeps the "
             "decoded ref rows and each checkpoint's effect counts (immutable) between requests."])
    h.table("What a user would otherwise run (a new process each, text on stdout)",
            ["command", "p50", "output", "the view's page p50"], cli_rows,
            [f"{REPEAT_CLI} runs each. `agentcas lineage` prints the whole tree; the lineage page is folded "
             "to at most 200 rows."])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
