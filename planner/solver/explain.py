"""Why the stoke strategy gave a workload what it gave it: the candidates around the choice.

Pure: rebuilds the candidate grid of the workload's replicas (`stoke.candidate_grid`) at the
rate each replica serves, and says for each neighbour of the chosen (share, batch, delay) why
it was not taken.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from planner.solver.candidates import EPS, PointCache
from planner.solver.problem import Placement, Plan, Problem, ProblemError
from planner.solver.stoke import (
    DEFAULT_OPTIONS,
    CandidateGrid,
    StokeOptions,
    budget_ms,
    candidate_grid,
    full_gpu_capacity,
)

DELAY_NAMES = {"zero": "0 (greedy)", "fill": "fill time", "paced": "fill + 1/2 interval"}


@dataclass(frozen=True)
class CandidateRow:
    share_pct: float
    batch: int
    delay: str
    queue_delay_ms: float
    p99_ms: float
    utilisation: float
    verdict: str


@dataclass(frozen=True)
class ReplicaExplanation:
    placement: Placement
    gpu_index: int
    rows: tuple[CandidateRow, ...]


@dataclass(frozen=True)
class Explanation:
    workload: str
    summary: tuple[str, ...]
    replicas: tuple[ReplicaExplanation, ...]


def explain(
    problem: Problem,
    plan: Plan,
    name: str,
    options: StokeOptions = DEFAULT_OPTIONS,
    shares_around: int = 2,
    batches_around: int = 2,
) -> Explanation:
    workload = next((w for w in problem.workloads if w.name == name), None)
    if workload is None:
        known = ", ".join(sorted(w.name for w in problem.workloads)[:10])
        raise ProblemError(f"no workload {name!r} in this plan; workloads: {known}")
    placed = [(i, p) for i, p in plan.placements() if p.name == name]
    types = {g.name: g for g in problem.inventory}
    budget = budget_ms(workload, options)
    summary = [
        f"{name}: model {workload.model}, SLO {workload.slo_ms:g} ms, {workload.rate_rps:g} req/s, "
        f"{workload.arrivals} arrivals; p99 budget {budget:.2f} ms (SLO less the "
        f"{options.safety_margin:.0%} safety margin), utilisation cap {options.max_utilisation:g}"
    ]
    replicas = []
    for gpu_index, placement in placed:
        gpu_type = plan.gpus[gpu_index].gpu_type
        cache = PointCache(types[gpu_type])
        grid = candidate_grid(workload, cache, placement.rate_rps, options)
        replicas.append(
            ReplicaExplanation(
                placement, gpu_index, tuple(_rows(grid, cache, placement, shares_around, batches_around))
            )
        )
    if len(placed) > 1:
        cache = PointCache(types[plan.gpus[placed[0][0]].gpu_type])
        capacity = full_gpu_capacity(workload, cache, options)
        if capacity is not None:
            summary.append(
                f"{len(placed)} replicas: one whole {cache.gpu_type.name} holds the budget up to "
                f"{capacity:,.1f} req/s, so {workload.rate_rps:g} req/s needs "
                f"{math.ceil(workload.rate_rps / capacity - 1e-9)}; the rate is split "
                + (
                    "evenly"
                    if len({round(p.rate_rps, 6) for _, p in placed}) == 1
                    else "as whole GPUs plus a remainder"
                )
                + ", whichever needs less GPU in total"
            )
    else:
        summary.append("one replica: a single GPU share holds the budget")
    return Explanation(name, tuple(summary), tuple(replicas))


def _rows(
    grid: CandidateGrid, cache: PointCache, placement: Placement, shares_around: int, batches_around: int
) -> list[CandidateRow]:
    column = int(round(placement.share_pct / cache.step)) - 1
    feasible = grid.feasible
    first_ok = int(feasible.any(axis=(0, 1)).argmax()) if feasible.any() else None
    rows = []
    for c in range(max(0, column - shares_around), min(len(cache.shares), column + 2)):
        for b in range(max(1, placement.batch - batches_around), min(32, placement.batch + batches_around) + 1):
            for m, mode in enumerate(grid.modes):
                p99 = float(grid.p99_ms[m, b - 1, c])
                util = float(grid.utilisation[b - 1, c])
                delay = float(grid.queue_delay_ms[m, b - 1])
                chosen = (
                    b == placement.batch and abs(delay - placement.queue_delay_ms) <= 1e-6 * (1 + delay) and c == column
                )
                rows.append(
                    CandidateRow(
                        float(cache.shares[c]),
                        b,
                        DELAY_NAMES.get(mode, mode),
                        delay,
                        p99,
                        util,
                        _verdict(grid, m, b, c, chosen, first_ok, column),
                    )
                )
    return rows


def _verdict(grid: CandidateGrid, m: int, b: int, c: int, chosen: bool, first_ok: int | None, column: int) -> str:
    p99, util = float(grid.p99_ms[m, b - 1, c]), float(grid.utilisation[b - 1, c])
    if chosen:
        return "chosen"
    if util > grid.max_utilisation + EPS:
        return f"utilisation {util:.2f} over the cap {grid.max_utilisation:g}"
    if not math.isfinite(p99):
        return "queue unstable"
    if p99 > grid.budget_ms + EPS:
        return f"p99 {p99:.2f} ms over the {grid.budget_ms:.2f} ms budget"
    if c < column:
        return "feasible alone; its GPU's neighbours need it to take more"
    if c > column:
        return "feasible, but more GPU than needed"
    if first_ok is not None and column > first_ok:
        return "feasible; batch and delay were picked at the smallest share, before co-location"
    return "feasible, same share; the chosen one is the smallest batch within 2% of the lowest p99"
