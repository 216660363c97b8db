"""Raw gRPC against a real controller process: impersonation, and the 1e308 workload.

The probes: any token holder could `Register` as an existing node and take over its assignments, and an
agent's token could delete workloads; `rate_rps: 1e308` spun the reconcile thread at 100% CPU, grew RSS
132 -> 434 MiB, stopped every other plan, and came back on every restart."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import grpc
import pytest
from chaos_helpers import TOKEN, sim_agent, wait_for

from controller.api import stoke_pb2 as pb
from controller.api import stoke_pb2_grpc as pb_grpc
from planner.solver import Workload

pytestmark = [pytest.mark.chaos, pytest.mark.e2e]


def call(address: str, method: str, request, token: str | None, *, service: str = "agent", extra=()):
    """One raw unary call with the given bearer token (and extra metadata); returns the reply or the RpcError."""
    metadata = ((("authorization", f"Bearer {token}"),) if token else ()) + tuple(extra)
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.AgentGatewayStub(channel) if service == "agent" else pb_grpc.StokeControllerStub(channel)
        try:
            return getattr(stub, method)(request, metadata=metadata, timeout=10)
        except grpc.RpcError as err:
            return err


def test_impersonation_is_refused(cluster):
    cluster.controller()
    user = cluster.client()
    victim = sim_agent(cluster, "victim", gpu_type="CPU")  # a real agent loop that holds the workload
    user.apply_workloads([Workload("web", "mlp_small", 100, 5)])
    wait_for("web on victim", lambda: any(n.assigned for n in user.list_nodes().nodes if n.node_id == "victim"), 30)
    mallory = user.mint_agent_token("mallory").token
    device = pb.Device(index=0, name="cpu", kind="cpu", cores=64)

    # another node's token registering as the victim, and heartbeating for it to read its assignments
    err = call(cluster.address, "Register", pb.RegisterRequest(node_id="victim", devices=[device]), mallory)
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED and "belongs to node 'mallory'" in err.details()
    err = call(cluster.address, "Heartbeat", pb.HeartbeatRequest(node_id="victim"), mallory)
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED
    # an agent token on the user API
    err = call(cluster.address, "DeleteWorkload", pb.DeleteWorkloadRequest(name="web"), mallory, service="ctl")
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED
    # the user token as an agent; two authorization headers; a forged agent token
    err = call(cluster.address, "Register", pb.RegisterRequest(node_id="victim", devices=[device]), TOKEN)
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED
    err = call(
        cluster.address,
        "Register",
        pb.RegisterRequest(node_id="mallory", devices=[device]),
        mallory,
        extra=[("authorization", f"Bearer {TOKEN}")],
    )
    assert err.code() == grpc.StatusCode.UNAUTHENTICATED and "2 authorization headers" in err.details()
    forged = "stoke-node:victim:1:" + "f" * 64
    err = call(cluster.address, "Register", pb.RegisterRequest(node_id="victim", devices=[device]), forged)
    assert err.code() == grpc.StatusCode.UNAUTHENTICATED

    # nothing changed: the workload is still there, still the victim's, and the victim still serves it
    assert [w.name for w in user.list_workloads()] == ["web"]
    nodes = {n.node_id: n for n in user.list_nodes().nodes}
    assert set(nodes) == {"victim"} and nodes["victim"].devices[0].cores == 2
    assert [a.workload for a in nodes["victim"].assigned] == ["web"]
    victim.stop()


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def test_the_1e308_workload_neither_stops_planning_nor_comes_back(cluster):
    controller = cluster.controller()
    user = cluster.client()
    agent = sim_agent(cluster, "n1", gpu_type="CPU")
    wait_for("n1 ready", lambda: user.list_nodes().nodes, 30)

    # through the API: refused at once, naming the bound
    started = time.monotonic()
    err = call(
        cluster.address,
        "ApplyWorkloads",
        pb.ApplyWorkloadsRequest(workloads=[pb.Workload(name="huge", model="mlp_small", slo_ms=100, rate_rps=1e308)]),
        TOKEN,
        service="ctl",
    )
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "up to 1e+06, got 1e+308" in err.details()
    assert time.monotonic() - started < 5

    # stored by an older version: the row is in the database when the controller starts
    user.apply_workloads([Workload("web", "mlp_small", 100, 5)])
    wait_for("web planned", lambda: user.get_plan().plan.gpus, 30)
    agent.stop()
    controller.stop()
    with sqlite3.connect(cluster.tmp / "controller.db") as db:
        db.execute(
            "INSERT INTO workloads (name, model, slo_ms, rate_rps, gpu_type, updated_unix) "
            "VALUES ('huge', 'mlp_small', 100, 1e308, NULL, 0)"
        )
    controller = cluster.controller()
    agent = sim_agent(cluster, "n1", gpu_type="CPU")
    rss_before = rss_mib(controller.pid)
    started = time.monotonic()
    preview = user.preview_plan().plan  # answers; the probe's timed out
    assert time.monotonic() - started < 10
    pending = {p.workload: p.reason for p in preview.pending}
    assert "rate_rps must be a positive number up to 1e+06" in pending["huge"]
    assert any(p.workload == "web" for g in preview.gpus for p in g.placements)
    time.sleep(2)  # the reconcile loop keeps running: no spin, no growth
    assert rss_mib(controller.pid) < rss_before + 50
    status = wait_for("web planned, huge pending", lambda: {w.name: w.state for w in user.status().workloads}, 10)
    assert "web" in status
    assert user.delete_workload("huge") is True
    wait_for("no pending left", lambda: not user.get_plan().plan.pending, 10)
    agent.stop()
