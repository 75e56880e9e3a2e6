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


@dataclass(frozen=True)
class RoutingPlan:
    """GPUs and, per adapter (index into the adapter list), its homes and routing weights."""

    gpus: tuple[RoutedGpu, ...]
    homes: tuple[tuple[int, ...], ...]
    weights: tuple[tuple[float, ...], ...]

    def check(self, adapters: Sequence[Adapter]) -> None:
        """Every adapter has homes on existing GPUs (no duplicates), positive weights summing
        to 1, and a rank each home's ``max_lora_rank`` can hold."""
        if len(self.homes) != len(adapters) or len(self.weights) != len(adapters):
            raise ValueError(f"routing plan: {len(self.homes)} home lists and {len(self.weights)} "
                             f"weight lists for {len(adapters)} adapters")
        for i, (a, hs, ws) in enumerate(zip(adapters, self.homes, self.weights)):
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
                    router: Router, duration_s: float, progress: bool = False
                    ) -> RoutedFleetResult:
    """Route and simulate ``requests`` (adapter index into ``adapters``) over
    ``[0, duration_s)``; requests arriving at or after ``duration_s`` are not sent."""
    plan.check(adapters)
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
    pre = [(0, 0, 0)] * n_gpu          # (running, waiting, kv used blocks) at the step's start
    sent_at_pre = [0] * n_gpu
    # per GPU, per adapter: outstanding requests (for the affinity features)
    aout: list[dict[int, int]] = [dict() for _ in range(n_gpu)]
    active = [0] * n_gpu               # adapters with a request outstanding, per GPU
    labels: list[tuple[float, int, float]] = []   # heap of (t_first_token, request index, ttft)
    learns = bool(getattr(router, "learns", False))     # wants TTFT labels

    n = len(requests)
    gpu_of = np.full(n, -1, np.int64)
    handles: list = [None] * n
    arrival = requests.arrival_s
    a_idx = requests.adapter
    ranks = [a.rank for a in adapters]
    kv_total = [c.settings.kv_blocks for c in cores]

    def advance(g: int, t: float) -> None:
        core = cores[g]
        while core.clock < t:
            sched = core.sched
            pre[g] = (len(sched.running), len(sched.waiting) + len(core.pending),
                      core.kv.used_blocks)
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
            running, waiting, used = pre[g]
            waiting += routed[g] - sent_at_pre[g]
        else:
            running = len(core.sched.running)
            waiting = len(core.sched.waiting) + len(core.pending)
            used = core.kv.used_blocks
        lru = core.slots.lru
        gp = plan.gpus[g]
        return GpuSnapshot(g, routed[g] - finished_seen[g], running, waiting, used / kv_total[g],
                           adapter in lru, aout[g].get(adapter, 0), active[g], len(lru),
                           gp.max_loras,
                           gp.max_lora_rank, speed[g])

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
        homes = plan.homes[a]
        for g in homes:     # other GPUs catch up when they next matter (labels wait in time order)
            advance(g, t)
        for g in homes:
            settle(g, t)
        if learns:
            while labels and labels[0][0] <= t:
                t_lab, idx, ttft = heapq.heappop(labels)
                router.observe(idx, ttft, t_lab)
        req = RouteRequest(i, a, ranks[a], int(requests.input_len[i]), t, homes,
                           plan.weights[a])
        snaps = [snapshot(g, t, a) for g in homes]
        g = router.route(req, snaps)
        assert g in homes, f"router {router.name} sent adapter {a} to GPU {g}, not a home {homes}"
        handles[i] = cores[g].submit(a, int(requests.input_len[i]), int(requests.output_len[i]),
                                     t, tag=i)
        gpu_of[i] = g
        routed[g] += 1
        k = aout[g].get(a, 0)
        aout[g][a] = k + 1
        active[g] += k == 0
        if bar is not None and i % 500 == 0:
            bar.update(500)
    for g in range(n_gpu):
        advance(g, duration_s)
    if bar is not None:
        bar.close()
    first = np.array([h.first_t if h is not None else -1.0 for h in handles])
    finish = np.array([h.finish_t if h is not None else -1.0 for h in handles])
    return RoutedFleetResult(float(duration_s), requests, gpu_of, first, finish,
                             tuple(c.loads for c in cores), tuple(c.steps for c in cores),
                             router.name)
