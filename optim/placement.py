"""The result of a placement method: per-GPU plans, status, metrics, and its output forms.

A ``Placement`` lists one ``GpuPlan`` per GPU (GPU type, profile, Amax, max rank, adapters with
routing shares) and carries how it was obtained (method, status, wall time, parameters), what
the method predicted for each GPU, what the twin measured (after ``optim.verify``), and the
changes a repair loop made. Output forms: ``to_json()`` (full record, round-trips through
``Placement.from_dict``), ``table()`` (per-GPU text table + summary) and ``vllm_args()`` (the
vLLM server arguments of every GPU).

Status values: ``solved`` (the method returned a placement it believes feasible), ``optimal``
(proven optimum, exact methods), ``over_pool`` (placement needs more GPUs of a type than the
pool has), ``failed`` (the method found no placement), ``infeasible`` (the pre-checks proved the
instance cannot be served). ``verdict`` is the twin's: ``accepted``, ``rejected`` or ``None``
(not verified).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Iterable, Sequence

from twin.fleet import GpuAssignment
from twin.identifiers import clean_identifier
from twin.metrics import RunMetrics
from twin.server import Judging, ServerConfig
from twin.workload import Adapter

from .feasibility_report import FeasibilityReport, Reason

STATUSES = ("solved", "optimal", "over_pool", "failed", "infeasible")


def claim_qualifier(params: dict) -> str:
    """What a claim is judged under, appended to it: the SLO, and the twin's measured headroom
    when the GPUs were judged with it (the bound is the plain verdict's, which accepts more, so
    the claim holds under the stricter verdict too)."""
    out = f" under SLO {params['slo']}" if params.get("slo") else ""
    if params.get("headroom"):
        out += " with its measured headroom"
    return out


@dataclass(frozen=True)
class GpuMetrics:
    """Metrics of one GPU: predicted by a method or measured by the twin."""

    offered_tps: float
    throughput_tps: float
    starved: bool
    memory_error: bool
    mean_itl_ms: float | None = None
    mean_ttft_ms: float | None = None
    avg_power_w: float | None = None
    # the GPU judged against the instance's latency SLO (twin.slo.SloResult.to_dict(): observed
    # values, met flags, share of requests within each bound, goodput); None: no SLO
    slo: dict | None = None
    # --- headroom (twin.headroom): the twin's realised offered load, which the verdict judges
    # against (None: a prediction, or a plan written before it was recorded -> offered_tps)
    offered_realised_tps: float | None = None
    # the GPU judged with the twin's measured headroom (an instance with ``headroom``:
    # ``RunMetrics.headroom``: h, regime, ok); None: judged by the plain verdict
    headroom: dict | None = None

    @classmethod
    def from_run(cls, m: RunMetrics) -> "GpuMetrics":
        def num(x: float) -> float | None:
            return None if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)
        return cls(float(m.offered_tps), float(m.throughput_tps), bool(m.starved),
                   bool(m.memory_error), num(m.mean_itl_ms), num(m.mean_ttft_ms),
                   num(getattr(m, "avg_power_w", None)), getattr(m, "slo", None),
                   num(getattr(m, "offered_realised_tps", None)), getattr(m, "headroom", None))

    @property
    def slo_met(self) -> bool:
        return self.slo is None or bool(self.slo.get("ok", False))

    @property
    def ok(self) -> bool:
        return not (self.starved or self.memory_error) and self.slo_met and (
            self.headroom is None or bool(self.headroom.get("ok", False)))


@dataclass(frozen=True)
class GpuPlan:
    """One GPU: its type (instance name) and profile, server configuration (Amax = ``max_loras``,
    ``max_lora_rank``), the (adapter, routing share) pairs it serves, and metrics."""

    gpu_type: str
    profile: str
    max_loras: int
    max_lora_rank: int
    adapters: tuple[tuple[Adapter, float], ...]
    offered_tps: float
    predicted: GpuMetrics | None = None
    verified: GpuMetrics | None = None
    power_cap_w: float | None = None

    @property
    def n_adapters(self) -> int:
        return len(self.adapters)

    def server_config(self, judging: Judging = Judging()) -> ServerConfig:
        """The twin's server configuration, judged by ``judging`` (the instance's:
        ``Instance.judging``)."""
        return judging.server_config(self.max_loras, self.max_lora_rank, self.power_cap_w)

    def twin_assignment(self, judging: Judging = Judging()) -> GpuAssignment:
        """This GPU as a job of the fleet twin (``twin.fleet.simulate_fleet``), its adapters in
        id order: the twin draws adapter ``i``'s requests from child ``i`` of the GPU's seed, so
        the order fixes the draw, and a GPU is a set of adapters — listing them in another order
        must not change the verdict (``feasibility.one_gpu_excluded`` relies on it)."""
        return GpuAssignment(self.profile, self.server_config(judging),
                             tuple(sorted(self.adapters, key=lambda p: p[0].id)))

    # --- headroom (twin.headroom) ---------------------------------------------------------
    def headroom_verdict(self, starvation_threshold: float = 0.9):
        """(accepted with the twin's measured headroom, the ``twin.headroom.Headroom`` used) of
        the verified GPU; None when it was not verified. The plain verdict is ``verified.ok``."""
        from twin.headroom import headroom_for, passes_with_headroom
        v = self.verified
        if v is None:
            return None
        offered = v.offered_realised_tps if v.offered_realised_tps is not None else v.offered_tps
        hr = headroom_for(self.profile, self.max_loras, self.n_adapters, v.throughput_tps,
                          offered)
        if v.headroom is not None:          # the twin judged it so already (Instance.headroom)
            return v.ok, hr
        ok = v.ok and (hr.h == 0 or passes_with_headroom(v.throughput_tps, offered, hr.h,
                                                          starvation_threshold))
        return ok, hr

    def to_dict(self) -> dict[str, Any]:
        return {
            "gpu_type": self.gpu_type, "profile": self.profile, "max_loras": self.max_loras,
            "max_lora_rank": self.max_lora_rank, "n_adapters": self.n_adapters,
            "offered_tps": self.offered_tps,
            "adapters": [{"id": a.id, "rank": a.rank, "rate": a.rate, "share": s}
                         for a, s in self.adapters],
            "predicted": asdict(self.predicted) if self.predicted else None,
            "verified": asdict(self.verified) if self.verified else None,
            **({"power_cap_w": self.power_cap_w} if self.power_cap_w is not None else {}),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "gpu") -> "GpuPlan":
        """A GPU of a plan file; names and adapter ids are NFC-normalised and refused with
        control or format characters (``twin.identifiers``), naming ``where`` and the field
        (an id listed twice on one GPU, also after normalisation, is left to the plan checks
        of its reader, e.g. ``optim.deploy.check_plan``)."""
        adapters = tuple((Adapter(clean_identifier(x["id"], f"{where}.adapters[{j}].id",
                                                   what="adapter id"), x["rank"], x["rate"]),
                          float(x["share"])) for j, x in enumerate(d["adapters"]))
        return cls(clean_identifier(d["gpu_type"], f"{where}.gpu_type", what="GPU type name"),
                   clean_identifier(d["profile"], f"{where}.profile", what="profile name"),
                   int(d["max_loras"]), int(d["max_lora_rank"]), adapters,
                   float(d["offered_tps"]),
                   GpuMetrics(**d["predicted"]) if d.get("predicted") else None,
                   GpuMetrics(**d["verified"]) if d.get("verified") else None,
                   d.get("power_cap_w"))


@dataclass(frozen=True)
class Placement:
    """A method's answer for one instance (see the module docstring for status and verdict)."""

    instance: str
    method: str
    status: str
    gpus: tuple[GpuPlan, ...] = ()
    wall_time_s: float = 0.0
    objective: str = "gpus"
    objective_value: float | None = None
    best_bound: float | None = None
    verdict: str | None = None
    verify_wall_s: float | None = None
    verify_duration_s: float | None = None
    repairs: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    params: dict[str, Any] = field(default_factory=dict)
    feasibility: FeasibilityReport | None = None

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"placement status must be one of {STATUSES}, got {self.status!r}")
        if self.verdict not in (None, "accepted", "rejected"):
            raise ValueError(f"placement verdict must be accepted/rejected/None, got {self.verdict!r}")

    # ------------------------------------------------------------------ queries
    @property
    def n_gpus(self) -> int:
        return len(self.gpus)

    @property
    def has_placement(self) -> bool:
        return bool(self.gpus)

    @property
    def feasible(self) -> bool | None:
        """Twin verdict when verified, else the method's own belief."""
        if self.verdict is not None:
            return self.verdict == "accepted" and self.status in ("solved", "optimal")
        return self.status in ("solved", "optimal")

    def gpus_by_type(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for g in self.gpus:
            out[g.gpu_type] = out.get(g.gpu_type, 0) + 1
        return out

    def with_(self, **changes: Any) -> "Placement":
        return replace(self, **changes)

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict[str, Any]:
        starved = [i for i, g in enumerate(self.gpus) if g.verified and not g.verified.ok]
        return {
            "instance": self.instance, "method": self.method, "status": self.status,
            "verdict": self.verdict, "objective": self.objective,
            "objective_value": self.objective_value, "best_bound": self.best_bound,
            "gpus_used": self.n_gpus, "gpus_by_type": self.gpus_by_type(),
            "wall_time_s": self.wall_time_s, "verify_wall_s": self.verify_wall_s,
            "verify_duration_s": self.verify_duration_s,
            "failed_gpus": starved, "repairs": list(self.repairs), "notes": list(self.notes),
            "params": self.params,
            "feasibility": self.feasibility.to_dict() if self.feasibility else None,
            "gpus": [g.to_dict() for g in self.gpus],
        }

    def to_json(self, indent: int | None = 1) -> str:
        return json.dumps(self.to_dict(), indent=indent, default=_json_default)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Placement":
        fe = d.get("feasibility")
        report = None
        if fe:
            report = FeasibilityReport(fe["instance"], tuple(Reason(r["code"], r["message"],
                                                                    tuple(r["items"]))
                                                             for r in fe["reasons"]),
                                       dict(fe["capacity_tps"]), int(fe["gpu_lower_bound"]))
        return cls(clean_identifier(d["instance"], "instance", what="instance name"),
                   d["method"], d["status"],
                   tuple(GpuPlan.from_dict(g, f"gpus[{i}]") for i, g in enumerate(d["gpus"])),
                   float(d["wall_time_s"]),
                   d["objective"], d.get("objective_value"), d.get("best_bound"), d.get("verdict"),
                   d.get("verify_wall_s"), d.get("verify_duration_s"), tuple(d.get("repairs", ())),
                   tuple(d.get("notes", ())), dict(d.get("params", {})), report)

    # ------------------------------------------------------------------ text table
    def table(self, max_ids: int = 0) -> str:
        """Per-GPU table (type, Amax, max rank, adapters, offered, predicted and twin throughput,
        starvation) followed by a summary line."""
        head = (f"{'gpu':>4} {'type':<12} {'Amax':>5} {'rank':>4} {'adapt':>6} {'offered':>9} "
                f"{'pred_tps':>9} {'twin_tps':>9} {'pred':>6} {'twin':>7}")
        bounds = list(self.params.get("slo_bounds") or ())
        head += "".join(f" {_slo_head(b):>13}" for b in bounds)
        per_request = any(b.rpartition(":")[2] in ("ttft_p99_ms", "e2e_p99_ms") for b in bounds)
        if per_request:
            head += f" {'worst adapter':>13}"
        lines = [head, "-" * len(head)]
        for i, g in enumerate(self.gpus):
            p, v = g.predicted, g.verified
            obs = (v.slo or {}).get("observed", {}) if v else {}
            lines.append(
                f"{i:>4} {g.gpu_type[:12]:<12} {g.max_loras:>5} {g.max_lora_rank:>4} "
                f"{g.n_adapters:>6} {g.offered_tps:>9.0f} "
                f"{(f'{p.throughput_tps:.0f}' if p else '-'):>9} "
                f"{(f'{v.throughput_tps:.0f}' if v else '-'):>9} "
                f"{_flag(p):>6} {_flag(v):>7}"
                + "".join(f" {_ms(obs.get(b)):>13}" for b in bounds)
                + (f" {_worst_adapter(v):>13}" if per_request else ""))
            if max_ids:
                ids = [a.id + ("" if s >= 1 - 1e-9 else f"({s:.2f})") for a, s in g.adapters]
                lines.append("       " + " ".join(ids[:max_ids])
                             + (f" … (+{len(ids) - max_ids})" if len(ids) > max_ids else ""))
        lines.append(self.summary())
        return "\n".join(lines)

    def summary(self) -> str:
        parts = [f"instance={self.instance}", f"method={self.method}", f"status={self.status}",
                 f"gpus={self.n_gpus}"]
        if self.objective_value is not None:
            parts.append(f"objective[{self.objective}]={self.objective_value:.4g}")
        parts.append(f"verdict={self.verdict or 'unverified'}")
        parts.append(f"wall={self.wall_time_s:.3f}s")
        if self.verify_wall_s is not None:
            parts.append(f"verify_wall={self.verify_wall_s:.1f}s")
        if self.verdict is not None:
            bad = sum(1 for g in self.gpus if g.verified and not g.verified.ok)
            parts.append(f"twin_failed_gpus={bad}")
        if self.best_bound is not None and self.gpus:
            parts.append(f"best_bound={self.best_bound:g}")
            gap = self.params.get("gap")
            if gap is not None:
                parts.append(f"gap={100 * gap:.1f}%")
        lb = self.params.get("lower_bound")
        if lb is not None:
            parts.append(f"twin_lower_bound={lb}")
        out = " ".join(parts)
        out += self.headroom_lines()                                     # twin.headroom
        under = claim_qualifier(self.params)
        if lb is not None and self.verdict == "accepted" and self.n_gpus == lb \
                and self.objective == "gpus":
            out += (f"\nclaim: optimal in the twin{under} (the GPU count meets the twin lower "
                    "bound)")
        elif self.params.get("claim"):
            out += f"\nclaim: {self.params['claim']}{under}"
        for n in self.notes:
            out += f"\nnote: {n}"
        for r in self.repairs:
            out += f"\nrepair: {r}"
        if self.feasibility is not None and not self.feasibility.feasible:
            out += "\n" + self.feasibility.summary()
        return out

    # ------------------------------------------------------------------ headroom (twin.headroom)
    def headroom_report(self) -> list[tuple[int, bool, Any]] | None:
        """Per verified GPU ``(index, accepted with headroom, Headroom)``; None when unverified.
        The verdict (``self.verdict``) stays the plain one."""
        if self.verdict is None:
            return None
        th = float(self.params.get("starvation_threshold", 0.9))
        return [(i, *r) for i, g in enumerate(self.gpus)
                if (r := g.headroom_verdict(th)) is not None]

    def headroom_lines(self, max_gpus: int = 8) -> str:
        """The headroom verdict beside the plain one: the GPUs that pass only without the twin's
        measured headroom, each with its headroom line, or the largest headroom applied."""
        rep = self.headroom_report()
        if not rep:
            return ""
        at_risk = [(i, hr) for i, ok, hr in rep if self.gpus[i].verified.ok and not ok]
        head = {"accepted": "accepted", "rejected": "rejected"}[self.verdict]
        if all(self.gpus[i].verified.headroom is not None for i, _, _ in rep):
            out = (f"\nheadroom verdict: {head}, judged with the twin's measured headroom "
                   f"(twin.headroom)")
        else:
            out = (f"\nheadroom verdict: {head}; with the twin's measured headroom: "
                   f"{len(at_risk)} GPU(s) would be at risk")
        for i, hr in at_risk[:max_gpus]:
            out += f"\n  gpu {i}: {hr.describe()}"
        if len(at_risk) > max_gpus:
            out += f"\n  ... {len(at_risk) - max_gpus} more"
        if not at_risk:
            i, _, hr = max(rep, key=lambda r: r[2].h)
            out += f"\n  largest on gpu {i}: {hr.describe()}"
        return out

    # ------------------------------------------------------------------ vLLM arguments
    def vllm_args(self, adapter_dir: str = "adapters", model: str | None = None
                  ) -> list[dict[str, Any]]:
        """Per GPU: the vLLM server arguments (``--enable-lora``, ``--max-loras``,
        ``--max-cpu-loras``, ``--max-lora-rank``, ``--lora-modules id=<adapter_dir>/<id> …``), a
        ready command line, and the routing shares the router must apply.

        ``command`` is the command to run: it serves ``model_id`` (the profile's served
        model id, ``model`` when given, else the model catalog's, said in ``model_id_source``)
        with the server settings the profile was calibrated with (``server_args``, ``env``;
        ``optim.served_model.served_model``); ``serve_command`` is the same string. When no model id
        is known both are ``None`` and ``model_id_source`` says why (give ``model``): a command
        naming the profile, which vLLM cannot load, is never written. ``model`` is the
        profile's base-model name."""
        from twin.profile import load_profile

        from .served_model import served_model

        out = []
        for i, g in enumerate(self.gpus):
            base = model or load_profile(g.profile).model
            try:
                sm = served_model(g.profile, model)
            except ValueError as e:       # no model id known: no runnable command, say why
                sm, why = None, str(e)
            n = g.n_adapters
            args = ["--enable-lora", "--max-loras", str(g.max_loras),
                    "--max-cpu-loras", str(max(n, g.max_loras)),
                    "--max-lora-rank", str(g.max_lora_rank), "--lora-modules",
                    *[f"{a.id}={adapter_dir}/{a.id}" for a, _ in g.adapters]]
            line = None if sm is None else _serve_line(sm, args)
            out.append({"gpu": i, "gpu_type": g.gpu_type, "profile": g.profile, "model": base,
                        "args": args, "routing": {a.id: s for a, s in g.adapters},
                        "command": line, "serve_command": line,
                        **({"model_id": None, "model_id_source": why,
                            "server_args": None, "env": None} if sm is None else
                           {"model_id": sm.model_id, "model_id_source": sm.model_id_source,
                            "server_args": list(sm.flags), "env": dict(sm.env)})})
        return out


def _serve_line(sm, args: list[str]) -> str:
    """``ENV=... vllm serve <model id> <calibration settings> <LoRA args>``."""
    return " ".join([*(f"{k}={v}" for k, v in sm.env), "vllm", "serve", sm.model_id, *sm.flags,
                     *args])


def _slo_head(bound: str) -> str:
    """Column head of an SLO bound in the table: ``ttft_p99_ms`` -> ``twin ttft_p99``."""
    return "twin " + bound[:-3]


def _worst_adapter(m: GpuMetrics | None) -> str:
    """The lowest share of one adapter's requests within the SLO's per-request bounds."""
    vals = [x for x in ((m.slo or {}).get("adapter_attainment") or []) if x == x] if m else []
    return f"{100 * min(vals):.1f}% ok" if vals else "-"


def _ms(x: Any) -> str:
    if x is None:
        return "-"
    x = float(x)
    return "unserved" if math.isinf(x) else "-" if math.isnan(x) else f"{x:.0f}ms"


def _flag(m: GpuMetrics | None) -> str:
    if m is None:
        return "-"
    if m.memory_error:
        return "MEM"
    return "STARVE" if m.starved else "SLO" if not m.slo_met else "ok"


def _json_default(x: Any) -> Any:
    if hasattr(x, "item"):
        return x.item()
    if isinstance(x, (set, tuple)):
        return list(x)
    raise TypeError(f"not JSON-serialisable: {type(x).__name__}")


def plan_gpu(gpu_type: str, profile: str, max_loras: int, pairs: Iterable[tuple[Adapter, float]],
             mean_tokens: float, max_lora_rank: int | None = None,
             predicted: GpuMetrics | None = None) -> GpuPlan:
    """Build a ``GpuPlan``: offered load from the shares, max rank from the adapters by default."""
    pairs = tuple(pairs)
    if not pairs:
        raise ValueError("plan_gpu: a GPU needs at least one adapter")
    offered = sum(a.rate * s for a, s in pairs) * mean_tokens
    rank = max_lora_rank if max_lora_rank is not None else max(a.rank for a, _ in pairs)
    return GpuPlan(gpu_type, profile, int(max_loras), int(rank), pairs, offered, predicted)


def shares_consistent(gpus: Sequence[GpuPlan], adapters: Sequence[Adapter], tol: float = 1e-6
                      ) -> list[str]:
    """Problems with a placement's coverage: adapters missing, unknown, or shares not summing
    to 1 (empty list when consistent)."""
    total: dict[str, float] = {}
    for g in gpus:
        for a, s in g.adapters:
            total[a.id] = total.get(a.id, 0.0) + s
    ids = {a.id for a in adapters}
    problems = [f"adapter '{i}' is not placed" for i in sorted(ids - set(total))]
    problems += [f"adapter '{i}' is not in the instance" for i in sorted(set(total) - ids)]
    problems += [f"adapter '{i}': shares sum to {s:.6f}" for i, s in sorted(total.items())
                 if i in ids and abs(s - 1) > tol]
    return problems
