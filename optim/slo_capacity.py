"""How much load one GPU carries under a latency SLO, by rank and by how many adapters it runs.

Under an SLO a GPU's limit falls steeply with the adapters it serves at once: on the shipped
Llama H100 profile at p99 TTFT 500 ms / p99 ITL 50 ms (600 s window, rank 32), one adapter
carries 6,043 tok/s, eight equal-rate adapters 2,604 and sixteen 1,681 (every distinct adapter
in a batch adds LoRA work to each step and the client's delivery delays grow with the streams,
``twin.latency_tail``). A packing gated by the one-adapter limit alone fills GPUs the SLO then
splits; ``SloCapacity`` is the table greedy packs with instead.

**Measurement.** At each GPU type's smallest startable rank ``r0``,
``capacity.predicted_limit`` (the bound's first two seeds, window, threshold and SLO; Amax =
the count, bisected to 1 %, cached on disk beside the carry limits) predicts the load ``P(k)``
``k`` equal-rate adapters carry, for ``k`` on ``COUNTS`` up to the instance's adapter count,
stopping after the first ``k`` at which even the instance's lightest adapters would not fit
(``C(k) < k x`` the smallest adapter load), whose busy count (below) reaches the whole
instance's, or whose busy count no longer rises (the limit falls faster than the count grows:
larger counts add nothing to the table). The curve is ``C(k) = one x P(k) / P(1)``: its shape
predicted, its level the sound one-adapter carry limit ``one`` the bound uses, with the running
minimum over ``k`` (more adapters never carry more). A larger rank class ``r`` scales it by
``P_r(1) / P(1)``. So a table costs one bisection per count and per rank class: measuring it
with ``carry_limit`` (every integer Amax at overload, four seeds) for 24-48 equal adapters at
every rank class made the first ``optim plan --slo`` on the shipped example take 6 min 49 s
instead of 1 min 51 s. ``MAX_COUNT`` = 16: beyond it the limit is flat in the table (an
optimistic prediction the twin's verification and greedy's one-adapter packing catch); busy
counts are far below adapter counts at the rates of the SLO study's points.

**Prediction.** Equal rates are the hardest mix of a count: a GPU with a few hot adapters and
many nearly idle ones runs fewer adapters per step than its count says. So the table is indexed
by the adapters' *expected busy count* ``busy5`` = sum_i (1 - exp(-5 s x rate_i)) (the
surrogates' feature: adapters with an arrival in a 5 s window, about the time one request runs),
evaluated for each measured point at its limit load, and a GPU's cap is the limit interpolated
(piecewise linearly) at its own busy count, never above the one-adapter limit of its rank;
beyond the last measured point the last limit holds. The 5 s window was chosen over the 30 s one
(``busy30``) on the quick SLO study's tight points: with 30 s a GPU of a hundred adapters at
0.005-0.08 req/s counts them as a dozen busy ones, greedy then packs 60-80 per GPU where the twin
accepts 75-95, and ``paper-llama-rmixed-qlow-n384`` took 6 GPUs instead of 5.

This is a prediction, not a bound: the twin still verifies every GPU (greedy repairs what it
rejects), and the twin-sound bound keeps the one-adapter and count-aware limits of
``optim.feasibility``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .instance import Instance

COUNTS = (1, 2, 3, 4, 6, 8, 12, 16)   # equal-adapter counts measured (the bound's grid)
MAX_COUNT = COUNTS[-1]
BUSY_FEATURE = "busy5"     # the busy count: the surrogates' feature of that window ...
BUSY_TAU_S = 5.0           # ... in seconds


@dataclass(frozen=True)
class RankCurve:
    """Measured limits of one rank class: ``counts[i]`` equal-rate adapters carry at most
    ``limits_tps[i]`` (running minimum) with busy count ``busy[i]`` at that load."""

    rank: int
    counts: tuple[int, ...]
    limits_tps: tuple[float, ...]
    busy: tuple[float, ...]

    def cap_tps(self, busy: np.ndarray) -> np.ndarray:
        """The interpolated limit at each busy count (flat beyond the measured ends)."""
        xs, ys = _increasing(self.busy, self.limits_tps)
        return np.interp(np.asarray(busy, dtype=np.float64), xs, ys)

    def to_dict(self) -> dict:
        return {"rank": self.rank, "counts": list(self.counts),
                "limits_tps": [round(v, 1) for v in self.limits_tps],
                "busy": [round(v, 3) for v in self.busy]}


def _increasing(busy: tuple[float, ...], limits: tuple[float, ...]
                ) -> tuple[np.ndarray, np.ndarray]:
    """The points whose busy count rises strictly (a point measured at a near-zero limit has a
    busy count below its predecessor's; it adds nothing the flat end does not say)."""
    xs, ys = [], []
    for x, y in zip(busy, limits):
        if not xs or x > xs[-1]:
            xs.append(float(x))
            ys.append(float(y))
    return np.asarray(xs), np.asarray(ys)


@dataclass(frozen=True)
class SloCapacity:
    """Per GPU type: the one-adapter limit under the SLO (``one_tps``, at the type's smallest
    rank: the sound cap) and a ``RankCurve`` per rank class (module docstring)."""

    gpu_type: str
    one_tps: float
    curves: tuple[RankCurve, ...]

    def one_adapter_only(self) -> "SloCapacity":
        """The same type gated by the one-adapter limit alone (no curves)."""
        return SloCapacity(self.gpu_type, self.one_tps, ())

    def curve_for(self, rank: float) -> RankCurve:
        """The curve of the smallest measured rank >= ``rank`` (else the largest)."""
        ok = [c for c in self.curves if c.rank >= rank]
        return min(ok, key=lambda c: c.rank) if ok else max(self.curves, key=lambda c: c.rank)

    def row_caps(self, M: np.ndarray) -> np.ndarray:
        """The cap (tok/s) of each feature row of ``M`` (``surrogates.features.FEATURES``)."""
        from surrogates.features import IDX
        M = np.atleast_2d(np.asarray(M, dtype=np.float64))
        out = np.full(len(M), self.one_tps)
        if not self.curves:
            return out
        ranks = M[:, IDX["max_rank"]]
        for r in np.unique(ranks):
            sel = ranks == r
            busy = M[sel, IDX[BUSY_FEATURE]]
            out[sel] = np.minimum(out[sel], self.curve_for(r).cap_tps(busy))
        return out

    def to_dict(self) -> dict:
        return {"gpu_type": self.gpu_type, "one_tps": round(self.one_tps, 1),
                "curves": [c.to_dict() for c in self.curves]}


def _busy_at(limit_tps: float, k: int, rank: int, lengths) -> float:
    """The busy count of ``k`` equal-rate adapters of ``rank`` offering ``limit_tps`` in all."""
    from surrogates.features import IDX, adapter_feature_matrix
    per_rate = float(adapter_feature_matrix([rank], [1.0], lengths)[0, IDX["load"]])
    rate = limit_tps / (k * per_rate)
    return float(-k * np.expm1(-rate * BUSY_TAU_S))


def measure_slo_capacity(inst: Instance, duration_s: float, workers: int | None = None
                         ) -> dict[str, SloCapacity]:
    """``SloCapacity`` of every GPU type that starts a LoRA configuration for ``inst`` under
    its SLO (empty without one); with adapter classes, under the loosest SLO they allow
    (``Instance.bound_view``)."""
    from .capacity import predicted_limit
    from .feasibility import _bound_seeds, _type_rank, one_adapter_caps
    inst = inst.bound_view()
    if inst.slo is None:
        return {}
    ones = one_adapter_caps(inst, duration_s, workers)
    seeds = _bound_seeds(inst)
    n = len(inst.adapters)
    lightest = min(inst.load_tps(a) for a in inst.adapters)
    total_busy = float(-np.expm1(-np.array([a.rate for a in inst.adapters]) * BUSY_TAU_S).sum())
    out = {}
    for t in inst.gpu_types:
        if t.name not in ones:
            continue
        prof = t.load_profile()
        r0, one = _type_rank(inst, t), float(ones[t.name])

        def limit(rank: int, k: int, guess: float, prof=prof) -> float:
            return predicted_limit(prof, rank, k, inst.lengths, duration_s, seeds,
                                   inst.starvation_threshold, workers, inst.slo, guess)

        # the curve's shape from predicted limits, its level the sound one-adapter limit
        first = limit(r0, 1, one)
        counts, base, busy0 = [], [], []
        for k in [c for c in COUNTS if c <= n] or [1]:
            lim = one if k == 1 else min(limit(r0, k, base[-1] * first / one) * one / first,
                                         base[-1])
            b = _busy_at(lim, k, r0, inst.lengths) if lim > 0 else 0.0
            counts.append(k)
            base.append(float(lim))
            busy0.append(b)
            if lim < k * lightest or b >= total_busy or (len(busy0) > 1 and b <= busy0[-2]):
                break
        curves = []
        for r in sorted({a.rank for a in inst.adapters}):
            rank = _type_rank(inst, t, r)
            if rank is None:
                continue
            scale = 1.0 if rank == r0 else min(1.0, limit(rank, 1, first) / first)
            limits = [v * scale for v in base]
            busy = [_busy_at(v, k, r, inst.lengths) if v > 0 else 0.0
                    for v, k in zip(limits, counts)]
            curves.append(RankCurve(r, tuple(counts), tuple(limits), tuple(busy)))
        if curves:
            out[t.name] = SloCapacity(t.name, one, tuple(curves))
    return out


__all__ = ["BUSY_FEATURE", "COUNTS", "MAX_COUNT", "RankCurve", "SloCapacity", "measure_slo_capacity"]
