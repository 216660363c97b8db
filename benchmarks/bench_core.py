"""Core benchmark: solver time and GPU count per strategy, simulated SLO attainment,
vectorised predictor throughput.

    .venv/bin/python benchmarks/bench_core.py [--sizes 10,100,1000] [--seconds 10]

Targets (issue 2): igniter solves 1000 workloads in <= 0.1 s, stoke in <= 1 s;
stoke uses >= 10% fewer GPUs than igniter on 100 and 1000 workloads while >= 99%
of workloads keep simulated p99 within SLO; the vectorised predictor does
>= 200,000 GPU configurations per second.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from controller.simulate import simulate
from controller.solver import Problem, solve
from controller.solver.random_mix import random_workloads
from controller.workload_file import default_gpu_types
from interference.latency import VectorPredictor
from stoke.table import render_table

STRATEGIES = ("igniter", "ffd", "stoke")


def bench_solver(sizes: list[int], seconds: float, arrivals: str) -> None:
    types = default_gpu_types()
    profiles = {t.name: t.profile for t in types}
    rows = []
    for size in sizes:
        workloads = random_workloads(size, seed=2026, arrivals=arrivals)
        counts = {}
        for strategy in STRATEGIES:
            solve(Problem(workloads[:5], types), strategy)  # warm caches / imports
            runs = 3 if size <= 100 else 1
            started = time.perf_counter()
            for _ in range(runs):
                plan = solve(Problem(workloads, types), strategy)
            elapsed = (time.perf_counter() - started) / runs
            counts[strategy] = plan.gpu_count
            report = simulate(plan, profiles, seconds=seconds, seed=1, arrivals=arrivals)
            over = sum(w.over_slo * w.requests for w in report.workloads)
            requests = max(1, sum(w.requests for w in report.workloads))
            rows.append([size, strategy, f"{elapsed * 1000:.1f}", plan.gpu_count, len(plan.slo_misses),
                         f"{100 * report.attainment:.1f}%", f"{100 * over / requests:.2f}%"])
        saving = 100 * (1 - counts["stoke"] / counts["igniter"])
        rows.append([size, "stoke vs igniter", "", f"{saving:+.1f}% fewer", "", "", ""])
    print(f"\nSolver on random mixes (seed 2026), {arrivals} arrivals, simulated {seconds:g} s:")
    print(render_table(["workloads", "strategy", "solve_ms", "gpus", "predicted_misses", "p99<=SLO (sim)",
                        "requests>SLO (sim)"], rows))


def bench_predictor() -> None:
    profile = default_gpu_types()[0].profile
    predictor = VectorPredictor(profile)
    rng = np.random.default_rng(0)
    n, k = 200_000, 4
    model = rng.integers(0, len(predictor.model_names), size=(n, k))
    batch = rng.integers(1, 33, size=(n, k)).astype(float)
    share = rng.uniform(2.5, 25.0, size=(n, k))
    mask = rng.random((n, k)) < 0.8
    mask[:, 0] = True
    predictor.predict(model[:1000], batch[:1000], share[:1000], mask[:1000])
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        predictor.predict(model, batch, share, mask)
        best = min(best, time.perf_counter() - started)
    print(f"\nVectorised predictor: {n:,} GPU configurations (up to {k} workloads each) in {best * 1000:.0f} ms "
          f"= {n / best:,.0f} configurations/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10,100,1000")
    parser.add_argument("--seconds", type=float, default=10.0, help="simulated seconds per plan")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    bench_predictor()
    for arrivals in ("poisson", "constant"):
        bench_solver(sizes, args.seconds, arrivals)


if __name__ == "__main__":
    main()
