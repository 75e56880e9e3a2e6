"""The residency cliff: how one GPU's throughput and tail latency move with ``max_loras``.

A vLLM server holds at most ``max_loras`` distinct adapters in one batch. With more *active*
adapters than slots, requests of the adapters not in the batch wait for a slot, adapters are
swapped in and out, and the tail time to first token (TTFT) collapses long before the server
starves by the 90 % throughput rule: 16 adapters at 0.5 req/s each on the H100 Llama profile
keep a p99 TTFT of ~93 ms on 16 slots, ~1.5 s on 15 and ~33 s on 8, at the same throughput
within 1 %. :func:`cliff_sweep` shows it with the twin, for one GPU profile and an adapter mix
(rates and ranks cycled over N adapters, as ``twin maxpack`` does, paired with the seed):

(a) against ``max_loras`` = 1 .. min(N + 1, the largest ``max_loras`` the profile starts at the
    mix's largest rank) for the given N (every integer up to 64 points, else every integer up
    to 16, a geometric ladder and the points next to N);
(b) against the number of adapters N' = 1 .. 2N (a ladder beyond 64 points) at a fixed
    ``max_loras``: the recommended one (below), or min(N, largest startable) when none is
    accepted. It goes past N so that it shows the same cliff from the other side: what the
    recommended server does when it is given more adapters of the mix than it has slots.

Every point replays the same seeded workload draw of its adapters (``simulate_server`` with
``seed``), so a sweep is deterministic; the server's ``--max-lora-rank`` is the mix's largest
rank throughout. A point records throughput, offered load (the tokens that arrived), the 90 %
rule, p99 TTFT and p99 ITL (from the SLO judgement, ``RunMetrics.slo["observed"]``, for the
bounds an :class:`~twin.slo.Slo` states: there an unserved request counts as an infinite TTFT
and, by default, the latencies are the client's, ``twin.slo``; otherwise the engine's p99 over
completed requests), whether the SLO is met and the mean
number of distinct adapters per engine step against the slots.

**The recommendation** (:func:`recommend`): among the accepted points of sweep (a) — no memory
error, not starved, the SLO met when one is given — take the best throughput score (throughput
/ (threshold x offered load); the workload is the same at every ``max_loras``, so this ranks
by throughput) and recommend the *smallest* ``max_loras`` whose score is within
``throughput_tol`` (default 0.1 %: a few requests finishing before or after the window's end)
of it: more slots than that buy no throughput and cost KV cache and per-step LoRA work. None
when no point is accepted. Without an SLO the 90 % rule does not bound latency, so the
recommendation may sit on the cliff (the CLI says so): state an SLO to stay off it.

The vLLM flags of a recommendation come from ``optim.deploy.lora_flags`` (the plan files'
renderer): ``--enable-lora --max-loras A --max-cpu-loras C --max-lora-rank R``
(``C`` = max(N, A), every adapter kept in host memory).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

from .lengths import LengthModel
from .maxpack import check_mix, mix_adapters
from .metrics import RunMetrics
from .profile import GpuProfile
from .server import ServerConfig, simulate_server
from .slo import Slo

ALL_INTEGERS_UP_TO = 64          # sweeps with at most this many points take every integer
SLOTS_FULL_FRAC = 0.95           # "slots full": mean distinct adapters per step >= 95 % of slots
DEFAULT_THROUGHPUT_TOL = 0.001


def observed_p99(m: RunMetrics) -> tuple[float, float]:
    """(p99 TTFT, p99 ITL) in ms of one run: the SLO judgement's observed value for a bound the
    run's SLO states (an unserved request counts as an infinite TTFT there; with adapter classes,
    the largest over the classes that state it), else the run's own p99 (completed requests);
    NaN when the configuration did not start."""
    obs = (m.slo or {}).get("observed", {})

    def worst(bound: str, own: float) -> float:     # over the top level and the SLO's classes
        vals = [v for k, v in obs.items() if k.rpartition(":")[2] == bound and v == v]
        return float(max(vals)) if vals else float(own)
    return worst("ttft_p99_ms", m.p99_ttft_ms), worst("itl_p99_ms", m.p99_itl_ms)


def ladder(hi: int, near: Sequence[int] = ()) -> list[int]:
    """Sweep points in 1..hi: every integer when ``hi <= ALL_INTEGERS_UP_TO``, else every
    integer up to 16, a geometric ladder (x1.25) and ``hi``, plus each of ``near`` and its
    neighbours (the cliff's edge)."""
    if hi < 1:
        return []
    if hi <= ALL_INTEGERS_UP_TO:
        return list(range(1, hi + 1))
    pts = set(range(1, 17)) | {hi}
    x = 16.0
    while x < hi:
        x *= 1.25
        pts.add(min(hi, int(round(x))))
    for c in near:
        pts |= {c - 1, c, c + 1}
    return sorted(p for p in pts if 1 <= p <= hi)


# ----------------------------------------------------------------------------- results
@dataclass(frozen=True)
class CliffPoint:
    """One replay: ``adapters`` adapters of the mix on ``max_loras`` slots."""

    max_loras: int
    adapters: int
    throughput_tps: float
    offered_tps: float               # tokens of the requests that arrived, per second
    starved: bool
    memory_error: bool
    p99_ttft_ms: float               # inf: more than 1 % of the judged requests unserved
    p99_itl_ms: float
    slo_met: bool | None             # None: no SLO given
    accepted: bool                   # started, not starved, SLO met (RunMetrics.accepted)
    mean_distinct_adapters: float    # distinct adapters per engine step (mean)
    score: float                     # throughput / (threshold x offered); -inf: memory error

    @property
    def over_slots(self) -> bool:
        """More adapters active than the server has slots."""
        return self.adapters > self.max_loras

    @property
    def slots_full(self) -> bool:
        """The batches hold (on average) at least ``SLOTS_FULL_FRAC`` of the slots' adapters."""
        return self.mean_distinct_adapters >= SLOTS_FULL_FRAC * self.max_loras

    @classmethod
    def of_run(cls, max_loras: int, adapters: int, m: RunMetrics, threshold: float
               ) -> "CliffPoint":
        ttft, itl = observed_p99(m)
        if m.memory_error:
            score = -math.inf
        elif m.offered_realised_tps > 0:
            score = m.throughput_tps / (threshold * m.offered_realised_tps)
        else:
            score = math.inf
        return cls(int(max_loras), int(adapters), float(m.throughput_tps),
                   float(m.offered_realised_tps), bool(m.starved), bool(m.memory_error),
                   ttft, itl, None if m.slo is None else bool(m.slo_met), bool(m.accepted),
                   float(m.mean_distinct_adapters), float(score))


@dataclass(frozen=True)
class CliffCurve:
    """A sweep: ``axis`` is ``"max_loras"`` (``fixed`` = the adapters) or ``"adapters"``
    (``fixed`` = the max_loras)."""

    axis: str
    fixed: int
    points: tuple[CliffPoint, ...]

    def x(self, p: CliffPoint) -> int:
        return p.max_loras if self.axis == "max_loras" else p.adapters

    @property
    def xs(self) -> tuple[int, ...]:
        return tuple(self.x(p) for p in self.points)

    @property
    def edge(self) -> float:
        """Where active adapters exceed the slots: below max_loras = adapters on the
        ``max_loras`` axis, above adapters = max_loras on the ``adapters`` axis."""
        return float(self.fixed)

    @property
    def slots_full_until(self) -> int | None:
        """``max_loras`` axis: the largest max_loras whose batches fill its slots
        (``CliffPoint.slots_full``); ``adapters`` axis: the smallest adapter count that does.
        None when no point does."""
        full = [self.x(p) for p in self.points if not p.memory_error and p.slots_full]
        if not full:
            return None
        return max(full) if self.axis == "max_loras" else min(full)


@dataclass(frozen=True)
class CliffReport:
    """Both sweeps of one GPU profile and adapter mix, and the recommendation."""

    profile: str
    gpu: str
    model: str
    rates: tuple[float, ...]
    ranks: tuple[int, ...]
    adapters: int
    max_lora_rank: int
    duration_s: float
    seed: int
    slo: Slo | None
    starvation_threshold: float
    throughput_tol: float
    by_max_loras: CliffCurve
    by_adapters: CliffCurve | None
    recommended: int | None
    flags: tuple[str, ...]           # vLLM flags of the recommendation (() when none)

    def point(self, max_loras: int) -> CliffPoint | None:
        """Sweep (a)'s point at ``max_loras`` (None when not swept)."""
        return next((p for p in self.by_max_loras.points if p.max_loras == max_loras), None)


# ----------------------------------------------------------------------------- the sweeps
def recommend(points: Sequence[CliffPoint], throughput_tol: float = DEFAULT_THROUGHPUT_TOL
              ) -> int | None:
    """The smallest accepted ``max_loras`` whose throughput score is within ``throughput_tol``
    (relative) of the best accepted score (module docstring); None when none is accepted."""
    ok = [p for p in points if p.accepted]
    if not ok:
        return None
    best = max(p.score for p in ok)
    return min(p.max_loras for p in ok
               if p.score >= best * (1.0 - throughput_tol) or p.score == best)


def vllm_flags(profile: GpuProfile, adapters, max_loras: int, max_lora_rank: int
               ) -> tuple[str, ...]:
    """``--enable-lora --max-loras A --max-cpu-loras C --max-lora-rank R`` of one server holding
    ``adapters``, rendered by the plan files' own renderer (``optim.deploy.lora_flags``), without
    its ``--lora-modules`` list."""
    from optim.deploy import lora_flags
    from optim.placement import GpuPlan

    plan = GpuPlan(profile.gpu, profile.name, int(max_loras), int(max_lora_rank),
                   tuple((a, 1.0) for a in adapters), 0.0)
    flags = lora_flags(plan, [a.id for a in adapters], "adapters")
    return tuple(flags[:flags.index("--lora-modules")])


def cliff_sweep(profile: GpuProfile, rates: Sequence[float], ranks: Sequence[int],
                adapters: int, slo: Slo | None = None, duration_s: float = 600.0,
                lengths: LengthModel | None = None, seed: int = 0,
                starvation_threshold: float = 0.9,
                throughput_tol: float = DEFAULT_THROUGHPUT_TOL,
                max_loras_points: Sequence[int] | None = None,
                adapter_points: Sequence[int] | None = None, adapters_upto: int | None = None,
                adapters_sweep: bool = True,
                on_point: Callable[[CliffPoint], None] | None = None) -> CliffReport:
    """Sweeps (a) and (b) of the module docstring for ``adapters`` adapters of the mix.

    ``max_loras_points`` / ``adapter_points`` replace the default points (values outside
    1..min(N + 1, largest startable) / 1..``adapters_upto`` are dropped; ``adapters_upto``
    defaults to 2N); ``adapters_sweep=False`` skips (b).
    ``on_point`` is called after each replay (progress bars). ``ValueError`` names a bad
    argument (an unsupported rank, no startable ``max_loras``, a bad count)."""
    check_mix(profile, rates, ranks, "cliff")
    if isinstance(adapters, bool) or not isinstance(adapters, int) or adapters < 1:
        raise ValueError(f"cliff: adapters must be an integer >= 1, got {adapters!r}")
    if not 0.0 <= throughput_tol < 1.0:
        raise ValueError(f"cliff: throughput_tol must be in [0, 1), got {throughput_tol!r}")
    rank = max(ranks)
    top = profile.max_startable_amax(rank)
    if top < 1:
        raise ValueError(f"cliff: no max_loras starts at max_lora_rank {rank} on profile "
                         f"'{profile.name}'")
    hi = min(adapters + 1, top)

    def replay(amax: int, n: int) -> CliffPoint:
        ads = mix_adapters(n, rates, ranks, seed=seed)
        cfg = ServerConfig(max_loras=int(amax), max_lora_rank=rank, slo=slo,
                           starvation_threshold=starvation_threshold)
        m = simulate_server(profile, ads, cfg, duration_s, lengths=lengths, seed=seed)
        p = CliffPoint.of_run(amax, n, m, starvation_threshold)
        if on_point is not None:
            on_point(p)
        return p

    amaxes = (ladder(hi, near=(adapters,)) if max_loras_points is None
              else sorted({int(a) for a in max_loras_points if 1 <= int(a) <= hi}))
    if not amaxes:
        raise ValueError(f"cliff: no max_loras point in 1..{hi}")
    by_amax = CliffCurve("max_loras", adapters, tuple(replay(a, adapters) for a in amaxes))
    rec = recommend(by_amax.points, throughput_tol)
    fixed = rec if rec is not None else min(adapters, top)
    by_n = None
    if adapters_sweep:
        upto = 2 * adapters if adapters_upto is None else int(adapters_upto)
        if upto < 1:
            raise ValueError(f"cliff: adapters_upto must be >= 1, got {adapters_upto!r}")
        ns = (ladder(upto, near=(fixed, adapters)) if adapter_points is None
              else sorted({int(n) for n in adapter_points if 1 <= int(n) <= upto}))
        by_n = CliffCurve("adapters", fixed, tuple(replay(fixed, n) for n in ns))
    flags = (vllm_flags(profile, mix_adapters(adapters, rates, ranks, seed=seed), rec, rank)
             if rec is not None else ())
    return CliffReport(profile.name, profile.gpu, profile.model, tuple(float(r) for r in rates),
                       tuple(int(r) for r in ranks), adapters, rank, float(duration_s),
                       int(seed), slo, float(starvation_threshold), float(throughput_tol),
                       by_amax, by_n, rec, flags)


# ----------------------------------------------------------------------------- text
def _ms(v: float) -> str:
    if math.isnan(v):
        return "n/a"
    if math.isinf(v):
        return "unserved"
    return f"{v:,.0f}" if v >= 100 else f"{v:.1f}"


def table_lines(curve: CliffCurve, recommended: int | None = None) -> list[str]:
    """The sweep as a fixed-width table; ``*`` marks the recommended max_loras, ``>`` a point
    with more adapters than slots."""
    slo_col = any(p.slo_met is not None for p in curve.points)
    head = (f"{'max_loras':>9} {'adapters':>8} {'throughput':>11} {'offered':>11} "
            f"{'starved':>7} {'p99 TTFT':>10} {'p99 ITL':>8} "
            + (f"{'SLO':>4} " if slo_col else "")
            + f"{'distinct/step':>13} {'accepted':>8}")
    unit = (f"{'':>9} {'':>8} {'tok/s':>11} {'tok/s':>11} {'':>7} {'ms':>10} {'ms':>8} "
            + (f"{'':>4} " if slo_col else "") + f"{'(of slots)':>13}")
    lines = [head, unit.rstrip()]
    for p in curve.points:
        mark = ("*" if curve.axis == "max_loras" and p.max_loras == recommended else " ") + \
               (">" if p.over_slots else " ")
        if p.memory_error:
            lines.append(f"{p.max_loras:>9} {p.adapters:>8}   memory error: vLLM would not "
                         f"start{mark:>3}")
            continue
        slo = ("" if not slo_col else f"{('met' if p.slo_met else 'no'):>4} ")
        lines.append(f"{p.max_loras:>9} {p.adapters:>8} {p.throughput_tps:>11,.1f} "
                     f"{p.offered_tps:>11,.1f} {str(p.starved).lower():>7} "
                     f"{_ms(p.p99_ttft_ms):>10} {_ms(p.p99_itl_ms):>8} {slo}"
                     f"{p.mean_distinct_adapters:>6.2f} / {p.max_loras:<4} "
                     f"{('yes' if p.accepted else 'no'):>8}{mark}".rstrip())
    return lines


# ----------------------------------------------------------------------------- figure
def _edges(xs: Sequence[float], log: bool) -> list[tuple[float, float]]:
    """Each point's span on the x axis: to the midpoints with its neighbours (geometric on a
    log axis), the end points as wide on their outer side as on their inner one."""
    fwd = math.log if log else float
    back = math.exp if log else float
    t = [fwd(x) for x in xs]
    mids = [(a + b) / 2 for a, b in zip(t, t[1:])]
    out = []
    for i, x in enumerate(t):
        lo = mids[i - 1] if i > 0 else (x - (mids[0] - x) if mids else x - 0.5)
        hi = mids[i] if i < len(mids) else (x + (x - mids[-1]) if mids else x + 0.5)
        out.append((back(lo), back(hi)))
    return out


def _shade_accepted(ax, curve: CliffCurve, log: bool, label: str | None) -> None:
    xs = [float(x) for x in curve.xs]
    for (lo, hi), p in zip(_edges(xs, log), curve.points):
        if p.accepted:
            ax.axvspan(lo, hi, color="#2ca02c", alpha=0.12, lw=0, label=label)
            label = None


def _draw_curve(axes, curve: CliffCurve, slo: Slo | None, recommended: int | None,
                threshold: float) -> None:
    """One row of the figure: throughput and offered, p99 TTFT, p99 ITL, distinct adapters per
    step, against the curve's axis."""
    pts = [p for p in curve.points if not p.memory_error]
    xs = [curve.x(p) for p in pts]
    log = bool(xs) and max(xs) > ALL_INTEGERS_UP_TO
    what = ("max_loras (adapter slots)" if curve.axis == "max_loras"
            else "adapters on the GPU")
    fixed = (f"{curve.fixed} adapters" if curve.axis == "max_loras"
             else f"max_loras {curve.fixed}")
    edge_label = ("slots = adapters (left: more adapters than slots)" if curve.axis == "max_loras"
                  else "adapters = slots (right: more adapters than slots)")
    ok_label = "accepted (SLO met, 90 % rule)" if slo is not None else "accepted (90 % rule)"
    from matplotlib.ticker import MaxNLocator

    ax_t, ax_ttft, ax_itl, ax_d = axes
    ax_t.plot(xs, [p.throughput_tps for p in pts], marker=".", label="twin throughput")
    ax_t.plot(xs, [p.offered_tps for p in pts], ls=":", color="grey", label="offered load")
    ax_t.plot(xs, [threshold * p.offered_tps for p in pts], ls="--", lw=0.8, color="crimson",
              label=f"starvation line ({threshold:.0%} of offered)")
    ax_t.set_ylabel("tok/s")
    ax_t.set_title(f"throughput ({fixed})")
    for ax, key, bound, title in ((ax_ttft, "p99_ttft_ms", "ttft_p99_ms", "p99 TTFT"),
                                  (ax_itl, "p99_itl_ms", "itl_p99_ms", "p99 ITL")):
        vals = [getattr(p, key) for p in pts]
        finite = [v for v in vals if math.isfinite(v) and v > 0]
        b = getattr(slo, bound) if slo is not None else None
        ref = finite + ([b] if b else [])
        top = max(ref) * 3 if ref else 1000.0
        ax.plot([x for x, v in zip(xs, vals) if math.isfinite(v)],
                [v for v in vals if math.isfinite(v)], marker=".", color="#1f77b4",
                label=f"twin {title}")
        gone = [x for x, v in zip(xs, vals) if math.isinf(v)]
        if gone:
            ax.plot(gone, [top] * len(gone), "^", color="black", ms=5,
                    label=f"> {100 - 100 * (slo.attainment if slo else 0.99):g} % unserved")
        if b:
            ax.axhline(b, color="crimson", ls="--", lw=1, label=f"SLO {b:g} ms")
        if key == "p99_ttft_ms":
            ax.set_yscale("log")
            if ref:
                ax.set_ylim(min(ref) / 2, top * 1.6)
        elif ref:
            ax.set_ylim(0, top / 3 * 1.3 if not gone else top * 1.1)
        ax.set_ylabel("ms")
        ax.set_title(title + (" (log)" if key == "p99_ttft_ms" else ""))
    ax_d.plot(xs, [p.mean_distinct_adapters for p in pts], marker=".",
              label="distinct adapters per step (mean)")
    ax_d.plot(xs, [p.max_loras for p in pts], ls="--", color="grey", label="slots (max_loras)")
    ax_d.plot(xs, [p.adapters for p in pts], ls=":", color="black", lw=0.8,
              label="adapters on the GPU")
    ax_d.set_ylabel("adapters")
    ax_d.set_title("active adapters against slots")
    for i, ax in enumerate(axes):
        if log:
            ax.set_xscale("log", base=2)
        _shade_accepted(ax, curve, log, ok_label if i == 0 else None)
        ax.axvline(curve.edge, color="darkorange", lw=1.2, label=edge_label if i == 0 else None)
        full = curve.slots_full_until
        if full is not None and full != curve.fixed:
            ax.axvline(full, color="darkorange", lw=0.8, ls=":",
                       label=(f"distinct adapters per step reach the slots "
                              f"({'up to' if curve.axis == 'max_loras' else 'from'} {full})"
                              if i == 0 else None))
        if curve.axis == "max_loras" and recommended is not None:
            ax.axvline(recommended, color="#2ca02c", lw=1.5, ls="-.",
                       label=f"recommended max_loras {recommended}" if i == 0 else None)
        ax.set_xlabel(what)
        if not log:
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.legend(fontsize=7, loc="best")


def plot_cliff(report: CliffReport, path) -> None:
    """Write the figure: one row per sweep (max_loras, then adapters), four panels each."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [report.by_max_loras] + ([report.by_adapters] if report.by_adapters else [])
    fig, axes = plt.subplots(len(rows), 4, figsize=(20, 4.6 * len(rows)), squeeze=False)
    for row, curve in zip(axes, rows):
        _draw_curve(row, curve, report.slo, report.recommended, report.starvation_threshold)
    slo = report.slo.describe() if report.slo is not None else "no latency SLO"
    rec = (f"recommended: {' '.join(report.flags)}" if report.recommended is not None
           else "no max_loras is accepted")
    fig.suptitle(f"residency cliff: {report.profile} ({report.gpu}), {report.adapters} adapters "
                 f"(rates {','.join(f'{r:g}' for r in report.rates)} req/s, ranks "
                 f"{','.join(map(str, report.ranks))}), {report.duration_s:g} s window, seed "
                 f"{report.seed}; {slo}\n{rec}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_formats() -> set[str]:
    """File extensions matplotlib writes (``--plot`` is checked against them before work)."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib.backend_bases import FigureCanvasBase
    return set(FigureCanvasBase.get_supported_filetypes())


__all__ = ["CliffPoint", "CliffCurve", "CliffReport", "cliff_sweep", "recommend", "ladder",
           "observed_p99", "vllm_flags", "table_lines", "plot_cliff",
           "plot_formats"]
