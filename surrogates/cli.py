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
from pathlib import Path

from twin.cli_support import (EXIT_CODES_EPILOG, CliError, HelpFormatter, check_input_file,
                              check_output_dir, float_above, int_at_least, nonneg_int,
                              positive_int, run_command, seed_type)
from twin.limits import MAX_DURATION_S

MODEL_FILES = ("manifest.json", "throughput.json", "throughput.npz", "starvation.json",
               "starvation.npz", "itl.json", "itl.npz", "fast.json", "fast.npz", "capacity.json")
INTERRUPTED_HINT = "resume with the same command"


def _check_dataset_out(out: str) -> Path:
    p = Path(out)
    if p.is_dir():
        raise CliError(f"--out: {p} is a directory; give a .parquet file path (an existing "
                       "dataset is resumed)")
    check_output_dir(p.parent if str(p.parent) else Path("."), "--out", force=True)
    return p


def _build(a: argparse.Namespace) -> int:
    from .dataset import build_dataset
    _check_dataset_out(a.out)
    build_dataset(a.profile, a.samples, a.out, backend=a.backend, address=a.address,
                  workers=a.workers, seed=a.seed, duration_s=a.duration,
                  client_max_waiting=None if a.client_max_waiting == 0 else a.client_max_waiting,
                  flush_every=a.flush_every, flush_seconds=a.flush_seconds,
                  progress=not (a.no_progress or a.quiet))
    return 0


def _train(a: argparse.Namespace) -> int:
    check_input_file(a.data, "--data")
    check_output_dir(a.out, "--out", a.force, MODEL_FILES)
    from .train import train_all
    train_all(a.data, a.out, seed=a.seed, test_frac=a.test_frac, quick=a.quick,
              allow_stale_profile=a.allow_stale_profile)
    return 0


def _evaluate(a: argparse.Namespace) -> int:
    if (a.data is None) == (a.real is None):
        raise CliError("evaluate: give exactly one of --data or --real")
    if not Path(a.model).is_dir():
        raise CliError(f"--model: {a.model} is not a directory (expected a trained model "
                       "directory such as surrogates/trained/llama-3.1-8b-instruct)")
    from .evaluate import evaluate_real, evaluate_twin
    if a.data is not None:
        check_input_file(a.data, "--data")
        evaluate_twin(a.model, a.data, split=a.split)
    else:
        check_input_file(a.real, "--real")
        import pandas as pd
        try:
            evaluate_real(a.model, a.real)
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
            raise CliError(f"--real {a.real}: not a readable CSV ({e})") from None
    return 0


def _pipeline(a: argparse.Namespace) -> int:
    """build -> train -> evaluate for each profile (what regenerates surrogates/trained/)."""
    from .dataset import build_dataset
    from .evaluate import evaluate_twin
    from .train import train_all
    for prof in a.profile:
        check_output_dir(Path(a.out_dir) / prof, "--out-dir", a.force, MODEL_FILES)
    for prof in a.profile:
        data = Path(a.data_dir) / f"{prof}.parquet"
        out = Path(a.out_dir) / prof
        build_dataset(prof, a.samples, data, workers=a.workers, seed=a.seed,
                      backend=a.backend, address=a.address, progress=not (a.no_progress or a.quiet))
        train_all(data, out, seed=a.seed)
        evaluate_twin(out, data)
    return 0


def parser() -> argparse.ArgumentParser:
    from .dataset import (DEFAULT_CLIENT_MAX_WAITING, DEFAULT_DURATION_S, DEFAULT_FLUSH_EVERY,
                          DEFAULT_FLUSH_SECONDS)
    fmt = HelpFormatter
    p = argparse.ArgumentParser(prog="python -m surrogates", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=EXIT_CODES_EPILOG)
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="simulate single-GPU scenarios with the twin into Parquet",
                       formatter_class=fmt, epilog=EXIT_CODES_EPILOG,
                       description="Simulate random single-GPU scenarios at every valid Amax. "
                                   "Resumable: finished scenarios are saved as they finish "
                                   "(every --flush-every scenarios or --flush-seconds, and on "
                                   "Ctrl-C); rerun the same command to continue.")
    b.add_argument("--profile", required=True, help="GPU profile name or JSON path")
    b.add_argument("--samples", type=positive_int, required=True,
                   help="number of scenarios (adapter mixes); each gives one row per valid Amax")
    b.add_argument("--out", required=True, help="Parquet file (resumed when it exists)")
    b.add_argument("--backend", choices=("local", "ray"), default="local",
                   help="local processes or a Ray cluster")
    b.add_argument("--address", default=None, help="Ray cluster address (default: local Ray)")
    b.add_argument("--workers", type=int_at_least(1, 256), default=2, help="parallel processes")
    b.add_argument("--seed", type=seed_type, default=0, help="scenario seed (0 .. 2^32-1)")
    b.add_argument("--duration", type=float_above(0.0, MAX_DURATION_S), default=DEFAULT_DURATION_S,
                   help="simulated window of each twin run, seconds")
    b.add_argument("--client-max-waiting", type=nonneg_int, default=DEFAULT_CLIENT_MAX_WAITING,
                   help="client queue cap of the load generator, requests (0 = unbounded)")
    b.add_argument("--flush-every", type=positive_int, default=DEFAULT_FLUSH_EVERY,
                   help="save finished scenarios after this many")
    b.add_argument("--flush-seconds", type=float_above(0.0), default=DEFAULT_FLUSH_SECONDS,
                   help="... or after this many seconds, whichever comes first")
    b.add_argument("--no-progress", action="store_true", help="no progress bar (as --quiet)")
    b.add_argument("--quiet", action="store_true", help="no progress bar on stderr")
    b.set_defaults(func=_build)
    t = sub.add_parser("train", help="fit the models on a dataset", formatter_class=fmt,
                       epilog=EXIT_CODES_EPILOG)
    t.add_argument("--data", required=True, help="Parquet dataset written by build")
    t.add_argument("--out", required=True, help="model directory to write")
    t.add_argument("--seed", type=seed_type, default=0, help="training seed (0 .. 2^32-1)")
    t.add_argument("--test-frac", type=float_above(0.0, 0.95, inclusive=True), default=0.2,
                   help="fraction of scenarios held out (by scenario id hash)")
    t.add_argument("--quick", action="store_true", help="small models (tests)")
    t.add_argument("--allow-stale-profile", action="store_true",
                   help="train on data simulated with an older calibration (marked in manifest)")
    t.add_argument("--force", action="store_true", help="overwrite model files in --out")
    t.set_defaults(func=_train)
    e = sub.add_parser("evaluate", help="metrics on held-out twin scenarios or real runs",
                       formatter_class=fmt, epilog=EXIT_CODES_EPILOG)
    e.add_argument("--model", required=True, help="trained model directory")
    e.add_argument("--data", default=None, help="Parquet dataset written by build")
    e.add_argument("--real", default=None, help="real max-search CSV of the shared data")
    e.add_argument("--split", choices=("test", "all"), default="test",
                   help="rows of --data to use: the held-out split recorded at training, or all")
    e.set_defaults(func=_evaluate)
    q = sub.add_parser("pipeline", help="build + train + evaluate for one or more profiles",
                       formatter_class=fmt, epilog=EXIT_CODES_EPILOG)
    q.add_argument("--profile", nargs="+", default=["llama-3.1-8b-instruct", "qwen-2.5-7b-instruct"],
                   help="GPU profiles to build and train")
    q.add_argument("--samples", type=positive_int, required=True, help="scenarios per profile")
    q.add_argument("--data-dir", default="results/surrogates", help="where datasets go")
    q.add_argument("--out-dir", default="surrogates/trained", help="where model directories go")
    q.add_argument("--backend", choices=("local", "ray"), default="local",
                   help="local processes or a Ray cluster")
    q.add_argument("--address", default=None, help="Ray cluster address (default: local Ray)")
    q.add_argument("--workers", type=int_at_least(1, 256), default=2, help="parallel processes")
    q.add_argument("--seed", type=seed_type, default=0, help="seed (0 .. 2^32-1)")
    q.add_argument("--no-progress", action="store_true", help="no progress bar (as --quiet)")
    q.add_argument("--quiet", action="store_true", help="no progress bar on stderr")
    q.add_argument("--force", action="store_true", help="overwrite model files in --out-dir")
    q.set_defaults(func=_pipeline)
    return p


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    return run_command(lambda: a.func(a), INTERRUPTED_HINT)
