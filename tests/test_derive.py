"""Derived profiles (twin.derive), the GPU catalog and the model configs."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import pytest

from twin.derive import DeriveError, derive_profile, measured_profile, profile_for
from twin.gpu_catalog import CatalogError, gpu_ids, gpu_spec, load_catalog
from twin.model_configs import ModelConfigError, model_config, model_ids
from twin.profile import GpuProfile, load_profile

MEASURED = ("llama-3.1-8b-instruct", "qwen-2.5-7b-instruct")


@pytest.mark.parametrize("name", MEASURED)
def test_deriving_the_source_gpu_and_model_reproduces_the_source(name):
    src = load_profile(name)
    same = derive_profile(src, gpu_spec(src.gpu), model_config(src.model))
    assert same.kv_capacity == src.kv_capacity
    assert same.backbone_kv_tokens == src.backbone_kv_tokens
    assert same.step_coef == src.step_coef
    assert same.load_ms == src.load_ms
    assert same.max_model_len == src.max_model_len
    assert same.supported_ranks == src.supported_ranks
    assert same.derived_from["identity"] is True
    assert same.is_derived and not src.is_derived


@pytest.mark.parametrize("gpu", ["H100-64GB", "H100-80GB", "A100-80GB", "H200", "L40S"])
@pytest.mark.parametrize("model", MEASURED)
def test_derived_kv_table_is_monotone_in_slots_and_rank(gpu, model):
    p = derive_profile(load_profile("llama-3.1-8b-instruct"), gpu_spec(gpu), model_config(model))
    assert p.kv_capacity, "no configuration starts"
    for (a, r), v in p.kv_capacity.items():
        assert v <= p.backbone_kv_tokens
        assert v >= p.max_model_len
        assert v % p.block_size == 0
        for (a2, r2), v2 in p.kv_capacity.items():
            if a2 >= a and r2 >= r:
                assert v2 <= v, ((a, r, v), (a2, r2, v2))
    # round trip through JSON keeps the derivation record
    again = GpuProfile.from_dict(json.loads(json.dumps(p.to_dict())))
    assert again == p


def test_bigger_and_faster_gpus_get_more_kv_and_faster_steps():
    src = load_profile("llama-3.1-8b-instruct")
    m = model_config("llama-3.1-8b-instruct")
    p = {g: derive_profile(src, gpu_spec(g), m) for g in ("H100-80GB", "H200", "A100-80GB", "L40S")}
    assert p["H200"].backbone_kv_tokens > p["H100-80GB"].backbone_kv_tokens \
        > p["L40S"].backbone_kv_tokens
    assert p["H100-80GB"].backbone_kv_tokens == p["A100-80GB"].backbone_kv_tokens  # same memory
    # per-token compute follows dense BF16 FLOPs, KV reads and per-step weights follow bandwidth
    assert p["H200"].step_coef[1] == pytest.approx(p["H100-80GB"].step_coef[1])
    assert p["A100-80GB"].step_coef[1] > 3 * p["H100-80GB"].step_coef[1]
    assert p["H200"].step_coef[3] < p["H100-80GB"].step_coef[3] < p["L40S"].step_coef[3]
    assert p["H200"].step_coef[0] < p["H100-80GB"].step_coef[0] < p["L40S"].step_coef[0]
    # adapter loads follow the host link: PCIe Gen4 parts take twice as long as Gen5 ones
    key = (8, 8)
    assert p["A100-80GB"].load_ms[key] == pytest.approx(2 * p["H100-80GB"].load_ms[key])


def test_derived_profile_says_so_and_cannot_be_derived_again():
    src = load_profile("llama-3.1-8b-instruct")
    d = derive_profile(src, gpu_spec("H200"), model_config("qwen-2.5-7b-instruct"))
    assert "derived profile (from llama-3.1-8b-instruct)" in d.label()
    assert d.derived_from["gpu"]["id"] == "H200"
    assert d.derived_from["model"]["id"] == "qwen-2.5-7b-instruct"
    assert d.power["max_w"] == gpu_spec("H200").tdp_w
    assert src.label() == src.name
    with pytest.raises(DeriveError, match="derived profile"):
        derive_profile(d, gpu_spec("L40S"), model_config("qwen-2.5-7b-instruct"))


def test_measured_profile_always_wins():
    q = profile_for("H100-64GB", "qwen-2.5-7b-instruct")
    assert not q.is_derived and q == load_profile("qwen-2.5-7b-instruct")
    assert measured_profile("H200", "qwen-2.5-7b-instruct") is None
    h = profile_for("H200", "qwen-2.5-7b-instruct")
    assert h.is_derived and h.gpu == "H200"
    capped = profile_for("H200", "qwen-2.5-7b-instruct", power_cap_w=350.0)
    assert capped.power["cap_w"] == 350.0
    assert capped.step_coef[1] > h.step_coef[1]


def test_shipped_profiles_serialise_without_the_new_fields():
    """Old profile files load and their JSON (hashed by surrogates and caches) is unchanged."""
    for name in MEASURED:
        d = load_profile(name).to_dict()
        assert "derived_from" not in d and "power" not in d


def test_a_model_that_does_not_fit_is_refused():
    tiny = replace(gpu_spec("L40S"), id="tiny", memory_gib=16.0, usable_memory_gib=None)
    with pytest.raises(DeriveError, match="would not start"):
        derive_profile(load_profile("llama-3.1-8b-instruct"), tiny,
                       model_config("llama-3.1-8b-instruct"))


def test_catalog_and_configs_cite_a_source_for_every_number():
    for g in load_catalog().values():
        for k in ("memory_gib", "hbm_bandwidth_gbs", "bf16_dense_tflops", "host_link_gbs",
                  "tdp_w", "idle_w"):
            assert g.sources.get(k), (g.id, k)
    assert {"H100-64GB", "H100-80GB", "A100-80GB", "H200", "L40S"} <= set(gpu_ids())
    for mid in model_ids():
        m = model_config(mid)
        assert m.sources.get("config") and m.sources.get("parameters")
        # the stated parameter count agrees with the config dims within 0.1 %
        h, i, L = m.hidden_size, m.intermediate_size, m.num_hidden_layers
        q, kv = m.num_attention_heads * m.head_dim, m.num_key_value_heads * m.head_dim
        n = L * (2 * h * q + 2 * h * kv + 3 * h * i) + 2 * m.vocab_size * h
        assert abs(n / m.parameters - 1) < 1e-3


GOOD_GPU = {"memory_gib": 80, "hbm_bandwidth_gbs": 2000, "bf16_dense_tflops": 300,
            "host_link_gbs": 32, "tdp_w": 400, "idle_w": 60}


@pytest.mark.parametrize("patch, field", [
    ({"hbm_bandwidth_gbs": -1}, "hbm_bandwidth_gbs"),
    ({"tdp_w": "400"}, "tdp_w"),
    ({"idle_w": 500}, "idle_w"),
    ({"memory_gib": None}, "memory_gib"),
    ({"usable_memory_gib": 90}, "usable_memory_gib"),
    ({"bogus": 1}, "bogus"),
])
def test_bad_gpu_json_names_the_field(tmp_path, patch, field):
    d = {**GOOD_GPU, **patch}
    f = tmp_path / "mygpu.json"
    f.write_text(json.dumps(d))
    with pytest.raises(CatalogError, match=f"field '{field}'"):
        gpu_spec(str(f))


def test_missing_gpu_field_and_bad_files(tmp_path):
    d = dict(GOOD_GPU)
    del d["host_link_gbs"]
    f = tmp_path / "g.json"
    f.write_text(json.dumps(d))
    with pytest.raises(CatalogError, match="field 'host_link_gbs': missing"):
        gpu_spec(str(f))
    f.write_text("{not json")
    with pytest.raises(CatalogError, match="invalid JSON"):
        gpu_spec(str(f))
    with pytest.raises(CatalogError, match="unknown GPU 'B300'"):
        gpu_spec("B300")


@pytest.mark.parametrize("patch, field", [
    ({"num_key_value_heads": 0}, "num_key_value_heads"),
    ({"num_key_value_heads": 5}, "num_key_value_heads"),
    ({"hidden_size": 4096.5}, "hidden_size"),
    ({"parameters": 1000}, "parameters"),
    ({"lora_embedding_modules": "yes"}, "lora_embedding_modules"),
    ({"rope_theta": 1e6}, "rope_theta"),
])
def test_bad_model_json_names_the_field(tmp_path, patch, field):
    base = model_config("qwen-2.5-7b-instruct").facts()
    base.pop("id")
    f = tmp_path / "m.json"
    f.write_text(json.dumps({**base, **patch}))
    with pytest.raises(ModelConfigError, match=f"field '{field}'"):
        model_config(str(f))


def test_cli_derive_writes_a_profile_that_twin_run_labels_as_derived(tmp_path):
    out = tmp_path / "q_h200.json"
    r = subprocess.run([sys.executable, "-m", "twin", "derive", "--gpu", "H200", "--model",
                        "qwen-2.5-7b-instruct", "--out", str(out)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert load_profile(str(out)).is_derived
    r = subprocess.run([sys.executable, "-m", "twin", "derive", "--gpu", "H200", "--model",
                        "qwen-2.5-7b-instruct", "--out", str(out)], capture_output=True, text=True)
    assert r.returncode == 2 and "--force" in r.stderr          # never overwrite silently
    r = subprocess.run([sys.executable, "-m", "twin", "run", "--profile", str(out), "--adapters",
                        "8", "--duration", "60"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "derived profile (from llama-3.1-8b-instruct)" in r.stdout
    assert "avg_power_w" in r.stdout and "joules_per_token" in r.stdout


def test_cli_derive_bad_gpu_json_is_one_line(tmp_path):
    f = tmp_path / "g.json"
    f.write_text(json.dumps({**GOOD_GPU, "bf16_dense_tflops": 0}))
    r = subprocess.run([sys.executable, "-m", "twin", "derive", "--gpu", str(f), "--model",
                        "qwen-2.5-7b-instruct", "--out", str(tmp_path / "o.json")],
                       capture_output=True, text=True)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    assert "--gpu:" in r.stderr and "field 'bf16_dense_tflops'" in r.stderr


def test_a_source_on_a_gpu_outside_the_catalog_needs_its_spec(tmp_path):
    src = replace(load_profile("llama-3.1-8b-instruct"), gpu="my-h100", name="mine")
    with pytest.raises(DeriveError, match="--from-gpu"):
        derive_profile(src, gpu_spec("L40S"), model_config("qwen-2.5-7b-instruct"))
    f = tmp_path / "mine.json"
    src.to_json(f)
    out = tmp_path / "o.json"
    r = subprocess.run([sys.executable, "-m", "twin", "derive", "--from", str(f), "--from-gpu",
                        "H100-64GB", "--gpu", "L40S", "--model", "qwen-2.5-7b-instruct",
                        "--out", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert load_profile(str(out)).derived_from["source_gpu"]["id"] == "H100-64GB"
