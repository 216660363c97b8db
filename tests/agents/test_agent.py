"""The agent loop with a hand-written fake fleet and fake controller client (no threads, fake clock)."""

from __future__ import annotations

from dataclasses import dataclass

from agents.agent import Agent
from controller.messages import AssignmentError, HeartbeatAnswer, ModelAssignment, NodeDevice


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
        return HeartbeatAnswer(True, self.revision, self.assignments, 0.5)


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
