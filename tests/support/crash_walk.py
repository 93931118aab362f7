"""The crash-point walk the crash and fault tests share: scenarios (a base state and the
command to kill), and `Walk`, which runs a command killed at each durable step through the
fork server (support/cli_forks.py) and checks the stores and files after it and after a retry.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from support.cli_forks import CliForks, thread_states

BATCH = "1"
SERVER_ENV = {"AGENTCAS_LMDB_MAP_SIZE": str(64 << 20), "AGENTCAS_CRASH_BATCH": BATCH,
              "AGENTCAS_AUTHOR": "crash@test"}


@pytest.fixture
def memory_tmp(tmp_path):
    """A scratch directory on tmpfs where there is one: a SIGKILL is a process crash, the
    page cache survives it, so the walk needs no fsync to reach the disk (~3x faster)."""
    if not os.access("/dev/shm", os.W_OK):
        yield tmp_path
        return
    path = Path(tempfile.mkdtemp(prefix="agentcas-crash-", dir="/dev/shm"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def forks():
    server = CliForks(SERVER_ENV)
    yield server
    server.close()


def records(count: int, start: int = 0, width: int = 40) -> bytes:
    """JSONL records of varied sizes, so the rollout spans several chunks and segments."""
    return b"".join(json.dumps({"seq": start + i, "type": "message",
                                "text": f"r{start + i}-" + "x" * (width + (i * 37) % 700)}).encode() + b"\n"
                    for i in range(count))


def make_workspace(root: Path, files: int, seed: int, big: int = 0) -> None:
    """`files` small text files in a few directories, plus a `big`-byte multi-chunk file."""
    for i in range(files):
        path = root / f"d{i % 4}" / f"f{i}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"file {i} version {seed}\n" * (1 + i % 9))
    if big:
        rng = __import__("random").Random(seed)
        (root / "big.bin").write_bytes(bytes(rng.getrandbits(8) for _ in range(big)))


@dataclass
class Scenario:
    name: str
    setup: Callable            # setup(forks, W): build the base state at W
    argv: list                 # the command; "{W}" is replaced by the work directory
    backends: tuple = ("store",)  # stores under W whose threads must be old or new
    dest: str | None = None     # a directory the command creates (checkout)
    bundle: str | None = None   # a bundle file the command creates (export)
    retry_ok: tuple = (0,)      # exit codes a retry may give once the command had landed
    same_objects: bool = False  # after the retry, the object count equals the clean run's (gc)
    again: bool = True          # retried even once it landed (not an append: that appends twice)
    steps: bool = False         # moves a ref several times (ingest: a checkpoint per turn), so a
                                # crash may leave any state the command passes through; the
                                # retry must converge to the clean run's
    check: str | None = None    # "module:function(W)" run after the retry; returns a list of problems


def ok(result, *codes):
    assert result.code in (codes or (0,)), result
    return result


def cli(forks, W, *argv, **kw):
    return ok(forks.run(*[str(a).replace("{W}", str(W)) for a in argv], **kw))


# --- scenario set-ups (each runs in W and builds the base state) ---------------------------

def base_store(forks, W, files=8, seed=0, big=0, history=0):
    ok(forks.run("init", W / "store"))
    make_workspace(W / "ws", files, seed, big)
    if history:
        (W / "ws" / "rollout.jsonl").write_bytes(records(history))
        cli(forks, W, "--store", W / "store", "commit", W / "ws", "-m", "base", "--rollout",
            W / "ws" / "rollout.jsonl")
    else:
        cli(forks, W, "--store", W / "store", "commit", W / "ws", "-m", "base")


def setup_commit(forks, W):
    ok(forks.run("init", W / "store"))
    make_workspace(W / "ws", 50, 1, big=300_000)


def setup_commit_many(forks, W):
    base_store(forks, W, files=6, seed=20, history=10)
    for i in range(120):
        path = W / "many" / f"n{i % 13}" / f"t{i}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"i": i}))


def setup_recommit(forks, W):
    base_store(forks, W, files=40, seed=1)
    make_workspace(W / "ws", 40, 2, big=0)  # every file changed


def setup_commit_rollout(forks, W):
    base_store(forks, W, files=10, seed=3, history=40)
    with open(W / "ws" / "rollout.jsonl", "ab") as out:
        out.write(records(200, start=40))
    make_workspace(W / "ws", 12, 4)


def setup_append(forks, W):
    base_store(forks, W, files=4, seed=5, history=30)
    (W / "tail.jsonl").write_bytes(records(4000, start=30, width=300))  # ~2.5 MB: several segments


def setup_fork(forks, W):
    base_store(forks, W, files=4, seed=6, history=50)


def setup_revert(forks, W):
    base_store(forks, W, files=4, seed=7, history=20)
    cli(forks, W, "--store", W / "store", "branch", "first", "main")
    make_workspace(W / "ws", 6, 8)
    cli(forks, W, "--store", W / "store", "commit", W / "ws", "-m", "second")


def setup_delete(forks, W):
    setup_fork(forks, W)
    cli(forks, W, "--store", W / "store", "fork", "main", "side", "--at", "20")


def setup_gc(forks, W):
    base_store(forks, W, files=6, seed=9, history=30)
    for step in range(3):  # garbage: three generations of files on a thread that goes away
        make_workspace(W / "ws2", 25, 100 + step)
        cli(forks, W, "--store", W / "store", "commit", W / "ws2", "-m", f"doomed {step}", "--thread", "doomed")
    cli(forks, W, "--store", W / "store", "rollout", "append", "doomed", W / "ws" / "rollout.jsonl")
    cli(forks, W, "--store", W / "store", "branch", "-d", "doomed")


def setup_import(forks, W):
    base_store(forks, W, files=50, seed=10, history=80)
    cli(forks, W, "--store", W / "store", "export", "main", "-o", W / "main.bundle")
    ok(forks.run("init", W / "other"))
    make_workspace(W / "ws3", 4, 11)
    cli(forks, W, "--store", W / "other", "commit", W / "ws3", "-m", "theirs")


def setup_push(forks, W):
    base_store(forks, W, files=50, seed=12, history=80)
    ok(forks.run("init", W / "remote"))
    cli(forks, W, "--store", W / "store", "remote", "add", "backup", W / "remote")


def setup_pull(forks, W):
    setup_push(forks, W)
    cli(forks, W, "--store", W / "store", "push", "backup", "main")
    make_workspace(W / "ws", 50, 13)
    with open(W / "ws" / "rollout.jsonl", "ab") as out:
        out.write(records(60, start=80))
    cli(forks, W, "--store", W / "remote", "commit", W / "ws", "-m", "on the remote", "--rollout",
        W / "ws" / "rollout.jsonl")


def setup_checkout(forks, W):
    base_store(forks, W, files=120, seed=14, big=200_000)


def setup_export(forks, W):
    base_store(forks, W, files=60, seed=15, history=60)


def setup_ingest_codex(forks, W):
    from support.harness_samples import CodexSession
    ok(forks.run("init", W / "store"))
    session = CodexSession()
    session.turn("fix the login timeout", "fixed", tools=2)
    session.compact()
    session.turn("deploy to staging")
    session.turn("and the docs", tools=0)
    day = W / "sessions" / "2026" / "11" / "30"
    day.mkdir(parents=True)
    (day / f"rollout-2026-11-30T21-30-12-{session.thread_id}.jsonl").write_bytes(session.data())


def setup_ingest_claude(forks, W):
    from support.harness_samples import ClaudeSession
    ok(forks.run("init", W / "store"))
    project = W / "projects" / "-repo"
    (project / "s-1" / "subagents").mkdir(parents=True)
    main = ClaudeSession("s-1")
    main.prompt("one")
    main.say("a")
    main.sidechain("inline task", "inline answer")
    main.prompt("two")
    main.say("b")
    (project / "s-1.jsonl").write_bytes(main.data())
    agent = ClaudeSession("s-1", agent_id="b222")
    agent.prompt("agent task", isSidechain=True)
    (project / "s-1" / "subagents" / "agent-b222.jsonl").write_bytes(agent.data())


INGESTED = {"ingest-codex": {"codex/0199a0b1-0000-7000-8000-000000000001":
                              "sessions/2026/11/30/rollout-2026-11-30T21-30-12-0199a0b1-0000-7000-8000-000000000001.jsonl"},
            "ingest-claude": {"claude/s-1": "projects/-repo/s-1.jsonl",
                              "claude/s-1/agents/b222": "projects/-repo/s-1/subagents/agent-b222.jsonl"}}


def ingested_files_read_back(W, scenario) -> list | None:
    """Problems: each ingested session file whose thread's `rollout cat` differs from it."""
    from agentcas import Store
    store = Store.open(str(Path(W) / "store"))
    problems = []
    for thread, rel in INGESTED[scenario].items():
        data = b"".join(store.history.read(thread))
        if data != (Path(W) / rel).read_bytes():
            problems.append(f"{thread}: rollout cat is {len(data)} bytes, the file {(Path(W) / rel).stat().st_size}")
    return problems or None


SCENARIOS = [
    Scenario("commit", setup_commit, ["--store", "{W}/store", "commit", "{W}/ws", "-m", "first"]),
    Scenario("commit-many", setup_commit_many, ["--store", "{W}/store", "commit", "{W}/many", "-m", "many files",
                                                "--thread", "many"]),
    Scenario("recommit", setup_recommit, ["--store", "{W}/store", "commit", "{W}/ws", "-m", "changed"]),
    Scenario("commit-rollout", setup_commit_rollout,
             ["--store", "{W}/store", "commit", "{W}/ws", "-m", "more", "--rollout", "{W}/ws/rollout.jsonl"]),
    Scenario("rollout-append", setup_append, ["--store", "{W}/store", "rollout", "append", "main", "{W}/tail.jsonl"],
             again=False),
    Scenario("fork", setup_fork, ["--store", "{W}/store", "fork", "main", "explore", "--at", "25"], retry_ok=(3,)),
    Scenario("revert", setup_revert, ["--store", "{W}/store", "revert", "main", "first"]),
    Scenario("branch-d", setup_delete, ["--store", "{W}/store", "branch", "-d", "side"], retry_ok=(1,)),
    Scenario("gc", setup_gc, ["--store", "{W}/store", "gc", "--grace", "0s", "--expire-reflog", "now",
                              "--batch", "1"], same_objects=True),
    Scenario("import", setup_import, ["--store", "{W}/other", "import", "{W}/main.bundle", "--as", "theirs",
                                      "--allow-unsigned"], backends=("other",)),
    Scenario("push", setup_push, ["--store", "{W}/store", "push", "backup", "main"], backends=("store", "remote")),
    Scenario("pull", setup_pull, ["--store", "{W}/store", "pull", "backup", "main"], backends=("store", "remote")),
    Scenario("checkout", setup_checkout, ["--store", "{W}/store", "checkout", "main", "{W}/out"], dest="out"),
    Scenario("export", setup_export, ["--store", "{W}/store", "export", "main", "-o", "{W}/out.bundle"],
             bundle="out.bundle"),
    Scenario("ingest-codex", setup_ingest_codex, ["--store", "{W}/store", "ingest", "codex", "{W}/sessions"],
             steps=True, check="support.crash_walk:ingested_files_read_back"),
    Scenario("ingest-claude", setup_ingest_claude, ["--store", "{W}/store", "ingest", "claude", "{W}/projects"],
             steps=True, check="support.crash_walk:ingested_files_read_back"),
]


# --- the walk ---------------------------------------------------------------------------------

def content_of(states: dict) -> dict:
    """What each thread holds (tree, reason, history, origin), not how often it was made."""
    return {path: {name: {k: v for k, v in state.items() if k != "parents"} for name, state in threads.items()}
            for path, threads in states.items()}


class Walk:
    def __init__(self, forks: CliForks, scenario: Scenario, tmp: Path):
        self.forks, self.s = forks, scenario
        self.W = tmp / "w"      # every run happens here (remotes record absolute paths)
        self.base = tmp / "base"
        self.W.mkdir()
        scenario.setup(forks, self.W)
        used = " ".join(scenario.argv + ["{W}/" + name for name in scenario.backends])
        for entry in os.listdir(self.W):  # what only the set-up needed is not copied per point
            if "{W}/" + entry not in used:
                shutil.rmtree(self.W / entry) if (self.W / entry).is_dir() else os.unlink(self.W / entry)
        os.rename(self.W, self.base)
        self.argv = [a.replace("{W}", str(self.W)) for a in scenario.argv]
        self.backends = [str(self.W / name) for name in scenario.backends]
        self.dest = str(self.W / scenario.dest) if scenario.dest else None
        self.bundle = str(self.W / scenario.bundle) if scenario.bundle else None

    def reset(self) -> None:
        if self.W.exists():
            shutil.rmtree(self.W)
        shutil.copytree(self.base, self.W, symlinks=True)

    def observe(self) -> dict:
        return ok(self.forks.call("support.cli_forks:observe_all", self.backends, self.dest, self.bundle)).value

    def assert_clean(self, doc: dict, point: str) -> None:
        for path, store in doc["stores"].items():
            assert store["ok"], f"{self.s.name} {point}: fsck of {path}: {store['problems']}"

    def run(self, every: int = 1) -> int:
        """Walk points 1, 1 + every, ... and the last; the number of points walked."""
        self.reset()
        old = self.observe()
        count_file = self.W.parent / "count"
        ok(self.forks.run(*self.argv, env={"AGENTCAS_CRASH_COUNT": str(count_file)}))
        labels = count_file.read_text().split()
        new = self.observe()
        self.assert_clean(new, "clean run")
        assert labels, f"{self.s.name}: no durable step counted"
        old_states, new_states = thread_states(old), thread_states(new)
        numbers = sorted(set(range(1, len(labels) + 1, every)) | {len(labels)})
        for number in numbers:
            point = f"point {number}/{len(labels)} ({labels[number - 1]})"
            self.reset()
            killed = self.forks.run(*self.argv, env={"AGENTCAS_CRASH_AT": str(number)})
            assert killed.code == -9, f"{self.s.name} {point}: not killed: {killed}"
            checked = ok(self.forks.call("support.cli_forks:observe_retry_observe", self.backends, self.argv, self.dest,
                                         self.bundle, None if self.s.again else new_states))
            after, retry, final = checked.value["after"], checked.value["retry"], checked.value["final"]
            self.assert_clean(after, point)
            landed = self.s.steps or self.check_old_or_new(after, old_states, new_states, new, point)
            if retry is not None:
                allowed = (0,) + self.s.retry_ok if landed else (0,)
                assert retry["code"] in allowed or (landed and (self.dest or self.bundle)), \
                    f"{self.s.name} {point}: retry exit {retry['code']}: {checked.err[-500:]}"
            self.assert_clean(final, point + " after the retry")
            assert content_of(thread_states(final)) == content_of(new_states), f"{self.s.name} {point}: retry"
            if self.s.same_objects:
                assert [s["objects"] for s in final["stores"].values()] == \
                    [s["objects"] for s in new["stores"].values()], f"{self.s.name} {point}: gc retry"
            for name in ("dest", "bundle"):
                assert final.get(name) == new.get(name), f"{self.s.name} {point}: {name} after the retry"
            if self.s.check:
                problems = ok(self.forks.call(self.s.check, str(self.W), self.s.name)).value
                assert problems is None, f"{self.s.name} {point}: {problems}"
        print(f"{self.s.name}: {len(numbers)} of {len(labels)} points: " + " ".join(
            f"{label} x{labels.count(label)}" for label in sorted(set(labels))))
        return len(numbers)

    def check_old_or_new(self, after: dict, old: dict, new: dict, new_doc: dict, point: str) -> bool:
        """Each store's threads are exactly old or exactly new, files absent or whole; landed?"""
        got = thread_states(after)
        landed = []
        for path in got:
            assert got[path] in (old[path], new[path]), \
                f"{self.s.name} {point}: {path} is neither old nor new: {json.dumps(got[path])[:800]}"
            landed.append(got[path] == new[path] and got[path] != old[path])
        for name in ("dest", "bundle"):
            if name in after:
                assert after[name] in (None, new_doc[name]), f"{self.s.name} {point}: {name} half-written"
                landed.append(after[name] is not None)
        return any(landed)
