"""Make an existing workspace equal to a stored tree, touching only what differs.

Used by `rewind`: the workspace was just snapshot (as tree `current`, with the git-aware
rules: `.git` never read, `.gitignore` / `.agentcasignore` honoured), and must become
`target`.

1. Diff: the two trees are walked together, skipping every subtree whose id is equal, so
   a 100,000-file workspace with 10 differences reads ~20 trees. A path of `target` that
   the workspace's ignore rules exclude now, or inside `.git`, is left out: ignored files
   and `.git` are never touched.
2. Verify: every file to write is read from the store and checked (each chunk against its
   id, the whole against the file id) before a byte of the workspace is written; a path
   where a file must go that is a directory still holding ignored files is refused then.
3. Apply: files `target` lacks are removed, then directories left empty that it lacks;
   each file to write goes to a temporary `.<name>.agentcas-rewind-<hex>` beside it,
   verified again while written, fsynced, and renamed over the old one. A SIGKILL leaves
   every file old or new, never half-written; running the same sync again completes it
   (and removes temporaries a killed run left).
"""

from __future__ import annotations

import os
import re
import secrets
import stat
from dataclasses import dataclass

from agentcas.cas import crashpoints, framing
from agentcas.cas.digest import Digest
from agentcas.cas.objects import Tree, TreeEntry
from agentcas.cas.source import ObjectSource, load_object
from agentcas.cas.system_errors import from_os_error
from agentcas.errors import ConflictError
from agentcas.workspace.restore import MissingObject, verified_chunks, write_verified
from agentcas.workspace.snapshot import GIT_DIR, GIT_IGNORE_FILE, IGNORE_FILE

TEMP_MARK = ".agentcas-rewind-"
_TEMP_NAME = re.compile(r"^\..*\.agentcas-rewind-[0-9a-f]{12}$")


@dataclass(frozen=True)
class SyncResult:
    written: tuple[str, ...]     # files created or replaced
    removed: tuple[str, ...]     # files removed

    def to_json(self) -> dict:
        return {"written": list(self.written), "removed": list(self.removed)}


def _tree(txn, digest: Digest) -> Tree:
    data = load_object(txn, digest, framing.KIND_TREE)
    if data is None:
        raise MissingObject(f"tree {digest.hex()} is missing from the store")
    return Tree.decode(data)


def diff_trees(txn, current: Digest | None, target: Digest) -> tuple[dict, set, set]:
    """({path: entry} of files to write, {paths} of files to remove, {dirs} target lacks)."""
    write, remove, gone_dirs = {}, set(), set()
    stack: list[tuple[str, Digest | None, Digest | None]] = [("", current, target)]
    while stack:
        prefix, old_id, new_id = stack.pop()
        if old_id == new_id:
            continue
        old = {e.name: e for e in _tree(txn, old_id).entries} if old_id is not None else {}
        new = {e.name: e for e in _tree(txn, new_id).entries} if new_id is not None else {}
        for name in old.keys() | new.keys():
            path = prefix + name
            a, b = old.get(name), new.get(name)
            a_dir = a is not None and a.type == "dir"
            b_dir = b is not None and b.type == "dir"
            if a_dir or b_dir:
                stack.append((path + "/", a.id if a is not None and a_dir else None,
                              b.id if b is not None and b_dir else None))
                if a_dir and not b_dir:
                    gone_dirs.add(path)
            if a is not None and not a_dir and (b is None or b_dir):
                remove.add(path)
            if b is not None and not b_dir and (a is None or a_dir or (a.id, a.mode) != (b.id, b.mode)):
                write[path] = b
    return write, remove, gone_dirs


class IgnoreRules:
    """The workspace's ignore rules as a git-aware snapshot reads them, loaded per directory."""

    def __init__(self, root: str):
        self.root = root
        self._specs: dict[str, object] = {}

    def _spec(self, rel_dir: str):
        if rel_dir not in self._specs:
            lines = []
            for name in (GIT_IGNORE_FILE, IGNORE_FILE):
                path = os.path.join(self.root, rel_dir, name)
                try:
                    if not stat.S_ISREG(os.lstat(path).st_mode):
                        continue
                    with open(path, encoding="utf-8-sig", errors="replace") as handle:
                        lines += handle.read().splitlines()
                except OSError:
                    continue
            if lines:
                import pathspec
                self._specs[rel_dir] = pathspec.GitIgnoreSpec.from_lines(lines)
            else:
                self._specs[rel_dir] = None
        return self._specs[rel_dir]

    def ignored(self, rel: str) -> bool:
        """Whether `rel` (a file) or a directory above it is excluded, or inside `.git`."""
        parts = rel.split("/")
        if GIT_DIR in parts or parts[-1] == ".agentcas":
            return True
        for end in range(1, len(parts) + 1):   # each directory on the way, then the file
            if end < len(parts) and parts[end - 1] == ".agentcas":
                return True
            if self._excluded("/".join(parts[:end]), end < len(parts)):
                return True
        return False

    def _excluded(self, rel: str, is_dir: bool) -> bool:
        parts = rel.split("/")
        for depth in range(len(parts) - 1, -1, -1):   # the deepest ignore file with a match decides
            spec = self._spec("/".join(parts[:depth]))
            if spec is None:
                continue
            include = spec.check_file("/".join(parts[depth:]) + ("/" if is_dir else "")).include
            if include is not None:
                return include
        return False


def remove_stale_temporaries(root: str, paths) -> None:
    """Remove temporaries a killed sync left in the directories of `paths`."""
    for directory in sorted({os.path.dirname(os.path.join(root, p)) for p in paths}):
        try:
            names = os.listdir(directory)
        except OSError:
            continue
        for name in names:
            if _TEMP_NAME.match(name):
                try:
                    os.unlink(os.path.join(directory, name))
                except OSError:
                    pass


def sync_tree(objects: ObjectSource, root: str, current: Digest, target: Digest) -> SyncResult:
    """Make `root` (whose git-aware snapshot is `current`) equal to tree `target`."""
    root = os.path.realpath(root)
    rules = IgnoreRules(root)
    with objects.reading() as txn:
        write, remove, gone_dirs = diff_trees(txn, current, target)
        write = {p: e for p, e in write.items() if not rules.ignored(p)}
        remove_stale_temporaries(root, list(write) + list(remove))
        for path, entry in write.items():   # 2. verify everything first
            for _ in verified_chunks(txn, entry, path):
                pass
        _check_places(root, write, remove)
    try:
        for path in sorted(remove):
            try:
                os.unlink(os.path.join(root, path))
            except FileNotFoundError:
                pass
            crashpoints.reached("rewind.remove")
        for directory in sorted(gone_dirs, key=lambda d: -d.count("/")):
            try:
                os.rmdir(os.path.join(root, directory))
            except OSError:
                pass   # it still holds ignored files: kept, as they are
        with objects.reading(buffers=True) as txn:
            for path in sorted(write):
                _write_one(txn, root, path, write[path])
    except OSError as exc:
        raise from_os_error(exc, f"rewinding {root}", "run the rewind again to complete it") from None
    return SyncResult(tuple(sorted(write)), tuple(sorted(remove)))


def _check_places(root: str, write: dict, remove: set) -> None:
    """Refuse, before writing, a file whose place is a directory that will not be emptied."""
    for path in write:
        full = os.path.join(root, path)
        if os.path.isdir(full) and not os.path.islink(full):
            for directory, _, names in os.walk(full):
                for name in names:
                    rel = os.path.relpath(os.path.join(directory, name), root).replace(os.sep, "/")
                    if rel not in remove:
                        raise ConflictError(f"cannot rewind {path}: it is a directory holding {rel}, which the "
                                            "checkpoint does not have (ignored?); nothing was changed")


def _write_one(txn, root: str, path: str, entry: TreeEntry) -> None:
    full = os.path.join(root, path)
    directory = os.path.dirname(full)
    if os.path.isdir(full) and not os.path.islink(full) and not os.listdir(full):
        os.rmdir(full)   # an emptied directory where the file goes (_check_places refused a full one)
    os.makedirs(directory, exist_ok=True)
    temp = os.path.join(directory, f".{os.path.basename(full)}{TEMP_MARK}{secrets.token_hex(6)}")
    try:
        write_verified(txn, path, entry, temp)
        fd = os.open(temp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temp, full)
    except BaseException:
        try:
            os.unlink(temp)
        except OSError:
            pass
        raise
    crashpoints.reached("rewind.file")
