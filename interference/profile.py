"""Fitted performance profiles: one GPU type and the models profiled on it.

A `DeviceProfile` is what the solver and the predictor consume. It is plain,
frozen data; reading and writing it (JSON with a format version) lives in
`interference.profile_io`, the only module here that touches files.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

import numpy as np
from numpy.typing import NDArray

from foundation.errors import StokeError
from interference.bounds import MAX_BATCH

#: Bumped whenever the saved JSON layout changes incompatibly.
PROFILE_FORMAT_VERSION = 1
#: The serving path's p99 (ms) of a model whose profile did not measure it (profiles written before
#: `stoke profile run` measured it, and GPU profiles fitted from raw iGniter data): 0, the prediction
#: such a profile always made. The closed loop raises it from the SLI the agents measure
#: (`controller.feedback`), so the client p99 is what stoke predicts after its first minutes.
DEFAULT_SERVING_P99_MS = 0.0
#: The part of the clients' p99 the closed loop's SLI windows do not show (ms), of a model whose profile did not
#: measure it (profiles and measurement files written before `stoke profile run` measured it): 0, the
#: prediction such a profile always made (its `serving_p99_ms` then holds the whole serving path, as measured).
#: The loop cannot learn this part (its windows do not show it), so it keeps whatever the profile says.
DEFAULT_BEYOND_SLI_P99_MS = 0.0
#: A fitted model must hold over batches 1..this and every share step, not only at the profiled points
#: (`interference.fit` checks it): the solvers' range (`interference.bounds`).
DOMAIN_MAX_BATCH = MAX_BATCH
#: How much the fitted active time may fall when the batch grows by one (or rise when the share grows by one
#: step) and still count as monotone: repeated medians of one point differ by a few percent, so a smaller dip
#: is measurement noise, not a shape.
MONOTONE_TOLERANCE = 0.01
#: The finest share step a profile may have: 100 steps of 1%. MPS takes whole percents
#: (``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``), and the planner's tables grow with the number of steps (a step of
#: 0.001% took 16 GB). A step must divide 100 (100/n for n steps), so the top step is a whole GPU.
MIN_SHARE_STEP_PCT = 1.0
#: Tolerance of "divides 100" (a fit stores 100/cores rounded to 6 decimals: 33.333333 for 3 cores).
SHARE_STEP_TOLERANCE = 1e-4
#: The solo active time (ms) a fitted k_act may give anywhere in its domain, and a measured point may have:
#: from a microsecond to an hour. Outside it the coefficients are broken (all 0, all -1, all 1e308), not slow:
#: the planner's arithmetic overflows or indexes out of its tables on them.
MIN_ACTIVE_MS = 1e-3
MAX_ACTIVE_MS = 3_600_000.0


def share_step_count(share_step_pct: float) -> int | None:
    """n when `share_step_pct` is 100/n (to `SHARE_STEP_TOLERANCE`) for n in 1..100/`MIN_SHARE_STEP_PCT`,
    else None."""
    if not (math.isfinite(share_step_pct) and MIN_SHARE_STEP_PCT - 1e-9 <= share_step_pct <= 100.0 + 1e-9):
        return None
    n = round(100.0 / share_step_pct)
    return n if abs(n * share_step_pct - 100.0) <= SHARE_STEP_TOLERANCE else None


#: What `share_step_count` accepts, worded for an error ("... must be <this>, got ...").
SHARE_STEP_RULE = (
    f"a share step from {MIN_SHARE_STEP_PCT:g} to 100 that divides 100 (100/n for n steps: 2.5 for 40, 50 for 2)"
)


def on_share_step(share_pct: float, share_step_pct: float) -> bool:
    """Whether `share_pct` is a share a GPU of this step gives: a whole number of steps, one step to 100%."""
    steps = round(share_pct / share_step_pct)
    return 1 <= steps and abs(steps * share_step_pct - share_pct) <= SHARE_STEP_TOLERANCE and share_pct <= 100.0 + 1e-6


def active_time_problems(
    k_act: Sequence[float], share_step_pct: float, top_batch: int = DOMAIN_MAX_BATCH, *, shape: bool = True
) -> tuple[str, ...]:
    """What is wrong with k_act over its domain (empty when nothing): every whole batch 1..`top_batch` x every
    share step up to 100%. The fitter's check (`interference.fit.active_time_report`) and the profile
    reader's (`interference.profile_io`) are this one.

    The active time must be positive, at most `MAX_ACTIVE_MS` (so finite) and at least `MIN_ACTIVE_MS`; with
    `shape`, it also must not fall by more than `MONOTONE_TOLERANCE` when the batch grows by one, nor rise by
    more than that when the share grows by one step (the fitter refuses such a fit unless forced, so a reader
    of a forced profile leaves `shape` off: the planner copes with the shape, not with a broken range).
    """
    k1, k2, k3, k4, k5 = (float(k) for k in k_act)
    batches = np.arange(1, top_batch + 1, dtype=float)[:, None]
    shares = np.arange(1, int(round(100.0 / share_step_pct)) + 1, dtype=float)[None, :] * share_step_pct
    with np.errstate(all="ignore"):
        grid = (k1 * batches * batches + k2 * batches + k3) / (shares + k4) + k5
    low, high = float(grid.min()), float(grid.max())  # NaN when any is
    if not MIN_ACTIVE_MS <= low <= high <= MAX_ACTIVE_MS:  # the rare case: find the first point and say why
        for why, bad in (
            ("is not positive", ~(grid > 0)),
            (f"is more than an hour ({MAX_ACTIVE_MS:g} ms)", ~(grid <= MAX_ACTIVE_MS)),
            (f"is less than a microsecond ({MIN_ACTIVE_MS:g} ms)", grid < MIN_ACTIVE_MS),
        ):
            if bad.any():
                b, r = np.argwhere(bad)[0]
                return (f"k_act {why} at batch {int(batches[b, 0])}, share {shares[0, r]:g}% ({grid[b, r]:.4g} ms)",)
    if not shape:
        return ()
    problems = []
    falls = np.argwhere(grid[1:] < grid[:-1] * (1.0 - MONOTONE_TOLERANCE))
    if falls.size:
        b, r = falls[0]
        problems.append(
            f"k_act falls from {grid[b, r]:.4g} ms at batch {int(batches[b, 0])} to "
            f"{grid[b + 1, r]:.4g} ms at batch {int(batches[b + 1, 0])} (share {shares[0, r]:g}%): "
            f"a bigger batch must not be faster"
        )
    rises = np.argwhere(grid[:, 1:] > grid[:, :-1] * (1.0 + MONOTONE_TOLERANCE))
    if rises.size:
        b, r = rises[0]
        problems.append(
            f"k_act rises from {grid[b, r]:.4g} ms at share {shares[0, r]:g}% to "
            f"{grid[b, r + 1]:.4g} ms at share {shares[0, r + 1]:g}% (batch {int(batches[b, 0])}): "
            f"a bigger share must not be slower"
        )
    return tuple(problems)


@dataclass(frozen=True)
class GpuProfile:
    """Coefficients of one GPU type (reference: inference-model.md)."""

    name: str
    max_freq_mhz: float  # F
    power_cap_w: float  # P_max
    idle_power_w: float  # P_idle
    pcie_bytes_per_ms: float  # B
    share_step_pct: float  # smallest MPS share increment (100 / (SMs/2))
    sched_slope_ms: float  # a_sch: per-kernel scheduling delay growth per co-located workload
    sched_intercept_ms: float  # b_sch
    freq_slope_mhz_per_w: float  # a_f (< 0): SM clock lost per watt above the cap
    #: Device memory (MiB) and what each Triton process (one per replica: its own CUDA context) takes
    #: before any model; 0 = not recorded (not checked).
    memory_mib: float = 0.0
    context_mib: float = 0.0
    #: Most MPS clients (processes) one GPU serves: 48 on Volta and later; 0 = not recorded.
    max_clients: int = 0

    def scheduling_delay_ms(self, colocated: int) -> float:
        """Per-kernel extra scheduling delay with `colocated` workloads on the GPU."""
        if colocated < 2:
            return 0.0
        return max(0.0, self.sched_slope_ms * colocated + self.sched_intercept_ms)


#: Relative error assumed where a profile does not record its own: profiles saved before they recorded
#: their domain and error (they load with no `domain`), and fits with too few points for leave-one-out
#: (5 coefficients need at least 7 points). About twice the worst interior leave-one-out error of the
#: bundled V100 fit. A fit with too few points adds `UNMEASURED_ERROR` off its measured points like any
#: other. A profile with no domain keeps this default everywhere, as it always planned: less than a
#: refitted profile's bound off its measured points (10% more), so refit it for an honest bound.
DEFAULT_FIT_ERROR = 0.10
#: Outside the measured domain (only where the operator allows it) the error bound grows by this much
#: per halving of the share below the smallest measured share, or doubling of the batch above the
#: largest: a fit extrapolates its curve with nothing to check it against.
EXTRAPOLATION_ERROR_PER_OCTAVE = 0.15
#: Relative error of a point measured by verification (`stoke profile verify`): what stands in for
#: the fit there. About the spread of repeated stable medians (a few percent); it covers noise, not
#: a wrong curve.
MEASURED_ERROR = 0.02
#: Relative error added to the bound at every (batch, share) the fit did not measure: what the fit's own
#: points cannot show. Leave-one-out errors say how wrong the smooth curve is at the points it was
#: fitted to; between them real latency is not smooth, and a few points per model say nothing about it:
#: kernels run in tiles (a batch just past a tile pays part of the next, up to ~5% at small batches) and
#: measured medians scatter by a few percent from one batch or share step to the next (issue 15 measured
#: the V100 fit 4-5% slow at unmeasured ssd batches). A prior, not a measurement: the two together, 10%.
#: Verification replaces it at the points it measures (`MEASURED_ERROR`). With 7% the unverified plans of
#: `benchmarks/bench_truth.py` replayed 97-99.5% of replicas at or under their upper p99; with 10%, all
#: six mixes at 99.6-100%.
UNMEASURED_ERROR = 0.10


@dataclass(frozen=True)
class FitDomain:
    """Where a model's fit was measured, and how wrong it is out of sample.

    `batches` x `shares` are the measured batch sizes and shares (ascending); `error[i][j]` is the
    leave-one-out relative error of the fitted active time at (batches[i], shares[j]): the point is
    left out, the model refitted on the rest, and |measured - refitted| / refitted taken. `floor` is
    the in-sample error quantile (`fit.ERROR_QUANTILE` of |residual|) inflated for the coefficients the
    fit spent (sqrt(n / (n - 5))). The bound at a measured (batch, share) is its own error (never below
    `floor`); at a point between measured ones it interpolates the grid in (log batch, log share), never
    goes below `floor`, and adds `UNMEASURED_ERROR` for what the measured points cannot show there. The
    active time is the only fitted term of L(k) and O(k) (the rest is measured or zero), so its relative
    error bounds theirs.
    """

    batches: tuple[int, ...]
    shares: tuple[float, ...]
    error: tuple[tuple[float, ...], ...]
    floor: float

    def __post_init__(self) -> None:
        if not self.batches or not self.shares:
            raise ValueError("a fit domain needs at least one measured batch and share")
        if list(self.batches) != sorted(set(self.batches)) or list(self.shares) != sorted(set(self.shares)):
            raise ValueError("a fit domain's batches and shares must be ascending and distinct")
        if len(self.error) != len(self.batches) or any(len(row) != len(self.shares) for row in self.error):
            raise ValueError("a fit domain's error grid must be batches x shares")
        values = [self.floor, *(v for row in self.error for v in row)]
        if not all(math.isfinite(v) and 0.0 <= v <= 10.0 for v in values):
            raise ValueError("a fit domain's errors must be finite relative errors in [0, 10]")

    @property
    def min_share(self) -> float:
        return self.shares[0]

    @property
    def max_batch(self) -> int:
        return self.batches[-1]

    def contains(self, batch: float, share_pct: float) -> bool:
        in_batches = self.batches[0] <= batch <= self.batches[-1]
        return bool(in_batches and self.shares[0] - 1e-9 <= share_pct <= self.shares[-1] + 1e-9)

    def quantile(self, q: float = 0.9) -> float:
        """A quantile of the leave-one-out errors over the measured points (what `profile show` reports)."""
        return float(np.quantile(np.asarray(self.error, dtype=float), q))

    def error_at(self, batch: object, share_pct: object) -> NDArray[Any]:
        """The relative error bound of L and O at (batch, share); arrays broadcast (see the class doc).

        A point of the measured grid (batches x shares) keeps its own error; any other point adds
        `UNMEASURED_ERROR`. Outside the domain the bound is the one at the nearest measured edge, plus
        `EXTRAPOLATION_ERROR_PER_OCTAVE` per octave beyond it.
        """
        b = np.asarray(batch, dtype=float)
        r = np.asarray(share_pct, dtype=float)
        grid = np.asarray(self.error, dtype=float)
        inside = _interpolate(grid, np.log(self.batches), np.log(self.shares), np.log(b), np.log(r))
        on_grid = np.isin(b, self.batches) & (np.abs(r[..., None] - np.asarray(self.shares)) < 1e-6).any(axis=-1)
        inside = np.maximum(inside, self.floor) + np.where(on_grid, 0.0, UNMEASURED_ERROR)
        below = np.log2(np.maximum(1.0, self.shares[0] / r))
        above = np.log2(np.maximum(1.0, b / self.batches[-1]))
        return np.asarray(inside + EXTRAPOLATION_ERROR_PER_OCTAVE * (below + above))


def _interpolate(
    grid: NDArray[Any], xs: NDArray[Any], ys: NDArray[Any], x: NDArray[Any], y: NDArray[Any]
) -> NDArray[Any]:
    """Bilinear interpolation of `grid` (len(xs) x len(ys)) at (x, y), clamped to the grid's edges."""

    def axis(nodes: NDArray[Any], at: NDArray[Any]) -> tuple[NDArray[Any], NDArray[Any]]:
        if len(nodes) == 1:
            return np.zeros(at.shape, dtype=np.intp), np.zeros(at.shape)
        pos = np.interp(at, nodes, np.arange(len(nodes), dtype=float))
        low = np.minimum(np.floor(pos).astype(np.intp), len(nodes) - 2)
        return low, pos - low

    x, y = np.broadcast_arrays(x, y)
    i, wx = axis(xs, x)
    j, wy = axis(ys, y)
    i1 = np.minimum(i + 1, grid.shape[0] - 1)
    j1 = np.minimum(j + 1, grid.shape[1] - 1)
    low = grid[i, j] * (1 - wx) + grid[i1, j] * wx
    high = grid[i, j1] * (1 - wx) + grid[i1, j1] * wx
    return np.asarray(low * (1 - wy) + high * wy)


@dataclass(frozen=True)
class ModelProfile:
    """Coefficients of one model on one GPU type.

    Solo active time (ms) at batch b and share r (percent):
        k_act(b, r) = (k1*b^2 + k2*b + k3) / (r + k4) + k5
    Processing ability a = 1000*b / k_act (req/s) drives
        L2 utilisation c = l2_slope*a + l2_intercept  (percent) and
        power above idle p = power_slope*a + power_intercept  (W).
    serving_p99_ms is the request's way outside the batch, over the workload's protocol (client,
    router, Triton's frontend and back): the p99 of the client latency less Triton's own request
    time as the closed loop's SLI windows show it, measured by `stoke profile run`
    (`agents.loadgen.serving_overhead_ms`); the loop re-learns it from the SLI. beyond_sli_p99_ms is
    what clients see on top of that: their p99 over all requests less the median of the SLI windows'
    p99s over the same requests (a stall that hits a few windows moves the first, not the second); the
    loop keeps it. The p99 of a request adds both to the batching queue's p99
    (`interference.batching.end_to_end_p99_ms`).
    """

    name: str
    kernels: int  # n_k
    idle_time_ms: float  # solo scheduling idle time of one inference
    k_act: tuple[float, float, float, float, float]
    power_slope_w: float  # kp
    power_intercept_w: float  # bp
    l2_slope: float  # kc
    l2_intercept: float  # bc
    cache_sensitivity: float  # alpha_cache
    bytes_in: int  # d_in per request
    bytes_out: int  # d_out per request
    serving_p99_ms: float = DEFAULT_SERVING_P99_MS  # the serving path outside the batch, p99 (ms)
    beyond_sli_p99_ms: float = DEFAULT_BEYOND_SLI_P99_MS  # what clients see beyond the SLI windows, p99 (ms)
    #: Device memory of one instance: weights, and activations per request of a batch (MiB); 0 = not
    #: recorded. A replica takes context + weights + batch x activations (`replica_memory_mib`).
    weights_mib: float = 0.0
    activation_mib: float = 0.0
    #: Measured batches and shares and the fit's out-of-sample error there; None for a profile saved
    #: before profiles recorded them: then every point counts as measured, at `DEFAULT_FIT_ERROR`.
    domain: FitDomain | None = None
    #: Points measured after the fit (verification): (batch, share %, solo active ms). There the
    #: measurement replaces the fitted active time, at `MEASURED_ERROR`; elsewhere the fit is raised
    #: by the nearest measurement's excess (`calibration`).
    measured: tuple[tuple[int, float, float], ...] = ()

    def __post_init__(self) -> None:
        lookup = {(int(b), round(float(r), 6)): float(ms) for b, r, ms in self.measured}
        object.__setattr__(self, "_measured", lookup)
        nodes = [(math.log(b), math.log(r), ms / self.fitted_active_ms(b, r)) for (b, r), ms in lookup.items()]
        object.__setattr__(self, "_calibration", nodes)

    def fitted_active_ms(self, batch: float, share_pct: float) -> float:
        k1, k2, k3, k4, k5 = self.k_act
        return (k1 * batch * batch + k2 * batch + k3) / (share_pct + k4) + k5

    def calibration(self, batch: float, share_pct: float) -> float:
        """Measured / fitted at the measured point nearest (batch, share) in (log b, log r), never below 1.

        A point a measurement found slower than the fit says its neighbourhood is slower too, so a
        re-plan does not flee one share step up to a point the fit still flatters; a faster one is
        not trusted beyond itself (1: no measured point).
        """
        nodes = self._calibration  # type: ignore[attr-defined]
        if not nodes:
            return 1.0
        lb, lr = math.log(batch), math.log(share_pct)
        distance = [(n[0] - lb) ** 2 + (n[1] - lr) ** 2 for n in nodes]
        least = min(distance)
        # equally near measurements (to rounding): the slowest speaks for the point
        return float(max(1.0, max(n[2] for n, d in zip(nodes, distance) if d <= least + 1e-9)))

    def with_measured(self, points: Mapping[tuple[int, float], float]) -> ModelProfile:
        """This model with `points` ((batch, share) -> solo active ms) measured, overriding the fit there."""
        merged = {(int(b), round(float(r), 6)): float(ms) for b, r, ms in self.measured}
        merged.update({(int(b), round(float(r), 6)): float(ms) for (b, r), ms in points.items()})
        return replace(self, measured=tuple((b, r, ms) for (b, r), ms in sorted(merged.items())))

    def measured_ms(self, batch: float, share_pct: float) -> float | None:
        found: float | None = self._measured.get((int(batch), round(float(share_pct), 6)))  # type: ignore[attr-defined]
        return found if found is not None and float(batch) == int(batch) else None

    def memory_mib(self, batch: int) -> float:
        """Weights and activations of one instance at max batch `batch` (the process context aside)."""
        return self.weights_mib + self.activation_mib * batch

    def in_domain(self, batch: float, share_pct: float) -> bool:
        return self.domain is None or self.domain.contains(batch, share_pct)

    def fit_error(self, batch: object, share_pct: object) -> NDArray[Any]:
        """Relative error bound of L and O at (batch, share) (arrays broadcast); see `FitDomain`."""
        if self.domain is None:
            error = np.full(np.broadcast(np.asarray(batch), np.asarray(share_pct)).shape, DEFAULT_FIT_ERROR)
        else:
            error = np.asarray(self.domain.error_at(batch, share_pct), dtype=float)
        if self.measured:
            b, r = np.broadcast_arrays(np.asarray(batch, dtype=float), np.asarray(share_pct, dtype=float))
            error = np.array(np.broadcast_to(error, b.shape))
            for mb, mr, _ in self.measured:
                error[(b == mb) & (np.abs(r - mr) < 1e-6)] = MEASURED_ERROR
        return error

    def active_grid_ms(self, batch: NDArray[Any], share_pct: NDArray[Any]) -> NDArray[Any]:
        """`active_time_ms` over arrays (broadcast): the fit, calibrated and overridden by measured points."""
        b, r = np.broadcast_arrays(np.asarray(batch, dtype=float), np.asarray(share_pct, dtype=float))
        k1, k2, k3, k4, k5 = self.k_act
        fitted = (k1 * b * b + k2 * b + k3) / (r + k4) + k5
        nodes = self._calibration  # type: ignore[attr-defined]
        if not nodes:
            return np.asarray(fitted)
        lb, lr, ratio = (np.asarray(column, dtype=float) for column in zip(*nodes))
        distance = (np.log(b)[..., None] - lb) ** 2 + (np.log(r)[..., None] - lr) ** 2
        nearest = distance <= distance.min(axis=-1, keepdims=True) + 1e-9
        out = np.array(fitted * np.maximum(1.0, np.where(nearest, ratio, -np.inf).max(axis=-1)), dtype=float)
        for (mb, mr), ms in self._measured.items():  # type: ignore[attr-defined]
            out[(b == mb) & (np.abs(r - mr) < 1e-6)] = ms
        return np.asarray(out)

    def active_time_ms(self, batch: float, share_pct: float) -> float:
        if self.measured:
            found = self.measured_ms(batch, share_pct)
            if found is not None:
                return found
            return self.fitted_active_ms(batch, share_pct) * self.calibration(batch, share_pct)
        return self.fitted_active_ms(batch, share_pct)


@dataclass(frozen=True)
class DeviceProfile:
    """A GPU type with the models profiled on it."""

    gpu: GpuProfile
    models: Mapping[str, ModelProfile] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "models", MappingProxyType(dict(self.models)))

    def model(self, name: str) -> ModelProfile:
        try:
            return self.models[name]
        except KeyError:
            known = ", ".join(sorted(self.models)) or "none"
            raise UnknownModelError(
                f"model {name!r} is not in the {self.gpu.name} profile (profiled models: {known}); "
                f"profile it and fit it with `stoke profile fit`, or use one of the profiled models"
            ) from None


class UnknownModelError(StokeError, KeyError):
    """A workload names a model that the GPU profile does not know."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])
