"""Property tests: rollout histories against a model (a list of records per thread).

A Hypothesis state machine appends random JSON records (batches large enough to span
several 1 MiB segments included), forks at random seqs, commits and reverts. After
every step the store must agree with the model: `rollout_read` of any [from, to)
returns the model's bytes, `History.position` names the prefix the model's chain
digest gives, `History.verify` passes, and lookups right at segment boundaries land.
"""

from __future__ import annotations

import json
import random
import shutil
import tempfile

import blake3
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from agentcas import Store
from agentcas.cas.digest import PREFIX_CHAIN_CONTEXT
from agentcas.cas.objects import EMPTY_POSITION
from agentcas.lineage import rollout
from agentcas.lineage.closure import Walker
from agentcas.refs import revisions
from agentcas.refs import threads as refs_threads

from support.store_state import views

# --- the model ----------------------------------------------------------------------------


def model_chain(records: list[bytes]) -> bytes:
    """d_0 = 32 zero bytes, d_i = blake3(d_{i-1} || blake3(record_i), ctx) — written out again."""
    digest = bytes(32)
    for record in records:
        digest = blake3.blake3(digest + blake3.blake3(record).digest(),
                               derive_key_context=PREFIX_CHAIN_CONTEXT).digest()
    return digest


def segment_boundaries(txn, head) -> list[int]:
    """Every seq at which a segment of the history at `head` starts or is cut."""
    history = rollout.History(txn)
    seqs, position = {head.seq}, head
    while position.segment is not None:
        segment = history.segment(position.segment)
        seqs.add(segment.base.seq)
        seqs.add(min(position.seq, segment.base.seq + segment.count))
        position = segment.base
    return sorted(seqs)


def check_chain_shape(txn, head) -> None:
    """Indexes count up by one along `base`; each skip is the ancestor at skip_index(index)."""
    history = rollout.History(txn)
    chain = []  # (id, segment), newest first, by base steps only
    position = head
    while position.segment is not None:
        segment = history.segment(position.segment)
        chain.append((position.segment, segment))
        position = segment.base
    chain.reverse()
    by_index = [segment_id for segment_id, _ in chain]
    for index, (segment_id, segment) in enumerate(chain):
        assert segment.index == index
        if index >= 2:
            assert segment.skip == by_index[rollout.skip_index(index)]
        else:
            assert segment.skip is None
        if index:
            assert segment.base.seq > chain[index - 1][1].base.seq


json_leaf = st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.text(max_size=12)
json_value = st.recursive(json_leaf, lambda inner: st.lists(inner, max_size=3)
                          | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=8)
# Mostly small records; sometimes one of several hundred KiB so a batch spans segments.
pad_size = st.one_of(st.just(0), st.just(0), st.integers(1, 3000), st.integers(200_000, 600_000))


@st.composite
def record_line(draw) -> bytes:
    obj = draw(st.dictionaries(st.text(max_size=8), json_value, max_size=4))
    pad = draw(pad_size)
    if pad:
        obj["pad"] = random.Random(draw(st.integers(0, 2**32))).randbytes(pad // 2).hex()
    return json.dumps(obj, ensure_ascii=draw(st.booleans())).encode("utf-8") + b"\n"


batches = st.lists(record_line(), min_size=1, max_size=6)


class RolloutMachine(RuleBasedStateMachine):
    """The store against a dict thread -> list of record bytes."""

    use_lmdb = False

    def __init__(self):
        super().__init__()
        self.tmp = tempfile.mkdtemp(prefix="agentcas-prop-")
        if self.use_lmdb:
            self.store, _ = Store.init(f"{self.tmp}/store")
        else:
            self.store = Store.memory()
        self.workspace = f"{self.tmp}/ws"
        shutil.os.makedirs(self.workspace)
        with open(f"{self.workspace}/note.txt", "w") as handle:
            handle.write("the workspace\n")
        self.model: dict[str, list[bytes]] = {}
        self.reflog: dict[str, list[list[bytes]]] = {}  # every state a thread was moved to
        self.checkpoints: dict[str, list[bytes]] = {}
        self.counter = 0

    def teardown(self):
        try:
            self.final_check()
        finally:
            if self.use_lmdb:
                self.store.environment.close()
            shutil.rmtree(self.tmp, ignore_errors=True)

    def _new_name(self) -> str:
        self.counter += 1
        return f"t{self.counter}"

    # -- moves --------------------------------------------------------------------------------
    @rule(data=st.data(), batch=batches, drop_final_newline=st.booleans())
    def append(self, data, batch, drop_final_newline):
        thread = data.draw(st.sampled_from(sorted(self.model) + ["<new>"]), label="thread")
        if thread == "<new>":
            thread = self._new_name()
        payload = b"".join(batch)
        if drop_final_newline:
            payload = payload[:-1]  # the store adds the final newline back
        before = len(self.model.get(thread, []))
        result = self.store.history.append(thread, payload).to_json()
        assert result["first_seq"] == before
        assert result["appended"] == len(batch)
        self.model.setdefault(thread, []).extend(batch)
        assert result["history"]["seq"] == len(self.model[thread])
        self.reflog.setdefault(thread, []).append(list(self.model[thread]))

    @precondition(lambda self: self.model)
    @rule(data=st.data(), whole=st.booleans())
    def fork(self, data, whole):
        source = data.draw(st.sampled_from(sorted(self.model)), label="source")
        records = self.model[source]
        at = None if whole else data.draw(st.integers(0, len(records)), label="at")
        name = self._new_name()
        result = self.store.threads.fork(source, name, at).to_json()
        self.model[name] = records[: len(records) if at is None else at]
        assert result["seq"] == len(self.model[name])
        self.reflog[name] = [list(self.model[name])]

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def commit(self, data):
        thread = data.draw(st.sampled_from(sorted(self.model)), label="thread")
        result = self.store.checkpoints.commit(self.workspace, "step", thread).to_json()
        assert result["history"]["seq"] == len(self.model[thread])
        self.checkpoints[result["checkpoint"]] = list(self.model[thread])
        self.reflog[thread].append(list(self.model[thread]))

    @precondition(lambda self: self.checkpoints)
    @rule(data=st.data())
    def revert(self, data):
        thread = data.draw(st.sampled_from(sorted(self.model)), label="thread")
        target = data.draw(st.sampled_from(sorted(self.checkpoints)), label="checkpoint")
        result = self.store.threads.revert(thread, target).to_json()
        self.model[thread] = list(self.checkpoints[target])
        assert result["history"]["seq"] == len(self.model[thread])
        self.reflog[thread].append(list(self.model[thread]))

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def fork_from_reflog_entry(self, data):
        """THREAD@{N} names the whole history that entry recorded."""
        source = data.draw(st.sampled_from(sorted(self.model)), label="source")
        number = data.draw(st.integers(0, len(self.reflog[source]) - 1), label="N")
        records = self.reflog[source][-1 - number]
        rev = f"{source}@{{{number}}}"
        assert b"".join(self.store.history.read(rev)) == b"".join(records)
        at = data.draw(st.integers(0, len(records)), label="at")
        name = self._new_name()
        self.store.threads.fork(rev, name, at)
        self.model[name] = records[:at]
        self.reflog[name] = [list(self.model[name])]

    # -- reads --------------------------------------------------------------------------------
    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def read_range(self, data):
        thread = data.draw(st.sampled_from(sorted(self.model)), label="thread")
        records = self.model[thread]
        start = data.draw(st.integers(0, len(records)), label="from")
        stop = data.draw(st.integers(start, len(records)), label="to")
        got = b"".join(self.store.history.read(thread, start, stop))
        assert got == b"".join(records[start:stop])

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def position(self, data):
        thread = data.draw(st.sampled_from(sorted(self.model)), label="thread")
        records = self.model[thread]
        seq = data.draw(st.integers(0, len(records)), label="seq")
        head = self.store.threads.get(thread).history
        with views(self.store) as txn:
            position = rollout.History(txn).position(head, seq)
        assert position.seq == seq
        assert position.offset == sum(map(len, records[:seq]))
        assert position.digest.raw == model_chain(records[:seq])

    @invariant()
    def heads_match_model(self):
        for name, records in self.model.items():
            head = self.store.threads.get(name).history
            assert head.seq == len(records)
            assert head.offset == sum(map(len, records))
            assert head.digest.raw == model_chain(records)

    def final_check(self):
        """Every thread verifies, walks clean, and reads right at every segment boundary."""
        with views(self.store) as txn:
            history = rollout.History(txn)
            for name, state in refs_threads.list_threads(txn):
                records = self.model[name]
                assert history.verify(state.history) == len(records)
                list(Walker(txn).history(state.history))
                check_chain_shape(txn, state.history)
                if state.checkpoint is not None:  # a thread's history extends its checkpoint's
                    cp_history = revisions.load_checkpoint(txn, state.checkpoint).history
                    assert history.position(state.history, cp_history.seq) == cp_history
                for seq in segment_boundaries(txn, state.history):
                    for s in {max(0, seq - 1), seq, min(len(records), seq + 1)}:
                        position = history.position(state.history, s)
                        assert position.digest.raw == model_chain(records[:s])
                        got = b"".join(history.read(state.history, s, min(len(records), s + 1)))
                        assert got == b"".join(records[s: s + 1])
                        got = b"".join(history.read(state.history, max(0, s - 2), s))
                        assert got == b"".join(records[max(0, s - 2): s])


RolloutMachine.TestCase.settings = settings(
    max_examples=40, stateful_step_count=15, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
TestRolloutMemory = RolloutMachine.TestCase


class LmdbRolloutMachine(RolloutMachine):
    use_lmdb = True


LmdbRolloutMachine.TestCase.settings = settings(
    max_examples=4, stateful_step_count=10, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
TestRolloutLmdb = LmdbRolloutMachine.TestCase


# --- deep chains: the skip list ------------------------------------------------------------

def _single_record_chain(store, count: int, base=EMPTY_POSITION, tag: str = "r"):
    """`count` one-record segments continuing from `base`, linked directly (fast)."""
    records = []
    head = base
    for i in range(count):
        line = json.dumps({"tag": tag, "i": i}).encode() + b"\n"
        chunks = {}
        prepared = rollout.prepare(line, lambda digest, framed: chunks.__setitem__(digest.raw, framed))
        store.source.put_many(chunks)
        head, segments = rollout.link_segments(store.source, head, prepared)
        store.source.put_many(segments)
        records.append(line)
    return head, records


@pytest.mark.parametrize("count", [1, 2, 3, 64, 600])
def test_skip_list_lookup_at_every_boundary(count):
    store = Store.memory()
    head, records = _single_record_chain(store, count)
    with views(store) as txn:
        history = rollout.History(txn)
        step = 1 if count < 100 else 37
        for seq in list(range(0, count + 1, step)) + [count - 1, count]:
            position = history.position(head, seq)
            assert position.digest.raw == model_chain(records[:seq])
            if seq < count:
                assert b"".join(history.read(head, seq, seq + 1)) == records[seq]
        assert history.verify(head) == count
        check_chain_shape(txn, head)


def test_skip_index_matches_bitcoin_get_skip_height():
    # Values of CBlockIndex's GetSkipHeight, written out.
    expected = {0: 0, 1: 0, 2: 0, 3: 1, 4: 0, 5: 1, 6: 4, 7: 1, 8: 0, 9: 1, 10: 8, 11: 1,
                12: 8, 13: 1, 14: 12, 15: 9, 16: 0, 17: 1, 100: 96, 1000: 992}
    assert {n: rollout.skip_index(n) for n in expected} == expected
    assert all(rollout.skip_index(n) < n for n in range(1, 5000))


def test_a_writer_finds_skip_targets_from_the_links_it_keeps_not_by_reloading(monkeypatch):
    """Linking onto a deep chain looks up its skip target through SEGMENT_LINKS: once the
    chain was written (or read) by this process, no ancestor segment is loaded again, and
    the skip pointers are those a cold search finds (the chain's shape is checked both ways)."""
    store = Store.memory()
    head, _ = _single_record_chain(store, 300, tag="links")
    loads = []
    real = rollout.History.segment
    monkeypatch.setattr(rollout.History, "segment", lambda self, digest: loads.append(digest) or real(self, digest))
    warm, _ = _single_record_chain(store, 20, head, tag="warm")
    assert loads == []
    rollout.SEGMENT_LINKS.links.clear()
    cold, _ = _single_record_chain(store, 20, head, tag="warm")
    assert cold == warm and len(loads) >= 3  # the same segments, found by loading ancestors
    with views(store) as txn:
        check_chain_shape(txn, warm)


def test_linking_onto_a_chain_with_a_gap_is_refused_not_given_a_wrong_skip(tmp_path):
    """A forged segment whose index skips ahead of its base (index 5 right after segment 0)
    leaves its chain without the segment a new skip pointer must name: the append is an
    integrity error, and nothing is written (the old search named segment 0 instead)."""
    import blake3 as _blake3

    from agentcas.cas import framing
    from agentcas.cas.digest import chain_prefix
    from agentcas.cas.objects import Segment
    from agentcas.errors import IntegrityError

    store = Store.memory()
    head, _ = _single_record_chain(store, 1, tag="gap")
    record = b'{"b":2}\n'
    forged = Segment(head, 5, head.segment, 1, len(record), chain_prefix(head.digest, _blake3.blake3(record).digest()),
                     (), record)
    forged_id = forged.digest_id()
    store.source.put_many({forged_id.raw: framing.frame(framing.KIND_SEGMENT, forged.encode())})
    prepared = rollout.prepare(b'{"c":3}\n', lambda digest, framed: store.source.put_many({digest.raw: framed}))
    with pytest.raises(IntegrityError, match="has no segment 4"):
        rollout.link_segments_at(store.source, forged.end(forged_id), prepared, ())
