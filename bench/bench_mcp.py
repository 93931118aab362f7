"""Pages of the MCP tools and of the effects ledger on one very long thread.

One thread with N checkpoints (100,000; --quick 10,000) and N effects in its history:
  - effects: N `agentcas.effect` records (a new effect each) plus N/5 later state
    records, appended with one `Store.rollout_append` (the same records `effect add`
    writes, one append instead of N CLI runs); states end as a mix of done, pending,
    failed and unknown.
  - checkpoints: the oldest is a real commit made before the effects (history seq 0),
    the newest records the whole history, the ones between its first 10 records;
    built through a lower-level path, not N `store.checkpoints.commit` calls (which
    would re-snapshot the workspace N times): one real commit snapshots a 2,000-file
    workspace, then N Checkpoint objects sharing that tree are written straight into
    the store (cas.objects.Checkpoint, framed and saved in batches of 5,000 per
    transaction, with the same generation/skip index `commit` computes), and the
    thread's ref is moved to the newest with the history head. Only the bench does this.

Measured (median of REPEAT calls each, in this process, through `ToolHost.call`: the
code `agentcas mcp` runs per request, without the JSON-RPC hop, which is timed
separately through the SDK's stdio client for the first and last page):
  - list_checkpoints: the first page (from the head) and the last page (a cursor
    naming a checkpoint ~limit from the root), and pages in the middle;
  - inspect_checkpoint: the first and last page of the 2,000-file list, on the newest
    and on the oldest checkpoint (cold: the first call on a tree lists it; warm after);
  - effects (Store.effects): the first page, the last page (a cursor near seq 0), a
    --state pending,unknown page, and a --since window, plus the one-time index build.
Pass/fail: every page under 50 ms and last/first within 2x.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness as h  # noqa: E402

REPEAT = 15
LIMIT = 50
FILES = 2000
BUDGET = 0.050


def timed(fn, repeat=REPEAT) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def effect_records(n: int) -> bytes:
    from agentcas.lineage.effects import new_effect, state_change
    at = "2026-01-01T00:00:00.000000Z"
    lines = []
    for i in range(n):
        lines.append(new_effect(f"e{i:07d}", ("http.request", "payment", "file.write")[i % 3],
                                f"https://api.example/v1/items/{i}", "pending",
                                ("irreversible", "compensatable", "rollbackable")[i % 3],
                                ("stripe", "github", "s3", "internal")[i % 4], "op", at).to_line())
    for i in range(0, n, 5):
        lines.append(state_change(f"e{i:07d}", ("done", "failed", "unknown", "done")[(i // 5) % 4], at).to_line())
    return b"".join(lines)


def build(store, workspace: str, n: int) -> list[str]:
    """The thread `agent`: n effects and n checkpoints (lower-level path, see the docstring)."""
    from agentcas.cas import framing
    from agentcas.cas.objects import EMPTY_POSITION, Checkpoint
    from agentcas.cas.store import save_object
    from agentcas.lineage.rollout import skip_index
    from agentcas.refs import threads

    h.progress(f"snapshotting a {FILES}-file workspace")
    first = store.checkpoints.commit(workspace, "checkpoint 0", "agent").to_json()
    h.progress(f"appending {n} effects + {n // 5} state records")
    store.history.append("agent", effect_records(n))
    tree = store.checkpoints.get(first["checkpoint"])[1].tree
    _, base = store.checkpoints.get(first["checkpoint"])
    head = store.threads.get("agent").history
    from agentcas.lineage.rollout import History
    early = History(store.source).position(head, 10)  # the checkpoints between: 10 records in
    ids = [first["checkpoint"]]
    digests = [store.resolve(first["checkpoint"])]
    h.progress(f"writing {n - 1} more checkpoints in batches")
    batch = 5000
    for start in range(1, n, batch):
        def land(txn, start=start):
            made = []
            for gen in range(start, min(n, start + batch)):
                parent = digests[gen - 1]
                skip = digests[skip_index(gen)] if gen >= 2 else None
                history = head if gen == n - 1 else early
                cp = Checkpoint(tree, (parent,), "agent", f"checkpoint {gen}: step {gen} of the plan", "bench",
                                base.created_at, base.runtime, history, generation=gen, skip=skip)
                digest = cp.digest()
                save_object(txn, digest, framing.frame(framing.KIND_CHECKPOINT, cp.encode()))
                made.append(digest)
                digests.append(digest)
            return made
        made = store.environment.write(land)  # the embedded LMDB environment's raw tables (bench only)
        ids += [d.hex() for d in made]

    def move(txn):
        state = threads.read_thread(txn, "agent")
        threads.set_if_equals(txn, "agent", state, threads.ThreadState(digests[-1], head, state.forked_from),
                              "commit", "bench: many checkpoints")
    store.environment.write(move)
    assert EMPTY_POSITION.seq == 0
    return ids[::-1]  # newest first


def walk(call, first_args: dict, cursor_of) -> list[float]:
    """Time every page of a paged call, following its cursor to the end."""
    times, args = [], dict(first_args)
    while True:
        start = time.perf_counter()
        doc = call(dict(args))
        times.append(time.perf_counter() - start)
        cursor = cursor_of(doc)
        if cursor is None:
            return times
        args["cursor"] = cursor


def stdio_walk(store_path: str, cwd: str, thread: str) -> list[float]:
    """Every list_checkpoints page through the SDK's stdio client (a real `agentcas mcp`)."""
    from mcp import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    async def main():
        params = StdioServerParameters(command=h.AGENTCAS, args=["--store", store_path, "mcp", "--limit",
                                                                 str(LIMIT)], cwd=cwd)
        with open(os.devnull, "w") as errlog:
            async with stdio_client(params, errlog=errlog) as (read, write):
                async with ClientSession(read, write) as s:
                    await s.initialize()
                    # A host lists the tools once when it connects; without this the SDK's
                    # first call_tool makes that list_tools round trip itself (to validate
                    # structured results against the output schemas) inside the first page.
                    await s.list_tools()
                    times, args = [], {"thread": thread}
                    while True:
                        start = time.perf_counter()
                        result = await s.call_tool("list_checkpoints", args)
                        times.append(time.perf_counter() - start)
                        assert not result.is_error, result.content
                        cursor = result.structured_content["next_cursor"]
                        if cursor is None:
                            return times
                        args = {"thread": thread, "cursor": cursor}
    return asyncio.run(main())


def spread(times: list[float]) -> list[str]:
    ordered = sorted(times)
    return [len(times), h.fmt_time(times[0]), h.fmt_time(statistics.median(times)),
            h.fmt_time(ordered[int(len(ordered) * 0.99) - 1 if len(ordered) > 1 else 0]),
            h.fmt_time(max(times)), h.fmt_time(times[-1])]


def main(argv: list[str]) -> int:
    quick = "--quick" in argv
    n = 10_000 if quick else 100_000
    load = h.load_note()
    from agentcas import Store
    from agentcas.mcp.tools import ToolHost
    rows = []
    with h.work_dir("mcp") as work:
        workspace = os.path.join(work, "ws")
        for i in range(FILES):
            path = os.path.join(workspace, f"dir{i // 100:02d}", f"file{i:05d}.txt")
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as handle:
                handle.write(f"file {i}\n")
        store, _ = Store.init(os.path.join(work, "store"))
        t0 = time.perf_counter()
        ids = build(store, workspace, n)
        build_time = time.perf_counter() - t0
        host = ToolHost(store, ("agent",), False, LIMIT, workspace)

        def call(name):
            return lambda args: host.call(name, args)

        h.progress("list_checkpoints: every page, in process")
        lists = walk(call("list_checkpoints"), {"thread": "agent"}, lambda d: d["next_cursor"])
        assert len(lists) == -(-n // LIMIT)
        h.progress("inspect_checkpoint: every file page of the newest and the oldest checkpoint")
        cold_start = time.perf_counter()
        host.call("inspect_checkpoint", {"checkpoint_id": ids[0]})
        cold = time.perf_counter() - cold_start
        files_pages = []
        for cp in (ids[0], ids[-1]):
            files_pages += walk(call("inspect_checkpoint"), {"checkpoint_id": cp},
                                lambda d: d["files_page"]["next_cursor"])
        h.progress("effects: the first call builds the index")
        t0 = time.perf_counter()
        doc = store.effects.list("agent", limit=LIMIT).to_json()
        index_build = time.perf_counter() - t0
        assert doc["totals"]["effects"] == n
        h.progress("effects: every page, and every page of --state pending,unknown")
        effect_pages = walk(lambda a: store.effects.list("agent", limit=LIMIT, before=a.get("cursor")), {},
                            lambda d: d["next_cursor"])
        open_pages = walk(lambda a: store.effects.list("agent", states=["pending", "unknown"], limit=LIMIT,
                                                  before=a.get("cursor")), {}, lambda d: d["next_cursor"])
        h.progress("diff_checkpoint: every effects page of a whole-history window")
        diff_pages = walk(call("diff_checkpoint"), {"from": ids[1], "to": ids[0]},
                          lambda d: d["effects_page"]["next_cursor"])
        since_first = timed(lambda: store.effects.list("agent", since=ids[1], limit=LIMIT), repeat=5)[0]
        h.progress("list_checkpoints: every page through the stdio client")
        stdio = stdio_walk(store.path, workspace, "agent")
        store_bytes = h.disk_bytes(store.path)

    header = ["call", "pages", "first", "median", "p99", "max", "last"]
    rows = [["list_checkpoints (in process)"] + spread(lists),
            ["list_checkpoints (SDK stdio client, JSON-RPC round trip)"] + spread(stdio),
            ["inspect_checkpoint file pages (newest, then oldest checkpoint)"] + spread(files_pages),
            ["effects (Store.effects)"] + spread(effect_pages),
            ["effects --state pending,unknown"] + spread(open_pages)]
    rows.append(["diff_checkpoint effects pages (window: all but 10 records)"] + spread(diff_pages))
    paged = lists + files_pages + effect_pages + open_pages  # in process; stdio adds the JSON-RPC hop
    typical = statistics.median(paged) < BUDGET and all(
        sorted(t)[int(len(t) * 0.99) - 1] < BUDGET for t in (lists, files_pages, effect_pages, open_pages))
    ok = max(paged) < BUDGET and lists[-1] < 2 * lists[0] + 0.002 and effect_pages[-1] < 2 * effect_pages[0] + 0.002
    h.table(f"Every page on one thread with {n:,} checkpoints and {n:,} effects (limit {LIMIT})", header, rows,
            [f"Built in {h.fmt_time(build_time)} (lower-level path, see bench/bench_mcp.py); store "
             f"{h.fmt_bytes(store_bytes)}. The effects index was built by the first `effects` call in "
             f"{h.fmt_time(index_build)} ({n:,} effects + {n // 5:,} state records), once; later calls only "
             f"index new records. The first inspect of a tree lists it: {h.fmt_time(cold)} for {FILES:,} files "
             "(then cached per tree id).",
             f"`effects --since` over that window: {h.fmt_time(since_first)} per call (totals from two running-"
             "totals rows plus the window's state changes of older effects); diff_checkpoint computes the diff "
             "and the window totals on its first page and keeps them for the later pages (two checkpoints "
             "never change).",
             "The stdio walk lists the tools once after `initialize`, as a host does when it connects (the SDK client would otherwise make that round trip inside its first call_tool).",
             f"Every in-process list/inspect/effects page under {BUDGET * 1e3:.0f} ms and the last page within 2x "
             f"of the first: {h.verdict(ok)}; p99 of each under {BUDGET * 1e3:.0f} ms: {h.verdict(typical)} "
             "(on a loaded machine the max is the scheduler's, see the load line)."])
    print(f"Load: {load} at start, {h.load_note()} at end.\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
