"""Keep a whole-store scan from holding the whole LMDB map in this process's memory.

gc and fsck read every page of the store once. LMDB maps its data file read-only and
shared; every page read stays mapped in the process (counted in its resident size)
until the kernel reclaims it, so scanning a 400 MB store would show as 400 MB more RSS
(a key-order scan visits leaf pages in file-random order, and the kernel maps 64 KiB
around each fault, so the whole file is mapped after a fraction of the scan).
gc's scratch tables (markset.py: the spilled mark table) are mapped files too, shared
and writable; dropping that mapping loses nothing either: the kernel keeps dirty pages
in the page cache and writes them back.

One budget for the process: every PageReleaser registers its file in a process-wide
list, and a release drops this process's mapping of every registered file (madvise
MADV_DONTNEED), so two mappings growing side by side (the store and the mark table
spilled beside it) cannot hold twice the budget between them. Every CHECK_EVERY ticks a
releaser looks at the process's file-backed resident size (/proc/self/statm) and, above
MAPPED_BUDGET, releases. For a shared file mapping that loses nothing: the pages stay in
the page cache and are faulted back in, unchanged, when read again. Linux only and best
effort; elsewhere, or on any failure, it does nothing.
"""

from __future__ import annotations

import ctypes
import os
import sys

MADV_DONTNEED = 4
CHECK_EVERY = 16  # objects read between two looks (a random read maps ~256 KiB: B-tree path, fault-around)
MAPPED_BUDGET = 40 * 1024 * 1024  # file-backed resident bytes (libraries included) tolerated before a release

_registered: set[str] = set()   # files whose mapping any release drops
_generation = [0]               # bumped when a file is registered: cached ranges are stale


def _libc_madvise():
    if not sys.platform.startswith("linux"):
        return None
    try:
        madvise = ctypes.CDLL(None, use_errno=True).madvise
        madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
        return madvise
    except (OSError, AttributeError):
        return None


class PageReleaser:
    """Call `tick()` per object read; every registered mapping is released when the
    process's file-backed resident size passes the budget."""

    def __init__(self, objects, every: int = CHECK_EVERY, budget: int = MAPPED_BUDGET,
                 data_file: str | None = None):
        path = getattr(objects, "path", None)
        if data_file is None and path:
            data_file = os.path.join(path, "data.mdb")
        self.data_file = os.path.realpath(data_file) if data_file else None
        if self.data_file and self.data_file not in _registered:
            _registered.add(self.data_file)
            _generation[0] += 1
        self.every = every
        self.budget_pages = budget // os.sysconf("SC_PAGE_SIZE")
        self.count = 0
        self._cached: list | None = None
        self._cached_generation = -1
        self._releases = 0
        self._madvise = _libc_madvise()
        self._statm: int | None = None

    def tick(self, n: int = 1) -> None:
        self.count += n
        if self.count >= self.every:
            self.count = 0
            if self._madvise is not None and _registered and self._mapped_pages() > self.budget_pages:
                self.release()

    def _mapped_pages(self) -> int:
        """Resident file-backed (shared) pages of this process (statm kept open, re-read)."""
        try:
            if self._statm is None:
                self._statm = os.open("/proc/self/statm", os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            return int(os.pread(self._statm, 128, 0).split()[2])
        except (OSError, ValueError, IndexError):
            self._madvise = None
            return 0

    def __del__(self):
        if getattr(self, "_statm", None) is not None:
            try:
                os.close(self._statm)
            except OSError:
                pass

    def _ranges(self) -> list[tuple[int, int]]:
        with open("/proc/self/maps") as maps:
            spans = [line.split()[0] for line in maps
                     if line.rstrip().rpartition(" ")[2] in _registered]
        return [(int(start, 16), int(end, 16)) for start, end in (span.split("-") for span in spans)]

    def release(self) -> None:
        if self._madvise is None:
            return
        try:
            # A mapping moves only when a map is resized or a file is registered or
            # closed; re-read them now and then.
            if self._cached is None or self._cached_generation != _generation[0] or self._releases % 64 == 0:
                self._cached, self._cached_generation = self._ranges(), _generation[0]
            self._releases += 1
            for start, end in self._cached:
                if self._madvise(start, end - start, MADV_DONTNEED) != 0:
                    self._cached = None  # a map moved: find them again next time
        except (OSError, ValueError):
            self._madvise = None


class TickingReads:
    """A metadata transaction whose scans tick a PageReleaser per row: rows of a small
    table are scattered over the store's file, and each page read maps ~256 KiB here (the
    page cache's large folios), so a scan of 8,000 refs mapped 68 MiB before gc looked."""

    def __init__(self, txn, pages: PageReleaser):
        self._txn = txn
        self._pages = pages

    def scan(self, *args, **kwargs):
        for row in self._txn.scan(*args, **kwargs):
            self._pages.tick()
            yield row

    def __getattr__(self, name):
        return getattr(self._txn, name)


def forget(data_file: str) -> None:
    """Stop releasing `data_file` (its mapping is closed)."""
    _registered.discard(os.path.realpath(data_file))
    _generation[0] += 1
