"""Prompts from a file for ``twin.harness verify --prompts``: real prompt texts (or token ids)
instead of random token ids of the length model's lengths.

The file is JSON Lines, one prompt per line, each an object with either
``"prompt_token_ids": [int, ...]`` (exact: the server sees exactly those tokens) or
``"prompt": "text"`` with an optional ``"prompt_tokens": n`` (its length in the served model's
tokenizer, e.g. from ``len(tokenizer(text).input_ids)``). Without ``prompt_tokens`` a text's
length is *estimated* as ceil(UTF-8 bytes / 4), the rule ``twin serve`` applies to text prompts,
so a replay on ``twin serve`` is exact and one on real vLLM carries the estimate's error (the
report says which). Each request draws one prompt uniformly (seeded); its input length becomes
that prompt's length, in the requests sent and in the twin's prediction alike. Output lengths
stay the workload's (``max_tokens`` with ``ignore_eos``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Union

import numpy as np

from twin.json_files import read_text_file
from twin.serve.app import estimate_text_tokens
from twin.workload import Requests

Prompt = Union[str, tuple[int, ...]]
MAX_PROMPTS = 1_000_000


@dataclass(frozen=True)
class PromptPool:
    """The prompts of a file, their token counts, and whether any count is estimated."""

    path: str
    prompts: tuple[Prompt, ...]
    tokens: np.ndarray
    estimated: int      # prompts whose length is the bytes / 4 estimate

    def __len__(self) -> int:
        return len(self.prompts)


def _one(d: object, where: str) -> tuple[Prompt, int, bool]:
    if not isinstance(d, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(d).__name__}")
    if ("prompt" in d) == ("prompt_token_ids" in d):
        raise ValueError(f"{where}: give exactly one of 'prompt' (text) or 'prompt_token_ids'")
    if "prompt_token_ids" in d:
        ids = d["prompt_token_ids"]
        if not (isinstance(ids, list) and ids and all(
                isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids)):
            raise ValueError(f"{where}.prompt_token_ids: must be a non-empty list of "
                             "non-negative integers")
        return tuple(ids), len(ids), False
    text = d["prompt"]
    if not isinstance(text, str) or not text:
        raise ValueError(f"{where}.prompt: must be a non-empty string")
    if "prompt_tokens" in d:
        n = d["prompt_tokens"]
        if not (isinstance(n, int) and not isinstance(n, bool) and n >= 1):
            raise ValueError(f"{where}.prompt_tokens: must be an integer >= 1, got {n!r}")
        return text, n, False
    return text, estimate_text_tokens(text), True


def load_prompts(path: str | Path) -> PromptPool:
    """Read a JSON Lines prompt file (module docstring); errors name the file, line and field."""
    p = Path(path)
    lines = read_text_file(p, "--prompts", ValueError, kind="JSON Lines").splitlines()
    prompts, tokens, est = [], [], 0
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"--prompts {p}:{i}"
        try:
            d = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{where}: invalid JSON ({e.msg})") from None
        prompt, n, guessed = _one(d, where)
        prompts.append(prompt)
        tokens.append(n)
        est += guessed
        if len(prompts) > MAX_PROMPTS:
            raise ValueError(f"--prompts {p}: more than {MAX_PROMPTS:,} prompts; sample it")
    if not prompts:
        raise ValueError(f"--prompts {p}: no prompt in the file")
    return PromptPool(str(p), tuple(prompts), np.array(tokens, np.int64), est)


def draw_prompts(requests: Requests, pool: PromptPool, seed: int, max_tokens: int | None = None
                 ) -> tuple[Requests, tuple[Prompt, ...]]:
    """Each request draws a prompt (seeded); returns the requests with those input lengths and
    the prompts in request order. ``max_tokens``: refuse prompts longer than a server's KV
    capacity would hold (named, with the longest)."""
    if max_tokens is not None and int(pool.tokens.max()) > max_tokens:
        k = int(np.argmax(pool.tokens))
        raise ValueError(f"--prompts {pool.path}: prompt {k + 1} has {int(pool.tokens[k])} "
                         f"tokens, more than the {max_tokens} a server of the plan holds")
    pick = np.random.default_rng(seed).integers(0, len(pool), len(requests))
    return (replace(requests, input_len=pool.tokens[pick].astype(requests.input_len.dtype)),
            tuple(pool.prompts[int(k)] for k in pick))
