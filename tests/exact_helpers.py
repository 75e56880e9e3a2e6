"""Shared builders for the exact-solver tests (tiny synthetic problems)."""

from __future__ import annotations

import random

from optim.exact.problem import Config, PackingProblem, TypeSpec


def bin_packing(weights, capacity, bins, name="bp", price=1.0, objective="gpus"):
    """Classical bin packing as a PackingProblem: one type, one configuration."""
    t = TypeSpec("bin", "none", bins, price, (Config(8, 8, 0, 10**9, capacity, 0, None, "c"),))
    n = len(weights)
    return PackingProblem(name, tuple(f"i{k}" for k in range(n)), (8,) * n, tuple(weights),
                          (1,) * n, (t,), objective)


def random_problem(seed: int, objective: str = "gpus") -> PackingProblem:
    """<= 8 adapters, <= 3 GPU slots over 1-2 types, pieces with rank classes, Amax, count
    intervals and load caps (some adapters identical, to exercise symmetry breaking)."""
    rng = random.Random(seed)
    n = rng.randint(3, 8)
    ranks = [rng.choice((8, 16, 32)) for _ in range(n)]
    loads = [rng.randint(1, 60) for _ in range(n)]
    if n > 3:
        ranks[1], loads[1] = ranks[0], loads[0]
    types = []
    n_types = rng.choice((1, 1, 2))
    counts = [3] if n_types == 1 else [2, 1]
    for k in range(n_types):
        cfgs = []
        for r in (8, 16, 32):
            for A in (8, 16):
                for lo, hi in ((1, 2), (2, 4), (4, 9)):
                    if rng.random() < 0.3:
                        continue
                    cap = rng.randint(40, 130) - (10 if r == 32 else 0) - (5 * (lo > 1))
                    itl = round(rng.uniform(10, 60), 2)
                    cfgs.append(Config(r, A, lo, hi - 1, cap, 0, itl, f"r{r}A{A}[{lo},{hi})"))
        types.append(TypeSpec(f"t{k}", "none", counts[k], float(rng.choice((1.0, 1.6, 2.5))),
                              tuple(cfgs)))
    budget = 3 if objective == "latency" else None
    return PackingProblem(f"rand{seed}", tuple(f"a{i}" for i in range(n)), tuple(ranks),
                          tuple(loads), (1,) * n, tuple(types), objective, budget)


BPP_DIR = __import__("pathlib").Path(__file__).parent / "data" / "bpp"
# proven optima (BPPLIB); u120_08 and u120_19 are one below OR-Library's old best-known values
BPP_OPTIMA = {"Falkenauer_u120_00": 48, "Falkenauer_u120_08": 50, "Falkenauer_u120_19": 49,
              "Falkenauer_t120_00": 40, "Falkenauer_t120_01": 40}


def bpplib_instance(name: str) -> dict:
    """A committed BPPLIB file as an instance document (``optim.exact.classical``)."""
    from optim.exact.classical import classical_instance, read_bin_packing
    return classical_instance(read_bin_packing(BPP_DIR / f"{name}.txt")[0])


def assert_study_cache_rule(excluded, study_budget: int, budgets: list) -> None:
    """The cache rule of an exclusion step run with a budget of GPU checks (``excluded(
    max_checks=...)``, its search faked to succeed with the study's budget only and to record
    each budget it runs with in ``budgets``): a solve (budget 0) reads the cache only, a smaller
    budget's failure does not stand for the study's, the study's success holds for every later
    call."""
    assert excluded(max_checks=0) is False              # nothing cached
    assert excluded(max_checks=8) is False
    assert excluded() is True                            # the study's budget
    assert excluded(max_checks=8) is True
    assert excluded(max_checks=0) is True
    assert budgets == [8, study_budget]
