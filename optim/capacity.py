"""Profile-derived capacities the placement methods share.

* ``backbone_max_throughput`` — tokens/s one GPU sustains with LoRA disabled (``max_loras = 0``)
  under a saturating load: the twin kernel is run directly because ``ServerConfig`` requires
  ``max_loras >= 1``. MaxBase packs up to it; it bounds any LoRA configuration from above (LoRA
  only adds work), which makes it the capacity of the infeasibility pre-checks.
* ``lora_max_throughput`` — the same with LoRA on (one rank class, a fixed slot count): the
  per-rank "operating point" LoRAServe budgets GPUs with.
* ``carry_limit`` — the largest expected offered load a GPU with ``n`` equal-rate adapters of a
  rank carries unstarved in the twin, measured with the window and workload seeds of
  verification, plus a margin from the run-to-run spread: the twin-sound lower bounds on GPU
  counts (``optim.feasibility``) use it.
* ``max_startable_amax`` — the largest Amax whose (Amax, rank) configuration starts.
* ``adapter_kv_cost`` — KV tokens one adapter slot of a rank costs (dLoRA's memory model).

Saturation is measured in two passes: a first run at a load far above any GPU's capacity gives
an estimate ``T``; the reported value is the throughput of a run offered ``1.25 x T`` (an
unbounded overload would let the waiting queue, whose scan cost the step model charges, grow
without limit and understate the capacity). Results are cached per (profile, lengths).

Least-work server. Every LoRA step costs ``c0 + ... + m x (c4 + c5 A + c6 tok A + c7 K + c8
tiles) + c9 W`` (``twin.step_time``; all coefficients >= 0): for a given batch, one adapter
(K = 1, the fewest tiles) of the smallest rank (m smallest, largest KV cache) minimises every
LoRA term but two that pull in opposite directions — the slot terms (c5, c6: fewest at A = 1)
and the waiting-queue scan c9 W, paid on every step whose batch already holds ``A`` adapters
(always with A = 1 and a queue, never with one adapter on A >= 2). A >= 3 costs more than A = 2
per step with the same KV cache (every Amax up to 8 shares the KV entry of 8), so one adapter
on Amax 1 or 2 is the least-work server; which of the two carries more is measured (on the H100
profiles Amax 2 does: the scan costs more than a second idle slot).
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from twin import kernel as K
from twin.lengths import LengthModel
from twin.sharegpt import default_lengths
from twin.metrics import compute_metrics
from twin.profile import GpuProfile, load_profile
from twin.server import Judging, ServerConfig, simulate_requests, simulate_server
from twin.slo import Slo
from twin.workload import Adapter, generate_requests

from .disk_cache import read_json_cached, update_json

SATURATION_DURATION_S = 900.0
_FIRST_PASS_TPS = 40_000.0      # far above any calibrated GPU (the H100 backbone is ~18-20k)
_cache: dict[tuple, float] = {}


def _profile(p: GpuProfile | str) -> GpuProfile:
    return p if isinstance(p, GpuProfile) else load_profile(p)


def _key(*parts) -> tuple:
    return tuple(json.dumps(x.to_dict(), sort_keys=True) if hasattr(x, "to_dict") else x
                 for x in parts)


def _backbone_run(prof: GpuProfile, lengths: LengthModel, offered_tps: float,
                  duration_s: float, seed: int) -> float:
    rate = offered_tps / (lengths.mean_input + lengths.mean_output)
    reqs = generate_requests([Adapter("backbone", min(prof.supported_ranks), rate)], duration_s,
                             lengths, seed=seed)
    n = len(reqs)
    first_t, finish_t = np.full(n, -1.0), np.full(n, -1.0)
    stats = np.zeros(K.N_STATS)
    hist = np.zeros(K.ITL_HIST_BINS, np.int64)
    kv_blocks = prof.backbone_kv_tokens // prof.block_size
    K.simulate_kernel(reqs.arrival_s, reqs.adapter.astype(np.int64),
                      reqs.input_len.astype(np.int64), reqs.output_len.astype(np.int64), 1,
                      np.zeros(1), np.zeros(1, np.int64), 0, min(prof.supported_ranks),
                      kv_blocks, prof.block_size,
                      prof.max_num_batched_tokens, prof.max_num_seqs, float(duration_s),
                      prof.step_coef_array(), 0, first_t, finish_t, stats, hist, 0.0, 0.0)
    m = compute_metrics(reqs.arrival_s, reqs.input_len, reqs.output_len, first_t, finish_t,
                        stats, hist, duration_s, offered_tps, kv_blocks, prof.block_size)
    return m.throughput_tps


def backbone_max_throughput(profile: GpuProfile | str, lengths: LengthModel | None = None,
                            duration_s: float = SATURATION_DURATION_S, seed: int = 0) -> float:
    """Tokens/s of one GPU serving the base model alone (LoRA disabled) under saturation."""
    prof = _profile(profile)
    lengths = lengths if lengths is not None else default_lengths()
    key = _key("backbone", prof.name, lengths, duration_s, seed)
    if key not in _cache:
        first = _backbone_run(prof, lengths, _FIRST_PASS_TPS, duration_s, seed)
        _cache[key] = _backbone_run(prof, lengths, 1.25 * first, duration_s, seed)
    return _cache[key]


def _lora_run(prof: GpuProfile, cfg: ServerConfig, n_adapters: int, offered_tps: float,
              lengths: LengthModel, duration_s: float, seed: int) -> float:
    """Throughput of ``n_adapters`` equal-rate adapters of ``cfg.max_lora_rank`` offered
    ``offered_tps`` in total on a server configured ``cfg``."""
    rate = offered_tps / (lengths.mean_input + lengths.mean_output) / n_adapters
    ads = [Adapter(f"op{i}", cfg.max_lora_rank, rate) for i in range(n_adapters)]
    reqs = generate_requests(ads, duration_s, lengths, seed=seed)
    return simulate_requests(prof, ads, reqs, cfg, duration_s).throughput_tps


def lora_max_throughput(profile: GpuProfile | str, rank: int, lengths: LengthModel | None = None,
                        n_adapters: int = 32, duration_s: float = SATURATION_DURATION_S,
                        seed: int = 0) -> float:
    """Tokens/s of one GPU serving ``n_adapters`` equal-rate adapters of ``rank`` with Amax =
    ``n_adapters`` under saturation (the rank's operating point)."""
    prof = _profile(profile)
    lengths = lengths if lengths is not None else default_lengths()
    key = _key("lora", prof.name, rank, lengths, n_adapters, duration_s, seed)
    if key not in _cache:
        amax = min(n_adapters, max_startable_amax(prof, rank))
        if amax < 1:
            raise ValueError(f"profile '{prof.name}': no configuration with rank {rank} starts")
        cfg = ServerConfig(max_loras=amax, max_lora_rank=rank)
        first = _lora_run(prof, cfg, n_adapters, _FIRST_PASS_TPS, lengths, duration_s, seed)
        _cache[key] = _lora_run(prof, cfg, n_adapters, 1.25 * first, lengths, duration_s, seed)
    return _cache[key]


# ----------------------------------------------------------------------------- twin-sound limits
BOUND_SEEDS = 8            # verification seeds inst.seed + 0 .. inst.seed + 7
COUNT_SEEDS = 4            # the first 4 of them for limits of several adapters
LEAST_WORK_AMAX = (1, 2)   # one adapter: the configurations that can do the least work per step
SPREAD_SIGMAS = 4.0        # margin: mean + 4 sample standard deviations over the seeds
LIMIT_RTOL = 1e-3          # bisection resolution of a limit (relative)
SLO_BRACKET_STEP = 1.25    # downward bracket step of a limit under a latency SLO (far below)
_LIMIT_VERSIONS = (1, 6)    # one adapter, several: bump when a measurement changes (disk cache)


@dataclass(frozen=True)
class CarryLimit:
    """Largest expected offered load (tok/s) one GPU carries unstarved in the twin with
    ``n_adapters`` equal-rate adapters of ``rank`` (``max_lora_rank = rank``).

    ``per_seed_tps[i]`` is the limit measured with workload seed ``seeds[i]`` at the best
    configuration (``amax``; for one adapter the better of Amax 1 and 2 per seed), found by
    bisection on the load (resolution ``LIMIT_RTOL``); ``limit_tps`` = max(largest measured,
    mean + ``SPREAD_SIGMAS`` x ``spread_tps``), ``spread_tps`` being the sample standard
    deviation of the per-seed limits (the run-to-run spread of a saturated GPU: realised load
    and completions in the window vary with the draw; one adapter: the larger deviation of
    Amax 1 and 2; several adapters: at least the one-adapter deviation relative to its limit).
    A normal draw exceeds mean + 4 sd with probability 3e-5."""

    profile: str
    rank: int
    n_adapters: int
    amax: int
    duration_s: float
    threshold: float
    seeds: tuple[int, ...]
    per_seed_tps: tuple[float, ...]
    spread_tps: float
    limit_tps: float

    def to_dict(self) -> dict:
        return asdict(self)


def _cache_path() -> Path:
    root = os.environ.get("LORA_PLACEMENT_CACHE")
    base = Path(root) if root else Path.home() / ".cache" / "lora-placement"
    return base / "carry_limits.json"


SHIPPED_LIMITS = Path(__file__).resolve().parent / "data" / "carry_limits.json"


STORE_ENV = "LORA_PLACEMENT_STORE"


def _store_path() -> Path | None:
    """The search store a study keeps beside its results (``$LORA_PLACEMENT_STORE``, set by
    the studies' ``--search-store``): the bound searches' verdicts and saved progress, in a
    committed file, so a stopped search goes on in a later session on a machine whose user
    cache is empty. None: no store."""
    path = os.environ.get(STORE_ENV)
    return Path(path) if path else None


def _disk_layers() -> list[Path]:
    return [p for p in (_cache_path(), _store_path(), SHIPPED_LIMITS) if p is not None]


def _disk_get(key: str) -> dict | None:
    """A cached limit: the user's cache first, then the search store (``_store_path``), then
    the limits shipped with the package (``optim/data/carry_limits.json``: measured by this
    module on the shipped profiles; keys hash the profile's content, the window, seeds and the
    twin's fingerprint, so an entry is used only where the same measurement would be
    repeated)."""
    for path in _disk_layers():
        hit = read_json_cached(path).get(key)
        if hit is not None:
            return hit
    return None


def _disk_get_all(key: str) -> list[dict]:
    """Every layer's entry under ``key`` (user cache, search store, shipped), for records that
    grow (a search's saved progress: the caller takes the furthest)."""
    return [hit for path in _disk_layers() if (hit := read_json_cached(path).get(key)) is not None]


def _disk_put(key: str, value: dict, durable: bool = False) -> None:
    """Add one entry to the user's cache (``optim.disk_cache``: under a lock, atomically);
    ``durable`` (a bound search's verdict or progress): to the search store as well, when a
    study keeps one."""
    update_json(_cache_path(), {key: value})
    store = _store_path()
    if durable and store is not None and not update_json(store, {key: value}) \
            and store not in _unwritable:
        _unwritable.add(store)
        warnings.warn(f"${STORE_ENV}={store}: cannot write the search store; this run's "
                      "search results are kept in the user cache only", stacklevel=2)


_unwritable: set[Path] = set()


_fingerprints: dict[str, str] = {}


def twin_fingerprint(prof: GpuProfile) -> str:
    """Hash of a short, loaded multi-rank twin run on ``prof``: it changes whenever the twin's
    behaviour does (step-time terms, scheduler, profile values), so cached limits measured with
    an older twin are not reused."""
    key = json.dumps(prof.to_dict(), sort_keys=True)
    if key not in _fingerprints:
        ranks = sorted(prof.supported_ranks)[:3]
        ads = [Adapter(f"f{i}", r, 4.0 + 3 * i) for i, r in enumerate(ranks)]
        amax = max((a for (a, r) in prof.kv_capacity if r == max(ranks)), default=1)
        m = simulate_server(prof, ads, ServerConfig(max_loras=min(2, amax)), 60.0,
                            lengths=default_lengths(), seed=0)
        blob = json.dumps([key, m.throughput_tps, m.offered_realised_tps, m.mean_itl_ms,
                           m.to_dict().get("steps")], sort_keys=True, default=str)
        _fingerprints[key] = hashlib.sha256(blob.encode()).hexdigest()[:16]
    return _fingerprints[key]


def slo_key(prof: GpuProfile, slo: Slo | None) -> dict | None:
    """What a twin verdict under ``slo`` depends on beyond the engine (``twin_fingerprint``):
    the SLO and, when it judges a client's latencies, the profile's fitted latency-tail
    constants (``twin.latency_tail``) — a refit of those changes every such verdict."""
    if slo is None:
        return None
    tail = None
    if slo.latency == "client":
        from twin.latency_tail import latency_tail_for
        t = latency_tail_for(prof)
        tail = None if t is None else t.to_dict()
    return {"slo": slo.to_dict(), "latency_tail": tail}


def _limit_key(prof: GpuProfile, rank: int, n: int, lengths: LengthModel, duration_s: float,
               seeds: tuple[int, ...], threshold: float, slo: Slo | None = None) -> str:
    key = {"v": _LIMIT_VERSIONS[n > 1], "profile": prof.to_dict(), "rank": rank, "n": n,
           "lengths": lengths.to_dict(), "duration_s": float(duration_s),
           "seeds": list(seeds), "threshold": float(threshold),
           "sigmas": SPREAD_SIGMAS, "rtol": LIMIT_RTOL, "twin": twin_fingerprint(prof)}
    if slo is not None:                 # a limit under a latency SLO too
        key["slo"] = slo_key(prof, slo)
    blob = json.dumps(key, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def _carry_key(prof: GpuProfile, rank: int, n: int, lengths: LengthModel, duration_s: float,
               seeds: tuple[int, ...], threshold: float, slo: Slo | None = None) -> str:
    """Cache key of ``carry_limit``: several adapters are measured on the first
    ``COUNT_SEEDS`` seeds (their spread floor comes from the one-adapter limit on all)."""
    return _limit_key(prof, rank, n, lengths, duration_s,
                      seeds if n == 1 else seeds[:COUNT_SEEDS] + (len(seeds),), threshold, slo)


def _equal_jobs(prof: GpuProfile, rank: int, n: int, amax: int, loads: Sequence[float],
                lengths: LengthModel, threshold: float, slo: Slo | None = None):
    from twin.fleet import GpuAssignment
    per = lengths.mean_input + lengths.mean_output
    cfg = Judging(threshold, slo).server_config(int(amax), rank)
    # the profile itself, not its name: a profile given as a file path has no shipped name
    return [GpuAssignment(prof, cfg, tuple((Adapter(f"e{i}", rank, load / per / n), 1.0)
                                                for i in range(n))) for load in loads]


def _unstarved(prof: GpuProfile, rank: int, n: int, jobs: Sequence[tuple[int, float, int]],
               lengths: LengthModel, duration_s: float, threshold: float, pool,
               slo: Slo | None = None) -> list[bool]:
    """Twin verdicts of (amax, expected load, seed) jobs with ``n`` equal-rate adapters
    (accepted: not starved, started, and meeting ``slo`` when given)."""
    from twin.fleet import simulate_fleet
    gpus = [_equal_jobs(prof, rank, n, a, [load], lengths, threshold, slo)[0]
            for a, load, _ in jobs]
    res = simulate_fleet(gpus, duration_s=duration_s, lengths=lengths, workers=1, pool=pool,
                         check_routing=False, seeds=[s for _, _, s in jobs])
    return [m.accepted for m in res.per_gpu]


def _bisect_limits(prof: GpuProfile, rank: int, n: int, pairs: Sequence[tuple[int, int]],
                   guess: float, lengths: LengthModel, duration_s: float, threshold: float,
                   pool, slo: Slo | None = None, rtol: float = LIMIT_RTOL) -> list[float]:
    """Largest unstarved expected load of each (amax, seed) pair, all pairs bisected in lockstep
    (one parallel twin batch per round). Brackets grow by 1 % steps from ``guess``; after the
    bisection, a load 1 % above the result is replayed, and a pair found unstarved there is
    bisected again from that load (throughput need not fall monotonically). Under a latency
    ``slo`` the limit can lie far below a throughput guess: the bracket then steps down by
    ``SLO_BRACKET_STEP`` (up by 1 % as before); so does a bracket without one once it is below
    half the guess (a short window, whose requests still running at its end count as unserved,
    puts the limit there), the 1 % steps above it unchanged. ``ValueError`` when the load is
    starved even at ``1e-4`` x the guess."""
    floor = 1e-4
    lo = [0.0] * len(pairs)
    hi = [0.0] * len(pairs)
    probe = [guess] * len(pairs)
    for _ in range(3):                                 # at most two restarts per pair
        while True:                                    # bracket
            todo = [i for i in range(len(pairs)) if lo[i] == 0.0 or hi[i] == 0.0]
            if not todo:
                break
            ok = _unstarved(prof, rank, n, [(pairs[i][0], probe[i], pairs[i][1]) for i in todo],
                            lengths, duration_s, threshold, pool, slo)
            for i, good in zip(todo, ok):
                if good:
                    lo[i] = max(lo[i], probe[i])
                    probe[i] *= 1.01
                else:
                    hi[i] = probe[i] if hi[i] == 0.0 else min(hi[i], probe[i])
                    probe[i] /= (1.01 if slo is None and probe[i] >= 0.5 * guess
                                 else SLO_BRACKET_STEP)
                if lo[i] == 0.0 and probe[i] < floor * guess:
                    raise ValueError(f"profile '{prof.name}': {n} adapter(s) of rank {rank} "
                                     + ("starve" if slo is None else
                                        f"miss the SLO {slo.describe()}")
                                     + f" at every load down to {floor * guess:.3g} tok/s in a "
                                     f"{duration_s:g} s twin window")
        while True:                                    # bisection
            todo = [i for i in range(len(pairs)) if hi[i] / lo[i] > 1 + rtol]
            if not todo:
                break
            mids = {i: (lo[i] * hi[i]) ** 0.5 for i in todo}
            ok = _unstarved(prof, rank, n, [(pairs[i][0], mids[i], pairs[i][1]) for i in todo],
                            lengths, duration_s, threshold, pool, slo)
            for i, good in zip(todo, ok):
                if good:
                    lo[i] = mids[i]
                else:
                    hi[i] = mids[i]
        checks = [(i, 1.01) for i in range(len(pairs))]
        ok = _unstarved(prof, rank, n, [(pairs[i][0], lo[i] * f, pairs[i][1]) for i, f in checks],
                        lengths, duration_s, threshold, pool, slo)
        again = {}
        for (i, f), good in zip(checks, ok):
            if good:
                again[i] = max(again.get(i, 0.0), lo[i] * f)
        if not again:
            break
        for i, load in again.items():
            lo[i], hi[i], probe[i] = load, 0.0, load * 1.01
    return lo


def _measure_limit(prof: GpuProfile, rank: int, n_adapters: int, lengths: LengthModel,
                   duration_s: float, seeds: tuple[int, ...], threshold: float, top: int,
                   one: CarryLimit | None, pool, slo: Slo | None = None) -> CarryLimit:
    """The measurement behind ``carry_limit`` (its docstring), twin runs on ``pool``;
    ``one``: the one-adapter limit (None when measuring it)."""
    if one is None:
        sat = lora_max_throughput(prof, rank, lengths, n_adapters=1,
                                  duration_s=min(duration_s, 900.0), seed=seeds[0])
        amaxes, guess = [a for a in LEAST_WORK_AMAX if a <= top], 1.02 * sat / threshold
        if slo is not None:             # at most the limit without the SLO
            guess = min(guess, carry_limit(prof, rank, 1, lengths, duration_s, seeds, threshold,
                                           1).limit_tps)
    else:
        def score(xs: list[int]) -> list[float]:
            return overload_throughputs(prof, rank, n_adapters, xs, OVERLOAD * one.limit_tps,
                                        lengths, duration_s, threshold, seeds[0], pool=pool)

        best, thr, amaxes = _overload_candidates(score, min(n_adapters + 1, top))
        # the overload optimum need not be the optimum at the limit: one slot per adapter
        # (and one more) are tried too, and every seed keeps its best
        amaxes = sorted(set(amaxes) | ({n_adapters, n_adapters + 1} & set(range(1, top + 1))))
        guess = thr / threshold
        per_seed, amax = _best_of_amaxes(prof, rank, n_adapters, best, amaxes, seeds, guess,
                                         lengths, duration_s, threshold, pool, slo)
        return _carry_limit(prof, rank, n_adapters, amax, duration_s, threshold, seeds,
                            per_seed, one)
    pairs = [(a, s) for a in amaxes for s in seeds]
    lims = _bisect_limits(prof, rank, n_adapters, pairs, guess, lengths, duration_s, threshold,
                          pool, slo)
    by = {a: [lims[pairs.index((a, s))] for s in seeds] for a in amaxes}
    per_seed = [max(by[a][j] for a in amaxes) for j in range(len(seeds))]
    amax = max(amaxes, key=lambda a: (float(np.mean(by[a])), -a))
    return _carry_limit(prof, rank, n_adapters, amax, duration_s, threshold, seeds, per_seed,
                        None, by)


OVERLOAD = 1.05            # x the one-adapter limit: the load Amax are ranked at (saturated)
CANDIDATE_RTOL = 0.02      # Amax within 2 % of the best saturated throughput: limit candidates
CANDIDATE_MAX = 4          # ... at most this many of them, the best first (noisy plateaus)


def overload_throughputs(prof: GpuProfile, rank: int, n: int, amaxes: Sequence[int],
                         load_tps: float, lengths: LengthModel, duration_s: float,
                         threshold: float, seed: int, pool=None, workers: int = 1
                         ) -> list[float]:
    """Twin throughput (tok/s; -inf on a memory error) of ``n`` equal-rate adapters of ``rank``
    offered ``load_tps`` in total, at each Amax of ``amaxes``, one workload ``seed``, all in
    one fleet run (on ``pool`` when given): the saturated throughput the count-aware limits
    rank Amax by (an SLO plays no part in it)."""
    from twin.fleet import simulate_fleet
    gpus = [_equal_jobs(prof, rank, n, a, [load_tps], lengths, threshold)[0] for a in amaxes]
    res = simulate_fleet(gpus, duration_s=duration_s, lengths=lengths, workers=workers,
                         check_routing=False, seeds=[seed] * len(gpus), pool=pool)
    return [-np.inf if m.memory_error else m.throughput_tps for m in res.per_gpu]


def _overload_candidates(score, hi: int) -> tuple[int, float, list[int]]:
    """(argmax, max, candidates) of the saturated throughput ``score`` over every Amax 1..hi,
    all replayed (one parallel batch). The curve is not unimodal — run-to-run noise of a few
    tenths of a percent puts several local maxima on it (``experiments.amax_curves``), and the
    integer search missed the best Amax by up to 3.2 % there — so nothing is skipped. Candidates:
    the ``CANDIDATE_MAX`` highest Amax within ``CANDIDATE_RTOL`` of the best (the overload
    ranking need not be the ranking at the limit; each is bisected or checked per seed by
    ``_best_of_amaxes``). Beyond about 32 adapters the curve is a plateau of noise where dozens
    of Amax lie within 2 % of the best; checking them all at every seed made one limit cost
    minutes, for differences inside the limit's own spread margin."""
    xs = list(range(1, int(hi) + 1))
    v = np.asarray(score(xs), dtype=float)
    j = int(np.argmax(v))                           # ties: the smallest Amax
    top = float(v[j])
    near = [a for a, x in zip(xs, v) if np.isfinite(x) and x >= (1.0 - CANDIDATE_RTOL) * top]
    near = sorted(sorted(near, key=lambda a: (-v[a - 1], a))[:CANDIDATE_MAX])
    return xs[j], top, near


def _best_of_amaxes(prof: GpuProfile, rank: int, n: int, best: int, amaxes: Sequence[int],
                    seeds: tuple[int, ...], guess: float, lengths: LengthModel,
                    duration_s: float, threshold: float, pool, slo: Slo | None = None
                    ) -> tuple[list[float], int]:
    """Per seed, the largest unstarved load over ``amaxes``, sharing work across them: ``best``
    (the overload optimum) is bisected for every seed; another Amax is replayed once at that
    seed's limit x (1 + ``LIMIT_RTOL``) and bisected upwards only where it is unstarved there
    (it can only raise the seed's maximum then). The same maximum as bisecting every Amax, in
    about a third of the replays. Returns (per-seed limits, the Amax that gave most of them)."""
    lim = _bisect_limits(prof, rank, n, [(best, s) for s in seeds], guess, lengths, duration_s,
                         threshold, pool, slo)
    won = {s: best for s in seeds}
    others = [(a, s) for a in amaxes if a != best for s in seeds]
    if others:
        at = {s: lim[j] * (1 + LIMIT_RTOL) for j, s in enumerate(seeds)}
        ok = _unstarved(prof, rank, n, [(a, at[s], s) for a, s in others], lengths, duration_s,
                        threshold, pool, slo)
        up = [(a, s) for (a, s), good in zip(others, ok) if good]
        if up:
            more = _bisect_limits(prof, rank, n, up, max(at[s] for _, s in up), lengths,
                                  duration_s, threshold, pool, slo)
            for (a, s), v in zip(up, more):
                j = seeds.index(s)
                if v > lim[j]:
                    lim[j], won[s] = v, a
    counts = {a: sum(1 for s in seeds if won[s] == a) for a in amaxes}
    return list(lim), max(amaxes, key=lambda a: (counts[a], a == best, -a))


def _carry_limit(prof: GpuProfile, rank: int, n: int, amax: int, duration_s: float,
                 threshold: float, seeds: tuple[int, ...], per_seed: Sequence[float],
                 one: CarryLimit | None, by: dict | None = None) -> CarryLimit:
    """The ``CarryLimit`` of per-seed limits, with the spread margin of ``carry_limit``."""
    if one is None:                 # one adapter: the larger deviation of Amax 1 and 2
        spread = max(float(np.std(v, ddof=1)) if len(seeds) > 1 else 0.0 for v in by.values())
    else:                           # the per-seed best; at least the one-adapter relative spread
        spread = float(np.std(per_seed, ddof=1)) if len(seeds) > 1 else 0.0
        spread = max(spread, one.spread_tps / one.limit_tps * float(np.mean(per_seed)))
    limit = max(max(per_seed), float(np.mean(per_seed)) + SPREAD_SIGMAS * spread)
    return CarryLimit(prof.name, int(rank), int(n), int(amax), float(duration_s),
                      float(threshold), seeds, tuple(float(x) for x in per_seed), spread, limit)


def _measurement_pool(n_workers: int):
    """The worker pool a limit's twin batches run on: none for one worker, else the command's
    worker processes when it installed them (``twin.fleet.use_backend``), else a pool of
    ``n_workers`` opened for this measurement (a context manager in every case)."""
    from contextlib import nullcontext
    from twin.fleet import installed_pool, worker_pool
    if n_workers <= 1:
        return nullcontext(None)
    shared = installed_pool()
    return nullcontext(shared) if shared is not None else worker_pool(n_workers)


def carry_limit(profile: GpuProfile | str, rank: int, n_adapters: int = 1,
                lengths: LengthModel | None = None, duration_s: float = 3600.0,
                seeds: Sequence[int] = tuple(range(BOUND_SEEDS)), threshold: float = 0.9,
                workers: int | None = None, slo: Slo | None = None) -> CarryLimit:
    """Twin-measured ``CarryLimit`` of ``n_adapters`` equal-rate adapters of ``rank``
    (cached in memory and on disk, keyed by the profile's content, rank, count, lengths,
    window, seeds, threshold and ``twin_fingerprint``; the disk cache lives in
    ``$LORA_PLACEMENT_CACHE`` or ``~/.cache/lora-placement``).

    Configuration. One adapter: Amax 1 and 2 are both measured; they are the least-work servers
    of all (module docstring). ``n_adapters`` >= 2: the Amax of highest
    saturated throughput, every integer 1..min(n + 1, largest startable Amax) replayed with the
    first seed at an overload of ``OVERLOAD`` x the one-adapter limit (no search: the curve has several
    local maxima); the limit is then bisected at that Amax for the first ``COUNT_SEEDS`` seeds,
    and the ``CANDIDATE_MAX`` best Amax within ``CANDIDATE_RTOL`` of its throughput, n and
    n + 1 raise a seed's limit where they carry more (``_best_of_amaxes``: each seed keeps its
    best), and the
    spread taken is at least the one-adapter spread relative to its limit (measured on all
    seeds). With a latency ``slo`` the limit is the largest load also meeting it (the same
    least-work configurations, the same margin; keyed by the SLO too)."""
    prof = _profile(profile)
    lengths = lengths if lengths is not None else default_lengths()
    seeds = tuple(int(s) for s in seeds)
    if n_adapters < 1 or not seeds:
        raise ValueError(f"carry_limit: n_adapters must be >= 1 and seeds non-empty "
                         f"(got {n_adapters}, {seeds})")
    top = max_startable_amax(prof, rank)
    if top < 1:
        raise ValueError(f"profile '{prof.name}': no configuration with rank {rank} starts")
    key = _carry_key(prof, rank, n_adapters, lengths, duration_s, seeds, threshold, slo)
    if key in _cache:
        return _cache[key]
    hit = _disk_get(key)
    if hit is not None:
        hit = {**hit, "seeds": tuple(hit["seeds"]), "per_seed_tps": tuple(hit["per_seed_tps"])}
        _cache[key] = CarryLimit(**hit)
        return _cache[key]
    one = None
    if n_adapters > 1:
        one = carry_limit(prof, rank, 1, lengths, duration_s, seeds, threshold, workers, slo)
        seeds = seeds[:COUNT_SEEDS]
    with _measurement_pool(workers or os.cpu_count() or 1) as pool:
        out = _measure_limit(prof, rank, n_adapters, lengths, duration_s, seeds, threshold, top,
                             one, pool, slo)
    _cache[key] = out
    _disk_put(key, out.to_dict())
    return out


PREDICT_SEEDS = 2          # predicted_limit: the first two of the seeds given ...
PREDICT_RTOL = 0.01        # ... bisected to 1 %


def predicted_limit(profile: GpuProfile | str, rank: int, n_adapters: int,
                    lengths: LengthModel, duration_s: float, seeds: Sequence[int],
                    threshold: float, workers: int | None, slo: Slo | None, guess: float
                    ) -> float:
    """A prediction, not a bound: the mean over the first ``PREDICT_SEEDS`` of ``seeds`` of the
    largest expected load ``n_adapters`` equal-rate adapters of ``rank`` carry accepted (not
    starved, meeting ``slo``) at Amax = ``n_adapters`` (every adapter resident, the
    configuration ``carry_limit``'s search picks for a few adapters), bisected to
    ``PREDICT_RTOL`` from ``guess`` (a load near the limit, e.g. a smaller count's). No Amax
    scan and no spread margin: several times cheaper than ``carry_limit``, for tables that
    predict (``optim.slo_capacity``) and never for a bound. Cached in memory and on disk
    beside the carry limits."""
    prof = _profile(profile)
    seeds = tuple(int(s) for s in seeds)[:PREDICT_SEEDS]
    amax = min(int(n_adapters), max_startable_amax(prof, rank))
    if n_adapters < 1 or not seeds or amax < 1 or not guess > 0:
        raise ValueError(f"predicted_limit: needs n_adapters >= 1, seeds, a startable rank and "
                         f"a positive guess (got {n_adapters}, {seeds}, rank {rank}, {guess})")
    base = _limit_key(prof, rank, n_adapters, lengths, duration_s, seeds, threshold, slo)
    key = hashlib.sha256(json.dumps({"kind": "predicted", "amax": amax, "rtol": PREDICT_RTOL,
                                     "limit": base}).encode()).hexdigest()
    if key in _cache:
        return _cache[key]
    hit = _disk_get(key)
    if hit is not None:
        _cache[key] = float(hit["limit_tps"])
        return _cache[key]
    with _measurement_pool(min(workers or os.cpu_count() or 1, len(seeds))) as pool:
        lims = _bisect_limits(prof, rank, n_adapters, [(amax, s) for s in seeds], float(guess),
                              lengths, duration_s, threshold, pool, slo, rtol=PREDICT_RTOL)
    _cache[key] = float(np.mean(lims))
    _disk_put(key, {"limit_tps": _cache[key], "per_seed_tps": [float(v) for v in lims],
                    "rank": int(rank), "n_adapters": int(n_adapters), "amax": amax})
    return _cache[key]


def limit_is_cached(profile: GpuProfile | str, rank: int, n_adapters: int,
                    lengths: LengthModel, duration_s: float, seeds: Sequence[int],
                    threshold: float, slo: Slo | None = None) -> bool:
    """True when ``carry_limit`` with these arguments needs no measurement (in memory, in the
    user's cache or in the shipped file)."""
    key = _carry_key(_profile(profile), rank, n_adapters, lengths, duration_s,
                     tuple(int(s) for s in seeds), threshold, slo)
    return key in _cache or _disk_get(key) is not None


def max_startable_amax(profile: GpuProfile | str, rank: int) -> int:
    """Largest Amax with a KV-capacity entry at ``rank`` (0 when no configuration starts)."""
    return _profile(profile).max_startable_amax(rank)


def smallest_startable_rank(profile: GpuProfile | str, rank: int) -> int | None:
    """The smallest rank >= ``rank`` the profile supports and starts at Amax 1 or more (None:
    none does): the least-work ``max_lora_rank`` of a GPU holding adapters of rank ``rank``."""
    prof = _profile(profile)
    ok = sorted(x for x in prof.supported_ranks if x >= rank and max_startable_amax(prof, x) >= 1)
    return ok[0] if ok else None


def adapter_kv_cost(profile: GpuProfile | str, rank: int) -> float:
    """KV tokens one adapter slot of ``rank`` displaces: max over measured Amax of
    (backbone KV - KV(Amax, rank)) / Amax (the conservative per-slot size dLoRA budgets)."""
    prof = _profile(profile)
    costs = [(prof.backbone_kv_tokens - v) / a for (a, r), v in prof.kv_capacity.items() if r == rank]
    if not costs:
        raise ValueError(f"profile '{prof.name}': rank {rank} has no KV-capacity entries")
    return max(costs)


def clear_cache() -> None:
    """Forget cached saturation runs (tests)."""
    _cache.clear()


__all__ = ["backbone_max_throughput", "lora_max_throughput",
           "max_startable_amax", "CarryLimit", "carry_limit", "limit_is_cached", "twin_fingerprint",
           "adapter_kv_cost", "clear_cache"]
