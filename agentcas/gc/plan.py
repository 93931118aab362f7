"""Plan a garbage collection: mark from the roots, then classify every stored object.

`plan_gc(backends, now, grace, expire_reflog) -> GcPlan` reads the metadata in one snapshot:
1. Roots (roots.py): every thread ref, the reflog entries that will be kept, and
   signature objects of live checkpoints. A `MarkWalker` marks their closures into one
   shared `MarkSet` of raw 32-byte digests (markset.py: packed in memory up to a fixed
   budget, then on disk, so marks cost bounded memory). A missing or damaged object
   reachable from a root aborts gc (GcAborted, exit 4) before anything is deleted.
2. Scan: every stored object is listed once, in the order the backend reads fastest
   (`list_unordered`: an embedded store reads its packs front to back, where id order
   would read one pack at random per object), with kind and written_at from the listing
   where the backend gives them, else from each value's 22-byte header, read a window of
   objects at a time. An object is live (marked), held by grace (written less than
   `grace` ago: a `recent` root whose closure is then marked too), or a candidate.
   Candidates (and the young interior objects, roots below) are kept in a `KeySpool`
   per sweep level: packed (key, stored size) pairs, in memory up to a fixed size and
   in a temporary file beyond, so the plan holds no Python object per stored object
   and its memory does not grow with the store.
3. Sweep levels put referrers before what they refer to (checkpoints and signatures,
   then trees and segments, then chunk lists, then chunks), so even a gc killed
   half-way never leaves a stored object whose own references are gone.
The plan is inspectable and JSON-able (`to_json`); `sweep.execute(backends, plan)`
deletes in batches fenced against leases, re-checking refs and ages in every batch.
Objects and refs are not read in one snapshot: whatever lands after the roots were
read is caught by the sweep's ref comparison (and by the grace re-check).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import cast

from agentcas.cas import framing
from agentcas.cas.backends import Backends
from agentcas.cas.digest import Digest
from agentcas.cas.metastore.base import MetaTxn
from agentcas.errors import IntegrityError, UsageError
from agentcas.gc.markset import KeySpool, MarkSet
from agentcas.gc.pages import PageReleaser, TickingReads
from agentcas.gc.roots import GcAborted, MarkWalker, all_roots, mark_root, mark_signatures, read_pins, young_closure
from agentcas.gc_defaults import DEFAULT_EXPIRE_REFLOG, DEFAULT_GRACE  # re-exported for callers of this module
from agentcas.lineage.closure import MissingObject
from agentcas.refs import threads

KEY_SIZE = 32

# Referrers before referents: a level is deleted completely before the next starts.
SWEEP_LEVELS = ((framing.KIND_CHECKPOINT, framing.KIND_SIGNATURE),
                (framing.KIND_TREE, framing.KIND_SEGMENT),
                (framing.KIND_CHUNKLIST,),
                (framing.KIND_CHUNK,))
LEVEL_OF_KIND = {kind: level for level, kinds in enumerate(SWEEP_LEVELS) for kind in kinds}

_DURATION = re.compile(r"([0-9]+)[ \t]*([smhdw]?)")   # ASCII digits: int() also reads "٥"
_UNIT_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(text: str, allow_now: bool = False) -> int:
    """Seconds in a duration like 0s, 90s, 15m, 1h, 7d, 2w ('now' = 0 when allowed)."""
    value = str(text).strip().lower()
    if allow_now and value == "now":
        return 0
    match = _DURATION.fullmatch(value)
    if not match:
        allowed = "'now' or " if allow_now else ""
        raise UsageError(f"not a duration: {text!r} (use {allowed}a number with s, m, h, d or w, e.g. 15m)")
    return int(match.group(1)) * _UNIT_SECONDS[match.group(2)]


def _tally() -> dict:
    return {"objects": 0, "bytes": 0}


@dataclass(frozen=True)
class GcPlan:
    """What a gc would delete and why the rest stays; execute it with sweep.execute."""

    store: str
    now: float
    grace: int
    expire_reflog: int
    roots: dict                # kind -> number of roots
    reflog: dict               # {"entries", "expiring"}
    pins: tuple                # Pin, as read when planning
    objects: int
    live: dict                 # {"objects", "bytes"}
    held_by_grace: dict        # {"objects", "bytes", "oldest_written_at", "newest_written_at"}
    reclaimable: dict          # {"objects", "bytes", "by_kind": {kind: {"objects", "bytes"}}}
    notes: tuple
    marked: MarkSet = field(repr=False, compare=False)
    candidates: tuple = field(repr=False, compare=False)   # one KeySpool (key, stored bytes) per level
    tracking: dict = field(repr=False, compare=False)      # {"generation", "refs": name -> value}
    root_list: tuple = field(repr=False, compare=False)

    @property
    def grace_cutoff(self) -> float:
        return self.now - self.grace

    @property
    def reflog_cutoff(self) -> float:
        return self.now - self.expire_reflog

    def is_young(self, written_at: int) -> bool:
        """Written less than `grace` ago (by its header's whole-second written_at)."""
        return written_at > self.grace_cutoff

    def candidate_keys(self, level: int):
        for keys, _ in self.candidates[level].batches(HEADER_WINDOW):
            for start in range(0, len(keys), KEY_SIZE):
                yield keys[start:start + KEY_SIZE]

    def close(self) -> None:
        """Drop the marks and candidates (and their temporary files): the plan is spent."""
        self.marked.close()
        for spool in self.candidates:
            spool.close()

    def to_json(self) -> dict:
        held = dict(self.held_by_grace)
        if held["objects"]:
            held["releases_from_seconds"] = max(0, int(held["oldest_written_at"] + self.grace - self.now) + 1)
            held["releases_by_seconds"] = max(0, int(held["newest_written_at"] + self.grace - self.now) + 1)
        return {"store": self.store, "now": int(self.now), "grace_seconds": self.grace,
                "expire_reflog_seconds": self.expire_reflog, "roots": dict(self.roots),
                "reflog": dict(self.reflog), "pins": [p.to_doc() for p in self.pins],
                "objects": self.objects, "live": dict(self.live), "held_by_grace": held,
                "reclaimable": {"objects": self.reclaimable["objects"], "bytes": self.reclaimable["bytes"],
                                "by_kind": {k: dict(v) for k, v in self.reclaimable["by_kind"].items()}},
                "notes": list(self.notes)}


HEADER_WINDOW = 1024  # listed objects whose headers are read together (in parallel on S3)


def _with_headers(objects, listing, seen):
    """(info, header) of each listed object, in order; header None where the listing gives
    the kind or the object is marked. Headers are read HEADER_WINDOW objects at a time
    (one request each on S3, so in parallel), so memory stays at one window."""
    window = []

    def flush():
        need = [bytes(i.key) for i in window if i.kind is None and i.key not in seen]
        got = objects.blobs.headers(need) if need else {}
        for info in window:
            yield info, got.get(bytes(info.key))
        window.clear()
    for info in listing:
        window.append(info)
        if len(window) >= HEADER_WINDOW:
            yield from flush()
    yield from flush()


def _ticking(listing, pages: PageReleaser):
    """The listing, ticking `pages` as each object is listed: reading ahead a window of
    headers must not map a window's worth of store pages before the next look."""
    for info in listing:
        pages.tick()
        yield info


def _kind_and_age(info, header) -> tuple[int | None, int]:
    """(kind, written_at) of a listed object; kind None if it is gone since the listing."""
    if info.kind is not None:
        return info.kind, int(info.written_at)
    if header is None:
        return None, 0
    kind, _, _, written_at = framing.read_header(header)
    return kind, written_at


def _pairs(spool: KeySpool):
    """Each (key, number) of a spool, in order."""
    for keys, numbers in spool.batches(HEADER_WINDOW):
        for index, number in enumerate(numbers):
            yield keys[index * KEY_SIZE:(index + 1) * KEY_SIZE], number


def plan_gc(backends: Backends, now: float | None = None, grace: int = DEFAULT_GRACE,
            expire_reflog: int = DEFAULT_EXPIRE_REFLOG) -> GcPlan:
    """Mark from every root and classify every object; deletes nothing.

    Raises GcAborted (exit 4) when a root reaches a missing or damaged object.
    """
    if grace < 0 or expire_reflog < 0:
        raise UsageError("--grace and --expire-reflog must not be negative")
    now = time.time() if now is None else now
    grace_cutoff = now - grace
    # An embedded store counts its objects at no cost: the mark table starts that large.
    seen = MarkSet(expected=0 if backends.shared else backends.blobs.count())
    notes: list[str] = []
    live, held, reclaimable = _tally(), _tally(), _tally()
    held.update(oldest_written_at=None, newest_written_at=None)
    by_kind = {name: _tally() for name in framing.KIND_NAMES.values()}
    candidates = tuple(KeySpool() for _ in SWEEP_LEVELS)
    total = 0

    def young(written_at: int) -> bool:
        return written_at > grace_cutoff

    pages = PageReleaser(backends)
    with backends.meta.reader() as meta_txn, backends.source.reading() as objects:
        txn = cast(MetaTxn, TickingReads(meta_txn, pages))  # scans tick `pages` per row
        tracking = {"generation": threads.ref_generation(txn),
                    "refs": {bytes(k[len(threads.PREFIX):]).decode("utf-8"): bytes(v)
                             for k, v in txn.scan("refs", threads.PREFIX)}}
        roots, reflog_entries, expiring = all_roots(txn, now - expire_reflog)
        pins = tuple(read_pins(txn))
        walker = MarkWalker(objects, seen, pages)
        for root in roots:
            mark_root(walker, root)
        signatures = mark_signatures(txn, objects, seen)

        young_interior = KeySpool()  # (key, kind)
        for info, header in _with_headers(objects, _ticking(backends.blobs.list_unordered(), pages), seen):
            key = info.key
            total += 1
            if key in seen:
                live["objects"] += 1
                live["bytes"] += info.size
                continue
            try:
                kind, written_at = _kind_and_age(info, header)
            except IntegrityError as exc:
                raise GcAborted(f"object {bytes(key).hex()} is corrupt ({exc}); gc deleted nothing "
                                "(run 'agentcas fsck')") from None
            if kind is None:
                continue  # deleted since it was listed
            size = info.size
            if young(written_at):
                held["objects"] += 1
                held["bytes"] += size
                if held["oldest_written_at"] is None or written_at < held["oldest_written_at"]:
                    held["oldest_written_at"] = written_at
                if held["newest_written_at"] is None or written_at > held["newest_written_at"]:
                    held["newest_written_at"] = written_at
                if kind != framing.KIND_CHUNK:
                    young_interior.append(bytes(key), kind)
            else:
                candidates[LEVEL_OF_KIND[kind]].append(bytes(key), size)
                reclaimable["objects"] += 1
                reclaimable["bytes"] += size
                tally = by_kind[framing.KIND_NAMES[kind]]
                tally["objects"] += 1
                tally["bytes"] += size

        # Recent objects are roots too: what they refer to stays while they do.
        recent_roots = 0
        for raw, kind in _pairs(young_interior):
            if raw in seen:
                continue
            recent_roots += 1
            try:
                for digest, got_kind, _ in young_closure(walker, Digest(raw), kind):
                    value = objects.blobs.header(digest.raw)
                    written_at = framing.read_header(value)[3]
                    if not young(written_at):  # counted as a candidate above: it is held now
                        size = len(objects.raw(digest))
                        reclaimable["objects"] -= 1
                        reclaimable["bytes"] -= size
                        tally = by_kind[framing.KIND_NAMES[got_kind]]
                        tally["objects"] -= 1
                        tally["bytes"] -= size
                        held["objects"] += 1
                        held["bytes"] += size
            except (MissingObject, IntegrityError) as exc:
                notes.append(f"recent {framing.KIND_NAMES[kind]} {raw.hex()} is incomplete ({exc}); "
                             "kept as it is")
        young_interior.close()
        signatures += mark_signatures(txn, objects, seen)
    pages.release()

    live_pins = [p for p in pins if p.live()]
    if live_pins:
        notes.append(f"{len(live_pins)} write(s) in progress: the sweep waits until none is "
                     "(a write in progress may reuse any stored object)")
    root_counts = {"thread": sum(1 for r in roots if r.kind == "thread"),
                   "reflog": reflog_entries - expiring,  # entries kept, as `agentcas reflog` counts
                   "signature": signatures, "recent": recent_roots,
                   "pin": len(live_pins)}
    return GcPlan(store=backends.url, now=now, grace=grace, expire_reflog=expire_reflog,
                  roots=root_counts, reflog={"entries": reflog_entries, "expiring": expiring},
                  pins=pins, objects=total, live=live, held_by_grace=held,
                  reclaimable=dict(reclaimable, by_kind={k: v for k, v in by_kind.items() if v["objects"]}),
                  notes=tuple(notes), marked=seen, candidates=candidates, tracking=tracking,
                  root_list=tuple(roots))

