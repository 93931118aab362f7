"""Domain objects: invalid ones cannot be built or decoded; docs/FORMAT.md test vectors."""

import blake3
import pytest

from agentcas.cas import encoding
from agentcas.cas.digest import EMPTY, EMPTY_HISTORY, Digest, chain_prefix, hash_blob
from agentcas.cas.encoding import NotCanonical
from agentcas.cas.names import BadName
from agentcas.cas.objects import (EMPTY_POSITION, FORMAT_VERSION, MODE_EXEC, Checkpoint, ChunkList, ChunkRef,
                                  HistoryPosition, InvalidObject, Segment, Tree, TreeEntry)

# --- docs/FORMAT.md "Test vectors" (keep the two in step) ---------------------------------------
HELLO_ID = "8e4c7c1b99dbfd50e7a95185fead5ee1448fa904a2fdd778eaf5f2dbfd629a99"
WORLD_ID = "26e70f0a438787ee143979a9b519a4a330ea21e0a23d31fcb47051e70b8fe5ad"
EMPTY_BLOB_ID = "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"
EMPTY_TREE = b'{"entries":[]}'
EMPTY_TREE_ID = "6451c7423f8bab74a07b9833330bdb230b9e4df108f0eec5648c649fcddbf597"
MEMORY_TREE = (b'{"entries":[{"id":"' + HELLO_ID.encode() +
               b'","mode":420,"name":"notes.md","size":6,"type":"file"}]}')
MEMORY_TREE_ID = "a0aecf32c9edbb68cbcc070dfdf6bc671b1c802e5feb0973de78fd8bdcfff11f"
RUN_SH = b"#!/bin/sh\necho hi\n"
SMALL_TREE = (b'{"entries":[{"id":"' + EMPTY_BLOB_ID.encode() +
              b'","mode":420,"name":"empty.txt","size":0,"type":"file"},{"id":"' + MEMORY_TREE_ID.encode() +
              b'","name":"memory","type":"dir"},{"id":"4b694fa6468140836e2f43625aca1150ec72032dc23a12e13416ca026c647ef3"'
              b',"mode":493,"name":"run.sh","size":18,"type":"file"}]}')
SMALL_TREE_ID = "e64c2b799c53aab9b005688ce41fb68d48c559f4ffd44c05b403be6303e088bc"
CHECKPOINT = (b'{"author":"alice@example","created_at":"2026-11-29T12:00:00.000000Z","format":1,'
              b'"history":{"digest":"' + b"0" * 64 + b'","offset":0,"segment":null,"seq":0},"parents":[],'
              b'"reason":"first checkpoint","runtime":{"agentcas":"0.1.0","os":"Linux 6.1 x86_64",'
              b'"python":"3.11.7"},"thread":"main","tree":"' + SMALL_TREE_ID.encode() + b'"}')
CHECKPOINT_ID = "027dbff0b54ef304a202bb9af180e1ef50256ba449ffa0455a3471d05df29a67"
CHILD_ID = "e363390d40ca9607e1a873b2b26ca290ecaa6bd8c5ae25f9ff10c7ab92d9f784"
CHUNKLIST = b'{"chunks":[["' + HELLO_ID.encode() + b'",6],["' + WORLD_ID.encode() + b'",6]]}'
CHUNKLIST_ID = "8e738454d1d644837234cf52acb159e82c9457b2578cee982fe55ba8b7079bc7"
RECORD = b'{"role":"user"}\n'
RECORD_ID = "805fba57de26adbc529c77910e13959a33fa43dc2ea45bc55c205d441a411245"
D1 = "babc78cd72cc9f15e5e8de1f69a1e3042c43e9dae851090d3ca38deaf2cc6642"
D2 = "1ba62c465501dffb3a975566b23e6ec263bf814d0194c25c2e52efd4883a050f"
SEGMENT_ID = "18b3e39485c08ec3f2cf9d73f7820e119fd36a58c7b0a3b2044cc3098b9099be"


def D(hex_id):
    return Digest.parse(hex_id)


def memory_tree():
    return Tree.of([TreeEntry("notes.md", "file", hash_blob(b"hello\n"), 0o644, 6)])


def small_tree():
    return Tree.of([TreeEntry("run.sh", "file", hash_blob(RUN_SH), MODE_EXEC, len(RUN_SH)),
                    TreeEntry("memory", "dir", memory_tree().digest()),
                    TreeEntry("empty.txt", "file", EMPTY, 0o644, 0)])


def first_checkpoint():
    return Checkpoint(D(SMALL_TREE_ID), (), "main", "first checkpoint", "alice@example",
                      "2026-11-29T12:00:00.000000Z",
                      {"agentcas": "0.1.0", "python": "3.11.7", "os": "Linux 6.1 x86_64"})


def test_vector_blobs():
    assert hash_blob(b"hello\n").hex() == HELLO_ID
    assert hash_blob(b"world\n").hex() == WORLD_ID
    assert hash_blob(b"").hex() == EMPTY_BLOB_ID == EMPTY.hex()


def test_vector_empty_tree():
    assert Tree(()).encode() == EMPTY_TREE
    assert Tree(()).digest().hex() == EMPTY_TREE_ID
    assert Tree.decode(EMPTY_TREE) == Tree(())


def test_vector_trees():
    assert memory_tree().encode() == MEMORY_TREE and memory_tree().digest().hex() == MEMORY_TREE_ID
    tree = small_tree()
    assert [e.name for e in tree.entries] == ["empty.txt", "memory", "run.sh"]
    assert tree.encode() == SMALL_TREE
    assert tree.digest().hex() == SMALL_TREE_ID
    assert Tree.decode(SMALL_TREE) == tree


def test_vector_checkpoints():
    cp = first_checkpoint()
    assert cp.encode() == CHECKPOINT
    assert cp.digest().hex() == CHECKPOINT_ID
    decoded = Checkpoint.decode(CHECKPOINT)
    assert decoded == cp and decoded.runtime == cp.runtime and decoded.format == FORMAT_VERSION == 1
    child = Checkpoint(D(SMALL_TREE_ID), (D(CHECKPOINT_ID),), "main", "second", "alice@example",
                       "2026-11-29T12:00:01.000000Z", {})
    assert child.digest().hex() == CHILD_ID


def test_vector_chunklist():
    cl = ChunkList((ChunkRef(D(HELLO_ID), 6), ChunkRef(D(WORLD_ID), 6)))
    assert cl.encode() == CHUNKLIST and cl.digest().hex() == CHUNKLIST_ID and cl.size == 12
    assert ChunkList.decode(CHUNKLIST) == cl


def test_vector_history_chain_and_segment():
    d1 = chain_prefix(EMPTY_HISTORY, blake3.blake3(RECORD).digest())
    assert d1.hex() == D1
    d2 = chain_prefix(d1, blake3.blake3(b'{"role":"assistant"}\n').digest())
    assert d2.hex() == D2
    seg = Segment(EMPTY_POSITION, 0, None, 1, len(RECORD), d1, (ChunkRef(hash_blob(RECORD), len(RECORD)),))
    assert hash_blob(RECORD).hex() == RECORD_ID
    assert seg.digest_id().hex() == SEGMENT_ID
    assert Segment.decode(seg.encode()) == seg
    end = seg.end(seg.digest_id())
    assert (end.seq, end.offset, end.digest.hex()) == (1, 16, D1)


# --- invalid objects cannot be constructed ------------------------------------------------------
H = hash_blob(b"x")


@pytest.mark.parametrize("make", [
    lambda: TreeEntry("", "file", H, 0o644, 1),
    lambda: TreeEntry(".", "dir", H),
    lambda: TreeEntry("..", "dir", H),
    lambda: TreeEntry("a/b", "file", H, 0o644, 1),
    lambda: TreeEntry("a\\b", "file", H, 0o644, 1),
    lambda: TreeEntry("a\0b", "file", H, 0o644, 1),
    lambda: TreeEntry("a\nb", "file", H, 0o644, 1),
    lambda: TreeEntry("x" * 256, "file", H, 0o644, 1),
    lambda: TreeEntry("a", "file", H, 0o777, 1),
    lambda: TreeEntry("a", "file", H, 0o600, 1),
    lambda: TreeEntry("a", "file", H, 0o644, -1),
    lambda: TreeEntry("a", "file", H, 0o644, 0),         # empty file must have the empty id
    lambda: TreeEntry("a", "symlink", H),
    lambda: TreeEntry("a", "dir", H, 0o755),
    lambda: TreeEntry("a", "dir", H, size=3),
    lambda: TreeEntry("a", "dir", H, chunks=H),
    lambda: TreeEntry("a", "file", H.hex(), 0o644, 1),   # hex where a Digest belongs
    lambda: Tree((TreeEntry("b", "file", H, 0o644, 1), TreeEntry("a", "file", H, 0o644, 1))),
    lambda: Tree((TreeEntry("a", "file", H, 0o644, 1), TreeEntry("a", "dir", H))),
    lambda: Tree.of([TreeEntry("A", "file", H, 0o644, 1), TreeEntry("a", "file", H, 0o644, 1)]),
    lambda: Tree.of([TreeEntry("\u00e9", "file", H, 0o644, 1), TreeEntry("e\u0301", "file", H, 0o644, 1)]),
    lambda: ChunkList((ChunkRef(H, 1),)),
    lambda: ChunkRef(H, 0),
    lambda: ChunkRef(H.hex(), 1),
    lambda: HistoryPosition(None, 1, 0, EMPTY_HISTORY),
    lambda: HistoryPosition(H, 0, 0, EMPTY_HISTORY),
    lambda: HistoryPosition(None, 0, 5, EMPTY_HISTORY),
    lambda: HistoryPosition(None, 0, 0, H),
    lambda: HistoryPosition(H, -1, 0, H),
    lambda: Segment(EMPTY_POSITION, 0, None, 0, 0, H, ()),
    lambda: Segment(EMPTY_POSITION, 0, None, 1, 5, H, (ChunkRef(H, 4),)),
    lambda: Segment(EMPTY_POSITION, 1, None, 1, 1, H, (ChunkRef(H, 1),)),
    lambda: Checkpoint(H, (), "main", "", "a", "2026-11-29T12:00:00.000000Z"),
    lambda: Checkpoint(H, (), "main", "   ", "a", "2026-11-29T12:00:00.000000Z"),
    lambda: Checkpoint(H, (), "main", "x" * 513, "a", "2026-11-29T12:00:00.000000Z"),
    lambda: Checkpoint(H, (), "main", "\u20ac" * 342, "a", "2026-11-29T12:00:00.000000Z"),
    lambda: Checkpoint(H, (), "main", "ok", "a", "2026-11-29 12:00:00"),
    lambda: Checkpoint(H, (), "main", "ok", "a", 5),
    lambda: Checkpoint(H, (), "", "ok", "a", "2026-11-29T12:00:00.000000Z"),
    lambda: Checkpoint(H, (), "main", "ok", "a", "2026-11-29T12:00:00.000000Z", {"python": 3}),
])
def test_invalid_objects_cannot_be_constructed(make):
    with pytest.raises((InvalidObject, BadName)):  # BadName: names (an IntegrityError too)
        make()


def test_reason_limits_are_inclusive():
    ok = "x" * 512
    assert Checkpoint(H, (), "main", ok, "a", "2026-11-29T12:00:00.000000Z").reason == ok
    assert len(("\u20ac" * 341).encode()) == 1023
    Checkpoint(H, (), "main", "\u20ac" * 341 + "x", "a", "2026-11-29T12:00:00.000000Z")  # 1,024 bytes


def _tree_doc(**entry):
    base = {"name": "a", "type": "file", "id": HELLO_ID, "mode": 420, "size": 6}
    base.update(entry)
    return encoding.encode({"entries": [{k: v for k, v in base.items() if v is not None}]})


@pytest.mark.parametrize("data", [
    _tree_doc(extra=1),                  # closed set of entry fields
    _tree_doc(mode=511),
    _tree_doc(mode=None),
    _tree_doc(size=None),
    _tree_doc(name="../etc"),
    _tree_doc(name="/abs"),
    _tree_doc(type="dir"),               # directory entry with file fields
    _tree_doc(id="XYZ"),
    _tree_doc(size=True),
    encoding.encode({"entries": [{"name": "b", "type": "dir", "id": HELLO_ID},
                                 {"name": "a", "type": "dir", "id": HELLO_ID}]}),
    encoding.encode({"entries": {}}),
    encoding.encode({}),
    encoding.encode([]),
    b'{"entries":[] }',                  # not canonical
])
def test_invalid_trees_do_not_decode(data):
    with pytest.raises((InvalidObject, NotCanonical)):
        Tree.decode(data)


def _cp_doc(**changes):
    doc = encoding.decode(CHECKPOINT)
    doc.update(changes)
    return encoding.encode(doc)


@pytest.mark.parametrize("data", [
    _cp_doc(format=2),
    _cp_doc(parents="x"),
    _cp_doc(parents=["nothex"]),
    _cp_doc(author=5),
    _cp_doc(reason=""),
    _cp_doc(created_at=5),
    _cp_doc(runtime=[]),
    _cp_doc(history={"seq": 0}),
    _cp_doc(thread=7),
    _cp_doc(tree=None),
])
def test_invalid_checkpoints_do_not_decode(data):
    with pytest.raises(InvalidObject):
        Checkpoint.decode(data)


def test_newer_format_is_refused_with_a_clear_message():
    with pytest.raises(InvalidObject, match="newer than this agentcas reads.*upgrade"):
        Checkpoint.decode(_cp_doc(format=FORMAT_VERSION + 1))


def test_unknown_checkpoint_keys_are_ignored_but_change_the_id():
    data = _cp_doc(future_field="x")
    assert Checkpoint.decode(data) == first_checkpoint()


def test_format_md_states_every_vector():
    """docs/FORMAT.md and these tests must agree: every vector here appears there verbatim."""
    from pathlib import Path
    doc = (Path(__file__).resolve().parent.parent / "docs" / "FORMAT.md").read_text()
    for value in (HELLO_ID, WORLD_ID, EMPTY_BLOB_ID, EMPTY_TREE_ID, MEMORY_TREE_ID, SMALL_TREE_ID,
                  CHECKPOINT_ID, CHILD_ID, CHUNKLIST_ID, RECORD_ID, D1, D2, SEGMENT_ID,
                  hash_blob(RUN_SH).hex()):
        assert value in doc, value
    for data in (EMPTY_TREE, MEMORY_TREE, SMALL_TREE, CHECKPOINT, CHUNKLIST,
                 Segment(EMPTY_POSITION, 0, None, 1, len(RECORD), D(D1),
                         (ChunkRef(D(RECORD_ID), len(RECORD)),)).encode()):
        assert data.decode() in doc, data[:60]
    for context in ("agentcas 2026-11 tree v1", "agentcas 2026-11 checkpoint v1",
                    "agentcas 2026-11 chunklist v1", "agentcas 2026-11 rollout segment v1",
                    "agentcas 2026-11 signature v1", "agentcas 2026-11 history prefix v1",
                    "agentcas 2026-11 sealed table value v1"):
        assert context in doc, context
    from agentcas.cas.digest import OBJECT_CONTEXTS, PREFIX_CHAIN_CONTEXT
    from agentcas.cas import sealed
    assert set(OBJECT_CONTEXTS.values()) | {PREFIX_CHAIN_CONTEXT, sealed._CONTEXT} <= {
        line for line in doc.split('"')}
