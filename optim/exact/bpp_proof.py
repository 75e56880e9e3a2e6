"""Branch-and-price on arc flows: a packing into ``k`` bins, or a proof that none exists.

One-capacity bin packing with item *types* ``j`` (weight ``w_j``, heaviest first, demand
``d_j``), capacity ``C`` and a target of ``k`` bins; the *slack* ``S = k C - sum_j w_j d_j``
bounds every bin's waste in a packing into ``k`` bins, so only *patterns* (count vectors
``a <= d``) with load in ``C - S .. C`` count.

**Arcs.** A pattern is read as its *canonical path*: its items heaviest first, copy by copy,
over the loads ``0 .. C``; the arc ``(u, j)`` is one item of type ``j`` placed at load ``u``
(from ``u`` to ``u + w_j``). A packing's *arc flow* ``f_(u,j)`` counts its bins whose canonical
path has that arc. Branching on ``f_a <= r`` / ``f_a >= r + 1`` (Valério de Carvalho 1999)
splits the packings, and when every arc flow of an LP solution is an integer its flow decomposes
into ``k`` paths from load 0, each a bin within the capacity, together holding every item.

**Node relaxation.** The Gilmore–Gomory master restricted to the node: patterns with load
``>= C - S`` whose canonical path avoids the arcs fixed to 0, rows ``sum_p a_jp x_p >= d_j``
and ``sum_p [a in path p] x_p >= r`` or ``<= r`` for the other branch decisions, minimising
``sum_p x_p`` by column generation. Pricing is a dynamic programme over (type, load) along
canonical paths with the arcs' branch duals (``price_arcs``).

**Proof, exact in integer arithmetic.** With integer multipliers ``Y >= 0`` (demand rows and
``>=`` rows) and ``V >= 0`` (``<=`` rows), every bin ``p`` of a packing in the node has value
``z_p = Y.a_p + sum_a (U_a - V_a) [a in p] <= Z`` (the pricing optimum over the node's
patterns), while the rows give ``sum_p z_p >= Y.d + U.r - V.r'``; so the packing has at least
``ceil((Y.d + U.r - V.r') / Z)`` bins (Farley's bound; none when ``Z <= 0`` and the right side is
positive). The multipliers are the LP duals scaled by ``2^30`` and floored; a node whose bound
exceeds ``k`` holds no packing into ``k`` bins. A search that ends without a packing has
therefore proved that ``k`` bins do not suffice, whatever the LP solver's rounding.

Search: depth first, the ``>=`` branch first (a dive towards a packing); the branched arc is the
most fractional one (ties: the heaviest item, the lowest load). Deterministic: no clock in the
search path (the deadline only stops it, and then nothing is claimed).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from numba import njit

from .common import highs_threads

SCALE = 1 << 30             # duals in integer units for the exact bound
BIG = 64.0                  # cost of an artificial column (a row left uncovered)
FRAC = 1e-6                 # an arc flow this close to an integer counts as integral
NO_PACKING = 1 << 40        # the bound when the node holds no packing at all


@njit(cache=True)
def best_load_from(value, min_load, neg):     # pragma: no cover - compiled
    """The load ``v >= min_load`` of the largest ``value[v] > neg`` (the first on ties), -1 if
    none: the arc pricing's read-out of its best bin."""
    best = -1
    for v in range(min_load, value.shape[0]):
        if value[v] > neg and (best < 0 or value[v] > value[best]):
            best = v
    return best


@njit(cache=True)
def _price_arcs_nb(tw, bound, values, adj, forbid, cap, min_load):  # pragma: no cover - compiled
    m = tw.shape[0]
    NEG = -(1 << 62)
    cur = np.full(cap + 1, NEG, np.int64)
    cur[0] = 0
    choice = np.zeros((m, cap + 1), np.int32)
    for j in range(m):
        w = tw[j]
        nxt = cur.copy()
        maxc = min(bound[j], cap // w)
        if maxc > 0:
            for u in range(cap - w + 1):
                if cur[u] == NEG:
                    continue
                acc = cur[u]
                v = u
                for c in range(1, maxc + 1):
                    if v + w > cap or forbid[v, j]:
                        break
                    acc += values[j] + adj[v, j]
                    v += w
                    if acc > nxt[v]:
                        nxt[v] = acc
                        choice[j, v] = c
        cur = nxt
    best_v = best_load_from(cur, min_load, NEG)
    a = np.zeros(m, np.int64)
    if best_v < 0:
        return NEG, a, False
    v = best_v
    for j in range(m - 1, -1, -1):
        c = choice[j, v]
        a[j] = c
        v -= c * tw[j]
    return cur[best_v], a, True


def price_arcs(tw: np.ndarray, bound: np.ndarray, values: np.ndarray, adj: np.ndarray,
               forbid: np.ndarray, cap: int, min_load: int) -> tuple[int, np.ndarray] | None:
    """The largest ``values . a + sum of adj[u, j]`` over the arcs ``(u, j)`` of ``a``'s canonical
    path, over patterns ``0 <= a <= bound`` with load in ``min_load .. cap`` whose path uses no
    arc with ``forbid[u, j]``; one such ``a``; ``None`` when there is none. ``tw`` heaviest
    first; integer data (exact)."""
    z, a, ok = _price_arcs_nb(np.asarray(tw, np.int64), np.asarray(bound, np.int64),
                              np.asarray(values, np.int64), np.asarray(adj, np.int64),
                              np.asarray(forbid, np.bool_), int(cap), int(min_load))
    return (int(z), a) if ok else None


def path_arcs(tw: Sequence[int], a: Sequence[int]) -> list[tuple[int, int]]:
    """The arcs ``(u, j)`` of ``a``'s canonical path (heaviest items first)."""
    out, u = [], 0
    for j, c in enumerate(a):
        for _ in range(int(c)):
            out.append((u, j))
            u += int(tw[j])
    return out


def price_arcs_reference(tw, bound, values, adj, forbid, cap, min_load) -> int | None:
    """``price_arcs``'s optimum by enumerating every pattern (tests)."""
    import itertools
    best = None
    for a in itertools.product(*(range(min(int(b), cap // int(w)) + 1)
                                 for w, b in zip(tw, bound))):
        load = sum(x * int(w) for x, w in zip(a, tw))
        if not min_load <= load <= cap:
            continue
        arcs = path_arcs(tw, a)
        if any(forbid[u][j] for u, j in arcs):
            continue
        v = sum(x * int(y) for x, y in zip(a, values)) + sum(int(adj[u][j]) for u, j in arcs)
        best = v if best is None else max(best, v)
    return best


@dataclass(frozen=True)
class ProofResult:
    """Outcome of ``branch_and_price``: ``decided`` when the search ended (then ``patterns`` is a
    packing into ``target`` bins as count vectors per bin, or ``None``: none exists); undecided
    when the deadline stopped it (``patterns`` ``None``, nothing claimed). ``nodes``: node
    relaxations solved; ``columns``: patterns generated."""

    decided: bool
    patterns: list[np.ndarray] | None
    nodes: int
    columns: int
    wall_s: float


class _Master:
    """The node master LP (HiGHS, warm-started): demand rows, then one row per ``>= r`` or
    ``<= r`` branch decision on the current path (a stack); an artificial column at cost ``BIG``
    per demand row and per branch level keeps it feasible. Columns using an arc fixed to 0 are
    switched off."""

    def __init__(self, tw: np.ndarray, demand: np.ndarray, cap: int, min_load: int):
        import highspy
        self.h = highspy.Highs()
        self.h.setOptionValue("output_flag", False)
        self.h.setOptionValue("threads", highs_threads(None))
        self.inf = highspy.kHighsInf
        self.tw, self.demand, self.cap, self.min_load = tw, demand, cap, min_load
        m = len(demand)
        self.m = m
        self.h.addRows(m, np.asarray(demand, float), np.full(m, self.inf), 0,
                       np.zeros(0, np.int32), np.zeros(0, np.int32), np.zeros(0))
        for j in range(m):
            self.h.addCol(BIG, 0.0, self.inf, 1, np.array([j], np.int32), np.array([1.0]))
        self.col_pat: list[int] = [-1] * m          # column -> pattern index (-1: artificial)
        self.art_of_level: list[int] = []           # artificial column of each branch level
        self.patterns: list[np.ndarray] = []
        self.arcs: list[frozenset[tuple[int, int]]] = []
        self.pat_col: list[int] = []
        self.by_arc: dict[tuple[int, int], list[int]] = {}
        self.blocked = np.zeros(0, np.int64)        # per pattern: fixed-to-0 arcs it uses
        self.seen: set[bytes] = set()
        self.rows: list[tuple[tuple[int, int], int, int]] = []     # (arc, sense +1/-1, r)
        self.forbid = np.zeros((cap + 1, m), np.bool_)

    def add(self, a: np.ndarray) -> bool:
        a = np.asarray(a, np.int64)
        key = a.tobytes()
        if key in self.seen or int(a @ self.tw) < self.min_load:
            return False
        self.seen.add(key)
        arcs = frozenset(path_arcs(self.tw, a))
        p = len(self.patterns)
        self.patterns.append(a)
        self.arcs.append(arcs)
        for arc in arcs:
            self.by_arc.setdefault(arc, []).append(p)
        blocked = sum(1 for u, j in arcs if self.forbid[u, j])
        self.blocked = np.append(self.blocked, blocked)
        idx = [int(j) for j in np.flatnonzero(a)]
        val = [float(a[j]) for j in idx]
        for t, (arc, _, _) in enumerate(self.rows):
            if arc in arcs:
                idx.append(self.m + t)
                val.append(1.0)
        self.h.addCol(1.0, 0.0, 0.0 if blocked else self.inf, len(idx),
                      np.array(idx, np.int32), np.array(val))
        self.pat_col.append(len(self.col_pat))
        self.col_pat.append(p)
        return True

    def push_row(self, arc: tuple[int, int], sense: int, r: int) -> None:
        t = len(self.rows)
        users = [self.pat_col[p] for p in self.by_arc.get(arc, [])]
        lo, hi = (float(r), self.inf) if sense > 0 else (-self.inf, float(r))
        self.h.addRow(lo, hi, len(users), np.array(users, np.int32), np.ones(len(users)))
        self.rows.append((arc, sense, r))
        if t == len(self.art_of_level):
            self.h.addCol(BIG, 0.0, self.inf, 1, np.array([self.m + t], np.int32),
                          np.array([1.0]))
            self.art_of_level.append(len(self.col_pat))
            self.col_pat.append(-1)
        else:
            self.h.changeCoeff(self.m + t, self.art_of_level[t], 1.0 if sense > 0 else 0.0)

    def pop_row(self) -> None:
        t = len(self.rows) - 1
        self.h.deleteRows(1, np.array([self.m + t], np.int32))
        self.rows.pop()

    def set_forbidden(self, arc: tuple[int, int], on: bool) -> None:
        u, j = arc
        self.forbid[u, j] = on
        ps = self.by_arc.get(arc, [])
        if not ps:
            return
        ps = np.asarray(ps)
        self.blocked[ps] += 1 if on else -1
        cols = np.asarray([self.pat_col[p] for p in ps], np.int32)
        up = np.where(self.blocked[ps] > 0, 0.0, self.inf)
        self.h.changeColsBounds(len(cols), cols, np.zeros(len(cols)), up)

    def solve(self) -> tuple[np.ndarray, np.ndarray, float, float]:
        """(pattern values, row duals, objective, artificial total)."""
        self.h.run()
        sol = self.h.getSolution()
        cv = np.asarray(sol.col_value)
        cp = np.asarray(self.col_pat)
        x = np.zeros(len(self.patterns))
        x[cp[cp >= 0]] = cv[cp >= 0]
        art = float(cv[cp < 0].sum())
        return x, np.asarray(sol.row_dual), float(self.h.getInfo().objective_function_value), art


class _BranchAndPrice:
    """The search state: the master, the branch duals' scratch array, node count."""

    def __init__(self, tw, demand, cap: int, target: int, deadline: float,
                 patterns: Sequence[np.ndarray] = ()):
        self.tw = np.asarray(tw, np.int64)
        self.demand = np.asarray(demand, np.int64)
        self.cap, self.target, self.deadline = int(cap), int(target), deadline
        self.slack = self.target * self.cap - int(self.tw @ self.demand)
        self.min_load = max(0, self.cap - self.slack)
        self.master = _Master(self.tw, self.demand, self.cap, self.min_load)
        for a in patterns:
            self.master.add(np.minimum(np.asarray(a, np.int64), self.demand))
        self.adj = np.zeros((self.cap + 1, len(self.tw)), np.int64)    # branch duals per arc
        self.nodes = 0
        self.cut_short = False

    def bound(self) -> tuple[int, np.ndarray, float]:
        """Column generation at the current node: (exact bound, pattern values, artificial
        total) (module docstring); stops once the bound exceeds the target."""
        M = self.master
        m = len(self.tw)
        lb = 0
        while True:
            x, duals, obj, art = M.solve()
            y = np.floor(np.maximum(duals[:m], 0.0) * SCALE).astype(np.int64)
            adj = self.adj
            rhs = int(y @ self.demand)
            for t, (arc, sense, r) in enumerate(M.rows):
                d = duals[m + t]
                if sense > 0:
                    u = int(np.floor(max(d, 0.0) * SCALE))
                    adj[arc] += u
                    rhs += u * r
                else:
                    v = int(np.floor(max(-d, 0.0) * SCALE))
                    adj[arc] -= v
                    rhs -= v * r
            got = price_arcs(self.tw, self.demand, y, adj, M.forbid, self.cap, self.min_load)
            for arc, _, _ in M.rows:
                adj[arc] = 0
            if got is None:
                return NO_PACKING, x, art
            z, a = got
            if z > 0:
                lb = max(lb, -(-rhs // z))
            elif rhs > 0:
                lb = NO_PACKING
            if lb > self.target or z <= SCALE or time.perf_counter() > self.deadline:
                return lb, x, art
            if not M.add(a):
                return lb, x, art

    def flows(self, x: np.ndarray) -> dict[tuple[int, int], float]:
        f: dict[tuple[int, int], float] = {}
        for p in np.flatnonzero(x > 1e-9):
            for arc in self.master.arcs[p]:
                f[arc] = f.get(arc, 0.0) + float(x[p])
        return f

    def branch_arc(self, f: dict[tuple[int, int], float]) -> tuple[int, int] | None:
        """The most fractional arc of ``f`` (ties: heaviest item, lowest load), or None."""
        best, arc_b = None, None
        for arc, v in f.items():
            fr = v - np.floor(v)
            if FRAC < fr < 1 - FRAC:
                key = (-min(fr, 1 - fr), arc[1], arc[0])
                if best is None or key < best:
                    best, arc_b = key, arc
        return arc_b

    def search(self) -> list[np.ndarray] | None:
        """Depth-first branch-and-price from the current node (module docstring), the ``>=``
        branch first: a packing into the target, or None (then ``cut_short`` says whether the
        search was cut short: the deadline, or integral flows that give no packing). An explicit
        stack: a branch decision is undone once its subtree is done."""
        M = self.master
        stack: list[tuple] = [("node",)]
        while stack:
            item = stack.pop()
            if item[0] == "pop":
                M.pop_row()
                continue
            if item[0] == "allow":
                M.set_forbidden(item[1], False)
                continue
            if item[0] == "down":
                _, arc, r = item
                if r == 0:
                    M.set_forbidden(arc, True)
                    stack += [("allow", arc), ("node",)]
                else:
                    M.push_row(arc, -1, r)
                    stack += [("pop",), ("node",)]
                continue
            if time.perf_counter() > self.deadline:
                self.cut_short = True
                return None
            self.nodes += 1
            lb, x, art = self.bound()
            if lb > self.target:
                continue
            if time.perf_counter() > self.deadline:
                self.cut_short = True
                return None
            f = self.flows(x)
            arc = self.branch_arc(f)
            if arc is None:
                pats = self.decompose(f) if art < FRAC else None
                if pats is not None:
                    return pats
                self.cut_short = True       # integral flows that give no packing: no claim
                return None
            v = f[arc]
            M.push_row(arc, +1, int(np.ceil(v)))
            stack += [("down", arc, int(np.floor(v))), ("pop",), ("node",)]
        return None

    def decompose(self, f: dict[tuple[int, int], float]) -> list[np.ndarray] | None:
        """``f``'s integer arc flow split into paths from load 0 (one per bin), as count
        vectors, checked; ``None`` when it does not give a packing into the target."""
        left = {arc: int(round(v)) for arc, v in f.items() if round(v) > 0}
        out_of: dict[int, list[tuple[int, int]]] = {}
        for u, j in sorted(left):
            out_of.setdefault(u, []).append((u, j))
        start = sum(c for (u, _), c in left.items() if u == 0)
        pats = []
        for _ in range(start):
            a = np.zeros(len(self.tw), np.int64)
            u = 0
            while True:
                nxt = next((arc for arc in out_of.get(u, []) if left[arc] > 0), None)
                if nxt is None:
                    break
                left[nxt] -= 1
                a[nxt[1]] += 1
                u += int(self.tw[nxt[1]])
            pats.append(a)
        if len(pats) > self.target or any(c > 0 for c in left.values()):
            return None
        total = np.sum(pats, axis=0) if pats else np.zeros(len(self.tw), np.int64)
        if (total < self.demand).any() or any(int(a @ self.tw) > self.cap for a in pats):
            return None
        surplus = total - self.demand               # drop extra copies (never adds load)
        for a in pats:
            cut = np.minimum(a, surplus)
            a -= cut
            surplus -= cut
        return pats


def branch_and_price(tw: Sequence[int], demand: Sequence[int], cap: int, target: int,
                     deadline: float, patterns: Sequence[np.ndarray] = ()) -> ProofResult:
    """Decide whether the items (types ``tw`` heaviest first, ``demand`` copies) fit ``target``
    bins of ``cap`` (module docstring), until ``deadline`` (``time.perf_counter``); ``patterns``
    seed the master (any count vectors; those below the load floor are skipped)."""
    t0 = time.perf_counter()
    tw = np.asarray(tw, np.int64)
    demand = np.asarray(demand, np.int64)
    if len(tw) > 1 and (np.diff(tw) >= 0).any():
        raise ValueError("types must be distinct and heaviest first")
    if target * cap < int(tw @ demand):
        return ProofResult(True, None, 0, 0, time.perf_counter() - t0)
    s = _BranchAndPrice(tw, demand, cap, target, deadline, patterns)
    pats = s.search()
    if pats is not None:
        assert all(int(a @ tw) <= cap for a in pats) and len(pats) <= target
        assert (np.sum(pats, axis=0) == demand).all()
    decided = pats is not None or not s.cut_short
    return ProofResult(decided, pats if decided else None, s.nodes, len(s.master.patterns),
                       time.perf_counter() - t0)


__all__ = ["ProofResult", "branch_and_price", "price_arcs", "price_arcs_reference",
           "path_arcs"]
