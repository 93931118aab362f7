"""`agentcas rewind` and `agentcas resume`: files and conversation back to a step, undo, a
session moved to a second store and home; SIGKILL of a hook or a rewind at every step."""

from __future__ import annotations

import json
import os

import pytest

from agentcas import Store
from agentcas.harnesses.rewind import rewind

from support import raw_objects
from support.harness_machine import CLAUDE_ID, CODEX_ID, Machine, history_bytes, log
from support.harness_samples import ClaudeSession, CodexSession

THREAD = f"claude/{CLAUDE_ID}"


def claude_steps(m: Machine) -> tuple[ClaudeSession, list]:
    """Three hooked steps of a Claude Code session; the checkpoint ids, oldest first."""
    s = ClaudeSession(CLAUDE_ID, cwd=str(m.ws))
    (m.ws / ".git").mkdir()
    (m.ws / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (m.ws / ".gitignore").write_text("*.log\n")
    (m.ws / "keep.log").write_text("ignored, never touched\n")
    (m.ws / "src").mkdir()
    (m.ws / "src" / "app.py").write_text("v1\n")
    (m.ws / "README").write_text("readme\n")
    s.prompt("first step")
    m.write_transcript(s)
    assert m.hook("UserPromptSubmit", s, prompt="first step").code == 0
    s.tool("Bash", "edit things", "")
    (m.ws / "src" / "app.py").write_text("v2\n")
    (m.ws / "src" / "new.py").write_text("new\n")
    (m.ws / "README").unlink()
    (m.ws / "docs").mkdir()
    (m.ws / "docs" / "guide.md").write_text("guide\n")
    m.write_transcript(s)
    assert m.hook("PostToolUse", s, tool_name="Bash", tool_use_id="toolu_1").code == 0
    s.say("done")
    s.prompt("second step")
    (m.ws / "src" / "app.py").write_text("v3\n")
    m.write_transcript(s)
    assert m.hook("UserPromptSubmit", s, prompt="second step").code == 0
    return s, [e["checkpoint"] for e in reversed(log(m, THREAD))]


@pytest.fixture
def machine(tmp_path):
    m = Machine(tmp_path)
    assert m.run("init", str(m.store)).code == 0
    return m


def test_rewind_code_and_conversation_then_undo(machine):
    m = machine
    s, ids = claude_steps(m)
    at_first = m.files()
    (m.ws / "keep.log").write_text("changed after, still ignored\n")
    r = m.run("--json", "rewind", THREAD, "--to", ids[0])
    assert r.code == 0, r
    doc = r.json()
    assert set(doc) >= {"undo", "workspace", "session"}
    assert doc["workspace"] == os.path.realpath(m.ws)
    # code: the workspace is REV's tree; the ignored file and .git are as they were
    assert {k: v for k, v in m.files().items() if k != "keep.log"} == \
        {"src/app.py": b"v1\n", "README": b"readme\n", ".gitignore": b"*.log\n"}
    assert not (m.ws / "docs").exists()
    assert (m.ws / "keep.log").read_text() == "changed after, still ignored\n"
    assert (m.ws / ".git" / "HEAD").read_text() == "ref: refs/heads/main\n"
    # conversation: a new session at REV's position, where `claude --resume` looks
    session = doc["session"]
    assert session["resume"] == f"claude --resume {session['id']}"
    path = m.transcript.parent / f"{session['id']}.jsonl"
    assert session["path"] == str(path)
    forked = path.read_bytes().splitlines(keepends=True)
    original = s.data().splitlines(keepends=True)
    first_position = Store.open(str(m.store)).checkpoints.show(ids[0]).history.seq
    assert len(forked) == first_position
    for mine, theirs in zip(forked, original):
        assert json.loads(mine) == dict(json.loads(theirs), sessionId=session["id"])
        assert mine.replace(session["id"].encode(), CLAUDE_ID.encode()) == theirs
    assert m.transcript.read_bytes() == s.data()   # the original is untouched
    # undo: the workspace as it was before the rewind
    r = m.run("--json", "rewind", THREAD, "--to", doc["undo"], "--only", "code")
    assert r.code == 0, r
    assert r.json()["session"] is None
    after_undo = m.files()
    assert after_undo["src/app.py"] == b"v3\n" and after_undo["docs/guide.md"] == b"guide\n"
    assert "README" not in after_undo
    assert at_first != after_undo


def test_rewind_only_conversation_writes_no_file(machine):
    m = machine
    _, ids = claude_steps(m)
    before = m.files()
    r = m.run("--json", "rewind", THREAD, "--to", ids[1], "--only", "conversation")
    assert r.code == 0, r
    assert r.json()["undo"] is None and m.files() == before
    assert os.path.isfile(r.json()["session"]["path"])


def test_rewind_codex_writes_a_fork_codex_resumes(machine):
    m = machine
    s = CodexSession(CODEX_ID, cwd=str(m.ws))
    path = m.rollout()
    path.parent.mkdir(parents=True)
    for n in range(2):
        turn = s.turn(f"step {n}")
        (m.ws / "out.txt").write_text(f"{n}\n")
        path.write_bytes(s.data())
        payload = {"type": "agent-turn-complete", "thread-id": CODEX_ID, "turn-id": turn, "cwd": str(m.ws),
                   "input-messages": [f"step {n}"], "last-assistant-message": "Done."}
        assert m.run("hook", "codex", json.dumps(payload)).code == 0
    first = log(m, f"codex/{CODEX_ID}")[-1]
    r = m.run("--json", "rewind", f"codex/{CODEX_ID}", "--to", first["checkpoint"])
    assert r.code == 0, r
    session = r.json()["session"]
    assert (m.ws / "out.txt").read_text() == "0\n"
    assert session["resume"] == f"codex resume {session['id']}"
    fork = open(session["path"], "rb").read().splitlines(keepends=True)
    meta = json.loads(fork[0])
    assert meta["type"] == "session_meta" and meta["payload"]["id"] == session["id"]
    assert meta["payload"]["forked_from_id"] == CODEX_ID
    assert b"".join(fork[1:]) == b"".join(s.lines[:first["history"]["seq"]])
    name = os.path.basename(session["path"])
    assert name.startswith("rollout-") and name.endswith(f"-{session['id']}.jsonl")
    assert os.path.dirname(session["path"]).startswith(str(m.home / ".codex" / "sessions"))
    assert path.read_bytes() == s.data()
    # ingest sees the fork as a fork of the original
    r = m.run("--json", "ingest", "codex", session["path"])
    assert r.code == 0, r
    lineage = m.run("--json", "lineage").json()
    assert any(c["thread"] == f"codex/{session['id']}" for t in lineage["threads"] for c in t["children"])


def test_resume_on_a_second_machine_byte_for_byte(machine, tmp_path):
    m = machine
    s, ids = claude_steps(m)
    bundle = tmp_path / "session.bundle"
    assert m.run("export", THREAD, "-o", str(bundle)).code == 0
    other = Machine(tmp_path, "b")
    assert other.run("init", str(other.store)).code == 0
    assert other.run("import", str(bundle), "--allow-unsigned").code == 0, "import"
    r = other.run("--json", "resume", THREAD, "--cwd", str(other.ws))
    assert r.code == 0, r
    session = r.json()["session"]
    assert session["id"] == CLAUDE_ID and session["path"] == str(other.transcript)
    # the export is at the thread's last checkpoint: the whole transcript
    assert other.transcript.read_bytes() == s.data()
    # the same file there: nothing to do
    again = other.run("resume", THREAD, "--cwd", str(other.ws))
    assert again.code == 0, again
    # a different one: exit 3, nothing written
    other.transcript.write_bytes(s.data() + b'{"type":"summary"}\n')
    before = other.transcript.read_bytes()
    r = other.run("resume", THREAD, "--cwd", str(other.ws))
    assert r.code == 3 and "different" in r.err
    assert other.transcript.read_bytes() == before
    # --at an earlier step, under another checkout: that step's lines
    elsewhere = tmp_path / "b" / "elsewhere"
    elsewhere.mkdir()
    r = other.run("--json", "resume", THREAD, "--at", ids[0], "--cwd", str(elsewhere))
    assert r.code == 0, r
    seq = Store.open(str(m.store)).checkpoints.show(ids[0]).history.seq
    assert open(r.json()["session"]["path"], "rb").read() == b"".join(s.lines[:seq])


def test_resume_codex_after_a_pull(machine, tmp_path):
    m = machine
    s = CodexSession(CODEX_ID, cwd=str(m.ws))
    path = m.rollout()
    path.parent.mkdir(parents=True)
    turn = s.turn("step")
    path.write_bytes(s.data())
    payload = {"type": "agent-turn-complete", "thread-id": CODEX_ID, "turn-id": turn, "cwd": str(m.ws)}
    assert m.run("hook", "codex", json.dumps(payload)).code == 0
    other = Machine(tmp_path, "b")
    assert other.run("init", str(other.store)).code == 0
    assert other.run("remote", "add", "team", str(m.store)).code == 0
    assert other.run("pull", "team", f"codex/{CODEX_ID}").code == 0
    r = other.run("--json", "resume", f"codex/{CODEX_ID}")
    assert r.code == 0, r
    placed = r.json()["session"]["path"]
    assert open(placed, "rb").read() == s.data()
    assert placed.startswith(str(other.home / ".codex" / "sessions"))
    assert placed.endswith(f"-{CODEX_ID}.jsonl")
    assert other.run("resume", f"codex/{CODEX_ID}").code == 0


def test_rewind_refuses_bad_input_and_changes_nothing(machine):
    m = machine
    _, ids = claude_steps(m)
    before = m.files()
    threads = Store.open(str(m.store)).threads.log(THREAD)
    for args, code in ((["rewind", "claude/nope", "--to", ids[0]], 1),
                       (["rewind", THREAD, "--to", "0" * 12], 1),
                       (["rewind", THREAD, "--to", ids[0], "--only", "files"], 2),
                       (["rewind", THREAD, "--to", ids[0], "--workspace", str(m.root / "nowhere")], 2)):
        r = m.run(*args)
        assert r.code == code, (args, r)
        assert len(r.err.strip().splitlines()) == 1
    assert m.files() == before
    assert Store.open(str(m.store)).threads.log(THREAD) == threads


def crash_points(m: Machine, args, input=None) -> list:
    count = m.root / "count.txt"
    r = m.run(*args, input=input, env={"AGENTCAS_CRASH_COUNT": str(count)})
    assert r.code == 0, r
    labels = count.read_text().splitlines()
    count.unlink()
    return labels


def test_sigkill_of_a_rewind_at_every_step_then_rerun_completes(machine, tmp_path):
    m = machine
    _, ids = claude_steps(m)
    target = m.files()
    base = tmp_path / "base"
    import shutil
    shutil.copytree(m.root, base, symlinks=True)
    m.run("rewind", THREAD, "--to", ids[0], "--only", "code")
    wanted = m.files()
    shutil.rmtree(m.root)
    shutil.copytree(base, m.root, symlinks=True)
    labels = crash_points(m, ["rewind", THREAD, "--to", ids[0], "--only", "code"])
    assert "rewind.file" in labels and "rewind.remove" in labels
    # Each step named by its label and its number among that label's steps: a copied
    # workspace's stat cache rows may or may not be racy, which shifts the store's own
    # steps between runs, but not the rewind's files.
    points = [f"{label}:{labels[:n + 1].count(label)}" for n, label in enumerate(labels)]
    for number, point in enumerate(points, 1):
        shutil.rmtree(m.root)
        shutil.copytree(base, m.root, symlinks=True)
        r = m.run("rewind", THREAD, "--to", ids[0], "--only", "code", env={"AGENTCAS_CRASH_AT": point})
        assert r.code == -9 or (r.code == 0 and not point.startswith(("rewind.", "session."))), (point, r)
        assert m.run("fsck").code == 0, number
        current = m.files()
        for rel, data in current.items():   # every file is old or new, never half-written
            if not rel.startswith(".") or rel == ".gitignore":
                assert data in (target.get(rel), wanted.get(rel)) or ".agentcas-rewind-" in rel, (number, rel)
        r = m.run("--json", "rewind", THREAD, "--to", ids[0], "--only", "code")
        assert r.code == 0, (number, r)
        assert m.files() == wanted, (number, point)
        assert m.run("fsck").code == 0
    assert target != wanted


def test_sigkill_of_a_hook_at_every_step_then_rerun_completes(machine, tmp_path):
    m = machine
    s = ClaudeSession(CLAUDE_ID, cwd=str(m.ws))
    s.prompt("go")
    m.write_transcript(s)
    (m.ws / "a.txt").write_text("a" * 5000)
    event = m.claude_event("PostToolUse", s, tool_name="Bash", tool_use_id="toolu_1")
    import shutil
    base = tmp_path / "base"
    shutil.copytree(m.root, base, symlinks=True)
    labels = crash_points(m, ["hook", "claude"], input=event)
    assert labels
    points = [f"{label}:{labels[:n + 1].count(label)}" for n, label in enumerate(labels)]
    for number, point in enumerate(points, 1):
        shutil.rmtree(m.root)
        shutil.copytree(base, m.root, symlinks=True)
        r = m.run("hook", "claude", input=event, env={"AGENTCAS_CRASH_AT": point})
        assert r.code in (-9, 0), (point, r)
        assert m.run("fsck").code == 0, (number, point)
        r = m.run("hook", "claude", input=event)
        assert r.code == 0, (number, r)
        assert history_bytes(m, THREAD) == s.data()
        assert m.run("fsck").code == 0


def test_rewind_verifies_every_file_before_writing_one(tmp_path):
    from agentcas.errors import IntegrityError
    store = Store.memory()
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("a1")
    (ws / "b.txt").write_text("b1")
    first = store.sessions.checkpoint(str(ws), "claude/x", "one", lambda state: b"")
    (ws / "a.txt").write_text("a2")
    (ws / "b.txt").write_text("b2")
    store.sessions.checkpoint(str(ws), "claude/x", "two", lambda state: b"")
    b1 = next(f for f in store.checkpoints.files(first.checkpoint) if f.path == "b.txt").id
    store.environment.write(lambda txn: raw_objects.edit(txn, bytes.fromhex(b1), lambda value: None))
    with pytest.raises(IntegrityError):
        rewind(store, "claude/x", first.checkpoint, only="code", workspace=str(ws))
    assert (ws / "a.txt").read_text() == "a2" and (ws / "b.txt").read_text() == "b2"
    assert [e.reason for e in store.threads.log("claude/x")][0].startswith("before rewind to ")


def test_rewind_and_resume_as_mcp_tools_only_when_the_host_allows(machine, monkeypatch):
    from agentcas.mcp.tools import ToolHost
    m = machine
    s, ids = claude_steps(m)
    store = Store.open(str(m.store))
    for key, value in m.env.items():
        monkeypatch.setenv(key, value)
    before = m.files()
    host = ToolHost(store, workspace_root=str(m.root))
    doc = host.call("rewind_session", {"thread": THREAD, "checkpoint_id": ids[0]})
    assert doc["performed"] is False and doc["host_command"][-4:-2] == ["--to", ids[0]]
    assert m.files() == before
    doc = host.call("resume_session", {"thread": THREAD, "cwd": str(m.ws)})
    assert doc["performed"] is False and not m.transcript.parent.joinpath("x").exists()
    allowed = ToolHost(store, allow_restore=True, workspace_root=str(m.root))
    doc = allowed.call("rewind_session", {"thread": THREAD, "checkpoint_id": ids[0]})
    assert doc["performed"] is True and doc["result"]["undo"]
    assert m.files()["src/app.py"] == b"v1\n"
    assert os.path.isfile(doc["result"]["session"]["path"])
    doc = allowed.call("resume_session", {"thread": THREAD, "cwd": str(m.ws)})
    assert doc["performed"] is True and doc["status"] == "already_there"


def test_resume_without_cwd_uses_the_current_checkout_when_the_recorded_one_is_elsewhere(machine, tmp_path):
    m = machine
    s, _ = claude_steps(m)
    bundle = tmp_path / "s.bundle"
    assert m.run("export", THREAD, "-o", str(bundle)).code == 0
    other = Machine(tmp_path, "c")
    assert other.run("init", str(other.store)).code == 0
    assert other.run("import", str(bundle), "--allow-unsigned").code == 0
    r = other.run("--json", "resume", THREAD)   # runs in other.ws; m.ws exists too (same machine here)
    assert r.code == 0, r
    assert r.json()["session"]["path"] == str(other.home / ".claude" / "projects" / other.transcript.parent.name
                                              .replace(other.transcript.parent.name,
                                                       "".join(c if c.isalnum() and c.isascii() else "-"
                                                               for c in str(m.ws))) / f"{CLAUDE_ID}.jsonl")
    import shutil
    shutil.rmtree(m.ws)   # the recorded checkout is not on this machine: the current directory's key
    (other.home / ".claude").rename(other.root / "old-claude")
    r = other.run("--json", "resume", THREAD)
    assert r.code == 0, r
    assert r.json()["session"]["path"] == str(other.transcript)
    assert other.transcript.read_bytes() == s.data()


def test_rewind_of_files_to_an_ingest_checkpoint_is_refused(machine):
    m = machine
    s = ClaudeSession(CLAUDE_ID, cwd=str(m.ws))
    s.prompt("one")
    s.say("ok")
    s.prompt("two")
    m.write_transcript(s)
    assert m.run("ingest", "claude", str(m.transcript)).code == 0
    (m.ws / "keep.txt").write_text("mine")
    assert m.hook("Stop", s).code == 0
    ingested = log(m, THREAD)[-1]["checkpoint"]
    r = m.run("rewind", THREAD, "--to", ingested)
    assert r.code == 2 and "--only conversation" in r.err, r
    assert (m.ws / "keep.txt").read_text() == "mine"
    r = m.run("--json", "rewind", THREAD, "--to", ingested, "--only", "conversation")
    assert r.code == 0 and r.json()["undo"] is None, r
