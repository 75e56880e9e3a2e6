import copy
import json

import numpy as np
import pytest

from twin.profile import GpuProfile, ProfileError, available_profiles, load_profile
from twin.step_time import N_STEP_COEF


def _base() -> dict:
    coef = [10.0, 0.02, 0.0, 0.08, 5.0, 0.02, 0.1, 0.2, 0.5, 0.01, 0.0, 0.01, 256.0]
    assert len(coef) == N_STEP_COEF
    return {
        "schema_version": 1, "name": "x", "gpu": "H100-64GB", "model": "m", "block_size": 16,
        "max_num_batched_tokens": 2048, "max_num_seqs": 2048, "max_model_len": 1000,
        "kv_capacity": {"8,8": 5000, "16,8": 4000, "64,8": 3000, "8,16": 4500},
        "supported_ranks": [8, 16, 32], "step_coef": coef,
        "load_ms": {"8,8": 6.0, "8,16": 7.0, "16,16": 6.5, "32,32": 6.3},
        "backbone_kv_tokens": 6000, "fit_report": {}, "source": {},
    }


def test_roundtrip(tmp_path):
    p = GpuProfile.from_dict(_base())
    f = tmp_path / "p.json"
    p.to_json(f)
    q = GpuProfile.from_json(f)
    assert q == p
    assert json.loads(f.read_text())["schema_version"] == 1
    assert q.step_coef_array().dtype == np.float64 and q.step_coef_array().shape == (N_STEP_COEF,)


def test_kv_tokens_rules():
    p = GpuProfile.from_dict(_base())
    assert p.kv_tokens(0, 8) == 6000           # LoRA disabled -> backbone
    assert p.kv_tokens(8, 8) == 5000
    assert p.kv_tokens(12, 8) == 4000          # between grid points -> next larger (smaller kv)
    assert p.kv_tokens(32, 8) == 3000
    assert p.kv_tokens(65, 8) is None          # beyond measured grid -> memory error
    assert p.kv_tokens(8, 32) is None          # rank never starts
    assert p.kv_tokens(16, 16) is None


def test_load_time_nearest():
    p = GpuProfile.from_dict(_base())
    assert p.load_time_ms(8, 16) == 7.0
    assert p.load_time_ms(16, 32) in (6.5, 6.3)  # nearest measured
    assert p.load_time_ms(8, 32) == 7.0          # same adapter rank, nearest slot rank
    with pytest.raises(ValueError):
        p.load_time_ms(4, 8)
    with pytest.raises(ValueError):
        p.load_time_ms(32, 16)


@pytest.mark.parametrize("mutate,field", [
    (lambda d: d["kv_capacity"].__setitem__("64,16", -5), "kv_capacity[64,16]"),
    (lambda d: d.pop("gpu"), "gpu"),
    (lambda d: d.__setitem__("block_size", "16"), "block_size"),
    (lambda d: d.__setitem__("step_coef", [1.0, 2.0]), "step_coef"),
    (lambda d: d["step_coef"].__setitem__(3, -1.0), "step_coef[3]"),
    (lambda d: d["load_ms"].__setitem__("8,8", -1.0), "load_ms[8,8]"),
    (lambda d: d["kv_capacity"].__setitem__("32,8", 4500), "kv_capacity[32,8]"),
    (lambda d: d.__setitem__("bogus", 1), "bogus"),
    (lambda d: d["kv_capacity"].__setitem__("8,8", 10), "kv_capacity[8,8]"),
])
def test_validation_names_field(mutate, field):
    d = copy.deepcopy(_base())
    mutate(d)
    with pytest.raises(ProfileError) as e:
        GpuProfile.from_dict(d)
    assert f"field '{field}'" in str(e.value)
    assert "profile 'x'" in str(e.value)


def test_negative_kv_message():
    d = _base()
    d["kv_capacity"]["64,16"] = -5
    with pytest.raises(ProfileError, match=r"must be a positive integer, got -5"):
        GpuProfile.from_dict(d)


def test_shipped_profiles_load():
    names = available_profiles()
    assert "llama-3.1-8b-instruct" in names and "qwen-2.5-7b-instruct" in names
    for n in ("llama-3.1-8b-instruct", "qwen-2.5-7b-instruct"):
        p = load_profile(n)
        assert p.kv_tokens(0, 8) >= p.max_model_len
    with pytest.raises(FileNotFoundError, match="available"):
        load_profile("no-such-profile")
