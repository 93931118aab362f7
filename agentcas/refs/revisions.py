"""Revision syntax: how a user names a checkpoint.

    REV  := BASE SUFFIX*
    BASE := 64-hex id | unique hex prefix (8+ chars) | THREAD | THREAD@{N}
    SUFFIX := ~N (N-th first parent; "~" alone is ~1) | ^ (first parent)

A thread name wins over a hex prefix that happens to spell it. THREAD@{N} is the
state after the N-th newest reflog entry (@{0} is the current head).
"""

from __future__ import annotations

import re

from agentcas.cas import framing
from agentcas.cas.digest import DIGEST_SIZE, Digest
from agentcas.cas.metastore.base import MetaTxn
from agentcas.cas.objects import Checkpoint, HistoryPosition
from agentcas.cas.source import ObjectSource, load_object
from agentcas.errors import IntegrityError, NotFound, UsageError
from agentcas.refs.names import is_thread_name
from agentcas.refs.threads import ThreadState, read_reflog, read_thread

_SUFFIX = re.compile(r"(~\d*|\^)$", re.ASCII)
_REFLOG = re.compile(r"^(.+)@\{(\d+)\}$", re.ASCII)
_HEX = re.compile(r"^[0-9a-f]{8,64}$")
MIN_PREFIX = 8
_SHORT_HEX = re.compile(rf"^[0-9a-fA-F]{{1,{MIN_PREFIX - 1}}}$")  # looks like a too-short id


class UnknownRevision(NotFound):
    pass


class AmbiguousRevision(UsageError):
    pass


def load_checkpoint(objects: ObjectSource, digest: Digest) -> Checkpoint:
    data = load_object(objects, digest, framing.KIND_CHECKPOINT)
    if data is None:
        raise UnknownRevision(f"checkpoint {digest.hex()} is not in this store")
    return Checkpoint.decode(data)


def resolve(txn: MetaTxn, objects: ObjectSource, rev: str) -> Digest:
    """The checkpoint id that `rev` names; UnknownRevision / AmbiguousRevision otherwise."""
    if not isinstance(rev, str) or not rev or len(rev) > 1024:
        raise UsageError("empty or oversized revision")
    try:
        rev.encode("utf-8")
    except UnicodeEncodeError:
        raise UnknownRevision(f"unknown revision {rev!r}") from None
    steps = 0
    base = rev
    while True:
        match = _SUFFIX.search(base)
        if not match or match.start() == 0:
            break
        token = match.group(1)
        steps += 1 if token in ("^", "~") else int(token[1:])
        base = base[: match.start()]
    digest = _resolve_base(txn, objects, base, rev)
    for _ in range(steps):
        checkpoint = load_checkpoint(objects, digest)
        if not checkpoint.parents:
            raise UnknownRevision(f"revision {rev!r} goes past the first checkpoint")
        digest = checkpoint.parents[0]
    return digest


def _resolve_base(txn: MetaTxn, objects: ObjectSource, base: str, rev: str) -> Digest:
    match = _REFLOG.match(base)
    if match:
        name, number = match.group(1), int(match.group(2))
        entries = read_reflog(txn, name, limit=number + 1)
        if len(entries) <= number:
            raise UnknownRevision(f"thread {name!r} has no reflog entry @{{{number}}}")
        new = entries[number].new
        if new is None or new.checkpoint is None:
            raise UnknownRevision(f"reflog entry {name}@{{{number}}} names no checkpoint")
        return new.checkpoint
    try:
        state = read_thread(txn, base)
    except UsageError:
        state = None
    if state is not None:
        if state.checkpoint is None:
            raise UnknownRevision(f"thread {base!r} has no checkpoint yet")
        return state.checkpoint
    if _HEX.match(base.lower()):  # ids are written in lowercase; git accepts either case
        if len(base) == 2 * DIGEST_SIZE:   # a whole id: one lookup, not a listing
            digest = Digest(bytes.fromhex(base))
            if objects.kind(digest) != framing.KIND_CHECKPOINT:
                raise UnknownRevision(f"unknown revision {rev!r}")
            return digest
        return _resolve_prefix(objects, base.lower(), rev)
    if _SHORT_HEX.match(base):
        raise UnknownRevision(f"unknown revision {rev!r}: no thread has that name, and an id prefix "
                              f"needs at least {MIN_PREFIX} hex digits")
    raise UnknownRevision(f"unknown revision {rev!r}")


def _resolve_prefix(objects: ObjectSource, prefix: str, rev: str) -> Digest:
    start = bytes.fromhex(prefix[: len(prefix) // 2 * 2])
    matches = []
    for key in objects.keys_from(start):
        if not key.hex().startswith(prefix):
            if len(prefix) % 2 == 0 or not key.hex().startswith(prefix[:-1]):
                break
            continue
        digest = Digest(bytes(key))
        if objects.kind(digest) == framing.KIND_CHECKPOINT:
            matches.append(digest)
            if len(matches) > 1:
                raise AmbiguousRevision(f"revision {rev!r} is ambiguous: it prefixes several checkpoints")
    if not matches:
        raise UnknownRevision(f"unknown revision {rev!r}")
    return matches[0]


def is_ancestor(objects: ObjectSource, ancestor: Digest, tip: Digest | None, strict: bool = False) -> bool:
    """True if `ancestor` is `tip` or reachable from it through parents (depth first).

    A checkpoint missing from the store ends its branch, or with `strict` raises
    IntegrityError (a sender must hold the whole ancestry it claims).
    """
    stack, seen = ([tip] if tip is not None else []), set()
    while stack:
        digest = stack.pop()
        if digest == ancestor:
            return True
        if digest.raw in seen:
            continue
        seen.add(digest.raw)
        data = load_object(objects, digest, framing.KIND_CHECKPOINT)
        if data is None:
            if strict:
                raise IntegrityError(f"checkpoint {digest.hex()} is missing from the store")
            continue
        stack.extend(Checkpoint.decode(data).parents)
    return False


def reflog_state(txn: MetaTxn, objects: ObjectSource, rev: str | None) -> ThreadState | None:
    """The state reflog entry THREAD@{N} recorded, if `rev` is exactly that form (no suffix)."""
    match = _REFLOG.match(rev or "")
    if not match or not is_thread_name(match.group(1)):
        return None
    number = int(match.group(2))
    entries = read_reflog(txn, match.group(1), limit=number + 1, objects=objects)
    return entries[number].new if len(entries) > number else None


def source_state(txn: MetaTxn, objects: ObjectSource, source: str) -> tuple[HistoryPosition, Digest | None, str]:
    """(history, checkpoint, thread) that `source` names: a thread's head, a reflog
    entry's state (with records appended after its checkpoint), or a checkpoint and its
    own prefix; `thread` is the thread that history belongs to, for the lineage."""
    if is_thread_name(source):
        state = read_thread(txn, source)
        if state is not None:
            return state.history, state.checkpoint, source
    entry = reflog_state(txn, objects, source)
    if entry is not None:
        named = _REFLOG.match(source)
        assert named is not None  # a reflog state was found for it
        return entry.history, entry.checkpoint, named.group(1)
    digest = resolve(txn, objects, source)
    cp = load_checkpoint(objects, digest)
    return cp.history, digest, cp.thread


def named_thread(txn: MetaTxn, rev: str) -> str | None:
    """`rev` itself if it names an existing thread, else None."""
    return rev if is_thread_name(rev) and read_thread(txn, rev) is not None else None


def fork_ancestry(txn: MetaTxn, name: str) -> set[str]:
    """`name` and the threads it was forked from, transitively (those that still exist)."""
    names: set[str] = set()
    current: str | None = name
    while current is not None and current not in names and is_thread_name(current):
        names.add(current)
        state = read_thread(txn, current)
        current = state.forked_from.thread if state is not None and state.forked_from else None
    return names
