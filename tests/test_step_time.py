import numpy as np
import pytest

from twin.profile import load_profile
from twin.step_time import (FEATURE_NAMES, N_STEP_COEF, StepTimeModel, describe_step_model,
                            step_time_ms, step_time_ms_py)

RNG = np.random.default_rng(0)


def _coef():
    return load_profile("llama-3.1-8b-instruct").step_coef_array()


def _rand_args(n):
    s = RNG.integers(0, 1200, n)
    p = RNG.integers(0, 2048, n)
    k = RNG.integers(0, 200, n)
    a = RNG.choice([0, 8, 16, 64, 128, 300, 448], n)
    r = RNG.choice([8, 16, 32], n)
    kk = np.minimum(k, np.maximum(a, 0))
    return np.c_[s, p, s, s * RNG.integers(0, 800, n), kk, a, r,
                 RNG.integers(0, 30000, n), kk + RNG.integers(0, 200, n)].astype(float)


def test_numba_equals_python():
    c = _coef()
    assert c.shape == (N_STEP_COEF,)
    for row in _rand_args(300):
        a = step_time_ms(c, *[int(v) for v in row])
        b = step_time_ms_py(c, *[int(v) for v in row])
        assert a == pytest.approx(b, rel=1e-12)


@pytest.mark.parametrize("j", range(9))
def test_monotone_each_argument(j):
    c = _coef()
    for row in _rand_args(200):
        lo = step_time_ms_py(c, *row)
        up = row.copy()
        up[j] += [1, 16, 1, 500, 1, 8, 8, 1000, 3][j]
        assert step_time_ms_py(c, *up) >= lo - 1e-12


def test_lora_disabled_ignores_lora_args():
    c = _coef()
    a = step_time_ms_py(c, 100, 0, 100, 5000, 0, 0, 0, 0, 0)
    b = step_time_ms_py(c, 100, 0, 100, 5000, 50, 0, 32, 9999, 80)
    assert a == b


def test_estimator_recovers_coefficients():
    true = np.array([10.0, 0.02, 0.004, 0.08, 5.0, 0.02, 0.1, 0.2, 0.5, 0.01, 0.0, 0.01, 128.0])
    X = _rand_args(800)
    y = np.array([step_time_ms_py(true, *r) for r in X])
    m = StepTimeModel(seq_knee=128.0).fit(X, y)
    assert np.allclose(m.coef_, true, rtol=1e-6, atol=1e-9)
    assert np.allclose(m.predict(X), y, rtol=1e-9)
    assert set(m.get_params()) >= {"rank_scale", "relative", "fit_terms"}


def test_describe():
    txt = describe_step_model(_coef())
    assert "c12" in txt and "max_loras" in txt
    assert len(FEATURE_NAMES) == 9


def test_sanity_targets_llama():
    """Profiling-data anchors (decode_baseline, lora_decode_overhead) within 10-20 %."""
    from twin.calibrate import lora_tiles
    c = _coef()

    def t(S, K, A, R):
        return step_time_ms_py(c, S, 0, S, S * 55, K, A, R, 0, float(lora_tiles(K, S, 0)))
    assert t(50, 0, 0, 0) == pytest.approx(13.4, rel=0.1)
    assert t(760, 0, 0, 0) == pytest.approx(40, rel=0.2)
    assert t(200, 1, 300, 8) == pytest.approx(36, rel=0.1)
    assert t(200, 105, 300, 8) == pytest.approx(70, rel=0.1)


def test_step_time_monotone_in_server_rank():
    """At a fixed batch, a larger server max_lora_rank never makes a LoRA step faster, and with
    the shipped (fitted) rank term it makes it strictly slower."""
    c = _coef()
    assert c[10] > 0
    for row in _rand_args(200):
        if row[5] == 0:
            continue
        t = [step_time_ms_py(c, *np.r_[row[:6], r, row[7:]]) for r in (8, 16, 32)]
        assert t[0] < t[1] < t[2]
        assert step_time_ms(c, *[int(v) for v in np.r_[row[:6], 32, row[7:]]]) == \
            pytest.approx(t[2], rel=1e-12)


def test_rank8_step_ignores_rank_scale():
    """m = 1 exactly at max_rank 8: rank-8 servers step exactly as before the rank term."""
    c = _coef()
    c0 = c.copy()
    c0[10] = 0.0
    for row in _rand_args(100):
        r8 = np.r_[row[:6], 8, row[7:]]
        assert step_time_ms_py(c, *r8) == step_time_ms_py(c0, *r8)
