"""Bundles: export/import round trips, and every crafted bad bundle refused with nothing written.

`Craft` builds a bundle object by object (or explodes an exported one), so each case
breaks exactly one thing; `good_craft()` imports cleanly, which shows that each
refusal below is caused by its own defect and nothing else.
"""

from __future__ import annotations

import os
import unicodedata

import pytest
import zstandard

from agentcas import Store, testing_hooks
from agentcas.cas import encoding, framing
from agentcas.cas.digest import EMPTY, Digest, hash_blob, hash_object
from agentcas.cas.objects import EMPTY_POSITION, Checkpoint
from agentcas.errors import ConflictError, IntegrityError
from agentcas.exchange import bundle_format as bf
from agentcas.signing import envelope, keys

from support import raw_objects
from support.bundles import ALICE, CREATED, IDENTITY, MALLORY, Craft, good_craft, snapshot
from support.store_state import store_rows, tree_bytes, views


def refused(store: Store, data: bytes, tmp_path, fragment: str, **options) -> str:
    """Import `data`; assert exit-4 refusal mentioning `fragment`, raised before the write
    phase began (nothing written before everything is verified), and that nothing changed."""
    assert fragment, "name the refusal expected: any exit-4 error would match an empty fragment"
    path = tmp_path / f"case-{os.urandom(4).hex()}.bundle"
    path.write_bytes(data)
    before = snapshot(store)
    writes = []
    with testing_hooks.on("import.before_write", lambda: writes.append(True)):
        with pytest.raises(IntegrityError) as info:
            store.remotes.import_bundle(str(path), "main", **options)
    assert writes == [], f"refused only while writing, not before: {info.value}"
    assert info.value.exit_code == 4
    assert fragment.lower() in str(info.value).lower(), str(info.value)
    assert snapshot(store) == before
    return str(info.value)


def test_a_bundle_changed_between_its_check_and_its_write_is_refused(receiver, tmp_path):
    """Pass 2 re-verifies every record it writes (exchange/bundle_format.py iter_records): a
    byte of the last object flipped in the file after pass 1 accepted it is refused, the
    damaged object is not stored and no thread moves."""
    path = tmp_path / "changing.bundle"
    path.write_bytes(good_craft().bytes())
    with open(path, "rb") as handle:
        parsed = bf.parse(handle)
    last = parsed.objects_start + parsed.manifest.object_bytes - 1
    damaged = parsed.index.order[-1]

    def flip_the_last_objects_last_byte():
        with open(path, "r+b") as handle:
            handle.seek(last)
            byte = handle.read(1)
            handle.seek(last)
            handle.write(bytes([byte[0] ^ 0x01]))

    threads_before = [t.to_json() for t in receiver.threads.list()]
    with testing_hooks.on("import.before_write", flip_the_last_objects_last_byte):
        with pytest.raises(IntegrityError) as info:
            receiver.remotes.import_bundle(str(path), "main")
    assert info.value.exit_code == 4
    assert str(info.value).startswith("bundle changed while it was being imported (bundle object hash mismatch: ") \
        and damaged.hex() in str(info.value), str(info.value)
    assert [t.to_json() for t in receiver.threads.list()] == threads_before
    assert not receiver.source.has(Digest(damaged))
    assert receiver.gc.fsck().to_json()["ok"]


def test_good_crafted_bundle_imports(receiver, tmp_path):
    path = tmp_path / "good.bundle"
    path.write_bytes(good_craft().bytes())
    result = receiver.remotes.import_bundle(str(path)).to_json()
    assert result["signature"] == "valid" and result["moved"]
    receiver.checkpoints.checkout("main", str(tmp_path / "out"))
    assert (tmp_path / "out" / "memory" / "notes.md").read_bytes() == b"plan: sum of squares\n"


# --- manifest defects ---------------------------------------------------------------------------

def _manifest_files(*entries):
    def mutate(craft):
        craft.manifest["files"] = craft.manifest["files"] + [dict(e) for e in entries]
    return mutate


def _entry(path, **changes):
    doc = {"path": path, "type": "file", "size": 1, "mode": "0644", "id": hash_blob(b"x").hex()}
    doc.update(changes)
    return doc


def _set(key, value):
    def mutate(craft):
        craft.manifest[key] = value
    return mutate


def _raw_manifest(transform):
    def mutate(craft):
        craft.manifest_bytes = transform(encoding.encode(craft.manifest))
    return mutate


def _nested(depth):
    value = "x"
    for _ in range(depth):
        value = [value]
    return value


NFC, NFD = unicodedata.normalize("NFC", "café"), unicodedata.normalize("NFD", "café")

MANIFEST_CASES = {
    "dotdot": (_manifest_files(_entry("../x")), "invalid path component"),
    "absolute": (_manifest_files(_entry("/abs")), "absolute"),
    "drive-backslash": (_manifest_files(_entry("C:\\x")), "backslash or drive"),
    "backslash-dotdot": (_manifest_files(_entry("a\\..\\x")), "backslash"),
    "empty-name": (_manifest_files(_entry("")), "invalid path component"),
    "empty-component": (_manifest_files(_entry("a//b")), "invalid path component"),
    "dot-name": (_manifest_files(_entry(".")), "invalid path component"),
    "dot-component": (_manifest_files(_entry("a/./b")), "invalid path component"),
    "symlink": (_manifest_files(_entry("link", type="symlink")), "only regular files"),
    "hardlink": (_manifest_files(dict(_entry("hl"), link="task.json")), "exactly the keys"),
    "device": (_manifest_files(_entry("dev", type="chardev")), "only regular files"),
    "mode-setuid": (_manifest_files(_entry("x", mode="4755")), "only 0644 and 0755"),
    "mode-symlink": (_manifest_files(_entry("x", mode="120777")), "only 0644 and 0755"),
    "duplicate-entry": (lambda c: c.manifest["files"].append(dict(c.manifest["files"][0])), "twice"),
    "case-collision": (_manifest_files(_entry("Task.json")), "collide"),
    "nfc-collision": (_manifest_files(_entry(f"{NFC}.txt"), _entry(f"{NFD}.txt")), "collide"),
    "dir-case-collision": (_manifest_files(_entry("Memory/other.md")), "collide"),
    "file-and-dir": (_manifest_files(_entry("task.json/x")), "both a file and a directory"),
    "duplicate-json-key": (_raw_manifest(lambda b: b.replace(b'{"checkpoint":', b'{"checkpoint":"' + b"0" * 64 + b'","checkpoint":', 1)),
                           "duplicate key"),
    "not-canonical": (_raw_manifest(lambda b: b.replace(b',"format"', b', "format"', 1)), "canonical"),
    "unknown-key": (_set("extra", 1), "unknown"),
    "newer-version": (_set("version", 2), "version"),
    "deeply-nested": (_set("created_at", _nested(10)), "nested"),
    "very-deeply-nested": (_raw_manifest(lambda b: b"[" * 100000 + b"]" * 100000), "malformed"),
    "wrong-history": (_set("history", {"segment": "11" * 32, "seq": 1, "offset": 2, "digest": "22" * 32}),
                      "history position differs"),
    "listed-file-missing": (_manifest_files(_entry("extra.txt")), "file list differs"),
    "file-size-changed": (lambda c: c.manifest["files"][0].update(size=999), "file list differs"),
    "checkpoint-list": (_set("checkpoints", ["33" * 32]), "checkpoint list"),
    "thread-changed": (_set("thread", "other"), "thread"),
    "bad-thread": (_set("thread", "a..b"), "thread"),
}


@pytest.mark.parametrize("case", sorted(MANIFEST_CASES))
def test_manifest_defects_are_refused(case, receiver, tmp_path):
    mutate, fragment = MANIFEST_CASES[case]
    craft = good_craft()
    mutate(craft)
    refused(receiver, craft.bytes(), tmp_path, fragment)


# --- object and tree defects ---------------------------------------------------------------------

def _dir_entry(name):
    return {"name": name, "type": "dir", "id": hash_object("tree", b'{"entries":[]}').hex()}


def _file_entry(name, **changes):
    doc = {"name": name, "type": "file", "id": EMPTY.hex(), "mode": 0o644, "size": 0}
    doc.update(changes)
    return doc


TREE_CASES = {
    "tree-dotdot": ([_file_entry("..")], "invalid path component"),
    "tree-dot": ([_file_entry(".")], "invalid path component"),
    "tree-empty": ([_file_entry("")], "invalid path component"),
    "tree-slash": ([_file_entry("a/b")], "forbidden"),
    "tree-absolute": ([_file_entry("/abs")], "forbidden"),
    "tree-drive": ([_file_entry("C:\\x")], "forbidden"),
    "tree-backslash-dotdot": ([_file_entry("a\\..\\x")], "forbidden"),
    "tree-nul": ([_file_entry("a\x00b")], "forbidden"),
    "tree-symlink": ([_file_entry("l", type="symlink")], "only file and dir"),
    "tree-hardlink": ([_file_entry("h", type="hardlink")], "only file and dir"),
    "tree-device": ([_file_entry("d", type="device")], "only file and dir"),
    "tree-mode": ([_file_entry("m", mode=0o120777)], "only 0644 and 0755"),
    "tree-setuid": ([_file_entry("m", mode=0o4755)], "only 0644 and 0755"),
    "tree-extra-field": ([_file_entry("x", link="task.json")], "unknown fields"),
    "tree-duplicate": ([_file_entry("dup"), _file_entry("dup")], "unique"),
    "tree-case": ([_file_entry("TASK.json")], "collide"),
    "tree-nfc": ([_file_entry(f"{NFC}"), _file_entry(f"{NFD}")], "collide"),
}


@pytest.mark.parametrize("case", sorted(TREE_CASES))
def test_tree_defects_are_refused(case, receiver, tmp_path):
    entries, fragment = TREE_CASES[case]
    craft = good_craft(root_extra=entries)
    refused(receiver, craft.bytes(), tmp_path, fragment)


def _zstd_overflow(craft):
    """A chunk whose header and zstd frame declare 100 bytes but whose frame holds 100,000."""
    frame = bytearray(zstandard.ZstdCompressor(write_content_size=True).compress(b"\0" * 100_000))
    assert frame[4] == 0xA0  # single segment, 4-byte content size at [5:9]
    frame[5:9] = (100).to_bytes(4, "little")
    _replace_chunk_value(craft, framing.CODEC_ZSTD, 100, bytes(frame))


def _zstd_no_size(craft):
    frame = zstandard.ZstdCompressor(write_content_size=False).compress(b"\0" * 100_000)
    _replace_chunk_value(craft, framing.CODEC_ZSTD, 100, frame)


def _zstd_declares_a_gigabyte(craft):
    frame = bytearray(zstandard.ZstdCompressor(write_content_size=True).compress(b"\0" * 100_000))
    frame[5:9] = (1 << 30).to_bytes(4, "little")
    _replace_chunk_value(craft, framing.CODEC_ZSTD, 1 << 30, bytes(frame), claimed=100)


def _replace_chunk_value(craft, codec, size, body, claimed=None):
    import struct
    import zlib
    head = framing.HEADER.pack(framing.KIND_CHUNK, codec, size, 0, 0)[:-4]
    framed = head + struct.pack(">I", zlib.crc32(head)) + body
    data = b"\0" * (claimed or size)
    entry = {"name": "zeros", "type": "file", "id": hash_blob(data).hex(), "mode": 0o644, "size": size}
    craft.records.append([framing.KIND_CHUNK, hash_blob(data).raw, framed])
    return entry


def _flip_chunk(craft):
    kind, raw, framed = craft.find(framing.KIND_CHUNK)[0]
    framed = bytearray(framed)
    framed[-1] ^= 0x01
    craft.find(framing.KIND_CHUNK)[0][2] = bytes(framed)


def _drop_chunk(craft):
    craft.records.remove(craft.find(framing.KIND_CHUNK)[0])


def _extra_object(craft):
    craft.add(framing.KIND_CHUNK, b"not needed by anything")


def _duplicate_record(craft):
    craft.records.append(list(craft.records[0]))


def _wrong_kind(craft):
    craft.find(framing.KIND_CHUNK)[0][0] = framing.KIND_TREE


def _signature_record(craft):
    craft.records.append([framing.KIND_SIGNATURE, b"\1" * 32, framing.frame(framing.KIND_SIGNATURE, b"{}")])


def _chunklist_lies(craft):
    """A file whose chunk list holds chunks that do not hash, together, to the file's id."""
    from agentcas.cas.objects import ChunkList, ChunkRef
    a, b = craft.add(framing.KIND_CHUNK, b"A" * 100), craft.add(framing.KIND_CHUNK, b"B" * 100)
    chunk_list = ChunkList((ChunkRef(a, 100), ChunkRef(b, 100)))
    list_id = craft.add(framing.KIND_CHUNKLIST, chunk_list.encode())
    return {"name": "big", "type": "file", "id": hash_blob(b"C" * 200).hex(), "mode": 0o644, "size": 200,
            "chunks": list_id.hex()}


def _rebuild_with(entry_maker):
    def build():
        probe = Craft()
        entry = entry_maker(probe)
        craft = good_craft(root_extra=[entry], files_extra=[
            {"path": entry["name"], "type": "file", "size": entry["size"], "mode": "0644", "id": entry["id"]}])
        craft.records = probe.records + craft.records
        return craft
    return build


OBJECT_CASES = {
    "hash-mismatch": (good_craft, _flip_chunk, "hash mismatch"),
    "missing-chunk": (good_craft, _drop_chunk, "missing"),
    "extra-object": (good_craft, _extra_object, "does not need"),
    "duplicate-record": (good_craft, _duplicate_record, "twice"),
    "kind-mismatch": (good_craft, _wrong_kind, "framed as"),
    "signature-kind-record": (good_craft, _signature_record, "kind"),
    "file-id-mismatch": (_rebuild_with(_chunklist_lies), None, "does not hash to its id"),
}


@pytest.mark.parametrize("case", sorted(OBJECT_CASES))
def test_object_defects_are_refused(case, receiver, tmp_path):
    build, mutate, fragment = OBJECT_CASES[case]
    craft = build()
    if mutate:
        mutate(craft)
    refused(receiver, craft.bytes(), tmp_path, fragment)


@pytest.mark.parametrize("make", [_zstd_overflow, _zstd_no_size, _zstd_declares_a_gigabyte],
                         ids=["expands-past-declared", "no-declared-size", "declares-a-gigabyte"])
def test_zstd_frames_that_lie_are_refused(make, receiver, tmp_path):
    def entry(probe):
        make(probe)
        return {"name": "zeros", "type": "file", "id": hash_blob(b"\0" * 100).hex(), "mode": 0o644, "size": 100}
    craft = _rebuild_with(entry)()
    message = refused(receiver, craft.bytes(), tmp_path, "corrupt")
    assert "zstd" in message or "at most" in message


# --- layout defects -------------------------------------------------------------------------------

def test_truncation_at_every_section_is_refused(receiver, tmp_path):
    """A bundle cut anywhere is refused as truncated, naming the section the cut falls in."""
    data = good_craft().bytes()
    manifest_end = len(bf.MAGIC) + 4 + int.from_bytes(data[16:20], "big")
    objects_end = manifest_end + encoding.decode(data[20:manifest_end])["objects"]["bytes"]
    trailer_start = len(data) - bf.TRAILER.size
    assert 40 < manifest_end < objects_end < trailer_start - 8
    short = "shorter than the object bytes its manifest declares"
    cuts = {0: "inside the header", 5: "inside the header", 17: "inside the header",
            21: "inside the manifest", 40: "inside the manifest", manifest_end - 1: "inside the manifest",
            manifest_end + 1: short, (manifest_end + objects_end) // 2: short, objects_end - 1: short,
            objects_end + 2: "inside the signature section", trailer_start - 1: "inside the signature section",
            trailer_start + 1: "inside the trailer", len(data) - 41: "inside the trailer",
            len(data) - 20: "inside the trailer", len(data) - 1: "inside the trailer"}
    for cut, fragment in cuts.items():
        message = refused(receiver, data[:cut], tmp_path, fragment)
        assert message.startswith("bundle is truncated"), (cut, message)


def test_trailing_bytes_are_refused(receiver, tmp_path):
    refused(receiver, good_craft().bytes() + b"\0", tmp_path, "trailing")


def test_checksum_and_magic_and_lengths(receiver, tmp_path):
    data = bytearray(good_craft().bytes())
    data[-1] ^= 1
    refused(receiver, bytes(data), tmp_path, "checksum")
    refused(receiver, b"NOT-A-BUNDLE" + bytes(data[12:]), tmp_path, "magic")
    oversized = bf.MAGIC + bf.U32.pack(bf.MAX_MANIFEST_BYTES + 1) + b"{}"
    refused(receiver, oversized, tmp_path, "exceeds")
    craft = good_craft()
    craft.bytes()
    craft.manifest["objects"]["bytes"] += 1
    refused(receiver, craft.bytes(fix=False), tmp_path, "the manifest declares")
    craft = good_craft()
    craft.envelopes = craft.envelopes * (bf.MAX_SIGNATURES + 1)
    refused(receiver, craft.bytes(), tmp_path, "at most")


# --- signatures -------------------------------------------------------------------------------------

def _other_checkpoint_signature(craft):
    craft.envelopes = []
    craft.sign(checkpoint="44" * 32)


def _forged_identity(craft):
    st = envelope.Statement(envelope.NAMESPACE_CHECKPOINT, 1, Digest.parse(craft.manifest["checkpoint"]), "main",
                            keys.key_id(IDENTITY), CREATED)
    craft.envelopes = [envelope.Envelope(st, IDENTITY, IDENTITY + bytes(32)).encode()]


def _changed_field(field, value):
    def mutate(craft):
        doc = encoding.decode(craft.envelopes[0])
        doc["statement"][field] = value
        craft.envelopes = [encoding.encode(doc)]
    return mutate


SIGNATURE_CASES = {
    "absent": (lambda c: setattr(c, "envelopes", []), "not signed"),
    "untrusted": (lambda c: (setattr(c, "envelopes", []), c.sign(MALLORY)), "untrusted"),
    "other-namespace": (lambda c: (setattr(c, "envelopes", []), c.sign(namespace="agentcas-other-v1")), "namespace"),
    "moved-from-another-bundle": (_other_checkpoint_signature, "moved"),
    "other-thread": (lambda c: (setattr(c, "envelopes", []), c.sign(thread="other")), "thread"),
    "small-order-key": (_forged_identity, "small-order"),
    "changed-signed-at": (_changed_field("signed_at", "2030-01-01T00:00:00.000000Z"), "does not verify"),
    "changed-namespace": (_changed_field("namespace", "other"), "does not verify"),
    "changed-format": (_changed_field("format", 7), "does not verify"),
    "changed-thread": (_changed_field("thread", "main2"), "does not verify"),
    "changed-key-id": (_changed_field("key_id", "00" * 8), "key id"),
    "malformed-envelope": (lambda c: setattr(c, "envelopes", [b"{not json"]), "malformed"),
}


@pytest.mark.parametrize("case", sorted(SIGNATURE_CASES))
def test_signature_defects_are_refused(case, receiver, tmp_path):
    mutate, fragment = SIGNATURE_CASES[case]
    craft = good_craft()
    mutate(craft)
    refused(receiver, craft.bytes(), tmp_path, fragment)


def test_allow_unsigned_accepts_unsigned_and_untrusted_but_never_invalid(receiver, tmp_path):
    unsigned = tmp_path / "unsigned.bundle"
    unsigned.write_bytes(good_craft(sign=False).bytes())
    assert receiver.remotes.import_bundle(str(unsigned), "a", allow_unsigned=True).to_json()["signature"] == "absent"
    craft = good_craft(sign=False)
    craft.sign(MALLORY)
    untrusted = tmp_path / "untrusted.bundle"
    untrusted.write_bytes(craft.bytes())
    assert receiver.remotes.import_bundle(str(untrusted), "b", allow_unsigned=True).to_json()["signature"] == "untrusted"
    craft = good_craft()
    _changed_field("signed_at", "2030-01-01T00:00:00.000000Z")(craft)
    refused(receiver, craft.bytes(), tmp_path, "invalid", allow_unsigned=True)


def test_trusted_for_another_namespace_only_is_untrusted(store, tmp_path):
    (tmp_path / "alice.pub").write_text(ALICE.public.to_line("alice"))
    store.trust.add("alice", str(tmp_path / "alice.pub"), ["team-only"])
    refused(store, good_craft().bytes(), tmp_path, "not trusted for namespace")


# --- through the CLI: round trip, rollback, fast-forward, conflicts --------------------------------

@pytest.fixture
def exchange(tmp_path, run, workspace):
    """A source store with two checkpoints and a rollout, two signed bundles, an empty receiver."""
    src, dst, k = tmp_path / "src", tmp_path / "dst", tmp_path / "k"
    rollout = tmp_path / "r.jsonl"
    rollout.write_text("".join(f'{{"seq": {i}, "type": "message"}}\n' for i in range(50)))
    assert run("init", src).code == 0 and run("init", dst).code == 0
    assert run("commit", workspace, "-m", "one", "--rollout", rollout, store=src).code == 0
    (workspace / "memory" / "notes.md").write_text("step two\n")
    with open(rollout, "a") as out:
        out.write('{"seq": 50, "type": "message"}\n')
    assert run("commit", workspace, "-m", "two", "--rollout", rollout, store=src).code == 0
    assert run("keygen", "alice", "--out", k).code == 0
    assert run("export", "main~1", "-o", tmp_path / "v1.bundle", "--sign", k / "alice.key", store=src).code == 0
    result = run("--json", "export", "main", "-o", tmp_path / "v2.bundle", "--sign", k / "alice.key", store=src)
    assert result.code == 0, result
    assert result.json()["checkpoints"] == 2
    return src, dst, k, tmp_path


def test_round_trip_restores_files_and_rollout(exchange, run, workspace):
    src, dst, k, tmp = exchange
    before = store_rows(dst)
    untrusted = run("import", tmp / "v2.bundle", "--as", "main", store=dst)
    assert untrusted.code == 4 and "untrusted" in untrusted.err
    assert run("verify", tmp / "v2.bundle", store=dst).code == 4
    assert store_rows(dst) == before
    assert run("trust", "add", "alice", k / "alice.pub", store=dst).code == 0
    verified = run("--json", "verify", tmp / "v2.bundle", store=dst)
    assert verified.code == 0, verified
    assert verified.json()["signature"] == "valid"
    imported = run("--json", "import", tmp / "v2.bundle", "--as", "main", store=dst)
    assert imported.code == 0, imported
    assert run("verify", "main", store=dst).code == 0
    assert run("checkout", "main", tmp / "out", store=dst).code == 0
    assert tree_bytes(tmp / "out") == tree_bytes(workspace)
    ours = run("rollout", "cat", "main", store=dst)
    theirs = run("rollout", "cat", "main", store=src)
    assert ours.code == 0 and ours.out == theirs.out and ours.out.count("\n") == 51
    assert run("log", "main", store=dst).out.count("\n") == 2
    again = run("--json", "import", tmp / "v2.bundle", "--as", "main", store=dst)
    assert again.code == 0 and again.json()["moved"] is False and again.json()["new_objects"] == 0


def test_bundle_from_export_defects_with_history(exchange, store, tmp_path):
    """Real exported bundle (history, parent): drop the parent, flip a rollout chunk, change the manifest."""
    src, dst, k, tmp = exchange
    store.trust.add("alice", str(k / "alice.pub"))
    cases = []
    craft = Craft.explode(str(tmp / "v2.bundle"))
    parent = craft.find(framing.KIND_CHECKPOINT)[1]
    craft.records.remove(parent)
    cases.append((craft, "missing"))
    craft = Craft.explode(str(tmp / "v2.bundle"))
    seg = craft.find(framing.KIND_SEGMENT)
    craft.records.remove(seg[0])
    cases.append((craft, "missing"))
    craft = Craft.explode(str(tmp / "v2.bundle"))
    craft.manifest["history"]["seq"] = 50
    cases.append((craft, "history"))
    craft = Craft.explode(str(tmp / "v2.bundle"))
    craft.manifest["checkpoints"] = craft.manifest["checkpoints"][:1]
    cases.append((craft, "checkpoint list"))
    craft = Craft.explode(str(tmp / "v2.bundle"))
    v1 = Craft.explode(str(tmp / "v1.bundle"))
    craft.envelopes = v1.envelopes  # signature over main~1 moved into the bundle of main
    cases.append((craft, "moved"))
    for craft, fragment in cases:
        refused(store, craft.bytes(), tmp_path, fragment)
    good = tmp_path / "rebuilt.bundle"
    good.write_bytes(Craft.explode(str(tmp / "v2.bundle")).bytes())
    assert store.remotes.import_bundle(str(good)).to_json()["signature"] == "valid"


def test_fast_forward_rollback_and_conflict(exchange, run, workspace):
    src, dst, k, tmp = exchange
    assert run("trust", "add", "alice", k / "alice.pub", store=dst).code == 0
    assert run("import", tmp / "v1.bundle", "--as", "main", store=dst).code == 0
    ff = run("--json", "import", tmp / "v2.bundle", "--as", "main", store=dst)
    assert ff.code == 0 and ff.json()["moved"], ff
    before = store_rows(dst)
    rollback = run("import", tmp / "v1.bundle", "--as", "main", store=dst)
    assert rollback.code == 4 and "rollback" in rollback.err
    assert store_rows(dst) == before
    # Deleting the thread does not forget what was imported into it.
    assert run("branch", "-d", "main", store=dst).code == 0
    before = store_rows(dst)
    assert run("import", tmp / "v1.bundle", "--as", "main", store=dst).code == 4
    assert store_rows(dst) == before
    assert run("import", tmp / "v1.bundle", "--as", "main", "--allow-rollback", store=dst).code == 0
    # A thread that moved on its own is not fast-forwarded: exit 3, nothing written.
    assert run("commit", workspace, "-m", "local work", "--thread", "local", store=dst).code == 0
    assert run("branch", "side", "local", store=dst).code == 0
    before = store_rows(dst)
    conflict = run("import", tmp / "v2.bundle", "--as", "side", store=dst)
    assert conflict.code == 3 and "fast-forward" in conflict.err
    assert store_rows(dst) == before


def test_an_unsigned_bundle_of_an_ancestor_is_refused_as_a_rollback(exchange, run):
    """Without signatures there is no signed time to compare: the checkpoint already
    imported descends from the bundle's, and that alone refuses the rollback."""
    src, dst, _, tmp = exchange
    for name, rev in (("u1", "main~1"), ("u2", "main")):
        assert run("export", rev, "-o", tmp / f"{name}.bundle", store=src).code == 0
    imported = run("--json", "import", tmp / "u2.bundle", "--as", "main", "--allow-unsigned", store=dst)
    assert imported.code == 0 and imported.json()["signature"] == "absent", imported
    before = store_rows(dst)
    rollback = run("import", tmp / "u1.bundle", "--as", "main", "--allow-unsigned", store=dst)
    assert rollback.code == 4, rollback
    assert rollback.err.startswith("agentcas: error: bundle checkpoint ") and rollback.err.count("\n") == 1
    assert "already imported into thread 'main' (signed unsigned); refusing a rollback" in rollback.err, rollback.err
    assert store_rows(dst) == before
    # With the thread deleted, only the record of what was imported into it refuses.
    assert run("branch", "-d", "main", store=dst).code == 0
    assert run("import", tmp / "u1.bundle", "--as", "main", "--allow-unsigned", store=dst).code == 4
    assert run("import", tmp / "u1.bundle", "--as", "main", "--allow-unsigned", "--allow-rollback", store=dst).code == 0


def test_rollback_by_signed_time(receiver, tmp_path):
    newer = good_craft(sign=False)
    newer.sign(signed_at="2026-11-29T12:00:00.000000Z")
    older = good_craft(root_extra=[_file_entry("other")], sign=False, files_extra=[
        {"path": "other", "type": "file", "size": 0, "mode": "0644", "id": EMPTY.hex()}])
    older.sign(signed_at="2026-01-01T00:00:00.000000Z")
    (tmp_path / "new.bundle").write_bytes(newer.bytes())
    (tmp_path / "old.bundle").write_bytes(older.bytes())
    receiver.remotes.import_bundle(str(tmp_path / "new.bundle"), "main")
    receiver.threads.delete("main")
    refused(receiver, older.bytes(), tmp_path, "rollback")
    assert receiver.remotes.import_bundle(str(tmp_path / "old.bundle"), "main", allow_rollback=True).to_json()["moved"]


def test_conflict_on_unrelated_thread_writes_no_objects(receiver, tmp_path, workspace):
    receiver.checkpoints.commit(str(workspace), "local")
    path = tmp_path / "b.bundle"
    path.write_bytes(good_craft().bytes())
    before = snapshot(receiver)
    with pytest.raises(ConflictError):
        receiver.remotes.import_bundle(str(path), "main")
    assert snapshot(receiver) == before


def test_export_refuses_secrets_and_private_keys(tmp_path, run, workspace):
    store = tmp_path / "s"
    assert run("init", store).code == 0
    assert run("keygen", "alice", "--out", workspace / "keys").code == 0
    assert run("commit", workspace, "-m", "with key", "--allow-secret", "keys/*", store=store).code == 0
    for extra in ([], ["--allow-secret", "keys/*"], ["--allow-secret", "*"]):
        result = run("export", "main", "-o", tmp_path / "b.bundle", *extra, store=store)
        assert result.code == 1 and "private key" in result.err, result  # refused as a commit refuses it
        assert not (tmp_path / "b.bundle").exists()
        assert not [p for p in os.listdir(tmp_path) if p.startswith(".b.bundle")]
    # The key left the workspace, but the ancestor that holds it would travel in the bundle.
    (workspace / "keys" / "alice.key").unlink()
    assert run("commit", workspace, "-m", "key removed", store=store).code == 0
    ancestor = run("export", "main", "-o", tmp_path / "b.bundle", "--allow-secret", "*", store=store)
    assert ancestor.code == 1 and "alice.key" in ancestor.err
    (workspace / "config.env").write_text("API_TOKEN=Zx8qP2mR7vK4nW9tY3bH6cJ1\n")
    assert run("commit", workspace, "-m", "token", "--thread", "fresh", "--allow-secret", "config.env",
               store=store).code == 0
    refusal = run("export", "fresh", "-o", tmp_path / "b.bundle", store=store)
    assert refusal.code == 1 and "config.env line 1" in refusal.err and "Zx8q" not in refusal.err
    allowed = run("export", "fresh", "-o", tmp_path / "b.bundle", "--allow-secret", "config.env", store=store)
    assert allowed.code == 0, allowed
    assert b"PRIVATE KEY" not in (tmp_path / "b.bundle").read_bytes()
    exists = run("export", "fresh", "-o", tmp_path / "b.bundle", "--allow-secret", "config.env", store=store)
    assert exists.code == 3


def test_import_argument_errors(store, tmp_path, run, store_dir):
    absent = run("import", tmp_path / "absent.bundle", store=store_dir)
    assert absent.code == 1 and f"bundle file {tmp_path / 'absent.bundle'} does not exist" in absent.err
    assert run("verify", tmp_path, store=store_dir).code == 1  # a directory is neither a bundle nor a rev
    path = tmp_path / "b.bundle"
    path.write_bytes(good_craft().bytes())
    assert run("import", path, "--as", "bad..name", store=store_dir).code == 2


def test_bundle_layout_is_pinned():
    """A fixed bundle (docs/FORMAT.md section 10, "Test vector"): layout and whole-file BLAKE3."""
    import blake3
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    rfc = keys.SigningKey(Ed25519PrivateKey.from_private_bytes(bytes.fromhex(
        "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60")), keys.PublicKey(bytes.fromhex(
        "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a")))
    craft = good_craft(sign=False)
    craft.sign(rfc, signed_at="2026-11-29T12:00:00.000000Z")
    data = craft.bytes()
    manifest_len = int.from_bytes(data[16:20], "big")
    assert data[:16] == b"AGENTCAS-BUNDLE\n"
    assert data[20:20 + manifest_len].startswith(b'{"checkpoint":"')
    first = data[20 + manifest_len:20 + manifest_len + bf.RECORD_HEAD.size]
    kind, raw, length = bf.RECORD_HEAD.unpack(first)
    assert (kind, raw) == (framing.KIND_CHUNK, hash_blob(b"plan: sum of squares\n").raw)
    assert data[-48:-40] == b"AGCB-END" and int.from_bytes(data[-40:-32], "big") == len(data)
    assert data[-32:] == blake3.blake3(data[:-32]).digest()
    assert len(data) == 2088
    assert blake3.blake3(data).hexdigest() == "b1483a065ad49164d63ec05a3ea80a988365ad43ad98e07c006cf96cc42e26c8"


def test_exported_records_carry_no_write_time_and_imports_get_a_fresh_one(exchange):
    src, dst, k, tmp = exchange
    craft = Craft.explode(str(tmp / "v2.bundle"))
    assert {framing.read_header(framed)[3] for _, _, framed in craft.records} == {0}
    store = Store.open(str(dst))
    store.remotes.import_bundle(str(tmp / "v2.bundle"), allow_unsigned=True)
    with views(store) as txn:
        times = {framing.read_header(value)[3] for value in raw_objects.values(txn).values()}
    assert 0 not in times


def test_pass_one_keeps_chunks_on_disk_not_in_memory(exchange):
    """Memory is bounded by metadata: chunks are indexed by offset, never held."""
    src, dst, k, tmp = exchange
    with open(tmp / "v2.bundle", "rb") as handle:
        parsed = bf.parse(handle)
        assert parsed.index.chunks and not set(parsed.index.chunks) & set(parsed.index.structured)
        for raw, (offset, length) in parsed.index.chunks.items():
            handle.seek(offset)
            assert bf.read_record_value(handle.read(length), framing.KIND_CHUNK, Digest(raw))
        assert sum(len(v) for v in parsed.index.structured.values()) < 64 * 1024


def test_export_carries_at_most_the_signature_limit(store, workspace, tmp_path):
    store.checkpoints.commit(str(workspace), "one")
    keys.write_keypair("alice", str(tmp_path / "k"))
    for _ in range(bf.MAX_SIGNATURES + 2):
        store.trust.sign("main", str(tmp_path / "k" / "alice.key"))
    result = store.remotes.export_bundle("main", str(tmp_path / "b.bundle"), str(tmp_path / "k" / "alice.key")).to_json()
    assert len(result["signatures"]) == bf.MAX_SIGNATURES
    receiver = Store.memory()
    receiver.trust.add("alice", str(tmp_path / "k" / "alice.pub"))
    assert receiver.remotes.import_bundle(str(tmp_path / "b.bundle")).to_json()["signature"] == "valid"


@pytest.mark.parametrize("at", [5, 9_000, 24_990])
def test_export_scans_a_large_file_window_by_window(tmp_path, monkeypatch, at):
    """Files are scanned for export in overlapping windows (bounded memory); the finding
    names the line counted from the start of the file."""
    import random as rnd

    from agentcas.exchange.bundle import SecretInBundle
    from agentcas.workspace import secrets
    monkeypatch.setattr(secrets, "SCAN_WINDOW", 64 << 10)
    monkeypatch.setattr(secrets, "SCAN_OVERLAP", 1024)
    rng = rnd.Random(at)
    lines = [(" ".join(rng.choice(["alpha", "beta", "task-7", "gamma"]) for _ in range(8)) + "\n").encode()
             for _ in range(25_000)]  # ~1 MB: many chunks, 16 windows
    token = "ghp_" + "".join(rng.choice("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
                             for _ in range(36))
    lines.insert(at, f"TOKEN {token}\n".encode())
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "log.txt").write_bytes(b"".join(lines))
    store = Store.init(str(tmp_path / "s"))[0]
    store.checkpoints.commit(str(ws), "with a token", allow_secrets=["log.txt"])
    with pytest.raises(SecretInBundle, match=f"log.txt line {at + 1} looks like a GitHub token"):
        store.remotes.export_bundle("main", str(tmp_path / "b.bundle"))
    assert not (tmp_path / "b.bundle").exists()


# --- objects that lie about sizes, counts, kinds ------------------------------------------------

def _sized_chunk_list(sizes, pieces=(b"abcd", b"efgh"), entry_size=None):
    """A file of real chunks `pieces` whose chunk list declares `sizes` (and whose entry
    declares their sum): the file id is right, only the sizes lie."""
    def make(craft):
        from agentcas.cas.objects import ChunkList, ChunkRef
        refs = tuple(ChunkRef(craft.add(framing.KIND_CHUNK, p), s) for p, s in zip(pieces, sizes))
        list_id = craft.add(framing.KIND_CHUNKLIST, ChunkList(refs).encode())
        return {"name": "lies", "type": "file", "id": hash_blob(b"".join(pieces)).hex(), "mode": 0o644,
                "size": sum(sizes) if entry_size is None else entry_size, "chunks": list_id.hex()}
    return make


def _single_chunk_size_lies(craft):
    digest = craft.add(framing.KIND_CHUNK, b"abcd")
    return {"name": "lies", "type": "file", "id": digest.hex(), "mode": 0o644, "size": 10}


def _file_points_at_a_tree(craft):
    """A one-chunk file whose id is a tree object: right size, wrong kind."""
    data = b'{"entries":[]}'
    digest = craft.add(framing.KIND_TREE, data)
    return {"name": "lies", "type": "file", "id": digest.hex(), "mode": 0o644, "size": len(data)}


SIZE_CASES = {
    "chunk-sizes-6-2": (_rebuild_with(_sized_chunk_list([6, 2])), "size"),
    "chunk-size-10e15": (_rebuild_with(_sized_chunk_list([10 ** 15, 4])), "size"),
    "single-chunk-size": (_rebuild_with(_single_chunk_size_lies), "size"),
    "file-is-a-tree": (_rebuild_with(_file_points_at_a_tree), "expected a chunk"),
}


@pytest.mark.parametrize("case", sorted(SIZE_CASES))
def test_objects_that_lie_about_sizes_are_refused(case, receiver, tmp_path):
    build, fragment = SIZE_CASES[case]
    refused(receiver, build().bytes(), tmp_path, fragment)


def _history_craft(chunk_sizes, count=None, length=None):
    """good_craft() plus a one-record history cut into chunks 4 + 4 whose segment declares
    `chunk_sizes` (and `count`, `length`)."""
    import blake3

    from agentcas.cas.digest import chain_prefix
    from agentcas.cas.objects import ChunkRef, Segment
    craft = good_craft(sign=False)
    record = b'{"a":1}\n'
    pieces = (record[:4], record[4:])
    refs = tuple(ChunkRef(craft.add(framing.KIND_CHUNK, p), s) for p, s in zip(pieces, chunk_sizes))
    digest = chain_prefix(EMPTY_POSITION.digest, blake3.blake3(record).digest())
    digest = digest if isinstance(digest, Digest) else Digest(digest)
    segment = Segment(EMPTY_POSITION, 0, None, count or 1, length or sum(chunk_sizes), digest, refs)
    seg_id = craft.add(framing.KIND_SEGMENT, segment.encode())
    position = segment.end(seg_id)
    # Replace the checkpoint by one with this history.
    (old,) = craft.find(framing.KIND_CHECKPOINT)
    craft.records.remove(old)
    tree = Checkpoint.decode(framing.unframe(old[2])[1]).tree
    cp = Checkpoint(tree, (), "main", "crafted", "test", CREATED, {}, position)
    cp_id = craft.add(framing.KIND_CHECKPOINT, cp.encode())
    craft.manifest.update(checkpoint=cp_id.hex(), checkpoints=[cp_id.hex()], history=position.to_doc())
    craft.sign()
    return craft


def test_good_history_craft_imports(receiver, tmp_path):
    path = tmp_path / "h.bundle"
    path.write_bytes(_history_craft([4, 4]).bytes())
    receiver.remotes.import_bundle(str(path))
    assert b"".join(receiver.history.read("main")) == b'{"a":1}\n'
    assert receiver.gc.fsck().to_json()["ok"]


@pytest.mark.parametrize("sizes", [[6, 2], [2, 6], [10 ** 15, 4]])
def test_segment_chunk_sizes_that_lie_are_refused(sizes, receiver, tmp_path):
    refused(receiver, _history_craft(sizes).bytes(), tmp_path, "size")


def test_cli_import_of_a_lying_chunk_list_writes_nothing(run, tmp_path):
    """The probe's case through the real command: exit 4, not one row changed."""
    from support.store_state import store_rows
    store_dir = tmp_path / "cli-store"
    assert run("init", store_dir).code == 0
    (tmp_path / "alice.pub").write_text(ALICE.public.to_line("alice"))
    assert run("trust", "add", "alice", tmp_path / "alice.pub", store=store_dir).code == 0
    for sizes in ([6, 2], [10 ** 15, 4]):
        path = tmp_path / f"lies-{sizes[0]}.bundle"
        path.write_bytes(_rebuild_with(_sized_chunk_list(sizes))().bytes())
        before = store_rows(store_dir)
        result = run("import", path, store=store_dir)
        assert result.code == 4, result
        assert "size" in result.err and "Traceback" not in result.err
        assert store_rows(store_dir) == before


def test_export_to_an_empty_path_is_a_usage_error(tmp_path, run, workspace):
    """`-o ''` named the current directory ("... already exists", exit 3): it is no path."""
    store = tmp_path / "s"
    assert run("init", store).code == 0
    assert run("commit", workspace, "-m", "one", store=store).code == 0
    before = sorted(os.listdir(tmp_path))
    result = run("export", "main", "-o", "", store=store, cwd=tmp_path)
    assert result.code == 2 and "empty" in result.err and "Traceback" not in result.err, result
    assert sorted(os.listdir(tmp_path)) == before
