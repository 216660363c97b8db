"""Provisioners against exhaustive search on small random instances (property tests).

The brute force below re-derives every prediction with scalar code straight
from the reference equations, so it checks the vectorised models, the
bounds (no optimum is pruned) and the search together.
"""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from training.homogeneous import provision_homogeneous
from training.models import LossCurve, SpotJob, SpotLoss, TrainingError
from training.spec import PsOption, TrainingSpec, WorkerOption
from training.spot import SpotState, provision_spot

SETTINGS = settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def worker_types(draw, max_types=3, max_quota=3):
    k = draw(st.integers(1, max_types))
    out = []
    for i in range(k):
        gpus = draw(st.sampled_from([1, 2, 4]))
        batch = draw(st.sampled_from([256, 512, 1024])) * gpus
        t_meas = draw(st.floats(0.3, 2.0))
        out.append(
            WorkerOption(
                type=f"t{i}.xlarge",
                quota=draw(st.integers(0, max_quota)),
                speed=batch / t_meas,
                batch=batch,
                gpus=gpus,
                network_mb_s=draw(st.sampled_from([300.0, 1250.0])),
                price_per_hour=draw(st.floats(0.1, 3.0)),
                on_demand_per_hour=3.0,
                vcpus=draw(st.sampled_from([4, 16])),
            )
        )
    return tuple(out)


# --------------------------------------------------------------------------- spot (heterogeneous)


def brute_spot(spec: TrainingSpec, existing=None, revoked=None, overhead=0.0, remaining=1.0):
    job = spec.spot
    existing, revoked = existing or {}, revoked or {}
    best = None
    ranges = [
        range(existing.get(w.type, 0), max(w.quota - revoked.get(w.type, 0), existing.get(w.type, 0)) + 1)
        for w in spec.workers
    ]
    n_upper = math.floor(((1 - job.b1) / job.a1) ** 2 - 1e-9)
    for counts in itertools.product(*ranges):
        n = sum(counts)
        if n == 0 or n > n_upper:
            continue
        fair = job.ps_bw_mb_s / n
        p = min(max(job.a1 * math.sqrt(n) + job.b1, 0.0), 1.0)
        b_wk = p * fair + (1 - p) * job.required_bw_mb_s if job.required_bw_mb_s > fair else job.required_bw_mb_s
        times, batches, prices = [], [], 0.0
        for w, c in zip(spec.workers, counts):
            comp = w.batch / w.speed - 2 * job.model_mb / job.required_bw_mb_s
            t = comp + 2 * job.model_mb / b_wk + 2 * w.gpus * job.model_mb / job.pcie_bw_mb_s
            times += [t] * c
            batches += [w.batch] * c
            prices += c * w.price_per_hour
        rate = sum(1 / t for t in times)
        b_w = sum(b / t for b, t in zip(batches, times)) / rate
        speeds = [b / t for b, t in zip(batches, times)]
        shares = sorted((v / sum(speeds) for v in speeds), reverse=True)
        r = math.sqrt((shares[0] - 1) ** 2 + sum(s * s for s in shares[1:]))
        lo = job.loss
        j = (lo.g2 * b_w + lo.g3) * math.sqrt((lo.r_weight * r + lo.g4) * n) / (job.target_loss - lo.g5) - lo.g1
        if j <= 0:
            continue
        time = math.ceil(j * remaining - 1e-9) / rate + overhead
        cost = time * prices / 3600
        if time <= spec.deadline_s + 1e-9 and (best is None or cost < best[0] - 1e-9):
            best = (cost, counts, time)
    return best


def spot_spec(workers, deadline, r_weight, target):
    job = SpotJob(
        model_mb=11.5,
        ps_bw_mb_s=1200,
        required_bw_mb_s=142,
        pcie_bw_mb_s=10000,
        a1=0.8,
        b1=-1.92,
        loss=SpotLoss(876.5, -0.2, 2507.6, 1.0 if r_weight == 0 else 0.5, 0.5, r_weight=r_weight),
        target_loss=target,
    )
    ps = PsOption(type="m5.xlarge", max_count=1, network_mb_s=1200, vcpus=4, price_per_hour=0.192)
    return TrainingSpec(
        name="prop", target_loss=target, deadline_s=deadline, model_mb=11.5, workers=workers, ps=ps, spot=job
    )


@SETTINGS
@given(
    workers=worker_types(),
    deadline=st.floats(500, 40000),
    r_weight=st.sampled_from([0.0, 1.0]),
    target=st.sampled_from([0.8, 0.9, 1.2]),
)
def test_spot_exact_matches_brute_force(workers, deadline, r_weight, target):
    spec = spot_spec(workers, deadline, r_weight, target)
    plan = provision_spot(spec, search="exact")
    brute = brute_spot(spec)
    if brute is None:
        assert not plan.feasible and plan.reason
        return
    assert plan.feasible
    assert plan.predicted_cost == pytest.approx(brute[0], rel=1e-9)
    assert plan.predicted_time_s <= deadline + 1e-6


@SETTINGS
@given(workers=worker_types(max_quota=3), deadline=st.floats(500, 40000), data=st.data())
def test_spot_replan_keeps_survivors_and_matches_brute_force(workers, deadline, data):
    spec = spot_spec(workers, deadline, 1.0, 0.9)
    existing = {w.type: data.draw(st.integers(0, w.quota)) for w in workers}
    revoked = {w.type: data.draw(st.integers(0, w.quota - existing[w.type])) for w in workers}
    remaining = data.draw(st.floats(0.2, 1.0))
    state = SpotState(existing=existing, revoked=revoked, remaining=remaining, replan=True)
    plan = provision_spot(spec, state, search="exact")
    brute = brute_spot(spec, existing, revoked, spec.recovery_overhead_s, remaining)
    if brute is None:
        assert not plan.feasible
        return
    assert plan.feasible
    assert plan.predicted_cost == pytest.approx(brute[0], rel=1e-9)
    for w in workers:
        assert plan.count(w.type) >= existing[w.type]  # survivors kept
        assert plan.count(w.type) <= max(w.quota - revoked[w.type], existing[w.type])


@SETTINGS
@given(workers=worker_types(max_types=4, max_quota=4), deadline=st.floats(500, 40000))
def test_spot_window_never_beats_exact_nor_misses_deadline(workers, deadline):
    spec = spot_spec(workers, deadline, 0.0, 0.9)
    window = provision_spot(spec, search="window")
    exact = provision_spot(spec, search="exact")
    if window.feasible:
        assert window.predicted_time_s <= deadline + 1e-6
        assert exact.feasible
        assert window.predicted_cost >= exact.predicted_cost - 1e-9
    if not exact.feasible:
        assert not window.feasible


# --------------------------------------------------------------------------- homogeneous


def brute_homogeneous(spec: TrainingSpec):
    curve = spec.curve
    best = None
    for w in spec.workers:
        ps_bw = spec.ps.network_mb_s
        bw = min(w.network_mb_s, spec.worker_bandwidth_cap_mb_s or math.inf)
        t_comp = w.batch / w.speed - 2 * spec.model_mb / min(bw, ps_bw)
        if t_comp <= 0:
            continue
        for n in range(1, w.quota + 1):
            for m in range(1, spec.ps.max_count + 1):
                gb = n * w.batch
                samples = curve.samples_for(spec.target_loss) * (
                    1 + spec.batch_penalty * max(0.0, gb / (spec.reference_batch or w.batch) - 1)
                )
                k = math.ceil(samples / gb)
                t_cpu = n * spec.model_mb * spec.update_cpu_s_per_mb / (m * spec.ps.vcpus)
                if spec.sync == "bsp":
                    t_iter = max(t_comp + 2 * spec.model_mb / min(bw, m * ps_bw / n), t_cpu)
                else:
                    t_iter = max(t_comp + 2 * spec.model_mb / bw, 2 * n * spec.model_mb / (m * ps_bw), t_cpu)
                time = k * t_iter
                cost = (n * w.price_per_hour + m * spec.ps.price_per_hour) * time / 3600
                if time <= spec.deadline_s + 1e-9 and (best is None or cost < best[0] - 1e-9):
                    best = (cost, w.type, n, m)
    return best


@SETTINGS
@given(
    workers=worker_types(max_types=3, max_quota=6),
    deadline=st.floats(100, 20000),
    sync=st.sampled_from(["bsp", "asp"]),
    ps_count=st.integers(1, 3),
    cpu=st.sampled_from([0.0, 0.002, 0.02]),
    penalty=st.sampled_from([0.0, 0.3, 2.0]),
    ps_bw=st.sampled_from([150.0, 1250.0]),
)
def test_homogeneous_matches_brute_force(workers, deadline, sync, ps_count, cpu, penalty, ps_bw):
    ps = PsOption(type="c5.4xlarge", max_count=ps_count, network_mb_s=ps_bw, vcpus=16, price_per_hour=0.68)
    spec = TrainingSpec(
        name="prop",
        target_loss=0.9,
        deadline_s=deadline,
        model_mb=20.0,
        workers=tuple(w for w in workers),
        ps=ps,
        sync=sync,
        curve=LossCurve(2e-6, 0.25, 0.5),
        update_cpu_s_per_mb=cpu,
        batch_penalty=penalty,
        reference_batch=512,
    )
    try:
        plan = provision_homogeneous(spec)
    except TrainingError as err:  # only a spec with no usable worker may be refused
        assert all(w.quota < 1 for w in workers) or "too high" in str(err)
        return
    brute = brute_homogeneous(spec)
    if brute is None:
        assert not plan.feasible and plan.reason
        return
    assert plan.feasible
    assert plan.predicted_cost == pytest.approx(brute[0], rel=1e-9)
    assert plan.predicted_time_s <= deadline + 1e-6


@SETTINGS
@given(
    bounds=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 6)), min_size=1, max_size=4),
    max_total=st.integers(0, 9),
    min_total=st.integers(0, 4),
)
def test_candidate_table_matches_itertools(bounds, max_total, min_total):
    import numpy as np

    from training.spot import count_vectors, enumerate_vectors

    lower = np.array([lo for lo, _ in bounds])
    upper = np.array([lo + extra for lo, extra in bounds])
    expected = sorted(
        c
        for c in itertools.product(*[range(lo, hi + 1) for lo, hi in zip(lower, upper)])
        if min_total <= sum(c) <= max_total
    )
    rows = enumerate_vectors(lower, upper, min_total, max_total)
    assert sorted(map(tuple, rows.tolist())) == expected
    assert enumerate_vectors(lower, upper, min_total, max_total, by_type=True).shape == (len(bounds), len(expected))
    assert count_vectors(lower, upper, max_total) == sum(
        1 for c in itertools.product(*[range(lo, hi + 1) for lo, hi in zip(lower, upper)]) if sum(c) <= max_total
    )


def test_auto_search_falls_back_to_window_on_large_tables():
    from training import readers
    from training.spec import spec_from_dict

    spec = spec_from_dict(readers.read_spec(None)[0], readers.offline_catalog(), "fixture")
    assert provision_spot(spec).search == "exact"
    plan = provision_spot(spec, exact_limit=10)
    assert plan.search == "window" and [c for _, c in plan.counts] == [2, 0, 2, 0, 0]
