"""A per-machine LMDB cache in front of a shared blob store (S3): re-reads download nothing.

The cache keeps every object this machine read or wrote, in an LMDB environment at
`cache_dir` ($AGENTCAS_CACHE_DIR, default ~/.cache/agentcas/<hash of the store URL>),
bounded by `max_bytes` ($AGENTCAS_CACHE_BYTES, default 4 GiB): when the cached values
pass the bound, the least recently read are evicted (down to 90% of it). Reads stamp
an entry with the time, at most once a minute per entry, so reading stays read-only.

    objects: id -> framed value      lru: read time u64 BE || id -> ""
    atime:   id -> read time u64 BE  meta: b"bytes" -> total cached value bytes u64 BE

Writes go to the remote first, then into the cache, so the cache never holds an
object the remote refused. Object bytes are immutable, so a cached value is always the
right value for its id, even after gc on another machine deleted the remote copy; what
the cache cannot know is whether the remote still HAS an object. So `has_many` always
asks the remote; `cached_keys` answers from the cache alone, for callers that can
accept "this machine saw it once" (e.g. objects a live ref or lease protects from gc).
Deletes are passed on and evict the cached copies too. Callers verify every value
(ObjectSource); one that finds a cached value damaged calls `evict` and reads again.
The environment is written without fsync: losing or damaging it loses only a cache.
"""

from __future__ import annotations

import hashlib
import os
import struct
import threading
import time
from typing import Iterable, Iterator, Mapping, Sequence

import lmdb

from agentcas.cas.blobstore.base import BlobInfo, BlobStore

DEFAULT_MAX_BYTES = 4 << 30
TOUCH_SECONDS = 60
_U64 = struct.Struct(">Q")
_TOTAL = b"bytes"

# LMDB allows one environment per file per process, and an inherited one is unusable
# after fork: keyed by (path, pid), a forked child opens its own.
_ENVS: dict[tuple[str, int], lmdb.Environment] = {}
_ENVS_LOCK = threading.Lock()


def default_cache_dir(url: str) -> str:
    """$AGENTCAS_CACHE_DIR, else ~/.cache/agentcas/<first 16 hex of sha256(url)>."""
    configured = os.environ.get("AGENTCAS_CACHE_DIR")
    if configured:
        return os.path.abspath(os.path.expanduser(configured))
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "agentcas", hashlib.sha256(url.encode()).hexdigest()[:16])


def _open_env(path: str, map_size: int) -> lmdb.Environment:
    with _ENVS_LOCK:
        env = _ENVS.get((path, os.getpid()))
        if env is None:
            os.makedirs(path, exist_ok=True)
            env = lmdb.open(path, map_size=map_size, max_dbs=4, sync=False, metasync=False,
                            readahead=False, max_readers=256)
            env.reader_check()
            _ENVS[(path, os.getpid())] = env
        return env


class CachedBlobStore(BlobStore):
    """`remote` with a bounded local LMDB cache of what this machine read or wrote."""

    def __init__(self, remote: BlobStore, cache_dir: str | None = None, max_bytes: int | None = None):
        self.remote = remote
        self.url = remote.url
        self.cache_dir = os.path.abspath(cache_dir or default_cache_dir(remote.url))
        self.max_bytes = max_bytes if max_bytes is not None else int(
            os.environ.get("AGENTCAS_CACHE_BYTES", str(DEFAULT_MAX_BYTES)))
        self.hits = self.misses = 0
        self.clock = time.time  # read times (a test may set its own clock)
        self.env = _open_env(self.cache_dir, max(1 << 30, 2 * self.max_bytes + (64 << 20)))
        with self.env.begin(write=True) as txn:
            self._dbs = {name: self.env.open_db(name.encode(), txn=txn)
                         for name in ("objects", "atime", "lru", "meta")}

    # -- the cache ----------------------------------------------------------------------

    def _cached(self, keys: Sequence[bytes]) -> dict[bytes, bytes]:
        """{key: value} of the cached keys, stamping those not read for a minute."""
        found, stale = {}, []
        now = int(self.clock())
        with self.env.begin() as txn:
            for key in keys:
                got = txn.get(key, db=self._dbs["objects"])
                if got is not None:
                    found[key] = bytes(got)
                    stamp = txn.get(key, db=self._dbs["atime"])
                    if stamp is None or now - _U64.unpack(stamp)[0] >= TOUCH_SECONDS:
                        stale.append(key)
        if stale:
            self._write(lambda txn: [self._stamp(txn, key, now) for key in stale
                                     if txn.get(key, db=self._dbs["objects"]) is not None])
        return found

    def _stamp(self, txn, key: bytes, now: int) -> None:
        old = txn.get(key, db=self._dbs["atime"])
        if old is not None:
            txn.delete(bytes(old) + key, db=self._dbs["lru"])
        txn.put(key, _U64.pack(now), db=self._dbs["atime"])
        txn.put(_U64.pack(now) + key, b"", db=self._dbs["lru"])

    def _total(self, txn) -> int:
        raw = txn.get(_TOTAL, db=self._dbs["meta"])
        return 0 if raw is None else _U64.unpack(raw)[0]

    def _remove(self, txn, key: bytes) -> int:
        value = txn.pop(key, db=self._dbs["objects"])
        if value is None:
            return 0
        stamp = txn.pop(key, db=self._dbs["atime"])
        if stamp is not None:
            txn.delete(bytes(stamp) + key, db=self._dbs["lru"])
        return len(value)

    def _store(self, items: Mapping[bytes, bytes]) -> None:
        items = {bytes(k): v for k, v in items.items() if len(v) <= self.max_bytes}
        if not items:
            return
        now = int(self.clock())

        def put(txn):
            total = self._total(txn)
            for key, value in items.items():
                if txn.put(key, value, db=self._dbs["objects"], overwrite=False):
                    total += len(value)
                self._stamp(txn, key, now)
            total = self._evict_oldest(txn, total, self.max_bytes)
            txn.put(_TOTAL, _U64.pack(total), db=self._dbs["meta"])
        self._write(put)

    def _evict_oldest(self, txn, total: int, bound: int) -> int:
        """Drop the least recently read entries until `total` is at most 90% of `bound`."""
        if total <= bound:
            return total
        target = bound * 9 // 10
        cursor = txn.cursor(db=self._dbs["lru"])
        victims = []
        for lru_key, _ in cursor:
            if total <= target:
                break
            key = bytes(lru_key[_U64.size:])
            value = txn.get(key, db=self._dbs["objects"])
            total -= 0 if value is None else len(value)
            victims.append(key)
        for key in victims:
            self._remove(txn, key)
        return max(total, 0)

    def _write(self, fn) -> None:
        try:
            with self.env.begin(write=True) as txn:
                fn(txn)
        except lmdb.MapFullError:
            # Fragmentation filled the map before the byte bound: halve the cache, try once more.
            with self.env.begin(write=True) as txn:
                total = self._evict_oldest(txn, self._total(txn), self._total(txn) // 2 or 1)
                txn.put(_TOTAL, _U64.pack(total), db=self._dbs["meta"])
            with self.env.begin(write=True) as txn:
                fn(txn)

    def cached_keys(self, keys: Iterable[bytes]) -> set[bytes]:
        """The keys this machine's cache holds (no remote request; see the module doc)."""
        with self.env.begin() as txn:
            return {bytes(k) for k in keys if txn.get(bytes(k), db=self._dbs["objects"]) is not None}

    def evict(self, keys: Iterable[bytes]) -> None:
        """Forget cached copies (a damaged value: the next read fetches it again)."""
        keys = [bytes(k) for k in keys]

        def drop(txn):
            total = self._total(txn) - sum(self._remove(txn, key) for key in keys)
            txn.put(_TOTAL, _U64.pack(max(total, 0)), db=self._dbs["meta"])
        self._write(drop)

    def cached_bytes(self) -> int:
        with self.env.begin() as txn:
            return self._total(txn)

    # -- BlobStore -----------------------------------------------------------------------

    def get(self, key):
        key = bytes(key)
        found = self._cached([key])
        if found:
            self.hits += 1
            return found[key]
        self.misses += 1
        value = self.remote.get(key)
        if value is not None:
            self._store({key: value})
        return value

    def get_many(self, keys: Sequence[bytes]) -> dict[bytes, bytes]:
        keys = list(dict.fromkeys(bytes(k) for k in keys))
        found = self._cached(keys)
        self.hits += len(found)
        missing = [k for k in keys if k not in found]
        if missing:
            self.misses += len(missing)
            fetched = self.remote.get_many(missing)
            self._store(fetched)
            found.update(fetched)
        return found

    def has_many(self, keys: Iterable[bytes]) -> set[bytes]:
        return self.remote.has_many(keys)

    def put_many(self, items: Mapping[bytes, bytes]) -> tuple[int, int]:
        written = self.put_many_written(items)
        return len(written), sum(len(items[k]) for k in written)

    def put_many_written(self, items: Mapping[bytes, bytes]) -> set[bytes]:
        """put_many, answering which keys were written now."""
        items = {bytes(k): v for k, v in items.items()}
        if hasattr(self.remote, "put_many_written"):
            written = self.remote.put_many_written(items)
        else:
            written = {k for k, v in items.items() if self.remote.put_if_absent(k, v)}
        # Only what was written now: a key already there may hold other bytes (another
        # framing of the same object), and the cache must agree with the remote.
        self._store({k: items[k] for k in written})
        return written

    def delete_many(self, keys: Iterable[bytes]) -> int:
        keys = [bytes(k) for k in keys]
        deleted = self.remote.delete_many(keys)
        self.evict(keys)
        return deleted

    def list(self) -> Iterator[BlobInfo]:
        return self.remote.list()

    def header(self, key):
        from agentcas.cas import framing
        with self.env.begin() as txn:
            got = txn.get(bytes(key), db=self._dbs["objects"])
            if got is not None:
                return bytes(got[:framing.HEADER_SIZE])
        return self.remote.header(key)

    def count(self) -> int:
        return self.remote.count()

    def used_bytes(self) -> int:
        return self.remote.used_bytes()

    def close(self) -> None:
        self.remote.close()
