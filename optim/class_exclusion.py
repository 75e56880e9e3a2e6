"""Excluding k GPUs by the load classes every GPU draws from: a twin-sound lower-bound step.

**Setting.** The adapters fall into few *load classes* (every adapter of a class
offers the same load; the paper instances have 5-10 rate classes of 12-77 adapters each).
Sort the classes heaviest first: class ``j`` offers ``w_j`` tok/s per adapter and has ``s_j``
adapters. Up to which adapters of a class it holds, a GPU is its vector ``c`` of class counts,
and a placement on k GPUs is k vectors with ``sum_i c_i = s``.

**Dominance.** ``c'`` *dominates* ``c`` when every prefix sum of ``c'`` (its adapters in the
heaviest ``t + 1`` classes, every t) is at least that of ``c``: ``c'`` is ``c`` with adapters
added or moved to heavier classes (a special case of ``spreads`` below, which the search uses). Under the premises the other bound steps rest on
(``feasibility.canonical_gpu``: adding an adapter or raising an adapter's load never turns a
failing GPU into an accepted one), a GPU that dominates a failing one fails too. A GPU *fails*
when ``feasibility.gpu_excluded`` shows it (every Amax, with its spread margin over the
workload draws, so which adapters of a class it holds and in what order do not matter).
The same premises (with ``feasibility``'s: concentrating load never makes a GPU starve) give a
wider rule the checks use before replaying a GPU (``spreads``): a GPU reachable from a failing
one by adding adapters, raising loads or moving load from a heavier adapter to a lighter one
fails too.

**Search** (``class_excluded``). A CP-SAT model (``_Master``) asks for k vectors that sum to the
supply, each within the count-aware cap of its adapter count (``cap(n)``: the load no accepted
GPU of ``n`` adapters carries more of) and spreading no failing vector found so far:

    sum_i c_ij = s_j  (every class j),      L_i = sum_j w_j c_ij <= cap(n_i),  n_i = sum_j c_ij,
    for every failing f and GPU i:  n_i < n(f)  or  T_t(c_i) < T_t(f) for some class load t,
    L_1 >= L_2 >= ... >= L_k                                            (GPUs are alike),

with ``T_t(x) = sum_j min(w_j, t) x_j`` the load of ``x`` with every adapter capped at ``t``
(``c`` spreads ``f`` exactly when ``n(c) >= n(f)`` and ``T_t(c) >= T_t(f)`` at every class
load ``t``: the threshold form of weak supermajorization, ``_Master.cut``; every term is
linear in the class counts, so a cut is one clause of at most ``J`` linear inequalities
per GPU), minimising the largest load (the balanced split first: when all of its GPUs
pass, nothing can be excluded and the search stops early). No solution: k GPUs are excluded.
Else each proposed GPU, heaviest first, is checked; the first that fails is shrunk (its
lightest adapters dropped while it still fails, by bisection: a smaller failing vector cuts
more) and becomes a cut, and the model is solved again; a proposed GPU that spreads a known
failure fails without a replay, and one that a GPU shown passing spreads (at its server rank
or a higher one) passes without one (the same premises: a GPU easier than one not shown
failing is not shown failing either, which can only leave a split unexcluded, never exclude
one). When every proposed GPU passes (or the ``max_checks`` GPU checks or ``MAX_ROUNDS``
solves are spent) nothing is shown; every check is cached on disk
(``feasibility.gpu_excluded``) and the search's progress is saved every round
(``class_excluded``'s ``save`` / ``resume``: the cuts in their order, the vectors shown
failing or passing), so a larger budget or a rerun after a stop goes on where the search
stopped, with the same proposals, instead of solving the model again round by round. A cut's
clause is a few linear inequalities over the class counts: on a 15-class SLO point after 38
cuts the model has 498 variables and a round's solve takes 0.1 s.

The first solve, before any check, uses the caps and the supply alone: it excludes k GPUs
where the count-partition bound (``count_bound``) lets every GPU take the heaviest adapters at
once. That part needs no order of failures (loads grouped regardless of rank; the caps,
measured at the smallest rank, bound every rank).

**Several ranks.** Classes are of load and rank tier (equal load, equal rank), and a GPU runs
at the server rank of the largest rank it holds (``h_it``: GPU i holds tier t or above). It is
checked at that server rank with its adapters at the instance's smallest rank (the least work
there: the adapter's own rank only changes its load time; ``tests/test_bounds_twin.py``
measures that premise near the edge of acceptance, where both score alike), and a failure at
server rank R cuts the GPUs that spread it *and* hold rank R or above (a higher server rank
adds LoRA work per step and takes KV cache): the cut gains the literal ``not h_{i,t(R)}``.
Without the tiers (every GPU at the smallest rank) the search is that of the one-rank instance
of the same loads, which is weaker: it lets a GPU of rank-32 adapters pass as if rank 8.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

CLASS_VERSION = 10          # bump when the search changes (results are cached on disk)
CLASS_SOUND_VERSIONS = tuple(range(1, 11))  # versions whose cached exclusions still hold
                            # (proofs); their saved progress is facts a later version resumes
CLASS_CHECKS = 384          # GPU checks one exclusion may spend (the studies' budget;
                            # every check is cached, so a larger one resumes)
MAX_CLASSES = 32            # (load, rank tier) classes beyond this: not applicable
MASTER_TIME_S = 10.0        # CP-SAT deterministic time per master solve (about seconds; a
                            # solve that finds no split in it shows nothing)
LOAD_UNITS = 1000           # loads in the model: integer milli-tok/s
STATE_VERSION = 1           # class_excluded's saved progress (resume / save)
SHRINK_STEPS = 4            # bisection steps when shrinking a failing vector
FEASIBILITY_TIME_S = 60.0   # ... and for any split once the balanced search found none, per
FEASIBILITY_SEEDS = 5       # ... CP-SAT seed, seeds 1..5 in turn: the search is heavy-tailed
                            # (paper-qwen-rlow-qmixed-n256 after 7 cuts: seeds 1, 4, 5, 6 find
                            # a split in 7-37 s, seeds 0, 2, 3 none in 30-120 deterministic s)
MAX_ROUNDS = 2000           # master solves (a round whose GPUs a known failure covers costs no
                            # twin check, only a CP-SAT solve of a few ms)


@dataclass(frozen=True)
class LoadClasses:
    """Classes of equal load (and rank tier), heaviest first: ``loads[j]`` tok/s per adapter,
    ``supply[j]`` adapters, ``tiers[j]`` the index of their rank among the instance's ranks
    (0: the smallest; empty: one rank)."""

    loads: tuple[float, ...]
    supply: tuple[int, ...]
    tiers: tuple[int, ...] = ()

    def tier(self, j: int) -> int:
        return self.tiers[j] if self.tiers else 0

    @property
    def n_tiers(self) -> int:
        return max(self.tiers) + 1 if self.tiers else 1

    def vector_tier(self, c: Sequence[int]) -> int:
        """The highest rank tier a GPU of class counts ``c`` holds (its server rank's)."""
        return max((self.tier(j) for j, k in enumerate(c) if k), default=0)

    @property
    def n(self) -> int:
        return int(sum(self.supply))

    def vector_loads(self, c: Sequence[int]) -> list[float]:
        """The loads (tok/s) of a GPU of class counts ``c``, heaviest first."""
        return [w for w, k in zip(self.loads, c) for _ in range(int(k))]


def load_classes(loads: Sequence[float], ranks: Sequence[int] | None = None,
                 rtol: float = 1e-9) -> LoadClasses:
    """Group ``loads`` (tok/s) into classes of equal load (relative tolerance ``rtol``) and, with
    ``ranks`` (one per load) of several values, equal rank tier; heaviest first, the higher
    tier first among equal loads."""
    return _grouped(loads, ranks, rtol)[0]


def class_index(loads: Sequence[float], ranks: Sequence[int] | None = None,
                rtol: float = 1e-9) -> list[int]:
    """The class of each load (an index into ``load_classes(loads, ranks, rtol)``'s classes)."""
    return _grouped(loads, ranks, rtol)[1]


def _grouped(loads: Sequence[float], ranks: Sequence[int] | None, rtol: float
             ) -> tuple[LoadClasses, list[int]]:
    levels = sorted(set(int(r) for r in ranks)) if ranks is not None else [0]
    tier_of = {r: t for t, r in enumerate(levels)}
    ts = [tier_of[int(r)] for r in ranks] if ranks is not None else [0] * len(loads)
    vals: list[float] = []
    counts: list[int] = []
    tiers: list[int] = []
    index = [0] * len(loads)
    for x, t, i in sorted(((float(v), t, i) for i, (v, t) in enumerate(zip(loads, ts))),
                          key=lambda e: (e[0], e[1]), reverse=True):
        if vals and tiers[-1] == t and abs(vals[-1] - x) <= rtol * max(abs(x), 1.0):
            counts[-1] += 1
        else:
            vals.append(x)
            counts.append(1)
            tiers.append(t)
        index[i] = len(vals) - 1
    cls = LoadClasses(tuple(vals), tuple(counts), tuple(tiers) if len(levels) > 1 else ())
    return cls, index


def spreads(c: Sequence[float], f: Sequence[float], rtol: float = 1e-9) -> bool:
    """The load vector ``c`` is reachable from ``f`` by adding adapters, raising loads and
    moving load from a heavier adapter to a lighter one (spreading it) — none of which turns a
    failing GPU into an accepted one under the premises — so ``c`` fails where ``f`` does.
    That is: ``len(c) >= len(f)`` and, with ``f`` padded by idle adapters, every sum of the
    ``m`` lightest entries of ``c`` is at least that of ``f`` (weak supermajorization)."""
    if len(c) < len(f):
        return False
    a = np.cumsum(np.sort(np.asarray(c, float)))
    b = np.cumsum(np.sort(np.concatenate([np.zeros(len(c) - len(f)), np.asarray(f, float)])))
    return bool(np.all(a >= b - rtol * max(float(b[-1]) if len(b) else 0.0, 1.0)))


def shrink(c: Sequence[int], fails: Callable[[list[int]], bool], steps: int = SHRINK_STEPS
           ) -> list[int]:
    """A vector dominated by the failing ``c`` that still fails: ``c`` without its ``n - m``
    lightest adapters for the smallest ``m`` a bisection of ``steps`` checks finds failing
    (failures are monotone in ``m``: more adapters dominate fewer)."""
    c = [int(x) for x in c]
    n = sum(c)

    def first(m: int) -> list[int]:
        out, left = [], m
        for k in c:
            out.append(min(k, left))
            left -= out[-1]
        return out

    lo, hi = 0, n               # first(lo) not known to fail (empty), first(hi) fails
    for _ in range(steps):
        if hi - lo <= 1:
            break
        mid = (lo + hi) // 2
        if fails(first(mid)):
            hi = mid
        else:
            lo = mid
    return first(hi)


class _Master:
    """The CP-SAT model of the module docstring for k GPUs."""

    def __init__(self, cls: LoadClasses, k: int, cap_of: Callable[[int], float],
                 seed: int = 0) -> None:
        from ortools.sat.python import cp_model
        self.cp = cp_model
        self.m = m = cp_model.CpModel()
        self.k, self.cls, self.seed = k, cls, seed
        self.wall_s = 0.0           # spent in solve() (wall; diagnostics for the trace only)
        self.fallback_seeds = 0     # feasibility searches run after a balanced search found none
        J = len(cls.loads)
        self.w = w = [int(round(x * LOAD_UNITS)) for x in cls.loads]     # model units
        top = sum(wj * sj for wj, sj in zip(w, cls.supply))
        self.c = [[m.NewIntVar(0, cls.supply[j], f"c{i}_{j}") for j in range(J)]
                  for i in range(k)]
        self.load = [m.NewIntVar(0, top, f"L{i}") for i in range(k)]
        self.count = [m.NewIntVar(0, cls.n, f"n{i}") for i in range(k)]
        for i in range(k):
            m.Add(self.load[i] == sum(w[j] * self.c[i][j] for j in range(J)))
            m.Add(self.count[i] == sum(self.c[i]))
        for j in range(J):
            m.Add(sum(self.c[i][j] for i in range(k)) == cls.supply[j])
        for i in range(k - 1):
            m.Add(self.load[i] >= self.load[i + 1])
        # h[i][t]: GPU i may hold adapters of rank tier t or above (it must where it does)
        self.h = [[None] + [m.NewBoolVar(f"h{i}_{t}") for t in range(1, cls.n_tiers)]
                  for i in range(k)]
        for i in range(k):
            for j in range(J):
                for t in range(1, cls.tier(j) + 1):
                    m.Add(self.c[i][j] <= cls.supply[j] * self.h[i][t])
        self._caps(cap_of)
        m.Minimize(self.load[0])

    def _caps(self, cap_of: Callable[[int], float]) -> None:
        """``n_i >= n  =>  L_i <= e(n)`` where ``e(n) = max_{n' >= n} cap(n')`` (the
        non-increasing envelope of the caps, so the implication holds for every larger count
        too) drops."""
        N = self.cls.n
        caps = np.array([float(cap_of(n)) for n in range(1, N + 1)])
        env = np.maximum.accumulate(caps[::-1])[::-1]
        last = np.inf
        for n in range(1, N + 1):
            e = env[n - 1]
            if not e < last:
                continue
            last = e
            ub = int(np.floor(e * LOAD_UNITS))
            for i in range(self.k):
                b = self.m.NewBoolVar(f"ge{i}_{n}")
                self.m.Add(self.count[i] >= n).OnlyEnforceIf(b)
                self.m.Add(self.count[i] <= n - 1).OnlyEnforceIf(b.Not())
                self.m.Add(self.load[i] <= ub).OnlyEnforceIf(b)

    def cut(self, f: Sequence[int], tier: int = 0) -> None:
        """No GPU holding rank tier ``tier`` or above (its server rank at least the one ``f``
        failed at) ``spreads`` the failing vector ``f``. With ``T_t(x) = sum_a min(x_a, t)``
        (the load of ``x`` with every adapter capped at ``t``), ``c`` spreads ``f`` iff
        ``T_t(c) >= T_t(f)`` for every ``t > 0`` (weak supermajorization by its threshold form:
        ``sum_a (t - x_a)^+`` over ``c`` at most over ``f`` padded with idle adapters); both
        sides are piecewise linear in ``t`` with breaks at the class loads, so the thresholds
        ``t -> 0`` (the counts: ``n(c) >= n(f)``; ``t`` at the smallest class load says the
        same) and ``t = w_j`` (each larger distinct class load; the largest gives the loads)
        suffice, and each is linear in the class counts::

            n(c_i) <= n(f) - 1  or  sum_j min(w_j, t) c_ij <= sum_j min(w_j, t) f_j - 1
                                    for some t in {w_j}     (or GPU i holds no tier >= tier)
        """
        m, w = self.m, self.w
        J = len(w)
        nf = int(sum(f))
        rows = []
        for t in sorted(set(w), reverse=True)[:-1]:    # at the smallest: the counts
            coef = [min(wj, t) for wj in w]
            rows.append((coef, int(sum(cj * int(fj) for cj, fj in zip(coef, f)))))
        for i in range(self.k):
            lits = [m.NewBoolVar("")]
            m.Add(self.count[i] <= nf - 1).OnlyEnforceIf(lits[0])
            if tier > 0:
                lits.append(self.h[i][tier].Not())
            for coef, rhs in rows:
                z = m.NewBoolVar("")
                m.Add(sum(coef[j] * self.c[i][j] for j in range(J)) <= rhs - 1
                      ).OnlyEnforceIf(z)
                lits.append(z)
            m.AddBoolOr(lits)

    def solve(self, time_s: float = MASTER_TIME_S, seeds: int = FEASIBILITY_SEEDS
              ) -> list[list[int]] | None | bool:
        """The proposed vectors (heaviest GPU first); None: no k GPUs can hold the supply
        (proven); False: no split found within the limits. When the balanced search (least
        largest load) finds none in ``time_s``, any split is sought, without the objective, in
        ``FEASIBILITY_TIME_S`` per seed with seeds 1..``seeds`` in turn until one
        finds a split or proves there is none (an objective makes CP-SAT's search harder once
        many cuts stand, and its time to a split varies by an order of magnitude with the
        seed; deterministic limits and a fixed seed order keep the proposals reproducible)."""
        t0 = time.monotonic()
        st, s = self._run(time_s)
        tried = 0
        if st == self.cp.UNKNOWN:
            self.m.ClearObjective()
            for seed in range(1, seeds + 1):
                tried = seed
                st, s = self._run(FEASIBILITY_TIME_S, seed)
                if st != self.cp.UNKNOWN:
                    break
            self.m.Minimize(self.load[0])
        self.wall_s += time.monotonic() - t0
        self.fallback_seeds += tried
        if st == self.cp.INFEASIBLE:
            return None
        if st not in (self.cp.OPTIMAL, self.cp.FEASIBLE):
            return False
        return [[int(s.Value(x)) for x in row] for row in self.c]

    def hint(self, gpus: Sequence[Sequence[int]] | None) -> None:
        """Start the next solve from ``gpus`` (the last round's split, which only its new cut
        rules out): CP-SAT repairs it instead of searching afresh, so fewer rounds fall back
        to the feasibility seeds (the tight 4-GPU point of the ``_run`` note, its first 40 saved
        cuts replayed round by round beside two jobs: no fallback instead of one, 402 s of
        solves instead of 578 s)."""
        self.m.ClearHints()
        for row, vals in zip(self.c, gpus or ()):
            for x, v in zip(row, vals):
                self.m.AddHint(x, int(v))

    def _run(self, time_s: float, seed: int | None = None):
        s = self.cp.CpSolver()
        # a deterministic limit: the proposals (and so the checks, cached on disk) are the
        # same on every run and machine; the search stops with the best split found so far
        s.parameters.max_deterministic_time = float(time_s)
        s.parameters.num_workers = 1
        # the LP with CP-SAT's cuts: the splits are tight multi-knapsacks under the count caps
        # (paper-llama-rmixed-qlow-n384, tight SLO, 4 GPUs, 15 classes, 3 cuts: no split in 10
        # + 5 x 60 deterministic s at the default level 1, the balanced one proven in 2.2 s)
        s.parameters.linearization_level = 2
        s.parameters.random_seed = int(self.seed if seed is None else seed)
        return s.Solve(self.m), s


def class_excluded(loads: Sequence[float], k: int, cap_of: Callable[[int], float],
                   fails: Callable[..., bool] | None, max_checks: int = CLASS_CHECKS,
                   progress: Callable[[str], None] | None = None,
                   trace: dict | None = None, ranks: Sequence[int] | None = None,
                   resume: dict | None = None,
                   save: Callable[[dict], None] | None = None) -> bool:
    """True when no k GPUs can hold adapters of these ``loads`` (tok/s) with every GPU passing
    (module docstring). ``cap_of(n)``: the most load an accepted GPU of exactly ``n`` adapters
    carries (``inf`` where unknown); ``fails(loads)``: the twin check of one GPU
    (``feasibility.gpu_excluded`` on adapters of those loads), or None: the caps and the supply
    alone, one model solve and no twin check (``max_checks`` is then ignored; it needs no
    dominance order, so it holds with several ranks too). ``ranks`` (one per load, several
    values): classes by load and rank tier, and ``fails(loads, rank)`` checks a GPU at server
    rank ``rank`` (the largest it holds; its adapters at the smallest); a failure at a rank cuts
    the GPUs that spread it and hold that rank or a larger one. At most ``max_checks`` calls of
    ``fails``; ``progress`` is called after each. ``trace`` (a dict) receives how the search
    ended: ``why``, the ``checks`` and ``rounds`` spent, the ``cuts`` and, when a proposed split
    passed, its vectors (``passing``, class counts heaviest class first), and the wall seconds
    the CP-SAT model took (``master_wall_s``) with the feasibility searches it fell back to
    (``master_fallback_seeds``): where the checks are cached, the model is what takes the time.

    ``save(state)`` is called after every round with the search's progress (rounds and checks
    spent, the cuts in their order, every vector shown failing or passing); ``resume``, such a
    state of the same search (same loads, k, caps and checks), rebuilds the model with those
    cuts in that order and goes on from there, the same proposals as a search never stopped
    (the model is the same), without solving its earlier rounds again."""
    cls = load_classes(loads, ranks)
    levels = sorted(set(int(r) for r in ranks)) if ranks is not None else [None]
    trace = {} if trace is None else trace
    if k < 1 or len(cls.loads) > MAX_CLASSES:
        trace["why"] = "not applicable"
        return False
    master = _Master(cls, k, cap_of)
    cuts: list[tuple[list[int], int]] = []      # the cuts in their order, at their tier

    def end(why: str, out: bool, rounds: int, passing=None) -> bool:
        trace.update(why=why, checks=used, rounds=rounds,
                     cuts=[v if not cls.tiers else {"vector": v, "rank": levels[t]}
                           for v, t in cuts],
                     classes=[round(w, 6) for w in cls.loads], supply=list(cls.supply),
                     master_wall_s=round(master.wall_s, 1),
                     master_fallback_seeds=master.fallback_seeds)
        if cls.tiers:
            trace.update(tiers=list(cls.tiers), ranks=levels)
        if passing is not None:
            trace["passing"] = passing
        return out
    passed: set[tuple[tuple[int, ...], int]] = set()
    failed: list[tuple[list[int], int]] = []  # every vector shown failing, at its tier
    used = 0
    done_rounds = 0
    last: list[list[int]] | None = None     # the last round's proposal: the next one's hint
    if resume and fails is not None:
        if resume.get("v") != STATE_VERSION or resume.get("classes") != list(cls.loads):
            raise ValueError("class_excluded: resume is the state of another search")
        for vec, tier in resume["cuts"]:
            master.cut(vec, tier)
            cuts.append((list(vec), int(tier)))
        failed = [(list(v), int(t)) for v, t in resume["failed"]]
        passed = {(tuple(v), int(t)) for v, t in resume["passed"]}
        used, done_rounds = int(resume["checks"]), int(resume["rounds"])
        last = resume.get("last")      # (absent from states saved before the hint)

    def saved() -> None:
        if save is not None:
            save({"v": STATE_VERSION, "classes": list(cls.loads), "rounds": done_rounds,
                  "checks": used, "cuts": [[v, t] for v, t in cuts],
                  "failed": [[v, t] for v, t in failed],
                  "passed": [[list(v), t] for v, t in sorted(passed)], "last": last})

    def check(c: list[int], tier: int) -> bool:
        """``c`` fails at server rank tier ``tier``."""
        nonlocal used
        key = (tuple(c), tier)
        if key in passed:
            return False
        v = cls.vector_loads(c)
        if any(t <= tier and spreads(v, cls.vector_loads(f)) for f, t in failed):
            failed.append((list(c), tier))                      # dominance included
            return True
        if any(t >= tier and spreads(cls.vector_loads(p), v) for p, t in passed):
            passed.add(key)     # a harder GPU (it spreads c, at c's rank or above) passed
            return False
        used += 1
        out = bool(fails(v) if levels == [None] else fails(v, levels[tier]))
        if progress is not None:
            progress(f"{sum(c)} adapters: {'fails' if out else 'passes'}")
        if out:
            failed.append((list(c), tier))
        else:
            passed.add(key)
        return out

    if fails is None:       # no cuts (the search's heavy tail comes with them): one seed,
        gpus = master.solve(seeds=1)    # as bounded on a solve's path as before
        if gpus is None:
            return end("no k GPUs hold the supply", True, 1)
        return end("the caps and the supply allow a split", False, 1,
                   None if gpus is False else gpus)
    for rounds in range(done_rounds + 1, MAX_ROUNDS + 1):
        if used >= max_checks:
            return end("check budget spent", False, rounds - 1)
        master.hint(last)
        gpus = master.solve()
        if gpus is None:
            return end("no k GPUs hold the supply", True, rounds)
        if gpus is False:
            return end("the model found no split within its limit", False, rounds)
        cut = None
        for c in gpus:
            tier = cls.vector_tier(c)
            if sum(c) == 0 or (tuple(c), tier) in passed:
                continue
            if used >= max_checks:
                return end("check budget spent", False, rounds)
            if check(c, tier):
                # shrunk at the same server rank: its lightest adapters dropped
                cut = (shrink(c, lambda v: used < max_checks and check(v, tier)), tier)
                break
        if cut is None:     # every proposed GPU passes: this split may be accepted
            return end("a proposed split passes every check", False, rounds, gpus)
        master.cut(*cut)
        cuts.append((list(cut[0]), int(cut[1])))
        done_rounds, last = rounds, gpus
        saved()
    return end("round limit", False, MAX_ROUNDS)


__all__ = ["CLASS_VERSION", "CLASS_SOUND_VERSIONS", "CLASS_CHECKS", "LoadClasses", "load_classes",
           "class_index", "spreads", "shrink", "class_excluded"]
