"""What a Claude Code model saw at record N: the SDK's chain rules over transcript records.

A pure reducer over (1-based line, record dict | None); it reads, never executes. It
follows anthropics/claude-agent-sdk-python `_internal/sessions.py` @005d7596
(`_parse_transcript_entries`, `_build_conversation_chain`, `_is_visible_message`):

1. Chain nodes are records of type user/assistant/progress/system/attachment with a
   string `uuid` (damaged lines are skipped); a uuid seen twice keeps its last record.
2. Terminals are nodes no record names as `parentUuid`; each walks back to its nearest
   user/assistant node: the candidate leaves.
3. The leaf is the candidate that is not `isSidechain`/`teamName`/`isMeta` with the
   highest file position (so an edited or retried prompt, which re-uses the old
   prompt's parent and comes later, wins); if there is none, any candidate.
4. The chain walks `parentUuid` from the leaf to a root. `logicalParentUuid` is never
   followed, so after a compaction the chain starts at the `compact_boundary`.
5. Visible messages are chain user/assistant records that are not `isMeta`,
   `isSidechain` or `teamName` (`isCompactSummary` records are kept).

A subagent's own transcript (`agent-<id>.jsonl`: every record carries `agentId`, and is
`isSidechain`) follows the SDK's subagent rules instead (`_build_subagent_chain`,
`_entries_to_subagent_messages`): the leaf is the last user/assistant record in the file,
and every user/assistant record of its chain is a message (none is hidden as sidechain).

Beyond the SDK (agentcas conventions, docs/HARNESSES.md): `abandoned` lists non-sidechain
nodes on branches not chosen (not the chain, not the history before a compaction, which
is reached through `logicalParentUuid`; a branch of only system/progress/attachment
records hangs from the chosen conversation and is not one); `sidechains` lists each inline
subagent tree (root without a sidechain parent, its leaf chosen as the session's is, the path);
`messages` is the Messages-API view of the chain's user/assistant records: system
records dropped, `isMeta` text kept (Claude Code sends it to the model; docs/HARNESSES.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from agentcas.harnesses.records import record_type
from agentcas.result import Result

NODE_TYPES = frozenset({"user", "assistant", "progress", "system", "attachment"})


def _is_node(record) -> bool:
    return record is not None and record_type(record) in NODE_TYPES and isinstance(record.get("uuid"), str)


def _parent(entry):
    """The record's `parentUuid` if it is a non-empty string, else None: a record whose
    parent is anything else (a list, an object: damaged or foreign) is a root here, where
    the SDK's `_build_conversation_chain` would fail on it."""
    parent = entry.get("parentUuid")
    return parent if isinstance(parent, str) and parent else None


def _walk(start, by_uuid):
    """Records from `start` along parentUuid to a root (stops on a cycle)."""
    seen = set()
    current = start
    while current is not None:
        uid = current["uuid"]
        if uid in seen:
            break
        seen.add(uid)
        yield current
        parent = _parent(current)
        current = None if parent is None else by_uuid.get(parent)


def build_chain(entries: list[dict]) -> list[dict]:
    """`_build_conversation_chain`: the records from the chosen leaf's root to the leaf."""
    if not entries:
        return []
    by_uuid = {e["uuid"]: e for e in entries}
    position = {e["uuid"]: i for i, e in enumerate(entries)}
    parents = {_parent(e) for e in entries}
    leaves = []
    for terminal in (e for e in entries if e["uuid"] not in parents):
        for node in _walk(terminal, by_uuid):
            if node.get("type") in ("user", "assistant"):
                leaves.append(node)
                break
    if not leaves:
        return []
    main = [leaf for leaf in leaves
            if not leaf.get("isSidechain") and not leaf.get("teamName") and not leaf.get("isMeta")]
    candidates = main or leaves
    best = candidates[0]
    for leaf in candidates[1:]:
        if position.get(leaf["uuid"], -1) > position.get(best["uuid"], -1):
            best = leaf
    chain = list(_walk(best, by_uuid))
    chain.reverse()
    return chain


def build_subagent_chain(entries: list[dict]) -> list[dict]:
    """`_build_subagent_chain`: from the last user/assistant record back to the root."""
    by_uuid = {e["uuid"]: e for e in entries}
    leaf = next((e for e in reversed(entries) if e.get("type") in ("user", "assistant")), None)
    if leaf is None:
        return []
    chain = list(_walk(leaf, by_uuid))
    chain.reverse()
    return chain


def is_subagent_transcript(entries: list[dict]) -> bool:
    """A subagent's own file: its first chain node is a sidechain record carrying an
    `agentId` (a session's own records are not sidechains; the inline layout's sidechain
    records, in the session's file, carry no `agentId`)."""
    first = entries[0] if entries else {}
    return bool(first.get("isSidechain")) and isinstance(first.get("agentId"), str) and bool(first["agentId"])


def is_visible(entry: dict) -> bool:
    """`_is_visible_message`."""
    if entry.get("type") not in ("user", "assistant"):
        return False
    return not (entry.get("isMeta") or entry.get("isSidechain") or entry.get("teamName"))


def _blocks(content) -> list:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return list(content) if isinstance(content, list) else []


def messages_view(records: list[dict]) -> list[dict]:
    """Messages-API view of user/assistant records (others dropped): one message.id's
    assistant records merged, consecutive users merged."""
    out: list[dict] = []
    last_id = None
    for entry in records:
        if entry.get("type") not in ("user", "assistant"):
            continue
        message = entry["message"] if isinstance(entry.get("message"), dict) else {}
        content = message.get("content")
        if entry["type"] == "assistant":
            message_id = message.get("id")
            if out and out[-1]["role"] == "assistant" and message_id is not None and message_id == last_id:
                out[-1]["content"] = _blocks(out[-1]["content"]) + _blocks(content)
            else:
                out.append({"role": "assistant", "content": content})
            last_id = message_id
        else:
            if out and out[-1]["role"] == "user":
                out[-1]["content"] = _blocks(out[-1]["content"]) + _blocks(content)
            else:
                out.append({"role": "user", "content": content})
            last_id = None
    return out


def _before_compaction(chain: list[dict], by_uuid: dict) -> set:
    """Uuids of the history a compaction replaced: from each boundary's logical parent back."""
    out: set = set()
    todo = [e.get("logicalParentUuid") for e in chain if _is_boundary(e)]
    while todo:
        start = todo.pop()
        start = by_uuid.get(start) if isinstance(start, str) else None   # a uuid is a string (the SDK's `str | None`)
        if start is None:
            continue
        for node in _walk(start, by_uuid):
            if node["uuid"] in out:
                break
            out.add(node["uuid"])
            if _is_boundary(node):
                todo.append(node.get("logicalParentUuid"))
    return out


def _abandoned(entries: list[dict], by_uuid: dict, kept: set, include_sidechains: bool) -> list[str]:
    """Uuids on branches not chosen, in file order.

    Off-chain nodes (not `kept`: the chain and the history a compaction replaced; not
    sidechain records, which `sidechains` lists) group into branches: each node belongs to
    the branch of its highest off-chain ancestor along parentUuid. A branch that holds a
    user/assistant record is a conversation not chosen (an edited or retried prompt's
    original, what followed it, records hanging from those). A branch of only system,
    progress or attachment records is not: it hangs from the chosen conversation (a hook's
    summary or a turn's duration after the leaf, a tool's progress beside its result).
    """
    def off_chain(entry) -> bool:
        return entry["uuid"] not in kept and (include_sidechains or not entry.get("isSidechain"))

    branch_of: dict = {}
    for entry in entries:
        if not off_chain(entry) or entry["uuid"] in branch_of:
            continue
        path = []
        for node in _walk(entry, by_uuid):
            if not off_chain(node) or node["uuid"] in branch_of:
                break
            path.append(node["uuid"])
        root = branch_of.get(node["uuid"]) if off_chain(node) and node["uuid"] in branch_of else path[-1]
        for uid in path:
            branch_of[uid] = root
    with_messages = {branch_of[e["uuid"]] for e in entries
                     if e["uuid"] in branch_of and e.get("type") in ("user", "assistant")}
    out, listed = [], set()
    for entry in entries:
        uid = entry["uuid"]
        if uid in branch_of and branch_of[uid] in with_messages and uid not in listed:
            listed.add(uid)
            out.append(uid)
    return out


def _is_boundary(entry: dict) -> bool:
    return entry.get("type") == "system" and entry.get("subtype") == "compact_boundary"


def _sidechains(entries: list[dict]) -> list[Sidechain]:
    side = [e for e in entries if e.get("isSidechain")]
    by_uuid = {e["uuid"]: e for e in side}
    position = {e["uuid"]: i for i, e in enumerate(entries)}
    children: dict = {}
    for e in side:
        children.setdefault(_parent(e), []).append(e["uuid"])
    out, seen_roots = [], set()
    for e in side:
        parent = _parent(e)
        if (parent in by_uuid) or e["uuid"] in seen_roots:
            continue
        seen_roots.add(e["uuid"])
        tree, stack = [], [e["uuid"]]
        while stack:
            uid = stack.pop()
            if uid in tree:
                continue
            tree.append(uid)
            stack.extend(children.get(uid, []))
        # As the session's own leaf (`_build_conversation_chain`): each terminal walks back to
        # its nearest user/assistant record (a trailing progress or system record is no leaf).
        leaves = []
        for terminal in (u for u in tree if not children.get(u)):
            nearest = next((n for n in _walk(by_uuid[terminal], by_uuid) if n.get("type") in ("user", "assistant")),
                           None)
            if nearest is not None:
                leaves.append(nearest["uuid"])
        leaf = max(leaves, key=lambda u: position[u]) if leaves else e["uuid"]
        path = [n["uuid"] for n in _walk(by_uuid[leaf], by_uuid)]
        path.reverse()
        out.append(Sidechain(e["uuid"], leaf, path))
    return out


@dataclass(frozen=True)
class Sidechain(Result):
    """A sidechain (a subagent's records inside the session): its root, its leaf, the path between."""

    root: str
    leaf: str
    uuids: list[str]


@dataclass(frozen=True)
class Compaction(Result):
    """The compaction boundary the chain starts at, and the record it logically follows."""

    boundary: str
    logical_parent: str | None


@dataclass(frozen=True)
class ClaudeReplay(Result):
    """What Claude Code resumes after the first `at` records of a transcript (docs/HARNESSES.md):
    the leaf, the chain to it, the records it shows, those abandoned on branches not chosen,
    the sidechains, the compaction the chain starts at, and the Messages-API view."""

    session_id: str | None
    at: int
    leaf: str | None
    chain: list[str]
    visible: list[str]
    abandoned: list[str]
    sidechains: list[Sidechain]
    compaction: Compaction | None
    messages: list[dict]
    format: str = "claude"

    def to_json(self) -> dict:  # the messages are the log's own JSON: no walk over them
        return {"format": self.format, "session_id": self.session_id, "at": self.at, "leaf": self.leaf,
                "chain": self.chain, "visible": self.visible, "abandoned": self.abandoned,
                "sidechains": [side.to_json() for side in self.sidechains],
                "compaction": None if self.compaction is None else self.compaction.to_json(),
                "messages": self.messages}


def replay_claude(records) -> ClaudeReplay:
    """The replay document (`replay --json`, format claude) of `records` (all of them)."""
    at = len(records)
    entries = []
    session_id = None
    for index in range(at):
        _, record = records[index]
        if record is None:
            continue
        if session_id is None and isinstance(record.get("sessionId"), str):
            session_id = record["sessionId"]
        if _is_node(record):
            entries.append(record)
    subagent = is_subagent_transcript(entries)
    chain = build_subagent_chain(entries) if subagent else build_chain(entries)
    by_uuid = {e["uuid"]: e for e in entries}
    in_chain = {e["uuid"] for e in chain}
    replaced = _before_compaction(chain, by_uuid)
    if subagent:
        visible = [e for e in chain if e.get("type") in ("user", "assistant")]
    else:
        visible = [e for e in chain if is_visible(e)]
    abandoned = _abandoned(entries, by_uuid, in_chain | replaced, include_sidechains=subagent)
    boundary = next((e for e in reversed(chain) if _is_boundary(e)), None)
    compaction = None if boundary is None else Compaction(boundary["uuid"], boundary.get("logicalParentUuid"))
    return ClaudeReplay(session_id, at, chain[-1]["uuid"] if chain else None, [e["uuid"] for e in chain],
                        [e["uuid"] for e in visible], abandoned, [] if subagent else _sidechains(entries),
                        compaction, messages_view(chain))
