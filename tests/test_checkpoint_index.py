"""lineage/checkpoints.py: generation and skip pointers on first-parent chains."""

from __future__ import annotations

import random

from agentcas import Store
from agentcas.cas.objects import Checkpoint
from agentcas.lineage.checkpoints import ancestor_at, newest_at_or_before
from agentcas.refs.revisions import load_checkpoint

from support.store_state import views


def naive_newest(txn, tip, seq):
    node = tip
    while node is not None:
        cp = load_checkpoint(txn, node)
        if cp.history.seq <= seq:
            return node
        node = cp.parents[0] if cp.parents else None
    return None


def chain(txn, tip):
    out = []
    node = tip
    while node is not None:
        out.append(node)
        cp = load_checkpoint(txn, node)
        node = cp.parents[0] if cp.parents else None
    return out[::-1]


def test_commits_carry_generation_and_skip_and_fork_finds_the_newest_at_the_cut(tmp_path):
    store = Store.memory()
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("a\n")
    rng = random.Random(7)
    for step in range(150):
        if rng.random() < 0.7:
            store.history.append("main", b'{"step": %d}\n' % step * rng.randint(1, 3))
        store.checkpoints.commit(str(ws), f"step {step}")
        if step in (60, 110):  # reverts reset the history; the chain stays monotone
            store.threads.revert("main", "main~5")
    with views(store) as txn:
        tip = store.resolve("main")
        nodes = chain(txn, tip)
        for generation, node in enumerate(nodes):
            cp = load_checkpoint(txn, node)
            assert cp.generation == generation
            assert (cp.skip is not None) == (generation >= 2)
            assert ancestor_at(txn, node, cp, generation // 2) == nodes[generation // 2]
        head = store.threads.get("main").history.seq
        for seq in list(range(0, head + 1, 7)) + [head]:
            assert newest_at_or_before(txn, tip, seq) == naive_newest(txn, tip, seq)
    forked = store.threads.fork("main", "side", at=head // 2).to_json()
    with views(store) as txn:
        assert forked["checkpoint"] == naive_newest(txn, tip, head // 2).hex()


def test_unindexed_checkpoints_are_walked_parent_by_parent():
    """Generation 0 with parents (built by other writers) keeps its id and still resolves."""
    from agentcas.cas import framing
    from agentcas.cas.objects import EMPTY_POSITION, Tree
    from agentcas.cas.store import save_object
    store = Store.memory()
    tree = Tree(())
    ids = []

    def land(txn):
        save_object(txn, tree.digest(), framing.frame(framing.KIND_TREE, tree.encode()))
        parent = None
        for n in range(5):
            cp = Checkpoint(tree.digest(), (parent,) if parent else (), "main", f"n{n}", "t",
                            "2026-11-29T00:00:00.000000Z", {}, EMPTY_POSITION)
            digest = cp.digest()
            save_object(txn, digest, framing.frame(framing.KIND_CHECKPOINT, cp.encode()))
            ids.append(digest)
            parent = digest

    store.environment.write(land)
    with views(store) as txn:
        assert newest_at_or_before(txn, ids[-1], 0) == ids[-1]
        assert load_checkpoint(txn, ids[-1]).generation == 0
        assert b"generation" not in Checkpoint.decode(Checkpoint(
            tree.digest(), (), "main", "r", "t", "2026-11-29T00:00:00.000000Z").encode()).encode()


def test_a_commit_finds_its_skip_target_from_the_links_it_keeps(tmp_path, monkeypatch):
    """Store.commit looks up (generation, skip) through CHECKPOINT_LINKS: after a chain of
    commits, the next one loads no ancestor checkpoint to index itself; with the links
    dropped it finds the same skip target by loading them."""
    from agentcas.lineage import checkpoints
    from agentcas.refs import revisions

    store, _ = Store.init(str(tmp_path / "s"))
    work = tmp_path / "w"
    work.mkdir()
    for i in range(40):
        (work / "f").write_text(str(i))
        store.checkpoints.commit(str(work), f"step {i}", thread="main")
    loads = []
    real = revisions.load_checkpoint
    monkeypatch.setattr(checkpoints, "load_checkpoint", lambda objects, digest: loads.append(digest) or real(objects, digest))
    with store.source.reading() as objects:
        head = store.resolve("main")
        warm = checkpoints.index_for_child(objects, head, memo=True)
        assert loads == []
        checkpoints.CHECKPOINT_LINKS.links.clear()
        cold = checkpoints.index_for_child(objects, head, memo=True)
        assert cold == warm == checkpoints.index_for_child(objects, head) and len(loads) >= 2
