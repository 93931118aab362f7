"""Trees as deep as the OS allows work in every command; deeper crafted ones are refused clearly.

Linux limits a path handed to a system call to PATH_MAX (4,096 bytes with its NUL), not
the depth of a directory tree: dirfd-relative mkdirs nest without limit. A commit reads
the workspace by absolute paths, so the deepest workspace it can read has paths of up
to 4,095 bytes; with one-letter names that is about 2,000 levels below the workspace.
agentcas therefore caps a checkpoint's relative paths at 4,095 bytes (objects.MAX_PATH_BYTES)
and restores dirfd-relative, so such a tree checks out wherever DEST is.
"""

from __future__ import annotations

import os
import time

import pytest

from agentcas import Store
from agentcas.cas import encoding, framing
from agentcas.cas.objects import MAX_PATH_BYTES
from agentcas.workspace.restore import remove_tree

from support.bundles import ALICE, Craft
from support.cli import run_cli
from support.store_state import store_rows

PATH_MAX = os.pathconf("/", "PC_PATH_MAX")


def deep_workspace(root, leaf: bytes = b"deep\n"):
    """A workspace with a file `d/d/.../d/f` whose absolute path is PATH_MAX - 1 bytes
    (or one level less), built with dirfd-relative mkdirs; (workspace, depth, relative path)."""
    root.mkdir()
    (root / "top.txt").write_text("top\n")
    depth = (PATH_MAX - 1 - len(str(root)) - len("/f")) // 2
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir("d", dir_fd=fd)
            child = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = child
        out = os.open("f", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
        os.write(out, leaf)
        os.close(out)
    finally:
        os.close(fd)
    rel = "d/" * depth + "f"
    assert len(str(root)) + 1 + len(rel) <= PATH_MAX - 1
    return root, depth, rel


def read_deep(root, rel: str) -> bytes:
    """A file's bytes by a path relative to `root` (dirfd-relative: DEST may be longer)."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        inner = os.open(rel, os.O_RDONLY, dir_fd=fd)
        try:
            return os.read(inner, 1 << 20)
        finally:
            os.close(inner)
    finally:
        os.close(fd)


@pytest.fixture
def deep(tmp_path):
    ws, depth, rel = deep_workspace(tmp_path / "w")
    yield ws, depth, rel
    remove_tree(str(tmp_path))  # pytest's own cleanup recurses


def test_a_tree_as_deep_as_the_os_allows_works_everywhere(deep, tmp_path):
    ws, depth, rel = deep
    assert depth > 1900  # what PATH_MAX allows here, far past Python's recursion limit
    store = tmp_path / "s"
    assert run_cli("init", store).code == 0
    (tmp_path / "shallow").mkdir()
    (tmp_path / "shallow" / "top.txt").write_text("top\n")
    assert run_cli("commit", tmp_path / "shallow", "-m", "shallow", store=store).code == 0
    time.sleep(2.1)  # past the stat cache's racy window, so the deep file gets a cache row
    committed = run_cli("commit", ws, "-m", "deep", store=store)
    assert committed.code == 0, committed
    unchanged = run_cli("--json", "commit", ws, "-m", "deep again", store=store)
    assert unchanged.code == 0, unchanged
    assert unchanged.json()["cached_files"] == 2  # its LMDB key is hashed: a path's is too long
    assert run_cli("fsck", store=store).code == 0
    shown = run_cli("--json", "show", "main", "--files", store=store)
    assert shown.code == 0, shown
    assert [f["path"] for f in shown.json()["files"]] == [rel, "top.txt"]
    diff = run_cli("--json", "diff", "main~2", "main", store=store)
    assert diff.code == 0, diff
    assert [f["path"] for f in diff.json()["added"]] == [rel]
    # DEST deeper in the file system than the workspace: the restore is dirfd-relative.
    dest = tmp_path / ("o" * 40) / "out"
    out = run_cli("checkout", "main", dest, store=store)
    assert out.code == 0, out
    assert read_deep(dest, rel) == b"deep\n"
    bundle = tmp_path / "deep.bundle"
    exported = run_cli("export", "main", "-o", bundle, store=store)
    assert exported.code == 0, exported
    other = tmp_path / "t"
    assert run_cli("init", other).code == 0
    imported = run_cli("import", bundle, "--allow-unsigned", store=other)
    assert imported.code == 0, imported
    assert run_cli("fsck", store=other).code == 0
    again = run_cli("checkout", "main", tmp_path / "again", store=other)
    assert again.code == 0, again
    assert read_deep(tmp_path / "again", rel) == b"deep\n"
    drilled = run_cli("drill", "--checkpoint", "main", store=store)
    assert drilled.code == 0, drilled


def _nested_bundle(depth: int) -> bytes:
    """A signed bundle whose one file sits `depth` directories deep (`d/d/.../f`)."""
    craft = Craft()
    child = craft.tree([craft.file("f", b"deep\n")])
    for _ in range(depth):
        child = craft.tree([{"name": "d", "type": "dir", "id": child.hex()}])
    cp = craft.checkpoint(child)
    entry = craft.file("f", b"deep\n")
    craft.records.pop()  # the same chunk is already recorded
    craft.finish(cp, [{"path": "d/" * depth + "f", "type": "file", "size": entry["size"], "mode": "0644",
                       "id": entry["id"]}])
    craft.sign()
    return craft.bytes()


@pytest.fixture
def receiver_dir(tmp_path):
    path = tmp_path / "r"
    assert run_cli("init", path).code == 0
    (tmp_path / "alice.pub").write_text(ALICE.public.to_line("alice"))
    assert run_cli("trust", "add", "alice", tmp_path / "alice.pub", store=path).code == 0
    yield path
    remove_tree(str(tmp_path))


def test_a_crafted_bundle_1500_deep_imports_and_checks_out(receiver_dir, tmp_path):
    path = tmp_path / "b1500.bundle"
    path.write_bytes(_nested_bundle(1500))
    result = run_cli("import", path, store=receiver_dir)
    assert result.code == 0, result
    assert run_cli("fsck", store=receiver_dir).code == 0
    assert run_cli("show", "main", "--files", store=receiver_dir).code == 0
    assert run_cli("checkout", "main", tmp_path / "out", store=receiver_dir).code == 0
    assert read_deep(tmp_path / "out", "d/" * 1500 + "f") == b"deep\n"


@pytest.mark.parametrize("depth", [2100, 5000])
def test_a_crafted_bundle_deeper_than_path_max_is_refused(depth, receiver_dir, tmp_path):
    path = tmp_path / f"b{depth}.bundle"
    path.write_bytes(_nested_bundle(depth))
    before = store_rows(receiver_dir)
    result = run_cli("import", path, store=receiver_dir)
    assert result.code == 4, result
    assert f"at most {MAX_PATH_BYTES}" in result.err and "Traceback" not in result.err
    assert "internal error" not in result.err
    assert store_rows(receiver_dir) == before


def test_list_files_and_walks_need_no_recursion(tmp_path):
    """The same deep tree through the Python API, with a small recursion limit."""
    import sys
    store = Store.memory()
    tree_doc = encoding.encode({"entries": []})
    from agentcas.cas.digest import hash_object
    from agentcas.cas.store import save_object
    child = hash_object("tree", tree_doc)
    frames = {child.raw: framing.frame(framing.KIND_TREE, tree_doc)}
    for _ in range(1000):
        doc = encoding.encode({"entries": [{"id": child.hex(), "name": "d", "type": "dir"}]})
        child = hash_object("tree", doc)
        frames[child.raw] = framing.frame(framing.KIND_TREE, doc)
    store.environment.write(lambda txn: [save_object(txn, __import__("agentcas").cas.digest.Digest(k), v)
                                     for k, v in frames.items()])
    from agentcas.workspace.restore import list_files
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(200)
    try:
        with store.source.reading() as txn:
            paths = [p for p, _ in list_files(txn, child)]
    finally:
        sys.setrecursionlimit(limit)
    assert len(paths) == 1000 and paths[-1] == "d/" * 1000


def test_an_ancestor_deeper_than_path_max_is_refused_too(receiver_dir, tmp_path):
    """The head's tree is shallow; an ancestor's is 2,100 deep: the closure walk refuses it."""
    craft = Craft()
    child = craft.tree([craft.file("f", b"deep\n")])
    for _ in range(2100):
        child = craft.tree([{"name": "d", "type": "dir", "id": child.hex()}])
    ancestor = craft.checkpoint(child)
    top = craft.file("top.txt", b"top\n")
    head = craft.checkpoint(craft.tree([top]), parents=[ancestor])
    craft.finish(head, [{"path": "top.txt", "type": "file", "size": top["size"], "mode": "0644", "id": top["id"]}],
                 checkpoints=[head, ancestor])
    craft.sign()
    path = tmp_path / "ancestor.bundle"
    path.write_bytes(craft.bytes())
    before = store_rows(receiver_dir)
    result = run_cli("import", path, store=receiver_dir)
    assert result.code == 4 and f"at most {MAX_PATH_BYTES}" in result.err, result
    assert store_rows(receiver_dir) == before


def test_fsck_refuses_a_stored_tree_deeper_than_path_max(tmp_path):
    from agentcas.cas.digest import hash_object
    from agentcas.cas.objects import EMPTY_POSITION, Checkpoint
    from agentcas.cas.store import save_object
    from agentcas.refs import threads
    from agentcas.refs.threads import ThreadState
    store, _ = Store.init(str(tmp_path / "store"))
    doc = encoding.encode({"entries": []})
    child, frames = hash_object("tree", doc), {}
    frames[child.raw] = framing.frame(framing.KIND_TREE, doc)
    for _ in range(2100):
        doc = encoding.encode({"entries": [{"id": child.hex(), "name": "d", "type": "dir"}]})
        child = hash_object("tree", doc)
        frames[child.raw] = framing.frame(framing.KIND_TREE, doc)
    cp = Checkpoint(child, (), "deep", "planted", "t", "2026-11-29T10:00:00.000000Z", {}, EMPTY_POSITION)

    def land(txn):
        for raw, framed in frames.items():
            save_object(txn, __import__("agentcas").cas.digest.Digest(raw), framed)
        save_object(txn, cp.digest(), framing.frame(framing.KIND_CHECKPOINT, cp.encode()))
        threads.set_if_equals(txn, "deep", None, ThreadState(cp.digest(), EMPTY_POSITION), "test", "planted")

    store.environment.write(land)
    store.environment.close()
    result = run_cli("fsck", store=tmp_path / "store")
    assert result.code == 4 and f"at most {MAX_PATH_BYTES}" in result.err, result
    checkout = run_cli("checkout", "deep", tmp_path / "out", store=tmp_path / "store")
    assert checkout.code == 4 and not (tmp_path / "out").exists()
