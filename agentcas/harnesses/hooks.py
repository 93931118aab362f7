"""Checkpoints taken inside Claude Code and Codex while they work (`agentcas hook ...`).

Claude Code runs `agentcas hook claude` with one event as JSON on stdin; Codex's `notify`
runs `agentcas hook codex PAYLOAD`. A checkpoint event (Claude: PostToolUse,
UserPromptSubmit, Stop; Codex: agent-turn-complete) becomes one checkpoint on the thread
`ingest` keeps for that session (`claude/<session id>`, `codex/<thread id>`):

1. The event is read and checked (a JSON object under MAX_EVENT_BYTES; ids that can name
   a file and a thread: no `/`, no `..`), before any store is opened.
2. The store: `--store`, `$AGENTCAS_STORE`, a `.agentcas` found upward from the
   workspace, else the per-user store (`$XDG_DATA_HOME/agentcas/store`, else
   `~/.local/share/agentcas/store`, made on first use).
3. `store.sessions.checkpoint` snapshots the workspace (`.git` never read, `.gitignore` and
   `.agentcasignore` honoured, likely credentials left out and named in the log) and
   appends the session file's new complete lines, exactly as `ingest` would append them
   (its prefix checked the same way, the same state row written), with one checkpoint at
   their end whose tree is the workspace. So an `ingest` after hooks finds nothing to add
   and nothing to refuse. A session file rewritten under the hook is refused by name as
   ingest refuses it; the workspace checkpoint is still made.

A hook prints nothing on stdout (Claude Code shows it, or gives it to the model) and never
exits 2 (that blocks the agent): every failure is one line on stderr, exit 1, and a line in
the hook log (`hooks.log` in the store directory; before a store is known, or for a shared
store, `$XDG_STATE_HOME/agentcas/hooks.log`, else `~/.local/state/agentcas/hooks.log`).
"""

from __future__ import annotations

import datetime
import json
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import blake3

from agentcas.errors import AgentcasError
from agentcas.harnesses import discovery, session_files
from agentcas.harnesses.records import CLAUDE, CODEX, preview

if TYPE_CHECKING:
    from agentcas.lineage.checkpoints import SessionCheckpoint

MAX_EVENT_BYTES = 64 * 1024 * 1024
CLAUDE_CHECKPOINT_EVENTS = frozenset({"PostToolUse", "UserPromptSubmit", "Stop"})
CODEX_CHECKPOINT_TYPES = frozenset({"agent-turn-complete"})
LOG_NAME = "hooks.log"


class HookFailed(AgentcasError):
    """A hook could not do its work (exit 1: the harness carries on)."""


@dataclass(frozen=True)
class HookEvent:
    """One checkpoint request from a harness, checked."""

    harness: str
    session_id: str
    workspace: str
    reason: str
    session_path: str | None      # the transcript / rollout file, if known

    @property
    def thread(self) -> str:
        return f"{self.harness}/{self.session_id}"


@dataclass(frozen=True)
class HookOutcome:
    """What a hook did: nothing (not a checkpoint event), or a checkpoint."""

    event: HookEvent | None
    checkpoint: SessionCheckpoint | None = None
    store: str | None = None
    notes: tuple = ()

    def to_json(self) -> dict:
        return {"thread": None if self.event is None else self.event.thread, "store": self.store,
                "checkpoint": None if self.checkpoint is None else self.checkpoint.to_json(),
                "notes": list(self.notes)}


# --- reading events ------------------------------------------------------------------------

def read_stdin_event(stream) -> bytes:
    """At most MAX_EVENT_BYTES of stdin; more is refused whole."""
    data = stream.read(MAX_EVENT_BYTES + 1)
    if len(data) > MAX_EVENT_BYTES:
        raise HookFailed(f"hook event larger than {MAX_EVENT_BYTES} bytes; nothing was written")
    return data


def _json_object(data, what: str) -> dict:
    if not data or not (data.strip() if isinstance(data, (bytes, str)) else data):
        raise HookFailed(f"empty {what}: expected one JSON object; nothing was written")
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):
        raise HookFailed(f"{what} is not JSON; nothing was written") from None
    if not isinstance(doc, dict):
        raise HookFailed(f"{what} is not a JSON object; nothing was written")
    return doc


def _text(doc: dict, key: str, what: str, required: bool = True) -> str | None:
    value = doc.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value or "\0" in value:
        raise HookFailed(f"{what} has no usable {key!r}; nothing was written")
    return value


def _workspace(path: str, what: str) -> str:
    if not os.path.isabs(path):
        raise HookFailed(f"{what}: workspace {preview(path, 200)!r} is not an absolute path; nothing was written")
    if not os.path.isdir(path):
        raise HookFailed(f"{what}: workspace {preview(path, 200)} is not a directory; nothing was written")
    return os.path.realpath(path)


def claude_event(data: bytes, env=os.environ) -> HookEvent | None:
    """The checkpoint request in a Claude Code hook event, or None for another event."""
    doc = _json_object(data, "Claude Code hook event on stdin")
    name = _text(doc, "hook_event_name", "the hook event")
    if name not in CLAUDE_CHECKPOINT_EVENTS:
        return None
    session_id = session_files.check_session_id(_text(doc, "session_id", "the hook event"))
    cwd = env.get("CLAUDE_PROJECT_DIR") or _text(doc, "cwd", "the hook event")
    workspace = _workspace(str(cwd), f"{name} event")
    transcript = doc.get("transcript_path")
    if transcript is not None and (not isinstance(transcript, str) or not transcript or "\0" in transcript):
        raise HookFailed(f"{name} event has an unusable 'transcript_path'; nothing was written")
    return HookEvent(CLAUDE, session_id, workspace, claude_reason(name, doc), transcript)


def claude_reason(name: str, doc: dict) -> str:
    """`claude PostToolUse Bash toolu_...: <command>`, `claude UserPromptSubmit: <prompt>`, ..."""
    parts = [f"claude {name}"]
    tool = doc.get("tool_name")
    if isinstance(tool, str) and tool:
        parts.append(preview(tool, 80))
    use_id = doc.get("tool_use_id")
    if isinstance(use_id, str) and use_id:
        parts.append(preview(use_id, 80))
    reason = " ".join(parts)
    detail = None
    tool_input: dict = doc["tool_input"] if isinstance(doc.get("tool_input"), dict) else {}
    for key in ("command", "file_path", "path", "pattern", "url", "description"):
        if isinstance(tool_input.get(key), str) and tool_input[key].strip():
            detail = tool_input[key]
            break
    if name == "UserPromptSubmit" and isinstance(doc.get("prompt"), str):
        detail = doc["prompt"]
    return reason + (f": {preview(detail, 200)}" if detail and detail.strip() else "")


def codex_event(payload: str, env=os.environ) -> HookEvent | None:
    """The checkpoint request in a Codex `notify` payload, or None for another type."""
    doc = _json_object(payload, "Codex notify payload")
    kind = _text(doc, "type", "the notify payload")
    if kind not in CODEX_CHECKPOINT_TYPES:
        return None
    thread_id = session_files.check_session_id(_text(doc, "thread-id", "the notify payload"), "thread id")
    turn_id = doc.get("turn-id")
    turn = preview(turn_id, 80) if isinstance(turn_id, str) and turn_id else "?"
    workspace = _workspace(str(_text(doc, "cwd", "the notify payload")), "agent-turn-complete")
    messages = doc.get("input-messages")
    prompt = next((m for m in reversed(messages) if isinstance(m, str) and m.strip()), None) \
        if isinstance(messages, list) else None
    reason = f"codex turn {turn} complete" + (f": {preview(prompt, 200)}" if prompt else "")
    rollouts = session_files.find_codex_rollouts(thread_id, env)
    return HookEvent(CODEX, thread_id, workspace, reason, rollouts[-1] if rollouts else None)


# --- the store and the log -----------------------------------------------------------------

def user_store_path(env=os.environ) -> str:
    base = env.get("XDG_DATA_HOME") or os.path.join(session_files.home(env), ".local", "share")
    return os.path.join(base, "agentcas", "store")


def user_log_path(env=os.environ) -> str:
    base = env.get("XDG_STATE_HOME") or os.path.join(session_files.home(env), ".local", "state")
    return os.path.join(base, "agentcas", LOG_NAME)


def hook_store_path(flag: str | None, workspace: str | None, env=os.environ) -> str:
    """Where a hook checkpoints: --store, $AGENTCAS_STORE, `.agentcas` upward, the user's store."""
    from agentcas.repository import find_store
    found = flag or env.get("AGENTCAS_STORE") or (find_store(workspace) if workspace else None)
    return found or user_store_path(env)


def open_hook_store(path: str, refs: str | None = None):
    from agentcas.cas.backends import parse_store_url
    from agentcas.repository import Store
    directory = parse_store_url(path).path   # None: memory:// or s3://, never made here
    if directory is None or os.path.isfile(os.path.join(directory, "data.mdb")):
        return Store.open(path, refs=refs)
    if os.path.exists(directory) and os.listdir(directory):
        return Store.open(path, refs=refs)   # refused clearly there: not a store
    return Store.init(path)[0]


def log_path_for(store_path: str | None, env=os.environ) -> str:
    from agentcas.cas.backends import parse_store_url
    from agentcas.errors import UsageError
    try:
        directory = parse_store_url(store_path).path if store_path else None   # None: not a directory
    except UsageError:
        directory = None   # a malformed s3:// URL: its error is logged with the user's
    if directory is not None and os.path.isfile(os.path.join(directory, "data.mdb")):
        return os.path.join(directory, LOG_NAME)
    return user_log_path(env)


def write_log(path: str, text: str) -> None:
    """Append one line (time, pid, text) to the hook log; a log that cannot be written is skipped."""
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    line = f"{stamp} pid {os.getpid()} {' '.join(text.split())}\n".encode("utf-8", "replace")
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, line)   # one write: lines of parallel hooks never interleave
        finally:
            os.close(fd)
    except OSError:
        pass


# --- the checkpoint --------------------------------------------------------------------------

def run_hook(store, event: HookEvent) -> HookOutcome:
    """Checkpoint the event's workspace with its session's new lines."""
    from agentcas.harnesses.ingest import IngestState
    reader = SessionLines(store, event)
    skip = [event.session_path] if event.session_path and os.path.isfile(event.session_path) else []
    result = store.sessions.checkpoint(event.workspace, event.thread, event.reason, reader, skip_files=skip)
    notes = [f"left out {text} (it looks like a credential; commit --allow-secret stores it)"
             for text in result.skipped_secrets]
    if result.refused is None and reader.seen is not None and event.session_path is not None:
        state = IngestState(store.backends.local, event.harness)
        st, prefix = reader.seen
        if reader.stored_to + reader.appended_bytes == result.history.offset:
            state.record(os.path.abspath(event.session_path), st, event.thread, result.history.to_doc(), 0,
                         prefix)
            state.save()
    return HookOutcome(event, result, store.path or store.url, tuple(notes))


class SessionLines:
    """`new_lines(state)` for store.sessions.checkpoint: the session file's complete lines
    after the stored history, its stored prefix checked as ingest checks it."""

    def __init__(self, store, event: HookEvent):
        self.store = store
        self.event = event
        self.seen: tuple | None = None   # (stat, BLAKE3 of the bytes through the lines returned)
        self.stored_to = 0
        self.appended_bytes = 0

    def __call__(self, state):
        """The new lines (bytes), or ForkLines for a Codex fork's first ones."""
        from agentcas.cas.objects import EMPTY_POSITION
        from agentcas.harnesses.ingest import IngestState, SessionRefused, check_stored_prefix
        event, path = self.event, self.event.session_path
        self.seen = None
        what = "transcript" if event.harness == CLAUDE else "rollout"
        if path is None:
            raise SessionRefused(f"no {what} of {event.thread} found"
                                 + (f" under {session_files.codex_home()}/sessions" if event.harness == CODEX else ""))
        stored = EMPTY_POSITION if state is None else state.history
        try:
            with open(path, "rb") as handle:
                st = os.fstat(handle.fileno())
                import stat as stat_module
                if not stat_module.S_ISREG(st.st_mode):
                    raise SessionRefused(f"{what} {path} is not a regular file")
                data = handle.read()
        except FileNotFoundError:
            raise SessionRefused(f"{what} {path} does not exist (yet)") from None
        except IsADirectoryError:
            raise SessionRefused(f"{what} {path} is not a regular file") from None
        except OSError as exc:
            raise SessionRefused(f"cannot read {what} {path}: {exc.strerror}") from None
        identity = discovery.identify(event.harness, data[:discovery.HEAD_BYTES], discovery.SessionFile(path))
        if identity is None:
            if stored.seq == 0 and _identity_to_come(event.harness, data):
                return b""   # the harness has not written its first record yet
            raise SessionRefused(f"{path}: not a {event.harness} session of {event.thread}")
        if identity.thread != event.thread:
            raise SessionRefused(f"{path} belongs to {identity.thread}, not {event.thread}; not ingested")
        if len(data) < stored.offset:
            raise SessionRefused(f"{path} is shorter ({len(data)} bytes) than the {stored.offset} bytes "
                                 f"already ingested into {event.thread}: it was truncated or rewritten; "
                                 "not ingested")
        view = memoryview(data)   # slices of a long transcript without copies
        if stored.seq:
            state_row = IngestState(self.store.backends.local, event.harness)
            key = os.path.abspath(path)
            state_row.load([key])
            entry = state_row.entries.get(key)
            known = entry.get("prefix") if entry and entry.get("bytes") == stored.offset \
                and entry.get("thread") == event.thread else None
            if not (isinstance(known, str) and _blake3(view[:stored.offset]).hexdigest() == known):
                import io
                check_stored_prefix(path, io.BytesIO(data), event.thread, stored)
        cut = data.rfind(b"\n") + 1
        new = data[stored.offset:cut] if cut > stored.offset else b""
        self.stored_to, self.appended_bytes = stored.offset, len(new)
        self.seen = (st, _blake3(view[:stored.offset + len(new)]).digest())
        if state is None and new and event.harness == CODEX and identity.parent not in (None, event.thread):
            return self._fork_lines(identity.parent, new)
        return new

    def _fork_lines(self, parent: str, new: bytes):
        """A Codex fork's first lines: linked to its parent, its copy of it stored as copies
        (as `ingest` stores them)."""
        from agentcas.errors import UsageError
        from agentcas.harnesses.ingest import codex_fork_copy
        from agentcas.lineage.marks import ForkLines
        from agentcas.refs.names import check_thread_name
        from agentcas.refs.threads import ForkOrigin
        try:
            check_thread_name(parent)
        except UsageError:
            return new
        copied, copies = codex_fork_copy(self.store, parent, new)
        return ForkLines(new, ForkOrigin(parent, None, copied), copies)


def _blake3(data):
    return blake3.blake3(data, max_threads=blake3.blake3.AUTO)


def _identity_to_come(harness: str, data: bytes) -> bool:
    import io
    return discovery.identity_to_come(harness, io.BytesIO(data))
