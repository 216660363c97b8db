"""What a node observes from a real Triton: per batch size executions and durations, the simulated
accelerator and its slowdown hook, and a pre-warmed move."""

from __future__ import annotations

import os
import time

import pytest
from profiles import ACCEL_BASE_MS, ACCEL_PER_SAMPLE_MS
from triton_helpers import infer

from agents.loadgen import LoadGenerator
from agents.triton import TritonFleet
from agents.triton.metrics import parse_metrics
from controller.messages import ModelAssignment

pytestmark = pytest.mark.triton

try:
    from agents.triton import find_tritonserver

    find_tritonserver()
except Exception as err:  # noqa: BLE001
    pytest.skip(f"tritonserver not available: {err}", allow_module_level=True)

CORES = len(os.sched_getaffinity(0))


def accel(share: float, batch: int = 4) -> ModelAssignment:
    return ModelAssignment("w", "accel_sim", 0, share, batch, 0.0, 100.0, 20.0)


def expected_ms(batch: int, share: float) -> float:
    cores = max(1, -(-int(share * CORES) // 100))
    return (ACCEL_BASE_MS + ACCEL_PER_SAMPLE_MS * batch) / cores


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, demo_repo_module):
    fleet = TritonFleet(str(demo_repo_module), workdir=str(tmp_path_factory.mktemp("fleet")), ready_timeout_s=60)
    try:
        yield fleet
    finally:
        fleet.close()


@pytest.fixture(scope="module")
def demo_repo_module(tmp_path_factory):
    import shutil

    from triton_helpers import DEMO_REPO

    target = tmp_path_factory.mktemp("repo") / "repo"
    shutil.copytree(DEMO_REPO, target, ignore=shutil.ignore_patterns("__pycache__"))
    return target


def run_load(fleet, rate=20.0, seconds=2.0):
    with LoadGenerator(lambda: fleet.endpoint("w#0"), "accel_sim") as gen:
        return gen.run(rate, seconds, arrival="poisson")


def served_successes(fleet) -> float:
    return parse_metrics(fleet.metrics_text("w#0")).get("accel_sim", {}).get("success", 0.0)


def await_counted(fleet, before: float, ok: int, timeout_s: float = 5.0) -> None:
    """Triton counts a request once its response is released, a moment after the client has it: wait until
    the counters hold every answered request (a test that reads them at once misses the last one now and then)."""
    deadline = time.monotonic() + timeout_s
    while served_successes(fleet) - before < ok and time.monotonic() < deadline:
        time.sleep(0.05)


def test_windows_carry_batch_statistics_of_the_simulated_accelerator(fleet):
    assert fleet.apply([accel(50.0)]).errors == ()
    assert fleet.served_config("w#0").instance_group[0].count == 1  # stoke_cpu_instances: one, whatever the share
    fleet.observe()
    before = served_successes(fleet)
    report = run_load(fleet)
    await_counted(fleet, before, report.ok)
    [o] = fleet.observe()
    assert o.seq >= 2 and o.instances == 1 and o.window_s > 0
    assert o.requests == report.ok and report.failed == 0
    assert sum(s.batch * s.executions for s in o.batch_stats) == o.requests
    for s in o.batch_stats:
        assert expected_ms(s.batch, 50.0) <= s.compute_ms <= expected_ms(s.batch, 50.0) * 1.5 + 5.0
    assert o.compute_infer_ms > 0 and o.pending == 0


def test_slowdown_hook_multiplies_every_batch_from_the_next_one_on(fleet, demo_repo_module):
    hook = demo_repo_module / "accel_sim" / "1" / "slowdown"
    try:
        hook.write_text("2\n")
        fleet.observe()
        run_load(fleet, rate=10.0)
        [o] = fleet.observe()
        for s in o.batch_stats:
            assert 2 * expected_ms(s.batch, 50.0) <= s.compute_ms <= 2 * expected_ms(s.batch, 50.0) * 1.5 + 5.0
    finally:
        hook.unlink()
    start = time.perf_counter()
    infer(fleet.endpoint("w#0"), "accel_sim", batch=1)
    assert time.perf_counter() - start < 2 * expected_ms(1, 50.0) / 1000.0 + 0.5  # back to normal


@pytest.mark.skipif(CORES < 2, reason="a larger share needs a second core")
def test_a_move_starts_a_pre_warmed_process_at_the_larger_share(fleet):
    fleet.observe()
    report = fleet.apply([accel(100.0)])
    assert report.moved == ("w#0",) and report.errors == ()
    [o] = fleet.observe()
    assert o.requests == 0  # the warm-up requests do not count in the window
    run_load(fleet)
    [o] = fleet.observe()
    for s in o.batch_stats:  # twice the cores: twice as fast
        assert expected_ms(s.batch, 100.0) <= s.compute_ms <= expected_ms(s.batch, 100.0) * 1.5 + 5.0
