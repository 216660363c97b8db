"""The closed loop, one manager: what the agents observe feeds the model and the plan.

    windows ──> recalibration, demand, guard ──> LoopOutput + stored state ──> reconcile
       ^                                                                         |
       └─────────────────────────────────────────────────────────────────────────┘

`FeedbackLoop` holds the loop's state; its decisions are pure functions
(`controller.guard.step`, `controller.demand.track`, `controller.recalibrate`,
`interference.recalibration.estimate`). The service talks to it in two places:

- `observe(report)`, on every heartbeat: the report's new windows become
  `ObservationRecord`s (`controller.observations`), stored with bounded retention
  and queued for the next tick. It decides nothing; it wakes the reconcile loop
  when a window arrived, so the tick follows at once.
- `step(LoopInput)`, once per reconcile pass, the loop's one entry: the inputs are
  the windows queued since the last tick, the stored state (workloads, profile
  versions) and the `LoopInput` (the applied plan, the nodes' states, the floors
  the last solve could not apply). It runs
  - the guard (`controller.guard`) over each new window, per replica;
  - demand tracking (`controller.demand`) of the auto workloads whose replicas
    reported: a new planned rate is stored (the reconcile pass reads it with
    the workload);
  - recalibration, every `recalibration.interval_s` (`controller.recalibrate`):
    a new profile version is stored and the profile book reloaded;
  - pruning: replicas the applied plan no longer has and that stopped reporting
    are forgotten, with their guard (bounded state);
  and returns a `LoopOutput` (`controller.loop_output`): the share floors the
  solve reads, the loop's alerts, and per workload its `WorkloadFeedback`.

Stored and volatile state: windows, planned rates, profile versions and events
are in SQLite (they survive a restart); guard floors are deliberately in memory
(see `controller.guard`), and so are the calibration points, which are re-read
from the stored windows at start.

Every decision is recorded as an event (SQLite `loop_events`), shown by
`stoke status` and counted in the metrics. Thread-safe: heartbeats come from
the RPC threads, ticks from the reconcile loop.
"""

from __future__ import annotations

import collections
import json
import logging
import math
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, NamedTuple

from controller.config import RecalibrationConfig, ServiceConfig
from controller.demand import DemandState, track
from controller.guard import GuardAction, GuardState, GuardWindow, clear, expire, refuse, step
from controller.loop_output import LoopOutput, NodeState, WorkloadFeedback
from controller.messages import HeartbeatReport, Replica
from controller.observations import ObservationRecord, calibration_points, records_from_report
from controller.profiles import Profiles, read_stored
from controller.recalibrate import (
    Confirmation,
    Move,
    PlacedReplica,
    ServingEstimate,
    SliWindow,
    accuracy_goal_ms,
    crosses,
    factor_move,
    lowered_below_sli,
    nodes_agree,
    p99_moves,
    past_accuracy,
    placed_replicas,
    replica_p99_ms,
    serving_estimate,
    sli_seen_ms,
    with_serving,
)
from controller.reconcile.planning import PlanView
from controller.store import Store
from interference.profile import DeviceProfile
from interference.profile_io import ProfileFileError, profile_to_dict
from interference.recalibration import (
    MAX_POINTS,
    CalibrationPoint,
    Correction,
    RecalibrationOptions,
    apply_corrections,
    estimate,
)

log = logging.getLogger("stoke.controller.feedback")

#: Windows kept in memory per replica (status, metrics, demand); the store keeps the history.
RECENT_WINDOWS = 32
#: Windows per replica averaged into the prediction error ratio.
RATIO_WINDOWS = 5
#: A replica's latest window counts as current for this many heartbeat intervals.
FRESH_INTERVALS = 3.0
#: The first windows of a new Triton process (a move, a restart) say nothing about demand or the SLO: what
#: queued during the switch arrives at once. Demand and the guard skip this many.
SETTLE_WINDOWS = 3
#: Most windows one tick processes (the rest wait for the next tick; bounds a tick's work).
MAX_WINDOWS_PER_TICK = 20000


@dataclass(frozen=True)
class LoopInput:
    """One tick's inputs besides the queued windows and the store."""

    applied: PlanView | None = None
    nodes: tuple[NodeState, ...] = ()
    floors_refused: tuple[tuple[str, str], ...] = ()  # (workload, why) the last solve did not apply


def settling(windows: Iterable[ObservationRecord]) -> bool:
    """Is one of the last `SETTLE_WINDOWS` windows the first of a new process (its window count restarted)?"""
    recent = list(windows)[-(SETTLE_WINDOWS + 1) :]
    return any(b.seq <= a.seq for a, b in zip(recent, recent[1:]))


@dataclass
class _Replica:
    windows: collections.deque[ObservationRecord] = field(
        default_factory=lambda: collections.deque(maxlen=RECENT_WINDOWS)
    )
    guard: GuardState = field(default_factory=GuardState)
    last_seq: int = 0


class FeedbackLoop:
    def __init__(
        self,
        store: Store,
        profiles: Profiles,
        config: ServiceConfig,
        *,
        clock: Callable[[], float],
        wake: Callable[[], None],
        gpu_types_of: Callable[[str], Mapping[int, str]],
    ) -> None:
        self.store = store
        self.profiles = profiles
        self.config = config
        self.clock = clock
        self._wake = wake
        self._gpu_types_of = gpu_types_of
        self._lock = threading.RLock()  # the state heartbeats and views share
        self._step_lock = threading.Lock()  # one tick at a time (the reconcile thread, an apply from the API)
        self._replicas: dict[str, _Replica] = {}
        self._queued: collections.deque[ObservationRecord] = collections.deque()
        self._demand: dict[str, DemandState] = {}
        self._points: dict[tuple[str, str], collections.deque[CalibrationPoint]] = {}
        self._confirm: dict[tuple[str, str], Confirmation] = {}
        self._estimated: dict[tuple[str, str], int] = {}  # the newest window (row id) each pair's estimate saw
        self._last_published: dict[tuple[str, str], float] = {}  # when each pair's last version was published
        self._next_recalibration = 0.0
        self._cause = ""
        self._applied: PlanView | None = None
        #: the applied plan's (p99, share) per replica key: read on every heartbeat, so worked out once per plan
        self._planned: tuple[dict[str, float], dict[str, float]] = ({}, {})
        self._revision = -1  # the applied revision the last tick saw (-1: none yet)
        self._capacity: tuple[NodeState, ...] | None = None  # the nodes' states at the last tick
        self._capacity_changed = -math.inf  # when they last changed (the guard is quiet for a while)
        self._alerts: dict[str, tuple[str, float]] = {}  # key -> (alert, until)
        #: guard moves applied per workload: a counter (stoke_guard_moves_total) outlives the replica that moved
        self._moves: collections.Counter[str] = collections.Counter()
        self._output = LoopOutput()
        self.counters: collections.Counter[str] = collections.Counter()
        r = config.recalibration
        self.options = RecalibrationOptions(
            half_life_s=r.half_life_s,
            min_windows=r.min_windows,
            min_executions=r.min_executions,
            recent_windows=r.recent_windows,
        )
        self._load_points()

    # ------------------------------------------------------------ observe (ingestion only)

    def _load_points(self) -> None:
        """After a restart: the calibration points within the forgetting horizon, from the store."""
        horizon = self.clock() - self.options.max_age_half_lives * self.options.half_life_s
        for record in reversed(self.store.observations(limit=MAX_POINTS, since_unix=horizon)):
            self._add_points(record)

    def _add_points(self, record: ObservationRecord) -> None:
        if record.gpu_type:
            points = self._points.setdefault((record.gpu_type, record.model), collections.deque(maxlen=MAX_POINTS))
            points.extend(calibration_points([record]))

    def observe(self, report: HeartbeatReport) -> list[ObservationRecord]:
        """Store the report's new windows and queue them for the next tick; returns the stored rows."""
        now = self.clock()
        profiles, _ = self.profiles.snapshot()
        versions = {pair: version for pair, (version, _) in self.store.profile_state().items()}
        with self._lock:
            p99 = self._planned[0]
            last_seq = {key: r.last_seq for key, r in self._replicas.items()}
            records = records_from_report(
                report, self._gpu_types_of(report.node_id), profiles, versions, p99, last_seq, now
            )
            if not records:
                return []
            obs = self.config.observations
            stored = self.store.add_observations(records, obs.retention_s, obs.max_rows, now)
            self.counters["observations"] += len(stored)
            for record in stored:
                replica = self._replicas.setdefault(record.key, _Replica())
                replica.last_seq = record.seq
                self._add_points(record)
                if len(self._queued) < MAX_WINDOWS_PER_TICK:
                    self._queued.append(record)
                else:  # a tick that fell far behind: the window stays stored, only the live decisions skip it
                    replica.windows.append(record)
        if stored:
            self._wake()
        return stored

    # ------------------------------------------------------------ the tick

    def step(self, inp: LoopInput) -> LoopOutput:
        """One tick of the loop (see the module docstring); returns what the reconcile step reads."""
        with self._step_lock:
            return self._step(inp)

    def _step(self, inp: LoopInput) -> LoopOutput:
        now = self.clock()
        profiles, _ = self.profiles.snapshot()
        with self._lock:
            self._count_replan(inp.applied)
            if inp.applied is not self._applied:
                self._applied, self._planned = inp.applied, _planned(inp.applied)
            shares = self._planned[1]
            quiet = self._capacity_step(inp.nodes, now)
            for workload, why in inp.floors_refused:
                self._refused(workload, why, now)
            queued = list(self._queued)
            self._queued.clear()
            for record in queued:
                replica = self._replicas.setdefault(record.key, _Replica())
                replica.windows.append(record)
                if self.config.guard.enabled:
                    self._guard(record, replica, shares.get(record.key), profiles, now, quiet)
            for key, replica in self._replicas.items():
                replica.guard, action = expire(replica.guard, key, now, self.config.guard)
                self._report(key, action, now)
            self._track_demand({r.workload for r in queued}, now)
            self._prune(shares, now)
            due = self.config.recalibration.enabled and now >= self._next_recalibration
            if due:
                self._next_recalibration = now + self.config.recalibration.interval_s
            pairs = sorted(self._points) if due else []
        for pair in pairs:
            try:
                self._recalibrate(pair, now)
            except Exception as err:  # noqa: BLE001 - one pair's failure must not stop the others or the loop
                log.warning("recalibration of %s/%s failed: %s", pair[1], pair[0], err)
        with self._lock:
            self._alerts = {k: v for k, v in self._alerts.items() if v[1] > now}
            floors = self._floors(now)
            self._output = LoopOutput(
                floors=tuple(sorted(floors.items())),
                alerts=tuple(text for _, (text, _) in sorted(self._alerts.items())),
                feedback=MappingProxyType(self._workload_feedback(now, floors)),
            )
            return self._output

    @property
    def output(self) -> LoopOutput:
        """The last tick's output."""
        with self._lock:
            return self._output

    def _count_replan(self, applied: PlanView | None) -> None:
        """A new plan revision since the last tick: count it under the cause that woke the loop."""
        revision = applied.revision if applied else 0
        if self._revision >= 0 and revision != self._revision:
            self.counters[f"replans_{self._cause or 'other'}"] += 1
            self._cause = ""
        self._revision = revision

    def _capacity_step(self, nodes: tuple[NodeState, ...], now: float) -> bool:
        """Clear the floors when the nodes' states change (capacity lost or back); True while the guard is quiet:
        a node is not yet judged (unconfirmed: its heartbeats stopped; silent; waiting after a restart), or the
        states changed within the guard's cool-down (a spike then is the incident's, not the survivors')."""
        nodes = tuple(sorted(nodes, key=lambda n: n.node_id))
        if self._capacity is not None and nodes != self._capacity:
            before = {n.node_id: n.state for n in self._capacity}
            changed = [
                f"{n.node_id} {before.get(n.node_id, 'new')} -> {n.state}"
                for n in nodes
                if before.get(n.node_id) != n.state
            ]
            why = (
                f"the capacity changed ({', '.join(changed) or 'a node left'}); floors are re-derived from new windows"
            )
            self._capacity_changed = now
            for key, replica in self._replicas.items():
                replica.guard, action = clear(replica.guard, key, why)
                self._report(key, action, now)
        self._capacity = nodes
        unsettled = any(n.state in ("unconfirmed", "silent", "waiting") for n in nodes)
        return unsettled or now - self._capacity_changed < self.config.guard.cooldown_s

    def _refused(self, workload: str, why: str, now: float) -> None:
        for key, replica in self._replicas.items():
            if Replica.parse(key).workload == workload:
                replica.guard, action = refuse(replica.guard, key, why)
                self._report(key, action, now)

    def _guard(
        self,
        record: ObservationRecord,
        replica: _Replica,
        planned_share: float | None,
        profiles: Mapping[str, DeviceProfile],
        now: float,
        quiet: bool,
    ) -> None:
        profile = profiles.get(record.gpu_type)
        share_step = profile.gpu.share_step_pct if profile else 10.0
        # right after a move the backlog of the switch is no verdict, nor is a spike while the capacity changes
        counted = not quiet and not settling(replica.windows)
        window = GuardWindow(
            record.share_pct, record.requests if counted else 0, record.over_slo, record.p99_ms, record.slo_ms
        )
        before = replica.guard.text
        replica.guard, action = step(
            replica.guard, record.key, window, planned_share, share_step, now, self.config.guard
        )
        if action is not None:
            self._report(record.key, action, now)
        elif replica.guard.text != before and replica.guard.text:
            self._event("guard", record.workload, replica.guard.text, now)

    def _report(self, key: str, action: GuardAction | None, now: float) -> None:
        """An event per guard decision; a move is counted once it serves; a refused floor is also an alert."""
        if action is None:
            return
        workload = Replica.parse(key).workload
        self._event("guard", workload, action.text, now)
        if action.kind == "applied":
            self.counters["guard_moves"] += 1
            self._moves[workload] += 1
        elif action.kind == "refused":
            self.counters["guard_refused"] += 1
            self._alerts[key] = (f"SLO guard: {action.text}", now + self.config.guard.hold_s)
        if action.kind in ("request", "released", "cleared"):
            self._trigger("guard")

    def _prune(self, shares: Mapping[str, float], now: float) -> None:
        """Forget replicas the applied plan no longer has once they stopped reporting (and their floors)."""
        fresh = FRESH_INTERVALS * self.config.heartbeat_interval_s
        for key in [k for k, r in self._replicas.items() if k not in shares]:
            r = self._replicas[key]
            if not r.windows or now - r.windows[-1].unix > fresh:
                del self._replicas[key]
                self._alerts.pop(key, None)

    def _track_demand(self, names: set[str], now: float) -> None:
        """Demand of the auto workloads that reported (`names`); trackers and guard move counts of deleted
        workloads are forgotten."""
        if not names and not self._demand and not self._moves:
            return  # no window to track and nothing to forget: spare reading every workload
        stored = self.store.workloads()
        known = {w.name for w in stored}
        for name in [n for n in self._moves if n not in known]:
            del self._moves[name]
        for name in [n for n in self._demand if n not in {w.name for w in stored if w.rate_auto}]:
            del self._demand[name]  # deleted, or no longer auto
        workloads = {w.name: w for w in stored if w.rate_auto and w.name in names}
        if not workloads:
            return
        for name, w in workloads.items():
            state = self._demand.get(name)
            if (
                state is not None
                and abs(state.planned_rps - w.rate_rps) > 1e-9
                and state.decision not in ("up", "down")
            ):
                state = None  # the workload was applied again with other bounds: start over from the stored rate
            new = track(state, w, self._workload_rate(name, now), now, self.config.demand)
            self._demand[name] = new
            if abs(new.planned_rps - w.rate_rps) > 1e-9:
                if self.store.set_planned_rate(name, new.planned_rps, now):
                    self.counters[f"demand_{new.decision}"] += 1
                    self._event("demand", name, new.text, now)
                    self._trigger("demand")

    def _workload_rate(self, name: str, now: float) -> float | None:
        """The workload's demand in its replicas' latest windows: served rate plus queue growth, summed.

        None (no sample) when no replica reported lately, or while a replica settles on a new Triton
        process (a move): its first windows serve what queued during the switch, not demand."""
        fresh = FRESH_INTERVALS * self.config.heartbeat_interval_s
        rates = []
        for key, replica in self._replicas.items():
            if Replica.parse(key).workload != name or not replica.windows:
                continue
            last = replica.windows[-1]
            if now - last.unix > fresh:
                continue
            if settling(replica.windows):
                return None  # a new process: what queued during the switch is not demand
            before = replica.windows[-2] if len(replica.windows) >= 2 else None
            growth = (last.pending - before.pending) / last.window_s if before is not None else 0.0
            rates.append(max(0.0, last.rate_rps + growth))  # served, plus what queued (or less what drained)
        return sum(rates) if rates else None

    # ------------------------------------------------------------ recalibrate

    def _recalibrate(self, pair: tuple[str, str], now: float) -> None:
        """Per (GPU type, model): the service time from Triton's compute (`estimate`), the serving term from
        the SLI (`serving_estimate`); a version is published when the end-to-end p99 of a placed replica
        moves past the threshold (or, with a new serving term, past the accuracy goal), confirmed, and not
        sooner than `min_interval_s` after the last one unless the SLI is above the active prediction by half
        the threshold (see `controller.recalibrate`)."""
        model, cfg = pair[1], self.config.recalibration
        inputs = self._inputs(pair)
        if inputs is None:
            return
        version, fitted, active, (points, replicas, sli, seen, ratios) = inputs
        current = self._active_factor(pair, version)
        correction = self._service_time(pair, points, fitted, ratios, current, now)
        corrected = _corrected(active, fitted, model, correction)
        threshold_tolerance, tolerance = _serving_tolerances_ms(active, replicas, cfg)
        serving = serving_estimate(
            corrected, model, replicas, sli, min_windows=int(cfg.min_windows), tolerance_ms=tolerance
        )
        if correction is None and not serving.changed:
            self._confirm[pair] = Confirmation()
            return
        # learnt from pooled p99s, the term holds what clients see beyond the windows: beyond_sli_p99_ms is 0
        candidate = with_serving(corrected, model, serving.serving_p99_ms, beyond_sli_ms=serving.beyond_sli_p99_ms)
        moves = p99_moves(active, candidate, replicas)
        # never below what clients see: at the planned load, nor where a queue builds (overloaded windows teach
        # nothing, but they show clients above a lowered prediction)
        windows = (sli, seen)
        if _below_seen(moves, windows, tolerance, candidate.model(model).beyond_sli_p99_ms):
            self._confirm[pair] = Confirmation()
            return
        factor = correction.factor if correction else current
        levels = _levels(active, corrected, model, replicas, correction, serving, cfg.replan_threshold)
        confirmed, why = self._confirmed(pair, moves, serving, current, factor, tolerance, levels)
        # only clients above the prediction by half the threshold skip the interval, not the accuracy goal's
        if not confirmed or not self._due(
            pair, _prediction_below(active, replicas, sli, moves, threshold_tolerance), now
        ):
            return
        agreed = self._confirm[pair].serving_ms - levels.batch_ms if levels.by_pools else serving.serving_p99_ms
        if abs(agreed - serving.serving_p99_ms) > 1e-9:  # an earlier pool's smaller move stands
            moved = factor_move(current, factor)
            least = _least_move(agreed, serving, active, corrected, model, replicas, windows, cfg, tolerance, moved)
            if least is None:  # the count starts over from this pool (kept, its level could block every later one)
                self._confirm[pair] = Confirmation(1, factor, serving.serving_p99_ms + levels.batch_ms, serving.pools)
                return
            candidate, serving, why = least
        self._publish(pair, correction, current, candidate, serving, why, now)

    def _inputs(self, pair: tuple[str, str]) -> tuple[int, DeviceProfile, DeviceProfile, _Evidence] | None:
        """(active version, fitted profile, active profile, `_evidence`) of an unpinned pair whose profiles hold
        the model; None otherwise, or when no window came since the last estimate."""
        gpu_type, model = pair
        state = self.store.profile_state().get(pair, (0, False))
        fitted = self.profiles.fitted().get(gpu_type)
        active = self.profiles.snapshot()[0].get(gpu_type)
        if state[1] or fitted is None or active is None or model not in fitted.models or model not in active.models:
            return None
        evidence = self._evidence(pair)  # None: no new window, it would only repeat (and confirm) itself
        return None if evidence is None else (state[0], fitted, active, evidence)

    def _confirmed(
        self,
        pair: tuple[str, str],
        moves: Sequence[Move],
        serving: ServingEstimate,
        current: float,
        factor: float,
        tolerance: float,
        levels: _Levels,
    ) -> tuple[bool, str]:
        """(has the candidate crossed, and been confirmed by `confirmations` agreeing estimates; why in words).
        A serving term learnt from pools, raised or lowered (`levels.by_pools`), is confirmed only by pools that
        do not overlap (`Confirmation.next`): one stall in one pool must not move it. They are compared as levels
        of what clients see (`_levels`)."""
        cfg = self.config.recalibration
        crossed, why, _ = _crosses(moves, cfg, factor_move(current, factor), serving.changed)
        # a pool is one sample: a term learnt from pools needs a second pool that shares no window with the first
        # (one stalled second sits in every pool for their length)
        by_pools = levels.by_pools
        confirmation = self._confirm.get(pair, Confirmation()).next(
            crossed,
            factor,
            cfg.replan_threshold,
            serving.serving_p99_ms + (levels.batch_ms if by_pools else 0.0),
            tolerance,
            serving.pools if by_pools else (),
            levels.active_ms if by_pools else None,
        )
        self._confirm[pair] = confirmation
        # a term from pools takes two of them that share no window, whatever `confirmations` says
        needed = max(cfg.confirmations, 2) if by_pools else cfg.confirmations
        return confirmation.count >= needed, why

    def _evidence(self, pair: tuple[str, str]) -> _Evidence | None:
        """(calibration points, placed replicas, their SLI windows at the placement and the planned load, the same
        at any load, each node's recent observed/predicted execution times); None when no window arrived since
        the last estimate."""
        gpu_type, model = pair
        cfg = self.config.recalibration
        with self._lock:
            points = list(self._points.get(pair, ()))
            replicas = placed_replicas(self._applied.plan, gpu_type, model) if self._applied else []
            sli = [w for r in replicas for w in self._sli_windows(gpu_type, r)]
            seen = [w for r in replicas for w in self._sli_windows(gpu_type, r, any_load=True)]
            newest = max([points[-1].window if points else 0] + [w.id for r in replicas for w in self._windows(r.key)])
            ratios: dict[str, list[float]] = {}
            for replica in self._replicas.values():
                for w in list(replica.windows)[-cfg.recent_windows :]:
                    if w.model == model and w.gpu_type == gpu_type and w.error_ratio is not None:
                        ratios.setdefault(w.node_id, []).append(w.error_ratio)
            if self._estimated.get(pair) == newest:
                return None
            self._estimated[pair] = newest
        return points, replicas, sli, seen, ratios

    def _sli_windows(self, gpu_type: str, r: PlacedReplica, any_load: bool = False) -> list[SliWindow]:
        """The replica's recent SLI windows that ran its placement at the planned load (call under the lock);
        `any_load`: at any load (what clients see of an overloaded replica is never less than at its plan).

        Two tests, kept apart: a window is *at the plan* when it ran the placement at the planned load; its
        own p99 is read only with `guard.min_requests` requests, but a pool is read when every window it covers
        is at the plan and it holds that many requests (and `POOL_MIN_REQUESTS`), whatever each window and the
        window that carries it hold (that one comes with `counted` False). At 16 req/s in 1 s windows a window
        holds 20 requests about one time in five: requiring them of pooled windows left the CPU demo's pools
        unread, and of the carrier, too few pools to confirm a move within a 40 s run (README, "The closed
        loop")."""
        cfg = self.config.recalibration
        min_requests = self.config.guard.min_requests
        pool_requests = max(min_requests, POOL_MIN_REQUESTS)

        def at_plan(w: ObservationRecord) -> bool:
            # only windows that ran the placement they are compared with (not the one before a move)
            return (
                w.gpu_type == gpu_type
                and abs(w.share_pct - r.placement.share_pct) < 1e-6
                and w.batch == r.placement.batch
                and (any_load or _at_planned_load(w, r.placement.rate_rps))
            )

        settled = _settled(self._windows(r.key))
        since = _runs_since(settled, at_plan)
        out = []
        for w in settled[-cfg.recent_windows :]:
            if w.p99_ms is None or not at_plan(w):
                continue
            # a pool is the clients' p99 only over windows at the plan, at least min_windows of them
            pooled = w.pooled_p99_ms is not None and w.pooled_windows >= cfg.min_windows
            pooled = pooled and w.pooled_count >= pool_requests and w.seq - w.pooled_windows + 1 >= since[w.id]
            counted = w.requests >= min_requests
            if counted or pooled:
                out.append(_sli_window(w, pooled, counted))
        return out

    def _service_time(
        self,
        pair: tuple[str, str],
        points: list[CalibrationPoint],
        fitted: DeviceProfile,
        ratios: Mapping[str, list[float]],
        current: float,
        now: float,
    ) -> Correction | None:
        """The estimator's correction of the service time, if the nodes running the model agree (one vote each)."""
        correction = estimate(points, fitted, pair[1], now, self.options).correction
        if correction is None:
            return None
        agreeing, voters, accepted = nodes_agree(ratios, current, correction.factor)
        if not accepted:
            log.info(
                "%s/%s: x%.3f held: %d of %d node(s) show it", pair[1], pair[0], correction.factor, agreeing, voters
            )
            return None
        return correction

    def _due(self, pair: tuple[str, str], below_sli: bool, now: float) -> bool:
        """Hysteresis in time: a version at most every `min_interval_s`, unless clients see more than predicted."""
        last = self._last_published.get(pair)
        if last is None:  # after a restart: the stored versions say when the last one was published
            created = [v.created_unix for v in self.store.profile_versions(pair[1]) if v.gpu_type == pair[0]]
            last = self._last_published[pair] = max(created, default=-math.inf)
        return below_sli or now - last >= self.config.recalibration.min_interval_s

    def _windows(self, key: str) -> list[ObservationRecord]:
        replica = self._replicas.get(key)
        return list(replica.windows) if replica else []

    def _publish(
        self,
        pair: tuple[str, str],
        c: Correction | None,
        current_factor: float,
        candidate: DeviceProfile,
        serving: ServingEstimate,
        why: str,
        now: float,
    ) -> None:
        """Store the corrected model as the pair's new active version; the next reconcile re-plans."""
        gpu_type, model = pair
        cfg = self.config.recalibration
        hysteresis = _hysteresis_text(cfg)
        service = (
            f"service time {c.summary} from {c.windows:.1f} windows (Triton compute)"
            if c
            else (f"service time x{current_factor:.3f} unchanged")
        )
        reason = f"{service}; {serving.text}; {why}; {hysteresis}"
        meta = {
            "mode": c.mode if c else "serving",
            "factor": c.factor if c else current_factor,
            "factor_constant": c.factor_constant if c else current_factor,
            "windows": c.windows if c else float(serving.windows),
            "executions": c.executions if c else 0.0,
            "points": c.points if c else 0,
            "distinct": c.distinct if c else 0,
            "residual": c.residual if c else 0.0,
            "serving_p99_ms": serving.serving_p99_ms,
            "serving_attribution": serving.attribution,
            "nodes_agreeing": serving.agreeing,
            "nodes": serving.nodes,
            "reason": reason,
        }
        data, refused = _storable(candidate, model, gpu_type)
        if refused:
            self._confirm[pair] = Confirmation()
            self._event("recalibration", "", f"{model} on {gpu_type}: a version was not published: {refused}", now)
            log.error("%s/%s: a version was not published: %s", model, gpu_type, refused)
            return
        version = self.store.add_profile_version(gpu_type, model, data, meta, now)
        self._confirm[pair] = Confirmation()
        self._last_published[pair] = now
        self.profiles.reload()
        self.counters["recalibrations"] += 1
        self._event("recalibration", "", f"{model} on {gpu_type}: profile v{version}: {reason}", now)
        self._trigger("recalibration")

    def _active_factor(self, pair: tuple[str, str], version: int) -> float:
        if not version:
            return 1.0
        for v in self.store.profile_versions(pair[1]):
            if (v.gpu_type, v.version) == (pair[0], version):
                return float(v.meta.get("factor", 1.0))
        return 1.0

    def reset(self, gpu_type: str, model: str) -> None:
        """A rollback or resume: pending confirmations of the pair start over, and so does the interval
        between versions (an operator's decision, not the flip-flop the interval guards against)."""
        with self._lock:
            self._confirm.pop((gpu_type, model), None)
            self._estimated.pop((gpu_type, model), None)
            self._last_published[(gpu_type, model)] = -math.inf

    # ------------------------------------------------------------ what the planner and the views read

    def _floors(self, now: float) -> dict[str, float]:
        """{workload: share floor}: the largest of its replicas' unexpired floors."""
        out: dict[str, float] = {}
        for key, replica in self._replicas.items():
            g = replica.guard
            if g.floor_pct and now < g.floor_until:
                name = Replica.parse(key).workload
                out[name] = max(out.get(name, 0.0), g.floor_pct)
        return out

    def workload_feedback(self) -> dict[str, WorkloadFeedback]:
        """Per workload, as of the last tick: demand, last-window p99, SLO attainment, error ratio, guard."""
        return dict(self.output.feedback)

    def _workload_feedback(self, now: float, floors: Mapping[str, float]) -> dict[str, WorkloadFeedback]:
        fresh = FRESH_INTERVALS * self.config.heartbeat_interval_s
        out: dict[str, WorkloadFeedback] = {}
        by_workload: dict[str, list[tuple[str, _Replica]]] = {}
        for key, replica in self._replicas.items():
            by_workload.setdefault(Replica.parse(key).workload, []).append((key, replica))
        for name in set(by_workload) | set(self._demand) | set(self._moves):
            replicas = by_workload.get(name, [])
            current = [r for _, r in replicas if r.windows and now - r.windows[-1].unix <= fresh]
            p99s = [r.windows[-1].p99_ms for r in current if r.windows[-1].p99_ms is not None]
            observed = predicted = late = counted = 0.0
            for r in current:
                for w in list(r.windows)[-RATIO_WINDOWS:]:
                    n = sum(s.executions for s in w.batch_stats)
                    if w.observed_batch_ms is not None and w.predicted_batch_ms:
                        observed += n * w.observed_batch_ms
                        predicted += n * w.predicted_batch_ms
                    if w.over_slo_ratio is not None and w.requests > 0:
                        late += w.over_slo_ratio * w.requests
                        counted += w.requests
            guards = [r.guard for _, r in sorted(replicas, key=lambda kr: kr[0])]
            demand = self._demand.get(name)
            out[name] = WorkloadFeedback(
                demand=demand.text if demand else "",
                observed_p99_ms=max(p99s) if p99s else None,
                error_ratio=observed / predicted if predicted > 0 else None,
                guard=next((g.text for g in guards if g.text), ""),
                guard_moves=self._moves[name],
                floor_pct=floors.get(name, 0.0),
                within_slo=1.0 - late / counted if counted > 0 else None,
                requests=int(counted),
            )
        return out

    # ------------------------------------------------------------ helpers

    def _trigger(self, cause: str) -> None:
        self._cause = self._cause or cause
        self._wake()

    def _event(self, kind: str, workload: str, text: str, now: float) -> None:
        log.info("%s: %s", kind, text)
        self.store.add_event(kind, workload, text, now)


#: A window is at the plan's operating point when its served rate is within this share above the planned
#: rate, or within `RATE_NOISE_SD` standard deviations of a Poisson count at the planned rate over the window,
#: whichever is wider, and at most `BACKLOG_BATCHES` batches wait at its end.
RATE_TOLERANCE = 0.2
RATE_NOISE_SD = 3.0
BACKLOG_BATCHES = 2
#: A pool is read only over at least this many requests (and `guard.min_requests`): over 20 its p99 is their
#: maximum, which one stalled request sets. Over 100-400 it is their 2nd to 5th largest, so one stalled second
#: still sets it: a move learnt from pools waits for a second pool that shares no window with the first.
POOL_MIN_REQUESTS = 100


def _sli_window(w: ObservationRecord, pooled: bool, counted: bool) -> SliWindow:
    """Window `w` as the serving-path estimate reads it: its pool only where `pooled`, its own p99 only where
    `counted`."""
    assert w.p99_ms is not None
    return SliWindow(
        w.key,
        w.node_id,
        w.p99_ms,
        w.p50_ms,
        w.queue_ms,
        w.compute_ms,
        w.pooled_p99_ms if pooled else None,
        w.pooled_windows if pooled else 0,
        w.pooled_count if pooled else 0,
        w.seq,
        counted,
    )


def _at_planned_load(w: ObservationRecord, planned_rps: float) -> bool:
    """Does the window show the replica at the load it was planned for? An overloaded replica's queue grows
    without bound: its p99 says the rate is wrong (demand tracking's and the guard's business), not that
    the serving path is slow. Learning the serving term from it sent the bench's overloaded workload
    (100 req/s on a plan for 15) pending, and every request failed.

    The bound allows for Poisson noise: at 16 req/s a 1 s window counts over 19.2 (+20%) about one time
    in five, and a pool of 10 windows (read only when all are usable) was then usable one time in eight.
    Within 3 standard deviations (16 + 12 req/s there) an honest window passes 998 times in 1,000;
    100 req/s on a plan for 15 is still overload."""
    noise = RATE_NOISE_SD * math.sqrt(planned_rps / w.window_s) if w.window_s > 0 and planned_rps > 0 else 0.0
    allowed = max(planned_rps * (1.0 + RATE_TOLERANCE), planned_rps + noise)
    return w.rate_rps <= allowed and w.pending <= BACKLOG_BATCHES * max(1, w.batch)


def _settled(windows: Sequence[ObservationRecord]) -> list[ObservationRecord]:
    """The windows outside the first `SETTLE_WINDOWS` of each process (what queued during a switch is no SLI
    of the placement)."""
    out, since = [], SETTLE_WINDOWS
    for before, w in zip([None, *windows], windows):
        since = 0 if before is not None and w.seq <= before.seq else since + 1
        if since >= SETTLE_WINDOWS:
            out.append(w)
    return out


def _runs_since(windows: Sequence[ObservationRecord], at_plan: Callable[[ObservationRecord], bool]) -> dict[int, int]:
    """{id of a window at the plan: the first window number of the run of such windows it ends}. A run is broken
    by a stored window not at the plan, and by a new process (its window numbers restart); a window the node
    never reported (a heartbeat that came late) does not break it. A window's pooled p99 covers its last
    `pooled_windows` window numbers, which must lie within its run."""
    since: dict[int, int] = {}
    start: int | None = None
    last_seq: int | None = None
    for w in windows:
        ok = at_plan(w)
        if not ok or (last_seq is not None and w.seq <= last_seq):
            start = None
        if ok:
            start = w.seq if start is None else start
            since[w.id] = start
        last_seq = w.seq
    return since


def _storable(candidate: DeviceProfile, model: str, gpu_type: str) -> tuple[dict[str, Any], str]:
    """(the model's stored form, why the profile book would refuse to load it, "" when it would not): what it
    refuses is never stored, or the GPU type would plan with its fitted profile."""
    stored = json.loads(json.dumps(profile_to_dict(candidate)))  # as the store gives it back
    try:
        read_stored(stored["gpu"], stored["models"], f"{model} on {gpu_type}")
    except ProfileFileError as err:
        return stored["models"][model], str(err)
    return stored["models"][model], ""


def _hysteresis_text(cfg: RecalibrationConfig) -> str:
    """The hysteresis a version's reason states."""
    goal = f"{cfg.accuracy:.0%} or {cfg.accuracy_ms:g} ms"
    excepted = f" (a serving term past the accuracy goal, {goal}, excepted)" if cfg.refresh_within_accuracy else ""
    return (
        f"hysteresis: moves under {cfg.replan_threshold:.0%} of the SLO ignored{excepted}, {cfg.confirmations} "
        f"agreeing estimates, >= {cfg.min_interval_s:g}s between versions unless the SLI is above the prediction"
    )


def _serving_tolerances_ms(
    active: DeviceProfile, replicas: Sequence[PlacedReplica], cfg: RecalibrationConfig
) -> tuple[float, float]:
    """(half the re-plan threshold of the tightest SLO, the serving term's tolerance): moves are read to half what
    publishes them, so the term's tolerance is the first, or half the accuracy goal of the smallest active
    prediction where that is finer (`refresh_within_accuracy`)."""
    slo = min((r.placement.slo_ms for r in replicas), default=0.0)
    threshold = cfg.replan_threshold * slo / 2.0 if slo else math.inf
    if not cfg.refresh_within_accuracy:
        return threshold, threshold
    predictions = [p for p in (replica_p99_ms(active, r) for r in replicas) if math.isfinite(p)]
    goals = [accuracy_goal_ms(p, cfg.accuracy, cfg.accuracy_ms) / 2.0 for p in predictions]
    return threshold, min([threshold, *goals])


#: What one estimate reads (`FeedbackLoop._evidence`): calibration points, placed replicas, their SLI windows at
#: the plan and at any load, each node's recent observed/predicted execution times.
_Evidence = tuple[list[CalibrationPoint], list[PlacedReplica], list[SliWindow], list[SliWindow], dict[str, list[float]]]


class _Levels(NamedTuple):
    """How an estimate's serving term is confirmed (`FeedbackLoop._confirmed`)."""

    by_pools: bool  # learnt from pools, with no service-time correction that crosses the threshold alone
    batch_ms: float  # the placed replicas' mean batch p99 at the estimate's service time
    active_ms: float  # the active term's level of what clients see: its term (and beyond) plus batch_ms


def _levels(
    active: DeviceProfile,
    corrected: DeviceProfile,
    model: str,
    replicas: Sequence[PlacedReplica],
    correction: Correction | None,
    serving: ServingEstimate,
    threshold: float,
) -> _Levels:
    """Pools are compared as levels of what clients see, the term plus the batch p99 at each estimate's own
    service time, so a term confirmed across a service-time change is read at the new one. A service-time
    correction that crosses the threshold alone has Triton's compute for evidence: no pools to wait for."""
    alone = correction is not None and crosses(p99_moves(active, corrected, replicas), threshold, 0.0)[0]
    batch_ms = _mean_batch_p99_ms(corrected, model, replicas)
    m = active.model(model)
    return _Levels(serving.pooled and not alone, batch_ms, m.serving_p99_ms + m.beyond_sli_p99_ms + batch_ms)


def _least_move(
    term_ms: float,
    serving: ServingEstimate,
    active: DeviceProfile,
    corrected: DeviceProfile,
    model: str,
    replicas: Sequence[PlacedReplica],
    windows: tuple[Sequence[SliWindow], Sequence[SliWindow]],
    cfg: RecalibrationConfig,
    tolerance: float,
    factor_moved: float,
) -> tuple[DeviceProfile, ServingEstimate, str] | None:
    """(candidate, serving estimate, why) with the term an earlier pool's smaller move stands at, checked again
    as a candidate of its own at this service time: it must still cross, and lower no prediction below what
    clients are seen to see (`windows`: at the plan, at any load); None when it does not."""
    candidate = with_serving(corrected, model, term_ms, beyond_sli_ms=serving.beyond_sli_p99_ms)
    moves = p99_moves(active, candidate, replicas)
    crossed, why, _ = _crosses(moves, cfg, factor_moved, True)
    if not crossed or _below_seen(moves, windows, tolerance, candidate.model(model).beyond_sli_p99_ms):
        return None
    text = f"{serving.text}; {term_ms:.2f} ms stands, the least move of the independent pools"
    return candidate, replace(serving, serving_p99_ms=term_ms, text=text), why


def _below_seen(
    moves: Sequence[Move], windows: tuple[Sequence[SliWindow], Sequence[SliWindow]], tolerance: float, beyond: float
) -> bool:
    """Would `moves` lower a prediction below what clients are seen to see (`windows`: at the plan, at any load)?
    `beyond`: the candidate's term beyond the SLI, which the windows do not show (a pooled p99 does)."""
    return any(lowered_below_sli(moves, w, tolerance, beyond) is not None for w in windows)


def _mean_batch_p99_ms(profile: DeviceProfile, model: str, replicas: Sequence[PlacedReplica]) -> float:
    """The mean batch p99 (no serving path) of the placed replicas of `model` with `profile` (0 without any)."""
    without = with_serving(profile, model, 0.0, beyond_sli_ms=0.0)
    values = [v for v in (replica_p99_ms(without, r) for r in replicas) if math.isfinite(v)]
    return sum(values) / len(values) if values else 0.0


def _crosses(
    moves: Sequence[Move], cfg: RecalibrationConfig, factor_moved: float, serving_changed: bool
) -> tuple[bool, str, bool]:
    """(does the candidate publish, why in words, only for the accuracy goal): it crosses the re-plan threshold
    (`crosses`, the largest move), or, with a new serving term, takes a prediction past the accuracy goal under it
    (`refresh_within_accuracy`, the first such move; it re-plans like any version, and the re-plan keeps the
    placements that still hold)."""
    crossed, why = crosses(moves, cfg.replan_threshold, factor_moved)
    if not crossed and serving_changed and cfg.refresh_within_accuracy:
        if (miss := past_accuracy(moves, cfg.accuracy, cfg.accuracy_ms)) is not None:
            goal = f"{cfg.accuracy:.0%} or {cfg.accuracy_ms:g} ms"
            return True, f"{miss}: past the accuracy goal ({goal}), under the re-plan threshold", True
    return crossed, why, False


def _prediction_below(
    active: DeviceProfile,
    replicas: Sequence[PlacedReplica],
    sli: Sequence[SliWindow],
    moves: Sequence[Move],
    tolerance_ms: float,
) -> bool:
    """Do clients see more than the active profile predicts? From the SLI: what a replica's clients are seen to
    see (`sli_seen_ms`: its pooled p99, else the `SERVING_QUANTILE` of its windows' p99s plus the part they do not
    show, `beyond_sli_p99_ms`) above its predicted p99 by more than the tolerance. Without an SLI,
    a candidate that raises a prediction (the service time is longer than the profile says) is the evidence."""
    if not sli:
        return any(m.after_ms > m.before_ms + tolerance_ms for m in moves)
    for r in replicas:
        if r.placement.model not in active.models:
            continue
        seen = sli_seen_ms(sli, r.key, active.model(r.placement.model).beyond_sli_p99_ms)
        if seen is not None and seen > replica_p99_ms(active, r) + tolerance_ms:
            return True
    return False


def _corrected(
    active: DeviceProfile, fitted: DeviceProfile, model: str, correction: Correction | None
) -> DeviceProfile:
    """`active` with `model`'s service time corrected (if any); its serving terms stay the active ones (a
    version learnt from pooled p99s set beyond_sli_p99_ms to 0, which the fit's would bring back)."""
    if correction is None:
        return active
    now_model = active.models[model]
    return with_serving(
        _with_model(active, apply_corrections(fitted, {model: correction}), model),
        model,
        now_model.serving_p99_ms,
        beyond_sli_ms=now_model.beyond_sli_p99_ms,
    )


def _with_model(active: DeviceProfile, corrected: DeviceProfile, model: str) -> DeviceProfile:
    """`active` with `model`'s coefficients taken from `corrected`."""
    models = dict(active.models)
    models[model] = corrected.models[model]
    return DeviceProfile(gpu=active.gpu, models=models)


def _planned(applied: PlanView | None) -> tuple[dict[str, float], dict[str, float]]:
    """The applied plan's p99 and share per replica key."""
    p99: dict[str, float] = {}
    shares: dict[str, float] = {}
    if applied is None:
        return p99, shares
    for p in applied.bound_placements():
        key = str(Replica(p.name, p.replica))
        shares[key] = float(p.share_pct)
        if not math.isnan(p.predicted_p99_ms):
            p99[key] = p.predicted_p99_ms
    return p99, shares
