"""Non-stationary arrivals: empirical rates match the integral of the intensity, seeds repeat,
workload files are checked field by field."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from twin.arrivals import (ActiveWindow, Diurnal, FlashCrowd, MarkovModulatedArrivals,
                           ProductShape, ShapedArrivals, StepDrift, WorkloadError, load_workload,
                           workload_from_dict)
from twin.arrivals import arrival_process_from_dict
from twin.workload import GammaArrivals, PoissonArrivals

T = 2000.0
RATE = 5.0

SHAPES = {
    "diurnal": Diurnal(0.8, 700.0, 100.0),
    "step": StepDrift((500.0, 1200.0), (0.5, 2.0, 1.0)),
    "flash_crowd": FlashCrowd(600.0, 6.0, rise_s=30.0, hold_s=120.0, decay_s=200.0),
    "window": ActiveWindow(300.0, 1500.0),
    "product": ProductShape((Diurnal(0.5, 900.0), FlashCrowd(800.0, 3.0, 0.0, 100.0, 50.0),
                             ActiveWindow(100.0, math.inf))),
}


def _check_counts(times: np.ndarray, expected: np.ndarray, edges: np.ndarray) -> None:
    """Counts per bin within 4.5 Poisson standard deviations (+1) of their expectation."""
    counts = np.histogram(times, edges)[0]
    assert np.all(np.abs(counts - expected) <= 4.5 * np.sqrt(expected) + 1), (counts, expected)


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_shaped_poisson_rate_matches_the_integral(name):
    shape = SHAPES[name]
    proc = ShapedArrivals(PoissonArrivals(), shape)
    edges = np.linspace(0.0, T, 21)
    expected = np.array([RATE * shape.integral(a, b) for a, b in zip(edges, edges[1:])])
    t = proc.sample_times(RATE, T, 7)
    assert np.all(np.diff(t) >= 0) and (t.size == 0 or (t[0] >= 0 and t[-1] < T))
    _check_counts(t, expected, edges)
    total = RATE * shape.integral(0.0, T)
    assert abs(len(t) - total) <= 4.5 * math.sqrt(total)


def test_integrals_are_exact_where_closed_form():
    d = Diurnal(0.5, 100.0)
    assert d.integral(0, 100) == pytest.approx(100.0)
    assert d.integral(0, 50) == pytest.approx(50 + 0.5 * 100 / math.pi)
    s = StepDrift((10.0,), (1.0, 3.0))
    assert s.integral(0, 20) == pytest.approx(40.0)
    f = FlashCrowd(10.0, 5.0, rise_s=10.0, hold_s=10.0, decay_s=10.0)
    assert f.integral(0, 50) == pytest.approx(50 + 4 * 10 / 2 + 4 * 10 + 4 * 10 / 2)
    w = ActiveWindow(5.0, 15.0)
    assert w.integral(0, 10) == 5.0 and w.integral(20, 30) == 0.0
    p = ProductShape((StepDrift((10.0,), (1.0, 3.0)), ActiveWindow(5.0, 15.0)))
    assert p.integral(0, 20) == pytest.approx(5 + 15, rel=1e-4)


def test_mmpp_long_run_rate_and_burstiness():
    proc = MarkovModulatedArrivals(calm=1.0, burst=10.0, calm_s=60.0, burst_s=15.0)
    t = proc.sample_times(RATE, 20 * T, 3)
    horizon = 20 * T
    expected = RATE * horizon
    # the count is overdispersed: sd from the burst state's occupation time (two-state chain,
    # Var ~ 2ab T / (a+b)^3) times the rate gap, plus the Poisson part
    a, b = 1 / 60.0, 1 / 15.0
    lo, hi = proc.state_rates(RATE)
    sd = math.sqrt((hi - lo) ** 2 * 2 * a * b * horizon / (a + b) ** 3 + expected)
    assert abs(len(t) - expected) < 4.5 * sd
    counts = np.histogram(t, np.arange(0, 20 * T + 1, 10.0))[0]
    assert counts.var() / counts.mean() > 3          # bursty: far above Poisson's 1
    # the two states' rates keep the long-run mean
    lo, hi = proc.state_rates(RATE)
    p = proc.burst_probability
    assert (1 - p) * lo + p * hi == pytest.approx(RATE)


def test_mmpp_mean_over_seeds_is_exact():
    proc = MarkovModulatedArrivals(calm=0.5, burst=4.0, calm_s=30.0, burst_s=10.0)
    n = [len(proc.sample_times(2.0, 200.0, s)) for s in range(300)]
    se = np.std(n) / math.sqrt(len(n))
    assert abs(np.mean(n) - 400.0) < 4.5 * se


def test_same_seed_same_arrivals_other_seed_differs():
    proc = ShapedArrivals(MarkovModulatedArrivals(1.0, 5.0, 50.0, 10.0), SHAPES["product"])
    a, b, c = (proc.sample_times(RATE, T, s) for s in (11, 11, 12))
    np.testing.assert_array_equal(a, b)
    assert len(a) != len(c) or not np.array_equal(a, c)


def _spec(**over):
    d = {"duration_s": 600.0,
         "rate_shape": {"kind": "diurnal", "amplitude": 0.5, "period_s": 300.0},
         "adapters": [
             {"id": "a", "rank": 16, "rate": 2.0},
             {"id": "b", "rank": 8, "rate": 1.0, "active_s": [200.0, 400.0]},
             {"id": "c", "rank": 16, "rate": 1.0,
              "rate_shape": {"kind": "flash_crowd", "start_s": 100.0, "peak": 8.0,
                             "hold_s": 60.0},
              "arrivals": {"kind": "markov_modulated", "calm": 1.0, "burst": 4.0, "calm_s": 20.0,
                           "burst_s": 5.0}}]}
    d.update(over)
    return d


def test_workload_generation_is_seeded_and_follows_the_shapes():
    w = workload_from_dict(_spec())
    r1, r2 = w.generate(5), w.generate(5)
    np.testing.assert_array_equal(r1.arrival_s, r2.arrival_s)
    np.testing.assert_array_equal(r1.input_len, r2.input_len)
    b = r1.arrival_s[r1.adapter == 1]
    assert b.size > 0 and b.min() >= 200.0 and b.max() < 400.0      # arrival and retirement
    # mean rates per window (the re-planner's view): b absent outside its window
    assert [a.id for a in w.mean_rates(0.0, 200.0)] == ["a", "c"]
    win = {a.id: a.rate for a in w.mean_rates(200.0, 400.0)}
    assert win["b"] == pytest.approx(1.0 * Diurnal(0.5, 300.0).integral(200, 400) / 200, rel=1e-3)
    # expected total over many seeds matches the integrals
    expected = sum(s.expected_count(0, 600.0) for s in w.streams)
    n = [len(w.generate(s)) for s in range(60)]
    assert abs(np.mean(n) - expected) < 4.5 * np.std(n) / math.sqrt(len(n)) + 1


def test_adapter_streams_do_not_depend_on_other_adapters():
    w1 = workload_from_dict(_spec())
    spec = _spec()
    spec["adapters"][1]["rate"] = 3.0
    w2 = workload_from_dict(spec)
    r1, r2 = w1.generate(9), w2.generate(9)
    np.testing.assert_array_equal(r1.arrival_s[r1.adapter == 0], r2.arrival_s[r2.adapter == 0])


def test_trace_workload_replays_the_trace(tmp_path):
    (tmp_path / "t.csv").write_text("arrival_s,adapter_id,input_tokens,output_tokens,rank\n"
                                    "0.5,x,10,5,8\n0.1,y,20,6,16\n700,x,3,3,8\n")
    (tmp_path / "w.json").write_text(json.dumps({"duration_s": 600, "trace": "t.csv"}))
    w = load_workload(tmp_path / "w.json")
    r = w.generate(0)
    assert [a.id for a in w.adapters] == ["x", "y"] and len(r) == 2     # 700 s is past the end
    np.testing.assert_array_equal(r.arrival_s, [0.1, 0.5])
    assert {a.id: a.rate for a in w.mean_rates(0, 1)} == {"y": 1.0, "x": 1.0}


def test_arrival_process_from_dict_knows_the_new_kinds():
    p = arrival_process_from_dict({"kind": "markov_modulated", "calm": 1, "burst": 2, "calm_s": 3,
                                   "burst_s": 4})
    assert isinstance(p, MarkovModulatedArrivals)
    s = arrival_process_from_dict({"kind": "shaped", "base": {"kind": "gamma", "cv": 2.0},
                                   "shape": {"kind": "step", "at_s": [1], "multipliers": [1, 2]}})
    assert isinstance(s.base, GammaArrivals)
    assert arrival_process_from_dict(s.describe()) == s


@pytest.mark.parametrize("change,needle", [
    ({"duration_s": -1}, "workload.duration_s: must be > 0"),
    ({"extra": 1}, "unknown field(s) ['extra']"),
    ({"adapters_csv": "x.csv"}, "exactly one of 'adapters', 'adapters_csv', 'trace'"),
    ({"rate_shape": {"kind": "diurnal", "amplitude": 2, "period_s": 1}},
     "workload.rate_shape.amplitude: must be <= 1"),
    ({"rate_shape": {"kind": "sine"}}, "workload.rate_shape.kind: unknown shape 'sine'"),
    ({"rate_shape": {"kind": "step", "at_s": [1, 2], "multipliers": [1]}},
     "workload.rate_shape.multipliers: needs len(at_s) + 1 = 3 values"),
    ({"rate_shape": {"kind": "flash_crowd", "peak": 2}}, "missing field(s) ['start_s']"),
    ({"arrivals": {"kind": "markov_modulated", "calm": 1, "burst": 2, "calm_s": 0, "burst_s": 1}},
     "workload.arrivals.calm_s: must be > 0"),
    ({"adapters": [{"id": "a", "rank": 16}]}, "workload.adapters[0]: missing field 'rate'"),
    ({"adapters": [{"id": "a", "rank": 16, "rate": 1, "active_s": [5, 2]}]},
     "workload.adapters[0].active_s: must be > t_on_s"),
    ({"adapters": [{"id": "a", "rank": 16, "rate": 1}, {"id": "a", "rank": 8, "rate": 1}]},
     "workload.adapters[1].id: duplicate adapter id 'a'"),
    ({"adapters": [{"id": "a", "rank": 16, "rate": -1}]}, "rate must be > 0"),
])
def test_bad_workloads_name_the_field(change, needle):
    with pytest.raises(WorkloadError) as e:
        workload_from_dict(_spec(**change))
    assert needle in str(e.value)


def test_bad_workload_file_names_the_file(tmp_path):
    p = tmp_path / "w.json"
    p.write_text("{not json")
    with pytest.raises(WorkloadError, match="w.json: invalid JSON"):
        load_workload(p)
    with pytest.raises(WorkloadError, match="workload file not found"):
        load_workload(tmp_path / "missing.json")
    p.write_text(json.dumps({"duration_s": 10, "trace": "none.csv"}))
    with pytest.raises(WorkloadError, match=r"w.json.trace: none.csv: trace file not found"):
        load_workload(p)


def test_shipped_example_workload_loads():
    from pathlib import Path
    w = load_workload(Path(__file__).resolve().parents[1] / "instances" / "routing"
                      / "drifting_day.json")
    night = {a.id for a in w.mean_rates(0.0, 3600.0)}
    evening = {a.id: a.rate for a in w.mean_rates(14 * 3600.0, 15 * 3600.0)}
    assert "legacy" in night and "new-model" not in night          # arrival and retirement
    assert "legacy" not in evening and "new-model" in evening
    assert evening["launch-day"] > 10 * 0.2                        # the flash crowd
