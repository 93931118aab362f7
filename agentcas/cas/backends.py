"""The storage a `Store` runs on, chosen by URL: a blob store, a metadata store, a local env.

    DIR | lmdb://DIR                 embedded: one LMDB environment holds both stores
    memory://                        both stores in memory (tests, scratch)
    s3://BUCKET/PREFIX + --refs postgresql://USER@HOST:PORT/DB
                                     shared: objects in packs in S3, indexed with the
                                     metadata in PostgreSQL (cas/blobstore/s3_packs.py),
                                     and a bounded LMDB cache per machine ($AGENTCAS_CACHE_DIR)

`local` is this machine's table environment (its stat cache lives there), and for a
shared store `known(keys)` says which objects this machine knows to be stored without
asking a server: the local cache answers (a commit then re-checks what it relies on against the bucket before its
ref moves). Backends are imported only when their URL is used, so an embedded store
never loads boto3 or psycopg.

A shared store's two halves are bound together, so a mistyped prefix or a second refs
database can never pair refs with objects they do not name (a ref to objects the bucket
lacks; two databases each collecting the other's objects): `init` records
`{"id", "objects": s3://BUCKET/PREFIX}` in the metadata (`meta/store`) and the same id in the
prefix's marker (`PREFIX/agentcas-store.json`, create-if-absent). `init` refuses a prefix
whose marker names another id, and a database bound to another prefix whose marker is not
here, before writing anything. Every open compares the database's id with the marker's:
one S3 GET the first time this machine opens the pair, then remembered in its cache
(`meta` row `store/verified`), so a warm open costs no extra request. A copy of a store
(objects and marker copied to another prefix, the database cloned) opens, since the ids
agree. Stores made before this have no row and are not checked; their next `init` binds
them.
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass

from agentcas.cas import encoding
from agentcas.cas.blobstore.base import BlobStore
from agentcas.cas.blobstore.s3_packs import PackedBlobStore
from agentcas.cas.metastore.base import MetadataStore, Read
from agentcas.cas.sealed import seal, unseal
from agentcas.cas.source import ObjectSource
from agentcas.cas.store import MemoryEnvironment, TableBlobStore, TableEnvironment, TableMetadataStore
from agentcas.errors import ConflictError, UsageError

STORE_KEY = b"store"  # meta row of a shared store: {"id", "objects"} (the module doc)
VERIFIED_KEY = b"store/verified"  # this machine's cache: the store id it found in the marker


@dataclass
class Backends:
    """The handles every layer is given: source (verified object reads), blobs, meta, local."""

    blobs: BlobStore
    meta: MetadataStore
    local: TableEnvironment
    url: str
    path: str | None = None         # the directory of an embedded store
    embedded: TableEnvironment | None = None
    packed: PackedBlobStore | None = None  # a shared store's packs on S3 and their index

    def __post_init__(self):
        self.source = ObjectSource(self.blobs)

    @property
    def known(self):
        """`known(keys)`: the keys this machine knows to be stored without asking a server
        (a shared store's local cache), or None for an embedded store (ask it: it is local)."""
        return getattr(self.blobs, "cached_keys", None)

    @property
    def shared(self) -> bool:
        return self.embedded is None

    def close(self) -> None:
        for part in (self.blobs, self.meta):
            part.close()
        if self.embedded is not None:
            self.embedded.close()


def embedded_backends(env: TableEnvironment, path: str | None) -> Backends:
    """Both stores over one table environment (LMDB or memory)."""
    return Backends(TableBlobStore(env), TableMetadataStore(env), env, env.url, path, env)


def memory_backends() -> Backends:
    return embedded_backends(MemoryEnvironment(), None)


SHARED_SCHEME = "s3://"
MEMORY_SCHEME = "memory://"
LMDB_SCHEME = "lmdb://"


@dataclass(frozen=True)
class StoreAddress:
    """Which backend a store location names: `parse_store_url`'s answer.

    `kind` is "memory", "lmdb" (a directory: `path`, absolute) or "s3" (a shared store
    at `url`, as given: `bucket` and `prefix`, the prefix without slashes at its ends).
    """

    kind: str
    url: str
    path: str | None = None
    bucket: str | None = None
    prefix: str = ""

    @property
    def shared(self) -> bool:
        return self.kind == "s3"

    @property
    def memory(self) -> bool:
        return self.kind == "memory"

    @property
    def canonical(self) -> str:
        """The location in one spelling: `s3://BUCKET/PREFIX` (no slashes at the prefix's
        ends), the absolute directory, or memory://."""
        if self.bucket is not None:
            return f"{SHARED_SCHEME}{self.bucket}/{self.prefix}" if self.prefix else f"{SHARED_SCHEME}{self.bucket}"
        return self.path or self.url


_BUCKET_CHARACTERS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-_")


def valid_bucket(bucket: str) -> bool:
    """Whether boto3 would take `bucket` as a bucket name."""
    return 0 < len(bucket) <= 255 and set(bucket) <= _BUCKET_CHARACTERS


def parse_store_url(location: str) -> StoreAddress:
    """The one parser from a store location to its backend (as tvix's `from_addr`):
    memory://, s3://BUCKET/PREFIX, lmdb://DIR, or a plain directory path.

    An s3:// bucket is checked as boto3 would check it (letters, digits, '.', '-', '_'; at
    most 255), so a malformed one is a usage error here instead of a client exception
    later; a URL with user information (`s3://KEY:SECRET@bucket`) is refused without
    repeating it."""
    location = str(location)
    if location.startswith(MEMORY_SCHEME):
        return StoreAddress("memory", MEMORY_SCHEME)
    if location.startswith(SHARED_SCHEME):
        bucket, _, prefix = location[len(SHARED_SCHEME):].partition("/")
        if not bucket:
            raise UsageError(f"an S3 store URL names a bucket: s3://BUCKET/PREFIX, not {location}")
        if "@" in bucket:
            raise UsageError("an S3 store URL holds no credentials: s3://BUCKET/PREFIX (credentials come from "
                             "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, the endpoint from AWS_ENDPOINT_URL)")
        if not valid_bucket(bucket):
            raise UsageError(f"not a valid S3 bucket name: {bucket[:64]!r} (s3://BUCKET/PREFIX; a bucket name "
                             "has letters, digits, '.', '-' and '_' only)")
        return StoreAddress("s3", location, None, bucket, prefix.strip("/"))
    if location.startswith(LMDB_SCHEME):
        location = location[len(LMDB_SCHEME):]
    path = os.path.abspath(location)
    return StoreAddress("lmdb", path, path)


def is_shared_url(url: str | None) -> bool:
    """Whether `url` names a shared store (objects in S3, refs in PostgreSQL)."""
    return bool(url) and str(url).startswith(SHARED_SCHEME)


def check_refs_url(refs_url: str | None) -> str:
    """A shared store's refs database URL: given, and postgresql://."""
    if not refs_url:
        raise UsageError("a shared store needs its refs database too: --refs postgresql://... "
                         "(or $AGENTCAS_REFS)")
    if not refs_url.startswith(("postgresql://", "postgres://")):
        raise UsageError(f"--refs must be a postgresql:// URL, not {refs_url.split(':', 1)[0]}:")
    return refs_url


def shared_backends(store_url: str, refs_url: str | None, create: bool = False) -> Backends:
    """Objects in S3 (through a local cache), metadata in PostgreSQL."""
    refs_url = check_refs_url(refs_url)
    import hashlib

    from agentcas.cas import settings
    settings.check_shared_store_settings()
    from agentcas.cas.blobstore.cached import CachedBlobStore, default_cache_dir
    from agentcas.cas.blobstore.s3 import S3BlobStore
    from agentcas.cas.lmdb_store import open_lmdb
    from agentcas.cas.metastore.postgres import PostgresMetadataStore
    meta = PostgresMetadataStore(refs_url, create=create, check=False)  # checked by its first request
    remote = S3BlobStore(store_url, create=create, bucket_with_marker=create)   # init: claim, then make it
    # This machine's table environment for this store: the cache (its objects table) and
    # the stat cache, per store (a cache directory may be shared by several stores).
    cache_dir = default_cache_dir(store_url)
    local = open_lmdb(os.path.join(cache_dir, "store-" + hashlib.sha256(store_url.encode()).hexdigest()[:12]),
                      create=True)
    packed = PackedBlobStore(remote, meta)
    blobs = CachedBlobStore(packed, local)
    return Backends(blobs, meta, local, store_url, None, None, packed)


# -- binding a shared store's refs database to its prefix ------------------------------------------

def _binding(value: bytes | None) -> dict | None:
    return None if value is None else encoding.decode(unseal("meta", STORE_KEY, value))


def _marker_id(data: bytes) -> str | None:
    try:
        doc = json.loads(data)
    except ValueError:
        return None
    return doc.get("store") if isinstance(doc, dict) else None


def check_binding(backends: Backends, value: bytes | None) -> None:
    """At open: the database (its `meta/store` row, `value`) and the prefix's marker must
    name the same store (asked of S3 once per machine, then remembered)."""
    bound = _binding(value)
    if bound is None:
        return
    with backends.local.reader() as txn:
        if txn.get("meta", VERIFIED_KEY) == bound["id"].encode():
            return
    marker = backends.blobs.read_marker()
    if marker is None or _marker_id(marker) != bound["id"]:
        from agentcas.cas.lmdb_store import StoreUnavailable
        what = "holds no agentcas store" if marker is None else "holds another agentcas store"
        raise StoreUnavailable(
            f"{backends.blobs.url} {what}, but {getattr(backends.meta, 'name', 'the refs database')} holds the "
            f"refs of the store made at {bound.get('objects')}: check --store and --refs; nothing was changed")
    backends.local.write(lambda txn: txn.put("meta", VERIFIED_KEY, bound["id"].encode()))


def claim_prefix(backends: Backends) -> bytes:
    """At init, before anything is written: the sealed `meta/store` row that binds the
    database to this prefix (the existing one, or a new id); ConflictError if the prefix or
    the database already belongs to another store."""
    url = backends.blobs.url
    _, (value,) = backends.meta.exchange(reads=[Read("meta", STORE_KEY)])
    bound = _binding(value)
    marker = backends.blobs.read_marker()
    name = getattr(backends.meta, "name", "the refs database")
    if bound is not None and marker is None and bound.get("objects") != url:
        raise ConflictError(f"{name} already holds the refs of the store at {bound.get('objects')}, "
                            f"not {url}; nothing was written")
    if marker is not None and (bound is None or _marker_id(marker) != bound.get("id")):
        raise ConflictError(f"{url} already holds the objects of another agentcas store (its refs are "
                            f"in another database than {name}); nothing was written")
    if value is not None:
        return value
    return seal("meta", STORE_KEY, encoding.encode({"id": secrets.token_hex(16), "objects": url}))


def mark_prefix(backends: Backends, value: bytes) -> None:
    """At init, after the database holds `value`: write the prefix's marker with its id
    (create-if-absent; a marker written meanwhile by another init must name the same id)."""
    bound = _binding(value)
    assert bound is not None  # the binding init just wrote
    data = json.dumps({"store": bound["id"], "format": "agentcas store marker 1"}).encode()
    if not backends.blobs.create_marker(data) and _marker_id(backends.blobs.read_marker() or b"") != bound["id"]:
        raise ConflictError(f"{backends.blobs.url} was claimed by another agentcas store while this one was "
                            "made; use another prefix")
