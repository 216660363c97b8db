"""What the closed loop hands to the rest of the controller after one tick. Plain data, pure.

The closed loop (`controller.feedback.FeedbackLoop`) takes one `LoopInput` per tick (the applied
plan, the nodes' states, the floors the last solve could not apply) together with the windows the
agents reported since the last tick and the stored state (workloads, profile versions), and
returns a `LoopOutput`: the guard's share floors the next solve reads, the alerts it raises, and
per workload its `WorkloadFeedback` for the status view and the metrics. Demand (planned rates)
and recalibration (profile versions) write their results to the store, which the reconcile pass
reads like any other desired state.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType


@dataclass(frozen=True)
class WorkloadFeedback:
    """What the closed loop says about one workload."""

    demand: str = ""  # auto: the demand tracker's decision and its reason
    observed_p99_ms: float | None = None  # worst replica, last window (SLI histogram)
    error_ratio: float | None = None  # observed over predicted batch compute time, last windows
    guard: str = ""  # the SLO guard's last action or state
    guard_moves: int = 0  # moves applied: the replica serves at the larger share
    floor_pct: float = 0.0  # the guard's share floor in force (0: none)
    within_slo: float | None = None  # share of the last windows' requests within the SLO (SLI histogram)
    requests: int = 0  # requests behind `within_slo`


@dataclass(frozen=True)
class NodeState:
    """A node as the loop needs it: its id and state (ready | unconfirmed | lost | waiting | silent;
    unconfirmed: ready, but its heartbeats stopped and it is not judged yet)."""

    node_id: str
    state: str


@dataclass(frozen=True)
class LoopOutput:
    """What the reconcile step reads from the loop: the share floors (workload -> %), and what to show."""

    floors: tuple[tuple[str, float], ...] = ()  # sorted by workload
    alerts: tuple[str, ...] = ()  # what needs a person (a floor that cannot be applied, ...)
    feedback: Mapping[str, WorkloadFeedback] = field(default_factory=lambda: MappingProxyType({}))
