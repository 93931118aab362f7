"""A shared store (objects in S3 on a real SeaweedFS, refs in a real PostgreSQL) through the
CLI and the Python API, as two machines (two cache directories) would use it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from agentcas import Store

from support.cli import AGENTCAS, run_cli
from support.files import write
from support.shared_packs import flip_byte
from support.store_state import tree_bytes


@pytest.fixture
def shared(tmp_path, s3_url, postgres_url):
    """(run, env) for one machine of a fresh shared store; `machine(name)` gives others."""
    def machine(name: str):
        env = {"AGENTCAS_STORE": s3_url, "AGENTCAS_REFS": postgres_url,
               "AGENTCAS_CACHE_DIR": str(tmp_path / f"cache-{name}")}

        def run(*args, **kw):
            return run_cli(*args, env=dict(env, **kw.pop("env", {})), **kw)
        run.env = env
        return run

    first = machine("a")
    assert first("init").code == 0
    first.machine = machine
    first.urls = (s3_url, postgres_url)
    return first




def test_commit_on_one_machine_check_out_on_another(shared, workspace, tmp_path):
    made = shared("--json", "commit", workspace, "-m", "on machine a")
    assert made.code == 0, made
    other = shared.machine("b")
    log = other("--json", "log", "main")
    assert log.code == 0 and log.json()["checkpoints"][0]["reason"] == "on machine a"
    out = tmp_path / "restored"
    assert other("checkout", "main", out).code == 0
    assert tree_bytes(out) == tree_bytes(workspace)
    assert other("--json", "fsck").json()["ok"]


def test_every_command_works_on_a_shared_store(shared, workspace, tmp_path):
    rollout = workspace / "rollout.jsonl"
    rollout.write_text('{"role":"user","text":"hi"}\n{"role":"assistant","text":"hello"}\n')
    assert shared("commit", workspace, "-m", "one", "--rollout", rollout).code == 0
    with rollout.open("a") as handle:
        handle.write('{"role":"user","text":"more"}\n')
    (workspace / "task.json").write_text('{"step": 2}\n')
    assert shared("commit", workspace, "-m", "two", "--rollout", rollout).code == 0
    assert shared("rollout", "cat", "main").out == rollout.read_text()
    assert shared("fork", "main", "alt", "--at", "2").code == 0
    assert shared("rollout", "append", "alt", "-", input='{"role":"user","text":"alt"}\n').code == 0
    assert shared("revert", "main", "main~1").code == 0
    assert shared("branch", "keep", "main@{1}").code == 0
    assert shared("--json", "diff", "main", "keep").json()["changed"]
    assert shared("--json", "lineage").code == 0
    gc = shared("--json", "gc", "--grace", "0s", "--expire-reflog", "now")
    assert gc.code == 0, gc
    fsck = shared("--json", "fsck")
    assert fsck.code == 0 and fsck.json()["ok"], fsck
    for thread in ("main", "alt", "keep"):
        assert shared("checkout", thread, tmp_path / f"out-{thread}").code == 0


def test_push_and_pull_between_a_laptop_store_and_the_shared_store(shared, workspace, tmp_path):
    laptop = tmp_path / "laptop"
    assert run_cli("init", laptop).code == 0
    assert run_cli("commit", workspace, "-m", "from the laptop", store=laptop).code == 0
    s3_url, refs = shared.urls
    assert run_cli("remote", "add", "team", s3_url, "--refs", refs, store=laptop, env=shared.env).code == 0
    pushed = run_cli("--json", "push", "team", "main", store=laptop, env=shared.env)
    assert pushed.code == 0, pushed
    assert pushed.json()["objects_sent"] > 0
    again = run_cli("--json", "push", "team", "main", store=laptop, env=shared.env)
    assert again.json()["up_to_date"]
    assert shared("--json", "log", "main").json()["checkpoints"][0]["reason"] == "from the laptop"
    (workspace / "task.json").write_text('{"step": "team"}\n')
    assert shared("commit", workspace, "-m", "by the team").code == 0
    pulled = run_cli("--json", "pull", "team", "main", store=laptop, env=shared.env)
    assert pulled.code == 0, pulled
    assert run_cli("--json", "log", "main", store=laptop).json()["checkpoints"][0]["reason"] == "by the team"


def test_unchanged_recommit_uploads_nothing_but_its_checkpoint(shared, workspace, monkeypatch):
    time.sleep(2.1)  # the stat cache skips files changed within 2 s of a snapshot
    assert shared("commit", workspace, "-m", "first").code == 0
    s3_url, refs = shared.urls
    monkeypatch.setenv("AGENTCAS_CACHE_DIR", shared.env["AGENTCAS_CACHE_DIR"])
    store = Store.open(s3_url, refs=refs)  # counted from here: opening is part of the command
    result = store.checkpoints.commit(str(workspace), "unchanged").to_json()
    assert result["new_objects"] == 0 and result["cached_files"] == result["files"]
    s3_requests = store.blobs.remote.request_count()
    pg_requests = store.meta.round_trips
    print(f"\n[shared] unchanged recommit: {s3_requests} S3 requests, {pg_requests} PostgreSQL round trips "
          f"({store.meta.statements} statements)")
    # At most 3 requests to each service (open the store, take the lease with the
    # thread's state, land the move), and the only upload is the new checkpoint.
    assert s3_requests <= 3 and pg_requests <= 3
    assert [item.to_json() for item in store.threads.log("main", limit=1)][0]["reason"] == "unchanged"


def test_gc_report_on_a_shared_store_counts_listed_sizes(shared, tmp_path, monkeypatch):
    write(tmp_path / "a", {"a.bin": os.urandom(40_000)})
    write(tmp_path / "b", {"b.bin": os.urandom(60_000)})
    assert shared("commit", tmp_path / "a", "-m", "a", "--thread", "a").code == 0
    assert shared("commit", tmp_path / "b", "-m", "b", "--thread", "b").code == 0
    assert shared("fork", "a", "c").code == 0
    s3_url, refs = shared.urls
    monkeypatch.setenv("AGENTCAS_CACHE_DIR", str(tmp_path / "cache-gc"))  # a machine that has read nothing
    store = Store.open(s3_url, refs=refs)
    try:
        report = store.gc.run(grace=0, expire_reflog=0, report=True).to_json()["report"]
        stored = sum(info.size for info in store.blobs.list())
    finally:
        store.close()
    rows = {r["thread"]: r for r in report["threads"]}
    assert rows["b"]["unique_bytes"] == rows["b"]["live_bytes"] > 60_000
    assert rows["a"]["shared_bytes"] == rows["c"]["shared_bytes"] == rows["a"]["live_bytes"] > 40_000
    assert rows["b"]["live_bytes"] + rows["a"]["live_bytes"] + report["kept_without_thread"]["bytes"] == stored


# --- must survive -------------------------------------------------------------------------------

WORKER = r"""
import json, os, sys, time
from agentcas import Store
from agentcas.errors import AgentcasError, ConflictError, IntegrityError
store_url, refs, ws, thread, seconds = sys.argv[1:6]
store = Store.open(store_url, refs=refs)
os.makedirs(ws, exist_ok=True)
end = time.time() + float(seconds)
done = retried = 0
i = 0
while time.time() < end:
    i += 1
    try:
        with open(os.path.join(ws, "same.txt"), "w") as f:
            f.write("constant\n" * 50)
        with open(os.path.join(ws, "step.bin"), "wb") as f:
            f.write(os.urandom(3000 + i))
        store.checkpoints.commit(ws, f"step {i}", thread=thread)
        if i % 3 == 0:
            store.threads.fork(thread, f"{thread}-fork-{i}")
        if i % 4 == 0:
            store.threads.revert(thread, f"{thread}~1")
        done += 1
    except (IntegrityError, ConflictError) as exc:
        if "vanished" not in str(exc) and "lease" not in str(exc):
            raise
        retried += 1
print(json.dumps({"steps": done, "retried": retried}))
"""


def test_six_machines_commit_fork_revert_while_gc_loops_at_zero_grace(shared, tmp_path):
    """6 processes with their own caches on one shared store, gc looping at --grace 0s:
    nothing lost, every ref checks out, fsck clean."""
    s3_url, refs = shared.urls
    workers = []
    for n in range(6):
        env = dict(os.environ, AGENTCAS_CACHE_DIR=str(tmp_path / f"cache-{n}"))
        workers.append(subprocess.Popen([sys.executable, "-c", WORKER, s3_url, refs, str(tmp_path / f"ws{n}"),
                                         f"w{n}", "20"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        text=True, env=env))
    gc_runs = 0
    while any(w.poll() is None for w in workers):
        result = shared("--json", "gc", "--grace", "0s", "--expire-reflog", "now")
        assert result.code == 0, result
        gc_runs += 1
    reports = []
    for worker in workers:
        out, err = worker.communicate()
        assert worker.returncode == 0, err[-2000:]
        reports.append(json.loads(out))
    print(f"\n[shared] 6 writers: {[r['steps'] for r in reports]} steps, "
          f"{sum(r['retried'] for r in reports)} retried, {gc_runs} gc runs")
    assert all(r["steps"] > 0 for r in reports)
    assert shared("--json", "gc", "--grace", "0s", "--expire-reflog", "now").code == 0
    fsck = shared("--json", "fsck")
    assert fsck.code == 0 and fsck.json()["ok"], fsck
    names = [t["thread"] for t in shared("--json", "branch").json()["threads"]]
    assert len(names) >= 6
    for name in names:
        assert shared("checkout", name, tmp_path / "out" / name).code == 0, name


RACER = r"""
import sys
from agentcas import Store
from agentcas.errors import ConflictError
store_url, refs, ws, expect, go = sys.argv[1:6]
store = Store.open(store_url, refs=refs)
import os, time
while not os.path.exists(go):
    time.sleep(0.001)
try:
    store.checkpoints.commit(ws, "racer", expect=expect)
    print("won")
except ConflictError:
    print("lost")
"""


def test_two_racing_expect_commits_exactly_one_wins(shared, tmp_path):
    base = write(tmp_path / "base", {"a.txt": "base\n"})
    first = shared("--json", "commit", base, "-m", "base").json()["checkpoint"]
    s3_url, refs = shared.urls
    go = tmp_path / "go"
    racers = []
    for n in range(2):
        ws = write(tmp_path / f"r{n}", {"a.txt": f"racer {n}\n"})
        env = dict(os.environ, AGENTCAS_CACHE_DIR=str(tmp_path / f"cache-r{n}"))
        racers.append(subprocess.Popen([sys.executable, "-c", RACER, s3_url, refs, str(ws), first, str(go)],
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
    time.sleep(2)
    go.write_text("go")
    outcomes = sorted(r.communicate()[0].strip() for r in racers)
    assert outcomes == ["lost", "won"], outcomes
    log = shared("--json", "log", "main").json()["checkpoints"]
    assert [c["reason"] for c in log] == ["racer", "base"]


def test_a_tampered_object_in_the_bucket_is_named_by_fsck_and_checkout(shared, workspace, tmp_path, s3_server):
    made = shared("--json", "commit", workspace, "-m", "x").json()
    tree = made["tree"]
    flip_byte(s3_server, *shared.urls, tree, at=-3)
    fresh = shared.machine("fresh")  # a machine with an empty cache reads the bucket
    fsck = fresh("fsck")
    assert fsck.code == 4 and tree in fsck.out + fsck.err, fsck
    out = fresh("checkout", "main", tmp_path / "out")
    assert out.code == 4 and not (tmp_path / "out").exists(), out


def test_sigkill_of_a_committer_at_random_points_leaves_old_or_new(shared, workspace, tmp_path):
    import random
    s3_url, refs = shared.urls
    heads = set()
    for attempt in range(6):
        (workspace / "step.bin").write_bytes(os.urandom(200_000 + attempt))
        before = shared("--json", "log", "main", "-n", "1")
        before_head = before.json()["checkpoints"][0]["checkpoint"] if before.code == 0 else None
        proc = subprocess.Popen([AGENTCAS, "commit", str(workspace), "-m", f"try {attempt}"],
                                env=dict(os.environ, **shared.env), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        time.sleep(random.uniform(0.05, 1.5))
        proc.kill()
        proc.wait()
        after = shared("--json", "log", "main", "-n", "1")
        after_head = after.json()["checkpoints"][0]["checkpoint"] if after.code == 0 else None
        heads.add(after_head)
        if after_head != before_head:  # landed before the kill: must be a new, whole checkpoint
            assert shared("checkout", "main", tmp_path / f"k{attempt}").code == 0
    retry = shared("commit", workspace, "-m", "after the kills")
    assert retry.code == 0, retry
    fsck = shared("--json", "fsck")
    assert fsck.code == 0 and fsck.json()["ok"], fsck


def test_unreachable_services_are_named_in_one_line(tmp_path, workspace):
    env = {"AGENTCAS_STORE": "s3://nowhere-bucket/x", "AGENTCAS_REFS": "postgresql://agentcas@127.0.0.1:9/none",
           "AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s3cr3t",
           "AWS_REGION": "us-east-1", "AGENTCAS_RETRY_SECONDS": "1", "AGENTCAS_CACHE_DIR": str(tmp_path / "c")}
    result = run_cli("log", "main", env=env)
    assert result.code == 1, result
    lines = result.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("agentcas: error: ") and "Traceback" not in result.err
    assert "PostgreSQL" in lines[0] or "S3" in lines[0]
    assert "s3cr3t" not in result.err


def test_no_s3_credentials_is_named_not_an_internal_error(tmp_path, monkeypatch):
    """No credentials anywhere: botocore's NoCredentialsError reached the CLI as an "internal
    error" line that named neither the service nor what to set."""
    from agentcas.cas.blobstore.base import BlobUnavailable
    from agentcas.cas.blobstore.s3 import S3BlobStore
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in {"HOME": str(tmp_path), "AWS_CONFIG_FILE": str(tmp_path / "none"),
                        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"), "AWS_EC2_METADATA_DISABLED": "true",
                        "AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_REGION": "us-east-1",
                        "AGENTCAS_RETRY_SECONDS": "1"}.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(BlobUnavailable) as info:
        S3BlobStore("s3://nowhere-bucket/x")
    assert "S3 at http://127.0.0.1:9" in str(info.value) and "AWS_SECRET_ACCESS_KEY" in str(info.value)


def test_an_s3_endpoint_password_is_never_printed_even_beside_its_key_id(tmp_path):
    """An endpoint `http://KEYID:PASSWORD@host` where KEYID is $AWS_ACCESS_KEY_ID: the key id
    was masked first, so the endpoint no longer matched its printable form and the password
    was printed (`http://***:SUPERSECRETXY@...`). Any URL's user part is cut first now."""
    env = {"AGENTCAS_STORE": "s3://nowhere-bucket/x", "AGENTCAS_REFS": "postgresql://agentcas@127.0.0.1:9/none",
           "AWS_ENDPOINT_URL": "http://agentcaskey:SUPERSECRETXY@127.0.0.1:9", "AWS_ACCESS_KEY_ID": "agentcaskey",
           "AWS_SECRET_ACCESS_KEY": "s3cr3t", "AWS_REGION": "us-east-1", "AGENTCAS_RETRY_SECONDS": "0.2",
           "AGENTCAS_CACHE_DIR": str(tmp_path / "c")}
    for command in (["log", "main"], ["init"]):
        result = run_cli(*command, env=env)
        assert result.code == 1 and "SUPERSECRETXY" not in result.err and "agentcaskey" not in result.err, result
        assert len(result.err.strip().splitlines()) == 1


def test_a_second_machine_committing_what_the_first_stored_hashes_it_once(shared, tmp_path):
    """Machine b commits a copy of a tree machine a already stored: its first commit hashes
    every file (its stat cache is empty) and finds the objects in the bucket; its next commit
    takes every file from its stat cache (before, b's cache never held those objects, so its
    stat-cache hits were dropped and every commit hashed every file again)."""
    files = {f"d{n % 3}/f{n}.txt": os.urandom(3000) for n in range(12)}
    a_tree = write(tmp_path / "on-a", files)
    b_tree = write(tmp_path / "on-b", files)
    for path in list(a_tree.rglob("*")) + list(b_tree.rglob("*")):
        os.utime(path, (1_600_000_000, 1_600_000_000))   # old files: the stat cache may hold them
    touched = time.monotonic()
    assert shared("commit", a_tree, "-m", "a").code == 0
    time.sleep(max(0.0, 2.2 - (time.monotonic() - touched)))  # ctimes past the racy window (snapshot.RACY_NS)
    b = shared.machine("b")
    first = b("--json", "commit", b_tree, "-m", "b", "--thread", "b")
    assert first.code == 0, first
    assert first.json()["new_objects"] <= 3 and first.json()["cached_files"] == 0   # the trees' and checkpoint's
    again = b("--json", "commit", b_tree, "-m", "b again", "--thread", "b")
    assert again.code == 0, again
    assert again.json()["cached_files"] == again.json()["files"] == 12
    assert b("--json", "fsck").json()["ok"]


def test_a_landing_whose_own_lease_ran_out_by_the_clock_sends_nothing(shared, workspace, monkeypatch):
    """A shared store's move lands in one exchange that expects the lease row as written; a
    writer that outlives its lease while uploading (its row still there: gc may have judged
    it dead and swept without deleting it yet) must fail by its own clock before it sends
    the exchange."""
    from agentcas.cas import leases
    from agentcas.cas.leases import LeaseExpired, read_leases

    s3_url, refs = shared.urls
    monkeypatch.setenv("AGENTCAS_CACHE_DIR", shared.env["AGENTCAS_CACHE_DIR"])
    monkeypatch.setattr(leases, "LEASE_SECONDS", 1.0)
    store = Store.open(s3_url, refs=refs)
    store.checkpoints.commit(str(workspace), "one")
    before = ([t.to_json() for t in store.threads.list()], [e.to_json() for e in store.threads.reflog("main")])
    write(workspace, {"task.md": b"two\n"})
    sent: list = []
    source, exchange = store.backends.source, store.meta.exchange
    check_stored = source.missing

    def outlive_the_lease(needed):
        # Reached in the landing after its lease refresh and the upload, before the exchange.
        if not sent:
            with store.meta.reader() as txn:
                (row,) = read_leases(txn)
            while time.time() <= row.expires_at + 0.05:
                time.sleep(0.05)
            sent.append("paused")
            monkeypatch.setattr(store.meta, "exchange", lambda *a, **kw: sent.append(kw) or exchange(*a, **kw))
        return check_stored(needed)

    monkeypatch.setattr(source, "missing", outlive_the_lease)
    with pytest.raises(LeaseExpired) as info:
        store.checkpoints.commit(str(workspace), "two")
    assert "took longer than its lease" in str(info.value)
    assert sent == ["paused"]
    after = ([t.to_json() for t in store.threads.list()], [e.to_json() for e in store.threads.reflog("main")])
    assert after == before
