"""Routing policies behind one interface: ``Router.route(request, snapshots) -> gpu``.

``snapshots`` holds one :class:`~twin.routing.snapshot.GpuSnapshot` per home of the request's
adapter (the plan's GPUs holding it), in the order of ``request.homes``; a router returns one of
those GPUs (the fleet simulation asserts it). Every policy draws its random choices from its own
seeded generator.

* ``static`` — the plan's routing weights (each request independently, as the batch fleet twin
  assumes);
* ``uniform`` — uniformly among the homes;
* ``least_outstanding`` — the home with the fewest requests sent and not finished (ties at
  random);
* ``affinity`` — adapter affinity + load: score = outstanding + ``miss_penalty`` if the adapter is
  not in a GPU slot and no request of it is outstanding there (a load is likely), lowest wins.
"""

from __future__ import annotations

from typing import Protocol, Sequence

import numpy as np

from .snapshot import GpuSnapshot, RouteRequest



class Router(Protocol):
    """A routing policy. ``observe`` receives the TTFT of a routed request once it is known
    (at virtual time ``now``); policies that do not learn ignore it."""

    name: str

    def route(self, request: RouteRequest, snapshots: Sequence[GpuSnapshot]) -> int: ...

    def observe(self, request_index: int, ttft_s: float, now: float) -> None: ...


class _Seeded:
    name = "base"

    def __init__(self, seed: int) -> None:
        if (isinstance(seed, bool) or not isinstance(seed, (int, np.integer))
                or not 0 <= seed < 2**32):
            raise ValueError(f"router seed: must be an integer in [0, 2^32), got {seed!r}")
        self.rng = np.random.default_rng(int(seed))

    def observe(self, request_index: int, ttft_s: float, now: float) -> None:
        return None

    def _argmin(self, scores: Sequence[float], snapshots: Sequence[GpuSnapshot]) -> int:
        s = np.asarray(scores, dtype=np.float64)
        best = np.flatnonzero(s <= s.min() + 1e-12)
        k = int(best[0]) if len(best) == 1 else int(self.rng.choice(best))
        return snapshots[k].gpu


class StaticWeightsRouter(_Seeded):
    """The plan's weights: home ``k`` with probability ``request.weights[k]``."""

    name = "static"

    def route(self, request: RouteRequest, snapshots: Sequence[GpuSnapshot]) -> int:
        if len(snapshots) == 1:
            return snapshots[0].gpu
        u = self.rng.random()
        k = int(np.searchsorted(np.cumsum(request.weights), u * sum(request.weights), "right"))
        return snapshots[min(k, len(snapshots) - 1)].gpu


class UniformRouter(_Seeded):
    """Uniformly at random among the homes."""

    name = "uniform"

    def route(self, request: RouteRequest, snapshots: Sequence[GpuSnapshot]) -> int:
        if len(snapshots) == 1:
            return snapshots[0].gpu
        return snapshots[int(self.rng.integers(len(snapshots)))].gpu


class LeastOutstandingRouter(_Seeded):
    """The home with the fewest outstanding requests."""

    name = "least_outstanding"

    def route(self, request: RouteRequest, snapshots: Sequence[GpuSnapshot]) -> int:
        return self._argmin([s.outstanding for s in snapshots], snapshots)


class AffinityLoadRouter(_Seeded):
    """Adapter affinity + load (see the module docstring); ``miss_penalty`` is in outstanding
    requests: a warm home is preferred until it has that many more requests in flight."""

    name = "affinity"

    def __init__(self, seed: int, miss_penalty: float = 8.0) -> None:
        super().__init__(seed)
        if not (np.isfinite(miss_penalty) and miss_penalty >= 0):
            raise ValueError(f"miss_penalty: must be a finite number >= 0, got {miss_penalty!r}")
        self.miss_penalty = float(miss_penalty)

    def score(self, s: GpuSnapshot) -> float:
        warm = s.resident or s.adapter_outstanding > 0
        return s.outstanding + (0.0 if warm else self.miss_penalty)

    def route(self, request: RouteRequest, snapshots: Sequence[GpuSnapshot]) -> int:
        return self._argmin([self.score(s) for s in snapshots], snapshots)
