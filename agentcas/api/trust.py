"""`store.trust`: the signers this store trusts, and signatures over its checkpoints.

Keys, trust rows and envelopes are signing/'s; this group loads the key files, finds
the thread a signature binds, and stores or checks the envelopes.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from agentcas.api.results import SignResult, TrustRemoved, VerifyResult
from agentcas.cas.digest import Digest
from agentcas.refs import revisions

if TYPE_CHECKING:
    from agentcas.repository import Store
    from agentcas.signing.trust import TrustEntry


class Trust:
    """Trusted signers and checkpoint signatures (`store.trust`)."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._backends = store.backends

    def add(self, name: str, public_key_file: str, namespaces: Iterable[str] = ()) -> TrustEntry:
        """Trust the key in `public_key_file` as signer `name` for `namespaces`."""
        from agentcas.signing import keys, trust
        public = keys.load_public_key(public_key_file)
        return self._backends.meta.write(lambda txn: trust.add(txn, name, public, namespaces))

    def list(self) -> list[TrustEntry]:
        """Every trusted signer, by name."""
        from agentcas.signing import trust
        with self._backends.meta.reader() as txn:
            return list(trust.list_trusted(txn))

    def remove(self, name: str) -> TrustRemoved:
        """Stop trusting signer `name`."""
        from agentcas.signing import trust
        return TrustRemoved(self._backends.meta.write(lambda txn: trust.remove(txn, name)))

    def signing_thread(self, rev: str) -> tuple[Digest, str]:
        """The checkpoint `rev` names and the thread a signature binds: the thread named, else its own."""
        digest, cp = self._store.checkpoints.get(rev)
        with self._backends.meta.reader() as txn:
            return digest, revisions.named_thread(txn, rev) or cp.thread

    def sign(self, rev: str, key_file: str) -> SignResult:
        """Store a signature by the key in `key_file` over checkpoint `rev`."""
        from agentcas.signing import envelope, keys
        key = keys.load_signing_key(key_file)
        digest, thread = self.signing_thread(rev)
        signed, envelope_id = envelope.store_signature(self._backends, key, digest, thread)
        return SignResult(digest.hex(), thread, envelope_id.hex(), key.public.id, signed.statement.signed_at,
                          signed.statement.namespace)

    def verify(self, rev: str) -> VerifyResult:
        """Check the stored signatures of checkpoint `rev`; raise unless a trusted one verifies.

        The thread a signature must name: the thread given as REV, else the checkpoint's
        own (as `sign` binds it); a signature made for another thread is invalid here.
        A thread that an import landed at this checkpoint also accepts the bundle's thread
        (`import --as NEW` keeps the signer's thread name, recorded in `imports`).
        """
        from agentcas.exchange.bundle import SignatureRejected, read_import
        from agentcas.refs.names import is_thread_name
        from agentcas.signing import envelope, trust
        digest, thread = self.signing_thread(rev)
        with self._backends.meta.reader() as txn:
            imported = read_import(txn, thread) if is_thread_name(thread) else None
            also = imported["thread"] if imported is not None and imported["checkpoint"] == digest.hex() else None
            status, reason, verdicts = trust.verify_signatures(txn, self._backends.source, digest, thread, also)
        if status != envelope.VALID:
            raise SignatureRejected(status, f"checkpoint {digest.short()}: signature {status}: {reason}")
        return VerifyResult(digest.hex(), thread, status, reason, True, [v.to_json() for v in verdicts])
