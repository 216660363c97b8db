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
