"""The best-effort rule of the planning step (`controller.reconcile.planning._best_effort`), with a scripted solver."""

from __future__ import annotations

from controller.reconcile.planning import BEST_EFFORT_SLO_FACTORS, BudgetExceeded, _best_effort
from planner.solver import GpuPlan, Placement, Plan, ProblemError, Workload

SERVING = Workload("a", "mlp_small", 10.0, 48.0)
KEPT = Plan(
    strategy="stoke",
    gpus=(GpuPlan("CPU", 0.0, (Placement("a", "mlp_small", 10.0, 48.0, 50.0, 1, 0.0, 1.0, 1000.0),)),),
)


def scripted(outcomes):
    """A solver answering each call with the next outcome (an exception to raise, or None: it solves)."""
    calls = []

    def solves(w):
        calls.append(w.slo_ms)
        outcome = outcomes[len(calls) - 1]
        if outcome is not None:
            raise outcome
        return KEPT

    return solves, calls


def test_a_serving_workload_is_planned_at_the_least_stretch_that_solves():
    solves, calls = scripted([ProblemError("no"), ProblemError("no"), None])
    pending, relaxed = _best_effort([SERVING], [("a", "cannot meet 10 ms")], KEPT, solves)
    assert [w.slo_ms for w in relaxed] == [15.0] and calls == [11.0, 12.5, 15.0]
    assert "keeps serving" in pending[0][1] and "for 15 ms" in pending[0][1]


def test_past_the_last_stretch_it_is_pending_with_the_solver_s_reason():
    solves, calls = scripted([ProblemError("no")] * len(BEST_EFFORT_SLO_FACTORS))
    pending, relaxed = _best_effort([SERVING], [("a", "cannot meet 10 ms")], KEPT, solves)
    assert relaxed == [] and pending == [("a", "cannot meet 10 ms")] and len(calls) == len(BEST_EFFORT_SLO_FACTORS)


def test_a_new_workload_is_not_stretched():
    solves, calls = scripted([None])
    pending, relaxed = _best_effort([SERVING], [("a", "cannot meet 10 ms")], None, solves)
    assert relaxed == [] and calls == [] and pending == [("a", "cannot meet 10 ms")]


def test_no_budget_is_spent_on_a_workload_that_ran_over_it():
    # its own solve ran over the solver's budget: each stretch would cost a budget again (30 s by default)
    solves, calls = scripted([None])
    pending, relaxed = _best_effort([SERVING], [("a", "over budget")], KEPT, solves, frozenset({"a"}))
    assert relaxed == [] and calls == []
    # a stretch that runs over the budget ends the ladder
    solves, calls = scripted([BudgetExceeded("over"), None])
    pending, relaxed = _best_effort([SERVING], [("a", "cannot meet 10 ms")], KEPT, solves)
    assert relaxed == [] and calls == [11.0] and pending == [("a", "cannot meet 10 ms")]


def _bound(view):
    """The workloads with a replica bound to a device."""
    return {p.name for g, b in zip(view.plan.gpus, view.bindings) if b is not None for p in g.placements}


def _cpu_demo_replan(serving_ms, floors=()):
    """The CPU demo's tight case beside product-search on the one 2-core device, planned on the bundled CPU
    profile and applied, then re-planned once mlp_small's serving path is `serving_ms` (with the guard's
    `floors`): (the applied view, the re-planned view), both through the real planning step and solver."""
    from dataclasses import replace

    from controller.config import ServiceConfig
    from controller.reconcile.planning import Observed, plan_observed
    from controller.reconcile.slots import Binding
    from interference.profile import DeviceProfile
    from interference.profile_io import BUNDLED_CPU_PROFILE, bundled_data_dir, load_profile
    from planner.solver import solve

    base = load_profile(bundled_data_dir() / BUNDLED_CPU_PROFILE)
    slow = DeviceProfile(
        base.gpu, {**base.models, "mlp_small": replace(base.models["mlp_small"], serving_p99_ms=serving_ms)}
    )
    gpu_type = base.gpu.name
    slots = (Binding("local", 0, gpu_type),)
    workloads = (
        Workload("thumbnail-filter", "mlp_small", 10.0, 48.0),
        Workload("product-search", "conv_medium", 160.0, 16.0),
    )
    config = ServiceConfig()

    def run(problem, current):
        return solve(problem, config.strategy, current=current)

    first = plan_observed(Observed(workloads, {gpu_type: base}, 1, slots, None), config, run, 0.0)
    applied = replace(first, revision=1)
    view = plan_observed(Observed(workloads, {gpu_type: slow}, 2, slots, applied, floors=floors), config, run, 0.0)
    return applied, view


def test_a_guard_floor_never_takes_the_device_of_a_workload_kept_serving_best_effort():
    """The CPU demo's tight case: its serving path grew past its 10 ms SLO, so it serves best effort (listed as
    pending with the reason, yet placed), and the SLO guard asks for a 100% floor, which leaves no room for its
    neighbour on the one device. The floor is refused: comparing pending names, the plan with the floor (the
    workload unbound) looked no worse than the one without it (the workload listed as degraded), and its
    requests failed."""
    applied, view = _cpu_demo_replan(21.7, floors=(("thumbnail-filter", 100.0),))
    assert _bound(applied) == {"thumbnail-filter", "product-search"}
    assert _bound(view) == {"thumbnail-filter", "product-search"}  # both keep their device
    assert "keeps serving" in dict(view.pending)["thumbnail-filter"]
    assert view.floors_refused and "thumbnail-filter" in view.floors_refused[0][1]


def test_a_workload_kept_serving_best_effort_that_then_needs_a_device_of_its_own_keeps_its_device():
    """Its serving path grows past its SLO (27 ms against 10): planned alone it serves best effort at 30 ms, but
    at 30 ms it no longer fits beside its neighbour on the one device. It is stretched further to fit, not left
    without a device (it was: the stretched set was planned as if devices were unlimited, and 1,126-1,139
    requests of the CPU demo's tight case failed per run)."""
    _, view = _cpu_demo_replan(27.0)
    assert _bound(view) == {"thumbnail-filter", "product-search"}
    [(name, reason)] = view.pending
    assert name == "thumbnail-filter" and "keeps serving" in reason and "10 ms SLO" in reason, reason
    assert {p.slo_ms for g in view.plan.gpus for p in g.placements if p.name == name} == {10.0}  # its real SLO
