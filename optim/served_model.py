"""What vLLM loads for a profile: its served model id and the server flags the profile was
calibrated with (``served_model``). Kept below ``optim.deploy`` (which writes them into every
server command) so that ``Placement.vllm_commands`` reads them without importing the deployment
writer."""

from __future__ import annotations

from dataclasses import dataclass

VLLM_VERSION = "0.8.5"          # the release the shipped profiles were measured on (default)


class DeployError(ValueError):
    """A plan or option that cannot be deployed; the message names the field or option."""


@dataclass(frozen=True)
class ServedModel:
    """The model id vLLM loads and the server settings for one profile, with where they come
    from (``source``: ``profile``, ``--model-id`` or ``assumed``); ``env`` is the measured
    release's environment, ``vllm_version`` that release (``vllm_version_source`` says
    whether the profile names it)."""

    profile: str
    model_id: str
    model_id_source: str
    settings_source: str
    env: tuple[tuple[str, str], ...]
    flags: tuple[str, ...]
    engine: str = "v1"
    vllm_version: str = VLLM_VERSION
    vllm_version_source: str = "profile"


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
    version = serving.get("vllm_version")
    vsrc = "profile" if version else f"assumed ({VLLM_VERSION}: the profile names no vllm_version)"
    return ServedModel(prof.name, mid, mid_src, settings_src, env, tuple(flags), engine,
                       str(version or VLLM_VERSION), vsrc)


def _catalog_model_id(model: str) -> str | None:
    try:
        from twin.model_configs import load_models
        cfg = load_models().get(model)
    except (OSError, ValueError):
        return None
    return cfg.hf_repo if cfg is not None and cfg.hf_repo else None
