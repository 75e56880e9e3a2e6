"""Replaying one run of the shared measurement format (``../shared/data/vllm_h100``: a CSV row
of configuration columns) in the twin: what ``experiments.twin_fidelity`` compares with the real
server and what ``twin.headroom`` derives its headroom from."""

from __future__ import annotations

from .latency_tail import latency_tail_for
from .metrics import compute_metrics, memory_error_metrics
from .profile import load_profile
from .server import run_kernel, simulate_server
from .slot_fit import shared_run_setup
from .workload import generate_requests, offered_token_rate

CONFIG_COLUMNS = ["model", "max_loras", "served_adapters", "max_lora_rank", "adapter_rank_counts",
                  "rate_counts", "total_time_s", "pool_mean_input_len", "pool_mean_output_len",
                  "max_num_batched_tokens", "max_num_seqs"]


def replay_run(cfg: dict, seed: int = 0, io_correlation: float | None = None,
               client_latency: bool = True) -> dict:
    """Simulate one real run from its configuration columns; returns the twin's metrics.
    ``io_correlation`` overrides the ShareGPT model's prompt/answer length correlation. With
    ``client_latency`` (default) the TTFT / ITL quantities are what vLLM's benchmark client
    sees, by ``twin.latency_tail`` when the profile has fitted constants (throughput, mean ITL
    and TPOT are the engine's either way); without, the engine's."""
    profile = load_profile(cfg["model"])
    adapters, lengths, sc = shared_run_setup(cfg, seed, io_correlation)
    duration = float(cfg["total_time_s"])
    tail = latency_tail_for(profile) if client_latency else None
    if tail is None:
        return simulate_server(profile, adapters, sc, duration, lengths=lengths,
                               seed=seed).to_dict()
    # the client's latencies (twin.latency_tail): the engine's run, then compute_metrics with
    # the profile's fitted API-server / cold-start / delivery-delay constants
    reqs = generate_requests(adapters, duration, lengths, seed=seed)
    run = run_kernel(profile, adapters, reqs, sc, duration)
    if run is None:
        return memory_error_metrics(duration, offered_token_rate(adapters, lengths)).to_dict()
    m = compute_metrics(reqs.arrival_s, reqs.input_len, reqs.output_len, run.first_t,
                        run.finish_t, run.stats, run.itl_hist, duration,
                        offered_token_rate(adapters, lengths), run.kv_blocks,
                        profile.block_size, sc.starvation_threshold, adapter=reqs.adapter,
                        latency_tail=tail)
    d = m.to_dict()
    d["wall_s"] = run.wall_s
    return d
