"""Compare a profile fitted from harness measurements with the profile the server ran.

The round trip ``twin.harness profile`` against ``twin serve --profile P`` -> ``twin calibrate``
-> fitted profile checks the harness: it should recover P's step-time coefficients, its KV table
(on the configurations probed), its backbone KV capacity and its adapter load times.
"""

from __future__ import annotations

from dataclasses import dataclass

from twin.profile import GpuProfile
from twin.step_time import STEP_COEF_NAMES

# A coefficient whose reference value is 0 counts as recovered when the fitted value adds less
# than this share of the reference step time at the study's reference decode step (below).
ZERO_COEF_SHARE = 0.01


@dataclass(frozen=True)
class CoefficientCheck:
    """One step-time coefficient: reference, fitted, relative error (None when the reference
    is 0: then ``contribution`` is its share of a reference step)."""

    name: str
    reference: float
    fitted: float
    relative_error: float | None
    contribution: float | None


def _reference_step_features() -> dict[str, float]:
    """A mid-size LoRA decode step (128 requests, ctx 16k, 64 slots, 32 adapters, 200 waiting)
    at which a zero coefficient's fitted value is weighed."""
    return {"n_seqs": 128, "tok": 128, "ctx_k": 16.384, "max_loras": 64, "n_distinct": 32,
            "n_tiles": 32, "waiting_k": 0.2, "over_knee": 0.0}


def coefficient_checks(reference: GpuProfile, fitted: GpuProfile) -> list[CoefficientCheck]:
    """Per coefficient: relative error, or for a zero reference its share of a typical step."""
    from twin.step_time import step_time_ms_py
    f = _reference_step_features()
    step = step_time_ms_py(reference.step_coef_array(), f["n_seqs"], 0, f["tok"],
                           f["ctx_k"] * 1000, f["n_distinct"], f["max_loras"], 8,
                           f["waiting_k"] * 1000, f["n_tiles"])
    feature_of = {"base_ms": 1.0, "per_token_ms": f["tok"], "per_seq_ms": f["n_seqs"],
                  "per_kctx_ms": f["ctx_k"], "lora_base_ms": 1.0,
                  "per_slot_rank_ms": f["max_loras"],         # (per 8 ranks above 8)
                  "per_token_kslot_ms": f["tok"] * f["max_loras"] / 1000.0,
                  "per_adapter_ms": f["n_distinct"], "per_lora_tile_ms": f["n_tiles"],
                  "per_kwaiting_ms": f["waiting_k"], "per_seq_over_knee_ms": 1.0}
    out = []
    for i, name in enumerate(STEP_COEF_NAMES):
        ref, fit = float(reference.step_coef[i]), float(fitted.step_coef[i])
        if ref != 0.0:
            out.append(CoefficientCheck(name, ref, fit, (fit - ref) / ref, None))
        else:
            share = abs(fit) * feature_of.get(name, 1.0) / step
            out.append(CoefficientCheck(name, ref, fit, None, share))
    return out


def kv_mismatches(reference: GpuProfile, fitted: GpuProfile) -> list[str]:
    """Probed KV configurations whose capacity differs (every fitted entry must equal the
    reference's; a configuration the reference cannot start must be absent)."""
    bad = []
    for key, v in sorted(fitted.kv_capacity.items()):
        if reference.kv_capacity.get(key) != v:
            bad.append(f"{key}: fitted {v}, reference {reference.kv_capacity.get(key)}")
    if fitted.backbone_kv_tokens != reference.backbone_kv_tokens:
        bad.append(f"backbone: fitted {fitted.backbone_kv_tokens}, reference "
                   f"{reference.backbone_kv_tokens}")
    return bad


def load_errors(reference: GpuProfile, fitted: GpuProfile) -> dict[tuple[int, int], float]:
    """Relative error of every fitted load time against the reference's."""
    return {k: (v - reference.load_ms[k]) / reference.load_ms[k]
            for k, v in sorted(fitted.load_ms.items()) if k in reference.load_ms}


def format_checks(reference: GpuProfile, fitted: GpuProfile, tolerance: float = 0.05) -> str:
    """Table of the comparison (the ``experiments/profile_round_trip.py`` output)."""
    lines = [f"{'coefficient':26s} {'reference':>11s} {'fitted':>11s} {'error':>9s}  within",
             "-" * 66]
    for c in coefficient_checks(reference, fitted):
        if c.relative_error is not None:
            err, ok = f"{100 * c.relative_error:+.2f} %", abs(c.relative_error) <= tolerance
        else:
            err, ok = f"{100 * c.contribution:.2f} %*", c.contribution <= ZERO_COEF_SHARE
        lines.append(f"{c.name:26s} {c.reference:11.5g} {c.fitted:11.5g} {err:>9s}  "
                     f"{'yes' if ok else 'NO'}")
    lines.append(f"* reference 0: share of a reference LoRA decode step "
                 f"(within: < {100 * ZERO_COEF_SHARE:g} %)")
    lines.append(f"per-slot LoRA cost m*(c5*A*rr + c6*tok*A/1000) at the reference step, rank 32: "
                 f"{100 * slot_cost_error(reference, fitted):+.2f} %")
    kv = kv_mismatches(reference, fitted)
    lines.append(f"KV table: {len(fitted.kv_capacity)} probed configurations, "
                 f"{'all equal' if not kv else 'MISMATCH ' + '; '.join(kv)}; backbone "
                 f"{fitted.backbone_kv_tokens} (reference {reference.backbone_kv_tokens})")
    le = load_errors(reference, fitted)
    worst = max((abs(v) for v in le.values()), default=float("nan"))
    lines.append(f"adapter load times: {len(le)} (adapter rank, max rank) pairs, largest "
                 f"relative error {100 * worst:.3f} %")
    return "\n".join(lines)


def slot_cost_error(reference: GpuProfile, fitted: GpuProfile, max_rank: int = 32) -> float:
    """Relative error of the per-slot LoRA cost m * (c5*A*rr + c6*tok*A/1000) at the reference
    step on a ``max_rank`` server: a study whose LoRA windows vary the batch and the rank little
    cannot separate c5 from c6 (and the rank multiplier m), only their sum."""
    f = _reference_step_features()
    rr = max(max_rank - 8, 0) / 8.0

    def cost(p: GpuProfile) -> float:
        c = p.step_coef
        return (1.0 + c[10] * rr) * (c[5] * f["max_loras"] * rr
                                     + c[6] * f["tok"] * f["max_loras"] / 1000.0)
    return (cost(fitted) - cost(reference)) / cost(reference)
