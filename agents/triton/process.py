"""One tritonserver process: start on free loopback ports (ready, or an error), load / unload with
a config override, statistics, stop."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from agents.triton.environment import HOST, TritonError, find_tritonserver, free_ports, prepare_backend_dir, triton_env
from agents.triton.ledger import record_process
from controller.render import (
    ModelConfig,
    config_from_json,
    config_to_json,
)

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
            self._ledger = record_process(self.workdir, self.name, self.proc.pid, self.command())
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

    def server_ready(self, timeout_s: float = 1.0) -> bool:
        try:
            with urllib.request.urlopen(f"{self.http_url}/v2/health/ready", timeout=timeout_s) as reply:
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

    def kill(self) -> int | None:
        """SIGKILL its whole process group (a stopped or hung server cannot act on SIGTERM), then clean up."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=10)
        return self.stop(timeout_s=0)

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

    def model_ready(self, model: str, timeout_s: float = 5.0) -> bool:
        try:
            return bool(self.client.is_model_ready(model, client_timeout=timeout_s))
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
