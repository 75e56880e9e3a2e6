"""Deployment files (optim.deploy, ``python -m optim deploy``) and the profiles' ``serving``
mapping."""

from __future__ import annotations

import json

import pytest

from surrogates.dataset import profile_hash
from twin.profile import GpuProfile, ProfileError, load_profile


# ----------------------------------------------------------------------------- profiles
def test_serving_field_leaves_the_profile_hash_unchanged(tmp_path):
    """The hash trained surrogates record covers what the twin simulates, not the ``serving``
    mapping (deployment settings) nor where and when the profile was calibrated."""
    for name in ("llama-3.1-8b-instruct", "qwen-2.5-7b-instruct"):
        d = load_profile(name).to_dict(include_serving=True)
        assert d.get("serving")
        bare = tmp_path / f"{name}.json"
        bare.write_text(json.dumps({k: v for k, v in d.items() if k != "serving"}))
        assert profile_hash(str(bare)) == profile_hash(name)
        d["step_coef"] = [c * 1.01 for c in d["step_coef"]]
        moved = tmp_path / f"{name}-moved.json"
        moved.write_text(json.dumps(d))
        assert profile_hash(str(moved)) != profile_hash(name)


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


def test_serving_is_written_to_files_but_not_in_cache_keys(tmp_path):
    prof = load_profile("llama-3.1-8b-instruct")
    # caches of carry limits, capacity tables and surrogates key on to_dict(): unchanged
    assert "serving" not in prof.to_dict()
    assert prof.to_dict(include_serving=True)["serving"] == prof.serving
    prof.to_json(tmp_path / "p.json")
    again = GpuProfile.from_json(tmp_path / "p.json")
    assert again.serving == prof.serving and again.to_dict() == prof.to_dict()
    bare = GpuProfile.from_dict(prof.to_dict())
    assert bare.serving == {} and "serving" not in bare.to_dict(include_serving=True)


# ----------------------------------------------------------------------------- deployment files
from optim.cli import main  # noqa: E402
from optim.deploy import (DeployError, DeployOptions, deployment_files, k8s_name,  # noqa: E402
                          label_value, routing_table, served_model, write_deployment)
from optim.instance import instance_from_dict  # noqa: E402
from optim.methods import solve  # noqa: E402
from optim.placement import Placement, plan_gpu  # noqa: E402
from optim.verify import verify  # noqa: E402

LLAMA = "llama-3.1-8b-instruct"

# Flag names of `vllm serve` (vllm/engine/arg_utils.py, vllm/entrypoints/openai/cli_args.py) that
# the generated commands use, as read in a stored arg_utils.py from before 0.8 (commit 001999d:
# --enable-prefix-caching is an argparse.BooleanOptionalAction, hence --no-enable-prefix-caching;
# vLLM's own V1 test turns prefix caching off with that flag). --no-enable-chunked-prefill is only
# written for a profile whose serving turns chunked prefill off (none shipped).
VLLM_085_FLAGS = {"--port", "--gpu-memory-utilization", "--max-num-batched-tokens",
                  "--max-num-seqs", "--max-model-len", "--dtype", "--enable-chunked-prefill",
                  "--no-enable-chunked-prefill", "--enable-prefix-caching",
                  "--no-enable-prefix-caching", "--enable-lora", "--max-loras", "--max-cpu-loras",
                  "--max-lora-rank", "--lora-modules"}

# Facts of the published CRD OpenAPI schemas (spec part), written as JSON Schema:
# AIBrix config/crd/model/model.aibrix.ai_modeladapters.yaml (v1alpha1) and Gateway API Inference
# Extension v0.5.1 config/crd/bases/inference.networking.x-k8s.io_{inferencepools,
# inferencemodels}.yaml (v1alpha2).
_NAME = {"type": "string", "minLength": 1, "maxLength": 253}
_LABEL_VALUE = {"type": "string", "maxLength": 63,
                "pattern": r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"}
_SELECTOR = {"type": "object", "properties": {
    "matchLabels": {"type": "object", "additionalProperties": {"type": "string"}},
    "matchExpressions": {"type": "array", "items": {
        "type": "object", "required": ["key", "operator"],
        "properties": {"key": {"type": "string"}, "operator": {"type": "string"},
                       "values": {"type": "array", "items": {"type": "string"}}}}}}}
AIBRIX_SPEC = {"type": "object", "required": ["artifactURL", "podSelector"],
               "additionalProperties": False, "properties": {
                   "additionalConfig": {"type": "object",
                                        "additionalProperties": {"type": "string"}},
                   "artifactURL": {"type": "string"}, "baseModel": {"type": "string"},
                   "credentialsSecretRef": {"type": "object",
                                            "properties": {"name": {"type": "string"}}},
                   "podSelector": _SELECTOR,
                   "replicas": {"type": "integer", "enum": [1]},
                   "schedulerName": {"type": "string"}}}
GIE_POOL_SPEC = {"type": "object", "required": ["extensionRef", "selector", "targetPortNumber"],
                 "additionalProperties": False, "properties": {
                     "extensionRef": {"type": "object", "required": ["name"], "properties": {
                         "failureMode": {"type": "string", "enum": ["FailOpen", "FailClose"]},
                         "group": {"type": "string", "maxLength": 253},
                         "kind": {"type": "string", "minLength": 1, "maxLength": 63},
                         "name": _NAME,
                         "portNumber": {"type": "integer", "minimum": 1, "maximum": 65535}}},
                     "selector": {"type": "object", "additionalProperties": _LABEL_VALUE},
                     "targetPortNumber": {"type": "integer", "minimum": 1, "maximum": 65535}}}
GIE_MODEL_SPEC = {"type": "object", "required": ["modelName", "poolRef"],
                  "additionalProperties": False, "properties": {
                      "criticality": {"type": "string",
                                      "enum": ["Critical", "Standard", "Sheddable"]},
                      "modelName": {"type": "string", "maxLength": 256},
                      "poolRef": {"type": "object", "required": ["name"], "properties": {
                          "group": {"type": "string", "maxLength": 253},
                          "kind": {"type": "string", "minLength": 1, "maxLength": 63},
                          "name": _NAME}},
                      "targetModels": {"type": "array", "maxItems": 10, "items": {
                          "type": "object", "required": ["name"], "properties": {
                              "name": {"type": "string", "maxLength": 253},
                              "weight": {"type": "integer", "minimum": 1,
                                         "maximum": 1000000}}}}}}
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"


def _object_schema(api: str, kind: str, spec: dict) -> dict:
    return {"type": "object", "required": ["apiVersion", "kind", "metadata", "spec"],
            "properties": {"apiVersion": {"const": api}, "kind": {"const": kind},
                           "metadata": {"type": "object", "required": ["name", "namespace"],
                                        "properties": {"name": {"type": "string",
                                                                "maxLength": 253,
                                                                "pattern": DNS_SUBDOMAIN}}},
                           "spec": spec}}


def _inst(rates=(2.0, 1.0, 0.5, 0.25), duration=120.0):
    return instance_from_dict({
        "name": "dep", "adapters": [{"id": f"a{i}", "rank": 8 if i % 2 else 16, "rate": r}
                                    for i, r in enumerate(rates)],
        "gpus": [{"name": "h100", "profile": LLAMA, "count": 4}], "duration_s": duration,
        "seed": 3})


@pytest.fixture(scope="module")
def split_plan():
    """Two GPUs, adapter a0 split 0.6 / 0.4 over both, verified by the twin."""
    inst = _inst()
    a = inst.adapters
    g0 = plan_gpu("h100", LLAMA, 3, [(a[0], 0.6), (a[1], 1.0)], inst.mean_tokens)
    g1 = plan_gpu("h100", LLAMA, 4, [(a[0], 0.4), (a[2], 1.0), (a[3], 1.0)], inst.mean_tokens)
    p = verify(Placement(inst.name, "manual", "solved", (g0, g1)), inst, workers=1)
    assert p.verdict == "accepted"
    return p


def _flag(argv, name):
    return argv[argv.index(name) + 1]


def test_commands_serve_the_model_id_with_the_calibrated_settings(split_plan):
    files = deployment_files(split_plan, DeployOptions(adapter_dir="/loras"))
    prof = load_profile(LLAMA)
    for i, g in enumerate(split_plan.gpus):
        rec = json.loads(files[f"servers/gpu-{i}.json"])
        argv = rec["argv"]
        assert argv[:3] == ["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct"]
        assert rec["model_id_source"] == "profile" and rec["settings_source"] == "profile"
        assert _flag(argv, "--gpu-memory-utilization") == "0.9"
        assert _flag(argv, "--max-num-batched-tokens") == "2048"
        assert _flag(argv, "--max-num-seqs") == str(prof.max_num_seqs)
        assert _flag(argv, "--max-model-len") == "131072"
        assert _flag(argv, "--dtype") == "auto"
        assert "--enable-chunked-prefill" in argv and "--no-enable-prefix-caching" in argv
        assert _flag(argv, "--max-loras") == str(g.max_loras)
        assert _flag(argv, "--max-lora-rank") == str(g.max_lora_rank)
        assert _flag(argv, "--port") == str(8000 + i)
        assert rec["env"] == {"CUDA_VISIBLE_DEVICES": str(i), "VLLM_USE_V1": "1"}
        assert {a for a in argv if a.startswith("--")} <= VLLM_085_FLAGS
        mods = argv[argv.index("--lora-modules") + 1:]
        assert len(mods) == g.n_adapters and all("=/loras/a" in m for m in mods)
        sh = files[f"servers/gpu-{i}.sh"]
        assert sh.startswith("#!/bin/sh") and "twin_verdict=accepted" in sh
        assert "VLLM_USE_V1=1" in sh and f"CUDA_VISIBLE_DEVICES={i}" in sh
    # a split adapter is served under one name per home
    assert "a0--gpu0=/loras/a0" in json.loads(files["servers/gpu-0.json"])["argv"]
    assert "a0--gpu1=/loras/a0" in json.loads(files["servers/gpu-1.json"])["argv"]


def test_routing_weights_sum_to_one_per_adapter(split_plan):
    table = routing_table(split_plan)
    assert [r["adapter"] for r in table] == ["a0", "a1", "a2", "a3"]
    for r in table:
        assert sum(h["share"] for h in r["homes"]) == pytest.approx(1.0, abs=1e-12)
    a0 = table[0]["homes"]
    assert [(h["gpu"], h["served_name"], h["weight"]) for h in a0] == \
        [(0, "a0--gpu0", 600), (1, "a0--gpu1", 400)]
    files = deployment_files(split_plan)
    lines = files["routing.csv"].strip().splitlines()
    assert lines[0].startswith("adapter,rank,rate,gpu,") and len(lines) == 1 + 5
    assert all(line.endswith(",accepted") for line in lines[1:])


def test_manifests_match_the_published_crd_schemas(split_plan):
    import jsonschema
    files = deployment_files(split_plan, DeployOptions(namespace="lora"))
    ma = json.loads(files["aibrix/modeladapters.json"])
    pool = json.loads(files["gateway/inferencepool.json"])
    models = json.loads(files["gateway/inferencemodels.json"])
    assert ma["kind"] == models["kind"] == "List"
    assert len(ma["items"]) == 5                       # one per adapter home
    for obj in ma["items"]:
        jsonschema.validate(obj, _object_schema("model.aibrix.ai/v1alpha1", "ModelAdapter",
                                                AIBRIX_SPEC))
        assert obj["spec"]["baseModel"] == "meta-llama/Llama-3.1-8B-Instruct"
        sel = obj["spec"]["podSelector"]["matchLabels"]
        home = obj["metadata"]["annotations"]["lora-placement/served-name"]
        assert sel["lora-placement/server"] == ("gpu-1" if home.endswith("gpu1") or home in
                                                ("a2", "a3") else "gpu-0")
    jsonschema.validate(pool, _object_schema("inference.networking.x-k8s.io/v1alpha2",
                                             "InferencePool", GIE_POOL_SPEC))
    for obj in models["items"]:
        jsonschema.validate(obj, _object_schema("inference.networking.x-k8s.io/v1alpha2",
                                                "InferenceModel", GIE_MODEL_SPEC))
        tm = obj["spec"]["targetModels"]
        # CRD rule: weights set for all target models or for none
        assert all("weight" in t for t in tm) or not any("weight" in t for t in tm)
        assert obj["spec"]["poolRef"]["name"] == pool["metadata"]["name"]
    a0 = next(o for o in models["items"] if o["spec"]["modelName"] == "a0")
    assert a0["spec"]["targetModels"] == [{"name": "a0--gpu0", "weight": 600},
                                          {"name": "a0--gpu1", "weight": 400}]
    # every pod label the selectors use is listed for the servers
    labels = json.loads(files["servers/gpu-0.json"])["pod_labels"]
    assert pool["spec"]["selector"].items() <= labels.items()
    for obj in [*ma["items"], pool, *models["items"]]:
        assert obj["metadata"]["namespace"] == "lora"
        assert obj["metadata"]["annotations"]["lora-placement/twin-verdict"] == "accepted"


def test_every_file_records_the_twin_verdict(split_plan):
    files = deployment_files(split_plan)
    for rel, text in files.items():
        assert "accepted" in text, rel
    summary = json.loads(files["deployment.json"])
    assert summary["twin_verdict"] == "accepted" and summary["twin_failed_gpus"] == 0
    assert sorted(summary["files"]) == sorted(files)


def test_rejected_plan_is_refused_unless_allowed(tmp_path):
    hot = _inst(rates=(20.0, 20.0, 20.0, 20.0))
    g = plan_gpu("h100", LLAMA, 4, ((a, 1.0) for a in hot.adapters), hot.mean_tokens)
    p = verify(Placement("hot", "manual", "solved", (g,)), hot, workers=1)
    assert p.verdict == "rejected"
    with pytest.raises(DeployError, match="--allow-rejected"):
        write_deployment(p, tmp_path / "d")
    assert not (tmp_path / "d").exists()
    files = deployment_files(p, DeployOptions(allow_rejected=True))
    assert all("rejected" in text for text in files.values())


def test_no_overwrite_without_force_and_force_drops_stale_servers(tmp_path, split_plan):
    out = tmp_path / "d"
    write_deployment(split_plan, out)
    before = (out / "routing.json").read_text()
    with pytest.raises(DeployError, match="--force"):
        write_deployment(split_plan, out)
    assert (out / "routing.json").read_text() == before
    one = split_plan.with_(gpus=split_plan.gpus[1:])       # a smaller plan over the same dir
    one = one.with_(gpus=(plan_gpu("h100", LLAMA, 4, [(a, 1.0) for a, _ in
                                                      split_plan.gpus[1].adapters],
                                   1.0),))
    write_deployment(one, out, force=True)
    assert not (out / "servers" / "gpu-1.sh").exists()
    assert (out / "servers" / "gpu-0.sh").stat().st_mode & 0o111


def test_profile_without_serving_falls_back_clearly(tmp_path):
    d = load_profile(LLAMA).to_dict()
    assert "serving" not in d
    d["name"] = "llama-no-serving"
    path = tmp_path / "llama-no-serving.json"
    path.write_text(json.dumps(d))
    sm = served_model(str(path))
    assert sm.model_id == "meta-llama/Llama-3.1-8B-Instruct"
    assert sm.model_id_source.startswith("assumed") and sm.settings_source.startswith("assumed")
    assert served_model(str(path), "my-org/llama").model_id_source == "--model-id"
    d["model"] = "some-unknown-model"
    path.write_text(json.dumps(d))
    with pytest.raises(DeployError, match="--model-id"):
        served_model(str(path))


def test_vllm_args_command_is_runnable():
    inst = _inst()
    p = solve(inst, "maxbase-half")
    (g,) = p.vllm_args(adapter_dir="/m")
    assert g["command"] == g["serve_command"]
    assert "vllm serve llama-3.1-8b-instruct" not in g["command"]   # the profile name, unloadable
    assert g["serve_command"].startswith(
        "VLLM_USE_V1=1 vllm serve meta-llama/Llama-3.1-8B-Instruct --gpu-memory-utilization")
    assert g["serve_command"].endswith(" ".join(g["args"]))
    assert g["model_id"] == "meta-llama/Llama-3.1-8B-Instruct"


def test_kubernetes_names_stay_valid_and_distinct():
    import re
    for raw in ("Adapter_1", "adapter-1", "a" * 300, "--x--", "ÄÖ"):
        n = k8s_name(raw)
        assert re.fullmatch(DNS_SUBDOMAIN, n) and len(n) <= 253
    assert k8s_name("Adapter_1") != k8s_name("adapter-1")
    assert re.fullmatch(_LABEL_VALUE["pattern"], label_value("x" * 80 + "_"))
    assert len(label_value("x" * 80)) <= 63


def test_cli_deploy_end_to_end_and_errors(tmp_path, capsys, split_plan):
    plan = tmp_path / "plan.json"
    plan.write_text(split_plan.to_json())
    out = tmp_path / "out"
    assert main(["deploy", str(plan), "--out", str(out), "--namespace", "ns1"]) == 0
    assert "twin_verdict=accepted" in capsys.readouterr().out
    assert (out / "gateway" / "inferencemodels.json").exists()
    assert main(["deploy", str(plan), "--out", str(out)]) == 2
    assert "--force" in capsys.readouterr().err
    assert main(["deploy", str(plan), "--out", str(out), "--force", "--namespace", "Bad_NS"]) == 2
    assert "--namespace" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"instance": "x", "method": "m", "status": "solved",
                               "wall_time_s": 0, "objective": "gpus",
                               "gpus": [{"gpu_type": "h100"}]}))
    assert main(["deploy", str(bad), "--out", str(tmp_path / "o2")]) == 2
    assert "gpus[0].profile" in capsys.readouterr().err
    assert main(["deploy", str(tmp_path / "missing.json"), "--out", str(tmp_path / "o3")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_integer_routing_weights_sum_to_the_scale():
    from optim.deploy import WEIGHT_SCALE, integer_weights
    for shares in ([1 / 3] * 3, [0.5, 0.5], [0.2, 0.3, 0.5], [1e-4, 1e-4, 1 - 2e-4], [1.0],
                   [1 / 7] * 7):
        w = integer_weights(shares)
        assert sum(w) == WEIGHT_SCALE and min(w) >= 1
        if min(shares) * WEIGHT_SCALE >= 1:      # no home raised to the minimum weight 1
            assert all(abs(x - WEIGHT_SCALE * s) < 1.0 + 1e-9 for x, s in zip(w, shares))
    assert integer_weights([1 / 3] * 3) == [334, 333, 333]
