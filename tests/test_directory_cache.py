"""The directory cache of the hooks' and rewind's snapshots: a directory whose listing,
ignore files and options are unchanged is taken from its row, and every change (in place,
in the same clock tick, in an ancestor's ignore file, a new or removed entry) still shows."""

import os
import time

import pytest

from agentcas import Store
from agentcas.cas.digest import Digest
from agentcas.workspace import snapshot
from agentcas.workspace.restore import list_files

THREAD = "claude/dircache"
HOUR_NS = 3600 * 10**9


def checkpoint(store, ws) -> str:
    """The tree id of a hook-style checkpoint of `ws` (the directory cache in use)."""
    return store.sessions.checkpoint(str(ws), THREAD, "step", lambda state: b"").tree


def fresh_tree(ws) -> str:
    """The tree a store with no cache rows makes of `ws`: what every checkpoint must equal."""
    return checkpoint(Store.memory(), ws)


def paths(store, tree: str) -> set:
    with store.backends.source.reading() as objects:
        return {path for path, _ in list_files(objects, Digest(bytes.fromhex(tree))) if not path.endswith("/")}


@pytest.fixture
def ws(tmp_path):
    root = tmp_path / "ws"
    for rel in ("top.txt", "a/one.txt", "a/deep/two.txt", "a/deep/three.log", "b/four.txt"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(f"{rel}\n")
    return root


@pytest.fixture
def looked_at(monkeypatch):
    """The directories a snapshot looked at entry by entry: {rel dir: files_only}."""
    seen: dict = {}
    real = snapshot.Snapshotter._children

    def spy(self, rel_dir, abs_dir, listing, files_only=False):
        seen[rel_dir] = files_only
        return real(self, rel_dir, abs_dir, listing, files_only)
    monkeypatch.setattr(snapshot.Snapshotter, "_children", spy)
    return seen


def frozen_clock(monkeypatch, recent: set) -> None:
    """A file system whose clock does not move: every entry's mtime and ctime are fixed,
    entries named in `recent` at now (written in the tick of the snapshot), the others two
    hours ago; RACY_NS is an hour. A rewrite of the same size in place is then invisible to
    any stat, as a rewrite within one clock tick is."""
    now = time.time_ns()
    monkeypatch.setattr(snapshot, "RACY_NS", HOUR_NS)
    real = snapshot._list_directory

    def frozen(st, when):
        fields = list(st[:10])
        fields[7:10] = [when // 10**9] * 3
        return os.stat_result(fields, {"st_atime_ns": when, "st_mtime_ns": when, "st_ctime_ns": when})

    def listed(path, top):
        listing = real(path, top)
        stats = [frozen(st, now if name in recent else now - 2 * HOUR_NS)
                 for name, st in zip(listing.names, listing.stats)]
        return snapshot._Listing(listing.names, stats)
    monkeypatch.setattr(snapshot, "_list_directory", listed)


def test_an_unchanged_directory_is_taken_from_its_row_and_only_the_changed_path_is_looked_at(ws, monkeypatch,
                                                                                              looked_at):
    monkeypatch.setattr(snapshot, "RACY_NS", 0)
    store = Store.memory()
    first = checkpoint(store, ws)
    assert set(looked_at) == {"", "a", "a/deep", "b"}
    looked_at.clear()
    assert checkpoint(store, ws) == first
    assert looked_at == {}   # nothing changed: no directory looked at entry by entry
    (ws / "a" / "deep" / "two.txt").write_text("changed\n")
    looked_at.clear()
    changed = checkpoint(store, ws)
    # The changed directory is looked at; its ancestors only for their files (their trees are built again).
    assert looked_at == {"a/deep": False, "a": True, "": True}
    assert changed != first and changed == fresh_tree(ws)


def test_every_kind_of_change_shows_through_the_cache(ws, monkeypatch):
    monkeypatch.setattr(snapshot, "RACY_NS", 0)
    store = Store.memory()
    checkpoint(store, ws)
    steps = [
        lambda: (ws / "a" / "deep" / "new.txt").write_text("new\n"),
        lambda: (ws / "b" / "four.txt").unlink(),
        lambda: (ws / "a" / "made" / "inner").mkdir(parents=True),
        lambda: (ws / "a" / "made" / "inner" / "x.txt").write_text("x\n"),
        lambda: os.chmod(ws / "a" / "one.txt", 0o755),
        lambda: os.rename(ws / "a" / "deep", ws / "a" / "moved"),
        lambda: (ws / "a" / "made" / "inner" / snapshot.RESTORED_MARKER).write_text(""),
        lambda: (ws / "top.txt").write_text("top.txt\n"),   # same bytes, new stat
    ]
    for step in steps:
        step()
        assert checkpoint(store, ws) == fresh_tree(ws)


def test_an_ancestors_ignore_file_reaches_directories_that_did_not_change(ws, monkeypatch):
    monkeypatch.setattr(snapshot, "RACY_NS", 0)
    store = Store.memory()
    (ws / ".gitignore").write_text("# nothing yet\n")
    before = checkpoint(store, ws)
    assert "a/deep/three.log" in paths(store, before)
    (ws / ".gitignore").write_text("*.log\n")
    after = checkpoint(store, ws)
    assert "a/deep/three.log" not in paths(store, after) and after == fresh_tree(ws)
    (ws / ".gitignore").unlink()
    assert "a/deep/three.log" in paths(store, checkpoint(store, ws))


def test_a_rewrite_in_the_same_clock_tick_is_seen(ws, monkeypatch):
    """The racy case: a file rewritten in place with the same size within the tick of the
    previous snapshot leaves every stat as it was; its directory must not have been cached."""
    frozen_clock(monkeypatch, recent={"two.txt"})
    store = Store.memory()
    checkpoint(store, ws)
    (ws / "a" / "deep" / "two.txt").write_text("A/DEEP/TWO.TXT\n")   # same size, same inode
    tree = checkpoint(store, ws)
    assert tree == fresh_tree(ws)


def test_an_ignore_file_rewritten_in_the_same_clock_tick_reaches_its_subdirectories(ws, monkeypatch):
    frozen_clock(monkeypatch, recent={".gitignore"})
    store = Store.memory()
    (ws / ".gitignore").write_text("*.aaa\n")
    checkpoint(store, ws)
    (ws / ".gitignore").write_text("*.log\n")   # same size, same inode, same (frozen) times
    tree = checkpoint(store, ws)
    assert "a/deep/three.log" not in paths(store, tree) and tree == fresh_tree(ws)


def test_version_1_rows_are_not_used_and_are_written_again_as_version_2(ws, monkeypatch, looked_at):
    monkeypatch.setattr(snapshot, "RACY_NS", 0)
    store = Store.memory()
    first = checkpoint(store, ws)
    table = store.environment._tables["statcache"]
    keys = [key for key in table if key.startswith(snapshot.DIR_CACHE_KEY)]
    assert len(keys) == 4
    for key in keys:   # what an older agentcas wrote: u8 1, own digest, stat digest, tree id
        payload = snapshot.unseal("statcache", key, table[key])
        table[key] = snapshot.seal("statcache", key, b"\x01" + payload[1:97])
    looked_at.clear()
    assert checkpoint(store, ws) == first
    assert set(looked_at) == {"", "a", "a/deep", "b"}
    table = store.environment._tables["statcache"]
    assert all(snapshot.unseal("statcache", key, table[key])[:1] == b"\x02" for key in keys)
    looked_at.clear()
    assert checkpoint(store, ws) == first and looked_at == {}


def test_a_skipped_path_counts_for_its_own_directory_only(ws, tmp_path, monkeypatch, looked_at):
    """A hook skips its transcript (here outside the workspace), a rewind's checkpoint
    skips nothing: they share the rows. A path skipped inside the workspace changes its
    directory's key, so a later checkpoint that keeps it does not take the row."""
    monkeypatch.setattr(snapshot, "RACY_NS", 0)
    store = Store.memory()
    transcript = tmp_path / "transcript.jsonl"
    transcript.write_text("{}\n")
    first = store.sessions.checkpoint(str(ws), THREAD, "hook", lambda state: b"", skip_files=[str(transcript)]).tree
    looked_at.clear()
    assert checkpoint(store, ws) == first and looked_at == {}
    inside = ws / "a" / "deep" / "two.txt"
    skipping = store.sessions.checkpoint(str(ws), THREAD, "hook", lambda state: b"", skip_files=[str(inside)]).tree
    assert "a/deep/two.txt" not in paths(store, skipping)
    assert checkpoint(store, ws) == first
