"""Each GPU's ``max_loras`` (Amax) chosen by the twin over the integers: the last step of a
verified solve.

Methods pack with Amax values from a grid (the surrogates are trained on 8, 16, 32, 64, ...;
the catalog templates measure 4, 8, 16, 32), so a GPU of 23 adapters comes out with 32 slots,
and the twin's best Amax can lie between grid points (64 low-rank adapters of mixed rates on
one Llama GPU are accepted at Amax 23-26 only). Once a placement is twin-accepted, this step
sets every GPU's Amax to the integer of highest twin score, with the workload that GPU draws
in verification (seed = instance seed + GPU index), so the verdict of the tuned placement is
the one the tuning saw.

**Which integers.** A GPU of ``n`` adapters is tried at every Amax ``1 .. min(n + 1, largest
startable)`` (``amax_search.amax_upper``). Larger values cannot be better: with ``n + 1``
slots the batch never holds ``max_loras`` distinct adapters, so no request ever waits for a
slot, and every slot beyond that only adds the per-slot LoRA work of each step and takes KV
cache (``tests/test_amax_tuning.py`` replays Amax up to ``n + 4`` on sampled GPUs and finds
none above the chosen one).

**Score.** ``amax_search.twin_scores``: twin throughput over ``threshold x`` the realised
offered load, discounted by the measured headroom when the instance asks for it, the smaller of
that and the latency SLO's score (bound / observed) under an SLO; a memory error scores
``-inf``. Scores within ``TIE_RTOL`` of the best count as ties (a few requests more or less
finished by the window's end), and ties go to the smallest Amax: past the point where the twin
serves the GPU's load, more slots only take KV cache.

**Exhaustive where affordable.** A GPU with at most ``BRUTE_MAX`` candidates is replayed at
every one of them: its Amax is the best integer one in the twin. A larger GPU (hundreds of
adapters) takes ``amax_search.twin_best_score``'s integer search (coarse scan, then
refinement around the best probe), a local best (the packing's own Amax stays when it scores
higher): the record says which (``exhaustive``). Where replaying every candidate of every GPU
would exceed ``MAX_REQUESTS`` simulated requests (a deterministic cost cap, the same on every
machine: about a minute on two cores), every GPU takes the search instead; the step is skipped,
with a note, when even that would exceed it, when adapters are split over GPUs (routing then
couples the GPUs' draws), and under a power budget or the energy objective
(a GPU's power depends on its Amax, and the packing met them at its own).

The tuned placement is verified again; should the fleet twin reject it (it replays the same
draws, so it should not), the placement keeps its packing's Amax values and says so.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from .amax_search import amax_upper, twin_best_score, twin_scores
from .instance import Instance
from .placement import GpuMetrics, GpuPlan, Placement
from .verify import verify

BRUTE_MAX = 128          # candidates up to which every Amax of a GPU is replayed (the
                         # request cap below bounds the cost)
TIE_RTOL = 1e-3          # scores this close to the best are ties (the smallest Amax wins)
MAX_REQUESTS = 2e7       # simulated requests one tuning may replay (about a minute on 2 cores)
SEARCH_REPLAYS = 16      # replays the integer search of a larger GPU is budgeted at


@dataclass(frozen=True)
class TunedGpu:
    """What the tuning did to one GPU: its Amax before and after, the candidates ``1 ..
    upper``, whether every one was replayed, and the best score."""

    gpu: int
    before: int
    after: int
    upper: int
    exhaustive: bool
    score: float

    def to_dict(self) -> dict:
        return {"gpu": self.gpu, "before": self.before, "after": self.after,
                "upper": self.upper, "exhaustive": self.exhaustive,
                "score": round(self.score, 6) if np.isfinite(self.score) else None}


def best_integer_amax(inst: Instance, plan: GpuPlan, seed: int, duration_s: float,
                      workers: int | None = None, brute_max: int | None = None
                      ) -> tuple[GpuPlan | None, TunedGpu]:
    """``plan`` at its best integer Amax in the twin (module docstring) with the twin metrics
    of that replay as ``verified``, or None when no Amax is accepted; and the record
    (``gpu`` is -1: the caller numbers it). Every Amax is replayed up to ``brute_max``
    candidates (default ``BRUTE_MAX``), the integer search above."""
    top = amax_upper(plan)
    if top < 1:
        return None, TunedGpu(-1, plan.max_loras, plan.max_loras, top, True, -np.inf)
    if top <= (BRUTE_MAX if brute_max is None else brute_max):
        cands = list(range(1, top + 1))
        res = twin_scores(inst, plan, cands, seed, duration_s, workers)
        top_s = max(v for v, _ in res)
        # (an accepted GPU that draws no request scores inf at every Amax: the smallest wins)
        tie = top_s - TIE_RTOL * abs(top_s) if np.isfinite(top_s) else top_s
        s, a, m = next((v, amax, met) for amax, (v, met) in zip(cands, res)
                       if v >= tie and (v >= 1.0 or top_s < 1.0))
        rec = TunedGpu(-1, plan.max_loras, a, top, True, float(s))
        if s < 1.0:
            return None, rec
        return replace(plan, max_loras=a, verified=GpuMetrics.from_run(m)), rec
    best, _, s = twin_best_score(inst, plan, seed, duration_s, workers)
    if best is None or best.max_loras != plan.max_loras:
        # a local search may miss the packing's own Amax: it is kept when it scores higher
        (s0, m0), = twin_scores(inst, plan, [plan.max_loras], seed, duration_s, workers)
        if s0 >= 1.0 and (best is None or s0 > s):
            best, s = replace(plan, verified=GpuMetrics.from_run(m0)), s0
    rec = TunedGpu(-1, plan.max_loras, best.max_loras if best else plan.max_loras, top, False,
                   float(s))
    return best, rec


def replays_needed(inst: Instance, gpus: Sequence[GpuPlan], duration_s: float,
                   brute_max: int | None = None) -> float:
    """Simulated requests the tuning of ``gpus`` replays (its cost, known before it runs) when
    GPUs of up to ``brute_max`` candidates (default ``BRUTE_MAX``) replay every one."""
    bm = BRUTE_MAX if brute_max is None else brute_max
    total = 0.0
    for g in gpus:
        top = amax_upper(g)
        runs = top if top <= bm else SEARCH_REPLAYS
        total += runs * duration_s * g.offered_tps / inst.mean_tokens
    return total


def tune_amax(inst: Instance, p: Placement, duration_s: float | None = None,
              workers: int | None = None, max_requests: float = MAX_REQUESTS) -> Placement:
    """``p`` (twin-accepted) with every GPU at its best integer Amax in the twin (module
    docstring), verified again; ``params["amax_tuning"]`` records each GPU's change. A
    placement that is not accepted, splits adapters or would cost more than ``max_requests``
    replayed requests is returned with the reason in ``params["amax_tuning"]`` only."""
    dur = float(duration_s if duration_s is not None else inst.duration_s)
    if p.verdict != "accepted" or not p.gpus:
        return p
    t0 = time.perf_counter()
    if any(share < 1.0 for g in p.gpus for _, share in g.adapters):
        return _skipped(p, "adapters are split over GPUs (their draws are coupled by routing)")
    if inst.power_budget_w is not None or p.objective == "energy" \
            or inst.objective.kind == "energy":
        return _skipped(p, "a GPU's power depends on its Amax, and the power budget or the "
                           "energy objective was met at the packing's")
    brute = BRUTE_MAX
    if replays_needed(inst, p.gpus, dur) > max_requests:
        brute = 0                   # too dear exhaustively: the integer search on every GPU
        cost = replays_needed(inst, p.gpus, dur, brute)
        if cost > max_requests:
            return _skipped(p, f"its replays ({cost:.3g} simulated requests) exceed the cap "
                               f"({max_requests:.3g}); Amax values are the packing's")
    tuned: list[GpuPlan] = []
    records: list[TunedGpu] = []
    for g, plan in enumerate(p.gpus):
        best, rec = best_integer_amax(inst, plan, inst.seed + g, dur, workers, brute)
        records.append(replace(rec, gpu=g))
        tuned.append(best if best is not None else plan)
    if all(r.after == r.before for r in records):
        return p.with_(params={**p.params, "amax_tuning": _record(records, t0)})
    cand = verify(p.with_(gpus=tuple(tuned)), inst, duration_s=dur, workers=workers)
    if cand.verdict != "accepted":
        return _skipped(p, "the fleet twin rejected the tuned placement; Amax values are the "
                           "packing's")
    changed = [r for r in records if r.after != r.before]
    searched = sum(1 for r in records if not r.exhaustive)
    note = ("max_loras chosen by the twin over every integer 1..adapters + 1"
            + (f" (by the integer search on {searched} GPU(s): more than {BRUTE_MAX} "
               "candidates, or every candidate of every GPU would pass the request cap)"
               if searched else "")
            + f" (changed on {len(changed)} of {len(records)} GPU(s): "
            + ", ".join(f"gpu {r.gpu} {r.before} -> {r.after}" for r in changed[:6])
            + (", ..." if len(changed) > 6 else "") + ")")
    return cand.with_(notes=cand.notes + (note,),
                      params={**cand.params, "amax_tuning": _record(records, t0)})


def _record(records: Sequence[TunedGpu], t0: float) -> dict:
    """``params["amax_tuning"]`` of a tuning that ran (started at ``t0``)."""
    return {"done": True, "exhaustive": all(r.exhaustive for r in records),
            "gpus": [r.to_dict() for r in records],
            "wall_s": round(time.perf_counter() - t0, 3)}


def _skipped(p: Placement, why: str) -> Placement:
    return p.with_(notes=p.notes + (f"max_loras not tuned by the twin: {why}",),
                   params={**p.params, "amax_tuning": {"done": False, "why": why}})


__all__ = ["BRUTE_MAX", "MAX_REQUESTS", "TIE_RTOL", "TunedGpu", "best_integer_amax", "replays_needed",
           "tune_amax"]
