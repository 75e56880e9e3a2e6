"""``/metrics`` of ``twin serve``: Prometheus text with vLLM's V1 metric names, per vLLM release.

``--vllm-version`` (default: the profile's measured release, 0.8.5) chooses the names, buckets and
error-body shape where releases differ (:class:`VllmRelease`); the scheduling rules and timing
stay those of 0.8.5, which the twin was checked against. What was read, in vLLM's
``vllm/v1/metrics/loggers.py`` (``PrometheusStatLogger``) and elsewhere:

- 0.8.x (a V1 ``loggers.py`` of the 0.8 line, and the 0.8.5 source distribution read earlier):
  ``vllm:gpu_cache_usage_perc`` only; ``vllm:iteration_tokens_total`` buckets are the CUDA-graph
  capture sizes (V1 default ``[1, 2, 4] + range(8, 513, 8)``, those <= max_num_batched_tokens).
- 0.9.0 onward: ``vllm:iteration_tokens_total`` buckets are ``[1, 8, 16, ..., 16384]``.
- 0.9.2 onward: ``vllm:kv_cache_usage_perc`` beside the deprecated ``gpu_cache_usage_perc``
  (vLLM PR 18354; its source comment "Deprecated in 0.9.2"); 0.11 hides the old name (shown
  only with ``--show-hidden-metrics-for-version``), 0.12 removes it (PR 29330).
- 0.10.1 onward: error bodies are ``{"error": {message, type, param, code}}`` (PR 22099); before,
  flat ``{"object": "error", message, type, param, code}``.
- 0.10.2 onward: ``vllm:inter_token_latency_seconds`` beside ``time_per_output_token_seconds``
  (whose help says DEPRECATED from then; vLLM's comment "Deprecated in 0.11"); 0.12 hides the
  old name; 0.12 adds ``vllm:request_time_per_output_token_seconds`` (per-request mean TPOT).
- Every release here: ``vllm:num_requests_running|waiting``, ``vllm:lora_requests_info`` with the
  labels ``max_lora``, ``waiting_lora_adapters``, ``running_lora_adapters``,
  ``vllm:cache_config_info``, the counters, and the histograms TTFT, e2e, queue, prefill, decode,
  inference time (``request_latency_buckets``), ``request_prompt_tokens`` /
  ``request_generation_tokens`` / ``request_max_num_generation_tokens`` /
  ``request_params_max_tokens`` (1-2-5 buckets up to max_model_len), ``request_params_n``.

Every series carries ``model_name`` (the served model name) and ``engine`` ("0"); counters are
exposed with vLLM's ``_total`` names. Values come from the engine's virtual-clock events, in
*twin* seconds (what the GPU would show), whatever ``--time-scale`` is. Per-request times follow
vLLM's ``RequestStateStats``: queue = first scheduled - arrival, prefill = first token - first
scheduled, decode = last token - first token, inference = last token - first scheduled, e2e =
finish - arrival; a prompt is counted once, when its first token is out, and
``iteration_tokens_total`` observes, per step, the prompt tokens of requests that got their first
token plus the tokens generated. Counters and histograms are updated once per engine step from
its :class:`~twin.serve.engine.StepRecord`; gauges are read from the engine when scraped. The
histograms are plain bucket counts exported through a custom collector (cheaper per token than
prometheus_client's objects). Not exported: prefix-cache counters (the twin has no prefix
caching), speculative-decoding and KV-connector series, ``engine_sleep_state``, the opt-in KV
residency histograms, and ``_created`` samples.

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

import re
import time
from bisect import bisect_left
from dataclasses import dataclass
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
                10.0, 20.0, 40.0, 80.0)       # also inter-token latency and per-request TPOT
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
               120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)   # vLLM's request_latency_buckets
ITERATION_TOKENS_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
N_BUCKETS = (1, 2, 5, 10, 20)
# vLLM V1's default CUDA-graph capture sizes (0.8.x): the iteration_tokens_total buckets there
CUDAGRAPH_CAPTURE_SIZES = (1, 2, 4) + tuple(range(8, 513, 8))

MIN_VLLM_VERSION = (0, 8, 0)
NEWEST_CHECKED = (0, 12, 0)


def build_1_2_5_buckets(max_value: int) -> tuple[int, ...]:
    """1, 2, 5, 10, 20, 50, ... up to ``max_value`` (vLLM's token-count histogram buckets)."""
    out, exp = [], 0
    while True:
        for m in (1, 2, 5):
            v = m * 10 ** exp
            if v > max_value:
                return tuple(out)
            out.append(v)
        exp += 1


@dataclass(frozen=True)
class VllmRelease:
    """The vLLM release ``twin serve`` speaks: metric names, buckets and error-body shape where
    releases differ (see the module docstring for what was read)."""

    version: str
    key: tuple[int, int, int]

    @classmethod
    def parse(cls, text: str) -> "VllmRelease":
        """``"0.8.5"`` (also ``v0.8.5``, ``0.10.1.post1``, ``0.9``); ``ValueError`` if it is not a
        version or is older than 0.8.0 (V0 engine, not modelled)."""
        m = re.fullmatch(r"v?(\d{1,4})\.(\d{1,4})(?:\.(\d{1,4}))?((?:\.?(?:post|rc|dev)\d*)*)",
                         str(text).strip())
        if not m:
            raise ValueError(f"expected a vLLM release such as 0.8.5, got {text!r}")
        key = (int(m[1]), int(m[2]), int(m[3] or 0))
        if key < MIN_VLLM_VERSION:
            raise ValueError(f"{text}: releases before 0.8.0 default to the V0 engine, which the "
                             "twin does not model (0.8.0 or later)")
        return cls(str(text).strip().lstrip("v"), key)

    @property
    def gpu_cache_usage(self) -> bool:          # deprecated 0.9.2, hidden 0.11, removed 0.12
        return self.key < (0, 11, 0)

    @property
    def kv_cache_usage(self) -> bool:
        return self.key >= (0, 9, 2)

    @property
    def time_per_output_token(self) -> bool:    # deprecated 0.10.2/0.11, hidden 0.12
        return self.key < (0, 12, 0)

    @property
    def inter_token_latency(self) -> bool:
        return self.key >= (0, 10, 2)

    @property
    def request_time_per_output_token(self) -> bool:
        return self.key >= (0, 12, 0)

    @property
    def nested_error(self) -> bool:             # ErrorResponse(error=ErrorInfo(...)), PR 22099
        return self.key >= (0, 10, 1)

    def iteration_tokens_buckets(self, max_num_batched_tokens: int) -> tuple[int, ...]:
        if self.key < (0, 9, 0):
            return tuple(b for b in CUDAGRAPH_CAPTURE_SIZES if b <= max_num_batched_tokens)
        return ITERATION_TOKENS_BUCKETS

    def metric_names(self, lora: bool = True) -> list[str]:
        """The metric family names ``/metrics`` exposes for this release (histograms and
        counters by family name, as a Prometheus parser reports them)."""
        names = ["vllm:num_requests_running", "vllm:num_requests_waiting"]
        names += ["vllm:gpu_cache_usage_perc"] * self.gpu_cache_usage
        names += ["vllm:kv_cache_usage_perc"] * self.kv_cache_usage
        names += ["vllm:num_preemptions", "vllm:prompt_tokens", "vllm:generation_tokens",
                  "vllm:request_success", "vllm:request_prompt_tokens",
                  "vllm:request_generation_tokens", "vllm:iteration_tokens_total",
                  "vllm:request_max_num_generation_tokens", "vllm:request_params_n",
                  "vllm:request_params_max_tokens", "vllm:time_to_first_token_seconds"]
        names += ["vllm:time_per_output_token_seconds"] * self.time_per_output_token
        names += ["vllm:inter_token_latency_seconds"] * self.inter_token_latency
        names += ["vllm:request_time_per_output_token_seconds"] * \
            self.request_time_per_output_token
        names += ["vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds",
                  "vllm:request_inference_time_seconds", "vllm:request_prefill_time_seconds",
                  "vllm:request_decode_time_seconds"]
        names += ["vllm:lora_requests_info"] * lora
        names += ["vllm:cache_config_info", "twin:virtual_clock_lag_seconds"]
        return names


class BucketHistogram:
    """Counts per bucket (Prometheus ``le`` semantics), sum and count."""

    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.bounds = tuple(float(b) for b in buckets)
        self.counts = [0] * (len(buckets) + 1)
        self.total = 0.0

    def observe(self, v: float) -> None:
        self.counts[bisect_left(self.bounds, v)] += 1
        self.total += v

    def cumulative(self) -> list[tuple[str, int]]:
        out, acc = [], 0
        for b, c in zip(self.bounds, self.counts):
            acc += c
            out.append((repr(b), acc))
        out.append(("+Inf", acc + self.counts[-1]))
        return out


class ServeMetrics:
    """Accumulates vLLM's counters and histograms from engine steps and renders ``/metrics``."""

    def __init__(self, core: "EngineCore", model_name: str, adapter_names: dict[int, str],
                 lag_s: Callable[[], float] = lambda: 0.0, cache_info: dict | None = None,
                 release: VllmRelease | None = None) -> None:
        self.core = core
        self.model_name = model_name
        self.adapter_names = adapter_names
        self.lag_s = lag_s
        self.cache_info = cache_info or {}
        self.release = release or VllmRelease.parse("0.8.5")
        s = core.settings
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.preemptions = 0
        self.success = {"stop": 0, "length": 0, "abort": 0}
        tokens = build_1_2_5_buckets(s.max_model_len)
        H = BucketHistogram
        # (name, help, histogram) in vLLM's order; the release picks which are exposed
        self.ttft, self.itl, self.req_tpot = H(TTFT_BUCKETS), H(TPOT_BUCKETS), H(TPOT_BUCKETS)
        self.e2e, self.queue, self.prefill = H(E2E_BUCKETS), H(E2E_BUCKETS), H(E2E_BUCKETS)
        self.decode, self.inference = H(E2E_BUCKETS), H(E2E_BUCKETS)
        self.req_prompt, self.req_gen = H(tokens), H(tokens)
        self.req_max_gen, self.req_max_tokens, self.req_n = H(tokens), H(tokens), H(N_BUCKETS)
        self.iteration = H(self.release.iteration_tokens_buckets(s.max_num_batched_tokens))
        self.tpot = self.itl          # time_per_output_token = inter-token latency (vLLM V1)
        r = self.release
        hist = [
            ("vllm:request_prompt_tokens", "Number of prefill tokens processed.", self.req_prompt),
            ("vllm:request_generation_tokens", "Number of generation tokens processed.",
             self.req_gen),
            ("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.",
             self.iteration),
            ("vllm:request_max_num_generation_tokens",
             "Histogram of maximum number of requested generation tokens.", self.req_max_gen),
            ("vllm:request_params_n", "Histogram of the n request parameter.", self.req_n),
            ("vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.",
             self.req_max_tokens),
            ("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
             self.ttft)]
        if r.time_per_output_token:
            hist.append(("vllm:time_per_output_token_seconds",
                         "Histogram of time per output token in seconds." +
                         ("DEPRECATED: Use vllm:inter_token_latency_seconds instead."
                          if r.inter_token_latency else ""), self.itl))
        if r.inter_token_latency:
            hist.append(("vllm:inter_token_latency_seconds",
                         "Histogram of inter-token latency in seconds.", self.itl))
        if r.request_time_per_output_token:
            hist.append(("vllm:request_time_per_output_token_seconds",
                         "Histogram of time_per_output_token_seconds per request.",
                         self.req_tpot))
        hist += [
            ("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
             self.e2e),
            ("vllm:request_queue_time_seconds",
             "Histogram of time spent in WAITING phase for request.", self.queue),
            ("vllm:request_inference_time_seconds",
             "Histogram of time spent in RUNNING phase for request.", self.inference),
            ("vllm:request_prefill_time_seconds",
             "Histogram of time spent in PREFILL phase for request.", self.prefill),
            ("vllm:request_decode_time_seconds",
             "Histogram of time spent in DECODE phase for request.", self.decode)]
        self.histograms = hist
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    def record_step(self, rec: StepRecord) -> None:
        """Count one released step (vLLM counts a prompt once, when its first token is out)."""
        self.preemptions += rec.preemptions
        n_gen = len(rec.emitted)
        self.generation_tokens += n_gen
        n_prompt = 0
        for req in rec.first_tokens:
            n_prompt += req.in_len
            self.ttft.observe(req.first_t - req.arrival)
            self.req_n.observe(1)
            self.req_max_gen.observe(_max_tokens_param(req))
        self.prompt_tokens += n_prompt
        if n_prompt or n_gen:
            self.iteration.observe(n_prompt + n_gen)
        for gap in rec.itl_gaps:
            self.itl.observe(gap)
        for req in rec.finished:
            reason = getattr(req.tag, "finish_reason", "length")
            self.success[reason] = self.success.get(reason, 0) + 1
            self.e2e.observe(req.finish_t - req.arrival)
            self.queue.observe(req.scheduled_t - req.arrival)
            self.prefill.observe(req.first_t - req.scheduled_t)
            decode = req.finish_t - req.first_t
            self.decode.observe(decode)
            self.inference.observe(req.finish_t - req.scheduled_t)
            self.req_prompt.observe(req.in_len)
            self.req_gen.observe(req.generated)
            self.req_tpot.observe(decode / (req.generated - 1) if req.generated > 1 else 0.0)
            self.req_max_tokens.observe(_max_tokens_param(req))

    def render(self) -> bytes:
        return generate_latest(self.registry)

    # prometheus_client collector protocol
    def collect(self):
        lab, val = ["model_name", "engine"], [self.model_name, "0"]
        core = self.core
        kv = core.kv
        r = self.release
        yield _gauge("vllm:num_requests_running", "Number of requests in model execution batches.",
                     lab, val, len(core.sched.running))
        yield _gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
                     lab, val, core.n_waiting())
        usage = kv.used_blocks / kv.total_blocks
        if r.gpu_cache_usage:
            yield _gauge("vllm:gpu_cache_usage_perc",
                         "GPU KV-cache usage. 1 means 100 percent usage." +
                         ("DEPRECATED: Use vllm:kv_cache_usage_perc instead."
                          if r.kv_cache_usage else ""), lab, val, usage)
        if r.kv_cache_usage:
            yield _gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
                         lab, val, usage)
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
        for name, doc, h in self.histograms:
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


def _max_tokens_param(req) -> int:
    """The request's ``max_tokens`` as sent (or defaulted), not the drawn output length."""
    return int(getattr(req.tag, "max_tokens_param", 0) or req.out_len)


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
