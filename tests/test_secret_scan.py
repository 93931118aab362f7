"""Rollout records are scanned for credentials when history leaves the store.

`export` and `push` refuse a record that looks like a secret, naming thread, seq and rule
but never the secret, unless --allow-rollout-secrets; `scan REV` reports files and history.
"""

from __future__ import annotations

import json

import pytest

from agentcas.exchange.secret_scan import findings_in

from support.cli import run_cli
from support.store_state import store_rows

TOKEN = "ghp_" + "aB3dE5fG7hJ9kL1mN2pQ4rS6tU8vW0xY2zA4"
KEY_BLOCK = "-----BEGIN OPENSSH PRIVATE KEY-----"


def records(*texts) -> bytes:
    return b"".join(json.dumps({"type": "message", "text": t}).encode() + b"\n" for t in texts)


@pytest.fixture
def leaky(tmp_path):
    """A store whose main thread's record seq 2 holds a GitHub token (and a clean workspace)."""
    store = tmp_path / "store"
    assert run_cli("init", store).code == 0
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "notes.md").write_text("nothing to see\n")
    data = records("hello", "running tool", f"the tool printed {TOKEN}", "done")
    assert run_cli("rollout", "append", "main", "-", store=store, input=data.decode()).code == 0
    assert run_cli("commit", ws, "-m", "one", store=store).code == 0
    return store, ws


def refused_without_secret(result, verb: str):
    assert result.code == 1, result  # as a commit refused for a secret: an error, not corruption
    assert f"refusing to {verb}: rollout record seq 2 of thread 'main' looks like a GitHub token" in result.err
    assert TOKEN not in result.err and TOKEN[4:] not in result.err and "Traceback" not in result.err


def test_export_refuses_a_secret_in_the_rollout(leaky, tmp_path):
    store, _ = leaky
    bundle = tmp_path / "b.bundle"
    before = store_rows(store)
    refused_without_secret(run_cli("export", "main", "-o", bundle, store=store), "export")
    assert not bundle.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["store", "ws"]
    assert store_rows(store) == before
    allowed = run_cli("export", "main", "-o", bundle, "--allow-rollout-secrets", store=store)
    assert allowed.code == 0, allowed


def test_a_private_key_in_the_rollout_never_leaves_in_a_bundle(tmp_path):
    store = tmp_path / "store"
    assert run_cli("init", store).code == 0
    data = records("hi", f"{KEY_BLOCK}\\nb3BlbnNzaC1rZXktdjEAAAAA\\n-----END OPENSSH PRIVATE KEY-----")
    assert run_cli("rollout", "append", "main", "-", store=store, input=data.decode()).code == 0
    (tmp_path / "ws").mkdir()
    assert run_cli("commit", tmp_path / "ws", "-m", "one", store=store).code == 0
    result = run_cli("export", "main", "-o", tmp_path / "b.bundle", "--allow-rollout-secrets", store=store)
    assert result.code == 1 and "seq 1 of thread 'main' looks like a private key block" in result.err, result
    assert not (tmp_path / "b.bundle").exists()


def test_push_refuses_a_secret_in_the_records_it_would_send(leaky, tmp_path):
    store, _ = leaky
    remote = tmp_path / "remote"
    assert run_cli("init", remote).code == 0
    assert run_cli("remote", "add", "team", remote, store=store).code == 0
    before = store_rows(remote)
    refused_without_secret(run_cli("push", "team", "main", store=store), "push")
    assert store_rows(remote) == before
    assert run_cli("push", "team", "main", "--allow-rollout-secrets", store=store).code == 0
    # Records the remote already holds have left already: a clean append pushes.
    assert run_cli("rollout", "append", "main", "-", store=store, input=records("clean").decode()).code == 0
    again = run_cli("push", "team", "main", store=store)
    assert again.code == 0, again


def test_scan_reports_files_and_history_without_the_secrets(leaky, tmp_path):
    store, ws = leaky
    (ws / "env.sh").write_text(f"export GITHUB_TOKEN={TOKEN}\n")
    assert run_cli("commit", ws, "-m", "two", "--allow-secret", "env.sh", store=store).code == 0
    result = run_cli("--json", "scan", "main", store=store)
    assert result.code == 1, result
    doc = result.json()
    assert doc["files"] == [{"path": "env.sh", "line": 1, "rule": "GitHub token"}]
    assert doc["history"] == [{"thread": "main", "seq": 2, "rule": "GitHub token"}]
    assert not doc["clean"] and TOKEN not in result.out and TOKEN not in result.err
    text = run_cli("scan", "main", store=store)
    assert text.code == 1 and "env.sh:1: looks like a GitHub token" in text.out
    assert "rollout main seq 2: looks like a GitHub token" in text.out and TOKEN not in text.out


def test_scan_of_a_clean_checkpoint(tmp_path):
    store = tmp_path / "store"
    assert run_cli("init", store).code == 0
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "a.txt").write_text("a\n")
    assert run_cli("rollout", "append", "main", "-", store=store, input=records("x", "y").decode()).code == 0
    assert run_cli("commit", tmp_path / "ws", "-m", "one", store=store).code == 0
    result = run_cli("--json", "scan", "main", store=store)
    assert result.code == 0, result
    assert result.json()["clean"] and result.json()["records"] == 2
    assert run_cli("scan", "main", "--json", store=store).json() == result.json()


def test_findings_name_every_line_in_order_whatever_the_rule_order():
    data = records("a", TOKEN, "b", "AKIAABCDEFGHIJKLMNOP", KEY_BLOCK)
    assert list(findings_in(data)) == [(1, "GitHub token"), (3, "AWS access key id"), (4, "private key block")]
    assert list(findings_in(data, private_key_only=True)) == [(4, "private key block")]


@pytest.mark.parametrize("text, rule, private", [
    ("key \\u0041KIAIOSFODNN7EXAMPL\\u0045 in a tool's output", "AWS access key id", False),
    ("-----BEGIN RSA PRIVATE\\u0020KEY-----\\nMIIEowIBAAKCAQEA\\n-----END RSA PRIVATE KEY-----",
     "private key block", True),
])
def test_json_escapes_do_not_hide_a_secret_from_the_rollout_scan(tmp_path, text, rule, private):
    """The record's bytes hold `\\u0041KIA...`; its decoded string value holds the key."""
    store = tmp_path / "store"
    assert run_cli("init", store).code == 0
    line = '{"type": "message", "text": "' + text + '"}\n'
    assert rule.split()[0].encode() not in line.encode() or "\\u0020" in line  # hidden in the bytes
    assert run_cli("rollout", "append", "main", "-", store=store, input=records("hi").decode() + line).code == 0
    (tmp_path / "ws").mkdir()
    assert run_cli("commit", tmp_path / "ws", "-m", "one", store=store).code == 0
    bundle = tmp_path / "b.bundle"
    result = run_cli("export", "main", "-o", bundle, store=store)
    assert result.code == 1 and f"seq 1 of thread 'main' looks like a {rule}" in result.err, result
    allowed = run_cli("export", "main", "-o", bundle, "--allow-rollout-secrets", store=store)
    # A private key block never leaves in a bundle, escaped or not.
    assert allowed.code == (1 if private else 0), allowed
    assert bundle.exists() == (not private)


def test_a_secret_in_a_commit_reason_is_refused_at_commit_and_at_export_and_push(tmp_path):
    store, remote = tmp_path / "store", tmp_path / "remote"
    for path in (store, remote):
        assert run_cli("init", path).code == 0
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("a\n")
    before = store_rows(store)
    refused = run_cli("commit", ws, "-m", f"deploy with {TOKEN}", store=store)
    assert refused.code == 1 and refused.err == (
        "agentcas: error: possible secret (GitHub token) in the commit reason; nothing was committed "
        "(use --allow-secret ':reason' if it is meant to be stored)\n"), refused
    assert store_rows(store) == before
    allowed = run_cli("commit", ws, "-m", f"deploy with {TOKEN}", "--allow-secret", ":reason", store=store)
    assert allowed.code == 0, allowed
    bundle = tmp_path / "b.bundle"
    result = run_cli("export", "main", "-o", bundle, store=store)
    assert result.code == 1 and "the reason of checkpoint" in result.err and "GitHub token" in result.err, result
    assert TOKEN not in result.err and not bundle.exists()
    assert run_cli("export", "main", "-o", bundle, "--allow-secret", ":reason", store=store).code == 0
    assert run_cli("remote", "add", "team", remote, store=store).code == 0
    remote_before = store_rows(remote)
    pushed = run_cli("push", "team", "main", store=store)
    assert pushed.code == 1 and "the reason of checkpoint" in pushed.err and TOKEN not in pushed.err, pushed
    assert store_rows(remote) == remote_before
    assert run_cli("push", "team", "main", "--allow-secret", ":reason", store=store).code == 0


def test_a_secret_in_a_file_name_is_refused_at_commit_and_at_export(tmp_path):
    store = tmp_path / "store"
    assert run_cli("init", store).code == 0
    ws = tmp_path / "ws"
    (ws / "keys").mkdir(parents=True)
    (ws / "keys" / f"{TOKEN}.txt").write_text("harmless content\n")
    before = store_rows(store)
    refused = run_cli("commit", ws, "-m", "one", store=store)
    assert refused.code == 1 and "possible secret (GitHub token) in the name of an entry of directory 'keys'" \
        in refused.err, refused
    assert TOKEN not in refused.err and store_rows(store) == before
    assert run_cli("commit", ws, "-m", "one", "--allow-secret", "keys/*", store=store).code == 0
    assert TOKEN not in run_cli("log", store=store).out
    bundle = tmp_path / "b.bundle"
    result = run_cli("export", "main", "-o", bundle, store=store)
    assert result.code == 1 and "an entry name in tree" in result.err and TOKEN not in result.err, result
    assert not bundle.exists()
    assert run_cli("export", "main", "-o", bundle, "--allow-secret", "ghp_*", store=store).code == 0


def test_the_shipped_window_overlap_finds_a_long_secret_straddling_two_windows():
    """A file is scanned in windows of SCAN_WINDOW bytes that overlap by SCAN_OVERLAP: a
    secret cut by the first window's end one byte before it would match is found whole in
    the second, with the shipped constants (no test override): private key blocks whose
    header has a few words or many (1,027 characters; no prefix of one matches a rule)."""
    from agentcas.workspace import secrets
    for secret, rule in ((b"-----BEGIN ENCRYPTED PRIVATE KEY-----", "private key block"),
                         (b"-----BEGIN " + b"RSA4096 " * 125 + b"PRIVATE KEY-----", "private key block")):
        assert secrets.scan(secret, "t", sniff=False).rule == rule
        assert secrets.scan(secret[:-1], "t", sniff=False) is None
        cut = secrets.SCAN_WINDOW - len(secret) + 1  # the first window ends one byte short of it
        data = b"x" * (cut - 1) + b"\n" + secret + b"\n" + b"y" * 1000
        found = []
        windows = secrets.WindowScan(lambda window, lines: found.extend(
            (lines + line + 1, rule) for line, rule in findings_in(window)))
        piece = 1 << 20
        released = []
        for start in range(0, len(data), piece):
            released += windows.feed(data[start:start + piece])
        released += windows.finish()
        assert b"".join(released) == data
        assert found == [(2, rule)], (rule, found)
