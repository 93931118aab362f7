"""Thread names follow git's ref-name rules (git check-ref-format).

Components are separated by "/"; none may be empty, start with "." or end with
".lock"; the name may not contain "..", "@{", control characters, space, or any of
~ ^ : ? * [ \\ ; it may not end with "/" or "." and may not be "@" alone. It must be
valid UTF-8. Beyond git, the C1 controls (U+0080-U+009F), the bidirectional marks,
overrides and isolates and the line and paragraph separators are refused too: a name
may come from a log's content (an ingested session's id), and those characters would
let it reorder or break the lines that show it (Trojan Source).
"""

from __future__ import annotations

import re

from agentcas.errors import UsageError
from agentcas.terminal_text import holds_controls

MAX_THREAD_NAME = 200
_FORBIDDEN = set(" ~^:?*[\\")
_COMPONENT_SAFE = re.compile(r"[A-Za-z0-9_-]")


class BadThreadName(UsageError):
    pass


# Names that passed the check lately: a writer checks the same few names on every move.
_CHECKED: set[str] = set()
_CHECKED_MAX = 4096


def check_thread_name(name: str) -> str:
    """`name` if it is a valid thread name (docs/FORMAT.md 6.1), else BadThreadName."""
    if type(name) is str and name in _CHECKED:
        return name
    _check_thread_name(name)
    if len(_CHECKED) >= _CHECKED_MAX:
        _CHECKED.clear()
    _CHECKED.add(name)
    return name


def _check_thread_name(name: str) -> None:
    def bad(why: str):
        raise BadThreadName(f"invalid thread name {name!r}: {why}")

    if not isinstance(name, str) or not name:
        bad("empty")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        bad("not valid UTF-8")
    if len(name.encode("utf-8")) > MAX_THREAD_NAME:
        bad(f"longer than {MAX_THREAD_NAME} bytes")
    if name == "@":
        bad("'@' alone is reserved")
    if ".." in name or "@{" in name:
        bad("contains '..' or '@{'")
    if holds_controls(name) or any(c in _FORBIDDEN for c in name):   # what a terminal would obey, too
        bad("contains a space, control character, bidirectional or line separator character "
            "or one of ~^:?*[\\")
    if name.endswith("/") or name.endswith("."):
        bad("ends with '/' or '.'")
    for part in name.split("/"):
        if not part:
            bad("has an empty component")
        if part.startswith("."):
            bad("has a component starting with '.'")
        if part.endswith(".lock"):
            bad("has a component ending with '.lock'")


def encode_component(text: str, safe: re.Pattern = _COMPONENT_SAFE) -> str:
    """`text` with every character outside `safe` percent-encoded as its UTF-8 bytes, so that a
    framework's id ('.', '/', ':', spaces, anything) becomes one valid name component."""
    return "".join(c if safe.fullmatch(c) else "".join(f"%{b:02X}" for b in c.encode("utf-8"))
                   for c in text)


def id_component(text: str) -> str:
    """One reversible name component for an id: `encode_component`, and `%` alone for the
    empty id (a real `%` is `%25`, so `%` alone is no other id's)."""
    return encode_component(text) or "%"


def id_of_component(component: str) -> str:
    """The id `id_component` encoded."""
    from urllib.parse import unquote  # lazy: every command checks names, few decode ids
    return "" if component == "%" else unquote(component, errors="strict")


def is_thread_name(text: str) -> bool:
    """Whether `text` is a valid thread name (check_thread_name would accept it)."""
    try:
        check_thread_name(text)
        return True
    except UsageError:
        return False
