"""Deployment files from one plan: vLLM commands per server, a routing table, control-plane
manifests, for named release lines (*targets*).

A plan (``optim solve --json``) says which adapters each GPU serves, with routing shares, and
which Amax / max rank it runs. Before anything is built or written the plan is checked as the
solver's own output is (``check_plan``): at least one GPU; per GPU ``max_loras`` >= 1,
``max_lora_rank`` one of the ranks both vLLM releases accept (``VLLM_RANKS``: 8 ... 512),
every adapter's rank at most that, no adapter twice, shares in (0, 1], ``max_cpu_loras`` (when
the plan gives one) at least the GPU's adapters and ``max_loras``; per adapter the shares of
its homes sum to 1 (within 1e-6). A plan the twin
rejected is refused unless ``allow_rejected``. Errors name the plan, the GPU or adapter, the
field and the reason, and no file is written.

Targets (``TARGETS``; ``DeployOptions.targets``, ``optim deploy --target``). Defaults
(``DEFAULT_TARGETS``): the vLLM release the profiles were measured on plus every current
control plane.

- ``vllm-measured``: the release named by the profile's ``serving.vllm_version`` (``vllm-0.8.5``
  for the shipped profiles; 0.8.5, said as assumed, for a profile that names none). Every GPU
  becomes one ``vllm serve`` started with the *served model id* and the settings its profile was
  calibrated with (``serving`` plus the simulated ``max_num_batched_tokens``, ``max_num_seqs``,
  ``max_model_len``), so the real server runs what the twin simulated::

    VLLM_USE_V1=1 CUDA_VISIBLE_DEVICES=<d> vllm serve <model id> --port <p>
    --gpu-memory-utilization 0.9 --max-num-batched-tokens 2048 --max-num-seqs 2048
    --max-model-len 131072 --dtype auto --enable-chunked-prefill --no-enable-prefix-caching
    --enable-lora --max-loras A --max-cpu-loras C --max-lora-rank R --lora-modules name=dir/id ...

  Files ``servers/gpu-<i>.sh`` / ``.json``.
- ``vllm-0.33`` (alias ``vllm-current``): the same server for the current vLLM line (0.33.0):
  no ``VLLM_USE_V1`` (V1 is vLLM's only engine there), ``--lora-modules`` in its JSON form
  ``{"name": .., "path": .., "base_model_name": <model id>}``; the other flags keep their names
  (``--max-cpu-loras``, ``--enable-chunked-prefill``, ``--no-enable-prefix-caching``; flags the
  plan does not use were removed since 0.8.5: ``--enable-lora-bias``,
  ``--long-lora-scaling-factors``, ``--lora-extra-vocab-size``). Every such command says that the
  twin's figures hold for the measured release. Files ``servers/vllm-0.33.0/gpu-<i>.sh`` /
  ``.json`` (a release other than the measured one always goes under ``servers/vllm-<v>/``).
  Flag lists of both releases: ``tests/data/vllm_args/<version>.txt``.
- ``gie-v1``: Gateway API Inference Extension v1 — ``gateway/inferencepool.json``
  (``InferencePool`` ``inference.networking.k8s.io/v1``, release v1.6.0: ``selector.matchLabels``,
  ``targetPorts`` — the plan's ports, at most 8 —, ``endpointPickerRef``),
  ``gateway/inferenceobjectives.json`` (one ``InferenceObjective``
  ``inference.networking.x-k8s.io/v1alpha2`` per adapter, priority 0, named after it; the
  per-model object since ``InferenceModel`` was dropped, chosen by a request's
  ``x-gateway-inference-objective`` header; its CRD left GIE in v1.6.0 for the llm-d inference
  scheduler)
  and ``gateway/inferencemodelrewrites.json`` (one ``InferenceModelRewrite`` per split adapter:
  requests for ``<id>`` go to its homes' served names with their weights; not written when no
  adapter is split).
- ``gie-v1alpha2``: the earlier API (releases v0.3-v0.5): ``gateway-v1alpha2/inferencepool.json``
  and ``gateway-v1alpha2/inferencemodels.json`` (``InferenceModel`` with ``targetModels``).
- ``aibrix``: ``aibrix/modeladapters.json``, AIBrix ``ModelAdapter`` (``model.aibrix.ai/v1alpha1``,
  unchanged to v0.7.0), one per adapter home, ``replicas: 1`` (the CRD accepts only 1 or unset),
  pod selector on the home's server label.
- ``kserve``: ``kserve/llminferenceservices.json``, one KServe ``LLMInferenceService``
  (``serving.kserve.io/v1alpha2``, v0.20.0) per GPU: ``model.lora`` lists the GPU's adapters
  (served name, ``<adapter-dir>/<id>``) with ``maxAdapters`` / ``maxCpuAdapters`` / ``maxRank``,
  and the calibrated settings go to the ``main`` container's ``VLLM_ADDITIONAL_ARGS`` (KServe runs
  the current vLLM line).
- ``llm-d``: ``llm-d/epp-config.json``, a ``ConfigMap`` holding the llm-d endpoint picker's
  ``EndpointPickerConfig`` (``llm-d.ai/v1alpha1``) with the ``lora-affinity-scorer`` (prefers a
  server whose running adapters include the requested one), queue and KV-cache scorers; no
  prefix-cache scorer (the servers run with prefix caching off).

Served names. An adapter with one home is served under its id. An adapter split over several
GPUs is served on home ``g`` under ``<id>--gpu<g>``, one name per home, so a gateway can split
its traffic by weight over the homes; each name takes one LoRA slot on its own server only, as
in the twin. ``routing.json`` / ``routing.csv`` (always written): adapter -> homes (GPU,
server, host, port, served name, share, integer weight); ``deployment.json``: summary (plan,
verdict, model ids and their source, measured release, targets and their releases, layout,
files). Every file records the twin's verdict.

Manifests are JSON documents (valid YAML; ``kubectl apply -f`` reads ``v1`` ``List`` objects),
so no YAML library is needed. The servers' pods must carry the labels listed in each
``servers/gpu-<i>.json`` (``pod_labels``) for the selectors to match. A file that cannot be
written (read-only directory, full disk) is named in the error, and the files this call had
created are removed.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from .placement import GpuPlan, Placement
from .served_model import VLLM_VERSION, DeployError, ServedModel, served_model

VLLM_CURRENT = "0.33.0"         # the current vLLM release line (0.33) when this was written
DEFAULT_BASE_PORT = 8000
DEFAULT_GPUS_PER_HOST = 8
DEFAULT_NAMESPACE = "default"
EPP_PORT = 9002
LABEL_SERVER = "lora-placement/server"
LABEL_POOL = "lora-placement/pool"
ANNOTATION_VERDICT = "lora-placement/twin-verdict"
WEIGHT_SCALE = 1000        # integer routing weight = share x this (GIE: weight in 1..1e6)
SHARE_TOL = 1e-6           # optim.placement.shares_consistent's tolerance
AIBRIX_API = "model.aibrix.ai/v1alpha1"
GIE_API = "inference.networking.x-k8s.io/v1alpha2"      # v1alpha2 pool/model, v0.3-v0.5
GIE_V1_API = "inference.networking.k8s.io/v1"           # InferencePool of GIE v1
GIE_V1_GROUP = "inference.networking.k8s.io"
GIE_X_API = "inference.networking.x-k8s.io/v1alpha2"    # InferenceObjective / ModelRewrite
GIE_V1_MAX_PORTS = 8                                    # InferencePool.spec.targetPorts maxItems
KSERVE_API = "serving.kserve.io/v1alpha2"
LLMD_API = "llm-d.ai/v1alpha1"


# ----------------------------------------------------------------------------- releases
@dataclass(frozen=True)
class VllmRelease:
    """What a vLLM release needs in a command: whether ``VLLM_USE_V1`` selects the engine,
    whether ``--lora-modules`` takes the JSON form with ``base_model_name``, and the ranks its
    ``LoRAConfig`` accepts for ``--max-lora-rank``."""

    version: str
    engine_env: bool
    lora_modules_json: bool
    ranks: tuple[int, ...]
    changes: tuple[str, ...] = ()


VLLM_RELEASES = {
    "0.8.5": VllmRelease("0.8.5", True, False, (8, 16, 32, 64, 128, 256, 320, 512)),
    "0.33.0": VllmRelease("0.33.0", False, True, (1, 8, 16, 32, 64, 128, 256, 320, 512), (
        "VLLM_USE_V1 is gone: V1 is vLLM's only engine",
        "--lora-modules in its JSON form with base_model_name",
        "--enable-lora-bias, --long-lora-scaling-factors, --lora-extra-vocab-size were removed "
        "(not used here)",
        "--max-cpu-loras, --max-loras, --max-lora-rank, --enable-chunked-prefill and "
        "--no-enable-prefix-caching keep their names; chunked prefill and prefix caching are "
        "on by default (both written explicitly), and turning chunked prefill off is no longer "
        "officially supported for generative models")),
}
# ranks every release above accepts: a plan is checked against these
VLLM_RANKS = tuple(sorted(set.intersection(*(set(r.ranks) for r in VLLM_RELEASES.values()))))


@dataclass(frozen=True)
class Target:
    """One ``--target``: what it writes and for which release (with the source it was read
    from)."""

    name: str
    kind: str
    release: str
    api_versions: tuple[str, ...]
    source: str
    help: str


TARGETS: dict[str, Target] = {t.name: t for t in (
    Target("vllm-0.8.5", "vllm", "vLLM 0.8.5", (), "vLLM 0.8.5 wheel: vllm/engine/arg_utils.py, "
           "vllm/entrypoints/openai/cli_args.py",
           "vLLM 0.8.5 commands (the release the shipped profiles were measured on)"),
    Target("vllm-0.33", "vllm", "vLLM 0.33.0", (), "vLLM 0.33.0 wheel: vllm/engine/arg_utils.py, "
           "vllm/config/lora.py, vllm/entrypoints/common/cli_args.py",
           "vLLM 0.33 commands (current line; the twin's figures hold for the measured one)"),
    Target("gie-v1", "gateway", "Gateway API Inference Extension v1 (v1.6.0)",
           (GIE_V1_API, GIE_X_API),
           "gateway-api-inference-extension v1.6.0 config/crd/bases (InferencePool v1); "
           "v1.5.0 and llm-d-inference-scheduler (InferenceObjective, InferenceModelRewrite)",
           "InferencePool v1 + InferenceObjective + InferenceModelRewrite"),
    Target("gie-v1alpha2", "gateway", "Gateway API Inference Extension v0.3-v0.5", (GIE_API,),
           "gateway-api-inference-extension v0.5.1 config/crd/bases",
           "InferencePool + InferenceModel v1alpha2 (GIE v0.3-v0.5)"),
    Target("aibrix", "aibrix", "AIBrix v0.7.0", (AIBRIX_API,),
           "aibrix v0.7.0 config/crd/model/model.aibrix.ai_modeladapters.yaml",
           "AIBrix ModelAdapter v1alpha1"),
    Target("kserve", "kserve", "KServe v0.20.0", (KSERVE_API,),
           "kserve v0.20.0 config/crd/full/llmisvc/serving.kserve.io_llminferenceservices.yaml",
           "KServe LLMInferenceService v1alpha2, one per GPU"),
    Target("llm-d", "llm-d", "llm-d inference scheduler (EndpointPickerConfig llm-d.ai/v1alpha1)",
           (LLMD_API,), "llm-d-inference-scheduler apix/config/v1alpha1, "
           "pkg/epp/framework/plugins/scheduling/scorer/loraaffinity",
           "llm-d endpoint picker config with LoRA affinity (ConfigMap)"),
)}
TARGET_ALIASES = {"vllm-measured": None,          # resolved per plan: the profiles' release
                  "vllm-current": "vllm-0.33"}
DEFAULT_TARGETS = ("vllm-measured", "gie-v1", "aibrix", "kserve", "llm-d")


def target_help() -> str:
    """One line per target name (for ``--help``)."""
    lines = [f"vllm-measured: the vLLM release the plan's profiles were measured on "
             f"(vllm-{VLLM_VERSION} for the shipped ones)",
             *(f"{t.name}: {t.help}" for t in TARGETS.values()),
             "vllm-current: same as vllm-0.33"]
    return "; ".join(lines)


def resolve_targets(names: Sequence[str], measured: str | None = None) -> tuple[str, ...]:
    """Canonical target names of ``names`` (aliases resolved, duplicates dropped, order kept);
    ``measured`` is the vLLM version ``vllm-measured`` stands for (None: not resolved)."""
    out: list[str] = []
    if not names:
        raise DeployError("--target: no target given")
    for n in names:
        n = str(n).strip()
        if n in TARGET_ALIASES:
            if n == "vllm-measured":
                if measured is None:
                    canon = n
                else:
                    canon = vllm_target_name(measured)
            else:
                canon = TARGET_ALIASES[n]
        elif n in TARGETS:
            canon = n
        else:
            known = ", ".join([*TARGETS, *TARGET_ALIASES])
            raise DeployError(f"--target: unknown target {n!r} (known: {known})")
        if canon not in out:
            out.append(canon)
    return tuple(out)


def vllm_target_name(version: str) -> str:
    for t in TARGETS.values():
        if t.kind == "vllm" and VLLM_RELEASES[_target_version(t.name)].version == version:
            return t.name
    raise DeployError(f"vLLM {version}: no commands are written for that release (known: "
                      f"{', '.join(VLLM_RELEASES)}); choose --target "
                      f"{' or '.join(t for t in TARGETS if t.startswith('vllm-'))}")


def _target_version(name: str) -> str:
    v = name.removeprefix("vllm-")
    return next(k for k in VLLM_RELEASES if k == v or k.rsplit(".", 1)[0] == v)


def max_cpu_loras(g: GpuPlan, given: int | None = None) -> int:
    """``--max-cpu-loras`` of one GPU: the plan's value when it gives one, else every adapter of
    the GPU (and at least ``max_loras``, vLLM's rule)."""
    return int(given) if given is not None else max(g.n_adapters, g.max_loras)


def lora_flags(g: GpuPlan, names: Sequence[str], adapter_dir: str,
               release: str = VLLM_VERSION, base_model: str | None = None,
               cpu_loras: int | None = None) -> list[str]:
    """``--enable-lora ... --lora-modules ...`` of one GPU for vLLM ``release``: ``name=dir/id``
    items for 0.8.5, JSON items ``{"name", "path", "base_model_name"}`` for the current line."""
    rel = VLLM_RELEASES[release]
    if rel.lora_modules_json:
        mods = [json.dumps({"name": n, "path": f"{adapter_dir}/{a.id}",
                            **({"base_model_name": base_model} if base_model else {})},
                           separators=(",", ":"))
                for n, (a, _) in zip(names, g.adapters)]
    else:
        mods = [f"{n}={adapter_dir}/{a.id}" for n, (a, _) in zip(names, g.adapters)]
    return ["--enable-lora", "--max-loras", str(g.max_loras),
            "--max-cpu-loras", str(max_cpu_loras(g, cpu_loras)),
            "--max-lora-rank", str(g.max_lora_rank), "--lora-modules", *mods]


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


# ----------------------------------------------------------------------------- plan checks
def _int_like(v: Any) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v) \
        and float(v).is_integer()


def check_plan(p: Placement, source: str = "plan",
               cpu_loras: Sequence[int | None] | None = None) -> None:
    """Refuse a plan vLLM or the router cannot run, as the solver's own output is checked:
    GPU count >= 1; per GPU ``max_loras`` >= 1, ``max_lora_rank`` among the ranks vLLM
    accepts, adapters present, each once, with a rank <= ``max_lora_rank`` and a share in
    (0, 1], ``max_cpu_loras`` (when given) >= the GPU's adapters and >= ``max_loras``; per
    adapter, shares summing to 1. Messages: ``<source>: gpu <i>: <field> <value>: <reason>``."""
    if not p.gpus:
        raise DeployError(f"{source}: no GPUs to deploy (status {p.status}); a plan needs at "
                          "least one GPU")
    if cpu_loras is None:
        cpu_loras = _plan_cpu_loras(p)
    totals: dict[str, list[tuple[int, float]]] = {}
    for i, g in enumerate(p.gpus):
        at = f"{source}: gpu {i}"
        if not _int_like(g.max_loras) or g.max_loras < 1:
            raise DeployError(f"{at}: max_loras {g.max_loras}: must be an integer of at least 1 "
                              "(vLLM's --max-loras, the adapters one batch may hold)")
        if g.max_lora_rank not in VLLM_RANKS:
            raise DeployError(f"{at}: max_lora_rank {g.max_lora_rank}: not a rank vLLM accepts "
                              f"for --max-lora-rank {VLLM_RANKS}")
        if not g.adapters:
            raise DeployError(f"{at}: adapters: empty; a server needs at least one adapter")
        seen: set[str] = set()
        for a, s in g.adapters:
            if a.id in seen:
                raise DeployError(f"{at}: adapter '{a.id}': listed twice on this GPU")
            seen.add(a.id)
            if a.rank > g.max_lora_rank:
                raise DeployError(f"{at}: adapter '{a.id}' rank {a.rank}: above the GPU's "
                                  f"max_lora_rank {g.max_lora_rank} (vLLM cannot load it)")
            if not (isinstance(s, (int, float)) and 0 < s <= 1 + SHARE_TOL):
                raise DeployError(f"{at}: adapter '{a.id}' share {s}: must be in (0, 1]")
            totals.setdefault(a.id, []).append((i, float(s)))
        given = cpu_loras[i] if i < len(cpu_loras) else None
        if given is not None:
            if not _int_like(given) or given < g.n_adapters:
                raise DeployError(f"{at}: max_cpu_loras {given}: below the {g.n_adapters} "
                                  "adapter(s) served on this GPU (vLLM keeps each in CPU memory)")
            if given < g.max_loras:
                raise DeployError(f"{at}: max_cpu_loras {given}: below max_loras {g.max_loras} "
                                  "(vLLM requires max_cpu_loras >= max_loras)")
    for aid in sorted(totals):
        homes = totals[aid]
        total = sum(s for _, s in homes)
        if abs(total - 1.0) > SHARE_TOL:
            where = ", ".join(f"gpu {i}: {s:g}" for i, s in homes)
            raise DeployError(f"{source}: adapter '{aid}': shares sum to {total:.6g} over "
                              f"{len(homes)} home(s) ({where}); they must sum to 1")


def _plan_cpu_loras(p: Placement) -> list[int | None]:
    """``max_cpu_loras`` per GPU when the plan file gave it (``load_plan`` keeps it in
    ``params['max_cpu_loras']``), else None per GPU."""
    given = p.params.get("max_cpu_loras") if isinstance(p.params, dict) else None
    if isinstance(given, list) and len(given) == len(p.gpus):
        return list(given)
    return [None] * len(p.gpus)


# ----------------------------------------------------------------------------- routing
def routing_table(p: Placement, layout: Layout = Layout()) -> list[dict[str, Any]]:
    """Adapter -> homes: GPU, server, host, port, served name, share (normalised to sum to 1;
    ``check_plan`` refuses shares that do not) and integer weight (``WEIGHT_SCALE`` x share,
    at least 1); adapters sorted by id."""
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


def _unique(name: str, seen: set[str], adapter: str) -> str:
    if name in seen:
        raise DeployError(f"adapter '{adapter}': Kubernetes name {name!r} is already used by "
                          "another adapter")
    seen.add(name)
    return name


# ----------------------------------------------------------------------------- manifests
def aibrix_manifests(table: Sequence[dict[str, Any]], base_model: str, pool: str,
                     namespace: str, adapter_dir: str, verdict: str) -> dict[str, Any]:
    """AIBrix ``ModelAdapter`` objects: one per adapter home, named after its served name,
    ``replicas: 1``, pod selector = the home's server label within the plan's pool."""
    items: list[dict[str, Any]] = []
    seen: set[str] = set()
    for r in table:
        for h in r["homes"]:
            name = _unique(k8s_name(h["served_name"]), seen, r["adapter"])
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
    """Gateway API Inference Extension v1alpha2 (v0.3-v0.5, target ``gie-v1alpha2``): the
    ``InferencePool`` of the plan's servers and one ``InferenceModel`` per adapter with its
    homes' served names and weights."""
    pool_obj = {"apiVersion": GIE_API, "kind": "InferencePool",
                "metadata": _meta(pool, namespace, verdict, {LABEL_POOL: pool}),
                "spec": {"selector": {LABEL_POOL: pool}, "targetPortNumber": int(port),
                         "extensionRef": {"name": k8s_name(f"{pool}-epp", 253),
                                          "portNumber": EPP_PORT, "failureMode": "FailClose"}}}
    models: list[dict[str, Any]] = []
    seen: set[str] = set()
    for r in table:
        name = _unique(k8s_name(r["adapter"]), seen, r["adapter"])
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


def gateway_v1_manifests(table: Sequence[dict[str, Any]], pool: str, namespace: str,
                         ports: Sequence[int], verdict: str
                         ) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Gateway API Inference Extension v1 (target ``gie-v1``): the ``InferencePool``
    (``inference.networking.k8s.io/v1``) of the plan's servers on their ``ports``, one
    ``InferenceObjective`` per adapter (priority 0), and one ``InferenceModelRewrite`` per
    split adapter sending its id to its homes' served names by weight."""
    ports = sorted(set(int(x) for x in ports))
    if len(ports) > GIE_V1_MAX_PORTS:
        raise DeployError(f"--gpus-per-host: the servers listen on {len(ports)} ports; a GIE v1 "
                          f"InferencePool lists at most {GIE_V1_MAX_PORTS} targetPorts (use at "
                          f"most {GIE_V1_MAX_PORTS} GPUs per host, or drop --target gie-v1)")
    pool_ref = {"group": GIE_V1_GROUP, "kind": "InferencePool", "name": pool}
    pool_obj = {"apiVersion": GIE_V1_API, "kind": "InferencePool",
                "metadata": _meta(pool, namespace, verdict, {LABEL_POOL: pool}),
                "spec": {"selector": {"matchLabels": {LABEL_POOL: pool}},
                         "targetPorts": [{"number": x} for x in ports],
                         "endpointPickerRef": {"name": k8s_name(f"{pool}-epp", 253),
                                               "port": {"number": EPP_PORT},
                                               "failureMode": "FailClose"}}}
    objectives: list[dict[str, Any]] = []
    rewrites: list[dict[str, Any]] = []
    seen_o: set[str] = set()
    seen_r: set[str] = set()
    for r in table:
        objectives.append({
            "apiVersion": GIE_X_API, "kind": "InferenceObjective",
            "metadata": _meta(_unique(k8s_name(r["adapter"]), seen_o, r["adapter"]), namespace,
                              verdict, {LABEL_POOL: pool},
                              {"lora-placement/adapter": r["adapter"]}),
            "spec": {"poolRef": dict(pool_ref), "priority": 0}})
        if len(r["homes"]) > 1:
            rewrites.append({
                "apiVersion": GIE_X_API, "kind": "InferenceModelRewrite",
                "metadata": _meta(_unique(k8s_name(r["adapter"]), seen_r, r["adapter"]),
                                  namespace, verdict, {LABEL_POOL: pool},
                                  {"lora-placement/adapter": r["adapter"]}),
                "spec": {"poolRef": dict(pool_ref),
                         "rules": [{"matches": [{"model": {"type": "Exact",
                                                           "value": r["adapter"]}}],
                                    "targets": [{"modelRewrite": h["served_name"],
                                                 "weight": h["weight"]} for h in r["homes"]]}]}})
    return pool_obj, _k8s_list(objectives), _k8s_list(rewrites)


def _model_uri(model_id: str) -> str:
    return model_id if "://" in model_id else f"hf://{model_id}"


def kserve_manifests(p: Placement, names: Sequence[Sequence[str]], model_id: str,
                     flags: Sequence[str], pool: str, namespace: str, adapter_dir: str,
                     verdict: str, cpu_loras: Sequence[int | None]) -> dict[str, Any]:
    """KServe ``LLMInferenceService`` (``serving.kserve.io/v1alpha2``), one per GPU: the base
    model, the GPU's adapters in ``model.lora`` with its Amax / CPU slots / max rank, one
    replica whose pods carry the plan's labels, the calibrated settings in the ``main``
    container's ``VLLM_ADDITIONAL_ARGS``."""
    items: list[dict[str, Any]] = []
    for i, g in enumerate(p.gpus):
        for n in names[i]:
            if n in (".", ".."):
                raise DeployError(f"gpu {i}: adapter name {n!r}: KServe refuses '.' and '..'")
            if n == model_id:
                raise DeployError(f"gpu {i}: adapter name {n!r} equals the base model name; "
                                  "KServe requires them to differ")
        # the name becomes Service/Deployment names: a DNS label (no dots, <= 63)
        name = k8s_name(f"{pool}-{server_name(i)}".replace(".", "-"), 63)
        items.append({
            "apiVersion": KSERVE_API, "kind": "LLMInferenceService",
            "metadata": _meta(name, namespace, verdict, {LABEL_POOL: pool,
                                                         LABEL_SERVER: server_name(i)},
                              {"lora-placement/gpu": str(i)}),
            "spec": {"model": {"uri": _model_uri(model_id), "name": model_id,
                               "lora": {"adapters": [{"name": n, "uri": f"{adapter_dir}/{a.id}"}
                                                     for n, (a, _) in zip(names[i], g.adapters)],
                                        "maxAdapters": g.max_loras,
                                        "maxCpuAdapters": max_cpu_loras(g, cpu_loras[i]),
                                        "maxRank": g.max_lora_rank}},
                     "replicas": 1,
                     "labels": {LABEL_POOL: pool, LABEL_SERVER: server_name(i)},
                     "template": {"containers": [{"name": "main", "env": [
                         {"name": "VLLM_ADDITIONAL_ARGS", "value": " ".join(flags)}]}]}}})
    return _k8s_list(items)


LLMD_SCORER_WEIGHTS = (("queue-scorer", 2.0), ("kv-cache-utilization-scorer", 2.0),
                       ("lora-affinity-scorer", 5.0))


def llmd_config(pool: str, namespace: str, verdict: str) -> dict[str, Any]:
    """A ``ConfigMap`` holding the llm-d endpoint picker's ``EndpointPickerConfig``
    (``llm-d.ai/v1alpha1``): queue and KV-cache scorers at llm-d's default weights (2, 2), the
    ``lora-affinity-scorer`` at 5 (a server already running the requested adapter scores 1.0, one
    with a free slot 0.8), a max-score picker and the single-profile handler; no prefix-cache
    scorer, since the servers run with prefix caching off."""
    cfg = {"apiVersion": LLMD_API, "kind": "EndpointPickerConfig",
           "plugins": [*({"type": t} for t, _ in LLMD_SCORER_WEIGHTS),
                       {"type": "max-score-picker"}, {"type": "single-profile-handler"}],
           "schedulingProfiles": [{"name": "default", "plugins": [
               *({"pluginRef": t, "weight": w} for t, w in LLMD_SCORER_WEIGHTS),
               {"pluginRef": "max-score-picker"}]}]}
    note = ("mount data['epp-config.yaml'] as the endpoint picker's --config-file; "
            "lora-affinity-scorer is a preference, not a filter: the endpoint picker may send a "
            "served name to a server of the pool that does not hold it (vLLM answers 404 unless "
            "runtime LoRA loading is on); the plan's homes are exact only where a served name "
            "is loaded on its home alone, as the twin assumes")
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": _meta(k8s_name(f"{pool}-epp-config", 253), namespace, verdict,
                              {LABEL_POOL: pool}, {"lora-placement/note": note}),
            "data": {"epp-config.yaml": json.dumps(cfg, indent=1) + "\n"}}


# ----------------------------------------------------------------------------- files
@dataclass(frozen=True)
class DeployOptions:
    """What ``write_deployment`` needs beside the plan; ``targets`` are names of ``TARGETS`` or
    ``TARGET_ALIASES`` (default ``DEFAULT_TARGETS``: the measured vLLM release and every current
    control plane)."""

    adapter_dir: str = "adapters"
    namespace: str = DEFAULT_NAMESPACE
    model_id: str | None = None
    layout: Layout = Layout()
    allow_rejected: bool = False
    targets: tuple[str, ...] = DEFAULT_TARGETS
    # twin.headroom: flag in deployment.json the GPUs that pass only without the twin's measured
    # headroom (``--no-headroom``: False, the plain verdict only)
    headroom: bool = True


def plan_verdict(p: Placement) -> str:
    return p.verdict or "unverified"


# --- twin.headroom ------------------------------------------------------------------------------
def headroom_summary(p: Placement, applied: bool = True) -> dict[str, Any]:
    """``deployment.json``'s ``twin_headroom``: per verified GPU the headroom of its regime and
    whether it passes with it (throughput / (1 + h) >= threshold x realised offered);
    ``at_risk_gpus``: GPUs the plain verdict accepts that fail with the headroom."""
    rep = p.headroom_report() if applied else None
    if rep is None:
        return {"applied": False}
    gpus = [{"gpu": i, "headroom": hr.h, "regime": hr.regime.describe() if hr.regime else None,
             "table_level": hr.key, "max_search_runs": hr.runs,
             "accepted_with_headroom": ok, "text": hr.describe()} for i, ok, hr in rep]
    return {"applied": True,
            "rule": "throughput / (1 + headroom) >= starvation threshold x realised offered load",
            "source": "twin/profiles/headroom.json (python -m twin.headroom_fit --fit)",
            "at_risk_gpus": [i for i, ok, _ in rep if p.gpus[i].verified.ok and not ok],
            "gpus": gpus}


def check_deployable(p: Placement, allow_rejected: bool) -> None:
    """Refuse a plan without GPUs, or one the twin rejected unless ``allow_rejected``."""
    if not p.gpus:
        raise DeployError(f"plan: no GPUs to deploy (status {p.status})")
    if p.verdict == "rejected" and not allow_rejected:
        bad = [i for i, g in enumerate(p.gpus) if g.verified and not g.verified.ok]
        raise DeployError(f"plan: the twin rejected this placement (GPUs {bad[:10]} starve or "
                          "cannot start); pass --allow-rejected to write it anyway (every file "
                          "then records twin_verdict=rejected)")


def _server_files(p: Placement, i: int, g: GpuPlan, sm: ServedModel, release: str,
                  measured: str, names: Sequence[str], opts: DeployOptions, pool: str,
                  verdict: str, cpu: int | None) -> tuple[dict[str, Any], str]:
    """The JSON record and shell script of GPU ``i``'s server for vLLM ``release``."""
    rel = VLLM_RELEASES[release]
    layout = opts.layout
    if not rel.engine_env and sm.engine != "v1":
        raise DeployError(f"profile {sm.profile!r}: engine {sm.engine!r}; vLLM {release} has "
                          "only the V1 engine")
    env = {"CUDA_VISIBLE_DEVICES": str(layout.device(i)),
           **(dict(sm.env) if rel.engine_env else {})}
    args = ["--port", str(layout.port(i)), *sm.flags,
            *lora_flags(g, names, opts.adapter_dir, release, sm.model_id, cpu)]
    argv = ["vllm", "serve", sm.model_id, *args]
    command = " ".join([*(f"{k}={shlex.quote(v)}" for k, v in env.items()),
                        *map(shlex.quote, argv)])
    if release == measured:
        note = (f"vLLM {release}: the release the profile was measured on "
                f"({sm.vllm_version_source}); the twin's figures are for it")
    else:
        note = (f"vLLM {release} was not measured: the twin's figures (capacity, verdict) hold "
                f"for vLLM {measured}, on which the profile was measured")
    rec = {"gpu": i, "server": server_name(i), "host": layout.host(i),
           "port": layout.port(i), "gpu_type": g.gpu_type, "profile": g.profile,
           "model_id": sm.model_id, "model_id_source": sm.model_id_source,
           "settings_source": sm.settings_source, "vllm_version": release,
           "measured_vllm_version": measured, "note": note,
           **({"changes_since_measured": list(rel.changes)} if release != measured else {}),
           "env": env, "argv": argv, "command": command,
           "pod_labels": {LABEL_POOL: pool, LABEL_SERVER: server_name(i)},
           "adapters": [{"id": a.id, "served_name": n, "share": s}
                        for (a, s), n in zip(g.adapters, names)],
           "twin_verdict": verdict}
    sh = ("#!/bin/sh\n"
          f"# {server_name(i)} of plan {p.instance!r} ({p.method}); twin_verdict={verdict}\n"
          f"# note: {note}\n"
          f"# model id: {sm.model_id} ({sm.model_id_source}); settings: {sm.settings_source}\n"
          f"exec env {command}\n")
    return rec, sh


def _server_dir(release: str, measured: str) -> str:
    return "servers" if release == measured else f"servers/vllm-{release}"


def deployment_files(p: Placement, opts: DeployOptions = DeployOptions()) -> dict[str, str]:
    """Relative path -> text of every file of the deployment (module docstring); the plan
    and options are checked first (``check_plan``, ``check_deployable``)."""
    check_plan(p)
    check_deployable(p, opts.allow_rejected)
    resolve_targets(opts.targets)                      # unknown names refused first
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
    measured_set = sorted({m.vllm_version for m in models.values()})
    if len(measured_set) > 1:
        raise DeployError(f"plan: its profiles were measured on different vLLM releases "
                          f"{measured_set}; deploy one release with --target vllm-<version>")
    measured = measured_set[0]
    targets = resolve_targets(opts.targets, measured)
    pool = label_value(k8s_name(f"{p.instance}-pool", 63))
    layout = opts.layout
    names = served_names(p)
    cpu = _plan_cpu_loras(p)
    files: dict[str, str] = {}
    written_by: list[dict[str, Any]] = []
    servers = [{"gpu": i, "server": server_name(i), "host": layout.host(i),
                "port": layout.port(i), "profile": g.profile} for i, g in enumerate(p.gpus)]
    table = routing_table(p, layout)
    for t in targets:
        tgt = TARGETS[t]
        before = set(files)
        if tgt.kind == "vllm":
            release = _target_version(t)
            d = _server_dir(release, measured)
            for i, g in enumerate(p.gpus):
                rec, sh = _server_files(p, i, g, models[g.profile], release, measured, names[i],
                                        opts, pool, verdict, cpu[i])
                files[f"{d}/{server_name(i)}.json"] = json.dumps(rec, indent=1)
                files[f"{d}/{server_name(i)}.sh"] = sh
            release_text = f"vLLM {release}" + (" (measured)" if release == measured else
                                                f" (not measured; figures hold for {measured})")
        elif t == "gie-v1":
            pool_obj, objectives, rewrites = gateway_v1_manifests(
                table, pool, ns, [layout.port(i) for i in range(len(p.gpus))], verdict)
            files["gateway/inferencepool.json"] = json.dumps(pool_obj, indent=1)
            files["gateway/inferenceobjectives.json"] = json.dumps(objectives, indent=1)
            if rewrites["items"]:                 # no split adapter: nothing to rewrite
                files["gateway/inferencemodelrewrites.json"] = json.dumps(rewrites, indent=1)
            release_text = tgt.release
        elif t == "gie-v1alpha2":
            pool_obj, model_list = gateway_manifests(table, pool, ns, layout.base_port, verdict)
            files["gateway-v1alpha2/inferencepool.json"] = json.dumps(pool_obj, indent=1)
            files["gateway-v1alpha2/inferencemodels.json"] = json.dumps(model_list, indent=1)
            release_text = tgt.release
        elif t == "aibrix":
            files["aibrix/modeladapters.json"] = json.dumps(
                aibrix_manifests(table, base_ids[0], pool, ns, opts.adapter_dir, verdict),
                indent=1)
            release_text = tgt.release
        elif t == "kserve":
            sm0 = models[p.gpus[0].profile]
            files["kserve/llminferenceservices.json"] = json.dumps(
                kserve_manifests(p, names, base_ids[0], sm0.flags, pool, ns, opts.adapter_dir,
                                 verdict, cpu), indent=1)
            release_text = (f"{tgt.release} (runs the current vLLM line; settings checked "
                            f"against vLLM {VLLM_CURRENT})")
        else:                                               # llm-d
            files["llm-d/epp-config.json"] = json.dumps(llmd_config(pool, ns, verdict), indent=1)
            release_text = tgt.release
        written_by.append({"target": t, "release": release_text,
                           "api_versions": list(tgt.api_versions), "source": tgt.source,
                           "files": sorted(set(files) - before)})
    files["routing.json"] = json.dumps({"instance": p.instance, "twin_verdict": verdict,
                                        "weight_scale": WEIGHT_SCALE, "adapters": table},
                                       indent=1)
    files["routing.csv"] = routing_csv(table, verdict)
    summary = {"instance": p.instance, "method": p.method, "status": p.status,
               "twin_verdict": verdict, "twin_failed_gpus": failed,
               "twin_headroom": headroom_summary(p, opts.headroom),
               "vllm_version": measured, "measured_vllm_version": measured,
               "targets": written_by, "namespace": ns, "pool": pool,
               "adapter_dir": opts.adapter_dir,
               "models": {k: {"model_id": m.model_id, "model_id_source": m.model_id_source,
                              "settings_source": m.settings_source, "flags": list(m.flags),
                              "env": dict(m.env), "vllm_version": m.vllm_version,
                              "vllm_version_source": m.vllm_version_source}
                          for k, m in models.items()},
               "layout": {"base_port": layout.base_port, "gpus_per_host": layout.gpus_per_host},
               "servers": servers, "n_adapters": len(table),
               "manifests": "JSON documents (valid YAML); Kubernetes objects as v1 List"}
    summary["files"] = sorted([*files, "deployment.json"])
    files["deployment.json"] = json.dumps(summary, indent=1)
    return files


# files a deployment may hold: what --force may remove when a new deployment lacks them
_GENERATED = re.compile(r"(servers(/vllm-[0-9][0-9a-z.]*)?/gpu-\d+\.(sh|json)"
                        r"|gateway(-v1alpha2)?/[a-z]+\.json|aibrix/[a-z]+\.json"
                        r"|kserve/[a-z]+\.json|llm-d/[a-z-]+\.json)")


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


def _os_reason(e: OSError) -> str:
    if e.errno is not None:
        return os.strerror(e.errno).lower()
    return str(e) or type(e).__name__


def write_deployment(p: Placement, out: str | Path, opts: DeployOptions = DeployOptions(),
                     force: bool = False) -> list[Path]:
    """Write the deployment files of ``p`` under ``out`` (plan and directory checked first);
    returns their paths. With ``force``, files of an earlier deployment in ``out`` that this one
    does not have (servers of a larger plan, targets not asked for now) are removed. A file that
    cannot be written raises ``DeployError`` naming it (``--out <path>: cannot write: <reason>``)
    after the files this call created are removed."""
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
        stale = [out / f for f in prev if isinstance(f, str) and f not in files
                 and _GENERATED.fullmatch(f)]
    written: list[Path] = []
    created: list[Path] = []
    made_dirs: list[Path] = []
    path = out
    try:
        for rel, text in files.items():
            path = out / rel
            for d in reversed([path.parent, *path.parent.parents]):
                if not d.exists():
                    path = d
                    d.mkdir()
                    made_dirs.append(d)
            path = out / rel
            existed = path.exists()
            path.write_text(text if text.endswith("\n") else text + "\n", encoding="utf-8")
            if not existed:
                created.append(path)
            if rel.endswith(".sh"):
                path.chmod(0o755)
            written.append(path)
        for s in stale:
            path = s
            if s.is_file():
                s.unlink()
    except OSError as e:
        for c in created:
            try:
                c.unlink()
            except OSError:
                pass
        for d in reversed(made_dirs):
            try:
                d.rmdir()
            except OSError:
                pass
        raise DeployError(f"--out {path}: cannot write: {_os_reason(e)}") from None
    return written


def load_plan(path: str | Path) -> Placement:
    """A plan written by ``optim solve --json``; errors name the file and the field. An
    optional ``gpus[i].max_cpu_loras`` is kept in ``params['max_cpu_loras']`` (checked by
    ``check_plan``)."""
    p = Path(path)
    if not p.exists():
        raise DeployError(f"plan {p}: does not exist")
    if p.is_dir():
        raise DeployError(f"plan {p}: is a directory; give the JSON of `optim solve --json`")
    try:
        d = json.loads(p.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DeployError(f"plan {p}: not a JSON plan ({e})") from None
    except OSError as e:
        raise DeployError(f"plan {p}: cannot read: {_os_reason(e)}") from None
    if not isinstance(d, dict):
        raise DeployError(f"plan {p}: must be a JSON object (the output of `optim solve --json`)")
    for k in ("instance", "method", "status", "gpus", "wall_time_s", "objective"):
        if k not in d:
            raise DeployError(f"plan {p}: field '{k}' missing (is it `optim solve --json` output?)")
    if not isinstance(d["gpus"], list):
        raise DeployError(f"plan {p}: field 'gpus' must be a list")
    cpu: list[int | None] = []
    for i, g in enumerate(d["gpus"]):
        if not isinstance(g, dict):
            raise DeployError(f"plan {p}: field 'gpus[{i}]' must be an object")
        for k in ("gpu_type", "profile", "max_loras", "max_lora_rank", "adapters", "offered_tps"):
            if k not in g:
                raise DeployError(f"plan {p}: field 'gpus[{i}].{k}' missing")
        for k in ("max_loras", "max_lora_rank"):
            if not _int_like(g[k]):
                raise DeployError(f"plan {p}: gpu {i}: {k} {g[k]!r}: must be an integer")
        c = g.get("max_cpu_loras")
        if c is not None and not _int_like(c):
            raise DeployError(f"plan {p}: gpu {i}: max_cpu_loras {c!r}: must be an integer")
        cpu.append(None if c is None else int(c))
        if not isinstance(g["adapters"], list) or not g["adapters"]:
            raise DeployError(f"plan {p}: field 'gpus[{i}].adapters' must be a non-empty list")
        for j, a in enumerate(g["adapters"]):
            if not isinstance(a, dict) or any(k not in a for k in ("id", "rank", "rate", "share")):
                raise DeployError(f"plan {p}: field 'gpus[{i}].adapters[{j}]' needs id, rank, "
                                  "rate and share")
            q = a["rate"]
            if (isinstance(q, bool) or not isinstance(q, (int, float)) or not math.isfinite(q)
                    or q <= 0):
                raise DeployError(f"plan {p}: field 'gpus[{i}].adapters[{j}].rate' must be a "
                                  f"finite number of requests/s > 0, got {q!r}")
            if not _int_like(a["rank"]) or int(a["rank"]) < 1:
                raise DeployError(f"plan {p}: field 'gpus[{i}].adapters[{j}].rank' must be an "
                                  f"integer >= 1, got {a['rank']!r}")
            s = a["share"]
            if isinstance(s, bool) or not isinstance(s, (int, float)) or not 0 < s <= 1:
                raise DeployError(f"plan {p}: field 'gpus[{i}].adapters[{j}].share' must be in "
                                  f"(0, 1], got {s!r}")
    try:
        plan = Placement.from_dict(d)
    except (KeyError, TypeError, ValueError) as e:
        raise DeployError(f"plan {p}: malformed ({type(e).__name__}: {e})") from None
    if any(c is not None for c in cpu):
        plan = plan.with_(params={**plan.params, "max_cpu_loras": cpu})
    return plan


__all__ = ["DeployError", "DeployOptions", "Layout", "ServedModel", "served_model", "lora_flags",
           "served_names", "routing_table", "aibrix_manifests", "gateway_manifests",
           "gateway_v1_manifests", "kserve_manifests", "llmd_config", "deployment_files",
           "write_deployment", "load_plan", "check_plan", "check_deployable", "plan_verdict",
           "k8s_name", "label_value", "TARGETS", "TARGET_ALIASES", "DEFAULT_TARGETS",
           "VLLM_RELEASES", "resolve_targets", "target_help"]
