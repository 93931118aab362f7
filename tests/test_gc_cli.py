"""`agentcas gc`, `gc explain` and `--report` run as a user would run them."""

from __future__ import annotations

import json
import os

from support import raw_objects
from support.cli import run_cli
from support.store_state import store_rows


def setup_store(tmp_path):
    """A store with a live thread `main` and a deleted thread's garbage (built via the CLI)."""
    store_dir = tmp_path / "store"
    assert run_cli("init", store_dir).code == 0
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "keep.txt").write_bytes(os.urandom(5000))
    assert run_cli("commit", ws, "-m", "keep", store=store_dir).code == 0
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "junk.bin").write_bytes(os.urandom(7000))
    assert run_cli("commit", junk, "-m", "junk", "--thread", "junk", store=store_dir).code == 0
    rows = [json.dumps({"i": i}) for i in range(20)]
    assert run_cli("rollout", "append", "main", "-", input="\n".join(rows) + "\n", store=store_dir).code == 0
    shown = run_cli("--json", "show", "junk", "--files", store=store_dir).json()
    assert run_cli("branch", "-d", "junk", store=store_dir).code == 0
    return store_dir, shown["files"][0]["id"]


def test_dry_run_prints_the_plan_and_changes_nothing(tmp_path):
    store_dir, junk = setup_store(tmp_path)
    before = store_rows(store_dir)
    result = run_cli("--json", "gc", "--dry-run", "--grace", "0s", "--expire-reflog", "now", store=store_dir)
    assert result.code == 0, result
    doc = result.json()
    assert doc["dry_run"] and doc["result"] is None
    assert doc["plan"]["reclaimable"]["objects"] >= 3  # checkpoint, tree, chunk of the junk thread
    assert doc["plan"]["roots"]["thread"] == 1
    assert store_rows(store_dir) == before
    text = run_cli("gc", "--dry-run", "--grace", "0s", store=store_dir)
    assert text.code == 0 and "dry run: nothing deleted" in text.out and "reclaimable" in text.out


def test_gc_deletes_and_reports(tmp_path):
    store_dir, junk = setup_store(tmp_path)
    report = tmp_path / "report.json"
    result = run_cli("--json", "gc", "--grace", "0s", "--expire-reflog", "now", "--report", report,
                     store=store_dir)
    assert result.code == 0, result
    doc = result.json()
    assert doc["result"]["complete"] and doc["result"]["deleted"]["objects"] == doc["plan"]["reclaimable"]["objects"] >= 3
    data = json.loads(report.read_text())
    assert [t["thread"] for t in data["threads"]] == ["main"]
    assert data["threads"][0]["records"] == 20 and data["roots"]["counts"]["thread"] == 1
    assert data["result"]["deleted"]["objects"] == doc["result"]["deleted"]["objects"]
    assert run_cli("fsck", store=store_dir).code == 0
    gone = run_cli("gc", "explain", junk, store=store_dir)
    assert gone.code == 1 and "no stored object" in gone.err

    text_report = tmp_path / "report.txt"
    again = run_cli("gc", "--report", text_report, store=store_dir)
    assert again.code == 0, again
    body = text_report.read_text()
    assert "threads:" in body and "main:" in body and "reclaimable: 0 objects" in body


def test_explain(tmp_path):
    store_dir, junk = setup_store(tmp_path)
    unreachable = run_cli("gc", "explain", junk[:12], "--grace", "0s", store=store_dir)
    assert unreachable.code == 0 and "unreachable" in unreachable.out, unreachable
    held = run_cli("--json", "gc", "explain", junk, store=store_dir).json()
    assert held["alive"] and held["root"]["kind"] == "recent"  # within the default 1h grace
    files = run_cli("--json", "show", "main", "--files", store=store_dir).json()["files"]
    alive = run_cli("--json", "gc", "explain", files[0]["id"][:16], store=store_dir)
    doc = alive.json()
    assert doc["alive"] and doc["root"] == dict(doc["root"], kind="thread", name="main")
    assert [s["kind"] for s in doc["path"]] == ["checkpoint", "tree", "chunk"]
    text = run_cli("gc", "explain", files[0]["id"], store=store_dir).out
    assert "kept by thread main" in text and "-> tree" in text
    assert run_cli("gc", "explain", "abc", store=store_dir).code == 2
    assert run_cli("gc", "explain", "zz" * 8, store=store_dir).code == 2


def test_bad_durations_are_usage_errors(tmp_path):
    store_dir, _ = setup_store(tmp_path)
    before = store_rows(store_dir)
    for args in (["--grace", "soon"], ["--expire-reflog", "1y"], ["--grace", "now"]):
        result = run_cli("gc", *args, store=store_dir)
        assert result.code == 2 and "not a duration" in result.err, result
    assert store_rows(store_dir) == before


def test_missing_object_exits_4_and_deletes_nothing(tmp_path):
    store_dir, _ = setup_store(tmp_path)
    files = run_cli("--json", "show", "main", "--files", store=store_dir).json()["files"]
    raw_objects.edit_at(store_dir, bytes.fromhex(files[0]["id"]), lambda value: None)
    before = store_rows(store_dir)
    result = run_cli("gc", "--grace", "0s", "--expire-reflog", "now", store=store_dir)
    assert result.code == 4, result
    assert files[0]["id"] in result.err and "deleted nothing" in result.err
    assert store_rows(store_dir) == before


def test_the_report_names_kept_reflog_states_as_reflog_does(tmp_path):
    """Each kept checkpoint is named by the entry `agentcas reflog` shows for it (@{0} the
    newest), and the report counts entries as `reflog` lists them."""
    store_dir = tmp_path / "store"
    assert run_cli("init", store_dir).code == 0
    ws = tmp_path / "ws"
    ws.mkdir()
    for n in range(3):
        (ws / "step.txt").write_text(f"step {n}\n")
        assert run_cli("commit", ws, "-m", f"step {n}", store=store_dir).code == 0
    assert run_cli("revert", "main", "main@{2}", store=store_dir).code == 0
    reflog = run_cli("--json", "reflog", "main", store=store_dir).json()["entries"]
    listed = {row["rev"]: row["new"]["checkpoint"] for row in reflog}
    report = tmp_path / "report.json"
    assert run_cli("gc", "--dry-run", "--report", report, store=store_dir).code == 0
    doc = json.loads(report.read_text())
    named = [(r["name"], r["checkpoint"]) for r in doc["roots"]["reflog"] if not r.get("left")]
    assert named == sorted(listed.items(), key=lambda item: item[0])  # main@{0} .. main@{3}
    assert doc["roots"]["counts"]["reflog"] == len(reflog) == doc["reflog"]["entries"] == 4
    plain = tmp_path / "report.txt"
    assert run_cli("gc", "--dry-run", "--report", plain, store=store_dir).code == 0
    body = plain.read_text()
    assert "4 reflog entries" in body
    for rev, checkpoint in listed.items():
        assert f"  {rev}: checkpoint {checkpoint[:12]}" in body


def test_explain_takes_the_file_id_show_files_prints_for_a_file_of_many_chunks(tmp_path):
    store_dir = tmp_path / "store"
    assert run_cli("init", store_dir).code == 0
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "big.bin").write_bytes(os.urandom(1_500_000))  # several chunks: stored as a chunk list
    assert run_cli("commit", ws, "-m", "big", store=store_dir).code == 0
    shown = run_cli("--json", "show", "main", "--files", store=store_dir).json()["files"]
    file_id = shown[0]["id"]
    short = run_cli("show", "main", "--files", store=store_dir).out.split()[-2]  # as printed
    assert file_id.startswith(short)
    for given in (file_id, short):
        result = run_cli("--json", "gc", "explain", given, store=store_dir)
        assert result.code == 0, result
        doc = result.json()
        assert doc["object"] == file_id and doc["kind"] == "file" and doc["alive"]
        assert [s["kind"] for s in doc["path"]] == ["checkpoint", "tree", "chunklist"]
        assert doc["path"][-1]["id"] == doc["chunk_list"]
    text = run_cli("gc", "explain", short, store=store_dir)
    assert text.code == 0 and f"file {file_id}" in text.out and "kept by thread main" in text.out
    missing = run_cli("gc", "explain", "f" * 16, store=store_dir)
    assert missing.code == 1 and "no stored object" in missing.err
