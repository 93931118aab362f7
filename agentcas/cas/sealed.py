"""Mutable table values (refs, reflog, trust, ...) carry a keyed checksum.

Objects are checked against their ids; a ref or reflog entry has no id, so each
stored value is `payload || BLAKE3_derive(table, key, payload)[:8]` and a read
that finds a damaged value raises instead of trusting it.
"""

from __future__ import annotations

import blake3

from agentcas.errors import IntegrityError

_CONTEXT = "agentcas 2026-11 sealed table value v1"
TAG_SIZE = 8


def _tag(table: str, key: bytes, payload: bytes) -> bytes:
    hasher = blake3.blake3(derive_key_context=_CONTEXT)
    hasher.update(len(table).to_bytes(2, "big") + table.encode())
    hasher.update(len(key).to_bytes(4, "big") + bytes(key))
    hasher.update(payload)
    return hasher.digest(length=TAG_SIZE)


def seal(table: str, key: bytes, payload: bytes) -> bytes:
    return payload + _tag(table, key, payload)


def unseal(table: str, key: bytes, value) -> bytes:
    value = bytes(value)
    payload, tag = value[:-TAG_SIZE], value[-TAG_SIZE:]
    if len(value) < TAG_SIZE or _tag(table, key, payload) != tag:
        shown = bytes(key).decode("utf-8", "replace")
        raise IntegrityError(f"{table} entry {shown!r} is corrupt (checksum mismatch)")
    return payload
