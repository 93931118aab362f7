"""Harness sessions and effects through the real CLI, on sessions built from the spec.

The sessions come from tests/support/spec_sessions.py (written from docs/HARNESSES.md, not
from tests/support/harness_samples.py); every check runs `agentcas` in a subprocess, the way the
user would.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time

from support.cli import AGENTCAS
from support.spec_sessions import Claude, Codex


def cli(store_dir, *args):
    return subprocess.run([AGENTCAS, "--store", str(store_dir), *map(str, args)], capture_output=True, text=True,
                          timeout=120)


def replay_json(store_dir, *args):
    result = cli(store_dir, "--json", "replay", *args)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def codex_file(root, session: Codex):
    return session.write(root / "sessions" / "2025" / "10" / "01" / f"rollout-2025-10-01T10-00-00-{session.id}.jsonl")


def one_error_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("agentcas: error: "), stderr
    return lines[0]


# --- --json after the command -------------------------------------

def test_json_flag_after_the_command_is_accepted(store_dir, tmp_path):
    """`agentcas replay REV [--at SEQ] [--format F] [--json]`, `agentcas effects REV ... [--json]`."""
    c = Codex()
    c.turn("fix the parser", first=True)
    path = codex_file(tmp_path, c)
    assert cli(store_dir, "ingest", "codex", path).returncode == 0
    thread = f"codex/{c.id}"
    after = cli(store_dir, "replay", thread, "--at", 5, "--json")
    assert after.returncode == 0, after.stderr
    assert json.loads(after.stdout) == replay_json(store_dir, thread, "--at", 5)

    add = cli(store_dir, "effect", "add", thread, "--kind", "http.request", "--target", "https://api/x",
              "--state", "pending", "--rollback", "compensatable", "--json")
    assert add.returncode == 0, add.stderr
    effect_id = json.loads(add.stdout)["id"]
    listed = cli(store_dir, "effects", thread, "--state", "pending,unknown", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [e["id"] for e in json.loads(listed.stdout)["effects"]] == [effect_id]


# --- Codex replay by the harness's resume rules ----------------------------------------------

def test_codex_rollback_compaction_crash_and_damage_as_codex_resumes(store_dir, tmp_path):
    c = Codex()
    t1 = c.turn("fix the parser bug", first=True)
    t2 = c.turn("now add tests")
    t3 = c.turn("deploy to production")
    c.rollback(1)
    after_rollback = len(c.lines)
    line, history, _ = c.manual_compact("parser fixed, tests added", ["fix the parser bug", "now add tests"])
    t4 = c.turn("continue", first=True)          # a manual /compact re-injects the full context
    c.lines.append("{damaged\n")
    damaged = len(c.lines)
    t5 = c.turn("aborted one", end="aborted")
    t6 = c.turn("run the migration", end="crash")
    path = codex_file(tmp_path, c)
    result = cli(store_dir, "--json", "ingest", "codex", tmp_path / "sessions")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["files"][0]["skipped_lines"] == [damaged]
    thread = f"codex/{c.id}"
    assert subprocess.run([AGENTCAS, "--store", str(store_dir), "rollout", "cat", thread],
                          capture_output=True).stdout == path.read_bytes()

    at_rollback = replay_json(store_dir, thread, "--at", after_rollback)
    assert at_rollback["item_lines"] == t1["context"] + t1["items"] + t2["context"] + t2["items"]
    assert at_rollback["rolled_back_turns"] == [t3["turn_id"]]
    assert at_rollback["turn_context_line"] == t2["turn_context"]

    head = replay_json(store_dir, thread)
    expected = [line] * len(history) + t4["context"] + t4["items"] + t5["context"] + t5["items"] \
        + t6["context"] + t6["items"]
    assert head["item_lines"] == expected
    assert head["items"][:len(history)] == history
    assert all(item == json.loads(c.lines[n - 1])["payload"]
               for item, n in zip(head["items"][len(history):], head["item_lines"][len(history):]))
    assert head["compaction_line"] == line
    assert head["interrupted_turn"] == t6["turn_id"]
    assert head["turn_context_line"] == t6["turn_context"]
    assert head["skipped_lines"] == [damaged]
    assert head["thread_id"] == c.id and head["at"] == len(c.lines)
    # One checkpoint per finished turn (its boundary record included) and one at the end.
    log = cli(store_dir, "--json", "log", thread)
    seqs = sorted(cp["history"]["seq"] for cp in json.loads(log.stdout)["checkpoints"])
    assert seqs == [t1["end"], t2["end"], t3["end"], line + 2, t4["end"], t5["end"], len(c.lines)]


def test_codex_replay_at_every_seq_equals_the_cut_file(store_dir, tmp_path):
    c = Codex()
    c.turn("one", first=True)
    c.turn("two")
    c.rollback(2)
    c.manual_compact("s", ["one"])
    c.lines.append("[1, 2]\n")
    c.turn("three", first=True)
    c.turn("four", end="crash")
    codex_file(tmp_path, c)
    assert cli(store_dir, "ingest", "codex", tmp_path / "sessions").returncode == 0
    for seq in range(1, len(c.lines) + 1, 3):
        cut = tmp_path / f"cut-{seq}.jsonl"
        cut.write_text("".join(c.lines[:seq]))
        assert cli(store_dir, "ingest", "codex", cut, "--thread", f"cut-{seq}").returncode == 0
        assert replay_json(store_dir, f"codex/{c.id}", "--at", seq) == replay_json(store_dir, f"cut-{seq}")


# --- Claude Code replay ----------------------------------------------------------------------

def claude_session_with_everything():
    c = Claude()
    c.snapshot("m0")
    p1 = c.user("list files", parent=None)
    a1 = c.assistant([{"type": "thinking", "thinking": "hm", "signature": "sig"}, {"type": "text", "text": "Looking."},
                      {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls"}}],
                     stop="tool_use")
    c.tool_result("toolu_1", "a\nb")
    a2 = c.assistant([{"type": "text", "text": "a and b"}])
    fork_point = c.last
    old = c.user("delete tmp")
    old_answer = c.assistant([{"type": "text", "text": "deleted"}])
    c.user("delete only tmp/*.log", parent=fork_point)     # the edited prompt: same parent, later
    c.assistant([{"type": "tool_use", "id": "toolu_2", "name": "Task", "input": {"prompt": "find logs"}}],
                stop="tool_use")
    main_last = c.last
    side_root = c.user("find logs", parent=None, sidechain=True)
    side_answer = c.assistant([{"type": "text", "text": "found 3"}], sidechain=True)
    c.last = main_last
    c.tool_result("toolu_2", "found 3")
    a5 = c.assistant([{"type": "text", "text": "removed 3 logs"}])
    compaction = c.compact("we removed logs")
    p3 = c.user("now continue")
    a6 = c.assistant([{"type": "text", "text": "continuing"}])
    c.summary_line("Log cleanup")
    return c, dict(p1=p1, a1=a1, a2=a2, old=old, old_answer=old_answer, side_root=side_root,
                   side_answer=side_answer, a5=a5, compaction=compaction, p3=p3, a6=a6)


def test_claude_chain_branches_sidechains_and_compaction(store_dir, tmp_path):
    c, r = claude_session_with_everything()
    c.write(tmp_path / "projects" / "-home-u-proj" / f"{c.sid}.jsonl")
    assert cli(store_dir, "ingest", "claude", tmp_path / "projects").returncode == 0
    doc = replay_json(store_dir, f"claude/{c.sid}")
    uuids = lambda records: [x["uuid"] for x in records]  # noqa: E731
    boundary, summary, caveat, command, stdout = r["compaction"]
    assert doc["chain"] == uuids([boundary, summary, caveat, command, stdout, r["p3"]] + r["a6"])
    assert doc["visible"] == uuids([summary, command, stdout, r["p3"]] + r["a6"])
    assert doc["abandoned"] == uuids([r["old"]] + r["old_answer"])
    assert doc["sidechains"] == [{"root": r["side_root"]["uuid"], "leaf": r["side_answer"][0]["uuid"],
                                  "uuids": uuids([r["side_root"]] + r["side_answer"])}]
    assert doc["compaction"] == {"boundary": boundary["uuid"], "logical_parent": r["a5"][0]["uuid"]}
    assert doc["leaf"] == r["a6"][0]["uuid"] and doc["session_id"] == c.sid


def test_replay_at_a_seq_before_the_first_record_naming_the_session(store_dir, tmp_path):
    """Claude Code 2.x starts a transcript with a file-history-snapshot (no sessionId, no
    uuid): `replay --at 1` is still a replay of that transcript, not "neither format"."""
    c, r = claude_session_with_everything()
    c.write(tmp_path / "projects" / "-home-u-proj" / f"{c.sid}.jsonl")
    assert cli(store_dir, "ingest", "claude", tmp_path / "projects").returncode == 0
    thread = f"claude/{c.sid}"
    for seq in (0, 1):
        doc = replay_json(store_dir, thread, "--at", seq)
        assert doc["format"] == "claude" and doc["at"] == seq and doc["chain"] == [] and doc["messages"] == []
    assert replay_json(store_dir, thread, "--at", 2)["chain"] == [r["p1"]["uuid"]]
    # Its first checkpoint (a prefix that starts with the snapshot) replays too.
    first = sorted(json.loads(cli(store_dir, "--json", "log", thread).stdout)["checkpoints"],
                   key=lambda cp: cp["history"]["seq"])[0]
    assert replay_json(store_dir, first["checkpoint"])["format"] == "claude"


def test_claude_messages_keep_meta_text_the_model_is_sent(store_dir, tmp_path):
    """docs/HARNESSES.md: the Messages-API view drops system records; Claude Code sends
    `isMeta` text to the model, so it is kept (it is only not `visible`)."""
    c, r = claude_session_with_everything()
    c.write(tmp_path / "projects" / "-home-u-proj" / f"{c.sid}.jsonl")
    assert cli(store_dir, "ingest", "claude", tmp_path / "projects").returncode == 0
    doc = replay_json(store_dir, f"claude/{c.sid}")
    _, summary, caveat, command, stdout = r["compaction"]
    texts = [block["text"] for block in doc["messages"][0]["content"]]
    assert doc["messages"][0]["role"] == "user"
    assert texts == [summary["message"]["content"], caveat["message"]["content"], command["message"]["content"],
                     stdout["message"]["content"], "now continue"]
    assert caveat["uuid"] not in doc["visible"]
    assert [m["role"] for m in doc["messages"]] == ["user", "assistant"]


def test_claude_subagent_file_replays_the_subagents_conversation(store_dir, tmp_path):
    """A subagent's own file (every record `isSidechain`, with `agentId`): the SDK's
    `_build_subagent_chain` / `_entries_to_subagent_messages` show its messages."""
    project = tmp_path / "projects" / "-home-u-proj"
    parent = Claude(version="2.1.5")
    parent.user("research X", parent=None)
    parent.assistant([{"type": "tool_use", "id": "toolu_9", "name": "Task", "input": {"prompt": "dig"}}],
                     stop="tool_use")
    parent.write(project / f"{parent.sid}.jsonl")
    sub = Claude(session_id=parent.sid, version="2.1.5", agent_id="a1b2c3")
    prompt = sub.user("dig", parent=None, sidechain=True)
    use = sub.assistant([{"type": "tool_use", "id": "toolu_s", "name": "Grep", "input": {"pattern": "x"}}],
                        sidechain=True, stop="tool_use")
    result = sub.tool_result("toolu_s", "3 hits", sidechain=True)
    answer = sub.assistant([{"type": "text", "text": "dug"}], sidechain=True)
    sub.write(project / parent.sid / "subagents" / "agent-a1b2c3.jsonl")
    assert cli(store_dir, "ingest", "claude", tmp_path / "projects").returncode == 0
    doc = replay_json(store_dir, f"claude/{parent.sid}/agents/a1b2c3")
    chain = [prompt["uuid"], use[0]["uuid"], result["uuid"], answer[0]["uuid"]]
    assert doc["chain"] == chain and doc["leaf"] == answer[0]["uuid"]
    assert doc["visible"] == chain
    assert [m["role"] for m in doc["messages"]] == ["user", "assistant", "user", "assistant"]
    assert doc["messages"][-1]["content"] == [{"type": "text", "text": "dug"}]
    assert doc["session_id"] == parent.sid
    # The session's own replay is unchanged by the subagent file.
    assert replay_json(store_dir, f"claude/{parent.sid}")["visible"] == [json.loads(line)["uuid"]
                                                                         for line in parent.lines]


# --- ingest -------------------------------------------------------------------------------

def test_refused_files_are_named_others_go_on_and_nothing_is_written_for_them(store_dir, tmp_path):
    sessions = []
    for i in range(3):
        c = Codex()
        c.turn(f"prompt {i}", first=True)
        c.path = c.write(tmp_path / "s" / f"rollout-2025-10-01T10-00-0{i}-{c.id}.jsonl")
        sessions.append(c)
    assert cli(store_dir, "ingest", "codex", tmp_path / "s").returncode == 0
    truncated, grown, partial = sessions
    truncated.path.write_bytes(truncated.path.read_bytes()[:500])
    grown.turn("more")
    grown.write(grown.path)
    with open(partial.path, "a") as handle:
        handle.write('{"timestamp":"x","type":"event_msg","payload":{"type":"task_sta')
    before = cli(store_dir, "rollout", "cat", f"codex/{truncated.id}").stdout
    result = cli(store_dir, "--json", "ingest", "codex", tmp_path / "s")
    assert result.returncode == 1
    assert str(truncated.path) in result.stderr
    doc = json.loads(result.stdout)
    assert doc["refused"] == [str(truncated.path)]
    by_path = {f["path"]: f for f in doc["files"]}
    assert by_path[str(grown.path)]["status"] == "ingested"
    assert by_path[str(partial.path)]["status"] == "waiting" and by_path[str(partial.path)]["partial_bytes"] > 0
    assert cli(store_dir, "rollout", "cat", f"codex/{truncated.id}").stdout == before
    assert subprocess.run([AGENTCAS, "--store", str(store_dir), "rollout", "cat", f"codex/{grown.id}"],
                          capture_output=True).stdout == grown.path.read_bytes()
    assert cli(store_dir, "fsck").returncode == 0


def test_a_deleted_thread_is_ingested_again_not_reported_unchanged(store_dir, tmp_path):
    """The ingest state is a cache (the threads are the truth): a file whose stat did not
    change but whose thread was deleted is ingested again, not skipped as `unchanged`."""
    c = Codex()
    c.turn("one", first=True)
    path = c.write(tmp_path / f"rollout-x-{c.id}.jsonl")
    assert cli(store_dir, "ingest", "codex", path).returncode == 0
    assert cli(store_dir, "branch", "-d", f"codex/{c.id}").returncode == 0
    again = cli(store_dir, "--json", "ingest", "codex", path)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["files"][0]["status"] == "ingested"
    assert subprocess.run([AGENTCAS, "--store", str(store_dir), "rollout", "cat", f"codex/{c.id}"],
                          capture_output=True).stdout == path.read_bytes()
    assert json.loads(cli(store_dir, "--json", "ingest", "codex", path).stdout)["files"][0]["status"] == "unchanged"


def test_a_same_length_edit_inside_a_grown_file_is_refused(store_dir, tmp_path):
    """The file grew (same inode) and was also edited in its stored part, same length: the
    whole stored prefix is hashed again, so the edit is found, on the first growth (record by
    record against the thread) and, once a run has recorded its prefix digest, on every later
    one (whole bytes against that digest); nothing is appended either time."""
    c = Codex()
    c.turn("prompt one", first=True)
    path = c.write(tmp_path / f"rollout-x-{c.id}.jsonl")
    assert cli(store_dir, "ingest", "codex", path).returncode == 0
    for grown in ("prompt two", "prompt three"):
        stored = subprocess.run([AGENTCAS, "--store", str(store_dir), "rollout", "cat", f"codex/{c.id}"],
                                capture_output=True).stdout
        c.turn(grown)
        good = c.text().encode()
        with open(path, "r+b") as handle:    # same inode, larger, and "one" edited in place
            handle.write(good.replace(b"prompt one", b"PROMPT ONE"))
        result = cli(store_dir, "ingest", "codex", path)
        assert result.returncode == 1 and str(path) in result.stderr and "not appended to" in result.stderr
        assert subprocess.run([AGENTCAS, "--store", str(store_dir), "rollout", "cat", f"codex/{c.id}"],
                              capture_output=True).stdout == stored   # nothing was appended
        with open(path, "r+b") as handle:    # undone: the file only grew, and is taken
            handle.write(good)
        assert cli(store_dir, "ingest", "codex", path).returncode == 0
        assert subprocess.run([AGENTCAS, "--store", str(store_dir), "rollout", "cat", f"codex/{c.id}"],
                              capture_output=True).stdout == good


def test_watch_follows_a_new_file_and_sigterm_commits_everything(store_dir, tmp_path):
    sessions = tmp_path / "sessions"
    sessions.mkdir()
    proc = subprocess.Popen([AGENTCAS, "--store", str(store_dir), "ingest", "codex", str(sessions), "--watch"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        c = Codex()
        c.turn("first", first=True)
        path = c.write(sessions / f"rollout-2025-10-01T10-00-00-{c.id}.jsonl")
        c.turn("second")
        with open(path, "a") as handle:
            handle.write("".join(c.lines[len(path.read_text().splitlines()):]))
            handle.write('{"partial":')
        deadline = time.monotonic() + 60     # a bound for a loaded machine, not a timing claim
        while time.monotonic() < deadline:
            out = subprocess.run([AGENTCAS, "--store", str(store_dir), "rollout", "cat", f"codex/{c.id}"],
                                 capture_output=True).stdout
            if out == c.text().encode():
                break
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert subprocess.run([AGENTCAS, "--store", str(store_dir), "rollout", "cat", f"codex/{c.id}"],
                          capture_output=True).stdout == c.text().encode()


# --- effects on the command line -------------------------------------------------------------

def test_revert_and_checkout_list_open_effects_after_the_target_and_undo_none(store_dir, tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("one")
    assert cli(store_dir, "commit", ws, "-m", "first", "--thread", "agent").returncode == 0
    first = json.loads(cli(store_dir, "--json", "show", "agent").stdout)["checkpoint"]
    for eid, state in (("e1", "pending"), ("e2", "unknown"), ("e3", "done")):
        added = cli(store_dir, "effect", "add", "agent", "--kind", "payment", "--target", f"acct-{eid}",
                    "--state", state, "--rollback", "irreversible", "--id", eid)
        assert added.returncode == 0, added.stderr
    out = cli(store_dir, "checkout", first, tmp_path / "out", "--json")
    assert out.returncode == 0, out.stderr
    assert sorted(e["id"] for e in json.loads(out.stdout)["effects"]["effects"]) == ["e1", "e2"]
    assert "undid none" in json.loads(out.stdout)["effects"]["note"]
    reverted = cli(store_dir, "revert", "agent", first)
    assert reverted.returncode == 0
    assert "e1" in reverted.stderr and "e2" in reverted.stderr and "e3" not in reverted.stderr
    assert "undid none" in reverted.stderr
    # A refused effect add writes nothing.
    before = cli(store_dir, "rollout", "cat", "agent").stdout
    bad = cli(store_dir, "effect", "add", "agent", "--kind", "x", "--target", "y", "--state", "weird",
              "--rollback", "irreversible")
    assert bad.returncode == 2
    one_error_line(bad.stderr)
    assert cli(store_dir, "rollout", "cat", "agent").stdout == before
