"""Entry point of the solver: pick a strategy and run it."""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from controller.solver.problem import Plan, Problem, ProblemError

if TYPE_CHECKING:
    from controller.solver.stoke import StokeOptions

STRATEGIES = ("stoke", "igniter", "ffd")


def solve(problem: Problem, strategy: str = "stoke", *, current: Plan | None = None,
          options: StokeOptions | None = None) -> Plan:
    """Solve `problem` with `strategy`.

    `current` (optional) is the plan that runs now; strategies that support
    it (`stoke`) keep its placements where they stay feasible, so an
    unrelated change does not reshuffle GPUs. `options` tunes the `stoke`
    strategy (safety margin, utilisation cap); the baselines take none.
    """
    if options is not None and strategy != "stoke":
        raise ProblemError(f"strategy {strategy!r} takes no options (safety margin, utilisation cap); "
                           f"they tune the stoke strategy")
    if strategy == "stoke":
        from controller.solver.stoke import DEFAULT_OPTIONS, solve_stoke
        return solve_stoke(problem, current, options or DEFAULT_OPTIONS)
    runner = _strategy(strategy)
    return runner(problem, current)


def _strategy(name: str) -> Callable[[Problem, Plan | None], Plan]:
    if name == "igniter":
        from controller.solver.igniter import solve_igniter
        return lambda problem, current: solve_igniter(problem)
    if name == "ffd":
        from controller.solver.ffd import solve_ffd
        return lambda problem, current: solve_ffd(problem)
    raise ProblemError(f"unknown strategy {name!r}; choose one of {', '.join(STRATEGIES)}")
