"""Plain-Python reference of :func:`twin.kernel.simulate_kernel` (same inputs, same outputs).

It runs the readable :class:`twin.scheduler.V1Scheduler` (one FCFS deque scanned as vLLM does),
:class:`twin.kv_cache.KVCache` and :class:`twin.adapter_cache.AdapterSlots`. Slow; tests use it to
check the compiled kernel step for step on small cases.
"""

from __future__ import annotations

import numpy as np

from . import kernel as K
from .adapter_cache import AdapterSlots
from .kv_cache import KVCache
from .scheduler import RequestState, V1Scheduler
from .step_time import N_DESIGN, accumulate_design_py, step_time_ms_py


def simulate_reference(arrival, adapter, in_len, out_len, n_adapters, load_ms, activation_rank,
                       max_loras, max_rank, kv_blocks, block_size, max_batched_tokens,
                       max_num_seqs, duration, step_coef, max_waiting=0, observer=None,
                       stop_tokens=0.0, ms_per_token=0.0):
    """Return ``(first_t, finish_t, stats, itl_hist, n_running, n_waiting, computed, generated)``
    like the kernel (the early stop too). ``observer(scheduler, plan)``, if given, is called
    after every schedule (tests use it to check invariants step by step)."""
    n_req = len(arrival)
    n_window = int(np.searchsorted(arrival, duration))
    done_tokens, n_done = 0.0, 0
    first_t = np.full(n_req, -1.0)
    finish_t = np.full(n_req, -1.0)
    last_tok = np.zeros(n_req)
    stats = np.zeros(K.N_STATS)
    hist = np.zeros(K.ITL_HIST_BINS, np.int64)
    kv = KVCache(kv_blocks, block_size)
    sched = V1Scheduler(kv, max_loras, max_batched_tokens, max_num_seqs)
    slots = AdapterSlots(max_loras, load_ms, activation_rank)
    reqs = [RequestState(i, int(adapter[i]), int(in_len[i]), int(out_len[i])) for i in range(n_req)]
    t, nxt = 0.0, 0
    while True:
        while nxt < n_req and arrival[nxt] <= t:
            if max_waiting > 0 and len(sched.waiting) >= max_waiting:
                stats[K.ST_REJECTED] += 1
            else:
                sched.add(reqs[nxt])
            nxt += 1
        stats[K.ST_MAX_WAITING] = max(stats[K.ST_MAX_WAITING], len(sched.waiting))
        if t >= duration:
            break
        if not sched.running and not sched.waiting:
            if nxt >= n_req or arrival[nxt] >= duration:
                break
            t = float(arrival[nxt])
            continue
        plan = sched.schedule()
        if observer is not None:
            observer(sched, plan)
        stats[K.ST_PREEMPTIONS] += plan.preemptions
        stats[K.ST_DROPPED_TOKENS] += plan.dropped_tokens
        if not plan.scheduled:
            if nxt >= n_req or arrival[nxt] >= duration:
                break
            t = max(t, float(arrival[nxt]))
            continue
        n_prefill = n_decode = ctx = 0
        for req, new in zip(plan.scheduled, plan.new_tokens):
            ctx += req.computed
            if req.generated > 0 and req.num_tokens - req.computed == 1:
                n_decode += 1
            else:
                n_prefill += new
        tok_of: dict[int, int] = {}
        for req, new in zip(plan.scheduled, plan.new_tokens):
            tok_of[req.adapter] = tok_of.get(req.adapter, 0) + new
        n_tiles = sum(-(-tok_of[a] // K.LORA_TILE) for a in plan.adapters)
        load_total = 0.0
        if max_loras > 0:
            load_total, loads = slots.activate(plan.adapters)
            stats[K.ST_LOADS] += loads
            if len(plan.adapters) >= max_loras:
                stats[K.ST_SCHED_STEPS_MAXED] += 1
        dt = (step_time_ms_py(step_coef, len(plan.scheduled), n_prefill, n_decode, ctx,
                              len(plan.adapters), max_loras, max_rank, plan.scanned, n_tiles)
              + load_total) / 1000.0
        design = stats[K.ST_DESIGN:K.ST_DESIGN + N_DESIGN]
        accumulate_design_py(design, step_coef, len(plan.scheduled), n_prefill, n_decode, ctx,
                             len(plan.adapters), max_loras, max_rank, plan.scanned, n_tiles)
        t_end = t + dt
        n_run = len(sched.running)
        stats[K.ST_STEPS] += 1
        stats[K.ST_BUSY_S] += dt
        stats[K.ST_LOAD_S] += load_total / 1000.0
        stats[K.ST_RUNNING_S] += n_run * dt
        stats[K.ST_KV_BLOCKS_S] += kv.used_blocks * dt
        stats[K.ST_DISTINCT_S] += len(plan.adapters) * dt
        stats[K.ST_PREFILL_TOKENS] += n_prefill
        stats[K.ST_DECODE_TOKENS] += n_decode
        stats[K.ST_MAX_RUNNING] = max(stats[K.ST_MAX_RUNNING], n_run)
        stats[K.ST_MAX_KV_BLOCKS] = max(stats[K.ST_MAX_KV_BLOCKS], kv.used_blocks)
        stats[K.ST_MAX_DISTINCT] = max(stats[K.ST_MAX_DISTINCT], len(plan.adapters))
        for req, new in zip(plan.scheduled, plan.new_tokens):
            req.computed += new
            if req.computed == req.num_tokens:
                req.generated += 1
                if req.generated == 1:
                    first_t[req.idx] = t_end
                else:
                    hist[K.itl_bin((t_end - last_tok[req.idx]) * 1000.0)] += 1
                last_tok[req.idx] = t_end
                if req.generated >= req.out_len:
                    finish_t[req.idx] = t_end
                    sched.finish(req)
                    if t_end <= duration:
                        done_tokens += req.in_len + req.out_len
                        n_done += 1
        t = t_end
        if stop_tokens > 0.0 and stats[K.ST_STEPS] % K.DECIDE_EVERY == 0 and t < duration:
            held = float(sum(r.in_len + r.out_len for r in sched.running))
            bound = K.completed_tokens_bound.py_func(done_tokens, held,
                                                     n_window - n_done - len(sched.running),
                                                     duration - t, ms_per_token)
            if bound < stop_tokens:
                stats[K.ST_DECIDED_T] = t
                stats[K.ST_TOKENS_BOUND] = bound
                break
    stats[K.ST_END_T] = t
    computed = np.array([r.computed for r in reqs], np.int64)
    generated = np.array([r.generated for r in reqs], np.int64)
    return (first_t, finish_t, stats, hist, len(sched.running), len(sched.waiting), computed,
            generated)
