"""Tests for twin.workload (adapters, arrival processes, request generation, traces)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from experiments.common import shared_data_dir
from hypothesis import given, settings
from hypothesis import strategies as st

from twin.lengths import FixedLengths
from twin.sharegpt import sharegpt_lengths
from twin.workload import (
    Adapter,
    GammaArrivals,
    LognormalArrivals,
    PoissonArrivals,
    RateSwitchingArrivals,
    Requests,
    adapters_from_counts,
    adapters_from_cycles,
    stationary_process_from_dict,
    generate_requests,
    load_adapters_csv,
    load_trace_csv,
    offered_token_rate,
    parse_counts,
    parse_rate_counts,
)

REPO = Path(__file__).resolve().parents[1]
ALL_PROCESSES = [PoissonArrivals(), GammaArrivals(2.0), GammaArrivals(0.5), LognormalArrivals(1.5),
                 RateSwitchingArrivals((1.0, 3.0), 50.0), RateSwitchingArrivals((0.0, 1.0, 2.0), 7.0, True)]


def shared_data() -> Path:
    """Shared measurement folder from $LORA_SHARED_DATA (default <repo>/../shared/data/vllm_h100)."""
    p = shared_data_dir()
    if not p.is_dir():
        pytest.skip(f"shared data folder not found at {p} (set LORA_SHARED_DATA)")
    return p


# --------------------------------------------------------------------------- adapters


def test_adapter_validation_messages():
    assert Adapter("a1", 8, 0.5).rate == 0.5
    with pytest.raises(ValueError, match=r"^adapter 'a3': rate must be > 0, got -0.1$"):
        Adapter("a3", 8, -0.1)
    with pytest.raises(ValueError, match="adapter 'a3': rate must be finite, got inf"):
        Adapter("a3", 8, float("inf"))
    with pytest.raises(ValueError, match="adapter 'a3': rank must be a positive integer, got 0"):
        Adapter("a3", 0, 1.0)
    with pytest.raises(ValueError, match="rank must be a positive integer, got 8.5"):
        Adapter("a3", 8.5, 1.0)
    with pytest.raises(ValueError, match="id must be a non-empty string"):
        Adapter("", 8, 1.0)
    assert Adapter("x", np.int64(16), np.float32(0.25)) == Adapter("x", 16, 0.25)


def test_adapters_from_cycles():
    ads = adapters_from_cycles(5, [8, 16], [1.6, 0.8, 0.4], prefix="l")
    assert [a.id for a in ads] == ["l0", "l1", "l2", "l3", "l4"]
    assert [a.rank for a in ads] == [8, 16, 8, 16, 8]
    assert [a.rate for a in ads] == [1.6, 0.8, 0.4, 1.6, 0.8]
    with pytest.raises(ValueError, match="ranks must not be empty"):
        adapters_from_cycles(3, [], [1.0])


def test_adapters_from_counts_pairs_randomly_but_reproducibly():
    rk, rt = {8: 43, 16: 43, 32: 42}, {0.4: 42, 0.8: 43, 1.6: 43}
    a = adapters_from_counts(rk, rt, seed=3)
    b = adapters_from_counts(rk, rt, seed=3)
    c = adapters_from_counts(rk, rt, seed=4)
    assert a == b and a != c
    assert len(a) == 128 and len({x.id for x in a}) == 128
    for ads in (a, c):
        assert {r: sum(x.rank == r for x in ads) for r in rk} == rk
        assert {r: sum(x.rate == r for x in ads) for r in rt} == rt
    with pytest.raises(ValueError, match="rank_counts total 3 != rate_counts total 4"):
        adapters_from_counts({8: 3}, {0.1: 4}, 0)


def test_parse_counts():
    assert parse_counts("8:4 16:4") == {8: 4, 16: 4}
    assert parse_rate_counts("0.025:2 0.05:3 0.1:3") == {0.025: 2, 0.05: 3, 0.1: 3}
    assert parse_counts("8:1,16:2") == {8: 1, 16: 2}
    for bad, msg in [("", "expected text"), ("8-4", "is not 'value:count'"), ("x:4", "'x' in 'x:4' is not a valid int"),
                     ("8:y", "count 'y'"), ("8:1 8:2", "appears twice"), ("0:3", "must be finite and > 0"),
                     ("8:-1", "must be >= 0")]:
        with pytest.raises(ValueError, match=msg):
            parse_counts(bad)
    with pytest.raises(ValueError, match="not a valid float"):
        parse_rate_counts("abc:3")


def test_parse_counts_of_real_runs():
    csv = shared_data() / "validation_llama" / "validation_llama.csv"
    if not csv.is_file():
        pytest.skip(f"{csv} not found")
    import pandas as pd

    df = pd.read_csv(csv)
    for _, row in df.drop_duplicates(["adapter_rank_counts", "rate_counts"]).iterrows():
        ads = adapters_from_counts(parse_counts(row.adapter_rank_counts), parse_rate_counts(row.rate_counts), seed=0)
        assert len(ads) == row.served_adapters
        assert sum(a.rate for a in ads) == pytest.approx(row.aggregate_rate_rps)


def test_load_adapters_csv(tmp_path):
    p = tmp_path / "adapters.csv"
    p.write_text("id,rank,rate\na0,8,0.1\na1, 16 ,0.05\n")
    assert load_adapters_csv(p) == [Adapter("a0", 8, 0.1), Adapter("a1", 16, 0.05)]
    cases = [
        ("", "adapters.csv: adapters file is empty"),
        ("id,rank,rate\n", "header but no rows"),
        ("id,rate\na,1\n", r"missing column\(s\) \['rank'\]"),
        ("id,rank,rate\na0,8,0.1\na0,8,0.2\n", "adapters.csv row 2, column 'id': duplicate adapter id 'a0' \\(first in row 1\\)"),
        ("id,rank,rate\na0,8,0.1\na1,abc,0.2\n", "adapters.csv row 2, column 'rank': not a finite number \\('abc'\\)"),
        ("id,rank,rate\na0,8,0\n", "adapters.csv row 1, column 'rate': must be > 0, got '0'"),
        ("id,rank,rate\na0,8.5,1\n", "row 1, column 'rank': not an integer"),
        ("id,rank,rate\n,8,1\n", "row 1, column 'id': missing value"),
        ("id,rank,rate\na,8,\n", "row 1, column 'rate': missing value"),
    ]
    for text, msg in cases:
        p.write_text(text)
        with pytest.raises(ValueError, match=msg):
            load_adapters_csv(p)
    with pytest.raises(ValueError, match="not found"):
        load_adapters_csv(tmp_path / "nope.csv")


# --------------------------------------------------------------------------- arrival processes


@pytest.mark.parametrize("proc", ALL_PROCESSES, ids=lambda p: repr(p))
def test_arrivals_sorted_in_range_deterministic_and_rate(proc):
    rate, dur = 5.0, 20_000.0
    t = proc.sample_times(rate, dur, 11)
    assert t.dtype == np.float64 and np.all(np.diff(t) >= 0)
    assert t.min() >= 0 and t.max() < dur
    assert np.array_equal(t, proc.sample_times(rate, dur, np.random.default_rng(11)))
    # mean rate within ~5 standard errors (bursty processes have larger count variance)
    cv = getattr(proc, "cv", 1.0)
    n_exp = rate * dur
    assert abs(len(t) - n_exp) < 5 * cv * np.sqrt(n_exp) + 5 * (proc.kind == "rate_switching") * np.sqrt(n_exp) * 3
    assert stationary_process_from_dict(proc.describe()) == proc
    assert len(proc.sample_times(rate, 0.0, 1)) == 0


@pytest.mark.parametrize("proc", [GammaArrivals(0.3), GammaArrivals(3.0), LognormalArrivals(0.5), LognormalArrivals(2.0)],
                         ids=repr)
def test_renewal_gap_cv(proc):
    t = proc.sample_times(2.0, 100_000.0, 5)
    g = np.diff(t)
    assert g.mean() == pytest.approx(0.5, rel=0.03)
    assert g.std() / g.mean() == pytest.approx(proc.cv, rel=0.08)


@pytest.mark.parametrize("proc", [GammaArrivals(3.0), LognormalArrivals(3.0), GammaArrivals(0.2)], ids=repr)
def test_renewal_starts_in_equilibrium(proc):
    # stationary renewal process: E[N(0, s)] = rate * s exactly, also for small s
    rate, s, reps = 1.0, 1.5, 6000
    rng = np.random.default_rng(0)
    counts = np.array([len(proc.sample_times(rate, s, rng)) for _ in range(reps)])
    se = counts.std() / np.sqrt(reps)
    assert abs(counts.mean() - rate * s) < 4.5 * se


def test_rate_switching_period_rates():
    proc = RateSwitchingArrivals((1.0, 3.0), 10.0)
    assert np.allclose(proc.normalized, [0.5, 1.5])
    t = proc.sample_times(4.0, 20_000.0, 2)
    in_high = (np.floor(t / 10.0) % 2) == 1
    assert in_high.sum() / 10_000 == pytest.approx(6.0, rel=0.03)
    assert (~in_high).sum() / 10_000 == pytest.approx(2.0, rel=0.03)
    zero = RateSwitchingArrivals((0.0, 1.0), 5.0).sample_times(3.0, 1000.0, 0)
    assert np.all(np.floor(zero / 5.0) % 2 == 1)


def test_arrival_errors():
    with pytest.raises(ValueError, match="GammaArrivals: cv must be > 0, got 0.0"):
        GammaArrivals(0)
    with pytest.raises(ValueError, match="LognormalArrivals: cv must be finite"):
        LognormalArrivals(float("nan"))
    with pytest.raises(ValueError, match="PoissonArrivals: rate must be > 0, got -1.0"):
        PoissonArrivals().sample_times(-1, 10, 0)
    with pytest.raises(ValueError, match="duration must be >= 0"):
        GammaArrivals(1.0).sample_times(1, -10, 0)
    with pytest.raises(ValueError, match=r"multipliers\[1\] must be finite and >= 0, got -1.0"):
        RateSwitchingArrivals((1.0, -1.0), 10)
    with pytest.raises(ValueError, match="period_s must be > 0"):
        RateSwitchingArrivals((1.0,), 0)
    with pytest.raises(ValueError, match="unknown kind 'mmpp'"):
        stationary_process_from_dict({"kind": "mmpp"})
    with pytest.raises(ValueError, match=r"'gamma': missing field\(s\) \['cv'\]"):
        stationary_process_from_dict({"kind": "gamma"})


# --------------------------------------------------------------------------- requests


def test_requests_validation():
    r = Requests([0.0, 1.0, 1.0], [0, 1, 0], [5, 6, 7], [1, 2, 3])
    assert len(r) == 3 and r.adapter.dtype == np.int32 and r.arrival_s.dtype == np.float64
    assert r.offered_token_rate(2.0) == pytest.approx((18 + 6) / 2)
    assert r.counts_per_adapter(3).tolist() == [2, 1, 0]
    with pytest.raises(ValueError):
        r.arrival_s[0] = 5.0  # read-only
    for args, msg in [
        (([1.0, 0.0], [0, 0], [1, 1], [1, 1]), r"arrival_s must be sorted \(index 1"),
        (([0.0, 1.0], [0], [1, 1], [1, 1]), "adapter has 1 entries, arrival_s has 2"),
        (([0.0], [0], [0], [1]), "input_len must be >= 1, got 0"),
        (([0.0], [-1], [1], [1]), "adapter index must be >= 0"),
        (([-1.0], [0], [1], [1]), "arrival_s must be finite and >= 0"),
        (([0.0], [0], [1.5], [1]), "input_len must hold integers"),
        ((["x"], [0], [1], [1]), "arrival_s must be numeric"),
    ]:
        with pytest.raises(ValueError, match=msg):
            Requests(*args)
    assert len(Requests.empty()) == 0
    with pytest.raises(ValueError, match="duration must be > 0"):
        r.offered_token_rate(0)


def test_generate_requests_deterministic_and_independent_per_adapter():
    lengths = sharegpt_lengths(223.0, 196.3)
    ads = adapters_from_cycles(6, [8, 16], [0.5, 1.0, 2.0])
    r1 = generate_requests(ads, 500.0, lengths, seed=9)
    r2 = generate_requests(ads, 500.0, lengths, seed=9)
    for f in ("arrival_s", "adapter", "input_len", "output_len"):
        assert np.array_equal(getattr(r1, f), getattr(r2, f))
    assert not np.array_equal(r1.arrival_s, generate_requests(ads, 500.0, lengths, seed=10).arrival_s)
    # adapter 1's stream is the same when the other adapters change
    other = [ads[0], ads[1], Adapter("z", 32, 7.0)]
    r3 = generate_requests(other, 500.0, lengths, seed=9)
    for f in ("arrival_s", "input_len", "output_len"):
        assert np.array_equal(getattr(r1, f)[r1.adapter == 1], getattr(r3, f)[r3.adapter == 1])
    # the length sequence does not depend on the arrival process (separate child streams)
    a1 = generate_requests([ads[2]], 500.0, lengths, seed=0)
    a2 = generate_requests([ads[2]], 500.0, lengths, GammaArrivals(2.0), seed=0)
    k = min(len(a1), len(a2))
    assert np.array_equal(a1.input_len[:k], a2.input_len[:k])
    # Generator seeds work and are reproducible
    g1 = generate_requests(ads, 100.0, lengths, seed=np.random.default_rng(1))
    g2 = generate_requests(ads, 100.0, lengths, seed=np.random.default_rng(1))
    assert np.array_equal(g1.arrival_s, g2.arrival_s)


def test_generate_requests_rates_and_offered_load():
    ads = adapters_from_cycles(4, [8], [0.5, 1.0, 2.0, 4.0])
    lengths = FixedLengths(100, 50)
    r = generate_requests(ads, 5000.0, lengths, seed=1)
    counts = r.counts_per_adapter(4)
    for a, c in zip(ads, counts):
        n = a.rate * 5000
        assert abs(c - n) < 5 * np.sqrt(n)
    assert r.offered_token_rate(5000.0) == pytest.approx(offered_token_rate(ads, lengths), rel=0.02)
    assert offered_token_rate(ads, lengths) == pytest.approx(7.5 * 150)


def test_generate_requests_errors():
    lengths = FixedLengths(1, 1)
    with pytest.raises(ValueError, match="adapters must be a non-empty list"):
        generate_requests([], 10.0, lengths)
    with pytest.raises(ValueError, match="duplicate adapter id 'a'"):
        generate_requests([Adapter("a", 8, 1), Adapter("a", 8, 1)], 10.0, lengths)
    with pytest.raises(ValueError, match="duration_s must be > 0, got 0.0"):
        generate_requests([Adapter("a", 8, 1)], 0, lengths)
    with pytest.raises(ValueError, match="lengths must be a length model"):
        generate_requests([Adapter("a", 8, 1)], 1.0, "sharegpt")
    with pytest.raises(ValueError, match="seed must be"):
        generate_requests([Adapter("a", 8, 1)], 1.0, lengths, seed=-3)


@settings(max_examples=25, deadline=None)
@given(
    rates=st.lists(st.floats(0.01, 20.0), min_size=1, max_size=6),
    duration=st.floats(0.5, 200.0),
    proc=st.sampled_from(ALL_PROCESSES),
    seed=st.integers(0, 2**32),
)
def test_generate_requests_invariants(rates, duration, proc, seed):
    ads = [Adapter(f"a{i}", 8, r) for i, r in enumerate(rates)]
    r = generate_requests(ads, duration, sharegpt_lengths(), proc, seed)
    assert np.all(np.diff(r.arrival_s) >= 0)
    if len(r):
        assert r.arrival_s.min() >= 0 and r.arrival_s.max() < duration
        assert r.adapter.min() >= 0 and r.adapter.max() < len(ads)
        assert r.input_len.min() >= 4 and (r.input_len + r.output_len).max() <= 2048


def test_generate_requests_192_adapters_one_hour_count():
    ads = adapters_from_cycles(192, [8, 16, 32], [1.6, 0.8, 0.4])
    r = generate_requests(ads, 3600.0, sharegpt_lengths(223.0, 196.3), seed=0)
    assert abs(len(r) - 192 / 3 * 2.8 * 3600) < 5 * np.sqrt(645_120)


# --------------------------------------------------------------------------- traces


def test_load_trace_csv_infers_adapters(tmp_path):
    p = tmp_path / "trace.csv"
    p.write_text(
        "arrival_s,adapter_id,input_tokens,output_tokens,rank\n"
        "3.0,b,10,20,16\n"
        "0.0,a,5,6,8\n"
        "1.0,b,7,8,16\n"
        "4.0,a,1,1,8\n"
        "1.0,c,2,3,32\n"
    )
    ads, r = load_trace_csv(p)
    assert [a.id for a in ads] == ["b", "a", "c"]
    assert [a.rank for a in ads] == [16, 8, 32]
    assert [a.rate for a in ads] == pytest.approx([2 / 4, 2 / 4, 1 / 4])
    assert r.arrival_s.tolist() == [0.0, 1.0, 1.0, 3.0, 4.0]
    assert r.adapter.tolist() == [1, 0, 2, 0, 1]  # ties keep file order
    assert r.input_len.tolist() == [5, 7, 2, 10, 1]
    ads2, _ = load_trace_csv(p, duration_s=8.0)
    assert ads2[0].rate == pytest.approx(2 / 8)
    given_ads = [Adapter("a", 8, 1.0), Adapter("b", 16, 1.0), Adapter("c", 32, 1.0), Adapter("d", 8, 1.0)]
    ads3, r3 = load_trace_csv(p, given_ads)
    assert ads3 == given_ads and r3.adapter.tolist() == [0, 1, 2, 1, 0]


def test_load_trace_csv_errors(tmp_path):
    p = tmp_path / "trace.csv"
    head = "arrival_s,adapter_id,input_tokens,output_tokens\n"
    cases = [
        (head + "0,a,1,1\n" * 16 + "abc,a,1,1\n", None, r"^trace.csv row 17, column 'arrival_s': not a finite number \('abc'\)$"),
        (head + "-1,a,1,1\n", None, "row 1, column 'arrival_s': must be >= 0, got '-1'"),
        (head + "0,a,0,1\n", None, "row 1, column 'input_tokens': must be >= 1, got '0'"),
        (head + "0,a,1,2.5\n", None, "row 1, column 'output_tokens': not an integer \\('2.5'\\)"),
        (head + "0,,1,1\n", None, "row 1, column 'adapter_id': missing value"),
        (head + "0,a,1,1\n", None, "column 'rank' is required"),
        (head + "0,a,1,1\n1,zz,1,1\n", [Adapter("a", 8, 1.0)], "row 2, column 'adapter_id': unknown adapter 'zz'"),
        ("arrival_s,adapter_id,input_tokens\n0,a,1\n", None, r"missing column\(s\) \['output_tokens'\]"),
        ("", None, "trace.csv: trace file is empty"),
        (head, None, "header but no rows"),
        (head.strip() + ",rank\n0,a,1,1,8\n1,a,1,1,16\n", None, "row 1, column 'rank': adapter 'a' has rank 8 here but 16"),
        (head.strip() + ",rank\n0,a,1,1,16\n", [Adapter("a", 8, 1.0)], "row 1, column 'rank': 16 differs"),
        (head.strip() + ",rank\n0,a,1,1,8\n", None, "trace span is 0.0 s"),
    ]
    for text, ads, msg in cases:
        p.write_text(text)
        with pytest.raises(ValueError, match=msg):
            load_trace_csv(p, ads)
