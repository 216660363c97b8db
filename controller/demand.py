"""Demand tracking for workloads declared with `rate_rps: auto`. Pure.

The controller plans an auto workload for a high quantile of its observed rate, with headroom:

    planned = clamp(q-quantile of the window's rates * (1 + headroom), min_rps, max_rps)

Each heartbeat gives one sample, the workload's rate summed over its replicas. A replica's rate
is what Triton served in the window plus the growth of its queue (less what drained from it), so
an overloaded replica still shows its demand. The first windows of a new Triton process give no
sample: what queued during the switch arrives there at once (`controller.feedback`). Samples
live in a sliding window of `window_s` (`controller.config.DemandConfig`). `track` decides on
each sample:

- up, promptly: when the last `up_heartbeats` samples all exceed the planned rate (the headroom
  is used up: the plan is at the rate it was sized for), it plans for
  max(their highest, the window's quantile) * (1 + headroom). A surge past the plan's capacity
  is re-planned within `up_heartbeats` heartbeats, one more when it starts mid-window. Noise
  does not trigger it: a sample over the planned rate is one over the window's quantile by
  the whole headroom, and it takes `up_heartbeats` of them in a row.
- down, slowly: only after `cooldown_s` without a change, and only when the window's quantile
  with headroom is more than `down_tolerance` below the planned rate.
- hold: otherwise. Every decision keeps its reason, which `stoke status` shows.

The planned rate is rounded up to 0.1 req/s and never goes below `MIN_RATE_RPS`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from controller.config import DemandConfig
from planner.solver import Workload

#: Lowest planned rate (req/s) of an auto workload without min_rps.
MIN_RATE_RPS = 0.1
#: Most samples a window holds (bounds memory whatever the heartbeat interval).
MAX_SAMPLES = 4096


@dataclass(frozen=True)
class DemandState:
    """One auto workload's tracker: its samples, the rate planned for, and the last decision."""

    planned_rps: float
    changed_unix: float  # when the planned rate last changed (or tracking began)
    samples: tuple[tuple[float, float], ...] = ()  # (unix, req/s), oldest first
    decision: str = "waiting"  # waiting | hold | up | down | bounds
    reason: str = "no observations yet"

    @property
    def text(self) -> str:
        return f"{self.decision}: {self.reason}"


def quantile(values: Sequence[float], q: float) -> float:
    """The q-quantile with linear interpolation (numpy's default), of a non-empty sequence."""
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def clamp(rate: float, w: Workload) -> float:
    low = max(MIN_RATE_RPS, w.min_rps or 0.0)
    high = w.max_rps if w.max_rps is not None else math.inf
    return min(max(rate, low), max(high, low))


def rounded(rate: float) -> float:
    return math.ceil(rate * 10.0 - 1e-9) / 10.0


def _scale_up(
    state: DemandState, w: Workload, samples: tuple[tuple[float, float], ...], q: float, now: float, cfg: DemandConfig
) -> DemandState | None:
    """Scale up (or hold at max_rps) when the last heartbeats used up the headroom; None: not this."""
    planned, factor = state.planned_rps, 1.0 + cfg.headroom
    recent = [r for _, r in samples][-cfg.up_heartbeats :]
    if len(recent) < cfg.up_heartbeats or min(recent) <= planned:
        return None
    target = rounded(clamp(max(max(recent), q) * factor, w))
    if target > planned + 1e-9:
        return DemandState(
            target,
            now,
            samples,
            "up",
            f"{len(recent)} heartbeat(s) at {min(recent):.1f}-{max(recent):.1f} req/s, over the planned "
            f"{planned:g}; planning {target:g} req/s",
        )
    if w.max_rps is not None and planned >= w.max_rps - 1e-9:
        reason = f"observed {max(recent):.1f} req/s but at max_rps {planned:g}"
        return DemandState(planned, state.changed_unix, samples, "hold", reason)
    return None


def track(state: DemandState | None, w: Workload, sample: float | None, now: float, cfg: DemandConfig) -> DemandState:
    """The tracker after one heartbeat's `sample` (None: no replica reported a window)."""
    if state is None:
        state = DemandState(planned_rps=w.rate_rps, changed_unix=now)
    samples = state.samples
    if sample is not None and math.isfinite(sample) and sample >= 0:
        samples = samples + ((now, sample),)
    samples = tuple(s for s in samples if s[0] >= now - cfg.window_s)[-MAX_SAMPLES:]
    planned = state.planned_rps
    bounded = rounded(clamp(planned, w))
    if abs(bounded - planned) > 1e-9:
        return DemandState(bounded, now, samples, "bounds", f"planned rate kept within min/max: {bounded:g} req/s")
    if not samples:
        return DemandState(planned, state.changed_unix, samples, "waiting", f"no observations yet; {planned:g} req/s")
    rates = [r for _, r in samples]
    q = quantile(rates, cfg.quantile)
    factor = 1.0 + cfg.headroom
    up = _scale_up(state, w, samples, q, now, cfg)
    if up is not None:
        return up
    target = rounded(clamp(q * factor, w))
    quiet = now - state.changed_unix
    if target < planned * (1.0 - cfg.down_tolerance) and quiet >= cfg.cooldown_s:
        return DemandState(
            target,
            now,
            samples,
            "down",
            f"p{cfg.quantile * 100:g} over {cfg.window_s:g}s is {q:.1f} req/s after a {cfg.cooldown_s:g}s cool-down; "
            f"planning {target:g} req/s",
        )
    detail = f"p{cfg.quantile * 100:g} over {cfg.window_s:g}s {q:.1f} req/s, last {rates[-1]:.1f}; planning {planned:g}"
    if target < planned * (1.0 - cfg.down_tolerance):
        detail += f" (down to {target:g} after the cool-down, {max(0.0, cfg.cooldown_s - quiet):.0f}s left)"
    return DemandState(planned, state.changed_unix, samples, "hold", detail)
