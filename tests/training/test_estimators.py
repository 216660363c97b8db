"""Fitting the training models from profiling data."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.exceptions import NotFittedError

from training import readers
from training.estimators import (
    LossCurveEstimator,
    SpotLossEstimator,
    fit_batch_memory,
    fit_contention,
    speed_from_iterations,
)
from training.models import LossCurve, SpotJob, SpotLoss, TrainingError, per_gpu_batch


def test_loss_curve_recovers_coefficients():
    truth = LossCurve(beta0=3e-7, beta1=0.3, beta2=0.6)
    s = np.linspace(0, 5e6, 40)
    est = LossCurveEstimator().fit(s, truth.loss(s))
    assert est.curve_.beta0 == pytest.approx(3e-7, rel=1e-3)
    assert est.curve_.beta1 == pytest.approx(0.3, rel=1e-3)
    assert est.curve_.beta2 == pytest.approx(0.6, rel=1e-3)
    assert est.samples_for(0.9) == pytest.approx(truth.samples_for(0.9), rel=1e-3)
    assert est.rmse_ < 1e-6


def test_loss_curve_fit_is_deterministic_and_robust_to_noise():
    data = readers.read_curve_csv(None)
    a = LossCurveEstimator().fit(data["samples"], data["loss"])
    b = LossCurveEstimator().fit(data["samples"], data["loss"])
    assert a.curve_ == b.curve_
    # the bundled CSV was drawn from beta = (2e-7, 0.25, 0.5) with 1% noise
    assert a.samples_for(0.9) == pytest.approx(1.125e7, rel=0.1)


def test_loss_curve_refuses_before_fit_and_bad_input():
    with pytest.raises(NotFittedError):
        LossCurveEstimator().predict([1.0])
    with pytest.raises(TrainingError):
        LossCurveEstimator().fit([0, 1, 2], [3, 2, 1])  # too few points
    with pytest.raises(TrainingError):
        LossCurveEstimator().fit([0, 1, 2, 3], [3, 2, -1, 1])  # negative loss


@pytest.mark.parametrize("r_weight", [0.0, 1.0])
def test_spot_loss_recovers_coefficients(r_weight):
    truth = SpotLoss(g1=876.5, g2=-0.2, g3=2507.6, g4=1.0 if r_weight == 0 else 0.4, g5=0.5, r_weight=r_weight)
    rng = np.random.default_rng(3)
    rows = []
    for n in (1, 2, 4, 8):
        for b in (512.0, 1024.0, 2048.0):
            r = rng.uniform(0.0, 0.9)
            for j in np.linspace(100, 20000, 8):
                rows.append((b, r, n, j))
    X = np.array(rows)
    y = truth.loss(X[:, 0], X[:, 1], X[:, 2], X[:, 3])
    est = SpotLossEstimator(r_weight=r_weight).fit(X, y)
    assert est.rmse_ < 1e-3
    assert est.loss_.g5 == pytest.approx(0.5, abs=0.01)
    pred_j = est.loss_.iterations(1024, 0.5, 4, 0.9)
    assert pred_j == pytest.approx(truth.iterations(1024, 0.5, 4, 0.9), rel=0.01)


def test_contention_fit_inverts_eq8():
    job = SpotJob(
        model_mb=11.5,
        ps_bw_mb_s=1200,
        required_bw_mb_s=142,
        pcie_bw_mb_s=1e4,
        a1=0.8,
        b1=-1.92,
        loss=SpotLoss(1, 0, 1, 1, 0),
        target_loss=1.0,
    )
    n = np.array([4, 9, 10, 11, 12])
    a1, b1 = fit_contention(n, job.worker_bandwidth(n), 1200, 142)
    assert (a1, b1) == pytest.approx((0.8, -1.92), abs=1e-6)
    with pytest.raises(TrainingError):
        fit_contention([2, 4], [142, 142], 1200, 142)  # never contended


def test_batch_memory_and_speed():
    a2, b2 = fit_batch_memory([8, 12, 16], [600, 900, 1200])
    assert per_gpu_batch([16, 12, 8], a2, b2).tolist() == [1024, 512, 512]
    assert speed_from_iterations(1024, [2.0, 0.5, 0.52, 0.5, 0.51]) == pytest.approx(1024 / 0.51)
