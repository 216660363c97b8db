"""Light-weight profiling as ask/tell: which measurements to take, and what was told.

A `ProfileSession` proposes the next measurement point (`ask`), is told its
result (`tell`), and round-trips through a plain dict (`to_dict` /
`from_dict`) so a runner can checkpoint after every point and resume an
interrupted profile. It does no measuring itself: a runner (for Triton on a
CPU node, `agents.profiler`) drives the load.

Points are grouped so a runner restarts as little as possible: per model,
per share, every batch; then one co-location point per model (a copy of the
same model at the same share running closed-loop beside it).

A point is measured in windows until it is stable (`Stability`, the rule
perf_analyzer uses): a noisy point is measured again rather than recorded
with whatever the first window happened to see.

Once a model's grid is measured, its points must be monotone: a bigger batch
not faster, a bigger share not slower (beyond the stability tolerance). A
point that breaks this is asked again (up to `max_retries` times); one that
still does is rejected (`rejected()`, with the reason) and left out of the
fit. Of a pair that disagrees the slower point is the suspect: another
process on the machine can only slow a measurement down, never speed it up.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from foundation.errors import InputError
from foundation.names import is_name, shown
from interference.profile import DOMAIN_MAX_BATCH, MIN_SHARE_STEP_PCT
from interference.profile_io import MAX_SERVING_P99_MS
from interference.profile_io import MEASUREMENTS_FORMAT as MEASUREMENTS_FORMAT  # the profile reader names these files

MEASUREMENTS_VERSION = 1
#: The most cores a measurements file may hold: one share step per core, and a profile has at most 100 steps.
MAX_CORES = round(100 / MIN_SHARE_STEP_PCT)


@dataclass(frozen=True)
class MeasurePoint:
    model: str
    share_pct: float
    batch: int
    neighbours: int = 0  # copies of the same model loaded beside it, kept busy

    @property
    def key(self) -> str:
        return f"{self.model}|{self.share_pct:g}|{self.batch}|{self.neighbours}"


@dataclass(frozen=True)
class Stability:
    """When a point's measurement can be trusted: perf_analyzer's rule.

    A point is measured in windows (each the median of a run of requests).
    It is stable once the last `windows` window medians all lie within
    `tolerance_pct` of their mean (perf_analyzer: 3 windows, 10%). After
    `max_windows` without that, the point is recorded as unstable.
    """

    tolerance_pct: float = 10.0
    windows: int = 3
    max_windows: int = 10

    def __post_init__(self) -> None:
        if not (self.tolerance_pct > 0 and self.windows >= 2 and self.max_windows >= self.windows):
            raise ValueError(
                f"stability needs tolerance > 0 %, windows >= 2 and max_windows >= windows, got "
                f"{self.tolerance_pct:g} %, {self.windows}, {self.max_windows}"
            )

    def spread_pct(self, medians: Sequence[float]) -> float:
        """Largest distance of the last `windows` medians from their mean, in percent of the mean."""
        last = list(medians)[-self.windows :]
        mean = statistics.fmean(last)
        return 100.0 * max(abs(m - mean) for m in last) / mean if mean > 0 else math.inf

    def is_stable(self, medians: Sequence[float]) -> bool:
        return len(medians) >= self.windows and self.spread_pct(medians) <= self.tolerance_pct


@dataclass(frozen=True)
class Measurement:
    """A point's result: the median of its last stable windows, and how it was reached."""

    latency_ms: float
    windows: int
    stable: bool
    spread_pct: float


def measure_until_stable(window: Callable[[int], float], stability: Stability = Stability()) -> Measurement:
    """Call `window(i)` (i = 0, 1, ...: the i-th window's median latency) until `stability` holds.

    The result is the median of the last `stability.windows` window medians;
    an unstable point (max_windows reached) is returned with stable=False.
    """
    medians: list[float] = []
    while len(medians) < stability.max_windows:
        medians.append(float(window(len(medians))))
        if stability.is_stable(medians):
            break
    last = medians[-stability.windows :]
    return Measurement(
        latency_ms=statistics.median(last),
        windows=len(medians),
        stable=stability.is_stable(medians),
        spread_pct=stability.spread_pct(medians),
    )


def eta_seconds(elapsed_s: float, measured: int, remaining: int) -> float | None:
    """Time left at the pace of the points measured so far in this run (None before the first)."""
    return None if measured <= 0 else elapsed_s / measured * remaining


@dataclass
class ProfileSession:
    """Measurement plan for one device type (`device` names it: e.g. "cpu-2core")."""

    device: str
    cores: int
    models: Sequence[str]
    batches: Sequence[int] = (1, 8, 16, 32)
    colocation_batch: int = 8
    model_bytes: dict[str, tuple[int, int]] = field(default_factory=dict)  # model -> (bytes_in, bytes_out)
    results: dict[str, float] = field(default_factory=dict)  # point key -> median latency (ms)
    spreads: dict[str, float] = field(default_factory=dict)  # point key -> spread of its windows (%)
    #: model -> the serving path outside the batch, p99 (ms; `agents.loadgen.serving_overhead_ms`)
    serving_p99_ms: dict[str, float] = field(default_factory=dict)
    #: model -> what clients see beyond the SLI windows, p99 (ms; measured with `serving_p99_ms`, which then
    #: holds the part the windows show; a file without it: `DEFAULT_BEYOND_SLI_P99_MS`, measured on resume)
    beyond_sli_p99_ms: dict[str, float] = field(default_factory=dict)
    #: point key -> resident memory of the serving process after the point (MiB; RSS on CPU)
    memory_mib: dict[str, float] = field(default_factory=dict)
    retries: dict[str, int] = field(default_factory=dict)  # point key -> times re-measured for monotonicity
    max_retries: int = 2  # re-measurements of a non-monotone point before it is rejected
    monotone_tolerance_pct: float = 10.0  # what two points may disagree by and still count as monotone

    @property
    def shares(self) -> list[float]:
        """Whole cores: 100/cores, 2*100/cores, ..., 100."""
        return [round(100.0 * k / self.cores, 6) for k in range(1, self.cores + 1)]

    def points(self) -> list[MeasurePoint]:
        out = [MeasurePoint(m, s, b) for m in self.models for s in self.shares for b in self.batches]
        if self.cores >= 2:
            out += [MeasurePoint(m, self.shares[0], self.colocation_batch, neighbours=1) for m in self.models]
        return out

    def ask(self) -> MeasurePoint | None:
        """The next point to measure: a new one, or a non-monotone one again (while it has retries left)."""
        suspects: dict[str, dict[str, str]] = {}  # each model's non-monotone points, worked out once per ask
        for point in self.points():
            if point.key not in self.results:
                return point
            if point.neighbours:
                continue
            if point.model not in suspects:
                suspects[point.model] = self.non_monotone(point.model) if self._model_measured(point.model) else {}
            if point.key in suspects[point.model] and self.retries.get(point.key, 0) < self.max_retries:
                return point
        return None

    def tell(self, point: MeasurePoint, latency_ms: float, spread_pct: float | None = None) -> None:
        if not latency_ms > 0:
            raise InputError(f"{point.key}: a latency must be > 0 ms, got {latency_ms!r}")
        if point.key in self.results:  # asked again: a re-measurement of a non-monotone point
            self.retries[point.key] = self.retries.get(point.key, 0) + 1
        self.results[point.key] = float(latency_ms)
        if spread_pct is not None:
            self.spreads[point.key] = float(spread_pct)

    def _model_measured(self, model: str) -> bool:
        return all(MeasurePoint(model, s, b).key in self.results for s in self.shares for b in self.batches)

    def non_monotone(self, model: str, kinds: tuple[str, ...] = ("batch", "share")) -> dict[str, str]:
        """{point key: why} of `model`'s solo points that break monotonicity, the slower of each pair.

        Checked on the measured grid: at each share, latency must not fall by more than the tolerance
        when the batch grows; at each batch, it must not rise by more than that when the share grows.
        Suspects are taken out one at a time (the worst first) and the rest checked again, so one bad
        point does not also condemn its neighbours."""
        latency = {
            (s, b): self.results[MeasurePoint(model, s, b).key]
            for s in self.shares
            for b in self.batches
            if MeasurePoint(model, s, b).key in self.results
        }
        factor = 1.0 + self.monotone_tolerance_pct / 100.0
        suspects: dict[str, str] = {}
        while True:
            worst: tuple[float, tuple[float, int], str] | None = None
            for s in self.shares if "batch" in kinds else ():
                row = sorted(b for (s2, b) in latency if s2 == s)
                for b1, b2 in zip(row, row[1:]):
                    slow, fast = latency[(s, b1)], latency[(s, b2)]
                    if slow > fast * factor and (worst is None or slow / fast > worst[0]):
                        why = (
                            f"{slow:.3g} ms at batch {b1} is slower than {fast:.3g} ms at batch {b2} "
                            f"(share {s:g}%): a bigger batch must not be faster"
                        )
                        worst = (slow / fast, (s, b1), why)
            for b in self.batches if "share" in kinds else ():
                column = sorted(s for (s, b2) in latency if b2 == b)
                for s1, s2 in zip(column, column[1:]):
                    fast, slow = latency[(s1, b)], latency[(s2, b)]
                    if slow > fast * factor and (worst is None or slow / fast > worst[0]):
                        why = (
                            f"{slow:.3g} ms at share {s2:g}% is slower than {fast:.3g} ms at share {s1:g}% "
                            f"(batch {b}): a bigger share must not be slower"
                        )
                        worst = (slow / fast, (s2, b), why)
            if worst is None:
                return suspects
            _, (s, b), why = worst
            suspects[MeasurePoint(model, s, b).key] = why
            del latency[(s, b)]

    def rejected(self) -> dict[str, str]:
        """{point key: why} of points still non-monotone after their re-measurements: left out of the fit."""
        out: dict[str, str] = {}
        for model in self.models:
            if self._model_measured(model):
                for key, why in self.non_monotone(model).items():
                    if self.retries.get(key, 0) >= self.max_retries:
                        out[key] = f"{why} (after {self.retries[key]} re-measurement(s))"
        return out

    def excluded_from_fit(self) -> dict[str, str]:
        """{point key: why} of the solo points the fit leaves out: the rejected ones, and every point slower
        at a bigger share, re-measured or not (files written before re-measuring existed). On a CPU node
        that is contention (see `interference.fit.fit_measured`); a bigger batch measured faster, never
        re-measured, stays in, and the fit's own check judges the curve it gives."""
        out = self.rejected()
        for model in self.models:
            if self._model_measured(model):
                out.update({k: v for k, v in self.non_monotone(model, ("share",)).items() if k not in out})
        return out

    @property
    def done(self) -> bool:
        """Nothing left to ask: every point measured, and no non-monotone point with retries left."""
        return self.ask() is None

    @property
    def measured(self) -> bool:
        """Every point has a result (what a fit needs; re-measurements may still be owed)."""
        return all(p.key in self.results for p in self.points())

    def progress(self) -> tuple[int, int]:
        points = self.points()
        return sum(p.key in self.results for p in points), len(points)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": MEASUREMENTS_FORMAT,
            "version": MEASUREMENTS_VERSION,
            "device": self.device,
            "cores": self.cores,
            "models": list(self.models),
            "batches": list(self.batches),
            "colocation_batch": self.colocation_batch,
            "model_bytes": {m: list(b) for m, b in sorted(self.model_bytes.items())},
            "serving_p99_ms": {m: round(v, 6) for m, v in sorted(self.serving_p99_ms.items())},
            "beyond_sli_p99_ms": {m: round(v, 6) for m, v in sorted(self.beyond_sli_p99_ms.items())},
            "points": [
                dict(
                    asdict(p),
                    latency_ms=self.results.get(p.key),
                    **({"spread_pct": round(self.spreads[p.key], 3)} if p.key in self.spreads else {}),
                    **({"memory_mib": round(self.memory_mib[p.key], 3)} if p.key in self.memory_mib else {}),
                    **({"retries": self.retries[p.key]} if p.key in self.retries else {}),
                )
                for p in self.points()
            ],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "measurements") -> ProfileSession:
        if not isinstance(data, dict) or data.get("format") != MEASUREMENTS_FORMAT:
            raise InputError(
                f"{source}: not a stoke measurements file (field 'format' must be "
                f"{MEASUREMENTS_FORMAT!r}); write one with `stoke profile run`"
            )
        if data.get("version") != MEASUREMENTS_VERSION:
            raise InputError(
                f"{source}: measurements version {data.get('version')!r} is not supported "
                f"(this stoke reads {MEASUREMENTS_VERSION})"
            )
        cores, models, batches = data.get("cores"), data.get("models"), data.get("batches")
        # bounded as the profile it fits will be: at most 100 share steps (a million cores took 1.65 GB)
        if isinstance(cores, bool) or not isinstance(cores, int) or not 1 <= cores <= MAX_CORES:
            raise InputError(
                f"{source}: field 'cores' must be a whole number from 1 to {MAX_CORES}, got {shown(cores)}"
            )
        if not isinstance(models, list) or not models or not all(is_name(m) for m in models):
            raise InputError(f"{source}: field 'models' must be a non-empty list of model names, got {shown(models)}")
        if not is_name(data.get("device")):
            raise InputError(f"{source}: field 'device' must be a device type name, got {shown(data.get('device'))}")
        if (
            not isinstance(batches, list)
            or not batches
            or not all(isinstance(b, int) and not isinstance(b, bool) and 1 <= b <= DOMAIN_MAX_BATCH for b in batches)
        ):
            raise InputError(
                f"{source}: field 'batches' must be a non-empty list of whole numbers from 1 to {DOMAIN_MAX_BATCH}"
            )
        try:
            session = cls(
                device=str(data["device"]),
                cores=int(data["cores"]),
                models=list(data["models"]),
                batches=[int(b) for b in data["batches"]],
                colocation_batch=int(data.get("colocation_batch", 8)),
                model_bytes={m: (int(b[0]), int(b[1])) for m, b in data.get("model_bytes", {}).items()},
                serving_p99_ms={
                    str(m): max(0.0, float(v)) for m, v in data.get("serving_p99_ms", {}).items() if math.isfinite(v)
                },
                beyond_sli_p99_ms=_beyond_sli(data.get("beyond_sli_p99_ms", {}), models, source),
            )
            for p in data.get("points", []):
                if p.get("latency_ms") is not None:
                    point = MeasurePoint(p["model"], float(p["share_pct"]), int(p["batch"]), int(p["neighbours"]))
                    spread = p.get("spread_pct")
                    session.tell(point, float(p["latency_ms"]), None if spread is None else float(spread))
                    memory = p.get("memory_mib")
                    if memory is not None:
                        if not (isinstance(memory, (int, float)) and 0 <= memory < 1e7):
                            raise ValueError(f"memory_mib of {point.key} must be a size in MiB, got {memory!r}")
                        session.memory_mib[point.key] = float(memory)
                    if p.get("retries"):
                        session.retries[point.key] = int(p["retries"])
        except (KeyError, TypeError, IndexError, ValueError) as err:
            raise InputError(f"{source}: malformed measurements ({err}); re-run `stoke profile run`") from None
        return session


def _beyond_sli(data: Any, models: Sequence[str], source: str) -> dict[str, float]:
    """The field 'beyond_sli_p99_ms' of a measurements file: {model: ms in [0, MAX_SERVING_P99_MS]}."""
    fix = "delete the field to measure it again with `stoke profile run`"
    if not isinstance(data, dict):
        raise InputError(f"{source}: field 'beyond_sli_p99_ms' must be an object of model -> ms; {fix}")
    out = {}
    for model, ms in data.items():
        if model not in models:
            raise InputError(f"{source}: field 'beyond_sli_p99_ms' names {shown(model)}, not one of the models; {fix}")
        if isinstance(ms, bool) or not isinstance(ms, (int, float)) or not 0 <= ms <= MAX_SERVING_P99_MS:
            raise InputError(
                f"{source}: field 'beyond_sli_p99_ms' of {shown(model)} must be a time in [0, {MAX_SERVING_P99_MS:g}] "
                f"ms, got {shown(ms)}; {fix}"
            )
        out[model] = float(ms)
    return out
