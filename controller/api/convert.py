"""Conversions between the wire types (stoke_pb2) and the messages both sides speak. No I/O.

Both the client (`controller.api.client`) and the handlers use these; the
service's views (plans, nodes, status) go out through `controller.api.views`.

The fields are declared once, in stoke.proto: `to_pb` and `from_pb` copy every field that the message
and the dataclass both name, so a new field is one line in the proto and one in the dataclass. What
differs from a plain copy is said by the caller: nested messages, renamed or derived fields.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

from google.protobuf.message import Message

from controller.api import stoke_pb2 as pb
from controller.messages import (
    AssignmentError,
    BatchStat,
    HeartbeatAnswer,
    HeartbeatReport,
    MeasuredPoint,
    MeasureRequest,
    ModelAssignment,
    NodeDevice,
    Observation,
    ServingEndpoint,
)
from planner.solver import Workload

M = TypeVar("M", bound=Message)
T = TypeVar("T")


def to_pb(message: type[M], source: object, **fields: Any) -> M:
    """`message` with every field that `source` has an attribute for, then `fields` (which win).

    None stays unset: proto3's zero, or absent for an `optional` field. A nested message field that
    `source` also names must come in `fields`: its conversion is the caller's.
    """
    values: dict[str, Any] = {}
    for field in message.DESCRIPTOR.fields:
        if field.name in fields or not hasattr(source, field.name):
            continue
        if field.message_type is not None:
            raise TypeError(f"{message.__name__}.{field.name} is a message: convert it and pass it by name")
        value = getattr(source, field.name)
        if value is not None:
            values[field.name] = list(value) if field.is_repeated else value
    values.update((name, value) for name, value in fields.items() if value is not None)
    return message(**values)


def from_pb(cls: type[T], message: Message, **fields: Any) -> T:
    """The dataclass `cls` from every field of `message` that it names, then `fields` (which win).

    An `optional` field that is absent reads None; so does proto3's zero for a field whose default is
    None (`to_pb` wrote None as the zero); repeated fields read as tuples. A nested message field must
    come in `fields`.
    """
    descriptors = message.DESCRIPTOR.fields_by_name
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        field = descriptors.get(f.name)
        if field is None or f.name in fields or not f.init:
            continue
        if field.message_type is not None:
            raise TypeError(f"{cls.__name__}.{f.name} is a message: convert it and pass it by name")
        value = getattr(message, f.name)
        if field.is_repeated:
            value = tuple(value)
        elif field.has_presence:
            value = value if message.HasField(f.name) else None
        elif not value and f.default is None:
            value = None
        values[f.name] = value
    return cls(**values, **fields)


def workload_to_pb(w: Workload) -> pb.Workload:
    return to_pb(pb.Workload, w)


def workload_fields(m: pb.Workload) -> dict[str, Any]:
    """The plain fields of an apply (the service checks them): rate_rps "auto" with its bounds, or a number."""
    fields = {f.name: getattr(m, f.name) for f in m.DESCRIPTOR.fields}
    auto, low, high = fields.pop("rate_auto"), fields.pop("min_rps"), fields.pop("max_rps")
    fields["gpu_type"] = fields["gpu_type"] or None
    fields["arrivals"] = fields["arrivals"] or "poisson"  # a client from before the field sends ""
    if auto:
        fields.update(rate_rps="auto", min_rps=low or None, max_rps=high or None)
    return fields


def workload_from_pb(m: pb.Workload) -> Workload:
    return from_pb(Workload, m, arrivals=m.arrivals or "poisson")


def assignment_to_pb(a: ModelAssignment) -> pb.Assignment:
    return to_pb(pb.Assignment, a)


def assignment_from_pb(m: pb.Assignment) -> ModelAssignment:
    return from_pb(ModelAssignment, m)


def device_to_pb(d: NodeDevice) -> pb.Device:
    return to_pb(pb.Device, d)


def device_from_pb(m: pb.Device) -> NodeDevice:
    return from_pb(NodeDevice, m)


def batch_stat_to_pb(b: BatchStat) -> pb.BatchStat:
    return to_pb(pb.BatchStat, b)


def batch_stat_from_pb(m: pb.BatchStat) -> BatchStat:
    return from_pb(BatchStat, m)


def observation_to_pb(o: Observation) -> pb.Observed:
    return to_pb(pb.Observed, o, batch_stats=[batch_stat_to_pb(b) for b in o.batch_stats])


def observation_from_pb(m: pb.Observed) -> Observation:
    # an agent from before `instances` sends 0: one instance
    return from_pb(
        Observation, m, batch_stats=tuple(batch_stat_from_pb(b) for b in m.batch_stats), instances=m.instances or 1
    )


def endpoint_to_pb(e: ServingEndpoint) -> pb.ServingEndpoint:
    return to_pb(pb.ServingEndpoint, e)


def endpoint_from_pb(m: pb.ServingEndpoint) -> ServingEndpoint:
    return from_pb(ServingEndpoint, m)


def report_to_pb(r: HeartbeatReport) -> pb.HeartbeatRequest:
    return to_pb(
        pb.HeartbeatRequest,
        r,
        running=[assignment_to_pb(a) for a in r.running],
        observed=[observation_to_pb(o) for o in r.observed],
        errors=[to_pb(pb.AssignmentError, e) for e in r.errors],
        endpoints=[endpoint_to_pb(e) for e in r.endpoints],
        measured=[to_pb(pb.MeasuredPoint, m) for m in r.measured],
    )


def report_from_pb(m: pb.HeartbeatRequest) -> HeartbeatReport:
    return from_pb(
        HeartbeatReport,
        m,
        running=tuple(assignment_from_pb(a) for a in m.running),
        observed=tuple(observation_from_pb(o) for o in m.observed),
        errors=tuple(from_pb(AssignmentError, e) for e in m.errors),
        endpoints=tuple(endpoint_from_pb(e) for e in m.endpoints),
        measured=tuple(from_pb(MeasuredPoint, p) for p in m.measured),
    )


def answer_to_pb(a: HeartbeatAnswer) -> pb.HeartbeatResponse:
    return to_pb(
        pb.HeartbeatResponse,
        a,
        assignments=[assignment_to_pb(x) for x in a.assignments],
        measure=[to_pb(pb.MeasureRequest, x) for x in a.measure],
    )


def answer_from_pb(m: pb.HeartbeatResponse) -> HeartbeatAnswer:
    return from_pb(
        HeartbeatAnswer,
        m,
        assignments=tuple(assignment_from_pb(x) for x in m.assignments),
        measure=tuple(from_pb(MeasureRequest, x) for x in m.measure),
    )
