"""Baseline placement methods the greedy and exact methods are compared with.

Each function has the registry signature ``fn(instance, objective, options) -> Placement`` and its
docstring states the definition and the source. GPU types are drawn from the pool in the
objective's preference order (``Objective.gpu_preference``); when a method needs more GPUs of the
pool than exist, it still returns its placement with status ``over_pool`` so that GPU counts
remain comparable. "Predicted" metrics are each method's own belief about a GPU (its capacity
model), not a surrogate's.

Sources: MaxBase / MaxBase* / Random as defined by the earlier study this toolkit starts from
(Agulló et al., arXiv 2602.24044, "Data-Driven Optimization of GPU efficiency for Distributed
LLM-Adapter Serving"); dLoRA: Wu et al., OSDI'24 ("dLoRA: Dynamically Orchestrating Requests and
Adapters for LoRA LLM Serving"), its proactive (placement-time) replication mechanism;
LoRAServe: Jaiswal et al., arXiv 2511.22880 ("Serving Heterogeneous LoRA Adapters in Distributed
LLM Inference Systems"), its placement algorithm (rank utilisation, per-rank GPU budgets,
fractional bin packing, leftovers on higher-max-rank GPUs). The dLoRA and LoRAServe readings
follow the earlier study's re-implementations of both (placement only, with the twin's routing
by shares).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from twin.profile import GpuProfile, load_profile
from twin.workload import Adapter

from .capacity import adapter_kv_cost, backbone_max_throughput, lora_max_throughput
from .instance import GpuType, Instance
from .registry import MethodOptions
from .objectives import Objective
from .placement import GpuMetrics, GpuPlan, Placement, plan_gpu

_EPS = 1e-9


# --------------------------------------------------------------------------- shared helpers


@dataclass(frozen=True)
class _Fleet:
    types: tuple[GpuType, ...]   # one entry per GPU, in opening order
    over_pool: bool


def fleet_types(inst: Instance, objective: Objective, n: int) -> _Fleet:
    """The first ``n`` GPUs drawn from the pool in the objective's preference order (the last
    preferred type is repeated beyond the pool, flagged ``over_pool``)."""
    order = objective.gpu_preference(inst)
    out: list[GpuType] = []
    for t in order:
        out.extend([t] * t.count)
    over = n > len(out)
    while len(out) < n:
        out.append(order[-1] if out else order[0])
    return _Fleet(tuple(out[:n]), over)


def default_fleet_size(inst: Instance, objective: Objective) -> int:
    """Fleet size for fixed-fleet methods when none is given: the latency objective's GPU budget,
    else ceil(total offered load / backbone capacity of the preferred GPU type)."""
    budget = getattr(objective, "gpu_budget", None)
    if budget is not None:
        return int(budget)
    best = objective.gpu_preference(inst)[0]
    cap = backbone_max_throughput(best.profile, inst.lengths)
    return max(1, math.ceil(inst.total_load_tps / cap - 1e-9))


def _predicted(offered: float, capacity: float, memory_error: bool) -> GpuMetrics:
    return GpuMetrics(offered, min(offered, capacity), offered > capacity, memory_error)


def _starts(profile: str | GpuProfile, amax: int, rank: int) -> bool:
    prof = profile if isinstance(profile, GpuProfile) else load_profile(profile)
    return prof.kv_tokens(amax, rank) is not None


def _profiles(inst: Instance) -> dict[str, GpuProfile]:
    """The profile of each GPU type, looked up once (not per adapter and GPU)."""
    return {t.name: load_profile(t.profile) for t in inst.gpu_types}


def _finish(inst: Instance, method: str, plans: list[GpuPlan], over_pool: bool,
            params: dict, notes: tuple[str, ...] = ()) -> Placement:
    status = "over_pool" if over_pool else "solved"
    if over_pool:
        notes = notes + (f"needs {len(plans)} GPUs; the pool has {inst.total_gpus_available}",)
    return Placement(inst.name, method, status, tuple(plans), params=params, notes=notes)


# --------------------------------------------------------------------------- MaxBase


def _maxbase(inst: Instance, objective: Objective, options: MethodOptions, half: bool
             ) -> Placement:
    method = "maxbase-half" if half else "maxbase"
    order = objective.gpu_preference(inst)
    avail = {t.name: t.count for t in inst.gpu_types}

    def amax_of(n: int) -> int:
        return max(1, math.ceil(n / 2)) if half else n

    if options.n_gpus is not None:
        return _maxbase_scaled_out(inst, objective, options.n_gpus, method, amax_of)
    profs = _profiles(inst)
    bins: list[dict] = []          # {type, cap, load, adapters, rank}
    over = False
    for a in inst.adapters:
        load = inst.load_tps(a)
        placed = False
        for b in bins:
            prof = profs[b["type"].name]
            if a.rank not in prof.supported_ranks:
                continue
            rank = max(b["rank"], a.rank)
            if b["load"] + load <= b["cap"] + _EPS and \
                    _starts(prof, amax_of(len(b["adapters"]) + 1), rank):
                b["load"] += load
                b["adapters"].append(a)
                b["rank"] = rank
                placed = True
                break
        if placed:
            continue
        usable = [t for t in order if a.rank in profs[t.name].supported_ranks]
        fresh = [t for t in usable if avail[t.name] > 0]
        t = fresh[0] if fresh else usable[-1]
        if fresh:
            avail[t.name] -= 1
        else:
            over = True
        bins.append({"type": t, "cap": backbone_max_throughput(t.profile, inst.lengths),
                     "load": load, "adapters": [a], "rank": a.rank})
    plans = []
    for b in bins:
        n = len(b["adapters"])
        offered = b["load"]
        plans.append(plan_gpu(b["type"].name, b["type"].profile, amax_of(n),
                              ((a, 1.0) for a in b["adapters"]), inst.mean_tokens,
                              predicted=_predicted(offered, b["cap"], False)))
    return _finish(inst, method, plans, over, {"amax_rule": "ceil(N/2)" if half else "N"})


def _maxbase_scaled_out(inst: Instance, objective: Objective, n: int, method: str,
                        amax_of) -> Placement:
    """MaxBase's rule over exactly ``n`` GPUs: load is still the only packing criterion and every
    adapter stays resident (Amax from ``amax_of``), but each adapter (instance order) goes to the
    GPU with the least summed load among those of its rank-compatible types. What an operator
    does when the backbone threshold starves: add GPUs and balance the load."""
    if n < 1:
        raise ValueError(f"{method}: option 'n_gpus' must be >= 1, got {n}")
    fleet = fleet_types(inst, objective, n)
    profs = _profiles(inst)
    members: list[list[Adapter]] = [[] for _ in range(n)]
    load = np.zeros(n)
    for a in inst.adapters:
        ok = [g for g, t in enumerate(fleet.types) if a.rank in profs[t.name].supported_ranks]
        if not ok:
            raise ValueError(f"{method}: adapter '{a.id}' (rank {a.rank}) fits no GPU type")
        g = min(ok, key=lambda j: (load[j], j))
        members[g].append(a)
        load[g] += inst.load_tps(a)
    plans = []
    for t, mem, offered in zip(fleet.types, members, load):
        if not mem:
            continue
        k = amax_of(len(mem))
        cap = backbone_max_throughput(t.profile, inst.lengths)
        rank = max(a.rank for a in mem)
        plans.append(plan_gpu(t.name, t.profile, k, ((a, 1.0) for a in mem), inst.mean_tokens,
                              predicted=_predicted(float(offered), cap,
                                                   not _starts(t.profile, k, rank))))
    return _finish(inst, method, plans, fleet.over_pool,
                   {"amax_rule": "ceil(N/2)" if method == "maxbase-half" else "N",
                    "n_gpus": n, "scaled_out": True})


def maxbase(inst: Instance, objective: Objective, options: MethodOptions) -> Placement:
    """MaxBase: first fit in instance order; an adapter joins the first open GPU whose summed
    offered load stays ≤ the backbone's maximum throughput (``capacity.backbone_max_throughput``
    of its profile) — else a new GPU opens; every GPU runs with Amax = N (all its adapters get a
    slot). Source: the earlier study (arXiv 2602.24044). One guard is added: a GPU also closes
    when Amax = N would not start (no KV-capacity entry at (N, max rank)); without it MaxBase
    configures servers that fail at start-up as soon as N exceeds the memory table.
    With ``options.n_gpus`` the same rule is scaled out over exactly that many GPUs
    (``_maxbase_scaled_out``)."""
    return _maxbase(inst, objective, options, half=False)


def maxbase_half(inst: Instance, objective: Objective, options: MethodOptions) -> Placement:
    """MaxBase* ("maxbase-half"): MaxBase with Amax = ceil(N/2) slots per GPU (half the served
    adapters can be in one batch). Source: the earlier study (arXiv 2602.24044). Same memory
    guard as MaxBase, for (ceil(N/2), max rank)."""
    return _maxbase(inst, objective, options, half=True)


# --------------------------------------------------------------------------- Random


def random_placement(inst: Instance, objective: Objective, options: MethodOptions) -> Placement:
    """Random: each adapter goes to a GPU drawn uniformly from a fleet of ``n_gpus`` GPUs, and each
    GPU's Amax is drawn uniformly from [1, N] (N = adapters it got). GPUs that receive no adapter
    are not used. Seeded (``options.seed``, else the instance seed). Source: the earlier study
    (arXiv 2602.24044), whose Figure 11 shows a random placement serving a workload its greedy
    method had declared infeasible."""
    n = options.n_gpus or default_fleet_size(inst, objective)
    seed = inst.seed if options.seed is None else options.seed
    rng = np.random.default_rng(seed)
    fleet = fleet_types(inst, objective, n)
    which = rng.integers(0, n, size=len(inst.adapters))
    groups: list[list[Adapter]] = [[] for _ in range(n)]
    for a, g in zip(inst.adapters, which):
        groups[int(g)].append(a)
    plans = []
    for g, ads in enumerate(groups):
        if not ads:
            continue
        amax = int(rng.integers(1, len(ads) + 1))
        plans.append(plan_gpu(fleet.types[g].name, fleet.types[g].profile, amax,
                              ((a, 1.0) for a in ads), inst.mean_tokens))
    empty = n - len(plans)
    notes = (f"{empty} of {n} GPUs received no adapter and are not used",) if empty else ()
    return _finish(inst, "random", plans, fleet.over_pool, {"n_gpus": n, "seed": seed}, notes)


# --------------------------------------------------------------------------- dLoRA


def dlora(inst: Instance, objective: Objective, options: MethodOptions) -> Placement:
    """dLoRA proactive replication on a fleet of ``n_gpus`` GPUs (Wu et al., OSDI'24).

    dLoRA places adapter replicas to maximise *burst tolerance*
    BT = min_i Σ_{g hosts i} free_g / e_i, with ``e_i`` the adapter's expected requests (rate x
    one hour) and ``free_g`` a GPU's memory left for KV cache: the backbone KV capacity minus one
    adapter-size per replica (size = ``capacity.adapter_kv_cost`` at the workload's largest
    rank). (1) Every adapter gets one replica, in instance order, on the GPU holding the fewest
    replicas. (2) Repeatedly, the bottleneck adapter (lowest BT term) gets one more replica on
    the GPU with the fewest replicas that does not lower BT; stop when no GPU qualifies.
    (3) Round-robin replicas are added until there are at least n_gpus + M - 1 (M = adapters).
    Requests of an adapter are split uniformly among its replicas (share 1/r); every GPU runs
    with Amax = its replica count (dLoRA's slots = resident adapters).
    """
    n = options.n_gpus or default_fleet_size(inst, objective)
    fleet = fleet_types(inst, objective, n)
    ads = list(inst.adapters)
    m = len(ads)
    top_rank = max(a.rank for a in ads)
    cost = np.array([adapter_kv_cost(t.profile, top_rank) for t in fleet.types])
    free = np.array([float(load_profile(t.profile).backbone_kv_tokens) for t in fleet.types])
    expected = np.array([a.rate * 3600.0 for a in ads])
    host = np.zeros((m, n), dtype=bool)
    count = np.zeros(n, dtype=np.int64)

    def add(i: int, g: int) -> None:
        host[i, g] = True
        count[g] += 1
        free[g] -= cost[g]

    for i in range(m):                                           # (1) one replica each
        add(i, int(np.argmin(count)))

    def bt_terms(fr: np.ndarray) -> np.ndarray:
        return (host * fr[None, :]).sum(axis=1) / expected

    best = float(bt_terms(free).min())
    while True:                                                  # (2) replicate the bottleneck
        i = int(np.argmin(bt_terms(free)))
        accepted = False
        for g in np.argsort(count, kind="stable"):
            g = int(g)
            if host[i, g]:
                continue
            host[i, g] = True
            trial = free.copy()
            trial[g] -= cost[g]
            new = float(bt_terms(trial).min())
            host[i, g] = False
            if new >= best - _EPS and new > 0:
                add(i, g)
                best = new
                accepted = True
                break
        if not accepted:
            break
    need = n + m - 1                                             # (3) minimum replica count
    g, i = 0, 0
    guard = 0
    while int(host.sum()) < need and guard < 4 * n * m:
        guard += 1
        if count[g] >= m:
            g = (g + 1) % n
            continue
        while host[i, g]:
            i = (i + 1) % m
        add(i, g)
        g = (g + 1) % n
        i = (i + 1) % m

    replicas = host.sum(axis=1)
    plans = []
    for g in range(n):
        members = np.flatnonzero(host[:, g])
        if members.size == 0:
            continue
        t = fleet.types[g]
        pairs = [(ads[i], 1.0 / replicas[i]) for i in members]
        rank = max(ads[i].rank for i in members)
        plan = plan_gpu(t.name, t.profile, int(members.size), pairs, inst.mean_tokens)
        mem_err = not _starts(t.profile, plan.max_loras, rank)
        cap = backbone_max_throughput(t.profile, inst.lengths)
        plans.append(replace(plan, predicted=_predicted(plan.offered_tps, cap, mem_err)))
    notes = (f"{int(replicas.sum())} replicas of {m} adapters (max {int(replicas.max())} per "
             "adapter)",)
    return _finish(inst, "dlora", plans, fleet.over_pool, {"n_gpus": n}, notes)


# --------------------------------------------------------------------------- LoRAServe


def _largest_remainder(weights: dict[int, float], total: int) -> dict[int, int]:
    s = sum(weights.values())
    if s <= 0 or total <= 0:
        return {r: 0 for r in weights}
    quota = {r: w / s * total for r, w in weights.items()}
    out = {r: int(math.floor(q)) for r, q in quota.items()}
    rest = sorted(weights, key=lambda r: (-(quota[r] - out[r]), -r))
    for k in range(total - sum(out.values())):
        out[rest[k % len(rest)]] += 1
    return out


def loraserve(inst: Instance, objective: Objective, options: MethodOptions) -> Placement:
    """LoRAServe placement (Jaiswal et al., arXiv 2511.22880) on a fleet of ``n_gpus`` GPUs.

    (1) Demand d_i = rate_i x mean tokens; per rank class r, rankUtil_r = Σ_{rank i = r} d_i /
    op_r, where the operating point op_r is the GPU's saturated throughput serving rank-r
    adapters (``capacity.lora_max_throughput``); targetUtil = Σ_r rankUtil_r / n_gpus, and the
    fleet is too small (status ``failed``) when targetUtil > 1. (2) GPU budgets per rank:
    rankUtil_r / targetUtil rounded by largest remainder to sum to n_gpus; GPUs are assigned to
    ranks from the largest rank down. (3) Fractional bin packing inside each rank's budget:
    adapters by decreasing demand fill the least-loaded GPU up to targetUtil x op_r, an adapter
    that does not fit is split across GPUs (routing shares = fraction of its demand). (4) What
    is left (ranks without budget, rounding) goes to the least-loaded GPU whose max rank is ≥ the
    adapter's rank, else the least-loaded GPU. Each GPU runs with Amax = the adapters it serves.
    Default fleet: ceil(Σ rankUtil) (the smallest fleet with targetUtil ≤ 1), or the latency
    budget.
    """
    order = objective.gpu_preference(inst)
    ref = order[0]                                   # LoRAServe assumes identical servers
    ranks = sorted({a.rank for a in inst.adapters})
    op = {r: lora_max_throughput(ref.profile, r, inst.lengths) for r in ranks}
    demand = {a.id: inst.load_tps(a) for a in inst.adapters}
    util = {r: sum(demand[a.id] for a in inst.adapters if a.rank == r) / op[r] for r in ranks}
    total_util = sum(util.values())
    budget = getattr(objective, "gpu_budget", None)
    n = options.n_gpus or (int(budget) if budget else max(1, math.ceil(total_util - 1e-9)))
    target = total_util / n
    params = {"n_gpus": n, "target_util": target, "operating_points": op}
    if target > 1 + 1e-9:
        return Placement(inst.name, "loraserve", "failed", params=params,
                         notes=(f"not enough GPUs: target utilisation {target:.3f} > 1 on {n} "
                                f"GPUs (needs {math.ceil(total_util)})",))
    fleet = fleet_types(inst, objective, n)
    budgets = _largest_remainder({r: util[r] / target for r in ranks}, n)
    params["rank_budgets"] = dict(sorted(budgets.items()))
    shares: list[dict[str, float]] = [dict() for _ in range(n)]
    load = [0.0] * n
    max_rank = [0] * n
    by_id = {a.id: a for a in inst.adapters}
    left: dict[str, float] = {a.id: 1.0 for a in inst.adapters}
    start = 0
    for r in sorted(ranks, reverse=True):
        servers = list(range(start, start + budgets[r]))
        start += budgets[r]
        if not servers:
            continue
        cap = target * op[r]
        for a in sorted((a for a in inst.adapters if a.rank == r), key=lambda a: -demand[a.id]):
            for g in sorted(servers, key=lambda s: (load[s], s)):
                rem = left[a.id] * demand[a.id]
                if rem <= _EPS * max(1.0, demand[a.id]):
                    break
                room = cap - load[g]
                if room <= _EPS:
                    continue
                take = min(room, rem)
                phi = take / demand[a.id]
                shares[g][a.id] = shares[g].get(a.id, 0.0) + phi
                load[g] += take
                max_rank[g] = max(max_rank[g], r)
                left[a.id] -= phi
    for aid, phi in left.items():                    # (4) leftovers
        if phi <= 1e-9:
            continue
        a = by_id[aid]
        cands = [g for g in range(n) if max_rank[g] >= a.rank] or list(range(n))
        g = min(cands, key=lambda s: (load[s], s))
        shares[g][aid] = shares[g].get(aid, 0.0) + phi
        load[g] += phi * demand[aid]
        max_rank[g] = max(max_rank[g], a.rank)
    # normalise away float residue so shares sum to exactly 1 per adapter
    tot: dict[str, float] = {}
    for s in shares:
        for aid, phi in s.items():
            tot[aid] = tot.get(aid, 0.0) + phi
    plans = []
    for g in range(n):
        if not shares[g]:
            continue
        t = fleet.types[g]
        pairs = [(by_id[aid], phi / tot[aid]) for aid, phi in shares[g].items()]
        plan = plan_gpu(t.name, t.profile, len(pairs), pairs, inst.mean_tokens)
        mem_err = not _starts(t.profile, plan.max_loras, plan.max_lora_rank)
        cap_g = lora_max_throughput(t.profile, plan.max_lora_rank, inst.lengths)
        plans.append(replace(plan, predicted=_predicted(plan.offered_tps, cap_g, mem_err)))
    split = sum(1 for aid in tot if sum(1 for s in shares if aid in s) > 1)
    notes = (f"rank budgets {dict(sorted(budgets.items()))}; {split} adapter(s) split",)
    return _finish(inst, "loraserve", plans, fleet.over_pool, params, notes)
