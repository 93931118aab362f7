"""Refs: thread-name rules, compare-and-swap moves, reflog, revision syntax."""

import pytest

from agentcas.cas import framing
from agentcas.cas.digest import Digest, hash_blob
from agentcas.cas.objects import Checkpoint, Tree
from agentcas.cas.store import MemoryEnvironment, save_object
from agentcas.errors import IntegrityError, NotFound, UsageError
from agentcas.refs.names import BadThreadName, check_thread_name
from agentcas.refs.revisions import AmbiguousRevision, UnknownRevision, load_checkpoint, resolve
from agentcas.refs.threads import ThreadState, list_threads, read_reflog, read_thread, set_if_equals

from support.store_state import objects_of

TREE = Tree(()).digest()


@pytest.mark.parametrize("name", ["main", "feature/x", "a-b_c.d", "v1.2", "日本語", "a/b/c", "x" * 200,
                                  "a@b", "@x", "a-", "-dash",
                                  "\u05e9\u05dc\u05d5\u05dd", "caf\u00e9\u00a0x"])   # right-to-left text itself, U+00A0: names
def test_valid_thread_names(name):
    assert check_thread_name(name) == name


@pytest.mark.parametrize("name", ["", "@", "a..b", "a@{1}", "a b", "a~1", "a^", "a:b", "a?", "a*", "a[b",
                                  "a\\b", "a\x01b", "a\x7fb", "a\nb", "/a", "a/", "a//b", ".a", "a/.b",
                                  "a.lock", "a/b.lock/c", "a.", "x" * 201, "é" * 101, None,
                                  "t\udcff",  # UTF-8 only
                                  # what a log's id could use to reorder or break the lines showing it:
                                  "ab\u202ecd", "a\u2066b", "a\u200fb", "a\u009b2Jb", "a\x85b", "a\u2028b"])
def test_invalid_thread_names(name):
    with pytest.raises(BadThreadName) as info:
        check_thread_name(name)
    assert info.value.exit_code == 2


# --- a small history in a memory store ---------------------------------------------------------

def commit(store, thread, reason, parent=None, tree=TREE, when="2026-11-29T12:00:00.000000Z"):
    """Store a checkpoint and move `thread` to it (as Store.commit's final transaction does)."""
    def land(txn):
        state = read_thread(txn, thread)
        cp = Checkpoint(tree, () if parent is None else (parent,), thread, reason, "t", when)
        digest = cp.digest()
        save_object(txn, digest, framing.frame(framing.KIND_CHECKPOINT, cp.encode()))
        assert set_if_equals(txn, thread, state, ThreadState(digest), "commit", reason, history_implied=True)
        return digest
    return store.write(land)


@pytest.fixture
def chain():
    """main: c0 <- c1 <- c2 <- c3; returns (store, [c0, c1, c2, c3])."""
    store = MemoryEnvironment()
    ids = []
    for i in range(4):
        ids.append(commit(store, "main", f"step {i}", ids[-1] if ids else None))
    return store, ids


def rev(store, text):
    with store.reader() as txn:
        return resolve(txn, objects_of(store), text)


def test_set_if_equals_is_compare_and_swap():
    store = MemoryEnvironment()
    a, b = ThreadState(hash_blob(b"a")), ThreadState(hash_blob(b"b"))
    assert store.write(lambda txn: set_if_equals(txn, "t", None, a, "create", "m"))
    assert not store.write(lambda txn: set_if_equals(txn, "t", None, b, "create", "m"))  # exists
    assert not store.write(lambda txn: set_if_equals(txn, "t", b, b, "move", "m"))      # stale old
    with store.reader() as txn:
        assert read_thread(txn, "t") == a and len(read_reflog(txn, "t")) == 1
    assert store.write(lambda txn: set_if_equals(txn, "t", a, b, "move", "m"))
    with store.reader() as txn:
        assert read_thread(txn, "t") == b
        assert [e.action for e in read_reflog(txn, "t")] == ["move", "create"]
        assert [name for name, _ in list_threads(txn)] == ["t"]
    with pytest.raises(BadThreadName):
        store.write(lambda txn: set_if_equals(txn, "bad..name", None, a, "create"))


def test_failed_compare_and_swap_changes_nothing():
    store = MemoryEnvironment()
    a = ThreadState(hash_blob(b"a"))
    store.write(lambda txn: set_if_equals(txn, "t", None, a, "create"))
    with store.reader() as txn:
        before = {t: dict(txn.scan(t)) for t in ("refs", "reflog", "meta")}
    assert not store.write(lambda txn: set_if_equals(txn, "t", ThreadState(None), ThreadState(None), "x"))
    with store.reader() as txn:
        assert {t: dict(txn.scan(t)) for t in ("refs", "reflog", "meta")} == before


def test_reflog_newest_first_and_delete_removes_it(chain):
    store, ids = chain
    with store.reader() as txn:
        entries = read_reflog(txn, "main")
        assert [e.number for e in entries] == [3, 2, 1, 0]
        assert [e.new.checkpoint for e in entries] == ids[::-1]
        assert [e.message for e in entries] == ["step 3", "step 2", "step 1", "step 0"]
        olds = [getattr(e.old, "checkpoint", e.old) for e in entries]
        assert olds == [ids[2], ids[1], ids[0], None]
        assert all(e.time > 1.7e9 for e in entries)
        assert len(read_reflog(txn, "main", limit=2)) == 2
        assert read_reflog(txn, "mai") == []  # no prefix bleed between thread names
    commit(store, "main/sub", "other")
    commit(store, "mainx", "other")
    state = rev(store, "main")
    assert store.write(lambda txn: set_if_equals(txn, "main", ThreadState(state), None, "delete"))
    with store.reader() as txn:
        assert read_thread(txn, "main") is None and read_reflog(txn, "main") == []
        assert len(read_reflog(txn, "main/sub")) == 1 and len(read_reflog(txn, "mainx")) == 1


def test_damaged_ref_or_reflog_value_is_an_integrity_error(chain):
    store, _ = chain
    key = b"threads/main"

    def damage(table, k):
        def fn(txn):
            value = bytearray(txn.get(table, k))
            value[5] ^= 1
            txn.put(table, k, bytes(value))
        store.write(fn)

    damage("reflog", key + b"\0" + (2).to_bytes(8, "big"))
    with store.reader() as txn, pytest.raises(IntegrityError):
        read_reflog(txn, "main")
    damage("refs", key)
    with store.reader() as txn, pytest.raises(IntegrityError):
        read_thread(txn, "main")


def test_revisions(chain):
    store, (c0, c1, c2, c3) = chain
    assert rev(store, "main") == c3
    assert rev(store, c1.hex()) == c1
    assert rev(store, c1.hex()[:8]) == c1
    assert rev(store, c1.hex()[:9]) == c1  # odd length
    assert rev(store, "main~0") == c3
    assert rev(store, "main~") == rev(store, "main^") == rev(store, "main~1") == c2
    assert rev(store, "main~3") == rev(store, "main^^^") == rev(store, "main~1~2") == c0
    assert rev(store, c3.hex() + "~2") == c1
    assert rev(store, "main@{0}") == c3
    assert rev(store, "main@{1}") == c2
    assert rev(store, "main@{3}") == c0
    assert rev(store, "main@{1}~1") == c1


@pytest.mark.parametrize("text, error", [
    ("nosuch", UnknownRevision),
    ("main~4", UnknownRevision),          # past the first checkpoint
    ("main@{4}", UnknownRevision),
    ("nosuch@{0}", UnknownRevision),
    ("0000000", UnknownRevision),         # 7 hex: too short to be a prefix
    ("00000000", UnknownRevision),
    ("~1", UnknownRevision),
    ("", UsageError),
    ("x" * 2000, UsageError),
    ("main~\u0661", (UnknownRevision, UsageError)),     # Arabic-Indic one: git reads ASCII digits only
    ("main@{\uff11}", (UnknownRevision, UsageError)),   # fullwidth one
])
def test_bad_revisions(chain, text, error):
    store, _ = chain
    with pytest.raises(error) as info:
        rev(store, text)
    assert info.value.exit_code in (1, 2)


def test_non_checkpoint_ids_are_not_revisions(chain):
    store, ids = chain
    store.write(lambda txn: save_object(txn, TREE, framing.frame(framing.KIND_TREE, Tree(()).encode())))
    with pytest.raises(UnknownRevision):
        rev(store, TREE.hex())
    with pytest.raises(UnknownRevision):
        rev(store, TREE.hex()[:10])
    with pytest.raises(IntegrityError):
        load_checkpoint(objects_of(store), TREE)  # a tree is not a checkpoint
    with pytest.raises(NotFound):
        load_checkpoint(objects_of(store), hash_blob(b"absent"))


def test_ambiguous_prefix():
    """Two checkpoint-kind objects whose ids share 9 hex digits (crafted keys: only the kind is read)."""
    store = MemoryEnvironment()
    value = framing.frame(framing.KIND_CHECKPOINT, b"{}")
    a = Digest(bytes.fromhex("abcdef0123") + b"\x01" * 27)
    b = Digest(bytes.fromhex("abcdef0128") + b"\x02" * 27)
    chunk = Digest(bytes.fromhex("abcdef0200") + b"\x03" * 27)

    def put(txn):
        for digest, v in ((a, value), (b, value), (chunk, framing.frame(framing.KIND_CHUNK, b"x"))):
            txn.put("objects", digest.raw, v)
    store.write(put)
    for prefix in ("abcdef01", "abcdef012"):
        with pytest.raises(AmbiguousRevision, match="ambiguous") as info:
            rev(store, prefix)
        assert info.value.exit_code == 2
    assert rev(store, "abcdef0123") == a        # longer prefixes disambiguate
    assert rev(store, "abcdef0128") == b
    with pytest.raises(UnknownRevision):
        rev(store, "abcdef02")                  # only a chunk there


def test_thread_name_wins_over_hex_prefix(chain):
    store, (c0, _, _, c3) = chain
    name = c0.hex()[:8]
    commit(store, name, "a thread whose name spells a prefix")
    assert rev(store, name) != c0
    assert rev(store, c0.hex()[:9]) == c0


# --- reflog rows, version 2 (docs/FORMAT.md 6.2 and 9b) -----------------------------------------
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from agentcas.cas import encoding  # noqa: E402
from agentcas.cas.objects import EMPTY_POSITION, HistoryPosition  # noqa: E402
from agentcas.cas.sealed import seal, unseal  # noqa: E402
from agentcas.refs import threads  # noqa: E402

VECTOR_CP = Digest.parse("ea6d8eba31118ad81f9d57ec8bc598bbfb1e2ee1f240542a45bfec4c11e7c214")
VECTOR_SEG = Digest.parse("85c90073d7cf79e34265c66019c3df9082c41285aababed4a2c89b31086d8d74")
VECTOR_D1 = Digest.parse("babc78cd72cc9f15e5e8de1f69a1e3042c43e9dae851090d3ca38deaf2cc6642")
VECTOR_TIME = 1795953600000000
COMMIT_ROW = bytes.fromhex(
    "021200066169085c7000ea6d8eba31118ad81f9d57ec8bc598bbfb1e2ee1f240542a45bfec4c11e7c21406636f6d6d69"
    "7410666972737420636865636b706f696e74")
APPEND_ROW = bytes.fromhex(
    "020f00066169085c7001ea6d8eba31118ad81f9d57ec8bc598bbfb1e2ee1f240542a45bfec4c11e7c214ea6d8eba3111"
    "8ad81f9d57ec8bc598bbfb1e2ee1f240542a45bfec4c11e7c2140185c90073d7cf79e34265c66019c3df9082c41285aa"
    "babed4a2c89b31086d8d7410babc78cd72cc9f15e5e8de1f69a1e3042c43e9dae851090d3ca38deaf2cc6642046d6169"
    "6e00ea6d8eba31118ad81f9d57ec8bc598bbfb1e2ee1f240542a45bfec4c11e7c21406617070656e6410617070656e64"
    "2031207265636f726473")
KEY0 = b"threads/main\0" + (0).to_bytes(8, "big")


def test_reflog_row_vectors():
    state = ThreadState(VECTOR_CP, EMPTY_POSITION)
    assert threads.encode_reflog_payload(None, state, "commit", "first checkpoint", VECTOR_TIME,
                                         history_implied=True) == COMMIT_ROW
    assert seal("reflog", KEY0, COMMIT_ROW)[-8:].hex() == "0a779e656265af5c"
    fork = ThreadState(VECTOR_CP, HistoryPosition(VECTOR_SEG, 1, 16, VECTOR_D1),
                       threads.ForkOrigin("main", VECTOR_CP, 0))
    assert threads.encode_reflog_payload(VECTOR_CP, fork, "append", "append 1 records",
                                         VECTOR_TIME + 1) == APPEND_ROW
    entry = threads.decode_reflog_entry(KEY0, seal("reflog", KEY0, APPEND_ROW))
    assert (entry.old, entry.new, entry.action, entry.message) == (VECTOR_CP, fork, "append", "append 1 records")
    from pathlib import Path
    doc = (Path(__file__).resolve().parent.parent / "docs" / "FORMAT.md").read_text()
    assert COMMIT_ROW.hex() in doc and APPEND_ROW.hex() in doc and "0a779e656265af5c" in doc


def test_commit_rows_are_compact_and_take_the_history_from_the_checkpoint(chain):
    store, ids = chain
    with store.reader() as txn:
        rows = [unseal("reflog", bytes(k), v) for k, v in txn.scan("reflog")]
        entries = read_reflog(txn, "main", objects=objects_of(store))
        unresolved = read_reflog(txn, "main")
    assert all(row[:2] == b"\x02\x13" or row[:2] == b"\x02\x12" for row in rows)
    assert max(len(row) for row in rows) < 120  # was ~460 bytes of JSON
    assert [e.new.checkpoint for e in entries] == ids[::-1]
    histories = [load_checkpoint(objects_of(store), d).history for d in ids[::-1]]
    assert [e.new.history for e in entries] == histories and not any(e.history_implied for e in entries)
    # Without an object source (gc's roots) the entry says its history is the checkpoint's.
    assert all(e.history_implied and e.new.checkpoint == d for e, d in zip(unresolved, ids[::-1]))


def test_version_1_json_rows_still_read(chain):
    """Rows written by format 1 (JSON) sit beside version-2 rows and read the same way."""
    store, ids = chain
    position = HistoryPosition(VECTOR_SEG, 1, 16, VECTOR_D1)
    doc = {"old": ids[3].hex(), "new": ThreadState(ids[2], position).to_doc(), "action": "revert",
           "message": "revert to main~1", "time": VECTOR_TIME}
    key = b"threads/main\0" + (4).to_bytes(8, "big")
    store.write(lambda txn: txn.put("reflog", key, seal("reflog", key, encoding.encode(doc))))
    with store.reader() as txn:
        entry = read_reflog(txn, "main")[0]
    assert (entry.number, entry.old, entry.new, entry.action) == (4, ids[3], ThreadState(ids[2], position), "revert")
    assert entry.time == VECTOR_TIME / 1e6


@pytest.mark.parametrize("payload", [
    COMMIT_ROW[:-1] + b"",                        # message shorter than its length
    COMMIT_ROW + b"x",                            # bytes after the message
    b"\x03" + COMMIT_ROW[1:],                     # unknown version
    COMMIT_ROW[:1] + b"\x32" + COMMIT_ROW[2:],    # an unknown flag bit
    COMMIT_ROW[:1] + b"\x10" + COMMIT_ROW[2:],    # history implied without a checkpoint
    APPEND_ROW[:-20],                             # truncated
    b"\x02",
])
def test_malformed_version_2_rows_are_integrity_errors(payload):
    store = MemoryEnvironment()
    with pytest.raises(IntegrityError):
        threads.decode_reflog_entry(KEY0, seal("reflog", KEY0, payload), objects=objects_of(store))


def test_implied_history_of_a_missing_checkpoint_is_an_integrity_error():
    store = MemoryEnvironment()
    with pytest.raises(IntegrityError, match="missing"):
        threads.decode_reflog_entry(KEY0, seal("reflog", KEY0, COMMIT_ROW), objects=objects_of(store))


_ids = st.binary(min_size=32, max_size=32).map(Digest)


@st.composite
def _states(draw):
    seq = draw(st.integers(0, 2**40))
    history = EMPTY_POSITION if seq == 0 else HistoryPosition(draw(_ids), seq, draw(st.integers(seq, 2**50)),
                                                              draw(_ids))
    fork = draw(st.none() | st.builds(threads.ForkOrigin, st.text(min_size=1, max_size=20).filter(
        lambda t: "\ud800" > max(t) or True), st.none() | _ids, st.integers(0, 2**40)))
    return ThreadState(draw(st.none() | _ids), history, fork)


@given(old=st.none() | _ids, new=_states(), action=st.sampled_from(["commit", "fork", "append"]),
       message=st.text(max_size=50), time_us=st.integers(0, 2**63))
def test_reflog_rows_round_trip(old, new, action, message, time_us):
    try:
        message.encode("utf-8")
        if new.forked_from is not None:
            new.forked_from.thread.encode("utf-8")
    except UnicodeEncodeError:
        return
    payload = threads.encode_reflog_payload(old, new, action, message, time_us)
    entry = threads.decode_reflog_entry(KEY0, seal("reflog", KEY0, payload))
    assert (entry.old, entry.new, entry.action, entry.message) == (old, new, action, message)
    assert threads.encode_reflog_payload(entry.old, entry.new, entry.action, entry.message, time_us) == payload
