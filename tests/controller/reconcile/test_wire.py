"""The solver worker's pipe (`controller.reconcile.wire`): what the other end holds travels as its number."""

from __future__ import annotations

import math
import pickle
from dataclasses import replace

import pytest

from controller.reconcile.wire import MAX_HELD, Channel, linked
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


def test_objects_handed_back_travel_as_their_first_senders_number_and_arrive_as_its_own():
    """The controller sends back the plan the worker answered: with each process's two ends linked, those GPUs go
    as the worker's own numbers (an echo) and the worker gets its own objects, not equal copies."""
    worker_sends, worker_receives = linked()  # each process links its two ends
    controller_sends, controller_receives = linked()
    v100 = default_gpu_types()[0]
    answered = solve(Problem(tuple(fleet_workloads(200, seed=8)), (v100,)), "stoke")
    got = controller_receives.loads(worker_sends.dumps(answered))
    rekeyed = replace(got, gpus=(replace(got.gpus[0], key="node-1/0"), *got.gpus[1:]))  # a GPU bound to a slot
    handed_back = controller_sends.dumps(rekeyed)
    unlinked = Channel().dumps(rekeyed)  # the same plan from a channel without the link: copies by value
    assert len(handed_back) < len(unlinked) / 10
    back = worker_receives.loads(handed_back)
    assert back == rekeyed
    assert all(a is b for a, b in zip(back.gpus[1:], answered.gpus[1:]))  # the worker's own objects
    assert all(a is b for a, b in zip(back.gpus[0].placements, answered.gpus[0].placements))
    # the worker answering with what it was given sends the controller's own objects back
    again = controller_receives.loads(worker_sends.dumps(back))
    assert again.gpus[0] is rekeyed.gpus[0] and all(a is b for a, b in zip(again.gpus[1:], got.gpus[1:]))


def test_an_echo_of_a_number_this_end_never_sent_is_refused():
    a_sends, a_receives = linked()
    b_sends, b_receives = linked()
    workload = fleet_workloads(1, seed=2)[0]
    b_receives._received[id(workload)] = 7  # as if a had sent it as number 7, which it never did
    with pytest.raises(pickle.UnpicklingError, match="never sent"):
        a_receives.loads(b_sends.dumps(workload))
