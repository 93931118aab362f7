"""Turn boundaries of harness logs, and the reason of the checkpoint each one gets.

Codex: a turn ends at its `task_complete` (alias `turn_complete`) or `turn_aborted`
event_msg; its reason names the turn id and the first words of the turn's prompt (its
`user_message`). Claude Code: each new real user prompt closes the turn before it (the
session's first prompt closes nothing). A tracker is fed the records of a log in order
and says, for each, whether a checkpoint goes after it. Ingest feeds it only the records
whose `type` and `payload.type` it `wants` (line_kinds.line_kind reads those of every line
without parsing the rest): no other record can close a turn or name a prompt.
"""

from __future__ import annotations

from agentcas.harnesses.codex_replay import codex_cannot_read
from agentcas.harnesses.records import CODEX, preview

REASON_WORDS = 80


class CodexTurns:
    """Turn boundaries of a Codex rollout: `task_complete` / `turn_aborted` records."""

    def __init__(self):
        self.turn = None
        self.prompts: dict = {}

    def feed(self, raw: bytes, record: dict | None) -> str | None:
        """The reason of a checkpoint after this record, if it closes a turn."""
        if record is None or record.get("type") != "event_msg" or not isinstance(record.get("payload"), dict) \
                or codex_cannot_read(record):   # Codex skips it: no boundary, as in replay
            return None
        event = record["payload"]
        kind = event.get("type")
        turn_id = event.get("turn_id") if isinstance(event.get("turn_id"), str) else None
        if kind in ("task_started", "turn_started"):   # EVENTS: every kind this reads
            self.turn = turn_id
        elif kind == "user_message" and isinstance(event.get("message"), str):
            self.prompts.setdefault(self.turn, event["message"])
        elif kind in ("task_complete", "turn_complete", "turn_aborted"):
            prompt = self.prompts.pop(turn_id, None) or self.prompts.pop(self.turn, None)
            what = "aborted" if kind == "turn_aborted" else "complete"
            name = preview(turn_id or "?", 80)
            return f"codex turn {name} {what}" + (f": {preview(prompt, REASON_WORDS)}" if prompt else "")
        return None

    EVENTS = frozenset({"task_started", "turn_started", "user_message", "task_complete", "turn_complete",
                        "turn_aborted"})

    @staticmethod
    def wants(kind: str | None, payload_kind: str | None) -> bool:
        """Whether a record of this `type` and `payload.type` can matter to `feed`."""
        return kind == "event_msg" and payload_kind in CodexTurns.EVENTS


class ClaudeTurns:
    """Turn boundaries of a Claude transcript: each new real user prompt closes the turn before it."""

    def __init__(self):
        self.prompt = None   # the prompt of the open turn
        self.count = 0

    def feed(self, raw: bytes, record: dict | None) -> str | None:
        text = real_prompt(record)
        if text is None:
            return None
        closed, self.prompt = self.prompt, text
        self.count += 1
        if self.count == 1 and closed is None:
            return None   # the first prompt closes nothing
        return ("claude turn closed by a new prompt" + (f": {preview(closed, REASON_WORDS)}" if closed else ""))

    @staticmethod
    def wants(kind: str | None, payload_kind: str | None) -> bool:
        """Whether a record of this `type` and `payload.type` can matter to `feed`."""
        return kind == "user"


def real_prompt(record) -> str | None:
    """The text of a real Claude user prompt (not meta, sidechain, tool result, summary), else None."""
    if record is None or record.get("type") != "user" or not isinstance(record.get("uuid"), str):
        return None
    if record.get("isMeta") or record.get("isSidechain") or record.get("isCompactSummary") \
            or record.get("isVisibleInTranscriptOnly") or record.get("teamName"):
        return None
    message = record.get("message") if isinstance(record.get("message"), dict) else {}
    content = message.get("content")
    if isinstance(content, str):
        text = content
    elif isinstance(content, list):
        if any(isinstance(b, dict) and b.get("type") == "tool_result" for b in content):
            return None
        parts = []
        for block in content:
            kind = block.get("type") if isinstance(block, dict) else None
            if kind == "text" and isinstance(block.get("text"), str):
                parts.append(block["text"])
            elif kind in ATTACHED_BLOCKS:
                parts.append(f"[{kind}]")
        text = " ".join(parts)
    else:
        return None
    stripped = text.strip()
    if not stripped or stripped.startswith(("<local-command-stdout>", "<local-command-caveat>")) \
            or stripped in INTERRUPTION_MARKERS:
        return None
    return text


# A prompt may be only a pasted image or document: it is still the user's prompt (shown
# in a reason as `[image]`). Claude Code writes these texts as a user record when the
# user interrupts a turn (Esc): the harness's, not a prompt; the next prompt closes it.
ATTACHED_BLOCKS = ("image", "document")
INTERRUPTION_MARKERS = ("[Request interrupted by user]", "[Request interrupted by user for tool use]")


def turn_tracker(harness: str):
    return CodexTurns() if harness == CODEX else ClaudeTurns()
