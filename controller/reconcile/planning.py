"""The solve step of a reconcile pass: the observed state in, a plan bound to node devices out. Pure.

`plan_observed(observed, config, run_solver, now)`:

0. each workload carries the SLO guard's share floor, if any (`Workload.min_share_pct`);
1. `split_schedulable`: a workload whose GPU type (or any type with its model
   profiled) has no ready device is pending with the reason, and so is a
   stored row that fails today's checks (`Observed.rejected`);
2. `solve_with_fallback`: the solver runs on the inventory of the ready
   devices, asked to keep the applied placements on the healthy slots
   (`current=`). Not enough devices: a workload that serves and would be left
   without a device keeps serving best effort (`_squeezed`), else plan as if
   there were (the GPUs beyond the ready devices stay unbound and their
   workloads pending); a workload
   infeasible on its own, or one the solver cannot plan within its budget
   (`BudgetExceeded`), is pending with the reason and the rest is planned
   (except one that serves: it keeps serving best effort, see `_best_effort`);
3. `bind_plan`: each plan GPU gets a node device (`slots.bind_gpus`, stable),
   keeps the slot as its identity for the next solve, and every workload
   left unplaced is pending with its reason.

`run_solver(problem, current)` is the only way out (the loop times it).
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from controller.config import ServiceConfig
from controller.reconcile.slots import Binding, bind_gpus, slot_key, slot_keys, without_slots
from foundation.gc_pause import collection_paused
from interference.profile import DeviceProfile
from planner.solver import GpuType, Placement, Plan, Problem, ProblemError, Workload, plan_to_dict

RunSolver = Callable[[Problem, "Plan | None"], Plan]
Pending = list[tuple[str, str]]  # (workload, reason)


class BudgetExceeded(ProblemError):
    """The solver did not finish within its time or memory budget (`controller.reconcile.budget`)."""


@dataclass(frozen=True)
class PlanView:
    """A plan with its node bindings: applied (revision >= 1) or a preview (revision 0)."""

    revision: int
    plan: Plan
    bindings: tuple[Binding | None, ...]
    pending: tuple[tuple[str, str], ...]
    created_unix: float
    #: (workload, why): SLO guard floors this solve did not apply (not stored; the closed loop reads it)
    floors_refused: tuple[tuple[str, str], ...] = ()

    def bound_placements(self) -> Iterator[Placement]:
        """The placements on GPUs bound to a node device (what is meant to run)."""
        for gpu, binding in zip(self.plan.gpus, self.bindings):
            if binding is not None:
                yield from gpu.placements

    def to_dict(self) -> dict[str, Any]:
        data = plan_to_dict(self.plan)
        data["revision"] = self.revision
        data["created_unix"] = self.created_unix
        for g, b in zip(data["gpus"], self.bindings):
            g["node_id"] = b.node_id if b else None
            g["device"] = b.device if b else None
        data["pending"] = [{"workload": w, "reason": r} for w, r in self.pending]
        return data

    def signature(self) -> Any:
        """What makes two plans the same for the nodes (notes and strategy text aside)."""
        data = self.to_dict()
        return (data["gpus"], data["pending"])


@dataclass(frozen=True)
class Observed:
    """What one reconcile pass sees: the inputs of a solve."""

    workloads: tuple[Workload, ...]
    profiles: Mapping[str, DeviceProfile]
    profiles_version: int
    slots: tuple[Binding, ...]  # healthy device slots, sorted
    applied: PlanView | None
    rejected: tuple[tuple[str, str], ...] = ()  # stored workload rows that fail the checks: (name, why)
    floors: tuple[tuple[str, float], ...] = ()  # (workload, share floor) the SLO guard holds, sorted
    verification: int = 0  # verify before serving's version: a point given up may let a held plan serve

    def fingerprint(self) -> tuple[Any, ...]:
        """Equal fingerprints, equal plans: a pass whose inputs did not change has nothing to do."""
        applied = self.applied.revision if self.applied else 0
        return (
            self.workloads,
            self.profiles_version,
            self.slots,
            applied,
            self.rejected,
            self.floors,
            self.verification,
        )


def plan_observed(observed: Observed, config: ServiceConfig, run_solver: RunSolver, now: float) -> PlanView:
    """Solve the observed state (see the module docstring); returns a preview (revision 0).

    The SLO guard's floors apply unless they would leave a workload unplaced that the plan places
    without them (one the applied plan places, or one waiting for capacity that came back): then
    the plan is made without them, says so in its notes, and names each refused floor with the
    reason in `floors_refused`. A floor never keeps a placeable workload pending."""
    # a pass over every workload and GPU of the fleet, making no garbage cycles: see foundation.gc_pause
    with collection_paused():
        return _plan_with_floors(observed, config, run_solver, now)


def _plan_with_floors(observed: Observed, config: ServiceConfig, run_solver: RunSolver, now: float) -> PlanView:
    view = _plan_observed(observed, config, run_solver, now, dict(observed.floors))
    if not observed.floors or not view.pending:
        return view
    free = _plan_observed(observed, config, run_solver, now, {})
    displaced = sorted(_left_out(view) - _left_out(free))
    if not displaced:
        return view
    note = f"SLO guard floor(s) not applied: they would displace {', '.join(displaced)}"
    refused = tuple((name, f"it would leave {', '.join(displaced)} unplaced") for name, _ in observed.floors)
    return replace(free, plan=replace(free.plan, notes=(*free.plan.notes, note)), floors_refused=refused)


def _left_out(view: PlanView) -> set[str]:
    """The workloads `view` leaves without a device: a replica on a GPU bound to none, or none placed at all.
    Not every pending one: a workload kept serving best effort is listed with its reason too, and a floor
    must not take its device away."""
    bound: set[str] = set()
    unbound: set[str] = set()
    for g, b in zip(view.plan.gpus, view.bindings):
        (unbound if b is None else bound).update(p.name for p in g.placements)
    return unbound | ({name for name, _ in view.pending} - bound)


def _plan_observed(
    observed: Observed, config: ServiceConfig, run_solver: RunSolver, now: float, floors: Mapping[str, float]
) -> PlanView:
    counts = collections.Counter(s.gpu_type for s in observed.slots)
    usable = {t: p for t, p in observed.profiles.items() if counts.get(t)}
    workloads = [replace(w, min_share_pct=floors[w.name]) if w.name in floors else w for w in observed.workloads]
    schedulable, pending = split_schedulable(workloads, observed.profiles, usable, sorted(counts))
    pending += observed.rejected
    plan = Plan(strategy=config.strategy, gpus=())
    if schedulable:
        inventory = tuple(
            GpuType(name=t, price_per_hour=config.price(t), profile=p, max_count=counts[t])
            for t, p in sorted(usable.items())
        )
        solved, schedulable, infeasible = solve_with_fallback(
            schedulable, inventory, _kept(observed, usable), run_solver
        )
        plan = solved or plan
        pending += infeasible
    return bind_plan(plan, observed, schedulable, pending, now)


def split_schedulable(
    workloads: Sequence[Workload],
    profiles: Mapping[str, DeviceProfile],
    usable: Mapping[str, DeviceProfile],
    ready_types: Sequence[str] = (),
) -> tuple[list[Workload], Pending]:
    """(workloads a ready device can serve, [(workload, why not)] for the rest).

    `ready_types`: the GPU types of the ready devices, profiled or not, so a reason can say which
    types are there and which are profiled when they do not meet (a `gpu_types[].match` that does
    not claim the device, a profile stored under another name)."""
    schedulable, pending = [], []
    servable: set[tuple[str | None, str]] = set()  # (gpu_type, model) pairs found servable: each checked once
    every_type = sorted(usable)
    for w in workloads:
        if (w.gpu_type, w.model) in servable:
            schedulable.append(w)
            continue
        allowed = [w.gpu_type] if w.gpu_type else every_type
        if w.gpu_type and w.gpu_type not in usable:
            pending.append(
                (
                    w.name,
                    f"no ready node has GPU type {w.gpu_type}{_types_seen(ready_types, profiles, w.model)}"
                    if w.gpu_type in profiles
                    else f"GPU type {w.gpu_type} has no profile",
                )
            )
        elif not any(w.model in usable[t].models for t in allowed if t in usable):
            why = (
                f"no ready device of a GPU type profiled for model {w.model}"
                + _types_seen(ready_types, profiles, w.model)
                if ready_types
                else "no ready node"
            )
            pending.append((w.name, why))
        else:
            servable.add((w.gpu_type, w.model))
            schedulable.append(w)
    return schedulable, pending


def _types_seen(ready_types: Sequence[str], profiles: Mapping[str, DeviceProfile], model: str) -> str:
    """ "(ready: CPU; profiled for it: cpu-2core)": what would have to meet, for a pending reason."""
    if not ready_types:
        return ""
    profiled = sorted(t for t, p in profiles.items() if model in p.models)
    return (
        f" (ready devices are of type {', '.join(ready_types)}; {model} is profiled on "
        f"{', '.join(profiled) or 'no GPU type'}: a device's type comes from gpu_types[].match on its name, "
        f"or cpu_gpu_type for CPU devices)"
    )


def _kept(observed: Observed, usable: Mapping[str, DeviceProfile]) -> Plan | None:
    """The applied plan on the healthy slots, each GPU keyed by its slot: what the solver is asked to keep."""
    if observed.applied is None:
        return None
    kept = without_slots(observed.applied.plan, observed.applied.bindings, observed.slots)[0]
    return replace(kept, gpus=tuple(g for g in kept.gpus if g.gpu_type in usable))


def _current(kept: Plan | None, workloads: Sequence[Workload]) -> Plan | None:
    """The kept plan restricted to `workloads`."""
    if kept is None:
        return None
    names = {w.name for w in workloads}
    if {p.name for g in kept.gpus for p in g.placements} <= names:  # the usual case: nothing to take out
        return Plan(strategy=kept.strategy, gpus=tuple(g for g in kept.gpus if g.placements), notes=kept.notes)
    gpus = tuple(
        g
        if all(p.name in names for p in g.placements)
        else replace(g, placements=tuple(p for p in g.placements if p.name in names))
        for g in kept.gpus
    )
    return Plan(strategy=kept.strategy, gpus=tuple(g for g in gpus if g.placements), notes=kept.notes)


def solve_with_fallback(
    workloads: list[Workload], inventory: tuple[GpuType, ...], kept: Plan | None, run_solver: RunSolver
) -> tuple[Plan | None, list[Workload], Pending]:
    """(plan or None, the workloads it was solved for, [(workload, reason)] left pending).

    Not enough devices: solve as if the GPU types had no count limit. A failure together, or a
    solve over its budget (`BudgetExceeded`), is narrowed down: each workload is solved alone,
    and one that fails or runs over the budget alone is pending with the reason; the rest is
    solved together, and if that still runs over the budget, the longest leading run of them
    that solves within it is planned (binary search) and the others are pending. So one bad
    workload never blocks the plan of the others. Raises the solver's ProblemError when the
    workloads are feasible one by one but not together."""

    def run(ws: Sequence[Workload], types: tuple[GpuType, ...]) -> Plan:
        return run_solver(Problem(tuple(ws), types), _current(kept, ws))

    unbounded = tuple(replace(g, max_count=None) for g in inventory)
    types = {True: inventory, False: unbounded}
    solve = lambda ws, bounded, current: run_solver(Problem(tuple(ws), types[bounded]), current)  # noqa: E731

    def fit(ws: Sequence[Workload]) -> tuple[Plan | None, list[Workload], Pending]:
        """`ws` on the ready devices; not enough of them: those that serve keep theirs first (`_squeezed`,
        its reasons with the real SLOs), else as if there were. Raises what the solve without the limit raises."""
        try:
            return run(ws, inventory), list(ws), []
        except BudgetExceeded:
            raise
        except ProblemError:
            plan = run(ws, unbounded)
        return _squeezed(ws, kept, plan, solve, {w.name: w.slo_ms for w in workloads}) or (plan, list(ws), [])

    try:
        return fit(workloads)
    except ProblemError as failure:  # over the budget, or infeasible together
        return _narrowed(workloads, kept, failure, lambda ws: run(ws, unbounded), fit)


def _narrowed(
    workloads: list[Workload],
    kept: Plan | None,
    failure: ProblemError,
    run: Callable[[Sequence[Workload]], Plan],
    fit: Callable[[Sequence[Workload]], tuple[Plan | None, list[Workload], Pending]],
) -> tuple[Plan | None, list[Workload], Pending]:
    """`solve_with_fallback` after a failure together (`run`: without the device limit): each workload alone,
    then the feasible ones together on the ready devices (`fit`), or the longest leading run of them within the
    budget."""
    feasible, infeasible, over_budget = [], [], set()
    for w in workloads:
        try:
            run([w])
            feasible.append(w)
        except ProblemError as err:
            infeasible.append((w.name, str(err)))
            if isinstance(err, BudgetExceeded):
                over_budget.add(w.name)
    if not infeasible and not isinstance(failure, BudgetExceeded):
        raise failure  # feasible one by one, not together
    infeasible, relaxed = _best_effort(workloads, infeasible, kept, lambda w: run([w]), frozenset(over_budget))
    feasible += relaxed
    if not feasible:
        return None, [], infeasible
    try:
        plan, solved, squeezed = fit(feasible)
        # a best-effort workload stretched again to fit the devices: the reason of the last stretch stands
        infeasible = [(n, why) for n, why in infeasible if n not in dict(squeezed)] + squeezed
        return _real_slos(plan, workloads), solved, infeasible
    except BudgetExceeded as over:
        plan, count = _longest_plannable(feasible, run)
        reason = f"not planned together with the {count} workload(s) before it: {over}"
        return _real_slos(plan, workloads), feasible[:count], infeasible + [(w.name, reason) for w in feasible[count:]]


#: How far a serving workload's SLO may be stretched to keep it placed (best effort) once it cannot be
#: promised: past 10x its SLO it is pending, as a new workload would be.
BEST_EFFORT_SLO_FACTORS = (1.1, 1.25, 1.5, 2.0, 3.0, 5.0, 10.0)


def _best_effort(
    workloads: Sequence[Workload],
    infeasible: Pending,
    kept: Plan | None,
    solves: Callable[[Workload], Plan],
    over_budget: frozenset[str] = frozenset(),
) -> tuple[Pending, list[Workload]]:
    """(pending, workloads to plan at a stretched SLO).

    A workload the applied plan serves and that can no longer be planned within its SLO (the closed
    loop learnt a slower serving path, a new profile) keeps serving: dropping it would fail every
    request, where serving it late fails only those over the SLO. It is planned at the least stretch
    of `BEST_EFFORT_SLO_FACTORS` that solves alone, its placements carry its real SLO (the agents'
    SLI and the burn-rate alerts judge it by that), and it stays listed with the reason, so its status
    reads `degraded`. A new workload, or one that cannot be planned at 10x its SLO, stays pending, and so does
    one whose solve ran over the solver's budget (`over_budget`; each stretch would cost a budget again)."""
    serving = {p.name for g in kept.gpus for p in g.placements} if kept is not None else set()
    by_name = {w.name: w for w in workloads}
    pending: Pending = []
    relaxed: list[Workload] = []
    for name, why in infeasible:
        stretched = _least_stretch(by_name[name], solves) if name in serving and name not in over_budget else None
        if stretched is None:
            pending.append((name, why))
            continue
        relaxed.append(stretched)
        pending.append(
            (
                name,
                f"its {by_name[name].slo_ms:g} ms SLO can no longer be promised ({why}); it keeps serving, "
                f"planned best effort for {stretched.slo_ms:g} ms: lower its rate, loosen its SLO or add devices",
            )
        )
    return pending, relaxed


#: At most this many serving workloads are stretched together to fit the ready devices (`_squeezed`): a
#: larger shortfall (a node lost) is not one a stretch makes up, and each try is a solve of the whole fleet.
MAX_SQUEEZED = 16


def _squeezed(
    workloads: Sequence[Workload],
    kept: Plan | None,
    unbounded: Plan,
    solve: Callable[[Sequence[Workload], bool, Plan | None], Plan],
    real_slo: Mapping[str, float],
) -> tuple[Plan | None, list[Workload], Pending] | None:
    """Not enough devices, and a plan without their limit (`unbounded`) puts workloads that serve on a GPU
    the applied plan does not have: they would lose their device (every request failing), maybe to a new
    workload. Instead those that serve are planned first on the ready devices (`solve(ws, True, current)`),
    the left-out ones stretched by the least of `BEST_EFFORT_SLO_FACTORS` that fits if they must be (as
    `_best_effort` does; when none fits, the serving workloads already planned best effort are stretched
    further, then both: one of them can be what leaves no room on the device); then the others are added
    around them without the limit, so a new workload that does not fit waits (unbound, pending). None (plan as
    before) when no serving workload would be left out, when more than `MAX_SQUEEZED` would, or when no stretch
    fits."""
    if kept is None:
        return None
    serving = {p.name for g in kept.gpus for p in g.placements}
    kept_keys = {g.key for g in kept.gpus if g.key}
    left_out = {p.name for g in unbounded.gpus if g.key not in kept_keys for p in g.placements if p.name in serving}
    if not left_out or len(left_out) > MAX_SQUEEZED:
        return None
    current = _current(kept, [w for w in workloads if w.name in serving])
    # Those left out are stretched first. When no stretch of theirs fits, a workload already served best effort
    # may be what holds the device (its stretched p99 leaves no room for a neighbour's interference): it is
    # stretched further instead, then with them.
    best_effort = {w.name for w in workloads if w.name in serving and w.slo_ms != real_slo.get(w.name, w.slo_ms)}
    rounds = [left_out]
    if best_effort - left_out and len(best_effort | left_out) <= MAX_SQUEEZED:
        rounds += [best_effort, left_out | best_effort]
    for widened in rounds:
        factors = (1.0, *BEST_EFFORT_SLO_FACTORS) if widened is left_out else BEST_EFFORT_SLO_FACTORS
        fitted, outcome = _stretched_to_fit(workloads, serving, widened, factors, current, solve, real_slo)
        if fitted:
            return outcome
    return None


def _stretched_to_fit(
    workloads: Sequence[Workload],
    serving: set[str],
    widened: set[str],
    factors: Sequence[float],
    current: Plan | None,
    solve: Callable[[Sequence[Workload], bool, Plan | None], Plan],
    real_slo: Mapping[str, float],
) -> tuple[bool, tuple[Plan | None, list[Workload], Pending] | None]:
    """`_squeezed`'s tries with the SLOs of `widened` stretched by each of `factors` in turn: (True, its answer,
    None to plan as before) once one settles it, (False, None) when no stretch fits."""
    for factor in factors:
        stretched = [
            replace(w, slo_ms=round(w.slo_ms * factor, 3)) if w.name in widened and factor > 1.0 else w
            for w in workloads
        ]
        served = [w for w in stretched if w.name in serving]
        try:
            first = solve(served, True, current)
        except BudgetExceeded:  # a stretch will not make it faster
            return True, None
        except ProblemError:
            continue
        try:
            plan = solve(stretched, False, first) if len(served) < len(stretched) else first
        except ProblemError:  # the others cannot be added (over the budget): plan as before
            return True, None
        pending = [
            (
                w.name,
                f"the ready devices cannot hold it at its {real_slo.get(w.name, w.slo_ms):g} ms SLO together "
                f"with the others; it keeps serving, planned best effort for {s.slo_ms:g} ms: add devices, "
                "lower its rate or loosen its SLO",
            )
            for w, s in zip(workloads, stretched)
            if w.name in widened and factor > 1.0
        ]
        return True, (_real_slos(plan, workloads), stretched, pending)
    return False, None


def _least_stretch(w: Workload, solves: Callable[[Workload], Plan]) -> Workload | None:
    for factor in BEST_EFFORT_SLO_FACTORS:
        try:
            stretched = replace(w, slo_ms=round(w.slo_ms * factor, 3))
            solves(stretched)
            return stretched
        except BudgetExceeded:  # a stretch will not make it faster: no budget spent on the rest
            return None
        except ProblemError:  # still infeasible, or past the SLO bound
            continue
    return None


def _real_slos(plan: Plan | None, workloads: Sequence[Workload]) -> Plan | None:
    """`plan` with every placement carrying its workload's own SLO (best-effort ones were solved stretched)."""
    if plan is None:
        return None
    slo = {w.name: w.slo_ms for w in workloads}
    if all(p.slo_ms == slo[p.name] for g in plan.gpus for p in g.placements):
        return plan
    gpus = tuple(replace(g, placements=tuple(replace(p, slo_ms=slo[p.name]) for p in g.placements)) for g in plan.gpus)
    return replace(plan, gpus=gpus)


def _longest_plannable(workloads: list[Workload], run: Callable[[Sequence[Workload]], Plan]) -> tuple[Plan | None, int]:
    """(plan, n): the longest leading run `workloads[:n]` that solves (within the budget), by binary search;
    the whole list is known not to."""
    plan, lo, hi = None, 0, len(workloads)  # workloads[:lo] solves, workloads[:hi] does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        try:
            plan, lo = run(workloads[:mid]), mid
        except ProblemError:
            hi = mid
    return plan, lo


def bind_plan(
    plan: Plan, observed: Observed, schedulable: Sequence[Workload], pending: Pending, now: float
) -> PlanView:
    """Bind the plan's GPUs to slots (stable), key each GPU by its slot, and name every unplaced workload."""
    applied = observed.applied
    bindings = bind_gpus(
        plan, observed.slots, lambda wanted: slot_keys(applied.plan, applied.bindings, wanted) if applied else {}
    )
    # a GPU's identity is its slot: stored plans carry it, the next solve keeps it
    keys = [slot_key(b) if b else None for b in bindings]
    plan = replace(plan, gpus=tuple(g if g.key == k else replace(g, key=k) for g, k in zip(plan.gpus, keys)))
    pending = list(pending)
    placed = {p.name for g, b in zip(plan.gpus, bindings) if b is not None for p in g.placements}
    for g, b in zip(plan.gpus, bindings):
        if b is None:
            pending += [(p.name, f"no free {g.gpu_type} device on the ready nodes") for p in g.placements]
    named = {name for name, _ in pending}
    for w in schedulable:
        if w.name not in placed and w.name not in named:
            pending.append((w.name, "the solver did not place it: " + ("; ".join(plan.notes) or "no reason given")))
    return PlanView(revision=0, plan=plan, bindings=bindings, pending=tuple(sorted(set(pending))), created_unix=now)
