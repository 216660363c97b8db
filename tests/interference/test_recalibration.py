"""The recalibration estimator: recovers an injected bias from synthetic observations, forgets, needs evidence."""

from __future__ import annotations

import numpy as np
import pytest

from interference.latency import predict_gpu
from interference.profile_io import bundled_profile
from interference.recalibration import (
    CalibrationPoint,
    Correction,
    RecalibrationOptions,
    apply_corrections,
    estimate,
)

PROFILE = bundled_profile()  # V100: interference, clock and transfer terms all matter
NOW = 10_000.0


def synthetic(
    truth,
    model="resnet50",
    windows=60,
    noise=0.05,
    seed=7,
    start=NOW - 600.0,
    end=NOW,
    batches=(1, 2, 4, 8, 16),
    shares=(20.0, 30.0, 50.0),
):
    """Windows of observations predicted by the `truth` profile, with lognormal noise, over [start, end]."""
    rng = np.random.default_rng(seed)
    neighbours_choices = [(), (("alexnet", 4, 10.0),), (("vgg19", 2, 30.0), ("alexnet", 8, 10.0))]
    points = []
    for w in range(windows):
        at = start + (end - start) * w / max(1, windows - 1)
        share = shares[w % len(shares)]
        neighbours = neighbours_choices[w % len(neighbours_choices)]
        for batch in batches[: 1 + w % len(batches)]:
            config = [(model, batch, share)] + list(neighbours)
            t = predict_gpu(truth, config)[0].latency_ms
            points.append(
                CalibrationPoint(
                    model=model,
                    batch=batch,
                    share_pct=share,
                    neighbours=neighbours,
                    observed_ms=float(t * rng.lognormal(0.0, noise)),
                    executions=int(rng.integers(5, 60)),
                    at=at,
                    window=w,
                )
            )
    return points


def biased(factor, constant=None, model="resnet50"):
    c = Correction(model, "scale", factor, factor if constant is None else constant, 0, 0, 0, 0, 0)
    return apply_corrections(PROFILE, {model: c})


@pytest.mark.parametrize("bias", [0.6, 1.37, 2.0])
def test_recovers_an_injected_bias_within_five_percent(bias):
    result = estimate(synthetic(biased(bias)), PROFILE, "resnet50", NOW)
    assert result.correction is not None, result.reason
    assert result.correction.factor == pytest.approx(bias, rel=0.05)
    assert result.correction.factor_constant == pytest.approx(bias, rel=0.05)


def test_refit_recovers_two_biases_when_the_points_are_distinct_enough():
    # batch 1 at 10% vs batch 16 at 50%: the constant part k5 weighs differently, so both factors show
    truth = biased(1.5, constant=0.7)
    points = synthetic(truth, noise=0.02, windows=120, batches=(1, 4, 16, 32), shares=(10.0, 30.0, 60.0))
    result = estimate(points, PROFILE, "resnet50", NOW)
    assert result.correction is not None and result.correction.mode == "refit", result.reason
    assert result.correction.factor == pytest.approx(1.5, rel=0.05)
    assert result.correction.factor_constant == pytest.approx(0.7, rel=0.05)


def test_pure_and_deterministic():
    points = synthetic(biased(1.2))
    first = estimate(points, PROFILE, "resnet50", NOW)
    again = estimate(list(reversed(points)), PROFILE, "resnet50", NOW)
    assert first == again


def test_exponential_forgetting_follows_a_change():
    old = synthetic(biased(1.0), start=NOW - 3600, end=NOW - 1800, seed=1)
    new = synthetic(biased(2.0), start=NOW - 300, end=NOW, windows=30, seed=2)
    short = estimate(old + new, PROFILE, "resnet50", NOW, RecalibrationOptions(half_life_s=120))
    long = estimate(old + new, PROFILE, "resnet50", NOW, RecalibrationOptions(half_life_s=3600, regime_change=0))
    assert short.correction.factor == pytest.approx(2.0, rel=0.05)
    assert 1.1 < long.correction.factor < 1.9  # a long memory still averages both regimes


def test_a_regime_change_is_followed_at_the_short_half_life():
    """A model 2x slower for its last 40 windows: the long half-life (300 s) alone creeps, the recent windows win."""
    old = synthetic(biased(1.0), start=NOW - 1200, end=NOW - 150, windows=200, seed=3)
    new = synthetic(biased(2.0), start=NOW - 150, end=NOW, windows=40, seed=4)
    creeping = estimate(old + new, PROFILE, "resnet50", NOW, RecalibrationOptions(regime_change=0))
    result = estimate(old + new, PROFILE, "resnet50", NOW)
    assert creeping.correction.factor < 1.5
    assert result.correction.recent and result.correction.factor == pytest.approx(2.0, rel=0.05)
    # steady, noisy evidence is no change: the long memory stands
    steady = synthetic(biased(1.0), noise=0.08, windows=300, start=NOW - 900, seed=5)
    assert not estimate(steady, PROFILE, "resnet50", NOW).correction.recent


def test_minimum_evidence_gives_no_correction():
    points = synthetic(biased(2.0), windows=3)
    result = estimate(points, PROFILE, "resnet50", NOW)
    assert result.correction is None and "too little evidence" in result.reason
    # old points count for less: the same 60 windows, but 20 half-lives ago, are below the evidence bar
    stale = synthetic(biased(2.0), start=NOW - 7000, end=NOW - 6000)
    assert estimate(stale, PROFILE, "resnet50", NOW, RecalibrationOptions(half_life_s=300)).correction is None


def test_outliers_do_not_move_the_estimate():
    points = synthetic(biased(1.3))
    broken = [
        CalibrationPoint("resnet50", 4, 30.0, (), 5000.0, 1000, NOW - 1, window=9999),  # a stalled window
        CalibrationPoint("resnet50", 4, 30.0, (), 0.001, 1000, NOW - 1, window=9998),
    ]
    result = estimate(points + broken, PROFILE, "resnet50", NOW)
    assert result.correction.factor == pytest.approx(1.3, rel=0.05)


def test_out_of_bounds_factor_is_refused_with_the_reason():
    result = estimate(synthetic(biased(30.0)), PROFILE, "resnet50", NOW)
    assert result.correction is None and "outside" in result.reason


def test_other_models_points_are_ignored_and_corrected_profile_predicts_the_truth():
    truth = biased(1.8)
    points = synthetic(truth) + synthetic(biased(0.5, model="vgg19"), model="vgg19")
    c = estimate(points, PROFILE, "resnet50", NOW).correction
    corrected = apply_corrections(PROFILE, {"resnet50": c})
    config = [("resnet50", 8, 40.0), ("alexnet", 4, 20.0)]
    assert predict_gpu(corrected, config)[0].latency_ms == pytest.approx(
        predict_gpu(truth, config)[0].latency_ms, rel=0.05
    )
