"""The residency cliff (``twin.cliff``, ``twin maxpack --slo/--plot``, the plan report's
latency curves): short windows, one process."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from optim.deploy import lora_flags
from optim.placement import GpuPlan, Placement
from twin.cli import main as twin_main
from twin.cliff import (CliffPoint, cliff_sweep, ladder, observed_p99, plot_cliff, recommend,
                        table_lines)
from twin.maxpack import mix_adapters
from twin.profile import load_profile
from twin.slo import Slo
from twin.workload import Adapter

PROFILE = "llama-3.1-8b-instruct"
SLO = Slo(ttft_p99_ms=500.0, itl_p99_ms=100.0)
WINDOW = 300.0
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def sixteen():
    """16 adapters at 0.5 req/s, rank 8, on the H100 Llama profile (the issue's example)."""
    return cliff_sweep(load_profile(PROFILE), [0.5], [8], 16, slo=SLO, duration_s=WINDOW)


def _pt(amax: int, score: float, accepted: bool = True, n: int = 4) -> CliffPoint:
    return CliffPoint(amax, n, score, 1.0, False, False, 10.0, 10.0, None, accepted, 1.0, score)


def test_recommend_rule():
    # the smallest accepted max_loras of the best throughput score (ties and within 0.1 %)
    assert recommend([_pt(1, 1.5, False), _pt(2, 1.2), _pt(3, 1.3), _pt(4, 1.3), _pt(5, 1.3)]) == 3
    assert recommend([_pt(2, 1.2999), _pt(3, 1.3)]) == 2                 # within the tolerance
    assert recommend([_pt(2, 1.2999), _pt(3, 1.3)], throughput_tol=0.0) == 3
    assert recommend([_pt(1, 2.0, False), _pt(2, 2.0, False)]) is None   # nothing accepted
    assert recommend([]) is None


def test_ladder():
    assert ladder(17) == list(range(1, 18))
    pts = ladder(385, near=(384,))
    assert pts[:16] == list(range(1, 17)) and pts[-3:] == [383, 384, 385]
    assert pts == sorted(set(pts)) and len(pts) < 45
    assert {99, 100, 101} <= set(ladder(200, near=(100,)))


def test_sweep_is_deterministic(sixteen):
    again = cliff_sweep(load_profile(PROFILE), [0.5], [8], 16, slo=SLO, duration_s=WINDOW)
    assert again == sixteen
    other = cliff_sweep(load_profile(PROFILE), [0.5], [8], 16, slo=SLO, duration_s=WINDOW,
                        seed=1, adapters_sweep=False)
    assert other.by_max_loras.points != sixteen.by_max_loras.points      # the seed matters


def test_the_recommendation_sits_past_the_cliff(sixteen):
    """On 16 busy adapters the recommended max_loras meets the SLO and one slot fewer does not
    (requests wait for a slot: the p99 TTFT jumps by more than 10x), the throughput barely
    moves, and the flags are the plan files' own."""
    r = sixteen
    a = r.by_max_loras
    assert [p.max_loras for p in a.points] == list(range(1, 18))     # 1 .. N + 1
    assert all(p.adapters == 16 for p in a.points)
    rec = r.point(r.recommended)
    edge = r.point(r.recommended - 1)
    assert rec.accepted and rec.slo_met and not rec.starved
    assert edge is not None and not edge.slo_met and not edge.accepted
    assert edge.p99_ttft_ms > 10 * rec.p99_ttft_ms
    assert edge.over_slots and not rec.over_slots            # the cliff is the slot count
    assert r.recommended == 16
    assert not edge.starved and edge.throughput_tps > 0.98 * rec.throughput_tps
    # every accepted point has at least as many slots as adapters; 8 slots is far off the SLO
    assert all(p.max_loras >= 16 for p in a.points if p.accepted)
    assert r.point(8).p99_ttft_ms > 20 * rec.p99_ttft_ms
    # the distinct adapters per step fill the slots below the cliff
    assert all(p.slots_full for p in a.points if p.max_loras <= 8)
    ads = mix_adapters(16, [0.5], [8])
    g = GpuPlan("H100-64GB", PROFILE, 16, 8, tuple((x, 1.0) for x in ads), 0.0)
    full = lora_flags(g, [x.id for x in ads], "adapters")
    assert list(r.flags) == full[:full.index("--lora-modules")]
    assert r.flags == ("--enable-lora", "--max-loras", "16", "--max-cpu-loras", "16",
                       "--max-lora-rank", "8")
    # the adapter sweep at the recommended max_loras crosses the slots the other way
    b = r.by_adapters
    assert b.fixed == 16 and b.xs == tuple(range(1, 33))
    assert all(p.accepted for p in b.points if p.adapters <= 16)
    assert not any(p.slo_met for p in b.points if p.adapters >= 18)
    lines = table_lines(a, r.recommended)
    assert any(x.rstrip().endswith("yes*") for x in lines)


def test_p99_comes_from_the_slo_judgement(sixteen):
    p = sixteen.point(1)                      # starved: the TTFT quantile is on unserved requests
    assert p.starved and math.isinf(p.p99_ttft_ms) and p.slo_met is False
    no_slo = cliff_sweep(load_profile(PROFILE), [0.5], [8], 16, duration_s=WINDOW,
                         max_loras_points=[1, 16], adapters_sweep=False)
    q = no_slo.point(1)
    assert q.slo_met is None and math.isfinite(q.p99_ttft_ms)   # completed requests only
    # the SLO judges the client's gaps (engine + delivery delays), the plain run the engine's
    assert sixteen.point(16).p99_itl_ms > no_slo.point(16).p99_itl_ms


def test_plot_writes_a_png(sixteen, tmp_path):
    out = tmp_path / "c.png"
    plot_cliff(sixteen, out)
    assert out.read_bytes()[:8] == PNG


def test_cli_writes_the_plot_and_prints_the_flags(tmp_path, capsys):
    png = tmp_path / "cliff.png"
    args = ["maxpack", "--rates", "0.5", "--ranks", "8", "--adapters", "16", "--duration",
            str(WINDOW), "--slo", "ttft_p99_ms=500,itl_p99_ms=100", "--plot", str(png),
            "--quiet"]
    assert twin_main(args) == 0
    out = capsys.readouterr().out
    assert png.read_bytes()[:8] == PNG
    assert ("vLLM flags: --enable-lora --max-loras 16 --max-cpu-loras 16 --max-lora-rank 8"
            in out)
    assert "recommended: max_loras 16" in out and "one slot fewer (max_loras 15): misses the SLO" \
        in out
    before = png.read_bytes()
    assert twin_main(args) == 2                                # no --force: refused, untouched
    assert "--plot" in capsys.readouterr().err and png.read_bytes() == before


def test_cli_without_slo_warns_that_latency_is_unbounded(capsys):
    args = ["maxpack", "--rates", "0.5", "--ranks", "8", "--adapters", "16", "--duration",
            str(WINDOW), "--quiet"]
    assert twin_main(args) == 0
    out = capsys.readouterr().out
    assert "vLLM flags: --enable-lora --max-loras" in out
    assert "SLO" not in out.split("against max_loras")[1].splitlines()[1]  # no SLO column


@pytest.mark.parametrize("extra, needle", [
    (["--slo", "ttft_p99_ms=fast"], "--slo: ttft_p99_ms: 'fast' is not a number"),
    (["--slo", "p42=1"], "--slo: unknown field(s) ['p42']"),
    (["--slo", "ttft_p99_ms=0"], "ttft_p99_ms: must be a finite number"),
    (["--slo", "ttft_p99_ms=500", "--duration", "60"], "--duration 60: must exceed"),
    (["--plot", "cliff.nope"], "--plot cliff.nope: the file name must end in an image format"),
])
def test_cli_bad_values_exit_2_naming_the_option(extra, needle, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rc = twin_main(["maxpack", "--rates", "0.5", "--ranks", "8", "--adapters", "16", *extra])
    err = capsys.readouterr().err
    assert rc == 2 and needle in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def test_cli_bad_slo_is_one_line_in_a_subprocess():
    r = subprocess.run([sys.executable, "-m", "twin", "maxpack", "--rates", "0.5", "--ranks",
                        "8", "--slo", "ttft_p99_ms"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip().splitlines() == [
        "error: --slo: 'ttft_p99_ms' is not NAME=VALUE (e.g. ttft_p99_ms=500)"]


# ----------------------------------------------------------------------------- the plan report
def _placement(inst, amax: int) -> Placement:
    pairs = tuple((a, 1.0) for a in inst.adapters)
    offered = sum(inst.load_tps(a) for a in inst.adapters)
    g = GpuPlan(inst.gpu_types[0].name, PROFILE, amax, 8, pairs, offered)
    return Placement(inst.name, "greedy", "solved", (g,), objective="gpus", verdict="accepted")


def test_plan_report_shows_the_p99_curves_under_an_slo(tmp_path):
    from optim.plan import gpu_curves, plan_instance, report_markdown, write_png
    csv = tmp_path / "ads.csv"
    csv.write_text("id,rank,rate\n" + "".join(f"a{i},8,0.5\n" for i in range(16)))
    inst = plan_instance(csv, duration_s=WINDOW, slo=SLO)
    p = _placement(inst, 16)
    curves = gpu_curves(inst, p, window_s=WINDOW, workers=1)
    c = curves[0]
    assert len(c.p99_ttft_ms) == len(c.p99_itl_ms) == len(c.accepted) == len(c.amaxes)
    at = dict(zip(c.amaxes, zip(c.p99_ttft_ms, c.accepted)))
    assert at[16][1] and at[16][0] <= 500 and not at[8][1] and at[8][0] > 500   # the cliff
    write_png(tmp_path / "report.png", p, curves, inst.starvation_threshold, None, WINDOW,
              inst.slo)
    assert (tmp_path / "report.png").read_bytes()[:8] == PNG
    md = report_markdown(inst, p, None, curves, [], {})
    assert "## Latency against max_loras" in md and "p99 TTFT" in md
    assert "| **16** |" in md and inst.slo.describe() in md
    # without an SLO the report is as before: no latency section, the one-row figure
    plain = plan_instance(csv, duration_s=WINDOW)
    md0 = report_markdown(plain, p, None, curves, [], {})
    assert "Latency against max_loras" not in md0 and "p99" not in md0
    write_png(tmp_path / "plain.png", p, curves, plain.starvation_threshold, None, WINDOW)
    assert (tmp_path / "plain.png").read_bytes()[:8] == PNG


def test_observed_p99_prefers_the_slo_judgement():
    from twin.server import ServerConfig, simulate_server
    prof = load_profile(PROFILE)
    ads = [Adapter(f"a{i}", 8, 0.5) for i in range(4)]
    m = simulate_server(prof, ads, ServerConfig(max_loras=4, slo=Slo(itl_p99_ms=100.0)),
                        WINDOW, seed=0)
    ttft, itl = observed_p99(m)
    assert ttft == m.p99_ttft_ms                        # not bounded: the run's own p99
    assert itl == m.slo["observed"]["itl_p99_ms"]       # bounded: the judgement's (bin edge)
