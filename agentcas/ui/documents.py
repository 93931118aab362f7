"""The web view's JSON documents: the documents the CLI prints with `--json`, paged.

Each document is the CLI's, built from the same Store call, with one key added:
`next_cursor`, the value to pass back as `?cursor=` for the next page (None on the last):
  threads          = `agentcas --json branch`            cursor: the last thread name shown
  thread/NAME      = `agentcas --json log NAME`          cursor: the next checkpoint's id
  checkpoint/ID    = `agentcas --json show ID --files`   cursor: the index of the next file
  diff?from=&to=   = `agentcas --json diff FROM TO`      cursor: the index of the next file row
                                                         (added, then removed, then changed)
A cursor is a plain position in an immutable or name-ordered list, so a page costs the same
wherever it starts; the first page of a small store is the CLI's document plus
`"next_cursor": null`. No page holds more than MAX_PAGE items (of its list).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from agentcas.errors import UsageError
from agentcas.ui.reads import StoreReads

MAX_PAGE = 200
DEFAULT_PAGE = 200
_FULL_ID = re.compile(r"^[0-9a-f]{64}$")
DIFF_LISTS = ("added", "removed", "changed")


class BadRequest(UsageError):
    """A query parameter the view cannot use (a malformed cursor or limit)."""


@dataclass(frozen=True)
class PageRequest:
    """Where a page starts and how many items it may hold."""
    cursor: str | None
    limit: int

    @classmethod
    def parse(cls, cursor: str | None, limit: str | None, default: int = DEFAULT_PAGE) -> PageRequest:
        if limit is None or limit == "":
            size = default
        else:
            if not limit.isdigit() or not 1 <= int(limit) <= MAX_PAGE:
                raise BadRequest(f"limit must be a whole number from 1 to {MAX_PAGE}")
            size = int(limit)
        return cls(cursor or None, size)

    def index(self) -> int:
        """The cursor as a list index (0 without one)."""
        if self.cursor is None:
            return 0
        if not self.cursor.isdigit() or len(self.cursor) > 12:
            raise BadRequest("cursor must be the next_cursor of a previous page")
        return int(self.cursor)

    def checkpoint_id(self) -> str | None:
        """The cursor as a full checkpoint id (None without one)."""
        if self.cursor is not None and not _FULL_ID.match(self.cursor):
            raise BadRequest("cursor must be the next_cursor of a previous page (a checkpoint id)")
        return self.cursor


def threads_page(reads: StoreReads, page: PageRequest) -> dict:
    """`branch --json` ({"threads": [...]}), the threads after the cursor's name."""
    rows = reads.threads()
    rows.sort(key=lambda r: r["thread"])
    if page.cursor is not None:
        rows = [r for r in rows if r["thread"] > page.cursor]
    shown = rows[:page.limit]
    more = len(rows) > len(shown)
    return {"threads": shown, "next_cursor": shown[-1]["thread"] if more else None}


def thread_page(reads: StoreReads, name: str, page: PageRequest) -> dict:
    """`log NAME --json` ({"thread", "checkpoints"}), newest first from the cursor's checkpoint."""
    state = reads.thread(name)   # NotFound for an unknown thread, UsageError for a bad name
    start = page.checkpoint_id()
    if start is None:
        if state.checkpoint is None:   # a fork of a rollout without checkpoints: records only
            return {"thread": name, "checkpoints": [], "next_cursor": None}
        start = state.checkpoint.hex()
    entries = reads.log(start, page.limit + 1)
    more = len(entries) > page.limit
    return {"thread": name, "checkpoints": entries[:page.limit],
            "next_cursor": entries[page.limit]["checkpoint"] if more else None}


def checkpoint_page(reads: StoreReads, rev: str, page: PageRequest) -> dict:
    """`show REV --files --json`, its files from the cursor's index."""
    doc = reads.show(rev, files=True)
    start = page.index()
    files = doc["files"]
    doc["files"] = files[start:start + page.limit]
    end = start + len(doc["files"])
    doc["next_cursor"] = str(end) if end < len(files) else None
    return doc


def diff_page(reads: StoreReads, rev1: str | None, rev2: str | None, page: PageRequest) -> dict:
    """`diff REV1 REV2 --json`, its file rows from the cursor's index (added, removed, changed)."""
    if not rev1 or not rev2:
        raise BadRequest("diff needs from= and to= (checkpoint ids, thread names or revisions)")
    doc = reads.diff(rev1, rev2)
    start, room = page.index(), page.limit
    offset = 0
    for key in DIFF_LISTS:
        rows = doc[key]
        first = max(0, start - offset)
        taken = rows[first:first + room] if room > 0 else []
        offset += len(rows)
        room -= len(taken)
        doc[key] = taken
    end = start + page.limit - room
    doc["next_cursor"] = str(end) if end < offset else None
    return doc
