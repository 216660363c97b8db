"""Packing at fleet scale (issue 16): chunks dealt by mix, packed apart, the same answer every time."""

from __future__ import annotations

import random

import pytest

from interference.profile_io import bundled_profile
from planner.solver import GpuType, Problem, solve
from planner.solver import stoke as strategy
from planner.solver.candidates import PointCache, colocate, with_replicas
from planner.solver.random_mix import fleet_workloads
from planner.solver.stoke import DEFAULT_OPTIONS, deal_chunks, pack_chunk, stoke_items

V100 = GpuType("V100", 3.06, bundled_profile())


def _pairs(count: int, seed: int = 16) -> list:
    cache = PointCache(V100)
    return [
        (item, "V100")
        for w in fleet_workloads(count, seed)
        for item in with_replicas(stoke_items(w, cache, DEFAULT_OPTIONS))
    ]


def test_chunks_deal_every_replica_once_with_the_same_mix_whatever_the_input_order():
    pairs = _pairs(90)
    chunks = deal_chunks(pairs, size=20)
    assert sorted(i.key for c in chunks for i, _ in c) == sorted(i.key for i, _ in pairs)
    assert max(len(c) for c in chunks) <= 20 and max(len(c) for c in chunks) - min(len(c) for c in chunks) <= 1
    # dealt round-robin from one size order: the chunks' largest replicas differ little
    largest = [max(i.min_share for i, _ in c) for c in chunks]
    ordered = sorted((i.min_share for i, _ in pairs), reverse=True)
    assert min(largest) >= ordered[len(chunks) - 1] - 1e-9
    shuffled = pairs[:]
    random.Random(1).shuffle(shuffled)
    assert [[i.key for i, _ in c] for c in deal_chunks(shuffled, size=20)] == [[i.key for i, _ in c] for c in chunks]


def test_a_chunk_packs_within_100_percent_and_never_beats_the_share_bound():
    cache = PointCache(V100)
    chunk = deal_chunks(_pairs(40, seed=3), size=25)[0]
    gpus = pack_chunk({"V100": cache}, chunk)
    assert sorted(i.key for items, _ in gpus for i in items) == sorted(i.key for i, _ in chunk)
    for items, shares in gpus:
        assert sum(shares) <= 100 + 1e-9
        assert colocate(cache, items, shares) is not None  # the shares the chunk keeps meet every target
    assert len(gpus) >= strategy.share_lower_bound([i.min_share for i, _ in chunk])


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr(strategy, "CHUNK_REPLICAS", 15)
    return 15


def test_chunked_plans_keep_every_invariant_and_are_deterministic(small_chunks):
    workloads = fleet_workloads(60, seed=5)
    problem = Problem(workloads, (V100,))
    plan = solve(problem, "stoke")
    assert plan == solve(problem, "stoke")
    # the chunks are dealt from a size order, so the input's order does not matter either
    assert plan == solve(Problem(tuple(reversed(workloads)), (V100,)), "stoke")
    assert plan.slo_misses == ()
    assert all(g.share_pct <= 100 + 1e-9 for g in plan.gpus)
    served: dict[str, float] = {}
    for _, p in plan.placements():
        served[p.name] = served.get(p.name, 0.0) + p.rate_rps
        assert p.predicted_p99_ms <= (1 - DEFAULT_OPTIONS.safety_margin) * p.slo_ms + 1e-6
    assert served == pytest.approx({w.name: w.rate_rps for w in workloads})
    assert any(n.startswith("lower bound") for n in plan.notes)


def test_chunked_plans_stay_close_to_one_packing_of_the_whole(small_chunks, monkeypatch):
    problem = Problem(fleet_workloads(60, seed=7), (V100,))
    chunked = solve(problem, "stoke")
    monkeypatch.setattr(strategy, "CHUNK_REPLICAS", 10_000)
    whole = solve(problem, "stoke")
    # each chunk of 15 replicas may leave one partly filled GPU that the final search cannot empty
    chunks = -(-sum(len(g.placements) for g in whole.gpus) // small_chunks)
    assert chunked.gpu_count <= whole.gpu_count + chunks


def test_a_gpu_count_limit_or_a_current_plan_packs_as_one(small_chunks):
    workloads = fleet_workloads(40, seed=9)
    limited = GpuType("V100", 3.06, bundled_profile(), max_count=10_000)
    plan = solve(Problem(workloads, (limited,)), "stoke")
    assert plan.gpu_count > 0 and plan.slo_misses == ()
    again = solve(Problem(workloads, (V100,)), "stoke", current=plan)
    assert [g.placements for g in again.gpus] == [g.placements for g in plan.gpus]  # nothing moved


def test_a_memo_replans_to_the_same_plan_and_moves_only_the_change():
    from dataclasses import replace

    from planner.solver.stoke import SolveMemo, StokeOptions

    workloads = list(fleet_workloads(40, seed=11))
    memo = SolveMemo()
    plan = solve(Problem(tuple(workloads), (V100,)), "stoke", memo=memo)
    assert plan == solve(Problem(tuple(workloads), (V100,)), "stoke")
    plan = replace(plan, gpus=tuple(replace(g, key=f"gpu{k}") for k, g in enumerate(plan.gpus)))
    for k, factor in ((3, 1.8), (20, 0.4), (3, 0.5)):
        workloads[k] = replace(workloads[k], rate_rps=round(workloads[k].rate_rps * factor, 1))
        problem = Problem(tuple(workloads), (V100,))
        remembered = solve(problem, "stoke", current=plan, memo=memo)
        assert remembered == solve(problem, "stoke", current=plan)  # the memo only saves time

        def cells(p):
            return {(x.name, x.replica): (g.key, x.share_pct, x.batch) for g in p.gpus for x in g.placements}

        before, after = cells(plan), cells(remembered)
        others = {key for key in set(before) | set(after) if key[0] != workloads[k].name}
        moved = {key for key in others if before.get(key) != after.get(key)}
        # the rest stays where it runs: only the changed workload's neighbours (before or after) are re-fitted
        touched = {
            g.key for p in (plan, remembered) for g in p.gpus if any(x.name == workloads[k].name for x in g.placements)
        }
        assert all(before.get(key, (None,))[0] in touched or after.get(key, (None,))[0] in touched for key in moved)
        assert len(moved) <= len(others) // 4
        plan = replace(
            remembered, gpus=tuple(replace(g, key=g.key or f"new{k}-{n}") for n, g in enumerate(remembered.gpus))
        )
    # other options: the memo starts afresh instead of answering for the old ones
    tighter = StokeOptions(safety_margin=0.2)
    assert solve(problem, "stoke", options=tighter, memo=memo) == solve(problem, "stoke", options=tighter)


def test_a_memo_given_back_its_own_plans_replans_as_a_solve_without_it():
    """The controller hands the solver the plan it was answered (the same GPU objects): the memo then takes
    the GPUs whose replicas are unchanged as they were, which must change nothing in the answer."""
    from dataclasses import replace

    from planner.solver.stoke import SolveMemo

    workloads = list(fleet_workloads(60, seed=12))
    memo = SolveMemo()
    plan = solve(Problem(tuple(workloads), (V100,)), "stoke", memo=memo)
    rng = random.Random(5)
    for step in range(8):
        k = rng.randrange(len(workloads))
        factor = (3.0, 0.3, 1.7, 0.5)[step % 4]  # replicas come and go
        workloads[k] = replace(workloads[k], rate_rps=round(workloads[k].rate_rps * factor, 1))
        if step == 5:  # a workload leaves: its GPUs' neighbours are re-fitted
            del workloads[rng.randrange(len(workloads))]
        problem = Problem(tuple(workloads), (V100,))
        given = replace(plan, gpus=plan.gpus[:-1]) if step == 6 else plan  # a GPU lost as well
        remembered = solve(problem, "stoke", current=given, memo=memo)
        assert remembered == solve(problem, "stoke", current=given)
        plan = remembered
    assert memo.reseeded  # the GPUs were taken as they were


def test_the_controller_keeps_one_memo_for_a_solver_that_takes_it():
    from controller.reconcile.budget import remembering

    calls = []

    def with_memo(problem, strategy="stoke", *, current=None, memo=None):
        calls.append(memo)
        return solve(problem, strategy, current=current, memo=memo)

    def without(problem, strategy="stoke", *, current=None):
        return solve(problem, strategy, current=current)

    assert remembering(without) is without
    run = remembering(with_memo)
    problem = Problem(fleet_workloads(5, seed=2), (V100,))
    run(problem, "stoke")
    run(problem, "stoke", current=None)
    assert calls[0] is not None and calls[0] is calls[1]


def test_a_memo_kept_across_solves_starts_a_types_replica_entries_afresh_past_its_bound():
    from planner.solver.stoke import SolveMemo

    problem = Problem(tuple(fleet_workloads(5, seed=3)), (V100,))
    memo = SolveMemo()
    plan = solve(problem, "stoke", memo=memo)
    replicas = memo.replicas["V100"]
    assert len(replicas._items) <= 8 * len(problem.workloads) + 1000
    # what months of demand changes leave behind: a (shape, rate) entry per rate ever planned
    replicas._items.update({(("gone",), 0.1 * k): None for k in range(8 * len(problem.workloads) + 1001)})
    assert solve(problem, "stoke", memo=memo) == plan  # the next solve starts the type's entries afresh
    assert len(memo.replicas["V100"]._items) <= 8 * len(problem.workloads) + 1000


def test_a_memo_takes_again_every_gpu_of_a_plan_given_back_rekeyed(monkeypatch):
    """The controller hands back the plan it was answered with each GPU keyed by its slot (new GPU objects,
    the same placements). Every GPU whose replicas are unchanged is then taken as it was, including those
    whose placements took a replica by its rate, not its number (a workload's replicas numbered in GPU
    order), and the answer is the one without the memo."""
    from dataclasses import replace

    import planner.solver.stoke as stoke
    from planner.solver.stoke import SolveMemo

    # packed in chunks, as a fleet is: a workload's replicas then land in another order than they were made
    monkeypatch.setattr(stoke, "CHUNK_REPLICAS", 15)
    workloads = list(fleet_workloads(60, seed=1))
    memo = SolveMemo()
    plan = solve(Problem(tuple(workloads), (V100,)), "stoke", memo=memo)
    rng = random.Random(7)
    for step in range(6):
        k = rng.randrange(len(workloads))
        workloads[k] = replace(workloads[k], rate_rps=round(workloads[k].rate_rps * (2.5, 0.4)[step % 2], 1))
        problem = Problem(tuple(workloads), (V100,))
        given = replace(plan, gpus=tuple(replace(g, key=f"slot{n}") for n, g in enumerate(plan.gpus)))
        plan = solve(problem, "stoke", current=given, memo=memo)
        assert plan == solve(problem, "stoke", current=given)
    # some GPU holds a replica whose number is not the one its placement carries: the case this is about
    by_number = [
        entry
        for entry in memo.reseeded.values()
        if any(p.replica != key[1] for p, key in zip(entry[0].placements, entry[3]))
    ]
    assert by_number, (
        "no GPU recorded as taken by rate: the memo skips them, or the mix has none (then pick another seed)"
    )
    # the same inputs: the GPUs the last change made are seeded afresh once, then taken as they are
    plan = solve(
        problem,
        "stoke",
        current=replace(plan, gpus=tuple(replace(g, key=f"x{n}") for n, g in enumerate(plan.gpus))),
        memo=memo,
    )
    seeded_afresh = []
    real_seed_gpu = stoke._seed_gpu
    monkeypatch.setattr(stoke, "_seed_gpu", lambda *a: seeded_afresh.append(a[1]) or real_seed_gpu(*a))
    given = replace(plan, gpus=tuple(replace(g, key=f"again{n}") for n, g in enumerate(plan.gpus)))
    again = solve(problem, "stoke", current=given, memo=memo)
    assert seeded_afresh == []  # nothing changed: every GPU taken as it was
    monkeypatch.setattr(stoke, "_seed_gpu", real_seed_gpu)
    assert again == solve(problem, "stoke", current=given)
