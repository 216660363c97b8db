"""The status view is a pure function of the applied plan, the workloads and the node reports."""

from __future__ import annotations

from controller.messages import AssignmentError, ModelAssignment, Observation
from controller.reconcile.planning import PlanView
from controller.reconcile.slots import Binding
from controller.registry import NodeView
from controller.status import cluster_status
from planner.solver import GpuPlan, Placement, Plan, Workload

WEB = Workload("web", "mlp_small", slo_ms=50.0, rate_rps=10.0)
PLACED = Placement(
    name="web",
    model="mlp_small",
    slo_ms=50.0,
    rate_rps=10.0,
    share_pct=50.0,
    batch=4,
    queue_delay_ms=300.0,
    predicted_latency_ms=5.0,
    predicted_throughput_rps=100.0,
)
APPLIED = PlanView(
    revision=3,
    plan=Plan("stoke", (GpuPlan("CPU", 0.1, (PLACED,)),)),
    bindings=(Binding("n1", 0, "CPU"),),
    pending=(),
    created_unix=0.0,
)
RUNNING = ModelAssignment("web", "mlp_small", 0, 50.0, 4, 300.0, 50.0, 10.0)


def node(state="ready", running=(), errors=(), observed=None):
    return NodeView(
        node_id="n1",
        devices=(),
        state=state,
        last_heartbeat_unix=0.0,
        seconds_since_heartbeat=0.0,
        assigned=(),
        running=running,
        events=(),
        address="",
        applied_revision=3,
        errors=errors,
        observed=observed or {},
    )


def state_of(*nodes, applied=APPLIED):
    w = cluster_status(applied, (WEB,), nodes, last_error="").workloads[0]
    return w.state, w.reason


def test_each_state_from_the_reports():
    assert state_of(node(), applied=None) == ("pending", "not planned yet")
    assert state_of(node()) == ("starting", "the node has not reported the planned config yet")
    assert state_of(node(running=(RUNNING,))) == ("serving", "")
    assert state_of(node(state="lost", running=(RUNNING,)))[0] == "degraded"
    failed = AssignmentError("web#0", "start failed: boom")
    assert state_of(node(errors=(failed,))) == ("failing", "web#0: start failed: boom")


def test_observed_figures_and_cost():
    obs = Observation(key="web#0", model="mlp_small", request_rate_rps=9.0, mean_queue_ms=10.0, mean_compute_ms=45.0)
    status = cluster_status(APPLIED, (WEB,), (node(running=(RUNNING,), observed={"web#0": obs}),), "boom")
    w = status.workloads[0]
    assert w.observed_latency_ms == 55.0 and w.observed_rate_rps == 9.0 and w.slo_attainment == 0.0
    assert (status.revision, status.gpus_in_use, status.cost_per_hour, status.nodes_ready) == (3, 1, 0.1, 1)
    assert status.last_error == "boom" and w.predicted_latency_ms == 305.0
