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


def assert_close(actual: Any, expected: Any, rel: float = REFIT_REL, where: str = "") -> None:
    """Assert two nested structures (dicts, lists, tuples, numbers, strings) are equal, floats within rel.

    Keys, lengths, strings, ints and bools must match exactly. A float is within rel of its expected value;
    a list of numbers is one vector (fitted coefficients), so each entry is within rel of the vector's
    largest entry: a coefficient near zero is as well determined as its neighbours, not better.
    """
    here = where or "value"
    if isinstance(expected, Mapping):
        assert isinstance(actual, Mapping), f"{here}: expected a mapping, got {actual!r}"
        assert set(actual) == set(expected), f"{here}: keys {sorted(actual)} != {sorted(expected)}"
        for key in expected:
            assert_close(actual[key], expected[key], rel, f"{where}.{key}" if where else str(key))
    elif isinstance(expected, Sequence) and not isinstance(expected, str | bytes):
        assert isinstance(actual, Sequence) and not isinstance(actual, str | bytes), f"{here}: got {actual!r}"
        assert len(actual) == len(expected), f"{here}: length {len(actual)} != {len(expected)}"
        numbers = [e for e in expected if isinstance(e, int | float) and not isinstance(e, bool)]
        scale = max((abs(e) for e in numbers), default=0.0) if len(numbers) == len(expected) else 0.0
        for i, (a, e) in enumerate(zip(actual, expected)):
            if scale:
                _close(a, e, rel, rel * scale, f"{here}[{i}]")
            else:
                assert_close(a, e, rel, f"{here}[{i}]")
    elif isinstance(expected, float) or isinstance(actual, float):
        _close(actual, expected, rel, 0.0, here)
    else:
        assert actual == expected, f"{here}: {actual!r} != {expected!r}"


def _close(actual: Any, expected: float, rel: float, abs_tol: float, where: str) -> None:
    assert isinstance(actual, int | float) and not isinstance(actual, bool), f"{where}: got {actual!r}"
    assert actual == expected or math.isclose(actual, expected, rel_tol=rel, abs_tol=abs_tol), (
        f"{where}: {actual!r} != {expected!r} (rel {rel:g}, abs {abs_tol:g})"
    )
