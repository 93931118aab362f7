"""Writing: a put (a checkpoint and its values) and put_writes (a task's pending writes).

A put plans on the thread's index: each channel is the parent's entry when unchanged (its
record, file or items stored once), new items appended as records when a list extends the
parent's (the message list), a record when a value is small, else a file of the tree; then
the checkpoint's `cp` record (records.py). A value whose bytes an earlier record of the same
history holds (a message is its input's value, then a write, then an item) is stored as a
reference to them. The records, the tree and the checkpoint land as one group move
(lineage/group_moves.py) that compare-and-swaps the thread (and, when the put forks, keeps
the old head as a branch); a thread that moved since the index read it is a lost race
(LostRace): the move engine re-plans, preparing the put's content again from the index
(lineage/group_moves.py `prepare_and_land`), since that content is cut against the head read.

put_writes appends a task's writes (deduplicated by (task, idx) as LangGraph's savers do) to
a line through their checkpoint; writes that stop the graph (an interrupt, an error) are
sealed into a new version of the checkpoint so that export and sign carry them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from langgraph.checkpoint.base import WRITES_IDX_MAP, ChannelVersions, Checkpoint, CheckpointMetadata
from langgraph.checkpoint.serde.types import ERROR, INTERRUPT

from agentcas.cas.digest import Digest
from agentcas.cas.objects import EMPTY_POSITION, HistoryPosition
from agentcas.langgraph.base import BaseAgentcasSaver
from agentcas.langgraph.index import Line, Node
from agentcas.langgraph.names import checkpoint_reason, sealed_reason, value_file
from agentcas.langgraph.records import (
    FORMAT,
    RECORD_VALUE_BYTES,
    SERDE_FILES,
    VALUES,
    Earlier,
    checkpoint_record,
    jsonl,
    record_value,
    value_bytes,
    value_fields,
)
from agentcas.lineage.moves import LostRace
from agentcas.refs.threads import ForkOrigin, ThreadState

CACHED_CHECKPOINTS = 4
MAX_EARLY = 256  # checkpoints whose writes wait for their put
RECENT_RECORDS = 8  # a new record looks this many records back for bytes it repeats
CACHED_TAILS = 16

# put_writes batches held or landed together: [(writes, task_id, task_path)]
WriteBatches = Sequence[tuple[Sequence[tuple[str, Any]], str, str]]


def stops_the_graph(writes: Iterable[tuple[str, Any]]) -> bool:
    """Whether a task's writes interrupt the graph or report an error (they are sealed)."""
    return any(channel in (ERROR, INTERRUPT) for channel, _ in writes)


def extends(value: list, previous: list) -> bool:
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


@dataclass
class _ChannelPlan:
    """What a put stores for its channels: their entries in the checkpoint record, the files
    of its tree, the lists it remembers, and the records appended after `base_seq`."""

    base_seq: int
    own: list[tuple[int, bytes]]  # this put's value records (what later records may name)
    channels: dict[str, dict] = field(default_factory=dict)
    files: dict[str, Any] = field(default_factory=dict)
    lists: dict[str, list] = field(default_factory=dict)
    records: list[bytes] = field(default_factory=list)

    def next_seq(self) -> int:
        """The seq the next appended record will have."""
        return self.base_seq + len(self.records)


class SaverWrites(BaseAgentcasSaver):
    """The steps of put and put_writes (one attempt each; the public methods retry them)."""

    def _parent_values(self, line: Line, parent: Node | None) -> tuple[dict, dict, dict]:
        """(channels doc, {channel: list}, {file: entry}) of the parent, from cache or store."""
        if parent is None:
            return {}, {}, {}
        cached = self._values.get(parent.digest.raw)
        if cached is not None:
            return cached
        doc, files, entries = self._record(line, parent, entries=True)
        lists: dict[str, list] = {}
        full = None
        for ch, how in doc["channels"].items():
            if "items" in how:
                if full is None:
                    full = self._tuple(line, parent, "", "", record=(doc, files, entries))
                lists[ch] = full.checkpoint["channel_values"].get(ch, [])
        return doc["channels"], lists, entries

    def _put_once(self, name: str, thread_id: str, ns: str, parent_id: str | None, checkpoint: Checkpoint,
                  metadata: CheckpointMetadata, new_versions: ChannelVersions, early: WriteBatches = ()) -> Digest:
        """Plan and land one put on the thread as the index has it: if the thread moved since,
        the move engine runs `prepare` again (GroupWriter.prepare_and_land), which cuts the
        content from the index anew."""
        cut: dict[str, Any] = {}  # what the attempt that landed prepared

        def prepare() -> Callable[[Any], Digest]:
            line = self._index.refresh(name)
            expected = line.head()
            parent_raw = line.by_id.get(parent_id) if parent_id else None
            parent = line.nodes.get(parent_raw) if parent_raw is not None else None
            parent_channels, parent_lists, parent_entries = self._parent_values(line, parent)
            # The new history continues the line that holds the parent (the thread, or a branch it
            # folds back), so the parent's pending writes on that line stay on a line.
            holder = None
            if parent is not None:
                holder = next((ref for ref in sorted(line.refs, key=lambda r: (r != name, r))
                               if line.refs[ref].checkpoint == parent.digest), None)
            held = line.refs.get(holder) if holder is not None else None
            base = held.history if held is not None else parent.history if parent is not None else EMPTY_POSITION
            recent: list[list[tuple[int, bytes]]] = []
            own: list[tuple[int, bytes]] = []  # this put's value records

            def earlier() -> list[tuple[int, bytes]]:  # the history read only when a value may repeat one
                if not recent:
                    recent.append(self._recent_values(base, parent) if parent is not None else [])
                return own + recent[0]
            plan = _ChannelPlan(base.seq, own)
            self._plan_channels(plan, checkpoint, new_versions, parent_channels, parent_lists, parent_entries, earlier)
            channels, files, lists, records = plan.channels, plan.files, plan.lists, plan.records
            # link() appends exactly these records onto `base`, and the move lands only if the
            # thread is still at `expected`, so the new history's seq is known here.
            end_seq = base.seq + len(records)
            for how in channels.values():
                if "items" in how and how["items"]["from"] is None:
                    how["items"] = {"from": end_seq, "base": how["items"]["base"]}
            ck_kind, ck_data = self.serde.dumps_typed({k: v for k, v in checkpoint.items() if k != "channel_values"})
            md_kind, md_data = self.serde.dumps_typed(metadata)
            doc: dict[str, Any] = {
                "format": FORMAT, "thread_id": str(thread_id), "checkpoint_ns": ns, "checkpoint_id": checkpoint["id"],
                "parent_checkpoint_id": parent_id, "channels": channels,
                "checkpoint": {"t": ck_kind, "v": ck_data}, "metadata": {"t": md_kind, "v": md_data}}
            filed = {part for part in SERDE_FILES if len(doc[part]["v"]) > RECORD_VALUE_BYTES}
            for part in filed:
                files[SERDE_FILES[part]] = doc[part]["v"]
            records.append(checkpoint_record(doc, filed))
            step, source = metadata.get("step", "?"), metadata.get("source", "?")
            reason = checkpoint_reason(step, source, checkpoint["id"])
            parents = (parent.digest,) if parent is not None else ()
            items = len(records)
            records += self._write_records(checkpoint["id"], early, earlier=earlier)

            prepared = writer.prepare_records(b"".join(records)) if records else []
            tree = writer.store_tree(files)
            cut.update(base=base, records=records, channels=channels, lists=lists, doc=doc, tree=tree, files=files)

            def final(view: Any) -> Digest:
                state = view.thread(name)
                if state != expected or (holder not in (None, name) and view.thread(holder) != held):
                    raise LostRace(name)
                # The checkpoint's own position ends its items; the writes that came early follow it.
                history, (position,) = view.link_marked(base, prepared, (items,))
                digest = view.commit(name, tree, parents, reason, position, self.author)
                self._move(view, name, state, parent, ThreadState(
                    digest, history, state.forked_from if state is not None else None), f"step {step}",
                    history == position)
                cut["history"] = history
                return digest
            return final

        with self.store.threads.group_writer(f"langgraph put {name}") as writer:
            digest = writer.prepare_and_land(prepare)
        tree, files, channels, lists, doc = cut["tree"], cut["files"], cut["channels"], cut["lists"], cut["doc"]
        self._remember_tail(cut["base"], cut["history"], cut["records"])
        entries = {k[len(VALUES) + 1:]: v for k, v in self.store.checkpoints.tree_files(tree, content=False).items()
                   if k.startswith(VALUES + "/")} if files else {}
        self._values[digest.raw] = (channels, lists, entries)
        self._docs[digest.raw] = doc
        while len(self._values) > CACHED_CHECKPOINTS:
            self._values.popitem(last=False)
        while len(self._docs) > CACHED_CHECKPOINTS:
            self._docs.popitem(last=False)
        return digest

    def _plan_channels(self, plan: _ChannelPlan, checkpoint: Checkpoint, new_versions: ChannelVersions,
                       parent_channels: dict, parent_lists: dict, parent_entries: dict, earlier: Earlier) -> None:
        """How each channel of `checkpoint` is stored, into `plan`: the parent's entry when
        unchanged, new items when a list extends the parent's, a record when small, a file else."""
        for ch in checkpoint["channel_versions"]:
            before = parent_channels.get(ch)
            if ch not in new_versions and before is not None:
                plan.channels[ch] = before  # unchanged: the parent's record, file or items, stored once
                if "rec" in before:
                    pass
                elif "file" in before:
                    plan.files[f"{VALUES}/{before['file']}"] = parent_entries[before["file"]]
                else:
                    base_file = before["items"].get("base")
                    if base_file:
                        plan.files[f"{VALUES}/{base_file['file']}"] = parent_entries[base_file["file"]]
                    if ch in parent_lists:
                        plan.lists[ch] = parent_lists[ch]
                continue
            if ch not in checkpoint["channel_values"]:
                continue  # an empty channel
            value = checkpoint["channel_values"][ch]
            previous = parent_lists.get(ch)
            if previous is None and before is None and isinstance(value, list):
                previous = []  # a new list channel extends the empty list: its items go to the rollout
            if isinstance(value, list) and previous is not None and extends(value, previous):
                if before is not None and "items" in before:
                    plan.channels[ch] = before
                    base_file = before["items"].get("base")
                else:  # the parent's whole stored list (or nothing) is the base these items extend
                    base_file = before
                    plan.channels[ch] = {"items": {"from": plan.next_seq(), "base": base_file}}
                if base_file:
                    plan.files[f"{VALUES}/{base_file['file']}"] = parent_entries[base_file["file"]]
                for item in value[len(previous):]:
                    kind, data = self.serde.dumps_typed(item)
                    plan.records.append(jsonl({"k": "item", "ch": ch, "t": kind, **value_fields(data, earlier)}))
                plan.lists[ch] = list(value)
                continue
            kind, data = self.serde.dumps_typed(value)
            if not isinstance(value, list) and len(data) <= RECORD_VALUE_BYTES:
                # A small value: a record in the history (no blob, no tree entry), so the
                # writes and items that repeat its bytes can name them.
                plan.channels[ch] = {"rec": plan.next_seq(), "n": len(data), "t": kind}
                plan.own.append((plan.next_seq(), data))
                plan.records.append(jsonl({"k": "val", "ch": ch, "t": kind, **record_value(data)}))
                continue
            file = value_file(ch)
            plan.files[f"{VALUES}/{file}"] = data
            if isinstance(value, list):
                # A list that does not extend its parent's: stored whole, as the base that the
                # items appended after this checkpoint extend ("from" is filled in below).
                plan.channels[ch] = {"items": {"from": None, "base": {"file": file, "t": kind}}}
                plan.lists[ch] = list(value)
            else:
                plan.channels[ch] = {"file": file, "t": kind}

    @staticmethod
    def _move(view: Any, name: str, state: ThreadState | None, parent: Node | None, new: ThreadState,
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
            raise LostRace(name)

    def _put_writes_once(self, name: str, checkpoint_id: str, writes: Sequence[tuple[str, Any]], task_id: str,
                         task_path: str) -> None:
        """Plan and land one task's writes on a line through their checkpoint, as the index has
        it: if the line moved since, the move engine runs `prepare` again (as `_put_once`)."""
        cut: dict[str, Any] = {}  # what the attempt that landed prepared

        def prepare() -> Callable[[Any], Digest | None]:
            line = self._index.refresh(name)
            node = line.nodes[line.by_id[checkpoint_id]]
            ref, expected = line.lines_through(node)[0]
            recent: list[list[tuple[int, bytes]]] = []

            def earlier() -> list[tuple[int, bytes]]:
                if not recent:
                    recent.append(self._recent_values(expected.history, node))
                return recent[0]
            records = self._write_records(checkpoint_id, [(writes, task_id, task_path)],
                                          self._write_keys(line, node), earlier)
            cut.clear()
            if not records:
                return lambda view: None  # every write is stored already: nothing lands
            # Writes that stop the graph (an interrupt, an error) are sealed into a new version of the
            # checkpoint, so that export/sign (which carry a checkpoint's own history) carry them;
            # other writes ride on the ref until the next put's checkpoint covers them.
            on_head = expected.checkpoint == node.digest
            seal = on_head and (stops_the_graph(writes) or node is not line.first_version(node))
            prepared = writer.prepare_records(b"".join(records))

            def final(view: Any) -> Digest | None:
                state = view.thread(ref)
                if state != expected:
                    raise LostRace(ref)
                history = view.link(state.history, prepared)
                cut.update(base=state.history, history=history, records=records, node=node, seal=seal)
                message = f"{len(records)} writes"
                checkpoint = state.checkpoint
                if seal:
                    cp = view.checkpoint(node.digest)
                    reason = sealed_reason(cp.reason)
                    checkpoint = view.commit(cp.thread, cp.tree, (node.digest,), reason, history, self.author)
                if not view.set_thread(ref, state, ThreadState(checkpoint, history, state.forked_from),
                                       "langgraph-writes", message):
                    raise LostRace(ref)
                return checkpoint
            return final

        with self.store.threads.group_writer(f"langgraph writes {name}") as writer:
            sealed = writer.prepare_and_land(prepare)
        if not cut:
            return
        self._remember_tail(cut["base"], cut["history"], cut["records"])
        node = cut["node"]
        if cut["seal"] and sealed is not None:  # the new version reads like the one it seals
            if node.digest.raw in self._values:
                self._values[sealed.raw] = self._values[node.digest.raw]
            if node.digest.raw in self._docs:
                self._docs[sealed.raw] = self._docs[node.digest.raw]

    def _write_records(self, checkpoint_id: str, batches: WriteBatches, existing: Iterable[tuple[str, int]] = (),
                       earlier: Earlier = lambda: ()) -> list[bytes]:
        """The write records of put_writes batches [(writes, task_id, task_path)] against
        `checkpoint_id`, deduplicated by (task, idx) as LangGraph's savers do: a regular
        write already stored (`existing`, or an earlier batch) is not stored again."""
        seen, records = set(existing), []
        for writes, task_id, task_path in batches:
            have: set[tuple[str, int]] = set()
            for idx, (channel, value) in enumerate(writes):
                key = (task_id, WRITES_IDX_MAP.get(channel, idx))
                if key[1] >= 0 and key in seen or key in have:
                    continue
                have.add(key)
                kind, data = self.serde.dumps_typed(value)
                records.append(jsonl({"k": "write", "cp": checkpoint_id, "task": task_id, "path": task_path,
                                       "idx": key[1], "ch": channel, "t": kind, **value_fields(data, earlier)}))
            seen |= have
        return records

    def _remember_tail(self, base: HistoryPosition, head: HistoryPosition, records: list[bytes]) -> None:
        """Keep the inline bytes of the records this saver just appended (base -> head), so the
        next write on that head need not read them back from the store."""
        if head.seq != base.seq + len(records):
            return
        new: list[tuple[int, bytes]] = []
        for i, line in enumerate(records):
            record = json.loads(line)
            if "x" in record:
                new.append((base.seq + i, value_bytes(record)))
        before = self._tails.pop(base, [])
        self._tails[head] = (new[::-1] + before)[:RECENT_RECORDS] if head.seq - base.seq < RECENT_RECORDS \
            else new[::-1][:RECENT_RECORDS]
        while len(self._tails) > CACHED_TAILS:
            self._tails.popitem(last=False)

    def _recent_values(self, position: HistoryPosition, node: Node) -> list[tuple[int, bytes]]:
        """(seq, inline bytes) of the saver records among the last RECENT_RECORDS of the history
        at `position`, newest first: what a new record may name instead of repeating it (from
        what this saver appended there, else read back)."""
        kept = self._tails.get(position)
        if kept is not None:
            return [(seq, data) for seq, data in kept if seq >= position.seq - RECENT_RECORDS]
        out: list[tuple[int, bytes]] = []
        for seq, r in self._records(position, max(0, position.seq - RECENT_RECORDS), node):
            if "x" in r or "v" in r:
                try:
                    out.append((seq, value_bytes(r)))
                except (KeyError, TypeError, ValueError):
                    continue  # a damaged record is reported by the reads that need it
        return out[::-1]

    def _write_keys(self, line: Line, node: Node) -> set[tuple[str, int]]:
        """(task, idx) of the writes already stored against `node` on the lines through it."""
        keys: set[tuple[str, int]] = set()
        for _, state in line.lines_through(node):
            for _, record in self._records(state.history, line.first_version(node).history.seq, node):
                if record["k"] == "write" and record.get("cp") == node.lg_id:
                    keys.add((record["task"], record["idx"]))
        return keys
