"""Async OpenAI-completions client that times every streamed token, and a Prometheus scraper.

It speaks the interface real vLLM 0.8.5 and ``python -m twin serve`` share: ``POST
/v1/completions`` with the prompt as a list of token ids (exact input length), ``max_tokens``
with ``ignore_eos`` (exact output length) and ``stream`` (one SSE chunk per token, then ``data:
[DONE]``); ``GET /metrics`` in Prometheus text. Times are ``time.perf_counter()`` seconds; the
caller turns them into twin time (``time_scale``).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from dataclasses import dataclass
from typing import Sequence

import aiohttp
import numpy as np

# the socket timeout of one streamed request: far above any step, so only a dead server trips it
READ_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class RequestResult:
    """Client-side timing of one streamed completion (perf_counter seconds).

    ``token_t`` holds the arrival time of every chunk that carried a token; ``ok`` is False for
    a failed or cancelled request (``error`` says why). ``server_arrival_s`` / ``server_ttft_s``
    are the arrival time and TTFT ``twin serve`` reports in its last chunk (``twin_timing``,
    twin seconds on the server's own clock); real vLLM reports neither."""

    index: int
    send_t: float
    token_t: tuple[float, ...]
    finish_t: float | None
    output_tokens: int
    ok: bool
    error: str = ""
    server_arrival_s: float | None = None   # twin serve only: arrival on the server's clock
    server_ttft_s: float | None = None      # twin serve only: TTFT in twin seconds

    @property
    def first_t(self) -> float | None:
        return self.token_t[0] if self.token_t else None


def completion_body(model: str, prompt: str | Sequence[int], max_tokens: int) -> dict:
    """The request body: the prompt (token ids: exact input length; or a text from a prompt
    file), exact output length (``ignore_eos``), greedy."""
    body_prompt = prompt if isinstance(prompt, str) else [int(t) for t in prompt]
    return {"model": model, "prompt": body_prompt, "max_tokens": int(max_tokens),
            "min_tokens": int(max_tokens), "ignore_eos": True, "temperature": 0.0,
            "stream": True, "stream_options": {"include_usage": True}}


async def stream_completion(session: aiohttp.ClientSession, base_url: str, index: int,
                            model: str, prompt: str | Sequence[int], max_tokens: int
                            ) -> RequestResult:
    """Send one streamed completion and time its tokens; never raises for server errors
    (they come back as ``ok=False`` with the status and body), only for cancellation."""
    tokens: list[float] = []
    usage_tokens = 0
    server_arrival = server_ttft = None
    send_t = time.perf_counter()
    try:
        async with session.post(f"{base_url}/v1/completions",
                                json=completion_body(model, prompt, max_tokens)) as resp:
            if resp.status != 200:
                body = (await resp.text())[:300]
                return RequestResult(index, send_t, (), None, 0, False,
                                     f"HTTP {resp.status}: {body}")
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    break
                now = time.perf_counter()
                chunk = json.loads(payload)
                usage = chunk.get("usage")
                if usage and usage.get("completion_tokens"):
                    usage_tokens = int(usage["completion_tokens"])
                timing = chunk.get("twin_timing")
                if isinstance(timing, dict) and "arrival_s" in timing:
                    server_arrival = float(timing["arrival_s"])
                    server_ttft = float(timing.get("ttft_s", float("nan")))
                if chunk.get("choices"):
                    tokens.append(now)
        finish = tokens[-1] if tokens else time.perf_counter()
        n = max(usage_tokens, len(tokens))
        ok = n >= max_tokens
        return RequestResult(index, send_t, tuple(tokens), finish, n, ok,
                             "" if ok else f"stream ended after {n} of {max_tokens} tokens",
                             server_arrival, server_ttft)
    except (aiohttp.ClientError, asyncio.TimeoutError, json.JSONDecodeError) as e:
        return RequestResult(index, send_t, tuple(tokens), None, len(tokens), False,
                             f"{type(e).__name__}: {e}")


@dataclass(frozen=True)
class PlannedRequest:
    """One request to send: when (seconds after the run starts, wall time), where, what."""

    index: int
    send_at_s: float
    base_url: str
    model: str
    prompt: str | tuple[int, ...]      # token ids, or a text from a prompt file
    max_tokens: int


async def replay(planned: Sequence[PlannedRequest], window_s: float, progress=None
                 ) -> tuple[float, list[RequestResult]]:
    """Send every request at its time (open loop: a slow server does not slow the arrivals) and
    stop at ``window_s`` wall seconds: requests not yet sent are not sent, requests still
    streaming are cancelled (recorded ``ok=False``). Returns (run start perf_counter, results in
    ``planned`` order of those sent)."""
    planned = sorted(planned, key=lambda p: p.send_at_s)
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=READ_TIMEOUT_S, sock_connect=30)
    tasks: list[asyncio.Task] = []
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        t0 = time.perf_counter()
        deadline = t0 + window_s
        for p in planned:
            at = t0 + p.send_at_s
            if at >= deadline:
                break
            delay = at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.ensure_future(stream_completion(
                session, p.base_url, p.index, p.model, p.prompt, p.max_tokens)))
            if progress is not None:
                progress.update(1)
        remaining = deadline - time.perf_counter()
        if tasks and remaining > 0:
            await asyncio.wait(tasks, timeout=remaining)
        results: list[RequestResult] = []
        for task, p in zip(tasks, planned):
            if task.done() and task.exception() is None:
                results.append(task.result())
            elif task.done():
                results.append(RequestResult(p.index, t0 + p.send_at_s, (), None, 0, False,
                                             f"client error: {task.exception()!r}"))
            else:
                task.cancel()
                results.append(RequestResult(p.index, float("nan"), (), None, 0, False,
                                             "cancelled at the window end"))
        await asyncio.gather(*tasks, return_exceptions=True)
    # cancelled requests: their send time is the planned one (they were sent)
    results = [r if r.ok or not np.isnan(r.send_t) else
               RequestResult(r.index, t0 + planned[i].send_at_s, r.token_t, None, 0, False, r.error)
               for i, r in enumerate(results)]
    return t0, results


# ---------------------------------------------------------------------------- /metrics
_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_prometheus(text: str) -> list[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of every sample line of a Prometheus text exposition."""
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        try:
            value = float(m.group(4))
        except ValueError:
            continue
        out.append((m.group(1), dict(_LABEL.findall(m.group(3) or "")), value))
    return out


def metric_value(samples, name: str, default: float | None = None) -> float | None:
    """Sum of the samples called ``name`` (over label sets, e.g. one per model name)."""
    vals = [v for n, _, v in samples if n == name]
    return float(sum(vals)) if vals else default


def metric_labels(samples, name: str) -> dict[str, str] | None:
    """Labels of the first sample called ``name`` (info metrics such as cache_config_info)."""
    for n, labels, _ in samples:
        if n == name:
            return labels
    return None


KV_LOG_LINE = re.compile(r"GPU KV cache size: ([0-9,]+) tokens")


def kv_cache_tokens(samples, log_text: str | None = None) -> int | None:
    """A server's KV capacity in tokens: ``num_gpu_blocks x block_size`` of
    ``vllm:cache_config_info``; when ``num_gpu_blocks`` is not a number (vLLM 0.8.5's V1
    engine reports ``"None"`` there: its stat loggers are built before the KV cache is sized),
    the last ``GPU KV cache size: N tokens`` line of the server's log, if given; else None."""
    cc = metric_labels(samples, "vllm:cache_config_info") or {}
    try:
        return int(float(cc["num_gpu_blocks"])) * int(float(cc["block_size"]))
    except (KeyError, ValueError):
        pass
    hits = KV_LOG_LINE.findall(log_text or "")
    return int(hits[-1].replace(",", "")) if hits else None


async def fetch_text(session: aiohttp.ClientSession, url: str) -> str:
    async with session.get(url) as resp:
        if resp.status != 200:
            raise ValueError(f"{url}: HTTP {resp.status}")
        return await resp.text()


def get_json(url: str, timeout_s: float = 30.0) -> dict:
    """Blocking GET of a JSON document (``/v1/models``); a clear error naming the URL, also
    when something answers that is not an OpenAI-compatible server (a body that is not JSON:
    what came back is quoted)."""
    async def go():
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as s:
            async with s.get(url) as resp:
                text = await resp.text(errors="replace")
                if resp.status != 200:
                    raise ValueError(f"{url}: HTTP {resp.status}: {text[:200]!r}")
                return resp.headers.get("Content-Type", "no content type"), text
    try:
        ctype, text = asyncio.run(go())
    except (aiohttp.ClientError, asyncio.TimeoutError) as e:
        raise ValueError(f"{url}: {type(e).__name__}: {e}") from None
    try:
        return json.loads(text)
    except ValueError:
        raise ValueError(f"{url}: not a vLLM server: the answer is not JSON ({ctype}, "
                         f"{len(text)} characters: {text[:80]!r})") from None


def scrape_metrics(base_url: str, timeout_s: float = 30.0
                   ) -> list[tuple[str, dict[str, str], float]]:
    """Blocking scrape of ``base_url/metrics``."""
    async def go():
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as s:
            return await fetch_text(s, f"{base_url}/metrics")
    try:
        return parse_prometheus(asyncio.run(go()))
    except (aiohttp.ClientError, asyncio.TimeoutError) as e:
        raise ValueError(f"{base_url}/metrics: {type(e).__name__}: {e}") from None


def post_json(url: str, body: dict, timeout_s: float = 60.0) -> tuple[int, str]:
    """Blocking POST of a JSON body; (status, response text)."""
    async def go():
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as s:
            async with s.post(url, json=body) as resp:
                return resp.status, await resp.text()
    try:
        return asyncio.run(go())
    except (aiohttp.ClientError, asyncio.TimeoutError) as e:
        raise ValueError(f"{url}: {type(e).__name__}: {e}") from None


def served_models(base_url: str) -> tuple[str | None, set[str]]:
    """(base model id, LoRA adapter ids) listed by ``/v1/models`` (adapters have a ``parent``
    other than themselves, as in vLLM)."""
    url = f"{base_url}/v1/models"
    doc = get_json(url)
    data = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(data, list) or not all(isinstance(m, dict) for m in data):
        raise ValueError(f"{url}: not a vLLM server: expected {{\"data\": [models]}}, got "
                         f"{json.dumps(doc)[:80]!r}")
    base = None
    loras = set()
    for m in data:
        mid = m.get("id")
        parent = m.get("parent")
        if parent and parent != mid:
            loras.add(mid)
        elif base is None:
            base = mid
    return base, loras
