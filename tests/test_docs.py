"""The repository stands alone, and docs/CLI.md lists what `agentcas --help` does.

A clone has no `../shared`: nothing in README.md, docs/, tests/ or the package may send a
reader (or a test) there. docs/CLI.md is the command reference: every command, subcommand
and option that the help of the installed command lists must appear in it.
"""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest

from agentcas.cli import cli

ROOT = Path(__file__).resolve().parent.parent
OUTSIDE = re.compile(r"\.\./shared\b|/work/shared\b|\bshared/background\b|agent-logs\.md|harness-hooks\.md")


def repository_texts():
    yield ROOT / "README.md"
    for folder, pattern in (("docs", "*.md"), ("tests", "*.py"), ("agentcas", "*.py"), ("bench", "*.py")):
        yield from (p for p in sorted((ROOT / folder).rglob(pattern)) if p != Path(__file__).resolve())


@pytest.mark.parametrize("path", list(repository_texts()), ids=lambda p: str(p.relative_to(ROOT)))
def test_nothing_points_outside_the_repository(path):
    text = path.read_text(encoding="utf-8", errors="replace")
    found = OUTSIDE.search(text)
    assert found is None, f"{path.relative_to(ROOT)} points outside the repository: {found.group(0)!r}"


def commands(group: click.Group, path=("agentcas",)):
    """(command path, its option names) for every command and subcommand."""
    for name, command in sorted(group.commands.items()):
        here = (*path, name)
        options = sorted({opt for param in command.params if isinstance(param, click.Option) and not param.hidden
                          for opt in param.opts if opt not in ("--json", "-h", "--help")})
        yield " ".join(here[1:]), options
        if isinstance(command, click.Group):
            yield from commands(command, here)


CLI_MD = (ROOT / "docs" / "CLI.md").read_text()


def bullet_of(command: str) -> str:
    """The list item of docs/CLI.md that describes `command` (it names it in code quotes)."""
    items = re.split(r"\n(?=- `)", CLI_MD)
    pattern = re.compile(rf"`{re.escape(command)}(?:[ `])")
    found = [item for item in items if item.startswith("- `") and pattern.search(item)]
    assert found, f"docs/CLI.md does not describe `agentcas {command}`"
    return found[0]


@pytest.mark.parametrize("command, options", list(commands(cli)), ids=lambda v: v if isinstance(v, str) else None)
def test_every_command_and_option_is_in_the_cli_reference(command, options):
    item = bullet_of(command)
    for option in options:
        assert re.search(rf"{re.escape(option)}\b", item), f"docs/CLI.md's `{command}` item lacks {option}"


def test_the_reference_gives_every_exit_code_and_revision_form():
    for code in ("| 0 |", "| 1 |", "| 2 |", "| 3 |", "| 4 |"):
        assert code in CLI_MD
    for form in ("`THREAD~N`", "`THREAD@{N}`", "at least 8", '{"error": MESSAGE, "exit_code": N}'):
        assert form in CLI_MD, form
    for option in ("--store", "--refs", "--json", "--version"):
        assert f"`{option}" in CLI_MD


def test_the_harness_formats_show_sample_records_of_both():
    text = (ROOT / "docs" / "HARNESSES.md").read_text()
    blocks = re.findall(r"```json\n(.*?)```", text, re.S)
    import json
    records = [json.loads(line) for block in blocks for line in block.splitlines() if line.strip()]
    assert any(r.get("type") == "session_meta" and "payload" in r for r in records)       # Codex
    assert any(r.get("type") == "assistant" and "parentUuid" in r for r in records)      # Claude Code
