"""Crash points: every command killed (SIGKILL) at every durable step leaves a store that
fsck passes, each ref old or new (never anything else), and a retry that succeeds.

Each scenario builds a base state once (real CLI runs), counts the command's durable
steps (AGENTCAS_CRASH_COUNT), then for every point N: copies the base to the same path,
runs the command with AGENTCAS_CRASH_AT=N (it must die by SIGKILL), observes the stores
(fsck + every thread's state) and the files it writes (DEST, a bundle), retries the
command, and observes again. Runs go through the fork server (cli_forks.py): the real
click entry point in a fresh process, without paying the interpreter start each time.
AGENTCAS_CRASH_BATCH=3 makes every batch writer land 3 objects per transaction, so
small inputs take many steps. `-m crash` selects these tests; the total is printed.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest

from cli_forks import CliForks
from conftest import AGENTCAS, run_cli, tree_bytes

pytestmark = pytest.mark.crash

BATCH = "3"
SERVER_ENV = {"AGENTCAS_LMDB_MAP_SIZE": str(64 << 20), "AGENTCAS_CRASH_BATCH": BATCH,
              "AGENTCAS_AUTHOR": "crash@test"}


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
    stores: tuple = ("store",)  # stores under W whose threads must be old or new
    dest: str | None = None     # a directory the command creates (checkout)
    bundle: str | None = None   # a bundle file the command creates (export)
    retry_ok: tuple = (0,)      # exit codes a retry may give once the command had landed
    same_objects: bool = False  # after the retry, the object count equals the clean run's (gc)
    again: bool = True          # retried even once it landed (not an append: that appends twice)
    stdin: str | None = None
    notes: list = field(default_factory=list)


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
    make_workspace(W / "ws", 60, 1, big=300_000)


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
    base_store(forks, W, files=90, seed=14, big=200_000)


def setup_export(forks, W):
    base_store(forks, W, files=60, seed=15, history=60)


SCENARIOS = [
    Scenario("commit", setup_commit, ["--store", "{W}/store", "commit", "{W}/ws", "-m", "first"]),
    Scenario("recommit", setup_recommit, ["--store", "{W}/store", "commit", "{W}/ws", "-m", "changed"]),
    Scenario("commit-rollout", setup_commit_rollout,
             ["--store", "{W}/store", "commit", "{W}/ws", "-m", "more", "--rollout", "{W}/ws/rollout.jsonl"]),
    Scenario("rollout-append", setup_append, ["--store", "{W}/store", "rollout", "append", "main", "{W}/tail.jsonl"],
             again=False),
    Scenario("fork", setup_fork, ["--store", "{W}/store", "fork", "main", "explore", "--at", "25"], retry_ok=(3,)),
    Scenario("revert", setup_revert, ["--store", "{W}/store", "revert", "main", "first"]),
    Scenario("branch-d", setup_delete, ["--store", "{W}/store", "branch", "-d", "side"], retry_ok=(1,)),
    Scenario("gc", setup_gc, ["--store", "{W}/store", "gc", "--grace", "0s", "--expire-reflog", "now",
                              "--batch", "2"], same_objects=True),
    Scenario("import", setup_import, ["--store", "{W}/other", "import", "{W}/main.bundle", "--as", "theirs",
                                      "--allow-unsigned"], stores=("other",)),
    Scenario("push", setup_push, ["--store", "{W}/store", "push", "backup", "main"], stores=("store", "remote")),
    Scenario("pull", setup_pull, ["--store", "{W}/store", "pull", "backup", "main"], stores=("store", "remote")),
    Scenario("checkout", setup_checkout, ["--store", "{W}/store", "checkout", "main", "{W}/out"], dest="out"),
    Scenario("export", setup_export, ["--store", "{W}/store", "export", "main", "-o", "{W}/out.bundle"],
             bundle="out.bundle"),
]


# --- the walk ---------------------------------------------------------------------------------

def threads_of(observed: dict) -> dict:
    """Thread states without checkpoint ids (a re-made checkpoint has a new time, so a new id)."""
    return {name: {k: v for k, v in state.items() if k != "checkpoint"}
            for name, state in observed["threads"].items()}


def content_of(observed: dict) -> dict:
    """What a thread holds (tree, reason, history, origin), not how many times it was made."""
    return {name: {k: v for k, v in state.items() if k not in ("checkpoint", "parents")}
            for name, state in observed["threads"].items()}


class Walk:
    def __init__(self, forks: CliForks, scenario: Scenario, tmp: Path):
        self.forks, self.s = forks, scenario
        self.W = tmp / "w"      # every run happens here (remotes record absolute paths)
        self.base = tmp / "base"
        self.W.mkdir()
        scenario.setup(forks, self.W)
        os.rename(self.W, self.base)

    def reset(self) -> None:
        if self.W.exists():
            shutil.rmtree(self.W)
        shutil.copytree(self.base, self.W, symlinks=True)

    def command(self, env=None):
        return self.forks.run(*[a.replace("{W}", str(self.W)) for a in self.s.argv], env=env,
                              stdin=self.s.stdin)

    def observe(self) -> dict:
        doc = {}
        for name in self.s.stores:
            result = ok(self.forks.call("cli_forks:observe", str(self.W / name)))
            doc[name] = result.value
        if self.s.dest:
            dest = self.W / self.s.dest
            doc["dest"] = tree_bytes(dest) if dest.exists() else None
        if self.s.bundle:
            path = self.W / self.s.bundle
            doc["bundle"] = ok(self.forks.call("cli_forks:check_bundle_file", str(path))).value \
                if path.exists() else None
        return doc

    def assert_clean(self, doc: dict, point: str) -> None:
        for name in self.s.stores:
            assert doc[name]["ok"], f"{self.s.name} {point}: fsck of {name}: {doc[name]['problems']}"

    def run(self) -> int:
        self.reset()
        old = self.observe()
        count_file = self.W.parent / "count"
        ok(self.command(env={"AGENTCAS_CRASH_COUNT": str(count_file)}))
        labels = count_file.read_text().split()
        new = self.observe()
        self.assert_clean(new, "clean run")
        assert labels, f"{self.s.name}: no durable step counted"
        for number in range(1, len(labels) + 1):
            point = f"point {number}/{len(labels)} ({labels[number - 1]})"
            self.reset()
            killed = self.command(env={"AGENTCAS_CRASH_AT": str(number)})
            assert killed.code == -9, f"{self.s.name} {point}: not killed: {killed}"
            after = self.observe()
            self.assert_clean(after, point)
            landed = self.check_old_or_new(after, old, new, point)
            if landed and not self.s.again:
                continue
            retry = self.command()
            if landed and self.s.dest is None and self.s.bundle is None:
                assert retry.code in (0,) + self.s.retry_ok, f"{self.s.name} {point}: retry: {retry}"
            elif not landed:
                assert retry.code == 0, f"{self.s.name} {point}: retry: {retry}"
            final = self.observe()
            self.assert_clean(final, point + " after the retry")
            for name in self.s.stores:
                assert content_of(final[name]) == content_of(new[name]), f"{self.s.name} {point}: retry"
                if self.s.same_objects:
                    assert final[name]["objects"] == new[name]["objects"], f"{self.s.name} {point}: gc retry"
            if self.s.dest:
                assert final["dest"] == new["dest"], f"{self.s.name} {point}: checkout retry"
            if self.s.bundle:
                assert final["bundle"] == new["bundle"], f"{self.s.name} {point}: export retry"
        print(f"{self.s.name}: {len(labels)} points: " + " ".join(
            f"{label} x{labels.count(label)}" for label in sorted(set(labels))))
        return len(labels)

    def check_old_or_new(self, after: dict, old: dict, new: dict, point: str) -> bool:
        """Each store's threads are exactly old or exactly new, and files absent or whole; landed?"""
        landed = []
        for name in self.s.stores:
            got = threads_of(after[name])
            assert got in (threads_of(old[name]), threads_of(new[name])), \
                f"{self.s.name} {point}: {name} is neither old nor new: {json.dumps(got)[:800]}"
            landed.append(got == threads_of(new[name]) and got != threads_of(old[name]))
        if self.s.dest:
            assert after["dest"] in (None, new["dest"]), f"{self.s.name} {point}: DEST half-written"
            landed.append(after["dest"] is not None)
        if self.s.bundle:
            assert after["bundle"] in (None, new["bundle"]), f"{self.s.name} {point}: bundle half-written"
            landed.append(after["bundle"] is not None)
        return any(landed)


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_every_crash_point(forks, scenario, tmp_path, record_property):
    points = Walk(forks, scenario, tmp_path).run()
    record_property("crash_points", points)  # summed and printed by conftest's summary


def test_crash_switch_in_the_installed_command(tmp_path, workspace):
    """The real `agentcas` executable: counting writes the labels; CRASH_AT kills at that step."""
    store = tmp_path / "store"
    assert run_cli("init", store).code == 0
    count = tmp_path / "count"
    assert run_cli("commit", workspace, "-m", "x", store=store,
                   env={"AGENTCAS_CRASH_COUNT": str(count)}).code == 0
    labels = count.read_text().split()
    assert labels[-2:] == ["store.open", "store.commit"]
    killed = run_cli("commit", workspace, "-m", "y", store=store,
                     env={"AGENTCAS_CRASH_AT": "store.open:1"})
    assert killed.code == -9 and killed.err == ""
    assert run_cli("fsck", store=store).code == 0
    log = run_cli("--json", "log", store=store).json()
    assert [e["reason"] for e in log] == ["x"]  # killed with the write open: nothing landed
    assert AGENTCAS  # the installed command, not the fork server

