"""Signature envelopes: what is signed, how it is stored, how it is checked.

A `Statement` binds namespace, format version, checkpoint id, thread name, signer key
id and time. The signed message is MESSAGE_PREFIX followed by the statement's canonical
JSON, so a signature can never be replayed as one over other bytes (docs/FORMAT.md section 10).
An `Envelope` is the statement, the signer's public key and the 64-byte signature; it is
stored as an object of kind "signature" and indexed in the `signatures` table under
checkpoint raw id (32) + envelope id (32). A key embedded in an envelope is only a hint
of which trusted key to try: `check` verifies with the key from the trust table.
"""

from __future__ import annotations

import datetime
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cryptography.exceptions import InvalidSignature

from agentcas.cas import encoding, framing
from agentcas.cas.digest import Digest, hash_object
from agentcas.cas.metastore.base import MetaTxn
from agentcas.cas.objects import FORMAT_VERSION, InvalidObject
from agentcas.cas.sealed import seal, unseal
from agentcas.cas.source import ObjectSource, load_object
from agentcas.errors import IntegrityError
from agentcas.signing.keys import BadKey, PublicKey, SigningKey, key_id

if TYPE_CHECKING:
    from agentcas.cas.backends import Backends

NAMESPACE_CHECKPOINT = "agentcas-checkpoint-v1"
MESSAGE_PREFIX = b"agentcas signed statement v1\n"
MAX_ENVELOPE_BYTES = 4096
_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", re.ASCII)
_NAMESPACE = re.compile(r"[a-z0-9][a-z0-9.-]{0,63}")
_KEY_ID = re.compile(r"[0-9a-f]{16}")
_SIG = re.compile(r"[0-9a-f]{128}")
_PUB = re.compile(r"[0-9a-f]{64}")


def utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def check_namespace(namespace: str) -> str:
    if not isinstance(namespace, str) or not _NAMESPACE.fullmatch(namespace):
        raise InvalidObject(f"invalid signature namespace {str(namespace)[:70]!r} "
                            "(1..64 of a-z 0-9 . -)")
    return namespace


@dataclass(frozen=True)
class Statement:
    """The signed fields. Every field is required; none may be added without a new namespace."""

    namespace: str
    format: int
    checkpoint: Digest
    thread: str
    key_id: str
    signed_at: str

    FIELDS = ("checkpoint", "format", "key_id", "namespace", "signed_at", "thread")

    def __post_init__(self):
        check_namespace(self.namespace)
        if not isinstance(self.format, int) or isinstance(self.format, bool) or self.format < 1:
            raise InvalidObject("statement format must be a positive integer")
        if not isinstance(self.thread, str) or not 0 < len(self.thread.encode("utf-8", "surrogatepass")) <= 255:
            raise InvalidObject("statement thread must be a name of 1..255 bytes")
        if not isinstance(self.key_id, str) or not _KEY_ID.fullmatch(self.key_id):
            raise InvalidObject("statement key_id must be 16 lowercase hex characters")
        if not isinstance(self.signed_at, str) or not _TIME.fullmatch(self.signed_at):
            raise InvalidObject("statement signed_at must be RFC 3339 UTC with microseconds")

    def to_doc(self):
        return {"namespace": self.namespace, "format": self.format, "checkpoint": self.checkpoint.hex(),
                "thread": self.thread, "key_id": self.key_id, "signed_at": self.signed_at}

    def message(self) -> bytes:
        """The exact bytes the Ed25519 signature covers."""
        return MESSAGE_PREFIX + encoding.encode(self.to_doc())

    @classmethod
    def from_doc(cls, doc) -> Statement:
        if not isinstance(doc, dict) or sorted(doc) != sorted(cls.FIELDS):
            raise InvalidObject(f"a signed statement has exactly the fields {list(cls.FIELDS)}")
        try:
            checkpoint = Digest.parse(doc["checkpoint"])
        except Exception:  # noqa: BLE001 - UsageError from parse: the bytes are at fault here
            raise InvalidObject("statement checkpoint is not a 64-hex id") from None
        return cls(doc["namespace"], doc["format"], checkpoint, doc["thread"], doc["key_id"],
                   doc["signed_at"])


@dataclass(frozen=True)
class Envelope:
    """A statement, the public key that claims to have signed it, and the signature."""

    statement: Statement
    public_key: bytes
    signature: bytes

    KIND = framing.KIND_SIGNATURE

    def __post_init__(self):
        if len(self.public_key) != 32 or len(self.signature) != 64:
            raise InvalidObject("an envelope carries a 32-byte key and a 64-byte signature")

    def to_doc(self):
        return {"statement": self.statement.to_doc(), "public_key": self.public_key.hex(),
                "signature": self.signature.hex()}

    def encode(self) -> bytes:
        return encoding.encode(self.to_doc())

    def digest(self) -> Digest:
        return hash_object("signature", self.encode())

    @classmethod
    def decode(cls, data: bytes) -> Envelope:
        if len(data) > MAX_ENVELOPE_BYTES:
            raise InvalidObject(f"signature envelope larger than {MAX_ENVELOPE_BYTES} bytes")
        doc = encoding.decode(data)
        if not isinstance(doc, dict) or sorted(doc) != ["public_key", "signature", "statement"]:
            raise InvalidObject("a signature envelope has exactly statement, public_key, signature")
        if not isinstance(doc["public_key"], str) or not _PUB.fullmatch(doc["public_key"]):
            raise InvalidObject("envelope public_key must be 64 lowercase hex characters")
        if not isinstance(doc["signature"], str) or not _SIG.fullmatch(doc["signature"]):
            raise InvalidObject("envelope signature must be 128 lowercase hex characters")
        return cls(Statement.from_doc(doc["statement"]), bytes.fromhex(doc["public_key"]),
                   bytes.fromhex(doc["signature"]))


def sign(key: SigningKey, checkpoint: Digest, thread: str, namespace: str = NAMESPACE_CHECKPOINT,
         signed_at: str | None = None) -> Envelope:
    """A signature by `key` over (namespace, format, checkpoint, thread, key id, time)."""
    statement = Statement(namespace, FORMAT_VERSION, checkpoint, thread, key.public.id,
                          signed_at or utc_now())
    return Envelope(statement, key.public.raw, key.sign(statement.message()))


# --- verdicts ---------------------------------------------------------------------------------

VALID, UNTRUSTED, INVALID, ABSENT = "valid", "untrusted", "invalid", "absent"


@dataclass(frozen=True)
class Verdict:
    """The outcome of checking one envelope against the trust table and an expectation."""

    status: str  # valid | untrusted | invalid
    reason: str
    envelope: Envelope
    signer: str | None = None

    def to_json(self):
        st = self.envelope.statement
        return {"status": self.status, "reason": self.reason, "signer": self.signer,
                "key_id": st.key_id, "namespace": st.namespace, "thread": st.thread,
                "checkpoint": st.checkpoint.hex(), "signed_at": st.signed_at}


def check(envelope: Envelope, trusted, checkpoint: Digest, thread: str | None,
          namespace: str = NAMESPACE_CHECKPOINT) -> Verdict:
    """Check `envelope`: trusted signer for `namespace`, valid signature, right checkpoint/thread.

    `trusted` is a list of trust entries (signing.trust.TrustEntry). An envelope whose
    signature fails with its own embedded key is invalid whatever the trust table says;
    one that verifies but whose key is not trusted for `namespace` is untrusted.
    """
    st = envelope.statement
    if key_id(envelope.public_key) != st.key_id:
        return Verdict(INVALID, "statement key id does not match the envelope's key", envelope)
    try:
        embedded = PublicKey(envelope.public_key)
    except BadKey as exc:
        return Verdict(INVALID, f"signer key refused: {exc}", envelope)
    try:
        embedded.verify(envelope.signature, st.message())
    except InvalidSignature:
        return Verdict(INVALID, "signature does not verify (a signed field was changed, or it is forged)",
                       envelope)
    if st.namespace != namespace:
        return Verdict(INVALID, f"signature is for namespace {st.namespace!r}, not {namespace!r}", envelope)
    if st.format > FORMAT_VERSION:
        return Verdict(INVALID, f"signature format {st.format} is newer than this agentcas reads", envelope)
    if st.checkpoint != checkpoint:
        return Verdict(INVALID, f"signature is over checkpoint {st.checkpoint.short()}, not "
                                f"{checkpoint.short()} (moved from another bundle?)", envelope)
    if thread is not None and st.thread != thread:
        return Verdict(INVALID, f"signature is for thread {st.thread!r}, not {thread!r}", envelope)
    matches = [t for t in trusted if t.public_key.raw == envelope.public_key]
    if not matches:
        return Verdict(UNTRUSTED, f"signer key {st.key_id} is not in this store's trust list", envelope)
    allowed = [t for t in matches if namespace in t.namespaces]
    if not allowed:
        return Verdict(UNTRUSTED, f"signer {matches[0].name!r} is not trusted for namespace {namespace!r}",
                       envelope, matches[0].name)
    # Verify once more with the trusted key object itself, not the embedded bytes' parse.
    try:
        allowed[0].public_key.verify(envelope.signature, st.message())
    except InvalidSignature:
        return Verdict(INVALID, "signature does not verify with the trusted key", envelope, allowed[0].name)
    return Verdict(VALID, f"good signature by {allowed[0].name!r} ({st.key_id})", envelope, allowed[0].name)


def summarize(verdicts: list[Verdict]) -> tuple[str, str]:
    """(overall status, one-line reason): valid if any is valid; else invalid > untrusted > absent."""
    if not verdicts:
        return ABSENT, "no signature"
    for status in (VALID, INVALID, UNTRUSTED):
        found = [v for v in verdicts if v.status == status]
        if found:
            return status, found[0].reason
    return ABSENT, "no signature"


# --- the signatures table ---------------------------------------------------------------------

def _row_key(checkpoint: Digest, envelope_id: Digest) -> bytes:
    return checkpoint.raw + envelope_id.raw


def envelope_object(envelope: Envelope) -> tuple[Digest, bytes]:
    """(envelope id, framed object) to store before its index row."""
    return envelope.digest(), framing.frame(framing.KIND_SIGNATURE, envelope.encode())


def save_index_row(txn: MetaTxn, envelope: Envelope, digest: Digest) -> Digest:
    """Record the stored envelope object `digest` under its checkpoint; returns the id."""
    key = _row_key(envelope.statement.checkpoint, digest)
    doc = {"key_id": envelope.statement.key_id, "signed_at": envelope.statement.signed_at,
           "namespace": envelope.statement.namespace}
    txn.put("signatures", key, seal("signatures", key, encoding.encode(doc)))
    return digest


def store_signature(backends: Backends, key: SigningKey, checkpoint: Digest, thread: str) -> tuple[Envelope, Digest]:
    """Sign `checkpoint` for `thread` and store the envelope with its index row, under a
    lease (the envelope first, the row last); (the envelope, its id)."""
    from agentcas.cas.leases import Lease, land
    signed = sign(key, checkpoint, thread)
    envelope_id, framed = envelope_object(signed)
    with Lease(backends.meta, f"sign {checkpoint.short()}") as lease:
        backends.source.put_many({envelope_id.raw: framed})
        land(backends.meta, lease, lambda txn: save_index_row(txn, signed, envelope_id))
    return signed, envelope_id


def envelopes_for(txn: MetaTxn, objects: ObjectSource, checkpoint: Digest) -> list[tuple[Digest, Envelope]]:
    """Every stored envelope over `checkpoint` (verified objects), in id order."""
    out = []
    for key, value in txn.scan("signatures", checkpoint.raw):
        key = bytes(key)
        unseal("signatures", key, value)
        digest = Digest(key[32:])
        data = load_object(objects, digest, framing.KIND_SIGNATURE)
        if data is None:
            raise IntegrityError(f"signature object {digest.hex()} is missing from the store")
        out.append((digest, Envelope.decode(data)))
    return out
