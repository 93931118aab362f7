"""Thread refs: `threads/NAME` -> (checkpoint, history head, fork origin), with a reflog.

A thread's state names its newest checkpoint and the head of its rollout history.
Every change goes through `set_if_equals` inside one metadata transaction: it locks
the ref row, compares the state it holds with the expected one, and moves it with
the store's `compare_and_set` (PostgreSQL: `UPDATE ... WHERE value = old`, the row
count decides; LMDB: writers are serialised), so of two racing moves exactly one
wins. Each move appends a reflog entry (old and new state, action, message, time);
entries are numbered upward per thread and listed newest first, so THREAD@{0} is the
current state and THREAD@{1} the one before the last move.
"""

from __future__ import annotations

import struct
import time
from dataclasses import dataclass

from agentcas.cas import encoding
from agentcas.cas.digest import Digest
from agentcas.cas.objects import EMPTY_POSITION, HistoryPosition, InvalidObject
from agentcas.cas.sealed import seal, unseal
from agentcas.cas.metastore.base import MetaTxn as Txn
from agentcas.errors import IntegrityError
from agentcas.refs.names import check_thread_name

PREFIX = b"threads/"


@dataclass(frozen=True)
class ForkOrigin:
    """Where a thread was forked from: the parent thread's name, checkpoint and seq."""

    thread: str
    checkpoint: Digest | None
    seq: int

    def to_doc(self):
        return {"thread": self.thread, "seq": self.seq,
                "checkpoint": None if self.checkpoint is None else self.checkpoint.hex()}

    @classmethod
    def from_doc(cls, doc):
        if doc is None:
            return None
        return cls(doc["thread"], None if doc["checkpoint"] is None else Digest.parse(doc["checkpoint"]),
                   doc["seq"])


@dataclass(frozen=True)
class ThreadState:
    checkpoint: Digest | None
    history: HistoryPosition = EMPTY_POSITION
    forked_from: ForkOrigin | None = None

    def to_doc(self):
        return {"checkpoint": None if self.checkpoint is None else self.checkpoint.hex(),
                "history": self.history.to_doc(),
                "forked_from": None if self.forked_from is None else self.forked_from.to_doc()}

    @classmethod
    def from_doc(cls, doc) -> "ThreadState":
        return cls(None if doc["checkpoint"] is None else Digest.parse(doc["checkpoint"]),
                   HistoryPosition.from_doc(doc["history"]), ForkOrigin.from_doc(doc["forked_from"]))


@dataclass(frozen=True)
class ReflogEntry:
    """One move: the checkpoint it left (`old`), the state it set (`new`), why and when.

    Only the old checkpoint id is kept, not the whole old state: the state before
    entry N is entry N-1's `new`, so storing it again would double the reflog.
    """

    number: int
    old: Digest | None
    new: ThreadState
    action: str
    message: str
    time: float

    def to_json(self):
        return {"number": self.number, "old": None if self.old is None else self.old.hex(),
                "new": self.new.to_doc(), "action": self.action, "message": self.message,
                "time": self.time}


def _key(name: str) -> bytes:
    return PREFIX + name.encode("utf-8")


def _decode_state(key: bytes, value) -> ThreadState:
    payload = unseal("refs", key, value)
    try:
        return ThreadState.from_doc(encoding.decode(payload))
    except (InvalidObject, KeyError, TypeError, Exception) as exc:  # noqa: BLE001 - any shape error
        if isinstance(exc, IntegrityError):
            raise
        raise IntegrityError(f"ref {key.decode('utf-8', 'replace')} is malformed: {exc}") from None


def read_thread(txn: Txn, name: str) -> ThreadState | None:
    value = txn.get("refs", _key(name))
    return None if value is None else _decode_state(_key(name), value)


def list_threads(txn: Txn) -> list[tuple[str, ThreadState]]:
    return [(key[len(PREFIX):].decode("utf-8"), _decode_state(bytes(key), value))
            for key, value in txn.scan("refs", PREFIX)]


_MISSING = object()


def set_if_equals(txn: Txn, name: str, old, new: ThreadState | None, action: str,
                  message: str = "") -> bool:
    """Move thread `name` from `old` to `new` if it is still at `old`; log the move.

    `old=None` means the thread must not exist; `new=None` deletes it (and its
    reflog, as git does: a deleted thread's history is kept only by the forks that
    share it). Returns False, changing nothing, when the thread is not at `old`.
    """
    check_thread_name(name)
    key = _key(name)
    raw = txn.get("refs", key, for_update=True)
    current = None if raw is None else _decode_state(key, raw)
    if current != old:
        return False
    value = None if new is None else seal("refs", key, encoding.encode(new.to_doc()))
    if not txn.compare_and_set("refs", key, None if raw is None else bytes(raw), value):
        return False
    bump_generation(txn)
    if new is None:
        for log_key, _ in list(txn.scan("reflog", key + b"\0")):
            txn.delete("reflog", log_key)
        return True
    _append_reflog(txn, name, old, new, action, message)
    return True


GENERATION_KEY = b"ref_generation"


def bump_generation(txn: Txn) -> None:
    """Count ref moves, so gc can tell whether any ref moved since it marked."""
    txn.get("meta", GENERATION_KEY, for_update=True)  # serialise the increment
    payload = struct.pack(">Q", ref_generation(txn) + 1)
    txn.put("meta", GENERATION_KEY, seal("meta", GENERATION_KEY, payload))


def ref_generation(txn: Txn) -> int:
    """How many ref moves the store has seen (0 for a new store)."""
    value = txn.get("meta", GENERATION_KEY)
    return 0 if value is None else struct.unpack(">Q", unseal("meta", GENERATION_KEY, value))[0]


def _append_reflog(txn: Txn, name: str, old, new, action: str, message: str) -> None:
    prefix = _key(name) + b"\0"
    last = next(txn.scan("reflog", prefix, reverse=True), None)
    number = 0 if last is None else struct.unpack(">Q", last[0][len(prefix):])[0] + 1
    old_checkpoint = None if old is None or old.checkpoint is None else old.checkpoint.hex()
    doc = {"old": old_checkpoint, "new": new.to_doc(), "action": action,
           "message": message, "time": int(time.time() * 1e6)}
    key = prefix + struct.pack(">Q", number)
    txn.put("reflog", key, seal("reflog", key, encoding.encode(doc)))


def read_reflog(txn: Txn, name: str, limit: int | None = None) -> list[ReflogEntry]:
    """Reflog entries of `name`, newest first."""
    prefix = _key(name) + b"\0"
    entries = []
    for key, value in txn.scan("reflog", prefix, reverse=True):
        entries.append(decode_reflog_entry(bytes(key), value, prefix))
        if limit is not None and len(entries) >= limit:
            break
    return entries


def decode_reflog_entry(key: bytes, value, prefix: bytes | None = None) -> ReflogEntry:
    payload = unseal("reflog", key, value)
    doc = encoding.decode(payload)
    if prefix is None:
        prefix = key[: key.index(b"\0") + 1]
    number = struct.unpack(">Q", key[len(prefix):])[0]
    old = None if doc["old"] is None else Digest.parse(doc["old"])
    return ReflogEntry(number, old, ThreadState.from_doc(doc["new"]), doc["action"], doc["message"],
                       doc["time"] / 1e6)


def all_reflog_entries(txn: Txn):
    """(thread name, entry) for every reflog entry in the store, streamed."""
    for key, value in txn.scan("reflog"):
        key = bytes(key)
        name = key[len(PREFIX): key.index(b"\0")].decode("utf-8")
        yield name, decode_reflog_entry(key, value)
