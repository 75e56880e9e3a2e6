"""Identifiers read from files and options (adapter ids, GPU type names, profile and model
names): one rule for every reader.

* Unicode NFC normalisation, so that ids which differ only in normalisation ("é" as one code
  point or as "e" + combining accent) are one id — and a list holding both is caught as a
  duplicate by the reader's duplicate check.
* Control and format characters are refused (Unicode categories Cc, Cf, Cs, Co, Zl, Zp: NUL,
  newlines, escape sequences, the right-to-left override U+202E, zero-width joiners, ...):
  they are invisible or reorder the text in every table, log and file the id is printed into.
  The message names the field, the character (code point and name), its position and the
  value as a Python literal (escaped).
"""

from __future__ import annotations

import unicodedata
from typing import Any

REFUSED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Zl", "Zp"})
MAX_ID_LENGTH = 512


def bad_character(text: str) -> tuple[int, str] | None:
    """(position, character) of the first control or format character of ``text``, else None."""
    if text.isascii() and text.isprintable():   # the usual case: no refused category in it
        return None
    for i, ch in enumerate(text):
        if unicodedata.category(ch) in REFUSED_CATEGORIES:
            return i, ch
    return None


def describe_char(ch: str) -> str:
    """``U+202E (RIGHT-TO-LEFT OVERRIDE)``."""
    name = unicodedata.name(ch, "")
    if not name and unicodedata.category(ch) == "Cc":
        name = {"\x00": "NUL", "\t": "TAB", "\n": "LINE FEED", "\r": "CARRIAGE RETURN",
                "\x1b": "ESCAPE"}.get(ch, "control character")
    return f"U+{ord(ch):04X}" + (f" ({name})" if name else "")


def identifier(value: Any, what: str = "identifier") -> str:
    """``value`` as an NFC-normalised identifier, or ``ValueError`` with the reason alone (for
    readers that add the field themselves): not a string, empty or blank, longer than
    ``MAX_ID_LENGTH``, or holding a control or format character (named with its position)."""
    if not isinstance(value, str):
        raise ValueError(f"{what} must be a string, got {value!r}")
    text = unicodedata.normalize("NFC", value)
    if not text.strip():
        raise ValueError(f"{what} must be a non-empty string, got {value!r}")
    bad = bad_character(text)
    if bad is not None:
        i, ch = bad
        raise ValueError(f"{what} {value!r} contains the control/format character "
                         f"{describe_char(ch)} at position {i}; use printable characters")
    if len(text) > MAX_ID_LENGTH:
        raise ValueError(f"{what} is {len(text)} characters long, above the limit of "
                         f"{MAX_ID_LENGTH} ({text[:40]!r}...)")
    return text


def clean_identifier(value: Any, field: str, *, what: str = "identifier") -> str:
    """``identifier(value, what)`` with the field named: ``ValueError("<field>: <reason>")``."""
    try:
        return identifier(value, what)
    except ValueError as e:
        raise ValueError(f"{field}: {e}") from None


def is_clean(value: Any) -> bool:
    """``value`` is a string that ``clean_identifier`` would return unchanged."""
    return (isinstance(value, str) and bool(value.strip()) and len(value) <= MAX_ID_LENGTH
            and unicodedata.is_normalized("NFC", value) and bad_character(value) is None)
