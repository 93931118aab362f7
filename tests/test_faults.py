"""Faults: a full disk, an I/O error or a read-only store at any write step gives a clear
error (exit 1, one line, no traceback) and leaves the store fsck-clean and as it was.

Two kinds of fault:
- injected (AGENTCAS_FAULT_AT=N, AGENTCAS_FAULT=EIO|ENOSPC): the N-th durable step of a
  crash-walk scenario fails, raised as that step's real code would see it (py-lmdb's
  `mdb_txn_commit: Input/output error` for a commit; OSError for a file write);
- real: a small tmpfs (`mount -t tmpfs -o size=...`, we are root in the test VM) filled
  to every few KiB below what a command needs, a read-only bind mount, `chmod a-w`,
  and gc on a completely full disk. Skipped where mount is not permitted.
The message tests check the error stays one clear line, never "internal error".
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
from contextlib import contextmanager
from pathlib import Path

import pytest

from support.cli_forks import CliForks, thread_states
from support.crash_walk import SCENARIOS, SERVER_ENV, Walk, make_workspace, records
from support.store_state import tree_bytes

ERRNOS = ("EIO", "ENOSPC")


@pytest.fixture(scope="module")
def forks():
    server = CliForks(SERVER_ENV)
    yield server
    server.close()


def assert_clear_error(result, what: str) -> None:
    """Exit 1, stderr one `agentcas: error:` line, no traceback."""
    assert result.code == 1, f"{what}: {result}"
    lines = result.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("agentcas: error: "), f"{what}: {result.err!r}"
    assert "Traceback" not in result.err, f"{what}: {result.err!r}"


def leftovers(directory: str) -> list:
    """Hidden temporaries a checkout or export leaves beside its target."""
    return [name for name in os.listdir(directory) if ".agentcas-" in name]


class FaultWalk(Walk):
    def run_faults(self, every: int = 1, both: bool = False) -> int:
        """Fail every `every`-th durable step with EIO and ENOSPC in turn (or, `both`, with
        each); the number of faults injected."""
        self.reset()
        old = self.observe()
        count_file = self.W.parent / "count"
        assert self.forks.run(*self.argv, env={"AGENTCAS_CRASH_COUNT": str(count_file)}).code == 0
        labels = count_file.read_text().split()
        new = self.observe()
        old_states, new_states = thread_states(old), thread_states(new)
        injected = 0
        plan = [(number, name) for number in range(1, len(labels) + 1, every)
                for name in (ERRNOS if both else [ERRNOS[(number // every) % len(ERRNOS)]])]
        for number, name in plan:
            if labels[number - 1].endswith(".done"):
                continue  # after the last step: nothing is left to fail there
            point = f"{name} at point {number}/{len(labels)} ({labels[number - 1]})"
            self.reset()
            failed = self.forks.run(*self.argv, env={"AGENTCAS_FAULT_AT": str(number), "AGENTCAS_FAULT": name})
            injected += 1
            after = self.observe()
            self.assert_clean(after, point)
            got = thread_states(after)
            if failed.code == 0:
                # The command worked around the fault (export falls back from link to rename):
                # then it must have done all of its work.
                assert got == new_states and after.get("dest") == new.get("dest") and \
                    after.get("bundle") == new.get("bundle"), f"{self.s.name} {point}: exit 0, work not done"
            elif labels[number - 1] == "export.unlink":
                # The bundle is linked into place, whole; only removing the temporary name failed.
                assert_clear_error(failed, f"{self.s.name} {point}")
                assert after["bundle"] == new["bundle"], f"{self.s.name} {point}"
            else:
                assert_clear_error(failed, f"{self.s.name} {point}")
                # A failed command changed nothing: except a fault in the fsync after a
                # commit (the transaction is in; only its durability is in doubt).
                allowed = [old_states] + ([new_states] if labels[number - 1] == "store.commit" else [])
                assert got in allowed, f"{self.s.name} {point}: state changed: {json.dumps(got)[:600]}"
                if self.dest:
                    assert after["dest"] is None, f"{self.s.name} {point}: DEST exists after an error"
                if self.bundle:
                    assert after["bundle"] is None, f"{self.s.name} {point}: bundle exists after an error"
            for target in (self.dest, self.bundle):
                if target and labels[number - 1] != "export.unlink":  # that is the removal that failed
                    assert not leftovers(os.path.dirname(target)), f"{self.s.name} {point}: temporaries left"
            if self.bundle and after["bundle"] is not None:
                continue
            retry = self.forks.run(*self.argv)
            allowed = (0,) + self.s.retry_ok if got != old_states else (0,)
            assert retry.code in allowed, f"{self.s.name} {point}: retry: {retry}"
        return injected


# Not ingest (`steps`): it moves its thread once per turn, so a failed step leaves the turns
# before it, which this walk's old-or-new rule does not allow; its crash walk covers it.
FAULT_SCENARIOS = [s for s in SCENARIOS if not s.steps]


@pytest.mark.parametrize("scenario", FAULT_SCENARIOS, ids=[s.name for s in FAULT_SCENARIOS])
def test_fault_at_every_write_step(forks, scenario, memory_tmp, record_property):  # noqa: F811
    injected = FaultWalk(forks, scenario, memory_tmp).run_faults(
        every=int(os.environ.get("AGENTCAS_FAULT_EVERY", "3")), both=os.environ.get("AGENTCAS_FAULT_BOTH") == "1")
    record_property("faults_injected", injected)


@pytest.mark.parametrize("name,words", [("EIO", "input/output error"), ("ENOSPC", "no space left")])
def test_injected_fault_message_names_the_cause(forks, memory_tmp, workspace, name, words):  # noqa: F811
    store = memory_tmp / "store"
    assert forks.run("init", store).code == 0
    failed = forks.run("--store", store, "commit", workspace, "-m", "x",
                       env={"AGENTCAS_FAULT_AT": "store.open:1", "AGENTCAS_FAULT": name})
    assert_clear_error(failed, name)
    assert "internal error" not in failed.err and words in failed.err.lower(), failed.err


# --- real devices: a small tmpfs, full at every few KiB; read-only mounts -----------------

@contextmanager
def tmpfs(path: Path, size: str):
    """A real tmpfs of `size` mounted at `path` (skip the test where mount is refused)."""
    path.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def free_bytes(path: Path) -> int:
    stat = os.statvfs(path)
    return stat.f_bavail * stat.f_frsize


def fill(path: Path, leave: int) -> None:
    """Write a ballast file so that about `leave` bytes stay free on path's device."""
    with open(path / "ballast", "wb") as out:
        try:
            out.write(b"\0" * max(0, free_bytes(path) - leave))
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    assert abs(free_bytes(path) - leave) <= 64 * 1024 or leave == 0


def reset_store(base: Path, disk: Path) -> Path:
    for entry in os.listdir(disk):
        full = disk / entry
        shutil.rmtree(full) if full.is_dir() else os.unlink(full)
    shutil.copytree(base, disk / "store")
    return disk / "store"


@pytest.mark.parametrize("command", ["commit", "commit-rollout", "append"])
def test_full_disk_at_every_few_kib_of_a_write(forks, tmp_path, command, record_property):
    """The store on a real tmpfs, left 0..~2.5 MiB free in 24 steps: the command runs out
    of space at a different write each time (LMDB says EIO or ENOSPC), or succeeds."""
    base = tmp_path / "base"
    assert forks.run("init", base).code == 0
    make_workspace(tmp_path / "ws0", 4, 0)
    assert forks.run("--store", base, "commit", tmp_path / "ws0", "-m", "base").code == 0
    make_workspace(tmp_path / "ws", 30, 1, big=1_500_000)
    noise = os.urandom(600_000).hex()  # incompressible records: the history needs ~1.2 MB
    (tmp_path / "ws" / "rollout.jsonl").write_bytes(b"".join(
        json.dumps({"seq": i, "text": noise[i * 800:(i + 1) * 800]}).encode() + b"\n" for i in range(1500)))
    argv = {"commit": ["commit", tmp_path / "ws", "-m", "x"],
            "commit-rollout": ["commit", tmp_path / "ws", "-m", "x", "--rollout", tmp_path / "ws" / "rollout.jsonl"],
            "append": ["rollout", "append", "main", tmp_path / "ws" / "rollout.jsonl"]}[command]
    old = forks.call("support.cli_forks:observe_all", [str(base)]).value
    old_threads = thread_states(old)[str(base)]
    failures = 0
    with tmpfs(tmp_path / "disk", "8m") as disk:
        for leave in range(0, 2_600_000, 2_600_000 // 24):
            store = reset_store(base, disk)
            fill(disk, leave)
            result = forks.run("--store", store, *argv)
            what = f"{command} with {leave} bytes free"
            if result.code != 0:
                failures += 1
                assert_clear_error(result, what)
            doc = forks.call("support.cli_forks:observe_all", [str(store)]).value
            assert doc["stores"][str(store)]["ok"], f"{what}: {doc}"
            got = thread_states(doc)[str(store)]
            assert (got == old_threads) == (result.code != 0), f"{what}: {result}"
            os.unlink(disk / "ballast")
            if result.code != 0:
                assert forks.run("--store", store, *argv).code == 0, what
    assert failures >= 5  # the sweep really ran out of space, many times
    record_property("faults_injected", failures)


def test_gc_on_a_completely_full_disk(forks, tmp_path, record_property):
    """gc must free space on a disk with none left: it works, or fails clearly and loses nothing."""
    with tmpfs(tmp_path / "disk", "6m") as disk:
        store = disk / "store"
        assert forks.run("init", store).code == 0
        make_workspace(tmp_path / "ws", 6, 0)
        assert forks.run("--store", store, "commit", tmp_path / "ws", "-m", "keep").code == 0
        for step in range(3):
            make_workspace(tmp_path / f"g{step}", 20, 10 + step, big=200_000)
            assert forks.run("--store", store, "commit", tmp_path / f"g{step}", "-m", "doomed",
                             "--thread", "doomed").code == 0
        assert forks.run("--store", store, "branch", "-d", "doomed").code == 0
        before = forks.call("support.cli_forks:observe_all", [str(store)]).value["stores"][str(store)]
        fill(disk, 0)
        result = forks.run("--store", store, "gc", "--grace", "0s", "--expire-reflog", "now")
        if result.code != 0:
            assert_clear_error(result, "gc on a full disk")
        after = forks.call("support.cli_forks:observe_all", [str(store)]).value["stores"][str(store)]
        assert after["ok"] and after["threads"] == before["threads"], after
        assert forks.run("--store", store, "checkout", "main", tmp_path / "out").code == 0
        assert tree_bytes(tmp_path / "out") == tree_bytes(tmp_path / "ws")
        os.unlink(disk / "ballast")
        assert forks.run("--store", store, "gc", "--grace", "0s", "--expire-reflog", "now").code == 0
        final = forks.call("support.cli_forks:observe_all", [str(store)]).value["stores"][str(store)]
        assert final["ok"] and final["objects"] < before["objects"]
    record_property("faults_injected", 1)


@pytest.mark.parametrize("command", ["checkout", "export"])
def test_checkout_and_export_onto_a_full_disk(forks, tmp_path, command, record_property):
    """DEST or the bundle on a real tmpfs with 0..1.2 MiB free: a clear error, nothing
    created, no temporary left behind; or, with room enough, the whole thing."""
    store = tmp_path / "store"
    assert forks.run("init", store).code == 0
    make_workspace(tmp_path / "ws", 30, 2, big=900_000)
    assert forks.run("--store", store, "commit", tmp_path / "ws", "-m", "x").code == 0
    failures = 0
    with tmpfs(tmp_path / "disk", "4m") as disk:
        for leave in range(0, 1_300_000, 1_300_000 // 12):
            fill(disk, leave)
            target = disk / "out"
            argv = ["checkout", "main", target] if command == "checkout" else ["export", "main", "-o", target]
            result = forks.run("--store", store, *argv)
            what = f"{command} with {leave} bytes free"
            if result.code != 0:
                failures += 1
                assert_clear_error(result, what)
                assert not target.exists() and not leftovers(str(disk)), what
            elif command == "checkout":
                assert tree_bytes(target) == tree_bytes(tmp_path / "ws"), what
            else:
                assert forks.call("support.cli_forks:check_bundle_file", str(target)).code == 0, what
            for entry in os.listdir(disk):
                shutil.rmtree(disk / entry) if (disk / entry).is_dir() else os.unlink(disk / entry)
    assert failures >= 3
    record_property("faults_injected", failures)


@contextmanager
def read_only_view(source: Path, view: Path):
    """`view`: a read-only bind mount of `source` (EROFS on every write)."""
    view.mkdir()
    bound = subprocess.run(["mount", "--bind", str(source), str(view)], capture_output=True, text=True)
    if bound.returncode != 0:
        pytest.skip(f"cannot bind-mount here: {bound.stderr.strip()}")
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(view)], check=True)
        yield view
    finally:
        subprocess.run(["umount", "-l", str(view)], check=False)


WRITES = [("commit", lambda t: ["commit", t / "ws", "-m", "y"]),
          ("append", lambda t: ["rollout", "append", "main", t / "more.jsonl"]),
          ("fork", lambda t: ["fork", "main", "f2"]),
          ("branch-d", lambda t: ["branch", "-d", "side"]),
          ("revert", lambda t: ["revert", "main", "side"]),
          ("gc", lambda t: ["gc", "--grace", "0s"]),
          ("import", lambda t: ["import", t / "b.bundle", "--as", "new", "--allow-unsigned"])]
READS = [("log", lambda t: ["log"]), ("show", lambda t: ["show", "main", "--files"]),
         ("fsck", lambda t: ["fsck"]), ("rollout-cat", lambda t: ["rollout", "cat", "main"]),
         ("checkout", lambda t: ["checkout", "main", t / "co"]),
         ("export", lambda t: ["export", "main", "-o", t / "e.bundle"])]


def read_only_fixture(forks, tmp_path) -> Path:
    store = tmp_path / "store"
    assert forks.run("init", store).code == 0
    make_workspace(tmp_path / "ws", 5, 3)
    (tmp_path / "more.jsonl").write_bytes(records(20))
    assert forks.run("--store", store, "rollout", "append", "main", tmp_path / "more.jsonl").code == 0
    assert forks.run("--store", store, "commit", tmp_path / "ws", "-m", "x").code == 0
    assert forks.run("--store", store, "branch", "side", "main").code == 0
    assert forks.run("--store", store, "export", "main", "-o", tmp_path / "b.bundle").code == 0
    return store


@pytest.mark.parametrize("how", ["read-only-mount", "chmod"])
def test_read_only_store_refuses_writes_and_serves_reads(forks, tmp_path, how, record_property):
    store = read_only_fixture(forks, tmp_path)
    before = forks.call("support.cli_forks:observe_all", [str(store)]).value["stores"][str(store)]

    def check(view: Path) -> None:
        for name, argv in WRITES:
            result = forks.run("--store", view, *argv(tmp_path))
            assert_clear_error(result, f"{name} on a {how} store")
        for name, argv in READS:
            result = forks.run("--store", view, *argv(tmp_path))
            assert result.code == 0, f"{name} on a {how} store: {result}"

    if how == "chmod":
        for path in [store] + [store / name for name in os.listdir(store)]:
            os.chmod(path, 0o555 if path.is_dir() else 0o444)
        try:
            check(store)
        finally:
            for path in [store] + [store / name for name in os.listdir(store)]:
                os.chmod(path, 0o755 if path.is_dir() else 0o644)
    else:
        with read_only_view(store, tmp_path / "ro") as view:
            check(view)
    after = forks.call("support.cli_forks:observe_all", [str(store)]).value["stores"][str(store)]
    assert after == before
    record_property("faults_injected", len(WRITES))


def test_read_only_store_message_names_the_cause(forks, tmp_path):
    store = read_only_fixture(forks, tmp_path)
    with read_only_view(store, tmp_path / "ro") as view:
        result = forks.run("--store", view, "commit", tmp_path / "ws", "-m", "y")
    assert "read-only" in result.err and "internal error" not in result.err, result.err


def test_init_on_a_read_only_file_system(forks, tmp_path):
    """Defect 4's bad input: exit 1, one line, nothing created (the message is defect 4's)."""
    (tmp_path / "src").mkdir()
    with read_only_view(tmp_path / "src", tmp_path / "ro") as view:
        result = forks.run("init", view / "store")
        assert_clear_error(result, "init on a read-only file system")
        assert os.listdir(view) == []


def test_init_on_a_read_only_file_system_message(forks, tmp_path):
    (tmp_path / "src").mkdir()
    with read_only_view(tmp_path / "src", tmp_path / "ro") as view:
        result = forks.run("init", view / "store")
    assert "internal error" not in result.err and "read-only" in result.err, result.err
