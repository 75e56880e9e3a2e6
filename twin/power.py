"""Power model of one GPU serving with the twin: power vs utilisation, slowdown under a cap.

Form (documented, replaceable by measurements with ``python -m twin calibrate-power``):

* **Utilisation** u = GPU-busy seconds / window, the quantity ``nvidia-smi`` reports as
  ``utilization.gpu`` (the fraction of time a kernel runs). The twin knows each step's time
  split into the terms of ``twin.step_time``; ``gpu_busy_share[j]`` is the share of term j
  spent in GPU kernels (1 for compute and memory terms; 0 for scheduler/CPU terms c2, c4, c9;
  for c0 the weight-read part weights / HBM bandwidth of it). Summing coefficient x the run's
  summed design column x share gives the busy seconds, with no change to the kernel.
* **Power vs utilisation**: P = P_idle + (P_busy - P_idle) x u^alpha, with P_busy = P_max (the
  TDP) uncapped. The idle-plus-linear form (alpha = 1) is the standard server power model (Fan,
  Weber, Barroso, "Power provisioning for a warehouse-sized computer", ISCA 2007,
  https://doi.org/10.1145/1250662.1250665, which also fits an exponent); alpha is fitted from an
  nvidia-smi log by ``calibrate-power``.
* **Power cap** C (``ServerConfig.power_cap_w``, ``twin run --power-cap``): the GPU lowers its
  SM clock until busy power fits. Dynamic power grows as clock^gamma (f x V^2 with V roughly
  proportional to f under DVFS: gamma = 3; fitted by ``calibrate-power`` when the log holds
  clocks at full load), so the clock scale is s = ((C - P_idle) / (P_max - P_idle))^(1/gamma)
  (1 when C >= P_max). Compute-bound step terms (``compute_share``: c1 per token, c6 per token
  x slot, c11 per request above the knee) take 1/s as long; memory-bound and CPU terms do not
  (HBM bandwidth does not follow the SM clock). Busy power at the cap is min(C, P_max).

So a lower cap never shortens a step, and energy per unit of compute work falls as
s^(gamma-1): the trade the literature measures (power-capped inference serving more tokens per
joule at a modest slowdown).
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
    gpu_busy_share: tuple[float, ...] = tuple([0.0] * N_STEP_COEF)
    compute_share: tuple[float, ...] = tuple([0.0] * N_STEP_COEF)
    source: str = ""

    def __post_init__(self) -> None:
        _check(self.to_dict(), "power model")

    def clock_scale(self, cap_w: float | None) -> float:
        """SM clock fraction s in (0, 1] the GPU runs at under ``cap_w`` (1 uncapped)."""
        if cap_w is None or cap_w >= self.max_w:
            return 1.0
        check_cap(cap_w, self)
        return ((cap_w - self.idle_w) / (self.max_w - self.idle_w)) ** (1.0 / self.clock_exponent)

    def busy_power_w(self, cap_w: float | None = None) -> float:
        """Power while kernels run: P_max, or the cap when it is lower."""
        return self.max_w if cap_w is None else min(float(cap_w), self.max_w)

    def power_w(self, utilisation: float, cap_w: float | None = None) -> float:
        """Average power at GPU-busy fraction ``utilisation`` (clipped to [0, 1])."""
        u = min(max(float(utilisation), 0.0), 1.0)
        return self.idle_w + (self.busy_power_w(cap_w) - self.idle_w) * u ** self.alpha

    def to_dict(self) -> dict[str, Any]:
        return {"idle_w": self.idle_w, "max_w": self.max_w, "alpha": self.alpha,
                "clock_exponent": self.clock_exponent,
                "gpu_busy_share": list(self.gpu_busy_share),
                "compute_share": list(self.compute_share), "source": self.source}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "power model") -> "PowerModel":
        _check(d, where)
        keep = {k: d[k] for k in ("idle_w", "max_w", "alpha", "clock_exponent", "source")
                if k in d}
        return cls(gpu_busy_share=tuple(float(x) for x in d["gpu_busy_share"]),
                   compute_share=tuple(float(x) for x in d["compute_share"]), **keep)


def _check(d: Mapping[str, Any], where: str) -> None:
    def num(k: str) -> float:
        v = d.get(k)
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
    for k in ("gpu_busy_share", "compute_share"):
        v = d.get(k)
        if not isinstance(v, (list, tuple)) or len(v) != N_STEP_COEF or not all(
                isinstance(x, (int, float)) and not isinstance(x, bool) and 0.0 <= x <= 1.0
                for x in v):
            raise PowerModelError(f"{where}: field {k!r}: must be {N_STEP_COEF} numbers in [0, 1]")


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
                      source=source or f"catalog {gpu.id} (idle_w, tdp_w); alpha and "
                                       "clock_exponent defaults (twin.power)")


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
    s = pm.clock_scale(cap_w)
    coef = tuple(c * (1.0 - f + f / s) for c, f in zip(base, pm.compute_share))
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

    gpu_busy_s: float
    utilisation: float
    avg_power_w: float
    energy_j: float


def run_power(pm: PowerModel, step_coef: Sequence[float], design_sums: np.ndarray,
              duration_s: float, cap_w: float | None) -> RunPower:
    """Power of a run from its summed step-time design columns (``twin.kernel`` stats)."""
    coef = np.asarray(step_coef, dtype=np.float64)
    share = np.asarray(pm.gpu_busy_share, dtype=np.float64)
    idx = list(LINEAR_IDX)
    busy_ms = float(np.sum(coef[idx] * np.asarray(design_sums, dtype=np.float64) * share[idx]))
    u = min(max(busy_ms / 1e3 / duration_s, 0.0), 1.0)
    p = pm.power_w(u, cap_w)
    return RunPower(busy_ms / 1e3, u, p, p * duration_s)


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


def fit_power_model(log: Mapping[str, np.ndarray], base: PowerModel) -> PowerFit:
    """Fit P_idle, P_max and alpha of P = P_idle + (P_max - P_idle) u^alpha on the samples, and
    the clock exponent gamma on busy samples (u >= 0.9) whose SM clock varies (power-capped or
    throttled phases): (P - P_idle) / (P_max - P_idle) = (f / f_max)^gamma. Busy samples below
    97 % of the top SM clock are left out of the utilisation fit. Without such samples gamma
    keeps ``base``'s value. The step-term shares stay ``base``'s."""
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
    pm = replace(base, idle_w=idle, max_w=top, alpha=min(alpha, gamma), clock_exponent=gamma,
                 source=f"fitted on an nvidia-smi log ({len(pw)} samples)")
    rmse = float(np.sqrt(np.mean(resid(np.array([idle, top, alpha])) ** 2)))
    return PowerFit(pm, len(u_all), rmse, fitted)
