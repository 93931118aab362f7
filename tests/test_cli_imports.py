"""Each command imports only what it uses: guards the lazy imports of the CLI.

Every case runs the command in a fresh interpreter (`agentcas.cli.main`, as the `agentcas`
script calls it) and then lists the modules it loaded. Nothing here measures time.
"""

import importlib.metadata
import json
import subprocess
import sys
import time

import pytest

import agentcas

# Never needed by everyday commands: signing and bundles, gc, the progress bar (stderr is
# not a terminal here), ignore files (the workspace has none), networking.
HEAVY = ["cryptography", "rich", "agentcas.signing", "agentcas.exchange", "agentcas.gc",
         "agentcas.drill", "pathspec", "socket", "urllib"]

SCRIPT = """
import json, sys
from agentcas.cli import main
code = main(sys.argv[1:])
print(json.dumps([code, sorted(sys.modules)]), file=sys.stderr)
"""


def modules_after(*args) -> set:
    proc = subprocess.run([sys.executable, "-c", SCRIPT, *map(str, args)], capture_output=True,
                          text=True, timeout=120)
    code, modules = json.loads(proc.stderr.strip().splitlines()[-1])
    assert code == 0, proc
    return set(modules)


def loaded(modules: set, names) -> list:
    return [name for name in names if any(m == name or m.startswith(name + ".") for m in modules)]


# Storage and crypto: what --help, --version and usage errors must never load.
STORAGE = ["agentcas.repository", "agentcas.cas", "agentcas.refs", "agentcas.lineage",
           "agentcas.workspace", "lmdb", "zstandard", "blake3", "pyfastcdc", "ahocorasick_rs",
           "cryptography", "concurrent.futures"]


def test_help_and_version_load_no_store():
    for args in (["--help"], ["--version"], ["rollout", "--help"], ["commit", "--help"]):
        modules = modules_after(*args)
        assert loaded(modules, HEAVY + STORAGE) == [], args


def test_rollout_cat_loads_neither_snapshot_nor_chunker(store_dir, workspace, run):
    assert run("commit", workspace, "-m", "one", store=store_dir).code == 0
    modules = modules_after("--store", store_dir, "rollout", "cat", "main")
    assert loaded(modules, HEAVY + ["agentcas.workspace", "pyfastcdc", "ahocorasick_rs", "getpass"]) == []


@pytest.mark.parametrize("command", [["log"], ["show", "main"], ["show", "main", "--files"],
                                     ["reflog", "main"], ["lineage"], ["diff", "main", "main"], ["effects", "main"]])
def test_reading_commands_load_neither_snapshot_nor_signing(store_dir, workspace, run, command):
    assert run("commit", workspace, "-m", "one", store=store_dir).code == 0
    modules = modules_after("--store", store_dir, *command)
    assert loaded(modules, HEAVY + ["agentcas.workspace.snapshot", "pyfastcdc"]) == []


def test_commit_and_checkout_load_no_signing_gc_or_progress_bar(store_dir, workspace, tmp_path):
    modules = modules_after("--store", store_dir, "commit", workspace, "-m", "one")
    # urllib comes with chunking: pyfastcdc imports pathlib, which imports urllib.parse.
    assert loaded(modules, [m for m in HEAVY if m != "urllib"] + ["agentcas.workspace.restore"]) == []
    modules = modules_after("--store", store_dir, "checkout", "main", tmp_path / "out")
    assert loaded(modules, HEAVY + ["agentcas.workspace.snapshot"]) == []


def test_version_is_the_installed_one():
    # --version prints agentcas.__version__ (reading package metadata would cost ~30 ms).
    assert agentcas.__version__ == importlib.metadata.version("agentcas")


COMPILED_RULES = """
import json, sys
from agentcas.cli import main
code = main(sys.argv[1:])
from agentcas.workspace import secrets
print(json.dumps([code, [rule.name for rule in secrets.RULES if rule.compiled()]]), file=sys.stderr)
"""


def test_unchanged_recommit_loads_no_chunker_pool_or_secret_rules(store_dir, workspace, run):
    time.sleep(2.1)  # past the stat cache's racy window (mtime and ctime), so every file is cached
    assert run("commit", workspace, "-m", "one", store=store_dir).code == 0
    modules = modules_after("--store", store_dir, "commit", workspace, "-m", "again")
    # (agentcas.cas.chunking itself is loaded: a blob store names its chunk sizes there.)
    assert loaded(modules, ["pyfastcdc", "concurrent.futures"]) == []
    # The reason is scanned (one Aho-Corasick pass over the anchors), but no rule's
    # regex is compiled: nothing that was scanned held an anchor.
    proc = subprocess.run([sys.executable, "-c", COMPILED_RULES, "--store", str(store_dir), "commit",
                           str(workspace), "-m", "again"], capture_output=True, text=True, timeout=120)
    code, compiled = json.loads(proc.stderr.strip().splitlines()[-1])
    assert code == 0 and compiled == [], proc
