"""Path-component rules shared by commit, restore and import.

A name is one path component: 1..255 UTF-8 bytes; not "." or ".."; no "/", "\\",
NUL or other control characters. Within one directory no two names may be equal
after Unicode NFC normalisation and case folding, since such names collide on
macOS and Windows file systems and could make a restore write one file twice.
"""

from __future__ import annotations

import re
import unicodedata

from agentcas.errors import IntegrityError

MAX_NAME_BYTES = 255
_FORBIDDEN = re.compile("[\x00-\x1f\x7f/\\\\\ud800-\udfff]")


class BadName(IntegrityError):
    """A path component that must never be created on disk."""


def check_name(name: str, where: str = "") -> None:
    label = f"{where}/{name}" if where else name
    if not isinstance(name, str) or name in ("", ".", ".."):
        raise BadName(f"invalid path component {label!r}")
    if len(name.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
        raise BadName(f"path component longer than {MAX_NAME_BYTES} bytes: {label[:80]!r}")
    if _FORBIDDEN.search(name):
        raise BadName(f"path component has a forbidden character: {label!r}")


def collision_key(name: str) -> str:
    return unicodedata.normalize("NFC", name).casefold()


def check_unique(names, where: str = "") -> None:
    """Raise BadName if two names in one directory collide by case or normalisation."""
    seen: dict[str, str] = {}
    for name in names:
        key = collision_key(name)
        if key in seen:
            raise BadName(f"names collide by case or Unicode normalisation in "
                          f"{where or '.'}: {seen[key]!r} and {name!r}")
        seen[key] = name


def check_relpath(path: str) -> list[str]:
    """Split a relative '/'-separated path and check each component."""
    if path.startswith("/") or len(path) >= 2 and path[1] == ":":
        raise BadName(f"absolute path not allowed: {path!r}")
    parts = path.split("/")
    for part in parts:
        check_name(part, "")
    return parts
