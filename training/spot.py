"""Heterogeneous spot provisioner (spotDNN shape): pure, estimate-then-optimise.

Formulation. Worker types t = 1..T with quota q_t, survivors e_t (instances
already running after a revocation, kept in every candidate) and capacity
lost to revocations u_t. Choose counts c with e_t <= c_t <= q_t - u_t and
n = sum c in [n_lower, n_upper] minimising

    cost(c) = T(c) * sum_t c_t * price_t / 3600   subject to   T(c) <= deadline

where T(c) = j(b_w, R, n) * T_exp(c) (+ recovery overhead T_ohd when
re-planning) from `training.models.evaluate_spot`.

Bounds. n_upper = floor(((1 - b1)/a1)^2), the largest cluster the fitted
contention P(n) covers (P < 1), capped by the quota. For each n, a valid lower
bound on T is j_min(n) * min_t T_t(n) / n (j_min over the corners of the
b_w and R ranges); sizes whose bound exceeds the deadline are skipped, so
n_lower is the first size that survives.

Search. `exact` enumerates every count vector inside the bounds (the
candidate table) and evaluates it in one vectorised call; it is used while
the table has at most `exact_limit` rows. `window` is the published
heuristic: instances (expanded by quota) sorted by iteration time, a window
of n - |survivors| slid over the list, survivors added to each window. Both
keep the cheapest candidate that meets the deadline; with none, the plan is
infeasible and says by how much the fastest candidate misses the deadline.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np
import numpy.typing as npt

from training.models import BOTTLENECK_TEXT, BOTTLENECKS, Array, SpotJob, TrainingError, evaluate_spot
from training.spec import TrainingPlan, TrainingSpec

DEFAULT_EXACT_LIMIT = 300_000
Counts = npt.NDArray[np.int64]  # instance counts per worker type (vectors, or a table of them)


@dataclass(frozen=True)
class SpotState:
    """What is running now: survivors per type and capacity lost to revocations per type."""

    existing: Mapping[str, int] = field(default_factory=dict)
    revoked: Mapping[str, int] = field(default_factory=dict)
    remaining: float = 1.0  # fraction of the training still to do
    replan: bool = False  # add the recovery overhead


def _arrays(spec: TrainingSpec, job: SpotJob) -> tuple[Array, Array, Array, Array]:
    batch = np.array([w.batch for w in spec.workers], dtype=float)
    speed = np.array([w.speed for w in spec.workers], dtype=float)
    gpus = np.array([w.gpus for w in spec.workers], dtype=float)
    price = np.array([w.price_per_hour for w in spec.workers], dtype=float)
    return batch, job.compute_time(batch, speed), gpus, price


def count_vectors(lower: Counts, upper: Counts, max_total: int) -> int:
    """How many integer vectors lower <= c <= upper have sum(c) <= max_total (a DP, no enumeration)."""
    ways = np.zeros(max_total + 1, dtype=float)
    base = int(lower.sum())
    if base > max_total:
        return 0
    ways[base] = 1.0
    for lo, hi in zip(lower, upper):
        width = int(hi - lo)
        new = np.zeros_like(ways)
        for extra in range(min(width, max_total) + 1):
            new[extra:] += ways[: len(ways) - extra]
        ways = new
    return int(ways.sum())


def enumerate_vectors(
    lower: npt.ArrayLike, upper: npt.ArrayLike, min_total: int, max_total: int, *, by_type: bool = False
) -> Counts:
    """All integer vectors lower <= c <= upper with min_total <= sum(c) <= max_total.

    Rows (K, T), or with `by_type` the transposed (T, K) table the
    vectorised evaluation prefers.

    Built one type at a time: each partial row is repeated once per value
    the next type may take without the sum exceeding max_total (vectorised).
    """
    low: Counts = np.asarray(lower, dtype=np.int64)
    high: Counts = np.asarray(upper, dtype=np.int64)
    rest_min = np.concatenate([np.cumsum(low[::-1])[::-1][1:], [0]]).astype(np.int64)
    columns: list[Counts] = []
    sums = np.zeros(1, dtype=np.int64)
    for t in range(len(low)):
        room = np.minimum(high[t], max_total - rest_min[t] - sums) - low[t]
        keep = room >= 0
        if not keep.any():
            return np.zeros((len(low), 0) if by_type else (0, len(low)), dtype=np.int64)
        reps = room[keep] + 1
        parent = np.repeat(np.nonzero(keep)[0], reps)
        starts = np.cumsum(reps) - reps
        values = np.arange(int(reps.sum()), dtype=np.int64) - np.repeat(starts, reps) + low[t]
        columns = [c[parent] for c in columns] + [values]
        sums = sums[parent] + values
    ok = sums >= min_total
    table: Counts = np.vstack([c[ok] for c in columns]) if columns else np.zeros((0, int(ok.sum())), dtype=np.int64)
    return table if by_type else np.ascontiguousarray(table.T)


def window_vectors(order_times: Array, lower: Counts, upper: Counts, n_values: list[int]) -> Counts:
    """The published sliding-window candidates: windows over the extra instances sorted by iteration time."""
    order = np.argsort(order_times, kind="stable")
    extra = upper - lower
    pool = (
        np.concatenate([np.full(int(extra[t]), t, dtype=np.int64) for t in order])
        if extra.sum()
        else np.zeros(0, dtype=np.int64)
    )
    rows = []
    base = int(lower.sum())
    for n in n_values:
        size = n - base
        if size < 0 or size > len(pool):
            continue
        if size == 0:
            rows.append(lower.copy())
            continue
        onehot = np.zeros((len(pool), len(lower)), dtype=np.int64)
        onehot[np.arange(len(pool)), pool] = 1
        csum = np.vstack([np.zeros((1, len(lower)), dtype=np.int64), np.cumsum(onehot, axis=0)])
        windows = csum[size:] - csum[:-size]
        rows.extend(windows + lower)
    if not rows:
        return np.zeros((0, len(lower)), dtype=np.int64)
    return np.unique(np.asarray(rows, dtype=np.int64), axis=0)


def provision_spot(
    spec: TrainingSpec, state: SpotState | None = None, *, search: str = "auto", exact_limit: int = DEFAULT_EXACT_LIMIT
) -> TrainingPlan:
    """Cheapest heterogeneous spot cluster that reaches the target loss by the deadline (see module doc)."""
    if spec.spot is None:
        raise TrainingError("spec lacks the 'spot' section (bandwidths, contention, loss coefficients)")
    if search not in ("auto", "exact", "window"):
        raise TrainingError(f"unknown search {search!r}; use auto, exact or window")
    if spec.ps.type == "same":
        raise TrainingError(
            "the spot strategy runs one on-demand parameter server beside spot workers of "
            "several types; give ps.type an instance type (e.g. m5.xlarge) instead of 'same'"
        )
    if spec.sync != "asp":
        raise TrainingError(
            f"job.sync is {spec.sync!r}, but the spot strategy models asynchronous (ASP) training only: "
            "set job.sync: asp, or plan BSP with --strategy homogeneous"
        )
    state = state or SpotState()
    job = spec.spot
    names = [w.type for w in spec.workers]
    for counts in (state.existing, state.revoked):
        unknown = sorted(set(counts) - set(names))
        if unknown:
            raise TrainingError(f"instances of type {', '.join(unknown)} are not among the spec's workers")
    batch, comp, gpus, price = _arrays(spec, job)
    lower = np.array([state.existing.get(t, 0) for t in names], dtype=np.int64)
    upper = np.array([max(w.quota - state.revoked.get(w.type, 0), 0) for w in spec.workers], dtype=np.int64)
    upper = np.maximum(upper, lower)
    overhead = spec.recovery_overhead_s if state.replan else 0.0
    remaining = float(state.remaining)

    n_cap = min(job.max_workers(), int(upper.sum()))
    n_min = max(1, int(lower.sum()))
    # Deadline bound per size n: j_min(n) * min_t T_t(n) / n + overhead.
    sizes = np.arange(1, max(n_cap, 1) + 1)
    t_types = job.iteration_times(comp, gpus, sizes)  # (n, T)
    b_range = (batch.min(), batch.max())
    j_min = np.min([job.loss.iterations(b, r, sizes, job.target_loss) for b in b_range for r in (0.0, 1.0)], axis=0)
    t_bound = np.maximum(j_min, 0.0) * remaining * t_types.min(axis=1) / sizes + overhead
    feasible_sizes = [int(n) for n in sizes if n_min <= n <= n_cap and t_bound[n - 1] <= spec.deadline_s]
    n_lower = feasible_sizes[0] if feasible_sizes else None

    details: dict[str, Any] = {"n_lower": n_lower, "n_upper": n_cap, "recovery_overhead_s": overhead}
    mode = search
    table = np.zeros((len(names), 0), dtype=np.int64)  # candidates, one column each
    if feasible_sizes:
        table_size = count_vectors(lower, upper, feasible_sizes[-1])
        if mode == "auto":
            mode = "exact" if table_size <= exact_limit else "window"
        if mode == "exact":
            table = enumerate_vectors(lower, upper, feasible_sizes[0], feasible_sizes[-1], by_type=True)
            allowed = np.zeros(feasible_sizes[-1] + 1, dtype=bool)
            allowed[feasible_sizes] = True
            table = table[:, allowed[table.sum(axis=0)]]
        else:
            table = np.ascontiguousarray(window_vectors(t_types[0], lower, upper, feasible_sizes).T)
    elif mode == "auto":
        mode = "exact"

    existing = tuple((t, int(c)) for t, c in zip(names, lower) if c)
    plan = partial(
        TrainingPlan,
        strategy="spot",
        job=spec.name,
        ps_type=spec.ps.type,
        ps_count=1,
        deadline_s=spec.deadline_s,
        target_loss=spec.target_loss,
        existing=existing,
        candidates=int(table.shape[1]),
        search=mode,
    )
    out = (
        evaluate_spot(job, batch, comp, gpus, price, table, overhead_s=overhead, remaining=remaining, by_type=True)
        if table.shape[1]
        else {}
    )
    meets = out["time"] <= spec.deadline_s + 1e-9 if out else np.zeros(0, dtype=bool)
    if meets.any():
        cost = np.where(meets, out["cost"], np.inf)
        # Cheapest; ties go to the fewer workers, then the faster plan (deterministic).
        tied = np.flatnonzero(cost <= cost.min() * (1 + 1e-12))
        best = int(tied[np.lexsort((out["time"][tied], out["n"][tied]))[0]])
        code = BOTTLENECKS[int(out["bottleneck"][best])]
        details.update(
            {
                "iterations": int(out["j"][best]),
                "t_exp_s": round(float(out["t_exp"][best]), 6),
                "b_w": round(float(out["b_w"][best]), 3),
                "R": round(float(out["R"][best]), 6),
                "explanation": BOTTLENECK_TEXT[code],
            }
        )
        return plan(
            feasible=True,
            counts=tuple((t, int(c)) for t, c in zip(names, table[:, best])),
            predicted_time_s=float(out["time"][best]),
            predicted_cost=float(out["cost"][best]),
            bottleneck=code,
            details=details,
        )

    reason = _infeasible_reason(spec, job, (batch, comp, gpus, price), lower, upper, n_min, n_cap, overhead, remaining)
    return plan(
        feasible=False,
        counts=tuple((t, int(c)) for t, c in zip(names, lower)),
        predicted_time_s=math.inf,
        predicted_cost=math.inf,
        reason=reason,
        details=details,
    )


def _infeasible_reason(
    spec: TrainingSpec,
    job: SpotJob,
    per_type: tuple[Array, Array, Array, Array],
    lower: Counts,
    upper: Counts,
    n_min: int,
    n_cap: int,
    overhead: float,
    remaining: float,
) -> str:
    """Say by how much the fastest cluster within the quota misses the deadline."""
    batch, comp, gpus, price = per_type
    if n_min > n_cap and not lower.sum():  # nothing runs: the quotas (less the revoked) allow no worker
        return (
            "no worker may be launched: the quotas, less any revoked instances, allow none; raise workers.<type>.quota"
        )
    if n_min > n_cap:
        return (
            f"the {n_min} instances already running exceed the {n_cap} workers the contention model "
            f"covers (P(n) < 1); add a parameter server or lower the worker count"
        )
    if spec.target_loss <= job.loss.g5:
        return (
            f"target loss {spec.target_loss} is below the loss floor {job.loss.g5:.4g} of the fitted "
            f"curve; raise job.target_loss"
        )
    # Fastest cluster: the exact table when small, else windows (the quota's fastest instances first).
    if count_vectors(lower, upper, n_cap) <= DEFAULT_EXACT_LIMIT:
        rows = enumerate_vectors(lower, upper, n_min, n_cap)
    else:
        rows = window_vectors(job.iteration_times(comp, gpus, 1)[0], lower, upper, list(range(n_min, n_cap + 1)))
    if not len(rows):
        return "the quota leaves no worker to run; raise workers.<type>.quota"
    out = evaluate_spot(job, batch, comp, gpus, price, rows, overhead_s=overhead, remaining=remaining)
    best = int(np.argmin(out["time"]))
    fastest = float(out["time"][best])
    if not math.isfinite(fastest):
        return "no cluster within the quota reaches the target loss; raise job.target_loss"
    mix = ", ".join(f"{c} x {w.type}" for w, c in zip(spec.workers, rows[best]) if c)
    return (
        f"deadline {spec.deadline_s:.0f} s is {fastest - spec.deadline_s:.0f} s below what the quota can "
        f"reach (fastest: {fastest:.0f} s with {mix}); raise job.deadline_s to at least {math.ceil(fastest)} "
        f"or the quotas"
    )
