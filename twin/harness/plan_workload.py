"""A placement plan (``optim solve --json``) and the request stream each of its GPUs receives.

The streams are the ones the twin verified the plan with (``twin.fleet``): GPU ``g`` serves its
adapters at ``rate x share`` with Poisson arrivals and the instance's length model, drawn with
seed ``seed + g``; or, from a trace file (``arrival_s, adapter_id, input_tokens,
output_tokens``), every row goes to one of the GPUs serving its adapter, chosen by the routing
shares with a seeded draw.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Sequence

import numpy as np

from twin.json_files import read_json_file
from twin.lengths import LengthModel
from twin.sharegpt import default_lengths
from twin.workload import Adapter, Requests, generate_requests, load_trace_csv


@dataclass(frozen=True)
class GpuWorkload:
    """One GPU of the plan: server settings, its adapters (rates already times the share) and
    the requests it receives (adapter indices into ``adapters``)."""

    gpu: int
    profile: str
    max_loras: int
    max_lora_rank: int
    adapters: tuple[Adapter, ...]
    requests: Requests
    prompts: tuple | None = None    # per request, from --prompts (None: random token ids)


@dataclass(frozen=True)
class PlanWorkload:
    """Every GPU's workload, the replay window (twin seconds) and the starvation threshold."""

    plan_path: str
    instance: str
    gpus: tuple[GpuWorkload, ...]
    duration_s: float
    seed: int
    threshold: float
    source: str      # "poisson" or the trace path
    prompt_source: str = "random token ids of the length model's input lengths"

    @property
    def n_requests(self) -> int:
        return sum(len(g.requests) for g in self.gpus)


def load_plan(path: str | Path):
    """Read a placement written by ``optim solve --json`` (``optim.placement.Placement``)."""
    from optim.placement import Placement

    p = Path(path)
    d = read_json_file(p, "plan", ValueError)
    if not isinstance(d, dict) or "gpus" not in d:
        raise ValueError(f"plan {p}: not a placement (no 'gpus' field; write it with "
                         "`python -m optim solve INSTANCE --method M --json plan.json`)")
    try:
        plan = Placement.from_dict(d)
    except KeyError as e:
        raise ValueError(f"plan {p}: field {e.args[0]!r} missing") from None
    except (TypeError, ValueError) as e:
        raise ValueError(f"plan {p}: {e}") from None
    if not plan.gpus:
        raise ValueError(f"plan {p}: no GPUs (status {plan.status}); nothing to verify")
    return plan


def _max_model_len(plan) -> int | None:
    """The shortest context (``max_model_len``) of the plan's profiles; None when one does not
    load (the generic per-request token limit applies then)."""
    from twin.profile import load_profile
    lens = []
    for name in sorted({g.profile for g in plan.gpus}):
        try:
            lens.append(int(load_profile(name).max_model_len))
        except (OSError, ValueError):
            return None
    return min(lens) if lens else None


def _route_trace(plan, trace: str, duration_s: float | None, seed: int
                 ) -> tuple[list[list[Adapter]], list[Requests], float]:
    all_adapters: dict[str, Adapter] = {}
    homes: dict[str, list[tuple[int, float]]] = {}
    for g, gp in enumerate(plan.gpus):
        for a, share in gp.adapters:
            all_adapters.setdefault(a.id, a)
            homes.setdefault(a.id, []).append((g, share))
    adapters = list(all_adapters.values())
    _, reqs = load_trace_csv(trace, adapters=adapters, duration_s=duration_s,
                             max_model_len=_max_model_len(plan))
    window = float(duration_s) if duration_s is not None else float(reqs.arrival_s.max())
    if window <= 0:
        raise ValueError(f"--trace {trace}: its span is 0 s; pass --duration")
    rng = np.random.default_rng(seed)
    u = rng.random(len(reqs))
    gpu_of = np.empty(len(reqs), np.int64)
    for k, a in enumerate(adapters):
        rows = np.flatnonzero(reqs.adapter == k)
        gs = homes[a.id]
        cum = np.cumsum([s for _, s in gs])
        pick = np.searchsorted(cum / cum[-1], u[rows], side="right")
        gpu_of[rows] = np.array([g for g, _ in gs])[np.minimum(pick, len(gs) - 1)]
    per_adapters, per_requests = [], []
    for g, gp in enumerate(plan.gpus):
        local = [replace(a, rate=a.rate * s) for a, s in gp.adapters]
        idx = {a.id: i for i, a in enumerate(local)}
        rows = np.flatnonzero(gpu_of == g)
        amap = np.array([idx.get(a.id, -1) for a in adapters])
        per_adapters.append(local)
        per_requests.append(Requests(reqs.arrival_s[rows], amap[reqs.adapter[rows]],
                                     reqs.input_len[rows], reqs.output_len[rows]))
    return per_adapters, per_requests, window


def plan_workload(plan_path: str | Path, duration_s: float | None = None, seed: int | None = None,
                  instance_path: str | Path | None = None, trace: str | None = None,
                  lengths: LengthModel | None = None, max_requests: int | None = None
                  ) -> PlanWorkload:
    """The workload of every GPU of a plan (see the module docstring).

    ``instance_path`` supplies the length model, seed, window and starvation threshold the plan
    was verified with (it must be the plan's instance); without it the twin's default length
    model, seed 0, 0.9 and ``duration_s`` (required) apply. ``max_requests`` refuses a workload
    larger than that many requests (shorten the window instead of silently dropping load)."""
    plan = load_plan(plan_path)
    threshold = 0.9
    inst_seed, inst_duration = 0, None
    if instance_path is not None:
        from optim.instance import InstanceError, load_instance
        try:
            inst = load_instance(instance_path)
        except InstanceError as e:
            raise ValueError(f"--instance: {e}") from None
        if inst.name != plan.instance:
            raise ValueError(f"--instance {instance_path}: instance '{inst.name}' is not the "
                             f"plan's instance '{plan.instance}'")
        lengths = lengths or inst.lengths
        threshold, inst_seed, inst_duration = inst.starvation_threshold, inst.seed, inst.duration_s
    lengths = lengths or default_lengths()
    seed = inst_seed if seed is None else seed
    if trace is not None:
        per_adapters, per_requests, window = _route_trace(plan, trace, duration_s, seed)
        source = str(trace)
    else:
        window = duration_s if duration_s is not None else inst_duration
        if window is None:
            raise ValueError("--duration: needed without --instance or --trace")
        per_adapters, per_requests = [], []
        for g, gp in enumerate(plan.gpus):
            local = [replace(a, rate=a.rate * s) for a, s in gp.adapters]
            per_adapters.append(local)
            try:
                per_requests.append(generate_requests(local, window, lengths, seed=seed + g))
            except ValueError as e:     # e.g. twin.limits: the expected request count
                raise ValueError(f"plan {plan_path}: GPU {g}: {e}") from None
        source = "poisson"
    gpus = tuple(GpuWorkload(g, gp.profile, gp.max_loras, gp.max_lora_rank, tuple(ad), rq)
                 for g, (gp, ad, rq) in enumerate(zip(plan.gpus, per_adapters, per_requests)))
    wl = PlanWorkload(str(plan_path), plan.instance, gpus, float(window), int(seed), threshold,
                      source)
    if max_requests is not None and wl.n_requests > max_requests:
        raise ValueError(f"--max-requests {max_requests}: the workload has {wl.n_requests} "
                         f"requests in {window:g} s; shorten --duration or raise the limit")
    return wl


def prompt_ids(n_tokens: Sequence[int], seed: int, low: int = 1000, high: int = 30000
               ) -> list[tuple[int, ...]]:
    """Random prompts as token-id lists of the given lengths (seeded; ids inside every
    profiled model's vocabulary, away from the special tokens at either end)."""
    rng = np.random.default_rng(seed)
    return [tuple(int(x) for x in rng.integers(low, high, int(n))) for n in n_tokens]


def with_prompt_file(wl: PlanWorkload, path: str | Path) -> PlanWorkload:
    """``wl`` with every request's prompt drawn from a prompt file (``twin.harness.prompt_file``;
    GPU ``g`` draws with seed ``wl.seed + g``): input lengths become the prompts' lengths, for
    the requests sent and the twin's prediction alike. Refuses a prompt longer than the KV
    capacity of the smallest server of the plan."""
    from twin.profile import load_profile

    from .prompt_file import draw_prompts, load_prompts
    pool = load_prompts(path)
    caps = [load_profile(g.profile).kv_tokens(g.max_loras, g.max_lora_rank) for g in wl.gpus]
    cap = min((c for c in caps if c), default=None)
    gpus = []
    for g in wl.gpus:
        reqs, prompts = draw_prompts(g.requests, pool, wl.seed + g.gpu, max_tokens=cap)
        gpus.append(replace(g, requests=reqs, prompts=prompts))
    how = (f"{len(pool)} prompts of {pool.path}" +
           (f" ({pool.estimated} lengths estimated as UTF-8 bytes / 4)" if pool.estimated else
            " (exact lengths)"))
    return replace(wl, gpus=tuple(gpus), prompt_source=how)
