"""HTTP side of ``twin serve``: vLLM's OpenAI-compatible routes on top of the online twin engine.

Routes (as vLLM 0.8.5): ``GET /health``, ``GET|POST /ping`` (SageMaker's health route),
``GET /version`` (``{"version": <--vllm-version>}``), ``GET /v1/models``,
``POST /v1/completions``, ``POST /v1/chat/completions``, ``POST /v1/load_lora_adapter``,
``POST /v1/unload_lora_adapter`` (runtime LoRA updating is always allowed, as with
``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``) and ``GET /metrics``. Errors use vLLM's JSON: flat
``{"object": "error", "message", "type", "param", "code"}`` up to vLLM 0.10.0, nested
``{"error": {...}}`` from 0.10.1 (``--vllm-version``). Request bodies are checked as vLLM checks
them, field by field (:mod:`twin.serve.validate`): every field is honoured, accepted as not
modelled (named in the ``X-Twin-Not-Modelled`` response header) or refused by name.

Token counts. A prompt given as a list of token ids counts exactly. A text prompt is estimated
deterministically as ceil(UTF-8 bytes / 4) tokens (about 4 bytes per token for English text with
Llama-3's tokenizer); a chat adds 4 tokens per message (role header and end-of-turn) and 4 for
the start of text and the assistant header. ``usage.prompt_tokens_source`` says which rule was
used (``"token_ids"`` or ``"estimate_utf8_bytes_div_4"``).

Output length. Exactly ``max_tokens`` when ``ignore_eos`` is true or ``min_tokens >= max_tokens``
(``finish_reason: "length"``). Otherwise the twin's ShareGPT-like output length model is drawn
(seeded by ``--seed``, one draw per request in arrival order), raised to ``min_tokens`` and capped
at ``max_tokens`` (``"length"`` when capped, else ``"stop"``). ``max_tokens`` defaults to 16 for
completions (as the OpenAI API) and to the room left in ``max_model_len`` for chat. Every token's
text is the same dummy token: timing is what the twin models.

Timing is twin time: a token is sent when the virtual clock reaches the end of the engine step
that produced it; ``--time-scale X`` runs that clock X times faster than wall time. Non-streamed
responses, and the usage chunk of streamed ones (``stream_options.include_usage``), add
``twin_timing``: arrival, TTFT and end-to-end latency in twin seconds.
"""

from __future__ import annotations

import asyncio
import json
import math
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from aiohttp import web

from ..limits import TIME_SCALE_RANGE
from ..profile import GpuProfile
from .adapters import AdapterError, AdapterRegistry
from .engine import BASE_MODEL, EngineCore, EngineRequest, EngineSettings, WallClockEngine
from .metrics import CONTENT_TYPE, ServeMetrics, VllmRelease, cache_config_info
from .validate import RequestError, check_request, parse_body

DUMMY_TOKEN = " tok"
COMPLETIONS_DEFAULT_MAX_TOKENS = 16
BYTES_PER_TOKEN = 4
CHAT_TOKENS_PER_MESSAGE = 4
CHAT_TOKENS_FIXED = 4


@dataclass(frozen=True)
class ServeConfig:
    """Flags of ``twin serve`` (they mirror ``vllm serve``), resolved and checked by the CLI.

    ``max_loras == 0`` when LoRA is disabled (no ``--enable-lora``)."""

    profile: GpuProfile
    served_model_name: str
    max_loras: int = 1
    max_lora_rank: int = 16
    max_cpu_loras: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    lora_modules: tuple[tuple[str, str], ...] = ()
    time_scale: float = 1.0
    seed: int = 0
    host: str = "127.0.0.1"
    port: int = 8000
    vllm_version: str = "0.8.5"
    vocab_size: int | None = None     # token ids >= this are refused (None: the profile
    # model's vocabulary, twin/data/models.json; unchecked for a model without a config)

    def __post_init__(self) -> None:
        def bad(field: str, why: str) -> ValueError:
            return ValueError(f"ServeConfig.{field}: {why}, got {getattr(self, field)!r}")

        if not isinstance(self.served_model_name, str) or not self.served_model_name.strip():
            raise bad("served_model_name", "must be a non-empty string")
        for name, lo in (("max_loras", 0), ("max_lora_rank", 1), ("seed", 0)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise bad(name, f"must be an integer >= {lo}")
        for name in ("max_cpu_loras", "max_num_seqs", "max_num_batched_tokens"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise bad(name, "must be an integer >= 1 or None")
        if self.max_cpu_loras is not None and self.max_cpu_loras < self.max_loras:
            raise bad("max_cpu_loras", f"must be >= max_loras {self.max_loras}")
        if not (isinstance(self.time_scale, (int, float)) and math.isfinite(self.time_scale)
                and TIME_SCALE_RANGE[0] <= self.time_scale <= TIME_SCALE_RANGE[1]):
            raise bad("time_scale", f"must be a number in [{TIME_SCALE_RANGE[0]:g}, "
                                    f"{TIME_SCALE_RANGE[1]:g}]")
        if isinstance(self.port, bool) or not isinstance(self.port, int) \
                or not 0 <= self.port <= 65535:
            raise bad("port", "must be an integer in [0, 65535]")
        if self.lora_modules and self.max_loras == 0:
            raise bad("lora_modules", "need LoRA enabled (max_loras >= 1)")
        try:
            VllmRelease.parse(self.vllm_version)
        except ValueError as e:
            raise bad("vllm_version", str(e)) from None
        if self.vocab_size is not None and (isinstance(self.vocab_size, bool) or not isinstance(
                self.vocab_size, int) or self.vocab_size < 1):
            raise bad("vocab_size", "must be an integer >= 1 or None")

    @property
    def lora_enabled(self) -> bool:
        return self.max_loras > 0


def model_vocab(profile: GpuProfile) -> int | None:
    """Vocabulary size of the profile's base model (``twin.model_configs``), None if unknown."""
    from ..model_configs import ModelConfigError, model_config

    try:
        return model_config(profile.model).vocab_size
    except (ModelConfigError, OSError, ValueError):
        return None


def estimate_text_tokens(text: str) -> int:
    """Deterministic prompt-length estimate of a text: ceil(UTF-8 bytes / 4), at least 1."""
    return max(1, math.ceil(len(text.encode("utf-8")) / BYTES_PER_TOKEN))


class OutputLengths:
    """Seeded draws of the twin's ShareGPT-like output length, one per request in order."""

    def __init__(self, seed: int, batch: int = 1024) -> None:
        from ..sharegpt import default_lengths

        self.model = default_lengths()
        self.rng = np.random.default_rng(seed)
        self.batch = batch
        self.pool: list[int] = []

    def draw(self) -> int:
        if not self.pool:
            _, out = self.model.sample(self.batch, self.rng)
            self.pool = [int(x) for x in out[::-1]]
        return self.pool.pop()


class ApiError(RequestError):
    """An error answered with vLLM's error JSON (``param``: the field it names, if any)."""

    def __init__(self, status: int, message: str, kind: str = "BadRequestError",
                 param: str | None = None) -> None:
        super().__init__(param, message, status, kind)


def error_response(e: RequestError, nested: bool = False) -> web.Response:
    """vLLM's ``ErrorResponse``: flat (up to 0.10.0) or ``{"error": ...}`` (0.10.1 on)."""
    info = {"message": e.message, "type": e.kind, "param": e.param, "code": e.status}
    body = {"error": info} if nested else {"object": "error", **info}
    return web.json_response(body, status=e.status)


@dataclass(eq=False)
class Ticket:
    """HTTP-side state of one request: tokens released to the client so far."""

    max_tokens: int
    finish_reason: str = "length"
    max_tokens_param: int = 0          # max_tokens as requested (or defaulted), for /metrics
    released: int = 0
    done: bool = False
    event: asyncio.Event = field(default_factory=asyncio.Event)


def _on_token(req: EngineRequest) -> None:
    t: Ticket = req.tag
    t.released = req.generated
    t.done = req.finished
    t.event.set()


class TwinServer:
    """The aiohttp application around one :class:`WallClockEngine`."""

    def __init__(self, cfg: ServeConfig) -> None:
        self.cfg = cfg
        p = cfg.profile
        self.settings = EngineSettings.from_profile(p, cfg.max_loras, cfg.max_lora_rank,
                                                    cfg.max_num_seqs, cfg.max_num_batched_tokens)
        self.registry = AdapterRegistry(p, cfg.max_lora_rank, cfg.served_model_name)
        self.core = EngineCore(self.settings)
        for name, path in cfg.lora_modules:
            mod = self.registry.add(name, path, f"--lora-modules {name}={path}")
            self.core.register_adapter(mod.adapter_id, self.registry.load_ms(mod), mod.name)
        self.lengths = OutputLengths(cfg.seed)
        self.release = VllmRelease.parse(cfg.vllm_version)
        self.vocab_size = cfg.vocab_size if cfg.vocab_size is not None else model_vocab(p)
        self.created = int(time.time())
        self.engine: WallClockEngine | None = None
        self.metrics: ServeMetrics | None = None
        self.runner: web.AppRunner | None = None
        self.address: tuple[str, int] | None = None

    # ------------------------------------------------------------------ lifecycle
    def build_app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 2**20)
        app.add_routes([
            web.get("/health", self.health),
            web.get("/ping", self.health),
            web.post("/ping", self.health),
            web.get("/version", self.version),
            web.get("/v1/models", self.models),
            web.post("/v1/completions", self.completions),
            web.post("/v1/chat/completions", self.chat_completions),
            web.post("/v1/load_lora_adapter", self.load_lora),
            web.post("/v1/unload_lora_adapter", self.unload_lora),
            web.get("/metrics", self.metrics_route),
        ])
        return app

    async def start(self) -> tuple[str, int]:
        """Start the engine task and listen; return the bound (host, port)."""
        self.engine = WallClockEngine(self.core, self.cfg.time_scale)
        self.metrics = ServeMetrics(
            self.core, self.cfg.served_model_name, self.registry.name_of,
            lag_s=lambda: self.engine.lag_s,
            cache_info=cache_config_info(self.settings.block_size, self.settings.kv_blocks),
            release=self.release)
        self.engine.on_step = self.metrics.record_step
        self.engine.start()
        self.runner = web.AppRunner(self.build_app(), handler_cancellation=True,
                                    access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, self.cfg.host, self.cfg.port)
        await site.start()
        host, port = self.runner.addresses[0][:2]
        self.address = (host, int(port))
        return self.address

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None
        if self.engine is not None:
            await self.engine.stop()

    # ------------------------------------------------------------------ simple routes
    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": self.release.version})

    def _err(self, e: RequestError) -> web.Response:
        return error_response(e, self.release.nested_error)

    async def models(self, request: web.Request) -> web.Response:
        perm = [{"id": f"modelperm-{secrets.token_hex(8)}", "object": "model_permission",
                 "created": self.created, "allow_create_engine": False, "allow_sampling": True,
                 "allow_logprobs": True, "allow_search_indices": False, "allow_view": True,
                 "allow_fine_tuning": False, "organization": "*", "group": None,
                 "is_blocking": False}]
        data = [{"id": self.cfg.served_model_name, "object": "model", "created": self.created,
                 "owned_by": "vllm", "root": self.cfg.profile.model, "parent": None,
                 "max_model_len": self.settings.max_model_len, "permission": perm}]
        for mod in self.registry.by_name.values():
            data.append({"id": mod.name, "object": "model", "created": self.created,
                         "owned_by": "vllm", "root": mod.path,
                         "parent": self.cfg.served_model_name, "max_model_len": None,
                         "permission": perm})
        return web.json_response({"object": "list", "data": data})

    async def metrics_route(self, request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.render(), headers={"Content-Type": CONTENT_TYPE})

    # ------------------------------------------------------------------ LoRA management
    async def load_lora(self, request: web.Request) -> web.Response:
        try:
            body = await _json_body(request)
            name, path = body.get("lora_name"), body.get("lora_path")
            _check_str_fields(body, ("lora_name", "lora_path"))
            if not name or not path:
                raise ApiError(400, "Both 'lora_name' and 'lora_path' must be provided.",
                               "InvalidUserInput")
            if name in self.registry.by_name:
                raise ApiError(400, f"The lora adapter '{name}' has already been loaded.",
                               "InvalidUserInput")
            if not self.cfg.lora_enabled:
                raise ApiError(400, "LoRA is not enabled: start twin serve with --enable-lora.")
            if not Path(path).exists():   # vLLM: "No adapter found" -> 404 NotFoundError
                raise ApiError(404, f"Loading lora {name} failed: No adapter found for {path}",
                               "NotFoundError")
            try:
                mod = self.registry.add(name, path)
            except AdapterError as e:
                raise ApiError(400, str(e)) from None
            self.core.register_adapter(mod.adapter_id, self.registry.load_ms(mod), mod.name)
        except RequestError as e:
            return self._err(e)
        return web.Response(text=f"Success: LoRA adapter '{name}' added successfully.")

    async def unload_lora(self, request: web.Request) -> web.Response:
        try:
            body = await _json_body(request)
            _check_str_fields(body, ("lora_name",))
            name = body["lora_name"]
            if not name and not body.get("lora_int_id"):
                raise ApiError(400, "either 'lora_name' and 'lora_int_id' needs to be provided.",
                               "InvalidUserInput")
            try:
                mod = self.registry.remove(name)
            except KeyError:
                raise ApiError(404, f"The lora adapter '{name}' cannot be found.",
                               "NotFoundError") from None
            self.core.evict_adapter(mod.adapter_id)
        except RequestError as e:
            return self._err(e)
        return web.Response(text=f"Success: LoRA adapter '{name}' removed successfully.")

    # ------------------------------------------------------------------ generation
    def _adapter_of(self, model: Any) -> int:
        if model == self.cfg.served_model_name or model is None:
            return BASE_MODEL
        mod = self.registry.by_name.get(model) if isinstance(model, str) else None
        if mod is None:
            raise ApiError(404, f"The model `{model}` does not exist.", "NotFoundError")
        return mod.adapter_id

    def _lengths(self, body: dict, prompt_len: int, default_max: int | None, chat: bool
                 ) -> Ticket:
        field = "max_tokens"
        max_tokens = body.get("max_tokens")
        if chat and body.get("max_completion_tokens") is not None:
            field, max_tokens = "max_completion_tokens", body["max_completion_tokens"]
        if max_tokens is None:
            max_tokens = default_max
        room = self.settings.max_model_len - prompt_len
        if prompt_len > self.settings.max_model_len:
            raise ApiError(400, f"prompt: Prompt length of {prompt_len} is longer than the "
                                f"maximum model length of {self.settings.max_model_len}.",
                           param="prompt")
        if max_tokens is None:
            max_tokens = room
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ApiError(400, f"{field}: max_tokens must be at least 1, got {max_tokens!r}.",
                           param=field)
        if prompt_len + max_tokens > self.settings.max_model_len:
            raise ApiError(400, f"This model's maximum context length is "
                                f"{self.settings.max_model_len} tokens. However, you requested "
                                f"{prompt_len + max_tokens} tokens ({prompt_len} in the messages, "
                                f"{max_tokens} in the completion). Please reduce the length of "
                                "the messages or completion.", param=field)
        min_tokens = body.get("min_tokens", 0) or 0
        if min_tokens > max_tokens:
            raise ApiError(400, f"min_tokens: min_tokens must be less than or equal to "
                                f"max_tokens={max_tokens}, got {min_tokens}.", param="min_tokens")
        ignore_eos = body.get("ignore_eos") or False
        if ignore_eos or min_tokens >= max_tokens:
            return Ticket(max_tokens, "length", max_tokens_param=max_tokens)
        n = min(max(self.lengths.draw(), min_tokens, 1), max_tokens)
        return Ticket(n, "length" if n == max_tokens else "stop", max_tokens_param=max_tokens)

    def _truncate(self, body: dict, prompt_len: int) -> int:
        """``truncate_prompt_tokens`` k keeps the last k prompt tokens (vLLM)."""
        k = body.get("truncate_prompt_tokens")
        return prompt_len if k is None else min(prompt_len, k)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await _json_body(request)
            notes = check_request(body, chat=False)
            adapter = self._adapter_of(body.get("model"))
            prompt_len, source = _prompt_tokens(body.get("prompt"), self.vocab_size)
            prompt_len = self._truncate(body, prompt_len)
            ticket = self._lengths(body, prompt_len, COMPLETIONS_DEFAULT_MAX_TOKENS, chat=False)
            stream = _stream_flags(body)
        except RequestError as e:
            return self._err(e)
        return await self._generate(request, body, adapter, prompt_len, source, ticket, stream,
                                    chat=False, notes=notes)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await _json_body(request)
            notes = check_request(body, chat=True)
            adapter = self._adapter_of(body.get("model"))
            prompt_len = self._truncate(body, _chat_prompt_tokens(body.get("messages")))
            ticket = self._lengths(body, prompt_len, None, chat=True)
            stream = _stream_flags(body)
        except RequestError as e:
            return self._err(e)
        return await self._generate(request, body, adapter, prompt_len,
                                    "estimate_utf8_bytes_div_4", ticket, stream, chat=True,
                                    notes=notes)

    async def _generate(self, request: web.Request, body: dict, adapter: int, prompt_len: int,
                        source: str, ticket: Ticket, stream: tuple[bool, bool], chat: bool,
                        notes: tuple[list[str], list[str]] = ([], [])) -> web.StreamResponse:
        model = body.get("model") or self.cfg.served_model_name
        rid = ("chatcmpl-" if chat else "cmpl-") + (body.get("request_id")
                                                    or secrets.token_hex(16))
        headers = {}
        if notes[0]:
            headers["X-Twin-Not-Modelled"] = ",".join(notes[0])
        if notes[1]:
            headers["X-Twin-Ignored-Fields"] = ",".join(notes[1])
        created = int(time.time())
        req = self.engine.submit(adapter, prompt_len, ticket.max_tokens, tag=ticket,
                                 on_token=_on_token)
        usage = {"prompt_tokens": prompt_len, "total_tokens": prompt_len + ticket.max_tokens,
                 "completion_tokens": ticket.max_tokens, "prompt_tokens_details": None,
                 "prompt_tokens_source": source}
        try:
            if stream[0]:
                return await self._stream(request, req, ticket, rid, created, model, chat,
                                          usage if stream[1] else None, headers)
            while not ticket.done:
                await ticket.event.wait()
                ticket.event.clear()
        finally:
            if not ticket.done:
                self.engine.abort(req)
        text = DUMMY_TOKEN * ticket.max_tokens
        if chat:
            choice = {"index": 0, "message": {"role": "assistant", "reasoning_content": None,
                                              "content": text, "tool_calls": []},
                      "logprobs": None, "finish_reason": ticket.finish_reason,
                      "stop_reason": None}
        else:
            choice = {"index": 0, "text": text, "logprobs": None,
                      "finish_reason": ticket.finish_reason, "stop_reason": None,
                      "prompt_logprobs": None}
        return web.json_response({
            "id": rid, "object": "chat.completion" if chat else "text_completion",
            "created": created, "model": model, "choices": [choice], "usage": usage,
            "twin_timing": self._timing(req)}, headers=headers)

    def _timing(self, req: EngineRequest) -> dict[str, float]:
        return {"arrival_s": req.arrival, "ttft_s": req.first_t - req.arrival,
                "e2e_s": req.finish_t - req.arrival, "time_scale": self.cfg.time_scale}

    async def _stream(self, request: web.Request, req: EngineRequest, ticket: Ticket, rid: str,
                      created: int, model: str, chat: bool, usage: dict | None,
                      headers: dict | None = None) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache", **(headers or {})})
        await resp.prepare(request)
        obj = "chat.completion.chunk" if chat else "text_completion"

        def chunk(finish: str | None, first: bool = False) -> bytes:
            if chat:
                delta = {"role": "assistant", "content": ""} if first else {"content": DUMMY_TOKEN}
                c = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            else:
                c = {"index": 0, "text": DUMMY_TOKEN, "logprobs": None, "finish_reason": finish,
                     "stop_reason": None}
            d = {"id": rid, "object": obj, "created": created, "model": model, "choices": [c]}
            return b"data: " + json.dumps(d, separators=(",", ":")).encode() + b"\n\n"

        token = chunk(None)
        if chat:
            await resp.write(chunk(None, first=True))
        written = 0
        while True:
            await ticket.event.wait()
            ticket.event.clear()
            n, done = ticket.released, ticket.done
            if n > written:
                k = n - written - (1 if done else 0)
                out = token * k
                if done:
                    out += chunk(ticket.finish_reason)
                written = n
                await resp.write(out)
            if done:
                break
        tail = b""
        if usage is not None:
            d = {"id": rid, "object": obj, "created": created, "model": model, "choices": [],
                 "usage": usage, "twin_timing": self._timing(req)}
            tail += b"data: " + json.dumps(d, separators=(",", ":")).encode() + b"\n\n"
        await resp.write(tail + b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


# ---------------------------------------------------------------------------- request parsing
async def _json_body(request: web.Request) -> dict:
    """The body as a JSON object (depth-bounded before parsing; see :mod:`.validate`)."""
    return parse_body(await request.read())


def _stream_flags(body: dict) -> tuple[bool, bool]:
    stream = body.get("stream") or False
    opts = body.get("stream_options") or {}
    include = bool(opts.get("include_usage", False)) if isinstance(opts, dict) else False
    return stream, include


def _prompt_tokens(prompt: Any, vocab_size: int | None = None) -> tuple[int, str]:
    """Length of a completions prompt and the rule used (see the module docstring). Token ids
    must lie in [0, vocab_size) (vLLM: "Token id N is out of vocabulary")."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]           # a batch of one
    if isinstance(prompt, str):
        if not prompt:
            raise ApiError(400, "prompt: prompt must not be empty.", param="prompt")
        return estimate_text_tokens(prompt), "estimate_utf8_bytes_div_4"
    if isinstance(prompt, list) and prompt and all(
            isinstance(x, int) and not isinstance(x, bool) for x in prompt):
        lo, hi = min(prompt), max(prompt)
        if lo < 0:
            raise ApiError(400, f"prompt: Token id {lo} is out of vocabulary", param="prompt")
        if vocab_size is not None and hi >= vocab_size:
            raise ApiError(400, f"prompt: Token id {hi} is out of vocabulary (vocabulary size "
                                f"{vocab_size})", param="prompt")
        return len(prompt), "token_ids"
    if isinstance(prompt, list) and prompt:
        raise ApiError(400, "prompt: prompt must be a string or one list of token ids "
                            "(integers); batched prompts are not supported by twin serve.",
                       param="prompt")
    raise ApiError(400, "prompt: prompt must be a non-empty string or a non-empty list of token "
                        "ids.", param="prompt")


def _chat_prompt_tokens(messages: Any) -> int:
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "messages: messages must be a non-empty list.", param="messages")
    total = CHAT_TOKENS_FIXED
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ApiError(400, f"messages: messages[{i}] must be an object with a string "
                                "'role' and 'content'.", param="messages")
        content = m.get("content") or ""
        if isinstance(content, list):
            texts = []
            for j, part in enumerate(content):
                if not (isinstance(part, dict) and part.get("type") == "text"
                        and isinstance(part.get("text"), str)):
                    raise ApiError(400, f"messages: messages[{i}].content[{j}]: only text parts "
                                        "({'type': 'text', 'text': str}) are supported by twin "
                                        "serve (no images, audio or files)", param="messages")
                texts.append(part["text"])
            content = "".join(texts)
        if not isinstance(content, str):
            raise ApiError(400, f"messages: messages[{i}].content must be a string or a list of "
                                "text parts.", param="messages")
        total += CHAT_TOKENS_PER_MESSAGE + (estimate_text_tokens(content) if content else 0)
    return total


def _check_str_fields(body: dict, names: tuple[str, ...]) -> None:
    """Required string fields of a LoRA request: vLLM validates the body with pydantic and
    answers a missing or non-string field with a 400 BadRequestError naming it."""
    for k in names:
        if k not in body:
            raise ApiError(400, f"{k}: Field required", param=k)
        if not isinstance(body[k], str):
            raise ApiError(400, f"{k}: Input should be a valid string", param=k)


async def serve_forever(cfg: ServeConfig, stop: asyncio.Event) -> None:
    """Run the server until ``stop`` is set; print ``listening on http://HOST:PORT`` when ready."""
    server = TwinServer(cfg)
    host, port = await server.start()
    shown = f"[{host}]" if ":" in host else host
    # vLLM 0.8.5 logs its KV capacity so at start-up (its /metrics cache_config_info does not
    # have it, see twin.serve.metrics); printed for readers that parse it
    kv = server.settings.kv_blocks * server.settings.block_size
    print(f"GPU KV cache size: {kv:,} tokens", flush=True)
    print(f"listening on http://{shown}:{port}", flush=True)
    try:
        await stop.wait()
    finally:
        await server.stop()
