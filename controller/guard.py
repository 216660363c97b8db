"""The SLO guard: a replica whose observed p99 stays over its SLO asks for a larger share. Pure.

The slow path (recalibration, then a re-plan) needs evidence; the guard acts on the SLO itself.
`step` sees each new observation window of a replica:

- a window counts when it saw at least `min_requests` requests and ran at the share the plan
  gives the replica (a window during a move says nothing about either share), and not in the
  first windows of a new process, which serve what queued during the switch (`controller.feedback`
  hands those over as windows without requests), nor while the cluster's capacity changes (a
  node silent or lost, or back: `controller.feedback` hands those over as windows without
  requests too: a spike caused by a node loss is no verdict on the survivors);
- it is "over" when its p99 was over the SLO. This is exact from the SLI histogram's bucket at
  the SLO: more than 1% of the window's requests were slower. Without that bucket, the window's
  p99 decides; without an SLI, Triton's mean queue + compute time does (a lower bound of the p99);
- after `windows` consecutive windows over, outside the `cooldown_s` after its last request,
  the guard *requests* a floor: the replica's share plus one step of its GPU type (at most
  100%), held for `hold_s`. The planner gives the workload no smaller share, unless the floor
  would leave a workload unplaced (then the solve drops it and says why: `refuse`);
- the move is *applied*, and counted (`GuardState.moves`, `stoke_guard_moves_total`), only when
  a window shows the replica serving at the floor's share. A floor the solve refused is no
  move: `refuse` clears it and keeps the reason, which the loop reports as an event and an alert
  (so does a floor already applied that a later solve cannot keep: it is not held in name only);
- at 100% there is no larger share; the guard says so and waits (recalibration re-plans);
- `clear` drops a floor when the capacity changes (a node lost or back, see `controller.feedback`):
  the floor was sized for a cluster that is no longer there, and it must never keep a placeable
  workload pending.

Floors are per workload: the largest floor of its replicas (the solver sizes replicas alike).
They live in memory on purpose: a floor is a short reaction to live windows, and a restarted
controller that forgot it re-derives it from the next windows within `windows` heartbeats, while
a stale floor kept across a restart could hold capacity that nothing justifies any more.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

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
    last_move: float = -1e18  # when the last floor was requested
    moves: int = 0  # applied moves: windows showed the replica serving at the floor's share
    text: str = ""
    requested: bool = False  # the floor is asked for but no window showed it serving yet
    from_pct: float = 0.0  # the share the requested move starts from


@dataclass(frozen=True)
class GuardAction:
    """What the guard decided: `kind` is request | applied | released | refused | cleared."""

    kind: str
    floor_pct: float
    text: str


def describe(window: GuardWindow) -> str:
    if window.p99_ms is not None:
        return f"p99 {window.p99_ms:.1f} ms > SLO {window.slo_ms:g} ms"
    return f"latency over the SLO of {window.slo_ms:g} ms"


def expire(state: GuardState, key: str, now: float, cfg: GuardConfig) -> tuple[GuardState, GuardAction | None]:
    """Release the floor once its hold is over."""
    if state.floor_pct and now >= state.floor_until:
        text = f"{key}: floor of {state.floor_pct:g}% released after {cfg.hold_s:g}s"
        return replace(state, floor_pct=0.0, floor_until=0.0, requested=False, text=text), GuardAction(
            "released", 0.0, text
        )
    return state, None


def step(
    state: GuardState | None,
    key: str,
    window: GuardWindow | None,
    planned_share: float | None,
    share_step: float,
    now: float,
    cfg: GuardConfig,
) -> tuple[GuardState, GuardAction | None]:
    """The guard of replica `key` after one window (None: only time passed); returns what it decided."""
    state, released = expire(state or GuardState(), key, now, cfg)
    if window is None:
        return state, released
    if state.requested and window.share_pct >= state.floor_pct - 1e-6:
        text = (
            f"{key}: moved from {state.from_pct:g}% to {window.share_pct:g}% and serving there "
            f"(floor held until {cfg.hold_s:g}s after the request)"
        )
        state = replace(state, requested=False, moves=state.moves + 1, over=0, text=text)
        return state, GuardAction("applied", state.floor_pct, text)
    if window.requests < cfg.min_requests or window.over_slo is None:
        return state, released
    if planned_share is None or abs(window.share_pct - planned_share) > 1e-6:
        return replace(state, over=0), released
    over = state.over + 1 if window.over_slo else 0
    state = replace(state, over=over)
    if over < cfg.windows or now - state.last_move < cfg.cooldown_s or state.requested:
        return state, released
    why = f"{describe(window)} for {over} windows"
    if window.share_pct >= 100.0 - 1e-6:
        text = f"{key}: {why} at 100%: no larger share; waiting for recalibration to re-plan"
        return replace(state, over=0, last_move=now, text=text), None
    floor = min(100.0, round(window.share_pct + share_step, 6))
    text = f"{key}: {why}: asked the planner for {floor:g}% (from {window.share_pct:g}%), held {cfg.hold_s:g}s"
    state = GuardState(0, floor, now + cfg.hold_s, now, state.moves, text, True, window.share_pct)
    return state, GuardAction("request", floor, text)


def refuse(state: GuardState, key: str, reason: str) -> tuple[GuardState, GuardAction | None]:
    """The solve could not apply the floor (`reason`): the floor is dropped. A requested floor is no move; an
    applied one (a later solve, say after a workload was added) stops being one the plan honours."""
    if not state.floor_pct:
        return state, None
    text = f"{key}: floor of {state.floor_pct:g}% not applied: {reason}"
    return replace(state, floor_pct=0.0, floor_until=0.0, requested=False, text=text), GuardAction(
        "refused", state.floor_pct, text
    )


def clear(state: GuardState, key: str, why: str) -> tuple[GuardState, GuardAction | None]:
    """Drop the floor and the count of windows over (the capacity changed: `why`)."""
    if not state.floor_pct and not state.over:
        return state, None
    text = f"{key}: floor of {state.floor_pct:g}% cleared: {why}" if state.floor_pct else ""
    state = replace(state, over=0, floor_pct=0.0, floor_until=0.0, requested=False, text=text or state.text)
    return state, GuardAction("cleared", 0.0, text) if text else None
