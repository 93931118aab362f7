"""Repack: after a sweep, rewrite the packs of an embedded store that are mostly dead.

A sweep deletes an object by removing its index location and decrementing its pack's live
row (cas/packs.py); a pack with nothing live goes at once, but one that is partly dead keeps
its dead bytes until it is rewritten. Plan, then execute, a batch at a time:

1. scan `packlive` from where the last batch stopped (one small row per pack) and pick packs
   whose dead share is at least REPACK_DEAD_SHARE, up to REPACK_BATCH_BYTES of live bytes
   or REPACK_BATCH_OBJECTS live records (ticking gc's PageReleaser per pack read);
2. in one write transaction, check each again, store its live records anew (the open pack,
   then new packs), move their index locations, and delete the old pack.

Memory is one batch whatever the store's size: at most 1,024 records, whose index rows are
the pages the transaction dirties (LMDB holds a write transaction's dirty pages in memory and
keeps that memory for later transactions; 8 MiB of small records dirtied most of a
million-object index, ~50 MiB). Safe beside writers, on
this machine or any other sharing the store: the repack keeps exactly what the index names
when its transaction runs, and a writer's create-if-absent reads the index inside its own
transaction (LMDB serialises the two), so no object is lost or duplicated whatever
interleaves. A kill or a failed write (ENOSPC) between batches leaves committed batches done
and the rest as they were; the next gc picks them up.
"""

from __future__ import annotations

from dataclasses import dataclass

from agentcas.cas import crashpoints, packs
from agentcas.cas.store import TableEnvironment
from agentcas.gc.pages import PageReleaser


@dataclass
class RepackResult:
    packs_rewritten: int = 0
    bytes_reclaimed: int = 0
    objects_moved: int = 0

    def to_json(self) -> dict:
        return {"packs_rewritten": self.packs_rewritten, "bytes_reclaimed": self.bytes_reclaimed,
                "objects_moved": self.objects_moved}


def repack_store(env: TableEnvironment, dead_share: float = packs.REPACK_DEAD_SHARE,
                 pages: PageReleaser | None = None) -> RepackResult:
    """Rewrite every pack of `env` whose dead share reaches `dead_share` (see the module doc);
    `pages` is ticked per pack read and looks after every batch."""
    result = RepackResult()
    start: bytes | None = b""
    tick = None if pages is None else pages.tick
    while start is not None:
        with env.reader() as txn:
            planned = packs.repack_candidates(txn, start, dead_share, tick=tick)
        if planned.numbers:
            def rewrite(txn, numbers=tuple(planned.numbers)):
                done = packs.repack(txn, numbers, env.leaf_bytes, tick)
                crashpoints.reached("gc.repack")  # a fault here fails the transaction before it commits
                return done
            rewritten, reclaimed, moved = env.write(rewrite)
            result.packs_rewritten += rewritten
            result.bytes_reclaimed += reclaimed
            result.objects_moved += moved
            if pages is not None:
                pages.tick(pages.every)  # a look now: the batch mapped what it read
        start = planned.next_start
    return result
