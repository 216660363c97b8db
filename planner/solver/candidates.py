"""Shared machinery of the strategies: solo points, latency targets and co-location.

Estimate, then optimise: every strategy builds, per workload and GPU type, a
candidate (batch, minimum share) from the solo model, and then asks
`colocate` whether a set of candidates fits one GPU, raising the share of
each workload that misses its target one step at a time (the published
iGniter rule) until all meet it or the GPU's shares pass 100%.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from numpy.typing import NDArray

from interference.batching import (
    MAX_UTILISATION,
    BatchingTable,
    CurveSet,
    batching_shape,
    delay_mode,
    end_to_end_p99_ms,
)
from interference.batching import table as batching_table
from interference.latency import Prediction, SoloPoint, VectorPredictor, predict_points, share_steps, solo_point
from planner.bounds import MAX_BATCH as MAX_BATCH  # the largest batch any strategy considers (the profiled range)
from planner.solver.problem import GpuType, Placement, ProblemError, Workload

EPS = 1e-9


@dataclass(frozen=True, slots=True)
class Target:
    """iGniter's target: co-located inference latency t_inf <= `latency_budget_ms`, throughput >= rate."""

    latency_budget_ms: float
    rate_rps: float

    def met_by(self, cache: PointCache, prediction: Prediction, share: float) -> bool:
        return (
            prediction.latency_ms <= self.latency_budget_ms + EPS and prediction.throughput_rps >= self.rate_rps - EPS
        )

    def met_by_arrays(self, latency_ms: Any, throughput_rps: Any) -> Any:
        """Vectorised check over arrays of predicted latency and throughput."""
        return (latency_ms <= self.latency_budget_ms + EPS) & (throughput_rps >= self.rate_rps - EPS)


LOGIT_START, LOGIT_STEP = BatchingTable.LOGIT_START, BatchingTable.LOGIT_STEP


@dataclass(frozen=True, slots=True)
class P99Target:
    """stoke's target: the replica's p99 latency within `latency_budget_ms`, utilisation within the cap.

    The p99 comes from the batching model (`interference.batching`) of the
    replica's queue: its rate, max batch, queue delay and arrival kind, with
    the co-located prediction at the planned batch as O(B) and L(B). Poisson
    queues read the interpolated table curve of their (batch, share, delay
    mode); paced queues use the exact closed form L(B) + (B-1)/rate.
    """

    latency_budget_ms: float
    rate_rps: float
    batch: int
    queue_delay_ms: float
    model: str
    paced: bool = False
    max_utilisation: float = MAX_UTILISATION
    #: Check the budget and the cap with L and O raised to the profile's error bound at the point
    #: (`PointCache.raised`), not with the central prediction.
    error_bound: bool = False
    mode: str = field(init=False)  # the batching table's delay mode, fixed by the fields above
    #: share -> this queue's table curves at that share (filled on use: the hot path of `colocate`)
    _curves: dict[tuple[float, bool], tuple[list[float], list[float]]] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        mode = "paced" if self.paced else delay_mode(self.batch, self.rate_rps, self.queue_delay_ms)
        object.__setattr__(self, "mode", mode)
        object.__setattr__(self, "_curves", {})

    def p99_ms(self, cache: PointCache, prediction: Prediction, share: float, upper: bool = False) -> float:
        """The request's p99 end to end: the batching queue's, plus the serving path (`end_to_end_p99_ms`).
        `upper`: on the upper service curve (`PointCache.upper_lines`; `prediction` raised by the caller)."""
        return float(
            end_to_end_p99_ms(self._batch_p99_ms(cache, prediction, share, upper), *cache.outside_batch_ms(self.model))
        )

    def _batch_p99_ms(self, cache: PointCache, prediction: Prediction, share: float, upper: bool) -> float:
        latency, throughput = prediction.latency_ms, prediction.throughput_rps
        utilisation = self.rate_rps / throughput
        if self.paced:
            return latency + 1000.0 * (self.batch - 1) / self.rate_rps if utilisation <= 1.0 + EPS else math.inf
        if utilisation > MAX_UTILISATION + EPS:
            return math.inf
        occupancy = 1000.0 * self.batch / throughput
        found = self._curves.get((share, upper))
        if found is None:
            found = self._curves[(share, upper)] = cache.p99_curve(self.model, self.batch, share, self.mode, upper)
        curve, sizes = found
        u = utilisation if utilisation > 1e-12 else 1e-12
        pos = (math.log(u / (1.0 - u)) - LOGIT_START) / LOGIT_STEP
        low = min(int(pos), len(curve) - 2) if pos >= 0 else 0  # below the grid: extrapolate
        w = pos - low
        ratio = math.exp(curve[low] + (curve[low + 1] - curve[low]) * w)
        size = sizes[low] + (sizes[low + 1] - sizes[low]) * w
        return ratio * occupancy + (latency - occupancy) * size / self.batch

    def checked(self, cache: PointCache, prediction: Prediction, share: float) -> Prediction:
        """The prediction the budget and cap are checked with: raised to the error bound, or central."""
        return cache.raised(self.model, self.batch, share, prediction) if self.error_bound else prediction

    def met_by(self, cache: PointCache, prediction: Prediction, share: float) -> bool:
        prediction = self.checked(cache, prediction, share)
        if self.rate_rps > prediction.throughput_rps * self.max_utilisation + EPS:
            return False
        return self.p99_ms(cache, prediction, share, self.error_bound) <= self.latency_budget_ms + EPS


@dataclass(frozen=True, slots=True)
class Item:
    """A workload replica to place: its batch, minimum share and target on one GPU type."""

    workload: Workload
    rate_rps: float
    batch: int
    min_share: float
    target: Target | P99Target
    queue_delay_ms: float = 0.0  # dynamic batching: longest wait for a batch to fill
    replica: int = 0
    replicas: int = 1
    #: The operator allowed shares and batches outside the profile's measured domain (`StokeOptions`).
    extrapolate: bool = True
    #: (workload name, replica number): stored, not a property, as a re-plan at 10,000 workloads reads it
    #: some 24,000 times
    key: tuple[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", (self.workload.name, self.replica))


class PointCache:
    """Memoised solo points of one GPU type: (model, batch, share) -> SoloPoint."""

    def __init__(self, gpu_type: GpuType):
        self.gpu_type = gpu_type
        self.profile = gpu_type.profile
        self.step = gpu_type.profile.gpu.share_step_pct
        self._points: dict[tuple[str, int, float], SoloPoint] = {}
        self._tables: dict[str, tuple[NDArray[Any], NDArray[Any]]] = {}
        self._curves: dict[tuple[str, str], CurveSet] = {}
        self._curve: dict[tuple[str, int, float, str], tuple[list[float], list[float]]] = {}
        self._errors: dict[str, NDArray[Any]] = {}
        self._upper: dict[str, tuple[NDArray[Any], NDArray[Any]]] = {}
        self._lines: dict[str, tuple[NDArray[Any], NDArray[Any]]] = {}
        self._upper_packed: dict[tuple[str, str], NDArray[Any]] = {}
        self.shares = share_steps(self.profile.gpu)

    def outside_batch_ms(self, model: str) -> tuple[float, float]:
        """What `end_to_end_p99_ms` adds to the model's batch p99 (ms): its serving path as the SLI windows show
        it, and what clients see beyond them (`ModelProfile.serving_p99_ms`, `beyond_sli_p99_ms`)."""
        m = self.profile.model(model)
        return m.serving_p99_ms, m.beyond_sli_p99_ms

    def error_table(self, model: str) -> NDArray[Any]:
        """The profile's relative error bound of L and O, shape (MAX_BATCH, shares) (`ModelProfile.fit_error`)."""
        table = self._errors.get(model)
        if table is None:
            batches = np.arange(1, MAX_BATCH + 1, dtype=float)[:, None]
            table = self._errors[model] = np.asarray(
                self.profile.model(model).fit_error(batches, self.shares[None, :]), dtype=float
            )
        return table

    def domain_table(self, model: str) -> NDArray[Any]:
        """Which (batch, share) candidates lie in the profile's measured domain, shape (MAX_BATCH, shares):
        inside the fit's measured batches and shares, or measured by verification themselves."""
        m = self.profile.model(model)
        if m.domain is None:
            return np.ones((MAX_BATCH, len(self.shares)), dtype=bool)
        batches = np.arange(1, MAX_BATCH + 1)[:, None]
        in_batches = (batches >= m.domain.batches[0]) & (batches <= m.domain.batches[-1])
        table = np.array(in_batches & (self.shares[None, :] >= m.domain.min_share - EPS), dtype=bool)
        for batch, share, _ in m.measured:
            column = int(round(share / self.step)) - 1
            if 1 <= batch <= MAX_BATCH and 0 <= column < len(self.shares):
                table[batch - 1, column] = True
        return table

    def upper_table(self, model: str) -> tuple[NDArray[Any], NDArray[Any]]:
        """`solo_table` with L and O raised to the error bound: latency x (1+e), throughput / (1+e)."""
        table = self._upper.get(model)
        if table is None:
            latency, throughput = self.solo_table(model)
            raise_by = 1.0 + self.error_table(model)
            table = self._upper[model] = (latency * raise_by, throughput / raise_by)
        return table

    def fit_error(self, model: str, batch: int, share: float) -> float:
        column = min(max(int(round(share / self.step)) - 1, 0), len(self.shares) - 1)
        return float(self.error_table(model)[min(batch, MAX_BATCH) - 1, column])

    def raised(self, model: str, batch: int, share: float, prediction: Prediction) -> Prediction:
        """A co-located prediction with L and O raised to the error bound at (batch, share)."""
        up = 1.0 + self.fit_error(model, batch, share)
        return Prediction(
            prediction.latency_ms * up, prediction.throughput_rps / up, prediction.gpu_ms * up, prediction.clock_mhz
        )

    def solo_table(self, model: str) -> tuple[NDArray[Any], NDArray[Any]]:
        """Solo latency and throughput of `model`, shape (MAX_BATCH, shares): batch 1.. x share step.."""
        table = self._tables.get(model)
        if table is None:
            self.profile.model(model)  # unknown model -> descriptive error
            predictor = VectorPredictor(self.profile)
            batches, shares = np.meshgrid(np.arange(1, MAX_BATCH + 1, dtype=float), self.shares, indexing="ij")
            index = np.full((batches.size, 1), predictor.index[model], dtype=np.intp)
            m = self.profile.model(model)
            # verified points and their calibrated neighbourhood (the predictor alone reads k_act only)
            active = m.active_grid_ms(batches, shares).reshape(-1, 1) if m.measured else None
            latency, throughput = predictor.predict(
                index, batches.reshape(-1, 1), shares.reshape(-1, 1), np.ones((batches.size, 1), dtype=bool), active
            )
            table = self._tables[model] = (latency.reshape(batches.shape), throughput.reshape(batches.shape))
        return table

    def occupancy_table(self, model: str) -> NDArray[Any]:
        """Solo server occupancy O(b) = t_gpu + t_feedback (ms), shape (MAX_BATCH, shares)."""
        _, throughput = self.solo_table(model)
        return np.asarray(1000.0 * np.arange(1, MAX_BATCH + 1)[:, None] / throughput, dtype=float)

    def p99_curves(self, model: str, modes: tuple[str, ...], upper: bool = False) -> CurveSet:
        """Batching-table p99 curves of every (delay mode, batch, share) candidate of `model`,
        shape (modes, MAX_BATCH, shares). `upper`: the curves of the upper service curve
        (`upper_lines`), relative to the raised O(B), for checks at the error bound."""
        key = (model, ",".join(modes) + ("^" if upper else ""))
        found = self._curves.get(key)
        if found is None:
            occupancy = self.occupancy_table(model)
            batches = (np.arange(1, MAX_BATCH + 1)[:, None] * np.ones_like(occupancy)).astype(np.intp)
            if upper:
                found = self._curves[key] = CurveSet(np.stack([self._upper_curves(model, mode) for mode in modes]))
            else:
                shape = batching_shape(occupancy[0][None, :], occupancy, batches)
                found = self._curves[key] = CurveSet(
                    np.stack([batching_table().curve_set(mode, batches, shape).packed for mode in modes])
                )
        return found

    def upper_occupancy_table(self, model: str) -> NDArray[Any]:
        """O(k) raised to the error bound at every (k, share): the points the upper service curve covers."""
        return np.asarray(self.occupancy_table(model) * (1.0 + self.error_table(model)), dtype=float)

    def upper_lines(self, model: str) -> tuple[NDArray[Any], NDArray[Any]]:
        """Linear occupancies that lie at or above every raised O(k), k = 1..B, for each (B, share).

        The batching table knows O(k) as a line through O(1) and O(B), but measured curves are not
        lines: partial batches may sit above the chord (tile steps, bumps), and a queue at light load
        runs on partial batches. A line at or above every point can only delay a batch, so its p99
        bounds the queue's from above. Two such lines are kept: the one pivoting on O(B) (the full-batch
        utilisation unchanged: best at heavy load) and the one pivoting on O(1) (light load), and
        `_upper_curves` takes the lesser p99 per utilisation. (Lifting the chord, or a line touching
        the points at mid-batch, won on a few percent of candidates and changed no benchmark plan.)
        Returns (factor, shape), each (2, MAX_BATCH, shares): the line's O(B) over the raised O(B)
        (>= 1: it raises utilisation) and the table's shape coordinate of the line.
        """
        found = self._lines.get(model)
        if found is not None:
            return found
        points = self.upper_occupancy_table(model)  # (MAX_BATCH, shares)
        factor = np.ones((2, MAX_BATCH, len(self.shares)))
        shape = np.zeros((2, MAX_BATCH, len(self.shares)))
        k = np.arange(1, MAX_BATCH + 1, dtype=float)[:, None]
        for b in range(2, MAX_BATCH + 1):
            o, kk = points[:b], k[:b]
            first, last = o[0], o[b - 1]
            slopes = (
                np.min((last - o[:-1]) / (b - kk[:-1]), axis=0),  # pivoting on O(B)
                np.max((o[1:] - first) / (kk[1:] - 1.0), axis=0),  # pivoting on O(1)
            )
            for j, slope in enumerate(slopes):
                slope = np.maximum(slope, 0.0)
                lift = np.max(o - slope[None, :] * kk, axis=0)  # the line's value at k = 0
                top = lift + slope * b
                factor[j, b - 1] = np.maximum(top / last, 1.0)
                # at least O(B)/B at k = 1: the table's shapes start there (a line through the origin)
                shape[j, b - 1] = batching_shape(np.maximum(lift + slope, top / b), top, b)
        found = self._lines[model] = (factor, shape)
        return found

    def _upper_curves(self, model: str, mode: str) -> NDArray[Any]:
        """Packed table curves (MAX_BATCH, shares, grid, 2) of the upper service curve: at each
        utilisation of the grid (that of the raised O(B)), the least p99 over `upper_lines`."""
        found = self._upper_packed.get((model, mode))
        if found is not None:
            return found
        factor, shape = self.upper_lines(model)
        table = batching_table()
        batches = np.broadcast_to(np.arange(1, MAX_BATCH + 1)[:, None], shape.shape[1:])
        grid = 1.0 / (1.0 + np.exp(-table.logits))
        best = np.full(shape.shape[1:] + (len(grid),), np.inf)  # log(p99 / raised O(B))
        best_size = np.zeros_like(best)
        rows = (np.arange(batches.size) * len(grid)).reshape(batches.shape)[..., None]
        for j in range(shape.shape[0]):
            log_ratio, size = table.curves(mode, batches, shape[j])
            if np.all(factor[j] == 1.0):  # the line keeps O(B): the table's own nodes
                value, size_at = log_ratio, size
            else:  # the line's own utilisation at each grid node, and the table's value there (linear in logit)
                u = np.minimum(factor[j][..., None] * grid, 1.0 - 1e-12)
                pos = (np.log(u / (1.0 - u)) - table.LOGIT_START) / table.LOGIT_STEP
                low = np.clip(np.floor(pos).astype(np.intp), 0, len(grid) - 2)
                w, index = pos - low, rows + low
                flat_ratio, flat_size = log_ratio.reshape(-1), size.reshape(-1)
                value = flat_ratio[index] + (flat_ratio[index + 1] - flat_ratio[index]) * w
                size_at = flat_size[index] + (flat_size[index + 1] - flat_size[index]) * w
                # the table is relative to the line's own O(B); past its top the queue is unstable
                value = np.where(u > MAX_UTILISATION + 1e-12, np.inf, value + np.log(factor[j])[..., None])
            better = value < best
            best, best_size = np.where(better, value, best), np.where(better, size_at, best_size)
        log_ratio = best
        found = self._upper_packed[(model, mode)] = np.stack(
            [np.where(np.isfinite(log_ratio), log_ratio, 300.0), best_size], axis=-1
        )
        return found

    def rated_curves(
        self, model: str, modes: tuple[str, ...], columns: tuple[int, int] | None = None, upper: bool = False
    ) -> CurveSet:
        """`p99_curves` with a rate axis in second place, shape (modes, 1, MAX_BATCH, shares), so
        (rates, MAX_BATCH, shares) utilisations broadcast against it; `columns`: (first, stop) share steps."""
        first, stop = columns if columns is not None else (0, len(self.shares))
        key = (model, f"{','.join(modes)}@{first}:{stop}" + ("^" if upper else ""))
        found = self._curves.get(key)
        if found is None:
            packed = self.p99_curves(model, modes, upper).packed[:, None, :, first:stop]
            found = self._curves[key] = CurveSet(packed)
        return found

    def p99_curve(
        self, model: str, batch: int, share: float, mode: str, upper: bool = False
    ) -> tuple[list[float], list[float]]:
        """One candidate's curves as plain lists (the scalar hot path of `colocate`)."""
        key = (model, batch, share, mode + ("^" if upper else ""))
        found = self._curve.get(key)
        if found is None:
            packed = self.p99_curves(model, (mode,), upper).packed
            column = int(round(share / self.step)) - 1
            found = self._curve[key] = (
                packed[0, batch - 1, column, :, 0].tolist(),
                packed[0, batch - 1, column, :, 1].tolist(),
            )
        return found

    def point(self, model: str, batch: int, share: float) -> SoloPoint:
        key = (model, batch, share)
        found = self._points.get(key)
        if found is None:
            found = self._points[key] = solo_point(self.profile, model, batch, share)
        return found

    def predict(self, items: Sequence[Item], shares: Sequence[float]) -> list[Prediction]:
        return predict_points(
            self.profile.gpu, [self.point(i.workload.model, i.batch, s) for i, s in zip(items, shares)]
        )

    def round_up(self, share: float) -> float:
        """Round a share up to the GPU's step, at least one step."""
        steps = max(1, math.ceil(share / self.step - 1e-9))
        return round(steps * self.step, 6)


def colocate(
    cache: PointCache, items: Sequence[Item], shares: Sequence[float] | None = None, max_added: float = math.inf
) -> tuple[list[float], list[Prediction]] | None:
    """Shares (from `shares`, default each item's minimum) at which every target is met.

    iGniter's greedy rule, not a global minimum: each round predicts the GPU
    and adds one share step to every workload that misses its target. Returns (shares, predictions), or None when the
    shares would pass 100% or more than `max_added` would be added.
    """
    if not fits_memory(cache, items):
        return None
    current = [i.min_share for i in items] if shares is None else list(shares)
    start = sum(current)
    step = cache.step
    while True:
        total = sum(current)
        if total > 100.0 + EPS or total - start > max_added + EPS:
            return None
        predictions = cache.predict(items, current)
        missing = [
            k
            for k, (item, p, share) in enumerate(zip(items, predictions, current))
            if not item.target.met_by(cache, p, share)
        ]
        if not missing:
            return current, predictions
        for k in missing:
            if current[k] + step > 100.0 + EPS:
                return None
            current[k] = round(current[k] + step, 6)


def replica_memory_mib(cache: PointCache, item: Item) -> float:
    """Device memory of one replica: its process's context, the weights, activations of a full batch."""
    return cache.profile.gpu.context_mib + cache.profile.model(item.workload.model).memory_mib(item.batch)


def memory_fits_table(cache: PointCache, model: str) -> NDArray[Any]:
    """Which batches 1..MAX_BATCH of `model` fit the GPU's memory alone (context + weights + activations), shape
    (MAX_BATCH,): every batch where the GPU type records no memory."""
    gpu, m = cache.profile.gpu, cache.profile.model(model)
    batches = np.arange(1, MAX_BATCH + 1, dtype=float)
    if not gpu.memory_mib:
        return np.ones(MAX_BATCH, dtype=bool)
    return np.asarray(gpu.context_mib + m.weights_mib + m.activation_mib * batches <= gpu.memory_mib + EPS)


def memory_refusal(
    workload: Workload,
    cache: PointCache,
    batch: int = 1,
    fix: str = "use a GPU type with more memory, or a smaller model",
) -> ProblemError | None:
    """Why one replica of `workload` at `batch` (default the smallest) cannot fit the GPU type's memory even
    alone, or None when it fits (or the GPU type records no memory)."""
    gpu, m = cache.profile.gpu, cache.profile.model(workload.model)
    need = gpu.context_mib + m.memory_mib(batch)
    if not gpu.memory_mib or need <= gpu.memory_mib + EPS:
        return None
    at = "its smallest batch, 1" if batch == 1 else f"batch {batch}"
    return ProblemError(
        f"workload {workload.name!r} does not fit a {cache.gpu_type.name}'s memory even alone: a replica of model "
        f"{workload.model!r} needs {need:,.0f} MiB ({gpu.context_mib:,.0f} MiB context + {m.weights_mib:,.0f} MiB "
        f"weights + {m.activation_mib * batch:,.0f} MiB activations at {at}) but the {cache.gpu_type.name} has "
        f"{gpu.memory_mib:,.0f} MiB; {fix}"
    )


def fits_memory(cache: PointCache, items: Sequence[Item]) -> bool:
    """The replicas fit the GPU's memory and its MPS client limit (limits not recorded are not checked)."""
    gpu = cache.profile.gpu
    if gpu.max_clients and len(items) > gpu.max_clients:
        return False
    return not gpu.memory_mib or sum(replica_memory_mib(cache, i) for i in items) <= gpu.memory_mib + EPS


def min_share_solo(cache: PointCache, model: str, batch: int, target: Target) -> float | None:
    """Smallest share (on the step grid) at which `model` meets `target` alone on a GPU."""
    latency, throughput = cache.solo_table(model)
    ok = np.asarray(target.met_by_arrays(latency[batch - 1], throughput[batch - 1]))
    if not ok.any():
        return None
    return float(cache.shares[int(np.argmax(ok))])


def smallest_latency_ms(cache: PointCache, model: str) -> float:
    """Smallest latency the model reaches alone on a whole GPU (batch 1, 100%)."""
    return float(cache.solo_table(model)[0][0, -1])


def reject(workload: Workload, cache: PointCache, budget_ms: float, rule: str) -> ProblemError:
    return ProblemError(
        f"workload {workload.name!r} cannot meet its SLO of {workload.slo_ms:g} ms even alone on a whole "
        f"{cache.gpu_type.name}: model {workload.model!r} needs at least "
        f"{smallest_latency_ms(cache, workload.model):.2f} ms per inference (batch 1, 100%) but {rule} leaves "
        f"{budget_ms:.2f} ms; relax the SLO or use a faster GPU type"
    )


def replica_p99_ms(cache: PointCache, item: Item, share: float, prediction: Prediction, upper: bool = False) -> float:
    """The batching model's p99 for a placed replica, whatever target placed it (`upper`: see `P99Target.p99_ms`)."""
    target = item.target
    if not isinstance(target, P99Target):
        target = P99Target(
            math.inf,
            item.rate_rps,
            item.batch,
            item.queue_delay_ms,
            item.workload.model,
            paced=item.workload.arrivals == "constant",
        )
    return target.p99_ms(cache, prediction, share, upper)


def replica_p99_upper_ms(cache: PointCache, item: Item, share: float, prediction: Prediction) -> float:
    """The replica's p99 with L and O raised to the profile's error bound at its point, and partial batches
    on the upper service curve (at or above every raised O(k), `PointCache.upper_lines`)."""
    raised = cache.raised(item.workload.model, item.batch, share, prediction)
    return replica_p99_ms(cache, item, share, raised, upper=True)


def binding_constraint(cache: PointCache, item: Item, share: float) -> str:
    """What stops this replica from one share step less: its own target, or its neighbours.

    'p99' / 'utilisation' (stoke's target; 'p99 upper' / 'utilisation upper' when checked at the
    error bound), 'latency' / 'throughput' (iGniter's), 'interference' when one step less would do
    alone (co-location needed the extra), 'domain' when one step less is below the profile's
    measured shares, 'min share' at one step.
    """
    lower = round(share - cache.step, 6)
    if lower <= EPS:
        return "min share"
    target = item.target
    if isinstance(target, P99Target) and target.error_bound:
        domain = cache.profile.model(item.workload.model).domain
        if domain is not None and lower < domain.min_share - EPS and not item.extrapolate:
            return "domain"
    alone = cache.predict([item], [lower])[0]
    if target.met_by(cache, alone, lower):
        return "interference"
    if isinstance(target, P99Target):
        checked = target.checked(cache, alone, lower)
        over = item.rate_rps > checked.throughput_rps * target.max_utilisation + EPS
        suffix = " upper" if target.error_bound else ""
        return ("utilisation" if over else "p99") + suffix
    return "latency" if alone.latency_ms > target.latency_budget_ms + EPS else "throughput"


def to_placement(cache: PointCache, item: Item, share: float, prediction: Prediction) -> Placement:
    return Placement(
        name=item.workload.name,
        model=item.workload.model,
        slo_ms=item.workload.slo_ms,
        rate_rps=item.rate_rps,
        share_pct=share,
        batch=item.batch,
        queue_delay_ms=item.queue_delay_ms,
        predicted_latency_ms=prediction.latency_ms,
        predicted_throughput_rps=prediction.throughput_rps,
        predicted_p99_ms=replica_p99_ms(cache, item, share, prediction),
        serving_p99_ms=cache.outside_batch_ms(item.workload.model)[0],
        beyond_sli_p99_ms=cache.outside_batch_ms(item.workload.model)[1],
        p99_upper_ms=replica_p99_upper_ms(cache, item, share, prediction),
        memory_mib=replica_memory_mib(cache, item),
        binding=binding_constraint(cache, item, share),
        replica=item.replica,
        replicas=item.replicas,
        arrivals=item.workload.arrivals,
    )


def with_replicas(items: list[Item]) -> list[Item]:
    """Number replicas of each workload 0..n-1 and record n."""
    counts: dict[str, int] = {}
    for item in items:
        counts[item.workload.name] = counts.get(item.workload.name, 0) + 1
    seen: dict[str, int] = {}
    out = []
    for item in items:
        k = seen.get(item.workload.name, 0)
        seen[item.workload.name] = k + 1
        out.append(replace(item, replica=k, replicas=counts[item.workload.name]))
    return out


def allowed_types(workload: Workload, inventory: Sequence[GpuType]) -> list[GpuType]:
    return [g for g in inventory if workload.gpu_type in (None, g.name) and workload.model in g.profile.models]
