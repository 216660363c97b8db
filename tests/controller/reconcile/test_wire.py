"""The solver worker's pipe (`controller.reconcile.wire`): what the other end holds travels as its number."""

from __future__ import annotations

import math
import pickle
from dataclasses import replace

import pytest

from controller.reconcile.wire import MAX_HELD, Channel
from planner.solver import GpuPlan, Problem, solve
from planner.solver.random_mix import fleet_workloads
from planner.workload_file import default_gpu_types


def _pipe() -> tuple[Channel, Channel]:
    return Channel(), Channel()


def test_a_repeated_message_arrives_equal_and_much_smaller_and_as_the_same_objects():
    sender, receiver = _pipe()
    v100 = default_gpu_types()[0]
    problem = Problem(tuple(fleet_workloads(300, seed=5)), (v100,))
    plan = solve(problem, "stoke")
    first = sender.dumps((problem, plan))
    got_problem, got_plan = receiver.loads(first)
    assert got_problem == problem and got_plan == plan
    again = sender.dumps((problem, plan))
    assert len(again) < len(first) / 10  # every workload, GPU and profile goes as its number
    problem2, plan2 = receiver.loads(again)
    assert problem2 == problem and plan2 == plan
    assert all(a is b for a, b in zip(problem2.workloads, got_problem.workloads))
    assert all(a is b for a, b in zip(plan2.gpus, got_plan.gpus))
    assert problem2.inventory[0].profile is got_problem.inventory[0].profile


def test_a_changed_workload_travels_whole_and_an_equal_copy_goes_as_its_number():
    sender, receiver = _pipe()
    workloads = list(fleet_workloads(50, seed=6))
    receiver.loads(sender.dumps(tuple(workloads)))
    workloads[7] = replace(workloads[7], rate_rps=workloads[7].rate_rps * 2)
    copies = [replace(w) for w in workloads]  # equal values, other objects (a controller that re-reads its store)
    got = receiver.loads(sender.dumps(tuple(copies)))
    assert list(got) == workloads
    assert got[7].rate_rps == workloads[7].rate_rps


def test_values_that_never_compare_equal_still_arrive_right():
    sender, receiver = _pipe()
    plan = solve(Problem(tuple(fleet_workloads(20, seed=7)), (default_gpu_types()[0],)), "stoke")
    gpu = plan.gpus[0]
    nan_gpu = replace(gpu, placements=tuple(replace(p, p99_upper_ms=math.nan) for p in gpu.placements))
    for _ in range(3):
        got = receiver.loads(sender.dumps(replace(nan_gpu)))
        assert isinstance(got, GpuPlan) and math.isnan(got.placements[0].p99_upper_ms)
        assert got.placements[0].name == nan_gpu.placements[0].name


def test_the_sender_starts_afresh_past_its_bound_and_the_receiver_follows(monkeypatch):
    import controller.reconcile.wire as wire

    monkeypatch.setattr(wire, "MAX_HELD", 10)
    sender, receiver = _pipe()
    batches = [tuple(fleet_workloads(30, seed=s)) for s in (1, 2, 3)]
    for batch in batches:
        assert receiver.loads(sender.dumps(batch)) == batch
    assert len(sender._held) <= 10 + 4 * 30 + 30
    assert MAX_HELD > 10


def test_a_number_the_receiver_never_got_is_refused_not_guessed():
    sender = Channel()
    workloads = tuple(fleet_workloads(3, seed=8))
    sender.dumps(workloads)
    with pytest.raises(pickle.UnpicklingError, match="never sent"):
        Channel().loads(sender.dumps(workloads))  # a receiver that missed the first message


def test_a_container_naming_a_number_never_sent_is_refused():
    sender = Channel()
    problem = Problem(tuple(fleet_workloads(4, seed=9)), (default_gpu_types()[0],))
    sender.dumps(problem)
    with pytest.raises(pickle.UnpicklingError, match="never sent"):
        Channel().loads(sender.dumps(problem))


def test_only_the_shared_types_are_built_from_their_fields():
    class Other:
        pass

    with pytest.raises(pickle.UnpicklingError, match="not a shared type"):
        Channel()._define(0, Other, {})
