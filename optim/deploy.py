"""Deployment files from one plan: vLLM commands per server, a routing table, control-plane
manifests.

A plan (``optim solve --json``) says which adapters each GPU serves, with routing shares, and
which Amax / max rank it runs. To deploy it, every GPU becomes one vLLM 0.8.5 server started
with the *served model id* and the server settings its profile was calibrated with (the
profile's ``serving`` mapping plus its simulated fields ``max_num_batched_tokens``,
``max_num_seqs``, ``max_model_len``), so the real server runs what the twin simulated:

``VLLM_USE_V1=1 CUDA_VISIBLE_DEVICES=<d> vllm serve <model id> --port <p>
--gpu-memory-utilization 0.9 --max-num-batched-tokens 2048 --max-num-seqs 2048
--max-model-len 131072 --dtype auto --enable-chunked-prefill --no-enable-prefix-caching
--enable-lora --max-loras A --max-cpu-loras C --max-lora-rank R --lora-modules name=dir/id ...``

(flag names of vLLM's ``vllm/engine/arg_utils.py``, checked against a copy from before 0.8 and
vLLM's own test of ``--no-enable-prefix-caching``, not against the 0.8.5 tag). A profile without
``serving`` (a derived one, whose ``serving`` would be its source's) falls back: the model id
is ``--model-id`` or, said as *assumed*, the model catalog's Hugging Face repository of the
profile's model; the settings are what the twin models (chunked prefill on, prefix caching
off) and vLLM's default memory fraction 0.9, marked assumed.

Served names. An adapter with one home is served under its id. An adapter split over several
GPUs is served on home ``g`` under ``<id>--gpu<g>``, one name per home, so a gateway can split
its traffic by weight over the homes (Gateway API Inference Extension ``targetModels``); each
name takes one LoRA slot on its own server only, as in the twin.

Files (``write_deployment``), every one recording the twin's verdict:

- ``deployment.json``: summary (plan, verdict, model ids and their source, layout, files);
- ``servers/gpu-<i>.sh`` and ``servers/gpu-<i>.json``: the command (shell script) and its
  environment, arguments and pod labels;
- ``routing.json`` / ``routing.csv``: adapter -> homes (GPU, server, host, port, served name,
  share, integer weight); shares sum to 1 per adapter;
- ``aibrix/modeladapters.json``: AIBrix ``ModelAdapter`` objects (``model.aibrix.ai/v1alpha1``;
  one per adapter home, ``replicas: 1`` — the CRD accepts only 1 or unset — with a pod
  selector on the home's server label);
- ``gateway/inferencepool.json`` and ``gateway/inferencemodels.json``: Gateway API Inference
  Extension ``InferencePool`` (selector on the plan's pool label) and one ``InferenceModel`` per
  adapter whose ``targetModels`` carry the homes' served names and weights
  (``inference.networking.x-k8s.io/v1alpha2``, the API of releases v0.3-v0.5).

Manifests are JSON documents (valid YAML; ``kubectl apply -f`` reads them as ``v1`` ``List``
objects), so no YAML library is needed. The servers' pods must carry the labels listed in each
``servers/gpu-<i>.json`` (``pod_labels``) for the selectors to match.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from .placement import GpuPlan, Placement

VLLM_VERSION = "0.8.5"
DEFAULT_BASE_PORT = 8000
DEFAULT_GPUS_PER_HOST = 8
DEFAULT_NAMESPACE = "default"
EPP_PORT = 9002
LABEL_SERVER = "lora-placement/server"
LABEL_POOL = "lora-placement/pool"
ANNOTATION_VERDICT = "lora-placement/twin-verdict"
WEIGHT_SCALE = 1000        # integer routing weight = share x this (GIE: weight in 1..1e6)
AIBRIX_API = "model.aibrix.ai/v1alpha1"
GIE_API = "inference.networking.x-k8s.io/v1alpha2"


class DeployError(ValueError):
    """A plan or option that cannot be deployed; the message names the field or option."""


# ----------------------------------------------------------------------------- served model
@dataclass(frozen=True)
class ServedModel:
    """The model id vLLM loads and the server settings for one profile, with where they come
    from (``source``: ``profile``, ``--model-id`` or ``assumed``)."""

    profile: str
    model_id: str
    model_id_source: str
    settings_source: str
    env: tuple[tuple[str, str], ...]
    flags: tuple[str, ...]


def served_model(profile_name: str, model_id: str | None = None) -> ServedModel:
    """Model id and calibrated server flags of ``profile_name`` (module docstring); raises
    ``DeployError`` when no model id is known and ``model_id`` is not given."""
    from twin.profile import ProfileError, load_profile
    try:
        prof = load_profile(profile_name)
    except (FileNotFoundError, ProfileError) as e:
        raise DeployError(f"profile {profile_name!r} of the plan: {e}") from None
    serving = {} if prof.is_derived else dict(prof.serving)
    if model_id is not None:
        if not model_id.strip():
            raise DeployError("--model-id: empty model id")
        mid, mid_src = model_id.strip(), "--model-id"
    elif serving:
        mid, mid_src = serving["model_id"], "profile"
    else:
        mid = _catalog_model_id(prof.model)
        if mid is None:
            raise DeployError(
                f"profile {prof.name!r}: no 'serving.model_id' and model {prof.model!r} is not in "
                "the model catalog; give the model id vLLM should load with --model-id")
        mid_src = (f"assumed (model catalog entry of {prof.model!r}; profile has no "
                   "serving.model_id)")
    settings_src = "profile" if serving else \
        "assumed (profile has no 'serving' mapping: what the twin models, vLLM default memory 0.9)"
    gmu = float(serving.get("gpu_memory_utilization", 0.9))
    chunked = bool(serving.get("enable_chunked_prefill", True))
    prefix = bool(serving.get("enable_prefix_caching", False))
    flags = ["--gpu-memory-utilization", f"{gmu:g}",
             "--max-num-batched-tokens", str(prof.max_num_batched_tokens),
             "--max-num-seqs", str(prof.max_num_seqs),
             "--max-model-len", str(prof.max_model_len),
             "--dtype", str(serving.get("dtype", "auto")),
             "--enable-chunked-prefill" if chunked else "--no-enable-chunked-prefill",
             "--enable-prefix-caching" if prefix else "--no-enable-prefix-caching"]
    engine = str(serving.get("engine", "v1")).lower()
    env = (("VLLM_USE_V1", "1" if engine == "v1" else "0"),)
    return ServedModel(prof.name, mid, mid_src, settings_src, env, tuple(flags))


def _catalog_model_id(model: str) -> str | None:
    try:
        from twin.model_configs import load_models
        cfg = load_models().get(model)
    except (OSError, ValueError):
        return None
    return cfg.hf_repo if cfg is not None and cfg.hf_repo else None


def lora_flags(g: GpuPlan, names: Sequence[str], adapter_dir: str) -> list[str]:
    """``--enable-lora ... --lora-modules name=<adapter_dir>/<id> ...`` of one GPU."""
    return ["--enable-lora", "--max-loras", str(g.max_loras),
            "--max-cpu-loras", str(max(g.n_adapters, g.max_loras)),
            "--max-lora-rank", str(g.max_lora_rank), "--lora-modules",
            *[f"{n}={adapter_dir}/{a.id}" for n, (a, _) in zip(names, g.adapters)]]


# ----------------------------------------------------------------------------- layout
@dataclass(frozen=True)
class Layout:
    """Where servers run: ``gpus_per_host`` GPUs per host, ports from ``base_port``."""

    base_port: int = DEFAULT_BASE_PORT
    gpus_per_host: int = DEFAULT_GPUS_PER_HOST

    def host(self, gpu: int) -> int:
        return gpu // self.gpus_per_host

    def device(self, gpu: int) -> int:
        return gpu % self.gpus_per_host

    def port(self, gpu: int) -> int:
        return self.base_port + self.device(gpu)


def server_name(gpu: int) -> str:
    return f"gpu-{gpu}"


def served_names(p: Placement) -> list[list[str]]:
    """Per GPU, the served name of each of its adapters (module docstring: ``<id>`` for one
    home, ``<id>--gpu<g>`` on each home of a split adapter)."""
    homes: dict[str, int] = {}
    for g in p.gpus:
        for a, _ in g.adapters:
            homes[a.id] = homes.get(a.id, 0) + 1
    return [[a.id if homes[a.id] == 1 else f"{a.id}--gpu{i}" for a, _ in g.adapters]
            for i, g in enumerate(p.gpus)]


# ----------------------------------------------------------------------------- routing
def routing_table(p: Placement, layout: Layout = Layout()) -> list[dict[str, Any]]:
    """Adapter -> homes: GPU, server, host, port, served name, share (normalised to sum to 1)
    and integer weight (``WEIGHT_SCALE`` x share, at least 1); adapters sorted by id."""
    names = served_names(p)
    rows: dict[str, dict[str, Any]] = {}
    for i, g in enumerate(p.gpus):
        for (a, share), name in zip(g.adapters, names[i]):
            r = rows.setdefault(a.id, {"adapter": a.id, "rank": a.rank, "rate": a.rate,
                                       "homes": []})
            r["homes"].append({"gpu": i, "server": server_name(i), "host": layout.host(i),
                               "port": layout.port(i), "served_name": name,
                               "share": float(share)})
    for r in rows.values():
        total = sum(h["share"] for h in r["homes"])
        if not total > 0:
            raise DeployError(f"plan: adapter '{r['adapter']}' has routing shares summing to "
                              f"{total}; cannot route it")
        for h in r["homes"]:
            h["share"] = h["share"] / total
        for h, w in zip(r["homes"], integer_weights([h["share"] for h in r["homes"]])):
            h["weight"] = w
    return [rows[k] for k in sorted(rows)]


def integer_weights(shares: Sequence[float], scale: int = WEIGHT_SCALE) -> list[int]:
    """Integer weights proportional to ``shares`` (summing to 1) that sum to exactly ``scale``,
    each at least 1 (a home with weight 0 would never be routed to): largest remainders, ties to
    the earlier home, so 1/3 each gives 334, 333, 333 rather than 333 x 3 = 999."""
    n = len(shares)
    exact = [max(scale * s, 1.0) for s in shares]
    w = [int(x) for x in exact]
    left = scale - sum(w)
    order = sorted(range(n), key=lambda i: (-(exact[i] - w[i]), i))
    for i in order[:max(left, 0)]:
        w[i] += 1
    while sum(w) > scale:                   # only when the minimum of 1 pushed the sum over
        i = max(range(n), key=lambda j: (w[j], -j))
        w[i] -= 1
    return w


def routing_csv(table: Sequence[dict[str, Any]], verdict: str) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["adapter", "rank", "rate", "gpu", "server", "host", "port", "served_name",
                "share", "weight", "twin_verdict"])
    for r in table:
        for h in r["homes"]:
            w.writerow([r["adapter"], r["rank"], r["rate"], h["gpu"], h["server"], h["host"],
                        h["port"], h["served_name"], f"{h['share']:.9g}", h["weight"], verdict])
    return buf.getvalue()


# ----------------------------------------------------------------------------- k8s names
_DNS_BAD = re.compile(r"[^a-z0-9.-]+")
_LABEL_BAD = re.compile(r"[^A-Za-z0-9_.-]+")


def k8s_name(text: str, max_len: int = 253) -> str:
    """A DNS-1123 subdomain name for ``text`` (lower case, ``[a-z0-9.-]``, alphanumeric ends);
    a short hash of the original is appended whenever characters were changed, so distinct
    ids stay distinct."""
    s = _DNS_BAD.sub("-", text.lower()).strip("-.")
    if s != text or not s:
        tag = hashlib.sha256(text.encode()).hexdigest()[:8]
        s = f"{s[:max_len - 9]}-{tag}" if s else f"x-{tag}"
    return s[:max_len].strip("-.")


def label_value(text: str) -> str:
    """A Kubernetes label value (<= 63 characters, ``[A-Za-z0-9_.-]``, alphanumeric ends)."""
    s = _LABEL_BAD.sub("-", text).strip("-_.")
    if s != text or len(s) > 63:
        tag = hashlib.sha256(text.encode()).hexdigest()[:8]
        s = f"{s[:54].strip('-_.')}-{tag}".strip("-_.")
    return s


def _k8s_list(items: list[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "List", "items": items}


def _meta(name: str, namespace: str, verdict: str, labels: dict[str, str],
          annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {"name": name, "namespace": namespace, "labels": labels,
            "annotations": {ANNOTATION_VERDICT: verdict, **(annotations or {})}}


def aibrix_manifests(table: Sequence[dict[str, Any]], base_model: str, pool: str,
                     namespace: str, adapter_dir: str, verdict: str) -> dict[str, Any]:
    """AIBrix ``ModelAdapter`` objects: one per adapter home, named after its served name,
    ``replicas: 1``, pod selector = the home's server label within the plan's pool."""
    items, seen = [], set()
    for r in table:
        for h in r["homes"]:
            name = k8s_name(h["served_name"])
            if name in seen:
                raise DeployError(f"adapter '{r['adapter']}': Kubernetes name {name!r} is "
                                  "already used by another adapter")
            seen.add(name)
            items.append({
                "apiVersion": AIBRIX_API, "kind": "ModelAdapter",
                "metadata": _meta(name, namespace, verdict,
                                  {"model.aibrix.ai/name": label_value(h["served_name"]),
                                   LABEL_POOL: pool},
                                  {"lora-placement/adapter": r["adapter"],
                                   "lora-placement/served-name": h["served_name"],
                                   "lora-placement/share": f"{h['share']:.9g}"}),
                "spec": {"baseModel": base_model,
                         "podSelector": {"matchLabels": {LABEL_POOL: pool,
                                                         LABEL_SERVER: h["server"]}},
                         "artifactURL": f"{adapter_dir}/{r['adapter']}",
                         "replicas": 1,
                         "schedulerName": "default"}})
    return _k8s_list(items)


def gateway_manifests(table: Sequence[dict[str, Any]], pool: str, namespace: str,
                      port: int, verdict: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Gateway API Inference Extension: the ``InferencePool`` of the plan's servers and one
    ``InferenceModel`` per adapter with its homes' served names and weights."""
    pool_obj = {"apiVersion": GIE_API, "kind": "InferencePool",
                "metadata": _meta(pool, namespace, verdict, {LABEL_POOL: pool}),
                "spec": {"selector": {LABEL_POOL: pool}, "targetPortNumber": int(port),
                         "extensionRef": {"name": k8s_name(f"{pool}-epp", 253),
                                          "portNumber": EPP_PORT, "failureMode": "FailClose"}}}
    models, seen = [], set()
    for r in table:
        name = k8s_name(r["adapter"])
        if name in seen:
            raise DeployError(f"adapter '{r['adapter']}': Kubernetes name {name!r} is already "
                              "used by another adapter")
        seen.add(name)
        if len(r["homes"]) > 10:
            raise DeployError(f"adapter '{r['adapter']}' has {len(r['homes'])} homes; an "
                              "InferenceModel lists at most 10 targetModels")
        models.append({
            "apiVersion": GIE_API, "kind": "InferenceModel",
            "metadata": _meta(name, namespace, verdict, {LABEL_POOL: pool},
                              {"lora-placement/adapter": r["adapter"]}),
            "spec": {"modelName": r["adapter"], "criticality": "Standard",
                     "poolRef": {"name": pool},
                     "targetModels": [{"name": h["served_name"], "weight": h["weight"]}
                                      for h in r["homes"]]}})
    return pool_obj, _k8s_list(models)


# ----------------------------------------------------------------------------- files
@dataclass(frozen=True)
class DeployOptions:
    """What ``write_deployment`` needs beside the plan."""

    adapter_dir: str = "adapters"
    namespace: str = DEFAULT_NAMESPACE
    model_id: str | None = None
    layout: Layout = Layout()
    allow_rejected: bool = False


def plan_verdict(p: Placement) -> str:
    return p.verdict or "unverified"


def check_deployable(p: Placement, allow_rejected: bool) -> None:
    """Refuse a plan without GPUs, or one the twin rejected unless ``allow_rejected``."""
    if not p.gpus:
        raise DeployError(f"plan: no GPUs to deploy (status {p.status})")
    if p.verdict == "rejected" and not allow_rejected:
        bad = [i for i, g in enumerate(p.gpus) if g.verified and not g.verified.ok]
        raise DeployError(f"plan: the twin rejected this placement (GPUs {bad[:10]} starve or "
                          "cannot start); pass --allow-rejected to write it anyway (every file "
                          "then records twin_verdict=rejected)")


def deployment_files(p: Placement, opts: DeployOptions = DeployOptions()) -> dict[str, str]:
    """Relative path -> text of every file of the deployment (module docstring)."""
    check_deployable(p, opts.allow_rejected)
    if not opts.adapter_dir.strip():
        raise DeployError("--adapter-dir: empty path")
    ns = opts.namespace
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", ns) or len(ns) > 63:
        raise DeployError(f"--namespace: {ns!r} is not a Kubernetes namespace name "
                          "(lower-case letters, digits and '-', at most 63)")
    verdict = plan_verdict(p)
    failed = sum(1 for g in p.gpus if g.verified and not g.verified.ok) if p.verdict else None
    models = {name: served_model(name, opts.model_id)
              for name in sorted({g.profile for g in p.gpus})}
    base_ids = sorted({m.model_id for m in models.values()})
    if len(base_ids) > 1:
        raise DeployError(f"plan: GPUs serve different base models {base_ids}; a plan deploys "
                          "one base model (one adapter pool)")
    pool = label_value(k8s_name(f"{p.instance}-pool", 63))
    layout = opts.layout
    names = served_names(p)
    files: dict[str, str] = {}
    servers = []
    for i, g in enumerate(p.gpus):
        sm = models[g.profile]
        env = {"CUDA_VISIBLE_DEVICES": str(layout.device(i)), **dict(sm.env)}
        args = ["--port", str(layout.port(i)), *sm.flags,
                *lora_flags(g, names[i], opts.adapter_dir)]
        argv = ["vllm", "serve", sm.model_id, *args]
        command = " ".join([*(f"{k}={shlex.quote(v)}" for k, v in env.items()),
                            *map(shlex.quote, argv)])
        rec = {"gpu": i, "server": server_name(i), "host": layout.host(i),
               "port": layout.port(i), "gpu_type": g.gpu_type, "profile": g.profile,
               "model_id": sm.model_id, "model_id_source": sm.model_id_source,
               "settings_source": sm.settings_source, "vllm_version": VLLM_VERSION,
               "env": env, "argv": argv, "command": command,
               "pod_labels": {LABEL_POOL: pool, LABEL_SERVER: server_name(i)},
               "adapters": [{"id": a.id, "served_name": n, "share": s}
                            for (a, s), n in zip(g.adapters, names[i])],
               "twin_verdict": verdict}
        files[f"servers/{server_name(i)}.json"] = json.dumps(rec, indent=1)
        files[f"servers/{server_name(i)}.sh"] = (
            "#!/bin/sh\n"
            f"# {server_name(i)} of plan {p.instance!r} ({p.method}); twin_verdict={verdict}\n"
            f"# model id: {sm.model_id} ({sm.model_id_source}); settings: {sm.settings_source}\n"
            f"exec env {command}\n")
        servers.append({k: rec[k] for k in ("gpu", "server", "host", "port", "profile")})
    table = routing_table(p, layout)
    files["routing.json"] = json.dumps({"instance": p.instance, "twin_verdict": verdict,
                                        "weight_scale": WEIGHT_SCALE, "adapters": table},
                                       indent=1)
    files["routing.csv"] = routing_csv(table, verdict)
    files["aibrix/modeladapters.json"] = json.dumps(
        aibrix_manifests(table, base_ids[0], pool, ns, opts.adapter_dir, verdict), indent=1)
    pool_obj, model_list = gateway_manifests(table, pool, ns, layout.base_port, verdict)
    files["gateway/inferencepool.json"] = json.dumps(pool_obj, indent=1)
    files["gateway/inferencemodels.json"] = json.dumps(model_list, indent=1)
    summary = {"instance": p.instance, "method": p.method, "status": p.status,
               "twin_verdict": verdict, "twin_failed_gpus": failed,
               "vllm_version": VLLM_VERSION, "namespace": ns, "pool": pool,
               "adapter_dir": opts.adapter_dir,
               "models": {k: {"model_id": m.model_id, "model_id_source": m.model_id_source,
                              "settings_source": m.settings_source, "flags": list(m.flags),
                              "env": dict(m.env)} for k, m in models.items()},
               "layout": {"base_port": layout.base_port, "gpus_per_host": layout.gpus_per_host},
               "servers": servers, "n_adapters": len(table),
               "manifests": {"aibrix": "JSON (valid YAML) v1 List of ModelAdapter",
                             "gateway": "JSON (valid YAML) InferencePool + v1 List of "
                                        "InferenceModel"}}
    summary["files"] = sorted([*files, "deployment.json"])
    files["deployment.json"] = json.dumps(summary, indent=1)
    return files


def check_out_dir(out: Path, files: Sequence[str], force: bool) -> None:
    """Refuse before writing: ``out`` is a file, or (without ``force``) a file to be written
    exists."""
    if out.exists() and not out.is_dir():
        raise DeployError(f"--out: {out} is a file; give a directory")
    if not force:
        clash = [f for f in files if (out / f).exists()]
        if clash:
            more = f" (+{len(clash) - 3} more)" if len(clash) > 3 else ""
            raise DeployError(f"--out: {out} already holds {', '.join(clash[:3])}{more}; pass "
                              "--force to overwrite")
    for f in files:
        d = (out / f).parent
        if d.exists() and not d.is_dir():
            raise DeployError(f"--out: {d} is a file; cannot write {f}")


def write_deployment(p: Placement, out: str | Path, opts: DeployOptions = DeployOptions(),
                     force: bool = False) -> list[Path]:
    """Write the deployment files of ``p`` under ``out`` (checked first); returns their paths.
    With ``force``, server files of an earlier deployment in ``out`` that this plan does not
    have are removed (a smaller plan must not leave stale servers behind)."""
    out = Path(out)
    files = deployment_files(p, opts)
    check_out_dir(out, list(files), force)
    old = out / "deployment.json"
    stale: list[Path] = []
    if force and old.is_file():
        try:
            prev = json.loads(old.read_text()).get("files", [])
        except (ValueError, OSError, AttributeError):
            prev = []
        stale = [out / f for f in prev if isinstance(f, str) and f.startswith("servers/")
                 and f not in files and re.fullmatch(r"servers/gpu-\d+\.(sh|json)", f)]
    written = []
    for rel, text in files.items():
        path = out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text if text.endswith("\n") else text + "\n", encoding="utf-8")
        if rel.endswith(".sh"):
            path.chmod(0o755)
        written.append(path)
    for s in stale:
        if s.is_file():
            s.unlink()
    return written


def load_plan(path: str | Path) -> Placement:
    """A plan written by ``optim solve --json``; errors name the file and the field."""
    p = Path(path)
    if not p.exists():
        raise DeployError(f"plan {p}: does not exist")
    if p.is_dir():
        raise DeployError(f"plan {p}: is a directory; give the JSON of `optim solve --json`")
    try:
        d = json.loads(p.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DeployError(f"plan {p}: not a JSON plan ({e})") from None
    if not isinstance(d, dict):
        raise DeployError(f"plan {p}: must be a JSON object (the output of `optim solve --json`)")
    for k in ("instance", "method", "status", "gpus", "wall_time_s", "objective"):
        if k not in d:
            raise DeployError(f"plan {p}: field '{k}' missing (is it `optim solve --json` output?)")
    if not isinstance(d["gpus"], list):
        raise DeployError(f"plan {p}: field 'gpus' must be a list")
    for i, g in enumerate(d["gpus"]):
        if not isinstance(g, dict):
            raise DeployError(f"plan {p}: field 'gpus[{i}]' must be an object")
        for k in ("gpu_type", "profile", "max_loras", "max_lora_rank", "adapters", "offered_tps"):
            if k not in g:
                raise DeployError(f"plan {p}: field 'gpus[{i}].{k}' missing")
        if not isinstance(g["adapters"], list) or not g["adapters"]:
            raise DeployError(f"plan {p}: field 'gpus[{i}].adapters' must be a non-empty list")
        for j, a in enumerate(g["adapters"]):
            if not isinstance(a, dict) or any(k not in a for k in ("id", "rank", "rate", "share")):
                raise DeployError(f"plan {p}: field 'gpus[{i}].adapters[{j}]' needs id, rank, "
                                  "rate and share")
            s = a["share"]
            if isinstance(s, bool) or not isinstance(s, (int, float)) or not 0 < s <= 1:
                raise DeployError(f"plan {p}: field 'gpus[{i}].adapters[{j}].share' must be in "
                                  f"(0, 1], got {s!r}")
    try:
        return Placement.from_dict(d)
    except (KeyError, TypeError, ValueError) as e:
        raise DeployError(f"plan {p}: malformed ({type(e).__name__}: {e})") from None


__all__ = ["DeployError", "DeployOptions", "Layout", "ServedModel", "served_model", "lora_flags",
           "served_names", "routing_table", "aibrix_manifests", "gateway_manifests",
           "deployment_files", "write_deployment", "load_plan", "check_deployable", "k8s_name",
           "label_value"]
