"""Shared fixtures: a fresh store, a workspace, and `run` for the real CLI in a subprocess."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agentcas import Store

from support.cli import run_cli

# Fixtures kept beside the helpers they go with (tests/support/), offered to every test.
pytest_plugins = ("support.bundles", "support.crash_walk")


@pytest.fixture
def run():
    return run_cli


@pytest.fixture
def store_dir(tmp_path) -> Path:
    path = tmp_path / "store"
    Store.init(str(path))
    return path


@pytest.fixture
def store(store_dir) -> Store:
    return Store.open(str(store_dir))


@pytest.fixture
def workspace(tmp_path) -> Path:
    """A small agent workspace: memory, instructions, task and an artifact."""
    ws = tmp_path / "ws"
    (ws / "memory").mkdir(parents=True)
    (ws / "memory" / "notes.md").write_text("plan: compute the sum of squares\n")
    (ws / "instructions.md").write_text("Be careful.\n")
    (ws / "task.json").write_text('{"step": 1}\n')
    (ws / "artifacts").mkdir()
    (ws / "artifacts" / "data.bin").write_bytes(os.urandom(600_000))  # a chunk list (max chunk 512 KiB)
    return ws


# -- real PostgreSQL and SeaweedFS (S3) servers, one of each per pytest process --------
# Started on first use, stopped at session end (also when tests fail); a server that cannot
# start makes the test error, never skip. Their variables (PGPASSWORD, AWS_*) go into
# os.environ so the stores and any `agentcas` subprocess find them as a user's shell would.

@pytest.fixture(scope="session")
def postgres_server():
    from support.services import PostgresServer
    server = PostgresServer()
    os.environ.update(server.env())
    yield server
    server.close()


@pytest.fixture(scope="session")
def s3_server():
    from support.services import SeaweedServer
    server = SeaweedServer()
    os.environ.update(server.env())
    yield server
    server.close()


@pytest.fixture
def postgres_url(postgres_server) -> str:
    """A new empty database on the session's PostgreSQL (no schema yet)."""
    return postgres_server.create_database()


@pytest.fixture
def s3_url(s3_server) -> str:
    """A new empty prefix in the session's SeaweedFS test bucket."""
    return s3_server.url()


def pytest_terminal_summary(terminalreporter):
    """The robustness counts (crash points walked, faults injected, inputs fuzzed), from the
    tests' record_property, summed over every test (and every xdist worker)."""
    totals: dict[str, int] = {}
    for report in terminalreporter.stats.get("passed", []):
        for name, value in getattr(report, "user_properties", ()):
            if name in ("crash_points", "faults_injected", "inputs_fuzzed", "model_steps"):
                totals[name] = totals.get(name, 0) + int(value)
    if totals:
        terminalreporter.write_line("robustness: " + ", ".join(f"{name.replace('_', ' ')}: {value:,}"
                                                              for name, value in sorted(totals.items())))
