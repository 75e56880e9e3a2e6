"""A learned router: an online reward model of TTFT from snapshot features.

For every request it routes, the router keeps the chosen GPU's features at routing time; when
the request's first token is out (the fleet simulation calls :meth:`LearnedRouter.observe` at
that virtual time) the pair (features -> TTFT) becomes a training sample. Every
``refit_every`` new samples it refits a ridge regression (scikit-learn) of log TTFT on the last
``window`` samples, with engineered terms (queue and outstanding counts scaled by the GPU's
reference step time, a cold-adapter term growing with the queue, KV use). Requests that have
waited longer than most observed TTFTs without a first token are added as censored samples
(label = their age so far, a lower bound), so an overloaded GPU is learned before its requests
finish.

Routing: the home with the lowest predicted TTFT; with probability ``explore`` a home at random
(seeded) among those predicted within ``explore_within`` (log TTFT, default log 2: at most twice
the best) — exploration that stays out of the TTFT tail it is judged on. It falls back to the
affinity + load scorer while it has fewer than ``min_samples`` samples and whenever a
candidate's features lie outside the training range (by more than ``ood_margin`` of the range):
a model is not trusted out of distribution. It minimises each request's own predicted TTFT; the
slots and batch room that request takes from others are not priced (see the README's routing
study: this loses to the affinity scorer under a flash crowd).
"""

from __future__ import annotations

import math
from collections import deque
from typing import Sequence

import numpy as np

from .policies import AffinityLoadRouter, _Seeded
from .snapshot import GpuSnapshot, RouteRequest

FEATURE_NAMES = ("outstanding", "waiting", "running", "kv_used_frac", "warm",
                 "adapter_outstanding", "active_fill", "speed_ms", "input_len")


def raw_features(s: GpuSnapshot, request: RouteRequest) -> np.ndarray:
    """The snapshot features of one candidate GPU (order: :data:`FEATURE_NAMES`)."""
    warm = 1.0 if (s.resident or s.adapter_outstanding > 0) else 0.0
    return np.array([s.outstanding, s.waiting, s.running, s.kv_used_frac, warm,
                     s.adapter_outstanding, s.active_adapters / max(s.max_loras, 1), s.speed_ms,
                     request.input_len], dtype=np.float64)


def design(raw: np.ndarray) -> np.ndarray:
    """Engineered regression terms from raw features (rows = samples)."""
    raw = np.atleast_2d(raw)
    out, wait, run, kv, warm, aout, fill, speed, inp = raw.T
    sp = speed / 1000.0
    cold = 1.0 - warm
    full = np.maximum(fill - 1.0 + 1e-9, 0.0) > 0      # every slot busy: a cold adapter queues
    return np.column_stack([
        np.log1p(out), np.log1p(wait), np.log1p(run), kv, kv * kv, cold, cold * np.log1p(wait),
        fill, cold * fill, cold * full, cold * np.maximum(fill - 1.0, 0.0), np.log(speed),
        out * sp, wait * sp, np.log1p(out * sp), np.log1p(wait * sp), np.minimum(aout, 8.0),
        inp / 1000.0])


class LearnedRouter(_Seeded):
    """Online TTFT model + argmin routing with seeded exploration and a heuristic fallback."""

    name = "learned"
    learns = True

    def __init__(self, seed: int, refit_every: int = 100, min_samples: int = 200,
                 window: int = 5000, explore: float = 0.02, ood_margin: float = 0.1,
                 alpha: float = 1.0, miss_penalty: float = 8.0,
                 explore_within: float = math.log(2.0)) -> None:
        super().__init__(seed)
        for name, v, lo in (("refit_every", refit_every, 1), ("min_samples", min_samples, 2),
                            ("window", window, 2)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
                raise ValueError(f"learned router {name}: must be an integer >= {lo}, got {v!r}")
        if not 0.0 <= explore < 1.0:
            raise ValueError(f"learned router explore: must be in [0, 1), got {explore!r}")
        if not (np.isfinite(ood_margin) and ood_margin >= 0):
            raise ValueError(f"learned router ood_margin: must be >= 0, got {ood_margin!r}")
        self.refit_every, self.min_samples = int(refit_every), int(min_samples)
        self.window = int(window)
        self.explore, self.ood_margin, self.alpha = float(explore), float(ood_margin), float(alpha)
        if not (np.isfinite(explore_within) and explore_within >= 0):
            raise ValueError(f"learned router explore_within: must be >= 0, got {explore_within!r}")
        self.explore_within = float(explore_within)
        self.fallback = AffinityLoadRouter(int(self.rng.integers(2**32)), miss_penalty)
        self._x: deque[np.ndarray] = deque(maxlen=self.window)
        self._y: deque[float] = deque(maxlen=self.window)
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
            pred = design(feats) @ self._coef + self._intercept
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
        self._new += 1
        if self._new >= self.refit_every and len(self._y) >= self.min_samples:
            self._refit(now)

    def _refit(self, now: float) -> None:
        from sklearn.linear_model import Ridge

        x = np.stack(self._x)
        y = np.asarray(self._y)
        long_wait = float(np.quantile(y, 0.9))
        cens = [(f, now - t) for f, t in self._pending.values() if now - t > long_wait]
        if cens:
            cens = cens[-self.window // 4:]
            x = np.vstack([x, np.stack([f for f, _ in cens])])
            y = np.concatenate([y, [a for _, a in cens]])
        d = design(x)
        mu, sd = d.mean(axis=0), d.std(axis=0)
        sd[sd < 1e-12] = 1.0
        model = Ridge(alpha=self.alpha).fit((d - mu) / sd, np.log(np.maximum(y, 1e-3)))
        self._coef = model.coef_ / sd
        self._intercept = float(model.intercept_ - np.dot(model.coef_, mu / sd))
        lo, hi = x.min(axis=0), x.max(axis=0)
        pad = self.ood_margin * (hi - lo)
        self._lo, self._hi = lo - pad - 1e-9, hi + pad + 1e-9
        self._new = 0
        self.refits += 1
