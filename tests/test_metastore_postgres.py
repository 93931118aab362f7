"""The PostgreSQL metadata store on a real server: schema versions, secrets, connections, faults.

Fault tests run their own server (stopping it disturbs no other test) with a short
retry bound ($AGENTCAS_RETRY_SECONDS), and check the one-line error naming the service.
"""

from __future__ import annotations

import re
import threading
import time

import psycopg
import pytest

from agentcas import Store, testing_hooks
from agentcas.cas.metastore.base import MetadataUnavailable, Read
from agentcas.cas.metastore.postgres import SCHEMA_VERSION, PostgresMetadataStore, SchemaMissing, SchemaTooNew

from support.cli import run_cli
from support.services import PG_PASSWORD, PostgresServer


@pytest.fixture
def own_postgres(monkeypatch):
    """A PostgreSQL of this test's own."""
    server = PostgresServer()
    for name, val in server.env().items():
        monkeypatch.setenv(name, val)
    monkeypatch.setenv("AGENTCAS_RETRY_SECONDS", "3")
    yield server
    server.close()


def test_the_schema_is_created_by_init_and_versioned(postgres_url):
    with pytest.raises(SchemaMissing, match=r"PostgreSQL at 127\.0\.0\.1:\d+/\w+ has no agentcas schema.*init"):
        PostgresMetadataStore(postgres_url)
    store = PostgresMetadataStore(postgres_url, create=True)
    store.write(lambda txn: txn.put("refs", b"t", b"1"))
    again = PostgresMetadataStore(postgres_url, create=True)  # idempotent, keeps the rows
    with PostgresMetadataStore(postgres_url).reader() as txn:
        assert txn.get("refs", b"t") == b"1"
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        assert conn.execute("SELECT version FROM agentcas_schema_version").fetchall() == [(SCHEMA_VERSION,)]
        conn.execute("UPDATE agentcas_schema_version SET version = 99")
    for create in (False, True):
        with pytest.raises(SchemaTooNew, match="version 99, newer than this agentcas understands.*upgrade"):
            PostgresMetadataStore(postgres_url, create=create)
    store.close()
    again.close()


def test_the_url_and_errors_never_carry_the_password(postgres_server, postgres_url, monkeypatch):
    host_part = postgres_url.split("@", 1)[1]
    with_password = f"postgresql://agentcas:{PG_PASSWORD}@{host_part}"
    monkeypatch.delenv("PGPASSWORD")
    store = PostgresMetadataStore(with_password, create=True)
    assert PG_PASSWORD not in store.url and store.url == postgres_url
    wrong = "not-the-password-x1"
    monkeypatch.setenv("AGENTCAS_RETRY_SECONDS", "120")  # a retrying client would take this long
    started = time.monotonic()
    with pytest.raises(MetadataUnavailable) as raised:
        PostgresMetadataStore(f"postgresql://agentcas:{wrong}@{host_part}")
    message = str(raised.value)
    assert message.startswith(f"PostgreSQL at 127.0.0.1:{postgres_server.port}/")
    assert "authentication failed" in message and wrong not in message and "\n" not in message
    assert time.monotonic() - started < 60  # a refusal is final: no retries (they would take 120 s)
    store.close()


def test_connections_are_reused(postgres_url):
    store = PostgresMetadataStore(postgres_url, create=True)
    for i in range(30):
        store.write(lambda txn: txn.put("refs", b"t", b"%d" % i))
        with store.reader() as txn:
            assert txn.get("refs", b"t") == b"%d" % i
    assert store.connections == 1
    store.close()


def test_a_stopped_server_is_retried_then_named(own_postgres):
    url = own_postgres.create_database()
    store = PostgresMetadataStore(url, create=True)
    store.write(lambda txn: txn.put("refs", b"t", b"1"))
    own_postgres.stop()
    for operation in (lambda: store.write(lambda txn: txn.put("refs", b"t", b"2")),
                      lambda: store.reader().__enter__(), lambda: PostgresMetadataStore(url)):
        started = time.monotonic()
        with pytest.raises(MetadataUnavailable) as raised:
            operation()
        elapsed = time.monotonic() - started
        message = str(raised.value)
        assert message.startswith(f"PostgreSQL at 127.0.0.1:{own_postgres.port}/") and "unavailable after" in message
        assert "\n" not in message and PG_PASSWORD not in message
        assert 2.5 <= elapsed < 40  # slack for a loaded machine
    own_postgres.start()
    with store.reader() as txn:  # the same store: its dead pooled connections are replaced
        assert txn.get("refs", b"t") == b"1"
    store.write(lambda txn: txn.put("refs", b"t", b"3"))
    store.close()


def test_a_server_killed_inside_a_write_reruns_the_whole_write(own_postgres, monkeypatch):
    monkeypatch.setenv("AGENTCAS_RETRY_SECONDS", "30")
    store = PostgresMetadataStore(own_postgres.create_database(), create=True)
    store.write(lambda txn: txn.put("refs", b"t", b"old"))
    runs = []
    restart = threading.Timer(0.5, own_postgres.start)

    def move(txn):
        runs.append(1)
        assert txn.compare_and_set("refs", b"t", b"old", b"new")
        txn.put("reflog", b"entry", b"old -> new")
        if len(runs) == 1:
            own_postgres.kill()  # SIGKILL mid-transaction: nothing of it is committed
            restart.start()
            txn.get("refs", b"t")  # the connection is gone: the whole fn runs again
        return "moved"
    try:
        assert store.write(move) == "moved" and len(runs) == 2
    finally:
        restart.join()  # never left to start a server after the fixture removed its directory
    with store.reader() as txn:
        assert txn.get("refs", b"t") == b"new" and txn.get("reflog", b"entry") == b"old -> new"
    store.close()


def test_the_url_must_be_postgresql():
    with pytest.raises(ValueError):
        PostgresMetadataStore("mysql://x@y/z")


# --- a hung server: it accepts connections (the kernel does) but never answers ----------------

@pytest.fixture
def hung_postgres(own_postgres, monkeypatch):
    """own_postgres with a 1 s statement bound ($AGENTCAS_PG_TIMEOUT); resumed at the end."""
    monkeypatch.setenv("AGENTCAS_PG_TIMEOUT", "1")
    yield own_postgres
    own_postgres.resume()


def assert_named_unavailable(raised, server, began) -> None:
    message = str(raised.value)
    assert message.startswith(f"PostgreSQL at 127.0.0.1:{server.port}/") and "unavailable after" in message
    assert "\n" not in message and PG_PASSWORD not in message
    assert time.monotonic() - began < 30  # bounded (retry 3 s + one connect or answer bound)


def test_a_hung_server_gives_a_bounded_wait_then_names_postgresql(hung_postgres):
    url = hung_postgres.create_database()
    store = PostgresMetadataStore(url, create=True)
    store.write(lambda txn: txn.put("refs", b"t", b"1"))  # a pooled connection, open when it hangs
    hung_postgres.hang()
    for operation in (lambda: store.write(lambda txn: txn.put("refs", b"t", b"2")),
                      lambda: store.reader().__enter__(), lambda: PostgresMetadataStore(url)):
        began = time.monotonic()
        with pytest.raises(MetadataUnavailable) as raised:
            operation()
        assert_named_unavailable(raised, hung_postgres, began)
        assert "no answer within" in str(raised.value) or "timeout expired" in str(raised.value)
    hung_postgres.resume()
    with store.reader() as txn:  # the abandoned connections are replaced
        # The first write's BEGIN, INSERT and COMMIT went out in one pipeline before the
        # server stopped: it reads them when it resumes, and may commit what the client
        # called failed (a COMMIT whose answer is lost: the module doc's unknown outcome).
        assert txn.get("refs", b"t") in (b"1", b"2")
    store.write(lambda txn: txn.put("refs", b"t", b"3"))
    store.close()


def test_a_write_sent_to_a_hung_server_is_reported_as_of_unknown_outcome(hung_postgres):
    """An exchange (one statement: a ref move) sent on an open connection to a server that
    then hangs is queued there and applied when it wakes, after the command said it failed:
    seen as a commit that exited 1 and landed. The error says the write may still apply,
    and a read that times out does not."""
    store = PostgresMetadataStore(hung_postgres.create_database(), create=True)
    store.exchange(writes=[("refs", b"t", b"1")])   # a pooled connection, open when it hangs
    hung_postgres.hang()
    with pytest.raises(MetadataUnavailable) as raised:
        store.exchange(writes=[("refs", b"t", b"2")])
    assert "sent and never answered" in str(raised.value) and "before retrying" in str(raised.value)
    hung_postgres.resume()
    store.exchange(writes=[("refs", b"t", b"3")])
    store.exchange(reads=[Read("refs", b"t")])
    hung_postgres.hang()
    with pytest.raises(MetadataUnavailable) as raised:
        store.exchange(reads=[Read("refs", b"t")])
    assert "never answered" not in str(raised.value)
    hung_postgres.resume()
    store.close()


def test_a_server_that_stops_answering_mid_transaction(hung_postgres):
    store = PostgresMetadataStore(hung_postgres.create_database(), create=True)
    store.write(lambda txn: txn.put("refs", b"t", b"old"))
    runs = []

    def move(txn):
        runs.append(1)
        assert txn.get("refs", b"t", for_update=True) == b"old"  # the row locked, the transaction open
        if len(runs) == 1:
            hung_postgres.hang()
        assert txn.compare_and_set("refs", b"t", b"old", b"new")
        txn.put("reflog", b"entry", b"old -> new")
        txn.get("refs", b"other")  # waits for an answer that does not come
        return "moved"
    began = time.monotonic()
    with pytest.raises(MetadataUnavailable) as raised:
        store.write(move)
    assert_named_unavailable(raised, hung_postgres, began)
    hung_postgres.resume()
    with store.reader() as txn:  # the open transaction never committed
        assert txn.get("refs", b"t") == b"old" and txn.get("reflog", b"entry") is None
    assert store.write(move) == "moved"  # and its lock is gone
    store.close()


def test_a_hung_client_holding_a_row_lock_is_bounded_by_the_server(hung_postgres):
    """A client that stopped inside a transaction holding the ref's row lock: the server
    cancels the waiting statement (statement_timeout), so the move fails in bounded time
    naming PostgreSQL; once the holder is gone the move lands."""
    store = PostgresMetadataStore(hung_postgres.create_database(), create=True)
    store.write(lambda txn: txn.put("refs", b"t", b"old"))
    holder = PostgresMetadataStore(store.url)._connect()  # with agentcas's session settings
    holder.execute("BEGIN")
    holder.execute("SELECT value FROM agentcas_kv WHERE tbl = 'refs' AND key = 't' FOR UPDATE")
    began = time.monotonic()
    with pytest.raises(MetadataUnavailable) as raised:
        store.write(lambda txn: txn.compare_and_set("refs", b"t", b"old", b"new"))
    assert_named_unavailable(raised, hung_postgres, began)
    assert "statement timeout" in str(raised.value)
    holder.close()
    assert store.write(lambda txn: txn.compare_and_set("refs", b"t", b"old", b"new"))
    store.close()


def test_a_commit_to_a_shared_store_on_a_hung_server(hung_postgres, s3_url, workspace, tmp_path):
    """The CLI: one line naming PostgreSQL, exit 1, nothing landed; after the server
    resumes, the rerun commits and fsck is clean."""
    env = {"AGENTCAS_STORE": s3_url, "AGENTCAS_REFS": hung_postgres.create_database(),
           "AGENTCAS_CACHE_DIR": str(tmp_path / "cache")}
    assert run_cli("init", env=env).code == 0
    assert run_cli("commit", workspace, "-m", "before", env=env).code == 0
    (workspace / "new.txt").write_text("after the hang\n")
    hung_postgres.hang()
    began = time.monotonic()
    hung = run_cli("commit", workspace, "-m", "during", env=env, timeout=90)
    assert hung.code == 1 and hung.out == "", hung
    assert hung.err.count("\n") == 1 and hung.err.startswith(
        f"agentcas: error: PostgreSQL at 127.0.0.1:{hung_postgres.port}/"), hung.err
    assert "unavailable after" in hung.err and PG_PASSWORD not in hung.err
    assert time.monotonic() - began < 60
    hung_postgres.resume()
    log = run_cli("--json", "log", "main", env=env).json()
    assert [c["reason"] for c in log["checkpoints"]] == ["before"]
    assert run_cli("commit", workspace, "-m", "after", env=env).code == 0
    assert run_cli("--json", "fsck", env=env).json()["ok"]


# --- the error says how long the caller waited -------------------------------------------------

def reported_seconds(message: str) -> int:
    found = re.search(r"unavailable after \d+ tr(?:y|ies) in (\d+)s", message)
    assert found, message
    return int(found.group(1))


def test_the_error_says_at_least_the_time_the_caller_waited(hung_postgres, s3_url, tmp_path, monkeypatch):
    """Each way of meeting a hung server, measured here from the moment it hangs: the seconds
    the message reports are never fewer (a commit whose lease was then given back, which
    waited once more after the message was made, said 3 s for 8 s)."""
    url = hung_postgres.create_database()
    store = PostgresMetadataStore(url, create=True)
    store.write(lambda txn: txn.put("refs", b"t", b"1"))  # pooled connections, open when it hangs
    with store.reader() as txn:
        txn.get("refs", b"t")
    monkeypatch.setenv("AGENTCAS_CACHE_DIR", str(tmp_path / "cache"))
    shared, _ = Store.init(s3_url, refs=hung_postgres.create_database())
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("before\n")
    shared.checkpoints.commit(str(ws), "before")
    (ws / "a.txt").write_text("during\n")

    def read_in_a_reader():
        with store.reader() as txn:
            hung_postgres.hang()
            waited["from"] = time.monotonic()
            txn.get("refs", b"t")

    def commit_hung_before_landing():
        def hang():
            hung_postgres.hang()
            waited["from"] = time.monotonic()
        with testing_hooks.on("commit.before_land", hang):
            shared.checkpoints.commit(str(ws), "during")

    cases = {"write on an open connection": lambda: store.write(lambda txn: txn.put("refs", b"t", b"2")),
             "statement in a reader": read_in_a_reader,
             "connecting": lambda: PostgresMetadataStore(url),
             "commit landing": commit_hung_before_landing}
    for name, operation in cases.items():
        waited = {"from": time.monotonic()}
        if name in ("write on an open connection", "connecting"):
            hung_postgres.hang()
            waited["from"] = time.monotonic()
        with pytest.raises(MetadataUnavailable) as raised:
            operation()
        seconds = time.monotonic() - waited["from"]
        assert reported_seconds(str(raised.value)) >= seconds, (name, seconds, str(raised.value))
        assert_named_unavailable(raised, hung_postgres, waited["from"])
        hung_postgres.resume()
    store.close()
