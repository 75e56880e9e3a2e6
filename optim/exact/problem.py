"""The packing problem both exact models read, in integer units, and GPU-level evaluation.

Decisions (the same in the MILP and the CP-SAT model):

* ``x[i,g]`` — adapter ``i`` is served by GPU slot ``g`` (every adapter by exactly one GPU);
* ``y[g]``   — GPU slot ``g`` is used;
* ``z[g,p]`` — GPU ``g`` takes configuration ``p`` of its type. A configuration is one piece of
  the capacity model: a max-rank class ``r_p`` (``max_lora_rank``), an Amax ``A_p`` from the grid
  (``max_loras``), an interval ``[xlo_p, xhi_p]`` (inclusive, integer units) of the piece feature
  ``x_g = sum_i phi_i x[i,g]`` (default: the adapter count), a load interval
  ``[llo_p, cap_p]`` (integer load units; ``llo_p = 0`` except for latency sub-pieces) and, for
  the latency objective, a predicted mean ITL ``itl_p``.

**Replication** (``max_homes`` k > 1). An adapter may be split over up to k GPUs with routing
weights: ``x[i,g]`` then says GPU ``g`` is a *home* of adapter ``i`` (it holds the adapter) and a
share ``s[i,g]`` in [0, 1] (the issue's ``y[a,g]``; ``y[g]`` already means a used GPU) of its
traffic goes there: ``s[i,g] <= x[i,g]``, ``sum_g s[i,g] = 1``, ``sum_g x[i,g] <= k``. A GPU's
load is ``sum_i w_i s[i,g]``; its piece feature still counts every home with the adapter's full
value ``phi_i`` (the default feature ``busy30`` = sum_i (1 - exp(-30 s x rate_i)) is increasing
in the rate, so a home's true value is at most ``phi_i``, and the capacity pieces are
non-increasing in the feature: conservative); its rank class covers every home. With k = 1 this
is the model above (``s = x``); for k > 1 it is a relaxation of it, so its optimum is that of
the *split* problem (at most k homes per adapter), and bounds that assume unsplittable adapters
(Martello–Toth L2, the arc-flow model) do not apply to it.

Only configurations that can ever be feasible are listed: pieces with ``cap_load = 0``, memory
errors, and (Amax, rank) pairs without a KV-capacity entry in the profile are dropped when the
problem is built (``capacity.configs_for_type``), so the memory table is enforced by the
configuration list itself.

**Integer units.** Loads are ``ceil(load_tps * LOAD_SCALE)`` and capacities
``floor(cap_load * LOAD_SCALE)`` (``LOAD_SCALE = 1000``: milli-tokens/s), so both solvers and the
brute force work on the same integers and round conservatively (a GPU they call feasible is
feasible for the real-valued surrogate). Non-integer piece features are scaled by ``X_SCALE``
likewise; the piece interval ``[x_lo, x_hi)`` becomes ``[ceil(x_lo*s), ceil(x_hi*s) - 1]``.

**Cuts.** A ``Cut`` (from the twin loop) forbids a set ``S`` of adapters on any GPU of one type
configured with (rank ``r``, Amax ``A``): exactly ``S`` (``superset=False``) or any superset of
``S`` (``superset=True``, valid when adding adapters never makes a GPU easier to serve).

**Capacity cuts.** A ``CapacityCut`` (the twin loop's default) tightens the surrogate instead:
the twin saw a GPU of type ``t`` configured with (``r``, ``A``) starve with feature value ``x*``
at offered load ``L*``, serving only ``T*``. Within a piece the capacity model states that
feasibility depends on the load alone (feasible iff load <= cap), and its caps are
non-increasing in ``x``; a GPU that saturates at ``T*`` starves at every load above
``T*/theta`` (theta: the starvation threshold). So every configuration of ``t`` with
(``r``, ``A``) whose interval reaches ``x*`` (the piece holding ``x*`` and those above) gets

    cap_p <- min(cap_p, L_cut - 1),   L_cut = min(L*, T*/theta)

This forbids the starving set, its supersets and every set at least ``L_cut`` heavy on those
pieces: the surrogate's threshold corrected by twin evidence, in the surrogate's own structure.
Cutting just below ``L*`` alone would shave a few tok/s per re-solve.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field, replace
from typing import Sequence

LOAD_SCALE = 1000          # load units per tok/s
X_SCALE = 1_000_000        # units per unit of a non-integer piece feature
OBJECTIVES = ("gpus", "cost", "latency")


@dataclass(frozen=True)
class Config:
    """One configuration (capacity-model piece) a GPU of a type may take (see module doc)."""

    rank: int
    amax: int
    x_lo: int
    x_hi: int
    cap: int
    load_lo: int = 0
    itl_ms: float | None = None
    label: str = ""

    def admits(self, load: int, x: int, max_rank: int) -> bool:
        return (max_rank <= self.rank and self.x_lo <= x <= self.x_hi
                and self.load_lo <= load <= self.cap)


@dataclass(frozen=True)
class TypeSpec:
    """A GPU type of the pool: name, profile, how many slots, price, and its configurations.
    ``source`` says where the configurations came from (``surrogate:<path>``, ``provisional``,
    ``constant``, ``custom``)."""

    name: str
    profile: str
    count: int
    price: float
    configs: tuple[Config, ...]
    source: str = "custom"


@dataclass(frozen=True)
class Cut:
    """Forbid adapter set ``adapters`` (indices) on GPUs of type ``type_index`` configured with
    (``rank``, ``amax``); ``superset=True`` forbids every superset too."""

    type_index: int
    rank: int
    amax: int
    adapters: frozenset[int]
    superset: bool = False

    def forbids(self, type_index: int, cfg: Config, items: Sequence[int]) -> bool:
        if type_index != self.type_index or cfg.rank != self.rank or cfg.amax != self.amax:
            return False
        s = set(items)
        return self.adapters <= s if self.superset else self.adapters == s


@dataclass(frozen=True)
class CapacityCut:
    """Twin evidence that type ``type_index`` with (``rank``, ``amax``) cannot carry integer load
    ``load`` (``L_cut``) or more from feature value ``x`` on (module docstring)."""

    type_index: int
    rank: int
    amax: int
    x: int
    load: int

    def apply(self, configs: Sequence[Config]) -> tuple[Config, ...]:
        """The configurations of the cut's type after tightening (order kept; emptied pieces
        dropped)."""
        out: list[Config] = []
        cap = self.load - 1
        for c in configs:
            if c.rank != self.rank or c.amax != self.amax or c.x_hi < self.x or c.cap <= cap:
                out.append(c)
            elif cap >= c.load_lo:
                out.append(replace(c, cap=cap))
        return tuple(out)


@dataclass(frozen=True)
class PackingProblem:
    """Adapters (ids, ranks, integer loads, integer piece-feature values), GPU types and slots,
    objective, cuts. ``slots[g]`` is the type index of GPU slot ``g``; slots of one type are
    contiguous. ``load_tps`` keeps the real-valued loads for reports. ``gpu_lower_bound`` is a
    proven lower bound on the GPU count that the models add as a (redundant) constraint."""

    name: str
    ids: tuple[str, ...]
    ranks: tuple[int, ...]
    loads: tuple[int, ...]
    xs: tuple[int, ...]
    types: tuple[TypeSpec, ...]
    objective: str = "gpus"
    gpu_budget: int | None = None
    x_feature: str = "n"
    load_tps: tuple[float, ...] = ()
    cuts: tuple[Cut, ...] = ()
    max_slots: dict[int, int] | None = None
    notes: tuple[str, ...] = field(default=())
    gpu_lower_bound: int = 0
    max_homes: int = 1

    def __post_init__(self) -> None:
        n = len(self.ids)
        if not isinstance(self.max_homes, int) or self.max_homes < 1:
            raise ValueError(f"problem '{self.name}': field 'max_homes' must be an integer "
                             f">= 1, got {self.max_homes!r}")
        for nm in ("ranks", "loads", "xs"):
            if len(getattr(self, nm)) != n:
                raise ValueError(f"problem '{self.name}': field '{nm}' needs {n} values, "
                                 f"got {len(getattr(self, nm))}")
        if n == 0:
            raise ValueError(f"problem '{self.name}': field 'ids': no adapters")
        if self.objective not in OBJECTIVES:
            raise ValueError(f"problem '{self.name}': field 'objective' must be one of "
                             f"{OBJECTIVES}, got {self.objective!r}")
        if self.objective == "latency" and self.gpu_budget is None:
            raise ValueError(f"problem '{self.name}': field 'gpu_budget' is required by "
                             "the latency objective")
        if any(v < 0 for v in self.loads):
            raise ValueError(f"problem '{self.name}': field 'loads' must be >= 0")
        if self.max_homes > 1 and any(v <= 0 for v in self.loads):
            raise ValueError(f"problem '{self.name}': field 'loads' must be > 0 with "
                             "max_homes > 1 (shares are fractions of the load)")
        for t in self.types:
            if t.count < 0:
                raise ValueError(f"problem '{self.name}': type '{t.name}': field 'count' "
                                 f"must be >= 0, got {t.count}")

    # ------------------------------------------------------------------ structure
    @property
    def n(self) -> int:
        return len(self.ids)

    @property
    def splits(self) -> bool:
        """True when adapters may be split over several GPUs (``max_homes`` > 1)."""
        return self.max_homes > 1

    @property
    def slots(self) -> tuple[int, ...]:
        """Type index of every GPU slot (``max_slots`` may cap a type below its count)."""
        out: list[int] = []
        for k, t in enumerate(self.types):
            c = t.count if self.max_slots is None else min(t.count, self.max_slots.get(k, t.count))
            out += [k] * c
        return tuple(out)

    def identical_groups(self) -> list[list[int]]:
        """Groups (size >= 2) of adapters with equal rank, load and feature value, in index
        order: interchangeable in every constraint, so their GPU indices may be ordered."""
        groups: dict[tuple, list[int]] = {}
        for i in range(self.n):
            groups.setdefault((self.ranks[i], self.loads[i], self.xs[i]), []).append(i)
        return [g for g in groups.values() if len(g) > 1]

    def with_cuts(self, cuts: Sequence[Cut]) -> "PackingProblem":
        return replace(self, cuts=self.cuts + tuple(cuts))

    def with_capacity_cuts(self, cuts: Sequence[CapacityCut]) -> "PackingProblem":
        """The problem with its configurations tightened by ``cuts`` (module docstring)."""
        types = list(self.types)
        for cut in cuts:
            t = types[cut.type_index]
            types[cut.type_index] = replace(t, configs=cut.apply(t.configs))
        return replace(self, types=tuple(types))

    def with_objective(self, objective: str, gpu_budget: int | None = None) -> "PackingProblem":
        return replace(self, objective=objective,
                       gpu_budget=gpu_budget if gpu_budget is not None else self.gpu_budget)

    def slot_weight(self, g_type: int) -> float:
        """Objective coefficient of using one GPU of a type (gpus: 1, cost: price)."""
        return self.types[g_type].price if self.objective == "cost" else 1.0

    # ------------------------------------------------------------------ evaluation
    def configs_admitting(self, type_index: int, items: Sequence[int]) -> list[int]:
        """Indices of the type's configurations under which this adapter set is feasible
        (respecting cuts)."""
        if not items:
            return []
        load = sum(self.loads[i] for i in items)
        x = sum(self.xs[i] for i in items)
        mr = max(self.ranks[i] for i in items)
        out = []
        for p, c in enumerate(self.types[type_index].configs):
            if c.admits(load, x, mr) and not any(cut.forbids(type_index, c, items)
                                                 for cut in self.cuts):
                out.append(p)
        return out

    def configs_admitting_split(self, type_index: int, items: Sequence[int], load: int
                                ) -> list[int]:
        """Configurations admitting a GPU that homes ``items`` and carries integer ``load``
        (the shares' load; replication mode, where adapter-set cuts are not used)."""
        if not items:
            return []
        x = sum(self.xs[i] for i in items)
        mr = max(self.ranks[i] for i in items)
        return [p for p, c in enumerate(self.types[type_index].configs)
                if c.admits(load, x, mr)]

    def split_load(self, items: Sequence[int], shares: Sequence[float]) -> int:
        """Integer load of a GPU carrying ``shares`` of ``items`` (shares from a solution are
        integer flows / w_i, so rounding recovers the flow)."""
        return int(round(sum(self.loads[i] * s for i, s in zip(items, shares))))

    def check_split_solution(self, gpus: Sequence[tuple[int, int, Sequence[int]]],
                             shares: Sequence[Sequence[float]], tol: float = 1e-6
                             ) -> list[str]:
        """Problems with a replication-mode solution (``shares[k]`` aligned with the items of
        GPU ``k``): every share in [0, 1] (0: a home without traffic, which the model allows),
        shares summing to 1 per adapter, at most
        ``max_homes`` homes, configurations admitting each GPU's homes and load (within
        ``tol`` relative, for an LP solver's tolerance), type counts."""
        problems = []
        total = [0.0] * self.n
        homes = [0] * self.n
        per_type: dict[int, int] = {}
        for (t, p, items), sh in zip(gpus, shares):
            per_type[t] = per_type.get(t, 0) + 1
            if len(set(items)) != len(items):
                problems.append(f"type {self.types[t].name}: an adapter twice on one GPU")
            for i, s in zip(items, sh):
                if not 0.0 <= s <= 1.0 + tol:
                    problems.append(f"adapter {self.ids[i]}: share {s} outside [0, 1]")
                total[i] += s
                homes[i] += 1
            load = sum(self.loads[i] * s for i, s in zip(items, sh))
            c = self.types[t].configs[p]
            x = sum(self.xs[i] for i in items)
            mr = max(self.ranks[i] for i in items)
            slack = tol * max(1.0, c.cap)
            if not (mr <= c.rank and c.x_lo <= x <= c.x_hi
                    and c.load_lo - slack <= load <= c.cap + slack):
                problems.append(f"type {self.types[t].name} config {p} does not admit "
                                f"{list(items)} at load {load:.1f}")
        for i in range(self.n):
            if abs(total[i] - 1.0) > tol:
                problems.append(f"adapter {self.ids[i]}: shares sum to {total[i]:.6f}")
            if homes[i] > self.max_homes:
                problems.append(f"adapter {self.ids[i]}: {homes[i]} homes > {self.max_homes}")
        for t, c in per_type.items():
            if c > self.types[t].count:
                problems.append(f"type {self.types[t].name}: {c} GPUs > {self.types[t].count}")
        return problems

    def gpu_cost(self, type_index: int, items: Sequence[int]) -> tuple[float, int] | None:
        """(objective contribution, best configuration index) of one GPU with these adapters,
        ``None`` when no configuration admits them. Contribution: gpus 1, cost price,
        latency ``itl_p * load`` (load units; divide the sum by the total load)."""
        ps = self.configs_admitting(type_index, items)
        if not ps:
            return None
        t = self.types[type_index]
        if self.objective == "latency":
            load = sum(self.loads[i] for i in items)
            best = min(ps, key=lambda p: (t.configs[p].itl_ms if t.configs[p].itl_ms is not None
                                          else math.inf, p))
            itl = t.configs[best].itl_ms
            return (math.inf if itl is None else itl * load), best
        return self.slot_weight(type_index), ps[0]

    @property
    def total_load(self) -> int:
        return sum(self.loads)

    def objective_value(self, gpus: Sequence[tuple[int, int, Sequence[int]]]) -> float:
        """Objective of a solution given as ``(type_index, config_index, adapters)`` per used
        GPU: GPU count, Σ price, or load-weighted mean ITL (ms)."""
        if self.objective == "gpus":
            return float(len(gpus))
        if self.objective == "cost":
            return float(sum(self.types[t].price for t, _, _ in gpus))
        num = sum((self.types[t].configs[p].itl_ms or math.inf)
                  * sum(self.loads[i] for i in items) for t, p, items in gpus)
        return num / max(self.total_load, 1)

    def check_solution(self, gpus: Sequence[tuple[int, int, Sequence[int]]]) -> list[str]:
        """Problems with a solution (empty when it satisfies every constraint of the model)."""
        problems = []
        seen: list[int] = []
        per_type: dict[int, int] = {}
        for t, p, items in gpus:
            seen += list(items)
            per_type[t] = per_type.get(t, 0) + 1
            if p not in self.configs_admitting(t, items):
                problems.append(f"type {self.types[t].name} config {p} does not admit {items}")
        if sorted(seen) != list(range(self.n)):
            problems.append("adapters not covered exactly once")
        for t, c in per_type.items():
            if c > self.types[t].count:
                problems.append(f"type {self.types[t].name}: {c} GPUs > {self.types[t].count}")
        if self.gpu_budget is not None and self.objective == "latency" and len(gpus) > self.gpu_budget:
            problems.append(f"{len(gpus)} GPUs exceed the budget {self.gpu_budget}")
        return problems


def _near_integer(v: float) -> int | None:
    """``round(v)`` when ``v`` is an integer up to floating-point noise (1e-9 relative: a rate
    given as ``load / mean_tokens`` comes back as ``load`` only up to rounding), else None."""
    r = round(v)
    return int(r) if abs(v - r) <= 1e-9 * max(1.0, abs(v)) else None


def scale_load(load_tps: float) -> int:
    """Load in integer units, rounded up (conservative)."""
    v = load_tps * LOAD_SCALE
    near = _near_integer(v)
    return near if near is not None else int(math.ceil(v))


def scale_cap(cap_tps: float) -> int:
    """Capacity in integer units, rounded down (conservative)."""
    if not math.isfinite(cap_tps):
        return 2**53
    v = cap_tps * LOAD_SCALE
    near = _near_integer(v)
    return near if near is not None else int(math.floor(v))


def scale_interval(lo: float, hi: float, integral: bool) -> tuple[int, int]:
    """Half-open feature interval ``[lo, hi)`` as an inclusive integer interval."""
    if integral:
        lo_u = int(math.ceil(lo - 1e-9))
        hi_u = (int(math.ceil(hi - 1e-9)) - 1) if math.isfinite(hi) else 2**40
        return lo_u, hi_u
    lo_u = int(math.ceil(lo * X_SCALE - 1e-9))
    hi_u = (int(math.ceil(hi * X_SCALE - 1e-9)) - 1) if math.isfinite(hi) else 2**53
    return lo_u, hi_u


def iter_partitions(items: Sequence[int], max_blocks: int):
    """Set partitions of ``items`` into at most ``max_blocks`` blocks (restricted growth)."""
    items = list(items)
    if not items:
        yield []
        return

    def rec(k: int, blocks: list[list[int]]):
        if k == len(items):
            yield [list(b) for b in blocks]
            return
        for b in blocks:
            b.append(items[k])
            yield from rec(k + 1, blocks)
            b.pop()
        if len(blocks) < max_blocks:
            blocks.append([items[k]])
            yield from rec(k + 1, blocks)
            blocks.pop()

    yield from rec(0, [])


def type_assignments(n_blocks: int, counts: Sequence[int]):
    """Every assignment of ``n_blocks`` blocks to types with at most ``counts[t]`` per type."""
    for combo in itertools.product(range(len(counts)), repeat=n_blocks):
        ok = all(combo.count(t) <= c for t, c in enumerate(counts))
        if ok:
            yield combo
