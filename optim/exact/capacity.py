"""Where a GPU type's configurations come from, and building the ``PackingProblem`` of an instance.

Three sources, chosen per GPU type (``capacity_source``):

1. **constant** — the instance gives the type ``capacity_tps`` at ``capacity_amax``: one
   configuration per rank class that starts at that Amax, load interval ``[0, capacity_tps]``,
   any adapter count. With one type this is classical bin packing.
2. **surrogate** — the encodable ``surrogates.encodable.CapacityModel`` trained for the type's
   profile, loaded from ``surrogates/trained/<profile>/capacity.json`` (override the directory
   with ``$LORA_SURROGATES_DIR`` or pass a model). Each piece with ``cap_load > 0`` and a
   KV-capacity entry for (Amax, rank) becomes one configuration, exactly (no approximation
   beyond the surrogate and the conservative integer rounding of ``problem``).
3. **provisional** — when no trained model is committed yet: the same piece structure measured
   directly with the twin (``provisional_pieces``): for every rank class, every adapter-count
   interval of ``surrogates.encodable.DEFAULT_BREAKS`` up to ``PROVISIONAL_N_MAX`` and every
   Amax of ``surrogates.dataset.valid_amaxes`` at the interval's largest count ``m``, the
   saturated throughput of ``m`` equal-rate adapters of that rank (two passes, the second at
   1.25x the first, as ``optim.capacity`` does), capped to be non-increasing in the count. Equal
   rates at the largest count of the interval is the hardest mix of the interval for the twin
   (most distinct adapters per batch), so the table is conservative. Seeded and cached as JSON
   under ``results/exact/provisional/``.

For the gpus and cost objectives, configurations dominated by another of the same type (rank
class >= , count interval a superset, capacity >=) are dropped: the optimum is unchanged.

For the latency objective each configuration is split into ``LATENCY_LOAD_BINS`` load
intervals; the ITL of a sub-piece is the ITL model's prediction (``surrogates.models.
ItlRegressor`` from ``surrogates/trained/<profile>/itl``) for a GPU of equal-rate adapters at the
sub-piece's mid load and the interval's mid count — a per-piece ITL **table** derived from the
(non-encodable) tree model; the objective is exact for the table, approximate for the model.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Sequence

from .problem import (Config, PackingProblem, TypeSpec, scale_cap, scale_interval, scale_load)

REPO = Path(__file__).resolve().parents[2]
PROVISIONAL_DIR = REPO / "results" / "exact" / "provisional"
PROVISIONAL_N_MAX = 128
PROVISIONAL_DURATION_S = 600.0
LATENCY_LOAD_BINS = 4


def trained_dir() -> Path:
    return Path(os.environ.get("LORA_SURROGATES_DIR", REPO / "surrogates" / "trained"))


def load_capacity_model(profile: str):
    """The committed ``CapacityModel`` of a profile, or ``None`` when none is committed."""
    path = trained_dir() / profile / "capacity.json"
    if not path.is_file():
        return None
    from surrogates.encodable import CapacityModel
    return CapacityModel.load(path)


def load_itl_model(profile: str):
    """The committed ITL model of a profile, or ``None``."""
    stem = trained_dir() / profile / "itl"
    if not stem.with_suffix(".json").is_file():
        return None
    from surrogates.models import ItlRegressor
    return ItlRegressor.load(stem)


# --------------------------------------------------------------------------- provisional table
class PieceTable:
    """A list of ``surrogates.encodable.Piece`` behind the ``pieces()`` interface."""

    def __init__(self, pieces: Sequence[Any], source: str = "custom") -> None:
        self._pieces = list(pieces)
        self.source = source

    def pieces(self) -> list:
        return list(self._pieces)


def _saturation(prof, rank: int, amax: int, n: int, lengths, duration_s: float,
                seed: int) -> float:
    from twin.server import ServerConfig, simulate_requests
    from twin.workload import Adapter, generate_requests
    tps = 40_000.0
    m = None
    for _ in range(2):
        rate = tps / (lengths.mean_input + lengths.mean_output) / n
        ads = [Adapter(f"p{i}", rank, rate) for i in range(n)]
        reqs = generate_requests(ads, duration_s, lengths, seed=seed)
        m = simulate_requests(prof, ads, reqs, ServerConfig(max_loras=amax, max_lora_rank=rank),
                              duration_s)
        tps = 1.25 * m.throughput_tps
    return float(m.throughput_tps)


def provisional_pieces(profile: str, lengths=None, n_max: int = PROVISIONAL_N_MAX,
                       duration_s: float = PROVISIONAL_DURATION_S, seed: int = 0,
                       cache: bool = True, progress: bool = False) -> PieceTable:
    """Twin-measured pieces (see the module docstring), cached per (profile, lengths, args)."""
    from surrogates.dataset import AMAX_GRID, valid_amaxes
    from surrogates.encodable import DEFAULT_BREAKS, Piece
    from surrogates.features import RANK_CLASSES
    from twin.sharegpt import default_lengths
    from twin.profile import load_profile

    lengths = lengths if lengths is not None else default_lengths()
    prof = load_profile(profile)
    key = json.dumps({"profile": profile, "profile_json": prof.to_dict(),
                      "lengths": lengths.to_dict(), "n_max": n_max, "duration": duration_s,
                      "seed": seed, "v": 1}, sort_keys=True, default=str)
    h = hashlib.sha256(key.encode()).hexdigest()[:12]
    path = PROVISIONAL_DIR / f"{profile}-{h}.json"
    if cache and path.is_file():
        d = json.loads(path.read_text())
        return PieceTable([Piece(**p) for p in d["pieces"]], f"provisional:{path.name}")
    breaks = [b for b in DEFAULT_BREAKS if b <= n_max + 1]
    pieces = []
    cells = [(r, lo, hi) for r in RANK_CLASSES if r in prof.supported_ranks
             for lo, hi in zip(breaks[:-1], breaks[1:]) if lo >= 1]
    it = cells
    if progress:
        from tqdm import tqdm
        it = tqdm(cells, desc=f"provisional capacity {profile}", leave=False)
    running: dict[tuple[int, int], float] = {}
    for r, lo, hi in it:
        m = hi - 1
        for A in valid_amaxes(m, AMAX_GRID):
            if prof.kv_tokens(A, r) is None:
                pieces.append(Piece(r, A, "n", float(lo), float(hi), 0.0, 1.0, 0.0, True, 0))
                continue
            sat = _saturation(prof, r, A, m, lengths, duration_s, seed)
            cap = min(sat, running.get((r, A), math.inf))
            running[(r, A)] = cap
            pieces.append(Piece(r, A, "n", float(lo), float(hi), cap, 1.0, sat, False, 1))
    if cache:
        PROVISIONAL_DIR.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"key": json.loads(key) | {"profile_json": None},
                                    "pieces": [vars(p) if not hasattr(p, "__dataclass_fields__")
                                               else {k: getattr(p, k) for k in
                                                     p.__dataclass_fields__}
                                               for p in pieces]}, indent=0) + "\n")
    return PieceTable(pieces, f"provisional:{path.name}")


def capacity_model_for(profile: str, lengths=None, allow_provisional: bool = True,
                       progress: bool = False):
    """(model with ``pieces()``, source string): the committed model, else the provisional
    table (or ``ValueError`` naming the missing file when ``allow_provisional`` is False)."""
    m = load_capacity_model(profile)
    if m is not None:
        return m, f"surrogate:{trained_dir() / profile / 'capacity.json'}"
    if not allow_provisional:
        raise ValueError(f"capacity model: {trained_dir() / profile / 'capacity.json'} not found "
                         "(train it with `python -m surrogates train`)")
    t = provisional_pieces(profile, lengths, progress=progress)
    return t, t.source


# --------------------------------------------------------------------------- configurations
def _dominated(c: Config, d: Config) -> bool:
    """``d`` admits every (adapter set, load) that ``c`` admits."""
    return (d.rank >= c.rank and d.x_lo <= c.x_lo and d.x_hi >= c.x_hi and d.cap >= c.cap
            and d.load_lo <= c.load_lo)


def reduce_dominated(configs: Sequence[Config]) -> tuple[Config, ...]:
    """Drop configurations admitted-set-dominated by another (keep the first of equals)."""
    out: list[Config] = []
    for i, c in enumerate(configs):
        dom = False
        for j, d in enumerate(configs):
            if i == j or not _dominated(c, d):
                continue
            if not _dominated(d, c) or j < i:
                dom = True
                break
        if not dom:
            out.append(c)
    return tuple(out)


def configs_from_pieces(model, prof, integral: bool = True, objective: str = "gpus",
                        itl_fn: Callable[[Any, float, float], float] | None = None,
                        load_bins: int = LATENCY_LOAD_BINS) -> tuple[Config, ...]:
    """Configurations of one type from a capacity model's pieces (module docstring)."""
    out: list[Config] = []
    min_rows = getattr(model, "min_rows", 0)
    for p in model.pieces():
        if p.memory_error or p.cap_load <= 0 or p.max_rank not in prof.supported_ranks:
            continue
        if p.n_rows < min_rows:          # no training data: never chosen ("usable" is False)
            continue
        if prof.kv_tokens(p.amax, p.max_rank) is None:
            continue
        lo, hi = scale_interval(p.x_lo, p.x_hi, integral)
        if hi < max(lo, 1 if integral else 0):
            continue
        cap = scale_cap(p.cap_load)
        label = f"r{p.max_rank}/A{p.amax}/{p.x_feature}[{p.x_lo:g},{p.x_hi:g})"
        if objective == "latency" and itl_fn is not None:
            for b in range(load_bins):
                llo = cap * b // load_bins + (1 if b else 0)
                lhi = cap * (b + 1) // load_bins
                mid_tps = (llo + lhi) / 2 / 1000.0
                itl = float(itl_fn(p, mid_tps, 0.5 * (p.x_lo + min(p.x_hi, 1e6))))
                out.append(Config(p.max_rank, p.amax, lo, hi, lhi, llo, itl,
                                  f"{label}/L{b}"))
        else:
            out.append(Config(p.max_rank, p.amax, lo, hi, cap, 0, None, label))
    if objective != "latency":
        return reduce_dominated(out)
    return tuple(out)


# piece features whose per-adapter value is never below the SLO table's busy count
# 1 - exp(-5 s x rate): a GPU's table cap at its feature value is then at most its cap at its
# own busy count (the table's caps fall with the busy count)
SLO_TABLE_FEATURES = ("n", "busy5", "busy30")
_SLO_X_SLACK = 1e-3     # feature units: covers the per-adapter rounding of non-integer features


def slo_table_cap(table, rank: int, x_hi: int, integral: bool) -> float:
    """The SLO table's limit (tok/s) for a configuration of server rank ``rank`` whose feature
    interval ends at ``x_hi`` (integer units, inclusive): ``table.curve_for(rank)`` at the
    largest feature value admitted, never above the one-adapter limit. Every GPU the
    configuration admits has a busy count at most that value, so this is at most the cap greedy's
    packing gives it at the configuration's server rank (``SloCapacity.row_caps``):

        cap_slo(p) = min(one_t, C_{r_p}(x_hi_p / s + slack)),   C decreasing in the busy count

    (s = 1 for integer features, ``X_SCALE`` otherwise)."""
    from .problem import X_SCALE
    one = float(table.one_tps)
    if not table.curves:
        return one
    x = float(x_hi) if integral else float(x_hi) / X_SCALE
    return float(min(one, table.curve_for(rank).cap_tps(x + _SLO_X_SLACK)))


def _slo_capped(cfgs: Sequence[Config], table, x_feature: str, integral: bool
                ) -> tuple[tuple[Config, ...], str]:
    """``cfgs`` capped by the SLO table (``slo_table_cap``), dropping those left empty; with a
    piece feature the table cannot bound (``SLO_TABLE_FEATURES``), by its one-adapter limit."""
    if x_feature in SLO_TABLE_FEATURES:
        caps = [scale_cap(slo_table_cap(table, c.rank, c.x_hi, integral)) for c in cfgs]
        note = (f"configurations capped by the SLO table (limit by rank and busy count at each "
                f"piece's largest {x_feature}; one adapter {table.one_tps:.0f} tok/s)")
    else:
        caps = [scale_cap(table.one_tps)] * len(cfgs)
        note = (f"configurations capped at {table.one_tps:.0f} tok/s (the one-adapter carry "
                f"limit under the SLO; feature {x_feature} does not bound the busy count)")
    out = tuple(replace(c, cap=min(c.cap, k)) for c, k in zip(cfgs, caps)
                if min(c.cap, k) >= max(c.load_lo, 1))
    return out, note


def constant_configs(gt, prof, objective: str = "gpus") -> tuple[Config, ...]:
    """Constant capacity: one configuration per rank class starting at ``capacity_amax``."""
    cap = scale_cap(gt.capacity_tps)
    out = [Config(r, gt.capacity_amax, 0, 2**40, cap, 0, None,
                  f"r{r}/A{gt.capacity_amax}/const")
           for r in sorted(prof.supported_ranks) if prof.kv_tokens(gt.capacity_amax, r)]
    return reduce_dominated(out) if objective != "latency" else tuple(out)


def itl_table_fn(itl_model, lengths):
    """``(piece, load_tps, n) -> ITL ms`` from the ITL model at equal-rate adapters."""
    import numpy as np
    from surrogates.features import gpu_features

    def fn(p, load_tps, n_mid):
        n = max(1, int(round(n_mid)))
        rate = max(load_tps, 1e-3) / (lengths.mean_input + lengths.mean_output) / n
        f = gpu_features([p.max_rank] * n, [rate] * n, p.amax, lengths)
        v, _ = itl_model.predict_with_flags(f[None, :])
        return float(v[0]) if np.isfinite(v[0]) else 1e6
    return fn


def build_problem(inst, objective: str | None = None, gpu_budget: int | None = None,
                  models: dict[str, Any] | None = None, allow_provisional: bool = True,
                  itl_fns: dict[str, Callable] | None = None,
                  progress: bool = False,
                  load_caps: dict[str, float] | None = None,
                  slo_tables: dict[str, Any] | None = None) -> PackingProblem:
    """The ``PackingProblem`` of an instance (with its ``max_homes``). ``models`` maps a
    profile name to a capacity
    model (anything with ``pieces()``) overriding the committed one; ``itl_fns`` maps a profile
    to an ITL table function (latency objective; default: from the committed ITL model).
    ``load_caps`` (GPU type name -> tok/s) caps every configuration of that type: under a latency
    SLO, the one-adapter carry limit under it (``feasibility.one_adapter_caps``), which no GPU
    meeting the SLO exceeds, so the model proposes no GPU the SLO rules out by load alone::

        cap_p <- min(cap_p, floor(load_cap_t x LOAD_SCALE))   for every piece p of type t

    ``slo_tables`` (GPU type name -> ``optim.slo_capacity.SloCapacity``, the table greedy packs
    with under the SLO) caps each configuration by the table's limit at the largest feature
    value its interval admits (``slo_table_cap``), so the exact models and greedy's packing
    read the same SLO surrogate; valid for piece features that count every adapter at least
    as busy as the table's 5 s busy count (``n``, ``busy5``, ``busy30``), else only the
    one-adapter limit ``one_tps`` applies (a note says so)."""
    from surrogates.features import adapter_feature_matrix, ADDITIVE
    from twin.profile import load_profile

    objective = objective or inst.objective.kind
    budget = gpu_budget if gpu_budget is not None else inst.objective.gpu_budget
    models = dict(models or {})
    itl_fns = dict(itl_fns or {})
    types: list[TypeSpec] = []
    x_feature = None
    notes: list[str] = []
    for t in inst.gpu_types:
        prof = load_profile(t.profile)
        if t.constant_capacity:
            cfgs = constant_configs(t, prof, objective)
            if objective == "latency":
                raise ValueError(f"gpus[{t.name}]: the latency objective needs the ITL model; a "
                                 "constant capacity has none")
            types.append(TypeSpec(t.name, t.profile, t.count, t.price_per_hour, cfgs, "constant"))
            continue
        if t.profile in models:
            model, source = models[t.profile], getattr(models[t.profile], "source", "custom")
        else:
            model, source = capacity_model_for(t.profile, inst.lengths, allow_provisional,
                                               progress)
        pieces = model.pieces()
        xf = pieces[0].x_feature if pieces else "n"
        if x_feature is not None and xf != x_feature:
            raise ValueError(f"gpus[{t.name}]: capacity model feature '{xf}' differs from "
                             f"'{x_feature}' of another type")
        x_feature = xf
        fn = None
        if objective == "latency":
            fn = itl_fns.get(t.profile)
            if fn is None:
                im = load_itl_model(t.profile)
                if im is None:
                    raise ValueError(f"objective 'latency': no ITL model for profile "
                                     f"'{t.profile}' ({trained_dir() / t.profile / 'itl.json'})")
                fn = itl_table_fn(im, inst.lengths)
        integral = xf == "n" or xf.startswith("n_rank")
        cfgs = configs_from_pieces(model, prof, integral, objective, fn)
        if load_caps and t.name in load_caps:
            top = scale_cap(load_caps[t.name])
            cfgs = tuple(replace(c, cap=min(c.cap, top)) for c in cfgs
                         if min(c.cap, top) >= max(c.load_lo, 1))
            notes.append(f"gpus[{t.name}]: configurations capped at {load_caps[t.name]:.0f} tok/s "
                         "(the one-adapter carry limit under the SLO)")
        if slo_tables and t.name in slo_tables:
            cfgs, note = _slo_capped(cfgs, slo_tables[t.name], xf, integral)
            if objective != "latency":      # capped pieces may now be dominated
                cfgs = reduce_dominated(cfgs)
            notes.append(f"gpus[{t.name}]: {note}")
        types.append(TypeSpec(t.name, t.profile, t.count, t.price_per_hour, cfgs, source))
    x_feature = x_feature or "n"
    integral = x_feature == "n" or x_feature.startswith("n_rank")
    ranks = [a.rank for a in inst.adapters]
    rates = [a.rate for a in inst.adapters]
    if x_feature == "n":
        xs = [1] * len(ranks)
    else:
        M = adapter_feature_matrix(ranks, rates, inst.lengths)
        col = M[:, ADDITIVE.index(x_feature)]
        xs = [int(round(v)) if integral else int(round(v * 1_000_000)) for v in col]
    loads_tps = [inst.load_tps(a) for a in inst.adapters]
    if objective == "latency" and budget is None:
        raise ValueError("objective 'latency' needs a GPU budget (objective.gpu_budget)")
    return PackingProblem(inst.name, tuple(a.id for a in inst.adapters), tuple(ranks),
                          tuple(scale_load(v) for v in loads_tps), tuple(xs), tuple(types),
                          objective, budget if objective == "latency" else None, x_feature,
                          tuple(loads_tps), notes=tuple(notes),
                          max_homes=getattr(inst, "max_homes", 1))
