"""Routing weights of a replication-mode solution: the most balanced shares for its homes.

An exact model with split variables (``problem`` module docstring, ``max_homes`` > 1) proves
the fewest GPUs, but among the many shares that reach that optimum the solver returns any one,
typically filling some GPUs to their capacity piece and leaving another nearly empty. The twin
judges a GPU at its cap on a coin flip (the cap is the surrogate's, the window's arrivals vary),
so the loop would cut and re-solve for nothing. ``balance_shares`` keeps the solution's homes
(and so its objective and every claim about it) and re-chooses the shares by the LP

    min u   s.t.  sum_g s[i,g] = 1 (i),   sum_i w_i s[i,g] <= u cap_g (g),   s[i,g] >= 0 on homes
                  only,

``cap_g`` being the largest capacity of a configuration of the GPU's type that admits its homes'
feature sum and rank class (each GPU then takes that configuration): the lowest peak
utilisation the homes allow. The solution's own shares are feasible with ``u <= 1``, so the
balanced ones are admitted by the model too. Only for the gpus and cost objectives (latency
depends on the loads themselves; there a configuration may also need a lower load end).

Starts. The unsplit starts (first fit, greedy's placement) cannot seed the model when an
adapter needs several GPUs; ``split_fit`` is a first fit decreasing over shares on the model's
own configurations and ``as_split_start`` takes a split placement (greedy's) as a start when the
model admits it; ``hint_slots`` puts a start on GPU slots for the solvers' hints.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

import numpy as np

from .common import SolveResult
from .problem import PackingProblem


def home_caps(P: PackingProblem, gpus) -> list[tuple[int, int]]:
    """Per used GPU ``(type, config, homes)``: (largest cap, its configuration index) over the
    configurations of its type admitting its homes' feature sum and max rank ((0, -1) when
    none does)."""
    out = []
    for t, _, items in gpus:
        x = sum(P.xs[i] for i in items)
        mr = max(P.ranks[i] for i in items)
        out.append(max(((c.cap, p) for p, c in enumerate(P.types[t].configs)
                        if mr <= c.rank and c.x_lo <= x <= c.x_hi), default=(0, -1)))
    return out


def balance_shares(P: PackingProblem, r: SolveResult) -> SolveResult:
    """``r`` with the most balanced shares for its homes (module docstring); ``r`` itself when
    nothing is split, the objective is latency, or the LP finds no better shares."""
    from scipy.optimize import linprog

    if not P.splits or not r.gpus or P.objective == "latency":
        return r
    best = home_caps(P, r.gpus)
    caps = [cap for cap, _ in best]
    if min(caps) <= 0:
        return r
    var = [(k, i) for k, (_, _, items) in enumerate(r.gpus) for i in items]
    nv = len(var) + 1                                   # shares, then u
    c = np.zeros(nv)
    c[-1] = 1.0
    a_eq = np.zeros((P.n, nv))
    a_ub = np.zeros((len(r.gpus), nv))
    for j, (k, i) in enumerate(var):
        a_eq[i, j] = 1.0
        a_ub[k, j] = P.loads[i] / caps[k]               # utilisation, so the rows are scaled
    a_ub[:, -1] = -1.0
    res = linprog(c, A_ub=a_ub, b_ub=np.zeros(len(r.gpus)), A_eq=a_eq, b_eq=np.ones(P.n),
                  bounds=[(0.0, 1.0)] * len(var) + [(0.0, None)], method="highs")
    if res.status != 0 or res.x[-1] > 1.0 + 1e-9:
        return r
    s = np.clip(res.x[:-1], 0.0, 1.0)
    s[s < 1e-9] = 0.0
    tot = np.zeros(P.n)
    for j, (_, i) in enumerate(var):
        tot[i] += s[j]
    shares: list[list[float]] = [[] for _ in r.gpus]
    for j, (k, i) in enumerate(var):
        shares[k].append(float(s[j] / tot[i]))
    details = {**r.details, "balanced_peak_utilisation": round(float(res.x[-1]), 6)}
    gpus = tuple((t, p, items) for (t, _, items), (_, p) in zip(r.gpus, best))
    return replace(r, gpus=gpus, shares=tuple(tuple(x) for x in shares), details=details)


# --------------------------------------------------------------------------- starts
def _admitting(P: PackingProblem, t: int, load: int, x: int, mr: int) -> int:
    """Index of the largest-capacity configuration of type ``t`` admitting (load, x, max rank),
    -1 when none does."""
    best, out = -1, -1
    for p, c in enumerate(P.types[t].configs):
        if c.admits(load, x, mr) and c.cap > best:
            best, out = c.cap, p
    return out


def split_fit(P: PackingProblem) -> SolveResult | None:
    """A replication-mode start from the problem's own configurations (first fit decreasing
    over shares), or None when it finds no placement within the pool.

    Adapter ``i`` is cut into the fewest m <= k near-equal integer loads that some configuration
    admits alone (rank class, its feature value); the parts, largest first, join the first open
    GPU not holding that adapter whose type has a configuration admitting the GPU with it, else
    open a GPU of the type with the largest such capacity per objective weight (slots left)."""
    if not P.splits:
        return None
    left = [P.slots.count(t) for t in range(len(P.types))]
    parts: list[tuple[int, int]] = []
    for i in range(P.n):
        alone = max((c.cap for ty in P.types for c in ty.configs
                     if c.rank >= P.ranks[i] and c.x_lo <= P.xs[i] <= c.x_hi), default=0)
        m = next((m for m in range(1, P.max_homes + 1) if -(-P.loads[i] // m) <= alone),
                 P.max_homes)
        q, r = divmod(P.loads[i], m)
        parts += [(i, q + (1 if j < r else 0)) for j in range(m) if q + (j < r) > 0]
    parts.sort(key=lambda x: (-x[1], -P.ranks[x[0]], x[0]))
    bins: list[list] = []          # [type, load, x, max rank, {adapter: load}]
    for i, w in parts:
        for b in bins:
            if i not in b[4] and _admitting(P, b[0], b[1] + w, b[2] + P.xs[i],
                                            max(b[3], P.ranks[i])) >= 0:
                b[1] += w
                b[2] += P.xs[i]
                b[3] = max(b[3], P.ranks[i])
                b[4][i] = w
                break
        else:
            cands = [(P.types[t].configs[p].cap / max(P.slot_weight(t), 1e-9), t)
                     for t in range(len(P.types)) if left[t] > 0
                     and (p := _admitting(P, t, w, P.xs[i], P.ranks[i])) >= 0]
            if not cands:
                return None
            t = max(cands)[1]
            left[t] -= 1
            bins.append([t, w, P.xs[i], P.ranks[i], {i: w}])
    gpus, shares = [], []
    for t, load, x, mr, on in bins:
        items = tuple(sorted(on))
        gpus.append((t, _admitting(P, t, load, x, mr), items))
        shares.append(tuple(on[i] / P.loads[i] for i in items))
    value = float(sum(P.slot_weight(t) for t, _, _ in gpus))
    return SolveResult("split-fit", "feasible", value, None, 0.0, tuple(gpus),
                       details={"termination": "split first-fit start"}, shares=tuple(shares))


def as_split_start(P: PackingProblem, gpus: Sequence[tuple[int, Sequence[int],
                                                           Sequence[float]]]
                   ) -> SolveResult | None:
    """A placement given as (type index, adapter indices, shares) per GPU as a start for the
    replication model, or None when the model does not admit it (a GPU no configuration of its
    type admits at its shares' load, more GPUs of a type than slots, or more than ``max_homes``
    homes or shares not summing to 1 for an adapter)."""
    out, shares = [], []
    used: dict[int, int] = {}
    for t, items, sh in gpus:
        items, sh = tuple(items), tuple(sh)
        load = P.split_load(items, sh)
        p = _admitting(P, t, load, sum(P.xs[i] for i in items), max(P.ranks[i] for i in items))
        used[t] = used.get(t, 0) + 1
        if p < 0 or used[t] > P.slots.count(t):
            return None
        out.append((t, p, items))
        shares.append(sh)
    if P.check_split_solution(out, shares):
        return None
    value = float(sum(P.slot_weight(t) for t, _, _ in out))
    return SolveResult("given", "feasible", value, None, 0.0, tuple(out),
                       details={"termination": "given start"}, shares=tuple(shares))


def hint_slots(P: PackingProblem, E, start: SolveResult
               ) -> dict[int, tuple[int | None, tuple[int, ...], tuple[float, ...]]] | None:
    """Slot -> (configuration index in ``E`` (``common.effective``; None when clipped away),
    adapters, shares) of a start: its GPUs of each type on that type's first slots (the order
    the symmetry rows ask for); None when the start needs more slots than ``P`` has."""
    free: dict[int, list[int]] = {}
    for g, t in enumerate(E.slots):
        free.setdefault(t, []).append(g)
    out = {}
    for k, (t, p, items) in enumerate(start.gpus):
        if not free.get(t):
            return None
        pe = E.orig[t].index(p) if p in E.orig[t] else None
        out[free[t].pop(0)] = (pe, tuple(items), start.gpu_shares(k))
    return out


__all__ = ["balance_shares", "home_caps", "split_fit", "as_split_start", "hint_slots"]
