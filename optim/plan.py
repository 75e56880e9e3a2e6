"""The operator's path: a CSV of adapters in, a plan folder out (``python -m optim plan``).

``plan_instance`` turns an adapters CSV (``id,rank,rate``), a GPU type and a base model (or a pool
of ``TYPE=COUNT[@PRICE]`` entries) into an :class:`~optim.instance.Instance`; ``make_plan`` then
runs the stages an operator needs, each announced on stderr as it starts:

1. the twin-sound lower bound on the GPU count (``feasibility.twin_lower_bound``): its carry
   limits are measured once per profile, lengths model and window and cached (shipped for the
   shipped profiles in ``optim/data/carry_limits.json``);
2. the placement (greedy by default, any registered method by name), verified in the fleet twin
   and, for greedy, repaired and compacted there; then each GPU's ``max_loras`` is set to its
   best integer in the twin (``optim.amax_tuning``);
3. the report curves: every GPU's twin capacity (the largest load, its adapters' rates scaled
   together, it carries unstarved at its max_loras) and, for the busiest GPUs, twin throughput / offered load against ``max_loras`` with the
   chosen point and the starvation line; under a latency SLO also their p99 TTFT and p99 ITL
   against ``max_loras`` with the SLO's bounds (the residency cliff, ``twin.cliff``);
4. the files: ``placement.json`` (the full record with its claim and bound, and in
   ``params.plan_inputs`` the options the instance was built with, :class:`PlanInputs`, so
   ``optim replan NEW.csv --previous plan/placement.json`` builds the next one alike), the deployment
   files of ``optim.deploy`` (vLLM command per GPU, routing table, control-plane manifests) and
   ``report.md`` + ``report.png``.

Nothing is written when a stage fails; an existing non-empty folder is refused unless ``force``.
"""

from __future__ import annotations

import json
import math
import re
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Sequence

from twin.server import Judging
from twin.workload import Adapter

from .instance import Instance, InstanceError, instance_from_dict
from .placement import GpuPlan, Placement, claim_qualifier

DEFAULT_DURATION_S = 3600.0
EXAMPLE_CSV = Path(__file__).resolve().parent.parent / "instances" / "examples" / "adapters.csv"
CURVE_WINDOW_S = 600.0          # window of the report's curves (the verdict uses the plan's)
CURVE_GPUS = 8                  # GPUs whose max_loras curve the report draws (busiest first)
CAPACITY_ROUNDS = 7             # bisection rounds of a GPU's capacity (bracket / 128)
_AMAX_LADDER = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
_POOL = re.compile(r"^(?P<type>[^=@\s]+)=(?P<count>[^@\s]+)(?:@(?P<price>\S+))?$")


class PlanError(ValueError):
    """Bad plan input; the message names the option or file and the reason."""


# ----------------------------------------------------------------------------- instance
@dataclass(frozen=True)
class PoolEntry:
    """One GPU type of the pool: catalog id (or alias), how many are available, $/GPU-hour."""

    gpu: str
    count: int | None = None
    price_per_hour: float | None = None


def parse_pool(text: str) -> PoolEntry:
    """``TYPE=COUNT[@PRICE]`` (e.g. ``H100=8@2.49``) as a :class:`PoolEntry`."""
    from twin.identifiers import identifier
    try:
        identifier(text, "--pool entry")
    except ValueError as e:
        raise PlanError(f"--pool: {e}") from None
    m = _POOL.match(text.strip())
    if not m:
        raise PlanError(f"--pool {text!r}: expected TYPE=COUNT[@PRICE], e.g. H100=8@2.49")
    try:
        count = int(m["count"])
    except ValueError:
        raise PlanError(f"--pool {text!r}: COUNT must be an integer, got {m['count']!r}") from None
    if not 1 <= count <= 100_000:
        raise PlanError(f"--pool {text!r}: COUNT must be in 1..100000, got {count}")
    price = None
    if m["price"] is not None:
        try:
            price = float(m["price"])
        except ValueError:
            raise PlanError(f"--pool {text!r}: PRICE must be a number ($/GPU-hour), got "
                            f"{m['price']!r}") from None
        if not (math.isfinite(price) and 0 <= price <= 1e4):
            raise PlanError(f"--pool {text!r}: PRICE must be in [0, 10000] $/GPU-hour, got "
                            f"{m['price']}")
    return PoolEntry(m["type"], count, price)


def resolve_gpu(name: str, model: str) -> str:
    """Catalog id for ``name``: an exact id (any case), else the ids it prefixes up to a ``-``,
    preferring the one with a measured profile of ``model`` (``H100`` -> ``H100-64GB`` for the shipped Llama
    and Qwen profiles)."""
    from twin.gpu_catalog import gpu_ids
    from twin.identifiers import identifier
    try:
        name = identifier(name, "GPU type")
    except ValueError as e:
        raise PlanError(f"--gpu: {e}") from None
    ids = gpu_ids()
    low = {i.lower(): i for i in ids}
    if name.lower() in low:
        return low[name.lower()]
    cands = [i for i in ids if i.lower().startswith(name.lower() + "-")]
    if len(cands) > 1:
        measured = [i for i in cands if _measured_profile(i, model) is not None]
        if len(measured) == 1:
            return measured[0]
    if len(cands) == 1:
        return cands[0]
    why = f"matches {', '.join(cands)}" if cands else "is not in the catalog"
    raise PlanError(f"--gpu {name!r}: {why} (catalog: {', '.join(ids)}; "
                    "twin/data/gpus.json)")


def _measured_profile(gpu: str, model: str) -> str | None:
    """Name of the shipped measured profile of ``model`` on catalog ``gpu``, if any."""
    from twin.derive import profile_for
    try:
        prof = profile_for(gpu, model)
    except (ValueError, OSError, KeyError):
        return None
    return None if prof.is_derived else prof.name


def _gpu_entry(gpu: str, model: str, count: int, price: float | None) -> dict[str, Any]:
    measured = _measured_profile(gpu, model)
    entry: dict[str, Any] = ({"profile": measured} if measured is not None
                             else {"gpu": gpu, "model": model})
    entry = {"name": gpu.lower(), **entry, "count": count}
    if price is not None:
        entry["price_per_hour"] = price
    return entry


def _default_count(adapters_csv: Path, gpu: str, model: str, name: str, base: dict) -> int:
    """Pool size when none is given: enough for any placement the methods may open (at least
    twice the constant-capacity lower bound, plus two), at most one GPU per adapter."""
    from .feasibility import gpu_lower_bound
    probe = instance_from_dict({**base, "gpus": [_gpu_entry(gpu, model, 100_000, None)]},
                               str(adapters_csv), adapters_csv.parent)
    n = len(probe.adapters)
    return max(1, min(n, 2 * gpu_lower_bound(probe) + 2))


@dataclass(frozen=True)
class PlanInputs:
    """What ``optim plan`` builds its instance from besides the adapters CSV, recorded in the
    plan's ``params.plan_inputs``: ``optim replan NEW.csv --previous plan/placement.json``
    builds the new instance from them, as ``optim plan NEW.csv`` with the same options would
    (``slo``: the ``Slo`` JSON object; ``slo_classes``: (class, bounds) pairs)."""

    gpu: str = "H100"
    model: str = "llama-3.1-8b-instruct"
    pool: tuple[PoolEntry, ...] = ()
    objective: str = "gpus"
    duration_s: float = DEFAULT_DURATION_S
    seed: int = 0
    max_homes: int = 1
    slo: dict | None = None
    slo_classes: tuple[tuple[str, dict], ...] = ()
    headroom: bool = True

    def to_dict(self) -> dict[str, Any]:
        return {"gpu": self.gpu, "model": self.model,
                "pool": [{"gpu": e.gpu, "count": e.count, "price_per_hour": e.price_per_hour}
                         for e in self.pool],
                "objective": self.objective, "duration_s": self.duration_s, "seed": self.seed,
                "max_homes": self.max_homes, "slo": self.slo,
                "slo_classes": [[c, dict(b)] for c, b in self.slo_classes],
                "headroom": self.headroom}

    @classmethod
    def from_dict(cls, d: Any, where: str = "plan_inputs") -> "PlanInputs":
        """The inputs of a plan's record; ``PlanError`` naming the field when one is missing or
        of the wrong type (the values themselves are checked as ``optim plan`` checks them)."""
        if not isinstance(d, dict):
            raise PlanError(f"{where}: must be an object, got {type(d).__name__}")
        bad = sorted(set(d) - set(cls().to_dict()))
        if bad:
            raise PlanError(f"{where}: unknown field(s) {bad}")
        kinds = {"gpu": str, "model": str, "pool": list, "objective": str,
                 "duration_s": (int, float), "seed": int, "max_homes": int,
                 "slo": (dict, type(None)), "slo_classes": list, "headroom": bool}
        for k, t in kinds.items():
            if k not in d:
                raise PlanError(f"{where}.{k}: missing")
            if not isinstance(d[k], t) or (t is int and isinstance(d[k], bool)):
                raise PlanError(f"{where}.{k}: wrong type {type(d[k]).__name__}")
        try:
            pool = tuple(PoolEntry(str(e["gpu"]), e.get("count"), e.get("price_per_hour"))
                         for e in d["pool"])
            classes = tuple((str(c), dict(b)) for c, b in d["slo_classes"])
        except (TypeError, KeyError, ValueError, AttributeError) as e:
            raise PlanError(f"{where}.pool / slo_classes: malformed ({e})") from None
        return cls(d["gpu"], d["model"], pool, d["objective"], float(d["duration_s"]),
                   d["seed"], d["max_homes"], d["slo"], classes, d["headroom"])

    def instance(self, adapters_csv: str | Path, name: str | None = None) -> Instance:
        """The instance ``optim plan`` builds from ``adapters_csv`` with these inputs."""
        slo = None
        if self.slo is not None:
            from twin.slo import Slo
            try:
                slo = Slo.from_dict(self.slo, "plan_inputs.slo")
            except ValueError as e:
                raise PlanError(str(e)) from None
        inst = plan_instance(adapters_csv, self.gpu, self.model, self.pool, self.objective,
                             self.duration_s, self.seed, name, self.max_homes, slo,
                             self.slo_classes)
        return replace(inst, headroom=True) if self.headroom else inst


def plan_instance(adapters_csv: str | Path, gpu: str = "H100",
                  model: str = "llama-3.1-8b-instruct", pool: Sequence[PoolEntry] = (),
                  objective: str = "gpus", duration_s: float = DEFAULT_DURATION_S, seed: int = 0,
                  name: str | None = None, max_homes: int = 1, slo=None,
                  slo_classes: Sequence[tuple[str, dict[str, float]]] = ()) -> Instance:
    """An instance from an adapters CSV: one GPU type (``gpu`` serving ``model``, pool sized
    automatically) or the given ``pool`` entries (their ``gpu`` resolved like ``gpu``).
    ``slo_classes`` ((class, bounds) pairs, ``--slo-class``) hold the adapters the CSV's
    optional ``slo_class`` column names to their own bounds (``twin.slo.SloClass``)."""
    path = Path(adapters_csv)
    if not path.is_file():
        raise PlanError(f"{path}: no such file (expected a CSV with header id,rank,rate)")
    from twin.model_configs import ModelConfigError, model_config
    try:
        model_config(model)
    except ModelConfigError as e:
        raise PlanError(f"--model {model!r}: {e}") from None
    if name is not None:
        from twin.identifiers import identifier
        try:
            name = identifier(name, "plan name")
        except ValueError as e:
            raise PlanError(f"--name: {e}") from None
    stem = name or re.sub(r"[^A-Za-z0-9_.-]+", "-", path.stem).strip("-") or "plan"
    base: dict[str, Any] = {"schema_version": 1, "name": stem,
                            "description": f"{path.name}; planned with optim plan",
                            "adapters": path.name, "objective": objective,
                            "duration_s": float(duration_s), "seed": int(seed)}
    if max_homes > 1:
        base["max_homes"] = int(max_homes)
    if slo is not None:
        base["slo"] = slo.to_dict()
    classes = _class_members(path, slo_classes)
    if classes:
        base["slo"] = {**base.get("slo", {}), "classes": classes}
    try:
        if pool:
            seen: set[str] = set()
            gpus = []
            for e in pool:
                gid = resolve_gpu(e.gpu, model)
                if gid in seen:
                    raise PlanError(f"--pool: GPU type {gid} given twice")
                seen.add(gid)
                gpus.append(_gpu_entry(gid, model, int(e.count or 1), e.price_per_hour))
        else:
            gid = resolve_gpu(gpu, model)
            gpus = [_gpu_entry(gid, model, _default_count(path, gid, model, stem, base), None)]
        inst = instance_from_dict({**base, "gpus": gpus}, str(path), path.parent)
    except InstanceError as e:
        raise PlanError(str(e)) from None
    _check_ranks(inst, path)
    return inst


def _check_ranks(inst: Instance, path: Path) -> None:
    """``PlanError`` naming the CSV's column when an adapter's rank starts on no GPU type of the
    plan: bad input, refused before the lower bound spends its first replay."""
    from .feasibility import unsupported_rank_reason
    bad = unsupported_rank_reason(inst)
    if bad is not None:
        raise PlanError(f"{path}: column 'rank': {bad.message}")


def _class_members(path: Path, slo_classes: Sequence[tuple[str, dict[str, float]]]
                   ) -> dict[str, dict]:
    """The instance's ``slo.classes``: each ``--slo-class`` with the adapters whose CSV
    ``slo_class`` column names it (an empty cell: the top-level SLO); {} without either."""
    import pandas as pd
    names = [c for c, _ in slo_classes]
    dup = sorted({c for c in names if names.count(c) > 1})
    if dup:
        raise PlanError(f"--slo-class: class {dup[0]!r} given twice")
    try:
        df = pd.read_csv(path, dtype=str, keep_default_na=False, skipinitialspace=True)
    except (OSError, ValueError) as e:
        raise PlanError(f"{path}: {e}") from None
    if "slo_class" not in df.columns:
        if not names:
            return {}
        raise PlanError(f"--slo-class: {path.name} has no slo_class column naming each "
                        "adapter's class (an empty cell: the top-level SLO)")
    named = sorted({c.strip() for c in df["slo_class"] if c.strip()})
    if named and not names:
        raise PlanError(f"{path.name}: its slo_class column names {', '.join(named[:5])} but no "
                        "--slo-class states their bounds (e.g. --slo-class "
                        f"{named[0]}:ttft_p99_ms=300)")
    members: dict[str, list[str]] = {c: [] for c in names}
    for row, (aid, c) in enumerate(zip(df["id"].str.strip(), df["slo_class"].str.strip())):
        if not c:
            continue
        if c not in members:
            raise PlanError(f"{path.name} row {row + 1}, column 'slo_class': class {c!r} has no "
                            f"--slo-class (given: {', '.join(names)})")
        members[c].append(aid)
    empty = [c for c, ids in members.items() if not ids]
    if empty:
        raise PlanError(f"--slo-class {empty[0]}: no adapter of {path.name} is in this class "
                        "(its slo_class column)")
    return {c: {**bounds, "adapters": members[c]} for c, bounds in slo_classes}


# ----------------------------------------------------------------------------- curves
@dataclass(frozen=True)
class GpuCurve:
    """One GPU's report figures: its twin capacity (the largest offered load, its adapters'
    rates scaled together, it carries unstarved at its chosen Amax) and, when drawn, twin throughput / offered load
    at each ``max_loras`` of ``amaxes`` (window ``CURVE_WINDOW_S``, the GPU's own seed), with
    the p99 TTFT and p99 ITL there (ms; ``twin.cliff.observed_p99``: the SLO judgement's
    values for the bounds the instance's SLO states, an unserved request an infinite TTFT)
    and whether the point is accepted (started, unstarved, SLO met)."""

    gpu: int
    offered_tps: float
    capacity_tps: float
    amaxes: tuple[int, ...] = ()
    served_share: tuple[float, ...] = ()
    memory_error: tuple[bool, ...] = ()
    p99_ttft_ms: tuple[float, ...] = ()
    p99_itl_ms: tuple[float, ...] = ()
    accepted: tuple[bool, ...] = ()


def amax_points(n_adapters: int, top: int, chosen: int) -> list[int]:
    """The ``max_loras`` values a curve shows: every integer up to 12, then a ladder up to the
    largest useful one (``min(adapters + 1, top)``) or the chosen one, whichever is larger, and
    the chosen one."""
    hi = max(1, min(n_adapters + 1, top), min(chosen, top))
    pts = set(range(1, min(hi, 12) + 1)) | {a for a in _AMAX_LADDER if a <= hi}
    return sorted(pts | {hi} | ({min(chosen, top)} if chosen >= 1 else set()))


def _assign(plan: GpuPlan, amax: int, judging: Judging, scale: float = 1.0):
    """``plan`` as a fleet-twin job at Amax ``amax`` with every adapter's rate x ``scale``,
    judged by ``judging``."""
    ads = tuple((Adapter(a.id, a.rank, a.rate * scale), s) for a, s in plan.adapters)
    return replace(plan, max_loras=int(amax), adapters=ads).twin_assignment(judging)


def gpu_curves(inst: Instance, p: Placement, window_s: float = CURVE_WINDOW_S,
               curve_gpus: int = CURVE_GPUS, workers: int | None = None) -> list[GpuCurve]:
    """Every GPU's capacity and the ``max_loras`` curves of the ``curve_gpus`` busiest."""
    from twin.cliff import observed_p99
    from twin.fleet import simulate_fleet
    from .capacity import max_startable_amax
    thr = inst.starvation_threshold
    seeds = [inst.seed + g for g in range(p.n_gpus)]

    def run(jobs, sds):
        if not jobs:
            return []
        return simulate_fleet(jobs, duration_s=window_s, lengths=inst.lengths, seed=inst.seed,
                              workers=workers, check_routing=False, seeds=sds).per_gpu

    # capacity: the largest offered load (the GPU's adapters scaled together) it carries
    # unstarved at its max_loras; bracketed by a heavy overload's throughput T (it carries at
    # least ~T x threshold, at most T / threshold), then bisected
    def offered(g: GpuPlan) -> float:
        return max(sum(inst.load_tps(a) * s for a, s in g.adapters), 1e-9)

    sat = run([_assign(g, g.max_loras, inst.judging, 40_000.0 / offered(g)) for g in p.gpus],
              seeds)
    lo = [0.5 * thr * m.throughput_tps for m in sat]
    hi = [max(m.throughput_tps / thr, 1.0) * 1.05 for m in sat]
    for _ in range(CAPACITY_ROUNDS):
        mid = [(a + b) / 2 for a, b in zip(lo, hi)]
        res = run([_assign(g, g.max_loras, inst.judging, x / offered(g))
                   for g, x in zip(p.gpus, mid)], seeds)
        for i, m in enumerate(res):
            ok = m.accepted
            lo[i], hi[i] = (mid[i], hi[i]) if ok else (lo[i], mid[i])
    caps = lo
    busiest = sorted(range(p.n_gpus), key=lambda g: -p.gpus[g].offered_tps)[:curve_gpus]
    jobs, sds, where = [], [], []
    for g in busiest:
        plan = p.gpus[g]
        top = max_startable_amax(plan.profile, plan.max_lora_rank)
        for a in amax_points(plan.n_adapters, max(top, 1), plan.max_loras):
            jobs.append(_assign(plan, a, inst.judging))
            sds.append(seeds[g])
            where.append((g, a))
    res = run(jobs, sds)
    by_gpu: dict[int, list[tuple]] = {}
    for (g, a), m in zip(where, res):
        share = m.throughput_tps / m.offered_tps if m.offered_tps > 0 else float("nan")
        by_gpu.setdefault(g, []).append((a, share, bool(m.memory_error), *observed_p99(m),
                                         bool(m.accepted)))
    out = []
    for g, plan in enumerate(p.gpus):
        cols = list(zip(*by_gpu.get(g, []))) or [()] * 6
        out.append(GpuCurve(g, plan.offered_tps, caps[g], *(tuple(c) for c in cols)))
    return out


# ----------------------------------------------------------------------------- report
@dataclass(frozen=True)
class PlanResult:
    """What ``make_plan`` produced: the placement, the bound it was compared with, the curves,
    the files written and the stage timings (seconds)."""

    instance: Instance
    placement: Placement
    bound: Any | None
    curves: tuple[GpuCurve, ...]
    files: tuple[Path, ...]
    stages: dict[str, float] = field(default_factory=dict)
    headroom: bool = True       # twin.headroom: the deployment flags GPUs at risk (--no-headroom)

    @property
    def claim(self) -> str:
        return claim_text(self.placement, self.bound)


def claim_text(p: Placement, bound) -> str:
    """The claim in words: optimal in the twin (the count meets the twin-sound bound), the
    gap to it, or no claim (another objective, or a rejected placement)."""
    if p.verdict != "accepted":
        return f"no claim: the twin verdict is {p.verdict or 'unverified'}"
    under = claim_qualifier(p.params)
    if p.params.get("claim"):
        return str(p.params["claim"]) + under
    if bound is not None and p.objective == "gpus":
        lb = final_bound(p, bound)
        if p.n_gpus == lb:
            return f"optimal in the twin{under} (the GPU count meets the twin lower bound)"
        return f"within {p.n_gpus - lb} GPU(s) of the twin lower bound ({lb})"
    return f"twin-accepted; objective {p.objective} (no optimality claim)"


def final_bound(p: Placement, bound) -> int:
    """The twin lower bound the claim uses: ``bound.best``, or higher where the solve's
    certificate raised it (``params.lower_bound``: ``feasibility.raise_bound_to``)."""
    return max(bound.best, int(p.params.get("lower_bound") or 0))


def bound_basis(bound, final: int | None = None) -> list[str]:
    """What the twin lower bound rests on, one line per part that holds; ``final``: the bound
    after the solve's certificate, when it raised it."""
    if bound is None:
        return ["no twin lower bound for this objective or pool (mixed or catalog GPU types)"]
    lines = [f"one-adapter cap: no GPU carries more than {bound.gpu_cap_tps:,.0f} tok/s unstarved "
             f"(its least-work server, measured with the verification seeds plus a spread margin)"
             f" -> at least {bound.one_adapter} GPU(s) for {bound.load_tps:,.0f} tok/s"]
    if bound.by_count > bound.one_adapter:
        lines.append(f"adapter-count cap: a GPU whose adapters offer at most "
                     f"{bound.max_adapter_tps:,.0f} tok/s each carries at most "
                     f"{bound.count_cap_tps:,.0f} tok/s -> at least {bound.by_count} GPU(s)")
    if bound.by_packing > max(bound.one_adapter, bound.by_count):
        lines.append(f"packing: the adapters' loads, each whole on one GPU of at most "
                     f"{bound.count_cap_tps:,.0f} tok/s, need at least {bound.by_packing} GPU(s) "
                     "(Martello-Toth L2: adapters above half that cap need a GPU each)")
    if bound.one_gpu_excluded:
        lines.append("one GPU holding every adapter starves at every max_loras (replayed)")
    if bound.fullest_excluded_to:
        lines.append(f"with up to {bound.fullest_excluded_to} GPUs the fullest one must swap "
                     "adapters and starves at every max_loras (replayed)")
    if bound.busiest_excluded_to:
        lines.append(f"with up to {bound.busiest_excluded_to} GPUs the busiest one starves at "
                     "every max_loras (replayed)")
    if bound.two_gpus_excluded:
        lines.append("no split over two GPUs is accepted (replayed)")
    best = bound.best if final is None else max(bound.best, final)
    if best > bound.best:
        lines.append(f"the placement's certificate: no placement with {best - 1} GPU(s) is "
                     "accepted (the exclusion checks run without their load thresholds, "
                     "replayed)")
    lines.append(f"bound: {best} GPU(s) (window {bound.duration_s:g} s)")
    return lines


def write_png(path: Path, p: Placement, curves: Sequence[GpuCurve], thr: float,
              bound, window_s: float, slo=None) -> None:
    """The report's figure: load against twin capacity per GPU; throughput / offered against
    ``max_loras`` for the drawn GPUs, the chosen point and the starvation line; the bound.
    Under a latency SLO (``slo``, a ``twin.slo.Slo``) a second row draws the drawn GPUs' p99
    TTFT (log) and p99 ITL against ``max_loras`` with the SLO's bounds."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    if slo is None:
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.8))
    else:
        fig, ((ax1, ax2), (ax3, ax4)) = plt.subplots(2, 2, figsize=(13, 9.6))
    gi = list(range(p.n_gpus))
    ax1.bar(gi, [c.capacity_tps for c in curves], color="#c6dbef", label="twin capacity")
    ax1.bar(gi, [c.offered_tps for c in curves], width=0.5, color="#2171b5",
            label="offered load")
    ax1.set_xlabel("GPU")
    ax1.set_ylabel("tok/s")
    ax1.set_title("load against twin capacity")
    ax1.set_xticks(gi if len(gi) <= 32 else gi[::max(1, len(gi) // 16)])
    ax1.legend(fontsize=8, loc="lower right")
    for c in curves:
        if not c.amaxes:
            continue
        line, = ax2.plot(c.amaxes, c.served_share, marker=".", label=f"GPU {c.gpu}")
        chosen = p.gpus[c.gpu].max_loras
        if chosen in c.amaxes:
            ax2.plot([chosen], [c.served_share[c.amaxes.index(chosen)]], "o", ms=10,
                     mfc="none", color=line.get_color())
    ax2.axhline(thr, color="crimson", ls="--", lw=1, label=f"starvation line ({thr:.0%})")
    ax2.set_xscale("log", base=2)
    ax2.set_xlabel("max_loras (Amax)")
    ax2.set_ylabel("twin throughput / offered load")
    ax2.set_title(f"throughput vs max_loras ({window_s:g} s window; circle = chosen)")
    ax2.legend(fontsize=8, loc="lower right", ncol=2)
    if slo is not None:
        _latency_panels(ax3, ax4, p, curves, slo, window_s)
    lb = (f"twin lower bound {final_bound(p, bound)} GPU(s)" if bound is not None
          else "no twin lower bound")
    fig.suptitle(f"{p.instance}: {p.n_gpus} GPU(s) by {p.method}, verdict "
                 f"{p.verdict or 'unverified'}; {lb}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _latency_panels(ax_ttft, ax_itl, p: Placement, curves: Sequence[GpuCurve], slo,
                    window_s: float) -> None:
    """p99 TTFT (log) and p99 ITL against ``max_loras`` for the drawn GPUs: the chosen point
    circled, a point with more than ``1 - attainment`` of its requests unserved as a triangle
    at the top, the SLO's bound as a dashed line, and each GPU's adapter count (to its left
    the GPU has more adapters than slots: the residency cliff) as a dotted line."""
    import math
    drawn = [c for c in curves if c.amaxes and c.p99_ttft_ms]
    for ax, key, name in ((ax_ttft, "p99_ttft_ms", "ttft_p99_ms"),
                          (ax_itl, "p99_itl_ms", "itl_p99_ms")):
        bound = getattr(slo, name)
        vals = [v for c in drawn for v in getattr(c, key) if math.isfinite(v) and v > 0]
        top = 3 * max(vals + ([bound] if bound else []), default=1000.0)
        lost = False
        for c in drawn:
            ys = getattr(c, key)
            ok = [(a, y) for a, y, e in zip(c.amaxes, ys, c.memory_error)
                  if not e and math.isfinite(y)]
            line, = ax.plot([a for a, _ in ok], [y for _, y in ok], marker=".",
                            label=f"GPU {c.gpu}")
            gone = [a for a, y, e in zip(c.amaxes, ys, c.memory_error) if not e and math.isinf(y)]
            if gone:
                lost = True
                ax.plot(gone, [top] * len(gone), "^", ms=5, color=line.get_color())
            chosen = p.gpus[c.gpu].max_loras
            if chosen in c.amaxes and math.isfinite(ys[c.amaxes.index(chosen)]):
                ax.plot([chosen], [ys[c.amaxes.index(chosen)]], "o", ms=10, mfc="none",
                        color=line.get_color())
            ax.axvline(p.gpus[c.gpu].n_adapters, color=line.get_color(), ls=":", lw=0.8)
        if bound:
            ax.axhline(bound, color="crimson", ls="--", lw=1, label=f"SLO {bound:g} ms")
        if lost:
            ax.plot([], [], "^", color="black",
                    label=f"> {100 * (1 - slo.attainment):g} % of requests unserved")
        ax.set_xscale("log", base=2)
        if key == "p99_ttft_ms":
            ax.set_yscale("log")
        elif vals:
            ax.set_ylim(0, top / 3 * 1.15)
        ax.set_xlabel("max_loras (Amax); dotted: the GPU's adapter count")
        ax.set_ylabel("ms")
        what = "p99 TTFT" if key == "p99_ttft_ms" else "p99 ITL"
        ax.set_title(f"{what} vs max_loras ({window_s:g} s window; circle = chosen)")
        ax.legend(fontsize=8, loc="best", ncol=2)


def _first_command(deploy_files: Sequence[str], out_dir: Path | None) -> str | None:
    """GPU 0's server command from its script, without comments (None when absent)."""
    first = next((f for f in deploy_files if f.endswith("/gpu-0.sh")), None)
    if out_dir is None or first is None:
        return None
    try:
        text = (out_dir / first).read_text(encoding="utf-8")
    except OSError:
        return None
    body = [x for x in text.splitlines() if x.strip() and not x.lstrip().startswith("#")]
    return "\n".join(body) or None


def _tuning_text(rec: dict | None) -> str:
    """How the GPUs' max_loras were chosen (``optim.amax_tuning``'s record), for the report."""
    if not rec:
        return "as the method packed them (not tuned by the twin)"
    if not rec.get("done"):
        return f"as the method packed them: {rec.get('why')}"
    changed = sum(1 for g in rec["gpus"] if g["after"] != g["before"])
    how = ("every value 1..adapters + 1 replayed" if rec.get("exhaustive")
           else "every value 1..adapters + 1, or the integer search on the largest GPUs")
    return (f"each GPU's best integer in the twin ({how} on the GPU's verification draw; "
            f"{changed} of {len(rec['gpus'])} changed from the packing)")


def report_markdown(inst: Instance, p: Placement, bound, curves: Sequence[GpuCurve],
                    deploy_files: Sequence[str], stages: dict[str, float],
                    out_dir: Path | None = None) -> str:
    """The one-page report (Markdown)."""
    thr = inst.starvation_threshold
    lines = [f"# Plan for {inst.name}", "",
             f"- adapters: {len(inst.adapters)}, offered load {inst.total_load_tps:,.0f} tok/s",
             f"- GPUs: **{p.n_gpus}** ({', '.join(f'{k} x{v}' for k, v in p.gpus_by_type().items())})"
             f" by `{p.method}`, objective `{p.objective}`",
             f"- twin verdict: **{p.verdict or 'unverified'}** over a "
             f"{p.verify_duration_s or inst.duration_s:g} s window (a GPU passes when it serves "
             f"at least {thr:.0%} of its offered tokens and starts without a memory error)",
             f"- claim: **{claim_text(p, bound)}**",
             f"- max_loras: {_tuning_text(p.params.get('amax_tuning'))}", "",
             "## GPUs", "",
             "| GPU | type | max_loras | max_lora_rank | adapters | offered tok/s | twin tok/s "
             "| twin capacity tok/s | load / capacity |",
             "|---|---|---|---|---|---|---|---|---|"]
    for g, (plan, c) in enumerate(zip(p.gpus, curves)):
        tw = f"{plan.verified.throughput_tps:,.0f}" if plan.verified else "-"
        lines.append(f"| {g} | {plan.gpu_type} | {plan.max_loras} | {plan.max_lora_rank} | "
                     f"{plan.n_adapters} | {plan.offered_tps:,.0f} | {tw} | "
                     f"{c.capacity_tps:,.0f} | {plan.offered_tps / max(c.capacity_tps, 1):.2f} |")
    lines += ["", "![plan](report.png)", "",
              "Left: each GPU's offered load against its twin capacity (the largest load, its "
              "adapters' rates scaled together, it carries unstarved at its max_loras). Right: twin throughput / offered "
              f"load against max_loras for the {min(CURVE_GPUS, p.n_gpus)} busiest GPUs, over a "
              f"{CURVE_WINDOW_S:g} s window with each GPU's verification seed; below the dashed "
              "line a GPU starves."
              + (" Bottom: their p99 TTFT (log scale) and p99 ITL against max_loras with the "
                 f"SLO's bounds ({inst.slo.describe()}; a triangle: more than "
                 f"{100 * (1 - inst.slo.attainment):g} % of the requests unserved); left of a "
                 "GPU's dotted line it has more adapters than slots, where the tail TTFT "
                 "collapses (the residency cliff)." if inst.slo is not None else ""), ""]
    if inst.slo is not None:
        lines += _latency_table(p, curves, inst.slo)
    lines += ["## Lower bound", ""]
    lines += [f"- {x}" for x in bound_basis(bound, final_bound(p, bound) if bound else None)]
    if p.notes or p.repairs:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in p.notes] + \
                 [f"- repair: {r}" for r in p.repairs]
    cmd = _first_command(deploy_files, out_dir)
    if cmd:
        first = next(f for f in deploy_files if f.endswith("/gpu-0.sh"))
        lines += ["", "## Deploy", "", "Each GPU runs one vLLM server; GPU 0's command "
                  f"(`{first}`; the others differ in device, port, adapters and flags):",
                  "", "```bash", cmd, "```"]
    lines += ["", "## Files", "",
              "- `placement.json`: the full placement record (per-GPU twin metrics, claim, bound)"]
    lines += [f"- `{f}`" for f in deploy_files]
    lines += ["", "## Timings", ""] + [f"- {k}: {v:.1f} s" for k, v in stages.items()]
    return "\n".join(lines) + "\n"


def _latency_table(p: Placement, curves: Sequence[GpuCurve], slo) -> list[str]:
    """report.md's section on the drawn GPUs' p99 latencies against ``max_loras``."""
    import math

    def ms(v: float) -> str:
        return "n/a" if math.isnan(v) else "unserved" if math.isinf(v) else f"{v:,.1f}"

    out = ["## Latency against max_loras", "",
           f"SLO: {slo.describe()}. Per drawn GPU, its p99 TTFT and p99 ITL (ms) at each "
           "max_loras of the curve (**bold**: the chosen one; `unserved`: the quantile falls on "
           "requests without a first token by the window's end).", ""]
    for c in curves:
        if not c.amaxes or not c.p99_ttft_ms:
            continue
        g = p.gpus[c.gpu]
        out += [f"GPU {c.gpu} ({g.n_adapters} adapters, chosen max_loras {g.max_loras}):", "",
                "| max_loras | served / offered | p99 TTFT ms | p99 ITL ms | accepted |",
                "|---|---|---|---|---|"]
        for a, sh, err, tt, it, ok in zip(c.amaxes, c.served_share, c.memory_error,
                                          c.p99_ttft_ms, c.p99_itl_ms, c.accepted):
            ax = f"**{a}**" if a == g.max_loras else str(a)
            if err:
                out.append(f"| {ax} | memory error | - | - | no |")
                continue
            out.append(f"| {ax} | {sh:.3f} | {ms(tt)} | {ms(it)} | {'yes' if ok else 'no'} |")
        out.append("")
    return out


# ----------------------------------------------------------------------------- the pipeline
def check_plan_dir(out: Path, force: bool) -> None:
    """Refuse a file, or a non-empty folder without ``force`` (nothing a user has is lost)."""
    if out.exists() and not out.is_dir():
        raise PlanError(f"--out {out}: is a file, not a folder")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise PlanError(f"--out {out}: folder exists and is not empty (pass --force to "
                        "overwrite the plan files in it)")


def _say(quiet: bool) -> Callable[[str], None]:
    def say(msg: str) -> None:
        if not quiet:
            print(msg, file=sys.stderr, flush=True)
    return say


def _bound_cached(inst: Instance, dur: float) -> bool:
    """True when every one-adapter limit the bound needs is already measured (cache or the
    shipped file), so the bound takes seconds, not minutes."""
    from .capacity import limit_is_cached
    from .feasibility import _bound_seeds, _type_rank
    inst = inst.bound_view()            # the SLO the bound measures its limits under
    for t in inst.gpu_types:
        r = _type_rank(inst, t)
        if r is not None and not limit_is_cached(t.load_profile(), r, 1, inst.lengths, dur,
                                                  _bound_seeds(inst), inst.starvation_threshold,
                                                  inst.slo):
            return False
    return True


def make_plan(inst: Instance, out: str | Path, method: str = "greedy", objective: str | None = None,
              time_limit_s: float | None = None, workers: int | None = None,
              force: bool = False, quiet: bool = False, deploy_opts=None,
              tune_amax: bool = True, inputs: PlanInputs | None = None) -> PlanResult:
    """Run the stages of the module docstring and write the plan folder ``out`` (``tune_amax``:
    each GPU's Amax its best integer in the twin, ``optim.amax_tuning``; ``inputs``: what
    ``inst`` was built from, recorded in ``placement.json``'s ``params.plan_inputs`` for
    ``optim replan NEW.csv``)."""
    from .deploy import DeployOptions, write_deployment
    from .feasibility import twin_lower_bound
    from .methods import MethodOptions, solve
    out = Path(out)
    check_plan_dir(out, force)
    say = _say(quiet)
    dur = float(inst.duration_s)
    stages: dict[str, float] = {}
    bound = None
    t0 = time.perf_counter()
    obj_name = objective or inst.objective.kind
    if obj_name == "gpus" and not inst.uses_configurations:
        if _bound_cached(inst, dur):
            say(f"[1/4] twin lower bound (limits cached for this profile, lengths model and "
                f"{dur:g} s window)")
        else:
            say(f"[1/4] measuring twin limits for this lengths model and {dur:g} s window, once "
                f"(then cached): ~{_limit_estimate_s(inst, dur):.0f} s")
            stale = stale_shipped_limits()
            if stale:
                say(f"      note: {stale}")
        bound = twin_lower_bound(inst, dur, workers)
        say(f"      at least {bound.best} GPU(s) ({time.perf_counter() - t0:.1f} s)")
    else:
        say("[1/4] no twin lower bound for this objective or pool (mixed or catalog types)")
    stages["lower bound"] = time.perf_counter() - t0
    t1 = time.perf_counter()
    say(f"[2/4] placing {len(inst.adapters)} adapters with {method}, verifying in the twin "
        f"({dur:g} s window)")
    import twin.fleet
    twin.fleet.show_progress = not quiet
    try:
        p = solve(inst, method, objective=objective,
                  options=MethodOptions(time_limit_s=time_limit_s,
                                        extra={} if tune_amax else {"tune_amax": False}),
                  verify=True, workers=workers)
    finally:
        twin.fleet.show_progress = False
    stages["placement and verification"] = time.perf_counter() - t1
    if p.status == "infeasible" or not p.gpus:
        raise PlanError(f"no placement: status {p.status}"
                        + (f"; {p.feasibility.summary()}" if p.feasibility is not None
                           and not p.feasibility.feasible else "")
                        + "".join(f"; {n}" for n in p.notes))
    say(f"      {p.n_gpus} GPU(s), twin verdict {p.verdict} "
        f"({time.perf_counter() - t1:.1f} s)")
    tuning = p.params.get("amax_tuning")
    if tuning:
        say("      max_loras: " + (
            f"each GPU's best integer in the twin ({tuning.get('wall_s', 0):.1f} s)"
            if tuning.get("done") else f"not tuned ({tuning.get('why')})"))
    t2 = time.perf_counter()
    say(f"[3/4] report curves: capacity of {p.n_gpus} GPU(s), max_loras curves of "
        f"{min(CURVE_GPUS, p.n_gpus)} ({CURVE_WINDOW_S:g} s windows)")
    curves = gpu_curves(inst, p, workers=workers)
    stages["report curves"] = time.perf_counter() - t2
    t3 = time.perf_counter()
    say(f"[4/4] writing {out}/")
    opts = deploy_opts if deploy_opts is not None else DeployOptions()
    out.mkdir(parents=True, exist_ok=True)
    record = json.loads(p.to_json())
    if inputs is not None:
        record["params"]["plan_inputs"] = inputs.to_dict()
    record["claim_text"] = claim_text(p, bound)
    record["twin_lower_bound"] = bound.to_dict() if bound is not None else None
    files = [out / "placement.json"]
    files[0].write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    if p.verdict == "rejected" and not opts.allow_rejected:
        say("      the twin rejected the placement: no deployment files (the report says which "
            "GPUs starve; --allow-rejected writes them, marked rejected)")
    else:
        files += write_deployment(p, out, opts, force=True)
    write_png(out / "report.png", p, curves, inst.starvation_threshold, bound, CURVE_WINDOW_S,
              inst.slo)
    stages["files"] = time.perf_counter() - t3
    deploy_rel = [str(f.relative_to(out)) for f in files[1:]]
    (out / "report.md").write_text(report_markdown(inst, p, bound, curves, deploy_rel, stages, out),
                                   encoding="utf-8")
    files += [out / "report.png", out / "report.md"]
    return PlanResult(inst, p, bound, tuple(curves), tuple(files), stages,
                      headroom=getattr(opts, "headroom", True))


def stale_shipped_limits() -> str | None:
    """A sentence when the shipped limits were measured on another twin (their fingerprints
    differ from the current twin's), else None."""
    from .shipped_limits import read_meta, shipped_fingerprints
    have = read_meta().get("twin_fingerprints", {})
    now = shipped_fingerprints()
    if have == now:
        return None
    return ("the shipped limits (optim/data/carry_limits.json) predate this twin "
            f"(fingerprints {have or 'not recorded'} vs {now}); regenerate them with "
            "python -m optim.shipped_limits")


def _limit_estimate_s(inst: Instance, dur: float) -> float:
    """Rough wall time of the one-adapter limits still to measure: 8 bisection rounds of 16
    replays (8 seeds x Amax 1, 2), each about 0.4 s per simulated hour on one core of the
    2-core reference machine, spread over the cores."""
    import os
    profiles = {t.profile for t in inst.gpu_types}
    return len(profiles) * 8 * 16 * 0.4 * dur / 3600.0 / max(1, os.cpu_count() or 1)


def summary_lines(res: PlanResult, out: Path) -> list[str]:
    """The few lines ``optim plan`` prints on stdout."""
    p = res.placement
    lines = [f"plan: {p.n_gpus} GPU(s) for {len(res.instance.adapters)} adapters "
             f"({res.instance.total_load_tps:,.0f} tok/s), twin verdict {p.verdict}",
             f"claim: {res.claim}"]
    for g, plan in enumerate(p.gpus[:8]):
        tw = plan.verified.throughput_tps if plan.verified else float("nan")
        lines.append(f"  gpu {g} {plan.gpu_type}: {plan.n_adapters} adapters, --max-loras "
                     f"{plan.max_loras} --max-lora-rank {plan.max_lora_rank}, offered "
                     f"{plan.offered_tps:,.0f} tok/s, twin {tw:,.0f} tok/s")
    if p.n_gpus > 8:
        lines.append(f"  ... {p.n_gpus - 8} more in {out / 'report.md'}")
    if res.headroom and p.verdict is not None:                   # twin.headroom
        lines += p.headroom_lines().strip("\n").split("\n")
    lines.append(f"files: {out}/ (report.md, report.png, placement.json, servers/, "
                 "routing.csv, manifests)")
    return lines
