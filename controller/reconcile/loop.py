"""The reconcile loop: observe -> solve -> diff -> act, and the applied plan it keeps.

One pass (`Reconciler.reconcile`):

- observe: mark silent nodes lost, then read the workloads (store, with the
  rates demand tracking plans for), the active profiles (fitted or
  recalibrated), the healthy device slots (`NodeRegistry`), the applied plan
  and the SLO guard's share floors (`planning.Observed`); a pass whose inputs
  did not change since the last one does nothing;
- solve: `planning.plan_observed`, the pure solve step (the solver is timed
  for the observer);
- diff: the new plan cut per node against the applied cut (`diff.diff_assignments`);
  the same placements, bindings and pending workloads change nothing;
- act: store the new revision (desired state, in SQLite); each node receives
  its assignments with its next heartbeat (agents poll). With verify before
  serving on (`controller.verification`), a plan whose new assignments run at
  points the profile has not measured is held instead (the applied plan keeps
  serving) until their nodes measured them and a pass re-planned on them.

A failed solve is recorded as `last_error` and raised; the next pass solves
again only when an input changes. Each pass reports its duration to the
`Observer` (the Prometheus metrics).

Nothing stored can stop the loop: the solver runs under a time and memory
budget (`controller.reconcile.budget`; a workload it cannot plan within it is
pending with the reason), a stored workload row that no longer passes the
checks is pending with the reason instead of failing every pass, and an
applied plan that cannot be read back at start is set aside (logged, and
`last_error`) and re-planned from the workloads. `planned_at` is the registry's
`returns` count when the last completed pass observed its inputs: a node that
came back after being lost is held until a pass has observed it back (see
`NodeRegistry.awaiting_plan`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

from controller.config import ServiceConfig
from controller.messages import ModelAssignment
from controller.profiles import Profiles
from controller.reconcile.budget import budgeted
from controller.reconcile.diff import NodeChange, diff_assignments
from controller.reconcile.planning import Observed, PlanView, plan_observed
from controller.reconcile.slots import node_assignments
from controller.registry import NodeRegistry
from controller.store import DatabaseError, Store, StoredPlan
from controller.verification import VerifyBeforeServing
from foundation.errors import StokeError
from planner.solver import Plan, Problem, ProblemError, plan_from_dict, plan_to_dict

log = logging.getLogger("stoke.controller.reconcile")

Solver = Callable[..., Plan]


class Observer(Protocol):
    """Receives durations and errors (the Prometheus metrics module implements it)."""

    def solved(self, seconds: float) -> None: ...
    def reconciled(self, seconds: float, error: bool) -> None: ...


class NullObserver:
    def solved(self, seconds: float) -> None:
        pass

    def reconciled(self, seconds: float, error: bool) -> None:
        pass


@dataclass(frozen=True)
class ApplyOutcome:
    plan: PlanView
    changed: bool
    changes: tuple[NodeChange, ...]
    #: verify before serving holds the plan solved (`plan` is the applied one, or the held one at revision 0)
    held: bool = False


def view_of(stored: StoredPlan) -> PlanView:
    plan = plan_from_dict(stored.plan, f"plan revision {stored.revision}")
    return PlanView(stored.revision, plan, stored.bindings, stored.pending, stored.created_unix)


class Reconciler:
    def __init__(
        self,
        store: Store,
        registry: NodeRegistry,
        profiles: Profiles,
        config: ServiceConfig,
        *,
        clock: Callable[[], float],
        solver: Solver,
        observer: Observer | None = None,
        verifier: VerifyBeforeServing | None = None,
    ) -> None:
        self.store = store
        self.verifier = verifier
        #: the SLO guard's share floors, (workload, %) sorted: the closed loop's output (`controller.feedback`)
        self.floors: tuple[tuple[str, float], ...] = ()
        #: (workload, why) floors the last solve could not apply (the loop reports them, counts no move)
        self.floors_refused: tuple[tuple[str, str], ...] = ()
        self.registry = registry
        self.profiles = profiles
        self.config = config
        self.clock = clock
        self.solver = solver
        self._budgeted = budgeted(solver, config.solver_budget_s, config.solver_memory_mib)
        self.observer: Observer = observer or NullObserver()
        self._lock = threading.Lock()  # guards the applied plan and its cut
        self._pass_lock = threading.Lock()  # one pass at a time
        self._last_inputs: Any = None
        self.last_error = ""
        self.planned_at = 0  # `registry.returns` when the last completed pass observed its inputs
        self._applied: PlanView | None = self._read_applied()
        self._cut = node_assignments(self._applied.plan, self._applied.bindings) if self._applied else {}

    def _read_applied(self) -> PlanView | None:
        """The stored applied plan, or None when there is none or it cannot be read (then re-planned)."""
        try:
            stored = self.store.latest_plan()
            return view_of(stored) if stored else None
        except (StokeError, ValueError, TypeError, KeyError) as err:
            self.last_error = (
                f"the stored applied plan cannot be read ({err}); it is set aside and the workloads are planned again"
            )
            log.error("%s", self.last_error)
            return None

    # ------------------------------------------------------------ the applied plan

    @property
    def applied(self) -> PlanView | None:
        with self._lock:
            return self._applied

    def cut(self) -> dict[str, tuple[ModelAssignment, ...]]:
        """The applied plan per node: {node_id: assignments}."""
        with self._lock:
            return dict(self._cut)

    def assigned_to(self, node_id: str) -> tuple[int, tuple[ModelAssignment, ...], int]:
        """(applied revision, the node's assignments, `planned_at`), read together."""
        with self._lock:
            revision = self._applied.revision if self._applied else 0
            return revision, self._cut.get(node_id, ()), self.planned_at

    # ------------------------------------------------------------ one pass

    def observe(self) -> Observed:
        profiles, version = self.profiles.snapshot()
        workloads, rejected = self.store.workload_rows()
        return Observed(
            workloads=workloads,
            profiles=profiles,
            profiles_version=version,
            slots=self.registry.healthy_slots(),
            applied=self.applied,
            rejected=rejected,
            floors=self.floors,
            verification=self.verifier.version if self.verifier is not None else 0,
        )

    def solve(self, observed: Observed | None = None) -> PlanView:
        """The plan for the observed state, not applied (revision 0)."""
        view = plan_observed(observed or self.observe(), self.config, self._run_solver, self.clock())
        self.floors_refused = view.floors_refused
        return view

    def _run_solver(self, problem: Problem, current: Plan | None) -> Plan:
        started = time.perf_counter()
        try:
            return self._budgeted(problem, self.config.strategy, current=current)
        finally:
            self.observer.solved(time.perf_counter() - started)

    def reconcile(
        self, force: bool = False, floors: tuple[tuple[str, float], ...] | None = None
    ) -> ApplyOutcome | None:
        """One observe -> solve -> diff -> act pass, with the closed loop's share `floors` (None: the last ones).
        Returns None when nothing needed doing."""
        with self._pass_lock:
            if floors is not None:
                self.floors = floors
            started = time.perf_counter()
            error = skipped = False
            fingerprint = None
            try:
                self.registry.check_nodes()
                if self.verifier is not None:
                    self.verifier.expire(self.clock())  # a point given up changes the inputs: the plan may serve
                observed_at = self.registry.returns  # read before the slots: a return after it waits a pass
                observed = self.observe()
                fingerprint = observed.fingerprint()
                if not force and fingerprint == self._last_inputs:
                    skipped = True
                    if not self.last_error:  # the applied plan was solved from these same inputs
                        self.planned_at = observed_at
                    return None
                outcome = self._act(self.solve(observed), observed)
                # what was just solved, with the revision it produced (a change meanwhile triggers another pass)
                self._last_inputs = fingerprint[:3] + (outcome.plan.revision,) + fingerprint[4:]
                self.planned_at = observed_at
                self.last_error = ""
                return outcome
            except ProblemError as err:
                error = True
                self.last_error = f"solve failed: {err}"
                self._last_inputs = fingerprint  # re-solve on the next change, not every tick
                raise
            except DatabaseError as err:
                # worded as the store's health check words it: status says one cause, not two in turn
                error = True
                self.last_error = f"store ({err.reason}): {err}"
                raise
            except Exception as err:
                error = True
                self.last_error = f"reconcile failed: {type(err).__name__}: {err}"
                raise
            finally:
                if not skipped:  # passes with nothing to do are not timed
                    self.observer.reconciled(time.perf_counter() - started, error)

    def record_verification_events(self) -> int:
        """Verify before serving's notes (points given up, rounds spent, a failover not held) as events and log
        lines; returns how many."""
        events = self.verifier.drain_events() if self.verifier is not None else []
        for text in events:
            log.warning("%s", text)
            self.store.add_event("verify", "", text[:1000], self.clock())
        return len(events)

    def _act(self, view: PlanView, observed: Observed) -> ApplyOutcome:
        applied = self.applied
        if self.verifier is not None:
            # a failover is never held: the (node, device) slots that serve, and what the nodes report failed
            healthy = {(slot.node_id, slot.device) for slot in observed.slots}
            failed = {node: self.registry.failed_keys(node) for node in self._cut}
            held = self.verifier.gate(view, self._cut, observed.profiles, self.clock(), healthy, failed)
            self.record_verification_events()
            if held:
                return ApplyOutcome(plan=applied or view, changed=False, changes=(), held=True)
        if applied is None and not view.plan.gpus and not view.pending:
            return ApplyOutcome(plan=view, changed=False, changes=())  # nothing to run, nothing to record
        if applied is not None and applied.signature() == view.signature():
            return ApplyOutcome(plan=applied, changed=False, changes=())  # same placements, bindings, pending
        cut = node_assignments(view.plan, view.bindings)
        changes = tuple(c for c in diff_assignments(self._cut, cut) if not c.empty)
        now = self.clock()
        revision = self.store.add_plan(plan_to_dict(view.plan), view.bindings, view.pending, now)
        stored = replace(view, revision=revision, created_unix=now)
        with self._lock:
            self._applied = stored
            self._cut = cut
        return ApplyOutcome(plan=stored, changed=True, changes=changes)
