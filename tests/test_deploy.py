"""Deployment files (optim.deploy, ``python -m optim deploy``) and the profiles' ``serving``
mapping."""

from __future__ import annotations

import errno
import json
import os
import re
from pathlib import Path

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

DATA = Path(__file__).parent / "data"
SCHEMAS = DATA / "schemas"


def vllm_flags(version: str) -> set[str]:
    """Flags of `vllm serve` in that release (tests/data/vllm_args/<version>.txt: read from the
    release's arg_utils.py / cli_args.py, the file's header says where)."""
    lines = (DATA / "vllm_args" / f"{version}.txt").read_text().splitlines()
    return {x.strip() for x in lines if x.strip() and not x.startswith("#")}


def schema(name: str) -> dict:
    return json.loads((SCHEMAS / f"{name}.schema.json").read_text())


# (apiVersion, kind) of every manifest object -> its schema (tests/data/schemas/*.schema.json)
SCHEMA_OF = {
    ("inference.networking.k8s.io/v1", "InferencePool"): "gie-v1-inferencepool",
    ("inference.networking.x-k8s.io/v1alpha2", "InferenceObjective"):
        "gie-v1alpha2-inferenceobjective",
    ("inference.networking.x-k8s.io/v1alpha2", "InferenceModelRewrite"):
        "gie-v1alpha2-inferencemodelrewrite",
    ("inference.networking.x-k8s.io/v1alpha2", "InferencePool"): "gie-v1alpha2-inferencepool",
    ("inference.networking.x-k8s.io/v1alpha2", "InferenceModel"): "gie-v1alpha2-inferencemodel",
    ("model.aibrix.ai/v1alpha1", "ModelAdapter"): "aibrix-v1alpha1-modeladapter",
    ("serving.kserve.io/v1alpha2", "LLMInferenceService"): "kserve-v1alpha2-llminferenceservice",
    ("llm-d.ai/v1alpha1", "EndpointPickerConfig"): "llm-d-v1alpha1-endpointpickerconfig",
}
ALL_TARGETS = ("vllm-0.8.5", "vllm-0.33", "gie-v1", "gie-v1alpha2", "aibrix", "kserve", "llm-d")
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"


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
        assert {a for a in argv if a.startswith("--")} <= vllm_flags("0.8.5")
        assert rec["vllm_version"] == rec["measured_vllm_version"] == "0.8.5"
        assert "measured" in rec["note"]
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


def _objects(text: str) -> list[dict]:
    """The Kubernetes objects of one manifest file (a v1 List, one object, or the endpoint
    picker config inside its ConfigMap)."""
    doc = json.loads(text)
    objs = doc["items"] if doc["kind"] == "List" else [doc]
    out = []
    for o in objs:
        if o["kind"] == "ConfigMap":
            out += [json.loads(v) for v in o["data"].values()]
        else:
            out.append(o)
    return out


def test_every_target_validates_against_the_schema_of_its_release(split_plan):
    import jsonschema
    files = deployment_files(split_plan, DeployOptions(namespace="lora", targets=ALL_TARGETS))
    summary = json.loads(files["deployment.json"])
    assert [t["target"] for t in summary["targets"]] == list(ALL_TARGETS)
    seen_schemas = set()
    for t in summary["targets"]:
        assert t["files"] and t["release"] and t["source"]
        for rel in t["files"]:
            if rel.startswith("servers/"):
                continue
            objs = _objects(files[rel])
            for obj in objs:
                key = (obj["apiVersion"], obj["kind"])
                assert key in SCHEMA_OF, (rel, key)
                assert obj["apiVersion"] in t["api_versions"], (rel, t["target"])
                jsonschema.validate(obj, schema(SCHEMA_OF[key]))
                seen_schemas.add(SCHEMA_OF[key])
                if "metadata" in obj:
                    assert obj["metadata"]["namespace"] == "lora"
                    assert obj["metadata"]["annotations"]["lora-placement/twin-verdict"] == \
                        "accepted"
    assert seen_schemas == set(SCHEMA_OF.values())      # every schema was used


def test_schemas_name_their_source_and_refuse_the_other_release(split_plan):
    import jsonschema
    for f in SCHEMAS.glob("*.schema.json"):
        sch = json.loads(f.read_text())
        jsonschema.Draft202012Validator.check_schema(sch)
        assert "github.com/" in sch["$comment"] and "commit" in sch["$comment"], f.name
    assert {f.name.removesuffix(".schema.json") for f in SCHEMAS.glob("*.schema.json")} == \
        set(SCHEMA_OF.values())
    files = deployment_files(split_plan, DeployOptions(targets=("gie-v1", "gie-v1alpha2")))
    v1 = json.loads(files["gateway/inferencepool.json"])
    old = json.loads(files["gateway-v1alpha2/inferencepool.json"])
    with pytest.raises(jsonschema.ValidationError):      # a v1alpha2 spec is not a v1 pool
        jsonschema.validate({**old, "apiVersion": v1["apiVersion"]},
                            schema("gie-v1-inferencepool"))
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**v1, "apiVersion": old["apiVersion"]},
                            schema("gie-v1alpha2-inferencepool"))
    bad = json.loads(json.dumps(v1))
    bad["spec"]["targetPorts"] = [{"number": 8000 + i} for i in range(9)]   # maxItems 8
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema("gie-v1-inferencepool"))


def test_gateway_v1_splits_traffic_by_rewrite_and_selects_the_servers(split_plan):
    files = deployment_files(split_plan, DeployOptions(targets=("gie-v1", "vllm-measured")))
    pool = json.loads(files["gateway/inferencepool.json"])
    assert pool["spec"]["targetPorts"] == [{"number": 8000}, {"number": 8001}]
    assert pool["spec"]["endpointPickerRef"]["port"] == {"number": 9002}
    labels = json.loads(files["servers/gpu-0.json"])["pod_labels"]
    assert pool["spec"]["selector"]["matchLabels"].items() <= labels.items()
    objectives = _objects(files["gateway/inferenceobjectives.json"])
    assert [o["metadata"]["annotations"]["lora-placement/adapter"] for o in objectives] == \
        ["a0", "a1", "a2", "a3"]
    assert all(o["spec"]["poolRef"] == {"group": "inference.networking.k8s.io",
                                        "kind": "InferencePool",
                                        "name": pool["metadata"]["name"]} for o in objectives)
    (rw,) = _objects(files["gateway/inferencemodelrewrites.json"])   # only a0 is split
    (rule,) = rw["spec"]["rules"]
    assert rule["matches"] == [{"model": {"type": "Exact", "value": "a0"}}]
    assert rule["targets"] == [{"modelRewrite": "a0--gpu0", "weight": 600},
                               {"modelRewrite": "a0--gpu1", "weight": 400}]
    from optim.deploy import gateway_v1_manifests
    with pytest.raises(DeployError, match="at most 8 targetPorts"):
        gateway_v1_manifests(routing_table(split_plan), "p", "ns", range(8000, 8009), "x")


def test_v1alpha2_aibrix_kserve_and_llmd_objects(split_plan):
    files = deployment_files(split_plan, DeployOptions(targets=ALL_TARGETS,
                                                       adapter_dir="s3://b/loras"))
    models = _objects(files["gateway-v1alpha2/inferencemodels.json"])
    for obj in models:
        tm = obj["spec"]["targetModels"]
        assert all("weight" in t for t in tm) or not any("weight" in t for t in tm)
    a0 = next(o for o in models if o["spec"]["modelName"] == "a0")
    assert a0["spec"]["targetModels"] == [{"name": "a0--gpu0", "weight": 600},
                                          {"name": "a0--gpu1", "weight": 400}]
    ma = _objects(files["aibrix/modeladapters.json"])
    assert len(ma) == 5                                   # one per adapter home
    for obj in ma:
        assert obj["spec"]["baseModel"] == "meta-llama/Llama-3.1-8B-Instruct"
        home = obj["metadata"]["annotations"]["lora-placement/served-name"]
        assert obj["spec"]["podSelector"]["matchLabels"]["lora-placement/server"] == \
            ("gpu-1" if home.endswith("gpu1") or home in ("a2", "a3") else "gpu-0")
    svcs = _objects(files["kserve/llminferenceservices.json"])
    assert len(svcs) == 2
    for i, (svc, g) in enumerate(zip(svcs, split_plan.gpus)):
        lora = svc["spec"]["model"]["lora"]
        assert svc["spec"]["model"]["uri"] == "hf://meta-llama/Llama-3.1-8B-Instruct"
        assert (lora["maxAdapters"], lora["maxRank"]) == (g.max_loras, g.max_lora_rank)
        assert lora["maxCpuAdapters"] >= len(lora["adapters"]) == g.n_adapters
        names = [x["name"] for x in lora["adapters"]]
        assert len(set(names)) == len(names) and svc["spec"]["model"]["name"] not in names
        assert all(x["uri"].startswith("s3://b/loras/a") for x in lora["adapters"])
        assert svc["spec"]["labels"]["lora-placement/server"] == f"gpu-{i}"
    (cfg,) = _objects(files["llm-d/epp-config.json"])
    defined = {p.get("name", p["type"]) for p in cfg["plugins"]}
    refs = {r["pluginRef"] for prof in cfg["schedulingProfiles"] for r in prof["plugins"]}
    assert refs <= defined and "lora-affinity-scorer" in refs
    assert "prefix-cache-scorer" not in defined           # prefix caching is off on the servers


def test_every_vllm_command_uses_only_its_release_flags(split_plan):
    files = deployment_files(split_plan, DeployOptions(targets=ALL_TARGETS))
    checked = {"0.8.5": 0, "0.33.0": 0}
    for rel, text in files.items():
        if rel.startswith("servers/") and rel.endswith(".json"):
            rec = json.loads(text)
            flags = {a for a in rec["argv"] if a.startswith("--")}
            missing = flags - vllm_flags(rec["vllm_version"])
            assert not missing, (rel, missing)
            checked[rec["vllm_version"]] += 1
    assert checked == {"0.8.5": 2, "0.33.0": 2}
    # KServe runs the current vLLM line: its VLLM_ADDITIONAL_ARGS are that line's flags
    for svc in _objects(files["kserve/llminferenceservices.json"]):
        (env,) = svc["spec"]["template"]["containers"][0]["env"]
        extra = {a for a in env["value"].split() if a.startswith("--")}
        assert extra and extra <= vllm_flags("0.33.0")
    # the flags the plan relies on exist in both releases; flags removed since 0.8.5 are listed
    lora = {"--enable-lora", "--max-loras", "--max-cpu-loras", "--max-lora-rank",
            "--lora-modules", "--no-enable-prefix-caching", "--enable-chunked-prefill"}
    assert lora <= vllm_flags("0.8.5") & vllm_flags("0.33.0")
    assert "--enable-lora-bias" in vllm_flags("0.8.5") - vllm_flags("0.33.0")


def test_current_vllm_line_commands(split_plan):
    files = deployment_files(split_plan, DeployOptions(adapter_dir="/loras",
                                                       targets=("vllm-current",)))
    assert not any(f.startswith("servers/gpu-") for f in files)
    for i, g in enumerate(split_plan.gpus):
        rec = json.loads(files[f"servers/vllm-0.33.0/gpu-{i}.json"])
        argv = rec["argv"]
        assert rec["env"] == {"CUDA_VISIBLE_DEVICES": str(i)}          # no VLLM_USE_V1
        assert rec["vllm_version"] == "0.33.0" and rec["measured_vllm_version"] == "0.8.5"
        assert "0.8.5" in rec["note"] and "not measured" in rec["note"]
        assert any("VLLM_USE_V1" in c for c in rec["changes_since_measured"])
        mods = [json.loads(m) for m in argv[argv.index("--lora-modules") + 1:]]
        assert len(mods) == g.n_adapters
        assert all(set(m) == {"name", "path", "base_model_name"} for m in mods)
        assert all(m["base_model_name"] == "meta-llama/Llama-3.1-8B-Instruct" for m in mods)
        assert mods[0]["path"] == "/loras/a0"
        sh = files[f"servers/vllm-0.33.0/gpu-{i}.sh"]
        assert "VLLM_USE_V1" not in sh and "not measured" in sh
    summary = json.loads(files["deployment.json"])
    assert [t["target"] for t in summary["targets"]] == ["vllm-0.33"]


def test_default_targets_are_the_measured_vllm_and_current_control_planes(split_plan):
    files = deployment_files(split_plan)
    summary = json.loads(files["deployment.json"])
    assert [t["target"] for t in summary["targets"]] == \
        ["vllm-0.8.5", "gie-v1", "aibrix", "kserve", "llm-d"]
    assert summary["vllm_version"] == summary["measured_vllm_version"] == "0.8.5"
    assert {"servers/gpu-0.sh", "gateway/inferencepool.json", "gateway/inferenceobjectives.json",
            "gateway/inferencemodelrewrites.json", "aibrix/modeladapters.json",
            "kserve/llminferenceservices.json", "llm-d/epp-config.json", "routing.json",
            "routing.csv"} <= set(files)
    assert not any(f.startswith(("gateway-v1alpha2/", "servers/vllm-")) for f in files)
    assert json.loads(files["servers/gpu-0.json"])["env"]["VLLM_USE_V1"] == "1"


def test_unknown_target_is_refused(tmp_path, capsys, split_plan):
    with pytest.raises(DeployError, match="--target: unknown target 'vllm-9'"):
        deployment_files(split_plan, DeployOptions(targets=("vllm-9",)))
    plan = tmp_path / "plan.json"
    plan.write_text(split_plan.to_json())
    out = tmp_path / "out"
    assert main(["deploy", str(plan), "--out", str(out), "--target", "gie-v1,vllm-9"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --target: unknown target 'vllm-9'") and err.count("\n") == 1
    assert not out.exists()
    assert main(["deploy", str(plan), "--out", str(out), "--target", "vllm-current",
                 "--target", "gie-v1alpha2,aibrix"]) == 0
    capsys.readouterr()
    summary = json.loads((out / "deployment.json").read_text())
    assert [t["target"] for t in summary["targets"]] == ["vllm-0.33", "gie-v1alpha2", "aibrix"]


def test_cli_target_names_agree_with_the_module():
    from optim.cli_deploy import CLI_DEPLOY_DEFAULT_TARGETS, CLI_DEPLOY_TARGETS
    from optim.deploy import DEFAULT_TARGETS, TARGET_ALIASES, TARGETS
    assert set(CLI_DEPLOY_TARGETS) == set(TARGETS) | set(TARGET_ALIASES)
    assert CLI_DEPLOY_DEFAULT_TARGETS == DEFAULT_TARGETS
    import subprocess
    import sys
    help_text = subprocess.run([sys.executable, "-m", "optim", "deploy", "--help"],
                               capture_output=True, text=True, check=True).stdout
    flat = "".join(help_text.split())             # --help wraps lines, also at hyphens
    for t in CLI_DEPLOY_TARGETS:
        assert t in flat, t


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
    # fewer targets over the same directory: the manifests of the dropped ones go too
    write_deployment(one, out, DeployOptions(targets=("vllm-measured", "aibrix")), force=True)
    assert not (out / "kserve" / "llminferenceservices.json").exists()
    assert not (out / "gateway" / "inferencepool.json").exists()
    assert (out / "aibrix" / "modeladapters.json").exists()


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
    assert re.fullmatch(LABEL_VALUE, label_value("x" * 80 + "_"))
    assert len(label_value("x" * 80)) <= 63


def test_cli_deploy_end_to_end_and_errors(tmp_path, capsys, split_plan):
    plan = tmp_path / "plan.json"
    plan.write_text(split_plan.to_json())
    out = tmp_path / "out"
    assert main(["deploy", str(plan), "--out", str(out), "--namespace", "ns1"]) == 0
    assert "twin_verdict=accepted" in capsys.readouterr().out
    assert (out / "gateway" / "inferenceobjectives.json").exists()
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


# ----------------------------------------------------------------------------- plan checks
def _plan_dict(p: Placement) -> dict:
    return json.loads(p.to_json())


def _split_home(d):                      # a single home with share 0.5
    d["gpus"][1]["adapters"][1]["share"] = 0.5


def _max_loras_zero(d):
    d["gpus"][1]["max_loras"] = 0


def _cpu_loras_low(d):
    d["gpus"][1]["max_cpu_loras"] = 2    # 3 adapters on gpu 1


def _cpu_below_max_loras(d):
    d["gpus"][1]["max_cpu_loras"] = 3    # max_loras is 4
    d["gpus"][1]["max_loras"] = 4


def _rank_above(d):
    d["gpus"][0]["max_lora_rank"] = 8    # a0 has rank 16


def _rank_not_vllm(d):
    d["gpus"][0]["max_lora_rank"] = 24


def _no_gpus(d):
    d["gpus"] = []


def _twice(d):
    d["gpus"][1]["adapters"].append(dict(d["gpus"][1]["adapters"][1]))


@pytest.mark.parametrize("edit, message", [
    (_split_home, r": adapter 'a2': shares sum to 0\.5 over 1 home\(s\) \(gpu 1: 0\.5\); they "
                  r"must sum to 1$"),
    (_max_loras_zero, r": gpu 1: max_loras 0: must be an integer of at least 1"),
    (_cpu_loras_low, r": gpu 1: max_cpu_loras 2: below the 3 adapter\(s\) served on this GPU"),
    (_cpu_below_max_loras, r": gpu 1: max_cpu_loras 3: below max_loras 4"),
    (_rank_above, r": gpu 0: adapter 'a0' rank 16: above the GPU's max_lora_rank 8"),
    (_rank_not_vllm, r": gpu 0: max_lora_rank 24: not a rank vLLM accepts"),
    (_no_gpus, r": no GPUs to deploy"),
    (_twice, r": gpu 1: adapter 'a2': listed twice on this GPU"),
])
def test_bad_plans_are_refused_before_anything_is_written(tmp_path, capsys, split_plan, edit,
                                                          message):
    import re
    d = _plan_dict(split_plan)
    edit(d)
    plan = tmp_path / "bad-plan.json"
    plan.write_text(json.dumps(d))
    out = tmp_path / "out"
    assert main(["deploy", str(plan), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err                     # one line
    assert err.startswith(f"error: {plan}: "), err
    assert re.search(message, err.strip()), err
    assert not out.exists()                               # no file left behind
    # the library refuses the same plan (write_deployment as `optim plan` calls it)
    from optim.deploy import load_plan
    with pytest.raises(DeployError):
        write_deployment(load_plan(plan), tmp_path / "out2")
    assert not (tmp_path / "out2").exists()


def test_plan_max_cpu_loras_is_honoured_when_valid(tmp_path, split_plan):
    from optim.deploy import load_plan
    d = _plan_dict(split_plan)
    d["gpus"][1]["max_cpu_loras"] = 6
    path = tmp_path / "p.json"
    path.write_text(json.dumps(d))
    files = deployment_files(load_plan(path), DeployOptions(targets=("vllm-measured", "kserve")))
    argv = json.loads(files["servers/gpu-1.json"])["argv"]
    assert _flag(argv, "--max-cpu-loras") == "6"
    svc = _objects(files["kserve/llminferenceservices.json"])[1]
    assert svc["spec"]["model"]["lora"]["maxCpuAdapters"] == 6
    assert _flag(json.loads(files["servers/gpu-0.json"])["argv"], "--max-cpu-loras") == "3"


def test_solver_plans_pass_the_checks():
    from optim.deploy import check_plan
    for method in ("maxbase-half", "greedy"):
        check_plan(solve(_inst(), method))


# ----------------------------------------------------------------------------- write errors
def test_read_only_output_names_the_file(tmp_path, capsys, split_plan, monkeypatch):
    plan = tmp_path / "plan.json"
    plan.write_text(split_plan.to_json())
    out = tmp_path / "ro"
    out.mkdir()
    if os.geteuid() != 0:               # chmod binds: the first directory cannot be created
        out.chmod(0o500)
        try:
            assert main(["deploy", str(plan), "--out", str(out)]) == 2
        finally:
            out.chmod(0o700)
        err = capsys.readouterr().err
        assert err == f"error: --out {out}/servers: cannot write: permission denied\n"
        assert list(out.iterdir()) == []
    # root ignores the mode: a read-only file system is simulated at the first script
    real = Path.write_text

    def write_text(self, *args, **kwargs):
        if self.name == "gpu-0.sh":
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", write_text)
    assert main(["deploy", str(plan), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err == f"error: --out {out}/servers/gpu-0.sh: cannot write: read-only file system\n"
    assert list(out.iterdir()) == []                       # what this run created is removed


def test_full_disk_names_the_file(tmp_path, split_plan, monkeypatch):
    real = Path.write_text

    def write_text(self, *args, **kwargs):
        if self.name == "routing.csv":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", write_text)
    out = tmp_path / "full"
    with pytest.raises(DeployError) as e:
        write_deployment(split_plan, out)
    assert str(e.value) == f"--out {out}/routing.csv: cannot write: no space left on device"
    assert not out.exists()


@pytest.mark.parametrize("field, value, why", [
    ("rate", -1.0, r"'gpus\[0\]\.adapters\[0\]\.rate' must be a finite number of requests/s > 0, "
                   r"got -1\.0"),
    ("rate", "fast", r"'gpus\[0\]\.adapters\[0\]\.rate' must be a finite number"),
    ("rank", 0, r"'gpus\[0\]\.adapters\[0\]\.rank' must be an integer >= 1, got 0"),
    ("rank", 8.5, r"'gpus\[0\]\.adapters\[0\]\.rank' must be an integer >= 1, got 8\.5"),
])
def test_bad_adapter_fields_of_a_plan_name_the_field(tmp_path, capsys, split_plan, field, value,
                                                     why):
    d = _plan_dict(split_plan)
    d["gpus"][0]["adapters"][0][field] = value
    plan = tmp_path / "bad-plan.json"
    plan.write_text(json.dumps(d))
    assert main(["deploy", str(plan), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and re.search(why, err), err
    assert not (tmp_path / "out").exists()
