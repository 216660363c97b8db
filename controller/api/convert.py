"""Conversions between the wire types (stoke_pb2) and the domain dataclasses. No I/O."""
from __future__ import annotations

from typing import Any

from controller.api import stoke_pb2 as pb
from controller.assignment import ModelAssignment
from controller.reconcile import NodeChange
from controller.service import (ClusterStatus, HeartbeatAnswer, HeartbeatReport, NodeDevice, NodeView, Observation,
                                PlanView)
from controller.solver import Workload
from controller.store import ProfileRow


def workload_to_pb(w: Workload) -> pb.Workload:
    return pb.Workload(name=w.name, model=w.model, slo_ms=w.slo_ms, rate_rps=w.rate_rps, gpu_type=w.gpu_type or "")


def workload_fields(m: pb.Workload) -> dict[str, Any]:
    return {"name": m.name, "model": m.model, "slo_ms": m.slo_ms, "rate_rps": m.rate_rps,
            "gpu_type": m.gpu_type or None}


def workload_from_pb(m: pb.Workload) -> Workload:
    return Workload(name=m.name, model=m.model, slo_ms=m.slo_ms, rate_rps=m.rate_rps, gpu_type=m.gpu_type or None)


def assignment_to_pb(a: ModelAssignment) -> pb.Assignment:
    return pb.Assignment(workload=a.workload, model=a.model, device=a.device, share_pct=a.share_pct, batch=a.batch,
                         queue_delay_ms=a.queue_delay_ms, slo_ms=a.slo_ms, rate_rps=a.rate_rps, replica=a.replica)


def assignment_from_pb(m: pb.Assignment) -> ModelAssignment:
    return ModelAssignment(workload=m.workload, model=m.model, device=m.device, share_pct=m.share_pct,
                           batch=m.batch, queue_delay_ms=m.queue_delay_ms, slo_ms=m.slo_ms, rate_rps=m.rate_rps,
                           replica=m.replica)


def device_to_pb(d: NodeDevice) -> pb.Device:
    return pb.Device(index=d.index, name=d.name, kind=d.kind, memory_bytes=d.memory_bytes, cores=d.cores,
                     gpu_type=d.gpu_type)


def device_from_pb(m: pb.Device) -> NodeDevice:
    return NodeDevice(index=m.index, name=m.name, kind=m.kind, memory_bytes=m.memory_bytes, cores=m.cores,
                      gpu_type=m.gpu_type)


def observation_to_pb(o: Observation) -> pb.Observed:
    return pb.Observed(key=o.key, model=o.model, request_rate_rps=o.request_rate_rps, mean_batch=o.mean_batch,
                       mean_queue_ms=o.mean_queue_ms, mean_compute_ms=o.mean_compute_ms, failures=o.failures,
                       success=o.success, endpoint=o.endpoint)


def observation_from_pb(m: pb.Observed) -> Observation:
    return Observation(key=m.key, model=m.model, request_rate_rps=m.request_rate_rps, mean_batch=m.mean_batch,
                       mean_queue_ms=m.mean_queue_ms, mean_compute_ms=m.mean_compute_ms, failures=m.failures,
                       success=m.success, endpoint=m.endpoint)


def report_to_pb(r: HeartbeatReport) -> pb.HeartbeatRequest:
    return pb.HeartbeatRequest(node_id=r.node_id, running=[assignment_to_pb(a) for a in r.running],
                               observed=[observation_to_pb(o) for o in r.observed], events=list(r.events),
                               errors=list(r.errors), applied_revision=r.applied_revision,
                               errors_revision=r.errors_revision)


def report_from_pb(m: pb.HeartbeatRequest) -> HeartbeatReport:
    return HeartbeatReport(node_id=m.node_id, running=tuple(assignment_from_pb(a) for a in m.running),
                           observed=tuple(observation_from_pb(o) for o in m.observed), events=tuple(m.events),
                           errors=tuple(m.errors), applied_revision=m.applied_revision,
                           errors_revision=m.errors_revision)


def answer_to_pb(a: HeartbeatAnswer) -> pb.HeartbeatResponse:
    return pb.HeartbeatResponse(registered=a.registered, revision=a.revision,
                                assignments=[assignment_to_pb(x) for x in a.assignments],
                                heartbeat_interval_s=a.heartbeat_interval_s)


def answer_from_pb(m: pb.HeartbeatResponse) -> HeartbeatAnswer:
    return HeartbeatAnswer(registered=m.registered, revision=m.revision,
                           assignments=tuple(assignment_from_pb(x) for x in m.assignments),
                           heartbeat_interval_s=m.heartbeat_interval_s)


def plan_to_pb(view: PlanView) -> pb.Plan:
    gpus = []
    for g, b in zip(view.plan.gpus, view.bindings):
        gpus.append(pb.PlanGpu(gpu_type=g.gpu_type, price_per_hour=g.price_per_hour,
                               node_id=b.node_id if b else "", device=b.device if b else -1,
                               placements=[pb.Placement(
                                   workload=p.name, model=p.model, slo_ms=p.slo_ms, rate_rps=p.rate_rps,
                                   share_pct=p.share_pct, batch=p.batch, queue_delay_ms=p.queue_delay_ms,
                                   predicted_latency_ms=p.predicted_latency_ms,
                                   predicted_throughput_rps=p.predicted_throughput_rps, replica=p.replica,
                                   replicas=p.replicas) for p in g.placements]))
    return pb.Plan(revision=view.revision, strategy=view.plan.strategy, gpus=gpus, notes=list(view.plan.notes),
                   cost_per_hour=view.plan.cost_per_hour,
                   pending=[pb.Pending(workload=w, reason=r) for w, r in view.pending],
                   created_unix=view.created_unix)


def change_to_pb(c: NodeChange) -> pb.NodeChange:
    return pb.NodeChange(node_id=c.node_id, start=c.start, reload=c.reload, move=c.move, stop=c.stop)


def node_to_pb(n: NodeView) -> pb.Node:
    return pb.Node(node_id=n.node_id, devices=[device_to_pb(d) for d in n.devices], state=n.state,
                   last_heartbeat_unix=n.last_heartbeat_unix, seconds_since_heartbeat=n.seconds_since_heartbeat,
                   assigned=[assignment_to_pb(a) for a in n.assigned],
                   running=[assignment_to_pb(a) for a in n.running], events=list(n.events), address=n.address,
                   applied_revision=n.applied_revision)


def status_to_pb(s: ClusterStatus) -> pb.StatusResponse:
    out = []
    for w in s.workloads:
        reps = []
        for r in w.replicas:
            o = r.observed
            reps.append(pb.ReplicaStatus(
                replica=r.replica, node_id=r.node_id, device=r.device, share_pct=r.share_pct, batch=r.batch,
                predicted_latency_ms=r.predicted_latency_ms, serving=r.serving, observed=o is not None,
                observed_latency_ms=o.latency_ms if o else 0.0, observed_rate_rps=o.request_rate_rps if o else 0.0,
                endpoint=o.endpoint if o else ""))
        out.append(pb.WorkloadStatus(
            name=w.workload.name, model=w.workload.model, slo_ms=w.workload.slo_ms, rate_rps=w.workload.rate_rps,
            state=w.state, reason=w.reason, replicas=reps, predicted_latency_ms=w.predicted_latency_ms,
            observed=w.observed_latency_ms is not None, observed_latency_ms=w.observed_latency_ms or 0.0,
            observed_rate_rps=w.observed_rate_rps or 0.0,
            slo_attainment=w.slo_attainment if w.slo_attainment is not None else 0.0))
    return pb.StatusResponse(revision=s.revision, workloads=out, gpus_in_use=s.gpus_in_use,
                             cost_per_hour=s.cost_per_hour, nodes_ready=s.nodes_ready, nodes_lost=s.nodes_lost,
                             last_error=s.last_error)


def profile_row_to_pb(r: ProfileRow) -> pb.ProfileInfo:
    return pb.ProfileInfo(gpu_type=r.gpu_type, model=r.model, uploaded_unix=r.uploaded_unix)
