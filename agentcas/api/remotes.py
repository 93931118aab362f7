"""`store.remotes`: other stores to push threads to and pull them from, and bundles.

The remote table, the transfer protocol and the bundle format are exchange/'s; this
group opens the other store (refusing this store itself) and shapes the results.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import TYPE_CHECKING

from agentcas.api.results import BundleCheck, BundleExport, BundleImport, RemoteAdded, RemoteRemoved, TransferResult
from agentcas.cas import framing
from agentcas.cas.lmdb_store import StoreUnavailable
from agentcas.errors import ConflictError, UsageError
from agentcas.refs.names import check_thread_name

if TYPE_CHECKING:
    from agentcas.api import Progress
    from agentcas.cas.digest import Digest
    from agentcas.exchange import transfer
    from agentcas.exchange.remote import Remote
    from agentcas.exchange.transfer import LocalStoreEndpoint
    from agentcas.refs.threads import ThreadState
    from agentcas.repository import Store


class Remotes:
    """Remotes, push and pull, bundles (`store.remotes`)."""

    def __init__(self, store: Store):
        self._store = store
        self._backends = store.backends

    # -- the remote table ------------------------------------------------------------------------
    def add(self, name: str, url: str, refs: str | None = None) -> RemoteAdded:
        """Record another agentcas store as remote `name`; it must not be this store.

        `url` is a path, file:// URL or s3://BUCKET/PREFIX; an s3:// remote needs `refs`
        (postgresql://..., without a password). A path that does not exist, or an empty
        directory, gets an empty store made there (like `git init --bare` then `git remote
        add`); a directory holding anything else must be a store.
        """
        from agentcas.exchange import remote as remote_table
        remote_table.check_remote_name(name)
        url = remote_table.normalise_url(url)
        refs = remote_table.check_refs_dsn(refs, url)
        remote = remote_table.Remote(name, url, refs)
        if not remote.shared and remote_table.absent_or_empty(remote.path):
            with self._backends.meta.reader() as txn:  # refused before a store is made for it
                if any(r.name == name for r in remote_table.list_remotes(txn)):
                    raise ConflictError(f"remote {name!r} already exists (remove it first)")
        with remote_table.store_made_for(remote) as made:  # whole or nothing: it goes if the add fails
            self._open(remote)  # refused unless it opens as a store (not this one)
            added = self._backends.meta.write(lambda txn: remote_table.add_remote(txn, name, url, refs))
        return RemoteAdded(added, made)

    def list(self) -> list[Remote]:
        """Every remote, by name."""
        from agentcas.exchange import remote as remote_table
        with self._backends.meta.reader() as txn:
            return list(remote_table.list_remotes(txn))

    def remove(self, name: str) -> RemoteRemoved:
        """Forget remote `name` (the remote store itself is untouched)."""
        from agentcas.exchange import remote as remote_table
        return RemoteRemoved(self._backends.meta.write(lambda txn: remote_table.remove_remote(txn, name)))

    def _open(self, remote: Remote) -> Store:
        from agentcas.repository import Store
        if remote.shared:
            if self._store.url == remote.url:
                raise UsageError(f"remote {remote.name!r} ({remote.url}) is this store itself")
            location, refs = remote.url, remote.refs
        else:
            location, refs = remote.path, None
            if self._store.path is not None and os.path.realpath(location) == os.path.realpath(self._store.path):
                raise UsageError(f"remote {remote.name!r} ({remote.url}) is this store itself")
        try:
            return Store.open(location, refs=refs)
        except StoreUnavailable as exc:
            raise StoreUnavailable(f"remote {remote.name!r}: {exc}") from None

    def _endpoints(self, name: str) -> tuple[Remote, LocalStoreEndpoint, LocalStoreEndpoint]:
        """(remote, local endpoint, remote endpoint) for a push or pull."""
        from agentcas.exchange import remote as remote_table
        from agentcas.exchange.transfer import LocalStoreEndpoint
        with self._backends.meta.reader() as txn:
            remote = remote_table.read_remote(txn, name)
        other = self._open(remote)
        path = self._store.path
        here = LocalStoreEndpoint(self._backends, "file://" + path if path else self._store.url)
        return remote, here, LocalStoreEndpoint(other.backends, remote.url)

    # -- push and pull ---------------------------------------------------------------------------
    def push(self, remote: str, thread: str, force: bool = False, progress: Progress | None = None,
             allow_rollout_secrets: bool = False, allow_secrets: Iterable[str] = ()) -> TransferResult:
        """Send THREAD to the remote: missing objects, then its ref by compare-and-swap.

        The rollout segments the remote lacks are scanned for secrets first (refused
        naming thread, seq and rule unless `allow_rollout_secrets`), and so are the reasons
        and file names of the checkpoints and trees it sends (unless `allow_secrets` globs)."""
        from agentcas.exchange.secret_scan import refuse_name_secrets, refuse_rollout_secrets
        from agentcas.exchange.transfer import transfer
        check_thread_name(thread)
        info, here, there = self._endpoints(remote)

        def check_outgoing(objects: list[tuple[Digest, int]]) -> None:
            with self._backends.source.reading() as source:
                refuse_rollout_secrets(source, [d for d, kind in objects if kind == framing.KIND_SEGMENT], thread,
                                       "push", "nothing was sent", allow_rollout_secrets,
                                       private_keys_always=False)
                refuse_name_secrets(source, objects, "push", "nothing was sent", allow_secrets)

        result = transfer(here, there, thread, force, "push", f"push from {here.url}", progress,
                          check_outgoing)
        return _transfer_result("push", info, result)

    def pull(self, remote: str, thread: str, force: bool = False,
             progress: Progress | None = None) -> TransferResult:
        """Fetch THREAD from the remote into this store (creating the thread if absent)."""
        from agentcas.exchange.transfer import transfer
        check_thread_name(thread)
        info, here, there = self._endpoints(remote)
        result = transfer(there, here, thread, force, "pull", f"pull from {info.name} ({info.url})",
                          progress)
        return _transfer_result("pull", info, result)

    # -- bundles ---------------------------------------------------------------------------------
    def export_bundle(self, rev: str, out_path: str, key_file: str | None = None,
                      allow_secrets: Iterable[str] = (), progress: Progress | None = None,
                      allow_rollout_secrets: bool = False) -> BundleExport:
        """Write checkpoint `rev` (ancestry, files, history) as one bundle file, optionally signed."""
        from agentcas.exchange import bundle
        from agentcas.signing import keys
        key = keys.load_signing_key(key_file) if key_file else None
        digest, thread = self._store.trust.signing_thread(rev)
        return BundleExport(**bundle.export_bundle(self._backends, digest, thread, out_path, key, allow_secrets,
                                                   progress, allow_rollout_secrets=allow_rollout_secrets))

    def verify_bundle(self, path: str, progress: Progress | None = None) -> BundleCheck:
        """Verify a bundle completely: every hash, the closure, the length, the signatures."""
        from agentcas.exchange import bundle
        return BundleCheck(bundle.verify_bundle(self._backends, path, progress))

    def import_bundle(self, path: str, as_thread: str | None = None, allow_unsigned: bool = False,
                      allow_rollback: bool = False, progress: Progress | None = None) -> BundleImport:
        """Verify a bundle completely, then land it as a new thread or a fast-forward."""
        from agentcas.exchange import bundle
        return BundleImport(bundle.import_bundle(self._backends, path, as_thread, allow_unsigned, allow_rollback,
                                                 progress))


def _transfer_result(direction: str, remote: Remote, result: transfer.TransferResult) -> TransferResult:
    """The report of a push or pull."""
    def checkpoint(state: ThreadState | None) -> str | None:
        return None if state is None or state.checkpoint is None else state.checkpoint.hex()
    return TransferResult(direction, remote.name, remote.url, result.thread, checkpoint(result.old),
                          checkpoint(result.new), None if result.old is None else result.old.history.seq,
                          result.new.history.seq, result.objects_total, result.up_to_date, result.forced,
                          result.objects, result.bytes)
