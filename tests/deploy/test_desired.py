"""What the operator wants for a workload, from the controller's status: pure functions over the protobuf status."""

from __future__ import annotations

import kubernetes_validate

from controller.api import stoke_pb2 as pb
from deploy import desired

NOW = "2026-01-01T00:00:00Z"


def replica(node: str, grpc: str, http: str, serving: bool = True) -> pb.ReplicaStatus:
    return pb.ReplicaStatus(node_id=node, endpoint=grpc, http_endpoint=http, serving=serving)


def test_routers_are_the_serving_replicas_distinct_endpoints():
    replicas = [
        replica("a", "10.0.0.1:30010", "http://10.0.0.1:30011"),
        replica("a", "10.0.0.1:30010", "http://10.0.0.1:30011"),  # two replicas behind one node router
        replica("b", "10.0.0.2:30010", "http://10.0.0.2:30011"),
        replica("c", "10.0.0.3:30010", "http://10.0.0.3:30011", serving=False),  # not yet serving
        replica("d", "[fd00::4]:30020", "http://[fd00::4]:30021"),
        replica("e", "node-e.example:30010", "http://node-e.example:30011"),
    ]
    routers = desired.routers(replicas)
    assert [(r.host, r.address_type) for r in routers] == [
        ("10.0.0.1", "IPv4"),
        ("10.0.0.2", "IPv4"),
        ("fd00::4", "IPv6"),
        ("node-e.example", "FQDN"),
    ]
    owner = desired.owner_reference("web", "uid-1")
    slices = desired.endpoint_slices("web", "stoke", routers, owner)
    assert sorted(slices) == ["web-fqdn-30010", "web-ipv4-30010", "web-ipv6-30020"]
    assert [e["addresses"] for e in slices["web-ipv4-30010"]["endpoints"]] == [["10.0.0.1"], ["10.0.0.2"]]
    for body in [*slices.values(), desired.service("web", "stoke", owner)]:
        kubernetes_validate.validate(body, "1.30.0", strict=True)


def test_status_carries_the_plan_and_the_observations_and_drops_what_is_unknown():
    w = pb.WorkloadStatus(
        name="web",
        state="serving",
        predicted_p99_ms=12.3456,
        observed=True,
        observed_rate_rps=19.5,
        replicas=[replica("a", "10.0.0.1:30010", "http://10.0.0.1:30011")],
    )
    w.observed_p99_ms = 14.25
    routers = desired.routers(w.replicas)
    status = desired.status_fields(w, "web.stoke.svc", routers, 3, NOW)
    assert status["predictedP99Ms"] == 12.346 and status["observedP99Ms"] == 14.25
    assert status["endpoint"] == "web.stoke.svc:8001" and status["routers"] == ["10.0.0.1:30010"]
    assert "p99UpperMs" not in status  # this controller's plans carry no upper bound yet
    assert {c["type"]: c["status"] for c in status["conditions"]} == {"Accepted": "True", "Serving": "True"}
    pending = desired.status_fields(pb.WorkloadStatus(name="web", state="pending", reason="no node"), "x", (), 3, NOW)
    assert "endpoint" not in pending and "observedP99Ms" not in pending and pending["reason"] == "no node"
    assert desired.status_fields(None, "x", (), 1, NOW)["state"] == "pending"


def test_a_condition_keeps_its_transition_time_while_its_status_holds():
    old = [{"type": "Serving", "status": "True", "lastTransitionTime": "then"}]
    same = desired.merge_conditions(old, [{"type": "Serving", "status": "True", "lastTransitionTime": NOW}])
    flipped = desired.merge_conditions(old, [{"type": "Serving", "status": "False", "lastTransitionTime": NOW}])
    assert same[0]["lastTransitionTime"] == "then" and flipped[0]["lastTransitionTime"] == NOW


def test_an_optional_figure_is_none_when_unset_zero_or_unknown_to_this_controller():
    w = pb.WorkloadStatus(predicted_p99_ms=3.5)
    assert desired._optional(w, "predicted_p99_ms") == 3.5  # a plain double: 0 means unknown
    assert desired._optional(pb.WorkloadStatus(), "predicted_p99_ms") is None
    assert desired._optional(w, "observed_p99_ms") is None  # optional, unset
    w.observed_p99_ms = 0.0
    assert desired._optional(w, "observed_p99_ms") == 0.0  # optional, set
    assert desired._optional(w, "p99_upper_ms") is None  # not a field of this controller's status
