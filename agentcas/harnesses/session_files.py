"""Where Claude Code and Codex keep session files on this machine, and placing one there.

Claude Code: `<config dir>/projects/<project key>/<session id>.jsonl`, the config dir
`$CLAUDE_CONFIG_DIR`, else `~/.claude`; the project key is the workspace's absolute path
with every character other than an ASCII letter or digit turned into `-`
(`/home/dev/my.app` -> `-home-dev-my-app`). `claude --resume ID` looks only under the key
of the directory it runs in.
Codex: `$CODEX_HOME/sessions/YYYY/MM/DD/rollout-<local YYYY-MM-DDThh-mm-ss>-<id>.jsonl`
(`$CODEX_HOME` defaults to `~/.codex`); `codex resume ID` finds a rollout by the id at
the end of its name, under any date.

A session file is placed whole or not at all: written to a temporary file in the target
directory, fsynced, then hard-linked to its name (which fails if the name exists, so an
existing file is never replaced) and the temporary name removed. A SIGKILL leaves at most
a temporary `.agentcas-*` file beside it, which the harness does not read.
"""

from __future__ import annotations

import datetime
import os
import re
import secrets

from agentcas.cas import crashpoints
from agentcas.errors import ConflictError, UsageError

SESSION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,127}")
TEMP_PREFIX = ".agentcas-session-"


class BadSessionId(UsageError):
    """A session or thread id that cannot name a file (a `/`, `..`, a control character)."""


def check_session_id(value, what: str = "session id") -> str:
    """`value` if it can be a file name part and a thread name part, else BadSessionId."""
    if not isinstance(value, str) or not SESSION_ID.fullmatch(value):
        shown = repr(value)[:80]
        raise BadSessionId(f"{what} {shown} is not a harness id (letters, digits, '-' and '_' only); "
                           "nothing was written")
    return value


def home(env) -> str:
    value = env.get("HOME")
    return value if value else os.path.expanduser("~")


def claude_config_dir(env=os.environ) -> str:
    return env.get("CLAUDE_CONFIG_DIR") or os.path.join(home(env), ".claude")


def project_key(path: str) -> str:
    """Claude Code's directory name for a project: non-alphanumerics (ASCII) become '-'."""
    return re.sub(r"[^A-Za-z0-9]", "-", path)


def claude_session_path(workspace: str, session_id: str, env=os.environ) -> str:
    check_session_id(session_id)
    return os.path.join(claude_config_dir(env), "projects", project_key(os.path.abspath(workspace)),
                        f"{session_id}.jsonl")


def codex_home(env=os.environ) -> str:
    return env.get("CODEX_HOME") or os.path.join(home(env), ".codex")


def codex_rollout_path(thread_id: str, when: datetime.datetime, env=os.environ) -> str:
    """Where Codex writes a new rollout of `thread_id` started at `when` (local time)."""
    check_session_id(thread_id, "thread id")
    local = when.astimezone()
    return os.path.join(codex_home(env), "sessions", f"{local.year:04d}", f"{local.month:02d}",
                        f"{local.day:02d}", f"rollout-{local.strftime('%Y-%m-%dT%H-%M-%S')}-{thread_id}.jsonl")


def find_codex_rollouts(thread_id: str, env=os.environ) -> list[str]:
    """The rollout files of `thread_id` under `$CODEX_HOME/sessions` (any date), sorted."""
    import glob  # lazy, as uuid below: a hook that only checkpoints needs neither
    check_session_id(thread_id, "thread id")
    pattern = os.path.join(glob.escape(codex_home(env)), "sessions", "*", "*", "*",
                           f"rollout-*-{glob.escape(thread_id)}.jsonl")
    return sorted(path for path in glob.glob(pattern) if os.path.isfile(path))


def new_claude_id() -> str:
    import uuid
    return str(uuid.uuid4())


def new_codex_id() -> str:
    """A UUIDv7, as Codex makes thread ids: 48 bits of Unix milliseconds, then random bits."""
    import time
    import uuid
    millis = time.time_ns() // 1_000_000
    value = (millis & ((1 << 48) - 1)) << 80 | secrets.randbits(80)
    value = (value & ~(0xF << 76)) | (0x7 << 76)          # version 7
    value = (value & ~(0x3 << 62)) | (0x2 << 62)          # RFC 4122 variant
    return str(uuid.UUID(int=value))


def place_file(path: str, data: bytes) -> bool:
    """Write `data` at `path` whole or not at all, never replacing a file there.

    Returns True if it was written, False if the same bytes were already there; a different
    file there raises ConflictError (exit 3) and nothing is written.
    """
    if _same_file(path, data) is not None:
        if _same_file(path, data):
            return False
        raise ConflictError(f"a different session file is already at {path}; nothing was written")
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    temp = os.path.join(directory, f"{TEMP_PREFIX}{secrets.token_hex(6)}")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        crashpoints.reached("session.file.written")
        try:
            os.link(temp, path)
        except FileExistsError:
            if _same_file(path, data):
                return False
            raise ConflictError(f"a different session file appeared at {path}; nothing was written") from None
        crashpoints.reached("session.file.linked")
        _fsync_dir(directory)
        return True
    finally:
        try:
            os.unlink(temp)
        except FileNotFoundError:
            pass


def _same_file(path: str, data: bytes) -> bool | None:
    """None if nothing is at `path`, else whether it holds exactly `data`."""
    try:
        with open(path, "rb") as handle:
            return os.fstat(handle.fileno()).st_size == len(data) and handle.read() == data
    except FileNotFoundError:
        return None
    except IsADirectoryError:
        return False


def _fsync_dir(directory: str) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
