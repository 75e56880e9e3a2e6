"""Features of one GPU, computable from the assignment variables (DESIGN.md section 5).

A GPU's feature vector has three parts:

* **additive** features ``sum_i phi(adapter_i)`` — ``adapter_feature_vector(rank, rate, lengths)``
  returns ``phi`` for one adapter; an optimiser sums it over the adapters assigned to a GPU
  (``sum_i phi_i * x_ig`` is linear in ``x``);
* **max** features — ``max_rank`` (one binary per rank class in a MILP);
* **configuration** — ``amax`` (the GPU's ``max_loras``).

``gpu_features(adapters, amax, lengths)`` builds the full vector for one GPU; ``FEATURES`` names
its columns in order. Every model in this package takes arrays with these columns.

Additive columns (``ADDITIVE``):

==========  =================================================================================
n           adapters on the GPU (N)
rate        sum of request rates (req/s)
load        offered token rate sum_i rate_i * (mean_in + mean_out)  (tok/s, DESIGN section 1)
load_in     prefill part sum_i rate_i * mean_in (tok/s)
busy5       sum_i (1 - exp(-rate_i * 5 s)): expected adapters with an arrival in a 5 s window
busy30      same with a 30 s window
n_rank<r>   adapters of rank class r, one column per supported rank
==========  =================================================================================
"""

from __future__ import annotations

import math
from typing import Iterable, Sequence

import numpy as np

RANK_CLASSES: tuple[int, ...] = (8, 16, 32)
TAUS_S: tuple[float, ...] = (5.0, 30.0)

ADDITIVE: tuple[str, ...] = ("n", "rate", "load", "load_in", "busy5", "busy30",
                             *(f"n_rank{r}" for r in RANK_CLASSES))
MAX_FEATURES: tuple[str, ...] = ("max_rank",)
CONFIG: tuple[str, ...] = ("amax",)
FEATURES: tuple[str, ...] = ADDITIVE + MAX_FEATURES + CONFIG
N_ADDITIVE = len(ADDITIVE)
IDX = {name: i for i, name in enumerate(FEATURES)}


def _mean_lengths(lengths) -> tuple[float, float]:
    """(mean_in, mean_out) from a length model or a pair of numbers."""
    if hasattr(lengths, "mean_input"):
        mi, mo = float(lengths.mean_input), float(lengths.mean_output)
    else:
        try:
            mi, mo = (float(v) for v in lengths)
        except (TypeError, ValueError):
            raise ValueError("lengths: expected a length model or a (mean_in, mean_out) pair, "
                             f"got {lengths!r}") from None
    for nm, v in (("mean_in", mi), ("mean_out", mo)):
        if not (math.isfinite(v) and v > 0):
            raise ValueError(f"lengths: {nm} must be finite and > 0, got {v}")
    return mi, mo


def adapter_feature_vector(rank: int, rate: float, lengths) -> np.ndarray:
    """Additive features ``phi`` of one adapter (columns ``ADDITIVE``); sum them over a GPU.

    ``lengths`` is a twin length model or a ``(mean_in, mean_out)`` pair (tokens).
    """
    if isinstance(rank, bool) or int(rank) != rank or int(rank) not in RANK_CLASSES:
        raise ValueError(f"rank: must be one of {RANK_CLASSES}, got {rank!r}")
    rate = float(rate)
    if not (math.isfinite(rate) and rate > 0):
        raise ValueError(f"rate: must be finite and > 0 req/s, got {rate!r}")
    mi, mo = _mean_lengths(lengths)
    v = np.zeros(N_ADDITIVE)
    v[0] = 1.0
    v[1] = rate
    v[2] = rate * (mi + mo)
    v[3] = rate * mi
    for k, tau in enumerate(TAUS_S):
        v[4 + k] = -math.expm1(-rate * tau)
    v[4 + len(TAUS_S) + RANK_CLASSES.index(int(rank))] = 1.0
    return v


def adapter_feature_matrix(ranks: Sequence[int], rates: Sequence[float], lengths) -> np.ndarray:
    """``adapter_feature_vector`` for many adapters at once, shape (n_adapters, N_ADDITIVE)."""
    ranks = np.asarray(ranks)
    rates = np.asarray(rates, dtype=np.float64)
    if ranks.shape != rates.shape or ranks.ndim != 1:
        raise ValueError("ranks and rates must be 1-D arrays of the same length")
    bad = ~np.isin(ranks, RANK_CLASSES)
    if bad.any():
        raise ValueError(f"rank: must be one of {RANK_CLASSES}, got {ranks[bad][0]!r}")
    if not (np.all(np.isfinite(rates)) and np.all(rates > 0)):
        raise ValueError("rate: every rate must be finite and > 0 req/s")
    mi, mo = _mean_lengths(lengths)
    m = np.zeros((len(rates), N_ADDITIVE))
    m[:, 0] = 1.0
    m[:, 1] = rates
    m[:, 2] = rates * (mi + mo)
    m[:, 3] = rates * mi
    for k, tau in enumerate(TAUS_S):
        m[:, 4 + k] = -np.expm1(-rates * tau)
    for j, r in enumerate(RANK_CLASSES):
        m[:, 4 + len(TAUS_S) + j] = (ranks == r)
    return m


def gpu_features(ranks: Sequence[int], rates: Sequence[float], amax: int, lengths,
                 max_rank: int | None = None) -> np.ndarray:
    """Feature vector (columns ``FEATURES``) of one GPU serving the given adapters.

    ``max_rank`` defaults to the largest adapter rank (the server's ``max_lora_rank``).
    """
    if len(ranks) == 0:
        raise ValueError("ranks: a GPU needs at least one adapter")
    add = adapter_feature_matrix(ranks, rates, lengths).sum(axis=0)
    top = int(max(ranks))
    if max_rank is None:
        max_rank = top
    if int(max_rank) not in RANK_CLASSES or int(max_rank) < top:
        raise ValueError(f"max_rank: must be one of {RANK_CLASSES} and >= the largest adapter "
                         f"rank {top}, got {max_rank!r}")
    if isinstance(amax, bool) or int(amax) != amax or int(amax) < 1:
        raise ValueError(f"amax: must be an integer >= 1, got {amax!r}")
    return np.concatenate([add, [float(max_rank), float(amax)]])


def features_frame_columns() -> list[str]:
    """Column names of the feature block in dataset Parquet files (``f_<name>``)."""
    return [f"f_{c}" for c in FEATURES]


def as_feature_matrix(X) -> np.ndarray:
    """Accept a DataFrame (columns ``FEATURES`` or ``f_<FEATURES>``) or an array; return a
    float64 C-contiguous (n, len(FEATURES)) matrix; a missing column raises ValueError."""
    try:
        import pandas as pd
    except ImportError:  # pragma: no cover
        pd = None
    if pd is not None and isinstance(X, pd.DataFrame):
        cols = []
        for c in FEATURES:
            if c in X.columns:
                cols.append(X[c].to_numpy(np.float64))
            elif f"f_{c}" in X.columns:
                cols.append(X[f"f_{c}"].to_numpy(np.float64))
            else:
                raise ValueError(f"features: missing column {c!r}")
        M = np.column_stack(cols)
    else:
        M = np.asarray(X, dtype=np.float64)
        if M.ndim == 1:
            M = M[None, :]
        if M.ndim != 2 or M.shape[1] != len(FEATURES):
            raise ValueError(f"features: expected shape (n, {len(FEATURES)}) with columns "
                             f"{list(FEATURES)}, got {M.shape}")
    if not np.all(np.isfinite(M)):
        bad = int(np.argwhere(~np.isfinite(M))[0][1])
        raise ValueError(f"features: column {FEATURES[bad]!r} has a non-finite value")
    return np.ascontiguousarray(M)


def derived_columns(M: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """Nonlinear functions of the GPU features used by the learned (non-encodable) models.

    They are functions of the GPU-level vector only, so any optimiser that tracks the additive
    and max features can evaluate them.
    """
    n, rate, load, load_in = M[:, IDX["n"]], M[:, IDX["rate"]], M[:, IDX["load"]], M[:, IDX["load_in"]]
    b5, b30, amax = M[:, IDX["busy5"]], M[:, IDX["busy30"]], M[:, IDX["amax"]]
    safe_rate = np.maximum(rate, 1e-12)
    cols = [
        np.log(np.maximum(load, 1e-9)),
        load_in / safe_rate,                  # mean input length
        (load - load_in) / safe_rate,         # mean output length
        np.minimum(n, amax) / np.maximum(n, 1.0),
        b5 / amax, b30 / amax,
        np.log(np.maximum(n, 1.0)),
        load / np.maximum(n, 1.0),
        b5 / np.maximum(n, 1.0),
    ]
    names = ["log_load", "mean_in", "mean_out", "slot_frac", "busy5_per_slot", "busy30_per_slot",
             "log_n", "load_per_adapter", "busy5_frac"]
    return np.column_stack(cols), names


def iter_rank_classes() -> Iterable[int]:
    return iter(RANK_CLASSES)
