"""The recovery drill: passes end to end, and fails when recovery does not really hold."""

from __future__ import annotations

import json
import os

import pytest

from agentcas import drill
from agentcas.api.checkpoints import Checkpoints
from agentcas.repository import Store

from support.store_state import store_rows


def test_drill_cli_passes_without_a_store(run, tmp_path):
    result = run("drill", cwd=tmp_path)
    assert result.code == 0, result
    assert "performed steps [3, 4, 5]" in result.out
    assert "result 55" in result.out
    assert result.out.count("s] ok ") == 8  # every stage printed with its time
    assert not [p for p in os.listdir(tmp_path)]


def test_drill_json_report(run, tmp_path):
    result = run("--json", "drill", cwd=tmp_path)
    assert result.code == 0, result
    doc = result.json()
    assert doc["ok"] is True and doc["result"] == 55
    assert [s["stage"] for s in doc["stages"]][:3] == ["agent works", "checkpoint", "export signed bundle"]
    assert all(s["ok"] and s["seconds"] >= 0 for s in doc["stages"])


def test_drill_keeps_nothing_behind(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", None)
    report = drill.run_drill(echo=lambda line: None)
    assert report.ok and report.result == 55
    assert os.listdir(tmp_path) == []


def test_drill_fails_if_the_agent_starts_from_scratch(monkeypatch):
    original_run = drill.SumOfSquaresAgent.run

    def amnesiac(self, max_steps=None):
        if max_steps is None:  # the resumed run forgets its saved state
            with open(self.state_path, "w") as out:
                json.dump({"next_i": 1, "partial_sum": 0}, out)
        return original_run(self, max_steps)

    monkeypatch.setattr(drill.SumOfSquaresAgent, "run", amnesiac)
    lines = []
    with pytest.raises(drill.DrillFailed, match="not start from scratch"):
        drill.run_drill(echo=lines.append)
    assert any("FAIL agent resumes" in line for line in lines)


def test_drill_fails_if_restore_loses_state(monkeypatch):
    original_checkout = Checkpoints.checkout

    def lossy(self, rev, dest, progress=None):
        result = original_checkout(self, rev, dest, progress)
        os.unlink(os.path.join(dest, "memory", "state.json"))
        return result

    monkeypatch.setattr(Checkpoints, "checkout", lossy)
    with pytest.raises(drill.DrillFailed, match="state.json"):
        drill.run_drill(echo=lambda line: None)


@pytest.fixture
def user_store(tmp_path, run, workspace):
    store = tmp_path / "store"
    rollout = tmp_path / "r.jsonl"
    rollout.write_text("".join(f'{{"seq": {i}}}\n' for i in range(30)))
    (workspace / "run.sh").write_text("#!/bin/sh\necho hi\n")
    os.chmod(workspace / "run.sh", 0o755)
    assert run("init", store).code == 0
    assert run("commit", workspace, "-m", "one", "--rollout", rollout, store=store).code == 0
    return store


def test_checkpoint_drill_compares_and_touches_nothing(user_store, run):
    before = store_rows(user_store)
    result = run("drill", "--checkpoint", "main", store=user_store)
    assert result.code == 0, result
    assert "30 rollout records" in result.out and "identical" in result.out
    assert store_rows(user_store) == before
    assert run("drill", "--checkpoint", "nosuch", store=user_store).code == 1
    assert store_rows(user_store) == before


def test_checkpoint_drill_detects_a_difference(user_store, monkeypatch):
    original_checkout = Checkpoints.checkout

    def corrupting(self, rev, dest, progress=None):
        result = original_checkout(self, rev, dest, progress)
        with open(os.path.join(dest, "task.json"), "ab") as out:
            out.write(b" ")
        return result

    monkeypatch.setattr(Checkpoints, "checkout", corrupting)
    store = Store.open(str(user_store))
    with pytest.raises(drill.DrillFailed, match="task.json differs"):
        drill.run_checkpoint_drill(store, "main", echo=lambda line: None)
