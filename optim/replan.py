"""Churn-aware re-planning: from a previous plan to one for a drifted instance, with few moves.

Rates drift, adapters arrive and retire; re-solving from scratch serves the new instance but
reshuffles nearly every adapter, and each move costs a load (and the old home's drain). A
re-plan keeps what still works:

1. **carry over** — every previous GPU keeps its configuration and its adapters that are still in
   the instance (at their new rates; a split adapter that lost a home has its shares
   renormalised); GPUs left empty are removed;
2. **twin check** — the carried GPUs are replayed in the twin with the workload each will see in
   verification (seed = instance seed + GPU index);
3. **starving GPUs** — first the twin searches a new Amax (a restart, no move:
   ``amax_search.twin_best_amax``); failing that, the GPU sheds its largest-load adapters until
   its offered load is below the throughput the twin measured (with a margin), then one at a
   time until the twin accepts it (largest first: the fewest moves for the load shed);
4. **placing** the shed and the new adapters — largest load first onto the kept GPU with the
   most predicted headroom (fast surrogate at the GPU's own Amax; rank within its
   ``max_lora_rank``; when the cautious surrogate accepts none, the least-loaded such GPU),
   each receiving GPU checked by the twin (at its Amax, else at the Amax the
   twin finds best: a restart) and rolled back if rejected; what remains goes to new GPUs by
   the greedy fill (``greedy.greedy_plans``);
5. **draining** — while the churn budget allows (``max_moves``, or ``churn_weight`` x adapters
   on the GPU < 1 GPU), the GPU cheapest to empty (fewest adapters, then least load: often one
   opened earlier for a few hot adapters) is emptied into the others the same way, kept only
   when the twin accepts every receiver;
6. **final verification** of the whole plan (``optim.verify``); GPUs it rejects go through
   step 3 again (their shed adapters placed as in step 4) until accepted or ``max_rounds``.

A second candidate is a **fresh solve** (when given): its GPUs are relabelled onto the previous
ones to maximise the adapters they share (an assignment problem, ``relabel``), and its churn is
counted against that labelling. The re-plan returns the candidate of lower cost
``GPUs + churn_weight x moves`` (with ``max_moves``: fewest GPUs among the candidates within
the budget, else the fewest moves), preferring a twin-accepted one. ``max_moves`` bounds the
optional moves (draining); moves that stop a GPU from starving are always made.

Churn (``Churn``): *loads* = (adapter, GPU) homes that the previous GPU at that place did not
hold, *moves* = those loads of adapters that existed before (a relocation; a new adapter's
first load is not a move), *unloads* = homes given up, GPUs added / removed, and *restarts* =
kept GPUs whose Amax or max rank changed.

**Transition** (``ReplanOptions.transition``, on by default): each candidate's switch-over is
replayed in the routed fleet twin (``replay_transition``): the previous plan serves its own
rates for ``TRANSITION_WARMUP_S``, then the new rates and the new routing take over. The switch
is gentle (``twin.routing.PlanSwitch``, ``gentle``; ``ReplanOptions.switch_schedule``):
make-before-break — a moved adapter stays on its old homes until its new home is up and has
loaded it — and the adapters of a server that is restarting go to serving GPUs with free
slots meanwhile (or wait for it when its queue is the shortest); restarts go one at a time
(the next when the previous is up) or, when that starves or does more damage, all at once
(``auto``: both are replayed when two servers or more restart). ``abrupt`` is the switch
without care: moves at once, every restart at the switch, its requests waiting for it. The
report (late and unfinished requests against the new plan in steady state, TTFT, throughput,
drain and restart times, the restart schedule;
``starved``: the twin's starvation rule fails over the switch-over window where the new plan in
steady state passes it or does better, or more requests are late than in steady state) is
stored in ``params.replan.transition``. The choice then also weighs the switch-over: among the
candidates that cost at most ``switch_allowance`` (``SWITCH_ALLOWANCE`` GPUs) more than the
first in the order above (twin-accepted ones only, when there are), the first whose
switch-over does not starve wins; when all of those starve, the least damaging one (fewest
late and unfinished requests beyond steady state, then the smallest per-GPU throughput
shortfall), and ``params.replan.transition_choice`` says so. The allowance keeps the churn
economics: a reshuffle of many adapters is not bought for a clean switch-over.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import Callable, Sequence

import numpy as np

from twin.fleet import simulate_fleet
from twin.workload import Adapter

from .instance import Instance
from .placement import GpuMetrics, GpuPlan, Placement, plan_gpu

DEFAULT_CHURN_WEIGHT = 0.02      # GPUs per adapter move: draining a GPU of < 50 adapters pays
SHED_MARGIN = 0.97               # shed load down to this fraction of the measured throughput
SWITCH_SCHEDULES = ("auto", "staggered", "parallel", "abrupt")   # replay_transition's schedule
SWITCH_ALLOWANCE = 0.25          # GPUs (cost units) a switch-over that does not starve is worth


@dataclass(frozen=True)
class ReplanOptions:
    """Budget and twin settings of a re-plan (module docstring)."""

    churn_weight: float = DEFAULT_CHURN_WEIGHT
    max_moves: int | None = None
    duration_s: float | None = None
    workers: int | None = None
    max_rounds: int = 8
    max_drain_attempts: int = 4
    transition: bool = True      # replay the switch-over in the routed fleet twin
    switch_schedule: str = "auto"    # ... how (replay_transition's ``schedule``)
    switch_allowance: float = SWITCH_ALLOWANCE

    def __post_init__(self) -> None:
        if not (self.churn_weight >= 0 and np.isfinite(self.churn_weight)):
            raise ValueError("churn_weight: must be a finite number >= 0, got "
                             f"{self.churn_weight!r}")
        if self.max_moves is not None and self.max_moves < 0:
            raise ValueError(f"max_moves: must be >= 0, got {self.max_moves!r}")
        if not (self.switch_allowance >= 0 and np.isfinite(self.switch_allowance)):
            raise ValueError("switch_allowance: must be a finite number >= 0, got "
                             f"{self.switch_allowance!r}")
        if self.switch_schedule not in SWITCH_SCHEDULES:
            raise ValueError(f"switch_schedule: {self.switch_schedule!r} is not one of "
                             f"{list(SWITCH_SCHEDULES)}")


@dataclass(frozen=True)
class Churn:
    """What a transition from the previous plan costs (module docstring)."""

    moves: int
    loads: int
    unloads: int
    gpus_added: int
    gpus_removed: int
    restarts: int
    kept_gpus: int

    def to_dict(self) -> dict[str, int]:
        return {k: int(v) for k, v in vars(self).items()}


@dataclass(frozen=True)
class ReplanResult:
    """The new plan, its churn, each new GPU's previous index (None = added), which candidate
    won (``incremental`` or ``resolve``) and the steps taken."""

    placement: Placement
    churn: Churn
    origin: tuple[int | None, ...]
    candidate: str
    steps: tuple[str, ...] = ()

    def cost(self, churn_weight: float) -> float:
        return self.placement.n_gpus + churn_weight * self.churn.moves


# ----------------------------------------------------------------------------- churn
def _ids(g: GpuPlan) -> set[str]:
    return {a.id for a, _ in g.adapters}


def churn_between(prev: Placement, new: Sequence[GpuPlan],
                  origin: Sequence[int | None]) -> Churn:
    """Churn of going from ``prev`` to ``new`` when new GPU ``j`` takes the place of previous
    GPU ``origin[j]`` (None: an added GPU)."""
    existed = {a.id for g in prev.gpus for a, _ in g.adapters}
    matched = [o for o in origin if o is not None]
    if len(set(matched)) != len(matched):
        raise ValueError("origin: a previous GPU is the origin of two new GPUs")
    moves = loads = unloads = restarts = 0
    for g, o in zip(new, origin):
        old = _ids(prev.gpus[o]) if o is not None else set()
        added = _ids(g) - old
        loads += len(added)
        moves += len(added & existed)
        unloads += len(old - _ids(g))
        if o is not None:
            p = prev.gpus[o]
            restarts += (p.max_loras, p.max_lora_rank) != (g.max_loras, g.max_lora_rank)
    gone = set(range(prev.n_gpus)) - set(matched)
    unloads += sum(prev.gpus[o].n_adapters for o in gone)
    return Churn(moves, loads, unloads, sum(o is None for o in origin), len(gone), restarts,
                 len(matched))


def relabel(prev: Placement, new: Sequence[GpuPlan]) -> tuple[int | None, ...]:
    """Previous GPU index for each new GPU maximising the adapters they share (same GPU type
    only; ``scipy.optimize.linear_sum_assignment``); None for new GPUs left unmatched."""
    from scipy.optimize import linear_sum_assignment
    if not prev.gpus or not new:
        return tuple(None for _ in new)
    overlap = np.zeros((len(new), prev.n_gpus))
    for j, g in enumerate(new):
        ids = _ids(g)
        for o, p in enumerate(prev.gpus):
            if p.gpu_type == g.gpu_type:
                overlap[j, o] = len(ids & _ids(p))
    rows, cols = linear_sum_assignment(-overlap)
    origin: list[int | None] = [None] * len(new)
    for j, o in zip(rows, cols):
        if new[j].gpu_type == prev.gpus[o].gpu_type:
            origin[j] = int(o)
    return tuple(origin)


# ----------------------------------------------------------------------------- twin helpers
def _twin(inst: Instance, plans: Sequence[GpuPlan], indices: Sequence[int], duration_s: float,
          workers: int | None) -> list[GpuMetrics]:
    """Twin metrics of ``plans`` as GPUs ``indices`` of a placement (their verification seeds)."""
    if not plans:
        return []
    jobs = [p.twin_assignment(inst.judging) for p in plans]
    res = simulate_fleet(jobs, duration_s=duration_s, lengths=inst.lengths, workers=workers,
                         check_routing=False, seeds=[inst.seed + i for i in indices])
    return [GpuMetrics.from_run(m) for m in res.per_gpu]


def _with(inst: Instance, g: GpuPlan, pairs: Sequence[tuple[Adapter, float]]) -> GpuPlan:
    """``g`` (same type, Amax, max rank) serving ``pairs``."""
    return plan_gpu(g.gpu_type, g.profile, g.max_loras, pairs, inst.mean_tokens, g.max_lora_rank)


class _Headroom:
    """Fast-surrogate check: does a GPU still pass with more adapters, at its own Amax (or the
    nearest grid Amax above, the surrogate's domain)?"""

    def __init__(self, inst: Instance) -> None:
        from surrogates.features import adapter_feature_matrix
        from .greedy import amax_candidates, load_surrogate
        self.inst = inst
        self.models = {t.name: load_surrogate(t.profile, "fast") for t in inst.gpu_types}
        self.grid = amax_candidates()
        self._phi = adapter_feature_matrix

    def _vec(self, a: Adapter, share: float) -> np.ndarray:
        return self._phi([a.rank], [a.rate * share], self.inst.lengths)[0]

    def margin(self, g: GpuPlan, extra: Sequence[Adapter] = ()) -> float | None:
        """Predicted throughput / (threshold x load) of ``g`` plus ``extra`` (None: starved)."""
        from .greedy import _rows
        vecs = [self._vec(a, s) for a, s in g.adapters] + [self._vec(a, 1.0) for a in extra]
        phi = np.sum(vecs, axis=0)
        amax = self.grid[self.grid >= g.max_loras]
        amax = amax[:1] if len(amax) else self.grid[-1:]
        M = _rows(phi[None, :], np.array([1]), g.max_lora_rank, amax)
        thr, starved = self.models[g.gpu_type].predict_unchecked(M)
        if bool(starved[0]):
            return None
        load = (sum(a.rate * s for a, s in g.adapters) + sum(a.rate for a in extra)) \
            * self.inst.mean_tokens
        return float(thr[0]) / max(self.inst.starvation_threshold * load, 1e-12)


# ----------------------------------------------------------------------------- steps
def carry_over(prev: Placement, inst: Instance) -> tuple[list[GpuPlan], list[int], list[Adapter],
                                                         list[str]]:
    """Step 1: (kept GPUs, their previous indices, adapters without a home, notes)."""
    from .instance import adapters_by_id
    ids = adapters_by_id(inst.adapters)
    types = {t.name: t for t in inst.gpu_types}
    share_left: dict[str, float] = {}
    kept: list[tuple[int, GpuPlan, list[tuple[Adapter, float]]]] = []
    notes: list[str] = []
    homeless: list[Adapter] = []
    for o, g in enumerate(prev.gpus):
        pairs = [(ids[a.id], s) for a, s in g.adapters if a.id in ids]
        if g.gpu_type not in types:
            notes.append(f"previous gpu {o}: type '{g.gpu_type}' is not in the instance; its "
                         f"{len(pairs)} adapter(s) move")
            homeless.extend(a for a, _ in pairs)
            continue
        if not pairs:
            continue
        for a, s in pairs:
            share_left[a.id] = share_left.get(a.id, 0.0) + s
        kept.append((o, g, pairs))
    plans, origin = [], []
    moved_split = {a.id for a in homeless}
    for o, g, pairs in kept:
        pairs = [(a, s / share_left[a.id]) for a, s in pairs if a.id not in moved_split]
        if not pairs:
            continue
        t = types[g.gpu_type]
        plans.append(plan_gpu(g.gpu_type, t.profile, g.max_loras, pairs, inst.mean_tokens,
                              g.max_lora_rank))
        origin.append(o)
    placed = {a.id for g in plans for a, _ in g.adapters}
    homeless = list({a.id: a for a in homeless if a.id not in placed}.values())
    homeless += [a for a in inst.adapters if a.id not in placed and a.id not in
                 {h.id for h in homeless}]
    return plans, origin, homeless, notes


def _shed(inst: Instance, g: GpuPlan, m: GpuMetrics, index: int, duration_s: float,
          workers: int | None) -> tuple[GpuPlan | None, list[Adapter], int]:
    """Step 3 for one starving GPU: (fixed GPU or None when nothing is left, shed adapters,
    restarts). Amax search first, then the largest-load adapters go."""
    from .amax_search import twin_best_amax
    if not m.memory_error:
        best, _ = twin_best_amax(inst, g, inst.seed + index, duration_s, workers)
        if best is not None:
            return best, [], int(best.max_loras != g.max_loras)
    pairs = sorted(g.adapters, key=lambda p: -p[0].rate * p[1])
    target = SHED_MARGIN * m.throughput_tps / inst.starvation_threshold
    load = sum(a.rate * s for a, s in pairs) * inst.mean_tokens
    k = 0
    while k < len(pairs) - 1 and load > target:
        load -= pairs[k][0].rate * pairs[k][1] * inst.mean_tokens
        k += 1
    k = max(k, 1)
    while k < len(pairs):
        cand = _with(inst, g, pairs[k:])
        (cm,) = _twin(inst, [cand], [index], duration_s, workers)
        if cm.ok:
            return replace(cand, verified=cm), [a for a, _ in pairs[:k]], 0
        k += 1
    return None, [a for a, _ in pairs], 0


def _insert(inst: Instance, gpus: list[GpuPlan], adapters: Sequence[Adapter], head: _Headroom,
            duration_s: float, workers: int | None, exclude: set[int] = frozenset()
            ) -> tuple[list[GpuPlan], list[Adapter]]:
    """Step 4: place ``adapters`` (whole, share 1) onto ``gpus`` by predicted headroom, then
    check every receiving GPU in the twin and roll back the rejected ones. Returns (GPUs,
    adapters left over)."""
    gpus = list(gpus)
    added: dict[int, list[Adapter]] = {}
    margins = {j: head.margin(g) for j, g in enumerate(gpus) if j not in exclude}
    left: list[Adapter] = []
    def load(j: int) -> float:
        return gpus[j].offered_tps + sum(x.rate for x in added.get(j, [])) * inst.mean_tokens

    for a in sorted(adapters, key=lambda a: (-a.rate, a.id)):
        best, best_m = None, 1.0
        fits = [j for j in margins if a.rank <= gpus[j].max_lora_rank]
        for j in fits:
            if margins[j] is None:
                continue
            m = head.margin(gpus[j], added.get(j, []) + [a])
            if m is not None and m > best_m:
                best, best_m = j, m
        if best is None and fits:
            # the surrogate is cautious near capacity (greedy's compaction exists for that):
            # try the least-loaded GPU that can hold the rank; the twin decides below
            best = min(fits, key=load)
        if best is None:
            left.append(a)
        else:
            added.setdefault(best, []).append(a)
    if not added:
        return gpus, left
    from .amax_search import twin_best_amax
    js = sorted(added)
    cands = [_with(inst, gpus[j], list(gpus[j].adapters) + [(a, 1.0) for a in added[j]])
             for j in js]
    for j, c, m in zip(js, cands, _twin(inst, cands, js, duration_s, workers)):
        if m.ok:
            gpus[j] = replace(c, verified=m)
            continue
        best = None if m.memory_error else \
            twin_best_amax(inst, c, inst.seed + j, duration_s, workers)[0]
        if best is not None:                 # another Amax serves it: a restart, no move
            gpus[j] = best
        else:
            left.extend(added[j])
    return gpus, left


# ----------------------------------------------------------------------------- transition
TRANSITION_WARMUP_S = 120.0      # the previous plan serves the new rates this long first
TRANSITION_AFTER_S = 300.0       # then the switch-over window replayed
LATE_WAIT_S = 30.0               # a request this long without its first token is late


@dataclass(frozen=True)
class TransitionReport:
    """The switch-over from the previous plan to the new one, replayed in the routed fleet
    twin (:func:`replay_transition`). Counts are over requests arriving after the switch:
    ``late`` waited more than ``LATE_WAIT_S`` for their first token (or still wait that long at
    the end); ``unfinished`` were not done by the end (arrived > 60 s before it); the
    ``*_steady`` counts are the same requests served by the new plan in steady state (no
    switch), so ``late - late_steady`` is what the switch itself costs. ``p99_ttft_s`` (after
    the switch) and ``p99_ttft_s_before`` (the previous plan at its own rates): completed
    requests. ``throughput_over_offered``: tokens of the requests arriving after the switch
    that completed by the end / their tokens, fleet-wide; ``min_gpu_throughput_over_offered``:
    the same per GPU that served such requests, the lowest (requests that arrived before the
    switch are left out: counting their completions would credit a GPU for the backlog the
    previous plan left it, which differs from the steady state's). ``new_homes``: (adapter,
    GPU) pairs loaded at the switch; ``restarts``: servers restarted with a new configuration;
    ``max_drain_s``: the longest an old home kept serving an adapter that left it (inf: not
    drained by the end); ``max_restart_wait_s``: the longest a restarted server took from the
    switch to its first token. ``schedule``: how the switch ran (:data:`SWITCH_SCHEDULES`;
    ``tried``: with ``auto``, each schedule replayed as (name, starved, :meth:`damage`));
    ``restart_schedule``: per restarted server (new GPU index, previous GPU index, restart
    begin, server up; seconds after the switch, nan: not within the window);
    ``max_on_old_homes_s``: the longest a moved adapter's traffic stayed (partly) on its old
    homes; ``bridged``: requests served by another GPU while their adapter's servers were
    restarting; ``waited``: requests sent to a server that was not yet up. ``starved``: the
    switch makes the fleet starve — over the switch-over window some GPU's throughput is below
    the instance's threshold x its offered load (the twin's rule) and below the new plan's
    lowest in steady state, or more requests are late than in steady state."""

    switch_s: float
    duration_s: float
    requests: int
    late: int
    late_steady: int
    unfinished: int
    unfinished_steady: int
    p99_ttft_s: float
    p99_ttft_s_before: float
    throughput_over_offered: float
    min_gpu_throughput_over_offered: float
    min_gpu_throughput_over_offered_steady: float
    new_homes: int
    restarts: int
    max_drain_s: float
    max_restart_wait_s: float
    starved: bool
    schedule: str = "abrupt"
    restart_schedule: tuple[tuple[int, int, float, float], ...] = ()
    max_on_old_homes_s: float = 0.0
    bridged: int = 0
    waited: int = 0
    tried: tuple[tuple[str, bool, int, float], ...] = ()

    def damage(self) -> tuple[int, float]:
        """How much worse than steady state: (late + unfinished requests beyond it, shortfall
        of the lowest GPU's throughput / offered below it)."""
        return (max(self.late - self.late_steady, 0)
                + max(self.unfinished - self.unfinished_steady, 0),
                max(self.min_gpu_throughput_over_offered_steady
                    - self.min_gpu_throughput_over_offered, 0.0))

    def to_dict(self) -> dict:
        def val(v):
            if isinstance(v, (bool, np.bool_, str)):
                return v if isinstance(v, str) else bool(v)
            return int(v) if isinstance(v, (int, np.integer)) else float(v)
        out = {k: val(v) for k, v in vars(self).items()
               if k not in ("restart_schedule", "tried")}
        out["restart_schedule"] = [{"gpu": int(j), "previous": int(o), "begin_s": float(b),
                                    "up_s": float(u)} for j, o, b, u in self.restart_schedule]
        out["tried"] = {name: {"starved": bool(st), "excess_late_unfinished": int(ex),
                               "gpu_shortfall": float(sh)} for name, st, ex, sh in self.tried}
        return out


def _followed_by(first, second, at_s: float):
    """The requests of ``first``, then those of ``second`` shifted to start at ``at_s``
    (``twin.workload.Requests``; ``first`` ends before ``at_s``, so the order holds)."""
    from twin.workload import Requests
    return Requests(np.concatenate([first.arrival_s, second.arrival_s + at_s]),
                    np.concatenate([first.adapter, second.adapter]),
                    np.concatenate([first.input_len, second.input_len]),
                    np.concatenate([first.output_len, second.output_len]))


def replay_transition(prev: Placement, new: Sequence[GpuPlan], origin: Sequence[int | None],
                      inst: Instance, warmup_s: float = TRANSITION_WARMUP_S,
                      after_s: float = TRANSITION_AFTER_S, schedule: str = "auto",
                      restart_s: float = 0.0) -> TransitionReport:
    """Replay the switch from ``prev`` to ``new`` (new GPU ``j`` in the place of previous GPU
    ``origin[j]``) in the routed fleet twin (``twin.routing.PlanSwitch``): for ``warmup_s`` the
    previous plan serves the rates it was made for (its adapters' rates: a steady state), then
    the rates become ``inst``'s and the new plan's routing takes over for ``after_s`` — the
    re-plan taking effect at the window boundary. Adapters on a GPU that did not hold them pay
    the measured load time there; old homes drain what they hold; a kept GPU whose Amax or max
    rank changed restarts (its old server drains, then the new one starts cold ``restart_s``
    later) and an added GPU starts cold. ``schedule`` (:data:`SWITCH_SCHEDULES`): ``abrupt``
    — every move and restart at the switch, requests of a restarting server wait for it;
    ``staggered`` — make-before-break (moved adapters stay on their old homes until the new
    one has loaded them), one restart at a time in GPU order, the adapters of a restarting
    server bridged to serving GPUs with free slots (``twin.routing.PlanSwitch``, ``gentle``);
    ``parallel`` — the same routing with every restart at the switch; ``auto`` — staggered,
    and with two restarts or more also parallel, keeping the one that does not starve (else
    the less damaging). Requests are routed by the plans' weights (the
    ``static`` router); new adapters have requests from the switch on, retired ones until it.
    Seeded by the instance's seed."""
    from twin.profile import load_profile
    from twin.routing import PlanSwitch, RoutedGpu, RoutingPlan, make_router, simulate_routed
    from twin.workload import Requests, generate_requests

    if not (warmup_s > 0 and after_s > 0 and np.isfinite(warmup_s + after_s)):
        raise ValueError(f"transition window: warmup_s and after_s must be finite numbers > 0, "
                         f"got {warmup_s!r}, {after_s!r}")
    if schedule not in SWITCH_SCHEDULES:
        raise ValueError(f"schedule: {schedule!r} is not one of {list(SWITCH_SCHEDULES)}")
    if len(origin) != len(new):
        raise ValueError(f"origin: {len(origin)} entries for {len(new)} new GPUs")
    profiles: dict[str, object] = {}

    def routed(g: GpuPlan) -> RoutedGpu:
        if g.profile not in profiles:
            profiles[g.profile] = load_profile(g.profile)
        return RoutedGpu(profiles[g.profile], g.max_loras, g.max_lora_rank)

    gpus = [routed(g) for g in prev.gpus]
    place: list[int] = []                   # union index of each new GPU
    starts_after = [-1] * len(gpus)
    for g, o in zip(new, origin):
        p = prev.gpus[o] if o is not None else None
        if p is not None and (p.max_loras, p.max_lora_rank) == (g.max_loras, g.max_lora_rank):
            place.append(o)
            continue
        gpus.append(routed(g))
        starts_after.append(o if o is not None else -1)
        place.append(len(gpus) - 1)
    # adapters: the instance's, then those retired since the previous plan
    old_rate = {a.id: a for g in prev.gpus for a, _ in g.adapters}
    adapters = list(inst.adapters) + [a for i, a in old_rate.items()
                                      if i not in {b.id for b in inst.adapters}]
    pos = {a.id: i for i, a in enumerate(adapters)}

    def homes_of(plans: Sequence[GpuPlan], where: Sequence[int]):
        homes: list[list[int]] = [[] for _ in adapters]
        shares: list[list[float]] = [[] for _ in adapters]
        for g, u in zip(plans, where):
            for a, share in g.adapters:
                homes[pos[a.id]].append(u)
                shares[pos[a.id]].append(float(share))
        weights = [tuple(x / sum(w) for x in w) for w in shares]
        return tuple(map(tuple, homes)), tuple(weights)

    before_h, before_w = homes_of(prev.gpus, range(prev.n_gpus))
    if any(a.id not in pos for g in new for a, _ in g.adapters):
        raise ValueError("new plan: serves an adapter that is not in the instance")
    after_h, after_w = homes_of(new, place)
    if any(not h for h in after_h[:len(inst.adapters)]):
        raise ValueError("new plan: some adapter of the instance has no home")
    dur = float(warmup_s + after_s)
    # before the switch: the previous plan's rates; after it: the instance's
    idx_b = np.array([i for i, a in enumerate(adapters) if a.id in old_rate], np.int64)
    rb = generate_requests([old_rate[adapters[i].id] for i in idx_b], float(warmup_s),
                           inst.lengths, seed=np.random.default_rng([inst.seed, 0]))
    ra = generate_requests(inst.adapters, float(after_s), inst.lengths,
                           seed=np.random.default_rng([inst.seed, 1]))
    req = _followed_by(Requests(rb.arrival_s, idx_b[rb.adapter], rb.input_len, rb.output_len),
                       ra, warmup_s)
    # the new plan in steady state on the same requests after the switch (warmed up at the
    # new rates from t = 0): what the plan costs anyway, against which the switch is judged
    n = len(inst.adapters)
    rw = generate_requests(inst.adapters, float(warmup_s), inst.lengths,
                           seed=np.random.default_rng([inst.seed, 2]))
    req_s = _followed_by(rw, ra, warmup_s)
    steady = simulate_routed(RoutingPlan(tuple(gpus), after_h[:n], after_w[:n]), adapters[:n],
                             req_s, make_router("static", inst.seed), dur)

    def outcome(r, rq):
        arr = rq.arrival_s
        after = arr >= warmup_s
        first = np.where(r.first_t >= 0, r.first_t, np.inf)
        done = (r.finish_t >= 0) & (r.finish_t <= dur)
        wait = np.minimum(first, dur) - arr
        late = int((after & (wait > LATE_WAIT_S)).sum())
        unfinished = int((after & ~done & (arr < dur - 60.0)).sum())
        return after, first, done, late, unfinished

    def completed(r, rq) -> tuple[float, float]:
        """(fleet-wide, lowest per GPU) tokens of the requests arriving after the switch that
        completed by the end / their tokens (the twin's per-GPU starvation rule)."""
        tok = rq.input_len.astype(np.int64) + rq.output_len
        aft = rq.arrival_s >= warmup_s
        fin = aft & (r.finish_t >= 0) & (r.finish_t <= dur)
        worst = math.inf
        for g in np.unique(r.gpu[aft & (r.gpu >= 0)]):
            offered = tok[aft & (r.gpu == g)].sum()
            worst = min(worst, float(tok[fin & (r.gpu == g)].sum() / offered))
        fleet = float(tok[fin].sum() / max(tok[aft].sum(), 1))
        return fleet, (worst if math.isfinite(worst) else 1.0)

    _, _, _, late_steady, unfinished_steady = outcome(steady, req_s)
    worst_steady = completed(steady, req_s)[1]
    new_homes = sum(len(set(a) - set(b)) for a, b in zip(after_h, before_h))
    plan = RoutingPlan(tuple(gpus), before_h, before_w)
    n_restarts = sum(o >= 0 for o in starts_after)

    def replay(name: str) -> TransitionReport:
        switch = PlanSwitch(float(warmup_s), after_h, after_w, tuple(starts_after),
                            gentle=name != "abrupt", stagger=name == "staggered",
                            restart_s=float(restart_s))
        res = simulate_routed(plan, adapters, req, make_router("static", inst.seed), dur,
                              switch=switch)
        after, first, done, late, unfinished = outcome(res, req)
        ttft = first - req.arrival_s

        def p99(m: np.ndarray) -> float:
            m = m & done
            return float(np.quantile(ttft[m], 0.99)) if m.any() else float("nan")

        ratio, worst = completed(res, req)
        drain = 0.0
        for i, (hb, ha) in enumerate(zip(before_h, after_h)):
            for g in set(hb) - set(ha):
                m = (req.adapter == i) & (res.gpu == g)
                if m.any():
                    end = np.where(done[m], res.finish_t[m], np.inf).max()
                    drain = max(drain, float(end) - warmup_s)
        restart_wait = 0.0
        for g, o in enumerate(starts_after):
            if o >= 0:
                m = res.gpu == g
                if m.any():
                    restart_wait = max(restart_wait, float(first[m].min() - warmup_s))
        log = res.switch_log
        restarts = tuple((place.index(g), o, log.restart_begin_s[g] - warmup_s,
                          log.restart_up_s[g] - warmup_s)
                         for g, o in enumerate(starts_after) if o >= 0)
        on_old = max([log.switched_s[i] - warmup_s
                      for i, (hb, ha) in enumerate(zip(before_h, after_h))
                      if hb and set(ha) - set(hb)], default=0.0)
        below = worst < inst.starvation_threshold and worst < worst_steady
        return TransitionReport(float(warmup_s), dur, int(after.sum()), late, late_steady,
                                unfinished, unfinished_steady, p99(after), p99(~after), ratio,
                                worst, worst_steady, int(new_homes), n_restarts, max(drain, 0.0),
                                max(restart_wait, 0.0), bool(below or late > late_steady), name,
                                restarts, float(on_old), int(log.bridged), int(log.waited))

    if schedule != "auto":
        return replay(schedule)
    # the gentle schedules differ only with two restarts or more: then both are replayed and
    # the one whose switch-over does not starve (else the less damaging) is kept
    tried = [replay("staggered")] + ([replay("parallel")] if n_restarts >= 2 else [])
    best = min(tried, key=lambda r: (r.starved, r.damage()))
    return replace(best, tried=tuple((r.schedule, r.starved) + r.damage() for r in tried))


# ----------------------------------------------------------------------------- main
def _incremental(prev: Placement, inst: Instance, opts: ReplanOptions, dur: float
                 ) -> ReplanResult:
    from .greedy import greedy_plans
    from .verify import verify
    steps: list[str] = []
    gpus, origin, pending, notes = carry_over(prev, inst)
    steps += notes
    head = _Headroom(inst)
    retired = {a.id for g in prev.gpus for a, _ in g.adapters} - {a.id for a in inst.adapters}
    if retired:
        steps.append(f"retired {len(retired)} adapter(s)")
    if pending:
        steps.append(f"{len(pending)} adapter(s) without a home (new or from removed GPUs)")

    def budget_left(extra: int) -> bool:
        if opts.max_moves is None:
            return True
        used = churn_between(prev, gpus, origin).moves
        return used + extra <= opts.max_moves

    rounds = 0
    while True:
        if rounds == 0:
            metrics = _twin(inst, gpus, range(len(gpus)), dur, opts.workers)
            gpus = [replace(g, verified=m) for g, m in zip(gpus, metrics)]
        metrics = [g.verified for g in gpus]
        bad = [j for j, m in enumerate(metrics) if not m.ok]
        fixed_gpus, fixed_origin = [], []
        for j, (g, o) in enumerate(zip(gpus, origin)):
            if j not in bad:
                fixed_gpus.append(g)
                fixed_origin.append(o)
                continue
            new_g, shed, _ = _shed(inst, g, g.verified, j, dur, opts.workers)
            steps.append(f"gpu {j}: twin rejected it at the new rates; "
                         + (f"shed {len(shed)} adapter(s)" if shed else
                            f"Amax {g.max_loras} -> {new_g.max_loras}"))
            pending.extend(shed)
            if new_g is not None:
                fixed_gpus.append(new_g)
                fixed_origin.append(o)
        gpus, origin = fixed_gpus, fixed_origin
        if pending:
            n = len(pending)
            gpus, pending = _insert(inst, gpus, pending, head, dur, opts.workers)
            if n - len(pending):
                steps.append(f"placed {n - len(pending)} adapter(s) on kept GPUs with headroom")
        if pending:
            used: dict[str, int] = {}
            for g in gpus:
                used[g.gpu_type] = used.get(g.gpu_type, 0) + 1
            pool = {t.name: max(t.count - used.get(t.name, 0), 0) for t in inst.gpu_types}
            new, _, _ = greedy_plans(inst, pending, "gpus", pool)
            steps.append(f"opened {len(new)} GPU(s) for {len(pending)} adapter(s)")
            gpus += new
            origin += [None] * len(new)
            pending = []
        rounds += 1
        p = verify(Placement(inst.name, "replan", "solved", tuple(gpus)), inst, dur,
                   opts.workers)
        gpus = list(p.gpus)
        if p.verdict == "accepted" or rounds >= opts.max_rounds:
            break
    # step 5: drain GPUs while the budget allows, the cheapest first (fewest adapters to move,
    # then least load); a GPU whose drain failed is not tried again
    tries = 0
    tried: set[tuple[str, ...]] = set()
    while p.verdict == "accepted" and len(gpus) > 1 and tries < opts.max_drain_attempts:
        order = sorted(range(len(gpus)), key=lambda j: (gpus[j].n_adapters, gpus[j].offered_tps))
        j = next((j for j in order if tuple(sorted(_ids(gpus[j]))) not in tried
                  and all(s >= 1.0 for _, s in gpus[j].adapters)        # no split adapters
                  and (opts.max_moves is not None or
                       opts.churn_weight * gpus[j].n_adapters < 1.0)
                  and budget_left(gpus[j].n_adapters)), None)
        if j is None:
            break
        tried.add(tuple(sorted(_ids(gpus[j]))))
        tries += 1
        rest = gpus[:j] + gpus[j + 1:]
        rest_origin = origin[:j] + origin[j + 1:]
        moved = [a for a, _ in gpus[j].adapters]
        cand, left = _insert(inst, rest, moved, head, dur, opts.workers)
        if left:
            continue
        cp = verify(Placement(inst.name, "replan", "solved", tuple(cand)), inst, dur,
                    opts.workers)
        if cp.verdict != "accepted":
            continue
        steps.append(f"drained gpu {j} ({len(moved)} adapter(s)) into the others")
        gpus, origin, p = list(cp.gpus), rest_origin, cp
    p = p.with_(repairs=tuple(steps))
    return ReplanResult(p, churn_between(prev, p.gpus, origin), tuple(origin), "incremental",
                        tuple(steps))


def check_same_model(prev: Placement, inst: Instance, prev_name: str | None = None,
                     inst_name: str | None = None) -> None:
    """Refuse re-planning a plan whose GPUs serve another base model than the instance's
    (``ValueError`` naming both files, profiles and models): its adapters are LoRAs of that
    model and its servers load it, so nothing of it carries over. A plan profile that does not
    load is left to the later steps."""
    from twin.profile import load_profile
    want: dict[str, str] = {}
    for t in inst.gpu_types:
        try:
            want[t.load_profile().model] = t.profile
        except (OSError, ValueError):
            return
    if not want:
        return
    pname = prev_name or f"'{prev.instance}'"
    iname = inst_name or inst.source or inst.name
    for g, gp in enumerate(prev.gpus):
        try:
            model = load_profile(gp.profile).model
        except (OSError, ValueError):
            continue
        if model not in want:
            m, prof = next(iter(want.items()))
            raise ValueError(f"--previous {pname}: GPU {g} runs profile '{gp.profile}' (base "
                             f"model {model}), but the instance {iname} serves base model {m} "
                             f"(profile '{prof}'); a plan can only be re-planned for the same "
                             "base model")


def replan(prev: Placement, inst: Instance, opts: ReplanOptions = ReplanOptions(),
           fresh: Placement | None = None) -> ReplanResult:
    """Re-plan ``prev`` for ``inst`` (module docstring); ``fresh``: a solve of ``inst`` from
    scratch to weigh against the incremental plan (its twin verdict is kept)."""
    t0 = time.perf_counter()
    if not prev.gpus:
        raise ValueError(f"previous plan '{prev.instance}': has no GPUs to re-plan from")
    check_same_model(prev, inst)
    dur = float(opts.duration_s if opts.duration_s is not None else inst.duration_s)
    cands = [_incremental(prev, inst, opts, dur)]
    if fresh is not None and fresh.gpus:
        origin = relabel(prev, fresh.gpus)
        cands.append(ReplanResult(fresh, churn_between(prev, fresh.gpus, origin), origin,
                                  "resolve", ("fresh solve, GPUs relabelled onto the previous "
                                              "ones for the most shared adapters",)))
    note = ""
    reports: dict[str, TransitionReport] = {}
    if opts.transition:
        best, reports, note = choose_by_transition(
            cands, opts, lambda c: replay_transition(prev, c.placement.gpus, c.origin, inst,
                                                     schedule=opts.switch_schedule))
    else:
        best = choose(cands, opts)
    trans = reports[best.candidate].to_dict() if opts.transition else None
    wall = time.perf_counter() - t0
    p = best.placement.with_(
        method="replan", wall_time_s=wall,
        params={**best.placement.params, "replan": {
            "candidate": best.candidate, "churn": best.churn.to_dict(),
            "origin": list(best.origin), "churn_weight": opts.churn_weight,
            "max_moves": opts.max_moves, "previous": prev.instance, "transition": trans,
            "transition_choice": note,
            "candidates": {c.candidate: {
                "gpus": c.placement.n_gpus, "moves": c.churn.moves,
                "verdict": c.placement.verdict,
                "switch_starved": (reports[c.candidate].starved if c.candidate in reports
                                   else None)} for c in cands}}})
    return replace(best, placement=p)


def _ranked(cands: Sequence[ReplanResult], opts: ReplanOptions) -> list[ReplanResult]:
    """The candidates in order of preference (module docstring), candidates beyond
    ``max_moves`` left out when some are within it."""
    def accepted(c: ReplanResult) -> bool:
        return c.placement.verdict == "accepted"
    if opts.max_moves is not None:
        inside = [c for c in cands if c.churn.moves <= opts.max_moves]
        pool = inside or list(cands)
        key = (lambda c: (not accepted(c), c.placement.n_gpus, c.churn.moves)) if inside else \
            (lambda c: (not accepted(c), c.churn.moves, c.placement.n_gpus))
        return sorted(pool, key=key)
    return sorted(cands, key=lambda c: (not accepted(c), c.cost(opts.churn_weight),
                                        c.churn.moves))


def choose(cands: Sequence[ReplanResult], opts: ReplanOptions) -> ReplanResult:
    """The candidate to take (module docstring): twin-accepted first; within ``max_moves`` the
    fewest GPUs (then moves), else the lowest ``GPUs + churn_weight x moves``."""
    return _ranked(cands, opts)[0]


def choose_by_transition(cands: Sequence[ReplanResult], opts: ReplanOptions,
                         replay: Callable[[ReplanResult], TransitionReport]
                         ) -> tuple[ReplanResult, dict[str, TransitionReport], str]:
    """:func:`choose`, also weighing each candidate's switch-over (``replay``, called lazily in
    order of preference): among the candidates of the first one's twin verdict that cost
    (``GPUs + churn_weight x moves``) at most ``opts.switch_allowance`` more than it, the first
    whose switch-over does not starve; when every one of them starves, the least damaging
    (``TransitionReport.damage``, ties in order of preference). Returns (candidate, the reports
    made, by candidate name, a note: empty, or why a starving switch-over was taken)."""
    ranked = _ranked(cands, opts)
    w = opts.churn_weight
    limit = ranked[0].cost(w) + opts.switch_allowance + 1e-9
    top = [c for c in ranked if (c.placement.verdict == "accepted")
           == (ranked[0].placement.verdict == "accepted") and c.cost(w) <= limit]
    reports: dict[str, TransitionReport] = {}
    for c in top:
        reports[c.candidate] = replay(c)
        if not reports[c.candidate].starved:
            return c, reports, ""
    best = min(top, key=lambda c: (reports[c.candidate].damage(), top.index(c)))
    late, short = reports[best.candidate].damage()
    return best, reports, (f"the switch-over of every candidate within {opts.switch_allowance:g} "
                           f"GPU of the cheapest starves ({', '.join(reports)}); took the least "
                           f"damaging, '{best.candidate}' ({late} late or unfinished request(s) "
                           f"beyond steady state, lowest GPU {short:.3f} below it)")


__all__ = ["ReplanOptions", "ReplanResult", "Churn", "churn_between", "relabel", "carry_over",
           "replan", "choose", "choose_by_transition", "DEFAULT_CHURN_WEIGHT", "TransitionReport",
           "replay_transition", "SWITCH_SCHEDULES", "SWITCH_ALLOWANCE"]
