"""The raw measurement layout (iGniter's): each section's keys, and what each key's value must be.

A raw profile is sections of keys: ``hardware`` and one section per model, named by the model (README.md,
"Bring your own profile"). `key_problem` checks one value against its key's rule before anything is fitted,
so a wrong value is named at its key (and `interference.profile_io.parse_raw` adds the file and line), not
by numpy, scipy or the fitted profile's reader afterwards. Pure: no numpy, no files.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass
from typing import Any

from foundation.names import NAME_RULE, is_name, shown
from interference.bounds import MAX_CLIENTS, MAX_KERNELS, MAX_MEMORY_MIB

HARDWARE = "hardware"
#: Rows (batch sizes) and columns (MPS shares, %) of a model's 3x3 grids.
GRID_BATCHES = (1, 16, 32)
GRID_SHARES = (10, 50, 100)
#: (batch, share) of the three L2-utilisation points of `l2caches`, in the order stored.
L2_POINTS = ((1, 10), (16, 50), (32, 100))
#: Keys of iGniter's layout that the fit does not use: accepted, whatever their value, and ignored.
IGNORED_KEYS = frozenset({"transferdata", "power_2", "htddur"})

#: Sane maxima: above any device's, low enough that the fit's arithmetic stays finite.
MAX_MS = 3_600_000.0  # an hour (`interference.profile.MAX_ACTIVE_MS`)
MAX_MHZ = 10_000.0
MAX_WATTS = 100_000.0
MAX_BYTES_PER_MS = 1e12  # PCIe bandwidth, 1 PB/s
MAX_BYTES = 10**12  # bytes per request, 1 TB
FIX = 'correct the measurement (README.md, "Bring your own profile", lists the raw keys)'


@dataclass(frozen=True)
class RawKey:
    """One key's rule: a number of `unit` in [low, high] (above `low` when `above_low`), whole when `whole`,
    alone or as a list (`shape` (5,)), or a grid (`shape` (3, 3)); `shows` says what a list or grid holds."""

    unit: str
    low: float
    high: float
    above_low: bool = False
    whole: bool = False
    shape: tuple[int, ...] = ()
    shows: str = ""

    def rule(self) -> str:
        kind = "whole number" if self.whole else "percentage" if self.unit == "%" else "number"
        unit = f" of {self.unit}" if self.unit and self.unit != "%" else ""
        high = f"{int(self.high):,}" if float(self.high).is_integer() else f"{self.high:g}"
        bound = f"above {self.low:g}, up to {high}" if self.above_low else f"from {self.low:g} to {high}"
        one = f"{kind}{unit} {bound}"
        if not self.shape:
            return f"a {one}"
        if len(self.shape) == 1:
            return f"a list of {self.shape[0]} {kind}s ({self.shows}), each a {one}"
        return f"a {self.shape[0]}x{self.shape[1]} grid {self.shows}, each a {one}"

    def fits(self, value: Any) -> bool:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return False
        if self.whole and not float(value).is_integer():
            return False
        return (value > self.low if self.above_low else value >= self.low) and value <= self.high

    def problem(self, value: Any) -> str:
        """Where `value` breaks the rule ("" when it does not): the list's or grid's shape, or its first bad item."""
        if not self.shape:
            return "" if self.fits(value) else " "
        if not isinstance(value, list) or len(value) != self.shape[0]:
            return f" (not a list of {self.shape[0]})"
        for i, row in enumerate(value):
            if len(self.shape) == 1:
                if not self.fits(row):
                    return f" (item [{i}] is {shown(row)})"
                continue
            if not isinstance(row, list) or len(row) != self.shape[1]:
                return f" (row [{i}] is not a list of {self.shape[1]})"
            for j, item in enumerate(row):
                if not self.fits(item):
                    return f" (item [{i}][{j}] is {shown(item)})"
        return ""


_GRID = (len(GRID_BATCHES), len(GRID_SHARES))
_GRID_SHOWS = f"[batch {', '.join(map(str, GRID_BATCHES))}][share {', '.join(map(str, GRID_SHARES))}%]"
_COPIES = "with 1-5 concurrent copies"
_MEMORY = RawKey("MiB", 0, MAX_MEMORY_MIB)

HARDWARE_KEYS: dict[str, RawKey] = {
    "maxGPUfrequency": RawKey("MHz", 0, MAX_MHZ, above_low=True),
    "maxGPUpower": RawKey("W", 0, MAX_WATTS, above_low=True),
    "idlepower": RawKey("W", 0, MAX_WATTS, above_low=True),
    "bandwidth": RawKey("bytes/ms", 0, MAX_BYTES_PER_MS, above_low=True),
    "unit": RawKey("%", 0, 100, above_low=True),
    "power": RawKey("W", 0, MAX_WATTS, above_low=True, shape=(5,), shows=_COPIES),
    "frequency": RawKey("MHz", 0, MAX_MHZ, above_low=True, shape=(5,), shows=_COPIES),
    "idletime": RawKey("ms", 0, MAX_MS, shape=(5,), shows=_COPIES),
    "memory_mib": _MEMORY,
    "context_mib": _MEMORY,
    "max_clients": RawKey("", 0, MAX_CLIENTS, whole=True),
}
MODEL_KEYS: dict[str, RawKey] = {
    "gpulatency": RawKey("ms", 0, MAX_MS, above_low=True, shape=_GRID, shows=_GRID_SHOWS),
    "power": RawKey("W", 0, MAX_WATTS, above_low=True, shape=_GRID, shows=_GRID_SHOWS),
    "frequency": RawKey("MHz", 0, MAX_MHZ, above_low=True, shape=_GRID, shows=_GRID_SHOWS),
    "kernel": RawKey("kernels", 1, MAX_KERNELS, whole=True),
    "idletime_1": RawKey("ms", 0, MAX_MS),
    "l2caches": RawKey("%", 0, 100, shape=(3,), shows="at (1, 10%), (16, 50%), (32, 100%)"),
    "l2cache": RawKey("%", 0, 100, above_low=True),
    "activetime_1": RawKey("ms", 0, MAX_MS, above_low=True),
    "activetime_2": RawKey("ms", 0, MAX_MS, above_low=True),
    "frequency_2": RawKey("MHz", 0, MAX_MHZ, above_low=True),
    "inputdata": RawKey("bytes", 0, MAX_BYTES, above_low=True, whole=True),
    "outputdata": RawKey("bytes", 0, MAX_BYTES, above_low=True, whole=True),
    "weights_mib": _MEMORY,
    "activation_mib": _MEMORY,
}


def section_problem(section: str) -> str:
    """Why `section` cannot name a raw section ("" when it can): 'hardware' or a model's name."""
    if section == HARDWARE or is_name(section):
        return ""
    return (
        f"section {shown(section)} is neither 'hardware' nor a model name ({NAME_RULE}); name the section after "
        "the model it measures"
    )


def key_problem(section: str, key: str, value: Any) -> str:
    """Why `value` cannot be `key` of `section` ("" when it can): an unknown key, or a value against its rule.

    Worded to follow "FILE:LINE: " (or nothing)."""
    if key in IGNORED_KEYS:
        return ""
    known = HARDWARE_KEYS if section == HARDWARE else MODEL_KEYS
    where = f"section {shown(section)} key {shown(key)}"
    rule = known.get(key)
    if rule is None:
        close = difflib.get_close_matches(key, [*known, *IGNORED_KEYS], n=1)
        guess = f" (did you mean {close[0]!r}?)" if close else ""
        kind = "the hardware section" if section == HARDWARE else "a model section"
        return (
            f"section {shown(section)} has unknown key {shown(key)}{guess}; the keys of {kind} are "
            f"{', '.join(known)} ({', '.join(sorted(IGNORED_KEYS))} are accepted and ignored)"
        )
    problem = rule.problem(value)
    if not problem:
        return ""
    return f"{where} must be {rule.rule()}, got {shown(value)}{problem.rstrip()}; {FIX}"
