"""The service's views (plans, node changes, nodes, status, profiles) as response messages. No I/O."""

from __future__ import annotations

from collections.abc import Sequence

from controller.api import stoke_pb2 as pb
from controller.api.convert import assignment_to_pb, batch_stat_to_pb, device_to_pb, endpoint_to_pb
from controller.observations import ObservationRecord, neighbour_text
from controller.reconcile.diff import NodeChange
from controller.reconcile.planning import PlanView
from controller.registry import NodeView
from controller.status import ClusterStatus, ReplicaStatus, WorkloadStatus
from controller.store import ProfileRow, ProfileVersionRow


def plan_to_pb(view: PlanView) -> pb.Plan:
    gpus = []
    for g, b in zip(view.plan.gpus, view.bindings):
        gpus.append(
            pb.PlanGpu(
                gpu_type=g.gpu_type,
                price_per_hour=g.price_per_hour,
                node_id=b.node_id if b else "",
                device=b.device if b else -1,
                placements=[
                    pb.Placement(
                        workload=p.name,
                        model=p.model,
                        slo_ms=p.slo_ms,
                        rate_rps=p.rate_rps,
                        share_pct=p.share_pct,
                        batch=p.batch,
                        queue_delay_ms=p.queue_delay_ms,
                        predicted_latency_ms=p.predicted_latency_ms,
                        predicted_throughput_rps=p.predicted_throughput_rps,
                        replica=p.replica,
                        replicas=p.replicas,
                    )
                    for p in g.placements
                ],
            )
        )
    return pb.Plan(
        revision=view.revision,
        strategy=view.plan.strategy,
        gpus=gpus,
        notes=list(view.plan.notes),
        cost_per_hour=view.plan.cost_per_hour,
        pending=[pb.Pending(workload=w, reason=r) for w, r in view.pending],
        created_unix=view.created_unix,
    )


def change_to_pb(c: NodeChange) -> pb.NodeChange:
    return pb.NodeChange(node_id=c.node_id, start=c.start, reload=c.reload, move=c.move, stop=c.stop)


def node_to_pb(n: NodeView) -> pb.Node:
    return pb.Node(
        node_id=n.node_id,
        devices=[device_to_pb(d) for d in n.devices],
        state=n.state,
        last_heartbeat_unix=n.last_heartbeat_unix,
        seconds_since_heartbeat=n.seconds_since_heartbeat,
        assigned=[assignment_to_pb(a) for a in n.assigned],
        running=[assignment_to_pb(a) for a in n.running],
        events=list(n.events),
        address=n.address,
        applied_revision=n.applied_revision,
        endpoints=[endpoint_to_pb(e) for _, e in sorted(n.endpoints.items())],
    )


def _replica_to_pb(r: ReplicaStatus) -> pb.ReplicaStatus:
    o, e = r.observed, r.endpoint
    return pb.ReplicaStatus(
        replica=r.replica,
        node_id=r.node_id,
        device=r.device,
        share_pct=r.share_pct,
        batch=r.batch,
        predicted_latency_ms=r.predicted_latency_ms,
        serving=r.serving,
        observed=o is not None,
        observed_latency_ms=o.latency_ms if o else 0.0,
        observed_rate_rps=o.request_rate_rps if o else 0.0,
        endpoint=e.grpc if e else (o.endpoint if o else ""),
        http_endpoint=e.http if e else "",
        metrics_endpoint=e.metrics if e else "",
        backend=e.backend if e and e.backend else (o.endpoint if o else ""),
    )


def _workload_to_pb(w: WorkloadStatus) -> pb.WorkloadStatus:
    f = w.feedback
    optional = {
        k: v
        for k, v in (("observed_p99_ms", f.observed_p99_ms), ("prediction_error_ratio", f.error_ratio))
        if v is not None
    }
    return pb.WorkloadStatus(
        name=w.workload.name,
        model=w.workload.model,
        slo_ms=w.workload.slo_ms,
        rate_rps=w.workload.rate_rps,
        state=w.state,
        reason=w.reason,
        replicas=[_replica_to_pb(r) for r in w.replicas],
        predicted_latency_ms=w.predicted_latency_ms,
        observed=w.observed_latency_ms is not None,
        observed_latency_ms=w.observed_latency_ms or 0.0,
        observed_rate_rps=w.observed_rate_rps or 0.0,
        slo_attainment=w.slo_attainment if w.slo_attainment is not None else 0.0,
        rate_auto=w.workload.rate_auto,
        min_rps=w.workload.min_rps or 0.0,
        max_rps=w.workload.max_rps or 0.0,
        demand=f.demand,
        guard=f.guard,
        guard_moves=f.guard_moves,
        predicted_p99_ms=w.predicted_p99_ms or 0.0,
        **optional,
    )


def status_to_pb(s: ClusterStatus) -> pb.StatusResponse:
    return pb.StatusResponse(
        revision=s.revision,
        workloads=[_workload_to_pb(w) for w in s.workloads],
        gpus_in_use=s.gpus_in_use,
        cost_per_hour=s.cost_per_hour,
        nodes_ready=s.nodes_ready,
        nodes_lost=s.nodes_lost,
        last_error=s.last_error,
        nodes_silent=s.nodes_silent,
        alerts=list(s.alerts),
        loop_events=list(s.loop_events),
    )


def profile_row_to_pb(r: ProfileRow) -> pb.ProfileInfo:
    return pb.ProfileInfo(
        gpu_type=r.gpu_type,
        model=r.model,
        uploaded_unix=r.uploaded_unix,
        active_version=r.active_version,
        correction=r.correction,
        pinned=r.pinned,
        versions=r.versions,
    )


def profile_versions_to_pb(
    rows: Sequence[ProfileRow], versions: Sequence[ProfileVersionRow]
) -> list[pb.ProfileVersion]:
    """Each pair's fitted profile (version 0) followed by its recalibrated versions."""
    active = {(r.gpu_type, r.model): r.active_version for r in rows}
    out = []
    for r in rows:
        out.append(
            pb.ProfileVersion(
                gpu_type=r.gpu_type,
                model=r.model,
                version=0,
                created_unix=r.uploaded_unix,
                mode="fitted",
                correction=1.0,
                correction_constant=1.0,
                reason="the uploaded fit",
                active=r.active_version == 0,
            )
        )
        for v in versions:
            if (v.gpu_type, v.model) != (r.gpu_type, r.model):
                continue
            out.append(
                pb.ProfileVersion(
                    gpu_type=v.gpu_type,
                    model=v.model,
                    version=v.version,
                    created_unix=v.created_unix,
                    mode=str(v.meta.get("mode", "scale")),
                    correction=float(v.meta.get("factor", 1.0)),
                    correction_constant=float(v.meta.get("factor_constant", 1.0)),
                    evidence_windows=float(v.meta.get("windows", 0.0)),
                    evidence_executions=int(v.meta.get("executions", 0)),
                    reason=str(v.meta.get("reason", "")),
                    active=active.get((v.gpu_type, v.model)) == v.version,
                )
            )
    return out


#: ObservationRecord fields that may be absent (proto3 `optional`).
_OPTIONAL_RECORD = ("p50_ms", "p95_ms", "p99_ms", "over_slo_ratio", "device_utilization_pct", "sm_clock_mhz", "power_w")


def observation_record_to_pb(r: ObservationRecord) -> pb.ObservationRecord:
    optional = {k: getattr(r, k) for k in _OPTIONAL_RECORD if getattr(r, k) is not None}
    return pb.ObservationRecord(
        unix=r.unix,
        node_id=r.node_id,
        device=r.device,
        gpu_type=r.gpu_type,
        workload=r.workload,
        replica=r.replica,
        model=r.model,
        share_pct=r.share_pct,
        batch=r.batch,
        queue_delay_ms=r.queue_delay_ms,
        neighbours=[neighbour_text(n) for n in r.neighbours],
        window_s=r.window_s,
        rate_rps=r.rate_rps,
        requests=r.requests,
        failures=r.failures,
        mean_batch=r.mean_batch,
        batch_stats=[batch_stat_to_pb(b) for b in r.batch_stats],
        queue_ms=r.queue_ms,
        compute_ms=r.compute_ms,
        observed_batch_ms=r.observed_batch_ms or 0.0,
        predicted_batch_ms=r.predicted_batch_ms or 0.0,
        error_ratio=r.error_ratio or 0.0,
        predicted_p99_ms=r.predicted_p99_ms or 0.0,
        profile_version=r.profile_version,
        instances=r.instances,
        pending=r.pending,
        **optional,
    )
