"""The checkpoint tools an agent calls over MCP: schemas, scoping, bounded and paged answers.

`ToolHost` holds what the host decided when it started the server (the store, the
thread globs, whether restore is allowed, the page cap) and answers each tool call
with a plain dict, so the SDK wiring (server.py) and the benchmarks share it.

Rules every answer keeps (after agent-libos's checkpoint tool guide, with cursors):
  - Bounded: a page holds at most the host's --limit items (a larger `limit` is
    shrunk, not refused) and its JSON at most MAX_ANSWER_BYTES; a page cut by bytes
    says so (has_more / truncated) and its cursor resumes at the first item left out.
  - Stored text (reasons, file names, effect targets, thread names) appears only as
    data fields, cut to a preview that ends in "…[truncated]" with a *_truncated flag;
    no answer text is composed from it.
  - Full counts are the completeness signal; previews are capped and say so.
  - Cursors are opaque but carry their whole position: the tool, its target and the
    page's resume point (the last checkpoint id returned, a file index in the tree's
    sorted file list, an effect record's seq), sealed with an HMAC key kept in the
    store's metadata (`Store.token_key`), so a cursor cannot be forged to start a walk
    outside the host's scope. Nothing of a walk is kept in the server: a cursor resumes
    in any server process on the same store, after a restart too. A list cursor names
    the last checkpoint returned and the next page walks first parents from it:
    commits arriving meanwhile never shift it, and the last page costs what the first
    does. File and effect positions index immutable things (a tree, a history prefix).
  - Scope: threads must match a --thread glob; a checkpoint is in scope when the
    thread it was made on is. restore/revert only with --allow-restore; otherwise the
    answer is that restore is the host's decision, with the command the host would run.
"""

from __future__ import annotations

import base64
import fnmatch
import hashlib
import hmac
import json
import os
import re
import secrets
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from agentcas.errors import AgentcasError, NotFound, UsageError
from agentcas.lineage.effects import NOT_UNDONE_NOTE, OPEN_STATES

if TYPE_CHECKING:
    from agentcas.cas.objects import Checkpoint
    from agentcas.repository import Store

TRUNCATED = "…[truncated]"
MAX_ANSWER_BYTES = 64 * 1024
CURSOR_KEY_PURPOSE = "mcp-cursors"
DEFAULT_LIMIT = 50
MAX_HOST_LIMIT = 1000
REASON_PREVIEW_CHARS = 160
PATH_PREVIEW_CHARS = 256
TEXT_PREVIEW_CHARS = 256     # effect targets, kinds, providers, thread names of items
SUMMARY_KEYS_CAP = 20        # categories per summary map (by state / rollback / provider)
SUMMARY_KEY_CHARS = 64
_HEX_ID = re.compile(r"^[0-9a-f]{8,64}$")
_ENVELOPE_RESERVE = 6 * 1024  # room for a page's fixed fields beside its items
RESTORE_NOTE = ("restore changes which checkpoint a thread points at (revert_thread) or writes a "
                "checkpoint's files into a new directory (restore_checkpoint); it never undoes external "
                "effects, never re-executes anything, and the old head stays in the reflog")
HOST_DECISION = ("restore is the host's decision: this server was started without --allow-restore, so "
                 "nothing was changed; the host can run host_command after reviewing the open effects")


class ToolError(AgentcasError):
    """A tool call the server refuses: answered as an MCP tool error, the server goes on."""

    exit_code = 2


def preview(text: str | None, chars: int) -> tuple[str | None, bool]:
    """(text cut to `chars` characters plus the truncation mark, whether it was cut)."""
    if text is None or len(text) <= chars:
        return text, False
    return text[:chars] + TRUNCATED, True


def json_size(doc) -> int:
    return len(json.dumps(doc, ensure_ascii=False, sort_keys=True).encode("utf-8"))


def _limit_schema(cap: int) -> dict:
    return {"type": "integer", "minimum": 1, "default": cap,
            "description": f"Items per page; the host caps it at {cap} (a larger value is shrunk to {cap})."}


_CURSOR = {"type": ["string", "null"], "description": "The next_cursor of the previous page (opaque)."}
_ID = {"type": "string", "description": "A checkpoint id (64 hex characters, or a unique prefix of 8+)."}
_NULLABLE_STR = {"type": ["string", "null"]}
_PAGE_FIELDS = {"returned_count": {"type": "integer"}, "has_more": {"type": "boolean"},
                "next_cursor": _NULLABLE_STR}
_EFFECT_ITEM = {"type": "object", "properties": {
    "id": {"type": "string"}, "state": {"type": "string"}, "rollback": {"type": "string"},
    "kind": {"type": "string"}, "target_preview": {"type": "string"}, "target_truncated": {"type": "boolean"},
    "provider": _NULLABLE_STR, "operation": _NULLABLE_STR, "first_seq": {"type": "integer"},
    "state_seq": {"type": "integer"}}, "required": ["id", "state", "rollback", "target_preview"]}
_EFFECTS_PAGE = {"type": "object", "properties": dict(_PAGE_FIELDS, items={"type": "array", "items": _EFFECT_ITEM},
                                                      count={"type": "integer"}),
                 "required": ["items", "count", "returned_count", "has_more", "next_cursor"]}


def _obj(properties: dict, required: list[str]) -> dict:
    return {"type": "object", "properties": properties, "required": required}


def _args(properties: dict, required: list[str]) -> dict:
    """An input schema: unknown arguments are refused, not ignored."""
    return dict(_obj(properties, required), additionalProperties=False)


@dataclass
class ToolSpec:
    name: str
    description: str
    input_schema: dict
    output_schema: dict


@dataclass
class ToolHost:
    """The tools over one Store, scoped and bounded as the host decided."""

    store: Store
    globs: tuple[str, ...] = ("*",)
    allow_restore: bool = False
    limit: int = DEFAULT_LIMIT
    workspace_root: str = field(default_factory=os.getcwd)
    _key: bytes = b""             # the cursor key: the store's (see the module doc)
    _trees: OrderedDict = field(default_factory=OrderedDict)
    _summaries: OrderedDict = field(default_factory=OrderedDict)
    _diffs: OrderedDict = field(default_factory=OrderedDict)

    def __post_init__(self):
        if not 1 <= self.limit <= MAX_HOST_LIMIT:
            raise UsageError(f"--limit must be 1..{MAX_HOST_LIMIT}, got {self.limit}")
        self.globs = tuple(self.globs) or ("*",)
        self.workspace_root = os.path.realpath(self.workspace_root)
        if not self._key:
            try:
                self._key = self.store.token_key(CURSOR_KEY_PURPOSE)
            except AgentcasError:
                # A store this process cannot write (read-only): cursors then last as long as
                # this server process, and say so when refused.
                self._key = secrets.token_bytes(32)

    # -- the tool list -------------------------------------------------------------------------
    def specs(self) -> list[ToolSpec]:
        cap = self.limit
        limit = _limit_schema(cap)
        checkpoint_item = {"type": "object", "additionalProperties": False,
                           "properties": {"checkpoint_id": {"type": "string"}, "thread": {"type": "string"},
                                          "reason_preview": {"type": "string"}, "created_at": {"type": "string"},
                                          "author": {"type": "string"}, "history_seq": {"type": "integer"}},
                           "required": ["checkpoint_id", "thread", "reason_preview", "created_at", "author",
                                        "history_seq"]}
        open_effects = _obj({"count": {"type": "integer"}, "since_seq": {"type": "integer"},
                             "items": {"type": "array", "items": _EFFECT_ITEM}, "has_more": {"type": "boolean"},
                             "note": {"type": "string"}}, ["count", "items", "has_more", "note"])
        restore_out = _obj({"performed": {"type": "boolean"}, "status": {"type": "string"},
                            "message": {"type": "string"},
                            "host_command": {"type": "array", "items": {"type": "string"}},
                            "open_effects": open_effects, "result": {"type": ["object", "null"]},
                            "note": {"type": "string"}},
                           ["performed", "status", "host_command", "open_effects", "note"])
        return [
            ToolSpec("create_checkpoint",
                     "Snapshot a workspace directory (default: the host's workspace) as a checkpoint of a "
                     "thread. The reason (1..512 characters, at most 1,024 UTF-8 bytes) is stored in full; "
                     "the answer returns only a preview: keep checkpoint_id, never rebuild the reason from it.",
                     _args({"reason": {"type": "string", "minLength": 1},
                           "workspace": {"type": "string", "description": "A directory inside the host's workspace."},
                           "thread": {"type": "string"}}, ["reason"]),
                     _obj({"checkpoint_id": {"type": "string"}, "thread": {"type": "string"},
                           "history_seq": {"type": "integer"}, "reason_preview": {"type": "string"},
                           "reason_truncated": {"type": "boolean"}, "parents": {"type": "array"},
                           "file_count": {"type": "integer"}, "file_bytes": {"type": "integer"}},
                          ["checkpoint_id", "thread", "history_seq", "reason_preview", "reason_truncated"])),
            ToolSpec("list_checkpoints",
                     "A thread's checkpoints newest first (along first parents), a page at a time. Follow "
                     "next_cursor until has_more is false; the cursor resumes exactly after the last item "
                     "even while new checkpoints arrive.",
                     _args({"thread": {"type": "string"}, "limit": limit, "cursor": _CURSOR}, ["thread"]),
                     _obj(dict(_PAGE_FIELDS, thread={"type": "string"}, limit_applied={"type": "integer"},
                               items={"type": "array", "items": checkpoint_item}),
                          ["thread", "items", "returned_count", "has_more", "next_cursor"])),
            ToolSpec("inspect_checkpoint",
                     "One checkpoint: identity, parents, history position, file count and bytes, and a page "
                     "of its files (repeat with files_page.next_cursor until truncated is false). This is the "
                     "frozen checkpoint, not live state.",
                     _args({"checkpoint_id": _ID, "cursor": _CURSOR, "limit": limit}, ["checkpoint_id"]),
                     _obj({"checkpoint_id": {"type": "string"}, "thread": {"type": "string"},
                           "parents": {"type": "array", "items": {"type": "string"}},
                           "reason_preview": {"type": "string"}, "reason_truncated": {"type": "boolean"},
                           "created_at": {"type": "string"}, "author": {"type": "string"},
                           "history": {"type": "object"}, "file_count": {"type": "integer"},
                           "file_bytes": {"type": "integer"},
                           "files_page": _obj({"count": {"type": "integer"}, "returned_count": {"type": "integer"},
                                               "truncated": {"type": "boolean"}, "next_cursor": _NULLABLE_STR,
                                               "items": {"type": "array"}},
                                              ["count", "returned_count", "truncated", "next_cursor", "items"])},
                          ["checkpoint_id", "thread", "parents", "history", "file_count", "file_bytes",
                           "files_page"])),
            ToolSpec("diff_checkpoint",
                     "Compare two checkpoints: full added/removed/changed counts of files and history "
                     "records (use the counts, not the capped previews), and the external effects recorded "
                     "in `to`'s history after the two part, a page at a time (follow effects_page.next_cursor).",
                     _args({"from": _ID, "to": _ID, "cursor": _CURSOR, "limit": limit}, ["from", "to"]),
                     _obj({"from": {"type": "string"}, "to": {"type": "string"}, "files": {"type": "object"},
                           "records": {"type": "object"}, "effects_page": _EFFECTS_PAGE,
                           "effect_summary": {"type": "object"}, "note": {"type": "string"}},
                          ["from", "to", "files", "records", "effects_page", "effect_summary"])),
            ToolSpec("fork_checkpoint",
                     "A new thread starting at a checkpoint (sharing its history, copying nothing). The "
                     "source is untouched; external effects are not cloned or undone.",
                     _args({"checkpoint_id": _ID, "name": {"type": "string"}}, ["checkpoint_id", "name"]),
                     _obj({"thread": {"type": "string"}, "checkpoint_id": {"type": ["string", "null"]},
                           "history_seq": {"type": "integer"}}, ["thread", "checkpoint_id", "history_seq"])),
            ToolSpec("restore_checkpoint",
                     "Write a checkpoint's files into a new directory. Only when the host allowed restore; "
                     "otherwise the answer gives the host's command. Lists the pending/unknown external "
                     "effects recorded after the checkpoint first: they are not undone.",
                     _args({"checkpoint_id": _ID, "dest": {"type": "string", "description": "A directory "
                                                          "that does not exist, inside the host's workspace."}},
                          ["checkpoint_id", "dest"]),
                     restore_out),
            ToolSpec("revert_thread",
                     "Point a thread back at a checkpoint (the old head stays in the reflog). Only when the "
                     "host allowed restore; otherwise the answer gives the host's command. Lists the "
                     "pending/unknown external effects recorded after the checkpoint first: they are not undone.",
                     _args({"thread": {"type": "string"}, "checkpoint_id": _ID,
                           "expect": {"type": ["string", "null"], "description": "Revert only if the thread "
                                      "is at this checkpoint id."}}, ["thread", "checkpoint_id"]),
                     restore_out),
            ToolSpec("rewind_session",
                     "Rewind a harness session (a claude/... or codex/... thread) to a checkpoint: the "
                     "workspace is checkpointed first (the answer's undo), then made equal to the checkpoint's "
                     "files (ignored files and .git untouched), and a forked session is written where the "
                     "harness resumes it (only: code or conversation for one of the two). Only when the host "
                     "allowed restore; otherwise the answer gives the host's command. External effects are "
                     "not undone.",
                     _args({"thread": {"type": "string"}, "checkpoint_id": _ID,
                           "only": {"type": ["string", "null"], "enum": ["code", "conversation", None]},
                           "workspace": {"type": ["string", "null"], "description": "A directory inside the "
                                         "host's workspace (default: the one the checkpoints recorded)."}},
                          ["thread", "checkpoint_id"]),
                     restore_out),
            ToolSpec("resume_session",
                     "Write a thread's stored harness session (to a checkpoint, default all of it) where "
                     "this machine's Claude Code or Codex resumes it, byte for byte under its own id; a "
                     "different file already there is refused. Only when the host allowed restore; "
                     "otherwise the answer gives the host's command.",
                     _args({"thread": {"type": "string"}, "checkpoint_id": {"type": ["string", "null"]},
                           "cwd": {"type": ["string", "null"], "description": "The checkout a Claude Code "
                                   "session belongs to (inside the host's workspace)."}}, ["thread"]),
                     restore_out),
        ]

    def call(self, name: str, arguments: dict) -> dict:
        """Run tool `name`; raise ToolError / AgentcasError for a refused or failed call."""
        handler = getattr(self, f"tool_{name}", None)
        if handler is None or name not in {s.name for s in self.specs()}:
            raise ToolError(f"unknown tool: {name[:100]!r}")
        doc = handler(**arguments)
        if json_size(doc) > MAX_ANSWER_BYTES:  # every page is budgeted below this: a bug, not data
            raise ToolError(f"{name}: the answer would exceed {MAX_ANSWER_BYTES} bytes; nothing returned")
        return doc

    # -- scope, ids, cursors -------------------------------------------------------------------
    def check_thread(self, thread) -> str:
        if not isinstance(thread, str) or not thread:
            raise ToolError("thread must be a non-empty string")
        if not any(fnmatch.fnmatchcase(thread, g) for g in self.globs):
            raise ToolError(f"thread {preview(thread, 100)[0]!r} is outside this server's scope "
                            f"(threads matching {', '.join(self.globs)})")
        return thread

    def _checkpoint(self, checkpoint_id) -> tuple[str, Checkpoint]:
        """(full id, Checkpoint) of an in-scope checkpoint named by hex id or prefix."""
        if not isinstance(checkpoint_id, str) or not _HEX_ID.match(checkpoint_id):
            raise ToolError("checkpoint_id must be 8..64 lowercase hex characters")
        digest, cp = self.store.checkpoints.get(checkpoint_id)
        if not any(fnmatch.fnmatchcase(cp.thread, g) for g in self.globs):
            raise ToolError(f"checkpoint {digest.hex()[:12]} was made on a thread outside this server's scope")
        return digest.hex(), cp

    def _limit(self, limit) -> int:
        if limit is None:
            return self.limit
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ToolError("limit must be a positive integer")
        return min(limit, self.limit)

    def seal(self, tool: str, key: str, position) -> str:
        body = base64.urlsafe_b64encode(json.dumps([tool, key, position]).encode()).decode().rstrip("=")
        mac = hmac.new(self._key, body.encode(), hashlib.blake2b).hexdigest()[:32]
        return f"{body}.{mac}"

    def unseal(self, tool: str, key: str, cursor):
        """The position a cursor of this tool and target carries, or ToolError."""
        if cursor is None:
            return None
        try:
            body, mac = cursor.split(".")
            good = hmac.compare_digest(hmac.new(self._key, body.encode(), hashlib.blake2b).hexdigest()[:32], mac)
            doc = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))) if good else None
        except (AttributeError, ValueError, TypeError):
            doc = None
        if doc is None:
            raise ToolError("cursor is not one this server issued (altered, or issued for another store): "
                            "start again without a cursor")
        if doc[0] != tool or doc[1] != key:
            raise ToolError(f"cursor belongs to another {doc[0]} call, not to this one")
        return doc[2]

    def _fits(self, items: list, item: dict, used: int) -> tuple[bool, int]:
        size = json_size(item) + 1
        return used + size <= MAX_ANSWER_BYTES - _ENVELOPE_RESERVE, used + size

    # -- tools ---------------------------------------------------------------------------------
    def tool_create_checkpoint(self, reason, workspace=None, thread=None) -> dict:
        thread = self.check_thread(thread if thread is not None else self._default_thread())
        path = self._inside_workspace(workspace if workspace is not None else self.workspace_root, "workspace")
        if not isinstance(reason, str):
            raise ToolError("reason must be a string")
        from agentcas.workspace.snapshot import SecretFound
        try:
            result = self.store.checkpoints.commit(path, reason, thread)
        except SecretFound as exc:
            # The agent cannot pass --allow-secret: say what it and its host can do.
            raise ToolError(f"{exc.finding}; nothing was committed. Remove the secret (or reword the reason) "
                            "and call create_checkpoint again, or ask the host to add the file to "
                            ".agentcasignore or to commit it itself with `agentcas commit --allow-secret "
                            f"{exc.allow or 'GLOB'}`") from None
        text, cut = preview(reason, REASON_PREVIEW_CHARS)
        return {"checkpoint_id": result.checkpoint, "thread": thread, "history_seq": result.history.seq,
                "reason_preview": text, "reason_truncated": cut, "parents": result.parents,
                "file_count": result.files, "file_bytes": result.bytes}

    def _default_thread(self) -> str:
        literal = [g for g in self.globs if not any(c in g for c in "*?[")]
        return literal[0] if literal else "main"

    def _inside_workspace(self, path, what: str) -> str:
        if not isinstance(path, str) or not path or "\x00" in path:
            raise ToolError(f"{what} must be a non-empty path")
        full = os.path.realpath(os.path.join(self.workspace_root, path))
        if not (full == self.workspace_root or full.startswith(self.workspace_root.rstrip("/") + "/")):
            raise ToolError(f"{what} must be inside the host's workspace ({self.workspace_root})")
        return full

    def tool_list_checkpoints(self, thread, limit=None, cursor=None) -> dict:
        thread = self.check_thread(thread)
        n = self._limit(limit)
        after = self.unseal("list_checkpoints", thread, cursor)
        if after is None:
            state = self.store.threads.get(thread)
            start = None if state.checkpoint is None else state.checkpoint.hex()
            entries = [] if start is None else self.store.threads.log(start, n + 1)
        else:
            entries = self.store.threads.log(after, n + 2)[1:]  # the walk resumes after the cursor's checkpoint
        items: list[dict] = []
        used = 0
        for entry in entries[:n]:
            text, _ = preview(entry.reason, REASON_PREVIEW_CHARS)
            item = {"checkpoint_id": entry.checkpoint, "thread": preview(entry.thread, TEXT_PREVIEW_CHARS)[0],
                    "reason_preview": text, "created_at": entry.created_at,
                    "author": preview(entry.author, TEXT_PREVIEW_CHARS)[0],
                    "history_seq": entry.history.seq}
            fits, used = self._fits(items, item, used)
            if not fits:
                break
            items.append(item)
        more = len(entries) > len(items)
        return {"thread": thread, "items": items, "returned_count": len(items), "has_more": more,
                "next_cursor": self.seal("list_checkpoints", thread, items[-1]["checkpoint_id"])
                if more and items else None, "limit_applied": n}

    def _tree_files(self, checkpoint_id: str, tree: str) -> list:
        """The files of a tree (FileInfo; immutable, so cached per tree id: pages are slices)."""
        files = self._trees.get(tree)
        if files is None:
            files = self.store.checkpoints.files(checkpoint_id)
            self._trees[tree] = files
            while len(self._trees) > 16:
                self._trees.popitem(last=False)
        else:
            self._trees.move_to_end(tree)
        return files

    def tool_inspect_checkpoint(self, checkpoint_id, cursor=None, limit=None) -> dict:
        full, cp = self._checkpoint(checkpoint_id)
        n = self._limit(limit)
        start = self.unseal("inspect_checkpoint", full, cursor) or 0
        files = self._tree_files(full, cp.tree.hex())
        items: list[dict] = []
        used = 0
        for entry in files[start:start + n]:
            path, cut = preview(entry.path, PATH_PREVIEW_CHARS)
            item = {"path_preview": path, "path_truncated": cut, "size": entry.size,
                    "mode": entry.mode, "id": entry.id}
            fits, used = self._fits(items, item, used)
            if not fits:
                break
            items.append(item)
        end = start + len(items)
        reason, reason_cut = preview(cp.reason, REASON_PREVIEW_CHARS)
        return {"checkpoint_id": full, "thread": preview(cp.thread, TEXT_PREVIEW_CHARS)[0],
                "parents": [p.hex() for p in cp.parents], "tree": cp.tree.hex(),
                "reason_preview": reason, "reason_truncated": reason_cut, "created_at": cp.created_at,
                "author": preview(cp.author, TEXT_PREVIEW_CHARS)[0], "history": cp.history.to_doc(),
                "file_count": len(files), "file_bytes": sum(f.size for f in files),
                "files_page": {"count": len(files), "returned_count": len(items), "truncated": end < len(files),
                               "next_cursor": self.seal("inspect_checkpoint", full, end) if end < len(files)
                               else None, "items": items}}

    def _effect_item(self, e) -> dict:
        """An EffectState as a bounded answer item."""
        target, cut = preview(e.target, TEXT_PREVIEW_CHARS)
        return {"id": preview(e.id, TEXT_PREVIEW_CHARS)[0], "state": e.state,
                "rollback": e.rollback, "kind": preview(e.kind, TEXT_PREVIEW_CHARS)[0] or "",
                "target_preview": target or "", "target_truncated": cut,
                "provider": preview(e.provider, TEXT_PREVIEW_CHARS)[0],
                "operation": preview(e.operation, TEXT_PREVIEW_CHARS)[0],
                "first_seq": e.first_seq, "state_seq": e.state_seq}

    def _bounded_items(self, raw: list, budget: int) -> list[dict]:
        items, used = [], 0
        for e in raw:
            item = self._effect_item(e)
            used += json_size(item) + 1
            if used > budget:
                break
            items.append(item)
        return items

    @staticmethod
    def _bounded_map(table: dict, cap: int) -> dict:
        keys = sorted(table, key=lambda k: (-table[k], k))
        shown = {preview(k, SUMMARY_KEY_CHARS)[0]: table[k] for k in keys[:cap]}
        return {"counts": shown, "categories": len(table), "truncated": len(keys) > cap}

    def tool_diff_checkpoint(self, cursor=None, limit=None, **ends) -> dict:
        unknown = set(ends) - {"from", "to"}
        if unknown or "from" not in ends or "to" not in ends:
            raise ToolError("diff_checkpoint needs exactly: from, to (and optional cursor, limit)")
        old, _ = self._checkpoint(ends["from"])
        new, _ = self._checkpoint(ends["to"])
        n = self._limit(limit)
        before = self.unseal("diff_checkpoint", f"{old}..{new}", cursor)
        # Two checkpoints never change: their diff is computed once, kept for the later pages.
        d = self._diffs.get((old, new))
        if d is None:
            d = self._diffs[(old, new)] = self.store.checkpoints.diff(old, new)
            while len(self._diffs) > 8:
                self._diffs.popitem(last=False)
        # The byte budget: file previews 16 KiB (a third each), effect items 24 KiB, the three
        # summary maps at most 3 x 20 x (64 characters) ~ 16 KiB, fixed fields the reserve.
        files_budget, effects_budget = 16 * 1024 // 3, 24 * 1024

        def file_preview(rows):
            out, used = [], 0
            for row in rows[:n]:
                path, cut = preview(row.path, PATH_PREVIEW_CHARS)
                item = dict({k: v for k, v in row.to_json().items() if k != "path"}, path_preview=path,
                            path_truncated=cut)
                used += json_size(item) + 1
                if used > files_budget:
                    break
                out.append(item)
            return out

        files = {}
        for key, rows in (("added", d.added), ("removed", d.removed), ("changed", d.changed)):
            shown = file_preview(rows)
            files[key] = {"count": len(rows), "preview": shown, "truncated": len(shown) < len(rows)}
        # Window totals cost O(window): computed once per (from, to), kept for the later pages.
        totals = self._summaries.get((old, new))
        page = self.store.effects.list(new, since=old, limit=n, before=before, totals=totals is None)
        if totals is None:
            totals = self._summaries[(old, new)] = page.totals
            while len(self._summaries) > 64:
                self._summaries.popitem(last=False)
        assert totals is not None  # this pair's, or this page's (asked for when not kept)
        items = self._bounded_items(page.effects, effects_budget)
        more = page.has_more or len(items) < len(page.effects)
        return {"from": old, "to": new, "files": files, "records": d.records.to_json(),
                "effects_page": {"count": totals["effects"], "items": items, "returned_count": len(items),
                                 "has_more": more, "next_cursor": self.seal("diff_checkpoint", f"{old}..{new}",
                                                                            items[-1]["state_seq"])
                                 if more and items else None},
                "effect_summary": {"total": totals["effects"], "since_seq": page.since_seq,
                                   "open": sum(totals["by_state"].get(s, 0) for s in OPEN_STATES),
                                   "by_state": self._bounded_map(totals["by_state"], SUMMARY_KEYS_CAP),
                                   "by_rollback": self._bounded_map(totals["by_rollback"], SUMMARY_KEYS_CAP),
                                   "by_provider": self._bounded_map(totals["by_provider"], SUMMARY_KEYS_CAP),
                                   "restore_policy": "report_only"},
                "note": NOT_UNDONE_NOTE}

    def tool_fork_checkpoint(self, checkpoint_id, name) -> dict:
        full, _ = self._checkpoint(checkpoint_id)
        name = self.check_thread(name)
        result = self.store.threads.fork(full, name)
        return {"thread": name, "source_checkpoint": full, "checkpoint_id": result.checkpoint,
                "history_seq": result.seq}

    def _open_effects(self, doc) -> dict:
        """An OpenEffects (or None) as a bounded answer."""
        if doc is None:
            return {"count": 0, "since_seq": 0, "items": [], "has_more": False, "note": NOT_UNDONE_NOTE}
        items = self._bounded_items(doc.effects[: self.limit], (MAX_ANSWER_BYTES - _ENVELOPE_RESERVE) // 2)
        return {"count": doc.count, "since_seq": doc.since_seq, "items": items,
                "has_more": doc.has_more or len(items) < len(doc.effects), "note": NOT_UNDONE_NOTE}

    def _host_command(self, *args: str) -> list[str]:
        store = ["--store", self.store.path] if self.store.path else []
        return ["agentcas", *store, *args]

    def tool_restore_checkpoint(self, checkpoint_id, dest) -> dict:
        full, _ = self._checkpoint(checkpoint_id)
        target = self._inside_workspace(dest, "dest")
        open_effects = self._open_effects(self.store.effects.after_checkpoint(full))
        command = self._host_command("checkout", full, target)
        if not self.allow_restore:
            return {"performed": False, "status": "host_decision", "message": HOST_DECISION,
                    "host_command": command, "open_effects": open_effects, "result": None, "note": RESTORE_NOTE}
        if os.path.lexists(target):
            raise ToolError("dest exists: restore writes only into a new directory")
        result = self.store.checkpoints.checkout(full, target)
        from agentcas.workspace.snapshot import RESTORED_MARKER
        with open(os.path.join(target, RESTORED_MARKER), "w") as marker:
            # Inside the workspace, so later checkpoints would store the copy: this file leaves
            # the directory out of them (delete it to have the copy checkpointed).
            marker.write(f"restored from checkpoint {full}; agentcas leaves this directory out of "
                         "checkpoints while this file is here\n")
        return {"performed": True, "status": "restored", "message": "files written; effects not undone",
                "host_command": command, "open_effects": open_effects,
                "result": {"checkpoint_id": full, "files": result.files}, "note": RESTORE_NOTE}

    def tool_revert_thread(self, thread, checkpoint_id, expect=None) -> dict:
        thread = self.check_thread(thread)
        full, cp = self._checkpoint(checkpoint_id)
        if expect is not None:
            expect, _ = self._checkpoint(expect)
        state = self.store.threads.get(thread)
        open_effects = self._open_effects(self.store.effects.open_after(state.history, thread, True, cp.history,
                                                                        limit=self.limit))
        command = self._host_command("revert", thread, full, *(["--expect", expect] if expect else []))
        if not self.allow_restore:
            return {"performed": False, "status": "host_decision", "message": HOST_DECISION,
                    "host_command": command, "open_effects": open_effects, "result": None, "note": RESTORE_NOTE}
        result = self.store.threads.revert(thread, full, expect)
        return {"performed": True, "status": "reverted", "message": "thread moved; effects not undone",
                "host_command": command, "open_effects": open_effects,
                "result": {"thread": thread, "checkpoint_id": result.checkpoint,
                           "previous": result.previous, "history_seq": result.history.seq},
                "note": RESTORE_NOTE}


    def tool_rewind_session(self, thread, checkpoint_id, only=None, workspace=None) -> dict:
        thread = self.check_thread(thread)
        full, cp = self._checkpoint(checkpoint_id)
        if only not in (None, "code", "conversation"):
            raise ToolError("only must be code, conversation or null")
        if workspace is not None:
            workspace = self._inside_workspace(workspace, "workspace")
        elif only != "conversation":
            recorded = cp.runtime.get("workspace")
            if recorded is None:
                raise ToolError("the checkpoint recorded no workspace: give workspace")
            workspace = self._inside_workspace(recorded, "workspace")
        state = self.store.threads.get(thread)
        open_effects = self._open_effects(self.store.effects.open_after(state.history, thread, True, cp.history,
                                                                        limit=self.limit))
        command = self._host_command("rewind", thread, "--to", full, *(["--only", only] if only else []),
                                     *(["--workspace", workspace] if workspace else []))
        if not self.allow_restore:
            return {"performed": False, "status": "host_decision", "message": HOST_DECISION,
                    "host_command": command, "open_effects": open_effects, "result": None, "note": RESTORE_NOTE}
        from agentcas.harnesses.rewind import rewind
        result = rewind(self.store, thread, full, only, workspace)
        doc = result.to_json()
        doc["files_written"], doc["files_removed"] = len(result.written), len(result.removed)
        return {"performed": True, "status": "rewound", "message": "files and session rewound; effects not undone",
                "host_command": command, "open_effects": open_effects, "result": doc, "note": RESTORE_NOTE}

    def tool_resume_session(self, thread, checkpoint_id=None, cwd=None) -> dict:
        thread = self.check_thread(thread)
        if checkpoint_id is not None:
            checkpoint_id, _ = self._checkpoint(checkpoint_id)
        if cwd is not None:
            cwd = self._inside_workspace(cwd, "cwd")
        command = self._host_command("resume", thread, *(["--at", checkpoint_id] if checkpoint_id else []),
                                     *(["--cwd", cwd] if cwd else []))
        empty = {"count": 0, "items": [], "has_more": False, "note": RESTORE_NOTE}
        if not self.allow_restore:
            return {"performed": False, "status": "host_decision", "message": HOST_DECISION,
                    "host_command": command, "open_effects": empty, "result": None, "note": RESTORE_NOTE}
        from agentcas.harnesses.rewind import resume
        placement = resume(self.store, thread, checkpoint_id, cwd)
        return {"performed": True, "status": "resumed" if placement.written else "already_there",
                "message": f"continue with: {placement.resume}", "host_command": command,
                "open_effects": empty, "result": placement.to_json(), "note": RESTORE_NOTE}


_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def bounded_error(exc: Exception) -> str:
    """One line for a tool error: control and bidi characters escaped, cut to a bounded length.

    An error may quote a name the caller passed or a path of the workspace; escaping keeps
    such text from reshaping the line it sits in.
    """
    text = " ".join(str(exc).split()) or type(exc).__name__
    text = _CONTROL.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
    return "error: " + (preview(text, 1000)[0] or "")


__all__ = ["ToolHost", "ToolError", "ToolSpec", "bounded_error", "MAX_ANSWER_BYTES", "TRUNCATED", "NotFound"]
