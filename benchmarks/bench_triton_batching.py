"""The batching latency model against Triton's real dynamic batcher (issue 8, step 2).

The demo model `batch_sleep` serves a batch of k in exactly a + c*k ms (its
config parameters). It runs on a real `tritonserver` 2.51 (one Python-backend
instance, the whole machine) with the dynamic-batching config `stoke triton
render` writes (max_batch_size B, preferred batch [B], max queue delay d), and
the open-loop Poisson load generator behind `stoke load` drives it (latency
from each request's scheduled time). At each operating point (B, d = 0 or the
fill time (B-1)/rate, utilisation u = rate * O(B) / B) the measured p50/p99 are
compared with `interference.batching.latency_distribution`.

The serving overhead is measured ONCE, before the points, and split by where it
acts (`agents.batching_check.BatchingCheck.calibrate`):

* The part that occupies the model instance (the Python backend's round trip
  to its stub, moving each request's tensors, the hand-over between
  executions) goes into the occupancy O(k): it delays every batch queued
  behind it, so it changes the queue, not just each latency. It is measured
  as the instance's throughput at saturation at batch 1 and at batch 8 (every
  batch full, batch starts exactly O(k) apart), which gives a per-batch and a
  per-request part: O(k) = a + c*k + h0 + h1*k. Triton's compute metrics
  (nv_inference_compute_*) see only the execution itself and miss the
  hand-over, so the wall clock over Triton's execution count is used.
  Taking the overhead at batch 1 alone would miss h1 (about 0.1 ms a
  request here), an O(8) about 5% too small.
* The rest only adds latency (client send, gRPC both ways, response
  callback): L(k) - O(k), a constant, from the median latency of paced
  requests at low load (nothing queues) minus O(1).

Columns: the point; the rate and the served d; measured and predicted p50 and
p99 with their errors; `p99 same arr.`: the discrete-event server
(`interference.batching.serve`) on the very arrivals sent, free of the run's
sampling noise (a measured p99 far from it means the server behaves
differently; near it but far from the model means the run was too short);
`±p99`: the standard deviation of a run's p99 from sampling alone; mean batch
as Triton counted it and as simulated; `svc+`: Triton's compute time of a
request's batch beyond its sleep a + c*k (mean over requests, ms; about h0 +
h1*k when the machine serves as it did during calibration, more when it was
slowed); the load generator's worst send lag; CPU that other processes took
during the run (cores); the verdict. Goal: within 10%
or 2 ms (whichever is larger), p50 and p99, at every point with u <= 0.7.

What Triton's batcher does (core/src/dynamic_batch_scheduler.cc, 2.51): the
batcher thread moves queued requests into a "payload" once they reach the
preferred batch B, or the oldest has waited the max queue delay, or at once
when d = 0; the payload then waits for the instance in the rate limiter and
keeps growing up to B while it waits, so a batch holds what arrived until the
instance took it, as in the model (at most two payloads wait per instance; a
full one makes room for the next). Two differences: the delay timer starts
when a request reaches the scheduler (after gRPC), not when it was sent, a
constant shift inside the latency-only overhead; and its wake-up, like every
thread hand-over, waits for the OS scheduler, which a busy machine delays.

A run whose load generator fell more than 15 ms behind its schedule, or during
which other processes used over half a core, was disturbed by the machine; the
point is measured again with new arrivals (at most 3 runs, the least disturbed
kept; the rule looks at the machine only, never at the error). On a busy
machine expect noise anyway: the figures to quote come from a quiet one.

    .venv/bin/python benchmarks/bench_triton_batching.py [--quick] [--scale F]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agents.batching_check import (  # noqa: E402
    ABS_TOLERANCE_MS,
    REL_TOLERANCE,
    BatchingCheck,
    Point,
    PointResult,
    predict,
    sampling_spread_ms,
    scaled,
)
from stoke.table import render_table  # noqa: E402

#: The operating points. Requests per point: enough that the p99's sampling spread is a few percent
#: where the goal applies (u <= 0.7); a batch-1 queue's tail is the noisiest, so it gets a low u.
POINTS = (
    Point(1, "zero", 0.40, 4000),
    Point(4, "zero", 0.30, 3000),
    Point(4, "fill", 0.50, 4000),
    Point(4, "zero", 0.70, 6000),
    Point(8, "zero", 0.50, 4000),
    Point(8, "fill", 0.20, 2000),
    Point(8, "fill", 0.70, 4000),
    Point(8, "zero", 0.85, 6000),
)
WARMUP_S = 2.0
SETUP_S = 2.0  # reload + scrape per point, for the ETA


def _mean_others(results: list[PointResult]) -> float:
    total = sum(r.seconds for r in results)
    return sum(r.others_cores * r.seconds for r in results) / total if total else 0.0


def log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def row(r: PointResult, spread_ms: float) -> list[object]:
    p = r.point
    verdict = "pass" if r.passed else "FAIL"
    if p.utilisation > 0.7 + 1e-9:
        verdict = f"({verdict}, u > 0.7)"
    if r.disturbed:
        verdict += " disturbed"
    return [
        p.batch,
        p.delay,
        round(p.utilisation, 2),
        round(r.rate_rps, 1),
        round(r.delay_ms, 2),
        r.sent,
        round(r.measured_p50_ms, 2),
        round(r.predicted_p50_ms, 2),
        f"{100 * r.p50_error:+.1f}%",
        round(r.measured_p99_ms, 2),
        round(r.predicted_p99_ms, 2),
        f"{100 * r.p99_error:+.1f}%",
        round(r.same_arrivals_p99_ms, 2),
        round(spread_ms, 2),
        f"{r.measured_mean_batch:.2f}/{r.simulated_mean_batch:.2f}",
        round(r.measured_compute_ms - r.simulated_sleep_ms, 2),
        round(r.max_send_lag_ms, 1),
        round(r.others_cores, 2),
        verdict,
    ]


HEADERS = [
    "B",
    "d",
    "u",
    "rate/s",
    "d_ms",
    "sent",
    "p50",
    "pred p50",
    "err",
    "p99",
    "pred p99",
    "err",
    "p99 same arr.",
    "±p99",
    "batch T/sim",
    "svc+",
    "lag_ms",
    "others_cpu",
    "verdict",
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a quarter of the requests (a noisier p99)")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply the requests per point")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    points = scaled(POINTS, args.scale * (0.25 if args.quick else 1.0))

    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    started = time.monotonic()
    with BatchingCheck(ROOT / "triton_repo", log=log) as check:
        sleep = check.sleep
        log(
            f"batch_sleep: a batch of k sleeps {sleep.base_ms:g} + {sleep.per_item_ms:g}*k ms; calibrating "
            f"the serving overhead (saturation at batch 1 and {check.top_batch}, then low load)"
        )
        overhead = check.calibrate(seconds=3.0)
        predictions = [predict(p, sleep, overhead) for p in points]
        spreads = [sampling_spread_ms(pred, p) for pred, p in zip(predictions, points)]
        budget = [p.requests / pred.rate_rps + WARMUP_S + SETUP_S for p, pred in zip(points, predictions)]
        log(f"{len(points)} points, about {sum(budget) / 60:.1f} min of load")
        results: list[PointResult] = []
        console = Console(stderr=True)
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=console,
            transient=True,
        ) as bar:
            task = bar.add_task("points", total=sum(budget))
            points_started, done = time.monotonic(), 0.0
            for i, (point, seconds) in enumerate(zip(points, budget)):
                bar.update(task, description=f"{point.label} ({i + 1}/{len(points)})")
                result = check.measure_undisturbed(point, overhead, seed=args.seed + i)
                results.append(result)
                done += seconds
                # the estimate scaled by how the runs so far compared with it (repeated runs included)
                eta = (sum(budget) - done) * (time.monotonic() - points_started) / done
                bar.console.print(
                    f"[{i + 1}/{len(points)}] {point.label}: p50 {result.measured_p50_ms:.2f} "
                    f"(model {result.predicted_p50_ms:.2f}) ms, p99 {result.measured_p99_ms:.2f} "
                    f"(model {result.predicted_p99_ms:.2f}) ms, {'pass' if result.passed else 'FAIL'}; "
                    f"ETA {eta / 60:.1f} min",
                    highlight=False,
                )
                bar.advance(task, seconds)

    sleep_1 = float(sleep.sleep_ms(1))
    print(
        f"batch_sleep: a + c*k with a = {sleep.base_ms:g} ms, c = {sleep.per_item_ms:g} ms; one instance; "
        f"Poisson arrivals; goal: within {100 * REL_TOLERANCE:.0f}% or {ABS_TOLERANCE_MS:g} ms at u <= 0.7"
    )
    print(
        f"serving overhead (measured once): {overhead.total_ms(sleep_1):.2f} ms on an unqueued batch-1 request, "
        f"of which {overhead.occupancy_base_ms:.2f} ms per batch + {overhead.occupancy_per_request_ms:.3f} ms "
        f"per request occupy the instance (O(1) = {overhead.occupancy_1_ms:.2f} ms, O({overhead.top_batch}) = "
        f"{overhead.occupancy_top_ms:.2f} ms at saturation) and {overhead.latency_ms:.2f} ms is latency only; "
        f"Triton's compute time at batch 1: {overhead.compute_1_ms:.2f} ms at saturation, "
        f"{overhead.compute_idle_1_ms:.2f} ms from idle"
    )
    print(
        f"machine noise: an unqueued batch-1 request's p99 is {overhead.jitter_p99_ms:.2f} ms above its median "
        f"(the model's service is deterministic); other processes used {_mean_others(results):.2f} of "
        f"{os.cpu_count()} cores during the runs (load average {os.getloadavg()[0]:.2f} at the end)"
    )
    print(render_table(HEADERS, [row(r, s) for r, s in zip(results, spreads)]))
    goal = [r for r in results if r.point.utilisation <= 0.7 + 1e-9]
    print(
        f"{sum(r.passed for r in goal)}/{len(goal)} points with u <= 0.7 within the goal; "
        f"{sum(r.passed for r in results)}/{len(results)} in all; "
        f"{sum(r.attempts - 1 for r in results)} run(s) repeated after the machine disturbed them; "
        f"{(time.monotonic() - started) / 60:.1f} min"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
