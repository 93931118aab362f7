"""Ingest in worker processes (agentcas/harnesses/packing_workers.py, new_lines.py).

A large ingest reads, classifies and packs files in worker processes while the parent
alone writes; the result must be exactly the in-process one (rollouts, checkpoints and
their reasons, damaged lines, reports), a worker that dies must cost nothing but speed,
and SIGKILL of the parent must leave whole lines, no worker behind, and a store a rerun
finishes.
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import time

import pytest

from agentcas import Store
from agentcas.harnesses import ingest, packing_workers
from agentcas.harnesses.ingest import Ingest

from support.cli import AGENTCAS
from support.harness_samples import ClaudeSession, CodexSession


def codex_files(root, count: int, turns: int, filler: int = 200, damaged: bool = True) -> list:
    paths = []
    for i in range(count):
        s = CodexSession(f"0199a0b1-{i:04x}-7000-8000-{i:012x}")
        for n in range(turns):
            s.turn(f"ask {i}/{n} " + "x" * filler, "y" * filler, tools=2)
            if damaged and n == 2:
                s.raw(b'{"type":"event_msg","payload":{"type":"task_comp')   # a cut line glued to the next
        directory = root / "sessions" / "2026" / "11" / f"{1 + i % 3:02d}"
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"rollout-2026-11-30T10-00-00-{s.thread_id}.jsonl"
        path.write_bytes(s.data())
        paths.append(path)
    return paths


def everything(store: Store, reports) -> dict:
    """What a run produced, for comparing two runs: reports, rollouts, checkpoints."""
    out = {}
    for report in reports:
        doc = report.to_json()
        doc.pop("checkpoints")
        thread = report.thread
        log = store.threads.log(thread) if thread else []
        out[report.path] = (doc, b"".join(store.history.read(thread)) if thread else None,
                            [(c.reason, c.history.seq, c.history.digest) for c in log])
    return out


def run_both(tmp_path, monkeypatch, paths_of):
    """The reports and results of the same ingest in-process and in workers."""
    results = []
    for label, threshold in (("inline", 1 << 62), ("workers", 0)):
        monkeypatch.setattr(ingest, "WORKER_BYTES", threshold)
        Store.init(str(tmp_path / f"store-{label}"))
        store = Store.open(str(tmp_path / f"store-{label}"))
        reports = Ingest(store, *paths_of()).run()
        results.append((store, reports))
    return results


def test_workers_ingest_exactly_what_the_parent_would(tmp_path, monkeypatch):
    codex_files(tmp_path, 5, 6)
    started = []
    real = packing_workers.PackingWorkers.__init__

    def counting(self, count):
        started.append(count)
        real(self, count)
    monkeypatch.setattr(packing_workers.PackingWorkers, "__init__", counting)
    (inline, a), (workers, b) = run_both(tmp_path, monkeypatch, lambda: ("codex", [str(tmp_path / "sessions")]))
    assert started == [ingest.WORKERS]   # only the second run used workers
    assert everything(inline, a) == everything(workers, b)
    assert all(r.status == "ingested" and r.skipped_lines for r in b)
    assert workers.gc.fsck().to_json()["ok"]


def test_workers_ingest_claude_sessions_and_forks_like_the_parent(tmp_path, monkeypatch):
    project = tmp_path / "projects" / "-repo"
    project.mkdir(parents=True)
    for i in range(3):
        c = ClaudeSession(f"5f0c2a7e-1111-4222-8333-44445555000{i}")
        for n in range(4):
            c.prompt(f"prompt {n}")
            c.say("reply " * 50)
        (project / f"{c.session_id}.jsonl").write_bytes(c.data() + b"not json\n")
    (inline, a), (workers, b) = run_both(tmp_path, monkeypatch, lambda: ("claude", [str(tmp_path / "projects")]))
    assert everything(inline, a) == everything(workers, b)

    parent = CodexSession("fork-parent")
    for n in range(5):
        parent.turn(f"ask {n}", "z" * 500)
    child = CodexSession("fork-child", forked_from="fork-parent")
    child.copy_lines(parent, len(parent.lines) - 2)
    child.turn("a new direction")
    root = tmp_path / "forks"
    root.mkdir()
    for name, s in (("a-child", child), ("b-parent", parent)):   # the fork is found before its parent
        (root / f"rollout-{name}.jsonl").write_bytes(s.data())
    (tmp_path / "f").mkdir()
    (inline, a), (workers, b) = run_both(tmp_path / "f", monkeypatch, lambda: ("codex", [str(root)]))
    assert everything(inline, a) == everything(workers, b)
    assert inline.threads.get("codex/fork-child").forked_from == workers.threads.get("codex/fork-child").forked_from
    assert workers.threads.get("codex/fork-child").forked_from.thread == "codex/fork-parent"


def test_second_run_in_workers_appends_only_new_lines_like_the_parent(tmp_path, monkeypatch):
    paths = codex_files(tmp_path, 4, 4)
    monkeypatch.setattr(ingest, "WORKER_BYTES", 0)
    Store.init(str(tmp_path / "store"))
    store = Store.open(str(tmp_path / "store"))
    Ingest(store, "codex", [str(tmp_path / "sessions")]).run()
    for path in paths:   # a turn more in each, and a partial line that must wait
        s = CodexSession(meta=False)
        s.turn("one more", "done")
        with open(path, "ab") as handle:
            handle.write(s.data() + b'{"type":"event_msg"')
    reports = Ingest(store, "codex", [str(tmp_path / "sessions")]).run()
    assert {r.status for r in reports} == {"ingested"}
    assert sorted(r.path for r in reports) == sorted(map(str, paths))
    for report in reports:
        data = open(report.path, "rb").read()
        assert b"".join(store.history.read(report.thread)) == data[:data.rfind(b"\n") + 1]
        assert report.partial_bytes == len(b'{"type":"event_msg"')
        assert store.threads.log(report.thread)[0].reason.startswith("codex turn")
    assert store.gc.fsck().to_json()["ok"]


def test_a_worker_that_dies_costs_only_speed(tmp_path, monkeypatch):
    codex_files(tmp_path, 4, 4)
    # Workers that exit before answering their first job: every file is read in the parent.
    monkeypatch.setattr(packing_workers, "worker_command", lambda: [sys.executable, "-c", "pass"])
    (inline, a), (workers, b) = run_both(tmp_path, monkeypatch, lambda: ("codex", [str(tmp_path / "sessions")]))
    assert everything(inline, a) == everything(workers, b)
    assert all(r.status == "ingested" for r in b)


GARBLED_WORKER = ("import sys; sys.stdin.buffer.read(8); "
                  "sys.stdout.buffer.write(bytes(8) + bytes([255]) * 64); sys.stdout.flush(); sys.stdin.read()")


def test_a_worker_whose_answers_make_no_sense_costs_only_speed(tmp_path, monkeypatch):
    """A result stream that is garbage (a debugger's ptrace once garbled one) fails that
    worker, never hangs the run: its files are read in the parent."""
    codex_files(tmp_path, 4, 4)
    monkeypatch.setattr(packing_workers, "worker_command", lambda: [sys.executable, "-c", GARBLED_WORKER])
    (inline, a), (workers, b) = run_both(tmp_path, monkeypatch, lambda: ("codex", [str(tmp_path / "sessions")]))
    assert everything(inline, a) == everything(workers, b)
    assert all(r.status == "ingested" for r in b)


FLIPPING_WORKER = """
import io
from agentcas.harnesses import packing_workers as p
real = p._send
def send(stream, value):
    out = io.BytesIO()
    real(out, value)
    data = bytearray(out.getvalue())
    data[len(data) // 2] ^= 1
    stream.write(bytes(data))
    stream.flush()
p._send = send
p.main()
"""


def test_a_worker_result_damaged_on_its_way_is_not_trusted(tmp_path, monkeypatch):
    """A result whose bytes changed between worker and parent (one bit of each, mid-message:
    in a framed chunk) is refused by its digest, and its file read in the parent: nothing
    it carried lands."""
    codex_files(tmp_path, 4, 40, filler=2_000)
    monkeypatch.setattr(packing_workers, "worker_command", lambda: [sys.executable, "-c", FLIPPING_WORKER])
    (inline, a), (workers, b) = run_both(tmp_path, monkeypatch, lambda: ("codex", [str(tmp_path / "sessions")]))
    assert everything(inline, a) == everything(workers, b)
    assert workers.gc.fsck().to_json()["ok"]


def test_every_byte_of_a_message_is_checked():
    """A message with any one byte changed is StreamDamaged, never a value (lengths are
    checked before they are used, so a damaged one cannot make the reader wait or allocate)."""
    import io
    stream = io.BytesIO()
    value = {"objects": [(b"d" * 32, pickle.PickleBuffer(b"chunk %d " % n * 50)) for n in range(3)], "n": 7}
    packing_workers._send(stream, value)
    message = stream.getvalue()
    assert packing_workers._receive(io.BytesIO(message))["n"] == 7
    for at in range(0, len(message), 7):
        damaged = bytearray(message)
        damaged[at] ^= 0x40
        with pytest.raises(packing_workers.StreamDamaged):
            packing_workers._receive(io.BytesIO(bytes(damaged)))


def test_a_results_chunks_travel_outside_its_pickle_and_arrive_as_bytes(tmp_path):
    """A worker's result crosses the pipe as a small pickle plus its framed chunks as they
    are (pickle protocol 5 buffers), and the parent gets the same chunks, as bytes."""
    import io
    import pickle

    from agentcas.harnesses.new_lines import NewLinesJob, read_new_lines
    from agentcas.harnesses.turns import CodexTurns
    (path,) = codex_files(tmp_path, 1, 40, filler=20_000)
    st = os.stat(path)
    lines = read_new_lines(NewLinesJob(str(path), st.st_ino, 0, 0, bytes(32), CodexTurns(), 0, False, 3,
                                       st.st_size, threads=1))
    objects = list(lines.packed.objects)
    chunk_bytes = sum(len(framed) for _, framed in objects)
    whole = len(pickle.dumps(lines, protocol=5))
    assert len(objects) > 1 and chunk_bytes > 10_000
    stream = io.BytesIO()
    packing_workers._send(stream, packing_workers._out_of_band(lines))
    head = packing_workers.LENGTH.size + packing_workers.TAG_BYTES   # the rest's length and its tag
    body_size, count = packing_workers.COUNTS.unpack_from(stream.getvalue(), head)
    assert count == len(objects) and body_size <= whole - chunk_bytes + 50 * len(objects)
    stream.seek(0)
    got = packing_workers._receive(stream)
    assert got.packed.objects == objects and all(type(framed) is bytes for _, framed in got.packed.objects)
    assert (got.count, got.marks, got.packed.segments) == (lines.count, lines.marks, lines.packed.segments)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="F_GETPIPE_SZ is Linux's")
def test_a_workers_result_pipe_holds_several_results(tmp_path):
    """A worker writes its results into a pipe of RESULT_PIPE_BYTES, not the default 64 KiB,
    so it goes on with its next job while the parent's reader thread waits for the GIL."""
    import fcntl
    paths = codex_files(tmp_path, 1, 4)
    workers = packing_workers.PackingWorkers(1)
    try:
        st = os.stat(paths[0])
        from agentcas.harnesses.new_lines import NewLinesJob
        from agentcas.harnesses.turns import CodexTurns
        job = NewLinesJob(str(paths[0]), st.st_ino, 0, 0, bytes(32), CodexTurns(), 0, False, 3, st.st_size)
        assert workers.submit(job).result().count > 0
        (worker,) = workers._workers
        assert fcntl.fcntl(worker.proc.stdout.fileno(), fcntl.F_GETPIPE_SZ) >= packing_workers.RESULT_PIPE_BYTES
    finally:
        workers.close()


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as handle:
            return [int(p) for p in handle.read().split()]
    except OSError:
        return []


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="reads a process's children from /proc")
def test_sigkill_of_a_large_ingest_leaves_whole_lines_and_no_worker(tmp_path):
    # Two files of ~20 MB each: more than WORKER_BYTES, so the CLI reads them in workers.
    paths = codex_files(tmp_path, 2, 900, filler=10_000, damaged=False)
    assert sum(p.stat().st_size for p in paths) >= ingest.WORKER_BYTES
    store_dir = tmp_path / "store"
    Store.init(str(store_dir))
    seen_workers = False
    for _ in range(3):
        proc = subprocess.Popen([AGENTCAS, "--store", str(store_dir), "ingest", "codex", str(tmp_path / "sessions")],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        workers: list[int] = []
        deadline = time.monotonic() + 120
        while not workers and proc.poll() is None and time.monotonic() < deadline:
            workers = _children(proc.pid)
            time.sleep(0.01)
        time.sleep(0.3)
        workers = sorted(set(workers) | set(_children(proc.pid)))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        seen_workers = seen_workers or bool(workers)
        deadline = time.monotonic() + 120   # an orphaned worker finishes its job at most, then exits
        while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(_alive(pid) for pid in workers)
        store = Store.open(str(store_dir))
        for path in paths:
            thread = "codex/" + path.name[len("rollout-2026-11-30T10-00-00-"):-len(".jsonl")]
            try:
                data = b"".join(store.history.read(thread))
            except Exception:  # noqa: BLE001 - not landed yet
                data = b""
            assert path.read_bytes().startswith(data) and (not data or data.endswith(b"\n"))
        assert store.gc.fsck().to_json()["ok"]
    assert seen_workers
    r = subprocess.run([AGENTCAS, "--store", str(store_dir), "ingest", "codex", str(tmp_path / "sessions")],
                       capture_output=True)
    assert r.returncode == 0, r.stderr
    store = Store.open(str(store_dir))
    for path in paths:
        thread = "codex/" + path.name[len("rollout-2026-11-30T10-00-00-"):-len(".jsonl")]
        assert b"".join(store.history.read(thread)) == path.read_bytes()
    assert store.gc.fsck().to_json()["ok"]
