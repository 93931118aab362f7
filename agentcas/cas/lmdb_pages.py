"""Check the page structure of an LMDB data file by reading it, not by mapping it.

LMDB trusts what its pages say: a node offset, a key size, a child or overflow page
number. A flipped byte there makes it read past the end of the file through its memory
map, and the kernel answers with SIGBUS, which kills the interpreter before any Python
code can say why. So fsck reads `data.mdb` with plain reads first and checks, page by
page, what LMDB would follow:

1. The newer meta page (of pages 0 and 1) gives the page size and the last page in use;
   the file must hold every page up to it.
2. Every branch and leaf page up to the last one: its number matches its position, its
   free-space bounds lie inside the page, each node offset points inside the page and
   the node (header, key, and the data or page number it carries) ends inside it; every
   page number a node names (a child, an overflow run) lies inside the file. Overflow
   runs are skipped over whole (their later pages hold raw data, no header).
3. For a report, each damaged page is named with the database whose tree holds it
   (walked from the meta page through the named databases; damaged pages are not
   followed), or marked free: a free page is never read, so its damage is harmless.

The format is LMDB 0.9's on a 64-bit machine (py-lmdb's bundled library): a 16-byte
page header (number, pad, flags, lower and upper bounds), 2-byte node offsets after it,
8-byte node headers (two 16-bit halves of the data size or child page, flags, key size).
Free pages keep the content they had when they were in use, so they pass the same checks.
"""

from __future__ import annotations

import os
import struct
from array import array
from dataclasses import dataclass

PAGE_HEADER = 16
NODE_HEADER = 8
P_BRANCH, P_LEAF, P_OVERFLOW, P_META, P_LEAF2 = 0x01, 0x02, 0x04, 0x08, 0x20
F_BIGDATA, F_SUBDATA = 0x01, 0x02
MDB_MAGIC = 0xBEEFC0DE
_META = struct.Struct("<IIQQ")            # magic, version, address, map size
_DB = struct.Struct("<IHHQQQQQ")          # pad (page size in the free db), flags, depth, counts, root
_PAGE = struct.Struct("<QHHHH")           # number, pad, flags, lower, upper
_NODE = struct.Struct("<HHHH")            # lo, hi, flags, key size
_INVALID_PAGE = 0xFFFFFFFFFFFFFFFF
READ_PAGES = 256                          # pages read per system call


@dataclass(frozen=True)
class DamagedPage:
    """A page LMDB would misread, and what is wrong with it."""

    page: int
    problem: str
    database: str | None = None  # the database whose tree holds it
    free: bool = False           # in no database's tree: LMDB never reads it

    def describe(self, file_name: str = "data.mdb") -> str:
        where = (f" (in the {self.database!r} database)" if self.database
                 else " (a free page, in no database's tree)" if self.free else "")
        return f"page {self.page} of {file_name}{where}: {self.problem}"


@dataclass(frozen=True)
class _Meta:
    page_size: int
    last_page: int
    txnid: int
    main_root: int


def _read_meta(handle) -> _Meta | str:
    """The newer valid meta page, or what is wrong with both."""
    found: list[_Meta] = []
    head = os.pread(handle, 2 * 4096, 0)
    for index in (0, 1):
        # The page size is not known until a meta page is read: the first one sits at 0,
        # the second at the page size the first one declares (or 4096).
        offset = 0 if index == 0 else (found[0].page_size if found else 4096)
        data = head[offset:offset + 4096] if offset + 4096 <= len(head) else os.pread(handle, 4096, offset)
        if len(data) < PAGE_HEADER + _META.size + 2 * _DB.size + 16:
            continue
        magic, _, _, _ = _META.unpack_from(data, PAGE_HEADER)
        if magic != MDB_MAGIC:
            continue
        at = PAGE_HEADER + _META.size
        free_db = _DB.unpack_from(data, at)
        main_db = _DB.unpack_from(data, at + _DB.size)
        last_page, txnid = struct.unpack_from("<QQ", data, at + 2 * _DB.size)
        page_size = free_db[0]
        if page_size < 512 or page_size & (page_size - 1):
            continue
        found.append(_Meta(page_size, last_page, txnid, main_db[7]))
    if not found:
        return "neither meta page (0, 1) is a valid LMDB meta page"
    return max(found, key=lambda meta: meta.txnid)


def _page_problem(page: bytes, number: int, page_size: int, last_page: int) -> str | None:
    """What LMDB would misread on a branch or leaf page, or None."""
    pgno, _, flags, lower, upper = _PAGE.unpack_from(page)
    if pgno != number:
        return f"its header says it is page {pgno}"
    if flags & P_LEAF2:
        return None  # fixed-size keys, no node offsets (agentcas opens no such database)
    if lower < PAGE_HEADER or lower % 2 or upper > page_size or lower > upper:
        return f"free-space bounds {lower}..{upper} do not fit in a {page_size}-byte page"
    offsets = array("H", page[PAGE_HEADER:lower])
    if offsets and (min(offsets) < upper or max(offsets) > page_size - NODE_HEADER):
        index, offset = next((i, o) for i, o in enumerate(offsets)
                             if o < upper or o > page_size - NODE_HEADER)
        return f"node {index}'s offset {offset} lies outside the page's nodes ({upper}..{page_size})"
    for index, offset in enumerate(offsets):
        lo, hi, node_flags, key_size = _NODE.unpack_from(page, offset)
        key_end = offset + NODE_HEADER + key_size
        if flags & P_BRANCH:
            child = lo | hi << 16 | node_flags << 32
            if key_end > page_size:
                return f"node {index}'s key ({key_size} bytes) runs past the page"
            if not 2 <= child <= last_page:
                return f"node {index} names child page {child}, outside the file (pages 2..{last_page})"
            continue
        size = 8 if node_flags & F_BIGDATA else lo | hi << 16
        if key_end + size > page_size:
            return f"node {index}'s key and data ({key_size} + {size} bytes) run past the page"
        if node_flags & F_BIGDATA:
            (overflow,) = struct.unpack_from("<Q", page, key_end)
            if not 2 <= overflow <= last_page:
                return f"node {index} names overflow page {overflow}, outside the file (pages 2..{last_page})"
    return None


def damaged_pages(path: str) -> list[DamagedPage]:
    """Every page of the LMDB data file at `path` that LMDB would misread (empty: none)."""
    handle = os.open(path, os.O_RDONLY)
    try:
        meta = _read_meta(handle)
        if isinstance(meta, str):
            return [DamagedPage(0, meta)]
        size = os.fstat(handle).st_size
        pages = size // meta.page_size
        if meta.last_page >= pages:
            return [DamagedPage(meta.last_page, f"the meta page says the file holds {meta.last_page + 1} pages, "
                                                f"it holds {pages}")]
        damaged = {}
        number, skip_to = 2, 2
        while number <= meta.last_page:
            count = min(READ_PAGES, meta.last_page + 1 - number)
            block = os.pread(handle, count * meta.page_size, number * meta.page_size)
            for at in range(0, len(block), meta.page_size):
                if number >= skip_to:
                    page = block[at:at + meta.page_size]
                    flags = _PAGE.unpack_from(page)[2]
                    if flags & P_OVERFLOW:
                        run = struct.unpack_from("<I", page, 12)[0]
                        if run < 1 or number + run - 1 > meta.last_page:
                            damaged[number] = f"overflow run of {run} pages runs past the file"
                        else:
                            skip_to = number + run
                    elif flags & (P_BRANCH | P_LEAF):
                        problem = _page_problem(page, number, meta.page_size, meta.last_page)
                        if problem is not None:
                            damaged[number] = problem
                number += 1
        if not damaged:
            return []
        owners = _owners(handle, meta, set(damaged))
        return [DamagedPage(page, problem, owners.get(page), free=page not in owners)
                for page, problem in sorted(damaged.items())]
    finally:
        os.close(handle)


def _owners(handle, meta: _Meta, damaged: set[int]) -> dict[int, str]:
    """The database whose tree holds each damaged page (walking only sound pages)."""
    owners: dict[int, str] = {}
    roots = [(meta.main_root, "(main)")]
    while roots:
        root, name = roots.pop()
        todo = [root] if root != _INVALID_PAGE else []
        seen = set()
        while todo:
            number = todo.pop()
            if number in seen or not 2 <= number <= meta.last_page:
                continue
            seen.add(number)
            if number in damaged:
                owners[number] = name
                continue
            page = os.pread(handle, meta.page_size, number * meta.page_size)
            _, _, flags, lower, _ = _PAGE.unpack_from(page)
            if not flags & (P_BRANCH | P_LEAF) or flags & P_LEAF2:
                continue
            for offset in array("H", page[PAGE_HEADER:lower]):
                lo, hi, node_flags, key_size = _NODE.unpack_from(page, offset)
                if flags & P_BRANCH:
                    todo.append(lo | hi << 16 | node_flags << 32)
                elif node_flags & F_SUBDATA and name == "(main)":
                    key = page[offset + NODE_HEADER:offset + NODE_HEADER + key_size]
                    sub_root = _DB.unpack_from(page, offset + NODE_HEADER + key_size)[7]
                    roots.append((sub_root, key.decode("utf-8", "replace")))
    return owners
