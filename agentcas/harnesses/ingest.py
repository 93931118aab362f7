"""Incremental, byte-exact ingest of harness session files into threads.

A thread's rollout is its file's complete lines, stored as they are (a damaged line is
kept, so `rollout cat` equals the file, and reported; replay skips it). Each run, per file:

1. `stat`. If size, mtime and inode equal what the last run recorded (IngestState: rows
   of this machine's stat cache) and its thread still exists (one listing of the thread names
   a run), the file is unchanged: nothing else.
2. Otherwise the thread (named from the content, discovery.py) must hold a prefix of
   the file: the file is not shorter than the stored bytes, and those bytes are the
   stored ones: hashed whole (BLAKE3) against the digest the last run recorded when the
   file only grew, else hashed record by record against the thread's prefix digest. A
   file that fails this was rewritten or truncated: it is refused by name and the other
   files go on (exit 1 at the end).
3. The bytes after the stored prefix, up to the last newline, are new lines (a partial
   last line waits for the next run). A checkpoint is placed after every turn boundary
   record (Codex `task_complete`/`turn_aborted`; Claude: a new real user prompt closes
   the turn before it) and one at the end of what was read, each with a bounded reason.
4. New lines and checkpoints of many files land through `Store.ingest_append` in a few
   transactions (all or nothing each); then the state rows are written (they are only a
   cache: the threads are the truth, so a lost row costs a re-check, not data).

SIGKILL at any point leaves whole lines only (the transaction either landed or not).
"""

from __future__ import annotations

import json
import os
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import blake3

from agentcas.cas import crashpoints
from agentcas.cas.sealed import seal, unseal
from agentcas.errors import AgentcasError, ConflictError, IntegrityError, NotFound, UsageError
from agentcas.harnesses import discovery
from agentcas.harnesses.records import CLAUDE, CODEX, FORMATS, iter_lines, parse_line, preview
from agentcas.harnesses.turns import ClaudeTurns, turn_tracker
from agentcas.refs.names import check_thread_name
from agentcas.refs.threads import ForkOrigin
from agentcas.result import Result

STATE_KEY = b"\x01ingest\0"      # statcache rows of ingest (the snapshot's start with "/" or NUL)
BATCH_BYTES = 64 * 1024 * 1024
BATCH_FILES = 512
CONTEXT_BYTES = 4 * 1024 * 1024     # re-read of an open turn, for its prompt in the reason
END_OF_READ = "ingest of "   # the reason of a checkpoint at the end of what a run read
END_MARKS_BACK = 64          # end-of-read checkpoints walked back to find the open turn's start
WORKER_BYTES = 32 * 1024 * 1024     # a run reading at least this much (in 2+ files) uses worker processes
WORKERS = 2
READ_AHEAD_BYTES = 2 * BATCH_BYTES  # files read (by workers) ahead of the one being taken
READ_AHEAD_FILES = 64


class SessionRefused(AgentcasError):
    """A session file that cannot be ingested (rewritten, truncated, no id)."""


@dataclass
class FileReport:
    """What one run did with one file."""

    path: str
    thread: str | None = None
    status: str = "unchanged"        # ingested | unchanged | waiting | refused
    appended: int = 0
    first_seq: int = 0
    seq: int = 0
    checkpoints: list = field(default_factory=list)
    skipped_lines: list = field(default_factory=list)
    partial_bytes: int = 0
    error: str | None = None

    def to_json(self) -> dict:
        return {"path": self.path, "thread": self.thread, "status": self.status, "appended": self.appended,
                "first_seq": self.first_seq, "seq": self.seq, "checkpoints": self.checkpoints,
                "skipped_lines": self.skipped_lines, "partial_bytes": self.partial_bytes, "error": self.error}


# --- the state file ---------------------------------------------------------------------------

class IngestState:
    """Per-file ingest state (size, mtime, inode, bytes ingested, thread, head digest): a cache.

    Rows of this machine's stat cache (`statcache` of `Backends.local`, beside the workspace
    snapshot's rows, sealed like them), keyed by the file's absolute path: the LMDB
    environment of a directory store, this machine's cache of a shared store, the memory
    of a `memory://` store (so a `--watch` there stats only, too). A stat describes a file
    on this machine, so the state is per machine, never in the shared metadata.
    """

    def __init__(self, local, harness: str, named: bool = False):
        self.local = local
        self.harness = harness   # a row counts only for a run of the harness that wrote it
        self.named = named   # this run's threads are named by --thread, not by the files
        self.entries: dict = {}
        self._dirty: set = set()

    @staticmethod
    def _key(path: str) -> bytes:
        key = STATE_KEY + os.fsencode(path)
        # LMDB keys hold at most 511 bytes: a longer path's key is its hash.
        return key if len(key) <= 480 else STATE_KEY + b"#" + blake3.blake3(key).digest()

    def load(self, paths) -> None:
        """Read the rows of `paths` (absolute) in one read transaction."""
        with self.local.reader() as txn:
            for path in paths:
                if path in self.entries:
                    continue
                key = self._key(path)
                value = txn.get("statcache", key)
                if value is None:
                    continue
                try:
                    entry = json.loads(unseal("statcache", key, value))
                except (ValueError, IntegrityError):
                    continue   # a damaged row only costs a re-check of the file
                if isinstance(entry, dict) and entry.get("path") == path:
                    self.entries[path] = entry

    def unchanged(self, key: str, st: os.stat_result, thread: str | None = None) -> bool:
        """Whether the file is as the row last saw it, ingested by this run's harness into the
        thread this run would use: `thread` (--thread), or the file's own (a row written under
        --thread does not count for a run without it, nor for one naming another thread; a
        row of `ingest codex` not for `ingest claude`, which must look at the file to refuse
        it; a row from before rows named their harness costs one look)."""
        entry = self.entries.get(key)
        return entry is not None and (entry["size"], entry["mtime_ns"], entry["ino"]) == \
            (st.st_size, st.st_mtime_ns, st.st_ino) and bool(entry.get("named")) == (thread is not None) \
            and (thread is None or entry["thread"] == thread) and entry.get("harness") == self.harness

    def record(self, key: str, st: os.stat_result, thread: str, history: dict, turn_seq: int,
               prefix: bytes | None = None) -> None:
        """`prefix`: the BLAKE3 of the file's first `history["offset"]` bytes, if known."""
        self.entries[key] = {"path": key, "size": st.st_size, "mtime_ns": st.st_mtime_ns, "ino": st.st_ino,
                             "thread": thread, "bytes": history["offset"], "seq": history["seq"],
                             "digest": history["digest"], "turn_seq": turn_seq, "harness": self.harness}
        if self.named:
            self.entries[key]["named"] = True
        if prefix is not None:
            self.entries[key]["prefix"] = prefix.hex()
        self._dirty.add(key)

    def save(self) -> None:
        if not self._dirty:
            return
        rows = []
        for path in sorted(self._dirty):
            key = self._key(path)
            payload = json.dumps(self.entries[path], sort_keys=True, separators=(",", ":")).encode()
            rows.append((key, seal("statcache", key, payload)))

        def put(txn):
            for key, value in rows:
                txn.put("statcache", key, value)
        self.local.write(put)
        crashpoints.reached("ingest.state.write")
        self._dirty.clear()


# --- one run -----------------------------------------------------------------------------------

@dataclass
class _Pending:
    report: FileReport
    key: str
    st: os.stat_result
    append: Any              # SessionAppend
    turn_seq: int
    size: int                # bytes of new lines
    prefix: bytes | None = None  # BLAKE3 of the file's bytes through the new lines (IngestState)
    session: Any = None   # discovery.SessionFile: to plan the file again if its thread moved


@dataclass
class _Planned:
    """A file whose stored prefix was checked: what is left is reading its new lines (the job)."""

    report: FileReport
    key: str
    st: os.stat_result
    thread: str
    row: Any                 # the thread's ThreadInfo as listed at the start of the run (None: new)
    parent: str | None       # the thread it links to in `lineage` (a fork's parent, a subagent's session)
    job: Any                 # new_lines.NewLinesJob
    session: Any = None   # discovery.SessionFile


class _Ready:
    """A result read in-process, with the two methods of the future a worker's would be."""

    def __init__(self, value):
        self.value = value

    def done(self) -> bool:
        return True

    def result(self):
        return self.value


class Ingest:
    """Ingest runs over a set of paths (one run, or many with --watch) into one store."""

    def __init__(self, store, harness: str, paths, thread: str | None = None):
        if harness not in FORMATS:
            raise UsageError(f"unknown harness {harness!r}: use codex or claude")
        self.store = store
        self.harness = harness
        self.paths = list(paths)
        self.thread = thread
        if thread is not None:
            check_thread_name(thread)
        self.state = IngestState(store.backends.local, harness, named=thread is not None)
        self._inflight: Any = None  # (executor, future) of the batch landing in the background
        self._moved: list | None = []   # files whose thread moved under them (another ingest): planned again once
        self._workers: Any = None  # packing_workers.PackingWorkers of a large run

    def run(self) -> list[FileReport]:
        """One pass over the paths: every file's report (refused ones carry their error)."""
        files, missing = discovery.find_sessions(self.harness, self.paths)
        if self.thread is not None and len(files) > 1:
            raise UsageError(f"--thread names one session, but {len(files)} files were found")
        reports = [FileReport(path, status="refused", error=(
            f"not a regular file or directory: {path}" if os.path.exists(path)   # a FIFO, a device
            else f"no such file or directory: {path}")) for path in missing]
        self.state.load([os.path.abspath(session.path) for session in files])
        changed = []
        names = None
        inodes: set = set()
        for session in files:
            report = FileReport(session.path)
            reports.append(report)
            try:
                st = os.stat(session.path)
            except OSError as exc:
                report.status, report.error = "refused", f"cannot stat {session.path}: {exc.strerror}"
                continue
            key = os.path.abspath(session.path)
            if (st.st_dev, st.st_ino) in inodes:
                reports.pop()   # the same file by another path (a link): one file, one report
                continue
            inodes.add((st.st_dev, st.st_ino))
            if self.state.unchanged(key, st, self.thread):
                if names is None:   # one listing a run: a stat-unchanged file's thread must still exist
                    names = self.store.threads.names()
                entry = self.state.entries[key]
                if entry["thread"] in names:
                    report.thread, report.seq, report.first_seq = entry["thread"], entry["seq"], entry["seq"]
                    continue
                # its thread was deleted: the state is only a cache, the file is ingested again
            changed.append((session, report, st, key))
        if changed:
            self._ingest(changed)
        self.state.save()
        return reports

    def _ingest(self, changed: list) -> None:
        """Plan, read and land the changed files, in order, in batches of BATCH_BYTES/BATCH_FILES.

        A file is planned here (its thread, the stored prefix checked against it); its new
        lines are read, classified and packed (new_lines.py) in this process, or, when the
        run has WORKER_BYTES or more to read, in worker processes (packing_workers.py) while
        the next files are planned; results are taken in file order and batches land in the
        background while the next files are read.
        """
        guess = sum(max(0, st.st_size - self.state.entries.get(key, {}).get("bytes", 0))
                    for _, _, st, key in changed)
        if len(changed) > 1 and guess >= WORKER_BYTES:
            from agentcas.harnesses.packing_workers import PackingWorkers
            self._workers = PackingWorkers(WORKERS)
            self._workers.start()   # their interpreters start while the threads are listed and files planned
        threads = {row.thread: row for row in self.store.threads.list()}
        pending: list[_Pending] = []
        forks: list[_Pending] = []
        reading: deque = deque()   # (planned, future) in file order
        state: dict[str, Any] = {"pending": pending, "bytes": 0, "ahead": 0, "planned": False}
        claimed: set = set()   # threads a file of this pass lands in
        later: list = []       # files of a thread already claimed: planned again after this pass
        try:
            for session, report, st, key in changed:
                try:
                    planned = self._plan(session, st, key, report, threads)
                except (SessionRefused, IntegrityError, NotFound, UsageError) as exc:
                    report.status, report.error = "refused", str(exc)
                    continue
                except OSError as exc:
                    report.status, report.error = "refused", f"cannot read {session.path}: {exc.strerror}"
                    continue
                if planned is None:
                    continue
                if planned.thread in claimed:
                    # Another file of this pass (a copy, a resumed Claude session) lands in this
                    # thread first: this one is planned against what that one leaves.
                    later.append((session, report, st, key))
                    continue
                claimed.add(planned.thread)
                reading.append((planned, self._read(planned.job)))
                state["ahead"] += planned.job.size
                while reading and (state["ahead"] > READ_AHEAD_BYTES or len(reading) > READ_AHEAD_FILES
                                   or reading[0][1].done()):
                    self._take(reading.popleft(), threads, forks, state)
            state["planned"] = True
            while reading:
                self._take(reading.popleft(), threads, forks, state)
        except BaseException:
            if self._workers is not None:
                self._workers.close(abandon=True)
                self._workers = None
            raise
        finally:
            if self._workers is not None:
                self._workers.close()
                self._workers = None
        self._land_in_background(None)
        self._land(state["pending"])
        self._land_forks(forks)
        if later:
            self._ingest(later)
        if self._moved:
            # Another process landed in their threads while they were read (two ingests of
            # one directory at once): planned again against what it stored, they append
            # what it did not, or are unchanged; a second loss is refused by name.
            moved, self._moved = self._moved, None
            try:
                self._ingest(moved)
            finally:
                self._moved = []

    def _land_forks(self, forks: list) -> None:
        """Land the Codex forks whose parent was not stored when they were planned, each
        after its parent (a fork of a fork of this run waits for the fork it copies), with
        the copy measured against the parent as landed."""
        from dataclasses import replace
        while forks:
            threads = {item.append.thread for item in forks}
            ready = [item for item in forks if item.append.forked_from.thread not in threads] or forks
            for item in ready:
                parent = item.append.forked_from.thread
                copied, claim = self._copied(parent, item.append.data)
                item.append = replace(item.append, forked_from=ForkOrigin(parent, None, copied), copies=claim)
            self._land(ready)
            landed = {id(item) for item in ready}
            forks = [item for item in forks if id(item) not in landed]

    def _read(self, job):
        """The NewLines of `job` to come (a future's `done`/`result`): from a worker, or read now."""
        if self._workers is not None and not self._workers.failed:
            return self._workers.submit(job)
        from agentcas.harnesses.new_lines import read_new_lines
        return _Ready(read_new_lines(job))

    def _take(self, reading, threads: dict, forks: list, state: dict) -> None:
        """Turn one file's NewLines into a pending append; land a full batch in the background."""
        planned, future = reading
        state["ahead"] -= planned.job.size
        lines = future.result()
        if lines is None:   # its worker died: read it here (and the next files too: _read)
            from agentcas.harnesses.new_lines import read_new_lines
            lines = read_new_lines(planned.job)
        report = planned.report
        if lines.error is not None:
            report.status, report.error = "refused", lines.error
            return
        item = self._finish(planned, lines, threads)
        if item is None:
            return
        if self.harness == CODEX and item.append.forked_from is not None \
                and item.append.forked_from.thread not in threads:
            forks.append(item)   # its parent may land in this run: link it after, measuring the copy
            return
        state["pending"].append(item)
        state["bytes"] += lines.size
        idle = self._inflight is None or self._inflight[1].done()
        if state["bytes"] >= BATCH_BYTES or len(state["pending"]) >= BATCH_FILES or (state["planned"] and idle):
            # Land as we go, in the background: the next files are read and classified
            # while this batch is written (LMDB). Once every file is planned, whatever
            # was read lands whenever no batch is landing, so that little is left to
            # land after the last file is read (that part is not overlapped).
            self._land_in_background(state["pending"])
            state["pending"], state["bytes"] = [], 0

    # -- per file ----------------------------------------------------------------------------
    def _plan(self, session, st, key, report: FileReport, threads: dict) -> _Planned | None:
        """The file's thread, its stored prefix checked against the file, and the job that reads the rest."""
        from agentcas.api.history import INGEST_ZSTD_LEVEL
        from agentcas.cas.objects import EMPTY_POSITION
        from agentcas.harnesses.new_lines import NewLinesJob
        with open(session.path, "rb") as handle:
            identity = self._identity(session)
            if identity is None:
                if discovery.identity_to_come(self.harness, handle):
                    report.status, report.partial_bytes = "waiting", st.st_size
                    return None
                what = "session_meta with a payload.id" if self.harness == CODEX else "record with a sessionId"
                raise SessionRefused(f"{session.path}: no {what} in its first lines: not a {self.harness} "
                                     "session (use --thread NAME to name it anyway)")
            thread = identity.thread
            check_thread_name(thread)
            report.thread = thread
            row = threads.get(thread)
            based_on = None if row is None else row.history
            stored = 0 if based_on is None else based_on.offset
            seq = 0 if based_on is None else based_on.seq
            if st.st_size < stored:
                raise SessionRefused(f"{session.path} is shorter ({st.st_size} bytes) than the {stored} bytes "
                                     f"already ingested into {thread}: it was truncated or rewritten; "
                                     "not ingested")
            known_prefix = None
            if seq:
                entry = self.state.entries.get(key)
                grew = entry is not None and entry["thread"] == thread and entry["ino"] == st.st_ino \
                    and st.st_size > entry["size"] and entry["bytes"] == stored
                if grew and entry is not None and isinstance(entry.get("prefix"), str) \
                        and len(entry["prefix"]) == 64:
                    known_prefix = bytes.fromhex(entry["prefix"])   # the job re-hashes the prefix
                else:
                    check_stored_prefix(session.path, handle, thread, based_on)
        report.first_seq = report.seq = seq
        entry = self.state.entries.get(key, {})
        turn_seq = entry.get("turn_seq", 0) if entry.get("thread") == thread else None
        tracker, turn_seq = self._context(thread, row, turn_seq)
        fork = self.harness == CODEX and row is None and identity.parent is not None and identity.parent != thread
        job = NewLinesJob(session.path, st.st_ino, stored, seq, (based_on or EMPTY_POSITION).digest.raw, tracker,
                          turn_seq or 0, self.harness == CLAUDE, INGEST_ZSTD_LEVEL, st.st_size - stored,
                          keep_data=fork, prefix_digest=known_prefix, hash_prefix=stored > 0, thread=thread)
        return _Planned(report, key, st, thread, row, identity.parent, job, session)

    def _finish(self, planned: _Planned, lines, threads: dict) -> _Pending | None:
        """The append of a file's new lines (None if there is nothing to land), with its end mark."""
        from agentcas.api.history import SessionAppend
        report, row, thread, seq = planned.report, planned.row, planned.thread, planned.job.seq
        report.partial_bytes, report.skipped_lines = lines.partial_bytes, lines.skipped
        marks, count, name = list(lines.marks), lines.count, preview(os.path.basename(report.path), 160)
        if count and (not marks or marks[-1][0] != count):
            marks.append((count, f"{END_OF_READ}{name}: {seq + count} lines read"))
        elif not count and row is not None and seq and (row.checkpoint is None
                                                        or self._checkpoint_seq(row) != seq):
            marks.append((0, f"{END_OF_READ}{name}: {seq} lines read"))
        if not count and not marks:
            report.status = "waiting" if report.partial_bytes else "unchanged"
            if row is not None:
                self.state.record(planned.key, planned.st, thread, row.history.to_doc(), lines.turn_seq,
                                  lines.prefix_digest)
            return None
        origin = claim = None
        if row is None and planned.parent is not None and planned.parent != thread:
            copied, claim = self._copied(planned.parent, lines.data) \
                if self.harness == CODEX and planned.parent in threads else (0, None)
            origin = ForkOrigin(planned.parent, None, copied)
        based_on = None if row is None else row.history
        append = SessionAppend(thread, lines.data, tuple(marks), based_on, origin, lines.packed, claim)
        return _Pending(report, planned.key, planned.st, append, lines.turn_seq, lines.size, lines.prefix_digest,
                        planned.session)

    def _identity(self, session):
        """The file's thread and parent link; `--thread NAME` renames the thread, keeps the link."""
        found = discovery.identify_file(self.harness, session)
        if self.thread is None:
            return found
        return discovery.SessionIdentity(self.thread, None if found is None else found.parent)

    def _checkpoint_seq(self, row) -> int | None:
        try:
            return self.store.checkpoints.show(row.checkpoint).history.seq
        except AgentcasError:
            return None

    def _boundary_seq(self, checkpoint: str | None) -> int:
        """The seq of the newest turn-boundary checkpoint at or before `checkpoint` along its
        first parents (an end-of-read mark, `ingest of ...`, is no boundary: the turn open
        then started before it), 0 if there is none within END_MARKS_BACK checkpoints."""
        for _ in range(END_MARKS_BACK):
            if checkpoint is None:
                return 0
            try:
                doc = self.store.checkpoints.show(checkpoint)
            except AgentcasError:
                return 0
            if not doc.reason.startswith(END_OF_READ):
                return doc.history.seq
            checkpoint = doc.parents[0] if doc.parents else None
        return 0

    def _context(self, thread: str, row, turn_seq):
        """A turn tracker primed with the stored records of the open turn (for its prompt)."""
        tracker = turn_tracker(self.harness)
        if row is None or not row.history.seq:
            return tracker, 0
        head_seq = row.history.seq
        if turn_seq is None:   # no row of this machine says: the newest turn boundary does
            turn_seq = max(0, self._boundary_seq(row.checkpoint) - 1)
        start = max(0, min(turn_seq, head_seq))
        data, size = [], 0
        for piece in self.store.history.read(thread, start, head_seq):
            data.append(piece)
            size += len(piece)
            if size >= CONTEXT_BYTES:
                break
        if start > 0 and isinstance(tracker, ClaudeTurns):
            tracker.count = 1   # the thread's first prompt is behind the open turn
        from agentcas.harnesses.line_kinds import line_kind
        for _, raw in iter_lines(b"".join(data)):
            is_object, kind, payload_kind = line_kind(raw)
            if is_object and tracker.wants(kind, payload_kind):
                tracker.feed(raw, parse_line(raw, fast=True))
        return tracker, start

    def _copied(self, parent: str, new: bytes) -> tuple[int, Any]:
        return codex_fork_copy(self.store, parent, new)

    # -- landing -----------------------------------------------------------------------------
    def _land_in_background(self, batch: list[_Pending] | None) -> None:
        """Wait for the batch landing now; then start landing `batch` (None: just wait)."""
        inflight = self._inflight
        if inflight is not None:
            self._inflight = None
            inflight[1].result()   # re-raises what the landing raised
            inflight[0].shutdown()
        if batch:
            from concurrent.futures import ThreadPoolExecutor
            pool = ThreadPoolExecutor(1)
            self._inflight = (pool, pool.submit(self._land, batch))

    def _land(self, pending: list[_Pending]) -> None:
        batch, size = [], 0
        for item in pending:
            batch.append(item)
            size += item.size
            if size >= BATCH_BYTES or len(batch) >= BATCH_FILES:
                self._land_batch(batch)
                batch, size = [], 0
        if batch:
            self._land_batch(batch)

    def _land_batch(self, batch: list[_Pending]) -> None:
        try:
            results = self.store.history.ingest([item.append for item in batch])
        except ConflictError:
            if len(batch) == 1:
                item = batch[0]
                if self._moved is not None and item.session is not None:
                    self._moved.append((item.session, item.report, item.st, item.key))   # planned again
                    return
                item.report.status, item.report.error = "refused", (
                    f"{item.report.path}: thread {item.append.thread} moved while it was read; run ingest again")
                return
            for item in batch:   # land the others; name the one that lost its race
                self._land_batch([item])
            return
        from agentcas.harnesses import damaged_lines
        rows = []
        for item, result in zip(batch, results):
            # The damaged lines of what landed, for replay's skipped_lines (damaged_lines.py).
            row = damaged_lines.advance(self.store.backends.local, item.append.thread, item.append.based_on,
                                        result.history,
                                        [line - 1 for line in item.report.skipped_lines])
            if row is not None:
                rows.append(row)
        damaged_lines.write_rows(self.store.backends.local, rows)
        for item, result in zip(batch, results):
            report = item.report
            report.status = "ingested"
            report.appended = result.appended
            report.first_seq = result.first_seq
            report.seq = result.history.seq
            report.checkpoints = result.checkpoints
            self.state.record(item.key, item.st, item.append.thread, result.history.to_doc(), item.turn_seq,
                              item.prefix)


def codex_fork_copy(store, parent: str, new: bytes) -> tuple[int, Any]:
    """How many of the parent's records a Codex fork's new lines copied (same record, new
    timestamp), and the rollout.CopyClaim that its lines after its own session_meta copy
    them, as of the parent's head now (None when none did): the append stores those that are
    byte for byte copies, timestamp apart, as copies (ingest and the hook alike)."""
    try:
        parent_head = store.threads.get(parent).history
    except AgentcasError:
        return 0, None
    lines = list(iter_lines(new))[1:]  # after the fork's own session_meta
    if not lines or not parent_head.seq:
        return 0, None
    pieces = store.history.read_at(parent_head, 0, min(parent_head.seq, len(lines)))
    count = 0
    for (_, mine), (_, theirs) in zip(lines, iter_lines(pieces)):
        a, b = parse_line(mine), parse_line(theirs)
        if a is None or b is None or a.get("type") != b.get("type") or a.get("payload") != b.get("payload"):
            break
        count += 1
    from agentcas.lineage.rollout import CopyClaim
    return count, CopyClaim(parent_head, 1, count) if count else None


def check_stored_prefix(path, handle, thread, based_on) -> None:
    """Refuse a file whose first `based_on.offset` bytes do not hash to the stored history.

    Used when the file did not simply grow since the last run (new inode, same size with
    a new mtime, no state), or its state has no prefix digest yet (the run after a file's
    first): an edit anywhere in the stored part is found. A file that only grew is
    checked by its job instead, against the whole-bytes digest the last run recorded.
    """
    import blake3

    from agentcas.cas.digest import chain_prefix
    from agentcas.cas.objects import EMPTY_POSITION
    handle.seek(0)
    digest, seq, remaining, carry = EMPTY_POSITION.digest, 0, based_on.offset, b""
    while remaining > 0:
        piece = handle.read(min(remaining, 8 * 1024 * 1024))
        if not piece:
            break
        remaining -= len(piece)
        data = carry + piece
        start = 0
        while True:
            end = data.find(b"\n", start)
            if end < 0:
                break
            digest = chain_prefix(digest, blake3.blake3(data[start:end + 1]).digest())
            seq += 1
            start = end + 1
        carry = data[start:]
    if carry or seq != based_on.seq or digest != based_on.digest:
        raise SessionRefused(f"{path} differs from what was already ingested into {thread} (it was "
                             "rewritten or edited, not appended to); not ingested")


@dataclass(frozen=True)
class WatchTotals(Result):
    """What `ingest --watch` did before it was stopped: passes run, records and checkpoints ingested."""

    passes: int
    appended: int
    checkpoints: int


@dataclass(frozen=True)
class IngestSummary(Result):
    """An ingest run: every file's report, counts by status, records and checkpoints ingested,
    the files refused; with --watch, the totals over its passes (the reports are the last pass's)."""

    OMIT_NONE = frozenset({"watch"})

    files: list[FileReport]
    counts: dict[str, int]     # status -> files
    appended: int
    checkpoints: int
    refused: list[str]         # the refused files' paths
    watch: WatchTotals | None = None


def summary(reports: list[FileReport], watch: WatchTotals | None = None) -> IngestSummary:
    """The summary of an ingest run (of a watch's last pass, with its totals)."""
    counts: dict[str, int] = {}
    for report in reports:
        counts[report.status] = counts.get(report.status, 0) + 1
    return IngestSummary(list(reports), counts, sum(r.appended for r in reports),
                         sum(len(r.checkpoints) for r in reports),
                         [r.path for r in reports if r.status == "refused"], watch)


def watch(ingest: Ingest, stop, on_run, interval: float = 0.25) -> list[FileReport]:
    """Run passes until `stop()` is true; `on_run(reports)` after each; the last pass's reports."""
    reports = ingest.run()
    on_run(reports)
    while not stop():
        deadline = time.monotonic() + interval
        while time.monotonic() < deadline and not stop():
            time.sleep(0.02)
        if stop():
            break
        reports = ingest.run()
        on_run(reports)
    return reports
