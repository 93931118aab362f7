"""Claude Code replay rules (agentcas/harnesses/claude_replay.py), each on a transcript built from the rules."""

from __future__ import annotations

from agentcas.harnesses.claude_replay import replay_claude
from agentcas.harnesses.records import parse_records

from support.harness_samples import ClaudeSession


def replay(session: ClaudeSession) -> dict:
    return replay_claude(parse_records(session.data())).to_json()


def test_linear_session_chain_visible_and_messages():
    c = ClaudeSession()
    p = c.prompt("fix the tests")
    think, text = c.assistant({"type": "thinking", "thinking": "hm", "signature": "s"},
                              {"type": "text", "text": "on it"})
    use, result = c.tool()
    doc = replay(c)
    assert doc["chain"] == [p, think, text, use, result] == doc["visible"]
    assert doc["leaf"] == result and doc["session_id"] == c.session_id and doc["at"] == len(c.lines)
    assert doc["abandoned"] == [] and doc["sidechains"] == [] and doc["compaction"] is None
    # One message.id's records merge: thinking + text + tool_use are one assistant message.
    assert [m["role"] for m in doc["messages"]] == ["user", "assistant", "assistant", "user"]
    assert [b["type"] for b in doc["messages"][1]["content"]] == ["thinking", "text"]
    assert doc["messages"][3]["content"][0]["type"] == "tool_result"
    assert set(doc) == {"format", "session_id", "at", "leaf", "chain", "visible", "abandoned", "sidechains",
                        "compaction", "messages"}


def test_same_message_id_records_merge_into_one_assistant_message():
    c = ClaudeSession()
    c.prompt("hi")
    c.assistant({"type": "text", "text": "a"}, {"type": "tool_use", "id": "t1", "name": "Read", "input": {}},
                message_id="msg_1")
    doc = replay(c)
    assert doc["messages"] == [{"role": "user", "content": "hi"},
                               {"role": "assistant", "content": [
                                   {"type": "text", "text": "a"},
                                   {"type": "tool_use", "id": "t1", "name": "Read", "input": {}}]}]


def test_consecutive_user_records_merge_so_roles_alternate():
    c = ClaudeSession()
    c.prompt("first")
    c.node("user", message={"role": "user", "content": [{"type": "text", "text": "second"}]})
    c.say("ok")
    doc = replay(c)
    assert doc["messages"][0] == {"role": "user", "content": [{"type": "text", "text": "first"},
                                                              {"type": "text", "text": "second"}]}
    assert [m["role"] for m in doc["messages"]] == ["user", "assistant"]


def test_retried_prompt_wins_by_file_position_and_the_old_branch_is_abandoned():
    c = ClaudeSession()
    p1 = c.prompt("first")
    a1 = c.say("answer one")[0]
    old = c.prompt("original follow-up")
    old_answer = c.say("old answer")[0]
    retry = c.prompt("edited follow-up", parent=a1)       # re-uses the old prompt's parent, later in the file
    new_answer = c.say("new answer")[0]
    doc = replay(c)
    assert doc["chain"] == [p1, a1, retry, new_answer]
    assert doc["abandoned"] == [old, old_answer]


def test_leaf_prefers_non_meta_non_sidechain_records():
    c = ClaudeSession()
    p = c.prompt("hello")
    a = c.say("hi")[0]
    meta = c.meta("<local-command-caveat>Caveat</local-command-caveat>", parent=p)   # a meta terminal, later
    doc = replay(c)
    assert doc["leaf"] == a and doc["chain"] == [p, a] and doc["abandoned"] == [meta]
    # A meta record that is the only terminal is still the leaf (no better candidate).
    c.prompt("after", parent=a)
    c2 = ClaudeSession()
    q = c2.prompt("x")
    only = c2.meta("caveat", parent=q)
    assert replay(c2)["leaf"] == only


def test_meta_records_in_the_chain_are_not_visible_but_stay_in_the_chain():
    c = ClaudeSession()
    meta = c.meta("<local-command-caveat>Caveat: local commands</local-command-caveat>")
    p = c.prompt("go")
    a = c.say("done")[0]
    doc = replay(c)
    assert doc["chain"] == [meta, p, a]
    assert doc["visible"] == [p, a]
    # ... but Claude Code sends meta text to the model (docs/HARNESSES.md): it is in messages.
    assert doc["messages"][0]["role"] == "user"
    assert [b["text"] for b in doc["messages"][0]["content"]] == [
        "<local-command-caveat>Caveat: local commands</local-command-caveat>", "go"]


def test_inline_sidechains_show_up_and_stay_out_of_the_chain():
    c = ClaudeSession()
    p = c.prompt("research this")
    use = c.assistant({"type": "tool_use", "id": "task1", "name": "Task", "input": {"prompt": "explore"}})[0]
    side = c.sidechain("explore", "found three files")
    c.node("user", message={"role": "user", "content": [{"type": "tool_result", "tool_use_id": "task1",
                                                          "content": "found three files"}]})
    done = c.say("summary")[0]
    doc = replay(c)
    assert doc["leaf"] == done and p in doc["chain"] and use in doc["chain"]
    assert not set(side) & set(doc["chain"]) and not set(side) & set(doc["abandoned"])
    assert doc["sidechains"] == [{"root": side[0], "leaf": side[-1], "uuids": side}]


def test_compaction_boundary_starts_the_chain_and_logical_parent_is_not_followed():
    c = ClaudeSession()
    c.prompt("long work")
    last = c.say("lots of output")[0]
    boundary, summary = c.compact()
    caveat = c.meta("<local-command-caveat>Caveat</local-command-caveat>", parent=summary)
    command = c.prompt("<command-name>/compact</command-name>", parent=caveat)
    after = c.prompt("continue please")
    answer = c.say("continuing")[0]
    doc = replay(c)
    assert doc["chain"][0] == boundary and doc["chain"][-1] == answer
    assert doc["compaction"] == {"boundary": boundary, "logical_parent": last}
    assert summary in doc["visible"] and caveat not in doc["visible"] and command in doc["visible"]
    assert after in doc["visible"]
    assert doc["abandoned"] == []          # the pre-compaction history is replaced, not abandoned
    assert doc["messages"][0]["role"] == "user"


def test_two_compactions_history_before_both_is_not_abandoned():
    c = ClaudeSession()
    c.prompt("a")
    c.say("b")
    c.compact("s1")
    c.prompt("c")
    c.say("d")
    second, _ = c.compact("s2")
    c.prompt("e")
    doc = replay(c)
    assert doc["chain"][0] == second and doc["abandoned"] == []


def test_non_chain_lines_damaged_lines_and_unknown_types_are_tolerated():
    c = ClaudeSession()
    c.extra({"type": "summary", "summary": "Fixing tests", "leafUuid": "x"})
    c.extra({"type": "file-history-snapshot", "messageId": "m", "snapshot": {}, "isSnapshotUpdate": False})
    p = c.prompt("go")
    c.lines.append(b"{damaged\n")
    c.lines.append(b"\xff\xfe\n")
    c.extra({"type": "brand-new-record", "uuid": "zzz", "weird": True})
    a = c.say("ok")[0]
    doc = replay(c)
    assert doc["chain"] == [p, a] and doc["session_id"] == c.session_id


def test_system_records_are_dropped_from_messages():
    c = ClaudeSession()
    p = c.prompt("go")
    c.node("system", subtype="informational", content="hook ran", level="info")
    c.say("ok")
    doc = replay(c)
    assert [m["role"] for m in doc["messages"]] == ["user", "assistant"]
    assert doc["chain"][0] == p and len(doc["chain"]) == 3


def test_empty_transcript():
    doc = replay_claude([])
    assert doc.leaf is None and doc.chain == [] and doc.messages == [] and doc.session_id is None


def test_a_parent_uuid_that_is_not_a_string_makes_a_root_never_a_failure():
    """`parentUuid` holding a list or an object (damaged or foreign) is no parent: that record
    starts a chain of its own, in the main conversation or in a sidechain (the SDK's chain
    builder would fail on the unhashable value)."""
    s = ClaudeSession()
    s.prompt("hi")
    s.say("hello")
    s.node("assistant", parent=["not", "a", "uuid"], uuid="odd-list",
           message={"id": "m9", "role": "assistant", "content": [{"type": "text", "text": "x"}]})
    s.node("user", parent={"uuid": "x"}, uuid="odd-dict", isSidechain=True,
           message={"role": "user", "content": "side"})
    doc = replay(s)
    assert doc["leaf"] == "odd-list" and doc["chain"] == ["odd-list"]
    assert [side["root"] for side in doc["sidechains"]] == ["odd-dict"]


def test_a_record_whose_type_is_not_a_string_is_no_node():
    """A `type` holding a list or an object matches no record type (the SDK's `type in (...)`
    checks never take it), so the record is passed over: the chain goes round it. It made
    replay fail (`unhashable type: 'list'`) until types were taken only as strings."""
    s = ClaudeSession()
    first = s.prompt("hi")
    s.node(["user"], parent=first, uuid="odd-type", message={"role": "user", "content": "x"})
    s.node({"a": 1}, parent=first, uuid="odd-type-2", message={"role": "user", "content": "y"})
    doc = replay(s)
    assert doc["chain"] == [first] and doc["leaf"] == first
    assert "odd-type" not in doc["abandoned"] and doc["messages"] == [{"role": "user", "content": "hi"}]
