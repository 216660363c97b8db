import pytest

from interference.latency import predict_gpu
from interference.profile_io import bundled_profile
from planner.simulate import simulate
from planner.solver import GpuPlan, GpuType, Placement, Plan, Problem, Workload, solve

PROFILE = bundled_profile()
PROFILES = {"V100": PROFILE}


def one_workload_plan(rate, batch, share=50.0, queue_delay_ms=None, slo=100.0):
    p = predict_gpu(PROFILE, [("resnet50", batch, share)])[0]
    delay = 1000.0 * (batch - 1) / rate if queue_delay_ms is None else queue_delay_ms
    placement = Placement("w", "resnet50", slo, rate, share, batch, delay, p.latency_ms, p.throughput_rps)
    return Plan("test", (GpuPlan("V100", 1.0, (placement,)),)), p


def test_same_seed_same_report_and_other_seed_differs():
    plan = solve(
        Problem((Workload("a", "vgg19", 60, 200), Workload("b", "alexnet", 15, 500)), (GpuType("V100", 3.06, PROFILE),))
    )
    first = simulate(plan, PROFILES, seconds=5, seed=4)
    assert first == simulate(plan, PROFILES, seconds=5, seed=4)
    assert first != simulate(plan, PROFILES, seconds=5, seed=5)


def test_light_constant_load_sees_exactly_the_service_time():
    plan, prediction = one_workload_plan(rate=20.0, batch=1)
    report = simulate(plan, PROFILES, seconds=5, arrivals="constant").workloads[0]
    assert report.p50_ms == pytest.approx(prediction.latency_ms)
    assert report.p99_ms == pytest.approx(prediction.latency_ms)
    assert report.throughput_rps == pytest.approx(20.0, rel=0.02)


def test_batches_wait_at_most_the_queue_delay():
    plan, _ = one_workload_plan(rate=50.0, batch=8, queue_delay_ms=5.0)
    report = simulate(plan, PROFILES, seconds=5, seed=1).workloads[0]
    single = predict_gpu(PROFILE, [("resnet50", 8, 50.0)])[0].latency_ms
    assert report.p99_ms <= 5.0 + single + 1e-6


def test_overload_caps_throughput_and_breaks_the_slo():
    plan, prediction = one_workload_plan(rate=10_000.0, batch=4, slo=50.0)
    report = simulate(plan, PROFILES, seconds=3, seed=1).workloads[0]
    assert report.throughput_rps < 0.5 * 10_000
    assert report.throughput_rps == pytest.approx(prediction.throughput_rps, rel=0.1)
    assert report.over_slo > 0.5 and not report.meets_slo


def test_noise_widens_the_tail():
    plan, _ = one_workload_plan(rate=200.0, batch=4)
    calm = simulate(plan, PROFILES, seconds=5, seed=2).workloads[0]
    noisy = simulate(plan, PROFILES, seconds=5, seed=2, noise=0.3).workloads[0]
    assert noisy.p99_ms > calm.p99_ms


def test_each_workload_is_replayed_with_its_own_arrival_kind():
    from dataclasses import replace as _replace

    plan, prediction = one_workload_plan(rate=20.0, batch=1)
    paced = _replace(
        plan,
        gpus=tuple(
            _replace(g, placements=tuple(_replace(p, arrivals="constant") for p in g.placements)) for g in plan.gpus
        ),
    )
    own = simulate(paced, PROFILES, seconds=5).workloads[0]
    assert own.p99_ms == pytest.approx(prediction.latency_ms)  # paced: never queues
    forced = simulate(paced, PROFILES, seconds=5, arrivals="poisson").workloads[0]
    assert forced.p99_ms > prediction.latency_ms  # Poisson bursts queue


def test_slow_replicas_run_until_their_p99_is_measured():
    plan, _ = one_workload_plan(rate=20.0, batch=1)
    short = simulate(plan, PROFILES, seconds=5, seed=1).workloads[0]
    long = simulate(plan, PROFILES, seconds=5, seed=1, min_requests=5000).workloads[0]
    assert short.requests < 150 and long.requests >= 5000
    assert long.throughput_rps == pytest.approx(20.0, rel=0.05)
