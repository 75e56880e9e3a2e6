"""Power model of one GPU serving with the twin: power vs utilisation, slowdown under a cap.

Form (documented, replaceable by measurements with ``python -m twin calibrate-power``):

* **Where the step time goes.** The twin knows each step's time split into the terms of
  ``twin.step_time``. Per term j, ``compute_share[j]`` is the part spent in compute-bound GPU
  kernels (c1 per token, c6 per token x slot, c11 per request above the knee) and
  ``gpu_busy_share[j]`` the part spent in any GPU kernel; the difference is memory-bound work
  (c0's weight read = weights / HBM bandwidth, c3 KV reads, c5/c7/c8 LoRA weight reads); the
  rest is CPU (scheduler, c2, c4, c9, and c0 beyond the weight read), during which the GPU
  idles (vLLM 0.8.5 does not overlap scheduling with the forward pass). Summing coefficient x
  the run's summed design column x share gives the compute-bound seconds T_c and memory-bound
  seconds T_m of a run, with no change to the kernel. ``gpu_busy_frac`` = (T_c + T_m) / window,
  the quantity ``nvidia-smi`` reports as ``utilization.gpu``.
* **Busy power.** Compute-bound kernels draw P_max (the TDP). Memory-bound kernels draw
  P_mem = P_idle + ``memory_power_frac`` x (P_max - P_idle): memory-bound LLM decode draws far
  below TDP (137-300 W on a 700 W H200 across attention types, Ma et al., "The Illusion of
  Power Capping in LLM Decode", arXiv:2605.11999, https://arxiv.org/abs/2605.11999); the default
  0.33 is the upper end, (300 - 105) / (700 - 105).
* **Average power.** With u_eff = (T_c (P_c - P_idle) + T_m (P_m - P_idle)) / (window x
  (P_max - P_idle)), P = P_idle + (P_max - P_idle) x u_eff^alpha. alpha = 1 is the idle-plus-
  linear server power model (Fan, Weber, Barroso, "Power provisioning for a warehouse-sized
  computer", ISCA 2007, https://doi.org/10.1145/1250662.1250665, which also fits an exponent);
  ``calibrate-power`` fits P_idle, P_max and alpha on an nvidia-smi log.
* **Power cap** C (``ServerConfig.power_cap_w``, ``twin run --power-cap``): the GPU lowers its
  SM clock until busy power fits. Dynamic power grows as clock^gamma (f x V^2 with V roughly
  proportional to f under DVFS: gamma = 3; fitted by ``calibrate-power`` when the log holds
  busy samples at reduced clocks). Compute-bound work runs at clock scale
  s_c = ((C - P_idle) / (P_max - P_idle))^(1/gamma) and takes 1/s_c as long, drawing C;
  memory-bound work is untouched while C >= P_mem (the cited finding: decode caps do not
  trigger), else it runs at s_m = ((C - P_idle) / (P_m - P_idle))^(1/gamma) and draws C
  (conservative: HBM-bound time is assumed to follow the clock once the cap bites). CPU terms
  never change.

So a lower cap never shortens a step, busy power never rises, and energy per unit of capped
work falls as s^(gamma-1).
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from .gpu_catalog import GpuSpec, gpu_spec, CatalogError
from .model_configs import ModelConfig, ModelConfigError, model_config
from .profile import GpuProfile
from .step_time import LINEAR_IDX, N_STEP_COEF

DEFAULT_ALPHA = 1.0
DEFAULT_CLOCK_EXPONENT = 3.0
DEFAULT_MEMORY_POWER_FRAC = 0.33
# coefficient indices whose time is GPU work (c0 handled apart: its weight-read part)
_GPU_TERMS = (1, 3, 5, 6, 7, 8, 11)
_COMPUTE_TERMS = (1, 6, 11)


class PowerModelError(ValueError):
    """A power model, a cap or an nvidia-smi log is invalid (the message names it)."""


@dataclass(frozen=True)
class PowerModel:
    """Power of one GPU type as a function of utilisation and cap (module docstring)."""

    idle_w: float
    max_w: float
    alpha: float = DEFAULT_ALPHA
    clock_exponent: float = DEFAULT_CLOCK_EXPONENT
    memory_power_frac: float = DEFAULT_MEMORY_POWER_FRAC
    gpu_busy_share: tuple[float, ...] = tuple([0.0] * N_STEP_COEF)
    compute_share: tuple[float, ...] = tuple([0.0] * N_STEP_COEF)
    source: str = ""

    def __post_init__(self) -> None:
        _check(self.to_dict(), "power model")

    @property
    def memory_power_w(self) -> float:
        """Power of memory-bound kernels at full clocks."""
        return self.idle_w + self.memory_power_frac * (self.max_w - self.idle_w)

    def _scale(self, cap_w: float | None, busy_w: float) -> float:
        if cap_w is None or cap_w >= busy_w:
            return 1.0
        check_cap(cap_w, self)
        return ((cap_w - self.idle_w) / (busy_w - self.idle_w)) ** (1.0 / self.clock_exponent)

    def clock_scale(self, cap_w: float | None) -> float:
        """Clock fraction s_c in (0, 1] of compute-bound work under ``cap_w`` (1 uncapped)."""
        return self._scale(cap_w, self.max_w)

    def memory_clock_scale(self, cap_w: float | None) -> float:
        """Clock fraction s_m of memory-bound work (1 unless the cap is below P_mem)."""
        return self._scale(cap_w, self.memory_power_w)

    def memory_share(self) -> tuple[float, ...]:
        """Per step term: the part spent in memory-bound GPU kernels."""
        return tuple(max(b - c, 0.0) for b, c in zip(self.gpu_busy_share, self.compute_share))

    def power_w(self, compute_frac: float, memory_frac: float,
                cap_w: float | None = None) -> float:
        """Average power when compute-bound kernels run ``compute_frac`` and memory-bound ones
        ``memory_frac`` of the window (module docstring)."""
        pc = self.max_w if cap_w is None else min(float(cap_w), self.max_w)
        pm = self.memory_power_w if cap_w is None else min(float(cap_w), self.memory_power_w)
        u = (max(compute_frac, 0.0) * (pc - self.idle_w) + max(memory_frac, 0.0)
             * (pm - self.idle_w)) / (self.max_w - self.idle_w)
        return self.idle_w + (self.max_w - self.idle_w) * min(u, 1.0) ** self.alpha

    def to_dict(self) -> dict[str, Any]:
        return {"idle_w": self.idle_w, "max_w": self.max_w, "alpha": self.alpha,
                "clock_exponent": self.clock_exponent,
                "memory_power_frac": self.memory_power_frac,
                "gpu_busy_share": list(self.gpu_busy_share),
                "compute_share": list(self.compute_share), "source": self.source}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "power model") -> "PowerModel":
        _check(d, where)
        keep = {k: d[k] for k in ("idle_w", "max_w", "alpha", "clock_exponent",
                                  "memory_power_frac", "source") if k in d}
        return cls(gpu_busy_share=tuple(float(x) for x in d["gpu_busy_share"]),
                   compute_share=tuple(float(x) for x in d["compute_share"]), **keep)


def _check(d: Mapping[str, Any], where: str) -> None:
    def num(k: str, default: float | None = None) -> float:
        v = d.get(k, default)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
                or v <= 0:
            raise PowerModelError(f"{where}: field {k!r}: must be a finite number > 0, got {v!r}")
        return float(v)

    idle, top = num("idle_w"), num("max_w")
    if idle >= top:
        raise PowerModelError(f"{where}: field 'idle_w': {idle:g} W must be below max_w {top:g} W")
    alpha, gamma = num("alpha"), num("clock_exponent")
    if alpha > gamma:
        raise PowerModelError(f"{where}: field 'alpha': {alpha:g} must not exceed clock_exponent "
                              f"{gamma:g} (else a lower cap could raise average power)")
    if num("memory_power_frac", DEFAULT_MEMORY_POWER_FRAC) > 1.0:
        raise PowerModelError(f"{where}: field 'memory_power_frac': must be in (0, 1], got "
                              f"{d.get('memory_power_frac')!r}")
    for k in ("gpu_busy_share", "compute_share"):
        v = d.get(k)
        if not isinstance(v, (list, tuple)) or len(v) != N_STEP_COEF or not all(
                isinstance(x, (int, float)) and not isinstance(x, bool) and 0.0 <= x <= 1.0
                for x in v):
            raise PowerModelError(f"{where}: field {k!r}: must be {N_STEP_COEF} numbers in [0, 1]")
    if any(c > b for b, c in zip(d["gpu_busy_share"], d["compute_share"])):
        raise PowerModelError(f"{where}: field 'compute_share': a term's compute share exceeds "
                              "its gpu_busy_share")


def check_cap(cap_w: float, pm: PowerModel) -> None:
    """A cap must be a finite number above the idle power."""
    if not (isinstance(cap_w, (int, float)) and math.isfinite(cap_w) and cap_w > pm.idle_w):
        raise PowerModelError(f"power_cap_w: {cap_w!r} W must be a finite number above the GPU's "
                              f"idle power {pm.idle_w:g} W")


def default_power_model(gpu: GpuSpec, model: ModelConfig, step_coef: Sequence[float],
                        source: str | None = None) -> PowerModel:
    """Power model from the catalog facts of ``gpu`` (idle power, TDP) and the split of the
    step coefficients (c0's weight-read part = weights / HBM bandwidth)."""
    busy = [0.0] * N_STEP_COEF
    for j in _GPU_TERMS:
        busy[j] = 1.0
    c0 = float(step_coef[0])
    w0 = model.weight_bytes / (gpu.hbm_bandwidth_gbs * 1e9) * 1e3
    busy[0] = min(w0 / c0, 1.0) if c0 > 0 else 0.0
    comp = [0.0] * N_STEP_COEF
    for j in _COMPUTE_TERMS:
        comp[j] = 1.0
    return PowerModel(idle_w=gpu.idle_w, max_w=gpu.tdp_w, gpu_busy_share=tuple(busy),
                      compute_share=tuple(comp),
                      source=source or f"catalog {gpu.id} (idle_w, tdp_w); alpha, clock_exponent "
                                       "and memory_power_frac defaults (twin.power)")


def power_model_for(profile: GpuProfile) -> PowerModel | None:
    """The profile's own power model, else one from the catalog entry of its GPU and the config
    of its model; ``None`` when neither is known (the run then reports no power)."""
    if profile.power:
        return PowerModel.from_dict(profile.power, f"profile {profile.name!r}: field 'power'")
    try:
        return default_power_model(gpu_spec(profile.gpu), model_config(profile.model),
                                   _uncapped_coef(profile))
    except (CatalogError, ModelConfigError):
        return None


def _uncapped_coef(profile: GpuProfile) -> tuple[float, ...]:
    base = profile.power.get("uncapped_step_coef") if profile.power else None
    return tuple(float(x) for x in base) if base is not None else profile.step_coef


def capped_profile(profile: GpuProfile, cap_w: float | None) -> GpuProfile:
    """The profile whose step coefficients include the slowdown under ``cap_w`` (from the
    uncapped ones, so capping twice does not compound); ``None`` removes a cap."""
    pm = power_model_for(profile)
    if pm is None:
        raise PowerModelError(f"power_cap_w: profile {profile.name!r} has no power model (GPU "
                              f"{profile.gpu!r} or model {profile.model!r} is not in the catalog)")
    base = _uncapped_coef(profile)
    sc, sm = pm.clock_scale(cap_w), pm.memory_clock_scale(cap_w)
    coef = tuple(c * (1.0 - fc - fm + fc / sc + fm / sm)
                 for c, fc, fm in zip(base, pm.compute_share, pm.memory_share()))
    power = pm.to_dict()
    if cap_w is not None:
        power["cap_w"] = float(cap_w)
        power["uncapped_step_coef"] = list(base)
    return replace(profile, step_coef=coef, power=power)


def profile_cap(profile: GpuProfile) -> float | None:
    """The cap a profile's coefficients already include (``capped_profile``), if any."""
    cap = profile.power.get("cap_w") if profile.power else None
    return float(cap) if cap is not None else None


@dataclass(frozen=True)
class RunPower:
    """Power and energy of one simulated run."""

    compute_busy_s: float
    memory_busy_s: float
    gpu_busy_frac: float
    avg_power_w: float
    energy_j: float


def run_power(pm: PowerModel, step_coef: Sequence[float], design_sums: np.ndarray,
              duration_s: float, cap_w: float | None) -> RunPower:
    """Power of a run from its summed step-time design columns (``twin.kernel`` stats) and
    the coefficients it ran with."""
    idx = list(LINEAR_IDX)
    t_ms = np.asarray(step_coef, dtype=np.float64)[idx] * np.asarray(design_sums, np.float64)
    tc = float(np.sum(t_ms * np.asarray(pm.compute_share)[idx])) / 1e3
    tm = float(np.sum(t_ms * np.asarray(pm.memory_share())[idx])) / 1e3
    p = pm.power_w(tc / duration_s, tm / duration_s, cap_w)
    return RunPower(tc, tm, min((tc + tm) / duration_s, 1.0), p, p * duration_s)


# ------------------------------------------------------------------------ nvidia-smi calibration
@dataclass(frozen=True)
class PowerFit:
    """A power model fitted on an nvidia-smi log, with its fit quality."""

    model: PowerModel
    n_samples: int
    rmse_w: float
    clock_exponent_fitted: bool


_COLS = {"power.draw": "power", "utilization.gpu": "util", "clocks.sm": "clock"}


def read_nvidia_smi_log(path: str | Path) -> dict[str, np.ndarray]:
    """Parse ``nvidia-smi --query-gpu=timestamp,power.draw,utilization.gpu,clocks.sm
    --format=csv`` output (units in the header or the cells, e.g. '312.4 W', '87 %')."""
    p = Path(path)
    where = f"--nvidia-smi {str(p)!r}"
    try:
        rows = list(csv.reader(p.read_text(encoding="utf-8").splitlines()))
    except (OSError, UnicodeDecodeError) as e:
        raise PowerModelError(f"{where}: cannot read ({e})") from None
    if not rows:
        raise PowerModelError(f"{where}: empty file")
    header = [h.strip().split(" [")[0] for h in rows[0]]
    idx = {}
    for col, key in _COLS.items():
        if col not in header:
            raise PowerModelError(f"{where}: column {col!r} missing (header: {rows[0]}); log with "
                                  "nvidia-smi --query-gpu=timestamp,power.draw,utilization.gpu,"
                                  "clocks.sm --format=csv")
        idx[key] = header.index(col)
    out: dict[str, list[float]] = {k: [] for k in idx}
    for i, row in enumerate(rows[1:], start=2):
        if not any(c.strip() for c in row):
            continue
        try:
            vals = {k: float(row[j].strip().split(" ")[0]) for k, j in idx.items()}
        except (ValueError, IndexError):
            raise PowerModelError(f"{where}: line {i}: expected numbers in columns "
                                  f"{', '.join(_COLS)}, got {row}") from None
        if not all(math.isfinite(v) and v >= 0 for v in vals.values()):
            raise PowerModelError(f"{where}: line {i}: negative or non-finite value in {row}")
        for k, v in vals.items():
            out[k].append(v)
    if len(out["power"]) < 5:
        raise PowerModelError(f"{where}: {len(out['power'])} samples; at least 5 are needed")
    return {k: np.asarray(v) for k, v in out.items()}


def fit_power_model(log: Mapping[str, np.ndarray], base: PowerModel,
                    load: str = "compute") -> PowerFit:
    """Fit P = P_idle + (P_busy - P_idle) u^alpha on the samples (u = utilization.gpu), and the
    clock exponent gamma on busy samples (u >= 0.9) whose SM clock varies (power-capped or
    throttled phases): (P - P_idle) / (P_busy - P_idle) = (f / f_max)^gamma. Busy samples below
    97 % of the top SM clock are left out of the utilisation fit; without such samples gamma
    keeps ``base``'s value.

    ``load`` says what the log's busy phase ran: ``"compute"`` (a compute-bound load such as
    long prefills or a burn test) sets P_max = P_busy; ``"decode"`` (a decode-heavy serving
    run, memory-bound) keeps ``base``'s P_max and sets memory_power_frac = (P_busy - P_idle) /
    (P_max - P_idle). The step-term shares stay ``base``'s."""
    if load not in ("compute", "decode"):
        raise PowerModelError(f"--load: must be 'compute' or 'decode', got {load!r}")
    from scipy.optimize import least_squares

    u_all = np.clip(log["util"] / 100.0, 0.0, 1.0)
    clock = log["clock"]
    # busy samples at reduced SM clocks (capped or throttled) belong to the clock fit only
    reduced = (u_all >= 0.9) & (clock < 0.97 * clock.max())
    u, pw = u_all[~reduced], log["power"][~reduced]
    if len(u) < 5 or u.max() - u.min() < 0.2:
        raise PowerModelError("--nvidia-smi: utilization.gpu spans less than 20 points; log an "
                              "idle phase and a loaded phase to fit the power curve")

    def resid(x: np.ndarray) -> np.ndarray:
        idle, top, alpha = x
        return idle + (top - idle) * u ** alpha - pw

    x0 = [float(pw[u <= np.quantile(u, 0.1)].mean()), float(pw.max()), 1.0]
    x0[1] = max(x0[1], x0[0] + 1.0)
    res = least_squares(resid, x0, bounds=([0.0, 0.0, 0.2], [np.inf, np.inf, 3.0]))
    idle, top, alpha = (float(v) for v in res.x)
    if not idle < top:
        raise PowerModelError("--nvidia-smi: the fitted idle power is not below the fitted "
                              "maximum; the log does not show power rising with utilisation")
    gamma, fitted = base.clock_exponent, False
    busy = u_all >= 0.9
    clk = clock[busy]
    if busy.sum() >= 10 and clk.max() > 0 and clk.min() < 0.9 * clk.max():
        f = clk / clk.max()
        y = (log["power"][busy] - idle) / (top - idle)
        ok = (f > 0) & (y > 0)
        if ok.sum() >= 5:
            g = float(np.sum(np.log(f[ok]) * np.log(y[ok])) / np.sum(np.log(f[ok]) ** 2))
            if math.isfinite(g) and g > 0:
                gamma, fitted = max(g, alpha), True
    src = f"fitted on an nvidia-smi log ({len(u_all)} samples, {load} load)"
    if load == "compute":
        pm = replace(base, idle_w=idle, max_w=top, alpha=min(alpha, gamma),
                     clock_exponent=gamma, source=src)
    else:
        if not idle < top <= base.max_w:
            raise PowerModelError(f"--nvidia-smi: the decode load's busy power {top:.0f} W is not "
                                  f"between the fitted idle {idle:.0f} W and the GPU's maximum "
                                  f"{base.max_w:.0f} W")
        pm = replace(base, idle_w=idle, alpha=min(alpha, gamma), clock_exponent=gamma,
                     memory_power_frac=(top - idle) / (base.max_w - idle), source=src)
    rmse = float(np.sqrt(np.mean(resid(np.array([idle, top, alpha])) ** 2)))
    return PowerFit(pm, len(u_all), rmse, fitted)
