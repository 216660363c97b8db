"""Entry point of the solver: pick a strategy and run it."""
from __future__ import annotations

from typing import Callable

from controller.solver.problem import Plan, Problem, ProblemError

STRATEGIES = ("stoke", "igniter", "ffd")


def solve(problem: Problem, strategy: str = "stoke", *, current: Plan | None = None) -> Plan:
    """Solve `problem` with `strategy`.

    `current` (optional) is the plan that runs now; strategies that support
    it (`stoke`) keep its placements where they stay feasible, so an
    unrelated change does not reshuffle GPUs.
    """
    runner = _strategy(strategy)
    return runner(problem, current)


def _strategy(name: str) -> Callable[[Problem, Plan | None], Plan]:
    if name == "igniter":
        from controller.solver.igniter import solve_igniter
        return lambda problem, current: solve_igniter(problem)
    if name == "ffd":
        from controller.solver.ffd import solve_ffd
        return lambda problem, current: solve_ffd(problem)
    if name == "stoke":
        from controller.solver.stoke import solve_stoke
        return solve_stoke
    raise ProblemError(f"unknown strategy {name!r}; choose one of {', '.join(STRATEGIES)}")
