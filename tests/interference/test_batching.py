"""The batching model (interference.batching) against exact results and the discrete-event server."""

import math

import numpy as np
import pytest

from interference.batching import (
    LatencyDistribution,
    ServiceCurve,
    fill_time_ms,
    latency_distribution,
    paced_delay_ms,
    serve,
    table,
)
from interference.batching_table import _summarise, linear_occupancy, md1_quantiles, simulate_rows
from interference.latency import batch_curve
from interference.profile_io import bundled_profile

PROFILE = bundled_profile()


def linear(a: float, c: float, batch: int, copy: float = 0.0) -> ServiceCurve:
    k = np.arange(1, batch + 1)
    occupancy = tuple(float(v) for v in a + c * k)
    return ServiceCurve(tuple(o + copy * j for o, j in zip(occupancy, k)), occupancy)


def des_p99(curve: ServiceCurve, rate: float, delay: float, arrivals: str, requests: int, seed: int) -> float:
    rng = np.random.default_rng(seed)
    if arrivals == "poisson":
        times = np.cumsum(rng.exponential(1000.0 / rate, size=requests))
    else:
        times = np.arange(requests) * 1000.0 / rate
    latencies, _ = serve(
        times,
        curve.max_batch,
        delay,
        np.concatenate([[0.0], curve.latency_ms]),
        np.concatenate([[0.0], curve.occupancy_ms]),
    )
    return float(np.percentile(latencies[requests // 20 :], 99))


@pytest.mark.parametrize("utilisation", [0.2, 0.6, 0.9])
def test_batch_one_is_m_d_1_and_matches_erlangs_formula(utilisation):
    exact = md1_quantiles(utilisation)
    curve = linear(0.0, 4.0, 1)  # O = L = 4 ms
    rate = 1000.0 * utilisation / 4.0
    model = latency_distribution(rate, 1, 0.0, "poisson", curve)
    assert model.utilisation == pytest.approx(utilisation)
    # The tail is smooth in u; below the idle probability's kink the interpolation is looser.
    for p, value in zip(model.probabilities, model.quantiles_ms):
        if p >= 0.5:
            assert value == pytest.approx(4.0 * exact[list(table().probs).index(p)], rel=0.01)


# A seeded sample of the grid (load lambda*L(1) in [0.02, 0.95], B in 1..32, delay 0 or the
# fill time, both arrival kinds), drawn once; the benchmark covers the whole grid.
def _sample(count=8, seed=11):
    rng = np.random.default_rng(seed)
    shapes = ["linear", "resnet50", "alexnet"]
    out = []
    for _ in range(count):
        out.append(
            (
                str(rng.choice(["poisson", "constant"])),
                str(rng.choice(shapes)),
                int(rng.choice([1, 2, 3, 4, 6, 8, 12, 16, 24, 32])),
                str(rng.choice(["zero", "fill"])),
                float(rng.uniform(0.02, 0.8)),
            )
        )
    return out


def _curve(shape: str, batch: int) -> ServiceCurve:
    if shape == "linear":
        return linear(2.0, 1.0, batch)
    model, share = ("resnet50", 50.0) if shape == "resnet50" else ("alexnet", 10.0)
    return ServiceCurve(*batch_curve(PROFILE, model, share, batch))


@pytest.mark.slow
@pytest.mark.parametrize("arrivals,shape,batch,delay,load", _sample())
def test_p99_is_within_5_percent_of_the_discrete_event_server(arrivals, shape, batch, delay, load):
    curve = _curve(shape, batch)
    rate = 1000.0 * load / curve.latency_ms[0]
    delay_ms = 0.0 if delay == "zero" else fill_time_ms(batch, rate)
    model = latency_distribution(rate, batch, delay_ms, arrivals, curve)
    requests = 300_000 if arrivals == "poisson" else 20_000
    simulated = des_p99(curve, rate, delay_ms, arrivals, requests, seed=batch)
    assert model.p99_ms == pytest.approx(simulated, rel=0.05)


def test_paced_arrivals_are_exact_whole_batches_at_the_fill_time():
    curve = linear(3.0, 0.5, 8, copy=0.1)
    rate = 800.0  # 1.25 ms apart; O(8) = 7 ms < 8 intervals
    model = latency_distribution(rate, 8, paced_delay_ms(8, rate), "constant", curve)
    assert model.p99_ms == pytest.approx(curve.latency_ms[-1] + 7 * 1.25)
    assert model.quantile(0.05) == pytest.approx(curve.latency_ms[-1])
    assert des_p99(curve, rate, paced_delay_ms(8, rate), "constant", 8000, 0) == pytest.approx(model.p99_ms)


def test_overload_is_unstable_and_everything_is_late():
    curve = linear(1.0, 1.0, 4)  # O(4) = 5 ms for 4 requests: 800 req/s at most
    for arrivals in ("poisson", "constant"):
        model = latency_distribution(1000.0, 4, 0.0, arrivals, curve)
        assert not model.stable and model.p99_ms == math.inf and model.fraction_over(1e9) == 1.0


def test_fraction_over_the_slo_inverts_the_quantiles():
    model = latency_distribution(300.0, 4, 0.0, "poisson", _curve("resnet50", 4))
    assert model.fraction_over(model.p99_ms) == pytest.approx(0.01, abs=1e-6)
    assert model.fraction_over(model.p50_ms) == pytest.approx(0.5, abs=1e-6)
    beyond = model.fraction_over(model.quantiles_ms[-1] * 1.5)
    assert 0.0 < beyond < 0.001
    assert model.fraction_over(0.0) == 1.0


def test_more_load_never_lowers_the_p99_with_greedy_batching():
    curve = _curve("resnet50", 8)
    p99s = [latency_distribution(rate, 8, 0.0, "poisson", curve).p99_ms for rate in np.linspace(20, 900, 30)]
    assert all(b >= a * 0.995 for a, b in zip(p99s, p99s[1:]))


def test_delays_outside_the_model_are_refused_with_the_covered_values():
    curve = linear(2.0, 1.0, 4)
    with pytest.raises(ValueError, match="max queue delay of 0 or the fill time 6.000 ms"):
        latency_distribution(500.0, 4, 2.0, "poisson", curve)
    with pytest.raises(ValueError, match="arrivals must be one of"):
        latency_distribution(500.0, 4, 0.0, "bursty", curve)
    with pytest.raises(ValueError, match="positive"):
        ServiceCurve((1.0, float("nan")), (1.0, 1.0))


@pytest.mark.slow
def test_the_table_builder_reproduces_a_table_entry():
    """The shipped table is what the builder makes: re-simulate two grid points and compare."""
    t = table()
    us = np.array([0.3, 0.7])
    occupancy = linear_occupancy(np.array([8, 8]), us, np.array([0.5, 0.5]))  # s = 0.5
    hist, sizes = simulate_rows(np.array([8, 8]), occupancy, np.zeros(2), np.array([200_000, 200_000]), seed=3)
    fresh = _summarise(hist, sizes).quantiles[:, t.p99_index]
    stored = [t.quantiles("zero", 8, u, 0.5)[0][t.p99_index] for u in us]
    assert fresh == pytest.approx(stored, rel=0.03)


def test_distribution_reads_its_quantiles_in_order():
    d = LatencyDistribution((0.5, 0.99), (2.0, 5.0), 0.5)
    assert d.p50_ms == 2.0 and d.p99_ms == 5.0 and d.quantile(0.745) == pytest.approx(3.5)
