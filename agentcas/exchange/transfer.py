"""Moving a thread between two stores: send only what the other side lacks, verified.

A transfer has a source endpoint (holding the thread) and a target endpoint. It runs:

1. read the thread's state on both sides (`read_ref`); equal states: nothing to do;
2. list the closure of the source state (checkpoint, ancestors, trees, chunk lists,
   chunks, history segments), verified by the source as it is read;
3. unless forced, check on the source (which holds everything the new state needs)
   that the move fast-forwards the target: the target's checkpoint is an ancestor of
   (or equal to) the new one and its history is a prefix of the new history
   (`History.position(new, old.seq).digest == old.digest`); a refused move writes nothing;
4. ask the target which of those ids it already has (`has_many`, in batches);
5. stream the missing objects from source to target; the target re-verifies each one
   against its id before storing it, under a write pin so gc keeps them;
6. the target moves its ref by compare-and-swap from the state read in step 1
   (`compare_and_swap_ref`), in one final step that also checks the closure is
   complete (and, for a local store, re-checks the fast-forward). A lost race is a
   ConflictError and nothing moves.

The `Endpoint` interface is deliberately small so that an object-storage remote can
implement it later: ids in, ids out, framed object bytes, and one conditional write of
a ref. `LocalStoreEndpoint` implements it over any agentcas store (its Backends).
"""

from __future__ import annotations

import struct
import time
import zlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from agentcas.cas import framing
from agentcas.cas.backends import Backends
from agentcas.cas.digest import Digest
from agentcas.cas.leases import Lease
from agentcas.cas.source import ObjectSource, verify_object
from agentcas.cas.writer import BatchWriter
from agentcas.errors import ConflictError, IntegrityError, NotFound
from agentcas.lineage.closure import MissingObject, Walker
from agentcas.lineage.rollout import History
from agentcas.refs import threads
from agentcas.refs.revisions import is_ancestor
from agentcas.refs.threads import ThreadState

HAS_MANY_BATCH = 4096


class CorruptTransfer(IntegrityError):
    """An object received does not match its id, or is not the object asked for."""


class NotFastForward(ConflictError):
    """The target's thread is not an ancestor of the state being sent."""


# --- the interface -------------------------------------------------------------------------

class Endpoint(ABC):
    """One side of a transfer: a store that objects and thread refs move in and out of.

    Objects travel as (Digest, framed bytes) pairs, the stored form of cas/framing.py.
    """

    url: str

    @abstractmethod
    def read_ref(self, thread: str) -> ThreadState | None:
        """The thread's current state, or None if it does not exist."""

    @abstractmethod
    def compare_and_swap_ref(self, thread: str, old: ThreadState | None, new: ThreadState,
                             fast_forward_only: bool, action: str, message: str) -> None:
        """Move `thread` from `old` to `new` atomically, only if the closure of `new` is
        complete here; ConflictError (nothing moved) if the thread is no longer at `old`."""

    @abstractmethod
    def has_many(self, ids: list[Digest]) -> set[bytes]:
        """The raw ids among `ids` that this endpoint stores."""

    @abstractmethod
    def get_objects(self, ids: Iterable[Digest]) -> Iterator[tuple[Digest, bytes]]:
        """(id, framed bytes) of each id, in order; MissingObject if one is absent."""

    @abstractmethod
    def put_objects(self, stream: Iterable[tuple[Digest, bytes]]) -> tuple[int, int]:
        """Verify and store each object; (objects, bytes) received. Call inside `receiving`."""

    @abstractmethod
    def object_reader(self):
        """A context manager giving an ObjectSource of this side's objects
        (used to walk closures and histories on the side that holds them)."""

    @contextmanager
    def receiving(self, what: str):
        """Held around put_objects ... compare_and_swap_ref (a gc lease, for stores)."""
        yield self

    # Built on object_reader(); a backend may override them with something cheaper.
    def closure(self, state: ThreadState) -> list[tuple[Digest, int]]:
        """Every object `state` needs, each once, verified as it is read."""
        with self.object_reader() as objects:
            return list(closure_of(objects, state, verify=True))

    def fast_forward_problem(self, old: ThreadState | None, new: ThreadState) -> str | None:
        """Why moving from `old` to `new` is not a fast-forward (None if it is); run this
        on an endpoint that holds the closure of `new`."""
        with self.object_reader() as objects:
            return fast_forward_problem(objects, old, new)


# --- checks shared by every endpoint ---------------------------------------------------------

def closure_of(objects: ObjectSource, state: ThreadState, verify: bool) -> Iterator[tuple[Digest, int]]:
    """(id, kind) of the checkpoint closure (with ancestors) and history of `state`.

    With `verify`, every object is checked against its id and what it states about the
    objects it names (sizes, kinds, file ids, segments, positions: closure.Walker deep),
    so a source store whose objects lie is refused before anything is sent."""
    walker = Walker(objects, verify=verify, follow_parents=True, deep=verify)
    if state.checkpoint is not None:
        for digest, kind, _ in walker.checkpoint(state.checkpoint):
            yield digest, kind
    for digest, kind, _ in walker.history(state.history):
        yield digest, kind


def fast_forward_problem(objects: ObjectSource, old: ThreadState | None, new: ThreadState) -> str | None:
    """Why `new` does not fast-forward `old` (None if it does); `objects` holds new's closure."""
    if old is None:
        return None
    if old.checkpoint is not None:
        if new.checkpoint is None or not is_ancestor(objects, old.checkpoint, new.checkpoint, strict=True):
            return f"checkpoint {old.checkpoint.short()} is not an ancestor of the one sent"
    if old.history.seq > new.history.seq:
        return (f"its history has {old.history.seq} records, more than the "
                f"{new.history.seq} sent")
    if History(objects).position(new.history, old.history.seq).digest != old.history.digest:
        return f"its history's first {old.history.seq} records differ from those sent"
    return None


def restamp(framed: bytes, when: int) -> bytes:
    """The same stored value with `written_at` set to `when` (the receiver's clock).

    gc's grace period goes by `written_at`; a received object is new
    to this store, so it must not carry the sender's (possibly old) time.
    """
    kind, codec, size, _ = framing.read_header(framed)
    head = framing.HEADER.pack(kind, codec, size, when, 0)[:-4]
    return head + struct.pack(">I", zlib.crc32(head)) + framed[framing.HEADER_SIZE:]


def verified(digest: Digest, framed) -> bytes:
    """`framed` as bytes if it decodes and hashes to `digest`; CorruptTransfer otherwise."""
    framed = bytes(framed)
    try:
        kind, data = framing.unframe(framed)
        verify_object(kind, digest, data)
    except IntegrityError as exc:
        raise CorruptTransfer(f"received object {digest.hex()} is corrupt ({exc}); "
                              "no ref was moved") from None
    return framed


# --- the local-store implementation ------------------------------------------------------------

class LocalStoreEndpoint(Endpoint):
    """An agentcas store opened in this process (the local store, or a remote's URL)."""

    def __init__(self, backends: Backends, url: str):
        self.backends = backends
        self.url = url
        self._lease: Lease | None = None

    def read_ref(self, thread):
        with self.backends.meta.reader() as txn:
            return threads.read_thread(txn, thread)

    def has_many(self, ids):
        return self.backends.blobs.has_many([d.raw for d in ids])

    def get_objects(self, ids):
        ids = list(ids)
        for start in range(0, len(ids), HAS_MANY_BATCH):
            batch = ids[start:start + HAS_MANY_BATCH]
            values = self.backends.blobs.get_many([d.raw for d in batch])
            for digest in batch:
                value = values.get(digest.raw)
                if value is None:
                    raise MissingObject(digest, framing.KIND_CHUNK, None)
                yield digest, bytes(value)

    @contextmanager
    def receiving(self, what):
        with Lease(self.backends.meta, what) as lease:
            self._lease = lease
            try:
                yield self
            finally:
                self._lease = None

    def put_objects(self, stream):
        writer = BatchWriter(self.backends.source, lease=self._lease)
        count = size = 0
        now = int(time.time())
        for digest, framed in stream:
            framed = verified(digest, framed)
            count += 1
            size += len(framed)
            writer.add(digest, restamp(framed, now))
        writer.flush()
        return count, size

    def object_reader(self):
        return self.backends.source.reading()

    def compare_and_swap_ref(self, thread, old, new, fast_forward_only, action, message):
        lease = self._lease
        try:
            with self.backends.source.reading() as objects:
                for _ in closure_of(objects, new, verify=False):
                    pass
        except MissingObject as exc:
            raise IntegrityError(f"{exc} at {self.url} after the transfer (concurrent gc?); "
                                 "nothing was changed, retry") from None
        if fast_forward_only:
            problem = self.fast_forward_problem(old, new)
            if problem:
                raise NotFastForward(f"not a fast-forward of thread {thread!r} at {self.url}: "
                                     f"{problem}; nothing was changed (use --force to replace it)")

        def land(txn):
            if lease is not None:
                lease.check(txn)
            current = threads.read_thread(txn, thread)
            if current != old:
                raise ConflictError(f"thread {thread!r} at {self.url} moved during the transfer; "
                                    "nothing was changed, retry")
            if not threads.set_if_equals(txn, thread, old, new, action, message):
                raise ConflictError(f"thread {thread!r} at {self.url} moved; nothing was changed")
            if lease is not None:
                lease.release(txn)

        self.backends.meta.write(land)


# --- the transfer --------------------------------------------------------------------------------

@dataclass(frozen=True)
class TransferResult:
    thread: str
    old: ThreadState | None
    new: ThreadState
    objects_total: int
    objects: int
    bytes: int
    up_to_date: bool
    forced: bool


def transfer(source: Endpoint, target: Endpoint, thread: str, force: bool = False,
             action: str = "transfer", message: str = "",
             progress: Callable[[int, int], None] | None = None,
             check_outgoing: Callable[[list[tuple[Digest, int]]], None] | None = None) -> TransferResult:
    """Make `target`'s thread equal to `source`'s, sending only missing objects.

    `check_outgoing`, if given, sees the (id, kind) of every object about to be sent
    before the first is sent, and may raise to stop the transfer (push's secret scan).

    Raises NotFound (no such thread at the source), NotFastForward (unless `force`),
    ConflictError (the target moved meanwhile), IntegrityError (an object is corrupt
    or missing on either side). On any error the target's ref is unchanged, and no
    object was written unless the failure came after a flushed batch (then only
    verified, unreferenced objects remain, which gc collects).
    """
    new = source.read_ref(thread)
    if new is None:
        raise NotFound(f"no thread named {thread!r} at {source.url}")
    old = target.read_ref(thread)
    if old == new:
        return TransferResult(thread, old, new, 0, 0, 0, True, force)
    needed = source.closure(new)
    if not force:
        problem = source.fast_forward_problem(old, new)
        if problem:
            raise NotFastForward(f"not a fast-forward of thread {thread!r} at {target.url}: "
                                 f"{problem}; nothing was changed (use --force to replace it)")
    missing: list[Digest] = []
    for start in range(0, len(needed), HAS_MANY_BATCH):
        batch = [digest for digest, _ in needed[start:start + HAS_MANY_BATCH]]
        present = target.has_many(batch)
        missing.extend(d for d in batch if d.raw not in present)
    if check_outgoing is not None:
        kinds = dict((digest.raw, kind) for digest, kind in needed)
        check_outgoing([(digest, kinds[digest.raw]) for digest in missing])

    def checked_stream() -> Iterator[tuple[Digest, bytes]]:
        expected = iter(missing)
        done = 0
        for digest, framed in source.get_objects(missing):
            if digest != next(expected, None):
                raise CorruptTransfer(f"{source.url} sent object {digest.hex()}, which was not "
                                      "asked for; nothing was changed")
            yield digest, framed
            done += 1
            if progress is not None:
                progress(done, len(missing))
        if next(expected, None) is not None:
            raise CorruptTransfer(f"{source.url} sent {done} of {len(missing)} objects; "
                                  "nothing was changed")

    with target.receiving(f"{action} {thread}"):
        count, size = target.put_objects(checked_stream())
        target.compare_and_swap_ref(thread, old, new, not force, action, message)
    return TransferResult(thread, old, new, len(needed), count, size, False, force)
