"""When a recalibrated profile is worth a re-plan. Pure.

The estimator (`interference.recalibration`) proposes a corrected profile of one (model, GPU
type) every `interval_s`. It is published only when it changes what the plan predicts:

    max over placed replicas of that model on that GPU type of |p99_new - p99_active| / SLO > threshold

Both p99s come from the batching model (`interference.batching.latency_distribution`). Each takes
the replica's placement as it is (share, max batch, queue delay, rate, neighbours); p99_new uses
the candidate profile, p99_active the active one. The move is measured against the SLO, not
the p99 itself: near saturation a p99 of 20 ms may double for a 5% correction and still be far
within an 80 ms SLO, while 70 -> 78 ms matters. A replica whose queue turns unstable, or stable
again, always counts as a move.

Hysteresis: the comparison is with the active profile, the last one published, not with the
previous estimate. A slow drift accumulates until it crosses the threshold; noise that oscillates
around the truth stays within it, so it causes no re-plans. A move must also be seen by
`confirmations` consecutive estimates that agree with each other within half the threshold
(`Confirmation`): one stray estimate publishes nothing, and an estimate still moving towards a
new regime waits until it settles. With no placed replica of the model, the
candidate is published when its factor moved by more than the threshold.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from controller.messages import Replica
from interference.batching import latency_distribution
from interference.profile import DeviceProfile
from planner.simulate import service_curve
from planner.solver import Placement, Plan


@dataclass(frozen=True)
class PlacedReplica:
    """One placed replica as the plan has it: the placements of its plan GPU and its index among them."""

    placements: tuple[Placement, ...]
    index: int

    @property
    def placement(self) -> Placement:
        return self.placements[self.index]

    @property
    def key(self) -> str:
        return str(Replica(self.placement.name, self.placement.replica))


@dataclass(frozen=True)
class Move:
    key: str
    before_ms: float
    after_ms: float
    slo_ms: float

    @property
    def relative(self) -> float:
        """|after - before| as a share of the SLO (inf when the queue turns unstable or stable again)."""
        if math.isinf(self.before_ms) or math.isinf(self.after_ms):
            return 0.0 if self.before_ms == self.after_ms else math.inf
        return abs(self.after_ms - self.before_ms) / self.slo_ms

    def __str__(self) -> str:
        return f"{self.key} p99 {self.before_ms:.1f} -> {self.after_ms:.1f} ms (SLO {self.slo_ms:g})"


def placed_replicas(plan: Plan, gpu_type: str, model: str) -> list[PlacedReplica]:
    """The replicas of `model` on plan GPUs of `gpu_type`."""
    return [
        PlacedReplica(gpu.placements, index)
        for gpu in plan.gpus
        if gpu.gpu_type == gpu_type
        for index, p in enumerate(gpu.placements)
        if p.model == model
    ]


def replica_p99_ms(profile: DeviceProfile, r: PlacedReplica) -> float:
    """The batching model's p99 of one replica at its placement, with `profile` (NaN: a model it lacks)."""
    if any(p.model not in profile.models for p in r.placements):
        return math.nan
    p = r.placement
    curve = service_curve(profile, r.placements, r.index)
    return latency_distribution(p.rate_rps, p.batch, p.queue_delay_ms, p.arrivals, curve).p99_ms


def p99_moves(active: DeviceProfile, candidate: DeviceProfile, replicas: Sequence[PlacedReplica]) -> list[Move]:
    """Each replica's p99 with the active and with the candidate profile (replicas it cannot predict left out)."""
    moves = []
    for r in replicas:
        before, after = replica_p99_ms(active, r), replica_p99_ms(candidate, r)
        if not (math.isnan(before) or math.isnan(after)):
            moves.append(Move(r.key, before, after, r.placement.slo_ms))
    return moves


def crosses(moves: Sequence[Move], threshold: float, factor_move: float) -> tuple[bool, str]:
    """(does the candidate cross the threshold, the largest move in words)."""
    if not moves:
        return factor_move > threshold, f"no placed replica; factor moved {factor_move:.1%}"
    worst = max(moves, key=lambda m: m.relative)
    return (
        worst.relative > threshold,
        f"{worst}: {'unstable' if math.isinf(worst.relative) else f'{worst.relative:.1%} of the SLO'}",
    )


@dataclass(frozen=True)
class Confirmation:
    """Consecutive estimates that crossed the threshold and agree with each other (within half the
    threshold: an estimate still on its way to a new regime confirms nothing), per (GPU type, model)."""

    count: int = 0
    factor: float = 1.0  # the last crossing estimate's factor

    def next(self, crossed: bool, factor: float, threshold: float) -> Confirmation:
        if not crossed:
            return Confirmation()
        agrees = self.count > 0 and abs(factor / self.factor - 1.0) <= threshold / 2.0
        return Confirmation(self.count + 1 if agrees else 1, factor)


def factor_move(active_factor: float, candidate_factor: float) -> float:
    return abs(candidate_factor / active_factor - 1.0) if active_factor > 0 else math.inf
