"""Twin search of a GPU's Amax (``max_loras``) over every integer 1..hi.

The surrogates know Amax only on their training grid (8, 16, 32, 64, ...), yet the twin's
acceptance window can lie between grid points: 64 low-rank adapters of mixed rates on one Llama
GPU are accepted at Amax 23-26 only (throughput rises with Amax while fewer requests wait for a
slot, then falls as every step pays for idle slots). Replaying every integer costs ``hi`` twin
runs per GPU, so the search (``optim.integer_search.search_max``) exploits that shape:

1. **coarse scan** — ``COARSE_PROBES`` log-spaced integers over [1, hi], both ends included
   (every integer when hi is that small);
2. **bracket refinement** — let ``c`` be the best point evaluated so far and ``l < c < r`` its
   nearest evaluated neighbours; the midpoints of (l, c) and (c, r) are evaluated (in parallel),
   and this repeats until ``c``'s neighbours are ``c - 1`` and ``c + 1`` (or the ends). The result
   is an integer local maximum inside the coarse bracket of the best probe; with a unimodal
   throughput-vs-Amax curve it is the global maximum. The curve is not unimodal (run-to-run
   noise of a few tenths of a percent puts several local maxima on it; ``python -m
   experiments.amax_curves`` measures how often the search misses the best), so
3. **no reliance on the shape for a verdict** — when the search's best is rejected, every Amax
   it skipped is replayed (each stopping once it cannot be accepted): a GPU is given up only
   when no integer Amax is accepted.

Tests compare the search with brute force over every integer on small instances.

The score of an Amax is the GPU's twin throughput over ``threshold x`` its realised offered
load (the workload is the same for every Amax, drawn with the seed verification uses for that
GPU), so a score >= 1 means unstarved; under a latency SLO (the instance's ``slo``) it is
the smaller of that and the SLO's score (bound / observed, ``twin.slo``), so a score >= 1 means
accepted; a memory error scores ``-inf``. ``hi`` defaults to
min(adapters + 1, largest Amax the rank starts with): one more slot than adapters can pay off
(the batch then never holds ``max_loras`` adapters, so the scheduler never scans the waiting
queue for a slot's adapter; one adapter on two slots beats one slot).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

import numpy as np

from twin.fleet import simulate_fleet

from .capacity import max_startable_amax
from .integer_search import COARSE_PROBES, coarse_probes, search_max
from .instance import Instance
from .placement import GpuMetrics, GpuPlan


def amax_upper(plan: GpuPlan) -> int:
    """Largest Amax worth trying on ``plan``: min(adapters + 1, largest startable Amax)."""
    return min(plan.n_adapters + 1, max_startable_amax(plan.profile, plan.max_lora_rank))


def twin_scores(inst: Instance, plan: GpuPlan, amaxes: Sequence[int],
                seed: int | Sequence[int], duration_s: float,
                workers: int | None = None, stop_below: float | None = None
                ) -> list[tuple[float, object]]:
    """(score, twin metrics) of ``plan`` at each Amax, replaying the workload of ``seed`` (one
    seed for every Amax, or one per Amax), all in one parallel fleet run.

    ``stop_below`` (in (0, 1]): a replay stops once its score is certain to end below it, and
    its score is then an upper bound (still below ``stop_below``, the metrics those of the
    partial replay): for checks that only ask whether some Amax reaches ``stop_below``."""
    seeds = [int(seed)] * len(amaxes) if isinstance(seed, (int, np.integer)) else list(seed)
    if len(seeds) != len(amaxes):
        raise ValueError(f"twin_scores: {len(seeds)} seeds for {len(amaxes)} Amax values")
    cands = [replace(plan, max_loras=int(a), verified=None) for a in amaxes]   # cap kept
    jobs = [c.twin_assignment(inst.judging) for c in cands]
    res = simulate_fleet(jobs, duration_s=duration_s, lengths=inst.lengths, workers=workers,
                         check_routing=False, seeds=seeds, stop_below=stop_below)
    out = []
    for m in res.per_gpu:
        if m.memory_error or m.offered_realised_tps <= 0:
            s = -np.inf if m.memory_error else (np.inf if m.accepted else -np.inf)
        else:
            s = m.throughput_tps / (inst.starvation_threshold * m.offered_realised_tps)
            if m.headroom is not None:      # discounted by the measured headroom (twin.headroom)
                s /= 1.0 + float(m.headroom["h"])
            if m.slo is not None:           # and the latency SLO's (bound / observed)
                s = min(s, float(m.slo["score"]))
            if not m.accepted:              # the twin's verdict rules at the boundary
                s = min(s, np.nextafter(1.0, 0.0))
            elif s < 1.0:
                s = 1.0
        out.append((float(s), m))
    return out


def twin_best_amax(inst: Instance, plan: GpuPlan, seed: int, duration_s: float,
                   workers: int | None = None, k: int = COARSE_PROBES,
                   hi: int | None = None) -> tuple[GpuPlan | None, int]:
    """``plan`` at the Amax of highest twin score (module docstring), with its twin metrics as
    ``verified``, when the twin accepts it there; else None. Also returns the twin runs used.

    None only when no integer Amax in 1..hi is accepted: when the search's best is rejected,
    every Amax it skipped is replayed (stopping early once it cannot be accepted), because the
    score-vs-Amax curve is not unimodal (``experiments.amax_curves``)."""
    best, runs, _ = twin_best_score(inst, plan, seed, duration_s, workers, k, hi)
    return best, runs


def twin_best_score(inst: Instance, plan: GpuPlan, seed: int, duration_s: float,
                    workers: int | None = None, k: int = COARSE_PROBES,
                    hi: int | None = None) -> tuple[GpuPlan | None, int, float]:
    """``twin_best_amax`` and the best score it saw (``-inf`` when no Amax starts): how far a
    rejected GPU is from acceptance, for searches that move adapters toward it."""
    top = amax_upper(plan) if hi is None else int(hi)
    if top < 1:
        return None, 0, -np.inf
    metrics: dict[int, object] = {}

    def score(xs: list[int]) -> list[float]:
        res = twin_scores(inst, plan, xs, seed, duration_s, workers)
        metrics.update(zip(xs, (m for _, m in res)))
        return [s for s, _ in res]

    best, s, seen = search_max(score, top, k)
    runs = len(seen)
    if s < 1.0:
        # the curve can have several local maxima: before the GPU is given up, every Amax the
        # search skipped is replayed, each stopping once it cannot reach 1 (accepted)
        rest = [a for a in range(1, top + 1) if a not in seen]
        if rest:
            res = twin_scores(inst, plan, rest, seed, duration_s, workers, stop_below=1.0)
            runs += len(rest)
            ok = [(v, a, m) for a, (v, m) in zip(rest, res) if v >= 1.0]
            if ok:
                s, best, m0 = max(ok, key=lambda t: (t[0], -t[1]))
                metrics[best] = m0
        if s < 1.0:
            return None, runs, float(s)
    m = metrics[best]
    return replace(plan, max_loras=best, verified=GpuMetrics.from_run(m)), runs, float(s)


__all__ = ["COARSE_PROBES", "coarse_probes", "search_max", "amax_upper", "twin_scores",
           "twin_best_amax", "twin_best_score"]
