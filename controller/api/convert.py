"""Conversions between the wire types (stoke_pb2) and the messages both sides speak. No I/O.

Both the client (`controller.api.client`) and the handlers use these; the
service's views (plans, nodes, status) go out through `controller.api.views`.
"""

from __future__ import annotations

from typing import Any

from controller.api import stoke_pb2 as pb
from controller.messages import (
    AssignmentError,
    BatchStat,
    HeartbeatAnswer,
    HeartbeatReport,
    ModelAssignment,
    NodeDevice,
    Observation,
    ServingEndpoint,
)
from planner.solver import Workload


def workload_to_pb(w: Workload) -> pb.Workload:
    return pb.Workload(
        name=w.name,
        model=w.model,
        slo_ms=w.slo_ms,
        rate_rps=w.rate_rps,
        gpu_type=w.gpu_type or "",
        rate_auto=w.rate_auto,
        min_rps=w.min_rps or 0.0,
        max_rps=w.max_rps or 0.0,
    )


def workload_fields(m: pb.Workload) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "name": m.name,
        "model": m.model,
        "slo_ms": m.slo_ms,
        "rate_rps": "auto" if m.rate_auto else m.rate_rps,
        "gpu_type": m.gpu_type or None,
    }
    if m.rate_auto:
        fields.update(min_rps=m.min_rps or None, max_rps=m.max_rps or None)
    return fields


def workload_from_pb(m: pb.Workload) -> Workload:
    return Workload(
        name=m.name,
        model=m.model,
        slo_ms=m.slo_ms,
        rate_rps=m.rate_rps,
        gpu_type=m.gpu_type or None,
        rate_auto=m.rate_auto,
        min_rps=m.min_rps or None,
        max_rps=m.max_rps or None,
    )


def assignment_to_pb(a: ModelAssignment) -> pb.Assignment:
    return pb.Assignment(
        workload=a.workload,
        model=a.model,
        device=a.device,
        share_pct=a.share_pct,
        batch=a.batch,
        queue_delay_ms=a.queue_delay_ms,
        slo_ms=a.slo_ms,
        rate_rps=a.rate_rps,
        replica=a.replica,
    )


def assignment_from_pb(m: pb.Assignment) -> ModelAssignment:
    return ModelAssignment(
        workload=m.workload,
        model=m.model,
        device=m.device,
        share_pct=m.share_pct,
        batch=m.batch,
        queue_delay_ms=m.queue_delay_ms,
        slo_ms=m.slo_ms,
        rate_rps=m.rate_rps,
        replica=m.replica,
    )


def device_to_pb(d: NodeDevice) -> pb.Device:
    return pb.Device(
        index=d.index, name=d.name, kind=d.kind, memory_bytes=d.memory_bytes, cores=d.cores, gpu_type=d.gpu_type
    )


def device_from_pb(m: pb.Device) -> NodeDevice:
    return NodeDevice(
        index=m.index, name=m.name, kind=m.kind, memory_bytes=m.memory_bytes, cores=m.cores, gpu_type=m.gpu_type
    )


#: Observation fields that may be absent (proto3 `optional`; None in `Observation`).
OPTIONAL_OBSERVED = (
    "latency_p50_ms",
    "latency_p95_ms",
    "latency_p99_ms",
    "over_slo_ratio",
    "device_utilization_pct",
    "sm_clock_mhz",
    "power_w",
)


def batch_stat_to_pb(b: BatchStat) -> pb.BatchStat:
    return pb.BatchStat(batch=b.batch, executions=b.executions, compute_ms=b.compute_ms)


def batch_stat_from_pb(m: pb.BatchStat) -> BatchStat:
    return BatchStat(batch=m.batch, executions=m.executions, compute_ms=m.compute_ms)


def observation_to_pb(o: Observation) -> pb.Observed:
    optional = {name: getattr(o, name) for name in OPTIONAL_OBSERVED if getattr(o, name) is not None}
    return pb.Observed(
        key=o.key,
        model=o.model,
        request_rate_rps=o.request_rate_rps,
        mean_batch=o.mean_batch,
        mean_queue_ms=o.mean_queue_ms,
        mean_compute_ms=o.mean_compute_ms,
        failures=o.failures,
        success=o.success,
        endpoint=o.endpoint,
        seq=o.seq,
        window_s=o.window_s,
        requests=o.requests,
        window_failures=o.window_failures,
        pending=o.pending,
        batch_stats=[batch_stat_to_pb(b) for b in o.batch_stats],
        compute_input_ms=o.compute_input_ms,
        compute_infer_ms=o.compute_infer_ms,
        compute_output_ms=o.compute_output_ms,
        instances=o.instances,
        latency_count=o.latency_count,
        **optional,
    )


def observation_from_pb(m: pb.Observed) -> Observation:
    return Observation(
        key=m.key,
        model=m.model,
        request_rate_rps=m.request_rate_rps,
        mean_batch=m.mean_batch,
        mean_queue_ms=m.mean_queue_ms,
        mean_compute_ms=m.mean_compute_ms,
        failures=m.failures,
        success=m.success,
        endpoint=m.endpoint,
        seq=m.seq,
        window_s=m.window_s,
        requests=m.requests,
        window_failures=m.window_failures,
        pending=m.pending,
        batch_stats=tuple(batch_stat_from_pb(b) for b in m.batch_stats),
        compute_input_ms=m.compute_input_ms,
        compute_infer_ms=m.compute_infer_ms,
        compute_output_ms=m.compute_output_ms,
        instances=m.instances or 1,
        latency_count=m.latency_count,
        **{name: getattr(m, name) if m.HasField(name) else None for name in OPTIONAL_OBSERVED},
    )


def endpoint_to_pb(e: ServingEndpoint) -> pb.ServingEndpoint:
    return pb.ServingEndpoint(key=e.key, grpc=e.grpc, http=e.http, metrics=e.metrics, backend=e.backend)


def endpoint_from_pb(m: pb.ServingEndpoint) -> ServingEndpoint:
    return ServingEndpoint(key=m.key, grpc=m.grpc, http=m.http, metrics=m.metrics, backend=m.backend)


def report_to_pb(r: HeartbeatReport) -> pb.HeartbeatRequest:
    return pb.HeartbeatRequest(
        node_id=r.node_id,
        running=[assignment_to_pb(a) for a in r.running],
        observed=[observation_to_pb(o) for o in r.observed],
        events=list(r.events),
        errors=[pb.AssignmentError(key=e.key, message=e.message) for e in r.errors],
        applied_revision=r.applied_revision,
        errors_revision=r.errors_revision,
        endpoints=[endpoint_to_pb(e) for e in r.endpoints],
    )


def report_from_pb(m: pb.HeartbeatRequest) -> HeartbeatReport:
    return HeartbeatReport(
        node_id=m.node_id,
        running=tuple(assignment_from_pb(a) for a in m.running),
        observed=tuple(observation_from_pb(o) for o in m.observed),
        events=tuple(m.events),
        errors=tuple(AssignmentError(e.key, e.message) for e in m.errors),
        applied_revision=m.applied_revision,
        errors_revision=m.errors_revision,
        endpoints=tuple(endpoint_from_pb(e) for e in m.endpoints),
    )


def answer_to_pb(a: HeartbeatAnswer) -> pb.HeartbeatResponse:
    return pb.HeartbeatResponse(
        registered=a.registered,
        revision=a.revision,
        assignments=[assignment_to_pb(x) for x in a.assignments],
        heartbeat_interval_s=a.heartbeat_interval_s,
        hold=a.hold,
    )


def answer_from_pb(m: pb.HeartbeatResponse) -> HeartbeatAnswer:
    return HeartbeatAnswer(
        registered=m.registered,
        revision=m.revision,
        assignments=tuple(assignment_from_pb(x) for x in m.assignments),
        heartbeat_interval_s=m.heartbeat_interval_s,
        hold=m.hold,
    )
