"""The real `agentcas` command on rollouts and moves on threads, the way a user runs it.

Bad inputs get one clear line, the right exit code and an unchanged store (every raw
LMDB row compared); concurrent writers lose nothing; SIGKILL mid-append or mid-fork
leaves the old or the new history, never a partial one; a corrupt chunk is named.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from agentcas import Store
from agentcas.lineage import rollout
from agentcas.lineage.closure import Walker
from agentcas.refs import threads

from support.cli import AGENTCAS, run_cli
from support.store_state import store_rows, views


def without_pins(rows: dict) -> dict:
    return {k: v for k, v in rows.items() if k[0] != "pins"}


@pytest.fixture
def sdir(tmp_path) -> Path:
    """A store created and closed again, so raw LMDB reads and subprocesses see it alone."""
    path = tmp_path / "store"
    store, _ = Store.init(str(path))
    store.environment.close()
    return path


@contextmanager
def opened(path: Path):
    store = Store.open(str(path))
    try:
        yield store
    finally:
        store.environment.close()


def jsonl(*docs) -> bytes:
    return b"".join(json.dumps(d).encode() + b"\n" for d in docs)


def cli(sdir, *args, input=b""):
    """The real command; stdout and stderr as bytes."""
    return run_cli(*args, store=sdir, input=input)


def append(sdir, thread: str, data: bytes) -> None:
    """Set-up through the API in this process (closed again), to keep the tests quick."""
    with opened(sdir) as store:
        store.history.append(thread, data)


# --- rollout append -----------------------------------------------------------------------

@pytest.mark.parametrize("bad, why", [
    (b"[1, 2, 3]", "a record must be a JSON object, got list"),
    (b"17", "got int"),
    (b'"just a string"', "got str"),
    (b'{"x": NaN}', "not a JSON object"),
    (b'{"x": "\xc3\x28"}', "not a JSON object"),
])
def test_append_refuses_a_bad_line_whole_and_names_it(sdir, bad, why):
    append(sdir, "t", jsonl({"a": 0}))
    before = store_rows(sdir)
    result = cli(sdir, "rollout", "append", "t", "-", input=jsonl({"a": 1}, {"a": 2}) + bad + b"\n" + jsonl({"a": 4}))
    assert result.code == 1, result
    assert result.err.decode().strip().startswith("agentcas: error: line 3: "), result
    assert why in result.err.decode() and result.err.count(b"\n") == 1
    assert without_pins(store_rows(sdir)) == without_pins(before)


def test_append_from_a_file_and_from_stdin(sdir, tmp_path):
    source = tmp_path / "batch.jsonl"
    source.write_bytes(jsonl({"a": 1}, {"a": 2}))
    result = cli(sdir, "--json", "rollout", "append", "t", source)
    assert result.code == 0 and result.json()["appended"] == 2 and result.json()["first_seq"] == 0
    result = cli(sdir, "rollout", "append", "t", input=b'{"a": 3}')  # stdin, no final newline
    assert result.code == 0 and b"seq 2..2" in result.out
    assert cli(sdir, "rollout", "cat", "t").out == jsonl({"a": 1}, {"a": 2}, {"a": 3})
    result = cli(sdir, "rollout", "append", "t", tmp_path / "missing.jsonl")
    assert result.code == 1 and b"cannot read" in result.err


def test_concurrent_appenders_lose_and_duplicate_nothing(sdir):
    code = """
        import json, sys
        from agentcas import Store
        store = Store.open(sys.argv[1])
        who = sys.argv[2]
        for i in range(20):
            batch = "".join(json.dumps({"who": who, "i": i, "k": k}) + "\\n" for k in range(i % 3 + 1))
            store.history.append("shared", batch.encode())
    """
    procs = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), str(sdir), f"p{n}"],
                              stderr=subprocess.PIPE) for n in range(4)]
    for proc in procs:
        assert proc.wait(timeout=120) == 0, proc.stderr.read()
    out = cli(sdir, "rollout", "cat", "shared").out
    records = [json.loads(line) for line in out.splitlines()]
    expected = sorted((f"p{n}", i, k) for n in range(4) for i in range(20) for k in range(i % 3 + 1))
    assert sorted((r["who"], r["i"], r["k"]) for r in records) == expected
    # Each batch is contiguous, and each writer's batches are in its order.
    for n in range(4):
        mine = [(r["i"], r["k"]) for r in records if r["who"] == f"p{n}"]
        assert mine == sorted(mine)
    with opened(sdir) as store:
        state = store.threads.get("shared")
        assert state.history.seq == len(expected)
        appends = [e for e in [item.to_json() for item in store.threads.reflog("shared")] if e["action"] == "append"]
        assert len(appends) == 80
        seqs = sorted(e["new"]["history"]["seq"] for e in appends)
        assert len(set(seqs)) == 80 and seqs[-1] == len(expected)


# --- rollout cat --------------------------------------------------------------------------

def test_cat_ranges_are_exact_and_bad_ranges_clear(sdir):
    docs = [{"i": i, "text": "ü" * i} for i in range(12)]
    append(sdir, "t", jsonl(*docs))
    lines = jsonl(*docs).splitlines(keepends=True)
    assert cli(sdir, "rollout", "cat", "t").out == b"".join(lines)
    assert cli(sdir, "rollout", "cat", "t", "--from", "3", "--to", "7").out == b"".join(lines[3:7])
    assert cli(sdir, "rollout", "cat", "t", "--from", "12").out == b""
    assert cli(sdir, "rollout", "cat", "t", "--to", "12").out == b"".join(lines)
    doc = cli(sdir, "--json", "rollout", "cat", "t", "--from", "10").json()
    assert doc["records"] == docs[10:]
    for args, code, message in [(["--from", "13"], 2, b"beyond the end of the history (12 records)"),
                                (["--to", "99"], 2, b"--to 99 is beyond the end of the history (12 records)"),
                                (["--from", "-1"], 2, b"must not be negative"),
                                (["--from", "x"], 2, b"x")]:
        result = cli(sdir, "rollout", "cat", "t", *args)
        assert (result.code, result.out) == (code, b""), (args, result)
        assert result.err.startswith(b"agentcas: error: ") and message in result.err
    assert cli(sdir, "rollout", "cat", "nobody").code == 1


# --- commit --rollout ---------------------------------------------------------------------

def test_commit_rollout_ingests_only_complete_new_lines(sdir, tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "task.md").write_text("task\n")
    log = tmp_path / "rollout.jsonl"
    log.write_bytes(jsonl({"n": 0}, {"n": 1}, {"n": 2}))
    first = cli(sdir, "--json", "commit", ws, "-m", "one", "--rollout", log)
    assert first.code == 0 and first.json()["appended_records"] == 3
    with open(log, "ab") as handle:  # two new lines and one still being written
        handle.write(jsonl({"n": 3}, {"n": 4}) + b'{"n": 5, "partial')
    second = cli(sdir, "--json", "commit", ws, "-m", "two", "--rollout", log)
    assert second.code == 0 and second.json()["appended_records"] == 2
    assert second.json()["history"]["seq"] == 5
    with open(log, "ab") as handle:
        handle.write(b'": true}\n')
    third = cli(sdir, "--json", "commit", ws, "-m", "three", "--rollout", log)
    assert third.json()["appended_records"] == 1
    assert cli(sdir, "rollout", "cat", "main").out == log.read_bytes()
    log_text = cli(sdir, "log", "main").out.decode()
    assert "seq       6" in log_text and "seq       5" in log_text and "seq       3" in log_text

    # The part already stored was rewritten, truncated or edited: refused, nothing changes.
    original = log.read_bytes()
    before = store_rows(sdir)
    cases = {
        "edited first line": original.replace(b'{"n": 0}', b'{"n": 9}'),
        "edited last line": original.replace(b'"partial": true', b'"partial": fals'),
        "truncated": original[:-20],
    }
    for label, content in cases.items():
        log.write_bytes(content + jsonl({"n": 6}))
        result = cli(sdir, "commit", ws, "-m", label, "--rollout", log)
        assert result.code == 1, (label, result)
        assert b"nothing was committed" in result.err, (label, result)
        content_size = len(content) + len(jsonl({"n": 6}))
        said = (f"rollout file {log} is shorter ({content_size} bytes) than the {len(original)} bytes already "
                "stored for thread 'main': it was truncated or rewritten" if label == "truncated" else
                f"rollout file {log} differs from the history already stored for thread 'main' (it was "
                "rewritten or edited)")
        assert result.err.decode() == f"agentcas: error: {said}; nothing was committed\n", (label, result)
        assert without_pins(store_rows(sdir)) == without_pins(before), label

    # A bad JSON line in the new tail is named by its line number in the file.
    log.write_bytes(original + jsonl({"n": 6}) + b"[7]\n")
    result = cli(sdir, "commit", ws, "-m", "bad tail", "--rollout", log)
    assert result.code == 1 and b"line 8: " in result.err, result
    assert without_pins(store_rows(sdir)) == without_pins(before)


# --- fork ---------------------------------------------------------------------------------

def test_fork_cli_bad_at_and_existing_name(sdir):
    append(sdir, "main", jsonl(*({"i": i} for i in range(5))))
    rows = store_rows(sdir)
    ok = cli(sdir, "fork", "main", "f", "--at", "3")
    assert ok.code == 0 and b"Forked f from main at seq 3" in ok.out
    after = store_rows(sdir)
    changed = {key for key in rows.keys() | after.keys() if rows.get(key) != after.get(key)}
    assert {table for table, _ in changed} <= {"refs", "reflog", "meta"}  # no object: one position
    assert len([key for key in changed if key[0] != "meta"]) == 2
    before = store_rows(sdir)
    for args, code, message in [(["--at", "6"], 2, b"beyond the end of the history of 'main' (5 records)"),
                                (["--at", "-1"], 2, b"-1"),
                                (["--at", "three"], 2, b"three")]:
        result = cli(sdir, "fork", "main", "g", *args)
        assert result.code == code, (args, result)
        assert result.err.startswith(b"agentcas: error: ") and message in result.err
    result = cli(sdir, "fork", "main", "f")
    assert result.code == 3 and b"already exists" in result.err
    assert without_pins(store_rows(sdir)) == without_pins(before)
    assert cli(sdir, "rollout", "cat", "f").out == jsonl(*({"i": i} for i in range(3)))


# --- revert, diff, lineage ----------------------------------------------------------------

@pytest.fixture
def history(sdir, tmp_path):
    """main: c1 (2 records, a.txt), c2 (4 records, a.txt changed, b.txt); fork 'side' at 3."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("one\n")
    with opened(sdir) as store:
        store.history.append("main", jsonl({"i": 0}, {"i": 1}))
        c1 = store.checkpoints.commit(str(ws), "c1").to_json()["checkpoint"]
        (ws / "a.txt").write_text("one two\n")
        (ws / "b.txt").write_text("bbb\n")
        store.history.append("main", jsonl({"i": 2}, {"i": 3}))
        c2 = store.checkpoints.commit(str(ws), "c2").to_json()["checkpoint"]
        store.threads.fork("main", "side", at=3)
    return c1, c2


def test_revert_cli_notes_expect_and_reflog(sdir, history):
    c1, c2 = history
    before = store_rows(sdir)
    stale = cli(sdir, "revert", "main", c1, "--expect", c1)
    assert stale.code == 3 and b"nothing was changed" in stale.err
    assert without_pins(store_rows(sdir)) == without_pins(before)
    result = cli(sdir, "revert", "main", c1[:10], "--expect", "main")
    assert result.code == 0, result
    assert b"agentcas: note: revert moves the thread's pointer only" in result.err
    assert b"not undone" in result.err and b"unrelated" not in result.err
    assert b"Reverted main to " + c1[:12].encode() in result.out
    assert cli(sdir, "rollout", "cat", "main").out == jsonl({"i": 0}, {"i": 1})
    assert cli(sdir, "rollout", "append", "main", input=jsonl({"diverged": True})).code == 0
    assert cli(sdir, "rollout", "cat", "main").out == jsonl({"i": 0}, {"i": 1}, {"diverged": True})
    # The old head: THREAD@{1} is the state before the append, @{2} before the revert.
    assert cli(sdir, "rollout", "cat", "main@{2}").out == jsonl({"i": 0}, {"i": 1}, {"i": 2}, {"i": 3})
    assert cli(sdir, "branch", "old", "main@{2}").code == 0
    assert cli(sdir, "rollout", "cat", "old").out == jsonl({"i": 0}, {"i": 1}, {"i": 2}, {"i": 3})
    reflog = cli(sdir, "reflog", "main").out.decode()
    assert "revert" in reflog


def test_revert_to_an_unrelated_checkpoint_says_so(sdir, history, tmp_path):
    ws = tmp_path / "other"
    ws.mkdir()
    (ws / "x").write_text("x")
    with opened(sdir) as store:
        other = store.checkpoints.commit(str(ws), "other", "other").to_json()["checkpoint"]
    text = cli(sdir, "revert", "main", other)
    assert text.code == 0 and b"not in this thread's ancestry" in text.err
    doc = cli(sdir, "--json", "revert", "side", other).json()
    assert doc["related"] is False and len(doc["notes"]) == 2


def test_racing_reverts_with_the_same_expect_exactly_one_wins(sdir, history):
    c1, c2 = history
    procs = [subprocess.Popen([AGENTCAS, "--store", str(sdir), "--json", "revert", "main", c1, "--expect", c2],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(4)]
    codes = sorted(proc.wait(timeout=120) for proc in procs)
    assert codes == [0, 3, 3, 3]
    for proc in procs:
        err = proc.stderr.read()
        assert err == b"" or b"nothing was changed" in err
    with opened(sdir) as store:
        assert [e["action"] for e in [item.to_json() for item in store.threads.reflog("main")]].count("revert") == 1


def test_diff_and_lineage_cli(sdir, history):
    c1, c2 = history
    text = cli(sdir, "diff", c1, c2).out.decode()
    assert "A b.txt (4 bytes)" in text and "M a.txt (4 -> 8 bytes)" in text
    assert "rollout: 2 records added (seq 2..4)" in text
    doc = cli(sdir, "--json", "diff", c1, c2).json()
    assert doc["added"] == [{"path": "b.txt", "size": 4}]
    assert doc["changed"] == [{"path": "a.txt", "old_size": 4, "new_size": 8}]
    assert doc["records"]["added"] == 2 and doc["records"]["added_range"] == [2, 4]
    append(sdir, "side", jsonl({"side": 1}, {"side": 2}, {"side": 3}))
    text = cli(sdir, "lineage").out.decode()
    assert "main  4 records" in text and "  side  6 records  (fork of main at seq 3)" in text
    doc = cli(sdir, "--json", "lineage", "main").json()
    [main] = doc["threads"]
    assert [(c["thread"], c["forked_from"]["seq"]) for c in main["children"]] == [("side", 3)]
    assert cli(sdir, "lineage", "nobody").code == 1


# --- crashes and corruption -----------------------------------------------------------------

def check_store_clean(sdir) -> dict:
    """Every thread verifies and walks clean, and `agentcas fsck` agrees; {thread: seq}."""
    out = {}
    with opened(sdir) as store, views(store) as txn:
        for name, state in threads.list_threads(txn):
            assert rollout.History(txn).verify(state.history) == state.history.seq
            walker = Walker(txn, verify=True)
            list(walker.history(state.history))
            if state.checkpoint is not None:
                list(walker.checkpoint(state.checkpoint))
            out[name] = state.history.seq
    fsck = cli(sdir, "fsck")
    assert fsck.code == 0, fsck
    return out


def test_sigkill_during_appends_leaves_old_or_new_history(sdir):
    append(sdir, "t", jsonl({"start": True}))
    code = """
        import json, os, sys
        from agentcas import Store
        store = Store.open(sys.argv[1])
        for n in range(int(sys.argv[2]), 1000000, 1000):
            batch = "".join(json.dumps({"n": n, "k": k, "pad": os.urandom(20000).hex()}) + "\\n"
                            for k in range(100))  # ~4 MB a batch
            store.history.append("t", batch.encode())
            print(n, flush=True)
    """
    rng = random.Random(7)
    for round_ in range(2):
        proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), str(sdir), str(round_)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        proc.stdout.readline()  # one batch landed; kill during a later one
        time.sleep(rng.random() * 0.8)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        seqs = check_store_clean(sdir)
        assert (seqs["t"] - 1) % 100 == 0  # whole batches only
        out = cli(sdir, "rollout", "cat", "t").out.splitlines()
        assert len(out) == seqs["t"]
        batches = [json.loads(line)["n"] for line in out[1:]]
        assert all(batches.count(n) == 100 for n in set(batches))


def test_sigkill_during_forks_leaves_whole_forks(sdir):
    append(sdir, "t", jsonl(*({"i": i} for i in range(50))))
    code = """
        import sys
        from agentcas import Store
        store = Store.open(sys.argv[1])
        for n in range(100000):
            store.threads.fork("t", f"f{n}", at=n % 51)
            print(n, flush=True)
    """
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), str(sdir)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.readline()  # the first fork landed
    time.sleep(0.5)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    seqs = check_store_clean(sdir)
    forks = {name: seq for name, seq in seqs.items() if name.startswith("f")}
    assert forks and all(seq == int(name[1:]) % 51 for name, seq in forks.items())
    numbers = sorted(int(name[1:]) for name in forks)
    assert numbers == list(range(len(numbers)))  # no gap: each fork whole or absent


def test_corrupt_rollout_chunk_makes_cat_exit_4_naming_it(sdir):
    with opened(sdir) as store:
        # Over rollout.INLINE_BYTES, so the records are stored as chunks.
        store.history.append("t", jsonl(*({"i": i, "pad": os.urandom(1000).hex()} for i in range(40))))
        head = store.threads.get("t").history
        with views(store) as txn:
            chunk = rollout.History(txn).segment(head.segment).chunks[0].id.hex()
    flip = """
        import sys
        sys.path.insert(0, sys.argv[3])
        from support import raw_objects

        def damage(value):
            value[len(value) // 2] ^= 0x20
            return value
        raw_objects.edit_at(sys.argv[1], bytes.fromhex(sys.argv[2]), damage)
    """
    subprocess.run([sys.executable, "-c", textwrap.dedent(flip), str(sdir), chunk, os.path.dirname(__file__)],
                   check=True, timeout=60)
    result = cli(sdir, "rollout", "cat", "t")
    assert result.code == 4, result
    assert chunk.encode() in result.err and result.err.count(b"\n") == 1
    fsck = cli(sdir, "fsck")
    assert fsck.code == 4 and chunk.encode() in fsck.err + fsck.out
