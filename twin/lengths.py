"""Request length models (input/output tokens per request).

Every model is a frozen dataclass with

* ``sample(n, rng) -> (input_len, output_len)`` — two int32 arrays, all values >= 1;
* ``mean_input`` / ``mean_output`` — the *exact* expected values of what ``sample`` returns
  (rounding and clipping included), computed from the model's probability mass function;
* ``describe()`` — a JSON-able summary for reports; ``to_dict()`` /
  ``twin.length_models.length_model_from_dict`` — a round-trippable JSON form (``{"kind":
  "fixed" | "clipped_normal" | "empirical" | "sharegpt", ...}``).

Clipping follows the real benchmark's ShareGPT filter (``min_len <= len``, ``prompt <=
max_input``, ``prompt + output <= max_total``) but *clips* instead of rejecting: the input is
drawn and clipped to ``[min_len, max_input]``, the output is drawn independently and clipped to
``[min_len, max_total - input]``.

Exact means come from ``twin.length_means``; the bundled ShareGPT-like model and the default
lengths live in ``twin.sharegpt``, and ``twin.length_models`` reads any kind from a dict or a
JSON file (the bundled model's ``sharegpt`` kind too), so this module imports neither.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, fields
from functools import cached_property
from typing import Any, Callable, Protocol, runtime_checkable

import numpy as np

from .length_means import (_copula_cells, _copula_means, _exact_means, _hist_pmf,
                           _normal_rounded_pmf, _solve_scale)
from .normal_dist import ndtr, ndtri

__all__ = [
    "LengthModel",
    "FixedLengths",
    "ClippedNormalLengths",
    "EmpiricalLengths",
    "plain_length_model_from_dict",
    "read_length_model",
    "save_length_model",
    "as_generator",
    "SHAREGPT_PROFILE",
]

SHAREGPT_PROFILE = "sharegpt_lengths.json"
_INT32_MAX = np.iinfo(np.int32).max


def as_generator(rng: np.random.Generator | int | np.integer) -> np.random.Generator:
    """Return ``rng`` if it is a Generator, else ``np.random.default_rng(rng)`` for an int seed."""
    if isinstance(rng, np.random.Generator):
        return rng
    if isinstance(rng, (int, np.integer)) and not isinstance(rng, bool):
        if rng < 0:
            raise ValueError(f"seed must be a non-negative integer, got {rng}")
        return np.random.default_rng(int(rng))
    raise ValueError(f"rng must be a numpy.random.Generator or an integer seed, got {type(rng).__name__}")


@runtime_checkable
class LengthModel(Protocol):
    """What the workload generator needs from a length model."""

    @property
    def mean_input(self) -> float: ...

    @property
    def mean_output(self) -> float: ...

    def sample(self, n: int, rng: np.random.Generator | int) -> tuple[np.ndarray, np.ndarray]: ...

    def describe(self) -> dict: ...

    def to_dict(self) -> dict: ...


# --------------------------------------------------------------------------- validation helpers


def _check_int(owner: str, name: str, value: Any, minimum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        if isinstance(value, (float, np.floating)) and math.isfinite(value) and float(value).is_integer():
            value = int(value)
        else:
            raise ValueError(f"{owner}: {name} must be an integer, got {value!r}")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{owner}: {name} must be >= {minimum}, got {value}")
    return value


def _check_float(owner: str, name: str, value: Any, *, positive: bool = False, nonneg: bool = False) -> float:
    if isinstance(value, bool):
        raise ValueError(f"{owner}: {name} must be a number, got {value!r}")
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{owner}: {name} must be a number, got {value!r}") from None
    if not math.isfinite(v):
        raise ValueError(f"{owner}: {name} must be finite, got {v}")
    if positive and v <= 0:
        raise ValueError(f"{owner}: {name} must be > 0, got {v}")
    if nonneg and v < 0:
        raise ValueError(f"{owner}: {name} must be >= 0, got {v}")
    return v


def _check_limits(owner: str, min_len: Any, max_input: Any, max_total: Any) -> tuple[int, int | None, int | None]:
    min_len = _check_int(owner, "min_len", min_len, 1)
    if max_input is not None:
        max_input = _check_int(owner, "max_input", max_input, min_len)
    if max_total is not None:
        max_total = _check_int(owner, "max_total", max_total, 2 * min_len)
        if max_input is not None and max_input + min_len > max_total:
            raise ValueError(
                f"{owner}: max_input + min_len must be <= max_total so every output can have "
                f"min_len tokens, got {max_input} + {min_len} > {max_total}"
            )
    return min_len, max_input, max_total


def _check_n(n: Any) -> int:
    return _check_int("sample", "n", n, 0)


def _clip_pair(
    raw_in: np.ndarray, raw_out: np.ndarray, min_len: int, max_input: int | None, max_total: int | None
) -> tuple[np.ndarray, np.ndarray]:
    """Apply the benchmark filter as clipping; inputs are float (already rounded) arrays."""
    hi_in = max_input if max_input is not None else (max_total - min_len if max_total is not None else _INT32_MAX)
    inp = np.clip(raw_in, min_len, hi_in)
    out = np.maximum(raw_out, min_len)
    if max_total is not None:
        out = np.minimum(out, max_total - inp)
    else:
        out = np.minimum(out, _INT32_MAX)
    return inp.astype(np.int32), out.astype(np.int32)


# --------------------------------------------------------------------------- serialisation mixin


class _Base:
    kind: str = ""

    @property
    def mean_input(self) -> float:
        """Exact expected input length of what ``sample`` returns."""
        return self._means[0]  # type: ignore[attr-defined]

    @property
    def mean_output(self) -> float:
        """Exact expected output length of what ``sample`` returns."""
        return self._means[1]  # type: ignore[attr-defined]

    def to_dict(self) -> dict:
        """Round-trippable JSON form: ``{"kind": ..., <fields>}``."""
        d: dict[str, Any] = {"kind": self.kind}
        for f in fields(self):  # type: ignore[arg-type]
            v = getattr(self, f.name)
            d[f.name] = list(v) if isinstance(v, tuple) else v
        return d

    def save(self, path: str | os.PathLike) -> None:
        """Write ``to_dict()`` as JSON to ``path``."""
        save_length_model(self, path)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- models


@dataclass(frozen=True)
class FixedLengths(_Base):
    """Every request has exactly ``input_len`` prompt and ``output_len`` output tokens."""

    input_len: int
    output_len: int
    kind = "fixed"

    def __post_init__(self) -> None:
        object.__setattr__(self, "input_len", _check_int("FixedLengths", "input_len", self.input_len, 1))
        object.__setattr__(self, "output_len", _check_int("FixedLengths", "output_len", self.output_len, 1))

    @property
    def mean_input(self) -> float:
        return float(self.input_len)

    @property
    def mean_output(self) -> float:
        return float(self.output_len)

    def sample(self, n: int, rng: np.random.Generator | int = 0) -> tuple[np.ndarray, np.ndarray]:
        """Return ``n`` copies of the fixed lengths (``rng`` unused)."""
        n = _check_n(n)
        return np.full(n, self.input_len, np.int32), np.full(n, self.output_len, np.int32)

    def describe(self) -> dict:
        return {**self.to_dict(), "mean_input": self.mean_input, "mean_output": self.mean_output}


@dataclass(frozen=True)
class ClippedNormalLengths(_Base):
    """Normal lengths N(mu, sigma^2), rounded to int and clipped by the benchmark filter.

    ``mu_*``/``sigma_*`` are the parameters *before* rounding and clipping; ``mean_input`` /
    ``mean_output`` are the exact means after it (the paper's twin ignored this difference and
    inflated lengths by ~10 %). ``None`` disables a limit.
    """

    mu_input: float
    sigma_input: float
    mu_output: float
    sigma_output: float
    min_len: int = 1
    max_input: int | None = 1024
    max_total: int | None = 2048
    kind = "clipped_normal"

    def __post_init__(self) -> None:
        o = "ClippedNormalLengths"
        for name in ("mu_input", "mu_output"):
            object.__setattr__(self, name, _check_float(o, name, getattr(self, name)))
        for name in ("sigma_input", "sigma_output"):
            object.__setattr__(self, name, _check_float(o, name, getattr(self, name), nonneg=True))
        mn, mi, mt = _check_limits(o, self.min_len, self.max_input, self.max_total)
        object.__setattr__(self, "min_len", mn)
        object.__setattr__(self, "max_input", mi)
        object.__setattr__(self, "max_total", mt)
        for name in ("input", "output"):
            mu, sd = getattr(self, f"mu_{name}"), getattr(self, f"sigma_{name}")
            if abs(mu) + 40 * sd > 1e7:
                raise ValueError(f"{o}: mu_{name} / sigma_{name} too large for token lengths ({mu}, {sd})")

    @cached_property
    def _means(self) -> tuple[float, float]:
        hi_in = self.max_input if self.max_input is not None else (
            self.max_total - self.min_len if self.max_total is not None else math.inf)
        si, pi = _normal_rounded_pmf(self.mu_input, self.sigma_input, self.min_len, hi_in)
        so, po = _normal_rounded_pmf(self.mu_output, self.sigma_output, self.min_len,
                                     self.max_total - self.min_len if self.max_total is not None else math.inf)
        return _exact_means(si, pi, so, po, self.min_len, self.max_input, self.max_total)


    def sample(self, n: int, rng: np.random.Generator | int) -> tuple[np.ndarray, np.ndarray]:
        """Draw ``n`` (input, output) pairs from ``rng`` (the first k of n draws equal a k-draw)."""
        n = _check_n(n)
        g = as_generator(rng)
        z = g.standard_normal((n, 2))  # row-major: request k's lengths do not depend on n
        raw_in = np.rint(self.mu_input + self.sigma_input * z[:, 0])
        raw_out = np.rint(self.mu_output + self.sigma_output * z[:, 1])
        return _clip_pair(raw_in, raw_out, self.min_len, self.max_input, self.max_total)

    def describe(self) -> dict:
        return {**self.to_dict(), "mean_input": self.mean_input, "mean_output": self.mean_output}


@dataclass(frozen=True)
class EmpiricalLengths(_Base):
    """Empirical lengths: per-dimension histograms, or observed (input, output) pairs.

    *Histogram mode* (``input_edges``/``input_probs``/``output_edges``/``output_probs``): a value
    is uniform within its bin, multiplied by the dimension's ``*_scale``, rounded to the nearest
    int and clipped (see module doc). The two bins are drawn through a Gaussian copula with
    ``correlation`` (0 = independent; negative = long prompts tend to get short answers); the
    marginal histograms are unchanged by it.

    *Pairs mode* (``pair_inputs``/``pair_outputs``): a pair is drawn uniformly (jointly), each
    value multiplied by its scale, rounded and clipped.

    ``scaled_to(mean_input, mean_output)`` returns a copy whose scales make the exact means hit
    the targets. Probabilities are normalised on construction.
    """

    input_edges: tuple[float, ...] = ()
    input_probs: tuple[float, ...] = ()
    output_edges: tuple[float, ...] = ()
    output_probs: tuple[float, ...] = ()
    pair_inputs: tuple[int, ...] = ()
    pair_outputs: tuple[int, ...] = ()
    input_scale: float = 1.0
    output_scale: float = 1.0
    correlation: float = 0.0
    min_len: int = 1
    max_input: int | None = 1024
    max_total: int | None = 2048
    name: str = "empirical"
    source: str = ""
    kind = "empirical"

    # -- construction

    def __post_init__(self) -> None:
        o = f"EmpiricalLengths '{self.name}'"
        set_ = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731
        has_hist = any(len(getattr(self, k)) for k in ("input_edges", "input_probs", "output_edges", "output_probs"))
        has_pairs = bool(len(self.pair_inputs) or len(self.pair_outputs))
        if has_hist == has_pairs:
            raise ValueError(f"{o}: give either histograms (input/output edges+probs) or pairs (pair_inputs/"
                             "pair_outputs), not both or neither")
        if has_hist:
            for dim in ("input", "output"):
                edges, probs = self._check_hist(o, dim, getattr(self, f"{dim}_edges"), getattr(self, f"{dim}_probs"))
                set_(f"{dim}_edges", edges)
                set_(f"{dim}_probs", probs)
        else:
            ins = self._check_ints(o, "pair_inputs", self.pair_inputs)
            outs = self._check_ints(o, "pair_outputs", self.pair_outputs)
            if len(ins) != len(outs):
                raise ValueError(f"{o}: pair_inputs and pair_outputs must have equal length, got {len(ins)} and {len(outs)}")
            set_("pair_inputs", ins)
            set_("pair_outputs", outs)
        rho = _check_float(o, "correlation", self.correlation)
        if not -1.0 < rho < 1.0:
            raise ValueError(f"{o}: correlation must be in (-1, 1), got {rho}")
        if rho != 0.0 and has_pairs:
            raise ValueError(f"{o}: correlation applies to histogram mode only (pairs are joint)")
        set_("correlation", rho)
        set_("input_scale", _check_float(o, "input_scale", self.input_scale, positive=True))
        set_("output_scale", _check_float(o, "output_scale", self.output_scale, positive=True))
        mn, mi, mt = _check_limits(o, self.min_len, self.max_input, self.max_total)
        set_("min_len", mn)
        set_("max_input", mi)
        set_("max_total", mt)
        if not isinstance(self.name, str) or not isinstance(self.source, str):
            raise ValueError(f"{o}: name and source must be strings")

    @staticmethod
    def _check_hist(o: str, dim: str, edges: Any, probs: Any) -> tuple[tuple[float, ...], tuple[float, ...]]:
        try:
            e = np.asarray(edges, dtype=np.float64).ravel()
            p = np.asarray(probs, dtype=np.float64).ravel()
        except (TypeError, ValueError):
            raise ValueError(f"{o}: {dim}_edges and {dim}_probs must be sequences of numbers") from None
        if len(e) < 2:
            raise ValueError(f"{o}: {dim}_edges needs at least 2 edges, got {len(e)}")
        if len(p) != len(e) - 1:
            raise ValueError(f"{o}: {dim}_probs must have len({dim}_edges) - 1 = {len(e) - 1} entries, got {len(p)}")
        if not np.all(np.isfinite(e)) or e[0] < 0 or np.any(np.diff(e) <= 0):
            raise ValueError(f"{o}: {dim}_edges must be finite, >= 0 and strictly increasing")
        if not np.all(np.isfinite(p)) or np.any(p < 0) or p.sum() <= 0:
            raise ValueError(f"{o}: {dim}_probs must be finite, >= 0 and not all zero")
        if abs(p.sum() - 1.0) > 1e-12:  # normalise (once: already-normalised input is kept exactly)
            p = p / p.sum()
        return tuple(float(x) for x in e), tuple(float(x) for x in p)

    @staticmethod
    def _check_ints(o: str, name: str, values: Any) -> tuple[int, ...]:
        try:
            a = np.asarray(values, dtype=np.float64).ravel()
        except (TypeError, ValueError):
            raise ValueError(f"{o}: {name} must be a sequence of integers") from None
        if len(a) == 0:
            raise ValueError(f"{o}: {name} is empty")
        bad = ~np.isfinite(a) | (a < 1) | (a != np.round(a)) | (a > _INT32_MAX)
        if bad.any():
            i = int(np.argmax(bad))
            raise ValueError(f"{o}: {name}[{i}] must be an integer >= 1, got {float(a[i]):g}")
        return tuple(int(x) for x in a)

    @classmethod
    def from_pairs(cls, inputs: Any, outputs: Any, **kwargs: Any) -> "EmpiricalLengths":
        """Model that resamples observed (input, output) pairs jointly."""
        return cls(pair_inputs=inputs, pair_outputs=outputs, **kwargs)  # validated in __post_init__

    @classmethod
    def from_histograms(cls, input_edges: Any, input_probs: Any, output_edges: Any, output_probs: Any,
                        **kwargs: Any) -> "EmpiricalLengths":
        """Model from bin edges and (unnormalised) bin weights per dimension."""
        return cls(input_edges=input_edges, input_probs=input_probs, output_edges=output_edges,
                   output_probs=output_probs, **kwargs)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "EmpiricalLengths":
        """Load an ``empirical`` model from a JSON file written by ``save``."""
        m = read_length_model(path)
        if not isinstance(m, EmpiricalLengths):
            raise ValueError(f"{path}: expected an empirical length model, got kind '{m.kind}'")
        return m

    # -- properties

    @property
    def is_pairs(self) -> bool:
        return len(self.pair_inputs) > 0

    @cached_property
    def _arrays(self) -> dict[str, np.ndarray]:
        if self.is_pairs:
            return {"pin": np.asarray(self.pair_inputs, np.float64), "pout": np.asarray(self.pair_outputs, np.float64)}
        return {
            "ie": np.asarray(self.input_edges), "ic": np.cumsum(self.input_probs),
            "oe": np.asarray(self.output_edges), "oc": np.cumsum(self.output_probs),
        }

    def _means_for(self, s_in: float, s_out: float) -> tuple[float, float]:
        a = self._arrays
        if self.is_pairs:
            i, o = _clip_pair(np.rint(a["pin"] * s_in), np.rint(a["pout"] * s_out),
                              self.min_len, self.max_input, self.max_total)
            return float(i.mean()), float(o.mean())
        if self.correlation != 0.0:
            return _copula_means(a["ie"] * s_in, a["oe"] * s_out, self._cell_probs,
                                 self.min_len, self.max_input, self.max_total)
        si, pi = _hist_pmf(a["ie"] * s_in, np.asarray(self.input_probs))
        so, po = _hist_pmf(a["oe"] * s_out, np.asarray(self.output_probs))
        return _exact_means(si, pi, so, po, self.min_len, self.max_input, self.max_total)

    @cached_property
    def _cell_probs(self) -> np.ndarray:
        """P[input bin i, output bin j] under the Gaussian copula (independent of the scales)."""
        return _copula_cells(np.asarray(self.input_probs), np.asarray(self.output_probs),
                             self.correlation)

    @cached_property
    def _means(self) -> tuple[float, float]:
        return self._means_for(self.input_scale, self.output_scale)


    # -- sampling

    def sample(self, n: int, rng: np.random.Generator | int) -> tuple[np.ndarray, np.ndarray]:
        """Draw ``n`` (input, output) pairs from ``rng`` (the first k of n draws equal a k-draw)."""
        n = _check_n(n)
        g = as_generator(rng)
        a = self._arrays
        if self.is_pairs:
            idx = g.integers(0, len(a["pin"]), n)
            raw_in, raw_out = a["pin"][idx] * self.input_scale, a["pout"][idx] * self.output_scale
        else:
            u = g.random((n, 4))  # row-major: request k's lengths do not depend on n
            u_out_bin = u[:, 2]
            if self.correlation != 0.0:
                rho = self.correlation
                z_in = ndtri(np.clip(u[:, 0], 1e-300, 1 - 1e-16))
                z_out = ndtri(np.clip(u[:, 2], 1e-300, 1 - 1e-16))
                u_out_bin = ndtr(rho * z_in + math.sqrt(1.0 - rho * rho) * z_out)
            raw_in = self._draw_hist(u[:, 0], u[:, 1], a["ie"], a["ic"]) * self.input_scale
            raw_out = self._draw_hist(u_out_bin, u[:, 3], a["oe"], a["oc"]) * self.output_scale
        return _clip_pair(np.rint(raw_in), np.rint(raw_out), self.min_len, self.max_input, self.max_total)

    @staticmethod
    def _draw_hist(u_bin: np.ndarray, u_pos: np.ndarray, edges: np.ndarray, cum: np.ndarray) -> np.ndarray:
        k = np.minimum(np.searchsorted(cum, u_bin * cum[-1], side="right"), len(cum) - 1)
        lo = edges[k]
        return lo + u_pos * (edges[k + 1] - lo)

    # -- rescaling

    def scaled_to(self, mean_input: float | None = None, mean_output: float | None = None) -> "EmpiricalLengths":
        """Copy whose exact means equal the targets (``None`` keeps that dimension's scale).

        The input scale is solved first (its mean does not depend on the output), then the
        output scale given the input distribution (the output mean depends on the input through
        the ``max_total`` clip). Scaling multiplies bin edges (or pair values) before rounding.
        In pairs mode the mean is a step function of the scale; the closest value is returned.
        """
        o = f"EmpiricalLengths '{self.name}'.scaled_to"
        s_in, s_out = self.input_scale, self.output_scale
        hi_in = self.max_input if self.max_input is not None else (
            self.max_total - self.min_len if self.max_total is not None else math.inf)
        if mean_input is not None:
            t = _check_float(o, "mean_input", mean_input, positive=True)
            s_in = _solve_scale(lambda s: self._means_for(s, s_out)[0], t, f"{o}: mean_input",
                                float(self.min_len), float(hi_in))
        if mean_output is not None:
            t = _check_float(o, "mean_output", mean_output, positive=True)
            hi_out = math.inf
            if self.max_total is not None:  # E[max_total - input] is the limit as the scale grows
                hi_out = self.max_total - self._means_for(s_in, s_out)[0]
            s_out = _solve_scale(lambda s: self._means_for(s_in, s)[1], t, f"{o}: mean_output",
                                 float(self.min_len), hi_out)
        kw = {f.name: getattr(self, f.name) for f in fields(self)}
        kw.update(input_scale=s_in, output_scale=s_out)
        return EmpiricalLengths(**kw)

    def to_dict(self) -> dict:
        d = super().to_dict()
        drop = ("input_edges", "input_probs", "output_edges", "output_probs") if self.is_pairs else (
            "pair_inputs", "pair_outputs")
        for k in drop:
            d.pop(k)
        return d

    def describe(self) -> dict:
        d: dict[str, Any] = {
            "kind": self.kind, "name": self.name, "source": self.source,
            "mode": "pairs" if self.is_pairs else "histogram",
            "input_scale": self.input_scale, "output_scale": self.output_scale,
            "min_len": self.min_len, "max_input": self.max_input, "max_total": self.max_total,
            "mean_input": self.mean_input, "mean_output": self.mean_output,
        }
        if self.is_pairs:
            d["n_pairs"] = len(self.pair_inputs)
        else:
            d["n_bins_input"] = len(self.input_probs)
            d["n_bins_output"] = len(self.output_probs)
        return d


# --------------------------------------------------------------------------- dict / JSON


_KINDS: dict[str, type] = {"fixed": FixedLengths, "clipped_normal": ClippedNormalLengths, "empirical": EmpiricalLengths}


def plain_length_model_from_dict(d: dict) -> FixedLengths | ClippedNormalLengths | EmpiricalLengths:
    """Build a ``fixed``, ``clipped_normal`` or ``empirical`` length model from its ``to_dict()``
    form (``twin.length_models.length_model_from_dict`` reads the ``sharegpt`` kind as well)."""
    if not isinstance(d, dict):
        raise ValueError(f"length model: expected a dict, got {type(d).__name__}")
    kind = d.get("kind")
    if kind is None:
        raise ValueError("length model: missing field 'kind'")
    params = {k: v for k, v in d.items() if k != "kind"}
    cls = _KINDS.get(kind)
    if cls is None:
        raise ValueError(f"length model: unknown kind {kind!r} (expected one of {sorted([*_KINDS, 'sharegpt'])})")
    names = {f.name: f for f in fields(cls)}
    unknown = set(params) - set(names)
    if unknown:
        raise ValueError(f"length model '{kind}': unknown field(s) {sorted(unknown)}")
    from dataclasses import MISSING

    required = [n for n, f in names.items() if f.default is MISSING and f.default_factory is MISSING]
    if kind == "empirical":
        hist = ["input_edges", "input_probs", "output_edges", "output_probs"]
        pairs = ["pair_inputs", "pair_outputs"]
        if any(k in params for k in pairs):
            required = pairs
        else:
            required = hist
    missing = [n for n in required if n not in params]
    if missing:
        raise ValueError(f"length model '{kind}': missing field(s) {missing}")
    return cls(**params)


def save_length_model(model: LengthModel, path: str | os.PathLike) -> None:
    """Write a length model's ``to_dict()`` as indented JSON."""
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(model.to_dict(), fh, indent=1)
        fh.write("\n")


def read_length_model(path: str | os.PathLike,
                      from_dict: Callable[[dict], LengthModel] = plain_length_model_from_dict
                      ) -> LengthModel:
    """Read a length model JSON written by ``save_length_model`` with ``from_dict``; errors
    name the file."""
    try:
        with open(path, encoding="utf-8") as fh:
            d = json.load(fh)
    except OSError as e:
        raise ValueError(f"{path}: cannot read length model ({e.strerror})") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: invalid JSON ({e})") from None
    try:
        return from_dict(d)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
