"""The gRPC API on loopback: auth, validation, health, reflection, metrics (real server, in process)."""

from __future__ import annotations

import urllib.request

import grpc
import pytest
from control_helpers import cpu_profile_json
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from controller.api import convert
from controller.api import stoke_pb2 as pb
from controller.api.client import ControllerClient
from controller.config import ControllerConfig, ServiceConfig
from controller.messages import HeartbeatReport, InvalidArgument, NodeDevice, NotFound, Unauthenticated
from controller.server import ControllerServer
from planner.solver import Workload

pytestmark = pytest.mark.slow  # gRPC servers on loopback: make test-fast skips it

TOKEN = "s3cret-token"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ctl")
    (tmp / "token").write_text(TOKEN + "\n")
    config = ControllerConfig(
        listen="127.0.0.1:0",
        metrics_listen="127.0.0.1:0",
        db=str(tmp / "c.db"),
        token_file=str(tmp / "token"),
        reconcile_interval_s=0.1,
        service=ServiceConfig(heartbeat_interval_s=0.2, heartbeat_timeout_s=2.0),
    )
    srv = ControllerServer(config).start()
    yield srv
    srv.stop()


@pytest.fixture
def client(server):
    with ControllerClient(server.address, token=TOKEN) as c:
        yield c


def agent_client(server, client, node_id):
    """A client holding the node's own agent token, minted with the user token."""
    return ControllerClient(server.address, token=client.mint_agent_token(node_id).token)


def test_call_without_or_with_wrong_token_is_unauthenticated(server):
    for token in (None, "wrong"):
        with ControllerClient(server.address, token=token) as anon:
            with pytest.raises(Unauthenticated):
                anon.list_workloads()
    channel = grpc.insecure_channel(server.address)
    from controller.api import stoke_pb2_grpc

    with pytest.raises(grpc.RpcError) as err:
        stoke_pb2_grpc.StokeControllerStub(channel).ListWorkloads(pb.ListWorkloadsRequest(), timeout=5)
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    channel.close()


def test_health_and_reflection_need_no_token(server):
    channel = grpc.insecure_channel(server.address)
    reply = health_pb2_grpc.HealthStub(channel).Check(
        health_pb2.HealthCheckRequest(service="stoke.v1.StokeController"), timeout=5
    )
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    answers = list(
        stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5)
    )
    names = {s.name for s in answers[0].list_services_response.service}
    assert {"stoke.v1.StokeController", "stoke.v1.AgentGateway", "grpc.health.v1.Health"} <= names
    channel.close()


def test_flow_validation_and_metrics(client, server):
    client.upload_profile(cpu_profile_json())
    assert {p.model for p in client.list_profiles().profiles} >= {"mlp_small", "conv_medium"}
    with pytest.raises(NotFound):
        client.get_plan()
    bad = pb.ApplyWorkloadsRequest(
        workloads=[
            pb.Workload(name="ok", model="mlp_small", slo_ms=100, rate_rps=5),
            pb.Workload(name="bad", model="mlp_small", slo_ms=100, rate_rps=0),
        ]
    )
    with pytest.raises(InvalidArgument) as err:
        client.apply_raw(bad)
    assert "workloads[1].rate_rps" in str(err.value)
    odd = pb.ApplyWorkloadsRequest(
        workloads=[pb.Workload(name="x", model="mlp_small", slo_ms=9, rate_rps=5, arrivals="bursty")]
    )
    with pytest.raises(InvalidArgument, match=r"workloads\[0\].arrivals must be one of poisson, constant"):
        client.apply_raw(odd)
    assert client.list_workloads() == []
    # a paced workload keeps its arrivals over gRPC (they were dropped: the controller planned it as Poisson)
    paced = Workload("paced", "mlp_small", 100, 20, arrivals="constant")
    assert convert.workload_from_pb(convert.workload_to_pb(paced)) == paced
    assert list(client.apply_workloads([paced], dry_run=True).created) == ["paced"]
    agent = agent_client(server, client, "n1")
    assert agent.register("n1", [NodeDevice(0, "cpu", "cpu", cores=2)]) == pytest.approx(0.2)
    reply = client.apply_workloads([Workload("web", "mlp_small", 100, 20)])
    assert list(reply.created) == ["web"]
    plan = client.apply_plan().plan
    assert plan.revision >= 1 and plan.gpus[0].node_id == "n1"
    answer = agent.heartbeat(HeartbeatReport(node_id="n1"))
    agent.close()
    assert [a.key for a in answer.assignments] == ["web#0"]
    status = client.status()
    assert status.workloads[0].name == "web" and status.workloads[0].state == "starting"
    nodes = client.list_nodes().nodes
    assert nodes[0].node_id == "n1" and nodes[0].state == "ready" and nodes[0].assigned[0].workload == "web"
    text = urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=5).read().decode()
    assert 'stoke_workload_slo_ms{model="mlp_small",workload="web"} 100.0' in text
    assert "stoke_gpus_in_use 1.0" in text and "stoke_plan_solve_seconds_count" in text
    assert client.delete_workload("web") is True and client.delete_workload("web") is False


def test_remote_plan_for_stoke_plan_remote(client, server, capsys, tmp_path):
    import argparse
    import json

    from stoke.commands.control import remote_plan

    client.upload_profile(cpu_profile_json())
    with agent_client(server, client, "n9") as agent:
        agent.register("n9", [NodeDevice(0, "cpu", "cpu", cores=2)])
    client.apply_workloads([Workload("api", "tiny_echo", 50, 10)])
    client.apply_plan()
    (tmp_path / "tok").write_text(TOKEN)
    args = argparse.Namespace(controller=server.address, token_file=str(tmp_path / "tok"), json=True)
    assert remote_plan(args) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["revision"] >= 1 and any(p["workload"] == "api" for g in data["gpus"] for p in g["placements"])
    args.json = False
    assert remote_plan(args) == 0
    out = capsys.readouterr().out
    assert "plan revision" in out and "api" in out
