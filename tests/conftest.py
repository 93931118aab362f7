"""Shared fixtures: a fresh store, a workspace, and `run` for the real CLI in a subprocess."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agentcas import Store

# Fixtures kept beside the helpers they go with (tests/support/), offered to every test.
pytest_plugins = ("support.bundles", "support.crash_walk")

AGENTCAS = shutil.which("agentcas", path=str(Path(sys.executable).parent)) or "agentcas"


class Result:
    def __init__(self, proc: subprocess.CompletedProcess):
        self.code = proc.returncode
        self.out = proc.stdout
        self.err = proc.stderr

    def json(self):
        return json.loads(self.out)

    def __repr__(self):
        return f"Result(code={self.code}, out={self.out[-500:]!r}, err={self.err[-500:]!r})"


def run_cli(*args, store=None, input=None, env=None, cwd=None, timeout=120) -> Result:
    """Run the installed `agentcas` command the way a user would."""
    argv = [AGENTCAS] + (["--store", str(store)] if store is not None else []) + [str(a) for a in args]
    full_env = dict(os.environ, **(env or {}))
    full_env.pop("AGENTCAS_DEBUG", None)
    proc = subprocess.run(argv, input=input, capture_output=True, text=isinstance(input, str) or input is None,
                          env=full_env, cwd=cwd, timeout=timeout)
    return Result(proc)


@pytest.fixture
def run():
    return run_cli


@pytest.fixture
def store_dir(tmp_path) -> Path:
    path = tmp_path / "store"
    Store.init(str(path))
    return path


@pytest.fixture
def store(store_dir) -> Store:
    return Store.open(str(store_dir))


@pytest.fixture
def workspace(tmp_path) -> Path:
    """A small agent workspace: memory, instructions, task and an artifact."""
    ws = tmp_path / "ws"
    (ws / "memory").mkdir(parents=True)
    (ws / "memory" / "notes.md").write_text("plan: compute the sum of squares\n")
    (ws / "instructions.md").write_text("Be careful.\n")
    (ws / "task.json").write_text('{"step": 1}\n')
    (ws / "artifacts").mkdir()
    (ws / "artifacts" / "data.bin").write_bytes(os.urandom(600_000))  # a chunk list (max chunk 512 KiB)
    return ws


def tree_bytes(root: Path) -> dict:
    """{relative path: (bytes, mode)} of every file under root, for byte-for-byte comparison."""
    out = {}
    for path in sorted(root.rglob("*")):
        if path.is_file():
            out[str(path.relative_to(root))] = (path.read_bytes(), path.stat().st_mode & 0o777)
    return out


def store_rows(store_dir: Path) -> dict:
    """Every (table, key) -> value in a store, read raw through LMDB, to assert nothing changed."""
    import lmdb

    from agentcas.cas.store import TABLES
    env = lmdb.open(str(store_dir), readonly=True, lock=False, max_dbs=len(TABLES) + 2)
    rows = {}
    try:
        with env.begin() as txn:
            for name in TABLES:
                if name in ("statcache", "leases"):  # a cache and writers' leases: hints
                    continue
                db = env.open_db(name.encode(), txn=txn, create=False)
                for key, value in txn.cursor(db=db):
                    rows[(name, bytes(key))] = bytes(value)
    finally:
        env.close()
    return rows


def objects_of(env):
    """An ObjectSource over a table environment (MemoryEnvironment / LMDB), for tests that
    build stores by hand."""
    from agentcas.cas.source import ObjectSource
    from agentcas.cas.store import TableBlobStore
    return ObjectSource(TableBlobStore(env))


class View:
    """Test glue: a metadata snapshot and the store's object source in one handle, for tests
    that inspect refs and objects together (the layers take them separately)."""

    _SOURCE = {"raw", "load", "has", "missing", "kind", "keys_from", "blobs", "reading", "put_many"}

    def __init__(self, txn, objects):
        self._txn, self._objects = txn, objects

    def __getattr__(self, name):
        return getattr(self._objects if name in self._SOURCE else self._txn, name)


from contextlib import contextmanager  # noqa: E402


@contextmanager
def views(store):
    """`with views(store) as view:` -> View over store.meta.reader() and store.source."""
    with store.meta.reader() as txn, store.source.reading() as objects:
        yield View(txn, objects)


# -- real PostgreSQL and SeaweedFS (S3) servers, one of each per pytest process --------
# Started on first use, stopped at session end (also when tests fail); a server that cannot
# start makes the test error, never skip. Their variables (PGPASSWORD, AWS_*) go into
# os.environ so the stores and any `agentcas` subprocess find them as a user's shell would.

@pytest.fixture(scope="session")
def postgres_server():
    from support.services import PostgresServer
    server = PostgresServer()
    os.environ.update(server.env())
    yield server
    server.close()


@pytest.fixture(scope="session")
def s3_server():
    from support.services import SeaweedServer
    server = SeaweedServer()
    os.environ.update(server.env())
    yield server
    server.close()


@pytest.fixture
def postgres_url(postgres_server) -> str:
    """A new empty database on the session's PostgreSQL (no schema yet)."""
    return postgres_server.create_database()


@pytest.fixture
def s3_url(s3_server) -> str:
    """A new empty prefix in the session's SeaweedFS test bucket."""
    return s3_server.url()


def pytest_terminal_summary(terminalreporter):
    """The robustness counts (crash points walked, faults injected, inputs fuzzed), from the
    tests' record_property, summed over every test (and every xdist worker)."""
    totals: dict[str, int] = {}
    for report in terminalreporter.stats.get("passed", []):
        for name, value in getattr(report, "user_properties", ()):
            if name in ("crash_points", "faults_injected", "inputs_fuzzed", "model_steps"):
                totals[name] = totals.get(name, 0) + int(value)
    if totals:
        terminalreporter.write_line("robustness: " + ", ".join(f"{name.replace('_', ' ')}: {value:,}"
                                                              for name, value in sorted(totals.items())))
