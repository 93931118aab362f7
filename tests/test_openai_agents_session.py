"""AgentcasSession against the Agents SDK's own SQLiteSession, call for call; forks, evidence,
concurrency, persistence, a shared store, and the CLI's view of session threads."""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time

import pytest

pytest.importorskip("agents")

from agents.memory import Session, SQLiteSession  # noqa: E402
from agents.memory.session_settings import SessionSettings  # noqa: E402
from hypothesis import HealthCheck, example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from agentcas import Store, testing_hooks  # noqa: E402
from agentcas.cas.store import TABLES  # noqa: E402
from agentcas.errors import ConflictError  # noqa: E402
from agentcas.openai_agents import AgentcasSession, thread_name  # noqa: E402

from support.cli import run_cli  # noqa: E402
from support.processes import start_together  # noqa: E402


def payload_bytes(store: Store) -> int:
    """Keys and values stored in every table of an embedded store."""
    with store.environment.reader() as txn:
        return sum(len(k) + len(v) for table in TABLES for k, v in txn.scan(table))


def message(i: int, size: int = 300) -> dict:
    text = f"turn {i}: " + "".join(chr(97 + (i * 7 + j) % 26) for j in range(size))
    return {"role": "user" if i % 2 == 0 else "assistant", "content": text}


# -- call for call against SQLiteSession --------------------------------------------------------
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.text(max_size=20)
    | st.floats(allow_nan=False),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8)
items = st.dictionaries(st.sampled_from(["role", "content", "type", "id", "x"]), json_values, max_size=4) | json_values
calls = st.lists(st.one_of(
    st.tuples(st.just("add"), st.lists(items, max_size=4)),
    st.tuples(st.just("get"), st.none() | st.integers(-2, 8)),
    st.tuples(st.just("pop")),
    st.tuples(st.just("clear")),
), max_size=25)


async def call(session, op):
    if op[0] == "add":
        return await session.add_items(list(op[1]))
    if op[0] == "get":
        return await session.get_items(op[1]) if op[1] is not None else await session.get_items()
    if op[0] == "pop":
        return await session.pop_item()
    return await session.clear_session()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(calls=calls, default_limit=st.none() | st.integers(0, 4))
@example(calls=[("add", [{"a": 1}, {"b": 2}, {"c": 3}]), ("get", 2), ("get", 0), ("get", -1), ("pop",),
                ("get", None), ("clear",), ("pop",), ("get", None), ("add", [{"d": 4}]), ("get", 5)],
         default_limit=None)
@example(calls=[("add", [{"a": 1}]), ("add", []), ("get", None), ("pop",), ("pop",), ("clear",)], default_limit=2)
def test_every_sequence_of_calls_answers_as_sqlite_session(calls, default_limit):
    settings_ = SessionSettings(limit=default_limit)
    store = Store.memory()

    async def both():
        ours = AgentcasSession("s", store, session_settings=settings_)
        reference = SQLiteSession("s", session_settings=settings_)
        try:
            for op in calls:
                assert await call(ours, op) == await call(reference, op), op
            assert await ours.get_items() == await reference.get_items()
        finally:
            reference.close()

    asyncio.run(both())


def test_it_is_a_session_of_the_sdk(tmp_path):
    session = AgentcasSession("s", str(tmp_path / "store"))
    assert isinstance(session, Session)
    assert thread_name("a b/c") == "openai-agents/a%20b%2Fc"
    session.close()


def test_nan_and_infinity_round_trip_as_in_sqlite(tmp_path):
    async def go():
        ours, reference = AgentcasSession("s", str(tmp_path / "st")), SQLiteSession("s")
        values = [{"x": float("nan"), "y": float("inf")}, float("-inf"), "NaN in a string"]
        for s in (ours, reference):
            await s.add_items(values)
        got, want = await ours.get_items(), await reference.get_items()
        assert math.isnan(got[0]["x"]) and math.isnan(want[0]["x"])
        assert got[0]["y"] == want[0]["y"] == math.inf and got[1:] == want[1:]
        ours.close()
        reference.close()
    asyncio.run(go())


def test_an_item_json_cannot_hold_raises_as_sqlite_and_stores_nothing(tmp_path):
    async def go():
        ours, reference = AgentcasSession("s", str(tmp_path / "st")), SQLiteSession("s")
        for s in (ours, reference):
            await s.add_items([{"a": 1}])
            with pytest.raises(TypeError):
                await s.add_items([{"b": 2}, {"bad": object()}])
        assert await ours.get_items() == await reference.get_items() == [{"a": 1}]
        assert len(ours._records.reflog(ours.thread)) == 1  # no move for the refused call
        ours.close()
        reference.close()
    asyncio.run(go())


def test_store_work_runs_off_the_event_loop(tmp_path, monkeypatch):
    session = AgentcasSession("s", str(tmp_path / "st"))
    seen = []
    for name in ("change", "state", "lines"):
        original = getattr(session._records, name)

        def spy(*args, _original=original, **kwargs):
            seen.append(threading.current_thread() is threading.main_thread())
            return _original(*args, **kwargs)
        monkeypatch.setattr(session._records, name, spy)

    async def go():
        await session.add_items([{"a": 1}, {"b": 2}])
        await session.get_items(1)
        await session.pop_item()
        await session.clear_session()
    asyncio.run(go())
    assert seen and not any(seen)
    session.close()


def test_the_sdk_runner_sees_the_same_conversation_as_with_sqlite_session(tmp_path):
    """The one-line switch: Runner.run with a scripted model (the SDK's own test double),
    once on SQLiteSession and once on AgentcasSession: the same model inputs, the same items."""
    from agents import Agent, Runner, set_tracing_disabled
    from agents.testing import ScriptedModel, assistant_message
    set_tracing_disabled(True)

    async def conversation(session):
        model = ScriptedModel([[assistant_message("one", item_id="m1")], [assistant_message("two", item_id="m2")],
                               [assistant_message("three", item_id="m3")]])
        agent = Agent(name="assistant", model=model)
        await Runner.run(agent, "hi", session=session)
        await Runner.run(agent, "again", session=session)
        await session.pop_item()
        await Runner.run(agent, "once more", session=session)
        return [call.input for call in model.calls], await session.get_items()

    async def both():
        reference = SQLiteSession("chat")
        want = await conversation(reference)
        reference.close()
        ours = AgentcasSession("chat", str(tmp_path / "st"))
        got = await conversation(ours)
        ours.close()
        return got, want
    got, want = asyncio.run(both())
    assert got == want
    assert len(got[1]) == 5 and got[0][2][-1]["content"] == "once more"


# -- changes are moves; the removed items stay as evidence --------------------------------------
def test_each_change_is_one_move_and_popped_items_stay_in_the_reflog(tmp_path):
    path = tmp_path / "st"

    async def go():
        session = AgentcasSession("chat", str(path))
        await session.add_items([message(0), message(1)])
        await session.add_items([message(2)])
        assert await session.pop_item() == message(2)
        await session.clear_session()
        await session.get_items()
        await session.pop_item()  # nothing to pop: no move
        await session.clear_session()  # nothing to clear: no move
        session.close()
    asyncio.run(go())

    reflog = run_cli("--json", "reflog", "openai-agents/chat", store=path).json()["entries"]
    assert [(e["action"], e["new"]["history"]["seq"]) for e in reflog] == \
        [("revert", 0), ("revert", 2), ("append", 3), ("append", 2)]
    popped = run_cli("rollout", "cat", "openai-agents/chat@{2}", "--from", "2", store=path)
    assert popped.code == 0 and json.loads(popped.out) == {"i": message(2)}
    cleared = run_cli("rollout", "cat", "openai-agents/chat@{1}", store=path)
    assert [json.loads(line)["i"] for line in cleared.out.splitlines()] == [message(0), message(1)]


def test_a_pop_rebuilds_when_an_add_lands_between_its_read_and_its_landing(tmp_path):
    """A pop read the session (3 items), then another writer added a 4th before the pop's
    compare-and-swap: the pop must start again and remove the 4th, not cut the session back
    to 2 items built on what it read (which would lose the 3rd and the 4th)."""
    from agentcas import testing_hooks
    from agentcas.openai_agents.session import _record
    from agentcas.record_threads import Append, RecordStore
    store, _ = Store.init(str(tmp_path / "st"))
    other = RecordStore(store)
    raced = []

    def add_meanwhile():
        if not raced:
            raced.append(True)
            other.change("add", lambda snapshot: ([Append("openai-agents/s", _record({"n": 3}), "add")], None))

    async def go():
        session = AgentcasSession("s", store)
        await session.add_items([{"n": 0}, {"n": 1}, {"n": 2}])
        with testing_hooks.on("group.before_land", add_meanwhile):
            popped = await session.pop_item()
        return popped, await session.get_items()
    popped, left = asyncio.run(go())
    assert raced and popped == {"n": 3} and left == [{"n": 0}, {"n": 1}, {"n": 2}]
    store.close()


def test_a_new_session_object_on_the_same_store_sees_the_items(tmp_path):
    async def go():
        first = AgentcasSession("s", str(tmp_path / "st"))
        await first.add_items([message(i) for i in range(5)])
        await first.pop_item()
        first.close()
        second = AgentcasSession("s", str(tmp_path / "st"))
        assert await second.get_items() == [message(i) for i in range(4)]
        assert await second.get_items(2) == [message(2), message(3)]
        second.close()
    asyncio.run(go())


# -- forks --------------------------------------------------------------------------------------
def test_a_fork_shares_a_prefix_and_each_side_goes_its_own_way(tmp_path):
    path = tmp_path / "st"

    async def go():
        source = AgentcasSession("main", str(path))
        await source.add_items([message(i) for i in range(6)])
        at_three = source.fork("alt", at=3)
        whole = await source.fork("copy")  # awaiting the fork works too
        assert await at_three.get_items() == [message(i) for i in range(3)]
        assert await whole.get_items() == [message(i) for i in range(6)]
        await at_three.add_items([{"alt": 1}])
        assert await at_three.pop_item() == {"alt": 1}
        assert await at_three.pop_item() == message(2)
        await source.add_items([message(6)])
        assert await source.get_items() == [message(i) for i in range(7)]
        assert await at_three.get_items() == [message(0), message(1)]
        assert await AgentcasSession("alt", str(path)).get_items() == [message(0), message(1)]
        source.close()
    asyncio.run(go())

    lineage = run_cli("--json", "lineage", "openai-agents/main", store=path).json()
    children = {c["thread"]: c["forked_from"]["seq"] for c in lineage["threads"][0]["children"]}
    assert children == {"openai-agents/alt": 3, "openai-agents/copy": 6}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(before=calls, at=st.none() | st.integers(0, 12), after=st.lists(st.tuples(st.booleans(), calls), max_size=4))
def test_a_fork_answers_as_a_copy_of_its_source_prefix_would(before, at, after):
    """Reference: a second SQLiteSession holding a copy of the source's first `at` items;
    then calls on either side must answer alike, and neither side sees the other's."""
    store = Store.memory()

    async def both():
        ours, reference = AgentcasSession("s", store), SQLiteSession("s")
        for op in before:
            assert await call(ours, op) == await call(reference, op), op
        items = await reference.get_items()
        cut = None if at is None else min(at, len(items))
        ours_fork = ours.fork("f", at=cut)
        reference_fork = SQLiteSession("f")
        await reference_fork.add_items(items[:len(items) if cut is None else cut])
        try:
            for on_fork, ops in after:
                pair = (ours_fork, reference_fork) if on_fork else (ours, reference)
                for op in ops:
                    assert await call(pair[0], op) == await call(pair[1], op), op
            assert await ours.get_items() == await reference.get_items()
            assert await ours_fork.get_items() == await reference_fork.get_items()
        finally:
            reference.close()
            reference_fork.close()

    asyncio.run(both())


def test_a_cancelled_add_lands_whole_before_the_cancel_is_raised(tmp_path):
    store, _ = Store.init(str(tmp_path / "st"))
    session = AgentcasSession("s", store)
    in_the_store = threading.Event()

    def slow_landing():
        in_the_store.set()
        time.sleep(0.3)  # the caller is cancelled while its change is in the store

    async def go():
        with testing_hooks.on("group.before_land", slow_landing):
            adding = asyncio.ensure_future(session.add_items([{"a": 1}, {"b": 2}]))
            await asyncio.to_thread(in_the_store.wait, 10)
            adding.cancel()
            with pytest.raises(asyncio.CancelledError):
                await adding
            assert store.threads.get(session.thread).history.seq == 2  # landed before the cancel was raised
        assert await session.get_items() == [{"a": 1}, {"b": 2}]
    asyncio.run(go())
    store.close()


def test_a_fork_is_one_write_transaction(tmp_path):
    store, _ = Store.init(str(tmp_path / "st"))
    session = AgentcasSession("s", store)
    asyncio.run(session.add_items([message(i) for i in range(20)]))
    writes = []
    original = store.environment.write

    def counted(fn):
        writes.append(fn)
        return original(fn)
    store.environment.write = counted
    fork = session.fork("branch", at=12)
    store.environment.write = original
    assert len(writes) == 1  # no lease row written and removed around it: one durable commit
    assert asyncio.run(fork.get_items(1)) == [message(11)]
    assert store.threads.get(fork.thread).forked_from.thread == session.thread
    store.close()


def test_a_fork_of_a_long_session_stores_a_position_not_a_copy(tmp_path):
    store, _ = Store.init(str(tmp_path / "st"))

    async def go():
        session = AgentcasSession("long", store)
        for turn in range(200):
            await session.add_items([message(turn * 10 + i) for i in range(10)])
        before = payload_bytes(store)
        fork = session.fork("branch", at=1500)
        grown = payload_bytes(store) - before
        assert grown < 2048, grown  # 2,000 items of ~300 bytes copied would be ~600 KB
        assert (await fork.get_items(2)) == [message(1498), message(1499)]
    asyncio.run(go())
    store.close()


def test_bad_forks_are_refused_and_change_nothing(tmp_path):
    store, _ = Store.init(str(tmp_path / "st"))

    async def go():
        session = AgentcasSession("s", store)
        await session.add_items([{"a": 1}, {"b": 2}])
        taken = session.fork("taken", at=1)
        names = store.threads.names()
        for at in (-1, 3, "1", 1.5, True):
            with pytest.raises(ValueError):
                session.fork("new", at=at)
        with pytest.raises(ConflictError):
            session.fork("taken")
        assert store.threads.names() == names
        assert await taken.get_items() == [{"a": 1}]
        assert await session.get_items() == [{"a": 1}, {"b": 2}]
    asyncio.run(go())
    store.close()


# -- several processes, one session ---------------------------------------------------------------
_WRITER = """
import asyncio, os, sys, time
from agentcas.openai_agents import AgentcasSession
async def main(path, name, count, barrier):
    session = AgentcasSession("shared", path)
    open(os.path.join(barrier, name), "w").close()
    while not os.path.exists(os.path.join(barrier, "go")):  # all start adding together
        time.sleep(0.005)
    for i in range(count):
        await session.add_items([{"writer": name, "n": i}, {"writer": name, "n": i, "second": True}])
    session.close()
asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]))
"""




def test_several_processes_adding_to_one_session_lose_nothing(tmp_path):
    path = str(tmp_path / "st")
    Store.init(path)[0].close()
    writers = start_together(_WRITER, [[path, f"w{k}", "30"] for k in range(4)], tmp_path / "barrier")
    assert [w.wait(timeout=300) for w in writers] == [0, 0, 0, 0]

    async def read():
        session = AgentcasSession("shared", path)
        items = await session.get_items()
        session.close()
        return items
    items = asyncio.run(read())
    assert len(items) == 4 * 30 * 2
    for k in range(4):
        mine = [item for item in items if item["writer"] == f"w{k}"]
        assert mine == [x for i in range(30) for x in ({"writer": f"w{k}", "n": i},
                                                       {"writer": f"w{k}", "n": i, "second": True})]
    # each add_items landed whole: its two items are next to each other
    assert all(items[i]["n"] == items[i + 1]["n"] and items[i + 1].get("second") for i in range(0, len(items), 2))


# -- every store: a shared one, and push/pull/export --------------------------------------------
def test_a_session_on_a_shared_store_is_seen_by_another_machine(tmp_path, s3_url, postgres_url, monkeypatch):
    monkeypatch.setenv("AGENTCAS_CACHE_DIR", str(tmp_path / "cache-a"))

    async def go():
        first = AgentcasSession("s", s3_url, refs=postgres_url)
        await first.add_items([message(i) for i in range(3)])
        await first.pop_item()
        fork = first.fork("f", at=1)
        first.close()
        monkeypatch.setenv("AGENTCAS_CACHE_DIR", str(tmp_path / "cache-b"))
        second = AgentcasSession("s", s3_url, refs=postgres_url)
        assert await second.get_items() == [message(0), message(1)]
        await second.add_items([{"b": 1}])
        assert await second.get_items(1) == [{"b": 1}]
        assert await AgentcasSession("f", second._records).get_items() == [message(0)]
        assert fork.thread == "openai-agents/f"
        second.close()
    asyncio.run(go())


def test_push_pull_and_a_signed_export_carry_a_session_like_any_thread(tmp_path):
    laptop, team = tmp_path / "laptop", tmp_path / "team"

    async def fill():
        session = AgentcasSession("s", str(laptop))
        await session.add_items([message(i) for i in range(4)])
        session.close()
    asyncio.run(fill())
    assert run_cli("init", team).code == 0
    assert run_cli("remote", "add", "team", team, store=laptop).code == 0
    assert run_cli("push", "team", "openai-agents/s", store=laptop).code == 0

    async def read(path):
        session = AgentcasSession("s", str(path))
        items = await session.get_items()
        session.close()
        return items
    assert asyncio.run(read(team)) == [message(i) for i in range(4)]

    # export and sign name a checkpoint: the session makes one that holds it as it is
    async def checkpoint():
        session = AgentcasSession("s", str(laptop))
        made = await session.checkpoint("hand over")
        session.close()
        return made
    made = asyncio.run(checkpoint())
    shown = run_cli("--json", "show", "openai-agents/s", store=laptop).json()
    assert shown["checkpoint"] == made and shown["reason"] == "hand over" and shown["history"]["seq"] == 4
    assert run_cli("keygen", "alice", "--out", tmp_path).code == 0
    assert run_cli("export", "openai-agents/s", "-o", tmp_path / "s.bundle", "--sign", tmp_path / "alice.key",
                   store=laptop).code == 0
    other = tmp_path / "other"
    assert run_cli("init", other).code == 0
    assert run_cli("trust", "add", "alice", tmp_path / "alice.pub", store=other).code == 0
    assert run_cli("import", tmp_path / "s.bundle", store=other).code == 0
    assert asyncio.run(read(other)) == [message(i) for i in range(4)]

    async def pop_after_commit():  # a move back past the checkpoint keeps the thread consistent
        session = AgentcasSession("s", str(laptop))
        assert await session.pop_item() == message(3)
        await session.add_items([{"after": 1}])
        items = await session.get_items()
        session.close()
        return items
    assert asyncio.run(pop_after_commit()) == [message(0), message(1), message(2), {"after": 1}]
    assert run_cli("fsck", store=laptop).code == 0


def test_gc_keeps_what_a_fork_shares_after_its_source_is_cleared(tmp_path):
    path = tmp_path / "st"

    async def build():
        source = AgentcasSession("src", str(path))
        await source.add_items([message(i) for i in range(6)])
        source.fork("kept", at=4)
        await source.clear_session()
        await source.add_items([{"new": 1}])
        source.close()
    asyncio.run(build())
    gc = run_cli("gc", "--grace", "0s", "--expire-reflog", "now", store=path)
    assert gc.code == 0, gc

    async def read():
        fork = AgentcasSession("kept", str(path))
        items = await fork.get_items()
        fork.close()
        source = AgentcasSession("src", str(path))
        rest = await source.get_items()
        source.close()
        return items, rest
    assert asyncio.run(read()) == ([message(i) for i in range(4)], [{"new": 1}])
    assert run_cli("fsck", store=path).code == 0


def test_a_bad_checkpoint_is_refused_and_changes_nothing(tmp_path):
    from agentcas.errors import UsageError
    store, _ = Store.init(str(tmp_path / "st"))

    async def go():
        session = AgentcasSession("s", store)
        with pytest.raises(ValueError):
            await session.checkpoint()  # nothing stored yet
        await session.add_items([{"a": 1}])
        before = store.threads.reflog(session.thread)
        for reason in ("", " ", "x" * 513):
            with pytest.raises(UsageError):
                await session.checkpoint(reason)
        assert store.threads.reflog(session.thread) == before and store.threads.get(session.thread).checkpoint is None
    asyncio.run(go())
    store.close()
