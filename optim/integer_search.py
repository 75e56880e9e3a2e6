"""Maximise a costly function of an integer over 1..hi: a coarse log-spaced scan, then bracket
refinement around the best point (used for Amax, whose twin throughput rises while requests
wait for a slot and falls once every step pays for idle slots; see ``optim.amax_search``)."""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

COARSE_PROBES = 10


def coarse_probes(hi: int, k: int = COARSE_PROBES) -> list[int]:
    """Up to ``k`` distinct integers log-spaced over [1, hi], both ends included; every
    integer of 1..hi when hi <= k (empty when hi < 1)."""
    hi = int(hi)
    if hi < 1:
        return []
    if hi <= k:
        return list(range(1, hi + 1))
    return sorted({int(round(v)) for v in np.geomspace(1, hi, num=k)} | {1, hi})


def search_max(score: Callable[[list[int]], Sequence[float]], hi: int,
               k: int = COARSE_PROBES) -> tuple[int, float, dict[int, float]]:
    """Maximise ``score`` over the integers 1..hi. ``score`` evaluates a list of integers at
    once (callers run them in parallel).

    1. coarse scan: ``coarse_probes(hi, k)``;
    2. refinement: with ``c`` the best point so far and ``l < c < r`` its nearest evaluated
       neighbours, evaluate the midpoints of (l, c) and (c, r); repeat until the neighbours are
       ``c - 1`` and ``c + 1`` (or the ends).

    The result is an integer local maximum inside the coarse bracket of the best probe (the
    global maximum when the function is unimodal). Returns (argmax, max, every evaluated point);
    ties go to the smaller integer."""
    if hi < 1:
        raise ValueError(f"search_max: hi must be >= 1, got {hi}")
    seen: dict[int, float] = {}

    def run(xs: list[int]) -> None:
        xs = [x for x in dict.fromkeys(xs) if x not in seen]
        if xs:
            seen.update(zip(xs, (float(v) for v in score(xs))))

    run(coarse_probes(hi, k))
    while True:
        todo = refinement(seen)
        if not todo:
            c = best_point(seen)
            return c, seen[c], seen
        run(todo)


def best_point(seen: dict[int, float]) -> int:
    """The evaluated integer of highest value (ties: the smaller)."""
    return max(seen, key=lambda x: (seen[x], -x))


def refinement(seen: dict[int, float]) -> list[int]:
    """The next integers ``search_max`` evaluates given the values ``seen``: with ``c`` the best
    point and ``l < c < r`` its nearest evaluated neighbours, the midpoints of (l, c) and (c, r)
    (none once they are ``c - 1`` and ``c + 1`` or the ends)."""
    pts = sorted(seen)
    c = best_point(seen)
    i = pts.index(c)
    lo = pts[i - 1] if i > 0 else None
    hi_n = pts[i + 1] if i + 1 < len(pts) else None
    todo = [(lo + c) // 2] if lo is not None and c - lo > 1 else []
    todo += [(c + hi_n + 1) // 2] if hi_n is not None and hi_n - c > 1 else []
    return todo


__all__ = ["best_point", "refinement", "COARSE_PROBES", "coarse_probes", "search_max"]
