"""Excluding two GPUs by the supply of the two heaviest load classes: a twin-sound bound step.

``optim.supply_exclusion`` tracks one group (the adapters at the largest load) and lets each GPU
raise its other adapters from the instance's lightest loads to the largest one outside the
group, as it likes. On many-adapter instances with several rate classes that is too generous:
the balanced split of ``paper-llama-rlow-qlow-n1536`` (768 adapters, 154 of each of five rate
classes) fails in the twin, while its one-group test GPU (154 at the top rate, 242 at the
second, 372 at the lowest) passes, because a placement's two GPUs share the supply of
second-class adapters too. For two GPUs this step tracks both classes exactly.

**Setting.** Loads of the instance's adapters; class 1: the ``t1`` adapters at the largest load
``l1``; class 2: the ``t2`` at the second-largest ``l2``; the rest offer at most ``w < l2``. A
GPU's *shape* is ``(m, h1, h2)``: ``m`` adapters, ``h1`` of class 1, ``h2`` of class 2; two GPUs
have shapes ``s`` and its complement ``s' = (n - m, t1 - h1, t2 - h2)``.

**Test GPU** ``T(m, E, h1, h2)`` (:func:`pair_test_loads`): ``h1`` adapters at ``l1``, ``h2`` at
``l2``, and the ``m - h1 - h2`` lightest of the rest raised to ``w`` (highest first) until the load
is ``E``. Its load vector majorizes that of every GPU of the instance with that shape and load
(the two classes are equal; the rest part is the one-group test GPU's), so under the premises of
``feasibility.canonical_gpu`` (concentrating load, lowering rates and removing idle adapters
never make a GPU starve) it is the least-work one: if it fails at every Amax, so does every
such GPU.

**Monotone.** A failure of ``T(m0, E, a, b)`` shows that no accepted GPU with ``m >= m0``
adapters, ``h1 <= a`` and ``h2 <= b`` carries ``max(E, least(m, a, b))`` or more: one more
adapter (idle) or a higher load only make it harder, and ``T(m, ., h1, h2)`` majorizes ``T(m, .,
h1, h2 - 1)`` and ``T(m, ., h1 - 1, h2)`` (the extra class adapter sits at ``l1`` or ``l2 >= w``
where the other spreads its load over rest adapters capped at ``w``; sampled in the tests); a
GPU of the smaller shape whose load is at least ``least(m, a, b)`` lies in the range of every
shape on the way, so the chain exists at its load.

**Bound.** With ``U(s)`` the least of the shape's most load, the count-aware cap and every
failure's load covering ``s``, two GPUs are excluded when ``U(s) + U(s') < L`` for every shape
(a numpy table over ``(m, h1, h2)``).

**Search** (:func:`pair_supply_excluded`): first the balanced split (``s`` and ``s'`` at ``L / 2``;
if neither fails, nothing can be shown); then, lazily, the best pair of the table: the side
with more room is checked first at what it must carry when the other carries its most (a
failure there rules the pair out), then each side at the load that would bring the pair's sum
to ``L`` in proportion to its room; a failure is followed by the same GPU holding more of both
classes (toward both whole, as much as can still carry that load; a failure there covers every
smaller class count), by the GPU holding both whole at the least it then carries, and by fewer
adapters (the load clipped to what they offer), each raised in both classes again. It ends when
the table excludes every pair, when both sides of the best pair are not shown failing at loads
reaching ``L``, or when the checks are spent.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Callable, Sequence

import numpy as np

from .supply_exclusion import raise_floors, top_group_size

PAIR_SUPPLY_VERSION = 5
PAIR_SUPPLY_BUDGET = 2          # GPU checks per check of the one-group step's budget
SOUND_RTOL = 1e-5               # the best pair must stay this far below the load (float32)
PAIR_SUPPLY_TOL = 0.002         # share of the load a pair must clear
GALLOP_STEPS = 2
GALLOP_RATIO = 0.8
_NEG = -np.inf


@dataclass(frozen=True)
class TwoClasses:
    """The instance's loads as class 1 (``t1`` at ``l1``), class 2 (``t2`` at ``l2``) and the
    rest (ascending)."""

    l1: float
    t1: int
    l2: float
    t2: int
    rest: np.ndarray

    @property
    def n(self) -> int:
        return self.t1 + self.t2 + len(self.rest)

    @property
    def w(self) -> float:
        return float(self.rest[-1]) if len(self.rest) else 0.0

    @cached_property
    def bounds(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(ok, least, most) over (m, h1, h2), shape (n + 1, t1 + 1, t2 + 1): whether a GPU can
        hold that shape, and its least and most load."""
        def cum(x):
            return np.concatenate([[0.0], np.cumsum(x)])
        m = np.arange(self.n + 1)[:, None, None]
        h1 = np.arange(self.t1 + 1)[None, :, None]
        h2 = np.arange(self.t2 + 1)[None, None, :]
        j = m - h1 - h2
        r = len(self.rest)
        ok = (j >= 0) & (j <= r)
        jj = np.clip(j, 0, r)
        base = h1 * self.l1 + h2 * self.l2
        # float32 halves the tables (1,536 adapters: 146 M shapes, 0.6 GB a table); the
        # bound keeps a relative margin far above its rounding (``SOUND_RTOL``)
        return (ok, (base + cum(self.rest)[jj]).astype(np.float32),
                (base + cum(self.rest[::-1])[jj]).astype(np.float32))


def two_classes(loads: Sequence[float], rtol: float = 1e-9) -> TwoClasses | None:
    """The two heaviest load classes of ``loads`` (None unless there are at least three)."""
    x = np.sort(np.asarray(loads, dtype=float))[::-1]
    if len(x) < 3:
        return None
    t1 = top_group_size(x, rtol)
    if t1 >= len(x):
        return None
    t2 = top_group_size(x[t1:], rtol)
    if t1 + t2 >= len(x):
        return None
    return TwoClasses(float(x[0]), t1, float(x[t1]), t2, np.sort(x[t1 + t2:]))


def pair_test_loads(c: TwoClasses, m: int, h1: int, h2: int, load: float) -> np.ndarray | None:
    """Loads of ``T(m, load, h1, h2)`` (module docstring), descending; None when no GPU of the
    instance with that shape carries ``load``."""
    ok, least, most = c.bounds
    if not (0 <= m <= c.n and 0 <= h1 <= c.t1 and 0 <= h2 <= c.t2) or not ok[m, h1, h2]:
        return None
    lo, hi = float(least[m, h1, h2]), float(most[m, h1, h2])
    if load < lo * (1 - 1e-12) or load > hi * (1 + 1e-12):
        return None
    rest = c.rest[:m - h1 - h2].astype(float)
    raise_floors(rest, c.w, max(float(load) - lo, 0.0))
    return np.sort(np.concatenate([[c.l1] * h1, [c.l2] * h2, rest]))[::-1]


class _Table:
    """The failure and non-failure loads per shape, kept as arrays (module docstring)."""

    def __init__(self, c: TwoClasses):
        self.c = c
        ok, self.least, self.most = c.bounds
        self.ok = ok
        self.fail = np.full(ok.shape, np.inf, np.float32)
        self.floor = np.full(ok.shape, _NEG, np.float32)

    def failed(self, m: int, h1: int, h2: int, e: float) -> None:
        cover = np.maximum(e, self.least[m:, h1, h2])[:, None, None]
        view = self.fail[m:, :h1 + 1, :h2 + 1]
        np.minimum(view, cover, out=view)

    def passed(self, m: int, h1: int, h2: int, e: float) -> None:
        view = self.floor[:m + 1, h1:, h2:]
        np.maximum(view, e, out=view)

    def upper(self, cap: float) -> np.ndarray:
        most = np.minimum(self.most, np.float32(cap))
        u = np.minimum(most, self.fail)
        return np.where(self.ok & (most >= self.least) & (self.fail > self.least), u,
                        np.float32(_NEG))


def pair_supply_excluded(loads: Sequence[float], total_tps: float, gpu_cap_tps: float,
                         check: Callable[[np.ndarray], bool], max_checks: int,
                         max_adapters: int | None = None,
                         progress: Callable[[str], None] | None = None) -> bool:
    """True when no placement of adapters with ``loads`` on two GPUs has both accepted, shown by
    the supply of the two heaviest classes (module docstring); False when not shown within
    ``max_checks`` calls of ``check(pair_test_loads) -> excluded``. ``gpu_cap_tps``: a load no
    accepted GPU carries more of; ``max_adapters``: larger test GPUs are not checked."""
    c = two_classes(loads)
    if c is None:
        return False
    L = float(total_tps)
    tol = PAIR_SUPPLY_TOL * L
    table = _Table(c)
    used = 0

    def lower(s: tuple[int, int, int]) -> float:
        return float(table.floor[s])             # shown passing there (or above): -inf if not

    def upper(s: tuple[int, int, int]) -> float:
        return float(table.fail[s])              # shown failing from there: inf if not

    def run(s: tuple[int, int, int], e: float) -> bool | None:
        nonlocal used
        vec = pair_test_loads(c, *s, e)
        if vec is None or used >= max_checks or (max_adapters is not None
                                                  and s[0] > max_adapters):
            return None
        used += 1
        out = bool(check(vec))
        (table.failed if out else table.passed)(*s, e)
        if progress is not None:
            progress(f"pair check {used}: {s[0]} adapters ({s[1]} + {s[2]} of the two "
                     f"heaviest classes) at {e:,.0f} tok/s: "
                     f"{'fails' if out else 'not shown failing'}")
        return out

    def _raise(x: tuple[int, int, int], e: float) -> tuple[int, int, int]:
        """After a failure at (x, e): the same adapters holding more of both classes at the
        same load, as much as can still carry it (a failure there covers every smaller class
        count); the shape shown failing last."""
        m, a, b = x
        for frac in (1.0, 0.5, 0.25, 0.125):     # toward holding both classes whole
            y = (m, a + int(frac * (c.t1 - a)), b + int(frac * (c.t2 - b)))
            if y != x and table.ok[y] and float(table.least[y]) <= e:
                return y if e < upper(y) and run(y, e) else x
        return x

    def _gallop(x: tuple[int, int, int], e: float) -> None:
        """After a failure at (x, e): more of both classes (:func:`_raise`); the GPU holding
        both whole at the least load it then carries (covers every class count where a GPU
        must carry that much); then fewer adapters at the load they can still offer, each
        failure raised again (fewer adapters leave room for more of the classes), while they
        fail, at most ``GALLOP_STEPS`` times."""
        x = _raise(x, e)
        m = x[0]
        corner = (m, min(c.t1, m), min(c.t2, m - min(c.t1, m)))
        if corner != x and table.ok[corner]:
            e_c = max(e, float(table.least[corner]))
            if e_c <= float(table.most[corner]) and e_c < upper(corner):
                run(corner, e_c)
        for _ in range(GALLOP_STEPS):
            m, a, b = x
            m2 = max(a + b, int(m * GALLOP_RATIO))
            y = (m2, a, b)
            if m2 >= m or not table.ok[y]:
                return
            e2 = min(e, float(table.most[y]))
            if e2 < float(table.least[y]) or e2 >= upper(y) or e2 <= lower(y) \
                    or not run(y, e2):
                return
            x, e = _raise(y, e2), e2

    def comp(s):
        return (c.n - s[0], c.t1 - s[1], c.t2 - s[2])

    half = (-(-c.n // 2), -(-c.t1 // 2), -(-c.t2 // 2))
    if all(run(s, L / 2) is False for s in dict.fromkeys((half, comp(half)))):
        return False                             # the balanced split is not shown failing

    while True:
        U = table.upper(gpu_cap_tps)
        pair = U + U[::-1, ::-1, ::-1]
        i = int(np.argmax(pair))
        best = float(pair.flat[i])
        if best < L * (1.0 - SOUND_RTOL):
            return True
        s = tuple(int(v) for v in np.unravel_index(i, pair.shape))
        sides = [s, comp(s)]
        ub = np.array([float(U[x]) for x in sides])
        fl = np.array([max(float(table.least[x]) - tol, min(lower(x), float(U[x])))
                       for x in sides])
        if all(lower(x) > _NEG for x in sides) and fl.sum() >= L - tol:
            return False                         # both not shown failing at loads reaching L
        room = np.where(ub - fl >= tol * (1 - 1e-9), ub - fl, 0.0)
        if room.sum() <= 0:
            return False
        # first the side with more room at what it must carry when the other carries its most
        # (a failure there rules the pair out), then the loads in proportion to the room
        a = int(np.argmax(room))
        targets = [(sides[a], max(L - ub[1 - a] - tol, fl[a] + tol))]
        need = best - L + tol
        targets += [(x, max(u - need * r / room.sum(), f + tol))
                    for x, u, r, f in zip(sides, ub, room, fl) if r > 0]
        progressed = False
        for x, target in targets:
            if target >= upper(x) or target <= lower(x):
                continue
            out = run(x, target)
            if out is None:
                continue
            progressed = True
            if out:
                _gallop(x, target)
                break
        if not progressed:
            return False


__all__ = ["PAIR_SUPPLY_VERSION", "PAIR_SUPPLY_BUDGET", "TwoClasses", "two_classes",
           "pair_test_loads", "pair_supply_excluded"]
