"""Every code block in README.md runs as written, each in an empty directory.

Shell blocks run under `sh -e` with the installed `agentcas` first on PATH and HOME a fresh
directory (so `~/...` lands in the test's own space); the Python block runs with this
interpreter. A block that cannot run here says why in a comment just above it,
`<!-- not run here: REASON -->`; its `make` targets must exist (`make -n`) and each of its
`agentcas` command lines must parse (the line run with `--help` appended).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
BLOCK = re.compile(r"(?:<!-- not run here: (?P<reason>[^>]+?) -->\n)?```(?P<lang>\w+)\n(?P<body>.*?)```\n", re.S)


def blocks() -> list[tuple[str, str, str | None, int]]:
    """(language, body, reason it is not run or None, line) of every fenced block."""
    text = README.read_text()
    return [(m["lang"], m["body"], m["reason"], text.count("\n", 0, m.start("lang")) + 1)
            for m in BLOCK.finditer(text)]


def test_the_readme_has_the_blocks_this_file_expects():
    """Every fence is matched (a block the pattern missed would go untested)."""
    found = blocks()
    assert len(found) == README.read_text().count("```") // 2
    assert {lang for lang, *_ in found} == {"sh", "python"}
    assert sum(1 for *_, reason, _ in found if reason is None) >= 3


def environment(home: Path) -> dict:
    env = dict(os.environ, HOME=str(home), PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    for name in ("AGENTCAS_STORE", "AGENTCAS_REFS", "AGENTCAS_DEBUG"):
        env.pop(name, None)
    return env


@pytest.mark.parametrize("lang, body, reason, line", [b for b in blocks() if b[2] is None],
                         ids=lambda value: str(value) if isinstance(value, int) else None)
def test_a_readme_block_runs_as_written_in_an_empty_directory(tmp_path, lang, body, reason, line):
    here = tmp_path / "empty"
    here.mkdir()
    (tmp_path / "home").mkdir()
    argv = ["sh", "-e", "-c", body] if lang == "sh" else [sys.executable, "-c", body]
    proc = subprocess.run(argv, cwd=here, env=environment(tmp_path / "home"), capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, f"README.md block at line {line} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("lang, body, reason, line", [b for b in blocks() if b[2] is not None],
                         ids=lambda value: str(value) if isinstance(value, int) else None)
def test_a_block_that_needs_more_than_a_directory_still_names_real_commands(tmp_path, lang, body, reason, line):
    assert lang == "sh" and reason.strip()
    commands = [c for c in (part.strip() for raw in body.replace("\\\n", " ").splitlines()
                            for part in raw.split("#", 1)[0].split("&&")) if c]
    assert commands, line
    for command in commands:
        words = shlex.split(command)
        while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):  # VAR=value before the command
            words.pop(0)
        if words[0] == "make":
            dry = subprocess.run(["make", "-n", *words[1:]], cwd=ROOT, capture_output=True, text=True)
            assert dry.returncode == 0, (line, command, dry.stderr)
        elif words[0] == "agentcas":
            parsed = subprocess.run([*words, "--help"], env=environment(tmp_path), capture_output=True, text=True,
                                    cwd=tmp_path)
            assert parsed.returncode == 0 and "Usage:" in parsed.stdout, (line, command, parsed.stderr)
        else:
            assert words[0] in ("export", "eval"), (line, command)
