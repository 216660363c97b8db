"""The closed loop's pure decisions, tested directly: the guard (`controller.guard`), demand tracking
(`controller.demand.track`) and when a recalibration is worth a re-plan (`controller.recalibrate`).
No service, no SQLite: plain data in, plain data out."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from profiles import accel_sim_profile

from controller.config import DemandConfig, GuardConfig
from controller.demand import DemandState, quantile, track
from controller.guard import GuardState, GuardWindow, clear, expire, refuse, step
from controller.recalibrate import (
    Confirmation,
    Move,
    accuracy_goal_ms,
    crosses,
    factor_move,
    p99_moves,
    past_accuracy,
    placed_replicas,
)
from interference.recalibration import Correction, apply_corrections
from planner.solver import GpuPlan, Placement, Plan, Workload

GUARD = GuardConfig(windows=3, min_requests=10, hold_s=60.0, cooldown_s=10.0)


def over(share=50.0, requests=100, slo=80.0, p99=120.0):
    return GuardWindow(share, requests, True, p99, slo)


def fine(share=50.0, requests=100):
    return GuardWindow(share, requests, False, 30.0, 80.0)


# ---------------------------------------------------------------- guard


def run(windows, planned=50.0, state=None, start=0.0):
    actions = []
    for i, w in enumerate(windows):
        state, action = step(state, "w#0", w, planned, 10.0, start + i, GUARD)
        actions.append(action)
    return state, actions


def test_guard_requests_a_floor_after_the_configured_windows_over_and_counts_no_move_yet():
    state, actions = run([over(), over()])
    assert actions == [None, None] and state.over == 2 and not state.floor_pct
    state, action = step(state, "w#0", over(), 50.0, 10.0, 2.0, GUARD)
    assert action is not None and action.kind == "request" and action.floor_pct == 60.0
    assert state.requested and state.moves == 0 and state.floor_until == pytest.approx(62.0)


def test_guard_counts_the_move_only_when_a_window_serves_at_the_floor():
    state, _ = run([over(), over(), over()])
    state, action = step(state, "w#0", over(share=50.0), 50.0, 10.0, 3.0, GUARD)  # still the old share
    assert action is None and state.moves == 0 and state.requested
    state, action = step(state, "w#0", fine(share=60.0), 60.0, 10.0, 4.0, GUARD)
    assert action is not None and action.kind == "applied" and state.moves == 1 and not state.requested
    assert "moved from 50% to 60%" in action.text


def test_guard_ignores_thin_windows_unknown_latency_and_windows_off_the_planned_share():
    state, actions = run([over(requests=5), GuardWindow(50.0, 100, None, None, 80.0), over(), over(share=40.0)])
    assert all(a is None for a in actions) and state.over == 0  # the off-share window reset the count
    state, actions = run([over(), fine(), over(), over()])
    assert all(a is None for a in actions) and state.over == 2  # a window within the SLO resets too


def test_guard_waits_the_cooldown_between_requests_and_says_when_there_is_no_larger_share():
    state = GuardState(last_move=0.0)
    state, actions = run([over(), over(), over()], state=state, start=1.0)  # within 10 s of the last move
    assert actions == [None, None, None]
    state, actions = run([over(share=100.0)] * 3, planned=100.0)
    assert actions[-1] is None and "no larger share" in state.text and not state.floor_pct


def test_guard_floor_expires_refused_floors_are_dropped_and_clear_forgets_the_count():
    state, _ = run([over(), over(), over()])
    kept, action = expire(state, "w#0", 61.0, GUARD)
    assert action is None and kept.floor_pct == 60.0
    released, action = expire(state, "w#0", 62.0, GUARD)
    assert action is not None and action.kind == "released" and released.floor_pct == 0.0
    refused, action = refuse(state, "w#0", "it would leave x unplaced")
    assert action is not None and action.kind == "refused" and refused.floor_pct == 0.0 and refused.moves == 0
    assert "not applied: it would leave x unplaced" in action.text
    assert refuse(refused, "w#0", "again") == (refused, None)  # nothing requested: nothing to refuse
    cleared, action = clear(state, "w#0", "node b lost")
    assert action is not None and action.kind == "cleared" and cleared.floor_pct == 0.0 and cleared.over == 0


# ---------------------------------------------------------------- demand

DEMAND = DemandConfig(window_s=30.0, quantile=0.95, headroom=0.25, up_heartbeats=2, cooldown_s=40.0)


def auto(rate=10.0, min_rps=None, max_rps=None):
    return Workload("w", "m", 80.0, rate, rate_auto=True, min_rps=min_rps, max_rps=max_rps)


def test_quantile_interpolates_like_numpy():
    assert quantile([1.0, 2.0, 3.0, 4.0], 0.5) == pytest.approx(2.5, rel=1e-9)
    assert quantile([5.0], 0.95) == 5.0


def test_demand_waits_without_samples_and_holds_on_noise():
    state = track(None, auto(), None, 0.0, DEMAND)
    assert state.decision == "waiting" and state.planned_rps == 10.0
    for t, r in enumerate([9.0, 10.5, 9.5, 10.0]):
        state = track(state, auto(), r, float(t + 1), DEMAND)
    assert state.decision == "hold" and state.planned_rps == 10.0


def test_demand_goes_up_after_the_heartbeats_over_the_plan_and_down_only_after_the_cooldown():
    state = track(None, auto(), 20.0, 1.0, DEMAND)
    assert state.decision != "up"  # one sample is not enough
    state = track(state, auto(), 22.0, 2.0, DEMAND)
    assert state.decision == "up" and state.planned_rps == pytest.approx(27.5, abs=0.1)
    for t in range(3, 40):
        state = track(state, auto(), 2.0, float(t), DEMAND)
    assert state.planned_rps == pytest.approx(27.5, abs=0.1) and "cool-down" in state.reason
    for t in range(40, 80):
        state = track(state, auto(), 2.0, float(t), DEMAND)
    assert state.decision in ("down", "hold") and state.planned_rps == pytest.approx(2.5, abs=0.1)


def test_demand_keeps_the_bounds_and_drops_garbage_samples():
    state = track(DemandState(planned_rps=500.0, changed_unix=0.0), auto(max_rps=100.0), 1.0, 1.0, DEMAND)
    assert state.decision == "bounds" and state.planned_rps == 100.0
    state = track(None, auto(), math.nan, 1.0, DEMAND)
    assert state.samples == ()
    state = track(None, auto(), -5.0, 1.0, DEMAND)
    assert state.samples == ()


# ---------------------------------------------------------------- recalibrate

PROFILE = accel_sim_profile(2)


def plan_of(*placements: Placement) -> Plan:
    return Plan(strategy="stoke", gpus=(GpuPlan(gpu_type="CPU", price_per_hour=0.0, placements=placements),))


def placement(name="w", share=50.0, rate=30.0, slo=80.0):
    return Placement(
        name=name,
        model="accel_sim",
        slo_ms=slo,
        rate_rps=rate,
        share_pct=share,
        batch=1,
        queue_delay_ms=0.0,
        predicted_latency_ms=0.0,
        predicted_throughput_rps=0.0,
    )


def slower(factor):
    return apply_corrections(PROFILE, {"accel_sim": Correction("accel_sim", "scale", factor, factor, 0, 0, 0, 0, 0)})


def test_p99_moves_measure_each_placed_replica_against_its_slo():
    replicas = placed_replicas(plan_of(placement("w"), placement("x", share=50.0)), "CPU", "accel_sim")
    assert [r.key for r in replicas] == ["w#0", "x#0"]
    assert placed_replicas(plan_of(placement()), "GPU", "accel_sim") == []
    moves = p99_moves(PROFILE, slower(1.5), replicas)
    assert len(moves) == 2 and all(m.after_ms > m.before_ms for m in moves)
    assert moves[0].relative == pytest.approx((moves[0].after_ms - moves[0].before_ms) / 80.0, rel=1e-9)


def test_crosses_compares_the_largest_move_with_the_threshold():
    small, large = Move("w#0", 20.0, 21.0, 80.0), Move("x#0", 20.0, 40.0, 80.0)
    assert crosses([small], 0.05, 0.0)[0] is False
    crossed, why = crosses([small, large], 0.05, 0.0)
    assert crossed and "x#0" in why and "25.0% of the SLO" in why
    assert crosses([Move("w#0", 20.0, math.inf, 80.0)], 0.05, 0.0)[0]  # turning unstable always counts
    assert crosses([], 0.05, 0.2) == (True, "no placed replica; factor moved 20.0%")


def test_confirmation_needs_agreeing_consecutive_estimates_and_resets_on_a_miss():
    c = Confirmation().next(True, 1.5, 0.1)
    assert c.count == 1
    c = c.next(True, 1.52, 0.1)  # within half the threshold of the last: agrees
    assert c.count == 2
    assert c.next(True, 1.8, 0.1).count == 1  # still moving: starts over
    assert c.next(False, 1.5, 0.1).count == 0
    assert factor_move(1.0, 1.2) == pytest.approx(0.2, rel=1e-9) and factor_move(0.0, 1.0) == math.inf


def test_a_term_from_pools_is_confirmed_only_by_pools_that_share_no_window_with_the_counted_ones():
    from controller.recalibrate import PoolSpan

    first = Confirmation().next(True, 1.0, 0.1, 10.0, 1.0, (PoolSpan("w#0", 1, 10),))
    assert first.count == 1
    overlapping = first.next(True, 1.0, 0.1, 10.2, 1.0, (PoolSpan("w#0", 6, 15),))
    assert overlapping == first  # neither confirms nor starts over
    assert overlapping.next(True, 1.0, 0.1, 10.1, 1.0, (PoolSpan("w#0", 11, 20),)).count == 2
    assert first.next(True, 1.0, 0.1, 10.1, 1.0, (PoolSpan("w#1", 6, 15),)).count == 2  # another replica's
    assert first.next(True, 1.0, 0.1, 10.1, 1.0).count == 2  # a service-time move alone: no wait
    assert first.next(True, 1.0, 0.1, 20.0, 1.0, (PoolSpan("w#0", 6, 15),)).count == 1  # disagrees: over
    assert first.next(False, 1.0, 0.1).count == 0
    # a term from pools after an estimate that was not one (a service-time move, no pools) starts the count
    raised = Confirmation().next(True, 1.0, 0.1, 10.0, 1.0)
    assert raised.next(True, 1.0, 0.1, 10.1, 1.0, (PoolSpan("w#0", 1, 10),)).count == 1


def test_independent_pools_agree_on_the_way_a_term_moves_and_the_least_move_stands():
    from controller.recalibrate import PoolSpan

    def pools(first, last):
        return (PoolSpan("w#0", first, last),)

    up = Confirmation().next(True, 1.0, 0.1, 19.4, 1.0, pools(1, 10), active_serving_ms=7.0)
    assert (up.count, up.serving_ms) == (1, 19.4)
    assert up.next(True, 1.0, 0.1, 11.5, 1.0, pools(6, 15), active_serving_ms=7.0) == up  # overlaps: nothing
    both = up.next(True, 1.0, 0.1, 11.5, 1.0, pools(11, 20), active_serving_ms=7.0)
    assert (both.count, both.serving_ms) == (2, 11.5)  # the lesser raise
    assert up.next(True, 1.0, 0.1, 25.0, 1.0, pools(11, 20), active_serving_ms=7.0).serving_ms == 19.4
    assert up.next(True, 1.0, 0.1, 5.0, 1.0, pools(11, 20), active_serving_ms=7.0).count == 1  # the other way
    down = Confirmation().next(True, 1.0, 0.1, 3.0, 1.0, pools(1, 10), active_serving_ms=7.0)
    assert down.next(True, 1.0, 0.1, 4.5, 1.0, pools(11, 20), active_serving_ms=7.0).serving_ms == 4.5  # the lesser
    # the service-time factor crosses nothing alone here: its noise does not restart the count
    assert up.next(True, 1.08, 0.1, 11.5, 1.0, pools(11, 20), active_serving_ms=7.0).count == 2


# ---------------------------------------------------------------- the serving path from the SLI


def sli(key, node, residual, replicas, profile=PROFILE, n=6):
    from controller.recalibrate import SliWindow, replica_p99_ms, with_serving

    base = replica_p99_ms(
        with_serving(profile, "accel_sim", 0.0, beyond_sli_ms=0.0), next(r for r in replicas if r.key == key)
    )
    return [SliWindow(key, node, base + residual, base + residual / 2, 0.5, 1.0) for _ in range(n)]


def test_serving_estimate_needs_evidence_and_a_majority_of_nodes_to_raise():
    from controller.recalibrate import serving_estimate

    replicas = placed_replicas(plan_of(placement("a"), placement("b")), "CPU", "accel_sim")
    one = sli("a#0", "n1", 8.0, replicas, n=3)
    assert not serving_estimate(PROFILE, "accel_sim", replicas, one, min_windows=5, tolerance_ms=1.0).changed
    split = sli("a#0", "n1", 8.0, replicas) + sli("b#0", "n2", 0.0, replicas)
    held = serving_estimate(PROFILE, "accel_sim", replicas, split, min_windows=5, tolerance_ms=1.0)
    assert not held.changed and "a raise needs most nodes" in held.text  # one node of two cannot move it
    both = sli("a#0", "n1", 8.0, replicas) + sli("b#0", "n2", 6.0, replicas)
    raised = serving_estimate(PROFILE, "accel_sim", replicas, both, min_windows=5, tolerance_ms=1.0)
    assert raised.changed and raised.serving_p99_ms == pytest.approx(8.0, rel=1e-6)  # below no node's SLI
    assert (raised.agreeing, raised.nodes, raised.attribution) == (2, 2, "serving path")


def test_serving_estimate_holds_while_tritons_compute_moves_within_its_windows():
    """Right after the model slows, the windows' p99 less the batch p99 at the old service time is the slowdown,
    not the serving path: the term holds until the compute settles, then moves as before."""
    from controller.recalibrate import compute_shift, serving_estimate

    replicas = placed_replicas(plan_of(placement("a")), "CPU", "accel_sim")
    windows = sli("a#0", "n1", 30.0, replicas, n=8)
    slowed = [replace(w, compute_ms=1.0 if k < 4 else 2.0) for k, w in enumerate(windows)]  # 2x in the newer half
    assert compute_shift(slowed) == pytest.approx(2.0)
    held = serving_estimate(PROFILE, "accel_sim", replicas, slowed, min_windows=5, tolerance_ms=1.0)
    assert not held.changed and "compute per request moved x2.00" in held.text
    noisy = [replace(w, compute_ms=(1.0, 1.2, 0.9, 1.1)[k % 4]) for k, w in enumerate(windows)]  # noise, no step
    assert compute_shift(noisy) is None
    assert serving_estimate(PROFILE, "accel_sim", replicas, noisy, min_windows=5, tolerance_ms=1.0).changed


def test_serving_estimate_lowers_only_when_every_node_shows_it_and_never_below_any():
    from controller.recalibrate import serving_estimate, with_serving

    replicas = placed_replicas(plan_of(placement("a"), placement("b")), "CPU", "accel_sim")
    high = with_serving(PROFILE, "accel_sim", 10.0)
    one_low = sli("a#0", "n1", 2.0, replicas) + sli("b#0", "n2", 9.5, replicas)
    assert not serving_estimate(high, "accel_sim", replicas, one_low, min_windows=5, tolerance_ms=1.0).changed
    all_low = sli("a#0", "n1", 2.0, replicas) + sli("b#0", "n2", 3.0, replicas)
    lowered = serving_estimate(high, "accel_sim", replicas, all_low, min_windows=5, tolerance_ms=1.0)
    assert lowered.changed and lowered.serving_p99_ms == pytest.approx(3.0, rel=1e-6)
    queued = [replace(w, p50_ms=w.queue_ms + w.compute_ms) for w in sli("a#0", "n1", 8.0, replicas)]
    assert serving_estimate(PROFILE, "accel_sim", replicas, queued, min_windows=5, tolerance_ms=1.0).attribution == (
        "queueing"
    )


def test_recalibrating_the_serving_term_keeps_what_clients_see_beyond_the_sli_windows():
    from controller.recalibrate import SliWindow, replica_p99_ms, serving_estimate, with_serving

    replicas = placed_replicas(plan_of(placement("a")), "CPU", "accel_sim")
    # the profile: 6 ms of serving path as the SLI windows show it, and 2.5 ms more that clients see beyond them
    measured = with_serving(PROFILE, "accel_sim", 6.0, beyond_sli_ms=2.5)
    batch = replica_p99_ms(with_serving(PROFILE, "accel_sim", 0.0, beyond_sli_ms=0.0), replicas[0])
    assert replica_p99_ms(measured, replicas[0]) == pytest.approx(batch + 8.5, rel=1e-9)
    # what the SLI windows should show of it (the loop's "clients see more than predicted" compares with this)
    assert replica_p99_ms(measured, replicas[0], beyond_sli=False) == pytest.approx(batch + 6.0, rel=1e-9)
    # the SLI windows show a 4 ms serving path; the clients' p99 over all requests is 2.5 ms above that
    windows = [SliWindow("a#0", "n1", batch + 4.0, batch + 2.0, 0.5, 1.0) for _ in range(6)]
    client_p99 = batch + 4.0 + 2.5
    lowered = serving_estimate(measured, "accel_sim", replicas, windows, min_windows=5, tolerance_ms=1.0)
    assert lowered.changed and lowered.serving_p99_ms == pytest.approx(4.0, rel=1e-6)  # learnt from the SLI alone
    candidate = with_serving(measured, "accel_sim", lowered.serving_p99_ms)
    assert candidate.model("accel_sim").beyond_sli_p99_ms == 2.5  # kept
    assert replica_p99_ms(candidate, replicas[0]) == pytest.approx(client_p99, rel=1e-6)  # still what clients see
    # windows that show exactly the prediction less the part beyond them move nothing
    held = serving_estimate(candidate, "accel_sim", replicas, windows, min_windows=5, tolerance_ms=1.0)
    assert not held.changed


def test_a_window_of_few_requests_counts_only_for_its_pool():
    """A window handed over only for its pool (`counted` False): its own p99, read from a few requests, is
    evidence nowhere. Six of them with no pool are not the five windows the term needs, and beside counted
    windows they move neither the median nor what clients are seen to see."""
    from controller.recalibrate import SliWindow, replica_p99_ms, serving_estimate, sli_seen_ms, with_serving

    replicas = placed_replicas(plan_of(placement("a")), "CPU", "accel_sim")
    profile = with_serving(PROFILE, "accel_sim", 6.0, beyond_sli_ms=0.0)
    batch = replica_p99_ms(with_serving(PROFILE, "accel_sim", 0.0, beyond_sli_ms=0.0), replicas[0])
    few = [SliWindow("a#0", "n1", batch + 40.0, batch + 2.0, 0.5, 1.0, counted=False) for _ in range(6)]
    held = serving_estimate(profile, "accel_sim", replicas, few, min_windows=5, tolerance_ms=1.0)
    assert not held.changed and "0 SLI window(s), needs 5" in held.text
    counted = [SliWindow("a#0", "n1", batch + 4.0, batch + 2.0, 0.5, 1.0) for _ in range(5)]
    lowered = serving_estimate(profile, "accel_sim", replicas, few + counted, min_windows=5, tolerance_ms=1.0)
    assert lowered.changed and lowered.serving_p99_ms == pytest.approx(4.0, rel=1e-6)
    assert sli_seen_ms(few + counted, "a#0", 0.0) == pytest.approx(batch + 4.0, rel=1e-9)


def test_a_replica_moved_to_another_node_is_read_from_its_newest_pool_there():
    """Windows of few requests on the node a replica left (counted False, each with a pool) and windows on the
    node it runs on now, whose pool is the newest: the estimate reads the new node's pool, one node and its 10
    windows (fails with an IndexError when the old node is asked for the median of counted windows it has none of)."""
    from controller.recalibrate import SliWindow, replica_p99_ms, serving_estimate, with_serving

    replicas = placed_replicas(plan_of(placement("a")), "CPU", "accel_sim")
    profile = with_serving(PROFILE, "accel_sim", 6.0, beyond_sli_ms=0.0)
    batch = replica_p99_ms(with_serving(PROFILE, "accel_sim", 0.0, beyond_sli_ms=0.0), replicas[0])

    def window(node, seq, counted):
        return SliWindow("a#0", node, batch + 4.0, batch + 2.0, 0.5, 1.0, batch + 15.0, 10, 150, seq, counted)

    windows = [window("n1", seq, False) for seq in range(10, 15)] + [window("n2", seq, True) for seq in range(10, 15)]
    raised = serving_estimate(profile, "accel_sim", replicas, windows, min_windows=5, tolerance_ms=1.0)
    assert raised.changed and raised.serving_p99_ms == pytest.approx(15.0, rel=1e-6)
    assert (raised.nodes, raised.windows) == (1, 10)


def bursty(replicas, key="a#0", node="n1", pooled=True, windows=10, pooled_windows=10):
    """A replica's windows on a loaded machine: 4 ms of serving path in most windows' p99, one window stalled
    (40 ms), and the clients' p99 over all their requests (the pooled p99) 15 ms above the batch."""
    from controller.recalibrate import SliWindow, replica_p99_ms, with_serving

    batch = replica_p99_ms(
        with_serving(PROFILE, "accel_sim", 0.0, beyond_sli_ms=0.0), next(r for r in replicas if r.key == key)
    )
    out = [SliWindow(key, node, batch + (40.0 if i == 6 else 4.0), batch + 2.0, 0.5, 1.0) for i in range(windows)]
    if pooled:
        out[-1] = replace(out[-1], pooled_p99_ms=batch + 15.0, pooled_windows=pooled_windows, pooled_count=300)
    return batch, out


def test_serving_estimate_learns_a_burst_the_windows_median_hides_from_the_pooled_p99():
    from controller.recalibrate import replica_p99_ms, serving_estimate, with_serving

    replicas = placed_replicas(plan_of(placement("a")), "CPU", "accel_sim")
    # the profile: 6 ms of serving path as the windows show it, 2.5 ms beyond them (what profile run measured)
    measured = with_serving(PROFILE, "accel_sim", 6.0, beyond_sli_ms=2.5)
    batch, windows = bursty(replicas)
    learnt = serving_estimate(measured, "accel_sim", replicas, windows, min_windows=5, tolerance_ms=1.0)
    assert learnt.changed and learnt.pooled and "pooled p99s (a#0 10 windows/300 requests)" in learnt.text
    # the term holds what clients saw over the pooled windows; beyond_sli_p99_ms would count the burst twice
    assert learnt.serving_p99_ms == pytest.approx(15.0, rel=1e-6) and learnt.beyond_sli_p99_ms == 0.0
    candidate = with_serving(measured, "accel_sim", learnt.serving_p99_ms, beyond_sli_ms=learnt.beyond_sli_p99_ms)
    assert replica_p99_ms(candidate, replicas[0]) >= batch + 15.0 - 1e-6  # covers the clients' pooled p99
    # an old agent's windows (no pool): as before, the median of the windows (4 ms), the profile's 2.5 ms kept
    _, old = bursty(replicas, pooled=False)
    before = serving_estimate(measured, "accel_sim", replicas, old, min_windows=5, tolerance_ms=1.0)
    assert before.changed and not before.pooled and before.serving_p99_ms == pytest.approx(4.0, rel=1e-6)
    assert before.beyond_sli_p99_ms == 2.5 and "the median of the windows' p99s" in before.text
    # a pool shorter than the evidence the loop needs is no pool
    _, short = bursty(replicas, pooled_windows=3)
    assert not serving_estimate(measured, "accel_sim", replicas, short, min_windows=5, tolerance_ms=1.0).pooled


def test_the_pooled_p99_keeps_the_safeguards_votes_tolerance_and_never_below_any_node():
    from controller.recalibrate import serving_estimate, with_serving

    replicas = placed_replicas(plan_of(placement("a"), placement("b")), "CPU", "accel_sim")
    # at 10 ms, one node's pool shows 15 (a burst), the other node's windows (an old agent) a median of 4 ms:
    # a raise needs most nodes (both of two), a lowering all of them
    ten = with_serving(PROFILE, "accel_sim", 10.0, beyond_sli_ms=0.0)
    _, a = bursty(replicas, "a#0", "n1")
    _, b = bursty(replicas, "b#0", "n2", pooled=False)
    held = serving_estimate(ten, "accel_sim", replicas, a + b, min_windows=5, tolerance_ms=1.0)
    assert not held.changed and "a raise needs most nodes" in held.text
    assert "n1 15.00, n2 4.00 ms" in held.text and held.serving_p99_ms == 10.0
    # what clients see outside the batch is the term plus the part beyond the windows: 12 + 3 = 15, as pooled
    same = with_serving(PROFILE, "accel_sim", 12.0, beyond_sli_ms=3.0)
    assert not serving_estimate(same, "accel_sim", replicas, a, min_windows=5, tolerance_ms=1.0).changed
    # a lowering needs every node, and is the largest of them: below no node's pooled p99
    high = with_serving(PROFILE, "accel_sim", 30.0, beyond_sli_ms=2.0)
    _, b_pooled = bursty(replicas, "b#0", "n2")
    b_pooled[-1] = replace(b_pooled[-1], pooled_p99_ms=b_pooled[-1].pooled_p99_ms - 5.0)  # n2: 10 ms
    lowered = serving_estimate(high, "accel_sim", replicas, a + b_pooled, min_windows=5, tolerance_ms=1.0)
    assert lowered.changed and lowered.serving_p99_ms == pytest.approx(15.0, rel=1e-6)
    assert lowered.beyond_sli_p99_ms == 0.0 and lowered.agreeing == 2


def test_a_prediction_lowered_below_the_pooled_p99_is_named_though_the_windows_median_is_low():
    from controller.recalibrate import SliWindow, lowered_below_sli, sli_seen_ms

    windows = [SliWindow("w#0", "n1", 5.0, None, 0.5, 1.0) for _ in range(10)]
    windows[-1] = replace(windows[-1], pooled_p99_ms=18.0, pooled_windows=10, pooled_count=300)
    lower = Move("w#0", 20.0, 10.0, 80.0)
    assert sli_seen_ms(windows, "w#0", 3.0) == 18.0  # the pool, not the median plus the part beyond
    assert lowered_below_sli([lower], windows, 1.0, beyond_sli_ms=3.0) == lower
    assert lowered_below_sli([lower], windows[:-1], 1.0, beyond_sli_ms=3.0) is None  # 5 + 3 <= 10: as before


def test_a_service_time_correction_needs_the_nodes_running_the_model_one_vote_each():
    from controller.recalibrate import nodes_agree

    flood = {"n1": [2.0] * 500, "n2": [1.0, 0.98, 1.01], "n3": [0.99, 1.0]}
    assert nodes_agree(flood, 1.0, 1.9) == (1, 3, False)  # one node's 500 windows are one vote
    assert nodes_agree({"n1": [2.0], "n2": [1.8], "n3": [1.0]}, 1.0, 1.9) == (2, 3, True)  # a majority raises
    assert nodes_agree({"n1": [0.5], "n2": [1.2]}, 2.0, 1.0)[2] is False  # a lowering needs every node
    assert nodes_agree({"n1": [0.5], "n2": [0.6]}, 2.0, 1.1) == (2, 2, True)
    assert nodes_agree({}, 1.0, 2.0) == (0, 0, True)  # no per-node evidence: the estimate stands


def test_a_candidate_that_lowers_a_prediction_below_the_sli_is_named():
    from controller.recalibrate import SliWindow, lowered_below_sli

    def seen(p99):
        return [SliWindow("w#0", "n1", p99, None, 0.5, 1.0) for _ in range(3)]

    lower = Move("w#0", 20.0, 10.0, 80.0)
    assert lowered_below_sli([lower], seen(20.0), 1.0) == lower  # clients see 20 ms: 10 is below it
    assert lowered_below_sli([lower], seen(10.5), 1.0) is None  # within the tolerance
    assert lowered_below_sli([lower], [], 1.0) is None  # no SLI: nothing to stay above
    assert lowered_below_sli([Move("w#0", 10.0, 12.0, 80.0)], seen(20.0), 1.0) is None  # a raise is not held here
    # the windows do not show the model's part beyond them: 10 ms predicted with 3 ms of it is 7 ms in the windows
    assert lowered_below_sli([lower], seen(10.5), 1.0, beyond_sli_ms=3.0) == lower
    assert lowered_below_sli([lower], seen(7.5), 1.0, beyond_sli_ms=3.0) is None


def test_an_applied_floor_a_later_solve_refuses_is_dropped_and_said():
    state, _ = run([over(), over(), over()])
    state, action = step(state, "w#0", fine(share=60.0), 60.0, 10.0, 4.0, GUARD)
    assert action is not None and action.kind == "applied" and state.floor_pct == 60.0
    # a workload added later: the plan with the floor would leave it unplaced, so the plan is made without it
    refused, action = refuse(state, "w#0", "it would leave new unplaced")
    assert action is not None and action.kind == "refused" and "not applied: it would leave new unplaced" in action.text
    assert refused.floor_pct == 0.0 and refused.moves == 1  # the move it made stays counted


def test_a_move_past_the_accuracy_goal_is_one_past_the_wider_of_its_share_and_its_floor():
    assert accuracy_goal_ms(40.0, 0.2, 2.0) == pytest.approx(8.0)  # 20% of 40 ms
    assert accuracy_goal_ms(5.0, 0.2, 2.0) == pytest.approx(2.0)  # the floor: 20% of 5 ms is 1 ms
    small = Move("w#0", 11.3, 9.8, 160.0)  # 1.5 ms: within 2 ms
    far = Move("w#1", 11.3, 7.8, 160.0)  # 3.5 ms down, at 0.9% of the SLO: under any re-plan threshold
    assert past_accuracy([small], 0.2, 2.0) is None
    assert past_accuracy([small, far], 0.2, 2.0) is far
    assert past_accuracy([Move("w#2", 40.0, 47.0, 80.0)], 0.2, 2.0) is None  # 7 ms against 20% of 47 ms
    assert past_accuracy([Move("w#3", 40.0, math.inf, 80.0)], 0.2, 2.0) is None  # unstable: the threshold's


def test_the_least_move_of_independent_pools_is_checked_again_before_it_is_published():
    """`_least_move`: the term an earlier pool's smaller move stands at is a candidate of its own at the service
    time it is published with. It publishes when it still crosses the threshold; it is refused when it no longer
    crosses (the placement moved between the pools), and when it would lower a prediction below what clients
    are seen to see."""
    from controller.config import RecalibrationConfig
    from controller.feedback import _least_move
    from controller.recalibrate import ServingEstimate, SliWindow, replica_p99_ms, with_serving

    replicas = placed_replicas(plan_of(placement("w", slo=80.0)), "CPU", "accel_sim")
    active = with_serving(PROFILE, "accel_sim", 16.0, beyond_sli_ms=0.0)
    predicted = replica_p99_ms(active, replicas[0])
    cfg = RecalibrationConfig(refresh_within_accuracy=False)  # the 10% threshold alone: 8 ms of the 80 ms SLO
    newest = ServingEstimate(46.0, True, 10, 1, 1, "serving path", "serving path 16.00 -> 46.00 ms", pooled=True)
    none_seen: tuple[list[SliWindow], list[SliWindow]] = ([], [])

    def least(term_ms, windows=none_seen, serving=newest):
        return _least_move(term_ms, serving, active, active, "accel_sim", replicas, windows, cfg, 1.0, 0.0)

    raised = least(30.0)  # +14 ms: past the threshold
    assert raised is not None
    candidate, serving, why = raised
    assert serving.serving_p99_ms == 30.0 and "30.00 ms stands, the least move of the independent pools" in serving.text
    assert replica_p99_ms(candidate, replicas[0]) == pytest.approx(predicted + 14.0, abs=1e-6) and "w#0" in why
    assert least(20.0) is None  # +4 ms: under the threshold at this service time
    lowering = replace(newest, serving_p99_ms=0.0, text="serving path 16.00 -> 0.00 ms")
    assert least(4.0, serving=lowering) is not None  # -12 ms, nobody seen above it
    seen = [SliWindow("w#0", "n1", predicted - 2.0, None, 0.5, 1.0) for _ in range(3)]
    assert least(4.0, (seen, seen), lowering) is None  # clients see 10 ms above the lowered prediction
