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
