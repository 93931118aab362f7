"""A private machine for harness tests: a HOME holding Claude Code's and Codex's
directories, a workspace and a store, driven through the real CLI."""

from __future__ import annotations

import json
import os
from pathlib import Path

from agentcas import Store

from support.cli import run_cli
from support.harness_samples import ClaudeSession

CLAUDE_ID = "5f0c2a7e-1111-4222-8333-444455556666"
CODEX_ID = "0199a0b1-0000-7000-8000-000000000001"


class Machine:
    """A private HOME with a workspace, Claude Code's and Codex's directories, a store."""

    def __init__(self, root: Path, name: str = "a"):
        self.root = root / name
        self.home = self.root / "home"
        self.ws = self.root / "work" / "proj"
        self.ws.mkdir(parents=True)
        self.home.mkdir()
        self.store = self.root / "store"
        self.env = {"HOME": str(self.home), "CLAUDE_CONFIG_DIR": str(self.home / ".claude"),
                    "CODEX_HOME": str(self.home / ".codex"), "XDG_DATA_HOME": str(self.home / "data"),
                    "XDG_STATE_HOME": str(self.home / "state"), "AGENTCAS_STORE": str(self.store)}
        self.env.pop("CLAUDE_PROJECT_DIR", None)
        os.environ.pop("CLAUDE_PROJECT_DIR", None)

    def run(self, *args, input=None, env=None):
        return run_cli(*args, input=input, env=dict(self.env, **(env or {})), cwd=str(self.ws))

    @property
    def transcript(self) -> Path:
        key = "".join(c if c.isalnum() and c.isascii() else "-" for c in str(self.ws))
        return self.home / ".claude" / "projects" / key / f"{CLAUDE_ID}.jsonl"

    def rollout(self) -> Path:
        return self.home / ".codex" / "sessions" / "2026" / "11" / "30" / f"rollout-2026-11-30T10-00-00-{CODEX_ID}.jsonl"

    def claude_event(self, name: str, session: ClaudeSession, **fields) -> str:
        doc = {"session_id": session.session_id, "transcript_path": str(self.transcript), "cwd": str(self.ws),
               "hook_event_name": name, "permission_mode": "default", **fields}
        return json.dumps(doc)

    def write_transcript(self, session: ClaudeSession) -> None:
        self.transcript.parent.mkdir(parents=True, exist_ok=True)
        self.transcript.write_bytes(session.data())

    def hook(self, name: str, session: ClaudeSession, **fields):
        return self.run("hook", "claude", input=self.claude_event(name, session, **fields))

    def files(self) -> dict:
        return {str(p.relative_to(self.ws)): p.read_bytes() for p in sorted(self.ws.rglob("*"))
                if p.is_file() and ".git" not in p.relative_to(self.ws).parts}


def stored_files(store_path: Path, rev: str) -> dict:
    store = Store.open(str(store_path))
    try:
        _, cp = store.checkpoints.get(rev)
        return store.checkpoints.tree_files(cp.tree)
    finally:
        store.close()


def history_bytes(m: Machine, thread: str) -> bytes:
    r = m.run("rollout", "cat", thread)
    assert r.code == 0, r
    return r.out.encode("utf-8", "surrogateescape") if isinstance(r.out, str) else r.out


def log(m: Machine, thread: str) -> list:
    r = m.run("--json", "log", thread)
    assert r.code == 0, r
    return r.json()["checkpoints"]
