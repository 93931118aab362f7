"""Test-only crash points and faults at the N-th durable step of any command.

Every durable step (a committed store transaction; a file written, fsynced, linked or
renamed by checkout and export) calls `reached(label)` once. Off by default, and then
it costs two environment lookups. The variables, read only here (docs/RELIABILITY.md):

  AGENTCAS_CRASH_COUNT=FILE   append the label of every step reached to FILE, one a line
                              (a counting run: the number of lines is the number of points)
  AGENTCAS_CRASH_AT=N         SIGKILL this process at the N-th step (1-based), or
  AGENTCAS_CRASH_AT=LABEL:N   at the N-th step with that label (e.g. store.commit:2)
  AGENTCAS_FAULT_AT=N|LABEL:N  instead, make that step fail with AGENTCAS_FAULT (an errno
                              name: EIO, ENOSPC, EROFS, EDQUOT...; default EIO), raised as
                              the step's own code would see it (`fault`, else OSError)
  AGENTCAS_CRASH_BATCH=K      at most K objects per batch transaction (read at import), so
                              that small inputs take many durable steps

SIGKILL, not an exception: no `finally`, no atexit, no flush runs, as when the machine
kills a process. A store transaction has two points, `store.open` (its changes made,
the write lock held, not committed) and `store.commit` (committed and synced).
"""

from __future__ import annotations

import errno
import os
import signal
import threading
from collections.abc import Callable

CRASH_AT = "AGENTCAS_CRASH_AT"
CRASH_COUNT = "AGENTCAS_CRASH_COUNT"
CRASH_BATCH = "AGENTCAS_CRASH_BATCH"
FAULT_AT = "AGENTCAS_FAULT_AT"
FAULT = "AGENTCAS_FAULT"

_lock = threading.Lock()
_seen: dict[str, int] = {}  # label -> steps reached; "" -> all steps
_pid = 0


def reached(label: str, fault: Callable[[int], BaseException] | None = None) -> None:
    """One durable step named `label` is done (or, for store.open, about to commit).

    `fault(errno)` builds the exception a real failure of this step raises (py-lmdb's
    for a commit); without it an injected fault is an OSError.
    """
    at, count_file = os.environ.get(CRASH_AT), os.environ.get(CRASH_COUNT)
    fault_at = os.environ.get(FAULT_AT)
    if not (at or count_file or fault_at):
        return
    global _pid
    with _lock:
        if _pid != os.getpid():  # a forked child counts its own steps
            _seen.clear()
            _pid = os.getpid()
        total = _seen[""] = _seen.get("", 0) + 1
        mine = _seen[label] = _seen.get(label, 0) + 1
        if count_file:
            with open(count_file, "a", encoding="utf-8") as out:
                out.write(label + "\n")
    if at and _matches(at, label, total, mine):
        os.kill(os.getpid(), signal.SIGKILL)
    if fault_at and _matches(fault_at, label, total, mine):
        code = getattr(errno, os.environ.get(FAULT) or "EIO")
        raise fault(code) if fault else OSError(code, os.strerror(code))


def _matches(spec: str, label: str, total: int, mine: int) -> bool:
    want_label, _, number = spec.rpartition(":")
    return want_label in ("", label) and int(number) == (mine if want_label else total)


def batch_objects(default: int) -> int:
    """Objects per batch transaction: `default`, or AGENTCAS_CRASH_BATCH when set."""
    value = os.environ.get(CRASH_BATCH)
    return max(1, int(value)) if value else default
