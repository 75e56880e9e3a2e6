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
"""

from __future__ import annotations

from dataclasses import replace

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


__all__ = ["balance_shares", "home_caps"]
