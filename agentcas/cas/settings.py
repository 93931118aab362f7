"""Numbers a user sets in the environment (`$AGENTCAS_CACHE_BYTES`, `$AGENTCAS_RETRY_SECONDS`,
`$AGENTCAS_PG_TIMEOUT`, `$AGENTCAS_S3_READ_TIMEOUT`): read when used, and a malformed or
negative value is refused by name as a usage error (exit 2, one line) instead of surfacing
as a Python ValueError from deep inside a backend."""

from __future__ import annotations

import math
import os

from agentcas.errors import UsageError


def number(name: str, default: float, what: str = "a number of seconds") -> float:
    """`$name` as a finite number >= 0, or `default` when unset or empty."""
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise UsageError(f"${name} must be {what} (0 or more), not {text[:40]!r}")
    return value


def whole_number(name: str, default: int, what: str = "a whole number of bytes") -> int:
    """`$name` as an integer >= 0 (digits only), or `default` when unset or empty."""
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    if not text.isdigit():
        raise UsageError(f"${name} must be {what} (0 or more), not {text[:40]!r}")
    return int(text)


def check_shared_store_settings() -> None:
    """Read every setting a shared store uses, so a bad one is refused before anything
    (a connection, the cache directory) is made."""
    whole_number("AGENTCAS_CACHE_BYTES", 0)
    whole_number("AGENTCAS_S3_CONNECTIONS", 0, "a whole number of connections")
    for name in ("AGENTCAS_RETRY_SECONDS", "AGENTCAS_PG_TIMEOUT", "AGENTCAS_S3_READ_TIMEOUT"):
        number(name, 0.0)
