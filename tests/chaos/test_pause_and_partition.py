"""A controller paused (SIGSTOP) past the heartbeat timeout, and every node silent at once: nothing stops serving.

The probe: after a 13 s SIGSTOP every node was marked lost, an empty plan was stored and a real agent was
told to stop its Triton (served assignments 0/60). Here one real agent serves a real Triton; two simulated
agents (the real `Agent` loop over gRPC) are the other nodes.
"""

from __future__ import annotations

import signal
import time

import pytest
from chaos_helpers import HEARTBEAT_S, TIMEOUT_S, needs_triton, sim_agent, tritons_of, wait_for
from triton_helpers import infer

from planner.solver import Workload

pytestmark = [pytest.mark.chaos, pytest.mark.e2e, pytest.mark.triton, needs_triton]


def serving(client):
    status = client.status()
    return status if status.workloads and all(w.state == "serving" for w in status.workloads) else None


def start(cluster):
    cluster.controller()
    client = cluster.client()
    real = cluster.agent("n1")
    sims = [sim_agent(cluster, f"sim{i}") for i in range(2)]
    wait_for("3 ready nodes", lambda: sum(n.state == "ready" for n in client.list_nodes().nodes) == 3, 60)
    client.apply_workloads([Workload("web", "tiny_echo", 200, 5)])
    status = wait_for("web serving on n1", lambda: serving(client), 90)
    assert status.workloads[0].replicas[0].node_id == "n1"
    tritons = tritons_of(real.pid)
    assert tritons, "the real agent runs no Triton"
    return client, real, sims, status, tritons


def test_a_controller_paused_past_the_timeout_keeps_every_node_and_every_triton(cluster):
    client, real, sims, status, tritons = start(cluster)
    controller = cluster.procs[0]
    revision = status.revision
    try:
        controller.signal(signal.SIGSTOP)
        time.sleep(TIMEOUT_S * 2.5)  # far past the heartbeat timeout
        infer(status.workloads[0].replicas[0].endpoint, "tiny_echo", batch=1)  # served while it is away
    finally:
        controller.signal(signal.SIGCONT)
    time.sleep(HEARTBEAT_S * 5)  # heartbeats and reconcile passes after the resume
    nodes = client.list_nodes().nodes
    assert {n.node_id: n.state for n in nodes} == {"n1": "ready", "sim0": "ready", "sim1": "ready"}
    events = [e for n in nodes for e in n.events]
    assert any("controller resumed after" in e for e in events)
    assert not any("lost" in e or "silent" in e for e in events), events  # never even looked silent
    after = wait_for("still serving", lambda: serving(client), 10)
    assert after.revision == revision  # no plan was cut
    assert tritons_of(real.pid) == tritons  # the same Triton processes: nothing stopped or restarted
    for a in sims:
        a.stop()


def test_every_node_silent_at_once_holds_the_plan_and_alerts(cluster):
    client, real, sims, status, tritons = start(cluster)
    revision = status.revision
    try:
        real.signal(signal.SIGSTOP)  # the agent only: its Triton goes on serving
        for a in sims:
            a.stop(close_fleet=False)
        held = wait_for("the plan held", lambda: client.status().alerts, TIMEOUT_S * 4)
        assert "3 of 3 nodes fell silent together" in held[0]
        time.sleep(TIMEOUT_S)  # longer still: nothing is planned away
        status_now = client.status()
        assert status_now.revision == revision and status_now.nodes_silent == 3 and status_now.nodes_lost == 0
        # the agent (and its router) is stopped; its Triton serves on its own address
        infer(status.workloads[0].replicas[0].backend, "tiny_echo", batch=1)
    finally:
        real.signal(signal.SIGCONT)
    wait_for("n1 heard again", lambda: {n.node_id: n.state for n in client.list_nodes().nodes}["n1"] == "ready", 10)
    after = wait_for("serving again", lambda: serving(client), 10)
    assert after.revision == revision and tritons_of(real.pid) == tritons
    infer(after.workloads[0].replicas[0].endpoint, "tiny_echo", batch=1)
