"""Acceptance scenario for issue 10 (the LangGraph checkpointer), written as a LangGraph user
would from LangGraph's own documentation: a StateGraph over MessagesState that pauses on
`interrupt()` and resumes with `Command(resume=...)`, a subgraph (non-empty checkpoint_ns),
parallel tasks whose writes stay pending, time travel (invoke from a past checkpoint of
`get_state_history`) and `update_state` forks, the async API, an encrypted serializer, the
thread operations (`copy_thread`, `prune`, `delete_thread`, `delete_for_runs`), and hand-over
to another store through the real `agentcas` CLI (export --sign / import, remote push/pull).

The reference is LangGraph's own savers: every graph run here is run again, step for step,
on InMemorySaver (and SqliteSaver when langgraph-checkpoint-sqlite is installed, as by the
bench extra); AgentcasSaver must show the same state history, next nodes and interrupts.
"""

from __future__ import annotations

import asyncio
import json
import operator
import os
import random
import signal
import sqlite3
import subprocess
import sys
import textwrap
from dataclasses import dataclass
import time
from pathlib import Path
from typing import Annotated

import pytest

pytest.importorskip("langgraph.graph", reason="the langgraph extra (make test installs it)")

from langchain_core.messages import AIMessage, HumanMessage  # noqa: E402
from langgraph.channels.delta import DeltaChannel  # noqa: E402
from langgraph.checkpoint.memory import InMemorySaver  # noqa: E402
from langgraph.checkpoint.serde.encrypted import EncryptedSerializer  # noqa: E402
from langgraph.graph import END, START, MessagesState, StateGraph  # noqa: E402
from langgraph.types import Command, interrupt  # noqa: E402
from typing_extensions import TypedDict  # noqa: E402

from agentcas import Store  # noqa: E402
from agentcas.errors import IntegrityError  # noqa: E402
from agentcas.langgraph import AgentcasSaver, AsyncAgentcasSaver, CorruptCheckpoint  # noqa: E402
from test_langgraph_saver import AesGcm  # noqa: E402  (an AES-GCM cipher for EncryptedSerializer)


def reference_savers():
    """LangGraph's own savers, fresh: InMemorySaver, and SqliteSaver where it is installed."""
    savers = [InMemorySaver()]
    try:
        from langgraph.checkpoint.sqlite import SqliteSaver
    except ImportError:
        return savers
    savers.append(SqliteSaver(sqlite3.connect(":memory:", check_same_thread=False)))
    return savers


def thread(thread_id, **configurable):
    return {"configurable": {"thread_id": thread_id, **configurable}}


def contents(messages):
    return [m.content for m in messages]


# -- the graphs -------------------------------------------------------------------------------

class Calls:
    """How many times each node body ran (a resumed node runs again; a completed one must not)."""

    def __init__(self):
        self.counts: dict[str, int] = {}

    def __call__(self, name):
        self.counts[name] = self.counts.get(name, 0) + 1


def review_graph(saver, calls: Calls | None = None):
    """draft -> review (interrupt) -> publish (a subgraph: prepare, then confirm (interrupt))."""
    calls = calls or Calls()

    def draft(state):
        calls("draft")
        return {"messages": [AIMessage(content=f"draft {len(state['messages'])}")]}

    def review(state):
        calls("review")
        verdict = interrupt({"question": "approve?", "draft": state["messages"][-1].content})
        return {"messages": [AIMessage(content=f"review: {verdict}")]}

    def prepare(state):
        calls("prepare")
        return {"messages": [AIMessage(content="prepared")]}

    def confirm(state):
        calls("confirm")
        answer = interrupt("publish now?")
        return {"messages": [AIMessage(content=f"published: {answer}")]}

    publish = StateGraph(MessagesState)
    publish.add_node("prepare", prepare)
    publish.add_node("confirm", confirm)
    publish.add_edge(START, "prepare")
    publish.add_edge("prepare", "confirm")
    publish.add_edge("confirm", END)

    builder = StateGraph(MessagesState)
    builder.add_node("draft", draft)
    builder.add_node("review", review)
    builder.add_node("publish", publish.compile())
    builder.add_edge(START, "draft")
    builder.add_edge("draft", "review")
    builder.add_edge("review", "publish")
    builder.add_edge("publish", END)
    return builder.compile(checkpointer=saver)


class Log(TypedDict):
    log: Annotated[list, operator.add]


def parallel_graph(saver, calls: Calls):
    """fetch and ask run in one step; ask interrupts, so fetch's write stays pending."""
    def fetch(state):
        calls("fetch")
        return {"log": ["fetched"]}

    def ask(state):
        calls("ask")
        return {"log": [f"asked: {interrupt('which?')}"]}

    builder = StateGraph(Log)
    builder.add_node("fetch", fetch)
    builder.add_node("ask", ask)
    builder.add_node("join", lambda state: {"log": ["joined"]})
    builder.add_edge(START, "fetch")
    builder.add_edge(START, "ask")
    builder.add_edge(["fetch", "ask"], "join")
    builder.add_edge("join", END)
    return builder.compile(checkpointer=saver)


def snapshot(state):
    """What a user sees of a StateSnapshot, without ids that differ run to run."""
    values = {k: contents(v) if k == "messages" else v for k, v in state.values.items()}
    return (state.metadata.get("step"), state.metadata.get("source"), state.next, values,
            [i.value for i in state.interrupts], state.parent_config is not None,
            sorted((t.name, [getattr(m, "content", m) for m in (t.result or {}).get("messages", [])])
                   for t in state.tasks))


def history(graph, config, **kwargs):
    return [snapshot(s) for s in graph.get_state_history(config, **kwargs)]


# -- 1. the same run on LangGraph's savers and on agentcas --------------------------------------

def review_session(saver):
    """Interrupt, resume, the subgraph's interrupt, time travel and an update_state fork."""
    calls = Calls()
    graph = review_graph(saver, calls)
    cfg = thread("doc-7")
    seen = []
    out = graph.invoke({"messages": [HumanMessage(content="write the release note")]}, cfg)
    seen.append(("paused", contents(out["messages"]), [i.value for i in out["__interrupt__"]]))
    seen.append(("state", snapshot(graph.get_state(cfg))))
    out = graph.invoke(Command(resume="approved"), cfg)
    seen.append(("resumed", contents(out["messages"]), [i.value for i in out["__interrupt__"]]))
    state = graph.get_state(cfg, subgraphs=True)
    seen.append(("subgraph", snapshot(state), [snapshot(t.state) for t in state.tasks if t.state]))
    out = graph.invoke(Command(resume="yes"), cfg)
    seen.append(("done", contents(out["messages"]), dict(calls.counts)))
    full = list(graph.get_state_history(cfg))
    seen.append(("history", [snapshot(s) for s in full]))

    # Time travel: run again from the checkpoint that was waiting for the review.
    waiting = next(s for s in full if s.next == ("review",))
    out = graph.invoke(None, waiting.config)
    seen.append(("replayed", contents(out["messages"]), [i.value for i in out["__interrupt__"]]))
    out = graph.invoke(Command(resume="rejected"), cfg)
    seen.append(("replay resumed", contents(out["messages"]), [i.value for i in out["__interrupt__"]]))

    # Fork: edit the past and continue from the edit.
    forked = graph.update_state(waiting.config, {"messages": [HumanMessage(content="shorter please")]})
    seen.append(("fork", snapshot(graph.get_state(forked)), snapshot(graph.get_state(cfg))))
    out = graph.invoke(Command(resume="approved"), cfg)
    seen.append(("fork resumed", contents(out["messages"]), [i.value for i in out["__interrupt__"]]))
    seen.append(("history after forks", history(graph, cfg)))
    seen.append(("filtered", history(graph, cfg, filter={"source": "update"}),
                 history(graph, cfg, limit=2), history(graph, cfg, before=forked)))
    seen.append(("calls", dict(calls.counts)))
    return seen


def test_the_review_graph_runs_exactly_as_on_langgraphs_own_savers(tmp_path):
    with AgentcasSaver.from_path(tmp_path / "store") as saver:
        ours = review_session(saver)
        namespaces = {t.config["configurable"]["checkpoint_ns"] for t in saver.list(thread("doc-7"))}
    assert any(ns.startswith("publish:") for ns in namespaces) and "" in namespaces
    for reference in reference_savers():
        assert review_session(reference) == ours, type(reference).__name__


def parallel_session(saver):
    """A sibling's write pending beside an interrupt; time travel to that step; a fork of it."""
    calls = Calls()
    graph = parallel_graph(saver, calls)
    cfg = thread("par")
    seen = []
    graph.invoke({"log": ["start"]}, cfg)
    seen.append(snapshot(graph.get_state(cfg)))
    seen.append(graph.invoke(Command(resume="old answer"), cfg))
    seen.append(dict(calls.counts))  # fetch ran once: its pending write was used on resume
    step0 = next(s for s in graph.get_state_history(cfg) if s.metadata["step"] == 0)
    graph.invoke(None, step0.config)
    seen.append(snapshot(graph.get_state(cfg)))
    seen.append(graph.invoke(Command(resume="new answer"), cfg))
    fork = graph.update_state(step0.config, {"log": ["patched"]}, as_node="fetch")
    seen.append(snapshot(graph.get_state(fork)))
    seen.append(graph.invoke(Command(resume="third answer"), cfg))
    seen.append(history(graph, cfg))
    seen.append(dict(calls.counts))
    return seen


def test_pending_writes_of_parallel_tasks_and_their_forks_match_langgraphs_savers(tmp_path):
    with AgentcasSaver.from_path(tmp_path / "store") as saver:
        ours = parallel_session(saver)
    for reference in reference_savers():
        assert parallel_session(reference) == ours, type(reference).__name__


# -- 2. forks: old branches stay listed, their writes never reach the fork, the CLI shows them ----

def test_forks_keep_the_old_branch_listed_and_its_writes_out_of_the_fork(tmp_path, run):
    path = tmp_path / "store"
    calls = Calls()
    with AgentcasSaver.from_path(path) as saver:
        graph = parallel_graph(saver, calls)
        cfg = thread("branchy")
        graph.invoke({"log": ["start"]}, cfg)
        paused = graph.get_state(cfg)
        # The abandoned branch: the step-0 checkpoint holds fetch's write and ask's interrupt,
        # then the resume value "ABANDONED".
        graph.invoke(Command(resume="ABANDONED"), cfg)
        before = {t.checkpoint["id"] for t in saver.list(cfg)}
        start = next(s for s in graph.get_state_history(cfg) if s.metadata["source"] == "input")

        # Time travel to the input checkpoint (a new branch), then edit that branch's head.
        graph.invoke(None, start.config)
        forked = graph.update_state(graph.get_state(cfg).config, {"log": ["edited"]})
        fork_tuple = saver.get_tuple(forked)
        assert fork_tuple.pending_writes == []
        out = graph.invoke(Command(resume="fresh"), cfg)
        assert out["log"] == ["start", "edited", "asked: fresh", "fetched", "joined"]  # as InMemorySaver

        after = list(saver.list(cfg))
        assert before <= {t.checkpoint["id"] for t in after}  # the old branch is still listed
        fork_line = []
        node = saver.get_tuple(cfg)
        while node is not None:
            fork_line.append(node)
            node = saver.get_tuple(node.parent_config) if node.parent_config else None
        for tup in fork_line:  # no checkpoint of the new line carries the abandoned answer
            assert all(v != "ABANDONED" for _, _, v in tup.pending_writes)
            assert "asked: ABANDONED" not in tup.checkpoint["channel_values"].get("log", [])
        # The paused checkpoint of the old branch still has its own writes.
        old = saver.get_tuple(paused.config)
        assert {ch for _, ch, _ in old.pending_writes} >= {"log", "__interrupt__"}
        lg_line = {t.checkpoint["id"] for t in fork_line}

    log = run("--json", "log", "langgraph/branchy", store=path)
    assert log.code == 0, log
    reasons = [e["reason"] for e in log.json()["checkpoints"]]
    assert {r.split()[4] for r in reasons} == lg_line  # `log` is the thread's current line
    lineage = run("--json", "lineage", store=path)
    assert lineage.code == 0, lineage
    root = next(t for t in lineage.json()["threads"] if t["thread"] == "langgraph/branchy")
    branches = {c["thread"] for c in root["children"]}
    assert branches and all(b.startswith("langgraph/branchy/branches/") for b in branches)
    assert all(c["forked_from"]["thread"] == "langgraph/branchy" for c in root["children"])
    # The old branch stays alive for gc: after a gc keeping nothing for its age, every
    # checkpoint still reads back the same in a new process.
    with AgentcasSaver.from_path(path) as saver:
        listed = [(t.checkpoint["id"], repr(t.checkpoint["channel_values"]), repr(t.pending_writes))
                  for t in saver.list(thread("branchy"))]
    assert run("gc", "--grace", "0s", store=path).code == 0
    assert run("fsck", store=path).code == 0
    with AgentcasSaver.from_path(path) as saver:
        assert [(t.checkpoint["id"], repr(t.checkpoint["channel_values"]), repr(t.pending_writes))
                for t in saver.list(thread("branchy"))] == listed


# -- 3. the async API -----------------------------------------------------------------------------

async def async_session(saver):
    graph = review_graph(saver)
    cfg = thread("async-1")
    await graph.ainvoke({"messages": [HumanMessage(content="hello")]}, cfg)
    seen = [snapshot(await graph.aget_state(cfg))]
    async for _ in graph.astream(Command(resume="ok"), cfg, stream_mode="updates"):
        pass
    await graph.ainvoke(Command(resume="go"), cfg)
    states = [s async for s in graph.aget_state_history(cfg)]
    seen.append([snapshot(s) for s in states])
    await graph.aupdate_state(states[2].config, {"messages": [HumanMessage(content="edit")]})
    await graph.ainvoke(Command(resume="again"), cfg)
    seen.append([snapshot(s) async for s in graph.aget_state_history(cfg)])
    seen.append(len([t async for t in saver.alist(cfg)]))
    return seen


def test_the_async_api_matches_in_memory_saver_and_does_every_thread_operation(tmp_path):
    async def main():
        async with AsyncAgentcasSaver.from_path(str(tmp_path / "store")) as saver:
            ours = await async_session(saver)
            cfg = thread("async-1")
            assert (await saver.aget_tuple(cfg)).checkpoint["id"] == \
                (await review_graph(saver).aget_state(cfg)).config["configurable"]["checkpoint_id"]
            await saver.acopy_thread("async-1", "async-2")
            assert len([t async for t in saver.alist(thread("async-2"))]) == ours[-1]
            await saver.aprune(["async-2"])
            kept = [t async for t in saver.alist(thread("async-2"))]
            assert len(kept) == len({t.config["configurable"]["checkpoint_ns"] for t in kept})
            await review_graph(saver).ainvoke({"messages": [HumanMessage(content="x")]},
                                              {**thread("async-3"), "metadata": {"run_id": "r-async"}})
            await saver.adelete_for_runs(["r-async"])
            assert [t async for t in saver.alist(thread("async-3"))] == []
            await saver.adelete_thread("async-1")
            assert await saver.aget_tuple(cfg) is None
            return ours

    ours = asyncio.run(main())
    assert asyncio.run(async_session(InMemorySaver())) == ours


# -- 4. the encrypted serializer ----------------------------------------------------------------

def test_an_encrypted_thread_round_trips_and_keeps_no_plaintext_on_disk(tmp_path):
    key = os.urandom(32)
    path = tmp_path / "store"
    with AgentcasSaver.from_path(path, serde=EncryptedSerializer(AesGcm(key))) as saver:
        graph = review_graph(saver)
        graph.invoke({"messages": [HumanMessage(content="the vault code is 8812-0071")]}, thread("enc"))
        graph.invoke(Command(resume="approved"), thread("enc"))
    assert not any(b"8812-0071" in f.read_bytes() for f in path.iterdir() if f.is_file())
    with AgentcasSaver.from_path(path, serde=EncryptedSerializer(AesGcm(key))) as saver:
        graph = review_graph(saver)
        state = graph.get_state(thread("enc"))
        assert state.interrupts[0].value == "publish now?"
        out = graph.invoke(Command(resume="yes"), thread("enc"))
        assert contents(out["messages"])[0] == "the vault code is 8812-0071"
        assert contents(out["messages"])[-1] == "published: yes"
    with AgentcasSaver.from_path(path, serde=EncryptedSerializer(AesGcm(os.urandom(32)))) as saver:
        with pytest.raises(Exception) as err:  # the wrong key: an error naming the checkpoint, no state
            saver.get_tuple(thread("enc"))
        assert "LangGraph checkpoint" in str(err.value)


# -- 5. copy_thread, prune, delete_thread, delete_for_runs on a real graph ----------------------

def test_thread_operations_on_a_paused_graph(tmp_path, run):
    path = tmp_path / "store"
    with AgentcasSaver.from_path(path) as saver:
        graph = review_graph(saver)
        graph.invoke({"messages": [HumanMessage(content="hi")]}, {**thread("job"), "metadata": {"run_id": "run-1"}})
        graph.invoke(Command(resume="ok"), {**thread("job"), "metadata": {"run_id": "run-2"}})
        job_ids = {t.checkpoint["id"] for t in saver.list(thread("job"))}

        saver.copy_thread("job", "job-copy")
        copied = list(saver.list(thread("job-copy")))
        assert {t.checkpoint["id"] for t in copied} == job_ids
        assert {t.config["configurable"]["thread_id"] for t in copied} == {"job-copy"}
        # Listing every thread names each checkpoint by the thread it is on.
        everything = [t.config["configurable"]["thread_id"] for t in saver.list(None)]
        assert sorted(everything) == sorted(["job"] * len(job_ids) + ["job-copy"] * len(job_ids))
        assert [t.config["configurable"]["thread_id"] for t in saver.list(None, filter={"run_id": "run-2"})
                ].count("job-copy") == len([t for t in copied if t.metadata.get("run_id") == "run-2"])
        # The copy resumes at the subgraph's interrupt; the source does not move.
        out = graph.invoke(Command(resume="yes"), thread("job-copy"))
        assert contents(out["messages"])[-1] == "published: yes"
        assert graph.get_state(thread("job")).next == ("publish",)

        saver.prune(["job-copy"])
        kept = list(saver.list(thread("job-copy")))
        assert len(kept) == len({t.config["configurable"]["checkpoint_ns"] for t in kept})
        assert contents(graph.get_state(thread("job-copy")).values["messages"])[-1] == "published: yes"
        # Pruning a thread paused at an interrupt keeps the interrupt: it still resumes.
        saver.prune(["job"])
        assert len(list(saver.list(thread("job", checkpoint_ns="")))) == 1
        assert graph.get_state(thread("job")).interrupts[0].value == "publish now?"
        out = graph.invoke(Command(resume="after the prune"), thread("job"))
        assert contents(out["messages"])[-2:] == ["prepared", "published: after the prune"]

        graph.invoke({"messages": [HumanMessage(content="two")]}, {**thread("runs"), "metadata": {"run_id": "keep"}})
        graph.invoke(Command(resume="ok"), {**thread("runs"), "metadata": {"run_id": "drop"}})
        saver.delete_for_runs(["drop"])
        left = list(saver.list(thread("runs")))
        assert left and {t.metadata["run_id"] for t in left} == {"keep"}
        assert all(t.config["configurable"]["checkpoint_ns"] == "" for t in left)  # the subgraph ran in "drop"

        saver.delete_thread("job")
        assert list(saver.list(thread("job"))) == [] and saver.get_tuple(thread("job")) is None
        assert graph.get_state(thread("job")).values == {}
        assert graph.get_state(thread("job-copy")).values  # the copy does not depend on the source's refs
    branches = run("--json", "branch", store=path)
    assert branches.code == 0
    names = {t["thread"] for t in branches.json()["threads"]}
    assert not any(n == "langgraph/job" or n.startswith("langgraph/job/") for n in names)
    assert "langgraph/job-copy" in names
    assert run("gc", "--grace", "0s", store=path).code == 0
    assert run("fsck", store=path).code == 0
    with AgentcasSaver.from_path(path) as saver:
        graph = review_graph(saver)
        assert contents(graph.get_state(thread("job-copy")).values["messages"])[-1] == "published: yes"


# -- 6. hand-over to another store through the CLI ----------------------------------------------

def test_export_signed_then_import_resumes_at_the_pending_interrupt(tmp_path, run):
    here, there = tmp_path / "here", tmp_path / "there"
    calls_here = Calls()
    with AgentcasSaver.from_path(here) as saver:
        parallel_graph(saver, calls_here).invoke({"log": ["start"]}, thread("hand"))
        review_graph(saver).invoke({"messages": [HumanMessage(content="q")]}, thread("rev"))
        review_graph(saver).invoke(Command(resume="ok"), thread("rev"))
        subgraph_threads = sorted(n for n in saver.store.threads.under("langgraph/rev") if "/ns/" in n)
    assert run("keygen", "alice", "--out", tmp_path).code == 0
    assert run("init", there).code == 0
    assert run("trust", "add", "alice", tmp_path / "alice.pub", store=there).code == 0
    # Each agentcas thread of the LangGraph threads travels in its own signed bundle.
    for i, name in enumerate(["langgraph/hand", "langgraph/rev"] + subgraph_threads):
        bundle = tmp_path / f"b{i}.bundle"
        r = run("export", name, "-o", bundle, "--sign", tmp_path / "alice.key", store=here)
        assert r.code == 0, r
        r = run("import", bundle, store=there)
        assert r.code == 0 and "good signature" in r.out, r

    reference, calls_ref = InMemorySaver(), Calls()
    parallel_graph(reference, calls_ref).invoke({"log": ["start"]}, thread("hand"))
    review_graph(reference).invoke({"messages": [HumanMessage(content="q")]}, thread("rev"))
    review_graph(reference).invoke(Command(resume="ok"), thread("rev"))

    calls_there = Calls()
    with AgentcasSaver.from_path(there) as saver:
        graph, ref_graph = parallel_graph(saver, calls_there), parallel_graph(reference, calls_ref)
        assert snapshot(graph.get_state(thread("hand"))) == snapshot(ref_graph.get_state(thread("hand")))
        assert graph.invoke(Command(resume="B"), thread("hand")) == ref_graph.invoke(Command(resume="B"), thread("hand"))
        assert "fetch" not in calls_there.counts  # fetch's pending write came along: it did not run again
        assert history(graph, thread("hand")) == history(ref_graph, thread("hand"))

        graph, ref_graph = review_graph(saver), review_graph(reference)
        state, ref_state = graph.get_state(thread("rev"), subgraphs=True), ref_graph.get_state(thread("rev"), subgraphs=True)
        assert snapshot(state) == snapshot(ref_state)
        assert [snapshot(t.state) for t in state.tasks] == [snapshot(t.state) for t in ref_state.tasks]
        out = graph.invoke(Command(resume="ship it"), thread("rev"))
        assert contents(out["messages"]) == contents(ref_graph.invoke(Command(resume="ship it"), thread("rev"))["messages"])
    assert run("fsck", store=there).code == 0


def test_push_and_pull_through_a_remote_carry_a_paused_thread(tmp_path, run):
    here, backup = tmp_path / "here", tmp_path / "backup"
    with AgentcasSaver.from_path(here) as saver:
        graph = review_graph(saver)
        graph.invoke({"messages": [HumanMessage(content="q")]}, thread("sync"))
        start = list(graph.get_state_history(thread("sync")))[-1]
        graph.update_state(start.config, {"messages": [HumanMessage(content="q2")]})  # a fork
        graph.invoke(None, thread("sync"))
        paused = snapshot(graph.get_state(thread("sync")))
    assert run("init", backup).code == 0
    assert run("remote", "add", "backup", backup, store=here).code == 0
    r = run("push", "backup", "langgraph/sync", store=here)
    assert r.code == 0, r
    with AgentcasSaver.from_path(backup) as saver:
        graph = review_graph(saver)
        assert snapshot(graph.get_state(thread("sync"))) == paused
        graph.invoke(Command(resume="from the backup"), thread("sync"))
        there = snapshot(graph.get_state(thread("sync")))
    r = run("pull", "backup", "langgraph/sync", store=here)
    assert r.code == 0, r
    with AgentcasSaver.from_path(here) as saver:
        graph = review_graph(saver)
        assert snapshot(graph.get_state(thread("sync"))) == there
        out = graph.invoke(Command(resume="done"), thread("sync"))
        assert contents(out["messages"])[-2:] == ["prepared", "published: done"]
        assert any(n.startswith("langgraph/sync/branches/") for n in saver.store.threads.under("langgraph/sync"))
    assert run("fsck", store=here).code == 0


# -- 7. several processes, SIGKILL, corruption ---------------------------------------------------

WRITER = textwrap.dedent("""
    import json, os, sys
    from langchain_core.messages import AIMessage, HumanMessage
    from langgraph.graph import END, START, MessagesState, StateGraph
    from agentcas.langgraph import AgentcasSaver

    path, who, count, log = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)

    class Logged(AgentcasSaver):
        def put(self, config, checkpoint, metadata, new_versions):
            os.write(fd, f"start {checkpoint['id']}\\n".encode())
            stored = super().put(config, checkpoint, metadata, new_versions)
            os.write(fd, f"done {checkpoint['id']}\\n".encode())
            return stored

    with Logged.from_path(path) as saver:
        builder = StateGraph(MessagesState)
        builder.add_node("agent", lambda s: {"messages": [AIMessage(content=f"{who} {len(s['messages'])}")]})
        builder.add_edge(START, "agent")
        builder.add_edge("agent", END)
        graph = builder.compile(checkpointer=saver)
        os.write(fd, b"ready\\n")
        i = 0
        while count < 0 or i < count:
            graph.invoke({"messages": [HumanMessage(content=f"{who} says {i}")]},
                         {"configurable": {"thread_id": "shared"}}, durability="sync")
            i += 1
""")


def _writer(tmp_path, path, who, count):
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    log = tmp_path / f"{who}.log"
    return subprocess.Popen([sys.executable, str(script), str(path), who, str(count), str(log)]), log


def _logged(log: Path) -> tuple[list[str], list[str]]:
    lines = log.read_text().splitlines()
    return [l.split()[1] for l in lines if l.startswith("start")], [l.split()[1] for l in lines if l.startswith("done")]


def test_two_processes_on_one_thread_lose_no_checkpoint(tmp_path):
    path = tmp_path / "store"
    AgentcasSaver(str(path)).close()
    procs = [_writer(tmp_path, path, who, 8) for who in ("A", "B")]
    assert [p.wait(timeout=120) for p, _ in procs] == [0, 0]
    written = set()
    for _, log in procs:
        written |= set(_logged(log)[1])
    with AgentcasSaver.from_path(path) as saver:
        listed = [t.checkpoint["id"] for t in saver.list(thread("shared"))]
        assert len(listed) == len(written) == 2 * 8 * 3 and set(listed) == written
        assert saver.store.gc.fsck().to_json()["ok"]


def test_sigkill_during_puts_leaves_the_old_or_the_new_checkpoint(tmp_path):
    rng = random.Random(10)
    for trial in range(3):
        path = tmp_path / f"store{trial}"
        AgentcasSaver(str(path)).close()
        proc, log = _writer(tmp_path, path, f"k{trial}", -1)
        while not (log.exists() and "ready" in log.read_text()):
            assert proc.poll() is None, "the writer died before its first invoke"
            time.sleep(0.01)
        time.sleep(rng.uniform(0.05, 0.4))
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        started, done = _logged(log)
        store = Store.open(str(path))
        assert store.gc.fsck().to_json()["ok"]
        store.close()
        with AgentcasSaver.from_path(path) as saver:
            head = saver.get_tuple(thread("shared"))
            head_id = head.checkpoint["id"] if head else None
            in_flight = started[-1] if started and (not done or started[-1] != done[-1]) else None
            assert head_id in {done[-1] if done else None, in_flight}
            listed = {t.checkpoint["id"] for t in saver.list(thread("shared"))}
            assert set(done) <= listed
            # The graph goes on from there.
            builder = StateGraph(MessagesState)
            builder.add_node("agent", lambda s: {"messages": [AIMessage(content="after the crash")]})
            builder.add_edge(START, "agent")
            builder.add_edge("agent", END)
            out = builder.compile(checkpointer=saver).invoke({"messages": [HumanMessage(content="hi")]},
                                                             thread("shared"))
            assert contents(out["messages"])[-1] == "after the crash"


def _flip_each_object(path: Path):
    """Yield (object id, where) with that stored object's bytes damaged, restoring it after."""
    import lmdb
    from agentcas.cas.store import TABLES
    env = lmdb.open(str(path), max_dbs=len(TABLES) + 2)
    with env.begin() as txn:
        keys = [bytes(k) for k, _ in txn.cursor(db=env.open_db(b"objects", txn=txn))]
    env.close()
    for key in keys:
        for where in ("middle", "last"):
            env = lmdb.open(str(path), max_dbs=len(TABLES) + 2)
            db = env.open_db(b"objects")
            with env.begin(write=True) as txn:
                value = bytearray(txn.get(key, db=db))
                original = bytes(value)
                value[len(value) // 2 if where == "middle" else -1] ^= 0x55
                txn.put(key, bytes(value), db=db)
            env.close()
            try:
                yield key, where
            finally:
                env = lmdb.open(str(path), max_dbs=len(TABLES) + 2)
                with env.begin(write=True) as txn:
                    txn.put(key, original, db=env.open_db(b"objects", txn=txn))
                env.close()


def test_every_damaged_object_raises_corrupt_checkpoint_naming_it_or_is_not_needed(tmp_path):
    path = tmp_path / "store"

    def read(saver):
        head = saver.get_tuple(thread("t"))
        listed = [(t.checkpoint["id"], repr(t.checkpoint["channel_values"]), repr(t.pending_writes),
                   repr(t.metadata)) for t in saver.list(thread("t"))]
        return head.checkpoint["id"], repr(head.checkpoint["channel_values"]), listed

    with AgentcasSaver.from_path(path) as saver:
        graph = review_graph(saver)
        graph.invoke({"messages": [HumanMessage(content="a long question " * 20)]}, thread("t"))
        graph.invoke(Command(resume="approved " * 10), thread("t"))
        want = read(saver)
    outcomes = {}
    for key, where in _flip_each_object(path):
        try:
            with AgentcasSaver.from_path(path) as saver:
                got = read(saver)
        except CorruptCheckpoint as exc:
            assert key.hex() in str(exc), (key.hex(), where, str(exc))
            assert "LangGraph" in str(exc)
            outcomes[(key, where)] = "raised"
        else:
            assert got == want, (key.hex(), where)  # never a wrong state
            outcomes[(key, where)] = "unused"
    assert "raised" in outcomes.values()


# -- 8. names: nested subgraphs and long thread ids ----------------------------------------------

def nested_graph(saver):
    """outer -> middle (a subgraph) -> inner (a subgraph of it) -> leaf (interrupt): the inner
    namespace `middle:<task>|inner:<task>` is longer than a ref-name component holds."""
    def leaf(state):
        return {"messages": [AIMessage(content=f"leaf: {interrupt('leaf?')}")]}

    inner = StateGraph(MessagesState)
    inner.add_node("leaf", leaf)
    inner.add_edge(START, "leaf")
    inner.add_edge("leaf", END)
    middle = StateGraph(MessagesState)
    middle.add_node("inner", inner.compile())
    middle.add_edge(START, "inner")
    middle.add_edge("inner", END)
    outer = StateGraph(MessagesState)
    outer.add_node("middle", middle.compile())
    outer.add_edge(START, "middle")
    outer.add_edge("middle", END)
    return outer.compile(checkpointer=saver)


def nested_session(saver):
    graph, cfg = nested_graph(saver), thread("nest")
    graph.invoke({"messages": [HumanMessage(content="hi")]}, cfg)
    namespaces = sorted({t.config["configurable"]["checkpoint_ns"] for t in saver.list(cfg)})
    shape = [ns.count("|") for ns in namespaces]
    everywhere = sorted({t.config["configurable"]["checkpoint_ns"] for t in saver.list(None)})
    per_namespace = [[snapshot(s) for s in graph.get_state_history(thread("nest", checkpoint_ns=ns))]
                     for ns in namespaces]
    out = graph.invoke(Command(resume="ok"), cfg)
    return namespaces, everywhere, (shape, per_namespace, contents(out["messages"]))


def test_nested_subgraph_namespaces_are_listed_under_their_own_names(tmp_path):
    with AgentcasSaver.from_path(tmp_path / "store") as saver:
        namespaces, everywhere, ours = nested_session(saver)
        assert any("%h" in n for n in saver.store.threads.under("langgraph/nest"))  # a hashed ref name
    assert namespaces == everywhere
    assert all(ns == "" or ns.startswith("middle:") for ns in namespaces), namespaces
    assert nested_session(InMemorySaver())[2] == ours


def test_listing_every_thread_names_long_and_copied_thread_ids_right(tmp_path):
    long_id, long_copy = "tenant-42/" + "x" * 100, "tenant-42/" + "y" * 100
    with AgentcasSaver.from_path(tmp_path / "store") as saver:
        graph = review_graph(saver)
        graph.invoke({"messages": [HumanMessage(content="hi")]}, thread(long_id))
        saver.copy_thread(long_id, "short-copy")
        saver.copy_thread(long_id, long_copy)
        graph.invoke(Command(resume="ok"), thread(long_copy))
        counts = {}
        for t in saver.list(None):
            counts[t.config["configurable"]["thread_id"]] = counts.get(t.config["configurable"]["thread_id"], 0) + 1
        mine = len(list(saver.list(thread(long_id))))
        assert counts == {long_id: mine, "short-copy": mine, long_copy: len(list(saver.list(thread(long_copy))))}
        for t in saver.list(None):  # every config listed opens the checkpoint it came from
            assert saver.get_tuple(t.config).checkpoint["id"] == t.checkpoint["id"]


# -- 9. prune keeps what a DeltaChannel needs ---------------------------------------------------

def _extend(state, writes):  # a DeltaChannel reducer: one call with a batch of writes
    out = list(state or [])
    for write in writes:
        out.extend(write)
    return out


@pytest.mark.parametrize("every", [3, 50])
def test_prune_keep_latest_keeps_a_delta_channels_state(tmp_path, every):
    Notes = TypedDict("Notes", {"notes": Annotated[list, DeltaChannel(_extend, snapshot_frequency=every)]})

    def build(saver):
        builder = StateGraph(Notes)
        builder.add_node("note", lambda state: {"notes": [f"note {len(state['notes'])}"]})
        builder.add_edge(START, "note")
        builder.add_edge("note", END)
        return builder.compile(checkpointer=saver)

    reference = build(InMemorySaver())
    with AgentcasSaver.from_path(tmp_path / "store") as saver:
        graph = build(saver)
        for i in range(5):
            graph.invoke({"notes": [f"input {i}"]}, thread("d"))
            reference.invoke({"notes": [f"input {i}"]}, thread("d"))
        before = len(list(saver.list(thread("d"))))
        saver.prune(["d"])
        after = len(list(saver.list(thread("d"))))
        assert graph.get_state(thread("d")).values == reference.get_state(thread("d")).values
        if every == 3:
            assert after < before  # back to the nearest snapshot only, not the whole thread
        graph.invoke({"notes": ["more"]}, thread("d"))
        reference.invoke({"notes": ["more"]}, thread("d"))
        assert graph.get_state(thread("d")).values == reference.get_state(thread("d")).values
        assert saver.store.gc.fsck().to_json()["ok"]


# -- 10. values whose == is elementwise (numpy arrays) -------------------------------------------

class Elementwise:
    """What numpy's `a == b` returns for arrays: no truth value (bool() raises)."""

    def __init__(self, items):
        self.items = items

    def __bool__(self):
        raise ValueError("The truth value of an array with more than one element is ambiguous")


@dataclass(eq=False)
class Vector:
    """A stand-in for a numpy array in graph state (== elementwise, as numpy's)."""

    xs: list

    def __eq__(self, other):
        return Elementwise([a == b for a, b in zip(self.xs, other.xs)])


class Embedded(TypedDict):
    vectors: list  # a plain list channel a node overwrites with recomputed vectors


def test_a_list_of_values_without_a_truth_valued_eq_is_stored(tmp_path):
    def build(saver):
        builder = StateGraph(Embedded)
        builder.add_node("embed", lambda state: {"vectors": [Vector([1.0, 2.0]) for _ in state["vectors"]]
                                                 + [Vector([3.0, float(len(state["vectors"]))])]})
        builder.add_edge(START, "embed")
        builder.add_edge("embed", END)
        return builder.compile(checkpointer=saver)

    def session(saver):
        graph = build(saver)
        for _ in range(2):
            graph.invoke({"vectors": [Vector([0.0, 0.0])]}, thread("vec"))
        return [[v.xs for v in s.values.get("vectors", [])] for s in graph.get_state_history(thread("vec"))]

    with AgentcasSaver.from_path(tmp_path / "store") as saver:
        ours = session(saver)
    assert ours == session(InMemorySaver())
    with AgentcasSaver.from_path(tmp_path / "store") as saver:  # and it reads back in a new saver
        assert [[v.xs for v in s.values.get("vectors", [])]
                for s in build(saver).get_state_history(thread("vec"))] == ours
