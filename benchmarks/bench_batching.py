"""Batching model accuracy: predicted p99 against the discrete-event server, over the whole grid.

    .venv/bin/python benchmarks/bench_batching.py [--quick] [--speed-only]

The grid of issue 8: load lambda*L(1) in {0.02, 0.1, 0.3, 0.5, 0.7, 0.85, 0.95}, max batch
B in {1, 2, 4, 8, 16, 32}, max queue delay 0 or the fill time (B-1)/lambda, Poisson and paced
arrivals, on three service curves: a linear one (2 + k ms, like the sleep demo model) and two
V100 profile curves (resnet50 at 50%, alexnet at 10%: little and much fixed overhead). The
judge is `interference.batching.serve`, the server the plan replay (`stoke simulate`) runs,
with enough requests that its own p99 is good to about 1% (more near saturation). Also
prints the model's speed on a planner-sized candidate table. Target: every point within 5%.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from interference.batching import ServiceCurve, fill_time_ms, latency_distribution, serve
from interference.latency import batch_curve
from interference.profile_io import bundled_profile
from stoke.progress import Progress

LOADS = (0.02, 0.1, 0.3, 0.5, 0.7, 0.85, 0.95)
BATCHES = (1, 2, 4, 8, 16, 32)


def curves() -> dict[str, ServiceCurve]:
    profile = bundled_profile()
    k = np.arange(1, 33, dtype=float)
    linear = tuple(float(v) for v in 2.0 + k)
    return {
        "linear 2+k ms": ServiceCurve(linear, linear),
        "resnet50 V100 50%": ServiceCurve(*batch_curve(profile, "resnet50", 50.0, 32)),
        "alexnet V100 10%": ServiceCurve(*batch_curve(profile, "alexnet", 10.0, 32)),
    }


def truncate(curve: ServiceCurve, batch: int) -> ServiceCurve:
    return ServiceCurve(curve.latency_ms[:batch], curve.occupancy_ms[:batch])


def simulated_p99(
    curve: ServiceCurve,
    batch: int,
    rate_rps: float,
    delay_ms: float,
    arrivals: str,
    utilisation: float,
    rng: np.random.Generator,
    scale: float = 1.0,
) -> tuple[float, int]:
    """p99 latency (ms) of the discrete-event server, after a warm-up, and the requests it took."""
    if arrivals == "constant":
        n = 20_000
        times = np.arange(n) * (1000.0 / rate_rps)
    else:
        n = int(scale * min(3_000_000, 200_000 * max(1.0, (0.3 / max(1e-3, 1.0 - utilisation)) ** 2)))
        times = np.cumsum(rng.exponential(1000.0 / rate_rps, size=n))
    lat = np.concatenate([[0.0], curve.latency_ms])
    occ = np.concatenate([[0.0], curve.occupancy_ms])
    latencies, _ = serve(times, batch, delay_ms, lat, occ)
    return float(np.percentile(latencies[n // 20 :], 99)), n


def grid_points(quick: bool) -> list[tuple[str, str, int, str, float]]:
    points = []
    for arrivals in ("poisson", "constant"):
        for name in curves():
            for batch in BATCHES:
                for delay in ("zero", "fill") if batch > 1 else ("zero",):
                    for load in LOADS:
                        points.append((arrivals, name, batch, delay, load))
    if quick:
        rng = np.random.default_rng(8)
        points = [points[i] for i in sorted(rng.choice(len(points), size=40, replace=False))]
    return points


def bench_accuracy(quick: bool) -> None:
    shapes = curves()
    rng = np.random.default_rng(2026)
    rows, errors = [], []
    points = grid_points(quick)
    # progress with an ETA on stderr (a bar on a terminal, a line per point otherwise)
    with Progress("bench_batching: model vs simulation", len(points)) as bar:
        for n, (arrivals, name, batch, delay, load) in enumerate(points, 1):
            curve = truncate(shapes[name], batch)
            rate = 1000.0 * load / curve.latency_ms[0]
            delay_ms = 0.0 if delay == "zero" else fill_time_ms(batch, rate)
            model = latency_distribution(rate, batch, delay_ms, arrivals, curve)
            des, requests = simulated_p99(
                curve, batch, rate, delay_ms, arrivals, model.utilisation, rng, scale=0.3 if quick else 1.0
            )
            error = model.p99_ms / des - 1.0
            errors.append(error)
            rows.append((arrivals, name, batch, delay, load, model.utilisation, model.p99_ms, des, error, requests))
            bar.update(n, note=f"{arrivals} {name} batch {batch} load {load:g}")
    print(
        f"{'arrivals':9} {'curve':18} {'B':>2} {'delay':5} {'load':>5} {'u':>6} {'model p99':>10} "
        f"{'DES p99':>10} {'error':>7} {'requests':>9}"
    )
    for arrivals, name, batch, delay, load, u, model_p99, des, error, requests in rows:
        flag = "" if abs(error) <= 0.05 else "  <-- over 5%"
        print(
            f"{arrivals:9} {name:18} {batch:2d} {delay:5} {load:5.2f} {u:6.3f} {model_p99:10.3f} "
            f"{des:10.3f} {100 * error:+6.1f}% {requests:9,}{flag}"
        )
    err = np.abs(np.array(errors))
    print(
        f"\n{len(err)} points: |error| median {100 * np.median(err):.2f}%, p90 {100 * np.quantile(err, 0.9):.2f}%, "
        f"max {100 * err.max():.2f}%; within 5%: {100 * np.mean(err <= 0.05):.1f}%"
    )
    for kind in ("poisson", "constant"):
        sub = np.array([abs(e) for e, r in zip(errors, rows) if r[0] == kind])
        if sub.size:
            print(f"  {kind:9}: max {100 * sub.max():.2f}%, within 5% {100 * np.mean(sub <= 0.05):.1f}% of {sub.size}")


def bench_speed() -> None:
    """A planner's view: a workload's whole candidate table (32 batches x 40 shares x 2 delays), alone
    and amortised over a 1000-workload mix, and the scalar p99 the co-location check evaluates."""
    from planner.solver import Workload
    from planner.solver.candidates import PointCache
    from planner.solver.random_mix import random_workloads
    from planner.solver.stoke import best_candidate, best_candidates, candidate_grid
    from planner.workload_file import default_gpu_types

    cache = PointCache(default_gpu_types()[0])
    workload = Workload("w", "resnet50", 40.0, 300.0)
    candidate_grid(workload, cache, 300.0)  # builds the model's cached curves
    repeats = 500
    started = time.perf_counter()
    for _ in range(repeats):
        candidate_grid(workload, cache, 300.0)
    one = (time.perf_counter() - started) / repeats
    mix = random_workloads(1000, seed=2026)
    best_candidates(mix[:8], cache)
    started = time.perf_counter()
    best_candidates(mix, cache)
    amortised = (time.perf_counter() - started) / len(mix)
    item = best_candidate(workload, cache, 300.0)
    assert item is not None
    prediction = cache.predict([item], [item.min_share])[0]
    started = time.perf_counter()
    for _ in range(20000):
        item.target.p99_ms(cache, prediction, item.min_share)
    scalar = (time.perf_counter() - started) / 20000
    print(
        f"\nSpeed: one workload's 32 x 40 x 2 candidate table (2,560 p99s) in {one * 1e6:.0f} us; "
        f"amortised over the 1000-workload mix (best candidate chosen) {amortised * 1e6:.0f} us per workload; "
        f"the co-location check's scalar p99 {scalar * 1e9:.0f} ns"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="40 seeded grid points with shorter runs (~2 min)")
    parser.add_argument("--speed-only", action="store_true")
    args = parser.parse_args()
    bench_speed()
    if not args.speed_only:
        bench_accuracy(args.quick)


if __name__ == "__main__":
    main()
