"""Compare computed floats with a tolerance: the rule is in tests/conftest.py's docstring."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

# A refit on another CPU's BLAS differs around 1e-8 (relative); a real change of a coefficient is far larger.
REFIT_REL = 1e-6


def assert_close(actual: Any, expected: Any, rel: float = REFIT_REL, where: str = "") -> None:
    """Assert two nested structures (dicts, lists, tuples, numbers, strings) are equal, floats within rel.

    Keys, lengths, strings, ints and bools must match exactly; only floats get the tolerance.
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
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_close(a, e, rel, f"{here}[{i}]")
    elif isinstance(expected, float) or isinstance(actual, float):
        assert isinstance(actual, int | float) and not isinstance(actual, bool), f"{here}: got {actual!r}"
        assert math.isclose(actual, expected, rel_tol=rel, abs_tol=0.0) or actual == expected, (
            f"{here}: {actual!r} != {expected!r} (rel {rel:g})"
        )
    else:
        assert actual == expected, f"{here}: {actual!r} != {expected!r}"
