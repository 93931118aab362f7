"""The long fuzz run (`make fuzz`): every target for --runs inputs (default 10^6), one after another.

Each target runs in its own process (`fuzz/run.py`) from the seed corpus, with new
inputs kept in a scratch corpus (not the repository's) and crash files written to
--artifacts. Prints one line per target (inputs, seconds, inputs/s, result) and exits
non-zero if any target found a crash: turn each one into a regression input under
fuzz/regressions/TARGET/ and fix it.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--artifacts", default=os.path.join(tempfile.gettempdir(), "agentcas-fuzz-artifacts"))
    parser.add_argument("targets", nargs="*")
    args = parser.parse_args()
    from targets import TARGETS  # noqa: E402 - after sys.path; imports agentcas uninstrumented
    names = args.targets or sorted(TARGETS)
    os.makedirs(args.artifacts, exist_ok=True)
    failed = []
    print(f"{'target':<12} {'inputs':>10} {'seconds':>8} {'inputs/s':>9}  result", flush=True)
    for name in names:
        scratch = tempfile.mkdtemp(prefix=f"agentcas-fuzz-{name}-")
        started = time.monotonic()
        proc = subprocess.run([sys.executable, os.path.join(HERE, "run.py"), name, f"-runs={args.runs}",
                               "-print_final_stats=1", f"-artifact_prefix={args.artifacts}/{name}-",
                               scratch, os.path.join(HERE, "corpus", name)],
                              capture_output=True, text=True, env=dict(os.environ, AGENTCAS_FUZZ_SCRATCH=scratch))
        seconds = time.monotonic() - started
        shutil.rmtree(scratch, ignore_errors=True)
        done = re.search(r"Done (\d+) runs", proc.stderr)
        inputs = int(done.group(1)) if done else 0
        result = "ok" if proc.returncode == 0 and inputs == args.runs else f"FAILED (exit {proc.returncode})"
        if result != "ok":
            failed.append(name)
            sys.stderr.write(proc.stderr[-3000:])
        print(f"{name:<12} {inputs:>10,} {seconds:>8.1f} {inputs / seconds:>9,.0f}  {result}", flush=True)
    if failed:
        print(f"crashes in: {' '.join(failed)} (inputs in {args.artifacts})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
