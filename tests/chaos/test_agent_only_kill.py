"""kill -9 of the agent process alone (not its tree): its Triton servers keep serving on their own addresses while
it is gone, and the restarted agent reaps them before it serves again, so none is left holding memory or a
device share.

The probe: the orphaned Triton processes ran on and were never reaped (the old e2e test killed the whole tree,
which hid it)."""

from __future__ import annotations

import pytest
from chaos_helpers import alive, needs_triton, tritons_of, wait_for
from triton_helpers import infer

from planner.solver import Workload

pytestmark = [pytest.mark.chaos, pytest.mark.e2e, pytest.mark.triton, needs_triton]


def serving(client):
    status = client.status()
    ok = status.workloads and all(w.state == "serving" and w.replicas[0].endpoint for w in status.workloads)
    return status if ok else None


def test_a_restarted_agent_reaps_the_triton_servers_its_killed_predecessor_left(cluster):
    cluster.controller()
    client = cluster.client()
    token = cluster.agent_token("n1")
    first = cluster.agent("n1", token=token)
    wait_for("n1 ready", lambda: any(n.state == "ready" for n in client.list_nodes().nodes), 60)
    client.apply_workloads([Workload("web", "tiny_echo", 200, 5)])
    replica = wait_for("web serving", lambda: serving(client), 90).workloads[0].replicas[0]
    orphans = tritons_of(first.pid)
    assert orphans
    cluster.extra_pids += orphans  # stopped by pid at the end whatever happens
    first.kill9()  # the agent only
    # orphaned, still serving on its own address (the node's stable endpoint, the router, went with the agent)
    assert all(alive(p) for p in orphans)
    infer(replica.backend, "tiny_echo", batch=1)

    second = cluster.agent("n1", token=token)  # same workdir: it finds the pid ledger
    wait_for("the orphans reaped", lambda: not any(alive(p) for p in orphans), 60)
    status = wait_for("web serving again", lambda: serving(client), 90)
    fresh = tritons_of(second.pid)
    assert fresh and not set(fresh) & set(orphans)
    infer(status.workloads[0].replicas[0].endpoint, "tiny_echo", batch=1)  # the stable endpoint, served again
    events = [e for n in client.list_nodes().nodes for e in n.events]
    assert any("reaped 1 Triton process(es) a previous agent left running" in e for e in events), events
