"""Text from outside as text that can be written: a lone surrogate replaced by U+FFFD.

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


__all__ = ["is_valid_text", "valid_text"]
