"""Request validation of ``twin serve``: accept only what vLLM's OpenAI server accepts, and say
what the twin does with every field.

vLLM validates a request body with pydantic models (``CompletionRequest``,
``ChatCompletionRequest`` in ``vllm/entrypoints/openai/protocol.py``) and ``SamplingParams``
checks; a failure is a 400 ``BadRequestError``. pydantic is not a dependency of this project, so
the same checks are a small explicit table here. Every field vLLM knows falls in one class:

- **honoured**: changes what the twin simulates or returns (``model``, ``prompt`` /
  ``messages``, ``max_tokens``, ``max_completion_tokens``, ``min_tokens``, ``ignore_eos``,
  ``stream``, ``stream_options.include_usage``, ``truncate_prompt_tokens``, ``request_id``, and
  ``n`` / ``best_of`` / ``priority`` / ``echo`` / ``logprobs`` ... at their default values);
- **not modelled, accepted**: checked as vLLM checks it (type, range), then it has no effect on
  the twin, because it only chooses *which* tokens are produced (``temperature``, ``top_p``,
  ``seed``, penalties, ``stop``, ``logit_bias``, chat-template options ...), and the twin's
  text is a dummy token and its output lengths come from the twin's length model. The response
  names them in the header ``X-Twin-Not-Modelled``;
- **refused by name** (400 naming the field) when set to anything but its default: what the twin
  cannot produce or time (``n`` > 1, ``best_of``, ``echo``, ``logprobs``, ``top_logprobs``,
  ``prompt_logprobs``, ``use_beam_search``, guided decoding and ``response_format`` other than
  text, ``tools``, ``logits_processors``, ``prompt_embeds``, ``suffix``, non-zero ``priority``,
  ``stream_options.continuous_usage_stats``).

Fields vLLM does not know are ignored by vLLM with a warning in its log ("The following fields
were present in the request but ignored"); ``twin serve`` does the same (one warning per field
name on stderr) and names them in the header ``X-Twin-Ignored-Fields``.

Deliberately stricter than vLLM's pydantic models in one way: pydantic's lax mode turns a
numeric string (``"temperature": "0.5"``) or an integral float (``"max_tokens": 5.0``) into the
number, where ``twin serve`` refuses it by name (a client sending strings is almost always a
bug that a real server would hide).

The error message names the field first (``"temperature: ..."``) and ``param`` holds it (vLLM
leaves ``param`` null; a client reading only ``message`` sees the same text).

Bodies nested deeper than :data:`MAX_JSON_DEPTH` are refused with a 400 before they are parsed
(vLLM's request models nest at most a few levels; a deep body would otherwise reach Python's
recursion limit inside the JSON decoder).
"""

from __future__ import annotations

import json
import math
import re
import sys
from typing import Any, Callable
from urllib.parse import quote

import numpy as np

MAX_JSON_DEPTH = 64
INT64 = (-(2**63), 2**63 - 1)


class RequestError(ValueError):
    """A request vLLM would answer with 400 (``status`` otherwise); ``param`` = the field."""

    def __init__(self, param: str | None, message: str, status: int = 400,
                 kind: str = "BadRequestError") -> None:
        super().__init__(message)
        self.param, self.message, self.status, self.kind = param, message, status, kind


def bad(field: str, why: str) -> RequestError:
    return RequestError(field, f"{field}: {why}")


# ---------------------------------------------------------------------------- JSON body
_STRING = re.compile(rb'"[^"]*"')          # a JSON string once its escapes are removed
_NOT_BRACKETS = bytes(c for c in range(256) if c not in b"[]{}")


def json_depth_ok(raw: bytes, limit: int = MAX_JSON_DEPTH) -> bool:
    """True when no array/object in ``raw`` nests deeper than ``limit`` (brackets inside
    strings do not count). Linear time in C and numpy, no recursion: escaped backslashes and
    quotes are dropped, then strings, then everything but brackets."""
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return True
    s = raw.replace(b"\\\\", b"").replace(b'\\"', b"")
    brackets = _STRING.sub(b"", s).translate(None, _NOT_BRACKETS)
    b = np.frombuffer(brackets, dtype=np.uint8)
    step = ((b == ord("[")) | (b == ord("{"))).view(np.int8) * np.int8(2) - np.int8(1)
    return int(np.cumsum(step, dtype=np.int32).max(initial=0)) <= limit


def parse_body(raw: bytes) -> dict:
    """The request body as a JSON object, or ``RequestError`` (400)."""
    if not json_depth_ok(raw):
        raise RequestError(None, f"request body: JSON nested deeper than {MAX_JSON_DEPTH} levels")
    try:
        body = json.loads(raw)
    except RecursionError:
        raise RequestError(None, "request body: JSON nested too deeply") from None
    except (json.JSONDecodeError, UnicodeDecodeError, ValueError) as e:
        raise RequestError(None, f"request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise RequestError(None, "request body must be a JSON object")
    return body


# ---------------------------------------------------------------------------- value checks
def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool)
            and math.isfinite(float(v)))


def number(lo: float | None = None, hi: float | None = None, lo_open: bool = False,
           what: str = "") -> Callable[[str, Any], None]:
    """A finite number (pydantic ``float``: a JSON string is refused) in the range; the message
    is vLLM's ``SamplingParams`` wording."""
    def check(f: str, v: Any) -> None:
        if v is None:
            return
        if not _is_num(v):
            raise bad(f, f"Input should be a valid number, got {v!r}")
        if (lo is not None and (v <= lo if lo_open else v < lo)) or (hi is not None and v > hi):
            raise bad(f, f"{f} must be {what}, got {v}.")
    return check


def integer(lo: int | None = None, hi: int | None = None, what: str = ""
            ) -> Callable[[str, Any], None]:
    def check(f: str, v: Any) -> None:
        if v is None:
            return
        if not _is_int(v):
            raise bad(f, f"Input should be a valid integer, got {v!r}")
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            raise bad(f, f"{f} must be {what}, got {v}.")
    return check


def boolean(f: str, v: Any) -> None:
    if v is not None and not isinstance(v, bool):
        raise bad(f, f"Input should be a valid boolean, got {v!r}")


def string(f: str, v: Any) -> None:
    if v is not None and not isinstance(v, str):
        raise bad(f, f"Input should be a valid string, got {v!r}")


def str_or_str_list(f: str, v: Any) -> None:
    if v is None or isinstance(v, str):
        return
    if not (isinstance(v, list) and all(isinstance(x, str) for x in v)):
        raise bad(f, "Input should be a string or a list of strings")


def int_list(f: str, v: Any) -> None:
    if v is not None and not (isinstance(v, list) and all(_is_int(x) for x in v)):
        raise bad(f, "Input should be a list of integers")


def mapping(f: str, v: Any) -> None:
    if v is not None and not isinstance(v, dict):
        raise bad(f, f"Input should be a valid dictionary, got {type(v).__name__}")


def logit_bias(f: str, v: Any) -> None:
    mapping(f, v)
    if v and not all(_is_num(x) for x in v.values()):
        raise bad(f, "Input should be a dictionary of numbers")


def anything(f: str, v: Any) -> None:
    return None


def only(default: Any, why: str, check: Callable[[str, Any], None] = anything
         ) -> Callable[[str, Any], None]:
    """Refused by name unless absent, null or ``default`` (after ``check``)."""
    def c(f: str, v: Any) -> None:
        check(f, v)
        if v is not None and v != default:
            raise bad(f, f"{v!r} is not supported by twin serve ({why}); "
                         f"send {default!r} or leave it out")
    return c


def refused(why: str, allowed: tuple = (None,)) -> Callable[[str, Any], None]:
    def c(f: str, v: Any) -> None:
        if not any(v is a or (a is not None and v == a) for a in allowed):
            raise bad(f, f"not supported by twin serve ({why})")
    return c


# (check, honoured?) per field: honoured=False means "not modelled, accepted"
HONOURED, NOT_MODELLED = True, False
_CONTENT = "the twin returns a dummy token per output token, not model text"

COMMON: dict[str, tuple[Callable[[str, Any], None], bool]] = {
    "model": (string, HONOURED),
    "max_tokens": (integer(1, None, "at least 1"), HONOURED),
    "min_tokens": (integer(0, None, "greater than or equal to 0"), HONOURED),
    "ignore_eos": (boolean, HONOURED),
    "stream": (boolean, HONOURED),
    "stream_options": (mapping, HONOURED),
    "n": (only(1, "one choice per request", integer(1, None, "at least 1")), HONOURED),
    "best_of": (only(1, "one sequence per request", integer(1, None, "at least 1")), HONOURED),
    "use_beam_search": (only(False, "no beam search", boolean), HONOURED),
    "prompt_logprobs": (refused("no logprobs: " + _CONTENT), HONOURED),
    "truncate_prompt_tokens": (integer(1, None, "greater than or equal to 1"), HONOURED),
    "request_id": (string, HONOURED),
    "priority": (only(0, "priority scheduling is not enabled, as in vLLM's default "
                      "--scheduling-policy fcfs", integer(*INT64, "an integer")), HONOURED),
    "response_format": (refused("no guided decoding", (None, {"type": "text"})), HONOURED),
    "guided_json": (refused("no guided decoding"), HONOURED),
    "guided_regex": (refused("no guided decoding"), HONOURED),
    "guided_choice": (refused("no guided decoding"), HONOURED),
    "guided_grammar": (refused("no guided decoding"), HONOURED),
    "structural_tag": (refused("no guided decoding"), HONOURED),
    "guided_decoding_backend": (refused("no guided decoding"), HONOURED),
    "guided_whitespace_pattern": (refused("no guided decoding"), HONOURED),
    "logits_processors": (refused("no logits processors, as vLLM without "
                                  "--logits-processor-pattern"), HONOURED),
    # sampling: checked as vLLM's SamplingParams does; token values only
    "temperature": (number(0.0, None, what="non-negative"), NOT_MODELLED),
    "top_p": (number(0.0, 1.0, lo_open=True, what="in (0, 1]"), NOT_MODELLED),
    "top_k": (integer(-1, None, "-1 (disable), 0 or at least 1"), NOT_MODELLED),
    "min_p": (number(0.0, 1.0, what="in [0, 1]"), NOT_MODELLED),
    "presence_penalty": (number(-2.0, 2.0, what="in [-2, 2]"), NOT_MODELLED),
    "frequency_penalty": (number(-2.0, 2.0, what="in [-2, 2]"), NOT_MODELLED),
    "repetition_penalty": (number(0.0, None, lo_open=True, what="greater than zero"),
                           NOT_MODELLED),
    "length_penalty": (number(what="a number"), NOT_MODELLED),
    "seed": (integer(*INT64, "a 64-bit integer"), NOT_MODELLED),
    "stop": (str_or_str_list, NOT_MODELLED),
    "stop_token_ids": (int_list, NOT_MODELLED),
    "include_stop_str_in_output": (boolean, NOT_MODELLED),
    "skip_special_tokens": (boolean, NOT_MODELLED),
    "spaces_between_special_tokens": (boolean, NOT_MODELLED),
    "logit_bias": (logit_bias, NOT_MODELLED),
    "user": (string, NOT_MODELLED),
    "add_special_tokens": (boolean, NOT_MODELLED),
    "return_tokens_as_token_ids": (boolean, NOT_MODELLED),
    "cache_salt": (string, NOT_MODELLED),
    "kv_transfer_params": (mapping, NOT_MODELLED),
}

COMPLETION = dict(COMMON)
COMPLETION.update({
    "prompt": (anything, HONOURED),                 # checked by the prompt-length code
    "echo": (only(False, "no echo of the prompt: " + _CONTENT, boolean), HONOURED),
    "logprobs": (refused("no logprobs: " + _CONTENT), HONOURED),
    "suffix": (refused("suffix is not currently supported, as in vLLM"), HONOURED),
    "prompt_embeds": (refused("prompts are token ids or text"), HONOURED),
    "allowed_token_ids": (int_list, NOT_MODELLED),
})

CHAT = dict(COMMON)
CHAT.update({
    "messages": (anything, HONOURED),               # checked by the chat-length code
    "max_completion_tokens": (integer(1, None, "at least 1"), HONOURED),
    "echo": (only(False, "no echo of the last message: " + _CONTENT, boolean), HONOURED),
    "logprobs": (only(False, "no logprobs: " + _CONTENT, boolean), HONOURED),
    "top_logprobs": (only(0, "no logprobs: " + _CONTENT,
                          integer(0, None, "a positive value")), HONOURED),
    "tools": (refused("no tool calls: " + _CONTENT, (None, [])), HONOURED),
    "tool_choice": (refused("no tool calls: " + _CONTENT, (None, "none", "auto")), HONOURED),
    "functions": (refused("no tool calls: " + _CONTENT, (None, [])), HONOURED),
    "function_call": (refused("no tool calls: " + _CONTENT, (None, "none", "auto")), HONOURED),
    "parallel_tool_calls": (boolean, NOT_MODELLED),
    "add_generation_prompt": (boolean, NOT_MODELLED),
    "continue_final_message": (boolean, NOT_MODELLED),
    "documents": (anything, NOT_MODELLED),
    "chat_template": (string, NOT_MODELLED),
    "chat_template_kwargs": (mapping, NOT_MODELLED),
    "mm_processor_kwargs": (mapping, NOT_MODELLED),
    "reasoning_effort": (string, NOT_MODELLED),
})

_warned: set[str] = set()


def check_request(body: dict, chat: bool) -> tuple[list[str], list[str]]:
    """Check every field of a completions (``chat=False``) or chat body; return (not-modelled
    fields that were set, fields vLLM does not know). Raises ``RequestError`` naming the
    field."""
    table = CHAT if chat else COMPLETION
    not_modelled, unknown = [], []
    for f, v in body.items():
        spec = table.get(f)
        if spec is None:
            unknown.append(f)
            continue
        spec[0](f, v)
        if not spec[1] and v is not None:
            not_modelled.append(f)
    # cross-field rules of vLLM's model validators
    opts = body.get("stream_options")
    if opts and not body.get("stream"):
        raise bad("stream_options", "Stream options can only be defined when `stream=True`.")
    if isinstance(opts, dict):
        for k, v in opts.items():
            if k not in ("include_usage", "continuous_usage_stats"):
                unknown.append(f"stream_options.{k}")
                continue
            boolean(f"stream_options.{k}", v)
        if opts.get("continuous_usage_stats"):
            raise bad("stream_options.continuous_usage_stats",
                      "not supported by twin serve (usage is sent once, in the last chunk)")
    if chat and body.get("continue_final_message") and body.get("add_generation_prompt", True):
        raise bad("continue_final_message", "Cannot set both `continue_final_message` and "
                                             "`add_generation_prompt` to True.")
    if unknown:
        unknown = [safe_name(f) for f in unknown[:MAX_LISTED]]
        new = [f for f in unknown if f not in _warned]
        if new and len(_warned) < 10_000:
            _warned.update(new)
            print(f"warning: the following fields were present in the request but ignored "
                  f"(as vLLM does): {', '.join(sorted(new))}", file=sys.stderr, flush=True)
    return not_modelled, unknown


MAX_LISTED = 32          # unknown field names named per response


def safe_name(name: str) -> str:
    """A client's field name as printable ASCII for a header or a log line (percent-encoded,
    at most 64 characters): a name is the client's text, not ours to echo raw."""
    return quote(name[:64], safe="_.-:")
