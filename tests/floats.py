"""Compare computed floats with a tolerance: the rule is in tests/conftest.py's docstring."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

#: A refit agrees with one made on another machine only as far as its least-squares solver converged:
#: scipy's least_squares stops at ftol = xtol = 1e-8, which fixes coefficients to about sqrt(1e-8) = 1e-4
#: along flat directions, and the power and L2 lines are fitted over those coefficients. Measured on this
#: project's machines against the bundled V100 profile: up to 1.6e-6 (scalars), 1.2e-8 (a coefficient
#: vector, against its largest entry). A real change to the data, the model or the fit moves them by far more.
REFIT_REL = 1e-4

#: A field the product rounds to 6 decimals (a fit's `domain.error` grid and `floor`, interference/fit.py)
#: moves in steps of 1e-6 when a refit lands a hair away, more than rel 1e-4 of a small row (1.75e-6 seen):
#: such fields also pass within two rounding steps.
ROUNDED_6_ABS = 2e-6

#: The fields of a profile (`profile_to_dict`) stored rounded to 6 decimals, for assert_close's abs_tol.
PROFILE_ROUNDED = {"error": ROUNDED_6_ABS, "floor": ROUNDED_6_ABS}


def assert_close(
    actual: Any, expected: Any, rel: float = REFIT_REL, where: str = "", abs_tol: Mapping[str, float] | None = None
) -> None:
    """Assert two nested structures (dicts, lists, tuples, numbers, strings) are equal, floats within rel.

    Keys, lengths, strings, ints and bools must match exactly. A float is within rel of its expected value;
    a list of numbers is one vector (fitted coefficients), so each entry is within rel of the vector's
    largest entry: a coefficient near zero is as well determined as its neighbours, not better.
    abs_tol maps a key name to an absolute tolerance for the floats under that key, at any depth (rounded
    fields: PROFILE_ROUNDED); there a float passes within either tolerance.
    """
    _walk(actual, expected, rel, where, abs_tol or {}, 0.0)


def _walk(actual: Any, expected: Any, rel: float, where: str, abs_tol: Mapping[str, float], floor: float) -> None:
    here = where or "value"
    if isinstance(expected, Mapping):
        assert isinstance(actual, Mapping), f"{here}: expected a mapping, got {actual!r}"
        assert set(actual) == set(expected), f"{here}: keys {sorted(actual)} != {sorted(expected)}"
        for key in expected:
            inner = max(floor, abs_tol.get(key, 0.0))
            _walk(actual[key], expected[key], rel, f"{where}.{key}" if where else str(key), abs_tol, inner)
    elif isinstance(expected, Sequence) and not isinstance(expected, str | bytes):
        assert isinstance(actual, Sequence) and not isinstance(actual, str | bytes), f"{here}: got {actual!r}"
        assert len(actual) == len(expected), f"{here}: length {len(actual)} != {len(expected)}"
        numbers = [e for e in expected if isinstance(e, int | float) and not isinstance(e, bool)]
        scale = max((abs(e) for e in numbers), default=0.0) if len(numbers) == len(expected) else 0.0
        for i, (a, e) in enumerate(zip(actual, expected)):
            if scale:
                _close(a, e, rel, max(rel * scale, floor), f"{here}[{i}]")
            else:
                _walk(a, e, rel, f"{here}[{i}]", abs_tol, floor)
    elif isinstance(expected, float) or isinstance(actual, float):
        _close(actual, expected, rel, floor, here)
    else:
        assert actual == expected, f"{here}: {actual!r} != {expected!r}"


def _close(actual: Any, expected: float, rel: float, abs_tol: float, where: str) -> None:
    assert isinstance(actual, int | float) and not isinstance(actual, bool), f"{where}: got {actual!r}"
    assert actual == expected or math.isclose(actual, expected, rel_tol=rel, abs_tol=abs_tol), (
        f"{where}: {actual!r} != {expected!r} (rel {rel:g}, abs {abs_tol:g})"
    )
