"""Canonical JSON: the one byte form of every structured object.

encode: UTF-8 JSON, keys sorted by code point, no whitespace, no floats, non-ASCII
written as itself (not \\u escapes). decode accepts only bytes that encode() would
produce: it parses (rejecting duplicate keys, floats, NaN, over-deep nesting and
oversized input), re-encodes, and compares. So one object has exactly one id.
"""

from __future__ import annotations

import json

from agentcas.errors import IntegrityError

MAX_DEPTH = 32
MAX_OBJECT_BYTES = 64 * 1024 * 1024


class NotCanonical(IntegrityError):
    """Bytes that are not the canonical encoding of any object."""


def encode(value, check: bool = True) -> bytes:
    """Canonical bytes of `value`. `check=False` skips the type walk for values built by
    agentcas's own constructors (hot paths); anything parsed from outside is checked."""
    if check:
        _check(value, 0)
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                          allow_nan=False).encode("utf-8")
    except UnicodeEncodeError:
        raise NotCanonical("strings must be valid Unicode (no lone surrogates)") from None


def _check(value, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise NotCanonical(f"object nested deeper than {MAX_DEPTH} levels")
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return
    if isinstance(value, int):
        if not -(2**63) <= value < 2**64:
            raise NotCanonical("integer out of the 64-bit range")
        return
    if isinstance(value, float):
        raise NotCanonical("floats are not allowed in canonical objects")
    if isinstance(value, (list, tuple)):
        for item in value:
            _check(item, depth + 1)
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise NotCanonical("object keys must be strings")
            _check(item, depth + 1)
        return
    raise NotCanonical(f"type {type(value).__name__} has no canonical encoding")


def _pairs_without_duplicates(pairs):
    seen = {}
    for key, value in pairs:
        if key in seen:
            raise NotCanonical(f"duplicate key {key[:40]!r}")
        seen[key] = value
    return seen


def _no_float(text):
    raise NotCanonical(f"floats are not allowed in canonical objects: {text[:20]}")


def decode(data: bytes):
    """Parse canonical bytes; raise NotCanonical for anything else."""
    if len(data) > MAX_OBJECT_BYTES:
        raise NotCanonical(f"object of {len(data)} bytes exceeds {MAX_OBJECT_BYTES}")
    try:
        text = bytes(data).decode("utf-8")
        value = json.loads(text, object_pairs_hook=_pairs_without_duplicates,
                           parse_float=_no_float, parse_constant=_no_float)
    except NotCanonical:
        raise
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise NotCanonical(f"not valid JSON: {str(exc)[:100]}") from None
    if encode(value) != bytes(data):
        raise NotCanonical("not in canonical form (key order, spacing or escapes)")
    return value
