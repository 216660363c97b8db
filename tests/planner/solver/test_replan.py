"""The local re-plan (issue 16): after a small change it visits only the GPUs the change reaches, and answers
the plan a full solve answers from the same current plan."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

import planner.solver.replan as replan
from interference.profile_io import bundled_profile
from planner.solver import GpuType, Problem, ProblemError, solve
from planner.solver.random_mix import fleet_workloads
from planner.solver.stoke import SolveMemo

V100 = GpuType("V100", 3.06, bundled_profile())


@pytest.fixture
def local_calls(monkeypatch):
    """How each memo solve's local re-plan went: "local" (it answered), "full" (it declined) or "raised"."""
    calls: list[str] = []
    real = replan.replan_locally

    def counted(*args, **kwargs):
        try:
            plan = real(*args, **kwargs)
        except Exception:
            calls.append("raised")
            raise
        calls.append("full" if plan is None else "local")
        return plan

    monkeypatch.setattr(replan, "replan_locally", counted)
    return calls


def _as_the_controller_gives_it(plan, names, step, rng):
    """`plan` handed back as the controller does: new GPUs keyed by their slot, now and then every GPU an equal
    copy (the solver worker's pipe), the placements of workloads that left taken out."""
    gpus = tuple(g if g.key else replace(g, key=f"slot-{step}-{n}") for n, g in enumerate(plan.gpus))
    if rng.random() < 0.2:
        gpus = tuple(replace(g, placements=tuple(replace(p) for p in g.placements)) for g in gpus)
    if any(p.name not in names for g in gpus for p in g.placements):
        gpus = tuple(replace(g, placements=tuple(p for p in g.placements if p.name in names)) for g in gpus)
        gpus = tuple(g for g in gpus if g.placements)
    return replace(plan, gpus=gpus)


@pytest.mark.parametrize("seed", [3, 8])
def test_small_changes_are_replanned_locally_to_the_plan_a_full_solve_returns(seed, local_calls):
    rng = random.Random(seed)
    workloads = list(fleet_workloads(70, seed=seed))
    memo = SolveMemo()
    plan = solve(Problem(tuple(workloads), (V100,)), "stoke", memo=memo)
    steps = 14
    for step in range(steps):
        k = rng.randrange(len(workloads))
        kind = step % 7
        if kind in (0, 1, 2):  # a rate up or down: replicas come and go
            factor = rng.choice((0.3, 0.6, 1.7, 3.0))
            workloads[k] = replace(workloads[k], rate_rps=round(workloads[k].rate_rps * factor, 1))
        elif kind == 3:  # the SLO guard's floor
            workloads[k] = replace(workloads[k], min_share_pct=rng.choice((0.0, 30.0)))
        elif kind == 4:  # a workload leaves
            del workloads[k]
        elif kind == 5:  # one arrives
            workloads.insert(k, replace(workloads[rng.randrange(len(workloads))], name=f"arrived-{step}"))
        else:  # several at once
            for j in rng.sample(range(len(workloads)), 4):
                workloads[j] = replace(workloads[j], rate_rps=round(workloads[j].rate_rps * 1.4, 1))
        problem = Problem(tuple(workloads), (V100,))
        given = _as_the_controller_gives_it(plan, {w.name for w in workloads}, step, rng)
        plan = solve(problem, "stoke", current=given, memo=memo)
        assert plan == solve(problem, "stoke", current=given), f"step {step}: the local re-plan differs"
    # the first solve had no current plan; every re-plan was local
    assert local_calls == ["local"] * steps


def test_a_lost_gpu_or_other_limits_solve_in_full_and_local_re_plans_resume(local_calls):
    workloads = list(fleet_workloads(50, seed=4))
    memo = SolveMemo()
    plan = solve(Problem(tuple(workloads), (V100,)), "stoke", memo=memo)
    workloads[7] = replace(workloads[7], rate_rps=round(workloads[7].rate_rps * 2.0, 1))
    problem = Problem(tuple(workloads), (V100,))
    lost = replace(plan, gpus=plan.gpus[1:])  # a node went away: its GPU is not in the current plan
    plan = solve(problem, "stoke", current=lost, memo=memo)
    assert plan == solve(problem, "stoke", current=lost)
    # fewer devices of the type than the plan uses
    limited = Problem(tuple(workloads), (replace(V100, max_count=len(plan.gpus) - 1),))
    with pytest.raises(ProblemError):
        solve(limited, "stoke", current=plan, memo=memo)
    workloads[9] = replace(workloads[9], rate_rps=round(workloads[9].rate_rps * 0.5, 1))
    problem = Problem(tuple(workloads), (V100,))
    again = solve(problem, "stoke", current=plan, memo=memo)
    assert again == solve(problem, "stoke", current=plan)
    # the lost GPU and the limit: full solves; after the failed one no packing was left, so a full solve again
    assert local_calls == ["full", "full"] and memo.last is not None
    workloads[11] = replace(workloads[11], rate_rps=round(workloads[11].rate_rps * 1.5, 1))
    problem = Problem(tuple(workloads), (V100,))
    assert solve(problem, "stoke", current=again, memo=memo) == solve(problem, "stoke", current=again)
    assert local_calls[-1] == "local"


def test_a_change_that_fails_midway_leaves_no_half_changed_packing(local_calls):
    """A local re-plan that fails after it began to change the packing (a workload grows past the devices
    there are) must not leave that packing to the next solve."""
    workloads = list(fleet_workloads(40, seed=6))
    memo = SolveMemo()
    plan = solve(Problem(tuple(workloads), (V100,)), "stoke", memo=memo)
    limited = (replace(V100, max_count=len(plan.gpus)),)  # every device in use
    grown = [*workloads]
    grown[3] = replace(grown[3], rate_rps=grown[3].rate_rps * 12)
    with pytest.raises(ProblemError, match="max_count"):
        solve(Problem(tuple(grown), limited), "stoke", current=plan, memo=memo)
    assert local_calls == ["raised"] and memo.last is None  # it failed inside the local re-plan
    workloads[5] = replace(workloads[5], rate_rps=round(workloads[5].rate_rps * 2.5, 1))
    problem = Problem(tuple(workloads), (V100,))
    assert solve(problem, "stoke", current=plan, memo=memo) == solve(problem, "stoke", current=plan)


def test_a_solve_that_spills_onto_another_type_leaves_the_next_to_a_full_solve(local_calls):
    """A replica spilled onto a pricier type (its own at its count limit) is no workload's choice: a full solve
    places it afresh every time, so a local re-plan could not answer as one. With half the V100s the fleet needs,
    every solve spills and none is local; with the limit lifted, the first solve is full and the rest local, and
    every answer is the full solve's."""
    rng = random.Random(2)
    workloads = list(fleet_workloads(40, seed=2))
    used = solve(Problem(tuple(workloads), (V100,)), "stoke").gpu_count
    on_demand = GpuType("V100-on-demand", 4.0, bundled_profile())
    memo = SolveMemo()
    plan = solve(Problem(tuple(workloads), (V100,)), "stoke", memo=memo)
    for step, types in enumerate([(replace(V100, max_count=used // 2), on_demand)] * 4 + [(V100, on_demand)] * 4):
        k = rng.randrange(len(workloads))
        workloads[k] = replace(workloads[k], rate_rps=round(workloads[k].rate_rps * rng.choice((0.6, 1.6)), 1))
        problem = Problem(tuple(workloads), types)
        given = _as_the_controller_gives_it(plan, {w.name for w in workloads}, step, random.Random(step))
        plan = solve(problem, "stoke", current=given, memo=memo)
        assert plan == solve(problem, "stoke", current=given), f"step {step}"
        limited = types[0].max_count is not None
        assert any(g.gpu_type == "V100-on-demand" for g in plan.gpus) == limited  # spilled only while limited
        assert (memo.last is None) == limited
    # limited: never asked (a new GPU type starts the memo afresh, then each solve spilled); lifted: a full
    # solve, then local ones
    assert local_calls == ["local"] * 3


def test_a_local_re_plan_that_spills_answers_as_a_full_solve_and_leaves_the_next_to_one(local_calls):
    workloads = list(fleet_workloads(40, seed=5))
    used = solve(Problem(tuple(workloads), (V100,)), "stoke").gpu_count
    types = (replace(V100, max_count=used + 1), GpuType("V100-on-demand", 4.0, bundled_profile()))  # one to spare
    memo = SolveMemo()
    plan = solve(Problem(tuple(workloads), types), "stoke", memo=memo)
    assert memo.last is not None
    workloads[4] = replace(workloads[4], rate_rps=workloads[4].rate_rps * 6)  # a few GPUs more than one
    problem = Problem(tuple(workloads), types)
    spilled = solve(problem, "stoke", current=plan, memo=memo)
    assert local_calls == ["local"] and spilled == solve(problem, "stoke", current=plan)
    assert any(g.gpu_type == "V100-on-demand" for g in spilled.gpus) and memo.last is None
