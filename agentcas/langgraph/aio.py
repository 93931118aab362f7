"""The saver's async methods: each runs its sync twin in a worker thread.

The sync methods wait on storage: a shared store's S3 and PostgreSQL calls, and their
retries with backoff, can take seconds. Run inline, that wait would stop the event loop and
every other task on it; here it happens in a worker thread (`asyncio.to_thread`, which also
carries the caller's context variables) while the loop goes on. The saver's lock serializes
the work as it does for threads calling the sync methods. A listing is pulled one checkpoint
per hop, so `alist` stays lazy as `list` is.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
)


class AsyncSaverMethods(BaseCheckpointSaver[int]):
    """LangGraph's async checkpointer methods over the sync ones, off the event loop."""

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await asyncio.to_thread(self.get_tuple, config)

    async def alist(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
                    before: RunnableConfig | None = None, limit: int | None = None) -> AsyncIterator[CheckpointTuple]:
        listing = await asyncio.to_thread(self.list, config, filter=filter, before=before, limit=limit)
        while True:
            item = await asyncio.to_thread(next, listing, None)
            if item is None:  # a listing yields tuples, never None
                return
            yield item

    async def aput(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
                   new_versions: ChannelVersions) -> RunnableConfig:
        return await asyncio.to_thread(self.put, config, checkpoint, metadata, new_versions)

    async def aput_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str,
                          task_path: str = "") -> None:
        await asyncio.to_thread(self.put_writes, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        await asyncio.to_thread(self.delete_thread, thread_id)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await asyncio.to_thread(self.copy_thread, source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await asyncio.to_thread(self.prune, thread_ids, strategy=strategy)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await asyncio.to_thread(self.delete_for_runs, run_ids)

    async def __aenter__(self) -> Any:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.close)

    if TYPE_CHECKING:
        def close(self) -> None: ...  # the saver's (base.py)
