"""``/metrics`` of ``twin serve``: Prometheus text with vLLM's V1 metric names.

Names, label names, label order and histogram buckets follow ``vllm/v1/metrics/loggers.py``
(``PrometheusStatLogger``) of vLLM 0.8.5, checked against the release's source distribution
(``vllm-0.8.5.tar.gz`` from PyPI; the GitHub snapshot was too large to fetch here): every
series carries ``model_name`` (the served model name) and ``engine`` ("0"); counters are
exposed with vLLM's ``_total`` names; ``vllm:lora_requests_info`` has the labels ``max_lora``,
``waiting_lora_adapters``, ``running_lora_adapters`` (comma-separated adapter names, each once,
in first-seen order) and the time it was set as its value; ``vllm:cache_config_info`` has the
fields of 0.8.5's ``CacheConfig`` as labels (vLLM and this module both expose through
prometheus_client, which writes label names sorted). All times are *twin* seconds (what the
GPU would show), whatever ``--time-scale`` is. Counters and histograms are updated once per
engine step from its :class:`~twin.serve.engine.StepRecord`; gauges are read from the engine
when scraped. The histograms are kept as plain bucket counts (cheaper per token than
prometheus_client's objects) and exported through a custom collector. Not exported: vLLM's
per-request histograms other than TTFT, TPOT and end-to-end latency (queue, prefill, decode,
inference time, token counts, ``iteration_tokens_total``), the prefix-cache counters and
``_created`` samples.

Differences from vLLM, by design: ``vllm:lora_requests_info`` is exported as one series, the
current state (vLLM keeps every label combination it has ever set, each stamped with the time it
was last set; a reader takes the newest, which is this one). ``vllm:num_requests_waiting``
includes requests received since the engine's last step boundary, as of the engine's clock: when
the engine lags behind the scaled wall clock, requests stamped after its clock are not counted
until it reaches them (its scheduler has not seen them yet). ``vllm:cache_config_info`` reports
``num_gpu_blocks``: vLLM 0.8.5's V1 engine builds its stat loggers before the engine core has
sized the KV cache, so a real 0.8.5 server reports ``num_gpu_blocks="None"`` there (later
versions fill it in); its KV capacity is in the start-up log line ``GPU KV cache size: N
tokens``, which ``twin serve`` prints too and :func:`twin.harness.client.kv_cache_tokens` falls
back to.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from typing import TYPE_CHECKING, Callable

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily,
                                    HistogramMetricFamily)

from .engine import StepRecord, iter_adapter_names

if TYPE_CHECKING:
    from .engine import EngineCore

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                10.0, 20.0, 40.0, 80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
               120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)


class BucketHistogram:
    """Counts per bucket (Prometheus ``le`` semantics), sum and count."""

    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.bounds = buckets
        self.counts = [0] * (len(buckets) + 1)
        self.total = 0.0

    def observe(self, v: float) -> None:
        self.counts[bisect_left(self.bounds, v)] += 1
        self.total += v

    def cumulative(self) -> list[tuple[str, int]]:
        out, acc = [], 0
        for b, c in zip(self.bounds, self.counts):
            acc += c
            out.append((repr(float(b)), acc))
        out.append(("+Inf", acc + self.counts[-1]))
        return out


class ServeMetrics:
    """Accumulates vLLM's counters and histograms from engine steps and renders ``/metrics``."""

    def __init__(self, core: "EngineCore", model_name: str, adapter_names: dict[int, str],
                 lag_s: Callable[[], float] = lambda: 0.0, cache_info: dict | None = None
                 ) -> None:
        self.core = core
        self.model_name = model_name
        self.adapter_names = adapter_names
        self.lag_s = lag_s
        self.cache_info = cache_info or {}
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.preemptions = 0
        self.success = {"stop": 0, "length": 0, "abort": 0}
        self.ttft = BucketHistogram(TTFT_BUCKETS)
        self.tpot = BucketHistogram(TPOT_BUCKETS)
        self.e2e = BucketHistogram(E2E_BUCKETS)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    def record_step(self, rec: StepRecord) -> None:
        """Count one released step (vLLM counts a prompt once, when its first token is out)."""
        self.preemptions += rec.preemptions
        self.generation_tokens += len(rec.emitted)
        for req in rec.first_tokens:
            self.prompt_tokens += req.in_len
            self.ttft.observe(req.first_t - req.arrival)
        for gap in rec.itl_gaps:
            self.tpot.observe(gap)
        for req in rec.finished:
            reason = getattr(req.tag, "finish_reason", "length")
            self.success[reason] = self.success.get(reason, 0) + 1
            self.e2e.observe(req.finish_t - req.arrival)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    # prometheus_client collector protocol
    def collect(self):
        lab, val = ["model_name", "engine"], [self.model_name, "0"]
        core = self.core
        kv = core.kv
        yield _gauge("vllm:num_requests_running", "Number of requests in model execution batches.",
                     lab, val, len(core.sched.running))
        yield _gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
                     lab, val, core.n_waiting())
        yield _gauge("vllm:gpu_cache_usage_perc", "GPU KV-cache usage. 1 means 100 percent usage.",
                     lab, val, kv.used_blocks / kv.total_blocks)
        for name, doc, v in (
                ("vllm:num_preemptions", "Cumulative number of preemption from the engine.",
                 self.preemptions),
                ("vllm:prompt_tokens", "Number of prefill tokens processed.", self.prompt_tokens),
                ("vllm:generation_tokens", "Number of generation tokens processed.",
                 self.generation_tokens)):
            c = CounterMetricFamily(name, doc, labels=lab)
            c.add_metric(val, v)
            yield c
        c = CounterMetricFamily("vllm:request_success", "Count of successfully processed requests.",
                                labels=lab + ["finished_reason"])
        for reason, n in self.success.items():
            c.add_metric(val + [reason], n)
        yield c
        for name, doc, h in (
                ("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                 self.ttft),
                ("vllm:time_per_output_token_seconds",
                 "Histogram of time per output token in seconds.", self.tpot),
                ("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                 self.e2e)):
            f = HistogramMetricFamily(name, doc, labels=lab)
            f.add_metric(val, h.cumulative(), h.total)
            yield f
        if core.settings.max_loras > 0:
            g = GaugeMetricFamily("vllm:lora_requests_info", "Running stats on lora requests.",
                                  labels=["max_lora", "waiting_lora_adapters",
                                          "running_lora_adapters"])
            g.add_metric([str(core.settings.max_loras),
                          ",".join(iter_adapter_names(core.waiting_adapters(), self.adapter_names)),
                          ",".join(iter_adapter_names(core.running_adapters(), self.adapter_names))],
                         time.time())
            yield g
        g = GaugeMetricFamily("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
                              labels=list(self.cache_info))
        g.add_metric([str(v) for v in self.cache_info.values()], 1.0)
        yield g
        yield _gauge("twin:virtual_clock_lag_seconds",
                     "Largest lag (twin seconds) of the engine behind the scaled wall clock; 0 "
                     "when the server kept up with --time-scale.", lab, val, self.lag_s())


def _gauge(name: str, doc: str, labels: list[str], values: list[str], v: float):
    g = GaugeMetricFamily(name, doc, labels=labels)
    g.add_metric(values, float(v))
    return g


def cache_config_info(block_size: int, num_gpu_blocks: int) -> dict[str, str]:
    """The labels of ``vllm:cache_config_info``: vLLM 0.8.5's ``CacheConfig.metrics_info()``
    (every attribute as a string, ``swap_space_bytes`` included; the exposition sorts them) at the
    defaults of ``vllm serve``. ``num_gpu_blocks`` is the profile's KV capacity / block size
    (see the module docstring); prefix caching is reported off because the twin does not model
    it."""
    return {
        "block_size": str(block_size), "gpu_memory_utilization": "0.9", "swap_space": "4",
        "cache_dtype": "auto", "is_attention_free": "False", "num_gpu_blocks_override": "None",
        "sliding_window": "None", "enable_prefix_caching": "False",
        "prefix_caching_hash_algo": "builtin", "cpu_offload_gb": "0",
        "calculate_kv_scales": "False", "num_gpu_blocks": str(num_gpu_blocks),
        "num_cpu_blocks": "None", "swap_space_bytes": str(4 * 2**30),
    }
