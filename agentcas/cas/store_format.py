"""The store's format record (`meta/format`, docs/FORMAT.md section 7) and its upgrade.

Written once when a store is made: `{"format": ..., "created_at": ...}`: STORE_FORMAT (4)
for an embedded store, SHARED_STORE_FORMAT (3) for a shared one (objects in packs on S3,
cas/blobstore/s3_packs.py). A reader refuses a store whose format is newer than it reads (StoreFormatError, exit 4);
a writable open of an older store marks it current first (`upgraded_from`, `upgraded_at`), so
that an older agentcas stops at the record instead of misreading the new writes. Format 2
added packed objects and compact reflog rows, which every reader here reads in both forms;
format 3 keeps an embedded store's objects in packs, so after marking, its objects move
there (cas/packs.upgrade_objects: resumable, each writable open finishes what a killed one
left; reads fall back to the rows not yet moved). Format 4 (embedded) adds compressed
packs: a format-3 store is only marked, its packs stay as they are. A shared store of format 2 keeps its
objects where they are (one S3 object each) and writes new ones into packs: its reads look
in both, for as long as its record says it was made before format 3.
"""

from __future__ import annotations

import datetime

from agentcas.cas import encoding, packs
from agentcas.cas.backends import STORE_KEY, Backends, check_binding
from agentcas.cas.leases import sweep_active
from agentcas.cas.lmdb_store import StoreUnavailable
from agentcas.cas.metastore.base import MetadataStore, MetaTxn, Read
from agentcas.cas.sealed import seal, unseal
from agentcas.errors import IntegrityError

FORMAT_KEY = b"format"
STORE_FORMAT = 4
SHARED_STORE_FORMAT = 3


class StoreFormatError(IntegrityError):
    """The store's format is newer than this agentcas reads."""


def utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def write_format(backends: Backends, binding: bytes | None = None) -> bool:
    """Write the store's format record (and gc's idle fence row; a shared store's binding
    row, cas/backends.py) unless present; True if this made the store."""
    doc = encoding.encode({"format": format_of(backends), "created_at": utc_now()})

    def create(txn: MetaTxn) -> bool:
        sweep_active(txn, 0.0, lock=True)  # writes the fence row leases lock (cas/leases.py)
        if binding is not None:
            txn.put_new("meta", STORE_KEY, binding)
        return txn.put_new("meta", FORMAT_KEY, seal("meta", FORMAT_KEY, doc))

    return backends.meta.write(create)


def format_of(backends: Backends) -> int:
    """The format this agentcas writes to these stores."""
    return SHARED_STORE_FORMAT if backends.shared else STORE_FORMAT


def check_format(backends: Backends, where: str, readonly: bool) -> None:
    """Refuse a store without a format record or with a newer one; upgrade an older one
    unless `readonly`. One request reads the record and a shared store's binding."""
    _, (value, binding) = backends.meta.exchange(reads=[Read("meta", FORMAT_KEY), Read("meta", STORE_KEY)])
    if backends.shared:
        check_binding(backends, binding)
    if value is None:
        raise StoreUnavailable(f"not an agentcas store (no format record): {where}")
    doc = encoding.decode(unseal("meta", FORMAT_KEY, value))
    if backends.packed is not None:
        backends.packed.legacy = holds_unpacked_objects(doc)
    target = format_of(backends)
    if doc.get("format", 0) > target:
        raise StoreFormatError(
            f"store format {doc['format']} is newer than this agentcas reads ({target}); "
            "upgrade agentcas")
    if readonly:
        return  # read as it is: every reader here reads every older form
    if doc.get("format", 0) < target:
        _upgrade_format(backends, doc, target)
    if backends.embedded is not None:
        packs.upgrade_objects(backends.embedded)  # nothing to do once upgraded (one count)


def holds_unpacked_objects(doc: dict) -> bool:
    """Whether a shared store may hold objects stored one S3 object each (made before format 3)."""
    return min(doc.get("format", 0), doc.get("upgraded_from", doc.get("format", 0))) < 3


def _upgrade_format(backends: Backends, doc: dict, target: int) -> None:
    """Mark an older store with the format this agentcas writes (its objects move next)."""
    upgraded = encoding.encode(dict(doc, format=target, upgraded_from=doc.get("format", 0),
                                    upgraded_at=utc_now()))

    def mark(txn: MetaTxn):
        current = encoding.decode(unseal("meta", FORMAT_KEY, txn.get("meta", FORMAT_KEY)))
        if current.get("format", 0) < target:
            txn.put("meta", FORMAT_KEY, seal("meta", FORMAT_KEY, upgraded))

    backends.meta.write(mark)


def init_embedded(path: str) -> Backends | None:
    """A new embedded store in directory `path` (made if absent, else it must be empty), its
    format record written; None if a store is there already. Whole or nothing: a store that
    could not be made leaves no files behind (nor the directory, unless it existed)."""
    import os

    from agentcas.cas.backends import embedded_backends
    from agentcas.cas.lmdb_store import open_lmdb
    from agentcas.cas.system_errors import from_os_error
    from agentcas.errors import ConflictError
    if os.path.exists(path) and not os.path.isdir(path):
        raise StoreUnavailable(f"store path is a file, not a directory: {path}")
    if os.path.isfile(os.path.join(path, "data.mdb")):
        return None
    if os.path.isdir(path) and os.listdir(path):
        raise ConflictError(f"directory exists and is not empty: {path}")
    existed = os.path.isdir(path)
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise from_os_error(exc, f"creating a store in {path}", "nothing was created") from None
    env = None
    try:
        env = open_lmdb(path, create=True)
        backends = embedded_backends(env, path)
        write_format(backends)
    except BaseException:
        if env is not None:
            env.close()
        for name in ("data.mdb", "lock.mdb"):
            try:
                os.unlink(os.path.join(path, name))
            except OSError:
                pass
        if not existed:
            try:
                os.rmdir(path)
            except OSError:
                pass
        raise
    return backends


TOKEN_KEY_PREFIX = b"token-key/"  # meta rows: a store's keys for the tokens it hands out


def token_key(meta: MetadataStore, purpose: str) -> bytes:
    """A random 32-byte key kept in the store's metadata for `purpose`, made on first use
    (the first writer's key wins); `Store.token_key`."""
    import secrets
    key = TOKEN_KEY_PREFIX + purpose.encode("utf-8")
    with meta.reader() as txn:
        value = txn.get("meta", key)
    if value is None:
        fresh = seal("meta", key, secrets.token_bytes(32))
        meta.write(lambda txn: txn.put_new("meta", key, fresh))
        with meta.reader() as txn:
            value = txn.get("meta", key)
    return unseal("meta", key, value)
