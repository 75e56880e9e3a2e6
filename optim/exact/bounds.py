"""Lower bounds on the optimum that hold independently of the solvers (gpus objective; the cost
objective is bounded by the cheapest price times the GPU bound, and by the LP relaxation).

With ``C`` the largest load any configuration of any type admits (``cap``), and ``w_i`` the
adapters' integer loads, every feasible placement is a feasible classical bin packing with
capacity ``C`` (the real constraints are tighter), so bin-packing bounds apply:

* **L1 (capacity bound)** ``ceil(sum_i w_i / C)``; together with the adapter-count bound
  ``ceil(sum_i phi_i / X)`` (``X`` the largest feature value any configuration admits, the most
  adapters per GPU for the default feature ``n``).
* **L2 (Martello & Toth 1990, Knapsack Problems, Thm. 8.3)**: for an integer ``a`` in
  ``[0, C/2]``, ``J1 = {w_i > C - a}``, ``J2 = {C - a >= w_i > C/2}``, ``J3 = {C/2 >= w_i >= a}``;
  ``L(a) = |J1| + |J2| + max(0, ceil((sum_{J3} w - (|J2| C - sum_{J2} w)) / C))``;
  ``L2 = max_a L(a)`` over ``a`` in {0} and the distinct loads <= C/2. ``L2 >= L1``.
* **LP relaxation** of the MILP (``milp.build_model(relax=True)``), rounded up for gpus.

An adapter that no configuration of any type admits alone makes the problem infeasible
(``infeasible_adapters``).

Replication (``max_homes`` > 1): an adapter may be split, so the bin-packing argument behind L2
(items are indivisible) fails and L2 is not used (reported equal to L1); L1 and the count bound
(every adapter has at least one home, charged its full feature value) still hold, and the LP is
that of the replication model. An adapter is then infeasible when even its ``max_homes``
largest-capacity homes cannot carry it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .common import effective
from .problem import PackingProblem


@dataclass(frozen=True)
class Bounds:
    l1: int
    count: int
    l2: int
    lp: float | None
    best: float
    objective: str = "gpus"

    def to_dict(self) -> dict:
        return dict(vars(self))


def max_capacity(P: PackingProblem) -> int:
    caps = [c.cap for t in P.types for c in t.configs]
    return max(caps) if caps else 0


def infeasible_adapters(P: PackingProblem) -> list[int]:
    """Adapters that no configuration of any type admits on their own; with replication, those
    whose load exceeds the summed capacity of the ``max_homes`` GPU slots best able to home them
    (``home_capacity``)."""
    E = effective(P)
    if not P.splits:
        return [i for i in range(P.n) if not any(E.allowed[t][i] for t in range(len(P.types)))]
    return [i for i in range(P.n) if P.loads[i] > home_capacity(P, i)]


def home_capacity(P: PackingProblem, i: int) -> int:
    """Most load adapter ``i`` can send to its homes: the sum over its ``max_homes`` best GPU
    slots of the largest capacity of a configuration of the slot's type that can home it (rank
    class >= its rank, feature range reaching its value)."""
    per_slot = []
    for t in P.slots:
        caps = [c.cap for c in P.types[t].configs if c.rank >= P.ranks[i] and c.x_hi >= P.xs[i]]
        per_slot.append(max(caps, default=0))
    return sum(sorted(per_slot, reverse=True)[:P.max_homes])


def capacity_bound(P: PackingProblem) -> int:
    """L1 = ceil(sum w / C)."""
    C = max_capacity(P)
    if C <= 0:
        return P.n
    return max(1, math.ceil(P.total_load / C))


def count_bound(P: PackingProblem) -> int:
    """ceil(sum phi / X): X the largest feature value a configuration admits."""
    X = max((c.x_hi for t in P.types for c in t.configs), default=0)
    if X <= 0:
        return P.n
    return max(1, math.ceil(sum(P.xs) / X))


def martello_toth_l2(weights, C: int) -> int:
    """The Martello–Toth L2 bound for bin packing with integer ``weights`` and capacity ``C``
    (O(n log n): sorted weights and prefix sums, one binary search per candidate ``a``)."""
    import bisect
    w = sorted(int(v) for v in weights)            # ascending
    if not w:
        return 0
    if C <= 0:
        return len(w)
    if w[-1] > C:
        return len(w)          # infeasible as bin packing; every item alone at least
    prefix = [0]
    for v in w:
        prefix.append(prefix[-1] + v)
    n = len(w)
    half = C / 2
    i_half = bisect.bisect_right(w, half)          # w[:i_half] <= C/2 < w[i_half:]
    cands = {0} | set(w[:i_half])
    best = 0
    for a in cands:
        i_j1 = bisect.bisect_right(w, C - a)       # J1 = w[i_j1:]  (> C - a)
        j1 = n - i_j1
        j2 = max(0, i_j1 - i_half)                 # J2 = w[i_half:i_j1]
        sum_j2 = prefix[i_j1] - prefix[i_half] if j2 else 0
        i_a = bisect.bisect_left(w, a)             # J3 = w[i_a:i_half]  (a <= w <= C/2)
        sum_j3 = prefix[i_half] - prefix[i_a] if i_half > i_a else 0
        free = j2 * C - sum_j2
        extra = max(0, math.ceil((sum_j3 - free) / C))
        best = max(best, j1 + j2 + extra)
    return max(best, math.ceil(prefix[-1] / C))


def lp_bound(P: PackingProblem, time_limit_s: float = 30.0, threads: int | None = None
             ) -> float | None:
    """LP relaxation value of the MILP (no symmetry rows, no cuts beyond the problem's)."""
    from .milp import solve_milp
    r = solve_milp(P, time_limit_s=time_limit_s, threads=threads, relax=True, symmetry=False)
    return r.objective if r.status == "optimal" else None


def lower_bounds(P: PackingProblem, lp: bool = True, time_limit_s: float = 30.0,
                 threads: int | None = None) -> Bounds:
    """Every bound for the problem's objective (gpus: GPUs; cost: $/h; latency: not bounded
    here — the GPU bounds are still reported and ``best`` is the LP value or 0)."""
    l1 = capacity_bound(P)
    cb = count_bound(P)
    l2 = martello_toth_l2(P.loads, max_capacity(P)) if not P.splits else l1
    lpv = lp_bound(P, time_limit_s, threads) if lp else None
    gb = max(l1, cb, l2)
    if P.objective == "gpus":
        best = float(max(gb, math.ceil(lpv - 1e-6) if lpv is not None else 0))
    elif P.objective == "cost":
        cheapest = min(t.price for t in P.types)
        best = max(cheapest * gb, lpv if lpv is not None else 0.0)
    else:
        best = lpv if lpv is not None else 0.0
    return Bounds(l1, cb, l2, lpv, best, P.objective)
