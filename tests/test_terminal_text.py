"""terminal_text: what a terminal would obey is shown as an escape, in one-line fields and in reports."""

from __future__ import annotations

from agentcas.terminal_text import escape_controls, holds_controls


def test_carriage_return_vertical_tab_and_form_feed_are_escaped_like_other_controls():
    """A CR returns the cursor and overwrites what was printed (a reason "ok\\rfailed" shows
    "failed"); VT and FF move it. Only newline and tab are kept, and only in reports."""
    text = "done\rFAILED\x0bvt\x0cff\nnext\tcol\x1b[2J"
    assert escape_controls(text, lines=True) == "done\\x0dFAILED\\x0bvt\\x0cff\nnext\tcol\\x1b[2J"
    assert escape_controls(text) == "done\\x0dFAILED\\x0bvt\\x0cff\\x0anext\\x09col\\x1b[2J"
    for control in "\r\x0b\x0c":
        assert holds_controls(f"a{control}b")
