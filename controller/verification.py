"""Verify before serving, in the running controller: a new assignment's points are measured by its node first.

`stoke profile verify PLAN` measures the points a plan chose and re-plans on them
(`planner.solver.verify`). With `verification.enabled` the controller does the same before a
new or changed assignment serves:

- `VerifyBeforeServing.gate(view, cut, profiles, now, healthy, failed)`: a reconcile pass's new
  plan holds when one of its new or changed assignments runs at a (model, batch, share) point the
  active profile has not measured (every batch 1..B at its share for a Poisson replica, B for a
  paced one, as `verify` does). The plan is then not applied: the applied one keeps serving, and a new workload stays
  pending with the reason. The points are asked of the node the plan binds them to (at most
  `max_points` a round; a point two nodes would run is measured once). A plan that is a failover
  is never held (`failovers`): an applied assignment on a (node, device) slot that left the
  inventory (a lost node, a blocked device; a silent node's slots stay in it, its replicas do not
  move) or that its node reports failed (a failed start; a failed reload keeps serving), and that
  the plan does not keep as it is, wherever its replica lands (another device, another node, or
  dropped by a plan with fewer replicas): nothing serves that replica meanwhile, and a failover
  must not wait for a measurement (all the plan's new points serve unmeasured, noted).
- `requests_for(node_id)`: the heartbeat answer carries them (`MeasureRequest`), in every
  answer until the results are in (level-based: a repeated answer measures nothing twice).
- `take(node_id, points, profiles, now)`: a result counts only for a point asked of that node; a
  solo active time off the fit by more than `FIT_ERRORS` times the fit's error there (at least 2x,
  `MIN_TOLERANCE`) either way is refused and given up (a node that lies or a broken measurement:
  a stored point stands for every node of its GPU type). Accepted points are stored (`Store.add_measured_points`) and
  join the active profiles (`controller.profiles`, `ModelProfile.with_measured`), so the next
  pass re-plans on them; the plan serves once it chooses only measured points. A recalibrated
  version of the model made after a measurement supersedes it (`Store.measured_points`): the
  closed loop saw the model change since, and a measured point would otherwise mask it there.
- Bounds: at most `rounds` re-plans that ask for new points; then the plan serves as it stands.
  A point not measured within `timeout_s` (the node went away, a device hangs; the node
  measures its points one at a time, so each new result from it starts the `timeout_s` of its
  other points again), one its node could not measure, or a refused result is given up: a
  status alert for `NOTE_S`, an event (`drain_events`), not asked again (until the controller
  restarts), and the plan serves without it. Serving the plan unmeasured is the fallback because
  holding it longer would keep a new workload from serving at all, or an old placement that no
  longer fits its workload; the error-aware plan is what serves without verification, so the
  fallback is never worse than verification off. The bound of a hold is in the README.

Restarts: measured points are stored, so a restarted controller asks only for what was not
measured yet; what is held, asked for and given up lives in memory and is rebuilt by the next
passes. Pure apart from its lock: no I/O, time passed in.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from controller import limits
from controller.config import VerificationConfig
from controller.messages import MeasuredPoint, MeasureRequest, ModelAssignment
from controller.reconcile.diff import classify
from controller.reconcile.planning import PlanView
from interference.profile import DeviceProfile

#: A measured solo active time counts only within a factor 1 + tolerance of the fit's, either way, the tolerance
#: `FIT_ERRORS` times the fit's own relative error bound at that point (`ModelProfile.fit_error`), and at least
#: `MIN_TOLERANCE`: 2x either way, since a CPU node measures beside what it serves, on the same cores, and reads
#: high when busy. A result outside is refused (given up, reported): a stored point stands for every node of its
#: GPU type, so one broken node or measurement must not move it far.
FIT_ERRORS = 3.0
MIN_TOLERANCE = 1.0
#: Points given up are remembered (not asked again) up to this many; notes kept for the status alerts.
MAX_GIVEN_UP = 10_000
MAX_NOTES = 10
#: A note (a point given up, rounds spent, a failover not held) stays among the status alerts this long (s).
NOTE_S = 600.0

#: (GPU type, model, batch, share %): one point of a profile.
Point = tuple[str, str, int, float]


@dataclass(frozen=True, order=True)
class Wanted:
    """A point asked of a node's device."""

    node_id: str
    device: int
    gpu_type: str
    model: str
    share_pct: float
    batch: int

    @property
    def point(self) -> Point:
        return (self.gpu_type, self.model, self.batch, self.share_pct)


def _points_of(a: ModelAssignment) -> tuple[str, int, int, float]:
    return (a.model, a.device, a.batch, a.share_pct)


def assignment_points(view: PlanView, cut: Mapping[str, Sequence[ModelAssignment]]) -> dict[Wanted, set[str]]:
    """{point on a node: the workloads it serves} for every batch size of each bound placement of `view` that is
    new or changed against `cut` (the applied plan per node): 1..B for Poisson clients, B for paced ones. A
    change of the queue delay alone asks nothing: the replica serves at the same points already."""
    before = {(node, a.key): a for node, items in cut.items() for a in items}
    out: dict[Wanted, set[str]] = {}
    for gpu, slot in zip(view.plan.gpus, view.bindings):
        if slot is None:
            continue
        for p in gpu.placements:
            a = ModelAssignment.of(p, slot.device)
            old = before.get((slot.node_id, a.key))
            if classify(old, a) == "unchanged":
                continue
            if old is not None and _points_of(old) == _points_of(a):
                continue  # only its queue delay changes: the replica already serves at these points
            share = round(float(p.share_pct), 6)
            sizes = range(1, p.batch + 1) if p.arrivals == "poisson" else (p.batch,)
            for k in sizes:
                out.setdefault(Wanted(slot.node_id, slot.device, gpu.gpu_type, p.model, share, int(k)), set()).add(
                    p.name
                )
    return out


def failovers(
    view: PlanView,
    cut: Mapping[str, Sequence[ModelAssignment]],
    healthy: Collection[tuple[str, int]],
    failed: Mapping[str, Collection[str]] | None = None,
) -> list[str]:
    """The applied replicas (keys) `view` fails over: each applied assignment on a (node, device) slot not in
    `healthy` (a lost node, a blocked device), or one its node reports failed (`failed`: {node: keys}), that
    `view` does not keep unchanged where it is, wherever its key lands (another device of the same node, another
    node, or nowhere: a plan with fewer replicas). Nothing serves such a replica meanwhile, so a plan holding it
    would lengthen an outage."""
    after = {
        (slot.node_id, (a := ModelAssignment.of(p, slot.device)).key): a
        for gpu, slot in zip(view.plan.gpus, view.bindings)
        if slot is not None
        for p in gpu.placements
    }
    failed = failed or {}
    return sorted(
        a.key
        for node, items in cut.items()
        for a in items
        if ((node, a.device) not in healthy or a.key in failed.get(node, ()))
        and classify(a, after.get((node, a.key))) != "unchanged"
    )


def _fitting(order: Sequence[Point], needed: Mapping[Point, tuple[Wanted, set[str]]], most: int) -> list[Point]:
    """The first of `order` a round asks for: at most `most` in all, and per node what one heartbeat answer can
    carry (`limits.MAX_MEASURE_REQUESTS` (model, device, share) groups of `limits.MAX_MEASURE_BATCHES` batch
    sizes); the rest wait for a later round of the same hold (they are asked already, so no round is spent)."""
    chosen: list[Point] = []
    groups: dict[str, dict[tuple[str, int, float], int]] = {}  # node -> {group: batch sizes in it}
    for point in order:
        if len(chosen) >= most:
            break
        w = needed[point][0]
        of_node, group = groups.setdefault(w.node_id, {}), (w.model, w.device, w.share_pct)
        if group not in of_node and len(of_node) >= limits.MAX_MEASURE_REQUESTS:
            continue
        if of_node.get(group, 0) >= limits.MAX_MEASURE_BATCHES:
            continue
        of_node[group] = of_node.get(group, 0) + 1
        chosen.append(point)
    return chosen


class VerifyBeforeServing:
    """What verify before serving holds, asks and gave up (see the module doc)."""

    def __init__(self, config: VerificationConfig) -> None:
        self.config = config
        self._lock = threading.Lock()
        self._wanted: dict[Wanted, float] = {}  # asked of a node -> when first asked
        self._given_up: dict[Point, str] = {}
        self._asked: set[Point] = set()  # every point asked in this hold (new ones start a round)
        self._taken: set[Wanted] = set()  # results taken and not recorded yet (a store that failed)
        self._rounds = 0
        self._holding: dict[str, str] = {}  # workload -> why it waits
        self._notes: collections.deque[tuple[float, str]] = collections.deque(maxlen=MAX_NOTES)  # (when, text)
        self._events: list[str] = []  # notes not yet recorded as events
        #: counts what changes a pass's outcome besides the profiles (a point given up): part of its inputs
        self.version = 0
        #: for the metrics: points stored and given up since the start
        self.counters = {"measured": 0, "given_up": 0}

    @property
    def enabled(self) -> bool:
        return self.config.enabled

    # ------------------------------------------------------------ the reconcile pass

    def gate(
        self,
        view: PlanView,
        cut: Mapping[str, Sequence[ModelAssignment]],
        profiles: Mapping[str, DeviceProfile],
        now: float,
        healthy: Collection[tuple[str, int]] | None = None,
        failed: Mapping[str, Collection[str]] | None = None,
    ) -> bool:
        """True: hold `view` (its new points are being measured); False: it may serve. `healthy`: the (node,
        device) slots that can serve, `failed`: {node: assignment keys it reports failed}: a plan that fails an
        applied replica over serves at once (`failovers`)."""
        if not self.config.enabled:
            return False
        needed: dict[Point, tuple[Wanted, set[str]]] = {}
        points = assignment_points(view, cut)
        changed = {name for names in points.values() for name in names}
        with self._lock:
            given_up = set(self._given_up)
        for w, names in sorted(points.items()):
            profile = profiles.get(w.gpu_type)
            model = profile.models.get(w.model) if profile is not None else None
            if model is None or w.point in given_up or model.measured_ms(w.batch, w.share_pct) is not None:
                continue
            if w.point in needed:  # the same point on another node: measured once
                needed[w.point][1].update(names)
            else:
                needed[w.point] = (w, set(names))
        moved = failovers(view, cut, healthy, failed) if needed and healthy is not None else []
        with self._lock:
            if not needed:
                self._settle()
                return False
            if moved:
                self._note(
                    f"verification: skipped for a plan that fails over {', '.join(moved[:3])}"
                    f"{' and others' if len(moved) > 3 else ''} (off a lost node, a blocked device or a failed "
                    f"start: a failover does not wait); its {len(needed)} new point(s) serve unmeasured",
                    now,
                )
                self._settle()
                return False
            new = set(needed) - self._asked
            if new and self._rounds >= self.config.rounds:
                self._note(
                    f"verification: {len(needed)} point(s) still not measured after {self._rounds} round(s); "
                    f"the plan serves as it stands",
                    now,
                )
                self._settle()
                return False
            if new:
                self._rounds += 1
                self._asked |= new
            # points already asked first (their results may be on the way), then the rest, up to max_points
            order = sorted(needed, key=lambda p: (needed[p][0] not in self._wanted, needed[p][0]))
            chosen = _fitting(order, needed, self.config.max_points)
            self._wanted = {needed[p][0]: self._wanted.get(needed[p][0], now) for p in chosen}
            self._holding = {}
            for point in order:
                w, names = needed[point]
                for name in sorted(names):
                    self._holding.setdefault(
                        name,
                        f"being verified before it serves: {w.model} at {w.share_pct:g}% is measured on "
                        f"{w.node_id} (round {self._rounds} of at most {self.config.rounds})",
                    )
            for name in sorted(changed - set(self._holding)):  # its own points are measured; others' are not
                self._holding[name] = (
                    f"waiting to serve: the new plan is held while {len(self._wanted)} point(s) of other workloads "
                    f"are measured (round {self._rounds} of at most {self.config.rounds})"
                )
            return True

    def _settle(self) -> None:
        self._wanted, self._asked, self._rounds, self._holding = {}, set(), 0, {}

    def expire(self, now: float) -> bool:
        """Give up the points asked longer than `timeout_s` ago; True when any was (the plan may serve now)."""
        with self._lock:
            late = [w for w, since in self._wanted.items() if now - since > self.config.timeout_s]
            for w in late:
                del self._wanted[w]
                self._give_up(w, f"not measured by {w.node_id} within {self.config.timeout_s:g} s", now)
            return bool(late)

    def _give_up(self, w: Wanted, why: str, now: float) -> None:
        if len(self._given_up) >= MAX_GIVEN_UP:
            self._given_up.pop(next(iter(self._given_up)))
        self._given_up[w.point] = why
        self.counters["given_up"] += 1
        self._note(
            f"verification: {w.model} batch {w.batch} at {w.share_pct:g}% on {w.gpu_type} was given up ({why}); "
            f"it serves as planned",
            now,
        )
        self.version += 1

    def _note(self, text: str, now: float) -> None:
        """Something a person should hear of: an alert for `NOTE_S`, and an event (`drain_events`)."""
        self._notes.append((now, text))
        self._events.append(text)
        del self._events[:-MAX_NOTES]

    def drain_events(self) -> list[str]:
        """The notes since the last call (the caller records them as events and logs them)."""
        with self._lock:
            events, self._events = self._events, []
            return events

    # ------------------------------------------------------------ the heartbeat

    def requests_for(self, node_id: str) -> tuple[MeasureRequest, ...]:
        """What `node_id` is asked to measure now, grouped by (model, device, share); `gate` asks no more than
        fits in the bounds (the slices only guard them)."""
        with self._lock:
            groups: dict[tuple[str, int, float], list[int]] = {}
            for w in sorted(self._wanted):
                if w.node_id == node_id:
                    groups.setdefault((w.model, w.device, w.share_pct), []).append(w.batch)
        return tuple(
            MeasureRequest(model, device, share, tuple(batches[: limits.MAX_MEASURE_BATCHES]), self.config.requests)
            for (model, device, share), batches in list(groups.items())[: limits.MAX_MEASURE_REQUESTS]
        )

    def take(
        self, node_id: str, points: Sequence[MeasuredPoint], profiles: Mapping[str, DeviceProfile], now: float
    ) -> list[tuple[str, str, int, float, float, str]]:
        """The points to store, (GPU type, model, batch, share, ms, node), of what `node_id` reports; one it
        could not measure, or refused here, is given up (a note). A result for a point not asked of it is
        ignored (a repeat, or not its to give).
        A point to store stays asked until `recorded` says it is stored: a store that fails loses nothing
        (the node reports it again while it is asked)."""
        with self._lock:
            by_key = {(w.model, w.device, w.share_pct, w.batch): w for w in self._wanted if w.node_id == node_id}
            accepted: list[tuple[str, str, int, float, float, str]] = []
            progressed = False
            for m in points:
                asked = by_key.pop((m.model, m.device, round(float(m.share_pct), 6), m.batch), None)
                if asked is None:
                    continue
                w = asked
                why = m.error and f"{node_id} could not measure it: {m.error}"
                profile = profiles.get(w.gpu_type)
                if not why and (profile is None or w.model not in profile.models):
                    why = f"the profile of {w.model} on {w.gpu_type} is gone"
                elif not why and profile is not None:
                    model = profile.model(w.model)
                    fitted = float(model.active_time_ms(w.batch, w.share_pct))
                    most = 1.0 + max(MIN_TOLERANCE, FIT_ERRORS * float(model.fit_error(w.batch, w.share_pct)))
                    ratio = m.active_ms / fitted if fitted > 0 else float("inf")
                    if not 1.0 / most <= ratio <= most:
                        why = (
                            f"refused the measurement of {node_id}: {m.active_ms:g} ms is {ratio:.3g} x the fit's "
                            f"{fitted:.3g} ms (allowed 1/{most:.3g} to {most:.3g} x: {FIT_ERRORS:g} times the fit's "
                            f"error there, at least {1 + MIN_TOLERANCE:g} x)"
                        )
                if why:
                    del self._wanted[w]
                    self._give_up(w, why, now)
                else:
                    accepted.append((w.gpu_type, w.model, w.batch, w.share_pct, float(m.active_ms), node_id))
                progressed = progressed or w not in self._taken  # a repeat (a store that failed) is no progress
                self._taken.add(w)
            self._taken &= set(self._wanted)
            if progressed:  # it measures one point at a time: its other points' deadlines start again
                for other in self._wanted:
                    if other.node_id == node_id:
                        self._wanted[other] = now
            return accepted

    def recorded(self, points: Sequence[tuple[str, str, int, float, float, str]]) -> None:
        """`points` (as `take` gave them) are stored and in the active profiles: no longer asked. Counts as a
        change of the pass's inputs (`version`), so the next pass re-plans on them even where the profiles'
        own version did not move."""
        done = {(gpu_type, model, batch, share, node) for gpu_type, model, batch, share, _, node in points}
        with self._lock:
            self.counters["measured"] += len(points)
            self.version += 1
            for w in [w for w in self._wanted if (w.gpu_type, w.model, w.batch, w.share_pct, w.node_id) in done]:
                del self._wanted[w]

    # ------------------------------------------------------------ status

    def wanted(self) -> int:
        """Points asked of the nodes now."""
        with self._lock:
            return len(self._wanted)

    def holding(self) -> dict[str, str]:
        """{workload: why it waits} while a plan is held."""
        with self._lock:
            return dict(self._holding)

    def alerts(self, now: float) -> tuple[str, ...]:
        """The current hold, and the notes of the last `NOTE_S` seconds."""
        with self._lock:
            lines = [text for when, text in self._notes if now - when <= NOTE_S]
            if self._holding:
                lines.append(
                    f"verification: a new plan is held while {len(self._wanted)} point(s) are measured "
                    f"(round {self._rounds} of at most {self.config.rounds}); the applied plan keeps serving"
                )
            return tuple(lines)
