"""Acceptance tests for issues 10 (the LangGraph saver) and 11 (the shared store), written as
held-out tests would use the product: through the CLI contract and the issues' words."""

from __future__ import annotations

import asyncio
import os
from typing import Literal

import pytest

from conftest import run_cli
from agentcas import Store


# -- issue 11: a shared store's two URLs belong together -------------------------------------------

@pytest.fixture
def team(tmp_path, s3_url, postgres_url, workspace):
    """A shared store with one commit on `main`; (env, s3_url, postgres_url)."""
    env = {"AGENTCAS_STORE": s3_url, "AGENTCAS_REFS": postgres_url,
           "AGENTCAS_CACHE_DIR": str(tmp_path / "cache-a")}
    assert run_cli("init", env=env).code == 0
    made = run_cli("commit", workspace, "-m", "the team's work", env=env)
    assert made.code == 0, made
    return env, s3_url, postgres_url


def _thread_names(env) -> list[str]:
    listed = run_cli("--json", "branch", env=env)
    assert listed.code == 0, listed
    return sorted(t["thread"] for t in listed.json()["threads"])


def _objects_under(s3_server, url: str) -> list[str]:
    bucket, _, prefix = url[len("s3://"):].partition("/")
    page = s3_server.client().list_objects_v2(Bucket=bucket, Prefix=prefix.strip("/") + "/")
    return [o["Key"] for o in page.get("Contents", [])]


def test_a_mistyped_store_prefix_with_the_teams_refs_writes_nothing(team, workspace, tmp_path, s3_server):
    """The refs database names objects under its own prefix: a commit through another prefix
    (a typo, never initialised) must not publish a ref to objects the team's store lacks."""
    env, s3_url, postgres_url = team
    before = _thread_names(env)
    typo = s3_url + "-typo"
    for args in (("commit", workspace, "-m", "through a typo", "--thread", "typo"), ("log", "main")):
        bad = run_cli(*args, env=dict(env, AGENTCAS_STORE=typo, AGENTCAS_CACHE_DIR=str(tmp_path / "cache-b")))
        assert bad.code == 1, bad
        assert bad.err.startswith("agentcas: error: ") and bad.err.count("\n") == 1, bad.err
        assert typo in bad.err and s3_url in bad.err  # names both: which store the refs belong to
    assert _thread_names(env) == before
    fsck = run_cli("--json", "fsck", env=env)
    assert fsck.code == 0 and fsck.json()["ok"], fsck
    assert _objects_under(s3_server, typo) == []


def test_init_with_a_new_refs_database_on_a_used_prefix_is_refused(team, postgres_server, tmp_path):
    """Two refs databases over one prefix would each gc the other's objects."""
    env, s3_url, _ = team
    other_refs = postgres_server.create_database()
    again = run_cli("init", env=dict(env, AGENTCAS_REFS=other_refs, AGENTCAS_CACHE_DIR=str(tmp_path / "c2")))
    assert again.code == 3, again
    assert again.err.startswith("agentcas: error: ") and again.err.count("\n") == 1, again.err
    assert "nothing was written" in again.err
    # The new database did not become a store, and the team's store is as it was.
    opened = run_cli("log", "main", env=dict(env, AGENTCAS_REFS=other_refs))
    assert opened.code == 1 and "not an agentcas store" in opened.err, opened
    assert run_cli("--json", "fsck", env=env).json()["ok"]
    # Re-running init with the right pair is fine (idempotent).
    assert run_cli("init", env=env).code == 0


@pytest.mark.parametrize("url", ["s3://", "s3:///prefix"])
def test_a_store_url_without_a_bucket_is_a_usage_error(url, tmp_path):
    bad = run_cli("--store", url, "--refs", "postgresql://nobody@127.0.0.1:1/none", "log",
                  env={"AGENTCAS_CACHE_DIR": str(tmp_path / "cache")})
    assert bad.code == 2, bad
    assert bad.err.startswith("agentcas: error: ") and bad.err.count("\n") == 1
    assert "internal error" not in bad.err and "s3://BUCKET/PREFIX" in bad.err


def test_the_cache_on_disk_stays_within_a_few_times_its_bound(tmp_path, s3_url, postgres_url):
    """$AGENTCAS_CACHE_BYTES bounds the cache directory, not only what it lists: a commit
    and a checkout of 16 MB through a 2 MB cache leave a data file of a few MB."""
    import os
    bound = 2_000_000
    ws = tmp_path / "big"
    ws.mkdir()
    for i in range(8):
        (ws / f"f{i}").write_bytes(os.urandom(2_000_000))
    env = {"AGENTCAS_STORE": s3_url, "AGENTCAS_REFS": postgres_url, "AGENTCAS_CACHE_BYTES": str(bound)}

    def cache_file_bytes(cache):
        return sum(f.stat().st_size for f in cache.rglob("data.mdb"))
    assert run_cli("init", env=dict(env, AGENTCAS_CACHE_DIR=str(tmp_path / "cache-a"))).code == 0
    made = run_cli("commit", ws, "-m", "16 MB", env=dict(env, AGENTCAS_CACHE_DIR=str(tmp_path / "cache-a")))
    assert made.code == 0, made
    assert cache_file_bytes(tmp_path / "cache-a") <= 3 * bound
    out = run_cli("checkout", "main", tmp_path / "out", env=dict(env, AGENTCAS_CACHE_DIR=str(tmp_path / "cache-b")))
    assert out.code == 0, out
    assert all((tmp_path / "out" / f.name).read_bytes() == f.read_bytes() for f in ws.iterdir())
    assert cache_file_bytes(tmp_path / "cache-b") <= 3 * bound


# -- issue 10: the saver as an async context manager, like LangGraph's async savers ----------------

def test_from_path_is_an_async_context_manager_too(tmp_path):
    pytest.importorskip("langgraph")
    from langchain_core.messages import AIMessage, HumanMessage
    from langgraph.graph import END, START, MessagesState, StateGraph

    from agentcas.langgraph import AgentcasSaver, AsyncAgentcasSaver

    def reply(state):
        return {"messages": [AIMessage(content=f"reply {len(state['messages'])}")]}

    async def main(path):
        async with AsyncAgentcasSaver.from_path(path) as saver:
            builder = StateGraph(MessagesState)
            builder.add_node("agent", reply)
            builder.add_edge(START, "agent")
            builder.add_edge("agent", END)
            graph = builder.compile(checkpointer=saver)
            config = {"configurable": {"thread_id": "async"}}
            await graph.ainvoke({"messages": [HumanMessage(content="hi")]}, config)
            state = await graph.aget_state(config)
            return [m.content for m in state.values["messages"]]

    path = str(tmp_path / "store")
    assert asyncio.run(main(path)) == ["hi", "reply 1"]
    with AgentcasSaver.from_path(path) as saver:  # the sync form still works, on the same store
        assert saver.get_tuple({"configurable": {"thread_id": "async"}}) is not None
    assert Store.open(path).threads.get("langgraph/async") is not None
    assert AsyncAgentcasSaver is AgentcasSaver or issubclass(AsyncAgentcasSaver, AgentcasSaver)


# -- issue 10: a held-out scenario, side by side with LangGraph's InMemorySaver ---------------------

def _tool_loop_graph(saver):
    """agent <-> tools (an interrupt asks before each tool call) until two tools ran, then a
    subgraph that interrupts too."""
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
    from langgraph.graph import END, START, MessagesState, StateGraph
    from langgraph.types import interrupt

    def agent(state):
        messages = state["messages"]
        tools_ran = sum(isinstance(m, ToolMessage) for m in messages)
        if isinstance(messages[-1], HumanMessage) or (isinstance(messages[-1], ToolMessage) and tools_ran < 2):
            call = {"name": "calc", "args": {"x": tools_ran}, "id": f"call{len(messages)}"}
            return {"messages": [AIMessage(content=f"calling tool {tools_ran}", tool_calls=[call])]}
        return {"messages": [AIMessage(content="done: " + " ".join(m.content for m in messages
                                                                    if isinstance(m, ToolMessage)))]}

    def tools(state):
        call = state["messages"][-1].tool_calls[0]
        approved = interrupt({"approve": call["id"]})
        return {"messages": [ToolMessage(content=f"{call['args']['x'] * 10} ({approved})", tool_call_id=call["id"])]}

    def route(state) -> Literal["tools", "sub"]:
        return "tools" if getattr(state["messages"][-1], "tool_calls", None) else "sub"

    sub = StateGraph(MessagesState)
    sub.add_node("ask", lambda state: {"messages": [AIMessage(content=f"sub: {interrupt('sub?')}")]})
    sub.add_edge(START, "ask")
    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("tools", tools)
    builder.add_node("sub", sub.compile())
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", route)
    builder.add_edge("tools", "agent")
    builder.add_edge("sub", END)
    return builder.compile(checkpointer=saver)


def _seen(state) -> tuple:
    import re
    return (tuple(state.next), tuple(m.content for m in state.values.get("messages", [])),
            (state.metadata or {}).get("step"), (state.metadata or {}).get("source"),
            tuple((t.name, re.sub(r"id='[0-9a-f]+'", "", repr(t.interrupts))) for t in state.tasks))


def _scenario(saver) -> list:
    from langchain_core.messages import HumanMessage
    from langgraph.types import Command
    graph = _tool_loop_graph(saver)
    cfg = {"configurable": {"thread_id": "t"}}
    seen = []
    graph.invoke({"messages": [HumanMessage("compute")]}, cfg)
    for answer in ("yes", "yes again", "sub answer"):
        seen.append(_seen(graph.get_state(cfg)))
        graph.invoke(Command(resume=answer), cfg)
    history = list(graph.get_state_history(cfg))
    seen.append([_seen(h) for h in history])
    first_ask = [h for h in history if h.next == ("tools",)][-1]
    graph.invoke(Command(resume="no"), first_ask.config)  # time travel: resume a past interrupt
    seen.append(_seen(graph.get_state(cfg)))
    graph.update_state(history[-2].config, {"messages": [HumanMessage("instead")]})  # a fork
    graph.invoke(None, cfg)
    graph.invoke(Command(resume="on the fork"), cfg)
    seen.append(_seen(graph.get_state(cfg)))
    seen.append(sorted(map(repr, map(_seen, graph.get_state_history(cfg)))))

    async def asynchronous():
        acfg = {"configurable": {"thread_id": "a"}}
        await graph.ainvoke({"messages": [HumanMessage("async")]}, acfg)
        updates = [sorted(u) async for u in graph.astream(Command(resume="ay"), acfg, stream_mode="updates")]
        return [updates, _seen(await graph.aget_state(acfg)),
                [_seen(h) async for h in graph.aget_state_history(acfg)]]
    seen.append(asyncio.run(asynchronous()))
    return seen


def test_a_tool_loop_with_interrupts_forks_and_subgraphs_matches_in_memory_saver(tmp_path, run):
    pytest.importorskip("langgraph")
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.types import Command

    from agentcas.langgraph import AgentcasSaver

    expected = _scenario(InMemorySaver())
    path = tmp_path / "store"
    with AgentcasSaver.from_path(str(path)) as saver:
        assert _scenario(saver) == expected
    assert run("--json", "fsck", store=path).json()["ok"]
    log = run("--json", "log", "langgraph/t", store=path)
    assert log.code == 0 and all(c["reason"].startswith("langgraph step ") for c in log.json()["checkpoints"])
    lineage = run("lineage", "langgraph/t", store=path)
    assert lineage.code == 0 and "langgraph/t/branches/" in lineage.out
    # Hand the paused thread over, signed, and resume it on the other store with a new saver.
    assert run("keygen", "alice", "--out", tmp_path / "keys", store=path).code == 0
    assert run("export", "langgraph/t", "-o", tmp_path / "t.bundle", "--sign", tmp_path / "keys" / "alice.key",
               store=path).code == 0
    other = tmp_path / "other"
    assert run("init", other).code == 0
    assert run("trust", "add", "alice", tmp_path / "keys" / "alice.pub", store=other).code == 0
    assert run("import", tmp_path / "t.bundle", store=other).code == 0
    with AgentcasSaver.from_path(str(path)) as here, AgentcasSaver.from_path(str(other)) as there:
        cfg = {"configurable": {"thread_id": "t"}}
        mine, theirs = _tool_loop_graph(here), _tool_loop_graph(there)
        assert _seen(theirs.get_state(cfg)) == _seen(mine.get_state(cfg))
        for graph in (mine, theirs):
            graph.invoke(Command(resume="same answer"), cfg)
        assert _seen(theirs.get_state(cfg)) == _seen(mine.get_state(cfg))
    assert run("--json", "fsck", store=other).json()["ok"]


@pytest.mark.parametrize("refs", ["postgresql://agentcas@127.0.0.1:xx/db", "postgresql://agentcas@127.0.0.1:99999/db",
                                  "postgresql://agentcas@[::1/db"])
def test_a_malformed_refs_url_is_a_usage_error_at_once(refs, tmp_path):
    """A URL that cannot name a server is exit 2 with one line, not exit 1 after every retry."""
    bad = run_cli("--store", "s3://bucket/prefix", "--refs", refs, "log",
                  env={"AGENTCAS_CACHE_DIR": str(tmp_path / "cache"), "AGENTCAS_RETRY_SECONDS": "30"}, timeout=20)
    assert bad.code == 2, bad
    assert bad.err.startswith("agentcas: error: not a valid PostgreSQL URL") and bad.err.count("\n") == 1, bad.err
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize("name,value", [("AGENTCAS_CACHE_BYTES", "abc"), ("AGENTCAS_CACHE_BYTES", "-5"),
                                        ("AGENTCAS_RETRY_SECONDS", "zz"), ("AGENTCAS_PG_TIMEOUT", "nan"),
                                        ("AGENTCAS_S3_READ_TIMEOUT", "-1"), ("AGENTCAS_S3_CONNECTIONS", "abc")])
def test_a_malformed_shared_store_setting_is_refused_by_name(team, tmp_path, name, value):
    env, _, _ = team
    cache = tmp_path / "cache-new"
    bad = run_cli("log", "main", env=dict(env, AGENTCAS_CACHE_DIR=str(cache), **{name: value}))
    assert bad.code == 2, bad
    assert bad.err.startswith(f"agentcas: error: ${name} must be ") and bad.err.count("\n") == 1, bad.err
    assert "internal error" not in bad.err and not cache.exists()


def test_init_through_a_mistyped_bucket_with_the_teams_refs_makes_no_bucket(team, tmp_path, s3_server):
    """`init` with the team's refs and a bucket that does not exist is refused (the refs
    belong to another store), and leaves no bucket behind: the bucket was made before the
    refs database was asked, so the refusal's "nothing was written" was not true."""
    env, s3_url, _ = team
    typo = f"s3://typo-bucket-{os.getpid()}/shared"
    refused = run_cli("init", env=dict(env, AGENTCAS_STORE=typo, AGENTCAS_CACHE_DIR=str(tmp_path / "c3")))
    assert refused.code == 3 and "nothing was written" in refused.err, refused
    assert f"typo-bucket-{os.getpid()}" not in {b["Name"] for b in s3_server.client().list_buckets()["Buckets"]}
    assert run_cli("--json", "fsck", env=env).json()["ok"]
