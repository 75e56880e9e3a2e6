"""A learned router: an online reward model of TTFT from snapshot features (Lodestar-style).

For every request it routes, the router keeps the chosen GPU's features at routing time; when
the request's first token is out (the fleet simulation calls :meth:`LearnedRouter.observe` at
that virtual time) the pair (features -> TTFT) becomes a training sample. Every
``refit_every`` new samples it refits a ridge regression (scikit-learn) of log TTFT on the last
``window`` samples, weighted by recency (weight halves every ``half_life_s`` of virtual time, so
the model follows drifting rates), with engineered terms: queue and outstanding counts scaled by
the GPU's reference step time, the prompt's prefill work on this GPU, and the adapter-slot state
of the request's own adapter — running or queued there (it shares a batch slot), cold with a
free slot (it pays its load time), or *blocked* (cold and every slot taken by running or queued
adapters: it waits until one drains, the long tail of a multi-LoRA server). Requests that have
waited longer than most observed TTFTs without a first token are added as censored samples
(label = their age so far, a lower bound), so an overloaded GPU is learned before its requests
finish.

Routing: the home with the lowest score = predicted log TTFT + ``slot_cost`` x (fraction of the
GPU's batch slots already running) when the request's adapter is cold there. The price stands
for what the request's own TTFT does not show: a cold adapter takes a slot that later requests
of other adapters may then wait for (without it the router spreads adapters over every home and
the slots fill; ``python -m experiments.routing --ablation`` measures it). With probability ``explore`` a home
at random (seeded) among those scored within ``explore_within`` (log TTFT, default log 2: at
most twice the best) — exploration that stays out of the TTFT tail it is judged on. It falls
back to the affinity + load scorer while it has fewer than ``min_samples`` samples and whenever
a candidate's features lie outside the training range (by more than ``ood_margin`` of the
range): a model is not trusted out of distribution.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Sequence

import numpy as np

from .policies import AffinityLoadRouter, _Seeded
from .snapshot import GpuSnapshot, RouteRequest

FEATURE_NAMES = ("outstanding", "waiting", "running", "kv_used_frac", "adapter_running",
                 "adapter_queued", "slot_fill", "waiting_adapters", "blocked", "adapter_outstanding",
                 "speed_ms", "input_len", "load_ms")


def raw_features(s: GpuSnapshot, request: RouteRequest) -> np.ndarray:
    """The snapshot features of one candidate GPU (order: :data:`FEATURE_NAMES`).

    ``adapter_queued``: the adapter has requests at the server or in flight from the gateway
    (the request can join their batch slot); ``slot_fill``: running adapters / ``max_loras``;
    ``blocked``: the adapter is neither running nor queued and no batch slot is free, so the
    request waits until a running adapter drains."""
    queued = s.adapter_running or s.adapter_waiting or s.adapter_outstanding > 0
    blocked = (not queued) and s.free_slots == 0
    return np.array([s.outstanding, s.waiting, s.running, s.kv_used_frac,
                     float(s.adapter_running), float(queued),
                     s.running_adapters / max(s.max_loras, 1), s.waiting_adapters,
                     float(blocked), s.adapter_outstanding, s.speed_ms, request.input_len,
                     s.load_ms], dtype=np.float64)


def design(raw: np.ndarray) -> np.ndarray:
    """Engineered regression terms from raw features (rows = samples): queue lengths scaled by
    the GPU's step time, the prompt's prefill work on this GPU, and the slot terms (a cold
    adapter's load, a blocked adapter's wait growing with the adapters ahead of it)."""
    raw = np.atleast_2d(raw)
    (out, wait, run, kv, arun, queued, fill, wad, blocked, aout, speed, inp, load) = raw.T
    sp = speed / 1000.0
    cold = 1.0 - queued
    return np.column_stack([
        np.log1p(out), np.log1p(wait), np.log1p(run), kv, kv * kv, np.log(speed),
        np.log1p(out * sp), np.log1p(wait * sp), out * sp, wait * sp,
        inp * sp / 1000.0, np.log1p(inp), cold, cold * load / 1000.0, cold * fill,
        blocked, blocked * np.log1p(wad), blocked * np.log1p(wait), blocked * np.log1p(run),
        arun, fill, np.log1p(wad), np.minimum(aout, 8.0)])


class LearnedRouter(_Seeded):
    """Online TTFT model + argmin routing with seeded exploration and a heuristic fallback."""

    name = "learned"
    learns = True

    def __init__(self, seed: int, refit_every: int = 100, min_samples: int = 200,
                 window: int = 5000, explore: float = 0.02, ood_margin: float = 0.1,
                 alpha: float = 1.0, miss_penalty: float = 8.0,
                 explore_within: float = math.log(2.0), half_life_s: float = 120.0,
                 slot_cost: float = 0.5) -> None:
        super().__init__(seed)
        for name, v, lo in (("refit_every", refit_every, 1), ("min_samples", min_samples, 2),
                            ("window", window, 2)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
                raise ValueError(f"learned router {name}: must be an integer >= {lo}, got {v!r}")
        if not 0.0 <= explore < 1.0:
            raise ValueError(f"learned router explore: must be in [0, 1), got {explore!r}")
        for name, v in (("ood_margin", ood_margin), ("explore_within", explore_within),
                        ("slot_cost", slot_cost)):
            if not (np.isfinite(v) and v >= 0):
                raise ValueError(f"learned router {name}: must be a finite number >= 0, "
                                 f"got {v!r}")
        # ridge alpha > 0: a negative penalty rewards large coefficients (no minimum), 0 is an
        # unregularised fit that fails on collinear features
        for name, v, strict in (("alpha", alpha, True), ("miss_penalty", miss_penalty, False)):
            ok = not isinstance(v, bool) and isinstance(v, (int, float, np.number)) \
                and bool(np.isfinite(v)) and (v > 0 if strict else v >= 0)
            if not ok:
                raise ValueError(f"learned router {name}: must be a finite number "
                                 f"{'>' if strict else '>='} 0, got {v!r}")
        if not half_life_s > 0:
            raise ValueError(f"learned router half_life_s: must be > 0, got {half_life_s!r}")
        self.refit_every, self.min_samples = int(refit_every), int(min_samples)
        self.window = int(window)
        self.explore, self.ood_margin, self.alpha = float(explore), float(ood_margin), float(alpha)
        self.explore_within = float(explore_within)
        self.half_life_s, self.slot_cost = float(half_life_s), float(slot_cost)
        self.fallback = AffinityLoadRouter(int(self.rng.integers(2**32)), miss_penalty)
        self._x: deque[np.ndarray] = deque(maxlen=self.window)
        self._y: deque[float] = deque(maxlen=self.window)
        self._t: deque[float] = deque(maxlen=self.window)
        self._pending: dict[int, tuple[np.ndarray, float]] = {}
        self._new = 0
        self._coef: np.ndarray | None = None
        self._intercept = 0.0
        self._lo = self._hi = None
        self.decisions = {"model": 0, "explore": 0, "fallback_cold": 0, "fallback_ood": 0}
        self.refits = 0

    # ------------------------------------------------------------------ routing
    def route(self, request: RouteRequest, snapshots: Sequence[GpuSnapshot]) -> int:
        feats = np.stack([raw_features(s, request) for s in snapshots])
        if len(snapshots) == 1:
            k = 0
        elif self._coef is None:
            self.decisions["fallback_cold"] += 1
            k = self._index(self.fallback.route(request, snapshots), snapshots)
        elif np.any(feats < self._lo) or np.any(feats > self._hi):
            self.decisions["fallback_ood"] += 1
            k = self._index(self.fallback.route(request, snapshots), snapshots)
        else:
            pred = self.score(feats)
            near = np.flatnonzero(pred <= pred.min() + self.explore_within)
            if len(near) > 1 and self.rng.random() < self.explore:
                self.decisions["explore"] += 1
                k = int(self.rng.choice(near))
            else:
                self.decisions["model"] += 1
                best = np.flatnonzero(pred <= pred.min() + 1e-12)
                k = int(best[0]) if len(best) == 1 else int(self.rng.choice(best))
        self._pending[request.index] = (feats[k], request.arrival_s)
        return snapshots[k].gpu

    def score(self, feats: np.ndarray) -> np.ndarray:
        """Predicted log TTFT plus the slot price: a request whose adapter is not queued on a
        GPU takes one of its batch slots, costing ``slot_cost`` x the fraction already taken."""
        pred = design(feats) @ self._coef + self._intercept
        cold = 1.0 - feats[:, FEATURE_NAMES.index("adapter_queued")]
        return pred + self.slot_cost * cold * feats[:, FEATURE_NAMES.index("slot_fill")]

    @staticmethod
    def _index(gpu: int, snapshots: Sequence[GpuSnapshot]) -> int:
        return next(i for i, s in enumerate(snapshots) if s.gpu == gpu)

    def predict_log_ttft(self, request: RouteRequest, snapshots: Sequence[GpuSnapshot]
                         ) -> np.ndarray | None:
        """The model's log TTFT (s) per candidate, or None before the first fit."""
        if self._coef is None:
            return None
        feats = np.stack([raw_features(s, request) for s in snapshots])
        return design(feats) @ self._coef + self._intercept

    # ------------------------------------------------------------------ learning
    def observe(self, request_index: int, ttft_s: float, now: float) -> None:
        item = self._pending.pop(request_index, None)
        if item is None:
            return
        self._x.append(item[0])
        self._y.append(float(ttft_s))
        self._t.append(float(now))
        self._new += 1
        if self._new >= self.refit_every and len(self._y) >= self.min_samples:
            self._refit(now)

    def _refit(self, now: float) -> None:
        from sklearn.linear_model import Ridge

        x = np.stack(self._x)
        y = np.asarray(self._y)
        t = np.asarray(self._t)
        long_wait = float(np.quantile(y, 0.9))
        cens = [(f, now - t0) for f, t0 in self._pending.values() if now - t0 > long_wait]
        if cens:
            cens = cens[-self.window // 4:]
            x = np.vstack([x, np.stack([f for f, _ in cens])])
            y = np.concatenate([y, [a for _, a in cens]])
            t = np.concatenate([t, np.full(len(cens), now)])
        w = np.exp2(-(now - t) / self.half_life_s)
        d = design(x)
        mu, sd = d.mean(axis=0), d.std(axis=0)
        sd[sd < 1e-12] = 1.0
        model = Ridge(alpha=self.alpha).fit((d - mu) / sd, np.log(np.maximum(y, 1e-3)),
                                            sample_weight=w)
        self._coef = model.coef_ / sd
        self._intercept = float(model.intercept_ - np.dot(model.coef_, mu / sd))
        lo, hi = x.min(axis=0), x.max(axis=0)
        pad = self.ood_margin * (hi - lo)
        self._lo, self._hi = lo - pad - 1e-9, hi + pad + 1e-9
        self._new = 0
        self.refits += 1
