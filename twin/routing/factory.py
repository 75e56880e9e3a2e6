"""Routers by name: the one place that lists every routing policy (``make_router``), above the
policies and the learned router so that neither imports the other's module for it."""

from __future__ import annotations

from .learned import LearnedRouter
from .policies import (AffinityLoadRouter, LeastOutstandingRouter, Router, StaticWeightsRouter,
                       UniformRouter)

ROUTER_NAMES = ("static", "uniform", "least_outstanding", "affinity", "learned")


def make_router(name: str, seed: int, **options) -> Router:
    """A router by name (one of :data:`ROUTER_NAMES`)."""
    classes = {"static": StaticWeightsRouter, "uniform": UniformRouter,
               "least_outstanding": LeastOutstandingRouter, "affinity": AffinityLoadRouter,
               "learned": LearnedRouter}
    if name not in classes:
        raise ValueError(f"router: unknown policy {name!r} (expected one of {list(ROUTER_NAMES)})")
    return classes[name](seed, **options)
