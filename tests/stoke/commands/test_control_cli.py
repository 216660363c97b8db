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
    srv = start_server(tmp_path_factory.mktemp("ctl"))
    yield srv
    srv.stop()


def start_server(tmp: Path) -> ControllerServer:
    """A controller on loopback with the user token TOKEN and the CPU test profile."""
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
    return ControllerServer(config).start()


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
    web = {"name": "web", "model": "mlp_small", "slo_ms": 100.0, "rate_rps": 20.0, "gpu_type": None}
    assert listed == [web | {"arrivals": "poisson"}]


def test_workload_apply_says_a_file_s_gpu_types_are_not_applied(env, capsys, tmp_path):
    """The controller's nodes are its inventory: a file's gpu_types (prices, max_count) were dropped in silence."""
    typed = tmp_path / "typed.yaml"
    typed.write_text("gpu_types: [{name: X, price_per_hour: 1, max_count: 1}]\n" + WORKLOADS)
    code, _, err = run(capsys, "workload", "apply", "-f", str(typed), "--dry-run")
    assert code == 0 and "its gpu_types ('X') are not applied" in err and "max_count" in err, err
    plain = tmp_path / "plain.yaml"
    plain.write_text(WORKLOADS)
    code, _, err = run(capsys, "workload", "apply", "-f", str(plain), "--dry-run")
    assert code == 0 and "warning" not in err


def test_workload_apply_and_its_dry_run_refuse_what_stoke_plan_refuses(env, capsys, tmp_path):
    """An SLO no profiled device can meet even alone (slo_ms 0.5) is refused by `stoke plan`, by the dry run and
    by the apply alike, with the solver's reason; nothing is stored."""
    before = run(capsys, "workload", "ls", "-o", "json")[1]
    fast = tmp_path / "fast.yaml"
    fast.write_text("workloads:\n  - {name: fast, model: mlp_small, slo_ms: 0.5, rate_rps: 20}\n")
    profile = tmp_path / "cpu.json"
    save_profile(cpu_profile(), profile)
    code, _, plan_err = run(capsys, "plan", str(fast), "--profile", str(profile))
    assert code == 2 and "cannot meet its SLO of 0.5 ms" in plan_err
    for extra in (["--dry-run"], []):
        code, out, err = run(capsys, "workload", "apply", "-f", str(fast), *extra)
        assert code == 2 and "would be created" not in out, (extra, out)
        assert "workloads[0].slo_ms" in err and "cannot meet its SLO of 0.5 ms" in err and "relax the SLO" in err
    assert run(capsys, "workload", "ls", "-o", "json")[1] == before


def test_a_controller_that_is_down_is_one_plain_line_with_the_fix(capsys, monkeypatch):
    monkeypatch.delenv("STOKE_CONTROLLER", raising=False)
    for argv in (["status"], ["workload", "ls"], ["plan", "--remote"]):
        code, _, err = run(capsys, *argv, "--controller", "127.0.0.1:1")
        line = err.strip()
        assert code == 2 and len(line.splitlines()) == 1, err
        assert "controller at 127.0.0.1:1 is unreachable: nothing listens on that port" in line
        assert "`stoke controller`" in line and "--controller HOST:PORT" in line
        # none of gRPC's own words
        for raw in ("failed to connect to all addresses", "ipv4:", "UNKNOWN", "last error"):
            assert raw not in line, line


@pytest.mark.parametrize(
    "address, problem",
    [
        ("localhost", "the port is missing"),  # was "nothing listens on that port"
        ("127.0.0.1:99999", "port 99999 is out of range"),  # was "nothing listens on that port"
        ("127.0.0.1:0", "port 0 is out of range"),
        ("127.0.0.1:http", "'http' is not a port number"),
    ],
)
def test_a_malformed_controller_address_is_refused_before_any_call(capsys, monkeypatch, tmp_path, address, problem):
    monkeypatch.delenv("STOKE_CONTROLLER", raising=False)
    agent = ["agent", "--device", "cpu", "--repo", str(ROOT / "triton_repo"), "--workdir", str(tmp_path / "w")]
    for argv in (["status"], ["workload", "ls"], agent, ["k8s", "operator"]):
        code, _, err = run(capsys, *argv, "--controller", address)
        assert code == 2 and err.startswith(
            f"stoke: error: --controller must be HOST:PORT with a port from 1 to 65535, got {address!r}; {problem}"
        ), (argv, err)
        assert "unreachable" not in err and "controller listens on port 50051" in err
    monkeypatch.setenv("STOKE_CONTROLLER", address)
    code, _, err = run(capsys, "status")
    assert code == 2 and "$STOKE_CONTROLLER must be HOST:PORT" in err and problem in err
    assert not (tmp_path / "w").exists()


def test_a_name_that_does_not_resolve_is_said_as_such_with_its_fix(capsys, monkeypatch):
    from controller.api.client import unreachable_reason

    # grpcio 1.8x's detail for an unknown name; it read "it did not answer"
    detail = (
        "errors resolving nosuchhost.invalid:50051: [field:hostname lookup error:address lookup failed for "
        "nosuchhost.invalid:50051: Domain name not found]"
    )
    assert unreachable_reason(detail) == "its host name does not resolve"
    monkeypatch.delenv("STOKE_CONTROLLER", raising=False)
    code, _, err = run(capsys, "status", "--controller", "nosuchhost.invalid:50051")  # .invalid never resolves
    if "does not resolve" not in err:  # the wording is checked above; a machine's resolver may answer otherwise
        pytest.skip(f"this machine's resolver did not refuse the name: {err.strip()[:200]}")
    assert code == 2 and "controller at nosuchhost.invalid:50051 is unreachable: its host name does not resolve" in err
    assert "check the host name in --controller HOST:PORT" in err and "start it" not in err


def test_tls_against_a_plaintext_controller_is_stoke_s_one_line_without_grpc_s_log(env):
    # the probe: gRPC's C core wrote "I1203 ... ssl_transport_security.cc ... Handshake failed" before stoke's line
    quiet = {k: v for k, v in os.environ.items() if k != "GRPC_VERBOSITY"}
    proc = subprocess.run(
        [sys.executable, "-m", "stoke", "status", "--tls"], cwd=ROOT, env=quiet, capture_output=True, text=True
    )
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("stoke: error: ") and "did not complete a TLS handshake" in lines[0]


def test_out_of_range_ports_of_the_agent_and_the_operator_are_refused_naming_the_flag(capsys, tmp_path):
    argv = ["agent", "--controller", "127.0.0.1:1", "--device", "cpu", "--workdir", str(tmp_path / "w")]
    code, _, err = run(capsys, *argv, "--metrics-port", "99999")  # was OverflowError's traceback
    assert code == 2 and "--metrics-port must be a whole number >= -1 up to 65,535, got 99999" in err
    code, _, err = run(capsys, "k8s", "operator", "--controller", "127.0.0.1:1", "--bootstrap-listen", "0.0.0.0:70000")
    assert code == 2 and "--bootstrap-listen must be HOST:PORT" in err and "port 70000 is out of range" in err


def test_an_agent_given_the_user_token_fails_at_once_with_the_fix(capsys, tmp_path, monkeypatch):
    monkeypatch.delenv("STOKE_TOKEN", raising=False)
    user = tmp_path / "token"
    user.write_text(TOKEN + "\n")
    user.chmod(0o600)
    argv = ["agent", "--controller", "127.0.0.1:1", "--token-file", str(user), "--device", "cpu"]
    argv += ["--repo", str(ROOT / "triton_repo"), "--workdir", str(tmp_path / "work"), "--metrics-port", "-1"]
    started = time.monotonic()
    code, out, err = run(capsys, *argv)
    assert code == 2 and time.monotonic() - started < 10
    assert f"--token-file {user}: not an agent token" in err and "stoke token agent NODE --file NODE.token" in err
    assert "Triton keeps serving" not in err + out and not (tmp_path / "work").exists()


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


def test_plan_remote_status_and_metrics_count_the_same_devices_and_cost():
    """One definition: a device is in use when a planned GPU is bound to a node device. A planned GPU that no
    free device could take (here the second) is listed apart by `plan --remote`, not counted."""
    from controller.api.views import plan_to_pb, status_to_pb
    from controller.reconcile.planning import PlanView
    from controller.reconcile.slots import Binding
    from controller.status import cluster_status
    from planner.solver.problem import GpuPlan, Placement, Plan, Workload
    from stoke.commands.control import format_remote_plan

    gpus = tuple(
        GpuPlan("CPU", 0.1, (Placement(name, "mlp_small", 100, 20, 50.0, 2, 0.0, 5.0, 80.0),)) for name in ("a", "b")
    )
    view = PlanView(1, Plan("stoke", gpus), (Binding("n1", 0, "CPU"), None), (("b", "no free CPU device"),), 0.0)
    workloads = [Workload(name, "mlp_small", 100, 20) for name in ("a", "b")]
    status = status_to_pb(cluster_status(view, workloads, [], ""))
    assert (status.gpus_in_use, status.cost_per_hour) == (1, pytest.approx(0.1))  # what stoke_gpus_in_use exports
    text = format_remote_plan(plan_to_pb(view))
    assert text.splitlines()[0].startswith("plan revision 1 (stoke): 1 device(s) in use, $0.10/hour; 1 more planned")
    wide = format_remote_plan(plan_to_pb(view), wide=True)
    assert wide.splitlines()[2].split()[-2:] == ["thru_rps", "util"]


def test_profiles_upload_warns_when_no_node_has_the_profile_s_device_type(env, capsys, tmp_path):
    profile = tmp_path / "cpu-2core.json"
    save_profile(cpu_profile(), profile)
    data = json.loads(profile.read_text())
    data["gpu"]["name"] = "cpu-2core"  # as `stoke profile run` names a 2-core node's profile
    profile.write_text(json.dumps(data))
    with ControllerClient(env.address, token=TOKEN) as user:
        token = user.mint_agent_token("n-up").token
    with ControllerClient(env.address, token=token) as node:
        node.register("n-up", (NodeDevice(0, "cpu", "cpu", cores=2),), "n-up.example")
    code, out, err = run(capsys, "profiles", "upload", str(profile))
    assert code == 0 and "cpu-2core" in out  # stored, as before
    warning = err.strip()
    assert warning.startswith("stoke: warning: no registered node has a device of GPU type 'cpu-2core'")
    assert "CPU on " in warning and "n-up/0" in warning and "--gpu-type CPU" in warning
    code, out, err = run(capsys, "profiles", "upload", str(profile), "--gpu-type", "CPU", "--json")
    assert code == 0 and err == "" and json.loads(out)["warnings"] == []


def test_report_draws_observed_against_predicted_p99_from_a_running_controller(
    capsys, tmp_path, tmp_path_factory, monkeypatch
):
    """`stoke report --observed`: the controller's observation windows become the over-time figure."""
    srv = start_server(tmp_path_factory.mktemp("ctl-report"))  # a controller of its own: its only node is below
    monkeypatch.setenv("STOKE_CONTROLLER", srv.address)
    monkeypatch.setenv("STOKE_TOKEN", TOKEN)
    try:
        _report_with_observations(srv, capsys, tmp_path)
    finally:
        srv.stop()


def _report_with_observations(env, capsys, tmp_path):
    from controller.messages import Observation

    workloads = tmp_path / "w.yaml"
    workloads.write_text("workloads:\n  - {name: seen, model: mlp_small, slo_ms: 100, rate_rps: 20}\n")
    assert run(capsys, "workload", "apply", "-f", str(workloads))[0] == 0
    with ControllerClient(env.address, token=TOKEN) as user:
        token = user.mint_agent_token("n-obs").token
    with ControllerClient(env.address, token=token) as c:
        c.register("n-obs", (NodeDevice(0, "cpu", "cpu", cores=2), NodeDevice(1, "cpu", "cpu", cores=2)), "n-obs")
        deadline = time.monotonic() + 20
        mine: list[ModelAssignment] = []
        while not mine and time.monotonic() < deadline:
            answer = c.heartbeat(HeartbeatReport("n-obs"))
            mine = [a for a in answer.assignments if a.workload == "seen"]
            time.sleep(0.1)
        assert mine, "the controller did not place the workload on the node"
        for seq in range(1, 4):
            windows = tuple(
                Observation(
                    a.key, a.model, seq=seq, window_s=1.0, requests=20, latency_count=20, latency_p99_ms=5.0 + seq
                )
                for a in answer.assignments
            )
            c.heartbeat(
                HeartbeatReport("n-obs", running=answer.assignments, observed=windows, applied_revision=answer.revision)
            )
    out = tmp_path / "r.html"
    profile = tmp_path / "cpu.json"
    save_profile(cpu_profile(), profile)
    code, text, err = run(capsys, "report", str(workloads), "--profile", str(profile), "--out", str(out), "--observed")
    assert code == 0, err
    assert "observation window(s)" in text and "warning" not in err
    html = out.read_text()
    assert html.count("<img ") == 4 and "observed against predicted p99 over time" in html
    # without the file, the plan would be of the bundled example beside these observations: said
    code, _, err = run(capsys, "report", "--out", str(out), "--observed")
    assert code == 0 and "--observed without WORKLOADS.yaml: the report's plan is of the bundled example" in err
