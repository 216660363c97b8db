"""The status view: per workload, what was planned, what runs, what is observed. A pure function.

`cluster_status(applied, workloads, nodes, last_error)` joins the applied
plan with the nodes' reports. A workload's state:

- pending: no replica is placed (the plan's reason, or "not planned yet");
- degraded: a node of one of its replicas is not ready, only some replicas
  could be placed, or it serves best effort (its SLO can no longer be promised:
  `controller.reconcile.planning._best_effort`);
- unconfirmed: a node of one of its replicas is ready but its heartbeats stopped
  (silent for more than `unconfirmed_after_s`): it may not serve, and it is judged
  (lost, or heard again) at the heartbeat timeout;
- serving: every replica runs on its node with the planned device, share,
  batch and queue delay;
- failing: a replica that does not serve has an error from its node's last
  apply (the first such error is the reason);
- starting: otherwise (the node has not reported the planned config yet).

Observed latency (Triton's mean queue + compute) is the worst over replicas that
saw requests in the last window. SLO attainment comes from the SLI histogram of the
serving path (what clients see): the share of the last windows' requests within the
SLO (`WorkloadFeedback.within_slo`), None without an SLI; `slo_ok` says whether the
observed p99 (the SLI's, worst replica) is within the SLO.

The closed loop (`controller.feedback`) adds per workload its `WorkloadFeedback`
(`controller.loop_output`):
the demand tracker's decision, the last window's p99 and prediction error
ratio, and what the SLO guard holds or did.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from controller.loop_output import WorkloadFeedback
from controller.messages import AssignmentError, Observation, Replica, ServingEndpoint
from controller.reconcile.planning import PlanView
from controller.registry import NodeView
from planner.solver import Workload


@dataclass(frozen=True)
class ReplicaStatus:
    replica: int
    node_id: str
    device: int
    share_pct: float
    batch: int
    predicted_latency_ms: float
    serving: bool
    observed: Observation | None
    endpoint: ServingEndpoint | None = None  # where clients reach it (reported by its node)


@dataclass(frozen=True)
class WorkloadStatus:
    workload: Workload
    state: str  # serving | starting | failing | pending | degraded
    reason: str
    replicas: tuple[ReplicaStatus, ...]
    predicted_latency_ms: float
    observed_latency_ms: float | None
    observed_rate_rps: float | None
    slo_attainment: float | None  # share of requests within the SLO (SLI histogram, last windows); None: no SLI
    feedback: WorkloadFeedback = WorkloadFeedback()
    predicted_p99_ms: float | None = None  # worst replica, from the plan

    @property
    def slo_ok(self) -> bool | None:
        """Is the observed p99 (SLI, worst replica, last window) within the SLO? None: no SLI."""
        p99 = self.feedback.observed_p99_ms
        return None if p99 is None else p99 <= self.workload.slo_ms


@dataclass(frozen=True)
class ClusterStatus:
    revision: int
    workloads: tuple[WorkloadStatus, ...]
    gpus_in_use: int
    cost_per_hour: float
    nodes_ready: int
    nodes_lost: int
    last_error: str
    nodes_silent: int = 0  # silent together with most nodes: the plan is held for them
    alerts: tuple[str, ...] = ()  # what needs a person now (the plan held, ...)
    loop_events: tuple[str, ...] = ()  # recent closed-loop events, oldest first


def cluster_status(
    applied: PlanView | None,
    workloads: Sequence[Workload],
    nodes: Sequence[NodeView],
    last_error: str,
    alerts: Sequence[str] = (),
    feedback: Mapping[str, WorkloadFeedback] | None = None,
    loop_events: Sequence[str] = (),
    unconfirmed_after_s: float = math.inf,
    verifying: Mapping[str, str] | None = None,
) -> ClusterStatus:
    """`verifying`: {workload: why} of those a plan held by verify before serving would change: a pending one
    reads that reason, and one that serves keeps its state with it as the reason."""
    by_id = {n.node_id: n for n in nodes}
    replicas = planned_replicas(applied, by_id) if applied else {}
    pending = dict(applied.pending) if applied else {}
    p99 = _planned_p99(applied) if applied else {}
    held = verifying or {}
    out = tuple(
        replace(
            _verifying(workload_status(w, replicas.get(w.name, ()), pending, by_id, unconfirmed_after_s), held),
            feedback=(fb := (feedback or {}).get(w.name, WorkloadFeedback())),
            predicted_p99_ms=p99.get(w.name),
            slo_attainment=fb.within_slo,  # from the SLI histogram: the share of requests within the SLO
        )
        for w in workloads
    )
    bound = [g for g, b in zip(applied.plan.gpus, applied.bindings) if b is not None] if applied else []
    return ClusterStatus(
        revision=applied.revision if applied else 0,
        workloads=out,
        gpus_in_use=len(bound),
        cost_per_hour=sum(g.price_per_hour for g in bound),
        nodes_ready=sum(1 for n in nodes if n.state == "ready"),
        nodes_lost=sum(1 for n in nodes if n.state == "lost"),
        last_error=last_error,
        nodes_silent=sum(1 for n in nodes if n.state == "silent"),
        alerts=tuple(alerts),
        loop_events=tuple(loop_events),
    )


def _verifying(status: WorkloadStatus, held: Mapping[str, str]) -> WorkloadStatus:
    why = held.get(status.workload.name)
    if why is None:
        return status
    return replace(status, reason=why if status.state in ("pending", "serving") else f"{status.reason}; {why}")


def _planned_p99(applied: PlanView) -> dict[str, float]:
    """{workload: worst predicted p99 of its bound replicas} (plans that predict one)."""
    out: dict[str, float] = {}
    for p in applied.bound_placements():
        if not math.isnan(p.predicted_p99_ms):
            out[p.name] = max(out.get(p.name, 0.0), p.predicted_p99_ms)
    return out


def planned_replicas(applied: PlanView, nodes: Mapping[str, NodeView]) -> dict[str, tuple[ReplicaStatus, ...]]:
    """{workload: its bound replicas, by index}, each with whether its node serves the planned config."""
    out: dict[str, list[ReplicaStatus]] = {}
    for gpu, b in zip(applied.plan.gpus, applied.bindings):
        if b is None:
            continue
        node = nodes.get(b.node_id)
        running = {a.key: a for a in node.running} if node else {}
        for p in gpu.placements:
            key = str(Replica(p.name, p.replica))
            have = running.get(key)
            serving = have is not None and (have.device, have.share_pct, have.batch, have.queue_delay_ms) == (
                b.device,
                float(p.share_pct),
                int(p.batch),
                float(p.queue_delay_ms),
            )
            out.setdefault(p.name, []).append(
                ReplicaStatus(
                    replica=p.replica,
                    node_id=b.node_id,
                    device=b.device,
                    share_pct=p.share_pct,
                    batch=p.batch,
                    predicted_latency_ms=p.predicted_worst_ms,
                    serving=serving,
                    observed=node.observed.get(key) if node else None,
                    endpoint=node.endpoints.get(key) if node else None,
                )
            )
    return {name: tuple(sorted(reps, key=lambda r: r.replica)) for name, reps in out.items()}


def workload_status(
    w: Workload,
    replicas: tuple[ReplicaStatus, ...],
    pending: Mapping[str, str],
    nodes: Mapping[str, NodeView],
    unconfirmed_after_s: float = math.inf,
) -> WorkloadStatus:
    state, reason = workload_state(w, replicas, pending, nodes, unconfirmed_after_s)
    observed = [r.observed for r in replicas if r.observed is not None]
    busy = [o for o in observed if o.success_in_window]  # latency is only known where requests came
    return WorkloadStatus(
        workload=w,
        state=state,
        reason=reason,
        replicas=replicas,
        predicted_latency_ms=max((r.predicted_latency_ms for r in replicas), default=0.0),
        observed_latency_ms=max(o.latency_ms for o in busy) if busy else None,
        observed_rate_rps=sum(o.request_rate_rps for o in observed) if observed else None,
        slo_attainment=None,  # the SLI's, set by `cluster_status` from the closed loop
    )


def workload_state(
    w: Workload,
    replicas: tuple[ReplicaStatus, ...],
    pending: Mapping[str, str],
    nodes: Mapping[str, NodeView],
    unconfirmed_after_s: float = math.inf,
) -> tuple[str, str]:
    """(state, reason); see the module docstring."""
    if not replicas:
        return "pending", pending.get(w.name, "not planned yet")
    down = [r.node_id for r in replicas if r.node_id not in nodes or nodes[r.node_id].state != "ready"]
    if down:
        state = nodes[down[0]].state if down[0] in nodes else "unknown"
        return "degraded", f"a node of this workload is not ready ({down[0]}: {state})"
    quiet = [nodes[r.node_id] for r in replicas if nodes[r.node_id].seconds_since_heartbeat > unconfirmed_after_s]
    if quiet:
        return "unconfirmed", (
            f"no heartbeat from {quiet[0].node_id} for {quiet[0].seconds_since_heartbeat:.1f}s: it may not serve; "
            f"it is judged (lost, or heard again) at the heartbeat timeout"
        )
    if w.name in pending:  # some replicas placed, the rest could not be
        return "degraded", pending[w.name]
    if all(r.serving for r in replicas):
        return "serving", ""
    failing = [e for r in replicas if not r.serving and (e := _error_of(r, w, nodes)) is not None]
    if failing:
        return "failing", str(failing[0])
    return "starting", "the node has not reported the planned config yet"


def _error_of(r: ReplicaStatus, w: Workload, nodes: Mapping[str, NodeView]) -> AssignmentError | None:
    key = str(Replica(w.name, r.replica))
    return next((e for e in nodes[r.node_id].errors if e.key == key), None)
