"""Crafted bundles: `Craft` builds one object by object (or explodes an exported one), so a
test breaks exactly one thing; `good_craft()` imports cleanly; keys and a receiving store."""

from __future__ import annotations

import pytest

from agentcas import Store
from agentcas.cas import encoding, framing
from agentcas.cas.digest import EMPTY, Digest, hash_blob, hash_object
from agentcas.cas.objects import EMPTY_POSITION, Checkpoint
from agentcas.cas.store import TABLES
from agentcas.exchange import bundle_format as bf
from agentcas.signing import envelope, keys

from support.store_state import views

ALICE = keys.generate()
MALLORY = keys.generate()
IDENTITY = bytes.fromhex("01" + "00" * 31)
CREATED = "2026-11-29T10:00:00.000000Z"


class Craft:
    """A bundle under construction: records, manifest document, envelopes."""

    def __init__(self):
        self.records: list[list] = []
        self.envelopes: list[bytes] = []
        self.manifest: dict = {}
        self.manifest_bytes: bytes | None = None

    def add(self, kind: int, data: bytes, compress: bool = False) -> Digest:
        digest = hash_blob(data) if kind == framing.KIND_CHUNK else hash_object(framing.KIND_NAMES[kind], data)
        self.records.append([kind, digest.raw, framing.frame(kind, data, compress=compress, written_at=0)])
        return digest

    def file(self, name: str, data: bytes, mode: int = 0o644) -> dict:
        digest = self.add(framing.KIND_CHUNK, data) if data else EMPTY
        return {"name": name, "type": "file", "id": digest.hex(), "mode": mode, "size": len(data)}

    def tree(self, entries: list[dict]) -> Digest:
        entries = sorted(entries, key=lambda e: e["name"].encode("utf-8", "surrogatepass"))
        return self.add(framing.KIND_TREE, encoding.encode({"entries": entries}))

    def checkpoint(self, tree: Digest, parents=(), thread: str = "main") -> Digest:
        cp = Checkpoint(tree, tuple(parents), thread, "crafted", "test", CREATED, {}, EMPTY_POSITION)
        return self.add(framing.KIND_CHECKPOINT, cp.encode())

    def finish(self, checkpoint: Digest, files: list[dict], thread: str = "main", checkpoints=None) -> None:
        self.manifest = {"format": "agentcas-bundle", "version": 1, "object_format": 2,
                         "checkpoint": checkpoint.hex(), "thread": thread,
                         "checkpoints": [c.hex() for c in (checkpoints or [checkpoint])],
                         "history": EMPTY_POSITION.to_doc(), "files": files,
                         "objects": {"count": 0, "bytes": 0}, "created_at": CREATED}

    def sign(self, key=ALICE, checkpoint: str | None = None, thread: str | None = None,
             namespace: str = envelope.NAMESPACE_CHECKPOINT, signed_at: str | None = None) -> envelope.Envelope:
        signed = envelope.sign(key, Digest.parse(checkpoint or self.manifest["checkpoint"]),
                               thread or self.manifest["thread"], namespace, signed_at)
        self.envelopes.append(signed.encode())
        return signed

    def bytes(self, fix: bool = True) -> bytes:
        records = b"".join(bf.RECORD_HEAD.pack(kind, raw, len(framed)) + framed for kind, raw, framed in self.records)
        if fix:
            self.manifest["objects"] = {"count": len(self.records), "bytes": len(records)}
        manifest = self.manifest_bytes if self.manifest_bytes is not None else encoding.encode(self.manifest)
        body = (bf.MAGIC + bf.U32.pack(len(manifest)) + manifest + records + bf.U32.pack(len(self.envelopes))
                + b"".join(bf.U32.pack(len(e)) + e for e in self.envelopes))
        body += bf.TRAILER_MAGIC + (len(body) + 8 + 8 + 32).to_bytes(8, "big")
        import blake3
        return body + blake3.blake3(body).digest()

    @classmethod
    def explode(cls, path: str) -> Craft:
        """The parts of an exported bundle, ready to be changed and reassembled."""
        craft = cls()
        with open(path, "rb") as handle:
            parsed = bf.parse(handle)
            for digest, kind, framed in bf.iter_records(handle, parsed):
                craft.records.append([kind, digest.raw, framed])
        craft.manifest = parsed.manifest.to_doc()
        craft.envelopes = list(parsed.envelopes)
        return craft

    def find(self, kind: int) -> list:
        return [r for r in self.records if r[0] == kind]


def good_craft(root_extra=(), files_extra=(), sign=True) -> Craft:
    """memory/notes.md and task.json, signed by ALICE; extra root entries/manifest files optional."""
    craft = Craft()
    notes = craft.file("notes.md", b"plan: sum of squares\n")
    memory = craft.tree([notes])
    task = craft.file("task.json", b'{"step": 1}\n')
    root = craft.tree([{"name": "memory", "type": "dir", "id": memory.hex()}, task, *root_extra])
    cp = craft.checkpoint(root)
    files = [{"path": "memory/notes.md", "type": "file", "size": notes["size"], "mode": "0644", "id": notes["id"]},
             {"path": "task.json", "type": "file", "size": task["size"], "mode": "0644", "id": task["id"]},
             *files_extra]
    craft.finish(cp, sorted(files, key=lambda f: f["path"]))
    if sign:
        craft.sign()
    return craft


def snapshot(store: Store) -> dict:
    rows = {}
    with views(store) as txn:
        for table in TABLES:
            if table in ("statcache", "pins"):
                continue
            for key, value in txn.scan(table):
                rows[(table, bytes(key))] = bytes(value)
    return rows


@pytest.fixture
def receiver(tmp_path, store) -> Store:
    (tmp_path / "alice.pub").write_text(ALICE.public.to_line("alice"))
    store.trust.add("alice", str(tmp_path / "alice.pub"))
    return store
