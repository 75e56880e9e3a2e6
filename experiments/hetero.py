"""Mixed GPU types, power caps and energy: best homogeneous plan vs mixed greedy vs exact.

``python -m experiments.hetero [--quick] [--instances DIR] [--time-limit S] [--out PNG]
[--json OUT] [--force]``; ``python -m experiments.hetero --write-instances DIR [--force]``
writes the ``instances/hetero/`` set (seeded, ``hetero_instances``).

For every instance of the set (``--quick``: the ones marked quick), with the configuration index
of ``optim.gpu_configs`` (twin-measured capacity and power line of each (type, cap, Amax, rank);
cached on disk, so only a first run measures):

* **homogeneous**: the cheapest single-type plan that fits the type's availability (the greedy
  over configurations restricted to each type in turn, best by the instance's objective);
* **mixed greedy**: ``optim solve --method greedy`` on the whole pool (``optim.config_greedy``);
* **exact**: ``optim solve --method cpsat`` (``optim.exact.templates``), on the instances marked
  small, with ``--time-limit`` (default 60 s).

Every placement is replayed in the twin, each GPU with its own profile and cap. Printed: a table
(cost $/h, energy kJ/h measured by the twin, GPUs by type, twin verdict, proven), the plot
(default ``results/hetero.png``) and the last line ``mixed_vs_homogeneous_cost_reduction=<pct>
exact_proven=<k>/<n> twin_failures=<f> derived_qwen_maxpack_smape=<x>``: the mean over the
cost-objective instances of 100 x (1 - mixed cost / homogeneous cost); exact proven optimal
within the limit; placements (all methods) the twin rejected; and the derived-Qwen Maxpack
SMAPE of ``experiments.derived_profile_check --quick`` (its own function).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

LLAMA = "llama-3.1-8b-instruct"
DEFAULT_DIR = Path(__file__).resolve().parent.parent / "instances" / "hetero"
# Illustrative on-demand prices ($ per GPU-hour; instance inputs, not quotes) and caps (W).
TYPES = {
    "h100": {"gpu": "H100-64GB", "price_per_hour": 2.49, "power_caps_w": [400, 700]},
    "h200": {"gpu": "H200", "price_per_hour": 3.59, "power_caps_w": [450, 700]},
    "a100": {"gpu": "A100-80GB", "price_per_hour": 1.29, "power_caps_w": [250, 400]},
    "l40s": {"gpu": "L40S", "price_per_hour": 0.86, "power_caps_w": [250, 350]},
}
# name: (adapters, total offered load tok/s, {type: availability}, price overrides, objective,
#        power budget W, small (exact), quick, description)
SPECS = [
    ("hetero-mixed-n12", 12, 30_000, {"h100": 4, "a100": 4, "l40s": 4}, {}, "cost", None,
     True, True, "mixed pool at list prices"),
    ("hetero-scarce-n12", 12, 40_000, {"h100": 1, "h200": 3, "a100": 2}, {}, "cost", None,
     True, True, "the best load-per-$ type (h100) is scarce"),
    ("hetero-priceflip-n12", 12, 30_000, {"h100": 4, "a100": 4, "l40s": 4},
     {"h100": 1.49, "a100": 1.79, "l40s": 1.19}, "cost", None, True, True,
     "the mixed pool with prices flipped (h100 discounted, a100/l40s dearer)"),
    ("hetero-budget-n12", 12, 30_000, {"h100": 4, "a100": 4, "l40s": 4}, {}, "cost", 1150.0,
     True, True, "the mixed pool under a 1,150 W cluster power budget"),
    ("hetero-energy-slack-n8", 8, 9_000, {"h100": 3, "a100": 3}, {}, "energy", None, True,
     False, "energy objective, slack demand (a fraction of one GPU per adapter group)"),
    ("hetero-energy-tight-n12", 12, 38_000, {"h100": 3, "a100": 2}, {}, "energy", None, True,
     False, "energy objective, demand close to the pool's capacity"),
    ("hetero-mixed-n16-r8", 16, 45_000, {"h100": 4, "h200": 2, "a100": 4, "l40s": 4}, {},
     "cost", None, True, False, "four types, ranks 8 and 16"),
    ("hetero-mixed-n48", 48, 90_000, {"h100": 8, "h200": 4, "a100": 8, "l40s": 8}, {}, "cost",
     None, False, False, "larger mixed pool (greedy only)"),
]


def _adapters(n: int, load_tps: float, seed: int, ranks: tuple[int, ...]) -> list[dict]:
    from twin.lengths import default_lengths
    rng = np.random.default_rng(seed)
    w = rng.lognormal(0.0, 0.8, n)
    lengths = default_lengths()
    rate = load_tps / (lengths.mean_input + lengths.mean_output)
    rates = w / w.sum() * rate
    return [{"id": f"a{i:02d}", "rank": int(ranks[i % len(ranks)]), "rate": round(float(r), 6)}
            for i, r in enumerate(rates)]


def hetero_instances(seed: int = 0) -> list[tuple[dict, bool, bool]]:
    """(instance dict, small, quick) of every instance of the set, seeded."""
    out = []
    for k, (name, n, load, avail, prices, obj, budget, small, quick, desc) in enumerate(SPECS):
        ranks = (8, 16) if name.endswith("-r8") else (16,)
        gpus = [{"name": t, "gpu": TYPES[t]["gpu"], "model": LLAMA, "availability": c,
                 "price_per_hour": prices.get(t, TYPES[t]["price_per_hour"]),
                 "power_caps_w": TYPES[t]["power_caps_w"]} for t, c in avail.items()]
        d = {"schema_version": 1, "name": name, "description": desc,
             "adapters": _adapters(n, load, seed + k, ranks), "gpus": gpus,
             "objective": obj, "solver": {"time_limit_s": 60}, "duration_s": 600, "seed": 0}
        if budget is not None:
            d["power_budget_w"] = budget
        out.append((d, small, quick))
    return out


def write_instances(out_dir: Path, force: bool) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for d, _, _ in hetero_instances():
        p = out_dir / f"{d['name']}.json"
        if p.exists() and not force:
            raise FileExistsError(f"{p} exists (use --force to overwrite)")
        p.write_text(json.dumps(d, indent=1) + "\n")
        written.append(p)
    return written
