"""Why the stoke strategy gave a workload what it gave it: the candidates around the choice.

Pure: rebuilds the candidate grid of the workload's replicas (`stoke.candidate_grid`) at the
rate each replica serves, and says for each neighbour of the chosen (share, batch, delay) why
it was not taken.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from interference.profile import UNMEASURED_ERROR, ModelProfile
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
    error_bound: bool = False  # the rows' p99 and utilisation are at the profile's error bound


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
    cap = options.cap(workload.arrivals)
    summary = [
        f"{name}: model {workload.model}, SLO {workload.slo_ms:g} ms, {workload.rate_rps:g} req/s, "
        f"{workload.arrivals} arrivals; p99 budget {budget:.2f} ms (SLO less the "
        f"{options.safety_margin:.0%} {'jitter' if options.error_bound else 'safety'} margin), utilisation cap {cap:g}"
    ]
    if placed:
        profile = types[plan.gpus[placed[0][0]].gpu_type].profile.model(workload.model)
        domain = profile.domain
        if options.error_bound:
            summary.append(
                "error bound: the budget and the cap are checked with L(k) and O(k) raised to the profile's "
                f"out-of-sample error at each candidate (`stoke profile show`; +{UNMEASURED_ERROR:.0%} at a point it "
                "did not measure), partial batches 1..B on a line at "
                "or above every raised O(k); the plan shows the central p99 beside p99_upper, the binding one"
            )
        else:
            summary.append("error bound off (--no-error-bound): the central fit is trusted")
        if domain is None:
            summary.append("domain: not recorded in this profile (fitted before stoke recorded it): every share counts")
        elif options.extrapolate:
            summary.append(
                f"domain: measured shares {domain.min_share:g}-{domain.shares[-1]:g}%, batches "
                f"{domain.batches[0]}-{domain.max_batch}; outside allowed (--allow-extrapolation) at a widened error"
            )
        else:
            summary.append(
                f"domain: measured shares {domain.min_share:g}-{domain.shares[-1]:g}%, batches "
                f"{domain.batches[0]}-{domain.max_batch}; nothing outside is used (--allow-extrapolation allows it)"
            )
        for gpu_index, p in placed:
            summary.append(_memory_line(problem, plan, gpu_index, p))
        for _, p in placed:
            cache = PointCache(types[plan.gpus[placed[0][0]].gpu_type])
            summary.append(
                f"replica {p.replica + 1}: share {p.share_pct:g}%, batch {p.batch}: error bound "
                f"{cache.fit_error(workload.model, p.batch, p.share_pct):.1%} "
                f"({_measured_words(profile, p.batch, p.share_pct)}); central p99 "
                f"{p.predicted_p99_ms:.2f} ms, upper {p.p99_upper_ms:.2f} ms; binding: {p.binding} "
                f"({_binding_words(p.binding)})"
            )
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
    return Explanation(name, tuple(summary), tuple(replicas), error_bound=options.error_bound)


def _memory_line(problem: Problem, plan: Plan, gpu_index: int, placement: Placement) -> str:
    """Memory and MPS clients on the replica's GPU, and whether either keeps another replica off it."""
    gpu = plan.gpus[gpu_index]
    limits = next(g for g in problem.inventory if g.name == gpu.gpu_type).profile.gpu
    if not limits.memory_mib:
        return f"memory: not recorded for {gpu.gpu_type} (not checked)"
    smallest = min((p.memory_mib for _, p in plan.placements()), default=0.0)
    free = limits.memory_mib - gpu.memory_mib
    line = (
        f"memory: replica {placement.replica + 1} takes {placement.memory_mib:,.0f} MiB; GPU {gpu_index} holds "
        f"{gpu.memory_mib:,.0f} of {limits.memory_mib:,.0f} MiB, {len(gpu.placements)} of {limits.max_clients or '-'} "
        f"MPS clients"
    )
    if free < smallest and gpu.share_pct < 100.0 - EPS:
        line += f"; memory binds: {free:,.0f} MiB free is less than any replica of this plan needs, share or not"
    elif limits.max_clients and len(gpu.placements) >= limits.max_clients:
        line += "; the MPS client limit binds: no further process fits"
    return line


def _measured_words(model: ModelProfile, batch: int, share_pct: float) -> str:
    """Whether the error bound at (batch, share) stands on a measurement, for `--explain`."""
    if model.measured_ms(batch, share_pct) is not None:
        return "measured by verification"
    domain = model.domain
    if domain is not None and batch in domain.batches and any(abs(share_pct - r) < 1e-6 for r in domain.shares):
        return "a point the fit measured"
    return f"not measured: {UNMEASURED_ERROR:.0%} of it for what the measured points cannot show"


def _binding_words(binding: str) -> str:
    return {
        "p99 upper": "the p99 at the error bound would exceed the budget one share step lower",
        "utilisation upper": "the utilisation at the error bound would exceed the cap one share step lower",
        "p99": "the central p99 would exceed the budget one share step lower",
        "utilisation": "the central utilisation would exceed the cap one share step lower",
        "domain": "one share step lower is below the profile's measured shares",
        "interference": "alone one step less would do; its neighbours need the extra",
        "min share": "the smallest share step",
    }.get(binding, binding)


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
    if math.isinf(util):
        return "outside the profile's measured domain"
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
