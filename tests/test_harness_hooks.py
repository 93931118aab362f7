"""`agentcas hook claude|codex` and `hook install`: real-format sessions played through the
real CLI, as Claude Code and Codex call it, in a private HOME."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import tomllib

from agentcas import Store, testing_hooks
from agentcas.harnesses import hooks

from support.cli import AGENTCAS, run_cli
from support.harness_machine import CLAUDE_ID, CODEX_ID, Machine, history_bytes, log, stored_files
from support.harness_samples import ClaudeSession, CodexSession


@pytest.fixture
def machine(tmp_path):
    m = Machine(tmp_path)
    assert m.run("init", str(m.store)).code == 0
    return m


def play_claude(m: Machine) -> ClaudeSession:
    """A Claude Code session: a prompt, a Bash call that edits two files, an Edit, a stop."""
    s = ClaudeSession(CLAUDE_ID, cwd=str(m.ws))
    (m.ws / "app.py").write_text("print('v1')\n")
    s.extra({"type": "file-history-snapshot", "messageId": "m0", "snapshot": {"messageId": "m0",
             "trackedFileBackups": {}, "timestamp": "2026-11-30T21:00:00.000Z"}, "isSnapshotUpdate": False})
    s.prompt("fix the login timeout")
    m.write_transcript(s)
    r = m.hook("UserPromptSubmit", s, prompt="fix the login timeout")
    assert (r.code, r.out) == (0, ""), r
    use, _ = s.tool("Bash", "sed -i s/v1/v2/ app.py && echo log > notes.txt", "")
    (m.ws / "app.py").write_text("print('v2')\n")
    (m.ws / "notes.txt").write_text("log\n")
    m.write_transcript(s)
    tool_id = json.loads(s.lines[-2])["message"]["content"][0]["id"]
    r = m.hook("PostToolUse", s, tool_name="Bash", tool_input={"command": "sed -i s/v1/v2/ app.py"},
               tool_response={"stdout": ""}, tool_use_id=tool_id)
    assert (r.code, r.out) == (0, ""), r
    s.say("Done: the timeout is fixed.")
    m.write_transcript(s)
    r = m.hook("Stop", s, stop_hook_active=False)
    assert (r.code, r.out) == (0, ""), r
    return s


def test_claude_session_through_hooks_is_byte_exact_and_ingest_agrees(machine):
    m = machine
    s = play_claude(m)
    thread = f"claude/{CLAUDE_ID}"
    assert history_bytes(m, thread) == m.transcript.read_bytes() == s.data()
    entries = log(m, thread)
    assert len(entries) == 3
    reasons = [e["reason"] for e in reversed(entries)]
    assert reasons[0] == "claude UserPromptSubmit: fix the login timeout"
    assert reasons[1].startswith("claude PostToolUse Bash toolu_") and "sed -i" in reasons[1]
    assert reasons[2] == "claude Stop"
    assert stored_files(m.store, entries[-1]["checkpoint"]) == {"app.py": b"print('v1')\n"}
    assert stored_files(m.store, entries[0]["checkpoint"]) == m.files()
    # An ingest of the same transcript after the hooks: nothing to add, nothing to refuse.
    r = m.run("--json", "ingest", "claude", str(m.transcript))
    assert r.code == 0, r
    assert r.json()["appended"] == 0 and r.json()["checkpoints"] == 0 and r.json()["refused"] == []
    # ... also without the hook's state row (another machine, a dropped cache).
    other = Machine(m.root, "fresh")
    r = run_cli("--json", "ingest", "claude", str(m.transcript), env=dict(m.env, AGENTCAS_STORE=str(m.store)))
    assert r.json()["appended"] == 0 and r.json()["checkpoints"] == 0, r
    assert len(log(m, thread)) == 3
    assert other.root.exists()


def test_hooks_after_an_ingest_go_on_from_what_ingest_stored(machine):
    m = machine
    s = ClaudeSession(CLAUDE_ID, cwd=str(m.ws))
    s.prompt("one")
    s.say("ok")
    s.prompt("two")
    m.write_transcript(s)
    assert m.run("ingest", "claude", str(m.transcript)).code == 0
    s.tool()
    m.write_transcript(s)
    (m.ws / "x.txt").write_text("x")
    assert m.hook("PostToolUse", s, tool_name="Bash", tool_use_id="toolu_9").code == 0
    assert history_bytes(m, f"claude/{CLAUDE_ID}") == s.data()


def test_codex_session_through_notify_is_byte_exact(machine):
    m = machine
    s = CodexSession(CODEX_ID, cwd=str(m.ws))
    path = m.rollout()
    path.parent.mkdir(parents=True)
    thread = f"codex/{CODEX_ID}"
    for n in range(2):
        turn = s.turn(f"step {n}: make it faster")
        (m.ws / f"out{n}.txt").write_text(f"result {n}\n")
        path.write_bytes(s.data())
        payload = {"type": "agent-turn-complete", "thread-id": CODEX_ID, "turn-id": turn, "cwd": str(m.ws),
                   "input-messages": [f"step {n}: make it faster"], "last-assistant-message": "Done."}
        r = m.run("hook", "codex", json.dumps(payload))
        assert (r.code, r.out) == (0, ""), r
    assert history_bytes(m, thread) == path.read_bytes()
    entries = log(m, thread)
    assert [e["reason"] for e in entries] == [f"codex turn {turn} complete: step 1: make it faster",
                                             f"codex turn {entries[1]['reason'].split()[2]} complete: step 0: make it faster"]
    assert stored_files(m.store, thread) == {"out0.txt": b"result 0\n", "out1.txt": b"result 1\n"}
    r = m.run("--json", "ingest", "codex", str(path))
    assert r.json()["appended"] == 0 and r.json()["checkpoints"] == 0 and not r.json()["refused"], r
    # Another payload type: nothing, exit 0.
    r = m.run("hook", "codex", json.dumps({"type": "approval-requested", "thread-id": CODEX_ID}))
    assert (r.code, r.out, r.err) == (0, "", "")
    assert len(log(m, thread)) == 2


def test_workspace_as_git_sees_it_and_a_credential_is_left_out_not_blocking(machine):
    m = machine
    (m.ws / ".git").mkdir()
    (m.ws / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (m.ws / ".gitignore").write_text("build/\n*.log\n")
    (m.ws / ".agentcasignore").write_text("scratch.txt\n")
    (m.ws / "build").mkdir()
    (m.ws / "build" / "out.bin").write_bytes(b"\0" * 10)
    (m.ws / "debug.log").write_text("noise\n")
    (m.ws / "scratch.txt").write_text("tmp\n")
    (m.ws / "main.py").write_text("print(1)\n")
    (m.ws / "creds.env").write_text("AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY\n")
    s = ClaudeSession(CLAUDE_ID, cwd=str(m.ws))
    s.prompt("go")
    m.write_transcript(s)
    r = m.hook("UserPromptSubmit", s, prompt="go")
    assert (r.code, r.out) == (0, ""), r
    files = stored_files(m.store, f"claude/{CLAUDE_ID}")
    assert sorted(files) == [".agentcasignore", ".gitignore", "main.py"]
    log_text = (m.store / "hooks.log").read_text()
    assert "creds.env" in log_text and "credential" in log_text
    assert "wJalrXUtnFEMI" not in log_text


def hostile_cases(m: Machine):
    s = ClaudeSession(CLAUDE_ID, cwd=str(m.ws))
    base = json.loads(m.claude_event("Stop", s))
    yield "session id with a slash", json.dumps(dict(base, session_id="../../etc/x"))
    yield "session id with dots", json.dumps(dict(base, session_id=".."))
    yield "empty stdin", ""
    yield "not JSON", "{not json"
    yield "a JSON list", "[1, 2]"
    yield "a relative cwd", json.dumps(dict(base, cwd="work/proj"))
    yield "no such cwd", json.dumps(dict(base, cwd=str(m.root / "nowhere")))
    yield "huge", "{" + " " * (hooks.MAX_EVENT_BYTES + 10) + "}"


def tree_listing(root: Path, skip: Path) -> set:
    return {str(p) for p in root.rglob("*") if skip not in p.parents and p != skip}


def test_hostile_events_one_line_exit_1_nothing_written_outside_the_store(machine):
    m = machine
    (m.ws / "a.txt").write_text("a")
    before = tree_listing(m.root, m.store)
    for name, text in hostile_cases(m):
        r = m.run("hook", "claude", input=text)
        assert r.code == 1, (name, r)
        assert r.out == "", name
        assert len(r.err.strip().splitlines()) == 1 and r.err.startswith("agentcas: error: "), (name, r.err)
    assert tree_listing(m.root, m.store) == before
    assert Store.open(str(m.store)).threads.names() == set()
    lines = (m.store / "hooks.log").read_text().splitlines()
    assert len(lines) == len(list(hostile_cases(m)))
    for bad in (["hook", "claude", "--nope"], ["hook", "codex"], ["hook", "codex", "{"], ["hook", "nope"],
                ["hook", "install", "nope"]):
        r = m.run(*bad, input="")
        assert (r.code, r.out) == (1, ""), (bad, r)
        assert len(r.err.strip().splitlines()) == 1


def test_missing_transcript_still_checkpoints_the_workspace(machine):
    m = machine
    (m.ws / "a.txt").write_text("a")
    s = ClaudeSession(CLAUDE_ID, cwd=str(m.ws))
    r = m.hook("Stop", s)
    assert r.code == 1 and len(r.err.strip().splitlines()) == 1 and "does not exist" in r.err, r
    assert stored_files(m.store, f"claude/{CLAUDE_ID}") == {"a.txt": b"a"}


def test_rewritten_transcript_is_refused_by_name_and_the_workspace_still_checkpointed(machine):
    m = machine
    s = ClaudeSession(CLAUDE_ID, cwd=str(m.ws))
    s.prompt("first")
    s.say("reply")
    m.write_transcript(s)
    assert m.hook("Stop", s).code == 0
    stored = history_bytes(m, f"claude/{CLAUDE_ID}")
    edited = s.data().replace(b"reply", b"REPLY")
    m.transcript.write_bytes(edited + s.data()[:0])
    (m.ws / "after.txt").write_text("after")
    r = m.hook("Stop", s)
    # The message itself (the test's own temporary path holds the word "rewritten" too).
    refused = (f"{m.transcript} differs from what was already ingested into claude/{CLAUDE_ID} (it was "
               "rewritten or edited, not appended to); not ingested")
    assert r.code == 1 and refused in r.err, r
    assert history_bytes(m, f"claude/{CLAUDE_ID}") == stored
    assert "after.txt" in stored_files(m.store, f"claude/{CLAUDE_ID}")
    # ingest refuses it the same way
    r = m.run("ingest", "claude", str(m.transcript))
    assert r.code == 1 and refused in r.err, r


def test_parallel_hooks_on_one_session_both_land(tmp_path):
    """Two hooks race: the one that loses the compare-and-swap reads the session again after
    the winner's lines and lands after it (the move engine re-plans `commit_session`)."""
    Store.init(str(tmp_path / "store"))
    store = Store.open(str(tmp_path / "store"))
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("a")
    session = ClaudeSession(CLAUDE_ID, cwd=str(ws))
    session.prompt("one")
    path = tmp_path / "t.jsonl"
    path.write_bytes(session.data())
    event = hooks.HookEvent("claude", CLAUDE_ID, str(ws), "first", str(path))
    raced = []

    def other_hook():
        if raced:
            return
        raced.append(True)
        session.say("more")
        path.write_bytes(session.data())
        hooks.run_hook(store, hooks.HookEvent("claude", CLAUDE_ID, str(ws), "second", str(path)))

    with testing_hooks.on("session.before_land", other_hook):
        outcome = hooks.run_hook(store, event)
    assert outcome.checkpoint.refused is None
    reasons = [e.reason for e in store.threads.log(f"claude/{CLAUDE_ID}")]
    assert reasons == ["first", "second"]
    assert b"".join(store.history.read(f"claude/{CLAUDE_ID}")) == path.read_bytes()


def test_parallel_hook_processes_all_land(machine):
    m = machine
    s = ClaudeSession(CLAUDE_ID, cwd=str(m.ws))
    s.prompt("go")
    m.write_transcript(s)
    env = dict(os.environ, **m.env)
    procs = [subprocess.Popen([AGENTCAS, "hook", "claude"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, env=env)
             for _ in range(4)]
    for n, proc in enumerate(procs):
        proc.stdin.write(m.claude_event("PostToolUse", s, tool_name="Bash", tool_use_id=f"toolu_{n}").encode())
        proc.stdin.close()
    for proc in procs:
        assert proc.wait(60) == 0, proc.stderr.read()
    assert sorted(e["reason"] for e in log(m, f"claude/{CLAUDE_ID}")) == [f"claude PostToolUse Bash toolu_{n}"
                                                                          for n in range(4)]


def test_store_lookup_order(tmp_path):
    m = Machine(tmp_path)
    del m.env["AGENTCAS_STORE"]
    s = ClaudeSession(CLAUDE_ID, cwd=str(m.ws))
    (m.ws / "a").write_text("a")
    # No store anywhere: the per-user store, made on first use.
    assert m.run("hook", "claude", input=m.claude_event("Stop", s)).code == 1   # no transcript yet
    user = m.home / "data" / "agentcas" / "store"
    assert Store.open(str(user)).threads.names() == {f"claude/{CLAUDE_ID}"}
    # A .agentcas above the workspace wins over it.
    project = m.root / "work" / ".agentcas"
    assert run_cli("init", str(project)).code == 0
    m.hook("Stop", s)
    assert Store.open(str(project)).threads.names() == {f"claude/{CLAUDE_ID}"}
    # $AGENTCAS_STORE over that, --store over everything.
    env_store, flag_store = tmp_path / "env", tmp_path / "flag"
    run_cli("init", str(env_store))
    run_cli("init", str(flag_store))
    m.run("hook", "claude", input=m.claude_event("Stop", s), env={"AGENTCAS_STORE": str(env_store)})
    assert Store.open(str(env_store)).threads.names() == {f"claude/{CLAUDE_ID}"}
    m.run("--store", str(flag_store), "hook", "claude", input=m.claude_event("Stop", s),
          env={"AGENTCAS_STORE": str(env_store)})
    assert Store.open(str(flag_store)).threads.names() == {f"claude/{CLAUDE_ID}"}
    assert len(Store.open(str(env_store)).threads.log(f"claude/{CLAUDE_ID}")) == 1


# --- hook install ---------------------------------------------------------------------------

def test_install_claude_keeps_other_settings_and_is_idempotent(tmp_path):
    m = Machine(tmp_path)
    settings = m.home / ".claude" / "settings.json"
    settings.parent.mkdir(parents=True)
    original = {"model": "opus", "permissions": {"allow": ["Bash(ls)"]},
                "hooks": {"PostToolUse": [{"matcher": "Edit", "hooks": [{"type": "command", "command": "fmt"}]}],
                          "Notification": [{"hooks": [{"type": "command", "command": "notify-send hi"}]}]}}
    settings.write_text(json.dumps(original, indent=4))
    r = m.run("hook", "install", "claude")
    assert r.code == 0, r
    doc = json.loads(settings.read_text())
    assert doc["model"] == "opus" and doc["permissions"] == original["permissions"]
    assert doc["hooks"]["Notification"] == original["hooks"]["Notification"]
    assert doc["hooks"]["PostToolUse"][0] == original["hooks"]["PostToolUse"][0]
    for event in ("PostToolUse", "UserPromptSubmit", "Stop"):
        commands = [h["command"] for g in doc["hooks"][event] for h in g["hooks"]]
        assert sum("hook claude" in c for c in commands) == 1, event
    first = settings.read_bytes()
    r = m.run("--json", "hook", "install", "claude")
    assert r.code == 0 and r.json()["changed"] is False
    assert settings.read_bytes() == first
    r = m.run("hook", "install", "claude", "--uninstall")
    assert r.code == 0
    assert json.loads(settings.read_text()) == original
    again = settings.read_bytes()
    assert m.run("hook", "install", "claude", "--uninstall").code == 0
    assert settings.read_bytes() == again


def test_install_claude_in_a_project_and_refuses_a_broken_file(tmp_path):
    m = Machine(tmp_path)
    r = m.run("hook", "install", "claude", "--project", str(m.ws))
    assert r.code == 0, r
    doc = json.loads((m.ws / ".claude" / "settings.json").read_text())
    assert doc["hooks"]["PostToolUse"][0]["matcher"] == "*"
    broken = m.home / ".claude" / "settings.json"
    broken.parent.mkdir(parents=True)
    broken.write_text("{oops")
    r = m.run("hook", "install", "claude")
    assert r.code == 1 and "not valid JSON" in r.err
    assert broken.read_text() == "{oops"


def test_install_codex_edits_only_the_notify_line(tmp_path):
    m = Machine(tmp_path)
    config = m.home / ".codex" / "config.toml"
    config.parent.mkdir(parents=True)
    original = ('# my settings\nmodel = "gpt-5-codex"  # keep this comment\n\n[profiles.fast]\n'
                'model = "o4-mini"\n\n[mcp_servers.docs]\ncommand = "docs-mcp"\nargs = ["--port", "9"]\n')
    config.write_text(original)
    r = m.run("hook", "install", "codex")
    assert r.code == 0, r
    text = config.read_text()
    assert text.endswith(original)
    notify = tomllib.loads(text)["notify"]
    assert notify[-2:] == ["hook", "codex"]
    assert tomllib.loads(text)["profiles"] == {"fast": {"model": "o4-mini"}}
    assert m.run("hook", "install", "codex").code == 0
    assert config.read_text() == text
    assert m.run("hook", "install", "codex", "--uninstall").code == 0
    assert config.read_text() == original
    # Someone else's notify program is never replaced.
    config.write_text('notify = ["notify-send", "codex"]\n' + original)
    before = config.read_bytes()
    r = m.run("hook", "install", "codex")
    assert r.code == 3 and "notify" in r.err
    assert config.read_bytes() == before
