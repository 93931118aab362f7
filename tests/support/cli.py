"""The real `agentcas` command in a subprocess, run the way a user would."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

AGENTCAS = shutil.which("agentcas", path=str(Path(sys.executable).parent)) or "agentcas"


class Result:
    def __init__(self, proc: subprocess.CompletedProcess):
        self.code = proc.returncode
        self.out = proc.stdout
        self.err = proc.stderr

    def json(self):
        return json.loads(self.out)

    def __repr__(self):
        return f"Result(code={self.code}, out={self.out[-500:]!r}, err={self.err[-500:]!r})"


def run_cli(*args, store=None, input=None, env=None, cwd=None, timeout=120) -> Result:
    """Run the installed `agentcas` command the way a user would."""
    argv = [AGENTCAS] + (["--store", str(store)] if store is not None else []) + [str(a) for a in args]
    full_env = dict(os.environ, **(env or {}))
    full_env.pop("AGENTCAS_DEBUG", None)
    proc = subprocess.run(argv, input=input, capture_output=True, text=isinstance(input, str) or input is None,
                          env=full_env, cwd=cwd, timeout=timeout)
    return Result(proc)
