"""AgentcasSaver: LangGraph's BaseCheckpointSaver over an agentcas Store (docs/LANGGRAPH.md).

How it maps: LangGraph thread T, namespace NS -> agentcas thread `langgraph/<T>` (NS "") or
`langgraph/<T>/ns/<NS>`; each LangGraph checkpoint is one agentcas checkpoint whose reason is
`langgraph step <step> <source> <checkpoint id>`, whose own records in the thread's rollout
end with a record `{"k":"cp",...}` (ids, channels, the serde bytes of the checkpoint without
its values and of the metadata) and whose tree holds `values/` (one file per channel value
stored whole over 4 KiB; an unchanged channel keeps its file id; else the empty tree).
A list channel whose new value extends its parent's (the message list) stores only the new
items, as records `{"k":"item",...}` appended to the thread's rollout: its value is a base
(a stored list, or nothing) plus the item records of that channel between `from` and the
checkpoint's HistoryPosition. Pending writes are records `{"k":"write","cp":ID,...}` appended
to a line (a ref) through their checkpoint, so a checkpoint's writes are the records tagged
with its id at or after its position on the lines through it; a fork never sees them.

Forks: a put whose parent is not the thread's head saves the head as `<thread>/branches/<n>`
(forked_from = the parent, so `lineage` shows the split) and moves the thread onto the new
checkpoint. Every write is a group move (lineage/group_moves.py, via Store.lineage_writer):
objects stored first, then one metadata transaction that compare-and-swaps each ref it
moves; a writer that lost the race reloads its index and retries, so two children of one
parent become two branches, both kept.

Reading: per agentcas thread an in-memory index (LangGraph id -> agentcas checkpoint) is
built by walking parents from every head and refreshed incrementally when a head moves.
Values are LangGraph's own serde (`dumps_typed`/`loads_typed`), so an EncryptedSerializer
round-trips; every byte read is verified by agentcas.
"""

from __future__ import annotations

import base64
import bisect
import json
import re
import threading
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, unquote

import msgspec

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (WRITES_IDX_MAP, BaseCheckpointSaver, ChannelVersions, Checkpoint,
                                       CheckpointMetadata, CheckpointTuple, get_checkpoint_id,
                                       get_checkpoint_metadata, writes_sort_key)
from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.checkpoint.serde.types import ERROR, INTERRUPT

from agentcas.cas.digest import Digest
from agentcas.cas.objects import EMPTY_POSITION, HistoryPosition, Tree, TreeEntry
from agentcas.errors import ConflictError, IntegrityError
from agentcas.refs.names import encode_component
from agentcas.refs.threads import ForkOrigin, ThreadState

ROOT = "langgraph"
RECORD = "langgraph"
# A checkpoint's or its metadata's serde bytes over _RECORD_VALUE_BYTES: a file of its tree
# (content addressed, chunked, no record size limit), named by its checkpoint record.
SERDE_FILES = {"checkpoint": "langgraph-checkpoint", "metadata": "langgraph-metadata"}
VALUES = "values"
FORMAT = 1
_SAFE = re.compile(r"[A-Za-z0-9_-]")
_FILE_SAFE = re.compile(r"[a-z0-9_:-]")
_REASON = re.compile(r"^langgraph step (\S+) (\S+) (\S+)( \+ pending writes)?$")
SEALED = " + pending writes"
_decode_json = msgspec.json.Decoder().decode  # ~2x json.loads; its DecodeError is a ValueError
_EMPTY_TREE = Tree.of([]).digest()  # a checkpoint with no value stored as a file
_RECORD_KINDS = ("item", "write", "val", "cp")
_CACHED_CHECKPOINTS = 4
_MAX_RETRIES = 64
_MAX_EARLY = 256  # checkpoints whose writes wait for their put
_RECENT_RECORDS = 8  # a new record looks this many records back for bytes it repeats
_CACHED_TAILS = 16
_MIN_REFERENCE = 48  # shorter items are stored inline (a reference is ~30 bytes)
_RECORD_VALUE_BYTES = 4096  # a whole value up to this size is a record; a larger one a file (deduplicated)


class CorruptCheckpoint(IntegrityError):
    """A stored LangGraph checkpoint whose objects are damaged or inconsistent."""


def _encode(text: str, safe=_SAFE) -> str:
    """Percent-encode every character outside `safe` (so '.', '/', ':' never reach a ref name)."""
    return encode_component(text, safe)


def _component(text: str) -> str:
    """One ref-name component for a LangGraph id; long ids become `%h` + a hash (never a literal)."""
    encoded = _encode(text)
    if not encoded or len(encoded) > 80:
        import blake3
        return "%h" + blake3.blake3(text.encode("utf-8")).hexdigest()[:40]
    return encoded


def thread_root(thread_id: str) -> str:
    return f"{ROOT}/{_component(str(thread_id))}"


def thread_name(thread_id: str, checkpoint_ns: str = "") -> str:
    """The agentcas thread of a LangGraph (thread, namespace)."""
    root = thread_root(thread_id)
    return f"{root}/ns/{_component(checkpoint_ns)}" if checkpoint_ns else root


def _unb64(text: str) -> bytes:
    return base64.b64decode(text.encode("ascii"), validate=True)


def _record_value(data: bytes) -> dict:
    """A record's value field: the serde bytes as a latin-1 string ("x": one character per
    byte, JSON-escaped only where it must be; serde bytes are mostly text, so this stays
    near their size and compresses like them, where base64 costs 4/3 and compresses badly)."""
    return {"x": data.decode("latin-1")}


def _value_bytes(record: dict) -> bytes:
    """A record's serde bytes: "x" (latin-1 text) or "v" (base64, records written before)."""
    if "x" in record:
        text = record["x"]
        if not isinstance(text, str):
            raise ValueError("a record's value is not a string")
        return text.encode("latin-1")  # a character above U+00FF raises ValueError
    return _unb64(record["v"])


def _jsonl(record: dict) -> bytes:
    return json.dumps(record, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n"


def _decode_record(data: bytes) -> dict:
    """A tree's `langgraph` file (layout 1, written before 2 Dec 2026): one JSON line (ids,
    channels, serde types and lengths), then the serde bytes of the checkpoint (without its
    values) and of the metadata, raw."""
    line, _, rest = data.partition(b"\n")
    doc = json.loads(line)
    n = doc["checkpoint"]["n"]
    if n + doc["metadata"]["n"] != len(rest):
        raise ValueError("the record's lengths do not add up")
    doc["checkpoint"]["v"], doc["metadata"]["v"] = rest[:n], rest[n:]
    return doc


def _checkpoint_record(doc: dict, filed: set = frozenset()) -> bytes:
    """The rollout record `{"k":"cp",...}` that ends a checkpoint's own records (layout 2):
    its ids, its channels, and the serde bytes of the checkpoint (without its values) and of
    the metadata as latin-1 text ("c", "m"), like a value record's "x"; a part in `filed` is
    instead the tree file the record names ("cf", "mf": SERDE_FILES)."""
    record = {"k": "cp", "id": doc["checkpoint_id"], "parent": doc["parent_checkpoint_id"],
              "thread": doc["thread_id"], "ns": doc["checkpoint_ns"], "chans": doc["channels"]}
    for part, key in (("checkpoint", "c"), ("metadata", "m")):
        record[key + "t"] = doc[part]["t"]
        if part in filed:
            record[key + "f"] = SERDE_FILES[part]
        else:
            record[key] = doc[part]["v"].decode("latin-1")
    return _jsonl(record)


def _doc_of_checkpoint_record(record: dict, files: dict[str, bytes]) -> dict:
    """A `cp` record (and its tree's `files`) as the document `_decode_record` gives (one
    shape for both layouts)."""
    def serde(key):
        kind, text, file = record.get(key + "t"), record.get(key), record.get(key + "f")
        if file is not None:
            if file not in SERDE_FILES.values() or file not in files:
                raise ValueError(f"the checkpoint record names a file its tree does not hold: {str(file)[:80]!r}")
            data = files[file]
        elif isinstance(text, str):
            data = text.encode("latin-1")  # a character above U+00FF raises ValueError
        else:
            raise ValueError("a checkpoint record's serde fields are not text")
        if not isinstance(kind, str):
            raise ValueError("a checkpoint record's serde type is not text")
        return {"t": kind, "v": data}
    if not isinstance(record.get("chans"), dict):
        raise ValueError("a checkpoint record's channels are not a map")
    return {"format": FORMAT, "checkpoint_id": record.get("id"), "parent_checkpoint_id": record.get("parent"),
            "thread_id": record.get("thread"), "checkpoint_ns": record.get("ns"), "channels": record["chans"],
            "checkpoint": serde("c"), "metadata": serde("m")}


def _value_fields(data: bytes, earlier) -> dict:
    """A record's value: the serde bytes inline, or, when an earlier record of the same history
    (`earlier()`: [(seq, its inline bytes)]) holds exactly these bytes, where: `"r"` its seq,
    `"o"` the offset, `"n"` the length (a message is its input's value, then a write, then an item)."""
    if len(data) >= _MIN_REFERENCE:
        for seq, value in earlier():
            at = value.find(data)
            if at >= 0:
                return {"r": seq, "o": at, "n": len(data)}
    return _record_value(data)


def _extends(value: list, previous: list) -> bool:
    """Whether `value` starts with `previous`, element by element (`==`, which for the
    unchanged messages LangGraph hands back is identity). One list comparison, in C; if an
    element's `==` is no truth value (a numpy array's is elementwise, and bool() of it
    raises), they are compared one by one and such an element counts as changed, so the
    list is stored whole instead of the put failing."""
    if len(value) < len(previous):
        return False
    try:
        return value[:len(previous)] == previous
    except Exception:  # noqa: BLE001 - whatever an element's __eq__ or __bool__ raises
        pass
    for new, old in zip(value, previous):
        if new is old:
            continue
        try:
            if not new == old:
                return False
        except Exception:  # noqa: BLE001
            return False
    return True


def _config(thread_id: str, ns: str, checkpoint_id: str) -> RunnableConfig:
    return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": checkpoint_id}}


@dataclass(slots=True)
class _Node:
    """One LangGraph checkpoint as the index knows it."""

    digest: Digest
    lg_id: str
    parents: tuple
    history: HistoryPosition
    tree: Digest
    created_at: str
    sealed: bool = False  # a version made by put_writes sealing writes into it (reason + SEALED)


@dataclass
class _Line:
    """The index of one agentcas thread: its refs (thread + branches) and checkpoints."""

    name: str
    refs: dict = field(default_factory=dict)      # ref name -> ThreadState
    nodes: dict = field(default_factory=dict)     # digest raw -> _Node (LangGraph checkpoints)
    parents: dict = field(default_factory=dict)   # digest raw -> parent digests (all walked)
    by_id: dict = field(default_factory=dict)     # LangGraph id -> digest raw

    def head(self) -> ThreadState | None:
        return self.refs.get(self.name)

    def first_version(self, node: _Node) -> _Node:
        """The oldest agentcas checkpoint of `node`'s LangGraph checkpoint (sealed writes make
        newer versions: same tree, the writes in their history)."""
        while node.sealed and node.parents and node.parents[0].raw in self.nodes \
                and self.nodes[node.parents[0].raw].lg_id == node.lg_id:
            node = self.nodes[node.parents[0].raw]
        return node

    def lg_parent(self, node: _Node) -> str | None:
        """The LangGraph id of `node`'s parent checkpoint, if it is in this thread."""
        first = self.first_version(node)
        if first.parents and first.parents[0].raw in self.nodes:
            return self.nodes[first.parents[0].raw].lg_id
        return None

    def membership(self) -> dict[bytes, list[tuple[str, ThreadState]]]:
        """For every checkpoint, the refs whose first-parent chain holds it (one walk per ref)."""
        out: dict[bytes, list] = {}
        for ref in sorted(self.refs, key=lambda r: (r != self.name, r)):
            state = self.refs[ref]
            digest = state.checkpoint
            while digest is not None:
                out.setdefault(digest.raw, []).append((ref, state))
                parents = self.parents.get(digest.raw, ())
                digest = parents[0] if parents else None
        return out

    def lines_through(self, node: _Node) -> list[tuple[str, ThreadState]]:
        """Refs whose first-parent chain passes through `node` (the thread itself first)."""
        out = []
        for ref in sorted(self.refs, key=lambda r: (r != self.name, r)):
            state = self.refs[ref]
            digest = state.checkpoint
            while digest is not None:
                if digest.raw == node.digest.raw:
                    out.append((ref, state))
                    break
                known = self.nodes.get(digest.raw)
                if known is not None and known.history.seq < node.history.seq:
                    break  # histories only grow along parents: this line left `node` behind
                parents = self.parents.get(digest.raw, ())
                digest = parents[0] if parents else None
        return out


_UNDECODED = object()  # an item of _Records.decoded not decoded yet (None is a value)


class _Records:
    """One line's saver records from `start`, indexed: items by channel, writes by checkpoint."""

    def __init__(self, records: list[tuple[int, dict]], start: int):
        self.start = start
        self.item_seqs: dict[str, list[int]] = {}
        self.item_records: dict[str, list[dict]] = {}
        self.decoded: dict[str, list] = {}
        self.done: dict[str, tuple[int, int]] = {}  # per channel: items lo <= i < hi all decoded
        self.writes: dict[str, list[tuple[int, dict]]] = {}
        self.by_seq: dict[int, dict] = dict(records)  # what an item's reference ("r") names
        for seq, record in records:
            if record["k"] == "item":
                self.item_seqs.setdefault(record.get("ch"), []).append(seq)
                self.item_records.setdefault(record.get("ch"), []).append(record)
            elif record["k"] == "write":
                self.writes.setdefault(record.get("cp"), []).append((seq, record))
            # "val" (a channel value) and "cp" (a checkpoint) are read by seq

    def items(self, channel: str, start: int, stop: int, load) -> list:
        """The decoded items of `channel` with start <= seq < stop (each decoded once).

        A listing asks for nearly the same range once per checkpoint (newest first, each a
        little shorter), so the range known to be decoded is kept per channel and a request
        inside it is one list slice, not a loop over the items: O(n) per checkpoint in C
        instead of in Python.
        """
        seqs = self.item_seqs.get(channel, [])
        lo, hi = bisect.bisect_left(seqs, start), bisect.bisect_left(seqs, stop)
        decoded = self.decoded.setdefault(channel, [_UNDECODED] * len(seqs))
        done_lo, done_hi = self.done.get(channel, (0, 0))
        if not done_lo <= lo <= hi <= done_hi:
            records = self.item_records[channel]
            for i in range(lo, hi):
                if decoded[i] is _UNDECODED:
                    decoded[i] = load(records[i])
            if hi > lo:
                touching = done_lo < done_hi and lo <= done_hi and hi >= done_lo
                self.done[channel] = (min(lo, done_lo), max(hi, done_hi)) if touching else (lo, hi)
        return decoded[lo:hi]


class _Retry(Exception):
    """The thread moved between reading and landing: reload and try again."""


class _Opened:
    """What `from_path` returns: a context manager, sync or async, that opens the saver on
    entry and closes it on exit."""

    def __init__(self, make):
        self._make = make
        self._saver = None

    def __enter__(self) -> "AgentcasSaver":
        self._saver = self._make()
        return self._saver

    def __exit__(self, *exc) -> None:
        self._saver.close()

    async def __aenter__(self) -> "AgentcasSaver":
        return self.__enter__()

    async def __aexit__(self, *exc) -> None:
        self.__exit__(*exc)


class AgentcasSaver(BaseCheckpointSaver[int]):
    """A LangGraph checkpointer that keeps every thread as an agentcas thread (sync and async)."""

    def __init__(self, store, *, serde: SerializerProtocol | None = None, author: str | None = None,
                 refs: str | None = None):
        """`store`: a Store, or a store path or s3:// URL (created if absent; a shared store
        needs `refs`, its postgresql:// URL)."""
        super().__init__(serde=serde)
        from agentcas.api.checkpoints import default_author
        from agentcas.repository import Store
        self._owned = None
        if isinstance(store, str) or hasattr(store, "__fspath__"):
            store, _ = Store.init(str(store), refs=refs)
            self._owned = store
        self.store = store
        self.author = author or default_author()
        self._lock = threading.RLock()
        self._lines: dict[str, _Line] = {}
        self._values: OrderedDict = OrderedDict()  # digest raw -> (channels doc, {ch: list}, {file: TreeEntry})
        self._docs: OrderedDict = OrderedDict()  # digest raw -> record document, of what this saver put last
        self._early: dict[tuple[str, str], list] = {}  # writes for checkpoints not stored yet
        self._tails: OrderedDict = OrderedDict()  # history position -> its last records' inline bytes

    # -- life cycle -----------------------------------------------------------------------------
    @classmethod
    def from_path(cls, path: str, **kwargs) -> "_Opened":
        """A saver on the store at `path` (created if absent), closed on exit: `with
        AgentcasSaver.from_path(p) as saver:`, or `async with` like LangGraph's async savers."""
        return _Opened(lambda: cls(str(path), **kwargs))

    def close(self) -> None:
        if self._owned is not None:
            self._owned.close()
            self._owned = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        self.close()

    # -- the index ------------------------------------------------------------------------------
    def _refresh(self, name: str, states: dict | None = None) -> _Line:
        """The index of agentcas thread `name`, brought up to date with its refs."""
        if states is None:
            states = self.store.threads.under(name)
        refs = {ref: state for ref, state in states.items()
                if ref == name or (ref.startswith(name + "/branches/") and "/" not in ref[len(name) + 10:])}
        line = self._lines.get(name)
        if line is None:
            line = self._lines[name] = _Line(name)
        if refs == line.refs:
            return line
        old_heads = {s.checkpoint.raw for s in line.refs.values() if s.checkpoint is not None}
        heads = [s.checkpoint for s in refs.values() if s.checkpoint is not None]
        added, boundary = [], set()
        try:
            walked = self.store.checkpoints.reachable(heads, line.parents.keys())
        except IntegrityError as exc:
            raise CorruptCheckpoint(f"LangGraph checkpoints of agentcas thread {name}: {exc}") from None
        for digest, cp in walked:
            line.parents[digest.raw] = cp.parents
            boundary.update(p.raw for p in cp.parents)
            match = _REASON.match(cp.reason)
            if match:
                node = _Node(digest, unquote(match.group(3)), cp.parents, cp.history, cp.tree, cp.created_at,
                             bool(match.group(4)))
                line.nodes[digest.raw] = node
                added.append(node)
        line.refs = dict(refs)
        if old_heads <= {d.raw for d in heads} | boundary:
            # Heads only moved forward (the usual case): index just what was added, O(new).
            for node in reversed(added):  # oldest first, so a sealed version replaces its original
                self._index(line, node)
        else:
            self._mark(line)  # a head left its line (a rewrite, a deleted branch): re-index
            line.by_id = {}
            for node in sorted(line.nodes.values(), key=lambda n: (n.history.seq, n.created_at)):
                self._index(line, node)
        return line

    @staticmethod
    def _index(line: _Line, node: _Node) -> None:
        """Point `node`'s LangGraph id at it unless a newer version of that checkpoint holds it."""
        other = line.by_id.get(node.lg_id)
        if other is None or other == node.digest.raw:
            line.by_id[node.lg_id] = node.digest.raw
            return
        held = line.nodes.get(other)
        # A sealed version is a child of the version before it: the descendant wins.
        if held is None or (node.parents and node.parents[0].raw == other) or \
                (held.history.seq, held.created_at) < (node.history.seq, node.created_at):
            line.by_id[node.lg_id] = node.digest.raw

    @staticmethod
    def _mark(line: _Line) -> None:
        reached, stack = set(), [s.checkpoint.raw for s in line.refs.values() if s.checkpoint is not None]
        while stack:
            raw = stack.pop()
            if raw in reached:
                continue
            reached.add(raw)
            stack.extend(p.raw for p in line.parents.get(raw, ()))
        line.nodes = {raw: n for raw, n in line.nodes.items() if raw in reached}
        line.parents = {raw: p for raw, p in line.parents.items() if raw in reached}

    def _lines_of(self, thread_id: str) -> dict[str, _Line]:
        """Every agentcas thread (root and namespaces) of a LangGraph thread, refreshed."""
        states = self.store.threads.under(thread_root(thread_id))
        names = [n for n in states if "/branches/" not in n[len(thread_root(thread_id)):]]
        return {n: self._refresh(n, {k: v for k, v in states.items() if k == n or k.startswith(n + "/branches/")})
                for n in names}

    # -- reading a checkpoint -------------------------------------------------------------------
    def _record(self, line: _Line, node: _Node, entries: bool = False, records: "_Records | None" = None,
                first: _Node | None = None) -> tuple[dict, dict[str, bytes], dict[str, TreeEntry]]:
        """(record document, values files[, values entries]) of a checkpoint, verified. The
        document is the `cp` record ending the checkpoint's own records (from `records` when
        they hold it), or, in a checkpoint written before 2 Dec 2026, its tree's `langgraph` file."""
        doc = self._docs.get(node.digest.raw)
        if doc is not None and node.tree == _EMPTY_TREE:
            return doc, {}, {}  # just put by this saver: no need to read its record back
        try:
            if node.tree == _EMPTY_TREE:
                files, found = {}, {}
            else:
                files = self.store.checkpoints.tree_files(node.tree)
                found = {path[len(VALUES) + 1:]: entry for path, entry in self.store.checkpoints.tree_files(
                    node.tree, content=False).items() if path.startswith(VALUES + "/")} if entries else {}
            if RECORD in files:
                doc = _decode_record(files[RECORD])
            else:
                doc = _doc_of_checkpoint_record(self._checkpoint_record_of(line, node, records, first), files)
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

    def _checkpoint_record_of(self, line: _Line, node: _Node, records: "_Records | None",
                              first: _Node | None = None) -> dict:
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

    def _records(self, position: HistoryPosition, start: int, node: _Node,
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
        out = []
        for seq, line in enumerate(data.splitlines(), start):
            try:
                record = _decode_json(line)  # strict JSON, as the saver writes it
            except ValueError:
                continue
            if isinstance(record, dict) and record.get("k") in _RECORD_KINDS:
                out.append((seq, record))
        return out

    def _record_at(self, seq, records: "_Records | None", position: HistoryPosition, node: _Node) -> dict:
        """The saver record at `seq` of the history at `position` (from `records` if indexed)."""
        if type(seq) is not int or seq < 0:
            raise ValueError(f"{seq!r} is not a seq")
        target = records.by_seq.get(seq) if records is not None else None
        if target is None:  # before the indexed range: read just that record
            target = dict(self._records(position, seq, node, seq + 1)).get(seq)
        if target is None:
            raise ValueError(f"the history holds no saver record at seq {seq}")
        return target

    def _value_of(self, record: dict, records: "_Records | None", position: HistoryPosition, node: _Node) -> bytes:
        """A record's serde bytes: inline, or the slice of the earlier record it names
        ({"r": seq, "o": offset, "n": length}; the named record holds its bytes inline)."""
        try:
            if "r" not in record:
                return _value_bytes(record)
            at, n = record["o"], record["n"]
            if not all(type(x) is int and x >= 0 for x in (at, n)):
                raise ValueError("a reference's offset and length are not counts")
            data = _value_bytes(self._record_at(record["r"], records, position, node))[at:at + n]
            if len(data) != n:
                raise ValueError(f"record {record['r']} is shorter than the slice named")
            return data
        except (KeyError, TypeError, ValueError) as exc:
            raise CorruptCheckpoint(f"LangGraph checkpoint {node.lg_id} (agentcas checkpoint {node.digest.hex()}): "
                                    f"a value in the history is damaged or names no record: {exc}") from None

    def _load(self, value: dict, data: bytes, node: _Node):
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

    def _line_records(self, ref: str, state: ThreadState, start: int, node: _Node, cache: dict | None) -> "_Records":
        """The indexed records of line `ref` from `start` to its end (cached per listing)."""
        if cache is not None:
            key = (ref, state.history)
            got = cache.get(key)
            if got is None:
                got = cache[key] = _Records(self._records(state.history, 0, node), 0)
            return got
        return _Records(self._records(state.history, start, node), start)

    def _tuple(self, line: _Line, node: _Node, thread_id: str, ns: str, cache: dict | None = None,
               record: tuple | None = None, lines: list | None = None, first: _Node | None = None) -> CheckpointTuple:
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
            config=_config(thread_id, ns, node.lg_id),
            checkpoint={**checkpoint, "channel_values": values},
            metadata=metadata,
            parent_config=_config(thread_id, ns, parent_id) if parent_id else None,
            pending_writes=pending_writes)

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint `config` names (or the thread's newest), or None if there is none."""
        conf = config["configurable"]
        thread_id, ns = conf["thread_id"], conf.get("checkpoint_ns", "")
        name = thread_name(thread_id, ns)
        with self._lock:
            line = self._refresh(name)
            checkpoint_id = get_checkpoint_id(config)
            if checkpoint_id:
                raw = line.by_id.get(checkpoint_id)
            else:
                head = line.head()
                raw = self._newest(line, head.checkpoint) if head is not None else None
            if raw is None:
                return None
            return self._tuple(line, line.nodes[raw], thread_id, ns)

    @staticmethod
    def _newest(line: _Line, digest: Digest | None) -> bytes | None:
        """The newest LangGraph checkpoint at or below `digest` (skipping foreign commits)."""
        while digest is not None:
            if digest.raw in line.nodes:
                return digest.raw
            parents = line.parents.get(digest.raw, ())
            digest = parents[0] if parents else None
        return None

    def list(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
             before: RunnableConfig | None = None, limit: int | None = None) -> Iterator[CheckpointTuple]:
        """Checkpoints newest first (by LangGraph id) of a thread, or of every thread."""
        if config is None:
            groups = self._all_threads()
        else:
            conf = config["configurable"]
            ns = conf.get("checkpoint_ns")
            with self._lock:
                lines = self._lines_of(conf["thread_id"])
            wanted = [n for n in lines if ns is None or n == thread_name(conf["thread_id"], ns)]
            with self._lock:
                groups = [(conf["thread_id"], self._ns_of(n, lines[n]), n) for n in wanted]
            groups = [group for group in groups if group[1] is not None]
        before_id = get_checkpoint_id(before) if before else None
        only_id = get_checkpoint_id(config) if config else None
        for thread_id, ns, name in groups:
            with self._lock:
                line = self._refresh(name)
                # A snapshot: the listing runs outside the lock while other calls may refresh.
                nodes = {lg_id: line.nodes[raw] for lg_id, raw in line.by_id.items()}
                firsts = {lg_id: line.first_version(node) for lg_id, node in nodes.items()}
                members = line.membership()
                cache: dict = {}
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

    def _all_threads(self) -> list[tuple[str, str, str]]:
        out = []
        for name in sorted(self.store.threads.under(ROOT)):
            if "/branches/" in name:
                continue
            line = self._refresh(name)
            thread_id, ns = self._thread_id_of(name, line), self._ns_of(name, line)
            if thread_id is not None and ns is not None:
                out.append((thread_id, ns, name))
        return out

    # A ref name's components decode back to the LangGraph ids (percent-encoding), except an id
    # longer than 80 encoded bytes, hashed to `%h...` (a real id's `%` is always encoded, so that
    # form is only a hash): its id is read from a checkpoint record of the thread instead. The
    # namespace in any record is right; the thread id only in a record whose id hashes to the
    # name, since the records of a copy (copy_thread) still name the thread they were put on.
    def _thread_id_of(self, name: str, line: _Line) -> str | None:
        """The LangGraph thread id of agentcas thread `name` (None: a hashed id no record names)."""
        component = name[len(ROOT) + 1:].split("/", 1)[0]
        if not component.startswith("%h"):
            return unquote(component)
        root = f"{ROOT}/{component}"
        for node in line.nodes.values():
            thread_id = self._record(line, node)[0]["thread_id"]
            if thread_root(thread_id) == root:
                return thread_id
        return None

    def _ns_of(self, name: str, line: _Line) -> str | None:
        """The checkpoint namespace of agentcas thread `name` (None: hashed, and no checkpoint)."""
        _, _, component = name[len(ROOT) + 1:].partition("/ns/")
        if not component.startswith("%h"):
            return unquote(component)
        for node in line.nodes.values():
            return self._record(line, node)[0]["checkpoint_ns"]
        return None

    # -- writing --------------------------------------------------------------------------------
    def _land(self, what: str, build):
        """Run `build()` (one group move) again until its plan holds (no _Retry)."""
        for _ in range(_MAX_RETRIES):
            try:
                return build()
            except _Retry:
                continue
        raise ConflictError(f"{what}: the thread kept moving under {_MAX_RETRIES} attempts; nothing was written")

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
            inline = early if not any(c in (ERROR, INTERRUPT) for w, _, _ in early for c, _ in w) else []
            try:
                self._land(f"put {checkpoint['id']}", lambda: self._put_once(
                    name, thread_id, ns, parent_id, checkpoint, metadata, new_versions, inline))
            except BaseException:
                if early:
                    self._early[(name, checkpoint["id"])] = early
                raise
        for writes, task_id, task_path in early if not inline else []:
            self.put_writes(_config(thread_id, ns, checkpoint["id"]), writes, task_id, task_path)
        return _config(thread_id, ns, checkpoint["id"])

    def _parent_values(self, line: _Line, parent: _Node | None):
        """(channels doc, {channel: list}, {file: entry}) of the parent, from cache or store."""
        if parent is None:
            return {}, {}, {}
        cached = self._values.get(parent.digest.raw)
        if cached is not None:
            return cached
        doc, files, entries = self._record(line, parent, entries=True)
        lists = {}
        full = None
        for ch, how in doc["channels"].items():
            if "items" in how:
                if full is None:
                    full = self._tuple(line, parent, "", "", record=(doc, files, entries))
                lists[ch] = full.checkpoint["channel_values"].get(ch, [])
        return doc["channels"], lists, entries

    def _put_once(self, name, thread_id, ns, parent_id, checkpoint, metadata, new_versions, early=()):
        line = self._refresh(name)
        expected = line.head()
        parent = line.nodes.get(line.by_id.get(parent_id)) if parent_id else None
        parent_channels, parent_lists, parent_entries = self._parent_values(line, parent)
        # The new history continues the line that holds the parent (the thread, or a branch it
        # folds back), so the parent's pending writes on that line stay on a line.
        holder = None
        if parent is not None:
            holder = next((ref for ref in sorted(line.refs, key=lambda r: (r != name, r))
                           if line.refs[ref].checkpoint == parent.digest), None)
        held = line.refs.get(holder) if holder is not None else None
        base = held.history if held is not None else parent.history if parent is not None else EMPTY_POSITION
        values = checkpoint["channel_values"]
        recent: list = []
        own: list[tuple[int, bytes]] = []  # this put's value records

        def earlier():  # the history read only when a value may repeat one
            if not recent:
                recent.append(self._recent_values(base, parent) if parent is not None else [])
            return own + recent[0]
        channels: dict[str, dict] = {}
        files: dict[str, Any] = {}
        lists: dict[str, list] = {}
        records: list[bytes] = []
        for ch in checkpoint["channel_versions"]:
            before = parent_channels.get(ch)
            if ch not in new_versions and before is not None:
                channels[ch] = before  # unchanged: the parent's record, file or items, stored once
                if "rec" in before:
                    pass
                elif "file" in before:
                    files[f"{VALUES}/{before['file']}"] = parent_entries[before["file"]]
                else:
                    base_file = before["items"].get("base")
                    if base_file:
                        files[f"{VALUES}/{base_file['file']}"] = parent_entries[base_file["file"]]
                    if ch in parent_lists:
                        lists[ch] = parent_lists[ch]
                continue
            if ch not in values:
                continue  # an empty channel
            value = values[ch]
            previous = parent_lists.get(ch)
            if previous is None and before is None and isinstance(value, list):
                previous = []  # a new list channel extends the empty list: its items go to the rollout
            if isinstance(value, list) and previous is not None and _extends(value, previous):
                if before is not None and "items" in before:
                    channels[ch] = before
                    base_file = before["items"].get("base")
                else:  # the parent's whole stored list (or nothing) is the base these items extend
                    base_file = before
                    channels[ch] = {"items": {"from": base.seq + len(records), "base": base_file}}
                if base_file:
                    files[f"{VALUES}/{base_file['file']}"] = parent_entries[base_file["file"]]
                for item in value[len(previous):]:
                    kind, data = self.serde.dumps_typed(item)
                    records.append(_jsonl({"k": "item", "ch": ch, "t": kind, **_value_fields(data, earlier)}))
                lists[ch] = list(value)
                continue
            kind, data = self.serde.dumps_typed(value)
            if not isinstance(value, list) and len(data) <= _RECORD_VALUE_BYTES:
                # A small value: a record in the history (no blob, no tree entry), so the
                # writes and items that repeat its bytes can name them.
                channels[ch] = {"rec": base.seq + len(records), "n": len(data), "t": kind}
                own.append((base.seq + len(records), data))
                records.append(_jsonl({"k": "val", "ch": ch, "t": kind, **_record_value(data)}))
                continue
            file = _encode(ch, _FILE_SAFE)
            files[f"{VALUES}/{file}"] = data
            if isinstance(value, list):
                # A list that does not extend its parent's: stored whole, as the base that the
                # items appended after this checkpoint extend ("from" is filled in below).
                channels[ch] = {"items": {"from": None, "base": {"file": file, "t": kind}}}
                lists[ch] = list(value)
            else:
                channels[ch] = {"file": file, "t": kind}
        # link() appends exactly these records onto `base`, and the move lands only if the
        # thread is still at `expected`, so the new history's seq is known here.
        end_seq = base.seq + len(records)
        for how in channels.values():
            if "items" in how and how["items"]["from"] is None:
                how["items"] = {"from": end_seq, "base": how["items"]["base"]}
        ck_kind, ck_data = self.serde.dumps_typed({k: v for k, v in checkpoint.items() if k != "channel_values"})
        md_kind, md_data = self.serde.dumps_typed(metadata)
        doc = {"format": FORMAT, "thread_id": str(thread_id), "checkpoint_ns": ns, "checkpoint_id": checkpoint["id"],
               "parent_checkpoint_id": parent_id, "channels": channels,
               "checkpoint": {"t": ck_kind, "v": ck_data}, "metadata": {"t": md_kind, "v": md_data}}
        filed = {part for part in SERDE_FILES if len(doc[part]["v"]) > _RECORD_VALUE_BYTES}
        for part in filed:
            files[SERDE_FILES[part]] = doc[part]["v"]
        records.append(_checkpoint_record(doc, filed))
        step, source = metadata.get("step", "?"), metadata.get("source", "?")
        reason = f"langgraph step {step} {quote(str(source), safe='')} {quote(checkpoint['id'], safe='')}"
        parents = (parent.digest,) if parent is not None else ()
        items = len(records)
        records += self._write_records(checkpoint["id"], early, earlier=earlier)

        with self.store.threads.group_writer(f"langgraph put {name}") as writer:
            prepared = writer.prepare_records(b"".join(records)) if records else []
            tree = writer.store_tree(files)

            def final(view):
                state = view.thread(name)
                if state != expected or (holder not in (None, name) and view.thread(holder) != held):
                    raise _Retry()
                # The checkpoint's own position ends its items; the writes that came early follow it.
                history, (position,) = view.link_marked(base, prepared, (items,))
                digest = view.commit(name, tree, parents, reason, position, self.author)
                self._move(view, name, state, parent, ThreadState(
                    digest, history, state.forked_from if state is not None else None), f"step {step}",
                    history == position)
                landed[:] = [history]
                return digest

            landed: list = []
            digest = writer.land(final)
            self._remember_tail(base, landed[0], records)
        entries = {k[len(VALUES) + 1:]: v for k, v in self.store.checkpoints.tree_files(tree, content=False).items()
                   if k.startswith(VALUES + "/")} if files else {}
        self._values[digest.raw] = (channels, lists, entries)
        self._docs[digest.raw] = doc
        while len(self._values) > _CACHED_CHECKPOINTS:
            self._values.popitem(last=False)
        while len(self._docs) > _CACHED_CHECKPOINTS:
            self._docs.popitem(last=False)
        return digest

    @staticmethod
    def _move(view, name: str, state: ThreadState | None, parent: _Node | None, new: ThreadState,
              reason: str, history_implied: bool = False) -> None:
        """Move thread `name` to `new`; a head that is not `new`'s parent is kept as a branch."""
        if state is not None and state.checkpoint is not None and (parent is None or state.checkpoint != parent.digest):
            branches = view.threads(name + "/branches")
            parent_raw = parent.digest.raw if parent is not None else None
            if not any(s.checkpoint == state.checkpoint for s in branches.values()):
                number = 1 + max((int(b.rsplit("/", 1)[1]) for b in branches if b.rsplit("/", 1)[1].isdigit()),
                                 default=0)
                origin = ForkOrigin(name, parent.digest if parent is not None else None,
                                    parent.history.seq if parent is not None else 0)
                view.set_thread(f"{name}/branches/{number}", None,
                                ThreadState(state.checkpoint, state.history, origin), "langgraph-branch",
                                f"branch kept when {name} moved to a fork")
            for branch, bstate in branches.items():
                if parent_raw is not None and bstate.checkpoint is not None and bstate.checkpoint.raw == parent_raw:
                    view.set_thread(branch, bstate, None, "langgraph-branch", "the thread moved onto this branch")
        if not view.set_thread(name, state, new, "langgraph", reason, history_implied):
            raise _Retry()

    def put_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str,
                   task_path: str = "") -> None:
        """Store a task's writes against a checkpoint, as records on a line through it."""
        conf = config["configurable"]
        thread_id, ns = conf["thread_id"], conf.get("checkpoint_ns", "")
        checkpoint_id = conf["checkpoint_id"]
        name = thread_name(thread_id, ns)
        with self._lock:
            line = self._refresh(name)
            if checkpoint_id not in line.by_id:
                # LangGraph may send a checkpoint's writes before its put lands (they run on a
                # background executor): hold them until it does.
                self._early.setdefault((name, checkpoint_id), []).append((list(writes), task_id, task_path))
                while len(self._early) > _MAX_EARLY:  # a put that never came: drop the oldest
                    del self._early[next(iter(self._early))]
                return
            self._land(f"put_writes {checkpoint_id}",
                       lambda: self._put_writes_once(name, thread_id, ns, checkpoint_id, writes, task_id, task_path))

    def _put_writes_once(self, name, thread_id, ns, checkpoint_id, writes, task_id, task_path):
        line = self._refresh(name)
        node = line.nodes[line.by_id[checkpoint_id]]
        ref, expected = line.lines_through(node)[0]
        recent: list = []

        def earlier():
            if not recent:
                recent.append(self._recent_values(expected.history, node))
            return recent[0]
        records = self._write_records(checkpoint_id, [(writes, task_id, task_path)], self._write_keys(line, node),
                                      earlier)
        if not records:
            return
        # Writes that stop the graph (an interrupt, an error) are sealed into a new version of the
        # checkpoint, so that export/sign (which carry a checkpoint's own history) carry them;
        # other writes ride on the ref until the next put's checkpoint covers them.
        on_head = expected.checkpoint == node.digest
        seal = on_head and (any(c in (ERROR, INTERRUPT) for c, _ in writes)
                            or node is not line.first_version(node))
        with self.store.threads.group_writer(f"langgraph writes {name}") as writer:
            prepared = writer.prepare_records(b"".join(records))

            def final(view):
                state = view.thread(ref)
                if state != expected:
                    raise _Retry()
                history = view.link(state.history, prepared)
                landed[:] = [state.history, history]
                message = f"{len(records)} writes"
                checkpoint = state.checkpoint
                if seal:
                    cp = view.checkpoint(node.digest)
                    reason = cp.reason if cp.reason.endswith(SEALED) else cp.reason + SEALED
                    checkpoint = view.commit(cp.thread, cp.tree, (node.digest,), reason, history, self.author)
                if not view.set_thread(ref, state, ThreadState(checkpoint, history, state.forked_from),
                                       "langgraph-writes", message):
                    raise _Retry()
                return checkpoint

            landed: list = []
            sealed = writer.land(final)
            self._remember_tail(*landed, records)
        if seal and node.digest.raw in self._values:
            self._values[sealed.raw] = self._values[node.digest.raw]
        if seal and node.digest.raw in self._docs:
            self._docs[sealed.raw] = self._docs[node.digest.raw]

    def _write_records(self, checkpoint_id: str, batches, existing: set = frozenset(),
                       earlier=lambda: ()) -> list[bytes]:
        """The write records of put_writes batches [(writes, task_id, task_path)] against
        `checkpoint_id`, deduplicated by (task, idx) as LangGraph's savers do: a regular
        write already stored (`existing`, or an earlier batch) is not stored again."""
        seen, records = set(existing), []
        for writes, task_id, task_path in batches:
            have = set()
            for idx, (channel, value) in enumerate(writes):
                key = (task_id, WRITES_IDX_MAP.get(channel, idx))
                if key[1] >= 0 and key in seen or key in have:
                    continue
                have.add(key)
                kind, data = self.serde.dumps_typed(value)
                records.append(_jsonl({"k": "write", "cp": checkpoint_id, "task": task_id, "path": task_path,
                                       "idx": key[1], "ch": channel, "t": kind, **_value_fields(data, earlier)}))
            seen |= have
        return records

    def _remember_tail(self, base: HistoryPosition, head: HistoryPosition, records: list[bytes]) -> None:
        """Keep the inline bytes of the records this saver just appended (base -> head), so the
        next write on that head need not read them back from the store."""
        if head.seq != base.seq + len(records):
            return
        new = []
        for i, line in enumerate(records):
            record = json.loads(line)
            if "x" in record:
                new.append((base.seq + i, _value_bytes(record)))
        before = self._tails.pop(base, [])
        self._tails[head] = (new[::-1] + before)[:_RECENT_RECORDS] if head.seq - base.seq < _RECENT_RECORDS \
            else new[::-1][:_RECENT_RECORDS]
        while len(self._tails) > _CACHED_TAILS:
            self._tails.popitem(last=False)

    def _recent_values(self, position: HistoryPosition, node: _Node) -> list[tuple[int, bytes]]:
        """(seq, inline bytes) of the saver records among the last _RECENT_RECORDS of the history
        at `position`, newest first: what a new record may name instead of repeating it (from
        what this saver appended there, else read back)."""
        kept = self._tails.get(position)
        if kept is not None:
            return [(seq, data) for seq, data in kept if seq >= position.seq - _RECENT_RECORDS]
        out = []
        for seq, r in self._records(position, max(0, position.seq - _RECENT_RECORDS), node):
            if "x" in r or "v" in r:
                try:
                    out.append((seq, _value_bytes(r)))
                except (KeyError, TypeError, ValueError):
                    continue  # a damaged record is reported by the reads that need it
        return out[::-1]

    def _write_keys(self, line: _Line, node: _Node) -> set:
        keys = set()
        for _, state in line.lines_through(node):
            for _, record in self._records(state.history, line.first_version(node).history.seq, node):
                if record["k"] == "write" and record.get("cp") == node.lg_id:
                    keys.add((record["task"], record["idx"]))
        return keys

    # -- whole threads --------------------------------------------------------------------------
    def delete_thread(self, thread_id: str) -> None:
        """Delete every ref of the thread (all namespaces and branches); gc reclaims the rest."""
        root = thread_root(thread_id)

        def final(view):
            for ref, state in view.threads(root).items():
                view.set_thread(ref, state, None, "delete", "langgraph delete_thread")

        with self._lock:
            with self.store.threads.group_writer(f"langgraph delete {root}") as writer:
                writer.land(final)
            for name in [n for n in self._lines if n == root or n.startswith(root + "/")]:
                del self._lines[name]

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """An agentcas fork of every ref of the thread: constant size, no values copied."""
        source, target = thread_root(source_thread_id), thread_root(target_thread_id)

        def final(view):
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
                for name, line in self._lines_of(thread_id).items():
                    head = line.head()
                    raw = self._newest(line, head.checkpoint) if head is not None else None
                    if raw is not None:
                        self._rewrite(name, self._kept_by_prune(line, line.nodes[raw]))

    def _kept_by_prune(self, line: _Line, newest: _Node) -> set[bytes]:
        """What keep_latest keeps of a line: every version of its newest LangGraph checkpoint
        and, if that checkpoint has DeltaChannel values it does not store (the channels of its
        metadata's `counters_since_delta_snapshot` that have a version but no value), every
        ancestor back to the nearest one storing each such value, with their writes: LangGraph
        rebuilds such a channel from the writes of the ancestors down to a stored snapshot
        (BaseCheckpointSaver.prune's DeltaChannel note), so dropping them would empty it."""
        versions: dict[str, set[bytes]] = {}
        for raw, node in line.nodes.items():
            versions.setdefault(node.lg_id, set()).add(raw)
        keep = set(versions[newest.lg_id])
        doc = self._record(line, newest)[0]
        metadata = self._load(doc["metadata"], doc["metadata"]["v"], newest)
        written = self._load(doc["checkpoint"], doc["checkpoint"]["v"], newest).get("channel_versions", {})
        waiting = {ch for ch in (metadata.get("counters_since_delta_snapshot") or {})
                   if ch in written and ch not in doc["channels"]}
        node = newest
        while waiting:
            parent_id = line.lg_parent(node)
            if parent_id is None or parent_id not in line.by_id:
                break  # the thread's first checkpoint: every write since the start is kept
            node = line.nodes[line.by_id[parent_id]]
            keep |= versions[parent_id]
            waiting -= set(self._record(line, node)[0]["channels"])
        return keep

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Drop the checkpoints whose metadata run_id is one of `run_ids`, in every thread;
        their children are re-committed onto the nearest kept ancestor."""
        wanted = set(run_ids)
        if not wanted:
            return
        with self._lock:
            names = [n for n in self.store.threads.under(ROOT) if "/branches/" not in n]
            for name in names:
                line = self._refresh(name)
                victims = set()
                for raw, node in line.nodes.items():
                    doc = self._record(line, node)[0]
                    metadata = self._load(doc["metadata"], doc["metadata"]["v"], node)
                    if metadata.get("run_id") in wanted:
                        victims.add(raw)
                if victims:
                    self._rewrite(name, set(line.nodes) - victims)

    def _rewrite(self, name: str, keep: set) -> None:
        """Re-commit the thread keeping only checkpoints `keep` (raw ids), each onto its nearest
        kept ancestor; refs move to their nearest kept checkpoint (or go); reflogs restart."""
        line = self._refresh(name)
        order: list[bytes] = []
        done: set = set()

        def visit(raw):
            stack = [(raw, False)]
            while stack:
                item, expanded = stack.pop()
                if item in done:
                    continue
                if expanded:
                    done.add(item)
                    order.append(item)
                    continue
                stack.append((item, True))
                stack.extend((p.raw, False) for p in line.parents.get(item, ()) if p.raw not in done)

        for state in line.refs.values():
            if state.checkpoint is not None:
                visit(state.checkpoint.raw)
        observed = dict(line.refs)

        def final(view):
            expected = dict(observed)
            for ref, state in expected.items():
                if view.thread(ref) != state:
                    raise _Retry()
            mapped: dict[bytes, Digest | None] = {}  # old id -> its nearest kept (new) checkpoint
            for raw in order:
                parents = line.parents.get(raw, ())
                new_parent = mapped.get(parents[0].raw) if parents else None
                if raw not in keep:
                    mapped[raw] = new_parent
                    continue
                cp = view.checkpoint(Digest(raw))
                if cp.parents == ((new_parent,) if new_parent is not None else ()):
                    mapped[raw] = Digest(raw)
                    continue
                mapped[raw] = view.commit(cp.thread, cp.tree, (new_parent,) if new_parent is not None else (),
                                          cp.reason, cp.history, cp.author, cp.created_at)
            targets = {ref: mapped.get(state.checkpoint.raw) if state.checkpoint is not None else None
                       for ref, state in expected.items()}
            if targets.get(name) is None:  # the thread's own line went: the newest surviving branch takes over
                for ref in sorted(targets, reverse=True):
                    if ref != name and targets[ref] is not None:
                        targets[name], expected[name] = targets.pop(ref), expected[ref]
                        break
            placed = set()
            for ref in sorted(expected, key=lambda r: (r != name, r)):
                state = expected[ref]
                if view.thread(ref) is not None:
                    view.set_thread(ref, view.thread(ref), None, "langgraph-rewrite", "langgraph prune")
                target = targets.get(ref)
                if target is None or target.raw in placed:
                    continue  # nothing kept on this line, or it now ends where another does
                placed.add(target.raw)
                # A kept head keeps its line's history (its pending writes come after it).
                kept_head = state.checkpoint is not None and state.checkpoint.raw in keep
                history = state.history if kept_head else view.checkpoint(target).history
                view.set_thread(ref, None, ThreadState(target, history, state.forked_from if ref != name else
                                                       expected[name].forked_from), "langgraph-rewrite",
                                "langgraph rewrite: kept checkpoints re-committed onto kept parents")

        self._land(f"rewrite {name}", lambda: self._rewrite_once(name, final))
        self._lines.pop(name, None)

    def _rewrite_once(self, name, final):
        with self.store.threads.group_writer(f"langgraph rewrite {name}") as writer:
            writer.land(final)

    def get_next_version(self, current: int | None, channel: None = None) -> int:
        """current + 1 (from 1). Values are kept per checkpoint, not per (channel, version),
        so two branches reaching one version never collide; strings from other savers
        (`<counter>.<random>`) continue from their counter."""
        if current is None:
            return 1
        if isinstance(current, str):
            return int(current.split(".")[0]) + 1
        return int(current) + 1

    # -- async twins (the work is local and short; they run it inline) --------------------------
    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return self.get_tuple(config)

    async def alist(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
                    before: RunnableConfig | None = None, limit: int | None = None) -> AsyncIterator[CheckpointTuple]:
        for item in self.list(config, filter=filter, before=before, limit=limit):
            yield item

    async def aput(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
                   new_versions: ChannelVersions) -> RunnableConfig:
        return self.put(config, checkpoint, metadata, new_versions)

    async def aput_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str,
                          task_path: str = "") -> None:
        return self.put_writes(config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        return self.delete_thread(thread_id)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        return self.copy_thread(source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        return self.prune(thread_ids, strategy=strategy)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        return self.delete_for_runs(run_ids)


# One class has both the sync and the async methods; the async name is the same saver, for
# code written against LangGraph's pairs (SqliteSaver / AsyncSqliteSaver).
AsyncAgentcasSaver = AgentcasSaver
