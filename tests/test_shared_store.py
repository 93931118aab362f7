"""A shared store (objects in S3 on a real SeaweedFS, refs in a real PostgreSQL) through the
CLI and the Python API, as two machines (two cache directories) would use it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from conftest import AGENTCAS, run_cli, tree_bytes
from agentcas import Store


@pytest.fixture
def shared(tmp_path, s3_url, postgres_url):
    """(run, env) for one machine of a fresh shared store; `machine(name)` gives others."""
    def machine(name: str):
        env = {"AGENTCAS_STORE": s3_url, "AGENTCAS_REFS": postgres_url,
               "AGENTCAS_CACHE_DIR": str(tmp_path / f"cache-{name}")}

        def run(*args, **kw):
            return run_cli(*args, env=dict(env, **kw.pop("env", {})), **kw)
        run.env = env
        return run

    first = machine("a")
    assert first("init").code == 0
    first.machine = machine
    first.urls = (s3_url, postgres_url)
    return first


def write(root, files: dict):
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return root


def test_commit_on_one_machine_check_out_on_another(shared, workspace, tmp_path):
    made = shared("--json", "commit", workspace, "-m", "on machine a")
    assert made.code == 0, made
    other = shared.machine("b")
    log = other("--json", "log", "main")
    assert log.code == 0 and log.json()["checkpoints"][0]["reason"] == "on machine a"
    out = tmp_path / "restored"
    assert other("checkout", "main", out).code == 0
    assert tree_bytes(out) == tree_bytes(workspace)
    assert other("--json", "fsck").json()["ok"]


def test_every_command_works_on_a_shared_store(shared, workspace, tmp_path):
    rollout = workspace / "rollout.jsonl"
    rollout.write_text('{"role":"user","text":"hi"}\n{"role":"assistant","text":"hello"}\n')
    assert shared("commit", workspace, "-m", "one", "--rollout", rollout).code == 0
    with rollout.open("a") as handle:
        handle.write('{"role":"user","text":"more"}\n')
    (workspace / "task.json").write_text('{"step": 2}\n')
    assert shared("commit", workspace, "-m", "two", "--rollout", rollout).code == 0
    assert shared("rollout", "cat", "main").out == rollout.read_text()
    assert shared("fork", "main", "alt", "--at", "2").code == 0
    assert shared("rollout", "append", "alt", "-", input='{"role":"user","text":"alt"}\n').code == 0
    assert shared("revert", "main", "main~1").code == 0
    assert shared("branch", "keep", "main@{1}").code == 0
    assert shared("--json", "diff", "main", "keep").json()["changed"]
    assert shared("--json", "lineage").code == 0
    gc = shared("--json", "gc", "--grace", "0s", "--expire-reflog", "now")
    assert gc.code == 0, gc
    fsck = shared("--json", "fsck")
    assert fsck.code == 0 and fsck.json()["ok"], fsck
    for thread in ("main", "alt", "keep"):
        assert shared("checkout", thread, tmp_path / f"out-{thread}").code == 0


def test_push_and_pull_between_a_laptop_store_and_the_shared_store(shared, workspace, tmp_path):
    laptop = tmp_path / "laptop"
    assert run_cli("init", laptop).code == 0
    assert run_cli("commit", workspace, "-m", "from the laptop", store=laptop).code == 0
    s3_url, refs = shared.urls
    assert run_cli("remote", "add", "team", s3_url, "--refs", refs, store=laptop, env=shared.env).code == 0
    pushed = run_cli("--json", "push", "team", "main", store=laptop, env=shared.env)
    assert pushed.code == 0, pushed
    assert pushed.json()["objects_sent"] > 0
    again = run_cli("--json", "push", "team", "main", store=laptop, env=shared.env)
    assert again.json()["up_to_date"]
    assert shared("--json", "log", "main").json()["checkpoints"][0]["reason"] == "from the laptop"
    (workspace / "task.json").write_text('{"step": "team"}\n')
    assert shared("commit", workspace, "-m", "by the team").code == 0
    pulled = run_cli("--json", "pull", "team", "main", store=laptop, env=shared.env)
    assert pulled.code == 0, pulled
    assert run_cli("--json", "log", "main", store=laptop).json()["checkpoints"][0]["reason"] == "by the team"


def test_unchanged_recommit_uploads_nothing_but_its_checkpoint(shared, workspace, monkeypatch):
    time.sleep(2.1)  # the stat cache skips files changed within 2 s of a snapshot
    assert shared("commit", workspace, "-m", "first").code == 0
    s3_url, refs = shared.urls
    monkeypatch.setenv("AGENTCAS_CACHE_DIR", shared.env["AGENTCAS_CACHE_DIR"])
    store = Store.open(s3_url, refs=refs)
    before_s3 = store.blobs.remote.request_count() if hasattr(store.blobs, "remote") else None
    before_pg = store.meta.statements  # statements, several per round trip (pipelined)
    result = store.commit(str(workspace), "unchanged")
    assert result["new_objects"] == 0 and result["cached_files"] == result["files"]
    s3_requests = store.blobs.remote.request_count() - before_s3
    pg_requests = store.meta.statements - before_pg
    print(f"\n[shared] unchanged recommit: {s3_requests} S3 requests, {pg_requests} PostgreSQL statements")
    assert s3_requests <= 3
