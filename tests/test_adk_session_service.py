"""AgentcasSessionService against ADK's own InMemorySessionService, call for call; persistence,
forks, ADK's rewind, several processes on one session, and a shared store."""

from __future__ import annotations

import asyncio
import itertools

import pytest

pytest.importorskip("google.adk")

from google.adk.agents import LlmAgent  # noqa: E402
from google.adk.errors.already_exists_error import AlreadyExistsError  # noqa: E402
from google.adk.errors.not_found_error import NotFoundError  # noqa: E402
from google.adk.errors.session_not_found_error import SessionNotFoundError  # noqa: E402
from google.adk.events import Event, EventActions  # noqa: E402
from google.adk.platform import time as platform_time  # noqa: E402
from google.adk.platform import uuid as platform_uuid  # noqa: E402
from google.adk.runners import Runner  # noqa: E402
from google.adk.sessions import InMemorySessionService, Session  # noqa: E402
from google.adk.sessions.base_session_service import BaseSessionService, GetSessionConfig  # noqa: E402
from google.genai import types  # noqa: E402
from hypothesis import HealthCheck, example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from agentcas import Store  # noqa: E402
from agentcas.adk import AgentcasSessionService, session_thread  # noqa: E402
from agentcas.cas.store import TABLES  # noqa: E402

from support.cli import run_cli  # noqa: E402
from support.processes import start_together  # noqa: E402


@pytest.fixture
def clock():
    """ADK's clock and ids made deterministic: `clock.now` is what get_time returns."""
    class Clock:
        now = 1000.0
        ids = itertools.count()
    platform_time.set_time_provider(lambda: Clock.now)
    platform_uuid.set_id_provider(lambda: f"id-{next(Clock.ids)}")
    yield Clock
    platform_time.reset_time_provider()
    platform_uuid.reset_id_provider()


def event(n: int, delta: dict | None = None, invocation: str | None = None, partial: bool | None = None,
          timestamp: float | None = None) -> Event:
    return Event(id=f"e{n}", invocation_id=invocation or f"inv{n}", author="user" if n % 2 else "model",
                 timestamp=float(n) if timestamp is None else timestamp, partial=partial,
                 content=types.Content(role="user", parts=[types.Part(text=f"message {n}")]),
                 actions=EventActions(state_delta=dict(delta or {})))


def shape(value):
    """What a call answered, comparable across services: sessions and events as dicts."""
    if isinstance(value, (Session, Event)):
        return value.model_dump()
    if hasattr(value, "sessions"):
        return [s.model_dump() for s in value.sessions]
    return value


async def outcome(coro):
    try:
        return "ok", shape(await coro)
    except Exception as exc:  # noqa: BLE001 - the same error class is what is compared
        return "error", type(exc).__name__


# -- call for call against InMemorySessionService ----------------------------------------------
keys = st.sampled_from(["a", "b", "app:x", "user:y", "temp:t"])
values = st.none() | st.integers(-3, 3) | st.text(max_size=4)
states = st.dictionaries(keys, values, max_size=3)
sids = st.sampled_from(["s1", "s2", " s1 "])
users = st.sampled_from(["u1", "u2"])
calls = st.lists(st.one_of(
    st.tuples(st.just("create"), users, st.none() | sids, st.none() | states),
    st.tuples(st.just("get"), users, sids, st.none() | st.integers(0, 4),
              st.none() | st.integers(0, 12).map(float) | st.floats(0, 12)),
    st.tuples(st.just("list"), st.none() | users),
    st.tuples(st.just("delete"), users, sids),
    st.tuples(st.just("append"), users, sids, states, st.booleans()),
    st.tuples(st.just("again"),),
    st.tuples(st.just("user_state"), users),
    st.tuples(st.just("rewind"), users, sids, st.integers(0, 20)),
), max_size=20)


async def play(service: BaseSessionService, calls, clock) -> list:
    """Each call's outcome; appends go through the session object get_session returns."""
    answers, last = [], None
    clock.ids = itertools.count()
    for step, call in enumerate(calls):
        clock.now = 100.0 + step
        kind = call[0]
        if kind == "create":
            answers.append(await outcome(service.create_session(app_name="app", user_id=call[1], session_id=call[2],
                                                                state=call[3])))
        elif kind == "get":
            config = GetSessionConfig(num_recent_events=call[3], after_timestamp=call[4])
            answers.append(await outcome(service.get_session(app_name="app", user_id=call[1], session_id=call[2],
                                                             config=config)))
        elif kind == "list":
            answers.append(await outcome(service.list_sessions(app_name="app", user_id=call[1])))
        elif kind == "delete":
            answers.append(await outcome(service.delete_session(app_name="app", user_id=call[1], session_id=call[2])))
        elif kind == "user_state":
            answers.append(await outcome(service.get_user_state(app_name="app", user_id=call[1])))
        elif kind == "append":
            session = await service.get_session(app_name="app", user_id=call[1], session_id=call[2].strip())
            if session is None:
                session = Session(app_name="app", user_id=call[1], id=call[2].strip())
            last = (session, event(step, call[3], partial=call[4] or None))
            answers.append(await outcome(service.append_event(*last)))
            answers.append(shape(session))
        elif kind == "rewind":  # what Runner.rewind_async does, without artifacts
            from google.adk.sessions import _rewind_utils
            session = await service.get_session(app_name="app", user_id=call[1], session_id=call[2].strip())
            if session is None:
                answers.append(None)
                continue
            answers.append(await outcome(_rewind_utils.rewind_session(
                session_service=service, session=session, rewind_before_invocation_id=f"inv{call[3]}")))
            answers.append(shape(await service.get_session(app_name="app", user_id=call[1],
                                                           session_id=call[2].strip())))
        elif last is not None:  # an equal re-delivery of the last event
            answers.append(await outcome(service.append_event(*last)))
            answers.append(shape(last[0]))
    return answers


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(calls=calls)
@example(calls=[("create", "u1", "s1", {"a": 1, "app:x": 2, "user:y": 3, "temp:t": 4}),
                ("append", "u1", "s1", {"a": 2, "temp:t": 5, "user:y": None}, False),
                ("again",), ("append", "u1", "s1", {"b": 1}, True),
                ("create", "u1", " s1 ", None), ("get", "u1", "s1", 1, None), ("get", "u1", "s1", None, 1.0),
                ("list", None), ("user_state", "u1"), ("delete", "u1", "s1"), ("append", "u1", "s1", {}, False),
                ("list", "u1")])
@example(calls=[("create", "u1", "s1", {"a": 1, "user:y": 1}), ("append", "u1", "s1", {"a": 2, "b": 1}, False),
                ("append", "u1", "s1", {"a": 3, "user:y": 2}, False), ("rewind", "u1", "s1", 2),
                ("rewind", "u1", "s1", 9), ("get", "u1", "s1", None, None)])
def test_every_sequence_of_calls_answers_as_in_memory_session_service(calls, clock):
    async def both():
        ours = AgentcasSessionService(Store.memory())
        return await play(ours, calls, clock), await play(InMemorySessionService(), calls, clock)
    got, want = asyncio.run(both())
    assert got == want


def test_it_is_a_base_session_service(tmp_path):
    service = AgentcasSessionService(str(tmp_path / "st"))
    assert isinstance(service, BaseSessionService)
    assert session_thread("my app", "u/1", "s.1") == "adk/my%20app/u%2F1/s%2E1"
    service.close()


# -- persistence --------------------------------------------------------------------------------
def test_a_new_service_on_the_same_store_sees_the_same_sessions(tmp_path, clock):
    path = str(tmp_path / "st")

    async def go():
        first = AgentcasSessionService(path)
        session = await first.create_session(app_name="app", user_id="u", session_id="s", state={"k": 0, "app:a": 1})
        for n in range(5):
            await first.append_event(session, event(n, {"k": n, "user:seen": n}))
        other = await first.create_session(app_name="app", user_id="v", state={"x": 1})
        expected = [await first.get_session(app_name="app", user_id="u", session_id="s"),
                    await first.get_session(app_name="app", user_id="v", session_id=other.id),
                    await first.list_sessions(app_name="app")]
        first.close()
        second = AgentcasSessionService(path)
        got = [await second.get_session(app_name="app", user_id="u", session_id="s"),
               await second.get_session(app_name="app", user_id="v", session_id=other.id),
               await second.list_sessions(app_name="app")]
        assert [shape(x) for x in got] == [shape(x) for x in expected]
        assert got[0].state == {"k": 4, "app:a": 1, "user:seen": 4} and len(got[0].events) == 5
        assert await second.get_user_state(app_name="app", user_id="u") == {"seen": 4}
        second.close()
    asyncio.run(go())


# -- forks and ADK's rewind ---------------------------------------------------------------------
def payload_bytes(store: Store) -> int:
    with store.environment.reader() as txn:
        return sum(len(k) + len(v) for table in TABLES for k, v in txn.scan(table))


def test_a_fork_holds_the_events_up_to_one_and_the_state_they_produce(tmp_path, clock):
    path = tmp_path / "st"

    async def go():
        service = AgentcasSessionService(str(path))
        source = await service.create_session(app_name="app", user_id="u", session_id="src",
                                              state={"initial": "kept", "k": -1})
        for n in range(6):
            await service.append_event(source, event(n, {"k": n, f"only{n}": True}))
        before = shape(await service.get_session(app_name="app", user_id="u", session_id="src"))
        fork = await service.fork_session("app", "u", "src", "alt", at_event_id="e2")
        assert [e.id for e in fork.events] == ["e0", "e1", "e2"]
        assert fork.state == {"initial": "kept", "k": 2, "only0": True, "only1": True, "only2": True}
        assert fork.id == "alt" and fork.last_update_time == 2.0
        await service.append_event(fork, event(10, {"k": 10}))
        whole = await service.fork_session("app", "u", "src")  # all events, a new id
        assert whole.id == "id-0" and [e.id for e in whole.events] == [f"e{n}" for n in range(6)]
        assert shape(await service.get_session(app_name="app", user_id="u", session_id="src")) == before
        got = await service.get_session(app_name="app", user_id="u", session_id="alt")
        assert [e.id for e in got.events] == ["e0", "e1", "e2", "e10"] and got.state["k"] == 10
        service.close()
    asyncio.run(go())
    lineage = run_cli("--json", "lineage", "adk/app/u/src", store=path).json()
    assert {c["thread"] for c in lineage["threads"][0]["children"]} == {"adk/app/u/alt", "adk/app/u/id-0"}


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(initial=states, deltas=st.lists(states, min_size=1, max_size=6), at=st.integers(0, 5),
       after=st.lists(st.tuples(st.booleans(), states), max_size=5))
def test_a_fork_answers_as_a_session_replaying_its_source_events_would(initial, deltas, at, after, clock):
    """Reference: an InMemorySessionService session created with the same initial state that
    is given the source's events up to the fork point; then appends on either side."""
    async def go():
        ours, reference = AgentcasSessionService(Store.memory()), InMemorySessionService()
        source = await ours.create_session(app_name="app", user_id="u", session_id="src", state=initial)
        expected = await reference.create_session(app_name="app", user_id="u", session_id="fork", state=initial)
        reference_source = await reference.create_session(app_name="app", user_id="u", session_id="src",
                                                          state=initial)
        cut = min(at, len(deltas) - 1)
        for n, delta in enumerate(deltas):
            await ours.append_event(source, event(n, delta))
            await reference.append_event(reference_source, event(n, delta))
            if n <= cut:  # right after, so that app and user state see each delta in one order
                await reference.append_event(expected, event(n, delta))
        fork = await ours.fork_session("app", "u", "src", "fork", at_event_id=f"e{cut}")
        sessions = {True: (fork, expected), False: (source, reference_source)}
        for n, (on_fork, delta) in enumerate(after, start=100):
            mine, theirs = sessions[on_fork]
            await ours.append_event(mine, event(n, delta))
            await reference.append_event(theirs, event(n, delta))
        for sid in ("src", "fork"):
            got = await ours.get_session(app_name="app", user_id="u", session_id=sid)
            want = await reference.get_session(app_name="app", user_id="u", session_id=sid)
            assert shape(got) == shape(want), sid
    asyncio.run(go())


def test_bad_forks_are_refused_and_change_nothing(tmp_path, clock):
    store, _ = Store.init(str(tmp_path / "st"))

    async def go():
        service = AgentcasSessionService(store)
        source = await service.create_session(app_name="app", user_id="u", session_id="src")
        await service.append_event(source, event(0, {"k": 0}))
        await service.create_session(app_name="app", user_id="u", session_id="taken")
        names = store.threads.names()
        with pytest.raises(SessionNotFoundError):
            await service.fork_session("app", "u", "missing", "new")
        with pytest.raises(NotFoundError):
            await service.fork_session("app", "u", "src", "new", at_event_id="no-such-event")
        with pytest.raises(AlreadyExistsError):
            await service.fork_session("app", "u", "src", "taken")
        assert store.threads.names() == names
        assert (await service.get_session(app_name="app", user_id="u", session_id="taken")).events == []
    asyncio.run(go())
    store.close()


def test_a_fork_of_a_long_session_stores_a_position_not_a_copy(tmp_path, clock):
    store, _ = Store.init(str(tmp_path / "st"))

    async def go():
        service = AgentcasSessionService(store)
        session = await service.create_session(app_name="app", user_id="u", session_id="long")
        for n in range(300):
            await service.append_event(session, event(n))
        before = payload_bytes(store)
        fork = await service.fork_session("app", "u", "long", "branch", at_event_id="e250")
        assert payload_bytes(store) - before < 2048  # 251 events of ~400 bytes copied would be ~100 KB
        assert len(fork.events) == 251
    asyncio.run(go())
    store.close()


async def rewound(service, session_id: str, invocation: str) -> Session:
    runner = Runner(app_name="app", agent=LlmAgent(name="agent", model="gemini-2.0-flash"),
                    session_service=service)
    await runner.rewind_async(user_id="u", session_id=session_id, rewind_before_invocation_id=invocation)
    return await service.get_session(app_name="app", user_id="u", session_id=session_id)


def test_adk_rewind_works_on_a_fork_as_on_adk_own_service(tmp_path, clock):
    async def go():
        ours = AgentcasSessionService(str(tmp_path / "st"))
        reference = InMemorySessionService()
        source = await ours.create_session(app_name="app", user_id="u", session_id="src", state={"base": 1})
        expected = await reference.create_session(app_name="app", user_id="u", session_id="fork", state={"base": 1})
        for n in range(5):
            await ours.append_event(source, event(n, {"k": n, f"set{n}": n}))
            if n <= 3:
                await reference.append_event(expected, event(n, {"k": n, f"set{n}": n}))
        await ours.fork_session("app", "u", "src", "fork", at_event_id="e3")
        clock.now = 50.0
        got, want = await rewound(ours, "fork", "inv2"), await rewound(reference, "fork", "inv2")
        assert [e.model_dump(exclude={"id", "invocation_id"}) for e in got.events] == \
               [e.model_dump(exclude={"id", "invocation_id"}) for e in want.events]
        assert got.state == want.state
        assert (await ours.get_session(app_name="app", user_id="u", session_id="src")).state["k"] == 4
        ours.close()
    asyncio.run(go())


def test_an_adk_runner_sees_the_same_session_as_with_in_memory_service(tmp_path, clock):
    """The one-line switch: Runner.run_async with a scripted model, once on
    InMemorySessionService and once on AgentcasSessionService: the same stored sessions."""
    from google.adk.models.base_llm import BaseLlm
    from google.adk.models.llm_response import LlmResponse

    class ScriptedLlm(BaseLlm):
        async def generate_content_async(self, llm_request, stream=False):
            said = sum(1 for c in llm_request.contents if c.role == "model")
            yield LlmResponse(content=types.Content(role="model", parts=[types.Part(text=f"answer {said}")]))

    async def conversation(service):
        clock.ids, clock.now = itertools.count(), 1000.0
        agent = LlmAgent(name="agent", model=ScriptedLlm(model="scripted"), output_key="last_answer")
        runner = Runner(app_name="app", agent=agent, session_service=service)
        await service.create_session(app_name="app", user_id="u", session_id="s", state={"user:lang": "en"})
        for text in ("hi", "again"):
            clock.now += 1
            async for _ in runner.run_async(user_id="u", session_id="s",
                                            new_message=types.Content(role="user", parts=[types.Part(text=text)])):
                pass
        return shape(await service.get_session(app_name="app", user_id="u", session_id="s"))

    async def both():
        return await conversation(AgentcasSessionService(str(tmp_path / "st"))), \
            await conversation(InMemorySessionService())
    got, want = asyncio.run(both())
    assert got == want
    assert got["state"]["last_answer"] == "answer 1" and len(got["events"]) == 4


# -- several processes, one session -------------------------------------------------------------
_WRITER = """
import asyncio, os, sys, time
from google.adk.events import Event, EventActions
from agentcas.adk import AgentcasSessionService
async def main(path, name, count, barrier):
    service = AgentcasSessionService(path)
    open(os.path.join(barrier, name), "w").close()
    while not os.path.exists(os.path.join(barrier, "go")):
        time.sleep(0.005)
    for i in range(count):
        session = await service.get_session(app_name="app", user_id="u", session_id="s")
        await service.append_event(session, Event(author=name, invocation_id=f"{name}-{i}",
                                                  actions=EventActions(state_delta={f"{name}": i, "user:last": name,
                                                                                    "app:count": i})))
    service.close()
asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]))
"""


def test_several_processes_appending_to_one_session_lose_nothing(tmp_path):
    path = str(tmp_path / "st")

    async def create():
        service = AgentcasSessionService(path)
        await service.create_session(app_name="app", user_id="u", session_id="s")
        service.close()
    asyncio.run(create())
    writers = start_together(_WRITER, [[path, f"w{k}", "20"] for k in range(3)], tmp_path / "barrier")
    assert [w.wait(timeout=300) for w in writers] == [0, 0, 0]

    async def read():
        service = AgentcasSessionService(path)
        session = await service.get_session(app_name="app", user_id="u", session_id="s")
        service.close()
        return session
    session = asyncio.run(read())
    assert len(session.events) == 60
    for k in range(3):
        assert [e.invocation_id for e in session.events if e.author == f"w{k}"] == [f"w{k}-{i}" for i in range(20)]
        assert session.state[f"w{k}"] == 19
    assert session.state["user:last"] == session.events[-1].author


# -- a shared store -----------------------------------------------------------------------------
def test_sessions_on_a_shared_store_are_seen_by_another_machine(tmp_path, s3_url, postgres_url, monkeypatch, clock):
    monkeypatch.setenv("AGENTCAS_CACHE_DIR", str(tmp_path / "cache-a"))

    async def go():
        first = AgentcasSessionService(s3_url, refs=postgres_url)
        session = await first.create_session(app_name="app", user_id="u", session_id="s", state={"user:name": "Ada"})
        for n in range(3):
            await first.append_event(session, event(n, {"k": n}))
        await first.fork_session("app", "u", "s", "f", at_event_id="e1")
        expected = shape(await first.get_session(app_name="app", user_id="u", session_id="s"))
        first.close()
        monkeypatch.setenv("AGENTCAS_CACHE_DIR", str(tmp_path / "cache-b"))
        second = AgentcasSessionService(s3_url, refs=postgres_url)
        assert shape(await second.get_session(app_name="app", user_id="u", session_id="s")) == expected
        fork = await second.get_session(app_name="app", user_id="u", session_id="f")
        assert [e.id for e in fork.events] == ["e0", "e1"] and fork.state == {"k": 1, "user:name": "Ada"}
        assert [s.id for s in (await second.list_sessions(app_name="app")).sessions] == ["f", "s"]
        second.close()
    asyncio.run(go())


def test_push_pull_and_export_carry_a_session_like_any_thread(tmp_path, clock):
    laptop, team = tmp_path / "laptop", tmp_path / "team"

    async def fill():
        service = AgentcasSessionService(str(laptop))
        session = await service.create_session(app_name="app", user_id="u", session_id="s", state={"k": 0})
        await service.append_event(session, event(0, {"k": 1}))
        service.close()
    asyncio.run(fill())
    assert run_cli("init", team).code == 0
    assert run_cli("remote", "add", "team", team, store=laptop).code == 0
    assert run_cli("push", "team", "adk/app/u/s", store=laptop).code == 0

    async def read():
        service = AgentcasSessionService(str(team))
        session = await service.get_session(app_name="app", user_id="u", session_id="s")
        service.close()
        return session
    session = asyncio.run(read())
    assert session.state == {"k": 1} and [e.id for e in session.events] == ["e0"]

    async def checkpoint():
        service = AgentcasSessionService(str(laptop))
        with pytest.raises(SessionNotFoundError):
            await service.checkpoint_session("app", "u", "missing")
        made = await service.checkpoint_session("app", "u", "s", "hand over")
        session = await service.get_session(app_name="app", user_id="u", session_id="s")
        await service.append_event(session, event(1, {"k": 2}))  # the session carries on after it
        service.close()
        return made
    made = asyncio.run(checkpoint())
    assert run_cli("--json", "show", "adk/app/u/s", store=laptop).json()["checkpoint"] == made
    assert run_cli("export", made, "-o", tmp_path / "s.bundle", store=laptop).code == 0
    other = tmp_path / "other"
    assert run_cli("init", other).code == 0
    assert run_cli("import", tmp_path / "s.bundle", "--allow-unsigned", store=other).code == 0

    async def read_other():
        service = AgentcasSessionService(str(other))
        session = await service.get_session(app_name="app", user_id="u", session_id="s")
        service.close()
        return session
    imported = asyncio.run(read_other())
    assert imported.state == {"k": 1} and [e.id for e in imported.events] == ["e0"]


def test_gc_keeps_a_fork_whole_after_its_source_is_deleted(tmp_path, clock):
    path = tmp_path / "st"

    async def build():
        service = AgentcasSessionService(str(path))
        source = await service.create_session(app_name="app", user_id="u", session_id="src", state={"k": -1})
        for n in range(4):
            await service.append_event(source, event(n, {"k": n}))
        await service.fork_session("app", "u", "src", "kept", at_event_id="e2")
        await service.delete_session(app_name="app", user_id="u", session_id="src")
        service.close()
    asyncio.run(build())
    assert run_cli("gc", "--grace", "0s", "--expire-reflog", "now", store=path).code == 0

    async def read():
        service = AgentcasSessionService(str(path))
        fork = await service.get_session(app_name="app", user_id="u", session_id="kept")
        listed = await service.list_sessions(app_name="app", user_id="u")
        service.close()
        return fork, listed
    fork, listed = asyncio.run(read())
    assert [e.id for e in fork.events] == ["e0", "e1", "e2"] and fork.state == {"k": 2}
    assert [s.id for s in listed.sessions] == ["kept"]
    assert run_cli("fsck", store=path).code == 0


def test_a_record_appended_by_hand_is_not_an_event_and_forks_still_cut_at_their_event(tmp_path, clock):
    path = tmp_path / "st"

    async def build():
        service = AgentcasSessionService(str(path))
        session = await service.create_session(app_name="app", user_id="u", session_id="s")
        await service.append_event(session, event(0, {"k": 0}))
        service.close()

    async def more():
        service = AgentcasSessionService(str(path))
        session = await service.get_session(app_name="app", user_id="u", session_id="s")
        await service.append_event(session, event(1, {"k": 1}))
        fork = await service.fork_session("app", "u", "s", "f", at_event_id="e1")
        got = await service.get_session(app_name="app", user_id="u", session_id="s")
        service.close()
        return fork, got
    asyncio.run(build())
    assert run_cli("rollout", "append", "adk/app/u/s", "-", input='{"note": "by hand"}\n', store=path).code == 0
    fork, got = asyncio.run(more())
    assert [e.id for e in got.events] == [e.id for e in fork.events] == ["e0", "e1"]
    assert fork.state == got.state == {"k": 1}
