"""Several real processes started so they work at the same moment."""

from __future__ import annotations

import subprocess
import sys
import time


def start_together(script: str, args: list[list[str]], barrier) -> list:
    """Processes running `script` that each wait for the others to be ready before working."""
    barrier.mkdir()
    procs = [subprocess.Popen([sys.executable, "-c", script, *a, str(barrier)]) for a in args]
    while len(list(barrier.iterdir())) < len(procs):
        assert all(p.poll() is None for p in procs)
        time.sleep(0.01)
    (barrier / "go").touch()
    return procs
