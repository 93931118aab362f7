"""The batched object writer (cas/writer.py): background batches overlap, errors surface,
and a commit cuts files at the chunk sizes its blob store asks for."""

from __future__ import annotations

import random
import threading

import pytest

from agentcas.cas import chunking, framing, writer
from agentcas.cas.blobstore.memory import MemoryBlobStore
from agentcas.cas.digest import Digest
from agentcas.cas.source import ObjectSource


def _objects(count: int, size: int = 1000):
    rng = random.Random(count)
    return [(Digest(rng.randbytes(32)), rng.randbytes(size)) for _ in range(count)]


class _Rendezvous(MemoryBlobStore):
    """Each put waits (up to 10 s) until another put has started: only overlapping batches pass."""

    def __init__(self):
        super().__init__()
        self.barrier = threading.Barrier(2, timeout=10)
        self.batches = 0

    def put_many_written(self, items):
        self.batches += 1
        if self.batches <= 2:
            self.barrier.wait()
        return super().put_many_written(items)


def test_two_background_batches_are_written_at_once():
    blobs = _Rendezvous()
    batch_writer = writer.BatchWriter(ObjectSource(blobs), batch_bytes=4000, known=lambda keys: set(),
                                      background=True)
    batch_writer.asking = False
    objects = _objects(12)
    for digest, framed in objects:
        batch_writer.add(digest, framed)
    batch_writer.flush()  # with one batch in flight, the first put waits alone and breaks the barrier
    assert blobs.count() == len(objects) and batch_writer.written_objects == len(objects)


class _FailsFirstSlowly(MemoryBlobStore):
    """The first put fails once the second has started; the second takes a while."""

    def __init__(self):
        super().__init__()
        self.calls = 0
        self.second_started = threading.Event()
        self.second_done = threading.Event()

    def put_many_written(self, items):
        self.calls += 1
        if self.calls == 1:
            self.second_started.wait(10)
            raise OSError("the first batch failed")
        self.second_started.set()
        threading.Event().wait(0.3)
        written = super().put_many_written(items)
        self.second_done.set()
        return written


def test_a_failed_background_batch_is_raised_after_the_others_end():
    blobs = _FailsFirstSlowly()
    batch_writer = writer.BatchWriter(ObjectSource(blobs), batch_bytes=4000, known=lambda keys: set(),
                                      background=True)
    batch_writer.asking = False
    with pytest.raises(OSError, match="first batch failed"):
        for digest, framed in _objects(12):
            batch_writer.add(digest, framed)
        batch_writer.flush()
    # Told the write failed, the caller finds no upload still running behind it.
    assert blobs.second_done.is_set()


def test_a_commit_cuts_files_at_its_blob_stores_chunk_sizes(tmp_path):
    from agentcas.cas.lmdb_store import open_lmdb
    from agentcas.workspace.snapshot import Snapshotter

    data = random.Random(11).randbytes(12 << 20)
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "big.bin").write_bytes(data)
    counts = {}
    for name, sizes in (("local", chunking.LOCAL), ("remote", chunking.REMOTE)):
        blobs = MemoryBlobStore()
        blobs.chunk_sizes = sizes
        local = open_lmdb(str(tmp_path / f"local-{name}"), create=True)
        try:
            Snapshotter(ObjectSource(blobs), local, str(tmp_path / "ws")).run()
        finally:
            local.close()
        counts[name] = len([info for info in blobs.list() if info.kind == framing.KIND_CHUNK])
    expected = {name: len(list(chunking.cut(data, *sizes)))
                for name, sizes in (("local", chunking.LOCAL), ("remote", chunking.REMOTE))}
    assert counts == expected
    assert counts["remote"] <= 24 < 24 * 2 <= counts["local"]  # 12 MiB: >= 512 KiB vs <= 512 KiB pieces
