"""Adding the agentcas hook to Claude Code's settings and Codex's `notify`, and taking it out.

Claude Code: `~/.claude/settings.json` (`$CLAUDE_CONFIG_DIR/settings.json`), or a
project's `.claude/settings.json`. One command hook (`agentcas hook claude`) under each of
PostToolUse (matcher `*`), UserPromptSubmit and Stop; every other key, event and hook is
kept as it was, in its order. Ours are recognised by their command (`... hook claude`).
Codex: `$CODEX_HOME/config.toml`, a top-level `notify = ["agentcas", "hook", "codex"]`
line; the file is read with tomllib and edited as text (one line added or removed), so
its comments and layout stay. A `notify` of another program is left alone and reported
(Codex runs one notify program).

Both are idempotent: installing twice, or uninstalling what is not there, writes nothing.
Files are replaced atomically (temporary file, fsync, rename).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import shutil
import sys
from dataclasses import dataclass

import tomllib

from agentcas.errors import AgentcasError, ConflictError
from agentcas.harnesses import session_files

CLAUDE_EVENTS = (("PostToolUse", "*"), ("UserPromptSubmit", None), ("Stop", None))
HOOK_TIMEOUT_SECONDS = 120


class SettingsError(AgentcasError):
    """A settings file that cannot be read or written as it is."""


@dataclass(frozen=True)
class InstallResult:
    harness: str
    path: str
    changed: bool
    installed: bool
    command: str

    def to_json(self) -> dict:
        return {"harness": self.harness, "path": self.path, "changed": self.changed,
                "installed": self.installed, "command": self.command}


def agentcas_argv(store: str | None = None) -> list[str]:
    """How the harness should run this agentcas: its name when PATH finds this one, else its path."""
    here = os.path.realpath(sys.argv[0]) if sys.argv and sys.argv[0] else None
    found = shutil.which("agentcas")
    program = "agentcas" if found and here and os.path.realpath(found) == here else (here or "agentcas")
    if not os.path.basename(program).startswith("agentcas"):
        program = found or "agentcas"
    return [program] + (["--store", os.path.abspath(store)] if store else [])


def claude_settings_path(project: str | None, env=os.environ) -> str:
    if project is not None:
        return os.path.join(os.path.abspath(project), ".claude", "settings.json")
    return os.path.join(session_files.claude_config_dir(env), "settings.json")


def _is_ours(command, harness: str) -> bool:
    return isinstance(command, str) and re.search(rf"(^|[\s/])agentcas\b.*\shook\s+{harness}\b", command) is not None


def install_claude(project: str | None = None, uninstall: bool = False, store: str | None = None,
                   env=os.environ) -> InstallResult:
    path = claude_settings_path(project, env)
    command = shlex.join(agentcas_argv(store) + ["hook", "claude"])
    text = _read_text(path)
    try:
        settings = json.loads(text) if text and text.strip() else {}
    except ValueError as exc:
        raise SettingsError(f"{path} is not valid JSON ({exc}); nothing was changed") from None
    if not isinstance(settings, dict):
        raise SettingsError(f"{path} does not hold a JSON object; nothing was changed")
    hooks = settings.get("hooks", {})
    if not isinstance(hooks, dict):
        raise SettingsError(f"{path}: 'hooks' is not an object; nothing was changed")
    changed = False
    if uninstall:
        for event in list(hooks):
            groups = hooks[event]
            if not isinstance(groups, list):
                continue
            kept_groups = []
            for group in groups:
                if isinstance(group, dict) and isinstance(group.get("hooks"), list):
                    kept = [h for h in group["hooks"]
                            if not (isinstance(h, dict) and _is_ours(h.get("command"), "claude"))]
                    if len(kept) != len(group["hooks"]):
                        changed = True
                        if not kept:
                            continue
                        group = dict(group, hooks=kept)
                kept_groups.append(group)
            if kept_groups:
                hooks[event] = kept_groups
            else:
                del hooks[event]
        if changed and not hooks:
            settings.pop("hooks", None)
    else:
        for event, matcher in CLAUDE_EVENTS:
            groups = hooks.setdefault(event, [])
            if not isinstance(groups, list):
                raise SettingsError(f"{path}: hooks.{event} is not a list; nothing was changed")
            present = any(isinstance(g, dict) and isinstance(g.get("hooks"), list)
                          and any(isinstance(h, dict) and _is_ours(h.get("command"), "claude") for h in g["hooks"])
                          for g in groups)
            if present:
                continue
            group = {"matcher": matcher} if matcher is not None else {}
            group["hooks"] = [{"type": "command", "command": command, "timeout": HOOK_TIMEOUT_SECONDS}]
            groups.append(group)
            changed = True
        settings["hooks"] = hooks
    if changed:
        _replace(path, (json.dumps(settings, indent=2, ensure_ascii=False) + "\n").encode("utf-8"))
    return InstallResult("claude", path, changed, not uninstall, command)


def codex_config_path(env=os.environ) -> str:
    return os.path.join(session_files.codex_home(env), "config.toml")


def install_codex(uninstall: bool = False, store: str | None = None, env=os.environ) -> InstallResult:
    path = codex_config_path(env)
    argv = agentcas_argv(store) + ["hook", "codex"]
    text = _read_text(path) or ""
    try:
        config = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError(f"{path} is not valid TOML ({exc}); nothing was changed") from None
    notify = config.get("notify")
    ours = isinstance(notify, list) and bool(notify) and all(isinstance(a, str) for a in notify) \
        and _is_ours(" ".join(notify), "codex")
    line = "notify = " + json.dumps(argv, ensure_ascii=False)
    if uninstall:
        if not ours:
            return InstallResult("codex", path, False, False, line)
        new_text = _drop_notify(text, path)
    else:
        if ours:
            return InstallResult("codex", path, False, True, line)
        if notify is not None:
            raise ConflictError(f"{path} already has notify = {json.dumps(notify)[:200]} (Codex runs one notify "
                                "program); nothing was changed: remove it first, or call it from a script that "
                                "also runs 'agentcas hook codex \"$1\"'")
        new_text = line + "\n" + text
    try:
        check = tomllib.loads(new_text)
    except tomllib.TOMLDecodeError as exc:   # the edit must leave a file Codex can read
        raise SettingsError(f"editing {path} would break it ({exc}); nothing was changed") from None
    expected = {k: v for k, v in config.items() if k != "notify"}
    if not uninstall:
        expected["notify"] = argv
    if check != expected:
        raise SettingsError(f"editing {path} would change more than its notify line; nothing was changed")
    _replace(path, new_text.encode("utf-8"))
    return InstallResult("codex", path, True, not uninstall, line)


def _drop_notify(text: str, path: str) -> str:
    """`text` without its top-level `notify = [...]` assignment (one or more lines)."""
    lines = text.splitlines(keepends=True)
    for index, line in enumerate(lines):
        stripped = line.lstrip()
        if stripped.startswith("["):
            break   # a table header: a notify below it is not the top-level one
        if re.match(r"notify\s*=", stripped):
            end, depth = index, 0
            while end < len(lines):
                depth += _bracket_depth(lines[end])
                if depth <= 0:
                    break
                end += 1
            return "".join(lines[:index] + lines[end + 1:])
    raise SettingsError(f"{path}: cannot find its notify line; nothing was changed")


def _bracket_depth(line: str) -> int:
    """Net '[' minus ']' outside strings and comments on one TOML line."""
    depth, quote, index = 0, None, 0
    while index < len(line):
        char = line[index]
        if quote:
            if char == "\\" and quote == '"':
                index += 1
            elif char == quote:
                quote = None
        elif char in "\"'":
            quote = char
        elif char == "#":
            break
        elif char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        index += 1
    return depth


def _read_text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        why = getattr(exc, "strerror", None) or exc
        raise SettingsError(f"cannot read {path}: {why}; nothing was changed") from None


def _replace(path: str, data: bytes) -> None:
    """Replace `path` by `data` atomically, keeping its mode (a new file: 0600)."""
    directory = os.path.dirname(path)
    try:
        os.makedirs(directory, exist_ok=True)
        mode = os.stat(path).st_mode & 0o777 if os.path.exists(path) else 0o600
        temp = os.path.join(directory, f".{os.path.basename(path)}.agentcas-{secrets.token_hex(6)}")
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(data)
                out.flush()
                os.fsync(out.fileno())
            os.replace(temp, path)
        except BaseException:
            try:
                os.unlink(temp)
            except OSError:
                pass
            raise
    except OSError as exc:
        raise SettingsError(f"cannot write {path}: {exc.strerror}; nothing was changed") from None
