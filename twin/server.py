"""Simulate one vLLM server: configuration, input checks, and the call into the kernel."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from . import kernel as K
from .adapter_cache import activation_ranks
from .headroom import judge
from .latency_tail import latency_tail_for
from .lengths import LengthModel
from .sharegpt import default_lengths
from .metrics import RunMetrics, compute_metrics, memory_error_metrics, realised_offered_tps
from .profile import GpuProfile
from .slo import Slo
from .step_time import min_ms_per_token
from .workload import (Adapter, ArrivalProcess, PoissonArrivals, Requests, generate_requests,
                       offered_token_rate)


# The shared vLLM benchmark's client (benchmark_serving_by_time.py) could not keep more than about
# this many requests waiting at the server (open connections); arrivals beyond it failed. The
# earlier twin's grid (data README, paper_twin_simgrid) uses the same cap. A property of that load
# generator, not of vLLM: pass it as ``ServerConfig(client_max_waiting=...)`` to replay its runs.
SHARED_BENCHMARK_CLIENT_MAX_WAITING = 25_500


@dataclass(frozen=True)
class Judging:
    """How the twin judges a run — not vLLM arguments: the starvation ``threshold`` (served /
    offered tokens), an optional latency ``slo`` (:class:`twin.slo.Slo`) and whether the measured
    ``headroom`` (``twin.headroom``) must be met too. One object, so a new judging rule is a
    one-place change for everything that verifies, searches or repairs (``optim``)."""

    threshold: float = 0.9
    slo: Slo | None = None
    headroom: bool = False

    def server_config(self, max_loras: int, max_lora_rank: int | None = None,
                      power_cap_w: float | None = None) -> "ServerConfig":
        """A :class:`ServerConfig` with these vLLM settings, judged by this rule."""
        return ServerConfig(max_loras=max_loras, max_lora_rank=max_lora_rank,
                            starvation_threshold=self.threshold, power_cap_w=power_cap_w,
                            slo=self.slo, headroom=self.headroom)


@dataclass(frozen=True)
class ServerConfig:
    """vLLM server arguments the twin honours.

    ``max_loras`` is Amax (GPU adapter slots); ``max_lora_rank`` defaults to the largest rank of
    the served adapters; the token budget and batch cap default to the profile's values.
    ``client_max_waiting`` is a property of the load generator, not of the server: a client that
    cannot keep more than N requests waiting at the server, so arrivals beyond it fail (counted
    in ``rejected_requests`` and in the offered load, not served). The shared benchmark's client
    saturates at :data:`SHARED_BENCHMARK_CLIENT_MAX_WAITING`; ``None`` means an unbounded queue
    (an open-loop client that never gives up). CLI: ``twin run --client-max-waiting N``.
    ``power_cap_w`` is the GPU's power cap (``nvidia-smi -pl``), a configuration like Amax:
    compute-bound step terms slow down as ``twin.power`` models (``None``: no cap).
    CLI: ``twin run --power-cap W``. ``slo`` (a :class:`twin.slo.Slo`) is, like the starvation
    threshold, how the twin judges the run, not a vLLM argument (``RunMetrics.slo``).
    ``headroom``: judge the run with the twin's measured headroom too (``twin.headroom``: its
    throughput discounted by the optimism the twin showed on real runs of its regime must still
    meet the threshold; ``RunMetrics.headroom``); also a judging rule, not a vLLM argument.
    """

    max_loras: int
    max_lora_rank: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    starvation_threshold: float = 0.9
    client_max_waiting: int | None = None
    power_cap_w: float | None = None
    slo: Slo | None = None
    headroom: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.max_loras, (int, np.integer)) or self.max_loras < 1:
            raise ValueError(f"max_loras (Amax) must be an integer >= 1, got {self.max_loras!r}")
        for name in ("max_lora_rank", "max_num_seqs", "max_num_batched_tokens",
                     "client_max_waiting"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, (int, np.integer)) or v < 1):
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        cap = self.power_cap_w
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, (int, float))
                                or not np.isfinite(cap) or cap <= 0):
            raise ValueError(f"power_cap_w must be a finite number of watts > 0, got {cap!r}")
        if not 0.0 < self.starvation_threshold <= 1.0:
            raise ValueError("starvation_threshold must be in (0, 1], got "
                             f"{self.starvation_threshold!r}")
        if self.slo is not None and not isinstance(self.slo, Slo):
            raise ValueError(f"slo must be a twin.slo.Slo, got {type(self.slo).__name__}")
        if not isinstance(self.headroom, bool):
            raise ValueError(f"headroom must be True or False, got {self.headroom!r}")


def resolve_max_rank(profile: GpuProfile, adapters: Sequence[Adapter],
                     config: ServerConfig) -> int:
    """The server's max_lora_rank after checking every adapter rank against the profile."""
    if not adapters:
        raise ValueError("adapters: at least one adapter is needed")
    supported = set(profile.supported_ranks)
    for a in adapters:
        if a.rank not in supported:
            raise ValueError(f"adapter '{a.id}': rank {a.rank} is not supported by profile "
                             f"'{profile.name}' (supported: {sorted(supported)})")
    top = max(a.rank for a in adapters)
    if config.max_lora_rank is None:
        return top
    if config.max_lora_rank < top:
        raise ValueError(f"max_lora_rank {config.max_lora_rank} is below the largest adapter "
                         f"rank {top}")
    return config.max_lora_rank


@dataclass(frozen=True)
class KernelRun:
    """Raw outputs of one kernel run (see :func:`twin.kernel.simulate_kernel`)."""

    first_t: np.ndarray
    finish_t: np.ndarray
    stats: np.ndarray
    itl_hist: np.ndarray
    kv_blocks: int
    wall_s: float

    def mean_design_row(self) -> np.ndarray:
        """Mean step-time design row over the run's steps (columns of ``design_matrix``)."""
        from .step_time import N_DESIGN
        steps = max(self.stats[K.ST_STEPS], 1.0)
        return self.stats[K.ST_DESIGN:K.ST_DESIGN + N_DESIGN] / steps


def run_kernel(profile: GpuProfile, adapters: Sequence[Adapter], requests: Requests,
               config: ServerConfig, duration_s: float, stop_tokens: float = 0.0
               ) -> KernelRun | None:
    """Check the inputs and run the compiled kernel; ``None`` means a memory error (the
    configuration has no KV-capacity entry in the profile). ``stop_tokens > 0``: stop once the
    window's completed tokens are bounded below it (``twin.kernel.simulate_kernel``; no stop
    when the step-time model gives no bound)."""
    if not (np.isfinite(duration_s) and duration_s > 0):
        raise ValueError(f"duration must be > 0 seconds, got {duration_s!r}")
    max_rank = resolve_max_rank(profile, adapters, config)
    profile = profile_under_cap(profile, config)
    if len(requests) and int(requests.adapter.max()) >= len(adapters):
        raise ValueError("requests: adapter index out of range of the adapter list")
    kv_tokens = profile.kv_tokens(config.max_loras, max_rank)
    if kv_tokens is None:
        return None
    block = profile.block_size
    kv_blocks = kv_tokens // block
    if len(requests):
        longest = int((requests.input_len + requests.output_len).max())
        if longest - 1 > kv_blocks * block:
            raise ValueError(f"requests: a request of {longest} tokens exceeds the KV capacity "
                             f"({kv_blocks * block} tokens) of this configuration")
    load_ms = np.array([profile.load_time_ms(a.rank, max_rank) for a in adapters], np.float64)
    order = activation_ranks([a.id for a in adapters])
    n = len(requests)
    first_t = np.full(n, -1.0)
    finish_t = np.full(n, -1.0)
    stats = np.zeros(K.N_STATS)
    hist = np.zeros(K.ITL_HIST_BINS, np.int64)
    budget = config.max_num_batched_tokens or profile.max_num_batched_tokens
    coef = profile.step_coef_array()
    ms_per_token = min_ms_per_token(coef, config.max_loras, max_rank, budget)
    if ms_per_token <= 0.0:
        stop_tokens = 0.0
    t0 = time.perf_counter()
    interruptible(
        K.simulate_kernel,
        requests.arrival_s, requests.adapter.astype(np.int64), requests.input_len.astype(np.int64),
        requests.output_len.astype(np.int64), len(adapters), load_ms, order, config.max_loras,
        max_rank, kv_blocks, block, budget, config.max_num_seqs or profile.max_num_seqs,
        float(duration_s), coef, config.client_max_waiting or 0, first_t, finish_t, stats, hist,
        float(stop_tokens), float(ms_per_token))
    return KernelRun(first_t, finish_t, stats, hist, kv_blocks, time.perf_counter() - t0)


def interruptible(fn, *args):
    """``fn(*args)`` — a compiled call that releases the GIL — run so that Ctrl-C and SIGTERM
    reach the main thread at once: there, in a helper thread the main one waits on (a signal
    ends the wait with KeyboardInterrupt; the helper is a daemon, dropped when the command
    exits); in any other thread (a fleet worker, a server), directly."""
    if threading.current_thread() is not threading.main_thread():
        return fn(*args)
    box: dict = {}
    done = threading.Event()

    def target() -> None:
        try:
            box["out"] = fn(*args)
        except BaseException as e:          # re-raised in the caller's thread
            box["error"] = e
        finally:
            done.set()

    threading.Thread(target=target, name="twin-kernel", daemon=True).start()
    done.wait()
    if "error" in box:
        raise box["error"]
    return box.get("out")


def profile_under_cap(profile: GpuProfile, config: ServerConfig) -> GpuProfile:
    """The profile whose step coefficients include ``config.power_cap_w`` (``twin.power``);
    the profile itself when neither it nor the config carries a cap."""
    from .power import capped_profile, profile_cap

    if config.power_cap_w is None and profile_cap(profile) is None:
        return profile
    return capped_profile(profile, config.power_cap_w)


def _power_of_run(m: RunMetrics, profile: GpuProfile, config: ServerConfig, run: KernelRun,
                  requests: Requests, duration_s: float) -> RunMetrics:
    from .metrics import with_energy
    from .power import power_model_for, run_power

    pm = power_model_for(profile)
    if pm is None:
        return m
    capped = profile_under_cap(profile, config)
    from .step_time import N_DESIGN
    rp = run_power(pm, capped.step_coef, run.stats[K.ST_DESIGN:K.ST_DESIGN + N_DESIGN],
                   duration_s, config.power_cap_w)
    done = (run.finish_t >= 0) & (run.finish_t <= duration_s)
    return with_energy(m, rp.gpu_busy_frac, rp.avg_power_w, int(requests.output_len[done].sum()))


def _slo_tail(profile: GpuProfile, config: ServerConfig):
    """The client-side latency constants a client-view SLO is judged with (``twin.slo``):
    the profile's fitted ``twin.latency_tail`` constants, None without an SLO or constants."""
    if config.slo is None or config.slo.latency != "client":
        return None
    return latency_tail_for(profile)


def simulate_requests(profile: GpuProfile, adapters: Sequence[Adapter], requests: Requests,
                      config: ServerConfig, duration_s: float, offered_tps: float | None = None,
                      stop_below: float | None = None) -> RunMetrics:
    """Replay a fixed request stream on one server; ``offered_tps`` defaults to the realised one.

    With ``stop_below`` the kernel stops once the window's completed tokens are bounded below
    ``stop_below`` x threshold x the realised offered tokens (``twin.kernel``'s early stop: a
    sound bound from the step-time model). Such a run is starved (its SLO is not judged),
    ``decided_at_s`` says when it stopped and ``throughput_tps`` is the bound / window: an upper
    bound, so a score computed from it is at least the full replay's."""
    if stop_below is not None and not 0.0 < stop_below <= 1.0:
        raise ValueError(f"stop_below: a score in (0, 1] (a run stopped below it starves), "
                         f"got {stop_below!r}")
    realised = None                     # computed only where it is needed here
    if (offered_tps is None or stop_below is not None) and duration_s > 0:
        realised = realised_offered_tps(requests.arrival_s, requests.input_len,
                                        requests.output_len, duration_s)
    if offered_tps is None:
        offered_tps = realised
    stop_tokens = 0.0
    if stop_below is not None and realised:
        stop_tokens = float(stop_below) * config.starvation_threshold * realised * duration_s
    run = run_kernel(profile, adapters, requests, config, duration_s, stop_tokens)
    if run is None:
        return memory_error_metrics(duration_s, float(offered_tps or 0.0))
    decided = float(run.stats[K.ST_DECIDED_T]) > 0.0
    m = compute_metrics(requests.arrival_s, requests.input_len, requests.output_len, run.first_t,
                        run.finish_t, run.stats, run.itl_hist, duration_s, float(offered_tps),
                        run.kv_blocks, profile.block_size, config.starvation_threshold,
                        None if decided else config.slo, adapter=requests.adapter,
                        adapter_count=len(adapters), slo_tail=_slo_tail(profile, config),
                        adapter_ids=[a.id for a in adapters])
    if decided:
        m = replace(m, throughput_tps=float(run.stats[K.ST_TOKENS_BOUND]) / duration_s,
                    starved=True, decided_at_s=float(run.stats[K.ST_DECIDED_T]))
    else:                               # (a partial run's energy would mislead)
        m = _power_of_run(m, profile, config, run, requests, duration_s)
        if config.headroom:
            m = judged_with_headroom(m, profile, config.max_loras, len(adapters),
                                     config.starvation_threshold)
    return _with_wall(m, run.wall_s)


def judged_with_headroom(m: RunMetrics, profile, max_loras: int, served_adapters: int,
                         threshold: float) -> RunMetrics:
    """``m`` with ``headroom`` set: the headroom of its regime (``twin.headroom``) and whether
    the run passes with it; ``RunMetrics.accepted`` then requires that too."""
    ok, hr = judge(profile, max_loras, served_adapters, m, threshold)
    return replace(m, headroom={"h": hr.h, "ok": ok, "text": hr.describe(),
                                "regime": hr.regime.describe() if hr.regime else None,
                                "table_level": hr.key, "max_search_runs": hr.runs})


def _with_wall(m: RunMetrics, wall: float) -> RunMetrics:
    d = m.to_dict()
    d["wall_s"] = wall
    return RunMetrics(**d)


def simulate_server(profile: GpuProfile, adapters: Sequence[Adapter], config: ServerConfig,
                    duration_s: float = 3600.0, lengths: LengthModel | None = None,
                    arrivals: ArrivalProcess | None = None, seed: int = 0,
                    stop_below: float | None = None) -> RunMetrics:
    """Draw a seeded workload for ``adapters`` and simulate it on one server.

    ``stop_below`` (a score, e.g. 1.0): the replay may stop as soon as it is certain that
    throughput / (threshold x realised offered) ends below it — a verdict search that only asks
    "does this configuration reach the score?" then skips the rest of the window
    (:func:`simulate_requests`)."""
    lengths = lengths if lengths is not None else default_lengths()
    resolve_max_rank(profile, adapters, config)   # fail fast, before drawing the workload
    if arrivals is None:            # the default draw is a function of its inputs: reuse it
        requests = _drawn_requests(adapters, duration_s, lengths, seed)
    else:
        requests = generate_requests(adapters, duration_s, lengths, arrivals=arrivals, seed=seed)
    return simulate_requests(profile, adapters, requests, config, duration_s,
                             offered_token_rate(adapters, lengths), stop_below=stop_below)


_DRAWS: "OrderedDict[tuple, Requests]" = OrderedDict()
DRAW_CACHE_ENTRIES = 4              # workloads kept per process (searches replay one per Amax)
DRAW_CACHE_MAX_REQUESTS = 2_000_000


def _drawn_requests(adapters: Sequence[Adapter], duration_s: float, lengths: LengthModel,
                    seed: int) -> Requests:
    """``generate_requests`` with Poisson arrivals, memoised per process: an Amax search or a
    bound check replays one GPU's draw at many Amax values, and drawing it (a quarter of a
    replay's time for hundreds of adapters) gives the same arrays each time. The kernel only
    reads them."""
    key = (tuple((a.id, a.rank, float(a.rate)) for a in adapters), float(duration_s),
           repr(sorted(lengths.to_dict().items())), int(seed))
    hit = _DRAWS.get(key)
    if hit is not None:
        _DRAWS.move_to_end(key)
        return hit
    requests = generate_requests(adapters, duration_s, lengths, arrivals=PoissonArrivals(),
                                 seed=seed)
    if len(requests) <= DRAW_CACHE_MAX_REQUESTS:
        _DRAWS[key] = requests
        while len(_DRAWS) > DRAW_CACHE_ENTRIES:
            _DRAWS.popitem(last=False)
    return requests
