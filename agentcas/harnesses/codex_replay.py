"""What a Codex model saw at record N: Codex's own resume rules over rollout records.

A pure reducer over a sequence of (1-based line, record dict | None); it reads, never
executes. It follows `Session::reconstruct_history_from_rollout` (openai/codex
core/src/session/rollout_reconstruction.rs @0cf88612) and `ContextManager`
(core/src/context_manager/history.rs @023fad26):

1. Reverse scan from the newest record. Records are grouped into turn segments, each
   closed (finalised) by the `task_started` whose turn id is compatible. A segment is a
   user turn if it holds an `event_msg/user_message`, a non-contextual user `message`
   (or an `agent_message` item, or an inter-agent record). `thread_rolled_back{N}` adds
   N to a pending count; while it is positive, finalised segments are skipped (a user
   turn among them decrements it). The newest surviving `compacted` with a
   `replacement_history` becomes the base; a `compacted` clears the reference context.
   The scan stops as soon as the base, the previous turn settings and the reference
   context are all known, so a long session costs what its tail needs.
2. Forward replay from the base over the records after it (the suffix starts after the
   newest compaction-with-history any segment met, exactly as Codex slices it):
   `response_item` appends API items (no `system` messages, no unknown types);
   `inter_agent_communication` appends its model input item (an `agent_message`, a user
   turn boundary, so a rollback drops it with its turn; see inter_agent_item);
   `compacted` replaces (legacy, without history: the collected real user messages plus
   the summary); `thread_rolled_back` runs `drop_last_n_user_turns` with its trim of
   contextual developer/user items directly above the cut.
3. The turn context is the reference context item: the newest surviving user turn's
   `turn_context` (None if a compaction cleared it or a legacy compaction was replayed).

Beyond Codex (agentcas conventions, docs/HARNESSES.md): `rolled_back_turns` are the user
turns the scan skipped before it found the surviving base; `interrupted_turn` is the newest
turn, if nothing closed it and no rollback marker after it owes turns when the scan reaches it.

Items are reported exactly as in the file (Codex truncates tool outputs only when it
builds the prompt), except the items of inter-agent records, which are the item Codex
derives from the record. `records` needs only `len()` and indexing, so a caller can load it
lazily from the end.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from agentcas.harnesses.records import record_type
from agentcas.result import Result

SUMMARY_PREFIX = (
    "Another language model started to solve this problem and produced a summary of its thinking "
    "process. You also have access to the state of the tools that were used by that language model. "
    "Use this to build on the work that has already been done and avoid duplicating work. Here is the "
    "summary produced by the other language model, use the information in this summary to  assist "
    "with your own analysis:")
COMPACT_USER_MESSAGE_MAX_TOKENS = 20_000
# Contextual user fragments: (opening, closing) markers, matched case-insensitively on the
# trimmed text (event_mapping.rs / context fragments).
CONTEXTUAL_USER_MARKERS = (
    ("<environment_context>", "</environment_context>"),
    ("# agents.md instructions for ", "</instructions>"),
    ("<user_instructions>", "</user_instructions>"),
    ("<skill>", "</skill>"),
    ("<user_shell_command>", "</user_shell_command>"),
    ("<turn_aborted>", "</turn_aborted>"),
    ("<subagent_notification>", "</subagent_notification>"),
)
CONTEXTUAL_DEVELOPER_PREFIXES = (
    "<permissions instructions>", "<model_switch>", "<collaboration_mode>", "<multi_agent_mode>",
    "<realtime_conversation>", "<skills_instructions>", "<personality_spec>", "<token_budget>",
    "<token_budget_reminder>", "<context_window>", "<context_window_guidance>", "<rollout_budget>",
)
API_ITEM_TYPES = frozenset({
    "message", "agent_message", "function_call", "function_call_output", "tool_search_call",
    "tool_search_output", "custom_tool_call", "custom_tool_call_output", "local_shell_call",
    "reasoning", "web_search_call", "image_generation_call", "compaction", "context_compaction",
})
META_SCAN_RECORDS = 64  # the first session_meta is the first line; never scan a whole file for it
# Rust's `str::trim_start`/`trim_end` (Unicode White_Space; Python's str.strip also strips
# U+001C..U+001F) and `eq_ignore_ascii_case` (Python's str.lower also folds non-ASCII letters:
# the Kelvin sign U+212A becomes "k", so "<s\u212aill>" would pass for "<skill>").
RUST_WHITESPACE = ("\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007"
                   "\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000")
ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
TURN_STARTED = ("task_started", "turn_started")
U32_MAX = 2**32 - 1
TURN_COMPLETE = ("task_complete", "turn_complete")


# --- item predicates (event_mapping.rs, history.rs) -------------------------------------------

def _texts(content):
    if not isinstance(content, list):
        return
    for part in content:
        if isinstance(part, dict) and part.get("type") == "input_text" and isinstance(part.get("text"), str):
            yield part["text"]


def is_contextual_user_content(content) -> bool:
    """Whether a user message holds a contextual fragment (environment, AGENTS.md, ...):
    `ContextualUserFragmentDefinition::matches_text`, ASCII case-insensitive markers."""
    for text in _texts(content):
        trimmed = text.strip(RUST_WHITESPACE).translate(ASCII_LOWER)
        if any(trimmed.startswith(open_) and trimmed.endswith(close) for open_, close in CONTEXTUAL_USER_MARKERS):
            return True
    return False


def _is_contextual_dev_fragment(part) -> bool:
    if not (isinstance(part, dict) and part.get("type") == "input_text" and isinstance(part.get("text"), str)):
        return False
    trimmed = part["text"].lstrip(RUST_WHITESPACE).translate(ASCII_LOWER)
    return any(trimmed.startswith(prefix) for prefix in CONTEXTUAL_DEVELOPER_PREFIXES)


def is_contextual_dev_content(content) -> bool:
    return isinstance(content, list) and any(_is_contextual_dev_fragment(p) for p in content)


def is_api_item(item) -> bool:
    """`is_api_message`: every known item but system messages (unknown types are dropped)."""
    if record_type(item) not in API_ITEM_TYPES:
        return False
    return not (item["type"] == "message" and item.get("role") == "system")


def is_user_turn_boundary(item) -> bool:
    """A real user prompt (not a contextual fragment), or an agent message item."""
    if not isinstance(item, dict):
        return False
    if item.get("type") == "agent_message":
        return True
    return (item.get("type") == "message" and item.get("role") == "user"
            and not is_contextual_user_content(item.get("content")))


def _user_message_text(item) -> str | None:
    """The text of a real user message (`parse_user_message`), else None."""
    if not (isinstance(item, dict) and item.get("type") == "message" and item.get("role") == "user"):
        return None
    content = item.get("content")
    if is_contextual_user_content(content):
        return None
    return "".join(_texts(content))


def inter_agent_item(payload) -> dict | None:
    """The model input item of an `inter_agent_communication` record, or None if Codex
    could not read the record (its required fields missing or of the wrong type).

    `InterAgentCommunication::to_model_input_item` (codex-rs/protocol; the records are
    written by `Session::record_inter_agent_communication`, which records this same item
    into history): an `agent_message` item with the record's author, recipient and id; its
    content is the plain text as one `input_text`, or for an encrypted message a header
    `input_text` ("Message Type: NEW_TASK|MESSAGE" by `trigger_turn`, the recipient as task
    name, the author as sender) followed by the `encrypted_content` part.
    """
    if not isinstance(payload, dict):
        return None
    author, recipient, text = payload.get("author"), payload.get("recipient"), payload.get("content")
    trigger = payload.get("trigger_turn")
    if not (isinstance(author, str) and isinstance(recipient, str) and isinstance(text, str)
            and isinstance(trigger, bool)):
        return None
    encrypted = payload.get("encrypted_content")
    if isinstance(encrypted, str):
        header = (f"Message Type: {'NEW_TASK' if trigger else 'MESSAGE'}\nTask name: {recipient}\n"
                  f"Sender: {author}\nPayload:\n")
        content = [{"type": "input_text", "text": header},
                   {"type": "encrypted_content", "encrypted_content": encrypted}]
    else:
        content = [{"type": "input_text", "text": text}]
    item: dict[str, Any] = {"type": "agent_message"}
    if payload.get("id") is not None:
        item["id"] = payload["id"]
    item.update(author=author, recipient=recipient, content=content)
    if payload.get("internal_chat_message_metadata_passthrough") is not None:
        item["internal_chat_message_metadata_passthrough"] = payload["internal_chat_message_metadata_passthrough"]
    return item


# --- forward replay (ContextManager) -----------------------------------------------------------

def drop_last_n_user_turns(history: list, num_turns: int) -> list:
    """History without its last `num_turns` user turns and the context updates above them."""
    if num_turns <= 0:
        return history
    positions = [i for i, (item, _) in enumerate(history) if is_user_turn_boundary(item)]
    if not positions:
        return history
    first = positions[0]
    cut = first if num_turns >= len(positions) else positions[len(positions) - num_turns]
    while cut > first:  # trim_pre_turn_context_updates
        item = history[cut - 1][0]
        if item.get("type") == "message" and item.get("role") == "developer" \
                and is_contextual_dev_content(item.get("content")):
            cut -= 1
        elif item.get("type") == "message" and item.get("role") == "user" \
                and is_contextual_user_content(item.get("content")):
            cut -= 1
        else:
            break
    return history[:cut]


def _approx_tokens(text: str) -> int:
    return (len(text.encode("utf-8")) + 3) // 4


def legacy_compacted_history(history: list, message: str, line: int) -> list:
    """`build_compacted_history`: recent real user messages (20k tokens) and the summary."""
    user_messages = []
    for item, _ in history:
        text = _user_message_text(item)
        if text is not None and not text.startswith(SUMMARY_PREFIX + "\n"):
            user_messages.append(text)
    selected, remaining = [], COMPACT_USER_MESSAGE_MAX_TOKENS
    for text in reversed(user_messages):
        if remaining == 0:
            break
        tokens = _approx_tokens(text)
        if tokens <= remaining:
            selected.append(text)
            remaining -= tokens
        else:  # Codex keeps a head and tail; we keep the head that fits (approximation)
            selected.append(text.encode("utf-8")[:remaining * 4].decode("utf-8", "ignore"))
            break
    selected.reverse()
    summary = message if message else "(no summary available)"
    return [(_user_item(text), line) for text in selected + [summary]]


def _user_item(text: str) -> dict:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


# --- the reducer ------------------------------------------------------------------------------

class _Segment:
    __slots__ = ("turn_id", "user_turn", "settings", "reference", "base")

    def __init__(self, turn_id=None):
        self.turn_id = turn_id
        self.user_turn = False
        self.settings = None      # index of the turn_context that set previous turn settings
        self.reference = "never"  # "never" | "cleared" | index of a turn_context
        self.base = None          # index of the compacted record with replacement history


def _compatible(active, other) -> bool:
    return active is None or other is None or active == other


def _event(record):
    payload = record.get("payload") if record.get("type") == "event_msg" else None
    return payload if isinstance(payload, dict) else None


def _payload(record):
    payload = record.get("payload")
    return payload if isinstance(payload, dict) else {}


def codex_cannot_read(record) -> bool:
    """A record Codex cannot deserialize, so skips as it reads the rollout (it never reaches
    the replay), among those replay reads (codex-rs protocol.rs): a `compacted` whose payload
    is not `CompactedItem {message: String, replacement_history: Option<Vec<ResponseItem>>}`
    (an element that is not an object is no ResponseItem), a `turn_context` whose payload is
    not an object, a `thread_rolled_back` whose `num_turns` is not a u32, a turn start or
    completion whose `turn_id` is not a string (`turn_id: String`), a `turn_aborted` whose
    `turn_id` is there but not a string (`Option<String>`), a `user_message` whose
    `message` is not a string."""
    kind = record.get("type")
    payload = record.get("payload")
    if kind == "compacted":
        if not (isinstance(payload, dict) and isinstance(payload.get("message"), str)):
            return True
        history = payload.get("replacement_history")
        return history is not None and not (isinstance(history, list)
                                            and all(isinstance(item, dict) for item in history))
    if kind == "turn_context":
        return not isinstance(payload, dict)
    if kind != "event_msg" or not isinstance(payload, dict):
        return False
    event_type = payload.get("type")
    if event_type == "thread_rolled_back":
        turns = payload.get("num_turns")
        return not (isinstance(turns, int) and not isinstance(turns, bool) and 0 <= turns <= U32_MAX)
    if event_type in TURN_STARTED or event_type in TURN_COMPLETE:
        return not isinstance(payload.get("turn_id"), str)
    if event_type == "turn_aborted":
        return payload.get("turn_id") is not None and not isinstance(payload["turn_id"], str)
    if event_type == "user_message":
        return not isinstance(payload.get("message"), str)
    return False


def _str_or_none(value):
    return value if isinstance(value, str) else None


@dataclass(frozen=True)
class CodexReplay(Result):
    """What Codex's model sees after the first `at` records of a rollout (docs/HARNESSES.md):
    the history items exactly as in the file, each with its 1-based line, the turn context
    in force, the compaction the history starts from, the turns rolled back, an unfinished
    turn, and the damaged lines passed over."""

    thread_id: str | None
    at: int
    items: list[dict]
    item_lines: list[int]
    turn_context: Any              # the turn_context payload in force (the log's JSON), or None
    turn_context_line: int | None
    compaction_line: int | None
    rolled_back_turns: list[str]
    interrupted_turn: str | None
    skipped_lines: list[int]
    format: str = "codex"

    def to_json(self) -> dict:  # the fields are JSON already (the log's own items): no walk over them
        return {f.name: getattr(self, f.name) for f in fields(self)}


def replay_codex(records, damaged_lines=None) -> CodexReplay:
    """The replay document (`replay --json`, format codex) of `records` (all of them).

    `skipped_lines` are every damaged line among the records: `damaged_lines` when the
    caller knows them (a stored history: harnesses/damaged_lines.py), else found by
    looking at every record (which a lazily loaded sequence should not be made to do).
    """
    at = len(records)
    skipped: set[int] = set()
    state: dict[str, Any] = {"base": None, "settings": None, "reference": "never", "pending": 0}
    rolled_back: list[str] = []
    suffix_start = 0
    active: _Segment | None = None
    closed: set = set()
    interrupted = None
    newest_start_seen = False

    def finalize(segment: _Segment):
        if state["pending"] > 0:
            if segment.user_turn:
                state["pending"] -= 1
                # Only turns newer than the surviving base: older ones are behind the
                # compaction that replaced them, where the scan (which may stop at the base)
                # does not look, so listing them would depend on where it stopped.
                if segment.turn_id is not None and state["base"] is None:
                    rolled_back.append(segment.turn_id)
            return
        if state["base"] is None and segment.base is not None:
            state["base"] = segment.base
        if state["settings"] is None and segment.user_turn:
            state["settings"] = segment.settings
        if state["reference"] == "never" and (segment.user_turn or segment.reference == "cleared"):
            state["reference"] = segment.reference

    for index in range(at - 1, -1, -1):
        line, record = records[index]
        if record is None:
            skipped.add(line)
            continue
        if codex_cannot_read(record):
            continue
        kind = record.get("type")
        event = _event(record)
        event_type = event.get("type") if event else None
        if kind == "compacted":
            active = active or _Segment()
            if active.reference == "never":
                active.reference = "cleared"
            if active.base is None and isinstance(_payload(record).get("replacement_history"), list):
                active.base = index
                suffix_start = index + 1
        elif event_type == "thread_rolled_back":
            state["pending"] += event["num_turns"]
        elif event_type in TURN_COMPLETE:
            active = active or _Segment()
            closed.add(_str_or_none(event.get("turn_id")))
            if active.turn_id is None:
                active.turn_id = _str_or_none(event.get("turn_id"))
        elif event_type == "turn_aborted":
            turn_id = _str_or_none(event.get("turn_id"))
            closed.add(turn_id)
            if active is not None:
                if active.turn_id is None and turn_id is not None:
                    active.turn_id = turn_id
            elif turn_id is not None:
                active = _Segment(turn_id)
        elif event_type == "user_message":
            active = active or _Segment()
            active.user_turn = True
        elif kind == "turn_context":
            active = active or _Segment()
            turn_id = _str_or_none(_payload(record).get("turn_id"))
            if active.turn_id is None:
                active.turn_id = turn_id
            if _compatible(active.turn_id, turn_id):
                active.settings = index
                if active.reference == "never":
                    active.reference = index
        elif event_type in TURN_STARTED:
            turn_id = _str_or_none(event.get("turn_id"))
            if not newest_start_seen:
                # The newest turn is unfinished if nothing after it closed it (older builds
                # write `turn_aborted` without a turn id: it closes the turn running then) and
                # it survives (with rollback turns still owed, its segment is skipped and its
                # items are cut with the turns the marker drops).
                newest_start_seen = True
                if turn_id not in closed and None not in closed and state["pending"] == 0:
                    interrupted = turn_id
            if active is not None and _compatible(active.turn_id, turn_id):
                finalize(active)
                active = None
        elif kind == "response_item":
            active = active or _Segment()
            active.user_turn |= is_user_turn_boundary(_payload(record))
        elif kind == "inter_agent_communication":
            active = active or _Segment()
            active.user_turn = True
        if state["base"] is not None and state["settings"] is not None and state["reference"] != "never":
            break
    if active is not None:
        finalize(active)

    history: list = []
    if state["base"] is not None:
        line, record = records[state["base"]]
        history = [(item, line) for item in _payload(record)["replacement_history"]]
    legacy = False
    compaction_line = None if state["base"] is None else records[state["base"]][0]
    for index in range(suffix_start, at):
        line, record = records[index]
        if record is None:
            skipped.add(line)
            continue
        if codex_cannot_read(record):
            continue
        kind = record.get("type")
        event = _event(record)
        if kind == "response_item":
            item = record.get("payload")
            if is_api_item(item):
                history.append((item, line))
        elif kind == "inter_agent_communication":
            item = inter_agent_item(record.get("payload"))
            if item is not None:
                history.append((item, line))
        elif kind == "compacted":
            payload = _payload(record)
            compaction_line = line
            if isinstance(payload.get("replacement_history"), list):
                history = [(item, line) for item in payload["replacement_history"]]
            else:
                legacy = True
                history = legacy_compacted_history(history, payload["message"], line)
        elif event is not None and event.get("type") == "thread_rolled_back":
            history = drop_last_n_user_turns(history, event["num_turns"])

    reference = state["reference"]
    turn_context = turn_context_line = None
    if isinstance(reference, int) and not legacy:
        turn_context_line, record = records[reference]
        turn_context = record.get("payload")
    return CodexReplay(_thread_id(records), at, [item for item, _ in history], [line for _, line in history],
                       turn_context, turn_context_line, compaction_line, list(reversed(rolled_back)), interrupted,
                       sorted(skipped.union(damaged_lines if damaged_lines is not None
                                            else (line for line, record in (records[i] for i in range(at))
                                                  if record is None))))


def _thread_id(records):
    """The FIRST `session_meta`'s `payload.id` (later ones may be copied from a fork parent)."""
    for index in range(min(len(records), META_SCAN_RECORDS)):
        _, record = records[index]
        if record is not None and record.get("type") == "session_meta":
            value = _payload(record).get("id")
            return value if isinstance(value, str) else None
    return None
