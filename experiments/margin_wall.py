"""How far a placement one GPU smaller than greedy's is from the twin's acceptance.

Where greedy's count is one above the twin-sound lower bound, either a smaller placement exists
that greedy misses, or one is impossible but the bound cannot show it. The bound's GPU checks
(``optim.feasibility.gpu_excluded``) call a GPU failing only when its best score stays more than
``SPREAD_SIGMAS`` draw spreads below acceptance, because the verification's workload draw
depends on the GPU's position and on which adapters of a class it holds. A point whose smaller
placements miss acceptance by less than that spread is *margin-limited*: no sound exclusion of
that kind can certify it, and no packing of that count is accepted in expectation either.

This study measures it on one point: the balanced split of the adapters' load classes over
``k`` GPUs (``optim.class_exclusion``'s model with the supply alone: least largest load), each
class's adapters dealt to the GPUs in id order, every GPU scored at every seed position
``inst.seed + i`` (its best twin score over every integer Amax: throughput over threshold x
realised offered load, under an SLO the smaller of that and the SLO's score; >= 1 accepted).
The verdict takes the best assignment of GPUs to positions. ``--split`` measures another split
instead (e.g. one a class step recorded as passing its checks).

    python -m experiments.margin_wall --instance small-32-llama-n48-g5-bimodal --gpus 3
    python -m experiments.margin_wall --instance paper-llama-rhigh-qhigh-n64 --gpus 2 \\
        --level loose --duration 600

The line before it states the band the bound's checks leave whatever a GPU's own spread
(``SPREAD_SIGMAS`` x the one-adapter carry limit's relative spread over the bound seeds, under
the level's SLO). Last line: ``gpus=<k> accepted=<bool> best_order_min_score=<x>
weakest_gpu_mean=<m> sd=<s> spread_margin=<SPREAD_SIGMAS x s>``: ``accepted`` when some order
puts every GPU at >= 1; ``weakest_gpu_mean`` the lowest of the GPUs' mean scores over the positions (below 1: the split
is rejected in expectation), ``sd`` the pooled spread of a GPU's score from position to position
(the draw's), ``spread_margin`` the band below 1 inside which the bound's checks cannot call a
GPU failing.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
from dataclasses import replace
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd
from tqdm import tqdm

from optim.instance import Instance, InstanceError, load_instance
from twin.cli_support import CliError, check_output
from twin.workload import Adapter

from .common import REPO


def balanced_split(inst: Instance, k: int) -> list[list[int]]:
    """The least-largest-load split of ``inst``'s load classes over ``k`` GPUs (class counts,
    heaviest class first, as ``optim.class_exclusion.load_classes`` orders them)."""
    from optim.class_exclusion import class_excluded
    loads = [inst.load_tps(a) for a in inst.adapters]
    ranks = [a.rank for a in inst.adapters]
    trace: dict = {}
    class_excluded(loads, k, lambda n: math.inf, None, trace=trace, ranks=ranks)
    if "passing" not in trace:
        raise ValueError(f"{inst.name}: no split of its load classes over {k} GPUs "
                         f"({trace.get('why', 'unknown')})")
    return [list(map(int, v)) for v in trace["passing"]]


def class_members(inst: Instance) -> list[list[Adapter]]:
    """Each load class's adapters in id order (classes as ``load_classes`` groups them)."""
    from optim.class_exclusion import class_index
    index = class_index([inst.load_tps(a) for a in inst.adapters],
                        [a.rank for a in inst.adapters])
    out: list[list[Adapter]] = [[] for _ in range(max(index) + 1)]
    for a, j in sorted(zip(inst.adapters, index), key=lambda p: p[0].id):
        out[j].append(a)
    return out


def deal(members: Sequence[Sequence[Adapter]], split: Sequence[Sequence[int]]
         ) -> list[list[Adapter]]:
    """The GPUs of ``split`` (class counts per GPU): each class's adapters dealt to the GPUs
    that take some, one at a time in turn, in id order (so every GPU's ids interleave)."""
    k = len(split)
    for j, m in enumerate(members):
        want = sum(v[j] for v in split)
        if want != len(m):
            raise ValueError(f"class {j}: the split takes {want} adapters, it has {len(m)}")
    gpus: list[list[Adapter]] = [[] for _ in range(k)]
    for j, m in enumerate(members):
        left = [v[j] for v in split]
        pool = list(m)
        i = 0
        while pool:
            if left[i % k]:
                gpus[i % k].append(pool.pop(0))
                left[i % k] -= 1
            i += 1
    return [sorted(g, key=lambda a: a.id) for g in gpus]


def seat_scores(inst: Instance, gpus: Sequence[Sequence[Adapter]], duration_s: float,
                workers: int | None = None, progress: bool = True) -> np.ndarray:
    """``S[g, i]``: GPU ``g``'s best twin score over every integer Amax with the draw of
    position ``i`` (seed ``inst.seed + i``), at the server rank of its largest adapter."""
    from optim.amax_search import twin_best_score
    from optim.placement import plan_gpu
    t = inst.gpu_types[0]
    plans = [plan_gpu(t.name, t.profile, 1, [(a, 1.0) for a in g], inst.mean_tokens)
             for g in gpus]
    k = len(gpus)
    S = np.full((k, k), -np.inf)
    cells = [(g, i) for g in range(k) for i in range(k)]
    for g, i in tqdm(cells, desc=f"{inst.name}: GPU x position", disable=not progress):
        S[g, i] = twin_best_score(inst, plans[g], inst.seed + i, duration_s, workers)[2]
    return S


def best_order(S: np.ndarray) -> tuple[tuple[int, ...], float]:
    """The assignment of GPUs to positions maximising the smallest score (brute force over
    the k! orders; k is a handful here) and that score."""
    k = S.shape[0]
    best = max(itertools.permutations(range(k)),
               key=lambda p: min(S[g, i] for i, g in enumerate(p)))
    return best, float(min(S[g, i] for i, g in enumerate(best)))


def draw_spread(S: np.ndarray) -> tuple[float, float]:
    """(the weakest GPU's mean score over the positions, the pooled within-GPU standard
    deviation): how far the split is from acceptance in expectation, and how much the draw
    alone moves a GPU's score."""
    means = [float(np.mean(r[np.isfinite(r)])) if np.isfinite(r).any() else -np.inf for r in S]
    var = [float(np.var(r, ddof=1)) for r in S if np.isfinite(r).all() and len(r) > 1]
    return min(means), float(np.sqrt(np.mean(var))) if var else float("nan")


def check_floor(inst: Instance, duration_s: float, workers: int | None = None) -> str:
    """The band below 1 inside which no GPU check calls a GPU failing, whatever its own spread
    (``feasibility.check_floor``, under the instance's SLO; measured once, cached)."""
    from optim.feasibility import check_floor as floor_of
    b = inst.bound_view()
    one, need = floor_of(b, b.gpu_types[0], duration_s, workers)
    rel = one.spread_tps / float(np.mean(one.per_seed_tps))
    return (f"one-adapter carry limit over the {len(one.per_seed_tps)} bound seeds: "
            f"{min(one.per_seed_tps):,.0f}-{max(one.per_seed_tps):,.0f} tok/s, relative sd "
            f"{100 * rel:.2f} %: a GPU check calls a GPU failing only below {need:.4f}")


def _instance(name: str) -> Path | None:
    """The instance file ``name`` names: a JSON path, or instances/*/<name>.json."""
    p = Path(name)
    if p.suffix == ".json" and p.is_file():
        return p
    hits = sorted((REPO / "instances").glob(f"*/{name}.json"))
    return hits[0] if hits else None


def main(argv: Sequence[str] | None = None) -> int:
    from optim.capacity import SPREAD_SIGMAS

    from .slo_placement import LEVELS
    ap = argparse.ArgumentParser(prog="python -m experiments.margin_wall",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--instance", required=True,
                    help="an instance name under instances/ or a path to its JSON file")
    ap.add_argument("--gpus", type=int, required=True, help="the GPU count k to measure")
    ap.add_argument("--level", default=None, choices=sorted(LEVELS),
                    help="judge under this SLO level of experiments.slo_placement")
    ap.add_argument("--duration", type=float, default=None,
                    help="twin window in s (default: the instance's)")
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--split", default=None, metavar="JSON",
                    help="measure this split instead of the balanced one: a JSON list of k "
                         "class-count vectors, heaviest class first (e.g. the 'passing' split "
                         "a class step records)")
    ap.add_argument("--csv", default=None, help="write the GPU x position scores here")
    ap.add_argument("--force", action="store_true", help="overwrite an existing --csv file")
    a = ap.parse_args(argv)
    try:
        csv_out = check_output(a.csv, "--csv", a.force)
    except CliError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if a.gpus < 2:
        print(f"error: --gpus must be >= 2, got {a.gpus}", file=sys.stderr)
        return 2
    if a.duration is not None and not a.duration > 0:
        print(f"error: --duration must be > 0, got {a.duration}", file=sys.stderr)
        return 2
    path = _instance(a.instance)
    if path is None:
        print(f"error: --instance {a.instance!r}: no instances/*/{a.instance}.json and no such "
              "JSON file", file=sys.stderr)
        return 2
    try:
        inst = load_instance(path)
    except InstanceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if a.level is not None:
        inst = replace(inst, slo=LEVELS[a.level])
    if len(inst.gpu_types) != 1:
        print(f"error: {inst.name}: one GPU type only, it has {len(inst.gpu_types)}",
              file=sys.stderr)
        return 2
    if a.gpus > len(inst.adapters):
        print(f"error: --gpus {a.gpus} is more than the {len(inst.adapters)} adapters",
              file=sys.stderr)
        return 2
    dur = a.duration if a.duration is not None else inst.duration_s
    members = class_members(inst)
    if a.split is None:
        split = balanced_split(inst, a.gpus)
    else:
        try:
            split = json.loads(a.split)
            ok = (isinstance(split, list) and len(split) == a.gpus
                  and all(isinstance(v, list) and len(v) == len(members)
                          and all(isinstance(x, int) and x >= 0 for x in v) for v in split))
        except json.JSONDecodeError:
            ok = False
        if not ok:
            print(f"error: --split must be a JSON list of {a.gpus} lists of {len(members)} "
                  f"non-negative integers (class counts), got {a.split!r}", file=sys.stderr)
            return 2
    try:
        gpus = deal(members, split)
    except ValueError as e:
        print(f"error: --split: {e}", file=sys.stderr)
        return 2
    if any(not g for g in gpus):
        print("error: --split: every GPU needs at least one adapter", file=sys.stderr)
        return 2
    S = seat_scores(inst, gpus, dur, a.workers)
    order, low = best_order(S)
    rows = []
    for g, ads in enumerate(gpus):
        load = sum(inst.load_tps(x) for x in ads)
        rows.append({"gpu": g, "classes": split[g], "adapters": len(ads),
                     "rank": max(x.rank for x in ads), "load_tps": round(load, 1),
                     **{f"pos{i}": round(float(S[g, i]), 4) for i in range(a.gpus)}})
    df = pd.DataFrame(rows)
    print(df.to_string(index=False))
    if csv_out is not None:
        df.to_csv(csv_out, index=False)
    weakest, sd = draw_spread(S)
    print(f"best order (GPU per position): {list(order)}")
    print(check_floor(inst, dur, a.workers))
    print(f"gpus={a.gpus} accepted={low >= 1.0} best_order_min_score={low:.4f} "
          f"weakest_gpu_mean={weakest:.4f} sd={sd:.4f} spread_margin={SPREAD_SIGMAS * sd:.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
