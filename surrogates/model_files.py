"""Reading the files of a trained model directory with errors that name the damaged file.

A model directory (``manifest.json``, ``<model>.json`` + ``<model>.npz``, ``capacity.json``) can
be damaged by a partial copy or a hand edit: a missing or truncated ``.npz``, an empty or invalid
JSON file, a field or array that is missing or of the wrong shape. Every such case becomes a
``ModelFileError`` (a ``ValueError``) saying which file and what is wrong, never a traceback or a
crash inside a compiled predictor.
"""

from __future__ import annotations

import zipfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from twin.json_files import read_json_file


class ModelFileError(ValueError):
    """A model file is missing or damaged; the message names the file."""


def read_json(path: str | Path, what: str = "model file") -> dict:
    """A JSON object from ``path``, or ``ModelFileError`` naming the file and the problem. A
    model directory's ``manifest.json`` is also checked for the fields its readers use
    (``check_manifest``)."""
    d = read_json_file(path, what, ModelFileError, expect_object=True,
                       missing_hint=" (is this a trained model directory?)")
    if Path(path).name == "manifest.json":
        check_manifest(d, path, what)
    return d


def check_manifest(d: dict, path: str | Path, what: str = "model manifest") -> None:
    """The fields of a model manifest that loading and evaluating a model read: ``profile``
    (a non-empty string) and ``split`` (an object with ``seed`` and ``test_frac``); an empty
    ``{}`` or a hand-edited manifest is refused naming the file and the field."""
    hint = "; regenerate the model directory with `python -m surrogates train`"
    prof = d.get("profile")
    if "profile" not in d:
        raise ModelFileError(f"{what} {path}: missing field 'profile' (the twin profile the "
                             f"model was trained for){hint}")
    if not isinstance(prof, str) or not prof.strip():
        raise ModelFileError(f"{what} {path}: field 'profile' must be a profile name, got "
                             f"{prof!r}{hint}")
    sp = d.get("split")
    if not isinstance(sp, dict) or any(k not in sp for k in ("seed", "test_frac")):
        raise ModelFileError(f"{what} {path}: field 'split' must be an object with 'seed' and "
                             f"'test_frac', got {sp!r}{hint}")


@contextmanager
def open_npz(path: str | Path) -> Iterator[dict[str, np.ndarray]]:
    """Every array of an ``.npz`` file, read eagerly so a truncated member fails here."""
    p = Path(path)
    if not p.exists():
        raise ModelFileError(f"model arrays {p}: not found (is this a trained model directory?)")
    try:
        with np.load(p, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except (zipfile.BadZipFile, EOFError, OSError, ValueError, KeyError) as e:
        raise ModelFileError(f"model arrays {p}: damaged or truncated ({e})") from None
    yield arrays


@contextmanager
def file_context(path: str | Path) -> Iterator[None]:
    """Turn a missing field, a wrong type or an inconsistent array inside a model file into a
    ``ModelFileError`` naming ``path``."""
    try:
        yield
    except ModelFileError:
        raise
    except KeyError as e:
        raise ModelFileError(f"model file {path}: missing field {e.args[0]!r}") from None
    except (TypeError, ValueError, IndexError, AttributeError) as e:
        raise ModelFileError(f"model file {path}: invalid content ({e})") from None


def require(cond: bool, path: str | Path, reason: str) -> None:
    """``ModelFileError`` naming ``path`` unless ``cond``."""
    if not cond:
        raise ModelFileError(f"model file {path}: {reason}")


def field(d: dict, key: str, path: str | Path) -> Any:
    """``d[key]`` or ``ModelFileError`` naming the file and the missing field."""
    if key not in d:
        raise ModelFileError(f"model file {path}: missing field {key!r}")
    return d[key]
