"""The replay's early stop (``twin.kernel``: a run ends once the window's completed tokens are
bounded below a target) is sound and exact: a stopped run's bound is at least what the whole
window completes and below the target, a run that is not stopped is the full run, the compiled
kernel and the plain-Python reference stop at the same step, and a verdict search gives the same
answer with and without it."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from twin import kernel as K
from twin.reference_kernel import simulate_reference
from twin.step_time import min_ms_per_token
from tests.test_kernel import COEF, _order, make_case

DURATION = 20.0


def _case(c):
    arrival, adapter, in_len, out_len, load_ms = make_case(
        c["seed"], c["n_req"], c["n_adapters"], c["max_len"], DURATION)
    fit = c["kv_blocks"] * 16
    return arrival, adapter, np.minimum(in_len, fit // 2), np.minimum(out_len, fit // 2), load_ms


def _kernel(c, arrival, adapter, in_len, out_len, load_ms, stop_tokens=0.0, coef=COEF):
    n = len(arrival)
    first, finish = np.full(n, -1.0), np.full(n, -1.0)
    stats, hist = np.zeros(K.N_STATS), np.zeros(K.ITL_HIST_BINS, np.int64)
    ms = min_ms_per_token(coef, c["amax"], c["max_rank"], c["budget"])
    out = K.simulate_kernel(arrival, adapter, in_len, out_len, c["n_adapters"], load_ms,
                            _order(c["n_adapters"]), c["amax"], c["max_rank"], c["kv_blocks"], 16,
                            c["budget"], c["max_seqs"], DURATION, coef, 0, first, finish, stats,
                            hist, float(stop_tokens), float(ms))
    return first, finish, stats, hist, *out


def _completed_tokens(finish, in_len, out_len) -> float:
    done = (finish >= 0) & (finish <= DURATION)
    return float(in_len[done].sum() + out_len[done].sum())


cases = st.fixed_dictionaries({
    "seed": st.integers(0, 10_000), "n_req": st.integers(50, 400),
    "n_adapters": st.integers(1, 40), "amax": st.integers(1, 8),
    "max_len": st.integers(2, 200), "kv_blocks": st.integers(20, 200),
    "budget": st.sampled_from([16, 64, 2048]), "max_seqs": st.sampled_from([4, 64, 2048]),
    "max_rank": st.sampled_from([8, 16, 32]), "target": st.floats(0.05, 1.2)})


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases)
def test_a_stopped_run_is_bounded_and_an_unstopped_one_is_the_full_run(c):
    arrival, adapter, in_len, out_len, load_ms = _case(c)
    full = _kernel(c, arrival, adapter, in_len, out_len, load_ms)
    total = _completed_tokens(full[1], in_len, out_len)
    offered = float((in_len + out_len)[arrival < DURATION].sum())
    stop = c["target"] * offered
    part = _kernel(c, arrival, adapter, in_len, out_len, load_ms, stop)
    decided = part[2][K.ST_DECIDED_T]
    if decided > 0:
        bound = part[2][K.ST_TOKENS_BOUND]
        assert total <= bound < stop
        assert decided < DURATION
        # up to the stop, the stopped run is the full run
        seen = part[1] >= 0
        np.testing.assert_array_equal(part[1][seen], full[1][seen])
    else:
        for a, b in zip(full, part):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases)
def test_kernel_and_reference_stop_at_the_same_step(c):
    arrival, adapter, in_len, out_len, load_ms = _case(c)
    offered = float((in_len + out_len)[arrival < DURATION].sum())
    stop = c["target"] * offered
    fast = _kernel(c, arrival, adapter, in_len, out_len, load_ms, stop)
    ms = min_ms_per_token(COEF, c["amax"], c["max_rank"], c["budget"])
    ref = simulate_reference(arrival, adapter, in_len, out_len, c["n_adapters"], load_ms,
                             _order(c["n_adapters"]), c["amax"], c["max_rank"], c["kv_blocks"],
                             16, c["budget"], c["max_seqs"], DURATION, COEF, stop_tokens=stop,
                             ms_per_token=ms)
    for name, a, b in zip(["first_t", "finish_t", "stats", "itl_hist", "running", "waiting",
                           "computed", "generated"], fast, ref):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=name)


def test_the_step_time_floor_holds_for_every_step_of_a_run():
    """``min_ms_per_token`` x tokens never exceeds a step's modelled time: checked on the design
    rows of single-step runs of every composition drawn (one request each, any length)."""
    from twin.step_time import step_time_ms_py
    rng = np.random.default_rng(1)
    for _ in range(2000):
        amax, rank, budget = int(rng.integers(1, 300)), int(rng.choice([8, 16, 32, 64])), \
            int(rng.choice([16, 256, 2048, 8192]))
        ms = min_ms_per_token(COEF, amax, rank, budget)
        seqs = int(rng.integers(1, 300))
        tok = int(rng.integers(seqs, max(seqs, budget) + 1)) if seqs <= budget else budget
        tok = min(tok, budget)
        k = int(rng.integers(1, min(amax, seqs) + 1))
        tiles = int(rng.integers(max(k, -(-tok // K.LORA_TILE)), tok + k + 1))
        decode = int(rng.integers(0, min(seqs, tok) + 1))
        t = step_time_ms_py(COEF, seqs, tok - decode, decode, int(rng.integers(0, 10**6)), k,
                            amax, rank, int(rng.integers(0, 10**4)), tiles)
        assert tok * ms <= t * (1 + 1e-12)


def test_no_floor_from_a_negative_coefficient():
    coef = COEF.copy()
    coef[1] = -1e-3
    assert min_ms_per_token(coef, 8, 16, 2048) == 0.0


def test_stop_below_is_a_score_in_0_1():
    from twin.profile import load_profile
    from twin.server import simulate_server, ServerConfig
    from twin.workload import Adapter
    with pytest.raises(ValueError, match="stop_below"):
        simulate_server(load_profile("llama-3.1-8b-instruct"), [Adapter("a", 8, 1.0)],
                        ServerConfig(max_loras=1), 60.0, stop_below=1.5)


def test_an_overloaded_server_stops_early_and_its_score_is_an_upper_bound():
    """A server offered twice its capacity: with ``stop_below`` the replay ends early, is
    starved and its throughput is at least the full replay's; one that reaches the score is
    replayed whole (same metrics as without the stop)."""
    from twin.profile import load_profile
    from twin.server import simulate_server, ServerConfig
    from twin.workload import Adapter
    prof = load_profile("llama-3.1-8b-instruct")
    heavy = [Adapter(f"a{i}", 8, 2.0) for i in range(40)]
    cfg = ServerConfig(max_loras=4)
    full = simulate_server(prof, heavy, cfg, 600.0, seed=3)
    early = simulate_server(prof, heavy, cfg, 600.0, seed=3, stop_below=1.0)
    assert full.starved and early.starved
    assert 0 < early.decided_at_s < 600.0 and full.decided_at_s is None
    assert early.throughput_tps >= full.throughput_tps
    assert early.throughput_tps < 0.9 * early.offered_realised_tps
    light = [Adapter(f"a{i}", 8, 0.05) for i in range(4)]
    a = simulate_server(prof, light, cfg, 600.0, seed=3)
    b = simulate_server(prof, light, cfg, 600.0, seed=3, stop_below=1.0)
    assert not a.starved and b.decided_at_s is None
    assert {k: v for k, v in a.to_dict().items() if k != "wall_s"} == \
        {k: v for k, v in b.to_dict().items() if k != "wall_s"}


def test_twin_scores_with_the_stop_give_the_same_verdicts():
    """On one GPU of many adapters at every Amax 1..24: the early-stopped score is never below
    the full one, and it reaches 1 exactly when the full one does."""
    from optim.amax_search import twin_scores
    from optim.instance import Instance, GpuType
    from optim.placement import plan_gpu
    from twin.sharegpt import default_lengths
    from twin.workload import Adapter
    ads = tuple(Adapter(f"x{i:03d}", 8, 0.35 if i % 3 else 0.9) for i in range(24))
    inst = Instance("early-stop", ads, (GpuType("h100", "llama-3.1-8b-instruct", 1, 0.0),),
                    default_lengths())
    plan = plan_gpu("h100", "llama-3.1-8b-instruct", 1, [(a, 1.0) for a in ads],
                    inst.mean_tokens, 8)
    xs = list(range(1, 25))
    full = twin_scores(inst, plan, xs, inst.seed, 900.0, 1)
    early = twin_scores(inst, plan, xs, inst.seed, 900.0, 1, stop_below=1.0)
    assert any(m.decided_at_s is not None for _, m in early), "no replay stopped early"
    assert any(v >= 1.0 for v, _ in full) and any(v < 1.0 for v, _ in full)
    for (f, _), (e, _) in zip(full, early):
        assert e >= f and (e >= 1.0) == (f >= 1.0)
