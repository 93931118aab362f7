"""The storage a `Store` runs on, chosen by URL: a blob store, a metadata store, a local env.

    DIR | lmdb://DIR                 embedded: one LMDB environment holds both stores
    memory://                        both stores in memory (tests, scratch)
    s3://BUCKET/PREFIX + --refs postgresql://USER@HOST:PORT/DB
                                     shared: objects in S3, metadata in PostgreSQL, and a
                                     bounded LMDB cache per machine ($AGENTCAS_CACHE_DIR)

`local` is this machine's table environment (its stat cache lives there), and for a
shared store `known(keys)` says which objects this machine knows to be stored without
asking a server: the local cache answers (a commit then re-checks what it relies on against the bucket before its
ref moves). Backends are imported only when their URL is used, so an embedded store
never loads boto3 or psycopg.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from agentcas.cas.blobstore.base import BlobStore
from agentcas.cas.metastore.base import MetadataStore
from agentcas.cas.source import ObjectSource
from agentcas.cas.store import MemoryObjectStore, ObjectStore, TableBlobStore, TableMetadataStore
from agentcas.errors import UsageError


@dataclass
class Stores:
    """The handles every layer is given: objects (verified reads), blobs, meta, local."""

    blobs: BlobStore
    meta: MetadataStore
    local: ObjectStore
    url: str
    path: str | None = None         # the directory of an embedded store
    embedded: ObjectStore | None = None

    def __post_init__(self):
        self.objects = ObjectSource(self.blobs)

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


def embedded_stores(env: ObjectStore, path: str | None) -> Stores:
    """Both stores over one table environment (LMDB or memory)."""
    return Stores(TableBlobStore(env), TableMetadataStore(env), env, env.url, path, env)


def memory_stores() -> Stores:
    return embedded_stores(MemoryObjectStore(), None)


def is_shared_url(url: str | None) -> bool:
    return bool(url) and url.startswith("s3://")


def shared_stores(store_url: str, refs_url: str | None, create: bool = False) -> Stores:
    """Objects in S3 (through a local cache), metadata in PostgreSQL."""
    if not refs_url:
        raise UsageError("a shared store needs its refs database too: --refs postgresql://... "
                         "(or $AGENTCAS_REFS)")
    if not refs_url.startswith(("postgresql://", "postgres://")):
        raise UsageError(f"--refs must be a postgresql:// URL, not {refs_url.split(':', 1)[0]}:")
    import hashlib

    from agentcas.cas.blobstore.cached import CachedBlobStore, default_cache_dir
    from agentcas.cas.blobstore.s3 import S3BlobStore
    from agentcas.cas.lmdb_store import open_lmdb
    from agentcas.cas.metastore.postgres import PostgresMetadataStore
    meta = PostgresMetadataStore(refs_url, create=create, check=False)  # checked by its first request
    remote = S3BlobStore(store_url, create=create)
    # This machine's table environment for this store: the cache (its objects table) and
    # the stat cache, per store (a cache directory may be shared by several stores).
    cache_dir = default_cache_dir(store_url)
    local = open_lmdb(os.path.join(cache_dir, "store-" + hashlib.sha256(store_url.encode()).hexdigest()[:12]),
                      create=True)
    blobs = CachedBlobStore(remote, local)
    return Stores(blobs, meta, local, store_url, None, None)
