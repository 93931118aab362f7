"""The LangGraph checkpointer on agentcas (extra `agentcas[langgraph]`; docs/LANGGRAPH.md).

Laid out as LangGraph's own savers are: base.py the state and reading every saver shares,
this module the sync saver `AgentcasSaver`, aio.py the async methods (each runs its sync
twin in a worker thread, so the event loop never waits on storage). Beside them: names.py
(which agentcas thread holds a LangGraph thread), records.py (the record format in the
rollout), index.py (the in-memory index of a thread's checkpoints), writes.py (put and
put_writes), prune.py (rewriting a thread).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
    get_checkpoint_metadata,
)

from agentcas.errors import ConflictError
from agentcas.langgraph.aio import AsyncSaverMethods
from agentcas.langgraph.base import checkpoint_config
from agentcas.langgraph.names import BRANCHES, ROOT, thread_name, thread_root
from agentcas.langgraph.prune import SaverRewrites
from agentcas.langgraph.records import CorruptCheckpoint
from agentcas.langgraph.writes import MAX_EARLY, SaverWrites, stops_the_graph
from agentcas.refs.threads import ForkOrigin, ThreadState

__all__ = ["AgentcasSaver", "AsyncAgentcasSaver", "CorruptCheckpoint", "thread_name"]


class AgentcasSaver(AsyncSaverMethods, SaverRewrites, SaverWrites):
    """A LangGraph checkpointer that keeps every thread as an agentcas thread (sync and async)."""

    # -- reading --------------------------------------------------------------------------------
    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint `config` names (or the thread's newest), or None if there is none."""
        conf = config["configurable"]
        thread_id, ns = conf["thread_id"], conf.get("checkpoint_ns", "")
        name = thread_name(thread_id, ns)
        with self._lock:
            line = self._index.refresh(name)
            checkpoint_id = get_checkpoint_id(config)
            if checkpoint_id:
                raw = line.by_id.get(checkpoint_id)
            else:
                head = line.head()
                raw = line.newest(head.checkpoint) if head is not None else None
            if raw is None:
                return None
            return self._tuple(line, line.nodes[raw], thread_id, ns)

    def list(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
             before: RunnableConfig | None = None, limit: int | None = None) -> Iterator[CheckpointTuple]:
        """Checkpoints newest first (by LangGraph id) of a thread, or of every thread."""
        if config is None:
            with self._lock:
                groups = self._all_threads()
        else:
            conf = config["configurable"]
            ns = conf.get("checkpoint_ns")
            with self._lock:
                lines = self._index.lines_of(conf["thread_id"])
            wanted = [n for n in lines if ns is None or n == thread_name(conf["thread_id"], ns)]
            with self._lock:
                named = [(conf["thread_id"], self._ns_of(n, lines[n]), n) for n in wanted]
            groups = [(thread_id, ns, n) for thread_id, ns, n in named if ns is not None]
        before_id = get_checkpoint_id(before) if before else None
        only_id = get_checkpoint_id(config) if config else None
        for thread_id, ns, name in groups:
            with self._lock:
                line = self._index.refresh(name)
                # A snapshot: the listing runs outside the lock while other calls may refresh.
                nodes = {lg_id: line.nodes[raw] for lg_id, raw in line.by_id.items()}
                firsts = {lg_id: line.first_version(node) for lg_id, node in nodes.items()}
                members = line.membership()
                cache: dict[tuple, Any] = {}
            for lg_id in sorted(nodes, reverse=True):
                if only_id and lg_id != only_id:
                    continue
                if before_id and lg_id >= before_id:
                    continue
                node = nodes[lg_id]
                through = members.get(node.digest.raw, [])
                # The line's records, read once per listing, hold the checkpoint's own record.
                held = self._line_records(*through[0], 0, node, cache) if through else None
                record = self._record(line, node, records=held, first=firsts[lg_id])
                if filter:
                    metadata = self._load(record[0]["metadata"], record[0]["metadata"]["v"], node)
                    if not all(metadata.get(k) == v for k, v in filter.items()):
                        continue
                if limit is not None:
                    if limit <= 0:
                        return
                    limit -= 1
                yield self._tuple(line, node, thread_id, ns, cache, record, through, firsts[lg_id])

    # -- writing --------------------------------------------------------------------------------
    def put(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
            new_versions: ChannelVersions) -> RunnableConfig:
        """Store `checkpoint` as an agentcas checkpoint on the thread; its config."""
        conf = config["configurable"]
        thread_id, ns = conf["thread_id"], conf.get("checkpoint_ns", "")
        name = thread_name(thread_id, ns)
        parent_id = conf.get("checkpoint_id")
        metadata = get_checkpoint_metadata(config, metadata)
        with self._lock:
            early = self._early.pop((name, checkpoint["id"]), [])
            # Writes that came before their checkpoint land in the put's own move (one ref move,
            # one segment), unless they stop the graph: those are sealed by put_writes.
            inline = early if not any(stops_the_graph(w) for w, _, _ in early) else []
            try:
                self._put_once(name, thread_id, ns, parent_id, checkpoint, metadata, new_versions, inline)
            except BaseException:
                if early:
                    self._early[(name, checkpoint["id"])] = early
                raise
        for writes, task_id, task_path in early if not inline else []:
            self.put_writes(checkpoint_config(thread_id, ns, checkpoint["id"]), writes, task_id, task_path)
        return checkpoint_config(thread_id, ns, checkpoint["id"])

    def put_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str,
                   task_path: str = "") -> None:
        """Store a task's writes against a checkpoint, as records on a line through it."""
        conf = config["configurable"]
        thread_id, ns = conf["thread_id"], conf.get("checkpoint_ns", "")
        checkpoint_id = conf["checkpoint_id"]
        name = thread_name(thread_id, ns)
        with self._lock:
            line = self._index.refresh(name)
            if checkpoint_id not in line.by_id:
                # LangGraph may send a checkpoint's writes before its put lands (they run on a
                # background executor): hold them until it does.
                self._early.setdefault((name, checkpoint_id), []).append((list(writes), task_id, task_path))
                while len(self._early) > MAX_EARLY:  # a put that never came: drop the oldest
                    del self._early[next(iter(self._early))]
                return
            self._put_writes_once(name, checkpoint_id, writes, task_id, task_path)

    # -- whole threads --------------------------------------------------------------------------
    def delete_thread(self, thread_id: str) -> None:
        """Delete every ref of the thread (all namespaces and branches); gc reclaims the rest."""
        root = thread_root(thread_id)

        def final(view: Any) -> None:
            for ref, state in view.threads(root).items():
                view.set_thread(ref, state, None, "delete", "langgraph delete_thread")

        with self._lock:
            with self.store.threads.group_writer(f"langgraph delete {root}") as writer:
                writer.land(final)
            self._index.forget_under(root)

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """An agentcas fork of every ref of the thread: constant size, no values copied."""
        source, target = thread_root(source_thread_id), thread_root(target_thread_id)

        def final(view: Any) -> None:
            if view.threads(target):
                raise ConflictError(f"LangGraph thread {target_thread_id!r} already exists; nothing was copied")
            for ref, state in view.threads(source).items():
                origin = ForkOrigin(ref, state.checkpoint, state.history.seq)
                view.set_thread(target + ref[len(source):], None, ThreadState(state.checkpoint, state.history, origin),
                                "fork", f"langgraph copy_thread from {ref}")

        with self._lock:
            with self.store.threads.group_writer(f"langgraph copy {source}") as writer:
                writer.land(final)

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """keep_latest: each namespace keeps only its newest checkpoint; delete: drop the threads.
        The dropped checkpoints leave every ref and reflog, so gc reclaims what no other
        thread (a copy, a fork) still shares."""
        if strategy not in ("keep_latest", "delete"):
            raise ValueError(f"unknown prune strategy {strategy!r} (keep_latest or delete)")
        for thread_id in thread_ids:
            if strategy == "delete":
                self.delete_thread(thread_id)
                continue
            with self._lock:
                for name, line in self._index.lines_of(thread_id).items():
                    head = line.head()
                    raw = line.newest(head.checkpoint) if head is not None else None
                    if raw is not None:
                        self._rewrite(name, self._kept_by_prune(line, line.nodes[raw]))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Drop the checkpoints whose metadata run_id is one of `run_ids`, in every thread;
        their children are re-committed onto the nearest kept ancestor."""
        wanted = set(run_ids)
        if not wanted:
            return
        with self._lock:
            names = [n for n in self.store.threads.under(ROOT) if BRANCHES not in n]
            for name in names:
                line = self._index.refresh(name)
                victims = set()
                for raw, node in line.nodes.items():
                    doc = self._record(line, node)[0]
                    metadata = self._load(doc["metadata"], doc["metadata"]["v"], node)
                    if metadata.get("run_id") in wanted:
                        victims.add(raw)
                if victims:
                    self._rewrite(name, set(line.nodes) - victims)


# The async name is the same saver, for code written against LangGraph's pairs
# (SqliteSaver / AsyncSqliteSaver): every saver has both the sync and the async methods.
AsyncAgentcasSaver = AgentcasSaver
