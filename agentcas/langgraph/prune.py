"""Rewriting a thread: what prune (keep_latest) and delete_for_runs keep, and re-committing
the kept checkpoints onto their nearest kept ancestors.

The dropped checkpoints leave every ref and reflog (their records stay in the histories the
kept ones share), so gc reclaims what no other thread (a copy, a fork) still shares. A
rewrite walks the line's commits parents first, maps each dropped commit to its nearest kept
ancestor and re-commits each kept one whose parent changed; then every ref moves to its
nearest kept checkpoint (or goes), all in one group move whose plan checks each ref still holds
what the line read showed (else the move engine's LostRace: lineage/moves.py re-plans it,
and a ref that stays moved ends in its ConflictError).
"""

from __future__ import annotations

from typing import Any

from agentcas.cas.digest import Digest
from agentcas.langgraph.base import BaseAgentcasSaver
from agentcas.langgraph.index import Line, Node
from agentcas.lineage.moves import LostRace
from agentcas.refs.threads import ThreadState


class SaverRewrites(BaseAgentcasSaver):
    """The steps of prune and delete_for_runs."""

    def _kept_by_prune(self, line: Line, newest: Node) -> set[bytes]:
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

    def _rewrite(self, name: str, keep: set[bytes]) -> None:
        """Re-commit the thread keeping only checkpoints `keep` (raw ids), each onto its nearest
        kept ancestor; refs move to their nearest kept checkpoint (or go); reflogs restart."""
        line = self._index.refresh(name)
        order: list[bytes] = []  # parents before children
        done: set[bytes] = set()

        def visit(raw: bytes) -> None:
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

        def final(view: Any) -> None:
            expected = dict(observed)
            for ref, state in expected.items():
                if view.thread(ref) != state:
                    raise LostRace(ref)
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
            placed: set[bytes] = set()
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

        with self.store.threads.group_writer(f"langgraph rewrite {name}") as writer:
            writer.land(final)
        self._index.forget(name)
