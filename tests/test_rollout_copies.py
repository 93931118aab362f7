"""Copied records: a Codex fork's copy of its parent stored once (lineage/rollout.py RecordCopy,
prepare_with_copies), read back byte for byte, checked, kept by gc, carried by bundles."""

from __future__ import annotations

import json

import blake3
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentcas import Store
from agentcas.api.history import SessionAppend
from agentcas.cas import framing
from agentcas.cas.digest import chain_prefix
from agentcas.cas.objects import EMPTY_POSITION, InvalidObject, RecordCopy, Segment
from agentcas.errors import IntegrityError
from agentcas.lineage import rollout
from agentcas.lineage.rollout import CopyClaim, History
from agentcas.refs import threads

from support import raw_objects
from support.cli import run_cli
from support.harness_machine import Machine
from support.harness_samples import CodexSession, dumps

PARENT_ID = "0199a0b1-aaaa-7000-8000-000000000001"
CHILD_ID = "0199a0b1-bbbb-7000-8000-000000000002"
PARENT, CHILD = f"codex/{PARENT_ID}", f"codex/{CHILD_ID}"


def noise(seed: str, size: int = 6000) -> str:
    """Text zstd cannot shrink much (a tool's output), the same for the same seed."""
    return blake3.blake3(seed.encode()).hexdigest(length=size // 2)


def parent_session(turns: int = 6) -> tuple[CodexSession, list[int]]:
    """A Codex session with tool outputs long enough to copy, and its line count after each turn."""
    s = CodexSession(PARENT_ID, cwd="/repo")
    ends = []
    for n in range(turns):
        turn = s.start(prompt=f"step {n}: make it faster")
        s.tool_call(command=f"pytest -q -k t{n}", output=noise(f"{n}") + " passed")
        s.reply(f"step {n} done")
        s.complete(turn)
        ends.append(len(s.lines))
    return s, ends


def fork_of(parent: CodexSession, copied: int) -> CodexSession:
    child = CodexSession(CHILD_ID, cwd="/repo", forked_from=parent.thread_id)
    child.copy_lines(parent, copied)   # records as they were, new timestamps
    turn = child.start(prompt="a new direction")
    child.tool_call(command="pytest -q", output=noise("child"))
    child.reply("done differently")
    child.complete(turn)
    return child


def session_path(home, session: CodexSession):
    path = home / ".codex" / "sessions" / "2026" / "11" / "30" / f"rollout-2026-11-30T10-00-00-{session.thread_id}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def copy_segments(store: Store, thread: str) -> list[Segment]:
    """The segments on `thread`'s own chain that copy records."""
    history, found = History(store.source), []
    current = store.threads.get(thread).history.segment
    while current is not None:
        segment = history.segment(current)
        if segment.copy is not None:
            found.append(segment)
        current = segment.base.segment
    return found


def cat(machine: Machine, thread: str) -> bytes:
    store = Store.open(str(machine.store))
    try:
        return b"".join(store.history.read(thread))
    finally:
        store.close()


def hook_session(m: Machine, session: CodexSession, ends: list[int]) -> None:
    """A session captured as Codex runs it: `agentcas hook codex` after each turn."""
    path = session_path(m.home, session)
    for number, end in enumerate(ends):
        path.write_bytes(b"".join(session.lines[:end]))
        payload = {"type": "agent-turn-complete", "thread-id": session.thread_id, "turn-id": f"t{number}",
                   "cwd": str(m.ws), "input-messages": [], "last-assistant-message": "done"}
        r = m.run("hook", "codex", json.dumps(payload))
        assert r.code == 0, r


@pytest.fixture(params=["whole", "hooks", "fork-by-hook"])
def forked(request, tmp_path):
    """A machine whose store holds a parent (ingested whole, or captured turn by turn by the
    hook) and its Codex fork copying 80% of it (ingested, or captured by the hook at the end
    of its first turn)."""
    m = Machine(tmp_path)
    assert m.run("init", m.store).code == 0
    parent, ends = parent_session()
    if request.param != "whole":
        hook_session(m, parent, ends)
    else:
        path = session_path(m.home, parent)
        path.write_bytes(parent.data())
        assert m.run("ingest", "codex", path).code == 0
    copied = int(len(parent.lines) * 0.8)
    child = fork_of(parent, copied)
    if request.param == "fork-by-hook":
        hook_session(m, child, [len(child.lines)])
    else:
        path = session_path(m.home, child)
        path.write_bytes(child.data())
        r = m.run("--json", "ingest", "codex", path)
        assert r.code == 0 and r.json()["files"][0]["status"] == "ingested", r
    tree = m.run("--json", "lineage").json()["threads"]
    assert tree[0]["thread"] == PARENT and tree[0]["children"][0]["thread"] == CHILD
    assert tree[0]["children"][0]["forked_from"]["seq"] == copied
    return m, parent, child, copied


def test_a_fork_stores_its_copy_as_copies_and_reads_back_byte_for_byte(forked, tmp_path):
    m, parent, child, copied = forked
    assert cat(m, CHILD) == child.data()
    again = m.run("--json", "ingest", "codex", session_path(m.home, child))   # after hooks too: nothing to add
    assert again.code == 0 and again.json()["appended"] == 0, again
    store = Store.open(str(m.store))
    copies = copy_segments(store, CHILD)
    assert sum(segment.count for segment in copies) == copied
    assert all(head.startswith(b'{"timestamp":"') for segment in copies for head in segment.copy.heads)
    assert store.gc.fsck().to_json()["ok"]
    store.close()
    # resume on another machine writes the fork file byte for byte, from the copies
    other = Machine(tmp_path, "b")
    r = other.run("--json", "resume", CHILD, env={"AGENTCAS_STORE": str(m.store)})
    assert r.code == 0, r
    assert open(r.json()["session"]["path"], "rb").read() == child.data()
    # each turn's checkpoint cut inside the copy reads back as the file's prefix
    log = m.run("--json", "log", CHILD).json()["checkpoints"]
    store = Store.open(str(m.store))
    for entry in log:
        seq = entry["history"]["seq"]
        assert b"".join(store.history.read(entry["checkpoint"])) == b"".join(child.lines[:seq])
    store.close()


def test_a_fork_costs_what_it_adds(tmp_path):
    """Beside its parent, the fork stores less than half of what it costs alone (its own
    turns and its checkpoints, one a turn, the copied turns' included)."""
    def object_bytes(path) -> int:
        store = Store.open(str(path))
        try:
            return sum(info.size for info in store.backends.source.blobs.list())
        finally:
            store.close()

    m = Machine(tmp_path)
    assert m.run("init", m.store).code == 0
    parent, _ = parent_session(12)
    child = fork_of(parent, int(len(parent.lines) * 0.9))
    parent_path, child_path = session_path(m.home, parent), session_path(m.home, child)
    parent_path.write_bytes(parent.data())
    child_path.write_bytes(child.data())
    assert m.run("ingest", "codex", parent_path).code == 0
    before = object_bytes(m.store)
    assert m.run("ingest", "codex", child_path).code == 0
    beside = object_bytes(m.store) - before
    alone = tmp_path / "alone"
    assert run_cli("init", alone).code == 0
    assert run_cli("ingest", "codex", child_path, store=alone).code == 0
    assert beside * 2 < object_bytes(alone)


def test_gc_keeps_what_a_fork_copies_after_its_parent_is_deleted(forked):
    m, parent, child, _ = forked
    assert m.run("branch", "-d", PARENT).code == 0
    r = m.run("--json", "gc", "--grace", "0s", "--expire-reflog", "now")
    assert r.code == 0, r
    assert cat(m, CHILD) == child.data()
    assert m.run("fsck").code == 0
    store = Store.open(str(m.store))
    assert PARENT not in store.threads.names()
    store.close()


def test_a_bundle_of_the_fork_alone_carries_what_it_copies(forked, tmp_path):
    m, parent, child, _ = forked
    bundle = tmp_path / "fork.bundle"
    r = m.run("export", CHILD, "-o", bundle)
    assert r.code == 0, r
    other = tmp_path / "other"
    assert run_cli("init", other).code == 0
    r = run_cli("import", bundle, "--allow-unsigned", store=other)
    assert r.code == 0, r
    store = Store.open(str(other))
    assert store.threads.names() == {CHILD}
    assert b"".join(store.history.read(CHILD)) == child.data()
    assert store.gc.fsck().to_json()["ok"]
    store.close()


def test_an_edited_copy_is_stored_as_bytes(tmp_path):
    """A copied line whose bytes differ from the parent's (its payload re-ordered, so it still
    counts as copied; or changed) is stored as bytes; the lines around it stay copies."""
    m = Machine(tmp_path)
    assert m.run("init", m.store).code == 0
    parent, _ = parent_session()
    child = CodexSession(CHILD_ID, cwd="/repo", forked_from=PARENT_ID)
    child.copy_lines(parent)
    edited = len(child.lines) // 2
    doc = json.loads(child.lines[edited])
    child.lines[edited] = dumps({"type": doc["type"], "timestamp": doc["timestamp"], "payload": doc["payload"]})
    changed = next(n for n in range(edited + 3, len(child.lines)) if b"passed" in child.lines[n])
    child.lines[changed] = child.lines[changed].replace(b"passed", b"FAILED")
    child.turn("more")
    for session in (parent, child):
        session_path(m.home, session).write_bytes(session.data())
    assert m.run("ingest", "codex", session_path(m.home, parent)).code == 0
    assert m.run("ingest", "codex", session_path(m.home, child)).code == 0
    assert cat(m, CHILD) == child.data()
    store = Store.open(str(m.store))
    copies = copy_segments(store, CHILD)
    copied = sum(segment.count for segment in copies)
    assert 0 < copied < len(parent.lines) - 1
    for segment in copies:   # the edited lines are in no copy segment
        assert not segment.base.seq <= edited < segment.base.seq + segment.count
        assert segment.base.seq + segment.count <= changed
    assert any(segment.base.seq + segment.count == edited for segment in copies)
    assert any(segment.base.seq == edited + 1 for segment in copies)
    assert store.gc.fsck().to_json()["ok"]
    store.close()


def _claimed_store(records: list[bytes], copies: list[bytes]) -> tuple[Store, list]:
    """A store with `records` on thread "parent", then `copies` appended to "child" claimed
    to copy all of them (after the child's first line); the child's new segments."""
    store = Store.memory()
    store.history.ingest([SessionAppend("parent", b"".join(records))])
    head = store.threads.get("parent").history
    store.history.ingest([SessionAppend("child", b"".join(copies), copies=CopyClaim(head, 1, len(records)))])
    return store, copy_segments(store, "child")


STAMP = b'{"timestamp":"2026-11-30T10:00:%02d.000Z","type":"response_item","payload":'


def test_a_claim_whose_source_is_gone_stores_the_lines_as_bytes(tmp_path):
    """The parent's records deleted between the claim and the append (its thread deleted, a
    gc): the fork's lines are stored as bytes, whole."""
    store, _ = Store.init(str(tmp_path / "store"))
    records = [STAMP % n + json.dumps({"text": "v" * 2000, "n": n}).encode() + b"}\n" for n in range(4)]
    store.history.ingest([SessionAppend("parent", b"".join(records))])
    head = store.threads.get("parent").history
    store.environment.write(lambda txn: raw_objects.edit(txn, head.segment.raw, lambda value: None))
    copies = [r.replace(b"10:00:", b"11:00:") for r in records]
    store.history.ingest([SessionAppend("fork", b"".join(copies), copies=CopyClaim(head, 0, 4))])
    assert copy_segments(store, "fork") == []
    assert b"".join(store.history.read("fork")) == b"".join(copies)
    store.close()


def test_a_lying_copy_is_refused_by_fsck_and_import(tmp_path):
    """A planted segment whose copy rebuilds other bytes than its digest and length state is
    reported by fsck and refused by pull, nothing written."""
    store, _ = Store.init(str(tmp_path / "src"))
    records = [STAMP % n + json.dumps({"text": "x" * 2000, "n": n}).encode() + b"}\n" for n in range(4)]
    store.history.ingest([SessionAppend("parent", b"".join(records))])
    head = store.threads.get("parent").history
    heads = tuple(STAMP[:STAMP.index(b'"', 14) + 1] % (n + 30) for n in range(4))
    rebuilt = [h + r[rollout.record_head(r, 0, len(r)):] for h, r in zip(heads, records)]
    digest = EMPTY_POSITION.digest
    for record in rebuilt[:3] + [rebuilt[3].replace(b"xxx", b"yyy")]:   # a digest of other bytes
        digest = chain_prefix(digest, blake3.blake3(record).digest())
    lying = Segment(EMPTY_POSITION, 0, None, 4, sum(map(len, rebuilt)), digest, (), copy=RecordCopy(head, heads))
    seg_id = lying.digest_id()

    def land(txn):
        raw_objects.plant(txn, seg_id.raw, framing.frame(framing.KIND_SEGMENT, lying.encode()))
        threads.set_if_equals(txn, "lying", None, threads.ThreadState(None, lying.end(seg_id)), "test", "planted")

    store.environment.write(land)
    store.close()
    r = run_cli("fsck", store=tmp_path / "src")
    assert r.code == 4 and seg_id.hex() in r.out, r
    assert run_cli("init", tmp_path / "dst").code == 0
    assert run_cli("remote", "add", "them", tmp_path / "src", store=tmp_path / "dst").code == 0
    pulled = run_cli("pull", "them", "lying", store=tmp_path / "dst")
    assert pulled.code == 4 and "does not match its bytes" in pulled.err, pulled
    dst = Store.open(str(tmp_path / "dst"))
    assert dst.threads.names() == set()
    dst.close()


def test_a_copy_states_one_head_per_record_and_no_bytes_of_its_own():
    head = Store.memory()
    position = EMPTY_POSITION
    with pytest.raises(InvalidObject):
        RecordCopy(position, (b"",))            # nothing to copy from
    head.history.append("t", b'{"a":1}\n{"a":2}\n')
    source = head.threads.get("t").history
    with pytest.raises(InvalidObject):
        RecordCopy(source, (b"", b"", b""))      # more records than the source has
    with pytest.raises(InvalidObject):
        RecordCopy(source, (b"a\nb",))
    copy = RecordCopy(source, (b"", b""))
    with pytest.raises(InvalidObject):
        Segment(EMPTY_POSITION, 0, None, 3, 16, source.digest, (), copy=copy)   # count != heads
    with pytest.raises(InvalidObject):
        Segment(EMPTY_POSITION, 0, None, 2, 16, source.digest, (), b"x" * 16, copy=copy)
    segment = Segment(EMPTY_POSITION, 0, None, 2, 16, source.digest, (), copy=copy)
    assert Segment.decode(segment.encode()) == segment
    assert History(head.source).copied_bytes(segment) == b'{"a":1}\n{"a":2}\n'


def test_a_secret_in_copied_records_is_found_in_the_copy(forked):
    """The scan of outgoing history reads a copy segment's records as rebuilt."""
    from agentcas.exchange.secret_scan import segment_findings
    m, parent, child, copied = forked
    store = Store.open(str(m.store))
    head = store.threads.get(PARENT).history
    secret = b'{"timestamp":"2026-11-30T10:00:00.000Z","type":"response_item","payload":' \
             b'{"output":"AKIAIOSFODNN7EXAMPLQ ' + b"x" * 2000 + b'"}}\n'
    store.history.ingest([SessionAppend("leaky", secret)])
    source = store.threads.get("leaky").history
    again = secret.replace(b"10:00:00", b"11:00:00")
    store.history.ingest([SessionAppend("copier", again, copies=CopyClaim(source, 0, 1))])
    segment_id = store.threads.get("copier").history.segment
    assert History(store.source).segment(segment_id).copy is not None
    found = segment_findings(store.source, [segment_id], "copier")
    assert [(f.thread, f.seq) for f in found] == [("copier", 0)]
    assert head.seq == len(parent.lines)
    store.close()


def test_copies_nest_at_most_max_copy_depth_deep(monkeypatch):
    """A fork of a fork of ... copies while its source is at most MAX_COPY_DEPTH - 1 copies
    deep, then stores bytes; a read of copies nested deeper than a reader follows is refused."""
    monkeypatch.setattr(rollout, "MAX_COPY_DEPTH", 3)
    store = Store.memory()
    records = [STAMP % n + json.dumps({"text": "y" * 1500, "n": n}).encode() + b"}\n" for n in range(3)]
    store.history.ingest([SessionAppend("g0", b"".join(records))])
    depths = []
    for generation in range(1, 6):
        source = store.threads.get(f"g{generation - 1}").history
        stamped = [STAMP[:STAMP.index(b'"', 14) + 1] % generation + r[rollout.record_head(r, 0, len(r)):]
                   for r in records]
        store.history.ingest([SessionAppend(f"g{generation}", b"".join(stamped),
                                            copies=CopyClaim(source, 0, len(records)))])
        assert b"".join(store.history.read(f"g{generation}")) == b"".join(stamped)
        depths.append(bool(copy_segments(store, f"g{generation}")))
    assert depths == [True, True, True, False, True]
    monkeypatch.setattr(rollout, "MAX_COPY_DEPTH", 2)
    with pytest.raises(IntegrityError, match="copies deep"):
        b"".join(History(store.source).read(store.threads.get("g3").history))


line = st.builds(lambda stamp, body: b'{"timestamp":"%s"' % stamp + body + b"\n",
                 st.from_regex(rb"\A[0-9:TZ.-]{0,30}\Z"),
                 st.binary(min_size=0, max_size=1500).map(lambda b: b.replace(b"\n", b" ")))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records=st.lists(line, min_size=1, max_size=12),
       edits=st.lists(st.tuples(st.integers(0, 11), st.sampled_from(["stamp", "body", "same", "raw"])),
                      max_size=6),
       claim_start=st.integers(0, 2), first=st.integers(0, 2))
def test_copies_read_back_the_appended_bytes_and_check_out(records, edits, claim_start, first):
    """Whatever the claim, and whichever claimed lines differ from their source, the history
    holds the appended lines byte for byte, and every new segment checks out."""
    store = Store.memory()
    store.history.ingest([SessionAppend("parent", b"".join(records))])
    head = store.threads.get("parent").history
    lines = [b'{"own":%d}\n' % n for n in range(first)] + list(records[claim_start:])
    for at, how in edits:
        at = first + at % max(1, len(lines) - first) if len(lines) > first else 0
        if at >= len(lines):
            continue
        if how == "stamp":
            lines[at] = b'{"timestamp":"new"' + lines[at][rollout.record_head(lines[at], 0, len(lines[at])):]
        elif how == "body":
            lines[at] = lines[at][:-1] + b"!\n"
        elif how == "raw":
            lines[at] = b"not json at all\n"
    data = b"".join(lines)
    store.history.ingest([SessionAppend("child", data, copies=CopyClaim(head, first, len(records), claim_start))])
    assert b"".join(store.history.read("child")) == data
    history = History(store.source)
    current = store.threads.get("child").history
    history.verify(current)
    segment_id = current.segment
    while segment_id is not None:
        segment = history.segment(segment_id)
        history.check_segment(segment_id, segment)
        segment_id = segment.base.segment
    assert store.gc.fsck().to_json()["ok"]


if __name__ == "__main__":  # pragma: no cover
    import sys
    sys.exit(pytest.main([__file__]))
