"""Ingest of harness session files (agentcas/harnesses/ingest.py, discovery.py) through the real CLI and API."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from agentcas import Store
from agentcas.harnesses.ingest import Ingest

from support.cli import AGENTCAS
from support.harness_samples import ClaudeSession, CodexSession, dumps

CODEX_ID = "0199a0b1-0000-7000-8000-000000000001"
THREAD = f"codex/{CODEX_ID}"


def codex_file(root, session: CodexSession, name: str | None = None, extra: bytes = b""):
    directory = root / "sessions" / "2026" / "11" / "30"
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / (name or f"rollout-2026-11-30T21-30-12-{session.thread_id}.jsonl")
    path.write_bytes(session.data() + extra)
    return path


def cat(run, store_dir, thread) -> bytes:
    proc = subprocess.run([AGENTCAS, "--store", str(store_dir), "rollout", "cat", thread], capture_output=True)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def sample_codex() -> CodexSession:
    s = CodexSession()
    s.turn("fix the login timeout", "fixed")
    s.compact()
    s.turn("deploy to staging")
    return s


def test_ingest_is_byte_exact_with_a_checkpoint_per_turn(run, store_dir, tmp_path):
    s = sample_codex()
    path = codex_file(tmp_path, s, name="rollout-2026-11-30T21-30-12-not-the-id.jsonl")
    r = run("--json", "ingest", "codex", tmp_path / "sessions", store=store_dir)
    assert r.code == 0, r
    doc = r.json()
    assert doc["files"][0]["thread"] == THREAD and doc["files"][0]["appended"] == len(s.lines)
    data = cat(run, store_dir, THREAD)
    assert data == path.read_bytes()
    assert hashlib.blake2b(data).digest() == hashlib.blake2b(path.read_bytes()).digest()
    log = run("--json", "log", THREAD, store=store_dir).json()["checkpoints"]
    boundaries = [n for n, line in enumerate(s.lines, 1) if b'"task_complete"' in line]
    assert sorted(e["history"]["seq"] for e in log) == boundaries      # the last boundary is the end
    reasons = [e["reason"] for e in reversed(log)]
    assert reasons[0].startswith("codex turn ") and reasons[0].endswith("fix the login timeout")
    for e in log:
        assert 1 <= len(e["reason"]) <= 512
    # The store's other commands work on ingested threads.
    first = log[-1]["checkpoint"]
    assert run("show", first, store=store_dir).code == 0
    assert run("fork", THREAD, "explore", "--at", str(boundaries[0]), store=store_dir).code == 0
    assert run("--json", "diff", first, log[0]["checkpoint"], store=store_dir).json()["records"]["added"] > 0
    assert run("fsck", store=store_dir).code == 0
    assert run("gc", "--grace", "0s", store=store_dir).code == 0
    assert cat(run, store_dir, THREAD) == path.read_bytes()
    assert run("keygen", "alice", "--out", tmp_path / "keys", store=store_dir).code == 0
    signed = run("export", THREAD, "-o", tmp_path / "b.bundle", "--sign", tmp_path / "keys" / "alice.key",
                 store=store_dir)
    assert signed.code == 0, signed
    other = tmp_path / "other"
    assert run("init", other).code == 0
    assert run("trust", "add", "alice", tmp_path / "keys" / "alice.pub", store=other).code == 0
    assert run("import", tmp_path / "b.bundle", store=other).code == 0
    assert cat(run, other, THREAD) == path.read_bytes()
    assert run("--json", "replay", THREAD, store=other).json() == run("--json", "replay", THREAD,
                                                                       store=store_dir).json()


def test_second_run_appends_only_new_complete_lines_and_a_partial_line_waits(run, store_dir, tmp_path):
    s = CodexSession()
    s.turn("one")
    path = codex_file(tmp_path, s)
    assert run("ingest", "codex", path, store=store_dir).code == 0
    before = len(s.lines)
    turn = s.start(prompt="two")
    s.reply("done")
    s.complete(turn)
    partial = b'{"timestamp":"2026-11-30T21:00:00.000Z","type":"event_msg","pay'
    path.write_bytes(s.data() + partial)
    r = run("--json", "ingest", "codex", path, store=store_dir)
    report = r.json()["files"][0]
    assert report["first_seq"] == before and report["appended"] == len(s.lines) - before
    assert report["partial_bytes"] == len(partial) and report["status"] == "ingested"
    assert cat(run, store_dir, THREAD) == s.data()
    # The partial line completes: only it is appended.
    with open(path, "ab") as handle:
        handle.write(b'load":{"type":"token_count","info":null,"rate_limits":null}}\n')
    report = run("--json", "ingest", "codex", path, store=store_dir).json()["files"][0]
    assert report["appended"] == 1
    assert cat(run, store_dir, THREAD) == path.read_bytes()


def test_a_same_length_edit_inside_the_ingested_part_of_a_grown_file_is_refused(store, tmp_path):
    """A file that only grew is checked against the whole-bytes digest of its ingested part
    that the last run recorded (harnesses/new_lines.py): an edit that keeps every length,
    made in that part while the file also grew, is refused and nothing is appended."""
    s = CodexSession()
    s.turn("one")
    path = codex_file(tmp_path, s)
    assert Ingest(store, "codex", [str(path)]).run()[0].status == "ingested"
    s.turn("two")
    path.write_bytes(s.data())
    assert Ingest(store, "codex", [str(path)]).run()[0].status == "ingested"  # records the digest
    stored = b"".join(store.history.read(THREAD))
    s.turn("three")
    edited = s.data().replace(b"two", b"TWO", 1)
    assert len(edited) == len(s.data()) and edited[:len(stored)] != stored
    inode = path.stat().st_ino
    path.write_bytes(edited)
    assert path.stat().st_ino == inode   # the same file, grown: no full re-check by records
    report = Ingest(store, "codex", [str(path)]).run()[0]
    assert report.status == "refused", report
    assert report.error == (f"{path} differs from what was already ingested into {THREAD} (it was rewritten "
                            "or edited, not appended to); not ingested")
    assert b"".join(store.history.read(THREAD)) == stored


def _edit_in_place_keeping_the_stat(path):
    """A same-size edit with the mtime restored: only a read of the file would notice it."""
    st = os.stat(path)
    data = bytearray(path.read_bytes())
    data[5:9] = b"XXXX"
    with open(path, "r+b") as handle:
        handle.write(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


@pytest.mark.parametrize("kind", ["memory", "shared"])
def test_unchanged_file_costs_a_stat_on_memory_and_shared_stores_too(kind, tmp_path, request, monkeypatch):
    """The ingest state lives in this machine's stat cache, which every kind of store has."""
    if kind == "memory":
        store = Store.memory()
        again = store   # a memory store lives in one process: a --watch's later passes
    else:
        s3_url, refs = request.getfixturevalue("s3_url"), request.getfixturevalue("postgres_url")
        monkeypatch.setenv("AGENTCAS_CACHE_DIR", str(tmp_path / "cache"))
        store, _ = Store.init(s3_url, refs=refs)
        again = Store.open(s3_url, refs=refs)   # a later run on this machine
    path = codex_file(tmp_path, sample_codex())
    assert Ingest(store, "codex", [str(path)]).run()[0].status == "ingested"
    _edit_in_place_keeping_the_stat(path)
    report = Ingest(again, "codex", [str(path)]).run()[0]
    assert report.status == "unchanged" and report.thread == THREAD   # the file was not read
    os.utime(path)
    report = Ingest(again, "codex", [str(path)]).run()[0]
    assert report.status == "refused" and "rewritten" in report.error


def test_unchanged_file_costs_a_stat(store, tmp_path):
    """Same size, mtime and inode: the file is not even opened (a same-size in-place edit
    with its mtime restored is not noticed, where a read would refuse it as rewritten)."""
    s = sample_codex()
    path = codex_file(tmp_path, s)
    assert Ingest(store, "codex", [str(path)]).run()[0].status == "ingested"
    st = os.stat(path)
    data = bytearray(path.read_bytes())
    data[5:9] = b"XXXX"
    with open(path, "r+b") as handle:
        handle.write(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    report = Ingest(store, "codex", [str(path)]).run()[0]
    assert report.status == "unchanged" and report.thread == THREAD
    os.utime(path)   # now it looks changed: the rewrite is found and refused
    report = Ingest(store, "codex", [str(path)]).run()[0]
    assert report.status == "refused" and "rewritten" in report.error


def test_truncated_and_rewritten_files_are_refused_by_name_others_go_on(run, store_dir, tmp_path):
    a = CodexSession("aaaa")
    a.turn("one")
    b = CodexSession("bbbb")
    b.turn("two")
    c = CodexSession("cccc")
    c.turn("three")
    pa, pb, pc = codex_file(tmp_path, a), codex_file(tmp_path, b), codex_file(tmp_path, c)
    assert run("ingest", "codex", tmp_path / "sessions", store=store_dir).code == 0
    pa.write_bytes(a.data()[:-30])                                   # truncated
    pb.write_bytes(b.data().replace(b"two", b"TWO"))                 # rewritten, same size
    c.turn("four")
    pc.write_bytes(c.data())                                         # appended
    r = run("ingest", "codex", tmp_path / "sessions", store=store_dir)
    assert r.code == 1
    # Each refusal by its own message (the words alone are in the test's temporary path).
    assert f"{pa} is shorter ({pa.stat().st_size} bytes) than the " in r.err
    assert "already ingested into codex/aaaa: it was truncated or rewritten; not ingested" in r.err
    assert (f"{pb} differs from what was already ingested into codex/bbbb (it was rewritten or edited, "
            "not appended to); not ingested") in r.err
    assert cat(run, store_dir, "codex/cccc") == c.data()
    assert cat(run, store_dir, "codex/aaaa") == a.data() and cat(run, store_dir, "codex/bbbb") == b.data()


def test_damaged_lines_are_kept_in_the_rollout_and_reported(run, store_dir, tmp_path):
    s = CodexSession()
    turn = s.start(prompt="one")
    bad = s.raw(b"\xff\xfe not json at all\n")
    s.reply("ok")
    s.complete(turn)
    path = codex_file(tmp_path, s)
    r = run("--json", "ingest", "codex", path, store=store_dir)
    assert r.code == 0 and r.json()["files"][0]["skipped_lines"] == [bad]
    assert cat(run, store_dir, THREAD) == path.read_bytes()
    replay = run("--json", "replay", THREAD, store=store_dir).json()
    assert replay["skipped_lines"] == [bad]
    assert run("--json", "rollout", "cat", THREAD, store=store_dir).json()["records"][bad - 1] is None


def test_skipped_lines_are_every_damaged_line_up_to_the_record(run, store_dir, tmp_path):
    """Also those behind the newest compaction, which the reverse scan never reads."""
    from agentcas.harnesses import damaged_lines, replay
    s = CodexSession()
    turn = s.start(prompt="one")
    early = s.raw(b"{damaged\n")
    s.reply("ok")
    s.complete(turn)
    for n in range(300):
        s.turn(f"ask {n}")
    middle = s.raw(b"\xff\xfe\n")
    s.compact()
    s.turn("after")
    late = s.raw(b"[1]\n")
    path = codex_file(tmp_path, s)
    assert run("ingest", "codex", path, store=store_dir).code == 0
    doc = run("--json", "replay", THREAD, store=store_dir).json()
    assert doc["skipped_lines"] == [early, middle, late]
    assert run("--json", "replay", THREAD, "--at", middle - 1, store=store_dir).json()["skipped_lines"] == [early]
    assert run("--json", "replay", THREAD, "--at", early - 1, store=store_dir).json()["skipped_lines"] == []
    store = Store.open(str(store_dir))
    # Ingest left the answer in the cache: replay at the head read only the tail.
    warm, records = replay.replay_records(store, THREAD)
    assert warm["skipped_lines"] == [early, middle, late] and records.loaded_records < len(s.lines) // 4
    # A lost cache costs a scan, not the answer.
    store.backends.local.write(lambda txn: txn.delete("statcache", damaged_lines.DAMAGED_KEY + THREAD.encode()))
    assert replay.replay(store, THREAD)["skipped_lines"] == [early, middle, late]
    assert damaged_lines.read_row(store.backends.local, THREAD)[0].seq == len(s.lines)   # and rebuilds it
    # A checkpoint's prefix, and a fork (another thread, no row of its own yet).
    log = run("--json", "log", THREAD, store=store_dir).json()["checkpoints"]
    first = min(log, key=lambda e: e["history"]["seq"])
    assert run("--json", "replay", first["checkpoint"], store=store_dir).json()["skipped_lines"] == [early]
    assert run("fork", THREAD, "explore", "--at", middle, store=store_dir).code == 0
    assert run("--json", "replay", "explore", store=store_dir).json()["skipped_lines"] == [early, middle]


@pytest.mark.parametrize("new_records", [2, 40])   # the new head shorter than the row's, and longer
def test_a_cached_damaged_row_is_never_applied_to_another_history(run, store_dir, tmp_path, new_records):
    """The row is matched by prefix digest: after a revert and new lines it no longer applies."""
    s = CodexSession()
    s.turn("one")
    bad = s.raw(b"{damaged\n")
    s.turn("two")
    assert run("ingest", "codex", codex_file(tmp_path, s), store=store_dir).code == 0
    assert run("--json", "replay", THREAD, store=store_dir).json()["skipped_lines"] == [bad]
    log = run("--json", "log", THREAD, store=store_dir).json()["checkpoints"]
    before = next(e["checkpoint"] for e in log if e["history"]["seq"] < bad)
    assert run("revert", THREAD, before, store=store_dir).code == 0
    clean = b"".join(CodexSession().lines[:1]) * new_records   # valid records
    assert run("rollout", "append", THREAD, "-", input=clean, store=store_dir).code == 0
    doc = run("--json", "replay", THREAD, "--format", "codex", store=store_dir).json()
    assert doc["skipped_lines"] == [] and doc["at"] > bad
    assert (doc["at"] < len(s.lines)) == (new_records == 2)


@pytest.mark.parametrize("content", [b"", b"\x00\x01\x02\xff" * 1000, b"\x89PNG\r\n\x1a\n\x00\x00binary\n"])
def test_empty_and_binary_files_write_nothing(run, store_dir, tmp_path, content):
    path = tmp_path / "rollout-x.jsonl"
    path.write_bytes(content)
    r = run("--json", "ingest", "codex", path, store=store_dir)
    if b"\n" in content:
        assert r.code == 1 and "not a codex session" in r.err and str(path) in r.err
    else:
        assert r.code == 0 and r.json()["files"][0]["status"] == "waiting"
    assert run("--json", "branch", store=store_dir).json()["threads"] == []


def test_non_utf8_lines_huge_lines_and_unknown_types_are_kept(store, tmp_path):
    s = CodexSession()
    s.raw(b'{"type":"event_msg","payload":{"type":"user_message","message":"caf\xe9"}}\n')  # latin-1
    s.record("world_state", {"full": True, "state": {"x": 1}})
    s.record("response_item", {"type": "brand_new_item", "blob": "x" * (64 * 1024 * 1024 + 1)})
    path = codex_file(tmp_path, s)
    report = Ingest(store, "codex", [str(path)]).run()[0]
    assert report.status == "ingested" and report.skipped_lines == [2]
    assert b"".join(store.history.read(THREAD)) == path.read_bytes()
    assert store.gc.fsck().to_json()["ok"]


def test_fork_lineage_and_what_the_copy_costs(run, store_dir, tmp_path):
    parent = CodexSession("parent-0001")
    parent.turn("one")
    parent.turn("two")
    child = CodexSession("child-0001", forked_from="parent-0001")
    child.copy_lines(parent, 20)
    child.turn("three")
    codex_file(tmp_path, parent)
    codex_file(tmp_path, child)
    assert run("ingest", "codex", tmp_path / "sessions", store=store_dir).code == 0
    tree = run("--json", "lineage", store=store_dir).json()["threads"]
    assert [t["thread"] for t in tree] == ["codex/parent-0001"]
    assert tree[0]["children"][0]["thread"] == "codex/child-0001"
    assert tree[0]["children"][0]["forked_from"]["seq"] == 20
    replay = run("--json", "replay", "codex/child-0001", store=store_dir).json()
    assert replay["thread_id"] == "child-0001"


def test_fork_ingested_before_its_parent_is_linked_once_the_parent_is_stored(run, store_dir, tmp_path):
    parent = CodexSession("parent-0002")
    parent.turn("one")
    child = CodexSession("child-0002", forked_from="parent-0002")
    child.copy_lines(parent)
    assert run("ingest", "codex", codex_file(tmp_path, child), store=store_dir).code == 0
    assert run("ingest", "codex", codex_file(tmp_path, parent), store=store_dir).code == 0
    tree = run("--json", "lineage", store=store_dir).json()["threads"]
    assert [t["thread"] for t in tree] == ["codex/parent-0002"]
    assert tree[0]["children"][0]["thread"] == "codex/child-0002"


def test_thread_option_on_a_codex_fork_keeps_its_link_to_the_parent(run, store_dir, tmp_path):
    parent = CodexSession("parent-0003")
    parent.turn("one")
    parent.turn("two")
    child = CodexSession("child-0003", forked_from="parent-0003")
    child.copy_lines(parent, 20)
    child.turn("three")
    assert run("ingest", "codex", codex_file(tmp_path, parent), store=store_dir).code == 0
    r = run("ingest", "codex", codex_file(tmp_path, child), "--thread", "my-fork", store=store_dir)
    assert r.code == 0, r
    tree = run("--json", "lineage", store=store_dir).json()["threads"]
    assert [t["thread"] for t in tree] == ["codex/parent-0003"]
    fork, = tree[0]["children"]
    assert fork["thread"] == "my-fork" and fork["forked_from"]["seq"] == 20
    assert cat(run, store_dir, "my-fork") == child.data()


def test_files_of_one_session_in_one_run_land_one_after_another(run, store_dir, tmp_path):
    """Two files of one thread in one run (a copy that went on, a resumed session) are taken
    in turn, the later one planned against what the earlier one stored: it appends what it
    has beyond that, as a second run would; a file that differs within the stored part is
    refused by name, and the others land. A link to a file is that file, once."""
    a, other = sample_codex(), CodexSession("other-0001")
    other.turn("unrelated")
    went_on = sample_codex()
    went_on.turn("goes on")
    differs = sample_codex()
    differs.lines[3] = differs.lines[3].replace(b"deploy", b"DEPLOY")
    codex_file(tmp_path, a)
    codex_file(tmp_path, other)
    codex_file(tmp_path, went_on, name="rollout-2026-11-30T22-00-00-went-on.jsonl")
    codex_file(tmp_path, differs, name="rollout-2026-11-30T23-00-00-differs.jsonl")
    day = next(p for p in (tmp_path / "sessions").rglob("*") if p.is_dir() and not any(q.is_dir() for q in p.iterdir()))
    os.symlink(next(day.glob("*other-0001.jsonl")), day / "rollout-2026-11-30T23-30-00-link.jsonl")
    r = run("--json", "ingest", "codex", tmp_path / "sessions", store=store_dir)
    assert r.code == 1
    statuses = {f["path"].rsplit("/", 1)[-1]: f["status"] for f in r.json()["files"]}
    assert statuses["rollout-2026-11-30T22-00-00-went-on.jsonl"] == "ingested"
    assert statuses["rollout-2026-11-30T23-00-00-differs.jsonl"] == "refused"
    assert sorted(statuses.values()) == ["ingested", "ingested", "ingested", "refused"]   # the link: no report
    assert cat(run, store_dir, THREAD) == went_on.data()
    assert cat(run, store_dir, "codex/other-0001") == other.data()
    assert run("fsck", store=store_dir).code == 0


def test_claude_sessions_and_subagent_files_in_both_layouts(run, store_dir, tmp_path):
    project = tmp_path / "projects" / "-repo"
    project.mkdir(parents=True)
    main = ClaudeSession("s-1")
    main.prompt("one")
    main.say("a")
    main.sidechain("inline task", "inline answer")
    main.prompt("two")
    main.say("b")
    (project / "s-1.jsonl").write_bytes(main.data())
    old = ClaudeSession("s-1", agent_id="a111")
    old.prompt("old layout task", isSidechain=True)
    (project / "agent-a111.jsonl").write_bytes(old.data())
    new = ClaudeSession("s-1", agent_id="b222")
    new.prompt("new layout task", isSidechain=True)
    (project / "s-1" / "subagents").mkdir(parents=True)
    (project / "s-1" / "subagents" / "agent-b222.jsonl").write_bytes(new.data())
    (project / "s-1" / "subagents" / "agent-b222.meta.json").write_text('{"toolUseId": "t"}')
    r = run("--json", "ingest", "claude", tmp_path / "projects", store=store_dir)
    assert r.code == 0, r
    names = sorted(f["thread"] for f in r.json()["files"])
    assert names == ["claude/s-1", "claude/s-1/agents/a111", "claude/s-1/agents/b222"]
    tree = run("--json", "lineage", store=store_dir).json()["threads"]
    assert [t["thread"] for t in tree] == ["claude/s-1"]
    assert sorted(c["thread"] for c in tree[0]["children"]) == names[1:]
    replay = run("--json", "replay", "claude/s-1", store=store_dir).json()
    assert len(replay["sidechains"]) == 1 and replay["messages"][-1]["content"][0]["text"] == "b"
    log = run("--json", "log", "claude/s-1", store=store_dir).json()["checkpoints"]
    prompt_two = next(n for n, line in enumerate(main.lines, 1) if b'"two"' in line)
    assert sorted(e["history"]["seq"] for e in log) == [prompt_two, len(main.lines)]
    assert "one" in next(e["reason"] for e in log if e["history"]["seq"] == prompt_two)


def test_thread_option_names_one_file_only(run, store_dir, tmp_path):
    a, b = CodexSession("a1"), CodexSession("b1")
    pa, _ = codex_file(tmp_path, a), codex_file(tmp_path, b)
    assert run("ingest", "codex", pa, "--thread", "mine", store=store_dir).code == 0
    assert cat(run, store_dir, "mine") == a.data()
    r = run("ingest", "codex", tmp_path / "sessions", "--thread", "x", store=store_dir)
    assert r.code == 2 and "--thread" in r.err
    assert run("ingest", "codex", tmp_path / "nope", store=store_dir).code == 1


def test_replay_of_a_thread_in_neither_format_names_format(run, store_dir):
    assert run("rollout", "append", "plain", "-", input='{"a": 1}\n{"b": 2}\n', store=store_dir).code == 0
    r = run("replay", "plain", store=store_dir)
    assert r.code == 1 and "--format" in r.err and "neither" in r.err
    assert run("--json", "replay", "plain", "--format", "codex", store=store_dir).json()["items"] == []


def test_replay_text_is_a_transcript_with_line_numbers(run, store_dir, tmp_path):
    s = sample_codex()
    codex_file(tmp_path, s)
    run("ingest", "codex", tmp_path / "sessions", store=store_dir)
    r = run("replay", THREAD, store=store_dir)
    assert r.code == 0 and "deploy to staging" in r.out and "turn context (line" in r.out
    first_item_line = next(n for n, line in enumerate(s.lines, 1) if b'"compacted"' in line)
    assert f"{first_item_line:>7}  user" in r.out
    assert all(len(line) < 200 for line in r.out.splitlines())
    at = run("--json", "replay", THREAD, "--at", "5", store=store_dir).json()
    assert at["at"] == 5
    assert run("replay", THREAD, "--at", "100000", store=store_dir).code == 2


def test_replay_text_never_sends_a_logs_control_characters_to_the_terminal(run, store_dir, tmp_path):
    """Escape sequences, bells, backspaces, C1 controls and bidi overrides in a log (a prompt,
    the turn context's model and cwd) are shown escaped, and every line stays bounded."""
    hostile = "hi \x1b]0;pwned\x07 \x1b[31mRED\x1b[0m \x08\x08XX \x9b2J \u202etxt.exe"
    s = CodexSession()
    s.turn(hostile, "ok", model="gpt\x1b[2J" + "m" * 300)
    s.record("turn_context", {"cwd": "/r\n\nFAKE LINE\x1b[2J", "approval_policy": "on-request\x07",
                              "sandbox_policy": {"type": "read-only"}, "model": "m\x9b", "summary": "auto"})
    s.prompt(hostile)
    codex_file(tmp_path, s)
    assert run("ingest", "codex", tmp_path / "sessions", store=store_dir).code == 0
    r = run("replay", THREAD, store=store_dir)
    assert r.code == 0 and "\\x1b]0;pwned\\x07" in r.out and "\\u202etxt.exe" in r.out
    shown = r.out.replace("\n", "")
    assert not [c for c in shown if ord(c) < 0x20 or 0x7f <= ord(c) <= 0x9f or c in "\u202a\u202b\u202c\u202d\u202e"]
    assert "FAKE LINE" not in [line.strip() for line in r.out.splitlines()]
    assert all(len(line) < 400 for line in r.out.splitlines())


def _terminal_controls(text: str) -> list[str]:
    return [c for c in text.replace("\n", "") if ord(c) < 0x20 or 0x7f <= ord(c) <= 0x9f
            or c in "\u061c\u200e\u200f\u2028\u2029\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"]


def test_ingest_never_sends_a_file_names_or_a_logs_controls_to_the_terminal(run, store_dir, tmp_path):
    """File names holding an OSC title change, a one-byte CSI, a bidi override or an SGR
    sequence are shown escaped in ingest's report and refusals (they went out raw, and
    click stripped the SGR one when piped, naming a file that does not exist); a session id
    that would make a thread name holding a C1 control or a bidi override is refused by
    name like one holding a C0 control, and the other files land."""
    names = ["rollout-a\x1b]0;T\x07.jsonl", "rollout-b\u009b2J\u202e.jsonl", "rollout-c\x1b[5m.jsonl"]
    for n, name in enumerate(names):
        codex_file(tmp_path, CodexSession(f"name-{n:04d}"), name=name)
    codex_file(tmp_path, CodexSession("not-text"), name="rollout-d\x1b]0;X\x07.jsonl").write_bytes(b'{"a": 1}\n')
    r = run("ingest", "codex", tmp_path / "sessions", store=store_dir)
    assert r.code == 1
    assert not _terminal_controls(r.out) and not _terminal_controls(r.err), (r.out, r.err)
    assert "rollout-c\\x1b[5m.jsonl" in r.out and "rollout-b\\x9b2J\\u202e.jsonl" in r.out
    assert "refused: " in r.err and "rollout-d\\x1b]0;X\\x07.jsonl" in r.err
    assert sorted(t.thread for t in Store.open(str(store_dir)).threads.list()) == [f"codex/name-{n:04d}" for n in range(3)]
    claude = tmp_path / "claude"
    for n, session_id in enumerate(["ab\u202ecd", "ab\u009b2Jcd", "ab\u2028cd", "plain-0001"]):
        c = ClaudeSession(session_id)
        c.prompt("hi")
        (claude / f"p{n}").mkdir(parents=True)
        (claude / f"p{n}" / f"s{n}.jsonl").write_bytes(c.data())
    r = run("ingest", "claude", claude, store=store_dir)
    assert r.code == 1 and r.err.count("invalid thread name") == 3, r.err
    assert not _terminal_controls(r.out) and not _terminal_controls(r.err)
    assert "claude/plain-0001" in run("branch", store=store_dir).out
    assert not _terminal_controls(run("lineage", store=store_dir).out)
    assert Store.open(str(store_dir)).gc.fsck().ok


def test_sigkill_during_ingest_leaves_whole_lines_and_a_rerun_finishes(store_dir, tmp_path):
    s = CodexSession()
    for n in range(300):
        s.turn(f"ask {n} " + "x" * 2000, "y" * 3000)
    path = codex_file(tmp_path, s)
    for delay in (0.3, 0.6, 1.0):
        proc = subprocess.Popen([AGENTCAS, "--store", str(store_dir), "ingest", "codex", str(path)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        store = Store.open(str(store_dir))
        try:
            data = b"".join(store.history.read(THREAD))
        except Exception:  # noqa: BLE001 - the thread may not exist yet
            data = b""
        assert path.read_bytes().startswith(data) and (not data or data.endswith(b"\n"))
        assert store.gc.fsck().to_json()["ok"]
    r = subprocess.run([AGENTCAS, "--store", str(store_dir), "ingest", "codex", str(path)], capture_output=True)
    assert r.returncode == 0, r.stderr
    store = Store.open(str(store_dir))
    assert b"".join(store.history.read(THREAD)) == path.read_bytes()
    assert store.gc.fsck().to_json()["ok"]


def test_ingest_racing_a_writer_that_writes_partial_lines(store, tmp_path):
    s = CodexSession()
    path = codex_file(tmp_path, s)
    lines = []
    for n in range(60):
        extra = CodexSession(meta=False)
        extra.turn(f"ask {n}")
        lines += extra.lines
    done = threading.Event()

    def writer():
        with open(path, "ab") as handle:
            for line in lines:
                half = len(line) // 2
                handle.write(line[:half])
                handle.flush()
                time.sleep(0.0005)
                handle.write(line[half:])
                handle.flush()
        done.set()

    thread = threading.Thread(target=writer)
    thread.start()
    while not done.is_set():
        for report in Ingest(store, "codex", [str(path)]).run():
            assert report.status != "refused", report.error
    thread.join()
    Ingest(store, "codex", [str(path)]).run()
    assert b"".join(store.history.read(THREAD)) == path.read_bytes()


def test_a_turn_end_codex_cannot_read_is_no_checkpoint(run, store_dir, tmp_path):
    """A `task_complete` whose `turn_id` is not a string does not deserialize, so Codex (and
    replay) skip it: the turn is still open there, and ingest makes no turn checkpoint
    for it (it made "codex turn ? complete"); the turn's real end makes one."""
    s = CodexSession()
    s.turn("one", "did one")
    turn = s.start(prompt="two")
    s.reply("did two")
    s.event("task_complete", turn_id=True, last_agent_message=None)
    s.complete(turn)
    codex_file(tmp_path, s)
    assert run("ingest", "codex", tmp_path / "sessions", store=store_dir).code == 0
    log = run("--json", "log", THREAD, store=store_dir).json()["checkpoints"]
    assert sorted(e["history"]["seq"] for e in log) == [next(n for n, line in enumerate(s.lines, 1)
                                                             if b"task_complete" in line), len(s.lines)]
    assert not any("turn ?" in e["reason"] for e in log)


def test_a_claude_image_prompt_closes_a_turn_and_an_interruption_marker_does_not(run, store_dir, tmp_path):
    """A prompt that is only a pasted image is the user's prompt (it was folded into the
    turn before it); the `[Request interrupted by user for tool use]` record Claude Code
    writes when the user presses Esc is not (it closed a turn and became the next reason)."""
    project = tmp_path / "projects" / "-repo"
    project.mkdir(parents=True)
    c = ClaudeSession("s-img")
    c.prompt("one")
    c.say("a")
    c.prompt([{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0K"}}])
    c.tool()
    c.prompt([{"type": "text", "text": "[Request interrupted by user for tool use]"}])
    c.prompt("three")
    c.say("c")
    (project / "s-img.jsonl").write_bytes(c.data())
    assert run("ingest", "claude", project, store=store_dir).code == 0
    log = run("--json", "log", "claude/s-img", store=store_dir).json()["checkpoints"]
    lines = {n: line for n, line in enumerate(c.lines, 1)}
    image = next(n for n, line in lines.items() if b'"image"' in line)
    three = next(n for n, line in lines.items() if b'"three"' in line)
    reasons = {e["history"]["seq"]: e["reason"] for e in log}
    assert sorted(reasons) == [image, three, len(c.lines)], reasons
    assert "one" in reasons[image] and "[image]" in reasons[three] and "interrupted" not in reasons[three]


def test_claude_file_without_a_session_id_is_refused_and_nothing_written(run, store_dir, tmp_path):
    path = tmp_path / "notes.jsonl"
    path.write_bytes(b'{"type":"summary","summary":"x","leafUuid":"u"}\n{"hello":1}\n')
    r = run("ingest", "claude", path, store=store_dir)
    assert r.code == 1 and str(path) in r.err and "not a claude session" in r.err
    assert run("--json", "branch", store=store_dir).json()["threads"] == []


def wait_until_stored(store_dir, thread: str, data: bytes, timeout: float = 30) -> None:
    """Poll until `thread`'s rollout is `data` (a --watch running beside the test), or time out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if b"".join(Store.open(str(store_dir)).history.read(thread)) == data:
                return
        except Exception:  # noqa: BLE001 - not ingested yet
            pass
        time.sleep(0.05)


def test_watch_exits_zero_on_sigint(store_dir, tmp_path):
    s = CodexSession()
    s.turn("one")
    codex_file(tmp_path, s)
    proc = subprocess.Popen([AGENTCAS, "--store", str(store_dir), "--json", "ingest", "codex",
                             str(tmp_path / "sessions"), "--watch"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_until_stored(store_dir, THREAD, s.data())
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    import json
    assert json.loads(out)["watch"]["appended"] == len(s.lines)


def test_watch_names_a_refused_path_once_not_every_pass(store_dir, tmp_path):
    """A path that stays refused (missing, not a session) is reported when first seen, not
    again at every pass (4 a second); a FIFO is named as what it is."""
    s = CodexSession()
    s.turn("one")
    codex_file(tmp_path, s)
    fifo = tmp_path / "pipe.jsonl"
    os.mkfifo(fifo)
    proc = subprocess.Popen([AGENTCAS, "--store", str(store_dir), "ingest", "codex", str(tmp_path / "sessions"),
                             str(tmp_path / "missing.jsonl"), str(fifo), "--watch"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_until_stored(store_dir, THREAD, s.data())
    time.sleep(0.8)   # three passes or more
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    lines = err.decode().splitlines()
    assert len([line for line in lines if "missing.jsonl" in line]) == 1, lines
    assert [line for line in lines if "pipe.jsonl" in line] == [
        f"agentcas: error: refused: not a regular file or directory: {fifo}"]


def test_watch_follows_new_lines_and_sigterm_exits_zero_with_everything_committed(store_dir, tmp_path):
    s = CodexSession()
    s.turn("one")
    path = codex_file(tmp_path, s)
    proc = subprocess.Popen([AGENTCAS, "--store", str(store_dir), "ingest", "codex", str(tmp_path / "sessions"),
                             "--watch"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        def stored_bytes():
            try:
                return b"".join(Store.open(str(store_dir)).history.read(THREAD))
            except Exception:  # noqa: BLE001 - not ingested yet
                return b""

        deadline = time.monotonic() + 30
        while stored_bytes() != s.data() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert stored_bytes() == s.data()
        s.turn("two")
        path.write_bytes(s.data())
        deadline = time.monotonic() + 30
        while stored_bytes() != s.data() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert stored_bytes() == s.data()
        # A new session file in the watched directory is picked up too.
        other = CodexSession("other-1")
        other.turn("x")
        codex_file(tmp_path, other)
        s.turn("three")
        path.write_bytes(s.data())
        time.sleep(0.5)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    store = Store.open(str(store_dir))
    assert b"".join(store.history.read(THREAD)) == s.data()
    assert b"".join(store.history.read("codex/other-1")) == other.data()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__]))


def test_a_fork_of_a_fork_in_one_run_is_linked_where_it_copied(run, store_dir, tmp_path):
    """Forks land after their parents, a fork of a fork after the fork it copies, so its
    fork point is measured against that fork as stored (three runs or one: the same)."""
    root = CodexSession("root-0001")
    root.turn("one")
    root.turn("two")
    middle = CodexSession("middle-0001", forked_from="root-0001")
    middle.copy_lines(root, 16)
    middle.turn("three")
    leaf = CodexSession("leaf-0001", forked_from="middle-0001")
    leaf.copy_lines(middle)
    leaf.turn("four")
    for session in (root, middle, leaf):
        codex_file(tmp_path, session)
    assert run("ingest", "codex", tmp_path / "sessions", store=store_dir).code == 0
    tree = run("--json", "lineage", store=store_dir).json()["threads"]
    middle_node = tree[0]["children"][0]
    assert middle_node["thread"] == "codex/middle-0001" and middle_node["forked_from"]["seq"] == 16
    assert middle_node["children"][0]["thread"] == "codex/leaf-0001"
    assert middle_node["children"][0]["forked_from"]["seq"] == len(middle.lines)


def test_the_stat_shortcut_holds_only_for_the_thread_the_run_would_use(run, store_dir, tmp_path):
    """An unchanged file is skipped on its stat only if it went into the thread this run
    names: `--thread Y` after `--thread X`, or no --thread after one, ingests it again."""
    path = codex_file(tmp_path, sample_codex())
    assert run("ingest", "codex", path, "--thread", "named-x", store=store_dir).code == 0
    assert run("ingest", "codex", path, "--thread", "named-y", store=store_dir).code == 0
    assert run("ingest", "codex", path, store=store_dir).code == 0
    names = {t["thread"] for t in run("--json", "branch", store=store_dir).json()["threads"]}
    assert {"named-x", "named-y", THREAD} <= names
    assert cat(run, store_dir, "named-y") == cat(run, store_dir, THREAD) == path.read_bytes()
    again = run("--json", "ingest", "codex", path, "--thread", "named-y", store=store_dir).json()
    assert [f["status"] for f in again["files"]] == ["unchanged"]


def test_the_stat_shortcut_holds_only_for_the_harness_that_wrote_the_row(run, store_dir, tmp_path):
    """`ingest claude` of a Codex file is refused (not a Claude session) whether or not
    `ingest codex` read that file before: the stat row of the codex run does not answer
    for a claude run (it answered "codex/...: unchanged", exit 0, for the same file a copy
    of which was refused)."""
    path = codex_file(tmp_path, sample_codex())
    assert run("ingest", "codex", path, store=store_dir).code == 0
    r = run("--json", "ingest", "claude", path, store=store_dir)
    assert r.code == 1 and "not a claude" in r.err.lower(), (r.out, r.err)
    assert [f["status"] for f in r.json()["files"]] == ["refused"]
    again = run("--json", "ingest", "codex", path, store=store_dir).json()
    assert [f["status"] for f in again["files"]] == ["unchanged"]
    assert cat(run, store_dir, THREAD) == path.read_bytes()


def test_a_claude_transcript_with_only_its_first_snapshot_waits(run, store_dir, tmp_path):
    """Claude writes a `file-history-snapshot` (no sessionId) before the first prompt: such
    a file waits, nothing stored, and is ingested once the prompt is there."""
    project = tmp_path / "projects" / "-repo"
    project.mkdir(parents=True)
    snapshot = dumps({"type": "file-history-snapshot", "messageId": "m0", "snapshot": {"trackedFileBackups": {}},
                      "isSnapshotUpdate": False})
    path = project / "s-snap.jsonl"
    path.write_bytes(snapshot)
    r = run("--json", "ingest", "claude", path, store=store_dir)
    assert r.code == 0 and [f["status"] for f in r.json()["files"]] == ["waiting"]
    assert run("--json", "branch", store=store_dir).json()["threads"] == []
    session = ClaudeSession("s-snap")
    session.prompt("hello")
    path.write_bytes(snapshot + session.data())
    r = run("--json", "ingest", "claude", path, store=store_dir)
    assert r.code == 0 and [f["status"] for f in r.json()["files"]] == ["ingested"]
    assert cat(run, store_dir, "claude/s-snap") == path.read_bytes()


def test_a_first_record_longer_than_the_identity_head_is_read_to_its_end(run, store_dir, tmp_path):
    """The thread id is read from complete lines, however long the first one is (a prompt
    carrying a 33 MiB image): the file is ingested, not left waiting as a partial line."""
    project = tmp_path / "projects" / "-repo"
    project.mkdir(parents=True)
    session = ClaudeSession("s-big")
    session.prompt("look: " + "A" * (33 * 1024 * 1024))
    session.say("I see it")
    path = project / "s-big.jsonl"
    path.write_bytes(session.data())
    r = run("--json", "ingest", "claude", path, store=store_dir)
    assert r.code == 0 and [(f["status"], f["thread"]) for f in r.json()["files"]] == [("ingested", "claude/s-big")]


def test_a_file_name_or_prompt_that_is_not_text_costs_no_other_file(run, store_dir, tmp_path):
    """A checkpoint reason is made from a prompt and a file name; one holding a lone
    surrogate (a JSON `\\ud83d` escape, a file name's undecodable bytes) is written escaped,
    so that file lands and so do the others (it failed the whole run with exit 4)."""
    good = codex_file(tmp_path, CodexSession("good-0001"))
    odd = CodexSession("odd-0001")
    turn = odd.start(prompt="x")
    odd.lines[-1] = odd.lines[-1].replace(b'"x"', b'"bad \\\\ud83d prompt"')
    odd.reply("y")
    odd.complete(turn)
    odd.start(prompt="unfinished")   # the run ends mid-turn: its end-of-read reason names the file
    name = os.fsdecode(b"rollout-2026-11-30T21-00-00-odd-\xff.jsonl")
    odd_path = codex_file(tmp_path, odd, name=name)
    proc = subprocess.run([AGENTCAS, "--store", str(store_dir), "--json", "ingest", "codex",
                           str(tmp_path / "sessions")], capture_output=True)   # bytes: the name is not UTF-8
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout.decode("utf-8", "surrogateescape"))
    assert sorted(f["status"] for f in doc["files"]) == ["ingested", "ingested"]
    reasons = [c["reason"] for c in run("--json", "log", "codex/odd-0001", store=store_dir).json()["checkpoints"]]
    assert any("\\udcff" in reason for reason in reasons), reasons
    assert cat(run, store_dir, "codex/odd-0001") == odd_path.read_bytes() and good.exists()


def test_an_ingest_that_another_ingest_overtook_plans_again_instead_of_refusing(store_dir, tmp_path, monkeypatch):
    """Two ingests of one directory at once: the one whose threads the other moved while it
    read its files plans them again against what the other stored (they are then unchanged,
    or append what the other did not have), instead of refusing them with exit 1."""
    sessions = [CodexSession(f"race-{n:04d}") for n in range(3)]
    for n, s in enumerate(sessions):
        s.turn(f"task {n}")
        codex_file(tmp_path, s)
    store = Store.open(str(store_dir))
    overtaken = []
    real_land = Ingest._land_batch

    def land_after_another_run(self, batch):
        if not overtaken:   # another ingest lands first, between this one's plan and its landing
            overtaken.append(None)
            overtaken[0] = Ingest(Store.open(str(store_dir)), "codex", [str(tmp_path / "sessions")]).run()
        return real_land(self, batch)
    monkeypatch.setattr(Ingest, "_land_batch", land_after_another_run)
    reports = Ingest(store, "codex", [str(tmp_path / "sessions")]).run()
    assert {r.status for r in overtaken[0]} == {"ingested"}
    assert [r.status for r in reports] == ["unchanged"] * 3, [(r.status, r.error) for r in reports]
    for s in sessions:
        assert b"".join(store.history.read(f"codex/{s.thread_id}")) == s.data()
    assert store.gc.fsck().to_json()["ok"]


def test_a_turn_left_open_keeps_its_prompt_when_this_machine_has_no_row_for_the_file(run, store_dir, tmp_path):
    """A run that ends mid-turn stores an end-of-read checkpoint; a later run that has no
    stat-cache row for the file (it moved, as Codex archives sessions; another machine)
    finds where the open turn started from the newest turn-boundary checkpoint, not from
    that end-of-read one, so the turn's checkpoint still names its prompt."""
    s = CodexSession()
    s.turn("first task", "done")
    turn = s.start(prompt="the second task")
    s.reply("working on it")
    half = len(s.lines)
    s.complete(turn)
    first = tmp_path / "first" / "rollout-2026-11-30T21-30-12-x.jsonl"
    first.parent.mkdir()
    first.write_bytes(b"".join(s.lines[:half]))
    assert run("ingest", "codex", first, store=store_dir).code == 0
    moved = tmp_path / "archived" / "rollout-2026-11-30T21-30-12-x.jsonl"
    moved.parent.mkdir()
    moved.write_bytes(s.data())
    assert run("ingest", "codex", moved, store=store_dir).code == 0
    reasons = [c["reason"] for c in run("--json", "log", THREAD, store=store_dir).json()["checkpoints"]]
    assert reasons[0].startswith("codex turn ") and reasons[0].endswith(": the second task"), reasons
