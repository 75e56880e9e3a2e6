"""Collect the project's evidence: run the registered studies, write ``experiments/RESULTS.md``.

``python -m experiments.report [--quick] [--only NAME[,NAME]] [--rerun] [--list]``

Each entry of ``STUDIES`` is a command whose last line holds its figures (``key=value ...``).
A run stores its result in ``experiments/evidence/<name>.json`` (committed: command, commit,
date, machine, load average, wall time, exit code, last line) as soon as it ends, so an interrupted report
loses at most the running study; the next run skips studies already measured on the current
commit unless ``--rerun``. ``RESULTS.md`` is then written from every stored result — each figure
with its command, the commit and date it was measured on and the machine — so a figure measured
on an older commit says so. ``--quick`` runs the entries marked quick (minutes in all);
without it, every entry (hours on two cores). Entries that need the shared measurements are
skipped, with the reason, when ``$LORA_SHARED_DATA`` is absent.

The ``quickstart`` entry is the README's main command on a fresh clone: the current commit
cloned into a temporary folder, run with empty caches (``HOME``, ``LORA_PLACEMENT_CACHE``,
``NUMBA_CACHE_DIR``) and the clone first on ``PYTHONPATH``, timed from start to exit.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Sequence

from .common import REPO, git_commit, shared_data_dir

STORE = REPO / "experiments" / "evidence"
RESULTS_MD = REPO / "experiments" / "RESULTS.md"


@dataclass(frozen=True)
class Study:
    """One registered evidence command: ``args`` after ``python``; ``{shared}`` stands for the
    shared-data folder; ``quick`` entries run with ``--quick``; ``question`` is what it answers."""

    name: str
    question: str
    args: tuple[str, ...]
    quick: bool = False
    needs_shared: bool = False
    timeout_s: float = 4 * 3600.0


STUDIES: tuple[Study, ...] = (
    Study("quickstart", "README's main command on a fresh clone (wall time, plan)",
          ("-m", "experiments.report", "--quickstart-probe"), quick=True, timeout_s=900),
    Study("cli_startup", "start-up of `python -m twin run` (targets 1.5 s / 1.0 s)",
          ("-m", "experiments.cli_startup", "--repeats", "5"), quick=True, timeout_s=900),
    Study("twin_fidelity_runs", "twin vs real vLLM on the 131 Llama validation runs (SMAPE %)",
          ("-m", "experiments.twin_fidelity", "--runs",
           "{shared}/validation_llama/validation_llama.csv"), quick=True, needs_shared=True),
    Study("twin_fidelity_maxsearch", "twin vs real max-throughput searches",
          ("-m", "experiments.twin_fidelity", "--maxsearch",
           "{shared}/validation_llama/maxsearch_llama.csv"), quick=True, needs_shared=True),
    Study("twin_speed", "twin speed (simulated seconds per wall second)",
          ("-m", "experiments.twin_speed"), quick=True, timeout_s=1800),
    Study("first_solve_quick", "first solves from an empty cache (targets 60 s / 120 s)",
          ("-m", "experiments.first_solve", "--quick"), quick=True),
    Study("twin_serve_soak", "twin serve under 1,000 concurrent streams and a slow reader",
          ("-m", "experiments.twin_serve_soak"), quick=True, timeout_s=600),
    Study("gpu_savings_quick", "GPUs by greedy vs baselines, certified optimal (quick set)",
          ("-m", "experiments.gpu_savings", "--quick", "--workers", "2")),
    Study("replan_quick", "re-planning: moves and GPU-hours against a fresh solve",
          ("-m", "experiments.replan", "--quick")),
    Study("routing_quick", "routing policies on the fleet twin",
          ("-m", "experiments.routing", "--quick")),
    Study("amax_curves", "is throughput vs Amax unimodal? brute force against the search",
          ("-m", "experiments.amax_curves", "--workers", "2")),
    Study("gpu_savings", "GPUs by greedy on every paper instance, certified optimal",
          ("-m", "experiments.gpu_savings", "--methods", "greedy", "--workers", "2")),
    Study("first_solve", "first solves of every small and paper instance with a target",
          ("-m", "experiments.first_solve", "--targets-only")),
    Study("slo_placement_quick", "GPUs under three latency SLOs against the 90 % rule, "
          "certified under each (quick set)",
          ("-m", "experiments.slo_placement", "--quick", "--workers", "2")),
)


def machine() -> str:
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        mem = float("nan")
    return (f"{platform.machine()} {os.cpu_count()} cores {mem:.0f} GiB, "
            f"Python {platform.python_version()}, {platform.system()}")


def _last_line(text: str) -> str:
    lines = [x.strip() for x in text.splitlines() if x.strip()]
    return lines[-1] if lines else ""


def run_study(s: Study) -> dict:
    """Run one study now and return its stored record."""
    shared = shared_data_dir()
    args = [a.replace("{shared}", str(shared)) for a in s.args]
    start = datetime.now(timezone.utc)
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    try:
        r = subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True,
                           timeout=s.timeout_s)
        rc, out, err = r.returncode, r.stdout, r.stderr
    except subprocess.TimeoutExpired as e:
        rc, out, err = -1, (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else \
            (e.stdout or ""), f"timed out after {s.timeout_s:g} s"
    wall = time.perf_counter() - t0
    return {"name": s.name, "question": s.question,
            "command": "python " + " ".join(args).replace(str(shared), "$LORA_SHARED_DATA"),
            "commit": git_commit(mark_changes=True),
            "date": start.strftime("%Y-%m-%d %H:%M UTC"),
            "machine": machine(), "load_average_start": round(load0, 2),
            "load_average_end": round(os.getloadavg()[0], 2), "wall_s": round(wall, 1),
            "exit": rc, "figures": _last_line(out),
            "error": _last_line(err) if rc != 0 else ""}


def quickstart_probe() -> int:
    """The README's main command on a fresh clone with empty caches; prints its figures."""
    with tempfile.TemporaryDirectory(prefix="quickstart-") as tmp:
        clone = Path(tmp) / "clone"
        subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True, timeout=300)
        home = Path(tmp) / "home"
        home.mkdir()
        env = {**os.environ, "HOME": str(home), "LORA_PLACEMENT_CACHE": str(home / "cache"),
               "NUMBA_CACHE_DIR": str(home / "numba"), "PYTHONPATH": str(clone)}
        t0 = time.perf_counter()
        r = subprocess.run([sys.executable, "-m", "optim", "plan"], cwd=clone, env=env,
                           capture_output=True, text=True, timeout=900)
        wall = time.perf_counter() - t0
        out = r.stdout.splitlines()
        plan = next((x for x in out if x.startswith("plan: ")), "")
        claim = next((x for x in out if x.startswith("claim: ")), "")
        files = sorted(str(p.relative_to(clone / "plan")) for p in (clone / "plan").rglob("*")
                       if p.is_file()) if (clone / "plan").is_dir() else []
        print("\n".join(out))
        if r.returncode != 0:
            print(r.stderr, file=sys.stderr)
        gpus = plan.split()[1] if plan else "?"
        print(f"quickstart_wall_s={wall:.1f} exit={r.returncode} gpus={gpus} "
              f"optimal_in_twin={'optimal in the twin' in claim} files={len(files)}")
        return r.returncode


def write_results(path: Path = RESULTS_MD) -> None:
    """``RESULTS.md`` from every stored record, in registry order."""
    recs = []
    for s in STUDIES:
        f = STORE / f"{s.name}.json"
        if f.is_file():
            recs.append(json.loads(f.read_text()))
    head = git_commit(mark_changes=True)
    lines = ["# Results", "",
             "Written by `python -m experiments.report` from the stored runs in "
             "`experiments/evidence/` (rerun a study with `python -m experiments.report --only NAME "
             "--rerun`). Each figure is the last line its command printed; the commit, date, "
             "machine and load average say where it was measured. "
             f"This file was written at commit {head}.", ""]
    for r in recs:
        lines += [f"## {r['name']}: {r['question']}", "",
                  f"```\n{r['figures'] or '(no output)'}\n```", "",
                  f"- command: `{r['command']}`",
                  f"- measured: commit {r['commit']}, {r['date']}, {r['machine']}, load average "
                  f"{r['load_average_start']} -> {r['load_average_end']}, wall {r['wall_s']:.0f} s,"
                  f" exit {r['exit']}" + (f" ({r['error']})" if r.get("error") else ""), ""]
    missing = [s.name for s in STUDIES if not (STORE / f"{s.name}.json").is_file()]
    if missing:
        lines += ["## Not yet measured", "",
                  "Run `python -m experiments.report --only " + ",".join(missing) + "`.", ""]
    path.write_text("\n".join(lines))


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.report",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="only the entries marked quick")
    ap.add_argument("--only", default=None, help="comma list of entry names")
    ap.add_argument("--rerun", action="store_true",
                    help="run even when a result of the current commit is stored")
    ap.add_argument("--list", action="store_true", help="list the entries and stop")
    ap.add_argument("--quickstart-probe", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.quickstart_probe:
        return quickstart_probe()
    if a.list:
        for s in STUDIES:
            print(f"{s.name:<24} {'quick' if s.quick else 'full ':<6} {s.question}")
        return 0
    names = {s.name for s in STUDIES}
    chosen = list(STUDIES)
    if a.only:
        want = [x.strip() for x in a.only.split(",") if x.strip()]
        bad = [x for x in want if x not in names]
        if bad:
            print(f"error: --only: unknown entries {bad} (see --list)", file=sys.stderr)
            return 2
        chosen = [s for s in STUDIES if s.name in want]
    elif a.quick:
        chosen = [s for s in STUDIES if s.quick]
    STORE.mkdir(parents=True, exist_ok=True)
    head = git_commit(mark_changes=True)
    for s in chosen:
        f = STORE / f"{s.name}.json"
        if f.is_file() and not a.rerun and json.loads(f.read_text()).get("commit") == head:
            print(f"{s.name}: stored for {head}, skipped (--rerun to run again)")
            continue
        if s.needs_shared and not shared_data_dir().is_dir():
            print(f"{s.name}: skipped: shared data not found at {shared_data_dir()} "
                  "(set LORA_SHARED_DATA)")
            continue
        print(f"{s.name}: running ...", flush=True)
        rec = run_study(s)
        tmp = f.with_suffix(".tmp")
        tmp.write_text(json.dumps(rec, indent=1))
        os.replace(tmp, f)
        print(f"{s.name}: {rec['figures']} ({rec['wall_s']:.0f} s, exit {rec['exit']})",
              flush=True)
    write_results()
    print(f"wrote {RESULTS_MD.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
