"""The embedded store end to end through the real `agentcas` command.

Each failure case asserts the exit code, a one-line error without a traceback, and that
the store (every raw LMDB row) and the disk are as they were. Stores are created and used
only through subprocesses, so this process may read them raw (`store_rows`) safely.
"""

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import blake3
import pytest

from support import raw_objects
from support.cli import AGENTCAS, run_cli
from support.store_state import store_rows, tree_bytes

HEX64 = re.compile(r"[0-9a-f]{64}")
TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z")


def ok(result):
    assert result.code == 0, result
    return result.json() if result.out.strip().startswith(("{", "[")) else result


def failed(result, code, *needles):
    """Assert a clean one-line failure with `code` mentioning each needle."""
    assert result.code == code, result
    assert "Traceback" not in result.err and result.out == "", result
    lines = result.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("agentcas: error: "), result
    for needle in needles:
        assert needle in lines[0], result
    return lines[0]


def init(path):
    ok(run_cli("--json", "init", path))
    return path


def commit(store, ws, reason, *extra):
    return ok(run_cli("--json", "commit", ws, "-m", reason, *extra, store=store))


def make_workspace(root, seed=0, big=600_000):
    rng = random.Random(seed)
    (root / "memory").mkdir(parents=True, exist_ok=True)
    (root / "memory" / "notes.md").write_text(f"notes {seed}\n" * 20)
    (root / "task.json").write_text(json.dumps({"seed": seed}) + "\n")
    (root / "empty").write_bytes(b"")
    (root / "run.sh").write_text("#!/bin/sh\necho hi\n")
    os.chmod(root / "run.sh", 0o755)
    (root / "artifacts").mkdir(exist_ok=True)
    (root / "artifacts" / "data.bin").write_bytes(rng.randbytes(big))  # at least two chunks (max 512 KiB)
    return root


def listing(path):
    return sorted(os.listdir(path))


# --- a store with two checkpoints, shared by the read-only tests ----------------------------------

@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    base = tmp_path_factory.mktemp("repo")
    store = init(base / "store")
    ws = make_workspace(base / "ws", seed=1)
    first_files = tree_bytes(ws)
    first = commit(store, ws, "first checkpoint")
    (ws / "task.json").write_text('{"step": 2}\n')
    (ws / "memory" / "new.md").write_text("learned something\n")
    second = commit(store, ws, "second checkpoint")
    return {"store": store, "ws": ws, "base": base, "first": first, "second": second,
            "first_files": first_files, "second_files": tree_bytes(ws)}


def test_commit_and_show_json(repo):
    first, second = repo["first"], repo["second"]
    assert HEX64.fullmatch(first["checkpoint"]) and HEX64.fullmatch(first["tree"])
    assert first["thread"] == "main" and first["parents"] == [] and first["files"] == 5
    assert second["parents"] == [first["checkpoint"]]
    doc = ok(run_cli("--json", "show", "main", store=repo["store"]))
    assert doc["checkpoint"] == second["checkpoint"] and doc["tree"] == second["tree"]
    assert doc["parents"] == [first["checkpoint"]] and doc["thread"] == "main"
    assert doc["reason"] == "second checkpoint" and TIME.fullmatch(doc["created_at"])
    assert doc["format"] == 2 and {"agentcas", "python", "os"} <= set(doc["runtime"])
    assert doc["history"]["seq"] == 0
    assert ok(run_cli("--json", "show", first["checkpoint"][:10], store=repo["store"]))["reason"] == \
        "first checkpoint"
    text = ok(run_cli("show", "main~1", store=repo["store"]))
    assert first["checkpoint"] in text.out and "first checkpoint" in text.out


def test_show_files_ids_are_b3sum(repo):
    doc = ok(run_cli("--json", "show", "main", "--files", store=repo["store"]))
    entries = {f["path"]: f for f in doc["files"]}
    assert set(entries) == set(repo["second_files"])
    for path, (data, mode) in repo["second_files"].items():
        entry = entries[path]
        assert entry["size"] == len(data) and entry["mode"] == mode
        assert entry["id"] == blake3.blake3(data).hexdigest()
    if shutil.which("b3sum"):
        out = subprocess.run(["b3sum", "--no-names", str(repo["ws"] / "artifacts" / "data.bin")],
                             capture_output=True, text=True, check=True).stdout.strip()
        assert entries["artifacts/data.bin"]["id"] == out


def test_log(repo):
    doc = ok(run_cli("--json", "log", store=repo["store"]))
    ids = [e["checkpoint"] for e in doc["checkpoints"]]
    assert ids == [repo["second"]["checkpoint"], repo["first"]["checkpoint"]]
    assert [e["reason"] for e in doc["checkpoints"]] == ["second checkpoint", "first checkpoint"]
    limited = ok(run_cli("--json", "log", "main", "-n", "1", store=repo["store"]))
    assert [e["checkpoint"] for e in limited["checkpoints"]] == ids[:1]
    failed(run_cli("log", "-n", "-1", store=repo["store"]), 2)


def test_reflog_and_revisions(repo):
    doc = ok(run_cli("--json", "reflog", "main", store=repo["store"]))
    entries = doc["entries"]
    assert [e["new"]["checkpoint"] for e in entries] == [repo["second"]["checkpoint"], repo["first"]["checkpoint"]]
    assert [e["action"] for e in entries] == ["commit", "commit"]
    assert entries[0]["message"] == "second checkpoint"
    shown = ok(run_cli("--json", "show", "main@{1}", store=repo["store"]))
    assert shown["checkpoint"] == repo["first"]["checkpoint"]
    failed(run_cli("reflog", "nosuch", store=repo["store"]), 1, "nosuch")


def test_checkout_byte_for_byte_with_modes(repo, tmp_path):
    ok(run_cli("checkout", "main", tmp_path / "now", store=repo["store"]))
    assert tree_bytes(tmp_path / "now") == repo["second_files"]
    assert (tmp_path / "now" / "empty").stat().st_size == 0
    ok(run_cli("--json", "checkout", repo["first"]["checkpoint"], tmp_path / "then", store=repo["store"]))
    assert tree_bytes(tmp_path / "then") == repo["first_files"]
    assert {p: m for p, (_, m) in tree_bytes(tmp_path / "then").items()}["run.sh"] == 0o755
    assert listing(tmp_path) == ["now", "then"]  # no temporary siblings left behind


@pytest.mark.parametrize("existing", ["empty dir", "full dir", "file"])
def test_checkout_onto_existing_destination_is_a_conflict(repo, tmp_path, existing):
    dest = tmp_path / "dest"
    if existing == "file":
        dest.write_text("mine")
    else:
        dest.mkdir()
        if existing == "full dir":
            (dest / "keep.txt").write_text("mine")
    before = tree_bytes(tmp_path), listing(tmp_path), (listing(dest) if dest.is_dir() else None)
    failed(run_cli("checkout", "main", dest, store=repo["store"]), 3, "exists")
    assert (tree_bytes(tmp_path), listing(tmp_path), (listing(dest) if dest.is_dir() else None)) == before


def test_branch_create_list_delete(tmp_path):
    store = init(tmp_path / "store")
    ws = make_workspace(tmp_path / "ws", big=1000)
    first = commit(store, ws, "one")["checkpoint"]
    (ws / "task.json").write_text("{}\n")
    second = commit(store, ws, "two")["checkpoint"]
    assert ok(run_cli("--json", "branch", "feature", store=store))["checkpoint"] == second
    assert ok(run_cli("--json", "branch", "old", first[:8], store=store))["checkpoint"] == first
    rows = ok(run_cli("--json", "branch", store=store))["threads"]
    assert {r["thread"]: r["checkpoint"] for r in rows} == {"main": second, "feature": second, "old": first}
    (ws / "task.json").write_text('{"on": "feature"}\n')
    third = commit(store, ws, "three", "--thread", "feature")
    assert third["parents"] == [second]
    assert ok(run_cli("--json", "show", "main", store=store))["checkpoint"] == second

    before = store_rows(tmp_path / "store")
    failed(run_cli("branch", "feature", store=store), 3, "already exists")
    failed(run_cli("branch", "bad..name", store=store), 2, "invalid thread name")
    failed(run_cli("branch", "-d", "nosuch", store=store), 1, "nosuch")
    # Two names: refused whole (it deleted the first, said so with exit 0, and kept the second).
    failed(run_cli("branch", "-d", "feature", "old", store=store), 2, "deletes one thread")
    assert store_rows(tmp_path / "store") == before

    assert ok(run_cli("--json", "branch", "-d", "feature", store=store))["deleted"] is True
    assert {r["thread"] for r in ok(run_cli("--json", "branch", store=store))["threads"]} == {"main", "old"}
    failed(run_cli("show", "feature", store=store), 1, "unknown revision")
    # The deleted thread's checkpoint is still reachable by id until gc.
    assert ok(run_cli("--json", "show", third["checkpoint"], store=store))["reason"] == "three"


# --- bad input: clear error, nothing changed ------------------------------------------------------

@pytest.fixture
def small_store(tmp_path):
    """A store of its own for tests that change it."""
    store = init(tmp_path / "store")
    ws = make_workspace(tmp_path / "ws", big=1000)
    head = commit(store, ws, "base")
    (ws / "task.json").write_text('{"changed": true}\n')  # so a commit would store new objects
    return store, ws, head


@pytest.fixture
def changed_ws(tmp_path):
    """A workspace with content the shared store does not hold yet."""
    return make_workspace(tmp_path / "changed", seed=99, big=5000)


@pytest.mark.parametrize("reason, needle", [
    ("", "empty"),
    ("   ", "empty"),
    ("x" * 513, "513 characters"),
    ("\u20ac" * 342, "1026 UTF-8 bytes"),   # 342 characters but 1,026 bytes
])
def test_bad_reason(repo, changed_ws, reason, needle):
    store = repo["store"]
    before = store_rows(store)
    failed(run_cli("commit", changed_ws, "-m", reason, store=store), 2, needle)
    assert store_rows(store) == before


UNKNOWN = [
    ("nosuch", "unknown revision"),
    ("0123456789abcdef", "unknown revision"),
    ("main~5", "past the first checkpoint"),
    ("main@{9}", "no reflog entry"),
    ("a" * 64, "unknown revision"),
]


def test_unknown_revision(repo, changed_ws, tmp_path):
    store = repo["store"]
    before = store_rows(store), listing(tmp_path)
    for rev, needle in UNKNOWN:
        failed(run_cli("show", rev, store=store), 1, needle)
    failed(run_cli("checkout", "nosuch", tmp_path / "out", store=store), 1, "unknown revision")
    failed(run_cli("commit", changed_ws, "-m", "x", "--expect", "main~5", store=store), 1, "past the first")
    assert (store_rows(store), listing(tmp_path)) == before


CRAFT = textwrap.dedent("""
    import sys
    from agentcas.cas import framing, packs
    from agentcas.cas.lmdb_store import open_lmdb
    env = open_lmdb(sys.argv[1])
    env.write(lambda txn: packs.put_new(txn, {bytes.fromhex(key): framing.frame(framing.KIND_CHECKPOINT, b"{}")
                                              for key in sys.argv[2:]}))
    env.close()
""")


def test_ambiguous_prefix(small_store, tmp_path):
    """Two checkpoint-kind values under ids sharing 8 hex digits, planted raw (a real collision
    needs ~65,000 checkpoints): only the prefix lookup reads them, by kind."""
    store, _, head = small_store
    a, b = "abcdef01" + "1" * 56, "abcdef01" + "2" * 56
    subprocess.run([sys.executable, "-c", CRAFT, str(store), a, b], check=True)
    before = store_rows(store), listing(tmp_path)
    failed(run_cli("show", "abcdef01", store=store), 2, "ambiguous")
    failed(run_cli("checkout", "abcdef01", tmp_path / "out", store=store), 2, "ambiguous")
    failed(run_cli("commit", tmp_path / "ws", "-m", "x", "--expect", "abcdef01", store=store), 2, "ambiguous")
    assert (store_rows(store), listing(tmp_path)) == before
    # A longer prefix is unique again (and then fails as the forged object it is: exit 4).
    failed(run_cli("show", "abcdef011", store=store), 4)
    assert ok(run_cli("--json", "show", head["checkpoint"][:8], store=store))["checkpoint"] == head["checkpoint"]


def test_not_a_store(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    failed(run_cli("show", "main", store=empty), 1, "not an agentcas store")
    failed(run_cli("commit", tmp_path, "-m", "x", store=empty), 1, "not an agentcas store")
    assert listing(empty) == []
    failed(run_cli("log", store=tmp_path / "missing"), 1, "no store")
    assert not (tmp_path / "missing").exists()
    env = {"AGENTCAS_STORE": ""}
    failed(run_cli("log", env=env, cwd=tmp_path), 1, "no store found")


def test_store_path_is_a_file(tmp_path):
    path = tmp_path / "store"
    path.write_text("not a store")
    failed(run_cli("show", "main", store=path), 1, "is a file")
    failed(run_cli("init", path), 1, "is a file")
    assert path.read_text() == "not a store" and listing(tmp_path) == ["store"]


def test_init_refuses_a_non_empty_directory(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "x").write_text("mine")
    failed(run_cli("init", tmp_path / "d"), 3, "not empty")
    assert listing(tmp_path / "d") == ["x"]


def _read_only(store, *args):
    """Run agentcas with `store` bind-mounted read-only in a private mount namespace.

    Tests run as root, for whom chmod does not stop writes; a read-only mount does.
    """
    script = ('mount --bind "$1" "$1" && mount -o remount,ro,bind "$1" "$1" && shift && exec "$@"')
    argv = ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script, "sh", str(store),
            AGENTCAS, "--store", str(store), *map(str, args)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)

    class R:
        code, out, err = proc.returncode, proc.stdout, proc.stderr

        def json(self):
            return json.loads(self.out)
    return R()


def test_read_only_store(repo, changed_ws, tmp_path):
    store, ws, head = repo["store"], changed_ws, repo["second"]
    probe = shutil.which("unshare") and subprocess.run(
        ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c",
         f"mount --bind {tmp_path} {tmp_path} && mount -o remount,ro,bind {tmp_path} {tmp_path}"],
        capture_output=True)
    if not probe or probe.returncode != 0:
        pytest.skip("cannot make a read-only mount here (no unshare or user namespaces)")
    before = store_rows(store), tree_bytes(store)
    shown = _read_only(store, "--json", "show", "main")
    assert shown.code == 0 and shown.json()["checkpoint"] == head["checkpoint"], shown.err
    failed(_read_only(store, "commit", ws, "-m", "x"), 1, "read-only")
    failed(_read_only(store, "branch", "other"), 1, "read-only")
    assert (store_rows(store), tree_bytes(store)) == before


def test_workspace_errors_on_cli(repo, changed_ws, tmp_path):
    store, ws = repo["store"], changed_ws
    before = store_rows(store)
    os.symlink("task.json", ws / "link")
    failed(run_cli("commit", ws, "-m", "x", store=store), 1, "symlink", "link")
    os.unlink(ws / "link")
    failed(run_cli("commit", tmp_path / "nope", "-m", "x", store=store), 2, "not a directory")
    failed(run_cli("commit", ws, "-m", "x", "--thread", "a..b", store=store), 2, "invalid thread name")
    assert store_rows(store) == before


# --- must survive -----------------------------------------------------------------------------------

CHECK = textwrap.dedent("""
    # Verify a store through the Python API: every ref's closure (hash-checked), and optionally
    # that checkpoints hold exactly the given workspaces. Prints {"heads": {thread: id}}.
    import json, os, sys, tempfile
    import blake3
    from agentcas import Store
    from agentcas.lineage.closure import Walker
    from agentcas.refs import threads
    from agentcas.workspace.restore import restore_tree
    store = Store.open(sys.argv[1])
    expect = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
    with store.meta.reader() as txn:
        heads, seen = {}, set()
        for name, state in threads.list_threads(txn):
            walker = Walker(store.source, seen=seen, verify=True)
            if state.checkpoint is not None:
                for _ in walker.checkpoint(state.checkpoint):
                    pass
            for _ in walker.history(state.history):
                pass
            heads[name] = None if state.checkpoint is None else state.checkpoint.hex()
    for checkpoint, files in expect.items():
        _, cp = store.checkpoints.get(checkpoint)
        with tempfile.TemporaryDirectory() as tmp:
            restore_tree(store.source, cp.tree, os.path.join(tmp, "out"))
            got = {}
            for root, _, names in os.walk(os.path.join(tmp, "out")):
                for n in names:
                    p = os.path.join(root, n)
                    got[os.path.relpath(p, os.path.join(tmp, "out"))] = [
                        blake3.blake3(open(p, "rb").read()).hexdigest(), os.stat(p).st_mode & 0o777]
        assert got == files, (checkpoint, sorted(set(got) ^ set(files)))
    print(json.dumps({"heads": heads, "objects": len(seen)}))
""")


def check_store(store, expect=None):
    proc = subprocess.run([sys.executable, "-c", CHECK, str(store), json.dumps(expect or {})],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)["heads"]


def fingerprint(root):
    return {p: [blake3.blake3(d).hexdigest(), m] for p, (d, m) in tree_bytes(root).items()}


def test_sigkill_during_commit_leaves_old_or_new_head(tmp_path):
    store = init(tmp_path / "store")
    ws = make_workspace(tmp_path / "ws", seed=10, big=100)
    rng = random.Random(4)

    def grow(i):  # a few MB of new content each time
        for j in range(3):
            (ws / "artifacts" / f"blob{j}.bin").write_bytes(rng.randbytes(1_200_000))
        (ws / "task.json").write_text(json.dumps({"iteration": i}) + "\n")

    grow(0)
    started = time.monotonic()
    head = commit(store, ws, "base")["checkpoint"]
    full = time.monotonic() - started  # one whole commit, start-up included
    contents = {head: fingerprint(ws)}
    for i in range(1, 5):
        grow(i)
        proc = subprocess.Popen([AGENTCAS, "--store", str(store), "--json", "commit", str(ws), "-m", f"try {i}"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0, max(0.3, full)))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        new_content = fingerprint(ws)
        heads = check_store(store)
        now = heads["main"]
        if now != head:
            shown = ok(run_cli("--json", "show", now, store=store))
            assert shown["parents"] == [head] and shown["reason"] == f"try {i}"
            contents[now] = new_content
        head = now
    # Every head the thread ever had restores to exactly what was committed.
    check_store(store, {cp: files for cp, files in contents.items()})
    # A commit after the kills works and sees the latest head as its parent.
    (ws / "task.json").write_text('{"after": true}\n')
    assert commit(store, ws, "after the kills")["parents"] == [head]
    fsck = run_cli("--json", "fsck", store=store)
    if "No such command" not in fsck.err:
        assert fsck.code == 0, fsck


def test_six_concurrent_commits_are_linear_and_nothing_is_lost(tmp_path):
    store = init(tmp_path / "store")
    base_ws = make_workspace(tmp_path / "base", big=1000)
    base = commit(store, base_ws, "base")["checkpoint"]
    workspaces = []
    for i in range(6):
        ws = make_workspace(tmp_path / f"ws{i}", seed=100 + i, big=600_000)  # each a chunk list
        workspaces.append(ws)
    procs = [subprocess.Popen([AGENTCAS, "--store", str(store), "--json", "commit", str(ws), "-m", f"writer {i}"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i, ws in enumerate(workspaces)]
    results = [p.communicate(timeout=120) + (p.returncode,) for p in procs]
    assert [code for _, _, code in results] == [0] * 6, [err for _, err, _ in results]
    made = {json.loads(out)["checkpoint"]: i for i, (out, _, _) in enumerate(results)}
    assert len(made) == 6
    log = ok(run_cli("--json", "log", "-n", "7", store=store))["checkpoints"]
    assert {e["checkpoint"] for e in log[:6]} == set(made) and log[6]["checkpoint"] == base
    for newer, older in zip(log, log[1:]):
        assert newer["parents"] == [older["checkpoint"]]  # linear: each parent is the previous
    assert len(ok(run_cli("--json", "reflog", "main", store=store))["entries"]) == 7
    check_store(store, {cp: fingerprint(workspaces[i]) for cp, i in made.items()})

    # A stale --expect: exit 3, and no ref, reflog or pin moved.
    (workspaces[0] / "task.json").write_text('{"stale": true}\n')
    before = {k: v for k, v in store_rows(store).items() if k[0] != "objects"}
    failed(run_cli("commit", workspaces[0], "-m", "stale", "--expect", base, store=store), 3, "not at")
    assert {k: v for k, v in store_rows(store).items() if k[0] != "objects"} == before


def test_stale_expect_stores_no_objects_either(small_store):
    store, ws, head = small_store
    (ws / "task.json").write_text('{"changed": "again"}\n')
    commit(store, ws, "moves main on")
    (ws / "fresh.bin").write_bytes(os.urandom(50_000))
    before = store_rows(store)
    failed(run_cli("commit", ws, "-m", "stale", "--expect", head["checkpoint"], store=store), 3, "not at")
    assert store_rows(store) == before


def _corrupt(store, what):
    """Flip one byte of a stored value, raw. No Store is open on this path in this process."""
    import lmdb

    from agentcas.cas import framing
    from agentcas.cas.store import TABLES
    if what != "ref":
        kind, _, where = what.partition(":")
        with raw_objects.writing(store) as env:
            with env.reader() as txn:
                key = next(k for k, v in raw_objects.values(txn).items() if v[0] == framing.KIND_BY_NAME[kind])

            def damage(value: bytearray):
                value[3 if where == "header" else framing.HEADER_SIZE + (len(value) - framing.HEADER_SIZE) // 2] ^= 0x01
                return value
            env.write(lambda txn: raw_objects.edit(txn, key, damage))
        return key.hex()
    env = lmdb.open(str(store), max_dbs=len(TABLES) + 2)
    try:
        with env.begin(write=True) as txn:
            db, key = env.open_db(b"refs", txn=txn), b"threads/main"
            value = bytearray(txn.get(key, db=db))
            value[10] ^= 0x01
            txn.put(key, bytes(value), db=db)
            return bytes(key).hex()
    finally:
        env.close()


@pytest.fixture(scope="module")
def committed(tmp_path_factory):
    base = tmp_path_factory.mktemp("committed")
    store = init(base / "store")
    commit(store, make_workspace(base / "ws", big=600_000), "one")
    return store


@pytest.mark.parametrize("what", ["chunk", "chunk:header", "chunklist", "tree", "checkpoint", "ref"])
def test_flipped_byte_checkout_exits_4_and_creates_nothing(committed, tmp_path, what):
    store = tmp_path / "store"
    shutil.copytree(committed, store)
    key = _corrupt(store, what)
    out_parent = tmp_path / "out"
    out_parent.mkdir()
    before = store_rows(store)
    line = failed(run_cli("checkout", "main", out_parent / "dest", store=store), 4)
    if what != "ref":
        assert key in line  # names the damaged object
    assert listing(out_parent) == []  # neither DEST nor a temporary sibling
    assert store_rows(store) == before


def test_newer_store_format_is_refused(small_store, tmp_path):
    import lmdb

    from agentcas.cas import encoding
    from agentcas.cas.sealed import seal
    from agentcas.cas.store import TABLES
    from agentcas.cas.store_format import STORE_FORMAT
    store, ws, _ = small_store
    env = lmdb.open(str(store), max_dbs=len(TABLES) + 2)
    with env.begin(write=True) as txn:
        doc = encoding.encode({"created_at": "2030-01-01T00:00:00.000000Z", "format": STORE_FORMAT + 1})
        txn.put(b"format", seal("meta", b"format", doc), db=env.open_db(b"meta", txn=txn))
    env.close()
    before = store_rows(store), listing(tmp_path)
    failed(run_cli("show", "main", store=store), 4, f"store format {STORE_FORMAT + 1} is newer", "upgrade")
    failed(run_cli("commit", ws, "-m", "x", store=store), 4, "upgrade")
    assert (store_rows(store), listing(tmp_path)) == before


def test_checkout_under_a_file_fails_clearly(repo, tmp_path):
    (tmp_path / "afile").write_text("mine")
    failed(run_cli("checkout", "main", tmp_path / "afile" / "dest", store=repo["store"]), 1, "a file is in the way creating")
    assert listing(tmp_path) == ["afile"] and (tmp_path / "afile").read_text() == "mine"


def test_checkout_that_runs_out_of_space_leaves_nothing(repo, tmp_path):
    """DEST on a 256 KiB tmpfs (private mount namespace): the 600 KB file cannot be written."""
    if not shutil.which("unshare"):
        pytest.skip("no unshare")
    script = ('mount -t tmpfs -o size=256k none "$1" && shift && "$@"; code=$?; '
              'ls -A "$0"; exit $code')
    mnt = tmp_path / "small"
    mnt.mkdir()
    proc = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script, str(mnt),
                           str(mnt), AGENTCAS, "--store", str(repo["store"]), "checkout", "main", str(mnt / "dest")],
                          capture_output=True, text=True, timeout=60)
    if "mount" in proc.stderr and "agentcas" not in proc.stderr:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    assert proc.returncode == 1, proc.stderr
    assert "agentcas: error: no space left on device writing" in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stdout.strip() == ""  # `ls -A` of the mount: neither DEST nor a temporary sibling


def test_store_made_read_only_with_chmod_refuses_writes_even_as_root(tmp_path):
    """`chmod a-w` on a store means read-only, also for root (who ignores mode bits)."""
    store = tmp_path / "store"
    assert run_cli("init", store).code == 0
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("one\n")
    assert run_cli("commit", ws, "-m", "first", store=store).code == 0
    paths = [store, *store.iterdir()]
    modes = {p: p.stat().st_mode for p in paths}
    for p in paths:
        p.chmod(modes[p] & ~0o222)
    try:
        before = {p.name: p.read_bytes() for p in store.iterdir() if p.name == "data.mdb"}
        (ws / "a.txt").write_text("two\n")
        result = run_cli("commit", ws, "-m", "second", store=store)
        assert result.code == 1 and "read-only" in result.err and "Traceback" not in result.err
        assert run_cli("log", store=store).code == 0          # reading still works
        assert {p.name: p.read_bytes() for p in store.iterdir() if p.name == "data.mdb"} == before
    finally:
        for p in paths:
            p.chmod(modes[p])


def test_store_works_under_an_address_space_limit(tmp_path):
    """`ulimit -v` below the default 16 GiB map: the map is halved until it fits."""
    import resource
    import subprocess

    def limited(*args):
        def limit():
            resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
        env = {k: v for k, v in os.environ.items() if k != "AGENTCAS_LMDB_MAP_SIZE"}
        return subprocess.run([AGENTCAS, "--store", str(tmp_path / "store"), *map(str, args)],
                              capture_output=True, text=True, env=env, preexec_fn=limit, timeout=120)

    ws = make_workspace(tmp_path / "ws")
    for args in (["init"], ["commit", ws, "-m", "limited"], ["fsck"], ["checkout", "main", tmp_path / "out"]):
        proc = limited(*args)
        assert proc.returncode == 0, (args, proc.stderr)
    assert (tmp_path / "out" / "artifacts" / "data.bin").read_bytes() == (ws / "artifacts" / "data.bin").read_bytes()


def test_file_larger_than_memory_is_streamed(tmp_path):
    """A file that cannot be read whole (1.5 GB under a 2.5 GB address-space limit, with the
    store's map inside it) is committed anyway: large files are streamed."""
    import resource

    import blake3
    store = init(tmp_path / "store")
    ws = make_workspace(tmp_path / "ws")
    size = 1_500_000_000
    with open(ws / "artifacts" / "model.bin", "wb") as handle:
        handle.truncate(size)  # sparse: costs no disk, reads as zeros

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (2500 << 20, 2500 << 20))
    proc = subprocess.run([AGENTCAS, "--store", str(store), "--json", "commit", str(ws), "-m", "big"],
                          capture_output=True, text=True, preexec_fn=limit, timeout=300,
                          env={k: v for k, v in os.environ.items() if k != "AGENTCAS_LMDB_MAP_SIZE"})
    assert proc.returncode == 0, proc.stderr
    listed = {f["path"]: f for f in run_cli("--json", "show", "main", "--files", store=store).json()["files"]}
    zeros, hasher = bytes(64 << 20), blake3.blake3(max_threads=blake3.blake3.AUTO)
    for offset in range(0, size, len(zeros)):
        hasher.update(zeros[: min(len(zeros), size - offset)])
    assert listed["artifacts/model.bin"]["size"] == size
    assert listed["artifacts/model.bin"]["id"] == hasher.hexdigest()
    assert run_cli("fsck", store=store).code == 0


def test_committing_the_store_into_itself_is_refused(tmp_path):
    store = init(tmp_path / "store")
    commit(store, make_workspace(tmp_path / "ws"), "one")
    before = store_rows(store)
    failed(run_cli("commit", store, "-m", "self", store=store), 2, "is the store itself")
    assert store_rows(store) == before


def test_empty_branch_name_is_refused(repo):
    store = repo["store"]
    before = store_rows(store)
    failed(run_cli("branch", "", "main", store=store), 2, "invalid thread name")
    assert store_rows(store) == before


def test_non_utf8_arguments_get_clear_errors_and_paths_work(tmp_path):
    store = init(tmp_path / "store")
    ws = make_workspace(tmp_path / "ws")
    commit(store, ws, "one")
    before = store_rows(store)
    bad = os.fsdecode(b"t\xff")
    failed(run_cli("commit", ws, "-m", "x", "--thread", bad, store=store), 2, "not valid UTF-8")
    failed(run_cli("show", "main" + bad, store=store), 1, "unknown revision")
    assert store_rows(store) == before
    # A workspace below a directory whose name is not UTF-8 commits like any other.
    parent = os.path.join(os.fsencode(tmp_path), b"par\xff")
    shutil.copytree(os.fsencode(ws), os.path.join(parent, b"ws"))
    result = run_cli("--json", "commit", os.fsdecode(os.path.join(parent, b"ws")), "-m", "odd parent", store=store)
    assert result.code == 0, result
    assert result.json()["tree"] == run_cli("--json", "show", "main~1", store=store).json()["tree"]


def test_full_id_in_uppercase_resolves(tmp_path):
    store = init(tmp_path / "store")
    checkpoint = commit(store, make_workspace(tmp_path / "ws"), "one")["checkpoint"]
    shown = run_cli("--json", "show", checkpoint.upper(), store=store)
    assert shown.code == 0 and shown.json()["checkpoint"] == checkpoint
    assert run_cli("--json", "show", checkpoint[:10].upper(), store=store).json()["checkpoint"] == checkpoint


def test_reflog_json_names_each_entry_as_a_revision(tmp_path):
    store = init(tmp_path / "store")
    ws = make_workspace(tmp_path / "ws")
    for i in range(3):
        (ws / "task.json").write_text(json.dumps({"step": i}) + "\n")
        commit(store, ws, f"step {i}")
    entries = run_cli("--json", "reflog", "main", store=store).json()["entries"]
    assert [e["rev"] for e in entries] == ["main@{0}", "main@{1}", "main@{2}"]
    for entry in entries:  # each rev names the checkpoint its entry moved the thread to
        shown = run_cli("--json", "show", entry["rev"], store=store).json()
        assert shown["checkpoint"] == entry["new"]["checkpoint"]
