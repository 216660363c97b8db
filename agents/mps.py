"""NVIDIA MPS control daemon (`nvidia-cuda-mps-control`): the one module that drives it.

On a GPU node every Triton process is an MPS client; its share of the GPU is
its active-thread percentage (``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` in the
client's environment, or `set_active_thread_percentage` on a running server).
Commands go to the daemon on the control binary's stdin, one per call:

    nvidia-cuda-mps-control -d                      start the daemon
    echo get_server_list | nvidia-cuda-mps-control  PIDs of MPS servers, one per line
    echo "get_client_list PID" | ...                PIDs of that server's clients
    echo "set_default_active_thread_percentage 50"  default for new servers
    echo "set_active_thread_percentage PID 50"      for one running server
    echo quit | nvidia-cuda-mps-control             stop the daemon

Pipe and log directories come from ``CUDA_MPS_PIPE_DIRECTORY`` /
``CUDA_MPS_LOG_DIRECTORY`` (set for the daemon and for every client).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from foundation.errors import StokeError

CONTROL_BINARY = "nvidia-cuda-mps-control"


class MpsError(StokeError, RuntimeError):
    """The MPS control daemon is missing or refused a command."""


@dataclass(frozen=True)
class MpsCommandResult:
    command: str
    output: str


Runner = Callable[[Sequence[str], str, Mapping[str, str]], tuple[int, str, str]]


def _run(argv: Sequence[str], stdin: str, env: Mapping[str, str]) -> tuple[int, str, str]:
    try:
        proc = subprocess.run(list(argv), input=stdin, capture_output=True, text=True, env=dict(env), timeout=30)
    except subprocess.TimeoutExpired:
        return 124, "", "no answer within 30 s (is the MPS control daemon hung?)"
    return proc.returncode, proc.stdout, proc.stderr


def parse_pids(output: str) -> list[int]:
    """PIDs from a `get_server_list` / `get_client_list` answer (one per line; other lines ignored)."""
    pids = []
    for line in output.splitlines():
        token = line.strip()
        if token.isdigit():
            pids.append(int(token))
    return pids


def check_percentage(pct: float) -> int:
    value = int(round(pct))
    if not 1 <= value <= 100:
        raise MpsError(f"active thread percentage must be in 1..100, got {pct!r}")
    return value


class MpsControl:
    """Start, command and stop the MPS control daemon of one node."""

    def __init__(
        self,
        *,
        pipe_dir: str | None = None,
        log_dir: str | None = None,
        binary: str = CONTROL_BINARY,
        runner: Runner | None = None,
    ) -> None:
        self.pipe_dir = pipe_dir
        self.log_dir = log_dir
        self.binary = binary
        self._runner = runner or _run
        self.started = False
        self.owned = False  # True only when start() launched the daemon itself

    def env(self) -> dict[str, str]:
        """Environment for the daemon and its clients (pipe/log directories when set)."""
        env = dict(os.environ)
        if self.pipe_dir:
            env["CUDA_MPS_PIPE_DIRECTORY"] = self.pipe_dir
        if self.log_dir:
            env["CUDA_MPS_LOG_DIRECTORY"] = self.log_dir
        return env

    def client_env(self, share_pct: float) -> dict[str, str]:
        out = {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(check_percentage(share_pct))}
        if self.pipe_dir:
            out["CUDA_MPS_PIPE_DIRECTORY"] = self.pipe_dir
        if self.log_dir:
            out["CUDA_MPS_LOG_DIRECTORY"] = self.log_dir
        return out

    def _binary(self) -> str:
        path = shutil.which(self.binary, path=self.env().get("PATH")) if os.sep not in self.binary else self.binary
        if not path:
            raise MpsError(f"{self.binary} not found on PATH; install the NVIDIA driver utilities (MPS) on this node")
        return path

    def _call(self, args: Sequence[str] = (), stdin: str = "") -> str:
        for d in (self.pipe_dir, self.log_dir):
            if d:
                os.makedirs(d, exist_ok=True)
        argv = [self._binary(), *args]
        code, out, err = self._runner(argv, stdin, self.env())
        if code != 0:
            raise MpsError(f"{' '.join(argv)} {stdin.strip()!r} failed with code {code}: {(err or out).strip()}")
        return out

    def command(self, text: str) -> MpsCommandResult:
        """Send one control command (e.g. ``get_server_list``) on stdin; returns its output."""
        return MpsCommandResult(text, self._call(stdin=text.rstrip("\n") + "\n"))

    def start(self) -> None:
        """Start the daemon (`-d`); a daemon already running is reused (and then not owned)."""
        if self.started:
            return
        try:
            self._call(["-d"])
            self.owned = True
        except MpsError as err:
            if "already running" not in str(err).lower():
                raise
        self.started = True

    ensure_started = start

    def list_servers(self) -> list[int]:
        return parse_pids(self.command("get_server_list").output)

    def list_clients(self, server_pid: int | None = None) -> dict[int, list[int]]:
        """{server PID: client PIDs} for one server or all of them."""
        servers = [server_pid] if server_pid is not None else self.list_servers()
        return {pid: parse_pids(self.command(f"get_client_list {pid}").output) for pid in servers}

    def set_active_thread_percentage(self, pct: float, server_pid: int | None = None) -> None:
        """For one running server, or the default of servers started from now on."""
        value = check_percentage(pct)
        if server_pid is None:
            self.command(f"set_default_active_thread_percentage {value}")
        else:
            self.command(f"set_active_thread_percentage {server_pid} {value}")

    def quit(self) -> None:
        """Stop the daemon, but only one this object started: other jobs may share a node's daemon."""
        if self.owned:
            self.command("quit")
        self.started = self.owned = False
