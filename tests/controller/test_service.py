"""Unit tests of the protocol-neutral service: real store (tmp SQLite), real solver, fake clock."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from control_helpers import cpu_profile_json

from controller.config import ServiceConfig
from controller.messages import AssignmentError, HeartbeatReport, InvalidArgument, NodeDevice, Observation
from controller.service import ControlService
from controller.store import Store


class Clock:
    def __init__(self, t: float = 1_700_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, s: float) -> None:
        self.t += s


CPU = (NodeDevice(0, "cpu", "cpu", cores=8),)
CONFIG = ServiceConfig(heartbeat_interval_s=1.0, heartbeat_timeout_s=5.0)


def make(tmp_path, clock=None, config=CONFIG):
    clock = clock or Clock()
    svc = ControlService(Store(tmp_path / "stoke.db"), config, clock=clock, tick=clock)
    return svc, clock


def run_for(svc, clock, seconds, step=0.25, alive=()):
    """Let `seconds` pass with the controller running: its clock watch ticks (as the server's thread does),
    and the nodes in `alive` heartbeat every second."""
    end = clock.t + seconds
    beat = clock.t
    while clock.t < end:
        clock.advance(min(step, end - clock.t))
        svc.nodes.watch_clock()
        if clock.t - beat >= 1.0:
            beat = clock.t
            for node in alive:
                svc.heartbeat(HeartbeatReport(node_id=node))


@pytest.fixture
def svc(tmp_path):
    s, clock = make(tmp_path)
    s.upload_profile(cpu_profile_json())
    s.register("node-a", CPU)
    s.register("node-b", CPU)
    s.clock_ = clock
    return s


def wl(name, model="mlp_small", slo=100.0, rate=20.0, **kw):
    return {"name": name, "model": model, "slo_ms": slo, "rate_rps": rate, **kw}


def where(svc):
    """{workload key: (node, device, share, batch)} of the applied plan."""
    return {a.key: (node.node_id, a.device, a.share_pct, a.batch) for node in svc.list_nodes() for a in node.assigned}


def test_store_uses_wal(tmp_path):
    assert Store(tmp_path / "x.db").journal_mode().lower() == "wal"


def test_apply_plans_and_heartbeat_delivers_assignments(svc):
    created, updated, unchanged = svc.apply_workloads([wl("a"), wl("b", "conv_medium", 300, 5)])
    assert (created, updated, unchanged) == (["a", "b"], [], [])
    outcome = svc.reconcile()
    assert outcome is not None and outcome.changed and outcome.plan.revision == 1
    placed = where(svc)
    assert set(placed) == {"a#0", "b#0"}
    node = placed["a#0"][0]
    answer = svc.heartbeat(HeartbeatReport(node_id=node))
    assert answer.registered and answer.revision == 1
    assert "a#0" in {a.key for a in answer.assignments}
    # nothing changed: the next pass does nothing
    assert svc.reconcile() is None
    # same request again: unchanged, no new revision
    assert svc.apply_workloads([wl("a")]) == ([], [], ["a"])
    assert svc.reconcile(force=True).changed is False


def test_a_paced_workload_is_planned_paced_by_the_controller(svc):
    """`arrivals: constant` reaches the plan (a paced replica's p99 and cap differ from a Poisson one's); it was
    dropped, and the controller planned every workload as Poisson while `stoke plan` planned it paced."""
    svc.apply_workloads([wl("paced", arrivals="constant"), wl("poisson")])
    svc.reconcile()
    plan = svc.current_plan().plan
    arrivals = {p.name: p.arrivals for g in plan.gpus for p in g.placements}
    assert arrivals == {"paced": "constant", "poisson": "poisson"}
    assert svc.apply_workloads([wl("paced")]) == ([], ["paced"], [])  # its arrivals changed: an update


def test_bad_workload_names_field_and_stores_nothing(svc):
    with pytest.raises(InvalidArgument) as err:
        svc.apply_workloads([wl("ok"), wl("bad", slo=-3)])
    assert err.value.field == "workloads[1].slo_ms"
    with pytest.raises(InvalidArgument) as err:
        svc.apply_workloads([wl("x", model="nope")])
    assert err.value.field == "workloads[0].model" and "mlp_small" in str(err.value)
    with pytest.raises(InvalidArgument) as err:
        svc.apply_workloads([wl("has space")])
    assert err.value.field == "workloads[0].name"
    assert svc.list_workloads() == ()


def test_bad_profile_refused(svc):
    with pytest.raises(InvalidArgument) as err:
        svc.upload_profile('{"format_version": 1, "gpu": {}}')
    assert err.value.field == "profile_json"
    assert {r.model for r in svc.list_profiles()} == {"tiny_echo", "mlp_small", "conv_medium", "embed_large"}


def test_a_profile_with_a_repeated_key_is_refused(svc):
    text = cpu_profile_json()
    with pytest.raises(InvalidArgument) as err:  # the last "models" won silently
        svc.upload_profile(text[: text.rindex("}")] + ', "models": {}}')
    assert err.value.field == "profile_json"
    assert str(err.value).endswith("profile_json: key 'models' repeated (at the top level); keep one")
    assert {r.model for r in svc.list_profiles()} == {"tiny_echo", "mlp_small", "conv_medium", "embed_large"}


def test_rate_change_moves_only_that_workload_and_unrelated_change_keeps_placements(svc):
    svc.apply_workloads([wl("a", rate=10), wl("b", "embed_large", 100, 10), wl("c", "conv_medium", 300, 5)])
    svc.reconcile()
    before = where(svc)
    svc.apply_workloads([wl("a", rate=400)])
    outcome = svc.reconcile()
    after = where(svc)
    assert after["a#0"] != before["a#0"]
    for key in ("b#0", "c#0"):
        assert after[key][:2] == before[key][:2]  # same node and device
    touched = {k for c in outcome.changes for k in c.start + c.reload + c.move + c.stop}
    assert "a#0" in touched
    # an unrelated new workload: nothing that ran moves
    svc.apply_workloads([wl("d", "tiny_echo", 100, 5)])
    svc.reconcile()
    final = where(svc)
    for key, value in after.items():
        assert final[key] == value


def test_lost_node_is_replanned_and_reconciled_when_back(svc):
    clock = svc.clock_
    svc.apply_workloads([wl("a"), wl("b", "embed_large", 100, 10)])
    svc.reconcile()
    used = {v[0] for v in where(svc).values()}
    victim = sorted(used)[0]
    survivor = ({"node-a", "node-b"} - {victim}).pop()
    run_for(svc, clock, 3)
    svc.heartbeat(HeartbeatReport(node_id=survivor))
    run_for(svc, clock, 3)  # victim silent for 6 s > 5 s timeout
    svc.heartbeat(HeartbeatReport(node_id=survivor))
    outcome = svc.reconcile()
    assert outcome is not None and outcome.changed
    assert {n.node_id: n.state for n in svc.list_nodes()}[victim] == "lost"
    assert {v[0] for v in where(svc).values()} == {survivor}
    assert {w.workload.name: w.state for w in svc.status().workloads} == {"a": "starting", "b": "starting"}
    # back: held (its part of the plan was cut while it was away) until a pass that sees it back has planned
    answer = svc.heartbeat(HeartbeatReport(node_id=victim))
    assert answer.registered and answer.hold and answer.assignments == ()
    assert {n.node_id: n.state for n in svc.list_nodes()}[victim] == "ready"
    svc.reconcile()
    answer = svc.heartbeat(HeartbeatReport(node_id=victim))
    assert answer.registered and not answer.hold


def test_restart_keeps_workloads_and_plan(tmp_path):
    svc, clock = make(tmp_path)
    svc.upload_profile(cpu_profile_json())
    svc.register("node-a", CPU)
    svc.apply_workloads([wl("a"), wl("b", "embed_large", 100, 10)])
    first = svc.reconcile()
    svc.store.close()
    again = ControlService(Store(tmp_path / "stoke.db"), CONFIG, clock=clock, tick=clock)
    assert [w.name for w in again.list_workloads()] == ["a", "b"]
    assert again.current_plan().revision == first.plan.revision
    assert [n.state for n in again.list_nodes()] == ["waiting"]
    assert again.reconcile() is None or not again.reconcile(force=True).changed
    # the agent comes back: re-registers (heartbeat says so), nothing re-planned
    assert again.heartbeat(HeartbeatReport(node_id="node-a")).registered is False
    again.register("node-a", CPU)
    outcome = again.reconcile(force=True)
    assert outcome.changed is False and again.current_plan().revision == first.plan.revision


def test_node_lost_while_waiting_after_restart_must_register_its_real_devices(tmp_path):
    svc, clock = make(tmp_path)
    svc.upload_profile(cpu_profile_json())
    svc.register("node-a", CPU)
    svc.apply_workloads([wl("a")])
    svc.reconcile()
    svc.store.close()
    again = ControlService(Store(tmp_path / "stoke.db"), CONFIG, clock=clock, tick=clock)
    again.register("node-b", CPU)
    run_for(again, clock, 11, alive=["node-b"])  # node-a silent past twice the timeout: waiting -> lost
    again.check_nodes()
    assert [n.state for n in again.list_nodes()] == ["lost", "ready"]
    # its devices are only stand-ins from the stored plan: a heartbeat must not revive them
    assert again.heartbeat(HeartbeatReport(node_id="node-a")).registered is False
    again.register("node-a", CPU)
    assert again.heartbeat(HeartbeatReport(node_id="node-a")).registered is True
    assert [n.state for n in again.list_nodes()] == ["ready", "ready"]


def test_status_merges_observed_figures(svc):
    svc.apply_workloads([wl("a", slo=50)])
    svc.reconcile()
    node = where(svc)["a#0"][0]
    assigned = svc.heartbeat(HeartbeatReport(node_id=node)).assignments
    svc.heartbeat(
        HeartbeatReport(
            node_id=node,
            running=assigned,
            observed=(Observation("a#0", "mlp_small", request_rate_rps=19.5, mean_queue_ms=1.0, mean_compute_ms=2.0),),
        )
    )
    st = svc.status()
    a = st.workloads[0]
    assert a.state == "serving" and a.observed_latency_ms == pytest.approx(3.0)
    assert a.observed_rate_rps == pytest.approx(19.5) and a.slo_attainment is None  # no SLI in the window
    assert st.gpus_in_use == 1 and st.cost_per_hour == pytest.approx(0.10)


def test_a_re_registering_agent_is_not_serving_until_it_reports_what_it_runs(svc):
    # the probe: an agent killed and restarted (a new process) was shown serving from its predecessor's last report
    svc.apply_workloads([wl("a", slo=50)])
    svc.reconcile()
    node = where(svc)["a#0"][0]
    assigned = svc.heartbeat(HeartbeatReport(node_id=node)).assignments
    svc.heartbeat(HeartbeatReport(node_id=node, running=assigned))
    assert svc.status().workloads[0].state == "serving"
    svc.register(node, CPU)  # the new agent
    assert svc.status().workloads[0].state != "serving"
    svc.heartbeat(HeartbeatReport(node_id=node, running=assigned))
    assert svc.status().workloads[0].state == "serving"


def test_pending_when_no_node(tmp_path):
    svc, _ = make(tmp_path)
    svc.upload_profile(cpu_profile_json())
    svc.apply_workloads([wl("a")])
    svc.reconcile()
    st = svc.status()
    assert st.workloads[0].state == "pending" and "no ready node" in st.workloads[0].reason


def test_pending_reason_names_the_ready_types_and_the_profiled_ones(tmp_path):
    # the probe: a profile stored under "cpu-2core" while the node's CPU device resolves to "CPU" said "no ready node"
    svc, _ = make(tmp_path)
    svc.upload_profile(cpu_profile_json(), gpu_type="cpu-2core")
    svc.register("node-a", CPU)
    svc.apply_workloads([wl("a")])
    svc.reconcile()
    reason = svc.status().workloads[0].reason
    assert "ready devices are of type CPU" in reason and "profiled on cpu-2core" in reason, reason
    assert "gpu_types[].match" in reason, reason


def test_device_where_everything_failed_is_blocked_and_replanned(svc):
    clock = svc.clock_
    svc.apply_workloads([wl("a")])
    svc.reconcile()
    node = where(svc)["a#0"][0]
    other = ({"node-a", "node-b"} - {node}).pop()
    first = svc.heartbeat(HeartbeatReport(node_id=node)).revision
    svc.heartbeat(
        HeartbeatReport(node_id=node, errors=(AssignmentError("a#0", "start failed: boom"),), errors_revision=first)
    )
    outcome = svc.reconcile()
    assert outcome is not None and where(svc)["a#0"][0] == other
    assert any("blocked" in e for n in svc.list_nodes() if n.node_id == node for e in n.events)
    # errors of the older revision, reported late, do not block the device the workload moved to
    svc.heartbeat(
        HeartbeatReport(node_id=other, errors=(AssignmentError("a#0", "start failed: boom"),), errors_revision=first)
    )
    assert not any("blocked" in e for n in svc.list_nodes() if n.node_id == other for e in n.events)
    # a failed reload (the old config keeps running): reported as failing, the device is not blocked
    answer = svc.heartbeat(HeartbeatReport(node_id=other))
    old_config = replace(answer.assignments[0], batch=7)
    svc.heartbeat(
        HeartbeatReport(
            node_id=other,
            running=(old_config,),
            errors=(AssignmentError("a#0", "reload failed: bad config"),),
            errors_revision=answer.revision,
        )
    )
    a = svc.status().workloads[0]
    assert a.state == "failing" and "bad config" in a.reason
    assert not any("blocked" in e for n in svc.list_nodes() if n.node_id == other for e in n.events)
    # the block expires: the device is back in the inventory (nothing moves: the plan is stable)
    clock.advance(121)
    svc.heartbeat(HeartbeatReport(node_id=node))
    svc.heartbeat(HeartbeatReport(node_id=other))
    svc.reconcile()
    assert where(svc)["a#0"][0] == other
    assert any("unblocked" in e for n in svc.list_nodes() if n.node_id == node for e in n.events)


def test_short_of_devices_places_what_fits_and_reports_the_rest(tmp_path):
    svc, _ = make(tmp_path)
    svc.upload_profile(cpu_profile_json())
    svc.register("solo", CPU)
    # each needs most of a node: one node holds one of them
    svc.apply_workloads([wl("big1", "conv_medium", 100, 800), wl("big2", "conv_medium", 100, 800)])
    # an SLO no device could meet even alone is refused at apply, as `stoke plan` refuses it (issue 20)
    with pytest.raises(
        InvalidArgument, match=r"workloads\[0\].slo_ms: workload 'impossible' cannot meet its SLO of 0.5"
    ):
        svc.apply_workloads([wl("impossible", "conv_medium", 0.5, 10)], dry_run=True)
    with pytest.raises(InvalidArgument, match="relax the SLO"):
        svc.apply_workloads([wl("impossible", "conv_medium", 0.5, 10)])
    outcome = svc.reconcile()
    pending = dict(outcome.plan.pending)
    placed = {k.split("#")[0] for k in where(svc)}
    assert len(placed) == 1 and placed <= {"big1", "big2"}
    assert "no free CPU device" in pending[({"big1", "big2"} - placed).pop()]
    assert {w.workload.name for w in svc.status().workloads} == {"big1", "big2"}


def test_a_partly_placed_workload_is_degraded_not_serving(tmp_path):
    svc, _ = make(tmp_path)
    svc.upload_profile(cpu_profile_json())
    svc.register("solo", CPU)
    svc.apply_workloads([wl("huge", "conv_medium", 100, 5000)])  # needs several nodes' worth of replicas
    outcome = svc.reconcile()
    assert "huge" in dict(outcome.plan.pending) and any(k.startswith("huge#") for k in where(svc))
    assigned = svc.heartbeat(HeartbeatReport(node_id="solo")).assignments
    svc.heartbeat(HeartbeatReport(node_id="solo", running=tuple(assigned)))
    [status] = svc.status().workloads
    assert status.state == "degraded" and status.reason


def test_store_keeps_recent_plans_and_revisions_keep_counting(tmp_path):
    store = Store(tmp_path / "p.db")
    revisions = [store.add_plan({"gpus": []}, [], [], float(i), keep=3) for i in range(5)]
    assert revisions == [1, 2, 3, 4, 5]
    assert store.plan_count() == 3 and store.latest_plan().revision == 5


def test_names_with_separators_and_unprofiled_pairs_are_refused(svc):
    with pytest.raises(InvalidArgument, match=r"workloads\[0\]\.name"):
        svc.apply_workloads([wl("a:b")])
    # a second GPU type profiling only mlp_small: embed_large pinned to it is refused
    other = json.loads(cpu_profile_json("SMALL"))
    other["models"] = {"mlp_small": other["models"]["mlp_small"]}
    svc.upload_profile(json.dumps(other))
    with pytest.raises(InvalidArgument, match=r"workloads\[0\]\.gpu_type.*not profiled on 'SMALL'"):
        svc.apply_workloads([wl("x", model="embed_large", gpu_type="SMALL")])
    assert not svc.list_workloads()


def serving_config(svc, node):
    """Heartbeat `node` running what it is assigned, so its workloads serve."""
    assigned = svc.heartbeat(HeartbeatReport(node_id=node)).assignments
    svc.heartbeat(HeartbeatReport(node_id=node, running=assigned))


def test_readme_small_clusters_two_nodes_one_silent_is_unconfirmed_then_lost_and_replanned(svc):
    """README, "The reconcile loop": in a cluster of two, one silent node is half, not more than half: it is
    unconfirmed in the status view until the heartbeat timeout, then lost and its workloads re-planned."""
    clock = svc.clock_
    svc.apply_workloads([wl("a", slo=50), wl("b", "embed_large", 100, 10)])
    svc.reconcile()
    for node in ("node-a", "node-b"):
        serving_config(svc, node)
    victim = where(svc)["a#0"][0]
    survivor = ({"node-a", "node-b"} - {victim}).pop()
    assert {w.workload.name: w.state for w in svc.status().workloads}["a"] == "serving"
    run_for(svc, clock, 3, alive=[survivor])  # silent for 3 s: more than 2.5 heartbeats, less than the timeout
    a = {w.workload.name: w for w in svc.status().workloads}["a"]
    assert a.state == "unconfirmed" and f"no heartbeat from {victim}" in a.reason
    run_for(svc, clock, 3, alive=[survivor])  # past the 5 s timeout
    svc.reconcile()
    assert {n.node_id: n.state for n in svc.list_nodes()}[victim] == "lost"  # not held: one of two is not most
    assert {v[0] for v in where(svc).values()} == {survivor}
    assert not svc.status().alerts


def test_readme_small_clusters_the_only_node_falling_silent_holds_the_plan(tmp_path):
    """README: in a cluster of one node, its silence is more than half of the nodes: the plan is held."""
    svc, clock = make(tmp_path)
    svc.upload_profile(cpu_profile_json())
    svc.register("node-a", CPU)
    svc.apply_workloads([wl("a", slo=50)])
    svc.reconcile()
    serving_config(svc, "node-a")
    run_for(svc, clock, 6)
    svc.reconcile()
    assert {n.node_id: n.state for n in svc.list_nodes()} == {"node-a": "silent"}
    assert where(svc)["a#0"][0] == "node-a" and svc.status().alerts


def _with_serving_path(ms: float) -> str:
    """The demo CPU profile whose models' serving path outside the batch is `ms` (p99): what the closed loop or a
    re-profile learns when clients are slower than the batch alone."""
    from control_helpers import cpu_profile

    from interference.profile import DeviceProfile
    from interference.profile_io import profile_to_dict

    profile = cpu_profile()
    models = {name: replace(m, serving_p99_ms=ms) for name, m in profile.models.items()}
    return json.dumps(profile_to_dict(DeviceProfile(profile.gpu, models)))


def test_a_serving_workload_whose_slo_can_no_longer_be_promised_keeps_serving_best_effort(svc):
    svc.apply_workloads([wl("a", slo=40.0)])
    svc.reconcile()
    placed = where(svc)
    assert set(placed) == {"a#0"}
    # the serving path turns out to take 45 ms: a 40 ms SLO cannot be promised any more
    svc.upload_profile(_with_serving_path(45.0))
    outcome = svc.reconcile()
    reason = dict(outcome.plan.pending)["a"]
    assert "keeps serving" in reason and "40 ms SLO" in reason, reason
    assert set(where(svc)) == {"a#0"}  # still placed: dropping it would fail every request
    node = where(svc)["a#0"][0]
    assigned = svc.heartbeat(HeartbeatReport(node_id=node)).assignments
    assert [a.slo_ms for a in assigned] == [40.0]  # the agents' SLI still judges it by its own SLO
    svc.heartbeat(HeartbeatReport(node_id=node, running=tuple(assigned)))
    [status] = svc.status().workloads
    assert status.state == "degraded" and "best effort" in status.reason
    assert svc.reconcile() is None  # level-based: the same inputs, nothing to do
    # a new workload at the same SLO is not started best effort: it is pending, as before
    svc.apply_workloads([wl("a", slo=40.0), wl("b", slo=40.0)])
    svc.reconcile()
    states = {s.workload.name: s for s in svc.status().workloads}
    assert states["a"].state == "degraded" and states["b"].state == "pending"
    assert "keeps serving" not in states["b"].reason and set(where(svc)) == {"a#0"}
    # past 10x its SLO a serving workload is pending too
    svc.upload_profile(_with_serving_path(500.0))
    svc.reconcile()
    states = {s.workload.name: s for s in svc.status().workloads}
    assert states["a"].state == "pending" and "keeps serving" not in states["a"].reason and not where(svc)


def test_a_best_effort_workload_is_stretched_further_before_its_neighbour_loses_the_device(tmp_path):
    """`make run` on a slow host: the closed loop learnt serving paths of 84 ms (photo-tagging, SLO 60: best
    effort) and 77 ms (product-search, SLO 160). At its first stretch (90 ms) photo-tagging leaves no room for
    its neighbour's interference on the one device, and stretching the neighbour does not help: product-search
    went pending and its requests failed. The best-effort workload is stretched further instead; both keep the
    device, the neighbour within its own SLO."""
    from pathlib import Path

    from interference.profile import DeviceProfile
    from interference.profile_io import load_profile, profile_to_dict
    from interference.recalibration import Correction, apply_corrections

    base = load_profile(Path(__file__).resolve().parents[2] / "interference" / "data" / "cpu-2core-profile.json")
    svc, _ = make(tmp_path)
    svc.upload_profile(json.dumps(profile_to_dict(base)), base.gpu.name)
    svc.register("local", (NodeDevice(0, "cpu", "cpu", cores=2, gpu_type=base.gpu.name),))
    svc.apply_workloads(
        [
            wl("photo-tagging", "mlp_small", slo=60.0, rate=20.0),
            wl("product-search", "conv_medium", slo=160.0, rate=16.0),
        ]
    )
    svc.reconcile()
    assert set(where(svc)) == {"photo-tagging#0", "product-search#0"}
    learnt = {"mlp_small": (1.652, 84.47), "conv_medium": (2.233, 76.93)}  # (service time factor, serving p99 ms)
    slower = apply_corrections(base, {m: Correction(m, "scale", f, f, 0, 0, 0, 0, 0) for m, (f, _) in learnt.items()})
    models = {
        name: replace(m, serving_p99_ms=learnt[name][1], beyond_sli_p99_ms=0.0) if name in learnt else m
        for name, m in slower.models.items()
    }
    svc.upload_profile(json.dumps(profile_to_dict(DeviceProfile(slower.gpu, models))), base.gpu.name)
    outcome = svc.reconcile()
    assert set(where(svc)) == {"photo-tagging#0", "product-search#0"}  # neither lost the device
    pending = dict(outcome.plan.pending)
    assert set(pending) == {"photo-tagging"} and "keeps serving" in pending["photo-tagging"], pending
    placed = {p.name: p for g in svc.current_plan().plan.gpus for p in g.placements}
    assert placed["product-search"].slo_ms == 160.0 and placed["product-search"].predicted_p99_ms <= 160.0


def test_a_serving_workload_the_ready_devices_can_no_longer_hold_keeps_serving_best_effort(tmp_path):
    """The serving path grows (2 -> 5.5 ms) so that two workloads sharing the only device need more than it
    has: the one a plan without the device limit would move to a device there is none of keeps serving,
    stretched, instead of going pending (every request of it would fail). A new workload is not squeezed in."""
    svc, _ = make(tmp_path)
    svc.upload_profile(_with_serving_path(2.0))
    svc.register("node-a", CPU)
    svc.apply_workloads([wl("a", slo=8.0, rate=800.0), wl("b", slo=8.0, rate=800.0)])
    svc.reconcile()
    assert set(where(svc)) == {"a#0", "b#0"}
    svc.upload_profile(_with_serving_path(5.5))
    outcome = svc.reconcile()
    assert set(where(svc)) == {"a#0", "b#0"}  # neither lost its device
    [(name, reason)] = outcome.plan.pending
    assert "keeps serving" in reason and "8 ms SLO" in reason and "ready devices cannot hold it" in reason, reason
    assigned = svc.heartbeat(HeartbeatReport(node_id="node-a")).assignments
    assert {a.slo_ms for a in assigned} == {8.0}  # judged by its own SLO
    svc.heartbeat(HeartbeatReport(node_id="node-a", running=tuple(assigned)))
    states = {s.workload.name: s for s in svc.status().workloads}
    assert states[name].state == "degraded" and "best effort" in states[name].reason
    assert svc.reconcile() is None  # level-based
    # a new workload that does not fit waits for a device; it takes none from those that serve
    svc.apply_workloads([wl("a", slo=8.0, rate=800.0), wl("b", slo=8.0, rate=800.0), wl("c", slo=8.0, rate=800.0)])
    outcome = svc.reconcile()
    assert set(where(svc)) == {"a#0", "b#0"}
    assert "no free" in dict(outcome.plan.pending)["c"]
