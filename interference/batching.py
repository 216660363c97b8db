"""Latency distribution of one Triton model instance with dynamic batching.

The server: requests arrive at rate lambda (Poisson, or paced at constant
intervals) into one queue. When the instance is free and requests wait, it
starts a batch as soon as `max_batch` (B) requests are queued or the oldest
has waited the max queue delay d, whichever comes first, taking at most B
requests. A batch of k requests completes after L(k) and occupies the
server for O(k) <= L(k) (the input copy of the next batch overlaps the
current one). A request's latency runs from its arrival to its batch's
completion. `serve` is this server as a discrete-event simulation; the plan
replay (`planner.simulate`) runs it for every replica.

How the distribution is computed, and why:

* **Paced arrivals** are deterministic, so the answer is exact. With d at
  least the fill time (B - 1)/lambda and the server free when a batch fills
  (utilisation lambda*O(B)/B <= 1), every batch holds B requests, the j-th of
  which waits (B - 1 - j)/lambda: latencies are L(B) + {0 .. B-1}/lambda,
  uniformly. Any other case is run through `serve` on a paced stream until
  the transient is gone (also exact: the system is deterministic).
* **Poisson arrivals** with d = 0 (greedy batching) or d = fill time: a
  dimensionless table, precomputed by simulation (`interference.batching_table`)
  and interpolated. Measuring time in mean inter-arrival times leaves three
  numbers that fix the queue: B, the full-batch utilisation u = lambda*O(B)/B,
  and the shape of a linear occupancy O(k) through O(1) and O(B) (fitted
  profiles are linear in k to within a few percent), given as
  s = 1 + log(O(1)/O(B)) / log(B) in [0, 1] (0: no batching gain, 1: free
  batching). The table stores log(latency quantile / O(B)) on a grid of
  B = 1..32 (every size), s in 11 steps and logit(u) in steps of 0.25 up to
  u = 0.953, and is interpolated linearly: light-load latency is about O(1),
  so its log is linear in s, and logit(u) makes both the light-load plateau
  and the 1/(1-u) heavy-load growth nearly linear. Latency differs
  from occupancy by the input copy L(k) - O(k), added at the mean batch size
  of the requests at that quantile (also in the table). Batch 1 is M/D/1 and
  its column is exact (Erlang's formula).

  Why a table and not an exact chain: the embedded Markov chain of queue
  length at batch ends is exact for d = 0 but needs the tagged request's
  residual and later batch sizes (millions of terms per point), and d > 0
  adds the oldest request's age to the state. The table is exact up to its
  simulation noise (about 1% at the p99 for u <= 0.9, the run length grows
  with 1/(1-u)^2) and its interpolation error, both measured by
  `benchmarks/bench_batching.py` against the discrete-event simulation over
  the whole grid; a lookup costs about a microsecond, so a planner can scan
  every (batch, share, delay) candidate of a workload at once.

Outside the table (u > 0.953) the queue is treated as unstable: infinite
latency. The module is pure: numpy only, the table read once from package data.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

ARRIVAL_KINDS = ("poisson", "constant")
#: Highest full-batch utilisation the Poisson table covers; beyond it latency is infinite.
MAX_UTILISATION = 0.953
TABLE_FILE = Path(__file__).with_name("data") / "batching-table.npz"
#: Relative tolerance when telling d = fill time from another delay.
_FILL_TOLERANCE = 0.02


@dataclass(frozen=True)
class ServiceCurve:
    """Batch latency L(k) and server occupancy O(k) in ms, for k = 1..max batch (index 0 is batch 1)."""

    latency_ms: tuple[float, ...]
    occupancy_ms: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.latency_ms or len(self.latency_ms) != len(self.occupancy_ms):
            raise ValueError("a service curve needs L(k) and O(k) for the same batch sizes 1..B")
        for name, values in (("latency", self.latency_ms), ("occupancy", self.occupancy_ms)):
            if not all(math.isfinite(v) and v > 0 for v in values):
                raise ValueError(f"service curve {name} must be positive and finite, got {values}")

    @property
    def max_batch(self) -> int:
        return len(self.latency_ms)


@dataclass(frozen=True)
class LatencyDistribution:
    """Request latency quantiles (ms) at `probabilities`, and the server's full-batch utilisation."""

    probabilities: tuple[float, ...]
    quantiles_ms: tuple[float, ...]
    utilisation: float

    @property
    def stable(self) -> bool:
        return math.isfinite(self.quantiles_ms[-1])

    def quantile(self, p: float) -> float:
        """Latency at probability p, interpolated between the stored quantiles (clamped at the ends)."""
        if not self.stable:
            return math.inf
        return float(np.interp(p, self.probabilities, self.quantiles_ms))

    @property
    def p50_ms(self) -> float:
        return self.quantile(0.5)

    @property
    def p99_ms(self) -> float:
        return self.quantile(0.99)

    def fraction_over(self, slo_ms: float) -> float:
        """Share of requests slower than `slo_ms`.

        Between stored quantiles the CDF is interpolated; past the last one
        the tail is taken as exponential through the last two quantiles
        (exact for a queue's waiting time far out).
        """
        if not self.stable:
            return 1.0
        q, p = np.asarray(self.quantiles_ms), np.asarray(self.probabilities)
        if slo_ms < q[0]:
            return float(1.0 - p[0] * max(slo_ms, 0.0) / q[0])
        if slo_ms <= q[-1]:
            unique, first = np.unique(q, return_index=True)
            return float(1.0 - np.interp(slo_ms, unique, p[first]))
        decay = (q[-1] - q[-2]) / math.log((1.0 - p[-2]) / (1.0 - p[-1]))
        return float((1.0 - p[-1]) * math.exp(-(slo_ms - q[-1]) / max(decay, 1e-12)))


def fill_time_ms(batch: Any, rate_rps: Any) -> Any:
    """Time for `batch` requests to arrive at `rate_rps`, counted from the first: (B - 1)/lambda.
    Floats or arrays."""
    return 1000.0 * (batch - 1) / rate_rps


def paced_delay_ms(batch: Any, rate_rps: Any) -> Any:
    """Max queue delay for paced clients: the fill time plus half an interval, so the batch
    starts at its B-th arrival instead of racing it (batch 1: no delay). Floats or arrays."""
    delay = np.where(np.asarray(batch) <= 1, 0.0, 1000.0 * (np.asarray(batch) - 0.5) / rate_rps)
    return float(delay) if delay.ndim == 0 else delay


def delay_mode(batch: int, rate_rps: float, queue_delay_ms: float) -> str:
    """'zero' or 'fill' for a Poisson stream; anything else is outside the model."""
    fill = fill_time_ms(batch, rate_rps)
    if batch == 1 or queue_delay_ms <= 1e-9:
        return "zero" if queue_delay_ms <= 1e-9 or batch == 1 else "fill"
    if abs(queue_delay_ms - fill) <= _FILL_TOLERANCE * fill:
        return "fill"
    raise ValueError(
        f"the batching model covers a max queue delay of 0 or the fill time "
        f"{fill:.3f} ms at batch {batch} and {rate_rps:g} req/s, got {queue_delay_ms:g} ms"
    )


# -- the server itself ---------------------------------------------------------------------------------


def serve(
    arrivals_ms: NDArray[Any],
    batch: int,
    queue_delay_ms: float,
    latency_ms: NDArray[Any],
    occupancy_ms: NDArray[Any],
    factor: Callable[[], float] | None = None,
) -> tuple[NDArray[Any], NDArray[Any]]:
    """Latency (ms) and batch size of every request of one instance (discrete-event, exact).

    `latency_ms[k]` / `occupancy_ms[k]` are L(k) / O(k) for k = 1..batch (index 0 unused);
    `factor`, when given, draws a multiplier of each batch's service (noise).
    """
    # Python floats and bisect, not numpy scalars: a batch's step is a handful of scalar operations, and
    # numpy's per-call overhead made a 300,000-request replay take 5-40 s. The arithmetic is the same.
    arrivals = arrivals_ms.tolist()
    latency = [float(x) for x in latency_ms]
    occupancy = [float(x) for x in occupancy_ms]
    n = len(arrivals)
    out: list[float] = []
    sizes: list[int] = []
    i, free_at = 0, 0.0
    b, delay = batch, queue_delay_ms
    while i < n:
        first = arrivals[i]
        full_at = arrivals[i + b - 1] if i + b - 1 < n else math.inf
        start = max(free_at, first, min(full_at, first + delay + 1e-9))  # a tie fills the batch
        # arrivals before i are no later than `first` <= start: the search may start at i
        k = b if start >= full_at else min(b, bisect_right(arrivals, start, i) - i)
        scale = factor() if factor is not None else 1.0
        done = start + latency[k] * scale
        out.extend([done - a for a in arrivals[i : i + k]])
        sizes.extend([k] * k)
        free_at = start + occupancy[k] * scale
        i += k
    return np.asarray(out, dtype=float), np.asarray(sizes, dtype=np.int64)


# -- the Poisson table ---------------------------------------------------------------------------------


class BatchingTable:
    """The interpolated dimensionless table (see the module docstring)."""

    #: The utilisation grid: logit(u) from -9 in steps of 0.25.
    LOGIT_START, LOGIT_STEP = -9.0, 0.25

    def __init__(self, data: dict[str, Any]):
        self.probs = np.asarray(data["probs"], dtype=float)
        self.shapes = np.asarray(data["shapes"], dtype=float)
        self.max_batch = int(np.asarray(data["batches"]).max())
        self.modes = tuple(str(m) for m in data["delay_modes"])
        self.logits = np.asarray(data["logits"], dtype=float)
        if not np.allclose(np.diff(self.logits), self.LOGIT_STEP) or self.logits[0] != self.LOGIT_START:
            raise ValueError(
                f"{TABLE_FILE}: the utilisation grid must be logit {self.LOGIT_START} in steps of "
                f"{self.LOGIT_STEP}; rebuild it with python -m interference.batching_table"
            )
        self.log_ratio = np.log(np.asarray(data["quantiles"], dtype=float))  # (mode, B, s, v, p)
        self.tail_batch = np.asarray(data["tail_batch"], dtype=float)  # (mode, B, s, v)
        self.mid_batch = np.asarray(data["mid_batch"], dtype=float)
        self.p99_index = int(np.argmin(np.abs(self.probs - 0.99)))

    def grid_position(self, utilisation: Any) -> Any:
        """Fractional index of logit(u) on the grid (negative below it: extrapolated), NaN above the top."""
        u = np.clip(np.asarray(utilisation, dtype=float), 1e-12, 1.0 - 1e-12)
        pos = (np.log(u / (1.0 - u)) - self.LOGIT_START) / self.LOGIT_STEP
        return np.where(u > MAX_UTILISATION + 1e-12, np.nan, pos)

    def position(self, utilisation: float) -> float:
        """Scalar `grid_position` (the planner's hot path): plain floats, no numpy."""
        if utilisation > MAX_UTILISATION + 1e-12:
            return math.nan
        u = min(max(utilisation, 1e-12), 1.0 - 1e-12)
        return (math.log(u / (1.0 - u)) - self.LOGIT_START) / self.LOGIT_STEP

    def shape_weights(self, shape: Any) -> tuple[Any, Any]:
        pos = np.interp(np.clip(shape, 0.0, 1.0), self.shapes, np.arange(len(self.shapes), dtype=float))
        low = np.minimum(np.floor(pos).astype(np.intp), len(self.shapes) - 2)
        return low, pos - low

    def curves(self, mode: str, batch: Any, shape: Any, prob_index: int | None = None) -> tuple[Any, Any]:
        """Per candidate, log(quantile / O(B)) and the batch size at that quantile along the logit grid.

        `batch` and `shape` (the coordinate s) broadcast to (...); results are (..., len(logits)) for
        one probability (`prob_index`, default the p99), interpolated in s.
        """
        m = self.modes.index(mode)
        p = self.p99_index if prob_index is None else prob_index
        b = np.asarray(batch, dtype=np.intp) - 1
        low, w = self.shape_weights(np.asarray(shape, dtype=float))
        w = np.asarray(w)[..., None]
        table = self.log_ratio[m, :, :, :, p]
        log_ratio = table[b, low] * (1.0 - w) + table[b, low + 1] * w
        sizes = self.tail_batch[m] if self.probs[p] >= 0.98 else self.mid_batch[m]
        size = sizes[b, low] * (1.0 - w) + sizes[b, low + 1] * w
        return log_ratio, size

    def curve_set(self, mode: str, batch: Any, shape: Any, prob_index: int | None = None) -> CurveSet:
        """`curves` packed for fast repeated lookups (a planner's candidate table)."""
        log_ratio, size = self.curves(mode, batch, shape, prob_index)
        return CurveSet(np.stack([np.asarray(log_ratio), np.asarray(size)], axis=-1))

    def lookup(self, curves: NDArray[Any], sizes: NDArray[Any], position: Any) -> tuple[NDArray[Any], NDArray[Any]]:
        """(quantile / O(B), batch size) of candidates at fractional grid positions (see `CurveSet`)."""
        return CurveSet(np.stack([curves, sizes], axis=-1)).at_position(position)

    def quantiles(self, mode: str, batch: int, utilisation: float, shape: float) -> tuple[NDArray[Any], NDArray[Any]]:
        """(latency / O(B), batch size) at every stored probability, for one queue."""
        pos = self.position(utilisation)
        ratios, sizes = np.empty(len(self.probs)), np.empty(len(self.probs))
        for p in range(len(self.probs)):
            curve, size = self.curves(mode, batch, shape, p)
            ratios[p], sizes[p] = self.lookup(np.asarray(curve), np.asarray(size), pos)
        return ratios, sizes


class CurveSet:
    """Table curves of many candidate queues, shape S + (grid, 2): log(quantile / O(B)) and the
    batch size at that quantile along the utilisation grid. Lookups are a handful of numpy
    operations whatever S is: a planner scans a workload's whole candidate table at once."""

    def __init__(self, packed: NDArray[Any]):
        self.packed = np.ascontiguousarray(packed, dtype=float)
        self.grid = self.packed.shape[-2]
        # Flat value and slope arrays: 1-d gathers are several times faster than row gathers.
        ratio, size = self.packed[..., 0], self.packed[..., 1]
        self._ratio = ratio.reshape(-1)
        self._ratio_slope = np.diff(ratio, axis=-1, append=ratio[..., -1:]).reshape(-1)
        self._size = size.reshape(-1)
        self._size_slope = np.diff(size, axis=-1, append=size[..., -1:]).reshape(-1)
        self._rows = (np.arange(int(np.prod(self.packed.shape[:-2]))) * self.grid).reshape(self.packed.shape[:-2])

    def take(self, index: Any) -> CurveSet:
        """The curves of a sub-array of candidates (numpy indexing on S)."""
        return CurveSet(self.packed[index])

    def at_position(self, position: Any) -> tuple[NDArray[Any], NDArray[Any]]:
        """(ratio, batch size) at fractional grid positions broadcasting against S; NaN -> inf ratio."""
        pos = np.asarray(position, dtype=float)
        bad = np.isnan(pos)
        pos = np.where(bad, 0.0, pos)
        low = np.clip(pos.astype(np.intp), 0, self.grid - 2)
        index = self._rows + low
        w = pos - low
        log_ratio = self._ratio[index] + self._ratio_slope[index] * w
        size = self._size[index] + self._size_slope[index] * w
        return np.where(bad, np.inf, np.exp(log_ratio)), size

    def at_utilisation(self, utilisation: Any) -> tuple[NDArray[Any], NDArray[Any]]:
        """(ratio, batch size) at full-batch utilisations; infinite ratio past the table's top."""
        u = np.minimum(np.maximum(utilisation, 1e-12), MAX_UTILISATION + 1e-9)
        pos = (np.log(u / (1.0 - u)) - BatchingTable.LOGIT_START) / BatchingTable.LOGIT_STEP
        ratio, size = self.at_position(pos)
        return np.where(np.asarray(utilisation) > MAX_UTILISATION + 1e-12, np.inf, ratio), size


@lru_cache(maxsize=1)
def table() -> BatchingTable:
    with np.load(TABLE_FILE) as data:
        return BatchingTable({k: data[k] for k in data.files})


def batching_shape(occupancy_1: Any, occupancy_b: Any, batch: Any) -> Any:
    """The table's shape coordinate s = 1 + log(O(1)/O(B)) / log(B), clipped to [0, 1] (0 for batch 1)."""
    b = np.asarray(batch, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        s = 1.0 + np.log(np.asarray(occupancy_1) / np.asarray(occupancy_b)) / np.log(b)
    return np.clip(np.where(b > 1, s, 0.0), 0.0, 1.0)


def input_copy_ms(curve: ServiceCurve, size: float) -> float:
    """L(k) - O(k) at a fractional batch size (linear between whole sizes)."""
    gaps = np.asarray(curve.latency_ms) - np.asarray(curve.occupancy_ms)
    return float(np.interp(size, np.arange(1, curve.max_batch + 1), gaps))


# -- the public entry point ----------------------------------------------------------------------------


def end_to_end_p99_ms(batch_p99_ms: Any, serving_p99_ms: float, beyond_sli_p99_ms: float) -> Any:
    """A request's p99 end to end, as its clients see it: the batching queue's p99 (queueing, batch fill,
    inference), plus the serving path's p99 outside the batch as the SLI windows show it
    (`ModelProfile.serving_p99_ms`: client, router, Triton's frontend and back; the closed loop re-learns
    it), plus what clients see beyond those windows (`ModelProfile.beyond_sli_p99_ms`; the loop keeps it).
    Adding p99s bounds the p99 of the sum from above (the tails rarely meet), which is the side a plan
    should err on. Works on numbers and numpy arrays alike; the planner (`planner.solver`) and the
    closed loop (`controller.recalibrate`) both use it."""
    return batch_p99_ms + serving_p99_ms + beyond_sli_p99_ms


def latency_distribution(
    rate_rps: float, max_batch: int, queue_delay_ms: float, arrivals: str, curve: ServiceCurve
) -> LatencyDistribution:
    """Latency distribution of one instance serving `rate_rps` with dynamic batching (see module doc)."""
    if arrivals not in ARRIVAL_KINDS:
        raise ValueError(f"arrivals must be one of {', '.join(ARRIVAL_KINDS)}, got {arrivals!r}")
    if not (math.isfinite(rate_rps) and rate_rps > 0):
        raise ValueError(f"rate must be a positive number of requests per second, got {rate_rps!r}")
    if not 1 <= max_batch <= curve.max_batch:
        raise ValueError(f"max batch {max_batch} is outside the service curve (1..{curve.max_batch})")
    if not (math.isfinite(queue_delay_ms) and queue_delay_ms >= 0):
        raise ValueError(f"max queue delay must be >= 0 ms, got {queue_delay_ms!r}")
    b = max_batch
    occ_b = curve.occupancy_ms[b - 1]
    utilisation = rate_rps * occ_b / (1000.0 * b)
    if arrivals == "constant":
        return _paced(rate_rps, b, queue_delay_ms, curve, utilisation)
    mode = delay_mode(b, rate_rps, queue_delay_ms)
    probs = table().probs
    if b > table().max_batch:
        raise ValueError(f"the batching table covers max batch 1..{table().max_batch}, got {b}")
    shape = float(batching_shape(curve.occupancy_ms[0], occ_b, b))
    ratios, sizes = table().quantiles(mode, b, utilisation, shape)
    if not np.isfinite(ratios).all():
        return LatencyDistribution(tuple(probs), tuple([math.inf] * len(probs)), utilisation)
    values = [r * occ_b + input_copy_ms(curve, s) for r, s in zip(ratios, sizes)]
    return LatencyDistribution(tuple(float(p) for p in probs), tuple(np.maximum.accumulate(values)), utilisation)


#: Probabilities reported for paced arrivals.
PACED_PROBS = (0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.98, 0.99, 0.995, 0.999)


def paced_p99_ms(latency_b_ms: Any, rate_rps: Any, batch: Any) -> Any:
    """p99 latency of paced arrivals batched at the fill time: L(B) + (B - 1)/lambda (B <= 100)."""
    return latency_b_ms + 1000.0 * (np.asarray(batch) - 1.0) / rate_rps


def _paced(
    rate_rps: float, batch: int, delay_ms: float, curve: ServiceCurve, utilisation: float
) -> LatencyDistribution:
    interval = 1000.0 / rate_rps
    if utilisation > 1.0 + 1e-9:
        return LatencyDistribution(PACED_PROBS, tuple([math.inf] * len(PACED_PROBS)), utilisation)
    if batch == 1 or delay_ms >= (batch - 1) * interval * (1 + 1e-9):
        # Closed form: full batches started at their B-th arrival; waits 0..B-1 intervals, uniformly.
        waits = interval * np.minimum(np.floor(np.asarray(PACED_PROBS) * batch), batch - 1)
        values = curve.latency_ms[batch - 1] + waits
        return LatencyDistribution(PACED_PROBS, tuple(float(v) for v in values), utilisation)
    # Otherwise run the deterministic system past its transient (exact: nothing is random).
    n = max(4000, 200 * batch)
    arrivals = np.arange(n) * interval
    lat = np.concatenate([[0.0], curve.latency_ms])
    occ = np.concatenate([[0.0], curve.occupancy_ms])
    latencies, _ = serve(arrivals, batch, delay_ms, lat, occ)
    values = np.percentile(latencies[n // 2 :], [100 * p for p in PACED_PROBS])
    return LatencyDistribution(PACED_PROBS, tuple(float(v) for v in values), utilisation)
