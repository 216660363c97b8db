"""Observations as data: what the agents observe, keyed and compared with the prediction. Pure.

Each heartbeat carries, per replica, the figures of the node's last window
(`controller.messages.Observation`). `records_from_report` turns them into
`ObservationRecord`s, the rows the store keeps. Each row is keyed by what ran:
- workload, replica, model;
- node, device and its GPU type;
- share, max batch and queue delay, as the node reports them running;
- the neighbours on the same device, as (model, batch, share) each.

It holds the observed figures next to the active profile's prediction of the
same thing:
- `observed_batch_ms` is the mean duration of one execution, weighted by the
  executions of each batch size (Triton's batch statistics);
- `predicted_batch_ms` is what the active profile predicts for those batch sizes,
  beside those neighbours;
- their ratio is `error_ratio` (exported as `stoke_prediction_error_ratio`).

A window is stored once: the agent numbers its windows (`seq`), and a heartbeat
that repeats the last window adds no row. `calibration_points` turns rows into
the recalibration estimator's input (`interference.recalibration`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from controller.messages import MAX_BATCH_STATS, BatchStat, HeartbeatReport, ModelAssignment, Observation, Replica
from interference.latency import predict_points, solo_point
from interference.profile import DeviceProfile
from interference.recalibration import CalibrationPoint, Neighbour

#: The most observations one heartbeat may add (one per replica the node runs).
MAX_PER_REPORT = 1024


@dataclass(frozen=True)
class ObservationRecord:
    """One window of one replica, keyed by what ran, with the prediction beside it."""

    unix: float
    node_id: str
    device: int
    gpu_type: str
    workload: str
    replica: int
    model: str
    share_pct: float
    batch: int
    queue_delay_ms: float
    slo_ms: float
    neighbours: tuple[Neighbour, ...]
    window_s: float
    seq: int
    rate_rps: float
    requests: int
    failures: int
    pending: int
    mean_batch: float
    batch_stats: tuple[BatchStat, ...]
    queue_ms: float  # per request
    compute_ms: float  # per request (input + infer + output)
    instances: int
    observed_batch_ms: float | None = None
    predicted_batch_ms: float | None = None
    predicted_p99_ms: float | None = None  # the plan's, for this replica
    profile_version: int = 0
    p50_ms: float | None = None
    p95_ms: float | None = None
    p99_ms: float | None = None
    over_slo_ratio: float | None = None
    device_utilization_pct: float | None = None
    sm_clock_mhz: float | None = None
    power_w: float | None = None
    #: the p99 of the agent's last `pooled_windows` windows pooled (`Observation.pooled_p99_ms`; None: not sent)
    pooled_p99_ms: float | None = None
    pooled_count: int = 0
    pooled_windows: int = 0
    id: int = field(default=0, compare=False)  # the store's row id (0 until stored)

    @property
    def key(self) -> str:
        return str(Replica(self.workload, self.replica))

    @property
    def error_ratio(self) -> float | None:
        """Observed over predicted duration of one execution; None when either is unknown."""
        if self.observed_batch_ms is None or not self.predicted_batch_ms:
            return None
        return self.observed_batch_ms / self.predicted_batch_ms

    @property
    def over_slo(self) -> bool | None:
        """Was the window's p99 over the SLO? Exact from the SLI's bucket at the SLO when present;
        else the p99; else Triton's mean queue + compute time (a lower bound of the p99). None: no data."""
        if self.requests <= 0 and not self.p99_ms:
            return None
        if self.over_slo_ratio is not None:
            return self.over_slo_ratio > 0.01
        if self.p99_ms is not None:
            return self.p99_ms > self.slo_ms
        return self.queue_ms + self.compute_ms > self.slo_ms

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("id")
        data["neighbours"] = [list(n) for n in self.neighbours]
        data["batch_stats"] = [[b.batch, b.executions, b.compute_ms] for b in self.batch_stats]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], row_id: int = 0) -> ObservationRecord:
        values = dict(data)
        values["neighbours"] = tuple((str(m), int(b), float(r)) for m, b, r in values.get("neighbours", ()))
        values["batch_stats"] = tuple(BatchStat(int(b), int(n), float(t)) for b, n, t in values.get("batch_stats", ()))
        known = {f for f in cls.__dataclass_fields__ if f != "id"}
        return cls(**{k: v for k, v in values.items() if k in known}, id=row_id)


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def neighbours_of(a: ModelAssignment, running: Sequence[ModelAssignment]) -> tuple[Neighbour, ...]:
    """What runs beside `a` on its device: (model, batch, share) each, sorted."""
    return tuple(
        sorted((o.model, int(o.batch), float(o.share_pct)) for o in running if o.device == a.device and o.key != a.key)
    )


def predicted_batch_ms(
    profile: DeviceProfile | None,
    model: str,
    share_pct: float,
    neighbours: Sequence[Neighbour],
    stats: Sequence[BatchStat],
) -> float | None:
    """The profile's duration of one execution, weighted like `stats`; None when it cannot predict it."""
    if profile is None or not stats:
        return None
    if model not in profile.models or any(m not in profile.models for m, _, _ in neighbours):
        return None
    if not 0 < share_pct <= 100 or sum(r for _, _, r in neighbours) + share_pct > 100 + 1e-6:
        return None
    others = [solo_point(profile, m, max(1, b), r) for m, b, r in neighbours if 0 < r <= 100]
    total = weight = 0.0
    for s in stats:
        t = predict_points(profile.gpu, [solo_point(profile, model, s.batch, share_pct), *others])[0].latency_ms
        total += s.executions * t
        weight += s.executions
    return total / weight if weight else None


def observed_batch_ms(stats: Sequence[BatchStat]) -> float | None:
    executions = sum(s.executions for s in stats)
    return sum(s.executions * s.compute_ms for s in stats) / executions if executions else None


def records_from_report(
    report: HeartbeatReport,
    gpu_types: Mapping[int, str],
    profiles: Mapping[str, DeviceProfile],
    versions: Mapping[tuple[str, str], int],
    predicted_p99: Mapping[str, float],
    last_seq: Mapping[str, int],
    now: float,
) -> list[ObservationRecord]:
    """The new windows of one heartbeat as rows.

    `gpu_types`: the node's device index -> GPU type; `profiles`: the active profile per GPU type;
    `versions`: the active version per (GPU type, model); `predicted_p99`: the plan's p99 per
    replica key; `last_seq`: the last window stored per replica key of this node (a repeated window
    is skipped). Observations without a running assignment or without a window are skipped.
    """
    running = {a.key: a for a in report.running}
    out = []
    for o in report.observed[:MAX_PER_REPORT]:
        a = running.get(o.key)
        if a is None or not plausible(o) or (o.seq and last_seq.get(o.key) == o.seq):
            continue
        out.append(_record(o, a, report, gpu_types, profiles, versions, predicted_p99, now))
    return out


#: Longest window an observation may cover (s); a larger one is a clock gone wrong.
MAX_WINDOW_S = 3600.0


def plausible(o: Observation) -> bool:
    """A window worth storing: finite, non-negative figures over 0 < window_s <= MAX_WINDOW_S."""
    numbers = (o.request_rate_rps, o.mean_batch, o.mean_queue_ms, o.mean_compute_ms, o.compute_infer_ms)
    optional = (o.latency_p50_ms, o.latency_p95_ms, o.latency_p99_ms, o.over_slo_ratio, o.pooled_p99_ms)
    return (
        0.0 < o.window_s <= MAX_WINDOW_S
        and all(math.isfinite(x) and x >= 0 for x in numbers)
        and all(x is None or (math.isfinite(x) and x >= 0) for x in optional)
        and o.requests >= 0
    )


def usable_stats(o: Observation) -> tuple[BatchStat, ...]:
    """The window's batch statistics worth keeping: at most `MAX_BATCH_STATS`, each a real execution."""
    return tuple(
        s
        for s in o.batch_stats[:MAX_BATCH_STATS]
        if s.batch >= 1 and s.executions >= 1 and math.isfinite(s.compute_ms) and s.compute_ms >= 0
    )


def _record(
    o: Observation,
    a: ModelAssignment,
    report: HeartbeatReport,
    gpu_types: Mapping[int, str],
    profiles: Mapping[str, DeviceProfile],
    versions: Mapping[tuple[str, str], int],
    predicted_p99: Mapping[str, float],
    now: float,
) -> ObservationRecord:
    gpu_type = gpu_types.get(a.device, "")
    neighbours = neighbours_of(a, report.running)
    stats = usable_stats(o)
    return ObservationRecord(
        unix=now,
        node_id=report.node_id,
        device=a.device,
        gpu_type=gpu_type,
        workload=a.workload,
        replica=a.replica,
        model=a.model,
        share_pct=a.share_pct,
        batch=a.batch,
        queue_delay_ms=a.queue_delay_ms,
        slo_ms=a.slo_ms,
        neighbours=neighbours,
        window_s=o.window_s,
        seq=o.seq,
        rate_rps=o.request_rate_rps,
        requests=o.requests,
        failures=o.window_failures,
        pending=o.pending,
        mean_batch=o.mean_batch,
        batch_stats=stats,
        queue_ms=o.mean_queue_ms,
        compute_ms=o.mean_compute_ms,
        instances=max(1, o.instances),
        observed_batch_ms=observed_batch_ms(stats),
        predicted_batch_ms=predicted_batch_ms(profiles.get(gpu_type), a.model, a.share_pct, neighbours, stats),
        predicted_p99_ms=_finite(predicted_p99.get(a.key)),
        profile_version=versions.get((gpu_type, a.model), 0),
        device_utilization_pct=o.device_utilization_pct,
        sm_clock_mhz=o.sm_clock_mhz,
        power_w=o.power_w,
        **_sli_fields(o),
    )


def _sli_fields(o: Observation) -> dict[str, Any]:
    """The window's SLI figures (`ObservationRecord`'s p50/p95/p99, over-SLO share and the pooled p99)."""
    pooled = o.pooled_p99_ms is not None
    return {
        "p50_ms": o.latency_p50_ms,
        "p95_ms": o.latency_p95_ms,
        "p99_ms": o.latency_p99_ms,
        "over_slo_ratio": o.over_slo_ratio,
        "pooled_p99_ms": o.pooled_p99_ms,
        "pooled_count": o.pooled_count if pooled else 0,
        "pooled_windows": o.pooled_windows if pooled else 0,
    }


def calibration_points(records: Iterable[ObservationRecord]) -> list[CalibrationPoint]:
    """The estimator's input: one point per (row, batch size)."""
    return [
        CalibrationPoint(
            model=r.model,
            batch=s.batch,
            share_pct=r.share_pct,
            neighbours=r.neighbours,
            observed_ms=s.compute_ms,
            executions=s.executions,
            at=r.unix,
            window=r.id,
        )
        for r in records
        for s in r.batch_stats
    ]


def neighbour_text(n: Neighbour) -> str:
    model, batch, share = n
    return f"{model}/b{batch}@{share:g}%"
