"""The closed loop through the API and the CLI (real server in process, gRPC on loopback): rate_rps: auto from a
workload file, heartbeat windows, `stoke observations`, `stoke status`, `stoke profiles ls/rollback/resume`."""

from __future__ import annotations

import json
import time

import pytest
from profiles import accel_sim_profile

from controller.config import ControllerConfig, RecalibrationConfig, ServiceConfig
from controller.messages import BatchStat, HeartbeatReport, NodeDevice, Observation
from controller.server import ControllerServer
from interference.profile_io import profile_to_dict
from stoke.cli import main

pytestmark = pytest.mark.slow  # a gRPC server on loopback: make test-fast skips it

TOKEN = "loop-token"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("loop")
    (tmp / "token").write_text(TOKEN + "\n")
    (tmp / "token").chmod(0o600)
    config = ControllerConfig(
        listen="127.0.0.1:0",
        metrics_listen="",
        db=str(tmp / "c.db"),
        token_file=str(tmp / "token"),
        reconcile_interval_s=0.1,
        service=ServiceConfig(
            heartbeat_interval_s=0.5,
            heartbeat_timeout_s=30.0,
            recalibration=RecalibrationConfig(interval_s=0.1, half_life_s=30.0, min_windows=3, min_executions=10),
        ),
    )
    srv = ControllerServer(config).start()
    srv.tmp = tmp
    yield srv
    srv.stop()


def cli(server, capsys, *args):
    code = main([*args, "--controller", server.address, "--token-file", str(server.tmp / "token")])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_auto_workload_observations_status_and_profile_versions(server, capsys, tmp_path):
    profile = tmp_path / "accel.json"
    profile.write_text(json.dumps(profile_to_dict(accel_sim_profile(2, "CPU"))))
    assert cli(server, capsys, "profiles", "upload", str(profile))[0] == 0
    workloads = tmp_path / "w.yaml"
    workloads.write_text(
        "workloads:\n  - {name: web, model: accel_sim, slo_ms: 80, rate_rps: auto, min_rps: 5, max_rps: 300}\n"
    )
    code, out, err = cli(server, capsys, "workload", "apply", "-f", str(workloads))
    assert code == 0, err
    bad = tmp_path / "bad.yaml"
    bad.write_text("workloads:\n  - {name: x, model: accel_sim, slo_ms: 80, rate_rps: 5, max_rps: 9}\n")
    code, _, err = cli(server, capsys, "workload", "apply", "-f", str(bad))
    assert code == 2 and "max_rps applies to rate_rps: auto only" in err
    code, out, _ = cli(server, capsys, "workload", "ls")
    assert "auto 5" in out

    from controller.api.client import ControllerClient

    with ControllerClient(server.address, token=TOKEN) as user:
        agent_token = user.mint_agent_token("n1").token
    with ControllerClient(server.address, token=agent_token) as agent:
        agent.register("n1", [NodeDevice(0, "cpu", "cpu", cores=2)])
        server.service.reconcile()
        running = agent.heartbeat(HeartbeatReport("n1")).assignments
        assert running and running[0].rate_rps == 5.0
        for seq in range(1, 7):  # windows twice as slow as the profile, at 40 req/s: demand and recalibration act
            stats = (BatchStat(1, 10, 2 * (10 + 5) / 1 + 2.0 * 2), BatchStat(2, 15, 2 * (10 + 10) + 2.0 * 2))
            o = Observation(
                "web#0", "accel_sim", request_rate_rps=40.0, seq=seq, window_s=1.0, requests=40, batch_stats=stats
            )
            o = Observation(**{**o.__dict__, "latency_count": 40, "latency_p99_ms": 55.0, "over_slo_ratio": 0.0})
            running = agent.heartbeat(HeartbeatReport("n1", running=running, observed=(o,))).assignments
            server.service.reconcile()
            time.sleep(0.15)  # past the recalibration interval: each window gets its estimate

    code, out, _ = cli(server, capsys, "observations", "--workload", "web", "--limit", "3")
    assert code == 0 and "web#0" in out and "n1/0" in out and "window(s) stored" in out
    code, out, _ = cli(server, capsys, "observations", "--json")
    data = json.loads(out)
    assert data["stored"] == 6 and data["observations"][0]["batch_stats"][1]["executions"] == 15
    assert data["observations"][-1]["error_ratio"] == pytest.approx(2.0, rel=0.01)  # the first, vs the fitted

    code, out, _ = cli(server, capsys, "status")
    assert code == 0 and "closed loop:" in out and "rate auto min 5 max 300: hold:" in out and "p99 55.0 ms" in out
    assert "demand: up: 2 heartbeat(s) at 40.0-40.0 req/s" in out  # the loop's events
    assert "recalibration: accel_sim on CPU: profile v1" in out

    code, out, _ = cli(server, capsys, "profiles", "ls", "--versions")
    assert code == 0 and "v1 x2.0" in out and "fitted" in out and "scale" in out
    code, out, _ = cli(server, capsys, "profiles", "rollback", "accel_sim")
    assert code == 0 and "fitted (pinned)" in out
    code, out, _ = cli(server, capsys, "profiles", "resume", "accel_sim", "--json")
    assert code == 0 and json.loads(out)[0]["pinned"] is False
    code, _, err = cli(server, capsys, "profiles", "rollback", "nope")
    assert code == 2 and "'nope' has no profile; profiled: accel_sim/CPU" in err
