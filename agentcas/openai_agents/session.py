"""AgentcasSession: the OpenAI Agents SDK's session protocol over an agentcas store (docs/SESSIONS.md).

How it maps: session S is the agentcas thread `openai-agents/<S>` (S percent-encoded, one
name component), with no checkpoint; item i of the session is record i of the thread's
history: `{"i": ITEM}`, ITEM being the item as `json.dumps` writes it (what SQLiteSession
stores), or `{"t": "<that JSON text>"}` when the text holds NaN or Infinity, which a
history record may not.

- get_items(limit) reads only the last `limit` records (the latest N, oldest first);
- add_items appends the items' records in one compare-and-swap move;
- pop_item and clear_session move the thread back to its first n-1 (or 0) records, as
  `agentcas revert` does: the removed items stay in the store, named by the reflog entry
  before the move (`agentcas rollout cat openai-agents/S@{1}`);
- fork(new_id, at) is `agentcas fork`: the new thread shares the first `at` records (one
  history position, nothing copied) and `agentcas lineage` shows it under its source;
- checkpoint(reason) makes an agentcas checkpoint of the session as it is (an empty tree and
  the history), which `agentcas export` and `sign` name.

Every call that changes the session is one ref move by compare-and-swap (agentcas/
record_threads.py): several processes adding to one session all land, none lost. The
async methods run the store work in a worker thread, never on the event loop.
"""

from __future__ import annotations

import json
from typing import Any

from agents.memory.session import SessionABC
from agents.memory.session_settings import SessionSettings, coerce_session_settings, resolve_session_limit

from agentcas.errors import ConflictError
from agentcas.record_threads import Append, Checkpoint, Cut, RecordStore, in_thread, to_completion
from agentcas.refs.names import id_component

ROOT = "openai-agents"


def thread_name(session_id: str) -> str:
    """The agentcas thread that holds session `session_id`."""
    return f"{ROOT}/{id_component(str(session_id))}"


def _record(item: Any) -> bytes:
    """One item's record line (see the module doc); TypeError if `json.dumps` refuses it, as
    SQLiteSession raises."""
    text = json.dumps(item)
    if "NaN" in text or "Infinity" in text:  # maybe a bare constant: carried as text
        return json.dumps({"t": text}).encode("ascii") + b"\n"
    return b'{"i":' + text.encode("ascii") + b"}\n"


def _item(line: bytes) -> Any:
    record = json.loads(line)
    return record["i"] if "i" in record else json.loads(record["t"])


class AgentcasSession(SessionABC):
    """An Agents SDK session kept as an agentcas thread: persistent, shared, forkable."""

    def __init__(self, session_id: str, store, session_settings: SessionSettings | dict | None = None, *,
                 refs: str | None = None):
        """`store`: a Store, or a store path or s3:// URL (created if absent; a shared store
        needs `refs`, its postgresql:// URL). `session_settings.limit` is get_items' default."""
        self.session_id = session_id
        self.session_settings = (coerce_session_settings(session_settings) if session_settings is not None
                                 else SessionSettings())
        self.thread = thread_name(session_id)
        self._records = store if isinstance(store, RecordStore) else RecordStore(store, refs)
        self._owns_records = not isinstance(store, RecordStore)
        self._closed = False

    def close(self) -> None:
        """Close the store if this session opened it from a path."""
        self._closed = True
        if self._owns_records:
            self._records.close()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("AgentcasSession is closed")

    # -- the session protocol ----------------------------------------------------------------
    async def get_items(self, limit: int | None = None) -> list:
        """The session's items, oldest first; with a limit, the latest `limit` of them."""
        self._check_open()
        return await in_thread(self._get_items, resolve_session_limit(limit, self.session_settings))

    async def add_items(self, items: list) -> None:
        """Append `items` in one compare-and-swap move."""
        self._check_open()
        if not items:
            return
        data = b"".join(_record(item) for item in items)
        noun = "item" if len(items) == 1 else "items"
        append = Append(self.thread, data, f"add {len(items)} {noun}")
        await to_completion(self._records.change, f"add items to {self.thread}", lambda snapshot: ([append], None))

    async def pop_item(self) -> Any | None:
        """Remove and return the newest item (None if there is none): the thread moves back one record."""
        self._check_open()
        return await to_completion(self._records.change, f"pop an item of {self.thread}", self._plan_pop)

    async def clear_session(self) -> None:
        """Remove every item: the thread moves back to no record (the items stay in its reflog)."""
        self._check_open()
        await to_completion(self._records.change, f"clear {self.thread}", self._plan_clear)

    # -- forks -------------------------------------------------------------------------------
    def fork(self, new_session_id: str, at: int | None = None) -> AgentcasSession:
        """A new session sharing this one's first `at` items (all by default), at constant cost.

        One ref move (`agentcas fork`); no item is copied. The result may also be awaited
        (`await session.fork(...)` gives the same session). Raises ValueError if `at` is
        negative or beyond the session's items, agentcas's ConflictError if the new session
        already has a thread.
        """
        self._check_open()
        if at is not None and (isinstance(at, bool) or not isinstance(at, int) or at < 0):
            raise ValueError(f"at must be a non-negative item count, got {at!r}")
        target = thread_name(new_session_id)
        state = self._records.state(self.thread)
        count = 0 if state is None else state.history.seq
        if at is not None and at > count:
            raise ValueError(f"at={at} is beyond the {count} items of session {self.session_id!r}")
        if state is None:  # nothing stored yet: the fork is a new empty session
            if self._records.state(target) is not None:
                raise ConflictError(f"thread {target!r} already exists")
        else:
            self._records.fork(self.thread, target, at)
        return AgentcasSession(new_session_id, self._records, self.session_settings)

    def __await__(self):
        """`await session.fork(...)` works as well as `session.fork(...)`."""
        return self._itself().__await__()

    async def _itself(self) -> AgentcasSession:
        return self

    async def checkpoint(self, reason: str = "session checkpoint") -> str:
        """Make an agentcas checkpoint of the session as it is (an empty tree and the items'
        history), for `agentcas export` and `sign`, which name a checkpoint; its id (hex).
        Raises ValueError if nothing was ever stored in the session, agentcas's UsageError for
        a bad reason (1..512 characters)."""
        self._check_open()
        checkpoint = Checkpoint(self.thread, reason)

        def build(snapshot):
            if snapshot.state(self.thread) is None:
                raise ValueError(f"session {self.session_id!r} has nothing stored to checkpoint")
            return [checkpoint], None

        await to_completion(self._records.change, f"checkpoint {self.thread}", build)
        return checkpoint.made[0].hex()

    # -- store work (worker threads) ---------------------------------------------------------
    def _get_items(self, limit: int | None) -> list:
        state = self._records.state(self.thread)
        if state is None or limit == 0:
            return []
        count = state.history.seq
        start = 0 if limit is None or limit < 0 else max(0, count - limit)  # negative: all, as SQLite's LIMIT
        return [_item(line) for line in self._records.lines(state.history, start, count)]

    def _plan_pop(self, snapshot):
        count = snapshot.count(self.thread)
        if count == 0:
            return [], None
        line = snapshot.lines(self.thread, count - 1, count)[0]
        return [Cut(self.thread, count - 1, "pop item")], _item(line)

    def _plan_clear(self, snapshot):
        count = snapshot.count(self.thread)
        if count == 0:
            return [], None
        return [Cut(self.thread, 0, f"clear session ({count} items)")], None
