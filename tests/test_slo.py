"""Latency SLOs: parsing, judging one run, and placement under an SLO (verify, greedy's repair,
the lower bound and the optimality claim against brute force on tiny instances)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from optim.amax_search import amax_upper, twin_scores
from optim.feasibility import lora_gpu_lower_bound, twin_certificate
from optim.instance import InstanceError, instance_from_dict
from optim.methods import solve
from optim.placement import Placement, plan_gpu
from optim.verify import verify
from twin.cli_support import CliError, slo_argument
from twin.profile import load_profile
from twin.server import ServerConfig, simulate_server
from twin.slo import Slo, evaluate_slo, hist_quantile_upper
from twin.workload import Adapter

PROFILE = "llama-3.1-8b-instruct"


# ----------------------------------------------------------------------------- the SLO object
def test_slo_fields_are_checked_by_name():
    with pytest.raises(ValueError, match=r"slo\.ttft_p99_ms: must be a finite number"):
        Slo(ttft_p99_ms=-5)
    with pytest.raises(ValueError, match="at least one bound"):
        Slo()
    with pytest.raises(ValueError, match=r"slo\.attainment"):
        Slo(itl_p99_ms=50, attainment=1.0)
    with pytest.raises(ValueError, match=r"unknown field\(s\) \['ttft'\]"):
        Slo.from_dict({"ttft": 5})
    with pytest.raises(CliError, match=r"--slo: ttft_p99_ms: 'fast' is not a number"):
        slo_argument("ttft_p99_ms=fast")
    with pytest.raises(CliError, match="not NAME=VALUE"):
        slo_argument("500")
    s = slo_argument("ttft_p99_ms=500, itl_p99_ms=80,attainment=0.95")
    assert (s.ttft_p99_ms, s.itl_p99_ms, s.attainment) == (500.0, 80.0, 0.95)
    assert s.describe() == "ttft_p95<=500ms itl_p95<=80ms (after a 60 s warm-up)"
    assert Slo.from_dict(s.to_dict()) == s


def test_instance_slo_errors_name_the_field():
    base = {"name": "x", "adapters": [{"id": "a", "rank": 8, "rate": 0.5}],
            "gpus": [{"name": "h100", "profile": PROFILE, "count": 2}], "duration_s": 600}
    with pytest.raises(InstanceError, match=r"slo\.itl_p99_ms"):
        instance_from_dict({**base, "slo": {"itl_p99_ms": "fast"}})
    with pytest.raises(InstanceError, match=r"slo\.warmup_s.*600 s twin window"):
        instance_from_dict({**base, "slo": {"itl_p99_ms": 50, "warmup_s": 600}})
    inst = instance_from_dict({**base, "slo": {"ttft_p99_ms": 250}})
    assert inst.slo == Slo(ttft_p99_ms=250)
    assert instance_from_dict(inst.to_dict()).slo == inst.slo


# ----------------------------------------------------------------------------- judging one run
def _brute(slo: Slo, arrival, first, finish, duration):
    """Per-request judgement written out plainly (unserved = infinite latency)."""
    j = [(a, f, e) for a, f, e in zip(arrival, first, finish) if slo.warmup_s <= a < duration]
    ttft = sorted((f - a) * 1000 if 0 <= f <= duration else math.inf for a, f, _ in j)
    e2e = sorted((e - a) * 1000 if 0 <= e <= duration else math.inf for a, _, e in j)
    k = math.ceil(slo.attainment * len(j)) - 1
    good = sum(1 for a, f, e in j
               if (slo.ttft_p99_ms is None or (0 <= f <= duration
                                               and (f - a) * 1000 <= slo.ttft_p99_ms))
               and (slo.e2e_p99_ms is None or (0 <= e <= duration
                                               and (e - a) * 1000 <= slo.e2e_p99_ms)))
    return ttft[k], e2e[k], good / (duration - slo.warmup_s)


@pytest.mark.parametrize("seed", range(6))
def test_evaluate_slo_matches_a_plain_count(seed):
    rng = np.random.default_rng(seed)
    n, duration = 400, 100.0
    arrival = np.sort(rng.uniform(0, duration, n))
    first = arrival + rng.exponential(0.2, n)
    finish = first + rng.exponential(2.0, n)
    lost = rng.random(n) < rng.choice([0.0, 0.005, 0.05])
    first[lost] = -1.0
    finish[lost | (rng.random(n) < 0.01)] = -1.0
    finish[finish > duration] = -1.0
    hist = np.zeros(4000, np.int64)
    slo = Slo(ttft_p99_ms=600.0, e2e_p99_ms=8000.0, attainment=float(rng.choice([0.9, 0.99])),
              warmup_s=float(rng.choice([0.0, 10.0])))
    r = evaluate_slo(slo, arrival, first, finish, hist, duration)
    ttft, e2e, goodput = _brute(slo, arrival, first, finish, duration)
    assert r.observed["ttft_p99_ms"] == pytest.approx(ttft)
    assert r.observed["e2e_p99_ms"] == pytest.approx(e2e)
    assert r.goodput_rps == pytest.approx(goodput)
    assert r.met["ttft_p99_ms"] == (ttft <= 600.0)
    assert r.ok == (ttft <= 600.0 and e2e <= 8000.0)
    assert (r.score >= 1.0) == r.ok


def test_itl_quantile_reads_the_upper_bin_edge():
    from twin import kernel as K
    rng = np.random.default_rng(0)
    gaps = rng.lognormal(3.0, 0.6, 5000)
    hist = np.zeros(K.ITL_HIST_BINS, np.int64)
    for g in gaps:
        hist[K.itl_bin(g)] += 1
    q = hist_quantile_upper(hist, 0.99)
    true = np.quantile(gaps, 0.99, method="inverted_cdf")
    assert true <= q <= true * 1.01


def test_the_residency_cliff_shows_in_the_slo():
    """16 busy adapters on 8 slots swap and queue: the p99 TTFT explodes; on 16 slots it
    does not (the cliff the SLO methods keep GPUs away from)."""
    prof = load_profile(PROFILE)
    ads = [Adapter(f"a{i}", 8, 0.5) for i in range(16)]
    slo = Slo(ttft_p99_ms=500.0)
    few = simulate_server(prof, ads, ServerConfig(max_loras=8, slo=slo), 600.0, seed=0)
    many = simulate_server(prof, ads, ServerConfig(max_loras=16, slo=slo), 600.0, seed=0)
    assert not few.slo_met and not few.accepted and not few.starved
    assert many.slo_met and many.accepted
    assert few.slo["observed"]["ttft_p99_ms"] > 20 * many.slo["observed"]["ttft_p99_ms"]


# ----------------------------------------------------------------------------- placement
def _tiny(rates, ranks, slo, duration=300.0, count=4):
    return instance_from_dict({
        "name": "tiny-slo", "duration_s": duration, "seed": 3,
        "adapters": [{"id": f"a{i}", "rank": r, "rate": q}
                     for i, (q, r) in enumerate(zip(rates, ranks))],
        "gpus": [{"name": "h100", "profile": PROFILE, "count": count}],
        **({"slo": slo.to_dict()} if slo else {})})


def _brute_force_min_gpus(inst) -> int | None:
    """Fewest GPUs of any twin-accepted placement: every ordered partition of the adapters into
    GPUs (GPU g draws seed ``inst.seed + g``), every max_lora_rank and every integer Amax."""
    prof = load_profile(PROFILE)
    n = len(inst.adapters)
    ok_cache: dict[tuple, bool] = {}

    def accepted(group: tuple[int, ...], g: int) -> bool:
        key = (group, g)
        if key not in ok_cache:
            pairs = [(inst.adapters[i], 1.0) for i in group]
            need = max(inst.adapters[i].rank for i in group)
            ok = False
            for rank in sorted(r for r in prof.supported_ranks if r >= need):
                plan = plan_gpu("h100", PROFILE, 1, pairs, inst.mean_tokens, rank)
                top = amax_upper(plan)
                if top >= 1 and max(s for s, _ in twin_scores(
                        inst, plan, list(range(1, top + 1)), inst.seed + g,
                        inst.duration_s, workers=1)) >= 1.0:
                    ok = True
                    break
            ok_cache[key] = ok
        return ok_cache[key]

    best = None
    for labels in itertools.product(range(n), repeat=n):     # GPU of each adapter
        k = max(labels) + 1
        if sorted(set(labels)) != list(range(k)) or (best is not None and k >= best):
            continue
        groups = [tuple(i for i in range(n) if labels[i] == g) for g in range(k)]
        if all(accepted(grp, g) for g, grp in enumerate(groups)):
            best = k
    return best


@pytest.mark.parametrize("rates,ranks,slo,binds", [
    ((0.6, 0.6, 0.6), (8, 8, 16), Slo(itl_p99_ms=15.5, latency="engine"), True),
    ((1.2, 0.4, 0.4), (8, 16, 8), Slo(itl_p99_ms=16.5, ttft_p99_ms=80.0, latency="engine"), True),
    ((0.8, 0.8, 0.3), (16, 8, 8), Slo(itl_p99_ms=14.2, latency="engine"), True),
    ((0.8, 0.8, 0.3), (16, 8, 8), Slo(ttft_p99_ms=120.0, itl_p99_ms=30.0, latency="engine"),
     False),
    # judged on the client's latencies (the default): the delivery delays widen the gaps' tail
    ((0.6, 0.6, 0.6), (8, 8, 16), Slo(itl_p99_ms=18.0), True),
])
def test_slo_optimal_count_agrees_with_brute_force(rates, ranks, slo, binds):
    """The twin lower bound under the SLO never exceeds the brute-force optimum, greedy's
    placement is accepted and, where it is certified, uses exactly the optimum."""
    inst = _tiny(rates, ranks, slo)
    best = _brute_force_min_gpus(inst)
    assert best is not None
    without = _brute_force_min_gpus(_tiny(rates, ranks, None))
    assert best >= without                      # an SLO only removes placements
    if binds:
        assert best > without                   # the tight cases do bind
    p = solve(inst, "greedy", verify=True, workers=1)
    assert p.verdict == "accepted" and all(g.verified.ok for g in p.gpus)
    assert p.n_gpus >= best
    certified, lb = twin_certificate(inst, p)
    assert lora_gpu_lower_bound(inst, inst.duration_s) <= best
    assert lb <= best
    if certified:
        assert p.n_gpus == best
        assert "under SLO" in p.summary()


def test_verify_rejects_a_gpu_that_misses_its_slo_and_greedy_repairs_it():
    rates, ranks = (0.6,) * 8, (8, 8, 16, 8, 8, 16, 8, 8)
    loose = _tiny(rates, ranks, None, duration=600.0, count=6)
    one = solve(loose, "greedy", verify=True, workers=1)
    assert one.n_gpus == 1 and one.verdict == "accepted"
    tight = _tiny(rates, ranks, Slo(ttft_p99_ms=100.0, itl_p99_ms=30.0), duration=600.0,
                  count=6)
    judged = verify(Placement(tight.name, "given", "solved", one.gpus), tight)
    assert judged.verdict == "rejected"
    g = judged.gpus[0].verified
    assert not g.starved and not g.slo_met and not g.ok
    assert "SLO" in judged.table()
    fixed = solve(tight, "greedy", verify=True, workers=1)
    assert fixed.verdict == "accepted" and fixed.n_gpus >= 2
    assert all(g.verified.slo["ok"] for g in fixed.gpus)
    assert any("twin rejected" in r for r in fixed.repairs)


# ----------------------------------------------------------------------------- the bound
SLO_CAP = Slo(ttft_p99_ms=200.0, itl_p99_ms=40.0)
CAP_DUR = 300.0


def _slo_cap() -> float:
    from optim.capacity import BOUND_SEEDS, carry_limit
    from twin.sharegpt import default_lengths
    return carry_limit(PROFILE, 8, 1, default_lengths(), CAP_DUR, tuple(range(BOUND_SEEDS)),
                       0.9, 1, SLO_CAP).limit_tps


def test_the_slo_cap_is_below_the_throughput_cap():
    from optim.capacity import BOUND_SEEDS, carry_limit
    from twin.sharegpt import default_lengths
    plain = carry_limit(PROFILE, 8, 1, default_lengths(), CAP_DUR, tuple(range(BOUND_SEEDS)),
                        0.9, 1).limit_tps
    assert 0 < _slo_cap() < plain


@pytest.mark.parametrize("n,amax,rank,seed,over", [
    (1, 1, 8, 0, 1.001), (1, 2, 16, 7, 1.01), (2, 2, 8, 3, 1.001), (3, 4, 8, 11, 1.02),
    (4, 2, 32, 5, 1.005), (6, 6, 8, 9, 1.001), (8, 4, 16, 2, 1.03), (12, 13, 8, 4, 1.001)])
def test_no_sampled_gpu_meets_the_slo_above_the_slo_cap(n, amax, rank, seed, over):
    """Adversarial GPUs offered just above the one-adapter cap under the SLO (any count of
    adapters of unequal rates, any rank, any slots, any seed) are never accepted: the bound
    that divides the load by that cap stays sound under the SLO."""
    from twin.sharegpt import default_lengths
    per = default_lengths().mean_input + default_lengths().mean_output
    rng = np.random.default_rng(seed)
    w = rng.uniform(0.3, 1.0, n)
    load = over * _slo_cap()
    ads = [Adapter(f"a{i}", rank, float(x / w.sum() * load / per)) for i, x in enumerate(w)]
    m = simulate_server(load_profile(PROFILE), ads, ServerConfig(max_loras=amax, slo=SLO_CAP),
                        CAP_DUR, lengths=default_lengths(), seed=seed)
    assert not m.accepted


def test_verify_reports_attainment_per_adapter():
    """Each GPU's SLO record lists, per adapter (the GPU's order), its judged requests and the
    share within every per-request bound; together they make the GPU's attainment."""
    rates, ranks = (0.6,) * 8, (8, 8, 16, 8, 8, 16, 8, 8)
    inst = _tiny(rates, ranks, Slo(ttft_p99_ms=60.0, warmup_s=30.0), duration=300.0, count=6)
    one = solve(_tiny(rates, ranks, None, duration=300.0, count=6), "greedy", verify=True,
                workers=1)
    judged = verify(Placement(inst.name, "given", "solved", one.gpus), inst)
    s = judged.gpus[0].verified.slo
    n, ok = np.array(s["adapter_judged"]), np.array(s["adapter_attainment"])
    assert len(n) == judged.gpus[0].n_adapters and n.sum() == s["judged_requests"]
    assert np.nansum(n * ok) / n.sum() == pytest.approx(s["attainment"])
    assert 0.0 < s["attainment"] < 1.0           # a bound that some requests miss
    assert "% ok" in judged.table()


def test_client_view_adds_the_latency_tail_to_the_judgement():
    """The default SLO judges the client's latencies (engine + the profile's fitted latency
    tail): TTFT and the gaps' p99 above the engine's; ``latency="engine"`` gives the
    engine's."""
    from twin.latency_tail import latency_tail_for
    from twin.server import ServerConfig, simulate_server
    from twin.workload import Adapter

    assert latency_tail_for(PROFILE) is not None
    ads = [Adapter(f"a{i}", 8, 0.8) for i in range(6)]
    runs = {}
    for view in ("client", "engine"):
        slo = Slo(ttft_p99_ms=500.0, itl_p99_ms=40.0, latency=view)
        m = simulate_server(load_profile(PROFILE), ads, ServerConfig(max_loras=4, slo=slo),
                            300.0, seed=1)
        runs[view] = m.slo["observed"]
    assert runs["client"]["ttft_p99_ms"] > runs["engine"]["ttft_p99_ms"]
    assert runs["client"]["itl_p99_ms"] > runs["engine"]["itl_p99_ms"]
    assert Slo(ttft_p99_ms=1.0).latency == "client"
    assert Slo.parse("ttft_p99_ms=5,latency=engine").latency == "engine"
    assert "engine latencies" in Slo(ttft_p99_ms=1.0, latency="engine").describe()
    with pytest.raises(ValueError, match="slo.latency"):
        Slo(ttft_p99_ms=1.0, latency="server")


def test_exact_configurations_are_capped_by_the_slo_and_cpsat_agrees_with_brute_force():
    """Under an SLO the exact model's configurations carry at most the one-adapter carry limit
    under it (``load_caps``) or, with greedy's SLO table, at most the table's limit at the
    largest busy count each admits; cpsat (which builds its model from the table) gives a
    twin-accepted placement, never below the brute-force optimum, and equal to it when it claims
    optimality in the twin."""
    from optim.exact.capacity import build_problem
    from optim.exact.problem import scale_cap
    from optim.feasibility import one_adapter_caps
    from optim.slo_capacity import measure_slo_capacity
    rates, ranks = (0.6, 0.6, 0.6), (8, 8, 16)
    inst = _tiny(rates, ranks, Slo(itl_p99_ms=20.0))
    caps = one_adapter_caps(inst, inst.duration_s, 1)
    plain = build_problem(_tiny(rates, ranks, None))
    capped = build_problem(inst, load_caps=caps)
    top = scale_cap(caps["h100"])
    assert max(c.cap for c in plain.types[0].configs) > top
    assert max(c.cap for c in capped.types[0].configs) == top
    assert any("under the SLO" in n for n in capped.notes)
    tables = measure_slo_capacity(inst, inst.duration_s, 1)
    tabled = build_problem(inst, slo_tables=tables)
    assert tables["h100"].one_tps == pytest.approx(caps["h100"])
    assert max(c.cap for c in tabled.types[0].configs) <= top
    assert any("SLO table" in n for n in tabled.notes)
    best = _brute_force_min_gpus(inst)
    from optim.methods import MethodOptions
    p = solve(inst, "cpsat", verify=True, workers=1, options=MethodOptions(time_limit_s=60))
    assert p.verdict == "accepted" and p.n_gpus >= best
    if "optimal in the twin" in (p.params.get("claim") or ""):
        assert p.n_gpus == best


def _table(one: float, ranks_limits: dict[int, tuple[tuple[float, ...], tuple[float, ...]]]):
    from optim.slo_capacity import RankCurve, SloCapacity
    curves = tuple(RankCurve(r, tuple(range(1, len(b) + 1)), tuple(lim), tuple(b))
                   for r, (b, lim) in sorted(ranks_limits.items()))
    return SloCapacity("h100", one, curves)


@pytest.mark.parametrize("seed", range(4))
def test_slo_table_caps_no_admitted_gpu_above_greedys_gate(seed):
    """Every adapter set a configuration capped by the SLO table admits carries at most what
    greedy's SLO gate (``SloCapacity.row_caps``) allows a GPU of that server rank: the exact
    models never propose a GPU greedy's packing would call over the SLO. Random tables and
    adapter sets on the committed capacity model (piece feature ``busy30``, which counts every
    adapter at least as busy as the table's ``busy5``)."""
    from optim.exact.capacity import build_problem
    from optim.exact.problem import LOAD_SCALE
    from surrogates.features import FEATURES, IDX, adapter_feature_matrix
    rng = np.random.default_rng(seed)
    n = 24
    rates = rng.lognormal(-1.5, 1.2, n).clip(0.005, 3.0)
    rks = rng.choice([8, 16, 32], n)
    inst = _tiny(tuple(rates), tuple(int(r) for r in rks), Slo(itl_p99_ms=50.0))
    busy = np.cumsum(rng.uniform(0.3, 2.0, 6))
    lim = np.sort(rng.uniform(800.0, 9000.0, 6))[::-1]
    table = _table(float(lim[0]), {8: (tuple(busy), tuple(lim)),
                                   32: (tuple(busy), tuple(lim * 0.8))})
    P = build_problem(inst, slo_tables={"h100": table})
    cfgs = P.types[0].configs
    assert cfgs
    checked = 0
    for _ in range(400):
        items = sorted(rng.choice(n, int(rng.integers(1, n + 1)), replace=False).tolist())
        for p in P.configs_admitting(0, items):
            c = cfgs[p]
            M = adapter_feature_matrix([int(rks[i]) for i in items],
                                       [float(rates[i]) for i in items], inst.lengths)
            row = np.zeros(len(FEATURES))
            row[:M.shape[1]] = M.sum(axis=0)
            row[IDX["max_rank"]] = c.rank
            gate = float(table.row_caps(row[None, :])[0])
            assert sum(P.loads[i] for i in items) / LOAD_SCALE <= gate * (1 + 1e-9), (items, c)
            checked += 1
    assert checked > 20


def test_slo_table_cap_falls_back_to_the_one_adapter_limit_on_other_features():
    """A piece feature that may count an adapter less busy than the table's (here the request
    rate) cannot carry the table's curve: only its one-adapter limit caps the configurations."""
    from optim.exact.capacity import _slo_capped, slo_table_cap
    from optim.exact.problem import Config, scale_cap
    table = _table(5000.0, {8: ((1.0, 4.0), (5000.0, 2000.0))})
    cfgs = (Config(8, 16, 0, 10 ** 7, scale_cap(9000.0), label="a"),)
    out, note = _slo_capped(cfgs, table, "rate", integral=False)
    assert out[0].cap == scale_cap(5000.0) and "does not bound" in note
    out, note = _slo_capped(cfgs, table, "busy30", integral=False)
    assert out[0].cap == scale_cap(2000.0) and "SLO table" in note
    # at x = 2.5 (between the points): interpolated, never above the one-adapter limit
    assert slo_table_cap(table, 8, 2_500_000, integral=False) == pytest.approx(3500.0, rel=1e-3)
    assert slo_table_cap(table, 8, 0, integral=False) == pytest.approx(5000.0)
