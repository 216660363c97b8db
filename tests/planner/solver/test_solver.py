from dataclasses import replace

import pytest

from interference.profile_io import bundled_profile
from planner.solver import GpuType, Problem, ProblemError, Workload, plan_from_dict, plan_to_dict, solve
from planner.solver.candidates import PointCache, smallest_latency_ms

V100 = GpuType("V100", 3.06, bundled_profile())
CHECKPOINT = (
    Workload("alexnet", "alexnet", 15, 500),
    Workload("resnet50", "resnet50", 40, 400),
    Workload("vgg19", "vgg19", 60, 200),
)


def placements(plan):
    return {p.name: (p.share_pct, p.batch) for _, p in plan.placements()}


def test_igniter_reproduces_the_published_plan():
    plan = solve(Problem(CHECKPOINT, (V100,)), "igniter")
    assert plan.gpu_count == 1
    assert placements(plan) == {"vgg19": (37.5, 6), "resnet50": (30.0, 8), "alexnet": (10.0, 4)}
    # the plan keeps the real SLO, not the halved one
    assert {p.name: p.slo_ms for _, p in plan.placements()} == {"alexnet": 15, "resnet50": 40, "vgg19": 60}
    # its own rule holds (fill + inference within the SLO); with paced clients, the setting of the
    # published measurement, the batching model agrees
    assert all(p.predicted_worst_ms <= p.slo_ms for _, p in plan.placements())
    paced = solve(Problem(tuple(replace(w, arrivals="constant") for w in CHECKPOINT), (V100,)), "igniter")
    assert placements(paced) == placements(plan) and paced.slo_misses == ()


def test_ffd_names_the_workloads_it_predicts_to_miss():
    heavy = tuple(Workload(f"v{i}", "vgg19", 50, 250) for i in range(3)) + tuple(
        Workload(f"s{i}", "ssd", 90, 120) for i in range(3)
    )
    plan = solve(Problem(heavy, (V100,)), "ffd")
    assert plan.slo_misses, "interference must push some FFD placements over their SLO"
    assert any("predicted to miss" in n for n in plan.notes)
    assert all(g.share_pct <= 100 for g in plan.gpus)
    igniter = solve(Problem(heavy, (V100,)), "igniter")
    assert all(p.predicted_worst_ms <= p.slo_ms for _, p in igniter.placements())


@pytest.mark.parametrize("strategy", ["stoke", "igniter"])
def test_impossible_slo_is_rejected_naming_workload_and_smallest_latency(strategy):
    floor = smallest_latency_ms(PointCache(V100), "vgg19")
    with pytest.raises(ProblemError, match=r"workload 'too-fast'.*vgg19.*needs at least [0-9.]+ ms") as err:
        solve(Problem((Workload("too-fast", "vgg19", 1.5, 10),), (V100,)), strategy)
    assert f"{floor:.2f}" in str(err.value)


@pytest.mark.parametrize("strategy", ["stoke", "igniter"])
def test_a_workload_bigger_than_one_gpu_is_split_into_replicas(strategy):
    plan = solve(Problem((Workload("huge", "resnet50", 60, 5000),), (V100,)), strategy)
    replicas = [p for _, p in plan.placements()]
    assert len(replicas) >= 2 and all(p.replicas == len(replicas) for p in replicas)
    assert sum(p.rate_rps for p in replicas) == pytest.approx(5000)
    if strategy == "stoke":
        assert all(p.meets_slo for p in replicas)
    else:  # iGniter's own rule; its p99 under Poisson arrivals is not its concern
        assert all(p.predicted_worst_ms <= p.slo_ms and p.predicted_throughput_rps >= p.rate_rps for p in replicas)
    assert all(g.share_pct <= 100 for g in plan.gpus)


def test_a_paced_workload_takes_fewer_replicas_where_they_hold_past_the_capacity_edge():
    """Paced feasibility is not monotone in the rate: ssd at 635 req/s (SLO 100 ms) holds on two whole GPUs
    at 317.5 req/s each (batch 16), though one GPU's capacity edge is 295 req/s and 300-315 req/s do not
    hold. Counting replicas from that edge alone took three GPUs (found by test_stoke_plans_are_not_padded)."""
    plan = solve(Problem((Workload("w0", "ssd", 100.0, 635.0, arrivals="constant"),), (V100,)), "stoke")
    assert plan.gpu_count == 2
    assert [p.replicas for _, p in plan.placements()] == [2, 2]


def test_stoke_uses_the_whole_budget_not_half_the_slo():
    # Paced clients (iGniter's setting): one GPU, like iGniter, but batches are sized from the
    # real budget, so at least one workload's fill + inference exceeds half its SLO.
    paced = tuple(replace(w, arrivals="constant") for w in CHECKPOINT)
    plan = solve(Problem(paced, (V100,)), "stoke")
    assert plan.gpu_count == 1
    for _, p in plan.placements():
        assert p.meets_slo
        assert p.predicted_throughput_rps > p.rate_rps
    # Poisson arrivals need headroom against queueing: the plan may take more GPUs, never fewer checks.
    poisson = solve(Problem(CHECKPOINT, (V100,)), "stoke")
    assert all(p.meets_slo for _, p in poisson.placements())


def test_stoke_picks_the_cheaper_gpu_type():
    cheap = GpuType("V100-spot", 0.9, bundled_profile())
    plan = solve(Problem(CHECKPOINT, (V100, cheap)), "stoke")
    assert {g.gpu_type for g in plan.gpus} == {"V100-spot"}
    assert plan.cost_per_hour == pytest.approx(0.9 * plan.gpu_count)


def test_gpu_type_preference_and_count_limit_are_respected():
    limited = GpuType("A", 1.0, bundled_profile(), max_count=1)
    other = GpuType("B", 2.0, bundled_profile())
    workloads = tuple(Workload(f"w{i}", "vgg19", 60, 300) for i in range(4)) + (
        Workload("pinned", "alexnet", 20, 100, gpu_type="B"),
    )
    plan = solve(Problem(workloads, (limited, other)), "stoke")
    assert sum(1 for g in plan.gpus if g.gpu_type == "A") <= 1
    assert any(p.name == "pinned" for g in plan.gpus if g.gpu_type == "B" for p in g.placements)
    with pytest.raises(ProblemError, match="raise max_count"):
        solve(Problem(workloads[:4], (limited,)), "stoke")


def test_stable_replanning_keeps_placements_and_keys():
    workloads = tuple(
        Workload(f"w{i}", m, slo, rate)
        for i, (m, slo, rate) in enumerate(
            [
                ("vgg19", 60, 300),
                ("resnet50", 40, 500),
                ("alexnet", 15, 800),
                ("ssd", 100, 150),
                ("resnet50", 30, 300),
                ("vgg19", 80, 250),
                ("alexnet", 12, 300),
                ("ssd", 120, 100),
                ("vgg19", 70, 120),
            ]
        )
    )
    first = solve(Problem(workloads, (V100,)), "stoke")
    keyed = replace(first, gpus=tuple(replace(g, key=f"node/{i}") for i, g in enumerate(first.gpus)))
    changed = workloads + (Workload("newcomer", "alexnet", 20, 50),)
    second = solve(Problem(changed, (V100,)), "stoke", current=keyed)
    where_before = {p.name: g.key for g in keyed.gpus for p in g.placements}
    where_after = {p.name: g.key for g in second.gpus for p in g.placements}
    for name, key in where_before.items():
        assert where_after[name] == key, f"{name} moved from {key} to {where_after[name]}"
    assert "newcomer" in where_after


def test_plan_json_round_trip_and_shape():
    plan = solve(Problem(CHECKPOINT, (V100,)), "stoke")
    data = plan_to_dict(plan)
    assert set(data) >= {"strategy", "gpu_count", "cost_per_hour", "gpus"}
    assert set(data["gpus"][0]) >= {"gpu_type", "workloads"}
    assert set(data["gpus"][0]["workloads"][0]) >= {
        "name",
        "model",
        "slo_ms",
        "rate_rps",
        "share_pct",
        "batch",
        "predicted_latency_ms",
        "predicted_throughput_rps",
    }
    again = plan_from_dict(data)
    assert placements(again) == placements(plan) and again.gpu_count == plan.gpu_count


def test_bad_problems_are_refused():
    with pytest.raises(ProblemError, match="rate_rps must be a positive number"):
        Workload("w", "alexnet", 10, -5)
    with pytest.raises(ProblemError, match="model 'bert' is not profiled"):
        Problem((Workload("w", "bert", 10, 5),), (V100,))
    with pytest.raises(ProblemError, match="unknown strategy"):
        solve(Problem(CHECKPOINT, (V100,)), "magic")


def test_stoke_options_trade_safety_for_gpus():
    from planner.solver.stoke import StokeOptions

    mix = tuple(
        Workload(f"w{i}", m, slo, rate)
        for i, (m, slo, rate) in enumerate(
            [("vgg19", 60, 150), ("resnet50", 40, 300), ("alexnet", 15, 600), ("ssd", 100, 80)] * 5
        )
    )
    careful = solve(Problem(mix, (V100,)), "stoke", options=StokeOptions(safety_margin=0.3, max_utilisation=0.6))
    bold = solve(Problem(mix, (V100,)), "stoke", options=StokeOptions(safety_margin=0.0, max_utilisation=0.95))
    assert bold.gpu_count < careful.gpu_count
    for plan in (careful, bold):
        assert plan.slo_misses == ()
    with pytest.raises(ProblemError, match="safety_margin must be in"):
        StokeOptions(safety_margin=1.5)
    with pytest.raises(ProblemError, match="takes no options"):
        solve(Problem(mix, (V100,)), "igniter", options=StokeOptions())


def test_spilling_to_another_type_keeps_the_rate_and_numbers_replicas_once():
    cheap = GpuType("A", 1.0, bundled_profile(), max_count=1)
    other = GpuType("B", 2.0, bundled_profile())
    plan = solve(Problem((Workload("w", "resnet50", 40, 1500),), (cheap, other)), "stoke")
    replicas = [p for _, p in plan.placements()]
    assert sum(p.rate_rps for p in replicas) == pytest.approx(1500)
    assert sorted(p.replica for p in replicas) == list(range(len(replicas)))
    assert all(p.replicas == len(replicas) for p in replicas)
    assert sum(1 for g in plan.gpus if g.gpu_type == "A") == 1 and plan.slo_misses == ()


def test_packing_rollback_restores_bins_in_place():
    from planner.solver.candidates import PointCache
    from planner.solver.packing import Packing
    from planner.solver.stoke import best_candidate

    cache = PointCache(V100)
    a, b = (best_candidate(Workload(n, "alexnet", 50, 50), cache, 50) for n in ("a", "b"))
    packing = Packing({"V100": cache}, {"V100": None})
    first = packing.open_bin("V100", [a], [a.min_share])
    packing.checkpoint()
    packing.update(first, first.items + [b], first.shares + [b.min_share])
    packing.open_bin("V100", [b], [b.min_share])
    packing.rollback()
    assert packing.bins == {first.id: first} and first.items == [a] and first.load == a.min_share
    assert [c.id for c in packing.candidates("V100", 0.0)] == [first.id]


def test_colocation_check_agrees_with_the_batching_model():
    """The planner's scalar p99 (table curve of the candidate) equals interference.batching's for the same queue."""
    from interference.batching import ServiceCurve, latency_distribution
    from planner.simulate import service_curve
    from planner.solver.candidates import PointCache, replica_p99_ms
    from planner.solver.stoke import best_candidate

    cache = PointCache(V100)
    for workload in (
        Workload("r", "resnet50", 40, 300),
        Workload("v", "vgg19", 80, 120),
        Workload("a", "alexnet", 20, 900, arrivals="constant"),
    ):
        item = best_candidate(workload, cache, workload.rate_rps)
        prediction = cache.predict([item], [item.min_share])[0]
        placement = plan_from_dict(plan_to_dict(solve(Problem((workload,), (V100,)), "stoke"))).gpus[0].placements[0]
        curve = service_curve(V100.profile, (placement,), 0)
        exact = latency_distribution(
            item.rate_rps,
            item.batch,
            item.queue_delay_ms,
            workload.arrivals,
            ServiceCurve(curve.latency_ms, curve.occupancy_ms),
        )
        assert replica_p99_ms(cache, item, item.min_share, prediction) == pytest.approx(exact.p99_ms, rel=0.02)
        assert placement.predicted_p99_ms == pytest.approx(exact.p99_ms, rel=0.02)
        assert exact.p99_ms <= 0.95 * workload.slo_ms + 1e-6


def test_large_plans_report_a_lower_bound_and_their_gap():
    from planner.solver.random_mix import random_workloads
    from planner.solver.stoke import share_lower_bound

    assert share_lower_bound([60.0, 60.0, 10.0]) == 2  # two over half a GPU never share
    assert share_lower_bound([40.0, 40.0, 40.0]) == 2  # 120% of shares
    assert share_lower_bound([]) == 0
    plan = solve(Problem(random_workloads(40, seed=3), (V100,)), "stoke")
    note = next(n for n in plan.notes if n.startswith("lower bound"))
    bound = int(note.split()[2])
    assert bound <= plan.gpu_count and f"this plan uses {plan.gpu_count}" in note


def test_paced_utilisation_has_its_own_cap():
    from planner.solver.stoke import StokeOptions

    paced = tuple(replace(w, arrivals="constant") for w in CHECKPOINT)
    tight = solve(Problem(paced, (V100,)), "stoke", options=StokeOptions(max_paced_utilisation=0.5))
    assert all(p.rate_rps / p.predicted_throughput_rps <= 0.5 + 1e-9 for _, p in tight.placements())
    with pytest.raises(ProblemError, match="max_paced_utilisation must be in"):
        StokeOptions(max_paced_utilisation=1.5)


def test_a_memory_heavy_model_gets_gpus_of_its_own_and_explain_says_memory_binds():
    from dataclasses import replace

    from interference.profile import DeviceProfile
    from planner.solver.explain import explain

    profile = bundled_profile()
    heavy = replace(profile.model("vgg19"), weights_mib=9000.0)  # a model that fills most of a 16 GB card
    gpu_type = GpuType("V100", 3.06, DeviceProfile(profile.gpu, {**profile.models, "vgg19": heavy}))
    workloads = (Workload("big-a", "vgg19", 100.0, 40.0), Workload("big-b", "vgg19", 100.0, 40.0))
    plan = solve(Problem(workloads, (gpu_type,)), "stoke")
    assert plan.gpu_count == 2  # each alone needs a fraction of a GPU's shares, but not of its memory
    assert all(g.share_pct < 60 and g.memory_mib > 9000 for g in plan.gpus)
    text = "\n".join(explain(Problem(workloads, (gpu_type,)), plan, "big-a").summary)
    assert "memory binds" in text
    light = solve(Problem(workloads, (V100,)), "stoke")
    assert light.gpu_count == 1  # the same workloads with the bundled figures share one GPU


def _with_memory(memory_mib):
    from interference.profile import DeviceProfile

    profile = bundled_profile()
    return GpuType("V100", 3.06, DeviceProfile(replace(profile.gpu, memory_mib=memory_mib), profile.models))


@pytest.mark.parametrize("strategy", ["stoke", "igniter", "ffd"])
def test_a_model_too_big_for_the_gpu_memory_is_refused_naming_memory(strategy):
    # 500 MiB context + 548 MiB weights + 60 MiB activations (vgg19 at batch 1) > 1000 MiB
    with pytest.raises(ProblemError) as err:
        solve(Problem((Workload("big", "vgg19", 100, 40),), (_with_memory(1000.0),)), strategy)
    message = str(err.value)
    assert "workload 'big' does not fit a V100's memory" in message
    assert "needs 1,108 MiB (500 MiB context + 548 MiB weights + 60 MiB activations at its smallest batch" in message
    assert "the V100 has 1,000 MiB; use a GPU type with more memory" in message


def test_stoke_picks_a_batch_that_fits_the_memory_and_igniter_names_the_batch_that_does_not():
    # resnet50: 500 + 98 + 40 x batch MiB; 700 MiB holds batches 1 and 2 only
    workloads = (Workload("vs", "resnet50", 100, 200),)
    plan = solve(Problem(workloads, (_with_memory(700.0),)), "stoke")  # was "does not fit a whole V100"
    assert all(p.batch <= 2 and p.memory_mib <= 700 for _, p in plan.placements())
    with pytest.raises(ProblemError, match=r"needs 998 MiB .*400 MiB activations at batch 10\).*stoke strategy"):
        solve(Problem(workloads, (_with_memory(700.0),)), "igniter")


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("model", "/tmp/victim", "model must be a name"),  # a plan's model becomes a path in the repository
        ("model", "../../etc", "model must be a name"),
        ("name", "\x1b[31mevil", "name must be a name"),
        ("rate_rps", 0, "rate_rps must be a positive number up to"),
        ("batch", 10**9, "batch must be a whole number >= 1 up to 32"),
        ("share_pct", 150, "share_pct must be a positive number up to 100"),
        ("share_pct", -50, "share_pct must be a positive number"),
        ("queue_delay_ms", 1e308, "queue_delay_ms must be a number >= 0 up to"),
        ("arrivals", "bursty", "arrivals must be one of poisson, constant"),
        ("memory_mib", 1e300, "memory_mib must be a number >= 0 up to"),
    ],
)
def test_a_plan_file_is_checked_at_the_boundary(field, value, message):
    data = plan_to_dict(solve(Problem(CHECKPOINT, (V100,)), "stoke"))
    data["gpus"][0]["workloads"][0][field] = value
    with pytest.raises(ProblemError, match=message) as caught:
        plan_from_dict(data, source="p.json")
    assert str(caught.value).startswith("p.json: gpus[0].workloads[0].") and "\x1b" not in str(caught.value)


def test_a_plan_file_refuses_a_replica_twice_bad_notes_and_an_infinite_price():
    data = plan_to_dict(solve(Problem(CHECKPOINT, (V100,)), "stoke"))
    twice = {**data, "gpus": [*data["gpus"], data["gpus"][0]]}
    with pytest.raises(ProblemError, match="a second time"):
        plan_from_dict(twice)
    with pytest.raises(ProblemError, match="notes must be a list"):
        plan_from_dict({**data, "notes": 5})
    data["gpus"][0]["price_per_hour"] = 1e308
    with pytest.raises(ProblemError, match="price_per_hour must be a number >= 0 up to"):
        plan_from_dict(data)
    with pytest.raises(ProblemError, match="price_per_hour must be a number >= 0 up to"):
        GpuType("V100", 1e308, bundled_profile())


def test_a_plan_file_refuses_a_gpu_given_more_than_whole():
    data = plan_to_dict(solve(Problem(CHECKPOINT, (V100,)), "stoke"))
    data["gpus"][0]["workloads"] = [dict(data["gpus"][0]["workloads"][0], share_pct=60.0, replica=r) for r in (0, 1)]
    with pytest.raises(ProblemError, match=r"gpus\[0\] shares add up to 120% > 100%"):
        plan_from_dict(data)
