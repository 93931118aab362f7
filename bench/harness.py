"""What every benchmark needs: run a tool and time it, measure sizes, print tables.

Timings are wall-clock (time.perf_counter) around a subprocess, so they include the
tool's start-up, as a user at a shell would see it. Sizes are bytes on disk
(`du`-style: allocated blocks) unless a table says otherwise. Each table row puts
agentcas beside the other tools and gives the ratio other/agentcas or
agentcas/other, labelled, so that "> 1" always reads the same way within a column.
"""

from __future__ import annotations

import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.dirname(sys.executable)
AGENTCAS = os.path.join(BIN, "agentcas")
PYTHON = sys.executable

# The other tools read these; nothing here prompts or encrypts.
TOOL_ENV = {
    "RESTIC_PASSWORD": "bench",
    "RESTIC_CACHE_DIR": "",  # set per work dir by `work_dir`
    "BORG_UNKNOWN_UNENCRYPTED_REPO_ACCESS_IS_OK": "yes",
    "BORG_RELOCATED_REPO_ACCESS_IS_OK": "yes",
    "BORG_BASE_DIR": "",  # set per work dir
    "GIT_AUTHOR_NAME": "bench", "GIT_AUTHOR_EMAIL": "bench@example.com",
    "GIT_COMMITTER_NAME": "bench", "GIT_COMMITTER_EMAIL": "bench@example.com",
    "GIT_CONFIG_NOSYSTEM": "1", "HOME": "",  # set per work dir (no user git config)
    "AGENTCAS_AUTHOR": "bench",
}


# Child Python processes (the agentcas CLI, workers) write their bytecode caches to a
# private directory: a pip-installed agentcas has its .pyc files, so a benchmark should
# not pay for compiling sources on every run (PYTHONDONTWRITEBYTECODE=1 would do that),
# and nothing is written into the source tree.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
os.environ["PYTHONPYCACHEPREFIX"] = os.path.join(os.environ.get("BENCH_TMP", "/tmp"), "agentcas-bench-pycache")


class ToolFailed(RuntimeError):
    pass


def env_for(work: str) -> dict:
    env = dict(os.environ)
    env.update(TOOL_ENV)
    env["RESTIC_CACHE_DIR"] = os.path.join(work, ".cache-restic")
    env["BORG_BASE_DIR"] = os.path.join(work, ".borg-base")
    env["HOME"] = os.path.join(work, ".home")
    os.makedirs(env["HOME"], exist_ok=True)
    return env


@contextmanager
def work_dir(label: str):
    """A fresh directory under /tmp (or $BENCH_TMP), removed afterwards."""
    base = os.environ.get("BENCH_TMP", "/tmp")
    path = tempfile.mkdtemp(prefix=f"agentcas-bench-{label}-", dir=base)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def settle() -> None:
    """Flush dirty pages to disk (untimed), so no tool pays for the previous one's writes."""
    os.sync()


def warm(*paths: str) -> None:
    """Read every file under `paths` into the page cache (untimed).

    `borg create` drops each file it has read from the page cache (POSIX_FADV_DONTNEED),
    so without this whatever runs after borg reads its input from disk (measured here:
    a 1 GiB commit 1.8 s warm, 2.8 s after borg).
    """
    for path in paths:
        files = [path] if os.path.isfile(path) else (
            os.path.join(root, name) for root, _dirs, names in os.walk(path) for name in names)
        for name in files:
            with open(name, "rb", buffering=0) as handle:
                while handle.read(1 << 20):
                    pass


def run(cmd, env=None, cwd=None, stdout=subprocess.DEVNULL, shell=False, check=True, warm_paths=()) -> float:
    """Run a command; return its wall time in seconds. Raise ToolFailed on non-zero exit.

    Dirty pages are flushed first (`settle`) and `warm_paths` read into the page cache
    (`warm`), outside the timing.
    """
    settle()
    warm(*warm_paths)
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, cwd=cwd, stdout=stdout, stderr=subprocess.PIPE,
                          shell=shell)
    elapsed = time.perf_counter() - start
    if check and proc.returncode != 0:
        shown = cmd if isinstance(cmd, str) else " ".join(cmd)
        raise ToolFailed(f"{shown} exited {proc.returncode}: {proc.stderr.decode(errors='replace')[-400:]}")
    return elapsed


def init_repos(work: str, store_name: str, env: dict) -> tuple[str, str, str, str]:
    """Create an agentcas store and empty git, restic and borg repositories under `work`;
    return their paths (store, git dir, restic repo, borg repo)."""
    store, gitdir = os.path.join(work, store_name), os.path.join(work, "git")
    restic_repo, borg_repo = os.path.join(work, "restic"), os.path.join(work, "borg")
    run([AGENTCAS, "init", store], env=env)
    run(["git", "init", "-q", "--bare", gitdir], env=env)
    run(["git", f"--git-dir={gitdir}", "config", "core.bare", "false"], env=env)
    run(["restic", "init", "-q", "--repository-version", "2", "--repo", restic_repo], env=env)
    run(["borg", "init", "-e", "none", borg_repo], env=env)
    return store, gitdir, restic_repo, borg_repo


def output(cmd, env=None, cwd=None) -> str:
    proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True)
    if proc.returncode != 0:
        raise ToolFailed(f"{' '.join(cmd)} exited {proc.returncode}: {proc.stderr.decode(errors='replace')[-400:]}")
    return proc.stdout.decode()


def disk_bytes(path: str) -> int:
    """Allocated bytes of a file or tree (like `du -s --block-size=1`)."""
    if os.path.isfile(path):
        return os.stat(path).st_blocks * 512
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except FileNotFoundError:
                pass
    return total


def apparent_bytes(path: str) -> int:
    if os.path.isfile(path):
        return os.path.getsize(path)
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            total += os.lstat(os.path.join(root, name)).st_size
    return total


STORE_PROBE = r"""
import json, sys
from agentcas.cas.store import TABLES
from agentcas.repository import Store
s = Store.open(sys.argv[1])
count = size = payload = 0
with s.environment.reader() as txn:
    for table in TABLES:
        for key, value in txn.scan(table):
            payload += len(key) + len(value)
for info in s.source.blobs.list():  # the objects, in packs (format 3) or rows
    count += 1
    size += info.size
print(json.dumps({"used_bytes": s.environment.used_bytes(), "objects": count, "object_bytes": size,
                  "payload": payload}))
"""


def store_stats(path: str) -> dict:
    """used_bytes (LMDB pages in use), object count, the sum of stored object sizes, and
    `payload`: every key and value in every table (objects, refs, reflog, statcache, ...).

    Run in a subprocess so that this process never holds the store's LMDB environment
    while the CLI writes it.
    """
    import json
    return json.loads(output([PYTHON, "-c", STORE_PROBE, path]))


def median_time(fn, repeat: int) -> float:
    return statistics.median(fn() for _ in range(repeat))


def load_note() -> str:
    one, five, _ = os.getloadavg()
    return f"load {one:.2f}/{five:.2f} (1/5 min) on {os.cpu_count()} cores"


def machine_note() -> str:
    cpu = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = ""
    try:
        with open("/proc/meminfo") as handle:
            mem = f", {int(handle.readline().split()[1]) // (1024 * 1024)} GiB RAM"
    except (OSError, ValueError, IndexError):
        pass
    return f"{cpu}, {os.cpu_count()} cores{mem}, {platform.system()} {platform.release()}, Python {platform.python_version()}"


# --- formatting -----------------------------------------------------------------------------

def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} B"


def fmt_time(s: float | None) -> str:
    if s is None:
        return "-"
    if s < 1e-3:
        return f"{s * 1e6:.0f} µs"
    if s < 1:
        return f"{s * 1e3:.1f} ms"
    return f"{s:.2f} s"


def fmt_ratio(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.2f}×"


def ratio(a, b):
    if a is None or b is None or b == 0:
        return None
    return a / b


def table(title: str, header: list[str], rows: list[list], notes: list[str] = ()) -> str:
    """A Markdown table (pipes), so the output can be pasted into docs/BENCHMARKS.md."""
    cells = [[str(c) for c in header]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = [f"### {title}", ""]
    for n, row in enumerate(cells):
        lines.append("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |")
        if n == 0:
            lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for note in notes:
        lines.append("")
        lines.append(note)
    lines.append("")
    text = "\n".join(lines)
    print(text, flush=True)
    return text


def verdict(ok: bool | None) -> str:
    return "-" if ok is None else ("yes" if ok else "**NO**")


def progress(msg: str) -> None:
    """Progress lines go to stderr so stdout holds only the tables."""
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)
