"""fsck: check every stored byte and every reference.

The metadata is read in one snapshot, the objects in one more (one LMDB read
transaction for an embedded store; a listing of the bucket for a shared one).
1. Rows: every value of the sealed tables (meta, refs, reflog, trust, remotes, leases,
   imports, signatures, and this machine's statcache) is unsealed (its keyed checksum
   catches a flipped byte); refs, reflog entries and leases are decoded too. `signatures` rows must be 64-byte keys
   naming a stored signature.
2. Objects: the blob store is streamed (an embedded store's pack by pack, checking the
   packs on the way: step 5; for a shared store, the bucket itself, read in
   parallel batches: never this machine's cache, which may hold a good copy of an object
   the bucket holds damaged); each value's header CRC is checked, its body
   unframed (bounded decompression) and hashed against its id, and structured objects
   decoded. Each rollout segment is checked on its own: its chunks' bytes are read,
   and its length, record count and prefix digest recomputed from its base.
3. Positions: every history position named by a ref, a reflog entry, a checkpoint or
   a segment base is checked against its segment (a cut inside a segment, left by a
   fork or revert, is recomputed with History.position).
4. Closures: from every thread ref and every reflog state, the closure is walked
   (lineage/closure.Walker, one shared `seen` set); a missing object is reported with
   what refers to it (on a shared store, missing means absent from step 2's listing of
   the bucket, kept in a bounded gc.markset.MarkSet: the walk reads through this
   machine's cache, which may still hold what the bucket lost), and a corrupt object
   found in step 2 is annotated with its referrer and root.
0. Pages (an embedded store): before LMDB reads anything, the page structure of its
   data file is checked with plain reads (cas/lmdb_pages.py): LMDB trusts in-page offsets,
   and one flipped byte there makes it read past the file, a SIGBUS. A damaged page in a
   database's tree stops fsck with one line naming the page and the database (exit 4).
A damaged LMDB file (lmdb.Error while reading) is reported as "store database is
corrupt" (exit 4).
"""

from __future__ import annotations

import os
from typing import Any

import lmdb

from agentcas.cas import encoding, framing, packs
from agentcas.cas.backends import Backends
from agentcas.cas.digest import Digest
from agentcas.cas.leases import LeaseRow
from agentcas.cas.lmdb_pages import damaged_pages
from agentcas.cas.lmdb_store import DATA_FILE, StoreCorrupt
from agentcas.cas.metastore.base import MetaTxn
from agentcas.cas.objects import Checkpoint, ChunkList, HistoryPosition, Segment, Tree
from agentcas.cas.sealed import unseal
from agentcas.cas.source import ObjectSource, load_object, verify_object
from agentcas.errors import IntegrityError
from agentcas.gc.markset import MarkSet
from agentcas.gc.pages import PageReleaser
from agentcas.gc.roots import SIGNATURE_KEY_SIZE, Root, entry_roots, state_roots
from agentcas.lineage import checkpoints, rollout
from agentcas.lineage.closure import MissingObject, Walker
from agentcas.refs import threads

FETCH_OBJECTS = 64       # objects read per batch by the object pass (step 2)
FETCH_BYTES = 16 << 20   # ... or at most this many listed bytes
SEALED_TABLES = ("meta", "refs", "reflog", "trust", "remotes", "leases", "imports", "signatures")
DECODERS = {framing.KIND_TREE: Tree.decode, framing.KIND_CHECKPOINT: Checkpoint.decode,
            framing.KIND_CHUNKLIST: ChunkList.decode, framing.KIND_SEGMENT: Segment.decode}


class FsckFailed(IntegrityError):
    """fsck found problems (raised by callers that want exit 4 after printing)."""


class _DependencyMissing(IntegrityError):
    """A stored object's dependency is absent: reported only if a root reaches the object."""


class _CorruptReference(IntegrityError):
    def __init__(self, digest: Digest, kind: int, referrer: Digest | None):
        self.digest, self.kind, self.referrer = digest, kind, referrer
        super().__init__(f"{framing.KIND_NAMES[kind]} {digest.hex()} is corrupt")


class _FsckWalker(Walker):
    """Walker over objects already verified in the object pass; corrupt ones stop it."""

    def __init__(self, objects: ObjectSource, corrupt: dict, seen: set, on_corrupt_leaf, listed=None):
        # deep: multi-chunk files are re-hashed; segments and positions are checked per object.
        super().__init__(objects, seen, verify=False, follow_parents=True, deep=True, deep_history=False)
        self.corrupt = corrupt
        self.on_corrupt_leaf = on_corrupt_leaf
        # A shared store's objects as the bucket listed them: one this machine's cache still
        # holds but the bucket lost is missing (the walk reads through the cache).
        self.listed = listed

    def _unlisted(self, digest) -> bool:
        return self.listed is not None and digest.raw not in self.listed

    def _data(self, digest, kind, referrer):
        if digest.raw in self.corrupt:
            raise _CorruptReference(digest, kind, referrer)
        if self._unlisted(digest):
            raise MissingObject(digest, kind, referrer)
        return super()._data(digest, kind, referrer)

    def _header(self, digest):
        return None if self._unlisted(digest) else super()._header(digest)

    def _chunk_bytes(self, digest, referrer):
        if self._unlisted(digest):
            raise MissingObject(digest, framing.KIND_CHUNK, referrer)
        return super()._chunk_bytes(digest, referrer)

    def _leaf(self, digest, kind, referrer, size=None, hasher=None):
        if digest.raw in self.corrupt and digest.raw not in self.seen:
            self.seen.add(digest.raw)
            self.on_corrupt_leaf(_CorruptReference(digest, kind, referrer))
            return
        yield from super()._leaf(digest, kind, referrer, size, hasher)

    def _hashable(self, chunk_list):
        return not any(ref.id.raw in self.corrupt for ref in chunk_list.chunks)


class Fsck:
    """One fsck run over a metadata snapshot and an object source; `problems` collects findings."""

    def __init__(self, txn: MetaTxn, source: ObjectSource, local=None, progress=None,
                 pages: PageReleaser | None = None, listed: MarkSet | None = None):
        self.txn = txn
        self.listed = listed  # a shared store: every key the object pass read from the bucket
        self.source = source
        self.local = local  # this machine's table environment (its stat cache), if any
        self.pages = pages or PageReleaser(None)
        self.progress = progress
        self.problems: list[dict] = []
        self.corrupt: dict[bytes, dict] = {}  # raw id -> its problem
        self.history = rollout.History(source)
        self.positions_checked: set = set()
        self.objects = 0
        self.rows = 0
        self.roots: list[Root] = []
        self.checkpoint_cache: dict = {}  # ancestors read by checkpoints.check_index

    def problem(self, what: str, message: str, **fields) -> dict:
        doc = {"what": what, "message": message}
        doc.update({k: v for k, v in fields.items() if v is not None})
        self.problems.append(doc)
        return doc

    # -- 1. rows ---------------------------------------------------------------------------
    def check_rows(self) -> None:
        for table in SEALED_TABLES:
            self._check_table(self.txn, table)
        if self.local is not None:
            with self.local.reader() as local:
                self._check_table(local, "statcache")
        for key, _ in self.txn.scan("signatures"):
            key = bytes(key)
            if len(key) < SIGNATURE_KEY_SIZE:
                self.problem("row", f"signatures entry {key.hex()} has a malformed key", table="signatures")
            elif not self.source.has(Digest(key[32:64])):
                self.problem("missing", f"signature {key[32:64].hex()} is missing (listed for checkpoint "
                             f"{key[:32].hex()})", id=key[32:64].hex(), kind="signature",
                             referenced_by=key[:32].hex())
            else:
                self.check_signature_row(key)

    def check_signature_row(self, key: bytes) -> None:
        """A `signatures` row must list an envelope over the checkpoint its key names."""
        try:
            data = load_object(self.source, Digest(key[32:64]), framing.KIND_SIGNATURE)
            if data is None:
                return  # a missing envelope is reported by the object pass
            # Only the checkpoint id is read (signing/ sits above gc/; it decodes the rest).
            named = Digest.parse(encoding.decode(data)["statement"]["checkpoint"]).raw
        except lmdb.Error:
            raise
        except Exception:  # noqa: BLE001 - a corrupt envelope is reported by the object pass
            return
        if named != key[:32]:
            self.problem("row", f"signatures entry lists signature {key[32:64].hex()} for checkpoint "
                         f"{key[:32].hex()}, but it signs {named.hex()}", table="signatures")

    def _check_table(self, txn, table: str) -> None:
        for key, value in txn.scan(table):
            key = bytes(key)
            self.rows += 1
            shown = key.decode("utf-8", "replace") if table != "leases" else key.hex()
            try:
                unseal(table, key, value)
                if table == "refs" and key.startswith(threads.PREFIX):
                    name = key[len(threads.PREFIX):].decode("utf-8")
                    state = threads.read_thread(self.txn, name)
                    self.roots += state_roots("thread", name, name, state)
                elif table == "reflog":
                    entry = threads.decode_reflog_entry(key, value)
                    name = key[len(threads.PREFIX): key.index(b"\0")].decode("utf-8")
                    # Named by its stored number: this scan sees a thread's entries one by one.
                    self.roots += entry_roots(name, entry.number, entry)
                elif table == "leases":
                    LeaseRow.decode(key, value)
            except lmdb.Error:
                raise
            except Exception as exc:  # noqa: BLE001 - any damage is a finding, not a crash
                self.problem("row", f"{table} entry {shown!r}: {exc}", table=table, key=shown)

    # -- 2. objects ------------------------------------------------------------------------
    def check_objects(self, pack_check: packs.PackCheck | None = None) -> None:
        """With `pack_check` (an embedded store), the objects are read pack by pack from the
        metadata snapshot (the same environment), gathering the packs' check on the way."""
        blobs = self.source.blobs
        total = blobs.count()
        stored = _stored_values(blobs) if pack_check is None else packs.stored_values(self.txn, pack_check)
        for info, value in stored:
            raw = bytes(info.key)
            if value is None:
                continue  # deleted since it was listed (a concurrent gc)
            if self.listed is not None:
                self.listed.add(raw)
            self.objects += 1
            self.pages.tick()
            if self.progress and self.objects % 4096 == 0:
                self.progress(self.objects, total)
            kind_name = None
            try:
                if len(raw) != 32:
                    raise IntegrityError(f"object key {raw.hex()} is not a 32-byte id")
                kind_name = framing.KIND_NAMES[framing.read_header(value)[0]]
                kind, data = framing.unframe(value)
                digest = Digest(raw)
                verify_object(kind, digest, data)
                decoder = DECODERS.get(kind)
                obj: Any = decoder(data) if decoder else None
                if kind == framing.KIND_SEGMENT:
                    self.check_segment(digest, obj)
                elif kind == framing.KIND_CHECKPOINT:
                    self.check_position(obj.history, f"checkpoint {digest.hex()}", stored_object=True)
                    checkpoints.check_index(self.source, digest, obj, self.checkpoint_cache)
            except lmdb.Error:
                raise
            except _DependencyMissing:
                pass  # an orphan of an interrupted write, unless a root reaches it (step 4 says so)
            except Exception as exc:  # noqa: BLE001
                message = str(exc) if raw.hex() in str(exc) else f"{kind_name or 'object'} {raw.hex()}: {exc}"
                self.corrupt[raw] = self.problem("corrupt", message, id=raw.hex(), kind=kind_name)

    def check_segment(self, digest: Digest, segment: Segment) -> None:
        """Recompute a segment's length, record count and prefix digest from its base."""
        # A write killed part-way may leave a segment whose chunks or base never landed:
        # harmless garbage unless a root reaches it (then the closure pass reports it).
        for ref in segment.chunks:
            if not self.source.has(ref.id):
                raise _DependencyMissing(f"segment {digest.hex()}: its chunk {ref.id.hex()} is missing")
        if segment.base.segment is not None and not self.source.has(segment.base.segment):
            raise _DependencyMissing(f"segment {digest.hex()}: its base segment is missing")
        if segment.copy is not None and segment.copy.source.segment is not None \
                and not self.source.has(segment.copy.source.segment):
            raise _DependencyMissing(f"segment {digest.hex()}: the segment it copies records from is missing")
        self.history.check_segment(digest, segment)

    def check_position(self, position: HistoryPosition, where: str, raise_: bool = False,
                       stored_object: bool = False) -> None:
        """A position must be its segment's end, or a cut recomputable inside it.

        For a position a stored object names (`stored_object`), a missing segment raises
        _DependencyMissing: a write killed part-way leaves objects whose dependencies never
        landed, harmless garbage unless a root reaches them (then step 4 reports them).
        """
        if position.segment is None:
            return
        key = (position.segment.raw, position.seq, position.offset, position.digest.raw)
        if key in self.positions_checked:
            return
        if stored_object and not self.source.has(position.segment):
            raise _DependencyMissing(f"{where}: rollout segment {position.segment.hex()} is missing")
        self.positions_checked.add(key)
        try:
            self.history.check_position(position)
        except lmdb.Error:
            raise
        except Exception as exc:  # noqa: BLE001
            if raise_:
                raise
            self.problem("position", f"{where}: {exc}", id=position.segment.hex(), kind="segment")

    # -- 3/4. positions of roots and closures --------------------------------------------
    def check_closures(self) -> None:
        seen: set = set()
        current: list[Root] = []
        walker = _FsckWalker(self.source, self.corrupt, seen,
                             lambda exc: self.note_referrer(exc, current[0]), self.listed)
        for root in self.roots:
            current[:] = [root]
            self.check_position(root.history, root.describe())
            try:
                for _ in _walk(walker, root):
                    self.pages.tick()
            except MissingObject as exc:
                self.problem("missing", f"{exc}, reachable from {root.describe()}", id=exc.digest.hex(),
                             kind=framing.KIND_NAMES[exc.kind],
                             referenced_by=None if exc.referrer is None else exc.referrer.hex(),
                             root=root.describe())
            except _CorruptReference as exc:
                self.note_referrer(exc, root)
            except lmdb.Error:
                raise
            except Exception as exc:  # noqa: BLE001
                self.problem("closure", f"{root.describe()}: {exc}", root=root.describe())

    def note_referrer(self, exc: _CorruptReference, root: Root) -> None:
        """Name what refers to a corrupt object and which root reaches it."""
        found = self.corrupt[exc.digest.raw]
        by = None if exc.referrer is None else exc.referrer.hex()
        found["referenced_by"] = by
        found["root"] = root.describe()
        found["message"] += f" (referenced by {by or root.describe()}, reachable from {root.describe()})"

    # -- 5. packs (an embedded store): every pack byte indexed or reclaimable ------------
    def check_packs(self, found: packs.PackCheck) -> dict:
        for what, message, shown in found.problems:
            self.problem(what, message, **({"id": shown} if shown else {}))
        return {"count": found.packs, "bytes": found.pack_bytes, "reclaimable_bytes": found.reclaimable_bytes}

    # -- 5'. packs on S3 (a shared store): each indexed pack whole, each stored one indexed --
    def check_shared_packs(self, packed) -> dict:
        problems, found = packed.check_packs()
        for what, message, shown in problems:
            self.problem(what, message, pack=shown)
        for raw, location in packed.locations(self.corrupt).items():  # name the pack of a bad object
            self.corrupt[raw]["pack"] = location.pack.hex()
            self.corrupt[raw]["message"] += f" (in pack {location.pack.hex()})"
        return found

    def run(self, embedded: bool = False, packed=None) -> dict:
        pack_check = packs.PackCheck() if embedded else None
        self.check_rows()
        self.check_objects(pack_check)
        self.check_closures()
        doc = {"ok": not self.problems, "objects": self.objects, "rows": self.rows,
               "roots": len(self.roots), "problems": self.problems}
        if pack_check is not None:
            doc["packs"] = self.check_packs(pack_check)
        elif packed is not None:
            doc["packs"] = self.check_shared_packs(packed)
        doc["ok"] = not self.problems
        return doc


def _stored_values(blobs):
    """(info, stored value or None) for every listed object, read from the store itself
    (`get_many_stored`: for a shared store the bucket, not this machine's cache) in
    batches of at most FETCH_OBJECTS objects or FETCH_BYTES listed bytes (a remote store
    reads a batch in parallel; a local one key by key)."""
    batch, size = [], 0
    for info in blobs.list():
        batch.append(info)
        size += info.size
        if len(batch) >= FETCH_OBJECTS or size >= FETCH_BYTES:
            yield from _fetched(blobs, batch)
            batch, size = [], 0
    yield from _fetched(blobs, batch)


def _fetched(blobs, batch):
    values = blobs.get_many_stored([bytes(info.key) for info in batch]) if batch else {}
    for info in batch:
        yield info, values.get(bytes(info.key))


def _walk(walker: Walker, root: Root):
    if root.checkpoint is not None:
        yield from walker.checkpoint(root.checkpoint)
    if root.history.segment is not None:
        yield from walker.history(root.history)


def check_pages(store_dir: str) -> None:
    """Step 0: StoreCorrupt naming the first damaged page of a database's tree, if any
    (a damaged free page is never read, so it is no problem)."""
    damaged = [page for page in damaged_pages(os.path.join(store_dir, DATA_FILE)) if not page.free]
    if damaged:
        more = f" (and {len(damaged) - 1} more damaged pages)" if len(damaged) > 1 else ""
        raise StoreCorrupt(f"store database is corrupt: {damaged[0].describe()}{more}; LMDB cannot read "
                           f"the store at {store_dir} safely")


def fsck(backends: Backends, progress=None) -> dict:
    """{"ok", "objects", "rows", "roots", "problems": [...]} for the whole store."""
    if backends.path is not None and os.path.isfile(os.path.join(backends.path, DATA_FILE)):
        check_pages(backends.path)
    listed = MarkSet() if backends.shared else None
    try:
        with backends.meta.reader() as txn, backends.source.reading() as objects:
            return Fsck(txn, objects, backends.local, progress, PageReleaser(backends), listed).run(
                embedded=backends.embedded is not None, packed=backends.packed)
    except lmdb.Error as exc:
        raise StoreCorrupt(f"store database is corrupt: {exc}") from None
    finally:
        if listed is not None:
            listed.close()


def render_text(doc: dict) -> str:
    if doc["ok"]:
        packed = doc.get("packs")
        tail = "" if packed is None else (f"; {packed['count']} packs of {packed['bytes']} bytes, "
                                          f"{packed['reclaimable_bytes']} reclaimable by a repack")
        return f"fsck: ok ({doc['objects']} objects, {doc['rows']} rows, {doc['roots']} roots checked{tail})"
    lines = [f"fsck: {len(doc['problems'])} problem(s) in {doc['objects']} objects, {doc['rows']} rows"]
    lines += [f"  {p['what']}: {p['message']}" for p in doc["problems"]]
    return "\n".join(lines)
