"""BLAKE3-256 ids.

A blob or chunk id is the plain BLAKE3 of its bytes, so `b3sum FILE` prints the id a
manifest shows for FILE. Structured objects are hashed in BLAKE3 derive-key mode with
one context string per object kind, so bytes of one kind can never pass for another.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import blake3

from agentcas.errors import IntegrityError, UsageError

DIGEST_SIZE = 32
_HEX = re.compile(r"[0-9a-f]{64}")

# One derive-key context per structured object kind (docs/FORMAT.md, "Object ids").
OBJECT_CONTEXTS = {
    "tree": "agentcas 2026-11 tree v1",
    "checkpoint": "agentcas 2026-11 checkpoint v1",
    "chunklist": "agentcas 2026-11 chunklist v1",
    "segment": "agentcas 2026-11 rollout segment v1",
    "signature": "agentcas 2026-11 signature v1",
}
# Objects in the packed binary form of format 2 (cas/packed.py) hash under their own
# contexts: a context string is never reused for another byte layout.
PACKED_OBJECT_CONTEXTS = {
    "tree": "agentcas 2026-12 tree v2",
    "checkpoint": "agentcas 2026-12 checkpoint v2",
    "chunklist": "agentcas 2026-12 chunklist v2",
    "segment": "agentcas 2026-12 rollout segment v2",
}
PREFIX_CHAIN_CONTEXT = "agentcas 2026-11 history prefix v1"


def object_context(kind: str, body) -> str:
    """The derive-key context of a structured object's bytes: JSON (format 1) starts with `{`."""
    if body[:1] == b"{" or kind not in PACKED_OBJECT_CONTEXTS:
        return OBJECT_CONTEXTS[kind]
    return PACKED_OBJECT_CONTEXTS[kind]


@dataclass(frozen=True, order=True)
class Digest:
    """A 32-byte BLAKE3 digest. Raw bytes inside; `hex()` for people and JSON."""

    raw: bytes

    def __post_init__(self) -> None:
        if not isinstance(self.raw, bytes) or len(self.raw) != DIGEST_SIZE:
            raise ValueError("a digest is exactly 32 raw bytes")

    def hex(self) -> str:
        return self.raw.hex()

    def short(self) -> str:
        return self.raw.hex()[:12]

    @classmethod
    def parse(cls, text: str) -> Digest:
        """Parse 64 lowercase hex characters; anything else is a UsageError."""
        if not isinstance(text, str) or not _HEX.fullmatch(text):
            raise UsageError(f"not a 64-character lowercase hex id: {str(text)[:80]!r}")
        return cls(bytes.fromhex(text))

    def __str__(self) -> str:
        return self.hex()

    def __repr__(self) -> str:
        return f"Digest({self.short()}…)"


_PREFIX_HASHER = blake3.blake3(derive_key_context=PREFIX_CHAIN_CONTEXT)


def hash_blob(data) -> Digest:
    """The id of raw bytes: plain BLAKE3, equal to `b3sum`."""
    return Digest(blake3.blake3(data, max_threads=1).digest())


def hash_object(kind: str, body: bytes) -> Digest:
    """The id of a structured object's canonical bytes, in derive-key mode for `kind`.

    Each context's hasher is made once and copied per object: making one derives its
    context key (a BLAKE3 of the context string), most of the cost of a small object."""
    context = object_context(kind, body)
    hasher = _CONTEXT_HASHERS.get(context)
    if hasher is None:
        hasher = _CONTEXT_HASHERS[context] = blake3.blake3(derive_key_context=context)
    hasher = hasher.copy()
    hasher.update(body)
    return Digest(hasher.digest())


_CONTEXT_HASHERS: dict = {}


def chain_prefix(previous: Digest, record_hash: bytes) -> Digest:
    """One step of the history-prefix chain: H_ctx(previous || BLAKE3(record))."""
    return Digest(chain_raw(previous.raw, record_hash))


def chain_raw(previous: bytes, record_hash: bytes) -> bytes:
    """`chain_prefix` on raw 32-byte values, for loops over many records (no Digest per step)."""
    hasher = _PREFIX_HASHER.copy()  # the derived context key is computed once, not per record
    hasher.update(previous + record_hash)
    return hasher.digest()


def chain_step_hasher():
    """A hasher for chain steps, for loops over many records: per step `reset()`,
    `update(previous + record_hash)`, `digest()` (one object, its context key computed once)."""
    return _PREFIX_HASHER.copy()


def chain_values(previous: bytes, record_hashes) -> list[bytes]:
    """The raw chain value after each of `record_hashes`, starting from `previous`."""
    copy, values = _PREFIX_HASHER.copy, []
    for record_hash in record_hashes:
        hasher = copy()
        hasher.update(previous + record_hash)
        previous = hasher.digest()
        values.append(previous)
    return values


class DigestMismatch(IntegrityError):
    """Stored bytes do not hash to the id they are stored under."""

    def __init__(self, expected: Digest, got: Digest, what: str = "object"):
        self.expected, self.got = expected, got
        super().__init__(f"{what} {expected.hex()} is corrupt: its bytes hash to {got.hex()}")


EMPTY = hash_blob(b"")
# The digest of the empty history (seq 0): the chain starts from 32 zero bytes.
EMPTY_HISTORY = Digest(bytes(DIGEST_SIZE))
