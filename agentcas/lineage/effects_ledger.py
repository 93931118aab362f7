"""The effects ledger: effect records appended to histories, read back through the index.

Writing (`add`): a new effect (kind, target, rollback, ...) or a new state of an existing
one (`--id` and `--state` only) is one record appended to the thread's history
(lineage/appends.py). With an id, the append is conditional: the effect was looked up
in the index at the history read first, and the append lands only if, since then, no
record of that effect landed and the history was only appended to (`_guard`); records of
other effects landing meanwhile are fine, the append re-plans after them.

Reading (`page`, `open_after`): the index (effects_index.py) is synced to the history
asked for, then answers a page of effects with their latest states, newest activity
first, and the totals, without re-reading the history.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from agentcas import testing_hooks
from agentcas.cas.backends import Backends
from agentcas.cas.objects import EMPTY_POSITION, HistoryPosition
from agentcas.cas.store_format import utc_now
from agentcas.errors import ConflictError, NotFound, UsageError
from agentcas.lineage import effects, rollout
from agentcas.lineage.appends import append_records
from agentcas.lineage.effects_index import INDEX_FILE, EffectsIndex, EffectState, HistorySource
from agentcas.refs import revisions, threads
from agentcas.refs.names import check_thread_name, is_thread_name
from agentcas.refs.threads import ThreadState
from agentcas.result import Result


@dataclass(frozen=True)
class EffectAdded(Result):
    """An effect record appended: a new effect or a new state of one."""

    thread: str
    id: str
    state: str
    new: bool
    seq: int
    record: dict
    history: HistoryPosition


@dataclass(frozen=True)
class EffectsPage(Result):
    """A page of the effects in a revision's history, newest activity first, and totals."""

    rev: str | None
    history_seq: int
    since_seq: int
    states: list[str] | None
    totals: dict | None
    effects: list[EffectState]
    returned_count: int
    has_more: bool
    next_cursor: int | None
    note: str


@dataclass(frozen=True)
class OpenEffects(Result):
    """Pending and unknown effects recorded after a revert's or checkout's target."""

    since_seq: int
    history_seq: int
    count: int
    effects: list[EffectState]
    has_more: bool
    note: str


class EffectsLedger:
    """The effects of one store's histories: append records, read pages through the index."""

    def __init__(self, backends: Backends, segments: rollout.SegmentCache, index_dir: str | None):
        self.backends = backends
        self.segments = segments
        self.index_dir = index_dir
        self._index: EffectsIndex | None = None

    # -- writing ---------------------------------------------------------------------------------
    def add(self, thread: str, state: str, kind: str | None = None, target: str | None = None,
            rollback: str | None = None, provider: str | None = None, operation: str | None = None,
            effect_id: str | None = None) -> EffectAdded:
        """Append an effect record to THREAD's history: a new effect, or (id and state only) a new state."""
        check_thread_name(thread)
        effects.check_state(state)
        change = effect_id is not None and all(v is None for v in (kind, target, rollback, provider, operation))
        if effect_id is not None:
            effects.check_id(effect_id)
        existing = None
        with self.backends.meta.reader() as txn:
            looked_up = threads.read_thread(txn, thread)
        read_at = EMPTY_POSITION if looked_up is None else looked_up.history
        if looked_up is not None and effect_id is not None:
            line = self._line(read_at, thread, True)
            existing = self.index().lookup(line, read_at.seq, effect_id)
        testing_hooks.reached("effect.after_lookup")
        if change:
            if existing is None:
                raise NotFound(f"no effect {effect_id!r} in the history of thread {thread!r}; "
                               "nothing was written")
            assert effect_id is not None  # `change` means an --id was given
            record = effects.state_change(effect_id, state, utc_now())
        else:
            missing = [f"--{n}" for n, v in (("kind", kind), ("target", target), ("rollback", rollback))
                       if v is None]
            if missing:
                raise effects.BadEffect(f"a new effect needs {', '.join(missing)} (to record a new state "
                                        "of an existing effect give only --id and --state); nothing was written")
            if existing is not None:
                raise ConflictError(f"effect {effect_id!r} already exists in thread {thread!r} (to record a "
                                    "new state give only --id and --state); nothing was written")
            assert kind is not None and target is not None and rollback is not None  # checked above
            record = effects.new_effect(effect_id or effects.new_effect_id(), kind, target, state, rollback,
                                        provider, operation, utc_now())
        guard = None if effect_id is None else self._guard(thread, effect_id, read_at)
        appended = append_records(self.backends, thread, record.to_line(), guard)
        return EffectAdded(thread, record.id, record.state, record.is_new, appended.first_seq,
                           record.to_record(), appended.history)

    def _guard(self, thread: str, effect_id: str, read_at: HistoryPosition) -> Callable[[ThreadState | None], None]:
        """The compare of `effect add --id` (see the module doc): ConflictError (exit 3),
        nothing written, if the history moved away or the effect got a state since `read_at`."""
        def guard(state: ThreadState | None) -> None:
            current = EMPTY_POSITION if state is None else state.history
            if current == read_at:
                return
            history = self._history()
            if current.seq < read_at.seq or (
                    read_at.seq and history.position(current, read_at.seq).digest != read_at.digest):
                raise ConflictError(f"thread {thread!r} was moved to another history (a revert?) after effect "
                                    f"{effect_id!r} was read; nothing was written: read its state again "
                                    "(agentcas effects) and retry")
            seq, data = read_at.seq, b"".join(self._read(current, read_at.seq))
            for start, end in rollout.split_lines(data):
                record = effects.parse_record(data[start:end])
                if record is not None and record.id == effect_id:
                    raise ConflictError(f"effect {effect_id!r} got state {record.state!r} (record {seq}) after "
                                        "it was read; nothing was written: read its state again "
                                        "(agentcas effects) and retry")
                seq += 1
        return guard

    # -- reading ---------------------------------------------------------------------------------
    def list(self, rev: str, since: str | None = None, states: Iterable[str] | None = None, limit: int | None = None,
             before: int | None = None, totals: bool = True) -> EffectsPage:
        """The effects in REV's history with their latest states, newest activity first, and totals.

        `since`: only effects with a record after the point where since's history and REV's
        part (or since's end). `states`: only effects whose latest state is one of these.
        `before`: resume a page (the `next_cursor` of the previous one). `totals=False` skips
        the totals (None): with `since` they cost the window's state changes of older effects,
        and a pager needs them once.
        """
        states = effects.check_states(states) if states else None
        if limit is not None and limit < 1:
            raise UsageError(f"limit must be at least 1: {limit}")
        if before is not None and before < 0:
            raise UsageError(f"cursor must not be negative: {before}")
        head, line_name, is_thread = self._source(rev)
        since_seq = 0
        if since is not None:
            since_head, _, _ = self._source(since)
            since_seq = rollout.common_prefix(self._history(), head, since_head)
        return self.page(head, line_name, is_thread, since_seq, states, limit, before, rev=rev, totals=totals)

    def page(self, head: HistoryPosition, line_name: str, is_thread: bool, since_seq: int,
             states: Iterable[str] | None,
             limit: int | None, before: int | None, rev: str | None = None, totals: bool = True) -> EffectsPage:
        """A page of the effects in the history `head` (index line `line_name`) after `since_seq`."""
        index = self.index()
        line = self._line(head, line_name, is_thread)
        items, more = index.page(line, head.seq, since_seq, states, before,
                                 limit if limit is not None else max(head.seq, 1))
        return EffectsPage(rev, head.seq, since_seq, list(states) if states else None,
                           index.totals(line, head.seq, since_seq) if totals else None,
                           items, len(items), more, items[-1].state_seq if more else None,
                           effects.NOT_UNDONE_NOTE)

    def open_after(self, head: HistoryPosition, line_name: str, is_thread: bool,
                   target: HistoryPosition, limit: int = 100) -> OpenEffects:
        """Pending and unknown effects recorded in `head`'s history after `target` (a revert's or
        checkout's target): what moving to `target` does not undo."""
        since = rollout.common_prefix(self._history(), head, target)
        page = self.page(head, line_name, is_thread, since, effects.OPEN_STATES, limit, None)
        assert page.totals is not None  # a page counts its totals unless told not to
        counts = page.totals["by_state"]
        return OpenEffects(since, head.seq, sum(counts.get(s, 0) for s in effects.OPEN_STATES),
                           page.effects, page.has_more, page.note)

    def after_checkpoint(self, rev: str) -> OpenEffects | None:
        """Open effects recorded after checkpoint `rev` on its thread's current head, or None."""
        with self.backends.meta.reader() as txn:
            digest = revisions.resolve(txn, self.backends.source, rev)
            cp = revisions.load_checkpoint(self.backends.source, digest)
            name = revisions.named_thread(txn, rev) or cp.thread
            state = threads.read_thread(txn, name) if is_thread_name(name) else None
        if state is None:
            return None
        return self.open_after(state.history, name, True, cp.history)

    def index(self) -> EffectsIndex:
        """The store's effects index (an SQLite cache beside the data; in memory for memory://)."""
        if self._index is None:
            try:
                self._index = EffectsIndex(os.path.join(self.index_dir, INDEX_FILE) if self.index_dir else None)
            except sqlite3.Error:  # a read-only store directory: index in memory, for this process
                self._index = EffectsIndex(None)
        return self._index

    def _source(self, rev: str) -> tuple[HistoryPosition, str, bool]:
        """(history, index line name, whether it is a thread's head) that `rev` names."""
        with self.backends.meta.reader() as txn:
            try:
                head, _, thread = revisions.source_state(txn, self.backends.source, rev)
            except NotFound:
                raise NotFound(f"no thread or checkpoint named {rev!r}") from None
            is_thread = revisions.named_thread(txn, rev) is not None
        return head, thread, is_thread

    def _line(self, head: HistoryPosition, line_name: str, is_thread: bool) -> int:
        history = self._history()
        source = HistorySource(history.position, lambda at, start: self._read(at, start),
                               lambda a, b: rollout.common_prefix(self._history(), a, b))
        return self.index().sync(line_name, head, source, may_truncate=is_thread)

    def _history(self) -> rollout.History:
        return rollout.History(self.backends.source, self.segments)

    def _read(self, head: HistoryPosition, start: int) -> Iterator[bytes]:
        with self.backends.source.reading(buffers=True) as objects:
            yield from rollout.History(objects, self.segments).read(head, start, None, True)
