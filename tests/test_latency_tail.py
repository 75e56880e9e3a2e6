"""The client-side latency model (twin.latency_tail): its constants come from the fit on the
shared max-search runs, a profile without constants reports the engine's latencies unchanged,
and the model never moves throughput, mean ITL, TPOT or step counts."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from twin import kernel as K
from twin import latency_tail as LT
from twin import latency_tail_fit as LTF
from twin.sharegpt import default_lengths
from twin.metrics import _hist_quantile, compute_metrics
from twin.profile import load_profile
from twin.server import ServerConfig, run_kernel, simulate_server
from twin.workload import Adapter, generate_requests

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "vllm_h100"
LLAMA = "llama-3.1-8b-instruct"
# quantities the model may change; every other RunMetrics field must stay as the engine's
LATENCY_FIELDS = {"p50_itl_ms", "p99_itl_ms", "mean_ttft_ms", "p50_ttft_ms", "p99_ttft_ms",
                  "ttft_paper_ms", "wall_s", "slo"}


def _run(profile_name: str = LLAMA, n_adapters: int = 24, amax: int = 8, rate: float = 0.4,
         duration: float = 300.0, seed: int = 3):
    prof = load_profile(profile_name)
    ads = [Adapter(f"a{i}", (8, 16)[i % 2], rate) for i in range(n_adapters)]
    reqs = generate_requests(ads, duration, default_lengths(), seed=seed)
    sc = ServerConfig(max_loras=amax)
    run = run_kernel(prof, ads, reqs, sc, duration)
    return prof, ads, reqs, sc, run, duration


def _metrics(prof, reqs, run, duration, **kw):
    return compute_metrics(reqs.arrival_s, reqs.input_len, reqs.output_len, run.first_t,
                           run.finish_t, run.stats, run.itl_hist, duration, 1000.0,
                           run.kv_blocks, prof.block_size, **kw)


def _tail(**over) -> LT.LatencyTail:
    base = dict(ttft_base_ms=5.0, ttft_per_running_ms=0.2, ttft_per_adapter_ms=0.05,
                cold_start_ms=300.0, itl_delay_prob=0.05, itl_delay_ms=100.0,
                itl_delay_half_running=20.0, itl_delay_adapter_exp=0.7)
    base.update(over)
    return LT.LatencyTail(**base)


@pytest.mark.skipif(not (SHARED / LTF.MAXSEARCH_CSV).exists(),
                    reason=f"the shared max-search runs are absent ({SHARED / LTF.MAXSEARCH_CSV}):"
                           " the committed constants cannot be refitted here")
def test_committed_constants_are_the_fit_on_the_max_search_runs():
    """Refit from the shared runs (replays every max-search run, a few minutes) and compare
    with twin/profiles/latency_tail.json."""
    committed = LT.latency_tail_for(LLAMA)
    assert committed is not None, "no constants committed for the Llama profile"
    samples = LTF.replay_maxsearch(SHARED, LLAMA, progress=False, workers=2)
    assert len(samples) > 300
    tail, report = LTF.fit_latency_tail(samples)
    for f in dataclasses.fields(LT.LatencyTail):
        assert getattr(tail, f.name) == pytest.approx(getattr(committed, f.name), rel=1e-3,
                                                      abs=1e-6), f.name
    # the fit improves what it fits
    assert report["p99_itl_smape"][1] < report["p99_itl_smape"][0]
    assert report["mean_ttft_smape_unstarved"][1] < report["mean_ttft_smape_unstarved"][0]


def test_without_constants_the_metrics_are_the_plain_ones():
    prof, ads, reqs, sc, run, dur = _run()
    plain = _metrics(prof, reqs, run, dur)
    none = _metrics(prof, reqs, run, dur, adapter=reqs.adapter, latency_tail=None)
    assert plain.to_dict() == none.to_dict()
    assert plain.p99_itl_ms == _hist_quantile(run.itl_hist, 0.99)
    # a profile with no fitted constants (the Qwen one: only Llama runs were measured end to
    # end) simulates exactly as the plain computation
    assert LT.latency_tail_for("qwen-2.5-7b-instruct") is None
    assert LT.latency_tail_for("no-such-profile") is None
    q = load_profile("qwen-2.5-7b-instruct")
    ads = [Adapter(f"q{i}", 16, 0.3) for i in range(12)]
    m = simulate_server(q, ads, ServerConfig(max_loras=4), 300.0, seed=1)
    reqs = generate_requests(ads, 300.0, default_lengths(), seed=1)
    run = run_kernel(q, ads, reqs, ServerConfig(max_loras=4), 300.0)
    ref = compute_metrics(reqs.arrival_s, reqs.input_len, reqs.output_len, run.first_t,
                          run.finish_t, run.stats, run.itl_hist, 300.0, m.offered_tps,
                          run.kv_blocks, q.block_size)
    a, b = m.to_dict(), ref.to_dict()
    for k in a:
        if k in ("wall_s", "gpu_busy_frac", "avg_power_w", "energy_j", "joules_per_token",
                 "joules_per_output_token"):
            continue
        assert a[k] == b[k] or (a[k] != a[k] and b[k] != b[k]), k


@pytest.mark.parametrize("tail", [_tail(), _tail(itl_delay_prob=1.0, itl_delay_ms=400.0),
                                  "committed"])
def test_the_adjustment_never_changes_throughput_or_mean_itl(tail):
    """Every field but the TTFT / ITL quantiles stays the engine's: throughput, offered load,
    mean ITL and step count (what optim.capacity.twin_fingerprint hashes), TPOT, starvation."""
    if tail == "committed":
        tail = LT.latency_tail_for(LLAMA) or _tail()
    prof, ads, reqs, sc, run, dur = _run()
    plain = _metrics(prof, reqs, run, dur).to_dict()
    adj = _metrics(prof, reqs, run, dur, adapter=reqs.adapter, latency_tail=tail).to_dict()
    for k, v in plain.items():
        if k not in LATENCY_FIELDS:
            assert adj[k] == v or (v != v and adj[k] != adj[k]), k
    assert adj["mean_ttft_ms"] > plain["mean_ttft_ms"]
    assert adj["p99_itl_ms"] >= plain["p99_itl_ms"] * 0.99
    assert adj["p99_ttft_ms"] >= plain["p99_ttft_ms"]


def test_the_fidelity_replay_applies_the_committed_constants_only_to_latencies():
    """experiments.twin_fidelity replays with the client's latencies; simulate_server itself
    still reports the engine's (the model is opt-in through compute_metrics)."""
    from twin.shared_runs import replay_run
    tail = LT.latency_tail_for(LLAMA)
    if tail is None:
        pytest.skip("no constants committed for the Llama profile")
    cfg = {"model": LLAMA, "max_loras": 8, "served_adapters": 16, "max_lora_rank": 16,
           "adapter_rank_counts": "8:8 16:8", "rate_counts": "0.5:16", "total_time_s": 300,
           "pool_mean_input_len": 223.0, "pool_mean_output_len": 196.0,
           "max_num_batched_tokens": 2048, "max_num_seqs": 2048}
    client = replay_run(cfg)
    engine = replay_run(cfg, client_latency=False)
    for k in ("throughput_tps", "steps", "mean_itl_ms", "mean_tpot_ms", "p99_tpot_ms",
              "starved", "finished_requests", "preemptions", "adapter_loads"):
        assert client[k] == engine[k], k
    assert client["mean_ttft_ms"] > engine["mean_ttft_ms"]
    assert client["p99_itl_ms"] > engine["p99_itl_ms"]


def test_first_arrival_of_each_adapter():
    arrival = np.array([0.5, 0.1, 0.3, 0.2, 9.0, 0.05])
    adapter = np.array([0, 1, 0, 1, 2, 3])
    stats = np.zeros(K.N_STATS)
    stats[K.ST_RUNNING_S] = 20.0
    running, n, first = LT.run_features(arrival, adapter, stats, 5.0)
    assert running == 4.0 and n == 3.0           # adapter 2 arrives after the window
    assert first.tolist() == [False, True, True, False, False, True]
    assert LT.run_features(arrival, None, stats, 5.0)[1] == 0.0


def test_observed_gap_quantiles_match_a_simulation_of_the_delays():
    rng = np.random.default_rng(0)
    gaps = rng.lognormal(np.log(30.0), 0.3, 200_000)
    hist = np.zeros(K.ITL_HIST_BINS, np.int64)
    np.add.at(hist, [K.itl_bin(float(g)) for g in gaps], 1)
    p, mu = 0.08, 150.0
    j = np.where(rng.random(len(gaps) + 1) < p, rng.exponential(mu, len(gaps) + 1), 0.0)
    seen = np.maximum(gaps + j[1:] - j[:-1], 0.0)
    for q in (0.5, 0.99):
        assert LT.observed_gap_quantile(hist, q, p, mu) == pytest.approx(
            np.quantile(seen, q), rel=0.03)
    # delays off: the engine's quantiles (within the histogram's bin width)
    assert LT.observed_gap_quantile(hist, 0.99, 0.0, 0.0) == pytest.approx(
        _hist_quantile(hist, 0.99), rel=0.013)
    # longer delays, longer tail
    assert LT.observed_gap_quantile(hist, 0.99, p, 2 * mu) > LT.observed_gap_quantile(
        hist, 0.99, p, mu)


def test_observed_gap_quantiles_match_a_simulation_of_the_stalls():
    """A gap g holds a stall with probability rate x g (stalls at ``rate`` per second), seen
    as g + an exponential stall; with the delivery delays on top. Upper quantiles only (the
    catch-up gaps after a stall are not modelled)."""
    rng = np.random.default_rng(1)
    gaps = rng.lognormal(np.log(120.0), 0.2, 400_000)
    hist = np.zeros(K.ITL_HIST_BINS, np.int64)
    np.add.at(hist, [K.itl_bin(float(g)) for g in gaps], 1)
    p, mu, rate, stall = 0.02, 300.0, 0.08, 2500.0
    j = np.where(rng.random(len(gaps) + 1) < p, rng.exponential(mu, len(gaps) + 1), 0.0)
    seen = np.maximum(gaps + j[1:] - j[:-1], 0.0)
    held = rng.random(len(gaps)) < np.minimum(1.0, rate * gaps / 1000.0)
    seen = np.where(held, gaps + rng.exponential(stall, len(gaps)), seen)
    g, w = LT._hist_points(hist)
    for x in (300.0, 800.0, 2000.0, 6000.0):     # the tail, where a quantile is ill-conditioned
        assert LT.observed_gap_survival(x, g, w, p, mu, rate, stall) == pytest.approx(
            np.mean(seen > x), rel=0.05)
    assert LT.observed_gap_quantile(hist, 0.99, p, mu, rate, stall) == pytest.approx(
        np.quantile(seen, 0.99), rel=0.06)
    assert LT.observed_gap_quantile(hist, 0.99, p, mu, 0.0, stall) == pytest.approx(
        LT.observed_gap_quantile(hist, 0.99, p, mu), rel=2e-4)   # no stalls: the delays alone
    assert LT.observed_gap_quantile(hist, 0.99, p, mu, 2 * rate, stall) > \
        LT.observed_gap_quantile(hist, 0.99, p, mu, rate, stall)


def test_compiled_gap_quantile_matches_the_numpy_reference():
    """The compiled survival and bisection agree with the NumPy ones on random histograms,
    delays and stalls. Where the survival is flat at exactly 1 - q (a histogram without delays
    whose mass above some gap is exactly the tail), every point of the flat stretch is a
    quantile and the last bit of a sum decides which end the bisection takes: there both
    answers must be quantiles (survival within rounding of 1 - q on each side)."""
    rng = np.random.default_rng(7)
    for _ in range(200):
        hist = np.zeros(K.ITL_HIST_BINS, np.int64)
        lo = int(rng.integers(0, K.ITL_HIST_BINS - 200))
        hi = min(lo + int(rng.integers(5, 800)), K.ITL_HIST_BINS)
        np.add.at(hist, rng.integers(lo, hi, int(rng.integers(10, 5000))), 1)
        args = (float(rng.choice([0.5, 0.9, 0.99, 0.999])), float(rng.choice([0, 0.01, 0.3])),
                float(rng.choice([0, 10.0, 1000.0])), float(rng.choice([0, 0.1, 2.0])),
                float(rng.choice([0, 100.0, 2000.0])))
        g, w = LT._hist_points(hist)
        for x in (1.0, float(np.median(g)), float(g.max()) * 2):
            assert LT._gap_survival_nb(x, g, w, *args[1:]) == pytest.approx(
                LT.observed_gap_survival(x, g, w, *args[1:]), rel=1e-12, abs=1e-15)
        fast = LT.observed_gap_quantile(hist, *args)
        ref = LT.observed_gap_quantile_py(hist, *args)
        if fast == pytest.approx(ref, rel=1e-12):
            continue
        for v in (fast, ref):
            assert LT.observed_gap_survival(v * (1 - 2e-4), g, w, *args[1:]) >= 1 - args[0] - 1e-12
            assert LT.observed_gap_survival(v * (1 + 2e-4), g, w, *args[1:]) <= 1 - args[0] + 1e-12
    assert np.isnan(LT.observed_gap_quantile(np.zeros(K.ITL_HIST_BINS, np.int64), 0.99, 0.1, 5.0))


def test_bad_constants_are_refused():
    with pytest.raises(ValueError, match="itl_delay_prob"):
        _tail(itl_delay_prob=1.5)
    with pytest.raises(ValueError, match="cold_start_ms"):
        _tail(cold_start_ms=-1.0)
    with pytest.raises(ValueError, match="itl_delay_running_exp"):
        _tail(itl_delay_running_exp=0.0)
    with pytest.raises(ValueError, match="missing"):
        LT.LatencyTail.from_dict({"ttft_base_ms": 1.0})
    assert LT.LatencyTail.from_dict(_tail().to_dict()) == _tail()


def test_fewer_active_adapters_delay_less_and_old_constants_still_load():
    """The delivery delay falls with the share of a server's adapters its batches hold at once
    (``itl_delay_active_exp`` > 0); constants written before that term load with it at 0 (the
    earlier model), and with 0 the share changes nothing."""
    tail = _tail(itl_delay_active_exp=0.3)
    assert tail.delay_mean_ms(200, 256, 8) < tail.delay_mean_ms(200, 256, 128) \
        < tail.delay_mean_ms(200, 256, 256) == tail.delay_mean_ms(200, 256)
    old = {k: v for k, v in _tail().to_dict().items() if k not in LT.OPTIONAL_TERMS}
    back = LT.LatencyTail.from_dict(old)
    assert back.itl_delay_active_exp == 0.0 and back.itl_delay_queue_exp == 0.0
    assert _tail().delay_mean_ms(200, 256, 8) == _tail().delay_mean_ms(200, 256)


def test_a_longer_waiting_queue_delays_less():
    """``itl_delay_queue_exp`` > 0: the delay falls with the run's longest waiting queue
    (halved at W_REF waiting requests with exponent 1); with 0 the queue changes nothing."""
    tail = _tail(itl_delay_queue_exp=1.0)
    full = tail.delay_mean_ms(200, 256)
    assert tail.delay_mean_ms(200, 256, waiting=0) == full
    assert tail.delay_mean_ms(200, 256, waiting=LT.W_REF) == pytest.approx(full / 2)
    assert tail.delay_mean_ms(200, 256, waiting=5000) < tail.delay_mean_ms(200, 256, waiting=50)
    assert _tail().delay_mean_ms(200, 256, waiting=5000) == _tail().delay_mean_ms(200, 256)


def test_the_running_exponent_sharpens_the_delay_around_its_half_point():
    """``itl_delay_running_exp`` h: the busy share R^h / (R^h + R0^h) is R / (R + R0) at h = 1
    (constants written before the term load with 1), one half at R0 whatever h, and with h > 1
    smaller below R0 and larger above it."""
    r0 = _tail().itl_delay_half_running
    h1, h2 = _tail(), _tail(itl_delay_running_exp=2.0)
    for r in (0.5 * r0, 2 * r0, 10 * r0):
        assert h1.delay_mean_ms(r, 100) == pytest.approx(h1.itl_delay_ms * r / (r + r0))
    assert h2.delay_mean_ms(r0, 100) == pytest.approx(h1.delay_mean_ms(r0, 100))
    assert h2.delay_mean_ms(0.5 * r0, 100) < h1.delay_mean_ms(0.5 * r0, 100)
    assert h2.delay_mean_ms(2 * r0, 100) > h1.delay_mean_ms(2 * r0, 100)
    old = {k: v for k, v in h2.to_dict().items() if k != "itl_delay_running_exp"}
    assert LT.LatencyTail.from_dict(old).itl_delay_running_exp == 1.0


def test_batch_adapters_is_the_step_time_weighted_mean():
    stats = np.zeros(K.N_STATS)
    stats[K.ST_BUSY_S], stats[K.ST_DISTINCT_S] = 10.0, 45.0
    assert LT.batch_adapters(stats) == 4.5
    assert LT.batch_adapters(np.zeros(K.N_STATS)) == 0.0


def test_cold_start_waits_match_the_queued_reference():
    """The loads queue one after another: the vectorised schedule agrees with the plain walk
    through the blocks (``cold_start_waits_py``), clustered first arrivals build a backlog, an
    adapter's first request waits at least its own load, and with blocks far apart a request
    waits the rest of the block it arrives in plus a whole block per one starting in its wait."""
    for seed in range(4):
        rng = np.random.default_rng(seed)
        firsts = np.concatenate([rng.uniform(0, 5, 30), rng.uniform(0, 100, 20)])
        arrival = np.concatenate([rng.uniform(0, 110, 500), firsts])
        wait = rng.exponential(0.5, len(arrival))
        wait[::7] = 0.0
        first = np.zeros(len(arrival), bool)
        first[-len(firsts):] = True
        starts, own = LT.own_blocks(arrival, first)
        c = 300.0
        got = LT.cold_start_waits_ms(c, arrival, wait, starts, own)
        assert got == pytest.approx(LT.cold_start_waits_py(c, arrival, wait, starts, own),
                                    abs=1e-6)
        assert got[first].min() >= c - 1e-6          # an adapter's first request: its own load
        # 30 loads asked for in 5 s: the last of them ends near 30 x 0.3 s
        assert LT.ColdStartSchedule.of(starts, c).end.max() >= 9.0 - 1e-9
        assert LT.cold_start_waits_ms(0.0, arrival, wait, starts, own).sum() == 0.0
    starts = np.arange(10.0, 100.0, 10.0)                # blocks 10 s apart never queue
    arrival = np.array([10.1, 15.0, 19.9, 29.95, 30.05])
    wait = np.array([0.0, 0.0, 0.2, 0.0, 0.0])
    got = LT.cold_start_waits_ms(300.0, arrival, wait, starts)
    assert got == pytest.approx([200.0, 0.0, 300.0, 0.0, 250.0])


def test_cold_starts_hold_back_requests_of_other_adapters():
    """With the kernel's first-token times a cold start delays the requests waiting during it
    (not only the adapter's first one): the client's mean TTFT rises above charging the first
    requests alone, by no more than one block per request in flight."""
    prof, ads, reqs, sc, run, dur = _run(n_adapters=24, amax=24, rate=1.0)
    tail = _tail()
    with_blocks = LT.client_view(tail, reqs.arrival_s, reqs.adapter, run.stats, dur, run.first_t)
    arrivals_only = LT.client_view(tail, reqs.arrival_s, reqs.adapter, run.stats, dur)
    running, n, first = LT.run_features(reqs.arrival_s, reqs.adapter, run.stats, dur)
    # the earlier model: the cold start charged to each adapter's first request alone
    firsts_only = LT.ttft_offsets_ms(dataclasses.replace(tail, cold_start_ms=0.0), running, n,
                                     first, reqs.arrival_s) + tail.cold_start_ms * first
    assert with_blocks.offsets_ms.sum() >= arrivals_only.offsets_ms.sum() \
        >= firsts_only.sum() - 1e-6
    assert with_blocks.offsets_ms.sum() > firsts_only.sum()
    assert (with_blocks.offsets_ms[first] >= firsts_only[first] - 1e-9).all()


def test_stalls_grow_with_the_arrivals_per_engine_step():
    """``stall_step_exp`` > 0: the stall rate is stall_per_request x rate at A_REF arrivals
    per engine step and grows as (A / A_REF) ** exp; at 0 (constants fitted before the term)
    it is stall_per_request x rate whatever the step; the p99 gap follows."""
    tail = _tail(stall_per_request=2e-4, stall_ms=600.0, stall_step_exp=3.0)
    rate = 300.0
    at_ref = LT.A_REF / rate * 1000.0                       # ms: A_REF arrivals per gap
    assert tail.stall_rate(rate, at_ref) == pytest.approx(2e-4 * rate)
    assert tail.stall_rate(rate, 2 * at_ref) == pytest.approx(8 * 2e-4 * rate)
    assert tail.stall_rate(rate, at_ref / 2) == pytest.approx(2e-4 * rate / 8)
    flat = _tail(stall_per_request=2e-4, stall_ms=600.0)
    assert flat.stall_rate(rate, 5.0) == flat.stall_rate(rate, 500.0) == pytest.approx(0.06)
    assert tail.stall_rate(0.0, at_ref) == 0.0
    old = {k: v for k, v in tail.to_dict().items() if k != "stall_step_exp"}
    assert LT.LatencyTail.from_dict(old).stall_step_exp == 0.0
    with pytest.raises(ValueError, match="stall_step_exp"):
        _tail(stall_step_exp=-1.0)
    hist = np.zeros(K.ITL_HIST_BINS, np.int64)
    hist[K.itl_bin(150.0)] = 1000                      # 45 arrivals per 150 ms step at 300/s
    assert LT.hist_mean_ms(hist) == pytest.approx(150.0, rel=0.01)
    view = LT.ClientView(tail, np.zeros(1), 0.0, rate)
    flat_view = LT.ClientView(flat, np.zeros(1), 0.0, rate)
    assert view.itl_quantiles_ms(hist, (0.99,))[0] > flat_view.itl_quantiles_ms(hist, (0.99,))[0]
