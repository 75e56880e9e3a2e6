"""The bundled ShareGPT-like length model and the toolkit's default request lengths.

``profiles/sharegpt_lengths.json`` is a 30-bin histogram per dimension digitised from the
benchmark authors' plots (Llama-2 tokenizer), produced by ``fit_sharegpt_histogram`` (run
``python -m twin.sharegpt CSV [OUT]`` to regenerate it). ``sharegpt_lengths(mean_input,
mean_output)`` rescales it to given exact means (e.g. the validation pools' ≈223 / 196 tokens
with the Llama-3.1 tokenizer); ``default_lengths()`` is the model every command uses by default.

Rescaling a correlated model solves for two scales by bisection over exact means (about half a
second); the scales are cached per arguments in the process and on disk
(``twin/__pycache__/sharegpt_scales.json``, keyed by the histogram and the exact-mean code).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import replace
from functools import lru_cache
from importlib import resources
from pathlib import Path

import numpy as np

from .lengths import SHAREGPT_PROFILE, EmpiricalLengths, plain_length_model_from_dict

__all__ = ["fit_sharegpt_histogram", "sharegpt_lengths", "default_lengths", "DEFAULT_MEAN_INPUT",
           "DEFAULT_MEAN_OUTPUT", "SHAREGPT_IO_CORRELATION"]



def fit_sharegpt_histogram(csv_path: str | os.PathLike) -> EmpiricalLengths:
    """Build the ShareGPT-like histogram model from the digitised CSV.

    The CSV has columns ``histogram`` (``prompt_lengths`` / ``output_lengths``), ``bin``,
    ``bin_lo_tokens``, ``bin_hi_tokens``, ``count_approx``. Bins must be contiguous. The model
    uses the real benchmark filter (4 <= len, prompt <= 1024, prompt + output <= 2048) as clips.
    """
    import pandas as pd

    name = os.path.basename(os.fspath(csv_path))
    try:
        df = pd.read_csv(csv_path)
    except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError) as e:
        raise ValueError(f"{name}: cannot read histogram CSV ({e})") from None
    need = ["histogram", "bin", "bin_lo_tokens", "bin_hi_tokens", "count_approx"]
    missing = [c for c in need if c not in df.columns]
    if missing:
        raise ValueError(f"{name}: missing column(s) {missing}")
    out: dict[str, tuple[list[float], list[float]]] = {}
    for hist, dim in (("prompt_lengths", "input"), ("output_lengths", "output")):
        part = df[df["histogram"] == hist]
        if part.empty:
            raise ValueError(f"{name}: no rows with histogram == '{hist}'")
        for col in ("bin", "bin_lo_tokens", "bin_hi_tokens", "count_approx"):
            vals = pd.to_numeric(part[col], errors="coerce")
            if vals.isna().any():
                row = int(vals.index[vals.isna()][0]) + 1
                raise ValueError(f"{name} row {row}, column '{col}': not a number ({part[col].loc[row - 1]!r})")
        part = part.sort_values("bin")
        lo = part["bin_lo_tokens"].to_numpy(float)
        hi = part["bin_hi_tokens"].to_numpy(float)
        if not np.allclose(lo[1:], hi[:-1], atol=1e-6):
            raise ValueError(f"{name}: '{hist}' bins are not contiguous")
        out[dim] = ([float(lo[0]), *map(float, hi)], list(map(float, part["count_approx"].to_numpy(float))))
    return EmpiricalLengths.from_histograms(
        out["input"][0], out["input"][1], out["output"][0], out["output"][1],
        min_len=4, max_input=1024, max_total=2048, name="sharegpt_llama2_approx",
        source=f"digitised 30-bin ShareGPT_V3 histograms (Llama-2 tokenizer) from {name}; "
               "filter 4<=len, prompt<=1024, prompt+output<=2048 applied as clipping",
    )


def _profile_text() -> str:
    return resources.files("twin").joinpath("profiles", SHAREGPT_PROFILE).read_text(encoding="utf-8")


# Pool-weighted mean lengths of the shared Llama-3.1 validation pools (ShareGPT first turns,
# 4 <= len, prompt <= 1024, prompt + output <= 2048): the default workload of the toolkit.
DEFAULT_MEAN_INPUT = 223.0
DEFAULT_MEAN_OUTPUT = 196.3


def default_lengths() -> "EmpiricalLengths":
    """ShareGPT-like lengths with the validation pools' means (about 223 in / 196 out tokens)."""
    return sharegpt_lengths(DEFAULT_MEAN_INPUT, DEFAULT_MEAN_OUTPUT)


# Rank correlation (Gaussian copula) between prompt and answer lengths of the ShareGPT-like
# model. The shared data give only the two marginal histograms; the value is estimated by
# ``python -m experiments.length_correlation`` on half of the Llama validation runs (the rank-16
# groups) and checked on the other half (rank-32 groups), see that module. Long prompts getting
# shorter answers lowers the KV tokens a running request holds, which matters under overload.
SHAREGPT_IO_CORRELATION = -0.4


def sharegpt_lengths(mean_input: float | None = None, mean_output: float | None = None,
                     correlation: float | None = None) -> EmpiricalLengths:
    """The bundled ShareGPT-like model, rescaled so its exact means equal the targets if given.

    ``correlation`` defaults to :data:`SHAREGPT_IO_CORRELATION`. Results are cached per
    arguments.
    Typical use for the Llama-3.1 validation runs: ``sharegpt_lengths(223.0, 196.3)``.
    """
    rho = SHAREGPT_IO_CORRELATION if correlation is None else float(correlation)
    return _sharegpt_cached(None if mean_input is None else float(mean_input),
                            None if mean_output is None else float(mean_output), rho)


@lru_cache(maxsize=256)
def _sharegpt_cached(mean_input: float | None, mean_output: float | None,
                     rho: float) -> EmpiricalLengths:
    text = _profile_text()
    model = plain_length_model_from_dict(json.loads(text))
    assert isinstance(model, EmpiricalLengths)
    if rho != 0.0:
        model = replace(model, correlation=rho)
    if mean_input is None and mean_output is None:
        return model
    key = _scale_key(text, mean_input, mean_output, rho)
    cache = _read_scale_cache()
    if key in cache:
        s_in, s_out = cache[key]
        return replace(model, input_scale=s_in, output_scale=s_out)
    scaled = model.scaled_to(mean_input, mean_output)
    _write_scale_cache(key, (scaled.input_scale, scaled.output_scale))
    return scaled


# ------------------------------------------------------------------ on-disk cache of the scales
# Solving the scales is derived from shipped data only (the bundled histogram and the exact-mean
# code), so its result is kept on disk next to numba's compiled-kernel cache; the key hashes
# both, so editing either recomputes. Any I/O problem only means recomputing.

def _cache_file() -> Path:
    return Path(__file__).resolve().parent / "__pycache__" / "sharegpt_scales.json"


def _scale_key(profile_text: str, mean_input: float | None, mean_output: float | None,
               rho: float) -> str:
    from . import length_means
    h = hashlib.sha256(profile_text.encode())
    h.update(Path(length_means.__file__).read_bytes())
    h.update(repr((mean_input, mean_output, rho)).encode())
    return h.hexdigest()[:32]


def _read_scale_cache() -> dict[str, tuple[float, float]]:
    try:
        d = json.loads(_cache_file().read_text(encoding="utf-8"))
        return {k: (float(v[0]), float(v[1])) for k, v in d.items()}
    except (OSError, ValueError, TypeError, IndexError, AttributeError):
        return {}


def _write_scale_cache(key: str, scales: tuple[float, float]) -> None:
    try:
        f = _cache_file()
        f.parent.mkdir(exist_ok=True)
        d = _read_scale_cache()
        if len(d) > 1000:       # bounded: keep the newest entries only
            d = dict(list(d.items())[-500:])
        d[key] = scales
        tmp = f.with_name(f"{f.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(d), encoding="utf-8")   # floats round-trip exactly (repr)
        os.replace(tmp, f)
    except OSError:
        pass


if __name__ == "__main__":  # regenerate the bundled profile
    import sys

    if len(sys.argv) not in (2, 3):
        sys.exit("usage: python -m twin.sharegpt SHAREGPT_HIST_CSV [OUT_JSON]")
    m = fit_sharegpt_histogram(sys.argv[1])
    out_path = sys.argv[2] if len(sys.argv) == 3 else os.path.join(os.path.dirname(__file__), "profiles", SHAREGPT_PROFILE)
    m.save(out_path)
    print(f"wrote {out_path}: mean_input={m.mean_input:.3f} mean_output={m.mean_output:.3f}")
