"""Keep a whole-store scan from holding the whole LMDB map in this process's memory.

(The same for gc's on-disk mark table, markset.py: `PageReleaser(None, data_file=...)`;
that mapping is shared and writable, and dropping it loses nothing either: the kernel
keeps dirty pages in the page cache and writes them back.)

gc and fsck read every page of the store once. LMDB maps its data file read-only and
shared; every page read stays mapped in the process (counted in its resident size)
until the kernel reclaims it, so scanning a 400 MB store would show as 400 MB more RSS
(a key-order scan visits leaf pages in file-random order, and the kernel maps 64 KiB
around each fault, so the whole file is mapped after a fraction of the scan).
Every CHECK_EVERY objects read, the scan looks at its file-backed resident size
(/proc/self/statm) and, above MAPPED_BUDGET, asks the kernel to drop this process's
mapping of the data file (madvise MADV_DONTNEED). For a read-only shared file mapping
that loses nothing: the pages stay in the page cache and are faulted back in, unchanged, when
read again. Linux only and best effort; elsewhere, or on any failure, it does nothing.
"""

from __future__ import annotations

import ctypes
import os
import sys

MADV_DONTNEED = 4
CHECK_EVERY = 32  # objects read between two looks (a random read maps ~200 KiB: B-tree path, fault-around)
MAPPED_BUDGET = 64 * 1024 * 1024  # file-backed resident bytes tolerated before a release


class PageReleaser:
    """Call `tick()` per object read; the mapping is released when it grows past the budget."""

    def __init__(self, objects, every: int = CHECK_EVERY, budget: int = MAPPED_BUDGET,
                 data_file: str | None = None):
        path = getattr(objects, "path", None)
        if data_file is None and path:
            data_file = os.path.join(path, "data.mdb")
        self.data_file = os.path.realpath(data_file) if data_file else None
        self.every = every
        self.budget_pages = budget // os.sysconf("SC_PAGE_SIZE")
        self.count = 0
        self._cached: list | None = None
        self._releases = 0
        self._madvise = None
        self._statm: int | None = None
        if self.data_file and sys.platform.startswith("linux"):
            try:
                libc = ctypes.CDLL(None, use_errno=True)
                self._madvise = libc.madvise
                self._madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
            except (OSError, AttributeError):
                self._madvise = None

    def tick(self, n: int = 1) -> None:
        self.count += n
        if self.count >= self.every:
            self.count = 0
            if self._madvise is not None and self._mapped_pages() > self.budget_pages:
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
            spans = [line.split()[0] for line in maps if self.data_file and line.rstrip().endswith(self.data_file)]
        return [(int(start, 16), int(end, 16)) for start, end in (span.split("-") for span in spans)]

    def release(self) -> None:
        if self._madvise is None:
            return
        try:
            # The mapping moves only when the map is resized; re-read it now and then.
            if self._cached is None or self._releases % 64 == 0:
                self._cached = self._ranges()
            self._releases += 1
            for start, end in self._cached:
                if self._madvise(start, end - start, MADV_DONTNEED) != 0:
                    self._cached = None  # the map moved: find it again next time
        except (OSError, ValueError):
            self._madvise = None
