"""The SLO guard: a replica whose observed p99 stays over its SLO moves to a larger share. Pure.

The slow path (recalibration, then a re-plan) needs evidence; the guard acts on the SLO itself.
`step` sees each new observation window of a replica:

- a window counts when it saw at least `min_requests` requests and ran at the share the plan
  gives the replica (a window during a move says nothing about either share), and not in the
  first windows of a new process, which serve what queued during the switch (`controller.feedback`
  hands those over as windows without requests);
- it is "over" when its p99 was over the SLO. This is exact from the SLI histogram's bucket at
  the SLO: more than 1% of the window's requests were slower. Without that bucket, the window's
  p99 decides; without an SLI, Triton's mean queue + compute time does (a lower bound of the p99);
- after `windows` consecutive windows over, outside the `cooldown_s` after its last move, the
  replica's share gets a floor of its share plus one step of its GPU type (at most 100%). The
  floor holds for `hold_s`: the planner gives the workload no smaller share. The plan's next
  feasible configuration follows: the larger share where the device has room, else another
  device. The agent starts the new Triton process at the new share, pre-warms it, switches
  traffic once it is ready, then drains and stops the old one;
- at 100% there is no larger share; the guard says so and waits (recalibration re-plans).

Floors are per workload: the largest floor of its replicas (the solver sizes replicas alike).
"""

from __future__ import annotations

from dataclasses import dataclass

from controller.config import GuardConfig


@dataclass(frozen=True)
class GuardWindow:
    """What the guard needs of one observation window."""

    share_pct: float
    requests: int
    over_slo: bool | None  # None: the window tells nothing about latency
    p99_ms: float | None
    slo_ms: float


@dataclass(frozen=True)
class GuardState:
    """One replica's guard."""

    over: int = 0  # consecutive counted windows over the SLO
    floor_pct: float = 0.0  # 0: no floor
    floor_until: float = 0.0
    last_move: float = -1e18
    moves: int = 0
    text: str = ""


@dataclass(frozen=True)
class GuardAction:
    """A move the guard decided: the replica's new share floor, and why."""

    floor_pct: float
    text: str


def describe(window: GuardWindow) -> str:
    if window.p99_ms is not None:
        return f"p99 {window.p99_ms:.1f} ms > SLO {window.slo_ms:g} ms"
    return f"latency over the SLO of {window.slo_ms:g} ms"


def step(
    state: GuardState | None,
    key: str,
    window: GuardWindow | None,
    planned_share: float | None,
    share_step: float,
    now: float,
    cfg: GuardConfig,
) -> tuple[GuardState, GuardAction | None]:
    """The guard of replica `key` after one window (None: only time passed); returns a move, if any."""
    state = state or GuardState()
    if state.floor_pct and now >= state.floor_until:
        state = GuardState(state.over, 0.0, 0.0, state.last_move, state.moves, f"floor released after {cfg.hold_s:g}s")
    if window is None or window.requests < cfg.min_requests or window.over_slo is None:
        return state, None
    if planned_share is None or abs(window.share_pct - planned_share) > 1e-6:
        return GuardState(0, state.floor_pct, state.floor_until, state.last_move, state.moves, state.text), None
    over = state.over + 1 if window.over_slo else 0
    state = GuardState(over, state.floor_pct, state.floor_until, state.last_move, state.moves, state.text)
    if over < cfg.windows or now - state.last_move < cfg.cooldown_s:
        return state, None
    why = f"{describe(window)} for {over} windows"
    if window.share_pct >= 100.0 - 1e-6:
        text = f"{key}: {why} at 100%: no larger share; waiting for recalibration to re-plan"
        return GuardState(0, state.floor_pct, state.floor_until, now, state.moves, text), None
    floor = min(100.0, round(window.share_pct + share_step, 6))
    text = f"{key}: {why}: moved from {window.share_pct:g}% to {floor:g}% (floor held {cfg.hold_s:g}s)"
    return GuardState(0, floor, now + cfg.hold_s, now, state.moves + 1, text), GuardAction(floor, text)
