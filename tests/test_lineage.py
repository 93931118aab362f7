"""Moves on threads through the Store API: fork, revert, diff, lineage, log positions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentcas import Store
from agentcas.api.threads import UNRELATED_NOTE, WORLD_NOTE
from agentcas.errors import ConflictError, NotFound, UsageError
from agentcas.lineage import rollout
from agentcas.lineage.closure import Walker
from agentcas.refs import threads

from support.store_state import views

# The worked replay example of a Codex-style rollout: 25 records, the last turn rolled back.
REPLAY_25 = [
    {"type": "SessionMeta", "thread": "thread-A", "cwd": "/repo"},
    {"type": "TurnStarted", "turn": "fix-login"},
    {"type": "UserMessage", "text": "修复登录超时"},
    {"type": "TurnContext", "model": "model-large", "approval": "on-request"},
    {"type": "WorldState", "full": {"cwd": "/repo", "environment": "local"}},
    {"type": "ResponseItem", "role": "user", "text": "修复登录超时"},
    {"type": "ResponseItem", "role": "assistant", "text": "已修改重试逻辑并通过测试"},
    {"type": "TurnComplete", "turn": "fix-login"},
    {"type": "Compacted", "window": 2, "replacement_history": [
        {"role": "user", "text": "修复登录超时"},
        {"role": "assistant", "text": "摘要：已完成登录超时修复，测试通过"}]},
    {"type": "WorldState", "full": {"cwd": "/repo", "environment": "local"}},
    {"type": "TurnStarted", "turn": "deploy-staging"},
    {"type": "UserMessage", "text": "发布到 staging"},
    {"type": "TurnContext", "model": "model-large", "approval": "on-request"},
    {"type": "WorldState", "patch": {"environment": "staging"}},
    {"type": "ResponseItem", "role": "user", "text": "发布到 staging"},
    {"type": "ResponseItem", "role": "assistant", "tool_call": {"deploy": {"target": "staging"}}},
    {"type": "ResponseItem", "role": "tool", "text": "deployment succeeded"},
    {"type": "ResponseItem", "role": "assistant", "text": "staging 发布完成"},
    {"type": "TurnComplete", "turn": "deploy-staging"},
    {"type": "TurnStarted", "turn": "deploy-production"},
    {"type": "UserMessage", "text": "继续发布 production"},
    {"type": "TurnContext", "model": "model-small", "approval": "never"},
    {"type": "ResponseItem", "role": "assistant", "text": "无法执行需要审批的发布"},
    {"type": "TurnComplete", "turn": "deploy-production"},
    {"type": "ThreadRolledBack", "num_turns": 1},
]
LINES = [json.dumps(r, ensure_ascii=False).encode() + b"\n" for r in REPLAY_25]


def lines(count: int, tag: str, start: int = 0) -> list[bytes]:
    return [json.dumps({"tag": tag, "i": i}).encode() + b"\n" for i in range(start, start + count)]


class Workspace:
    """A directory whose files the tests rewrite between commits."""

    def __init__(self, root: Path):
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def set(self, **files: str) -> Workspace:
        for old in self.root.iterdir():
            old.unlink()
        for name, text in files.items():
            (self.root / name).write_text(text)
        return self


@pytest.fixture
def store():
    return Store.memory()


@pytest.fixture
def ws(tmp_path):
    return Workspace(tmp_path / "ws")


def tables(store: Store) -> dict:
    """A copy of every row (the memory store), pins aside."""
    return {name: dict(rows) for name, rows in store.environment._tables.items() if name != "pins"}


def read(store: Store, rev: str, start: int = 0, stop=None) -> bytes:
    return b"".join(store.history.read(rev, start, stop))


def thread_rows(store: Store, name: str):
    with views(store) as txn:
        return threads.read_thread(txn, name), [e.to_json() for e in threads.read_reflog(txn, name)]


@pytest.fixture
def replay(store, ws):
    """Thread main: the 25 records, checkpoints after the staging turn (19) and at the end (25)."""
    store.history.append("main", b"".join(LINES[:19]))
    staging = store.checkpoints.commit(str(ws.set(**{"plan.md": "staging\n"}).root), "staging deployed", "main").to_json()
    store.history.append("main", b"".join(LINES[19:]))
    end = store.checkpoints.commit(str(ws.set(**{"plan.md": "production refused\n", "log.txt": "x" * 10})
                           .root), "turn rolled back", "main").to_json()
    return staging["checkpoint"], end["checkpoint"]


# --- fork ---------------------------------------------------------------------------------

def test_fork_whole_shares_the_history_and_stores_no_object(store, replay):
    before = tables(store)
    result = store.threads.fork("main", "explore").to_json()
    after = tables(store)
    assert result["seq"] == 25 and result["checkpoint"] == replay[1]
    assert after["objects"] == before["objects"]  # one position, not a copy
    changed = {name for name in after if after[name] != before[name]}
    assert changed <= {"refs", "reflog", "meta"}
    assert read(store, "explore") == b"".join(LINES)
    assert store.threads.get("explore").history == store.threads.get("main").history


def test_fork_at_a_seq_takes_the_prefix_and_newest_checkpoint_before_the_cut(store, replay):
    staging, end = replay
    before = tables(store)["objects"]
    for at, checkpoint in [(24, staging), (19, staging), (25, end), (18, None), (0, None)]:
        result = store.threads.fork("main", f"f{at}", at=at).to_json()
        assert result["seq"] == at
        assert result["checkpoint"] == checkpoint
        assert read(store, f"f{at}") == b"".join(LINES[:at])
        with views(store) as txn:
            position = rollout.History(txn).position(store.threads.get("main").history, at)
        assert store.threads.get(f"f{at}").history == position
    assert tables(store)["objects"] == before
    assert [f["path"] for f in [item.to_json() for item in store.checkpoints.files("f24")]] == ["plan.md"]
    assert store.threads.get("f18").forked_from.to_doc() == {"thread": "main", "seq": 18, "checkpoint": None}


@pytest.mark.parametrize("at, error, message", [
    (26, UsageError, "beyond the end of the history of 'main' (25 records)"),
    (10**12, UsageError, "beyond the end"),
    (-1, UsageError, "must not be negative"),
])
def test_fork_at_out_of_range_changes_nothing(store, replay, at, error, message):
    before = tables(store)
    with pytest.raises(error) as caught:
        store.threads.fork("main", "bad", at=at)
    assert message in str(caught.value)
    assert tables(store) == before


def test_fork_onto_an_existing_thread_is_a_conflict(store, replay):
    store.threads.fork("main", "taken", at=3)
    before = tables(store)
    with pytest.raises(ConflictError, match="already exists"):
        store.threads.fork("main", "taken")
    with pytest.raises(ConflictError):
        store.threads.fork("main", "main", at=1)
    assert tables(store) == before


def test_fork_of_an_unknown_source_is_not_found(store, replay):
    with pytest.raises(NotFound):
        store.threads.fork("nobody", "x")


def test_fork_from_a_checkpoint_takes_its_prefix(store, replay):
    staging, _ = replay
    result = store.threads.fork(staging[:12], "from-cp").to_json()
    assert result["seq"] == 19 and result["checkpoint"] == staging
    assert read(store, "from-cp") == b"".join(LINES[:19])
    assert store.threads.get("from-cp").forked_from.thread == "main"  # the checkpoint's thread
    result = store.threads.fork("main~1", "from-parent", at=5).to_json()
    assert result["seq"] == 5 and result["checkpoint"] is None


def test_fork_of_a_thread_without_checkpoint(store):
    store.history.append("raw", b"".join(lines(4, "raw")))
    result = store.threads.fork("raw", "raw2", at=2).to_json()
    assert result["checkpoint"] is None and read(store, "raw2") == b"".join(lines(2, "raw"))


def test_the_parent_is_untouched_by_what_the_fork_does(store, ws, replay):
    store.threads.fork("main", "child", at=19)
    parent_before = thread_rows(store, "main")
    parent_bytes = read(store, "main")
    store.history.append("child", b"".join(lines(30, "child")))
    store.checkpoints.commit(str(ws.set(**{"plan.md": "child\n"}).root), "child step", "child")
    store.threads.revert("child", replay[0])
    store.history.append("child", b'{"again": true}\n')
    assert thread_rows(store, "main") == parent_before
    assert read(store, "main") == parent_bytes
    assert read(store, "child") == b"".join(LINES[:19]) + b'{"again": true}\n'


def test_forks_of_forks_ten_deep_read_correctly(store, ws):
    model = lines(3, "t0")
    store.history.append("t0", b"".join(model))
    store.checkpoints.commit(str(ws.set(**{"f": "t0"}).root), "t0", "t0")
    for depth in range(1, 11):
        parent, child = f"t{depth - 1}", f"t{depth}"
        cut = len(model) - 1
        store.threads.fork(parent, child, at=cut)
        model = model[:cut] + lines(depth + 2, child)
        store.history.append(child, b"".join(lines(depth + 2, child)))
        store.checkpoints.commit(str(ws.set(**{"f": child}).root), child, child)
    assert read(store, "t10") == b"".join(model)
    for start in range(len(model)):
        assert read(store, "t10", start, start + 2) == b"".join(model[start:start + 2])
    with views(store) as txn:
        assert rollout.History(txn).verify(store.threads.get("t10").history) == len(model)
        list(Walker(txn).checkpoint(store.threads.get("t10").checkpoint))
    chain = []
    node = store.threads.lineage("t0").to_json()["threads"][0]
    while node["children"]:
        node = node["children"][0]
        chain.append((node["thread"], node["forked_from"]["thread"], node["forked_from"]["seq"]))
    assert [c[0] for c in chain] == [f"t{d}" for d in range(1, 11)]
    assert all(parent == f"t{int(name[1:]) - 1}" for name, parent, _ in chain)


# --- revert -------------------------------------------------------------------------------

def test_revert_moves_the_ref_and_later_appends_diverge(store, replay):
    staging, end = replay
    store.history.append("main", b'{"after": "end"}\n')  # appended after the last checkpoint
    result = store.threads.revert("main", staging).to_json()
    assert result["checkpoint"] == staging and result["previous"] == end
    assert result["related"] is True and result["notes"] == [WORLD_NOTE]
    assert result["history"]["seq"] == 19
    assert store.threads.get("main").checkpoint.hex() == staging
    assert read(store, "main") == b"".join(LINES[:19])
    store.history.append("main", b'{"new": "branch"}\n')
    assert read(store, "main") == b"".join(LINES[:19]) + b'{"new": "branch"}\n'
    # The old head stays reachable through the reflog, records appended after its checkpoint included.
    assert store.resolve("main@{2}").hex() == end
    assert read(store, "main@{2}") == b"".join(LINES) + b'{"after": "end"}\n'
    store.threads.create("old", "main@{2}")
    assert read(store, "old") == b"".join(LINES) + b'{"after": "end"}\n'
    store.threads.fork("main@{2}", "old2", at=20)
    assert read(store, "old2") == b"".join(LINES[:20])
    assert store.threads.get("old2").forked_from.to_doc() == {"thread": "main", "seq": 20, "checkpoint": staging}
    assert read(store, end) == b"".join(LINES)  # the checkpoint names its own prefix


def test_revert_to_the_reflog_entry_undoes_a_revert(store, replay):
    staging, end = replay
    store.history.append("main", b'{"after": "end"}\n')
    before = store.threads.get("main")
    store.threads.revert("main", staging)
    result = store.threads.revert("main", "main@{1}").to_json()
    assert result["checkpoint"] == end
    assert store.threads.get("main").history == before.history


def test_stale_expect_is_a_conflict_and_changes_nothing(store, replay):
    staging, end = replay
    before = tables(store)
    with pytest.raises(ConflictError, match="nothing was changed"):
        store.threads.revert("main", staging, expect=staging)
    assert tables(store) == before
    store.threads.revert("main", staging, expect=end)
    assert store.threads.get("main").checkpoint.hex() == staging


def test_revert_to_an_unrelated_thread_is_allowed_and_says_so(store, ws, replay):
    staging, _ = replay
    store.history.append("other", b'{"other": 1}\n')
    other = store.checkpoints.commit(str(ws.set(**{"o": "o"}).root), "other work", "other").to_json()["checkpoint"]
    result = store.threads.revert("main", other).to_json()
    assert result["related"] is False
    assert result["notes"] == [WORLD_NOTE, UNRELATED_NOTE]
    assert read(store, "main") == b'{"other": 1}\n'
    # A fork's checkpoint is related to its parent, and the parent's to the fork.
    store.threads.fork("other", "child")
    child = store.checkpoints.commit(str(ws.set(**{"c": "c"}).root), "child work", "child").to_json()["checkpoint"]
    assert store.threads.revert("other", child).to_json()["related"] is True
    assert store.threads.revert("child", staging).to_json()["related"] is False


def test_revert_of_an_unknown_thread_or_revision(store, replay):
    before = tables(store)
    with pytest.raises(NotFound):
        store.threads.revert("nobody", replay[0])
    with pytest.raises(NotFound):
        store.threads.revert("main", "0123456789abcdef")
    assert tables(store) == before


# --- diff, lineage, log -------------------------------------------------------------------

def test_diff_reports_files_and_records(store, replay):
    staging, end = replay
    d = store.checkpoints.diff(staging, end).to_json()
    assert d["added"] == [{"path": "log.txt", "size": 10}]
    assert d["removed"] == []
    assert d["changed"] == [{"path": "plan.md", "old_size": 8, "new_size": 19}]
    assert d["records"] == {"from_seq": 19, "to_seq": 25, "common": 19, "added": 6,
                            "added_range": [19, 25], "removed": 0, "changed": 0}
    back = store.checkpoints.diff(end, staging).to_json()
    assert back["removed"] == [{"path": "log.txt", "size": 10}]
    assert back["records"]["added"] == 0 and back["records"]["removed"] == 6 and back["records"]["changed"] == 0


def test_diff_of_diverged_histories(store, ws, replay):
    staging, end = replay
    store.threads.fork(staging, "alt")
    store.history.append("alt", b"".join(lines(4, "alt")))
    alt = store.checkpoints.commit(str(ws.set(**{"plan.md": "staging\n"}).root), "alt", "alt").to_json()["checkpoint"]
    d = store.checkpoints.diff(end, alt).to_json()
    assert d["records"] == {"from_seq": 25, "to_seq": 23, "common": 19, "added": 4,
                            "added_range": [19, 23], "removed": 6, "changed": 0}
    assert d["added"] == [] and d["removed"] == [{"path": "log.txt", "size": 10}]
    assert store.checkpoints.diff(alt, alt).to_json()["records"]["added"] == 0


def test_lineage_shows_the_tree_of_forks(store, replay):
    store.threads.fork("main", "a", at=10)
    store.threads.fork("a", "a1", at=4)
    store.threads.fork("main", "b")
    store.history.append("solo", b'{"x": 1}\n')
    doc = store.threads.lineage().to_json()
    assert [t["thread"] for t in doc["threads"]] == ["main", "solo"]
    main = doc["threads"][0]
    assert main["records"] == 25 and main["forked_from"] is None
    assert [(c["thread"], c["forked_from"]["seq"], c["records"]) for c in main["children"]] == \
        [("a", 10, 10), ("b", 25, 25)]
    assert main["children"][0]["children"][0]["thread"] == "a1"
    assert main["children"][0]["children"][0]["forked_from"]["thread"] == "a"
    assert [t["thread"] for t in store.threads.lineage("a").to_json()["threads"]] == ["a"]
    with pytest.raises(NotFound):
        store.threads.lineage("nobody")


def test_lineage_shows_threads_on_a_fork_cycle(store):
    store.history.append("x", b'{"x": 1}\n')
    store.threads.fork("x", "y")
    store.threads.delete("x")
    store.threads.fork("y", "x")  # x (new) is a fork of y, y a fork of the old x
    names = set()
    stack = list(store.threads.lineage().to_json()["threads"])
    while stack:
        node = stack.pop()
        names.add(node["thread"])
        stack.extend(node["children"])
    assert names == {"x", "y"}


def test_log_shows_each_checkpoints_history_position(store, replay):
    staging, end = replay
    entries = [item.to_json() for item in store.threads.log("main")]
    assert [e["checkpoint"] for e in entries] == [end, staging]
    assert [e["history"]["seq"] for e in entries] == [25, 19]
    assert entries[1]["history"]["offset"] == len(b"".join(LINES[:19]))
    with views(store) as txn:
        position = rollout.History(txn).position(store.threads.get("main").history, 19)
    assert entries[1]["history"] == position.to_doc()
