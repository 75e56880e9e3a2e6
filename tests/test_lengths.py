"""Tests for twin.lengths (length models, exact means, ShareGPT profile)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from experiments.common import shared_data_dir
from hypothesis import given, settings
from hypothesis import strategies as st

from twin.length_models import length_model_from_dict, load_length_model
from twin.lengths import ClippedNormalLengths, EmpiricalLengths, FixedLengths
from twin.sharegpt import fit_sharegpt_histogram, sharegpt_lengths

REPO = Path(__file__).resolve().parents[1]


def shared_data() -> Path:
    """Shared measurement folder from $LORA_SHARED_DATA (default <repo>/../shared/data/vllm_h100)."""
    p = shared_data_dir()
    if not p.is_dir():
        pytest.skip(f"shared data folder not found at {p} (set LORA_SHARED_DATA)")
    return p


def assert_sample_mean_close(model, n=400_000, seed=1, k=5.0):
    i, o = model.sample(n, seed)
    for x, mu in ((i, model.mean_input), (o, model.mean_output)):
        se = x.std() / np.sqrt(n) + 1e-9
        assert abs(x.mean() - mu) <= k * se + 1e-9, (x.mean(), mu, se)


# --------------------------------------------------------------------------- fixed


def test_fixed():
    m = FixedLengths(250, 230)
    i, o = m.sample(5, 0)
    assert i.dtype == np.int32 and o.dtype == np.int32
    assert i.tolist() == [250] * 5 and o.tolist() == [230] * 5
    assert (m.mean_input, m.mean_output) == (250.0, 230.0)
    assert m.describe()["kind"] == "fixed"
    with pytest.raises(ValueError, match="FixedLengths: output_len must be >= 1, got 0"):
        FixedLengths(3, 0)
    with pytest.raises(ValueError, match="input_len must be an integer"):
        FixedLengths(2.5, 3)


# --------------------------------------------------------------------------- clipped normal


@pytest.mark.parametrize(
    "params",
    [
        dict(mu_input=223, sigma_input=200, mu_output=196, sigma_output=190),
        dict(mu_input=900, sigma_input=600, mu_output=1500, sigma_output=900),  # heavy clipping
        dict(mu_input=2.0, sigma_input=3.0, mu_output=1.5, sigma_output=2.0, min_len=1),  # paper-twin style
        dict(mu_input=100, sigma_input=50, mu_output=80, sigma_output=40, max_input=None, max_total=None),
    ],
)
def test_clipped_normal_exact_mean_matches_sample(params):
    m = ClippedNormalLengths(**params)
    assert_sample_mean_close(m)


def test_clipped_normal_mean_accounts_for_clipping():
    m = ClippedNormalLengths(0.0, 10.0, 0.0, 10.0, min_len=1)
    # rint(X) clipped at 1: mean well above the normal's mu = 0
    assert m.mean_input > 3.0
    z = ClippedNormalLengths(10.4, 0.0, 7.6, 0.0)
    assert (z.mean_input, z.mean_output) == (10.0, 8.0)
    assert z.sample(3, 0)[0].tolist() == [10, 10, 10]


def test_clipped_normal_errors():
    with pytest.raises(ValueError, match="sigma_input must be >= 0"):
        ClippedNormalLengths(10, -1, 10, 1)
    with pytest.raises(ValueError, match="mu_output must be finite"):
        ClippedNormalLengths(10, 1, float("nan"), 1)
    with pytest.raises(ValueError, match="max_input \\+ min_len must be <= max_total"):
        ClippedNormalLengths(10, 1, 10, 1, max_input=2048, max_total=2048)


@settings(max_examples=40, deadline=None)
@given(
    mu_in=st.floats(-100, 3000), sd_in=st.floats(0, 2000), mu_out=st.floats(-100, 3000), sd_out=st.floats(0, 2000),
    min_len=st.integers(1, 8), max_input=st.integers(8, 1500), extra=st.integers(8, 1500), seed=st.integers(0, 2**32),
)
def test_clipped_normal_samples_respect_limits(mu_in, sd_in, mu_out, sd_out, min_len, max_input, extra, seed):
    max_total = max_input + extra
    m = ClippedNormalLengths(mu_in, sd_in, mu_out, sd_out, min_len=min_len, max_input=max_input, max_total=max_total)
    i, o = m.sample(500, seed)
    assert i.dtype == np.int32 and o.dtype == np.int32
    assert i.min() >= min_len and o.min() >= min_len
    assert i.max() <= max_input and (i + o).max() <= max_total
    assert min_len <= m.mean_input <= max_input
    assert min_len <= m.mean_output <= max_total - min_len
    j, p = m.sample(500, seed)
    assert np.array_equal(i, j) and np.array_equal(o, p)


# --------------------------------------------------------------------------- empirical


def _hist_model(**kw):
    return EmpiricalLengths.from_histograms([0, 10, 100, 1000], [5, 3, 2], [1, 50, 500, 3000], [1, 1, 1], **kw)


def test_histogram_exact_mean_matches_sample():
    m = _hist_model()
    assert_sample_mean_close(m)
    i, o = m.sample(50_000, 3)
    assert i.min() >= 1 and i.max() <= 1024 and (i + o).max() <= 2048
    # no upper clipping: mean of a uniform-in-bin histogram is the mix of bin midpoints (rint is
    # mean-preserving on integer-aligned bins) plus the [0, 0.5) sliver that rounds to 0 and is
    # clipped to 1 (probability 0.5 * 0.05)
    u = _hist_model(max_input=None, max_total=None)
    mid_in = (5 * 5 + 55 * 3 + 550 * 2) / 10
    assert u.mean_input == pytest.approx(mid_in + 0.5 * 0.05, rel=1e-12)


def test_histogram_probabilities_normalised_and_validated():
    m = _hist_model()
    assert abs(sum(m.input_probs) - 1) < 1e-12
    with pytest.raises(ValueError, match="input_probs must have len\\(input_edges\\) - 1 = 3 entries, got 2"):
        EmpiricalLengths.from_histograms([0, 1, 2, 3], [1, 1], [1, 2], [1])
    with pytest.raises(ValueError, match="output_edges must be finite, >= 0 and strictly increasing"):
        EmpiricalLengths.from_histograms([0, 1], [1], [3, 2], [1])
    with pytest.raises(ValueError, match="either histograms .* or pairs"):
        EmpiricalLengths()


def test_pairs_sampled_jointly_and_exact_mean():
    ins, outs = [10, 1000, 500, 7], [1500, 20, 2000, 9]
    m = EmpiricalLengths.from_pairs(ins, outs)
    i, o = m.sample(10_000, 0)
    clipped = {(10, 1500), (1000, 20), (500, 1548), (7, 9)}  # 500+2000 > 2048 -> output clipped
    assert set(zip(i.tolist(), o.tolist())) == clipped
    assert m.mean_input == pytest.approx(np.mean([10, 1000, 500, 7]))
    assert m.mean_output == pytest.approx(np.mean([1500, 20, 1548, 9]))
    with pytest.raises(ValueError, match="pair_inputs\\[1\\] must be an integer >= 1, got 0"):
        EmpiricalLengths.from_pairs([3, 0], [1, 1])
    with pytest.raises(ValueError, match="equal length"):
        EmpiricalLengths.from_pairs([3, 4], [1])


def test_pairs_scaled_to():
    rng = np.random.default_rng(0)
    m = EmpiricalLengths.from_pairs(rng.integers(4, 800, 5000), rng.integers(4, 900, 5000))
    s = m.scaled_to(150.0, 120.0)
    assert s.mean_input == pytest.approx(150.0, rel=2e-3)
    assert s.mean_output == pytest.approx(120.0, rel=2e-3)


def test_scaled_to_exact_and_errors():
    m = _hist_model()
    s = m.scaled_to(200.0, 300.0)
    assert s.mean_input == pytest.approx(200.0, rel=1e-9)
    assert s.mean_output == pytest.approx(300.0, rel=1e-9)
    only_in = m.scaled_to(mean_input=150.0)
    assert only_in.output_scale == m.output_scale and only_in.mean_input == pytest.approx(150.0, rel=1e-9)
    with pytest.raises(ValueError, match="mean_input must be strictly between 1 and 1024"):
        m.scaled_to(2000.0, None)
    with pytest.raises(ValueError, match="mean_output must be > 0"):
        m.scaled_to(None, -5)


# --------------------------------------------------------------------------- ShareGPT profile


def test_sharegpt_bundled_profile():
    m = sharegpt_lengths()
    assert len(m.input_probs) == 30 and len(m.output_probs) == 30
    assert (m.min_len, m.max_input, m.max_total) == (4, 1024, 2048)
    # recomputed bin means are above the logged Llama-2 means (250.9 / 231.5), see data README
    assert 255 < m.mean_input < 270 and 240 < m.mean_output < 260


def test_sharegpt_rescaled_means_within_half_percent():
    m = sharegpt_lengths(223.0, 196.3)
    assert m.mean_input == pytest.approx(223.0, rel=1e-9)
    assert m.mean_output == pytest.approx(196.3, rel=1e-9)
    i, o = m.sample(2_000_000, 7)
    assert abs(i.mean() / 223.0 - 1) < 0.005
    assert abs(o.mean() / 196.3 - 1) < 0.005
    assert i.min() >= 4 and o.min() >= 4 and i.max() <= 1024 and (i + o).max() <= 2048


def test_sharegpt_profile_matches_fit_from_csv():
    csv = shared_data() / "workload" / "sharegpt_length_hist_llama2_approx.csv"
    if not csv.is_file():
        pytest.skip(f"{csv} not found")
    fitted = fit_sharegpt_histogram(csv)
    bundled = sharegpt_lengths()
    for k in ("input_edges", "output_edges", "input_probs", "output_probs"):
        assert np.allclose(getattr(fitted, k), getattr(bundled, k), rtol=1e-12)


def test_fit_sharegpt_histogram_errors(tmp_path):
    p = tmp_path / "h.csv"
    p.write_text("histogram,bin,bin_lo_tokens,bin_hi_tokens\nprompt_lengths,0,1,2\n")
    with pytest.raises(ValueError, match="h.csv: missing column"):
        fit_sharegpt_histogram(p)
    p.write_text("histogram,bin,bin_lo_tokens,bin_hi_tokens,count_approx\n"
                 "prompt_lengths,0,1,2,5\nprompt_lengths,1,2,3,x\noutput_lengths,0,1,2,3\n")
    with pytest.raises(ValueError, match="h.csv row 2, column 'count_approx': not a number"):
        fit_sharegpt_histogram(p)


# --------------------------------------------------------------------------- dict / JSON


@pytest.mark.parametrize(
    "model",
    [
        FixedLengths(10, 20),
        ClippedNormalLengths(223, 200, 196, 190, min_len=2, max_input=None, max_total=4096),
        EmpiricalLengths.from_pairs([1, 2, 3], [4, 5, 6], name="tiny"),
        sharegpt_lengths(223.0, 196.3),
    ],
)
def test_dict_and_json_round_trip(model, tmp_path):
    d = model.to_dict()
    json.dumps(d)
    json.dumps(model.describe())
    back = length_model_from_dict(json.loads(json.dumps(d)))
    assert back == model
    assert back.mean_input == model.mean_input and back.mean_output == model.mean_output
    path = tmp_path / "m.json"
    model.save(path)
    assert load_length_model(path) == model
    assert np.array_equal(back.sample(100, 5)[1], model.sample(100, 5)[1])


def test_sharegpt_kind_in_dict():
    m = length_model_from_dict({"kind": "sharegpt", "mean_input": 223.0, "mean_output": 196.3})
    assert m.mean_input == pytest.approx(223.0)


def test_from_dict_errors(tmp_path):
    with pytest.raises(ValueError, match="unknown kind 'weird'"):
        length_model_from_dict({"kind": "weird"})
    with pytest.raises(ValueError, match="missing field 'kind'"):
        length_model_from_dict({"input_len": 3})
    with pytest.raises(ValueError, match="'clipped_normal': missing field\\(s\\) \\['sigma_output'\\]"):
        length_model_from_dict({"kind": "clipped_normal", "mu_input": 1, "sigma_input": 1, "mu_output": 1})
    with pytest.raises(ValueError, match="'fixed': unknown field\\(s\\) \\['inputlen'\\]"):
        length_model_from_dict({"kind": "fixed", "inputlen": 3, "input_len": 3, "output_len": 3})
    with pytest.raises(ValueError, match="'empirical': missing field"):
        length_model_from_dict({"kind": "empirical", "input_edges": [0, 1]})
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="bad.json: invalid JSON"):
        load_length_model(bad)


def test_rng_argument():
    m = sharegpt_lengths()
    a = m.sample(1000, 42)
    b = m.sample(1000, np.random.default_rng(42))
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    assert not np.array_equal(a[0], m.sample(1000, 43)[0])
    for model in (m, ClippedNormalLengths(100, 50, 80, 40), EmpiricalLengths.from_pairs([1, 2, 3], [4, 5, 6])):
        short, long = model.sample(10, 3), model.sample(1000, 3)  # prefix-stable draws
        assert np.array_equal(short[0], long[0][:10]) and np.array_equal(short[1], long[1][:10])
    with pytest.raises(ValueError, match="rng must be"):
        m.sample(10, "x")
    with pytest.raises(ValueError, match="n must be >= 0"):
        m.sample(-1, 0)
    assert len(m.sample(0, 0)[0]) == 0


# --------------------------------------------------------------------------- copula correlation


def test_copula_keeps_marginals_and_exact_means():
    from dataclasses import replace
    base = sharegpt_lengths(223.0, 196.3, correlation=0.0)
    corr = sharegpt_lengths(223.0, 196.3, correlation=-0.4)
    assert corr.correlation == -0.4 and base.correlation == 0.0
    assert corr.mean_input == pytest.approx(223.0, abs=1e-6)
    assert corr.mean_output == pytest.approx(196.3, abs=1e-6)
    i, o = corr.sample(400_000, 5)
    i0, o0 = base.sample(400_000, 5)
    assert np.corrcoef(i, o)[0, 1] < -0.15 < np.corrcoef(i0, o0)[0, 1] + 0.15
    assert i.mean() == pytest.approx(223.0, rel=0.01) and o.mean() == pytest.approx(196.3, rel=0.01)
    # the input marginal does not depend on the correlation (same uniforms, same bins)
    np.testing.assert_array_equal(np.sort(i), np.sort(i0))
    with pytest.raises(ValueError, match="correlation"):
        replace(base, correlation=1.0)


def test_copula_cells_have_the_marginals():
    from twin.lengths import _copula_cells
    rng = np.random.default_rng(0)
    pi, po = rng.random(12), rng.random(9)
    pi, po = pi / pi.sum(), po / po.sum()
    P = _copula_cells(pi, po, 0.6)
    np.testing.assert_allclose(P.sum(axis=1), pi, atol=1e-12)
    np.testing.assert_allclose(P.sum(axis=0), po, atol=1e-12)
    np.testing.assert_allclose(_copula_cells(pi, po, 1e-12), np.outer(pi, po), atol=1e-9)
