"""Dummy PEFT LoRA adapters of given ranks (``adapter_config.json`` + safetensors weights).

vLLM loads an adapter directory only if its tensors match the base model's projection shapes, so
the weights are shaped from the model's dimensions (built in for the two profiled models, from
their Hugging Face ``config.json``; any other model via ``--model-config config.json``). Like
PEFT's initialisation, ``lora_A`` is small seeded noise and ``lora_B`` is zero, so an adapter
changes no output: the run measures serving cost, not quality. Adapters of equal rank are
identical, so one directory per rank is written and every adapter id of that rank points to it
(vLLM still loads and caches each adapter id separately).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import numpy as np

from ..json_files import read_json_file


@dataclass(frozen=True)
class ModelDims:
    """The shapes a LoRA adapter of a decoder-only transformer needs."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int

    @classmethod
    def from_hf_config(cls, cfg: dict, source: str = "config") -> "ModelDims":
        """From a Hugging Face ``config.json`` dict (missing fields named in the error)."""
        need = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
        missing = [k for k in need if not isinstance(cfg.get(k), int) or cfg[k] < 1]
        if missing:
            raise ValueError(f"{source}: missing or invalid field(s) {', '.join(missing)}")
        heads = cfg["num_attention_heads"]
        return cls(cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"], heads,
                   int(cfg.get("num_key_value_heads") or heads),
                   int(cfg.get("head_dim") or cfg["hidden_size"] // heads))

    def module_shapes(self) -> dict[str, tuple[int, int]]:
        """(in_features, out_features) of every LoRA-targetable projection."""
        h, q, kv = self.hidden_size, self.num_attention_heads * self.head_dim, \
            self.num_key_value_heads * self.head_dim
        i = self.intermediate_size
        return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
                "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}


# Hugging Face config.json of the profiled base models (meta-llama/Llama-3.1-8B-Instruct,
# Qwen/Qwen2.5-7B-Instruct), keyed by the profile's model name.
KNOWN_MODELS: dict[str, tuple[str, ModelDims]] = {
    "llama-3.1-8b-instruct": ("meta-llama/Llama-3.1-8B-Instruct",
                              ModelDims(4096, 14336, 32, 32, 8, 128)),
    "qwen-2.5-7b-instruct": ("Qwen/Qwen2.5-7B-Instruct", ModelDims(3584, 18944, 28, 28, 4, 128)),
}
DEFAULT_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")


def model_dims(model: str, model_config: str | Path | None = None) -> ModelDims:
    """Dimensions from ``model_config`` (a HF config.json) or the built-in table."""
    if model_config is not None:
        p = Path(model_config)
        cfg = read_json_file(p, "--model-config", ValueError, expect_object=True)
        return ModelDims.from_hf_config(cfg, f"--model-config {p}")
    if model not in KNOWN_MODELS:
        raise ValueError(f"model {model!r}: dimensions unknown; pass --model-config with the "
                         f"model's config.json (known: {', '.join(sorted(KNOWN_MODELS))})")
    return KNOWN_MODELS[model][1]


def write_adapter(out: Path, rank: int, dims: ModelDims, base_model: str,
                  target_modules: Iterable[str] = DEFAULT_TARGET_MODULES, seed: int = 0) -> Path:
    """Write one PEFT adapter directory of ``rank`` (lora_alpha = 2 * rank) and return it."""
    from safetensors.numpy import save_file

    if not isinstance(rank, (int, np.integer)) or rank < 1:
        raise ValueError(f"adapter rank must be an integer >= 1, got {rank!r}")
    shapes = dims.module_shapes()
    targets = list(target_modules)
    bad = [t for t in targets if t not in shapes]
    if bad:
        raise ValueError(f"target modules {bad}: unknown (choose from {sorted(shapes)})")
    rng = np.random.default_rng(seed)
    tensors: dict[str, np.ndarray] = {}
    for layer in range(dims.num_hidden_layers):
        for t in targets:
            fin, fout = shapes[t]
            group = "self_attn" if t in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
            pre = f"base_model.model.model.layers.{layer}.{group}.{t}"
            tensors[f"{pre}.lora_A.weight"] = (rng.standard_normal((rank, fin), np.float32)
                                               * 0.01).astype(np.float16)
            tensors[f"{pre}.lora_B.weight"] = np.zeros((fout, rank), np.float16)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "adapter_model.safetensors"))
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base_model,
              "r": int(rank), "lora_alpha": 2 * int(rank), "lora_dropout": 0.0, "bias": "none",
              "target_modules": targets, "fan_in_fan_out": False, "inference_mode": True}
    (out / "adapter_config.json").write_text(json.dumps(config, indent=1) + "\n")
    return out


def write_rank_adapters(folder: Path, ranks: Iterable[int], model: str,
                        model_config: str | Path | None = None, seed: int = 0) -> dict[int, Path]:
    """One adapter directory per rank, ``folder/rank-<r>`` (reused when already complete)."""
    dims = model_dims(model, model_config)
    base = KNOWN_MODELS[model][0] if model in KNOWN_MODELS else model
    out: dict[int, Path] = {}
    for r in sorted(set(int(x) for x in ranks)):
        d = Path(folder) / f"rank-{r}"
        cfg = d / "adapter_config.json"
        if cfg.is_file() and (d / "adapter_model.safetensors").is_file():
            try:
                if json.loads(cfg.read_text()).get("r") == r:
                    out[r] = d
                    continue
            except json.JSONDecodeError:
                pass
            raise ValueError(f"{d}: exists but is not a rank-{r} adapter; remove it or choose "
                             "another --work-dir")
        out[r] = write_adapter(d, r, dims, base, seed=seed + r)
    return out
