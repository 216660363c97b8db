"""The agent loop with a hand-written fake fleet and fake controller client (no threads, fake clock)."""

from __future__ import annotations

import math
import random
import threading
from dataclasses import dataclass, replace

import pytest

from agents.agent import Agent
from controller import limits
from controller.messages import AssignmentError, HeartbeatAnswer, MeasureRequest, ModelAssignment, NodeDevice


@dataclass
class Report:
    started: tuple = ()
    reloaded: tuple = ()
    moved: tuple = ()
    stopped: tuple = ()
    unchanged: tuple = ()
    errors: tuple = ()


@dataclass
class Obs:
    key: str
    model: str
    request_rate_rps: float = 5.0
    mean_batch: float = 1.0
    mean_queue_ms: float = 1.0
    mean_compute_ms: float = 2.0
    failures: int = 0
    success: int = 10
    endpoint: str = "127.0.0.1:1"


class FakeFleet:
    def __init__(self):
        self.serving: dict[str, ModelAssignment] = {}
        self.applies = 0
        self.fail_next = False
        self.health_events: list[str] = []

    def refusals(self, assignments):
        return [AssignmentError(a.key, "refused: over-commit") for a in assignments if a.share_pct > 100]

    def apply(self, assignments):
        self.applies += 1
        if self.fail_next:
            self.fail_next = False
            return Report(errors=(AssignmentError("a#0", "start failed"),))
        new = {a.key: a for a in assignments}
        report = Report(
            started=tuple(k for k in new if k not in self.serving),
            stopped=tuple(k for k in self.serving if k not in new),
        )
        self.serving = new
        return report

    def observe(self):
        return [Obs(k, a.model) for k, a in self.serving.items()]

    def check_health(self):
        events, self.health_events = self.health_events, []
        return events

    def running(self):
        return list(self.serving.values())

    def close(self):
        self.serving = {}


class FakeClient:
    def __init__(self):
        self.up = True
        self.known = False
        self.assignments: tuple = ()
        self.revision = 1
        self.reports = []
        self.registrations = 0
        self.measure: tuple = ()  # measure requests (verify before serving) in every answer

    def register(self, node_id, devices, address=""):
        if not self.up:
            raise ConnectionError("down")
        self.known = True
        self.registrations += 1
        return 0.5

    def heartbeat(self, report):
        if not self.up:
            raise ConnectionError("down")
        self.reports.append(report)
        if not self.known:
            return HeartbeatAnswer(registered=False)
        return HeartbeatAnswer(True, self.revision, self.assignments, 0.5, measure=self.measure)


class Clock:
    t = 0.0

    def __call__(self):
        return self.t


A = ModelAssignment("a", "mlp_small", 0, 20.0, 1, 0.0, 100.0, 10.0)


def make():
    clock, client, fleet = Clock(), FakeClient(), FakeFleet()
    agent = Agent(
        client,
        fleet,
        "n1",
        (NodeDevice(0, "cpu", "cpu"),),
        backoff_s=1.0,
        max_backoff_s=4.0,
        retry_apply_s=5.0,
        jitter=0.0,
        backoff_jitter=0.0,
        clock=clock,
    )
    return agent, client, fleet, clock


def test_registers_applies_once_and_reports():
    agent, client, fleet, clock = make()
    client.assignments = (A,)
    assert agent.heartbeat_once() == 0.5 and client.registrations == 1
    agent.fleet_once()
    agent.fleet_once()  # same assignments: not applied again
    assert fleet.applies == 1 and set(fleet.serving) == {"a#0"}
    agent.heartbeat_once()
    last = client.reports[-1]
    assert [a.key for a in last.running] == ["a#0"] and last.observed[0].latency_ms == 3.0
    assert last.applied_revision == 1 and any("started a#0" in e for e in last.events)
    agent.heartbeat_once()
    assert client.reports[-1].events == ()  # events are sent once


def test_backoff_while_controller_down_keeps_serving_then_reregisters():
    agent, client, fleet, clock = make()
    client.assignments = (A,)
    agent.heartbeat_once()
    agent.fleet_once()
    client.up, client.known = False, False  # controller restarts, forgets the node
    delays = []
    for _ in range(4):
        delays.append(agent.heartbeat_once())
        clock.t += delays[-1]
    assert delays == [1.0, 2.0, 4.0, 4.0]
    agent.fleet_once()
    assert set(fleet.serving) == {"a#0"}  # Triton keeps serving meanwhile
    client.up = True
    assert agent.heartbeat_once() == 0.0  # answered registered=False: register at once
    agent.heartbeat_once()
    assert client.registrations == 2 and client.known
    assert any("reconnected" in e for r in client.reports for e in r.events)


def test_failed_apply_is_retried_after_delay_and_crash_events_reported():
    agent, client, fleet, clock = make()
    client.assignments = (A,)
    agent.heartbeat_once()
    fleet.fail_next = True
    agent.fleet_once()
    assert fleet.applies == 1 and agent.state.apply_errors
    agent.fleet_once()
    assert fleet.applies == 1  # not yet due
    clock.t += 5.0
    fleet.health_events = ["a#0: Triton pid 1 exited with code -9; restarted as pid 2"]
    agent.fleet_once()
    assert fleet.applies == 2 and not agent.state.apply_errors
    agent.heartbeat_once()
    events = client.reports[-1].events
    assert any("restarted as pid 2" in e for e in events) and client.reports[-1].errors == ()


# ------------------------------------------------------------------ issue 10: what the agent trusts


def test_a_controller_naming_a_path_gets_nothing_applied_and_the_refusal_reported():
    """The probe: model "../evilrel" made Triton load model.py from outside the repository."""
    agent, client, fleet, clock = make()
    client.assignments = (A,)
    agent.heartbeat_once()
    agent.fleet_once()
    assert set(fleet.serving) == {"a#0"}
    for bad in ("../evilrel", "..", "a\x00b", "x\u202ey", "/etc"):
        client.revision += 1
        client.assignments = (A, ModelAssignment("b", bad, 0, 20.0, 1, 0.0, 100.0, 10.0))
        agent.heartbeat_once()
        agent.fleet_once()
        assert fleet.applies == 1 and set(fleet.serving) == {"a#0"}  # nothing applied, a#0 keeps serving
        agent.heartbeat_once()
        report = client.reports[-1]
        assert [e.key for e in report.errors] == ["b#0"] and report.errors_revision == client.revision
        assert "refused: assignments[1].model: must be a name" in report.errors[0].message
        assert report.errors[0].message.isprintable()
    # a good revision again: applied, the refusal cleared
    client.revision += 1
    client.assignments = (A,)
    agent.heartbeat_once()
    agent.heartbeat_once()
    assert client.reports[-1].errors == ()


@pytest.mark.parametrize(
    "field, value",
    [("share_pct", 0.0), ("share_pct", 250.0), ("share_pct", math.nan), ("batch", 0), ("device", 10_000)],
)
def test_assignments_out_of_bounds_are_refused(field, value):
    agent, client, fleet, clock = make()
    client.assignments = (replace(A, **{field: value}),)
    agent.heartbeat_once()
    agent.fleet_once()
    assert fleet.applies == 0 and agent.state.refused and field in agent.state.refused[0].message


def test_assignments_the_fleet_refuses_are_not_applied():
    agent, client, fleet, clock = make()
    client.assignments = (A,)
    agent.heartbeat_once()
    agent.fleet_once()
    client.revision = 2
    client.assignments = (A, replace(A, workload="b", share_pct=100.0), replace(A, workload="c", share_pct=100.0))
    fleet.refusals = lambda assignments: [AssignmentError(a.key, "refused: over-commit") for a in assignments]
    agent.heartbeat_once()
    agent.fleet_once()
    assert fleet.applies == 1 and set(fleet.serving) == {"a#0"}
    agent.heartbeat_once()
    assert {e.key for e in client.reports[-1].errors} == {"a#0", "b#0", "c#0"}
    assert client.reports[-1].applied_revision == 1


def test_hold_keeps_what_runs():
    agent, client, fleet, clock = make()
    client.assignments = (A,)
    agent.heartbeat_once()
    agent.fleet_once()
    client.heartbeat = lambda report: HeartbeatAnswer(True, 2, (), 0.5, hold=True)
    agent.heartbeat_once()
    agent.fleet_once()
    assert set(fleet.serving) == {"a#0"} and fleet.applies == 1


def test_observations_and_texts_are_made_safe_to_send():
    agent, client, fleet, clock = make()
    client.assignments = (A,)
    agent.heartbeat_once()
    fleet.observe = lambda: [Obs("a#0", "mlp_small", request_rate_rps=math.nan, mean_queue_ms=math.inf)]
    agent.fleet_once()
    agent.note("bell\x07 and escape \x1b[2J" + "x" * 5000)
    agent.heartbeat_once()
    report = client.reports[-1]
    assert report.observed[0].request_rate_rps == 0.0 and report.observed[0].mean_queue_ms == 0.0
    assert all(e.isprintable() and len(e) <= limits.MAX_EVENT_CHARS for e in report.events)
    limits.check_report(report)  # what the controller checks: it passes


# ------------------------------------------------------------------ issue 10 / 12: jitter


def beats(seed, n=20):
    agent, client, fleet, clock = make()
    agent.jitter, agent.rng = 0.1, random.Random(seed)
    client.assignments = (A,)
    return [agent.heartbeat_once() for _ in range(n)]


def test_heartbeats_are_jittered_so_agents_started_together_drift_apart():
    a, b = beats(1), beats(2)
    assert all(0.45 <= x <= 0.55 for x in a[1:] + b[1:])  # interval 0.5 +-10%
    assert len(set(a[1:])) > 10 and a != b
    # started in phase, after 20 beats they are apart by far more than a scheduler's noise
    assert abs(sum(a) - sum(b)) > 0.05
    assert beats(1) == a  # a seeded rng: deterministic


def test_reconnect_backoff_is_jittered():
    agent, client, fleet, clock = make()
    agent.backoff_jitter, agent.rng = 0.5, random.Random(7)
    client.up = False
    delays = []
    for _ in range(6):
        delays.append(agent.heartbeat_once())
        clock.t += delays[-1]
    caps = [1.0, 2.0, 4.0, 4.0, 4.0, 4.0]
    assert all(cap / 2 <= d <= cap for d, cap in zip(delays, caps)) and len(set(delays)) == 6


def test_each_window_carries_the_sli_percentiles_and_the_device_reading():
    from agents.device import DeviceSample
    from agents.latency_metrics import RequestLatencyExporter, registry_source

    exporter = RequestLatencyExporter([100.0])
    record = exporter.recorder("a", "mlp_small")

    class Device:
        def sample(self):
            return [DeviceSample(0, "cpu", 0.0, 37.5, None, None)]

    clock, client, fleet = Clock(), FakeClient(), FakeFleet()
    agent = Agent(
        client, fleet, "n1", (NodeDevice(0, "cpu", "cpu"),), clock=clock, sli_sources=[registry_source(exporter)]
    )
    agent.device = Device()
    client.assignments = (A,)
    agent.heartbeat_once()
    agent.fleet_once()  # the first read of the histogram opens the window
    assert agent.state.observed[0].latency_p99_ms is None
    for ms in [10.0] * 97 + [150.0] * 3:
        record(ms)
    agent.fleet_once()
    o = agent.state.observed[0]
    assert o.latency_count == 100 and o.over_slo_ratio == 0.03 and o.latency_p99_ms > 100.0
    assert 5.0 <= o.latency_p50_ms <= 10.0 and o.device_utilization_pct == 37.5
    agent.fleet_once()  # no requests since: an empty window
    assert agent.state.observed[0].latency_count == 0 and agent.state.observed[0].latency_p99_ms is None


def test_a_node_whose_endpoints_cannot_serve_stops_heartbeating_until_they_can():
    agent, client, fleet, clock = make()
    client.assignments = (A,)
    agent.heartbeat_once()
    problems = ["router of a: cannot be reached on its own ports (timed out)"]
    fleet.serving_problems = lambda: list(problems)
    agent.fleet_once()
    sent = len(client.reports)
    agent.heartbeat_once()
    agent.heartbeat_once()
    assert len(client.reports) == sent  # silent: the controller's timeout marks the node not ready
    problems.clear()
    agent.fleet_once()
    agent.heartbeat_once()
    assert len(client.reports) == sent + 1
    assert any("endpoints cannot serve" in e for e in client.reports[-1].events)


# ---------------------------------------------------------------- verify before serving: measure requests


class Measurer:
    """A simulated device: 2 ms per batch item, or failing; counts its measurements and releases."""

    def __init__(self, fail: str = ""):
        self.calls: list[tuple] = []
        self.fail = fail
        self.closed = 0

    def close(self):
        self.closed += 1

    def __call__(self, model, device, share_pct, batch, requests):
        self.calls.append((model, device, share_pct, batch, requests))
        if self.fail:
            raise RuntimeError(self.fail)
        return 2.0 * batch


def make_measuring(measurer):
    agent, client, fleet, clock = make()
    agent.measurer = measurer
    return agent, client, fleet, clock


def test_measure_requests_are_measured_once_reported_until_recorded_then_dropped():
    measurer = Measurer()
    agent, client, _, _ = make_measuring(measurer)
    client.measure = (MeasureRequest("mlp_small", 0, 30.0, (1, 2), 7),)
    agent.heartbeat_once()
    assert agent.measure_pending() == 2 and measurer.closed == 1  # released once nothing is left to measure
    assert agent.measure_pending() == 0 and measurer.closed == 1
    assert measurer.calls == [("mlp_small", 0, 30.0, 1, 7), ("mlp_small", 0, 30.0, 2, 7)]
    for _ in range(3):  # the controller asks again until it has them: measured once, reported each time
        agent.heartbeat_once()
        assert not agent.measure_once()
        assert [(p.batch, p.active_ms, p.error) for p in client.reports[-1].measured] == [(1, 2.0, ""), (2, 4.0, "")]
    assert len(measurer.calls) == 2
    client.measure = ()  # recorded: no longer asked for, so no longer reported
    agent.heartbeat_once()
    agent.heartbeat_once()
    assert client.reports[-1].measured == ()


def test_a_failing_or_missing_measurer_reports_the_error_for_the_point():
    for measurer, words in ((Measurer(fail="device lost"), "device lost"), (None, "does not measure")):
        agent, client, _, _ = make_measuring(measurer)
        client.measure = (MeasureRequest("mlp_small", 0, 30.0, (3,), 7),)
        agent.heartbeat_once()
        assert agent.measure_once() and not agent.measure_once()
        agent.heartbeat_once()
        (point,) = client.reports[-1].measured
        assert point.batch == 3 and point.active_ms == 0.0 and words in point.error


def test_garbage_measure_requests_are_refused_and_nothing_is_measured():
    measurer = Measurer()
    agent, client, _, _ = make_measuring(measurer)
    client.measure = (MeasureRequest("../../etc/passwd", 0, 30.0, (1,), 7),)
    agent.heartbeat_once()
    agent.heartbeat_once()
    assert not agent.measure_once() and measurer.calls == []
    events = [e for r in client.reports for e in r.events if "measure requests refused" in e]
    assert len(events) == 1 and "measure[0].model" in events[0]  # said once, naming the field
    client.measure = (MeasureRequest("mlp_small", 0, 30.0, (1,), 10**9),)
    agent.heartbeat_once()
    assert not agent.measure_once() and measurer.calls == []


def test_a_point_on_a_device_the_node_does_not_have_is_an_error_and_nothing_is_measured():
    measurer = Measurer()
    agent, client, _, _ = make_measuring(measurer)
    client.measure = (MeasureRequest("mlp_small", 3, 30.0, (1,), 7),)
    agent.heartbeat_once()
    assert agent.measure_once()
    agent.heartbeat_once()
    (point,) = client.reports[-1].measured
    assert measurer.calls == [] and point.active_ms == 0.0 and "device 3 is not one of this node's" in point.error


class HungMeasurer:
    """A measurement that never ends on its own: `abort()` or `stop()` ends it (as killing its processes does)."""

    def __init__(self):
        self.started = threading.Event()
        self.ended = threading.Event()
        self.aborted = 0
        self.stopped = 0

    def __call__(self, model, device, share_pct, batch, requests):
        self.started.set()
        assert self.ended.wait(30)
        raise RuntimeError("its processes were killed")

    def abort(self):
        self.aborted += 1
        self.ended.set()

    def stop(self):
        self.stopped += 1
        self.ended.set()


def test_a_measurement_past_its_deadline_is_that_points_error_and_is_aborted():
    measurer = HungMeasurer()
    agent, client, _, _ = make_measuring(measurer)
    agent.measure_timeout_s = 0.3
    client.measure = (MeasureRequest("mlp_small", 0, 30.0, (1,), 7),)
    agent.heartbeat_once()
    assert agent.measure_once()
    agent.heartbeat_once()
    (point,) = client.reports[-1].measured
    assert "not measured within 0.3 s" in point.error and measurer.aborted == 1


def test_stopping_the_agent_stops_a_measurement_in_flight_without_waiting_for_it():
    measurer = HungMeasurer()
    agent, client, _, _ = make_measuring(measurer)
    client.measure = (MeasureRequest("mlp_small", 0, 30.0, (1,), 7),)
    agent.start()
    try:
        assert measurer.started.wait(10)
    finally:
        agent.stop()
    assert measurer.stopped == 1 and measurer.ended.is_set()
    for t in [t for t in threading.enumerate() if t.name == "agent-measure-point"]:
        t.join(timeout=10)  # ended by the stop, not left hanging
        assert not t.is_alive()


def test_the_cpu_measurer_stops_without_waiting_for_the_measurement_it_runs(tmp_path):
    """`AgentMeasurer.stop` must not wait on the lock a measurement in flight holds (the agent's 30 s bound)."""
    from agents.profiler import AgentMeasurer

    class Running:  # stands in for its Triton processes: a measurement ends once they are closed
        closed = False
        requests = 0

        def __init__(self):
            self.started, self.killed = threading.Event(), threading.Event()

        def __call__(self, gpu_type, model, batch, share_pct):
            self.started.set()
            assert self.killed.wait(30)
            raise RuntimeError("its processes were killed")

        def close(self, deadline_s=20.0):
            self.closed = True
            self.killed.set()

    measurer = AgentMeasurer("unused", workdir=str(tmp_path / "measure"))
    running = measurer._measurer = Running()
    errors = []

    def measure():
        try:
            measurer("mlp_small", 0, 50.0, 1, 5)
        except RuntimeError as err:
            errors.append(str(err))

    worker = threading.Thread(target=measure)
    worker.start()
    assert running.started.wait(10)
    measurer.stop()  # returns with the lock still held by the measurement: it kills, never waits
    worker.join(timeout=10)
    assert not worker.is_alive() and errors == ["its processes were killed"]
    with pytest.raises(Exception, match="stopping"):
        measurer("mlp_small", 0, 50.0, 1, 5)  # stopped for good: nothing more starts
