"""Run every benchmark in bench/ (each `bench_*.py`) and print their tables.

    python bench/run.py                 # full sizes (what `make bench` runs)
    python bench/run.py --quick         # small sizes, a couple of minutes
    python bench/run.py --only rollout  # only bench_*rollout*.py
    python bench/run.py --save FILE     # also write the Markdown output to FILE

Each benchmark runs in its own process with the same flags (`--quick`), prints Markdown
tables on stdout and progress on stderr, and works in a temporary directory under
/tmp (or $BENCH_TMP) that it removes. A benchmark that fails is reported and the
others still run; the exit status is 1 if any failed. Speed is only measured here,
never asserted in tests. Needs git, restic, borg and b3sum on PATH (see docs/BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import harness as h  # noqa: E402

TOOLS = (("git", ["git", "--version"]), ("restic", ["restic", "version"]), ("borg", ["borg", "--version"]),
         ("b3sum", ["b3sum", "--version"]), ("cp", ["cp", "--version"]), ("zstd", ["zstd", "--version"]))


def tool_versions() -> list[str]:
    out = []
    for name, cmd in TOOLS:
        if shutil.which(cmd[0]) is None:
            out.append(f"{name}: MISSING")
            continue
        first = subprocess.run(cmd, capture_output=True, text=True).stdout.splitlines()
        out.append(first[0].strip() if first else name)
    try:
        from importlib.metadata import version
        out.append(f"langgraph {version('langgraph')}, langgraph-checkpoint-sqlite "
                   f"{version('langgraph-checkpoint-sqlite')}")
    except Exception:  # noqa: BLE001 - the bench extra is optional
        out.append("langgraph: not installed")
    from agentcas import __version__
    out.append(f"agentcas {__version__}")
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes")
    parser.add_argument("--only", action="append", default=[], metavar="NAME",
                        help="run only bench_*NAME*.py (repeatable)")
    parser.add_argument("--save", metavar="FILE", help="also write the Markdown output to FILE")
    args = parser.parse_args(argv)

    missing = [name for name, cmd in TOOLS if shutil.which(cmd[0]) is None]
    if missing:
        print(f"bench: missing tools: {', '.join(missing)} "
              "(apt-get install -y git restic borgbackup b3sum)", file=sys.stderr)
        return 2

    scripts = sorted(glob.glob(os.path.join(HERE, "bench_*.py")))
    if args.only:
        scripts = [s for s in scripts if any(o in os.path.basename(s) for o in args.only)]
    order = {"bench_store.py": 0, "bench_rollout.py": 1, "bench_langgraph.py": 2, "bench_step.py": 3,
             "bench_harnesses.py": 4, "bench_mcp.py": 5, "bench_shared.py": 6, "bench_ui.py": 7}
    scripts.sort(key=lambda s: (order.get(os.path.basename(s), 9), s))

    lines = [f"# agentcas benchmarks ({'quick' if args.quick else 'full'})", "",
             f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
             f"- command: `python bench/run.py{' --quick' if args.quick else ''}`",
             f"- machine: {h.machine_note()}",
             f"- {h.load_note()} at start",
             f"- tools: {'; '.join(tool_versions())}", ""]
    header = "\n".join(lines)
    print(header, flush=True)
    collected = [header]
    failed = []
    for script in scripts:
        name = os.path.basename(script)
        started = time.perf_counter()
        section = f"## {name}\n\n_{h.load_note()} at start_\n"
        print(section, flush=True)
        collected.append(section)
        proc = subprocess.Popen([sys.executable, script] + (["--quick"] if args.quick else []),
                                stdout=subprocess.PIPE, text=True)
        for line in proc.stdout:
            print(line, end="", flush=True)
            collected.append(line.rstrip("\n"))
        code = proc.wait()
        tail = f"_{name}: {h.fmt_time(time.perf_counter() - started)}, {h.load_note()} at end" + \
               (f", FAILED (exit {code})_" if code else "_") + "\n"
        print(tail, flush=True)
        collected.append(tail)
        if code:
            failed.append(name)
    if failed:
        print(f"bench: failed: {', '.join(failed)}", file=sys.stderr)
    if args.save:
        with open(args.save, "w") as handle:
            handle.write("\n".join(collected) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
