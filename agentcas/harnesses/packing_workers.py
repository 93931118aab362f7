"""Worker processes that read, classify and pack session files for a large ingest.

Per-line work (classifying lines, a BLAKE3 per record, the record chain) runs under the
GIL, so one process uses one core however many threads it has. A large ingest hands each
file's `NewLinesJob` to one of a few workers (new_lines.read_new_lines there) while the
parent plans the next files and alone writes to the store: the workers never open it.

Each worker is `python -m agentcas.harnesses.packing_workers`, a child process that reads
jobs on its stdin and writes results on its stdout, one at a time, each one message written
and read at once: its length, a pickle (both ends are this code), the result's framed chunks
as they are (pickle protocol 5 buffers, not copied into the pickle) and a BLAKE3 of it all,
into a pipe widened to hold several results. Nothing read from a pipe is trusted unchecked: a
message whose digest differs (a debugger's ptrace has garbled one) ends that worker, and
its files are read in the parent. The parent writes each job to the worker with the least
work queued, ahead of the results (a worker never waits for the parent to take one), and
one thread per worker reads its results in order into futures (it waits on the pipe
without the GIL). A worker ignores SIGINT and SIGTERM (the
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
from collections import deque
from concurrent.futures import Future

import blake3

LENGTH = struct.Struct(">Q")


class StreamDamaged(Exception):
    """A message on a worker's pipe whose bytes are not the ones sent."""


def _send(stream, value) -> None:
    """Write `value` as one message, in one write: the length of the rest and a tag of it;
    then the length of its pickle and the number of its out-of-band buffers (pickle protocol
    5: the `pickle.PickleBuffer`s in it, a result's framed chunks), the buffers' lengths, the
    pickle and the buffers as they are, and a BLAKE3 of all of that rest. One write wakes
    the reader once, and it takes the rest in one read (each read releases the GIL: a
    thread switch in a busy parent)."""
    buffers: list = []
    body = pickle.dumps(value, protocol=5, buffer_callback=buffers.append)
    raws = [buffer.raw() for buffer in buffers]
    parts = [COUNTS.pack(len(body), len(raws)), struct.pack(f">{len(raws)}Q", *(raw.nbytes for raw in raws)),
             body, *raws]
    check = blake3.blake3()
    for part in parts:
        check.update(part)
    head = LENGTH.pack(sum(map(len, parts)) + DIGEST_BYTES)
    stream.write(b"".join([head, _tag(head), *parts, check.digest()]))
    stream.flush()


def _receive(stream):
    """The next value on `stream`: EOFError at its end, StreamDamaged if its bytes are not
    the ones sent. The rest's length is checked (its tag) before it is used, so a damaged
    one cannot make the reader allocate or wait for bytes that never come; the rest, by its
    digest, before anything in it is read. Each out-of-band buffer becomes a bytes object
    of its own, which the value then holds as it is (pickle does not copy it again)."""
    size = LENGTH.unpack(_checked(stream, LENGTH.size))[0]
    if size < COUNTS.size + DIGEST_BYTES:
        raise StreamDamaged("a message is shorter than its header")
    rest = _read_exactly(stream, size)
    view = memoryview(rest)
    if blake3.blake3(view[:-DIGEST_BYTES]).digest() != rest[-DIGEST_BYTES:]:
        raise StreamDamaged("a message's bytes differ from their digest")
    body_size, count = COUNTS.unpack_from(rest)
    at = COUNTS.size + LENGTH.size * count
    if at + body_size + DIGEST_BYTES > size:
        raise StreamDamaged("a message's lengths do not add up to it")
    lengths = struct.unpack_from(f">{count}Q", rest, COUNTS.size)
    if at + body_size + sum(lengths) + DIGEST_BYTES != size:
        raise StreamDamaged("a message's lengths do not add up to it")
    body = view[at:at + body_size]
    at += body_size
    buffers = []
    for length in lengths:
        buffers.append(bytes(view[at:at + length]))
        at += length
    return pickle.loads(body, buffers=buffers)


COUNTS = struct.Struct(">QQ")
TAG_BYTES = 16
DIGEST_BYTES = 32


def _tag(data: bytes) -> bytes:
    return blake3.blake3(data).digest(TAG_BYTES)


def _checked(stream, size: int) -> bytes:
    """`size` bytes and the tag after them, which must be theirs."""
    data = _read_exactly(stream, size + TAG_BYTES)
    if _tag(data[:size]) != data[size:]:
        raise StreamDamaged("a message's length differs from its tag")
    return data[:size]


def _read_exactly(stream, size: int) -> bytes:
    data = stream.read(size)
    if len(data) < size:
        raise EOFError
    return data


def _out_of_band(lines):
    """`lines` (a NewLines) with its framed chunks marked to travel out of the pickle."""
    if lines.packed is not None:
        lines.packed.objects = [(digest, pickle.PickleBuffer(framed)) for digest, framed in lines.packed.objects]
    return lines


RESULT_PIPE_BYTES = 1024 * 1024   # Linux's limit for an unprivileged process (fs/pipe-max-size)


def _widen_pipe(stream) -> None:
    """Let the result pipe hold RESULT_PIPE_BYTES (Linux; elsewhere it stays as it is).

    A result is ~1/5 of its file's bytes (zstd), ~100 KB for a 500 KB session, and the
    default 64 KiB pipe made a worker wait in its write until the parent's reader thread
    took the first part, and that thread waits for the GIL (up to the 5 ms switch interval
    while the landing thread runs): measured, a worker spent 2.5 s of a 13 s ingest of
    2,000 files blocked there. A pipe that holds several results lets it go on at once.
    """
    import fcntl
    try:
        fcntl.fcntl(stream.fileno(), fcntl.F_SETPIPE_SZ, RESULT_PIPE_BYTES)
    except (AttributeError, OSError):
        pass


def worker_command() -> list[str]:
    return [sys.executable, "-m", "agentcas.harnesses.packing_workers"]


class _Worker:
    """One worker process, the futures of the jobs sent to it (in order), and its reader thread."""

    def __init__(self, pool: PackingWorkers):
        self.proc = subprocess.Popen(worker_command(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     close_fds=True)
        _widen_pipe(self.proc.stdout)
        self.waiting: deque = deque()   # (future, job size) of the jobs sent, oldest first
        self.queued = 0                 # bytes of those jobs
        self.reader = threading.Thread(target=self._read_results, args=(pool,), daemon=True,
                                       name=f"ingest-worker-{self.proc.pid}")
        self.reader.start()

    def _read_results(self, pool: PackingWorkers) -> None:
        while True:
            try:
                result = _receive(self.proc.stdout)
            except EOFError:
                if not pool.closing or self.waiting:
                    pool.failed = True
                break
            except Exception:   # a stream that makes no sense (seen under a debugger's ptrace):
                pool.failed = True   # never a hang; the caller reads this worker's jobs itself
                self.proc.kill()
                break
            with pool.lock:
                future, size = self.waiting.popleft()
                self.queued -= size
            future.set_result(result)
        with pool.lock:   # the worker is gone: its jobs are read by the caller (a None result)
            waiting, self.waiting = list(self.waiting), deque()
        for future, _ in waiting:
            future.set_result(None)


class PackingWorkers:
    """Up to `count` worker processes (started as jobs arrive, or all by `start()`), each sent
    jobs ahead of its results so that it never waits for the parent; `close()` ends them."""

    def __init__(self, count: int):
        self.count = count
        self.lock = threading.Lock()
        self.failed = False
        self.closing = False
        self._workers: list[_Worker] = []

    def start(self) -> None:
        """Start all `count` workers now rather than as jobs arrive."""
        with self.lock:
            while len(self._workers) < self.count and not self.failed:
                self._workers.append(_Worker(self))

    def submit(self, job) -> Future:
        """The future NewLines of `job`, or of None if its worker died (`failed` is then set:
        the caller reads that file, and the next ones, itself)."""
        future: Future = Future()
        with self.lock:
            idle = [w for w in self._workers if not w.waiting]
            if not idle and len(self._workers) < self.count and not self.failed:
                self._workers.append(_Worker(self))
            if self.failed or not self._workers:
                future.set_result(None)
                return future
            worker = min(self._workers, key=lambda w: w.queued)   # the least work queued
            worker.waiting.append((future, job.size))
            worker.queued += job.size
        try:
            _send(worker.proc.stdin, job)
        except OSError:
            self.failed = True   # its reader sees the end of the pipe and answers None
        return future

    def close(self, abandon: bool = False) -> None:
        """Wait for the jobs given, then end the workers (each exits when its stdin closes);
        `abandon`: kill them instead (the run failed: their results have no reader)."""
        self.closing = True
        if abandon:
            for worker in self._workers:
                worker.proc.kill()
        for worker in self._workers:
            try:
                if worker.proc.stdin is not None:
                    worker.proc.stdin.close()
            except OSError:
                pass
        for worker in self._workers:
            worker.reader.join()
            try:
                worker.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                worker.proc.kill()
                worker.proc.wait()
            if worker.proc.stdout is not None:
                worker.proc.stdout.close()
        self._workers.clear()


def serve(jobs, results) -> None:
    """The worker's loop: each job on `jobs`, its NewLines on `results`, until `jobs` ends."""
    from dataclasses import replace

    from agentcas.harnesses.new_lines import read_new_lines
    while True:
        try:
            job = _receive(jobs)
        except EOFError:
            return
        _send(results, _out_of_band(read_new_lines(replace(job, threads=1))))   # the other workers have the other cores


def main() -> int:
    for number in (signal.SIGINT, signal.SIGTERM):
        signal.signal(number, signal.SIG_IGN)
    jobs, results = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr   # nothing else may write into the result stream
    try:
        serve(jobs, results)
    except BrokenPipeError:   # the parent is gone: nobody reads the result
        os._exit(0)
    except StreamDamaged:     # a job's bytes are not the ones sent: do nothing with it
        os._exit(1)           # (the parent sees the pipe end and reads this worker's files itself)
    return 0


if __name__ == "__main__":
    sys.exit(main())
