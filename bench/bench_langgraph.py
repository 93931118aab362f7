"""The LangGraph workload: one agent thread, a checkpoint per step.

Each step appends one ~300-byte chat message and checkpoints:
- LangGraph 1.2 (`langgraph==1.2.22`, `langgraph-checkpoint-sqlite==3.1.2`, the `bench`
  extra): a one-node StateGraph whose `messages` channel uses `add_messages`; each step is
  `graph.invoke({"messages": [HumanMessage/AIMessage]}, thread)` (three checkpoints per
  invoke, as LangGraph writes them) with SqliteSaver. Twice: the default channel, and the
  beta `DeltaChannel` (langgraph.channels.delta, present in 1.2.22) with the same reducer.
- agentcas: the message is appended to a JSONL rollout file and `store.checkpoints.commit(workspace,
  --rollout FILE)` runs through the Python API in this process (2,000 CLI runs would
  measure 2,000 Python start-ups; a few CLI steps are timed separately). The workspace is
  an empty directory: LangGraph's state here holds only the messages.

- the same LangGraph graph over `MessagesState` with `AgentcasSaver`
  (agentcas/langgraph) as its checkpointer, a checkpoint per LangGraph step as LangGraph
  writes them; the saver's `put` calls are timed beside SqliteSaver's.

Measured: total bytes on disk, per-step time and bytes over the first vs the last 100
steps, a fork at step N/2 (bytes, time), and listing the whole thread; for the saver also
the median step time of the first vs the last 10% of steps, `put` time, `copy_thread` of the
whole thread, `list` of the whole thread, and resident memory along the thread.
`--profile`: the saver alone, 200 steps: bytes per step by table and object kind, and the
median time of a put and of a put_writes.
"""

from __future__ import annotations

import functools
import json
import os
import sqlite3
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness as h  # noqa: E402
from datasets import messages  # noqa: E402

WINDOW = 100


def sqlite_bytes(path: str) -> int:
    return sum(os.path.getsize(path + suffix) for suffix in ("", "-wal") if os.path.exists(path + suffix))


def sqlite_payload(conn) -> int:
    """Bytes of the stored blobs (checkpoints, metadata, pending writes), without SQLite's pages."""
    a = conn.execute("select coalesce(sum(length(checkpoint) + length(metadata)), 0) from checkpoints").fetchone()[0]
    b = conn.execute("select coalesce(sum(length(value)), 0) from writes").fetchone()[0]
    return a + b


def timed_listing(iterable, budget: float) -> tuple[float, int, bool]:
    """(seconds, items, finished): stop early once `budget` seconds have passed."""
    start = time.perf_counter()
    count = 0
    for _ in iterable:
        count += 1
        if time.perf_counter() - start > budget:
            return time.perf_counter() - start, count, False
    return time.perf_counter() - start, count, True


def bench_langgraph(work: str, msgs: list[dict], delta: bool, budget: float) -> dict:
    from typing import Annotated, TypedDict

    from langchain_core.messages import AIMessage, HumanMessage
    from langgraph.checkpoint.sqlite import SqliteSaver
    from langgraph.graph import END, START, StateGraph
    from langgraph.graph.message import add_messages

    if delta:
        from langgraph.channels.delta import DeltaChannel

        def batch_add(state, writes):  # DeltaChannel reducers take a batch of writes
            return functools.reduce(add_messages, writes, state)

        # The functional form: class bodies' annotations would be strings here (PEP 563).
        State = TypedDict("State", {"messages": Annotated[list, DeltaChannel(batch_add)]})  # noqa: UP013
    else:
        State = TypedDict("State", {"messages": Annotated[list, add_messages]})  # noqa: UP013

    builder = StateGraph(State)
    builder.add_node("agent", lambda state: {})  # stands in for the model call
    builder.add_edge(START, "agent")
    builder.add_edge("agent", END)
    path = os.path.join(work, f"langgraph-{'delta' if delta else 'default'}.sqlite")
    conn = sqlite3.connect(path, check_same_thread=False)
    checkpointer = SqliteSaver(conn)
    put_times = time_puts(checkpointer)
    graph = builder.compile(checkpointer=checkpointer)
    thread = {"configurable": {"thread_id": "agent"}}
    n = len(msgs)
    times, sizes = [], [sqlite_bytes(path)]
    fork_config = None
    label = "DeltaChannel" if delta else "default"
    for i, m in enumerate(msgs):
        cls = HumanMessage if m["role"] == "user" else AIMessage
        message = cls(content=m["content"], id=m["id"])
        start = time.perf_counter()
        put_times.append([])
        graph.invoke({"messages": [message]}, thread)
        times.append(time.perf_counter() - start)
        if i < WINDOW or i >= n - WINDOW - 1:
            sizes.append(sqlite_bytes(path))
        else:
            sizes.append(None)
        if i + 1 == n // 2:
            fork_config = graph.get_state(thread).config
        if (i + 1) % 500 == 0:
            h.progress(f"langgraph/{label}: step {i + 1}/{n}, {h.fmt_bytes(sqlite_bytes(path))}")
    r = {"total": sqlite_bytes(path), "payload": sqlite_payload(conn), "step_times": times, "sizes": sizes,
         "checkpoints": conn.execute("select count(*) from checkpoints").fetchone()[0],
         **per_step(put_times)}

    # Fork at step n/2: (a) a branch from that checkpoint in the same thread, (b) a new thread.
    before = sqlite_payload(conn)
    start = time.perf_counter()
    graph.update_state(fork_config, {"messages": []}, as_node="agent")
    r["fork_branch_time"] = time.perf_counter() - start
    r["fork_branch_bytes"] = sqlite_payload(conn) - before
    values = graph.get_state(fork_config).values["messages"]
    before = sqlite_payload(conn)
    start = time.perf_counter()
    graph.update_state({"configurable": {"thread_id": "fork"}}, {"messages": values}, as_node="agent")
    r["fork_thread_time"] = time.perf_counter() - start
    r["fork_thread_bytes"] = sqlite_payload(conn) - before
    r["fork_len"] = len(values)

    h.progress(f"langgraph/{label}: listing the thread (at most {budget:.0f} s each)")
    r["history"] = timed_listing(graph.get_state_history(thread), budget)
    r["list"] = timed_listing(graph.checkpointer.list(thread), budget)
    conn.close()
    return r


def time_puts(saver) -> list:
    """Wrap the saver's `put` and `put_writes`: each call lands, as (name, wall seconds, thread
    CPU seconds), in the last list of the returned list (the caller appends one per step).

    Thread CPU is what the checkpointer itself costs, without the time its thread waits for
    the GIL while LangGraph's own work (its `add_messages` reducer walks the whole message
    list every step) runs on another thread.
    """
    calls: list[list[tuple[str, float, float]]] = [[]]
    for name in ("put", "put_writes"):
        real = getattr(saver, name)

        def timed(*args, real=real, name=name, **kwargs):
            start, start_cpu = time.perf_counter(), time.thread_time()
            try:
                return real(*args, **kwargs)
            finally:
                calls[-1].append((name, time.perf_counter() - start, time.thread_time() - start_cpu))

        setattr(saver, name, timed)
    return calls


def per_step(calls: list) -> dict:
    """Per step with calls: wall time of its puts; thread CPU of its puts, and of puts + put_writes."""
    steps = [step for step in calls if step]
    return {"put_times": [sum(wall for name, wall, _ in step if name == "put") for step in steps],
            "put_cpu": [sum(cpu for name, _, cpu in step if name == "put") for step in steps],
            "write_cpu": [sum(cpu for _, _, cpu in step) for step in steps]}


def bench_inmemory(msgs: list[dict]) -> list[float]:
    """The same graph with LangGraph's InMemorySaver: what a step costs LangGraph itself
    (its reducer, its checkpoint bookkeeping) with a checkpointer that does almost nothing."""
    from langchain_core.messages import AIMessage, HumanMessage
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.graph import END, START, MessagesState, StateGraph

    builder = StateGraph(MessagesState)
    builder.add_node("agent", lambda state: {})
    builder.add_edge(START, "agent")
    builder.add_edge("agent", END)
    graph = builder.compile(checkpointer=InMemorySaver())
    thread, times = {"configurable": {"thread_id": "agent"}}, []
    for m in msgs:
        cls = HumanMessage if m["role"] == "user" else AIMessage
        start = time.perf_counter()
        graph.invoke({"messages": [cls(content=m["content"], id=m["id"])]}, thread)
        times.append(time.perf_counter() - start)
    return times


def resident_bytes() -> int:
    """Anonymous resident memory (RssAnon): the heap, without the store's mapped file pages."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    return 0


COLD_LIST = r"""
import json, sys, time
from agentcas.langgraph import AgentcasSaver
saver = AgentcasSaver(sys.argv[1])
start, count, budget = time.perf_counter(), 0, float(sys.argv[3])
finished = True
for _ in saver.list(json.loads(sys.argv[2])):
    count += 1
    if time.perf_counter() - start > budget:
        finished = False
        break
print(json.dumps([time.perf_counter() - start, count, finished]))
"""


def bench_saver(work: str, msgs: list[dict], budget: float) -> dict:
    """The graph over MessagesState with AgentcasSaver, one invoke per message."""
    from langchain_core.messages import AIMessage, HumanMessage
    from langgraph.graph import END, START, MessagesState, StateGraph

    from agentcas.langgraph import AgentcasSaver

    builder = StateGraph(MessagesState)
    builder.add_node("agent", lambda state: {})  # stands in for the model call
    builder.add_edge(START, "agent")
    builder.add_edge("agent", END)
    path = os.path.join(work, "saver.agentcas")
    saver = AgentcasSaver(path)
    store = saver.store
    put_times = time_puts(saver)
    graph = builder.compile(checkpointer=saver)
    thread = {"configurable": {"thread_id": "agent"}}
    n = len(msgs)
    start_pages, start_payload = store.environment.used_bytes(), store_payload(store)
    times, rss = [], {}
    for i, m in enumerate(msgs):
        cls = HumanMessage if m["role"] == "user" else AIMessage
        message = cls(content=m["content"], id=m["id"])
        put_times.append([])
        start = time.perf_counter()
        graph.invoke({"messages": [message]}, thread)
        times.append(time.perf_counter() - start)
        if i + 1 in (n // 10, n // 2, n):
            rss[i + 1] = resident_bytes()
        if (i + 1) % 500 == 0:
            h.progress(f"AgentcasSaver: step {i + 1}/{n}, {h.fmt_bytes(store.environment.used_bytes())}")
    r = {"total": store.environment.used_bytes() - start_pages, "payload": store_payload(store) - start_payload,
         "disk": h.disk_bytes(path), "step_times": times, **per_step(put_times),
         "rss": rss, "checkpoints": len(store.threads.log("langgraph/agent"))}
    before_payload, before_pages = store_payload(store), store.environment.used_bytes()
    start = time.perf_counter()
    saver.copy_thread("agent", "agent-copy")
    r["copy_time"] = time.perf_counter() - start
    r["copy_bytes"] = store_payload(store) - before_payload
    r["copy_pages"] = store.environment.used_bytes() - before_pages
    h.progress(f"AgentcasSaver: listing the thread (at most {budget:.0f} s)")
    r["list"] = timed_listing(saver.list(thread), budget)
    saver.close()
    # A new process's view: nothing cached, every value read and verified from the store.
    r["list_cold"] = tuple(json.loads(h.output([sys.executable, "-c", COLD_LIST, path, json.dumps(thread),
                                                 str(budget)])))
    return r


def median_ratio(times: list[float]) -> tuple[float, float, float]:
    """(median of the first 10%, median of the last 10%, last/first)."""
    k = max(1, len(times) // 10)
    first, last = statistics.median(times[:k]), statistics.median(times[-k:])
    return first, last, last / first


def report_saver(n: int, saver: dict, lg: dict) -> None:
    default, delta = lg.get("default"), lg.get("DeltaChannel")
    f_t, l_t, ratio_t = median_ratio(saver["step_times"])
    f_p, l_p, ratio_p = median_ratio(saver["put_times"])
    rows = [["AgentcasSaver", h.fmt_bytes(saver["total"]), h.fmt_bytes(saver["payload"]), str(saver["checkpoints"]),
             h.fmt_time(f_t), h.fmt_time(l_t), f"{ratio_t:.2f}", h.fmt_time(f_p), h.fmt_time(l_p)]]
    for name, r in lg.items():
        a, b, c = median_ratio(r["step_times"])
        pa, pb, _ = median_ratio(r["put_times"])
        rows.append([f"SqliteSaver, {name}", h.fmt_bytes(r["total"]), h.fmt_bytes(r["payload"]), str(r["checkpoints"]),
                     h.fmt_time(a), h.fmt_time(b), f"{c:.2f}", h.fmt_time(pa), h.fmt_time(pb)])
    k = max(1, n // 10)
    h.table(f"LangGraph StateGraph over MessagesState, {n} steps, checkpointers side by side",
            ["checkpointer", "total bytes", "payload bytes", "checkpoints", f"step, median of first {k}",
             f"step, median of last {k}", "last/first", f"put per step, first {k}", f"put per step, last {k}"],
            rows, ["Total bytes: agentcas = LMDB pages in use (data.mdb on disk: "
                   f"{h.fmt_bytes(saver['disk'])}); SqliteSaver = the SQLite file plus its WAL. A step is one "
                   "graph.invoke (LangGraph writes 3 checkpoints per invoke); put = the checkpointer's put "
                   "calls of one step, timed inside the process."])
    t_list, count, finished = saver["list"]
    t_cold, count_cold, finished_cold = saver["list_cold"]
    put_step1 = {name: r["put_times"][0] for name, r in lg.items()}
    rows = []
    if delta:
        rows.append(["bytes ≤ 0.25× DeltaChannel on SqliteSaver",
                     f"{h.fmt_bytes(saver['total'])} vs {h.fmt_bytes(delta['total'])} "
                     f"({saver['total'] / delta['total']:.3f}×)", h.verdict(saver["total"] <= 0.25 * delta["total"])])
    if default:
        rows.append(["bytes ≤ 0.005× default SqliteSaver",
                     f"{h.fmt_bytes(saver['total'])} vs {h.fmt_bytes(default['total'])} "
                     f"({saver['total'] / default['total']:.4f}×)",
                     h.verdict(saver["total"] <= 0.005 * default["total"])])
    rows.append(["step cost flat: last-10% / first-10% median ≤ 1.2 (whole invoke)",
                 f"{h.fmt_time(f_t)} → {h.fmt_time(l_t)} ({ratio_t:.2f})", h.verdict(ratio_t <= 1.2)])
    rows.append(["put cost flat: last-10% / first-10% median ≤ 1.2 (the saver's puts)",
                 f"{h.fmt_time(f_p)} → {h.fmt_time(l_p)} ({ratio_p:.2f})", h.verdict(ratio_p <= 1.2)])
    if default:
        rows.append(["a step's put (last 10%) ≤ SqliteSaver's at step 1",
                     f"{h.fmt_time(l_p)} vs {h.fmt_time(put_step1['default'])}",
                     h.verdict(l_p <= put_step1["default"])])
    f_m, l_m, ratio_m = median_ratio(saver["inmemory_steps"])
    rows.append(["(LangGraph's own step with InMemorySaver, for scale: not a target)",
                 f"{h.fmt_time(f_m)} → {h.fmt_time(l_m)} ({ratio_m:.2f})", "-"])
    f_c, l_c, ratio_c = median_ratio(saver["write_cpu"])
    rows.append(["the saver's own cost flat: thread CPU of put + put_writes per step, last-10% / first-10% ≤ 1.2",
                 f"{h.fmt_time(f_c)} → {h.fmt_time(l_c)} ({ratio_c:.2f})", h.verdict(ratio_c <= 1.2)])
    if default:
        _, l_pc, _ = median_ratio(saver["put_cpu"])
        theirs = default["put_cpu"][0]
        rows.append(["a step's put in thread CPU (last 10%) ≤ SqliteSaver's at step 1",
                     f"{h.fmt_time(l_pc)} vs {h.fmt_time(theirs)}", h.verdict(l_pc <= theirs)])
    copy = max(saver["copy_bytes"], saver["copy_pages"])
    rows.append([f"copy_thread of the {n}-step thread < 16 KiB and < 10 ms",
                 f"{h.fmt_bytes(saver['copy_bytes'])} of keys+values ({h.fmt_bytes(saver['copy_pages'])} of pages), "
                 f"{h.fmt_time(saver['copy_time'])}", h.verdict(copy < 16 << 10 and saver["copy_time"] < 0.010)])
    for name, r in lg.items():
        t, c, done = r["list"]
        theirs = h.fmt_time(t) if done else f"> {h.fmt_time(t)} (stopped after {c})"
        rows.append([f"list of the whole thread ≤ SqliteSaver {name}'s",
                     f"{h.fmt_time(t_list)} ({count}{'' if finished else ', unfinished'}); cold saver "
                     f"{h.fmt_time(t_cold)} ({count_cold}{'' if finished_cold else ', unfinished'}) vs {theirs}",
                     h.verdict(finished and (not done or t_list <= t))])
    rss = saver["rss"]
    marks = sorted(rss)
    rows.append(["memory flat (anonymous resident memory at 10% / 50% / 100% of the steps)",
                 " / ".join(h.fmt_bytes(rss[m]) for m in marks),
                 h.verdict(rss[marks[-1]] <= 1.2 * rss[marks[0]])])
    h.table("AgentcasSaver targets", ["target", "measured", "met"], rows)


def store_payload(store) -> int:
    """Bytes of every key and value in the store's tables, without LMDB's pages."""
    from agentcas.cas.store import TABLES
    with store.environment.reader() as txn:
        return sum(len(k) + len(v) for table in TABLES for k, v in txn.scan(table))


def bench_agentcas(work: str, msgs: list[dict]) -> dict:
    from agentcas.repository import Store

    env = h.env_for(work)
    path = os.path.join(work, "s.agentcas")
    store, _ = Store.init(path)
    workspace = os.path.join(work, "workspace")
    os.makedirs(workspace)
    rollout = os.path.join(work, "rollout.jsonl")
    open(rollout, "wb").close()
    used = store.environment.used_bytes
    n = len(msgs)
    start_bytes = used()
    times, sizes = [], [start_bytes]
    handle = open(rollout, "ab")
    for i, m in enumerate(msgs):
        line = json.dumps(m, separators=(",", ":")).encode() + b"\n"
        start = time.perf_counter()
        handle.write(line)
        handle.flush()
        store.checkpoints.commit(workspace, f"step {i}", thread="main", rollout_file=rollout)
        times.append(time.perf_counter() - start)
        sizes.append(used() if i < WINDOW or i >= n - WINDOW - 1 else None)
        if (i + 1) % 500 == 0:
            h.progress(f"agentcas: step {i + 1}/{n}, {h.fmt_bytes(used())}")
    handle.close()
    r = {"total": used() - start_bytes, "disk": h.disk_bytes(path), "step_times": times, "sizes": sizes,
         "rollout_bytes": os.path.getsize(rollout), "payload": store_payload(store)}

    before, before_pages = store_payload(store), used()
    start = time.perf_counter()
    store.threads.fork("main", "fork", at=n // 2)
    r["fork_time"] = time.perf_counter() - start
    r["fork_bytes"] = store_payload(store) - before
    r["fork_pages"] = used() - before_pages

    start = time.perf_counter()
    entries = store.threads.log("main")
    r["log_inproc_time"] = time.perf_counter() - start
    r["log_len"] = len(entries)
    r["log_cli_time"] = h.median_time(
        lambda: h.run([h.AGENTCAS, "--store", path, "log", "main"], env=env), 3)
    r["log_cli_json_time"] = h.median_time(
        lambda: h.run([h.AGENTCAS, "--store", path, "--json", "log", "main"], env=env), 3)

    # A few steps through the real CLI, as a shell-scripted harness would run them.
    cli = []
    extra = messages(5, seed=99)
    for i, m in enumerate(extra):
        with open(rollout, "ab") as out:
            out.write(json.dumps(m, separators=(",", ":")).encode() + b"\n")
        cli.append(h.run([h.AGENTCAS, "--store", path, "commit", workspace, "-m", f"cli step {i}",
                          "--rollout", rollout], env=env))
    r["cli_step_times"] = cli
    return r


def window_stats(r: dict) -> dict:
    times, sizes = r["step_times"], r["sizes"]
    n = len(times)
    first_t = statistics.mean(times[:WINDOW])
    last_t = statistics.mean(times[n - WINDOW:])
    first_b = (sizes[WINDOW] - sizes[0]) / WINDOW
    last_b = (sizes[n] - sizes[n - WINDOW]) / WINDOW
    return {"first_t": first_t, "last_t": last_t, "first_b": first_b, "last_b": last_b}


def report(n: int, a: dict, lg: dict, msg_bytes: int) -> None:
    wa = window_stats(a)
    rows = [["agentcas (Python API)", h.fmt_bytes(a["total"]), "1.00×", h.fmt_bytes(a["payload"]),
             h.fmt_time(wa["first_t"]), h.fmt_time(wa["last_t"]), h.fmt_bytes(wa["first_b"]),
             h.fmt_bytes(wa["last_b"]), h.fmt_time(sum(a["step_times"]))]]
    for name, r in lg.items():
        w = window_stats(r)
        rows.append([f"LangGraph SqliteSaver, {name}", h.fmt_bytes(r["total"]),
                     h.fmt_ratio(h.ratio(r["total"], a["total"])), h.fmt_bytes(r["payload"]), h.fmt_time(w["first_t"]),
                     h.fmt_time(w["last_t"]), h.fmt_bytes(w["first_b"]), h.fmt_bytes(w["last_b"]),
                     h.fmt_time(sum(r["step_times"]))])
    h.table(f"One thread, {n} steps, one ~300-byte message per step ({h.fmt_bytes(msg_bytes)} of messages)",
            ["checkpointer", "total bytes", "bytes / agentcas", "payload bytes", f"step time, first {WINDOW}",
             f"step time, last {WINDOW}", f"bytes/step, first {WINDOW}", f"bytes/step, last {WINDOW}",
             "all steps"], rows,
            [f"Total bytes: agentcas = LMDB pages in use (data.mdb on disk: {h.fmt_bytes(a['disk'])}); "
             f"LangGraph = the SQLite file plus its WAL. Payload = the stored keys and values "
             f"(agentcas: every table; LangGraph: checkpoint, metadata and write blobs). Bytes/step are "
             f"file/page growth. LangGraph writes "
             f"{next(iter(lg.values()))['checkpoints'] // n} checkpoints per invoke. agentcas steps through the "
             f"CLI (Python start-up included): {', '.join(h.fmt_time(t) for t in a['cli_step_times'])}."])

    rows = [["agentcas threads.fork --at (in-process)", f"{h.fmt_bytes(a['fork_bytes'])} ({h.fmt_bytes(a['fork_pages'])} of new pages)",
             h.fmt_time(a["fork_time"])]]
    for name, r in lg.items():
        rows.append([f"LangGraph {name}: update_state on step {n // 2}'s checkpoint (branch in the thread)",
                     h.fmt_bytes(r["fork_branch_bytes"]), h.fmt_time(r["fork_branch_time"])])
        rows.append([f"LangGraph {name}: update_state into a new thread with step {n // 2}'s messages",
                     h.fmt_bytes(r["fork_thread_bytes"]), h.fmt_time(r["fork_thread_time"])])
    h.table(f"Fork at step {n // 2} of {n}", ["operation", "new payload bytes", "time"], rows,
            ["SqliteSaver 3.1.2 does not implement `copy_thread`; the two update_state forms are how a "
             "LangGraph user branches. New payload bytes = growth of stored keys+values (agentcas) or of "
             "stored blobs (LangGraph)."])

    rows = [[f"agentcas log main ({a['log_len']} checkpoints, CLI, text)", h.fmt_time(a["log_cli_time"])],
            ["agentcas --json log main (CLI)", h.fmt_time(a["log_cli_json_time"])],
            ["agentcas threads.log (in-process)", h.fmt_time(a["log_inproc_time"])]]
    for name, r in lg.items():
        for key, what in (("history", "graph.get_state_history"), ("list", "checkpointer.list")):
            t, count, finished = r[key]
            shown = h.fmt_time(t) if finished else f"> {h.fmt_time(t)} (stopped after {count} of {r['checkpoints']})"
            rows.append([f"LangGraph {name}: {what} ({count} checkpoints)", shown])
    h.table("Listing the whole thread", ["operation", "time"], rows)

    delta = lg.get("DeltaChannel")
    rows = []
    if delta:
        rows.append(["total bytes ≤ ¼ of DeltaChannel's", f"{h.fmt_bytes(a['total'])} vs {h.fmt_bytes(delta['total'])}",
                     h.verdict(a["total"] * 4 <= delta["total"])])
    rows.append(["per-step time does not grow (last/first window ≤ 1.5×)",
                 f"{h.fmt_time(wa['first_t'])} → {h.fmt_time(wa['last_t'])}",
                 h.verdict(wa["last_t"] <= 1.5 * wa["first_t"])])
    rows.append(["per-step bytes do not grow (last/first window ≤ 1.5×)",
                 f"{h.fmt_bytes(wa['first_b'])} → {h.fmt_bytes(wa['last_b'])}",
                 h.verdict(wa["last_b"] <= 1.5 * max(wa["first_b"], 1))])
    rows.append(["fork in constant bytes (< 16 KiB)", h.fmt_bytes(max(a["fork_bytes"], a["fork_pages"])),
                 h.verdict(max(a["fork_bytes"], a["fork_pages"]) < 16 << 10)])
    rows.append(["log of the whole thread well under 1 s (CLI)", h.fmt_time(a["log_cli_time"]),
                 h.verdict(a["log_cli_time"] < 1.0)])
    h.table("LangGraph workload targets", ["target", "measured", "met"], rows)


def profile_saver(work: str, n: int) -> None:
    """`--profile`: what one step of the saver writes (keys+values by table and object kind)
    and the median time of its put and put_writes calls (the saver alone, n steps)."""
    import collections

    from langchain_core.messages import AIMessage, HumanMessage
    from langgraph.graph import END, START, MessagesState, StateGraph

    from agentcas.cas import framing
    from agentcas.cas.store import TABLES
    from agentcas.langgraph import AgentcasSaver

    def by_kind(store) -> collections.Counter:
        out = collections.Counter()
        with store.environment.reader() as txn:
            for table in TABLES:
                for k, v in txn.scan(table):
                    name = f"object: {framing.KIND_NAMES[framing.unframe(bytes(v))[0]]}" if table == "objects" else table
                    out[name] += len(k) + len(v)
        return out

    saver = AgentcasSaver(os.path.join(work, "profile.agentcas"))
    calls = {"put": [], "put_writes": []}
    for name, spent in calls.items():
        real = getattr(saver, name)

        def timed(*args, real=real, spent=spent, **kwargs):
            start = time.perf_counter()
            try:
                return real(*args, **kwargs)
            finally:
                spent.append(time.perf_counter() - start)
        setattr(saver, name, timed)
    builder = StateGraph(MessagesState)
    builder.add_node("agent", lambda state: {})
    builder.add_edge(START, "agent")
    builder.add_edge("agent", END)
    graph = builder.compile(checkpointer=saver)
    before, pages = by_kind(saver.store), saver.store.environment.used_bytes()
    for m in messages(n):
        cls = HumanMessage if m["role"] == "user" else AIMessage
        graph.invoke({"messages": [cls(content=m["content"], id=m["id"])]}, {"configurable": {"thread_id": "p"}})
    after, pages = by_kind(saver.store), saver.store.environment.used_bytes() - pages
    rows = [[name, f"{(after[name] - before[name]) / n:,.0f} B"] for name in sorted(after) if after[name] != before[name]]
    rows.append(["all keys and values", f"{(sum(after.values()) - sum(before.values())) / n:,.0f} B"])
    rows.append(["LMDB pages", f"{pages / n:,.0f} B"])
    for name, spent in calls.items():
        rows.append([f"{name}: median time ({len(spent) / n:.2f} calls per step)", h.fmt_time(statistics.median(spent))])
    h.table(f"AgentcasSaver: one step of {n} (bytes per step; put times)", ["what", "per step"], rows)
    saver.close()


def main(argv: list[str]) -> int:
    if "--profile" in argv:
        with h.work_dir("langgraph-profile") as work:
            load = h.load_note()
            profile_saver(work, 200)
            print(f"Load: {load} at start, {h.load_note()} at end.\n")
        return 0
    quick = "--quick" in argv
    n = 300 if quick else 2000
    msgs = messages(n)
    msg_bytes = sum(len(json.dumps(m, separators=(",", ":"))) + 1 for m in msgs)
    load = h.load_note()
    with h.work_dir("langgraph") as work:
        h.progress(f"agentcas: {n} steps")
        a = bench_agentcas(work, msgs)
        lg = {}
        try:
            import langgraph  # noqa: F401
        except ImportError:
            print("LangGraph is not installed (pip install -e '.[bench]'): agentcas numbers only.\n")
        else:
            h.progress(f"AgentcasSaver: {n} steps")
            saver = bench_saver(work, msgs, 20.0 if quick else 90.0)
            h.progress(f"InMemorySaver (LangGraph alone): {n} steps")
            saver["inmemory_steps"] = bench_inmemory(msgs)
            for delta in (False, True):
                h.progress(f"langgraph/{'DeltaChannel' if delta else 'default'}: {n} steps")
                lg["DeltaChannel" if delta else "default"] = bench_langgraph(work, msgs, delta,
                                                                             20.0 if quick else 90.0)
                for suffix in ("", "-wal", "-shm"):  # free the disk before the next run
                    p = os.path.join(work, f"langgraph-{'delta' if delta else 'default'}.sqlite{suffix}")
                    if os.path.exists(p):
                        os.unlink(p)
    report(n, a, lg, msg_bytes)
    if lg:
        report_saver(n, saver, lg)
    print(f"Load: {load} at start, {h.load_note()} at end.\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
