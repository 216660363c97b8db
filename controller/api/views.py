"""The service's views (plans, node changes, nodes, status, profiles) as response messages. No I/O.

Fields of the same name are copied by `convert.to_pb` (declared once, in stoke.proto); each view says only
what differs: nested messages, renamed fields, figures derived from the view.
"""

from __future__ import annotations

from collections.abc import Sequence

from controller.api import stoke_pb2 as pb
from controller.api.convert import assignment_to_pb, batch_stat_to_pb, device_to_pb, endpoint_to_pb, to_pb
from controller.observations import ObservationRecord, neighbour_text
from controller.reconcile.diff import NodeChange
from controller.reconcile.planning import PlanView
from controller.registry import NodeView
from controller.status import ClusterStatus, ReplicaStatus, WorkloadStatus
from controller.store import ProfileRow, ProfileVersionRow


def plan_to_pb(view: PlanView) -> pb.Plan:
    gpus = [
        to_pb(
            pb.PlanGpu,
            g,
            node_id=b.node_id if b else "",
            device=b.device if b else -1,
            placements=[to_pb(pb.Placement, p, workload=p.name) for p in g.placements],
        )
        for g, b in zip(view.plan.gpus, view.bindings)
    ]
    return to_pb(
        pb.Plan,
        view,
        strategy=view.plan.strategy,
        gpus=gpus,
        notes=list(view.plan.notes),
        cost_per_hour=view.plan.cost_per_hour,
        pending=[pb.Pending(workload=w, reason=r) for w, r in view.pending],
    )


def change_to_pb(c: NodeChange) -> pb.NodeChange:
    return to_pb(pb.NodeChange, c)


def node_to_pb(n: NodeView) -> pb.Node:
    return to_pb(
        pb.Node,
        n,
        devices=[device_to_pb(d) for d in n.devices],
        assigned=[assignment_to_pb(a) for a in n.assigned],
        running=[assignment_to_pb(a) for a in n.running],
        endpoints=[endpoint_to_pb(e) for _, e in sorted(n.endpoints.items())],
    )


def _replica_to_pb(r: ReplicaStatus) -> pb.ReplicaStatus:
    o, e = r.observed, r.endpoint
    return to_pb(
        pb.ReplicaStatus,
        r,
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
    out = to_pb(pb.WorkloadStatus, w.workload)  # the workload's own fields: name, model, slo_ms, rate_rps, ...
    status = to_pb(
        pb.WorkloadStatus,
        w,
        replicas=[_replica_to_pb(r) for r in w.replicas],
        observed=w.observed_latency_ms is not None,
        demand=f.demand,
        guard=f.guard,
        guard_moves=f.guard_moves,
        observed_p99_ms=f.observed_p99_ms,
        prediction_error_ratio=f.error_ratio,
    )
    out.MergeFrom(status)
    return out


def status_to_pb(s: ClusterStatus) -> pb.StatusResponse:
    return to_pb(pb.StatusResponse, s, workloads=[_workload_to_pb(w) for w in s.workloads])


def profile_row_to_pb(r: ProfileRow) -> pb.ProfileInfo:
    return to_pb(pb.ProfileInfo, r)


def profile_versions_to_pb(
    rows: Sequence[ProfileRow], versions: Sequence[ProfileVersionRow]
) -> list[pb.ProfileVersion]:
    """Each pair's fitted profile (version 0) followed by its recalibrated versions."""
    active = {(r.gpu_type, r.model): r.active_version for r in rows}
    out = []
    for r in rows:
        out.append(
            to_pb(
                pb.ProfileVersion,
                r,
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
                to_pb(
                    pb.ProfileVersion,
                    v,
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


def observation_record_to_pb(r: ObservationRecord) -> pb.ObservationRecord:
    return to_pb(
        pb.ObservationRecord,
        r,
        neighbours=[neighbour_text(n) for n in r.neighbours],
        batch_stats=[batch_stat_to_pb(b) for b in r.batch_stats],
    )
