"""Named pause points, so tests can act in the middle of a command (a no-op otherwise).

Some safety mechanisms guard against the world changing *during* a command: a thread
moved while a commit snapshots, gc running between a snapshot and its landing, DEST
created while a checkout writes. A test can only prove such a mechanism by pausing
the command at that moment. Each such moment calls `reached("layer.point")` on one
line at the mechanism's site; a test runs code there with `on(point, fn)`. With no
callback registered `reached` is one dict lookup. The points, and the mechanisms
their tests prove, are listed in docs/RELIABILITY.md:

    writer.after_batch      a BatchWriter batch was written (the writer's lease refreshed)
    commit.before_land      the snapshot (and rollout tail) are stored; the ref has not moved
    group.before_land       a group move (the LangGraph saver) stored its objects; no ref has moved
    import.before_write     a bundle is fully verified; pass 2 (writing objects) starts
    import.before_land      a bundle's objects are written; the ref has not moved
    checkout.before_rename  every file is written and verified in the temporary directory
    gc.sweep.before_batch   gc has planned; the next sweep batch is about to begin
    gc.sweep.in_batch       a sweep batch has begun and chosen its deletes; the window check follows
    lease.waiting           a writer's lease row is written but a sweep batch is active; it will retry
    effect.after_lookup     `effect add --id` read the effect's history; its record is not appended yet

This module imports nothing from agentcas, so every layer may call it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

_callbacks: dict[str, list[Callable[[], None]]] = {}


def reached(point: str) -> None:
    """Run the callbacks registered for `point` (none outside tests)."""
    if _callbacks:
        for callback in list(_callbacks.get(point, ())):
            callback()


@contextmanager
def on(point: str, callback: Callable[[], None]) -> Iterator[None]:
    """Run `callback` each time `point` is reached, for the duration of the block."""
    _callbacks.setdefault(point, []).append(callback)
    try:
        yield
    finally:
        _callbacks[point].remove(callback)
        if not _callbacks[point]:
            del _callbacks[point]
