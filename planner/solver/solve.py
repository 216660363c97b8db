"""Entry point of the solver: pick a strategy and run it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from foundation.gc_pause import collection_paused
from planner.solver.problem import Plan, Problem, ProblemError

if TYPE_CHECKING:
    from planner.solver.stoke import SolveMemo, StokeOptions

STRATEGIES = ("stoke", "igniter", "ffd")


def solve(
    problem: Problem,
    strategy: str = "stoke",
    *,
    current: Plan | None = None,
    options: StokeOptions | None = None,
    memo: SolveMemo | None = None,
) -> Plan:
    """Solve `problem` with `strategy`.

    `current` (optional) is the plan that runs now; the `stoke` strategy keeps
    its placements where they stay feasible, so an unrelated change does not
    reshuffle GPUs. `options` tunes the `stoke` strategy (safety margin,
    utilisation cap); the baselines take none. `memo` (a `stoke.SolveMemo` the caller keeps across
    solves) lets the `stoke` strategy re-plan a large fleet after a small change in a fraction of the
    time, with the same answer; the baselines ignore it.
    """
    if strategy not in STRATEGIES:
        raise ProblemError(f"unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")
    if options is not None and strategy != "stoke":
        raise ProblemError(
            f"strategy {strategy!r} takes no options (safety margin, utilisation cap); they tune the stoke strategy"
        )
    # The strategies (numpy) load on first use: STRATEGIES alone is what the CLI's parser needs.
    with collection_paused():  # a solve makes no garbage cycles to speak of: see foundation.gc_pause
        if strategy == "igniter":
            from planner.solver.igniter import solve_igniter

            return solve_igniter(problem)
        if strategy == "ffd":
            from planner.solver.ffd import solve_ffd

            return solve_ffd(problem)
        from planner.solver.stoke import DEFAULT_OPTIONS, solve_stoke

        if memo is not None:
            from planner.solver.replan import solve_remembering

            return solve_remembering(problem, current, options or DEFAULT_OPTIONS, memo)
        return solve_stoke(problem, current, options or DEFAULT_OPTIONS)
