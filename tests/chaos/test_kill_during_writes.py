"""kill -9 of the controller while clients write: no acknowledged write is lost; a deleted database fails loudly."""

from __future__ import annotations

import threading
import time

import grpc
import pytest
from chaos_helpers import wait_for
from grpc_health.v1 import health_pb2, health_pb2_grpc

from controller.messages import ApiError
from planner.solver import Workload

pytestmark = [pytest.mark.chaos, pytest.mark.e2e]


def writer(cluster, prefix: str, acked: list[str], stop: threading.Event) -> None:
    client = cluster.client()
    i = 0
    while not stop.is_set():
        name = f"{prefix}-{i}"
        try:
            client.apply_workloads([Workload(name, "mlp_small", 100, 1)])
            acked.append(name)  # acknowledged: the controller answered OK
        except ApiError:
            time.sleep(0.01)  # the controller is gone (or going): not acknowledged, may or may not be stored
        i += 1


def test_no_acknowledged_write_is_lost_over_kill9_cycles(cluster):
    acked: list[str] = []
    for cycle in range(2):
        controller = cluster.controller()
        stop = threading.Event()
        threads = [
            threading.Thread(target=writer, args=(cluster, f"c{cycle}w{t}", acked, stop), daemon=True) for t in range(6)
        ]
        for t in threads:
            t.start()
        wait_for("writes under way", lambda goal=50 * (cycle + 1): len(acked) > goal, 30)
        controller.kill9()  # mid-write: some calls were in flight
        stop.set()
        for t in threads:
            t.join(timeout=30)
        cluster.procs.remove(controller)
        controller.stop()  # its orphans (the solver worker), by pid
    cluster.controller()
    stored = {w.name for w in cluster.client().list_workloads()}
    lost = [name for name in acked if name not in stored]
    print(f"{len(acked)} acknowledged writes over 2 kill -9 cycles, {len(lost)} lost")
    assert not lost and len(acked) > 100


def test_a_database_deleted_under_the_controller_fails_loudly(cluster):
    cluster.controller()
    client = cluster.client()
    client.apply_workloads([Workload("before", "mlp_small", 100, 1)])
    (cluster.tmp / "controller.db").unlink()
    with pytest.raises(ApiError, match="was deleted while the controller ran"):
        client.apply_workloads([Workload("after", "mlp_small", 100, 1)])
    with grpc.insecure_channel(cluster.address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        wait_for(
            "NOT_SERVING",
            lambda: (
                stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=5).status
                == health_pb2.HealthCheckResponse.NOT_SERVING
            ),
            10,
        )
    assert "was deleted while the controller ran" in cluster.procs[-1].tail()
