"""Client commands against a real controller in process: environment, dry runs, stdin, endpoints, output formats."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml
from control_helpers import cpu_profile

from controller.api.client import ControllerClient
from controller.config import ControllerConfig, ProfileSource, ServiceConfig
from controller.messages import HeartbeatReport, ModelAssignment, NodeDevice, ServingEndpoint
from controller.server import ControllerServer
from interference.profile_io import save_profile
from stoke.cli import main

pytestmark = pytest.mark.slow  # a gRPC server on loopback (and a watch subprocess): make test-fast skips it

TOKEN = "cli-token"
ROOT = Path(__file__).resolve().parents[3]
WORKLOADS = "workloads:\n  - {name: web, model: mlp_small, slo_ms: 100, rate_rps: 20}\n"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ctl")
    (tmp / "token").write_text(TOKEN + "\n")
    save_profile(cpu_profile(), tmp / "cpu.json")
    config = ControllerConfig(
        listen="127.0.0.1:0",
        metrics_listen="",
        db=str(tmp / "c.db"),
        token_file=str(tmp / "token"),
        reconcile_interval_s=0.1,
        profiles=(ProfileSource(str(tmp / "cpu.json"), "CPU"),),
        service=ServiceConfig(heartbeat_interval_s=0.5, heartbeat_timeout_s=30.0),
    )
    srv = ControllerServer(config).start()
    yield srv
    srv.stop()


@pytest.fixture
def env(server, monkeypatch):
    """Only the environment names the controller and the token: no flag does."""
    monkeypatch.setenv("STOKE_CONTROLLER", server.address)
    monkeypatch.setenv("STOKE_TOKEN", TOKEN)
    return server


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_the_environment_names_the_controller_for_every_client_command(env, capsys, monkeypatch):
    assert run(capsys, "workload", "ls")[0] == 0
    # plan --remote ignored $STOKE_CONTROLLER before; it reaches this controller now (which has no plan yet)
    code, _, err = run(capsys, "plan", "--remote", "--json")
    assert code == 2 and f"controller {env.address}: no plan has been applied yet" in err
    monkeypatch.setenv("STOKE_CONTROLLER", "127.0.0.1:1")
    code, _, err = run(capsys, "plan", "--remote")
    assert code == 2 and "127.0.0.1:1" in err and "$STOKE_CONTROLLER" in err
    code, _, err = run(capsys, "plan", "--remote", "--controller", env.address)  # a flag wins over the environment
    assert code == 2 and f"controller {env.address}:" in err


def test_workload_apply_dry_run_stores_nothing_and_reads_stdin(env, capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "stdin", io.StringIO(WORKLOADS))
    code, out, err = run(capsys, "workload", "apply", "-f", "-", "--dry-run")
    assert code == 0, err
    assert out.splitlines()[2].split() == ["web", "would", "be", "created"] and "nothing stored" in out
    assert run(capsys, "workload", "ls", "-o", "json")[1].strip() == "[]"
    # the controller checks a dry run as it checks an apply: an unprofiled model is refused, nothing stored
    bad = tmp_path / "bad.yaml"
    bad.write_text("workloads:\n  - {name: x, model: bert, slo_ms: 100, rate_rps: 20}\n")
    code, _, err = run(capsys, "workload", "apply", "-f", str(bad), "--dry-run")
    assert code == 2 and "no fitted profile" in err and str(bad) in err
    monkeypatch.setattr(sys, "stdin", io.StringIO(WORKLOADS))
    code, out, _ = run(capsys, "workload", "apply", "-f", "-", "-o", "yaml")
    assert code == 0 and yaml.safe_load(out) == {"created": ["web"], "updated": [], "unchanged": [], "dry_run": False}
    good = tmp_path / "w.yaml"
    good.write_text(WORKLOADS.replace("rate_rps: 20", "rate_rps: 30"))
    code, out, _ = run(capsys, "workload", "apply", "-f", str(good), "--dry-run", "--json")
    assert json.loads(out)["updated"] == ["web"] and json.loads(out)["dry_run"] is True
    listed = yaml.safe_load(run(capsys, "workload", "ls", "-o", "yaml")[1])
    assert listed == [{"name": "web", "model": "mlp_small", "slo_ms": 100.0, "rate_rps": 20.0, "gpu_type": None}]


def _node_reporting_endpoints(address: str) -> None:
    """A node that runs the plan's assignment and reports where it is reached (what an agent does)."""
    with ControllerClient(address, token=TOKEN) as user:
        token = user.mint_agent_token("n1").token  # an agent holds its node's own token
    with ControllerClient(address, token=token) as c:
        c.register("n1", (NodeDevice(0, "cpu", "cpu", cores=2),), "node-a.example")
        deadline = time.monotonic() + 20
        while True:
            answer = c.heartbeat(HeartbeatReport("n1"))
            if answer.assignments or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert answer.assignments, "the controller assigned nothing to the node"
        a: ModelAssignment = answer.assignments[0]
        endpoint = ServingEndpoint(
            a.key,
            "node-a.example:8100",
            "http://node-a.example:8101",
            "http://node-a.example:8101/metrics",
            "127.0.0.1:40001",
        )
        c.heartbeat(HeartbeatReport("n1", running=(a,), endpoints=(endpoint,), applied_revision=answer.revision))


def test_status_and_nodes_show_the_grpc_http_and_metrics_endpoints(env, capsys):
    _node_reporting_endpoints(env.address)
    code, out, err = run(capsys, "status")
    assert code == 0, err
    lines = out.splitlines()
    head = lines.index("endpoints (stable across share moves):")
    assert lines[head + 1].split() == ["workload", "replica", "node", "grpc", "http", "metrics"]
    assert lines[head + 3].split() == [
        "web",
        "0",
        "n1",
        "node-a.example:8100",
        "http://node-a.example:8101",
        "http://node-a.example:8101/metrics",
    ]
    code, out, _ = run(capsys, "status", "-o", "wide")
    assert "backend" in out and "127.0.0.1:40001" in out
    replica = json.loads(run(capsys, "status", "--json")[1])["workloads"][0]["replicas"][0]
    assert (replica["endpoint"], replica["http_endpoint"], replica["metrics_endpoint"], replica["backend"]) == (
        "node-a.example:8100",
        "http://node-a.example:8101",
        "http://node-a.example:8101/metrics",
        "127.0.0.1:40001",
    )
    code, out, _ = run(capsys, "nodes")
    assert code == 0
    assert out.splitlines()[2].split()[:3] == ["n1", "ready", "node-a.example"]  # the --advertise host
    lines = out.splitlines()
    assert lines[lines.index("endpoints:") + 3].split() == [
        "n1",
        "web#0",
        "node-a.example:8100",
        "http://node-a.example:8101",
        "http://node-a.example:8101/metrics",
    ]
    node = json.loads(run(capsys, "nodes", "-o", "json")[1])[0]
    assert node["address"] == "node-a.example" and node["endpoints"][0]["grpc"] == "node-a.example:8100"


def test_status_watch_prints_plain_blocks_when_piped(env):
    """Piped, --watch prints one block per refresh (no screen clearing, no escape codes) until interrupted."""
    # started with SIGINT ignored, as a background job of a script is (CI, nohup ... &): Ctrl-C must still stop it
    start = (
        "import runpy, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
        "sys.argv = ['stoke', 'status', '--watch', '0.3']; runpy.run_module('stoke', run_name='__main__')"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", start],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONFAULTHANDLER": "1"},  # SIGABRT dumps every thread, should it hang
    )
    seen = []  # two refreshes before Ctrl-C, however slow the machine is
    deadline = time.monotonic() + 60
    while sum("Ctrl-C stops" in line for line in seen) < 2 and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line)
    proc.send_signal(signal.SIGINT)
    hung = threading.Timer(30, proc.send_signal, (signal.SIGABRT,))
    hung.start()
    out = "".join(seen) + proc.stdout.read()  # the same buffered reader: nothing read ahead is lost
    err = proc.stderr.read()
    proc.wait()
    hung.cancel()
    assert proc.returncode != -signal.SIGABRT, f"still running 30 s after Ctrl-C; its threads:\n{err}"
    assert proc.returncode == 130, err
    assert "\x1b" not in out
    frames = [line for line in out.splitlines() if line.startswith("[") and "Ctrl-C stops" in line]
    assert len(frames) >= 2, out
    assert out.count("plan revision") == len(frames)
    assert out.count("endpoints (stable across share moves):") <= 1  # printed again only when they change
