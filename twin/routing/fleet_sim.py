"""The routed fleet: every GPU an online twin engine, all advanced in one virtual-time loop.

Routing each request by live state couples the servers, so the batch fleet twin (one
independent simulation per GPU, ``twin.fleet``) does not apply. Here every GPU is a
:class:`twin.serve.engine.EngineCore` (the batch twin's scheduler, KV cache and LRU slots, one
step at a time). Requests are taken in arrival order; before routing a request that arrives at
``t``, every server runs the steps that start before ``t`` (a step's results exist only at its
end, so the router sees the state as of the server's last step boundary plus what the gateway
itself sent). The router picks one of the adapter's homes from their snapshots; the request is
submitted there and joins the first step starting at or after ``t``, exactly as in the batch
twin. A request for an adapter not in the chosen GPU's slots pays the profile's load time (the
engine's LRU slots). With a single GPU this is the engine's ``replay`` of the same requests
(tested).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..profile import GpuProfile
from ..serve.engine import EngineCore, EngineSettings
from ..workload import Adapter, Requests
from .policies import Router
from .snapshot import GpuSnapshot, RouteRequest, reference_step_ms

# a GPU-minute is starved when a request there has waited longer than this for its first token
STARVED_WAIT_S = 30.0


@dataclass(frozen=True)
class RoutedGpu:
    """One server of the fleet: its profile and ``--max-loras`` / ``--max-lora-rank``."""

    profile: GpuProfile
    max_loras: int
    max_lora_rank: int

    def check(self, where: str = "routed GPU") -> None:
        """``max_loras`` and ``max_lora_rank`` are integers >= 1 (vLLM refuses 0: a server that
        can hold no adapter serves none) and the rank is one the profile supports."""
        for name, v in (("max_loras", self.max_loras), ("max_lora_rank", self.max_lora_rank)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ValueError(f"{where}: {name} must be an integer >= 1, got {v!r}")
        ranks = tuple(getattr(self.profile, "supported_ranks", ()) or ())
        if ranks and self.max_lora_rank > max(ranks):
            raise ValueError(f"{where}: max_lora_rank {self.max_lora_rank} is above the "
                             f"profile's largest rank {max(ranks)}")


@dataclass(frozen=True)
class RoutingPlan:
    """GPUs and, per adapter (index into the adapter list), its homes and routing weights."""

    gpus: tuple[RoutedGpu, ...]
    homes: tuple[tuple[int, ...], ...]
    weights: tuple[tuple[float, ...], ...]

    def check(self, adapters: Sequence[Adapter], allow_homeless: bool = False) -> None:
        """Every adapter has homes on existing GPUs (no duplicates), positive weights summing
        to 1, and a rank each home's ``max_lora_rank`` can hold. ``allow_homeless``: adapters
        without homes are allowed (the plan before a :class:`PlanSwitch`, for adapters that
        arrive with the new plan)."""
        for g, gpu in enumerate(self.gpus):
            gpu.check(f"routing plan: GPU {g}")
        if len(self.homes) != len(adapters) or len(self.weights) != len(adapters):
            raise ValueError(f"routing plan: {len(self.homes)} home lists and {len(self.weights)} "
                             f"weight lists for {len(adapters)} adapters")
        for i, (a, hs, ws) in enumerate(zip(adapters, self.homes, self.weights)):
            if not hs and allow_homeless and not ws:
                continue
            if not hs:
                raise ValueError(f"routing plan: adapter '{a.id}' has no home")
            if len(set(hs)) != len(hs) or len(ws) != len(hs):
                raise ValueError(f"routing plan: adapter '{a.id}': homes {hs} must be distinct, "
                                 f"one weight each (weights {ws})")
            for g in hs:
                if not 0 <= g < len(self.gpus):
                    raise ValueError(f"routing plan: adapter '{a.id}': home {g} is not a GPU "
                                     f"(0..{len(self.gpus) - 1})")
                if a.rank > self.gpus[g].max_lora_rank:
                    raise ValueError(f"routing plan: adapter '{a.id}' (rank {a.rank}) on GPU {g} "
                                     f"with --max-lora-rank {self.gpus[g].max_lora_rank}")
            if any(not (w > 0) for w in ws) or abs(sum(ws) - 1.0) > 1e-6:
                raise ValueError(f"routing plan: adapter '{a.id}': weights must be > 0 and sum "
                                 f"to 1, got {ws}")

    @classmethod
    def from_assignments(cls, assignments: Sequence, adapters: Sequence[Adapter],
                         profiles: dict[str, GpuProfile] | None = None) -> "RoutingPlan":
        """From ``twin.fleet.GpuAssignment`` s (profile name, config, (adapter, share) pairs)."""
        from ..profile import load_profile

        profiles = dict(profiles or {})
        pos = {a.id: i for i, a in enumerate(adapters)}
        homes: list[list[int]] = [[] for _ in adapters]
        weights: list[list[float]] = [[] for _ in adapters]
        gpus = []
        for g, ga in enumerate(assignments):
            prof = profiles.get(ga.profile) or load_profile(ga.profile)
            profiles[ga.profile] = prof
            rank = ga.config.max_lora_rank or max(a.rank for a, _ in ga.adapters)
            gpus.append(RoutedGpu(prof, ga.config.max_loras, rank))
            for a, share in ga.adapters:
                homes[pos[a.id]].append(g)
                weights[pos[a.id]].append(float(share))
        return cls(tuple(gpus), tuple(map(tuple, homes)), tuple(map(tuple, weights)))


@dataclass(frozen=True)
class PlanSwitch:
    """A re-plan taking effect at ``at_s`` (indices into the same GPU list as the plan before;
    a restarted server is a second entry, ``starts_after[g]`` = the GPU whose old instance
    must drain before GPU ``g`` starts, else -1). ``restart_s``: start-up time of a restarted
    server after its old instance drained.

    Abrupt (``gentle=False``): requests arriving from ``at_s`` on are routed by ``homes`` /
    ``weights``; adapters are registered on their new homes (not resident: their first batch
    pays the load time); old homes get no more requests of an adapter that left them and drain
    what they hold; every restarted server's old instance stops taking requests at ``at_s``
    and its new one starts cold once it has drained (requests routed to it wait).

    Gentle (``gentle=True``, make-before-break with staggered restarts): a new home is *ready*
    for an adapter once its server is up and the adapter's load time has passed there (at once
    for a home that already held it). The share of an adapter's traffic that goes to homes not
    yet ready stays on its old homes that are still serving (old weights); with no such old
    home it goes to the ready new homes (or to new homes that are up and still loading it),
    and with neither to a *bridge* (below). Once all its new homes are ready the adapter
    follows the new weights and its old homes drain. Restarts run one at a time in
    ``restart_order`` (default: ascending GPU index): the first begins at ``at_s``, each next
    one when the previous new server is up (``stagger=False``: all at ``at_s``, the routing
    still gentle). A restart stops routing to the old instance, which
    drains; until then the old instance serves with its old configuration. A bridge is the GPU
    with the fewest outstanding requests (the gateway's live view) among the serving ones that
    can hold the rank and have a free adapter slot, and the adapter's new homes whose restart
    is under way (counting what their old instance still holds: there the request waits for
    the new server, which does not run before it is up)."""

    at_s: float
    homes: tuple[tuple[int, ...], ...]
    weights: tuple[tuple[float, ...], ...]
    starts_after: tuple[int, ...]
    gentle: bool = False
    restart_order: tuple[int, ...] = ()
    restart_s: float = 0.0
    stagger: bool = True

    def check(self, plan: RoutingPlan, adapters: Sequence[Adapter]) -> None:
        """The new routing is a valid plan on the same GPUs (adapters retired at the switch have
        no homes); every restart names another GPU that is nobody's home after the switch;
        ``restart_order`` lists the restarted GPUs once each; ``restart_s`` >= 0."""
        if not (math.isfinite(self.at_s) and self.at_s >= 0):
            raise ValueError(f"plan switch at_s: must be a finite number >= 0, got {self.at_s!r}")
        if not (math.isfinite(self.restart_s) and self.restart_s >= 0):
            raise ValueError(f"plan switch restart_s: must be a finite number >= 0, got "
                             f"{self.restart_s!r}")
        RoutingPlan(plan.gpus, self.homes, self.weights).check(adapters, allow_homeless=True)
        if len(self.starts_after) != len(plan.gpus):
            raise ValueError(f"plan switch starts_after: {len(self.starts_after)} entries for "
                             f"{len(plan.gpus)} GPUs")
        homes_after = {g for hs in self.homes for g in hs}
        for g, p in enumerate(self.starts_after):
            if p == -1:
                continue
            if not 0 <= p < len(plan.gpus) or p == g or p in homes_after:
                raise ValueError(f"plan switch starts_after[{g}] = {p}: must be -1 or another "
                                 "GPU that is no home after the switch")
        restarted = sorted(g for g, p in enumerate(self.starts_after) if p >= 0)
        if self.restart_order and sorted(self.restart_order) != restarted:
            raise ValueError(f"plan switch restart_order: {self.restart_order} must list the "
                             f"restarted GPUs {restarted} once each")

    def order(self) -> list[int]:
        """The restarted GPUs in the order their restarts run."""
        return list(self.restart_order) or [g for g, p in enumerate(self.starts_after) if p >= 0]


@dataclass(frozen=True)
class SwitchLog:
    """What a :class:`PlanSwitch` did (absolute virtual seconds; nan = did not happen in the
    window): per GPU, when its restart began (its old instance stopped taking requests) and
    when the new server was up; per adapter, from when all its traffic followed the new
    routing (nan: no homes after the switch); requests sent to a bridge GPU, and requests sent
    to a server not yet up (they waited for it)."""

    restart_begin_s: tuple[float, ...]
    restart_up_s: tuple[float, ...]
    switched_s: tuple[float, ...]
    bridged: int
    waited: int


@dataclass(frozen=True)
class RoutedFleetResult:
    """Per-request outcome (``gpu``, ``first_t``, ``finish_t``; -1 = not reached in the window)
    and per-GPU counters of one routed simulation."""

    duration_s: float
    requests: Requests
    gpu: np.ndarray
    first_t: np.ndarray
    finish_t: np.ndarray
    adapter_loads: tuple[int, ...]
    steps: tuple[int, ...]
    router_name: str
    switch_log: SwitchLog | None = None

    def _done(self) -> np.ndarray:
        return (self.finish_t >= 0) & (self.finish_t <= self.duration_s)

    def ttft_s(self) -> np.ndarray:
        """TTFT of the completed requests (as ``benchmark_serving.py``: completed only)."""
        d = self._done()
        return self.first_t[d] - self.requests.arrival_s[d]

    def ttft_quantile(self, q: float) -> float:
        t = self.ttft_s()
        return float(np.quantile(t, q)) if len(t) else math.nan

    @property
    def mean_ttft_s(self) -> float:
        t = self.ttft_s()
        return float(t.mean()) if len(t) else math.nan

    def slo(self, slo, adapter_ids: Sequence[str] | None = None):
        """The fleet's requests judged against a latency SLO (``twin.slo.evaluate_slo``: TTFT
        and E2E bounds, unserved requests missing; attainment = share of judged requests within
        every bound, ``goodput_rps``); an SLO with adapter classes needs ``adapter_ids`` (the
        simulated adapters' ids, by index). The routed simulation keeps no inter-token gaps, so
        an ITL bound is refused rather than passed unjudged."""
        from twin.slo import evaluate_slo
        if slo.bounds_itl():
            raise ValueError("slo.itl_p99_ms: the routed fleet simulation does not record "
                             "inter-token gaps; judge routing on TTFT / E2E bounds")
        return evaluate_slo(slo, self.requests.arrival_s, self.first_t, self.finish_t,
                            np.zeros(1, np.int64), self.duration_s,
                            adapter=self.requests.adapter if slo.classes else None,
                            adapter_ids=adapter_ids)

    @property
    def total_loads(self) -> int:
        return int(sum(self.adapter_loads))

    def throughput_tps(self, gpu: int | None = None) -> float:
        """Input + output tokens of the requests completed in the window / window."""
        m = self._done() if gpu is None else self._done() & (self.gpu == gpu)
        r = self.requests
        return float((r.input_len[m].sum(dtype=np.int64) + r.output_len[m].sum(dtype=np.int64))
                     / self.duration_s)

    def offered_tps(self, gpu: int | None = None) -> float:
        """Tokens of the requests that arrived in the window (routed to ``gpu``) / window."""
        r = self.requests
        m = (r.arrival_s < self.duration_s) & (self.gpu >= 0)
        if gpu is not None:
            m &= self.gpu == gpu
        return float((r.input_len[m].sum(dtype=np.int64) + r.output_len[m].sum(dtype=np.int64))
                     / self.duration_s)

    def starved_gpus(self, threshold: float = 0.9) -> list[int]:
        """GPUs whose throughput is below ``threshold`` x their realised offered load."""
        return [g for g in range(len(self.steps))
                if self.throughput_tps(g) < threshold * self.offered_tps(g)]

    def starved_gpu_minutes(self, wait_s: float = STARVED_WAIT_S, bin_s: float = 60.0) -> int:
        """GPU-minutes (window cut in ``bin_s`` bins) at whose end some request routed to the
        GPU has waited more than ``wait_s`` without its first token."""
        r = self.requests
        first = np.where(self.first_t >= 0, self.first_t, np.inf)
        n = 0
        for g in range(len(self.steps)):
            m = self.gpu == g
            arr, fst = r.arrival_s[m], first[m]
            for end in np.arange(bin_s, self.duration_s + 1e-9, bin_s):
                waiting = (arr <= end - wait_s) & (fst > end)
                n += bool(waiting.any())
        return n


def simulate_routed(plan: RoutingPlan, adapters: Sequence[Adapter], requests: Requests,
                    router: Router, duration_s: float, progress: bool = False,
                    switch: PlanSwitch | None = None) -> RoutedFleetResult:
    """Route and simulate ``requests`` (adapter index into ``adapters``) over
    ``[0, duration_s)``; requests arriving at or after ``duration_s`` are not sent. With
    ``switch``, the routing changes to the switch's plan at its time (a re-plan's transition:
    loads on the new homes, drains of the old ones, restarts)."""
    plan.check(adapters, allow_homeless=switch is not None)
    if switch is not None:
        switch.check(plan, adapters)
        early = requests.arrival_s < switch.at_s
        if any(not plan.homes[a] for a in np.unique(requests.adapter[early])):
            raise ValueError("requests: an adapter without a home before the plan switch has "
                             "requests before it")
        if any(not switch.homes[a] for a in np.unique(requests.adapter[~early])):
            raise ValueError("requests: an adapter with no home after the plan switch has "
                             "requests after it")
    if not (math.isfinite(duration_s) and duration_s > 0):
        raise ValueError(f"duration_s: must be a finite number > 0, got {duration_s!r}")
    if len(requests) and int(requests.adapter.max()) >= len(adapters):
        raise ValueError("requests: adapter index out of range of the adapter list")
    cores: list[EngineCore] = []
    speed: list[float] = []
    for g, gpu in enumerate(plan.gpus):
        st = EngineSettings.from_profile(gpu.profile, gpu.max_loras, gpu.max_lora_rank)
        core = EngineCore(st)
        cores.append(core)
        speed.append(reference_step_ms(gpu.profile, gpu.max_loras, gpu.max_lora_rank))
    for i, hs in enumerate(plan.homes):
        for g in hs:
            p = plan.gpus[g]
            cores[g].register_adapter(i, p.profile.load_time_ms(adapters[i].rank, p.max_lora_rank))

    n_gpu = len(cores)
    routed = [0] * n_gpu
    finished_seen = [0] * n_gpu
    done_events: list[deque] = [deque() for _ in range(n_gpu)]   # (t_end, n finished) per step
    # per GPU, the server state at the start of its last step (what its stats showed while the
    # step ran): running and queued requests (shallow copies), KV blocks used
    pre: list[tuple] = [((), (), 0)] * n_gpu
    sent_at_pre = [0] * n_gpu
    # per GPU, per adapter: outstanding requests (for the affinity features)
    aout: list[dict[int, int]] = [dict() for _ in range(n_gpu)]
    active = [0] * n_gpu               # adapters with a request outstanding, per GPU
    labels: list[tuple[float, int, float]] = []   # heap of (t_first_token, request index, ttft)
    learns = bool(getattr(router, "learns", False))     # wants TTFT labels

    cur_homes, cur_weights = plan.homes, plan.weights
    switched = switch is None
    gentle = switch is not None and switch.gentle
    nan = math.nan
    begin_s, up_s = [nan] * n_gpu, [nan] * n_gpu
    down_from = [math.inf] * n_gpu      # an old instance takes no requests from then on
    up_at = [0.0] * n_gpu               # a restarted server's new instance serves from then on
    restart_queue: deque[int] = deque()
    next_begin = math.inf
    if switch is not None:
        for g, prev in enumerate(switch.starts_after):
            if prev >= 0:
                up_at[g] = math.inf
        restart_queue.extend(switch.order())
        next_begin = switch.at_s
    held = [set(hs) for hs in plan.homes]
    bridged = waited = 0

    def begin_restart(g: int, t0: float) -> float:
        """GPU ``g``'s old instance stops taking requests at ``t0`` and drains; the new one
        is up ``restart_s`` after that. Returns when it is up."""
        prev = switch.starts_after[g]
        down_from[prev] = begin_s[g] = t0
        advance(prev, math.inf)             # it gets no new requests: drain it
        up = max(cores[prev].clock, t0) + switch.restart_s
        cores[g].clock = max(cores[g].clock, up)
        up_at[g] = up_s[g] = cores[g].clock
        return up_at[g]

    def run_restarts(t: float, strict: bool = False) -> None:
        """Begin the staggered restarts due by ``t`` (each when the previous one is up)."""
        nonlocal next_begin
        while restart_queue and (next_begin < t or (not strict and next_begin == t)):
            next_begin = begin_restart(restart_queue.popleft(), next_begin)

    def do_switch() -> None:
        nonlocal cur_homes, cur_weights, switched
        for i, hs in enumerate(switch.homes):
            for g in hs:
                if i not in cores[g].load_ms:
                    p = plan.gpus[g]
                    cores[g].register_adapter(i, p.profile.load_time_ms(adapters[i].rank,
                                                                        p.max_lora_rank))
        if not (gentle and switch.stagger):     # every restart at once
            for g in list(restart_queue):
                begin_restart(g, switch.at_s)
            restart_queue.clear()
        cur_homes, cur_weights, switched = switch.homes, switch.weights, True

    def ready_s(a: int, h: int) -> float:
        """When new home ``h`` is ready for adapter ``a`` (gentle switch)."""
        if h in held[a]:
            return switch.at_s
        return max(switch.at_s, up_at[h]) + load_ms[h][a] / 1000.0

    def serving(g: int, t: float) -> bool:
        return up_at[g] <= t < down_from[g]

    def gentle_route(a: int, t: float) -> tuple[tuple[int, ...], tuple[float, ...]] | None:
        """Homes and weights of adapter ``a`` at ``t`` under make-before-break (None: bridge)."""
        hs, ws = switch.homes[a], switch.weights[a]
        ready = {h: w for h, w in zip(hs, ws) if ready_s(a, h) <= t}
        if len(ready) == len(hs):
            return hs, ws
        old = [(g, w) for g, w in zip(plan.homes[a], plan.weights[a]) if serving(g, t)]
        if old:
            miss = 1.0 - sum(ready.values())
            tot = sum(w for _, w in old)
            for g, w in old:
                ready[g] = ready.get(g, 0.0) + miss * w / tot
        else:
            if not ready:       # up but still loading the adapter: its request pays the load
                ready = {h: w for h, w in zip(hs, ws) if serving(h, t)}
            if not ready:
                return None
            tot = sum(ready.values())
            ready = {h: w / tot for h, w in ready.items()}
        return tuple(ready), tuple(ready.values())

    def bridge(a: int, t: float) -> int | None:
        """Where a request of ``a`` goes while none of its homes serves: the GPU with the
        fewest outstanding requests (the gateway's live view) among the serving ones that can
        hold its rank and have an adapter slot for it (``a`` has requests there, or fewer
        adapters have than ``max_loras``: no slot thrashing) and ``a``'s new homes whose
        restart is under way (there the request waits for the new server, behind what its old
        instance still holds); when none qualifies, the serving GPU of the fewest
        outstanding requests."""
        cands = [g for g in range(n_gpu)
                 if serving(g, t) and plan.gpus[g].max_lora_rank >= ranks[a]]
        coming = [h for h in switch.homes[a] if t < up_at[h] < math.inf]
        for g in cands + coming + [switch.starts_after[h] for h in coming]:
            advance(g, t)
            settle(g, t)

        def queue(g: int) -> int:
            q = routed[g] - finished_seen[g]
            if g in coming:
                o = switch.starts_after[g]
                q += routed[o] - finished_seen[o]
            return q
        roomy = [g for g in cands if aout[g].get(a, 0) > 0 or active[g] < plan.gpus[g].max_loras]
        if roomy + coming:
            b = min(roomy + coming, key=lambda g: (queue(g), g))
        elif cands:
            b = min(cands, key=lambda g: (queue(g), g))
        else:
            return None
        if a not in cores[b].load_ms:
            p = plan.gpus[b]
            cores[b].register_adapter(a, p.profile.load_time_ms(ranks[a], p.max_lora_rank))
        return b

    n = len(requests)
    gpu_of = np.full(n, -1, np.int64)
    handles: list = [None] * n
    arrival = requests.arrival_s
    a_idx = requests.adapter
    ranks = [a.rank for a in adapters]
    kv_total = [c.settings.kv_blocks for c in cores]
    load_ms = [c.load_ms for c in cores]

    def advance(g: int, t: float) -> None:
        if up_at[g] == math.inf:            # a restarted server whose restart has not begun
            return
        core = cores[g]
        while core.clock < t:
            sched = core.sched
            pre[g] = (list(sched.running), [*sched.waiting, *core.pending], core.kv.used_blocks)
            sent_at_pre[g] = routed[g]
            rec = core.step()
            if rec is None:
                nxt = core.next_arrival()
                if nxt is None:
                    return
                core.clock = max(core.clock, nxt)
                continue
            if rec.finished:
                done_events[g].append((rec.t_end, rec.finished))
            if learns:
                for req in rec.first_tokens:
                    heapq.heappush(labels, (rec.t_end, req.tag, rec.t_end - req.arrival))

    def settle(g: int, t: float) -> None:
        ev = done_events[g]
        while ev and ev[0][0] <= t:
            _, fin = ev.popleft()
            finished_seen[g] += len(fin)
            d = aout[g]
            for req in fin:
                d[req.adapter] -= 1
                if d[req.adapter] == 0:
                    active[g] -= 1

    def snapshot(g: int, t: float, adapter: int) -> GpuSnapshot:
        core = cores[g]
        if core.clock > t:            # a step is in progress: state as of its start
            running, queued, used = pre[g]
            extra = routed[g] - sent_at_pre[g]
        else:
            running = core.sched.running
            queued = [*core.sched.waiting, *core.pending]
            used, extra = core.kv.used_blocks, 0
        lru = core.slots.lru      # slots are filled at a step's start (its loads come first)
        run_ad = {r.adapter for r in running}
        wait_ad = {r.adapter for r in queued}
        gp = plan.gpus[g]
        return GpuSnapshot(g, routed[g] - finished_seen[g], len(running), len(queued) + extra,
                           used / kv_total[g], adapter in lru, aout[g].get(adapter, 0),
                           active[g], len(lru), gp.max_loras, gp.max_lora_rank, speed[g],
                           len(run_ad), len(wait_ad - run_ad), adapter in run_ad,
                           adapter in wait_ad, load_ms[g].get(adapter, 0.0))

    bar = None
    if progress:
        from ..cli_support import progress as _progress
        bar = _progress(None, total=n, desc=f"routed fleet ({router.name})", unit="req",
                        quiet=False)
    for i in range(n):
        t = float(arrival[i])
        if t >= duration_s:
            break
        a = int(a_idx[i])
        if not switched and t >= switch.at_s:
            do_switch()
        homes, weights = cur_homes[a], cur_weights[a]
        if gentle and switched:
            run_restarts(t)
            route = gentle_route(a, t)
            if route is not None:
                homes, weights = route
            else:
                b = bridge(a, t)
                if b is not None:
                    homes, weights = (b,), (1.0,)
                    bridged += b not in switch.homes[a]
        for g in homes:     # other GPUs catch up when they next matter (labels wait in time order)
            advance(g, t)
        for g in homes:
            settle(g, t)
        if learns:
            while labels and labels[0][0] <= t:
                t_lab, idx, ttft = heapq.heappop(labels)
                router.observe(idx, ttft, t_lab)
        req = RouteRequest(i, a, ranks[a], int(requests.input_len[i]), t, homes, weights)
        snaps = [snapshot(g, t, a) for g in homes]
        g = router.route(req, snaps)
        assert g in homes, f"router {router.name} sent adapter {a} to GPU {g}, not a home {homes}"
        handles[i] = cores[g].submit(a, int(requests.input_len[i]), int(requests.output_len[i]),
                                     t, tag=i)
        gpu_of[i] = g
        waited += t < up_at[g]
        routed[g] += 1
        k = aout[g].get(a, 0)
        aout[g][a] = k + 1
        active[g] += k == 0
        if bar is not None and i % 500 == 0:
            bar.update(500)
    if not switched and switch.at_s < duration_s:
        do_switch()
    if switched and switch is not None:
        run_restarts(duration_s, strict=True)
    for g in range(n_gpu):
        advance(g, duration_s)
    if bar is not None:
        bar.close()
    first = np.array([h.first_t if h is not None else -1.0 for h in handles])
    finish = np.array([h.finish_t if h is not None else -1.0 for h in handles])
    log = None
    if switch is not None:
        def switched_at(a: int) -> float:
            if not switch.homes[a]:
                return nan
            if not switched:
                return math.inf
            if not gentle:
                return switch.at_s
            return max(ready_s(a, h) for h in switch.homes[a])
        log = SwitchLog(tuple(begin_s), tuple(up_s),
                        tuple(switched_at(a) for a in range(len(adapters))), bridged, waited)
    return RoutedFleetResult(float(duration_s), requests, gpu_of, first, finish,
                             tuple(c.loads for c in cores), tuple(c.steps for c in cores),
                             router.name, log)
