"""A model test of the whole Python API: random sequences of commit, rollout append, fork,
revert, branch -d, gc at grace 0 and export/import against a plain in-memory model of what
each thread must hold (its files, its history records, its checkpoint chain).

The model is a dict of threads; each thread is (checkpoint, records); each checkpoint
remembers its files, its history (the records at its commit) and its first parent. After
every step the store must agree: the same threads, each thread's history read back byte
for byte, its head's file list with b3sum ids; fsck clean. At the end every thread is
checked out and compared file by file. Hypothesis shrinks a failure to the shortest
sequence of calls.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass

import blake3
import pytest
from hypothesis import HealthCheck, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from agentcas import Store
from agentcas.errors import ConflictError, NotFound, UsageError

NAMES = ("main", "a", "b", "c")
PATHS = ("x.txt", "d/y.txt", "d/e/z.bin", "w.md")
STEPS = int(os.environ.get("AGENTCAS_MODEL_STEPS", "30"))
EXAMPLES = int(os.environ.get("AGENTCAS_MODEL_EXAMPLES", "50"))


@dataclass(frozen=True)
class ModelCheckpoint:
    files: tuple            # sorted ((path, bytes), ...)
    history: tuple          # the records the checkpoint's history holds
    parent: str | None


@dataclass
class ModelThread:
    checkpoint: str | None
    history: tuple          # records (bytes, each one JSONL line)


file_sets = st.dictionaries(st.sampled_from(PATHS), st.binary(max_size=300) | st.sampled_from([b"same\n", b""]),
                            max_size=4)
record_lists = st.lists(st.builds(lambda n, text: json.dumps({"n": n, "t": text}).encode() + b"\n",
                                  st.integers(0, 10**6), st.text(max_size=40)), min_size=1, max_size=5)


class StoreModel(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        root = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
        self.dir = tempfile.mkdtemp(prefix="agentcas-model-", dir=root)
        self.store, _ = Store.init(os.path.join(self.dir, "store"))
        self.threads: dict[str, ModelThread] = {}
        self.checkpoints: dict[str, ModelCheckpoint] = {}
        self.moves: dict[str, set] = {}   # thread -> every checkpoint its reflog holds
        self.counter = 0

    def teardown(self):
        try:
            for name, thread in self.threads.items():
                if thread.checkpoint is None:
                    continue
                dest = os.path.join(self.dir, f"co-{self.fresh()}")
                self.store.checkpoints.checkout(thread.checkpoint, dest)
                got = {}
                for base, _, names in os.walk(dest):
                    for file_name in names:
                        full = os.path.join(base, file_name)
                        with open(full, "rb") as handle:
                            got[os.path.relpath(full, dest)] = handle.read()
                assert got == dict(self.checkpoints[thread.checkpoint].files), name
            assert self.store.gc.fsck().to_json()["ok"]
        finally:
            self.store.close()
            shutil.rmtree(self.dir, ignore_errors=True)

    def fresh(self) -> int:
        self.counter += 1
        return self.counter

    def alive(self) -> list[str]:
        """Checkpoints some thread's reflog still reaches (gc at grace 0 keeps exactly those)."""
        out, stack = set(), [c for name in self.threads for c in self.moves.get(name, ())]
        while stack:
            digest = stack.pop()
            if digest is not None and digest not in out:
                out.add(digest)
                stack.append(self.checkpoints[digest].parent)
        return [digest for digest in self.checkpoints if digest in out]  # in commit order: ids
        # carry a time, so sorting them would make the same draws pick different targets

    def moved(self, name: str, checkpoint: str | None) -> None:
        self.moves.setdefault(name, set()).add(checkpoint)

    # -- rules -------------------------------------------------------------------------------
    @rule(name=st.sampled_from(NAMES), files=file_sets)
    def commit(self, name, files):
        ws = os.path.join(self.dir, f"ws-{self.fresh()}")
        for path, data in files.items():
            os.makedirs(os.path.dirname(os.path.join(ws, path)), exist_ok=True)
            with open(os.path.join(ws, path), "wb") as out:
                out.write(data)
        os.makedirs(ws, exist_ok=True)
        result = self.store.checkpoints.commit(ws, f"commit {self.counter}", thread=name).to_json()
        shutil.rmtree(ws)
        thread = self.threads.get(name) or ModelThread(None, ())
        digest = result["checkpoint"]
        self.checkpoints[digest] = ModelCheckpoint(tuple(sorted(files.items())), thread.history, thread.checkpoint)
        self.threads[name] = ModelThread(digest, thread.history)
        self.moved(name, digest)

    @rule(name=st.sampled_from(NAMES), records=record_lists)
    def append(self, name, records):
        self.store.history.append(name, b"".join(records))
        thread = self.threads.get(name) or ModelThread(None, ())
        self.threads[name] = ModelThread(thread.checkpoint, thread.history + tuple(records))
        self.moved(name, thread.checkpoint)

    @precondition(lambda self: self.threads)
    @rule(data=st.data(), name=st.sampled_from(NAMES))
    def fork(self, data, name):
        source = data.draw(st.sampled_from(sorted(self.threads)))
        thread = self.threads[source]
        at = data.draw(st.integers(0, len(thread.history) + 1))
        if at > len(thread.history):
            with pytest.raises(UsageError):
                self.store.threads.fork(source, name, at=at)
            return
        if name in self.threads:
            with pytest.raises(ConflictError):
                self.store.threads.fork(source, name, at=at)
            return
        result = self.store.threads.fork(source, name, at=at).to_json()
        checkpoint = thread.checkpoint  # the newest on the chain whose history fits in `at`
        while checkpoint is not None and len(self.checkpoints[checkpoint].history) > at:
            checkpoint = self.checkpoints[checkpoint].parent
        assert result["checkpoint"] == checkpoint and result["seq"] == at
        self.threads[name] = ModelThread(checkpoint, thread.history[:at])
        self.moved(name, checkpoint)

    @precondition(lambda self: self.threads and self.alive())
    @rule(data=st.data())
    def revert(self, data):
        name = data.draw(st.sampled_from(sorted(self.threads)))
        target = data.draw(st.sampled_from(self.alive()))
        self.store.threads.revert(name, target)
        self.threads[name] = ModelThread(target, self.checkpoints[target].history)
        self.moved(name, target)

    @precondition(lambda self: self.threads)
    @rule(data=st.data())
    def delete(self, data):
        name = data.draw(st.sampled_from(sorted(self.threads)))
        self.store.threads.delete(name)
        del self.threads[name]
        self.moves.pop(name, None)
        with pytest.raises(NotFound):
            self.store.threads.get(name)

    @rule()
    def gc(self):
        self.store.gc.run(grace=0)
        for digest in self.alive():  # everything a reflog reaches is still whole
            self.store.checkpoints.files(digest)

    @precondition(lambda self: any(t.checkpoint for t in self.threads.values()))
    @rule(data=st.data())
    def export_import(self, data):
        name = data.draw(st.sampled_from(sorted(n for n, t in self.threads.items() if t.checkpoint)))
        bundle = os.path.join(self.dir, f"b-{self.fresh()}.bundle")
        self.store.remotes.export_bundle(name, bundle)
        new = f"imported-{self.counter}"
        result = self.store.remotes.import_bundle(bundle, as_thread=new, allow_unsigned=True).to_json()
        os.unlink(bundle)
        checkpoint = self.threads[name].checkpoint
        assert result["imported_as"] == new and result["moved"]
        self.threads[new] = ModelThread(checkpoint, self.checkpoints[checkpoint].history)
        self.moved(new, checkpoint)

    # -- what must hold after every step ------------------------------------------------------
    @invariant()
    def store_agrees_with_the_model(self):
        rows = {row["thread"]: row for row in [item.to_json() for item in self.store.threads.list()]}
        assert sorted(rows) == sorted(self.threads)
        for name, thread in self.threads.items():
            assert rows[name]["checkpoint"] == thread.checkpoint, name
            assert rows[name]["history"]["seq"] == len(thread.history), name
            assert b"".join(self.store.history.read(name)) == b"".join(thread.history), name
            if thread.checkpoint is not None:
                want = {path: blake3.blake3(data).hexdigest()
                        for path, data in self.checkpoints[thread.checkpoint].files}
                got = {f["path"]: f["id"] for f in [item.to_json() for item in self.store.checkpoints.files(thread.checkpoint)]}
                assert got == want, name

    @invariant()
    def fsck_is_clean(self):
        doc = self.store.gc.fsck().to_json()
        assert doc["ok"], doc["problems"][:3]


StoreModel.TestCase.settings = settings(max_examples=EXAMPLES, stateful_step_count=STEPS, deadline=None,
                                        suppress_health_check=[HealthCheck.too_slow])


def test_the_api_against_the_model(record_property):
    StoreModel.TestCase("runTest").runTest()
    record_property("model_steps", EXAMPLES * STEPS)  # an upper bound: Hypothesis may stop a run early
