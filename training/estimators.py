"""Fit the training models' coefficients from profiling data. Pure.

scikit-learn style: ``__init__`` stores hyper-parameters only, ``fit``
returns self and sets attributes ending in ``_``, prediction checks the
estimator is fitted. Fits are deterministic (closed-form start, bounded
trust-region least squares through `interference.least_squares`).

- `LossCurveEstimator`: loss(s) = 1/(beta0*s + beta1) + beta2 from a short
  profiling run (samples processed vs loss).
- `SpotLossEstimator`: g1..g5 of the heterogeneous loss model from runs that
  record (b_w, R, n, j, loss).
- `fit_contention`: a1, b1 of P(n) from measured worker bandwidths at
  several cluster sizes (inverting eq 8).
- `fit_batch_memory`: a2, b2 of eq (10) from (GPU memory, largest batch).
- `speed_from_iterations`: samples/s of a worker from measured iteration times.
"""

from __future__ import annotations

import numpy as np
from sklearn.base import BaseEstimator
from sklearn.exceptions import NotFittedError
from sklearn.utils.validation import check_is_fitted

from interference.least_squares import bounded_least_squares
from training.models import Array, ArrayLike, LossCurve, SpotLoss, TrainingError


def _check_fitted(est: object, attr: str) -> None:
    try:
        check_is_fitted(est, attr)
    except NotFittedError as err:
        raise NotFittedError(f"{err}; call fit(...) first") from None


def _finite_1d(name: str, values: ArrayLike, min_len: int) -> Array:
    arr: Array = np.asarray(values, dtype=float).ravel()
    if arr.size < min_len or not np.all(np.isfinite(arr)):
        raise TrainingError(f"{name} must hold at least {min_len} finite numbers")
    return arr


class LossCurveEstimator(BaseEstimator):  # type: ignore[misc]  # scikit-learn ships no type hints
    """Fits loss(s) = 1/(beta0*s + beta1) + beta2 (s: samples processed).

    Residuals are relative to the loss. Start: beta2 just below the smallest
    loss seen times `floor_fraction`, then beta0, beta1 from the linear fit
    of 1/(loss - beta2) against s. Bounds: beta0 > 0, beta1 > 0 (the curve
    starts finite), 0 <= beta2 < min(loss).
    """

    def __init__(self, floor_fraction: float = 0.5) -> None:
        self.floor_fraction = floor_fraction

    def fit(self, samples: ArrayLike, loss: ArrayLike) -> LossCurveEstimator:
        x = _finite_1d("samples", samples, 4)
        y = _finite_1d("loss", loss, 4)
        if x.shape != y.shape:
            raise TrainingError("samples and loss must have the same length")
        if np.any(x < 0) or np.any(y <= 0):
            raise TrainingError("samples must be >= 0 and loss > 0")
        scale = max(float(x.max()), 1.0)
        xs = x / scale  # fit on [0, 1] for conditioning
        floor0 = self.floor_fraction * float(y.min())
        slope, intercept = np.polyfit(xs, 1.0 / (y - floor0), 1)
        x0 = np.array([max(slope, 1e-6), max(intercept, 1e-6), floor0])
        lower = np.array([1e-12, 1e-12, 0.0])
        upper = np.array([np.inf, np.inf, float(y.min()) * (1 - 1e-6)])

        def residual(p: Array) -> Array:
            return np.asarray((1.0 / (p[0] * xs + p[1]) + p[2] - y) / y)

        b0, b1, b2 = bounded_least_squares(residual, x0, lower, upper)
        self.curve_ = LossCurve(beta0=float(b0 / scale), beta1=float(b1), beta2=float(b2))
        pred = self.curve_.loss(x)
        self.rmse_ = float(np.sqrt(np.mean((pred - y) ** 2)))
        self.n_points_ = int(x.size)
        return self

    def predict(self, samples: ArrayLike) -> Array:
        _check_fitted(self, "curve_")
        return np.asarray(self.curve_.loss(np.asarray(samples, dtype=float)))

    def samples_for(self, target_loss: float) -> float:
        _check_fitted(self, "curve_")
        return self.curve_.samples_for(target_loss)


class SpotLossEstimator(BaseEstimator):  # type: ignore[misc]  # scikit-learn ships no type hints
    """Fits g1..g5 of loss = (g2*b_w + g3)*sqrt((r_weight*R + g4)*n)/(j + g1) + g5.

    X has columns (b_w, R, n, j); y is the loss. With r_weight = 0 the R term
    is the constant g4 = 1 (otherwise g4 and g2, g3 are not identifiable).
    Bounds: g1 >= 0, g5 in [0, min(loss)); start from g1 = 0, g5 = 0.9*min
    and (g2, g3) by linear least squares of (loss - g5)*j / sqrt(n*(.)).
    """

    def __init__(self, r_weight: float = 1.0) -> None:
        self.r_weight = r_weight

    def fit(self, X: ArrayLike, y: ArrayLike) -> SpotLossEstimator:
        X = np.asarray(X, dtype=float)
        y = _finite_1d("loss", y, 5)
        if X.ndim != 2 or X.shape != (y.size, 4) or not np.all(np.isfinite(X)):
            raise TrainingError("X must be a (rows, 4) array of b_w, R, n, j")
        b_w, r, n, j = X.T
        if np.any(n < 1) or np.any(j < 0):
            raise TrainingError("n must be >= 1 and j >= 0")
        fit_g4 = self.r_weight != 0
        g5_0 = 0.9 * float(y.min())
        design = np.column_stack([b_w, np.ones_like(b_w)]) * np.sqrt(n * (self.r_weight * r + 1.0))[:, None]
        (g2_0, g3_0), *_ = np.linalg.lstsq(design, (y - g5_0) * (j + 1.0), rcond=None)

        def unpack(p: Array) -> tuple[float, float, float, float, float]:
            g1, g2, g3, g5 = (float(v) for v in p[:4])
            g4 = float(p[4]) if fit_g4 else 1.0
            return g1, g2, g3, g4, g5

        def residual(p: Array) -> Array:
            g1, g2, g3, g4, g5 = unpack(p)
            inner = np.maximum(self.r_weight * r + g4, 1e-12) * n
            return np.asarray(((g2 * b_w + g3) * np.sqrt(inner) / (j + g1) + g5 - y) / y)

        x0 = [1.0, g2_0, g3_0, g5_0] + ([1.0] if fit_g4 else [])
        lower = [0.0, -np.inf, -np.inf, 0.0] + ([-float(r.min()) * self.r_weight + 1e-6] if fit_g4 else [])
        upper = [np.inf, np.inf, np.inf, float(y.min()) * (1 - 1e-6)] + ([np.inf] if fit_g4 else [])
        params = bounded_least_squares(residual, np.array(x0), np.array(lower), np.array(upper), max_nfev=20000)
        g1, g2, g3, g4, g5 = unpack(params)
        self.loss_ = SpotLoss(
            g1=float(g1), g2=float(g2), g3=float(g3), g4=float(g4), g5=float(g5), r_weight=float(self.r_weight)
        )
        self.rmse_ = float(np.sqrt(np.mean((self.predict(X) - y) ** 2)))
        return self

    def predict(self, X: ArrayLike) -> Array:
        _check_fitted(self, "loss_")
        X = np.asarray(X, dtype=float)
        return np.asarray(self.loss_.loss(X[:, 0], X[:, 1], X[:, 2], X[:, 3]))


def fit_contention(
    n: ArrayLike, measured_bw_mb_s: ArrayLike, ps_bw_mb_s: float, required_bw_mb_s: float
) -> tuple[float, float]:
    """(a1, b1) of P(n) = a1*sqrt(n) + b1 from worker bandwidths measured at cluster sizes n.

    Eq (8) inverted: P = (B_req - B_wk) / (B_req - B_ps/n), kept where the
    PS is contended (B_ps/n < B_req) and 0 < P < 1; then a linear fit of P
    against sqrt(n) (at least two such points).
    """
    sizes = _finite_1d("n", n, 2)
    bw = _finite_1d("measured bandwidth", measured_bw_mb_s, 2)
    fair = ps_bw_mb_s / sizes
    use = fair < required_bw_mb_s
    p = np.full_like(sizes, np.nan)
    p[use] = (required_bw_mb_s - bw[use]) / (required_bw_mb_s - fair[use])
    keep = use & (p > 0) & (p < 1)
    if keep.sum() < 2:
        raise TrainingError(
            "need bandwidths at >= 2 contended cluster sizes (B_ps/n < B_req) to fit the contention P(n)"
        )
    a1, b1 = np.polyfit(np.sqrt(sizes[keep]), p[keep], 1)
    if a1 <= 0:
        raise TrainingError("fitted contention does not grow with n (a1 <= 0); measure more sizes")
    return float(a1), float(b1)


def fit_batch_memory(memory_gb: ArrayLike, max_batch: ArrayLike) -> tuple[float, float]:
    """(a2, b2) of eq (10) from the largest batch that fits each GPU's memory (linear fit)."""
    mem = _finite_1d("memory", memory_gb, 2)
    batch = _finite_1d("batch", max_batch, 2)
    a2, b2 = np.polyfit(mem, batch, 1)
    return float(a2), float(b2)


def speed_from_iterations(batch: float, iteration_times_s: ArrayLike) -> float:
    """Samples/s of one worker: batch over the median measured iteration time (robust to warm-up)."""
    times = _finite_1d("iteration times", iteration_times_s, 1)
    if np.any(times <= 0):
        raise TrainingError("iteration times must be positive")
    return float(batch / np.median(times))
