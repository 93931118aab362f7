"""Leases: writers in progress as gc roots, judged the same way on every backend.

A writer that stores objects and then moves a ref (commit, rollout append, import,
push receiving, ...) holds a lease for its whole duration: a row of the metadata
table `leases` {what, host, pid, started_at, expires_at}. It refreshes the row as it
goes (every LEASE_SECONDS/3) and deletes it in the transaction that moves its ref.

The protocol that makes gc safe without one transaction spanning objects and refs:
- gc deletes objects only inside a *sweep batch*. A batch begins with a metadata
  transaction that locks the `meta` row SWEEP_KEY, finds no live lease, and writes
  SWEEP_KEY = {until}. It deletes nothing after `until`, and ends by clearing it.
- A writer acquires its lease in a transaction that locks the same row; while a
  batch is active it waits. So a batch never overlaps a live lease's life. (A gc
  that finds live leases marks itself waiting in the row; new writers then defer to
  it briefly, so a store that is never idle still gets its sweep.)
- The writer's final transaction (the ref move) checks that its lease row still
  exists and has not expired. A writer paused past its expiry (gc may then have
  deleted what it meant to reuse) fails cleanly instead of publishing a ref to
  deleted objects; nothing it wrote is visible.
A lease is live while unexpired, except that a lease of a process on this host
whose pid is gone is dead at once (a killed writer does not hold up gc until
expiry). Clocks of cooperating hosts must agree to within CLOCK_MARGIN.

Where objects and refs share one transaction (the embedded store: one LMDB
environment), a writer may instead go without a lease, optimistically (`SweepWatch`):
it notes the sweep count (`meta` row SWEEPS_KEY, which every batch increments as it
begins) and that no batch is active before it looks at anything stored, and its one
final transaction stores its objects, checks that everything else it relies on is
still stored, and lands only if the count is unchanged and no batch is active. Then
no batch began during the writer's life, which is what a lease would have ensured;
otherwise it takes a real lease and plans again. No lease row is written, so a step
costs one durable transaction instead of three.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from agentcas import testing_hooks
from agentcas.cas import encoding
from agentcas.cas.metastore.base import MetadataStore, MetadataUnavailable, MetaTxn, Read
from agentcas.cas.sealed import seal, unseal
from agentcas.errors import AgentcasError, ConflictError, IntegrityError

LEASE_SECONDS = float(os.environ.get("AGENTCAS_LEASE_SECONDS", "120"))
SWEEP_WINDOW = 60.0
CLOCK_MARGIN = 5.0
ACQUIRE_WAIT = SWEEP_WINDOW + 2 * CLOCK_MARGIN
SWEEP_KEY = b"gc/sweep"
SWEEPS_KEY = b"gc/sweeps"  # sealed u64 big-endian: sweep batches begun (SweepWatch); absent = 0


def this_host() -> str:
    return os.uname().nodename


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists (signal 0 probes without signalling)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class LeaseExpired(ConflictError):
    """A writer's lease ran out before its ref move: gc may have run; nothing landed."""


class LeaseBusy(AgentcasError):
    """A gc sweep batch stayed active longer than a writer would wait for it."""


@dataclass(frozen=True)
class LeaseRow:
    """A lease as stored: who holds it and until when."""

    key: bytes
    what: str
    host: str
    pid: int
    started_at: float
    expires_at: float

    def live(self, now: float | None = None, host: str | None = None) -> bool:
        now = time.time() if now is None else now
        if self.expires_at + CLOCK_MARGIN < now:
            return False
        if self.host == (host or this_host()) and not pid_alive(self.pid):
            return False
        return True

    def to_doc(self) -> dict:
        return {"what": self.what, "host": self.host, "pid": self.pid,
                "started_at": int(self.started_at), "expires_at": int(self.expires_at),
                "live": self.live()}

    def encode(self) -> bytes:
        return seal("leases", self.key, encoding.encode(
            {"what": self.what, "host": self.host, "pid": self.pid,
             "started_at": int(self.started_at * 1000), "expires_at": int(self.expires_at * 1000)}))

    @classmethod
    def decode(cls, key: bytes, value) -> LeaseRow:
        doc = encoding.decode(unseal("leases", key, value))
        try:
            return cls(bytes(key), str(doc["what"]), str(doc["host"]), int(doc["pid"]),
                       doc["started_at"] / 1000, doc["expires_at"] / 1000)
        except (KeyError, TypeError, ValueError):
            raise IntegrityError(f"lease {bytes(key).hex()} is malformed") from None


def read_leases(txn: MetaTxn) -> list[LeaseRow]:
    """Every lease row (a damaged one raises IntegrityError: gc must then stop)."""
    return [LeaseRow.decode(bytes(key), value) for key, value in txn.scan("leases")]


# --- the sweep fence (gc/sweep.py begins and ends batches with these) --------------------------

_IDLE = {"until": 0, "host": "", "pid": 0}
REQUEST_GRACE = 2.0  # how long a new writer defers to a gc that is waiting for a gap


def _sweep_row(until_ms: int, requested_ms: int = 0) -> bytes:
    doc = dict(_IDLE, until=until_ms)
    if requested_ms:
        doc["requested"] = requested_ms
    return seal("meta", SWEEP_KEY, encoding.encode(doc))


# The fence row as last decoded (its exact bytes, its value): every writer reads the row,
# which changes only when gc begins or ends a batch, so most reads decode nothing.
_FENCE_SEEN: tuple[bytes, dict] = (b"", dict(_IDLE))


def _fence(txn: MetaTxn, lock: bool) -> dict:
    """The fence row's value (not to be changed: it may be shared with other readers)."""
    global _FENCE_SEEN
    if lock:
        txn.put_new("meta", SWEEP_KEY, _sweep_row(0))
    value = txn.get("meta", SWEEP_KEY, for_update=lock)
    if value is None:
        return dict(_IDLE)
    value = bytes(value)
    seen = _FENCE_SEEN
    if seen[0] == value:
        return seen[1]
    fence = encoding.decode(unseal("meta", SWEEP_KEY, value))
    _FENCE_SEEN = (value, fence)
    return fence


def sweep_active(txn: MetaTxn, now: float, lock: bool = False) -> bool:
    """Whether a sweep batch is running; with `lock`, hold the fence row until commit.

    The row always exists once a lease was taken (an idle value, not a deletion), so
    that lease takers and batch starters really lock the same row: on PostgreSQL a
    `SELECT ... FOR UPDATE` of an absent row locks nothing.
    """
    return _batch_active(_fence(txn, lock), now)


def _batch_active(fence: dict, now: float) -> bool:
    return fence["until"] / 1000 + CLOCK_MARGIN >= now


def _gc_waiting(fence: dict, now: float) -> bool:
    requested = fence.get("requested", 0) / 1000
    return bool(requested) and now - requested < REQUEST_GRACE


def sweep_requested(txn: MetaTxn, now: float, lock: bool = False) -> bool:
    """Whether a gc is waiting for a gap between leases (for less than REQUEST_GRACE)."""
    return _gc_waiting(_fence(txn, lock), now)


def begin_sweep(txn: MetaTxn, now: float) -> tuple[list[LeaseRow], int]:
    """Start a sweep batch unless a live lease exists: (live leases, dead rows dropped).

    An empty list means the batch has begun: delete only until now + SWEEP_WINDOW.
    With live leases, the fence records that gc is waiting (`requested`), and writers
    taking a new lease defer to it for up to REQUEST_GRACE, so a busy store still gets
    a gap between its writes (the leases already held finish first).
    """
    fence = _fence(txn, lock=True)
    live, dropped = [], 0
    for row in read_leases(txn):
        if row.live(now):
            live.append(row)
        else:
            txn.delete("leases", row.key)
            dropped += 1
    if not live:
        txn.put("meta", SWEEP_KEY, _sweep_row(int((now + SWEEP_WINDOW) * 1000)))
        txn.put("meta", SWEEPS_KEY, seal("meta", SWEEPS_KEY, (sweeps_begun(txn) + 1).to_bytes(8, "big")))
    elif not fence.get("requested") or now - fence["requested"] / 1000 >= 3 * REQUEST_GRACE:
        # Renewed only after a pause as long as twice the deferral: while gc waits on a long
        # write, other writers are slowed by at most a third, never stopped.
        txn.put("meta", SWEEP_KEY, _sweep_row(0, int(now * 1000)))
    return live, dropped


def end_sweep(txn: MetaTxn) -> None:
    txn.put("meta", SWEEP_KEY, _sweep_row(0))


def sweeps_begun(txn: MetaTxn) -> int:
    """How many sweep batches have begun on this store (0 before any, or before this row)."""
    value = txn.get("meta", SWEEPS_KEY)
    if value is None:
        return 0
    count = unseal("meta", SWEEPS_KEY, value)
    if len(count) != 8:
        raise IntegrityError(f"meta entry {SWEEPS_KEY.decode()!r} is malformed")
    return int.from_bytes(count, "big")


class SweptMeanwhile(Exception):
    """A sweep batch began during an optimistic writer's life: take a lease, plan again."""


class SweepWatch:
    """An optimistic writer's stand-in for a lease, for a store whose objects and refs
    share one transaction (see the module doc). `start(txn)` is read before the writer
    looks at anything stored; False means a batch is active or a gc waits for a gap:
    take a real lease instead. `check(txn)`, inside the final transaction, raises
    SweptMeanwhile if a batch began since, or is active now."""

    def __init__(self):
        self.begun: int | None = None

    def start(self, txn: MetaTxn) -> bool:
        now = time.time()
        fence = _fence(txn, lock=False)
        if _batch_active(fence, now) or _gc_waiting(fence, now):
            return False
        self.begun = sweeps_begun(txn)
        return True

    def check(self, txn: MetaTxn) -> None:
        if sweeps_begun(txn) != self.begun or sweep_active(txn, time.time()):
            testing_hooks.reached("sweepwatch.swept")
            raise SweptMeanwhile()


# --- the writer's side -----------------------------------------------------------------------

class Lease:
    """A writer's lease; a context manager that releases it if the writer did not.

    `reads` (exchange reads) are fetched in the same request that takes the lease, and
    their answers kept in `prefetched`: a commit learns its thread's state while taking
    its lease (one request instead of two).
    """

    def __init__(self, meta: MetadataStore, what: str, reads=()):
        self.meta = meta
        self.what = what
        self.key = os.urandom(16)
        self.row: LeaseRow | None = None
        self.value: bytes | None = None   # the row's stored bytes, as this writer last wrote them
        self.released = False
        self.reads = list(reads)
        self.prefetched: list | None = None

    def _row(self, now: float) -> LeaseRow:
        started = self.row.started_at if self.row else now
        return LeaseRow(self.key, self.what, this_host(), os.getpid(), started, now + LEASE_SECONDS)

    def acquire(self) -> Lease:
        """Take the lease, waiting out a sweep batch that is active now.

        While a batch runs, the row is written at once and the writer waits: gc starts
        no further batch while it exists, so a writer waits for at most the batch in
        progress. While a gc only waits for a gap (`sweep_requested`), a new writer
        defers to it (for at most REQUEST_GRACE) without writing its row.
        """
        deadline = time.monotonic() + ACQUIRE_WAIT

        def take(txn: MetaTxn):
            now = time.time()
            active = sweep_active(txn, now, lock=True)
            if not active and self.row is None and sweep_requested(txn, now):
                return "defer", None
            row = self._row(now)
            txn.put("leases", self.key, row.encode())
            return ("wait" if active else "held"), row

        while True:
            outcome, row = self._take_in_one_request()
            if outcome is None:  # no fence row to lock yet (a store made before leases)
                outcome, row = self.meta.write(take)
            if row is not None:
                self.row, self.value = row, row.encode()
            if outcome == "held":
                return self
            testing_hooks.reached("lease.waiting")
            if time.monotonic() > deadline:
                self.__exit__(None, None, None)
                raise LeaseBusy("a gc sweep is in progress and did not finish in time; "
                                "nothing was changed, retry")
            time.sleep(0.01)

    def _take_in_one_request(self):
        """Write the lease row while reading (and locking) the fence, in one exchange:
        ("held" | "wait" | "defer", row), or (None, None) if the fence row is missing.

        The row is written before the fence is judged. While a batch is active that is
        what waiting needs anyway; when a gc only waits for a gap, this writer defers,
        so it takes its row back (a rare second request)."""
        now = time.time()
        row = self._row(now)
        reads = [Read("meta", SWEEP_KEY)] + self.reads
        _, values = self.meta.exchange(reads=reads, writes=[("leases", self.key, row.encode())])
        if values[0] is None:
            self.meta.exchange(writes=[("leases", self.key, None)])
            return None, None
        self.prefetched = values[1:]
        fence = encoding.decode(unseal("meta", SWEEP_KEY, values[0]))
        active = _batch_active(fence, now)
        if not active and self.row is None and _gc_waiting(fence, now):
            self.meta.exchange(writes=[("leases", self.key, None)])
            return "defer", None
        return ("wait" if active else "held"), row

    def refresh(self, force: bool = False) -> None:
        """Extend the lease if a third of it has passed (or `force`); LeaseExpired if lost."""
        now = time.time()
        if self.row is None or (not force and now < self.row.expires_at - LEASE_SECONDS * 2 / 3):
            return

        def extend(txn: MetaTxn):
            self.check(txn)
            row = self._row(time.time())
            txn.put("leases", self.key, row.encode())
            return row

        self.row = self.meta.write(extend)
        self.value = self.row.encode()

    def check_clock(self) -> None:
        """Raise LeaseExpired if this lease has run out by this machine's clock."""
        if self.row is None or self.row.expires_at < time.time():
            self.raise_expired()

    def raise_expired(self):
        raise LeaseExpired(f"this {self.what} took longer than its lease ({LEASE_SECONDS:.0f} s) "
                           "and a gc may have run meanwhile; nothing was changed, retry")

    def expect(self) -> tuple[str, bytes, bytes | None]:
        """The exchange expectation that this lease is still held as written (gc drops a
        lease it judged dead, so a vanished or changed row means it may have swept)."""
        return "leases", self.key, self.value

    def check(self, txn: MetaTxn) -> None:
        """Raise LeaseExpired unless this lease is still held and unexpired (in `txn`)."""
        value = txn.get("leases", self.key, for_update=True)
        row = None if value is None else LeaseRow.decode(self.key, value)
        if row is None or row.expires_at < time.time():
            self.raise_expired()

    def release(self, txn: MetaTxn) -> None:
        """Remove the lease inside the writer's final transaction."""
        txn.delete("leases", self.key)
        self.released = True

    def __enter__(self) -> Lease:
        return self.acquire()

    def __exit__(self, *exc):
        if self.row is None or (self.released and exc[0] is None):
            return False
        if exc[0] is not None and issubclass(exc[0], MetadataUnavailable):
            # The metadata store just stopped answering: asking it again would only hold the
            # error back for another round of retries. The row dies with this process
            # (LeaseRow.live) or when it expires.
            return False
        try:
            self.meta.write(lambda txn: txn.delete("leases", self.key))
        except Exception:  # noqa: BLE001 - a stale lease is harmless: it expires, or its pid dies
            pass
        return False


def land(meta: MetadataStore, lease: Lease, fn):
    """Run the final transaction `fn(txn)` of a leased writer: check, move, release."""
    def final(txn: MetaTxn):
        lease.check(txn)
        result = fn(txn)
        lease.release(txn)
        return result
    return meta.write(final)
