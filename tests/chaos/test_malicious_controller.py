"""A malicious controller against a real agent: it cannot make the agent run code from outside its repository,
nor start processes the node has no room for.

The probe: a controller-sent `model: "../evilrel"` made Triton load and run model.py from outside the model
repository (a marker file was written). Here a fake AgentGateway on loopback answers the real agent's
heartbeats with such assignments, and records what the agent reports."""

from __future__ import annotations

import shutil
import threading
from concurrent import futures

import grpc
import pytest
from chaos_helpers import HEARTBEAT_S, ROOT, free_port, needs_triton, tritons_of, wait_for

from controller.api import convert
from controller.api import stoke_pb2 as pb
from controller.api import stoke_pb2_grpc as pb_grpc
from controller.messages import ModelAssignment

pytestmark = [pytest.mark.chaos, pytest.mark.e2e, pytest.mark.triton, needs_triton]

EVIL_MODEL = """
import pathlib
pathlib.Path(__file__).resolve().parents[2].joinpath("PWNED").write_text("ran")


class TritonPythonModel:
    def execute(self, requests):
        return []
"""


class EvilGateway(pb_grpc.AgentGatewayServicer):
    """Answers every heartbeat with `assignments` at `revision`; keeps the reports."""

    def __init__(self) -> None:
        self.assignments: list[ModelAssignment] = []
        self.revision = 1
        self.reports: list = []
        self.lock = threading.Lock()

    def Register(self, request, context):  # noqa: N802
        return pb.RegisterResponse(heartbeat_interval_s=HEARTBEAT_S)

    def Heartbeat(self, request, context):  # noqa: N802
        with self.lock:
            self.reports.append(convert.report_from_pb(request))
            return pb.HeartbeatResponse(
                registered=True,
                revision=self.revision,
                assignments=[convert.assignment_to_pb(a) for a in self.assignments],
                heartbeat_interval_s=HEARTBEAT_S,
            )

    def send(self, assignments: list[ModelAssignment]) -> int:
        with self.lock:
            self.revision += 1
            self.assignments = assignments
            return self.revision

    def errors_of(self, revision: int) -> dict[str, str] | None:
        with self.lock:
            for r in reversed(self.reports):
                if r.errors_revision == revision and r.errors:
                    return {e.key: e.message for e in r.errors}
        return None


def assignment(model: str, workload: str = "w", share: float = 50.0) -> ModelAssignment:
    return ModelAssignment(workload, model, 0, share, 1, 0.0, 100.0, 1.0)


def test_a_controller_cannot_make_the_agent_run_foreign_code_or_overcommit(cluster):
    tmp = cluster.tmp
    repo = tmp / "repo"
    shutil.copytree(
        ROOT / "triton_repo" / "tiny_echo", repo / "tiny_echo", ignore=shutil.ignore_patterns("__pycache__")
    )
    evil = tmp / "evilrel"
    (evil / "1").mkdir(parents=True)
    (evil / "1" / "model.py").write_text(EVIL_MODEL)
    (evil / "config.pbtxt").write_text('name: "evilrel"\nbackend: "python"\nmax_batch_size: 8\n')
    (repo / "linked").symlink_to(evil)  # a valid name whose folder leads outside the repository

    gateway = EvilGateway()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    pb_grpc.add_AgentGatewayServicer_to_server(gateway, server)
    port = free_port()
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    token = tmp / "any.token"
    token.write_text("stoke-node:n1:1:" + "0" * 64 + "\n")  # the fake controller checks nothing
    token.chmod(0o600)
    try:
        agent = cluster.agent("n1", token=token, controller=f"127.0.0.1:{port}", repository=repo)
        wait_for("the agent's first heartbeat", lambda: gateway.reports, 60)

        cases = {
            "path": [assignment("../evilrel")],
            "dot": [assignment("..")],
            "nul": [assignment("evil\x00rel")],
            "bidi": [assignment("tiny\u202eecho")],
            "symlink out": [assignment("linked")],
            "over-commit": [assignment("tiny_echo", f"w{i}", 100.0) for i in range(4)],
        }
        for case, assignments in cases.items():
            revision = gateway.send(assignments)
            errors = wait_for(f"the refusal of {case}", lambda r=revision: gateway.errors_of(r), 30)
            assert all("refused" in m for m in errors.values()), (case, errors)
            assert all(m.isprintable() for m in errors.values())
            assert not (tmp / "PWNED").exists(), case
            assert tritons_of(agent.pid) == [], case  # nothing was even started

        # the same agent serves a sound assignment from the same controller: the refusals were the checks
        revision = gateway.send([assignment("tiny_echo")])
        wait_for(
            "tiny_echo running",
            lambda: any(r.applied_revision == revision and r.running for r in list(gateway.reports)),
            90,
        )
        assert tritons_of(agent.pid) and not (tmp / "PWNED").exists()
    finally:
        server.stop(0)
