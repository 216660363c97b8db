"""The status view is a pure function of the applied plan, the workloads and the node reports."""

from __future__ import annotations

from dataclasses import replace

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
    assert w.observed_latency_ms == 55.0 and w.observed_rate_rps == 9.0
    assert w.slo_attainment is None and w.slo_ok is None  # no SLI: Triton's mean says nothing about the SLO
    assert (status.revision, status.gpus_in_use, status.cost_per_hour, status.nodes_ready) == (3, 1, 0.1, 1)
    assert status.last_error == "boom" and w.predicted_latency_ms == 305.0


def test_slo_attainment_and_slo_ok_come_from_the_sli_not_the_mean():
    from controller.loop_output import WorkloadFeedback

    fast_mean = Observation("web#0", "mlp_small", request_rate_rps=9.0, mean_queue_ms=1.0, mean_compute_ms=2.0)
    late = WorkloadFeedback(observed_p99_ms=9.5, within_slo=0.79, requests=600)
    slo = WEB.slo_ms
    feedback = {"web": replace(late, observed_p99_ms=slo * 2)}
    running = node(running=(RUNNING,), observed={"web#0": fast_mean})
    status = cluster_status(APPLIED, (WEB,), (running,), "", feedback=feedback)
    w = status.workloads[0]
    assert w.slo_attainment == 0.79 and w.slo_ok is False  # a mean far within the SLO hides nothing any more
    feedback = {"web": replace(late, observed_p99_ms=slo / 2, within_slo=1.0)}
    w = cluster_status(APPLIED, (WEB,), (node(running=(RUNNING,)),), "", feedback=feedback).workloads[0]
    assert w.slo_attainment == 1.0 and w.slo_ok is True


def test_a_node_whose_heartbeats_stopped_is_unconfirmed_until_judged():
    quiet = replace(node(running=(RUNNING,)), seconds_since_heartbeat=4.0)
    w = cluster_status(APPLIED, (WEB,), (quiet,), "", unconfirmed_after_s=2.5).workloads[0]
    assert w.state == "unconfirmed" and "no heartbeat from" in w.reason and "4.0s" in w.reason
    w = cluster_status(APPLIED, (WEB,), (quiet,), "", unconfirmed_after_s=5.0).workloads[0]
    assert w.state == "serving"
