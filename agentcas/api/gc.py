"""`store.gc`: plan and execute a gc, explain why an object lives, verify the store (fsck).

The work is gc/'s: `plan_gc` marks from every root and classifies every object
(deleting nothing), `execute` sweeps a plan, `explain` walks to one object, `fsck`
verifies everything. This group only turns their documents into typed results.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentcas.api.results import FsckReport, GcExplanation, GcReport, GcResult
from agentcas.gc_defaults import BATCH_DELETES, DEFAULT_EXPIRE_REFLOG, DEFAULT_GRACE, DEFAULT_WAIT

if TYPE_CHECKING:
    from agentcas.api import Progress
    from agentcas.gc.plan import GcPlan
    from agentcas.repository import Store


class Gc:
    """Garbage collection and verification of a store (`store.gc`)."""

    def __init__(self, store: Store):
        self._backends = store.backends

    def plan(self, grace: int = DEFAULT_GRACE, expire_reflog: int = DEFAULT_EXPIRE_REFLOG,
             now: float | None = None) -> GcPlan:
        """Mark from every root and classify every object (deletes nothing): a gc.plan.GcPlan."""
        from agentcas.gc.plan import plan_gc
        return plan_gc(self._backends, now, grace, expire_reflog)

    def execute(self, plan: GcPlan, wait: float = DEFAULT_WAIT, progress: Progress | None = None,
                batch: int = BATCH_DELETES) -> GcResult:
        """Carry out a GcPlan (gc/sweep.py): expire reflog entries, delete garbage, settle."""
        from agentcas.gc.sweep import execute
        return GcResult.from_doc(execute(self._backends, plan, wait=wait, batch=batch, progress=progress))

    def run(self, grace: int = DEFAULT_GRACE, expire_reflog: int = DEFAULT_EXPIRE_REFLOG,
            dry_run: bool = False, report: bool = False, wait: float = DEFAULT_WAIT,
            progress: Progress | None = None,
            now: float | None = None, batch: int = BATCH_DELETES) -> GcReport:
        """Plan and (unless dry_run) execute a gc; with `report`, the lineage report too."""
        from agentcas.gc.report import build_report
        plan = self.plan(grace, expire_reflog, now)
        try:
            result = None if dry_run else self.execute(plan, wait, progress, batch)
            lineage = build_report(self._backends, plan, None if result is None else result.to_json()) \
                if report else None
            return GcReport(dry_run, plan.to_json(), result, lineage)
        finally:
            plan.close()  # its marks and candidates may hold temporary files

    def explain(self, object_id: str, grace: int = DEFAULT_GRACE,
                expire_reflog: int = DEFAULT_EXPIRE_REFLOG) -> GcExplanation:
        """Why an object is alive (the path from a root to it), or that it is unreachable."""
        from agentcas.gc.explain import explain
        return GcExplanation(explain(self._backends, object_id, grace=grace, expire_reflog=expire_reflog))

    def fsck(self, progress: Progress | None = None) -> FsckReport:
        """Verify every object, row, position and closure."""
        from agentcas.gc.fsck import fsck
        return FsckReport(**fsck(self._backends, progress))
