"""Helpers of the chaos suite (issue 10): real controller and agent processes on loopback, broken on purpose.

Every process a test starts is a `Proc` (or is recorded by pid, like the Triton servers an agent leaves
behind when it alone is killed) and is stopped by pid when the test ends: SIGTERM, then SIGKILL, never by
name. Timeouts are generous and bounded; nothing leaves loopback.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from control_helpers import cpu_profile_json, wait_for

from controller.api.client import ControllerClient

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "chaos-user-token"
HEARTBEAT_S = 0.3
TIMEOUT_S = 2.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def children_of() -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            out.setdefault(ppid, []).append(int(entry.name))
    return out


def descendants(pid: int) -> list[int]:
    children, out, todo = children_of(), [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def tritons_of(pid: int) -> list[int]:
    """The tritonserver processes below `pid`."""
    out = []
    for child in descendants(pid):
        try:
            argv0 = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")[0]
        except OSError:
            continue
        if argv0.endswith(b"tritonserver"):
            out.append(child)
    return out


def stop_pids(pids: list[int], grace_s: float = 10.0) -> None:
    """SIGTERM each pid, then SIGKILL what is left after `grace_s`: by pid, one at a time."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(alive(p) for p in pids):
            time.sleep(0.05)


class Proc:
    """One `python -m stoke ...` process of the test, in its own session."""

    def __init__(self, name: str, args: list[str], log: Path) -> None:
        self.name, self.args, self.log = name, args, log
        self.popen: subprocess.Popen | None = None
        self.seen: set[int] = set()  # every descendant ever seen: all are stopped at the end

    def start(self) -> Proc:
        with open(self.log, "ab") as handle:
            self.popen = subprocess.Popen(
                [sys.executable, "-m", "stoke", *self.args],
                cwd=ROOT,
                stdout=handle,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def note_children(self) -> list[int]:
        kids = descendants(self.pid) if self.popen is not None else []
        self.seen.update(kids)
        return kids

    def signal(self, sig: int) -> None:
        """`sig` to this process only (not its children)."""
        os.kill(self.pid, sig)

    def kill9(self) -> None:
        """SIGKILL this process only: its children (Triton, the solver worker) are orphaned, as in a crash."""
        self.note_children()
        self.popen.kill()
        self.popen.wait()

    def stop(self) -> None:
        if self.popen is None:
            return
        if self.popen.poll() is None:
            self.note_children()
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        stop_pids([p for p in self.seen if alive(p)])

    def tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-3000:]
        except OSError:
            return ""


class Cluster:
    """A controller process (and agents) in one temp folder; everything it starts is stopped at the end."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: list[Proc] = []
        self.extra_pids: list[int] = []  # processes started below ours that outlived their parent
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        (tmp / "token").write_text(TOKEN + "\n")
        (tmp / "token").chmod(0o600)
        (tmp / "cpu.json").write_text(cpu_profile_json())
        self._clients: list[ControllerClient] = []

    def config(self, **extra: Any) -> Path:
        lines = {
            "listen": self.address,
            "metrics_listen": "''",
            "db": "controller.db",
            "token_file": "token",
            "heartbeat_interval_s": HEARTBEAT_S,
            "heartbeat_timeout_s": TIMEOUT_S,
            "reconcile_interval_s": 0.2,
            **extra,
        }
        text = "".join(f"{k}: {v}\n" for k, v in lines.items()) + "profiles:\n  - path: cpu.json\n"
        (self.tmp / "controller.yaml").write_text(text)
        return self.tmp / "controller.yaml"

    def controller(self, **extra: Any) -> Proc:
        proc = Proc(
            "controller",
            ["controller", "--config", str(self.config(**extra)), "--log-level", "WARNING"],
            self.tmp / "controller.log",
        )
        self.procs.append(proc)
        proc.start()
        wait_for("the controller", lambda: self.client().list_profiles().profiles, 60)
        return proc

    def client(self, token: str = TOKEN) -> ControllerClient:
        c = ControllerClient(self.address, token=token, timeout_s=10)
        self._clients.append(c)
        return c

    def agent_token(self, node_id: str) -> Path:
        path = self.tmp / f"{node_id}.token"
        path.write_text(self.client().mint_agent_token(node_id).token + "\n")
        path.chmod(0o600)
        return path

    def agent(
        self,
        node_id: str,
        *,
        token: Path | None = None,
        controller: str | None = None,
        repository: Path | None = None,
        extra: tuple[str, ...] = (),
    ) -> Proc:
        """`stoke agent` on a CPU device; `extra` arguments are appended (e.g. --sli-metrics URL)."""
        proc = Proc(
            node_id,
            [
                "agent",
                "--controller",
                controller or self.address,
                "--token-file",
                str(token or self.agent_token(node_id)),
                "--device",
                "cpu",
                "--repo",
                str(repository or ROOT / "triton_repo"),
                "--workdir",
                str(self.tmp / f"work-{node_id}"),
                "--ready-timeout",
                "60",
                "--log-level",
                "INFO",
                *extra,
            ],
            self.tmp / f"{node_id}.log",
        )
        self.procs.append(proc)
        return proc.start()

    def close(self) -> None:
        for c in self._clients:
            c.close()
        for proc in reversed(self.procs):
            proc.stop()
        stop_pids([p for p in self.extra_pids if alive(p)])


def triton_available() -> bool:
    try:
        from agents.triton import find_tritonserver

        find_tritonserver()
        return True
    except Exception:  # noqa: BLE001
        return False


needs_triton = pytest.mark.skipif(not triton_available(), reason="tritonserver not available")


# ------------------------------------------------------------------ simulated nodes (in this process)


class SimFleet:
    """A fleet that serves whatever it is told, instantly: a node without Triton, for the real `Agent` loop."""

    def __init__(self) -> None:
        self.serving: dict[str, Any] = {}

    def refusals(self, assignments: Any) -> list[Any]:
        return []

    def apply(self, assignments: Any) -> Any:
        self.serving = {a.key: a for a in assignments}
        return type("Report", (), {"errors": (), "started": tuple(self.serving)})()

    def observe(self) -> list[Any]:
        return []

    def check_health(self) -> list[str]:
        return []

    def running(self) -> list[Any]:
        return list(self.serving.values())

    def close(self) -> None:
        self.serving = {}


def sim_agent(cluster: Cluster, node_id: str, gpu_type: str = "SIM") -> Any:
    """A real `Agent` loop over real gRPC with its own node token, on a device of `gpu_type` (default: a type
    without a profile, so it holds no workload and only counts as a node)."""
    from agents.agent import Agent
    from controller.messages import NodeDevice

    token = cluster.client().mint_agent_token(node_id).token
    client = ControllerClient(cluster.address, token=token, timeout_s=5)
    cluster._clients.append(client)
    agent = Agent(client, SimFleet(), node_id, (NodeDevice(0, "sim", "cpu", cores=2, gpu_type=gpu_type),))
    agent.start()
    return agent
