"""Derived profiles: a ``GpuProfile`` for another GPU and/or base model from public facts only.

A measured profile (GPU S, model M) is rescaled to (GPU T, model N) with the catalog facts of S
and T (``twin.gpu_catalog``) and the configs of M and N (``twin.model_configs``):

KV capacity (vLLM 0.8.5 memory arithmetic, ``gpu_memory_utilization`` 0.9). vLLM gives the KV
cache what is left of 0.9 x the GPU memory after the weights, the LoRA slot buffers and the
peak memory of a profiling forward pass. All in integer bytes:

* budget = 0.9 x usable memory (torch's total capacity; see ``GpuSpec.usable_bytes``);
* weights = parameters x dtype bytes;
* backbone reserve (activations, sampler, non-torch memory) is *fitted on the source* so that
  its no-LoRA capacity is reproduced exactly: reserve_S = budget_S - weights_M - B_S x kv_M,
  with B_S the source's ``backbone_kv_tokens`` and kv_M the KV bytes per token. It is dominated
  by the profiling pass's logits (``max_num_batched_tokens`` x vocabulary), so the target's is
  reserve_S x vocab_N / vocab_M;
* LoRA memory of (max_loras A, max_lora_rank r) in the source = (B_S - KV_S(A, r)) x kv_M. Of
  it, A x slot_bytes_M(r) are the slot buffers (A/B of every adapted projection of every layer
  at rank r, plus vLLM's embedding/lm_head LoRA buffers where the architecture has them; see
  ``ModelConfig.lora_slot_bytes``); the rest is a LoRA workspace. Where the model has
  embedding/lm_head LoRA, vLLM's LoRA logits path holds two fp32 (tokens x vocab) buffers in the
  profiling pass, ws = 2 x max_num_batched_tokens x (vocab + 256) x 4 bytes; the remainder is
  kept as it is. Target LoRA memory = A x slot_bytes_N(r) + (rest_S(A, r) - ws_M + ws_N).
  Configurations the source could not start (above its largest A at a rank) are extrapolated
  with the slot bytes and the rest of the largest measured A;
* KV_T(A, r) = floor((budget_T - weights_N - reserve_N - lora_N(A, r)) / kv_N) rounded down to
  whole KV blocks; a configuration whose capacity is below the model's context length is left
  out (vLLM would not start it). Capacities are made non-increasing in A and in r.

Step time (``twin.step_time``; each coefficient scaled by the part of the hardware it models):

* per-token compute (c1 per_token, c6 per_token_kslot, c11 per_seq_over_knee): x FLOPs_S /
  FLOPs_T x (model FLOPs per token N / M; for c6 the LoRA elements per rank ratio);
* per-step weight read: the part weights_M / BW_S of c0 scales by (weights_N / weights_M) x
  (BW_S / BW_T); the rest of c0 is fixed CPU overhead, unchanged;
* KV read (c3 per_kctx): x (BW_S / BW_T) x (kv_N / kv_M);
* LoRA weight reads (c7 per_adapter, c8 per_lora_tile): x (BW_S / BW_T) x LoRA elements ratio;
* LoRA launch overheads (c4, c5): x layers_N / layers_M (one launch set per adapted layer);
* CPU terms (c2 per_seq, c9 per_kwaiting) and the dimensionless c10 (rank scale), c12 (knee):
  unchanged.

Adapter load time: x (adapter bytes N / M at the adapter's rank) x (link_S / link_T).

A derived profile records ``derived_from`` (source profile, facts used, method) and a power
model (``twin.power``) from the target GPU's catalog entry; ``GpuProfile.label()`` makes every
report say it is derived. Deriving the source GPU and model from the source reproduces it
exactly (integer arithmetic, unit ratios). ``profile_for`` is the entry point for placement:
it returns the measured profile of a (GPU, model) when one is shipped (a measured profile
always wins), else a derived one, optionally under a power cap.
"""

from __future__ import annotations

import math
from dataclasses import replace
from fractions import Fraction

from .gpu_catalog import GpuSpec, gpu_spec
from .model_configs import LORA_EXTRA_VOCAB, ModelConfig, model_config
from .profile import GpuProfile, available_profiles, load_profile

GPU_MEMORY_UTILIZATION = Fraction(9, 10)
DEFAULT_SOURCE_PROFILE = "llama-3.1-8b-instruct"
METHOD = "twin.derive v1 (memory arithmetic + roofline scaling of step terms; see module doc)"

# step-coefficient indices (twin.step_time.STEP_COEF_NAMES)
C_BASE, C_TOK, C_SEQ, C_KCTX, C_LORA_BASE, C_SLOT, C_TOK_KSLOT, C_ADAPTER, C_TILE, C_KWAIT, \
    C_RANK, C_KNEE_SLOPE, C_KNEE = range(13)


class DeriveError(ValueError):
    """A profile cannot be derived (the message says which input and why)."""


# Plausible ranges of the facts a derivation reads, (low, high, unit): any datacenter or
# workstation GPU and any served base model lie well inside them; a value outside is a unit slip
# (TFLOPS typed as PFLOPS, bytes as GiB) or a typo, and would derive a profile whose step times or
# KV capacity are off by orders of magnitude without any error.
GPU_SPEC_RANGES: dict[str, tuple[float, float, str]] = {
    "memory_gib": (4.0, 1024.0, "GiB"),
    "usable_memory_gib": (4.0, 1024.0, "GiB"),
    "hbm_bandwidth_gbs": (100.0, 50_000.0, "GB/s"),
    "bf16_dense_tflops": (10.0, 20_000.0, "TFLOPS"),
    "host_link_gbs": (1.0, 2_000.0, "GB/s"),
    "tdp_w": (50.0, 5_000.0, "W"),
    "idle_w": (5.0, 1_000.0, "W"),
}
MODEL_CONFIG_RANGES: dict[str, tuple[float, float, str]] = {
    "parameters": (1e8, 2e12, "parameters"),
    "num_hidden_layers": (1, 512, "layers"),
    "hidden_size": (64, 65_536, ""),
    "num_attention_heads": (1, 1_024, "heads"),
    "num_key_value_heads": (1, 1_024, "heads"),
    "head_dim": (8, 1_024, ""),
    "intermediate_size": (64, 1_048_576, ""),
    "vocab_size": (256, 2_000_000, "tokens"),
    "max_position_embeddings": (512, 10_485_760, "tokens"),
    "dtype_bytes": (1, 4, "bytes"),
}


def _num(v: float) -> str:
    return f"{int(v):,}" if float(v).is_integer() else f"{v:g}"


def ranges_text(ranges: dict[str, tuple[float, float, str]]) -> str:
    """``field in [lo, hi] unit`` for every field, for ``--help`` and messages."""
    return "; ".join(f"{k} in [{_num(lo)}, {_num(hi)}]" + (f" {u}" if u else "")
                     for k, (lo, hi, u) in ranges.items())


GPU_SPEC_HELP = "plausible ranges of a GPU spec: " + ranges_text(GPU_SPEC_RANGES)
MODEL_CONFIG_HELP = "plausible ranges of a model config: " + ranges_text(MODEL_CONFIG_RANGES)


def check_ranges(obj, ranges: dict[str, tuple[float, float, str]], option: str) -> None:
    """``DeriveError`` naming ``option``, the object's id, the field, the value and the range
    for the first field of ``obj`` outside ``ranges`` (fields that are None are skipped)."""
    for k, (lo, hi, unit) in ranges.items():
        v = getattr(obj, k, None)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
                or not lo <= v <= hi:
            u = f" {unit}" if unit else ""
            raise DeriveError(f"{option} {getattr(obj, 'id', '?')}: {k} {v!r}{u} is outside the "
                              f"plausible range [{_num(lo)}, {_num(hi)}]{u}")
    if isinstance(obj, GpuSpec) and obj.idle_w >= obj.tdp_w:
        raise DeriveError(f"{option} {obj.id}: idle_w {obj.idle_w:g} W must be below tdp_w "
                          f"{obj.tdp_w:g} W")


def _lora_workspace_bytes(model: ModelConfig, max_num_batched_tokens: int) -> int:
    """Profiling-pass workspace of vLLM's LoRA logits path: two fp32 tokens x (vocab + extra)
    buffers, only for architectures with embedding/lm_head LoRA."""
    if not model.lora_embedding_modules:
        return 0
    return 2 * max_num_batched_tokens * (model.vocab_size + LORA_EXTRA_VOCAB) * 4


def weight_read_ms(model: ModelConfig, gpu: GpuSpec) -> float:
    """Time (ms) to read every weight once from GPU memory at the datasheet bandwidth."""
    return model.weight_bytes / (gpu.hbm_bandwidth_gbs * 1e9) * 1e3


def derive_kv_capacity(source: GpuProfile, src_gpu: GpuSpec, src_model: ModelConfig,
                       gpu: GpuSpec, model: ModelConfig, max_model_len: int
                       ) -> tuple[int, dict[tuple[int, int], int], dict]:
    """(backbone KV tokens, KV table, facts) of the target; see the module docstring."""
    tokens = source.max_num_batched_tokens
    budget_s = src_gpu.usable_bytes() * GPU_MEMORY_UTILIZATION
    budget_t = gpu.usable_bytes(reference=src_gpu) * GPU_MEMORY_UTILIZATION
    kv_s, kv_t = src_model.kv_bytes_per_token, model.kv_bytes_per_token
    reserve_s = budget_s - src_model.weight_bytes - source.backbone_kv_tokens * kv_s
    if reserve_s < 0:
        raise DeriveError(
            f"--from {source.name}: its backbone KV capacity ({source.backbone_kv_tokens} tokens x "
            f"{kv_s} B) and weights exceed 0.9 x the memory of GPU {src_gpu.id!r}: the GPU spec "
            f"or the model config does not describe this profile")
    reserve_t = reserve_s * Fraction(model.vocab_size, src_model.vocab_size)
    free_t = budget_t - model.weight_bytes - reserve_t
    block = source.block_size

    def tokens_of(free: Fraction) -> int:
        return (math.floor(free / kv_t) // block) * block

    backbone = tokens_of(free_t)
    if backbone < max_model_len:
        raise DeriveError(
            f"model {model.id!r} on GPU {gpu.id!r}: only {max(backbone, 0)} KV tokens would be "
            f"left after the weights ({model.weight_bytes / 2**30:.1f} GiB) and the reserve, "
            f"below the context length {max_model_len}: vLLM would not start it")
    ws_s = _lora_workspace_bytes(src_model, tokens)
    ws_t = _lora_workspace_bytes(model, tokens)
    a_grid = sorted({a for (a, _) in source.kv_capacity})
    table: dict[tuple[int, int], int] = {}
    extrapolated = []
    for r in source.supported_ranks:
        measured = {a: v for (a, rr), v in source.kv_capacity.items() if rr == r}
        if not measured:
            continue
        a_top = max(measured)
        rest_top = ((source.backbone_kv_tokens - measured[a_top]) * kv_s
                    - a_top * src_model.lora_slot_bytes(r))
        prev = backbone
        for a in a_grid:
            if a in measured:
                rest = ((source.backbone_kv_tokens - measured[a]) * kv_s
                        - a * src_model.lora_slot_bytes(r))
            elif a > a_top:
                rest = rest_top
                extrapolated.append(f"{a},{r}")
            else:
                continue   # a grid point the source lacks at this rank below its largest A
            lora_t = a * model.lora_slot_bytes(r) + rest - ws_s + ws_t
            kv = min(tokens_of(free_t - lora_t), prev)
            lower_rank = [v for (aa, rr), v in table.items() if aa == a and rr < r]
            if lower_rank:
                kv = min(kv, min(lower_rank))
            if kv < max_model_len:
                break   # larger A only needs more memory
            table[(a, r)] = kv
            prev = kv
    facts = {
        "budget_bytes": int(budget_t), "weight_bytes": model.weight_bytes,
        "kv_bytes_per_token": kv_t, "backbone_reserve_bytes": int(reserve_t),
        "source_backbone_reserve_bytes": int(reserve_s),
        "lora_workspace_bytes": ws_t, "source_lora_workspace_bytes": ws_s,
        "lora_slot_bytes_by_rank": {str(r): model.lora_slot_bytes(r)
                                    for r in source.supported_ranks},
        "extrapolated_entries": extrapolated,
        "gpu_memory_utilization": float(GPU_MEMORY_UTILIZATION),
    }
    return backbone, table, facts


def derive_step_coef(coef: tuple[float, ...], src_gpu: GpuSpec, src_model: ModelConfig,
                     gpu: GpuSpec, model: ModelConfig) -> tuple[tuple[float, ...], dict]:
    """Step-time coefficients of the target and the ratios used (module docstring)."""
    flops = src_gpu.bf16_dense_tflops / gpu.bf16_dense_tflops          # time per FLOP
    bw = src_gpu.hbm_bandwidth_gbs / gpu.hbm_bandwidth_gbs              # time per byte
    m_flops = model.flops_per_token / src_model.flops_per_token
    m_w = model.weight_bytes / src_model.weight_bytes
    m_kv = model.kv_bytes_per_token / src_model.kv_bytes_per_token
    m_lora = model.lora_elems_per_rank / src_model.lora_elems_per_rank
    m_layers = model.num_hidden_layers / src_model.num_hidden_layers
    c = list(coef)
    w0 = min(weight_read_ms(src_model, src_gpu), c[C_BASE])
    out = list(c)
    out[C_BASE] = c[C_BASE] + w0 * (m_w * bw - 1.0)
    out[C_TOK] = c[C_TOK] * flops * m_flops
    out[C_KNEE_SLOPE] = c[C_KNEE_SLOPE] * flops * m_flops
    out[C_TOK_KSLOT] = c[C_TOK_KSLOT] * flops * m_lora
    out[C_KCTX] = c[C_KCTX] * bw * m_kv
    out[C_ADAPTER] = c[C_ADAPTER] * bw * m_lora
    out[C_TILE] = c[C_TILE] * bw * m_lora
    out[C_LORA_BASE] = c[C_LORA_BASE] * m_layers
    out[C_SLOT] = c[C_SLOT] * m_layers
    ratios = {"compute_time": flops, "memory_time": bw, "model_flops_per_token": m_flops,
              "weight_bytes": m_w, "kv_bytes_per_token": m_kv, "lora_elems_per_rank": m_lora,
              "layers": m_layers, "source_weight_read_ms": w0,
              "link_time": src_gpu.host_link_gbs / gpu.host_link_gbs}
    return tuple(float(x) for x in out), ratios


def derive_load_ms(load_ms: dict[tuple[int, int], float], src_gpu: GpuSpec,
                   src_model: ModelConfig, gpu: GpuSpec, model: ModelConfig
                   ) -> dict[tuple[int, int], float]:
    """Adapter CPU->GPU load times scaled by adapter bytes and host-link bandwidth."""
    link = src_gpu.host_link_gbs / gpu.host_link_gbs
    return {(a, m): v * link * (model.lora_slot_bytes(a) / src_model.lora_slot_bytes(a))
            for (a, m), v in load_ms.items()}


def derive_profile(source: GpuProfile, gpu: GpuSpec, model: ModelConfig,
                   src_gpu: GpuSpec | None = None, src_model: ModelConfig | None = None,
                   name: str | None = None) -> GpuProfile:
    """The profile of ``model`` on ``gpu`` derived from the measured ``source`` profile.

    ``src_gpu`` / ``src_model`` default to the catalog entry of ``source.gpu`` and the config of
    ``source.model``. Raises ``DeriveError`` when the source is itself derived, when the model
    does not fit the GPU, when a spec field lies outside its plausible range
    (``GPU_SPEC_RANGES``, ``MODEL_CONFIG_RANGES``) or ``name`` is empty or holds control
    characters (``ValueError`` naming --name)."""
    from .identifiers import clean_identifier
    from .power import default_power_model

    if name is not None:        # an empty --name is refused, not silently replaced
        name = clean_identifier(name, "--name", what="profile name")
    for opt, spec in (("--gpu", gpu), ("--model", model), ("--from-gpu", src_gpu),
                      ("--from-model", src_model)):
        if spec is not None:            # ids and names are printed into the profile
            clean_identifier(spec.id, opt, what="id")
            if getattr(spec, "name", None) is not None:
                clean_identifier(spec.name, f"{opt} {spec.id}", what="name")
    check_ranges(gpu, GPU_SPEC_RANGES, "--gpu")
    check_ranges(model, MODEL_CONFIG_RANGES, "--model")
    if src_gpu is not None:
        check_ranges(src_gpu, GPU_SPEC_RANGES, "--from-gpu")
    if src_model is not None:
        check_ranges(src_model, MODEL_CONFIG_RANGES, "--from-model")
    if source.is_derived:
        raise DeriveError(f"--from {source.name}: is a derived profile; derive from a measured "
                          f"one (derived from {source.derived_from.get('profile')!r})")
    try:
        src_gpu = src_gpu if src_gpu is not None else gpu_spec(source.gpu)
    except ValueError as e:
        raise DeriveError(f"--from {source.name}: its GPU {source.gpu!r} has no catalog entry "
                          f"({e}); give its spec with --from-gpu") from None
    try:
        src_model = src_model if src_model is not None else model_config(source.model)
    except ValueError as e:
        raise DeriveError(f"--from {source.name}: its model {source.model!r} has no config "
                          f"({e}); give it with --from-model") from None
    same = gpu.facts() == src_gpu.facts() and model.facts() == src_model.facts()
    max_len = source.max_model_len if model.facts() == src_model.facts() \
        else model.max_position_embeddings
    backbone, kv, kv_facts = derive_kv_capacity(source, src_gpu, src_model, gpu, model, max_len)
    coef, ratios = derive_step_coef(source.step_coef, src_gpu, src_model, gpu, model)
    load = derive_load_ms(source.load_ms, src_gpu, src_model, gpu, model)
    power = default_power_model(gpu, model, coef).to_dict()
    derived_from = {
        "profile": source.name, "source_gpu": src_gpu.facts(), "source_model": src_model.facts(),
        "gpu": gpu.facts(), "model": model.facts(), "method": METHOD,
        "memory": kv_facts, "step_time_ratios": ratios, "identity": same,
    }
    return replace(
        source, name=name or f"{model.id}@{gpu.id}-derived", gpu=gpu.id, model=model.id,
        max_model_len=max_len, kv_capacity=kv, step_coef=coef, load_ms=load,
        backbone_kv_tokens=backbone, fit_report={}, source={}, serving={},
        derived_from=derived_from, power=power)


def measured_profile(gpu: str, model: str) -> GpuProfile | None:
    """The shipped measured profile of (GPU id, model id), if any."""
    for name in available_profiles():
        p = load_profile(name)
        if p.gpu == gpu and p.model == model and not p.is_derived:
            return p
    return None


def profile_for(gpu: str, model: str, power_cap_w: float | None = None,
                source: str | GpuProfile = DEFAULT_SOURCE_PROFILE) -> GpuProfile:
    """The profile to simulate ``model`` on ``gpu`` (catalog ids) under ``power_cap_w``: the
    shipped measured profile when one exists (a measured profile always wins), else one derived
    from ``source``; with a cap, its step coefficients slowed as ``twin.power`` models."""
    from .power import capped_profile

    prof = measured_profile(gpu, model)
    if prof is None:
        src = source if isinstance(source, GpuProfile) else load_profile(source)
        prof = derive_profile(src, gpu_spec(gpu), model_config(model))
    return capped_profile(prof, power_cap_w) if power_cap_w is not None else prof
