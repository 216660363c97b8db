"""Triton Inference Server on one node: processes, repository API, metrics scrape.

The one module that runs `tritonserver` and talks to it (`tritonclient`).

- `find_tritonserver` / `prepare_backend_dir` / `triton_env`: the server binary
  shipped with `nvidia-pytriton`, a backend directory holding the Python
  backend plus the stub for the running interpreter, and PATH /
  LD_LIBRARY_PATH set so the stub uses this interpreter and its libpython
  (see docs: triton-on-cpu reference).
- `TritonProcess`: one server in explicit model-control mode on free loopback
  ports; start (wait for readiness, with a timeout), load / unload with a
  config override, scrape metrics, stop (SIGTERM, then SIGKILL).
- `TritonFleet`: all processes of a node. Each assignment gets its own
  process holding its resource share (CPU node: the child's core affinity,
  ceil(share/100 x cores) cores, at least one, and by default one model
  instance per core so the model can use them; GPU node:
  ``CUDA_VISIBLE_DEVICES`` and ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``, with the
  MPS daemon from `agents.mps`). `apply` makes the node serve exactly the
  given assignments:

  * nothing changed -> nothing done (``unchanged``); a process that died is
    started again (``started``);
  * batch / queue-delay change -> ``load_model(config=...)`` in the same
    process (``reloaded``); Triton keeps the old version serving until the new
    one is ready, so no request fails;
  * share / device / model change -> a new process with the new share, model
    loaded there and pre-warmed (a few requests at batch 1 and the max batch),
    endpoint switched, then the old process stopped gracefully (``moved``):
    with a `agents.router.Router`, once the calls in flight on it have
    answered; without one, after `drain_s`;
  * a failed load keeps the previous config (or process) serving, and the
    error is reported in ``ApplyReport.errors`` as an `AssignmentError` (key, message; rollback).
- Endpoints: each process listens on loopback. With a `Router` (the agent
  always has one) every workload gets stable gRPC/HTTP/metrics endpoints on
  the node's bind address that follow its processes (`serving_endpoints`).
- `parse_metrics` / `parse_statistics` / `observe_model`: Triton's Prometheus text and its
  statistics extension -> per-model counters -> the figures of one window (request rate,
  mean batch, queue / compute ms, per batch size executions and mean duration, pending).
- A base config may fix its CPU instance count with the parameter ``stoke_cpu_instances``
  (the demo's simulated accelerator uses the cores of its share itself).

What a fleet refuses (`TritonFleet.refusals`, asked by the agent before
every apply; nothing changes then, every assignment gets the error): a
workload or model name outside `stoke.names`'s rule, a model folder that
resolves outside the repository (``../x``, a symlink out), and assignments
that over-commit a device (`overcommit_problems`). So a controller cannot make
this node run code from outside its model repository, nor start processes it
has no room for. `apply` itself always refuses the names and paths.

Processes outlive a crash of the agent (each Triton is its own session, so
Ctrl-C of a CLI does not hit it, and a crash of the agent does not stop
serving). Each one is recorded in ``WORKDIR/pids/`` (pid, start time,
command), and a fleet opened on the same workdir first reaps what a previous,
crashed agent left there (`reap_orphans`: SIGTERM to the process group, then
SIGKILL), checking the start time and command line so a recycled pid is
never hit.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import tritonclient.grpc as grpcclient
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from agents.router import Backend, RouterError
from controller.limits import REFUSED_KEY
from controller.messages import AssignmentError, BatchStat, ModelAssignment, ServingEndpoint
from controller.render import (
    CONFIG_NAME,
    ModelConfig,
    config_from_json,
    config_to_json,
    config_to_text,
    parse_config,
    read_config,
    render_config,
)
from stoke.errors import StokeError
from stoke.names import name_problem

HOST = "127.0.0.1"
log = logging.getLogger("stoke.triton")
#: Requests per batch size that pre-warm a new process before a move switches traffic to it.
WARM_UP_REQUESTS = 2


class TritonError(StokeError, RuntimeError):
    """A Triton process failed to start, load a model or answer."""


# --------------------------------------------------------------------------- environment


def _pytriton_root() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise TritonError(
            "nvidia-pytriton is not installed; it ships the tritonserver binary (pip install nvidia-pytriton)"
        )
    return Path(list(spec.submodule_search_locations)[0]) / "tritonserver"


def find_tritonserver() -> Path:
    """The `tritonserver` binary: $STOKE_TRITONSERVER, else the one inside nvidia-pytriton."""
    override = os.environ.get("STOKE_TRITONSERVER")
    path = Path(override) if override else _pytriton_root() / "bin" / "tritonserver"
    if not os.access(path, os.X_OK):
        raise TritonError(
            f"{path}: tritonserver binary not found or not executable; install nvidia-pytriton "
            f"or set STOKE_TRITONSERVER"
        )
    return path


def prepare_backend_dir(workdir: str | os.PathLike[str]) -> Path:
    """`workdir/backends/python` with the Python backend and the stub of the running interpreter."""
    root = _pytriton_root()
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    sources = {
        "libtriton_python.so": root / "backends" / "python" / "libtriton_python.so",
        "triton_python_backend_utils.py": root / "backends" / "python" / "triton_python_backend_utils.py",
        "triton_python_backend_stub": root / "python_backend_stubs" / version / "triton_python_backend_stub",
    }
    backends = Path(workdir) / "backends"
    target = backends / "python"
    target.mkdir(parents=True, exist_ok=True)
    for name, source in sources.items():
        if not source.exists():
            raise TritonError(f"{source}: missing from nvidia-pytriton (Python {version} backend stub)")
        link = target / name
        if link.is_symlink() and os.readlink(link) == str(source):
            continue
        tmp = target / f".{name}.tmp{os.getpid()}"
        if tmp.is_symlink() or tmp.exists():
            tmp.unlink()
        tmp.symlink_to(source)
        os.replace(tmp, link)
    return backends


def triton_env(base: Mapping[str, str] | None = None, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """PATH starts with this interpreter's bin; LD_LIBRARY_PATH with its LIBDIR (libpython)."""
    env = dict(os.environ if base is None else base)
    bindir = os.path.dirname(sys.executable)
    env["PATH"] = os.pathsep.join(p for p in (bindir, env.get("PATH", "")) if p)
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (libdir, env.get("LD_LIBRARY_PATH", "")) if p)
    env.update(extra or {})
    return env


def free_ports(count: int) -> list[int]:
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((HOST, 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def cpu_cores_for_share(
    share_pct: float, cores: Sequence[int], used: Mapping[int, int] | None = None
) -> tuple[int, ...]:
    """ceil(share/100 x cores) cores (at least one), the least used first (ties: lowest index)."""
    cores = sorted(cores)
    count = min(len(cores), max(1, math.ceil(share_pct / 100.0 * len(cores) - 1e-9)))
    used = used or {}
    return tuple(sorted(sorted(cores, key=lambda c: (used.get(c, 0), c))[:count]))


def overcommit_problems(
    assignments: Sequence[ModelAssignment], *, device_kind: str, devices: int, cores: Sequence[int]
) -> list[str]:
    """Why these assignments do not fit this node, one line each (empty when they fit).

    `TritonFleet` would place them anyway, pinning an assignment to cores (or
    a GPU) that another one already holds, so both run slower than planned.
    On a CPU node every assignment takes ceil(share x cores) whole cores of
    the one CPU device, whatever plan device it came from. On a GPU node each
    assignment's device must exist and a GPU's MPS shares add up to <= 100%.
    """
    if device_kind == "cpu":
        need = {a.key: len(cpu_cores_for_share(a.share_pct, cores)) for a in assignments}
        if sum(need.values()) <= len(cores):
            return []
        plan_devices = sorted({a.device for a in assignments})
        detail = ", ".join(f"{k}: {n}" for k, n in need.items())
        return [
            f"its {len(need)} assignment(s) on plan device(s) {', '.join(map(str, plan_devices))} need "
            f"{sum(need.values())} whole cores ({detail}) but this CPU node has {len(cores)}"
        ]
    problems = []
    missing = sorted({a.device for a in assignments if not 0 <= a.device < devices})
    if missing:
        names = ", ".join(a.key for a in assignments if a.device in missing)
        problems.append(f"it needs GPU(s) {', '.join(map(str, missing))} ({names}) but this node has {devices} GPU(s)")
    for device in sorted({a.device for a in assignments} - set(missing)):
        on_device = [a for a in assignments if a.device == device]
        total = sum(a.share_pct for a in on_device)
        if total > 100.0 + 1e-6:
            detail = ", ".join(f"{a.key}: {a.share_pct:g}%" for a in on_device)
            problems.append(f"GPU {device} shares add up to {total:g}% ({detail})")
    return problems


# --------------------------------------------------------------------------- the pid ledger

LEDGER = "pids"


def _start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22), or None when gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return None if fields[0] == "Z" else int(fields[19])


def _record(workdir: Path, name: str, pid: int, command: Sequence[str]) -> Path:
    folder = workdir / LEDGER
    folder.mkdir(parents=True, exist_ok=True)
    entry = folder / f"{name}.json"
    entry.write_text(json.dumps({"pid": pid, "start": _start_time(pid), "binary": command[0], "name": name}))
    return entry


def reap_orphans(workdir: str | os.PathLike[str], timeout_s: float = 5.0) -> list[int]:
    """Stop the Triton processes a previous agent recorded in `workdir` and left running; returns their pids.

    A record counts only when its pid still runs with the recorded start time and binary, so a pid the
    kernel gave to another process since is left alone. Each is stopped with its process group (its Python
    backend stubs): SIGTERM, then SIGKILL after `timeout_s`."""
    folder = Path(workdir) / LEDGER
    victims = []
    for entry in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            info = json.loads(entry.read_text())
            pid, start, binary = int(info["pid"]), info["start"], str(info["binary"])
        except (OSError, ValueError, KeyError, TypeError):
            entry.unlink(missing_ok=True)
            continue
        try:
            argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
        except OSError:
            argv0 = ""
        if start is not None and _start_time(pid) == start and argv0 == binary:
            victims.append(pid)
        else:
            entry.unlink(missing_ok=True)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in victims:
            try:
                os.killpg(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and any(_start_time(p) is not None for p in victims):
            time.sleep(0.05)
    for entry in folder.glob("*.json") if folder.is_dir() else []:
        entry.unlink(missing_ok=True)
    return victims


# --------------------------------------------------------------------------- one process


class TritonProcess:
    """One `tritonserver` in explicit model-control mode on free loopback ports."""

    def __init__(
        self,
        repository: str,
        *,
        workdir: str | os.PathLike[str],
        name: str = "triton",
        binary: str | os.PathLike[str] | None = None,
        backend_dir: str | os.PathLike[str] | None = None,
        cpu_cores: Sequence[int] | None = None,
        env: Mapping[str, str] | None = None,
        device_kind: str = "cpu",
        ready_timeout_s: float = 30.0,
        exit_timeout_s: int = 5,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.repository = repository if "://" in repository else str(Path(repository).resolve())
        self.workdir = Path(workdir)
        self.name = name
        self.binary = Path(binary) if binary else find_tritonserver()
        self.backend_dir = Path(backend_dir) if backend_dir else prepare_backend_dir(self.workdir)
        self.cpu_cores = tuple(cpu_cores) if cpu_cores else None
        self.env = dict(env or {})
        self.device_kind = device_kind
        self.ready_timeout_s = ready_timeout_s
        self.exit_timeout_s = exit_timeout_s
        self.extra_args = tuple(extra_args)
        self.http_port = self.grpc_port = self.metrics_port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = self.workdir / f"{name}.log"
        self.started_s = 0.0  # seconds from spawn to ready (last start)
        self._client: grpcclient.InferenceServerClient | None = None
        self._ledger: Path | None = None

    # -- addresses
    @property
    def grpc_url(self) -> str:
        return f"{HOST}:{self.grpc_port}"

    @property
    def http_url(self) -> str:
        return f"http://{HOST}:{self.http_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{HOST}:{self.metrics_port}/metrics"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def command(self) -> list[str]:
        args = [
            str(self.binary),
            f"--model-repository={self.repository}",
            f"--backend-directory={self.backend_dir}",
            "--model-control-mode=explicit",
            f"--http-port={self.http_port}",
            f"--grpc-port={self.grpc_port}",
            f"--metrics-port={self.metrics_port}",
            f"--http-address={HOST}",
            f"--grpc-address={HOST}",
            f"--metrics-address={HOST}",
            "--disable-auto-complete-config",
            "--exit-on-error=true",
            f"--exit-timeout-secs={self.exit_timeout_s}",
            "--log-verbose=0",
            # cumulative latency summaries/histograms where the server supports them (2.51:
            # accepted, but no per-model histogram for non-decoupled models)
            "--metrics-config=histogram_latencies=true",
        ]
        if self.device_kind == "cpu":
            args += ["--allow-gpu-metrics=false", "--pinned-memory-pool-byte-size=0"]
        return args + list(self.extra_args)

    def _spawn_argv(self) -> tuple[list[str], Callable[[], None] | None]:
        """The argv to start and the preexec function, if one is needed.

        A core set is applied by `taskset` before tritonserver runs (its threads and the Python stubs
        it spawns inherit it). A `preexec_fn` would run Python in a child forked from this threaded
        process: that forces fork instead of vfork, runs gRPC's fork handlers and can crash or deadlock
        the child before exec (it did, now and then, under load). It stays only as the fallback."""
        if not self.cpu_cores:
            return self.command(), None
        taskset = shutil.which("taskset")
        if taskset:
            cores = ",".join(str(c) for c in sorted(self.cpu_cores))
            return [taskset, "--cpu-list", cores, *self.command()], None
        cores_set = set(self.cpu_cores)
        return self.command(), lambda: os.sched_setaffinity(0, cores_set)

    # -- life cycle
    def start(self) -> float:
        """Start and wait until ready; returns the seconds it took. Retries on a port clash or a crash."""
        if self.alive():
            return self.started_s
        self.workdir.mkdir(parents=True, exist_ok=True)
        last = ""
        for _attempt in range(3):
            self.http_port, self.grpc_port, self.metrics_port = free_ports(3)
            self._client = None
            t0 = time.monotonic()
            argv, preexec = self._spawn_argv()
            with open(self.log_path, "ab") as log:
                self.proc = subprocess.Popen(
                    argv,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=triton_env(extra=self.env),
                    preexec_fn=preexec,
                    cwd=self.workdir,
                    start_new_session=True,
                )  # Ctrl-C of the CLI does not hit it
            self._ledger = _record(self.workdir, self.name, self.proc.pid, self.command())
            while time.monotonic() - t0 < self.ready_timeout_s:
                if self.proc.poll() is not None:
                    break
                if self.server_ready():
                    self.started_s = time.monotonic() - t0
                    return self.started_s
                time.sleep(0.02)
            last = self.log_tail()
            if self.proc.poll() is None:
                self.stop(timeout_s=2)
                raise TritonError(f"{self.name}: not ready within {self.ready_timeout_s:.0f} s; log tail: {last}")
            clash = "address already in use" in last.lower() or "failed to start" in last.lower()
            # A start that died on a signal (tritonserver 2.51 aborts now and then in gRPC's epoll
            # poller while it comes up on a busy machine) is a transient failure: try again.
            crashed = self.proc.returncode is not None and self.proc.returncode < 0
            if not clash and not crashed:
                break
        raise TritonError(
            f"{self.name}: tritonserver exited with code {self.proc.returncode if self.proc else '?'}; log tail: {last}"
        )

    def log_tail(self, lines: int = 8) -> str:
        try:
            return " | ".join(self.log_path.read_text(errors="replace").strip().splitlines()[-lines:])
        except OSError:
            return ""

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def server_ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.http_url}/v2/health/ready", timeout=1) as reply:
                return reply.status == 200
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def stop(self, timeout_s: float | None = None) -> int | None:
        """SIGTERM (Triton lets in-flight requests finish), then SIGKILL after the timeout."""
        if self.proc is None:
            return None
        timeout_s = self.exit_timeout_s + 5 if timeout_s is None else timeout_s
        if self.proc.poll() is None:
            try:
                self.proc.send_signal(signal.SIGTERM)
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait(timeout=10)
        if self._ledger is not None:
            self._ledger.unlink(missing_ok=True)
            self._ledger = None
        if self._client is not None:
            try:
                self._client.close()
            except Exception:  # noqa: BLE001 - closing a dead channel
                pass
            self._client = None
        return self.proc.returncode

    def unload_and_stop(self, models: Sequence[str], timeout_s: float = 5.0) -> int | None:
        """Unload `models`, wait until they are gone, then stop: faster than SIGTERM alone.

        Triton's shutdown polls its live models once a second; a server whose
        models are already unloaded exits at the first poll (~1 s saved).
        """
        if self.alive():
            try:
                for model in models:
                    self.client.unload_model(model)
                deadline = time.monotonic() + timeout_s
                while time.monotonic() < deadline:
                    index = self.client.get_model_repository_index(as_json=True).get("models", [])
                    if not any(m.get("state") in ("READY", "UNLOADING", "LOADING") for m in index):
                        break
                    time.sleep(0.02)
            except InferenceServerException:
                pass  # a server that does not answer is stopped by the signal below
        return self.stop()

    # -- repository API
    @property
    def client(self) -> grpcclient.InferenceServerClient:
        if self._client is None:
            self._client = grpcclient.InferenceServerClient(self.grpc_url)
        return self._client

    def load(self, model: str, config: ModelConfig | None = None, timeout_s: float = 120.0) -> float:
        """Load (or reload) `model`, with a full config override when given; returns seconds."""
        t0 = time.monotonic()
        try:
            self.client.load_model(
                model, config=None if config is None else config_to_json(config), client_timeout=timeout_s
            )
        except InferenceServerException as err:
            raise TritonError(f"{self.name}: load of {model!r} failed: {_one_line(err)}") from None
        return time.monotonic() - t0

    def unload(self, model: str) -> None:
        try:
            self.client.unload_model(model)
        except InferenceServerException as err:
            raise TritonError(f"{self.name}: unload of {model!r} failed: {_one_line(err)}") from None

    def model_ready(self, model: str) -> bool:
        try:
            return bool(self.client.is_model_ready(model))
        except InferenceServerException:
            return False

    def model_config(self, model: str) -> ModelConfig:
        try:
            reply = self.client.get_model_config(model, as_json=True)
        except InferenceServerException as err:
            raise TritonError(f"{self.name}: get_model_config({model!r}) failed: {_one_line(err)}") from None
        return config_from_json(reply["config"])

    def statistics(self, model: str) -> dict[str, Any]:
        """Triton's statistics extension for `model` (cumulative counts and durations, per batch size too)."""
        try:
            return dict(self.client.get_inference_statistics(model, as_json=True, client_timeout=2.0))
        except InferenceServerException as err:
            raise TritonError(f"{self.name}: statistics of {model!r} failed: {_one_line(err)}") from None

    def metrics_text(self, timeout_s: float = 2.0) -> str:
        try:
            with urllib.request.urlopen(self.metrics_url, timeout=timeout_s) as reply:
                return reply.read().decode("utf-8", errors="replace")
        except (urllib.error.URLError, OSError) as err:
            raise TritonError(f"{self.name}: cannot scrape {self.metrics_url}: {err}") from None

    def state(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "pid": self.pid,
            "alive": self.alive(),
            "returncode": self.returncode(),
            "grpc": self.grpc_url,
            "http": self.http_url,
            "metrics": self.metrics_url,
            "cpu_cores": list(self.cpu_cores or ()),
            "log": str(self.log_path),
        }


def _one_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__


# --------------------------------------------------------------------------- metrics

COUNTERS = {
    "nv_inference_request_success": "success",
    "nv_inference_request_failure": "failure",
    "nv_inference_count": "inferences",
    "nv_inference_exec_count": "executions",
    "nv_inference_request_duration_us": "request_us",
    "nv_inference_queue_duration_us": "queue_us",
    "nv_inference_compute_input_duration_us": "compute_input_us",
    "nv_inference_compute_infer_duration_us": "compute_infer_us",
    "nv_inference_compute_output_duration_us": "compute_output_us",
}
HISTOGRAM = "nv_inference_first_response_histogram_ms"
#: Gauges read as they are (not as counters over the window).
GAUGES = {"nv_inference_pending_request_count": "pending"}
#: Most batch sizes read from one model's statistics (Triton keeps one entry per size executed).
MAX_BATCH_SIZES = 256


def parse_metrics(text: str) -> dict[str, dict[str, float]]:
    """Triton's Prometheus text -> {model: {counter: value summed over versions}}.

    Histogram buckets, when present, appear as ``le:<bound>`` keys.
    """
    out: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            model = sample.labels.get("model")
            if model is None:
                continue
            # prometheus_client names counter samples `<family>_total`; Triton's lack the suffix
            sample_name = family.name if sample.name == family.name + "_total" else sample.name
            name = COUNTERS.get(sample_name) or GAUGES.get(sample_name)
            if name is None and sample_name == HISTOGRAM + "_bucket":
                name = f"le:{sample.labels.get('le')}"
            if name is None:
                continue
            row = out.setdefault(model, {})
            row[name] = row.get(name, 0.0) + float(sample.value)
    return out


def parse_statistics(stats: Mapping[str, Any], model: str) -> dict[str, float]:
    """Triton's statistics JSON -> per batch size, cumulative ``exec:<b>`` executions and ``exec_ns:<b>``
    nanoseconds (compute input + infer + output), summed over versions; at most `MAX_BATCH_SIZES` sizes."""
    out: dict[str, float] = {}
    for entry in stats.get("model_stats", ()):
        if entry.get("name") != model:
            continue
        for b in entry.get("batch_stats", ())[:MAX_BATCH_SIZES]:
            size = int(b.get("batch_size", 0))
            if size < 1:
                continue
            count = float(b.get("compute_infer", {}).get("count", 0))
            ns = sum(
                float(b.get(part, {}).get("ns", 0)) for part in ("compute_input", "compute_infer", "compute_output")
            )
            out[f"exec:{size}"] = out.get(f"exec:{size}", 0.0) + count
            out[f"exec_ns:{size}"] = out.get(f"exec_ns:{size}", 0.0) + ns
    return out


@dataclass(frozen=True)
class ObservedModel:
    """One assignment's figures over the window since the previous scrape.

    Rates and means are over the window; `failures` and `success` are the
    server's cumulative counters (since the model's process started).
    """

    model: str
    key: str
    request_rate_rps: float
    mean_batch: float
    mean_queue_ms: float
    mean_compute_ms: float
    failures: int
    success: int
    endpoint: str
    mean_request_ms: float = 0.0
    window_s: float = 0.0
    latency_p99_ms: float | None = None  # from the per-model histogram, when the server emits one
    requests: int = 0  # completed in the window
    window_failures: int = 0  # failed in the window
    pending: int = 0  # waiting in the queue at the end of the window
    batch_stats: tuple[BatchStat, ...] = ()  # per batch size executed in the window
    compute_input_ms: float = 0.0  # per request, mean over the window
    compute_infer_ms: float = 0.0
    compute_output_ms: float = 0.0
    instances: int = 1
    seq: int = 0  # windows observed of this assignment so far


def _quantile_from_buckets(buckets: Mapping[float, float], q: float) -> float | None:
    if not buckets:
        return None
    bounds = sorted(buckets)
    total = buckets[bounds[-1]]
    if total <= 0:
        return None
    for bound in bounds:
        if buckets[bound] >= q * total:
            return bound
    return bounds[-1]


def observe_model(
    model: str, key: str, endpoint: str, previous: Mapping[str, float], current: Mapping[str, float], window_s: float
) -> ObservedModel:
    """Figures over the window between two scrapes (counters that went down count from zero)."""

    def delta(name: str) -> float:
        now, before = current.get(name, 0.0), previous.get(name, 0.0)
        return now - before if now >= before else now

    success = delta("success")
    executions = delta("executions")
    buckets = {float(k[3:]): delta(k) for k in current if k.startswith("le:")}
    compute_us = delta("compute_input_us") + delta("compute_infer_us") + delta("compute_output_us")
    batch_stats = []
    for name in sorted((k for k in current if k.startswith("exec:")), key=lambda k: int(k[5:])):
        size, count = int(name[5:]), delta(name)
        if count >= 1:
            mean_ms = delta(f"exec_ns:{size}") / count / 1e6
            batch_stats.append(BatchStat(size, int(count), max(0.0, mean_ms)))

    def per_request_ms(name: str) -> float:
        return delta(name) / success / 1000.0 if success else 0.0

    return ObservedModel(
        model=model,
        key=key,
        request_rate_rps=success / window_s if window_s > 0 else 0.0,
        mean_batch=delta("inferences") / executions if executions else 0.0,
        mean_queue_ms=delta("queue_us") / success / 1000.0 if success else 0.0,
        mean_compute_ms=compute_us / success / 1000.0 if success else 0.0,
        failures=int(current.get("failure", 0.0)),
        success=int(current.get("success", 0.0)),
        endpoint=endpoint,
        mean_request_ms=delta("request_us") / success / 1000.0 if success else 0.0,
        window_s=window_s,
        latency_p99_ms=_quantile_from_buckets(buckets, 0.99),
        requests=int(success),
        window_failures=int(delta("failure")),
        pending=int(current.get("pending", 0.0)),
        batch_stats=tuple(batch_stats),
        compute_input_ms=per_request_ms("compute_input_us"),
        compute_infer_ms=per_request_ms("compute_infer_us"),
        compute_output_ms=per_request_ms("compute_output_us"),
    )


# --------------------------------------------------------------------------- the fleet


@dataclass(frozen=True)
class ApplyReport:
    started: tuple[str, ...] = ()
    reloaded: tuple[str, ...] = ()
    moved: tuple[str, ...] = ()
    stopped: tuple[str, ...] = ()
    unchanged: tuple[str, ...] = ()
    errors: tuple[AssignmentError, ...] = ()

    @property
    def changed(self) -> bool:
        return bool(self.started or self.reloaded or self.moved or self.stopped)


@dataclass
class _Slot:
    assignment: ModelAssignment
    process: TritonProcess
    config: ModelConfig
    cores: tuple[int, ...] | None
    last_metrics: dict[str, float] = field(default_factory=dict)
    last_scrape: float = 0.0
    windows: int = 0  # windows observed so far (`ObservedModel.seq`)


#: A base-config parameter: this many model instances on a CPU node, whatever the share (the model uses the
#: cores of its share itself); without it, one instance per core of the share.
FIXED_CPU_INSTANCES = "stoke_cpu_instances"


def _instances(config: ModelConfig) -> int:
    return max(1, sum(int(g.count) or 1 for g in config.instance_group)) if config.instance_group else 1


def _placement(a: ModelAssignment) -> tuple[str, int, float]:
    """What a process embodies: changing it means a new process."""
    return (a.model, a.device, round(float(a.share_pct), 6))


class TritonFleet:
    """All Triton processes of one node; makes the node serve exactly the given assignments."""

    def __init__(
        self,
        repository: str,
        *,
        device_kind: str = "cpu",
        workdir: str | None = None,
        ready_timeout_s: float = 30.0,
        base_config: Callable[[str], ModelConfig] | None = None,
        env: Mapping[str, str] | None = None,
        mps: object | None = None,
        cpu_cores: Sequence[int] | None = None,
        latency_histogram: bool = False,
        exit_timeout_s: int = 5,
        cpu_instance_per_core: bool = True,
        drain_s: float = 0.2,
        devices: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        router: Any = None,
        drain_timeout_s: float = 30.0,
    ) -> None:
        """`router`: an `agents.router.Router` giving each workload stable endpoints (closed with the fleet)."""
        if device_kind not in ("cpu", "gpu"):
            raise ValueError(f"device_kind must be 'cpu' or 'gpu', got {device_kind!r}")
        self.repository = repository
        self.device_kind = device_kind
        self.devices = devices  # GPUs of the node (None: not checked); a CPU node is one device
        self._own_workdir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="stoke-triton-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        #: Triton processes a crashed agent left in this workdir, stopped before anything starts
        self.reaped = reap_orphans(self.workdir)
        self.ready_timeout_s = ready_timeout_s
        self.env = dict(env or {})
        self.mps: Any = mps
        self.cpu_cores = tuple(sorted(cpu_cores if cpu_cores else os.sched_getaffinity(0)))
        self.latency_histogram = latency_histogram
        self.exit_timeout_s = exit_timeout_s
        self.cpu_instance_per_core = cpu_instance_per_core
        self.drain_s = drain_s
        self.router: Any = router
        self.drain_timeout_s = drain_timeout_s
        self._clock = clock
        self._base_config = base_config or self._default_base_config
        self._binary = find_tritonserver()
        self._backend_dir = prepare_backend_dir(self.workdir)
        self._slots: dict[str, _Slot] = {}
        self._lock = threading.RLock()
        self._counter = 0
        self._mps_started = False
        self._store: Any = None  # the S3 store of a remote repository, opened on first use

    # -- what this node refuses to run
    def refusals(self, assignments: Sequence[ModelAssignment]) -> list[AssignmentError]:
        """Why a controller's assignments must not run here (see the module docstring); empty when they may.

        The agent asks before every apply. `apply` itself refuses only the names and paths: `stoke
        triton up` without a plan serves every model on the whole machine on purpose."""
        errors = self._path_refusals(assignments)
        if errors:
            return errors
        problems = overcommit_problems(
            assignments,
            device_kind=self.device_kind,
            devices=self.devices if self.devices is not None else 1 + max((a.device for a in assignments), default=0),
            cores=self.cpu_cores,
        )
        if problems:
            text = f"refused: the assignments over-commit this node, nothing changed: {'; '.join(problems)}"
            return [AssignmentError(a.key, text) for a in assignments]
        return []

    def _path_refusals(self, assignments: Sequence[ModelAssignment]) -> list[AssignmentError]:
        errors = []
        for a in assignments:
            problem = name_problem(a.workload) or name_problem(a.model)
            if problem:
                key = REFUSED_KEY if name_problem(a.workload) else a.key
                errors.append(AssignmentError(key, f"refused: a workload or model name {problem}"))
            elif "://" not in self.repository and not self._inside_repository(a.model):
                errors.append(
                    AssignmentError(a.key, f"refused: model folder {a.model!r} resolves outside the repository")
                )
        return errors

    def _inside_repository(self, model: str) -> bool:
        root = Path(self.repository).resolve()
        return (root / model).resolve().is_relative_to(root) and (root / model).resolve() != root

    # -- base configs
    def _default_base_config(self, model: str) -> ModelConfig:
        if "://" in self.repository:
            if self._store is None:
                from agents.repo_store import open_store  # the S3 wrapper; imported only for remote repositories

                self._store = open_store(self.repository)
            store = self._store
            return parse_config(store.read_text(f"{model}/{CONFIG_NAME}"), f"{self.repository}/{model}/{CONFIG_NAME}")
        return read_config(Path(self.repository) / model / CONFIG_NAME)

    def render(self, a: ModelAssignment) -> ModelConfig:
        """The config this fleet loads for `a` (base config + plan fields + this node's kind)."""
        config = render_config(
            self._base_config(a.model),
            a,
            device_kind=self.device_kind,
            gpu_index=0 if self.device_kind == "gpu" else None,
            latency_histogram=self.latency_histogram,
        )
        fixed = config.parameters[FIXED_CPU_INSTANCES].string_value if FIXED_CPU_INSTANCES in config.parameters else ""
        if self.device_kind == "cpu" and self.cpu_instance_per_core and not fixed.strip().isdigit():
            # a CPU share is a set of cores; one model instance per core lets the model use them all
            config.instance_group[0].count = len(cpu_cores_for_share(a.share_pct, self.cpu_cores))
        elif self.device_kind == "cpu" and fixed.strip().isdigit():
            # the model uses the cores of its share itself (e.g. the demo's simulated accelerator)
            config.instance_group[0].count = max(1, min(int(fixed), len(self.cpu_cores)))
        return config

    # -- processes
    def _cores_in_use(self, exclude: str | None = None) -> dict[int, int]:
        used: dict[int, int] = {}
        for key, slot in self._slots.items():
            if key != exclude and slot.cores:
                for c in slot.cores:
                    used[c] = used.get(c, 0) + 1
        return used

    def resources(
        self, a: ModelAssignment, exclude: str | None = None
    ) -> tuple[tuple[int, ...] | None, dict[str, str]]:
        """(CPU cores, extra environment) of the process that serves `a` (the same code path on both kinds)."""
        env = dict(self.env)
        if self.device_kind == "cpu":
            return cpu_cores_for_share(a.share_pct, self.cpu_cores, self._cores_in_use(exclude)), env
        env["CUDA_VISIBLE_DEVICES"] = str(a.device)
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(max(1, min(100, int(round(a.share_pct)))))
        client_env = getattr(self.mps, "client_env", None)
        if client_env is not None:
            env.update(client_env(a.share_pct))  # pipe / log directories of the daemon
        return None, env

    def _spawn(self, a: ModelAssignment, config: ModelConfig, exclude: str | None = None, warm: bool = False) -> _Slot:
        if self.device_kind == "gpu":
            self._ensure_mps()
        cores, env = self.resources(a, exclude)
        self._counter += 1
        process = TritonProcess(
            self.repository,
            workdir=self.workdir,
            name=f"triton-{_safe(a.key)}-{self._counter}",
            binary=self._binary,
            backend_dir=self._backend_dir,
            cpu_cores=cores,
            env=env,
            device_kind=self.device_kind,
            ready_timeout_s=self.ready_timeout_s,
            exit_timeout_s=self.exit_timeout_s,
        )
        process.start()
        try:
            process.load(a.model, config)
        except TritonError:
            process.stop(timeout_s=5)
            raise
        slot = _Slot(assignment=a, process=process, config=config, cores=cores, last_scrape=self._clock())
        if warm:
            self._warm_up(slot)
        return slot

    def _warm_up(self, slot: _Slot) -> None:
        """Pre-warm a new process before traffic switches to it: a few requests at batch 1 and at the max
        batch (first calls pay lazy initialisation), then its counters start from there."""
        from agents.loadgen import LoadError, build_inputs  # the load generator's input builder

        model = slot.assignment.model
        try:
            for batch in sorted({1, max(1, int(slot.config.max_batch_size))}):
                inputs = build_inputs(slot.process.client, model, batch)
                for _ in range(WARM_UP_REQUESTS):
                    slot.process.client.infer(model, inputs, client_timeout=self.ready_timeout_s)
        except (LoadError, InferenceServerException):
            return  # a model that cannot be warmed up still serves; its first requests are slower
        slot.last_metrics = self._scrape(slot) or {}
        slot.last_scrape = self._clock()

    def _ensure_mps(self) -> None:
        if self.mps is not None and not self._mps_started:
            start = getattr(self.mps, "ensure_started", None) or self.mps.start
            start()
            self._mps_started = True

    # -- the interface
    def apply(self, assignments: Sequence[ModelAssignment]) -> ApplyReport:
        desired: dict[str, ModelAssignment] = {}
        errors: list[AssignmentError] = []
        for a in assignments:
            if a.key in desired:
                errors.append(AssignmentError(a.key, "duplicate assignment key; kept the first"))
                continue
            desired[a.key] = a
        refused = self._path_refusals(list(desired.values()))
        if refused:
            with self._lock:
                return ApplyReport(unchanged=tuple(sorted(self._slots)), errors=tuple(errors + refused))
        started, reloaded, moved, stopped, unchanged = [], [], [], [], []
        with self._lock:
            for key in sorted(set(self._slots) - set(desired)):
                gone = self._slots.pop(key)
                self._route(gone.assignment.workload)
                self._drain(gone)
                gone.process.unload_and_stop([gone.assignment.model])
                stopped.append(key)
            for key in sorted(desired):
                a = desired[key]
                slot = self._slots.get(key)
                if slot is not None and not slot.process.alive():
                    slot.process.stop()  # crashed: serve it again from scratch ("started")
                    del self._slots[key]
                    slot = None
                try:
                    config = self.render(a)
                except Exception as err:  # noqa: BLE001 - a bad base config is reported, others go on
                    errors.append(AssignmentError(key, f"cannot render the config of {a.model!r}: {err}"))
                    if slot is not None:
                        unchanged.append(key)
                    continue
                if slot is None:
                    try:
                        self._slots[key] = self._spawn(a, config)
                        self._route(a.workload)
                        started.append(key)
                    except (RuntimeError, OSError) as err:  # TritonError, MpsError
                        errors.append(AssignmentError(key, f"start failed: {err}"))
                    continue
                if _placement(slot.assignment) != _placement(a):
                    try:
                        new = self._spawn(a, config, exclude=key, warm=True)
                    except (RuntimeError, OSError) as err:  # TritonError, MpsError
                        errors.append(
                            AssignmentError(
                                key,
                                f"move to share {a.share_pct:g}% / device {a.device} "
                                f"failed, the old process keeps serving: {err}",
                            )
                        )
                        continue
                    old, self._slots[key] = slot, new
                    self._route(a.workload)  # new calls go to the new process from here on
                    self._drain(old)
                    # unload (in-flight requests finish first), then SIGTERM
                    old.process.unload_and_stop([old.assignment.model])
                    moved.append(key)
                    continue
                if config_to_text(config) == config_to_text(slot.config):
                    slot.assignment = a  # e.g. a new rate: nothing to do on the server
                    unchanged.append(key)
                    continue
                try:
                    slot.process.load(a.model, config)
                    slot.config, slot.assignment = config, a
                    reloaded.append(key)
                except TritonError as err:
                    errors.append(AssignmentError(key, f"reload failed, previous config keeps serving: {err}"))
                    self._rollback(slot)
            for key in sorted(desired):  # every served workload has its endpoints (a failed port bind is retried)
                if key in self._slots and (problem := self._route(desired[key].workload)):
                    errors.append(AssignmentError(key, f"no stable endpoint: {problem}"))
        return ApplyReport(
            tuple(started), tuple(reloaded), tuple(moved), tuple(stopped), tuple(unchanged), tuple(errors)
        )

    # -- stable endpoints (the router)
    def _route(self, workload: str) -> str:
        """Point the workload's stable endpoints at its processes (close them when none is left); "" or the error."""
        if self.router is None:
            return ""
        backends = [
            Backend(
                key=k,
                grpc=s.process.grpc_url,
                http=f"{HOST}:{s.process.http_port}",
                metrics=f"{HOST}:{s.process.metrics_port}",
            )
            for k, s in self._slots.items()
            if s.assignment.workload == workload
        ]
        try:
            if backends:
                self.router.set_backends(workload, backends)
            else:
                self.router.remove(workload)
        except RouterError as err:
            return str(err)
        return ""

    def _drain(self, old: _Slot) -> None:
        """Before stopping a process: with a router, wait until its calls in flight have answered."""
        if self.router is None:
            time.sleep(self.drain_s)  # clients that read the old endpoint have sent by now
        elif not self.router.drain(old.process.grpc_url, self.drain_timeout_s):
            log.warning(
                "%s: stopping %s after %gs with %d call(s) still in flight",
                old.assignment.key,
                old.process.name,
                self.drain_timeout_s,
                self.router.in_flight(old.process.grpc_url),
            )

    def serving_endpoint(self, key: str) -> ServingEndpoint:
        """Where clients reach one assignment: the router's stable endpoints, else the process's own."""
        with self._lock:
            slot = self._slots[key]
            process = slot.process
            routes = self.router.endpoints() if self.router is not None else {}
            route = routes.get(slot.assignment.workload)
            if route is None:
                return ServingEndpoint(key, process.grpc_url, process.http_url, process.metrics_url, process.grpc_url)
            return ServingEndpoint(key, route.grpc, route.http, route.metrics, process.grpc_url)

    def serving_endpoints(self) -> dict[str, ServingEndpoint]:
        with self._lock:
            return {key: self.serving_endpoint(key) for key in sorted(self._slots)}

    def _rollback(self, slot: _Slot) -> None:
        """Triton keeps the old version after a failed reload; make sure, else load the old config."""
        model = slot.assignment.model
        try:
            if (
                slot.process.model_ready(model)
                and slot.process.model_config(model).max_batch_size == slot.config.max_batch_size
            ):
                return
            slot.process.load(model, slot.config)
        except TritonError:
            pass  # check_health restarts it with the old config

    def check_health(self) -> list[str]:
        """Restart crashed Triton processes (re-loading their models); returns events."""
        events: list[str] = []
        with self._lock:
            for key in sorted(self._slots):
                slot = self._slots[key]
                model = slot.assignment.model
                if slot.process.alive():
                    if slot.process.model_ready(model):
                        continue
                    try:
                        slot.process.load(model, slot.config)
                        events.append(f"{key}: model {model} was not ready on {slot.process.grpc_url}; reloaded")
                    except TritonError as err:
                        events.append(f"{key}: model {model} not ready and reload failed: {err}")
                    continue
                code, pid = slot.process.returncode(), slot.process.pid
                slot.process.stop()
                try:
                    new = self._spawn(slot.assignment, slot.config, exclude=key)
                    self._slots[key] = new
                    self._route(slot.assignment.workload)
                    events.append(
                        f"{key}: Triton pid {pid} exited with code {code}; restarted as pid "
                        f"{new.process.pid} on {new.process.grpc_url}"
                    )
                except (RuntimeError, OSError) as err:  # TritonError, MpsError
                    events.append(f"{key}: Triton pid {pid} exited with code {code}; restart failed: {err}")
        return events

    def observe(self) -> list[ObservedModel]:
        """Per-assignment figures since the previous `observe` (or since the model was loaded)."""
        out: list[ObservedModel] = []
        with self._lock:
            for key in sorted(self._slots):
                slot = self._slots[key]
                current = self._scrape(slot)
                if current is None:
                    continue
                now = self._clock()
                slot.windows += 1
                observed = observe_model(
                    slot.assignment.model,
                    key,
                    slot.process.grpc_url,
                    slot.last_metrics,
                    current,
                    now - slot.last_scrape,
                )
                out.append(replace(observed, instances=_instances(slot.config), seq=slot.windows))
                slot.last_metrics, slot.last_scrape = current, now
        return out

    @staticmethod
    def _scrape(slot: _Slot) -> dict[str, float] | None:
        """The model's counters: Triton's metrics, plus per batch size from its statistics (when it answers)."""
        try:
            current = parse_metrics(slot.process.metrics_text()).get(slot.assignment.model, {})
        except TritonError:
            return None
        try:
            current.update(parse_statistics(slot.process.statistics(slot.assignment.model), slot.assignment.model))
        except TritonError:
            pass  # the window still has Triton's metrics
        return current

    def endpoints(self) -> dict[str, str]:
        with self._lock:
            return {key: slot.process.grpc_url for key, slot in sorted(self._slots.items())}

    def endpoint(self, key: str) -> str:
        """The current endpoint of one assignment (a load generator follows it across moves)."""
        return self._slots[key].process.grpc_url

    def running(self) -> list[ModelAssignment]:
        with self._lock:
            return [slot.assignment for _, slot in sorted(self._slots.items()) if slot.process.alive()]

    def processes(self) -> dict[str, dict[str, Any]]:
        with self._lock:
            return {key: slot.process.state() for key, slot in sorted(self._slots.items())}

    def served_config(self, key: str) -> ModelConfig:
        """What the server reports for the assignment's model (`get_model_config`)."""
        slot = self._slots[key]
        return slot.process.model_config(slot.assignment.model)

    def close(self) -> None:
        """Stop every process (graceful, then forceful), in parallel."""
        if self.router is not None:
            self.router.close()  # stop taking calls first
        with self._lock:
            slots, self._slots = list(self._slots.values()), {}
        threads = [
            threading.Thread(target=s.process.unload_and_stop, args=([s.assignment.model],), daemon=True) for s in slots
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if self.mps is not None and self._mps_started:
            try:
                self.mps.quit()
            except Exception:  # noqa: BLE001 - best effort at shutdown
                pass
            self._mps_started = False
        if self._own_workdir:  # a temporary directory of ours: logs and backend links go with the fleet
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> TritonFleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _safe(key: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in key)
