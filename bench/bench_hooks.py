"""Harness hooks, rewind and Codex forks, beside the tools a user would otherwise use.

1. A Claude Code `PostToolUse` hook (`agentcas hook claude`, the real CLI, event on stdin)
   on a workspace of N files (100,000 and 10,000, ~280 bytes each in 1,000 / 100
   directories) where a shell command changed one file, against a shadow-git checkpoint of
   the same tree (`git add -A && git commit` into a separate git dir, as other agent tools
   do). Steps alternate hook and git on the same change; p50 and p99 of each.
2. `agentcas rewind --only code` of 10 changed files in the 100,000-file workspace, against
   the hook's time on the same workspace.
3. Codex forks copying 80%, 90% and 95% of their parent's records (Codex gives every
   copied line a new timestamp): the store's growth over the fork file's bytes, with the
   parent ingested whole or captured turn by turn by the hook, and the fork ingested whole
   or captured by the hook too.

    python bench/bench_hooks.py [--quick]       # --quick: 10,000 and 2,000 files, fewer steps
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

import harness as h  # noqa: E402
from support.harness_samples import ClaudeSession, CodexSession  # noqa: E402

SESSION = "5f0c2a7e-1111-4222-8333-444455556666"


def make_workspace(root: str, files: int) -> None:
    per_dir = 100
    for d in range(files // per_dir):
        directory = os.path.join(root, f"pkg{d // 50}", f"mod{d}")
        os.makedirs(directory, exist_ok=True)
        for f in range(per_dir):
            with open(os.path.join(directory, f"f{f}.py"), "w") as handle:
                handle.write(f"# module {d} file {f}\n" * 12)
    with open(os.path.join(root, ".gitignore"), "w") as handle:
        handle.write("*.log\n")


def timed(cmd, env, input=None, cwd=None) -> float:
    os.sync()
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, input=input, capture_output=True, cwd=cwd)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise h.ToolFailed(f"{cmd} exited {proc.returncode}: {proc.stderr.decode(errors='replace')[-300:]}")
    return elapsed


def pct(values, q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


class HookedWorkspace:
    """A workspace, its store, a shadow git dir and a Claude transcript in one work dir."""

    def __init__(self, work: str, files: int):
        self.work, self.env = work, h.env_for(work)
        self.ws = os.path.join(work, "ws")
        make_workspace(self.ws, files)
        self.dirs = files // 100
        self.store = os.path.join(work, "store")
        self.gitdir = os.path.join(work, "shadow.git")
        self.env["AGENTCAS_STORE"] = self.store
        h.run([h.AGENTCAS, "init", self.store], env=self.env)
        h.run(["git", "init", "-q", "--bare", self.gitdir], env=self.env)
        self.git_env = dict(self.env, GIT_DIR=self.gitdir, GIT_WORK_TREE=self.ws)
        self.session = ClaudeSession(SESSION, cwd=self.ws)
        self.session.prompt("make the tests pass")
        self.transcript = os.path.join(work, "transcript.jsonl")
        self.step = 0
        self.write_transcript()

    def write_transcript(self) -> None:
        with open(self.transcript, "wb") as handle:
            handle.write(self.session.data())

    def event(self) -> bytes:
        return json.dumps({"session_id": SESSION, "transcript_path": self.transcript, "cwd": self.ws,
                           "hook_event_name": "PostToolUse", "tool_name": "Bash",
                           "tool_input": {"command": "edit"}, "tool_response": {"stdout": ""},
                           "tool_use_id": f"toolu_{self.step:04d}"}).encode()

    def change(self, count: int = 1) -> None:
        """A shell command edits `count` files, and the transcript gets its tool call."""
        self.step += 1
        for n in range(count):
            d = (self.step * 37 + n * 101) % self.dirs
            path = os.path.join(self.ws, f"pkg{d // 50}", f"mod{d}", f"f{n % 100}.py")
            with open(path, "a") as handle:
                handle.write(f"# step {self.step}\n")
        self.session.tool("Bash", f"edit step {self.step}", "ok")
        self.write_transcript()

    def hook(self) -> float:
        return timed([h.AGENTCAS, "hook", "claude"], self.env, input=self.event())

    def shadow_git(self) -> float:
        return timed(["sh", "-c", "git add -A && git commit -q --allow-empty -m step"], self.git_env)


def bench_hook_vs_git(files_list, steps: int) -> dict:
    rows, kept = [], {}
    for files in files_list:
        with h.work_dir(f"hooks-{files}") as work:
            h.progress(f"hooks: building {files} files")
            w = HookedWorkspace(work, files)
            w.hook()          # first checkpoint (everything read)
            w.shadow_git()    # first commit
            time.sleep(2.1)   # past the racy window of both
            w.hook()
            w.shadow_git()
            hook_times, git_times = [], []
            for n in range(steps):
                w.change()
                if n % 2:
                    git_times.append(w.shadow_git())
                    hook_times.append(w.hook())
                else:
                    hook_times.append(w.hook())
                    git_times.append(w.shadow_git())
            rows.append([f"{files:,}", steps, h.fmt_time(pct(hook_times, .5)), h.fmt_time(pct(hook_times, .99)),
                         h.fmt_time(pct(git_times, .5)), h.fmt_time(pct(git_times, .99)),
                         h.fmt_ratio(h.ratio(pct(hook_times, .5), pct(git_times, .5))),
                         h.fmt_ratio(h.ratio(pct(hook_times, .99), pct(git_times, .99)))])
            kept[files] = (statistics.median(hook_times), w)
            if files == max(files_list):
                kept["rewind"] = bench_rewind(w)
    h.table("`agentcas hook claude` (PostToolUse, one file changed by a shell command) vs shadow git "
            "(`git add -A && git commit` into a separate git dir)",
            ["files", "steps", "hook p50", "hook p99", "git p50", "git p99", "p50 ratio", "p99 ratio"], rows,
            ["Each step changes one file and appends the tool call to the transcript; hook and git alternate "
             "which goes first. The hook's time includes starting Python and the agentcas CLI, snapshotting "
             f"the workspace and appending the transcript's new lines. {h.load_note()}."])
    return kept


def bench_rewind(w: HookedWorkspace) -> None:
    h.progress("rewind: 10 changed files")
    thread = f"claude/{SESSION}"
    out = subprocess.run([h.AGENTCAS, "--json", "log", thread, "-n", "1"], env=w.env, capture_output=True)
    before = json.loads(out.stdout)["checkpoints"][0]["checkpoint"]
    rows = []
    rewind_times, hook_times = [], []
    for _ in range(4):
        w.change(10)
        hook_times.append(w.hook())
        out = subprocess.run([h.AGENTCAS, "--json", "log", thread, "-n", "1"], env=w.env, capture_output=True)
        after = json.loads(out.stdout)["checkpoints"][0]["checkpoint"]
        rewind_times.append(timed([h.AGENTCAS, "rewind", thread, "--to", before, "--only", "code"], w.env))
        rewind_times.append(timed([h.AGENTCAS, "rewind", thread, "--to", after, "--only", "code"], w.env))
        w.change()
        hook_times.append(w.hook())
        out = subprocess.run([h.AGENTCAS, "--json", "log", thread, "-n", "1"], env=w.env, capture_output=True)
        before = json.loads(out.stdout)["checkpoints"][0]["checkpoint"]
    rows.append([len(rewind_times), h.fmt_time(statistics.median(rewind_times)), h.fmt_time(max(rewind_times)),
                 h.fmt_time(statistics.median(hook_times)),
                 h.fmt_ratio(h.ratio(statistics.median(rewind_times), statistics.median(hook_times)))])
    h.table("`agentcas rewind --only code` of 10 changed files in the 100,000-file workspace",
            ["rewinds", "rewind median", "rewind max", "hook median (same workspace)", "ratio"], rows,
            ["A rewind checkpoints the workspace first (its `undo`), then writes the 10 files back. "
             f"Target: within 2× the hook. {h.load_note()}."])


# Capture a Codex session as the hook does, in one process (the bytes stored are the CLI's:
# `agentcas hook codex` calls hooks.run_hook): argv store, CODEX_HOME, workspace, session
# file, the whole session's bytes, and the byte offsets where its turns end (JSON).
HOOK_SCRIPT = r"""
import json, os, sys
store_path, codex_home, workspace, path, whole, ends = sys.argv[1:]
os.environ["CODEX_HOME"] = codex_home
from agentcas.harnesses import hooks
data = open(whole, "rb").read()
thread_id = json.loads(data[:data.index(b"\n")])["payload"]["id"]
store = hooks.open_hook_store(store_path)
for number, end in enumerate(json.loads(ends)):
    with open(path + ".tmp", "wb") as handle:
        handle.write(data[:end])
    os.replace(path + ".tmp", path)
    payload = {"type": "agent-turn-complete", "thread-id": thread_id, "turn-id": f"t{number}",
               "cwd": workspace, "input-messages": [], "last-assistant-message": "done"}
    outcome = hooks.run_hook(store, hooks.codex_event(json.dumps(payload)))
    assert outcome.checkpoint is not None and outcome.checkpoint.refused is None, outcome.checkpoint
store.close()
"""

FORK_CAPTURES = (("ingest", "ingest"), ("hooks", "ingest"), ("hooks", "hooks"))


def bench_forks(quick: bool) -> None:
    from bench_harnesses import TextPool
    rows = []
    size = 2 * 1024 * 1024 if quick else 8 * 1024 * 1024
    for parent_by, fork_by in FORK_CAPTURES:
        for share in (0.80, 0.90, 0.95):
            rows.append(_fork_row(TextPool(7), size, share, parent_by, fork_by))
    h.table("Ingest of a Codex fork copying part of its parent (copied lines get new timestamps)",
            ["parent by", "fork by", "copied", "fork file", "store growth beside its parent",
             "growth / fork bytes", "fork stored alone", "beside / alone"], rows,
            ["Target: growth at most 0.15 of the fork's bytes. Tool outputs of 2,500 bytes of pseudo-random "
             "words (bench_harnesses.TextPool); `object_bytes` (stored objects) before and after the fork is "
             "stored: by `agentcas ingest codex FILE` of the whole file, or by the hook (`hooks.run_hook`, what "
             "`agentcas hook codex` runs, in one process) at the end of each turn, the parent's file growing "
             "turn by turn. The growth includes the fork's checkpoints (one a turn, its copied turns' too). "
             "beside / alone near 1 means the copied records were stored again (only compressed)."])


def _fork_row(pool, size: int, share: float, parent_by: str, fork_by: str) -> list:
    with h.work_dir("forks") as work:
        env = h.env_for(work)
        env["CODEX_HOME"] = os.path.join(work, "codex")
        workspace = os.path.join(work, "ws")
        os.makedirs(workspace)
        store = os.path.join(work, "store")
        h.run([h.AGENTCAS, "init", store], env=env)
        parent = CodexSession("0199a0b1-aaaa-7000-8000-000000000001", cwd=workspace)
        parent_ends = []
        n = 0
        while sum(map(len, parent.lines)) < size:
            n += 1
            turn = parent.start(prompt=f"step {n}: " + "make it faster " * 10)
            for k in range(3):
                parent.tool_call(command=f"pytest -q -k t{n}_{k}", output=pool.take(2500))
            parent.reply(pool.take(600))
            parent.complete(turn)
            parent_ends.append(sum(map(len, parent.lines)))
        child = CodexSession("0199a0b1-bbbb-7000-8000-000000000002", cwd=workspace,
                             forked_from="0199a0b1-aaaa-7000-8000-000000000001")
        copied = int(len(parent.lines) * share)
        child.copy_lines(parent, copied)
        child_ends = []
        while sum(map(len, child.lines)) < sum(map(len, parent.lines[:copied])) / share:
            turn = child.start(prompt="a new direction: " + pool.take(100))
            child.tool_call(command="pytest -q", output=pool.take(2500))
            child.reply(pool.take(600))
            child.complete(turn)
            child_ends.append(sum(map(len, child.lines)))
        sessions = os.path.join(env["CODEX_HOME"], "sessions", "2026", "11", "30")
        os.makedirs(sessions)
        paths = []
        for name, s in (("parent", parent), ("child", child)):
            whole = os.path.join(work, f"{name}.jsonl")
            with open(whole, "wb") as handle:
                handle.write(s.data())
            paths.append((whole, os.path.join(sessions, f"rollout-2026-11-30T10-00-00-{s.thread_id}.jsonl")))

        def capture(by: str, whole: str, path: str, ends: list) -> None:
            if by == "ingest":
                h.run([h.AGENTCAS, "--store", store, "ingest", "codex", whole], env=env)
            else:
                h.run([h.PYTHON, "-c", HOOK_SCRIPT, store, env["CODEX_HOME"], workspace, path, whole,
                       json.dumps(ends)], env=env)

        capture(parent_by, *paths[0], parent_ends)
        before = h.store_stats(store)["object_bytes"]
        capture(fork_by, *paths[1], child_ends)
        after = h.store_stats(store)["object_bytes"]
        fork_bytes = os.path.getsize(paths[1][0])
        alone = os.path.join(work, "alone")
        h.run([h.AGENTCAS, "init", alone], env=env)
        h.run([h.AGENTCAS, "--store", alone, "ingest", "codex", paths[1][0]], env=env)
        alone_bytes = h.store_stats(alone)["object_bytes"]
        return [parent_by, fork_by, f"{share:.0%}", h.fmt_bytes(fork_bytes), h.fmt_bytes(after - before),
                f"{(after - before) / fork_bytes:.2f}", h.fmt_bytes(alone_bytes),
                f"{(after - before) / alone_bytes:.2f}"]


def main(argv) -> int:
    quick = "--quick" in argv
    print(f"## Harness hooks, rewind, Codex forks{' — quick sizes' if quick else ''}\n\n{h.machine_note()}\n")
    parts = next((a.split("=", 1)[1].split(",") for a in argv if a.startswith("--parts=")), ["hooks", "forks"])
    if "hooks" in parts:
        bench_hook_vs_git([10_000, 2_000] if quick else [100_000, 10_000], 6 if quick else 20)
    if "forks" in parts:
        bench_forks(quick)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
