"""The lineage report of a gc: why every kept byte is alive, and what goes.

For each thread its closure (checkpoint with ancestors, tree, files, history chain)
is walked on its own, counting objects and stored bytes. Each object a thread reaches
first is spooled with that thread and its size; one reached again by a later thread is
marked shared; the spool then gives each thread its unique bytes (only the first to
reach an object can own it), the rest of its bytes being shared with other threads.
The per-thread walks, the two mark sets and the spool are gc's bounded structures
(gc/markset.py), and a shared store's listed sizes go to an on-disk KeySizes, so the
report's memory does not grow with the objects it counts. A fork's `forked_from` names
its parent and the seq it forked at; the segment holding that cut in the fork's own history is the
prefix it pins in the parent (kept whole even when the parent is deleted). Live
objects no thread reaches are kept by reflog entries or signatures alone.
The report costs one walk per thread, so it is built only when asked for
(`gc --report FILE`), never by a plain gc.
"""

from __future__ import annotations

from typing import Any

from agentcas.cas.backends import Backends
from agentcas.cas.digest import Digest
from agentcas.errors import IntegrityError, UsageError
from agentcas.gc.markset import KEY_SIZE, KeySizes, KeySpool, MarkSet
from agentcas.gc.plan import GcPlan
from agentcas.gc.roots import MarkWalker, state_roots
from agentcas.lineage import rollout
from agentcas.refs import threads

THREAD_BITS = 24  # a spooled number: the object's size, then the index of its first thread
THREAD_MASK = (1 << THREAD_BITS) - 1


def _prefix_pinned(history: rollout.History, state, names: set) -> dict | None:
    origin = state.forked_from
    if origin is None:
        return None
    doc = {"parent": origin.thread, "parent_exists": origin.thread in names, "seq": origin.seq,
           "checkpoint": None if origin.checkpoint is None else origin.checkpoint.hex(),
           "segment": None, "offset": None}
    if 0 < origin.seq <= state.history.seq:
        try:
            position = history.position(state.history, origin.seq)
            doc.update(segment=None if position.segment is None else position.segment.hex(), offset=position.offset)
        except (IntegrityError, UsageError) as exc:
            doc["error"] = str(exc)
    return doc


def build_report(backends: Backends, plan: GcPlan, result: dict | None = None) -> dict:
    """The report as a JSON-able dict (see docs/GC.md, "Report")."""
    rows: list[dict[str, Any]] = []
    first, shared = MarkSet(), MarkSet()
    firsts = KeySpool()  # (id, size << THREAD_BITS | index of the thread that reached it first)
    sizes = KeySizes() if backends.shared else None
    threaded_objects = threaded_bytes = 0
    try:
        with backends.meta.reader() as txn, backends.source.reading() as objects:
            states = threads.list_threads(txn)
            if len(states) >= 1 << THREAD_BITS:
                raise UsageError(f"a gc report covers at most {(1 << THREAD_BITS) - 1:,} threads")
            names = {name for name, _ in states}
            history = rollout.History(objects)
            # Stored sizes: from the memory map of an embedded store, from one listing of a shared one.
            if sizes is not None:
                sizes.update((info.key, info.size) for info in backends.blobs.list())

            def stored_size(raw: bytes) -> int:
                return sizes.get(raw) if sizes is not None else len(objects.raw(Digest(raw)))

            for index, (name, state) in enumerate(states):
                visited = MarkSet()
                walker = MarkWalker(objects, visited)
                count = size = 0
                for root in state_roots("thread", name, name, state):
                    for digest, _, _ in walker.root(root):
                        raw = digest.raw
                        object_size = stored_size(raw)
                        count += 1
                        size += object_size
                        if raw in first:
                            shared.add(raw)
                        else:
                            first.add(raw)
                            firsts.append(raw, object_size << THREAD_BITS | index)
                            threaded_objects += 1
                            threaded_bytes += object_size
                visited.close()
                rows.append({"thread": name, "checkpoint": None if state.checkpoint is None else state.checkpoint.hex(),
                             "records": state.history.seq, "live_objects": count, "live_bytes": size,
                             "unique_bytes": 0, "shared_bytes": 0,
                             "pins_prefix": _prefix_pinned(history, state, names)})
        for keys, numbers in firsts.batches(1024):
            for position, number in enumerate(numbers):
                if keys[position * KEY_SIZE:(position + 1) * KEY_SIZE] not in shared:
                    rows[number & THREAD_MASK]["unique_bytes"] += number >> THREAD_BITS
    finally:
        for structure in (first, shared, firsts) + ((sizes,) if sizes is not None else ()):
            structure.close()
    for row in rows:
        row["shared_bytes"] = row["live_bytes"] - row["unique_bytes"]
    summary = plan.to_json()
    report = {
        "store": plan.store, "now": int(plan.now),
        "grace_seconds": plan.grace, "expire_reflog_seconds": plan.expire_reflog,
        "roots": {"counts": summary["roots"],
                  "thread": [r.to_doc() for r in plan.root_list if r.kind == "thread"],
                  "reflog": [r.to_doc() for r in plan.root_list if r.kind == "reflog"],
                  "pins": summary["pins"]},
        "threads": rows,
        "kept_without_thread": {"objects": max(0, plan.live["objects"] - threaded_objects),
                                "bytes": max(0, plan.live["bytes"] - threaded_bytes),
                                "why": "reachable only from kept reflog entries or signatures"},
        "live": summary["live"], "reclaimable": summary["reclaimable"],
        "held_by_grace": summary["held_by_grace"], "reflog": summary["reflog"],
        "notes": summary["notes"],
    }
    if result is not None:
        report["result"] = result
    return report


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


REFLOG_LINES = 20  # kept reflog states listed by name in the text report


def render_text(report: dict) -> str:
    """The report for people."""
    counts = report["roots"]["counts"]
    lines = [f"gc report for {report['store']} (grace {report['grace_seconds']} s, "
             f"reflog kept {report['expire_reflog_seconds']} s)",
             f"roots: {counts['thread']} threads, {counts['reflog']} reflog entries, "
             f"{counts['signature']} signatures, {counts['recent']} recent objects, "
             f"{counts['pin']} writes in progress", "", "threads:"]
    for row in report["threads"]:
        line = (f"  {row['thread']}: {row['live_objects']} objects, {_size(row['live_bytes'])} live "
                f"({_size(row['unique_bytes'])} its own, {_size(row['shared_bytes'])} shared with other threads), "
                f"{row['records']} records")
        pin = row["pins_prefix"]
        if pin:
            state = "exists" if pin["parent_exists"] else "deleted; this fork keeps the prefix"
            segment = pin["segment"][:12] if pin["segment"] else "-"
            line += (f"\n    pins the first {pin['seq']} records of {pin['parent']} ({state}), "
                     f"up to segment {segment} (kept whole)")
        lines.append(line)
    kept = report["kept_without_thread"]
    lines += ["", f"kept by reflog or signatures only: {kept['objects']} objects, {_size(kept['bytes'])}",
              f"live: {report['live']['objects']} objects, {_size(report['live']['bytes'])}"]
    rec = report["reclaimable"]
    kinds = ", ".join(f"{k} {v['objects']}" for k, v in sorted(rec["by_kind"].items()))
    lines.append(f"reclaimable: {rec['objects']} objects, {_size(rec['bytes'])}" + (f" ({kinds})" if kinds else ""))
    held = report["held_by_grace"]
    if held["objects"]:
        lines.append(f"held by grace: {held['objects']} objects, {_size(held['bytes'])}, released in "
                     f"{held['releases_from_seconds']}..{held['releases_by_seconds']} s")
    else:
        lines.append("held by grace: nothing")
    lines.append(f"reflog: {report['reflog']['entries']} entries, {report['reflog']['expiring']} expiring")
    kept_states = report["roots"]["reflog"]
    for root in kept_states[:REFLOG_LINES]:  # named as `agentcas reflog THREAD` numbers them
        left = " (the checkpoint it left)" if root.get("left") else ""
        lines.append(f"  {root['name']}: checkpoint {(root['checkpoint'] or '-')[:12]}, seq {root['seq']}{left}")
    if len(kept_states) > REFLOG_LINES:
        lines.append(f"  ... and {len(kept_states) - REFLOG_LINES} more (the JSON report lists all)")
    result = report.get("result")
    if result:
        lines.append(f"deleted: {result['deleted']['objects']} objects, {_size(result['deleted']['bytes'])}; "
                     f"{'complete' if result['complete'] else 'INCOMPLETE (writes in progress)'}")
    lines += [f"note: {note}" for note in report["notes"]]
    return "\n".join(lines)
