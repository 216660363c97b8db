"""Verify before serving in the running controller: gRPC on loopback, a real agent loop, a simulated device.

The simulated device is the CPU demo profile's fit made slower (`SLOWDOWN`): the fit is optimistic
at every point, so the point the first plan chooses does not hold once measured. With
`verification.enabled` the plan is held while the node measures it, re-planned on the
measurement, and serves only on measured points; with it off (the default) the first plan serves.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, replace

import pytest
from control_helpers import cpu_profile, cpu_profile_json, wait_for

from agents.agent import Agent
from controller import limits
from controller.api.client import ControllerClient
from controller.config import ConfigError, ControllerConfig, ServiceConfig, VerificationConfig, load_config
from controller.messages import (
    AssignmentError,
    HeartbeatReport,
    InvalidArgument,
    MeasuredPoint,
    MeasureRequest,
    ModelAssignment,
    NodeDevice,
)
from controller.recalibrate import placed_replicas, replica_p99_ms
from controller.server import ControllerServer

pytestmark = pytest.mark.slow  # gRPC servers on loopback: make test-fast skips it

#: The simulated device is this much slower than the fit, everywhere.
SLOWDOWN = 1.6
CPU = (NodeDevice(0, "cpu", "cpu", cores=8),)
WORKLOAD = {"name": "web", "model": "mlp_small", "slo_ms": 12.0, "rate_rps": 150.0}


class SlowDevice:
    """A simulated device: the fit's solo active time times `SLOWDOWN`; records what it measured."""

    def __init__(self, slowdown: float = SLOWDOWN) -> None:
        self.profile = cpu_profile()
        self.slowdown = slowdown
        self.measured: list[tuple[str, int, float, int]] = []
        self.asked = threading.Event()  # a measurement was asked for
        self.go = threading.Event()  # measurements proceed (set by the test; set from the start by default)
        self.go.set()
        self._lock = threading.Lock()

    def truth_ms(self, model: str, batch: int, share: float) -> float:
        return float(self.profile.model(model).active_time_ms(batch, share)) * self.slowdown

    def __call__(self, model: str, device: int, share_pct: float, batch: int, requests: int) -> float:
        self.asked.set()
        assert self.go.wait(30)
        with self._lock:
            self.measured.append((model, device, share_pct, batch))
        return self.truth_ms(model, batch, share_pct)


@dataclass
class ApplyReport:
    errors: tuple = ()


class InstantFleet:
    """A fleet whose assignments serve the moment they are applied (no Triton: the test is the control path)."""

    def __init__(self) -> None:
        self.serving: dict[str, ModelAssignment] = {}
        self.applied: list[tuple[ModelAssignment, ...]] = []

    def refusals(self, assignments):
        return []

    def apply(self, assignments):
        self.applied.append(tuple(assignments))
        self.serving = {a.key: a for a in assignments}
        return ApplyReport()

    def observe(self):
        return []

    def check_health(self):
        return []

    def running(self):
        return list(self.serving.values())

    def close(self):
        self.serving = {}


def start(tmp_path, verification: VerificationConfig):
    config = ControllerConfig(
        listen="127.0.0.1:0",
        metrics_listen="",
        db=str(tmp_path / "c.db"),
        reconcile_interval_s=0.05,
        service=ServiceConfig(
            heartbeat_interval_s=0.1,
            heartbeat_timeout_s=5.0,
            solver_budget_s=0.0,  # solve in process: the test is about the hold, not the worker
            verification=verification,
        ),
    )
    server = ControllerServer(config).start()
    server.service.upload_profile(cpu_profile_json())
    return server


def agent_for(server, measurer):
    fleet = InstantFleet()
    client = ControllerClient(server.address)
    agent = Agent(client, fleet, "node-a", CPU, heartbeat_interval_s=0.1, measurer=measurer, jitter=0.0)
    agent.start()
    return agent, fleet, client


def served(fleet) -> ModelAssignment | None:
    return fleet.serving.get("web#0")


def test_off_by_default_serves_the_first_plan_and_measures_nothing(tmp_path):
    assert ServiceConfig().verification.enabled is False
    device = SlowDevice()
    server = start(tmp_path, VerificationConfig())
    agent, fleet, client = agent_for(server, device)
    try:
        wait_for("the node", lambda: server.service.list_nodes())
        server.service.apply_workloads([WORKLOAD])
        first = wait_for("web serving", lambda: served(fleet), timeout=20)
        plan = server.service.current_plan()
        assert plan is not None and plan.revision == 1  # the first plan served, no hold
        placement = next(iter(plan.bound_placements()))
        assert (first.share_pct, first.batch) == (placement.share_pct, placement.batch)
        assert device.measured == []
    finally:
        agent.stop()
        client.close()
        server.stop()


def test_a_slower_device_holds_the_assignment_measures_replans_then_serves(tmp_path):
    device = SlowDevice()
    server = start(tmp_path, VerificationConfig(enabled=True, timeout_s=30.0))
    svc = server.service
    agent, fleet, client = agent_for(server, device)
    try:
        wait_for("the node", lambda: svc.list_nodes())
        device.go.clear()  # the device measures once the test has seen the hold
        svc.apply_workloads([WORKLOAD])
        unverified = next(p for p in svc.preview_plan().bound_placements() if p.name == "web")
        # held: nothing applied, the workload pending with the reason, while its node measures
        assert device.asked.wait(20)
        status = {w.workload.name: w for w in svc.status().workloads}
        assert status["web"].state == "pending" and "being verified" in status["web"].reason, status["web"]
        assert any("a new plan is held" in a for a in svc.status().alerts)
        assert svc.current_plan() is None and served(fleet) is None
        device.go.set()
        final = wait_for("web serving", lambda: served(fleet), timeout=60)
        plan = svc.current_plan()
        assert plan is not None
        placement = next(p for p in plan.bound_placements() if p.name == "web")
        # the re-plan moved away from the optimistic point the fit chose (to a larger share: the device is slower
        # everywhere), the first plan applied is the verified one, and the unverified point never served
        assert final.share_pct > unverified.share_pct
        assert plan.revision == 1
        assert all(a.share_pct == final.share_pct for applied in fleet.applied for a in applied)
        assert (final.share_pct, final.batch) == (placement.share_pct, placement.batch)
        measured = {(b, s) for _, _, s, b in device.measured}
        sizes = range(1, placement.batch + 1) if placement.arrivals == "poisson" else (placement.batch,)
        assert {(k, round(placement.share_pct, 6)) for k in sizes} <= measured
        # nothing was measured twice (heartbeats repeat; the level-based request does not)
        assert len(device.measured) == len(set(device.measured))
        # the served prediction is made on the measured times, and covers them: the profile the controller
        # plans with holds the device's own figures there, and its p99 on them is within the SLO
        profiles, _ = svc.profiles.snapshot()
        model = profiles["CPU"].model("mlp_small")
        for k in sizes:
            got = model.measured_ms(k, placement.share_pct)
            assert got is not None and math.isclose(
                got, device.truth_ms("mlp_small", k, placement.share_pct), rel_tol=1e-6
            )
        replica = placed_replicas(plan.plan, "CPU", "mlp_small")[0]
        p99 = replica_p99_ms(profiles["CPU"], replica)
        assert math.isclose(p99, placement.predicted_p99_ms, rel_tol=1e-6)
        assert p99 <= WORKLOAD["slo_ms"]
        # a restart keeps the measured points: nothing is measured again and the plan stands
        count = len(device.measured)
        agent.stop()
        client.close()
        server.stop()
        server = start(tmp_path, VerificationConfig(enabled=True, timeout_s=30.0))
        agent, fleet, client = agent_for(server, device)
        wait_for("web serving again", lambda: served(fleet), timeout=30)
        assert len(device.measured) == count
    finally:
        agent.stop()
        client.close()
        server.stop()


def test_a_point_the_node_cannot_measure_is_given_up_reported_and_the_plan_serves(tmp_path):
    def broken(model, device, share_pct, batch, requests):
        raise RuntimeError("the device is gone")

    server = start(tmp_path, VerificationConfig(enabled=True, timeout_s=30.0))
    svc = server.service
    agent, fleet, client = agent_for(server, broken)
    try:
        wait_for("the node", lambda: svc.list_nodes())
        svc.apply_workloads([WORKLOAD])
        wait_for("web serving", lambda: served(fleet), timeout=30)
        alerts = " ".join(svc.status().alerts)
        assert "given up" in alerts and "the device is gone" in alerts, alerts
    finally:
        agent.stop()
        client.close()
        server.stop()


def test_a_point_not_measured_in_time_is_given_up_and_the_plan_serves(tmp_path):
    release = threading.Event()

    def hung(model, device, share_pct, batch, requests):
        release.wait(30)
        raise RuntimeError("released")

    server = start(tmp_path, VerificationConfig(enabled=True, timeout_s=0.5))
    svc = server.service
    agent, fleet, client = agent_for(server, hung)
    try:
        wait_for("the node", lambda: svc.list_nodes())
        svc.apply_workloads([WORKLOAD])
        wait_for("web serving", lambda: served(fleet), timeout=30)
        assert "within 0.5 s" in " ".join(svc.status().alerts)
    finally:
        release.set()
        agent.stop()
        client.close()
        server.stop()


# ---------------------------------------------------------------- garbage at both trust boundaries


def test_garbage_measurements_are_refused_at_the_controller_naming_the_field(tmp_path):
    server = start(tmp_path, VerificationConfig(enabled=True))
    try:
        with ControllerClient(server.address) as c:
            c.register("node-a", CPU)
            for point, field in (
                (MeasuredPoint("mlp_small", 0, 50.0, 1, math.nan), "measured[0].active_ms"),
                (MeasuredPoint("mlp_small", 0, 50.0, 1, -1.0), "measured[0].active_ms"),
                (MeasuredPoint("mlp_small", 0, 50.0, 1, 1e9), "measured[0].active_ms"),
                (MeasuredPoint("../etc", 0, 50.0, 1, 1.0), "measured[0].model"),
                (MeasuredPoint("mlp_small", 0, 150.0, 1, 1.0), "measured[0].share_pct"),
                (MeasuredPoint("mlp_small", 0, 50.0, 0, 1.0), "measured[0].batch"),
                (MeasuredPoint("mlp_small", 0, 50.0, 1, 1.0, "bad\x1b[31m"), "measured[0].error"),
                (MeasuredPoint("mlp_small", 0, 50.0, 1, 1.0, "failed"), "measured[0].active_ms"),
            ):
                with pytest.raises(InvalidArgument) as err:
                    c.heartbeat(HeartbeatReport(node_id="node-a", measured=(point,)))
                assert field in str(err.value)  # the wire carries the message, which names the field
            flood = tuple(MeasuredPoint("mlp_small", 0, 50.0, 1, 1.0) for _ in range(limits.MAX_MEASURED + 1))
            with pytest.raises(InvalidArgument, match="measured"):
                c.heartbeat(HeartbeatReport(node_id="node-a", measured=flood))
    finally:
        server.stop()


def test_measurements_not_asked_for_or_far_off_the_fit_do_not_join_the_profile(tmp_path):
    from controller.config import ServiceConfig as SC
    from controller.service import ControlService
    from controller.store import Store

    svc = ControlService(Store(tmp_path / "s.db"), SC(verification=VerificationConfig(enabled=True)))
    svc.upload_profile(cpu_profile_json())
    svc.register("node-a", CPU)
    svc.apply_workloads([WORKLOAD])
    outcome = svc.reconcile()
    assert outcome is not None and outcome.held and svc.current_plan() is None
    asked = svc.heartbeat(HeartbeatReport(node_id="node-a")).measure
    assert asked and all(isinstance(m, MeasureRequest) for m in asked)
    m = asked[0]
    fitted = cpu_profile().model(m.model).active_time_ms(m.batches[0], m.share_pct)
    unasked = MeasuredPoint(m.model, m.device, m.share_pct, 4000, 1.0)
    lie = MeasuredPoint(m.model, m.device, m.share_pct, m.batches[0], fitted / 1000)
    svc.heartbeat(HeartbeatReport(node_id="node-a", measured=(unasked, lie)))
    assert svc.store.measured_points() == {}
    assert "refused the measurement" in " ".join(svc.status().alerts)


def test_the_config_option_is_validated(tmp_path):
    assert VerificationConfig().enabled is False
    path = tmp_path / "c.yaml"
    path.write_text("verification: {enabled: true, max_points: 0}\n")
    with pytest.raises(ConfigError, match="max_points"):
        load_config(path)
    path.write_text("verification: {enabled: true, requests: 1001}\n")
    with pytest.raises(ConfigError, match="requests"):
        load_config(path)
    path.write_text("verification: {enabled: true, rounds: 2, timeout_s: 60}\n")
    v = load_config(path).service.verification
    assert (v.enabled, v.rounds, v.timeout_s) == (True, 2, 60.0)


def _service(tmp_path, **verification):
    from controller.service import ControlService
    from controller.store import Store

    svc = ControlService(
        Store(tmp_path / "s.db"), ServiceConfig(verification=VerificationConfig(enabled=True, **verification))
    )
    svc.upload_profile(cpu_profile_json())
    svc.register("node-a", CPU)
    svc.apply_workloads([WORKLOAD])
    return svc


def _measure_all(svc, device) -> tuple[MeasuredPoint, ...]:
    """One heartbeat that fetches the node's measure requests, and the points the device gives for them."""
    asked = svc.heartbeat(HeartbeatReport(node_id="node-a")).measure
    return tuple(
        MeasuredPoint(m.model, m.device, m.share_pct, b, device(m.model, m.device, m.share_pct, b, m.requests))
        for m in asked
        for b in m.batches
    )


def _metrics(svc) -> dict[str, float]:
    from prometheus_client import generate_latest

    from controller.metrics import ControllerMetrics

    text = generate_latest(ControllerMetrics(svc).registry).decode()
    return {
        line.split()[0]: float(line.split()[1]) for line in text.splitlines() if line.startswith("stoke_verification")
    }


def test_rounds_are_bounded_then_the_plan_serves_as_it_stands(tmp_path):
    svc, device = _service(tmp_path, rounds=1), SlowDevice()
    assert svc.reconcile().held
    assert _metrics(svc)["stoke_verification_holding"] == 1.0
    points = _measure_all(svc, device)
    svc.heartbeat(HeartbeatReport(node_id="node-a", measured=points))
    stored = svc.store.measured_points()
    assert sum(len(v) for v in stored.values()) == len(points) > 0
    # a repeated heartbeat with the same results stores nothing again
    svc.heartbeat(HeartbeatReport(node_id="node-a", measured=points))
    assert svc.store.measured_points() == stored
    # the re-plan on the measurements wants new points, but the one round is spent: the plan serves
    outcome = svc.reconcile()
    assert outcome is not None and not outcome.held and outcome.plan.revision == 1
    placement = next(iter(outcome.plan.bound_placements()))
    assert placement.share_pct > points[0].share_pct  # planned on the measurements, not the fit
    assert "still not measured after 1 round(s)" in " ".join(svc.status().alerts)
    assert svc.heartbeat(HeartbeatReport(node_id="node-a")).measure == ()
    metrics = _metrics(svc)
    assert metrics["stoke_verification_holding"] == 0.0 and metrics["stoke_verification_points_wanted"] == 0.0
    assert metrics["stoke_verification_points_measured_total"] == len(points)


def test_a_round_asks_for_at_most_max_points(tmp_path):
    svc = _service(tmp_path, max_points=2)
    assert svc.reconcile().held
    asked = svc.heartbeat(HeartbeatReport(node_id="node-a")).measure
    assert sum(len(m.batches) for m in asked) == 2


def test_a_store_that_fails_to_record_a_measurement_loses_nothing(tmp_path):
    from controller.service import ControlService
    from controller.store import Store

    class FailingStore(Store):
        """The real store, whose next measured-points write fails (a full disk) while `fail` is set."""

        fail = False

        def add_measured_points(self, points, now):
            if self.fail:
                from controller.store import DatabaseError

                raise DatabaseError("disk full")
            return super().add_measured_points(points, now)

    store = FailingStore(tmp_path / "s.db")
    svc = ControlService(store, ServiceConfig(verification=VerificationConfig(enabled=True)))
    svc.upload_profile(cpu_profile_json())
    svc.register("node-a", CPU)
    svc.apply_workloads([WORKLOAD])
    assert svc.reconcile().held
    points = _measure_all(svc, SlowDevice())
    store.fail = True
    answer = svc.heartbeat(HeartbeatReport(node_id="node-a", measured=points))  # the heartbeat still answers
    assert answer.registered and store.measured_points() == {}
    assert answer.measure  # still asked: the node keeps its results and reports them again
    store.fail = False
    svc.heartbeat(HeartbeatReport(node_id="node-a", measured=points))
    assert sum(len(v) for v in store.measured_points().values()) == len(points)
    assert svc.heartbeat(HeartbeatReport(node_id="node-a")).measure == ()


def test_every_workload_a_held_plan_would_change_says_why_it_waits(tmp_path):
    svc = _service(tmp_path)
    svc.apply_workloads([{"name": "api", "model": "conv_medium", "slo_ms": 200.0, "rate_rps": 5.0}])
    assert svc.reconcile().held
    asked = svc.heartbeat(HeartbeatReport(node_id="node-a")).measure
    exact = SlowDevice(slowdown=1.0)  # the fit is right for conv_medium: its point holds once measured
    points = tuple(
        MeasuredPoint(m.model, m.device, m.share_pct, b, exact(m.model, 0, m.share_pct, b, 5))
        for m in asked
        if m.model == "conv_medium"
        for b in m.batches
    )
    assert points
    svc.heartbeat(HeartbeatReport(node_id="node-a", measured=points))  # mlp_small's points stay asked
    assert svc.reconcile().held
    reasons = {w.workload.name: (w.state, w.reason) for w in svc.status().workloads}
    assert reasons["web"][0] == "pending" and "being verified" in reasons["web"][1], reasons
    assert reasons["api"][0] == "pending" and "waiting to serve" in reasons["api"][1], reasons


def test_a_recalibration_after_a_measurement_supersedes_it_and_a_newer_measurement_counts_again(tmp_path):
    """A measured point must not mask what the closed loop learnt since (a device that slowed down)."""
    from controller.profiles import ProfileBook
    from controller.store import Store
    from interference.profile_io import profile_to_dict

    store = Store(tmp_path / "s.db")
    book = ProfileBook(store, measured_points=True)
    book.put("CPU", cpu_profile(), 100.0)

    def active(batch=2, share=50.0):
        book.reload()
        return book.snapshot()[0]["CPU"].model("mlp_small").measured_ms(batch, share)

    store.add_measured_points([("CPU", "mlp_small", 2, 50.0, 3.0, "node-a")], 200.0)
    assert active() == 3.0
    slower = profile_to_dict(cpu_profile())["models"]["mlp_small"]
    slower["k_act"] = [2.0 * k for k in slower["k_act"][:3]] + list(slower["k_act"][3:])
    store.add_profile_version("CPU", "mlp_small", slower, {"factor": 2.0}, 300.0)  # recalibrated: 2x slower
    assert active() is None  # superseded: the recalibrated coefficients speak there
    store.add_measured_points([("CPU", "mlp_small", 2, 50.0, 5.0, "node-a")], 400.0)
    assert active() == 5.0
    store.set_profile_state("CPU", "mlp_small", 0, True)  # rolled back to the fit: the measurement counts
    assert active() == 5.0


def test_a_failover_off_a_node_that_cannot_serve_is_not_held(tmp_path):
    from controller.verification import VerifyBeforeServing

    svc = _service(tmp_path)
    view = svc.preview_plan()  # web on node-a, at points nothing measured
    (placement,) = view.bound_placements()
    cut = {"node-x": (ModelAssignment.of(placement, 0),)}  # the applied plan had it on node-x
    profiles, _ = svc.profiles.snapshot()
    gate = VerifyBeforeServing(VerificationConfig(enabled=True))
    both = {("node-a", 0), ("node-x", 0)}
    assert gate.gate(view, cut, profiles, 0.0, healthy=both)  # a move between serving nodes waits
    assert not gate.gate(view, cut, profiles, 1.0, healthy={("node-a", 0)})  # node-x cannot serve: no wait
    assert gate.requests_for("node-a") == () and gate.holding() == {}
    assert "fails over web#0" in " ".join(gate.alerts(2.0))
    assert gate.drain_events() and not gate.drain_events()  # recorded once
    assert gate.alerts(1.0 + 601.0) == ()  # a note is an alert for ten minutes
    # a replica its node reports failed is a failover too, even with its slot in the inventory
    gate = VerifyBeforeServing(VerificationConfig(enabled=True))
    assert not gate.gate(view, cut, profiles, 0.0, healthy=both, failed={"node-x": {"web#0"}})


def test_a_failover_is_found_by_slot_not_by_node_nor_by_key(tmp_path):
    """The reviewer's two holes: a replica leaving a blocked device of a node that still serves, and a lost node's
    replica the new plan drops (fewer replicas)."""
    from dataclasses import replace

    from controller.verification import VerifyBeforeServing, failovers

    svc = _service(tmp_path)
    view = svc.preview_plan()
    (placement,) = view.bound_placements()
    profiles, _ = svc.profiles.snapshot()
    on_device_1 = {"node-a": (ModelAssignment.of(placement, 1),)}  # device 1 of node-a is blocked now
    assert failovers(view, on_device_1, {("node-a", 0)}) == ["web#0"]
    gate = VerifyBeforeServing(VerificationConfig(enabled=True))
    assert not gate.gate(view, on_device_1, profiles, 0.0, healthy={("node-a", 0)})
    dropped = {"node-x": (replace(ModelAssignment.of(placement, 0), replica=1),)}  # web#1, gone with node-x
    assert failovers(view, dropped, {("node-a", 0)}) == ["web#1"]
    gate = VerifyBeforeServing(VerificationConfig(enabled=True))
    assert not gate.gate(view, dropped, profiles, 0.0, healthy={("node-a", 0)})
    # the plan keeps a failed replica as it is: not a failover (holding the rest does not lengthen its outage)
    kept = {"node-a": (ModelAssignment.of(placement, 0),)}
    assert failovers(view, kept, {("node-a", 0)}, {"node-a": {"web#0"}}) == []


class FakeClock:
    def __init__(self) -> None:
        self.t = 1_700_000_000.0

    def __call__(self) -> float:
        return self.t


def _serving_unverified(tmp_path, devices=CPU):
    """web applied on one of node-a and node-b at points nothing measured (planned with verification off), then
    the controller restarted with it on and the nodes back: (service, clock, the node serving web)."""
    from controller.service import ControlService
    from controller.store import Store

    clock = FakeClock()
    config = ServiceConfig(heartbeat_interval_s=1.0, heartbeat_timeout_s=5.0)
    off = ControlService(Store(tmp_path / "s.db"), config, clock=clock, tick=clock)
    off.upload_profile(cpu_profile_json())
    for node in ("node-a", "node-b"):
        off.register(node, devices)
    off.apply_workloads([WORKLOAD])
    assert off.reconcile().changed
    off.store.close()
    on = ControlService(
        Store(tmp_path / "s.db"),
        replace(config, verification=VerificationConfig(enabled=True)),
        clock=clock,
        tick=clock,
    )
    for node in ("node-a", "node-b"):
        on.register(node, devices)
    outcome = on.reconcile(force=True)
    assert outcome is not None and not outcome.held and not outcome.changed
    (node,) = [n.node_id for n in on.list_nodes() if n.assigned]
    return on, clock, node


def test_a_node_lost_by_heartbeat_timeout_fails_over_at_once_through_the_loop(tmp_path):
    svc, clock, victim = _serving_unverified(tmp_path)
    survivor = ({"node-a", "node-b"} - {victim}).pop()
    for _ in range(12):  # the victim stays silent past the 5 s timeout, the survivor beats every second
        clock.t += 0.5
        svc.nodes.watch_clock()
        svc.heartbeat(HeartbeatReport(node_id=survivor))
    outcome = svc.reconcile()
    assert {n.node_id: n.state for n in svc.list_nodes()}[victim] == "lost"
    assert outcome is not None and outcome.changed and not outcome.held
    assert [n.node_id for n in svc.list_nodes() if n.assigned] == [survivor]
    assert "fails over web#0" in " ".join(svc.status().alerts)


def test_a_replica_leaving_a_blocked_device_of_a_serving_node_fails_over_at_once_through_the_loop(tmp_path):
    two = (NodeDevice(0, "cpu", "cpu", cores=8), NodeDevice(1, "cpu", "cpu", cores=8))
    svc, clock, node = _serving_unverified(tmp_path, two)
    answer = svc.heartbeat(HeartbeatReport(node_id=node))
    (assigned,) = answer.assignments
    svc.heartbeat(  # every assignment of its device failed to start: the device is blocked
        HeartbeatReport(
            node_id=node,
            errors=(AssignmentError(assigned.key, "start failed: boom"),),
            errors_revision=answer.revision,
        )
    )
    other = next(n for n in svc.list_nodes() if n.node_id != node)
    other_heartbeat = svc.heartbeat(HeartbeatReport(node_id=other.node_id))
    assert other_heartbeat.registered
    outcome = svc.reconcile()
    assert outcome is not None and outcome.changed and not outcome.held, svc.status().alerts
    where = {(n.node_id, a.device) for n in svc.list_nodes() for a in n.assigned}
    assert (node, assigned.device) not in where and len(where) == 1


def test_a_profile_reload_that_fails_once_does_not_leave_the_hold_stuck(tmp_path):
    svc = _service(tmp_path)
    assert svc.reconcile().held
    points = _measure_all(svc, SlowDevice())
    reload, failures = svc.profiles.reload, []

    def fails_once():
        if not failures:
            failures.append(1)
            raise OSError("the database is locked")
        return reload()

    svc.profiles.reload = fails_once
    svc.heartbeat(HeartbeatReport(node_id="node-a", measured=points))  # stored, not in the profiles yet
    assert failures and svc.heartbeat(HeartbeatReport(node_id="node-a")).measure  # still asked
    svc.heartbeat(HeartbeatReport(node_id="node-a", measured=points))  # reported again: reloaded, recorded
    assert svc.heartbeat(HeartbeatReport(node_id="node-a")).measure == ()
    profiles, _ = svc.profiles.snapshot()
    p = points[0]
    assert profiles["CPU"].model(p.model).measured_ms(p.batch, p.share_pct) is not None
    assert svc.reconcile() is not None  # the pass re-plans on the measurements (not skipped as unchanged)


def test_a_round_asks_a_node_for_no_more_than_one_answer_carries_and_the_rest_later(tmp_path, monkeypatch):
    """Points past the heartbeat answer's bounds are not asked (then given up as 'not measured'): they wait."""
    monkeypatch.setattr(limits, "MAX_MEASURE_REQUESTS", 1)
    monkeypatch.setattr(limits, "MAX_MEASURE_BATCHES", 1)
    svc = _service(tmp_path)
    svc.apply_workloads([{"name": "api", "model": "conv_medium", "slo_ms": 200.0, "rate_rps": 5.0}])
    assert svc.reconcile().held
    asked = svc.heartbeat(HeartbeatReport(node_id="node-a")).measure
    assert [len(m.batches) for m in asked] == [1] and svc.verifier.wanted() == 1  # every point asked is sent
    exact = SlowDevice(slowdown=1.0)
    seen = set()
    for _ in range(20):  # one point a heartbeat, all in the same round, until the plan serves
        asked = svc.heartbeat(HeartbeatReport(node_id="node-a")).measure
        if not asked:
            break
        (m,) = asked
        seen.add((m.model, m.share_pct, m.batches[0]))
        point = MeasuredPoint(
            m.model, m.device, m.share_pct, m.batches[0], exact(m.model, 0, m.share_pct, m.batches[0], 5)
        )
        svc.heartbeat(HeartbeatReport(node_id="node-a", measured=(point,)))
        svc.reconcile()
    assert len(seen) >= 2 and {m for m, _, _ in seen} == {"mlp_small", "conv_medium"}
    assert "given up" not in " ".join(svc.status().alerts)


def test_a_node_that_reports_results_keeps_its_other_points_asked(tmp_path):
    """It measures one point at a time: a deadline counted from the first ask would expire points still queued."""
    from controller.verification import VerifyBeforeServing

    svc = _service(tmp_path)
    svc.apply_workloads([{"name": "api", "model": "conv_medium", "slo_ms": 200.0, "rate_rps": 5.0}])
    view = svc.preview_plan()
    profiles, _ = svc.profiles.snapshot()
    gate = VerifyBeforeServing(VerificationConfig(enabled=True, timeout_s=10.0))
    assert gate.gate(view, {}, profiles, 0.0)
    asked = gate.requests_for("node-a")
    m = asked[0]
    exact = SlowDevice(slowdown=1.0)
    first = MeasuredPoint(m.model, m.device, m.share_pct, m.batches[0], exact(m.model, 0, m.share_pct, m.batches[0], 5))
    accepted = gate.take("node-a", (first,), profiles, 8.0)
    assert len(accepted) == 1
    assert gate.take("node-a", (first,), profiles, 9.0) == accepted  # reported again: no progress
    gate.recorded(accepted)
    left = gate.wanted()
    assert left >= 1
    assert not gate.expire(15.0)  # 15 s after the first ask, 7 s after the node's last result
    assert gate.wanted() == left
    assert gate.expire(18.5)  # 10.5 s after its last result: given up
    assert gate.wanted() == 0


def test_a_queue_delay_change_alone_is_not_held(tmp_path):
    from controller.verification import VerifyBeforeServing, assignment_points

    svc = _service(tmp_path)
    view = svc.preview_plan()
    (placement,) = view.bound_placements()
    profiles, _ = svc.profiles.snapshot()
    serving = ModelAssignment.of(placement, 0)
    cut = {"node-a": (replace(serving, queue_delay_ms=serving.queue_delay_ms + 1.0),)}
    assert assignment_points(view, cut) == {}
    assert not VerifyBeforeServing(VerificationConfig(enabled=True)).gate(view, cut, profiles, 0.0)
    resized = {"node-a": (replace(serving, batch=serving.batch + 1),)}  # another batch size: measured first
    assert VerifyBeforeServing(VerificationConfig(enabled=True)).gate(view, resized, profiles, 0.0)


def test_measured_points_count_only_while_verification_is_on(tmp_path):
    from controller.service import ControlService
    from controller.store import Store

    svc = _service(tmp_path, rounds=1)
    assert svc.reconcile().held
    points = _measure_all(svc, SlowDevice())
    svc.heartbeat(HeartbeatReport(node_id="node-a", measured=points))
    p = points[0]

    def measured(service):
        return service.profiles.snapshot()[0]["CPU"].model(p.model).measured_ms(p.batch, p.share_pct)

    assert measured(svc) is not None
    svc.store.close()
    off = ControlService(Store(tmp_path / "s.db"), ServiceConfig())  # restarted with verification off
    assert measured(off) is None and off.store.measured_points()  # kept, counted nowhere
    off.store.close()
    on = ControlService(Store(tmp_path / "s.db"), ServiceConfig(verification=VerificationConfig(enabled=True)))
    assert measured(on) is not None


def test_a_result_far_off_the_fits_error_there_is_refused_given_up_and_reported(tmp_path):
    svc = _service(tmp_path)
    assert svc.reconcile().held
    asked = svc.heartbeat(HeartbeatReport(node_id="node-a")).measure
    m = asked[0]
    model = cpu_profile().model(m.model)
    b = m.batches[0]
    fitted = float(model.active_time_ms(b, m.share_pct))
    allowed = 1.0 + max(1.0, 3.0 * float(model.fit_error(b, m.share_pct)))
    off = MeasuredPoint(m.model, m.device, m.share_pct, b, fitted * allowed * 1.5)  # well past, far below 20x
    svc.heartbeat(HeartbeatReport(node_id="node-a", measured=(off,)))
    assert svc.store.measured_points() == {}
    alerts = " ".join(svc.status().alerts)
    assert "refused the measurement of node-a" in alerts and "given up" in alerts, alerts
    assert all(
        b not in r.batches or r.share_pct != m.share_pct
        for r in svc.heartbeat(HeartbeatReport(node_id="node-a")).measure
    )


def test_a_failed_start_counts_as_failed_and_a_failed_reload_that_keeps_serving_does_not(tmp_path):
    svc, _, node = _serving_unverified(tmp_path)
    answer = svc.heartbeat(HeartbeatReport(node_id=node))
    (assigned,) = answer.assignments
    error = (AssignmentError(assigned.key, "reload failed: bad config"),)
    svc.heartbeat(HeartbeatReport(node_id=node, running=(assigned,), errors=error, errors_revision=answer.revision))
    assert svc.nodes.failed_keys(node) == set()  # the old config still serves it
    svc.heartbeat(HeartbeatReport(node_id=node, errors=error, errors_revision=answer.revision))
    assert svc.nodes.failed_keys(node) == {assigned.key}


def test_a_stored_profile_that_newer_checks_refuse_leaves_the_controller_up(tmp_path, caplog):
    """A profile stored by a version that checked less (here a k_act that is 0 everywhere) must not keep
    the controller from starting: its GPU type has no profile, the others plan, and the log says why."""
    from controller.profiles import ProfileBook
    from controller.store import Store
    from interference.profile_io import profile_to_dict

    store = Store(tmp_path / "s.db")
    good = profile_to_dict(cpu_profile())
    store.put_profile("CPU", good["gpu"], good["models"], 100.0)
    broken = {name: {**model, "k_act": [0.0] * 5} for name, model in good["models"].items()}
    store.put_profile("OLD", {**good["gpu"], "name": "OLD"}, broken, 100.0)
    with caplog.at_level("ERROR", logger="stoke.controller.profiles"):
        book = ProfileBook(store)
    assert set(book.snapshot()[0]) == set(book.fitted()) == {"CPU"}
    assert "stored profile 'OLD'" in caplog.text and "this GPU type has no profile" in caplog.text
    # `stoke status` says so too, not only the log: the way out is an upload
    from controller.service import ControlService

    svc = ControlService(store, ServiceConfig())
    (alert,) = [a for a in svc.status().alerts if "stored profile 'OLD'" in a]
    assert "this GPU type has no profile" in alert and "stoke profiles upload FILE" in alert
    svc.profiles.put("OLD", replace(cpu_profile(), gpu=replace(cpu_profile().gpu, name="OLD")), 200.0)
    assert not any("stored profile 'OLD'" in a for a in svc.status().alerts)  # gone once a good one is uploaded


def test_two_reloads_that_overlap_leave_the_newer_read_of_the_store(tmp_path):
    """A reload that read the store, then stalled (a slow disk, a descheduled thread) while another change was
    stored and reloaded, must not finish last with the older read: the cache would hold the older profile until
    the next change (fails when reloads are not one at a time)."""
    from controller.profiles import ProfileBook
    from controller.store import Store
    from interference.profile_io import profile_to_dict

    store = Store(tmp_path / "s.db")
    first = profile_to_dict(cpu_profile())
    store.put_profile("CPU", first["gpu"], first["models"], 100.0)
    book = ProfileBook(store)
    read, resume = threading.Event(), threading.Event()
    profile_dicts = store.profile_dicts

    def stalled_read():
        data = profile_dicts()
        if threading.current_thread().name == "stalled":
            read.set()
            resume.wait(10.0)
        return data

    store.profile_dicts = stalled_read  # type: ignore[method-assign]
    stalled = threading.Thread(target=book.reload, name="stalled")
    stalled.start()
    assert read.wait(10.0)
    newer = profile_to_dict(replace(cpu_profile(), gpu=replace(cpu_profile().gpu, memory_mib=8192.0)))
    store.put_profile("CPU", newer["gpu"], newer["models"], 200.0)
    second = threading.Thread(target=book.reload)
    second.start()
    second.join(1.0)  # it waits for the stalled one, or (before) finished first with the newer read
    resume.set()
    stalled.join(10.0)
    second.join(10.0)
    assert not stalled.is_alive() and not second.is_alive()
    assert book.snapshot()[0]["CPU"].gpu.memory_mib == pytest.approx(8192.0)
