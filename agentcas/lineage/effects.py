"""External effects: what an agent did to the outside world, recorded as history records.

An effect (a request sent, a file written outside the workspace, money spent) is a
record of the thread's rollout, a JSON object with `"type": "agentcas.effect"`. The
first record of an effect id carries what it is (kind, target, rollback class,
optional provider and operation) and its first state; later records with the same id
carry only a new state. Being records, effects have a seq, are shared by forks, stay
in the reflog's histories after a revert, and are exported and signed with the thread.
They are evidence, never compensation: nothing in agentcas undoes an effect.

This module is pure: validation, record bytes, and parsing one record. The index that
answers "which effects, in which latest state, as of history prefix S" is
`effects_index.py`.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass

from agentcas.errors import UsageError

RECORD_TYPE = "agentcas.effect"
STATES = ("pending", "done", "failed", "unknown")
ROLLBACK_CLASSES = ("irreversible", "compensatable", "rollbackable")
OPEN_STATES = ("pending", "unknown")  # the outside-world result cannot be proved
NOT_UNDONE_NOTE = ("effects are evidence, not compensation: agentcas undid none of them; "
                   "pending or unknown means the outside-world result cannot be proved")
MAX_ID_CHARS = 128
MAX_LABEL_CHARS = 128   # kind, provider, operation
MAX_TARGET_BYTES = 4096
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]*")
_LABEL = re.compile(r"[^\x00-\x1f\x7f]+")
# A cheap test before json.loads, so that indexing skips ordinary records unparsed.
MARKER = b'"agentcas.effect"'


class BadEffect(UsageError):
    """An effect field is missing or malformed."""


@dataclass(frozen=True)
class EffectRecord:
    """One effect record: a new effect (kind set) or a new state of an existing one."""

    id: str
    state: str
    at: str | None = None
    kind: str | None = None
    target: str | None = None
    rollback: str | None = None
    provider: str | None = None
    operation: str | None = None

    @property
    def is_new(self) -> bool:
        return self.kind is not None

    def to_record(self) -> dict:
        doc = {"type": RECORD_TYPE, "id": self.id, "state": self.state}
        for key in ("at", "kind", "target", "rollback", "provider", "operation"):
            value = getattr(self, key)
            if value is not None:
                doc[key] = value
        return doc

    def to_line(self) -> bytes:
        """The JSONL line appended to the rollout (sorted keys, UTF-8, newline)."""
        return json.dumps(self.to_record(), sort_keys=True, ensure_ascii=False,
                          separators=(",", ":")).encode("utf-8") + b"\n"


def new_effect_id() -> str:
    return "eff-" + secrets.token_hex(8)


def check_id(value: str) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= MAX_ID_CHARS or not _ID.fullmatch(value):
        raise BadEffect(f"effect id must be 1..{MAX_ID_CHARS} characters of letters, digits and ._:- "
                        f"(starting with a letter or digit), got {value!r}")
    return value


def check_state(value: str) -> str:
    if value not in STATES:
        raise BadEffect(f"effect state must be one of {', '.join(STATES)}, got {value!r}")
    return value


def check_states(values) -> tuple[str, ...]:
    """A --state filter: names from STATES, no duplicates kept."""
    out = []
    for value in values:
        check_state(value)
        if value not in out:
            out.append(value)
    return tuple(out)


def _check_label(name: str, value: str | None, required: bool) -> str | None:
    if value is None:
        if required:
            raise BadEffect(f"a new effect needs --{name}")
        return None
    if not isinstance(value, str) or not 0 < len(value) <= MAX_LABEL_CHARS or not _LABEL.fullmatch(value):
        raise BadEffect(f"effect {name} must be 1..{MAX_LABEL_CHARS} characters without control "
                        f"characters, got {value[:80]!r}")
    return value


def _check_target(value: str | None) -> str:
    if value is None:
        raise BadEffect("a new effect needs --target")
    if not isinstance(value, str) or not value or len(value.encode("utf-8")) > MAX_TARGET_BYTES \
            or not _LABEL.fullmatch(value):
        raise BadEffect(f"effect target must be 1..{MAX_TARGET_BYTES} UTF-8 bytes without control "
                        "characters")
    return value


def new_effect(effect_id: str, kind: str, target: str, state: str, rollback: str,
               provider: str | None, operation: str | None, at: str) -> EffectRecord:
    """A validated first record of an effect."""
    check_id(effect_id)
    check_state(state)
    if rollback not in ROLLBACK_CLASSES:
        raise BadEffect(f"effect rollback class must be one of {', '.join(ROLLBACK_CLASSES)}, "
                        f"got {rollback!r}")
    return EffectRecord(effect_id, state, at, _check_label("kind", kind, True), _check_target(target),
                        rollback, _check_label("provider", provider, False),
                        _check_label("operation", operation, False))


def state_change(effect_id: str, state: str, at: str) -> EffectRecord:
    """A validated later record: a new state of an existing effect."""
    return EffectRecord(check_id(effect_id), check_state(state), at)


def parse_record(raw: bytes) -> EffectRecord | None:
    """The effect a history record holds, or None for any other record.

    Records reach a history by any append path (`rollout append`, imports, pulls), so
    a record that claims the type but is malformed is not an effect: it is skipped, and
    stays in the history as it was written.
    """
    if MARKER not in raw:
        return None
    try:
        doc = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(doc, dict) or doc.get("type") != RECORD_TYPE:
        return None
    effect_id, state = doc.get("id"), doc.get("state")
    if not isinstance(effect_id, str) or not effect_id or len(effect_id) > 1024 or state not in STATES:
        return None

    def text(key):
        value = doc.get(key)
        return value if isinstance(value, str) else None

    kind = text("kind")
    if kind is not None:
        rollback = text("rollback")
        return EffectRecord(effect_id, state, text("at"), kind, text("target") or "",
                            rollback if rollback in ROLLBACK_CLASSES else "unknown",
                            text("provider"), text("operation"))
    return EffectRecord(effect_id, state, text("at"))
