"""The compiled discrete-event loop of one vLLM V1 server (numba).

One iteration = one engine step: the scheduler (rules in :mod:`twin.scheduler`, mirrored here on
arrays) picks the batch, the adapter slots activate its adapters, the step-time model gives the
step's duration, and every scheduled request advances. The plain-Python twin of this loop is
:mod:`twin.reference_kernel`; tests check the two agree exactly.

Waiting queue. vLLM scans one FCFS deque and skips requests whose adapter is not in the batch once
the batch holds ``max_loras`` distinct adapters; skipped requests keep their places. Here each
adapter has its own FIFO (a linked list) and every waiting request an order key (arrival index;
preempted requests get decreasing negative keys, i.e. the front). The earliest eligible request is
then the smallest head key over all adapters (batch not full: the top of a heap of the adapters
that have waiting requests) or over the batch's adapters (full), which reproduces the deque scan
without its O(queue) cost per step.

Speed. A step visits every running request twice (schedule, advance), so their state (tokens
computed and generated, KV blocks held, last token time) lives in arrays indexed by place in the
running list while they run, and the hot loops call no helper that takes arrays (each such call
costs atomic reference-count updates). Same results as before (``tests/test_kernel.py``), about a
third less time on a 768-adapter hour.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .adapter_cache import activate_batch
from .kv_cache import blocks_for
from .step_time import LORA_TILE, N_DESIGN, accumulate_design, step_time_ms

# Indices of the kernel's scalar statistics vector.
ST_STEPS = 0
ST_PREEMPTIONS = 1
ST_LOADS = 2
ST_BUSY_S = 3
ST_RUNNING_S = 4        # integral of running requests over time (request-seconds)
ST_KV_BLOCKS_S = 5      # integral of used KV blocks over time (block-seconds)
ST_END_T = 6
ST_MAX_RUNNING = 7
ST_PREFILL_TOKENS = 8
ST_DECODE_TOKENS = 9
ST_MAX_WAITING = 10
ST_LOAD_S = 11
ST_DISTINCT_S = 12      # integral of distinct adapters in the batch over busy time
ST_SCHED_STEPS_MAXED = 13  # steps in which the batch reached max_loras distinct adapters
ST_MAX_KV_BLOCKS = 14   # most KV blocks in use after any step's allocation
ST_MAX_DISTINCT = 15    # most distinct adapters in one step's batch
ST_DROPPED_TOKENS = 16  # computed KV tokens thrown away by preemptions (recomputed later)
ST_REJECTED = 17        # arrivals refused because the client's waiting cap was reached
ST_DESIGN = 18          # ST_DESIGN .. ST_DESIGN + N_DESIGN - 1: summed step-time design rows
ST_DECIDED_T = ST_DESIGN + N_DESIGN      # time the run stopped with its verdict decided, or 0
ST_TOKENS_BOUND = ST_DECIDED_T + 1       # then: an upper bound on the window's completed tokens
N_STATS = ST_TOKENS_BOUND + 1

DECIDE_EVERY = 64        # steps between two checks of the early-stop bound

ITL_HIST_BINS = 4000
ITL_HIST_LO_MS = 0.1
ITL_HIST_DECADES = 8.0   # bins cover 0.1 ms .. 1e7 ms, log-spaced


def itl_hist_quantile(hist: np.ndarray, q: float, upper: bool = False) -> float:
    """The q quantile of a gap histogram (ms): its bin's geometric middle, or with ``upper``
    its upper edge (never below the true value); NaN for an empty histogram."""
    total = hist.sum()
    if total == 0:
        return float("nan")
    idx = int(np.searchsorted(np.cumsum(hist), q * total))
    hi = ITL_HIST_LO_MS * 10 ** ((idx + 1) / ITL_HIST_BINS * ITL_HIST_DECADES)
    if upper:
        return float(hi)
    lo = ITL_HIST_LO_MS * 10 ** (idx / ITL_HIST_BINS * ITL_HIST_DECADES)
    return float(np.sqrt(lo * hi))


@njit(cache=True)
def itl_bin(gap_ms: float) -> int:
    """Log-spaced histogram bin of an inter-token gap."""
    if gap_ms <= ITL_HIST_LO_MS:
        return 0
    b = int(np.log10(gap_ms / ITL_HIST_LO_MS) / ITL_HIST_DECADES * ITL_HIST_BINS)
    return min(b, ITL_HIST_BINS - 1)


@njit(cache=True)
def _pop_head(a, head, tail, nxt):
    r = head[a]
    head[a] = nxt[r]
    if head[a] < 0:
        tail[a] = -1
    nxt[r] = -1
    return r


# Adapters with waiting requests, in a binary min-heap on their head request's key
# (``heap[0]`` is the adapter of the earliest waiting request): O(log adapters) per queue change
# instead of an O(adapters) scan per admission. ``pos[a]`` is a's place in the heap, -1 if absent.

@njit(cache=True)
def _heap_swap(heap, pos, i, j):
    ai = heap[i]
    aj = heap[j]
    heap[i] = aj
    heap[j] = ai
    pos[aj] = i
    pos[ai] = j


@njit(cache=True)
def _heap_up(heap, pos, i, head, key):
    while i > 0:
        p = (i - 1) >> 1
        if key[head[heap[i]]] < key[head[heap[p]]]:
            _heap_swap(heap, pos, i, p)
            i = p
        else:
            break


@njit(cache=True)
def _heap_down(heap, pos, i, n, head, key):
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        if c + 1 < n and key[head[heap[c + 1]]] < key[head[heap[c]]]:
            c += 1
        if key[head[heap[c]]] < key[head[heap[i]]]:
            _heap_swap(heap, pos, i, c)
            i = c
        else:
            break


@njit(cache=True)
def _heap_push(a, heap, pos, n, head, key):
    """Add adapter ``a`` (its FIFO just became non-empty); returns the new heap size."""
    heap[n] = a
    pos[a] = n
    _heap_up(heap, pos, n, head, key)
    return n + 1


@njit(cache=True)
def _heap_fix(a, heap, pos, n, head, key):
    """Adapter ``a``'s head changed (or its FIFO emptied); returns the new heap size."""
    i = pos[a]
    if head[a] < 0:                     # remove: move the last entry into its place
        n -= 1
        pos[a] = -1
        if i < n:
            last = heap[n]
            heap[i] = last
            pos[last] = i
            _heap_up(heap, pos, i, head, key)
            _heap_down(heap, pos, pos[last], n, head, key)
        return n
    _heap_up(heap, pos, i, head, key)
    _heap_down(heap, pos, pos[a], n, head, key)
    return n


@njit(cache=True)
def completed_tokens_bound(done_tokens, held_tokens, n_other, remaining_s, ms_per_token):
    """An upper bound on the input + output tokens of the requests completed inside the
    window, at a step boundary with ``remaining_s`` of it left: those completed so far
    (``done_tokens``), every running request's in full (``held_tokens``), and, for the
    ``n_other`` requests of the window neither done nor running, at most one token each more
    than the tokens still scheduled in the window (a request of L tokens needs L - 1 scheduled
    tokens from scratch, more after a preemption), which take ``ms_per_token`` each at least."""
    if remaining_s < 0.0:
        remaining_s = 0.0
    return (done_tokens + held_tokens + max(n_other, 0)
            + remaining_s * 1000.0 / ms_per_token) * (1.0 + 1e-9)


@njit(cache=True, nogil=True)     # nogil: Ctrl-C reaches the main thread while it runs
def simulate_kernel(arrival, adapter, in_len, out_len, n_adapters, load_ms, activation_rank,
                    max_loras, max_rank, kv_blocks, block_size, max_batched_tokens,
                    max_num_seqs, duration, step_coef, max_waiting,
                    first_t, finish_t, stats, itl_hist, stop_tokens, ms_per_token):
    """Simulate requests (sorted by ``arrival``) on one server until ``duration`` seconds.

    Writes ``first_t`` (first-token time, -1 if none) and ``finish_t`` (-1 if unfinished) per
    request, the scalar ``stats`` (indices ``ST_*``) and an inter-token-gap histogram; returns
    ``(running, waiting, computed, generated)``: queue sizes at the end and, per request, the
    tokens held in KV and the tokens generated. ``activation_rank``: each adapter's place in the
    order vLLM activates a step's adapters (``twin.adapter_cache``).
    ``max_loras == 0`` disables LoRA (no distinct-adapter rule, no loads). ``max_waiting > 0``
    refuses arrivals while that many requests wait (the benchmark client's connection limit).

    Early stop (``stop_tokens > 0``): every ``DECIDE_EVERY`` steps the run ends once the input +
    output tokens it can still complete inside the window are bounded below ``stop_tokens``
    (:func:`completed_tokens_bound`, with ``ms_per_token`` from :func:`twin.step_time.min_ms_per_token`); then
    ``stats[ST_DECIDED_T]`` holds the time and ``stats[ST_TOKENS_BOUND]`` the bound.
    """
    n_req = arrival.shape[0]
    lora = max_loras > 0
    n_window = np.searchsorted(arrival, duration)     # requests arriving inside the window
    done_tokens = 0.0                                 # of requests finished inside the window
    n_done = 0

    # per-request state
    computed = np.zeros(n_req, np.int64)
    gen = np.zeros(n_req, np.int64)
    held = np.zeros(n_req, np.int64)
    key = np.zeros(n_req, np.int64)
    nxt = np.full(n_req, -1, np.int64)
    last_tok_t = np.zeros(n_req, np.float64)

    # per-adapter waiting FIFOs, and the heap of the non-empty ones
    head = np.full(n_adapters, -1, np.int64)
    tail = np.full(n_adapters, -1, np.int64)
    heap = np.empty(max(n_adapters, 1), np.int64)
    pos = np.full(n_adapters, -1, np.int64)
    n_heap = 0

    # adapter slots
    slot_of = np.full(n_adapters, -1, np.int64)
    last_used = np.zeros(n_adapters, np.int64)
    resident = np.full(max(max_loras, 1), -1, np.int64)
    n_resident = np.zeros(1, np.int64)
    in_batch = np.full(n_adapters, -1, np.int64)
    tok_of = np.zeros(n_adapters, np.int64)      # tokens each batch adapter gets this step
    touch = np.int64(0)

    # the running requests, in order, with their state kept by place in this list while they
    # run (sequential in memory: the per-request arrays are read on admission and written back
    # when a request leaves, by finishing or preemption, and at the end)
    cap_seqs = min(max_num_seqs, n_req) + 1
    running = np.empty(cap_seqs, np.int64)
    sched_new = np.empty(cap_seqs, np.int64)
    run_adapter = np.empty(cap_seqs, np.int64)
    run_in = np.empty(cap_seqs, np.int64)
    run_out = np.empty(cap_seqs, np.int64)
    run_computed = np.empty(cap_seqs, np.int64)
    run_gen = np.empty(cap_seqs, np.int64)
    run_held = np.empty(cap_seqs, np.int64)
    run_last = np.empty(cap_seqs, np.float64)
    batch_adapters = np.empty(max(n_adapters, 1), np.int64)
    # batch adapters with waiting requests, listed once the batch holds max_loras adapters (no
    # other adapter can join it then, so admission only ever looks among these)
    cand = np.empty(max(n_adapters, 1), np.int64)

    free_blocks = kv_blocks
    n_run = 0
    n_wait = 0
    next_arr = 0
    preempt_key = np.int64(0)
    t = 0.0
    step_id = np.int64(0)

    while True:
        # arrivals up to now join their adapter's FIFO
        while next_arr < n_req and arrival[next_arr] <= t:
            r = next_arr
            next_arr += 1
            if max_waiting > 0 and n_wait >= max_waiting:
                stats[ST_REJECTED] += 1
                continue
            a = adapter[r]
            key[r] = r
            if tail[a] < 0:
                head[a] = r
                tail[a] = r
                n_heap = _heap_push(a, heap, pos, n_heap, head, key)
            else:
                nxt[tail[a]] = r
                tail[a] = r
            n_wait += 1
        if n_wait > stats[ST_MAX_WAITING]:
            stats[ST_MAX_WAITING] = n_wait
        if t >= duration:
            break
        if n_run == 0 and n_wait == 0:
            if next_arr >= n_req or arrival[next_arr] >= duration:
                break
            t = arrival[next_arr]
            continue

        step_id += 1
        budget = max_batched_tokens
        n_distinct = 0
        preempted = False
        n_prefill = 0
        n_decode = 0
        ctx = 0

        # 1) running requests, in order, while budget lasts; preempt from the tail when short
        i = 0
        while i < n_run and budget > 0:
            new = run_in[i] + run_gen[i] - run_computed[i]
            if new > budget:
                new = budget
            ok = True
            while True:
                # its held blocks cover the tokens (a decode step, 15 of 16 times): no division
                tokens = run_computed[i] + new
                need = 0
                if tokens > run_held[i] * block_size:
                    need = blocks_for(tokens, block_size) - run_held[i]
                if need <= free_blocks:
                    free_blocks -= need
                    run_held[i] += need
                    break
                n_run -= 1              # preempt the last one: back to its FIFO's front
                v = running[n_run]
                stats[ST_DROPPED_TOKENS] += run_computed[n_run]
                free_blocks += run_held[n_run]
                held[v] = 0
                computed[v] = 0
                gen[v] = run_gen[n_run]
                last_tok_t[v] = run_last[n_run]
                preempt_key -= 1
                key[v] = preempt_key
                av = adapter[v]
                nxt[v] = head[av]
                head[av] = v
                if tail[av] < 0:
                    tail[av] = v
                    n_heap = _heap_push(av, heap, pos, n_heap, head, key)
                else:
                    _heap_up(heap, pos, pos[av], head, key)   # its head's key only fell
                n_wait += 1
                stats[ST_PREEMPTIONS] += 1
                preempted = True
                if n_run == i:
                    ok = False
                    break
            if not ok:
                break
            sched_new[i] = new
            ctx += run_computed[i]
            if run_gen[i] > 0 and run_in[i] + run_gen[i] - run_computed[i] == 1:
                n_decode += 1
            else:
                n_prefill += new
            # count its tokens in this step's batch (written out here and in 2: a helper taking
            # the arrays costs two atomic reference-count updates per array and call)
            a = run_adapter[i]
            if in_batch[a] != step_id:
                in_batch[a] = step_id
                batch_adapters[n_distinct] = a
                n_distinct += 1
                tok_of[a] = 0
            tok_of[a] += new
            budget -= new
            i += 1
        n_sched = i

        # 2) waiting requests, FCFS with the distinct-adapter rule (not after a preemption).
        # n_scanned: waiting requests the scheduler examines; once the batch holds max_loras
        # adapters vLLM walks the whole deque skipping other adapters' requests.
        n_scanned = 0
        if not preempted and n_sched == n_run:
            wait_before = n_wait
            n_cand = -1                 # candidates not listed yet
            while n_wait > 0 and budget > 0:
                if n_run >= max_num_seqs:
                    break
                best = -1
                best_a = -1
                best_k = -1
                if lora and n_distinct >= max_loras:
                    if n_cand < 0:
                        n_cand = 0
                        for k in range(n_distinct):
                            b = batch_adapters[k]
                            if head[b] >= 0:
                                cand[n_cand] = b
                                n_cand += 1
                    for k in range(n_cand):
                        b = cand[k]
                        h = head[b]
                        if best < 0 or key[h] < key[best]:
                            best = h
                            best_a = b
                            best_k = k
                elif n_heap > 0:
                    best_a = heap[0]
                    best = head[best_a]
                if best < 0:
                    break
                r = best
                new = in_len[r] + gen[r] - computed[r]
                if new > budget:
                    new = budget
                need = blocks_for(computed[r] + new, block_size) - held[r]
                if need > free_blocks:
                    break
                _pop_head(best_a, head, tail, nxt)
                n_heap = _heap_fix(best_a, heap, pos, n_heap, head, key)
                if best_k >= 0 and head[best_a] < 0:     # its FIFO emptied: no more a candidate
                    n_cand -= 1
                    cand[best_k] = cand[n_cand]
                n_wait -= 1
                free_blocks -= need
                running[n_run] = r
                sched_new[n_run] = new
                run_adapter[n_run] = best_a
                run_in[n_run] = in_len[r]
                run_out[n_run] = out_len[r]
                run_computed[n_run] = computed[r]
                run_gen[n_run] = gen[r]
                run_held[n_run] = held[r] + need
                run_last[n_run] = last_tok_t[r]
                ctx += computed[r]
                if gen[r] > 0 and in_len[r] + gen[r] - computed[r] == 1:
                    n_decode += 1
                else:
                    n_prefill += new
                n_run += 1
                n_sched += 1
                if in_batch[best_a] != step_id:       # (as in 1)
                    in_batch[best_a] = step_id
                    batch_adapters[n_distinct] = best_a
                    n_distinct += 1
                    tok_of[best_a] = 0
                tok_of[best_a] += new
                budget -= new
                n_scanned += 1
            if lora and n_distinct >= max_loras and wait_before > 0:
                n_scanned = wait_before

        if n_sched == 0:
            # nothing can run until something arrives (cannot happen with validated inputs)
            if next_arr >= n_req or arrival[next_arr] >= duration:
                break
            if arrival[next_arr] > t:
                t = arrival[next_arr]
            continue

        # 3) step duration (the composition was counted while scheduling)
        n_tiles = 0
        for k in range(n_distinct):
            n_tiles += (tok_of[batch_adapters[k]] + LORA_TILE - 1) // LORA_TILE
        load_total = 0.0
        if lora:
            load_total, loads, touch = activate_batch(
                batch_adapters, n_distinct, slot_of, last_used, resident, n_resident,
                max_loras, activation_rank, touch, load_ms)
            stats[ST_LOADS] += loads
            if n_distinct >= max_loras:
                stats[ST_SCHED_STEPS_MAXED] += 1
        dt = (step_time_ms(step_coef, n_sched, n_prefill, n_decode, ctx, n_distinct,
                           max_loras, max_rank, n_scanned, n_tiles) + load_total) / 1000.0
        accumulate_design(stats, ST_DESIGN, step_coef, n_sched, n_prefill,
                          n_decode, ctx, n_distinct, max_loras, max_rank, n_scanned, n_tiles)
        t_end = t + dt
        used = kv_blocks - free_blocks
        stats[ST_STEPS] += 1
        stats[ST_BUSY_S] += dt
        stats[ST_LOAD_S] += load_total / 1000.0
        stats[ST_RUNNING_S] += n_run * dt
        stats[ST_KV_BLOCKS_S] += used * dt
        stats[ST_DISTINCT_S] += n_distinct * dt
        stats[ST_PREFILL_TOKENS] += n_prefill
        stats[ST_DECODE_TOKENS] += n_decode
        if n_run > stats[ST_MAX_RUNNING]:
            stats[ST_MAX_RUNNING] = n_run
        if used > stats[ST_MAX_KV_BLOCKS]:
            stats[ST_MAX_KV_BLOCKS] = used
        if n_distinct > stats[ST_MAX_DISTINCT]:
            stats[ST_MAX_DISTINCT] = n_distinct

        # 4) advance scheduled requests; finished ones leave the running list (order kept).
        # A request that also got a token in the previous step (which ended at t) has the gap
        # t_end - t: its histogram bin is computed once per step.
        step_bin = itl_bin((t_end - t) * 1000.0)
        keep = 0
        for k in range(n_run):
            done = False
            if k < n_sched:
                run_computed[k] += sched_new[k]
                if run_computed[k] == run_in[k] + run_gen[k]:
                    run_gen[k] += 1
                    if run_gen[k] == 1:
                        first_t[running[k]] = t_end
                    elif run_last[k] == t:
                        itl_hist[step_bin] += 1
                    else:
                        itl_hist[itl_bin((t_end - run_last[k]) * 1000.0)] += 1
                    run_last[k] = t_end
                    if run_gen[k] >= run_out[k]:
                        done = True
                        r = running[k]
                        finish_t[r] = t_end
                        if t_end <= duration:
                            done_tokens += run_in[k] + run_out[k]
                            n_done += 1
                        free_blocks += run_held[k]
                        computed[r] = run_computed[k]
                        gen[r] = run_gen[k]
                        last_tok_t[r] = t_end
            if not done:
                if keep != k:
                    running[keep] = running[k]
                    run_adapter[keep] = run_adapter[k]
                    run_in[keep] = run_in[k]
                    run_out[keep] = run_out[k]
                    run_computed[keep] = run_computed[k]
                    run_gen[keep] = run_gen[k]
                    run_held[keep] = run_held[k]
                    run_last[keep] = run_last[k]
                keep += 1
        n_run = keep
        t = t_end
        if stop_tokens > 0.0 and stats[ST_STEPS] % DECIDE_EVERY == 0 and t < duration:
            held_tokens = 0.0
            for k in range(n_run):
                held_tokens += run_in[k] + run_out[k]
            bound = completed_tokens_bound(done_tokens, held_tokens, n_window - n_done - n_run,
                                           duration - t, ms_per_token)
            if bound < stop_tokens:
                stats[ST_DECIDED_T] = t
                stats[ST_TOKENS_BOUND] = bound
                break
    stats[ST_END_T] = t
    for k in range(n_run):              # the running requests' state, written back
        r = running[k]
        computed[r] = run_computed[k]
        gen[r] = run_gen[k]
        held[r] = run_held[k]
        last_tok_t[r] = run_last[k]
    return n_run, n_wait, computed, gen
