"""The per-machine LMDB cache in front of S3 (real SeaweedFS): what it saves and what it must not claim."""

from __future__ import annotations

import os

from agentcas.cas import framing
from agentcas.cas.blobstore.cached import CachedBlobStore, default_cache_dir
from agentcas.cas.blobstore.memory import MemoryBlobStore
from agentcas.cas.blobstore.s3 import S3BlobStore


def key(n: int) -> bytes:
    return n.to_bytes(4, "big") + bytes(28)


def value(data: bytes) -> bytes:
    return framing.frame(framing.KIND_CHUNK, data, written_at=1_780_000_000)


def test_rereading_a_cached_object_downloads_nothing(s3_url, tmp_path):
    items = {key(i): value(os.urandom(20_000)) for i in range(20)}
    writer = CachedBlobStore(S3BlobStore(s3_url), str(tmp_path / "machine-a"))
    writer.put_many(items)
    # The same machine later (a new process): everything it wrote is served locally.
    remote = S3BlobStore(s3_url)
    again = CachedBlobStore(remote, str(tmp_path / "machine-a"))
    assert again.get_many(list(items)) == items and again.get(key(3)) == items[key(3)]
    assert again.header(key(4)) == items[key(4)][:framing.HEADER_SIZE]
    assert remote.request_count() == 1  # the HeadBucket of opening the store, nothing else
    # Another machine downloads once, then serves its re-reads from its own cache.
    remote_b = S3BlobStore(s3_url)
    other = CachedBlobStore(remote_b, str(tmp_path / "machine-b"))
    assert other.get_many(list(items)) == items
    downloads = remote_b.requests["GetObject"]
    assert downloads == len(items)
    assert other.get_many(list(items)) == items and other.get(key(0)) == items[key(0)]
    assert remote_b.requests["GetObject"] == downloads


def test_presence_is_asked_of_the_remote_because_gc_elsewhere_deletes(s3_url, tmp_path):
    cached = CachedBlobStore(S3BlobStore(s3_url), str(tmp_path / "a"))
    cached.put_many({key(1): value(b"one"), key(2): value(b"two")})
    assert S3BlobStore(s3_url).delete_many([key(1)]) == 1  # gc on another machine
    assert cached.has_many([key(1), key(2)]) == {key(2)}
    assert cached.cached_keys([key(1), key(2), key(3)]) == {key(1), key(2)}
    assert cached.get(key(1)) == value(b"one")  # the bytes are still the right bytes


def test_deletes_and_evict_drop_the_cached_copy(tmp_path):
    remote = MemoryBlobStore()
    cached = CachedBlobStore(remote, str(tmp_path / "c"))
    cached.put_many({key(1): value(b"one"), key(2): value(b"two")})
    assert cached.delete_many([key(1)]) == 1
    assert cached.cached_keys([key(1)]) == set() and cached.get(key(1)) is None
    cached.evict([key(2)])
    assert cached.cached_keys([key(2)]) == set()
    assert cached.get(key(2)) == value(b"two") and cached.cached_keys([key(2)]) == {key(2)}
    assert cached.cached_bytes() == len(value(b"two"))


def test_only_what_the_remote_took_is_cached(tmp_path):
    remote = MemoryBlobStore()
    remote.put_if_absent(key(1), value(b"first"))
    cached = CachedBlobStore(remote, str(tmp_path / "c"))
    assert cached.put_many({key(1): value(b"other framing"), key(2): value(b"two")}) == (1, len(value(b"two")))
    assert cached.cached_bytes() == len(value(b"two"))     # key 1's bytes are not cached ...
    assert cached.cached_keys([key(1), key(2)]) == {key(1), key(2)}  # ... but it is known stored
    assert cached.get(key(1)) == value(b"first")


def test_what_the_remote_answered_it_holds_is_known_without_its_bytes(tmp_path):
    """A second machine commits files the first stored: the bucket's answers are remembered
    (no bytes), so its next commit's stat-cache hits count instead of hashing every file
    again; a delete forgets them."""
    import agentcas.cas.blobstore.cached as cached_module
    remote = MemoryBlobStore()
    for n in range(5):
        remote.put_if_absent(key(n), value(b"%d" % n))
    cached = CachedBlobStore(remote, str(tmp_path / "b"))
    assert cached.cached_keys([key(n) for n in range(6)]) == set()
    assert cached.has_many([key(n) for n in range(6)]) == {key(n) for n in range(5)}
    assert cached.cached_keys([key(n) for n in range(6)]) == {key(n) for n in range(5)}
    assert cached.cached_bytes() == 0
    assert cached.delete_many([key(0)]) == 1
    assert cached.cached_keys([key(0), key(1)]) == {key(1)}
    again = CachedBlobStore(remote, str(tmp_path / "b"))   # a later process on that machine
    assert again.cached_keys([key(1), key(2)]) == {key(1), key(2)}
    # Bounded: past SEEN_MAX markers they are all forgotten (each then costs one question).
    cached_module.SEEN_MAX, saved = 6, cached_module.SEEN_MAX
    try:
        for n in range(5, 12):
            remote.put_if_absent(key(n), value(b"%d" % n))
        again.has_many([key(n) for n in range(5, 12)])
        assert len(again.cached_keys([key(n) for n in range(12)])) <= 6
    finally:
        cached_module.SEEN_MAX = saved


def test_the_cache_is_bounded_and_evicts_the_least_recently_read(tmp_path):
    remote = MemoryBlobStore()
    cached = CachedBlobStore(remote, str(tmp_path / "c"), max_bytes=50_000)
    now = [1000.0]
    cached.clock = lambda: now[0]
    blob = {n: value(os.urandom(10_000 - framing.HEADER_SIZE)) for n in range(8)}
    for n in range(4):
        now[0] += 1
        cached.put_many({key(n): blob[n]})
    now[0] += 100
    assert cached.get(key(0)) == blob[0]  # read again: now the most recent
    now[0] += 1
    cached.put_many({key(4): blob[4]})   # 50,000 bytes: at the bound
    assert cached.cached_keys([key(n) for n in range(5)]) == {key(n) for n in range(5)}
    now[0] += 1
    cached.put_many({key(5): blob[5]})   # over: the least recently read go, down to 90%
    assert cached.cached_keys([key(n) for n in range(6)]) == {key(0), key(3), key(4), key(5)}
    assert cached.cached_bytes() == 40_000 <= 45_000
    assert remote.count() == 6  # the remote keeps everything
    huge = value(os.urandom(60_000))
    cached.put_many({key(7): huge})  # larger than the whole cache: not cached
    assert cached.cached_keys([key(7)]) == set() and cached.get(key(7)) == huge


def test_the_cache_directory_comes_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("AGENTCAS_CACHE_DIR", str(tmp_path / "mine"))
    assert default_cache_dir("s3://b/p") == str(tmp_path / "mine")
    monkeypatch.delenv("AGENTCAS_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    one, two = default_cache_dir("s3://b/p"), default_cache_dir("s3://b/q")
    assert one.startswith(str(tmp_path / "xdg" / "agentcas")) and one != two
    monkeypatch.setenv("AGENTCAS_CACHE_BYTES", "123456")
    assert CachedBlobStore(MemoryBlobStore(), str(tmp_path / "c")).max_bytes == 123456


def test_the_cache_may_live_in_a_given_table_environment(tmp_path):
    """How backends wire it: the machine's LMDB environment (stat cache beside it), or memory."""
    from agentcas.cas.lmdb_store import open_lmdb
    from agentcas.cas.store import MemoryEnvironment
    for local in (MemoryEnvironment(), open_lmdb(str(tmp_path / "env"), create=True)):
        cached = CachedBlobStore(MemoryBlobStore(), local)
        cached.put_many({key(1): value(b"one")})
        with local.reader() as txn:
            assert txn.get("objects", key(1)) == value(b"one")
        assert cached.cached_keys([key(1)]) == {key(1)} and cached.get(key(1)) == value(b"one")
