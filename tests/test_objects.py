"""Domain objects: invalid ones cannot be built or decoded; docs/FORMAT.md test vectors."""

import blake3
import pytest

from agentcas.cas import encoding
from agentcas.cas.digest import EMPTY, EMPTY_HISTORY, Digest, chain_prefix, hash_blob
from agentcas.cas.encoding import NotCanonical
from agentcas.cas.names import BadName
from agentcas.cas.objects import (
    EMPTY_POSITION,
    JSON_FORMAT,
    MODE_EXEC,
    PACKED_FORMAT,
    Checkpoint,
    CheckpointSeries,
    ChunkList,
    ChunkRef,
    HistoryPosition,
    InvalidObject,
    Segment,
    Tree,
    TreeEntry,
)

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


# The vectors of format 1 (JSON): stores written before format 2 hold these objects, so
# they must keep decoding to the same ids; `fmt` picks the byte form.
def memory_tree(fmt=JSON_FORMAT):
    return Tree(Tree.of([TreeEntry("notes.md", "file", hash_blob(b"hello\n"), 0o644, 6)]).entries, fmt)


def small_tree(fmt=JSON_FORMAT):
    return Tree(Tree.of([TreeEntry("run.sh", "file", hash_blob(RUN_SH), MODE_EXEC, len(RUN_SH)),
                         TreeEntry("memory", "dir", memory_tree(fmt).digest()),
                         TreeEntry("empty.txt", "file", EMPTY, 0o644, 0)]).entries, fmt)


def first_checkpoint(fmt=JSON_FORMAT, tree=SMALL_TREE_ID):
    return Checkpoint(D(tree), (), "main", "first checkpoint", "alice@example",
                      "2026-11-29T12:00:00.000000Z",
                      {"agentcas": "0.1.0", "python": "3.11.7", "os": "Linux 6.1 x86_64"}, format=fmt)


def test_vector_blobs():
    assert hash_blob(b"hello\n").hex() == HELLO_ID
    assert hash_blob(b"world\n").hex() == WORLD_ID
    assert hash_blob(b"").hex() == EMPTY_BLOB_ID == EMPTY.hex()


def test_vector_empty_tree():
    assert Tree((), JSON_FORMAT).encode() == EMPTY_TREE
    assert Tree((), JSON_FORMAT).digest().hex() == EMPTY_TREE_ID
    assert Tree.decode(EMPTY_TREE) == Tree((), JSON_FORMAT)


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
    assert decoded == cp and decoded.runtime == cp.runtime and decoded.format == JSON_FORMAT == 1
    child = Checkpoint(D(SMALL_TREE_ID), (D(CHECKPOINT_ID),), "main", "second", "alice@example",
                       "2026-11-29T12:00:01.000000Z", {}, format=JSON_FORMAT)
    assert child.digest().hex() == CHILD_ID


def test_vector_chunklist():
    cl = ChunkList((ChunkRef(D(HELLO_ID), 6), ChunkRef(D(WORLD_ID), 6)), JSON_FORMAT)
    assert cl.encode() == CHUNKLIST and cl.digest().hex() == CHUNKLIST_ID and cl.size == 12
    assert ChunkList.decode(CHUNKLIST) == cl


def test_vector_history_chain_and_segment():
    d1 = chain_prefix(EMPTY_HISTORY, blake3.blake3(RECORD).digest())
    assert d1.hex() == D1
    d2 = chain_prefix(d1, blake3.blake3(b'{"role":"assistant"}\n').digest())
    assert d2.hex() == D2
    seg = Segment(EMPTY_POSITION, 0, None, 1, len(RECORD), d1, (ChunkRef(hash_blob(RECORD), len(RECORD)),),
                  format=JSON_FORMAT)
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
    _cp_doc(created_at="\uff12\uff10\uff12\uff16-11-29T12:00:00.000000Z"),   # fullwidth digits: not the format's
    _cp_doc(runtime=[]),
    _cp_doc(history={"seq": 0}),
    _cp_doc(thread=7),
    _cp_doc(tree=None),
])
def test_invalid_checkpoints_do_not_decode(data):
    with pytest.raises(InvalidObject):
        Checkpoint.decode(data)


def test_newer_format_is_refused_with_a_clear_message():
    newer = PACKED_CHECKPOINT.replace(bytes.fromhex("060b0302"), bytes.fromhex("060b0303"), 1)
    with pytest.raises(InvalidObject, match="newer than this agentcas reads.*upgrade"):
        Checkpoint.decode(newer)
    with pytest.raises(InvalidObject, match="upgrade agentcas"):
        Checkpoint.decode(_cp_doc(format=2))  # a JSON checkpoint claiming a later format


# --- format 2: the packed form (docs/FORMAT.md section 9b; keep the two in step) ----------------
PACKED_EMPTY_TREE = bytes.fromhex("060203020600")
PACKED_EMPTY_TREE_ID = "9e6fb79e1990d855195e134073cb6b8abc0b65b659b6a976f653b2c4889a31e2"
PACKED_MEMORY_TREE = bytes.fromhex(
    "0602030206010606030005086e6f7465732e6d6404" + HELLO_ID + "03a403030600")
PACKED_MEMORY_TREE_ID = "d4cee9b764808581a973933abac89a93ce1b78f16fefcd7b8faf2f5381e4e067"
PACKED_SMALL_TREE_ID = "b1bebe6f9e6434cf9215247e4b75c6988bffa8f9894eef6575df833f4a830ac2"
PACKED_CHECKPOINT = bytes.fromhex(
    "060b030204" + PACKED_SMALL_TREE_ID + "060005046d61696e0510666972737420636865636b706f696e74050d616c"
    "696365406578616d706c65051b323032362d31312d32395431323a30303a30302e3030303030305a0703086167656e74"
    "6361730505302e312e30026f7305104c696e757820362e31207838365f363406707974686f6e0506332e31312e370604"
    "0003000300040000000000000000000000000000000000000000000000000000000000000000030000")
PACKED_CHECKPOINT_ID = "ea6d8eba31118ad81f9d57ec8bc598bbfb1e2ee1f240542a45bfec4c11e7c214"
PACKED_CHUNKLIST_ID = "624763b509a0f5e937a8d17f8d338b6fe62b128fdb446726f8c8025560427a60"
PACKED_SEGMENT = bytes.fromhex(
    "0609030206040003000300040000000000000000000000000000000000000000000000000000000000000000030000"
    "03010310" "04" + D1 + "06000810" + RECORD.hex())
PACKED_SEGMENT_ID = "85c90073d7cf79e34265c66019c3df9082c41285aababed4a2c89b31086d8d74"


def test_packed_vectors():
    assert Tree(()).encode() == PACKED_EMPTY_TREE and Tree(()).digest().hex() == PACKED_EMPTY_TREE_ID
    assert memory_tree(PACKED_FORMAT).encode() == PACKED_MEMORY_TREE
    assert memory_tree(PACKED_FORMAT).digest().hex() == PACKED_MEMORY_TREE_ID
    tree = small_tree(PACKED_FORMAT)
    assert tree.digest().hex() == PACKED_SMALL_TREE_ID and Tree.decode(tree.encode()) == tree
    cp = first_checkpoint(PACKED_FORMAT, PACKED_SMALL_TREE_ID)
    assert cp.encode() == PACKED_CHECKPOINT and cp.digest().hex() == PACKED_CHECKPOINT_ID
    decoded = Checkpoint.decode(PACKED_CHECKPOINT)
    assert decoded == cp and decoded.runtime == cp.runtime and decoded.format == PACKED_FORMAT
    cl = ChunkList((ChunkRef(D(HELLO_ID), 6), ChunkRef(D(WORLD_ID), 6)))
    assert cl.digest().hex() == PACKED_CHUNKLIST_ID and ChunkList.decode(cl.encode()) == cl
    seg = Segment(EMPTY_POSITION, 0, None, 1, len(RECORD), D(D1), (), RECORD)
    assert seg.encode() == PACKED_SEGMENT and seg.digest_id().hex() == PACKED_SEGMENT_ID
    assert Segment.decode(PACKED_SEGMENT) == seg


PACKED_COPY_SEGMENT = bytes.fromhex(
    "060a0302060400030003000400000000000000000000000000000000000000000000000000000000000000000300000301"
    "031004" + D1 + "0600080006020604" "04" + PACKED_SEGMENT_ID + "0301031004" + D1 + "06010800")
PACKED_COPY_SEGMENT_ID = "5c586445f0967a8aab7cfc885501e0a5312d9cefbebccf71f2d6db75adf9899f"


def test_vector_segment_copying_records():
    """The optional last item of a segment: the records it copies (source position, heads)."""
    from agentcas.cas.objects import HistoryPosition, RecordCopy
    source = HistoryPosition(D(PACKED_SEGMENT_ID), 1, len(RECORD), D(D1))
    seg = Segment(EMPTY_POSITION, 0, None, 1, len(RECORD), D(D1), (), copy=RecordCopy(source, (b"",)))
    assert seg.encode() == PACKED_COPY_SEGMENT and seg.digest_id().hex() == PACKED_COPY_SEGMENT_ID
    assert Segment.decode(PACKED_COPY_SEGMENT) == seg
    for heads in ("06010500",      # a head that is text, not bytes
                  "0600",          # no heads
                  "060208000800",  # two heads for one record
                  "060108010a"):   # a head with a newline
        bad = PACKED_COPY_SEGMENT[:-4] + bytes.fromhex(heads)
        with pytest.raises(InvalidObject):
            Segment.decode(bad)


PACKED_CHECKPOINT_WITH_FILE = bytes.fromhex(
    "060c030204" + PACKED_SMALL_TREE_ID + "060005046d61696e0510666972737420636865636b706f696e74050d616c"
    "696365406578616d706c65051b323032362d31312d32395431323a30303a30302e3030303030305a0703086167656e74"
    "6361730505302e312e30026f7305104c696e757820362e31207838365f363406707974686f6e0506332e31312e370604"
    "04" + PACKED_SEGMENT_ID + "0301031004" + D1 + "030000" "0603050d726f6c6c6f75742e6a736f6e6c03100301")
PACKED_CHECKPOINT_WITH_FILE_ID = "902b00f0df59d5c34fb63a3e414edef9003c1a06b53adb62e5d3a84229468ef4"


def test_vector_checkpoint_with_rollout_file():
    """The optional last item: present, it is in the bytes and the id; absent, nothing changes."""
    import dataclasses

    from agentcas.cas.objects import HistoryPosition, RolloutFile
    base = first_checkpoint(PACKED_FORMAT, PACKED_SMALL_TREE_ID)
    cp = dataclasses.replace(base, history=HistoryPosition(D(PACKED_SEGMENT_ID), 1, len(RECORD), D(D1)),
                             rollout_file=RolloutFile(len(RECORD), 1, "rollout.jsonl"))
    assert cp.encode() == PACKED_CHECKPOINT_WITH_FILE and cp.digest().hex() == PACKED_CHECKPOINT_WITH_FILE_ID
    assert Checkpoint.decode(PACKED_CHECKPOINT_WITH_FILE) == cp
    assert Checkpoint.decode(PACKED_CHECKPOINT).rollout_file is None  # an older checkpoint reads as before
    as_json = dataclasses.replace(cp, format=JSON_FORMAT)
    assert Checkpoint.decode(as_json.encode()).rollout_file == RolloutFile(16, 1, "rollout.jsonl")
    assert b'"rollout_file":{"offset":16,"path":"rollout.jsonl","seq":1}' in as_json.encode()
    for bad in (RolloutFile(16, 2, "x"),):  # beyond the checkpoint's history
        with pytest.raises(InvalidObject):
            dataclasses.replace(cp, rollout_file=bad)
    for path in ("../x", "/x", "a//b", ""):
        with pytest.raises(InvalidObject):
            RolloutFile(0, 0, path)


def test_the_spelled_out_tree_encoder_matches_the_generic_one():
    from agentcas.cas import packed
    big = TreeEntry("b" * 200, "file", H, MODE_EXEC, 2**40, H)  # multi-byte varints, a chunk list
    for tree in (Tree(()), memory_tree(PACKED_FORMAT), small_tree(PACKED_FORMAT),
                 Tree.of([big, TreeEntry("d", "dir", H), TreeEntry("\u00e9t\u00e9", "file", H, 0o644, 1)])):
        assert tree.encode() == packed.encode([PACKED_FORMAT, [e.to_row() for e in tree.entries]])
        assert Tree.decode(tree.encode()) == tree


def test_objects_keep_the_form_they_were_read_in():
    """A format-1 object re-encodes to its JSON bytes (its id), a format-2 one to packed bytes."""
    for data, cls in ((SMALL_TREE, Tree), (CHECKPOINT, Checkpoint), (CHUNKLIST, ChunkList),
                      (PACKED_CHECKPOINT, Checkpoint), (PACKED_SEGMENT, Segment)):
        assert cls.decode(data).encode() == data


@pytest.mark.parametrize("data", [
    PACKED_CHECKPOINT[:-1],                                     # truncated
    PACKED_CHECKPOINT + b"\x00",                                # bytes after the value
    PACKED_CHECKPOINT.replace(bytes.fromhex("060b"), bytes.fromhex("060a"), 1),  # wrong field count
    PACKED_SEGMENT.replace(bytes.fromhex("0810"), bytes.fromhex("0811"), 1),     # inline longer than stated
    PACKED_SEGMENT[:-1] + b"\x0b",                               # inline bytes do not hash to the segment... shape ok
    bytes.fromhex("0602038200") ,                                # non-minimal varint (format 2 as 0x82 0x00)
    PACKED_EMPTY_TREE.replace(b"\x06\x00", b"\x05\x00"),        # entries not a list
])
def test_invalid_packed_objects_do_not_decode(data):
    cls = Segment if data[:4] == PACKED_SEGMENT[:4] else (Tree if len(data) < 10 else Checkpoint)
    try:
        obj = cls.decode(data)
    except (InvalidObject, NotCanonical):
        return
    # The one case that decodes (changed inline bytes) is still a different object: another id.
    assert obj.digest_id() != D(PACKED_SEGMENT_ID)


def test_unknown_checkpoint_keys_are_ignored_but_change_the_id():
    data = _cp_doc(future_field="x")
    assert Checkpoint.decode(data) == first_checkpoint()


def test_format_md_states_every_vector():
    """docs/FORMAT.md and these tests must agree: every vector here appears there verbatim."""
    from pathlib import Path
    doc = (Path(__file__).resolve().parent.parent / "docs" / "FORMAT.md").read_text()
    for value in (HELLO_ID, WORLD_ID, EMPTY_BLOB_ID, EMPTY_TREE_ID, MEMORY_TREE_ID, SMALL_TREE_ID,
                  CHECKPOINT_ID, CHILD_ID, CHUNKLIST_ID, RECORD_ID, D1, D2, SEGMENT_ID,
                  hash_blob(RUN_SH).hex(), PACKED_EMPTY_TREE_ID, PACKED_MEMORY_TREE_ID,
                  PACKED_SMALL_TREE_ID, PACKED_CHECKPOINT_ID, PACKED_CHUNKLIST_ID, PACKED_SEGMENT_ID,
                  PACKED_EMPTY_TREE.hex(), PACKED_SEGMENT.hex(), PACKED_CHECKPOINT_WITH_FILE.hex(),
                  PACKED_CHECKPOINT_WITH_FILE_ID, PACKED_COPY_SEGMENT.hex(), PACKED_COPY_SEGMENT_ID):
        assert value in doc, value
    for data in (EMPTY_TREE, MEMORY_TREE, SMALL_TREE, CHECKPOINT, CHUNKLIST,
                 Segment(EMPTY_POSITION, 0, None, 1, len(RECORD), D(D1),
                         (ChunkRef(D(RECORD_ID), len(RECORD)),), format=JSON_FORMAT).encode()):
        assert data.decode() in doc, data[:60]
    for context in ("agentcas 2026-11 tree v1", "agentcas 2026-11 checkpoint v1",
                    "agentcas 2026-11 chunklist v1", "agentcas 2026-11 rollout segment v1",
                    "agentcas 2026-11 signature v1", "agentcas 2026-11 history prefix v1",
                    "agentcas 2026-11 sealed table value v1"):
        assert context in doc, context
    from agentcas.cas import sealed
    from agentcas.cas.digest import OBJECT_CONTEXTS, PACKED_OBJECT_CONTEXTS, PREFIX_CHAIN_CONTEXT
    assert set(OBJECT_CONTEXTS.values()) | set(PACKED_OBJECT_CONTEXTS.values()) | {
        PREFIX_CHAIN_CONTEXT, sealed._CONTEXT} <= {line for line in doc.split('"')}


# --- CheckpointSeries: ingest's checkpoints with their shared fields encoded once ------------

@pytest.mark.parametrize("parents, generation, skip", [((), 0, None), ((Digest(b"\x02" * 32),), 1, None),
                                                       ((Digest(b"\x02" * 32), Digest(b"\x06" * 32)), 3, None),
                                                       ((Digest(b"\x02" * 32),), 2**40, Digest(b"\x03" * 32)),
                                                       ((Digest(b"\x02" * 32),), 0, None)])
@pytest.mark.parametrize("reason", ["x", "codex turn t complete: é \u2028 " + "w" * 480])
def test_a_checkpoint_series_encodes_exactly_as_checkpoint(parents, generation, skip, reason):
    tree, runtime = Digest(b"\x01" * 32), {"agentcas": "0.1", "python": "3.11.7", "os": "Linux"}
    series = CheckpointSeries(tree, "thread-\u00e9", "who@host", "2026-12-01T23:00:00.123456Z", runtime)
    for history in (HistoryPosition(Digest(b"\x04" * 32), 300, 2**33, Digest(b"\x05" * 32)), EMPTY_POSITION):
        want = Checkpoint(tree, parents, "thread-\u00e9", reason, "who@host", "2026-12-01T23:00:00.123456Z",
                          runtime, history, generation=generation, skip=skip)
        assert series.encode_with_id(parents, reason, history, generation, skip) == want.encode_with_id()
        assert Checkpoint.decode(series.encode_with_id(parents, reason, history, generation, skip)[0]) == want


def test_a_checkpoint_series_refuses_what_checkpoint_refuses():
    tree, history = Digest(b"\x01" * 32), HistoryPosition(Digest(b"\x04" * 32), 3, 30, Digest(b"\x05" * 32))
    with pytest.raises(InvalidObject, match="created_at"):
        CheckpointSeries(tree, "t", "who", "yesterday", {})
    with pytest.raises(InvalidObject, match="runtime"):
        CheckpointSeries(tree, "t", "who", "2026-12-01T23:00:00.123456Z", {"python": 3})
    series = CheckpointSeries(tree, "t", "who", "2026-12-01T23:00:00.123456Z", {})
    for reason in ("", " ", "x" * 513, "\ud800"):
        with pytest.raises(InvalidObject, match="reason"):
            series.encode_with_id((), reason, history)
    with pytest.raises(InvalidObject, match="generation"):
        series.encode_with_id((), "r", history, 1)
    with pytest.raises(InvalidObject, match="skip"):
        series.encode_with_id((Digest(b"\x02" * 32),), "r", history, 1, Digest(b"\x03" * 32))
