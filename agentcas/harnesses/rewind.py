"""Back to a step: rewind a harness session's files and conversation, or resume it elsewhere.

`rewind THREAD --to REV`:
- code: the workspace is checkpointed as it is now (the answer's `undo`, on THREAD, at its
  head), then made equal to REV's tree (workspace/sync.py: verified before a byte is
  written, ignored files and `.git` untouched, each file replaced atomically). Rewinding
  to `undo` puts it back; a rewind killed half-way is completed by running it again.
- conversation: a new session the harness resumes, forked from the stored one at REV's
  history position; the original file is untouched. Claude Code: the stored lines up to
  REV with every record's `sessionId` set to a new id (a byte-level replacement of that
  one field, so every other byte is as stored), at `<config dir>/projects/<project
  key>/<new id>.jsonl`. Codex: a `session_meta` line with the new id and `forked_from_id`
  (the original's first session_meta, otherwise as it was), then the stored records up
  to REV as they are, at `$CODEX_HOME/sessions/YYYY/MM/DD/rollout-<local time>-<new id>.jsonl`.

`resume THREAD [--at REV]`: the stored session, byte for byte and under its own id, where
this machine's harness finds it (Claude: under the project key of `--cwd`, else of the
directory the session recorded if it exists here, else of the current directory). The same
file already there: nothing to do; a different one: ConflictError (exit 3), nothing written.

Which harness and id a thread holds is read from its records (discovery.identify), not
from its name.
"""

from __future__ import annotations

import datetime
import json
import os
import re
from dataclasses import dataclass

from agentcas.errors import NotFound, UsageError
from agentcas.harnesses import discovery, session_files
from agentcas.harnesses.records import CLAUDE, CODEX, iter_lines, parse_line
from agentcas.result import Result, json_value

HEAD_RECORDS = 64


@dataclass(frozen=True)
class SessionPlacement(Result):
    """A session file written (or found already there) where its harness resumes it."""

    harness: str
    id: str
    path: str
    resume: str        # the command that continues it
    written: bool      # False: the same file was already there


@dataclass(frozen=True)
class RewindResult(Result):
    """What a rewind did: the checkpoint of the workspace before it (`undo`), the files
    written and removed to make it equal to `target`'s, the forked session."""

    target: str
    undo: str | None
    workspace: str | None
    session: SessionPlacement | None
    written: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()

    def to_json(self) -> dict:
        return {"target": self.target, "undo": self.undo, "workspace": self.workspace,
                "session": json_value(self.session), "files_written": list(self.written),
                "files_removed": list(self.removed)}


@dataclass(frozen=True)
class SessionResumed(Result):
    """`resume`: the stored session placed for the harness; its JSON is a rewind's that
    rewound no files (`undo` null), `workspace` the checkout it was placed for, if named."""

    workspace: str | None
    session: SessionPlacement

    def to_json(self) -> dict:
        return {"undo": None, "workspace": self.workspace, "session": self.session.to_json()}


@dataclass(frozen=True)
class StoredSession:
    harness: str
    id: str
    data: bytes            # the stored lines up to the position asked for
    recorded_cwd: str | None


def stored_session(store, thread: str, history) -> StoredSession:
    """The session a thread's history holds, up to `history` (a HistoryPosition)."""
    data = store.history.read_at(history, 0, history.seq)
    head = b"".join(store.history.read(thread, 0, min(HEAD_RECORDS, history.seq))) if history.seq else b""
    for harness in (CODEX, CLAUDE):
        identity = discovery.identify(harness, head, discovery.SessionFile(thread))
        if identity is not None:
            break
    else:
        raise UsageError(f"{thread!r} holds no Claude Code or Codex session (no session id in its first "
                         f"{HEAD_RECORDS} records); nothing was written")
    if "/agents/" in identity.thread:
        raise UsageError(f"{thread!r} is a subagent's transcript; rewind or resume its session instead")
    session_id = identity.thread.split("/", 1)[1]
    session_files.check_session_id(session_id)
    return StoredSession(harness, session_id, data, _recorded_cwd(harness, head))


def _recorded_cwd(harness: str, head: bytes) -> str | None:
    for _, raw in iter_lines(head):
        record = parse_line(raw)
        if record is None:
            continue
        where = record.get("payload", {}).get("cwd") if harness == CODEX and isinstance(record.get("payload"), dict) \
            else record.get("cwd")
        if isinstance(where, str) and os.path.isabs(where):
            return where
    return None


def resume_command(harness: str, session_id: str) -> str:
    return f"claude --resume {session_id}" if harness == CLAUDE else f"codex resume {session_id}"


# --- rewind ----------------------------------------------------------------------------------

def rewind(store, thread: str, rev: str, only: str | None = None, workspace: str | None = None,
           env=os.environ) -> RewindResult:
    """Rewind THREAD's workspace (code) and conversation to checkpoint `rev`."""
    if only not in (None, "code", "conversation"):
        raise UsageError(f"--only takes code or conversation, not {only!r}")
    store.threads.get(thread)   # NotFound unless it exists
    digest, checkpoint = store.checkpoints.get(rev)
    if only != "conversation" and "workspace" not in checkpoint.runtime and _empty_tree(checkpoint.tree):
        raise UsageError(f"{rev} holds no workspace (an ingest checkpoint of the session alone): rewinding the "
                         "files to it would remove them all; use --only conversation, or a hook's checkpoint; "
                         "nothing was changed")
    if workspace is None:
        workspace = checkpoint.runtime.get("workspace") or _head_workspace(store, thread)
    session = stored_session(store, thread, checkpoint.history) if only != "code" else None
    if workspace is None and only != "conversation":
        raise UsageError(f"no workspace recorded for {thread!r} (its checkpoints were not taken by a hook): "
                         "give --workspace DIR")
    undo: str | None = None
    written: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    if only != "conversation" and workspace is not None:
        from agentcas.workspace.sync import sync_tree
        if not os.path.isdir(workspace):
            raise UsageError(f"workspace is not a directory: {workspace}; nothing was changed")
        before = store.sessions.checkpoint(workspace, thread, f"before rewind to {digest.short()}",
                                          lambda state: b"")
        undo = before.checkpoint
        result = sync_tree(store.source, workspace, _digest(before.tree), checkpoint.tree)
        written, removed = result.written, result.removed
    placement = None
    if session is not None:
        placement = fork_session(session, workspace or session.recorded_cwd, env)
    return RewindResult(digest.hex(), undo, None if workspace is None else os.path.realpath(workspace),
                        placement, written, removed)


def _empty_tree(tree) -> bool:
    from agentcas.lineage.marks import EMPTY_TREE
    return tree == EMPTY_TREE.digest()


def _digest(hex_id: str):
    from agentcas.cas.digest import Digest
    return Digest.parse(hex_id)


def _head_workspace(store, thread: str) -> str | None:
    state = store.threads.get(thread)
    if state.checkpoint is None:
        return None
    return store.checkpoints.show(state.checkpoint.hex()).runtime.get("workspace")


def fork_session(session: StoredSession, workspace: str | None, env=os.environ) -> SessionPlacement:
    """Write a new session forked from `session` where its harness resumes it."""
    now = datetime.datetime.now(datetime.timezone.utc)
    if session.harness == CLAUDE:
        if workspace is None:
            raise UsageError("the Claude Code session names no directory: give --workspace DIR")
        new_id = session_files.new_claude_id()
        data = _claude_with_id(session.data, session.id, new_id)
        path = session_files.claude_session_path(workspace, new_id, env)
    else:
        new_id = session_files.new_codex_id()
        data = _codex_fork_meta(session.data, session.id, new_id, now) + session.data
        path = session_files.codex_rollout_path(new_id, now, env)
    written = session_files.place_file(path, data)
    return SessionPlacement(session.harness, new_id, path, resume_command(session.harness, new_id), written)


def _claude_with_id(data: bytes, old: str, new: str) -> bytes:
    """Every record's `sessionId` `old` set to `new`, each other byte as it was."""
    pattern = re.compile(rb'("sessionId"\s*:\s*)"' + re.escape(old.encode()) + rb'"')
    return pattern.sub(lambda m: m.group(1) + b'"' + new.encode() + b'"', data)


def _codex_fork_meta(data: bytes, old: str, new: str, now: datetime.datetime) -> bytes:
    """The fork's own first line: the original's first session_meta with the new id,
    `forked_from_id` and the time of the fork."""
    payload = None
    for _, raw in iter_lines(data):
        record = parse_line(raw)
        if record is not None and record.get("type") == "session_meta" and isinstance(record.get("payload"), dict):
            payload = dict(record["payload"])
            break
    if payload is None:
        raise UsageError("the Codex rollout has no session_meta record to fork from; nothing was written")
    stamp = now.strftime("%Y-%m-%dT%H:%M:%S.") + f"{now.microsecond // 1000:03d}Z"
    payload = {"id": new, "forked_from_id": old,
               **{k: v for k, v in payload.items() if k not in ("id", "forked_from_id")}, "timestamp": stamp}
    line = {"timestamp": stamp, "type": "session_meta", "payload": payload}
    return json.dumps(line, separators=(",", ":"), ensure_ascii=False).encode("utf-8") + b"\n"


# --- resume ----------------------------------------------------------------------------------

def resume(store, thread: str, at: str | None = None, cwd: str | None = None,
           env=os.environ) -> SessionPlacement:
    """Write THREAD's stored session (to REV `at`, default its whole history) where the
    harness finds it, under its own id."""
    state = store.threads.get(thread)
    history = state.history if at is None else store.checkpoints.get(at)[1].history
    if at is not None and store.checkpoints.get(at)[1].thread != thread:
        _check_on_thread(store, thread, history)
    if history.seq == 0:
        raise NotFound(f"thread {thread!r} holds no session records; nothing was written")
    session = stored_session(store, thread, history)
    if session.harness == CLAUDE:
        # The checkout the session belongs to here: --cwd, else the directory it recorded if
        # this machine has it, else the directory resume runs in (where `claude --resume` will).
        where = cwd or (session.recorded_cwd if session.recorded_cwd and os.path.isdir(session.recorded_cwd)
                        else os.getcwd())
        path = session_files.claude_session_path(os.path.abspath(where), session.id, env)
    else:
        existing = session_files.find_codex_rollouts(session.id, env)
        if existing:
            path = existing[0]
            for other in existing:
                with open(other, "rb") as handle:
                    if handle.read() == session.data:
                        path = other
                        break
        else:
            path = session_files.codex_rollout_path(session.id, _codex_started(session.data), env)
    written = session_files.place_file(path, session.data)
    return SessionPlacement(session.harness, session.id, path, resume_command(session.harness, session.id),
                            written)


def _check_on_thread(store, thread: str, history) -> None:
    """REV's history must be a prefix of the thread's (a checkpoint of this session)."""
    head = store.threads.get(thread).history
    read = store.history.read_at
    if history.seq > head.seq or read(head, 0, history.seq) != read(history, 0, history.seq):
        raise UsageError(f"the checkpoint given with --at is not on {thread!r}; nothing was written")


def _codex_started(data: bytes) -> datetime.datetime:
    """When the rollout began (its first session_meta's timestamp), for its file name."""
    for _, raw in iter_lines(data):
        record = parse_line(raw)
        if record is None or record.get("type") != "session_meta":
            continue
        for value in (record.get("payload", {}).get("timestamp") if isinstance(record.get("payload"), dict)
                      else None, record.get("timestamp")):
            if isinstance(value, str):
                try:
                    return datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
                except ValueError:
                    continue
        break
    return datetime.datetime.now(datetime.timezone.utc)
