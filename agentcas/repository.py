"""`Store`: the Python API of agentcas, the same surface the CLI uses.

A thin front, split by concern as iroh-blobs splits its API: `Store` opens the storage
a URL names (cas/backends.py), checks the format record (cas/store_format.py) and
resolves revisions; everything else is a small group object over the layers that own
the work (agentcas/api/):

    store.threads      list, create, delete, fork, revert; log, reflog, lineage
    store.history      append records to a thread's history, read them back
    store.checkpoints  commit, show, files, diff, checkout, scan
    store.effects      the external-effects ledger (add, list, open effects after a target;
                       lineage/effects_ledger.py's EffectsLedger, not a group in api/)
    store.gc           plan, execute, explain, fsck
    store.trust        trusted signers, sign, verify
    store.remotes      remotes, push, pull, bundles
    store.sessions     harness sessions: a workspace and a session's new lines in one move (hooks)

Results are typed (agentcas/api/results.py); each has `to_json()`, the CLI's --json.
"""

from __future__ import annotations

import functools
import os
from typing import TYPE_CHECKING

from agentcas.cas.backends import (
    STORE_KEY,
    Backends,
    StoreAddress,
    claim_prefix,
    embedded_backends,
    mark_prefix,
    memory_backends,
    parse_store_url,
    shared_backends,
)
from agentcas.cas.digest import Digest
from agentcas.cas.lmdb_store import StoreUnavailable, open_lmdb
from agentcas.cas.metastore.base import Read
from agentcas.cas.source import ObjectSource
from agentcas.cas.store_format import check_format, init_embedded, token_key, write_format

if TYPE_CHECKING:
    from agentcas.api.checkpoints import Checkpoints
    from agentcas.api.gc import Gc
    from agentcas.api.history import Histories
    from agentcas.api.remotes import Remotes
    from agentcas.api.sessions import Sessions
    from agentcas.api.threads import Threads
    from agentcas.api.trust import Trust
    from agentcas.lineage.effects_ledger import EffectsLedger

STORE_DIR = ".agentcas"


def find_store(start: str | None = None) -> str | None:
    """The nearest ./.agentcas from `start` upward, or None."""
    here = os.path.abspath(start or os.getcwd())
    while True:
        candidate = os.path.join(here, STORE_DIR)
        if os.path.isdir(candidate):
            return candidate
        parent = os.path.dirname(here)
        if parent == here:
            return None
        here = parent


class Store:
    """An agentcas store: checkpoints, threads and histories over a blob and a metadata store."""

    def __init__(self, backends: Backends, path: str | None = None):
        self.backends = backends
        self.path = path
        self.url = backends.url
        self.blobs = backends.blobs
        self.meta = backends.meta
        self.source: ObjectSource = backends.source
        # The embedded table environment (LMDB or memory), for tools and tests that look
        # at raw tables; None for a shared store.
        self.environment = backends.embedded
        check_format(backends, path or self.url, readonly=getattr(self.environment, "readonly", False))

    # The API's parts are made (and their modules imported) when first used: a hook or a
    # commit uses two or three of them, and importing all (with their result types) cost
    # more than the rest of a small hook's start-up.
    @functools.cached_property
    def history(self) -> Histories:
        from agentcas.api.history import Histories
        return Histories(self)

    @functools.cached_property
    def threads(self) -> Threads:
        from agentcas.api.threads import Threads
        return Threads(self)

    @functools.cached_property
    def checkpoints(self) -> Checkpoints:
        from agentcas.api.checkpoints import Checkpoints
        return Checkpoints(self)

    @functools.cached_property
    def effects(self) -> EffectsLedger:
        from agentcas.lineage.effects_ledger import EffectsLedger
        return EffectsLedger(self.backends, self.history.segments, self.path)

    @functools.cached_property
    def gc(self) -> Gc:
        from agentcas.api.gc import Gc
        return Gc(self)

    @functools.cached_property
    def trust(self) -> Trust:
        from agentcas.api.trust import Trust
        return Trust(self)

    @functools.cached_property
    def remotes(self) -> Remotes:
        from agentcas.api.remotes import Remotes
        return Remotes(self)

    @functools.cached_property
    def sessions(self) -> Sessions:
        from agentcas.api.sessions import Sessions
        return Sessions(self)

    # -- opening ------------------------------------------------------------------------------
    @classmethod
    def init(cls, path: str, refs: str | None = None) -> tuple[Store, bool]:
        """Create a store at `path` (a directory, or s3://... with `refs`); (store, created)."""
        address = parse_store_url(path)
        if address.shared:
            return cls._init_shared(address, refs)
        if address.memory:
            return cls.memory(), True
        assert address.path is not None  # neither shared nor memory: a directory
        backends = init_embedded(address.path)
        if backends is None:
            return cls.open(address.path), False
        return cls(backends, address.path), True

    @classmethod
    def _init_shared(cls, address: StoreAddress, refs: str | None) -> tuple[Store, bool]:
        backends = shared_backends(address.url, refs, create=True)
        try:
            binding = claim_prefix(backends)  # refuses another store's prefix or database first
            created = write_format(backends, binding)
            _, (binding,) = backends.meta.exchange(reads=[Read("meta", STORE_KEY)])
            mark_prefix(backends, binding)
        except BaseException:
            backends.close()
            raise
        return cls(backends, None), created

    @classmethod
    def open(cls, path: str, refs: str | None = None) -> Store:
        """Open the store at `path`: a directory, lmdb://DIR, memory:// or s3://BUCKET/PREFIX (with `refs`)."""
        address = parse_store_url(path)
        if address.memory:
            return cls.memory()
        if address.shared:
            return cls(shared_backends(address.url, refs), None)
        assert address.path is not None  # neither shared nor memory: a directory
        if not os.path.exists(address.path):
            raise StoreUnavailable(f"no store at {address.path} (run 'agentcas init {address.path}')")
        return cls(embedded_backends(open_lmdb(address.path), address.path), address.path)

    @classmethod
    def memory(cls) -> Store:
        """A new empty store in memory (for tests and experiments)."""
        backends = memory_backends()
        write_format(backends)
        return cls(backends, None)

    def close(self) -> None:
        self.backends.close()

    # -- reading ------------------------------------------------------------------------------
    def resolve(self, rev: str) -> Digest:
        """The id of the checkpoint `rev` names (loaded and verified: `checkpoints.get`)."""
        return self.checkpoints.get(rev)[0]

    def token_key(self, purpose: str) -> bytes:
        """A random 32-byte key kept in the store's metadata for `purpose`, made on first use.

        For tokens that a server hands out and must recognise later, from any process on
        this store and across restarts (MCP cursors). It guards against a client that only
        sees the tokens, not against anyone who can read the store itself.
        """
        return token_key(self.meta, purpose)
