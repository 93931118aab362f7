"""Worker processes that read, classify and pack session files for a large ingest.

Per-line work (classifying lines, a BLAKE3 per record, the record chain) runs under the
GIL, so one process uses one core however many threads it has. A large ingest hands each
file's `NewLinesJob` to one of a few workers (new_lines.read_new_lines there) while the
parent plans the next files and alone writes to the store: the workers never open it.

Each worker is `python -m agentcas.harnesses.packing_workers`, a child process that reads
jobs on its stdin and writes results on its stdout, one at a time, each a length-prefixed
pickle (both ends are this code). The parent talks to each worker from one thread of a
thread pool (the thread waits on the pipes without the GIL), so results come back as
futures, in the order the parent asks for them. A worker ignores SIGINT and SIGTERM (the
parent decides when a run stops: `--watch` finishes the pass in progress) and exits when
its stdin closes: when the parent closes it, or dies, even by SIGKILL (at most the job
in progress is finished first; its result then has no reader and is dropped). Nothing a
worker does is durable, so a killed ingest leaves only what the parent committed.
"""

from __future__ import annotations

import os
import pickle
import signal
import struct
import subprocess
import sys
import threading
from concurrent.futures import Future, ThreadPoolExecutor

LENGTH = struct.Struct(">Q")


def _send(stream, value) -> None:
    body = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(LENGTH.pack(len(body)))
    stream.write(body)
    stream.flush()


def _receive(stream):
    """The next value on `stream`, or EOFError at its end."""
    head = stream.read(LENGTH.size)
    if len(head) < LENGTH.size:
        raise EOFError
    (size,) = LENGTH.unpack(head)
    body = stream.read(size)
    if len(body) < size:
        raise EOFError
    return pickle.loads(body)


class PackingWorkers:
    """Up to `count` worker processes, started as jobs arrive; `close()` ends them."""

    def __init__(self, count: int):
        self._threads = ThreadPoolExecutor(count, thread_name_prefix="ingest-worker")
        self._local = threading.local()
        self._lock = threading.Lock()
        self._procs: list[subprocess.Popen] = []
        self.failed = False

    def submit(self, job) -> Future:
        """The future NewLines of `job`, or of None if its worker died (`failed` is then
        set: the caller reads that file, and the next ones, itself)."""
        return self._threads.submit(self._run, job)

    def _worker(self) -> subprocess.Popen:
        proc = getattr(self._local, "proc", None)
        if proc is None:
            proc = subprocess.Popen([sys.executable, "-m", "agentcas.harnesses.packing_workers"],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, close_fds=True)
            with self._lock:
                self._procs.append(proc)
            self._local.proc = proc
        return proc

    def _run(self, job):
        if self.failed:
            return None
        proc = self._worker()
        try:
            _send(proc.stdin, job)
            return _receive(proc.stdout)
        except (OSError, EOFError, pickle.UnpicklingError):
            self.failed = True
            return None

    def close(self) -> None:
        """Wait for the jobs given, then end the workers (each exits when its stdin closes)."""
        self._threads.shutdown(wait=True)
        for proc in self._procs:
            try:
                proc.stdin.close()
            except OSError:
                pass
        for proc in self._procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            proc.stdout.close()
        self._procs.clear()


def serve(jobs, results) -> None:
    """The worker's loop: each job on `jobs`, its NewLines on `results`, until `jobs` ends."""
    from agentcas.harnesses.new_lines import read_new_lines
    while True:
        try:
            job = _receive(jobs)
        except EOFError:
            return
        _send(results, read_new_lines(job))


def main() -> int:
    for number in (signal.SIGINT, signal.SIGTERM):
        signal.signal(number, signal.SIG_IGN)
    jobs, results = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr   # nothing else may write into the result stream
    try:
        serve(jobs, results)
    except BrokenPipeError:   # the parent is gone: nobody reads the result
        os._exit(0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
