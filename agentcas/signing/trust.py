"""The trust list: named public keys, each allowed to sign for named namespaces.

Like ssh's allowed_signers: a signature counts only if its key is listed here for the
namespace it signs in. Rows live in the `trust` table, key = signer name (UTF-8),
value = sealed canonical JSON {name, public_key (hex), key_id, namespaces, added_at}.
Every row is re-checked when read (sealed checksum, key validity), so a damaged or
planted small-order key is refused at use, not only at `trust add`.
"""

from __future__ import annotations

from dataclasses import dataclass

from agentcas.cas import encoding
from agentcas.cas.digest import Digest
from agentcas.cas.metastore.base import MetaTxn
from agentcas.cas.sealed import seal, unseal
from agentcas.cas.source import ObjectSource
from agentcas.errors import ConflictError, IntegrityError, NotFound
from agentcas.signing.envelope import (
    NAMESPACE_CHECKPOINT,
    Verdict,
    check,
    check_namespace,
    envelopes_for,
    summarize,
    utc_now,
)
from agentcas.signing.keys import BadKey, PublicKey, check_key_name

MAX_NAMESPACES = 32


@dataclass(frozen=True)
class TrustEntry:
    name: str
    public_key: PublicKey
    namespaces: tuple[str, ...]
    added_at: str

    def to_json(self) -> dict:
        """The JSON the CLI prints for it (the same as its stored document)."""
        return self.to_doc()

    def to_doc(self):
        return {"name": self.name, "public_key": self.public_key.raw.hex(), "key_id": self.public_key.id,
                "namespaces": list(self.namespaces), "added_at": self.added_at}

    @classmethod
    def from_doc(cls, doc) -> TrustEntry:
        return cls(doc["name"], PublicKey(bytes.fromhex(doc["public_key"])), tuple(doc["namespaces"]),
                   doc["added_at"])


def _key(name: str) -> bytes:
    return name.encode("utf-8")


def _decode(key: bytes, value) -> TrustEntry:
    payload = unseal("trust", key, value)
    try:
        return TrustEntry.from_doc(encoding.decode(payload))
    except BadKey as exc:
        raise IntegrityError(f"trusted key {key.decode('utf-8', 'replace')!r} is refused: {exc}") from None
    except (KeyError, TypeError, ValueError) as exc:
        raise IntegrityError(f"trust entry {key.decode('utf-8', 'replace')!r} is malformed: {exc}") from None


def list_trusted(txn: MetaTxn) -> list[TrustEntry]:
    return [_decode(bytes(key), value) for key, value in txn.scan("trust")]


def put_entry(txn: MetaTxn, entry: TrustEntry) -> None:
    """Write a row as is (callers check first; tests use it to plant rows)."""
    key = _key(entry.name)
    doc = {"name": entry.name, "public_key": entry.public_key.raw.hex(),
           "key_id": entry.public_key.id, "namespaces": list(entry.namespaces), "added_at": entry.added_at}
    txn.put("trust", key, seal("trust", key, encoding.encode(doc)))


def add(txn: MetaTxn, name: str, public_key: PublicKey, namespaces=()) -> TrustEntry:
    """Trust `public_key` as `name` for `namespaces` (default: checkpoints).

    Re-adding the same key under the same name replaces its namespaces; a different
    key under an existing name is a conflict (remove it first).
    """
    check_key_name(name)
    spaces = tuple(sorted(set(check_namespace(n) for n in (namespaces or (NAMESPACE_CHECKPOINT,)))))
    if len(spaces) > MAX_NAMESPACES:
        raise ConflictError(f"at most {MAX_NAMESPACES} namespaces per signer")
    value = txn.get("trust", _key(name))
    if value is not None:
        old = _decode(_key(name), value)
        if old.public_key != public_key:
            raise ConflictError(f"signer {name!r} is already trusted with another key ({old.public_key.id}); "
                                f"run 'agentcas trust remove {name}' first")
    entry = TrustEntry(name, public_key, spaces, utc_now())
    put_entry(txn, entry)
    return entry


def remove(txn: MetaTxn, name: str) -> TrustEntry:
    check_key_name(name)
    value = txn.get("trust", _key(name))
    if value is None:
        raise NotFound(f"no trusted signer named {name!r}")
    entry = _decode(_key(name), value)
    txn.delete("trust", _key(name))
    return entry


def verify_signatures(txn: MetaTxn, objects: ObjectSource, checkpoint: Digest, thread: str,
                      also: str | None = None) -> tuple[str, str, list[Verdict]]:
    """The stored signatures of `checkpoint` checked against the trusted signers, each for
    `thread` (or for `also`, another thread the checkpoint is accepted under, when it names
    that one): (status, reason, verdicts), as `envelope.summarize` gives them."""
    trusted = list_trusted(txn)
    accepted = {thread} if also is None else {thread, also}
    verdicts = [check(e, trusted, checkpoint, e.statement.thread if e.statement.thread in accepted else thread)
                for _, e in envelopes_for(txn, objects, checkpoint)]
    status, reason = summarize(verdicts)
    return status, reason, verdicts
