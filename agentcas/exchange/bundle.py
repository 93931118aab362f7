"""Export, verify and import bundles: one file that carries a checkpoint to another store.

Export walks the checkpoint's closure (its trees, chunk lists, chunks, rollout segments,
and every ancestor checkpoint with theirs), re-scans its files for secrets, and writes
the manifest, the objects, the signatures and the trailer (bundle_format.py) into a
temporary file that is linked into place only when complete. Export never writes to
the store.

Import checks everything before writing anything:
  1. pass 1 over the file: layout, lengths, every object's hash, the trailer;
  2. the closure: every object each checkpoint needs is in the bundle with the right
     kind, and the bundle carries nothing else; the manifest's checkpoints, history
     position and file list equal what the objects say; every multi-chunk file's bytes
     hash to its id; the rollout's prefix digests are recomputed;
  3. signatures against this store's trust list (and --allow-unsigned);
  4. rollback (table `imports`) and fast-forward of the target thread.
Only then: pass 2 re-reads and re-verifies each object while writing it in batches
(under a lease, cas/leases.py), the signature objects are stored, every object is
checked to be present, and one final metadata transaction re-checks the thread
(compare-and-swap), moves it, records the import and indexes the signatures.
During the checks the bundle's objects are read through an ObjectSource over the
bundle file itself (`BundleBlobs`), so lineage code reads them like any store's.
"""

from __future__ import annotations

import fnmatch
import os
import secrets as pyrandom
import time
from dataclasses import dataclass

import blake3

from agentcas import testing_hooks
from agentcas.cas import crashpoints, encoding, framing
from agentcas.cas.backends import Backends
from agentcas.cas.blobstore.base import BlobInfo, BlobStore
from agentcas.cas.digest import Digest
from agentcas.cas.leases import Lease
from agentcas.cas.metastore.base import MetaTxn
from agentcas.cas.objects import Checkpoint, HistoryPosition, InvalidObject
from agentcas.cas.sealed import seal, unseal
from agentcas.cas.source import ObjectSource
from agentcas.cas.system_errors import from_os_error
from agentcas.errors import AgentcasError, ConflictError, IntegrityError, NotFound, UsageError
from agentcas.exchange.bundle_format import (
    MAGIC,
    MAX_SIGNATURES,
    RECORD_HEAD,
    TRAILER,
    TRAILER_MAGIC,
    U32,
    BundleCorrupt,
    Manifest,
    ManifestFile,
    ParsedBundle,
    iter_records,
    parse,
    read_record_value,
    restamp,
)
from agentcas.exchange.secret_scan import is_binary_file, refuse_name_secrets, refuse_rollout_secrets
from agentcas.lineage import rollout
from agentcas.lineage.closure import MissingObject, Walker
from agentcas.refs import threads
from agentcas.refs.names import check_thread_name
from agentcas.refs.revisions import is_ancestor, load_checkpoint
from agentcas.refs.threads import ThreadState
from agentcas.signing import envelope as env
from agentcas.signing import trust
from agentcas.signing.keys import SigningKey
from agentcas.workspace import secrets
from agentcas.workspace.restore import list_files, verified_chunks

IMPORTS_PREFIX = b"threads/"
_PRIVATE_KEY = next(rule for rule in secrets.RULES if rule.name == "private key block")


class SignatureRejected(IntegrityError):
    """No signature by a trusted signer verifies: untrusted, invalid or absent."""

    def __init__(self, status: str, message: str):
        self.status = status
        super().__init__(message)


class RollbackRefused(IntegrityError):
    """The bundle is older than one already imported for the same thread."""


class SecretInBundle(AgentcasError):
    """Export found a likely secret (or private key) among the checkpoint's files (exit 1,
    as a commit refused for a secret)."""


# --- export -----------------------------------------------------------------------------------

def export_bundle(backends: Backends, checkpoint: Digest, thread: str, out_path: str,
                  key: SigningKey | None = None, allow_secrets=(), progress=None,
                  created_at: str | None = None, allow_rollout_secrets: bool = False) -> dict:
    """Write a bundle of `checkpoint` (with its ancestry and history) to `out_path`.

    Files and rollout records are scanned for secrets first (exchange/secret_scan.py).
    """
    check_thread_name(thread)
    if not out_path:   # abspath('') is the current directory, which "already exists"
        raise UsageError("the bundle's output path is empty")
    out_path = os.path.abspath(out_path)
    if os.path.lexists(out_path):
        raise ConflictError(f"{out_path} already exists; not overwriting")
    if not os.path.isdir(os.path.dirname(out_path)):
        raise UsageError(f"directory of {out_path} does not exist")
    with backends.meta.reader() as meta, backends.source.reading() as txn:
        cp = load_checkpoint(txn, checkpoint)
        scanned: set = set()
        files = _scan_files(txn, cp.tree, allow_secrets, scanned)
        records, checkpoints = [], []
        total = 0
        for digest, kind, _ in Walker(txn, verify=False, follow_parents=True).checkpoint(checkpoint):
            value = txn.raw(digest)
            records.append((digest, kind, len(value)))
            total += RECORD_HEAD.size + len(value)
            if kind == framing.KIND_CHECKPOINT:
                checkpoints.append(digest)
        for ancestor in checkpoints[1:]:
            # Ancestors travel too, so their files are scanned as well (each file id once).
            _scan_files(txn, load_checkpoint(txn, ancestor).tree, allow_secrets, scanned)
        # Every rollout segment the bundle carries, whole: its records leave with it.
        refuse_rollout_secrets(txn, [d for d, kind, _ in records if kind == framing.KIND_SEGMENT], thread,
                               "export", "no bundle was written", allow_rollout_secrets,
                               private_keys_always=True)
        refuse_name_secrets(txn, records, "export", "no bundle was written", allow_secrets)
        stored = [e for _, e in env.envelopes_for(meta, txn, checkpoint) if e.statement.thread == thread]
        stored.sort(key=lambda e: e.statement.signed_at, reverse=True)
        envelopes = stored[: MAX_SIGNATURES - (1 if key is not None else 0)]  # newest first
        if key is not None:
            envelopes.append(env.sign(key, checkpoint, thread))
        manifest = Manifest(checkpoint, thread, tuple(checkpoints), cp.history, tuple(files), len(records),
                            total, created_at or env.utc_now())
        directory = os.path.dirname(out_path)
        temp = os.path.join(directory, f".{os.path.basename(out_path)}.agentcas-{pyrandom.token_hex(6)}")
        written = 0
        try:
            with open(temp, "xb") as out:
                hasher = blake3.blake3()

                def put(data: bytes) -> None:
                    crashpoints.reached("export.write")
                    out.write(data)
                    hasher.update(data)

                manifest_bytes = manifest.encode()
                put(MAGIC + U32.pack(len(manifest_bytes)) + manifest_bytes)
                for digest, kind, length in records:
                    value = bytes(txn.raw(digest))
                    if len(value) != length:
                        raise IntegrityError(f"object {digest.hex()} changed during export")
                    read_record_value(value, kind, digest)  # verify before it leaves the store
                    put(RECORD_HEAD.pack(kind, digest.raw, length) + restamp(value, 0))
                    written += length
                    if progress:
                        progress(written, total)
                put(U32.pack(len(envelopes)))
                for item in envelopes:
                    data = item.encode()
                    put(U32.pack(len(data)) + data)
                size = out.tell() + TRAILER.size
                head = TRAILER_MAGIC + size.to_bytes(8, "big")
                put(head)
                out.write(hasher.digest())
                out.flush()
                crashpoints.reached("export.fsync")
                os.fsync(out.fileno())
            try:
                crashpoints.reached("export.link")
                os.link(temp, out_path)
            except FileExistsError:
                raise ConflictError(f"{out_path} appeared during export; not overwriting") from None
            except OSError:  # a file system without hard links: rename, after one more check
                if os.path.lexists(out_path):
                    raise ConflictError(f"{out_path} appeared during export; not overwriting") from None
                os.rename(temp, out_path)
        except OSError as exc:
            raise from_os_error(exc, f"writing the bundle {out_path}", "no bundle was written") from None
        finally:
            if os.path.exists(temp):
                crashpoints.reached("export.unlink")
                os.unlink(temp)
    crashpoints.reached("export.done")
    return {"bundle": out_path, "checkpoint": checkpoint.hex(), "thread": thread, "bytes": size,
            "objects": len(records), "checkpoints": len(checkpoints), "files": len(files),
            "history_records": cp.history.seq,
            "signatures": [e.statement.key_id for e in envelopes]}


def _scan_files(txn: ObjectSource, tree_id: Digest, allow_secrets, scanned: set) -> list[ManifestFile]:
    """Every file of the tree as a manifest entry, after a secret scan of its bytes.

    `scanned` holds (path, file id) pairs already scanned, so shared files cost nothing.
    """
    out = []
    for path, entry in list_files(txn, tree_id):
        if entry.type != "file":
            continue
        out.append(ManifestFile(path, entry.size, entry.mode, entry.id))
        if entry.size == 0 or (path, entry.id.raw) in scanned:
            continue
        scanned.add((path, entry.id.raw))
        if is_binary_file(txn, entry, path):
            continue
        allowed = any(fnmatch.fnmatchcase(path, g) for g in allow_secrets)
        # Window by window, so a file of any size is scanned in bounded memory.
        windows = secrets.WindowScan(lambda data, lines, path=path, allowed=allowed:
                                     _refuse_secret(data, lines, path, allowed))
        for data in verified_chunks(txn, entry, path):
            windows.feed(data)
        windows.finish()
    return out


def _refuse_secret(data, lines_before: int, path: str, allowed: bool) -> None:
    if allowed:
        # --allow-secret never lets a private key leave: only the key-block rule still applies.
        match = _PRIVATE_KEY.pattern.search(data)
        finding = None if match is None else secrets.Finding(
            path, data.count(b"\n", 0, match.start()) + 1, _PRIVATE_KEY.name)
    else:
        finding = secrets.scan(data, path, sniff=False)
    if finding is not None:
        raise SecretInBundle(f"refusing to export: {finding.path} line {finding.line + lines_before} looks "
                             f"like a {finding.rule} (use --allow-secret GLOB if it is not one); "
                             "no bundle was written")


# --- checking a bundle ------------------------------------------------------------------------

class BundleBlobs(BlobStore):
    """A read-only blob store over a parsed bundle's objects, so lineage code can read them."""

    def __init__(self, handle, parsed: ParsedBundle):
        self.handle, self.parsed = handle, parsed
        self.url = "bundle:"

    def get(self, key):
        key = bytes(key)
        framed = self.parsed.index.structured.get(key)
        if framed is not None:
            return framed
        where = self.parsed.index.chunks.get(key)
        if where is None:
            return None
        self.handle.seek(where[0])
        return self.handle.read(where[1])

    def has_many(self, keys):
        return {bytes(k) for k in keys if bytes(k) in self.parsed.index.kinds}

    def list(self):
        return (BlobInfo(key, 0, 0.0, kind) for key, kind in sorted(self.parsed.index.kinds.items()))

    def put_many(self, items):
        raise TypeError("a bundle is read-only")

    def delete_many(self, keys):
        raise TypeError("a bundle is read-only")


@dataclass
class CheckedBundle:
    """A bundle whose bytes, closure and manifest were verified; signatures judged."""

    parsed: ParsedBundle
    checkpoint: Checkpoint
    verdicts: list
    status: str
    reason: str
    envelopes: list

    @property
    def manifest(self) -> Manifest:
        return self.parsed.manifest

    def signed_at(self) -> str | None:
        valid = [v.envelope.statement.signed_at for v in self.verdicts if v.status == env.VALID]
        return max(valid) if valid else None

    def to_json(self) -> dict:
        m = self.manifest
        return {"checkpoint": m.checkpoint.hex(), "thread": m.thread, "bytes": self.parsed.size,
                "objects": m.object_count, "checkpoints": len(m.checkpoints), "files": len(m.files),
                "history": m.history.to_doc(), "signature": self.status, "reason": self.reason,
                "signatures": [v.to_json() for v in self.verdicts]}


class _BundleWalker(Walker):
    """closure.Walker over a parsed bundle: kinds and sizes come from pass 1's index, so a
    chunk's bytes are read only when a file or segment is re-hashed (deep)."""

    def __init__(self, view: ObjectSource, parsed: ParsedBundle):
        super().__init__(view, verify=False, follow_parents=True, deep=True)
        self.parsed = parsed

    def _header(self, digest):
        kind = self.parsed.index.kinds.get(digest.raw)
        if kind is None:
            return None
        if kind == framing.KIND_CHUNK:
            return kind, self.parsed.index.sizes[digest.raw]
        return kind, framing.read_header(self.parsed.index.structured[digest.raw])[2]


def check_closure(handle, parsed: ParsedBundle) -> Checkpoint:
    """Step 2: closure, manifest against objects, file ids, history digests.

    The closure is walked by the same closure.Walker as fsck and push/pull (deep), so
    every size, kind, file id, segment and position a bundle's objects state is checked
    against the objects they name, before anything is written.
    """
    m = parsed.manifest
    view = ObjectSource(BundleBlobs(handle, parsed))
    reached: set = set()
    checkpoints: list[Digest] = []
    try:
        for digest, kind, _ in _BundleWalker(view, parsed).checkpoint(m.checkpoint):
            reached.add(digest.raw)
            if kind == framing.KIND_CHECKPOINT:
                checkpoints.append(digest)
        head_cp = Checkpoint.decode(framing.unframe(parsed.index.structured[m.checkpoint.raw])[1])
    except MissingObject as exc:
        raise BundleCorrupt(f"bundle is incomplete: {exc}") from None
    except InvalidObject as exc:
        raise BundleCorrupt(f"bundle holds an invalid object: {exc}") from None
    except (UsageError, ValueError) as exc:
        raise BundleCorrupt(f"bundle rollout history is inconsistent: {exc}") from None
    except IntegrityError as exc:
        raise BundleCorrupt(f"bundle objects are inconsistent: {exc}") from None
    extra = len(parsed.index.kinds) - len(reached)
    if extra:
        raise BundleCorrupt(f"bundle carries {extra} objects that checkpoint {m.checkpoint.short()} "
                            "does not need")
    if sorted(c.raw for c in checkpoints) != sorted(c.raw for c in m.checkpoints):
        raise BundleCorrupt("bundle manifest's checkpoint list differs from the checkpoints it carries")
    if head_cp.history != m.history:
        raise BundleCorrupt("bundle manifest's history position differs from the checkpoint's")
    listed = [(f.path, f.size, f.mode, f.id) for f in m.files]
    try:
        actual = [(p, e.size, e.mode, e.id) for p, e in list_files(view, head_cp.tree) if e.type == "file"]
    except InvalidObject as exc:
        raise BundleCorrupt(f"bundle holds an invalid tree: {exc}") from None
    if listed != actual:
        raise BundleCorrupt("bundle manifest's file list differs from the checkpoint's tree")
    history = rollout.History(view)
    try:
        history.verify(head_cp.history)
    except IntegrityError as exc:
        raise BundleCorrupt(f"bundle rollout history does not check out: {exc}") from None
    except (UsageError, ValueError) as exc:
        raise BundleCorrupt(f"bundle rollout history is inconsistent: {exc}") from None
    return head_cp


def judge_signatures(txn: MetaTxn, parsed: ParsedBundle) -> tuple[list, list, str, str]:
    """(envelopes, verdicts, status, reason) of a bundle's signatures against the trust list."""
    m = parsed.manifest
    envelopes, verdicts = [], []
    for data in parsed.envelopes:
        try:
            item = env.Envelope.decode(data)
        except IntegrityError as exc:
            raise BundleCorrupt(f"bundle signature is malformed: {exc}") from None
        envelopes.append(item)
    trusted = trust.list_trusted(txn)
    for item in envelopes:
        verdicts.append(env.check(item, trusted, m.checkpoint, m.thread))
    status, reason = env.summarize(verdicts)
    return envelopes, verdicts, status, reason


def check_bundle(backends: Backends, handle, progress=None) -> CheckedBundle:
    """Steps 1-3: everything but rollback and the ref. Raises BundleCorrupt on damage."""
    parsed = parse(handle, progress)
    checkpoint = check_closure(handle, parsed)
    with backends.meta.reader() as txn:
        envelopes, verdicts, status, reason = judge_signatures(txn, parsed)
    return CheckedBundle(parsed, checkpoint, verdicts, status, reason, envelopes)


def require_signature(checked: CheckedBundle, allow_unsigned: bool) -> None:
    """Raise SignatureRejected unless a trusted signature verifies (or unsigned is allowed)."""
    if checked.status == env.VALID:
        return
    if checked.status == env.INVALID:
        raise SignatureRejected(env.INVALID, f"bundle signature is invalid: {checked.reason}")
    if allow_unsigned:
        return
    if checked.status == env.UNTRUSTED:
        raise SignatureRejected(env.UNTRUSTED, f"bundle signature is untrusted: {checked.reason} "
                                "(trust the signer with 'agentcas trust add', or pass --allow-unsigned)")
    raise SignatureRejected(env.ABSENT, "bundle is not signed (pass --allow-unsigned to import it anyway)")


class NoBundleFile(NotFound):
    """The bundle file named does not exist."""


def open_bundle(path: str):
    try:
        return open(path, "rb")
    except FileNotFoundError:
        raise NoBundleFile(f"bundle file {path} does not exist") from None
    except OSError as exc:
        raise UsageError(f"cannot read bundle {path}: {exc.strerror}") from None


def verify_bundle(backends: Backends, path: str, progress=None) -> dict:
    """Check a bundle completely without writing; raise unless a trusted signature verifies."""
    with open_bundle(path) as handle:
        checked = check_bundle(backends, handle, progress)
    require_signature(checked, allow_unsigned=False)
    return dict(checked.to_json(), bundle=os.path.abspath(path), verified=True)


# --- import -----------------------------------------------------------------------------------

def _imports_key(thread: str) -> bytes:
    return IMPORTS_PREFIX + thread.encode("utf-8")


def read_import(txn: MetaTxn, thread: str) -> dict | None:
    key = _imports_key(thread)
    value = txn.get("imports", key)
    return None if value is None else encoding.decode(unseal("imports", key, value))


def check_rollback(txn: MetaTxn, objects: ObjectSource, thread: str, checkpoint: Digest,
                   signed_at: str | None, allow_rollback: bool) -> None:
    """Refuse a bundle older (by signed time or ancestry) than the last import into `thread`."""
    last = read_import(txn, thread)
    if last is None or allow_rollback or last["checkpoint"] == checkpoint.hex():
        return
    older = signed_at is not None and last.get("signed_at") is not None and signed_at < last["signed_at"]
    if not older:
        older = is_ancestor(objects, checkpoint, Digest.parse(last["checkpoint"]))
    if older:
        raise RollbackRefused(
            f"bundle checkpoint {checkpoint.short()} is older than {last['checkpoint'][:12]} already imported "
            f"into thread {thread!r} (signed {last.get('signed_at') or 'unsigned'}); refusing a rollback "
            "(--allow-rollback to force)")


def _plan_ref(state: ThreadState | None, checked: CheckedBundle, history: rollout.History,
              thread: str) -> ThreadState | None:
    """The thread's new state (None: already there); ConflictError unless new or fast-forward."""
    m, cp = checked.manifest, checked.checkpoint
    if state is None:
        return ThreadState(m.checkpoint, cp.history, None)
    if state.checkpoint == m.checkpoint and state.history == cp.history:
        return None
    if state.checkpoint is not None and state.checkpoint not in m.checkpoints:
        raise ConflictError(f"thread {thread!r} is at {state.checkpoint.short()}, which is not an ancestor of "
                            f"the bundle's checkpoint {m.checkpoint.short()}: not a fast-forward; nothing "
                            "was imported (use --as NEW_THREAD)")
    def same(a: HistoryPosition, b: HistoryPosition) -> bool:
        return (a.seq, a.offset, a.digest) == (b.seq, b.offset, b.digest)

    if state.history.seq > cp.history.seq or not same(history.position(cp.history, state.history.seq),
                                                      state.history):
        raise ConflictError(f"thread {thread!r} has rollout records that the bundle's history does not "
                            "contain: not a fast-forward; nothing was imported (use --as NEW_THREAD)")
    return ThreadState(m.checkpoint, cp.history, state.forked_from)


def import_bundle(backends: Backends, path: str, as_thread: str | None = None,
                  allow_unsigned: bool = False, allow_rollback: bool = False, progress=None) -> dict:
    """Verify a bundle completely, then land its objects, its signatures and the thread."""
    if as_thread is not None:
        check_thread_name(as_thread)
    with open_bundle(path) as handle:
        checked = check_bundle(backends, handle, progress)
        require_signature(checked, allow_unsigned)
        m = checked.manifest
        thread = as_thread or m.thread
        signed_at = checked.signed_at()
        view_history = rollout.History(ObjectSource(BundleBlobs(handle, checked.parsed)))
        with backends.meta.reader() as txn:
            check_rollback(txn, backends.source, thread, m.checkpoint, signed_at, allow_rollback)
            before = threads.read_thread(txn, thread)
        planned = _plan_ref(before, checked, view_history, thread)
        keep = [v.envelope for v in checked.verdicts if v.status in (env.VALID, env.UNTRUSTED)]
        with Lease(backends.meta, f"import {thread}") as lease:
            testing_hooks.reached("import.before_write")
            written_objects, written_bytes = _write_pipelined(backends.source, iter_records(handle, checked.parsed),
                                                              lease)
            signatures = [(item, *env.envelope_object(item)) for item in keep]
            backends.source.put_many({digest.raw: framed for _, digest, framed in signatures})
            missing = backends.source.missing(list(checked.parsed.index.order)
                                             + [digest.raw for _, digest, _ in signatures])
            if missing:
                raise IntegrityError(f"object {sorted(missing)[0].hex()} vanished before the import landed "
                                     "(concurrent gc?); nothing was changed, retry")

            def land(txn: MetaTxn):
                lease.check(txn)
                check_rollback(txn, backends.source, thread, m.checkpoint, signed_at, allow_rollback)
                state = threads.read_thread(txn, thread)
                if state != before:
                    raise ConflictError(f"thread {thread!r} moved while the bundle was imported; "
                                        "nothing was changed, retry")
                if planned is not None and not threads.set_if_equals(
                        txn, thread, state, planned, "import", f"import {os.path.basename(path)}"):
                    raise ConflictError(f"thread {thread!r} moved while the bundle was imported; "
                                        "nothing was changed, retry")
                for item, digest, _ in signatures:
                    env.save_index_row(txn, item, digest)
                key = _imports_key(thread)
                doc = {"checkpoint": m.checkpoint.hex(), "signed_at": signed_at, "thread": m.thread,
                       "imported_at": env.utc_now(), "signature": checked.status}
                txn.put("imports", key, seal("imports", key, encoding.encode(doc)))
                lease.release(txn)

            testing_hooks.reached("import.before_land")
            backends.meta.write(land)
    return dict(checked.to_json(), bundle=os.path.abspath(path), imported_as=thread,
                moved=planned is not None, new_objects=written_objects, new_bytes=written_bytes)


def _write_pipelined(objects: ObjectSource, records, lease: Lease | None = None) -> tuple[int, int]:
    """Write verified records in batches; one batch lands while the next is read and re-verified.

    At most two batches (about 2 x BATCH_BYTES) are held at once. Objects already
    stored are skipped. Returns (objects written, bytes written).
    """
    from concurrent.futures import ThreadPoolExecutor

    from agentcas.cas.writer import BATCH_BYTES, BATCH_OBJECTS

    def land(batch: dict) -> tuple[int, int]:
        present = objects.blobs.has_many(batch.keys())
        return objects.put_many({raw: value for raw, value in batch.items() if raw not in present})

    now = int(time.time())
    totals = [0, 0]
    pending: dict = {}
    pending_bytes = 0
    with ThreadPoolExecutor(1) as pool:
        future = None

        def submit(batch):
            nonlocal future
            if lease is not None:
                lease.refresh()
            if future is not None:
                count, size = future.result()
                totals[0] += count
                totals[1] += size
            future = pool.submit(land, batch) if batch else None

        for digest, _, framed in records:
            pending[digest.raw] = restamp(framed, now)
            pending_bytes += len(framed)
            if pending_bytes >= BATCH_BYTES or len(pending) >= BATCH_OBJECTS:
                submit(pending)
                pending, pending_bytes = {}, 0
        submit(pending)
        submit({})
    return totals[0], totals[1]
