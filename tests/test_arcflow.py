"""Arc-flow model, LP dive and first-fit starts against brute force on tiny problems."""

from __future__ import annotations

import random

import pytest

from optim.exact import arcflow
from optim.exact.brute import brute_force
from optim.exact.first_fit import best_start, decreasing_fit
from optim.exact.problem import Config, PackingProblem, TypeSpec
from tests.exact_helpers import random_problem


def load_only_problem(seed: int, objective: str = "gpus") -> PackingProblem:
    """<= 8 adapters of ranks 8/16/32 and 2 GPU types whose configurations limit the load and
    the rank only (variable-sized bin packing with prices)."""
    rng = random.Random(seed)
    n = rng.randint(3, 8)
    ranks = [rng.choice((8, 16, 32)) for _ in range(n)]
    loads = [rng.randint(5, 60) for _ in range(n)]
    types = []
    for k, count in enumerate((2, 2)):
        cfgs = [Config(r, 8, 0, 10**9, rng.randint(60, 120) - (15 if r == 32 else 0), 0, None,
                       f"t{k}r{r}") for r in (16, 32) if rng.random() < 0.8]
        cfgs = cfgs or [Config(32, 8, 0, 10**9, 90, 0, None, f"t{k}r32")]
        types.append(TypeSpec(f"t{k}", "none", count, (1.0, 1.7)[k], tuple(cfgs)))
    return PackingProblem(f"lo{seed}", tuple(f"a{i}" for i in range(n)), tuple(ranks),
                          tuple(loads), (1,) * n, tuple(types), objective)


@pytest.mark.parametrize("objective", ["gpus", "cost"])
@pytest.mark.parametrize("seed", range(10))
def test_arcflow_agrees_with_brute_force(seed, objective):
    P = load_only_problem(seed, objective)
    assert arcflow.applicable(P) is None
    G = arcflow.build_graph(P)
    bf = brute_force(P)
    for fn in (arcflow.solve_arcflow_cpsat, arcflow.solve_arcflow_milp):
        r = fn(P, G, 20.0)
        if bf is None:
            assert r.status == "infeasible", fn.__name__
            continue
        assert r.status == "optimal", fn.__name__
        assert r.objective == pytest.approx(bf[0]), fn.__name__
        assert P.check_solution(list(r.gpus)) == []


@pytest.mark.parametrize("seed", range(10))
def test_lp_dive_is_feasible_and_lp_value_a_lower_bound(seed):
    import time
    P = load_only_problem(seed)
    G = arcflow.build_graph(P)
    bf = brute_force(P)
    d = arcflow.lp_dive(P, G, time.perf_counter() + 10)
    if bf is None:
        return
    assert d.lp_value is not None and d.lp_value <= bf[0] + 1e-6
    if d.gpus is not None:
        assert P.check_solution(list(d.gpus)) == []
        assert len(d.gpus) >= bf[0]


@pytest.mark.parametrize("seed", range(12))
def test_first_fit_starts_satisfy_the_model(seed):
    """First/best fit read the problem's own configurations (count intervals, ranks, load)."""
    P = random_problem(seed)
    for sol in (decreasing_fit(P), decreasing_fit(P, best_fit=True)):
        if sol is None:
            continue
        gpus = []
        for t, items in sol:
            ps = P.configs_admitting(t, items)
            assert ps, (t, items)
            gpus.append((t, ps[0], tuple(items)))
        assert P.check_solution(gpus) == []
    s = best_start(P)
    bf = brute_force(P)
    if s is not None and bf is not None:
        assert len(s[1]) >= bf[0]


def test_arcflow_not_applicable_when_counts_bind():
    P = random_problem(3)
    assert arcflow.applicable(P) is not None
