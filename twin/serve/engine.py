"""The online twin engine: the batch twin's vLLM V1 rules, one step at a time, on a virtual clock.

:class:`EngineCore` is pure (no asyncio, no wall clock). It reuses the readable components of the
batch twin — :class:`twin.scheduler.V1Scheduler`, :class:`twin.kv_cache.KVCache`,
:class:`twin.adapter_cache.AdapterSlots` and :func:`twin.step_time.step_time_ms_py` — and follows
the loop of :func:`twin.reference_kernel.simulate_reference` exactly: at the start of a step every
request that arrived at or before the step's start time is queued; the scheduler picks the batch;
the batch's adapters are activated (LRU slots, the profile's load time); the step lasts the
step-time model's value plus the load time; every scheduled request advances and its token (if
any) is stamped with the step's end time. :func:`replay` runs a whole arrival trace this way in
pure virtual time (the test compares it with the compiled kernel).

:class:`WallClockEngine` drives the core from one asyncio task: virtual time =
(wall - t0) x time_scale. A step's tokens are released when the virtual clock reaches the step's
end, and the next step starts only then, so every request received before that moment takes part
in it — exactly as in the batch twin. When the process falls behind (wall time already past the
step's end), steps run back to back without sleeping until the clock is caught up; events are
never reordered. Between steps the task sleeps (``asyncio.sleep`` / an event): no busy-waiting.
"""

from __future__ import annotations

import asyncio
import math
import time
import zlib
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

import numpy as np

from ..adapter_cache import AdapterSlots
from ..kernel import LORA_TILE
from ..kv_cache import KVCache, blocks_for
from ..profile import GpuProfile
from ..scheduler import RequestState, V1Scheduler
from ..step_time import step_time_ms_py

BASE_MODEL = -1   # adapter id of a request for the base model (no LoRA)


@dataclass(frozen=True)
class EngineSettings:
    """The server flags the engine honours, resolved against a profile.

    ``max_loras == 0`` means LoRA disabled (vLLM without ``--enable-lora``): the step has no LoRA
    terms and the KV cache has the backbone capacity.
    """

    max_loras: int
    max_lora_rank: int
    max_num_seqs: int
    max_num_batched_tokens: int
    kv_blocks: int
    block_size: int
    max_model_len: int
    step_coef: tuple[float, ...]

    @classmethod
    def from_profile(cls, profile: GpuProfile, max_loras: int, max_lora_rank: int,
                     max_num_seqs: int | None = None,
                     max_num_batched_tokens: int | None = None) -> "EngineSettings":
        """Resolve the KV capacity exactly as :func:`twin.server.run_kernel` does; raises
        ``ValueError`` naming the flags when vLLM would not start (no KV-capacity entry)."""
        if max_loras > 0 and max_lora_rank not in profile.supported_ranks:
            raise ValueError(f"--max-lora-rank {max_lora_rank}: not supported by profile "
                             f"'{profile.name}' (supported: "
                             f"{', '.join(map(str, profile.supported_ranks))})")
        kv_tokens = profile.kv_tokens(max_loras, max_lora_rank)
        if kv_tokens is None:
            raise ValueError(f"--max-loras {max_loras} --max-lora-rank {max_lora_rank}: profile "
                             f"'{profile.name}' has no KV capacity for this configuration (vLLM "
                             "would fail to start: not enough GPU memory for the KV cache)")
        return cls(max_loras=int(max_loras), max_lora_rank=int(max_lora_rank),
                   max_num_seqs=int(max_num_seqs or profile.max_num_seqs),
                   max_num_batched_tokens=int(max_num_batched_tokens
                                              or profile.max_num_batched_tokens),
                   kv_blocks=kv_tokens // profile.block_size, block_size=profile.block_size,
                   max_model_len=min(profile.max_model_len,
                                     (kv_tokens // profile.block_size) * profile.block_size),
                   step_coef=tuple(profile.step_coef))

    @property
    def kv_capacity_tokens(self) -> int:
        return self.kv_blocks * self.block_size


@dataclass(eq=False)
class EngineRequest(RequestState):
    """One request inside the engine: the scheduler's state plus its arrival and token times
    (virtual seconds). ``on_token`` is called after every step that produced a token for it."""

    arrival: float = 0.0
    scheduled_t: float = -1.0     # start of the first step that scheduled it (vLLM's scheduled_ts)
    first_t: float = -1.0
    finish_t: float = -1.0
    last_token_t: float = -1.0
    aborted: bool = False
    tag: object = None
    on_token: Callable[["EngineRequest"], None] | None = None

    @property
    def finished(self) -> bool:
        return self.finish_t >= 0.0


@dataclass
class StepRecord:
    """What one engine step did (virtual seconds)."""

    t_start: float
    t_end: float
    emitted: list[EngineRequest] = field(default_factory=list)   # produced a token at t_end
    finished: list[EngineRequest] = field(default_factory=list)
    itl_gaps: list[float] = field(default_factory=list)          # gaps of non-first tokens
    first_tokens: list[EngineRequest] = field(default_factory=list)
    preemptions: int = 0
    loads: int = 0
    n_prefill: int = 0
    n_decode: int = 0


class EngineCore:
    """One vLLM V1 engine on a virtual clock (see the module docstring)."""

    def __init__(self, settings: EngineSettings) -> None:
        self.settings = settings
        self.kv = KVCache(settings.kv_blocks, settings.block_size)
        # load the compiled block count now: its first call (numba's cache, ~0.3-1 s) would
        # otherwise stall the first request's step and show as lag behind the scaled clock
        blocks_for(1, settings.block_size)
        self.sched = V1Scheduler(self.kv, settings.max_loras, settings.max_num_batched_tokens,
                                 settings.max_num_seqs)
        self.load_ms: dict[int, float] = {}
        self.activation_key: dict[int, int] = {}      # CRC-32 of the name (twin.adapter_cache)
        self.slots = AdapterSlots(settings.max_loras, self.load_ms, self.activation_key)
        self.coef = np.asarray(settings.step_coef, dtype=np.float64)
        self.clock = 0.0            # virtual time at which the next step starts
        self.pending: deque[EngineRequest] = deque()   # submitted, arrival > clock at submission
        self._next_idx = 0
        self.steps = 0
        self.preemptions = 0
        self.loads = 0

    # ------------------------------------------------------------------ adapters
    def register_adapter(self, adapter_id: int, load_ms: float, name: str | None = None) -> None:
        """Make adapter ``adapter_id`` servable with its CPU->GPU load time (ms); ``name``
        (default: the id) places it in the activation order, as in the batch twin
        (``twin.adapter_cache.activation_ranks``)."""
        if adapter_id < 0:
            raise ValueError(f"adapter id must be >= 0, got {adapter_id}")
        self.load_ms[adapter_id] = float(load_ms)
        self.activation_key[adapter_id] = zlib.crc32(
            (str(adapter_id) if name is None else name).encode())

    def evict_adapter(self, adapter_id: int) -> None:
        """Drop an unloaded adapter's GPU slot (if it holds one)."""
        self.slots.lru.pop(adapter_id, None)

    @property
    def resident_adapters(self) -> list[int]:
        """Adapters in GPU slots, least recently used first."""
        return list(self.slots.lru)

    # ------------------------------------------------------------------ requests
    def submit(self, adapter: int, prompt_tokens: int, output_tokens: int, arrival: float,
               **extra) -> EngineRequest:
        """Queue a request that arrives at virtual time ``arrival`` (arrivals must come in
        non-decreasing order; the caller stamps them from one clock)."""
        if adapter >= 0 and adapter not in self.load_ms:
            raise KeyError(f"adapter {adapter} is not registered")
        if prompt_tokens < 1 or output_tokens < 1:
            raise ValueError("prompt_tokens and output_tokens must be >= 1")
        if prompt_tokens + output_tokens - 1 > self.settings.kv_capacity_tokens:
            raise ValueError(f"request of {prompt_tokens + output_tokens} tokens exceeds the KV "
                             f"capacity ({self.settings.kv_capacity_tokens} tokens)")
        if self.pending and arrival < self.pending[-1].arrival:
            arrival = self.pending[-1].arrival
        req = EngineRequest(self._next_idx, int(adapter), int(prompt_tokens),
                            int(output_tokens), arrival=float(arrival), **extra)
        self._next_idx += 1
        self.pending.append(req)
        return req

    def abort(self, req: EngineRequest) -> None:
        """Remove a request the client gave up on (vLLM aborts it and frees its KV blocks)."""
        if req.finished or req.aborted:
            return
        req.aborted = True
        if req in self.sched.running:
            self.sched.finish(req)
        elif req in self.sched.waiting:
            self.sched.waiting.remove(req)
        elif req in self.pending:
            self.pending.remove(req)

    def admit(self) -> None:
        """Queue every pending request that arrived at or before the clock."""
        while self.pending and self.pending[0].arrival <= self.clock:
            self.sched.add(self.pending.popleft())

    @property
    def busy(self) -> bool:
        return bool(self.sched.running or self.sched.waiting)

    def next_arrival(self) -> float | None:
        return self.pending[0].arrival if self.pending else None

    # ------------------------------------------------------------------ one step
    def step(self) -> StepRecord | None:
        """Admit arrivals, schedule and run one step starting at ``clock``; move the clock to
        its end. ``None`` when nothing could be scheduled (idle, or blocked until an arrival)."""
        self.admit()
        if not self.busy:
            return None
        s = self.settings
        plan = self.sched.schedule()
        self.preemptions += plan.preemptions
        if not plan.scheduled:
            return None
        n_prefill = n_decode = ctx = 0
        tok_of: dict[int, int] = {}
        for req, new in zip(plan.scheduled, plan.new_tokens):
            if req.scheduled_t < 0.0:
                req.scheduled_t = self.clock
            ctx += req.computed
            if req.generated > 0 and req.num_tokens - req.computed == 1:
                n_decode += 1
            else:
                n_prefill += new
            if req.adapter >= 0:
                tok_of[req.adapter] = tok_of.get(req.adapter, 0) + new
        n_tiles = sum(-(-tok_of[a] // LORA_TILE) for a in plan.adapters)
        load_total, loads = 0.0, 0
        if s.max_loras > 0:
            load_total, loads = self.slots.activate(plan.adapters)
        dt = (step_time_ms_py(self.coef, len(plan.scheduled), n_prefill, n_decode, ctx,
                              len(plan.adapters), s.max_loras, s.max_lora_rank, plan.scanned,
                              n_tiles) + load_total) / 1000.0
        t_end = self.clock + dt
        rec = StepRecord(self.clock, t_end, preemptions=plan.preemptions, loads=loads,
                         n_prefill=n_prefill, n_decode=n_decode)
        for req, new in zip(plan.scheduled, plan.new_tokens):
            req.computed += new
            if req.computed == req.num_tokens:
                req.generated += 1
                if req.generated == 1:
                    req.first_t = t_end
                    rec.first_tokens.append(req)
                else:
                    rec.itl_gaps.append(t_end - req.last_token_t)
                req.last_token_t = t_end
                rec.emitted.append(req)
                if req.generated >= req.out_len:
                    req.finish_t = t_end
                    self.sched.finish(req)
                    rec.finished.append(req)
        self.clock = t_end
        self.steps += 1
        self.loads += loads
        return rec

    def running_adapters(self) -> list[int]:
        return [r.adapter for r in self.sched.running]

    def _pending_due(self) -> list[EngineRequest]:
        """Received requests stamped at or before the clock (the next step queues them).
        Requests stamped later are not counted as waiting yet: they are in the engine's future
        when it lags behind the scaled wall clock, and its scheduler has not seen them."""
        out = []
        for r in self.pending:          # non-decreasing arrivals
            if r.arrival > self.clock:
                break
            out.append(r)
        return out

    def n_waiting(self) -> int:
        """Waiting requests as of the engine's clock (vLLM's num_requests_waiting): the
        scheduler's queue plus :meth:`_pending_due`."""
        return len(self.sched.waiting) + len(self._pending_due())

    def waiting_adapters(self) -> list[int]:
        return [r.adapter for r in self.sched.waiting] + [r.adapter for r in self._pending_due()]


def replay(settings: EngineSettings, arrival: Sequence[float], adapter: Sequence[int],
           prompt_tokens: Sequence[int], output_tokens: Sequence[int],
           load_ms: Sequence[float], duration: float = math.inf,
           names: Sequence[str] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Run an arrival trace through :class:`EngineCore` in pure virtual time (no wall clock),
    with the batch twin's loop; return per-request ``(first_t, finish_t)`` (-1 = not reached
    before ``duration``). ``names``: the adapters' names (their activation order; default their
    indices). Used to check the online engine against :mod:`twin.kernel`."""
    core = EngineCore(settings)
    for a, ms in enumerate(load_ms):
        core.register_adapter(a, ms, None if names is None else names[a])
    reqs = [core.submit(int(a), int(i), int(o), float(t))
            for t, a, i, o in zip(arrival, adapter, prompt_tokens, output_tokens)]
    while core.clock < duration:
        rec = core.step()
        if rec is None:
            nxt = core.next_arrival()
            if nxt is None or nxt >= duration:
                break
            core.clock = max(core.clock, nxt)
    return (np.array([r.first_t for r in reqs]), np.array([r.finish_t for r in reqs]))


class WallClockEngine:
    """Drive an :class:`EngineCore` from one asyncio task in (time-scaled) wall time.

    ``now()`` is the virtual time; requests are stamped with it on arrival. ``on_step`` (if
    given) sees every :class:`StepRecord` when its tokens are released (metrics use it).
    """

    def __init__(self, core: EngineCore, time_scale: float = 1.0,
                 on_step: Callable[[StepRecord], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not (math.isfinite(time_scale) and time_scale > 0):
            raise ValueError(f"--time-scale must be a finite number > 0, got {time_scale!r}")
        self.core = core
        self.time_scale = float(time_scale)
        self.on_step = on_step
        self._wall = clock
        self._t0 = clock()
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self.lag_s = 0.0          # largest virtual-time lag behind the wall clock seen so far

    def now(self) -> float:
        """Virtual (twin) time in seconds since the engine started."""
        return (self._wall() - self._t0) * self.time_scale

    def submit(self, adapter: int, prompt_tokens: int, output_tokens: int,
               **extra) -> EngineRequest:
        """Stamp a request with the current virtual time and queue it."""
        req = self.core.submit(adapter, prompt_tokens, output_tokens, self.now(), **extra)
        self._wake.set()
        return req

    def abort(self, req: EngineRequest) -> None:
        self.core.abort(req)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="twin-engine")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    async def _sleep_until(self, t_virtual: float) -> None:
        delay = (t_virtual - self.now()) / self.time_scale
        if delay > 0:
            await asyncio.sleep(delay)
        else:
            self.lag_s = max(self.lag_s, -delay * self.time_scale)

    async def _run(self) -> None:
        core = self.core
        yield_every = 0
        while True:
            rec = core.step()
            if rec is None:
                nxt = core.next_arrival()
                if nxt is None:                       # idle: wait for a request
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                core.clock = max(core.clock, nxt)     # as the batch twin: jump to the arrival
                continue
            await self._sleep_until(rec.t_end)
            for req in rec.emitted:
                if req.on_token is not None:
                    req.on_token(req)
            if self.on_step is not None:
                self.on_step(rec)
            yield_every += 1
            if yield_every >= 8:                      # catching up: let handlers write
                yield_every = 0
                await asyncio.sleep(0)


def iter_adapter_names(ids: Iterable[int], name_of: dict[int, str]) -> list[str]:
    """Names of adapter ids in first-seen order (base-model requests left out)."""
    seen: dict[str, None] = {}
    for a in ids:
        if a >= 0 and a in name_of:
            seen.setdefault(name_of[a], None)
    return list(seen)
