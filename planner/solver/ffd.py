"""First-fit decreasing: the naive baseline.

Same batches and lower-bound shares as iGniter (half the SLO as the
inference target), packed first-fit in decreasing share order with only
"shares on a GPU <= 100%" as the constraint: no interference check. The plan
then predicts the co-located latencies and lists in `slo_misses` every
workload that the interference model says will miss its SLO or rate.
"""

from __future__ import annotations

from collections.abc import Callable

from planner.solver.candidates import EPS, Item, PointCache, allowed_types, with_replicas
from planner.solver.igniter import _plan, igniter_items
from planner.solver.problem import Plan, Problem, ProblemError, Workload


def solve_ffd(
    problem: Problem,
    items_for: Callable[[Workload, PointCache], list[Item]] = igniter_items,
    strategy: str = "ffd",
) -> Plan:
    """`items_for` chooses each workload's replicas alone (default iGniter's rule; `stoke report` also packs
    the stoke strategy's own choice alone this way, to show what ignoring interference costs)."""
    caches = {g.name: PointCache(g) for g in problem.inventory}
    items: list[tuple[Item, str]] = []
    for workload in problem.workloads:
        gpu_type = min(allowed_types(workload, problem.inventory), key=lambda g: g.price_per_hour).name
        items += [(i, gpu_type) for i in with_replicas(items_for(workload, caches[gpu_type]))]
    items.sort(key=lambda pair: -pair[0].min_share)

    limits = {g.name: g.max_count for g in problem.inventory}
    bins: list[tuple[str, list[Item], list[float]]] = []
    for item, gpu_type in items:
        for bin_type, members, shares in bins:
            if bin_type == gpu_type and sum(shares) + item.min_share <= 100.0 + EPS:
                members.append(item)
                shares.append(item.min_share)
                break
        else:
            limit = limits[gpu_type]
            if limit is not None and sum(1 for b in bins if b[0] == gpu_type) >= limit:
                raise ProblemError(
                    f"the inventory has only {limit} GPUs of type {gpu_type!r}; "
                    f"workload {item.workload.name!r} needs another; raise max_count"
                )
            bins.append((gpu_type, [item], [item.min_share]))
    plan = _plan(strategy, problem, caches, bins)
    if plan.slo_misses:
        plan = _plan(
            strategy,
            problem,
            caches,
            bins,
            notes=(
                f"no interference check: {len(plan.slo_misses)} workload(s) predicted to miss their SLO: "
                + ", ".join(plan.slo_misses),
            ),
        )
    return plan
