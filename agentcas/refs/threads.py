"""Thread refs: `threads/NAME` -> (checkpoint, history head, fork origin), with a reflog.

A thread's state names its newest checkpoint and the head of its rollout history.
Every change goes through `set_if_equals` inside one metadata transaction: it locks
the ref row, compares the state it holds with the expected one, and moves it with
the store's `compare_and_set` (PostgreSQL: `UPDATE ... WHERE value = old`, the row
count decides; LMDB: writers are serialised), so of two racing moves exactly one
wins. Each move appends a reflog entry (old and new state, action, message, time);
entries are numbered upward per thread and listed newest first, so THREAD@{0} is the
current state and THREAD@{1} the one before the last move.

Reflog rows are written in a compact binary form (docs/FORMAT.md 6.2, version 2): raw ids,
varints, and no copy of the history position when it is the new checkpoint's own (the
usual case after a commit), which is then read from the checkpoint: a reader that
needs it passes the object source (`objects=`); without one, such an entry's history is
left unresolved (`history_implied`), which is all gc needs, since the checkpoint it
keeps alive holds that history. Rows of version 1 (canonical JSON) are still read.
"""

from __future__ import annotations

import os
import struct
import time
from dataclasses import dataclass

from agentcas.cas import encoding, framing
from agentcas.cas.digest import EMPTY_HISTORY, Digest
from agentcas.cas.metastore.base import MetaTxn, Read
from agentcas.cas.objects import EMPTY_POSITION, Checkpoint, HistoryPosition, InvalidObject
from agentcas.cas.sealed import seal, unseal
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
    def from_doc(cls, doc) -> ThreadState:
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
    history_implied: bool = False  # new.history not resolved (read without an object source)

    def to_json(self):
        return {"number": self.number, "old": None if self.old is None else self.old.hex(),
                "new": self.new.to_doc(), "action": self.action, "message": self.message,
                "time": self.time}


def _key(name: str) -> bytes:
    return PREFIX + name.encode("utf-8")


# Ref rows decoded lately, by (key, exact row bytes): a writer reads the same few rows
# several times per move (a LangGraph put: ~5), each an unseal, a canonical-JSON check and
# a parse. A row's bytes verified once decode the same way again; a changed row is a new
# key here. A listing of every thread (lineage, the web view's pages, each a request in one
# long-lived process) decodes each row once too while the store has fewer threads than the
# bound (a row is ~0.3 ms to verify and parse: 1,000 threads were 300 ms a listing).
# Bounded: dropped whole at _DECODED_MAX rows (~1 KiB each).
_DECODED: dict[tuple[bytes, bytes], ThreadState] = {}
_DECODED_MAX = 16_384


def _decode_state(key: bytes, value) -> ThreadState:
    value = bytes(value)
    found = _DECODED.get((key, value))
    if found is not None:
        return found
    payload = unseal("refs", key, value)
    try:
        state = ThreadState.from_doc(encoding.decode(payload))
    except (InvalidObject, KeyError, TypeError, Exception) as exc:  # noqa: BLE001 - any shape error
        if isinstance(exc, IntegrityError):
            raise
        raise IntegrityError(f"ref {key.decode('utf-8', 'replace')} is malformed: {exc}") from None
    _remember(key, value, state)
    return state


def _remember(key: bytes, value: bytes, state: ThreadState) -> None:
    if len(_DECODED) >= _DECODED_MAX:
        _DECODED.clear()
    _DECODED[(bytes(key), value)] = state


def read_thread(txn: MetaTxn, name: str) -> ThreadState | None:
    value = txn.get("refs", _key(name))
    return None if value is None else _decode_state(_key(name), value)


def thread_names(txn: MetaTxn) -> set[str]:
    """The names of every thread: the ref rows' keys, none of them unsealed or decoded."""
    return {bytes(key)[len(PREFIX):].decode("utf-8") for key, _ in txn.scan("refs", PREFIX)}


def list_threads(txn: MetaTxn) -> list[tuple[str, ThreadState]]:
    return [(key[len(PREFIX):].decode("utf-8"), _decode_state(bytes(key), value))
            for key, value in txn.scan("refs", PREFIX)]


@dataclass(frozen=True)
class MoveBase:
    """A thread as a move finds it: its state, the ref row's exact bytes, and the number
    its next reflog entry takes. A move lands only if the row still holds those bytes
    and that entry is still free (the two `expect`s of `move_rows`)."""

    name: str
    state: ThreadState | None
    raw: bytes | None
    next_entry: int


def base_reads(name: str) -> list[Read]:
    """What `read_base` needs, as exchange reads (a lease can fetch them while it is taken)."""
    check_thread_name(name)
    return [Read("refs", _key(name)), Read("reflog", _key(name) + b"\0", last=True)]


def decode_base(name: str, values) -> MoveBase:
    """The MoveBase from the answers to `base_reads(name)`."""
    raw, last = values
    state = None if raw is None else _decode_state(_key(name), raw)
    prefix = _key(name) + b"\0"
    number = 0 if last is None else struct.unpack(">Q", last[0][len(prefix):])[0] + 1
    return MoveBase(name, state, raw, number)


def read_base(meta, name: str) -> MoveBase:
    """Read a thread for a move in one request (a metadata store's exchange)."""
    _, values = meta.exchange(reads=base_reads(name))
    return decode_base(name, values)


def move_rows(base: MoveBase, new: ThreadState, action: str, message: str = "",
              history_implied: bool = False) -> tuple[list, list]:
    """(expect, writes) of an exchange that moves `base.name` from `base` to `new`.

    The move lands only if the ref row still holds `base.raw` and the reflog entry
    `base.next_entry` is free; it writes the ref, that entry and a new generation token.
    `history_implied` as in `set_if_equals`. A deletion (new None) clears the reflog,
    which needs a transaction: use `set_if_equals`.
    """
    key = _key(base.name)
    log_key = key + b"\0" + struct.pack(">Q", base.next_entry)
    old_checkpoint = None if base.state is None else base.state.checkpoint
    payload = encode_reflog_payload(old_checkpoint, new, action, message, int(time.time() * 1e6),
                                    history_implied=history_implied and new.checkpoint is not None)
    expect = [("refs", key, base.raw), ("reflog", log_key, None)]
    row = seal("refs", key, encoding.encode(new.to_doc(), check=False))  # a state agentcas built
    _remember(key, row, new)  # the next move of this thread reads it back: no decode then
    writes = [("refs", key, row),
              ("reflog", log_key, seal("reflog", log_key, payload)),
              generation_row()]
    return expect, writes


def set_if_equals(txn: MetaTxn, name: str, old, new: ThreadState | None, action: str,
                  message: str = "", history_implied: bool = False) -> bool:
    """Move thread `name` from `old` to `new` if it is still at `old`; log the move.

    `history_implied=True` (a commit) says `new.history` is `new.checkpoint`'s own history,
    so the reflog row leaves it out (docs/FORMAT.md 6.2); the caller guarantees it.

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
    if new is None:
        if raw is None:
            return True  # already absent
        if not txn.compare_and_set("refs", key, bytes(raw), None):
            return False
        txn.put(*generation_row())
        for log_key, _ in list(txn.scan("reflog", key + b"\0")):
            txn.delete("reflog", log_key)
        return True
    last = next(txn.scan("reflog", key + b"\0", reverse=True), None)
    base = decode_base(name, [None if raw is None else bytes(raw), last])
    expect, writes = move_rows(base, new, action, message, history_implied)
    if not txn.compare_and_set("refs", key, expect[0][2], writes[0][2]):
        return False
    for table, row_key, value in writes[1:]:
        txn.put(table, row_key, value)
    return True


GENERATION_KEY = b"ref_generation"


def generation_row() -> tuple[str, bytes, bytes]:
    """The (table, key, value) every ref move writes: a fresh random token, so gc can
    tell whether any ref moved since it marked (a blind write: no read, no counter)."""
    return "meta", GENERATION_KEY, seal("meta", GENERATION_KEY, os.urandom(16))


def ref_generation(txn: MetaTxn) -> bytes:
    """The store's current generation token (stores of before December 2026 count moves
    in a u64 instead; gc only compares it for equality). Empty for a new store."""
    value = txn.get("meta", GENERATION_KEY)
    return b"" if value is None else unseal("meta", GENERATION_KEY, value)


# --- reflog rows, version 2 (docs/FORMAT.md 6.2) -----------------------------------------------

REFLOG_V2 = 2
_F_OLD, _F_CHECKPOINT, _F_FORK, _F_FORK_CHECKPOINT, _F_HISTORY_IMPLIED = 1, 2, 4, 8, 16
_KNOWN_FLAGS = 31


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _text(value: str) -> bytes:
    data = value.encode("utf-8")
    return _varint(len(data)) + data


def encode_reflog_payload(old: Digest | None, new: ThreadState, action: str, message: str,
                          time_us: int, history_implied: bool = False) -> bytes:
    """The version-2 bytes of one reflog entry (before sealing)."""
    fork = new.forked_from
    flags = ((_F_OLD if old is not None else 0) | (_F_CHECKPOINT if new.checkpoint is not None else 0)
             | (_F_FORK if fork is not None else 0)
             | (_F_FORK_CHECKPOINT if fork is not None and fork.checkpoint is not None else 0)
             | (_F_HISTORY_IMPLIED if history_implied else 0))
    if history_implied and new.checkpoint is None:
        raise ValueError("an implied history needs a checkpoint")
    parts = [bytes((REFLOG_V2, flags)), struct.pack(">Q", time_us)]
    if old is not None:
        parts.append(old.raw)
    if new.checkpoint is not None:
        parts.append(new.checkpoint.raw)
    if not history_implied:
        h = new.history
        parts.append(_varint(h.seq))
        if h.seq:
            assert h.segment is not None  # a non-empty history ends in a segment
            parts += [h.segment.raw, _varint(h.offset), h.digest.raw]
    if fork is not None:
        parts += [_text(fork.thread), _varint(fork.seq)]
        if fork.checkpoint is not None:
            parts.append(fork.checkpoint.raw)
    parts += [_text(action), _text(message)]
    return b"".join(parts)


class _Reader:
    """Cursor over a version-2 payload; any short read or bad value is an IntegrityError."""

    def __init__(self, data: bytes):
        self.data, self.at = data, 0

    def take(self, n: int) -> bytes:
        if self.at + n > len(self.data):
            raise IntegrityError("reflog entry is truncated")
        chunk = self.data[self.at:self.at + n]
        self.at += n
        return chunk

    def varint(self) -> int:
        shift = value = 0
        while True:
            byte = self.take(1)[0]
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                if byte == 0 and shift:
                    raise IntegrityError("reflog entry has a non-minimal varint")
                return value
            shift += 7
            if shift > 63:
                raise IntegrityError("reflog entry has an oversized varint")

    def digest(self) -> Digest:
        return Digest(self.take(32))

    def text(self) -> str:
        try:
            return self.take(self.varint()).decode("utf-8")
        except UnicodeDecodeError:
            raise IntegrityError("reflog entry text is not UTF-8") from None


def _checkpoint_history(objects, digest: Digest) -> HistoryPosition | None:
    data = objects.load(digest, framing.KIND_CHECKPOINT)
    return None if data is None else Checkpoint.decode(data).history


def _decode_v2(objects, payload: bytes):
    """(old, new state, action, message, time in µs, history implied) of a version-2 payload.

    An implied history is read from the checkpoint when `objects` (an ObjectSource) is
    given; otherwise it is left as EMPTY_POSITION and reported as implied.
    """
    r = _Reader(payload)
    version, flags = r.take(2)
    if version != REFLOG_V2 or flags & ~_KNOWN_FLAGS:
        raise IntegrityError(f"reflog entry of unknown version {version} (flags {flags}); upgrade agentcas")
    time_us = struct.unpack(">Q", r.take(8))[0]
    old = r.digest() if flags & _F_OLD else None
    checkpoint = r.digest() if flags & _F_CHECKPOINT else None
    implied = bool(flags & _F_HISTORY_IMPLIED)
    if implied:
        if checkpoint is None:
            raise IntegrityError("reflog entry implies the history of a checkpoint it does not name")
        history = EMPTY_POSITION if objects is None else _checkpoint_history(objects, checkpoint)
        if history is None:
            raise IntegrityError(f"reflog entry names checkpoint {checkpoint.hex()}, which is missing")
    else:
        seq = r.varint()
        if seq:
            history = HistoryPosition(r.digest(), seq, r.varint(), r.digest())
        else:
            history = HistoryPosition(None, 0, 0, EMPTY_HISTORY)
    fork = None
    if flags & _F_FORK:
        thread, seq = r.text(), r.varint()
        fork = ForkOrigin(thread, r.digest() if flags & _F_FORK_CHECKPOINT else None, seq)
    elif flags & _F_FORK_CHECKPOINT:
        raise IntegrityError("reflog entry has a fork checkpoint without a fork")
    action, message = r.text(), r.text()
    if r.at != len(payload):
        raise IntegrityError("reflog entry has bytes after its message")
    return old, ThreadState(checkpoint, history, fork), action, message, time_us, implied and objects is None


def read_reflog(txn: MetaTxn, name: str, limit: int | None = None, objects=None) -> list[ReflogEntry]:
    """Reflog entries of `name`, newest first (`objects` resolves implied histories)."""
    prefix = _key(name) + b"\0"
    entries = []
    for key, value in txn.scan("reflog", prefix, reverse=True):
        entries.append(decode_reflog_entry(bytes(key), value, prefix, objects))
        if limit is not None and len(entries) >= limit:
            break
    return entries


def decode_reflog_entry(key: bytes, value, prefix: bytes | None = None,
                        objects=None) -> ReflogEntry:
    """One reflog row; `objects` reads the checkpoint of a version-2 row whose history it implies."""
    payload = unseal("reflog", key, value)
    if prefix is None:
        prefix = key[: key.index(b"\0") + 1]
    number = struct.unpack(">Q", key[len(prefix):])[0]
    if payload[:1] != b"{":
        try:
            old, new, action, message, time_us, unresolved = _decode_v2(objects, payload)
        except InvalidObject as exc:
            raise IntegrityError(f"reflog entry {number} is malformed: {exc}") from None
        return ReflogEntry(number, old, new, action, message, time_us / 1e6, unresolved)
    doc = encoding.decode(payload)  # version 1: canonical JSON
    old = None if doc["old"] is None else Digest.parse(doc["old"])
    return ReflogEntry(number, old, ThreadState.from_doc(doc["new"]), doc["action"], doc["message"],
                       doc["time"] / 1e6)


def all_reflog_entries(txn: MetaTxn, objects=None):
    """(thread name, entry) for every reflog entry in the store, streamed."""
    for key, value in txn.scan("reflog"):
        key = bytes(key)
        name = key[len(PREFIX): key.index(b"\0")].decode("utf-8")
        yield name, decode_reflog_entry(key, value, objects=objects)
