"""Finding session files in each harness's on-disk layout, and naming their threads.

Codex: `~/.codex/sessions/YYYY/MM/DD/rollout-<time>-<id>.jsonl`; a directory is searched
recursively for `rollout-*.jsonl`. The thread is `codex/<id>` with the id of the FIRST
`session_meta` (later ones can be copied from a fork parent), never the file name.
Claude Code: `~/.claude/projects/<dir>/<session id>.jsonl`, subagents in
`<dir>/agent-<id>.jsonl` (v2.0.28+) or `<dir>/<session id>/subagents/**/agent-<id>.jsonl`
(v2.1.2+); a directory is searched recursively for `*.jsonl`. A session is
`claude/<sessionId>`; a subagent file (every record carries `agentId` and the PARENT's
`sessionId`) is `claude/<sessionId>/agents/<agentId>`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from agentcas.harnesses.records import CLAUDE, CODEX, iter_lines, parse_line, record_type

HEAD_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True)
class SessionFile:
    """A file to ingest: its path and what the layout says about it."""

    path: str
    subagent: bool = False


@dataclass(frozen=True)
class SessionIdentity:
    """The thread a session file becomes and the parent it links to in `lineage`."""

    thread: str
    parent: str | None = None     # thread name of the fork parent / owning session


def find_sessions(harness: str, paths) -> tuple[list[SessionFile], list[str]]:
    """(files found, paths that do not exist) for PATH arguments, in a stable order."""
    found, missing, seen = [], [], set()
    for path in paths:
        if os.path.isfile(path):
            candidates = [path]
        elif os.path.isdir(path):
            candidates = sorted(_walk(path, harness))
        else:
            missing.append(path)
            continue
        for candidate in candidates:
            real = os.path.abspath(candidate)   # not realpath: one lstat per component, per file
            if real in seen:
                continue
            seen.add(real)
            name = os.path.basename(candidate)
            found.append(SessionFile(candidate, harness == CLAUDE and name.startswith("agent-")))
    return found, missing


def _walk(root: str, harness: str):
    for directory, dirs, files in os.walk(root):
        dirs.sort()
        for name in files:
            if not name.endswith(".jsonl"):
                continue
            if harness == CODEX and not name.startswith("rollout-"):
                continue
            yield os.path.join(directory, name)


def identify(harness: str, head: bytes, session: SessionFile) -> SessionIdentity | None:
    """The thread for a file from its first complete lines, or None if they do not say."""
    for _, raw in iter_lines(head[:head.rfind(b"\n") + 1]):
        record = parse_line(raw)
        if record is None:
            continue
        if harness == CODEX:
            if record.get("type") != "session_meta":
                continue
            payload = record["payload"] if isinstance(record.get("payload"), dict) else {}
            thread_id = payload.get("id")
            if not isinstance(thread_id, str) or not thread_id:
                return None
            parent = payload.get("forked_from_id")
            return SessionIdentity(f"codex/{thread_id}",
                                   f"codex/{parent}" if isinstance(parent, str) and parent else None)
        session_id = record.get("sessionId")
        if not isinstance(session_id, str) or not session_id:
            continue
        agent_id = record.get("agentId")
        if session.subagent or (isinstance(agent_id, str) and agent_id and _agent_file(session.path)):
            if not isinstance(agent_id, str) or not agent_id:
                agent_id = os.path.basename(session.path)[len("agent-"):-len(".jsonl")]
            return SessionIdentity(f"claude/{session_id}/agents/{agent_id}", f"claude/{session_id}")
        return SessionIdentity(f"claude/{session_id}")
    return None


def _agent_file(path: str) -> bool:
    return os.path.basename(path).startswith("agent-")


def identify_file(harness: str, session: SessionFile) -> SessionIdentity | None:
    """`identify` over the file's head, read in growing pieces (64 KiB up to HEAD_BYTES,
    and beyond until the head holds a complete line, up to IDENTITY_MAX_BYTES: a first
    record may be a 64 MiB line)."""
    size = 65536
    with open(session.path, "rb") as handle:
        while True:
            handle.seek(0)
            head = handle.read(size)
            identity = identify(harness, head, session)
            if identity is not None or len(head) < size or size >= IDENTITY_MAX_BYTES \
                    or (size >= HEAD_BYTES and b"\n" in head):
                return identity
            size = min(size * 8, IDENTITY_MAX_BYTES)


IDENTITY_MAX_BYTES = 1 << 30   # a file whose first GiB holds no complete line is no session


# Claude Code records that carry no sessionId: a transcript may start with them (a
# `file-history-snapshot` is written before the first prompt).
_CLAUDE_ID_LESS = frozenset({"file-history-snapshot", "summary"})


def identity_to_come(harness: str, handle) -> bool:
    """Whether a file that `identify` found no thread in may still get one as it grows (it
    waits, nothing stored): it holds no complete line yet, or (Claude) its complete lines
    are only records that carry no sessionId. `handle` is the file, opened for reading."""
    handle.seek(0)
    head = handle.read(HEAD_BYTES)
    if b"\n" not in head:
        while True:   # the first line may be longer than the head: look for its end
            piece = handle.read(HEAD_BYTES)
            if not piece:
                return True
            if b"\n" in piece:
                return False
    if harness != CLAUDE:
        return False
    records = [parse_line(raw) for _, raw in iter_lines(head[:head.rfind(b"\n") + 1])]
    return all(record is not None and record_type(record) in _CLAUDE_ID_LESS for record in records)
