"""The verify report: JSON (everything) and Markdown (measured vs twin per GPU and in total)."""

from __future__ import annotations

import json
import math

from .measurement import COMPARED, ServingMetrics
from .verify import VerifyResult, relative

LAG_WARN_MS = 50.0   # twin serve behind its clock by more than this: latencies inflated

LABELS = {"throughput_tps": "throughput (tok/s)", "mean_ttft_ms": "mean TTFT (ms)",
          "p50_ttft_ms": "median TTFT (ms)", "p99_ttft_ms": "p99 TTFT (ms)",
          "mean_tpot_ms": "mean TPOT (ms)", "mean_itl_ms": "mean ITL (ms)",
          "p99_itl_ms": "p99 ITL (ms)"}


def report_dict(r: VerifyResult) -> dict:
    """Everything the run measured and predicted, JSON-ready."""
    wl = r.workload
    return {
        "plan": wl.plan_path, "instance": wl.instance, "server": r.server_kind,
        "time_scale": r.time_scale, "window_s": wl.duration_s, "seed": wl.seed,
        "workload": wl.source, "prompts": wl.prompt_source,
        "starvation_threshold": wl.threshold,
        "requests_planned": wl.n_requests,
        "time_unit_note": "all times are twin (GPU) time: wall-clock x time_scale",
        "verdict": {"measured": "starved" if r.total_measured.starved else "ok",
                    "twin": "starved" if r.total_twin.starved else "ok",
                    "agree": r.verdict_agrees},
        "total": {"measured": r.total_measured.to_dict(), "twin": r.total_twin.to_dict()},
        "gpus": [{"gpu": g.gpu, "url": g.url, "max_loras": g.max_loras,
                  "max_lora_rank": g.max_lora_rank, "adapters": g.n_adapters,
                  "measured": g.measured.to_dict(), "twin": g.twin.to_dict(),
                  "request_errors": g.errors, "server_kv_tokens": g.server_kv_tokens,
                  "twin_kv_tokens": g.twin_kv_tokens,
                  "server_preemptions": g.server_preemptions,
                  "twin_preemptions": g.twin_preemptions,
                  "twin_arrivals_from": g.twin_arrivals_from,
                  "transit_ms_wall": g.transit_ms,
                  "server_clock_lag_s": g.server_lag_s} for g in r.gpus],
        "relative_difference": relative(r),
    }


def to_json(r: VerifyResult) -> str:
    return json.dumps(report_dict(r), indent=1)


def _fmt(v) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    if isinstance(v, bool):
        return "starved" if v else "ok"
    return f"{v:.1f}" if abs(v) >= 10 else f"{v:.2f}"


def _rows(measured: ServingMetrics, twin: ServingMetrics, rel: dict) -> list[str]:
    rows = []
    for k in COMPARED:
        d = rel.get(k)
        rows.append(f"| {LABELS[k]} | {_fmt(getattr(measured, k))} | {_fmt(getattr(twin, k))} | "
                    f"{'-' if d is None else f'{100 * d:+.1f} %'} |")
    rows.append(f"| verdict (90 % rule) | {_fmt(measured.starved)} | {_fmt(twin.starved)} | "
                f"{'same' if measured.starved == twin.starved else 'DIFFERENT'} |")
    rows.append(f"| completed / sent | {measured.completed} / {measured.sent} | "
                f"{twin.completed} / {twin.sent} | |")
    return rows


def to_markdown(r: VerifyResult) -> str:
    """Per-GPU and total tables: measured, twin on the same requests, relative difference."""
    wl = r.workload
    rel = relative(r)
    head = ["| metric | measured | twin (same requests) | difference |", "|---|---|---|---|"]
    lines = [f"# Plan verification: {wl.instance}", "",
             f"plan `{wl.plan_path}`, {len(r.gpus)} GPUs on {r.server_kind} servers, window "
             f"{wl.duration_s:g} s (twin time; time scale {r.time_scale:g}), workload "
             f"{wl.source}, prompts: {wl.prompt_source}, seed {wl.seed}, {wl.n_requests} "
             "requests planned. Verdicts: measured "
             f"**{'starved' if r.total_measured.starved else 'ok'}**, twin "
             f"**{'starved' if r.total_twin.starved else 'ok'}**.", "",
             "## Total (all GPUs pooled)", "", *head,
             *_rows(r.total_measured, r.total_twin, rel["total"]), ""]
    for g in r.gpus:
        lines += [f"## GPU {g.gpu}: Amax {g.max_loras}, max rank {g.max_lora_rank}, "
                  f"{g.n_adapters} adapters ({g.url})", "", *head,
                  *_rows(g.measured, g.twin, rel[f"gpu{g.gpu}"])]
        kv = (f"KV capacity: server {g.server_kv_tokens} tokens, twin {g.twin_kv_tokens}; "
              if g.server_kv_tokens is not None else f"KV capacity: twin {g.twin_kv_tokens} "
              "tokens (server did not report it); ")
        pre = (f"preemptions: server {g.server_preemptions:g}, twin {g.twin_preemptions}"
               if g.server_preemptions is not None else f"preemptions: twin {g.twin_preemptions}")
        errs = ", ".join(f"{k}: {v}" for k, v in g.errors.items()) or "none"
        tr = (f"; transport {g.transit_ms:.2f} ms wall per request on average (not time-scaled)"
              if g.transit_ms > 0 else "")
        lines += ["", f"{kv}{pre}; request errors: {errs}; the twin replayed the "
                  f"{g.twin_arrivals_from}{tr}.", ""]
        if g.server_lag_s is not None and g.server_lag_s * 1000.0 > LAG_WARN_MS:
            lines += [f"**Warning:** the stand-in fell up to {g.server_lag_s * 1000:.0f} ms (twin "
                      "time) behind its clock (CPU busy): its tokens reached the client late, so "
                      "the measured latencies are inflated; lower --time-scale or free CPU.", ""]
    return "\n".join(lines)


def plot(r: VerifyResult, path) -> None:
    """Bar chart of measured vs twin relative differences, one group per metric, one bar per GPU
    and the pooled total (saved to ``path``)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    rel = relative(r)
    parts = ["total"] + [f"gpu{g.gpu}" for g in r.gpus]
    x = np.arange(len(COMPARED))
    width = 0.8 / len(parts)
    fig, ax = plt.subplots(figsize=(10, 4))
    for i, part in enumerate(parts):
        vals = [100.0 * (rel[part][k] if rel[part][k] is not None else np.nan) for k in COMPARED]
        ax.bar(x + (i - (len(parts) - 1) / 2) * width, vals, width, label=part)
    ax.axhline(0.0, color="black", lw=0.8)
    ax.set_xticks(x, [LABELS[k] for k in COMPARED], rotation=20, ha="right")
    ax.set_ylabel("measured vs twin (%)")
    ax.set_title(f"{r.workload.instance}: {r.server_kind} servers, time scale {r.time_scale:g}, "
                 f"{r.workload.duration_s:g} s window")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
