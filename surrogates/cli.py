"""Command line: ``python -m surrogates build | train | evaluate``.

* ``build --profile P --samples N --out F.parquet [--backend local|ray] [--address A]
  [--workers K] [--seed S] [--duration D]`` — twin dataset (resumable, seeded);
* ``train --data F.parquet --out DIR [--seed S]`` — fit every model, write JSON/npz files;
* ``pipeline --samples N [--profile P ...]`` — build + train + evaluate into
  ``surrogates/trained/<profile>`` (regenerates the committed models);
* ``evaluate --model DIR (--data F.parquet | --real CSV)`` — metrics; the last line is
  machine-readable (``throughput_smape=... starvation_f1=... fast_throughput_smape=... fast_us=...``
  or ``real_throughput_smape=... real_starvation_f1=...``).
"""

from __future__ import annotations

import argparse
import sys


def _build(a: argparse.Namespace) -> int:
    from .dataset import build_dataset
    build_dataset(a.profile, a.samples, a.out, backend=a.backend, address=a.address,
                  workers=a.workers, seed=a.seed, duration_s=a.duration,
                  client_max_waiting=None if a.client_max_waiting == 0 else a.client_max_waiting,
                  flush_every=a.flush_every, progress=not a.no_progress)
    return 0


def _train(a: argparse.Namespace) -> int:
    from .train import train_all
    train_all(a.data, a.out, seed=a.seed, test_frac=a.test_frac, quick=a.quick,
              allow_stale_profile=a.allow_stale_profile)
    return 0


def _evaluate(a: argparse.Namespace) -> int:
    from .evaluate import evaluate_real, evaluate_twin
    if (a.data is None) == (a.real is None):
        raise ValueError("evaluate: give exactly one of --data or --real")
    if a.data is not None:
        evaluate_twin(a.model, a.data, split=a.split)
    else:
        evaluate_real(a.model, a.real)
    return 0


def _pipeline(a: argparse.Namespace) -> int:
    """build -> train -> evaluate for each profile (what regenerates surrogates/trained/)."""
    from pathlib import Path

    from .dataset import build_dataset
    from .evaluate import evaluate_twin
    from .train import train_all
    repo = Path(__file__).resolve().parent.parent
    for prof in a.profile:
        data = Path(a.data_dir) / f"{prof}.parquet"
        out = Path(a.out_dir) / prof
        build_dataset(prof, a.samples, data, workers=a.workers, seed=a.seed,
                      backend=a.backend, address=a.address, progress=not a.no_progress)
        train_all(data, out, seed=a.seed)
        evaluate_twin(out, data)
    return 0


def parser() -> argparse.ArgumentParser:
    from .dataset import DEFAULT_CLIENT_MAX_WAITING, DEFAULT_DURATION_S
    p = argparse.ArgumentParser(prog="python -m surrogates", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="simulate single-GPU scenarios with the twin into Parquet")
    b.add_argument("--profile", required=True)
    b.add_argument("--samples", type=int, required=True, help="number of scenarios (mixes)")
    b.add_argument("--out", required=True)
    b.add_argument("--backend", choices=("local", "ray"), default="local")
    b.add_argument("--address", default=None, help="Ray cluster address (default: local Ray)")
    b.add_argument("--workers", type=int, default=2)
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--duration", type=float, default=DEFAULT_DURATION_S)
    b.add_argument("--client-max-waiting", type=int, default=DEFAULT_CLIENT_MAX_WAITING,
                   help="client queue cap of the load generator (0 = unbounded)")
    b.add_argument("--flush-every", type=int, default=50)
    b.add_argument("--no-progress", action="store_true")
    b.set_defaults(func=_build)
    t = sub.add_parser("train", help="fit the models on a dataset")
    t.add_argument("--data", required=True)
    t.add_argument("--out", required=True)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--test-frac", type=float, default=0.2,
                   help="fraction of scenarios held out (by scenario id hash)")
    t.add_argument("--quick", action="store_true", help="small models (tests)")
    t.add_argument("--allow-stale-profile", action="store_true",
                   help="train on data simulated with an older calibration (marked in manifest)")
    t.set_defaults(func=_train)
    e = sub.add_parser("evaluate", help="metrics on held-out twin scenarios or real runs")
    e.add_argument("--model", required=True)
    e.add_argument("--data", default=None)
    e.add_argument("--real", default=None)
    e.add_argument("--split", choices=("test", "all"), default="test",
                   help="rows of --data to use: the held-out split recorded at training, or all")
    e.set_defaults(func=_evaluate)
    q = sub.add_parser("pipeline", help="build + train + evaluate for one or more profiles")
    q.add_argument("--profile", nargs="+", default=["llama-3.1-8b-instruct", "qwen-2.5-7b-instruct"])
    q.add_argument("--samples", type=int, required=True)
    q.add_argument("--data-dir", default="results/surrogates")
    q.add_argument("--out-dir", default="surrogates/trained")
    q.add_argument("--backend", choices=("local", "ray"), default="local")
    q.add_argument("--address", default=None)
    q.add_argument("--workers", type=int, default=2)
    q.add_argument("--seed", type=int, default=0)
    q.add_argument("--no-progress", action="store_true")
    q.set_defaults(func=_pipeline)
    return p


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    try:
        return a.func(a)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
