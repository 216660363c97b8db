import numpy as np
import pytest

from interference.latency import VectorPredictor, clock_mhz, predict_gpu
from interference.profile_io import bundled_profile

PROFILE = bundled_profile()
MODELS = sorted(PROFILE.models)


def random_configs(rng, count):
    configs = []
    for _ in range(count):
        k = int(rng.integers(1, 5))
        shares = rng.dirichlet(np.ones(k)) * rng.uniform(20, 100)
        configs.append(
            [
                (MODELS[int(rng.integers(len(MODELS)))], int(rng.integers(1, 33)), float(max(2.5, round(s, 1))))
                for s in shares
            ]
        )
    return configs


def test_vectorised_path_equals_scalar_path():
    rng = np.random.default_rng(3)
    configs = [c for c in random_configs(rng, 200) if sum(s for *_, s in c) <= 100]
    predictor = VectorPredictor(PROFILE)
    latency, throughput = predictor.predict(*predictor.encode(configs))
    for row, config in enumerate(configs):
        for col, prediction in enumerate(predict_gpu(PROFILE, config)):
            assert latency[row, col] == pytest.approx(prediction.latency_ms, rel=1e-9)
            assert throughput[row, col] == pytest.approx(prediction.throughput_rps, rel=1e-9)
        assert np.isnan(latency[row, len(config) :]).all()


def test_a_neighbour_slows_a_workload_down():
    alone = predict_gpu(PROFILE, [("resnet50", 8, 40)])[0]
    shared = predict_gpu(PROFILE, [("resnet50", 8, 40), ("vgg19", 16, 60)])[0]
    assert shared.latency_ms > alone.latency_ms
    assert shared.throughput_rps < alone.throughput_rps


def test_power_cap_lowers_the_clock():
    gpu = PROFILE.gpu
    assert clock_mhz(gpu, gpu.power_cap_w - 1) == gpu.max_freq_mhz
    assert clock_mhz(gpu, gpu.power_cap_w + 50) < gpu.max_freq_mhz
    heavy = predict_gpu(PROFILE, [("vgg19", 32, 50), ("ssd", 32, 50)])
    assert heavy[0].clock_mhz < gpu.max_freq_mhz


def test_more_share_is_faster_and_shares_over_100_are_refused():
    slow = predict_gpu(PROFILE, [("vgg19", 8, 20)])[0]
    fast = predict_gpu(PROFILE, [("vgg19", 8, 80)])[0]
    assert fast.latency_ms < slow.latency_ms
    with pytest.raises(ValueError, match="100%"):
        predict_gpu(PROFILE, [("vgg19", 8, 60), ("ssd", 8, 50)])
