"""Simulate a placement: several GPUs, each its own server, simulated in parallel processes.

An adapter may sit on several GPUs with a routing split ``share`` (fractions summing to 1 over
its GPUs). Routing each request independently at random splits a Poisson stream into independent
Poisson streams of rate ``share x rate``, so every GPU can be simulated on its own.

Backends. The GPUs run in a local process pool (``backend="local"``, the default) or as Ray tasks
(``backend="ray"``: a local Ray instance, or the cluster at ``address``); both run the same
seeded job per GPU, so the results are identical. :func:`use_backend` installs one pool for every
fleet replay inside it (a search verifies many placements; the CLI's ``--backend``).
"""

from __future__ import annotations

import os
import socket
from collections import deque
from concurrent.futures import Executor, ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Callable, Iterable, Iterator, Sequence

from .cli_support import progress
from .lengths import LengthModel
from .metrics import RunMetrics
from .profile import GpuProfile, load_profile
from .server import ServerConfig, simulate_server
from .workload import Adapter


@dataclass(frozen=True)
class GpuAssignment:
    """One GPU of a placement: its profile (a shipped name, a file path or a loaded
    :class:`GpuProfile`), server configuration and (adapter, share) pairs."""

    profile: str | GpuProfile
    config: ServerConfig
    adapters: tuple[tuple[Adapter, float], ...]


@dataclass(frozen=True)
class FleetResult:
    """Per-GPU metrics and the placement's verdict (feasible = every GPU is accepted: none
    starves, fails memory or misses its latency SLO)."""

    per_gpu: tuple[RunMetrics, ...]

    @property
    def feasible(self) -> bool:
        return all(m.accepted for m in self.per_gpu)

    @property
    def throughput_tps(self) -> float:
        return sum(m.throughput_tps for m in self.per_gpu)

    @property
    def offered_tps(self) -> float:
        return sum(m.offered_tps for m in self.per_gpu)


def check_shares(gpus: Sequence[GpuAssignment], tol: float = 1e-6) -> None:
    """Every adapter's shares must be positive and sum to 1 over the GPUs that serve it."""
    total: dict[str, float] = {}
    for g, gpu in enumerate(gpus):
        if not gpu.adapters:
            raise ValueError(f"gpu {g}: no adapters assigned")
        for a, share in gpu.adapters:
            if not 0.0 < share <= 1.0:
                raise ValueError(f"gpu {g}, adapter '{a.id}': share must be in (0, 1], got {share}")
            total[a.id] = total.get(a.id, 0.0) + share
    for aid, s in total.items():
        if abs(s - 1.0) > tol:
            raise ValueError(f"adapter '{aid}': routing shares sum to {s:.6f}, not 1")


# set by command lines (``optim solve`` without --quiet): a progress bar over simulated GPUs
show_progress = False

BACKENDS = ("local", "ray")
# the pool installed by ``use_backend`` (None: each replay starts its own local pool)
_installed_pool: object | None = None


class FleetBackendError(ValueError):
    """A bad backend choice: ``field`` names the option (``backend``, ``address``, ``workers``)."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field, self.reason = field, reason


def _simulate_one(args: tuple) -> RunMetrics:
    profile, gpu, duration_s, lengths, seed, *rest = args
    prof = profile if isinstance(profile, GpuProfile) else load_profile(profile)
    adapters = [a if share == 1.0 else replace(a, rate=a.rate * share) for a, share in gpu.adapters]
    return simulate_server(prof, adapters, gpu.config, duration_s, lengths=lengths, seed=seed,
                           stop_below=rest[0] if rest else None)


def simulate_fleet(gpus: Sequence[GpuAssignment], duration_s: float = 3600.0,
                   lengths: LengthModel | None = None, seed: int = 0,
                   workers: int | None = None, pool: Executor | None = None,
                   check_routing: bool = True, seeds: Sequence[int] | None = None,
                   backend: str | None = None, address: str | None = None,
                   stop_below: float | None = None) -> FleetResult:
    """Simulate every GPU (GPU ``g`` uses seed ``seed + g``, or ``seeds[g]`` when given).

    Where: ``pool`` (any object with ``.map``, reused across calls) when given; else with
    ``backend="ray"`` as Ray tasks on a local Ray instance of ``workers`` CPUs or on the cluster
    at ``address``; else in the pool installed by :func:`use_backend` (unless ``workers=1`` or
    ``backend="local"``); else in ``workers`` local processes (default: all cores; 1 = in this
    process). ``check_routing=False`` runs the GPUs as independent what-if replays (an adapter
    may then appear on several GPUs with any shares); ``seeds`` lets such replays draw the
    workload a given GPU of a placement would see. ``stop_below``: each replay may stop once
    it is certain to score below it (``twin.server.simulate_requests``; what-if searches)."""
    check_backend(backend, address, workers)
    if check_routing:
        check_shares(gpus)
    if seeds is not None and len(seeds) != len(gpus):
        raise ValueError(f"seeds: {len(seeds)} given for {len(gpus)} GPUs")
    jobs = [(gpu.profile, gpu, duration_s, lengths, seed + g if seeds is None else int(seeds[g]),
             stop_below) for g, gpu in enumerate(gpus)]
    if not jobs:                    # nothing to replay (a what-if search with no Amax left)
        return FleetResult(())

    def shown(results):
        return tuple(progress(results, total=len(jobs), desc="twin replay", unit="GPU",
                              quiet=not show_progress))

    if pool is None and backend == "ray":
        with RayPool(workers, address) as ray_pool:
            return FleetResult(shown(ray_pool.map(_simulate_one, jobs)))
    if pool is None and backend is None and workers != 1 and len(jobs) > 1:
        pool = _installed_pool
    if pool is not None:
        return FleetResult(shown(pool.map(_simulate_one, jobs)))
    workers = workers or os.cpu_count() or 1
    if workers == 1 or len(jobs) == 1:
        return FleetResult(shown(_simulate_one(j) for j in jobs))
    with worker_pool(min(workers, len(jobs))) as ex:
        return FleetResult(shown(ex.map(_simulate_one, jobs)))


@contextmanager
def worker_pool(workers: int) -> Iterator[ProcessPoolExecutor]:
    """``workers`` local processes for replays, ended at once when the block is left by an
    exception (Ctrl-C, SIGTERM, an error): leaving a plain ``ProcessPoolExecutor`` block waits
    for the replays already running, which may take minutes. Workers leave Ctrl-C to the
    parent. Tasks not started are dropped either way."""
    ex = ProcessPoolExecutor(max_workers=workers, initializer=_leave_ctrl_c_to_parent)
    ended = False
    try:
        yield ex
        ended = True
    finally:
        if ended:
            ex.shutdown(wait=True, cancel_futures=True)
        else:       # the pool then fails what is left itself (cancelling too races with it)
            _quiet_broken_pool_race()
            terminate_workers(ex)
            ex.shutdown(wait=True)


def _quiet_broken_pool_race() -> None:
    """Keep a known CPython 3.11 race out of the output of a stopped command: when worker
    processes end while ``Executor.map``'s iterator cancels its futures, the pool's manager
    thread raises ``InvalidStateError`` setting the broken-pool error on a cancelled future
    (nothing is lost: the futures are cancelled). Any other thread exception still prints."""
    import threading
    from concurrent.futures import InvalidStateError
    from concurrent.futures.process import _ExecutorManagerThread

    previous = threading.excepthook
    if getattr(previous, "_quiet_broken_pool", False):
        return

    def hook(args) -> None:
        if isinstance(args.thread, _ExecutorManagerThread) and \
                issubclass(args.exc_type, InvalidStateError):
            return
        previous(args)

    hook._quiet_broken_pool = True
    threading.excepthook = hook


def installed_pool() -> object | None:
    """The pool :func:`use_backend` installed for the current block (None outside one)."""
    return _installed_pool


def terminate_workers(ex: ProcessPoolExecutor) -> None:
    """Stop the worker processes of ``ex`` now (SIGTERM, which they leave at its default:
    a worker inside the compiled kernel would not run a Python handler)."""
    for proc in list((getattr(ex, "_processes", None) or {}).values()):
        try:
            proc.terminate()
        except (OSError, ValueError, AttributeError):
            pass


def _leave_ctrl_c_to_parent() -> None:
    """Worker start-up: Ctrl-C reaches the parent, which stops the fleet; a worker interrupted
    inside the compiled kernel would print a traceback of its own. SIGTERM gets its default
    action back (the parent's handler turns it into Ctrl-C, which a worker must not do), so
    that the parent can end a worker at once."""
    import signal
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


# ------------------------------------------------------------------------------ backends
def check_backend(backend: str | None, address: str | None, workers: int | None = None) -> None:
    """Check the backend options before any work: a known backend, an address only with Ray,
    a positive worker count."""
    if backend is not None and backend not in BACKENDS:
        raise FleetBackendError("backend", f"must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if address is not None and backend != "ray":
        raise FleetBackendError("address", "a Ray cluster address needs backend 'ray'")
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int)
                                or workers < 1):
        raise FleetBackendError("workers", f"must be an integer >= 1, got {workers!r}")


def _ray_module():
    try:
        import ray
    except ImportError:
        raise FleetBackendError("backend", "'ray' needs the optional Ray extra "
                                "(pip install 'lora-placement[ray]')") from None
    return ray


def _check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Fail fast on an address nothing listens at (``ray.init`` would retry for minutes):
    ``host:port`` (a cluster's GCS, ``ray start --head`` prints it), ``ray://host:port`` (Ray
    Client, port 10001 by default) or ``auto`` (the cluster this machine belongs to)."""
    if address == "auto":
        return
    rest = address[len("ray://"):] if address.startswith("ray://") else address
    host, sep, port_s = rest.rpartition(":")
    if not address.startswith("ray://") and not sep:
        raise FleetBackendError("address", f"expected HOST:PORT, ray://HOST[:PORT] or 'auto', "
                                f"got {address!r}")
    if not sep:
        host, port_s = rest, "10001"
    host = host.strip("[]")
    if not host or not port_s.isdigit() or not 1 <= int(port_s) <= 65535:
        raise FleetBackendError("address", f"expected HOST:PORT with a port in 1..65535, got "
                                f"{address!r}")
    try:
        socket.create_connection((host, int(port_s)), timeout=timeout_s).close()
    except OSError as e:
        raise FleetBackendError("address", f"no Ray cluster reachable at {address!r} "
                                f"({e.strerror or e})") from None


class RayPool:
    """Fleet jobs as Ray tasks (one CPU each): on a new local Ray instance with ``workers`` CPUs
    (default: all cores), or on the cluster at ``address`` (its nodes need this package
    installed). ``map`` yields results in job order and keeps at most ``in_flight`` tasks
    submitted, so memory stays bounded for any fleet size. A Ray session already open in this
    process is reused (and left open)."""

    def __init__(self, workers: int | None = None, address: str | None = None,
                 in_flight: int | None = None) -> None:
        check_backend("ray", address, workers)
        ray = _ray_module()
        self._ray, self._started = ray, False
        if not ray.is_initialized():
            import logging
            kw = dict(include_dashboard=False, log_to_driver=False,
                      logging_level=logging.ERROR, ignore_reinit_error=True)
            if address is not None:
                _check_reachable(address)
                try:
                    ray.init(address=address, **kw)
                except (ConnectionError, RuntimeError, ValueError) as e:
                    raise FleetBackendError("address", f"could not join the Ray cluster at "
                                            f"{address!r}: {e}") from None
            else:
                ray.init(address="local", num_cpus=workers or os.cpu_count() or 1, **kw)
            self._started = True
        cpus = int(ray.cluster_resources().get("CPU", 1))
        self.in_flight = max(1, int(in_flight or 2 * cpus))
        self._remote: dict[Callable, object] = {}

    def map(self, fn: Callable, jobs: Iterable) -> Iterator:
        """``fn(job)`` for every job as Ray tasks; results in job order."""
        ray = self._ray
        remote = self._remote.get(fn)
        if remote is None:
            remote = self._remote[fn] = ray.remote(num_cpus=1)(fn)
        todo, pending = iter(jobs), deque()
        try:
            for job in todo:
                pending.append(remote.remote(job))
                if len(pending) >= self.in_flight:
                    yield ray.get(pending.popleft())
            while pending:
                yield ray.get(pending.popleft())
        finally:   # stopped early (an error, Ctrl-C): cancel what was submitted
            for ref in pending:
                ray.cancel(ref, force=True)

    def shutdown(self) -> None:
        """Close the Ray session if this pool opened it."""
        if self._started and self._ray.is_initialized():
            self._ray.shutdown()
        self._started = False

    def __enter__(self) -> "RayPool":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()


@contextmanager
def use_backend(backend: str = "local", address: str | None = None,
                workers: int | None = None) -> Iterator[object | None]:
    """Run every fleet replay inside the block on one pool: ``"ray"`` installs a
    :class:`RayPool` (local Ray, or the cluster at ``address``) and shuts it down on exit;
    ``"local"`` keeps ``workers`` local processes (default: all cores) for every replay of the
    block (``installed_pool``; one process runs them in place). Errors name
    the option (``backend``, ``address``) and are raised before any simulation runs."""
    global _installed_pool
    check_backend(backend, address, workers)
    if backend == "local":
        n = workers or os.cpu_count() or 1
        if n <= 1 or _installed_pool is not None:
            yield None
            return
        # one set of worker processes for every replay of the block: starting a pool (and
        # loading the compiled kernel in each worker) costs 1.5-2 s, paid once, not per replay
        with worker_pool(n) as ex:
            _installed_pool = ex
            try:
                yield None
            finally:
                _installed_pool = None
        return
    previous = _installed_pool
    with RayPool(workers, address) as pool:
        _installed_pool = pool
        try:
            yield pool
        finally:
            _installed_pool = previous
