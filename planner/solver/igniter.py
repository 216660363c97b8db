"""The published iGniter heuristic, faithful, with its known flaws fixed.

Formulation (inference-model.md): each workload gets half its SLO, T/2, as
the inference-latency target (the other half is left for the batch to fill).
Batch b = smallest b with b*(1/R + d_in/B) >= T/2. Lower-bound share = the
smallest share on the step grid meeting T/2 alone. Workloads too big for one
GPU get dedicated whole GPUs first (capacity 0.9 x throughput at 100%).
Then, in decreasing lower-bound order, each workload is tried on every open
GPU: add it, and while shares sum to <= 100, add one step to each co-located
workload that misses its target; the added shares are the interference cost;
the cheapest GPU wins, else a new GPU is opened.

Fixes over the published code: the plan keeps the real SLO; a workload on a
new GPU is checked (and raised) too; throughput >= rate is part of every
check; nothing is ever placed above 100% (too-big workloads are split, and
a workload whose model cannot reach T/2 even alone is rejected).
"""

from __future__ import annotations

import math

from planner.bounds import MAX_REPLICAS
from planner.solver.candidates import (
    EPS,
    MAX_BATCH,
    Item,
    PointCache,
    Target,
    allowed_types,
    colocate,
    memory_refusal,
    min_share_solo,
    reject,
    to_placement,
    with_replicas,
)
from planner.solver.packing import Bin, Packing
from planner.solver.problem import (
    GpuPlan,
    Plan,
    Problem,
    ProblemError,
    Workload,
    batch_queue_delay_ms,
    too_many_replicas,
)

#: Share of the solo throughput a dedicated GPU is loaded to (published value).
DEDICATED_LOAD = 0.9


def igniter_batch(cache: PointCache, model: str, half_slo_ms: float, rate_rps: float) -> int:
    """Smallest b with b*(1/R + d_in/B) >= T/2 (R in req/ms), within 1..MAX_BATCH."""
    m = cache.profile.model(model)
    per_request = 1000.0 / rate_rps + m.bytes_in / cache.profile.gpu.pcie_bytes_per_ms
    return int(min(MAX_BATCH, max(1, math.ceil(half_slo_ms / per_request - 1e-9))))


def igniter_items(workload: Workload, cache: PointCache) -> list[Item]:
    refusal = memory_refusal(workload, cache)  # not even batch 1 fits: say memory, not the SLO
    if refusal is not None:
        raise refusal
    half = workload.slo_ms / 2.0
    items: list[Item] = []
    residual = workload.rate_rps
    batch = igniter_batch(cache, workload.model, half, residual)
    share = min_share_solo(cache, workload.model, batch, Target(half, residual))
    if share is None:
        # Dedicated GPUs: the largest batch whose solo latency at 100% meets T/2
        # (fix: and whose batch still fills within the SLO at the dedicated rate).
        dedicated = None
        latency, throughput = cache.solo_table(workload.model)
        for b in range(MAX_BATCH, 0, -1):
            capacity = DEDICATED_LOAD * float(throughput[b - 1, -1])
            fill = batch_queue_delay_ms(b, capacity)
            if latency[b - 1, -1] <= half + EPS and fill + latency[b - 1, -1] <= workload.slo_ms + EPS:
                dedicated = (b, capacity)
                break
        if dedicated is None:
            raise reject(workload, cache, half, "half the SLO (iGniter's inference target)")
        b_full, capacity = dedicated
        if residual / capacity > MAX_REPLICAS:
            raise too_many_replicas(workload, residual / capacity, cache.gpu_type.name)
        while share is None and residual > EPS:
            rate = min(capacity, residual)
            items.append(Item(workload, rate, b_full, 100.0, Target(half, rate), batch_queue_delay_ms(b_full, rate)))
            residual -= capacity
            if residual <= EPS:
                break
            batch = igniter_batch(cache, workload.model, half, residual)
            share = min_share_solo(cache, workload.model, batch, Target(half, residual))
    if residual > EPS:
        assert share is not None  # the loop above ends with a share or with nothing left to place
        items.append(
            Item(workload, residual, batch, share, Target(half, residual), batch_queue_delay_ms(batch, residual))
        )
    return items


def solve_igniter(problem: Problem) -> Plan:
    caches = {g.name: PointCache(g) for g in problem.inventory}
    items: list[tuple[Item, str]] = []
    for workload in problem.workloads:
        types = sorted(allowed_types(workload, problem.inventory), key=lambda g: g.price_per_hour)
        gpu_type = types[0].name  # the published algorithm is homogeneous: cheapest allowed type
        items += [(i, gpu_type) for i in with_replicas(igniter_items(workload, caches[gpu_type]))]
    items.sort(key=lambda pair: -pair[0].min_share)  # stable: input order breaks ties

    packing = Packing(caches, {g.name: g.max_count for g in problem.inventory})
    for item, gpu_type in items:
        cache = caches[gpu_type]
        best: tuple[float, Bin, list[float]] | None = None
        # Every open GPU with room by shares alone; `candidates` skips the full ones.
        for b in sorted(packing.candidates(gpu_type, item.min_share), key=lambda b: b.id):
            bound = math.inf if best is None else best[0] - cache.step  # only strictly cheaper can win
            fitted = colocate(cache, b.items + [item], b.shares + [item.min_share], max_added=bound)
            if fitted is None:
                continue
            cost = sum(fitted[0]) - b.load - item.min_share
            best = (cost, b, fitted[0])
            if cost <= EPS:
                break  # nothing beats zero; the first zero-cost GPU is what a full scan keeps
        if best is not None:
            _, b, shares = best
            packing.update(b, b.items + [item], shares)
            continue
        if not packing.can_open(gpu_type):
            raise ProblemError(
                f"the inventory has only {packing.limits[gpu_type]} GPUs of type {gpu_type!r}; "
                f"workload {item.workload.name!r} needs another; raise max_count"
            )
        fitted = colocate(cache, [item])
        if fitted is None:
            fix = (
                "use a GPU type with more memory, or the stoke strategy (iGniter's rule sizes batches by the SLO alone)"
            )
            raise memory_refusal(item.workload, cache, item.batch, fix) or reject(
                item.workload, cache, item.target.latency_budget_ms, "half the SLO (iGniter's inference target)"
            )
        packing.open_bin(gpu_type, [item], fitted[0])
    bins = [(b.gpu_type, b.items, b.shares) for b in packing.bins.values()]
    return _plan("igniter", problem, caches, bins)


def _plan(
    strategy: str,
    problem: Problem,
    caches: dict[str, PointCache],
    bins: list[tuple[str, list[Item], list[float]]],
    notes: tuple[str, ...] = (),
) -> Plan:
    prices = {g.name: g.price_per_hour for g in problem.inventory}
    gpus = []
    for gpu_type, members, shares in bins:
        predictions = caches[gpu_type].predict(members, shares)
        gpus.append(
            GpuPlan(
                gpu_type=gpu_type,
                price_per_hour=prices[gpu_type],
                placements=tuple(
                    to_placement(caches[gpu_type], i, s, p) for i, s, p in zip(members, shares, predictions)
                ),
            )
        )
    return Plan(strategy=strategy, gpus=tuple(gpus), notes=notes)
