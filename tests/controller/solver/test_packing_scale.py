"""Packing at fleet scale (issue 16): chunks dealt by mix, packed apart, the same answer every time."""

from __future__ import annotations

import random

import pytest

from controller.solver import GpuType, Problem, solve
from controller.solver import stoke as strategy
from controller.solver.candidates import PointCache, colocate, with_replicas
from controller.solver.random_mix import fleet_workloads
from controller.solver.stoke import DEFAULT_OPTIONS, deal_chunks, pack_chunk, stoke_items
from interference.profile_io import bundled_profile

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
