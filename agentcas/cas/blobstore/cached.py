"""A per-machine LMDB cache in front of a shared blob store (S3): re-reads download nothing.

The cache keeps every object this machine read or wrote in the `objects` table of this
machine's table environment (`local`: the LMDB environment at $AGENTCAS_CACHE_DIR,
default ~/.cache/agentcas/<hash of the store URL>, which also holds the stat cache),
bounded by `max_bytes` ($AGENTCAS_CACHE_BYTES, default 4 GiB): when the cached values
pass the bound, the least recently read are evicted (down to 90% of it), and one batch
caches at most 90% of it (its smallest values first), so the LMDB file on disk stays
within a few times the bound however large a commit or checkout is. Reads stamp
an entry with the time, at most once a minute per entry, so reading stays read-only.
Its bookkeeping lives in the environment's `meta` table under `cache/`:

    objects: id -> framed value                   meta: cache/bytes -> total value bytes u64 BE
    meta:    cache/atime/ id -> read time u64 BE  meta: cache/lru/ time u64 BE || id -> ""

Writes go to the remote first, then into the cache, and only what the remote took now
is cached, so the cache always agrees with the remote's bytes. Object bytes are
immutable, so a cached value is the right value for its id even after gc on another
machine deleted the remote copy; what the cache cannot know is whether the remote still
HAS an object. So `has_many` always asks the remote; `cached_keys` answers from the
cache alone, for callers that accept "this machine saw it once" (objects that a live
ref or lease protects from gc). What the remote answered it has, or already held when
asked to store it, is remembered too, without its bytes (`meta: cache/seen/ id`, at most
SEEN_MAX markers, forgotten all at once past that): a machine committing files another
machine stored first then finds them known, and its stat cache hits count, instead of
hashing every file again at each commit. Deletes are passed on and evict the cached
copies and markers too.
Callers verify every value (ObjectSource); one that finds a cached value damaged calls
`evict` and reads again. `get_many_stored` skips the cache (fsck must verify the
bucket's bytes, not this machine's copy) and caches what it fetched where absent.
"""

from __future__ import annotations

import hashlib
import os
import struct
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence

from agentcas.cas import settings
from agentcas.cas.blobstore.base import BlobInfo, BlobStore

DEFAULT_MAX_BYTES = 4 << 30
TOUCH_SECONDS = 60
_U64 = struct.Struct(">Q")
_TOTAL = b"cache/bytes"
_ATIME = b"cache/atime/"
_LRU = b"cache/lru/"
_SEEN = b"cache/seen/"          # id -> "": the remote had it (no bytes cached)
_SEEN_COUNT = b"cache/seen-count"
SEEN_MAX = 1_000_000            # ~60 MB of markers at most


def default_cache_dir(url: str) -> str:
    """$AGENTCAS_CACHE_DIR, else ~/.cache/agentcas/<first 16 hex of sha256(url)>."""
    configured = os.environ.get("AGENTCAS_CACHE_DIR")
    if configured:
        return os.path.abspath(os.path.expanduser(configured))
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "agentcas", hashlib.sha256(url.encode()).hexdigest()[:16])


class CachedBlobStore(BlobStore):
    """`remote` with a bounded local cache of what this machine read or wrote.

    `local` is this machine's table environment (a TableEnvironment: LMDB, or memory in
    tests), or a directory to open one in (default: default_cache_dir(remote.url)).
    """

    def __init__(self, remote: BlobStore, local=None, max_bytes: int | None = None):
        if local is None or isinstance(local, (str, os.PathLike)):
            from agentcas.cas.lmdb_store import open_lmdb
            local = open_lmdb(os.path.abspath(os.fspath(local or default_cache_dir(remote.url))), create=True)
        self.remote = remote
        self.local = local
        self.url = remote.url
        self.chunk_sizes = remote.chunk_sizes
        self.batched_reads = True  # through the cache: what a batch fetched is read from it after
        self.cache_dir = getattr(local, "path", None)
        self.max_bytes = max_bytes if max_bytes is not None else settings.whole_number(
            "AGENTCAS_CACHE_BYTES", DEFAULT_MAX_BYTES)
        self.hits = self.misses = 0
        self.clock = time.time  # read times (a test may set its own clock)

    # -- the cache ----------------------------------------------------------------------

    def _cached(self, keys: Sequence[bytes]) -> dict[bytes, bytes]:
        """{key: value} of the cached keys, stamping those not read for a minute."""
        found, stale = {}, []
        now = int(self.clock())
        with self.local.reader(buffers=True) as txn:
            for key in keys:
                got = txn.get("objects", key)
                if got is not None:
                    found[key] = bytes(got)
                    stamp = txn.get("meta", _ATIME + key)
                    if stamp is None or now - _U64.unpack(stamp)[0] >= TOUCH_SECONDS:
                        stale.append(key)
        if stale:
            def touch(txn):
                for key in stale:
                    if txn.get("objects", key) is not None:
                        self._stamp(txn, key, now)
            self.local.write(touch)
        return found

    @staticmethod
    def _stamp(txn, key: bytes, now: int) -> None:
        old = txn.get("meta", _ATIME + key)
        if old is not None:
            txn.delete("meta", _LRU + bytes(old) + key)
        txn.put("meta", _ATIME + key, _U64.pack(now))
        txn.put("meta", _LRU + _U64.pack(now) + key, b"")

    @staticmethod
    def _total(txn) -> int:
        raw = txn.get("meta", _TOTAL)
        return 0 if raw is None else _U64.unpack(raw)[0]

    def _remember_seen(self, keys: Iterable[bytes]) -> None:
        """Mark keys the remote holds whose bytes this machine has not cached."""
        # Reads in this class go through views (buffers=True): a plain read copies a whole
        # value out of the map even to see that it is there (a 1 GiB commit's last check
        # of what it relies on copied every chunk once more).
        with self.local.reader(buffers=True) as txn:
            new = [bytes(k) for k in keys if txn.get("objects", bytes(k)) is None
                   and txn.get("meta", _SEEN + bytes(k)) is None]
        if not new:
            return

        def mark(txn):
            raw = txn.get("meta", _SEEN_COUNT)
            count = 0 if raw is None else _U64.unpack(raw)[0]
            if count + len(new) > SEEN_MAX:  # forget them all: each costs one question later
                for key, _ in list(txn.scan("meta", prefix=_SEEN)):
                    txn.delete("meta", key)
                count = 0
            for key in new[:SEEN_MAX]:
                if txn.put_new("meta", _SEEN + key, b""):
                    count += 1
            txn.put("meta", _SEEN_COUNT, _U64.pack(count))
        self.local.write(mark)

    @staticmethod
    def _remove(txn, key: bytes) -> int:
        txn.delete("meta", _SEEN + key)  # the count may run high; it only bounds the markers
        value = txn.get("objects", key)
        if value is None:
            return 0
        size = len(value)
        txn.delete("objects", key)
        stamp = txn.get("meta", _ATIME + key)
        if stamp is not None:
            txn.delete("meta", _LRU + bytes(stamp) + key)
            txn.delete("meta", _ATIME + key)
        return size

    def _store(self, items: Mapping[bytes, bytes]) -> None:
        items = self._within_bound(items)
        if not items:
            return
        now = int(self.clock())

        def put(txn):
            total = self._total(txn)
            for key, value in items.items():
                if txn.put_new("objects", key, value):
                    total += len(value)
                self._stamp(txn, key, now)
            total = self._evict_oldest(txn, total, self.max_bytes)
            txn.put("meta", _TOTAL, _U64.pack(total))
        self.local.write(put)

    def _within_bound(self, items: Mapping[bytes, bytes]) -> dict[bytes, bytes]:
        """The part of one batch to cache: at most 90% of the bound, smallest values first
        (checkpoints, trees and chunk lists before file chunks). A transaction's new pages
        are the data file's high-water mark (LMDB reuses freed pages only after commit), so
        caching the whole of a 64 MiB commit batch under a smaller bound would grow the
        file on disk far past the bound even though eviction then trims the contents."""
        room = self.max_bytes * 9 // 10
        if sum(len(v) for v in items.values()) <= room:
            return {bytes(k): v for k, v in items.items()}
        kept, size = {}, 0
        for key, value in sorted(items.items(), key=lambda item: len(item[1])):
            if size + len(value) > room:
                break
            kept[bytes(key)] = value
            size += len(value)
        return kept

    def _evict_oldest(self, txn, total: int, bound: int) -> int:
        """Drop the least recently read entries until `total` is at most 90% of `bound`."""
        if total <= bound:
            return total
        target = bound * 9 // 10
        victims = []
        for lru_key, _ in txn.scan("meta", prefix=_LRU):
            if total <= target:
                break
            key = bytes(lru_key[len(_LRU) + _U64.size:])
            value = txn.get("objects", key)
            total -= 0 if value is None else len(value)
            victims.append(key)
        for key in victims:
            self._remove(txn, key)
        return max(total, 0)

    def cached_keys(self, keys: Iterable[bytes]) -> set[bytes]:
        """The keys this machine's cache holds or saw the remote hold (no remote request;
        see the module doc)."""
        with self.local.reader(buffers=True) as txn:
            return {bytes(k) for k in keys if txn.get("objects", bytes(k)) is not None
                    or txn.get("meta", _SEEN + bytes(k)) is not None}

    def evict(self, keys: Iterable[bytes]) -> None:
        """Forget cached copies (a damaged value: the next read fetches it again)."""
        keys = [bytes(k) for k in keys]

        def drop(txn):
            total = self._total(txn) - sum(self._remove(txn, key) for key in keys)
            txn.put("meta", _TOTAL, _U64.pack(max(total, 0)))
        self.local.write(drop)

    def cached_bytes(self) -> int:
        with self.local.reader() as txn:
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

    def fetch_many(self, keys: Sequence[bytes]) -> dict[bytes, bytes]:
        """The cached values, and the rest from the remote without caching them (a restore)."""
        keys = list(dict.fromkeys(bytes(k) for k in keys))
        with self.local.reader(buffers=True) as txn:
            found = {key: bytes(value) for key in keys if (value := txn.get("objects", key)) is not None}
        missing = [k for k in keys if k not in found]
        if missing:
            found.update(self.remote.fetch_many(missing))
        return found

    def has_many(self, keys: Iterable[bytes]) -> set[bytes]:
        found = self.remote.has_many(keys)
        self._remember_seen(found)
        return found

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
        self._remember_seen(k for k in items if k not in written)  # already there
        return written

    def stage_many(self, items: Mapping[bytes, bytes]) -> list[tuple]:
        """The remote's stage_many; the objects are cached at once (a move that never lands
        leaves them cached but not stored: a later commit that trusts the cache for one
        finds it missing when it checks what it relies on, and stores it again)."""
        if not items:
            return []
        writes = self.remote.stage_many(items)
        self._store({bytes(k): v for k, v in items.items()})
        return writes

    def delete_many(self, keys: Iterable[bytes]) -> int:
        keys = [bytes(k) for k in keys]
        deleted = self.remote.delete_many(keys)
        self.evict(keys)
        return deleted

    def list(self) -> Iterator[BlobInfo]:
        return self.remote.list()

    def header(self, key):
        from agentcas.cas import framing
        with self.local.reader(buffers=True) as txn:
            got = txn.get("objects", bytes(key))
            if got is not None:
                return bytes(got[:framing.HEADER_SIZE])
        return self.remote.header(key)

    def headers(self, keys: Sequence[bytes]) -> dict[bytes, bytes]:
        from agentcas.cas import framing
        found, missing = {}, []
        with self.local.reader(buffers=True) as txn:
            for key in dict.fromkeys(bytes(k) for k in keys):
                got = txn.get("objects", key)
                if got is None:
                    missing.append(key)
                else:
                    found[key] = bytes(got[:framing.HEADER_SIZE])
        if missing:
            found.update(self.remote.headers(missing))
        return found

    def count(self) -> int:
        return self.remote.count()

    def get_many_stored(self, keys: Sequence[bytes]) -> dict[bytes, bytes]:
        """The remote's values, never a cached copy (fsck: the machine that wrote an object
        holds a good copy that says nothing of the bucket's); they are cached where absent,
        as any read is, so fsck's later walk reads them from here."""
        keys = list(dict.fromkeys(bytes(k) for k in keys))
        fetched = self.remote.get_many_stored(keys) if keys else {}
        self._store(fetched)
        return fetched

    def used_bytes(self) -> int:
        return self.remote.used_bytes()

    # -- the store's marker (s3.py): not an object, never cached ---------------------------

    def read_marker(self) -> bytes | None:
        return self.remote.read_marker()

    def create_marker(self, data: bytes) -> bool:
        return self.remote.create_marker(data)

    def close(self) -> None:
        self.remote.close()
