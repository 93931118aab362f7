"""Execute a gc plan: expire reflog entries, delete garbage in small transactions, settle.

Safety with concurrent writers (even at --grace 0s) rests on one protocol:
- Every writer that spans several transactions (commit, rollout append, import,
  push receiving) writes a `pins` row {what, pid, started_at} in its own transaction
  BEFORE it reads or writes any object, and removes it in its final transaction, the
  one that moves the ref (cas/writer.WritePin).
- Every sweep transaction first re-reads `pins`. Rows whose pid is dead are dropped.
  If any live pin remains, the transaction deletes nothing and gc waits (up to
  `wait` seconds, then it stops and reports itself incomplete). A write in progress
  may reuse ANY stored object (content addressing deduplicates against what is
  stored), so no object is safe to delete while one runs.
- Then it compares every ref with the value it was marked from; for each thread that
  moved (or appeared) since, it marks the closure of its new state and of all its
  reflog entries, in this same transaction, before deleting anything.
- Then it deletes the batch's candidates that are still unmarked, still stored, and
  still older than the grace cutoff.
LMDB serialises write transactions, so each sweep transaction sees a store with no
write in flight and every finished write already on its refs: it deletes only what
no ref, kept reflog entry, recent object or future landing of a current writer can
reach. Single-transaction moves (branch, fork, revert) land between sweep
transactions and are caught by the ref comparison.

Killed at any point: each batch is its own transaction and deletes only unreachable
objects, level by level (plan.SWEEP_LEVELS), so nothing reachable is lost and a rerun
finishes the job. Freed pages: LMDB hands out a page freed by transaction T only
from transaction T+2 on, so after the last batch two small meta writes ("settle")
make the very next user write reuse the freed space.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from agentcas import testing_hooks
from agentcas.cas import encoding, framing
from agentcas.cas.sealed import seal
from agentcas.cas.store import ObjectStore, Txn
from agentcas.errors import IntegrityError
from agentcas.gc.pages import PageReleaser
from agentcas.gc.plan import KEY_SIZE, SWEEP_LEVELS, GcPlan
from agentcas.gc.roots import (GcAborted, MarkWalker, entry_roots, mark_root, mark_signatures,
                               read_pins, state_roots)
from agentcas.refs import threads

BATCH_DELETES = 10_000
DEFAULT_WAIT = 60.0
BUSY_SLEEP = 0.05
LAST_GC_KEY = b"gc/last"


@dataclass
class _Batch:
    deleted: int = 0
    freed: int = 0
    remarked: int = 0
    dropped_pins: int = 0
    busy: tuple = ()


def expire_reflog(txn: Txn, cutoff: float) -> int:
    """Delete reflog entries older than `cutoff`, never a thread's newest; the count."""
    doomed: list[bytes] = []
    previous: tuple[str, bytes, float] | None = None
    try:
        for name, entry in threads.all_reflog_entries(txn):
            key = threads.PREFIX + name.encode("utf-8") + b"\0" + entry.number.to_bytes(8, "big")
            if previous is not None and previous[0] == name and previous[2] < cutoff:
                doomed.append(previous[1])
            previous = (name, key, entry.time)
    except IntegrityError as exc:
        raise GcAborted(f"{exc}; gc deleted nothing (run 'agentcas fsck')") from None
    for key in doomed:
        txn.delete("reflog", key)
    return len(doomed)


def remark_moved_threads(txn: Txn, plan: GcPlan) -> int:
    """Mark the closures of threads that moved since `plan` was made; objects newly marked.

    Every ref move bumps a sealed generation counter (refs/threads.bump_generation), so
    an unchanged counter means nothing moved and the refs need not be compared.
    """
    generation = threads.ref_generation(txn)
    if generation == plan.tracking["generation"]:
        return 0
    known = plan.tracking["refs"]
    current = {bytes(k[len(threads.PREFIX):]).decode("utf-8"): bytes(v)
               for k, v in txn.scan("refs", threads.PREFIX)}
    moved = [name for name, value in current.items() if known.get(name) != value]
    walker = MarkWalker(txn, plan.marked)
    count = 0
    for name in moved:
        try:
            roots = state_roots("thread", name, name, threads.read_thread(txn, name))
            for entry in threads.read_reflog(txn, name):
                roots += entry_roots(name, entry)
        except IntegrityError as exc:
            raise GcAborted(f"{exc}; gc stopped (run 'agentcas fsck')") from None
        for root in roots:
            count += mark_root(walker, root)
    plan.tracking.update(generation=generation, refs=current)
    return count


def sweep_batch(txn: Txn, plan: GcPlan, keys: bytes, level: int,
                pages: PageReleaser | None = None) -> _Batch:
    """One sweep transaction over packed candidate keys (see the module docstring)."""
    result = _Batch()
    live = []
    for pin in read_pins(txn):
        if pin.live:
            live.append(pin)
        else:
            txn.delete("pins", pin.key)
            result.dropped_pins += 1
    if live:
        result.busy = tuple(live)
        return result
    result.remarked = remark_moved_threads(txn, plan)
    if SWEEP_LEVELS[level][0] == framing.KIND_CHECKPOINT:
        result.remarked += mark_signatures(txn, plan.marked)
    marked = plan.marked
    for start in range(0, len(keys), KEY_SIZE):
        raw = keys[start:start + KEY_SIZE]
        if raw in marked:
            continue
        if pages is not None:
            pages.tick()
        value = txn.get("objects", raw)
        if value is None:
            continue
        try:
            kind, _, _, written_at = framing.read_header(value)
        except IntegrityError as exc:
            raise GcAborted(f"object {raw.hex()} is corrupt ({exc}); gc stopped "
                            "(run 'agentcas fsck')") from None
        if plan.is_young(written_at):
            continue
        if kind == framing.KIND_CHECKPOINT:
            for sig_key, _ in list(txn.scan("signatures", raw)):
                txn.delete("signatures", sig_key)
        txn.delete("objects", raw)
        result.deleted += 1
        result.freed += len(value)
    return result


def settle(objects: ObjectStore, doc: dict) -> None:
    """Two small write transactions so the next write can reuse the pages just freed."""
    for step in (1, 2):
        payload = encoding.encode(dict(doc, settle=step))
        objects.write(lambda txn: txn.put("meta", LAST_GC_KEY, seal("meta", LAST_GC_KEY, payload)))


def execute(objects: ObjectStore, plan: GcPlan, wait: float = DEFAULT_WAIT,
            batch: int = BATCH_DELETES, progress=None) -> dict:
    """Carry out `plan`; returns what was deleted and whether the sweep completed.

    Raises GcAborted (exit 4) if a ref that moved during gc reaches a missing object.
    """
    def start_txn(txn: Txn):
        gone = 0
        for pin in read_pins(txn):
            if not pin.live:
                txn.delete("pins", pin.key)
                gone += 1
        return expire_reflog(txn, plan.reflog_cutoff), gone

    expired, dropped = objects.write(start_txn)
    deleted = freed = remarked = batches = 0
    blocked: tuple = ()
    waited_since = None
    complete = True
    total = sum(len(keys) for keys in plan.candidates) // KEY_SIZE
    done = 0
    pages = PageReleaser(objects)
    for level, keys in enumerate(plan.candidates):
        step = batch * KEY_SIZE
        start = 0
        while start < len(keys) and complete:
            chunk = bytes(keys[start:start + step])
            testing_hooks.reached("gc.sweep.before_batch")
            outcome = objects.write(lambda txn: sweep_batch(txn, plan, chunk, level, pages))
            dropped += outcome.dropped_pins
            if outcome.busy:
                now = time.monotonic()
                waited_since = waited_since or now
                if now - waited_since >= wait:
                    complete, blocked = False, outcome.busy
                    break
                time.sleep(BUSY_SLEEP)
                continue
            waited_since = None
            batches += 1
            deleted += outcome.deleted
            freed += outcome.freed
            remarked += outcome.remarked
            start += step
            done += len(chunk) // KEY_SIZE
            if progress:
                progress(done, total)
    result = {"deleted": {"objects": deleted, "bytes": freed}, "reflog_expired": expired,
              "pins_dropped": dropped, "remarked": remarked, "batches": batches,
              "complete": complete, "blocked_by": [p.to_doc() for p in blocked]}
    settle(objects, {"at": int(plan.now), "deleted": deleted, "bytes": freed, "complete": complete})
    return result
