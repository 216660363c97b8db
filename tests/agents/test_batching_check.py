"""Triton's real dynamic batcher against the batching model, at one operating point (issue 8).

`batch_sleep` (a batch of k takes a + c*k ms) on a real tritonserver with one
instance, batch 4, the max queue delay at the fill time, Poisson arrivals at
utilisation 0.5; the serving overhead measured first. The measured p50 must be
within 10% or 2 ms of `latency_distribution` and the p99 within 25%, nearer it
than deliberately wrong models at the same point (the delay ignored, the wrong
max batch), which the 10% tolerance must reject, so the check cannot pass by
accident. The 10% goal at p99 is the benchmark's,
`benchmarks/bench_triton_batching.py`, on a quiet machine.
"""

from __future__ import annotations

import math
import os

import pytest
from triton_helpers import DEMO_REPO

from agents.batching_check import BatchingCheck, Point, predict, within_goal
from foundation.host_steal import StealMeter
from interference.batching import fill_time_ms, latency_distribution

pytestmark = pytest.mark.triton

POINT = Point(batch=4, delay="fill", utilisation=0.5, requests=2500)
P99_TOLERANCE = 0.25


def test_triton_batcher_matches_the_model_at_batch_4(tmp_path):
    with BatchingCheck(DEMO_REPO, workdir=str(tmp_path)) as check:
        for _ in range(2):  # an overhead calibrated while the VM's host took the CPUs is the host's
            with StealMeter() as calibration:
                overhead = check.calibrate(seconds=1.5)
            if calibration.disturbance() is None:
                break
        if calibration.disturbance() is not None:
            pytest.skip(f"calibrating the overhead twice: {calibration.disturbance()}: no valid prediction")
        result = check.measure_undisturbed(POINT, overhead, attempts=2)
        server_pid = check.fleet.processes()["batching#0"]["pid"]
    with pytest.raises(ProcessLookupError):  # the server is gone with the check
        os.kill(server_pid, 0)

    right = predict(POINT, check.sleep, overhead)
    rate = right.rate_rps
    wrong = {
        "delay ignored": latency_distribution(rate, 4, 0.0, "poisson", right.curve),
        "max batch 8": latency_distribution(rate, 8, fill_time_ms(8, rate), "poisson", check.sleep.curve(overhead, 8)),
    }
    for name, model in wrong.items():  # the tolerance tells these apart from the right model
        assert not within_goal(model.p99_ms, right.distribution.p99_ms), f"{name}: {model.p99_ms:.2f} ms"

    if result.disturbed:
        pytest.skip(
            f"the machine disturbed all {result.attempts} runs (load generator up to "
            f"{result.max_send_lag_ms:.0f} ms late, other processes used {result.others_cores:.2f} cores, "
            f"the host took {result.steal:.0%}, {result.steal_worst:.0%} over its worst 5 s): no valid p99"
        )
    where = (
        f"rate {rate:.1f}/s, d {result.delay_ms:.2f} ms; measured p50/p99 {result.measured_p50_ms:.2f}/"
        f"{result.measured_p99_ms:.2f} ms, model {result.predicted_p50_ms:.2f}/{result.predicted_p99_ms:.2f}, "
        f"same arrivals simulated p99 {result.same_arrivals_p99_ms:.2f}; overhead {overhead}; "
        f"others used {result.others_cores:.2f} cores"
    )
    assert result.failed == 0, where
    assert within_goal(result.measured_p50_ms, result.predicted_p50_ms), where
    # The p99 of one 2,500-request run: within P99_TOLERANCE here, and nearer the right model than either
    # wrong one. In the whole suite on this VM it read 18-20% high in 3 of 8 fresh clones with the host's
    # steal under 4% (42.6 ms against 36.0, the same arrivals simulated 35.9); the 10% goal is measured
    # on a quiet machine by benchmarks/bench_triton_batching.py, over 7 points.
    error = abs(result.measured_p99_ms / result.predicted_p99_ms - 1.0)
    assert error <= P99_TOLERANCE, where
    for name, model in wrong.items():
        assert abs(result.measured_p99_ms / model.p99_ms - 1.0) > error, f"{name} is nearer: {where}"
        assert not within_goal(result.measured_p99_ms, model.p99_ms), f"{name} would pass too: {where}"
    # Triton formed the batches the model forms (the delay timer and the preferred batch as modelled)
    assert math.isclose(result.measured_mean_batch, result.simulated_mean_batch, rel_tol=0.1), where
