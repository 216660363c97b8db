"""The alternatives `stoke report` compares: plans from the same solver, each keeping its own rule."""

from __future__ import annotations

import pytest

from planner.solver import solve
from planner.solver.alternatives import best_equal_split, equal_split, one_model_per_gpu, slice_counts
from planner.workload_file import load_workloads_file


@pytest.fixture(scope="module")
def problem():
    return load_workloads_file(None).problem()


def test_one_model_per_gpu_gives_every_replica_a_whole_gpu(problem):
    alone = one_model_per_gpu(problem)
    assert alone.plan is not None and alone.misses == ()
    assert all(len(g.placements) == 1 and g.placements[0].share_pct == 100.0 for g in alone.plan.gpus)
    assert alone.gpus >= solve(problem).gpu_count


def test_an_equal_split_runs_one_pod_per_slice_and_pods_carry_the_whole_rate(problem):
    split = equal_split(problem, 2)
    assert split.plan is not None
    for gpu in split.plan.gpus:
        assert len(gpu.placements) <= 2 and sum(p.share_pct for p in gpu.placements) <= 100.0 + 1e-9
    for w in problem.workloads:
        pods = [p for _, p in split.plan.placements() if p.name.rsplit(".", 1)[0] == w.name]
        assert sum(p.rate_rps for p in pods) == pytest.approx(w.rate_rps, rel=1e-9)
        # a pod at more than its slice is one Kubernetes could not give: it is listed as a miss
        assert all(p.share_pct <= 50.0 + 1e-6 for p in pods) or w.name in split.misses


def test_the_best_split_ranks_a_split_that_cannot_serve_last(problem):
    assert slice_counts(problem.inventory) == [2, 4, 5, 8, 10]  # 100/N a whole number of 2.5% steps
    best = best_equal_split(problem)
    tried = dict(best.tried)
    splits = [equal_split(problem, n) for n in slice_counts(problem.inventory)]
    serving = [s.gpus for s in splits if s.plan is not None and not s.misses]
    # the fewest GPUs among the splits that serve every workload (one with misses may use fewer)
    assert serving and best.plan is not None and best.gpus == min(serving)
    assert None in tried.values()  # slices too small for some SLO: those splits cannot serve them
