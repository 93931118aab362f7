"""BaseAgentcasSaver: what the sync and the async saver share (docs/LANGGRAPH.md).

How it maps: LangGraph thread T, namespace NS -> an agentcas thread (names.py); each
LangGraph checkpoint is one agentcas checkpoint whose own records in the thread's rollout end
with its `cp` record (records.py) and whose tree holds `values/` (one file per channel value
stored whole over 4 KiB; an unchanged channel keeps its file id; else the empty tree). A
list channel whose new value extends its parent's (the message list) stores only the new
items, as records appended to the thread's rollout. Pending writes are records appended to a
line (a ref) through their checkpoint, so a checkpoint's writes are the records tagged with
its id at or after its position on the lines through it; a fork never sees them.

Forks: a put whose parent is not the thread's head saves the head as `<thread>/branches/<n>`
(forked_from = the parent, so `lineage` shows the split) and moves the thread onto the new
checkpoint. Every write is a group move (lineage/group_moves.py, via store.threads.group_writer):
objects stored first, then one metadata transaction that compare-and-swaps each ref it
moves; a put that finds the thread moved since its index read it is a lost race, which the
move engine re-plans, the put's content prepared again from the index (writes.py), so two
children of one parent become two branches, both kept.
Writing is writes.py, rewriting a thread (prune, delete_for_runs) prune.py.

Reading: per agentcas thread an in-memory index (index.py: LangGraph id -> agentcas
checkpoint) refreshed incrementally when a head moves. Values are LangGraph's own serde
(`dumps_typed`/`loads_typed`), so an EncryptedSerializer round-trips; every byte read is
verified by agentcas.

This module: the saver's state and life cycle, and reading a checkpoint back.
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver, CheckpointTuple, writes_sort_key
from langgraph.checkpoint.serde.base import SerializerProtocol

from agentcas.cas.objects import HistoryPosition, Tree, TreeEntry
from agentcas.errors import IntegrityError
from agentcas.langgraph.index import CheckpointIndex, Line, Node
from agentcas.langgraph.names import (
    BRANCHES,
    ROOT,
    decode_component,
    is_hashed,
    ns_component,
    thread_component,
    thread_root,
)
from agentcas.langgraph.records import (
    FORMAT,
    RECORD,
    VALUES,
    CorruptCheckpoint,
    LineRecords,
    decode_layout1,
    doc_of_checkpoint_record,
    parse_records,
    value_bytes,
)
from agentcas.refs.threads import ThreadState

if TYPE_CHECKING:
    from agentcas.repository import Store

EMPTY_TREE = Tree.of([]).digest()  # a checkpoint with no value stored as a file
_S = TypeVar("_S", bound="BaseAgentcasSaver")

# (record document, values files, values entries) of a checkpoint, as `_record` reads it.
RecordRead = tuple[dict, dict[str, bytes], dict[str, TreeEntry]]


def checkpoint_config(thread_id: str, ns: str, checkpoint_id: str) -> RunnableConfig:
    """The config naming one checkpoint, as LangGraph hands it back."""
    return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": checkpoint_id}}


class Opened:
    """What `from_path` returns: a context manager, sync or async, that opens the saver on
    entry and closes it on exit (off the event loop under `async with`)."""

    def __init__(self, make: Callable[[], _S]):
        self._make = make
        self._saver: Any = None

    def __enter__(self) -> Any:
        self._saver = self._make()
        return self._saver

    def __exit__(self, *exc: object) -> None:
        self._saver.close()

    async def __aenter__(self) -> Any:
        return await asyncio.to_thread(self.__enter__)

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.__exit__, *exc)


class BaseAgentcasSaver(BaseCheckpointSaver[int]):
    """The state, life cycle and reading of a LangGraph checkpointer over an agentcas Store."""

    def __init__(self, store: Store | str, *, serde: SerializerProtocol | None = None, author: str | None = None,
                 refs: str | None = None):
        """`store`: a Store, or a store path or s3:// URL (created if absent; a shared store
        needs `refs`, its postgresql:// URL)."""
        super().__init__(serde=serde)
        from agentcas.api.checkpoints import default_author
        from agentcas.repository import Store
        self._owned: Store | None = None
        if isinstance(store, str) or hasattr(store, "__fspath__"):
            store, _ = Store.init(str(store), refs=refs)
            self._owned = store
        self.store: Store = store
        self.author = author or default_author()
        self._lock = threading.RLock()
        self._index = CheckpointIndex(store)
        # digest raw -> (channels doc, {ch: list}, {file: TreeEntry}), of what this saver put last
        self._values: OrderedDict[bytes, tuple[dict, dict, dict]] = OrderedDict()
        self._docs: OrderedDict[bytes, dict] = OrderedDict()  # digest raw -> record document, likewise
        self._early: dict[tuple[str, str], list] = {}  # writes for checkpoints not stored yet
        # history position -> its last records' inline bytes
        self._tails: OrderedDict[HistoryPosition, list[tuple[int, bytes]]] = OrderedDict()

    # -- life cycle -----------------------------------------------------------------------------
    @classmethod
    def from_path(cls, path: str, **kwargs: Any) -> Opened:
        """A saver on the store at `path` (created if absent), closed on exit: `with
        AgentcasSaver.from_path(p) as saver:`, or `async with` like LangGraph's async savers."""
        return Opened(lambda: cls(str(path), **kwargs))

    def close(self) -> None:
        """Close the store if this saver opened it (from a path); a Store passed in stays open."""
        if self._owned is not None:
            self._owned.close()
            self._owned = None

    def __enter__(self: _S) -> _S:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- reading a checkpoint -------------------------------------------------------------------
    def _record(self, line: Line, node: Node, entries: bool = False, records: LineRecords | None = None,
                first: Node | None = None) -> RecordRead:
        """(record document, values files[, values entries]) of a checkpoint, verified. The
        document is the `cp` record ending the checkpoint's own records (from `records` when
        they hold it), or, in a checkpoint written before 2 Dec 2026, its tree's `langgraph` file."""
        doc = self._docs.get(node.digest.raw)
        if doc is not None and node.tree == EMPTY_TREE:
            return doc, {}, {}  # just put by this saver: no need to read its record back
        try:
            if node.tree == EMPTY_TREE:
                files, found = {}, {}
            else:
                files = self.store.checkpoints.tree_files(node.tree)
                found = {path[len(VALUES) + 1:]: entry for path, entry in self.store.checkpoints.tree_files(
                    node.tree, content=False).items() if path.startswith(VALUES + "/")} if entries else {}
            if RECORD in files:
                doc = decode_layout1(files[RECORD])
            else:
                doc = doc_of_checkpoint_record(self._checkpoint_record_of(line, node, records, first), files)
        except IntegrityError as exc:
            raise CorruptCheckpoint(f"LangGraph checkpoint {node.lg_id} (agentcas checkpoint "
                                    f"{node.digest.hex()}): {exc}") from None
        except (KeyError, ValueError) as exc:
            raise CorruptCheckpoint(f"LangGraph checkpoint {node.lg_id} (agentcas checkpoint {node.digest.hex()}) "
                                    f"has no valid {RECORD} record: {exc}") from None
        if doc.get("format") != FORMAT or doc.get("checkpoint_id") != node.lg_id:
            raise CorruptCheckpoint(f"agentcas checkpoint {node.digest.hex()}: {RECORD} does not describe "
                                    f"LangGraph checkpoint {node.lg_id}")
        values = {path[len(VALUES) + 1:]: data for path, data in files.items() if path.startswith(VALUES + "/")}
        return doc, values, found

    def _checkpoint_record_of(self, line: Line, node: Node, records: LineRecords | None,
                              first: Node | None = None) -> dict:
        """The `cp` record of `node`: the last record of its first version's history (a
        sealed version's history goes on with the writes it seals); `first` if known."""
        first = first or line.first_version(node)
        seq = first.history.seq - 1
        if seq < 0:
            raise ValueError("its history is empty")
        record = records.by_seq.get(seq) if records is not None else None
        if not (record and record.get("k") == "cp" and record.get("id") == node.lg_id):
            record = dict(self._records(first.history, seq, node, seq + 1)).get(seq)
        if not (record and record.get("k") == "cp" and record.get("id") == node.lg_id):
            raise ValueError(f"record {seq} of its history is not its checkpoint record")
        return record

    def _records(self, position: HistoryPosition, start: int, node: Node,
                 stop: int | None = None) -> list[tuple[int, dict]]:
        """(seq, record) of the rollout records start <= seq < stop (default: position.seq)
        that the saver wrote."""
        stop = position.seq if stop is None else min(stop, position.seq)
        if start >= stop:
            return []
        try:
            data = self.store.history.read_at(position, start, stop)
        except IntegrityError as exc:
            raise CorruptCheckpoint(f"LangGraph checkpoint {node.lg_id} (agentcas checkpoint "
                                    f"{node.digest.hex()}): history: {exc}") from None
        return parse_records(data, start)

    def _record_at(self, seq: object, records: LineRecords | None, position: HistoryPosition, node: Node) -> dict:
        """The saver record at `seq` of the history at `position` (from `records` if indexed)."""
        if type(seq) is not int or seq < 0:
            raise ValueError(f"{seq!r} is not a seq")
        target = records.by_seq.get(seq) if records is not None else None
        if target is None:  # before the indexed range: read just that record
            target = dict(self._records(position, seq, node, seq + 1)).get(seq)
        if target is None:
            raise ValueError(f"the history holds no saver record at seq {seq}")
        return target

    def _value_of(self, record: dict, records: LineRecords | None, position: HistoryPosition, node: Node) -> bytes:
        """A record's serde bytes: inline, or the slice of the earlier record it names
        ({"r": seq, "o": offset, "n": length}; the named record holds its bytes inline)."""
        try:
            if "r" not in record:
                return value_bytes(record)
            at, n = record["o"], record["n"]
            if not all(type(x) is int and x >= 0 for x in (at, n)):
                raise ValueError("a reference's offset and length are not counts")
            data = value_bytes(self._record_at(record["r"], records, position, node))[at:at + n]
            if len(data) != n:
                raise ValueError(f"record {record['r']} is shorter than the slice named")
            return data
        except (KeyError, TypeError, ValueError) as exc:
            raise CorruptCheckpoint(f"LangGraph checkpoint {node.lg_id} (agentcas checkpoint {node.digest.hex()}): "
                                    f"a value in the history is damaged or names no record: {exc}") from None

    def _load(self, value: dict, data: bytes, node: Node) -> Any:
        """A value's serde bytes read back with this saver's serde."""
        try:
            return self.serde.loads_typed((value["t"], data))
        except Exception as exc:  # noqa: BLE001 - the serializer's own errors vary by type
            # The bytes were verified against their ids before this: what fails is reading
            # them with this serde, most often another key or serializer than the writer's.
            kind = str(value.get("t", "?"))[:40]
            hint = " (an encrypted value: is this saver's key the writer's?)" if "+" in kind else ""
            raise CorruptCheckpoint(f"LangGraph checkpoint {node.lg_id} (agentcas checkpoint "
                                    f"{node.digest.hex()}): a value of type {kind!r} does not deserialize "
                                    f"with this saver's serde{hint}; its stored bytes verify, so they are "
                                    f"as written: {type(exc).__name__}: {exc}") from None

    def _line_records(self, ref: str, state: ThreadState, start: int, node: Node,
                      cache: dict[tuple, Any] | None) -> LineRecords:
        """The indexed records of line `ref` from `start` to its end (cached per listing)."""
        if cache is not None:
            key = (ref, state.history)
            got = cache.get(key)
            if got is None:
                got = cache[key] = LineRecords(self._records(state.history, 0, node), 0)
            return got
        return LineRecords(self._records(state.history, start, node), start)

    def _tuple(self, line: Line, node: Node, thread_id: str, ns: str, cache: dict[tuple, Any] | None = None,
               record: RecordRead | None = None, lines: list[tuple[str, ThreadState]] | None = None,
               first: Node | None = None) -> CheckpointTuple:
        """The CheckpointTuple of `node`; `cache` keeps each line's indexed records for a listing."""
        doc, files, _ = self._record(line, node) if record is None else record
        checkpoint = self._load(doc["checkpoint"], doc["checkpoint"]["v"], node)
        metadata = self._load(doc["metadata"], doc["metadata"]["v"], node)
        lines = lines if lines is not None else line.lines_through(node)
        if not lines:
            raise CorruptCheckpoint(f"LangGraph checkpoint {node.lg_id} is on no line of thread {line.name}")
        ref, state = lines[0]
        since = (first or line.first_version(node)).history.seq  # sealed writes sit between the versions
        channels = doc["channels"]
        cached = self._values.get(node.digest.raw)
        item_from = [c["items"]["from"] for c in channels.values() if "items" in c]
        start = min(item_from + [since]) if cached is None and item_from else since
        records = self._line_records(ref, state, start, node, cache)
        values: dict[str, Any] = {}
        for ch, how in channels.items():
            if "rec" in how:  # a small value stored whole, as a record before the checkpoint's position
                values[ch] = self._load(how, self._value_of({"r": how["rec"], "o": 0, "n": how.get("n")}, records,
                                                            node.history, node), node)
            elif "file" in how:
                if how["file"] not in files:
                    raise CorruptCheckpoint(f"LangGraph checkpoint {node.lg_id}: value file {how['file']} is missing")
                values[ch] = self._load(how, files[how["file"]], node)
            elif cached is not None and ch in cached[1]:
                values[ch] = list(cached[1][ch])
            else:
                items = how["items"]
                base = items.get("base")
                out = list(self._load(base, files[base["file"]], node)) if base else []
                out.extend(records.items(ch, items["from"], node.history.seq, lambda r: self._load(
                    r, self._value_of(r, records, state.history, node), node)))
                values[ch] = out
        writes: dict[tuple[str, int], tuple] = {}
        for other_ref, other_state in lines:
            found = records if other_ref == ref else self._line_records(other_ref, other_state, since, node, cache)
            for seq, r in found.writes.get(node.lg_id, ()):
                if seq >= since:
                    writes[(r["task"], r["idx"])] = (r.get("path", ""), r["task"], r["idx"], r["ch"], r, found,
                                                     other_state.history)
        pending_writes = [(task, ch, self._load(r, self._value_of(r, found, position, node), node))
                          for _, task, _, ch, r, found, position in sorted(writes.values(),
                                                                           key=lambda w: writes_sort_key(*w[:3]))]
        parent_id = line.lg_parent(node) or doc.get("parent_checkpoint_id")
        return CheckpointTuple(
            config=checkpoint_config(thread_id, ns, node.lg_id),
            checkpoint={**checkpoint, "channel_values": values},  # type: ignore[typeddict-item]
            metadata=metadata,
            parent_config=checkpoint_config(thread_id, ns, parent_id) if parent_id else None,
            pending_writes=pending_writes)

    # -- which LangGraph thread an agentcas thread holds ----------------------------------------
    def _all_threads(self) -> list[tuple[str, str, str]]:
        """(thread id, namespace, agentcas thread) of every LangGraph thread in the store."""
        out: list[tuple[str, str, str]] = []
        for name in sorted(self.store.threads.under(ROOT)):
            if BRANCHES in name:
                continue
            line = self._index.refresh(name)
            thread_id, ns = self._thread_id_of(name, line), self._ns_of(name, line)
            if thread_id is not None and ns is not None:
                out.append((thread_id, ns, name))
        return out

    # A ref name's components decode back to the LangGraph ids (percent-encoding), except an id
    # longer than 80 encoded bytes, hashed to `%h...` (a real id's `%` is always encoded, so that
    # form is only a hash): its id is read from a checkpoint record of the thread instead. The
    # namespace in any record is right; the thread id only in a record whose id hashes to the
    # name, since the records of a copy (copy_thread) still name the thread they were put on.
    def _thread_id_of(self, name: str, line: Line) -> str | None:
        """The LangGraph thread id of agentcas thread `name` (None: a hashed id no record names)."""
        component = thread_component(name)
        if not is_hashed(component):
            return decode_component(component)
        root = f"{ROOT}/{component}"
        for node in line.nodes.values():
            thread_id = self._record(line, node)[0]["thread_id"]
            if thread_root(thread_id) == root:
                return thread_id
        return None

    def _ns_of(self, name: str, line: Line) -> str | None:
        """The checkpoint namespace of agentcas thread `name` (None: hashed, and no checkpoint)."""
        component = ns_component(name)
        if not is_hashed(component):
            return decode_component(component)
        for node in line.nodes.values():
            return self._record(line, node)[0]["checkpoint_ns"]
        return None

    def get_next_version(self, current: int | None, channel: None = None) -> int:
        """current + 1 (from 1). Values are kept per checkpoint, not per (channel, version),
        so two branches reaching one version never collide; strings from other savers
        (`<counter>.<random>`) continue from their counter."""
        if current is None:
            return 1
        if isinstance(current, str):
            return int(current.split(".")[0]) + 1
        return int(current) + 1
