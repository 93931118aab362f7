"""What a new user meets first, through the real `agentcas` command: failures under --json,
command groups named alone, missing bundle files, short id prefixes, ranges past the end,
secrets refused alike by commit and export, and the commit report's unchanged files.

Each refusal asserts the exit code, the one stderr line, and that the store (every raw
row) and the disk are as they were.
"""

from __future__ import annotations

import json

import pytest

from support.cli import run_cli
from support.store_state import store_rows

GROUPS_THAT_LIST = {"trust": ("trust", "list"), "remote": ("remote", "list")}
GROUPS_WITHOUT_A_LIST = ("rollout", "effect")
TOKEN = "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"


@pytest.fixture
def store(tmp_path):
    path = tmp_path / "store"
    assert run_cli("init", path).code == 0
    return path


@pytest.fixture
def committed(store, tmp_path):
    """A store whose thread main has one checkpoint of a small workspace and 3 records."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "notes.md").write_text("plan\n")
    (ws / "rollout.jsonl").write_text('{"n":1}\n{"n":2}\n{"n":3}\n')
    assert run_cli("commit", ws, "-m", "one", "--rollout", ws / "rollout.jsonl", store=store).code == 0
    return store, ws


def one_error_line(result, code: int, *needles: str) -> str:
    assert result.code == code, result
    lines = result.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("agentcas: error: ") and "Traceback" not in result.err, result
    for needle in needles:
        assert needle in lines[0], result
    return lines[0][len("agentcas: error: "):]


# --- --json failures ----------------------------------------------------------------------

@pytest.mark.parametrize("args, code", [
    (["show", "no-such-thread"], 1),                 # an error of the command
    (["--json", "fork"], 2),                         # click's usage error: a missing argument
    (["rollout", "cat", "main", "--to", "99"], 2),   # a usage error of agentcas
    (["branch", "main"], 3),                         # a conflict
    (["frobnicate"], 2),                             # no such command
])
@pytest.mark.parametrize("where", ["before", "after"])
def test_a_json_failure_prints_one_json_document_and_the_stderr_line(committed, args, code, where):
    store, _ = committed
    argv = ["--json", *[a for a in args if a != "--json"]] if where == "before" else \
        [a for a in args if a != "--json"] + ["--json"]
    before = store_rows(store)
    result = run_cli(*argv, store=store)
    message = one_error_line(result, code)
    assert json.loads(result.out) == {"error": message, "exit_code": code}, result
    assert store_rows(store) == before


def test_a_failure_without_json_prints_nothing_on_stdout(committed):
    store, _ = committed
    result = run_cli("show", "no-such-thread", store=store)
    one_error_line(result, 1)
    assert result.out == ""


def test_scan_with_findings_prints_its_report_as_the_one_document(store, tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    data = json.dumps({"text": f"the tool printed {TOKEN}"}) + "\n"
    assert run_cli("rollout", "append", "main", "-", store=store, input=data).code == 0
    assert run_cli("commit", ws, "-m", "one", store=store).code == 0
    result = run_cli("--json", "scan", "main", store=store)
    message = one_error_line(result, 1, "likely secret")
    doc = json.loads(result.out)  # one document: the report, with the failure in it
    assert doc["error"] == message and doc["exit_code"] == 1 and doc["history"], doc


# --- groups named alone ----------------------------------------------------------------------

@pytest.mark.parametrize("group", sorted(GROUPS_THAT_LIST))
def test_a_group_alone_lists_like_its_list_command(committed, tmp_path, group):
    store, _ = committed
    if group == "remote":
        assert run_cli("remote", "add", "backup", tmp_path / "backup", store=store).code == 0
    else:
        assert run_cli("keygen", "alice", "--out", tmp_path, store=store).code == 0
        assert run_cli("trust", "add", "alice", tmp_path / "alice.pub", store=store).code == 0
    for json_flag in ([], ["--json"]):
        alone = run_cli(*json_flag, group, store=store)
        listed = run_cli(*json_flag, *GROUPS_THAT_LIST[group], store=store)
        assert alone.code == 0 and alone.err == "", alone
        assert alone.out == listed.out and ("backup" in alone.out or "alice" in alone.out), alone


@pytest.mark.parametrize("group", GROUPS_WITHOUT_A_LIST)
def test_a_group_with_nothing_to_list_shows_its_commands(store, group):
    result = run_cli(group, store=store)
    assert result.code == 0 and result.err == "" and "Commands:" in result.out, result
    doc = run_cli("--json", group, store=store)
    assert doc.code == 0 and sorted(json.loads(doc.out)["commands"]) == (
        ["append", "cat"] if group == "rollout" else ["add"]), doc


def test_gc_alone_is_still_gc(store):
    result = run_cli("gc", "--dry-run", store=store)
    assert result.code == 0 and "dry run" in result.out, result


# --- missing bundle files ------------------------------------------------------------------

@pytest.mark.parametrize("command", ["verify", "import"])
def test_a_missing_bundle_file_is_named(committed, tmp_path, command):
    store, _ = committed
    before = store_rows(store)
    result = run_cli(command, "nonexist.bundle", store=store, cwd=tmp_path)
    message = one_error_line(result, 1, "bundle file nonexist.bundle does not exist")
    assert "unknown revision" not in message
    assert store_rows(store) == before and not (tmp_path / "nonexist.bundle").exists()


def test_verify_still_takes_a_revision(committed):
    store, _ = committed
    result = run_cli("verify", "main", store=store)
    one_error_line(result, 4, "signature absent")  # a revision, judged as one


# --- revisions and ranges ----------------------------------------------------------------

@pytest.mark.parametrize("prefix", ["c57f", "0", "abcdef1"])
def test_a_short_hex_revision_says_a_prefix_needs_8_digits(committed, prefix):
    store, _ = committed
    one_error_line(run_cli("show", prefix, store=store), 1, f"unknown revision '{prefix}'",
                   "at least 8 hex digits")


def test_an_unknown_name_does_not_mention_prefixes(committed):
    store, _ = committed
    message = one_error_line(run_cli("show", "nosuch", store=store), 1, "unknown revision 'nosuch'")
    assert "hex digits" not in message


@pytest.mark.parametrize("args", [
    ["rollout", "cat", "main", "--to", "4"],
    ["rollout", "cat", "main", "--from", "4"],
    ["fork", "main", "other", "--at", "4"],
])
def test_past_the_end_is_a_usage_error_alike(committed, args):
    store, _ = committed
    before = store_rows(store)
    result = run_cli(*args, store=store)
    one_error_line(result, 2, "beyond the end", "(3 records)")
    assert result.out == "" and store_rows(store) == before


def test_to_at_the_end_reads_everything(committed):
    store, ws = committed
    result = run_cli("rollout", "cat", "main", "--to", "3", store=store)
    assert result.code == 0 and result.out == (ws / "rollout.jsonl").read_text(), result


# --- secrets: the same exit code whatever refuses them -------------------------------------

def test_commit_and_export_refuse_a_secret_with_the_same_exit_code(store, tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "token.txt").write_text(f"token = {TOKEN}\n")
    refused = run_cli("commit", ws, "-m", "one", store=store)
    one_error_line(refused, 1, "token.txt")
    assert run_cli("commit", ws, "-m", "one", "--allow-secret", "token.txt", store=store).code == 0
    before = store_rows(store)
    export = run_cli("export", "main", "-o", tmp_path / "b.bundle", store=store)
    one_error_line(export, refused.code, "refusing to export", "token.txt")
    assert TOKEN not in export.err and not (tmp_path / "b.bundle").exists()
    assert store_rows(store) == before


# --- the commit report ---------------------------------------------------------------------

def test_files_read_again_but_unchanged_count_as_unchanged(store, tmp_path):
    """Files seconds old are read again (a same-tick rewrite would go unseen in the stat
    cache), yet unchanged: the report counts them as unchanged."""
    ws = tmp_path / "ws"
    (ws / "sub").mkdir(parents=True)
    for name in ("a.md", "sub/b.md", "sub/c.md"):
        (ws / name).write_text(name)
    first = run_cli("--json", "commit", ws, "-m", "one", store=store).json()
    assert first["unchanged_files"] == 0
    again = run_cli("commit", ws, "-m", "two", store=store)
    assert again.code == 0 and "3 files, " in again.out and "(3 unchanged)" in again.out, again
    (ws / "sub" / "b.md").write_text("changed")
    changed = run_cli("--json", "commit", ws, "-m", "three", store=store).json()
    assert changed["unchanged_files"] == 2 and changed["files"] == 3
