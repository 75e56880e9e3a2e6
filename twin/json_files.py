"""Reading a user's JSON or text file, with one error that names the file and the problem."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_json_file(path: str | Path, what: str, error: type[ValueError], *,
                   missing_hint: str = "", expect_object: bool = False) -> Any:
    """The JSON in ``path``; any failure is one ``error`` naming ``what`` and the file.

    ``missing_hint`` is appended to the not-found message (what the file should have been);
    ``expect_object`` refuses a document that is not a JSON object."""
    path = Path(path)
    name = f"{what} {str(path)!r}"
    text = read_text_file(path, what, error, kind="JSON", missing_hint=missing_hint)
    if not text.strip():
        raise error(f"{name}: empty file")
    try:
        d = json.loads(text)
    except json.JSONDecodeError as e:
        raise error(f"{name}: invalid JSON: {e}") from None
    if expect_object and not isinstance(d, dict):
        raise error(f"{name}: expected a JSON object, got {type(d).__name__}")
    return d


def read_text_file(path: str | Path, what: str, error: type[ValueError], *, kind: str = "text",
                   missing_hint: str = "") -> str:
    """The UTF-8 text of a user's file; a directory, a missing or unreadable file, or bytes that
    are not UTF-8 become one ``error`` naming ``what`` and the file (``kind``: the format the
    file should have, for the messages)."""
    path = Path(path)
    name = f"{what} {str(path)!r}"
    if path.is_dir():
        raise error(f"{name}: is a directory, not a {kind} file")
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise error(f"{name}: file not found{missing_hint}") from None
    except UnicodeDecodeError:
        raise error(f"{name}: not a text (UTF-8 {kind}) file") from None
    except OSError as e:
        raise error(f"{name}: cannot read ({e.strerror or e})") from None
