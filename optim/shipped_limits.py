"""Regenerate the twin limits shipped with the package (``optim/data/carry_limits.json``).

``python -m optim.shipped_limits [--windows 600,3600] [--instances DIR ...] [--work DIR]
[--workers W]``

First solves measure twin carry limits (``optim.capacity.carry_limit``) for the lower bound: a
minute or more each on two cores. The package ships the ones every first solve on the shipped
profiles needs: for each shipped profile, each supported rank, each window of ``--windows`` and
each of the two lengths models the shipped instances use (the twin's ShareGPT default and its
rescaling to 223 / 196.3 tokens), the one-adapter limit with the bound's seeds 0..7; and, with
``--instances``, every generic limit (one-adapter and adapter-count) the lower bound of those
instances measures. Instance-specific replays (one GPU, fullest GPU ...) are not shipped.

Resumable: every limit is written to the work cache (``--work``, default
``results/shipped_limits_cache``) as soon as it is measured, and the same command continues.
The file records the twin fingerprint of each shipped profile (``_meta``); the test suite
compares it with the current twin, so a file that predates a twin change cannot go unnoticed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Sequence

from tqdm import tqdm

SHIPPED_PROFILES = ("llama-3.1-8b-instruct", "qwen-2.5-7b-instruct")
META_KEY = "_meta"
LENGTHS = (None, {"mean_input": 223.0, "mean_output": 196.3})


def shipped_fingerprints() -> dict[str, str]:
    """Twin fingerprint of each shipped profile (what ``_meta`` records)."""
    from twin.profile import load_profile
    from .capacity import twin_fingerprint
    return {p: twin_fingerprint(load_profile(p)) for p in SHIPPED_PROFILES}


def read_meta(path: Path | None = None) -> dict:
    """The ``_meta`` record of the shipped file ({} when absent)."""
    from .capacity import SHIPPED_LIMITS
    try:
        return json.loads(Path(path or SHIPPED_LIMITS).read_text()).get(META_KEY, {})
    except (OSError, ValueError):
        return {}


def _lengths(spec):
    """The length model of an instance's ``lengths`` spec (None: the twin's ShareGPT model;
    ``{mean_input, mean_output}``: rescaled to those means, as ``optim.instance`` reads it)."""
    from twin.sharegpt import default_lengths
    from twin.sharegpt import sharegpt_lengths
    if spec is None:
        return default_lengths()
    return sharegpt_lengths(spec["mean_input"], spec["mean_output"])


def write_shipped(work: Path, out: Path, argv: Sequence[str] | None) -> None:
    """Write the generic limits of the work cache to ``out`` with ``_meta`` (atomically)."""
    cache = json.loads((work / "carry_limits.json").read_text())
    generic = {k: v for k, v in cache.items() if ":" not in k and k != META_KEY}
    generic[META_KEY] = {"twin_fingerprints": shipped_fingerprints(),
                         "command": "python -m optim.shipped_limits " + " ".join(
                             argv if argv is not None else sys.argv[1:]),
                         "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
                         "limits": len(generic)}
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(generic, indent=0, sort_keys=True) + "\n")
    os.replace(tmp, out)
    print(f"wrote {out}: {len(generic) - 1} limits; twin fingerprints "
          f"{generic[META_KEY]['twin_fingerprints']}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m optim.shipped_limits",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--windows", default="600,3600", help="verification windows (s), comma list")
    ap.add_argument("--instances", nargs="*", default=[],
                    help="instance files or folders whose lower bounds' generic limits to ship")
    ap.add_argument("--work", default="results/shipped_limits_cache",
                    help="work cache (resumable)")
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--out", default=None, help="default: the package's carry_limits.json")
    a = ap.parse_args(argv)
    try:
        windows = [float(x) for x in a.windows.split(",") if x.strip()]
    except ValueError:
        print(f"error: --windows: expected numbers, got {a.windows!r}", file=sys.stderr)
        return 2
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    os.environ["LORA_PLACEMENT_CACHE"] = str(work.resolve())
    from twin.profile import load_profile
    from . import capacity
    from .feasibility import twin_lower_bound
    from .instance import load_instance
    out = Path(a.out) if a.out else capacity.SHIPPED_LIMITS
    # measure against the work cache only: the old shipped file must not answer
    capacity.SHIPPED_LIMITS = work / "none.json"
    jobs = [(p, r, w, spec) for p in SHIPPED_PROFILES for spec in LENGTHS for w in windows
            for r in load_profile(p).supported_ranks]
    for p, r, w, spec in tqdm(jobs, desc="one-adapter limits", unit="limit"):
        capacity.carry_limit(load_profile(p), r, 1, _lengths(spec), w,
                             tuple(range(capacity.BOUND_SEEDS)), 0.9, a.workers)
    paths: list[Path] = []
    for x in a.instances:
        q = Path(x)
        paths += sorted(q.glob("*.json")) if q.is_dir() else [q]
    write_shipped(work, out, argv)
    for path in tqdm(paths, desc="instance bounds", unit="inst"):
        twin_lower_bound(load_instance(path), None, a.workers)
        write_shipped(work, out, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
