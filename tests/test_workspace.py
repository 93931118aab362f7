"""Workspace snapshots: what is refused, ignored, scanned, cached, and how modes survive."""

import os
import random
import socket
import string

import pytest

from agentcas import Store
from agentcas.cas import packs
from agentcas.workspace import secrets, snapshot
from agentcas.workspace.snapshot import FileChanged, SecretFound, WorkspaceError

from support.cli import run_cli
from support.store_state import store_rows, tree_bytes, views


def rows(store):
    """Every row of every table except the stat cache, to assert nothing was stored."""
    with views(store) as txn:
        return {(table, key): value for table in ("meta", "objects", "refs", "reflog", "leases") + packs.TABLES
                for key, value in txn.scan(table)}


@pytest.fixture
def mem():
    return Store.memory()


@pytest.fixture
def ws(tmp_path):
    root = tmp_path / "ws"
    (root / "sub").mkdir(parents=True)
    (root / "a.txt").write_text("alpha\n")
    (root / "sub" / "b.txt").write_text("beta\n")
    return root


def files(store, rev="main"):
    return {f["path"]: f for f in [item.to_json() for item in store.checkpoints.files(rev)]}


def refused(store, ws, exc_type, *needles, **kw):
    before = rows(store)
    with pytest.raises(exc_type) as info:
        store.checkpoints.commit(str(ws), "try", **kw)
    for needle in needles:
        assert needle in str(info.value)
    assert rows(store) == before, "a refused commit stored something"
    return str(info.value)


# --- what is refused ----------------------------------------------------------------------------

def test_symlink_refused_naming_the_path(mem, ws):
    os.symlink("../a.txt", ws / "sub" / "link")
    refused(mem, ws, WorkspaceError, "symlink", "sub/link")


def test_symlink_to_directory_refused(mem, ws):
    os.symlink(str(ws / "sub"), ws / "dirlink")
    refused(mem, ws, WorkspaceError, "dirlink")


def test_hardlink_refused_naming_the_path(mem, ws):
    os.link(ws / "a.txt", ws / "sub" / "again.txt")
    refused(mem, ws, WorkspaceError, "hardlink")


def test_fifo_refused_naming_the_path(mem, ws):
    os.mkfifo(ws / "sub" / "pipe")
    refused(mem, ws, WorkspaceError, "sub/pipe")


def test_socket_refused_naming_the_path(mem, ws):
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(str(ws / "sock"))
        refused(mem, ws, WorkspaceError, "sock")
    finally:
        sock.close()


@pytest.mark.parametrize("name", ["back\\slash", "new\nline", "tab\tname", "del\x7f", "bell\x07"])
def test_bad_names_refused(mem, ws, name):
    (ws / "sub" / name).write_text("x")
    refused(mem, ws, WorkspaceError, "not allowed")


def test_non_utf8_name_refused(mem, ws):
    with open(os.path.join(os.fsencode(ws), b"bad\xffname"), "w") as handle:
        handle.write("x")
    refused(mem, ws, WorkspaceError, "not allowed")


@pytest.mark.parametrize("first, second", [("Readme", "README"), ("caf\u00e9", "cafe\u0301")])
def test_names_colliding_by_case_or_normalisation_refused(mem, ws, first, second):
    (ws / "sub" / first).write_text("1")
    (ws / "sub" / second).write_text("2")
    refused(mem, ws, WorkspaceError, "collide")


def test_missing_workspace_is_a_usage_error(mem, tmp_path):
    with pytest.raises(Exception) as info:
        mem.checkpoints.commit(str(tmp_path / "nope"), "x")
    assert info.value.exit_code == 2


# --- ignore rules -------------------------------------------------------------------------------

def test_agentcasignore(mem, ws):
    (ws / ".agentcasignore").write_text("*.log\n!keep.log\nbuild/\n/top-only.txt\n# comment\n")
    (ws / "x.log").write_text("noise")
    (ws / "keep.log").write_text("kept")
    (ws / "build").mkdir()
    (ws / "build" / "out.bin").write_bytes(b"\0" * 10)
    os.symlink("nowhere", ws / "build" / "ignored-link")  # inside an ignored dir: never looked at
    (ws / "sub" / "deep.log").write_text("noise")
    (ws / "top-only.txt").write_text("ignored")
    (ws / "sub" / "top-only.txt").write_text("kept: pattern anchored at the root")
    mem.checkpoints.commit(str(ws), "with ignores")
    assert sorted(files(mem)) == [".agentcasignore", "a.txt", "keep.log", "sub/b.txt", "sub/top-only.txt"]


def test_store_directory_inside_the_workspace_is_skipped(tmp_path, ws):
    store, _ = Store.init(str(ws / ".agentcas"))
    store.checkpoints.commit(str(ws), "x")
    assert sorted(files(store)) == ["a.txt", "sub/b.txt"]


# --- secrets ------------------------------------------------------------------------------------

def rnd(n, alphabet=string.ascii_letters + string.digits, seed=0):
    rng = random.Random(seed + n)
    return "".join(rng.choice(alphabet) for _ in range(n))


# Built at run time so that this file holds no literal secret.
SECRETS = {
    "private key block (openssh)": "-----BEGIN OPENSSH " + "PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjE\n-----END OPENSSH PRIVATE KEY-----",
    "private key block (rsa)": "-----BEGIN RSA " + "PRIVATE KEY-----\nMIIEow\n-----END RSA PRIVATE KEY-----",
    "private key block (pkcs8)": "-----BEGIN " + "PRIVATE KEY-----\nMIIEvQ",
    "private key block (pgp)": "-----BEGIN PGP " + "PRIVATE KEY BLOCK-----\nlQOYBF",
    "AWS access key id": "AKIA" + rnd(16, string.ascii_uppercase + string.digits),
    "AWS secret access key": "aws_secret_access_key = " + rnd(40, string.ascii_letters + string.digits + "/+"),
    "GitHub token (classic)": "ghp_" + rnd(36),
    "GitHub token (fine-grained)": "github_pat_" + rnd(22) + "_" + rnd(59),
    "OpenAI API key": "sk-proj-" + rnd(48),
    "OpenAI API key (legacy)": "sk-" + rnd(48),
    "Anthropic API key": "sk-ant-api03-" + rnd(93, string.ascii_letters + string.digits + "_-"),
    "Slack token": "xoxb-" + rnd(11, string.digits) + "-" + rnd(24),
    "Slack app-level token": "xapp-1-A" + rnd(10, string.ascii_uppercase + string.digits) + "-"
                             + rnd(13, string.digits) + "-" + rnd(64, "0123456789abcdef"),
    "Slack webhook": "https://hooks.slack.com/services/T" + rnd(8, string.ascii_uppercase) + "/B"
                     + rnd(8, string.ascii_uppercase) + "/" + rnd(24),
    "Google API key": "AIza" + rnd(35),
    "JSON Web Token": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0." + rnd(43),
    "generic *_TOKEN=": "SERVICE_TOKEN=" + rnd(32),
    "generic *_SECRET:": 'client_secret: "' + rnd(32) + '"',
    "generic *_SECRET= with punctuation": "DB_SECRET=Zq8!(x#Lm2$Pw&Rt7^Yk)9v",
}


@pytest.mark.parametrize("kind", sorted(SECRETS))
def test_secret_refused_naming_file_and_line_never_echoed(mem, ws, kind):
    secret = SECRETS[kind]
    (ws / "sub" / "config.txt").write_text("first line\nsecond line\n" + secret + "\nlast\n")
    message = refused(mem, ws, SecretFound, "sub/config.txt", "line 3", "nothing was committed")
    for piece in secret.split("\n"):
        if len(piece) >= 8:
            assert piece not in message
    assert secrets.scan(secret.encode(), "x") is not None


@pytest.mark.parametrize("text", [
    "API_TOKEN=aaaaaaaaaaaaaaaaaaaaaaaa",            # low entropy placeholder
    "MY_SECRET=changeme",                             # too short
    "sk-" + "a" * 40,                                 # low entropy
    "we never store a private key in this file",      # prose
    "AKIA is a prefix, AKIAEXAMPLE is too short",
    "the token: see the docs",
    "CSRF_TOKEN = get_token(request)",                # code, not a credential
    "API_SECRET = load_secret_from_vault(name)",
])
def test_harmless_text_is_not_a_secret(text):
    assert secrets.scan(text.encode(), "x") is None


@pytest.mark.parametrize("kind", sorted(SECRETS))
def test_secret_is_found_in_any_buffer_and_behind_overlapping_anchors(kind):
    secret = SECRETS[kind].encode()
    # An anchor inside another (`_SECRET` in `AWS_SECRET`, `sk-` in `task-`) must not
    # hide the rule it belongs to; views and bytearrays are scanned like bytes.
    for text in (b"AWS_SECRET_NAME: " + secret, b"task-1 " + secret, b"risk-\n" + secret):
        assert secrets.scan(text, "x") is not None
        assert secrets.scan(memoryview(bytearray(b"x" + text))[1:], "x") is not None
    assert secrets.scan(b"MY_AWS_SECRET=" + rnd(32).encode(), "x").rule == "secret assignment"


def test_nul_in_a_view_marks_it_binary():
    assert secrets.is_binary(memoryview(b"text\0more"))
    assert not secrets.is_binary(memoryview(b"text only"))


def test_binary_files_are_not_scanned():
    assert secrets.scan(b"\0binary " + SECRETS["GitHub token (classic)"].encode(), "x") is None


def test_allow_secret_glob(mem, ws):
    (ws / "conf").mkdir()
    (ws / "conf" / "prod.env").write_text(SECRETS["generic *_TOKEN="] + "\n")
    (ws / "other.env").write_text(SECRETS["Google API key"] + "\n")
    refused(mem, ws, SecretFound, "other.env", allow_secrets=["conf/*.env"])
    refused(mem, ws, SecretFound, "conf/prod.env", allow_secrets=["prod.env", "other.env"])  # globs match from the root
    mem.checkpoints.commit(str(ws), "allowed", allow_secrets=["conf/*.env", "other.env"])
    assert {"conf/prod.env", "other.env"} <= set(files(mem))


def test_secret_in_cli_commit_not_echoed_and_nothing_stored(tmp_path, ws):
    store_dir = tmp_path / "store"
    assert run_cli("init", store_dir).code == 0
    before = store_rows(store_dir)
    secret = SECRETS["AWS access key id"]
    (ws / "creds").write_text("x = 1\n" + secret + "\n")
    result = run_cli("commit", ws, "-m", "oops", store=store_dir)
    assert result.code == 1 and result.out == ""
    assert "creds line 2" in result.err and "AWS access key id" in result.err
    assert secret not in result.err and secret[4:] not in result.err
    assert "Traceback" not in result.err and len(result.err.strip().splitlines()) == 1
    assert store_rows(store_dir) == before
    ok = run_cli("--json", "commit", ws, "-m", "allowed", "--allow-secret", "creds", store=store_dir)
    assert ok.code == 0, ok


# --- modes --------------------------------------------------------------------------------------

def test_exec_bit_recorded_and_restored(mem, ws, tmp_path):
    os.chmod(ws / "a.txt", 0o755)
    os.chmod(ws / "sub" / "b.txt", 0o600)
    (ws / "user-x").write_text("#!/bin/sh\n")
    os.chmod(ws / "user-x", 0o700)
    (ws / "group-x").write_text("x")
    os.chmod(ws / "group-x", 0o654)  # executable for group only: not an executable
    mem.checkpoints.commit(str(ws), "modes")
    modes = {p: f["mode"] for p, f in files(mem).items()}
    assert modes == {"a.txt": 0o755, "sub/b.txt": 0o644, "user-x": 0o755, "group-x": 0o644}
    mem.checkpoints.checkout("main", str(tmp_path / "out"))
    got = tree_bytes(tmp_path / "out")
    assert {p: m for p, (_, m) in got.items()} == {"a.txt": 0o755, "sub/b.txt": 0o644, "user-x": 0o755,
                                                  "group-x": 0o644}


# --- consistency while reading ------------------------------------------------------------------

class _ChangingFile:
    """Wraps a real file; each read (or first readinto) may rewrite the file underneath."""

    def __init__(self, handle, path, on_read):
        self._handle, self._path, self._on_read = handle, path, on_read
        self._read_once = False

    def read(self, size=-1):
        data = self._handle.read(size)
        if size is None or size < 0:
            self._on_read(self._path)
        return data

    def readinto(self, buffer):
        count = self._handle.readinto(buffer)
        if not self._read_once:
            self._read_once = True
            self._on_read(self._path)
        return count

    def __getattr__(self, name):
        return getattr(self._handle, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._handle.close()
        return False


def _patch_open(monkeypatch, target, rewrites):
    """Make the snapshot's reads of `target` (after the secret scan) see it being rewritten."""
    real_open = open
    state = {"opens": 0, "reads": 0}

    def on_read(path):
        state["reads"] += 1
        if state["reads"] <= len(rewrites):
            with real_open(path, "wb") as out:  # new size + mtime: the stat signature changes
                out.write(rewrites[state["reads"] - 1])

    def fake_open(path, mode="r", *args, **kw):
        handle = real_open(path, mode, *args, **kw)
        if os.fspath(path) == str(target) and "b" in mode:
            state["opens"] += 1
            if state["opens"] >= 2:  # the first open is the secret scan
                return _ChangingFile(handle, path, on_read)
        return handle

    monkeypatch.setattr(snapshot, "open", fake_open, raising=False)
    return state


def test_file_changed_while_read_is_read_again(mem, ws, monkeypatch, tmp_path):
    target = ws / "sub" / "b.txt"
    state = _patch_open(monkeypatch, target, [b"second version, longer\n"])
    mem.checkpoints.commit(str(ws), "reread")
    assert state["reads"] >= 2
    mem.checkpoints.checkout("main", str(tmp_path / "out"))
    # The checkpoint holds one whole version (the one read consistently), never a mix.
    assert (tmp_path / "out" / "sub" / "b.txt").read_bytes() == b"second version, longer\n"
    assert files(mem)["sub/b.txt"]["size"] == len(b"second version, longer\n")


def test_file_that_keeps_changing_fails_clearly_and_commits_nothing(mem, ws, monkeypatch):
    _patch_open(monkeypatch, ws / "sub" / "b.txt", [b"v%d" % i * (i + 1) for i in range(1, 10)])
    before = {k: v for k, v in rows(mem).items() if k[0] in ("refs", "reflog")}
    with pytest.raises(FileChanged, match="sub/b.txt kept changing"):
        mem.checkpoints.commit(str(ws), "never")
    assert {k: v for k, v in rows(mem).items() if k[0] in ("refs", "reflog")} == before


def test_file_that_gains_a_secret_while_read_is_refused(mem, ws, monkeypatch):
    _patch_open(monkeypatch, ws / "sub" / "b.txt", [("token\n" + SECRETS["GitHub token (classic)"]).encode()])
    with pytest.raises(SecretFound, match="sub/b.txt line 2"):
        mem.checkpoints.commit(str(ws), "late secret")
    with views(mem) as txn:
        assert list(txn.scan("refs")) == []


# --- stat cache ---------------------------------------------------------------------------------

def test_recent_files_are_not_cached(mem, ws):
    mem.checkpoints.commit(str(ws), "first")
    assert mem.checkpoints.commit(str(ws), "second").to_json()["cached_files"] == 0  # written within RACY_NS


def test_stat_cache_used_on_recommit_and_invalidated_on_change(mem, ws, monkeypatch, tmp_path):
    monkeypatch.setattr(snapshot, "RACY_NS", 0)  # treat files as old enough to cache
    (ws / "big.bin").write_bytes(os.urandom(600_000))  # a chunk list (max chunk 512 KiB)
    first = mem.checkpoints.commit(str(ws), "first").to_json()
    assert first["cached_files"] == 0 and first["files"] == 3
    second = mem.checkpoints.commit(str(ws), "unchanged").to_json()
    assert second["cached_files"] == 3 and second["tree"] == first["tree"] and second["new_objects"] == 0
    # Same size, mtime put back: the inode change time still betrays the rewrite.
    st = os.stat(ws / "a.txt")
    (ws / "a.txt").write_text("ALPHA\n")
    os.utime(ws / "a.txt", ns=(st.st_atime_ns, st.st_mtime_ns))
    third = mem.checkpoints.commit(str(ws), "changed").to_json()
    assert third["cached_files"] == 2 and third["tree"] != first["tree"]
    os.chmod(ws / "sub" / "b.txt", 0o755)  # a mode change is a change
    fourth = mem.checkpoints.commit(str(ws), "chmod").to_json()
    assert fourth["cached_files"] <= 2
    mem.checkpoints.checkout("main", str(tmp_path / "out"))
    assert tree_bytes(tmp_path / "out") == tree_bytes(ws)


def test_stat_cache_is_not_trusted_when_objects_are_gone(mem, ws, monkeypatch, tmp_path):
    monkeypatch.setattr(snapshot, "RACY_NS", 0)
    mem.checkpoints.commit(str(ws), "first")
    other = Store.memory()  # same workspace, fresh store: its cache is empty
    assert other.checkpoints.commit(str(ws), "x").to_json()["cached_files"] == 0
    # Drop the stored chunk of a.txt from the first store: the cache entry must not be used.
    a_id = bytes.fromhex(files(mem)["a.txt"]["id"])
    mem.environment.write(lambda txn: packs.delete(txn, a_id))
    again = mem.checkpoints.commit(str(ws), "again").to_json()
    assert again["cached_files"] == 1
    mem.checkpoints.checkout("main", str(tmp_path / "out"))
    assert tree_bytes(tmp_path / "out") == tree_bytes(ws)


def test_remembered_stat_cache_rows_skip_decoding_but_never_outlive_their_bytes(mem, ws, monkeypatch):
    """A process committing again reuses the rows it already checked (a harness
    holding Store open); a row whose stored bytes changed is checked again, and a damaged
    one costs a re-read, never a wrong entry."""
    monkeypatch.setattr(snapshot, "RACY_NS", 0)
    calls = []
    real = snapshot.unseal
    monkeypatch.setattr(snapshot, "unseal", lambda *a: calls.append(a[0]) or real(*a))
    first = mem.checkpoints.commit(str(ws), "first").to_json()
    assert mem.checkpoints.commit(str(ws), "second").to_json()["cached_files"] == 2  # rows read and remembered
    calls.clear()
    third = mem.checkpoints.commit(str(ws), "third").to_json()
    assert third["cached_files"] == 2 and third["tree"] == first["tree"]
    assert calls.count("statcache") == 0  # taken from memory: same bytes as last time
    # Damage a.txt's row in the store: its bytes differ from the remembered ones, so the
    # row is unsealed again, fails its tag, and the file is read from disk.
    key = next(k for k, _ in mem.environment._tables["statcache"].items() if k.endswith(b"a.txt"))
    value = bytearray(mem.environment._tables["statcache"][key])
    value[3] ^= 1
    mem.environment._tables["statcache"][key] = bytes(value)
    fourth = mem.checkpoints.commit(str(ws), "fourth").to_json()
    assert calls.count("statcache") == 1 and fourth["cached_files"] == 1
    assert fourth["tree"] == first["tree"]


def test_agentcasignore_in_subdirectories_follows_git(mem, ws, tmp_path):
    import subprocess
    (ws / ".agentcasignore").write_text("*.log\n/out/\n")
    (ws / "sub" / ".agentcasignore").write_text("!keep.log\ndata/\n/only-here.txt\n")
    (ws / "sub" / "deep").mkdir()
    (ws / "sub" / "deep" / ".agentcasignore").write_text("*.txt\n!want.txt\n")
    for rel in ("x.log", "sub/keep.log", "sub/drop.log", "sub/data/a.bin", "sub/only-here.txt",
                "sub/deep/only-here.txt", "sub/deep/no.txt", "sub/deep/want.txt", "sub/deep/keep.log",
                "out/o.bin", "sub/out/o.bin", "other/data/d.bin"):
        (ws / rel).parent.mkdir(parents=True, exist_ok=True)
        (ws / rel).write_text(rel)
    mem.checkpoints.commit(str(ws), "nested ignores")
    ours = sorted(files(mem))
    # git, on the same tree with the same files named .gitignore, keeps the same paths.
    twin = tmp_path / "twin"
    subprocess.run(["cp", "-r", str(ws), str(twin)], check=True)
    for path in list(twin.rglob(".agentcasignore")):
        path.rename(path.with_name(".gitignore"))
    subprocess.run(["git", "init", "-q", str(twin)], check=True)
    listed = subprocess.run(["git", "-C", str(twin), "ls-files", "--others", "--exclude-standard"],
                            check=True, capture_output=True, text=True).stdout.split()
    assert ours == sorted(p.replace(".gitignore", ".agentcasignore") for p in listed)
    assert {"sub/keep.log", "sub/deep/want.txt", "sub/deep/keep.log", "other/data/d.bin"} <= set(ours)
    assert not {"x.log", "sub/drop.log", "sub/data/a.bin", "sub/only-here.txt", "sub/deep/no.txt", "out/o.bin"} & set(ours)


def test_ignored_files_with_unstorable_names_are_skipped(mem, ws):
    (ws / ".agentcasignore").write_text("*.tmp\nIcon?\n")
    (ws / "bad\\name.tmp").write_text("x")
    (ws / "Icon\r").write_text("finder junk")
    mem.checkpoints.commit(str(ws), "ignored bad names")
    assert sorted(files(mem)) == [".agentcasignore", "a.txt", "sub/b.txt"]


def test_file_deleted_after_the_walk_fails_clearly(mem, ws, monkeypatch):
    real_walk = snapshot.Snapshotter.walk

    def walk_then_delete(self):
        dirs = real_walk(self)
        os.unlink(ws / "sub" / "b.txt")
        return dirs

    monkeypatch.setattr(snapshot.Snapshotter, "walk", walk_then_delete)
    refused(mem, ws, WorkspaceError, "cannot read sub/b.txt")


def test_reasons_at_the_limits_are_accepted(mem, ws):
    assert mem.checkpoints.show(mem.checkpoints.commit(str(ws), "x" * 512).to_json()["checkpoint"]).to_json()["reason"] == "x" * 512
    reason = "\u20ac" * 341 + "x"  # 342 characters, 1,024 UTF-8 bytes
    assert mem.checkpoints.show(mem.checkpoints.commit(str(ws), reason).to_json()["checkpoint"]).to_json()["reason"] == reason


def test_allowed_secret_is_rescanned_by_a_later_commit_without_the_flag(tmp_path):
    """--allow-secret applies to one commit; the stat cache must not carry it forward."""
    import time as _time

    from agentcas import Store
    from agentcas.workspace import snapshot as snapshot_module
    from agentcas.workspace.snapshot import SecretFound
    store = Store.memory()
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "env.sh").write_text("GITHUB=ghp_" + "A1b2C3d4E5" * 4 + "\n")
    old = snapshot_module.RACY_NS
    snapshot_module.RACY_NS = 0
    try:
        _time.sleep(0.01)
        store.checkpoints.commit(str(ws), "allowed once", allow_secrets=["env.sh"])
        with pytest.raises(SecretFound):
            store.checkpoints.commit(str(ws), "not allowed this time")
    finally:
        snapshot_module.RACY_NS = old


# --- large files: streamed, never held whole ------------------------------------------------------

@pytest.fixture
def small_stream(monkeypatch):
    """Stream files over 1 MiB, scanning 256 KiB windows that overlap by 4 KiB."""
    monkeypatch.setattr(snapshot, "STREAM_BYTES", 1 << 20)
    monkeypatch.setattr(secrets, "SCAN_WINDOW", 256 << 10)
    monkeypatch.setattr(secrets, "SCAN_OVERLAP", 4096)


def _text_lines(count: int, seed: int = 0) -> list[bytes]:
    rng = random.Random(seed)
    return [(" ".join(rng.choice(["alpha", "beta", "gamma", "delta", "task-1"]) for _ in range(8)) + "\n").encode()
            for _ in range(count)]


def test_streamed_file_gives_the_tree_of_a_whole_read(tmp_path, ws, monkeypatch):
    import blake3
    data = random.Random(7).randbytes(3 << 20)
    (ws / "big.bin").write_bytes(data)
    (ws / "big.txt").write_bytes(b"".join(_text_lines(60_000)))
    whole = Store.memory().checkpoints.commit(str(ws), "whole").to_json()
    monkeypatch.setattr(snapshot, "STREAM_BYTES", 1 << 20)
    streamed_store = Store.memory()
    streamed = streamed_store.checkpoints.commit(str(ws), "streamed").to_json()
    # FastCDC over the stream cuts where it cuts the whole buffer: same chunks, same ids.
    assert streamed["tree"] == whole["tree"]
    assert files(streamed_store)["big.bin"]["id"] == blake3.blake3(data).hexdigest()
    streamed_store.checkpoints.checkout("main", str(tmp_path / "out"))
    assert (tmp_path / "out" / "big.bin").read_bytes() == data


@pytest.mark.parametrize("at", [10, 14_000, 39_990])
def test_secret_in_a_streamed_file_is_refused_at_its_line(mem, ws, small_stream, at):
    lines = _text_lines(40_000)  # ~1.7 MB: streamed, seven windows
    lines.insert(at, b"GITHUB=" + SECRETS["GitHub token (classic)"].encode() + b"\n")
    (ws / "log.txt").write_bytes(b"".join(lines))
    refused(mem, ws, SecretFound, "log.txt", f"line {at + 1};")


def _windows(monkeypatch, text: bytes, piece: int, secret: bytes):
    """Feed `text` to a WindowScan (10,000-byte windows, 100-byte overlap) in pieces;
    (pieces released before the secret was seen, the window that saw it or None)."""
    monkeypatch.setattr(secrets, "SCAN_WINDOW", 10_000)
    monkeypatch.setattr(secrets, "SCAN_OVERLAP", 100)
    seen = []

    def check(data, lines_before):
        if secret in data:
            seen.append(data)
            raise SecretFound("found")
    windows, released = secrets.WindowScan(check), []
    try:
        for offset in range(0, len(text), piece):
            released += windows.feed(text[offset:offset + piece])
        released += windows.finish()
    except SecretFound:
        pass
    return b"".join(released), (seen[0] if seen else None)


@pytest.mark.parametrize("start", [10_430, 10_480, 10_499, 20_990])
def test_a_secret_straddling_two_windows_is_seen_before_any_of_it_is_released(monkeypatch, start):
    # Pieces of 700 bytes: windows close at 10,500 and 21,000 bytes, carrying 100 back.
    secret = b"S3CR3T" * 5  # 30 bytes, shorter than the overlap
    text = bytearray(b"x" * 40_000)
    text[start:start + len(secret)] = secret
    released, seen = _windows(monkeypatch, bytes(text), 700, secret)
    assert seen is not None  # one window held the whole secret
    assert len(released) <= start  # and nothing from its first byte on had been released


def test_windows_release_every_byte_once_in_order(monkeypatch):
    text = bytes(random.Random(3).randbytes(55_555))
    released, seen = _windows(monkeypatch, text, 777, b"\xff" * 64)
    assert seen is None and released == text


def test_window_line_numbers_count_from_the_start_of_the_file(monkeypatch):
    monkeypatch.setattr(secrets, "SCAN_WINDOW", 1_000)
    monkeypatch.setattr(secrets, "SCAN_OVERLAP", 50)
    text = b"".join(_text_lines(2_000))
    marker = text.index(b"\n", 30_000) + 1
    text = text[:marker] + b"NEEDLE\n" + text[marker:]
    found = []

    def check(data, lines_before):
        if b"NEEDLE" in data and not found:
            found.append(lines_before + data.count(b"\n", 0, data.index(b"NEEDLE")) + 1)
    windows = secrets.WindowScan(check)
    for offset in range(0, len(text), 333):
        windows.feed(text[offset:offset + 333])
    windows.finish()
    assert found == [text.count(b"\n", 0, marker) + 1]


def test_binary_streamed_file_is_not_scanned(mem, ws, small_stream):
    (ws / "blob.bin").write_bytes(b"\0" + os.urandom(1_500_000) + SECRETS["GitHub token (classic)"].encode())
    mem.checkpoints.commit(str(ws), "binary")
    assert files(mem)["blob.bin"]["size"] == 1_500_001 + len(SECRETS["GitHub token (classic)"])


def test_streamed_file_that_keeps_changing_fails_and_moves_nothing(mem, ws, small_stream, monkeypatch):
    from agentcas.cas import chunking
    target = ws / "big.bin"
    target.write_bytes(os.urandom(2 << 20))
    real_cut_stream = chunking.cut_stream

    def rewriting(handle, sizes=chunking.LOCAL):
        for index, piece in enumerate(real_cut_stream(handle, sizes)):
            if index == 1:  # rewritten under the reader: new size and mtime
                target.write_bytes(os.urandom((2 << 20) + index + len(piece) % 7 + 1))
            yield piece
    monkeypatch.setattr(chunking, "cut_stream", rewriting)
    refs_before = {k: v for k, v in rows(mem).items() if k[0] in ("refs", "reflog")}
    with pytest.raises(FileChanged, match="big.bin kept changing"):
        mem.checkpoints.commit(str(ws), "never")
    assert {k: v for k, v in rows(mem).items() if k[0] in ("refs", "reflog")} == refs_before


def test_streamed_file_changed_once_is_read_again(tmp_path, ws, small_stream, monkeypatch):
    from agentcas.cas import chunking
    target = ws / "big.bin"
    target.write_bytes(os.urandom(2 << 20))
    final = os.urandom(3 << 20)
    real_cut_stream = chunking.cut_stream
    calls = []

    def rewriting_once(handle, sizes=chunking.LOCAL):
        calls.append(1)
        for index, piece in enumerate(real_cut_stream(handle, sizes)):
            if index == 1 and len(calls) == 1:
                target.write_bytes(final)
            yield piece
    monkeypatch.setattr(chunking, "cut_stream", rewriting_once)
    store = Store.memory()
    store.checkpoints.commit(str(ws), "reread")
    assert len(calls) == 2
    store.checkpoints.checkout("main", str(tmp_path / "out"))
    assert (tmp_path / "out" / "big.bin").read_bytes() == final


def test_file_too_large_for_memory_is_named_and_nothing_stored(mem, ws, monkeypatch):
    def no_memory(self, size):
        raise MemoryError
    monkeypatch.setattr(snapshot.Snapshotter, "_buffer", no_memory)
    message = refused(mem, ws, snapshot.FileTooLarge, "not enough memory to read", "nothing was committed")
    assert "a.txt" in message or "sub/b.txt" in message


@pytest.mark.parametrize("before", ["text", "binary"])
def test_secret_written_while_a_large_file_is_stored_never_lands(mem, ws, small_stream, monkeypatch, before):
    from agentcas.cas import chunking, framing, writer
    monkeypatch.setattr(writer, "BATCH_OBJECTS", 1)  # every object the writer is given lands at once
    target = ws / "notes.txt"
    clean = b"".join(_text_lines(150_000))  # ~6.4 MB: the chunker refills its buffer many times
    # The scan pass sees this version (a binary head is not scanned at all).
    target.write_bytes(clean if before == "text" else b"\0" + clean)
    secret = SECRETS["GitHub token (classic)"].encode()
    real_cut_stream = chunking.cut_stream
    calls = []

    class Rewritten:
        """The store pass's reader: after 2 MB the file is rewritten under it, as text
        holding a secret at 4 MB (so the rest of this read sees the new version)."""

        def __init__(self, handle):
            self.handle, self.delivered = handle, 0

        def readinto(self, view):
            count = self.handle.readinto(memoryview(view)[:65536])
            self.delivered += count
            if len(calls) == 1 and self.delivered >= 2_000_000 and not getattr(self, "done", False):
                self.done = True
                target.write_bytes(clean[:4_000_000] + b"\nTOKEN " + secret + b"\n" + clean[4_000_000:])
            return count

    def gains_a_secret(handle, sizes=chunking.LOCAL):
        calls.append(1)
        return real_cut_stream(Rewritten(handle), sizes)
    monkeypatch.setattr(chunking, "cut_stream", gains_a_secret)
    refs_before = {k: v for k, v in rows(mem).items() if k[0] in ("refs", "reflog")}
    with pytest.raises(SecretFound, match="notes.txt line"):
        mem.checkpoints.commit(str(ws), "late secret")
    after = rows(mem)
    assert {k: v for k, v in after.items() if k[0] in ("refs", "reflog")} == refs_before
    for (table, _key), value in after.items():  # chunks stored before the secret was seen are clean
        if table == "objects":
            assert secret not in framing.unframe(value)[1]


def test_progress_moves_while_a_large_file_streams(mem, ws, small_stream):
    (ws / "big.bin").write_bytes(os.urandom(4 << 20))
    seen = []
    mem.checkpoints.commit(str(ws), "progress", progress=lambda done, total: seen.append((done, total)))
    total = seen[-1][1]
    assert seen[-1][0] == total and len([d for d, _ in seen if 0 < d < total]) >= 5
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)


def test_stat_cache_rows_are_binary_and_version_1_rows_still_count(mem, ws, monkeypatch):
    """Rows are a fixed binary layout (docs/FORMAT.md section 4); a JSON row of an older store
    is still used, and a row of an unknown shape is a cache miss, never an error."""
    from agentcas.cas import encoding
    from agentcas.cas.sealed import seal, unseal
    monkeypatch.setattr(snapshot, "RACY_NS", 0)
    first = mem.checkpoints.commit(str(ws), "first").to_json()
    table = mem.environment._tables["statcache"]
    payloads = {k: unseal("statcache", k, v) for k, v in table.items()}
    assert {p[:1] for p in payloads.values()} == {b"\x02"} and len(payloads) == 2
    key = next(k for k in payloads if k.endswith(b"a.txt"))
    sig, entry = snapshot._decode_cache_row(payloads[key], "a.txt")
    old_row = encoding.encode({"sig": list(sig), "entry": entry.to_doc()})  # as format 1 wrote it
    snapshot._DECODED_ROWS.clear()
    table[key] = seal("statcache", key, old_row)
    assert mem.checkpoints.commit(str(ws), "old row").to_json()["cached_files"] == 2
    snapshot._DECODED_ROWS.clear()
    table = mem.environment._tables["statcache"]  # each write replaces the memory store's tables
    table[key] = seal("statcache", key, b"\x07" + payloads[key][1:])  # unknown version
    again = mem.checkpoints.commit(str(ws), "unknown row").to_json()
    assert again["cached_files"] == 1 and again["tree"] == first["tree"]


def test_joined_ignore_regex_answers_as_pathspec_does():
    """The snapshot's one-regex prefilter of a directory's ignore patterns gives pathspec's answer."""
    import random

    import pathspec

    from agentcas.workspace.snapshot import _IgnoreSpec
    lines = ["*.log", "build/", "!keep.log", "/top", "a/**/b", "node_modules/", "*.py[co]", "docs/*.md",
             "!docs/README.md", "**/tmp", "# comment", "", "\\#hash", "sp ace"]
    spec = pathspec.GitIgnoreSpec.from_lines(lines)
    joined = _IgnoreSpec(spec)
    rng = random.Random(7)
    names = ["a", "b", "build", "docs", "top", "tmp", "x.log", "y.py", "keep.log", "README.md", "n.pyc", "#hash",
             "sp ace", "node_modules"]
    for _ in range(20000):
        path = "/".join(rng.choice(names) for _ in range(rng.randint(1, 4))) + rng.choice(["", "/"])
        assert joined.include(path) == spec.check_file(path).include, path
    assert _IgnoreSpec(pathspec.GitIgnoreSpec.from_lines(["# only a comment"])).include("x") is None
