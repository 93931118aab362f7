"""Execute a gc plan: expire reflog entries, delete garbage in small transactions, settle.

Safety with concurrent writers (even at --grace 0s) rests on the lease protocol of
cas/leases.py; each sweep batch:
- begins with a metadata transaction (`begin_sweep`) that locks the fence row, drops
  dead leases and, if no live lease remains, marks the batch active for SWEEP_WINDOW.
  A live lease means a write is in progress, which may reuse ANY stored object
  (content addressing deduplicates against what is stored): the batch deletes
  nothing and gc waits (up to `wait` seconds, then it stops and reports itself
  incomplete). While the batch is active no writer can take a lease, so no writer
  is between its object checks and its ref move;
- then compares every ref with the value it was marked from; for each thread that
  moved (or appeared) since, it marks the closure of its new state and of all its
  reflog entries, before deleting anything;
- then deletes the batch's candidates that are still unmarked, still stored, and
  still older than the grace cutoff (re-read from their headers), first the
  signature rows of deleted checkpoints, then the objects, and only while the
  batch's window lasts; and ends by clearing the fence.
So a batch deletes only what no ref, kept reflog entry, recent object or future
landing of a current writer can reach, on every backend alike.

Killed at any point: each batch is its own transaction and deletes only unreachable
objects, level by level (plan.SWEEP_LEVELS), so nothing reachable is lost and a rerun
finishes the job. Freed pages: LMDB hands out a page freed by transaction T only
from transaction T+2 on, so after the last batch two small meta writes ("settle")
make the very next user write reuse the freed space.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import partial

from agentcas import testing_hooks
from agentcas.cas import encoding, framing
from agentcas.cas.backends import Backends
from agentcas.cas.leases import SWEEP_WINDOW, begin_sweep, end_sweep
from agentcas.cas.metastore.base import MetadataUnavailable, MetaTxn
from agentcas.cas.packs import delete as delete_packed_object
from agentcas.cas.sealed import seal
from agentcas.cas.source import ObjectSource
from agentcas.errors import IntegrityError
from agentcas.gc.pages import PageReleaser
from agentcas.gc.plan import HEADER_WINDOW, KEY_SIZE, SWEEP_LEVELS, GcPlan
from agentcas.gc.repack import repack_store
from agentcas.gc.roots import GcAborted, MarkWalker, entry_roots, mark_root, mark_signatures, read_pins, state_roots
from agentcas.gc_defaults import BATCH_DELETES, DEFAULT_WAIT  # re-exported for callers of this module
from agentcas.refs import threads

BUSY_SLEEP = 0.05
LAST_GC_KEY = b"gc/last"


@dataclass
class _Batch:
    deleted: int = 0
    freed: int = 0
    remarked: int = 0
    dropped_pins: int = 0
    busy: tuple = ()
    expired: bool = False


def expire_reflog(txn: MetaTxn, cutoff: float) -> int:
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


def remark_moved_threads(txn: MetaTxn, objects: ObjectSource, plan: GcPlan) -> int:
    """Mark the closures of threads that moved since `plan` was made; objects newly marked.

    Every ref move writes a fresh generation token (refs/threads.generation_row), so an
    unchanged token means nothing moved and the refs need not be compared.
    """
    generation = threads.ref_generation(txn)
    if generation == plan.tracking["generation"]:
        return 0
    known = plan.tracking["refs"]
    current = {bytes(k[len(threads.PREFIX):]).decode("utf-8"): bytes(v)
               for k, v in txn.scan("refs", threads.PREFIX)}
    moved = [name for name, value in current.items() if known.get(name) != value]
    walker = MarkWalker(objects, plan.marked)
    count = 0
    for name in moved:
        try:
            roots = state_roots("thread", name, name, threads.read_thread(txn, name))
            for index, entry in enumerate(threads.read_reflog(txn, name)):  # newest first
                roots += entry_roots(name, index, entry)
        except IntegrityError as exc:
            raise GcAborted(f"{exc}; gc stopped (run 'agentcas fsck')") from None
        for root in roots:
            count += mark_root(walker, root)
    plan.tracking.update(generation=generation, refs=current)
    return count


WINDOW_MARGIN = 5.0


def sweep_batch(backends: Backends, plan: GcPlan, keys: bytes, level: int,
                pages: PageReleaser | None = None, sizes=None) -> _Batch:
    """One fenced sweep batch over packed candidate keys (see the module docstring)."""
    result = _Batch()
    began = time.time()
    live, result.dropped_pins = backends.meta.write(lambda txn: begin_sweep(txn, time.time()))
    if live:
        result.busy = tuple(live)
        return result
    unanswered = False
    try:
        with backends.meta.reader() as txn, backends.source.reading() as objects:
            result.remarked = remark_moved_threads(txn, objects, plan)
            if SWEEP_LEVELS[level][0] == framing.KIND_CHECKPOINT:
                result.remarked += mark_signatures(txn, objects, plan.marked)
            window = HEADER_WINDOW if backends.shared or pages is None else pages.every
            doomed, freed = _doomed(objects, plan, keys, pages, sizes, window)
        testing_hooks.reached("gc.sweep.in_batch")
        if time.time() > began + SWEEP_WINDOW - WINDOW_MARGIN:
            result.busy = ()  # out of time: delete nothing in this batch; the caller retries it
            result.expired = True
            return result
        if doomed and SWEEP_LEVELS[level][0] == framing.KIND_CHECKPOINT:
            backends.meta.write(lambda txn: _delete_signature_rows(txn, doomed))
        result.deleted = _delete(backends, doomed, pages)
        result.freed = freed
    except MetadataUnavailable:
        # No end_sweep: the store just stopped answering, and the fence ends by itself
        # when its window passes; asking again would only hold the error back.
        unanswered = True
        raise
    finally:
        if not unanswered:
            backends.meta.write(end_sweep)
    return result


def _doomed(objects: ObjectSource, plan: GcPlan, keys: bytes, pages, sizes=None,
            window_size: int = HEADER_WINDOW) -> tuple[list[bytes], int]:
    """The batch's candidates still unmarked, still stored and still old; (keys, bytes).

    Headers are read `window_size` at a time (HEADER_WINDOW, in parallel, on S3; as many
    as pages looks between on an embedded store, where one random read maps ~200 KiB),
    ticking `pages` per object, so memory holds a window's headers and pages at most."""
    doomed, freed = [], 0
    marked = plan.marked
    count = len(keys) // KEY_SIZE
    for first in range(0, count, window_size):
        window = range(first, min(count, first + window_size))
        asked = [(index, keys[index * KEY_SIZE:(index + 1) * KEY_SIZE]) for index in window]
        asked = [(index, raw) for index, raw in asked if raw not in marked]
        headers = objects.blobs.headers([raw for _, raw in asked])
        for index, raw in asked:
            if pages is not None:
                pages.tick()
            header = headers.get(raw)
            if header is None:
                continue
            try:
                _, _, size, written_at = framing.read_header(header)
            except IntegrityError as exc:
                raise GcAborted(f"object {raw.hex()} is corrupt ({exc}); gc stopped "
                                "(run 'agentcas fsck')") from None
            if plan.is_young(written_at):
                continue
            doomed.append(bytes(raw))
            freed += sizes[index] if sizes is not None else size
    return doomed, freed


EMBEDDED_DELETES = 256  # objects an embedded store deletes per write transaction (each maps ~200 KiB)


def _delete(backends: Backends, doomed: list[bytes], pages) -> int:
    """Delete `doomed`; the number deleted. An embedded (LMDB) store's write transaction
    holds every page it dirties in memory and maps every page it reads, so it deletes in
    transactions of EMBEDDED_DELETES, ticking `pages` per object deleted (a look inside
    the transaction drops only read-only mapped pages: the dirty ones are LMDB's own
    copies); a shared store takes the whole batch at once (its deletes are requests,
    batched by the server)."""
    if backends.shared or backends.embedded is None:
        return backends.blobs.delete_many(doomed)
    deleted = 0
    for start in range(0, len(doomed), EMBEDDED_DELETES):
        deleted += backends.embedded.write(partial(_delete_packed, keys=doomed[start:start + EMBEDDED_DELETES],
                                                 pages=pages))
        if pages is not None:
            pages.tick(pages.every)  # a look now
    return deleted


def _delete_packed(txn, keys: list[bytes], pages) -> int:
    deleted = 0
    for key in keys:
        deleted += delete_packed_object(txn, key)
        if pages is not None:
            pages.tick()
    return deleted


def sweep_unnamed_packs(backends: Backends, plan: GcPlan) -> dict:
    """A shared store's pack objects that no index row names (a writer killed before its
    rows landed, a sweep killed before its delete) and older than the grace cutoff, deleted
    in a fenced batch of their own: no writer then holds a lease, so none is between its
    pack upload and its rows. {"unnamed", "unnamed_bytes"}, or {"skipped": "writers"}."""
    assert backends.packed is not None
    live, _ = backends.meta.write(lambda txn: begin_sweep(txn, time.time()))
    if live:
        return {"skipped": "writers"}
    try:
        packs, size = backends.packed.sweep_unnamed_packs(plan.grace_cutoff)
    finally:
        backends.meta.write(end_sweep)
    return {"unnamed": packs, "unnamed_bytes": size}


def _delete_signature_rows(txn: MetaTxn, checkpoints: list[bytes]) -> None:
    for raw in checkpoints:
        for sig_key, _ in list(txn.scan("signatures", raw)):
            txn.delete("signatures", sig_key)


def _put_last_gc(txn: MetaTxn, sealed: bytes) -> None:
    txn.put("meta", LAST_GC_KEY, sealed)


def settle(backends: Backends, doc: dict) -> None:
    """Two small write transactions so the next write can reuse the pages just freed."""
    for step in (1, 2):
        sealed = seal("meta", LAST_GC_KEY, encoding.encode(dict(doc, settle=step)))
        backends.meta.write(partial(_put_last_gc, sealed=sealed))


def execute(backends: Backends, plan: GcPlan, wait: float = DEFAULT_WAIT,
            batch: int = BATCH_DELETES, progress=None) -> dict:
    """Carry out `plan`; returns what was deleted and whether the sweep completed.

    Raises GcAborted (exit 4) if a ref that moved during gc reaches a missing object.
    """
    def start_txn(txn: MetaTxn):
        gone = 0
        for pin in read_pins(txn):
            if not pin.live():
                txn.delete("leases", pin.key)
                gone += 1
        return expire_reflog(txn, plan.reflog_cutoff), gone

    expired, dropped = backends.meta.write(start_txn)
    deleted = freed = remarked = batches = 0
    blocked: tuple = ()
    waited_since = None
    complete = True
    total = sum(len(spool) for spool in plan.candidates)
    done = 0
    pages = PageReleaser(backends)
    for level, spool in enumerate(plan.candidates):
        if not complete:
            break
        for chunk, sizes in spool.batches(batch):
            while True:
                testing_hooks.reached("gc.sweep.before_batch")
                outcome = sweep_batch(backends, plan, chunk, level, pages, sizes)
                dropped += outcome.dropped_pins
                if not (outcome.busy or outcome.expired):
                    break
                now = time.monotonic()
                waited_since = waited_since or now
                if now - waited_since >= wait:
                    complete, blocked = False, outcome.busy
                    break
                time.sleep(BUSY_SLEEP)
            if not complete:
                break
            waited_since = None
            batches += 1
            deleted += outcome.deleted
            freed += outcome.freed
            remarked += outcome.remarked
            done += len(chunk) // KEY_SIZE
            if progress:
                progress(done, total)
    result = {"deleted": {"objects": deleted, "bytes": freed}, "reflog_expired": expired,
              "pins_dropped": dropped, "remarked": remarked, "batches": batches,
              "complete": complete, "blocked_by": [p.to_doc() for p in blocked]}
    if backends.embedded is not None:
        result["repack"] = repack_store(backends.embedded, pages=pages).to_json()
    if backends.packed is not None:
        result["packs"] = dict(sweep_unnamed_packs(backends, plan) if complete else {"skipped": "incomplete"},
                               deleted=backends.packed.packs_deleted)
    settle(backends, {"at": int(plan.now), "deleted": deleted, "bytes": freed, "complete": complete})
    return result
