"""A damaged LMDB page: fsck names it (exit 4), other commands end with a line, never a signal.

LMDB trusts the node offsets inside a page; one flipped byte there makes it read past the
end of its memory-mapped file, and the kernel kills the reader with SIGBUS. The tests damage
a page the way a bad disk or a stray write would (one byte of a node offset) and run the real
command line. The page is found here with a small parser of LMDB's page layout of our own,
independent of agentcas.cas.lmdb_pages, which they test.
"""

from __future__ import annotations

import os
import struct

import lmdb
import pytest

from agentcas.cas.lmdb_pages import DamagedPage, damaged_pages

from support.cli import run_cli

PAGE = 4096


def _pages(data: bytes):
    for number in range(len(data) // PAGE):
        yield number, data[number * PAGE:(number + 1) * PAGE]


def _leaf_nodes(page: bytes):
    """(offset, flags, key, data offset) of each node of a leaf page."""
    _, _, flags, lower, _ = struct.unpack_from("<QHHHH", page)
    if flags != 0x02:
        return
    for index in range((lower - 16) // 2):
        (offset,) = struct.unpack_from("<H", page, 16 + 2 * index)
        _, _, node_flags, key_size = struct.unpack_from("<HHHH", page, offset)
        yield offset, node_flags, page[offset + 8:offset + 8 + key_size], offset + 8 + key_size


def _database_record(data: bytes, name: bytes) -> int:
    """Where in the file named database `name`'s record (an MDB_db) starts: the newer meta
    page (of pages 0 and 1) names the main database's root, a leaf holding that record."""
    metas = []
    for number in (0, 1):
        at = number * PAGE + 16 + 24  # page header, then magic, version, address, map size
        main_root = struct.unpack_from("<Q", data, at + 48 + 40)[0]
        txnid = struct.unpack_from("<Q", data, at + 2 * 48 + 8)[0]
        metas.append((txnid, main_root))
    main_root = max(metas)[1]
    for _, node_flags, key, at in _leaf_nodes(data[main_root * PAGE:(main_root + 1) * PAGE]):
        if node_flags & 0x02 and key == name:  # F_SUBDATA: the value is the database's record
            return main_root * PAGE + at
    raise AssertionError(f"no database {name!r}")


def database_root(data_file, name: bytes) -> int:
    """The root page of named database `name`."""
    data = open(data_file, "rb").read()
    return struct.unpack_from("<Q", data, _database_record(data, name) + 40)[0]


def set_database_root(data_file, name: bytes, page: int) -> None:
    data = bytearray(open(data_file, "rb").read())
    struct.pack_into("<Q", data, _database_record(data, name) + 40, page)
    open(data_file, "wb").write(bytes(data))


def damage_first_offset(store, database: bytes, high_byte: int = 0xFF) -> int:
    """Set the high byte of node 0's offset on `database`'s root leaf page; return the page."""
    data_file = store / "data.mdb"
    root = database_root(data_file, database)
    with open(data_file, "r+b") as handle:
        handle.seek(root * PAGE + 17)
        handle.write(bytes([high_byte]))
    return root


@pytest.fixture
def damaged_refs(tmp_path, workspace):
    """A store whose refs database's page has node 0's offset pointing 60 KiB past the page."""
    store = tmp_path / "store"
    assert run_cli("init", store).code == 0
    assert run_cli("commit", workspace, "-m", "one", store=store).code == 0
    assert run_cli("commit", workspace, "-m", "two", "--thread", "side", store=store).code == 0
    compact(store)
    page = damage_first_offset(store, b"refs")
    # The damaged offset reaches at most 64 KiB past the page: it faults only beyond the file's end.
    assert os.path.getsize(store / "data.mdb") < (page * PAGE) + 0xFF00
    return store, page


def compact(store) -> None:
    """Rewrite data.mdb as LMDB's compacting copy: pages in tree order, no free pages, so
    the small databases written last (refs among them) lie near the file's end whatever
    pages the commits happened to reuse."""
    (store / "compact").mkdir()
    env = lmdb.open(str(store), max_dbs=64, readonly=True)
    try:
        env.copy(str(store / "compact"), compact=True)
    finally:
        env.close()
    os.replace(store / "compact" / "data.mdb", store / "data.mdb")
    os.rmdir(store / "compact")


def test_fsck_names_a_damaged_page_instead_of_dying_by_sigbus(damaged_refs):
    store, page = damaged_refs
    result = run_cli("fsck", store=store)
    assert result.code == 4, result  # it was -7: killed by SIGBUS, no message
    lines = result.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("agentcas: error: store database is corrupt: ")
    assert f"page {page} of data.mdb (in the 'refs' database): node 0's offset " in lines[0]
    assert "lies outside the page's nodes" in lines[0]


@pytest.mark.parametrize("command", [["log"], ["branch"], ["show", "main"], ["reflog", "main"]])
def test_other_commands_meeting_a_damaged_page_end_with_a_line_pointing_to_fsck(damaged_refs, command):
    store, page = damaged_refs
    result = run_cli(*command, store=store)
    assert result.code == 4, result
    lines = result.err.splitlines()
    assert len(lines) == 1, result
    assert lines[0].startswith(f"agentcas: error: store database is corrupt: reading the store at {store} "
                               f"crashed with a bus error at page {page} of data.mdb (in the 'refs' database)")
    assert lines[0].endswith("run 'agentcas fsck' to see what is damaged")


@pytest.mark.parametrize("root", ["overflow", "meta"])
def test_an_lmdb_corruption_error_is_an_integrity_error_with_one_line(tmp_path, workspace, root):
    """MDB_CORRUPTED met by any command (here checkout) is exit 4, not an internal error."""
    store = tmp_path / "store"
    assert run_cli("init", store).code == 0
    assert run_cli("commit", workspace, "-m", "one", store=store).code == 0
    # Point the refs database's root at a page that is not a tree page: the first page
    # of an overflow run (LMDB: "MDB_CORRUPTED: Located page was wrong type"), or meta
    # page 1 (LMDB fails the transaction: "MDB_BAD_TXN").
    data_file = store / "data.mdb"
    data = data_file.read_bytes()
    overflow = next(n for n, page in _pages(data) if n > 1 and struct.unpack_from("<H", page, 10)[0] & 0x04)
    set_database_root(data_file, b"refs", overflow if root == "overflow" else 1)
    result = run_cli("checkout", "main", tmp_path / "out", store=store)
    assert result.code == 4, result  # was 1: "internal error: CorruptedError ... MDB_CORRUPTED"
    lines = result.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("agentcas: error: store database is corrupt: ")
    assert ("MDB_CORRUPTED" if root == "overflow" else "MDB_BAD_TXN") in lines[0]
    assert lines[0].endswith("run 'agentcas fsck' to see what is damaged")
    assert not (tmp_path / "out").exists()


def test_store_failure_maps_every_lmdb_corruption_class_to_exit_4():
    from agentcas.cas.lmdb_store import store_failure
    for exc in (lmdb.CorruptedError("mdb_get: MDB_CORRUPTED"), lmdb.PageNotFoundError("MDB_PAGE_NOTFOUND"),
                lmdb.PanicError("MDB_PANIC")):
        failure = store_failure(exc, "/s")
        assert failure.exit_code == 4 and str(failure).startswith("store database is corrupt: ")


def test_a_sound_store_has_no_damaged_pages(tmp_path, workspace):
    store = tmp_path / "store"
    assert run_cli("init", store).code == 0
    for thread in ("main", "a", "b"):
        assert run_cli("commit", workspace, "-m", thread, "--thread", thread, store=store).code == 0
    assert damaged_pages(str(store / "data.mdb")) == []


def test_every_byte_of_a_node_offset_is_checked(tmp_path, workspace):
    """Each value of either byte of node 0's offset that leaves the page's nodes is reported
    (the probe found 71 of 255 values of one byte that kill LMDB; all are caught here)."""
    store = tmp_path / "store"
    assert run_cli("init", store).code == 0
    assert run_cli("commit", workspace, "-m", "one", store=store).code == 0
    data_file = store / "data.mdb"
    root = database_root(data_file, b"refs")
    original = data_file.read_bytes()
    upper = struct.unpack_from("<H", original, root * PAGE + 14)[0]
    for byte in (16, 17):
        for value in range(256):
            damaged = bytearray(original)
            damaged[root * PAGE + byte] = value
            offset = struct.unpack_from("<H", damaged, root * PAGE + 16)[0]
            data_file.write_bytes(bytes(damaged))
            found = damaged_pages(str(data_file))
            if upper <= offset <= PAGE - 8:
                continue  # inside the nodes: a wrong node, which LMDB reads within the page
            assert found and found[0].page == root and found[0].database == "refs", (byte, value)


def test_a_page_past_the_end_of_a_truncated_file_is_reported(tmp_path, workspace):
    store = tmp_path / "store"
    assert run_cli("init", store).code == 0
    assert run_cli("commit", workspace, "-m", "one", store=store).code == 0
    data_file = store / "data.mdb"
    size = data_file.stat().st_size
    os.truncate(data_file, size - 2 * PAGE)
    found = damaged_pages(str(data_file))
    assert len(found) == 1 and "the meta page says the file holds" in found[0].problem
    result = run_cli("fsck", store=store)
    assert result.code == 4 and len(result.err.splitlines()) == 1, result


def test_describe_names_the_database_or_a_free_page():
    assert DamagedPage(7, "x", free=True).describe() == "page 7 of data.mdb (a free page, in no database's tree): x"
    assert DamagedPage(7, "x", "refs").describe() == "page 7 of data.mdb (in the 'refs' database): x"
