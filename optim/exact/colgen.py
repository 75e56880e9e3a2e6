"""Column generation and the search for one-capacity bin packing (the cutting-stock view).

Items of equal weight form a *type* ``j`` (weight ``w_j``, demand ``d_j``); a *pattern* ``a`` is
a bin's content, ``a_j`` copies of type ``j`` with ``sum_j w_j a_j <= C``. The Gilmore–Gomory
relaxation

    min  sum_p x_p    s.t.  sum_p a_jp x_p >= d_j  (every type j),   x_p >= 0

is solved by column generation: the restricted master LP (HiGHS) over the patterns found so far
gives duals ``pi >= 0``; the pricing problem, a bounded knapsack
``max sum_j pi_j a_j  s.t.  sum_j w_j a_j <= C, 0 <= a_j <= d_j`` (``price``, exact dynamic
programme), returns a pattern whose value exceeds 1 or shows that none exists.

**Bound, exact in integer arithmetic.** For any ``y >= 0``, a packing into ``k`` bins has
``y . d <= sum_bins y . a <= k max_a y . a``, so ``k >= y . d / max_a y . a`` (Farley). The
duals are floored to integers ``y = floor(pi 2^30)`` and the knapsack is solved exactly on those
integers, so the bound ``ceil(y . d / max_a y . a)`` holds whatever the LP's rounding. It is the
LP optimum rounded up (up to ``n / 2^30``) once column generation converges, and it stops early
once it meets the rounded-up LP value.

**Search** (``colgen_dive``): after the root, branch-and-price on arc flows
(``bpp_proof.branch_and_price``, seeded with the root's patterns) decides the target: a packing
into it, or a completed search that proves it infeasible, after which the bound rises by one and
the next target is decided. On BPPLIB's Hard28 it decides every instance within seconds (the
five whose optimum is ceil(LP) + 1 included), where the limited-discrepancy pattern dive it
replaces (Sadykov et al. 2019) and a bin-completion search (Korf) did not within 60 s.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
from numba import njit

from .bpp_proof import BIG, SCALE, branch_and_price
from .common import highs_threads


@njit(cache=True)
def _price_nb(weights, bound, values, cap):      # pragma: no cover - compiled
    m = weights.shape[0]
    # binary split of each type into 0-1 pieces of 1, 2, 4, ... copies
    n_pieces = 0
    for j in range(m):
        b = min(bound[j], cap // weights[j]) if weights[j] > 0 else 0
        k = 1
        while b > 0:
            n_pieces += 1
            b -= min(k, b)
            k *= 2
    pt = np.empty(n_pieces, np.int64)
    pc = np.empty(n_pieces, np.int64)
    q = 0
    for j in range(m):
        b = min(bound[j], cap // weights[j]) if weights[j] > 0 else 0
        k = 1
        while b > 0:
            c = min(k, b)
            pt[q] = j
            pc[q] = c
            q += 1
            b -= c
            k *= 2
    best = np.zeros(cap + 1, np.int64)
    keep = np.zeros((n_pieces, cap + 1), np.bool_)
    for q in range(n_pieces):
        w = weights[pt[q]] * pc[q]
        v = values[pt[q]] * pc[q]
        if v <= 0:
            continue
        for c in range(cap, w - 1, -1):
            if best[c - w] + v > best[c]:
                best[c] = best[c - w] + v
                keep[q, c] = True
    a = np.zeros(m, np.int64)
    c = cap
    for q in range(n_pieces - 1, -1, -1):
        if keep[q, c]:
            a[pt[q]] += pc[q]
            c -= weights[pt[q]] * pc[q]
    return best[cap], a


def price(weights: np.ndarray, bound: np.ndarray, values: np.ndarray, cap: int
          ) -> tuple[int, np.ndarray]:
    """Exact bounded knapsack: the largest ``values . a`` over ``weights . a <= cap``,
    ``0 <= a <= bound`` (integer values), and one ``a`` that reaches it."""
    z, a = _price_nb(np.asarray(weights, np.int64), np.asarray(bound, np.int64),
                     np.asarray(values, np.int64), int(cap))
    return int(z), a


def price_reference(weights: Sequence[int], bound: Sequence[int], values: Sequence[int],
                    cap: int) -> int:
    """``price``'s optimum by plain recursion over the copies of each type (tests)."""
    m = len(weights)

    def rec(j: int, room: int) -> int:
        if j == m:
            return 0
        return max(k * values[j] + rec(j + 1, room - k * weights[j])
                   for k in range(min(bound[j], room // weights[j]) + 1))
    return rec(0, cap)


@dataclass(frozen=True)
class DiveResult:
    """A column-generation bound and, when the search met its target, a packing.

    ``lower_bound``: the proven bound (the exact Farley bound at the root, ``known_bound``, or
    one above a target branch-and-price proved infeasible); ``lp_value``: the root master LP
    value; ``bins``: item indices per bin, at most ``target`` bins, or ``None``; ``nodes``:
    branch-and-price nodes solved; ``columns``: patterns generated (the most of one target's
    search)."""

    lower_bound: int
    lp_value: float | None
    bins: list[list[int]] | None
    nodes: int
    columns: int
    wall_s: float


class _Master:
    """The restricted master LP over the patterns found so far (HiGHS, warm-started), with an
    artificial column per type at cost ``BIG`` so that it is feasible from the start."""

    def __init__(self, demand: np.ndarray, tw: np.ndarray):
        import highspy
        self.h = highspy.Highs()
        self.h.setOptionValue("output_flag", False)
        # one thread count per process (common.highs_threads: HiGHS' pool is global)
        self.h.setOptionValue("threads", highs_threads(None))
        m = len(demand)
        self.inf = highspy.kHighsInf
        self.h.addRows(m, np.asarray(demand, float), np.full(m, self.inf), 0,
                       np.zeros(0, np.int32), np.zeros(0, np.int32), np.zeros(0))
        for j in range(m):
            self.h.addCol(BIG, 0.0, self.inf, 1, np.array([j], np.int32), np.array([1.0]))
        self.tw = tw
        self.patterns: list[np.ndarray] = []
        self.seen: set[bytes] = set()

    def add(self, a: np.ndarray) -> bool:
        key = np.asarray(a, np.int64).tobytes()
        if key in self.seen:
            return False
        self.seen.add(key)
        idx = np.flatnonzero(a).astype(np.int32)
        self.h.addCol(1.0, 0.0, self.inf, len(idx), idx, a[idx].astype(float))
        self.patterns.append(np.asarray(a, np.int64))
        return True

    def solve(self) -> tuple[np.ndarray, np.ndarray, float]:
        self.h.run()
        sol = self.h.getSolution()
        return (np.asarray(sol.col_value)[len(self.tw):],
                np.maximum(np.asarray(sol.row_dual), 0.0),
                float(self.h.getInfo().objective_function_value))


class _Search:
    """Column generation at the root (module docstring)."""

    def __init__(self, weights: Sequence[int], capacity: int, deadline: float):
        w = np.asarray(weights, np.int64)
        self.cap = int(capacity)
        self.types, inv, counts = np.unique(-w, return_inverse=True, return_counts=True)
        self.tw = -self.types                       # type weights, heaviest first
        self.members = [list(np.flatnonzero(inv == j)) for j in range(len(self.tw))]
        self.demand = counts.astype(np.int64)
        self.deadline = deadline
        self.master = _Master(self.demand, self.tw)
        for b in _ffd_types(self.tw, self.demand, self.cap):
            self.master.add(b)

    def timed_out(self) -> bool:
        return time.perf_counter() > self.deadline

    def relax(self) -> tuple[int, float]:
        """Column generation at the root: (exact bound, valid at any iteration, master LP
        value). Stops once the bound reaches ceil(LP value), or at the deadline."""
        lb = 0
        while True:
            _, pi, obj = self.master.solve()
            y = np.floor(pi * SCALE).astype(np.int64)
            z, a = price(self.tw, self.demand, y, self.cap)
            if z > 0:
                lb = max(lb, -(-int(y @ self.demand) // z))
            if z <= SCALE or lb >= int(np.ceil(obj - 1e-6)):
                return lb, obj
            if self.timed_out() or not self.master.add(a):
                return lb, obj

    def to_bins(self, patterns: list[np.ndarray]) -> list[list[int]]:
        pools = [list(m) for m in self.members]
        return [[pools[j].pop() for j in np.flatnonzero(a) for _ in range(int(a[j]))]
                for a in patterns]


def _ffd_types(tw: np.ndarray, demand: np.ndarray, cap: int) -> list[np.ndarray]:
    """First-fit decreasing over types (heaviest first): one pattern per bin."""
    loads: list[int] = []
    bins: list[np.ndarray] = []
    for j in range(len(tw)):
        for _ in range(int(demand[j])):
            for b, ld in enumerate(loads):
                if ld + tw[j] <= cap:
                    loads[b] += int(tw[j])
                    bins[b][j] += 1
                    break
            else:
                loads.append(int(tw[j]))
                a = np.zeros(len(tw), np.int64)
                a[j] = 1
                bins.append(a)
    return bins


def colgen_dive(weights: Sequence[int], capacity: int, deadline: float,
                known_bound: int = 0, incumbent: int | None = None,
                at_root: Callable[[int], list[list[int]] | None] | None = None) -> DiveResult:
    """The root bound of ``weights`` in bins of ``capacity`` and, while ``incumbent`` (bins of
    a packing already known) is above the target ``max(root bound, known_bound)``, the target
    decided by branch-and-price (module docstring) until ``deadline`` (``time.perf_counter``):
    a packing into it ends the search; a proof that none exists raises the bound to the target
    plus one, which is decided next. ``at_root(target)``: a cheaper search for a packing into
    the first target, run once before branch-and-price (its bins end the search)."""
    t0 = time.perf_counter()
    if not weights:
        return DiveResult(0, 0.0, [], 0, 0, 0.0)
    if max(weights) > capacity or min(weights) < 1:
        raise ValueError("every weight must lie in 1..capacity")
    s = _Search(weights, capacity, deadline)
    lb, lp = s.relax()
    tgt = max(lb, known_bound)
    bins = None
    nodes = columns = 0
    if at_root is not None and (incumbent is None or incumbent > tgt):
        got = at_root(tgt)
        if got is not None and len([b for b in got if b]) <= tgt:
            bins = [list(b) for b in got if b]
    while bins is None and (incumbent is None or incumbent > tgt) and not s.timed_out():
        r = branch_and_price(s.tw, s.demand, s.cap, tgt, deadline, s.master.patterns)
        nodes += r.nodes
        columns = max(columns, r.columns - len(s.master.patterns))
        if r.patterns is not None:
            bins = s.to_bins(r.patterns)
        if not r.decided or r.patterns is not None:
            break
        lb = tgt = tgt + 1                  # no packing into tgt bins
    if bins is not None:
        assert all(sum(weights[i] for i in b) <= capacity for b in bins)
        assert sorted(i for b in bins for i in b) == list(range(len(weights)))
    return DiveResult(max(lb, known_bound), lp, bins, nodes,
                      len(s.master.patterns) + columns, time.perf_counter() - t0)
