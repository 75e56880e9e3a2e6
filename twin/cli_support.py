"""Command-line conventions shared by ``python -m twin``, ``python -m optim`` and
``python -m surrogates``: option types that reject bad values with the option's name, output
paths checked before any work starts, progress bars on stderr, exit codes, and the one place that
turns an error or Ctrl-C into a one-line message instead of a traceback.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence, TypeVar

T = TypeVar("T")

EXIT_OK = 0
EXIT_REJECTED = 1      # optim solve: the twin rejected the placement
EXIT_USAGE = 2         # bad input: option, file, field (the message names it)
EXIT_INFEASIBLE = 3    # optim solve: the instance cannot be served
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT)

SEED_MAX = 2**32 - 1   # numpy's legacy bound; every seed of the toolkit fits it

EXIT_CODES_EPILOG = (
    "exit codes: 0 success; 1 the twin rejected the placement (optim solve) or no "
    "configuration passes (twin maxpack); 2 bad input "
    "(the message names the option, file or field); 3 the instance is infeasible (optim solve); "
    "130 interrupted (Ctrl-C)")


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """``--help`` shows each option's default, except when there is none (None / a flag)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if (action.default is None or action.default is False
                or action.default == argparse.SUPPRESS or action.required):
            return action.help or ""
        return super()._get_help_string(action)


class CliError(ValueError):
    """A bad command-line argument; printed as one line, without a traceback."""


SLO_HELP = ("latency SLO every GPU must meet in the twin, besides the throughput rule: "
            "NAME=MS pairs among ttft_p99_ms, itl_p99_ms, ttft_mean_ms, e2e_p99_ms, with "
            "optional attainment=0.99 (the quantile the p99 bounds apply at), warmup_s=60 "
            "(s excluded from judgement) and latency=client (what a benchmark client sees: the "
            "engine plus the fitted API-server latency tail; latency=engine: the engine's step "
            "times alone), e.g. --slo ttft_p99_ms=500,itl_p99_ms=100")


def slo_argument(text: str | None, option: str = "--slo"):
    """The ``twin.slo.Slo`` of a ``--slo`` value (None when not given); a bad value is a
    ``CliError`` naming the option and the field."""
    if text is None:
        return None
    from .slo import Slo
    try:
        return Slo.parse(text, option)
    except ValueError as e:
        raise CliError(str(e)) from None


def slo_class_argument(text: str, option: str = "--slo-class") -> tuple[str, dict[str, float]]:
    """(class name, bounds) of a ``--slo-class CLASS:NAME=MS[,NAME=MS...]`` value; a bad value
    is a ``CliError`` naming the option and the field."""
    from .slo import SLO_BOUNDS
    name, colon, rest = str(text).partition(":")
    if not colon or not name.strip():
        raise CliError(f"{option}: '{text}' is not CLASS:NAME=MS[,...] (e.g. "
                       "premium:ttft_p99_ms=300)")
    bounds: dict[str, float] = {}
    for part in (p.strip() for p in rest.split(",")):
        if not part:
            continue
        key, eq, value = part.partition("=")
        key = key.strip()
        if not eq or key not in SLO_BOUNDS:
            raise CliError(f"{option} {name.strip()}: '{part}' is not NAME=MS with NAME among "
                           f"{', '.join(SLO_BOUNDS)}")
        try:
            bounds[key] = float(value)
        except ValueError:
            raise CliError(f"{option} {name.strip()}: {key}: '{value}' is not a number") from None
    if not bounds:
        raise CliError(f"{option} {name.strip()}: state at least one bound "
                       f"({', '.join(SLO_BOUNDS)})")
    return name.strip(), bounds


# ----------------------------------------------------------------------------- option types
def _number(text: str, conv: Callable[[str], T], what: str) -> T:
    try:
        return conv(text)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None


def int_at_least(lo: int, hi: int | None = None) -> Callable[[str], int]:
    """argparse type: an integer in ``[lo, hi]`` (the message names the bound and the value)."""
    def conv(text: str) -> int:
        v = _number(text, int, "an integer")
        if v < lo or (hi is not None and v > hi):
            rng = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
            raise argparse.ArgumentTypeError(f"must be an integer {rng}, got {text!r}")
        return v
    conv.__name__ = f"int>={lo}"
    return conv


def float_above(lo: float, hi: float | None = None, *, inclusive: bool = False
                ) -> Callable[[str], float]:
    """argparse type: a finite float ``> lo`` (``>= lo`` with ``inclusive``) and ``<= hi``."""
    def conv(text: str) -> float:
        v = _number(text, float, "a number")
        ok = math.isfinite(v) and (v >= lo if inclusive else v > lo) and (hi is None or v <= hi)
        if not ok:
            rng = f"{'>=' if inclusive else '>'} {lo:g}" + ("" if hi is None else f" and <= {hi:g}")
            raise argparse.ArgumentTypeError(f"must be a finite number {rng}, got {text!r}")
        return v
    conv.__name__ = f"float>{lo}"
    return conv


seed_type = int_at_least(0, SEED_MAX)
positive_int = int_at_least(1)
nonneg_int = int_at_least(0)
positive_float = float_above(0.0)


# ----------------------------------------------------------------------------- outputs
def check_output(path: str | os.PathLike | None, option: str, force: bool) -> Path | None:
    """Refuse an output path *before* the work starts: a directory, an existing file without
    ``--force``, or a parent that is not a writable directory."""
    if path is None:
        return None
    p = Path(path)
    if str(path).strip() == "":
        raise CliError(f"{option}: empty path")
    if p.is_dir():
        raise CliError(f"{option}: {p} is a directory; give a file path")
    if p.exists() and not force:
        raise CliError(f"{option}: {p} exists; pass --force to overwrite it")
    _check_creatable(p.parent, p, option)
    return p


def _check_creatable(folder: Path, target: Path, option: str) -> None:
    """``folder`` exists as a writable directory or can be created (its nearest existing
    ancestor is one)."""
    anc = folder
    while not anc.exists():
        anc = anc.parent
    if not anc.is_dir():
        raise CliError(f"{option}: cannot create {target}: {anc} is not a directory")
    if not os.access(anc, os.W_OK):
        raise CliError(f"{option}: cannot write {target}: {anc} is not writable")


def check_output_dir(path: str | os.PathLike, option: str, force: bool,
                     must_be_new_files: Sequence[str] = ()) -> Path:
    """Refuse an output *directory* before the work: a file at that path, or (without
    ``--force``) any of ``must_be_new_files`` already inside it."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise CliError(f"{option}: {p} is a file; give a directory")
    if not force:
        clash = [f for f in must_be_new_files if (p / f).exists()]
        if clash:
            raise CliError(f"{option}: {p} already holds {', '.join(clash)}; pass --force to "
                           "overwrite")
    _check_creatable(p, p, option)
    return p


def write_output(p: Path, text: str) -> None:
    """Write a checked output file (parent directories created)."""
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text if text.endswith("\n") else text + "\n", encoding="utf-8")


def check_input_file(path: str | os.PathLike, option: str) -> Path:
    """An existing regular file, else a ``CliError`` naming the option."""
    p = Path(path)
    if not p.exists():
        raise CliError(f"{option}: {p} does not exist")
    if p.is_dir():
        raise CliError(f"{option}: {p} is a directory; give a file")
    return p


# ----------------------------------------------------------------------------- progress
def progress(iterable: Iterable[T] | None = None, *, total: int | None = None, desc: str = "",
             quiet: bool = False, unit: str = "it"):
    """A ``tqdm`` bar on stderr, disabled by ``quiet`` (``--quiet``); leaves no bar behind.
    Iterate over it, or call ``update(k)`` / ``close()`` when ``iterable`` is None."""
    from tqdm import tqdm
    return tqdm(iterable, total=total, desc=desc, unit=unit, file=sys.stderr, leave=False,
                dynamic_ncols=True, disable=quiet)


# ----------------------------------------------------------------------------- interrupts
class Interrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM, carrying the interrupted work's best result so far (``partial``, None
    when there is none) so that a command can still write it (marked interrupted)."""

    def __init__(self, partial: Any = None, note: str = "") -> None:
        super().__init__(note)
        self.partial = partial
        self.note = note


def run_interruptible(work: Callable[[], T], stop: Callable[[], object] | None = None,
                      grace_s: float = 1.4) -> tuple[T | None, bool]:
    """Run ``work()`` — one long call into C code (a CP-SAT or HiGHS solve) during which Python
    cannot run its signal handlers — in a helper thread, so that Ctrl-C and SIGTERM reach the
    main thread at once. On an interrupt ``stop()`` asks the solver to end its search (it is
    called repeatedly: the solver may not have started yet) and ``work``'s result is awaited for
    ``grace_s`` seconds. Returns ``(result, interrupted)``; the result is None when ``work`` did
    not return in time (its daemon thread is then left inside C code: ``run_command`` ends
    the process at once, without the teardown that would abort under it) or failed after the
    interrupt. Outside the main thread ``work()`` simply runs."""
    if threading.current_thread() is not threading.main_thread():
        return work(), False
    box: dict[str, Any] = {}
    done = threading.Event()

    def target() -> None:
        try:
            box["result"] = work()
        except BaseException as e:      # re-raised in the caller's thread
            box["error"] = e
        finally:
            done.set()

    # the solver thread may redirect the process's stdout/stderr while it runs (pyomo captures
    # HiGHS's log at the descriptor level); an abandoned thread must not keep them
    saved = _save_streams()
    th = threading.Thread(target=target, name="solver", daemon=True)
    th.start()
    try:
        # Event.wait, not Thread.join: an interrupted join marks the thread finished (3.11)
        while not done.wait(0.05):
            pass
    except KeyboardInterrupt:
        end = time.monotonic() + grace_s
        while not done.is_set() and time.monotonic() < end:
            if stop is not None:
                try:
                    stop()
                except Exception:       # the solver object may not exist yet
                    pass
            done.wait(0.05)
        if not done.is_set():
            _restore_streams(saved)
            return None, True
        return (None if "error" in box else box.get("result")), True
    finally:
        if done.is_set():
            _close_streams(saved)
    if "error" in box:
        raise box["error"]
    return box.get("result"), False


def _save_streams() -> tuple[Any, Any, list[int]]:
    fds = []
    for fd in (1, 2):
        try:
            fds.append(os.dup(fd))
        except OSError:
            fds.append(-1)
    return sys.stdout, sys.stderr, fds


def _restore_streams(saved: tuple[Any, Any, list[int]]) -> None:
    out, err, fds = saved
    for fd, copy in zip((1, 2), fds):
        if copy >= 0:
            try:
                os.dup2(copy, fd)
            except OSError:
                pass
    sys.stdout, sys.stderr = out, err


def _close_streams(saved: tuple[Any, Any, list[int]]) -> None:
    for copy in saved[2]:
        if copy >= 0:
            try:
                os.close(copy)
            except OSError:
                pass


def _raise_interrupt(signum, frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _exit_interrupted(signum, frame) -> None:
    try:
        sys.stderr.write("interrupted\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    os._exit(EXIT_INTERRUPTED)


def exit_early_on_signals() -> None:
    """Start-up of a command, before its heavy imports (numba, solvers: seconds on a cold
    machine): Ctrl-C and SIGTERM end the process at once with ``interrupted`` and exit 130
    (without this, SIGTERM would kill it by its default action and Ctrl-C print an import's
    traceback). :func:`run_command` then takes over. A SIGINT the process inherited as
    ignored (a background job) stays ignored."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _exit_interrupted)
    if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
        signal.signal(signal.SIGTERM, _exit_interrupted)


# ----------------------------------------------------------------------------- running
def _interrupted(e: BaseException) -> bool:
    while e is not None:
        if isinstance(e, KeyboardInterrupt):
            return True
        e = e.__context__ or e.__cause__
    return False


def run_command(func: Callable[[], int], interrupted_hint: str = "") -> int:
    """Run a command: errors that name their field become ``error: ...`` (exit 2), Ctrl-C a
    one-line ``interrupted`` and the process ends at once with exit 130 (no interpreter
    teardown), even when a compiled kernel wrapped it. SIGTERM is handled as Ctrl-C while the
    command runs."""
    old_term = None
    if threading.current_thread() is threading.main_thread():
        try:
            old_term = signal.signal(signal.SIGTERM, _raise_interrupt)
            if signal.getsignal(signal.SIGINT) is _exit_interrupted:   # exit_early_on_signals
                signal.signal(signal.SIGINT, signal.default_int_handler)
        except (ValueError, OSError):
            old_term = None
    try:
        return _run(func, interrupted_hint)
    finally:
        if old_term is not None:
            signal.signal(signal.SIGTERM, old_term)


def _run(func: Callable[[], int], interrupted_hint: str) -> int:
    try:
        return func()
    except KeyboardInterrupt:
        pass
    except BrokenPipeError:              # output piped into e.g. `head`: stop quietly
        sys.stderr.close()
        return EXIT_OK
    except (ValueError, OSError) as e:   # our errors name the field/file and the reason
        msg = str(e)
        if isinstance(e, OSError) and e.filename is not None and str(e.filename) not in msg:
            msg = f"{e.filename}: {msg}"
        print(f"error: {msg}", file=sys.stderr)
        return EXIT_USAGE
    except SystemError as e:             # numba wraps a Ctrl-C raised inside a kernel
        if not _interrupted(e):
            raise
    print("interrupted" + (f"; {interrupted_hint}" if interrupted_hint else ""), file=sys.stderr)
    # everything the command keeps is written by now: leave at once, output flushed. A normal
    # exit would run the interpreter's teardown (seconds for a large solve, measured up to 2.9 s
    # after the last line) and, with a solver thread still inside C code, the C++ runtime's
    # teardown under it (abort)
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except (OSError, ValueError):
            pass
    os._exit(EXIT_INTERRUPTED)
