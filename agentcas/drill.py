"""The recovery drill: prove that a checkpoint restores after its original is gone.

`run_drill` plays the whole story in a temporary directory with a synthetic agent that
computes the sum of squares 1..5 one step at a time. Its state lives in a workspace
(task.json, memory/state.json with the partial sum and the next i) and its rollout in a
JSONL file (a turn record per run, a step record per step). After two steps it commits
a checkpoint with its rollout, exports a bundle signed by a temporary key, checks that
a tampered copy is refused, and deletes the original workspace, rollout and store. A
fresh store trusts the key, imports, verifies, checks out a new workspace and rebuilds
the rollout from the imported history; the agent resumes and must perform exactly
steps 3..5 (not 1..5: it continues from its saved state) and finish with 55.

`run_checkpoint_drill` does the same round trip on a user's own checkpoint: export to
a temporary bundle, import into a temporary store, check out, and compare every file
(bytes and mode) and the rollout byte for byte with the original. It only reads the
user's store. Every stage is reported with its duration; any failure raises DrillFailed.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
import time
from dataclasses import dataclass, field

from agentcas.errors import AgentcasError, IntegrityError
from agentcas.repository import Store
from agentcas.signing import keys
from agentcas.workspace.restore import remove_tree

N = 5
EXPECTED = sum(i * i for i in range(1, N + 1))  # 55
STEPS_BEFORE_CHECKPOINT = 2


class DrillFailed(IntegrityError):
    """A drill stage did not hold."""


@dataclass
class DrillReport:
    stages: list = field(default_factory=list)
    ok: bool = False
    result: int | None = None

    def to_json(self):
        return {"ok": self.ok, "result": self.result, "stages": self.stages}


class _Stages:
    """Runs named stages, timing each and handing its line to `echo` as it finishes."""

    def __init__(self, report: DrillReport, echo):
        self.report, self.echo = report, echo

    def run(self, name: str, fn):
        started = time.perf_counter()
        try:
            detail = fn()
        except (AgentcasError, OSError, ValueError, KeyError) as exc:
            # A missing or unreadable file after restore is a failed drill, not a crash.
            seconds = time.perf_counter() - started
            self.report.stages.append({"stage": name, "seconds": round(seconds, 4), "ok": False,
                                       "detail": str(exc)})
            self.echo(f"[{seconds:8.3f}s] FAIL {name}: {exc}")
            if isinstance(exc, DrillFailed):
                raise
            raise DrillFailed(f"drill stage '{name}' failed: {exc}") from None
        seconds = time.perf_counter() - started
        self.report.stages.append({"stage": name, "seconds": round(seconds, 4), "ok": True,
                                   "detail": detail})
        self.echo(f"[{seconds:8.3f}s] ok   {name}: {detail}")
        return detail


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise DrillFailed(message)


class SumOfSquaresAgent:
    """A deterministic stand-in for an agent: all its state is in its workspace and rollout."""

    def __init__(self, workspace: str, rollout_path: str):
        self.workspace = workspace
        self.rollout_path = rollout_path
        self.state_path = os.path.join(workspace, "memory", "state.json")

    @staticmethod
    def create(workspace: str, n: int = N) -> None:
        os.makedirs(os.path.join(workspace, "memory"))
        with open(os.path.join(workspace, "task.json"), "w") as out:
            json.dump({"task": f"sum of the squares of 1..{n}", "n": n}, out)
        with open(os.path.join(workspace, "instructions.md"), "w") as out:
            out.write("Add one square per step. Keep the partial sum and the next i in memory/state.json.\n")
        with open(os.path.join(workspace, "memory", "state.json"), "w") as out:
            json.dump({"next_i": 1, "partial_sum": 0}, out)

    def state(self) -> dict:
        with open(self.state_path) as handle:
            return json.load(handle)

    def _record(self, record: dict) -> None:
        with open(self.rollout_path, "a") as out:
            out.write(json.dumps(record, sort_keys=True) + "\n")

    def run(self, max_steps: int | None = None) -> list[int]:
        """Continue from the saved state; return the i of every step performed."""
        with open(os.path.join(self.workspace, "task.json")) as handle:
            n = json.load(handle)["n"]
        state = self.state()
        self._record({"type": "turn", "event": "start", "next_i": state["next_i"],
                      "partial_sum": state["partial_sum"]})
        done: list = []
        while state["next_i"] <= n and (max_steps is None or len(done) < max_steps):
            i = state["next_i"]
            state = {"next_i": i + 1, "partial_sum": state["partial_sum"] + i * i}
            with open(self.state_path, "w") as out:
                json.dump(state, out)
            self._record({"type": "step", "i": i, "square": i * i, "partial_sum": state["partial_sum"]})
            done.append(i)
        if state["next_i"] > n:
            with open(os.path.join(self.workspace, "result.txt"), "w") as out:
                out.write(f"{state['partial_sum']}\n")
            self._record({"type": "result", "value": state["partial_sum"]})
        return done


def _rollout_records(path: str) -> list[dict]:
    with open(path) as handle:
        return [json.loads(line) for line in handle]


def run_drill(echo=print, keep: bool = False) -> DrillReport:
    """The end-to-end recovery drill in a temporary directory; raises DrillFailed."""
    report = DrillReport()
    stages = _Stages(report, echo)
    root = tempfile.mkdtemp(prefix="agentcas-drill-")
    original = os.path.join(root, "original")
    ws, rollout_file, store_dir = (os.path.join(original, "workspace"), os.path.join(original, "rollout.jsonl"),
                                   os.path.join(original, "store"))
    bundle = os.path.join(root, "transfer", "checkpoint.bundle")
    key_dir = os.path.join(root, "keys")
    recovered = os.path.join(root, "recovered")
    memo: dict = {}
    echo(f"agentcas drill in {root}")
    try:
        def work():
            SumOfSquaresAgent.create(ws)
            steps = SumOfSquaresAgent(ws, rollout_file).run(max_steps=STEPS_BEFORE_CHECKPOINT)
            _require(steps == [1, 2], f"the agent performed steps {steps}, expected [1, 2]")
            state = SumOfSquaresAgent(ws, rollout_file).state()
            return f"steps {steps}, partial sum {state['partial_sum']}, next i {state['next_i']}"

        stages.run("agent works", work)

        def commit():
            store, _ = Store.init(store_dir)
            result = store.checkpoints.commit(ws, f"drill: after step {STEPS_BEFORE_CHECKPOINT}", "main",
                                              rollout_file)
            memo["checkpoint"] = result.checkpoint
            with open(rollout_file, "rb") as handle:
                memo["rollout"] = handle.read()
            memo["state"] = SumOfSquaresAgent(ws, rollout_file).state()
            store.close()
            return (f"checkpoint {result.checkpoint[:12]}: {result.files} files, "
                    f"{result.appended_records} rollout records")

        stages.run("checkpoint", commit)

        def export():
            made = keys.write_keypair("drill", key_dir)
            memo["key_id"] = made.key_id
            store = Store.open(store_dir)
            os.makedirs(os.path.dirname(bundle))
            result = store.remotes.export_bundle("main", bundle, made.private_key)
            store.close()
            return f"{result.bytes} bytes, {result.objects} objects, signed by key {made.key_id}"

        stages.run("export signed bundle", export)

        def tamper():
            with open(bundle, "rb") as handle:
                data = bytearray(handle.read())
            data[len(data) // 2] ^= 0x01
            bad = os.path.join(root, "transfer", "tampered.bundle")
            with open(bad, "wb") as out:
                out.write(data)
            scratch = Store.memory()
            scratch.trust.add("drill", os.path.join(key_dir, "drill.pub"))
            try:
                scratch.remotes.import_bundle(bad)
            except IntegrityError as exc:
                with scratch.meta.reader() as txn:
                    _require(scratch.blobs.count() == 0 and txn.count("refs") == 0,
                             "a refused bundle left objects or refs behind")
                return f"a copy with one flipped byte is refused ({str(exc)[:60]}...)"
            raise DrillFailed("a tampered bundle was accepted")

        stages.run("tampered copy refused", tamper)

        def delete():
            shutil.rmtree(original)
            _require(not os.path.exists(original), "the original could not be deleted")
            return "original workspace, rollout and store deleted"

        stages.run("delete original", delete)

        def restore():
            store, _ = Store.init(os.path.join(recovered, "store"))
            store.trust.add("drill", os.path.join(key_dir, "drill.pub"))
            result = store.remotes.import_bundle(bundle)
            _require(result.checkpoint == memo["checkpoint"], "imported a different checkpoint")
            verified = store.trust.verify("main")
            store.checkpoints.checkout("main", os.path.join(recovered, "workspace"))
            rebuilt = b"".join(store.history.read("main"))
            _require(rebuilt == memo["rollout"], "the restored rollout differs from the original")
            with open(os.path.join(recovered, "rollout.jsonl"), "wb") as out:
                out.write(rebuilt)
            state = SumOfSquaresAgent(os.path.join(recovered, "workspace"), "").state()
            _require(state == memo["state"], f"restored state {state} differs from saved {memo['state']}")
            store.close()
            return (f"trusted key {memo['key_id']}, imported and verified ({verified.reason}); "
                    f"state next i {state['next_i']}, partial sum {state['partial_sum']}; "
                    f"{len(rebuilt)} rollout bytes identical")

        stages.run("fresh store: trust, import, verify, checkout", restore)

        def resume():
            agent = SumOfSquaresAgent(os.path.join(recovered, "workspace"), os.path.join(recovered, "rollout.jsonl"))
            steps = agent.run()
            _require(steps == list(range(STEPS_BEFORE_CHECKPOINT + 1, N + 1)),
                     f"the resumed agent performed steps {steps}; it should continue with "
                     f"{list(range(STEPS_BEFORE_CHECKPOINT + 1, N + 1))}, not start from scratch")
            result = agent.state()["partial_sum"]
            _require(result == EXPECTED, f"the agent finished with {result}, expected {EXPECTED}")
            records = _rollout_records(agent.rollout_path)
            step_is = [r["i"] for r in records if r["type"] == "step"]
            turns = [r["next_i"] for r in records if r["type"] == "turn"]
            _require(step_is == list(range(1, N + 1)), f"rollout steps {step_is}, expected 1..{N} once each")
            _require(turns == [1, STEPS_BEFORE_CHECKPOINT + 1], f"rollout turns start at {turns}")
            report.result = result
            return (f"resumed at i={turns[-1]}, performed steps {steps}; rollout shows steps {step_is} "
                    f"in turns starting at i={turns}; result {result}")

        stages.run("agent resumes", resume)

        def commit_finished():
            store = Store.open(os.path.join(recovered, "store"))
            result = store.checkpoints.commit(os.path.join(recovered, "workspace"), "drill: finished", "main",
                                              os.path.join(recovered, "rollout.jsonl"))
            log = store.threads.log("main")
            store.close()
            _require(log[1].checkpoint == memo["checkpoint"],
                     "the finished checkpoint does not follow the imported one")
            return (f"checkpoint {result.checkpoint[:12]} follows {memo['checkpoint'][:12]}, "
                    f"+{result.appended_records} rollout records")

        stages.run("commit finished work", commit_finished)
        report.ok = True
        echo(f"drill passed: sum of squares 1..{N} = {report.result} after recovery from a signed bundle")
        return report
    finally:
        if not keep:
            remove_tree(root)


def run_checkpoint_drill(store: Store, rev: str, echo=print, keep: bool = False) -> DrillReport:
    """Export `rev` from `store`, import it elsewhere, check out, compare byte for byte."""
    from agentcas.lineage import rollout
    from agentcas.lineage.tail import rollout_file_pieces
    from agentcas.workspace.restore import list_files, read_file, walk_directory

    digest, cp = store.checkpoints.get(rev)  # an unknown revision is the user's error, not a failed drill
    report = DrillReport()
    stages = _Stages(report, echo)
    root = tempfile.mkdtemp(prefix="agentcas-drill-")
    bundle = os.path.join(root, "checkpoint.bundle")
    memo: dict = {"digest": digest, "cp": cp}
    echo(f"agentcas drill of {rev} in {root}")
    try:
        def export():
            made = keys.write_keypair("drill", os.path.join(root, "keys"))
            memo["pub"] = made.public_key
            # The bundle stays in this temporary directory: files the user allowed past the
            # secret scan at commit time are exported as they are.
            result = store.remotes.export_bundle(digest.hex(), bundle, made.private_key, allow_secrets=("*",))
            memo["thread"] = result.thread
            return f"{digest.hex()[:12]}: {result.bytes} bytes, {result.objects} objects"

        stages.run("export signed bundle", export)

        def restore():
            scratch, _ = Store.init(os.path.join(root, "store"))
            scratch.trust.add("drill", memo["pub"])
            scratch.remotes.import_bundle(bundle)
            scratch.trust.verify(memo["digest"].hex())
            scratch.checkpoints.checkout(memo["digest"].hex(), os.path.join(root, "workspace"))
            memo["scratch"] = scratch
            return "imported into a temporary store, verified, checked out"

        stages.run("import, verify, checkout", restore)

        def compare():
            dest = os.path.join(root, "workspace")
            cp = memo["cp"]
            count = size = 0
            expected_paths = set()
            # Paths relative to DEST's descriptor: a tree as deep as PATH_MAX allows is
            # compared wherever the temporary directory is.
            dest_fd = os.open(dest, os.O_RDONLY | os.O_DIRECTORY)
            try:
                with store.source.reading() as txn:
                    for path, entry in list_files(txn, cp.tree):
                        target = path.rstrip("/")
                        expected_paths.add(target)
                        if entry.type == "dir":
                            _require(stat.S_ISDIR(os.stat(target, dir_fd=dest_fd, follow_symlinks=False).st_mode),
                                     f"directory {path} missing after restore")
                            continue
                        fd = os.open(target, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dest_fd)
                        with os.fdopen(fd, "rb") as handle:
                            restored = handle.read()
                            mode = os.fstat(handle.fileno()).st_mode & 0o777
                        _require(restored == read_file(txn, entry, path), f"file {path} differs after restore")
                        _require(mode == entry.mode, f"file {path} has another mode")
                        count += 1
                        size += entry.size
                    original_history = b"".join(rollout.History(txn).read(cp.history))
                    in_file = cp.rollout_file
                    if in_file is not None and in_file.path is not None:  # written back by checkout
                        parts = in_file.path.split("/")
                        expected_paths.update("/".join(parts[:n]) for n in range(1, len(parts) + 1))
                        with open(in_file.path, "rb", opener=lambda p, f: os.open(p, f, dir_fd=dest_fd)) as handle:
                            _require(handle.read() == b"".join(rollout_file_pieces(txn, cp.history, in_file)),
                                     f"rollout file {in_file.path} differs after restore")
                        count += 1
            finally:
                os.close(dest_fd)
            found = {path for path, _ in walk_directory(dest)}
            _require(found == expected_paths,
                     f"restore has extra or missing paths: {sorted(found ^ expected_paths)[:3]}")
            scratch = memo["scratch"]
            with scratch.source.reading() as txn:
                restored_history = b"".join(rollout.History(txn).read(cp.history))
            _require(restored_history == original_history, "the rollout differs after the round trip")
            scratch.close()
            return (f"{count} files, {size} bytes and {cp.history.seq} rollout records "
                    f"({len(original_history)} bytes) identical")

        stages.run("byte-for-byte comparison", compare)
        report.ok = True
        echo(f"drill passed: {rev} survives export, import and checkout unchanged")
        return report
    finally:
        if not keep:
            remove_tree(root)
