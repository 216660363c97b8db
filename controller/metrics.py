"""Prometheus metrics of the controller (the one controller module importing prometheus_client).

Per workload (labels workload, model), read from `ControlService.status()` at
scrape time by a collector, so there is no second copy of the state:
  stoke_workload_slo_ms, stoke_workload_predicted_latency_ms,
  stoke_workload_observed_latency_ms, stoke_workload_observed_rate_rps,
  stoke_workload_planned_share_pct (sum over replicas), stoke_workload_planned_batch
  (largest replica batch), stoke_workload_slo_attainment.
Cluster: stoke_gpus_in_use, stoke_plan_cost_per_hour, stoke_plan_revision,
  stoke_nodes{state} (ready, lost, silent), stoke_plan_held (1 while most nodes are silent together and
  the plan is held: alert on it).
The closed loop (`controller.feedback`):
  per workload: stoke_prediction_error_ratio (observed over predicted duration of
  one execution, last windows), stoke_workload_observed_p99_ms (worst replica, last
  window), stoke_workload_predicted_p99_ms (the plan's), stoke_workload_planned_rate_rps
  (what the plan is sized for; the demand tracker's for auto workloads),
  stoke_guard_share_floor_pct, stoke_guard_moves_total (moves applied: the replica serves at the larger
  share), stoke_workload_pending (1 while placed on no device: alert StokeWorkloadPending);
  stoke_guard_floors_refused (floors the planner could not apply lately: alert StokeGuardFloorRefused);
  per (model, GPU type): stoke_profile_version (active; 0 = fitted),
  stoke_profile_correction (k_act factor of the active version);
  stoke_replans_total{cause} (plan revisions by what woke the loop: recalibration,
  demand, guard, other), stoke_recalibrations_total, stoke_demand_changes_total{direction},
  stoke_observations_stored (windows in the database).
Verify before serving (`controller.verification`): stoke_verification_holding (1 while a new plan is
  held for measurements), stoke_verification_points_wanted (points asked of the nodes now),
  stoke_verification_points_measured_total, stoke_verification_points_given_up_total.
The store (`controller.store.Store.health`): stoke_store_healthy (0 while writes fail),
  stoke_store_degraded{reason} (1 for the cause: disk_full, read_only, corrupt, io, gone,
  observations_paused), stoke_store_write_failures_total, stoke_store_free_bytes,
  stoke_store_last_backup_unix (0: none yet). The generated rules alert on them
  (`deploy.alerts.controller_rules`: StokeStoreDegraded names the reason).
Durations and errors (fed by the service through the Observer protocol):
  stoke_plan_solve_seconds (histogram), stoke_reconcile_duration_seconds
  (histogram), stoke_reconcile_errors_total (counter).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from controller.service import ControlService
from controller.status import WorkloadStatus

_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


#: The per-workload gauges: key -> (metric name, help).
_WORKLOAD_GAUGES = {
    "slo": ("stoke_workload_slo_ms", "Latency SLO of the workload (ms)"),
    "pred": ("stoke_workload_predicted_latency_ms", "Predicted worst latency of the planned replicas (ms)"),
    "obs": ("stoke_workload_observed_latency_ms", "Observed mean latency (queue + compute) of the worst replica (ms)"),
    "rate": ("stoke_workload_observed_rate_rps", "Observed request rate (req/s)"),
    "share": ("stoke_workload_planned_share_pct", "Planned share summed over replicas (%)"),
    "batch": ("stoke_workload_planned_batch", "Planned batch size (largest replica)"),
    "att": (
        "stoke_workload_slo_attainment",
        "Share of the last windows' requests within the SLO (SLI histogram, 0..1)",
    ),
}


def _workload_families(workloads: Iterable[WorkloadStatus]) -> Iterator[GaugeMetricFamily]:
    fams = {
        k: GaugeMetricFamily(name, text, labels=["workload", "model"]) for k, (name, text) in _WORKLOAD_GAUGES.items()
    }
    for w in workloads:
        lv = [w.workload.name, w.workload.model]
        fams["slo"].add_metric(lv, w.workload.slo_ms)
        if w.replicas:
            fams["pred"].add_metric(lv, w.predicted_latency_ms)
            fams["share"].add_metric(lv, sum(r.share_pct for r in w.replicas))
            fams["batch"].add_metric(lv, max(r.batch for r in w.replicas))
        if w.observed_latency_ms is not None:
            fams["obs"].add_metric(lv, w.observed_latency_ms)
            fams["rate"].add_metric(lv, w.observed_rate_rps or 0.0)
        if w.slo_attainment is not None:
            fams["att"].add_metric(lv, w.slo_attainment)
    return iter(fams.values())


def _loop_families(workloads: Iterable[WorkloadStatus]) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
    labels = ["workload", "model"]
    error = GaugeMetricFamily(
        "stoke_prediction_error_ratio",
        "Observed over predicted duration of one execution (last windows)",
        labels=labels,
    )
    p99 = GaugeMetricFamily(
        "stoke_workload_observed_p99_ms", "Observed p99 of the worst replica, last window", labels=labels
    )
    predicted = GaugeMetricFamily(
        "stoke_workload_predicted_p99_ms", "Predicted p99 of the worst replica (plan)", labels=labels
    )
    rate = GaugeMetricFamily("stoke_workload_planned_rate_rps", "Rate the plan is sized for (req/s)", labels=labels)
    floor = GaugeMetricFamily("stoke_guard_share_floor_pct", "Share floor the SLO guard holds (0: none)", labels=labels)
    moves = CounterMetricFamily(
        "stoke_guard_moves", "SLO guard moves applied: the replica serves at the larger share", labels=labels
    )
    pending = GaugeMetricFamily(
        "stoke_workload_pending", "1 while the workload is pending: planned for, placed on no device", labels=labels
    )
    for w in workloads:
        lv, f = [w.workload.name, w.workload.model], w.feedback
        pending.add_metric(lv, 1.0 if w.state == "pending" else 0.0)
        rate.add_metric(lv, w.workload.rate_rps)
        floor.add_metric(lv, f.floor_pct)
        moves.add_metric(lv, f.guard_moves)
        if f.error_ratio is not None:
            error.add_metric(lv, f.error_ratio)
        if f.observed_p99_ms is not None:
            p99.add_metric(lv, f.observed_p99_ms)
        if w.predicted_p99_ms is not None:
            predicted.add_metric(lv, w.predicted_p99_ms)
    yield from (error, p99, predicted, rate, floor, moves, pending)


def _profile_and_counter_families(service: ControlService) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
    version = GaugeMetricFamily(
        "stoke_profile_version", "Active profile version (0: fitted)", labels=["model", "gpu_type"]
    )
    factor = GaugeMetricFamily(
        "stoke_profile_correction", "k_act factor of the active version", labels=["model", "gpu_type"]
    )
    for r in service.list_profiles():
        version.add_metric([r.model, r.gpu_type], r.active_version)
        factor.add_metric([r.model, r.gpu_type], r.correction)
    yield from (version, factor)
    counts = service.feedback.counters.copy()
    replans = CounterMetricFamily("stoke_replans", "Plan revisions by what woke the loop", labels=["cause"])
    for cause in ("recalibration", "demand", "guard", "other"):
        replans.add_metric([cause], counts.get(f"replans_{cause}", 0))
    demand = CounterMetricFamily("stoke_demand_changes", "Planned-rate changes of auto workloads", labels=["direction"])
    for direction in ("up", "down", "bounds"):
        demand.add_metric([direction], counts.get(f"demand_{direction}", 0))
    yield from (replans, demand)
    yield CounterMetricFamily(
        "stoke_recalibrations", "Recalibrated profile versions published", value=counts["recalibrations"]
    )
    yield GaugeMetricFamily(
        "stoke_observations_stored", "Observation windows in the database", value=service.store.observation_count()
    )
    verifier = service.verifier
    yield GaugeMetricFamily(
        "stoke_verification_holding",
        "1 while verify before serving holds a new plan for measurements",
        value=1 if verifier.holding() else 0,
    )
    yield GaugeMetricFamily(
        "stoke_verification_points_wanted", "Points asked of the nodes to measure now", value=verifier.wanted()
    )
    yield CounterMetricFamily(
        "stoke_verification_points_measured", "Points measured and stored", value=verifier.counters["measured"]
    )
    yield CounterMetricFamily(
        "stoke_verification_points_given_up",
        "Points given up (an error, a timeout, a refused result)",
        value=verifier.counters["given_up"],
    )


def _store_families(service: ControlService, backups: Any) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
    state = service.store.health()
    yield GaugeMetricFamily(
        "stoke_store_healthy", "1 while the controller database takes writes, 0 while they fail", value=int(state.ok)
    )
    degraded = GaugeMetricFamily(
        "stoke_store_degraded",
        "1 for the reason the store is degraded (writes fail, windows paused)",
        labels=["reason"],
    )
    if state.reason:
        degraded.add_metric([state.reason], 1.0)
    yield degraded
    yield CounterMetricFamily(
        "stoke_store_write_failures", "Database calls that failed since the controller started", value=state.failures
    )
    if state.free_bytes is not None:
        yield GaugeMetricFamily(
            "stoke_store_free_bytes", "Free bytes on the database's filesystem", value=state.free_bytes
        )
    if backups is not None:
        yield GaugeMetricFamily(
            "stoke_store_last_backup_unix",
            "When the last online backup succeeded (0: none)",
            value=backups.last_ok_unix,
        )


class _StateCollector(Collector):
    def __init__(self, service: ControlService) -> None:
        self.service = service
        self.backups: Any = None  # a controller.store.BackupSchedule, when the server makes backups

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        status = self.service.status()
        yield from _workload_families(status.workloads)
        yield from _loop_families(status.workloads)
        yield from _profile_and_counter_families(self.service)
        yield from _store_families(self.service, self.backups)
        yield GaugeMetricFamily(
            "stoke_gpus_in_use",
            "Devices in use: the applied plan's GPUs bound to a node device (as stoke status counts)",
            value=status.gpus_in_use,
        )
        yield GaugeMetricFamily(
            "stoke_plan_cost_per_hour",
            "Hourly cost of the devices in use (bound GPUs of the applied plan)",
            value=status.cost_per_hour,
        )
        yield GaugeMetricFamily("stoke_plan_revision", "Revision of the applied plan", value=status.revision)
        nodes = GaugeMetricFamily("stoke_nodes", "Nodes by state", labels=["state"])
        nodes.add_metric(["ready"], status.nodes_ready)
        nodes.add_metric(["lost"], status.nodes_lost)
        nodes.add_metric(["silent"], status.nodes_silent)
        yield nodes
        yield GaugeMetricFamily(
            "stoke_plan_held",
            "1 while the plan is held because most nodes fell silent together (alert on it)",
            value=1.0 if self.service.nodes.alerts() else 0.0,
        )
        yield GaugeMetricFamily(
            "stoke_guard_floors_refused",
            "SLO guard floors the planner could not apply lately (each is an event and a status alert)",
            value=len(self.service.feedback.output.alerts),
        )


class ControllerMetrics:
    """Registry with the state collector and the duration/error instruments; an `Observer`."""

    def __init__(self, service: ControlService | None = None) -> None:
        self.registry = CollectorRegistry()
        self.solve_seconds = Histogram(
            "stoke_plan_solve_seconds", "Wall time of one solver run", buckets=_BUCKETS, registry=self.registry
        )
        self.reconcile_seconds = Histogram(
            "stoke_reconcile_duration_seconds",
            "Wall time of one reconcile pass",
            buckets=_BUCKETS,
            registry=self.registry,
        )
        self.reconcile_errors = Counter(
            "stoke_reconcile_errors", "Reconcile passes that failed", registry=self.registry
        )
        if service is not None:
            self.attach(service)

    def attach(self, service: ControlService, backups: Any = None) -> None:
        self.collector = _StateCollector(service)
        self.collector.backups = backups
        self.registry.register(self.collector)
        service.observer = self

    def solved(self, seconds: float) -> None:
        self.solve_seconds.observe(seconds)

    def reconciled(self, seconds: float, error: bool) -> None:
        self.reconcile_seconds.observe(seconds)
        if error:
            self.reconcile_errors.inc()

    def serve(self, host: str, port: int):  # type: ignore[no-untyped-def]
        """Start the /metrics HTTP endpoint; returns (server, thread)."""
        return start_http_server(port, addr=host, registry=self.registry)
