"""Text that is safe to show on a terminal, whatever names and logs it quotes.

File names, thread names from a log's content, checkpoint reasons and log text may hold
what a terminal obeys rather than shows: C0 and C1 controls and DEL (escape sequences,
carriage return, backspace, bell), the bidirectional overrides and isolates that reorder
what is shown, the line and paragraph separators; and lone surrogates (a JSON `\\ud83d`
escape, a file name's undecodable bytes), which are not text at all and which stdout
cannot encode. Each is shown as an escape (`\\x1b`, `\\u202e`, `\\udcff`), so the output
still names the thing exactly and never drives the terminal it is printed on.
"""

from __future__ import annotations

import re

# Everything but newline and tab in `lines` mode (text of several lines); every one of
# them in a one-line field.
_UNSAFE = "\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff"
_UNSAFE_IN_LINES = re.compile(f"[\x00-\x08\x0b-\x1f{_UNSAFE}]")
_UNSAFE_IN_A_FIELD = re.compile(f"[\x00-\x1f{_UNSAFE}]")


def _escape(match) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def holds_controls(text: str) -> bool:
    """Whether `text` holds any character `escape_controls` escapes in a one-line field."""
    return _UNSAFE_IN_A_FIELD.search(text) is not None


def escape_controls(text: str, lines: bool = False) -> str:
    """`text` with every control, bidi and separator character and lone surrogate escaped;
    `lines`: newlines and tabs kept (a multi-line report)."""
    return (_UNSAFE_IN_LINES if lines else _UNSAFE_IN_A_FIELD).sub(_escape, text)
