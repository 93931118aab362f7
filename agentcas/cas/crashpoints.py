"""Test-only crash points: kill the process at the N-th durable step of any command.

Every durable step (a committed store transaction; a file written, fsynced, linked or
renamed by checkout and export) calls `reached(label)` once. Off by default, and then
it costs one environment lookup. Two variables, read only here (docs/RELIABILITY.md):

  AGENTCAS_CRASH_COUNT=FILE   append the label of every step reached to FILE, one a line
                              (a counting run: the number of lines is the number of points)
  AGENTCAS_CRASH_AT=N         SIGKILL this process at the N-th step (1-based), or
  AGENTCAS_CRASH_AT=LABEL:N   at the N-th step with that label (e.g. store.commit:2)
  AGENTCAS_CRASH_BATCH=K      at most K objects per batch transaction (read at import), so
                              that small inputs take many durable steps

SIGKILL, not an exception: no `finally`, no atexit, no flush runs, as when the machine
kills a process. A store transaction has two points, `store.open` (its changes made,
the write lock held, not committed) and `store.commit` (committed and synced).
"""

from __future__ import annotations

import os
import signal
import threading

CRASH_AT = "AGENTCAS_CRASH_AT"
CRASH_COUNT = "AGENTCAS_CRASH_COUNT"
CRASH_BATCH = "AGENTCAS_CRASH_BATCH"

_lock = threading.Lock()
_seen: dict[str, int] = {}  # label -> steps reached; "" -> all steps
_pid = 0


def reached(label: str) -> None:
    """One durable step named `label` is done (or, for store.open, about to commit)."""
    at, count_file = os.environ.get(CRASH_AT), os.environ.get(CRASH_COUNT)
    if not at and not count_file:
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
        if at:
            want_label, _, number = at.rpartition(":")
            if int(number) == (mine if want_label else total) and want_label in ("", label):
                os.kill(os.getpid(), signal.SIGKILL)


def batch_objects(default: int) -> int:
    """Objects per batch transaction: `default`, or AGENTCAS_CRASH_BATCH when set."""
    value = os.environ.get(CRASH_BATCH)
    return max(1, int(value)) if value else default
