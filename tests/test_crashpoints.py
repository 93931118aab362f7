"""Crash points: every command killed (SIGKILL) at every durable step leaves a store that
fsck passes, each ref old or new (never anything else), and a retry that succeeds.

Each scenario builds a base state once (real CLI runs), counts the command's durable
steps (AGENTCAS_CRASH_COUNT), then for every point N: copies the base to the same path,
runs the command with AGENTCAS_CRASH_AT=N (it must die by SIGKILL), observes the stores
(fsck + every thread's state) and the files it writes (DEST, a bundle), retries the
command, and observes again. Runs go through the fork server (support/cli_forks.py): the real
click entry point in a fresh process, without paying the interpreter start each time.
AGENTCAS_CRASH_BATCH=1 makes every batch writer land one object per transaction, so
small inputs take many steps. `-m crash` selects these tests; the total is printed.
"""

from __future__ import annotations

import pytest

from support.cli import AGENTCAS, run_cli
from support.crash_walk import SCENARIOS, Walk

pytestmark = pytest.mark.crash


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_every_crash_point(forks, scenario, memory_tmp, record_property):
    points = Walk(forks, scenario, memory_tmp).run()
    record_property("crash_points", points)  # summed and printed by conftest's summary


def test_crash_switch_in_the_installed_command(tmp_path, workspace):
    """The real `agentcas` executable: counting writes the labels; CRASH_AT kills at that step."""
    store = tmp_path / "store"
    assert run_cli("init", store).code == 0
    count = tmp_path / "count"
    assert run_cli("commit", workspace, "-m", "x", store=store,
                   env={"AGENTCAS_CRASH_COUNT": str(count)}).code == 0
    labels = count.read_text().split()
    assert labels[-2:] == ["store.open", "store.commit"]
    killed = run_cli("commit", workspace, "-m", "y", store=store,
                     env={"AGENTCAS_CRASH_AT": "store.open:1"})
    assert killed.code == -9 and killed.err == ""
    assert run_cli("fsck", store=store).code == 0
    log = run_cli("--json", "log", store=store).json()
    assert [e["reason"] for e in log["checkpoints"]] == ["x"]  # killed with the write open: nothing landed
    assert AGENTCAS  # the installed command, not the fork server

