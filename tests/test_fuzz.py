"""Fuzzing: every decoder of untrusted bytes, under atheris for a short run.

`fuzz/targets.py` has one target per decoder and its allowed exceptions (AgentcasError
only: anything else is an "internal error" for the user). Here: every seed and every
saved crash input (fuzz/regressions/TARGET/*) goes through its target in-process; then
each target runs under atheris (coverage-guided, libFuzzer) for AGENTCAS_FUZZ_RUNS
inputs (default 3,000). `make fuzz` runs 10^6 per target (fuzz/run_all.py).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from support.cli import run_cli

ROOT = Path(__file__).resolve().parent.parent
FUZZ = ROOT / "fuzz"
sys.path.insert(0, str(FUZZ))
import targets  # noqa: E402

RUNS = int(os.environ.get("AGENTCAS_FUZZ_RUNS", "3000"))
NAMES = sorted(targets.TARGETS)


def inputs(kind: str, name: str) -> list[Path]:
    directory = FUZZ / kind / name
    return sorted(directory.iterdir()) if directory.is_dir() else []


def test_every_target_has_seeds():
    assert NAMES == sorted(["bundle", "manifest", "tree", "checkpoint", "chunklist", "segment", "encoding",
                            "framing", "envelope", "public_key", "private_key", "rollout"])
    for name in NAMES:
        assert inputs("corpus", name), f"no seed corpus for {name}"


@pytest.mark.parametrize("name", NAMES)
def test_seeds_and_regressions_are_handled(name):
    """Seeds (valid inputs) and past crash inputs: accepted, or refused with an allowed error."""
    for path in inputs("corpus", name) + inputs("regressions", name):
        targets.one_input(targets.TARGETS[name], path.read_bytes())


@pytest.mark.parametrize("name", NAMES)
def test_short_fuzz_run(name, tmp_path, record_property):
    pytest.importorskip("atheris", reason="atheris is not installed (pip install -e '.[fuzz]')")
    (tmp_path / "corpus").mkdir()
    proc = subprocess.run([sys.executable, str(FUZZ / "run.py"), name, f"-runs={RUNS}", "-seed=14",
                           f"-artifact_prefix={tmp_path}/", str(tmp_path / "corpus"), str(FUZZ / "corpus" / name)],
                          capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, AGENTCAS_FUZZ_SCRATCH=str(tmp_path)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    done = re.search(r"Done (\d+) runs", proc.stderr)
    assert done and int(done.group(1)) == RUNS, proc.stderr[-1000:]
    record_property("inputs_fuzzed", RUNS)


def test_regression_malformed_private_key_is_a_clear_error(tmp_path, store_dir, workspace):
    """Found by fuzz_private_key: a PEM key with an X448 OID and a 32-byte key made OpenSSL
    raise InternalError, printed as "internal error". Now: exit 4, one line naming the file."""
    bad = FUZZ / "regressions" / "private_key" / "x448-oid-with-an-ed25519-sized-key.pem"
    assert run_cli("commit", workspace, "-m", "x", store=store_dir).code == 0
    for argv in (["sign", "main", "--key", bad], ["export", "main", "-o", tmp_path / "b", "--sign", bad]):
        result = run_cli(*argv, store=store_dir)
        assert result.code == 4, result
        assert result.err.count("\n") == 1 and "internal error" not in result.err and str(bad) in result.err
    assert not (tmp_path / "b").exists()
