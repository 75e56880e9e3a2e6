"""Single-GPU scenario sampling and a resumable, seeded Parquet dataset built with the twin.

A **scenario** is one adapter mix on one GPU (N adapters with ranks and rates, a length model);
it is simulated once per valid Amax (``valid_amaxes``), giving one dataset row per (scenario,
Amax). Scenario ``i`` of a build with seed ``s`` depends only on ``(s, i)``
(``numpy.random.SeedSequence([s, i])``), so a build is reproducible regardless of worker count,
backend or order of completion, and growing ``--samples`` extends a dataset.

Mix styles (``STYLES``):

* ``loguniform`` — per-adapter rates log-uniform over a random spread (1x to 1000x), scaled to a
  target offered load;
* ``zipf`` — rates proportional to ``(k+1)^-s`` (skew ``s`` in [0, 2]), scaled to a target load;
* ``uniform`` — every adapter at the same rate, scaled to a target load;
* ``rateset`` — 1 to 3 rates from the shared benchmark's rate set cycled over the adapters and
  paired at random with the ranks, unscaled (as in the real max-search runs).

Target loads are log-uniform over [1.5k, 25k] tok/s (70 %, around a GPU's capacity) or
[50, 80k] tok/s (30 %). Ranks: one class, a random mix of classes, or a cycled triple from the
benchmark's size sets. Lengths: the default ShareGPT-like model (50 %) or rescaled to mean
input in [150, 320] and output in [130, 280] tokens.

Resumability: finished scenarios are written to ``<out>.parts/part-*.parquet`` as they finish
(every ``flush_every`` scenarios or ``flush_seconds``, and when the build is interrupted by
Ctrl-C or SIGTERM, which stop it after the scenarios already finished are saved) and merged into ``<out>`` at the end (existing rows are kept as they are; a rerun skips every scenario
already present in the file or its parts). File metadata (profile name and content hash, seed,
duration, client cap, schema version) must match on resume, else a ValueError names the field.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np
import pandas as pd

from twin.metrics import is_starved
from twin.server import SHARED_BENCHMARK_CLIENT_MAX_WAITING

from .features import FEATURES, RANK_CLASSES, gpu_features

SCHEMA_VERSION = 1
META_KEY = b"surrogates_dataset"

RATE_SET = (3.2, 1.6, 0.8, 0.4, 0.1, 0.05, 0.025, 0.0125, 0.00625, 0.003125)
SIZE_SETS = ((8, 8, 16), (8, 16, 16), (16, 16, 16), (8, 8, 32), (8, 16, 32), (16, 16, 32),
             (8, 32, 32), (8, 8, 8), (32, 32, 32))
AMAX_GRID = (8, 16, 32, 64, 96, 128, 160, 192, 256, 320, 384)
STYLES = ("loguniform", "zipf", "uniform", "rateset")
STYLE_P = (0.35, 0.25, 0.15, 0.25)

N_MAX = 512
RATE_MIN, RATE_MAX = 1e-3, 5.0
MEAN_IN_RANGE = (150.0, 320.0)
MEAN_OUT_RANGE = (130.0, 280.0)
DEFAULT_MEANS = (223.0, 196.3)
DEFAULT_DURATION_S = 3600.0
# the shared benchmark's client could not keep more than ~25.5k requests waiting
# (twin.server.SHARED_BENCHMARK_CLIENT_MAX_WAITING); overloaded throughput depends on it, so the
# dataset uses it too
DEFAULT_CLIENT_MAX_WAITING = SHARED_BENCHMARK_CLIENT_MAX_WAITING
# finished scenarios are saved every DEFAULT_FLUSH_EVERY scenarios or DEFAULT_FLUSH_SECONDS,
# whichever comes first, and on Ctrl-C / SIGTERM: a killed build loses at most the scenarios
# still running (one per worker) plus those finished in the last few seconds
DEFAULT_FLUSH_EVERY = 50
DEFAULT_FLUSH_SECONDS = 5.0

OUTCOMES = ("throughput_tps", "offered_tps", "offered_realised_tps", "starved", "memory_error",
            "mean_itl_ms", "p99_itl_ms", "mean_ttft_ms", "ttft_paper_ms", "preemptions",
            "mean_batch_size", "mean_distinct_adapters", "wall_s")


# ------------------------------------------------------------------------------ scenarios
@dataclass(frozen=True)
class Scenario:
    """One adapter mix on one GPU (simulated at each Amax in ``amaxes``)."""

    scenario_id: int
    style: str
    ranks: tuple[int, ...]
    rates: tuple[float, ...]
    mean_in: float
    mean_out: float
    amaxes: tuple[int, ...]
    sim_seed: int

    @property
    def n(self) -> int:
        return len(self.ranks)


def valid_amaxes(n: int, grid: Sequence[int] = AMAX_GRID) -> tuple[int, ...]:
    """Amax values worth simulating for N adapters: every grid value up to the first one >= N
    (larger slot counts behave like that one apart from using more memory)."""
    out = []
    for a in sorted(grid):
        out.append(a)
        if a >= n:
            break
    return tuple(out)


def _loguniform(rng: np.random.Generator, lo: float, hi: float) -> float:
    return float(math.exp(rng.uniform(math.log(lo), math.log(hi))))


def sample_scenario(seed: int, index: int, ranks_supported: Sequence[int] = RANK_CLASSES
                    ) -> Scenario:
    """Scenario ``index`` of a build seeded with ``seed`` (pure function of both)."""
    if isinstance(seed, bool) or int(seed) != seed or seed < 0:
        raise ValueError(f"seed: must be a non-negative integer, got {seed!r}")
    if isinstance(index, bool) or int(index) != index or index < 0:
        raise ValueError(f"index: must be a non-negative integer, got {index!r}")
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), int(index)]))
    ranks_supported = tuple(int(r) for r in ranks_supported)
    # N: half log-uniform over [1, N_MAX], half uniform over [16, N_MAX]
    if rng.random() < 0.5:
        n = int(round(_loguniform(rng, 1.0, N_MAX)))
    else:
        n = int(rng.integers(16, N_MAX + 1))
    n = max(1, min(N_MAX, n))
    # lengths
    if rng.random() < 0.5:
        mean_in, mean_out = DEFAULT_MEANS
    else:
        mean_in = float(rng.uniform(*MEAN_IN_RANGE))
        mean_out = float(rng.uniform(*MEAN_OUT_RANGE))
    # ranks
    u = rng.random()
    if u < 0.3:
        ranks = np.full(n, rng.choice(ranks_supported))
    elif u < 0.7:
        k = int(rng.integers(1, len(ranks_supported) + 1))
        sub = rng.choice(ranks_supported, size=k, replace=False)
        p = rng.dirichlet(np.ones(k))
        ranks = rng.choice(sub, size=n, p=p)
    else:
        sizes = [s for s in SIZE_SETS if set(s) <= set(ranks_supported)] or [ranks_supported]
        triple = sizes[int(rng.integers(len(sizes)))]
        ranks = np.array([triple[i % len(triple)] for i in range(n)])
    ranks = rng.permutation(ranks)
    # rates
    style = STYLES[int(rng.choice(len(STYLES), p=STYLE_P))]
    per_req = mean_in + mean_out
    if style == "rateset":
        k = int(rng.integers(1, 4))
        rs = rng.choice(RATE_SET, size=k, replace=False)
        rates = rng.permutation(np.array([rs[i % k] for i in range(n)], dtype=np.float64))
    else:
        if rng.random() < 0.7:
            target = _loguniform(rng, 1500.0, 25000.0)
        else:
            target = _loguniform(rng, 50.0, 80000.0)
        if style == "loguniform":
            spread = 10 ** rng.uniform(0.0, 3.0)
            shape = np.exp(rng.uniform(0.0, math.log(spread), size=n))
        elif style == "zipf":
            s = rng.uniform(0.0, 2.0)
            shape = rng.permutation((np.arange(n) + 1.0) ** -s)
        else:
            shape = np.ones(n)
        rates = shape * (target / (shape.sum() * per_req))
    rates = np.clip(rates, RATE_MIN, RATE_MAX)
    rates = np.round(rates, 9)
    rates = np.maximum(rates, RATE_MIN)
    sim_seed = int(rng.integers(2**31 - 1))
    return Scenario(int(index), style, tuple(int(r) for r in ranks), tuple(float(x) for x in rates),
                    float(mean_in), float(mean_out), valid_amaxes(n), sim_seed)


# ------------------------------------------------------------------------------ running
@lru_cache(maxsize=8)
def _profile(name: str):
    from twin.profile import load_profile
    return load_profile(name)


@lru_cache(maxsize=64)
def _lengths(mean_in: float, mean_out: float):
    from twin.sharegpt import sharegpt_lengths
    return sharegpt_lengths(mean_in, mean_out)


# profile fields that record where and when a profile was made, not what the twin simulates:
# kept out of the hash so recalibrating from the same data on another machine or day (the
# README's regenerate command) does not make trained surrogates look stale; ``serving`` (the
# served model id and vLLM settings, read by deployment files) does not change what is simulated
PROVENANCE_FIELDS = ("source", "fit_report", "serving")


def _simulated_content(d: dict) -> bytes:
    return json.dumps({k: v for k, v in d.items() if k not in PROVENANCE_FIELDS},
                      sort_keys=True).encode()


def profile_hash(name: str) -> str:
    """sha256 (first 16 hex) of what a profile makes the twin simulate (its canonical JSON
    without the provenance fields): detects recalibrated profiles."""
    return hashlib.sha256(_simulated_content(_profile(name).to_dict())).hexdigest()[:16]


def twin_source_hash() -> str:
    """sha256 (first 16 hex) of the twin's code and bundled profiles/length models: any change
    of the twin invalidates a dataset (checked on resume, reported by train)."""
    import twin
    root = Path(twin.__file__).resolve().parent
    h = hashlib.sha256()
    for f in sorted(list(root.glob("*.py")) + list((root / "profiles").glob("*.json"))):
        h.update(f.name.encode())
        data = f.read_bytes()
        if f.suffix == ".json":
            try:
                data = _simulated_content(json.loads(data))
            except (ValueError, AttributeError):
                pass
        h.update(data)
    return h.hexdigest()[:16]


def run_scenario(scenario: Scenario, profile_name: str, duration_s: float = DEFAULT_DURATION_S,
                 client_max_waiting: int | None = DEFAULT_CLIENT_MAX_WAITING) -> list[dict]:
    """Simulate one scenario at each of its Amax values; one row dict per Amax.

    Configurations without a KV-capacity entry are memory errors (no simulation needed).
    This is the task function every backend runs.
    """
    from twin.server import ServerConfig, simulate_server
    from twin.workload import Adapter

    prof = _profile(profile_name)
    lengths = _lengths(scenario.mean_in, scenario.mean_out)
    adapters = [Adapter(f"a{i}", r, x) for i, (r, x) in enumerate(zip(scenario.ranks, scenario.rates))]
    max_rank = max(scenario.ranks)
    rates = np.asarray(scenario.rates)
    rows = []
    for amax in scenario.amaxes:
        cfg = ServerConfig(max_loras=int(amax), max_lora_rank=max_rank,
                           client_max_waiting=client_max_waiting)
        m = simulate_server(prof, adapters, cfg, duration_s, lengths=lengths, seed=scenario.sim_seed)
        f = gpu_features(scenario.ranks, scenario.rates, int(amax), (lengths.mean_input, lengths.mean_output),
                         max_rank=max_rank)
        row = {"scenario_id": scenario.scenario_id, "amax": int(amax), "style": scenario.style,
               "sim_seed": scenario.sim_seed, "mean_in": scenario.mean_in,
               "mean_out": scenario.mean_out, "min_rate": float(rates.min()),
               "max_rate": float(rates.max())}
        row.update({f"f_{c}": float(v) for c, v in zip(FEATURES, f)})
        d = m.to_dict()
        for k in OUTCOMES:
            row[k] = d[k]
        row["starved"] = bool(d["starved"])
        row["memory_error"] = bool(d["memory_error"])
        rows.append(row)
    return rows


def _run_task(args: tuple) -> list[dict]:
    return run_scenario(*args)


# ------------------------------------------------------------------------------ files
def _parts_dir(out: Path) -> Path:
    return out.with_name(out.name + ".parts")


def _read_parquet(path: Path) -> pd.DataFrame:
    try:
        return pd.read_parquet(path)
    except (OSError, ValueError) as e:   # pyarrow's ArrowInvalid is a ValueError
        raise ValueError(f"data: {path} is not a readable Parquet dataset ({e})") from None


def _read_meta(path: Path) -> dict | None:
    import pyarrow.parquet as pq
    try:
        md = pq.read_schema(path).metadata or {}
    except (OSError, ValueError) as e:
        raise ValueError(f"data: {path} is not a readable Parquet dataset ({e})") from None
    raw = md.get(META_KEY)
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        raise ValueError(f"data: {path}: damaged dataset metadata") from None


def _write_table(df: pd.DataFrame, path: Path, meta: dict) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq
    table = pa.Table.from_pandas(df, preserve_index=False)
    md = dict(table.schema.metadata or {})
    md[META_KEY] = json.dumps(meta, sort_keys=True).encode()
    table = table.replace_schema_metadata(md)
    tmp = path.with_name(path.name + ".tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, path)


def _check_meta(found: dict | None, want: dict, where: Path) -> None:
    if found is None:
        raise ValueError(f"{where}: not a surrogates dataset (no metadata); refusing to add rows")
    for k in ("schema_version", "profile", "profile_hash", "twin_hash", "seed", "duration_s",
              "client_max_waiting"):
        if found.get(k) != want.get(k):
            raise ValueError(f"{where}: cannot resume: field {k!r} is {found.get(k)!r} in the "
                             f"file but {want.get(k)!r} in this build (use a new --out)")


def load_dataset(path: str | os.PathLike) -> pd.DataFrame:
    """Rows of a dataset file plus any parts not merged yet (an interrupted build).

    ``df.attrs["meta"]`` holds the build metadata.
    """
    path = Path(path)
    frames, meta = [], None
    if path.is_dir():
        raise ValueError(f"data: {path} is a directory, expected a Parquet dataset file")
    if path.exists():
        frames.append(_read_parquet(path))
        meta = _read_meta(path)
    parts = sorted(_parts_dir(path).glob("part-*.parquet")) if _parts_dir(path).exists() else []
    for p in parts:
        pm = _read_meta(p)
        if meta is not None:
            _check_meta(pm, meta, p)
        meta = meta or pm
        frames.append(_read_parquet(p))
    if not frames:
        raise ValueError(f"data: no dataset at {path}")
    df = pd.concat(frames, ignore_index=True)
    # the starvation label follows the twin's current rule, from the stored measurements (a
    # rule change needs no rebuild; rows are built with the default threshold; a server that
    # cannot start counts as starved, as the twin reports it)
    df["starved"] = is_starved(df["throughput_tps"].to_numpy(),
                               df["offered_realised_tps"].to_numpy()) | df["memory_error"].astype(bool)
    df = df.drop_duplicates(["scenario_id", "amax"], keep="first")
    df = df.sort_values(["scenario_id", "amax"]).reset_index(drop=True)
    df.attrs["meta"] = meta or {}
    return df


def merge_parts(out: str | os.PathLike) -> int:
    """Merge ``<out>.parts`` into ``<out>`` (existing rows kept first); returns the row count."""
    out = Path(out)
    pdir = _parts_dir(out)
    parts = sorted(pdir.glob("part-*.parquet")) if pdir.exists() else []
    if not parts:
        return len(pd.read_parquet(out)) if out.exists() else 0
    df = load_dataset(out)
    meta = df.attrs["meta"]
    _write_table(df, out, meta)
    for p in parts:
        p.unlink()
    try:
        pdir.rmdir()
    except OSError:
        pass
    return len(df)


# ------------------------------------------------------------------------------ backends
def _ignore_interrupts() -> None:
    """Worker start-up: Ctrl-C and SIGTERM are the parent's to handle (a worker interrupted
    inside the compiled kernel would print a chained numba SystemError)."""
    import signal
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _iter_local(tasks: list[tuple], workers: int) -> Iterable[list[dict]]:
    if workers <= 1:
        for t in tasks:
            yield _run_task(t)
        return
    import multiprocessing as mp
    with mp.get_context().Pool(workers, initializer=_ignore_interrupts) as pool:
        # leaving the block (done, error or interrupt) terminates the workers at once
        yield from pool.imap_unordered(_run_task, tasks)


class _StopRequest:
    """Turns Ctrl-C / SIGTERM into a request checked between scenarios, so the scenarios already
    finished are saved and no signal lands inside the compiled kernel. A second Ctrl-C stops at
    once."""

    def __init__(self) -> None:
        self.signal: int | None = None
        self._old: dict = {}

    def __enter__(self) -> "_StopRequest":
        import signal
        import threading
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        import signal
        if self.signal is not None:
            signal.signal(signal.SIGINT, signal.default_int_handler)
            raise KeyboardInterrupt
        self.signal = signum

    def __exit__(self, *exc) -> None:
        import signal
        for sig, old in self._old.items():
            signal.signal(sig, old)


def _iter_ray(tasks: list[tuple], workers: int, address: str | None) -> Iterable[list[dict]]:
    try:
        import ray
    except ImportError:
        raise ValueError("backend: 'ray' needs the optional Ray extra (pip install ray)") from None
    started = False
    if not ray.is_initialized():
        if address:
            ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)
        else:
            ray.init(num_cpus=max(1, workers), include_dashboard=False, ignore_reinit_error=True,
                     log_to_driver=False)
        started = True
    try:
        remote = ray.remote(num_cpus=1)(_run_task)
        pending = [remote.remote(t) for t in tasks]
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                yield ray.get(ref)
    finally:
        if started and not address:
            ray.shutdown()


# ------------------------------------------------------------------------------ build
def build_dataset(profile: str, samples: int, out: str | os.PathLike, *, backend: str = "local",
                  address: str | None = None, workers: int = 2, seed: int = 0,
                  duration_s: float = DEFAULT_DURATION_S,
                  client_max_waiting: int | None = DEFAULT_CLIENT_MAX_WAITING,
                  flush_every: int = DEFAULT_FLUSH_EVERY,
                  flush_seconds: float = DEFAULT_FLUSH_SECONDS, progress: bool = True,
                  log: Callable[[str], None] = print) -> dict:
    """Build (or resume) a dataset of ``samples`` scenarios; returns a summary dict.

    Finished scenarios are saved every ``flush_every`` scenarios or ``flush_seconds``; Ctrl-C or
    SIGTERM saves them and raises ``KeyboardInterrupt`` (rerun the same call to resume)."""
    from twin.profile import available_profiles
    if profile not in available_profiles() and not Path(profile).exists():
        raise ValueError(f"profile: unknown profile {profile!r}; available: {available_profiles()}")
    if isinstance(samples, bool) or int(samples) != samples or samples < 1:
        raise ValueError(f"samples: must be a positive integer, got {samples!r}")
    if backend not in ("local", "ray"):
        raise ValueError(f"backend: must be 'local' or 'ray', got {backend!r}")
    if isinstance(workers, bool) or int(workers) != workers or workers < 1:
        raise ValueError(f"workers: must be a positive integer, got {workers!r}")
    if not (math.isfinite(duration_s) and duration_s > 0):
        raise ValueError(f"duration_s: must be > 0, got {duration_s!r}")
    if isinstance(flush_every, bool) or int(flush_every) != flush_every or flush_every < 1:
        raise ValueError(f"flush_every: must be a positive integer, got {flush_every!r}")
    if not (math.isfinite(flush_seconds) and flush_seconds > 0):
        raise ValueError(f"flush_seconds: must be > 0, got {flush_seconds!r}")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    prof = _profile(profile)
    meta = {"schema_version": SCHEMA_VERSION, "profile": prof.name,
            "profile_hash": profile_hash(profile), "twin_hash": twin_source_hash(),
            "seed": int(seed),
            "duration_s": float(duration_s), "client_max_waiting": client_max_waiting,
            "features": list(FEATURES), "supported_ranks": list(prof.supported_ranks)}
    done: set[int] = set()
    if out.exists() or _parts_dir(out).exists():
        existing = load_dataset(out)
        _check_meta(existing.attrs["meta"], meta, out)
        done = set(int(x) for x in existing["scenario_id"].unique())
    todo = [i for i in range(int(samples)) if i not in done]
    log(f"build: profile={prof.name} samples={samples} already={len(done)} todo={len(todo)} "
        f"backend={backend} workers={workers} seed={seed}")
    tasks = [(sample_scenario(seed, i, prof.supported_ranks), profile, float(duration_s),
              client_max_waiting) for i in todo]
    it = (_iter_local(tasks, int(workers)) if backend == "local"
          else _iter_ray(tasks, int(workers), address))
    pdir = _parts_dir(out)
    buf: list[dict] = []
    n_done = n_rows = 0
    t0 = time.perf_counter()
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=len(tasks), desc=f"scenarios ({prof.name})", unit="sc", smoothing=0.05)

    last_flush = time.monotonic()
    pending = 0

    def flush() -> None:
        nonlocal buf, last_flush, pending
        last_flush, pending = time.monotonic(), 0
        if not buf:
            return
        pdir.mkdir(parents=True, exist_ok=True)
        name = pdir / f"part-{time.time_ns()}-{os.getpid()}.parquet"
        _write_table(pd.DataFrame(buf), name, meta)
        buf = []

    with _StopRequest() as stop:
        try:
            for rows in it:
                buf.extend(rows)
                n_done += 1
                pending += 1
                n_rows += len(rows)
                if bar is not None:
                    bar.update(1)
                if pending >= flush_every or time.monotonic() - last_flush >= flush_seconds:
                    flush()
                if stop.signal is not None:
                    break
        finally:
            if bar is not None:
                bar.close()
            flush()
            if hasattr(it, "close"):
                it.close()            # terminates the worker pool
    if stop.signal is not None:
        log(f"build: stopped by signal {stop.signal} after {n_done} scenarios; they are saved "
            f"in {pdir}")
        raise KeyboardInterrupt
    elapsed = time.perf_counter() - t0
    total = merge_parts(out) if (out.exists() or pdir.exists()) else 0
    rate = 60.0 * n_done / elapsed if elapsed > 0 and n_done else float("nan")
    summary = {"scenarios_run": n_done, "rows_added": n_rows, "rows_total": total,
               "elapsed_s": round(elapsed, 2), "scenarios_per_min": round(rate, 2),
               "rows_per_min": round(60.0 * n_rows / elapsed, 2) if elapsed > 0 and n_done else float("nan")}
    log("build: " + " ".join(f"{k}={v}" for k, v in summary.items()))
    return summary


def synthetic_feature_rows(seed: int, n_mixes: int, ranks_supported: Sequence[int] = RANK_CLASSES,
                           scales_per_mix: int = 3, scale_range: tuple[float, float] = (0.3, 3.0)
                           ) -> np.ndarray:
    """GPU feature rows of sampled scenarios *without simulating them* (for distillation):
    mixes ``sample_scenario(seed, i)``, each at every valid Amax and at ``scales_per_mix``
    random rate scalings (log-uniform over ``scale_range``; rates kept within the sampler's
    [RATE_MIN, RATE_MAX])."""
    from .features import adapter_feature_matrix
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), 424242]))
    rows = []
    for i in range(int(n_mixes)):
        sc = sample_scenario(seed, i, ranks_supported)
        base_rates = np.asarray(sc.rates)
        top = max(sc.ranks)
        for _ in range(scales_per_mix):
            c = _loguniform(rng, *scale_range)
            rates = np.clip(base_rates * c, RATE_MIN, RATE_MAX)
            add = adapter_feature_matrix(sc.ranks, rates, (sc.mean_in, sc.mean_out)).sum(axis=0)
            for a in sc.amaxes:
                rows.append(np.concatenate([add, [float(top), float(a)]]))
    return np.asarray(rows)
