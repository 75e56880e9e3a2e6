"""What a router sees: the request, and a snapshot of each candidate GPU at its arrival.

A snapshot holds what a gateway can know at the arrival time: the gateway's own count of
requests it sent to the GPU and that have not finished (``outstanding``; a completion is known
when the step that produced the last token ends), and the server's scheduler state as of its
last step boundary (vLLM publishes its stats once per step, including the running and waiting
LoRA adapters and ``max_lora``): running and waiting requests, KV blocks in use, the adapters in
GPU slots, the distinct adapters running and queued, and whether the request's own adapter is
among them. A batch holds at most ``max_loras`` distinct adapters, so a request whose adapter is
neither running nor queued starts at once (after its ``load_ms``) only when a slot is free
(:attr:`GpuSnapshot.free_slots`); otherwise it waits for a running adapter to drain.
``active_adapters`` is the gateway-side count (distinct adapters with requests outstanding).
``speed_ms`` is the GPU's step time for a reference batch (64 decodes of 400-token contexts),
which tells GPU types apart."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..profile import GpuProfile
from ..step_time import step_time_ms_py


@dataclass(frozen=True, slots=True)
class RouteRequest:
    """One request to route: its index in the request stream, adapter index, rank, prompt
    length, arrival time, and the adapter's homes (GPU indices) with the plan's weights."""

    index: int
    adapter: int
    rank: int
    input_len: int
    arrival_s: float
    homes: tuple[int, ...]
    weights: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class GpuSnapshot:
    """One GPU as the router sees it when a request arrives (see the module docstring)."""

    gpu: int
    outstanding: int            # sent by the gateway, not finished
    running: int
    waiting: int                # queued at the server (incl. sent since its last step started)
    kv_used_frac: float
    resident: bool              # the request's adapter is in a GPU slot
    adapter_outstanding: int    # requests of the same adapter outstanding on this GPU
    active_adapters: int        # distinct adapters with requests outstanding on this GPU
    n_resident: int             # adapters in GPU slots
    max_loras: int
    max_lora_rank: int
    speed_ms: float
    running_adapters: int       # distinct adapters in the running batch (vLLM's lora stats)
    waiting_adapters: int       # distinct adapters queued at the server and not running
    adapter_running: bool       # the request's adapter is in the running batch
    adapter_waiting: bool       # the request's adapter has requests queued at the server
    load_ms: float              # the request's adapter's CPU->GPU load time on this GPU

    @property
    def free_slots(self) -> int:
        """Batch slots no running or queued adapter claims: a cold request can start at once
        (after its load) only if this is > 0."""
        return max(self.max_loras - self.running_adapters - self.waiting_adapters, 0)


def reference_step_ms(profile: GpuProfile, max_loras: int, max_lora_rank: int) -> float:
    """Step time (ms) of a reference batch on this GPU: 64 decodes, 400-token contexts,
    ``min(8, max_loras)`` adapters."""
    a = min(8, max_loras)
    return float(step_time_ms_py(np.asarray(profile.step_coef, np.float64), 64, 0, 64, 64 * 400,
                                 a, max_loras, max_lora_rank, 0, a))
