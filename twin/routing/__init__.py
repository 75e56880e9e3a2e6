"""Request routing in a fleet of twin servers.

* :mod:`.snapshot` — what a router sees of each GPU when a request arrives;
* :mod:`.policies` — the ``Router`` interface and the heuristic policies (static weights,
  uniform among homes, least outstanding requests, adapter affinity + load);
* :mod:`.learned` — an online reward model of TTFT from snapshot features;
* :mod:`.fleet_sim` — the routed fleet: every server an online twin engine
  (:class:`twin.serve.engine.EngineCore`), all advanced in one virtual-time event loop; a
  :class:`~.fleet_sim.PlanSwitch` replays a re-plan's transition (loads, drains, restarts),
  abrupt or make-before-break with staggered restarts.
"""

from .fleet_sim import (PlanSwitch, RoutedFleetResult, RoutedGpu, RoutingPlan, SwitchLog,
                        simulate_routed)
from .learned import LearnedRouter
from .factory import ROUTER_NAMES, make_router
from .policies import (AffinityLoadRouter, LeastOutstandingRouter, Router, StaticWeightsRouter,
                       UniformRouter)
from .snapshot import GpuSnapshot, RouteRequest

__all__ = ["PlanSwitch", "RoutedFleetResult", "RoutedGpu", "RoutingPlan", "SwitchLog",
           "simulate_routed", "LearnedRouter",
           "AffinityLoadRouter", "LeastOutstandingRouter", "Router", "StaticWeightsRouter",
           "UniformRouter", "make_router", "ROUTER_NAMES", "GpuSnapshot", "RouteRequest"]
