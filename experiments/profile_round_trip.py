"""Round trip of the profiling harness: profile a ``twin serve`` stand-in, calibrate, compare.

``python -m experiments.profile_round_trip --out DIR [--profile P] [--study quick|full]
[--time-scale X]`` runs ``python -m twin.harness profile --launch --server twin`` against servers
that run profile P, fits a profile from the CSVs with ``twin calibrate`` and prints how well the
fit recovers P: every step-time coefficient (relative error; for a coefficient that is 0 in P,
its share of a reference step), the KV capacities probed, the backbone capacity and the adapter
load times. Writes ``DIR/fitted.json`` and ``DIR/round_trip.txt``. The issue's target: step-time
coefficients within 5 %, KV table exact.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from twin.cli_support import CliError, check_output_dir, float_above, run_command


def _load_average() -> str:
    try:
        return f"{os.getloadavg()[0]:.1f}"
    except (AttributeError, OSError):
        return "n/a"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.profile_round_trip",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder for the CSVs, fitted.json, report")
    ap.add_argument("--profile", default="llama-3.1-8b-instruct", help="profile twin serve runs")
    ap.add_argument("--study", choices=("quick", "full"), default="quick")
    ap.add_argument("--time-scale", type=float_above(0.0, 1000.0), default=20.0)
    ap.add_argument("--force", action="store_true", help="overwrite an earlier run in --out")
    ap.add_argument("--quiet", action="store_true")
    a = ap.parse_args(argv)

    def go() -> int:
        from twin.calibrate import calibrate
        from twin.harness.cli import main as harness_main
        from twin.harness.round_trip import format_checks
        from twin.profile import load_profile

        out = check_output_dir(a.out, "--out", a.force, ("fitted.json", "round_trip.txt"))
        ref = load_profile(a.profile)
        load0 = _load_average()
        t0 = time.perf_counter()
        args = ["profile", "--launch", "--server", "twin", "--profile", a.profile,
                "--time-scale", repr(a.time_scale), "--study", a.study, "--out", str(out)]
        rc = harness_main(args + (["--force"] if a.force else []) + (["--quiet"] if a.quiet
                                                                     else []))
        if rc != 0:
            raise CliError(f"twin.harness profile failed (exit {rc})")
        fitted, _ = calibrate(out, ref.model)
        fitted.to_json(out / "fitted.json")
        text = (f"profile round trip: {a.profile}, {a.study} study, time scale {a.time_scale:g}, "
                f"{time.perf_counter() - t0:.0f} s (1-minute load average {load0} at the start, "
                f"{_load_average()} at the end; the machine's other jobs slow the stand-ins)\n"
                + format_checks(ref, fitted))
        (out / "round_trip.txt").write_text(text + "\n")
        print(text)
        return 0

    return run_command(go)


if __name__ == "__main__":
    sys.exit(main())
