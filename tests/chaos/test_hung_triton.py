"""A hung Triton is noticed and replaced (issue 21, item 4): SIGSTOP the workload's tritonserver under load.

A real agent, real fleet, real router and real Triton on CPU; the controller side is scripted. The stopped
process must be reported, killed and replaced within the documented bound (10 s), and no more than 30% of
the requests sent during the hang may fail (the router holds calls while the replacement starts). The load
runs 15 s from the SIGSTOP: half the issue's 30 s, which makes the 30% criterion stricter, not looser.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
from control_helpers import wait_for
from triton_helpers import DEMO_REPO

from agents.agent import Agent
from agents.loadgen import LoadGenerator
from agents.router import Router
from agents.triton import TritonFleet
from controller.messages import HeartbeatAnswer, HeartbeatReport, ModelAssignment, NodeDevice

pytestmark = [pytest.mark.triton, pytest.mark.chaos]

BOUND_S = 10.0
ECHO = ModelAssignment("echo", "tiny_echo", 0, 100.0, 4, 1.0, 100.0, 100.0)


class Controller:
    def __init__(self) -> None:
        self.reports: list[HeartbeatReport] = []

    def register(self, node_id: str, devices, address: str = "") -> float:
        return 0.5

    def heartbeat(self, report: HeartbeatReport) -> HeartbeatAnswer:
        self.reports.append(report)
        return HeartbeatAnswer(True, 1, (ECHO,), 0.5)


def test_a_stopped_triton_is_replaced_within_the_bound_and_few_requests_fail(tmp_path):
    controller = Controller()
    fleet = TritonFleet(
        str(DEMO_REPO), workdir=str(tmp_path), ready_timeout_s=60, router=Router("127.0.0.1"), probe_deadline_s=2.0
    )
    agent = Agent(controller, fleet, "n1", (NodeDevice(0, "cpu", "cpu", cores=2),), address="127.0.0.1")
    agent.start()
    stopped = None
    try:
        report = wait_for("the endpoint reported", lambda: next((r for r in controller.reports if r.endpoints), None))
        ep = report.endpoints[0]
        stopped = fleet._slots["echo#0"].process
        with LoadGenerator(ep.grpc, "tiny_echo") as gen:
            gen.run(20.0, 1.0)  # warm: the path serves before the hang
            results = {}
            loader = threading.Thread(target=lambda: results.setdefault("load", gen.run(20.0, 15.0, seed=3)))
            os.kill(stopped.pid, signal.SIGSTOP)
            t0 = time.monotonic()
            loader.start()
            replaced = wait_for(
                "a new Triton process behind the endpoint",
                lambda: next(
                    (r for r in reversed(controller.reports) if r.endpoints and r.endpoints[0].backend != ep.backend),
                    None,
                ),
                timeout=30,
            )
            replaced_s = time.monotonic() - t0
            loader.join(timeout=60)
        load = results["load"]
        events = [e for r in controller.reports for e in r.events]
        assert any("did not answer its readiness probe" in e and "restarted as pid" in e for e in events), events
        assert not stopped.alive()
        assert replaced_s <= BOUND_S, f"replaced after {replaced_s:.1f} s"
        failed = load.failed / max(1, load.sent)
        print(f"replaced in {replaced_s:.1f} s; {load.failed} of {load.sent} requests failed ({failed:.0%})")
        assert load.sent >= 200 and failed <= 0.30, load
        assert replaced.endpoints[0].grpc == ep.grpc  # clients keep their address
    finally:
        if stopped is not None and stopped.alive():
            os.kill(stopped.pid, signal.SIGCONT)
        agent.stop()
