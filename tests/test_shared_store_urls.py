"""A shared store's URLs and settings through the CLI: the store and refs URLs belong
together, malformed ones are usage errors that write nothing, the cache keeps its bound."""

from __future__ import annotations

import os

import pytest

from support.cli import run_cli

# -- a shared store's two URLs belong together -------------------------------------------

@pytest.fixture
def team(tmp_path, s3_url, postgres_url, workspace):
    """A shared store with one commit on `main`; (env, s3_url, postgres_url)."""
    env = {"AGENTCAS_STORE": s3_url, "AGENTCAS_REFS": postgres_url,
           "AGENTCAS_CACHE_DIR": str(tmp_path / "cache-a")}
    assert run_cli("init", env=env).code == 0
    made = run_cli("commit", workspace, "-m", "the team's work", env=env)
    assert made.code == 0, made
    return env, s3_url, postgres_url


def _thread_names(env) -> list[str]:
    listed = run_cli("--json", "branch", env=env)
    assert listed.code == 0, listed
    return sorted(t["thread"] for t in listed.json()["threads"])


def _objects_under(s3_server, url: str) -> list[str]:
    bucket, _, prefix = url[len("s3://"):].partition("/")
    page = s3_server.client().list_objects_v2(Bucket=bucket, Prefix=prefix.strip("/") + "/")
    return [o["Key"] for o in page.get("Contents", [])]


def test_a_mistyped_store_prefix_with_the_teams_refs_writes_nothing(team, workspace, tmp_path, s3_server):
    """The refs database names objects under its own prefix: a commit through another prefix
    (a typo, never initialised) must not publish a ref to objects the team's store lacks."""
    env, s3_url, postgres_url = team
    before = _thread_names(env)
    typo = s3_url + "-typo"
    for args in (("commit", workspace, "-m", "through a typo", "--thread", "typo"), ("log", "main")):
        bad = run_cli(*args, env=dict(env, AGENTCAS_STORE=typo, AGENTCAS_CACHE_DIR=str(tmp_path / "cache-b")))
        assert bad.code == 1, bad
        assert bad.err.startswith("agentcas: error: ") and bad.err.count("\n") == 1, bad.err
        assert typo in bad.err and s3_url in bad.err  # names both: which store the refs belong to
    assert _thread_names(env) == before
    fsck = run_cli("--json", "fsck", env=env)
    assert fsck.code == 0 and fsck.json()["ok"], fsck
    assert _objects_under(s3_server, typo) == []


def test_init_with_a_new_refs_database_on_a_used_prefix_is_refused(team, postgres_server, tmp_path):
    """Two refs databases over one prefix would each gc the other's objects."""
    env, s3_url, _ = team
    other_refs = postgres_server.create_database()
    again = run_cli("init", env=dict(env, AGENTCAS_REFS=other_refs, AGENTCAS_CACHE_DIR=str(tmp_path / "c2")))
    assert again.code == 3, again
    assert again.err.startswith("agentcas: error: ") and again.err.count("\n") == 1, again.err
    assert "nothing was written" in again.err
    # The new database did not become a store, and the team's store is as it was.
    opened = run_cli("log", "main", env=dict(env, AGENTCAS_REFS=other_refs))
    assert opened.code == 1 and "not an agentcas store" in opened.err, opened
    assert run_cli("--json", "fsck", env=env).json()["ok"]
    # Re-running init with the right pair is fine (idempotent).
    assert run_cli("init", env=env).code == 0


@pytest.mark.parametrize("url", ["s3://", "s3:///prefix"])
def test_a_store_url_without_a_bucket_is_a_usage_error(url, tmp_path):
    bad = run_cli("--store", url, "--refs", "postgresql://nobody@127.0.0.1:1/none", "log",
                  env={"AGENTCAS_CACHE_DIR": str(tmp_path / "cache")})
    assert bad.code == 2, bad
    assert bad.err.startswith("agentcas: error: ") and bad.err.count("\n") == 1
    assert "internal error" not in bad.err and "s3://BUCKET/PREFIX" in bad.err


def test_the_cache_on_disk_stays_within_a_few_times_its_bound(tmp_path, s3_url, postgres_url):
    """$AGENTCAS_CACHE_BYTES bounds the cache directory, not only what it lists: a commit
    and a checkout of 16 MB through a 2 MB cache leave a data file of a few MB."""
    import os
    bound = 2_000_000
    ws = tmp_path / "big"
    ws.mkdir()
    for i in range(8):
        (ws / f"f{i}").write_bytes(os.urandom(2_000_000))
    env = {"AGENTCAS_STORE": s3_url, "AGENTCAS_REFS": postgres_url, "AGENTCAS_CACHE_BYTES": str(bound)}

    def cache_file_bytes(cache):
        return sum(f.stat().st_size for f in cache.rglob("data.mdb"))
    assert run_cli("init", env=dict(env, AGENTCAS_CACHE_DIR=str(tmp_path / "cache-a"))).code == 0
    made = run_cli("commit", ws, "-m", "16 MB", env=dict(env, AGENTCAS_CACHE_DIR=str(tmp_path / "cache-a")))
    assert made.code == 0, made
    assert cache_file_bytes(tmp_path / "cache-a") <= 3 * bound
    out = run_cli("checkout", "main", tmp_path / "out", env=dict(env, AGENTCAS_CACHE_DIR=str(tmp_path / "cache-b")))
    assert out.code == 0, out
    assert all((tmp_path / "out" / f.name).read_bytes() == f.read_bytes() for f in ws.iterdir())
    assert cache_file_bytes(tmp_path / "cache-b") <= 3 * bound


@pytest.mark.parametrize("refs", ["postgresql://agentcas@127.0.0.1:xx/db", "postgresql://agentcas@127.0.0.1:99999/db",
                                  "postgresql://agentcas@[::1/db"])
def test_a_malformed_refs_url_is_a_usage_error_at_once(refs, tmp_path):
    """A URL that cannot name a server is exit 2 with one line, not exit 1 after every retry."""
    bad = run_cli("--store", "s3://bucket/prefix", "--refs", refs, "log",
                  env={"AGENTCAS_CACHE_DIR": str(tmp_path / "cache"), "AGENTCAS_RETRY_SECONDS": "30"}, timeout=20)
    assert bad.code == 2, bad
    assert bad.err.startswith("agentcas: error: not a valid PostgreSQL URL") and bad.err.count("\n") == 1, bad.err
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize("name,value", [("AGENTCAS_CACHE_BYTES", "abc"), ("AGENTCAS_CACHE_BYTES", "-5"),
                                        ("AGENTCAS_RETRY_SECONDS", "zz"), ("AGENTCAS_PG_TIMEOUT", "nan"),
                                        ("AGENTCAS_S3_READ_TIMEOUT", "-1"), ("AGENTCAS_S3_CONNECTIONS", "abc")])
def test_a_malformed_shared_store_setting_is_refused_by_name(team, tmp_path, name, value):
    env, _, _ = team
    cache = tmp_path / "cache-new"
    bad = run_cli("log", "main", env=dict(env, AGENTCAS_CACHE_DIR=str(cache), **{name: value}))
    assert bad.code == 2, bad
    assert bad.err.startswith(f"agentcas: error: ${name} must be ") and bad.err.count("\n") == 1, bad.err
    assert "internal error" not in bad.err and not cache.exists()


def test_init_through_a_mistyped_bucket_with_the_teams_refs_makes_no_bucket(team, tmp_path, s3_server):
    """`init` with the team's refs and a bucket that does not exist is refused (the refs
    belong to another store), and leaves no bucket behind: the bucket was made before the
    refs database was asked, so the refusal's "nothing was written" was not true."""
    env, s3_url, _ = team
    typo = f"s3://typo-bucket-{os.getpid()}/shared"
    refused = run_cli("init", env=dict(env, AGENTCAS_STORE=typo, AGENTCAS_CACHE_DIR=str(tmp_path / "c3")))
    assert refused.code == 3 and "nothing was written" in refused.err, refused
    assert f"typo-bucket-{os.getpid()}" not in {b["Name"] for b in s3_server.client().list_buckets()["Buckets"]}
    assert run_cli("--json", "fsck", env=env).json()["ok"]


def test_refs_of_one_store_beside_the_prefix_of_another_are_refused(team, workspace, tmp_path, s3_server,
                                                                     s3_url, postgres_server):
    """Two initialised stores: A's refs database with B's prefix names objects B does not hold,
    and a gc there would delete B's: every command is refused, nothing written to either."""
    env_a, url_a, _ = team
    url_b = s3_url + "-b"
    env_b = {"AGENTCAS_STORE": url_b, "AGENTCAS_REFS": postgres_server.create_database(),
             "AGENTCAS_CACHE_DIR": str(tmp_path / "cache-b")}
    assert run_cli("init", env=env_b).code == 0
    assert run_cli("commit", workspace, "-m", "store b's work", env=env_b).code == 0
    objects_b, threads_a = _objects_under(s3_server, url_b), _thread_names(env_a)
    mixed = dict(env_a, AGENTCAS_STORE=url_b, AGENTCAS_CACHE_DIR=str(tmp_path / "cache-mixed"))
    for args in (("gc", "--grace", "0s", "--expire-reflog", "now"), ("log", "main"),
                 ("commit", workspace, "-m", "across stores", "--thread", "mixed")):
        bad = run_cli(*args, env=mixed)
        assert bad.code == 1, bad
        assert bad.err.startswith(f"agentcas: error: {url_b} holds another agentcas store, but ") \
            and bad.err.count("\n") == 1, bad.err
        assert f"holds the refs of the store made at {url_a}" in bad.err, bad.err
    assert _objects_under(s3_server, url_b) == objects_b and _thread_names(env_a) == threads_a
    for env in (env_a, env_b):
        fsck = run_cli("--json", "fsck", env=env)
        assert fsck.code == 0 and fsck.json()["ok"], fsck
