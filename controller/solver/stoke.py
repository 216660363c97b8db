"""stoke's strategy: joint batch/share from the real latency budget, best fit, local search.

Formulation. A request of workload w (SLO T, rate R) waits at most q(b) =
(b-1)/R for its batch to fill (Triton's max queue delay), may queue behind
earlier batches, then runs in t_inf(b, r) on a GPU shared with others. With
a safety margin m (default 10%) and a utilisation cap u (default 0.9),
both in `StokeOptions`:

    q(b) + t_inf(b, r | co-located) + W99(b, r) <= (1 - m) * T,    R / h(b, r) <= u

where W99 is the p99 queueing wait of a G/G/1 server whose customers are
batches (`candidates.wait_p99_ms`; it depends on whether clients send
Poisson or paced traffic). Per workload and GPU type the solo candidate
table over b = 1..32 x every share step is evaluated at once and the batch
with the smallest feasible share kept: batch and share are chosen jointly
from the whole budget instead of splitting the SLO in half. A workload that
needs more than one GPU fills whole GPUs at their best feasible rate, then
places the residual rate as one more replica; one whose model cannot meet
(1-m)*T even at batch 1 on a whole GPU is rejected.

Placement: candidates in decreasing share order, best fit (the GPU left
fullest after `colocate` raises the shares that interference pushes over
their target); a new GPU is opened from the type where the workload costs
least (price x share). Then a local search tries to empty GPUs, lightest
first: move each of its workloads to another GPU, or swap it for a smaller
workload that moves to a third; a GPU is dropped only when all its workloads
found a place. Instances of up to `EXACT_LIMIT` candidates are also solved
exactly (depth-first search over partitions with the same feasibility
check), so small plans are optimal for the model.

Stability: with `current` (the plan that runs), its GPUs are re-used first,
in order and with their keys, holding the workloads they held where those
still fit; only what no longer fits, and new workloads, are placed again.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from controller.solver.candidates import (ARRIVAL_CV2, MAX_BATCH, EPS, Item, PointCache, Target, allowed_types, colocate,
                                          reject, smallest_latency_ms, to_placement, wait_p99_ms, with_replicas)
from controller.solver.packing import Bin, Packing
from controller.solver.problem import GpuPlan, Plan, Problem, ProblemError, Workload, batch_queue_delay_ms


@dataclass(frozen=True)
class StokeOptions:
    """Knobs of the stoke strategy (defaults checked with the plan simulator).

    safety_margin: share of the SLO kept free for what the model does not
    capture (prediction error, jitter, RPC). max_utilisation: highest planned
    utilisation of a replica, rate / throughput at its batch.
    """

    safety_margin: float = 0.10
    max_utilisation: float = 0.90

    def __post_init__(self) -> None:
        if not 0.0 <= self.safety_margin < 1.0:
            raise ProblemError(f"safety_margin must be in [0, 1), got {self.safety_margin!r}")
        if not 0.0 < self.max_utilisation < 1.0:
            raise ProblemError(f"max_utilisation must be in (0, 1), got {self.max_utilisation!r}")


DEFAULT_OPTIONS = StokeOptions()
#: Up to this many candidates the placement is solved exactly.
EXACT_LIMIT = 8
#: Co-location checks the local search may spend (a work bound keeps solves deterministic).
SEARCH_EVALUATIONS = 6000


def stoke_target(workload: Workload, rate_rps: float, batch: int,
                 options: StokeOptions = DEFAULT_OPTIONS) -> Target | None:
    """Budget for the co-located inference plus queueing: (1-m)*SLO less the batch fill time."""
    budget = (1.0 - options.safety_margin) * workload.slo_ms - batch_queue_delay_ms(batch, rate_rps)
    if budget <= 0:
        return None
    return Target(budget, rate_rps, batch, queueing=True, max_utilisation=options.max_utilisation,
                  arrival_cv2=ARRIVAL_CV2[workload.arrivals])


def best_candidate(workload: Workload, cache: PointCache, rate_rps: float,
                   options: StokeOptions = DEFAULT_OPTIONS) -> Item | None:
    """The (batch, share) with the smallest share meeting the budget alone, or None.

    Evaluated on the whole solo table at once: rows are batches, columns shares.
    """
    latency, throughput = cache.solo_table(workload.model)
    batches = np.arange(1, MAX_BATCH + 1, dtype=float)[:, None]
    budget = (1.0 - options.safety_margin) * workload.slo_ms - 1000.0 * (batches - 1.0) / rate_rps
    utilisation = rate_rps / throughput
    wait = wait_p99_ms(utilisation, batches, 1000.0 * batches / throughput, ARRIVAL_CV2[workload.arrivals])
    ok = (utilisation <= options.max_utilisation + EPS) & (latency + wait <= budget + EPS)
    rows = np.flatnonzero(ok.any(axis=1))
    if rows.size == 0:
        return None
    first = np.argmax(ok[rows], axis=1)           # smallest feasible share per batch
    pick = int(np.argmin(first))                  # smallest share; ties -> smallest batch
    batch, share = int(rows[pick]) + 1, float(cache.shares[first[pick]])
    return Item(workload, rate_rps, batch, share, stoke_target(workload, rate_rps, batch, options))


def stoke_items(workload: Workload, cache: PointCache, options: StokeOptions = DEFAULT_OPTIONS) -> list[Item]:
    """Candidates of one workload on one GPU type, split into replicas when one GPU is too small."""
    single = best_candidate(workload, cache, workload.rate_rps, options)
    if single is not None:
        return [single]
    budget = (1.0 - options.safety_margin) * workload.slo_ms
    rule = f"the SLO less stoke's {options.safety_margin:.0%} safety margin"
    if smallest_latency_ms(cache, workload.model) > budget:
        raise reject(workload, cache, budget, rule)
    # Like iGniter, fill whole GPUs first (they pack perfectly), then place the
    # residual rate as one more replica: an even split would waste a share of each GPU.
    full = _full_gpu_capacity(workload, cache, options)
    if full is None:
        raise reject(workload, cache, budget, rule)
    capacity, batch = full
    items, residual = [], workload.rate_rps
    while residual > EPS:
        candidate = best_candidate(workload, cache, residual, options)
        if candidate is not None:
            items.append(candidate)
            break
        rate = min(capacity, residual)
        items.append(Item(workload, rate, batch, 100.0, stoke_target(workload, rate, batch, options)))
        residual -= rate
    return items


def _full_gpu_capacity(workload: Workload, cache: PointCache,
                       options: StokeOptions = DEFAULT_OPTIONS) -> tuple[float, int] | None:
    """Highest rate one whole GPU serves within the budget, and the batch it needs.

    Feasible rates at a batch form an interval (too slow and the batch takes
    too long to fill; too fast and requests queue), so a dense grid of rates
    per batch, evaluated at once, finds its top.
    """
    latency, throughput = cache.solo_table(workload.model)
    batches = np.arange(1, MAX_BATCH + 1, dtype=float)[:, None]
    top = throughput[:, -1:] * options.max_utilisation           # (B, 1)
    rates = top * np.linspace(0.02, 1.0, 128)[None, :]           # (B, R)
    budget = (1.0 - options.safety_margin) * workload.slo_ms - 1000.0 * (batches - 1.0) / rates
    wait = wait_p99_ms(rates / throughput[:, -1:], batches, 1000.0 * batches / throughput[:, -1:],
                       ARRIVAL_CV2[workload.arrivals])
    ok = latency[:, -1:] + wait <= budget + EPS
    if not ok.any():
        return None
    feasible = np.where(ok, rates, 0.0)
    row = int(np.argmax(feasible.max(axis=1)))
    return float(feasible[row].max()), row + 1


def _choose_type(workload: Workload, problem: Problem, packing: Packing, options: StokeOptions,
                 exclude: Sequence[str] = ()) -> tuple[str, list[Item]]:
    """The allowed GPU type where the workload costs least (price x total share)."""
    costs = []
    allowed = [g for g in allowed_types(workload, problem.inventory) if g.name not in exclude]
    for g in allowed:
        try:
            items = stoke_items(workload, packing.caches[g.name], options)
        except ProblemError:
            continue
        costs.append((g.price_per_hour * sum(i.min_share for i in items) / 100.0, g.name, items))
    if not costs:
        if not allowed:
            raise ProblemError(f"workload {workload.name!r} needs another GPU but every allowed GPU type is at its "
                               f"max_count; raise max_count or add a GPU type")
        stoke_items(workload, packing.caches[allowed[0].name], options)  # raises the descriptive rejection
    costs.sort(key=lambda o: (o[0], o[1]))
    return costs[0][1], costs[0][2]


def _place(packing: Packing, item: Item, gpu_type: str) -> bool:
    """Best fit, else a new GPU; False when the type is at its count limit."""
    found = packing.best_fit(item, gpu_type)
    if found is not None:
        b, shares = found
        packing.update(b, b.items + [item], shares)
        return True
    if not packing.can_open(gpu_type):
        return False
    fitted = colocate(packing.caches[gpu_type], [item])
    if fitted is None:  # cannot happen: min_share was checked alone
        raise ProblemError(f"workload {item.workload.name!r} does not fit a whole {gpu_type}")
    packing.open_bin(gpu_type, [item], fitted[0])
    return True


def _try_empty(packing: Packing, victim: Bin) -> bool:
    """Move (or swap) every workload off `victim`; keep the changes only if it empties."""
    packing.checkpoint()
    for item in sorted(victim.items, key=lambda i: -i.min_share):
        found = packing.best_fit(item, victim.gpu_type, exclude=(victim.id,))
        if found is None:
            found = _swap_in(packing, item, victim)
        if found is None:
            packing.rollback()
            return False
        b, shares = found
        packing.update(b, b.items + [item], shares)
    packing.close(victim)
    packing.commit()
    return True


def _swap_in(packing: Packing, item: Item, victim: Bin) -> tuple[Bin, list[float]] | None:
    """Make room for `item` on a GPU by moving one smaller workload from there to a third GPU."""
    cache = packing.caches[victim.gpu_type]
    for tried, b in enumerate(packing.candidates(victim.gpu_type, 0.0, exclude=(victim.id,))):
        if tried >= 8:
            return None
        for k, other in enumerate(b.items):
            if other.min_share >= item.min_share or b.load - b.shares[k] + item.min_share > 100.0 + EPS:
                continue
            rest = b.items[:k] + b.items[k + 1:]
            packing.evaluations += 1
            fitted = colocate(cache, rest + [item], [i.min_share for i in rest] + [item.min_share])
            if fitted is None:
                continue
            moved = packing.best_fit(other, victim.gpu_type, exclude=(victim.id, b.id))
            if moved is None:
                continue
            target, target_shares = moved
            packing.update(target, target.items + [other], target_shares)
            packing.update(b, rest, fitted[0][:-1])
            return b, fitted[0]
    return None


def _local_search(packing: Packing, budget: int) -> None:
    """Empty GPUs, lightest first, until none can be emptied or `budget` checks are spent.

    The budget counts co-location checks, not seconds, so a solve is deterministic.
    """
    stop = packing.evaluations + budget
    improved = True
    while improved and packing.evaluations < stop:
        improved = False
        for victim_id in [b.id for b in sorted(packing.bins.values(), key=lambda b: (b.load, b.id))]:
            if packing.evaluations >= stop:
                return
            victim = packing.bins.get(victim_id)       # earlier moves may have emptied or changed it
            if victim is not None and _try_empty(packing, victim):
                improved = True


def _exact(cache: PointCache, items: list[Item]) -> list[list[Item]] | None:
    """Fewest GPUs for `items` on one type: depth-first search over partitions."""
    items = sorted(items, key=lambda i: -i.min_share)
    best: list[list[Item]] | None = None
    feasible: dict[frozenset[int], bool] = {}

    def fits(group: list[int]) -> bool:
        key = frozenset(group)
        if key not in feasible:
            feasible[key] = colocate(cache, [items[i] for i in group]) is not None
        return feasible[key]

    def search(k: int, groups: list[list[int]]) -> None:
        nonlocal best
        if best is not None and len(groups) >= len(best):
            return
        if k == len(items):
            best = [[items[i] for i in g] for g in groups]
            return
        for g in groups:
            g.append(k)
            if fits(g):
                search(k + 1, groups)
            g.pop()
        groups.append([k])
        search(k + 1, groups)
        groups.pop()

    search(0, [])
    return best


def _seed_from(packing: Packing, current: Plan, pending: dict[tuple[str, int], tuple[Item, str]]) -> None:
    """Re-use the current plan's GPUs, in order and with their keys, for the workloads they hold."""
    for gpu in current.gpus:
        if gpu.gpu_type not in packing.caches or not packing.can_open(gpu.gpu_type):
            continue
        items: list[Item] = []
        shares: list[float] = []
        for placement in gpu.placements:
            found = pending.get((placement.name, placement.replica))
            if found is None or found[1] != gpu.gpu_type:
                continue
            fitted = colocate(packing.caches[gpu.gpu_type], items + [found[0]], shares + [found[0].min_share])
            if fitted is not None:
                items, shares = items + [found[0]], fitted[0]
                del pending[(placement.name, placement.replica)]
        if items:
            packing.open_bin(gpu.gpu_type, items, shares, key=gpu.key)


def solve_stoke(problem: Problem, current: Plan | None = None, options: StokeOptions = DEFAULT_OPTIONS) -> Plan:
    packing = Packing({g.name: PointCache(g) for g in problem.inventory},
                      {g.name: g.max_count for g in problem.inventory})
    pending: dict[tuple[str, int], tuple[Item, str]] = {}
    for workload in problem.workloads:
        gpu_type, items = _choose_type(workload, problem, packing, options)
        for item in with_replicas(items):
            pending[item.key] = (item, gpu_type)
    if current is not None:
        _seed_from(packing, current, pending)
    spilled: dict[str, list[str]] = {}
    for item, gpu_type in sorted(pending.values(), key=lambda pair: -pair[0].min_share):
        if _place(packing, item, gpu_type):
            continue
        # Out of GPUs of this type: the rate this replica should have served goes to the next
        # cheapest allowed type, sized for that type (it may need several replicas there).
        full = spilled.setdefault(item.workload.name, [gpu_type])
        remaining = item.rate_rps
        while remaining > EPS:
            part = replace(item.workload, rate_rps=remaining)
            other, items = _choose_type(part, problem, packing, options, exclude=full)
            for replica in items:
                if not _place(packing, replica, other):
                    full.append(other)
                    break
                remaining -= replica.rate_rps
    _local_search(packing, SEARCH_EVALUATIONS)

    notes: list[str] = []
    bins = _renumber(list(packing.bins.values()))
    types = {b.gpu_type for b in bins}
    all_items = [i for b in bins for i in b.items]
    if current is None and len(types) == 1 and len(all_items) <= EXACT_LIMIT:
        gpu_type = types.pop()
        exact = _exact(packing.caches[gpu_type], all_items)
        if exact is not None and len(exact) < len(bins):
            cache = packing.caches[gpu_type]
            bins = [Bin(k, gpu_type, group, colocate(cache, group)[0]) for k, group in enumerate(exact)]
            notes.append(f"exact search: {len(exact)} GPU(s) is the fewest for these workloads")
        elif exact is not None:
            notes.append(f"exact search confirms {len(bins)} GPU(s) is the fewest")
    return _to_plan(problem, packing.caches, bins, tuple(notes))


def _renumber(bins: list[Bin]) -> list[Bin]:
    """Replica numbers 0..n-1 and counts per workload, in GPU order (spilling can change n)."""
    counts: dict[str, int] = {}
    for b in bins:
        for i in b.items:
            counts[i.workload.name] = counts.get(i.workload.name, 0) + 1
    seen: dict[str, int] = {}
    for b in bins:
        for k, i in enumerate(b.items):
            n = seen.get(i.workload.name, 0)
            seen[i.workload.name] = n + 1
            b.items[k] = replace(i, replica=n, replicas=counts[i.workload.name])
    return bins


def _to_plan(problem: Problem, caches: dict[str, PointCache], bins: list[Bin], notes: tuple[str, ...]) -> Plan:
    prices = {g.name: g.price_per_hour for g in problem.inventory}
    gpus = []
    for b in bins:
        predictions = caches[b.gpu_type].predict(b.items, b.shares)
        order = sorted(range(len(b.items)), key=lambda k: (-b.shares[k], b.items[k].key))
        gpus.append(GpuPlan(gpu_type=b.gpu_type, price_per_hour=prices[b.gpu_type], key=b.key, placements=tuple(
            to_placement(b.items[k], b.shares[k], predictions[k]) for k in order)))
    return Plan(strategy="stoke", gpus=tuple(gpus), notes=notes)
