"""Contract tests of the surrogates package on tiny, short-duration twin datasets."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from experiments.common import shared_data_dir

from surrogates.dataset import (build_dataset, load_dataset, run_scenario, sample_scenario,
                                valid_amaxes)
from surrogates.domain import validate
from surrogates.encodable import CapacityModel
from surrogates.fast import FastModel
from surrogates.features import (ADDITIVE, IDX, adapter_feature_matrix,
                                 adapter_feature_vector, gpu_features)
from surrogates.memory import KvTable
from surrogates.metrics import smape
from surrogates.models import (ItlRegressor, StarvationClassifier, ThroughputRegressor,
                               design_matrix)
from surrogates.trees import from_hgb, from_tree
from twin.sharegpt import default_lengths
from twin.profile import load_profile

PROFILE = "llama-3.1-8b-instruct"
REPO = Path(__file__).resolve().parent.parent
TRAINED = REPO / "surrogates" / "trained"
SMALL = dict(max_iter=15, learning_rate=0.3, max_leaf_nodes=7, min_samples_leaf=2)


@pytest.fixture(scope="module")
def kv():
    return KvTable.from_profile(load_profile(PROFILE)).to_json()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """12 scenarios x 120 simulated seconds (a few seconds of CPU)."""
    out = tmp_path_factory.mktemp("ds") / "tiny.parquet"
    build_dataset(PROFILE, 12, out, workers=1, seed=3, duration_s=120.0, progress=False,
                  log=lambda s: None)
    return out, load_dataset(out)


# ------------------------------------------------------------------------------ features
def test_adapter_features_sum_to_gpu_features():
    L = default_lengths()
    ranks, rates = [8, 16, 32, 8], [0.1, 0.5, 0.02, 1.0]
    s = sum(adapter_feature_vector(r, x, L) for r, x in zip(ranks, rates))
    g = gpu_features(ranks, rates, 16, L)
    assert np.allclose(g[:len(ADDITIVE)], s)
    assert g[IDX["max_rank"]] == 32 and g[IDX["amax"]] == 16
    assert np.allclose(adapter_feature_matrix(ranks, rates, L).sum(0), s)
    assert g[IDX["load"]] == pytest.approx(sum(rates) * (L.mean_input + L.mean_output))


@pytest.mark.parametrize("kw,field", [
    (dict(rank=12, rate=0.1), "rank"), (dict(rank=8, rate=0.0), "rate"),
    (dict(rank=8, rate=float("nan")), "rate")])
def test_adapter_features_bad_input(kw, field):
    with pytest.raises(ValueError, match=field):
        adapter_feature_vector(lengths=(200.0, 200.0), **kw)


def test_gpu_features_bad_input():
    with pytest.raises(ValueError, match="amax"):
        gpu_features([8], [0.1], 0, (200, 200))
    with pytest.raises(ValueError, match="max_rank"):
        gpu_features([16], [0.1], 8, (200, 200), max_rank=8)
    with pytest.raises(ValueError, match="mean_in"):
        gpu_features([16], [0.1], 8, (-1, 200))


def test_validate_names_field():
    f = gpu_features([8, 8], [0.1, 0.2], 8, (200, 200))
    bad = f.copy()
    bad[IDX["n_rank8"]] = 1
    with pytest.raises(ValueError, match="n_rank"):
        validate(bad)
    bad = f.copy()
    bad[IDX["load"]] = np.inf
    with pytest.raises(ValueError, match="load"):
        validate(bad)
    with pytest.raises(ValueError, match="shape"):
        validate(f[:-1])


# ------------------------------------------------------------------------------ dataset
def test_scenarios_are_seeded():
    a, b = sample_scenario(5, 17), sample_scenario(5, 17)
    assert a == b
    assert sample_scenario(6, 17) != a
    assert valid_amaxes(20) == (8, 16, 32)
    assert valid_amaxes(1) == (8,)
    with pytest.raises(ValueError, match="seed"):
        sample_scenario(-1, 0)


def test_build_resumes_and_is_deterministic(tmp_path, tiny):
    _, full = tiny
    out = tmp_path / "d.parquet"
    build_dataset(PROFILE, 5, out, workers=1, seed=3, duration_s=120.0, progress=False,
                  log=lambda s: None)
    first = load_dataset(out)
    summary = build_dataset(PROFILE, 12, out, workers=2, seed=3, duration_s=120.0,
                            progress=False, log=lambda s: None)
    assert summary["scenarios_run"] == 7
    again = load_dataset(out)
    # old rows kept as they were, new rows identical to a one-shot build
    cols = [c for c in full.columns if c != "wall_s"]
    pd.testing.assert_frame_equal(again[again.scenario_id < 5][cols].reset_index(drop=True),
                                  first[cols].reset_index(drop=True))
    pd.testing.assert_frame_equal(again[cols], full[cols])
    # a rerun with nothing to do adds nothing
    assert build_dataset(PROFILE, 12, out, workers=1, seed=3, duration_s=120.0, progress=False,
                         log=lambda s: None)["scenarios_run"] == 0
    with pytest.raises(ValueError, match="seed"):
        build_dataset(PROFILE, 13, out, workers=1, seed=4, duration_s=120.0, progress=False,
                      log=lambda s: None)


def test_build_bad_input(tmp_path):
    with pytest.raises(ValueError, match="profile"):
        build_dataset("no-such-gpu", 2, tmp_path / "x.parquet", progress=False)
    with pytest.raises(ValueError, match="backend"):
        build_dataset(PROFILE, 2, tmp_path / "x.parquet", backend="spark", progress=False)


def test_rows_match_twin(tiny):
    _, df = tiny
    sc = sample_scenario(3, 0)
    rows = run_scenario(sc, PROFILE, 120.0)
    got = df[df.scenario_id == 0]
    assert list(got.amax) == [r["amax"] for r in rows]
    assert np.allclose(got.throughput_tps, [r["throughput_tps"] for r in rows])
    # starvation rule of the twin
    nm = ~got.memory_error
    assert (got.starved[nm] == (got.throughput_tps[nm] < 0.9 * got.offered_tps[nm])).all()


# ------------------------------------------------------------------------------ trees
def test_forest_export_matches_sklearn():
    from sklearn.ensemble import HistGradientBoostingClassifier, HistGradientBoostingRegressor
    from sklearn.tree import DecisionTreeRegressor
    rng = np.random.default_rng(0)
    X = rng.random((400, 5))
    y = np.sin(4 * X[:, 0]) + X[:, 1] ** 2
    m = HistGradientBoostingRegressor(max_iter=20, random_state=0).fit(X, y)
    assert np.allclose(from_hgb(m).predict(X), m.predict(X))
    c = HistGradientBoostingClassifier(max_iter=20, random_state=0).fit(X, y > 0.8)
    assert np.allclose(from_hgb(c).predict(X), c.decision_function(X))
    t = DecisionTreeRegressor(max_depth=6, random_state=0).fit(X, y)
    assert np.allclose(from_tree(t).predict(X), t.predict(X))


# ------------------------------------------------------------------------------ models
@pytest.mark.parametrize("cls,target", [(ThroughputRegressor, "throughput_tps"),
                                        (StarvationClassifier, "starved"),
                                        (ItlRegressor, "mean_itl_ms")])
def test_estimator_contract(cls, target, tiny, kv, tmp_path):
    from sklearn.base import clone
    _, df = tiny
    m = cls(kv_capacity=kv, **SMALL)
    params = m.get_params()
    assert params["max_iter"] == 15
    assert not [k for k in vars(m) if k.endswith("_")]          # nothing fitted in __init__
    with pytest.raises(ValueError, match="not fitted"):
        m.predict(df)
    m.fit(df, df[target])
    assert hasattr(m, "forest_") and hasattr(m, "domain_")
    c = clone(m)
    assert not hasattr(c, "forest_")
    p1 = m.predict(df)
    p2 = clone(m).fit(df, df[target]).predict(df)      # deterministic refit
    assert np.array_equal(p1, p2, equal_nan=True)
    m.save(tmp_path / "m")
    assert not list(tmp_path.glob("*.pkl"))
    p3 = cls.load(tmp_path / "m").predict(df)
    assert np.array_equal(p1, p3, equal_nan=True)
    mem = df.memory_error.to_numpy()
    if cls is ThroughputRegressor:
        assert np.all(p1[mem] == 0)
    elif cls is StarvationClassifier:
        assert np.all(p1[mem])
        assert m.predict_proba(df).shape == (len(df), 2)


def test_extrapolation_is_flagged(tiny, kv):
    _, df = tiny
    m = ThroughputRegressor(kv_capacity=kv, **SMALL).fit(df, df.throughput_tps)
    M = validate(df)
    far = M[:1].copy()
    far[0, IDX["load"]] *= 1000
    far[0, IDX["load_in"]] *= 1000
    far[0, IDX["rate"]] *= 1000
    with pytest.raises(ValueError, match="outside the trained domain"):
        m.predict(far)
    y, flag = m.predict_with_flags(np.vstack([M[:3], far]))
    assert list(flag) == [False, False, False, True]
    assert np.isfinite(y).all()


def test_model_needs_kv_table(tiny):
    _, df = tiny
    with pytest.raises(ValueError, match="kv_capacity"):
        ThroughputRegressor(**SMALL).fit(df, df.throughput_tps)


# ------------------------------------------------------------------------------ fast
def test_fast_kernel_matches_design_matrix(tiny, kv, tmp_path):
    _, df = tiny
    M = validate(df)
    t = ThroughputRegressor(kv_capacity=kv, **SMALL).fit(M, df.throughput_tps)
    s = StarvationClassifier(kv_capacity=kv, **SMALL).fit(M, df.starved)
    fast = FastModel.distill(t, s, M, n_trees=8, depth=4, learning_rate=0.3)
    thr, st = fast.predict_unchecked(M)
    D, kvt = design_matrix(M, t.kv_)
    ref = np.maximum((M[:, IDX["load"]] + 1) * np.exp(fast.thr_forest.predict(D)) - 1, 0)
    ref[kvt <= 0] = 0
    assert np.allclose(thr, ref, rtol=1e-9, atol=1e-9)
    logit = fast.starve_forest.predict(D)
    assert np.array_equal(st[kvt > 0], (logit >= 0)[kvt > 0])
    assert st[kvt <= 0].all()
    fast.save(tmp_path / "f")
    thr2, st2 = FastModel.load(tmp_path / "f").predict(M)
    assert np.array_equal(thr, thr2) and np.array_equal(st, st2)


# ------------------------------------------------------------------------------ encodable
def _brute(pieces, M):
    out = np.zeros(len(M), bool)
    for i, row in enumerate(M):
        hit = [p for p in pieces if p.contains(int(row[IDX["max_rank"]]), int(row[IDX["amax"]]),
                                               row[IDX[p.x_feature]])]
        assert len(hit) == 1
        out[i] = (not hit[0].memory_error) and row[IDX["load"]] <= hit[0].cap_load
    return out


def test_capacity_pieces_define_predictions(tiny, kv, tmp_path):
    _, df = tiny
    M = validate(df)
    m = CapacityModel(kv_capacity=kv, min_rows=1).fit(M, df.starved, df.throughput_tps)
    pieces = m.pieces()
    _, feas, ood = m.predict_with_flags(M)
    assert np.array_equal(feas, _brute(pieces, M))
    assert np.array_equal(m.predict_feasible(M[~ood]), feas[~ood])
    # caps are non-increasing in x within each (rank, amax)
    by = {}
    for p in pieces:
        if p.n_rows >= 1 and not p.memory_error:
            by.setdefault((p.max_rank, p.amax), []).append((p.x_lo, p.cap_load))
    for v in by.values():
        caps = [c for _, c in sorted(v)]
        assert all(a >= b for a, b in zip(caps, caps[1:]))
    m.save(tmp_path / "c.json")
    m2 = CapacityModel.load(tmp_path / "c.json")
    assert m2.pieces() == pieces
    off = M[:1].copy()
    off[0, IDX["amax"]] = 17
    with pytest.raises(ValueError, match="amax"):
        m.predict_feasible(off)


# ------------------------------------------------------------------------------ CLI
def test_cli_train_evaluate_quick(tiny, tmp_path, capsys):
    from surrogates.cli import main
    path, _ = tiny
    assert main(["train", "--data", str(path), "--out", str(tmp_path / "m"), "--quick",
                 "--test-frac", "0.3"]) == 0
    man = json.loads((tmp_path / "m" / "manifest.json").read_text())
    assert man["profile"] == PROFILE and man["regenerate"]
    assert main(["evaluate", "--model", str(tmp_path / "m"), "--data", str(path), "--split",
                 "all"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    keys = [kv.split("=")[0] for kv in last.split()]
    assert keys == ["throughput_smape", "starvation_f1", "fast_throughput_smape", "fast_us"]
    assert main(["build", "--profile", "nope", "--samples", "1", "--out",
                 str(tmp_path / "x.parquet")]) == 2
    assert "unknown profile" in capsys.readouterr().err


# ------------------------------------------------------------------------------ committed models
def _committed(profile):
    d = TRAINED / profile
    if not (d / "manifest.json").exists():
        pytest.skip(f"no committed model in {d} (run python -m surrogates train)")
    from surrogates.train import load_bundle
    return load_bundle(d)


def _in_domain_samples(b, n=400, seed=11):
    """GPU feature vectors of sampled scenarios (no simulation) inside the trained domain."""
    rows = []
    for i in range(n):
        sc = sample_scenario(seed, i)
        for a in sc.amaxes:
            rows.append(gpu_features(sc.ranks, sc.rates, a, (sc.mean_in, sc.mean_out)))
    M = validate(np.asarray(rows))
    kvt = b.throughput.kv_.tokens_array(M[:, IDX["amax"]], M[:, IDX["max_rank"]])
    return M[~b.throughput.domain_.flags(M) & (kvt > 0)]


@pytest.mark.parametrize("profile", ["llama-3.1-8b-instruct", "qwen-2.5-7b-instruct"])
def test_committed_fast_and_encodable_agree_with_full(profile):
    b = _committed(profile)
    M = _in_domain_samples(b)
    full = b.throughput.predict(M)
    fstarve = b.starvation.predict(M)
    fast_thr, fast_st = b.fast.predict(M)
    assert smape(full, fast_thr) < 3.0
    assert np.mean(fast_st == fstarve) > 0.95
    _, feas, ood = b.capacity.predict_with_flags(M)
    assert np.mean(feas[~ood] == ~fstarve[~ood]) > 0.85


def test_committed_llama_on_real_maxsearch(capsys):
    csv = shared_data_dir() / "validation_llama" / "maxsearch_llama.csv"
    if not csv.exists():
        pytest.skip(f"real max-search CSV not found at {csv} (set LORA_SHARED_DATA)")
    _committed("llama-3.1-8b-instruct")          # skips when the models are absent
    from surrogates.evaluate import evaluate_real
    res = evaluate_real(TRAINED / "llama-3.1-8b-instruct", csv)
    assert res["real_throughput_smape"] < 10 and res["real_starvation_f1"] > 0.9
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("real_throughput_smape=")


# ------------------------------------------------------------------------------ properties
from hypothesis import given, settings
from hypothesis import strategies as st


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([8, 16, 32]), st.floats(1e-3, 5.0)), min_size=2,
                max_size=30), st.integers(1, 29))
def test_features_of_a_union_are_sums(adapters, cut):
    """Additive features of a GPU = sum over any split of its adapters (what MILPs rely on)."""
    cut = min(cut, len(adapters) - 1)
    ranks = [r for r, _ in adapters]
    rates = [x for _, x in adapters]
    L = (220.0, 190.0)
    whole = gpu_features(ranks, rates, 16, L)
    a = gpu_features(ranks[:cut], rates[:cut], 16, L)
    b = gpu_features(ranks[cut:], rates[cut:], 16, L)
    k = len(ADDITIVE)
    assert np.allclose(whole[:k], a[:k] + b[:k])
    assert whole[IDX["max_rank"]] == max(a[IDX["max_rank"]], b[IDX["max_rank"]])


def test_oblivious_forest_matches_reference():
    from surrogates.oblivious import fit_oblivious
    rng = np.random.default_rng(1)
    X = rng.random((500, 4))
    y = np.sin(5 * X[:, 0]) + X[:, 1]
    f = fit_oblivious(X, y, n_trees=30, depth=4, learning_rate=0.3)
    g = fit_oblivious(X, y, n_trees=30, depth=4, learning_rate=0.3)
    assert np.array_equal(f.leaf, g.leaf)                       # deterministic
    ref = np.full(len(X), f.base)
    for t in range(f.n_trees):
        idx = np.zeros(len(X), dtype=np.int64)
        for lvl in range(f.depth):
            idx = 2 * idx + (X[:, f.feat[t, lvl]] > f.thr[t, lvl])
        ref += f.leaf[t, idx]
    assert np.allclose(f.predict(X), ref)
    assert np.mean((f.predict(X) - y) ** 2) < 0.1 * np.var(y)


def test_capacity_arrays_match_pieces(tiny, kv):
    _, df = tiny
    m = CapacityModel(kv_capacity=kv, min_rows=1).fit(validate(df), df.starved, df.throughput_tps)
    arr = m.as_arrays()
    for p in m.pieces():
        r = list(arr["ranks"]).index(p.max_rank)
        a = list(arr["amax_grid"]).index(p.amax)
        k = int(np.searchsorted(arr["breaks"], p.x_lo))
        assert arr["cap"][r, a, k] == p.cap_load
        assert arr["usable"][r, a, k] == (p.n_rows >= 1 and not p.memory_error)


def test_monotone_caps_raise_censored_pieces():
    """A piece whose rows never starve only shows the largest load tried: it must not cap every
    larger adapter count (running minimum over uncensored pieces only), and it is raised to the
    next piece's cap (fewer adapters at the same load are never harder)."""
    from surrogates.encodable import _monotone_caps
    caps = [(2700.0, 1, 0, 20, True),      # n=1: censored at the largest load tried
            (9000.0, 1, 0, 20, False),     # n in [2, 4)
            (9500.0, 1, 0, 20, False),     # noise above the previous uncensored cap
            (0.0, 1, 0, 0, False),         # no data: untouched
            (5000.0, 1, 0, 20, False)]
    out = [c[0] for c in _monotone_caps(caps, min_rows=3)]
    assert out == [9000.0, 9000.0, 9000.0, 0.0, 5000.0]
    assert all(a >= b for a, b in zip(out[:3], out[1:3]))
