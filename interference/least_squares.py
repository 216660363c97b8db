"""Shared fitting helper: deterministic bounded least squares.

Every estimator in `interference` (latency and training) fits its
coefficients the same way: a closed-form initial value, clipped strictly
inside the bounds, then scipy's trust-region reflective least squares with
Jacobian scaling. No randomness, so the same data give the same coefficients.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt
from scipy.optimize import least_squares

Vector = npt.NDArray[np.float64]


def bounded_least_squares(
    residual: Callable[[Vector], Vector], x0: Vector, lower: Vector, upper: Vector, *, max_nfev: int = 5000
) -> Vector:
    """Minimise ``sum(residual(x)**2)`` subject to ``lower <= x <= upper``.

    `x0` is clipped just inside the bounds first (scipy refuses an initial
    value on a bound). Returns the coefficients as a float array.
    """
    lower = np.asarray(lower, dtype=float)
    upper = np.asarray(upper, dtype=float)
    span = np.where(np.isfinite(upper - lower), upper - lower, 1.0)
    eps = np.maximum(1e-9, 1e-9 * np.abs(span))
    start = np.clip(np.asarray(x0, dtype=float), lower + eps, upper - eps)
    result = least_squares(residual, start, bounds=(lower, upper), method="trf", x_scale="jac", max_nfev=max_nfev)
    return np.asarray(result.x, dtype=float)
