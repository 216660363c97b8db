"""Observations are checked against assignments at heartbeat ingestion (issue 21, item 3).

A node with its own valid identity lies: it reports 9x-slow windows and 1e6 req/s for the replicas of the
other (honest) nodes, and windows for invented workloads and models. None of it may count: no re-plan, no
published profile correction, no planned rate moved, nothing stored under its name for keys it does not run.
The real service (tmp SQLite, real solver and closed loop) on a fake clock; the honest nodes report the truth.
Then the heartbeat replay check, over real gRPC with the node's own token.
"""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest
from loop_helpers import CONFIG, CPU, PROFILE, Clock, window

from controller.api import convert
from controller.api import stoke_pb2_grpc as pb_grpc
from controller.api.client import ControllerClient
from controller.config import ControllerConfig, ServiceConfig
from controller.messages import HeartbeatReport, Observation
from controller.server import ControllerServer
from controller.service import ControlService
from controller.store import Store
from interference.profile_io import profile_to_dict


def test_a_liar_claiming_other_nodes_keys_moves_no_plan_and_publishes_no_correction(tmp_path):
    clock = Clock()
    svc = ControlService(Store(tmp_path / "s.db"), CONFIG, clock=clock, tick=clock)
    svc.upload_profile(json.dumps(profile_to_dict(PROFILE)), "CPU")
    for node in ("honest-a", "honest-b", "liar"):
        svc.register(node, CPU)
    svc.apply_workloads(
        [{"name": f"w{i}", "model": "accel_sim", "slo_ms": 80, "rate_rps": 30 if i else "auto"} for i in range(3)]
    )
    svc.reconcile()
    revision = svc.current_plan().revision
    assigned = {n: svc.heartbeat(HeartbeatReport(n)).assignments for n in ("honest-a", "honest-b", "liar")}
    others = [a for n in ("honest-a", "honest-b") for a in assigned[n]]
    assert others, "the plan must place something on the honest nodes"
    rates = {a.key: a.rate_rps for a in others}
    for seq in range(1, 61):
        clock.t += 1.0
        for node in ("honest-a", "honest-b"):
            svc.heartbeat(
                HeartbeatReport(
                    node, running=assigned[node], observed=tuple(window(a, seq, 1.0) for a in assigned[node])
                )
            )
        # 9x slow at 1e6 req/s, numbered ahead of the honest windows (so they, not the honest ones, count)
        lies = [window(a, 10_000 + seq, 9.0, rate=1e6) for a in others]
        lies.append(Observation("invented#0", "accel_sim", request_rate_rps=1e6, seq=seq, window_s=1.0, requests=9))
        lies.append(Observation(f"junk{seq}#0", f"model{seq}", seq=seq, window_s=1.0, requests=1))
        own = tuple(window(a, seq, 1.0) for a in assigned["liar"])
        claimed = (*assigned["liar"], *others)  # it also says it runs them
        answer = svc.heartbeat(HeartbeatReport("liar", running=claimed, observed=(*own, *lies)))
        assert answer.registered
        svc.reconcile()

    assert svc.current_plan().revision == revision, "the lies re-planned"
    assert svc.store.profile_versions() == [], "the lies published a profile correction"
    now = {a.key: a.rate_rps for n in ("honest-a", "honest-b") for a in svc.heartbeat(HeartbeatReport(n)).assignments}
    assert now == rates
    stored = svc.store.observations(limit=10_000)
    assert not [r for r in stored if r.node_id == "liar" and r.key not in {a.key for a in assigned["liar"]}]
    assert any("not counted" in e for n in svc.list_nodes() if n.node_id == "liar" for e in n.events)


@pytest.fixture
def server(tmp_path: Path):
    (tmp_path / "token").write_text("replay-user-token\n")
    config = ControllerConfig(
        listen="127.0.0.1:0",
        metrics_listen="",
        db=str(tmp_path / "c.db"),
        token_file=str(tmp_path / "token"),
        backup_interval_s=0,
        service=ServiceConfig(heartbeat_interval_s=0.5, heartbeat_timeout_s=5.0),
    )
    srv = ControllerServer(config).start()
    yield srv
    srv.stop()


def test_a_replayed_heartbeat_is_refused(server):
    with ControllerClient(server.address, token="replay-user-token") as user:
        token = user.mint_agent_token("n1").token
    with ControllerClient(server.address, token=token) as agent:
        agent.register("n1", CPU)
        stub = pb_grpc.AgentGatewayStub(agent._channel)
        meta = (("authorization", f"Bearer {token}"),)

        def send(seq: int, incarnation: str = "a1") -> grpc.StatusCode:
            request = convert.report_to_pb(HeartbeatReport("n1", sequence=seq, incarnation=incarnation))
            try:
                stub.Heartbeat(request, metadata=meta, timeout=5)
                return grpc.StatusCode.OK
            except grpc.RpcError as err:
                return err.code()

        assert send(1) == grpc.StatusCode.OK and send(2) == grpc.StatusCode.OK
        assert send(2) == grpc.StatusCode.FAILED_PRECONDITION  # the same bytes again
        assert send(1) == grpc.StatusCode.FAILED_PRECONDITION  # an older one
        assert send(0, "") == grpc.StatusCode.FAILED_PRECONDITION  # stripped of its number
        assert send(3, "b2") == grpc.StatusCode.FAILED_PRECONDITION  # another process than the registered one
        assert send(3) == grpc.StatusCode.OK
        agent.register("n1", CPU)  # the agent restarted: a new process numbers from 1 again
        assert send(1, "c3") == grpc.StatusCode.OK
        assert send(4, "a1") == grpc.StatusCode.FAILED_PRECONDITION  # the old process's heartbeats stay refused
        refused = 0
        for seq in range(2, 40):  # a flood: the rate limit refuses most of it
            refused += send(seq, "c3") == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert refused > 10
