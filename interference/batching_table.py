"""Build the dimensionless latency table behind `interference.batching` (offline).

Run as ``python -m interference.batching_table [--requests N] [--out FILE]``
(about 20-40 minutes on one core); the result ships as
``interference/data/batching-table.npz`` and is only rebuilt when the grid
or the simulator semantics change.

The table holds, for Poisson arrivals at rate 1 (time is measured in mean
inter-arrival times), one server with Triton-style dynamic batching and a
linear occupancy O(k) through O(1) and O(B), the latency
quantiles of a request (from arrival until its batch's occupancy ends) at
every grid point (max batch B, full-batch utilisation u = O(B)/B, batch-1
coordinate s, delay mode), where O(1)/O(B) = B^(s-1): s = 0 is no batching
gain (O(k) = k O(1)), s = 1 free batching (O(k) = O(1)). The coordinate is
logarithmic because latency at light load is about O(1), so log latency is
linear in it. It is made by a lockstep discrete-event
simulation: thousands of independent queues advance one batch per step as
numpy arrays, so a grid point gets millions of requests in seconds. The
semantics are those of `planner.simulate` (the plan replay), which the
accuracy test and benchmark compare the interpolated table against.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from interference.bounds import MAX_BATCH

#: Probabilities at which the table stores latency quantiles.
PROBS = np.array([0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.98, 0.99, 0.995, 0.999])
#: Grid: max batch (every size 1..32), batch-1 coordinate s, logit of utilisation (u 1.2e-4..0.953).
BATCHES = np.arange(1, MAX_BATCH + 1)
SHAPES = np.linspace(0.0, 1.0, 11)
LOGITS = np.arange(-9.0, 3.0 + 1e-9, 0.25)
DELAY_MODES = ("zero", "fill")  # max queue delay 0, or (B-1)/rate
#: Latency histogram: log-spaced bins in units of O(B).
HIST_LO, HIST_HI, HIST_BINS = -4.0, 5.0, 3600  # log10 range, bins (0.26% wide)


def utilisations() -> NDArray[Any]:
    return np.asarray(1.0 / (1.0 + np.exp(-LOGITS)), dtype=float)


@dataclass
class GridResult:
    quantiles: NDArray[Any]  # (..., len(PROBS)) latency / O(B)
    tail_batch: NDArray[Any]  # (...,) mean batch size of requests at or above the p99
    mid_batch: NDArray[Any]  # (...,) mean batch size of requests around the p50


def _kernel(
    batch: int,
    occupancy: NDArray[Any],
    delay: float,
    requests: int,
    warmup: int,
    seed: int,
    hist: NDArray[Any],
    batch_sum: NDArray[Any],
) -> None:  # pragma: no cover - compiled by numba
    """One queue, Poisson(1) arrivals, L = O: histogram of latency / O(batch) (and batch size per bin).

    The same rules as `interference.batching.serve`, written as a plain loop so numba can compile it.
    """
    np.random.seed(seed)
    size = 1 << 16
    arrivals = np.empty(size + batch)
    t = 0.0
    for j in range(size + batch):
        t += np.random.exponential(1.0)
        arrivals[j] = t
    scale = occupancy[batch]
    bins = hist.shape[0]
    width = (HIST_HI - HIST_LO) / bins
    i, free_at, served = 0, 0.0, 0
    while served < requests + warmup:
        if i + batch > size:
            # Slide the unserved arrivals to the front and draw new ones behind them.
            rest = size + batch - i
            for j in range(rest):
                arrivals[j] = arrivals[i + j]
            t = arrivals[rest - 1]
            for j in range(rest, size + batch):
                t += np.random.exponential(1.0)
                arrivals[j] = t
            i = 0
        first = arrivals[i]
        full_at = arrivals[i + batch - 1]
        start = max(free_at, first, min(full_at, first + delay + 1e-9))
        if start >= full_at:
            k = batch
        else:
            k = 1
            while k < batch and arrivals[i + k] <= start:
                k += 1
        done = start + occupancy[k]
        for j in range(i, i + k):
            if served >= warmup:
                b = int((np.log10((done - arrivals[j]) / scale) - HIST_LO) / width)
                b = min(max(b, 0), bins - 1)
                hist[b] += 1
                batch_sum[b] += k
            served += 1
        free_at = done
        i += k


def _compiled_kernel() -> Callable[..., None]:
    """The kernel compiled with numba when it is installed (`pip install -e '.[table]'`), else plain Python."""
    try:
        from numba import njit
    except ImportError:
        return _kernel
    compiled: Callable[..., None] = njit(cache=False, nogil=True)(_kernel)  # numba is untyped (or absent for mypy)
    return compiled


def simulate_rows(
    batch: NDArray[Any],
    occupancy: NDArray[Any],
    delay: NDArray[Any],
    requests: NDArray[Any],
    seed: int,
    warmup: int = 2000,
    threads: int = 1,
) -> tuple[NDArray[Any], NDArray[Any]]:
    """Simulate one queue per row (max batch, occupancy O(k) for k = 0..B, delay, request count).

    Returns per-row histograms of latency / O(batch) on the module's log grid, and the batch
    size summed per bin. Rows run on `threads` threads (the compiled kernel releases the GIL).
    """
    from concurrent.futures import ThreadPoolExecutor

    kernel = _compiled_kernel()
    rows = len(batch)
    hist = np.zeros((rows, HIST_BINS), dtype=np.int64)
    batch_sum = np.zeros((rows, HIST_BINS))

    def run(r: int) -> None:
        kernel(
            int(batch[r]),
            np.ascontiguousarray(occupancy[r], dtype=float),
            float(delay[r]),
            int(requests[r]),
            warmup,
            seed * 1_000_003 + r,
            hist[r],
            batch_sum[r],
        )

    with ThreadPoolExecutor(max_workers=threads) as pool:
        list(pool.map(run, range(rows)))
    return hist, batch_sum


def _summarise(hist: NDArray[Any], batch_sum: NDArray[Any]) -> GridResult:
    edges = HIST_LO + (HIST_HI - HIST_LO) * np.arange(HIST_BINS + 1) / HIST_BINS
    cdf = np.cumsum(hist, axis=1) / hist.sum(axis=1, keepdims=True)
    rows = hist.shape[0]
    quantiles = np.empty((rows, len(PROBS)))
    tail = np.empty(rows)
    mid = np.empty(rows)
    for r in range(rows):
        # Linear interpolation inside a bin (in log space) on the empirical CDF.
        c = np.concatenate([[0.0], cdf[r]])
        logs = np.interp(PROBS, c, edges)
        quantiles[r] = 10.0**logs
        b99 = int(np.searchsorted(cdf[r], 0.99))
        tail[r] = batch_sum[r, b99:].sum() / max(hist[r, b99:].sum(), 1)
        lo, hi = int(np.searchsorted(cdf[r], 0.45)), int(np.searchsorted(cdf[r], 0.55)) + 1
        mid[r] = batch_sum[r, lo:hi].sum() / max(hist[r, lo:hi].sum(), 1)
    return GridResult(quantiles, tail, mid)


def linear_occupancy(
    batch: NDArray[Any], utilisation: NDArray[Any], shape: NDArray[Any], width: int = 33
) -> NDArray[Any]:
    """O(k) for k = 0..width-1 at rate 1: the line through O(1) = O(B) B^(s-1) and O(B) = B u
    (columns past `batch` unused)."""
    k = np.arange(width)[None, :]
    b = np.asarray(batch, dtype=float)[:, None]
    full = b * utilisation[:, None]
    first = full * b ** (shape[:, None] - 1.0)
    slope = np.where(b > 1, (full - first) / np.maximum(b - 1.0, 1.0), 0.0)
    return np.asarray(first + slope * (np.minimum(k, b) - 1.0), dtype=float)


def md1_quantiles(utilisation: float, probs: NDArray[Any] = PROBS) -> NDArray[Any]:
    """Exact sojourn-time quantiles of M/D/1 (service 1) at load `utilisation` (Erlang's formula).

    P(W <= t) = (1 - rho) * sum_{k=0}^{floor t} (rho (k - t))^k / k! * exp(-rho (k - t)); the
    alternating sum cancels badly in floating point, so it is evaluated with mpmath.
    """
    from mpmath import exp, factorial, mp, mpf

    mp.dps = 120
    rho = mpf(float(utilisation))

    def cdf(t: float) -> float:
        t_ = mpf(t)
        total = mpf(0)
        for k in range(int(np.floor(t)) + 1):
            x = rho * (k - t_)
            total += x**k / factorial(k) * exp(-x)
        return float((1 - rho) * total)

    out = np.empty(len(probs))
    for i, p in enumerate(probs):
        if cdf(0.0) >= p:
            out[i] = 1.0
            continue
        lo, hi = 0.0, 1.0
        while cdf(hi) < p:
            lo, hi = hi, hi * 2.0
        for _ in range(50):
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if cdf(mid) < p else (lo, mid)
        out[i] = 1.0 + hi
    return out


def requests_for(utilisation: NDArray[Any], base: int) -> NDArray[Any]:
    """Requests per grid point: more where the queue mixes slowly (p99 noise grows like 1/(1-u))."""
    return np.minimum(base * np.maximum(1.0, (0.3 / (1.0 - utilisation)) ** 2), 40 * base).astype(np.int64)


def build(
    base_requests: int, seed: int = 2026, chunk: int = 500, threads: int = 2, progress: bool = True
) -> dict[str, NDArray[Any]]:
    us = utilisations()
    shape = (len(DELAY_MODES), len(BATCHES), len(SHAPES), len(us))
    quantiles = np.empty(shape + (len(PROBS),))
    tail = np.empty(shape)
    mid = np.empty(shape)
    # Batch 1 is M/D/1 whatever the delay mode and overhead fraction: exact.
    for column, u in enumerate(us):
        quantiles[:, 0, :, column] = md1_quantiles(u)
    tail[:, 0] = mid[:, 0] = 1.0
    # Every other grid point is simulated, most expensive first so the threads finish together.
    m, b, f, v = (
        a.ravel()
        for a in np.meshgrid(
            np.arange(len(DELAY_MODES)),
            np.arange(1, len(BATCHES)),
            np.arange(len(SHAPES)),
            np.arange(len(us)),
            indexing="ij",
        )
    )
    batch = BATCHES[b]
    occupancy = linear_occupancy(batch, us[v], SHAPES[f])
    delay = np.where(m == 0, 0.0, batch - 1.0)
    requests = requests_for(us[v], base_requests)
    order = np.argsort(-requests, kind="stable")
    began = time.monotonic()
    total, done = float(requests.sum()), 0.0
    for lo in range(0, len(order), chunk):
        rows = order[lo : lo + chunk]
        hist, batch_sum = simulate_rows(
            batch[rows], occupancy[rows], delay[rows], requests[rows], seed + lo, threads=threads
        )
        result = _summarise(hist, batch_sum)
        quantiles[m[rows], b[rows], f[rows], v[rows]] = result.quantiles
        tail[m[rows], b[rows], f[rows], v[rows]] = result.tail_batch
        mid[m[rows], b[rows], f[rows], v[rows]] = result.mid_batch
        done += float(requests[rows].sum())
        if progress:
            spent = time.monotonic() - began
            print(
                f"[{min(lo + chunk, len(order))}/{len(order)} grid points] {spent:.0f} s, "
                f"ETA {spent / done * (total - done):.0f} s",
                file=sys.stderr,
                flush=True,
            )
    return {
        "probs": PROBS,
        "batches": BATCHES,
        "shapes": SHAPES,
        "logits": LOGITS,
        "delay_modes": np.array(DELAY_MODES),
        "quantiles": quantiles,
        "tail_batch": tail,
        "mid_batch": mid,
        "base_requests": np.array(base_requests),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--requests", type=int, default=250_000, help="requests per grid point at low load (more near saturation)"
    )
    parser.add_argument("--out", default="interference/data/batching-table.npz")
    args = parser.parse_args(argv)
    table = build(args.requests)
    # stored uncompressed: the numbers barely compress (3.6 -> 3.1 MB) and inflating them took 30-45 ms of
    # every `stoke plan`; read as they are, 9 ms
    np.savez(args.out, **table)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
