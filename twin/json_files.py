"""Reading a JSON file given by a user, with one error that names the file and the problem."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_json_file(path: Path, what: str, error: type[ValueError]) -> Any:
    """The JSON in ``path``; any failure is one ``error`` naming ``what`` and the file."""
    if path.is_dir():
        raise error(f"{what} {str(path)!r}: is a directory, not a JSON file")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise error(f"{what} {str(path)!r}: file not found") from None
    except json.JSONDecodeError as e:
        raise error(f"{what} {str(path)!r}: invalid JSON: {e}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise error(f"{what} {str(path)!r}: cannot read ({e})") from None
