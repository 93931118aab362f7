"""Restore a tree into a new directory, verifying everything before creating it.

1. DEST must not exist (not even empty): ConflictError, and DEST is left alone.
2. Verify: load every tree (names and modes are checked by Tree.decode), every chunk
   list and every chunk, checking each against its id and each file's bytes against
   the file's BLAKE3 id. Two threads share the hashing.
3. Write into a hidden temporary sibling of DEST, then rename it into place. Any
   failure removes the temporary directory; DEST appears whole or not at all.
Nothing read from a checkpoint is ever executed; modes are 0644 or 0755 only.
"""

from __future__ import annotations

import os
import secrets as pyrandom
import shutil
from concurrent.futures import ThreadPoolExecutor

import blake3

from agentcas.cas import framing
from agentcas.cas.digest import DigestMismatch, Digest
from agentcas.cas.objects import ChunkList, Tree, TreeEntry
from agentcas.cas.store import ObjectStore, load_object
from agentcas.errors import AgentcasError, ConflictError, IntegrityError

WORKERS = 2


class MissingObject(IntegrityError):
    pass


class RestoreError(AgentcasError):
    """DEST could not be written (no space, not a directory, permissions...)."""


def _load(txn, digest: Digest, kind: int, what: str) -> bytes:
    data = load_object(txn, digest, kind)
    if data is None:
        raise MissingObject(f"{what} {digest.hex()} is missing from the store")
    return data


def list_files(txn, tree_id: Digest, prefix: str = ""):
    """Yield (relative path, TreeEntry) for every file under a tree, depth first, verified."""
    tree = Tree.decode(_load(txn, tree_id, framing.KIND_TREE, "tree"))
    for entry in tree.entries:
        path = f"{prefix}{entry.name}"
        if entry.type == "dir":
            yield path + "/", entry
            yield from list_files(txn, entry.id, path + "/")
        else:
            yield path, entry


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


def read_file(txn, entry: TreeEntry, path: str = "") -> bytes:
    """A file's verified bytes (each chunk against its id, the whole against the file id)."""
    parts = []
    for chunk_id, size in file_chunks(txn, entry):
        data = _load(txn, chunk_id, framing.KIND_CHUNK, "chunk")
        if len(data) != size:
            raise IntegrityError(f"chunk {chunk_id.hex()} of {path} has the wrong size")
        parts.append(data)
    data = b"".join(parts) if len(parts) != 1 else parts[0]
    got = Digest(blake3.blake3(data, max_threads=1).digest())
    if got != entry.id:
        raise DigestMismatch(entry.id, got, f"file {path}")
    return data


def verify_tree(store: ObjectStore, tree_id: Digest) -> list[tuple[str, TreeEntry]]:
    """Verify every object under `tree_id`; return its entries (dirs end with '/')."""
    with store.reader() as txn:
        entries = list(list_files(txn, tree_id))

    def check(item):
        path, entry = item
        with store.reader() as txn:
            read_file(txn, entry, path)

    files = [(p, e) for p, e in entries if e.type == "file" and e.size]
    with ThreadPoolExecutor(WORKERS) as pool:
        for _ in pool.map(check, files):
            pass
    return entries


def restore_tree(store: ObjectStore, tree_id: Digest, dest: str, progress=None) -> int:
    """Create `dest` holding exactly the tree; return the number of files written."""
    dest = os.path.abspath(dest)
    if os.path.lexists(dest):
        raise ConflictError(f"destination already exists: {dest}")
    entries = verify_tree(store, tree_id)
    parent = os.path.dirname(dest)
    temp = os.path.join(parent, f".{os.path.basename(dest)}.agentcas-{pyrandom.token_hex(6)}")
    try:
        os.makedirs(parent, exist_ok=True)
        os.mkdir(temp, 0o755)
    except OSError as exc:
        raise RestoreError(f"cannot create {dest}: {exc.strerror}") from None
    try:
        total = sum(e.size for _, e in entries if e.type == "file")
        done = count = 0
        with store.reader() as txn:
            for path, entry in entries:
                target = os.path.join(temp, *path.rstrip("/").split("/"))
                if entry.type == "dir":
                    os.mkdir(target, 0o755)
                    continue
                fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
                with os.fdopen(fd, "wb") as out:
                    for chunk_id, _ in file_chunks(txn, entry):
                        value = txn.get("objects", chunk_id.raw)
                        if value is None:
                            raise MissingObject(f"chunk {chunk_id.hex()} vanished during checkout")
                        out.write(framing.unframe(value)[1])
                os.chmod(target, entry.mode)
                count += 1
                done += entry.size
                if progress:
                    progress(done, total)
        if os.path.lexists(dest):
            raise ConflictError(f"destination appeared while checking out: {dest}")
        os.rename(temp, dest)
    except OSError as exc:
        shutil.rmtree(temp, ignore_errors=True)
        raise RestoreError(f"cannot write {dest}: {exc.strerror}; nothing was created") from None
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
    return count
