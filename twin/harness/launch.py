"""Start and stop one server per GPU: ``python -m twin serve`` (CPU) or ``vllm serve`` (GPU).

Both get the same vLLM flags (``--enable-lora --max-loras --max-cpu-loras --max-lora-rank
--max-num-seqs --lora-modules``). Twin servers listen on loopback, port 0, and announce
``listening on http://HOST:PORT``; a vLLM server gets a free loopback port and
``CUDA_VISIBLE_DEVICES=<gpu id>`` and is ready when ``GET /health`` answers 200. Every server is
stopped (SIGTERM, then SIGKILL after a grace period) when the context exits, also on error or
Ctrl-C. Server output goes to ``<log_dir>/server-<i>.log``.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

LISTENING = re.compile(r"listening on (http://[^\s]+)")
TWIN_START_TIMEOUT_S = 120.0
VLLM_START_TIMEOUT_S = 1800.0   # model download + weights + CUDA graphs on a cold cache
STOP_GRACE_S = 10.0


@dataclass(frozen=True)
class ServerSpec:
    """One server: its vLLM flags and the LoRA modules it serves (name -> adapter directory)."""

    max_loras: int
    max_lora_rank: int
    lora_modules: tuple[tuple[str, str], ...]
    max_cpu_loras: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    enable_lora: bool = True
    extra_args: tuple[str, ...] = field(default=())

    def vllm_flags(self) -> list[str]:
        """The flags ``vllm serve`` and ``twin serve`` share."""
        args: list[str] = []
        if self.enable_lora:
            args += ["--enable-lora", "--max-loras", str(self.max_loras),
                     "--max-cpu-loras", str(self.max_cpu_loras or max(self.max_loras,
                                                                     len(self.lora_modules))),
                     "--max-lora-rank", str(self.max_lora_rank)]
        if self.max_num_seqs is not None:
            args += ["--max-num-seqs", str(self.max_num_seqs)]
        if self.max_num_batched_tokens is not None:
            args += ["--max-num-batched-tokens", str(self.max_num_batched_tokens)]
        if self.enable_lora and self.lora_modules:
            args += ["--lora-modules", *[f"{n}={p}" for n, p in self.lora_modules]]
        return args + list(self.extra_args)


@dataclass(frozen=True)
class RunningServer:
    """A launched server: its URL, process and log file."""

    url: str
    process: subprocess.Popen
    log: Path


def twin_serve_command(spec: ServerSpec, profile: str, time_scale: float, seed: int,
                       served_model_name: str | None = None) -> list[str]:
    cmd = [sys.executable, "-m", "twin", "serve", "--profile", profile, "--host", "127.0.0.1",
           "--port", "0", "--time-scale", repr(float(time_scale)), "--seed", str(seed)]
    if served_model_name:
        cmd += ["--served-model-name", served_model_name]
    return cmd + spec.vllm_flags()


def vllm_serve_command(spec: ServerSpec, model: str, port: int,
                       served_model_name: str | None = None) -> list[str]:
    # as the profiled runs (shared data README): V1 engine, prefix caching off, chunked prefill
    cmd = ["vllm", "serve", model, "--host", "127.0.0.1", "--port", str(port),
           "--disable-log-requests", "--no-enable-prefix-caching", "--enable-chunked-prefill",
           "--gpu-memory-utilization", "0.9"]
    if served_model_name:
        cmd += ["--served-model-name", served_model_name]
    return cmd + spec.vllm_flags()


def free_port() -> int:
    """A free loopback TCP port (for servers that cannot take port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def health_ok(url: str, timeout_s: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=timeout_s) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


def read_log(path: Path | None) -> str | None:
    """A server's log text (undecodable bytes replaced), None without a path or when it cannot
    be read."""
    try:
        return Path(path).read_text(errors="replace") if path else None
    except OSError:
        return None


def _tail(path: Path, n: int = 8) -> str:
    return " | ".join((read_log(path) or "").splitlines()[-n:])


def _wait_ready(proc: subprocess.Popen, log: Path, url: str | None, timeout_s: float,
                what: str) -> str:
    """Wait until the server announces its URL (twin) or answers /health (vLLM)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ValueError(f"{what} exited with code {proc.returncode} before it was ready "
                             f"(log {log}: {_tail(log)})")
        if url is None:
            m = LISTENING.search(log.read_text(errors="replace")) if log.exists() else None
            if m:
                found = m.group(1).rstrip("/")
                if health_ok(found):
                    return found
        elif health_ok(url):
            return url
        time.sleep(0.1)
    raise ValueError(f"{what} not ready after {timeout_s:g} s (log {log}: {_tail(log)})")


def stop(servers: Sequence[RunningServer]) -> None:
    """SIGTERM every server, SIGKILL those still alive after the grace period."""
    for s in servers:
        if s.process.poll() is None:
            s.process.terminate()
    deadline = time.monotonic() + STOP_GRACE_S
    for s in servers:
        try:
            s.process.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            s.process.kill()
            s.process.wait(timeout=STOP_GRACE_S)


@contextlib.contextmanager
def launch_servers(specs: Sequence[ServerSpec], log_dir: Path, kind: str = "twin",
                   profile: str | None = None, time_scale: float = 1.0, seed: int = 0,
                   model: str | None = None, gpu_ids: Sequence[str] | None = None,
                   served_model_name: str | None = None,
                   start_timeout_s: float | None = None) -> Iterator[list[RunningServer]]:
    """Start one server per spec (``kind`` ``twin`` or ``vllm``), yield them, stop them all.

    Twin servers: ``profile`` and ``time_scale`` apply; server ``i`` gets seed ``seed + i``.
    vLLM servers: ``model`` (HF id or path) and ``gpu_ids[i]`` as ``CUDA_VISIBLE_DEVICES``."""
    if kind not in ("twin", "vllm"):
        raise ValueError(f"--server: must be twin or vllm, got {kind!r}")
    if kind == "twin" and not profile:
        raise ValueError("--profile: needed to launch twin servers")
    if kind == "vllm":
        if not model:
            raise ValueError("--model: needed to launch vllm servers (HF id or local path)")
        if gpu_ids is None or len(gpu_ids) < len(specs):
            raise ValueError(f"--gpu-ids: the plan has {len(specs)} GPUs, "
                             f"{0 if gpu_ids is None else len(gpu_ids)} GPU ids given")
    log_dir.mkdir(parents=True, exist_ok=True)
    timeout = start_timeout_s or (TWIN_START_TIMEOUT_S if kind == "twin" else VLLM_START_TIMEOUT_S)
    running: list[RunningServer] = []
    try:
        pending = []
        for i, spec in enumerate(specs):
            log = log_dir / f"server-{i}.log"
            env = dict(os.environ)
            env["PYTHONUNBUFFERED"] = "1"
            if kind == "twin":
                cmd, url = twin_serve_command(spec, profile, time_scale, seed + i,
                                              served_model_name), None
            else:
                port = free_port()
                cmd = vllm_serve_command(spec, model, port, served_model_name)
                url = f"http://127.0.0.1:{port}"
                env["CUDA_VISIBLE_DEVICES"] = str(gpu_ids[i])
                env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
            (log_dir / f"server-{i}.cmd").write_text(" ".join(cmd) + "\n")
            fh = open(log, "w")
            try:
                proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, env=env)
            except FileNotFoundError:
                raise ValueError(f"cannot start {cmd[0]!r}: not found (install the [gpu] extra "
                                 "for vllm)") from None
            finally:
                fh.close()
            running.append(RunningServer(url or "", proc, log))
            pending.append((i, proc, log, url))
        for i, proc, log, url in pending:
            ready = _wait_ready(proc, log, url, timeout, f"server {i} ({kind})")
            running[i] = RunningServer(ready, proc, log)
        yield running
    finally:
        stop(running)
