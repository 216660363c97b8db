"""Entry point of the solver: pick a strategy and run it."""

from __future__ import annotations

from planner.solver.ffd import solve_ffd
from planner.solver.igniter import solve_igniter
from planner.solver.problem import Plan, Problem, ProblemError
from planner.solver.stoke import DEFAULT_OPTIONS, StokeOptions, solve_stoke

STRATEGIES = ("stoke", "igniter", "ffd")


def solve(
    problem: Problem, strategy: str = "stoke", *, current: Plan | None = None, options: StokeOptions | None = None
) -> Plan:
    """Solve `problem` with `strategy`.

    `current` (optional) is the plan that runs now; the `stoke` strategy keeps
    its placements where they stay feasible, so an unrelated change does not
    reshuffle GPUs. `options` tunes the `stoke` strategy (safety margin,
    utilisation cap); the baselines take none.
    """
    if strategy not in STRATEGIES:
        raise ProblemError(f"unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")
    if options is not None and strategy != "stoke":
        raise ProblemError(
            f"strategy {strategy!r} takes no options (safety margin, utilisation cap); they tune the stoke strategy"
        )
    if strategy == "igniter":
        return solve_igniter(problem)
    if strategy == "ffd":
        return solve_ffd(problem)
    return solve_stoke(problem, current, options or DEFAULT_OPTIONS)
