"""The operator (a real `stoke k8s operator` process) against the Kubernetes API mock server and a real controller.

Everything goes over real HTTP and gRPC on loopback: kopf watches and patches StokeWorkloads in
kmock's emulator, the operator applies them through the controller's gRPC API. One controller, one
mock API and one operator serve the module (process starts are slow on a loaded machine); each test
uses its own workload names. The agent joins for the last test only: before it, workloads stay
pending; with it, the end-to-end test serves one with Triton on CPU.
"""

from __future__ import annotations

import time

import pytest
from chaos.chaos_helpers import needs_triton
from control_helpers import wait_for

from deploy.bootstrap import BootstrapError, fetch_node_token
from deploy.operator import FINALIZER
from planner.solver import Workload

pytestmark = [pytest.mark.e2e]

SERVICES = "/api/v1/namespaces/stoke/services"
SLICES = "/apis/discovery.k8s.io/v1/namespaces/stoke/endpointslices"


def controller_workloads(cluster, prefix: str = "") -> dict[str, Workload]:
    return {w.name: w for w in cluster.client().list_workloads() if w.name.startswith(prefix)}


def status_of(kube, name):
    body = kube.workload(name)
    return (body or {}).get("status") or {}


def services(kube, prefix: str) -> list[str]:
    code, listed = kube.request("GET", SERVICES)
    assert code == 200
    return sorted(s["metadata"]["name"] for s in listed["items"] if s["metadata"]["name"].startswith(prefix))


def test_apply_status_update_and_delete_through_the_finalizer(cluster, kube, operator):
    kube.apply_workload("web", {"model": "mlp_small", "slo_ms": 50, "rate_rps": 20})
    wait_for("web in the controller", lambda: "web" in controller_workloads(cluster), 30)
    assert controller_workloads(cluster)["web"] == Workload("web", "mlp_small", 50.0, 20.0)
    status = wait_for("web's status", lambda: status_of(kube, "web").get("state"), 30)
    assert status in ("pending", "starting")  # no agent: nothing can serve it
    conditions = {c["type"]: c["status"] for c in status_of(kube, "web")["conditions"]}
    assert conditions == {"Accepted": "True", "Serving": "False"}
    assert kube.workload("web")["metadata"]["finalizers"] == [FINALIZER]
    service = wait_for("web's Service", lambda: kube.get(f"{SERVICES}/web"), 30)
    assert [p["port"] for p in service["spec"]["ports"]] == [8001, 8000] and "selector" not in service["spec"]
    assert service["metadata"]["ownerReferences"][0]["uid"] == kube.workload("web")["metadata"]["uid"]

    kube.apply_workload("web", {"model": "mlp_small", "slo_ms": 50, "rate_rps": "auto", "min_rps": 5})
    wait_for("the update", lambda: controller_workloads(cluster)["web"].rate_auto, 30)
    assert controller_workloads(cluster)["web"].min_rps == 5

    assert kube.delete_workload("web") == 200
    wait_for("web gone from the controller", lambda: "web" not in controller_workloads(cluster), 30)
    wait_for("the resource released", lambda: kube.workload("web") is None, 30)
    assert kube.get(f"{SERVICES}/web") is None


def test_a_refused_spec_is_written_to_status_and_never_reaches_the_controller(cluster, kube, operator):
    kube.apply_workload("bounds", {"model": "mlp_small", "slo_ms": 50, "rate_rps": "auto", "min_rps": 9, "max_rps": 3})
    kube.apply_workload("unknown", {"model": "no_such_model", "slo_ms": 50, "rate_rps": 5})
    state = wait_for("bounds refused", lambda: status_of(kube, "bounds").get("state"), 30)
    assert state == "Invalid"
    assert "min_rps (9) must not exceed max_rps (3)" in status_of(kube, "bounds")["reason"]
    accepted = next(c for c in status_of(kube, "bounds")["conditions"] if c["type"] == "Accepted")
    assert (accepted["status"], accepted["reason"]) == ("False", "InvalidSpec")
    # the controller refuses a model no profile knows; the operator says so instead of retrying for ever
    wait_for("unknown refused", lambda: status_of(kube, "unknown").get("state") == "Invalid", 30)
    assert "no_such_model" in status_of(kube, "unknown")["reason"]
    assert not {"bounds", "unknown"} & set(controller_workloads(cluster))
    # fixed: accepted on the next pass
    kube.apply_workload("bounds", {"model": "mlp_small", "slo_ms": 50, "rate_rps": "auto", "min_rps": 3, "max_rps": 9})
    wait_for("bounds accepted", lambda: "bounds" in controller_workloads(cluster), 30)
    for name in ("bounds", "unknown"):
        assert kube.delete_workload(name) == 200
        wait_for(f"{name} released", lambda name=name: kube.workload(name) is None, 30)
    assert not {"bounds", "unknown"} & set(controller_workloads(cluster))


def test_level_based_a_workload_the_controller_lost_comes_back(cluster, kube, operator):
    kube.apply_workload("keep", {"model": "mlp_small", "slo_ms": 50, "rate_rps": 10})
    wait_for("keep in the controller", lambda: "keep" in controller_workloads(cluster), 30)
    assert cluster.client().delete_workload("keep")  # behind the operator's back (a controller DB restored)
    wait_for("keep re-applied", lambda: "keep" in controller_workloads(cluster), 30)
    assert kube.delete_workload("keep") == 200
    wait_for("keep gone", lambda: "keep" not in controller_workloads(cluster), 30)


def test_an_operator_killed_mid_apply_converges_without_duplicates_or_losses(cluster, kube, operator):
    names = [f"r{i}" for i in range(4)]
    for i, name in enumerate(names):
        kube.apply_workload(name, {"model": "mlp_small", "slo_ms": 40 + i, "rate_rps": 10 + i})
    # SIGKILL as soon as the controller holds some of them: the others are mid-apply or not started
    wait_for("a first workload applied", lambda: controller_workloads(cluster, "r"), 30, interval=0.02)
    operator.proc.popen.kill()  # the operator starts no child process: only it dies
    operator.proc.popen.wait()
    applied_before = sorted(controller_workloads(cluster, "r"))
    # while it is down: one resource is deleted (its finalizer holds it), one is created, one is changed
    assert kube.delete_workload("r0") == 200
    kube.apply_workload("rlate", {"model": "mlp_small", "slo_ms": 60, "rate_rps": 7})
    kube.apply_workload("r1", {"model": "mlp_small", "slo_ms": 99, "rate_rps": 11})
    operator.start()
    expected = {n: Workload(n, "mlp_small", 40.0 + i, 10.0 + i) for i, n in enumerate(names)}
    expected.pop("r0")
    expected["r1"] = Workload("r1", "mlp_small", 99.0, 11.0)
    expected["rlate"] = Workload("rlate", "mlp_small", 60.0, 7.0)
    wait_for("convergence", lambda: controller_workloads(cluster, "r") == expected, 60)
    wait_for("r0 released", lambda: kube.workload("r0") is None, 30)
    for name in expected:
        wait_for(f"{name}'s status", lambda name=name: status_of(kube, name).get("state"), 30)
        assert kube.workload(name)["metadata"]["finalizers"] == [FINALIZER]
    wait_for("one Service each", lambda: services(kube, "r") == sorted(expected), 30)
    time.sleep(2.5)  # more refresh passes change nothing
    assert controller_workloads(cluster, "r") == expected and services(kube, "r") == sorted(expected)
    print(f"applied before the SIGKILL: {applied_before}")
    for name in expected:
        assert kube.delete_workload(name) == 200
    wait_for("all deleted", lambda: not controller_workloads(cluster, "r"), 60)


def test_an_agent_pod_trades_its_projected_token_for_its_own_nodes_token(cluster, kube, operator, tmp_path):
    from controller.api.client import ControllerClient
    from controller.messages import NodeDevice, PermissionDenied

    kube.reviews["pod-token-b1"] = {
        "authenticated": True,
        "audiences": ["stoke-bootstrap"],
        "user": {
            "username": "system:serviceaccount:stoke:stoke-agent",
            "extra": {"authentication.kubernetes.io/node-name": ["b1"]},
        },
    }
    kube.reviews["pod-token-other"] = {
        "authenticated": True,
        "audiences": ["stoke-bootstrap"],
        "user": {"username": "system:serviceaccount:stoke:default", "extra": {}},
    }
    (tmp_path / "sa").write_text("pod-token-b1\n")
    url = f"http://{operator.bootstrap}"
    node = fetch_node_token(url, tmp_path / "sa", tmp_path / "agent.token", timeout_s=30, retry_s=0.2)
    assert node == "b1" and (tmp_path / "agent.token").stat().st_mode & 0o777 == 0o600
    token = (tmp_path / "agent.token").read_text().strip()
    device = (NodeDevice(0, "sim", "cpu", cores=2, gpu_type="SIM"),)  # a type without a profile: holds nothing
    with ControllerClient(cluster.address, token=token) as agent:
        assert agent.register("b1", device) > 0
        with pytest.raises(PermissionDenied):
            agent.register("b2", device)
    for token, why in (
        ("pod-token-other", "is not system:serviceaccount:stoke:stoke-agent"),
        ("forged", "did not authenticate"),
    ):
        (tmp_path / "sa").write_text(token)
        with pytest.raises(BootstrapError, match=why):
            fetch_node_token(url, tmp_path / "sa", tmp_path / "other.token", timeout_s=5, retry_s=0.2)
    assert not (tmp_path / "other.token").exists()


def test_the_service_and_slices_follow_a_replica_to_another_router_and_leave_others_alone(kube):
    """deploy.kube against the mock API directly: create what is missing, leave what holds, delete what moved."""
    import kubernetes

    from deploy import desired
    from deploy.kube import WorkloadObjects

    config = kubernetes.client.Configuration()
    config.host = kube.url
    objects = WorkloadObjects(kubernetes.client.ApiClient(config))
    owner = desired.owner_reference("mover", "uid-m")
    here = desired.RouterEndpoint("10.0.0.1", 30010, 30011, "a")
    there = desired.RouterEndpoint("10.0.0.2", 30020, 30021, "b")
    unrelated = desired.endpoint_slices("bystander", "stoke", [here], desired.owner_reference("bystander", "u"))
    assert objects.ensure_slices("bystander", "stoke", unrelated) == {"bystander-ipv4-30010": "created"}

    service = desired.service("mover", "stoke", owner)
    assert [objects.ensure_service(service) for _ in range(2)] == ["created", "unchanged"]
    first = desired.endpoint_slices("mover", "stoke", [here], owner)
    assert objects.ensure_slices("mover", "stoke", first) == {"mover-ipv4-30010": "created"}
    assert objects.ensure_slices("mover", "stoke", first) == {"mover-ipv4-30010": "unchanged"}
    moved = desired.endpoint_slices("mover", "stoke", [there], owner)
    assert objects.ensure_slices("mover", "stoke", moved) == {
        "mover-ipv4-30020": "created",
        "mover-ipv4-30010": "deleted",
    }
    both = desired.endpoint_slices(
        "mover", "stoke", [there, desired.RouterEndpoint("10.0.0.3", 30020, 30021, "c")], owner
    )
    assert objects.ensure_slices("mover", "stoke", both) == {"mover-ipv4-30020": "updated"}
    assert [e["addresses"] for e in kube.get(f"{SLICES}/mover-ipv4-30020")["endpoints"]] == [["10.0.0.2"], ["10.0.0.3"]]

    objects.delete_all("mover", "stoke")
    objects.delete_all("mover", "stoke")  # absent is fine
    assert kube.get(f"{SERVICES}/mover") is None and kube.get(f"{SLICES}/mover-ipv4-30020") is None
    assert kube.get(f"{SLICES}/bystander-ipv4-30010") is not None  # another workload's slice stays


@pytest.mark.triton
@needs_triton
def test_end_to_end_a_stokeworkload_is_served_by_triton_and_its_status_and_service_written_back(
    cluster, kube, operator
):
    """StokeWorkload in the mock API -> the operator -> the controller -> a real agent with Triton on CPU ->
    status (endpoint, predicted and observed p99) and the Service's EndpointSlice written back.

    The observed p99 comes the way it does in production: a client measures each request's latency into
    the SLI histogram (`stoke_request_latency_ms`), the agent reads it each window (--sli-metrics), the
    controller's status carries the window's p99, the operator writes it to the resource."""
    import numpy as np
    import tritonclient.grpc as grpcclient

    from agents.latency_metrics import BASE_BUCKETS_MS, RequestLatencyExporter

    sli = RequestLatencyExporter(slos_ms=[100])
    cluster.agent("n1", extra=("--sli-metrics", sli.serve()))
    try:
        wait_for(
            "the node",
            lambda: [n for n in cluster.client().list_nodes().nodes if n.node_id == "n1" and n.state == "ready"],
            60,
        )
        started = time.monotonic()
        kube.apply_workload("served", {"model": "mlp_small", "slo_ms": 100, "rate_rps": 20})

        def served():
            status = status_of(kube, "served")
            return status if status.get("state") == "serving" and status.get("endpoint") else None

        status = wait_for("served serving, written back", served, 120)
        print(f"StokeWorkload applied -> status serving: {time.monotonic() - started:.1f}s (loaded 2-core machine)")
        assert status["endpoint"] == "served.stoke.svc:8001"
        assert status["httpEndpoint"] == "http://served.stoke.svc:8000"
        assert status["replicas"] == status["ready"] == 1
        assert 0 < status["predictedP99Ms"] <= 100
        conditions = {c["type"]: c["status"] for c in status["conditions"]}
        assert conditions == {"Accepted": "True", "Serving": "True"}
        # the status names the node router; the Service's slice routes to that same router, which serves the model
        [router] = status["routers"]
        host, port = router.rsplit(":", 1)
        code, slices = kube.request("GET", SLICES)
        [endpoint_slice] = [
            s for s in slices["items"] if s["metadata"]["labels"]["kubernetes.io/service-name"] == "served"
        ]
        assert endpoint_slice["addressType"] == "IPv4" and endpoint_slice["endpoints"][0]["addresses"] == [host]
        assert {p["name"]: p["port"] for p in endpoint_slice["ports"]}["grpc"] == int(port)
        replica = next(w for w in cluster.client().status().workloads if w.name == "served").replicas[0]
        assert replica.endpoint == router

        client = grpcclient.InferenceServerClient(router)
        measured: list[float] = []
        data = np.random.default_rng(0).random((1, 64)).astype(np.float32)

        def observed_p99():  # a few requests per poll, each measured into the SLI histogram the agent reads
            for _ in range(5):
                tensor = grpcclient.InferInput("INPUT0", list(data.shape), "FP32")
                tensor.set_data_from_numpy(data)
                begin = time.perf_counter()
                assert client.infer("mlp_small", [tensor]).as_numpy("OUTPUT0").shape == (1, 16)
                measured.append((time.perf_counter() - begin) * 1000)
                sli.observe("served", "mlp_small", measured[-1])
            return status_of(kube, "served").get("observedP99Ms")

        try:
            assert client.get_model_config("mlp_small").config.max_batch_size == replica.batch
            observed = wait_for("the observed p99 written back", observed_p99, 90, interval=0.05)
        finally:
            client.close()
        # a p99 read from histogram buckets lies at most at the bucket bound above the slowest request
        ceiling = min(b for b in (*BASE_BUCKETS_MS, 100, float("inf")) if b >= max(measured))
        print(f"observed p99 {observed} ms over {len(measured)} requests (slowest {max(measured):.1f} ms)")
        assert 0 < observed <= ceiling

        assert kube.delete_workload("served") == 200
        wait_for("served gone", lambda: kube.workload("served") is None, 60)
        assert "served" not in controller_workloads(cluster)
    finally:
        sli.close()
