"""Excluding k GPUs by the supply of the heaviest adapters: a twin-sound lower-bound step.

The one-adapter and count-aware caps (``optim.feasibility``) bound each GPU on its own and let
every GPU concentrate its load on adapters at the instance's largest rate, as many as it likes.
A placement cannot: the instance has only ``t`` adapters in its *top group* (the heaviest ones)
and every GPU draws from the same supply. This step keeps that count.

**Setting.** Loads (tok/s) of the instance's adapters; the top group is the ``t`` heaviest, with
loads in ``[v, l]`` (``l`` the largest); every other adapter offers at most ``w <= v``. In a
placement on k GPUs, GPU ``i`` holds ``m_i`` adapters, ``h_i`` of them from the group, and
carries ``E_i``::

    sum_i m_i = n,    sum_i h_i = t,    sum_i E_i = L.

**Test GPU** ``T(m, E, h)`` (:func:`least_work_loads`). Start every top adapter at the group's ``h``
lightest loads and every other one at the instance's ``m - h`` lightest non-group loads (the
floors: a GPU's k-th lightest adapter of either kind is no lighter than the instance's), then
raise the top adapters to ``l`` (highest floor first), then the others to ``w`` (highest floor
first), until the load is ``E``. Its load vector majorizes that of every GPU of the instance
holding ``m`` adapters, ``h`` from the group, with load ``E`` (every prefix of its largest
entries sums to at least as much; ``tests/test_supply_exclusion.py`` checks this on sampled
subsets), so with all ranks lowered to the smallest it is the least-work such GPU under the
premises of ``feasibility.canonical_gpu`` (concentrating load, lowering rates and ranks, and
removing idle adapters never make a GPU starve): if ``T`` fails at every Amax, so does every
such GPU.

**Monotone.** ``T(m, E', h)`` fails for ``E' >= E`` when ``T(m, E, h)`` does (lower every
entry); ``T(m + 1, E, h)`` fails when ``T(m, E, h)`` does (``T(m, E, h)`` with one idle adapter
majorizes it). So one failure at ``(m0, h, E0)`` shows that no accepted GPU with ``m >= m0``
adapters, ``h`` of them from the group, carries ``E0`` or more.

**Fewer from the group.** When every group adapter offers the same load ``l`` (the default
group), ``T(m, E, h)`` majorizes ``T(m, E, h - 1)`` wherever both exist (the group adapter it
has more sits at ``l``, which the other spreads over lighter ones capped at ``w <= l``; checked
on sampled instances in the tests). So a failure of ``T(m0, E, h0)`` shows that no accepted GPU
with ``m >= m0`` adapters and ``h <= h0`` from the group carries ``max(E, least(m, h0))`` or more
(``least``: the lightest load of ``m`` adapters with ``h0`` from the group): such a GPU's load
lies in the range of every shape ``(m, h')``, ``h <= h' <= h0``, so the chain from ``T(m, ., h0)``
down to ``T(m, ., h)`` exists at it.

**Bound.** With ``U(m, h)`` an upper bound on the load an accepted GPU of that shape carries
(the failures above, the most such adapters offer, and the count-aware cap of every GPU),
k GPUs are excluded when::

    max { sum_i U(m_i, h_i) : sum_i m_i = n, sum_i h_i = t, k GPUs } < L

(a max-plus recursion over (adapters, group adapters); :func:`best_vector`).

**Ranks.** A GPU runs at the largest rank of its adapters (vLLM's ``--max-lora-rank``), and a
higher server rank makes every step slower. When the instance mixes ranks ``r_0 < ... <
r_{q-1}``, a GPU's *level* is its largest rank, and it is checked at that rank (its test
adapters' own ranks lowered to ``r_0``: they only set load times). The GPUs of level ``>= l``
hold every adapter of rank ``>= r_l``, so together at least that many adapters and that many of
the group; :func:`best_vector_levels` maximises over how many GPUs each level has and their
shapes under those sums. A test GPU that fails at a rank fails at every higher one (lowering
the server's rank never makes a GPU starve, the same premise), so failures bound the levels
above too. (Only while the tables have at most ``RANKED_MAX_CELLS`` cells: the recursion over
levels folds whole tables; larger instances are checked at the smallest rank, as before.)

**Search** (:func:`supply_excluded`). First the balanced split (each GPU n / k adapters, t / k
of the group, L / k; one rank): if none of its shapes is shown failing, nothing can be
excluded. Then lazy: solve the recursion with the current ``U``, check the cells of its best
vector at loads that would bring the sum down to ``L`` (each cell at a smaller adapter count
on a coarse grid first, which covers more cells; after a failure, the same adapters with more
of the group at that load, then fewer adapters at the load they can still offer), record
failures and non-failures, and repeat until the maximum is below ``L`` (excluded), the best
vector's not-excluded loads already reach ``L`` (not shown), or ``max_checks`` GPU checks are
spent.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Callable, Sequence

import numpy as np
from numba import njit

SUPPLY_VERSION = 6              # bump when the search changes (results are cached on disk)
SUPPLY_SOUND_VERSIONS = (2, 3, 4, 5, 6)  # versions whose cached exclusions still hold (proofs)
SUPPLY_CHECKS = 128             # GPU checks one exclusion may spend
SUPPLY_MAX_GPU_ADAPTERS = 512   # larger test GPUs are not checked (each check takes minutes)
SUPPLY_TOL = 0.002              # share of the whole load below which a cell is not lowered
RANKED_MAX_CELLS = 40_000       # rank levels only while the recursion's tables stay this small
GALLOP_STEPS = 2                # after a failure, retries at GALLOP_RATIO x the adapters
GALLOP_RATIO = 0.8
_NEG = -np.inf


@dataclass(frozen=True)
class SupplyGroup:
    """The instance's loads split into the top group (``top``, descending) and the others
    (``rest``, ascending), in tok/s."""

    top: np.ndarray
    rest: np.ndarray

    @property
    def t(self) -> int:
        return len(self.top)

    @property
    def n(self) -> int:
        return len(self.top) + len(self.rest)

    @property
    def largest(self) -> float:
        return float(self.top[0])

    @property
    def rest_cap(self) -> float:
        return float(self.rest[-1]) if len(self.rest) else 0.0

    @cached_property
    def load_bounds(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(ok, least, most), arrays over (m, h) of shape (n + 1, t + 1): whether a GPU can hold
        ``m`` of the adapters with ``h`` from the group, and the least and most load of such a
        GPU (sums of the lightest and heaviest ``h`` of the group and ``m - h`` of the others)."""
        def cum(x):
            return np.concatenate([[0.0], np.cumsum(x)])
        m = np.arange(self.n + 1)[:, None]
        h = np.arange(self.t + 1)[None, :]
        j = m - h
        ok = (j >= 0) & (j <= len(self.rest))
        jj = np.clip(j, 0, len(self.rest))
        least = cum(self.top[::-1])[h] + cum(self.rest)[jj]
        most = cum(self.top)[h] + cum(self.rest[::-1])[jj]
        return ok, least, most


def top_group_size(loads: Sequence[float], rtol: float = 1e-9) -> int:
    """Adapters at the largest load (within ``rtol``): the default group."""
    x = np.asarray(loads, dtype=float)
    return int(np.sum(x >= x.max() * (1.0 - rtol)))


def supply_group(loads: Sequence[float], t: int) -> SupplyGroup:
    """The ``t`` heaviest of ``loads`` as the group (``1 <= t < len(loads)``)."""
    x = np.sort(np.asarray(loads, dtype=float))
    if not 1 <= t < len(x):
        raise ValueError(f"supply group: t must be in 1..{len(x) - 1}, got {t}")
    return SupplyGroup(top=x[::-1][:t].copy(), rest=x[:len(x) - t].copy())


def shape_ok(g: SupplyGroup, m: int, h: int) -> bool:
    """A GPU of the instance can hold ``m`` adapters, ``h`` of them from the group."""
    return 0 <= h <= g.t and 0 <= m - h <= len(g.rest)


def load_range(g: SupplyGroup, m: int, h: int) -> tuple[float, float]:
    """(least, most) load of ``m`` of the instance's adapters with ``h`` from the group
    (a shape :func:`shape_ok` allows)."""
    _, least, most = g.load_bounds
    return float(least[m, h]), float(most[m, h])


def least_work_loads(g: SupplyGroup, m: int, h: int, load_tps: float) -> np.ndarray | None:
    """Loads of ``T(m, E, h)`` (module docstring), descending; None when no GPU of the
    instance with that shape carries ``load_tps``."""
    if not shape_ok(g, m, h):
        return None
    lo, hi = load_range(g, m, h)
    if load_tps < lo * (1 - 1e-12) or load_tps > hi * (1 + 1e-12):
        return None
    top = g.top[::-1][:h].astype(float)        # floors, ascending
    rest = g.rest[:m - h].astype(float)        # floors, ascending
    left = raise_floors(top, g.largest, max(float(load_tps) - lo, 0.0))
    raise_floors(rest, g.rest_cap, left)
    return np.sort(np.concatenate([top, rest]))[::-1]


def raise_floors(floors: np.ndarray, cap: float, left: float) -> float:
    """Raise ``floors`` (ascending, in place) to ``cap``, highest first, until ``left`` more load
    is placed: the test GPUs' concentration. Returns the load still to place."""
    for i in range(len(floors) - 1, -1, -1):
        up = min(cap - floors[i], left)
        if up > 0:
            floors[i] += up
            left -= up
        if left <= 0:
            break
    return left


@njit(cache=True)
def _maxplus(cur, U):
    """out[M, H] = max over (m, h) of cur[M - m, H - h] + U[m, h]."""
    n1, t1 = cur.shape
    out = np.full((n1, t1), -np.inf)
    for m in range(n1):
        for h in range(t1):
            u = U[m, h]
            if u == -np.inf:
                continue
            for M in range(m, n1):
                for H in range(h, t1):
                    c = cur[M - m, H - h]
                    if c != -np.inf and c + u > out[M, H]:
                        out[M, H] = c + u
    return out


def best_vector(U: np.ndarray, k: int) -> tuple[float, list[tuple[int, int]]]:
    """(max over GPU shapes (m_i, h_i), i = 1..k, with sum m_i = n and sum h_i = t of
    sum_i U[m_i, h_i], those shapes) for ``U`` of shape (n + 1, t + 1), -inf where no GPU
    has that shape (``U[0, 0]`` = 0: an empty GPU); (-inf, []) when none exists."""
    n, t = U.shape[0] - 1, U.shape[1] - 1
    if k < 1:
        raise ValueError(f"best_vector: k must be >= 1, got {k}")
    tables = [U]
    for _ in range(k - 2):
        tables.append(_maxplus(tables[-1], U))
    if k == 1:
        v = float(U[n, t])
        return (v, [(n, t)]) if np.isfinite(v) else (_NEG, [])
    # the last GPU against the target (n, t) only: cand[m, h] = U[m, h] + rest[n - m, t - h]
    cand = U + tables[-1][::-1, ::-1]
    arg = np.unravel_index(int(np.argmax(cand)), cand.shape)
    best = float(cand[arg])
    if not np.isfinite(best):
        return _NEG, []
    shapes = [(int(arg[0]), int(arg[1]))]
    M, H = n - shapes[0][0], t - shapes[0][1]
    for level in range(len(tables) - 1, 0, -1):   # tables[level] = level + 1 GPUs
        want = tables[level][M, H]
        cand = U[:M + 1, :H + 1] + tables[level - 1][M::-1, H::-1]
        m, h = np.argwhere(cand >= want - 1e-9 * max(1.0, abs(want)))[0]
        shapes.append((int(m), int(h)))
        M, H = M - int(m), H - int(h)
    shapes.append((M, H))
    return best, shapes


def _folds(U: np.ndarray, count: int) -> list[np.ndarray]:
    """tables[i][M, H] = best sum of U over i GPU shapes summing to (M, H), i = 0..count
    (tables[0]: 0 at (0, 0) only, no GPU)."""
    zero = np.full(U.shape, _NEG)
    zero[0, 0] = 0.0
    tables = [zero]
    for i in range(count):
        tables.append(U.copy() if i == 0 else _maxplus(tables[-1], U))
    return tables


def _split(U: np.ndarray, tables: list[np.ndarray], count: int, M: int, H: int
           ) -> list[tuple[int, int]]:
    """``count`` shapes attaining ``tables[count][M, H]`` (backtracking :func:`_folds`)."""
    shapes = []
    for level in range(count, 1, -1):
        want = tables[level][M, H]
        cand = U[:M + 1, :H + 1] + tables[level - 1][M::-1, H::-1]
        m, h = np.argwhere(cand >= want - 1e-9 * max(1.0, abs(want)))[0]
        shapes.append((int(m), int(h)))
        M, H = M - int(m), H - int(h)
    return shapes + [(M, H)] if count >= 1 else []


def best_vector_levels(Us: Sequence[np.ndarray], k: int, needs: Sequence[tuple[int, int]]
                       ) -> tuple[float, list[tuple[int, int, int]]]:
    """Like :func:`best_vector` with GPUs of ``q`` levels (module docstring, **Ranks**):
    ``Us[l]`` bounds a GPU of level ``l`` (ascending rank), and the GPUs of level ``>= l``
    hold together at least ``needs[l] = (adapters, group adapters)`` (``needs[0]`` is
    ignored). Returns (max sum over k GPUs, shapes as (level, m, h)); (-inf, []) when none
    exists."""
    q = len(Us)
    n, t = Us[0].shape[0] - 1, Us[0].shape[1] - 1
    if k < 1 or q < 1:
        raise ValueError(f"best_vector_levels: k and the levels must be >= 1, got {k}, {q}")
    M = np.arange(n + 1)[:, None]
    H = np.arange(t + 1)[None, :]

    def mask(level: int) -> np.ndarray:
        c, th = needs[level] if level > 0 else (0, 0)
        return (M >= c) & (H >= th)

    folds = [_folds(U, k) for U in Us]
    top = mask(q - 1)
    C = [np.where(top, folds[q - 1][j], _NEG) for j in range(k + 1)]
    stages = []                  # per lower level: (C of the levels above, its folds)
    for level in range(q - 2, -1, -1):
        ok = mask(level)
        new = []
        for j in range(k + 1):
            best = np.full(C[0].shape, _NEG)
            for i in range(j + 1):
                best = np.maximum(best, _maxplus(C[j - i], folds[level][i]))
            new.append(np.where(ok, best, _NEG))
        stages.append((level, C))
        C = new
    value = float(C[k][n, t])
    if not np.isfinite(value):
        return _NEG, []
    shapes: list[tuple[int, int, int]] = []
    j, Mc, Hc, want = k, n, t, value
    for level, above in reversed(stages):       # peel the lowest level first
        tol = 1e-9 * max(1.0, abs(want))
        found = None
        for i in range(j + 1):
            low = folds[level][i][:Mc + 1, :Hc + 1]
            cand = low + above[j - i][Mc::-1, Hc::-1]
            hit = np.argwhere(cand >= want - tol)
            if len(hit):
                m, h = (int(v) for v in hit[0])
                found = (i, m, h, float(low[m, h]))
                break
        i, m, h, part = found
        shapes += [(level, a, b) for a, b in _split(Us[level], folds[level], i, m, h)]
        j, Mc, Hc, want = j - i, Mc - m, Hc - h, want - part
    shapes += [(q - 1, a, b) for a, b in _split(Us[q - 1], folds[q - 1], j, Mc, Hc)]
    return value, shapes


def grid_count(m: int, h: int) -> int:
    """The adapter count a cell is checked at first: ``m`` rounded down to a grid of about 16
    steps per doubling, never below ``h`` or 1 (a failure there covers every larger count)."""
    step = max(1, m // 16)
    return max(h, 1, m - m % step)


@dataclass
class _Cells:
    """Failures (every accepted GPU of the shape carries less) and non-failures per group
    count ``h``: lists of (adapters, load). With ``group`` set (a uniform group, module
    docstring, **Fewer from the group**) a failure at ``h0`` also bounds every ``h < h0``."""

    fails: dict
    passes: dict
    group: SupplyGroup | None = None

    def upper(self, m: int, h: int) -> float:
        own = min((e for m0, e in self.fails.get(h, ()) if m0 <= m), default=np.inf)
        if self.group is None:
            return own
        _, least, _ = self.group.load_bounds
        return min([own] + [max(e, float(least[m, h0])) for h0, pts in self.fails.items()
                            if h0 > h for m0, e in pts if m0 <= m])

    def lower(self, m: int, h: int) -> float:
        return max((e for m0, e in self.passes.get(h, ()) if m0 >= m), default=-np.inf)


def uniform_group(g: SupplyGroup) -> bool:
    """Every adapter of the group offers the same load (the default group: those at the
    largest load), which **Fewer from the group** needs."""
    return bool(g.top[-1] >= g.top[0] * (1.0 - 1e-12))


def _table(g: SupplyGroup, cells: _Cells, gpu_cap: float, tol: float
           ) -> tuple[np.ndarray, np.ndarray]:
    """(U, floor): the upper bound per shape (-inf where no accepted GPU has it) and the load
    no check has shown failing there (``tol`` below the shape's least load when none was
    checked: a failure at that load rules the shape out)."""
    n, t = g.n, g.t
    ok, lo, hi = g.load_bounds
    fail = np.full((n + 1, t + 1), np.inf)
    floor = np.full((n + 1, t + 1), -np.inf)
    for hh, pts in cells.fails.items():
        for m0, e in pts:
            fail[m0:, hh] = np.minimum(fail[m0:, hh], e)
            if cells.group is not None and hh > 0:     # ... and fewer from the group
                below = np.maximum(e, lo[m0:, hh])[:, None]
                fail[m0:, :hh] = np.minimum(fail[m0:, :hh], below)
    for hh, pts in cells.passes.items():
        for m0, e in pts:
            floor[:m0 + 1, hh] = np.maximum(floor[:m0 + 1, hh], e)
    most = np.minimum(hi, gpu_cap)            # an accepted GPU carries at most this ...
    u = np.minimum(most, fail)                # ... and less than a failing load
    U = np.where(ok & (most >= lo) & (fail > lo), u, _NEG)
    F = np.where(ok, np.maximum(lo - tol, np.minimum(floor, u)), 0.0)
    U[0, 0], F[0, 0] = 0.0, 0.0
    return U, F


def _balanced_pass(g: SupplyGroup, k: int, L: float,
                   run: Callable[[int, int, float], bool | None]) -> bool:
    """True when the balanced split (each GPU ``n / k`` adapters, ``t / k`` of the group, ``L /
    k`` of the load, rounded so that the shapes sum to ``(n, t)``) is not shown failing on any
    of its shapes: each of them then bounds its GPU at ``L / k`` or more, the split reaches
    ``L``, and no number of checks can exclude k GPUs (checked first, so a hopeless search
    ends after a check or two)."""
    if k < 2:
        return False
    shapes = {(g.n // k + (i < g.n % k), g.t // k + (i < g.t % k)) for i in range(k)}
    for m, h in sorted(shapes):
        if run(m, h, L / k) is not False:       # fails, or cannot be checked
            return False
    return True


def supply_excluded(loads: Sequence[float], k: int, total_tps: float, gpu_cap_tps: float,
                    check: Callable[..., bool], max_checks: int = SUPPLY_CHECKS,
                    t: int | None = None, progress: Callable[[str], None] | None = None,
                    ranks: Sequence[int] | None = None) -> bool:
    """True when no placement of adapters with ``loads`` on ``k`` GPUs has every GPU accepted,
    shown by the group supply (module docstring); False when not shown within ``max_checks``
    calls of ``check(least_work_loads) -> excluded`` (one GPU check each). ``gpu_cap_tps``: a
    load no accepted GPU carries more of (the count-aware cap); ``t``: group size (default: the
    adapters at the largest load). ``ranks``: each adapter's rank (module docstring, **Ranks**);
    when they differ the checks are ``check(least_work_loads, rank)``."""
    x = np.asarray(loads, dtype=float)
    if k < 1 or len(x) < 2:
        return False
    t = top_group_size(x) if t is None else int(t)
    if not 1 <= t < len(x):
        return False
    g = supply_group(x, t)
    L = float(total_tps)
    tol = SUPPLY_TOL * L
    levels = sorted(set(int(r) for r in ranks)) if ranks is not None else [0]
    ranked = len(levels) > 1 and (len(x) + 1) * (t + 1) <= RANKED_MAX_CELLS
    if not ranked:
        levels = [0]             # one level: every GPU checked at the smallest rank
    needs = [(0, 0)] * len(levels)
    if ranked:
        r = np.asarray(ranks, int)
        in_group = np.zeros(len(x), bool)
        in_group[np.argsort(-x, kind="stable")[:t]] = True     # the t heaviest
        needs = [(int(np.sum(r >= v)), int(np.sum((r >= v) & in_group))) for v in levels]
    kinds = tuple(range(len(levels)))
    cells = {kind: _Cells({}, {}, g if uniform_group(g) else None) for kind in kinds}
    used = 0

    def run(kind: int, m: int, h: int, e: float) -> bool | None:
        """Check T(m, e, h) on a GPU of ``kind``; None when it cannot be checked."""
        nonlocal used
        vec = least_work_loads(g, m, h, e)
        if vec is None or m > SUPPLY_MAX_GPU_ADAPTERS or used >= max_checks:
            return None
        used += 1
        out = bool(check(vec, levels[kind]) if ranked else check(vec))
        # a GPU that fails at a rank fails at every higher one; one not shown failing is
        # not shown failing at a lower one either
        for other in (kinds[kind:] if out else kinds[:kind + 1]):
            c = cells[other]
            (c.fails if out else c.passes).setdefault(h, []).append((m, float(e)))
        if progress is not None:
            what = f"rank {levels[kind]}, " if ranked else ""
            progress(f"supply check {used}: {what}{m} adapters ({h} of the {t} heaviest) at "
                     f"{e:,.0f} tok/s: {'fails' if out else 'not shown failing'}")
        return out

    def _gallop(kind: int, m: int, h: int, e: float) -> None:
        """After a failure at (m, h, e): with a uniform group the same adapters holding more of
        the group at the same load (a failure there covers every smaller group count), then
        fewer adapters (a failure there covers more shapes) at the load they can still offer,
        while they fail, at most ``GALLOP_STEPS`` times."""
        _, least, most = g.load_bounds
        c = cells[kind]
        if c.group is not None:                 # the most of the group that carries as little
            up = h                              # as e (toward all of it)
            for frac in (1.0, 0.5, 0.25, 0.125):
                hh = h + int(frac * (min(g.t, m) - h))
                if shape_ok(g, m, hh) and float(least[m, hh]) <= e:
                    up = hh
                    break
            if up > h and e < c.upper(m, up) and run(kind, m, up, e):
                h = up
        for _ in range(GALLOP_STEPS):
            m2 = grid_count(max(h, 1, int(m * GALLOP_RATIO)), h)
            if m2 >= m or not shape_ok(g, m2, h):
                return
            e2 = min(e, float(most[m2, h]))
            if (e2 < float(least[m2, h]) or e2 >= c.upper(m2, h) or e2 <= c.lower(m2, h)
                    or not run(kind, m2, h, e2)):
                return
            m, e = m2, e2

    if not ranked and _balanced_pass(g, k, L, lambda m, h, e: run(0, m, h, e)):
        return False

    while True:
        tabs = {kind: _table(g, cells[kind], gpu_cap_tps, tol) for kind in kinds}
        if ranked:
            best, shapes = best_vector_levels([tabs[kd][0] for kd in kinds], k, needs)
        else:
            best, shapes = best_vector(tabs[0][0], k)
            shapes = [(0, m, h) for m, h in shapes]
        if best < L * (1.0 - 1e-9):          # the bounds hold with equality at the most
            return True
        shapes = [s for s in shapes if s[1] > 0]
        ub = np.array([tabs[kd][0][m, h] for kd, m, h in shapes])
        fl = np.array([tabs[kd][1][m, h] for kd, m, h in shapes])
        if (all(cells[kd].lower(m, h) > -np.inf for kd, m, h in shapes)
                and fl.sum() >= L - tol):
            return False                      # these shapes were not shown failing at L
        room = np.where(ub - fl >= tol * (1 - 1e-9), ub - fl, 0.0)   # loads left to check
        if room.sum() <= 0:
            return False
        need = best - L + tol
        progressed = False
        for (kd, m, h), u, r in zip(shapes, ub, room):
            if r <= 0:
                continue
            c = cells[kd]
            target = max(u - need * r / room.sum(), tabs[kd][1][m, h] + tol)
            if target >= c.upper(m, h):
                continue
            for mm in dict.fromkeys((grid_count(m, h), m)):
                if target >= c.upper(mm, h) or target <= c.lower(mm, h):
                    continue
                out = run(kd, mm, h, target)
                if out is None:               # outside that count's loads, or out of checks
                    continue
                progressed = True
                if out:
                    _gallop(kd, mm, h, target)
                    break
        if not progressed:
            return False


__all__ = ["SUPPLY_VERSION", "SUPPLY_SOUND_VERSIONS", "SUPPLY_CHECKS", "SUPPLY_MAX_GPU_ADAPTERS",
           "SupplyGroup", "top_group_size", "supply_group", "uniform_group", "shape_ok",
           "load_range", "least_work_loads", "raise_floors", "best_vector", "best_vector_levels",
           "grid_count", "supply_excluded"]
