"""Power model (twin.power): caps, energy metrics, nvidia-smi calibration."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from twin.power import (PowerModel, PowerModelError, capped_profile, fit_power_model,
                        power_model_for, read_nvidia_smi_log)
from twin.profile import load_profile
from twin.server import ServerConfig, simulate_server
from twin.workload import Adapter

WORKLOADS = {   # (rate per adapter, adapters, Amax): light, loaded, saturated
    "light": (0.05, 48, 16), "loaded": (0.5, 64, 32), "saturated": (2.0, 32, 16),
}


def _run(profile, workload, cap, duration=300.0):
    rate, n, amax = WORKLOADS[workload]
    ads = [Adapter(f"a{i}", 8 if i % 2 else 16, rate) for i in range(n)]
    return simulate_server(profile, ads, ServerConfig(max_loras=amax, power_cap_w=cap),
                           duration, seed=5)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(profile=st.sampled_from(["llama-3.1-8b-instruct", "qwen-2.5-7b-instruct"]),
       workload=st.sampled_from(sorted(WORKLOADS)),
       caps=st.lists(st.sampled_from([None, 700.0, 600.0, 450.0, 300.0, 160.0]), min_size=2,
                     max_size=2, unique=True))
def test_a_lower_cap_never_raises_throughput_or_power(profile, workload, caps):
    prof = load_profile(profile)
    hi, lo = sorted(caps, key=lambda c: math.inf if c is None else c, reverse=True)
    m_hi, m_lo = _run(prof, workload, hi), _run(prof, workload, lo)
    assert m_lo.throughput_tps <= m_hi.throughput_tps + 1e-9
    assert m_lo.avg_power_w <= m_hi.avg_power_w + 1e-9
    assert m_lo.mean_itl_ms >= m_hi.mean_itl_ms - 1e-9 or m_lo.mean_itl_ms != m_lo.mean_itl_ms


@pytest.mark.parametrize("cap", [None, 400.0])
def test_energy_is_average_power_times_window(cap):
    m = _run(load_profile("llama-3.1-8b-instruct"), "loaded", cap)
    pm = power_model_for(load_profile("llama-3.1-8b-instruct"))
    assert pm.idle_w < m.avg_power_w <= (cap or pm.max_w)
    assert 0.0 < m.gpu_busy_frac <= 1.0
    assert m.energy_j == pytest.approx(m.avg_power_w * m.duration_s, rel=1e-12)
    assert m.joules_per_token == pytest.approx(m.energy_j / (m.throughput_tps * m.duration_s))
    assert m.joules_per_output_token > m.joules_per_token


def test_capping_is_idempotent_and_uncapped_above_max_power():
    p = load_profile("llama-3.1-8b-instruct")
    pm = power_model_for(p)
    c300 = capped_profile(p, 300.0)
    assert capped_profile(c300, 300.0) == c300                   # never compounds
    assert capped_profile(c300, None).step_coef == p.step_coef   # a cap can be lifted
    assert capped_profile(p, pm.max_w + 50).step_coef == p.step_coef
    s = pm.clock_scale(350.0)
    assert s == pytest.approx(((350 - pm.idle_w) / (pm.max_w - pm.idle_w)) ** (1 / 3))
    assert pm.memory_power_w < 350.0          # so only compute-bound terms slow at 350 W
    for j, (a, b) in enumerate(zip(p.step_coef, capped_profile(p, 350.0).step_coef)):
        assert b == pytest.approx(a / s if pm.compute_share[j] else a, rel=1e-12)
    # memory-bound work slows only once the cap is below its power
    c250 = capped_profile(p, 250.0)
    sm = pm.memory_clock_scale(250.0)
    assert pm.memory_clock_scale(400.0) == 1.0 and sm < 1.0
    assert c250.step_coef[3] == pytest.approx(p.step_coef[3] / sm)          # KV reads
    assert c250.step_coef[2] == p.step_coef[2]                              # CPU term


def test_bad_caps_are_refused():
    p = load_profile("llama-3.1-8b-instruct")
    with pytest.raises(ValueError, match="power_cap_w"):
        ServerConfig(max_loras=8, power_cap_w=-5)
    with pytest.raises(ValueError, match="power_cap_w"):
        ServerConfig(max_loras=8, power_cap_w=float("nan"))
    with pytest.raises(PowerModelError, match="idle power"):
        capped_profile(p, 50.0)
    r = subprocess.run([sys.executable, "-m", "twin", "run", "--power-cap", "20",
                        "--duration", "10"], capture_output=True, text=True)
    assert r.returncode == 2 and "--power-cap" in r.stderr and "Traceback" not in r.stderr


def test_a_profile_without_power_model_reports_no_power():
    p = replace(load_profile("llama-3.1-8b-instruct"), gpu="unknown-gpu")
    assert power_model_for(p) is None
    m = _run(p, "light", None, duration=60.0)
    assert math.isnan(m.avg_power_w) and math.isnan(m.energy_j)
    with pytest.raises(PowerModelError, match="no power model"):
        capped_profile(p, 300.0)


def test_power_model_validation_names_the_field():
    good = power_model_for(load_profile("llama-3.1-8b-instruct")).to_dict()
    for patch, field in (({"idle_w": 800}, "idle_w"), ({"alpha": 4.0}, "alpha"),
                         ({"max_w": -1}, "max_w"), ({"compute_share": [2] * 13}, "compute_share"),
                         ({"memory_power_frac": 1.5}, "memory_power_frac"),
                         ({"compute_share": [1.0] * 13}, "compute_share")):
        with pytest.raises(PowerModelError, match=field):
            PowerModel.from_dict({**good, **patch})


def _synthetic_log(path, idle=80.0, top=650.0, alpha=1.3, gamma=2.5, seed=0):
    """nvidia-smi CSV of a GPU following the model: a utilisation sweep at full clocks and a
    capped phase at full load with reduced SM clocks."""
    rng = np.random.default_rng(seed)
    lines = ["timestamp, power.draw [W], utilization.gpu [%], clocks.sm [MHz]"]
    for u in np.linspace(0, 100, 60):
        p = idle + (top - idle) * (u / 100) ** alpha + rng.normal(0, 3)
        lines.append(f"2026/11/30 10:00:00.000, {p:.2f} W, {u:.0f} %, 1980 MHz")
    for f in np.linspace(0.6, 1.0, 20):
        p = idle + (top - idle) * f ** gamma + rng.normal(0, 3)
        lines.append(f"2026/11/30 10:01:00.000, {p:.2f} W, 100 %, {1980 * f:.0f} MHz")
    path.write_text("\n".join(lines) + "\n")


def test_calibrate_power_recovers_a_known_model(tmp_path):
    log = tmp_path / "smi.csv"
    _synthetic_log(log)
    base = power_model_for(load_profile("llama-3.1-8b-instruct"))
    fit = fit_power_model(read_nvidia_smi_log(log), base)
    assert fit.model.idle_w == pytest.approx(80, abs=6)
    assert fit.model.max_w == pytest.approx(650, abs=10)
    assert fit.model.alpha == pytest.approx(1.3, abs=0.15)
    assert fit.clock_exponent_fitted and fit.model.clock_exponent == pytest.approx(2.5, abs=0.3)
    assert fit.rmse_w < 10


def test_calibrate_power_on_a_decode_load_sets_the_memory_bound_power(tmp_path):
    log = tmp_path / "decode.csv"
    _synthetic_log(log, idle=90.0, top=320.0)
    base = power_model_for(load_profile("llama-3.1-8b-instruct"))
    fit = fit_power_model(read_nvidia_smi_log(log), base, load="decode")
    assert fit.model.max_w == base.max_w
    assert fit.model.memory_power_w == pytest.approx(320, abs=10)
    with pytest.raises(PowerModelError, match="--load"):
        fit_power_model(read_nvidia_smi_log(log), base, load="prefill")


def test_calibrate_power_cli_writes_profile_and_rejects_bad_logs(tmp_path):
    log = tmp_path / "smi.csv"
    _synthetic_log(log)
    out = tmp_path / "llama_measured_power.json"
    r = subprocess.run([sys.executable, "-m", "twin", "calibrate-power", "--nvidia-smi", str(log),
                        "--out", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    pw = json.loads(out.read_text())["power"]
    assert pw["max_w"] == pytest.approx(650, abs=10) and "nvidia-smi" in pw["source"]
    p = load_profile(str(out))
    assert power_model_for(p).max_w == pw["max_w"]
    bad = tmp_path / "bad.csv"
    bad.write_text("timestamp, power.draw [W]\n2026, 100 W\n")
    r = subprocess.run([sys.executable, "-m", "twin", "calibrate-power", "--nvidia-smi", str(bad),
                        "--out", str(tmp_path / "x.json")], capture_output=True, text=True)
    assert r.returncode == 2 and "utilization.gpu" in r.stderr and "Traceback" not in r.stderr
