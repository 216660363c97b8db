"""Stable per-workload endpoints (agents/router.py): units, and a real agent with real Triton through a share move."""

from __future__ import annotations

import math
import socket
import threading
import time
import urllib.request

import numpy as np
import pytest
from control_helpers import wait_for
from triton_helpers import DEMO_REPO

from agents.agent import Agent
from agents.loadgen import LoadGenerator
from agents.router import Router, RouterError, advertised_host, host_port, label_metrics, parse_port_range
from agents.triton import TritonFleet
from controller.messages import HeartbeatAnswer, HeartbeatReport, ModelAssignment, NodeDevice

# ------------------------------------------------------------------ units (no Triton)


def test_port_ranges_and_advertised_hosts():
    assert parse_port_range("0") is None and parse_port_range("") is None
    assert parse_port_range("8100-8199") == (8100, 8199)
    for bad in ("8100", "8199-8100", "a-b", "0-10", "1-70000"):
        with pytest.raises(ValueError):
            parse_port_range(bad)
    assert advertised_host("10.1.2.3", None) == "10.1.2.3"
    assert advertised_host("0.0.0.0", "node-a.example") == "node-a.example"
    assert advertised_host("0.0.0.0", None) not in ("0.0.0.0", "")  # the machine's name, never a wildcard
    assert host_port("::1", 8100) == "[::1]:8100" and host_port("node-a", 8100) == "node-a:8100"


def free_port_range(size: int) -> int:
    """The first port of `size` ports that are free now, below Linux's ephemeral range (32768 and up by
    default), where the system hands out ports to outbound connections: one took a port of this test's
    range from under it in a fresh-clone run."""
    for attempt in range(50):
        low = 20000 + (int(time.time() * 1000) + 997 * attempt) % (12000 - size) // 2 * 2
        sockets = []
        try:
            for port in range(low, low + size):
                s = socket.socket()
                sockets.append(s)
                s.bind(("127.0.0.1", port))
            return low
        except OSError:
            continue
        finally:
            for s in sockets:
                s.close()
    raise AssertionError(f"no {size} free ports in a row between 20000 and 32000")


def test_a_workload_keeps_its_ports_across_restarts_and_a_taken_pair_is_skipped():
    low = free_port_range(40)
    first = Router("127.0.0.1", ports=(low, low + 39))
    try:
        a = first.set_backends("photo-tagging", [])
        b = first.set_backends("doc-layout", [])
    finally:
        first.close()
    again = Router("127.0.0.1", ports=(low, low + 39))
    try:
        assert again.set_backends("photo-tagging", []) == a  # the same pair from the name, after a restart
        assert again.set_backends("doc-layout", []) == b
    finally:
        again.close()
    tiny = Router("127.0.0.1", ports=(low, low + 1))
    try:
        tiny.set_backends("one", [])
        with pytest.raises(RouterError, match="widen the agent's --ports range"):
            tiny.set_backends("two", [])
    finally:
        tiny.close()


def test_metrics_of_several_replicas_are_labelled_and_families_stay_together():
    text = (
        "# HELP nv_inference_count Inferences\n# TYPE nv_inference_count counter\n"
        'nv_inference_count{model="m",version="1"} 3\n'
        "# HELP up Up\n# TYPE up gauge\nup 1\n"
    )
    merged = label_metrics([("0", text), ("1", text.replace(" 3\n", " 5\n"))])
    lines = merged.splitlines()
    assert lines.count("# TYPE nv_inference_count counter") == 1
    i = lines.index('nv_inference_count{model="m",version="1",replica="0"} 3')
    assert lines[i + 1] == 'nv_inference_count{model="m",version="1",replica="1"} 5'  # grouped with its family
    assert 'up{replica="0"} 1' in lines and 'up{replica="1"} 1' in lines
    from prometheus_client.parser import text_string_to_metric_families

    assert {f.name for f in text_string_to_metric_families(merged)} == {"nv_inference_count", "up"}


def test_a_workload_without_a_process_answers_unavailable_not_a_hang():
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    router = Router("127.0.0.1")
    try:
        ep = router.set_backends("idle", [])
        client = grpcclient.InferenceServerClient(ep.grpc)
        with pytest.raises(InferenceServerException, match="no Triton process serves it"):
            client.is_server_live(client_timeout=5)
        client.close()
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(ep.http + "/v2/health/live", timeout=5)
        assert err.value.code == 503
    finally:
        router.close()


# ------------------------------------------------------------------ a real agent, real Triton


class ScriptedController:
    """The controller side of the agent's protocol, scripted: hands out the assignments a test sets."""

    def __init__(self, assignments: tuple[ModelAssignment, ...]) -> None:
        self.assignments, self.revision = assignments, 1
        self.reports: list[HeartbeatReport] = []
        self.address = ""

    def register(self, node_id: str, devices, address: str = "") -> float:
        self.address = address
        return 0.2

    def heartbeat(self, report: HeartbeatReport) -> HeartbeatAnswer:
        self.reports.append(report)
        return HeartbeatAnswer(True, self.revision, self.assignments, 0.2)

    def move(self, assignments: tuple[ModelAssignment, ...]) -> None:
        self.assignments, self.revision = assignments, self.revision + 1


def echo(share: float) -> ModelAssignment:
    return ModelAssignment("echo", "tiny_echo", 0, share, 4, 1.0, 100.0, 100.0)


@pytest.mark.triton
def test_clients_keep_working_with_no_failed_request_through_a_share_move(tmp_path):
    import tritonclient.http as httpclient

    controller = ScriptedController((echo(50.0),))
    fleet = TritonFleet(str(DEMO_REPO), workdir=str(tmp_path), ready_timeout_s=60, router=Router("127.0.0.1"))
    agent = Agent(controller, fleet, "n1", (NodeDevice(0, "cpu", "cpu", cores=2),), address="127.0.0.1")
    agent.start()
    stop = threading.Event()
    try:
        report = wait_for(
            "the first endpoint reported", lambda: next((r for r in controller.reports if r.endpoints), None)
        )
        ep = report.endpoints[0]
        assert (ep.key, controller.address) == ("echo#0", "127.0.0.1")
        assert ep.grpc.startswith("127.0.0.1:") and ep.http.startswith("http://127.0.0.1:") and ep.backend != ep.grpc
        with urllib.request.urlopen(ep.metrics, timeout=5) as reply:
            assert 'nv_inference_request_success{model="tiny_echo"' in reply.read().decode()

        results: dict[str, object] = {}
        http_errors: list[str] = []
        http_ok = [0]

        def grpc_load() -> None:
            with LoadGenerator(ep.grpc, "tiny_echo") as gen:
                results["grpc"] = gen.run(120.0, math.inf, arrival="poisson", seed=7, stop=stop)

        def http_load() -> None:  # a second client on the HTTP endpoint, back to back
            client = httpclient.InferenceServerClient(ep.http.removeprefix("http://"))
            data = np.ones((1, 8), dtype=np.float32)
            tensor = httpclient.InferInput("INPUT0", [1, 8], "FP32")
            tensor.set_data_from_numpy(data)
            while not stop.is_set():
                try:
                    out = client.infer("tiny_echo", [tensor]).as_numpy("OUTPUT0")
                    assert out.shape == (1, 8)
                    http_ok[0] += 1
                except Exception as err:  # noqa: BLE001 - every failure is counted
                    http_errors.append(str(err))
                time.sleep(0.01)
            client.close()

        loaders = [threading.Thread(target=grpc_load), threading.Thread(target=http_load)]
        for t in loaders:
            t.start()
        time.sleep(1.5)
        controller.move((echo(100.0),))  # a share change: a new Triton process
        moved = wait_for(
            "the move",
            lambda: next(
                (r for r in reversed(controller.reports) if r.endpoints and r.endpoints[0].backend != ep.backend), None
            ),
        )
        assert any("moved echo#0" in e for r in controller.reports for e in r.events)
        time.sleep(1.5)
        stop.set()
        for t in loaders:
            t.join(timeout=30)
        load = results["grpc"]
        assert load.sent > 200 and load.failed == 0 and load.errors == (), load
        assert http_ok[0] > 20 and http_errors == []
        after = moved.endpoints[0]
        assert (after.grpc, after.http, after.metrics) == (ep.grpc, ep.http, ep.metrics)  # what clients use stays put
        assert after.backend != ep.backend  # the process behind it changed
    finally:
        stop.set()
        agent.stop()


def test_a_wedged_router_reports_that_it_cannot_serve():
    router = Router("127.0.0.1")
    try:
        router.set_backends("idle", [])
        assert router.problems() == []
        router._loop.call_soon_threadsafe(time.sleep, 3.0)  # its event loop stops answering for 3 s
        problems = router.problems(timeout_s=1.0)
        assert len(problems) == 1 and "router of idle" in problems[0]
        time.sleep(2.5)
        assert router.problems() == []
    finally:
        router.close()
