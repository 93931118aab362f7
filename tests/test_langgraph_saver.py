"""AgentcasSaver (agentcas/langgraph): LangGraph's conformance suite, real graphs, forks,
pending writes, several processes, crashes, corruption, and hand-over through the CLI."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest

from support import raw_objects

pytest.importorskip("langgraph.checkpoint.conformance",
                    reason="the langgraph extra (pip install -e '.[langgraph]'; make test installs it)")

from langchain_core.messages import AIMessage, HumanMessage  # noqa: E402
from langgraph.checkpoint.base import empty_checkpoint  # noqa: E402
from langgraph.checkpoint.base.id import uuid6  # noqa: E402
from langgraph.checkpoint.serde.encrypted import EncryptedSerializer  # noqa: E402
from langgraph.graph import END, START, MessagesState, StateGraph  # noqa: E402
from langgraph.types import Command, interrupt  # noqa: E402

from agentcas import Store  # noqa: E402
from agentcas.langgraph import AgentcasSaver, CorruptCheckpoint, thread_name  # noqa: E402

from support.ciphers import AesGcm  # noqa: E402


def chat_graph(saver):
    builder = StateGraph(MessagesState)
    builder.add_node("agent", lambda state: {"messages": [AIMessage(content=f"reply {len(state['messages'])}")]})
    builder.add_edge(START, "agent")
    builder.add_edge("agent", END)
    return builder.compile(checkpointer=saver)


def asking_graph(saver):
    def ask(state):
        answer = interrupt("continue?")
        return {"messages": [AIMessage(content=f"you said {answer}")]}

    builder = StateGraph(MessagesState)
    builder.add_node("ask", ask)
    builder.add_edge(START, "ask")
    builder.add_edge("ask", END)
    return builder.compile(checkpointer=saver)


def config(thread="t", checkpoint_id=None, ns=""):
    conf = {"thread_id": thread, "checkpoint_ns": ns}
    if checkpoint_id:
        conf["checkpoint_id"] = checkpoint_id
    return {"configurable": conf}


def put(saver, thread, parent=None, values=None, versions=None, new_versions=None, step=0, checkpoint_id=None,
        **metadata):
    cp = empty_checkpoint()
    cp["id"] = checkpoint_id or str(uuid6(clock_seq=step))
    cp["channel_values"] = dict(values or {})
    cp["channel_versions"] = dict(versions if versions is not None else {k: 1 for k in (values or {})})
    stored = saver.put(config(thread, parent), cp, {"source": "loop", "step": step, **metadata},
                       new_versions if new_versions is not None else dict(cp["channel_versions"]))
    return stored["configurable"]["checkpoint_id"]


@pytest.fixture
def saver(tmp_path):
    with AgentcasSaver.from_path(str(tmp_path / "store")) as s:
        yield s


# -- the official suite ---------------------------------------------------------------------------

def test_conformance_every_capability(tmp_path):
    from langgraph.checkpoint.conformance import checkpointer_test, validate
    from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES

    @checkpointer_test(name="AgentcasSaver")
    async def factory():
        with AgentcasSaver.from_path(str(tmp_path / f"s-{uuid.uuid4().hex}")) as s:
            yield s

    report = asyncio.run(validate(factory))
    failures = {name: r.failures for name, r in report.results.items() if r.failures}
    assert not failures
    assert {name for name, r in report.results.items() if r.detected} == {c.value for c in ALL_CAPABILITIES}
    assert report.passed_all() and report.conformance_level() == "FULL"


# -- mapping and storage --------------------------------------------------------------------------

def test_each_checkpoint_is_an_agentcas_checkpoint_and_messages_are_rollout_items(saver):
    graph = chat_graph(saver)
    for i in range(3):
        graph.invoke({"messages": [HumanMessage(content=f"hello {i}", id=f"h{i}")]}, config())
    state = graph.get_state(config())
    assert [m.content for m in state.values["messages"]] == [
        "hello 0", "reply 1", "hello 1", "reply 3", "hello 2", "reply 5"]
    log = [item.to_json() for item in saver.store.threads.log("langgraph/t")]
    listed = list(saver.list(config()))
    assert len(log) == len(listed) == 9  # input, after __start__, after agent: per invoke
    assert all(entry["reason"].startswith("langgraph step ") for entry in log)
    assert [e["reason"].split()[2] for e in log[:3]] == ["7", "6", "5"]  # the steps (from -1), newest first
    records = [json.loads(line) for line in b"".join(saver.store.history.read("langgraph/t")).splitlines()]
    items = [r for r in records if r["k"] == "item"]
    assert len(items) == 6 and {r["ch"] for r in items} == {"messages"}  # each message stored once
    # An older checkpoint's message list is a prefix of the history, read back exactly.
    oldest_with_two = [t for t in listed if len(t.checkpoint["channel_values"].get("messages", [])) == 2][0]
    assert [m.content for m in oldest_with_two.checkpoint["channel_values"]["messages"]] == ["hello 0", "reply 1"]


def test_an_unchanged_channel_is_never_stored_twice(saver):
    """A large value is a file (an unchanged one keeps its blob); a small one a record in the
    history (an unchanged one keeps naming that record)."""
    big, small = "x" * 5000, "kept " * 20
    first = put(saver, "u", values={"a": "v1", "b": big, "c": small}, versions={"a": 1, "b": 1, "c": 1}, step=0)
    second = put(saver, "u", parent=first, values={"a": "v2", "b": big, "c": small}, versions={"a": 2, "b": 1, "c": 1},
                 new_versions={"a": 2}, step=1)
    trees = [saver.store.checkpoints.get(e["checkpoint"])[1].tree for e in [item.to_json() for item in saver.store.threads.log("langgraph/u")]]
    entries = [saver.store.checkpoints.tree_files(tree, content=False) for tree in trees]
    assert entries[0]["values/b"].id == entries[1]["values/b"].id
    assert not {"values/a", "values/c"} & (entries[0].keys() | entries[1].keys())
    records = [json.loads(line) for line in b"".join(saver.store.history.read("langgraph/u")).splitlines()]
    assert [r["ch"] for r in records if r["k"] == "val"] == ["a", "c", "a"]  # c once, a per version
    for reader in (saver, AgentcasSaver(saver.store)):
        assert reader.get_tuple(config("u", second)).checkpoint["channel_values"] == {"a": "v2", "b": big, "c": small}
        assert reader.get_tuple(config("u", first)).checkpoint["channel_values"] == {"a": "v1", "b": big, "c": small}


def _saved(tuples):
    return [(t.config["configurable"]["checkpoint_id"], [(m.id, m.content) for m in t.checkpoint["channel_values"].get(
        "messages", [])], [(task, ch, getattr(v, "__len__", None) and len(v)) for task, ch, v in t.pending_writes])
            for t in tuples]


def test_a_message_is_stored_once_its_write_and_item_name_those_bytes(saver):
    """The input checkpoint's value holds the message; its pending write and the next
    checkpoint's list item name that record's bytes (seq, offset, length) instead of
    repeating them, and every reader (a cold one too, after a run is deleted and gc ran)
    gets the same messages and writes back."""
    graph = chat_graph(saver)
    for i in range(3):
        graph.invoke({"messages": [HumanMessage(content=f"question {i} " + "words " * 60, id=f"q{i}")]},
                     {"configurable": {"thread_id": "once", "run_id": f"run-{i}"}})
    raw = b"".join(saver.store.history.read("langgraph/once"))
    records = [json.loads(line) for line in raw.splitlines()]
    for i in range(3):
        holding = [r for r in records if f"question {i} " in r.get("x", "")]  # latin-1 text of the bytes
        assert [r["k"] for r in holding] == ["val"]  # the message's bytes, once
    named = [r for r in records if "r" in r]
    assert {r["k"] for r in named} == {"write", "item"} and all("x" not in r and "v" not in r for r in named)
    expected = _saved(saver.list(config("once")))
    assert len(expected) == 9 and expected[0][1][-2][1].startswith("question 2 ")
    assert _saved(AgentcasSaver(saver.store).list(config("once"))) == expected
    cold = AgentcasSaver(saver.store)  # one checkpoint at a time: a named record before the range read
    assert _saved(cold.get_tuple(config("once", cp_id)) for cp_id, _, _ in expected) == expected
    # The first run's checkpoints go and gc runs: the later ones still read their messages,
    # whose bytes the deleted input checkpoint's record held (records stay in the history).
    saver.delete_for_runs(["run-0"])
    saver.store.gc.run(grace=0, expire_reflog=0, wait=0)
    assert saver.store.gc.fsck().to_json()["ok"]
    kept = _saved(AgentcasSaver(saver.store).list(config("once")))
    assert len(kept) == 6 and [m for _, m, _ in kept] == [m for _, m, _ in expected[:6]]
    assert kept[0][1][0] == ("q0", "question 0 " + "words " * 60)


def test_a_reference_to_no_record_raises_a_clear_error(saver, monkeypatch):
    from agentcas.langgraph import writes as writes_module
    first = put(saver, "bad", values={"v": 1}, step=0)
    monkeypatch.setattr(writes_module, "value_fields", lambda data, earlier: {"r": 10 ** 6, "o": 0, "n": 5})
    saver.put_writes(config("bad", first), [("ch", "a value")], "task-1")
    monkeypatch.undo()
    for reader in (saver, AgentcasSaver(saver.store)):
        with pytest.raises(CorruptCheckpoint, match=f"{first}.*names no record"):
            reader.get_tuple(config("bad", first))


def test_writes_sent_before_their_put_land_in_its_move(saver):
    """LangGraph may send a checkpoint's writes before its put: they land in the put's own ref
    move (one reflog entry), after the checkpoint's own position, so a fork from the
    checkpoint does not inherit them and every reader sees them as its pending writes."""
    a = put(saver, "early", step=0)
    b_id = str(uuid6(clock_seq=1))
    saver.put_writes(config("early", b_id), [("ch", "sent early"), ("other", "too")], "task-e")
    moves = len(saver.store.threads.reflog("langgraph/early"))
    cp = empty_checkpoint()
    cp["id"] = b_id
    saver.put(config("early", a), cp, {"source": "loop", "step": 1}, {})
    assert len(saver.store.threads.reflog("langgraph/early")) == moves + 1
    state = saver.store.threads.get("langgraph/early")
    own = saver.store.checkpoints.get("langgraph/early")[1].history
    assert state.history.seq == own.seq + 2  # the writes follow the checkpoint's position
    for reader in (saver, AgentcasSaver(saver.store)):
        assert [(t, c, v) for t, c, v in reader.get_tuple(config("early", b_id)).pending_writes] == \
            [("task-e", "ch", "sent early"), ("task-e", "other", "too")]
    assert saver.store.gc.fsck().to_json()["ok"]


def test_a_list_that_does_not_extend_its_parent_is_stored_whole(saver):
    a = put(saver, "l", values={"items": [1, 2, 3]}, step=0)
    b = put(saver, "l", parent=a, values={"items": [1, 2, 3, 4]}, versions={"items": 2}, step=1)
    c = put(saver, "l", parent=b, values={"items": [9, 2]}, versions={"items": 3}, step=2)
    d = put(saver, "l", parent=c, values={"items": [9, 2, 5]}, versions={"items": 4}, step=3)
    fresh = AgentcasSaver(saver.store)  # no cache: everything from the store
    got = {cid: fresh.get_tuple(config("l", cid)).checkpoint["channel_values"]["items"] for cid in (a, b, c, d)}
    assert got == {a: [1, 2, 3], b: [1, 2, 3, 4], c: [9, 2], d: [9, 2, 5]}




def test_encrypted_serializer_round_trips(tmp_path):
    key = os.urandom(32)
    path = str(tmp_path / "enc")
    with AgentcasSaver.from_path(path, serde=EncryptedSerializer(AesGcm(key))) as saver:
        graph = chat_graph(saver)
        graph.invoke({"messages": [HumanMessage(content="secret plan", id="s1")]}, config())
        saver.put_writes(graph.get_state(config()).config, [("messages", ["pending secret"])], "task-1")
    with AgentcasSaver.from_path(path, serde=EncryptedSerializer(AesGcm(key))) as saver:
        state = chat_graph(saver).get_state(config())
        assert [m.content for m in state.values["messages"]] == ["secret plan", "reply 1"]
        assert saver.get_tuple(config()).pending_writes == [("task-1", "messages", ["pending secret"])]
        records = [json.loads(x) for x in b"".join(saver.store.history.read("langgraph/t")).splitlines()]
        kinds = [k for r in records for k in ((r["ct"], r["mt"]) if r["k"] == "cp" else (r["t"],))]
        assert len(kinds) > len(records) and all(k.endswith("+aesgcm") for k in kinds)
    with AgentcasSaver.from_path(path, serde=EncryptedSerializer(AesGcm(os.urandom(32)))) as saver:
        with pytest.raises(CorruptCheckpoint, match=r"does not deserialize .*is this saver's key the writer's"):
            saver.get_tuple(config())


# -- forks and pending writes ---------------------------------------------------------------------

def test_a_fork_moves_the_thread_and_keeps_the_old_branch(saver):
    graph = chat_graph(saver)
    for i in range(3):
        graph.invoke({"messages": [HumanMessage(content=f"m{i}", id=f"h{i}")]}, config())
    before = [t.config["configurable"]["checkpoint_id"] for t in saver.list(config())]
    old_head = saver.store.threads.get("langgraph/t").checkpoint
    past = [s for s in graph.get_state_history(config()) if len(s.values.get("messages", [])) == 2][0]
    forked = graph.update_state(past.config, {"messages": [AIMessage(content="fork", id="f1")]})
    graph.invoke({"messages": [HumanMessage(content="after fork", id="h9")]}, config())

    assert [m.content for m in graph.get_state(config()).values["messages"]] == [
        "m0", "reply 1", "fork", "after fork", "reply 4"]
    after = [t.config["configurable"]["checkpoint_id"] for t in saver.list(config())]
    assert set(before) < set(after) and len(after) == len(before) + 4
    assert forked["configurable"]["checkpoint_id"] in after
    branches = {n: s for n, s in saver.store.threads.under("langgraph/t").items() if "/branches/" in n}
    assert list(branches) == ["langgraph/t/branches/1"]
    assert branches["langgraph/t/branches/1"].checkpoint == old_head
    tree = saver.store.threads.lineage("langgraph/t").to_json()["threads"][0]
    assert [c["thread"] for c in tree["children"]] == ["langgraph/t/branches/1"]
    split = saver.store.checkpoints.show(tree["children"][0]["forked_from"]["checkpoint"]).to_json()
    assert split["reason"].endswith(past.config["configurable"]["checkpoint_id"])  # where the branches part
    assert saver.store.gc.run(grace=0).to_json()["result"] is not None
    # every checkpoint of the old branch is still there after a gc
    fresh = AgentcasSaver(saver.store)
    assert [t.config["configurable"]["checkpoint_id"] for t in fresh.list(config())] == after
    saver.delete_thread("t")
    assert saver.store.threads.under("langgraph/t") == {}


def test_writes_of_an_abandoned_branch_are_never_replayed_into_a_fork(saver):
    a = put(saver, "w", step=0)
    b = put(saver, "w", parent=a, step=1)
    saver.put_writes(config("w", b), [("ch", "from b")], "task-b")
    c = put(saver, "w", parent=a, step=2)  # a fork from a: b's branch is abandoned
    saver.put_writes(config("w", b), [("ch", "late on b")], "task-late")  # after the fork
    d = put(saver, "w", parent=c, step=3)
    assert saver.get_tuple(config("w", c)).pending_writes == []
    assert saver.get_tuple(config("w", d)).pending_writes == []
    assert saver.get_tuple(config("w")).config["configurable"]["checkpoint_id"] == d
    assert sorted(w[2] for w in saver.get_tuple(config("w", b)).pending_writes) == ["from b", "late on b"]
    saver.put_writes(config("w", c), [("ch", "late on c")], "task-c")  # lands after d on d's line
    fresh = AgentcasSaver(saver.store)
    for reader in (saver, fresh):
        assert reader.get_tuple(config("w", d)).pending_writes == []
        assert sorted(w[2] for w in reader.get_tuple(config("w", b)).pending_writes) == ["from b", "late on b"]
        assert [w[2] for w in reader.get_tuple(config("w", c)).pending_writes] == ["late on c"]


def test_a_put_racing_another_savers_write_keeps_the_write(saver):
    a = put(saver, "r", step=0)
    other = AgentcasSaver(saver.store)
    real, raced = saver.store.threads.group_writer, []

    def racing(what):
        if what.startswith("langgraph put") and not raced:  # between reading the thread and landing
            raced.append(what)
            other.put_writes(config("r", a), [("ch", "raced")], "task-r")
        return real(what)

    saver.store.threads.group_writer = racing
    b = put(saver, "r", parent=a, step=1)
    assert raced
    fresh = AgentcasSaver(saver.store)
    assert [w[2] for w in fresh.get_tuple(config("r", a)).pending_writes] == ["raced"]
    assert fresh.get_tuple(config("r")).config["configurable"]["checkpoint_id"] == b


def test_a_ref_moved_between_planning_and_landing_makes_the_put_plan_again(saver):
    from agentcas import testing_hooks
    a = put(saver, "q", step=0)
    other = AgentcasSaver(saver.store)
    raced = []

    def race():  # the put has planned and stored its objects; another saver moves the thread now
        if not raced:
            raced.append(True)
            other.put_writes(config("q", a), [("ch", "raced")], "task-q")

    with testing_hooks.on("group.before_land", race):
        b = put(saver, "q", parent=a, step=1)
    assert raced
    fresh = AgentcasSaver(saver.store)
    assert [w[2] for w in fresh.get_tuple(config("q", a)).pending_writes] == ["raced"]
    assert fresh.get_tuple(config("q")).config["configurable"]["checkpoint_id"] == b
    assert [e["action"] for e in [item.to_json() for item in saver.store.threads.reflog("langgraph/q")]][:2] == ["langgraph", "langgraph-writes"]
    assert saver.store.gc.fsck().to_json()["ok"]


def test_gc_at_grace_zero_during_a_put_deletes_nothing_and_the_put_lands(saver, monkeypatch):
    """Through the lease path (a shared store's, here forced on the embedded one): a put holds a
    writer lease from its first object to its ref move (cas/leases.py), so gc at grace 0 in
    between sweeps nothing, not even the put's own unreferenced objects."""
    from agentcas import testing_hooks
    from agentcas.lineage import group_moves
    monkeypatch.setattr(group_moves.GroupWriter, "optimistic", False)
    a = put(saver, "g", values={"v": "kept " * 200}, step=0)
    put(saver, "doomed", values={"v": "garbage " * 200}, step=0)
    saver.delete_thread("doomed")
    seen = {}

    def gc_meanwhile():
        if not seen:
            seen.update(saver.store.gc.run(grace=0, expire_reflog=0, wait=0).to_json()["result"])

    with testing_hooks.on("group.before_land", gc_meanwhile):
        b = put(saver, "g", parent=a, values={"v": "new " * 300}, versions={"v": 2}, step=1)
    assert seen["deleted"]["objects"] == 0 and not seen["complete"]
    assert [row["what"] for row in seen["blocked_by"]] == ["langgraph put langgraph/g"]
    fresh = AgentcasSaver(saver.store)
    assert fresh.get_tuple(config("g", b)).checkpoint["channel_values"] == {"v": "new " * 300}
    assert saver.store.gc.run(grace=0, expire_reflog=0, wait=0).to_json()["result"]["deleted"]["objects"] > 0  # the garbage
    assert fresh.get_tuple(config("g", a)).checkpoint["channel_values"] == {"v": "kept " * 200}
    assert saver.store.gc.fsck().to_json()["ok"]


def test_gc_at_grace_zero_during_a_leaseless_put_sweeps_garbage_and_the_put_plans_again(saver):
    """On the embedded store a put takes no lease (a SweepWatch, cas/leases.py): gc at grace 0
    between its planning and its one landing transaction sweeps the garbage; the landing then
    sees that a sweep began, takes a lease, plans again and lands, its objects all stored."""
    from agentcas import testing_hooks
    a = put(saver, "g", values={"v": "kept " * 200}, step=0)
    put(saver, "doomed", values={"v": "garbage " * 200}, step=0)
    saver.delete_thread("doomed")
    seen, swept = {}, []

    def gc_meanwhile():
        if not seen:
            seen.update(saver.store.gc.run(grace=0, expire_reflog=0, wait=0).to_json()["result"])

    with testing_hooks.on("group.before_land", gc_meanwhile), \
            testing_hooks.on("sweepwatch.swept", lambda: swept.append(True)):
        b = put(saver, "g", parent=a, values={"v": "new " * 300}, versions={"v": 2}, step=1)
    assert seen["deleted"]["objects"] > 0 and seen["complete"] and swept == [True]
    fresh = AgentcasSaver(saver.store)
    assert fresh.get_tuple(config("g", b)).checkpoint["channel_values"] == {"v": "new " * 300}
    assert fresh.get_tuple(config("g", a)).checkpoint["channel_values"] == {"v": "kept " * 200}
    assert saver.store.gc.run(grace=0, expire_reflog=0, wait=0).to_json()["result"]["deleted"]["objects"] == 0
    assert saver.store.gc.fsck().to_json()["ok"]


def test_resuming_an_old_branch_keeps_the_writes_on_its_line(saver):
    a = put(saver, "o", step=0)
    b = put(saver, "o", parent=a, step=1)
    saver.put_writes(config("o", b), [("ch", "on b")], "task-b")
    put(saver, "o", parent=a, step=2)  # fork: b's line becomes branches/1
    c = put(saver, "o", parent=b, step=3)  # back onto b's line: it folds into the thread
    refs = saver.store.threads.under("langgraph/o")
    assert refs["langgraph/o"].checkpoint is not None and "langgraph/o/branches/1" not in refs
    for reader in (saver, AgentcasSaver(saver.store)):
        assert [w[2] for w in reader.get_tuple(config("o", b)).pending_writes] == ["on b"]
        assert reader.get_tuple(config("o")).config["configurable"]["checkpoint_id"] == c
        assert len(list(reader.list(config("o")))) == 4


def test_an_interrupt_on_the_old_branch_does_not_follow_a_time_travel_fork(saver):
    graph = asking_graph(saver)
    graph.invoke({"messages": [HumanMessage(content="first", id="h1")]}, config())
    graph.invoke(Command(resume="yes"), config())
    graph.invoke({"messages": [HumanMessage(content="second", id="h2")]}, config())
    assert graph.get_state(config()).interrupts  # waiting on the second question
    past = [s for s in graph.get_state_history(config())
            if [m.content for m in s.values.get("messages", [])] == ["first", "you said yes"]][0]
    graph.update_state(past.config, {"messages": [AIMessage(content="edited", id="e1")]}, as_node="ask")
    state = graph.get_state(config())
    assert not state.interrupts and not state.next
    assert [m.content for m in state.values["messages"]] == ["first", "you said yes", "edited"]


def test_prune_and_delete_thread_let_gc_reclaim_what_no_thread_shares(saver):
    from agentcas.errors import NotFound
    graph = chat_graph(saver)
    for i in range(3):
        graph.invoke({"messages": [HumanMessage(content=f"m{i}", id=f"h{i}")]}, config())
    saver.copy_thread("t", "kept-copy")
    old = [e["checkpoint"] for e in [item.to_json() for item in saver.store.threads.log("langgraph/t")]]
    saver.prune(["t"], strategy="keep_latest")
    saver.store.gc.run(grace=0)
    assert len(saver.store.threads.log("langgraph/t")) == 1
    assert [m.content for m in graph.get_state(config()).values["messages"]][-1] == "reply 5"
    assert all(saver.store.checkpoints.get(d) for d in old)  # the copy still needs every one of them
    saver.delete_thread("kept-copy")
    saver.store.gc.run(grace=0)
    for digest in old:
        with pytest.raises(NotFound):
            saver.store.checkpoints.get(digest)
    assert len(list(saver.list(config()))) == 1
    assert len(graph.get_state(config()).values["messages"]) == 6
    saver.delete_thread("t")
    saver.store.gc.run(grace=0)
    assert saver.store.threads.under("langgraph") == {} and saver.store.gc.fsck().to_json()["ok"]


# -- the same scenario as LangGraph's own InMemorySaver ---------------------------------------------

def subgraph_interrupt_graph(saver):
    sub = StateGraph(MessagesState)
    sub.add_node("tool", lambda s: {"messages": [AIMessage(content=f"tool saw {len(s['messages'])}", id=f"t{len(s['messages'])}")]})
    sub.add_edge(START, "tool"); sub.add_edge("tool", END)
    def ask(state):
        answer = interrupt(f"ok after {len(state['messages'])}?")
        return {"messages": [AIMessage(content=f"ask got {answer}", id=f"a{len(state['messages'])}")]}
    b = StateGraph(MessagesState)
    b.add_node("agent", lambda s: {"messages": [AIMessage(content=f"agent {len(s['messages'])}", id=f"g{len(s['messages'])}")]})
    b.add_node("sub", sub.compile())
    b.add_node("ask", ask)
    b.add_edge(START, "agent"); b.add_edge("agent", "sub"); b.add_edge("sub", "ask"); b.add_edge("ask", END)
    return b.compile(checkpointer=saver)

def interrupt_travel_fork_scenario(saver):
    g = subgraph_interrupt_graph(saver)
    c = {"configurable": {"thread_id": "x"}}
    out = []
    def snap(tag):
        st = g.get_state(c, subgraphs=True)
        out.append((tag, [m.content for m in st.values.get("messages", [])], st.next, [i.value for i in st.interrupts]))
    g.invoke({"messages": [HumanMessage(content="hi", id="h1")]}, c); snap("interrupted")
    g.invoke(Command(resume="yes"), c); snap("resumed")
    g.invoke({"messages": [HumanMessage(content="again", id="h2")]}, c); snap("interrupted2")
    hist = list(g.get_state_history(c)); out.append(("history", len(hist), [h.metadata.get("source") for h in hist]))
    past = [h for h in hist if [m.content for m in h.values.get("messages", [])] == ["hi"] and h.next == ("agent",)][0]
    g.invoke(None, past.config); snap("time-travel replay")
    g.invoke(Command(resume="no"), c); snap("resumed after travel")
    past2 = [h for h in g.get_state_history(c) if h.next == ("ask",)][-1]
    g.update_state(past2.config, {"messages": [AIMessage(content="edited", id="e1")]}, as_node="ask"); snap("update_state fork")
    hist = list(g.get_state_history(c)); out.append(("history2", len(hist)))
    out.append(("namespaces", len({t.config["configurable"]["checkpoint_ns"] for t in saver.list(None)})))
    return out



def test_interrupts_resume_time_travel_forks_and_subgraphs_behave_as_with_in_memory_saver(saver):
    from langgraph.checkpoint.memory import InMemorySaver
    expected = interrupt_travel_fork_scenario(InMemorySaver())
    assert interrupt_travel_fork_scenario(saver) == expected
    assert expected[-1] == ("namespaces", 4)


# -- several processes ----------------------------------------------------------------------------

WRITER = textwrap.dedent("""
    import sys, time, os
    from langgraph.checkpoint.base import empty_checkpoint
    from langgraph.checkpoint.base.id import uuid6
    from agentcas.langgraph import AgentcasSaver
    path, thread, parent, count, go = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
    with AgentcasSaver.from_path(path) as saver:
        while not os.path.exists(go):
            time.sleep(0.005)
        for i in range(count):
            cp = empty_checkpoint()
            cp["id"] = str(uuid6())
            conf = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
            if parent != "-":
                conf["configurable"]["checkpoint_id"] = parent
            parent = saver.put(conf, cp, {"source": "loop", "step": i}, {})["configurable"]["checkpoint_id"]
            print(parent, flush=True)
""")


def _writers(tmp_path, jobs):
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path / "store"), thread, parent, str(n), str(go)],
                              stdout=subprocess.PIPE, text=True) for thread, parent, n in jobs]
    time.sleep(0.3)
    go.touch()
    outs = [p.communicate(timeout=120)[0].split() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    return outs


def test_one_thread_from_two_processes_loses_no_checkpoint(saver, tmp_path):
    root = put(saver, "shared", step=0)
    outs = _writers(tmp_path, [("shared", root, 25), ("shared", root, 25)])
    fresh = AgentcasSaver(Store.open(str(tmp_path / "store")))
    listed = {t.config["configurable"]["checkpoint_id"] for t in fresh.list(config("shared"))}
    assert listed == {root, *outs[0], *outs[1]}
    heads = {s.checkpoint for s in fresh.store.threads.under("langgraph/shared").values()}
    assert len(heads) >= 2  # two children of one parent: two lines, both kept
    assert fresh.store.gc.fsck().to_json()["ok"]


def test_processes_writing_different_threads(saver, tmp_path):
    outs = _writers(tmp_path, [("p1", "-", 30), ("p2", "-", 30)])
    fresh = AgentcasSaver(Store.open(str(tmp_path / "store")))
    for thread, out in zip(("p1", "p2"), outs):
        assert [t.config["configurable"]["checkpoint_id"] for t in fresh.list(config(thread))] == out[::-1]
    assert fresh.store.gc.fsck().to_json()["ok"]


# -- crashes, corruption, unknown ids -------------------------------------------------------------

LOOPER = textwrap.dedent("""
    import sys
    from langchain_core.messages import HumanMessage
    from agentcas.langgraph import AgentcasSaver
    from langgraph.graph import START, END, MessagesState, StateGraph
    with AgentcasSaver.from_path(sys.argv[1]) as saver:
        b = StateGraph(MessagesState)
        b.add_node("agent", lambda s: {})
        b.add_edge(START, "agent"); b.add_edge("agent", END)
        g = b.compile(checkpointer=saver)
        conf = {"configurable": {"thread_id": "k"}}
        i = 0
        while True:
            g.invoke({"messages": [HumanMessage(content="m" * 300, id=str(i))]}, conf, durability="sync")
            print(i, flush=True)
            i += 1
""")


@pytest.mark.parametrize("delay", [0.0, 0.013, 0.029])
def test_sigkill_during_put_leaves_the_old_or_new_checkpoint(tmp_path, delay):
    path = str(tmp_path / "store")
    Store.init(path)
    proc = subprocess.Popen([sys.executable, "-c", LOOPER, path], stdout=subprocess.PIPE, text=True)
    done = [proc.stdout.readline() for _ in range(3)]
    assert all(done)
    time.sleep(delay)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    store = Store.open(path)
    assert store.gc.fsck().to_json()["ok"]
    with AgentcasSaver.from_path(path) as saver:
        latest = saver.get_tuple(config("k"))
        count = len(latest.checkpoint["channel_values"]["messages"])
        assert count >= 3  # every invoke that returned is there, intact
        assert [m.id for m in latest.checkpoint["channel_values"]["messages"]] == [str(i) for i in range(count)]
        assert len(list(saver.list(config("k")))) >= 9
        chat = chat_graph(saver)  # and the thread goes on
        chat.invoke({"messages": [HumanMessage(content="after", id="after")]}, config("k"))


KILLED_IN_TXN = textwrap.dedent("""
    import sys, time
    from langchain_core.messages import HumanMessage
    from agentcas.refs import threads
    from agentcas.langgraph import AgentcasSaver
    from langgraph.graph import START, END, MessagesState, StateGraph
    real, calls = threads.set_if_equals, []

    def set_if_equals(*args, **kwargs):  # pause inside the final transaction of the 7th move
        calls.append(1)
        if len(calls) == 7:
            print("in-transaction", flush=True)
            time.sleep(60)
        return real(*args, **kwargs)

    threads.set_if_equals = set_if_equals
    with AgentcasSaver.from_path(sys.argv[1]) as saver:
        b = StateGraph(MessagesState)
        b.add_node("agent", lambda s: {})
        b.add_edge(START, "agent"); b.add_edge("agent", END)
        g = b.compile(checkpointer=saver)
        for i in range(5):
            g.invoke({"messages": [HumanMessage(content="m", id=str(i))]}, {"configurable": {"thread_id": "k"}},
                     durability="sync")
            print("done", i, saver.get_tuple({"configurable": {"thread_id": "k"}}).config["configurable"]["checkpoint_id"],
                  flush=True)
""")


def test_sigkill_inside_the_final_transaction_keeps_the_old_checkpoint(tmp_path):
    path = str(tmp_path / "store")
    Store.init(path)
    proc = subprocess.Popen([sys.executable, "-c", KILLED_IN_TXN, path], stdout=subprocess.PIPE, text=True)
    lines = []
    while not lines or lines[-1].strip() != "in-transaction":
        line = proc.stdout.readline()
        assert line, lines
        lines.append(line)
    before = Store.open(path).threads.get("langgraph/k")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    store = Store.open(path)
    assert store.gc.fsck().to_json()["ok"]
    assert store.threads.get("langgraph/k") == before  # the move in flight never happened
    last_done = [line.split()[2] for line in lines if line.startswith("done")][-1]
    with AgentcasSaver.from_path(path) as saver:
        listed = [t.config["configurable"]["checkpoint_id"] for t in saver.list(config("k"))]
        assert last_done in listed
        assert saver.get_tuple(config("k")) is not None


# The crash walk of a put. Each scenario builds a base store, counts the durable steps
# (cas/crashpoints.py) of one saver call in a forked child, then for every step N: copies the
# base, runs the call in a child killed (SIGKILL) at step N, and checks that the thread's refs
# are exactly the old ones or the newest checkpoint is the new one, that fsck is clean, and that
# the call then succeeds. Forked children skip the interpreter and LangGraph start-up.

def _in_child(fn, env: dict) -> int:
    """Run `fn()` in a forked child with `env` set; its wait status as a signal (-9) or exit code."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 0
        try:
            os.environ.update(env)
            fn()
        except BaseException:  # noqa: BLE001 - report, never return into pytest
            import traceback
            traceback.print_exc()
            code = 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def _chat_base(path):
    with AgentcasSaver.from_path(path) as s:
        graph = chat_graph(s)
        for i in range(3):
            graph.invoke({"messages": [HumanMessage(content=f"m{i}" * 50, id=f"h{i}")]}, config())
        past = [t for t in s.list(config()) if len(t.checkpoint["channel_values"].get("messages", [])) == 2][0]
        return s.get_tuple(config()), past


CRASH_STEP = str(uuid6(clock_seq=77))


def _crash_put(path, parent_id, values, versions):
    def call():
        with AgentcasSaver.from_path(path) as s:
            cp = empty_checkpoint()
            cp["id"] = CRASH_STEP
            cp["channel_values"] = values
            cp["channel_versions"] = versions
            s.put(config("t", parent_id), cp, {"source": "loop", "step": 99}, dict(versions))
    return call


def _crash_writes(path, checkpoint_id):
    def call():
        with AgentcasSaver.from_path(path) as s:
            s.put_writes(config("t", checkpoint_id), [("messages", ["written"]), ("other", 7)], "task-crash")
    return call


def _walk(tmp_path, make_call, landed):
    """Kill `make_call(path, old, past)()` at each of its durable steps; `landed(saver)`: did it land?"""
    base = tmp_path / "base"
    old_tuple, past = _chat_base(str(base))
    count = tmp_path / "count"
    work = tmp_path / "w"
    shutil.copytree(base, work)
    assert _in_child(make_call(str(work), old_tuple, past), {"AGENTCAS_CRASH_COUNT": str(count)}) == 0
    labels = count.read_text().split()
    assert labels, "no durable step counted"
    with AgentcasSaver.from_path(str(work)) as s:
        assert landed(s) and s.store.gc.fsck().to_json()["ok"]
    old_refs = Store.open(str(base)).threads.under("langgraph/t")
    outcomes = []
    for number in range(1, len(labels) + 1):
        shutil.rmtree(work)
        shutil.copytree(base, work)
        assert _in_child(make_call(str(work), old_tuple, past), {"AGENTCAS_CRASH_AT": str(number)}) == -9, number
        store = Store.open(str(work))
        assert store.gc.fsck().to_json()["ok"], (number, labels[number - 1], store.gc.fsck().to_json()["problems"])
        with AgentcasSaver(store) as s:
            if landed(s):
                outcomes.append("new")
            else:
                assert store.threads.under("langgraph/t") == old_refs, (number, labels[number - 1])
                assert s.get_tuple(config()).config == old_tuple.config
                outcomes.append("old")
        store.close()
        assert _in_child(make_call(str(work), old_tuple, past), {}) == 0  # the call then succeeds
        with AgentcasSaver.from_path(str(work)) as s:
            assert landed(s) and s.store.gc.fsck().to_json()["ok"], number
    assert outcomes[0] == "old" and outcomes[-1] == "new"
    return labels, outcomes


@pytest.mark.crash
@pytest.mark.parametrize("landing", ["one-transaction", "leased"])
@pytest.mark.parametrize("kind", ["append", "fork", "writes"])
def test_every_crash_point_of_a_put_leaves_the_old_or_the_new_checkpoint(tmp_path, kind, landing, record_property,
                                                                         monkeypatch):
    """Both landings: the embedded store's one transaction, and the leased one (objects, then
    refs) that shared stores use, forced here."""
    if landing == "leased":
        from agentcas.lineage import group_moves
        monkeypatch.setattr(group_moves.GroupWriter, "optimistic", False)
    if os.access("/dev/shm", os.W_OK):  # a SIGKILL is a process crash: tmpfs makes the walk fast
        import tempfile
        tmp_path = Path(tempfile.mkdtemp(prefix="agentcas-lg-crash-", dir="/dev/shm"))
    try:
        def make_call(path, old, past):
            head = old.checkpoint
            messages = head["channel_values"]["messages"]
            if kind == "append":  # the next step: one more message (a rollout item) and a value file
                return _crash_put(path, old.config["configurable"]["checkpoint_id"],
                                  {"messages": messages + [AIMessage(content="new" * 80, id="n1")],
                                   "note": "x" * 600}, {"messages": 99, "note": 1})
            if kind == "fork":  # a put onto a past checkpoint: the old head is kept as a branch
                return _crash_put(path, past.config["configurable"]["checkpoint_id"],
                                  {"messages": past.checkpoint["channel_values"]["messages"]
                                   + [AIMessage(content="fork", id="f1")]}, {"messages": 99})
            return _crash_writes(path, old.config["configurable"]["checkpoint_id"])

        def landed(s):
            latest = s.get_tuple(config())
            if kind == "writes":
                return any(task == "task-crash" for task, _, _ in latest.pending_writes)
            if latest.config["configurable"]["checkpoint_id"] != CRASH_STEP:
                return False
            if kind == "fork":
                assert any("/branches/" in name for name in s.store.threads.under("langgraph/t"))
            assert latest.checkpoint["channel_values"]["messages"][-1].id in ("n1", "f1")
            return True

        labels, outcomes = _walk(tmp_path, make_call, landed)
        record_property("crash_points", len(labels))  # summed and printed by conftest's summary
        print(f"{kind}: {len(labels)} crash points ({' '.join(labels)}): {' '.join(outcomes)}")
    finally:
        shutil.rmtree(tmp_path, ignore_errors=True)


def _corrupt(store: Store, raw: bytes) -> None:
    def flip(value: bytearray):
        value[-1] ^= 0xFF
        return value
    store.environment.write(lambda txn: raw_objects.edit(txn, raw, flip))


def test_a_corrupt_value_raises_a_clear_error_naming_the_object(saver):
    first = put(saver, "c", values={"a": "a value that is long enough to be stored as a file " * 100}, step=0)
    tree = saver.store.checkpoints.get("langgraph/c")[1].tree
    blob = saver.store.checkpoints.tree_files(tree, content=False)["values/a"].id
    _corrupt(saver.store, blob.raw)
    for reader in (saver, AgentcasSaver(saver.store)):
        with pytest.raises(CorruptCheckpoint, match=blob.hex()) as err:
            reader.get_tuple(config("c", first))
        assert first in str(err.value)
        with pytest.raises(CorruptCheckpoint):
            list(reader.list(config("c")))
    assert not saver.store.gc.fsck().to_json()["ok"]


def test_a_corrupt_message_in_the_history_raises_not_a_shorter_list(saver):
    graph = chat_graph(saver)
    graph.invoke({"messages": [HumanMessage(content="one", id="1")]}, config("h"))
    head = saver.store.threads.get("langgraph/h").history
    from agentcas.cas import framing  # the test reaches into the layer to find a chunk
    from agentcas.cas.objects import Segment
    segment = Segment.decode(saver.store.source.load(head.segment, framing.KIND_SEGMENT))
    # A small append is stored inside its segment (format 2); a larger one in chunks.
    damaged = segment.chunks[0].id if segment.chunks else head.segment
    _corrupt(saver.store, damaged.raw)
    with pytest.raises(CorruptCheckpoint, match=damaged.hex()):
        AgentcasSaver(saver.store).get_tuple(config("h"))


def test_unknown_ids_return_none(saver):
    assert saver.get_tuple(config("nobody")) is None
    put(saver, "known", step=0)
    assert saver.get_tuple(config("known", str(uuid.uuid4()))) is None
    assert list(saver.list(config("nobody"))) == []


def test_odd_thread_ids_and_namespaces_map_to_valid_threads(saver):
    for thread in ("with space", "a/b", "..", "x.lock", "ünï:cødé", "-dash", "z" * 300):
        put(saver, thread, step=0)
        put(saver, thread, step=0)
        assert len(list(saver.list(config(thread)))) == 2
    put(saver, "n", step=0)
    put(saver, "n", step=0) and None
    child = saver.put(config("n", ns="sub:1|inner:2"), empty_checkpoint(), {"step": 0}, {})
    assert thread_name("n", "sub:1|inner:2") in saver.store.threads.under("langgraph/n")
    assert saver.get_tuple(child).config["configurable"]["checkpoint_ns"] == "sub:1|inner:2"


# -- a shared store (objects in S3 on a real SeaweedFS, refs in a real PostgreSQL) ---------------

def test_a_shared_store_carries_a_thread_between_two_machines(tmp_path, s3_url, postgres_url, monkeypatch):
    monkeypatch.setenv("AGENTCAS_CACHE_DIR", str(tmp_path / "cache-a"))
    first, _ = Store.init(s3_url, refs=postgres_url)
    with AgentcasSaver(first) as saver:
        graph = chat_graph(saver)
        for i in range(3):
            graph.invoke({"messages": [HumanMessage(content=f"m{i}", id=f"h{i}")]}, config())
        past = [s for s in graph.get_state_history(config()) if len(s.values.get("messages", [])) == 2][0]
        graph.update_state(past.config, {"messages": [AIMessage(content="fork", id="f1")]})
        saver.copy_thread("t", "copy")
    first.close()
    monkeypatch.setenv("AGENTCAS_CACHE_DIR", str(tmp_path / "cache-b"))  # another machine's cache
    second = Store.open(s3_url, refs=postgres_url)
    with AgentcasSaver(second) as saver:
        graph = chat_graph(saver)
        assert [m.content for m in graph.get_state(config()).values["messages"]] == ["m0", "reply 1", "fork"]
        graph.invoke({"messages": [HumanMessage(content="on b", id="b1")]}, config())
        assert [m.content for m in graph.get_state(config()).values["messages"]][-2:] == ["on b", "reply 4"]
        assert len(list(saver.list(config("copy")))) == 10  # 3 invokes of 3, the update_state
        assert "langgraph/t/branches/1" in second.threads.under("langgraph/t")
    assert second.gc.fsck().to_json()["ok"]
    second.close()
    with AgentcasSaver.from_path(s3_url, refs=postgres_url) as saver:  # by URL, as from_path opens a directory
        assert [m.content for m in chat_graph(saver).get_state(config()).values["messages"]][-1] == "reply 4"


def test_an_async_put_waiting_on_a_hung_server_leaves_the_event_loop_running(tmp_path, s3_url, monkeypatch):
    """aput on a shared store whose PostgreSQL stops answering: while the put waits for the
    server, the event loop goes on running other tasks (a ticker counts its turns during the
    put), and the put lands once the server answers again."""
    from support.services import PostgresServer
    server = PostgresServer()
    try:
        for name, value in server.env().items():
            monkeypatch.setenv(name, value)
        monkeypatch.setenv("AGENTCAS_CACHE_DIR", str(tmp_path / "cache"))
        store, _ = Store.init(s3_url, refs=server.create_database())
        saver = AgentcasSaver(store)
        first = put(saver, "slow", values={"v": 1}, step=0)  # a pooled connection, open when it hangs
        resumed = threading.Event()

        def resume():
            server.resume()
            resumed.set()

        async def main():
            turns = {"during": 0}
            putting = False

            async def ticker():
                while True:
                    await asyncio.sleep(0.01)
                    if putting:
                        turns["during"] += 1

            ticking = asyncio.create_task(ticker())
            cp = empty_checkpoint()
            cp["id"] = str(uuid6(clock_seq=1))
            cp["channel_values"], cp["channel_versions"] = {"v": 2}, {"v": 2}
            server.hang()
            threading.Timer(1.0, resume).start()
            putting = True
            try:
                stored = await saver.aput(config("slow", first), cp, {"source": "loop", "step": 1}, {"v": 2})
            finally:
                putting = False
                ticking.cancel()
            return stored, turns["during"]

        stored, turns = asyncio.run(main())
        assert resumed.is_set()  # the put waited for the server
        assert turns > 0  # and the loop ran the ticker meanwhile
        assert saver.get_tuple(config("slow")).config == stored
        assert saver.get_tuple(stored).checkpoint["channel_values"] == {"v": 2}
        store.close()
    finally:
        server.resume()
        server.close()


# -- hand-over to another store through the CLI ---------------------------------------------------

def test_export_signed_import_and_resume_in_another_store(tmp_path, run):
    here, there = tmp_path / "here", tmp_path / "there"
    with AgentcasSaver.from_path(str(here)) as saver:
        graph = asking_graph(saver)
        graph.invoke({"messages": [HumanMessage(content="deploy?", id="q")]}, config("job"))
        assert graph.get_state(config("job")).interrupts
    log = run("--json", "log", "langgraph/job", store=here)
    assert log.code == 0 and all(e["reason"].startswith("langgraph step ") for e in log.json()["checkpoints"])
    assert run("keygen", "alice", "--out", tmp_path).code == 0
    r = run("export", "langgraph/job", "-o", tmp_path / "job.bundle", "--sign", tmp_path / "alice.key", store=here)
    assert r.code == 0, r
    assert run("init", there).code == 0
    assert run("trust", "add", "alice", tmp_path / "alice.pub", store=there).code == 0
    r = run("import", tmp_path / "job.bundle", store=there)
    assert r.code == 0, r
    with AgentcasSaver.from_path(str(there)) as saver:
        graph = asking_graph(saver)
        state = graph.get_state(config("job"))
        assert [i.value for i in state.interrupts] == ["continue?"]
        graph.invoke(Command(resume="yes"), config("job"))
        assert [m.content for m in graph.get_state(config("job")).values["messages"]] == ["deploy?", "you said yes"]


def test_push_and_pull_carry_a_thread_the_saver_resumes(tmp_path, run):
    here, remote = tmp_path / "here", tmp_path / "remote"
    with AgentcasSaver.from_path(str(here)) as saver:
        chat_graph(saver).invoke({"messages": [HumanMessage(content="one", id="1")]}, config("sync"))
    assert run("init", remote).code == 0
    assert run("remote", "add", "origin", remote, store=here).code == 0
    r = run("push", "origin", "langgraph/sync", store=here)
    assert r.code == 0, r
    with AgentcasSaver.from_path(str(remote)) as saver:
        chat_graph(saver).invoke({"messages": [HumanMessage(content="two", id="2")]}, config("sync"))
    r = run("pull", "origin", "langgraph/sync", store=here)
    assert r.code == 0, r
    with AgentcasSaver.from_path(str(here)) as saver:
        messages = chat_graph(saver).get_state(config("sync")).values["messages"]
        assert [m.content for m in messages] == ["one", "reply 1", "two", "reply 3"]


# --- the decoded-items index of a listing (records.LineRecords) -----------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from agentcas.langgraph.records import LineRecords  # noqa: E402


@settings(max_examples=200, deadline=None)
@given(count=st.integers(0, 12),
       requests=st.lists(st.tuples(st.integers(-2, 14), st.integers(-2, 14)), max_size=12))
def test_records_items_answer_every_range_exactly_and_decode_each_item_once(count, requests):
    """Whatever ranges a listing asks for, in any order, `items` returns exactly the decoded
    items of that range (never a placeholder), and decodes each item at most once."""
    records = [(seq, {"k": "item", "ch": "messages", "n": seq}) for seq in range(count)]
    index = LineRecords(records, 0)
    loads = []

    def load(record):
        loads.append(record["n"])
        return ("decoded", record["n"])

    for start, stop in requests:
        got = index.items("messages", start, stop, load)
        assert got == [("decoded", n) for n in range(max(0, start), min(count, stop))]
    assert len(loads) == len(set(loads))


# -- checkpoints of the first layout (before 2 Dec 2026) ----------------------------------------

LAYOUT1_BUNDLE = os.path.join(os.path.dirname(__file__), "data", "langgraph_layout1.bundle")


def test_checkpoints_of_the_first_layout_still_read_and_resume(tmp_path, run):
    """tests/data/langgraph_layout1.bundle was written by agentcas at 32f8463, whose saver kept
    each checkpoint's record in its tree (`langgraph` file) rather than in the history: three
    invokes of a graph with a message list and a 5,000-byte value (a values/ file), exported.
    Such checkpoints still read, list and resume, and a put onto such a parent writes the
    present layout."""
    from langgraph.graph import MessagesState

    class State(MessagesState):
        notes: str

    def agent(state):
        return {"messages": [AIMessage(content=f"reply {len(state['messages'])}", id=f"r{len(state['messages'])}")],
                "notes": "n" * 5000 + str(len(state["messages"]))}

    store = tmp_path / "store"
    assert run("init", store).code == 0
    assert run("import", LAYOUT1_BUNDLE, "--allow-unsigned", store=store).code == 0
    with AgentcasSaver.from_path(str(store)) as saver:
        head = saver.get_tuple(config("old"))
        tree = saver.store.checkpoints.tree_files(saver.store.checkpoints.get("langgraph/old")[1].tree, content=False)
        assert "langgraph" in tree and any(p.startswith("values/") for p in tree)  # the first layout, indeed
        assert [m.content for m in head.checkpoint["channel_values"]["messages"]] == [
            "question 0", "reply 1", "question 1", "reply 3", "question 2", "reply 5"]
        assert head.checkpoint["channel_values"]["notes"] == "n" * 5000 + "5"
        listed = list(saver.list(config("old")))
        assert len(listed) == 9 and listed[0].config == head.config
        assert all(t.parent_config["configurable"]["checkpoint_id"] == listed[i + 1].config["configurable"]["checkpoint_id"]
                   for i, t in enumerate(listed[:-1]))
        builder = StateGraph(State)
        builder.add_node("agent", agent)
        builder.add_edge(START, "agent")
        builder.add_edge("agent", END)
        graph = builder.compile(checkpointer=saver)
        graph.invoke({"messages": [HumanMessage(content="question 3", id="q3")]}, config("old"))
        new_tree = saver.store.checkpoints.tree_files(saver.store.checkpoints.get("langgraph/old")[1].tree, content=False)
        assert "langgraph" not in new_tree
    with AgentcasSaver.from_path(str(store)) as saver:
        values = saver.get_tuple(config("old")).checkpoint["channel_values"]
        assert [m.content for m in values["messages"]][-3:] == ["reply 5", "question 3", "reply 7"]
        assert values["notes"] == "n" * 5000 + "7"
        assert len(list(saver.list(config("old")))) == 12
    assert run("fsck", store=store).code == 0


def test_a_checkpoint_without_its_record_raises_a_clear_error(saver, tmp_path):
    """A commit on a LangGraph thread whose reason looks like the saver's but whose history
    does not end with that checkpoint's record (written by hand, or by another tool) is
    refused by name, never read as some other checkpoint's state."""
    work, rollout = tmp_path / "w", tmp_path / "r.jsonl"
    work.mkdir()
    rollout.write_bytes(b'{"k":"cp","id":"someone-else"}\n')
    reason = "langgraph step 1 loop 1f000000-0000-6000-8000-000000000000"
    saver.store.checkpoints.commit(str(work), reason, thread="langgraph/forged", rollout_file=str(rollout))
    before = saver.store.threads.get("langgraph/forged")
    with pytest.raises(CorruptCheckpoint, match=r"1f000000-0000-6000-8000-000000000000 .*record 0 of its history "
                                                r"is not its checkpoint record"):
        saver.get_tuple(config("forged"))
    assert saver.store.threads.get("langgraph/forged") == before


def test_a_checkpoint_and_metadata_over_4_kib_are_files_of_its_tree_without_a_record_limit(saver):
    """Serde bytes ride in the checkpoint record as text (up to 6x their size escaped, and a
    record is at most 64 MiB); above 4 KiB they are a file of the checkpoint's tree instead,
    named by the record, so a 24 MiB metadata value stores and reads back whole."""
    small = put(saver, "big", values={"v": "x"}, step=0, note="n" * 5000)
    huge = put(saver, "big", parent=small, values={"v": "y"}, step=1, blob=bytes(24 << 20))
    records = [json.loads(x) for x in b"".join(saver.store.history.read("langgraph/big")).splitlines()]
    cps = [r for r in records if r["k"] == "cp"]
    assert [("mf" in r, "m" in r, "c" in r) for r in cps] == [(True, False, True), (True, False, True)]
    fresh = AgentcasSaver(saver.store)
    assert fresh.get_tuple(config("big", small)).metadata["note"] == "n" * 5000
    assert fresh.get_tuple(config("big", huge)).metadata["blob"] == bytes(24 << 20)
    assert saver.store.gc.fsck().to_json()["ok"]


def test_a_put_naming_its_own_id_as_parent_is_a_new_checkpoint_for_every_reader(saver):
    """Only versions sealed by put_writes are versions of one checkpoint: a put whose parent
    id is its own id (LangGraph never sends one; InMemorySaver overwrites) reads back as the
    new values in this saver and in a fresh one alike."""
    first = put(saver, "self", values={"v": "a"}, step=0)
    put(saver, "self", parent=first, values={"v": "again"}, step=1, checkpoint_id=first)
    assert saver.get_tuple(config("self", first)).checkpoint["channel_values"] == {"v": "again"}
    assert AgentcasSaver(saver.store).get_tuple(config("self", first)).checkpoint["channel_values"] == {"v": "again"}


def test_next_version_continues_the_counter_of_another_savers_string_version():
    """Other savers write versions as "<counter>.<random>" strings; a thread moved here from
    one must go on counting from 7, not fail or restart."""
    saver = AgentcasSaver.__new__(AgentcasSaver)  # the method reads nothing of the saver
    assert saver.get_next_version("7.0123", None) == 8
    assert saver.get_next_version("00000000000000000000000000000012.5f3b", None) == 13
    assert saver.get_next_version(None, None) == 1 and saver.get_next_version(3, None) == 4
