"""Replay of a stored thread or checkpoint: the reducers over records read lazily from the store.

`StoredRecords` is a sequence of (1-based line, record | None) over the first `at` records
of a history, loaded in blocks by `Store.rollout_read` only when an index is asked for.
The Codex reducer scans backwards from the end and stops at the newest surviving
compaction, so replay at the head of a long session reads its tail, not the whole file;
its `skipped_lines` then come from damaged_lines.py (a cached scan of the whole prefix).
"""

from __future__ import annotations

from typing import Any

from agentcas.errors import AgentcasError, UsageError
from agentcas.harnesses.claude_replay import ClaudeReplay, replay_claude
from agentcas.harnesses.codex_replay import CodexReplay, replay_codex
from agentcas.harnesses.damaged_lines import damaged_lines
from agentcas.harnesses.records import CODEX, detect_format, iter_lines, parse_line, preview

BLOCK_RECORDS = 256
HEAD_RECORDS = 16
DETECT_RECORDS = 16
FORMAT_NAMES = {"codex": "Codex rollout", "claude": "Claude Code transcript"}


class UnknownFormat(AgentcasError):
    """A history that is neither a Codex rollout nor a Claude transcript."""


class StoredRecords:
    """The first `at` records of `rev`'s history as (line, record | None), loaded on demand."""

    def __init__(self, store, rev: str, at: int):
        self.store = store
        self.rev = rev
        self.at = at
        self._blocks: dict[int, list] = {}
        self.loaded_records = 0

    def __len__(self) -> int:
        return self.at

    def __getitem__(self, index: int):
        if not 0 <= index < self.at:
            raise IndexError(index)
        # A small first block: the thread id is on line 1, and a long session's head is not needed.
        number = -1 if index < HEAD_RECORDS else (index - HEAD_RECORDS) // BLOCK_RECORDS
        base = 0 if number < 0 else HEAD_RECORDS + number * BLOCK_RECORDS
        block = self._blocks.get(number)
        if block is None:
            start = base
            stop = min(self.at, HEAD_RECORDS if number < 0 else start + BLOCK_RECORDS)
            data = b"".join(self.store.history.read(self.rev, start, stop))
            block = [(line, parse_line(raw)) for line, raw in iter_lines(data, start + 1)]
            self.loaded_records += len(block)
            if len(self._blocks) > 4096:
                self._blocks.clear()
            self._blocks[number] = block
        return block[index - base]


def rev_history(store, rev: str):
    """(history, thread, is the thread's head) that `rev` names: a thread's head, else the
    checkpoint's prefix on the thread it was made on."""
    from agentcas.refs.names import check_thread_name
    try:
        check_thread_name(rev)
        return store.threads.get(rev).history, rev, True
    except AgentcasError:
        pass
    _, checkpoint = store.checkpoints.get(rev)
    return checkpoint.history, checkpoint.thread, False


def history_length(store, rev: str) -> int:
    """How many records `rev` names: a thread's head, else the checkpoint's prefix."""
    return rev_history(store, rev)[0].seq


def replay(store, rev: str, at: int | None = None, fmt: str | None = None) -> CodexReplay | ClaudeReplay:
    """The replay document of `rev` at record `at` (default: its position)."""
    return replay_records(store, rev, at, fmt)[0]


def replay_records(store, rev: str, at: int | None = None,
                   fmt: str | None = None) -> tuple[CodexReplay | ClaudeReplay, StoredRecords]:
    """(the replay, the StoredRecords it read) of `rev` at record `at`."""
    head, thread, is_head = rev_history(store, rev)
    length = head.seq
    if at is None:
        at = length
    if at < 0 or at > length:
        raise UsageError(f"--at {at} is beyond the end of {rev!r} ({length} records)")
    records = StoredRecords(store, rev, at)
    # The format is REV's, not the cut's: `--at 1` of a transcript whose first line
    # (a file-history-snapshot, a summary) names no session is still that transcript.
    head_records = records if at >= min(length, DETECT_RECORDS) else StoredRecords(store, rev, length)
    seen = min(length, DETECT_RECORDS)
    detected = detect_format(head_records[i] for i in range(seen))
    if fmt is None:
        if detected is None:
            raise UnknownFormat(f"{rev!r} is neither a Codex rollout nor a Claude Code transcript "
                                f"(first {seen} records); name one with --format codex|claude")
        fmt = detected
    elif detected is not None and detected != fmt:
        # --format names the format of a history that shows none; one that shows the other
        # would get a replay its harness never builds (an empty chain, no items).
        raise UsageError(f"{rev!r} is a {FORMAT_NAMES[detected]}, not a {FORMAT_NAMES[fmt]}: "
                         f"replay it with --format {detected} or without --format")
    if fmt != CODEX:
        return replay_claude(records), records
    # Every damaged line up to `at`, not only those the reducer reads (damaged_lines.py).
    return replay_codex(records, damaged_lines(store, rev, head, at, thread, is_head)), records


# --- text transcripts --------------------------------------------------------------------------

def _parts(value) -> list:
    """The content parts of an item: a list's elements that are objects (a log may hold anything)."""
    return [part for part in value if isinstance(part, dict)] if isinstance(value, list) else []


def _item_text(item: dict) -> tuple[str, Any]:
    kind = item.get("type")
    if kind == "message":
        texts = [p.get("text", "") for p in _parts(item.get("content"))]
        return str(item.get("role")), " ".join(t for t in texts if isinstance(t, str))
    if kind == "reasoning":
        summary = [p.get("text", "") for p in _parts(item.get("summary"))]
        return "reasoning", " ".join(t for t in summary if isinstance(t, str))
    if kind in ("function_call", "custom_tool_call"):
        return "call", f"{item.get('name')} {item.get('arguments', item.get('input', ''))}"
    if kind in ("function_call_output", "custom_tool_call_output"):
        return "output", item.get("output")
    return str(kind), item


def render_text(doc: CodexReplay | ClaudeReplay, records=None, limit: int = 100) -> str:
    """A readable transcript with file line numbers and bounded previews (never executes)."""
    if isinstance(doc, CodexReplay):
        lines = [f"codex thread {preview(doc.thread_id, 80)} at record {doc.at}: {len(doc.items)} items"]
        if doc.compaction_line:
            lines.append(f"  (history from the compaction at line {doc.compaction_line})")
        for item, line in zip(doc.items, doc.item_lines):
            role, text = _item_text(item)
            lines.append(f"{line:>7}  {preview(role, 20):<10} {preview(text, limit)}")
        context = doc.turn_context
        if isinstance(context, dict):
            lines.append(f"turn context (line {doc.turn_context_line}): model {preview(context.get('model'), 60)}, "
                         f"approval {preview(context.get('approval_policy'), 40)}, "
                         f"cwd {preview(context.get('cwd'), 120)}")
        else:
            lines.append("turn context: none (the next turn re-injects the full context)")
        if doc.rolled_back_turns:
            lines.append("rolled back turns: " + preview(", ".join(doc.rolled_back_turns), 400))
        if doc.interrupted_turn:
            lines.append(f"unfinished turn {preview(doc.interrupted_turn, 80)}: kept as it is (a dangling call is "
                         "answered \"aborted\" only at prompt time)")
        if doc.skipped_lines:
            lines.append("skipped damaged lines: " + ", ".join(map(str, doc.skipped_lines[:50])))
        return "\n".join(lines)
    lines = [f"claude session {preview(doc.session_id, 80)} at record {doc.at}: leaf {preview(doc.leaf, 80)}, "
             f"{len(doc.chain)} records in the chain, {len(doc.visible)} visible"]
    if doc.compaction:
        lines.append(f"  (chain starts at compaction boundary {preview(doc.compaction.boundary, 80)}; "
                     f"logical parent {preview(doc.compaction.logical_parent, 80)})")
    by_uuid = {}
    if records is not None:
        for index in range(len(records)):
            line, record = records[index]
            if record is not None and isinstance(record.get("uuid"), str):
                by_uuid[record["uuid"]] = (line, record)
    for uid in doc.visible:
        line, record = by_uuid.get(uid, (0, {}))
        message = record.get("message") if isinstance(record.get("message"), dict) else {}
        content = message.get("content")
        role = record.get("type", "?")
        if isinstance(content, list):
            parts = []
            for block in content:
                if not isinstance(block, dict):
                    continue
                kind = block.get("type")
                if kind == "text":
                    parts.append(block.get("text", ""))
                elif kind == "tool_use":
                    parts.append(f"[tool_use {preview(block.get('name'), 40)} {preview(block.get('input'), 60)}]")
                elif kind == "tool_result":
                    parts.append(f"[tool_result {preview(block.get('content'), 60)}]")
                elif kind == "thinking":
                    parts.append("[thinking]")
                else:
                    parts.append(f"[{preview(kind, 40)}]")
            content = " ".join(str(p) for p in parts)
        lines.append(f"{line:>7}  {preview(role, 20):<10} {preview(content, limit)}")
    if doc.abandoned:
        lines.append(f"abandoned: {len(doc.abandoned)} records on branches not chosen")
    for side in doc.sidechains:
        lines.append(f"sidechain {preview(side.root, 80)} -> {preview(side.leaf, 80)} "
                     f"({len(side.uuids)} records)")
    return "\n".join(lines)
