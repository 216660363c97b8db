"""Verification on the simulated device: measured points replace an optimistic fit, and the re-plan holds."""

from dataclasses import replace

import pytest

from interference.profile import DeviceProfile
from interference.profile_io import bundled_profile
from planner.simulate import simulate
from planner.solver import GpuType, Problem, ProblemError, Workload, solve
from planner.solver.verify import unmeasured, verify

FITTED = bundled_profile()
#: The device: ssd runs 12% slower than its fit everywhere (the fit's own error bound there is ~5%).
SLOWER = 1.12
k1, k2, k3, k4, k5 = FITTED.model("ssd").k_act
TRUTH = DeviceProfile(
    FITTED.gpu,
    {
        **FITTED.models,
        "ssd": replace(FITTED.model("ssd"), k_act=(k1 * SLOWER, k2 * SLOWER, k3 * SLOWER, k4, k5 * SLOWER)),
    },
)
V100 = GpuType("V100", 3.06, FITTED)
WORKLOADS = (
    Workload("detect", "ssd", 120.0, 220.0, arrivals="constant"),
    Workload("detect-2", "ssd", 90.0, 150.0, arrivals="constant"),
    Workload("classify", "resnet50", 40.0, 300.0, arrivals="constant"),
)


def measure(gpu_type, model, batch, share):
    assert gpu_type == "V100"
    return TRUTH.model(model).active_time_ms(batch, share)


def replayed_misses(plan):
    report = simulate(plan, {"V100": TRUTH}, seconds=20.0, seed=3)
    return [w.name for w in report.workloads if not w.meets_slo]


def test_the_optimistic_fit_misses_on_the_device_before_verification():
    plan = solve(Problem(WORKLOADS, (V100,)), "stoke")
    assert "detect" in replayed_misses(plan)  # the premise: the error bound alone does not cover 12%


def test_verification_corrects_the_optimistic_points_and_the_replan_holds():
    rounds = []
    checked = verify(Problem(WORKLOADS, (V100,)), measure, progress=rounds.append)
    assert checked.holds and not unmeasured(checked.problem, checked.plan)
    assert 1 <= len(checked.rounds) <= 8 and rounds == list(checked.rounds)
    assert checked.rounds[0].worst_ratio == pytest.approx(SLOWER, rel=1e-6)  # ssd was measured 12% slow
    assert checked.points == sum(r.measured for r in checked.rounds) >= len(WORKLOADS)
    # the measured points are in the profile the final plan was made with
    ssd = next(g for g in checked.problem.inventory).profile.model("ssd")
    assert ssd.measured and all(
        TRUTH.model("ssd").active_time_ms(b, r) == pytest.approx(ms) for b, r, ms in ssd.measured
    )
    assert replayed_misses(checked.plan) == []
    for _, p in checked.plan.placements():
        assert p.p99_upper_ms <= p.slo_ms
    # nothing was measured twice: the last round's points were new
    assert len({(b, r) for b, r, _ in ssd.measured}) == len(ssd.measured)


def test_a_device_that_gives_garbage_is_refused():
    with pytest.raises(ProblemError, match="gave 0.0 ms"):
        verify(Problem(WORKLOADS, (V100,)), lambda *point: 0.0)
    with pytest.raises(ProblemError, match="rounds must be"):
        verify(Problem(WORKLOADS, (V100,)), measure, max_rounds=0)
