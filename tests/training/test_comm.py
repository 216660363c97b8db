"""Gradient block planner, push/pull simulator and Kubernetes rendering."""

from __future__ import annotations

import json

import pytest

from training import readers
from training.blocks import (
    Gradient,
    GradientProfile,
    Partition,
    find_steps,
    gradient_profile_from_dict,
    plan_blocks,
    take_block,
)
from training.comm_sim import SCHEDULERS, compare, simulate
from training.kube import render_manifests, validate_manifests
from training.models import TrainingError
from training.spec import TrainingPlan


@pytest.fixture(scope="module", params=["resnet50", "vgg19"])
def shipped(request):
    data, source = readers.read_gradient_profile(None, request.param)
    return gradient_profile_from_dict(data, source)


def tiny(latency=0.0, **kw) -> GradientProfile:
    grads = (
        Gradient("l0", 0, 1_000_000, 10.0, 1.0),
        Gradient("l1", 1, 2_000_000, 4.0, 2.0),
        Gradient("l2", 2, 3_000_000, 1.0, 3.0),
    )
    base = dict(
        name="tiny",
        bandwidth_mb_s=1000.0,
        latency_ms=latency,
        partition_bytes=1_000_000,
        credit_bytes=2_000_000,
        backward_ms=10.0,
        gradients=grads,
    )
    base.update(kw)
    return GradientProfile(**base)


def test_steps_split_at_large_gaps():
    steps = find_steps([0.0, 0.1, 0.2, 5.0, 5.1, 9.0])
    assert [s.gradients for s in steps] == [(2, 1, 0), (4, 3), (5,)] or [sorted(s.gradients) for s in steps] == [
        [0, 1, 2],
        [3, 4],
        [5],
    ]
    assert steps[0].gap_ms == pytest.approx(4.8)
    assert steps[-1].gap_ms == 0.0


def test_take_block_keeps_priority_order_and_budget():
    pending = [Partition(0, 0, 4), Partition(1, 0, 4), Partition(1, 1, 4), Partition(2, 0, 4)]
    block = take_block(pending, 9)
    assert [(p.gradient, p.index) for p in block] == [(0, 0), (1, 0)]
    assert [(p.gradient, p.index) for p in pending] == [(1, 1), (2, 0)]
    assert take_block(pending, 1) == [Partition(1, 1, 4)]  # at least one partition
    pending = [Partition(0, 0, 4), Partition(1, 0, 4)]
    cut = take_block(pending, 6, min_piece=1)  # cut to fill the budget exactly
    assert sum(p.bytes for p in cut) == 6 and pending == [Partition(1, 0, 2)]


def test_plan_blocks_sends_every_byte_once(shipped):
    blocks = plan_blocks(shipped)
    sent: dict[int, int] = {}
    for b in blocks:
        for p in b.partitions:
            sent[p.gradient] = sent.get(p.gradient, 0) + p.bytes
    assert sent == {g.priority: g.bytes for g in shipped.gradients}
    during = [b for b in blocks if b.send_ms < shipped.backward_ms]
    assert during and all(b.bytes <= max(b.budget_bytes, shipped.partition_bytes) + 1 for b in during)


def test_single_gradient_iteration_by_hand():
    grads = (Gradient("only", 0, 5_000_000, 2.0, 3.0),)
    prof = GradientProfile("one", 1000.0, 0.5, 1_000_000, 8_000_000, 2.0, grads)
    fifo = simulate(prof, "fifo")
    # push 0.5 + 5 ms, pull 0.5 + 5 ms after backward (2 ms), then forward 3 ms
    assert fifo.iteration_ms == pytest.approx(2 + 5.5 + 5.5 + 3)
    assert fifo.gpu_idle_ms == pytest.approx(11.0)
    assert fifo.messages == 1
    assert simulate(prof, "priority").messages == 5


def test_priority_beats_fifo_on_reversed_arrivals():
    prof = tiny()
    fifo, prio = simulate(prof, "fifo"), simulate(prof, "priority")
    assert prio.iteration_ms <= fifo.iteration_ms
    assert all(r.compute_ms == pytest.approx(16.0) for r in (fifo, prio))


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_every_scheduler_delivers_everything(shipped, scheduler):
    result = simulate(shipped, scheduler)
    assert result.iteration_ms >= result.compute_ms - 1e-9
    assert 0 < result.link_utilisation <= 1
    assert result.gpu_idle_ms == pytest.approx(result.iteration_ms - result.compute_ms)


def test_block_planner_beats_fifo_and_priority_on_shipped_profiles(shipped):
    results = {r.scheduler: r for r in compare(shipped)}
    assert results["priority"].iteration_ms < results["fifo"].iteration_ms
    assert results["blocks"].iteration_ms < results["priority"].iteration_ms
    assert results["blocks"].messages < results["priority"].messages


def test_profile_errors_name_the_field():
    with pytest.raises(TrainingError, match="layers"):
        gradient_profile_from_dict({"bandwidth_mb_s": 1}, "p.yaml")
    with pytest.raises(TrainingError, match=r"layers\[0\]\.bytes"):
        gradient_profile_from_dict(
            {"bandwidth_mb_s": 1, "layers": [{"bytes": -1, "ready_ms": 0, "forward_ms": 1}]}, "p.yaml"
        )


def _plan() -> TrainingPlan:
    return TrainingPlan(
        strategy="spot",
        job="resnet110-cifar",
        feasible=True,
        counts=(("p3.2xlarge", 2), ("g4dn.4xlarge", 0), ("g3.8xlarge", 3)),
        ps_type="m5.xlarge",
        ps_count=1,
        predicted_time_s=1884.0,
        predicted_cost=1.68,
        deadline_s=1900,
        target_loss=0.9,
    )


def test_kubernetes_manifests_are_well_formed():
    objects = render_manifests(_plan(), gpus_per_type={"p3.2xlarge": 1, "g3.8xlarge": 2})
    assert validate_manifests(objects) == []
    sets = {o["metadata"]["name"]: o for o in objects if o["kind"] == "StatefulSet"}
    assert set(sets) == {"resnet110-cifar-ps", "resnet110-cifar-worker-p3-2xlarge", "resnet110-cifar-worker-g3-8xlarge"}
    g3 = sets["resnet110-cifar-worker-g3-8xlarge"]
    assert g3["spec"]["replicas"] == 3
    pod = g3["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {
        "node.kubernetes.io/instance-type": "g3.8xlarge",
        "karpenter.sh/capacity-type": "spot",
    }
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "2"
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    layout = json.loads(env["STOKE_CLUSTER"])
    assert len(layout["worker"]) == 5 and len(layout["ps"]) == 1  # 2 + 3 worker hosts
    assert sets["resnet110-cifar-ps"]["spec"]["replicas"] == 1


def test_kubernetes_validation_catches_broken_objects():
    objects = render_manifests(_plan())
    objects[1]["spec"]["selector"]["matchLabels"]["stoke/group"] = "other"
    objects[3]["spec"]["serviceName"] = "missing"
    problems = validate_manifests(objects)
    assert any("selector" in p for p in problems) and any("serviceName" in p for p in problems)
