"""Run one fuzz target under atheris (libFuzzer): `python fuzz/run.py TARGET [libFuzzer args] [CORPUS...]`.

agentcas is imported instrumented (coverage-guided); an input that raises outside the
target's allowed set stops the run with a non-zero exit and a crash-* file (see
-artifact_prefix). `make fuzz` runs every target for FUZZ_RUNS inputs (default 10^6).
"""

import os
import sys

import atheris

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

with atheris.instrument_imports(include=["agentcas"]):
    import targets


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in targets.TARGETS:
        sys.exit(f"usage: run.py TARGET [libFuzzer args]; targets: {' '.join(sorted(targets.TARGETS))}")
    target = targets.TARGETS[sys.argv.pop(1)]
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 1000))
    atheris.Setup(sys.argv, lambda data: targets.one_input(target, data))
    atheris.Fuzz()


if __name__ == "__main__":
    main()
