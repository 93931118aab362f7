"""AgentcasSessionService: Google ADK's BaseSessionService over an agentcas store (docs/SESSIONS.md).

Where things are stored (each an agentcas thread without checkpoints; ids percent-encoded,
one name component each):
- `adk/<app>/<user>/<session>`: the session. Record 0 is `{"k":"session","state":{...},
  "time":T}` (its session-scoped initial state and creation time); record i+1 is
  `{"k":"event","event":{...}}`, event i as ADK's JSON (`model_dump(mode="json",
  exclude_none=True)`, temp: keys of its state delta removed, as ADK stores it). The
  session's state is the initial state updated by each event's session-scoped delta, in
  order; its last update time is its last event's timestamp, or its creation time.
- `adk/<app>/<user>`: the user's state (`user:` keys, shared by the user's sessions), and
  `adk/<app>`: the app's state (`app:` keys, shared by all its sessions), each a record
  `{"k":"state","state":{...}}` per change holding the whole state after it (a read takes
  the last record). Keys are stored without their prefix, as ADK's services keep them.

An append_event that changes app or user state moves the session's thread and those
threads in one compare-and-swap transaction (agentcas/record_threads.py); a writer that
lost the race rebuilds, so concurrent appends from several processes all land. Answers
follow InMemorySessionService's: the same errors, the same GetSessionConfig filters, the
same merged state, an equal re-delivered event not stored twice, partial events not stored.

fork_session is `agentcas fork` at the record of an event: the new session shares its
source's records up to and including that event (nothing copied) and its state is what
they produce, the source's initial state included; the source never changes. ADK's rewind
(an appended event carrying `rewind_before_invocation_id`) works on either as on ADK's
own services. Each service keeps, per session thread, the records it decoded, extended
by the new ones when the thread only grew.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import Any

from google.adk.errors.already_exists_error import AlreadyExistsError
from google.adk.errors.not_found_error import NotFoundError
from google.adk.errors.session_not_found_error import SessionNotFoundError
from google.adk.events.event import Event
from google.adk.platform import time as platform_time
from google.adk.platform import uuid as platform_uuid
from google.adk.sessions import _session_util
from google.adk.sessions.base_session_service import BaseSessionService, GetSessionConfig, ListSessionsResponse
from google.adk.sessions.session import Session
from google.adk.sessions.state import State

from agentcas.cas.objects import HistoryPosition
from agentcas.errors import ConflictError
from agentcas.record_threads import Append, Checkpoint, Delete, RecordStore, in_thread, to_completion
from agentcas.refs.names import id_component, id_of_component

ROOT = "adk"


def app_thread(app_name: str) -> str:
    """The thread of an app's state."""
    return f"{ROOT}/{id_component(app_name)}"


def user_thread(app_name: str, user_id: str) -> str:
    """The thread of a user's state in an app."""
    return f"{app_thread(app_name)}/{id_component(user_id)}"


def session_thread(app_name: str, user_id: str, session_id: str) -> str:
    """The thread of a session."""
    return f"{user_thread(app_name, user_id)}/{id_component(session_id)}"


def _jsonl(record: dict) -> bytes:
    return json.dumps(record, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8") + b"\n"


def _is_session_key(key: str) -> bool:
    return not key.startswith((State.APP_PREFIX, State.USER_PREFIX, State.TEMP_PREFIX))


@dataclass
class _Stored:
    """A session thread's records, decoded and folded (what a service caches per thread)."""

    history: HistoryPosition
    created: float
    state: dict = field(default_factory=dict)     # session-scoped state after the events
    events: list = field(default_factory=list)    # event JSON documents
    last_update_time: float = 0.0
    event_seqs: list = field(default_factory=list)  # the history seq of each event's record

    def add(self, record: dict, seq: int) -> None:
        kind = record.get("k")
        if kind == "session":
            self.created = self.last_update_time = record["time"]
            self.state = dict(record["state"])
            return
        if kind != "event":
            return  # a record of another kind (appended by hand): not part of the session
        event = record["event"]
        self.events.append(event)
        self.event_seqs.append(seq)
        self.last_update_time = event["timestamp"]
        for key, value in (event.get("actions") or {}).get("state_delta", {}).items():
            if _is_session_key(key):
                self.state[key] = value


class AgentcasSessionService(BaseSessionService):
    """ADK sessions kept as agentcas threads: persistent, shared by processes, forkable."""

    def __init__(self, store, *, refs: str | None = None):
        """`store`: a Store, or a store path or s3:// URL (created if absent; a shared store
        needs `refs`, its postgresql:// URL)."""
        self._records = RecordStore(store, refs)
        self._cache: dict[str, _Stored] = {}
        self._cache_lock = threading.Lock()

    def close(self) -> None:
        """Close the store if this service opened it from a path."""
        self._records.close()

    # -- BaseSessionService -------------------------------------------------------------------
    async def create_session(self, *, app_name: str, user_id: str, state: dict[str, Any] | None = None,
                             session_id: str | None = None) -> Session:
        session_id = session_id.strip() if session_id else None
        session_id = session_id or platform_uuid.new_uuid()
        deltas = _session_util.extract_json_safe_state_delta(state or {})
        now = platform_time.get_time()
        thread = session_thread(app_name, user_id, session_id)
        created = _jsonl({"k": "session", "state": deltas["session"], "time": now})

        def build(snapshot):
            if snapshot.state(thread) is not None:
                raise AlreadyExistsError(f"Session with id {session_id} already exists.")
            edits = [Append(thread, created, "create session")]
            edits += self._scoped_edits(snapshot, app_name, user_id, deltas)
            return edits, None

        await to_completion(self._records.change, f"create {thread}", build)
        return await in_thread(self._session, app_name, user_id, session_id, None)

    async def get_session(self, *, app_name: str, user_id: str, session_id: str,
                          config: GetSessionConfig | None = None) -> Session | None:
        session_id = session_id.strip() if session_id else session_id
        return await in_thread(self._session, app_name, user_id, session_id, config)

    async def list_sessions(self, *, app_name: str, user_id: str | None = None) -> ListSessionsResponse:
        return await in_thread(self._list, app_name, user_id)

    async def delete_session(self, *, app_name: str, user_id: str, session_id: str) -> None:
        session_id = session_id.strip() if session_id else session_id
        thread = session_thread(app_name, user_id, session_id)

        def build(snapshot):
            return ([Delete(thread)] if snapshot.state(thread) is not None else []), None

        await to_completion(self._records.change, f"delete {thread}", build)

    async def get_user_state(self, *, app_name: str, user_id: str) -> dict[str, Any]:
        return await in_thread(self._scoped_state, user_thread(app_name, user_id))

    async def append_event(self, session: Session, event: Event) -> Event:
        """Store `event` (not a partial one) and apply it to `session`, as InMemorySessionService does."""
        if event.partial:
            return event
        thread = session_thread(session.app_name, session.user_id, session.id)
        document = event.model_dump(mode="json", exclude_none=True)
        delta = (document.get("actions") or {}).get("state_delta")
        if delta:
            document["actions"]["state_delta"] = {k: v for k, v in delta.items()
                                                  if not k.startswith(State.TEMP_PREFIX)}
        record = _jsonl({"k": "event", "event": document})
        deltas = _session_util.extract_state_delta(document["actions"]["state_delta"]) if delta else None

        def build(snapshot):
            state = snapshot.state(thread)
            if state is None:
                raise SessionNotFoundError(f"Session {session.id} not found.")
            stored = self._stored(thread, state.history)
            # An equal re-delivery (same id, equal fields) is not stored twice.
            if any(e.get("id") == event.id and Event.model_validate(e) == event for e in stored.events):
                return [], False
            edits = [Append(thread, record, f"event {event.id} by {event.author}"[:200])]
            if deltas:
                edits += self._scoped_edits(snapshot, session.app_name, session.user_id, deltas)
            return edits, True

        if await to_completion(self._records.change, f"append to {thread}", build):
            await super().append_event(session=session, event=event)
            session.last_update_time = event.timestamp
        return event

    # -- forks -------------------------------------------------------------------------------
    async def fork_session(self, app_name: str, user_id: str, session_id: str,
                           new_session_id: str | None = None, at_event_id: str | None = None) -> Session:
        """A new session holding the events of `session_id` up to and including `at_event_id`
        (all by default) and the state they produce; the source never changes.

        One ref move (`agentcas fork`), nothing copied; `agentcas lineage` shows the new
        session under its source. App and user state are shared, as by any two sessions of
        one user. Raises SessionNotFoundError (no source), NotFoundError (no such event in
        it), AlreadyExistsError (the new id is taken).
        """
        return await to_completion(self._fork, app_name, user_id, session_id.strip(),
                                   (new_session_id or "").strip() or platform_uuid.new_uuid(), at_event_id)

    async def checkpoint_session(self, app_name: str, user_id: str, session_id: str,
                                 reason: str = "session checkpoint") -> str:
        """Make an agentcas checkpoint of the session as it is (an empty tree and its records),
        for `agentcas export` and `sign`, which name a checkpoint; its id (hex). Raises
        SessionNotFoundError, or agentcas's UsageError for a bad reason (1..512 characters)."""
        thread = session_thread(app_name, user_id, session_id.strip())
        checkpoint = Checkpoint(thread, reason)

        def build(snapshot):
            if snapshot.state(thread) is None:
                raise SessionNotFoundError(f"Session {session_id} not found.")
            return [checkpoint], None

        await to_completion(self._records.change, f"checkpoint {thread}", build)
        return checkpoint.made[0].hex()

    def _fork(self, app_name, user_id, session_id, new_session_id, at_event_id) -> Session:
        source = session_thread(app_name, user_id, session_id)
        target = session_thread(app_name, user_id, new_session_id)
        state = self._records.state(source)
        if state is None:
            raise SessionNotFoundError(f"Session {session_id} not found.")
        at = None
        if at_event_id is not None:
            stored = self._stored(source, state.history)
            index = next((i for i, e in enumerate(stored.events) if e.get("id") == at_event_id), None)
            if index is None:
                raise NotFoundError(f"Event {at_event_id} not found in session {session_id}.")
            at = stored.event_seqs[index] + 1  # the records up to and including that event's
        if self._records.state(target) is not None:
            raise AlreadyExistsError(f"Session with id {new_session_id} already exists.")
        try:
            self._records.fork(source, target, at)
        except ConflictError:
            raise AlreadyExistsError(f"Session with id {new_session_id} already exists.") from None
        forked = self._session(app_name, user_id, new_session_id, None)
        assert forked is not None  # the fork just landed
        return forked

    # -- store work (worker threads) ---------------------------------------------------------
    def _stored(self, thread: str, history: HistoryPosition) -> _Stored:
        """The thread's records at `history`, decoded: from the cache, extended by the records
        added since when the thread only grew, else read whole."""
        with self._cache_lock:
            cached = self._cache.get(thread)
        if cached is not None and cached.history == history:
            return cached
        if cached is not None and cached.history.seq < history.seq \
                and self._records.extends(history, cached.history):
            stored = _Stored(history, cached.created, dict(cached.state), list(cached.events),
                             cached.last_update_time, list(cached.event_seqs))
            start = cached.history.seq
        else:
            stored, start = _Stored(history, 0.0), 0
        for seq, line in enumerate(self._records.lines(history, start, history.seq), start):
            stored.add(json.loads(line), seq)
        with self._cache_lock:
            self._cache[thread] = stored
        return stored

    def _scoped_state(self, thread: str) -> dict:
        state = self._records.state(thread)
        if state is None or state.history.seq == 0:
            return {}
        seq = state.history.seq
        return json.loads(self._records.lines(state.history, seq - 1, seq)[0])["state"]

    def _scoped_edits(self, snapshot, app_name: str, user_id: str, deltas: dict) -> list:
        """Appends of the app's and the user's whole new state, for those of `deltas` not empty."""
        edits = []
        for scope, thread in (("app", app_thread(app_name)), ("user", user_thread(app_name, user_id))):
            if deltas[scope]:
                count = snapshot.count(thread)
                current = json.loads(snapshot.lines(thread, count - 1, count)[0])["state"] if count else {}
                current.update(deltas[scope])
                edits.append(Append(thread, _jsonl({"k": "state", "state": current}), f"{scope} state"))
        return edits

    def _merged_state(self, app_name: str, user_id: str, session_state: dict) -> dict:
        state = dict(session_state)
        for key, value in self._scoped_state(app_thread(app_name)).items():
            state[State.APP_PREFIX + key] = value
        for key, value in self._scoped_state(user_thread(app_name, user_id)).items():
            state[State.USER_PREFIX + key] = value
        return state

    def _session(self, app_name: str, user_id: str, session_id: str,
                 config: GetSessionConfig | None) -> Session | None:
        thread = session_thread(app_name, user_id, session_id)
        state = self._records.state(thread)
        if state is None:
            return None
        stored = self._stored(thread, state.history)
        events = stored.events
        if config:
            if config.num_recent_events is not None:
                events = [] if config.num_recent_events == 0 else events[-config.num_recent_events:]
            if config.after_timestamp is not None:  # from the newest event older than it, as ADK's own
                i = len(events) - 1
                while i >= 0 and events[i]["timestamp"] >= config.after_timestamp:
                    i -= 1
                if i >= 0:
                    events = events[i + 1:]
        return Session(app_name=app_name, user_id=user_id, id=session_id,
                       state=self._merged_state(app_name, user_id, stored.state),
                       events=[Event.model_validate(e) for e in events],
                       last_update_time=stored.last_update_time)

    def _list(self, app_name: str, user_id: str | None) -> ListSessionsResponse:
        prefix = app_thread(app_name) if user_id is None else user_thread(app_name, user_id)
        sessions = []
        for name, state in self._records.states(prefix).items():
            parts = name.split("/")
            if len(parts) != 4:
                continue  # the app's or a user's state
            uid, sid = id_of_component(parts[2]), id_of_component(parts[3])
            stored = self._stored(name, state.history)
            sessions.append(Session(app_name=app_name, user_id=uid, id=sid,
                                    state=self._merged_state(app_name, uid, stored.state),
                                    events=[], last_update_time=stored.last_update_time))
        sessions.sort(key=lambda s: (s.last_update_time, s.user_id, s.id))
        return ListSessionsResponse(sessions=sessions)
