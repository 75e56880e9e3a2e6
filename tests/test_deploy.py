"""Deployment files (optim.deploy, ``python -m optim deploy``) and the profiles' ``serving``
mapping."""

from __future__ import annotations

import json

import pytest

from surrogates.dataset import profile_hash
from twin.profile import GpuProfile, ProfileError, load_profile


# ----------------------------------------------------------------------------- profiles
def test_serving_field_leaves_the_profile_hash_unchanged():
    # the hashes trained surrogates record, before the ``serving`` mapping was added
    assert profile_hash("llama-3.1-8b-instruct") == "eb6733f0896516e9"
    assert profile_hash("qwen-2.5-7b-instruct") == "10df05542686302b"


def test_shipped_profiles_name_their_served_model_and_calibration_settings():
    llama, qwen = load_profile("llama-3.1-8b-instruct"), load_profile("qwen-2.5-7b-instruct")
    assert llama.serving["model_id"] == "meta-llama/Llama-3.1-8B-Instruct"
    assert qwen.serving["model_id"] == "Qwen/Qwen2.5-7B-Instruct"
    for p in (llama, qwen):
        s = p.serving
        assert (s["gpu_memory_utilization"], s["enable_chunked_prefill"],
                s["enable_prefix_caching"], s["dtype"], s["engine"]) == (0.9, True, False,
                                                                          "auto", "v1")
        assert p.max_num_batched_tokens == 2048
    assert (llama.max_model_len, qwen.max_model_len) == (131072, 32768)


@pytest.mark.parametrize("serving, field", [
    ({"gpu_memory_utilization": 0.9}, "serving.model_id"),
    ({"model_id": ""}, "serving.model_id"),
    ({"model_id": "m", "gpu_memory_utilization": 1.5}, "serving.gpu_memory_utilization"),
    ({"model_id": "m", "enable_prefix_caching": "no"}, "serving.enable_prefix_caching"),
    ({"model_id": "m", "tensor_parallel": 2}, "serving.tensor_parallel"),
])
def test_bad_serving_mapping_names_the_field(serving, field):
    d = load_profile("llama-3.1-8b-instruct").to_dict()
    d["serving"] = serving
    with pytest.raises(ProfileError, match=field.replace(".", r"\.")):
        GpuProfile.from_dict(d)


def test_profile_without_serving_round_trips_without_the_key():
    d = load_profile("llama-3.1-8b-instruct").to_dict()
    del d["serving"]
    assert "serving" not in GpuProfile.from_dict(d).to_dict()
    assert json.loads(json.dumps(GpuProfile.from_dict(d).to_dict())) == d
