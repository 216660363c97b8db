"""stoke's strategy: share, max batch and queue delay from the accurate p99, fewest replicas, best fit.

Formulation. A replica of workload w (SLO T, rate R split over replicas) is
one Triton instance with dynamic batching at max batch b, max queue delay d
and MPS share r. Its request latency distribution comes from the batching
model (`interference.batching`): queueing behind earlier batches, the wait
for a batch to fill, and the batch's co-located inference, for the
workload's arrival kind. With a safety margin m (`StokeOptions`, default
5% of the SLO) and a utilisation cap u (0.95 for Poisson clients, the
table's range; 0.98 for paced ones, which do not queue below 1):

    p99(b, d, r | rate, co-located) <= (1 - m) * T,     rate / h(b, r) <= u

Candidates are every b in 1..32, every share step, and d in {0 (greedy
batching), the fill time (b-1)/rate} for Poisson clients, or d = the fill
time plus half an interval for paced clients (batches then start full, and
the p99 is exactly L(b) + (b-1)/rate). The whole table of one workload is
evaluated at once; the smallest feasible share wins, and at that share the
smallest batch whose p99 is within 2% of the lowest. Shares below a
workload's `min_share_pct` (a floor the controller's SLO guard sets) are not
candidates.

Replicas. One replica when one GPU can hold the SLO; otherwise the fewest
that can: n = ceil(R / C), C the highest rate a whole GPU serves within the
budget. The rate is split either evenly or as n-1 whole GPUs at C plus the
remainder on a smaller share, whichever needs less GPU in total. A workload
whose model cannot meet (1-m)*T even alone at batch 1 on a whole GPU is
rejected, naming the term that makes it impossible.

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
With a `SolveMemo` whose last answer `current` is, and a few workloads
changed, `planner.solver.replan` runs the same steps on the GPUs the change
reaches only, with the same answer.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np
from numpy.typing import NDArray

from interference.batching import MAX_UTILISATION, end_to_end_p99_ms, fill_time_ms, paced_delay_ms
from planner.bounds import MAX_REPLICAS
from planner.solver.candidates import (
    EPS,
    MAX_BATCH,
    Item,
    P99Target,
    PointCache,
    allowed_types,
    colocate,
    memory_fits_table,
    memory_refusal,
    smallest_latency_ms,
    to_placement,
    with_replicas,
)
from planner.solver.packing import Bin, Packing
from planner.solver.problem import (
    GpuPlan,
    Placement,
    Plan,
    Problem,
    ProblemError,
    Workload,
    too_many_replicas,
)


@dataclass(frozen=True)
class StokeOptions:
    """Knobs of the stoke strategy (defaults checked with the plan simulator).

    error_bound: check the p99 budget and the utilisation cap with L(k) and
    O(k) raised to the profile's out-of-sample error at each candidate's
    (batch, share) (`interference.profile.FitDomain`); off, the central fit is
    trusted (stoke before issue 15). extrapolate: allow shares and batches
    outside the profile's measured domain (then at the widened error there).
    safety_margin: share of the SLO kept free for what neither the fit nor its
    error bound captures (jitter); with error_bound off it has to cover
    prediction error too (0.05 was the default then). max_utilisation: highest
    planned utilisation of a replica, rate / throughput at its batch, for
    Poisson clients (the batching model covers up to 0.953).
    max_paced_utilisation: the same for paced clients (no queueing below 1).
    """

    safety_margin: float = 0.02
    max_utilisation: float = 0.95
    max_paced_utilisation: float = 0.99
    error_bound: bool = True
    extrapolate: bool = False

    def cap(self, arrivals: str) -> float:
        """The utilisation cap for a workload's arrival kind."""
        return self.max_paced_utilisation if arrivals == "constant" else self.max_utilisation

    def __post_init__(self) -> None:
        if not 0.0 <= self.safety_margin < 1.0:
            raise ProblemError(f"safety_margin must be in [0, 1), got {self.safety_margin!r}")
        if not 0.0 < self.max_utilisation <= MAX_UTILISATION:
            raise ProblemError(f"max_utilisation must be in (0, {MAX_UTILISATION}], got {self.max_utilisation!r}")
        if not 0.0 < self.max_paced_utilisation <= 1.0:
            raise ProblemError(f"max_paced_utilisation must be in (0, 1], got {self.max_paced_utilisation!r}")


DEFAULT_OPTIONS = StokeOptions()
#: stoke before issue 15: the central fit trusted everywhere, a blanket 5% margin and a 0.98 paced cap.
CENTRAL_OPTIONS = StokeOptions(safety_margin=0.05, max_paced_utilisation=0.98, error_bound=False, extrapolate=True)
#: Up to this many candidates the placement is solved exactly.
EXACT_LIMIT = 8
#: Co-location checks the local search may spend (a work bound keeps solves deterministic).
SEARCH_EVALUATIONS = 6000
#: Above this many replicas (and without a current plan or GPU count limits) the packing is done in
#: chunks of about this many, dealt so that each holds the same mix (`deal_chunks`): packing one
#: huge instance at once collapses (a best-fit lookup sees only the fullest GPUs) and takes quadratic time.
CHUNK_REPLICAS = 1200
#: Co-location checks the local search may spend per replica of a chunk (measured on the fleet mix of
#: `random_mix.fleet_workloads`: 2 finds what 6 does; the chunks' first fit leaves little to gain).
CHUNK_SEARCH_PER_REPLICA = 2
#: Delay modes considered per arrival kind ("paced": the fill time plus half an interval).
DELAY_MODES = {"poisson": ("zero", "fill"), "constant": ("paced",)}


@dataclass(frozen=True)
class CandidateGrid:
    """Every candidate of one replica at one rate: axes (delay mode, batch 1..32, share step)."""

    modes: tuple[str, ...]
    p99_ms: NDArray[Any]  # (modes, batches, shares); inf where unstable
    utilisation: NDArray[Any]  # (batches, shares)
    queue_delay_ms: NDArray[Any]  # (modes, batches)
    budget_ms: float
    max_utilisation: float

    @property
    def feasible(self) -> NDArray[Any]:
        return (self.p99_ms <= self.budget_ms + EPS) & (self.utilisation <= self.max_utilisation + EPS)


def budget_ms(workload: Workload, options: StokeOptions) -> float:
    return (1.0 - options.safety_margin) * workload.slo_ms


def _p99(
    cache: PointCache,
    model: str,
    arrivals: str,
    rate: Any,
    columns: tuple[int, int] | None = None,
    options: StokeOptions = DEFAULT_OPTIONS,
) -> tuple[tuple[str, ...], NDArray[Any], NDArray[Any], NDArray[Any]]:
    """(modes, p99 (modes, ..., batches, shares), utilisation, delays (modes, ..., batches, 1)).

    `rate` is a scalar, or an array of shape (R, 1, 1): then the results have a rate axis
    after the modes. `columns` = (first, stop) restricts the share steps (with rates only).
    With `options.error_bound` the p99 and utilisation are those at the error bound (L and O
    raised); the batching table's occupancy shape stays the central one. Candidates outside
    the profile's domain are infinite unless `options.extrapolate`.
    """
    latency, throughput = cache.upper_table(model) if options.error_bound else cache.solo_table(model)
    outside = np.zeros(latency.shape, dtype=bool) if options.extrapolate else ~cache.domain_table(model)
    fits = memory_fits_table(cache, model)  # a batch whose replica overflows the GPU's memory is no candidate
    if not fits.all():
        outside = outside | ~fits[:, None]
    if columns is not None:
        latency, throughput = latency[:, columns[0] : columns[1]], throughput[:, columns[0] : columns[1]]
        outside = outside[:, columns[0] : columns[1]]
    modes, p99, utilisation, delays = _p99_tables(
        latency, throughput, cache, model, arrivals, rate, columns, upper=options.error_bound
    )
    if outside.any():
        p99, utilisation = np.where(outside, np.inf, p99), np.where(outside, np.inf, utilisation)
    return modes, p99, utilisation, delays


def _p99_tables(
    latency: NDArray[Any],
    throughput: NDArray[Any],
    cache: PointCache,
    model: str,
    arrivals: str,
    rate: Any,
    columns: tuple[int, int] | None,
    upper: bool = False,
) -> tuple[tuple[str, ...], NDArray[Any], NDArray[Any], NDArray[Any]]:
    """`_p99` on given L and throughput tables (already cut to `columns`); `upper`: partial batches on
    the upper service curve (`PointCache.upper_lines`)."""
    batch = np.arange(1, MAX_BATCH + 1, dtype=float)[:, None]
    rate = np.asarray(rate, dtype=float)
    utilisation = rate / throughput
    modes = DELAY_MODES[arrivals]
    outside = cache.outside_batch_ms(model)  # the serving path outside the batch
    if arrivals == "constant":
        p99 = np.where(utilisation <= 1.0 + EPS, latency + 1000.0 * (batch - 1.0) / rate, np.inf)
        return modes, end_to_end_p99_ms(p99, *outside)[None], utilisation, np.asarray(paced_delay_ms(batch, rate))[None]
    occupancy = 1000.0 * batch / throughput
    curves = cache.rated_curves(model, modes, columns, upper) if rate.ndim else cache.p99_curves(model, modes, upper)
    ratio, size = curves.at_utilisation(utilisation)
    p99 = end_to_end_p99_ms(ratio * occupancy + (latency - occupancy) * size / batch, *outside)
    delays = np.stack([np.zeros_like(batch * rate) if mode == "zero" else fill_time_ms(batch, rate) for mode in modes])
    return modes, p99, utilisation, delays


def candidate_grid(
    workload: Workload, cache: PointCache, rate_rps: float, options: StokeOptions = DEFAULT_OPTIONS
) -> CandidateGrid:
    modes, p99, utilisation, delays = _p99(cache, workload.model, workload.arrivals, rate_rps, options=options)
    return CandidateGrid(
        modes, p99, utilisation, delays[..., 0], budget_ms(workload, options), options.cap(workload.arrivals)
    )


def stoke_target(
    workload: Workload, rate_rps: float, batch: int, queue_delay_ms: float, options: StokeOptions = DEFAULT_OPTIONS
) -> P99Target:
    return P99Target(
        budget_ms(workload, options),
        rate_rps,
        batch,
        queue_delay_ms,
        workload.model,
        paced=workload.arrivals == "constant",
        max_utilisation=options.cap(workload.arrivals),
        error_bound=options.error_bound,
    )


def best_candidate(
    workload: Workload, cache: PointCache, rate_rps: float, options: StokeOptions = DEFAULT_OPTIONS
) -> Item | None:
    """The (delay, batch, share) with the smallest share meeting the budget alone, or None.

    Ties on the share go to the smallest batch whose predicted p99 is within 2% of the lowest
    (the most room for interference, without a larger max batch that buys nothing).
    """
    return best_candidates([workload], cache, options, [rate_rps])[0]


#: p99s within this of the lowest count as equal when picking the batch at the smallest share
#: (about the batching table's noise at light load).
NEAR_BEST_P99 = 0.02
#: Share steps `best_candidates` tries above the first one that can carry a workload's rate.
SHARE_WINDOW = 12
#: Workloads evaluated together by `best_candidates` (bounds the temporary arrays to ~10 MB).
CANDIDATE_CHUNK = 96


def best_candidates(
    workloads: Sequence[Workload],
    cache: PointCache,
    options: StokeOptions = DEFAULT_OPTIONS,
    rates: Sequence[float] | None = None,
) -> list[Item | None]:
    """`best_candidate` for many workloads at once (each at its own rate, default its whole rate).

    Workloads of one model and arrival kind share their candidate curves, so their tables are
    evaluated as one array (workloads x delay modes x batches x shares): a few numpy calls for
    a hundred workloads instead of a few per workload.
    """
    out: list[Item | None] = [None] * len(workloads)
    rates = [w.rate_rps for w in workloads] if rates is None else list(rates)
    groups: dict[tuple[str, str], list[int]] = {}
    for k, w in enumerate(workloads):
        groups.setdefault((w.model, w.arrivals), []).append(k)
    shares = len(cache.shares)
    for (model, arrivals), members in groups.items():
        # The first share step whose best batch can carry each rate under the cap: nothing below
        # it is feasible. Most workloads find their share within a window above it; the rest get
        # a second pass over every step.
        top = (cache.upper_table(model) if options.error_bound else cache.solo_table(model))[1].max(axis=0)
        start = {k: int(np.searchsorted(top, rates[k] / options.cap(arrivals) - EPS)) for k in members}
        ordered = sorted((k for k in members if start[k] < shares), key=lambda k: start[k])
        retry: list[int] = []
        for lo in range(0, len(ordered), CANDIDATE_CHUNK):
            chunk = ordered[lo : lo + CANDIDATE_CHUNK]
            first = start[chunk[0]]
            window = (first, min(shares, max(start[chunk[-1]], first) + SHARE_WINDOW))
            retry += _pick(workloads, rates, chunk, cache, model, arrivals, options, window, out)
        for lo in range(0, len(retry), CANDIDATE_CHUNK):
            _pick(workloads, rates, retry[lo : lo + CANDIDATE_CHUNK], cache, model, arrivals, options, (0, shares), out)
    return out


def _pick(
    workloads: Sequence[Workload],
    rates: Sequence[float],
    chunk: Sequence[int],
    cache: PointCache,
    model: str,
    arrivals: str,
    options: StokeOptions,
    window: tuple[int, int],
    out: list[Item | None],
) -> list[int]:
    """Fill `out` for the workloads of `chunk` from the share steps in `window`; returns those not found."""
    rate = np.array([rates[k] for k in chunk])
    budget = np.array([budget_ms(workloads[k], options) for k in chunk])
    modes, p99, utilisation, _ = _p99(cache, model, arrivals, rate[:, None, None], window, options)
    p99 = np.moveaxis(p99, 0, 1)  # (N, modes, batches, shares)
    ok = (p99 <= budget[:, None, None, None] + EPS) & (utilisation[:, None] <= options.cap(arrivals) + EPS)
    floor = np.array([workloads[k].min_share_pct for k in chunk])  # the SLO guard's floors (0: none)
    ok &= cache.shares[window[0] : window[1]][None, None, None, :] >= floor[:, None, None, None] - EPS
    columns = ok.any(axis=(1, 2))  # (N, shares)
    found = columns.any(axis=1)
    first = np.argmax(columns, axis=1)
    at = np.take_along_axis(np.where(ok, p99, np.inf), first[:, None, None, None], axis=3)[..., 0]
    # At the smallest share: the smallest batch whose p99 is within NEAR_BEST_P99 of the lowest
    # (a larger max batch that buys nothing only makes the config look odd).
    best = at.reshape(len(chunk), -1).min(axis=1)
    near = at <= best[:, None, None] * (1.0 + NEAR_BEST_P99)
    pick = np.argmax(near.any(axis=1), axis=1)  # smallest such batch
    modes_at = np.argmax(np.where(near, -at, -np.inf)[np.arange(len(chunk)), :, pick], axis=1)
    missing = []
    for n, k in enumerate(chunk):
        if not found[n]:
            missing.append(k)
            continue
        b, r = int(pick[n]) + 1, rates[k]
        delay = _delay_ms(modes[int(modes_at[n])], b, r)
        share = float(cache.shares[window[0] + int(first[n])])
        target = stoke_target(workloads[k], r, b, delay, options)
        out[k] = Item(workloads[k], r, b, share, target, delay, extrapolate=options.extrapolate)
    return missing if window != (0, len(cache.shares)) else []


def _delay_ms(mode: str, batch: int, rate_rps: float) -> float:
    if mode == "paced":
        return float(paced_delay_ms(batch, rate_rps))
    return 0.0 if mode == "zero" else fill_time_ms(batch, rate_rps)


def full_gpu_capacity(workload: Workload, cache: PointCache, options: StokeOptions = DEFAULT_OPTIONS) -> float | None:
    """Highest rate one whole GPU serves within the budget (any batch and delay), or None.

    A coarse log grid of rates is evaluated at once, then the edge is refined by bisection.
    """
    _, throughput = cache.upper_table(workload.model) if options.error_bound else cache.solo_table(workload.model)
    cap = options.cap(workload.arrivals)
    top = float(throughput[:, -1].max()) * cap
    budget = budget_ms(workload, options)

    def feasible(rates: NDArray[Any]) -> NDArray[Any]:
        whole_gpu = (len(cache.shares) - 1, len(cache.shares))
        _, p99, utilisation, _ = _p99(
            cache, workload.model, workload.arrivals, rates[:, None, None], whole_gpu, options
        )
        ok = (p99 <= budget + EPS) & (utilisation <= cap + EPS)
        return np.asarray(ok.any(axis=(0, 2, 3)), dtype=bool)

    rates = top * np.geomspace(1e-4, 1.0, 48)
    ok = feasible(rates)
    if not ok.any():
        return None
    last = int(np.flatnonzero(ok)[-1])
    lo, hi = float(rates[last]), float(rates[last + 1]) if last + 1 < len(rates) else top
    if last + 1 == len(rates):
        return lo
    for _ in range(12):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if feasible(np.array([mid]))[0] else (lo, mid)
    return lo


def rejection(workload: Workload, cache: PointCache, options: StokeOptions) -> ProblemError:
    """Why no replica of `workload` can meet its SLO on this GPU type, naming the term that fails (first memory:
    a replica too big for the GPU even at batch 1 meets no SLO there)."""
    refusal = memory_refusal(workload, cache)
    if refusal is not None:
        return refusal
    budget = budget_ms(workload, options)
    floor = smallest_latency_ms(cache, workload.model)
    where = f"workload {workload.name!r} cannot meet its SLO of {workload.slo_ms:g} ms on a {cache.gpu_type.name}"
    if floor > workload.slo_ms:
        return ProblemError(
            f"{where}: model {workload.model!r} needs at least {floor:.2f} ms per inference even "
            f"alone (batch 1, 100%); relax the SLO or use a faster GPU type"
        )
    serving = end_to_end_p99_ms(0.0, *cache.outside_batch_ms(workload.model))
    if floor + serving > budget:
        path = f" plus {serving:.2f} ms of serving path (p99)" if serving > 0 else ""
        return ProblemError(
            f"{where}: inference alone takes {floor:.2f} ms (batch 1, 100%){path}, more than the "
            f"{budget:.2f} ms left after stoke's {options.safety_margin:.0%} safety margin; "
            f"relax the SLO, lower --safety-margin, or use a faster GPU type"
        )
    return ProblemError(
        f"{where}: inference alone takes {floor:.2f} ms (batch 1, 100%), but with queueing at "
        f"any useful rate the p99 exceeds the {budget:.2f} ms budget; relax the SLO or use a "
        f"faster GPU type"
    )


def _shape(workload: Workload) -> tuple[Any, ...]:
    """Everything of a workload but its name and rate: what a full GPU's capacity depends on."""
    return tuple(getattr(workload, name) for name in _SHAPE_FIELDS)


_SHAPE_FIELDS = tuple(f.name for f in fields(Workload) if f.name not in ("name", "rate_rps"))


class ReplicaMemo:
    """What `stoke_items` asks of one GPU type in one solve, each computed once and in batches.

    A full GPU's capacity, and the candidate at a given rate, depend on a workload's model, SLO,
    arrival kind and floors, not on its name: workloads of one shape share them (at 100,000 workloads
    a few thousand shapes). `prepare` evaluates the splits of many multi-replica workloads in one
    vectorised `best_candidates` call instead of a few per workload.
    """

    def __init__(self, cache: PointCache, options: StokeOptions):
        self.cache, self.options = cache, options
        self._capacity: dict[tuple[Any, ...], float | None] = {}
        self._items: dict[tuple[tuple[Any, ...], float], Item | None] = {}

    def __len__(self) -> int:
        """Entries held (a `SolveMemo` kept across solves starts a type's afresh past a bound)."""
        return len(self._capacity) + len(self._items)

    def capacity(self, workload: Workload) -> float | None:
        key = _shape(workload)
        if key not in self._capacity:
            self._capacity[key] = full_gpu_capacity(workload, self.cache, self.options)
        return self._capacity[key]

    def best(self, workload: Workload, rate_rps: float) -> Item | None:
        key = (_shape(workload), rate_rps)
        if key not in self._items:
            self._items[key] = best_candidate(workload, self.cache, rate_rps, self.options)
        item = self._items[key]
        return item if item is None or item.workload is workload else replace(item, workload=workload)

    def prepare(self, workloads: Sequence[Workload]) -> None:
        """Compute at once what `stoke_items` will ask for these workloads (none fits one replica)."""
        asks: dict[tuple[tuple[Any, ...], float], tuple[Workload, float]] = {}
        for workload in workloads:
            capacity = self.capacity(workload)
            if capacity is None:
                continue
            rates = [capacity]
            if workload.rate_rps / capacity <= MAX_REPLICAS:  # what `stoke_items` asks, so its lookups hit
                split = ReplicaSplit.of(workload.rate_rps, capacity)
                rates.extend(rate for _, rate in split.even)
                if split.remainder > EPS:
                    rates.append(split.remainder)
            for rate in rates:
                key = (_shape(workload), rate)
                if key not in self._items:
                    asks.setdefault(key, (workload, rate))
        found = best_candidates([w for w, _ in asks.values()], self.cache, self.options, [r for _, r in asks.values()])
        self._items.update(zip(asks, found))


@dataclass(frozen=True)
class ReplicaSplit:
    """How `stoke_items` splits a rate one GPU cannot carry: `count` replicas from the capacity edge, the even
    splits it tries ((replicas, rate each), fewest first) and what is left over `count - 1` full replicas."""

    count: int
    even: tuple[tuple[int, float], ...]
    remainder: float

    @staticmethod
    def of(rate_rps: float, capacity: float) -> ReplicaSplit:
        count = max(2, math.ceil(rate_rps / capacity - 1e-9))
        # paced feasibility is not monotone in the rate (the fill-time delay grows as the rate falls), so
        # fewer replicas can hold where the capacity edge says not: ssd paced at 635 req/s, SLO 100 ms,
        # fits 2 whole GPUs at 317.5 req/s (batch 16) though the edge is 295 req/s
        counts = (count - 1, count) if count > 2 else (count,)
        return ReplicaSplit(count, tuple((n, rate_rps / n) for n in counts), rate_rps - (count - 1) * capacity)


def stoke_items(
    workload: Workload,
    cache: PointCache,
    options: StokeOptions = DEFAULT_OPTIONS,
    single: Item | None | bool = False,
    memo: ReplicaMemo | None = None,
) -> list[Item]:
    """Replicas of one workload on one GPU type: one when a GPU can hold it, else the fewest that can.

    `single` passes in `best_candidate(workload, cache, workload.rate_rps)` when already known;
    `memo` (of this GPU type and options) the capacities and candidates computed before.
    """
    if single is False:
        single = best_candidate(workload, cache, workload.rate_rps, options)
    if isinstance(single, Item):
        return [single]
    memo = memo or ReplicaMemo(cache, options)
    capacity = memo.capacity(workload)
    if capacity is None:
        raise rejection(workload, cache, options)
    full = memo.best(workload, capacity)
    if full is None:  # the capacity edge is feasible by construction; guard against rounding
        raise rejection(workload, cache, options)
    needed = workload.rate_rps / capacity
    if needed > MAX_REPLICAS:
        raise too_many_replicas(workload, needed, cache.gpu_type.name)
    split = ReplicaSplit.of(workload.rate_rps, capacity)
    count, remainder = split.count, split.remainder
    choices = []
    for replicas, rate in split.even:
        even = memo.best(workload, rate)
        if even is not None:
            choices.append([even] * replicas)
    rest = memo.best(workload, remainder) if remainder > EPS else None
    if rest is not None:
        choices.append([full] * (count - 1) + [rest])
    if not choices:  # a remainder no candidate serves alone rides on a whole GPU like the others
        delay = paced_delay_ms(full.batch, remainder) if workload.arrivals == "constant" else 0.0
        choices.append(
            [full] * (count - 1)
            + [
                Item(
                    workload,
                    remainder,
                    full.batch,
                    100.0,
                    stoke_target(workload, remainder, full.batch, delay, options),
                    delay,
                    extrapolate=options.extrapolate,
                )
            ]
        )
    # Least GPU in total; on a tie the uneven split (whole GPUs pack perfectly).
    return min(reversed(choices), key=lambda items: round(sum(i.min_share for i in items), 6))


def _choose_type(
    workload: Workload,
    problem: Problem,
    packing: Packing,
    options: StokeOptions,
    exclude: Sequence[str] = (),
    singles: dict[tuple[str, str], Item | None] | None = None,
    memos: dict[str, ReplicaMemo] | None = None,
) -> tuple[str, list[Item]]:
    """The allowed GPU type where the workload costs least (price x total share).

    `singles` holds precomputed single-replica candidates per (GPU type, workload name), `memos`
    each type's `ReplicaMemo`.
    """
    costs = []
    allowed = [g for g in allowed_types(workload, problem.inventory) if g.name not in exclude]
    for g in allowed:
        known = singles.get((g.name, workload.name), False) if singles is not None else False
        try:
            memo = memos.get(g.name) if memos is not None else None
            items = stoke_items(workload, packing.caches[g.name], options, single=known, memo=memo)
        except ProblemError:
            continue
        costs.append((g.price_per_hour * sum(i.min_share for i in items) / 100.0, g.name, items))
    if not costs:
        if not allowed:
            raise ProblemError(
                f"workload {workload.name!r} needs another GPU but every allowed GPU type is at its "
                f"max_count; raise max_count or add a GPU type"
            )
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
    if fitted is None:  # candidates fit alone (their share met the SLO, their batch the memory): a guard
        cache = packing.caches[gpu_type]
        raise memory_refusal(item.workload, cache, item.batch) or ProblemError(
            f"workload {item.workload.name!r} does not fit a whole {gpu_type} at batch {item.batch} and "
            f"{item.min_share:g}% (its candidate alone); report this as a bug with the workloads and profile"
        )
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
            rest = b.items[:k] + b.items[k + 1 :]
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


def _local_search(
    packing: Packing,
    budget: int,
    keep: Callable[[Bin], bool] | None = None,
    among: Callable[[], Iterable[Bin]] | None = None,
) -> None:
    """Empty GPUs, lightest first, until none can be emptied or `budget` checks are spent.

    The budget counts co-location checks, not seconds, so a solve is deterministic. GPUs for
    which `keep` is true are not emptied (they may still receive replicas). `among`: the GPUs
    `keep` may be false for, when that is known to be fewer than all.
    """
    stop = packing.evaluations + budget
    improved = True
    while improved and packing.evaluations < stop:
        improved = False
        pool = packing.bins.values() if among is None else among()
        victims = [b for b in pool if keep is None or not keep(b)]
        for victim_id in [b.id for b in sorted(victims, key=lambda b: (b.load, b.id))]:
            if packing.evaluations >= stop:
                return
            victim = packing.bins.get(victim_id)  # earlier moves may have emptied or changed it
            if victim is not None and _try_empty(packing, victim):
                improved = True


def deal_chunks(pairs: Sequence[tuple[Item, str]], size: int = 0) -> list[list[tuple[Item, str]]]:
    """Replicas dealt into chunks of at most about `size` (default `CHUNK_REPLICAS`), one GPU type each.

    Per GPU type, the replicas in decreasing share order (ties by name and replica number) are dealt
    round-robin, so every chunk holds the same mix of sizes as the whole: the same packing quality
    as one chunk of that size, whatever the fleet's size.
    """
    size = size or CHUNK_REPLICAS
    by_type: dict[str, list[tuple[Item, str]]] = {}
    for pair in pairs:
        by_type.setdefault(pair[1], []).append(pair)
    chunks: list[list[tuple[Item, str]]] = []
    for gpu_type in sorted(by_type):
        ordered = sorted(by_type[gpu_type], key=lambda pair: (-pair[0].min_share, pair[0].key))
        count = math.ceil(len(ordered) / size)
        chunks += [ordered[j::count] for j in range(count)]
    return chunks


def pack_chunk(
    caches: dict[str, PointCache], chunk: Sequence[tuple[Item, str]]
) -> list[tuple[list[Item], list[float]]]:
    """Best fit decreasing, then the local search (a budget in proportion to the chunk), on fresh GPUs of one type
    without a count limit: each GPU's (replicas, shares). Pure and deterministic, so chunks may be
    packed in any order or in other processes."""
    packing = Packing(caches, {gpu_type: None for _, gpu_type in chunk})
    for item, gpu_type in chunk:
        _place(packing, item, gpu_type)
    _local_search(packing, CHUNK_SEARCH_PER_REPLICA * len(chunk))
    return [(b.items, b.shares) for b in packing.bins.values()]


def _pack_in_chunks(packing: Packing, pairs: list[tuple[Item, str]]) -> None:
    """Large instances: pack chunks of similar mix apart (time linear in the replicas, and the budget
    of the local search grows with them), then let the local search empty the chunks' lightest GPUs
    into each other's."""
    for chunk in deal_chunks(pairs):
        gpu_type = chunk[0][1]
        for items, shares in pack_chunk(packing.caches, chunk):
            packing.open_bin(gpu_type, items, shares)
    _local_search(packing, SEARCH_EVALUATIONS)


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


#: A GPU of a current plan as an earlier solve seeded it: the GPU, the replicas it took (one per placement, in
#: order), what it kept of them with their shares, and the replicas' keys (`SolveMemo.reseeded`).
Reseeded = tuple[GpuPlan, tuple[Item, ...], tuple[tuple[Item, ...], tuple[float, ...]], tuple[tuple[str, int], ...]]


def placed_as(item: Item, p: Placement) -> bool:
    """Whether placement `p` can be this replica's (its batch and rate): how a re-plan matches the plan that runs,
    in a full solve (`_seed_from`) and a local one (`planner.solver.replan`) alike."""
    return item.batch == p.batch and abs(item.rate_rps - p.rate_rps) <= 1e-6


def _seed_from(
    packing: Packing,
    current: Plan,
    pending: dict[tuple[str, int], tuple[Item, str]],
    memo: SolveMemo | None = None,
    origins: dict[int, GpuPlan] | None = None,
) -> set[int]:
    """Re-use the current plan's GPUs, in order and with their keys, for the workloads they hold.

    Returns the ids of the GPUs that hold exactly what they held (nothing for the search to do
    there); `origins`, when given, gets each GPU opened with the GPU of `current` it was seeded
    from. With a `memo`, a GPU whose placements would take the same replicas as in an earlier
    solve takes that solve's shares instead of checking its co-location again (the same check, the
    same answer)."""
    untouched: set[int] = set()
    # A placement takes the pending replica of its workload with its rate and batch (replica numbers
    # follow GPU order, so they need not match), else the one with its number. A replica is free
    # while it is pending and no placement took it.
    by_name: dict[str, list[tuple[str, int]]] = {}
    for replica in pending:
        by_name.setdefault(replica[0], []).append(replica)
    taken: set[tuple[str, int]] = set()

    def pick(p: Placement, also: tuple[tuple[str, int], ...] = ()) -> tuple[str, int] | None:
        """The key of the free replica `p` takes (`also`: keys taken on the GPU at hand, not yet in `taken`)."""
        own = (p.name, p.replica)
        found = pending.get(own)
        own_free = found is not None and own not in taken and own not in also
        if found is not None and own_free and placed_as(found[0], p):
            return own  # the usual case: its own number
        for k in by_name.get(p.name, ()):
            if k not in taken and k not in also:
                item = pending[k][0]
                if placed_as(item, p):
                    return k
        return own if own_free else None

    def match(p: Placement, gpu_type: str) -> Item | None:
        same = pick(p)
        if same is None or pending[same][1] != gpu_type:
            return None
        taken.add(same)
        return pending[same][0]

    def unchanged(entry: Reseeded) -> bool:
        """Whether `match` would take each of this GPU's replicas again, as it did in an earlier solve
        (the same keys, still free with the same replica objects); then takes them."""
        gpu, items, keys = entry[0], entry[1], entry[3]
        for k, (p, item, key) in enumerate(zip(gpu.placements, items, keys)):
            found = pending.get(key)
            if found is None or found[0] is not item or found[1] != gpu.gpu_type or key in taken:
                return False
            # its own number (the usual case) is what `pick` takes for the same placement and replica
            if key[1] != p.replica and pick(p, keys[:k]) != key:
                return False
        taken.update(keys)
        return True

    reseeded = memo.reseeded if memo is not None else {}
    unlimited = {t for t, limit in packing.limits.items() if limit is None}
    for gpu in current.gpus:
        gpu_type = gpu.gpu_type
        if gpu_type not in unlimited and (gpu_type not in packing.caches or not packing.can_open(gpu_type)):
            continue
        # With a memo, a GPU whose placements an earlier solve was given (the same objects: the controller
        # hands back the plan it was answered, its GPUs keyed by their slots) and whose replicas are all still
        # as they were is taken as it was: at 10,000 workloads nearly every GPU, and half of a re-plan's time
        # went into matching them.
        entry = reseeded.get(id(gpu.placements))
        if (
            entry is not None
            and entry[0].placements is gpu.placements
            and entry[0].gpu_type == gpu_type
            and unchanged(entry)
        ):
            seeded = entry[2]
            for key in entry[3] if seeded[0] is entry[1] else (item.key for item in seeded[0]):
                del pending[key]
        else:
            seeded = _seed_gpu(packing, gpu, match, memo)
            for item in seeded[0]:
                del pending[item.key]
        if seeded[0]:
            b = packing.open_bin(gpu_type, list(seeded[0]), list(seeded[1]), key=gpu.key)
            if origins is not None:
                origins[b.id] = gpu
            if len(seeded[0]) == len(gpu.placements):
                untouched.add(b.id)
    return untouched


def _seed_gpu(
    packing: Packing,
    gpu: GpuPlan,
    match: Callable[[Placement, str], Item | None],
    memo: SolveMemo | None,
) -> tuple[tuple[Item, ...], tuple[float, ...]]:
    """The replicas (matched by `match`) a GPU of the current plan keeps, with their shares."""
    candidates = tuple(item for item in (match(p, gpu.gpu_type) for p in gpu.placements) if item is not None)
    seeded = seed_candidates(packing, gpu.gpu_type, candidates, memo)
    if memo is not None and len(candidates) == len(gpu.placements):
        # every placement took a replica: the next solve takes them again while `match` would (`unchanged`)
        memo.reseeded[id(gpu.placements)] = (gpu, candidates, seeded, tuple(item.key for item in candidates))
    return seeded


def seed_candidates(
    packing: Packing, gpu_type: str, candidates: tuple[Item, ...], memo: SolveMemo | None
) -> tuple[tuple[Item, ...], tuple[float, ...]]:
    """The replicas a GPU of the current plan keeps of `candidates` (its placements' replicas, in order), with
    their shares."""
    # by identity (cheap to hash): a memo's replicas are the same objects solve after solve, and the
    # entry holds them, so their ids stay theirs
    key = (gpu_type, tuple(map(id, candidates)))
    seeded = memo.seeded.get(key) if memo is not None else None
    if seeded is None:
        cache = packing.caches[gpu_type]
        # all of them together from their minimum shares (a share the SLO guard raised comes back
        # down when its floor goes), else one by one, dropping those that no longer fit
        together = colocate(cache, candidates)
        if together is not None:
            seeded = (candidates, tuple(together[0]))
        else:
            items: list[Item] = []
            shares: list[float] = []
            for item in candidates:
                fitted = colocate(cache, items + [item], shares + [item.min_share])
                if fitted is not None:
                    items, shares = items + [item], fitted[0]
            seeded = (tuple(items), tuple(shares))
        if memo is not None:
            memo.seeded[key] = seeded
            memo.held.append(candidates)
    return seeded


class SolveMemo:
    """What one stoke solve hands the next, for re-planning a large fleet after a small change.

    Per workload (its whole value: a changed rate is another key) the replicas and GPU type
    chosen; per GPU of the current plan, the shares its replicas were seeded with; per GPU of a
    plan, its finished placements. Every entry is what the solve would compute again from the same
    inputs, so a solve with a memo returns the plan it returns without one, only sooner. The caller
    keeps the memo (the controller's solver worker holds one across solves), so the solver stays a
    function of what it is given. It is emptied when the GPU types (names, prices, profiles) or the
    options change, and trimmed to the workloads of the last solve when it grows past them (a GPU
    type's `ReplicaMemo` too: each new rate of a workload is a new entry there).
    """

    def __init__(self) -> None:
        self._basis: Any = None
        self.clear()

    def clear(self) -> None:
        self.caches: dict[str, PointCache] = {}
        self.replicas: dict[str, ReplicaMemo] = {}
        self.choices: dict[Workload, tuple[str, tuple[Item, ...]]] = {}
        self.seeded: dict[tuple[Any, ...], tuple[tuple[Item, ...], tuple[float, ...]]] = {}
        self.placements: dict[tuple[Any, ...], tuple[Placement, ...]] = {}
        #: per (placements, key, price): the GPU of the plan, the same object solve after solve (a caller that
        #: sends plans elsewhere, the controller's solver worker, recognises it by identity)
        self.gpus: dict[tuple[int, str | None, float], GpuPlan] = {}
        self.renumbered: dict[tuple[int, int, int], Item] = {}
        #: per GPU of a current plan (by the identity of its placements, held with the GPU): the replicas it was
        #: seeded with and their shares (`_seed_from` takes them again while `match` would)
        self.reseeded: dict[int, Reseeded] = {}
        #: the replicas whose ids key `seeded` and `placements`: held, so that no other object takes an id
        self.held: list[tuple[Item, ...]] = []
        #: the last solve's packing, for a local re-plan after a small change (`planner.solver.replan`)
        self.last: Any = None

    def _forget_identities(self) -> None:
        """Drop the entries keyed by object identity (and the objects held for them): they grow with every
        re-plan that changes something, and a rebuilt entry gives the same answer."""
        self.seeded, self.placements, self.gpus, self.renumbered, self.held = {}, {}, {}, {}, []
        self.reseeded = {}

    def open(self, problem: Problem, options: StokeOptions) -> None:
        """Ready for a solve of `problem`: valid entries kept, stale ones dropped."""
        basis = (tuple((g.name, g.price_per_hour, g.profile) for g in problem.inventory), options)
        if basis != self._basis:
            self._basis = basis
            self.clear()
        bound = 4 * len(problem.workloads) + 1000
        if len(self.choices) > 2 * len(problem.workloads) + 1000:
            names = set(problem.workloads)
            self.choices = {w: c for w, c in self.choices.items() if w in names}
            self._forget_identities()
        if len(self.held) > bound or len(self.reseeded) > bound:
            self._forget_identities()
        for g in problem.inventory:
            if g.name not in self.caches:
                self.caches[g.name] = PointCache(g)
            # a rate or floor that changes solve after solve (demand, the SLO guard) is a new entry each time
            if g.name not in self.replicas or len(self.replicas[g.name]) > 8 * len(problem.workloads) + 1000:
                self.replicas[g.name] = ReplicaMemo(self.caches[g.name], options)


@dataclass(frozen=True)
class FinalPacking:
    """A full solve's final packing, for `planner.solver.replan` to keep: the bins (replicas as chosen), each
    bin's replicas as the plan numbers them, and each bin seeded from a GPU of `current`, that GPU."""

    packing: Packing
    numbered: list[list[Item]]
    origins: dict[int, GpuPlan]


def solve_stoke(
    problem: Problem,
    current: Plan | None = None,
    options: StokeOptions = DEFAULT_OPTIONS,
    memo: SolveMemo | None = None,
) -> Plan:
    return solve_stoke_packing(problem, current, options, memo)[0]


def solve_stoke_packing(
    problem: Problem,
    current: Plan | None = None,
    options: StokeOptions = DEFAULT_OPTIONS,
    memo: SolveMemo | None = None,
) -> tuple[Plan, FinalPacking | None]:
    """The plan, and its final packing when a local re-plan may start from it: none when the exact search
    replaced the bins, or when a replica spilled onto another GPU type (no workload's choice: every solve places
    it afresh)."""
    if memo is not None:
        memo.open(problem, options)
        caches, memos = dict(memo.caches), dict(memo.replicas)
    else:
        caches = {g.name: PointCache(g) for g in problem.inventory}
        memos = {g.name: ReplicaMemo(caches[g.name], options) for g in problem.inventory}
    packing = Packing(caches, {g.name: g.max_count for g in problem.inventory})
    pending: dict[tuple[str, int], tuple[Item, str]] = {}
    for choice in choose_all(problem.workloads, problem, packing, options, memo, memos):
        for item in choice[1]:
            pending[item.key] = (item, choice[0])
    seeded: dict[int, int] = {}  # GPU id -> replicas, for the current plan's GPUs that hold what they held
    origins: dict[int, GpuPlan] = {}
    if current is not None:
        untouched = _seed_from(packing, current, pending, memo, origins)
        seeded = {b_id: len(packing.bins[b_id].items) for b_id in untouched}
    if (
        current is None
        and len(pending) > CHUNK_REPLICAS
        and all(packing.limits[t] is None for _, t in pending.values())
    ):
        _pack_in_chunks(packing, list(pending.values()))
        pending = {}
    spilled = place_all(packing, sorted(pending.values(), key=lambda pair: -pair[0].min_share), problem, options, memos)
    # Re-planning: the GPUs that hold what they held were searched when that plan was made; only the
    # changed ones are emptied (which keeps the rest where it runs). Count is enough: replicas only arrive.
    _local_search(packing, SEARCH_EVALUATIONS, keep=lambda b: seeded.get(b.id) == len(b.items))

    notes: list[str] = []
    bins = list(packing.bins.values())
    numbered = _renumber(bins, memo)
    types = {b.gpu_type for b in bins}
    all_items = [i for items in numbered for i in items]
    replaced = False
    if current is None and len(types) == 1 and len(all_items) <= EXACT_LIMIT:
        gpu_type = types.pop()
        exact = _exact(packing.caches[gpu_type], all_items)
        if exact is not None and len(exact) < len(bins):
            cache = packing.caches[gpu_type]
            bins = [Bin(k, gpu_type, group, _fitted_shares(cache, group)) for k, group in enumerate(exact)]
            numbered, replaced = [b.items for b in bins], True
            notes.append(f"exact search: {len(exact)} GPU(s) is the fewest for these workloads")
        elif exact is not None:
            notes.append(f"exact search confirms {len(bins)} GPU(s) is the fewest")
    elif len(types) == 1 and bins:
        notes.append(bound_note(Counter(i.min_share for i in all_items), len(bins)))
    plan = _to_plan(problem, packing.caches, bins, numbered, tuple(notes), memo)
    return plan, (None if replaced or spilled else FinalPacking(packing, numbered, origins))


def choose_all(
    workloads: Sequence[Workload],
    problem: Problem,
    packing: Packing,
    options: StokeOptions,
    memo: SolveMemo | None,
    memos: dict[str, ReplicaMemo],
) -> list[tuple[str, tuple[Item, ...]]]:
    """Each workload's GPU type and replicas (numbered), from the memo where it holds them."""
    known = memo.choices if memo is not None else {}
    chosen = [known.get(w) for w in workloads]
    fresh = [w for w, choice in zip(workloads, chosen) if choice is None]
    singles: dict[tuple[str, str], Item | None] = {}
    for g in problem.inventory:
        allowed = [w for w in fresh if g in allowed_types(w, problem.inventory)]
        for w, item in zip(allowed, best_candidates(allowed, packing.caches[g.name], options)):
            singles[(g.name, w.name)] = item
        memos[g.name].prepare([w for w in allowed if singles[(g.name, w.name)] is None])
    out = []
    for workload, choice in zip(workloads, chosen):
        if choice is None:
            gpu_type, items = _choose_type(workload, problem, packing, options, singles=singles, memos=memos)
            choice = (gpu_type, tuple(with_replicas(items)))
            if memo is not None:
                memo.choices[workload] = choice
        out.append(choice)
    return out


def place_all(
    packing: Packing,
    pairs: Sequence[tuple[Item, str]],
    problem: Problem,
    options: StokeOptions,
    memos: dict[str, ReplicaMemo],
) -> bool:
    """Best fit of each replica (in the order given) on its GPU type; out of GPUs of that type, the rate it should
    have served goes to the next cheapest allowed type, sized for that type (it may need several replicas there).
    Returns whether any did (such replicas are no workload's choice: the next solve places them afresh)."""
    spilled: dict[str, list[str]] = {}
    for item, gpu_type in pairs:
        if _place(packing, item, gpu_type):
            continue
        full = spilled.setdefault(item.workload.name, [gpu_type])
        remaining = item.rate_rps
        while remaining > EPS:
            part = replace(item.workload, rate_rps=remaining)
            other, items = _choose_type(part, problem, packing, options, exclude=full, memos=memos)
            for replica in items:
                if not _place(packing, replica, other):
                    full.append(other)
                    break
                remaining -= replica.rate_rps
    return bool(spilled)


def share_lower_bound(shares: Sequence[float]) -> int:
    """Fewest GPUs any packing needs for replicas of these minimum shares (interference only adds share).

    The larger of the total share in whole GPUs and the count of replicas over half a GPU (no two
    of them share one); a cheap bound, reported beside heuristic plans too big for the exact search.
    """
    return counted_lower_bound(Counter(shares))


def counted_lower_bound(shares: Counter[float]) -> int:
    """`share_lower_bound` of the shares counted by value. The sum is exact (rounded once), so a bound kept up
    to date change by change is the bound computed afresh."""
    total = math.fsum(itertools.chain.from_iterable(itertools.repeat(s, n) for s, n in shares.items() if n > 0))
    over_half = sum(n for s, n in shares.items() if s > 50.0 + EPS)
    return max(math.ceil(total / 100.0 - EPS), over_half, 1 if +shares else 0)


def bound_note(shares: Counter[float], gpus: int) -> str:
    """The plan's note on its lower bound (`counted_lower_bound` of its replicas' minimum shares)."""
    bound = counted_lower_bound(shares)
    gap = gpus / bound - 1.0
    return (
        f"lower bound {bound} GPU(s) from the replicas' own shares (no packing can do better, interference "
        f"aside); this plan uses {gpus} ({gap:+.1%})"
    )


def _fitted_shares(cache: PointCache, group: list[Item]) -> list[float]:
    fitted = colocate(cache, group)
    assert fitted is not None, "the exact search only returns groups that fit"
    return fitted[0]


def _renumber(bins: list[Bin], memo: SolveMemo | None = None) -> list[list[Item]]:
    """Each GPU's replicas numbered 0..n-1 per workload with their counts, in GPU order (spilling can change n):
    the GPU's own list where nothing changes. The GPUs keep the replicas as chosen (a re-plan matches those).

    With a memo, a replica renumbered the same way as in an earlier solve is that solve's object
    (so the memo's identity keys find it again)."""
    counts = Counter([i.workload.name for b in bins for i in b.items])  # 11,000 at 10,000 workloads
    several = {name for name, n in counts.items() if n > 1}  # most workloads have one replica: number 0 of 1
    seen: dict[str, int] = {}
    out = []
    for b in bins:
        items = b.items
        numbered: list[Item] | None = None
        for k, i in enumerate(items):
            name = i.workload.name
            if name in several:
                n = seen.get(name, 0)
                seen[name] = n + 1
                count = counts[name]
            elif i.replica == 0 and i.replicas == 1:
                continue
            else:
                n, count = 0, 1
            if i.replica != n or i.replicas != count:
                if numbered is None:
                    numbered = list(items)
                numbered[k] = numbered_as(i, n, count, memo)
        out.append(items if numbered is None else numbered)
    return out


def numbered_as(item: Item, n: int, count: int, memo: SolveMemo | None) -> Item:
    """`item` as replica `n` of `count` (the memo's object when an earlier solve made it)."""
    key = (id(item), n, count)
    found = memo.renumbered.get(key) if memo is not None else None
    if found is None:
        found = replace(item, replica=n, replicas=count)
        if memo is not None:
            memo.renumbered[key] = found
            memo.held.append((item,))
    return found


def _to_plan(
    problem: Problem,
    caches: dict[str, PointCache],
    bins: list[Bin],
    numbered: list[list[Item]],
    notes: tuple[str, ...],
    memo: SolveMemo | None = None,
) -> Plan:
    prices = {g.name: g.price_per_hour for g in problem.inventory}
    gpus = [gpu_plan(caches, b, items, prices[b.gpu_type], memo) for b, items in zip(bins, numbered)]
    return Plan(strategy="stoke", gpus=tuple(gpus), notes=notes)


def gpu_plan(caches: dict[str, PointCache], b: Bin, items: list[Item], price: float, memo: SolveMemo | None) -> GpuPlan:
    """The plan's GPU of bin `b`, its replicas numbered as `items` (the memo's objects where they are the same)."""
    key = (b.gpu_type, tuple(map(id, items)), tuple(b.shares))  # by identity, as in `_seed_from`
    placements = memo.placements.get(key) if memo is not None else None
    if placements is None:
        predictions = caches[b.gpu_type].predict(items, b.shares)
        order = sorted(range(len(items)), key=lambda k: (-b.shares[k], items[k].key))
        placements = tuple(to_placement(caches[b.gpu_type], items[k], b.shares[k], predictions[k]) for k in order)
        if memo is not None:
            memo.placements[key] = placements
            memo.held.append(tuple(items))
    gpu = memo.gpus.get((id(placements), b.key, price)) if memo is not None else None
    if gpu is None:
        gpu = GpuPlan(gpu_type=b.gpu_type, price_per_hour=price, key=b.key, placements=placements)
        if memo is not None:  # its placements are held (by `placements`), so their id stays theirs
            memo.gpus[(id(placements), b.key, price)] = gpu
    return gpu
