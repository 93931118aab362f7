"""The effects index: a side index over effect records, so a page never re-reads history.

The index is a cache, derivable at any time from the histories (effects.py): an SQLite
file `effects-index.sqlite` beside the store's data (in memory for a memory store).
It holds *lines*: a line is one linear history prefix, named after the thread it
follows, with the HistoryPosition it has indexed up to. For each line it keeps
  - effects(id, first_seq, kind, target, rollback, provider, operation, created_at),
  - states(seq, id, state, at, next_seq): every effect record, next_seq pointing to the
    next record of the same effect (NULL while it is the latest),
  - totals(seq, doc): running totals (by state, rollback class, provider) after each
    effect record, so the totals of any prefix are one indexed lookup.

Sync (before every read, in one SQLite write transaction): if the line's position is a
prefix of the head asked for (checked by prefix digest, O(log n) segment loads), only
the new records are read and indexed; if the head is a prefix of the line, nothing is
read (queries take seq < head.seq); if they diverged (a revert, a fork, a rewrite),
the rows past their common prefix are dropped and the head's tail is indexed. A line
that cannot be checked against the store (its segments gc'd) is rebuilt from zero.
Queries then read only rows with seq below the head: "the latest state as of S" is the
record with seq < S whose next_seq is NULL or >= S.

Pages are newest activity first (by the seq of an effect's latest record) and resume
from a seq cursor, so the last page costs what the first does: an index range scan,
never a walk from the head. Totals are running-totals lookups; with --since, two of them
plus the state changes inside the window of effects declared before it (see totals()).
"""

from __future__ import annotations

import functools
import json
import sqlite3
import threading
from dataclasses import dataclass
from typing import Callable, Iterable

from agentcas.cas.objects import EMPTY_POSITION, HistoryPosition
from agentcas.errors import IntegrityError
from agentcas.lineage.effects import parse_record
from agentcas.result import Result

INDEX_FILE = "effects-index.sqlite"
SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS lines (id INTEGER PRIMARY KEY, name TEXT UNIQUE NOT NULL, position TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS effects (line INTEGER NOT NULL, id TEXT NOT NULL, first_seq INTEGER NOT NULL,
    kind TEXT, target TEXT, rollback TEXT, provider TEXT, operation TEXT, created_at TEXT,
    PRIMARY KEY (line, id));
CREATE TABLE IF NOT EXISTS states (line INTEGER NOT NULL, seq INTEGER NOT NULL, id TEXT NOT NULL,
    state TEXT NOT NULL, at TEXT, next_seq INTEGER, PRIMARY KEY (line, seq));
CREATE INDEX IF NOT EXISTS states_by_id ON states (line, id, seq);
CREATE INDEX IF NOT EXISTS states_by_state ON states (line, state, seq);
CREATE INDEX IF NOT EXISTS states_by_next ON states (line, next_seq);
CREATE INDEX IF NOT EXISTS states_latest ON states (line, state, seq) WHERE next_seq IS NULL;
CREATE TABLE IF NOT EXISTS totals (line INTEGER NOT NULL, seq INTEGER NOT NULL, doc TEXT NOT NULL,
    PRIMARY KEY (line, seq));
"""


@dataclass
class HistorySource:
    """What the index needs from the store: positions and record bytes of a history."""

    position: Callable[[HistoryPosition, int], HistoryPosition]
    read: Callable[[HistoryPosition, int], Iterable[bytes]]  # (head, start) -> pieces of whole records
    common: Callable[[HistoryPosition, HistoryPosition], int]


@dataclass(frozen=True)
class EffectState(Result):
    """An effect with its latest state as of a history prefix (an item of `effects`)."""

    id: str
    state: str
    state_seq: int          # the seq of the record that set `state`
    updated_at: str | None
    first_seq: int          # the seq of the record that declared the effect
    kind: str | None
    target: str | None
    rollback: str | None
    provider: str | None
    operation: str | None
    created_at: str | None


def empty_totals() -> dict:
    return {"effects": 0, "by_state": {}, "by_rollback": {}, "by_provider": {}}


def _bump(table: dict, key: str, delta: int) -> None:
    value = table.get(key, 0) + delta
    if value:
        table[key] = value
    else:
        table.pop(key, None)


def _locked(method):
    """One SQLite connection is shared by a Store's threads: one call at a time."""
    @functools.wraps(method)
    def call(self, *args, **kwargs):
        with self.lock:
            return method(self, *args, **kwargs)
    return call


class EffectsIndex:
    """The SQLite effects index of one store (see the module docstring)."""

    def __init__(self, path: str | None):
        self.lock = threading.RLock()
        self.db = sqlite3.connect(path or ":memory:", timeout=60, isolation_level=None,
                                  check_same_thread=False)
        if path:
            self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.executescript(_SCHEMA)
        row = self.db.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
        if row is None:
            self.db.execute("INSERT OR IGNORE INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
        elif int(row[0]) != SCHEMA_VERSION:
            self._reset_all()

    def close(self) -> None:
        self.db.close()

    def _reset_all(self) -> None:
        for table in ("lines", "effects", "states", "totals"):
            self.db.execute(f"DELETE FROM {table}")
        self.db.execute("INSERT OR REPLACE INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))

    # -- sync ----------------------------------------------------------------------------------
    @_locked
    def sync(self, name: str, head: HistoryPosition, source: HistorySource, may_truncate: bool = True) -> int:
        """Bring line `name` up to `head`; the line id to query with upto=head.seq.

        With may_truncate=False (a checkpoint's prefix rather than a thread's head), a
        line that diverged from `head` is left alone and a line of its own, named by the
        prefix digest, is used instead.
        """
        self.db.execute("BEGIN IMMEDIATE")
        try:
            line = self._sync(name, head, source, may_truncate)
            self.db.execute("COMMIT")
            return line
        except BaseException:
            self.db.execute("ROLLBACK")
            raise

    def _sync(self, name, head, source, may_truncate) -> int:
        row = self.db.execute("SELECT id, position FROM lines WHERE name=?", (name,)).fetchone()
        if row is None:
            self.db.execute("INSERT INTO lines (name, position) VALUES (?, ?)",
                            (name, json.dumps(EMPTY_POSITION.to_doc())))
            line, at = self.db.execute("SELECT last_insert_rowid()").fetchone()[0], EMPTY_POSITION
        else:
            line, at = row[0], HistoryPosition.from_doc(json.loads(row[1]))
        if at == head:
            return line
        try:
            if at.seq <= head.seq and source.position(head, at.seq).digest == at.digest:
                self._extend(line, at.seq, head, source)
                return line
            if at.seq > head.seq and source.position(at, head.seq).digest == head.digest:
                return line  # head is a prefix of what is indexed: queries stop at head.seq
            keep = source.common(at, head)
        except IntegrityError:
            keep = 0  # the indexed history is gone from the store (gc): rebuild from zero
        if not may_truncate:
            return self._sync(f"@{head.digest.hex()}", head, source, True)
        self._truncate(line, keep)
        self._extend(line, keep, head, source)
        return line

    def _truncate(self, line: int, keep: int) -> None:
        """Drop every row of records at seq >= keep."""
        self.db.execute("DELETE FROM states WHERE line=? AND seq>=?", (line, keep))
        self.db.execute("DELETE FROM effects WHERE line=? AND first_seq>=?", (line, keep))
        self.db.execute("DELETE FROM totals WHERE line=? AND seq>=?", (line, keep))
        self.db.execute("UPDATE states SET next_seq=NULL WHERE line=? AND next_seq>=?", (line, keep))

    def _extend(self, line: int, start: int, head: HistoryPosition, source: HistorySource) -> None:
        """Index records start <= seq < head.seq (rows below start are already there)."""
        totals = self._totals_row(line, start)
        latest: dict[str, tuple[int, str]] = {}   # id -> (seq, state) of its latest record
        # Ids not seen in this batch are looked up in the rows below start, if there are any.
        self._rows_below = self.db.execute("SELECT 1 FROM states WHERE line=? LIMIT 1", (line,)).fetchone()
        effects, states, successors, running = [], [], [], []
        seq = start
        for piece in source.read(head, start):
            begin = 0
            while begin < len(piece):
                end = piece.index(b"\n", begin) + 1
                record = parse_record(piece[begin:end])
                begin = end
                if record is not None:
                    if self._apply(line, seq, record, totals, latest, effects, states, successors):
                        running.append((line, seq, json.dumps(totals, sort_keys=True)))
                seq += 1
        if seq != head.seq:
            raise IntegrityError(f"history read {seq - start} records, expected {head.seq - start}")
        db = self.db
        db.executemany("INSERT INTO effects VALUES (?,?,?,?,?,?,?,?,?)", effects)
        db.executemany("INSERT INTO states VALUES (?,?,?,?,?,NULL)", states)
        db.executemany("UPDATE states SET next_seq=? WHERE line=? AND seq=?", successors)
        db.executemany("INSERT INTO totals VALUES (?,?,?)", running)
        db.execute("UPDATE lines SET position=? WHERE id=?", (json.dumps(head.to_doc()), line))

    def _apply(self, line, seq, record, totals, latest, effects, states, successors) -> bool:
        """Add one effect record to the pending rows; False if it is not part of the ledger."""
        previous = latest.get(record.id)
        if previous is None and self._rows_below:
            row = self.db.execute("SELECT seq, state FROM states WHERE line=? AND id=? "
                                  "ORDER BY seq DESC LIMIT 1", (line, record.id)).fetchone()
            previous = None if row is None else (row[0], row[1])
        if previous is None:
            if not record.is_new:
                return False  # a state for an effect this history never declared
            effects.append((line, record.id, seq, record.kind, record.target, record.rollback,
                            record.provider, record.operation, record.at))
            totals["effects"] += 1
            _bump(totals["by_rollback"], record.rollback, 1)
            _bump(totals["by_provider"], record.provider or "", 1)
        else:
            successors.append((seq, line, previous[0]))
            _bump(totals["by_state"], previous[1], -1)
        _bump(totals["by_state"], record.state, 1)
        states.append((line, seq, record.id, record.state, record.at))
        latest[record.id] = (seq, record.state)
        return True

    # -- queries -------------------------------------------------------------------------------
    def _totals_row(self, line: int, upto: int) -> dict:
        row = self.db.execute("SELECT doc FROM totals WHERE line=? AND seq<? ORDER BY seq DESC LIMIT 1",
                              (line, upto)).fetchone()
        return empty_totals() if row is None else json.loads(row[0])

    @_locked
    def totals(self, line: int, upto: int, since: int = 0) -> dict:
        """Totals of the effects whose latest record (as of upto) is at seq >= since.

        With W those effects: T(W) = T(upto) - T(since) + T_since(O), where O are the
        effects declared before `since` and touched in the window, counted in their
        state as of `since`: exactly the records latest at `since` and superseded inside
        the window (seq < since <= next_seq < upto), found by the next_seq index. So
        the cost is the window's state changes of older effects, not its size.
        """
        out = self._totals_row(line, upto)
        if since <= 0:
            return out
        before = self._totals_row(line, since)
        out["effects"] -= before["effects"]
        for key in ("by_state", "by_rollback", "by_provider"):
            for name, count in before[key].items():
                _bump(out[key], name, -count)
        rows = self.db.execute(
            "SELECT s.state, e.rollback, e.provider, count(*) FROM states s JOIN effects e "
            "ON e.line=s.line AND e.id=s.id WHERE s.line=? AND s.next_seq>=? AND s.next_seq<? AND s.seq<? "
            "GROUP BY 1, 2, 3", (line, since, upto, since))
        for state, rollback, provider, count in rows:
            out["effects"] += count
            _bump(out["by_state"], state, count)
            _bump(out["by_rollback"], rollback, count)
            _bump(out["by_provider"], provider or "", count)
        return out

    @_locked
    def page(self, line: int, upto: int, since: int = 0, states: tuple[str, ...] | None = None,
             before: int | None = None, limit: int = 50) -> tuple[list[EffectState], bool]:
        """Effects newest activity first, latest record seq < before; (items, more)."""
        stop = upto if before is None else min(before, upto)
        at_head = self._position_seq(line) <= upto  # every row is below upto: latest = next_seq NULL
        latest = "s.next_seq IS NULL" if at_head else "(s.next_seq IS NULL OR s.next_seq>=:upto)"
        sql = ("SELECT s.seq, s.id, s.state, s.at, e.first_seq, e.kind, e.target, e.rollback, e.provider, "
               "e.operation, e.created_at FROM states s JOIN effects e ON e.line=s.line AND e.id=s.id "
               f"WHERE s.line=:line AND s.seq<:stop AND s.seq>=:since AND {latest} {{state}} "
               "ORDER BY s.seq DESC LIMIT :n")
        args = {"line": line, "stop": stop, "since": since, "upto": upto, "n": limit + 1}
        if states:
            rows = []
            for state in states:  # one ordered index scan per state, merged: no sort of all rows
                rows += self.db.execute(sql.format(state="AND s.state=:state"), dict(args, state=state))
            rows.sort(key=lambda r: -r[0])
            rows = rows[:limit + 1]
        else:
            rows = self.db.execute(sql.format(state=""), args).fetchall()
        items = [EffectState(r[1], r[2], r[0], r[3], r[4], r[5], r[6], r[7], r[8], r[9], r[10])
                 for r in rows[:limit]]
        return items, len(rows) > limit

    def _position_seq(self, line: int) -> int:
        row = self.db.execute("SELECT position FROM lines WHERE id=?", (line,)).fetchone()
        return json.loads(row[0])["seq"]

    @_locked
    def lookup(self, line: int, upto: int, effect_id: str) -> EffectState | None:
        """One effect with its latest state as of upto, or None if the prefix never declared it."""
        row = self.db.execute("SELECT first_seq, kind, target, rollback, provider, operation, created_at "
                              "FROM effects WHERE line=? AND id=? AND first_seq<?",
                              (line, effect_id, upto)).fetchone()
        if row is None:
            return None
        state = self.db.execute("SELECT seq, state, at FROM states WHERE line=? AND id=? AND seq<? "
                                "ORDER BY seq DESC LIMIT 1", (line, effect_id, upto)).fetchone()
        return EffectState(effect_id, state[1], state[0], state[2], row[0], row[1], row[2], row[3], row[4],
                           row[5], row[6])
