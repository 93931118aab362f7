"""Why is an object alive? The path from a root to it, or "unreachable".

`explain` walks the roots in the order gc marks them (thread refs, kept reflog
entries, signatures of live checkpoints, then recent objects) with one MarkWalker,
remembering for each object the referrer it was first reached from, and stops as
soon as the object is reached; the path is read back through those referrers to
the object that the root names directly. The first root that reaches an object is
the one reported, so a chunk shared by several threads is explained by one of them.
"""

from __future__ import annotations

import time
from typing import Any

from agentcas.cas import framing
from agentcas.cas.backends import Backends
from agentcas.cas.digest import Digest
from agentcas.cas.objects import Tree
from agentcas.cas.source import ObjectSource, load_object
from agentcas.errors import IntegrityError, NotFound, UsageError
from agentcas.gc.plan import DEFAULT_EXPIRE_REFLOG, DEFAULT_GRACE
from agentcas.gc.roots import SIGNATURE_KEY_SIZE, MarkWalker, all_roots, read_pins, young_closure
from agentcas.lineage.closure import MissingObject

MIN_PREFIX = 8


class UnknownObject(NotFound):
    pass


def resolve_object(objects: ObjectSource, text: str) -> Digest:
    """A stored object named by its id or a unique hex prefix of at least 8 characters."""
    text = (text or "").strip().lower()
    if not (MIN_PREFIX <= len(text) <= 64) or any(c not in "0123456789abcdef" for c in text):
        raise UsageError(f"not an object id or hex prefix of 8+ characters: {text[:80]!r}")
    start = bytes.fromhex(text[: len(text) // 2 * 2])
    matches = []
    for key in objects.keys_from(start):
        hexkey = bytes(key).hex()
        if not hexkey.startswith(text[: len(text) // 2 * 2]):
            break
        if hexkey.startswith(text):
            matches.append(Digest(bytes(key)))
            if len(matches) > 1:
                raise UsageError(f"object prefix {text!r} is ambiguous")
    if not matches:
        raise UnknownObject(f"no stored object {text!r}")
    return matches[0]


def resolve_file(backends: Backends, objects: ObjectSource, text: str) -> tuple[Digest, Digest] | None:
    """(file id, its chunk list id) for a file of several chunks whose b3sum id (what
    `show --files` prints) is `text` or starts with it; None if no stored tree has one.

    Such a file is stored as its chunk list, under the chunk list's own id, so the file
    id names no object: the trees are searched for an entry that carries it.
    """
    text = (text or "").strip().lower()
    found: dict[bytes, Digest] = {}
    for info in backends.blobs.list():
        kind = info.kind
        if kind is None:
            header = objects.blobs.header(info.key)
            kind = None if header is None else framing.read_header(header)[0]
        if kind != framing.KIND_TREE:
            continue
        data = load_object(objects, Digest(bytes(info.key)), framing.KIND_TREE)
        for entry in () if data is None else Tree.decode(data).entries:
            if entry.chunks is not None and entry.id.hex().startswith(text):
                found[entry.id.raw] = entry.chunks
        if len(found) > 1:
            raise UsageError(f"file id prefix {text!r} is ambiguous")
    if not found:
        return None
    (file_id, chunk_list), = found.items()
    return Digest(file_id), chunk_list


def _path(parents: dict, target: bytes) -> list[dict]:
    path, current = [], target
    while current is not None:
        referrer, kind = parents[current]
        path.append({"id": current.hex(), "kind": framing.KIND_NAMES[kind]})
        current = referrer
    path.reverse()
    return path


def explain(backends: Backends, text: str, now: float | None = None, grace: int = DEFAULT_GRACE,
            expire_reflog: int = DEFAULT_EXPIRE_REFLOG) -> dict:
    """{"object", "kind", "alive", "root", "path", ...} for the object `text` names."""
    now = time.time() if now is None else now
    with backends.meta.reader() as txn, backends.source.reading() as objects:
        try:
            target = resolve_object(objects, text)
            file_id = None
        except UnknownObject:
            file = resolve_file(backends, objects, text)
            if file is None:
                raise
            file_id, target = file  # a file of several chunks lives as long as its chunk list
        value = objects.raw(target)
        kind, _, _, written_at = framing.read_header(value)
        doc: dict[str, Any] = {"object": target.hex(), "kind": framing.KIND_NAMES[kind], "written_at": written_at,
               "size": len(value), "alive": False, "root": None, "path": [], "notes": []}
        if file_id is not None:
            doc.update(object=file_id.hex(), kind="file", chunk_list=target.hex())
        parents: dict[bytes, tuple] = {}
        walker = MarkWalker(objects)

        def walk(stream, root_doc) -> bool:
            try:
                for digest, got_kind, referrer in stream:
                    parents[digest.raw] = (None if referrer is None else referrer.raw, got_kind)
                    if digest.raw == target.raw:
                        doc.update(alive=True, root=root_doc, path=_path(parents, target.raw))
                        return True
            except (MissingObject, IntegrityError) as exc:
                doc["notes"].append(f"{root_doc['kind']} root stops early: {exc}")
            return False

        roots, _, _ = all_roots(txn, now - expire_reflog)
        for root in roots:
            if walk(walker.root(root), root.to_doc()):
                return doc
        if kind == framing.KIND_SIGNATURE:
            for key, _ in txn.scan("signatures"):
                if len(key) >= SIGNATURE_KEY_SIZE and bytes(key[32:64]) == target.raw \
                        and bytes(key[:32]) in parents:
                    parents[target.raw] = (bytes(key[:32]), kind)
                    doc.update(alive=True, root={"kind": "signature", "checkpoint": bytes(key[:32]).hex()},
                               path=_path(parents, target.raw))
                    return doc
        for info in backends.blobs.list():
            key = info.key
            if info.kind is not None:
                young_kind, when = info.kind, info.written_at
            else:
                header = objects.blobs.header(key)
                if header is None:
                    continue
                young_kind, _, _, when = framing.read_header(header)
            if when > now - grace and bytes(key) not in walker.seen:
                root_doc = {"kind": "recent", "id": bytes(key).hex(), "written_at": when,
                            "held_for_seconds": max(0, int(when + grace - now) + 1)}
                if walk(young_closure(walker, Digest(bytes(key)), young_kind), root_doc):
                    return doc
        pins = [p for p in read_pins(txn) if p.live()]
    if pins:
        doc["notes"].append(f"{len(pins)} write(s) in progress: gc deletes nothing until they finish")
    return doc


def render_text(doc: dict) -> str:
    name = f"{doc['kind']} {doc['object']}"
    if "chunk_list" in doc:
        name += f" (stored as chunk list {doc['chunk_list']})"
    if not doc["alive"]:
        lines = [f"{name} is unreachable: the next gc deletes it (unless a write is in progress)"]
    else:
        root = doc["root"]
        if root["kind"] in ("thread", "reflog"):
            head = f"{'thread' if root['kind'] == 'thread' else 'reflog entry'} {root['name']}"
        elif root["kind"] == "signature":
            head = f"signature of live checkpoint {root['checkpoint'][:12]}"
        else:
            head = (f"recent object {root['id'][:12]} (written less than the grace period ago; "
                    f"held {root['held_for_seconds']} s more)")
        lines = [f"{name} is alive, kept by {head}:"]
        lines += [f"  {'-> ' if i else '   '}{step['kind']} {step['id']}" for i, step in enumerate(doc["path"])]
    lines += [f"note: {note}" for note in doc["notes"]]
    return "\n".join(lines)

