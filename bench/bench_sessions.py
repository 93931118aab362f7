"""The session adapters' workload: one long conversation, an item (or event) per turn.

- OpenAI Agents SDK (`openai-agents==0.24.0`, the `openai-agents` extra): 2,000 turns, each
  `await session.add_items([item])` of one ~300-byte chat message (bench/datasets.py), on
  the SDK's own `SQLiteSession` (a database file) and on `AgentcasSession` (a store
  directory). Measured: bytes on disk at the end (SQLite: the file plus its WAL while the
  session is open, and the file alone after close, when the WAL is checkpointed into it;
  agentcas: data.mdb's allocated bytes and the LMDB pages in use), the median time of an
  add_items over the first and the last 10% of turns, `get_items(limit=20)` at the end,
  and `fork(at=N)` of the N-item session: bytes it adds (keys and values of every table,
  and LMDB pages in use) and its median time over 20 forks. SQLiteSession has no fork: a
  copy of its items into a new session is timed beside it.
- Google ADK (`google-adk==2.13.0`, the `adk` extra): the same messages as 2,000 events
  appended with `append_event`, on ADK's own `SqliteSessionService` and on
  `AgentcasSessionService`; `fork_session` of the whole session.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness as h  # noqa: E402
from datasets import messages  # noqa: E402

FORKS = 20


def sqlite_files(path: str) -> int:
    return sum(h.disk_bytes(path + suffix) for suffix in ("", "-wal") if os.path.exists(path + suffix))


def window_medians(times: list[float]) -> tuple[float, float]:
    tenth = max(1, len(times) // 10)
    return statistics.median(times[:tenth]), statistics.median(times[-tenth:])


def payload_bytes(store) -> int:
    from agentcas.cas.store import TABLES
    with store.environment.reader() as txn:
        return sum(len(k) + len(v) for table in TABLES for k, v in txn.scan(table))


async def timed_adds(session, items: list) -> tuple[list[float], list[float]]:
    """(wall, CPU) seconds of each add_items; CPU is the process's, every thread's (the store
    work runs in worker threads), which a loaded machine changes less than wall time."""
    wall, cpu = [], []
    for item in items:
        start, start_cpu = time.perf_counter(), time.process_time()
        await session.add_items([item])
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return wall, cpu


async def bench_agents_sdk(work: str, items: list) -> dict:
    from agents.memory import SQLiteSession

    from agentcas import Store
    from agentcas.openai_agents import AgentcasSession

    out: dict = {}
    db = os.path.join(work, "agents.sqlite")
    reference = SQLiteSession("bench", db)
    out["sqlite_times"], out["sqlite_cpu"] = await timed_adds(reference, items)
    out["sqlite_open_bytes"] = sqlite_files(db)
    start = time.perf_counter()
    got = await reference.get_items(limit=20)
    out["sqlite_get"] = time.perf_counter() - start
    reference.close()
    out["sqlite_closed_bytes"] = sqlite_files(db)
    reference = SQLiteSession("bench", db)
    start = time.perf_counter()
    copy = SQLiteSession("bench-copy", os.path.join(work, "agents-copy.sqlite"))
    await copy.add_items(await reference.get_items())
    out["sqlite_copy"] = time.perf_counter() - start
    copy.close()

    path = os.path.join(work, "agentcas-store")
    store, _ = Store.init(path)
    session = AgentcasSession("bench", store)
    out["agentcas_times"], out["agentcas_cpu"] = await timed_adds(session, items)
    out["agentcas_disk"] = h.disk_bytes(path)
    out["agentcas_used"] = store.environment.used_bytes()
    start = time.perf_counter()
    mine = await session.get_items(limit=20)
    out["agentcas_get"] = time.perf_counter() - start
    assert mine == got, "the two sessions disagree"
    fork_payload, fork_used, fork_times, fork_cpu = [], [], [], []
    for k in range(FORKS):
        payload, used = payload_bytes(store), store.environment.used_bytes()
        start, start_cpu = time.perf_counter(), time.process_time()
        fork = session.fork(f"fork-{k}", at=len(items))
        fork_times.append(time.perf_counter() - start)
        fork_cpu.append(time.process_time() - start_cpu)
        fork_payload.append(payload_bytes(store) - payload)
        fork_used.append(store.environment.used_bytes() - used)
    assert await fork.get_items(limit=3) == items[-3:]
    out["fork_payload"] = statistics.median(fork_payload)
    out["fork_used"] = max(fork_used)
    out["fork_time"] = statistics.median(fork_times)
    out["fork_cpu"] = statistics.median(fork_cpu)
    store.close()
    return out


async def bench_adk(work: str, items: list) -> dict:
    from google.adk.events import Event
    from google.adk.sessions.sqlite_session_service import SqliteSessionService
    from google.genai import types

    from agentcas import Store
    from agentcas.adk import AgentcasSessionService

    def events():
        for n, item in enumerate(items):
            yield Event(author="user" if item["role"] == "user" else "model", invocation_id=f"inv-{n}",
                        content=types.Content(role="user" if item["role"] == "user" else "model",
                                              parts=[types.Part(text=item["content"])]))

    async def appends(service) -> list[float]:
        session = await service.create_session(app_name="bench", user_id="u", session_id="s")
        times = []
        for event in events():
            start = time.perf_counter()
            await service.append_event(session, event)
            times.append(time.perf_counter() - start)
        return times

    out: dict = {}
    db = os.path.join(work, "adk.sqlite")
    reference = SqliteSessionService(db)
    out["sqlite_times"] = await appends(reference)
    await reference.close()
    out["sqlite_bytes"] = sqlite_files(db)
    path = os.path.join(work, "adk-store")
    store, _ = Store.init(path)
    service = AgentcasSessionService(store)
    out["agentcas_times"] = await appends(service)
    out["agentcas_used"] = store.environment.used_bytes()
    out["agentcas_disk"] = h.disk_bytes(path)
    payload = payload_bytes(store)
    start = time.perf_counter()
    fork = await service.fork_session("bench", "u", "s", "fork")
    out["fork_time"] = time.perf_counter() - start  # includes reading the new session back
    out["fork_payload"] = payload_bytes(store) - payload
    assert len(fork.events) == len(items)
    store.close()
    return out


def report(n: int, a: dict, adk: dict | None, item_bytes: int) -> None:
    sq_first, sq_last = window_medians(a["sqlite_times"])
    ac_first, ac_last = window_medians(a["agentcas_times"])
    sq_cpu_first, sq_cpu_last = window_medians(a["sqlite_cpu"])
    ac_cpu_first, ac_cpu_last = window_medians(a["agentcas_cpu"])
    h.table(f"Agents SDK session: {n} turns of one ~{item_bytes // n}-byte item",
            ["", "SQLiteSession (file)", "AgentcasSession"],
            [["bytes on disk", f"{h.fmt_bytes(a['sqlite_open_bytes'])} open (file + WAL); "
              f"{h.fmt_bytes(a['sqlite_closed_bytes'])} closed",
              f"{h.fmt_bytes(a['agentcas_disk'])} data.mdb; {h.fmt_bytes(a['agentcas_used'])} pages in use"],
             ["add_items, median first 10% → last 10%", f"{h.fmt_time(sq_first)} → {h.fmt_time(sq_last)}",
              f"{h.fmt_time(ac_first)} → {h.fmt_time(ac_last)}"],
             ["add_items CPU (all threads), median first 10% → last 10%",
              f"{h.fmt_time(sq_cpu_first)} → {h.fmt_time(sq_cpu_last)}",
              f"{h.fmt_time(ac_cpu_first)} → {h.fmt_time(ac_cpu_last)}"],
             ["get_items(limit=20) at the end", h.fmt_time(a["sqlite_get"]), h.fmt_time(a["agentcas_get"])],
             [f"fork of the {n}-item session", f"no fork; a copy of the items: {h.fmt_time(a['sqlite_copy'])}",
              f"{h.fmt_time(a['fork_time'])}, CPU {h.fmt_time(a['fork_cpu'])} (medians of {FORKS}); "
              f"{a['fork_payload']} B of keys and values, "
              f"{h.fmt_bytes(a['fork_used'])} of pages at most"]],
            [f"Items: {h.fmt_bytes(item_bytes)} of JSON in all."])
    checks = [
        ["bytes on disk ≤ 0.5× SQLiteSession's (closed)",
         f"{h.fmt_ratio(h.ratio(a['agentcas_used'], a['sqlite_closed_bytes']))} (pages in use), "
         f"{h.fmt_ratio(h.ratio(a['agentcas_disk'], a['sqlite_closed_bytes']))} (data.mdb)",
         h.verdict(a["agentcas_disk"] <= 0.5 * a["sqlite_closed_bytes"])],
        ["bytes on disk ≤ 0.5× SQLiteSession's (open: file + WAL)",
         h.fmt_ratio(h.ratio(a["agentcas_disk"], a["sqlite_open_bytes"])),
         h.verdict(a["agentcas_disk"] <= 0.5 * a["sqlite_open_bytes"])],
        ["add_items flat: last 10% / first 10% ≤ 1.2 (wall; CPU)",
         f"{h.fmt_ratio(ac_last / ac_first)}; {h.fmt_ratio(ac_cpu_last / ac_cpu_first)}",
         f"{h.verdict(ac_last / ac_first <= 1.2)}; {h.verdict(ac_cpu_last / ac_cpu_first <= 1.2)}"],
        ["add_items ≤ 2× SQLiteSession's, last 10% (wall; CPU)",
         f"{h.fmt_ratio(ac_last / sq_last)}; {h.fmt_ratio(ac_cpu_last / sq_cpu_last)}",
         f"{h.verdict(ac_last <= 2 * sq_last)}; {h.verdict(ac_cpu_last <= 2 * sq_cpu_last)}"],
        ["fork < 16 KiB", f"{a['fork_payload']} B payload, {h.fmt_bytes(a['fork_used'])} pages",
         h.verdict(a["fork_used"] < 16384)],
        ["fork < 10 ms (wall; CPU)", f"{h.fmt_time(a['fork_time'])}; {h.fmt_time(a['fork_cpu'])}",
         f"{h.verdict(a['fork_time'] < 0.010)}; {h.verdict(a['fork_cpu'] < 0.010)}"],
    ]
    h.table("Agents SDK session: targets", ["target", "measured", "met"], checks)
    if adk is None:
        return
    sq_first, sq_last = window_medians(adk["sqlite_times"])
    ac_first, ac_last = window_medians(adk["agentcas_times"])
    h.table(f"ADK session service: {n} events", ["", "SqliteSessionService", "AgentcasSessionService"],
            [["bytes on disk", h.fmt_bytes(adk["sqlite_bytes"]),
              f"{h.fmt_bytes(adk['agentcas_disk'])} data.mdb; {h.fmt_bytes(adk['agentcas_used'])} pages in use"],
             ["append_event, median first 10% → last 10%", f"{h.fmt_time(sq_first)} → {h.fmt_time(sq_last)}",
              f"{h.fmt_time(ac_first)} → {h.fmt_time(ac_last)}"],
             ["fork_session of the whole session", "-",
              f"{h.fmt_time(adk['fork_time'])} with the new session read back; "
              f"{adk['fork_payload']} B of keys and values"]])


def main(argv: list[str]) -> int:
    quick = "--quick" in argv
    n = 300 if quick else 2000
    items = messages(n)
    item_bytes = sum(len(json.dumps(m)) for m in items)
    load = h.load_note()
    with h.work_dir("sessions") as work:
        try:
            import agents  # noqa: F401
        except ImportError:
            print("The Agents SDK is not installed (pip install -e '.[openai-agents]').\n")
            return 0
        h.progress(f"Agents SDK sessions: {n} turns")
        a = asyncio.run(bench_agents_sdk(work, items))
        adk = None
        try:
            import google.adk  # noqa: F401
        except ImportError:
            print("ADK is not installed (pip install -e '.[adk]'): Agents SDK numbers only.\n")
        else:
            h.progress(f"ADK session services: {n} events")
            adk = asyncio.run(bench_adk(work, items))
    report(n, a, adk, item_bytes)
    print(f"Load: {load} at start, {h.load_note()} at end.\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
