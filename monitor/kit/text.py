"""Text from outside as text that can be written: a lone surrogate replaced by U+FFFD; control
characters escaped before a terminal sees them.

A JSON answer may carry `"\\ud800"` (a lone UTF-16 surrogate): Python decodes it into a str that
cannot be encoded as UTF-8, so the first body, page or log line that writes it fails. `valid_text`
gives the text back unchanged when it can be written (the common case: one `isascii`), else with
each lone surrogate replaced; a pair of surrogates that makes one character is joined.
"""
from __future__ import annotations


def valid_text(text: str) -> str:
    """`text` as it can be written in UTF-8 (the same object when it can already)."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def is_valid_text(text: str) -> bool:
    return valid_text(text) is text


def for_terminal(text: str) -> str:
    """`text` safe to print on a terminal: control and format characters (escape sequences that
    clear the screen or move the cursor, carriage returns, bidirectional overrides, newlines inside a
    value) written as Python escapes (`\\x1b`, `\\u202e`), everything else as it is."""
    if text.isascii() and text.isprintable():
        return text
    return "".join(c if c.isprintable() or c == " " else c.encode("unicode_escape").decode("ascii")
                   for c in valid_text(text))


__all__ = ["for_terminal", "is_valid_text", "valid_text"]
