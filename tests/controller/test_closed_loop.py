"""The closed loop on the real service (tmp SQLite, real solver, fake clock): observations as data,
recalibration with hysteresis, demand tracking, the SLO guard, profile versions and rollback.

The node is simulated by heartbeats whose windows are computed from a "true" profile: the
accel_sim profile times a factor (the injected bias), with noise where a test wants it.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
from loop_helpers import CONFIG, CPU, PROFILE, Clock, truth, window

from controller.config import ObservationsConfig
from controller.messages import BatchStat, HeartbeatReport, InvalidArgument, NodeDevice, NotFound, Observation
from controller.service import ControlService
from controller.store import Store
from interference.profile_io import profile_to_dict


def service(tmp_path, config=CONFIG):
    clock = Clock()
    svc = ControlService(Store(tmp_path / "stoke.db"), config, clock=clock, tick=clock)
    svc.upload_profile(json.dumps(profile_to_dict(PROFILE)), "CPU")
    svc.register("n1", CPU)
    return svc, clock


class Node:
    """Heartbeats of node n1 serving what the controller assigns it, with windows from a true profile."""

    def __init__(self, svc, clock):
        self.svc, self.clock, self.seq = svc, clock, 0

    def beat(self, factor=1.0, rate=None, p99=None, over=None, seconds=1.0, requests=None, p50=None, **pool):
        self.clock.t += seconds
        answer = self.svc.heartbeat(HeartbeatReport("n1"))
        running = answer.assignments
        self.seq += 1
        observed = [
            window(
                a,
                self.seq,
                factor,
                rate,
                seconds,
                requests,
                latency_p99_ms=p99,
                latency_p50_ms=p50,
                over_slo_ratio=over,
                **pool,
            )
            for a in running
        ]
        self.svc.heartbeat(HeartbeatReport("n1", running=running, observed=tuple(observed)))
        self.svc.reconcile()
        return running


def guard_off(tmp_path, rate_rps=30):
    """Workload w (accel_sim, an 80 ms SLO) planned on n1 with the SLO guard off, so only the loop under test
    moves it: (service, node n1)."""
    svc, clock = service(tmp_path, replace(CONFIG, guard=replace(CONFIG.guard, enabled=False)))
    svc.apply_workloads([{"name": "w", "model": "accel_sim", "slo_ms": 80, "rate_rps": rate_rps}])
    svc.reconcile()
    return svc, Node(svc, clock)


def placed(svc, name="w"):
    plan = svc.current_plan().plan
    return next(p for g in plan.gpus for p in g.placements if p.name == name)


def test_windows_are_stored_once_keyed_and_beside_the_prediction(tmp_path):
    svc, clock = service(tmp_path)
    svc.apply_workloads([{"name": "w", "model": "accel_sim", "slo_ms": 80, "rate_rps": 30}])
    svc.reconcile()
    node = Node(svc, clock)
    node.beat()
    node.beat(factor=1.5)
    rows = svc.list_observations("w")
    assert len(rows) == 2 and rows[0].unix > rows[1].unix  # newest first
    row = rows[0]
    assert (row.node_id, row.device, row.gpu_type, row.workload, row.replica) == ("n1", 0, "CPU", "w", 0)
    assert (row.share_pct, row.batch) == (placed(svc).share_pct, placed(svc).batch)
    assert row.error_ratio == pytest.approx(1.5, rel=1e-6) and rows[1].error_ratio == pytest.approx(1.0, rel=1e-6)
    assert row.predicted_p99_ms == pytest.approx(placed(svc).predicted_p99_ms)
    # the same window heartbeated twice is stored once
    report = HeartbeatReport("n1", running=svc.heartbeat(HeartbeatReport("n1")).assignments)
    window = Observation("w#0", "accel_sim", seq=node.seq, window_s=1.0, requests=5)
    svc.heartbeat(replace(report, observed=(window,)))
    assert len(svc.list_observations("w")) == 2


def test_retention_bounds_rows_and_age(tmp_path):
    config = replace(CONFIG, observations=ObservationsConfig(retention_s=5.0, max_rows=4))
    svc, clock = service(tmp_path, config)
    svc.apply_workloads([{"name": "w", "model": "accel_sim", "slo_ms": 80, "rate_rps": 30}])
    svc.reconcile()
    node = Node(svc, clock)
    for _ in range(6):
        node.beat(seconds=0.5)
    assert svc.store.observation_count() == 4  # at most max_rows
    node.beat(seconds=10.0)
    assert svc.store.observation_count() == 1  # older than retention_s


@pytest.mark.slow
def test_oscillating_noise_causes_no_replans(tmp_path):
    """Windows that oscillate +-8% around the truth for 10 simulated minutes: no new version, no re-plan."""
    svc, clock = service(tmp_path)
    svc.apply_workloads([{"name": "w", "model": "accel_sim", "slo_ms": 80, "rate_rps": 30}])
    svc.reconcile()
    revision = svc.current_plan().revision
    node = Node(svc, clock)
    for i in range(600):
        node.beat(factor=1.0 + (0.08 if i % 2 else -0.08) * (1 + math.sin(i / 7)) / 2)
    assert svc.current_plan().revision == revision
    assert svc.list_profiles()[0].active_version == 0 and svc.store.profile_versions() == []
    assert svc.feedback.counters["recalibrations"] == 0


def test_a_real_bias_is_recalibrated_versioned_and_replanned_to_a_larger_share(tmp_path):
    svc, clock = service(tmp_path)
    svc.apply_workloads([{"name": "w", "model": "accel_sim", "slo_ms": 80, "rate_rps": 30}])
    svc.reconcile()
    assert placed(svc).share_pct == 50.0
    node = Node(svc, clock)
    for _ in range(10):
        node.beat(factor=1.0)
    for _ in range(120):
        node.beat(factor=2.0)
    row = svc.list_profiles()[0]
    # published while the p99 moved; closer than the threshold, the rest is not worth a re-plan
    assert row.active_version >= 1 and row.correction == pytest.approx(2.0, rel=0.1)
    assert placed(svc).share_pct == 100.0
    events = [e.text for e in svc.store.events(kind="recalibration")]
    assert events and "accel_sim on CPU: profile v1" in events[0]
    # the error ratio against the active (recalibrated) profile is back near 1
    assert svc.status().workloads[0].feedback.error_ratio == pytest.approx(1.0, rel=0.1)


def test_the_serving_path_is_learnt_from_the_sli_never_below_it_and_versions_are_spaced(tmp_path):
    import random

    recal = replace(CONFIG.recalibration, min_interval_s=60.0)
    config = replace(CONFIG, recalibration=recal, guard=replace(CONFIG.guard, enabled=False))
    svc, clock = service(tmp_path, config)
    svc.apply_workloads([{"name": "w", "model": "accel_sim", "slo_ms": 80, "rate_rps": 30}])
    svc.reconcile()
    node = Node(svc, clock)
    rng = random.Random(7)
    published_at = None
    for i in range(90):
        p = placed(svc)
        truth = p.predicted_p99_ms - p.serving_p99_ms + 12.0  # the batching p99 plus a 12 ms serving path
        if published_at is not None:  # never below what clients see (the windows' p99s are noisy by +-1 ms)
            assert p.predicted_p99_ms >= truth - 1.0, (i, p.predicted_p99_ms, truth)
        node.beat(p99=truth + rng.uniform(-1.0, 1.0), p50=truth - 3.0, over=0.0)
        if published_at is None and svc.store.profile_versions("accel_sim"):
            published_at = i
    versions = svc.store.profile_versions("accel_sim")
    assert published_at is not None and published_at <= 15
    assert len(versions) == 1  # steady load: one version, no flip-flop
    v = versions[0]
    assert 11.0 <= v.meta["serving_p99_ms"] <= 13.0 and v.meta["nodes_agreeing"] == 1
    assert v.meta["serving_attribution"] == "serving path"
    assert "serving path 0.00 ->" in v.meta["reason"] and "hysteresis" in v.meta["reason"]


@pytest.mark.parametrize("pooling", [True, False])
def test_a_burst_the_windows_median_hides_is_learnt_from_the_agents_pooled_p99(tmp_path, pooling):
    """A loaded machine: most windows show a 4 ms serving path, one window in ten a stall; the clients' p99 over
    the last 10 windows (the agent's pooled p99) is 15 ms above the batch. Learnt from the pools, the prediction
    covers it; an old agent (no pool) teaches the median of the windows, as before."""
    svc, node = guard_off(tmp_path)
    for i in range(40):
        p = placed(svc)
        batch = p.predicted_p99_ms - p.serving_p99_ms - p.beyond_sli_p99_ms
        pool = {}
        if pooling and i >= 1:  # the agent's first window has no pool yet; then up to its 10 last windows
            windows = min(i, 10)
            pool = dict(pooled_p99_ms=batch + 15.0, pooled_windows=windows, pooled_count=30 * windows)
        node.beat(p99=batch + (40.0 if i % 10 == 6 else 4.0), p50=batch + 2.0, over=0.0, **pool)
    versions = svc.store.profile_versions("accel_sim")
    p = placed(svc)
    batch = p.predicted_p99_ms - p.serving_p99_ms - p.beyond_sli_p99_ms
    if pooling:
        assert len(versions) == 1 and "from pooled p99s (w#0 " in versions[0].meta["reason"]
        assert p.beyond_sli_p99_ms == 0.0 and p.predicted_p99_ms >= batch + 15.0 - 1e-6  # covers the clients' p99
    else:  # as before the pool: the median (4 ms) moves the prediction by less than 10% of the SLO, nothing
        assert not versions and p.predicted_p99_ms < batch + 15.0 - 8.0  # far below what clients saw


def test_a_lowering_from_pooled_p99s_waits_for_a_pool_that_shares_no_window_with_the_first(tmp_path):
    """Clients' pooled p99 is 30 ms over the batch: the term is raised at once. Then the pools show 15 ms:
    a lowering. Two pools one window apart share nine of their ten windows; one quiet stretch is not two
    (fails when the next overlapping pool confirms it). The pool after the first one's end confirms it."""
    recal = replace(CONFIG.recalibration, min_interval_s=1.0)
    config = replace(CONFIG, recalibration=recal, guard=replace(CONFIG.guard, enabled=False))
    svc, clock = service(tmp_path, config)
    svc.apply_workloads([{"name": "w", "model": "accel_sim", "slo_ms": 80, "rate_rps": 30}])
    svc.reconcile()
    node = Node(svc, clock)
    lowered_at = None
    for i in range(60):
        p = placed(svc)
        batch = p.predicted_p99_ms - p.serving_p99_ms - p.beyond_sli_p99_ms
        residual = 30.0 if i < 25 else 15.0
        n = min(i, 10)
        pool = dict(pooled_p99_ms=batch + residual, pooled_windows=n, pooled_count=30 * n) if i else {}
        node.beat(p99=batch + residual, p50=batch + 2.0, over=0.0, **pool)
        if lowered_at is None and placed(svc).serving_p99_ms < 20.0 and i >= 25:
            lowered_at = i
    versions = svc.store.profile_versions("accel_sim")
    assert versions and versions[0].meta["serving_p99_ms"] == pytest.approx(30.0, abs=1.0)  # the raise
    assert lowered_at is not None and lowered_at >= 25 + 10, lowered_at  # the first pool with no window of 25..34
    assert placed(svc).serving_p99_ms == pytest.approx(15.0, abs=1.0)


def test_windows_that_scatter_as_poisson_counts_do_at_a_low_rate_are_at_the_planned_load(tmp_path):
    """16 req/s in 1 s windows: a count over +20% (19.2) comes about one time in five, so with a fixed 20%
    bound nearly every pool of 10 held a window the loop did not use, and the CPU demo's loop never learnt
    its clients' p99. Within 3 Poisson standard deviations of the plan (16 + 12 req/s) they are the
    clients' p99 at the planned load; the pooled p99 is learnt (fails with the fixed bound)."""
    svc, node = guard_off(tmp_path, rate_rps=16)
    rates = (16.0, 21.0, 13.0, 20.0, 15.0, 22.0, 12.0, 17.0, 23.0, 14.0)  # 4 of 10 over 19.2, none over 28
    for i in range(40):
        p = placed(svc)
        batch = p.predicted_p99_ms - p.serving_p99_ms - p.beyond_sli_p99_ms
        pool = dict(pooled_p99_ms=batch + 15.0, pooled_windows=min(i, 10), pooled_count=25 * min(i, 10)) if i else {}
        node.beat(rate=rates[i % 10], p99=batch + 4.0, p50=batch + 2.0, over=0.0, **pool)
    reasons = [v.meta["reason"] for v in svc.store.profile_versions("accel_sim")]
    assert any("from pooled p99s (w#0 " in r for r in reasons), reasons
    p = placed(svc)
    assert p.beyond_sli_p99_ms == 0.0 and p.serving_p99_ms >= 15.0 - 1e-6  # the prediction covers the clients' p99


def low_rate_windows(tmp_path, rate, counts, own_ms, pooled_ms):
    """A workload at `rate` req/s whose node beats 40 one-second windows of `counts` requests (cycled), their own
    p99 `own_ms` above the batch and, with `pooled_ms`, each carrying the pool of its last 10 windows (their
    requests summed) that far above it; the service after them (guard off, 20 requests a window)."""
    config = replace(CONFIG, guard=replace(CONFIG.guard, enabled=False, min_requests=20))
    svc, clock = service(tmp_path, config)
    svc.apply_workloads([{"name": "w", "model": "accel_sim", "slo_ms": 80, "rate_rps": rate}])
    svc.reconcile()
    node = Node(svc, clock)
    for i in range(40):
        p = placed(svc)
        batch = p.predicted_p99_ms - p.serving_p99_ms - p.beyond_sli_p99_ms
        n, pooled = counts[i % 10], [counts[j % 10] for j in range(max(0, i - 9), i + 1)]
        pool = {}
        if i and pooled_ms is not None:
            pool = dict(pooled_p99_ms=batch + pooled_ms, pooled_windows=len(pooled), pooled_count=sum(pooled))
        node.beat(rate=float(n), requests=n, p99=batch + own_ms, p50=batch + 2.0, over=0.0, **pool)
    return svc


def test_a_pool_is_read_when_its_windows_are_at_the_plan_though_most_hold_too_few_requests_of_their_own(tmp_path):
    """16 req/s in 1 s windows with the default 20 requests a window needs: most windows hold fewer (their own
    p99 is not read), but the pool of the last 10 holds 160 requests at the planned load: it is the clients' p99
    and is learnt (fails when every pooled window must hold 20 requests)."""
    svc = low_rate_windows(tmp_path, 16, (16, 21, 13, 19, 15, 22, 12, 17, 14, 18), 4.0, 15.0)  # 2 of 10 hold 20
    reasons = [v.meta["reason"] for v in svc.store.profile_versions("accel_sim")]
    assert any("from pooled p99s (w#0 " in r for r in reasons), reasons
    p = placed(svc)
    assert p.beyond_sli_p99_ms == 0.0 and p.serving_p99_ms >= 15.0 - 1e-6


def test_a_pool_is_read_though_no_window_that_carries_one_holds_the_requests_of_its_own(tmp_path):
    """16 req/s in 1 s windows, and no window holds the 20 requests a window's own p99 needs: each still carries
    the pool of the last 10 (150+ requests at the planned load), and the pools are learnt. Their own p99s
    (their maximum, far above the pool's) count nowhere. Fails when the window that carries a pool must hold
    20 requests itself: then nothing is learnt."""
    svc = low_rate_windows(tmp_path, 16, (16, 13, 19, 15, 12, 17, 14, 18, 16, 15), 40.0, 15.0)  # none holds 20
    reasons = [v.meta["reason"] for v in svc.store.profile_versions("accel_sim")]
    assert any("from pooled p99s (w#0 " in r for r in reasons), reasons
    p = placed(svc)
    assert p.beyond_sli_p99_ms == 0.0 and p.serving_p99_ms == pytest.approx(15.0, abs=1.0)


@pytest.mark.parametrize(
    "rate, counts, pooled_ms",
    [(16, (16, 13, 19, 15, 12, 17, 14, 18, 16, 15), None), (3, (3, 2, 4, 3, 3, 2, 4, 3, 3, 3), 40.0)],
    ids=["16 req/s, no pools", "3 req/s, pools of 30 requests"],
)
def test_windows_of_few_requests_teach_nothing_without_a_pool_of_100_requests(tmp_path, rate, counts, pooled_ms):
    """Windows of fewer than the 20 requests a window's own p99 needs, their p99s (their maximum) 40 ms above the
    batch: from an old agent without pools (16 req/s), or with pools of 10 windows that hold only 30 requests
    (3 req/s, whose p99 one stalled request sets), nothing is learnt and nothing published. Fails when such a
    window's own p99 is read, or when a pool of 20 requests is."""
    svc = low_rate_windows(tmp_path, rate, counts, 40.0, pooled_ms)
    assert svc.store.profile_versions("accel_sim") == []


def test_a_pool_that_reaches_back_past_a_window_the_loop_does_not_use_is_not_read(tmp_path):
    """Overloaded windows teach the serving path nothing (their p99 says the rate is wrong); a pool that still
    holds them is not the clients' p99 at the planned load: the windows' median is read until it is clean."""
    svc, node = guard_off(tmp_path)
    for _ in range(4):
        node.beat()
    for _ in range(3):
        node.beat(rate=100.0, p99=900.0, p50=500.0, over=0.9)
    for _ in range(6):  # clean windows, but each pool of 10 still holds the overloaded ones
        p = placed(svc)
        batch = p.predicted_p99_ms - p.serving_p99_ms - p.beyond_sli_p99_ms
        node.beat(
            p99=batch + 4.0, p50=batch + 2.0, over=0.0, pooled_p99_ms=batch + 400.0, pooled_windows=10, pooled_count=300
        )
    reasons = [v.meta["reason"] for v in svc.store.profile_versions("accel_sim")]
    assert all("pooled" not in r for r in reasons), reasons
    assert placed(svc).serving_p99_ms < 100.0


def test_rollback_pins_the_fitted_profile_and_resume_recalibrates_again(tmp_path):
    svc, clock = service(tmp_path)
    svc.apply_workloads([{"name": "w", "model": "accel_sim", "slo_ms": 80, "rate_rps": 30}])
    svc.reconcile()
    node = Node(svc, clock)
    for _ in range(60):
        node.beat(factor=2.0)
    assert svc.list_profiles()[0].active_version >= 1
    [row] = svc.rollback_profile("accel_sim")
    assert (row.active_version, row.pinned) == (0, True)
    for _ in range(30):
        node.beat(factor=2.0)
    assert svc.list_profiles()[0].active_version == 0  # pinned: recalibration leaves it alone
    with pytest.raises(NotFound, match=r"no version 99; its versions: v0 \(the fitted profile\), v1"):
        svc.rollback_profile("accel_sim", version=99)
    svc.rollback_profile("accel_sim", resume=True)
    events = len(svc.status().loop_events)
    svc.rollback_profile("accel_sim", resume=True)  # not pinned: nothing to resume, nothing logged
    assert len(svc.status().loop_events) == events
    for _ in range(10):
        node.beat(factor=2.0)
    assert svc.list_profiles()[0].active_version >= 2


def test_demand_scales_up_within_two_heartbeats_and_down_after_the_cooldown(tmp_path):
    svc, clock = service(tmp_path)
    svc.apply_workloads([{"name": "w", "model": "accel_sim", "slo_ms": 80, "rate_rps": "auto", "max_rps": 200}])
    svc.reconcile()
    assert placed(svc).rate_rps == 1.0  # demand.initial_rps
    node = Node(svc, clock)
    for _ in range(5):
        node.beat(rate=10.0)
    assert placed(svc).rate_rps == pytest.approx(12.5)  # 10 x (1 + headroom)
    node.beat(rate=60.0)
    node.beat(rate=60.0)  # the second heartbeat over: scaled up
    assert placed(svc).rate_rps == pytest.approx(75.0)
    status = svc.status().workloads[0]
    assert status.workload.rate_auto and status.feedback.demand.startswith("up:")
    for _ in range(20):
        node.beat(rate=20.0)
    assert placed(svc).rate_rps == pytest.approx(75.0)  # within the cool-down: no scale-down
    for _ in range(40):
        node.beat(rate=20.0)
    assert placed(svc).rate_rps == pytest.approx(25.0)  # after the cool-down, from the window
    for _ in range(6):  # a window counts for at most 4x the planned rate (+10): 25 -> 137.5 -> 200 in two steps
        node.beat(rate=500.0)
    assert placed(svc).rate_rps == 200.0  # max_rps


def test_guard_moves_a_replica_over_its_slo_to_a_larger_share_and_releases_the_floor(tmp_path):
    config = replace(CONFIG, recalibration=replace(CONFIG.recalibration, enabled=False))
    svc, clock = service(tmp_path, config)
    svc.apply_workloads([{"name": "w", "model": "accel_sim", "slo_ms": 80, "rate_rps": 30}])
    svc.reconcile()
    node = Node(svc, clock)
    node.beat(p99=60.0, over=0.0)
    node.beat(p99=120.0, over=0.1, requests=5)  # too few requests: does not count
    node.beat(p99=120.0, over=0.1)
    node.beat(p99=120.0, over=0.1)
    assert placed(svc).share_pct == 50.0
    node.beat(p99=120.0, over=0.1)  # the third window over: a floor is requested and planned
    assert placed(svc).share_pct == 100.0
    w = svc.status().workloads[0]
    assert w.feedback.guard_moves == 0 and "asked the planner for 100%" in w.feedback.guard  # not serving yet
    assert w.feedback.floor_pct == 100
    node.beat(p99=30.0, over=0.0)  # the node serves the new share: now the move counts
    w = svc.status().workloads[0]
    assert w.feedback.guard_moves == 1 and "moved from 50% to 100%" in w.feedback.guard
    assert svc.feedback.counters["guard_moves"] == 1 and svc.feedback.counters["replans_guard"] == 1
    for _ in range(61):
        node.beat(p99=30.0, over=0.0)
    assert placed(svc).share_pct == 50.0  # the floor expired: the planner's own choice again
    assert any("released" in e.text for e in svc.store.events(kind="guard"))


def test_a_floor_that_cannot_be_applied_is_an_event_and_an_alert_not_a_move(tmp_path):
    from prometheus_client import generate_latest

    from controller.metrics import ControllerMetrics

    config = replace(CONFIG, recalibration=replace(CONFIG.recalibration, enabled=False))
    svc, clock = service(tmp_path, config)
    metrics = ControllerMetrics(svc)
    svc.apply_workloads(
        [
            {"name": "w", "model": "accel_sim", "slo_ms": 80, "rate_rps": 30},
            {"name": "x", "model": "accel_sim", "slo_ms": 80, "rate_rps": 30},
        ]
    )
    svc.reconcile()
    node = Node(svc, clock)
    for _ in range(5):
        node.beat(p99=120.0, over=0.1)
    plan = svc.current_plan().plan
    assert {p.name: p.share_pct for g in plan.gpus for p in g.placements} == {"w": 50.0, "x": 50.0}
    refused = [e.text for e in svc.store.events(kind="guard") if "not applied" in e.text]
    assert refused and "unplaced" in refused[0]
    status = svc.status()
    assert any(a.startswith("SLO guard:") and "not applied" in a for a in status.alerts)
    assert all(w.feedback.guard_moves == 0 for w in status.workloads) and svc.feedback.counters["guard_moves"] == 0
    assert svc.feedback.output.floors == ()
    text = generate_latest(metrics.registry).decode()
    assert 'stoke_guard_moves_total{model="accel_sim",workload="w"} 0.0' in text
    assert "stoke_guard_floors_refused 2.0" in text
    assert "stoke_plan_held 0.0" in text  # a guard alert is not a held plan


def test_status_and_metrics_show_the_loop(tmp_path):
    from prometheus_client import generate_latest

    from controller.metrics import ControllerMetrics

    svc, clock = service(tmp_path)
    metrics = ControllerMetrics(svc)
    svc.apply_workloads([{"name": "w", "model": "accel_sim", "slo_ms": 80, "rate_rps": 30}])
    svc.reconcile()
    node = Node(svc, clock)
    for _ in range(3):
        node.beat(factor=1.3, p99=40.0, over=0.0)
    text = generate_latest(metrics.registry).decode()
    ratio = next(line for line in text.splitlines() if line.startswith("stoke_prediction_error_ratio{"))
    assert 'workload="w"' in ratio and float(ratio.split()[-1]) == pytest.approx(1.3, rel=1e-3)
    assert 'stoke_workload_observed_p99_ms{model="accel_sim",workload="w"} 40.0' in text
    assert "stoke_guard_moves_total" in text and "stoke_replans_total" in text


def test_windows_out_of_bounds_are_refused_and_implausible_ones_not_stored(tmp_path):
    svc, clock = service(tmp_path)
    svc.apply_workloads([{"name": "w", "model": "accel_sim", "slo_ms": 80, "rate_rps": 30}])
    svc.reconcile()
    running = svc.heartbeat(HeartbeatReport("n1")).assignments
    refused = [
        (Observation("w#0", "accel_sim", request_rate_rps=math.nan, seq=1, window_s=1.0), "request_rate_rps"),
        (Observation("w#0", "accel_sim", seq=3, window_s=1.0, latency_p99_ms=-5.0), "latency_p99_ms"),
        (
            Observation(
                "w#0", "accel_sim", seq=4, window_s=1.0, batch_stats=tuple(BatchStat(1, 1, 1.0) for _ in range(300))
            ),
            "batch_stats",
        ),
        (
            Observation("w#0", "accel_sim", seq=5, window_s=1.0, batch_stats=(BatchStat(0, 1, 1.0),)),
            r"batch_stats\[0\]\.batch",
        ),
    ]
    for o, field in refused:  # the heartbeat is refused whole, naming the field (controller.limits)
        with pytest.raises(InvalidArgument, match=field):
            svc.heartbeat(HeartbeatReport("n1", running=running, observed=(o,)))
    # within the bounds but not a window: not stored
    svc.heartbeat(
        HeartbeatReport("n1", running=running, observed=(Observation("w#0", "accel_sim", seq=2, window_s=1e9),))
    )
    assert svc.store.observation_count() == 0


def test_the_loop_forgets_replicas_and_trackers_of_workloads_that_are_gone(tmp_path):
    svc, clock = service(tmp_path)
    svc.apply_workloads(
        [
            {"name": "w", "model": "accel_sim", "slo_ms": 80, "rate_rps": 30},
            {"name": "a", "model": "accel_sim", "slo_ms": 80, "rate_rps": "auto"},
        ]
    )
    svc.reconcile()
    node = Node(svc, clock)
    for _ in range(3):
        node.beat(p99=30.0, over=0.0)
    assert {"w#0", "a#0"} <= set(svc.feedback._replicas) and "a" in svc.feedback._demand
    svc.delete_workload("a")
    for _ in range(5):  # the plan drops it, the node stops reporting it, and the windows go stale
        node.beat(p99=30.0, over=0.0)
    assert set(svc.feedback._replicas) == {"w#0"} and "a" not in svc.feedback._demand


def test_an_overloaded_replica_teaches_the_serving_path_nothing(tmp_path):
    """A replica serving far more than it was planned for has a growing queue: its p99 says the rate is wrong,
    not the serving path. (Learning from it sent an overloaded workload pending in the bench.)"""
    svc, node = guard_off(tmp_path)
    for _ in range(20):
        node.beat(rate=100.0, p99=900.0, p50=500.0, over=0.9)
    assert not [v for v in svc.store.profile_versions("accel_sim") if v.meta.get("serving_p99_ms")]
    assert placed(svc).name == "w"  # still served


def _compute_twice_as_fast(tmp_path, sli):
    """Triton's compute says the model runs twice as fast as profiled; `sli(i, seen)` gives heartbeat i's SLI
    fields (`seen`: the prediction at the start). No heartbeat may take the prediction below `seen`."""
    svc, node = guard_off(tmp_path)
    seen = placed(svc).predicted_p99_ms
    tolerance = CONFIG.recalibration.replan_threshold * 80 / 2.0
    for i in range(60):
        node.beat(factor=0.5, **sli(i, seen))
        assert placed(svc).predicted_p99_ms >= seen - tolerance, (i, placed(svc).predicted_p99_ms, seen)


def test_a_lowered_service_time_never_takes_the_prediction_below_what_the_sli_shows(tmp_path):
    """Clients still see the p99 the profile predicts. The SLI windows are too few to move the serving term,
    so a published lowering of the service time alone would predict less than clients see: it is held."""
    # an SLI window now and then: too few to learn from
    _compute_twice_as_fast(tmp_path, lambda i, seen: {"p99": seen if i % 4 == 0 else None})


def test_a_lowered_service_time_is_held_while_overloaded_windows_show_clients_above_the_prediction(tmp_path):
    """A queue builds at every window end and clients see three times the prediction. Those windows are left
    out of what the loop learns from (not at the planned load), but they still show that a lowered prediction
    would be below what clients see: the lowering is held."""
    _compute_twice_as_fast(tmp_path, lambda i, seen: {"p99": 3 * seen, "p50": 2 * seen, "over": 0.0, "pending": 40})


def test_guard_moves_stay_counted_when_the_replica_that_made_them_is_gone(tmp_path):
    """stoke_guard_moves_total is a counter: a replica forgotten (its node lost, the workload pending) must not
    take its moves with it (a counter that goes down reads as a reset, and increase() counts it again)."""
    config = replace(CONFIG, recalibration=replace(CONFIG.recalibration, enabled=False))
    svc, clock = service(tmp_path, config)
    svc.apply_workloads([{"name": "w", "model": "accel_sim", "slo_ms": 80, "rate_rps": 30}])
    svc.reconcile()
    node = Node(svc, clock)
    for _ in range(4):
        node.beat(p99=120.0, over=0.1)
    node.beat(p99=30.0, over=0.0)  # serving at the floor's share: one move
    assert svc.status().workloads[0].feedback.guard_moves == 1
    svc.register("n2", (NodeDevice(0, "V100", "gpu", gpu_type="V100"),))  # no profile: nothing runs there
    for _ in range(40):  # n1 silent past its timeout: lost, the workload pending, its replica forgotten
        clock.t += 1.0
        svc.heartbeat(HeartbeatReport("n2"))
        svc.reconcile()
    w = svc.status().workloads[0]
    assert w.state == "pending" and "w#0" not in svc.feedback._replicas
    assert w.feedback.guard_moves == 1
    svc.delete_workload("w")
    svc.reconcile()
    assert svc.feedback._moves == {}  # a deleted workload's count goes with it (bounded state)


def loose_slo(tmp_path, refresh=True):
    """Workload w (accel_sim, 400 ms SLO, 30 req/s) planned with a profile whose serving path is 16 ms: a p99 of
    about 49 ms, far under its SLO. (service, node n1, w's first placement)"""
    from controller.recalibrate import with_serving

    recal = replace(CONFIG.recalibration, refresh_within_accuracy=refresh)
    config = replace(CONFIG, recalibration=recal, guard=replace(CONFIG.guard, enabled=False))
    clock = Clock()
    svc = ControlService(Store(tmp_path / "stoke.db"), config, clock=clock, tick=clock)
    svc.upload_profile(json.dumps(profile_to_dict(with_serving(PROFILE, "accel_sim", 16.0, beyond_sli_ms=0.0))), "CPU")
    svc.register("n1", CPU)
    svc.apply_workloads([{"name": "w", "model": "accel_sim", "slo_ms": 400, "rate_rps": 30}])
    svc.reconcile()
    return svc, Node(svc, clock), placed(svc)


@pytest.mark.parametrize("refresh", [True, False])
def test_a_prediction_far_above_what_clients_see_under_a_loose_slo_is_refreshed_within_the_accuracy_goal(
    tmp_path, refresh
):
    """As the CPU demo's product-search (a 160 ms SLO, a p99 planned at 11 ms, clients at 6-8 ms): a 400 ms SLO,
    a p99 planned at about 49 ms, clients that see 10 ms less outside the batch than the profile says. 10 ms is
    2.5% of the SLO, under the re-plan threshold (10%), but past the accuracy goal (20% or 2 ms): the loop lowers
    the serving term to what the pools show (fails when the threshold alone decides). With
    `refresh_within_accuracy` off it stays, as before."""
    svc, node, first = loose_slo(tmp_path, refresh)
    batch = first.predicted_p99_ms - first.serving_p99_ms - first.beyond_sli_p99_ms
    assert first.serving_p99_ms == pytest.approx(16.0) and first.predicted_p99_ms < 0.15 * 400  # a loose SLO
    seen = batch + 6.0  # what clients see: 10 ms less than predicted
    for i in range(40):
        n = min(i, 10)
        pool = dict(pooled_p99_ms=seen, pooled_windows=n, pooled_count=30 * n) if i else {}
        node.beat(p99=seen, p50=batch + 2.0, over=0.0, **pool)
    versions = svc.store.profile_versions("accel_sim")
    now = placed(svc)
    if refresh:
        assert len(versions) == 1 and "past the accuracy goal" in versions[0].meta["reason"], versions
        assert now.predicted_p99_ms == pytest.approx(seen, abs=0.5)  # what clients see, never below it
        assert now.predicted_p99_ms >= seen - 1e-6
        assert (now.share_pct, now.batch) == (first.share_pct, first.batch)  # the re-plan moved nothing
    else:
        assert not versions and now.predicted_p99_ms == pytest.approx(first.predicted_p99_ms)


def test_independent_pools_that_raise_by_different_amounts_publish_the_least_raise(tmp_path):
    """A steady serving path 20 ms longer than the profile says, seen through pools of 300 requests whose p99
    one slow request or two can lift: the first ten pools show 20 ms more, the next ten 36, and so on. Two
    independent pools agree that the term goes up, and the lesser raise, the first, stands: 20 ms (fails when
    overlapping pools publish at once, and when pools must agree within 25%: 20 and 36 never do)."""
    svc, node, first = loose_slo(tmp_path)
    raised_at = None
    for i in range(45):
        n = min(i, 10)
        extra = 20.0 if (i // 10) % 2 == 0 else 36.0
        seen = first.predicted_p99_ms + extra
        pool = dict(pooled_p99_ms=seen, pooled_windows=n, pooled_count=30 * n) if i else {}
        node.beat(p99=first.predicted_p99_ms, p50=first.predicted_p99_ms - 10.0, over=0.0, **pool)
        if raised_at is None and svc.store.profile_versions("accel_sim"):
            raised_at = i
    (version,) = svc.store.profile_versions("accel_sim")
    assert raised_at is not None and raised_at >= 10, raised_at  # after a second, independent pool
    assert "stands, the least move of the independent pools" in version.meta["reason"], version.meta["reason"]
    assert placed(svc).predicted_p99_ms == pytest.approx(first.predicted_p99_ms + 20.0, abs=0.5)


def test_pools_confirmed_across_a_service_time_change_are_read_at_the_new_service_time(tmp_path):
    """Triton's compute 25% slower than the profile for 30 windows (the clients' pools as predicted at that
    speed), then 20% faster with clients 40 ms above the first prediction: the correction moves from x1.25 to
    x0.8 between the two independent pools. The term is learnt as what clients see less the batch p99 at each
    estimate's service time, so pools are compared as levels of what clients see: one version, its prediction
    the pools' (fails when the first pool's term, learnt at x1.2, is joined to x0.8: 23 ms under the pools)."""
    svc, node, first = loose_slo(tmp_path)
    level = first.predicted_p99_ms
    for i in range(50):
        factor, seen = (1.25, level + 16.0) if i < 30 else (0.8, level + 40.0)
        n = min(i - 14, 10)
        pool = dict(pooled_p99_ms=seen, pooled_windows=n, pooled_count=30 * n) if n > 0 else {}
        node.beat(factor=factor, p99=level, p50=level - 10.0, over=0.0, **pool)
    (version,) = svc.store.profile_versions("accel_sim")
    assert version.meta["factor"] == pytest.approx(0.8, abs=0.02)
    assert placed(svc).predicted_p99_ms == pytest.approx(level + 40.0, abs=1.0)


@pytest.mark.parametrize("upload_at", [None, 12])
def test_a_profile_upload_starts_the_count_of_pools_over(tmp_path, upload_at):
    """Clients see 36 ms more than predicted in every pool: published once a pool that shares no window with the
    first shows it. A profile uploaded meanwhile (the same one here) starts the count over: estimates made
    under the old coefficients confirm nothing under the new (fails when the upload keeps the count)."""
    from controller.recalibrate import with_serving

    svc, node, first = loose_slo(tmp_path)
    raised_at = None
    for i in range(40):
        if i == upload_at:
            svc.upload_profile(
                json.dumps(profile_to_dict(with_serving(PROFILE, "accel_sim", 16.0, beyond_sli_ms=0.0))), "CPU"
            )
        n = min(i, 10)
        pool = dict(pooled_p99_ms=first.predicted_p99_ms + 36.0, pooled_windows=n, pooled_count=30 * n) if i else {}
        node.beat(p99=first.predicted_p99_ms, p50=first.predicted_p99_ms - 10.0, over=0.0, **pool)
        if raised_at is None and svc.store.profile_versions("accel_sim"):
            raised_at = i
    assert raised_at is not None
    if upload_at is None:
        assert 10 <= raised_at < 20, raised_at
    else:
        assert raised_at >= upload_at + 10, raised_at  # a first pool after the upload, then one sharing none


def test_with_one_confirmation_a_term_from_pools_still_takes_two_that_share_no_window(tmp_path):
    svc, node, first = loose_slo(tmp_path)
    svc.feedback.config = replace(
        svc.feedback.config, recalibration=replace(svc.feedback.config.recalibration, confirmations=1)
    )
    raised_at = None
    for i in range(30):
        n = min(i, 10)
        pool = dict(pooled_p99_ms=first.predicted_p99_ms + 36.0, pooled_windows=n, pooled_count=30 * n) if i else {}
        node.beat(p99=first.predicted_p99_ms, p50=first.predicted_p99_ms - 10.0, over=0.0, **pool)
        if raised_at is None and svc.store.profile_versions("accel_sim"):
            raised_at = i
    assert raised_at is not None and raised_at >= 10, raised_at


@pytest.mark.parametrize("stall", [True, False])
@pytest.mark.parametrize("raise_ms", [18.0, 60.0])
def test_a_raise_needs_a_pool_that_shares_no_window_with_the_first(tmp_path, stall, raise_ms):
    """Clients see what the prediction says, but for `raise_ms` more in every pool (a slower serving path: raised
    once a second pool that shares no window with the first shows it) or only in the pools that hold one
    stalled window (one stall: the ten pools that hold it overlap, and the first one without it shows no
    raise, so nothing is published; fails when overlapping pools confirm a raise). 18 ms under the 400 ms SLO
    only the accuracy goal publishes; 60 ms is past the 10% threshold (a demo run learnt 19.4 ms from one pool
    of 172 requests, its clients at 12.8 ms over the run; a surge test 221 ms from one stalled second)."""
    svc, node, first = loose_slo(tmp_path)
    raised_at = None
    for i in range(40):
        n = min(i, 10)
        # the stall is window 12: it is in the pools of windows 12..21, 10 windows each
        extra = raise_ms if not stall or (i >= 12 and i - n + 1 <= 12) else 0.0
        seen = first.predicted_p99_ms + extra
        pool = dict(pooled_p99_ms=seen, pooled_windows=n, pooled_count=30 * n) if i else {}
        node.beat(p99=first.predicted_p99_ms, p50=first.predicted_p99_ms - 10.0, over=0.0, **pool)
        if raised_at is None and placed(svc).predicted_p99_ms > first.predicted_p99_ms + 9.0:
            raised_at = i
    versions = svc.store.profile_versions("accel_sim")
    if stall:
        assert raised_at is None and not versions, versions
    else:
        assert raised_at is not None and raised_at >= 10, raised_at  # after a second, independent pool
        assert len(versions) == 1
        assert ("past the accuracy goal (20% or 2 ms), under the re-plan threshold" in versions[0].meta["reason"]) == (
            raise_ms < 0.1 * 400
        )
        assert placed(svc).predicted_p99_ms == pytest.approx(first.predicted_p99_ms + raise_ms, abs=0.5)


def test_a_lowered_service_time_with_clients_above_it_is_published_with_their_term(tmp_path):
    """Triton's compute twice as fast, clients steadily at 32 ms after a quiet first pool at 24: the correction
    crosses the threshold alone and is published with the term its pools show, one version, the prediction what
    clients steadily see (a review found a rule under which a quiet first pool held both back for good)."""
    svc, node = guard_off(tmp_path)
    for i in range(60):
        n = min(i, 10)
        seen = 24.0 if i <= 5 else 32.0
        pool = dict(pooled_p99_ms=seen, pooled_windows=n, pooled_count=30 * n) if i else {}
        node.beat(factor=0.5, p99=seen, p50=seen - 3.0, over=0.0, **pool)
    (version,) = svc.store.profile_versions("accel_sim")
    assert version.meta["factor"] == pytest.approx(0.5, abs=0.02)
    assert placed(svc).predicted_p99_ms == pytest.approx(32.0, abs=1.0)


def test_quiet_pools_do_not_take_a_lowered_service_time_below_what_clients_steadily_see(tmp_path):
    """Triton's compute twice as fast; clients steadily see 10 ms more than the correction alone predicts, and the
    three pools of windows 9-11 are quiet (1 ms more). The prediction goes down once, to what clients see, and
    never below it (a review found a rule under which two quiet estimates published the correction alone, 10 ms
    below the clients, and a second version raised it)."""
    from controller.recalibrate import placed_replicas, replica_p99_ms, with_serving

    svc, node = guard_off(tmp_path)
    (replica,) = placed_replicas(svc.current_plan().plan, "CPU", "accel_sim")
    m = PROFILE.model("accel_sim")
    alone = replica_p99_ms(
        with_serving(truth(0.5), "accel_sim", m.serving_p99_ms, beyond_sli_ms=m.beyond_sli_p99_ms), replica
    )
    lowest = placed(svc).predicted_p99_ms
    for i in range(80):
        n = min(i, 10)
        seen = alone + (1.0 if 9 <= i < 12 else 10.0)
        pool = dict(pooled_p99_ms=seen, pooled_windows=n, pooled_count=30 * n) if i else {}
        node.beat(factor=0.5, p99=alone + 10.0, p50=alone + 7.0, over=0.0, **pool)
        lowest = min(lowest, placed(svc).predicted_p99_ms)
    (version,) = svc.store.profile_versions("accel_sim")
    assert lowest >= alone + 10.0 - 1.0, (lowest, alone + 10.0)
    assert placed(svc).predicted_p99_ms == pytest.approx(alone + 10.0, abs=1.0)


def test_a_version_the_profile_book_would_refuse_is_not_published(tmp_path):
    """A candidate with a serving term below 0 (a rule reviewed and withdrawn made one from a factor that rose
    between two pools; none is known under the rule now): stored, the profile book would refuse it and the GPU
    type would plan with its fitted profile, far from what clients see. It is not stored; the event says why,
    and the count starts over."""
    from controller.recalibrate import ServingEstimate, with_serving

    svc, _ = service(tmp_path)
    svc.apply_workloads([{"name": "w", "model": "accel_sim", "slo_ms": 80, "rate_rps": 30}])
    svc.reconcile()
    bad = with_serving(PROFILE, "accel_sim", -3.36, beyond_sli_ms=0.0)
    serving = ServingEstimate(-3.36, True, 10, 1, 1, "serving path", "serving path 0.00 -> -3.36 ms", pooled=True)
    svc.feedback._publish(("CPU", "accel_sim"), None, 1.0, bad, serving, "a test", 1_700_000_100.0)
    assert svc.store.profile_versions("accel_sim") == []
    assert any("a version was not published" in e and "serving_p99_ms" in e for e in svc.status().loop_events)
    assert svc.feedback._confirm[("CPU", "accel_sim")].count == 0


def test_a_least_move_refused_at_publish_starts_the_count_over_from_the_newest_pool(tmp_path):
    """Independent pools agree the serving term goes up, but the least of their moves, an earlier pool's level
    0.5 ms over the prediction, no longer crosses anything when it is checked again at publish (how an earlier
    level comes to stand is rare under this rule; the state is set here as an earlier estimate would leave it).
    The count starts over from the newest pool, and the next pool that shares no window with it publishes what
    clients see: 60 ms more (fails when the refused level is kept: it stands as the least move of every later
    pool, and nothing is ever published)."""
    from controller.recalibrate import Confirmation, PoolSpan, placed_replicas

    svc, node, first = loose_slo(tmp_path)
    (replica,) = placed_replicas(svc.current_plan().plan, "CPU", "accel_sim")
    raised_at = None
    for i in range(40):
        pool = dict(pooled_p99_ms=first.predicted_p99_ms + 60.0, pooled_windows=10, pooled_count=300) if i >= 10 else {}
        if i == 10:  # an earlier pool, independent of every pool below, whose level crossed when it was read
            stale = Confirmation(1, 1.0, first.predicted_p99_ms + 0.5, (PoolSpan(replica.key, -30, -21),))
            svc.feedback._confirm[("CPU", "accel_sim")] = stale
        node.beat(p99=first.predicted_p99_ms, p50=first.predicted_p99_ms - 10.0, over=0.0, **pool)
        if raised_at is None and svc.store.profile_versions("accel_sim"):
            raised_at = i
    assert raised_at is not None and raised_at >= 20, raised_at  # the newest pool, then one that shares no window
    (version,) = svc.store.profile_versions("accel_sim")
    assert "stands, the least move" not in version.meta["reason"], version.meta["reason"]
    assert placed(svc).predicted_p99_ms == pytest.approx(first.predicted_p99_ms + 60.0, abs=0.5)
