"""The LMDB implementation of TableEnvironment: one environment per store per process.

Each table is a named sub-database. Writers are serialised by LMDB's lock across
processes; readers never block. When the map is full the write is aborted, the map
doubled and the write run again; when another process grew the map we adopt its
size. Stale reader slots of dead processes are cleared when the store is opened.

Resizing the map invalidates every open transaction of the environment (py-lmdb) and
must not overlap one, but snapshot and restore read from worker threads while the main
thread writes. So every transaction holds a shared `_ResizeGate`; a resize takes it
alone, waiting for the other threads' transactions to finish (new ones wait for it).
"""

from __future__ import annotations

import errno
import os
import threading
from contextlib import contextmanager
from typing import Any

import lmdb

from agentcas.cas import crashpoints, fatal_signals
from agentcas.cas.packs import TABLES as PACK_TABLES
from agentcas.cas.store import TABLES, TableEnvironment, TableTxn
from agentcas.cas.system_errors import from_errno, from_os_error
from agentcas.errors import AgentcasError, IntegrityError

# The map is address space, not disk: the data file grows only as pages are used. A
# large first map spares the first big commit its MapFullError retries (each one
# aborts and redoes a whole 64 MiB batch). Under an address-space limit (ulimit -v)
# the map is halved until it fits, down to MIN_MAP_SIZE; it grows again when full.
INITIAL_MAP_SIZE = int(os.environ.get("AGENTCAS_LMDB_MAP_SIZE", str(16 << 30)))
MIN_MAP_SIZE = 1 << 30
DATA_FILE = "data.mdb"

_OPEN: dict[str, LmdbEnvironment] = {}
_OPEN_LOCK = threading.Lock()


class StoreUnavailable(AgentcasError):
    """The store directory cannot be opened (missing, not a store, read-only...)."""


class StoreCorrupt(IntegrityError):
    """The LMDB file itself is damaged (LMDB found a page it cannot use)."""


# What LMDB raises when a page it reads is not what the tree says it should be (a damaged
# root or branch page can also fail the whole transaction: MDB_BAD_TXN, MDB_BAD_DBI).
CORRUPTION = (lmdb.CorruptedError, lmdb.PageNotFoundError, lmdb.BadDbiError, lmdb.PanicError,
              lmdb.BadTxnError)


def corrupt_store(exc: BaseException, path: str | None = None) -> StoreCorrupt:
    """The one wording of an LMDB corruption error met anywhere in a store."""
    where = f" (store at {path})" if path else ""
    return StoreCorrupt(f"store database is corrupt: {exc}{where}; run 'agentcas fsck' to see what is damaged")


class StoreUnreadable(StoreUnavailable):
    """LMDB itself cannot open the store's database file (damaged, or not an LMDB file).

    An error like any other store that will not open (exit 1), except for the commands
    whose job is the store's integrity (gc, fsck): to them it is corruption (exit 4).
    """


def lmdb_errno(exc: BaseException) -> int | None:
    """The errno behind an LMDB exception (its own classes, or the OS text it carries)."""
    if isinstance(exc, OSError):
        return exc.errno
    if isinstance(exc, lmdb.DiskError):
        return errno.ENOSPC
    if isinstance(exc, lmdb.MemoryError):
        return errno.ENOMEM
    text = str(exc)
    for code in (errno.EIO, errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM,
                 errno.ENOMEM, errno.EFBIG, errno.EMFILE, errno.ENFILE):
        if text.endswith(os.strerror(code)) or f": {os.strerror(code)}" in text:
            return code
    if isinstance(exc, lmdb.ReadonlyError):
        return errno.EACCES
    return None


def store_failure(exc: BaseException, path: str, doing: str = "writing",
                  outcome: str = "nothing was changed") -> AgentcasError:
    """The one translation of an OS or LMDB error met on a store into a clear error:
    "no space left on device writing the store at PATH; nothing was changed"."""
    if isinstance(exc, CORRUPTION):
        return corrupt_store(exc, path)
    code = lmdb_errno(exc)
    if code == errno.EIO and _nearly_full(path):
        # LMDB turns a short write (what a full disk gives) into EIO: report the cause.
        code = errno.ENOSPC
    if code is None:
        return StoreUnavailable(f"{doing} the store at {path} failed: {exc}; {outcome}")
    return from_errno(code, f"{doing} the store at {path}", outcome, detail=str(exc))


def _nearly_full(path: str) -> bool:
    """Whether the file system holding `path` has less than 1 MiB (or 0.1%) free."""
    try:
        st = os.statvfs(path)
    except OSError:
        return False
    free = st.f_bavail * st.f_frsize
    return free < max(1 << 20, st.f_blocks * st.f_frsize // 1000)


def _read_only_errno(path: str) -> int:
    """EROFS if `path` is on a read-only mount, else EACCES (permissions)."""
    try:
        return errno.EROFS if os.statvfs(path).f_flag & os.ST_RDONLY else errno.EACCES
    except OSError:
        return errno.EACCES


class _ResizeGate:
    """Shared by transactions, exclusive for a map resize (threads of one process)."""

    WAIT_SECONDS = 60.0

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._holders: dict[int, int] = {}  # thread id -> open transactions
        self._resizing = False

    @contextmanager
    def shared(self):
        me = threading.get_ident()
        with self._cond:
            # A thread that already holds a transaction may nest another (never wait on itself).
            while self._resizing and not self._holders.get(me):
                self._cond.wait()
            self._holders[me] = self._holders.get(me, 0) + 1
        try:
            yield
        finally:
            with self._cond:
                self._holders[me] -= 1
                if not self._holders[me]:
                    del self._holders[me]
                self._cond.notify_all()

    @contextmanager
    def exclusive(self):
        me = threading.get_ident()
        with self._cond:
            while self._resizing:
                self._cond.wait()
            self._resizing = True
            try:
                others = lambda: any(thread != me for thread in self._holders)  # noqa: E731
                if not self._cond.wait_for(lambda: not others(), timeout=self.WAIT_SECONDS):
                    raise StoreUnavailable("cannot grow the store's map: transactions of other "
                                           "threads did not finish")
            except BaseException:
                self._resizing = False
                self._cond.notify_all()
                raise
        try:
            yield
        finally:
            with self._cond:
                self._resizing = False
                self._cond.notify_all()


# Writes to these tables need not survive a power cut on their own: objects are
# re-checked before the ref move that references them, and the cache and leases are hints.
_NOT_DURABLE = frozenset(("objects", "statcache", "leases") + PACK_TABLES)


class _LmdbTxn(TableTxn):
    def __init__(self, txn: lmdb.Transaction, dbs: dict):
        self._txn = txn
        self._dbs = dbs
        self.durable = False  # set when a ref-like table changes: then flush the meta page

    def get(self, table, key, for_update=False):
        db = self._dbs[table]
        return None if db is None else self._txn.get(key, db=db)

    def scan(self, table, prefix=b"", start=None, reverse=False):
        if self._dbs[table] is None:  # a table a read-only older store does not have
            return
        cursor = self._txn.cursor(db=self._dbs[table])
        if not reverse:
            # A start before the prefix means "from the prefix's first key".
            first = prefix if start is None or start < prefix else start
            if not cursor.set_range(first):
                return
            for key, value in cursor.iternext():
                if prefix and not bytes(key).startswith(prefix):  # a memoryview with buffers=True
                    return
                yield key, value
            return
        # Descending: position at the last key <= start (or <= the prefix's end).
        bound = start if start is not None else _prefix_end(prefix)
        if bound is None:
            positioned = cursor.last()
        elif cursor.set_range(bound):
            positioned = True if cursor.key() == bound and start is not None else cursor.prev()
        else:
            positioned = cursor.last()
        if not positioned:
            return
        for key, value in cursor.iterprev():
            if prefix and not bytes(key).startswith(prefix):
                if key < prefix:
                    return
                continue
            yield key, value

    def put(self, table, key, value):
        self.durable = self.durable or table not in _NOT_DURABLE
        self._txn.put(key, value, db=self._dbs[table])

    def append(self, table, key, value):
        self.durable = self.durable or table not in _NOT_DURABLE
        # MDB_APPEND: a page that fills is left full (a plain insert splits it in half).
        if not self._txn.put(key, value, append=True, db=self._dbs[table]):
            self._txn.put(key, value, db=self._dbs[table])

    def put_new(self, table, key, value):
        self.durable = self.durable or table not in _NOT_DURABLE
        return self._txn.put(key, value, overwrite=False, db=self._dbs[table])

    def delete(self, table, key):
        self.durable = self.durable or table not in _NOT_DURABLE
        return self._txn.delete(key, db=self._dbs[table])

    def count(self, table):
        db = self._dbs[table]
        return 0 if db is None else self._txn.stat(db)["entries"]


def _commit_failure(code: int) -> lmdb.Error:
    """What py-lmdb raises when a commit's write fails with `code` (for injected faults)."""
    return (lmdb.DiskError if code == errno.ENOSPC else lmdb.Error)(f"mdb_txn_commit: {os.strerror(code)}")


def _sync_failure(code: int) -> lmdb.Error:
    """What py-lmdb raises when the fsync after a commit fails with `code`."""
    return (lmdb.DiskError if code == errno.ENOSPC else lmdb.Error)(f"mdb_env_sync: {os.strerror(code)}")


def _prefix_end(prefix: bytes) -> bytes | None:
    """The smallest key greater than every key starting with `prefix` (None: no bound)."""
    trimmed = prefix.rstrip(b"\xff")
    if not trimmed:
        return None
    return trimmed[:-1] + bytes([trimmed[-1] + 1])


def leaf_value_limit(page_size: int) -> int:
    """The largest value (with an 8-byte key) LMDB keeps inside a leaf page: a node may take
    half a page less the page header (16 bytes), its own header (8) and pointer (2)."""
    return ((page_size - 16) // 2 & ~1) - 2 - 8 - 8 - 6  # 2016 for 4 KiB pages, 6 spare


def _may_write(path: str) -> bool:
    """Writable for us, and not made read-only by its owner: root ignores permission
    bits, but a store someone ran `chmod a-w` on is meant to be read-only even so."""
    try:
        return os.access(path, os.W_OK) and bool(os.stat(path).st_mode & 0o222)
    except OSError:
        return False


# LMDB maps its lock file (16.5 KiB for 256 readers) after growing it with ftruncate, which
# allocates nothing: on a full file system the first write through the map is a SIGBUS. So
# a new store's lock file is written out first, with real zeros, where ENOSPC is an error.
LOCK_FILE, LOCK_FILE_BYTES = "lock.mdb", 32 << 10


def _allocate_lock_file(path: str) -> None:
    """Write a new store's lock file in full (no-op if it exists); ENOSPC raises OSError."""
    lock_path = os.path.join(path, LOCK_FILE)
    try:
        handle = os.open(lock_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(bytes(LOCK_FILE_BYTES))
            out.flush()
            os.fsync(out.fileno())
    except OSError:
        os.unlink(lock_path)
        raise


class LmdbEnvironment(TableEnvironment):
    def __init__(self, path: str, create: bool = False, map_size: int | None = None):
        self.path = os.path.abspath(path)
        self.map_size = INITIAL_MAP_SIZE if map_size is None else map_size
        self.url = "lmdb://" + self.path
        self.readonly = False
        self._write_lock = threading.Lock()
        self._gate = _ResizeGate()
        self.env = self._open_env(create)
        self.env.reader_check()
        self.leaf_bytes = leaf_value_limit(self.env.stat()["psize"])
        self.dbs: dict[str, Any] = {}  # table -> its handle (None: a table newer than a read-only store)
        if self.readonly:
            # Not inside an explicit read transaction: handles opened there die with it
            # (every later get() fails with EINVAL); py-lmdb's own transaction keeps them.
            for name in TABLES:
                try:
                    self.dbs[name] = self.env.open_db(name.encode(), create=False)
                except lmdb.NotFoundError:
                    self.dbs[name] = None  # a table newer than the store: read as empty
        else:
            try:
                with self.env.begin(write=True) as txn:
                    for name in TABLES:
                        self.dbs[name] = self.env.open_db(name.encode(), txn=txn, create=True)
            except lmdb.Error as exc:
                if lmdb_errno(exc) is None:
                    raise
                self.env.close()
                raise store_failure(exc, self.path, "opening") from None

    def _open_env(self, create: bool) -> lmdb.Environment:
        if os.path.exists(self.path) and not os.path.isdir(self.path):
            raise StoreUnavailable(f"store path is a file, not a directory: {self.path}")
        if not create and not os.path.exists(os.path.join(self.path, DATA_FILE)):
            raise StoreUnavailable(f"not an agentcas store (no {DATA_FILE}): {self.path}")
        if create:
            try:
                os.makedirs(self.path, exist_ok=True)
                _allocate_lock_file(self.path)
            except OSError as exc:
                raise from_os_error(exc, f"creating a store in {self.path}", "nothing was created") from None
        fatal_signals.opened(self.path)
        # metasync=False (MDB_NOMETASYNC): each commit still fsyncs its data pages, but not
        # the meta page; LMDB keeps integrity and a power cut can undo only the last
        # commit. Batches of objects need no more; a transaction that moves a ref (or
        # any other durable table) is followed by env.sync(), so it is durable on return.
        options = dict(map_size=self.map_size, subdir=True, max_dbs=len(TABLES) + 2,
                       readahead=False, meminit=False, max_readers=256, create=create,
                       metasync=False)
        writable = _may_write(self.path) and (create or _may_write(os.path.join(self.path, DATA_FILE)))
        try:
            if writable:
                return self._open_fitting(options)
        except lmdb.Error as exc:
            code = lmdb_errno(exc)
            if create and code is not None:
                raise store_failure(exc, self.path, "creating", "nothing was created") from None
            if code not in (errno.EACCES, errno.EROFS, errno.EPERM) \
                    and "ermission" not in str(exc) and "ead-only" not in str(exc):
                raise StoreUnreadable(f"cannot open store {self.path}: {exc}") from None
        if create:
            raise from_errno(_read_only_errno(self.path), f"creating a store in {self.path}",
                             "nothing was created")
        self.readonly = True
        try:
            return self._open_fitting(dict({k: v for k, v in options.items() if k != "create"},
                                           readonly=True, lock=False))
        except lmdb.Error as exc:
            raise StoreUnreadable(f"cannot open store {self.path}: {exc}") from None

    def _open_fitting(self, options: dict) -> lmdb.Environment:
        """lmdb.open, halving the map while the address space cannot hold it."""
        while True:
            try:
                return lmdb.open(self.path, **options)
            except lmdb.MemoryError:
                if options["map_size"] <= MIN_MAP_SIZE:
                    raise
                options["map_size"] = max(MIN_MAP_SIZE, options["map_size"] // 2)
                self.map_size = options["map_size"]

    @contextmanager
    def reader(self, buffers: bool = False):
        while True:
            with self._gate.shared():
                try:
                    txn = self.env.begin(buffers=buffers)  # type: ignore[call-overload]  # the stubs miss `buffers`
                except lmdb.MapResizedError:
                    txn = None  # another process grew the map: adopt its size, then retry
                except lmdb.Error as exc:
                    raise store_failure(exc, self.path, "reading", "nothing was changed") from None
                if txn is not None:
                    try:
                        yield _LmdbTxn(txn, self.dbs)
                    finally:
                        txn.abort()
                    return
            self._resize(0)

    def _resize(self, size: int) -> None:
        """Set the map size (0: adopt the size on disk) with no transaction open."""
        with self._gate.exclusive():
            try:
                self.env.set_mapsize(size)
            except lmdb.MemoryError:
                raise from_errno(errno.ENOMEM, f"growing the map of the store at {self.path} to {size} bytes "
                                 "(the store is full for this address space: ulimit -v?)",
                                 "nothing was changed") from None

    def write(self, fn):
        if self.readonly:
            raise StoreUnavailable(f"store is read-only: {self.path}")
        with self._write_lock:
            while True:
                try:
                    with self._gate.shared():
                        with self.env.begin(write=True) as txn:
                            wrapped = _LmdbTxn(txn, self.dbs)
                            result = fn(wrapped)
                            crashpoints.reached("store.open", _commit_failure)
                        if wrapped.durable:
                            self._sync()
                        crashpoints.reached("store.commit", _sync_failure)
                        return result
                except lmdb.MapFullError:
                    self._resize(self.env.info()["map_size"] * 2)
                except lmdb.MapResizedError:
                    self._resize(0)
                except lmdb.ReadonlyError:
                    raise StoreUnavailable(f"store is read-only: {self.path}") from None
                except (lmdb.Error, OSError) as exc:
                    # The transaction was aborted (LMDB commits all or nothing): say what the
                    # machine refused, once, here, for every write of every command.
                    raise store_failure(exc, self.path) from None

    def _sync(self) -> None:
        """Flush a committed transaction; a failure here cannot undo it, so say so."""
        try:
            self.env.sync(True)
        except (lmdb.Error, OSError) as exc:
            raise store_failure(exc, self.path, "flushing",
                                "the last change is stored but may not survive a crash") from None

    def used_bytes(self):
        return (self.env.info()["last_pgno"] + 1) * self.env.stat()["psize"]

    def close(self):
        with _OPEN_LOCK:
            if _OPEN.get(self.path) is self:
                del _OPEN[self.path]
        self.env.close()


def open_lmdb(path: str, create: bool = False, map_size: int | None = None) -> LmdbEnvironment:
    """The process's one environment for the store at `path` (LMDB forbids two).

    `map_size` (default $AGENTCAS_LMDB_MAP_SIZE or 16 GiB) is the initial map; it grows.
    """
    key = os.path.abspath(path)
    with _OPEN_LOCK:
        store = _OPEN.get(key)
        if store is None:
            try:
                store = LmdbEnvironment(key, create=create, map_size=map_size)
            except lmdb.Error as exc:
                raise StoreUnreadable(f"cannot open store {key}: {exc}") from None
            _OPEN[key] = store
        return store
