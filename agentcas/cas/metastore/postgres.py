"""The PostgreSQL metadata store (psycopg 3): every table is rows of one SQL table.

    agentcas_kv(tbl text, key bytea, value bytea, PRIMARY KEY (tbl, key))

bytea compares bytewise (memcmp, then length), so `ORDER BY key` is the byte order
every backend's `scan` promises; a scan pages through the primary key 1,000 rows at a
time (keyset: `key > last`), so a long scan holds no cursor and may interleave with
writes of the same transaction. The schema is versioned (`agentcas_schema_version`,
migrations below, applied by `create=True` under an advisory lock); a database of a
newer version is refused.

`write(fn)` is one READ COMMITTED transaction. A ref move is `compare_and_set`:
`UPDATE ... WHERE value = old` (INSERT ... ON CONFLICT DO NOTHING when old is None,
DELETE ... WHERE value = old when new is None); PostgreSQL re-checks the WHERE clause
against a row a concurrent transaction changed, so the row count decides the race.
A serialization failure, a deadlock or a dropped connection re-runs the whole `fn`
on a fresh connection, with exponential backoff, for at most $AGENTCAS_RETRY_SECONDS
(20 s); then MetadataUnavailable names the server (host:port/db, never a password).
`reader()` is a REPEATABLE READ READ ONLY transaction: one snapshot, taken at once.
Statements whose result is not read (BEGIN, `put`) are held back and pipelined with the
next statement or the COMMIT, so a ref move (SELECT, UPDATE, reflog put) costs three
round trips; two when the ref was read `for_update` (the row is locked, so its
compare_and_set is decided without asking and its UPDATE goes with the COMMIT).

`exchange` (reads, expectations and writes decided together) is one call of the SQL
function agentcas_exchange, added by schema version 2: one round trip, atomic as its
own transaction. It is how a store is opened, a lease taken and a ref moved, so an
unchanged recommit costs three round trips in all (`round_trips` counts them). The
schema is then checked by the first request (the function returns the version).

A dropped connection during COMMIT leaves it unknown whether the transaction
committed; `fn` is then run again, so a ref move may find its own earlier success (the
caller sees the new value instead of the old one).

Connections: a small per-process pool (one connection per concurrent transaction,
kept idle for reuse, at most POOL_SIZE idle); after a fork the child opens its own.
A hung server (it accepts connections but never answers, or stops answering inside a
transaction) is bounded three ways, all from $AGENTCAS_PG_TIMEOUT (T, default 15 s):
connecting (TCP, TLS, authentication) gives up after CONNECT_SECONDS (libpq's
`connect_timeout`, unless the URL sets one); the server cancels a statement running
longer than T (`statement_timeout`: e.g. waiting for a row lock that a hung client
holds); and every wait for an answer ends after T + ANSWER_GRACE on the client
(`_BoundedConnection.wait`), which closes the connection, since a stopped server
cancels nothing. Each is a retryable error, so the operation is retried until
$AGENTCAS_RETRY_SECONDS, then MetadataUnavailable. (No idle-in-transaction bound: gc
plans inside one long read-only transaction while it lists the bucket.)
`statements` and `connections` count what was sent (benchmarks, request budgets).
Crash points (cas/crashpoints.py): `pg.open` before a write's COMMIT (or before an exchange
that writes is sent), `pg.commit` after it.
"""

from __future__ import annotations

import os
import re
import threading
import time
from contextlib import contextmanager
from typing import Any
from urllib.parse import quote

import psycopg
from psycopg import errors as pg_errors
from psycopg.conninfo import conninfo_to_dict, timeout_from_conninfo

from agentcas.cas import crashpoints, settings
from agentcas.cas.metastore.base import TABLES, MetadataStore, MetadataUnavailable, MetaTxn, prefix_end
from agentcas.cas.retry import Retry
from agentcas.errors import UsageError

SCHEMA_VERSION = 2
# agentcas_exchange: MetadataStore.exchange as one statement (one round trip). Point reads
# and expectations lock their rows (FOR UPDATE); a failed expectation writes nothing. It
# also returns the schema version, so a store's first request checks the schema for free.
_EXCHANGE_FUNCTION = """
CREATE OR REPLACE FUNCTION agentcas_exchange(
    r_tbl text[], r_key bytea[], r_end bytea[], r_last boolean[],
    e_tbl text[], e_key bytea[], e_val bytea[],
    w_tbl text[], w_key bytea[], w_val bytea[])
RETURNS TABLE (applied boolean, schema integer, keys bytea[], vals bytea[])
LANGUAGE plpgsql AS $fn$
DECLARE
    i integer;
    k bytea;
    v bytea;
    ks bytea[] := '{}';
    vs bytea[] := '{}';
    ok boolean := true;
BEGIN
    FOR i IN 1 .. coalesce(array_length(r_tbl, 1), 0) LOOP
        k := NULL;
        v := NULL;
        IF r_last[i] THEN
            SELECT t.key, t.value INTO k, v FROM agentcas_kv t
             WHERE t.tbl = r_tbl[i] AND t.key >= r_key[i] AND (r_end[i] IS NULL OR t.key < r_end[i])
             ORDER BY t.key DESC LIMIT 1;
        ELSE
            SELECT t.key, t.value INTO k, v FROM agentcas_kv t
             WHERE t.tbl = r_tbl[i] AND t.key = r_key[i] FOR UPDATE;
        END IF;
        ks := array_append(ks, k);
        vs := array_append(vs, v);
    END LOOP;
    FOR i IN 1 .. coalesce(array_length(e_tbl, 1), 0) LOOP
        v := NULL;
        SELECT t.value INTO v FROM agentcas_kv t WHERE t.tbl = e_tbl[i] AND t.key = e_key[i] FOR UPDATE;
        IF v IS DISTINCT FROM e_val[i] THEN
            ok := false;
            EXIT;
        END IF;
    END LOOP;
    IF ok THEN
        FOR i IN 1 .. coalesce(array_length(w_tbl, 1), 0) LOOP
            IF w_val[i] IS NULL THEN
                DELETE FROM agentcas_kv WHERE tbl = w_tbl[i] AND key = w_key[i];
            ELSE
                INSERT INTO agentcas_kv (tbl, key, value) VALUES (w_tbl[i], w_key[i], w_val[i])
                ON CONFLICT (tbl, key) DO UPDATE SET value = EXCLUDED.value;
            END IF;
        END LOOP;
    END IF;
    RETURN QUERY SELECT ok, (SELECT max(version) FROM agentcas_schema_version), ks, vs;
END
$fn$"""
MIGRATIONS = {
    1: ["CREATE TABLE agentcas_kv (tbl text NOT NULL, key bytea NOT NULL, value bytea NOT NULL,"
        " PRIMARY KEY (tbl, key))"],
    2: [_EXCHANGE_FUNCTION],
}
_MIGRATION_LOCK = 0x61676E74636173  # pg_advisory_xact_lock key: "agntcas"
SCAN_PAGE = 1000
POOL_SIZE = 8
CONNECT_SECONDS = 5
TIMEOUT_SECONDS = 15.0  # $AGENTCAS_PG_TIMEOUT: statement_timeout, and the client's wait (+ ANSWER_GRACE)
ANSWER_GRACE = 2.0      # a live server's own cancel (statement_timeout) arrives before the client gives up


def timeout_seconds() -> float:
    """How long one statement may take ($AGENTCAS_PG_TIMEOUT, seconds; 0 turns the bounds off)."""
    return settings.number("AGENTCAS_PG_TIMEOUT", TIMEOUT_SECONDS)


class NoAnswer(psycopg.OperationalError):
    """The server sent no answer in time: the connection was closed (a retryable error)."""


class _BoundedConnection(psycopg.Connection):
    """A connection whose every wait for the server (a statement, a pipeline sync, a
    COMMIT) ends after `answer_seconds`: a hung server becomes a dropped connection."""

    answer_seconds: float | None = None

    def wait(self, gen, interval=getattr(psycopg.connection, "_WAIT_INTERVAL", 0.1), timeout=None):
        if timeout is None:
            timeout = self.answer_seconds
        try:
            return super().wait(gen, interval=interval, timeout=timeout)
        except psycopg.errors._WaitTimeout:
            self.close()  # its state is unknown: never reused, never sent a ROLLBACK
            raise NoAnswer(f"no answer within {timeout:g}s (server hung or overloaded)") from None


class SchemaMissing(MetadataUnavailable):
    """The database has no agentcas schema (or an older one): `agentcas init` creates it."""


class SchemaTooNew(MetadataUnavailable):
    """The database was migrated by a newer agentcas: refuse rather than corrupt it."""


_RETRYABLE = (pg_errors.SerializationFailure, pg_errors.DeadlockDetected, psycopg.OperationalError,
              psycopg.InterfaceError, pg_errors.IdleInTransactionSessionTimeout)  # the last: a server's own bound
# Connection errors no retry can fix.
_FINAL_MARKERS = ("authentication failed", "does not exist", "no password supplied", "permission denied",
                  "no pg_hba.conf entry", "role ")

# libpq's words for a connection parameter it cannot use ("invalid sslmode value: ...",
# 'invalid integer value "x" for connection option "keepalives"', "invalid port number").
_BAD_PARAMETER = re.compile(r"\binvalid (?:[a-z_]+ value|integer value|port number)\b")

_ABANDONED: list = []  # connections inherited over fork: never closed (that would end the parent's session)


def _check_table(table: str) -> str:
    if table not in TABLES:
        raise KeyError(f"no metadata table {table!r}")
    return table


class _PgTxn(MetaTxn):
    """Statements whose result nobody reads (BEGIN, put) wait and go out in one pipeline
    with the next statement or the COMMIT: a ref move is three round trips, not five."""

    def __init__(self, store: PostgresMetadataStore, conn: psycopg.Connection, writable: bool,
                 begin: str | None = None):
        self._store = store
        self._conn = conn
        self._writable = writable
        self._pending: list[tuple[str, tuple]] = [(begin, ())] if begin else []
        self.begun = begin is None
        # Rows this transaction holds FOR UPDATE, with the value they hold now: no other
        # writer can change them before COMMIT, so a compare_and_set on one is decided
        # here and its UPDATE waits for the next round trip (a locked ref move: two).
        self._locked: dict[tuple[str, bytes], bytes] = {}
        self.sent_at = time.monotonic()  # when the latest statement went out

    def _run(self, sql: str, params: tuple = ()):
        self.sent_at = time.monotonic()
        self._store.statements += 1
        self._store.round_trips += 1
        if not self._pending:
            return self._conn.execute(sql, params, binary=True)
        with self._conn.pipeline():
            for pending_sql, pending_params in self._pending:
                self._conn.execute(pending_sql, pending_params, binary=True)
            cursor = self._conn.execute(sql, params, binary=True)
        self._pending.clear()
        self.begun = True
        return cursor

    def _defer(self, sql: str, params: tuple) -> None:
        self._store.statements += 1
        self._pending.append((sql, params))

    def commit(self) -> None:
        """COMMIT with whatever is still waiting (nothing at all if nothing was sent)."""
        if not self.begun and all(sql.startswith("BEGIN") for sql, _ in self._pending):
            self._pending.clear()
            return
        self._run("COMMIT")

    def _writing(self) -> None:
        if not self._writable:
            raise PermissionError("a metadata reader cannot write")

    def get(self, table, key, for_update=False):
        lock = " FOR UPDATE" if for_update and self._writable else ""
        row = self._run(f"SELECT value FROM agentcas_kv WHERE tbl = %s AND key = %s{lock}",
                        (_check_table(table), bytes(key))).fetchone()
        value = None if row is None else bytes(row[0])
        if lock and value is not None:
            self._locked[(table, bytes(key))] = value
        return value

    def scan(self, table, prefix=b"", start=None, reverse=False):
        _check_table(table)
        prefix = bytes(prefix)
        end = prefix_end(prefix)
        where, params = ["tbl = %s", "key >= %s"], [table, prefix]
        if end is not None:
            where.append("key < %s")
            params.append(end)
        if start is not None:
            where.append("key <= %s" if reverse else "key >= %s")
            params.append(bytes(start))
        order = "DESC" if reverse else "ASC"
        after = None
        while True:
            page_where, page_params = list(where), list(params)
            if after is not None:
                page_where.append("key < %s" if reverse else "key > %s")
                page_params.append(after)
            rows = self._run(f"SELECT key, value FROM agentcas_kv WHERE {' AND '.join(page_where)} "
                             f"ORDER BY key {order} LIMIT {SCAN_PAGE}", tuple(page_params)).fetchall()
            for key, value in rows:
                yield bytes(key), bytes(value)
            if len(rows) < SCAN_PAGE:
                return
            after = bytes(rows[-1][0])

    def put(self, table, key, value):
        self._writing()
        self._relock(table, key, value)
        self._defer("INSERT INTO agentcas_kv (tbl, key, value) VALUES (%s, %s, %s) "
                  "ON CONFLICT (tbl, key) DO UPDATE SET value = EXCLUDED.value",
                  (_check_table(table), bytes(key), bytes(value)))

    def _relock(self, table: str, key: bytes, value: bytes | None) -> None:
        """Keep the locked value in step with this transaction's own writes (a deleted row
        is no longer known to be locked)."""
        if (table, bytes(key)) in self._locked:
            if value is None:
                del self._locked[(table, bytes(key))]
            else:
                self._locked[(table, bytes(key))] = bytes(value)

    def put_new(self, table, key, value):
        self._writing()
        return self._run("INSERT INTO agentcas_kv (tbl, key, value) VALUES (%s, %s, %s) "
                         "ON CONFLICT (tbl, key) DO NOTHING",
                         (_check_table(table), bytes(key), bytes(value))).rowcount == 1

    def delete(self, table, key):
        self._writing()
        self._relock(table, key, None)
        return self._run("DELETE FROM agentcas_kv WHERE tbl = %s AND key = %s",
                         (_check_table(table), bytes(key))).rowcount == 1

    def compare_and_set(self, table, key, old, new):
        self._writing()
        table, key = _check_table(table), bytes(key)
        if old is None and new is None:
            return self.get(table, key, for_update=True) is None
        if old is None:
            return self.put_new(table, key, new)
        held = self._locked.get((table, key))
        if held is not None and new is not None:
            if held != bytes(old):
                return False
            self._relock(table, key, new)
            self._defer("UPDATE agentcas_kv SET value = %s WHERE tbl = %s AND key = %s",
                        (bytes(new), table, key))
            return True
        if new is None:
            self._relock(table, key, None)
            sql, params = "DELETE FROM agentcas_kv WHERE tbl = %s AND key = %s AND value = %s", (table, key, bytes(old))
        else:
            sql = "UPDATE agentcas_kv SET value = %s WHERE tbl = %s AND key = %s AND value = %s"
            params = (bytes(new), table, key, bytes(old))
        return self._run(sql, params).rowcount == 1

    def count(self, table):
        return self._run("SELECT count(*) FROM agentcas_kv WHERE tbl = %s", (_check_table(table),)).fetchone()[0]


class PostgresMetadataStore(MetadataStore):
    """Metadata tables in one PostgreSQL database, at `postgresql://USER@HOST:PORT/DB`."""

    def __init__(self, dsn: str, create: bool = False, check: bool = True):
        if not dsn.startswith(("postgresql://", "postgres://")):
            raise ValueError("a PostgreSQL metadata store URL starts with postgresql://")
        try:
            params = conninfo_to_dict(dsn)
        except psycopg.ProgrammingError:
            raise UsageError("not a valid PostgreSQL URL (postgresql://USER@HOST:PORT/DB)") from None
        # A malformed URL is the user's to fix, not a server to wait for: libpq would only
        # refuse the port at connect time, after every retry.
        for port in str(params.get("port") or "").split(",") if params.get("port") else ():
            if not (port.isdigit() and 0 < int(port) < 65536):
                raise UsageError(f"not a valid PostgreSQL URL: port {port!r} is not a number in 1..65535 "
                                 "(postgresql://USER@HOST:PORT/DB)")
        try:
            timeout_from_conninfo(params)  # psycopg's own parameter (also $PGCONNECT_TIMEOUT)
        except psycopg.ProgrammingError as exc:
            raise UsageError(f"not a valid PostgreSQL URL: {exc} (postgresql://USER@HOST:PORT/DB)") from None
        self._dsn = dsn
        self._params = params
        self._secrets = [str(s) for s in (params.get("password"), os.environ.get("PGPASSWORD")) if s]
        host = str(params.get("host") or os.environ.get("PGHOST") or "localhost")
        port = str(params.get("port") or os.environ.get("PGPORT") or "5432")
        dbname = str(params.get("dbname") or os.environ.get("PGDATABASE") or params.get("user") or "")
        user = params.get("user")
        self.name = f"PostgreSQL at {host}:{port}/{dbname}"
        # The URL without a password: safe to print, store or put in a report.
        self.url = f"postgresql://{quote(str(user), safe='') + '@' if user else ''}" \
                   f"{quote(host, safe='') if host.startswith('/') else host}:{port}/{dbname}"
        self.statements = 0
        self.round_trips = 0
        self.connections = 0
        self._idle: list[psycopg.Connection] = []
        self._pool_lock = threading.Lock()
        self._pid = os.getpid()
        # Without `check`, the schema is checked by the first request (an exchange returns
        # the version with its answer; a reader or writer asks first): opening costs nothing.
        self._schema_checked = False
        if create:
            self._migrate()
            self._schema_checked = True
        elif check:
            self._check_schema()

    # -- connections -------------------------------------------------------------------------

    def _scrub(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    def _reason(self, exc: BaseException) -> str:
        """One line: libpq's cause ("Connection refused", "FATAL: password authentication
        failed ..."), without its hints on further lines."""
        lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
        first = lines[0] if lines else type(exc).__name__
        return self._scrub(first.rsplit("failed: ", 1)[-1] if "failed: " in first else first)

    def _connect(self) -> psycopg.Connection:
        self.connections += 1
        bound = timeout_seconds()
        options: dict[str, Any] = {}
        if "connect_timeout" not in self._params:
            options["connect_timeout"] = CONNECT_SECONDS
        if bound > 0:
            # Ours first: settings the URL gives in its own `options` come later and win.
            ms = max(1, int(bound * 1000))
            options["options"] = " ".join(filter(None, (
                f"-c statement_timeout={ms}",
                str(self._params.get("options") or ""))))
        try:
            conn = _BoundedConnection.connect(self._dsn, autocommit=True, application_name="agentcas", **options)
        except psycopg.OperationalError as exc:
            # libpq checks a URL's parameters (sslmode=..., keepalives=...) only when it
            # connects: a bad one is the user's to fix, not a server to wait for.
            if _BAD_PARAMETER.search(str(exc)):
                raise UsageError(f"not a valid PostgreSQL URL: {self._reason(exc)} "
                                 "(postgresql://USER@HOST:PORT/DB)") from None
            raise
        conn.answer_seconds = bound + ANSWER_GRACE if bound > 0 else None
        return conn

    def _acquire(self) -> psycopg.Connection:
        with self._pool_lock:
            if os.getpid() != self._pid:
                _ABANDONED.extend(self._idle)
                self._idle, self._pid = [], os.getpid()
            while self._idle:
                conn = self._idle.pop()
                if not conn.closed:
                    return conn
        return self._connect()

    def _release(self, conn: psycopg.Connection, broken: bool = False) -> None:
        if os.getpid() != self._pid:
            _ABANDONED.append(conn)
            return
        if broken or conn.closed or conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            try:
                conn.close()
            except Exception:  # noqa: BLE001 - already broken
                pass
            return
        with self._pool_lock:
            if len(self._idle) < POOL_SIZE:
                self._idle.append(conn)
                return
        conn.close()

    def _final(self, exc: BaseException) -> bool:
        """A connection error that retrying cannot fix (bad password, missing database)."""
        if not isinstance(exc, psycopg.OperationalError) or isinstance(exc, psycopg.errors.AdminShutdown):
            return False
        text = str(exc).lower()
        return any(marker in text for marker in _FINAL_MARKERS)

    def _unavailable(self, exc: BaseException, retry: Retry) -> MetadataUnavailable:
        if self._final(exc):
            return MetadataUnavailable(f"{self.name}: {self._reason(exc)}")
        return MetadataUnavailable(f"{self.name} unavailable {retry.summary()}: {self._reason(exc)}")

    def _retrying(self, attempt, retry: Retry | None = None):
        """attempt(conn) on a pooled connection, retried on the retryable errors on a fresh
        connection with backoff (cas/retry.py), then MetadataUnavailable."""
        def once():
            conn = None
            try:
                conn = self._acquire()
                result = attempt(conn)
            except _RETRYABLE:
                if conn is not None:
                    self._release(conn, broken=True)
                raise
            except BaseException:
                if conn is not None:
                    self._release(conn)  # closed unless it is idle (rolled back, or autocommit)
                raise
            return result

        return (retry or Retry()).call(once, lambda exc: isinstance(exc, _RETRYABLE), self._unavailable,
                                       self._final)

    def _run_retrying(self, attempt, isolation: str):
        """attempt(txn) in one transaction at `isolation`, retried on the retryable errors."""
        def in_transaction(conn):
            txn = _PgTxn(self, conn, writable=True, begin=f"BEGIN ISOLATION LEVEL {isolation}")
            try:
                result = attempt(txn)
                crashpoints.reached("pg.open")  # the changes made, not committed
                txn.commit()
            except BaseException:
                self._rollback(conn)
                raise
            return result

        result = self._with_connection(in_transaction)
        crashpoints.reached("pg.commit")
        return result

    def _with_connection(self, attempt):
        """attempt(conn) on a pooled connection, released after it, retried (`_retrying`)."""
        def run(conn):
            result = attempt(conn)
            self._release(conn)
            return result
        return self._retrying(run)

    def _rollback(self, conn: psycopg.Connection) -> None:
        try:
            if not conn.closed and conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                self.statements += 1
                self.round_trips += 1
                conn.execute("ROLLBACK")
        except Exception:  # noqa: BLE001 - the connection is going away anyway
            pass

    # -- schema -----------------------------------------------------------------------------

    def _schema_version(self, txn: _PgTxn) -> int | None:
        exists = txn._run("SELECT to_regclass('agentcas_schema_version') IS NOT NULL").fetchone()[0]
        if not exists:
            return None
        row = txn._run("SELECT max(version) FROM agentcas_schema_version").fetchone()
        return row[0] if row and row[0] is not None else 0

    def _migrate(self) -> None:
        def migrate(txn: _PgTxn) -> None:
            txn._run("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
            version = self._schema_version(txn)
            if version is None:
                txn._run("CREATE TABLE agentcas_schema_version (version integer NOT NULL)")
                version = 0
            self._refuse_newer(version)
            for step in range(version + 1, SCHEMA_VERSION + 1):
                for sql in MIGRATIONS[step]:
                    txn._run(sql)
            if version < SCHEMA_VERSION:
                txn._run("DELETE FROM agentcas_schema_version")
                txn._run("INSERT INTO agentcas_schema_version (version) VALUES (%s)", (SCHEMA_VERSION,))
        self._run_retrying(migrate, "READ COMMITTED")

    def _check_schema(self) -> None:
        self._schema_checked = True
        try:
            with self.reader() as txn:
                version = self._schema_version(txn)
        except BaseException:
            self._schema_checked = False
            raise
        self._judge_schema(version)

    def _judge_schema(self, version: int | None) -> None:
        if version is None or version == 0:
            raise SchemaMissing(f"{self.name} has no agentcas schema (run `agentcas init` with this URL)")
        self._refuse_newer(version)
        if version < SCHEMA_VERSION:
            raise SchemaMissing(f"{self.name} has agentcas schema version {version}, this agentcas uses "
                                f"{SCHEMA_VERSION}: run `agentcas init` with this URL to migrate it")

    def _refuse_newer(self, version: int) -> None:
        if version > SCHEMA_VERSION:
            raise SchemaTooNew(f"{self.name} has agentcas schema version {version}, newer than this "
                               f"agentcas understands ({SCHEMA_VERSION}): upgrade agentcas")

    # -- MetadataStore ------------------------------------------------------------------------

    def _ensure_schema(self) -> None:
        if not self._schema_checked:
            self._check_schema()

    def exchange(self, reads=(), expect=(), writes=()):
        """One call of agentcas_exchange (see MIGRATIONS): one round trip, atomic."""
        reads, expect, writes = list(reads), list(expect), list(writes)
        for table in [r.table for r in reads] + [e[0] for e in expect] + [w[0] for w in writes]:
            _check_table(table)
        params = ([r.table for r in reads], [bytes(r.key) for r in reads],
                  [prefix_end(bytes(r.key)) if r.last else None for r in reads], [r.last for r in reads],
                  [e[0] for e in expect], [bytes(e[1]) for e in expect],
                  [None if e[2] is None else bytes(e[2]) for e in expect],
                  [w[0] for w in writes], [bytes(w[1]) for w in writes],
                  [None if w[2] is None else bytes(w[2]) for w in writes])
        sql = ("SELECT applied, schema, keys, vals FROM agentcas_exchange(%s::text[], %s::bytea[], "
               "%s::bytea[], %s::boolean[], %s::text[], %s::bytea[], %s::bytea[], %s::text[], "
               "%s::bytea[], %s::bytea[])")

        unanswered_writes = []

        def attempt(conn):
            self.statements += 1
            self.round_trips += 1
            if writes:
                crashpoints.reached("pg.open")  # nothing sent yet: the exchange is one statement
            try:
                row = conn.execute(sql, params).fetchone()
            except NoAnswer:
                if writes:
                    unanswered_writes.append(True)
                raise
            if writes:
                crashpoints.reached("pg.commit")
            return row

        try:
            applied, schema, keys, vals = self._with_connection(attempt)
        except MetadataUnavailable as exc:
            if not unanswered_writes:
                raise
            # A write that reached a hung server is still queued there: it may be applied
            # when the server wakes, after this command has said it failed.
            raise MetadataUnavailable(f"{exc}; a write was sent and never answered: the server may still "
                                      "apply it, so look (agentcas log / reflog) before retrying") from None
        except (pg_errors.UndefinedFunction, pg_errors.UndefinedTable):
            self._check_schema()  # names what is missing (no schema, or an older one)
            raise
        if not self._schema_checked:
            self._judge_schema(schema)
            self._schema_checked = True
        values: list = []
        for read, key, value in zip(reads, keys, vals):
            if value is None:
                values.append(None)
            else:
                values.append((bytes(key), bytes(value)) if read.last else bytes(value))
        return bool(applied), values

    def read_many(self, table, keys):
        """One SELECT (autocommit: its own snapshot), one round trip."""
        _check_table(table)
        keys = [bytes(k) for k in keys]
        if not keys:
            return {}
        self._ensure_schema()

        def attempt(conn):
            self.statements += 1
            self.round_trips += 1
            return conn.execute("SELECT key, value FROM agentcas_kv WHERE tbl = %s AND key = ANY(%s::bytea[])",
                                (table, keys), binary=True).fetchall()
        return {bytes(key): bytes(value) for key, value in self._with_connection(attempt)}

    @contextmanager
    def reader(self):
        self._ensure_schema()

        def begin(conn):
            self.statements += 1
            self.round_trips += 1
            # The snapshot is taken by a transaction's first query, not by BEGIN: take it now.
            conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SELECT 1")
            return conn

        conn = self._retrying(begin)
        broken = False
        txn = _PgTxn(self, conn, writable=False)
        try:
            yield txn
        except _RETRYABLE as exc:
            broken = True
            # One statement, never retried (the reader's snapshot is gone): the wait was for it.
            unanswered = Retry(began=txn.sent_at)
            unanswered.tries = 1
            raise self._unavailable(exc, unanswered) from None
        finally:
            self._rollback(conn)
            self._release(conn, broken=broken)

    def write(self, fn):
        self._ensure_schema()
        return self._run_retrying(fn, "READ COMMITTED")

    def close(self) -> None:
        with self._pool_lock:
            idle, self._idle = self._idle, []
        if os.getpid() != self._pid:
            _ABANDONED.extend(idle)
            return
        for conn in idle:
            try:
                conn.close()
            except Exception:  # noqa: BLE001
                pass
