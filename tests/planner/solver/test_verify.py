"""Verification on the simulated device: measured points replace an optimistic fit, and the re-plan holds."""

from dataclasses import replace

import pytest

from interference.profile import DeviceProfile
from interference.profile_io import bundled_profile
from planner.simulate import simulate
from planner.solver import GpuType, Problem, ProblemError, Workload, solve
from planner.solver.candidates import MAX_BATCH
from planner.solver.verify import neighbour_points, unmeasured, verify

FITTED = bundled_profile()
#: The device: ssd runs 25% slower than its fit everywhere (the fit's own error bound there is 5-15%).
SLOWER = 1.25
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
    assert "detect" in replayed_misses(plan)  # the premise: the error bound alone does not cover 25%


def test_verification_corrects_the_optimistic_points_and_the_replan_holds():
    rounds = []
    checked = verify(Problem(WORKLOADS, (V100,)), measure, progress=rounds.append)
    assert checked.holds and not unmeasured(checked.problem, checked.plan)
    assert 1 <= len(checked.rounds) <= 8 and rounds == list(checked.rounds)
    assert checked.rounds[0].worst_ratio == pytest.approx(SLOWER, rel=1e-6)  # ssd was measured 25% slow
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


def exact(gpu_type, model, batch, share):
    return FITTED.model(model).active_time_ms(batch, share)


def test_neighbours_measure_two_share_steps_lower_and_the_batch_above_and_may_lower_the_plan():
    problem = Problem(WORKLOADS, (V100,))
    plain = verify(problem, exact)
    wider = verify(problem, exact, neighbours=True)
    assert plain.holds and wider.holds
    step = FITTED.gpu.share_step_pct
    first = solve(problem, "stoke")
    measured = {
        (m, b, r) for m, mp in next(iter(wider.problem.inventory)).profile.models.items() for b, r, _ in mp.measured
    }
    for _, p in first.placements():  # round 1 measured each chosen point and its neighbours
        share = round(p.share_pct, 6)
        assert (p.model, p.batch, share) in measured
        for lower in (share - step, share - 2 * step):
            assert lower <= 0 or (p.model, p.batch, round(lower, 6)) in measured
        largest = min(MAX_BATCH, FITTED.model(p.model).domain.max_batch)
        assert p.batch >= largest or (p.model, p.batch + 1, share) in measured
    # it ended because the final plan's neighbours were measured too, not because the rounds ran out
    assert len(wider.rounds) < 8 and not unmeasured(wider.problem, wider.plan, neighbour_points(problem, wider.plan))
    assert wider.points > plain.points
    # a device exactly as fitted: measured points carry 2% instead of the fit's bound, so lower shares hold
    total = lambda plan: sum(p.share_pct for _, p in plan.placements())  # noqa: E731
    assert total(wider.plan) < total(plain.plan) - step / 2
    for _, p in wider.plan.placements():
        assert p.p99_upper_ms <= p.slo_ms


def test_no_neighbour_is_a_batch_larger_than_the_profile_measured():
    """A server may refuse a batch past what its model was profiled at (Triton's max_batch_size): the batch
    above a chosen point is a neighbour only within the profile's measured batches."""
    problem = Problem(WORKLOADS, (V100,))
    plan = solve(problem, "stoke")
    for _, model, batch, _ in neighbour_points(problem, plan):
        assert batch <= FITTED.model(model).domain.max_batch
    first = next(p for _, p in plan.placements())
    m = FITTED.model(first.model)
    keep = [i for i, b in enumerate(m.domain.batches) if b <= first.batch]
    domain = replace(
        m.domain, batches=tuple(m.domain.batches[i] for i in keep), error=tuple(m.domain.error[i] for i in keep)
    )
    profile = DeviceProfile(FITTED.gpu, {**FITTED.models, first.model: replace(m, domain=domain)})
    narrow = replace(problem, inventory=(replace(V100, profile=profile),))
    assert not any(
        model == first.model and batch > first.batch for _, model, batch, _ in neighbour_points(narrow, plan)
    )


def test_a_measured_point_below_the_fits_shares_counts_as_inside_the_domain():
    from planner.solver.candidates import PointCache

    ssd = FITTED.model("ssd")
    low = ssd.domain.min_share - 2 * FITTED.gpu.share_step_pct
    measured = replace(ssd, measured=((4, low, ssd.active_time_ms(4, low) * 1.2),))
    cache = PointCache(GpuType("V100", 3.06, DeviceProfile(FITTED.gpu, {**FITTED.models, "ssd": measured})))
    table = cache.domain_table("ssd")
    column = int(round(low / FITTED.gpu.share_step_pct)) - 1
    assert table[3, column] and not table[2, column] and not table[3, column + 1]
    assert not PointCache(V100).domain_table("ssd")[3, column]
