"""One store for many machines (objects in S3 on a real SeaweedFS, refs in a real
PostgreSQL) and stores of earlier format versions, through the
`agentcas` command only, as a team would use it. Each "machine" is its own
$AGENTCAS_CACHE_DIR; the servers come from the session fixtures of conftest.py."""

from __future__ import annotations

import json
import os
import tarfile
import uuid

import pytest

from support.cli import run_cli
from support.files import write
from support.services import PG_PASSWORD, S3_SECRET_KEY
from support.shared_packs import flip_byte, lose_object
from support.store_state import tree_bytes

HERE = os.path.dirname(os.path.abspath(__file__))


def one_line_error(result, code: int) -> str:
    assert result.code == code, result
    assert result.err.startswith("agentcas: error: ") and result.err.count("\n") == 1, result.err
    assert "Traceback" not in result.err and "internal error" not in result.err, result.err
    return result.err


def machine(tmp_path, name: str, store: str | None = None, refs: str | None = None):
    """`run(*args)` for one machine (its own cache directory), with --store/--refs flags
    when given, else whatever the environment says."""
    flags = (["--store", store] if store else []) + (["--refs", refs] if refs else [])
    cache = str(tmp_path / f"cache-{name}")

    def run(*args, env=None, **kw):
        return run_cli(*flags, *args, env=dict({"AGENTCAS_CACHE_DIR": cache}, **(env or {})), **kw)
    return run


@pytest.fixture
def team(tmp_path, s3_url, postgres_url, s3_server):
    """A shared store made by machine a, through $AGENTCAS_STORE / $AGENTCAS_REFS."""
    env = {"AGENTCAS_STORE": s3_url, "AGENTCAS_REFS": postgres_url}

    def on(name):
        run = machine(tmp_path, name)
        return lambda *args, **kw: run(*args, env=dict(env, **kw.pop("env", {})), **kw)
    assert on("a")("init").code == 0
    on.urls = (s3_url, postgres_url)
    return on


# -- two machines through the flags, init of a missing bucket, twice ------------------

def test_two_machines_fork_revert_and_check_out_each_others_work(tmp_path, s3_server, postgres_url):
    store = s3_server.url(bucket=f"acc11b-{uuid.uuid4().hex[:10]}")  # a bucket nobody made yet
    a = machine(tmp_path, "a", store, postgres_url)
    b = machine(tmp_path, "b", store, postgres_url)
    made = a("--json", "init")
    assert made.code == 0 and made.json() == {"store": store, "created": True}, made
    again = b("--json", "init")
    assert again.code == 0 and again.json() == {"store": store, "created": False}, again

    ws_a = write(tmp_path / "ws-a", {"notes.md": "plan\n", "data.bin": os.urandom(700_000)})
    first = a("--json", "commit", ws_a, "-m", "a's first").json()
    out_b = tmp_path / "b-checkout"
    assert b("checkout", "main", out_b).code == 0 and tree_bytes(out_b) == tree_bytes(ws_a)
    assert b("--json", "fork", "main", "explore").code == 0
    write(out_b, {"notes.md": "b explored\n"})
    explored = b("--json", "commit", out_b, "-m", "b explores", "--thread", "explore").json()
    write(ws_a, {"notes.md": "a's second\n"})
    second = a("--json", "commit", ws_a, "-m", "a's second").json()
    assert a("--json", "revert", "main", first["checkpoint"]).code == 0

    # Each machine sees the other's moves, and checks out the other's work byte for byte.
    log = b("--json", "log", "main").json()["checkpoints"]
    assert [c["checkpoint"] for c in log] == [first["checkpoint"]]
    reflog = b("--json", "reflog", "main").json()["entries"]
    assert [e["action"] for e in reflog] == ["revert", "commit", "commit"]
    assert b("checkout", "main@{1}", tmp_path / "b-sees-second").code == 0
    assert tree_bytes(tmp_path / "b-sees-second") == tree_bytes(ws_a)
    assert a("checkout", "explore", tmp_path / "a-sees-explore").code == 0
    assert tree_bytes(tmp_path / "a-sees-explore") == tree_bytes(out_b)
    threads = {t["thread"]: t["checkpoint"] for t in a("--json", "branch").json()["threads"]}
    assert threads == {"main": first["checkpoint"], "explore": explored["checkpoint"]}
    assert second["parents"] == [first["checkpoint"]]


# -- fsck reads the bucket, not the cache of the machine that wrote the objects --------------------

def test_fsck_on_the_machine_that_wrote_reads_the_bucket_not_its_cache(team, tmp_path, s3_server):
    """A tampered object in the bucket is found by fsck on every machine, also the one whose
    cache holds a good copy (it used to answer ok there: it verified its cache)."""
    a = team("a")
    ws = write(tmp_path / "ws", {"big.bin": os.urandom(900_000), "small.txt": "hi\n"})
    made = a("--json", "commit", ws, "-m", "x").json()
    assert a("--json", "fsck").json()["ok"]
    flip_byte(s3_server, *team.urls, made["tree"], at=-2, mask=0x40)

    for name in ("a", "fresh"):
        fsck = team(name)("--json", "fsck")
        assert fsck.code == 4, (name, fsck)
        problems = fsck.json()["problems"]
        assert [p["id"] for p in problems] == [made["tree"]] and problems[0]["what"] == "corrupt", (name, problems)
    checkout = team("other")("checkout", "main", tmp_path / "out")
    assert made["tree"] in one_line_error(checkout, 4) and not (tmp_path / "out").exists()


# -- a machine whose cache outlived a gc elsewhere commits again -----------------------------------

def test_a_commit_after_gc_on_another_machine_deleted_what_this_cache_remembers(team, tmp_path):
    """Machine a's cache and stat cache remember a file's objects; machine b's gc deletes them
    (their thread was deleted). a's next commit of that file must store them again, not
    fail with "vanished ... retry" on every rerun."""
    a, b = team("a"), team("b")
    ws = write(tmp_path / "ws", {"small.txt": "base\n"})
    assert a("commit", ws, "-m", "base").code == 0
    write(ws, {"big.bin": os.urandom(1_500_000)})
    assert a("commit", ws, "-m", "with big", "--thread", "scratch").code == 0
    assert a("branch", "-d", "scratch").code == 0
    gc = b("--json", "gc", "--grace", "0s", "--expire-reflog", "now")
    assert gc.code == 0 and gc.json()["result"]["deleted"]["bytes"] > 1_400_000, gc  # big's chunks too

    again = a("--json", "commit", ws, "-m", "big again")
    assert again.code == 0, again
    assert again.json()["new_bytes"] > 1_000_000  # stored again, not trusted from the cache
    out = tmp_path / "out"
    assert team("c")("checkout", "main", out).code == 0 and tree_bytes(out) == tree_bytes(ws)
    rerun = a("--json", "commit", ws, "-m", "unchanged")
    assert rerun.code == 0 and rerun.json()["new_objects"] == 0, rerun


# -- malformed URLs and endpoints are usage errors that print no secret ----------------------------

@pytest.mark.parametrize("store", ["s3://bucket with space/p", "s3://AKIDKEY:hunter2secret@bucket/p"])
def test_a_malformed_store_url_is_a_usage_error_that_repeats_no_secret(store, tmp_path, postgres_url):
    run = machine(tmp_path, "a", store, postgres_url)
    err = one_line_error(run("init"), 2)
    assert "hunter2secret" not in err and "s3://BUCKET/PREFIX" in err
    assert not (tmp_path / "cache-a").exists()
    lap = tmp_path / "laptop"
    assert run_cli("init", lap).code == 0
    added = run_cli("--store", lap, "remote", "add", "team", store, "--refs", postgres_url)
    assert "hunter2secret" not in one_line_error(added, 2)
    assert run_cli("--store", lap, "--json", "remote", "list").json() == {"remotes": []}


@pytest.mark.parametrize("endpoint", ["not-a-url", "http://127.0.0.1:99999", "ftp://127.0.0.1:21"])
def test_a_malformed_endpoint_is_a_usage_error_naming_the_variable(endpoint, tmp_path, s3_url, postgres_url):
    result = machine(tmp_path, "a", s3_url, postgres_url)("log", env={"AWS_ENDPOINT_URL": endpoint})
    assert "$AWS_ENDPOINT_URL" in one_line_error(result, 2)
    assert not (tmp_path / "cache-a").exists()


def test_an_endpoint_with_user_information_is_never_printed(tmp_path, s3_url, postgres_url):
    result = machine(tmp_path, "a", s3_url, postgres_url)(
        "log", env={"AWS_ENDPOINT_URL": "http://user:hunter2secret@127.0.0.1:9", "AGENTCAS_RETRY_SECONDS": "0.2"})
    err = one_line_error(result, 1)
    assert "S3 at http://127.0.0.1:9" in err and "hunter2secret" not in err


@pytest.mark.parametrize("query", ["sslmode=bogus", "connect_timeout=abc"])
def test_a_malformed_refs_url_parameter_is_a_usage_error_at_once(query, team, tmp_path):
    """libpq checks these only when it connects: they were retried as an unavailable server
    for $AGENTCAS_RETRY_SECONDS, or crashed as an internal error (exit 1)."""
    s3_url, refs = team.urls
    ws = write(tmp_path / "ws", {"a.txt": "a\n"})
    result = machine(tmp_path, "b", s3_url, f"{refs}?{query}")(
        "commit", ws, "-m", "x", env={"AGENTCAS_RETRY_SECONDS": "60"}, timeout=30)
    assert one_line_error(result, 2).startswith("agentcas: error: not a valid PostgreSQL URL")
    assert team("a")("--json", "branch").json()["threads"] == []


# -- credentials appear in no output, report, bundle, row or cache file -----------------

def test_credentials_appear_nowhere(tmp_path, s3_url, postgres_url, s3_server):
    refs = postgres_url.replace("agentcas@", f"agentcas:{PG_PASSWORD}@")
    env = {"PGPASSWORD": "", "AGENTCAS_CACHE_DIR": str(tmp_path / "cache")}
    ws = write(tmp_path / "ws", {"a.txt": "a\n", "b.bin": os.urandom(100_000)})
    outputs = []

    def run(*args, code=0):
        result = run_cli("--store", s3_url, "--refs", refs, *args, env=env)
        assert result.code == code, result
        outputs.append(result.out + result.err)
        if result.out.strip() and "--json" in args:
            json.loads(result.out)
        return result
    run("--json", "init")
    run("--json", "commit", ws, "-m", "one")
    run("--json", "fsck")
    run("--json", "gc", "--grace", "0s", "--report", tmp_path / "report.json")
    run("export", "main", "-o", tmp_path / "main.bundle")
    run("--json", "remote", "add", "self", s3_url, "--refs", refs, code=2)
    run("show", "no-such-thread", code=1)
    bad_pw = run_cli("--store", s3_url, "--refs", refs.replace(PG_PASSWORD, "wrong-" + PG_PASSWORD), "log",
                     env=env)
    outputs.append(bad_pw.out + bad_pw.err)
    one_line_error(bad_pw, 1)
    files = [tmp_path / "report.json", tmp_path / "main.bundle"] + \
        [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]
    blobs = [o.encode() for o in outputs] + [f.read_bytes() for f in files]
    bucket, _, prefix = s3_url[len("s3://"):].partition("/")
    client = s3_server.client()
    for obj in client.list_objects_v2(Bucket=bucket, Prefix=prefix + "/")["Contents"]:
        blobs.append(client.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read())
    import psycopg
    with psycopg.connect(postgres_url, password=PG_PASSWORD) as conn:
        blobs += [bytes(k) + bytes(v) for k, v in conn.execute("SELECT key, value FROM agentcas_kv")]
    for secret in (PG_PASSWORD, S3_SECRET_KEY):
        assert not [b for b in blobs if secret.encode() in b], secret


# -- FORMAT.md: stores and databases of the previous versions --------------------------

def test_a_schema_version_1_database_is_refused_until_init_migrates_it(team, tmp_path):
    a = team("a")
    ws = write(tmp_path / "ws", {"a.txt": "kept\n"})
    made = a("--json", "commit", ws, "-m", "before").json()
    import psycopg
    with psycopg.connect(team.urls[1], password=PG_PASSWORD, autocommit=True) as conn:
        conn.execute("DROP FUNCTION agentcas_exchange")
        conn.execute("UPDATE agentcas_schema_version SET version = 1")
    err = one_line_error(team("b")("commit", ws, "-m", "refused"), 1)
    assert "schema version 1" in err and "agentcas init" in err, err
    assert team("b")("--json", "init").json()["created"] is False
    after = team("b")("--json", "commit", ws, "-m", "after")
    assert after.code == 0 and after.json()["parents"] == [made["checkpoint"]], after


def test_a_format_1_store_works_through_the_cli_and_a_newer_one_is_refused(tmp_path):
    with tarfile.open(os.path.join(HERE, "data", "store-v1.tar.gz")) as tar:
        tar.extractall(tmp_path, filter="data")
    store = tmp_path / "v1store"
    log = run_cli("--json", "log", "main", store=store)
    assert log.code == 0 and log.json()["checkpoints"][0]["reason"] == "first", log
    assert run_cli("--json", "fsck", store=store).json()["ok"]
    ws = write(tmp_path / "ws", {"task.json": '{"step": 9}\n'})
    made = run_cli("--json", "commit", ws, "-m", "in format 2", store=store)
    assert made.code == 0 and run_cli("--json", "show", "main", store=store).json()["format"] == 2
    assert run_cli("checkout", "main@{3}", tmp_path / "old", store=store).code == 0
    # The same store marked as a future format: refused, saying to upgrade.
    import lmdb

    from agentcas.cas import encoding
    from agentcas.cas.sealed import seal, unseal
    from agentcas.cas.store_format import STORE_FORMAT
    future = STORE_FORMAT + 1
    env = lmdb.open(str(store), max_dbs=20)
    meta = env.open_db(b"meta")
    with env.begin(write=True) as txn:
        doc = encoding.decode(unseal("meta", b"format", txn.get(b"format", db=meta)))
        txn.put(b"format", seal("meta", b"format", encoding.encode(dict(doc, format=future))), db=meta)
    env.close()
    for args in (("log", "main"), ("commit", ws, "-m", "refused")):
        err = one_line_error(run_cli(*args, store=store), 4)
        assert f"format {future}" in err and "upgrade agentcas" in err


# -- --refs with a directory store is a usage error ------------------------------------------------

def test_refs_with_a_directory_store_is_a_usage_error_not_ignored(tmp_path):
    """`--store ./dir --refs postgresql://...` looked like the team's store and committed
    to the directory; $AGENTCAS_REFS, which a shell may set for every command, stays quiet."""
    lap = tmp_path / "laptop"
    refs = "postgresql://agentcas@127.0.0.1:1/db"
    assert "--refs is only for an s3://" in one_line_error(run_cli("--refs", refs, "init", lap), 2)
    assert not lap.exists()
    assert run_cli("init", lap).code == 0
    ws = write(tmp_path / "ws", {"a.txt": "a\n"})
    one_line_error(run_cli("--store", lap, "--refs", refs, "commit", ws, "-m", "x"), 2)
    assert run_cli("--store", lap, "--json", "branch").json()["threads"] == []
    quiet = run_cli("--store", lap, "commit", ws, "-m", "x", env={"AGENTCAS_REFS": refs})
    assert quiet.code == 0, quiet


# -- fsck names objects the bucket lost, even where the cache holds them ---------------------------

@pytest.mark.parametrize("lost", ["tree", "segment"])
def test_fsck_names_an_object_the_bucket_lost_even_where_the_cache_holds_it(lost, team, tmp_path, s3_server):
    a = team("a")
    ws = write(tmp_path / "ws", {"a.txt": "one\n", "rollout.jsonl": '{"role": "user", "text": "hi"}\n'})
    made = a("--json", "commit", ws, "-m", "x", "--rollout", ws / "rollout.jsonl").json()
    gone = made["tree"] if lost == "tree" else made["history"]["segment"]
    lose_object(*team.urls, gone)
    fsck = a("--json", "fsck")
    assert fsck.code == 4, fsck
    assert [(p["what"], p["id"]) for p in fsck.json()["problems"]] == [("missing", gone)], fsck.json()
