"""`commit --rollout FILE` with a harness's growing rollout file, through the real command:
effects recorded between commits (in any order, forever), the file given back by
checkout, and a refused file named with nothing written."""

from __future__ import annotations

import json
import random

import pytest

from support.cli import run_cli
from support.store_state import store_rows, tree_bytes


def record(n: int) -> bytes:
    return json.dumps({"type": "response_item", "n": n, "text": "x" * (n % 7)}).encode() + b"\n"


@pytest.fixture
def setup(tmp_path):
    store = tmp_path / "store"
    assert run_cli("init", store).code == 0
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "notes.md").write_text("plan\n")
    return store, ws, ws / "rollout.jsonl"


def commit(store, ws, rollout, reason="step"):
    result = run_cli("--json", "commit", ws, "-m", reason, "--rollout", rollout, store=store)
    assert result.code == 0, result
    return result.json()


def effect(store, n: int) -> str:
    result = run_cli("effect", "add", "main", "--kind", "http.request", "--target", f"https://x/{n}",
                     "--state", "pending", "--rollback", "compensatable", store=store)
    assert result.code == 0, result
    return result.out.strip()


def history(store, rev="main") -> bytes:
    result = run_cli("rollout", "cat", rev, store=store)
    assert result.code == 0, result
    return result.out.encode()


def without_effects(data: bytes) -> bytes:
    return b"".join(line for line in data.splitlines(keepends=True) if b'"agentcas.effect"' not in line)


def test_an_effect_then_a_commit_of_the_grown_file(setup):
    """The newcomer's sequence: commit, effect add, the harness writes on, commit again."""
    store, ws, rollout = setup
    rollout.write_bytes(record(1) + record(2))
    commit(store, ws, rollout)
    effect(store, 1)
    rollout.write_bytes(rollout.read_bytes() + record(3))
    doc = commit(store, ws, rollout)
    assert doc["appended_records"] == 1
    stored = history(store)
    assert without_effects(stored) == rollout.read_bytes()
    assert stored.count(b'"agentcas.effect"') == 1  # the effect stays, as evidence


def test_effects_and_commits_in_any_order_forever(setup):
    """Random interleavings of: the harness appends lines, effect add, commit, commit with no
    new line, effect add before the first commit. Every commit lands; the history is always
    the file's lines with the effects where they were recorded."""
    store, ws, rollout = setup
    rng = random.Random(7)
    rollout.write_bytes(b"")
    n = effects = 0
    for step in range(24):
        action = rng.choice(["lines", "lines", "effect", "commit", "commit"])
        if action == "lines":
            for _ in range(rng.randint(1, 3)):
                n += 1
                with rollout.open("ab") as out:
                    out.write(record(n))
        elif action == "effect":
            effect(store, step)
            effects += 1
        else:
            commit(store, ws, rollout, f"step {step}")
    commit(store, ws, rollout, "last")
    stored = history(store)
    assert without_effects(stored) == rollout.read_bytes()
    assert stored.count(b'"agentcas.effect"') == effects


def test_a_partial_last_line_waits_and_effects_do_not_disturb_it(setup):
    store, ws, rollout = setup
    rollout.write_bytes(record(1) + b'{"type":"resp')
    assert commit(store, ws, rollout)["appended_records"] == 1
    effect(store, 1)
    rollout.write_bytes(record(1) + record(2))
    assert commit(store, ws, rollout)["appended_records"] == 1
    assert without_effects(history(store)) == record(1) + record(2)


@pytest.mark.parametrize("rewrite, needle", [
    (lambda data: data[:len(record(1))], "is shorter"),                              # truncated
    (lambda data: data.replace(b'"n": 2', b'"n": 9') + record(3), "differs"),       # edited in the last append
    (lambda data: data.replace(b'"n": 1', b'"n": 8') + record(3), "differs"),       # edited at the start
    (lambda data: record(5) + record(6) + record(7), "differs"),                     # rewritten
])
def test_a_truncated_or_rewritten_file_is_still_refused_after_effects(setup, rewrite, needle):
    store, ws, rollout = setup
    rollout.write_bytes(record(1) + record(2))
    commit(store, ws, rollout)
    effect(store, 1)
    rollout.write_bytes(rewrite(rollout.read_bytes()))
    before = store_rows(store)
    result = run_cli("commit", ws, "-m", "again", "--rollout", rollout, store=store)
    assert result.code == 1 and needle in result.err and "nothing was committed" in result.err, result
    assert len(result.err.strip().splitlines()) == 1 and "Traceback" not in result.err
    assert store_rows(store) == before


def test_an_edit_in_the_last_stored_append_is_refused(setup):
    """The lines of the last commit are re-read from the store and compared, from the place
    the checkpoint recorded (effects on both sides of it)."""
    store, ws, rollout = setup
    rollout.write_bytes(record(1) + record(2))
    commit(store, ws, rollout)
    effect(store, 1)
    rollout.write_bytes(rollout.read_bytes() + record(3) + record(4))
    commit(store, ws, rollout)
    effect(store, 2)
    rollout.write_bytes(rollout.read_bytes().replace(b'"n": 4', b'"n": 7') + record(5))
    before = store_rows(store)
    result = run_cli("commit", ws, "-m", "again", "--rollout", rollout, store=store)
    assert result.code == 1 and "differs from the history already stored" in result.err, result
    assert store_rows(store) == before


def test_effects_recorded_before_the_first_commit(setup):
    store, ws, rollout = setup
    effect(store, 1)
    effect(store, 2)
    rollout.write_bytes(record(1) + record(2))
    assert commit(store, ws, rollout)["appended_records"] == 2
    rollout.write_bytes(rollout.read_bytes() + record(3))
    assert commit(store, ws, rollout)["appended_records"] == 1
    stored = history(store)
    assert without_effects(stored) == rollout.read_bytes() and stored.count(b'"agentcas.effect"') == 2


def test_a_file_that_holds_the_effect_records_too_is_matched(setup, tmp_path):
    """A rollout file written from the history itself (`rollout cat`, effects included)
    continues it: its effect records are the history's, not new ones."""
    store, ws, rollout = setup
    rollout.write_bytes(record(1))
    commit(store, ws, rollout)
    effect(store, 1)
    copy = tmp_path / "copy.jsonl"
    copy.write_bytes(history(store) + record(2))
    assert commit(store, ws, copy)["appended_records"] == 1
    assert history(store) == copy.read_bytes()


def test_a_bad_line_names_the_file_and_its_line_in_the_file(setup):
    store, ws, rollout = setup
    rollout.write_bytes(b"".join(record(n) for n in range(1, 13)))
    commit(store, ws, rollout)
    effect(store, 1)  # the history now has one more record than the file has lines
    rollout.write_bytes(rollout.read_bytes() + record(13) + record(14) + b"[1, 2]\n")
    before = store_rows(store)
    result = run_cli("commit", ws, "-m", "bad", "--rollout", rollout, store=store)
    assert result.code == 1, result
    assert f"rollout file {rollout} line 15: a record must be a JSON object" in result.err, result
    assert store_rows(store) == before


# --- checkout gives the rollout file back ---------------------------------------------------

def test_checkout_writes_the_rollout_file_back_where_it_was(setup, tmp_path):
    store, ws, rollout = setup
    rollout.write_bytes(record(1) + record(2))
    first = commit(store, ws, rollout)["checkpoint"]
    effect(store, 1)
    rollout.write_bytes(rollout.read_bytes() + record(3))
    commit(store, ws, rollout)
    out = tmp_path / "out"
    result = run_cli("checkout", "main", out, store=store)
    assert result.code == 0 and "rollout file rollout.jsonl" in result.out, result
    assert tree_bytes(out) == tree_bytes(ws)  # the file as the harness wrote it, mode 0644
    earlier = tmp_path / "earlier"
    assert run_cli("checkout", first, earlier, store=store).code == 0
    assert (earlier / "rollout.jsonl").read_bytes() == record(1) + record(2)


def test_a_rollout_file_in_a_subdirectory_comes_back_there(setup, tmp_path):
    store, ws, _ = setup
    rollout = ws / "sessions" / "2026" / "rollout-1.jsonl"
    rollout.parent.mkdir(parents=True)
    rollout.write_bytes(record(1))
    doc = commit(store, ws, rollout)
    shown = run_cli("--json", "show", doc["checkpoint"], "--files", store=store).json()
    assert [f["path"] for f in shown["files"]] == ["notes.md"]  # history, not a file of the tree
    out = tmp_path / "out"
    assert run_cli("checkout", "main", out, store=store).code == 0
    assert (out / "sessions" / "2026" / "rollout-1.jsonl").read_bytes() == record(1)


def test_a_rollout_file_outside_the_workspace_is_not_written_into_it(setup, tmp_path):
    store, ws, _ = setup
    rollout = tmp_path / "elsewhere.jsonl"
    rollout.write_bytes(record(1))
    commit(store, ws, rollout)
    out = tmp_path / "out"
    result = run_cli("--json", "checkout", "main", out, store=store)
    assert result.code == 0 and result.json()["rollout_file"] is None
    assert sorted(p.name for p in out.iterdir()) == ["notes.md"]


def test_a_checkpoint_from_before_the_record_checks_out_as_before(setup, tmp_path):
    """Older checkpoints have no rollout_file: no file is written, and a commit continues
    the history from a file that holds it whole."""
    store, ws, rollout = setup
    rollout.write_bytes(record(1) + record(2))
    assert run_cli("rollout", "append", "main", rollout, store=store).code == 0  # history first, no record
    assert run_cli("commit", ws, "-m", "plain", store=store).code == 0
    out = tmp_path / "out"
    assert run_cli("checkout", "main", out, store=store).code == 0
    assert (out / "rollout.jsonl").read_bytes() == rollout.read_bytes()  # a plain file of the tree
    rollout.write_bytes(rollout.read_bytes() + record(3))
    assert commit(store, ws, rollout)["appended_records"] == 1
    assert history(store) == rollout.read_bytes()
