"""Property: replay of a stored thread at SEQ equals replay of the file cut after SEQ records."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentcas import Store
from agentcas.api.history import SessionAppend
from agentcas.harnesses import replay as stored_replay
from agentcas.harnesses.claude_replay import replay_claude
from agentcas.harnesses.codex_replay import replay_codex
from agentcas.harnesses.records import parse_records

from support.harness_samples import ClaudeSession, CodexSession

CODEX_OPS = st.lists(st.sampled_from(["turn", "compact", "legacy", "rollback", "rollback2", "unfinished",
                                      "abort", "damaged", "unknown"]), min_size=1, max_size=12)
CLAUDE_OPS = st.lists(st.sampled_from(["prompt", "say", "tool", "retry", "sidechain", "compact", "meta",
                                       "damaged"]), min_size=1, max_size=14)


def build_codex(ops) -> CodexSession:
    s = CodexSession()
    for n, op in enumerate(ops):
        if op == "turn":
            s.turn(f"ask {n}", f"answer {n}", model=f"m{n}")
        elif op == "compact":
            s.compact(f"summary {n}")
        elif op == "legacy":
            s.compact(f"legacy {n}", history=False)
        elif op in ("rollback", "rollback2"):
            s.rollback(1 if op == "rollback" else 2)
        elif op == "unfinished":
            s.start(prompt=f"open {n}")
            s.tool_call(answered=False)
        elif op == "abort":
            s.abort(s.start(prompt=f"stop {n}"))
        elif op == "damaged":
            s.raw(b"\x00\xffdamaged\n")
        else:
            s.record("world_state", {"full": n % 2 == 0, "state": {}})
    return s


def build_claude(ops, draw_parent) -> ClaudeSession:
    c = ClaudeSession()
    nodes = []
    for n, op in enumerate(ops):
        if op == "prompt":
            nodes.append(c.prompt(f"prompt {n}"))
        elif op == "say":
            nodes += c.say(f"text {n}")
        elif op == "tool":
            nodes += list(c.tool())
        elif op == "retry":
            parent = nodes[draw_parent(len(nodes))] if nodes else None
            nodes.append(c.prompt(f"retry {n}", parent=parent))
        elif op == "sidechain":
            c.sidechain(f"task {n}", f"found {n}")
        elif op == "compact":
            nodes += list(c.compact(f"summary {n}"))
        elif op == "meta":
            nodes.append(c.meta(f"<local-command-caveat>{n}</local-command-caveat>"))
        else:
            c.lines.append(b"{broken\n")
    return c


def stored(data: bytes, thread: str) -> Store:
    store = Store.memory()
    store.history.ingest([SessionAppend(thread, data, ((data.count(b"\n"), "ingest"),))])
    return store


def cut(data: bytes, seq: int) -> bytes:
    lines = data.splitlines(keepends=True)
    return b"".join(lines[:seq])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(CODEX_OPS)
def test_codex_replay_at_every_seq_equals_replay_of_the_cut_file(ops):
    data = build_codex(ops).data()
    store = stored(data, "codex/t")
    for seq in range(data.count(b"\n") + 1):
        assert stored_replay.replay(store, "codex/t", seq, "codex") == replay_codex(parse_records(cut(data, seq)))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(CLAUDE_OPS, st.data())
def test_claude_replay_at_every_seq_equals_replay_of_the_cut_file(ops, data_strategy):
    session = build_claude(ops, lambda n: data_strategy.draw(st.integers(0, n - 1)))
    data = session.data()
    store = stored(data, "claude/t")
    for seq in range(data.count(b"\n") + 1):
        assert stored_replay.replay(store, "claude/t", seq, "claude") == replay_claude(parse_records(cut(data, seq)))


def test_replay_at_a_checkpoint_defaults_to_its_position():
    s = CodexSession()
    s.turn("one")
    first = len(s.lines)
    s.turn("two")
    data = s.data()
    store = Store.memory()
    result = store.history.ingest([SessionAppend("codex/t", data, ((first, "turn one"), (len(s.lines), "end")))])
    checkpoint = result[0].checkpoints[0]
    assert stored_replay.replay(store, checkpoint) == replay_codex(parse_records(cut(data, first)))


def _value_paths(value, path=()):
    """Every place in a JSON value: () for the value itself, then keys and indexes down."""
    yield path
    if isinstance(value, dict):
        for key, inner in value.items():
            yield from _value_paths(inner, path + (key,))
    elif isinstance(value, list):
        for index, inner in enumerate(value):
            yield from _value_paths(inner, path + (index,))


def _replaced(value, path, new):
    if not path:
        return new
    head, *rest = path
    copy = dict(value) if isinstance(value, dict) else list(value)
    copy[head] = _replaced(value[head], tuple(rest), new)
    return copy


ODD_VALUES = st.sampled_from([[1], ["user"], {"x": 1}, {}, 1.5, -1, 2 ** 70, True, None, "", "\u202e"])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(["codex", "claude"]), st.lists(st.tuples(st.integers(0, 10 ** 6), st.integers(0, 10 ** 6),
                                                              ODD_VALUES), min_size=1, max_size=3))
def test_replay_of_a_log_whose_values_have_unexpected_types_never_fails(fmt, changes):
    """Any value of any record (the record's own `type`, a payload's, a uuid, a content list)
    replaced by a value of another JSON type: replay and its transcript still answer, as
    the harnesses do (a record they cannot read is passed over, never fatal). A list `type`
    once made replay fail (`unhashable type: 'list'`), a number as a message's content or a
    list as `logicalParentUuid` the text transcript."""
    from agentcas.harnesses.replay import render_text
    if fmt == "codex":
        session = build_codex(["turn", "compact", "turn", "rollback", "unfinished"])
    else:
        session = build_claude(["prompt", "say", "tool", "sidechain", "compact", "prompt", "say"], lambda n: 0)
    lines = [json.loads(raw) for raw in session.lines]
    for line_pick, place_pick, new in changes:
        index = line_pick % len(lines)
        places = list(_value_paths(lines[index]))
        lines[index] = _replaced(lines[index], places[place_pick % len(places)], new)
    records = parse_records(b"".join(json.dumps(line).encode() + b"\n" for line in lines))
    doc = replay_codex(records) if fmt == "codex" else replay_claude(records)
    assert doc.format == fmt and doc.at == len(lines)
    assert render_text(doc, records)
    json.dumps(doc.to_json())
