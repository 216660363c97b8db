"""The truth that is not the fit (`interference.truth`): each documented part, and each part switched off."""

import numpy as np
import pytest

from interference.fit import GRID_SHARES, active_points
from interference.profile_io import bundled_profile, bundled_raw_path, read_raw
from interference.truth import BELOW_EXPONENT, BUMP, STEP_WEIGHT, TILE, truth_profile

FITTED = bundled_profile()
RAW = read_raw(bundled_raw_path())
MODEL = "ssd"  # fitted 4-5% fast at unmeasured batches (issue 15)


def truth_of(**parts: bool):
    return truth_profile(FITTED, RAW, **parts).model(MODEL)


@pytest.mark.parametrize("parts", [{}, {"steps": False, "bumps": False}, {"steps": False}, {"bumps": False}])
def test_the_truth_is_the_measurement_at_every_measured_point(parts):
    truth = truth_of(**parts)
    for b, r, measured in zip(*active_points(RAW[MODEL], MODEL, FITTED.gpu)):
        assert truth.active_time_ms(b, r) == pytest.approx(measured, rel=1e-9)


def test_without_steps_and_bumps_the_truth_is_the_measured_surface():
    truth = truth_of(steps=False, bumps=False)
    fitted = FITTED.model(MODEL)
    off_grid = [(b, r) for b in (2, 3, 5, 7, 12, 24) for r in (20.0, 40.0, 80.0)]
    for b, r in off_grid:
        assert truth.active_time_ms(b, r) == pytest.approx(truth.smooth_ms(b, r), rel=1e-12)
    # the measurements' residuals carry between the points: the surface is not the fit
    ratios = [truth.active_time_ms(b, r) / fitted.active_time_ms(b, r) for b, r in off_grid]
    assert max(abs(x - 1.0) for x in ratios) > 0.01


def test_below_the_measured_shares_the_curve_grows_by_the_documented_exponent():
    truth = truth_of(steps=False, bumps=False)
    smallest = float(min(GRID_SHARES))
    quarter = smallest / 4.0
    fitted = FITTED.model(MODEL)
    edge = truth.active_time_ms(1, smallest) / fitted.active_time_ms(1, smallest)  # the residual held at the edge
    below = truth.active_time_ms(1, quarter) / fitted.active_time_ms(1, quarter)
    assert below / edge == pytest.approx(4.0**BELOW_EXPONENT, rel=1e-9)


def test_steps_charge_part_of_the_next_tile_and_nothing_on_a_tile():
    smooth = truth_of(steps=False, bumps=False)
    stepped = truth_of(bumps=False)
    share = 50.0
    for b in range(2, 33):
        tile = TILE * -(-b // TILE)
        own, want = smooth.active_time_ms(b, share), smooth.active_time_ms(tile, share)
        expected = own if b == tile or b in stepped.batches else own + STEP_WEIGHT * (want - own)
        assert stepped.active_time_ms(b, share) == pytest.approx(expected, rel=1e-12)
    assert stepped.active_time_ms(5, share) > smooth.active_time_ms(5, share)  # the curve rises: steps cost


def test_bumps_scatter_within_their_bound_seeded_the_same_every_time():
    smooth = truth_of(bumps=False)
    bumped = truth_of()
    again = truth_of()
    factors = np.array(
        [bumped.active_time_ms(b, r) / smooth.active_time_ms(b, r) for b in range(2, 16) for r in (20.0, 30.0, 70.0)]
    )
    assert np.all(np.abs(factors - 1.0) <= BUMP + 1e-12)
    assert factors.std() > BUMP / 4  # scattered, not one constant factor
    assert bumped.active_time_ms(7, 30.0) == pytest.approx(again.active_time_ms(7, 30.0), rel=1e-12)
