"""Replay by the harnesses' resume rules, through the real CLI.

Every session here is written by this file's own builders (`Rollout`, `Transcript`) from
docs/HARNESSES.md ("The two log formats") and the harnesses' source it cites, not by the repo's
sample builders; each test ingests the file with `agentcas --store DIR ingest codex|claude`
and reads `agentcas --json replay THREAD [--at N]` in a subprocess, then compares the JSON
field by field with what the rule says the harness rebuilds on resume. The expected values
are worked out by hand from the rule (line numbers of the file), never by calling the
reducers.

Sources (read for these tests): openai/codex `core/src/session/rollout_reconstruction.rs`
@0cf88612 (reverse scan, segments, `finalize_active_segment`, rollout suffix, legacy
compaction clearing the reference context), `core/src/context_manager/history.rs` @023fad26
(`drop_last_n_user_turns`, `trim_pre_turn_context_updates`, `is_api_message`),
`core/src/event_mapping.rs` @0846c126 (contextual fragments), `core/src/compact.rs`
(`run_compact_task`: a TurnStarted, `replacement_history` = user messages + summary;
`build_compacted_history`, `collect_user_messages`, `is_summary_message`),
`core/src/thread_manager.rs` (`truncate_before_nth_user_message`: the fork copies the rollout
items strictly before the n-th user message); anthropics/claude-agent-sdk-python
`_internal/sessions.py` @005d7596 (`_parse_transcript_entries`, `_build_conversation_chain`,
`_is_visible_message`, `_build_subagent_chain`, `_entries_to_subagent_messages`).
"""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path

from support.cli import AGENTCAS

CODEX_KEYS = {"format", "thread_id", "at", "items", "item_lines", "turn_context", "turn_context_line",
              "compaction_line", "rolled_back_turns", "interrupted_turn", "skipped_lines"}
CLAUDE_KEYS = {"format", "session_id", "at", "leaf", "chain", "visible", "abandoned", "sidechains",
               "compaction", "messages"}
# codex-rs/core/templates/compact/summary_prefix.md (as compact.rs includes it, no trailing newline)
SUMMARY_PREFIX = (
    "Another language model started to solve this problem and produced a summary of its thinking "
    "process. You also have access to the state of the tools that were used by that language model. "
    "Use this to build on the work that has already been done and avoid duplicating work. Here is the "
    "summary produced by the other language model, use the information in this summary to  assist "
    "with your own analysis:")


# --- the CLI ----------------------------------------------------------------------------------------

def cli(store_dir, *args):
    return subprocess.run([AGENTCAS, "--store", str(store_dir), *map(str, args)], capture_output=True,
                          text=True, timeout=120)


def json_failure(result, code: int) -> bool:
    """A --json failure: exit `code` and, on stdout, only {"error": its stderr line, "exit_code"}."""
    doc = json.loads(result.stdout)
    return result.returncode == code and doc == {"error": result.stderr.strip()[len("agentcas: error: "):],
                                                 "exit_code": code}


def ingest(store_dir, harness, path):
    result = cli(store_dir, "--json", "ingest", harness, path)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def replay(store_dir, rev, *args):
    result = cli(store_dir, "--json", "replay", rev, *args)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert set(doc) == (CODEX_KEYS if doc["format"] == "codex" else CLAUDE_KEYS)
    return doc


def one_error_line(result) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("agentcas: error: "), result.stderr
    assert "Traceback" not in result.stderr
    return lines[0]


# --- Codex rollouts, written from docs/HARNESSES.md (formats, Codex replay) ---------------------------

def line_json(obj) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False) + "\n"


def text_message(role: str, text: str) -> dict:
    kind = "output_text" if role == "assistant" else "input_text"
    return {"type": "message", "role": role, "content": [{"type": kind, "text": text}]}


class Rollout:
    """A Codex rollout: `RolloutLine {timestamp, type, payload}` per line."""

    def __init__(self, thread_id=None, forked_from=None, cwd="/work/app"):
        self.id = thread_id or str(uuid.uuid4())
        self.cwd = cwd
        self.lines: list[str] = []
        self.clock = 0
        meta = {"id": self.id, "timestamp": "2025-11-02T09:00:00.000Z", "cwd": cwd, "originator": "codex_cli_rs",
                "cli_version": "0.58.0", "source": "cli", "model_provider": "openai",
                "base_instructions": {"text": "You are a coding agent."}, "git": {"branch": "main"}}
        if forked_from:
            meta["forked_from_id"] = forked_from
        self.record("session_meta", meta)

    def record(self, kind: str, payload) -> int:
        self.clock += 1
        stamp = f"2025-11-02T09:{self.clock // 60 % 60:02d}:{self.clock % 60:02d}.{self.clock % 1000:03d}Z"
        self.lines.append(line_json({"timestamp": stamp, "type": kind, "payload": payload}))
        return len(self.lines)

    def raw(self, text: str) -> int:
        self.lines.append(text)
        return len(self.lines)

    def event(self, **payload) -> int:
        return self.record("event_msg", payload)

    def item(self, payload) -> int:
        return self.record("response_item", payload)

    def payload(self, line: int):
        return json.loads(self.lines[line - 1])["payload"]

    def initial_context(self) -> list[int]:
        """`build_initial_context`: one developer message, one contextual user message."""
        return [self.item({"type": "message", "role": "developer", "content": [
                    {"type": "input_text", "text": "<permissions instructions>\nApprovals: on-request\n"
                                                   "</permissions instructions>"},
                    {"type": "input_text", "text": "<collaboration_mode>\ndefault\n</collaboration_mode>"}]}),
                self.item({"type": "message", "role": "user", "content": [
                    {"type": "input_text", "text": f"# AGENTS.md instructions for {self.cwd}\n\n<INSTRUCTIONS>\n"
                                                   "run the tests first\n</INSTRUCTIONS>"},
                    {"type": "input_text", "text": self.environment(cwd=True)}]})]

    def environment(self, cwd=False, date="2025-11-02") -> str:
        inner = (f"  <cwd>{self.cwd}</cwd>\n" if cwd else "") + \
            f"  <shell>bash</shell>\n  <current_date>{date}</current_date>\n  <timezone>UTC</timezone>\n"
        return "<environment_context>\n" + inner + "</environment_context>"

    def turn(self, prompt, *, initial=False, model="gpt-5-codex", approval="on-request", end="complete",
             tool=None, turn_context_id=None, cut_before_prompt=False):
        """One user turn in Codex's order; returns its lines: `context` and `items` are the
        model-visible response_items (context updates, then prompt and the turn's items)."""
        tid = str(uuid.uuid4())
        out = {"id": tid, "items": []}
        out["started"] = self.event(type="task_started", turn_id=tid, model_context_window=272000,
                                    collaboration_mode_kind="default")
        out["context"] = self.initial_context() if initial else [self.item(text_message("user", self.environment()))]
        out["turn_context"] = self.record("turn_context", {
            "turn_id": turn_context_id or tid, "cwd": self.cwd, "current_date": "2025-11-02", "timezone": "UTC",
            "approval_policy": approval, "sandbox_policy": {"type": "workspace-write", "network_access": False,
                                                            "exclude_tmpdir_env_var": False,
                                                            "exclude_slash_tmp": False},
            "model": model, "effort": "medium", "summary": "auto"})
        if cut_before_prompt:     # a fork copies everything strictly before the user message
            return out
        out["prompt"] = self.item(text_message("user", prompt))
        out["items"].append(out["prompt"])
        self.event(type="user_message", message=prompt, images=[], local_images=[], text_elements=[])
        self.event(type="agent_reasoning", text="Thinking about it.")
        out["items"].append(self.item({"type": "reasoning", "summary": [{"type": "summary_text", "text": "Plan."}],
                                       "content": None, "encrypted_content": "gAAAA-opaque"}))
        self.event(type="token_count", info=None, rate_limits=None)
        if tool is not None:
            call_id = f"call_{len(self.lines)}"
            out["call"] = self.item(dict(tool, call_id=call_id))
            out["items"].append(out["call"])
            if end == "crash":
                return out
            output_type = "custom_tool_call_output" if tool["type"] == "custom_tool_call" else "function_call_output"
            out["items"].append(self.item({"type": output_type, "call_id": call_id,
                                           "output": "Exit code: 0\nWall time: 0.1 seconds\nOutput:\nok\n"}))
        if end == "crash":
            return out
        if end == "aborted":
            out["end"] = self.event(type="turn_aborted", turn_id=tid, reason="interrupted")
            out["items"].append(self.item(text_message("user", "<turn_aborted>\nThe user interrupted the turn."
                                                               "\n</turn_aborted>")))
            return out
        self.event(type="agent_message", message=f"done: {prompt}", phase="final_answer")
        out["items"].append(self.item(dict(text_message("assistant", f"done: {prompt}"), phase="final_answer")))
        self.event(type="token_count", info=None, rate_limits=None)
        out["end"] = self.event(type="task_complete", turn_id=tid, last_agent_message=f"done: {prompt}")
        return out

    def compact(self, summary: str, user_messages: list[str], legacy=False) -> tuple[int, list[dict]]:
        """Manual `/compact` (`run_compact_task`): its own TurnStarted, the `compacted` record,
        `context_compacted`, the task's completion; no turn_context."""
        tid = str(uuid.uuid4())
        self.event(type="task_started", turn_id=tid, model_context_window=272000, collaboration_mode_kind="default")
        message = f"{SUMMARY_PREFIX}\n{summary}"
        history = [text_message("user", text) for text in user_messages] + [text_message("user", message)]
        payload = {"message": message} if legacy else {"message": message, "replacement_history": history}
        line = self.record("compacted", payload)
        self.event(type="context_compacted")
        self.event(type="task_complete", turn_id=tid, last_agent_message=None)
        return line, history

    def rollback(self, num_turns: int) -> int:
        return self.event(type="thread_rolled_back", num_turns=num_turns)

    def write(self, root: Path) -> Path:
        path = root / "sessions" / "2025" / "11" / "02" / f"rollout-2025-11-02T09-00-00-{self.id}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(self.lines), encoding="utf-8")
        return path


def context_and_items(*turns) -> list[int]:
    return [line for turn in turns for line in turn["context"] + turn["items"]]


def check_items(doc, rollout: Rollout, lines: list[int]):
    """`items` are the file's payloads at exactly these lines, `item_lines` these lines."""
    assert doc["item_lines"] == lines
    assert doc["items"] == [rollout.payload(n) for n in lines]


def ingested(store_dir, tmp_path, rollout: Rollout) -> str:
    ingest(store_dir, "codex", rollout.write(tmp_path))
    return f"codex/{rollout.id}"


# --- Codex: rollbacks ------------------------------------------------------------------------------

def test_several_rollbacks_count_user_turns_and_trim_each_turns_context(store_dir, tmp_path):
    r = Rollout()
    t1 = r.turn("add a login form", initial=True, model="m1")
    t2 = r.turn("validate the email", model="m2")
    t3 = r.turn("add a captcha", model="m3")
    t4 = r.turn("send a welcome mail", model="m4")
    rb1 = r.rollback(1)
    t5 = r.turn("log the signups", model="m5")
    rb2 = r.rollback(2)
    thread = ingested(store_dir, tmp_path, r)

    # After the first rollback: T4 is gone with the environment diff directly above its prompt.
    first = replay(store_dir, thread, "--at", rb1)
    check_items(first, r, context_and_items(t1, t2, t3))
    assert first["rolled_back_turns"] == [t4["id"]]
    assert (first["turn_context_line"], first["turn_context"]) == (t3["turn_context"], r.payload(t3["turn_context"]))

    # The second rollback (num_turns 2) drops T5 and T3: the reverse scan skips T5, then T4 is
    # already owed to the first marker, then T3.
    head = replay(store_dir, thread)
    check_items(head, r, context_and_items(t1, t2))
    assert head["rolled_back_turns"] == [t3["id"], t4["id"], t5["id"]]
    assert head["turn_context_line"] == t2["turn_context"] and head["turn_context"]["model"] == "m2"
    assert head["compaction_line"] is None and head["interrupted_turn"] is None and head["skipped_lines"] == []
    assert head["at"] == rb2 == len(r.lines) and head["thread_id"] == r.id and head["format"] == "codex"


def test_rollback_of_more_turns_than_exist_keeps_only_what_precedes_the_first_prompt(store_dir, tmp_path):
    r = Rollout()
    t1 = r.turn("one", initial=True)
    t2 = r.turn("two")
    r.rollback(1)
    t3 = r.turn("three")
    r.rollback(10)
    doc = replay(store_dir, ingested(store_dir, tmp_path, r))
    # drop_last_n_user_turns: n >= the user turns -> cut at the first one; the trim never
    # crosses it, so T1's initial context (developer + AGENTS.md/environment) survives.
    check_items(doc, r, t1["context"])
    assert doc["rolled_back_turns"] == [t1["id"], t2["id"], t3["id"]]
    assert doc["turn_context"] is None and doc["turn_context_line"] is None


def test_rollback_after_a_compaction_trims_to_the_replacement_history(store_dir, tmp_path):
    r = Rollout()
    r.turn("fix the parser", initial=True)
    r.turn("add tests")
    line, history = r.compact("parser fixed, tests added", ["fix the parser", "add tests"])
    t3 = r.turn("deploy", initial=True)    # after /compact the next turn re-injects the full context
    r.rollback(1)
    doc = replay(store_dir, ingested(store_dir, tmp_path, r))
    # T3's prompt is cut; its developer and contextual user messages sit directly above it
    # (the first user turn is the replacement history's first message): trimmed too.
    assert doc["items"] == history and doc["item_lines"] == [line] * len(history)
    assert doc["compaction_line"] == line
    assert doc["rolled_back_turns"] == [t3["id"]]
    # The compaction cleared the reference context; T3's turn_context was rolled back.
    assert doc["turn_context"] is None and doc["turn_context_line"] is None


def test_rollback_past_a_compaction_skips_its_segment_as_codex_slices_it(store_dir, tmp_path):
    """While rollback turns are owed, every finalised segment is skipped, the compaction's too
    (`finalize_active_segment` returns before taking its base); the suffix was already cut
    after the compacted record, so the rebuilt history is that suffix, rolled back."""
    r = Rollout()
    t1 = r.turn("one", initial=True, model="m1")
    t2 = r.turn("two", model="m2")
    r.compact("s", ["one", "two"])
    t3 = r.turn("three", initial=True, model="m3")
    r.rollback(2)
    doc = replay(store_dir, ingested(store_dir, tmp_path, r))
    check_items(doc, r, t3["context"])
    assert doc["compaction_line"] is None
    assert doc["rolled_back_turns"] == [t2["id"], t3["id"]]
    assert doc["turn_context_line"] == t1["turn_context"] and doc["turn_context"]["model"] == "m1"


def test_rolled_back_turns_behind_the_base_compaction_are_not_listed_at_any_seq(store_dir, tmp_path):
    """The reverse scan stops once the base, previous turn settings and reference context are
    known; turns rolled back before the base compaction are behind it. `rolled_back_turns`
    lists the turns the scan dropped after the base, the same whether or not a later turn
    lets the scan stop at the base."""
    r = Rollout()
    r.turn("one", initial=True)
    r.turn("two")
    r.rollback(1)
    line, history = r.compact("one done", ["one"])
    t3 = r.turn("three", initial=True)
    thread = ingested(store_dir, tmp_path, r)
    at_compaction = replay(store_dir, thread, "--at", line)
    head = replay(store_dir, thread)
    assert at_compaction["items"] == history and at_compaction["rolled_back_turns"] == []
    assert head["rolled_back_turns"] == [] and head["item_lines"] == [line] * len(history) + context_and_items(t3)


# --- Codex: compactions ----------------------------------------------------------------------------

def test_the_newest_compaction_with_replacement_history_wins(store_dir, tmp_path):
    r = Rollout()
    r.turn("first", initial=True)
    first, _ = r.compact("one", ["first"])
    r.turn("second", initial=True)
    second, history = r.compact("two", ["first", "second"])
    t3 = r.turn("third", initial=True, model="m3")
    thread = ingested(store_dir, tmp_path, r)
    doc = replay(store_dir, thread)
    assert doc["compaction_line"] == second
    assert doc["items"][:len(history)] == history
    assert doc["item_lines"] == [second] * len(history) + context_and_items(t3)
    check_items({"items": doc["items"][len(history):], "item_lines": doc["item_lines"][len(history):]}, r,
                context_and_items(t3))
    assert doc["turn_context_line"] == t3["turn_context"]
    # At the first compaction's end the first one is the base, and the context is cleared.
    at_first = replay(store_dir, thread, "--at", first)
    assert at_first["compaction_line"] == first and at_first["item_lines"] == [first, first]
    assert at_first["turn_context"] is None


def test_mid_turn_auto_compaction_keeps_the_turn_context_persisted_after_it(store_dir, tmp_path):
    """InitialContextInjection::BeforeLastUserMessage: the replacement history carries the
    initial context above the last real user message and a turn_context follows the
    compaction; before that turn_context the compaction has cleared the reference."""
    r = Rollout()
    r.turn("one", initial=True, model="m1")
    tid = str(uuid.uuid4())
    r.event(type="task_started", turn_id=tid, model_context_window=272000, collaboration_mode_kind="default")
    r.item(text_message("user", r.environment()))
    r.record("turn_context", {"turn_id": tid, "cwd": r.cwd, "approval_policy": "on-request",
                              "sandbox_policy": {"type": "workspace-write"}, "model": "m2", "summary": "auto"})
    r.item(text_message("user", "two"))
    r.event(type="user_message", message="two", images=[], local_images=[], text_elements=[])
    r.item({"type": "function_call", "name": "shell_command", "arguments": "{\"command\":\"ls\"}", "call_id": "c1"})
    r.item({"type": "function_call_output", "call_id": "c1", "output": "a\nb"})
    initial = [r.payload(n) for n in range(2, 4)]     # T1's developer and contextual user messages
    history = [text_message("user", "one")] + initial + [text_message("user", "two"),
                                                         text_message("user", f"{SUMMARY_PREFIX}\nauto")]
    compacted = r.record("compacted", {"message": f"{SUMMARY_PREFIX}\nauto", "replacement_history": history})
    r.event(type="context_compacted")
    after = r.record("turn_context", {"turn_id": tid, "cwd": r.cwd, "approval_policy": "on-request",
                                      "sandbox_policy": {"type": "workspace-write"}, "model": "m2b",
                                      "summary": "auto"})
    answer = r.item(text_message("assistant", "two done"))
    r.event(type="task_complete", turn_id=tid, last_agent_message="two done")
    thread = ingested(store_dir, tmp_path, r)
    head = replay(store_dir, thread)
    assert head["items"] == history + [r.payload(answer)]
    assert head["item_lines"] == [compacted] * len(history) + [answer]
    assert head["compaction_line"] == compacted
    assert head["turn_context_line"] == after and head["turn_context"]["model"] == "m2b"
    at_compaction = replay(store_dir, thread, "--at", compacted)
    assert at_compaction["turn_context"] is None and at_compaction["interrupted_turn"] == tid


def test_turn_started_and_turn_complete_aliases_replay_the_same(store_dir, tmp_path):
    r = Rollout()
    r.turn("one", initial=True)
    r.turn("two")
    r.rollback(1)
    r.turn("three", end="crash")
    canonical = tmp_path / "canonical.jsonl"
    canonical.write_text("".join(r.lines))
    aliased = tmp_path / "aliased.jsonl"
    aliased.write_text("".join(r.lines).replace('"type":"task_started"', '"type":"turn_started"')
                       .replace('"type":"task_complete"', '"type":"turn_complete"'))
    for path, name in ((canonical, "canonical"), (aliased, "aliased")):
        assert cli(store_dir, "ingest", "codex", path, "--thread", name).returncode == 0
    assert replay(store_dir, "aliased") == replay(store_dir, "canonical")
    assert replay(store_dir, "aliased")["interrupted_turn"] is not None


def test_crlf_line_endings_are_whole_records(store_dir, tmp_path):
    r = Rollout()
    t1 = r.turn("one", initial=True)
    path = tmp_path / "crlf.jsonl"
    path.write_bytes("".join(r.lines).replace("\n", "\r\n").encode())
    assert cli(store_dir, "ingest", "codex", path, "--thread", "crlf").returncode == 0
    doc = replay(store_dir, "crlf")
    check_items(doc, r, context_and_items(t1))
    assert doc["skipped_lines"] == [] and doc["thread_id"] == r.id


def test_legacy_compaction_rebuilds_from_user_messages_and_clears_the_turn_context(store_dir, tmp_path):
    r = Rollout()
    r.turn("first ask", initial=True)
    r.turn("second ask")
    line, _ = r.compact("legacy summary", [], legacy=True)
    t3 = r.turn("third ask", model="m3")
    doc = replay(store_dir, ingested(store_dir, tmp_path, r))
    # build_compacted_history(collect_user_messages(history), message): the real user prompts
    # (contextual messages are not user messages), then the summary, all from the compacted line.
    rebuilt = [text_message("user", "first ask"), text_message("user", "second ask"),
               text_message("user", f"{SUMMARY_PREFIX}\nlegacy summary")]
    assert doc["items"][:3] == rebuilt and doc["item_lines"][:3] == [line] * 3
    check_items({"items": doc["items"][3:], "item_lines": doc["item_lines"][3:]}, r, context_and_items(t3))
    assert doc["compaction_line"] == line
    # A legacy compaction in the replayed suffix clears reference_context_item, even though
    # T3 (after it) has a turn_context.
    assert doc["turn_context"] is None and doc["turn_context_line"] is None


def test_legacy_compaction_after_a_replacement_history_drops_the_old_summary(store_dir, tmp_path):
    r = Rollout()
    r.turn("alpha", initial=True)
    base, _ = r.compact("s1", ["alpha"])
    r.turn("beta", initial=True)
    legacy, _ = r.compact("s2", [], legacy=True)
    doc = replay(store_dir, ingested(store_dir, tmp_path, r))
    # collect_user_messages skips summaries (is_summary_message: SUMMARY_PREFIX + "\n").
    assert doc["items"] == [text_message("user", "alpha"), text_message("user", "beta"),
                            text_message("user", f"{SUMMARY_PREFIX}\ns2")]
    assert doc["item_lines"] == [legacy] * 3 and doc["compaction_line"] == legacy and base < legacy


def test_records_codex_cannot_deserialize_change_nothing(store_dir, tmp_path):
    """`get_rollout_history` skips a line that does not parse as a RolloutLine: a `compacted`
    without its `message: String` or with a `replacement_history` that is not a list, a
    `turn_context` that is not an object, a rollback whose `num_turns` is not a u32. They are
    JSON objects (not damaged lines), and they neither replace, clear nor roll back."""
    r = Rollout()
    t1 = r.turn("one", initial=True, model="m1")
    r.record("compacted", {"replacement_history": [text_message("user", "LOST")]})
    r.record("compacted", {"message": "x", "replacement_history": "not a list"})
    r.rollback(2**32)
    r.event(type="thread_rolled_back", num_turns=-1)
    t2 = r.turn("two", model="m2")
    r.record("turn_context", "not an object")
    doc = replay(store_dir, ingested(store_dir, tmp_path, r))
    check_items(doc, r, context_and_items(t1, t2))
    assert doc["compaction_line"] is None and doc["rolled_back_turns"] == [] and doc["skipped_lines"] == []
    assert doc["turn_context_line"] == t2["turn_context"]


# --- Codex: unfinished and aborted turns, turn context ------------------------------------------------

def test_at_inside_an_unfinished_turn_keeps_it_and_flags_it(store_dir, tmp_path):
    r = Rollout()
    t1 = r.turn("one", initial=True, model="m1")
    t2 = r.turn("run the migration", model="m2",
                tool={"type": "function_call", "name": "shell_command",
                      "arguments": json.dumps({"command": "make migrate", "workdir": "/work/app"})})
    thread = ingested(store_dir, tmp_path, r)
    inside = replay(store_dir, thread, "--at", t2["call"])
    check_items(inside, r, context_and_items(t1) + t2["context"] + t2["items"][:3])
    assert inside["items"][-1]["type"] == "function_call"      # no synthetic "aborted" output is invented
    assert inside["interrupted_turn"] == t2["id"]
    assert inside["turn_context_line"] == t2["turn_context"]
    # Cut between T2's turn_context and its prompt: T2 is not a user turn yet, so the turn
    # context is T1's, while T2's environment diff is already history.
    before_prompt = replay(store_dir, thread, "--at", t2["turn_context"])
    check_items(before_prompt, r, context_and_items(t1) + t2["context"])
    assert before_prompt["turn_context_line"] == t1["turn_context"]
    assert before_prompt["interrupted_turn"] == t2["id"]
    # At T2's task_started only, the turn is open too.
    assert replay(store_dir, thread, "--at", t2["started"])["interrupted_turn"] == t2["id"]
    head = replay(store_dir, thread)
    assert head["interrupted_turn"] is None and head["item_lines"] == context_and_items(t1, t2)


def test_a_crashed_turn_at_the_head_is_flagged(store_dir, tmp_path):
    r = Rollout()
    r.turn("one", initial=True)
    t2 = r.turn("apply it", end="crash", tool={"type": "custom_tool_call", "status": "completed",
                                               "name": "apply_patch", "input": "*** Begin Patch\n*** End Patch\n"})
    doc = replay(store_dir, ingested(store_dir, tmp_path, r))
    assert doc["interrupted_turn"] == t2["id"] and doc["item_lines"][-1] == t2["call"]


def test_a_crashed_turn_that_was_rolled_back_is_not_flagged(store_dir, tmp_path):
    """After a crash the thread can be resumed and rolled back (the turn is no longer running):
    the unfinished turn's items are cut with it, so no unfinished turn is kept to flag."""
    r = Rollout()
    t1 = r.turn("one", initial=True)
    t2 = r.turn("two", end="crash", tool={"type": "function_call", "name": "shell_command",
                                           "arguments": json.dumps({"command": "sleep 100"})})
    r.rollback(1)
    doc = replay(store_dir, ingested(store_dir, tmp_path, r))
    check_items(doc, r, context_and_items(t1))
    assert doc["rolled_back_turns"] == [t2["id"]]
    assert doc["interrupted_turn"] is None


def test_an_abort_without_a_turn_id_finishes_the_running_turn(store_dir, tmp_path):
    """`TurnAbortedEvent.turn_id` is optional (`if let Some(turn_id) = &event.turn_id` in
    rollout_reconstruction.rs): older builds wrote the abort without it."""
    r = Rollout()
    r.turn("one", initial=True)
    t2 = r.turn("two", end="crash")
    r.event(type="turn_aborted", reason="interrupted")
    doc = replay(store_dir, ingested(store_dir, tmp_path, r))
    assert doc["interrupted_turn"] is None
    assert doc["turn_context_line"] == t2["turn_context"]


def test_contextual_markers_match_ascii_case_insensitively_only(store_dir, tmp_path):
    """`matches_text` compares markers with `eq_ignore_ascii_case`: a prompt that starts with
    "<s\u212aill>" (KELVIN SIGN, which Unicode lower-cases to "k") is a real user prompt, a
    turn boundary that a rollback of one turn cuts."""
    r = Rollout()
    t1 = r.turn("one", initial=True)
    t2 = r.turn("<s\u212aill>use the kelvin sign</skill>")
    r.rollback(1)
    doc = replay(store_dir, ingested(store_dir, tmp_path, r))
    check_items(doc, r, context_and_items(t1))
    assert doc["rolled_back_turns"] == [t2["id"]]


def test_turn_aborted_finishes_the_turn_and_a_rollback_drops_it_whole(store_dir, tmp_path):
    r = Rollout()
    t1 = r.turn("one", initial=True, model="m1")
    t2 = r.turn("two", model="m2", end="aborted")
    thread = ingested(store_dir, tmp_path, r)
    doc = replay(store_dir, thread, "--at", len(r.lines))
    check_items(doc, r, context_and_items(t1, t2))
    assert doc["interrupted_turn"] is None
    assert doc["turn_context_line"] == t2["turn_context"]
    r.rollback(1)
    thread = ingested(store_dir, tmp_path, r)
    after = replay(store_dir, thread)
    check_items(after, r, context_and_items(t1))
    assert after["rolled_back_turns"] == [t2["id"]] and after["turn_context_line"] == t1["turn_context"]


def test_the_latest_effective_turn_context(store_dir, tmp_path):
    r = Rollout()
    r.turn("one", initial=True, model="m1", approval="on-request")
    t2 = r.turn("two", model="m2", approval="never")
    # A turn without a user message (e.g. a review or auto turn) does not set it ...
    tid = str(uuid.uuid4())
    r.event(type="task_started", turn_id=tid, model_context_window=272000, collaboration_mode_kind="default")
    r.record("turn_context", {"turn_id": tid, "cwd": r.cwd, "approval_policy": "never",
                              "sandbox_policy": {"type": "read-only"}, "model": "m-review", "summary": "auto"})
    r.item(text_message("assistant", "automatic note"))
    r.event(type="task_complete", turn_id=tid, last_agent_message="automatic note")
    # ... nor a turn_context whose turn id does not match its segment's (turn_ids_are_compatible).
    r.turn("four", model="m4", turn_context_id="some-other-turn")
    doc = replay(store_dir, ingested(store_dir, tmp_path, r))
    assert doc["turn_context_line"] == t2["turn_context"]
    assert doc["turn_context"] == r.payload(t2["turn_context"])
    assert (doc["turn_context"]["model"], doc["turn_context"]["approval_policy"]) == ("m2", "never")


# --- Codex: damaged lines, forks, checkpoints ----------------------------------------------------------

def test_damaged_lines_are_skipped_and_reported_by_file_line(store_dir, tmp_path):
    r = Rollout()
    t1 = r.turn("one", initial=True)
    bad_early = r.raw("{\"timestamp\": \"x\", \"type\": \"response_item\", \"payl\n")
    blank = r.raw("\n")
    r.compact("s", ["one"])
    t2 = r.turn("two")
    bad_array = r.raw("[1, 2, 3]\n")
    t3 = r.turn("three")
    path = r.write(tmp_path)
    with open(path, "ab") as handle:     # a line that is not UTF-8
        handle.write(b"\xff\xfe\x00\x01garbage\n")
    bad_bytes = len(r.lines) + 1
    report = ingest(store_dir, "codex", path)
    assert report["files"][0]["skipped_lines"] == [bad_early, blank, bad_array, bad_bytes]
    thread = f"codex/{r.id}"
    head = replay(store_dir, thread)
    # The reverse scan stops at the compaction; the damaged lines before it still count.
    assert head["skipped_lines"] == [bad_early, blank, bad_array, bad_bytes]
    assert head["at"] == bad_bytes
    assert head["item_lines"][-len(context_and_items(t2, t3)):] == context_and_items(t2, t3)
    assert replay(store_dir, thread, "--at", bad_array - 1)["skipped_lines"] == [bad_early, blank]
    assert replay(store_dir, thread, "--at", blank)["skipped_lines"] == [bad_early, blank]
    assert replay(store_dir, thread, "--at", bad_early - 1)["skipped_lines"] == []
    check_items(replay(store_dir, thread, "--at", blank), r, context_and_items(t1))


def test_damaged_lines_across_incremental_ingests_and_checkpoints(store_dir, tmp_path):
    r = Rollout()
    r.turn("one", initial=True)
    first_bad = r.raw("{oops\n")
    r.turn("two")
    path = r.write(tmp_path)
    ingest(store_dir, "codex", path)
    thread = f"codex/{r.id}"
    assert replay(store_dir, thread)["skipped_lines"] == [first_bad]
    r.compact("s", ["one", "two"])
    second_bad = r.raw("\x00\n")
    t3 = r.turn("three", initial=True)
    r.write(tmp_path)                    # the harness appended: the same file, grown
    ingest(store_dir, "codex", path)
    head = replay(store_dir, thread)
    assert head["skipped_lines"] == [first_bad, second_bad]
    assert head["item_lines"][-len(context_and_items(t3)):] == context_and_items(t3)
    for cp in checkpoints(store_dir, thread):
        seq = cp["history"]["seq"]
        expected = [n for n in (first_bad, second_bad) if n <= seq]
        assert replay(store_dir, cp["checkpoint"])["skipped_lines"] == expected
        assert replay(store_dir, thread, "--at", seq)["skipped_lines"] == expected


def test_a_fork_replays_on_its_own_with_its_own_id_and_line_numbers(store_dir, tmp_path):
    parent = Rollout()
    p1 = parent.turn("design the schema", initial=True, model="m1")
    parent.turn("write the migration", model="m2")
    # fork_thread(nth_user_message=1): the items strictly before the 2nd user message.
    cut = parent.lines.index(next(line for line in parent.lines if '"text":"write the migration"' in line))
    child = Rollout(forked_from=parent.id)
    offset = len(child.lines)
    for line in parent.lines[:cut]:         # the parent's session_meta line is copied too
        child.raw(line)
    c1 = child.turn("write it in SQL instead", model="m3")
    ingest(store_dir, "codex", parent.write(tmp_path))
    ingest(store_dir, "codex", child.write(tmp_path / "child"))
    doc = replay(store_dir, f"codex/{child.id}")
    assert doc["thread_id"] == child.id
    copied_t2_context = [offset + n for n in range(p1["end"] + 1, cut + 1)
                         if json.loads(parent.lines[n - 1])["type"] == "response_item"]
    expected = [offset + n for n in context_and_items(p1)] + copied_t2_context + context_and_items(c1)
    check_items(doc, child, expected)
    assert doc["turn_context_line"] == c1["turn_context"] and doc["turn_context"]["model"] == "m3"
    assert doc["interrupted_turn"] is None     # the copied open turn is not the newest
    # The parent is unchanged by its fork.
    assert replay(store_dir, f"codex/{parent.id}")["thread_id"] == parent.id
    # Under another thread name the replay is the same: thread_id is Codex's own id.
    copy = tmp_path / "copy.jsonl"
    copy.write_text("".join(child.lines))
    assert cli(store_dir, "ingest", "codex", copy, "--thread", "forks/sql").returncode == 0
    assert replay(store_dir, "forks/sql") == doc


def checkpoints(store_dir, thread) -> list[dict]:
    result = cli(store_dir, "--json", "log", thread)
    assert result.returncode == 0, result.stderr
    return sorted(json.loads(result.stdout)["checkpoints"], key=lambda cp: cp["history"]["seq"])


def test_replay_of_a_checkpoint_id_is_the_replay_at_its_position(store_dir, tmp_path):
    r = Rollout()
    r.turn("one", initial=True)
    r.turn("two")
    r.rollback(1)
    r.turn("three")
    thread = ingested(store_dir, tmp_path, r)
    cps = checkpoints(store_dir, thread)
    assert len(cps) >= 3
    for cp in cps:
        seq = cp["history"]["seq"]
        assert replay(store_dir, cp["checkpoint"]) == replay(store_dir, thread, "--at", seq)
        assert replay(store_dir, cp["checkpoint"], "--at", seq - 1) == replay(store_dir, thread, "--at", seq - 1)
    # Other REV forms name the same checkpoints: THREAD~N (N-th parent), a unique hex prefix.
    assert replay(store_dir, f"{thread}~1") == replay(store_dir, cps[-2]["checkpoint"])
    assert replay(store_dir, cps[0]["checkpoint"][:16]) == replay(store_dir, cps[0]["checkpoint"])
    first = cps[0]
    beyond = cli(store_dir, "--json", "replay", first["checkpoint"], "--at", first["history"]["seq"] + 1)
    assert json_failure(beyond, 2), beyond
    assert "beyond the end" in one_error_line(beyond)


# --- replay's arguments -------------------------------------------------------------------------------

def test_at_zero_and_at_beyond_the_end(store_dir, tmp_path):
    r = Rollout()
    r.turn("one", initial=True)
    thread = ingested(store_dir, tmp_path, r)
    empty = replay(store_dir, thread, "--at", 0)
    assert empty == {"format": "codex", "thread_id": None, "at": 0, "items": [], "item_lines": [],
                     "turn_context": None, "turn_context_line": None, "compaction_line": None,
                     "rolled_back_turns": [], "interrupted_turn": None, "skipped_lines": []}
    assert replay(store_dir, thread, "--at", 1)["thread_id"] == r.id
    assert replay(store_dir, thread, "--at", len(r.lines)) == replay(store_dir, thread)
    for args in (("--at", len(r.lines) + 1), ("--at", 10**12)):
        result = cli(store_dir, "--json", "replay", thread, *args)
        assert json_failure(result, 2), result
        line = one_error_line(result)
        assert "beyond the end" in line and str(len(r.lines)) in line
    negative = cli(store_dir, "replay", thread, "--at", "-1")
    assert negative.returncode == 2 and negative.stdout == ""
    one_error_line(negative)
    missing = cli(store_dir, "replay", "codex/no-such-thread")
    assert missing.returncode == 1 and missing.stdout == ""
    one_error_line(missing)


def test_format_that_contradicts_the_thread_is_refused(store_dir, tmp_path):
    """`--format` names the format of a history that is neither; one the thread is
    positively not would print a replay the harness never builds (a Claude chain of a Codex
    rollout is empty, a Codex replay of a transcript has no items): a usage error instead (exit
    2, DESIGN.md CLI contract), as for an `--at` the history does not have."""
    r = Rollout()
    r.turn("one", initial=True)
    codex_thread = ingested(store_dir, tmp_path, r)
    t = Transcript()
    t.prompt("hello")
    t.answer("hi")
    ingest(store_dir, "claude", t.write(tmp_path))
    claude_thread = f"claude/{t.session}"
    for thread, wrong, right in ((codex_thread, "claude", "codex"), (claude_thread, "codex", "claude")):
        assert replay(store_dir, thread, "--format", right) == replay(store_dir, thread)
        result = cli(store_dir, "--json", "replay", thread, "--format", wrong)
        assert json_failure(result, 2), result
        line = one_error_line(result)
        assert f"--format {right}" in line


def test_a_history_of_neither_format_names_format(store_dir, tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text('{"hello": 1}\n{"world": 2}\n')
    assert cli(store_dir, "rollout", "append", "plain", path).returncode == 0
    result = cli(store_dir, "--json", "replay", "plain")
    assert json_failure(result, 1), result
    assert "--format" in one_error_line(result)
    forced = replay(store_dir, "plain", "--format", "codex")
    assert forced["items"] == [] and forced["at"] == 2


def test_replay_never_executes_anything_from_the_log(store_dir, tmp_path):
    marker = tmp_path / "executed"
    r = Rollout()
    r.turn("clean up", initial=True,
           tool={"type": "function_call", "name": "shell_command",
                 "arguments": json.dumps({"command": f"touch {marker}-shell", "workdir": str(tmp_path)})})
    r.turn("patch it", tool={"type": "custom_tool_call", "status": "completed", "name": "apply_patch",
                             "input": f"*** Begin Patch\n*** Add File: {marker}-patch\n+x\n*** End Patch\n"})
    r.turn("again", end="crash", tool={"type": "local_shell_call", "status": "completed",
                                       "action": {"type": "exec", "command": ["touch", f"{marker}-local"]}})
    codex_thread = ingested(store_dir, tmp_path, r)
    t = Transcript()
    t.prompt("clean up")
    t.assistant([{"type": "tool_use", "id": "toolu_x", "name": "Bash",
                  "input": {"command": f"touch {marker}-claude"}}])
    ingest(store_dir, "claude", t.write(tmp_path))
    for thread in (codex_thread, f"claude/{t.session}"):
        for args in ((), ("--json",)):
            result = cli(store_dir, "replay", thread, *args)
            assert result.returncode == 0, result.stderr
    assert not list(tmp_path.glob("executed*"))
    shown = replay(store_dir, codex_thread)["items"]                             # shown, not run
    assert any(f"{marker}-shell" in item.get("arguments", "") for item in shown)


# --- Claude Code transcripts, written from docs/HARNESSES.md (Claude Code format) -------------------

class Transcript:
    """A Claude Code session file: one record per line, chained by parentUuid."""

    def __init__(self, session=None, agent_id=None, version="2.0.14"):
        self.session = session or str(uuid.uuid4())
        self.agent_id = agent_id
        self.version = version
        self.lines: list[str] = []
        self.last: str | None = None      # the uuid the next chained record hangs from
        self.clock = 0

    def add(self, record: dict) -> dict:
        self.lines.append(line_json(record))
        return record

    def node(self, kind, parent="LAST", sidechain=False, **fields) -> str:
        self.clock += 1
        uid = str(uuid.uuid4())
        record = {"parentUuid": self.last if parent == "LAST" else parent, "isSidechain": sidechain,
                  "userType": "external", "cwd": "/work/app", "sessionId": self.session, "version": self.version,
                  "gitBranch": "main", "type": kind, "uuid": uid,
                  "timestamp": f"2025-11-02T10:00:{self.clock % 60:02d}.{self.clock:03d}Z"}
        if self.agent_id:
            record["agentId"] = self.agent_id
        record.update(fields)
        self.add(record)
        if not sidechain or self.agent_id:
            self.last = uid
        return uid

    def prompt(self, text, parent="LAST", sidechain=False, **fields) -> str:
        return self.node("user", parent, sidechain, message={"role": "user", "content": text}, **fields)

    def meta(self, text, parent="LAST") -> str:
        return self.node("user", parent, isMeta=True, message={"role": "user", "content": text})

    def assistant(self, blocks, parent="LAST", sidechain=False, message_id=None) -> list[str]:
        """One API message written as one record per content block, sharing message.id."""
        message_id = message_id or f"msg_{uuid.uuid4().hex[:20]}"
        out = []
        for block in blocks:     # each block's record hangs from the previous one
            out.append(self.node("assistant", out[-1] if out else parent, sidechain, requestId="req_1", message={
                "model": "claude-sonnet-4-5", "id": message_id, "type": "message", "role": "assistant",
                "content": [block], "stop_reason": None, "stop_sequence": None,
                "usage": {"input_tokens": 10, "output_tokens": 5}}))
        return out

    def answer(self, text, parent="LAST") -> str:
        return self.assistant([{"type": "text", "text": text}], parent)[0]

    def tool_result(self, tool_use_id, content, parent="LAST", sidechain=False) -> str:
        return self.node("user", parent, sidechain, toolUseResult={"stdout": content},
                         message={"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool_use_id,
                                                               "content": content}]})

    def compact(self, summary) -> tuple[str, str]:
        logical = self.last
        boundary = self.node("system", None, subtype="compact_boundary", content="Conversation compacted",
                             level="info", isMeta=False, logicalParentUuid=logical,
                             compactMetadata={"trigger": "manual", "preTokens": 12345})
        text = ("This session is being continued from a previous conversation that ran out of context. "
                f"The conversation is summarized below:\n{summary}")
        summary_uuid = self.node("user", isCompactSummary=True, isVisibleInTranscriptOnly=True,
                                 message={"role": "user", "content": text})
        return boundary, summary_uuid

    def write(self, root: Path, name=None) -> Path:
        path = root / "projects" / "-work-app" / (name or f"{self.session}.jsonl")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(self.lines), encoding="utf-8")
        return path

    def seq_of(self, uid) -> int:
        return next(n for n, line in enumerate(self.lines, 1) if f'"uuid":"{uid}"' in line)


def claude_thread(store_dir, tmp_path, t: Transcript) -> str:
    ingest(store_dir, "claude", t.write(tmp_path))
    return f"claude/{t.session}"


# --- Claude: leaf, branches, abandoned -----------------------------------------------------------------

def test_newest_eligible_leaf_wins_and_the_other_branches_are_abandoned(store_dir, tmp_path):
    t = Transcript()
    t.add({"type": "file-history-snapshot", "messageId": "m0", "isSnapshotUpdate": False,
           "snapshot": {"messageId": "m0", "trackedFileBackups": {}, "timestamp": "2025-11-02T10:00:00.000Z"}})
    p1 = t.prompt("list the files")
    a1 = t.answer("a, b and c")
    old = t.prompt("delete a")
    old_answer = t.answer("deleted a")
    hook = t.node("system", subtype="stop_hook_summary", content="hook ran", level="info")  # a terminal, not a leaf
    retry = t.prompt("delete b instead", parent=a1)          # an edited prompt: same parent, later in the file
    retry_answer = t.answer("deleted b")
    meta_tail = t.meta("<local-command-caveat>Caveat: local commands</local-command-caveat>", parent=old_answer)
    t.add({"type": "summary", "summary": "File cleanup", "leafUuid": retry_answer})
    thread = claude_thread(store_dir, tmp_path, t)
    doc = replay(store_dir, thread)
    # The meta record is newer but not eligible (isMeta); the system terminal walks back to
    # old_answer, older than retry_answer.
    assert doc["leaf"] == retry_answer
    assert doc["chain"] == [p1, a1, retry, retry_answer] == doc["visible"]
    assert doc["abandoned"] == [old, old_answer, hook, meta_tail]
    assert doc["session_id"] == t.session and doc["at"] == len(t.lines) and doc["compaction"] is None
    assert doc["messages"] == [{"role": "user", "content": "list the files"},
                               {"role": "assistant", "content": [{"type": "text", "text": "a, b and c"}]},
                               {"role": "user", "content": "delete b instead"},
                               {"role": "assistant", "content": [{"type": "text", "text": "deleted b"}]}]
    # --at before the retry: the old branch is the chain, nothing is abandoned yet.
    before = replay(store_dir, thread, "--at", t.seq_of(hook))
    assert before["leaf"] == old_answer and before["chain"] == [p1, a1, old, old_answer]
    # The hook record after the leaf is on the chosen branch, not on a branch not chosen.
    assert before["abandoned"] == []


def test_system_and_progress_records_beside_the_chain_are_not_abandoned(store_dir, tmp_path):
    """A hook's progress beside a tool result, a turn's duration after the leaf: terminals the
    SDK walks back from (to a user/assistant record), on no branch not chosen."""
    t = Transcript(version="2.1.9")
    p = t.prompt("run the linter")
    use = t.assistant([{"type": "tool_use", "id": "toolu_l", "name": "Bash", "input": {"command": "ruff ."}}])[0]
    progress = t.node("progress", parent=use, data={"type": "hook_progress", "hookEvent": "PreToolUse"},
                      toolUseID="toolu_l", parentToolUseID="toolu_l")
    result = t.tool_result("toolu_l", "All checks passed!", parent=use)
    answer = t.answer("Clean.")
    duration = t.node("system", subtype="turn_duration", durationMs=1234, isMeta=False)
    thread = claude_thread(store_dir, tmp_path, t)
    doc = replay(store_dir, thread)
    assert doc["leaf"] == answer and doc["chain"] == [p, use, result, answer] == doc["visible"]
    assert doc["abandoned"] == [] and progress not in doc["chain"] and duration not in doc["chain"]
    # An edited first prompt (same parent: none) abandons the old conversation and every
    # record hanging from it, the progress and duration records too.
    retry = t.prompt("run the linter with --fix", parent=None)
    ingest(store_dir, "claude", t.write(tmp_path))
    after = replay(store_dir, thread)
    assert after["chain"] == [retry] and after["abandoned"] == [p, use, progress, result, answer, duration]


def test_only_ineligible_leaves_fall_back_to_the_newest_of_all(store_dir, tmp_path):
    t = Transcript()
    p = t.prompt("hello")
    meta = t.meta("<local-command-caveat>Caveat</local-command-caveat>")
    doc = replay(store_dir, claude_thread(store_dir, tmp_path, t))
    assert doc["leaf"] == meta and doc["chain"] == [p, meta] and doc["visible"] == [p]
    # isMeta text is sent to the model: in messages (merged into one user message).
    assert doc["messages"] == [{"role": "user", "content": [
        {"type": "text", "text": "hello"}, {"type": "text", "text": "<local-command-caveat>Caveat</local-command-caveat>"}]}]


def test_at_cutting_a_chain_inside_one_assistant_message(store_dir, tmp_path):
    t = Transcript()
    p = t.prompt("fix the bug")
    think, text, use = t.assistant([{"type": "thinking", "thinking": "hmm", "signature": "sig"},
                                    {"type": "text", "text": "Looking."},
                                    {"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"path": "a.py"}}])
    result = t.tool_result("toolu_1", "print(1)")
    thread = claude_thread(store_dir, tmp_path, t)
    for seq, leaf, chain in ((t.seq_of(p), p, [p]), (t.seq_of(think), think, [p, think]),
                             (t.seq_of(text), text, [p, think, text]),
                             (t.seq_of(result), result, [p, think, text, use, result])):
        doc = replay(store_dir, thread, "--at", seq)
        assert (doc["at"], doc["leaf"], doc["chain"], doc["visible"]) == (seq, leaf, chain, chain)
    mid = replay(store_dir, thread, "--at", t.seq_of(text))
    assert mid["messages"] == [{"role": "user", "content": "fix the bug"},
                               {"role": "assistant", "content": [{"type": "thinking", "thinking": "hmm",
                                                                  "signature": "sig"},
                                                                 {"type": "text", "text": "Looking."}]}]
    assert replay(store_dir, thread, "--at", 0)["chain"] == []


def test_messages_merge_one_message_id_across_dropped_records_and_parallel_tool_results(store_dir, tmp_path):
    t = Transcript()
    t.prompt("check both")
    message_id = "msg_parallel"
    first = t.assistant([{"type": "text", "text": "Checking."}], message_id=message_id)
    t.node("system", subtype="informational", content="hook", level="info")      # dropped from messages
    uses = t.assistant([{"type": "tool_use", "id": "toolu_a", "name": "Bash", "input": {"command": "ls"}},
                        {"type": "tool_use", "id": "toolu_b", "name": "Bash", "input": {"command": "pwd"}}],
                       message_id=message_id)
    t.tool_result("toolu_a", "x")
    t.tool_result("toolu_b", "/work/app")
    t.answer("both fine")
    doc = replay(store_dir, claude_thread(store_dir, tmp_path, t))
    assert len(doc["chain"]) == 8 and len(doc["visible"]) == 7 and first[0] in doc["visible"] and uses[1] in doc["chain"]
    assert [m["role"] for m in doc["messages"]] == ["user", "assistant", "user", "assistant"]
    assert [b.get("id", b["type"]) for b in doc["messages"][1]["content"]] == ["text", "toolu_a", "toolu_b"]
    assert [b["tool_use_id"] for b in doc["messages"][2]["content"]] == ["toolu_a", "toolu_b"]


# --- Claude: sidechains, compaction, meta, subagents ----------------------------------------------------

def test_inline_sidechains_stay_out_of_the_chain_and_are_listed(store_dir, tmp_path):
    t = Transcript()
    p = t.prompt("research the API")
    use = t.assistant([{"type": "tool_use", "id": "toolu_t", "name": "Task",
                        "input": {"prompt": "read the docs", "subagent_type": "general-purpose"}}])[0]
    s_root = t.prompt("read the docs", parent=None, sidechain=True)
    s_answer = t.assistant([{"type": "text", "text": "docs say X"}], parent=s_root, sidechain=True)[0]
    s2_root = t.prompt("read the code", parent=None, sidechain=True)
    s2_use = t.assistant([{"type": "tool_use", "id": "toolu_g", "name": "Grep", "input": {"pattern": "api"}}],
                         parent=s2_root, sidechain=True)[0]
    s2_result = t.tool_result("toolu_g", "3 hits", parent=s2_use, sidechain=True)
    s2_answer = t.assistant([{"type": "text", "text": "code says Y"}], parent=s2_result, sidechain=True)[0]
    s2_tail = t.node("attachment", parent=s2_answer, sidechain=True, attachment={"type": "todo", "content": []})
    result = t.tool_result("toolu_t", "X and Y", parent=use)
    done = t.answer("The API does X and Y.")
    doc = replay(store_dir, claude_thread(store_dir, tmp_path, t))
    assert doc["chain"] == [p, use, result, done] == doc["visible"] and doc["leaf"] == done
    assert doc["abandoned"] == []
    # Each sidechain's leaf is chosen as the session's is: a terminal walked back to its
    # nearest user/assistant record (s2 ends in an attachment record).
    assert doc["sidechains"] == [{"root": s_root, "leaf": s_answer, "uuids": [s_root, s_answer]},
                                 {"root": s2_root, "leaf": s2_answer,
                                  "uuids": [s2_root, s2_use, s2_result, s2_answer]}]
    assert s2_tail not in doc["chain"] + doc["abandoned"]


def test_compact_boundary_starts_the_chain_logical_parent_is_not_followed(store_dir, tmp_path):
    t = Transcript()
    p1 = t.prompt("long refactor")
    a1 = t.answer("refactored a lot")
    boundary, summary = t.compact("we refactored")
    caveat = t.meta("<local-command-caveat>Caveat: the messages below were generated by the user while "
                    "running local commands.</local-command-caveat>")
    command = t.prompt("<command-name>/compact</command-name>\n<command-message>compact</command-message>")
    stdout = t.prompt("<local-command-stdout>Compacted</local-command-stdout>")
    p2 = t.prompt("carry on")
    a2 = t.answer("carrying on")
    thread = claude_thread(store_dir, tmp_path, t)
    doc = replay(store_dir, thread)
    assert doc["chain"] == [boundary, summary, caveat, command, stdout, p2, a2]
    assert doc["visible"] == [summary, command, stdout, p2, a2]      # isCompactSummary kept, isMeta not
    assert doc["compaction"] == {"boundary": boundary, "logical_parent": a1}
    assert p1 not in doc["chain"] and a1 not in doc["chain"] and doc["abandoned"] == []
    assert [m["role"] for m in doc["messages"]] == ["user", "assistant"]
    assert len(doc["messages"][0]["content"]) == 5     # summary, caveat, command, stdout, prompt merged
    # --at just before the boundary: the old chain, no compaction.
    before = replay(store_dir, thread, "--at", t.seq_of(boundary) - 1)
    assert before["chain"] == [p1, a1] and before["compaction"] is None
    # --at the boundary alone: a system record is no leaf; the old chain is still chosen.
    at_boundary = replay(store_dir, thread, "--at", t.seq_of(boundary))
    assert at_boundary["leaf"] == a1 and at_boundary["chain"] == [p1, a1]


def test_a_subagent_file_in_the_project_dir_replays_its_own_conversation(store_dir, tmp_path):
    """v2.0.28+ layout: `<project>/agent-<id>.jsonl`, every record `isSidechain` with `agentId`
    and the parent's `sessionId`; the SDK's subagent chain: the last user/assistant record back."""
    parent = Transcript(version="2.0.30")
    parent.prompt("investigate the flaky test")
    parent.assistant([{"type": "tool_use", "id": "toolu_s", "name": "Task", "input": {"prompt": "rerun it"}}])
    parent.write(tmp_path)
    sub = Transcript(session=parent.session, agent_id="9f3c2a1b", version="2.0.30")
    s1 = sub.prompt("rerun it", parent=None, sidechain=True)
    s2 = sub.assistant([{"type": "tool_use", "id": "toolu_r", "name": "Bash", "input": {"command": "pytest -x"}}],
                       sidechain=True)[0]
    s3 = sub.tool_result("toolu_r", "1 failed", sidechain=True)
    s4 = sub.assistant([{"type": "text", "text": "it fails on a timeout"}], sidechain=True)[0]
    sub.write(tmp_path, "agent-9f3c2a1b.jsonl")
    ingest(store_dir, "claude", tmp_path / "projects")
    doc = replay(store_dir, f"claude/{parent.session}/agents/9f3c2a1b")
    assert doc["session_id"] == parent.session
    assert doc["chain"] == [s1, s2, s3, s4] == doc["visible"] and doc["leaf"] == s4
    assert doc["sidechains"] == [] and doc["abandoned"] == []
    assert [m["role"] for m in doc["messages"]] == ["user", "assistant", "user", "assistant"]
    cut = replay(store_dir, f"claude/{parent.session}/agents/9f3c2a1b", "--at", 2)
    assert cut["chain"] == [s1, s2] and cut["leaf"] == s2
