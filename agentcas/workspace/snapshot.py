"""Snapshot a directory into trees, file entries and chunks.

1. Walk: regular files and directories only (symlinks, hardlinked files, devices,
   fifos and sockets are refused, naming the path); names checked; the store's own
   directory skipped, and what `.agentcasignore` files exclude: gitignore syntax, in
   any directory, patterns relative to it; as in git, for each path the last matching
   pattern of the deepest file with a match decides (`!` re-includes), and nothing
   inside an excluded directory is looked at.
2. Stat cache: a file whose (size, mtime_ns, inode, ctime_ns) match the cache and
   whose objects are still stored is not read again, as git's index does. Entries
   younger than RACY_NS are not cached (a same-tick rewrite would go unseen).
3. Secret scan of every file not taken from the cache, before anything is stored.
4. Store: two worker threads read, chunk (FastCDC), hash (BLAKE3) and compress
   (zstd), all of which release the GIL; the main thread writes batches. A file is
   fstat'ed before and after reading; if it changed it is read again (3 tries), and
   if its stat differs from the walk's (the scan may have read another version) the
   bytes being stored are scanned again. Each worker reads into
   one reused buffer (chunks are views into it, copied once, into their framed
   value), so a GiB of files costs no GiB of fresh pages.
   Files over STREAM_BYTES are never held whole: they are scanned in overlapping
   windows, and stored by the writing thread chunk by chunk as read (FastCDC over the
   stream cuts exactly where it cuts the whole buffer). A window of chunks is stored
   only after its bytes were scanned (with the overlap: secrets.WindowScan) and an fstat
   showed the file unchanged; a change abandons the attempt (3 tries). Memory stays at
   a window plus the writer's batch. A secret longer than the 64 KiB overlap that
   straddles two windows is missed where a whole-file scan would find it.
5. Trees are built bottom-up and returned as the root tree id.
6. Directory cache: each directory's listing (every entry's name and stat signature:
   mode, size, mtime, inode, ctime, links) is marshalled into one byte string on the
   lister's thread; its own digest covers that, the stat signatures of the ignore files in
   it and above it, and the snapshot's options. A directory whose own digest equals its
   row's is not looked at entry by entry: its subdirectories and its counts are the row's
   (a 100,000-file walk then costs little beyond the lstat of every entry). Its stat digest
   adds its subdirectories' stat digests, so it changes when anything below it does; a
   directory whose stat digest equals the row's reuses the row's tree whole. Only the
   directories on the path to a changed file are built again (one edit in 100,000 files:
   ~3 trees), their unchanged files taken from their listing and the stat cache.
   A directory with an entry changed within RACY_NS, below an ignore file changed within
   it, or holding (below it) an allowed or skipped secret gets no row.

With `git_aware` (the harness hooks and rewind: the workspace as a git user sees it),
`.git` is never entered or read and `.gitignore` files count as ignore files (a
directory's `.gitignore` patterns first, its `.agentcasignore` after them, so the latter
can re-include). With `skip_secrets`, a file that looks like a credential is left out of
the tree and named in `skipped_secrets` instead of refusing the snapshot.
"""

from __future__ import annotations

import bisect
import fnmatch
import json
import marshal
import operator
import os
import stat
import struct
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import blake3

from agentcas.cas import framing
from agentcas.cas.digest import EMPTY, Digest, hash_blob
from agentcas.cas.names import BadName, check_name, check_unique
from agentcas.cas.objects import MODE_EXEC, MODE_FILE, ChunkList, ChunkRef, Tree, TreeEntry
from agentcas.cas.sealed import seal, unseal
from agentcas.cas.source import ObjectSource, load_object
from agentcas.cas.store import TableEnvironment
from agentcas.cas.writer import BatchWriter
from agentcas.errors import AgentcasError, IntegrityError

if TYPE_CHECKING:
    pass

IGNORE_FILE = ".agentcasignore"
GIT_IGNORE_FILE = ".gitignore"
GIT_DIR = ".git"
DIR_CACHE_KEY = b"\x03tree\0"   # statcache rows of the directory cache (files' start with "/" or NUL)
_DIR_ROW = struct.Struct(">B32s32s32sQQ")   # version 2, own digest, stat digest, tree id, files, bytes; then subdirs
_OWN_HEAD = struct.Struct(">III")   # the lengths of the options tag, ignore context and skipped names, before them
# What a directory listing records of each entry (besides its name): a listing of equal
# signatures is one the directory cache may take as unchanged.
_STAT_SIG = operator.attrgetter("st_mode", "st_size", "st_mtime_ns", "st_ino", "st_ctime_ns", "st_nlink")
_NAME = operator.attrgetter("name")
_MTIME = operator.attrgetter("st_mtime_ns")
_CTIME = operator.attrgetter("st_ctime_ns")
RACY_NS = 2_000_000_000
READ_TRIES = 3
WORKERS = 2
LISTER_THREADS = 2  # threads listing directories ahead of the walk
IN_FLIGHT_BYTES = 256 * 1024 * 1024
STREAM_BYTES = 256 * 1024 * 1024  # larger files are streamed, not read whole
# Changed files up to this many bytes in all are stored on the calling thread: starting
# and joining two workers cost more than they save for the few small files of an agent
# step (a 300-step loop on disk, load ~5: ~11 ms of each ~30 ms commit waited on them).
INLINE_BYTES = 1024 * 1024
MAX_CACHE_KEY = 511  # LMDB's default maximum key size
# The writing (main) thread is the critical path: LMDB copies every byte twice, into
# its pages and then into the file. With two workers, three threads share two cores,
# and `perf sched` found the writer preempted for 0.65 s of a 1 GiB commit. Workers
# therefore run slightly below the writer's priority (Linux: niceness is per thread).
# Measured on 1 GiB of random data, in-process, 2 runs each: idle machine 2.3-3.2 s at
# +0, 1.8-2.6 s at +2, 2.0-2.3 s at +5; with two CPU-bound processes running, 3.7-3.9 s
# at +0, 4.1-4.8 s at +2, 4.8-5.6 s at +5 (and ~5x slower at +10, where the workers
# give way to every other process). +2 takes most of the gain for a small cost.
WORKER_NICENESS = 2


# Stat-cache rows already unsealed and parsed in this process: {key: (row bytes, (sig, TreeEntry))}.
_DECODED_ROWS: dict = {}
_DECODED_ROWS_MAX = 200_000


# A directory holding this file is a restored copy of a checkpoint (the MCP server's
# restore_checkpoint writes one into the agent's workspace): it is left out of snapshots,
# or the next checkpoint would store the restored copy beside the files it came from.
RESTORED_MARKER = ".agentcas-restored"


class WorkspaceError(AgentcasError):
    """The workspace holds something agentcas will not snapshot."""


class SecretFound(AgentcasError):
    """A file (its bytes or its name) or the reason looks like it holds a credential.

    `finding` says where (never the secret), `allow` the --allow-secret argument that
    would let it be stored; a caller that cannot pass that flag (an MCP agent) words its
    own advice from them.
    """

    def __init__(self, finding: str, allow: str | None = None):
        self.finding, self.allow = finding, allow
        super().__init__(f"{finding}; nothing was committed (use --allow-secret {allow} if it is meant to be "
                         "stored)" if allow else finding)


class _SkippedSecret(SecretFound):
    """A file that looks like a credential, left out of a skip_secrets snapshot (found by
    the scan before storing; one that turns secret while it is stored refuses the snapshot)."""


class FileChanged(AgentcasError):
    """A file kept changing while it was read."""


class FileTooLarge(AgentcasError):
    """A file does not fit in memory (files are read whole while they are stored)."""


def _too_large(item: FileItem) -> FileTooLarge:
    return FileTooLarge(f"not enough memory to read {item.rel} ({item.st.st_size} bytes); "
                        "nothing was committed")


@dataclass(slots=True)
class FileItem:
    rel: str
    path: str
    st: os.stat_result
    entry: TreeEntry | None = None  # set when known (cache hit or stored)
    secret: str | None = None       # why it was left out (skip_secrets)




@dataclass
class SnapshotStats:
    files: int = 0
    bytes: int = 0
    cached_files: int = 0
    unchanged_files: int = 0  # the cached ones, and those read again that equal the previous tree's
    read_bytes: int = 0
    new_objects: int = 0
    new_bytes: int = 0


def _signature(st: os.stat_result) -> tuple:
    return (st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns)


# Stat-cache rows (docs/FORMAT.md section 4): version 2 is fixed binary, so a fresh process
# checks 1,000 rows without a JSON parse and hex decoding per row; version-1 JSON rows of
# older stores are still used.
_ROW = struct.Struct(">BQqQqHB")  # version, size, mtime_ns, inode, ctime_ns, mode, has chunks


def _encode_cache_row(sig: tuple, entry: TreeEntry) -> bytes:
    head = _ROW.pack(2, *sig, entry.mode, entry.chunks is not None)
    return head + entry.id.raw + (b"" if entry.chunks is None else entry.chunks.raw)


def _decode_cache_row(payload: bytes, name: str) -> tuple | None:
    """(signature, entry) of a stat-cache row, or None for a row this version cannot use."""
    try:
        if payload[:1] == b"{":
            doc = json.loads(payload)  # version 1; our own sealed cache: no canonical check
            return tuple(doc["sig"]), TreeEntry.from_doc(dict(doc["entry"], name=name))
        if len(payload) not in (_ROW.size + 32, _ROW.size + 64) or payload[0] != 2:
            return None
        _, size, mtime, ino, ctime, mode, chunked = _ROW.unpack_from(payload)
        if chunked != (len(payload) == _ROW.size + 64):
            return None
        file_id = Digest(payload[_ROW.size:_ROW.size + 32])
        chunks = Digest(payload[_ROW.size + 32:]) if chunked else None
        return (size, mtime, ino, ctime), TreeEntry(name, "file", file_id, mode, size, chunks)
    except (ValueError, KeyError, TypeError, IntegrityError):
        return None


class Snapshotter:
    def __init__(self, objects: ObjectSource, local: TableEnvironment, root: str, allow_secrets=(),
                 progress=None, skip_dirs=(), skip_files=(), lease=None, known=None,
                 previous_tree: Digest | None = None, git_aware: bool = False, skip_secrets: bool = False,
                 dir_cache_epoch: bytes | None = None, held: dict | None = None):
        # `local` is this machine's environment (its stat cache); `known(keys)` the objects
        # this machine knows are stored (the store itself, or a shared store's local
        # cache): the commit re-checks `needed` against the real store before landing.
        self.objects = objects
        self.local = local
        self.known = known or objects.blobs.has_many  # an embedded store answers itself
        self.chunk_sizes = objects.blobs.chunk_sizes
        self.root = os.path.realpath(root)
        self.allow_secrets = tuple(allow_secrets)
        self.progress = progress
        self.skip_dirs = {os.path.realpath(d) for d in skip_dirs}
        self.skip_files = {os.path.realpath(f) for f in skip_files}
        self.stats = SnapshotStats()
        self.previous_tree = previous_tree  # the thread's head tree, to tell unchanged files
        # Every object id the resulting tree depends on directly (trees, file objects,
        # chunks of new chunk lists): the commit re-checks them in its final transaction,
        # so a concurrent gc that removed an old object we deduplicated against is caught.
        self.needed: set[bytes] = set()
        self.allowed_secrets: set[str] = set()
        # A shared store's writer uploads in the background while the workers go on hashing.
        # With `held`, its last batch is left there for the commit's move to store (writer.py).
        self.writer = BatchWriter(objects, lease=lease, known=known, background=known is not None, held=held)
        self._ignores: dict[str, Any] = {}  # directory rel path -> its ignore files' spec (or lines, uncompiled)
        self.git_aware = git_aware
        # The directory cache is used only with an epoch (the gc sweeps begun: a sweep may
        # delete objects below a tree it has not reached yet, so any sweep retires the rows).
        self.dir_cache_epoch = dir_cache_epoch
        self.skip_secrets = skip_secrets
        self.skipped_secrets: list[str] = []   # "path: why" of files left out (skip_secrets)
        self._ignore_names = (GIT_IGNORE_FILE, IGNORE_FILE) if git_aware else (IGNORE_FILE,)
        self._counts: dict[str, tuple[int, int]] = {}   # rel dir -> (files, bytes) it holds, when looked at
        self._unlooked: dict[str, _Listing] = {}  # rel dir -> listing of a directory taken from its row
        self._uncacheable: set[str] = set()    # dirs holding a racy file or a secret (not cached)
        self._own_digests: dict[str, bytes] = {}   # rel dir -> digest of its listing, ignore files, options
        self._cached_rows: dict[str, tuple | None] = {}
        self._started_ns = time.time_ns()
        self._buffers = threading.local()  # one read buffer per worker thread

    # -- walk ---------------------------------------------------------------------------
    def _load_ignore(self, rel_dir: str, listing: _Listing) -> list:
        """Read `rel_dir`'s ignore files (.agentcasignore; with git_aware .gitignore first);
        the listing's stats of those read. Their patterns are compiled when first needed
        (`_spec`): a walk whose directories are all unchanged never needs pathspec."""
        lines, read = [], []
        for file_name in self._ignore_names:
            st = listing.stat_of(file_name)
            if st is None or not stat.S_ISREG(st.st_mode):
                continue  # a symlink or directory of that name is refused or walked as usual
            read.append(st)
            path = os.path.join(self.root, rel_dir, file_name)
            with open(path, encoding="utf-8-sig", errors="replace") as handle:  # a BOM is not a pattern
                lines += handle.read().splitlines()
        if lines:
            self._ignores[rel_dir] = lines
        return read

    def _spec(self, rel_dir: str) -> _IgnoreSpec | None:
        spec = self._ignores.get(rel_dir)
        if isinstance(spec, list):
            import pathspec  # only when a changed directory needs it: it costs ~10 ms to import
            spec = self._ignores[rel_dir] = _IgnoreSpec(pathspec.GitIgnoreSpec.from_lines(spec))
        return spec

    def _ignored(self, rel: str, is_dir: bool) -> bool:
        """Whether the ignore files of `rel`'s ancestors exclude it (the deepest match decides)."""
        if not self._ignores:
            return False
        parts = rel.split("/")
        for depth in range(len(parts) - 1, -1, -1):  # deepest directory first
            spec = self._spec("/".join(parts[:depth]))
            if spec is None:
                continue
            below = "/".join(parts[depth:]) + ("/" if is_dir else "")
            include = spec.include(below)
            if include is not None:
                return include
        return False

    def walk(self) -> dict[str, list]:
        """Map of directory rel path ('' = root) -> list of (name, os.stat_result | 'dir'); `run`
        makes FileItems of the files of the directories it does not reuse."""
        if not os.path.isdir(self.root):
            raise WorkspaceError(f"workspace is not a directory: {self.root}")
        with self.local.reader() as txn:
            return self._walk(txn)

    def _walk(self, txn) -> dict[str, list]:
        """Directories are listed and their entries lstat'ed ahead of this loop, on the
        lister's threads (`_DirectoryLister`); this loop decides, in the order the
        directories were found, what each entry is and what enters the snapshot."""
        with _DirectoryLister() as lister:
            return self._walk_listed(txn, lister)

    def _walk_listed(self, txn, lister: _DirectoryLister) -> dict[str, list]:
        """A directory whose listing (every entry's name and stat), ignore files (its own
        and its ancestors') and options are those its directory-cache row was written
        from is not looked at entry by entry: its subdirectories are the row's, its files
        are made FileItems only if its tree must be built again (`_file_items`)."""
        dirs: dict[str, list] = {}
        racy_before = self._started_ns - RACY_NS
        tag = self._options_tag()
        skipped_in = self._skipped_in()
        lister.request(self.root, top=True)
        order = [""]   # directories in the order they were requested (found)
        # rel dir -> (the stat signatures of its and its ancestors' ignore files, any racy)
        contexts: dict[str, tuple[bytes, bool]] = {"": (b"", False)}
        for rel_dir in order:
            abs_dir = os.path.join(self.root, rel_dir) if rel_dir else self.root
            try:
                listing = lister.result()
                ignore_stats = self._load_ignore(rel_dir, listing)
            except OSError as exc:
                raise WorkspaceError(f"cannot read directory {abs_dir}: {exc.strerror}") from None
            context, racy = contexts.pop(rel_dir)
            if ignore_stats:
                context += marshal.dumps([_STAT_SIG(st) for st in ignore_stats], 2)
                racy = racy or any(max(st.st_mtime_ns, st.st_ctime_ns) > racy_before for st in ignore_stats)
            skipped = skipped_in.get(abs_dir, b"")
            if racy or listing.newest > racy_before:
                self._uncacheable.add(rel_dir)
            own = blake3.blake3(_OWN_HEAD.pack(len(tag), len(context), len(skipped)), max_threads=1)
            for part in (tag, context, skipped, listing.key):
                own.update(part)
            self._own_digests[rel_dir] = own.digest()
            row = self._dir_row(txn, rel_dir) if self.dir_cache_epoch is not None else None
            if row is not None and row[1] == self._own_digests[rel_dir]:
                # The names were checked when the row was written, under the same rules.
                children: list[tuple[str, Any]] = [(name, "dir") for name in row[6]]
                self._unlooked[rel_dir] = listing
                self.stats.files += row[4]
                self.stats.bytes += row[5]
            else:
                children, files, size = self._children(rel_dir, abs_dir, listing)
                self._check_names(rel_dir, [name for name, _ in children])
                self._counts[rel_dir] = (files, size)
                self.stats.files += files
                self.stats.bytes += size
            prefix = f"{rel_dir}/" if rel_dir else ""
            for name, item in children:
                if item == "dir":
                    order.append(prefix + name)
                    contexts[prefix + name] = (context, racy)
                    lister.request(f"{abs_dir}/{name}")
            dirs[rel_dir] = children
        return dirs

    def _children(self, rel_dir: str, abs_dir: str, listing: _Listing, files_only: bool = False):
        """([(name, "dir" or os.stat_result)], files, bytes) of the entries of a directory
        that enter the snapshot; with `files_only`, its files only."""
        children: list[tuple[str, Any]] = []
        files = size = 0
        prefix = f"{rel_dir}/" if rel_dir else ""
        ignores = bool(self._ignores)
        is_dir_mode, is_reg_mode = stat.S_ISDIR, stat.S_ISREG
        for name, st in zip(listing.names, listing.stats):
            if name == GIT_DIR and self.git_aware:
                continue  # never entered, never read
            mode = st.st_mode
            path = f"{abs_dir}/{name}"
            if is_dir_mode(mode):
                if files_only:
                    continue
                # Skipped and ignored entries first: .agentcasignore can leave out a file
                # whose name could not be stored.
                # `path` is already canonical: the root is a real path and the walk
                # never enters a symlink (realpath here cost O(depth) lstats per entry).
                if (name == ".agentcas" or path in self.skip_dirs
                        or os.path.isfile(os.path.join(path, RESTORED_MARKER))):
                    continue
                if ignores and self._ignored(prefix + name, True):
                    continue
                children.append((name, "dir"))
                continue
            if ignores and self._ignored(prefix + name, False):
                continue
            if self.skip_files and path in self.skip_files:
                continue
            if not is_reg_mode(mode):
                self._check_names(rel_dir, [name])   # a bad name is named first, as it always was
                if stat.S_ISLNK(mode):
                    raise WorkspaceError(f"symlinks are not supported: {prefix + name}")
                raise WorkspaceError(f"not a regular file or directory (device, fifo or socket): {prefix + name}")
            if st.st_nlink > 1:
                self._check_names(rel_dir, [name])
                raise WorkspaceError(f"hardlinked file (link count {st.st_nlink}) is not supported: "
                                     f"{prefix + name}")
            children.append((name, st))   # a FileItem only if the directory is not reused (run)
            files += 1
            size += st.st_size
        return children, files, size

    def _check_names(self, rel_dir: str, names: list) -> None:
        prefix = f"{rel_dir}/" if rel_dir else ""
        for name in names:
            try:
                name.encode("utf-8")
                check_name(name)
            except (UnicodeEncodeError, BadName):
                raise WorkspaceError(f"file name not allowed in a checkpoint: {prefix + name!r}") from None
            if not self.skip_secrets:  # a hook never blocks over a name; it keeps the file
                self._check_name_secret(rel_dir, name, prefix + name)
        try:
            check_unique(names, rel_dir)
        except BadName as exc:
            raise WorkspaceError(str(exc)) from None

    # -- stat cache ---------------------------------------------------------------------------
    def _cache_key(self, item: FileItem) -> bytes:
        key = os.fsencode(self.root) + b"\0" + item.rel.encode("utf-8")
        # LMDB keys hold at most 511 bytes; a deep path's key is replaced by its hash
        # (a leading NUL, which no real path starts with, keeps the two forms apart).
        return key if len(key) <= MAX_CACHE_KEY else b"\0" + blake3.blake3(key).digest()

    def _from_cache(self, txn, item: FileItem) -> TreeEntry | None:
        key = self._cache_key(item)
        value = txn.get("statcache", key)
        if value is None:
            return None
        # A process that commits again (a harness holding Store open) finds the same row
        # bytes as last time: their checked, decoded form is remembered, keyed by the bytes.
        remembered = _DECODED_ROWS.get(key)
        if remembered is not None and remembered[0] == value:
            sig, entry = remembered[1]
        else:
            try:
                payload = unseal("statcache", key, value)
            except IntegrityError:
                return None  # a damaged cache entry only costs a re-read
            decoded = _decode_cache_row(payload, item.path.rsplit("/", 1)[-1])
            if decoded is None:
                return None
            sig, entry = decoded
            if len(_DECODED_ROWS) >= _DECODED_ROWS_MAX:
                _DECODED_ROWS.clear()
            _DECODED_ROWS[key] = (bytes(value), (sig, entry))  # the key holds the path, so the name
        if sig != _signature(item.st):
            return None
        if entry.mode != _mode(item.st):
            return None
        return entry

    def _cache_rows(self, items: list[FileItem]) -> list[tuple[bytes, bytes]]:
        rows = []
        for item in items:
            if item.entry is None or self._started_ns - item.st.st_mtime_ns < RACY_NS:
                continue
            if item.rel in self.allowed_secrets:
                continue
            if self._started_ns - item.st.st_ctime_ns < RACY_NS:
                continue
            key = self._cache_key(item)
            rows.append((key, seal("statcache", key, _encode_cache_row(_signature(item.st), item.entry))))
        return rows

    # -- secrets ------------------------------------------------------------------------------
    def _allowed(self, rel: str) -> bool:
        return any(fnmatch.fnmatchcase(rel, glob) for glob in self.allow_secrets)

    def _check_name_secret(self, rel_dir: str, name: str, rel: str) -> None:
        """Refuse a file or directory name that looks like a credential (never echoing it)."""
        from agentcas.workspace import secrets  # lazy: see _store_files
        finding = secrets.scan_text(name, rel)
        if finding is not None and not self._allowed(rel):
            where = f"directory {rel_dir!r}" if rel_dir else "the workspace's top directory"
            raise SecretFound(f"possible secret ({finding.rule}) in the name of an entry of {where}",
                              "with a glob matching its path")

    def _check_secret(self, rel: str, data: bytes | memoryview, lines_before: int = 0, sniff: bool = True) -> None:
        """Refuse `data` if it holds a secret; `lines_before`: newlines in the file before
        `data` (a window of a streamed file)."""
        from agentcas.workspace import secrets  # lazy: see _store_files
        finding = secrets.scan(data, rel, sniff)
        if finding is not None and self._allowed(rel):
            # Stored as the user asked, but never taken from the stat cache later: a
            # commit without --allow-secret must scan (and refuse) it again.
            self.allowed_secrets.add(rel)
            return
        if finding is not None and self.skip_secrets and lines_before == 0 and sniff:
            raise _SkippedSecret(f"{finding.path}: possible secret ({finding.rule}) at line {finding.line}")
        if finding is not None:
            raise SecretFound(f"possible secret ({finding.rule}) in {finding.path} line {finding.line + lines_before}",
                              f"'{finding.path}'")

    def _scan_file(self, item: FileItem) -> None:
        try:
            self._scan_file_once(item)
        except _SkippedSecret as exc:
            item.secret = str(exc)

    def _scan_file_once(self, item: FileItem) -> None:
        try:
            if item.st.st_size > STREAM_BYTES:
                self._scan_stream(item)
            else:
                self._scan_whole(item)
        except MemoryError:
            raise _too_large(item) from None

    def _scan_stream(self, item: FileItem) -> None:
        from agentcas.workspace import secrets
        try:
            with open(item.path, "rb") as handle:
                head = handle.read(secrets.BINARY_SNIFF)
                if secrets.is_binary(head):
                    return
                windows = secrets.WindowScan(lambda data, lines: self._check_secret(item.rel, data, lines, False))
                windows.feed(head)
                while block := handle.read(secrets.SCAN_WINDOW):
                    windows.feed(block)
                windows.finish()
        except OSError as exc:
            raise WorkspaceError(f"cannot read {item.rel}: {exc.strerror}") from None

    def _scan_whole(self, item: FileItem) -> None:
        from agentcas.workspace import secrets
        try:
            with open(item.path, "rb", buffering=0) as handle:
                head = handle.read(secrets.BINARY_SNIFF)
                if secrets.is_binary(head):
                    return
                size = os.fstat(handle.fileno()).st_size
                buffer = self._buffer(max(size, len(head)) + 1)
                buffer[: len(head)] = head
                data = buffer[: len(head) + _read_into(handle, buffer[len(head):])]
        except OSError as exc:
            raise WorkspaceError(f"cannot read {item.rel}: {exc.strerror}") from None
        self._check_secret(item.rel, data)

    # -- store ----------------------------------------------------------------------------------
    def _buffer(self, size: int) -> memoryview:
        """This thread's read buffer, at least `size` bytes (valid until its next call)."""
        buffer = getattr(self._buffers, "buffer", None)
        if buffer is None or len(buffer) < size:
            buffer = self._buffers.buffer = bytearray(size)
        return memoryview(buffer)

    def _read_stable(self, item: FileItem) -> tuple[memoryview, os.stat_result]:
        """The file's bytes (a view into this thread's buffer) and its unchanged stat."""
        for _ in range(READ_TRIES):
            try:
                with open(item.path, "rb", buffering=0) as handle:
                    before = os.fstat(handle.fileno())
                    buffer = self._buffer(before.st_size + 1)  # a spare byte shows growth
                    size = _read_into(handle, buffer)
                    after = os.fstat(handle.fileno())
            except OSError as exc:
                raise WorkspaceError(f"cannot read {item.rel}: {exc.strerror}") from None
            if _signature(before) == _signature(after) and size == after.st_size:
                return buffer[:size], after
        raise FileChanged(f"{item.rel} kept changing while it was read; nothing was committed")

    def _store_file(self, item: FileItem):
        try:
            return self._store_whole(item)
        except MemoryError:
            raise _too_large(item) from None

    def _store_whole(self, item: FileItem):
        data, st = self._read_stable(item)
        if _signature(st) != _signature(item.st):
            self._check_secret(item.rel, data)  # it changed since the scan: scan what we store
            item.st = st
        from agentcas.cas import chunking
        framed_chunks = self._hash_and_frame(list(chunking.cut(data, *self.chunk_sizes)))
        refs = [ChunkRef(digest, length) for digest, length, _ in framed_chunks]
        objects = [(digest, framed) for digest, _, framed in framed_chunks if framed is not None]
        entry, chunk_list, needed = _file_entry(item.rel.rsplit("/", 1)[-1], _mode(st), len(data), refs,
                                                lambda: Digest(blake3.blake3(data, max_threads=1).digest()))
        if chunk_list is not None:
            objects.append(chunk_list)
        return entry, objects, len(data), needed

    def run(self) -> Digest:
        dirs = self.walk()   # counts stats.files and stats.bytes
        reused, covered, digests = self._reuse_trees(dirs)
        if reused and len(self.known({tree.raw for tree in reused.values()})) != len(set(reused.values())):
            reused, covered = {}, set()   # a reused tree is gone (gc): no directory cache this time
        looked_up = self._file_items(dirs, covered)
        files = looked_up
        with self.local.reader() as txn:
            for item in looked_up:
                item.entry = self._from_cache(txn, item)
        # A cached entry counts only while its objects are known to be stored.
        stored = {item.rel: (item.entry.chunks or item.entry.id).raw
                  for item in looked_up if item.entry is not None and item.entry.size}
        present = self.known(set(stored.values())) if stored else set()
        for item in looked_up:
            if item.rel in stored and stored[item.rel] not in present:
                item.entry = None
        return self._run_files(dirs, files, looked_up, reused, covered, digests)

    def _run_files(self, dirs, files, looked_up, reused, covered, digests) -> Digest:
        """Store the files not known, build the trees not reused; the root tree id."""
        todo = [item for item in looked_up if item.entry is None]
        for item in looked_up:
            if item.entry is not None and item.entry.size:
                self.needed.add((item.entry.chunks or item.entry.id).raw)
        self.needed.update(tree.raw for tree in reused.values())
        self.stats.cached_files = self.stats.files - len(todo)
        total = sum(item.st.st_size for item in todo)
        if todo:
            try:
                self._store_files(todo, total)
            finally:
                self._buffers = threading.local()
        if self.skipped_secrets:
            self._drop_secrets(dirs)
        root, built = self._build_trees(dirs, reused, covered)
        self.writer.flush()
        self.stats.unchanged_files = self.stats.cached_files + self._same_as_before(todo)
        rows = self._cache_rows(todo) + self._dir_rows(dirs, built, digests)
        if rows:
            def put_rows(txn):
                for key, value in rows:
                    txn.put("statcache", key, value)
            self.local.write(put_rows)
        self.stats.new_objects = self.writer.written_objects
        self.stats.new_bytes = self.writer.written_bytes
        return root

    # -- directory cache ----------------------------------------------------------------------
    def _dir_key(self, rel_dir: str) -> bytes:
        key = DIR_CACHE_KEY + os.fsencode(self.root) + b"\0" + rel_dir.encode("utf-8")
        return key if len(key) <= MAX_CACHE_KEY else DIR_CACHE_KEY + b"#" + blake3.blake3(key).digest()

    def _dir_row(self, txn, rel_dir: str) -> tuple | None:
        """(version, own digest, stat digest, tree id, files, bytes, [subdirectory names])
        of the directory's cache row, or None (none, damaged, or a version-1 row: those
        are written again as version 2 when the directory's tree is next built)."""
        key = self._dir_key(rel_dir)
        value = txn.get("statcache", key)
        row = None
        if value is not None:
            try:
                payload = unseal("statcache", key, value)
                if payload[:1] == b"\x02":
                    head = _DIR_ROW.unpack_from(payload)
                    names = payload[_DIR_ROW.size:]
                    subdirs = names.decode("utf-8", "surrogateescape").split("\0") if names else []
                    row = (*head, subdirs)
            except (IntegrityError, struct.error, ValueError):
                row = None
        self._cached_rows[rel_dir] = row
        return row

    def _options_tag(self) -> bytes:
        """What else decides a tree besides the stats: the walk's rules and what it skips."""
        tag = [b"git" if self.git_aware else b"plain", b"skip" if self.skip_secrets else b"refuse",
               self.dir_cache_epoch or b""]
        tag += [b"allow:" + os.fsencode(glob) for glob in sorted(self.allow_secrets)]  # names checked under them
        return b"\0".join(tag)

    def _skipped_in(self) -> dict[str, bytes]:
        """{absolute directory: what it decides} of the skipped paths: each belongs to the key
        of the directory holding it only (a hook skipping a transcript outside the workspace
        and a rewind skipping none share their rows)."""
        by_dir: dict[str, list] = {}
        for path in self.skip_dirs | self.skip_files:
            parent, name = os.path.split(path)
            by_dir.setdefault(parent, []).append(os.fsencode(name) + (b"/" if path in self.skip_dirs else b""))
        return {parent: b"\0".join(sorted(names)) for parent, names in by_dir.items()}

    def _reuse_trees(self, dirs: dict) -> tuple[dict, set, dict]:
        """({rel dir: tree id} of the topmost directories whose stat digest is unchanged,
        every directory under them or reused, {rel dir: stat digest})."""
        order = sorted(dirs, key=lambda d: d.count("/") + (1 if d else 0), reverse=True)
        digests: dict[str, bytes] = {}
        for rel_dir in order:   # children before parents
            hasher = blake3.blake3(self._own_digests[rel_dir], max_threads=1)
            for name, item in dirs[rel_dir]:
                if item == "dir":
                    sub = digests[f"{rel_dir}/{name}" if rel_dir else name]
                    hasher.update(b"d" + struct.pack(">H", len(name.encode("utf-8"))) + name.encode("utf-8") + sub)
            digests[rel_dir] = hasher.digest()
        hits: dict[str, Digest] = {}
        for rel_dir in order:
            row = self._cached_rows.get(rel_dir)
            if row is not None and row[2] == digests[rel_dir]:
                hits[rel_dir] = Digest(row[3])
        reused, covered = {}, set()
        for rel_dir in sorted(dirs, key=lambda d: d.count("/") + (1 if d else 0)):   # parents first
            parent = rel_dir.rpartition("/")[0] if rel_dir else None
            if parent is not None and parent in covered:
                covered.add(rel_dir)
            elif rel_dir in hits:
                reused[rel_dir] = hits[rel_dir]
                covered.add(rel_dir)
        return reused, covered, digests

    def _dir_rows(self, dirs: dict, built: list, digests: dict) -> list[tuple[bytes, bytes]]:
        """Directory-cache rows of the trees built, but none above a racy file or a secret."""
        blocked = set()
        for rel_dir in self._uncacheable | {item.rsplit("/", 1)[0] if "/" in item else "" for item in
                                            self.allowed_secrets | {s.split(": ", 1)[0] for s in
                                                                   self.skipped_secrets}}:
            while True:
                blocked.add(rel_dir)
                if not rel_dir:
                    break
                rel_dir = rel_dir.rpartition("/")[0]
        rows = []
        for rel_dir, tree in built:
            if rel_dir in blocked or self.dir_cache_epoch is None:
                continue
            key = self._dir_key(rel_dir)
            subdirs = b"\0".join(name.encode("utf-8", "surrogateescape") for name, item in dirs[rel_dir]
                                 if item == "dir")
            rows.append((key, seal("statcache", key, _DIR_ROW.pack(2, self._own_digests[rel_dir], digests[rel_dir],
                                                                    tree.raw, *self._counts[rel_dir]) + subdirs)))
        return rows

    def _file_items(self, dirs: dict, covered: set) -> list[FileItem]:
        """The files of the directories not reused, as FileItems (in `dirs` too; a
        directory taken from its row gets its files from its listing here)."""
        items = []
        for rel_dir, children in dirs.items():
            if rel_dir in covered:
                continue
            prefix = f"{rel_dir}/" if rel_dir else ""
            base = os.path.join(self.root, rel_dir) if rel_dir else self.root
            listing = self._unlooked.pop(rel_dir, None)
            if listing is not None:   # taken from its row, but its tree is built again: its files too
                files, count, size = self._children(rel_dir, base, listing, files_only=True)
                self._counts[rel_dir] = (count, size)
                children = files + children
            made = []
            for name, item in children:
                if item != "dir":
                    item = FileItem(prefix + name, f"{base}/{name}", item)
                    items.append(item)
                made.append((name, item))
            dirs[rel_dir] = made
        return items

    def _drop_secrets(self, dirs: dict) -> None:
        for rel_dir, children in dirs.items():
            dirs[rel_dir] = [(name, item) for name, item in children
                             if not isinstance(item, FileItem) or item.secret is None]

    def _same_as_before(self, items: list[FileItem]) -> int:
        """How many of `items` (files read again: not in the stat cache, or too recent to
        trust it) have the id and mode they had in the previous tree. Only the directories
        holding them are loaded."""
        if self.previous_tree is None or not items:
            return 0
        directories: dict[str, dict] = {}  # rel dir -> {name: entry} in the previous tree

        def entries_of(rel_dir: str) -> dict:
            # Walk down from the nearest loaded ancestor (a loop: a tree can be deeper
            # than Python's recursion limit).
            missing = []
            while rel_dir not in directories:
                missing.append(rel_dir)
                if rel_dir == "":
                    break
                rel_dir = rel_dir.rpartition("/")[0]
            for rel_dir in reversed(missing):
                if rel_dir == "":
                    tree_id = self.previous_tree
                else:
                    parent, _, name = rel_dir.rpartition("/")
                    entry = directories[parent].get(name)
                    tree_id = entry.id if entry is not None and entry.type == "dir" else None
                data = None if tree_id is None else load_object(self.objects, tree_id, framing.KIND_TREE)
                directories[rel_dir] = {} if data is None else {e.name: e for e in Tree.decode(data).entries}
            return directories[rel_dir]

        same = 0
        for item in items:
            rel_dir, _, name = item.rel.rpartition("/")
            before = entries_of(rel_dir).get(name)
            if before is not None and item.entry is not None and before.type == "file" \
                    and (before.id, before.mode) == (item.entry.id, item.entry.mode):
                same += 1
        return same

    def _store_files(self, todo: list[FileItem], total: int) -> None:
        """Scan every file, then store them on the workers while this thread writes."""
        # Imported here: an unchanged recommit (every file from the stat cache) never
        # needs the pool, the chunker or the secret rules, and their imports cost ~20 ms.
        from concurrent.futures import ThreadPoolExecutor
        done = 0
        small = total <= INLINE_BYTES
        with (_InlinePool() if small else ThreadPoolExecutor(WORKERS, initializer=_yield_to_writer)) as pool:
            for _ in pool.map(self._scan_file, todo):  # every file, before anything is stored
                pass
            secret = [item for item in todo if item.secret is not None]
            if secret:
                self.skipped_secrets += [str(item.secret) for item in secret]
                todo[:] = [item for item in todo if item.secret is None]
            pending: list = []
            in_flight = 0
            queue = [item for item in reversed(todo) if item.st.st_size <= STREAM_BYTES]
            while queue or pending:
                while queue and (in_flight < IN_FLIGHT_BYTES or not pending):
                    item = queue.pop()
                    pending.append((item, pool.submit(self._store_file, item)))
                    in_flight += item.st.st_size
                item, future = pending.pop(0)
                entry, objects, size, needed = future.result()
                self.needed.update(needed)
                in_flight -= item.st.st_size
                item.entry = entry
                for digest, framed in objects:
                    self.writer.add(digest, framed)
                done += size
                self.stats.read_bytes += size
                if self.progress:
                    self.progress(done, total)
            for item in todo:
                if item.st.st_size > STREAM_BYTES:
                    def report(part: int, done: int = done) -> None:
                        if self.progress:
                            self.progress(done + part, total)
                    size = self._store_stream(item, pool, report)
                    done += size
                    self.stats.read_bytes += size
                    if self.progress:
                        self.progress(done, total)

    def _store_stream(self, item: FileItem, pool, report) -> int:
        """Store a large file chunk by chunk through the writer; its size. `report(bytes
        read so far)` after every window, for the progress bar."""
        for _ in range(READ_TRIES):
            try:
                with open(item.path, "rb") as handle:
                    before = os.fstat(handle.fileno())
                    result = self._stream_chunks(item, handle, before, pool, report)
            except OSError as exc:
                raise WorkspaceError(f"cannot read {item.rel}: {exc.strerror}") from None
            except MemoryError:
                raise _too_large(item) from None
            if result is not None:
                entry, size, needed, after = result
                item.st, item.entry = after, entry
                self.needed.update(needed)
                return size
        raise FileChanged(f"{item.rel} kept changing while it was read; nothing was committed")

    def _stream_chunks(self, item: FileItem, handle, before: os.stat_result, pool, report):
        """(entry, size, ids it needs, stat), or None if the file changed while read.

        This thread reads, cuts and scans; the workers hash and frame each released
        window (two windows in flight). Chunks reach the writer a window at a time, only
        after the window's bytes were secret-scanned (text files) and an fstat showed the
        file unchanged since `before` (so they are bytes of that version, which the head
        judged text or binary). A change abandons the attempt; chunks stored by then are
        scanned bytes of one version, unreferenced (gc removes them).
        """
        from agentcas.cas import chunking
        from agentcas.workspace import secrets
        hasher = blake3.blake3(max_threads=1)
        refs: list[ChunkRef] = []
        in_flight: deque = deque()  # futures of released windows' (digest, size, framed or None)
        windows: secrets.WindowScan | None = None
        size = 0

        def store(limit: int) -> bool:
            """Hand finished windows to the writer until at most `limit` are in flight."""
            while len(in_flight) > limit:
                framed_window = in_flight.popleft().result()
                if _signature(os.fstat(handle.fileno())) != _signature(before):
                    for future in in_flight:
                        future.result()  # let the workers finish; nothing more is stored
                    return False
                for digest, length, framed in framed_window:
                    refs.append(ChunkRef(digest, length))
                    if framed is not None:
                        self.writer.add(digest, framed)
            return True

        def submit(pieces) -> None:
            half = (len(pieces) + 1) // 2  # both workers share a window
            for part in (pieces[:half], pieces[half:]):
                if part:
                    in_flight.append(pool.submit(self._hash_and_frame, part))

        for index, piece in enumerate(chunking.cut_stream(handle, self.chunk_sizes)):
            if index == 0:  # text or binary is judged by the head, as git does
                check = None if secrets.is_binary(piece) else (
                    lambda data, lines: self._check_secret(item.rel, data, lines, False))
                windows = secrets.WindowScan(check)
            hasher.update(piece)
            size += len(piece)
            assert windows is not None  # made from the first piece
            released = windows.feed(piece)
            if released:
                submit(released)
                if not store(limit=2):
                    return None
                report(size)
        if windows is not None:
            submit(windows.finish())
        if not store(limit=0):
            return None
        after = os.fstat(handle.fileno())
        if _signature(after) != _signature(before) or size != after.st_size:
            return None
        # (A file that shrank below STREAM_BYTES since the walk may be one chunk, or empty.)
        entry, chunk_list, needed = _file_entry(item.rel.rsplit("/", 1)[-1], _mode(after), size, refs,
                                                lambda: Digest(hasher.digest()))
        if chunk_list is not None:
            self.writer.add(*chunk_list)
        return entry, size, needed, after

    def _hash_and_frame(self, pieces) -> list:
        """(id, size, framed value or None when already stored) per piece (on a worker)."""
        digests = [hash_blob(piece) for piece in pieces]
        present = self.known({digest.raw for digest in digests}) if digests else set()
        return [(digest, len(piece), None if digest.raw in present else
                 framing.frame(framing.KIND_CHUNK, piece, level=framing.FILE_ZSTD_LEVEL))
                for digest, piece in zip(digests, pieces)]

    def _build_trees(self, dirs: dict[str, list], reused: dict, covered: set) -> tuple[Digest, list]:
        """(root tree id, [(rel dir, tree id)] of the trees built), reusing `reused`."""
        ids: dict[str, Digest] = {}
        built = []
        for rel_dir in sorted(dirs, key=lambda d: d.count("/") + (1 if d else 0), reverse=True):
            if rel_dir in reused:
                ids[rel_dir] = reused[rel_dir]
                continue
            if rel_dir in covered:
                continue
            entries = []
            for name, item in dirs[rel_dir]:
                if item == "dir":
                    entries.append(TreeEntry(name, "dir", ids[f"{rel_dir}/{name}" if rel_dir else name]))
                else:
                    entries.append(item.entry)
            tree = Tree.of(entries)
            digest = tree.digest()
            self.writer.add(digest, framing.frame(framing.KIND_TREE, tree.encode()))
            self.needed.add(digest.raw)
            ids[rel_dir] = digest
            built.append((rel_dir, digest))
        return ids[""], built


class _IgnoreSpec:
    """A directory's ignore patterns, with one regex that says whether any of them matches.

    pathspec checks a path against each pattern in turn (~20 µs a path for six patterns:
    2 s for 100,000 files); most paths match none, which the joined regex (the patterns'
    own regexes, their named groups made plain) answers in one call. Only a path that
    some pattern matches is checked pattern by pattern, for the last match and negations.
    """

    def __init__(self, spec):
        import re
        self.spec = spec
        parts = [p.regex.pattern.replace("(?P<ps_d>", "(?:") for p in spec.patterns
                 if p.include is not None and getattr(p, "regex", None) is not None]
        try:
            self.any = re.compile("|".join(f"(?:{part})" for part in parts)) if parts else None
        except re.error:
            self.any = False   # a pattern this cannot join: ask pathspec for every path
        self.empty = not parts

    def include(self, path: str):
        """True (excluded), False (re-included by `!`) or None (no pattern matches)."""
        if self.empty:
            return None
        if self.any is not False and self.any.match(path) is None:
            return None
        return self.spec.check_file(path).include


def _file_entry(name: str, mode: int, size: int, refs: list[ChunkRef], whole_id):
    """(tree entry, (id, framed chunk list) or None, ids the entry needs) of a file cut
    into `refs`. A one-chunk file's id is its chunk's id (both are plain BLAKE3 of the
    same bytes); `whole_id()` gives a multi-chunk file's id."""
    needed = [ref.id.raw for ref in refs]
    if len(refs) < 2:
        return TreeEntry(name, "file", refs[0].id if refs else EMPTY, mode, size), None, needed
    chunk_list = ChunkList(tuple(refs))
    chunks = chunk_list.digest()
    framed = (chunks, framing.frame(framing.KIND_CHUNKLIST, chunk_list.encode()))
    return TreeEntry(name, "file", whole_id(), mode, size, chunks), framed, needed + [chunks.raw]


class _InlinePool:
    """The part of an executor `_store_files` uses, running each call at once on this thread."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def map(self, fn, items):
        return map(fn, items)

    def submit(self, fn, *args):
        from concurrent.futures import Future
        future = Future()
        try:
            future.set_result(fn(*args))
        except BaseException as exc:  # noqa: BLE001 - raised by result(), as a worker's would be
            future.set_exception(exc)
        return future


def _yield_to_writer() -> None:
    """Lower this worker thread's priority below the writer's (Linux only; best effort)."""
    if sys.platform.startswith("linux"):
        me = threading.get_native_id()
        try:
            os.setpriority(os.PRIO_PROCESS, me, min(19, os.getpriority(os.PRIO_PROCESS, me) + WORKER_NICENESS))
        except OSError:
            pass


def _read_into(handle, buffer: memoryview) -> int:
    """Fill `buffer` from `handle` until it is full or the file ends; bytes read."""
    got = 0
    while got < len(buffer):
        count = handle.readinto(buffer[got:])
        if not count:
            break
        got += count
    return got


class _DirectoryLister:
    """Lists directories, sorted by name, with every entry's lstat, on LISTER_THREADS
    threads, handing the listings back in the order they were requested.

    Listing and lstat release the GIL, so the walk's own loop runs while the next
    directories are read (a 100,000-file tree here: ~1.5x faster than listing in the
    loop). Each directory is opened once and its entries are lstat'ed relative to that
    descriptor (fstatat), not by their whole path (~20% less kernel path walking); a
    directory below the root is opened with O_NOFOLLOW, so one swapped for a symlink
    after its lstat is refused, not followed.
    """

    def __init__(self):
        self._requests: list = []   # [event, listing, error] per requested directory, in order
        self._next = 0              # the next request `result` returns
        self._todo: deque = deque()  # (path, top, slot) not yet taken by a thread
        self._wake = threading.Condition()
        self._threads: list[threading.Thread] = []
        self._closed = False

    def __enter__(self) -> _DirectoryLister:
        return self

    def __exit__(self, *exc) -> None:
        with self._wake:
            self._closed = True
            self._wake.notify_all()
        for thread in self._threads:
            thread.join()

    def request(self, path: str, top: bool = False) -> None:
        slot = [threading.Event(), None, None]
        self._requests.append(slot)
        with self._wake:
            self._todo.append((path, top, slot))
            self._wake.notify()
        if len(self._threads) < LISTER_THREADS and len(self._requests) > len(self._threads):
            thread = threading.Thread(target=self._serve, name="agentcas-lister", daemon=True)
            thread.start()
            self._threads.append(thread)

    def result(self) -> _Listing:
        """The next requested directory's listing; raises its OSError."""
        slot = self._requests[self._next]
        self._next += 1
        slot[0].wait()
        if slot[2] is not None:
            raise slot[2]
        return slot[1]

    def _serve(self) -> None:
        while True:
            with self._wake:
                while not self._todo and not self._closed:
                    self._wake.wait()
                if self._closed:
                    return
                path, top, slot = self._todo.popleft()
            try:
                slot[1] = _list_directory(path, top)
            except OSError as exc:
                slot[2] = exc
            slot[0].set()


class _Listing:
    """A directory's entries sorted by name, their lstat, and `key`: the names and stat
    signatures (_STAT_SIG) of all of them, marshalled, so two listings compare as bytes;
    `newest`: the latest mtime or ctime among them."""

    __slots__ = ("names", "stats", "key", "newest")

    def __init__(self, names: list[str], stats: list[os.stat_result]):
        self.names, self.stats = names, stats
        self.key = marshal.dumps((names, list(map(_STAT_SIG, stats))), 2)  # version 2: no back-references
        self.newest = max(max(map(_MTIME, stats)), max(map(_CTIME, stats))) if stats else 0

    def stat_of(self, name: str) -> os.stat_result | None:
        at = bisect.bisect_left(self.names, name)
        return self.stats[at] if at < len(self.names) and self.names[at] == name else None


def _list_directory(path: str, top: bool) -> _Listing:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | (0 if top else os.O_NOFOLLOW))
    try:
        with os.scandir(fd) as entries:
            ordered = sorted(entries, key=_NAME)
        stats = [entry.stat(follow_symlinks=False) for entry in ordered]
    finally:
        os.close(fd)
    return _Listing(list(map(_NAME, ordered)), stats)


def _mode(st: os.stat_result) -> int:
    return MODE_EXEC if st.st_mode & 0o100 else MODE_FILE


def check_reason_secret(reason: str, allow_secrets=()) -> None:
    """Refuse a commit reason that looks like a credential, unless a glob allows ':reason'."""
    from agentcas.workspace import secrets
    finding = secrets.scan_text(reason, secrets.REASON)
    if finding is not None and not any(fnmatch.fnmatchcase(secrets.REASON, glob) for glob in allow_secrets):
        raise SecretFound(f"possible secret ({finding.rule}) in the commit reason", f"'{secrets.REASON}'")


def snapshot(objects: ObjectSource, local: TableEnvironment, root: str, allow_secrets=(), progress=None,
             skip_dirs=(), skip_files=(), lease=None, known=None, previous_tree: Digest | None = None,
             git_aware: bool = False, skip_secrets: bool = False, snapshotter: list | None = None,
             dir_cache_epoch: bytes | None = None, held: dict | None = None):
    """Store the directory `root`; return (root tree id, SnapshotStats, ids it needs).

    `skip_dirs` / `skip_files` (e.g. the store itself, a rollout file stored as history)
    are left out of the tree. `previous_tree` (the thread's head tree) only lets the
    stats count files read again but unchanged. `snapshotter`, a list, receives the
    Snapshotter (its `skipped_secrets`). `dir_cache_epoch`: use the directory cache (6.).
    `held` (a dict) receives the last batch of new objects, unstored, for the caller's move.
    """
    snap = Snapshotter(objects, local, root, allow_secrets, progress, skip_dirs, skip_files, lease, known,
                       previous_tree, git_aware, skip_secrets, dir_cache_epoch, held)
    if snapshotter is not None:
        snapshotter.append(snap)
    return snap.run(), snap.stats, snap.needed
