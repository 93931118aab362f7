"""Codex replay rules (agentcas/harnesses/codex_replay.py), each on a session built from the rules."""

from __future__ import annotations

import json

from agentcas.harnesses.codex_replay import SUMMARY_PREFIX, drop_last_n_user_turns, is_user_turn_boundary, replay_codex
from agentcas.harnesses.records import parse_records

from support.harness_samples import CodexSession, dumps, env_context, text_item


def replay(session: CodexSession) -> dict:
    return replay_codex(parse_records(session.data())).to_json()


def texts(doc) -> list[str]:
    out = []
    for item in doc["items"]:
        if item["type"] == "message":
            out.append(f"{item['role']}:" + "".join(p.get("text", "") for p in item["content"]))
        else:
            out.append(item["type"])
    return out


def line_of(session: CodexSession, needle: str) -> int:
    return next(i for i, line in enumerate(session.lines, 1) if needle.encode() in line)


def test_items_are_the_files_response_items_exactly_with_their_lines():
    s = CodexSession()
    s.turn("fix the login timeout", "fixed it")
    doc = replay(s)
    expected = [(json.loads(line)["payload"], n) for n, line in enumerate(s.lines, 1)
                if json.loads(line)["type"] == "response_item"]
    assert doc["items"] == [item for item, _ in expected]
    assert doc["item_lines"] == [n for _, n in expected]
    assert doc["thread_id"] == s.thread_id and doc["at"] == len(s.lines)
    assert doc["compaction_line"] is None and doc["rolled_back_turns"] == [] and doc["skipped_lines"] == []
    assert set(doc) == {"format", "thread_id", "at", "items", "item_lines", "turn_context", "turn_context_line",
                        "compaction_line", "rolled_back_turns", "interrupted_turn", "skipped_lines"}


def test_system_messages_and_unknown_item_types_are_not_history():
    s = CodexSession()
    turn = s.start(prompt="hello")
    s.item(text_item("system", "internal"))
    s.item({"type": "ghost_snapshot_from_the_future", "x": 1})
    s.item({"type": "compaction_trigger"})
    s.reply("hi")
    s.complete(turn)
    assert "system:internal" not in texts(replay(s))
    assert "ghost_snapshot_from_the_future" not in texts(replay(s))
    assert texts(replay(s))[-1] == "assistant:hi"


def test_compaction_with_replacement_history_is_the_base():
    s = CodexSession()
    s.turn("fix the login timeout", "fixed")
    compacted = s.compact("login fixed")
    s.turn("deploy to staging", "staging done")
    doc = replay(s)
    assert doc["compaction_line"] == compacted
    assert texts(doc)[:2] == ["user:fix the login timeout", f"user:{SUMMARY_PREFIX}\nlogin fixed"]
    assert doc["item_lines"][:2] == [compacted, compacted]
    assert "user:" + env_context() in texts(doc)        # the next turn re-injects its context
    assert texts(doc)[-1] == "assistant:staging done"
    assert not any("fixed" == t.split(":", 1)[-1] for t in texts(doc))   # the old reply is gone


def test_remote_compaction_keeps_the_encrypted_compaction_item():
    s = CodexSession()
    s.turn("one")
    s.compact(remote=True)
    doc = replay(s)
    assert texts(doc) == ["user:one", "compaction"]


def test_legacy_compaction_rebuilds_from_user_messages_and_summary_and_clears_turn_context():
    s = CodexSession()
    s.turn("first ask", "a1")
    s.turn("second ask", "a2")
    line = s.compact("legacy summary", history=False)
    doc = replay(s)
    assert texts(doc) == ["user:first ask", "user:second ask", f"user:{SUMMARY_PREFIX}\nlegacy summary"]
    assert doc["item_lines"] == [line] * 3
    assert doc["turn_context"] is None and doc["turn_context_line"] is None
    assert doc["compaction_line"] == line


def test_legacy_compaction_skips_earlier_summaries_and_contextual_messages():
    s = CodexSession()
    s.turn("ask one")
    s.compact("first summary", history=False)
    s.turn("ask two")
    s.compact("second summary", history=False)
    assert texts(replay(s)) == ["user:ask one", "user:ask two", f"user:{SUMMARY_PREFIX}\nsecond summary"]


def test_rollback_drops_the_last_user_turn_and_its_context_diff():
    s = CodexSession()
    s.turn("fix the login timeout", "fixed", model="model-large")
    s.turn("deploy to production", "cannot", model="model-small", approval="never")
    s.rollback(1)
    doc = replay(s)
    assert texts(doc)[-1] == "assistant:fixed"
    assert "user:deploy to production" not in texts(doc)
    # The rolled-back turn's environment diff sat directly above its prompt: trimmed too.
    assert texts(doc).count("user:" + env_context()) == 1
    assert doc["turn_context"]["model"] == "model-large"
    assert doc["turn_context_line"] == line_of(s, '"model":"model-large"')
    assert doc["rolled_back_turns"] == ["0199a0b1-0002-7000-8000-00000000turn"]


def test_rollback_of_more_turns_than_exist_keeps_the_session_prefix():
    s = CodexSession()
    s.turn("one")
    s.turn("two")
    s.rollback(5)
    doc = replay(s)
    # Everything before the first real user message survives: the initial context.
    assert [t.split(":", 1)[0] for t in texts(doc)] == ["developer", "user", "user"]
    assert "user:one" not in texts(doc)
    assert doc["turn_context"] is None


def test_drop_last_n_trim_never_crosses_the_first_user_turn():
    first = text_item("user", "first")
    history = [(text_item("user", env_context()), 1), (first, 2), (text_item("assistant", "a"), 3),
               (text_item("user", env_context()), 4), (text_item("user", "second"), 5)]
    assert [line for _, line in drop_last_n_user_turns(history, 1)] == [1, 2, 3]
    assert [line for _, line in drop_last_n_user_turns(history, 2)] == [1]
    assert drop_last_n_user_turns(history, 0) == history


def test_contextual_fragments_need_both_markers_and_are_not_turn_boundaries():
    assert not is_user_turn_boundary(text_item("user", env_context()))
    assert not is_user_turn_boundary(text_item("user", "# AGENTS.md instructions for /r\n\n<INSTRUCTIONS>x</INSTRUCTIONS>"))
    assert not is_user_turn_boundary(text_item("user", "<turn_aborted>\nby user\n</turn_aborted>"))
    assert is_user_turn_boundary(text_item("user", "<environment_context> is what I want to change"))
    assert is_user_turn_boundary({"type": "agent_message", "content": []})
    assert not is_user_turn_boundary(text_item("assistant", "hi"))


def test_the_newest_surviving_turn_context_wins_and_a_compaction_clears_it():
    s = CodexSession()
    s.turn("one", model="m1")
    s.turn("two", model="m2")
    assert replay(s)["turn_context"]["model"] == "m2"
    s.compact()
    doc = replay(s)
    assert doc["turn_context"] is None     # manual compaction: the reference context is cleared
    s.turn("three", model="m3")
    assert replay(s)["turn_context"]["model"] == "m3"


def test_turn_context_of_a_turn_without_a_user_message_does_not_count():
    s = CodexSession()
    s.turn("one", model="m1")
    turn = s.start(model="m-review")     # a turn with no user prompt
    s.reply("auto")
    s.complete(turn)
    assert replay(s)["turn_context"]["model"] == "m1"


def test_unfinished_turn_is_kept_and_flagged():
    s = CodexSession()
    s.turn("one")
    turn = s.start(prompt="two")
    s.tool_call(answered=False)
    doc = replay(s)
    assert doc["interrupted_turn"] == turn
    assert doc["items"][-1]["type"] == "function_call"           # no synthetic "aborted" output
    assert not any(i["type"] == "function_call_output" and i.get("output") == "aborted" for i in doc["items"])


def test_aborted_turn_is_finished_not_interrupted():
    s = CodexSession()
    turn = s.start(prompt="two")
    s.abort(turn)
    doc = replay(s)
    assert doc["interrupted_turn"] is None
    assert texts(doc)[-1] == "user:two"


def test_first_session_meta_names_the_thread_even_with_a_copied_one():
    parent = CodexSession("parent-id")
    parent.turn("one")
    child = CodexSession("child-id", forked_from="parent-id")
    child.copy_lines(parent)
    child.turn("two")
    doc = replay(child)
    assert doc["thread_id"] == "child-id"
    assert "user:one" in texts(doc) and texts(doc)[-1] == "assistant:Done."


def test_damaged_lines_are_skipped_and_reported_by_line_number():
    s = CodexSession()
    turn = s.start(prompt="one")
    bad1 = s.raw(b"{not json\n")
    bad2 = s.raw(b"\xff\xfe\x00binary\n")
    bad3 = s.raw(b"[1, 2]\n")
    blank = s.raw(b"\n")
    s.reply("ok")
    s.complete(turn)
    doc = replay(s)
    assert doc["skipped_lines"] == [bad1, bad2, bad3, blank]
    assert texts(doc)[-1] == "assistant:ok"


def test_unknown_record_types_and_fields_are_tolerated():
    s = CodexSession()
    s.record("world_state", {"full": True, "state": {"cwd": "/repo"}})
    turn = s.start(prompt="one")
    s.lines.append(dumps({"timestamp": "t", "type": "response_item", "ordinal": 7,
                          "payload": {**text_item("assistant", "new field"), "phase": "x", "future": [1]}}))
    s.event("sub_agent_activity", detail={"a": 1})
    s.complete(turn)
    doc = replay(s)
    assert doc["items"][-1]["future"] == [1] and doc["skipped_lines"] == []


def test_inter_agent_messages_are_model_input_and_user_turns():
    s = CodexSession()
    s.turn("split the work")
    turn = s.start()   # a turn the worker's message starts (no user prompt in it)
    plain = s.record("inter_agent_communication", {"author": "/root/worker", "recipient": "/root",
                                                   "other_recipients": [], "content": "worker: tests pass",
                                                   "trigger_turn": True})
    s.record("inter_agent_communication_metadata", {"trigger_turn": True})
    sealed = s.record("inter_agent_communication", {"id": "mail_7", "author": "/root/worker", "recipient": "/root",
                                                    "content": "", "encrypted_content": "ciphertext",
                                                    "trigger_turn": False})
    unreadable = s.record("inter_agent_communication", {"author": "/root/worker", "content": 3})
    s.complete(turn)
    doc = replay(s)
    first, second = doc["items"][-2:]
    assert first == {"type": "agent_message", "author": "/root/worker", "recipient": "/root",
                     "content": [{"type": "input_text", "text": "worker: tests pass"}]}
    assert second == {"type": "agent_message", "id": "mail_7", "author": "/root/worker", "recipient": "/root",
                      "content": [{"type": "input_text", "text": "Message Type: MESSAGE\nTask name: /root\n"
                                                                  "Sender: /root/worker\nPayload:\n"},
                                  {"type": "encrypted_content", "encrypted_content": "ciphertext"}]}
    assert doc["item_lines"][-2:] == [plain, sealed] and unreadable not in doc["item_lines"]
    # Each message is a user turn boundary: a rollback of one turn drops the newest one only.
    s.rollback(1)
    after = replay(s)
    assert after["items"] == doc["items"][:-1] and after["item_lines"][-1] == plain
    assert after["rolled_back_turns"] == [turn]   # the scan counts the turn the messages make a user turn


def test_the_chapter_example_staging_survives_production_is_rolled_back():
    """§10.3.1 of the Codex persistence chapter, in the real record shapes."""
    s = CodexSession("thread-A")
    s.turn("修复登录超时", "已修改重试逻辑并通过测试", model="model-large")
    compacted = s.compact("已完成登录超时修复，测试通过")
    s.record("world_state", {"full": True, "state": {"cwd": "/repo", "environment": "local"}})
    staging = s.turn("发布到 staging", "staging 发布完成", model="model-large", approval="on-request")
    s.turn("继续发布 production", "无法执行需要审批的发布", model="model-small", approval="never", tools=0)
    s.rollback(1)
    doc = replay(s)
    assert doc["thread_id"] == "thread-A" and doc["compaction_line"] == compacted
    assert texts(doc)[0] == "user:修复登录超时" and texts(doc)[1].endswith("已完成登录超时修复，测试通过")
    assert "user:发布到 staging" in texts(doc) and texts(doc)[-1] == "assistant:staging 发布完成"
    assert not any("production" in t for t in texts(doc))
    assert (doc["turn_context"]["model"], doc["turn_context"]["approval_policy"]) == ("model-large", "on-request")
    assert doc["rolled_back_turns"] == ["0199a0b1-0004-7000-8000-00000000turn"]
    assert staging != doc["rolled_back_turns"][0]


def test_a_compaction_inside_a_rolled_back_turn_is_not_the_base():
    """Codex's own slicing (rollout_reconstruction.rs @0cf88612): the history suffix starts after
    the newest compaction-with-history any segment met, even one a rollback then skips; with no
    surviving base the history is rebuilt from that suffix alone. We reproduce it as it is."""
    s = CodexSession()
    s.turn("one", "r1")
    turn = s.start(prompt="two")
    s.record("compacted", {"message": "mid", "replacement_history": [text_item("user", "REPLACED")]})
    s.reply("r2")
    s.complete(turn)
    s.rollback(1)
    doc = replay(s)
    assert "user:REPLACED" not in texts(doc)
    assert texts(doc) == ["assistant:r2"] and doc["compaction_line"] is None


class CountingRecords:
    """A sequence that counts which indexes replay reads."""

    def __init__(self, records):
        self.records = records
        self.read = set()

    def __len__(self):
        return len(self.records)

    def __getitem__(self, index):
        self.read.add(index)
        return self.records[index]


def test_replay_reads_only_the_tail_after_the_newest_compaction():
    s = CodexSession()
    for n in range(200):
        s.turn(f"ask {n}")
    s.compact()
    s.turn("after", model="m-after")
    records = CountingRecords(parse_records(s.data()))
    doc = replay_codex(records, damaged_lines=[])   # a stored history's are known (damaged_lines.py)
    assert doc.turn_context["model"] == "m-after"
    assert min(records.read - {0}) > len(s.lines) - 40     # line 1 for the id, then only the tail


def test_events_codex_cannot_deserialize_are_skipped_never_fatal():
    """Codex skips a line that does not deserialize (codex-rs protocol.rs), so replay does:
    a turn start or completion whose `turn_id: String` is not a string, a `turn_aborted`
    whose `turn_id: Option<String>` is neither, a `user_message` whose `message` is not a
    string, a compaction whose replacement history holds a non-object (not a ResponseItem).
    Read as records, the first made replay fail (an unhashable turn id) and the last made a
    later rollback fail (a number among the items)."""
    s = CodexSession()
    s.turn("one", "did one")
    base = replay(s)
    s.event("task_complete", turn_id=["x"], last_agent_message=None)
    s.event("task_started", turn_id={"a": 1})
    s.event("turn_aborted", turn_id=7, reason="interrupted")
    s.event("user_message", message=["not", "text"])
    s.record("compacted", {"message": "summary", "replacement_history": [text_item("user", "LOST"), 5]})
    s.turn("two", "did two")
    s.rollback(1)
    doc = replay(s)
    assert texts(doc) == texts(base) and doc["turn_context"] == base["turn_context"]
    assert doc["compaction_line"] is None and doc["interrupted_turn"] is None and doc["skipped_lines"] == []


def test_a_turn_start_without_its_id_is_skipped_so_the_next_turns_context_counts():
    """A `task_started` without `turn_id` does not deserialize: the reverse scan does not see
    it close the newer turn's segment, which then takes in the older turn's prompt and so
    counts as a user turn: its `turn_context` (without an id: compatible) is the latest."""
    s = CodexSession()
    s.turn("one", "did one", model="model-a")
    s.event("task_started")
    context_b = s.record("turn_context", {"cwd": "/repo", "approval_policy": "on-request",
                                          "sandbox_policy": {"type": "read-only"}, "model": "model-b",
                                          "summary": "auto"})
    s.reply("working")
    s.event("task_complete", turn_id="t2", last_agent_message=None)
    doc = replay(s)
    assert doc["turn_context_line"] == context_b and doc["turn_context"]["model"] == "model-b"


def test_a_record_or_item_whose_type_is_not_a_string_is_passed_over():
    """serde reads a `RolloutLine`'s and a `ResponseItem`'s tag only as a string: a line whose
    `type` (or its payload's) is a list, an object or a number does not deserialize, and
    Codex skips it. Replay equals the replay without those lines; they once made it fail
    (`unhashable type: 'list'` in the item-type lookup)."""
    s = CodexSession()
    s.turn("one", "did one")
    base = replay(s)
    s.lines.append(dumps({"timestamp": "t", "type": ["response_item"], "payload": text_item("user", "LOST")}))
    s.item({"type": {"a": 1}, "role": "user", "content": [{"type": "input_text", "text": "LOST"}]})
    s.item({"type": 7, "role": "assistant", "content": []})
    doc = replay(s)
    assert texts(doc) == texts(base) and doc["item_lines"] == base["item_lines"] and doc["skipped_lines"] == []
