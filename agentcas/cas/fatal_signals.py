"""A damaged store file ends a command with one line, not a bus error.

LMDB reads its file through a memory map and trusts the page offsets it finds there; a
flipped byte can make it read past the end of the file, and the kernel then sends SIGBUS
(or SIGSEGV), which kills Python with no message (exit 135). A Python-level signal
handler cannot help: CPython's C handler only sets a flag and returns, so the faulting
read runs again, forever. This module installs a C-level handler (a ctypes callback given
to libc's signal()) that runs at once, in the faulting thread: it names the damaged page
when it can (agentcas.cas.lmdb_pages reads the file with plain reads, no map), writes one
`agentcas: error:` line pointing to fsck, and ends the process with exit 4 (integrity)
through os._exit, running no other Python code. It is not async-signal-safe in general
(Python code runs inside the handler), but these signals are synchronous: they arrive in
the thread whose read faulted, never between two unrelated operations of the
interpreter.

Only the command line arms it (`arm()`): a library must not take over a host process's
fatal signals. Each LMDB store that opens calls `opened(path)`; the handler is installed
then (importing ctypes costs ~3 ms, paid only by commands that open a store).
"""

from __future__ import annotations

import os
import signal

_armed = False
_installed: list = []          # the ctypes callback (kept alive while installed)
_backends: list[str] = []        # LMDB store directories opened by this process, in order


def arm() -> None:
    """Turn a fatal memory signal into a one-line error in this process (the CLI's call)."""
    global _armed
    _armed = True
    if _backends:
        _install()


def opened(path: str) -> None:
    """Note an LMDB store directory about to be mapped (installs the handler when armed)."""
    if path not in _backends:
        _backends.append(path)
    if _armed:
        _install()


def message(signum: int) -> str:
    """The line written when `signum` kills a read of the stores (also used by the tests)."""
    name = "bus error" if signum == signal.SIGBUS else "segmentation fault"
    store, found = (_backends[-1] if _backends else "?"), "a damaged page"
    try:
        from agentcas.cas.lmdb_pages import damaged_pages
        for path in _backends:
            damaged = [page for page in damaged_pages(os.path.join(path, "data.mdb")) if not page.free]
            if damaged:
                store, found = path, damaged[0].describe()
                break
    except Exception:  # noqa: BLE001 - the report must be written whatever the file holds
        pass
    return (f"agentcas: error: store database is corrupt: reading the store at {store} crashed with a "
            f"{name} at {found}; run 'agentcas fsck' to see what is damaged\n")


def _on_fatal_signal(signum: int) -> None:
    try:
        os.write(2, message(signum).encode("utf-8", "replace"))
    finally:
        os._exit(4)


def _install() -> None:
    if _installed:
        return
    import ctypes  # lazy: only a process that opens a store pays for it
    handler_type = ctypes.CFUNCTYPE(None, ctypes.c_int)
    handler = handler_type(_on_fatal_signal)
    libc = ctypes.CDLL(None)
    libc.signal.restype = ctypes.c_void_p
    libc.signal.argtypes = [ctypes.c_int, handler_type]
    for signum in (signal.SIGBUS, signal.SIGSEGV):
        libc.signal(signum, handler)
    _installed.append(handler)
