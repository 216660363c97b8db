"""Partial batches in the error bound and in verification (issue 15).

A lightly loaded Poisson queue runs mostly on partial batches 1..B-1, and the batching table knows
O(k) only as the line through O(1) and O(B). The upper service curve (`PointCache.upper_lines`) is a
line at or above every raised O(k), and verification measures every batch size a Poisson replica
runs, so a device whose partial batches are slower than the fit is caught.
"""

import math
from dataclasses import dataclass

import numpy as np
import pytest

from interference.profile import DeviceProfile, ModelProfile
from interference.profile_io import bundled_profile
from planner.simulate import simulate
from planner.solver import GpuType, Problem, Workload, solve
from planner.solver.candidates import MAX_BATCH, PointCache
from planner.solver.stoke import CENTRAL_OPTIONS, _p99
from planner.solver.verify import plan_points, verify

FITTED = bundled_profile()
V100 = GpuType("V100", 3.06, FITTED)


@dataclass(frozen=True, eq=False)
class Tiled(ModelProfile):
    """A device whose kernels run in tiles of 4: a partial tile costs a whole one (batch 1-3 as 4, 5-7
    as 8), so every batch size that is not a multiple of 4 is slower than the fit, a full one is not."""

    def active_time_ms(self, batch: float, share_pct: float) -> float:
        return ModelProfile.active_time_ms(self, 4 * math.ceil(batch / 4), share_pct)


TILED = DeviceProfile(
    FITTED.gpu, {n: Tiled(**{f: getattr(m, f) for f in m.__dataclass_fields__}) for n, m in FITTED.models.items()}
)
#: Lightly loaded Poisson workloads whose error-aware plans pick a max batch that is not a multiple of 4.
WORKLOADS = (Workload("detect", "ssd", 60.0, 100.0), Workload("classify", "resnet50", 25.0, 400.0))


def line_values(factor: float, shape: float, raised_b: float, batch: int) -> np.ndarray:
    """O(k), k = 1..batch, of the line `upper_lines` describes (the table's shape coordinate)."""
    top = factor * raised_b
    first = top * batch ** (shape - 1.0)
    return first + (top - first) * np.arange(batch) / max(batch - 1, 1)


def assert_lines_cover(cache: PointCache, model: str) -> None:
    points = cache.upper_occupancy_table(model)
    factor, shape = cache.upper_lines(model)
    assert (factor >= 1.0 - 1e-12).all()
    for b in range(2, MAX_BATCH + 1):
        for s in range(0, len(cache.shares), 7):
            for j in range(factor.shape[0]):
                line = line_values(factor[j, b - 1, s], shape[j, b - 1, s], points[b - 1, s], b)
                assert (line >= points[:b, s] * (1 - 1e-9)).all(), (model, b, s, j)
        # some line is no higher than O(B) itself where O(k) rises to B (pivoting on O(B))
        rising = points[b - 1] >= points[:b].max(axis=0) - 1e-12
        assert factor[:, b - 1].min(axis=0)[rising] == pytest.approx(1.0, abs=1e-9)


@pytest.mark.parametrize("model", sorted(FITTED.models))
def test_every_upper_line_lies_at_or_above_every_raised_occupancy(model):
    assert_lines_cover(PointCache(V100), model)


def test_a_slow_measured_partial_batch_lifts_the_upper_lines():
    m = FITTED.model("ssd")
    # batches 1 and 3 measured as fitted, batch 2 30% slower
    slow = m.with_measured({(k, 50.0): (1.3 if k == 2 else 1.0) * m.active_time_ms(k, 50.0) for k in (1, 2, 3)})
    cache = PointCache(GpuType("V100", 3.06, DeviceProfile(FITTED.gpu, {**FITTED.models, "ssd": slow})))
    assert_lines_cover(cache, "ssd")
    factor, shape = cache.upper_lines("ssd")
    points = cache.upper_occupancy_table("ssd")
    column = int(round(50.0 / FITTED.gpu.share_step_pct)) - 1
    # at max batch 3 no line can stay at O(1) and O(3) both: each is lifted at one end or the other
    for j in range(factor.shape[0]):
        line = line_values(factor[j, 2, column], shape[j, 2, column], points[2, column], 3)
        assert max(line[0] / points[0, column], line[2] / points[2, column]) > 1.1


def test_the_upper_p99_is_never_below_the_central_one():
    cache = PointCache(V100)
    for model in FITTED.models:
        for rate in (20.0, 200.0):
            _, central, _, _ = _p99(cache, model, "poisson", rate, options=CENTRAL_OPTIONS)
            _, upper, _, _ = _p99(cache, model, "poisson", rate)
            both = np.isfinite(central) & np.isfinite(upper)
            assert both.any()
            # (to the table's interpolation: the upper curves are the least over lines at the grid's nodes,
            # read at the line's own utilisation; up to 0.3% low where a batch's fill wait is the p99)
            assert (upper[both] >= central[both] * (1 - 5e-3)).all()
            assert not (np.isfinite(upper) & ~np.isfinite(central)).any()  # finite upper: finite central


def replayed(plan):
    return {w.name: w for w in simulate(plan, {"V100": TILED}, seconds=240.0, seed=3).workloads}


def test_verification_measures_partial_batches_and_the_replan_holds_on_a_tiled_device():
    problem = Problem(WORKLOADS, (V100,))
    plan = solve(problem, "stoke")
    assert any(p.batch % 4 for _, p in plan.placements())  # the premise: partial tiles are planned
    assert not all(w.meets_slo for w in replayed(plan).values())  # and the error bound alone misses

    checked = verify(problem, lambda gpu, model, batch, share: TILED.model(model).active_time_ms(batch, share))
    assert checked.holds and len(checked.rounds) <= 8
    for _, p in checked.plan.placements():  # every batch size 1..B of each Poisson replica was measured
        measured = {(b, r) for b, r, _ in next(iter(checked.problem.inventory)).profile.model(p.model).measured}
        assert {(k, round(p.share_pct, 6)) for k in range(1, p.batch + 1)} <= measured
    assert {(k, s) for _, _, k, s in plan_points(checked.plan)} >= {
        (1, round(p.share_pct, 6)) for _, p in checked.plan.placements()
    }
    for name, w in replayed(checked.plan).items():
        p = next(p for _, p in checked.plan.placements() if p.name == name)
        assert w.meets_slo, name
        assert w.p99_ms <= p.p99_upper_ms, name  # the upper bound holds on the device
        assert p.p99_upper_ms <= 0.98 * p.slo_ms * (1 + 1e-9), name  # and it is what the budget held


def measured_curve(slower: float) -> GpuType:
    """resnet50 measured at batches 1..8 on every share step: batches 2..7 `slower` than the fit,
    batches 1 and 8 as fitted (so the chord through O(1) and O(8) does not move)."""
    m = FITTED.model("resnet50")
    step = FITTED.gpu.share_step_pct
    points = {
        (k, round(step * j, 6)): (slower if 1 < k < 8 else 1.0) * m.active_time_ms(k, step * j)
        for k in range(1, 9)
        for j in range(1, int(round(100 / step)) + 1)
    }
    return GpuType("V100", 3.06, DeviceProfile(FITTED.gpu, {**FITTED.models, "resnet50": m.with_measured(points)}))


def test_slow_partial_batches_raise_the_p99_the_planner_checks():
    from planner.solver.stoke import candidate_grid

    workload = Workload("w", "resnet50", 40.0, 150.0)  # light load at batch 8
    exact, slow = PointCache(measured_curve(1.0)), PointCache(measured_curve(1.2))
    at_exact = candidate_grid(workload, exact, workload.rate_rps).p99_ms[:, 7]
    at_slow = candidate_grid(workload, slow, workload.rate_rps).p99_ms[:, 7]
    both = np.isfinite(at_exact) & np.isfinite(at_slow)
    assert both.any()
    # the chord through O(1) and O(8) is the same; only the partial batches differ
    assert (at_slow[both] > at_exact[both] * 1.03).mean() > 0.5
    # and the scalar check `colocate` uses (P99Target.met_by) reads the same curves
    from planner.solver.stoke import best_candidate

    item = best_candidate(workload, exact, workload.rate_rps)
    prediction = exact.predict([item], [item.min_share])[0]
    raised = exact.raised("resnet50", item.batch, item.min_share, prediction)
    slow_raised = slow.raised("resnet50", item.batch, item.min_share, slow.predict([item], [item.min_share])[0])
    if item.batch > 2:
        assert item.target.p99_ms(slow, slow_raised, item.min_share, upper=True) > item.target.p99_ms(
            exact, raised, item.min_share, upper=True
        )
