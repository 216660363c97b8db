"""The fit's domain and out-of-sample error (leave-one-out), and how profiles carry them."""

import json

import numpy as np
import pytest

from interference.fit import _active_time, fit_active_time, fit_domain, leave_one_out_errors
from interference.profile import DEFAULT_FIT_ERROR, EXTRAPOLATION_ERROR_PER_OCTAVE, UNMEASURED_ERROR, FitDomain
from interference.profile_io import ProfileFileError, bundled_profile, load_profile, profile_to_dict, save_profile

K_TRUE = np.array([0.01, 4.0, 20.0, 1.5, 0.2])


def grid(batches=(1, 8, 16, 32), shares=(10, 25, 50, 100)):
    b, r = np.meshgrid(np.asarray(batches, float), np.asarray(shares, float), indexing="ij")
    return b.ravel(), r.ravel()


def test_an_exact_surface_has_no_out_of_sample_error():
    batch, share = grid()
    active = _active_time(K_TRUE, batch, share)
    loo = leave_one_out_errors(batch, share, active)
    assert loo is not None and loo.max() < 1e-4
    domain = fit_domain(fit_active_time(batch, share, active), batch, share, active)
    assert domain.floor < 1e-4
    assert domain.batches == (1, 8, 16, 32) and domain.shares == (10.0, 25.0, 50.0, 100.0)


def test_a_point_off_the_curve_shows_in_its_own_error_and_raises_the_floor():
    batch, share = grid()
    active = _active_time(K_TRUE, batch, share)
    bumped = active.copy()
    k = int(np.flatnonzero((batch == 8) & (share == 25))[0])
    bumped[k] *= 1.08  # one measurement 8% above the smooth curve
    domain = fit_domain(fit_active_time(batch, share, bumped), batch, share, bumped)
    errors = np.asarray(domain.error)
    assert errors[1, 1] == errors.max()  # the point left out is the one the others cannot predict
    assert 0.05 < errors[1, 1] < 0.2
    assert domain.floor > 0.005
    # between points the bound interpolates, never falls below the floor, and adds what a point not
    # measured may hide
    assert float(domain.error_at(8, 25)) == pytest.approx(errors[1, 1], rel=1e-6)
    between = float(domain.error_at(12, 35)) - UNMEASURED_ERROR
    assert domain.floor - 1e-12 <= between <= errors.max() + 1e-12


def test_too_few_points_fall_back_to_the_default_error():
    batch, share = grid(batches=(1, 32), shares=(50, 100))
    active = _active_time(K_TRUE, batch, share)
    assert leave_one_out_errors(batch, share, active) is None
    domain = fit_domain(fit_active_time(batch, share, active), batch, share, active)
    assert domain.floor == DEFAULT_FIT_ERROR
    assert np.allclose(domain.error, DEFAULT_FIT_ERROR)


def test_outside_the_domain_the_error_grows_per_octave():
    domain = FitDomain(batches=(1, 16, 32), shares=(10.0, 50.0, 100.0), error=((0.02,) * 3,) * 3, floor=0.01)
    assert domain.contains(6, 10) and not domain.contains(6, 7.5) and not domain.contains(33, 50)
    off = 0.02 + UNMEASURED_ERROR  # batch 4 and 64 were not measured
    assert float(domain.error_at(4, 10)) == pytest.approx(off, rel=1e-9)
    assert float(domain.error_at(4, 5)) == pytest.approx(off + EXTRAPOLATION_ERROR_PER_OCTAVE, rel=1e-9)
    assert float(domain.error_at(4, 2.5)) == pytest.approx(off + 2 * EXTRAPOLATION_ERROR_PER_OCTAVE, rel=1e-9)
    assert float(domain.error_at(64, 100)) == pytest.approx(off + EXTRAPOLATION_ERROR_PER_OCTAVE, rel=1e-9)


def test_bundled_profile_records_its_domain_and_error():
    for model in bundled_profile().models.values():
        assert model.domain is not None
        assert model.domain.shares == (10.0, 50.0, 100.0) and model.domain.batches == (1, 16, 32)
        assert 0.0 < model.domain.floor < 0.2


def test_an_old_profile_without_a_domain_loads_with_the_default_error(tmp_path):
    data = profile_to_dict(bundled_profile())
    for m in data["models"].values():
        del m["domain"]
    (tmp_path / "old.json").write_text(json.dumps(data))
    old = load_profile(tmp_path / "old.json")
    ssd = old.model("ssd")
    assert ssd.domain is None and ssd.in_domain(1, 2.5)
    # as it always planned (documented): the default everywhere; a refit's bound off its points is larger
    assert np.allclose(ssd.fit_error(np.array([1, 8]), np.array([2.5, 100.0])), DEFAULT_FIT_ERROR)
    assert float(bundled_profile().model("ssd").fit_error(8, 30.0)) > DEFAULT_FIT_ERROR


def test_domain_round_trips_and_a_bad_domain_is_refused(tmp_path):
    save_profile(bundled_profile(), tmp_path / "p.json")
    assert load_profile(tmp_path / "p.json") == bundled_profile()
    data = profile_to_dict(bundled_profile())
    data["models"]["ssd"]["domain"]["error"] = [[0.1, 0.1]]
    (tmp_path / "bad.json").write_text(json.dumps(data))
    with pytest.raises(ProfileFileError, match=r"models\.ssd field 'domain'.*batches x shares"):
        load_profile(tmp_path / "bad.json")
    data["models"]["ssd"]["domain"] = {"batches": [1], "shares": [10.0], "error": [[-1.0]], "floor": 0.0}
    (tmp_path / "bad.json").write_text(json.dumps(data))
    with pytest.raises(ProfileFileError, match=r"relative errors"):
        load_profile(tmp_path / "bad.json")


def test_a_measured_point_overrides_the_fit_and_raises_its_neighbourhood_only_when_slower():
    from interference.profile import MEASURED_ERROR

    ssd = bundled_profile().model("ssd")
    fitted = ssd.active_time_ms(8, 50.0)
    slow = ssd.with_measured({(8, 50.0): fitted * 1.2})
    assert slow.active_time_ms(8, 50.0) == pytest.approx(fitted * 1.2, rel=1e-12)
    assert float(slow.fit_error(8, 50.0)) == MEASURED_ERROR
    assert float(slow.fit_error(8, 52.5)) == pytest.approx(float(ssd.fit_error(8, 52.5)), rel=1e-12)
    # the nearest unmeasured point is raised by the same excess; the vectorised path agrees
    assert slow.active_time_ms(8, 52.5) == pytest.approx(ssd.active_time_ms(8, 52.5) * 1.2, rel=1e-9)
    grid = slow.active_grid_ms(np.array([[8.0], [9.0]]), np.array([[50.0, 52.5]]))
    assert grid[0, 0] == pytest.approx(fitted * 1.2) and grid[1, 1] == pytest.approx(slow.active_time_ms(9, 52.5))
    fast = ssd.with_measured({(8, 50.0): fitted * 0.8})
    assert fast.active_time_ms(8, 50.0) == pytest.approx(fitted * 0.8)
    assert fast.active_time_ms(8, 52.5) == pytest.approx(ssd.active_time_ms(8, 52.5))  # not trusted beyond itself


def test_measured_points_round_trip_and_garbage_is_refused(tmp_path):
    from interference.profile import DeviceProfile

    profile = bundled_profile()
    measured = DeviceProfile(
        profile.gpu, {**profile.models, "ssd": profile.model("ssd").with_measured({(4, 50.0): 9.5})}
    )
    save_profile(measured, tmp_path / "m.json")
    assert load_profile(tmp_path / "m.json").model("ssd").measured == ((4, 50.0, 9.5),)
    data = profile_to_dict(measured)
    data["models"]["ssd"]["measured"] = [[4, 50.0, -1.0]]
    (tmp_path / "bad.json").write_text(json.dumps(data))
    with pytest.raises(ProfileFileError, match=r"models\.ssd field 'measured'.*batch, share_pct, active_ms"):
        load_profile(tmp_path / "bad.json")


@pytest.mark.parametrize("seed", range(5))
def test_the_bound_covers_points_the_fit_never_saw_on_a_rough_surface(seed):
    """A device whose every (batch, share step) sits up to +-5% off a smooth curve (known noise), measured
    on a 3 x 3 grid: the error bound at the points it did not measure covers their true error."""
    rng = np.random.default_rng(seed)
    b, r = np.meshgrid(np.arange(1, 33, dtype=float), np.arange(4, 41) * 2.5, indexing="ij")
    truth = _active_time(K_TRUE, b, r) * rng.uniform(0.95, 1.05, size=b.shape)
    measured = np.isin(b, (1, 16, 32)) & np.isin(r, (10.0, 50.0, 100.0))
    k_act = fit_active_time(b[measured], r[measured], truth[measured])
    domain = fit_domain(k_act, b[measured], r[measured], truth[measured])
    error = np.abs(truth / _active_time(np.asarray(k_act), b, r) - 1.0)
    bound = domain.error_at(b, r)
    assert np.mean(error[~measured] <= bound[~measured]) >= 0.99
    assert (error[measured] <= bound[measured] + 1e-9).all()


def test_the_bound_is_least_at_a_measured_point_and_larger_off_it():
    domain = FitDomain(batches=(1, 16, 32), shares=(10.0, 50.0, 100.0), error=((0.03,) * 3,) * 3, floor=0.01)
    at = float(domain.error_at(16, 50.0))
    assert at == pytest.approx(0.03, rel=1e-9)  # the leave-one-out error of the point itself
    for batch, share in ((17, 50.0), (15, 50.0), (16, 52.5), (16, 47.5), (8, 30.0)):
        assert float(domain.error_at(batch, share)) == pytest.approx(0.03 + UNMEASURED_ERROR, rel=1e-9)
    # arrays broadcast the same way
    grid = domain.error_at(np.array([[16.0], [17.0]]), np.array([[50.0, 52.5]]))
    assert grid[0, 0] == pytest.approx(at) and grid[0, 1] == grid[1, 0] == grid[1, 1]
    # a point verification measured is bounded by the measurement's own noise, its neighbour is not
    from interference.profile import MEASURED_ERROR

    ssd = bundled_profile().model("ssd").with_measured({(8, 50.0): 10.0})
    assert float(ssd.fit_error(8, 50.0)) == MEASURED_ERROR
    assert float(ssd.fit_error(9, 50.0)) >= ssd.domain.floor + UNMEASURED_ERROR
