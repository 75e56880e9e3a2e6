"""vLLM V1 scheduling rules (v0.8.5 ``vllm/v1/core/sched/scheduler.py``), plain Python.

Per engine step, with a token budget ``max_num_batched_tokens``:

1. Running requests are served first, in admission order. Each gets
   ``min(num_tokens - num_computed_tokens, budget)`` tokens (chunked prefill; a decoding request
   needs 1). When its KV blocks cannot be allocated, the *last* running request is preempted
   (recompute: its KV is dropped, ``num_computed_tokens = 0``, generated tokens are kept and
   re-prefilled) and put at the front of the waiting queue, until the allocation succeeds or the
   request preempted itself.
2. Only if nobody was preempted this step, waiting requests are admitted FCFS while budget remains
   and fewer than ``max_num_seqs`` run. Once the batch holds ``max_loras`` distinct adapters, a
   waiting request of another adapter is skipped (it keeps its place) and the scan goes on; an
   admission whose blocks cannot be allocated ends the scan.

This class is the readable statement of those rules, used by :mod:`twin.reference_kernel` and
the online engine of :mod:`twin.serve`; the numba kernel :mod:`twin.kernel` implements the same
rules on arrays. A request with ``adapter < 0`` asks for the base model (no LoRA): like vLLM, it
takes no adapter slot and is never skipped for the ``max_loras`` rule (only ``twin.serve`` sends
such requests; the batch twin's adapters are all >= 0).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from .kv_cache import KVCache


@dataclass(eq=False)
class RequestState:
    """Mutable progress of one request inside the twin."""

    idx: int
    adapter: int
    in_len: int
    out_len: int
    computed: int = 0
    generated: int = 0

    @property
    def num_tokens(self) -> int:
        return self.in_len + self.generated


@dataclass
class StepPlan:
    """What one step runs: ``scheduled[k]`` gets ``new_tokens[k]`` tokens."""

    scheduled: list[RequestState] = field(default_factory=list)
    new_tokens: list[int] = field(default_factory=list)
    adapters: list[int] = field(default_factory=list)   # distinct, in first-seen order
    preemptions: int = 0
    dropped_tokens: int = 0
    scanned: int = 0          # waiting requests examined (the scheduler's scan cost)


class V1Scheduler:
    """Waiting deque + running list + KV pool, following the rules in the module docstring."""

    def __init__(self, kv: KVCache, max_loras: int, max_batched_tokens: int,
                 max_num_seqs: int) -> None:
        self.kv = kv
        self.max_loras = max_loras
        self.max_batched_tokens = max_batched_tokens
        self.max_num_seqs = max_num_seqs
        self.waiting: deque[RequestState] = deque()
        self.running: list[RequestState] = []

    def add(self, req: RequestState) -> None:
        self.waiting.append(req)

    def schedule(self) -> StepPlan:
        plan = StepPlan()
        budget = self.max_batched_tokens
        seen: set[int] = set()

        def note_adapter(a: int) -> None:
            if a >= 0 and a not in seen:     # a < 0: base model, no LoRA slot
                seen.add(a)
                plan.adapters.append(a)

        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            new = min(req.num_tokens - req.computed, budget)
            can = True
            while not self.kv.try_allocate(req.idx, req.computed, new):
                victim = self.running.pop()
                self.kv.free(victim.idx)
                plan.dropped_tokens += victim.computed
                victim.computed = 0
                self.waiting.appendleft(victim)
                plan.preemptions += 1
                if victim is req:
                    can = False
                    break
            if not can:
                break
            plan.scheduled.append(req)
            plan.new_tokens.append(new)
            note_adapter(req.adapter)
            budget -= new
            i += 1

        if plan.preemptions == 0:
            wait_before = len(self.waiting)
            skipped: deque[RequestState] = deque()
            while self.waiting and budget > 0:
                if len(self.running) >= self.max_num_seqs:
                    break
                req = self.waiting[0]
                if (self.max_loras > 0 and len(seen) >= self.max_loras
                        and req.adapter >= 0 and req.adapter not in seen):
                    skipped.appendleft(self.waiting.popleft())
                    continue
                new = min(req.num_tokens - req.computed, budget)
                if not self.kv.try_allocate(req.idx, req.computed, new):
                    break
                self.waiting.popleft()
                self.running.append(req)
                plan.scheduled.append(req)
                plan.new_tokens.append(new)
                note_adapter(req.adapter)
                budget -= new
                plan.scanned += 1
            self.waiting.extendleft(skipped)
            if self.max_loras > 0 and len(seen) >= self.max_loras and wait_before > 0:
                plan.scanned = wait_before
        return plan

    def finish(self, req: RequestState) -> None:
        self.kv.free(req.idx)
        self.running.remove(req)
