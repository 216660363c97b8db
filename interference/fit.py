"""Fit GPU and model coefficients from raw profile measurements.

Raw measurements come in the published iGniter layout (one dict per section:
``hardware`` and one per model; README.md's "Bring your own profile" lists
the keys). `InterferenceModel` is a scikit-learn style estimator: ``__init__``
stores hyper-parameters only, ``fit`` returns self and sets attributes ending
in ``_``, ``predict`` refuses to run before ``fit``.

Every fit is deterministic: closed-form least squares, or bounded
trust-region least squares (scipy) from a closed-form initial value.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np
from sklearn.base import BaseEstimator
from sklearn.exceptions import NotFittedError
from sklearn.utils.validation import check_is_fitted

from foundation import validate as check
from foundation.errors import InputError
from interference import raw_layout
from interference.latency import predict_gpu
from interference.least_squares import bounded_least_squares
from interference.profile import (
    DEFAULT_BEYOND_SLI_P99_MS,
    DEFAULT_FIT_ERROR,
    DEFAULT_SERVING_P99_MS,
    DOMAIN_MAX_BATCH,
    MIN_SHARE_STEP_PCT,
    SHARE_STEP_RULE,
    DeviceProfile,
    FitDomain,
    GpuProfile,
    ModelProfile,
    active_time_problems,
    share_step_count,
)

if TYPE_CHECKING:
    from interference.profiling import ProfileSession

#: Grid of the solo profile: rows are batch sizes, columns MPS shares (percent); (batch, share) of the three
#: L2-utilisation points, in the order stored (the raw layout's: `interference.raw_layout`).
GRID_BATCHES, GRID_SHARES, L2_POINTS = raw_layout.GRID_BATCHES, raw_layout.GRID_SHARES, raw_layout.L2_POINTS
K_NAMES = ("k1", "k2", "k3", "k4", "k5")
#: The quantile of the in-sample |relative residual| that sets a fit's error floor (`FitDomain.floor`).
ERROR_QUANTILE = 0.9


class RawProfileError(InputError):
    """Raw measurements are missing a field or hold an unusable value."""


def _field(section: Mapping[str, Any], section_name: str, key: str) -> Any:
    if key not in section:
        raise RawProfileError(
            f'section {section_name!r} lacks field {key!r}; add it (README.md, "Bring your own profile", lists the '
            "raw layout's keys)"
        )
    return section[key]


def _grid(section: Mapping[str, Any], name: str, key: str) -> np.ndarray:
    grid = np.asarray(_field(section, name, key), dtype=float)
    if grid.shape != (len(GRID_BATCHES), len(GRID_SHARES)) or not np.all(np.isfinite(grid)):
        raise RawProfileError(
            f"section {name!r} field {key!r} must be a 3x3 grid of numbers "
            f"[batch {list(GRID_BATCHES)}][share {list(GRID_SHARES)}], got {grid.tolist()!r}"
        )
    return grid


def _series(section: Mapping[str, Any], name: str, key: str, length: int) -> np.ndarray:
    values = np.asarray(_field(section, name, key), dtype=float)
    if values.shape != (length,) or not np.all(np.isfinite(values)):
        raise RawProfileError(
            f"section {name!r} field {key!r} must be a list of {length} numbers, got {values.tolist()!r}"
        )
    return values


def _positive(section: Mapping[str, Any], name: str, key: str) -> float:
    return check.positive(_field(section, name, key), f"section {name!r} field {key!r}", error=RawProfileError)


def fit_gpu(hardware: Mapping[str, Any], name: str) -> GpuProfile:
    """GPU-type coefficients from the ``hardware`` section.

    Scheduling delay: per-kernel idle time of p = 1..5 co-located copies,
    normalised to the max clock, as increase over p = 1, fitted linearly for
    p >= 2. Clock vs power: readings at the cap are saturated, so the demanded
    power is extrapolated from the unthrottled copies (linear in p) and
    f - F = a_f * (P_demand - P_max) is fitted through the origin.
    """
    max_freq = _positive(hardware, "hardware", "maxGPUfrequency")
    power_cap = _positive(hardware, "hardware", "maxGPUpower")
    idle_power = _positive(hardware, "hardware", "idlepower")
    bandwidth = _positive(hardware, "hardware", "bandwidth")
    step = _positive(hardware, "hardware", "unit")
    if share_step_count(step) is None:
        raise check.fail("section 'hardware' field 'unit'", SHARE_STEP_RULE, step, error=RawProfileError)
    power = _series(hardware, "hardware", "power", 5)
    freq = _series(hardware, "hardware", "frequency", 5)
    idle = _series(hardware, "hardware", "idletime", 5)
    copies = np.arange(1, 6, dtype=float)

    normalised_idle = idle * freq / max_freq
    growth = normalised_idle[1:] - normalised_idle[0]
    sched_slope, sched_intercept = np.polyfit(copies[1:], growth, 1)

    unthrottled = freq >= max_freq - 1e-9
    if unthrottled.sum() >= 2:
        slope, intercept = np.polyfit(copies[unthrottled], power[unthrottled], 1)
        demanded = np.where(unthrottled, power, slope * copies + intercept)
    else:
        demanded = power
    over = demanded - power_cap
    throttled = (~unthrottled) & (over > 0)
    if throttled.any():
        x, y = over[throttled], freq[throttled] - max_freq
        freq_slope = float(np.dot(x, y) / np.dot(x, x))
    else:
        freq_slope = 0.0  # never observed throttling: assume the clock holds
    return GpuProfile(
        name=name,
        max_freq_mhz=max_freq,
        power_cap_w=power_cap,
        idle_power_w=idle_power,
        pcie_bytes_per_ms=bandwidth,
        share_step_pct=step,
        sched_slope_ms=float(sched_slope),
        sched_intercept_ms=float(sched_intercept),
        freq_slope_mhz_per_w=min(0.0, freq_slope),
        memory_mib=_optional(hardware, "hardware", "memory_mib"),
        context_mib=_optional(hardware, "hardware", "context_mib"),
        max_clients=int(_optional(hardware, "hardware", "max_clients")),
    )


def _optional(section: Mapping[str, Any], name: str, key: str) -> float:
    """A non-negative figure the raw layout may leave out (memory, client limit): 0 = not recorded."""
    if key not in section:
        return 0.0
    return check.non_negative(section[key], f"section {name!r} field {key!r}", error=RawProfileError)


def _active_time(params: np.ndarray, batch: np.ndarray, share: np.ndarray) -> np.ndarray:
    k1, k2, k3, k4, k5 = params
    return (k1 * batch * batch + k2 * batch + k3) / (share + k4) + k5


def active_time_bounds(share: np.ndarray, active_ms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Bounds of (k1..k5): k4 > -min(r) keeps the denominator positive over the profiled range."""
    return (
        np.array([-np.inf, -np.inf, -np.inf, -0.9 * share.min(), 0.0]),
        np.array([np.inf, np.inf, np.inf, 10 * share.max(), active_ms.min()]),
    )


def fit_active_time(batch: np.ndarray, share: np.ndarray, active_ms: np.ndarray) -> tuple[float, ...]:
    """Bounded least squares for k_act(b, r) = (k1 b^2 + k2 b + k3)/(r + k4) + k5.

    Residuals are relative (the grid spans two orders of magnitude, and a
    relative error is what an SLO check feels). Initial value: k4 = k5 = 0
    and k1..k3 from the linear fit of active_ms * r.
    """
    design = np.column_stack([batch**2, batch, np.ones_like(batch)])
    k123, *_ = np.linalg.lstsq(design, active_ms * share, rcond=None)
    x0 = np.array([*k123, 0.0, 0.0])
    lower, upper = active_time_bounds(share, active_ms)

    def residual(params: np.ndarray) -> np.ndarray:
        return (_active_time(params, batch, share) - active_ms) / active_ms

    return tuple(float(v) for v in bounded_least_squares(residual, x0, lower, upper))


def leave_one_out_errors(batch: np.ndarray, share: np.ndarray, active_ms: np.ndarray) -> np.ndarray | None:
    """|measured - refitted| / refitted at each point, the model refitted without that point.

    None when leaving a point out leaves fewer than 6 points (5 coefficients and one to spare): the
    refit would pass through the rest and say nothing about the point left out.
    """
    n = len(active_ms)
    if n - 1 < len(K_NAMES) + 1:
        return None
    out = np.empty(n)
    for i in range(n):
        keep = np.arange(n) != i
        refitted = fit_active_time(batch[keep], share[keep], active_ms[keep])
        predicted = float(_active_time(np.asarray(refitted), batch[i], share[i]))
        out[i] = abs(active_ms[i] - predicted) / predicted if predicted > 0 else 10.0
    return np.minimum(out, 10.0)


def fit_domain(k_act: Sequence[float], batch: np.ndarray, share: np.ndarray, active_ms: np.ndarray) -> FitDomain:
    """The measured domain of one model and its fit's out-of-sample error (see `FitDomain`).

    Points off a full batches x shares grid leave holes; a hole takes the largest error measured.
    With too few points for leave-one-out every cell is `DEFAULT_FIT_ERROR`.
    """
    batches = tuple(sorted({int(b) for b in batch}))
    shares = tuple(sorted({float(r) for r in share}))
    loo = leave_one_out_errors(batch, share, active_ms)
    if loo is None:
        grid = np.full((len(batches), len(shares)), DEFAULT_FIT_ERROR)
        floor = DEFAULT_FIT_ERROR
    else:
        grid = np.full((len(batches), len(shares)), float(loo.max()))
        cells: dict[tuple[int, int], list[float]] = {}
        for b, r, e in zip(batch, share, loo):
            cells.setdefault((batches.index(int(b)), shares.index(float(r))), []).append(float(e))
        for (i, j), errors in cells.items():
            grid[i, j] = max(errors)
        residual = np.abs(_active_time(np.asarray(k_act), batch, share) - active_ms) / active_ms
        inflate = math.sqrt(len(active_ms) / (len(active_ms) - len(K_NAMES)))
        floor = float(np.quantile(residual, ERROR_QUANTILE)) * inflate
    return FitDomain(
        batches=batches,
        shares=shares,
        error=tuple(tuple(round(float(v), 6) for v in row) for row in grid),
        floor=round(min(floor, 10.0), 6),
    )


def active_points(section: Mapping[str, Any], name: str, gpu: GpuProfile) -> tuple[np.ndarray, ...]:
    """(batch, share, active ms) of the solo grid: latency normalised to the max clock, less the idle time."""
    idle_solo = float(_field(section, name, "idletime_1"))
    latency = _grid(section, name, "gpulatency")
    freq = _grid(section, name, "frequency")
    batch = np.repeat(np.asarray(GRID_BATCHES, float), len(GRID_SHARES))
    share = np.tile(np.asarray(GRID_SHARES, float), len(GRID_BATCHES))
    active = (latency * freq / gpu.max_freq_mhz).ravel() - idle_solo
    if np.any(active <= 0):
        raise RawProfileError(f"section {name!r}: 'gpulatency' must exceed 'idletime_1' at every grid point")
    return batch, share, active


def fit_model(section: Mapping[str, Any], name: str, gpu: GpuProfile) -> ModelProfile:
    """Model coefficients on one GPU type from its raw section (see module doc)."""
    kernels = int(_field(section, name, "kernel"))  # a whole number >= 1 (`raw_layout`; 20.0 reads as 20)
    idle_solo = float(_field(section, name, "idletime_1"))
    power = _grid(section, name, "power")
    freq = _grid(section, name, "frequency")
    l2_points = _series(section, name, "l2caches", len(L2_POINTS))
    bytes_in = _positive(section, name, "inputdata")
    bytes_out = _positive(section, name, "outputdata")

    batch, share, active = active_points(section, name, gpu)
    k_act = fit_active_time(batch, share, active)
    ability = 1000.0 * batch / _active_time(np.asarray(k_act), batch, share)

    unthrottled = freq.ravel() >= gpu.max_freq_mhz - 1e-9
    if unthrottled.sum() < 2:
        raise RawProfileError(f"section {name!r}: need at least two unthrottled grid points to fit power")
    power_slope, power_intercept = np.polyfit(ability[unthrottled], power.ravel()[unthrottled] - gpu.idle_power_w, 1)

    point_ability = np.array(
        [1000.0 * b / _active_time(np.asarray(k_act), np.float64(b), np.float64(r)) for b, r in L2_POINTS]
    )
    l2_slope, l2_intercept = np.polyfit(point_ability, l2_points, 1)

    active_1 = _positive(section, name, "activetime_1")
    active_2 = _positive(section, name, "activetime_2")
    freq_2 = _positive(section, name, "frequency_2")
    l2_single = _positive(section, name, "l2cache")
    alpha = ((active_2 * freq_2 / gpu.max_freq_mhz) / active_1 - 1.0) / l2_single

    return ModelProfile(
        name=name,
        kernels=kernels,
        idle_time_ms=idle_solo,
        k_act=k_act,
        power_slope_w=float(power_slope),
        power_intercept_w=float(power_intercept),
        l2_slope=float(l2_slope),
        l2_intercept=float(l2_intercept),
        cache_sensitivity=max(0.0, float(alpha)),
        bytes_in=int(bytes_in),
        bytes_out=int(bytes_out),
        domain=fit_domain(k_act, batch, share, active),
        weights_mib=_optional(section, name, "weights_mib"),
        activation_mib=_optional(section, name, "activation_mib"),
    )


@dataclass(frozen=True)
class FitPoint:
    """One profiled point: what was measured and what the fitted k_act gives there."""

    batch: int
    share_pct: float
    measured_ms: float
    fitted_ms: float

    @property
    def error_pct(self) -> float:
        return 100.0 * (self.fitted_ms - self.measured_ms) / self.measured_ms


@dataclass(frozen=True)
class FitReport:
    """How well one model's k_act fits its points, and whether it is usable over the whole domain.

    `problems` (non-positive or non-monotone somewhere in batch 1..max x every
    share step) make the fit unusable: the solver would plan with it and
    `predict` fail later. `at_bounds` names coefficients the optimiser pushed
    to a bound: the data could not pin them, worth a look but not wrong as such.
    """

    model: str
    points: tuple[FitPoint, ...]
    mape_pct: float
    r2: float
    at_bounds: tuple[str, ...]
    problems: tuple[str, ...]
    #: measured points left out of the fit, each with why (non-monotone: contention on a CPU node)
    excluded: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.problems


def active_time_report(
    model: str,
    k_act: Sequence[float],
    batch: np.ndarray,
    share: np.ndarray,
    measured_ms: np.ndarray,
    *,
    share_step_pct: float,
    max_batch: int = DOMAIN_MAX_BATCH,
) -> FitReport:
    """Per-point error, MAPE and R^2 of a fitted k_act, and its checks over the domain.

    Domain: every whole batch 1..max(max_batch, largest profiled) x every share
    step up to 100%. There k_act must lie between `MIN_ACTIVE_MS` and
    `MAX_ACTIVE_MS`, must not fall by more than `MONOTONE_TOLERANCE` when the
    batch grows by one, nor rise by more than that when the share grows by one
    step (`interference.profile.active_time_problems`, which the profile reader
    runs too).
    """
    params = np.asarray(k_act, dtype=float)
    fitted = _active_time(params, batch, share)
    points = tuple(
        FitPoint(int(b), float(r), float(m), float(f)) for b, r, m, f in zip(batch, share, measured_ms, fitted)
    )
    mape = float(np.mean(np.abs(fitted - measured_ms) / measured_ms) * 100.0)
    spread = float(np.sum((measured_ms - measured_ms.mean()) ** 2))
    r2 = 1.0 - float(np.sum((fitted - measured_ms) ** 2)) / spread if spread > 0 else float("nan")
    lower, upper = active_time_bounds(share, measured_ms)
    at_bounds = tuple(
        f"{name} = {value:.6g} ({side} bound)"
        for name, value, lo, hi in zip(K_NAMES, params, lower, upper)
        for side, bound in (("lower", lo), ("upper", hi))
        if np.isfinite(bound) and abs(value - bound) <= 1e-6 * max(1.0, abs(bound))
    )
    problems = active_time_problems(params, share_step_pct, max(max_batch, int(batch.max())))
    return FitReport(model=model, points=points, mape_pct=mape, r2=r2, at_bounds=at_bounds, problems=problems)


class InterferenceModel(BaseEstimator):
    """Interference-aware latency model of one GPU type.

    ``fit(raw)`` takes the raw sections (``{"hardware": {...}, "<model>":
    {...}}``) and learns ``profile_`` (a `DeviceProfile`) and ``reports_``
    (a `FitReport` per model: errors, and checks over the domain). ``predict(X)``
    takes a list of GPU configurations, each a list of ``(model, batch,
    share_pct)``, and returns for each a list of ``(latency_ms,
    throughput_rps)``.
    """

    def __init__(self, gpu_name: str = "V100"):
        self.gpu_name = gpu_name

    def fit(self, raw: Mapping[str, Mapping[str, Any]], y: None = None) -> InterferenceModel:
        if "hardware" not in raw:
            raise RawProfileError("raw profile has no 'hardware' section; add the GPU measurements")
        for section, values in raw.items():  # `parse_raw` checked a file's already, at its lines
            problem = raw_layout.section_problem(section) or next(
                (p for key, value in values.items() if (p := raw_layout.key_problem(section, key, value))), ""
            )
            if problem:
                raise RawProfileError(problem)
        gpu = fit_gpu(raw["hardware"], self.gpu_name)
        models = {name: fit_model(section, name, gpu) for name, section in sorted(raw.items()) if name != "hardware"}
        if not models:
            raise RawProfileError("raw profile holds no model section; profile at least one model")
        self.profile_ = DeviceProfile(gpu=gpu, models=models)
        self.reports_ = {
            name: active_time_report(
                name, models[name].k_act, *active_points(raw[name], name, gpu), share_step_pct=gpu.share_step_pct
            )
            for name in models
        }
        return self

    @classmethod
    def from_profile(cls, profile: DeviceProfile) -> InterferenceModel:
        model = cls(gpu_name=profile.gpu.name)
        model.profile_ = profile
        return model

    def predict(self, X: Sequence[Sequence[tuple[str, float, float]]]) -> list[list[tuple[float, float]]]:
        try:
            check_is_fitted(self, "profile_")
        except NotFittedError as err:
            raise NotFittedError(f"{err}; call fit(raw) or InterferenceModel.from_profile(profile) first") from None
        out = []
        for config in X:
            predictions = predict_gpu(self.profile_, config)
            out.append([(p.latency_ms, p.throughput_rps) for p in predictions])
        return out


def _memory_line(session: ProfileSession, points: Sequence[Any]) -> tuple[float, float]:
    """(weights, activations per request) in MiB from the serving process's RSS at each batch size.

    The largest RSS seen at each batch (over shares), fitted as a line in the batch: the intercept is
    the process with the model loaded (on a CPU node there is no separate device context, so
    Triton's own memory is in it), the slope what one more request of a batch adds. (0, 0) when
    fewer than two batch sizes have a reading (not recorded).
    """
    by_batch: dict[int, float] = {}
    for p in points:
        memory = session.memory_mib.get(p.key)
        if memory is not None:
            by_batch[p.batch] = max(by_batch.get(p.batch, 0.0), memory)
    if len(by_batch) < 2:
        return 0.0, 0.0
    slope, intercept = np.polyfit(np.array(sorted(by_batch), float), [by_batch[b] for b in sorted(by_batch)], 1)
    return round(max(0.0, float(intercept)), 3), round(max(0.0, float(slope)), 3)


def fit_measured_profile(session: ProfileSession) -> DeviceProfile:
    """A device profile from `stoke profile run` measurements (see `fit_measured`)."""
    return fit_measured(session)[0]


def fit_measured(session: ProfileSession) -> tuple[DeviceProfile, dict[str, FitReport]]:
    """A device profile from `stoke profile run` measurements (a CPU node, typically), and its fit reports.

    Same model form as a GPU, with what a CPU node lacks switched off: the
    share is whole cores (step = 100/cores); no power cap, no clock drop, no
    scheduling-delay growth; input/output transfer is inside the measured
    latency (bandwidth set so high the transfer term vanishes). k_act is
    fitted on the (batch, share) grid with the same bounded least squares as
    a GPU. Interference: every co-located workload adds one unit of "cache
    pressure" (c = 1), and alpha is the measured slowdown with one busy
    neighbour: alpha = t_pair / t_solo - 1.

    Why a CPU differs: a share is whole cores, each running its own model
    instance, and one batch runs on one core. A bigger share adds instances
    (throughput), not speed, and on a small machine its extra cores are the
    ones the load generator and Triton also use: measured there, a batch can
    be slower at 100% than at 50%. The model (k_act falls with the share)
    cannot follow that, and it is contention, not the model: such
    non-monotone points (`ProfileSession.excluded_from_fit`, the slower of
    each pair) are left out of the fit and listed in the report.
    """
    from interference.profiling import MeasurePoint

    if not session.measured:
        done, total = session.progress()
        raise RawProfileError(f"measurements are incomplete ({done}/{total} points); resume `stoke profile run`")
    if share_step_count(100.0 / session.cores) is None:
        raise RawProfileError(
            f"measured on {session.cores} cores: a profile's share step is a whole number of cores and at least "
            f"{MIN_SHARE_STEP_PCT:g}%, so at most {round(100 / MIN_SHARE_STEP_PCT)} cores; measure on fewer cores "
            "(taskset -c, or a CPU limit)"
        )
    gpu = GpuProfile(
        name=session.device,
        max_freq_mhz=1.0,
        power_cap_w=1e9,
        idle_power_w=0.0,
        pcie_bytes_per_ms=1e12,
        share_step_pct=round(100.0 / session.cores, 6),
        sched_slope_ms=0.0,
        sched_intercept_ms=0.0,
        freq_slope_mhz_per_w=0.0,
    )
    models, reports = {}, {}
    excluded = session.excluded_from_fit()
    for model in session.models:
        points = [p for p in session.points() if p.model == model and p.neighbours == 0 and p.key not in excluded]
        batch = np.array([p.batch for p in points], dtype=float)
        share = np.array([p.share_pct for p in points], dtype=float)
        latency = np.array([session.results[p.key] for p in points])
        # an excluded point slower at a bigger share stands in the fit for the latency at the nearest smaller
        # share of its batch (a bigger share is not slower: on a CPU one batch runs on one core, so it is not
        # faster either), so the fit stays flat in the share instead of guessing a slope from one share
        stand_ins = [
            (q.batch, q.share_pct, session.results[kept[-1].key])
            for q in session.points()
            if q.model == model
            and q.neighbours == 0
            and q.key in excluded
            and (kept := [p for p in points if p.batch == q.batch and p.share_pct < q.share_pct])
        ]
        k_act = fit_active_time(
            np.concatenate([batch, [b for b, _, _ in stand_ins]]),
            np.concatenate([share, [r for _, r, _ in stand_ins]]),
            np.concatenate([latency, [ms for _, _, ms in stand_ins]]),
        )
        reports[model] = replace(
            active_time_report(model, k_act, batch, share, latency, share_step_pct=gpu.share_step_pct),
            excluded=tuple(f"{key}: {why}" for key, why in excluded.items() if key.startswith(f"{model}|")),
        )
        alpha = 0.0
        if session.cores >= 2:
            b, s = session.colocation_batch, session.shares[0]
            pair = session.results[MeasurePoint(model, s, b, 1).key]
            solo = session.results.get(MeasurePoint(model, s, b).key) or float(_active_time(np.asarray(k_act), b, s))
            alpha = max(0.0, pair / solo - 1.0)
        bytes_in, bytes_out = session.model_bytes.get(model, (0, 0))
        # every solo point read the process's memory, also one left out of the latency fit (slower at a
        # bigger share is a busy CPU, not a wrong RSS)
        read_memory = [p for p in session.points() if p.model == model and p.neighbours == 0]
        weights_mib, activation_mib = _memory_line(session, read_memory)
        models[model] = ModelProfile(
            name=model,
            kernels=1,
            idle_time_ms=0.0,
            k_act=k_act,
            power_slope_w=0.0,
            power_intercept_w=0.0,
            l2_slope=0.0,
            l2_intercept=1.0,
            cache_sensitivity=alpha,
            bytes_in=bytes_in,
            bytes_out=bytes_out,
            serving_p99_ms=session.serving_p99_ms.get(model, DEFAULT_SERVING_P99_MS),
            beyond_sli_p99_ms=session.beyond_sli_p99_ms.get(model, DEFAULT_BEYOND_SLI_P99_MS),
            domain=fit_domain(k_act, batch, share, latency),
            weights_mib=weights_mib,
            activation_mib=activation_mib,
        )
    return DeviceProfile(gpu=gpu, models=models), reports
