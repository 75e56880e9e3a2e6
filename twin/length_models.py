"""Length models by description: every kind of ``twin.lengths`` (``fixed``, ``clipped_normal``,
``empirical``) and the bundled ShareGPT model (``sharegpt``, rescaled to optional means), from
a dict (``length_model_from_dict``) or a JSON file (``load_length_model``). Above both
``twin.lengths`` and ``twin.sharegpt``, which therefore need not import each other."""

from __future__ import annotations

import os

from .lengths import LengthModel, plain_length_model_from_dict, read_length_model
from .sharegpt import sharegpt_lengths

__all__ = ["length_model_from_dict", "load_length_model"]


def length_model_from_dict(d: dict) -> LengthModel:
    """Build a length model from its ``to_dict()`` form. ``{"kind": "sharegpt", "mean_input":
    ..., "mean_output": ..., "correlation": ...}`` (all optional) gives the bundled ShareGPT
    model, rescaled."""
    if isinstance(d, dict) and d.get("kind") == "sharegpt":
        params = {k: v for k, v in d.items() if k != "kind"}
        unknown = set(params) - {"mean_input", "mean_output", "correlation"}
        if unknown:
            raise ValueError(f"length model 'sharegpt': unknown field(s) {sorted(unknown)}")
        return sharegpt_lengths(params.get("mean_input"), params.get("mean_output"),
                                params.get("correlation"))
    return plain_length_model_from_dict(d)


def load_length_model(path: str | os.PathLike) -> LengthModel:
    """Read a length model JSON written by ``twin.lengths.save_length_model`` (any kind)."""
    return read_length_model(path, length_model_from_dict)
