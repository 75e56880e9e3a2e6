"""Base-model facts (from public Hugging Face ``config.json`` files) and the sizes the twin
derives from them: weight bytes, KV bytes per token, forward FLOPs per token, LoRA slot bytes.

``twin/data/models.json`` ships Llama-3.1-8B-Instruct and Qwen-2.5-7B-Instruct with their
sources; ``model_config`` returns one by id (the profile's ``model`` name) or reads a user's
JSON file with the same fields. A bad value raises ``ModelConfigError`` naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from .json_files import read_json_file

MODELS_PATH = Path(__file__).resolve().parent / "data" / "models.json"
# vLLM 0.8.5 LoRAConfig.lora_extra_vocab_size default: extra embedding rows per LoRA slot
LORA_EXTRA_VOCAB = 256

_INTS = ("parameters", "num_hidden_layers", "hidden_size", "num_attention_heads",
         "num_key_value_heads", "head_dim", "intermediate_size", "vocab_size",
         "max_position_embeddings", "dtype_bytes")
_ALLOWED = set(_INTS) | {"hf_repo", "lora_embedding_modules", "sources", "id"}


class ModelConfigError(ValueError):
    """A model config is malformed or unknown; the message names where, the field and why."""


@dataclass(frozen=True)
class ModelConfig:
    """Architecture facts of one decoder-only base model (Llama/Qwen2 layout: q,k,v,o and a
    gated MLP per layer, untied lm_head)."""

    id: str
    parameters: int
    num_hidden_layers: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    dtype_bytes: int = 2
    lora_embedding_modules: bool = False
    hf_repo: str = ""
    sources: dict = field(default_factory=dict)

    @property
    def weight_bytes(self) -> int:
        """Bytes of the weights in the serving dtype (read once per forward pass)."""
        return self.parameters * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes per token: K and V of every layer."""
        return 2 * self.num_hidden_layers * self.num_key_value_heads * self.head_dim \
            * self.dtype_bytes

    @property
    def flops_per_token(self) -> float:
        """Forward FLOPs per token of the matrix products (2 x the non-embedding parameters,
        lm_head included; attention over the context is a separate, KV-read term)."""
        return 2.0 * (self.parameters - self.vocab_size * self.hidden_size)

    @property
    def lora_layer_elems_per_rank(self) -> int:
        """LoRA A+B elements per unit of rank of one slot in the decoder layers (q, k, v, o,
        gate, up, down: in + out features each)."""
        h, q = self.hidden_size, self.num_attention_heads * self.head_dim
        kv = self.num_key_value_heads * self.head_dim
        i = self.intermediate_size
        per_layer = (h + q) + 2 * (h + kv) + (q + h) + 2 * (h + i) + (i + h)
        return self.num_hidden_layers * per_layer

    @property
    def lora_elems_per_rank(self) -> int:
        """LoRA elements per unit of rank of one slot, with vLLM's embedding and lm_head LoRA
        buffers when the architecture has them (embedding A over vocab + extra vocab, lm_head A
        over hidden and B over vocab)."""
        n = self.lora_layer_elems_per_rank
        if self.lora_embedding_modules:
            n += (self.vocab_size + LORA_EXTRA_VOCAB) + self.hidden_size + self.vocab_size
        return n

    def lora_slot_bytes(self, rank: int) -> int:
        """GPU bytes of one LoRA slot at ``rank`` (plus the rank-independent extra-vocab
        embedding rows of embedding/lm_head LoRA)."""
        fixed = 2 * LORA_EXTRA_VOCAB * self.hidden_size if self.lora_embedding_modules else 0
        return (self.lora_elems_per_rank * rank + fixed) * self.dtype_bytes

    def facts(self) -> dict[str, Any]:
        """The numbers (for a derived profile's metadata)."""
        d = {k: getattr(self, k) for k in ("id",) + _INTS}
        d["lora_embedding_modules"] = self.lora_embedding_modules
        return d


def config_from_dict(d: Any, model_id: str, where: str) -> ModelConfig:
    """Validate one model entry (``where`` names the file for messages)."""
    def err(fld: str, reason: str) -> ModelConfigError:
        return ModelConfigError(f"{where}: model {model_id!r}: field {fld!r}: {reason}")

    if not isinstance(d, Mapping):
        raise ModelConfigError(f"{where}: model {model_id!r}: must be a JSON object, got "
                               f"{type(d).__name__}")
    unknown = sorted(set(d) - _ALLOWED)
    if unknown:
        raise err(unknown[0], f"unknown field (allowed: {', '.join(sorted(_ALLOWED))})")
    vals: dict[str, int] = {}
    for k in _INTS:
        if k not in d:
            if k == "dtype_bytes":
                vals[k] = 2
                continue
            raise err(k, "missing")
        v = d[k]
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise err(k, f"must be a positive integer, got {v!r}")
        vals[k] = v
    if vals["num_attention_heads"] % vals["num_key_value_heads"]:
        raise err("num_key_value_heads", f"{vals['num_key_value_heads']} does not divide "
                  f"num_attention_heads {vals['num_attention_heads']}")
    emb = 2 * vals["vocab_size"] * vals["hidden_size"]
    if vals["parameters"] <= emb:
        raise err("parameters", f"{vals['parameters']} is not above the embedding + lm_head "
                  f"parameters {emb} (vocab_size x hidden_size x 2)")
    lem = d.get("lora_embedding_modules", False)
    if not isinstance(lem, bool):
        raise err("lora_embedding_modules", f"must be true or false, got {lem!r}")
    repo = d.get("hf_repo", "")
    if not isinstance(repo, str):
        raise err("hf_repo", f"must be a string, got {repo!r}")
    sources = d.get("sources", {})
    if not isinstance(sources, Mapping):
        raise err("sources", f"must be an object field -> source, got {type(sources).__name__}")
    return ModelConfig(id=model_id, lora_embedding_modules=lem, hf_repo=repo,
                       sources=dict(sources), **vals)


def _read_json(path: Path, what: str) -> Any:
    return read_json_file(path, what, ModelConfigError)


def load_models(path: str | Path = MODELS_PATH) -> dict[str, ModelConfig]:
    """Every model of a models file (``{"models": {id: config}}``), validated."""
    p = Path(path)
    d = _read_json(p, "model configs")
    if not isinstance(d, Mapping) or not isinstance(d.get("models"), Mapping) or not d["models"]:
        raise ModelConfigError(f"model configs {str(p)!r}: field 'models': must be a non-empty "
                               "object id -> config")
    return {str(k): config_from_dict(v, str(k), f"model configs {str(p)!r}")
            for k, v in d["models"].items()}


def model_ids() -> list[str]:
    """Ids of the shipped model configs."""
    return sorted(load_models())


def model_config(id_or_path: str | Path) -> ModelConfig:
    """A shipped model config by id, or one config from a JSON file (its ``id`` field, else
    the file stem, names it)."""
    s = str(id_or_path)
    if s.endswith(".json") or "/" in s or Path(s).is_file():
        p = Path(s)
        d = _read_json(p, "model config")
        mid = d.get("id", p.stem) if isinstance(d, Mapping) else p.stem
        return config_from_dict(d, str(mid), f"model config {s!r}")
    models = load_models()
    if s not in models:
        raise ModelConfigError(f"unknown model {s!r}; shipped: {', '.join(sorted(models))} "
                               "(or give a JSON config file)")
    return models[s]
