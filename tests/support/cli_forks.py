"""A fork server for many short CLI runs: one Python imports agentcas once, then forks.

Starting `agentcas` costs ~150 ms of interpreter and imports; the crash-point walk runs
thousands of commands, so `CliForks` starts this file once as a subprocess, which
imports every agentcas module and then, per request (one JSON line on stdin), forks a
child that sets the environment, redirects fd 1 and 2 to files and runs the real click
entry point (`agentcas.cli.main(argv)`) or a named function of a test module. The child
is a fresh process for LMDB (the server never opens a store), and a SIGKILL reaches
only it: its exit code is reported as -9, like subprocess does.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]  # on the server's path: `support.cli_forks:observe`, test modules
PRELOAD = ("agentcas.cli", "agentcas.repository", "agentcas.workspace.snapshot",
           "agentcas.workspace.restore", "agentcas.exchange.bundle", "agentcas.exchange.transfer",
           "agentcas.exchange.remote", "agentcas.gc.plan", "agentcas.gc.sweep", "agentcas.gc.fsck",
           "agentcas.gc.report", "agentcas.signing.keys", "agentcas.signing.envelope")


class CliResult:
    def __init__(self, code: int, out: str, err: str, value=None):
        self.code, self.out, self.err, self.value = code, out, err, value

    def json(self):
        return json.loads(self.out)

    def __repr__(self):
        return f"CliResult(code={self.code}, out={self.out[-400:]!r}, err={self.err[-600:]!r})"


class CliForks:
    """The client side: `run(argv, env)` and `call("module:function", args, env)`."""

    def __init__(self, env: dict | None = None):
        full = dict(os.environ, **(env or {}))
        full.pop("AGENTCAS_DEBUG", None)
        full["PYTHONPATH"] = os.pathsep.join([str(TESTS), full.get("PYTHONPATH", "")])
        self._dir = tempfile.mkdtemp(prefix="cli-forks-")
        self.proc = subprocess.Popen([sys.executable, "-u", str(Path(__file__))], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=full)
        self.runs = 0

    def _request(self, doc: dict) -> CliResult:
        self.proc.stdin.write(json.dumps(doc) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the fork server died")
        reply = json.loads(line)
        self.runs += 1
        return CliResult(reply["code"], reply["out"], reply["err"], reply.get("value"))

    def run(self, *argv, env: dict | None = None, cwd: str | None = None, stdin: str | None = None) -> CliResult:
        """`agentcas ARGV...` in a forked child; stdin from the file `stdin` if given."""
        return self._request({"argv": [str(a) for a in argv], "env": env or {}, "cwd": cwd,
                              "stdin": stdin, "dir": self._dir})

    def call(self, target: str, *args, env: dict | None = None) -> CliResult:
        """`module:function(*args)` in a forked child; its JSON-able return value as .value."""
        return self._request({"call": target, "args": list(args), "env": env or {}, "dir": self._dir})

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)
        for name in os.listdir(self._dir):
            os.unlink(os.path.join(self._dir, name))
        os.rmdir(self._dir)


# --- the server side ---------------------------------------------------------------------

def _child(doc: dict, out_path: str, err_path: str, value_path: str) -> None:
    """Runs in the forked child; never returns."""
    code = 1
    try:
        os.environ.update(doc["env"])
        if doc.get("cwd"):
            os.chdir(doc["cwd"])
        for fd, path in ((1, out_path), (2, err_path)):
            handle = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(handle, fd)
            os.close(handle)
        stdin = os.open(doc["stdin"] if doc.get("stdin") else os.devnull, os.O_RDONLY)
        os.dup2(stdin, 0)
        os.close(stdin)
        sys.stdin = open(0, closefd=False)
        sys.stdout = open(1, "w", closefd=False)
        sys.stderr = open(2, "w", closefd=False)
        if "argv" in doc:
            from agentcas import cli
            code = cli.main(doc["argv"])
        else:
            module, _, name = doc["call"].partition(":")
            value = getattr(importlib.import_module(module), name)(*doc["args"])
            with open(value_path, "w") as handle:
                json.dump(value, handle)
            code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - reported on the child's stderr
        import traceback
        traceback.print_exc()
        code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except Exception:  # noqa: BLE001
            pass
        os._exit(code)


def serve() -> None:
    for name in PRELOAD:
        importlib.import_module(name)
    for line in sys.stdin:
        doc = json.loads(line)
        base = os.path.join(doc["dir"], str(os.getpid()))
        paths = (base + ".out", base + ".err", base + ".value")
        if os.path.exists(paths[2]):
            os.unlink(paths[2])
        pid = os.fork()
        if pid == 0:
            _child(doc, *paths)
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        reply = {"code": code}
        for key, path in zip(("out", "err"), paths[:2]):
            with open(path, encoding="utf-8", errors="replace") as handle:
                reply[key] = handle.read()
        if os.path.exists(paths[2]):
            with open(paths[2]) as handle:
                reply["value"] = json.load(handle)
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


# --- what a child reports about a store (CliForks.call("support.cli_forks:observe", path)) ----------

def observe(store_path: str, refs: str | None = None) -> dict:
    """fsck's verdict and every thread's state (ids, tree, reason, history) of one store
    (a shared store: its objects' URL and `refs`, the PostgreSQL URL)."""
    from agentcas import Store
    from agentcas.errors import AgentcasError
    store = Store.open(store_path, refs)
    doc = store.gc.fsck().to_json()
    threads = {}
    for row in [item.to_json() for item in store.threads.list()]:
        state = {"checkpoint": row["checkpoint"], "history": row["history"],
                 "forked_from": row["forked_from"]}
        if row["checkpoint"]:
            try:
                shown = store.checkpoints.show(row["checkpoint"]).to_json()
                state.update(tree=shown["tree"], reason=shown["reason"], parents=shown["parents"])
            except AgentcasError as exc:  # a ref to a missing checkpoint: the walk reports it
                state["unreadable"] = str(exc)
        threads[row["thread"]] = state
    return {"ok": doc["ok"], "problems": doc["problems"][:3], "objects": doc["objects"],
            "threads": threads}


def observe_all(backends: list, dest: str | None = None, bundle: str | None = None) -> dict:
    """`observe` of each store, plus the files a command writes: DEST's {path: [sha, mode]}
    (or None if absent) and a bundle's full check (or None if absent)."""
    doc = {"stores": {path: observe(path) for path in backends}}
    if dest is not None:
        doc["dest"] = None
        if os.path.lexists(dest):
            import hashlib
            doc["dest"] = {}
            for root, _, names in os.walk(dest):
                for name in names:
                    full = os.path.join(root, name)
                    with open(full, "rb") as handle:
                        digest = hashlib.sha256(handle.read()).hexdigest()
                    doc["dest"][os.path.relpath(full, dest)] = [digest, os.stat(full).st_mode & 0o777]
    if bundle is not None:
        doc["bundle"] = check_bundle_file(bundle) if os.path.lexists(bundle) else None
    return doc


def thread_states(observed: dict) -> dict:
    """Each store's thread states without checkpoint ids (a re-made checkpoint has a new
    time, so a new id; its tree, reason, parents and history say what it is)."""
    return {path: {name: {k: v for k, v in state.items() if k != "checkpoint"}
                   for name, state in doc["threads"].items()}
            for path, doc in observed["stores"].items()}


def observe_retry_observe(backends: list, argv: list, dest=None, bundle=None, skip_retry_if=None) -> dict:
    """After a crash: observe; run the command again (unless the stores already hold
    `skip_retry_if`, for a command that must not be repeated once it landed); observe."""
    from agentcas import cli
    after = observe_all(backends, dest, bundle)
    retry = None
    if skip_retry_if is None or thread_states(after) != skip_retry_if:
        code = cli.main(argv)
        sys.stdout.flush()
        retry = {"code": code}
    return {"after": after, "retry": retry, "final": observe_all(backends, dest, bundle)}


def check_bundle_file(path: str) -> dict:
    """A bundle's full check (layout, hashes, closure; signatures not required)."""
    from agentcas import Store
    from agentcas.exchange import bundle
    with bundle.open_bundle(path) as handle:
        checked = bundle.check_bundle(Store.memory().backends, handle)
    return {"checkpoint": checked.manifest.checkpoint.hex(), "objects": checked.manifest.object_count}


if __name__ == "__main__":
    serve()
