"""Pure plan -> node cut and diff functions."""

from controller.messages import ModelAssignment
from controller.reconcile.diff import classify, diff_assignments
from controller.reconcile.slots import Binding, bind_gpus, node_assignments, slot_keys
from planner.solver import GpuPlan, Placement, Plan


def pl(name, share=10.0, batch=1):
    return Placement(
        name=name,
        model="mlp_small",
        slo_ms=100,
        rate_rps=10,
        share_pct=share,
        batch=batch,
        queue_delay_ms=0.0,
        predicted_latency_ms=5,
        predicted_throughput_rps=100,
    )


def gpu(*names, key=None):
    return GpuPlan("CPU", 0.1, tuple(pl(n) for n in names), key=key)


SLOTS = [Binding("n1", 0, "CPU"), Binding("n2", 0, "CPU"), Binding("n3", 0, "CPU")]


def test_bind_prefers_key_then_overlap_then_free_order():
    previous = {Binding("n2", 0, "CPU"): frozenset({"a#0"}), Binding("n3", 0, "CPU"): frozenset({"b#0"})}
    plan = Plan("stoke", (gpu("x"), gpu("b", "c"), gpu("a", key="n1/0")))
    bound = bind_gpus(plan, SLOTS, previous)
    assert bound == (Binding("n2", 0, "CPU"), Binding("n3", 0, "CPU"), Binding("n1", 0, "CPU"))


def test_bind_never_shares_a_slot_and_reports_shortage():
    plan = Plan("stoke", (gpu("a"), gpu("b"), gpu("c"), gpu("d")))
    bound = bind_gpus(plan, SLOTS)
    assert bound[:3] == tuple(SLOTS) and bound[3] is None
    assert bind_gpus(Plan("stoke", (GpuPlan("V100", 3.0, (pl("a"),)),)), SLOTS) == (None,)


def test_cut_and_diff_classify_like_the_fleet():
    old_plan = Plan("stoke", (gpu("a", "b"),))
    cut = node_assignments(old_plan, (SLOTS[0],))
    assert [a.key for a in cut["n1"]] == ["a#0", "b#0"]
    assert slot_keys(old_plan, (SLOTS[0],)) == {SLOTS[0]: frozenset({"a#0", "b#0"})}
    new_plan = Plan("stoke", (GpuPlan("CPU", 0.1, (pl("a", batch=4), pl("c"))), gpu("b")))
    new_cut = node_assignments(new_plan, (SLOTS[0], SLOTS[1]))
    changes = {c.node_id: c for c in diff_assignments(cut, new_cut)}
    assert changes["n1"].reload == ("a#0",) and changes["n1"].start == ("c#0",) and changes["n1"].stop == ("b#0",)
    assert changes["n2"].start == ("b#0",)
    a = ModelAssignment("a", "m", 0, 10.0, 1, 0.0, 100, 10)
    assert classify(a, a) == "unchanged"
    assert classify(a, ModelAssignment("a", "m", 0, 20.0, 1, 0.0, 100, 10)) == "move"
    assert classify(a, ModelAssignment("a", "m", 1, 10.0, 1, 0.0, 100, 10)) == "move"


def _bind_by_definition(plan, slots, previous):
    """The binding rule read literally (every GPU against every slot): the oracle for `bind_gpus`."""
    free = sorted(set(slots), key=lambda s: (s.node_id, s.device, s.gpu_type))
    bound, taken = [None] * len(plan.gpus), set()
    for i, g in enumerate(plan.gpus):
        for s in free:
            if g.key == f"{s.node_id}/{s.device}" and s.gpu_type == g.gpu_type and s not in taken:
                bound[i] = s
                taken.add(s)
    pairs = []
    for i, g in enumerate(plan.gpus):
        names = {f"{p.name}#{p.replica}" for p in g.placements}
        for s in free:
            if bound[i] is None and s.gpu_type == g.gpu_type and s not in taken and len(names & previous.get(s, set())):
                pairs.append((-len(names & previous[s]), i, (s.node_id, s.device, s.gpu_type), s))
    for _, i, _, s in sorted(pairs):
        if bound[i] is None and s not in taken:
            bound[i] = s
            taken.add(s)
    for i, g in enumerate(plan.gpus):
        for s in free:
            if bound[i] is None and s.gpu_type == g.gpu_type and s not in taken:
                bound[i] = s
                taken.add(s)
    return tuple(bound)


def test_bind_agrees_with_the_rule_read_literally_on_random_plans():
    import random

    rng = random.Random(7)
    for _ in range(200):
        slots = [Binding(f"n{k}", d, rng.choice(["CPU", "GPU"])) for k in range(rng.randint(1, 6)) for d in (0, 1)]
        rng.shuffle(slots)  # in any order (bind_gpus sorts only when it must)
        names = [f"w{k}" for k in range(12)]
        gpus = []
        for _ in range(rng.randint(1, 10)):
            chosen = rng.sample(names, rng.randint(1, 3))
            key = rng.choice([None, None, f"n{rng.randint(0, 6)}/{rng.randint(0, 1)}"])
            gpus.append(GpuPlan(rng.choice(["CPU", "GPU"]), 0.1, tuple(pl(n) for n in chosen), key=key))
        plan = Plan("stoke", tuple(gpus))
        previous = {s: frozenset(f"{n}#0" for n in rng.sample(names, rng.randint(0, 3))) for s in slots}
        expected = _bind_by_definition(plan, slots, previous)
        assert bind_gpus(plan, slots, previous) == expected
        assert bind_gpus(plan, slots, lambda wanted, previous=previous: previous) == expected
        # the map made for the keys of the GPUs left without a slot only binds as the whole one does
        old_gpus = tuple(GpuPlan(s.gpu_type, 0.1, tuple(pl(k[:-2]) for k in keys)) for s, keys in previous.items())
        old_plan = Plan("stoke", old_gpus)
        ran = lambda wanted, old=old_plan, at=tuple(previous): slot_keys(old, at, wanted)  # noqa: E731
        assert bind_gpus(plan, slots, ran) == expected


def test_placement_keys_are_the_replica_keys():
    from controller.messages import Replica
    from controller.reconcile.slots import placement_keys

    g = GpuPlan("CPU", 0.1, (pl("a"), pl("b-2")))
    g = GpuPlan("CPU", 0.1, tuple(p.__class__(**{**vars(p), "replica": k}) for k, p in enumerate(g.placements)))
    assert placement_keys(g) == {str(Replica(p.name, p.replica)) for p in g.placements} == {"a#0", "b-2#1"}
