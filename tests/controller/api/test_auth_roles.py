"""Issue 10, item 4 (and the echoed-value size of item 3) on a real gRPC server over loopback: users and agents
hold different credentials, an agent token acts only as its own node, raw stubs cannot get around it."""

from __future__ import annotations

import logging

import grpc
import pytest
from control_helpers import cpu_profile_json

from controller.api import stoke_pb2 as pb
from controller.api import stoke_pb2_grpc as pb_grpc
from controller.api.auth import read_token
from controller.api.client import ControllerClient
from controller.config import ControllerConfig, ServiceConfig
from controller.identity import agent_token_node
from controller.messages import HeartbeatReport, InvalidArgument, NodeDevice, PermissionDenied, Unauthenticated
from controller.server import ControllerServer
from planner.solver import Workload

pytestmark = pytest.mark.slow  # gRPC servers on loopback: make test-fast skips it

TOKEN = "user-s3cret"
CPU = [NodeDevice(0, "cpu", "cpu", cores=2)]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("auth")
    (tmp / "token").write_text(TOKEN + "\n")
    (tmp / "token").chmod(0o600)
    config = ControllerConfig(
        listen="127.0.0.1:0",
        metrics_listen="",
        db=str(tmp / "c.db"),
        token_file=str(tmp / "token"),
        reconcile_interval_s=0.1,
        service=ServiceConfig(heartbeat_interval_s=0.2, heartbeat_timeout_s=2.0),
    )
    srv = ControllerServer(config).start()
    with ControllerClient(srv.address, token=TOKEN) as user:
        user.upload_profile(cpu_profile_json())
        srv.tokens = {n: user.mint_agent_token(n).token for n in ("n1", "n2")}
    yield srv
    srv.stop()


def client(server, token):
    return ControllerClient(server.address, token=token, timeout_s=5)


def test_an_agent_token_is_bound_to_its_node(server):
    token = server.tokens["n1"]
    assert agent_token_node(token) == "n1"
    with client(server, token) as n1:
        assert n1.register("n1", CPU) > 0 and n1.heartbeat(HeartbeatReport("n1")).registered
        # the probe: any token holder registered as an existing node and took its assignments
        with pytest.raises(PermissionDenied, match="belongs to node 'n1'; it cannot act as node 'n2'"):
            n1.register("n2", CPU)
        with pytest.raises(PermissionDenied):
            n1.heartbeat(HeartbeatReport("n2"))


def test_an_agent_token_cannot_touch_workloads_and_a_user_token_cannot_act_as_an_agent(server):
    with client(server, TOKEN) as user:
        user.apply_workloads([Workload("keep", "mlp_small", 100, 5)])
    with client(server, server.tokens["n2"]) as n2:
        for call in (lambda: n2.delete_workload("keep"), n2.list_workloads, lambda: n2.mint_agent_token("n2")):
            with pytest.raises(PermissionDenied, match="may only register and heartbeat"):
                call()
    with client(server, TOKEN) as user:
        assert [w.name for w in user.list_workloads()] == ["keep"]
        with pytest.raises(PermissionDenied, match="a user token cannot act as an agent"):
            user.register("n1", CPU)


def test_minting_again_revokes_the_previous_token(server):
    with client(server, TOKEN) as user:
        old = user.mint_agent_token("n3").token
        new = user.mint_agent_token("n3")
    assert new.generation == 2 and new.token != old
    with client(server, old) as stale:
        with pytest.raises(Unauthenticated, match="invalid bearer token"):
            stale.register("n3", CPU)
    with client(server, new.token) as fresh:
        assert fresh.register("n3", CPU) > 0


@pytest.mark.parametrize(
    "metadata, message",
    [
        ((("authorization", f"Bearer {TOKEN}"), ("authorization", f"Bearer {TOKEN}")), "2 authorization headers"),
        ((("authorization", f"Basic {TOKEN}"),), "invalid bearer token"),
        ((("authorization", "Bearer stoke-node:n1:1:" + "0" * 64),), "invalid bearer token"),
        ((("authorization", "Bearer stoke-node:n1:" + "9" * 5000 + ":00"),), "invalid bearer token"),
        ((), "missing bearer token"),
    ],
    ids=["duplicate", "scheme", "forged-mac", "huge-generation", "none"],
)
def test_raw_stubs_with_bad_authorization_are_refused(server, metadata, message):
    with grpc.insecure_channel(server.address) as channel:
        with pytest.raises(grpc.RpcError) as err:
            pb_grpc.StokeControllerStub(channel).ListWorkloads(pb.ListWorkloadsRequest(), metadata=metadata, timeout=5)
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED and message in err.value.details()


def test_a_20kb_name_still_gives_the_real_error_within_grpc_metadata(server):
    with client(server, TOKEN) as user:
        with pytest.raises(InvalidArgument) as err:
            user.apply_raw(
                pb.ApplyWorkloadsRequest(workloads=[pb.Workload(name="n" * 20_000, model="m", slo_ms=1, rate_rps=1)])
            )
    assert str(err.value).startswith("workloads[0].name: must be a name") and len(str(err.value)) < 1000


def test_a_token_file_readable_by_others_is_warned_about(tmp_path, caplog):
    path = tmp_path / "token"
    path.write_text("t0ken\n")
    path.chmod(0o644)
    with caplog.at_level(logging.WARNING, logger="stoke.auth"):
        assert read_token(str(path)) == "t0ken"
    assert "readable by other users (mode 0644)" in caplog.text and f"chmod 600 {path}" in caplog.text
    caplog.clear()
    path.chmod(0o600)
    with caplog.at_level(logging.WARNING, logger="stoke.auth"):
        read_token(str(path))
    assert caplog.text == ""


def test_a_token_sent_without_tls_off_loopback_is_warned_about(caplog):
    with caplog.at_level(logging.WARNING, logger="stoke.client"):
        ControllerClient("10.1.2.3:50051", token="t").close()
    assert "without TLS" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="stoke.client"):
        ControllerClient("127.0.0.1:50051", token="t").close()
        ControllerClient("10.1.2.3:50051").close()  # no token: nothing to leak
    assert caplog.text == ""
