"""A packing into a target number of bins by tabu search, for one-capacity bin packing.

The exact models prove a bin count quickly once a solution meets their bound, but on the hard
classical classes (Hard28, Wäscher) neither CP-SAT nor the LP dive finds a packing into
ceil(LP) bins: they stop one bin above it. This search, after the consistent-neighbourhood
search of Buljubašić & Vasquez (2016), looks for one directly.

State: ``K = target - 2`` feasible bins and a set ``S`` of unpacked items; the search ends when
``S`` splits into two bins (``K + 2 = target``). One iteration applies the best non-tabu swap
between one bin ``b`` and ``S``: up to two items ``p`` leave ``b`` for ``S`` and one or two
items ``q`` of ``S`` enter ``b``, keeping ``load(b) - w(p) + w(q) <= C``; the best swap is the one
that moves most weight out of ``S`` (``w(q) - w(p)``, possibly negative when none gains). Items
just moved are tabu for a random tenure, unless the swap reaches a lighter ``S`` than ever. When
no swap gains, every bin is refilled with the heaviest subset of its items and ``S`` that fits
(a subset-sum table; at most every ``REFILL_EVERY`` iterations).

Measured (``python -m experiments.classical_bpp --data ...``, BPPLIB files): it packs every
Falkenauer u120 instance into ceil(total / capacity) bins within a second, 12 of the 17 Wäscher
instances too; none of Hard28 within 8 s (those need ceil(LP) bins with almost no slack: the
search stalls about one item's weight short).

Exact for what it returns (every bin is checked), incomplete otherwise: ``None`` says nothing
about the target. Deterministic for a seed and an iteration budget.
"""

from __future__ import annotations

import time
from typing import Sequence

import numpy as np
from numba import njit

CHUNK_MAX = 10_000          # search steps per compiled call (about 0.1 s here; the deadline and
                            # Ctrl-C are seen between calls). A fixed schedule, not a timed one:
                            # the calls' boundaries shape the search, so the clock must not
CHUNK_CAP_REF = 10_000      # a step's subset-sum tables grow with the capacity: above this one
                            # the calls shrink in proportion (capacity 100,000: 1,000 steps, about
                            # 0.5 s; a full call there took 5 s, past a 6 s deadline's share)
TENURE = (3, 12)            # tabu tenure range, in iterations
REFILL_EVERY = 20           # iterations between two refill passes over every bin


def first_fit_decreasing(weights: Sequence[int], capacity: int) -> list[list[int]]:
    """First-fit decreasing: item indices per bin."""
    order = sorted(range(len(weights)), key=lambda i: -weights[i])
    bins: list[list[int]] = []
    loads: list[int] = []
    for i in order:
        for b, ld in enumerate(loads):
            if ld + weights[i] <= capacity:
                bins[b].append(i)
                loads[b] += weights[i]
                break
        else:
            bins.append([i])
            loads.append(weights[i])
    return bins


def two_bin_split(weights: Sequence[int], items: Sequence[int], capacity: int
                  ) -> tuple[list[int], list[int]] | None:
    """``items`` split into two bins of ``capacity`` (subset-sum table), or None."""
    total = sum(weights[i] for i in items)
    if total > 2 * capacity:
        return None
    reach = {0: -1}                       # sum -> last item index in items that made it
    parent: dict[int, int] = {}
    for k, i in enumerate(items):
        for s in list(reach):
            t = s + weights[i]
            if t <= capacity and t not in reach:
                reach[t] = k
                parent[t] = s
    best = max(reach)
    if total - best > capacity:
        return None
    first, s = [], best
    while s:
        first.append(items[reach[s]])
        s = parent[s]
    rest = [i for i in items if i not in set(first)]
    return first, rest


@njit(cache=True)
def best_swap(w, cap, K, bin_items, bin_cnt, load, s_items, s_cnt, tabu_until, it, s_weight,
              best_s_weight, rng):
    """The best admissible swap (module docstring): ``(gain, b, pa, pb, qa, qb)``, positions in
    ``b``'s list (``pa``, ``pb``; -1 = none) and in ``S`` (``qa``; ``qb`` -1 = none); ``b`` = -1
    when no swap is admissible. Best = most weight out of ``S``, then most items into ``S`` (more,
    smaller unpacked items combine in more ways); ties drawn uniformly with ``rng``."""
    best_score = -(1 << 62)
    best_gain = 0
    ties = 0
    bb = -1
    bpa = -1
    bpb = -1
    bqa = -1
    bqb = -1
    for b in range(K):
        cnt = bin_cnt[b]
        for pa in range(-1, cnt):
            for pb in range(-1, cnt):
                if pa == -1 and pb != -1:
                    continue
                if pb != -1 and pb <= pa:
                    continue
                wp = 0
                ptabu = False
                if pa >= 0:
                    ia = bin_items[b, pa]
                    wp += w[ia]
                    ptabu = ptabu or tabu_until[ia] > it
                if pb >= 0:
                    ib = bin_items[b, pb]
                    wp += w[ib]
                    ptabu = ptabu or tabu_until[ib] > it
                room = cap - load[b] + wp
                for qa in range(s_cnt):
                    ja = s_items[qa]
                    if w[ja] > room:
                        continue
                    for qb in range(-1, s_cnt):
                        if qb != -1 and qb <= qa:
                            continue
                        wq = w[ja]
                        tabu = ptabu or tabu_until[ja] > it
                        if qb >= 0:
                            jb = s_items[qb]
                            wq += w[jb]
                            if wq > room:
                                continue
                            tabu = tabu or tabu_until[jb] > it
                        gain = wq - wp
                        if gain == 0 and pb == -1 and qb == -1:
                            continue            # one item for one of the same weight
                        if gain == 0 and pa == -1:
                            continue
                        if tabu and s_weight - gain >= best_s_weight:
                            continue            # tabu, and no new best
                        n_in = 1 if qb == -1 else 2
                        n_out = (0 if pa == -1 else 1) + (0 if pb == -1 else 1)
                        score = gain * 8 + (n_out - n_in + 2)
                        if score < best_score:
                            continue
                        if score == best_score:
                            ties += 1
                            if _rand(rng) % ties != 0:
                                continue
                        else:
                            ties = 1
                        best_score = score
                        if True:
                            best_gain = gain
                            bb = b
                            bpa = pa
                            bpb = pb
                            bqa = qa
                            bqb = qb
    return best_gain, bb, bpa, bpb, bqa, bqb


@njit(cache=True)
def _rand(rng):
    """Next value of a 32-bit xorshift generator kept in ``rng[0]``."""
    x = rng[0]
    x ^= (x << 13) & 0xFFFFFFFF
    x ^= x >> 17
    x ^= (x << 5) & 0xFFFFFFFF
    rng[0] = x
    return x


@njit(cache=True)
def _remove_at(arr, cnt, k):
    arr[k] = arr[cnt - 1]
    return cnt - 1


@njit(cache=True)
def splits_in_two(w, s_items, s_cnt, cap, total):
    """The items ``s_items[:s_cnt]`` (weight ``total``) fit two bins of ``cap``."""
    if total > 2 * cap:
        return False
    reach = np.zeros(cap + 1, np.bool_)
    reach[0] = True
    for k in range(s_cnt):
        x = w[s_items[k]]
        for t in range(cap, x - 1, -1):
            if reach[t - x]:
                reach[t] = True
    for t in range(max(total - cap, 0), cap + 1):
        if reach[t]:
            return True
    return False


@njit(cache=True)
def refill_bin(w, cap, b, bin_items, bin_cnt, load, s_items, s_cnt, last, prev, pool):
    """Refill bin ``b`` with the heaviest subset of its items and ``S`` that fits (a subset-sum
    table over the capacity); returns the new size of ``S`` and the weight it lost (0 when the
    bin was already a heaviest subset, nothing moved). ``last``/``prev``/``pool``: scratch."""
    m = 0
    for k in range(bin_cnt[b]):
        pool[m] = bin_items[b, k]
        m += 1
    for k in range(s_cnt):
        pool[m] = s_items[k]
        m += 1
    last[:cap + 1] = -1
    last[0] = m                             # reached by no item
    top = 0
    for k in range(m):
        x = w[pool[k]]
        if x == 0 or x > cap:
            continue
        for c in range(min(cap, top + x), x - 1, -1):
            if last[c] < 0 and last[c - x] >= 0 and last[c - x] != k:
                last[c] = k
                prev[c] = c - x
        if top + x <= cap:
            top += x
        else:
            top = cap
    best = cap
    while last[best] < 0:
        best -= 1
    if best <= load[b]:
        return s_cnt, 0
    gain = best - load[b]
    chosen = np.zeros(m, np.bool_)
    c = best
    while c > 0:
        chosen[last[c]] = True
        c = prev[c]
    bin_cnt[b] = 0
    s_cnt = 0
    for k in range(m):
        if chosen[k]:
            bin_items[b, bin_cnt[b]] = pool[k]
            bin_cnt[b] += 1
        else:
            s_items[s_cnt] = pool[k]
            s_cnt += 1
    load[b] = best
    return s_cnt, gain


@njit(cache=True)
def tabu_run(w, cap, K, bin_items, bin_cnt, load, s_items, s_cnt_arr, tabu_until, it0, iters,
             rng_state, best_s_weight_arr):
    """Up to ``iters`` iterations from iteration ``it0``, stopping as soon as ``S`` fits two
    bins. Mutates the state arrays; returns (next iteration number, found)."""
    s_cnt = s_cnt_arr[0]
    s_weight = 0
    for k in range(s_cnt):
        s_weight += w[s_items[k]]
    lo, hi = TENURE
    it = it0
    found = False
    last = np.empty(cap + 1, np.int64)
    prev = np.empty(cap + 1, np.int64)
    pool = np.empty(w.shape[0], np.int64)
    next_refill = it0
    while it < it0 + iters:
        if s_weight <= 2 * cap and splits_in_two(w, s_items, s_cnt, cap, s_weight):
            found = True
            break
        gain, b, pa, pb, qa, qb = best_swap(w, cap, K, bin_items, bin_cnt, load, s_items, s_cnt,
                                            tabu_until, it, s_weight, best_s_weight_arr[0],
                                            rng_state)
        it += 1
        if gain <= 0 and it >= next_refill:  # no swap gains: refill each bin from it and S
            next_refill = it + REFILL_EVERY
            moved = 0
            for bb in range(K):
                s_cnt, g = refill_bin(w, cap, bb, bin_items, bin_cnt, load, s_items, s_cnt,
                                      last, prev, pool)
                moved += g
            if moved > 0:
                s_weight -= moved
                if s_weight < best_s_weight_arr[0]:
                    best_s_weight_arr[0] = s_weight
                continue
        if b < 0:
            continue
        # items leaving the bin (pb first: it is after pa in the list)
        out_a = bin_items[b, pa] if pa >= 0 else -1
        out_b = bin_items[b, pb] if pb >= 0 else -1
        in_a = s_items[qa]
        in_b = s_items[qb] if qb >= 0 else -1
        if qb >= 0:
            s_cnt = _remove_at(s_items, s_cnt, qb)
        s_cnt = _remove_at(s_items, s_cnt, qa)
        if pb >= 0:
            bin_cnt[b] = _remove_at(bin_items[b], bin_cnt[b], pb)
        if pa >= 0:
            bin_cnt[b] = _remove_at(bin_items[b], bin_cnt[b], pa)
        for j in (in_a, in_b):
            if j >= 0:
                bin_items[b, bin_cnt[b]] = j
                bin_cnt[b] += 1
                load[b] += w[j]
                tabu_until[j] = it + lo + _rand(rng_state) % (hi - lo + 1)
        for j in (out_a, out_b):
            if j >= 0:
                s_items[s_cnt] = j
                s_cnt += 1
                load[b] -= w[j]
                tabu_until[j] = it + lo + _rand(rng_state) % (hi - lo + 1)
        s_weight -= gain
        if s_weight < best_s_weight_arr[0]:
            best_s_weight_arr[0] = s_weight
    s_cnt_arr[0] = s_cnt
    return it, found


def pack_into(weights: Sequence[int], capacity: int, target: int, deadline: float,
              seed: int = 0, max_iters: int | None = None) -> list[list[int]] | None:
    """Item indices per bin of a packing into at most ``target`` bins, found before the
    ``time.perf_counter()`` ``deadline`` (and within ``max_iters`` search steps, when given: a
    budget that does not depend on the machine's speed); None when none was found (no proof of
    anything). The search path depends on ``seed`` only, never on the clock."""
    w = np.asarray(weights, np.int64)
    n = len(w)
    if n == 0:
        return []
    if w.max() > capacity or target < 1:
        return None
    ffd = first_fit_decreasing(list(w), capacity)
    if len(ffd) <= target:
        return ffd
    if target < 3:
        return None                     # nothing to search: the K bins would be empty
    K = target - 2
    # keep the K fullest FFD bins; every other item starts unpacked
    by_load = sorted(ffd, key=lambda b: -sum(int(w[i]) for i in b))
    width = int(capacity // max(int(w.min()), 1)) + 1
    bin_items = np.full((K, min(width, n)), -1, np.int64)
    bin_cnt = np.zeros(K, np.int64)
    load = np.zeros(K, np.int64)
    for b, items in enumerate(by_load[:K]):
        bin_cnt[b] = len(items)
        bin_items[b, :len(items)] = items
        load[b] = sum(int(w[i]) for i in items)
    rest = [i for items in by_load[K:] for i in items]
    s_items = np.full(n, -1, np.int64)
    s_items[:len(rest)] = rest
    s_cnt = np.array([len(rest)], np.int64)
    tabu_until = np.zeros(n, np.int64)
    rng = np.array([(seed * 2654435761 + 12345) % (1 << 32) or 1], np.int64)
    best_s = np.array([int(w[rest].sum())], np.int64)
    it, chunk = 0, 100
    chunk_max = max(chunk, CHUNK_MAX * CHUNK_CAP_REF // max(int(capacity), CHUNK_CAP_REF))
    while time.perf_counter() < deadline and (max_iters is None or it < max_iters):
        if max_iters is not None:
            chunk = max(1, min(chunk, int(max_iters) - it))
        it, found = tabu_run(w, capacity, K, bin_items, bin_cnt, load, s_items, s_cnt,
                             tabu_until, it, chunk, rng, best_s)
        chunk = min(chunk * 4, chunk_max)
        if found:
            split = two_bin_split(list(w), [int(i) for i in s_items[:s_cnt[0]]], capacity)
            if split is None:               # cannot happen: the compiled check said it splits
                raise RuntimeError("bpp_search: S does not split in two bins")
            bins = [[int(i) for i in bin_items[b, :bin_cnt[b]]] for b in range(K)]
            bins += [list(x) for x in split if x]
            for b in bins:
                if sum(int(w[i]) for i in b) > capacity:
                    raise RuntimeError("bpp_search: a bin over capacity")
            return bins
    return None


__all__ = ["first_fit_decreasing", "two_bin_split", "best_swap", "splits_in_two", "tabu_run",
           "pack_into"]
