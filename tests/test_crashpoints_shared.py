"""Crash points on a shared store: S3 objects (a real SeaweedFS) and PostgreSQL refs (a real
server). Every durable step of commit, fork and gc is killed once (SIGKILL): each pack
object written (`s3.pack`) or batch deleted (`s3.delete`), each PostgreSQL write before and
after its COMMIT (`pg.open`, `pg.commit`: the pack index rows, the ref move that carries a
step's rows), each write of the machine's LMDB cache (`store.*`).

Per point the base state is copied to a fresh store (the bucket prefix's objects copied
server-side, the database cloned with CREATE DATABASE ... TEMPLATE), the command is run
with AGENTCAS_CRASH_AT=N and must die; then, as another machine would see it (an empty
cache, so nothing is answered from the crashed machine's copies), fsck is clean and
every ref is old or new and checks out; the command is retried from the crashed
machine's cache and must succeed; and the store then holds what a clean run made.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from support.cli_forks import CliForks, thread_states
from support.services import PG_PASSWORD, S3_BUCKET

pytestmark = pytest.mark.crash


@pytest.fixture(scope="module")
def forks(s3_server, postgres_server):
    server = CliForks({"AGENTCAS_AUTHOR": "crash@test", "AGENTCAS_RETRY_SECONDS": "10"})
    yield server
    server.close()


def observe_shared(url: str, refs: str, cache: str) -> dict:
    """fsck and every thread's state of a shared store, read through the cache at `cache`."""
    os.environ["AGENTCAS_CACHE_DIR"] = cache
    from support.cli_forks import observe
    return {"stores": {url: observe(url, refs)}}


def observe_retry_observe_shared(url: str, refs: str, fresh: str, argv: list, cache: str, fresh2: str) -> dict:
    """After a crash: observe from an empty cache; retry from the crashed run's cache; observe again."""
    from agentcas import cli
    after = observe_shared(url, refs, fresh)
    os.environ["AGENTCAS_CACHE_DIR"] = cache
    code = cli.main(["--store", url, "--refs", refs] + argv)
    return {"after": after, "retry": code, "final": observe_shared(url, refs, fresh2)}


class SharedBase:
    """A shared store built once, copied per point: objects by S3 CopyObject, refs by template."""

    def __init__(self, s3_server, postgres_server, tmp: Path):
        self.s3, self.pg, self.tmp = s3_server, postgres_server, tmp
        self.prefix = "crash-base-" + uuid.uuid4().hex[:8]
        self.url = f"s3://{S3_BUCKET}/{self.prefix}"
        self.refs = postgres_server.create_database()
        self.copies = 0

    def copy(self) -> tuple[str, str]:
        """A fresh store holding the base's objects and refs: (store URL, refs URL)."""
        import psycopg
        self.copies += 1
        prefix = f"{self.prefix}-{self.copies}"
        client = self.s3.client()
        pages = client.get_paginator("list_objects_v2").paginate(Bucket=S3_BUCKET, Prefix=self.prefix + "/")
        for page in pages:
            for item in page.get("Contents", []):
                client.copy_object(Bucket=S3_BUCKET, Key=prefix + item["Key"][len(self.prefix):],
                                   CopySource={"Bucket": S3_BUCKET, "Key": item["Key"]})
        base_db = self.refs.rsplit("/", 1)[1]
        name = f"{base_db}_{self.copies}"
        with psycopg.connect(self.pg.dsn("postgres"), password=PG_PASSWORD, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{base_db}"')
        return f"s3://{S3_BUCKET}/{prefix}", self.pg.dsn(name)


def write_files(root: Path, files: int, seed: int, big: int = 0) -> None:
    for i in range(files):
        path = root / f"d{i % 2}" / f"f{i}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"file {i} version {seed}\n" * (1 + i % 5))
    if big:
        (root / "big.bin").write_bytes(__import__("random").Random(seed).randbytes(big))


def records(count: int, start: int = 0) -> bytes:
    return b"".join(json.dumps({"seq": start + i, "text": f"r{start + i}-" + "x" * (40 + i * 37 % 300)}).encode()
                    + b"\n" for i in range(count))


@dataclass
class Scenario:
    name: str
    setup: Callable      # setup(run, W): build the base state through `run(*argv)`
    argv: list           # the command (without --store/--refs); "{W}" is the work directory
    retry_ok: tuple = (0,)
    same_objects: bool = False
    every: int = 1       # walk points 1, 1 + every, ... and the last (`make fuzz`: every point)


def setup_commit(run, W):
    write_files(W / "ws", 5, 1, big=150_000)  # a multi-chunk file too


def setup_fork(run, W):
    write_files(W / "ws", 3, 2)
    (W / "ws" / "rollout.jsonl").write_bytes(records(40))
    run("commit", W / "ws", "-m", "base", "--rollout", W / "ws" / "rollout.jsonl")


def setup_gc(run, W):
    write_files(W / "ws", 3, 3)
    run("commit", W / "ws", "-m", "base")
    write_files(W / "ws2", 4, 100)
    run("commit", W / "ws2", "-m", "doomed", "--thread", "doomed")
    run("branch", "-d", "doomed")


SCENARIOS = [
    Scenario("commit", setup_commit, ["commit", "{W}/ws", "-m", "first"]),
    Scenario("fork", setup_fork, ["fork", "main", "explore", "--at", "20"], retry_ok=(3,)),
    Scenario("gc", setup_gc, ["gc", "--grace", "0s", "--expire-reflog", "now", "--batch", "4"], same_objects=True,
             every=3),
]


def ok(result, *codes):
    assert result.code in (codes or (0,)), result
    return result


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_every_crash_point_of_a_shared_store_write(forks, scenario, s3_server, postgres_server, tmp_path,
                                                   record_property):
    W = tmp_path / "w"
    W.mkdir()
    base = SharedBase(s3_server, postgres_server, tmp_path)

    def shared(url, refs):
        return ["--store", url, "--refs", refs]

    def run(*argv, url=base.url, refs=base.refs, cache=tmp_path / "cache-base", env=None):
        return ok(forks.run(*shared(url, refs), *[str(a) for a in argv],
                            env=dict({"AGENTCAS_CACHE_DIR": str(cache)}, **(env or {}))))

    run("init")
    scenario.setup(run, W)
    argv = [a.replace("{W}", str(W)) for a in scenario.argv]
    caches = iter(range(1_000_000))

    def cache() -> str:
        return str(tmp_path / f"cache-{next(caches)}")

    def observe(url, refs):
        return ok(forks.call("test_crashpoints_shared:observe_shared", url, refs, cache())).value

    # The clean run: its points, and the state it makes.
    url, refs = base.copy()
    old = observe(url, refs)
    count = tmp_path / "count"
    run(*argv, url=url, refs=refs, cache=cache(), env={"AGENTCAS_CRASH_COUNT": str(count)})
    labels = count.read_text().split()
    new = observe(url, refs)
    assert new["stores"][url]["ok"], new
    old_states, new_states = (list(thread_states(doc).values())[0] for doc in (old, new))
    assert (old_states == new_states) == (scenario.name == "gc")  # gc moves no ref
    points = 0
    every = 1 if os.environ.get("AGENTCAS_FAULT_EVERY") == "1" else scenario.every
    for number in sorted(set(range(1, len(labels) + 1, every)) | {len(labels)}):
        point = f"{scenario.name} point {number}/{len(labels)} ({labels[number - 1]})"
        url, refs = base.copy()
        crashed_cache = cache()
        killed = forks.run(*shared(url, refs), *argv, env={"AGENTCAS_CRASH_AT": str(number),
                                                           "AGENTCAS_CACHE_DIR": crashed_cache})
        assert killed.code == -9, f"{point}: not killed: {killed}"
        checked = ok(forks.call("test_crashpoints_shared:observe_retry_observe_shared", url, refs, cache(),
                                argv, crashed_cache, cache())).value
        after, final = checked["after"]["stores"][url], checked["final"]["stores"][url]
        assert after["ok"], f"{point}: fsck after the crash: {after['problems']}"
        got = list(thread_states(checked["after"]).values())[0]
        assert got in (old_states, new_states), f"{point}: neither old nor new: {json.dumps(got)[:600]}"
        for name, state in got.items():
            assert "unreadable" not in state, f"{point}: {name} points at a missing object: {state}"
        landed = got == new_states and got != old_states
        allowed = (0,) + scenario.retry_ok if landed else (0,)
        assert checked["retry"] in allowed, f"{point}: retry exit {checked['retry']}"
        assert final["ok"], f"{point}: fsck after the retry: {final['problems']}"
        got_final = {k: {f: v for f, v in s.items() if f != "parents"}
                     for k, s in list(thread_states(checked["final"]).values())[0].items()}
        want = {k: {f: v for f, v in s.items() if f != "parents"} for k, s in new_states.items()}
        assert got_final == want, f"{point}: after the retry"
        if scenario.same_objects:
            assert final["objects"] == new["stores"][list(new["stores"])[0]]["objects"], f"{point}: gc retry"
        points += 1
    print(f"shared {scenario.name}: {points} of {len(labels)} points: " + " ".join(
        f"{label} x{labels.count(label)}" for label in sorted(set(labels))))
    assert {"s3.pack", "pg.commit"} & set(labels) or scenario.name == "gc"
    record_property("crash_points", points)
    shutil.rmtree(tmp_path, ignore_errors=True)
