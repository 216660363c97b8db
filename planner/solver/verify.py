"""Verify before serving: measure the points a plan chose, put them in the profile, re-plan until it holds.

The fit is right on average; a plan picks the few points where it is most favourable, which is where
being wrong costs most. So after planning, each chosen (GPU type, model, batch, share) is measured
(`Measure`: real Triton on CPU, the NVML/MPS path on a GPU, the simulated device in tests and
benchmarks): for a Poisson replica every batch size 1..B it runs, since a lightly loaded queue's p99
comes from partial batches and the p99 at the error bound covers them (`PointCache.upper_lines`); for
a paced one B (its batches are all full). With `neighbours` the points around them are measured too:
the same batches one and two share steps lower, and the batch one larger at the chosen share
(`neighbour_points`). The error bound kept the plan from them, and measured they may hold (a measured
point counts as inside the profile's domain, so this may also reach below the fit's smallest share).
The measurement replaces the fitted active time there (`ModelProfile.with_measured`, at
`MEASURED_ERROR` instead of the fit's error bound), and the workloads are planned again. A round after
which the plan's points (and with `neighbours` their neighbours) are all measured ends it: the plan
holds on measured points, and no point beside it is left that a measurement could open. A re-plan may
move a replica to a point not yet measured; that is the next round's work. At most `max_rounds` rounds.

Why two steps and the batch above: with one step lower only, verified plans of the benchmark's
mixes cost 1-3 GPUs more than a planner told the truth everywhere (`bench_truth --variants oracle`);
a replica that a measurement shows faster than the fit can often take a share two steps smaller, or a
batch one larger at the same share, and those points were never measured.

What is measured is the model alone at its batch and share (its solo active time): the co-location
terms (L2, power, scheduling) stay predicted. Pure: the measuring is the caller's callable.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from interference.profile import DeviceProfile
from planner.solver.candidates import MAX_BATCH
from planner.solver.problem import GpuType, Plan, Problem, ProblemError
from planner.solver.solve import solve
from planner.solver.stoke import DEFAULT_OPTIONS, StokeOptions

#: (GPU type, model, batch, share %) -> the model's solo active time there (ms), measured.
Measure = Callable[[str, str, int, float], float]
DEFAULT_ROUNDS = 8


@dataclass(frozen=True)
class Round:
    """One verification round: the points it measured and the plan measured points gave."""

    number: int
    measured: int  # points measured this round
    gpus_before: int
    gpus_after: int
    #: the largest measured/fitted active time among this round's points (1.0: the fit was exact)
    worst_ratio: float


@dataclass(frozen=True)
class Verification:
    plan: Plan
    problem: Problem  # with the measured points in its profiles (re-plans start from it)
    rounds: tuple[Round, ...]
    holds: bool  # the final plan uses measured points only

    @property
    def points(self) -> int:
        return sum(r.measured for r in self.rounds)


def plan_points(plan: Plan) -> set[tuple[str, str, int, float]]:
    """(GPU type, model, batch, share) of every batch size a replica of `plan` runs: its max batch B, and
    for Poisson clients every partial batch 1..B-1 too (a lightly loaded queue's p99 comes from them;
    paced clients' batches are all full)."""
    points: set[tuple[str, str, int, float]] = set()
    for g in plan.gpus:
        for p in g.placements:
            share = round(p.share_pct, 6)
            sizes = range(1, p.batch + 1) if p.arrivals == "poisson" else (p.batch,)
            points.update((g.gpu_type, p.model, k, share) for k in sizes)
    return points


#: Neighbours reach this many share steps below a chosen point.
NEIGHBOUR_STEPS = 2


def neighbour_points(problem: Problem, plan: Plan) -> set[tuple[str, str, int, float]]:
    """The points of `plan_points` one and two share steps lower, and one batch size larger at the same share
    (up to the profile's largest measured batch): the error bound kept the plan from them, and measured they
    may well hold. Not one smaller: a Poisson replica's smaller batches are plan points already, and for a
    paced one it only made re-plans walk sideways between batch sizes of equal cost, a round of measurements
    each."""
    profiles = {g.name: g.profile for g in problem.inventory}
    out: set[tuple[str, str, int, float]] = set()
    for gpu_type, model, batch, share in plan_points(plan):
        step = profiles[gpu_type].gpu.share_step_pct
        for steps in range(1, NEIGHBOUR_STEPS + 1):
            lower = round(share - steps * step, 6)
            if lower > 0:
                out.add((gpu_type, model, batch, lower))
        domain = profiles[gpu_type].model(model).domain
        # no larger than the profile measured: a server may refuse it (Triton's max_batch_size)
        if batch < min(MAX_BATCH, domain.max_batch if domain is not None else MAX_BATCH):
            out.add((gpu_type, model, batch + 1, share))
    return out


def unmeasured(
    problem: Problem, plan: Plan, points: set[tuple[str, str, int, float]] | None = None
) -> list[tuple[str, str, int, float]]:
    """The points of `plan` (default `plan_points`) that `problem`'s profiles have not measured."""
    profiles = {g.name: g.profile for g in problem.inventory}
    return sorted(
        point
        for point in (plan_points(plan) if points is None else points)
        if profiles[point[0]].model(point[1]).measured_ms(point[2], point[3]) is None
    )


def with_measurements(problem: Problem, measured: dict[tuple[str, str], dict[tuple[int, float], float]]) -> Problem:
    """`problem` with measured points put into its GPU types' profiles."""
    inventory = []
    for gpu in problem.inventory:
        profile = gpu.profile
        models = {
            name: m.with_measured(measured[(gpu.name, name)]) if (gpu.name, name) in measured else m
            for name, m in profile.models.items()
        }
        inventory.append(replace(gpu, profile=DeviceProfile(profile.gpu, models)))
    return replace(problem, inventory=tuple(inventory))


def verify(
    problem: Problem,
    measure: Measure,
    *,
    plan: Plan | None = None,
    options: StokeOptions = DEFAULT_OPTIONS,
    max_rounds: int = DEFAULT_ROUNDS,
    progress: Callable[[Round], None] | None = None,
    neighbours: bool = False,
) -> Verification:
    """Measure `plan`'s points (default: plan `problem` first), re-plan, repeat; see the module doc."""
    if not 1 <= max_rounds <= 100:
        raise ProblemError(f"verification rounds must be 1..100, got {max_rounds}")
    current = plan if plan is not None else solve(problem, "stoke", options=options)
    rounds: list[Round] = []
    measured: dict[tuple[str, str], dict[tuple[int, float], float]] = {}
    types: dict[str, GpuType] = {g.name: g for g in problem.inventory}
    for number in range(1, max_rounds + 1):
        wanted = plan_points(current) | (neighbour_points(problem, current) if neighbours else set())
        todo = unmeasured(problem, current, wanted)
        if not todo:
            return Verification(current, problem, tuple(rounds), True)
        worst = 0.0
        for gpu_type, model, batch, share in todo:
            active = float(measure(gpu_type, model, batch, share))
            if not active > 0:
                raise ProblemError(
                    f"measuring {model} at batch {batch}, share {share:g}% on {gpu_type} gave {active!r} ms; "
                    f"check the device and measure again"
                )
            fitted = types[gpu_type].profile.model(model).active_time_ms(batch, share)
            worst = max(worst, active / fitted)
            measured.setdefault((gpu_type, model), {})[(batch, share)] = active
        problem = with_measurements(problem, measured)
        before = current.gpu_count
        current = solve(problem, "stoke", options=options)
        done = Round(number, len(todo), before, current.gpu_count, worst)
        rounds.append(done)
        if progress is not None:
            progress(done)
    return Verification(current, problem, tuple(rounds), not unmeasured(problem, current))
