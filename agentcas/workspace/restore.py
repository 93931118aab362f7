"""Restore a tree into a new directory; nothing unverified is ever written.

1. DEST must not exist (not even empty): ConflictError, and DEST is left alone.
2. Every tree is loaded and verified first (Tree.decode also checks names: no "..",
   "/", NUL, control characters, case or Unicode-normalisation collisions; and modes:
   0644 or 0755 only), so the whole layout is known to be safe before anything exists.
3. Files are restored by two threads into a hidden temporary sibling of DEST: each
   file's chunks are read and checked against their ids, the whole file against its
   BLAKE3 id, and only then written. Any failure (a corrupt or missing object, a full
   disk) removes the temporary directory; at the end it is renamed into place, so DEST
   appears whole, verified, or not at all. (One pass: reading everything twice would
   double the time of a checkout, and the temporary directory is never visible as DEST.)
   Where many reads at once cost far less than one each (a shared store: packs read by
   ranged GETs), FETCHERS threads fetch the files' objects a window of PREFETCH_BYTES at
   a time (the chunk lists of the windows ahead first, many at once), at most
   PREFETCH_AHEAD windows ahead of the writers, which wait for their file's window and
   take its chunks from memory (not through the cache: a checkout reads them once).
Nothing read from a checkpoint is ever executed.
"""

from __future__ import annotations

import bisect
import os
import queue
import shutil
import threading
from concurrent.futures import ThreadPoolExecutor

import blake3

from agentcas import testing_hooks
from agentcas.cas import crashpoints, framing
from agentcas.cas.digest import Digest, DigestMismatch
from agentcas.cas.objects import MAX_PATH_BYTES, ChunkList, PathTooLong, Tree, TreeEntry
from agentcas.cas.source import ObjectSource, load_object, verify_object
from agentcas.cas.system_errors import from_os_error
from agentcas.errors import ConflictError, IntegrityError

WORKERS = 2
PREFETCH_BYTES = 32 * 1024 * 1024  # a window of files fetched at once (one fetch_many)
PREFETCH_AHEAD = 2                 # windows fetched ahead of the writers at most
FETCHERS = 2                       # windows fetched at once
LIST_BATCH = 4096                  # chunk lists (or trees) fetched at once


class MissingObject(IntegrityError):
    pass


def _load(txn, digest: Digest, kind: int, what: str) -> bytes:
    data = load_object(txn, digest, kind)
    if data is None:
        raise MissingObject(f"{what} {digest.hex()} is missing from the store")
    return data


def compare_trees(objects: ObjectSource, old: Digest, new: Digest) -> tuple[list[tuple[str, int]],
                                                                          list[tuple[str, int]],
                                                                          list[tuple[str, int, int]]]:
    """The files of tree `new` that `old` lacks, those of `old` that `new` lacks, as (path,
    size), and those whose content or mode differ, as (path, old size, new size); by path."""
    files1 = {p: e for p, e in list_files(objects, old) if e.type == "file"}
    files2 = {p: e for p, e in list_files(objects, new) if e.type == "file"}
    added = [(p, files2[p].size) for p in sorted(files2.keys() - files1.keys())]
    removed = [(p, files1[p].size) for p in sorted(files1.keys() - files2.keys())]
    changed = [(p, files1[p].size, files2[p].size) for p in sorted(files1.keys() & files2.keys())
               if (files1[p].id, files1[p].mode) != (files2[p].id, files2[p].mode)]
    return added, removed, changed


def list_files(txn, tree_id: Digest, prefix: str = ""):
    """Yield (relative path, TreeEntry) for every file under a tree, depth first, verified.

    Directories come as "path/" before their contents. Iterative (a stack of entry
    iterators), so any depth works; a path over MAX_PATH_BYTES raises PathTooLong.
    """
    stack = [(prefix, iter(Tree.decode(_load(txn, tree_id, framing.KIND_TREE, "tree")).entries))]
    while stack:
        where, entries = stack[-1]
        entry = next(entries, None)
        if entry is None:
            stack.pop()
            continue
        path = f"{where}{entry.name}"
        length = len(path.encode("utf-8"))
        if length > MAX_PATH_BYTES:
            raise PathTooLong(length, f"path {path[:60]}... ({path.count('/') + 1} levels)")
        if entry.type == "dir":
            yield path + "/", entry
            tree = Tree.decode(_load(txn, entry.id, framing.KIND_TREE, "tree"))
            stack.append((path + "/", iter(tree.entries)))
        else:
            yield path, entry


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW


def _traverse(root: str):
    """Events of a depth-first walk below `root`, parents first, with one open descriptor:
    ("file", rel, dir_fd, name) for each non-directory, ("dir", rel, dir_fd, name) on
    entering a directory, ("leave", rel, parent_fd, name) after leaving it.

    Iterative, and it steps into a directory by name and back out by "..", so neither
    Python's recursion limit, nor PATH_MAX, nor the open-files limit bounds the depth.
    Symlinks are reported as files, never followed (O_NOFOLLOW on every step down).
    """
    fd = os.open(root, _DIR_FLAGS)
    frames = []  # (rel of this directory, its name, subdirectories still to visit)
    rel = ""
    try:
        while True:
            with os.scandir(fd) as listing:
                children = sorted((e.name, e.is_dir(follow_symlinks=False)) for e in listing)
            subdirs = []
            for name, is_dir in children:
                path = f"{rel}/{name}" if rel else name
                if is_dir:
                    subdirs.append(name)
                else:
                    yield "file", path, fd, name
            frames.append((rel, subdirs[::-1]))
            while frames and not frames[-1][1]:
                done, _ = frames.pop()
                if not frames:
                    return
                parent = os.open("..", _DIR_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = parent
                yield "leave", done, fd, done.rsplit("/", 1)[-1]
            name = frames[-1][1].pop()
            rel = f"{frames[-1][0]}/{name}" if frames[-1][0] else name
            yield "dir", rel, fd, name
            child = os.open(name, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = child
    finally:
        os.close(fd)


def walk_directory(root: str):
    """Yield (relative path, is_dir) of everything under `root`, parents first."""
    for event, rel, _, _ in _traverse(root):
        if event != "leave":
            yield rel, event == "dir"


def remove_tree(root: str) -> None:
    """`rm -rf root` without recursion (shutil.rmtree recurses on Python 3.11); best effort."""
    try:
        for event, _, fd, name in _traverse(root):
            if event == "file":
                os.unlink(name, dir_fd=fd)
            elif event == "leave":
                os.rmdir(name, dir_fd=fd)
        os.rmdir(root)
    except FileNotFoundError:
        pass
    except OSError:
        shutil.rmtree(root, ignore_errors=True)


def _fetch_trees(objects: ObjectSource, tree_id: Digest) -> None:
    """Read the trees under `tree_id` a level at a time (one get_many each), so the walk
    that verifies them (list_files) finds them in the cache instead of asking once per
    directory. Each is checked here only as far as finding its subdirectories takes."""
    level = [tree_id.raw]
    seen = set(level)
    while level:
        below = []
        for start in range(0, len(level), LIST_BATCH):
            for value in objects.blobs.get_many(level[start:start + LIST_BATCH]).values():
                try:
                    kind, data = framing.unframe(value)
                    tree = Tree.decode(data) if kind == framing.KIND_TREE else None
                except (IntegrityError, ValueError):
                    tree = None  # list_files reads it again and says what is wrong
                for entry in tree.entries if tree is not None else ():
                    if entry.type == "dir" and entry.id.raw not in seen:
                        seen.add(entry.id.raw)
                        below.append(entry.id.raw)
        level = below


def file_chunks(txn, entry: TreeEntry):
    """The chunk refs of a file entry: its chunk list, or the file itself as one chunk."""
    if entry.size == 0:
        return ()
    if entry.chunks is None:
        return ((entry.id, entry.size),)
    chunk_list = ChunkList.decode(_load(txn, entry.chunks, framing.KIND_CHUNKLIST, "chunk list"))
    if chunk_list.size != entry.size:
        raise IntegrityError(f"chunk list {entry.chunks.hex()} does not add up to the file's size")
    return tuple((ref.id, ref.size) for ref in chunk_list.chunks)


def verified_chunks(txn, entry: TreeEntry, path: str = ""):
    """Yield a file's chunks, each checked against its id; after the last, the whole is
    checked against the file id (DigestMismatch), so a caller that consumes them all has
    read exactly the file. Memory: one chunk at a time."""
    hasher = blake3.blake3(max_threads=1)
    for chunk_id, size in file_chunks(txn, entry):
        data = _load(txn, chunk_id, framing.KIND_CHUNK, "chunk")
        if len(data) != size:
            raise IntegrityError(f"chunk {chunk_id.hex()} of {path} has the wrong size")
        hasher.update(data)
        yield data
    got = Digest(hasher.digest())
    if got != entry.id:
        raise DigestMismatch(entry.id, got, f"file {path}")


def read_file(txn, entry: TreeEntry, path: str = "") -> bytes:
    """A file's verified bytes (each chunk against its id, the whole against the file id)."""
    return b"".join(verified_chunks(txn, entry, path))


def write_verified(txn, path: str, entry: TreeEntry, target: str, dir_fd: int | None = None) -> None:
    """Write one file, each chunk checked against its id before its bytes are written
    and the whole file against the file id at the end (a mismatch raises; the caller
    removes the partial output). `target` is relative to `dir_fd` when given."""
    chunks = file_chunks(txn, entry)
    # A one-chunk file's id is its chunk's id: the chunk check below is the file check.
    hasher = None if len(chunks) == 1 and chunks[0][0] == entry.id else blake3.blake3(max_threads=1)
    crashpoints.reached("restore.file")  # before each file: crash or fail with the others written
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=dir_fd)
    with os.fdopen(fd, "wb", buffering=0) as out:
        for chunk_id, size in chunks:
            value = txn.raw(chunk_id)
            if value is None:
                raise MissingObject(f"chunk {chunk_id.hex()} of {path} is missing from the store")
            try:
                kind, data = framing.unframe(value, copy=False)
            except framing.CorruptValue as exc:
                raise IntegrityError(f"chunk {chunk_id.hex()} of {path} is corrupt: {exc}") from None
            if kind != framing.KIND_CHUNK or len(data) != size:
                raise IntegrityError(f"chunk {chunk_id.hex()} of {path} is corrupt")
            verify_object(kind, chunk_id, data)
            if hasher is not None:
                hasher.update(data)
            view = memoryview(data)
            while view:
                view = view[out.write(view):]
        if hasher is not None and Digest(hasher.digest()) != entry.id:
            raise DigestMismatch(entry.id, Digest(hasher.digest()), f"file {path}")
        os.fchmod(out.fileno(), entry.mode)


class _Prefetch:
    """Fetches the objects of `files` (in order, a window at a time) ahead of the writers;
    `wait(index)` returns once file `index`'s window is in (or a fetch failed: the writer
    then reads, and reports, on its own), and `take` hands over a fetched value once.

    FETCHERS threads each take the next window, so one window's GETs start while another's
    last ones finish and the connections stay busy. The chunk lists a window needs are
    fetched before it, LIST_BATCH at a time for the windows ahead (a few requests for many
    lists, which a commit stores together), so a window's fetch is its chunks alone."""

    def __init__(self, objects: ObjectSource, files: list, failed: threading.Event):
        self.objects, self.files, self.failed = objects, files, failed
        self.values: dict[bytes, bytes] = {}
        self.ends: list[int] = []  # the index after each window's last file
        size = 0
        for index, (_, entry) in enumerate(files):
            size += entry.size
            if size >= PREFETCH_BYTES:
                self.ends.append(index + 1)
                size = 0
        if not self.ends or self.ends[-1] != len(files):
            self.ends.append(len(files))
        self.done: set[int] = set()   # windows fetched
        self.broken = False           # a fetch failed: the writers read on their own
        self.next_window = 0          # the next window a fetcher takes
        self.wanted = 0               # the furthest window a writer waited for
        self.changed = threading.Condition()
        self.planned: dict[int, list[bytes]] = {}  # window -> its chunk ids (lists fetched)
        self.planned_to = 0           # windows below this are planned
        self.planning = threading.Lock()
        self.threads = [threading.Thread(target=self._run, daemon=True, name=f"agentcas-prefetch-{n}")
                        for n in range(FETCHERS)]
        for thread in self.threads:
            thread.start()

    def wait(self, index: int) -> None:
        window = bisect.bisect_right(self.ends, index)
        with self.changed:
            if window > self.wanted:
                self.wanted = window
                self.changed.notify_all()
            while window not in self.done and not self.broken and not self.failed.is_set():
                self.changed.wait(0.1)

    def take(self, raw: bytes):
        with self.changed:
            return self.values.pop(raw, None)

    def _run(self) -> None:
        try:
            while True:
                with self.changed:
                    window = self.next_window
                    if window >= len(self.ends) or self.broken:
                        return
                    self.next_window += 1
                    while window > self.wanted + PREFETCH_AHEAD and not self.failed.is_set():
                        self.changed.wait(0.1)
                if self.failed.is_set():
                    return
                fetched = self.objects.blobs.fetch_many(self._chunks_of(window))  # the writers verify them
                with self.changed:
                    self.values.update(fetched)
                    self.done.add(window)
                    self.changed.notify_all()
        except Exception:  # noqa: BLE001 - the writers read on their own and report it
            with self.changed:
                self.broken = True
                self.changed.notify_all()

    def _files_of(self, window: int):
        return self.files[self.ends[window - 1] if window else 0:self.ends[window]]

    def _chunks_of(self, window: int) -> list[bytes]:
        """The chunk ids of `window`'s files, planning it and the windows after it (their
        chunk lists fetched together, up to LIST_BATCH) if that is not done yet."""
        with self.planning:
            while window >= self.planned_to:
                self._plan(self.planned_to)
            return self.planned.pop(window)

    def _plan(self, first: int) -> None:
        windows: list[int] = []
        lists: list[bytes] = []
        window = first
        while window < len(self.ends) and (not windows or len(lists) < LIST_BATCH):
            windows.append(window)
            lists += [entry.chunks.raw for _, entry in self._files_of(window)
                      if entry.size and entry.chunks is not None]
            window += 1
        chunk_ids = {}
        for raw, value in self.objects.blobs.get_many(lists).items():  # cached as any read
            _, data = framing.unframe(value)
            chunk_ids[raw] = [ref.id.raw for ref in ChunkList.decode(data).chunks]
        for window in windows:
            chunks: list[bytes] = []
            for _, entry in self._files_of(window):
                if not entry.size:
                    continue
                chunks += [entry.id.raw] if entry.chunks is None else chunk_ids.get(entry.chunks.raw, [])
            self.planned[window] = chunks
        self.planned_to = windows[-1] + 1


class _Prefetched:
    """A source whose raw reads take what a _Prefetch fetched, else read `source`."""

    def __init__(self, source, prefetch: _Prefetch):
        self.source, self.prefetch = source, prefetch

    def raw(self, digest: Digest):
        value = self.prefetch.take(digest.raw)
        return self.source.raw(digest) if value is None else value

    def load(self, digest: Digest, kind: int | None = None):
        return self.source.load(digest, kind)


def _write_extra(temp: str, relative: str, pieces) -> None:
    """Write `pieces` to `temp`/`relative` (a new file; its directories made as needed)."""
    parent, _, _ = relative.rpartition("/")
    if parent:
        os.makedirs(os.path.join(temp, parent), 0o755, exist_ok=True)
    fd = os.open(os.path.join(temp, relative), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "wb") as out:
        for piece in pieces:
            out.write(piece)
        os.fchmod(out.fileno(), 0o644)


def restore_tree(objects: ObjectSource, tree_id: Digest, dest: str, progress=None, extra=None) -> int:
    """Create `dest` holding exactly the tree; return the number of files written.

    `extra`: (relative "/"-path, iterable of verified byte pieces) of one more file, mode
    0644, written in the same temporary directory before it becomes `dest` (the rollout
    file a commit stored as history).
    """
    dest = os.path.abspath(dest)
    if os.path.lexists(dest):
        raise ConflictError(f"destination already exists: {dest}")
    if objects.blobs.batched_reads:
        _fetch_trees(objects, tree_id)
    with objects.reading() as txn:
        entries = list(list_files(txn, tree_id))
    parent = os.path.dirname(dest)
    temp = os.path.join(parent, f".{os.path.basename(dest)}.agentcas-{os.urandom(6).hex()}")
    try:
        os.makedirs(parent, exist_ok=True)
        crashpoints.reached("restore.mkdir")
        os.mkdir(temp, 0o755)
        # Everything below is created relative to this descriptor, so only the tree's own
        # paths (at most MAX_PATH_BYTES) meet PATH_MAX, however long DEST's path is.
        temp_fd = os.open(temp, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:
        raise from_os_error(exc, f"creating {dest}", "nothing was created") from None

    def write_files(batch) -> None:
        # One zero-copy read transaction per worker: chunk bytes go from the store's
        # memory map through the hash checks straight into the file.
        try:
            with objects.reading(buffers=True) as txn:
                for index, (path, entry) in batch:
                    if failed.is_set():
                        return
                    if prefetch is not None:
                        prefetch.wait(index)
                    write_verified(txn if prefetch is None else _Prefetched(txn, prefetch), path, entry, path,
                                   dir_fd=temp_fd)
                    sizes.put(entry.size)
        except BaseException:
            failed.set()  # the other worker stops too; the caller removes the output
            raise

    sizes: queue.SimpleQueue = queue.SimpleQueue()
    failed = threading.Event()
    prefetch: _Prefetch | None = None

    try:
        for path, entry in entries:
            if entry.type == "dir":
                os.mkdir(path.rstrip("/"), 0o755, dir_fd=temp_fd)
        files = [(p, e) for p, e in entries if e.type == "file"]
        if not objects.blobs.batched_reads:
            files.sort(key=lambda f: -f[1].size)  # the two writers end together
        # else in tree order, the order a commit stored them in: a window is a few ranges of packs
        total = sum(e.size for _, e in files)
        done = count = 0
        prefetch = _Prefetch(objects, files, failed) if objects.blobs.batched_reads and files else None
        numbered = list(enumerate(files))
        with ThreadPoolExecutor(WORKERS) as pool:
            futures = [pool.submit(write_files, numbered[k::WORKERS]) for k in range(WORKERS)]
            while count < len(files) and not failed.is_set():
                try:
                    done += sizes.get(timeout=0.1)
                except queue.Empty:
                    continue
                count += 1
                if progress:
                    progress(done, total)
            for future in futures:
                future.result()
        if extra is not None:
            _write_extra(temp, *extra)
        testing_hooks.reached("checkout.before_rename")
        if os.path.lexists(dest):
            raise ConflictError(f"destination appeared while checking out: {dest}")
        crashpoints.reached("restore.rename")
        os.rename(temp, dest)
    except OSError as exc:
        remove_tree(temp)
        raise from_os_error(exc, f"writing {dest}", "nothing was created") from None
    except BaseException:
        remove_tree(temp)
        raise
    finally:
        failed.set()  # a prefetch still running stops
        os.close(temp_fd)
    crashpoints.reached("restore.done")
    return count
