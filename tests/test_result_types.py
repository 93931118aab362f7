"""Typed results render exactly the documents their layers made (the CLI's --json is these)."""

from __future__ import annotations

import time

from agentcas import Store
from agentcas.api.results import FsckReport, GcPlanSummary, GcResult
from agentcas.cas.leases import Lease
from agentcas.gc.fsck import fsck
from agentcas.gc.sweep import execute

from support.gc_stores import write_files


def _store_with_garbage(tmp_path) -> Store:
    store, _ = Store.init(str(tmp_path / "store"))
    write_files(tmp_path / "ws", {"a.txt": b"a" * 5000, "b.txt": b"b"})
    store.checkpoints.commit(str(tmp_path / "ws"), "one", "gone")
    store.checkpoints.commit(str(tmp_path / "ws"), "two", "main")
    store.threads.delete("gone")
    return store


def test_a_plan_summary_renders_the_plan_document_it_was_read_from(tmp_path):
    store = _store_with_garbage(tmp_path)
    with Lease(store.meta, "a write in progress"):   # a pin, so `pins` holds one
        plan = store.gc.plan(grace=3600, expire_reflog=0)
    try:
        doc = plan.to_json()
        summary = GcPlanSummary.from_doc(doc)
        assert summary.to_json() == doc
        assert summary.held_by_grace.objects > 0 and summary.held_by_grace.releases_by_seconds is not None
        assert [p.what for p in summary.pins] == ["a write in progress"]
        assert summary.reclaimable.by_kind == {} and summary.live.objects == doc["live"]["objects"]
    finally:
        plan.close()


def test_a_sweep_result_renders_the_sweep_document_it_was_read_from(tmp_path):
    store = _store_with_garbage(tmp_path)
    plan = store.gc.plan(grace=0, expire_reflog=0, now=time.time() + 5)
    try:
        doc = execute(store.backends, plan, wait=0)
    finally:
        plan.close()
    result = GcResult.from_doc(doc)
    assert result.to_json() == doc
    assert result.deleted_objects > 0 and result.repack is not None
    assert result.repack.packs_rewritten == doc["repack"]["packs_rewritten"]


def test_an_fsck_report_renders_the_fsck_document_it_was_read_from(tmp_path):
    store = _store_with_garbage(tmp_path)
    doc = fsck(store.backends)
    report = FsckReport.from_doc(doc)
    assert report.to_json() == doc and report.ok and report.packs is not None
    assert report.packs.count == doc["packs"]["count"]
