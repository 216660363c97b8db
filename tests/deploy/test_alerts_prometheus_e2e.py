"""The generated rules loaded by a real Prometheus scraping a real histogram endpoint on loopback.

The serving path's exporter (`agents.latency_metrics`, which prints `le="15.0"`, the float
form) is fed latencies: one workload gets 10 % slow requests, another none. Real
Prometheus scrapes it, evaluates the recording rules and fires the page and ticket alerts
for the burning workload only.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from processes import stop_process

from agents.latency_metrics import RequestLatencyExporter
from deploy.alerts import RULES_FILE, render_all
from planner.solver.problem import Workload

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.promtool,
    pytest.mark.skipif(
        shutil.which("prometheus") is None,
        reason="prometheus not installed: run `make tools` (Debian package prometheus)",
    ),
]

BURNING = Workload("photo-tagging", "alexnet", 15, 500)
HEALTHY = Workload("search", "resnet50", 40, 100)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _query(base: str, expr: str) -> list[dict]:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=5) as resp:
        body = json.load(resp)
    assert body["status"] == "success", body
    return body["data"]["result"]


@pytest.fixture
def histogram_target():
    exporter = RequestLatencyExporter([BURNING.slo_ms, HEALTHY.slo_ms])
    burning = exporter.recorder(BURNING.name, BURNING.model)
    healthy = exporter.recorder(HEALTHY.name, HEALTHY.model)
    stop = threading.Event()

    def traffic() -> None:
        while not stop.is_set():
            for _ in range(9):
                burning(3.0)
            burning(20.0)  # 10 % slower than the 15 ms SLO
            for _ in range(10):
                healthy(30.0)  # all within 40 ms
            stop.wait(0.05)

    thread = threading.Thread(target=traffic, daemon=True)
    thread.start()
    exporter.serve(0)
    try:
        yield exporter.port
    finally:
        stop.set()
        thread.join(5)
        exporter.close()


@pytest.fixture
def prometheus(tmp_path: Path, histogram_target: int):
    (tmp_path / RULES_FILE).write_text(render_all([BURNING, HEALTHY])[RULES_FILE])
    (tmp_path / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        f"rule_files: [{RULES_FILE}]\n"
        "scrape_configs:\n"
        f"  - job_name: triton\n    static_configs: [{{targets: ['127.0.0.1:{histogram_target}']}}]\n"
    )
    port = _free_port()
    proc = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=open(tmp_path / "prometheus.log", "w"),
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{base}/-/ready", timeout=1).read()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        "prometheus did not start: " + (tmp_path / "prometheus.log").read_text()[-2000:]
                    ) from None
                time.sleep(0.2)
        yield base
    finally:
        stop_process(proc)


def test_real_prometheus_records_the_sli_and_pages_only_the_burning_workload(prometheus: str):
    deadline = time.monotonic() + 60
    firing: set[tuple[str, str]] = set()
    ratio: dict[str, float] = {}
    objective: list[dict] = []
    remaining: list[dict] = []
    while time.monotonic() < deadline:  # groups start at staggered offsets: wait for every result
        ratio = {
            r["metric"]["workload"]: float(r["value"][1]) for r in _query(prometheus, "slo:sli_error:ratio_rate5m")
        }
        firing = {
            (r["metric"]["workload"], r["metric"]["severity"])
            for r in _query(prometheus, 'ALERTS{alertstate="firing"}')
        }
        objective = _query(prometheus, 'slo:objective:ratio{workload="search"}')
        remaining = _query(prometheus, 'slo:period_error_budget_remaining:ratio{workload="search"}')
        if (
            {("photo-tagging", "page"), ("photo-tagging", "ticket")} <= firing
            and "search" in ratio
            and objective
            and remaining
        ):
            break
        time.sleep(0.5)
    assert firing == {("photo-tagging", "page"), ("photo-tagging", "ticket")}
    assert abs(ratio["photo-tagging"] - 0.1) < 0.02 and ratio["search"] == 0.0
    assert [float(r["value"][1]) for r in objective] == [0.999]
    assert [float(r["value"][1]) for r in remaining] == [1.0]


@pytest.fixture
def controller_target(tmp_path: Path):
    """A real controller service with one workload it cannot place (no node), its /metrics on loopback."""
    from control_helpers import cpu_profile_json

    from controller.metrics import ControllerMetrics
    from controller.service import ControlService
    from controller.store import Store

    svc = ControlService(Store(tmp_path / "stoke.db"))
    svc.upload_profile(cpu_profile_json())
    svc.apply_workloads([{"name": "starved", "model": "mlp_small", "slo_ms": 50, "rate_rps": 10}])
    svc.reconcile()
    assert svc.status().workloads[0].state == "pending"
    server, thread = ControllerMetrics(svc).serve("127.0.0.1", 0)
    try:
        yield server.server_port
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
        svc.store.close()


def test_real_prometheus_fires_the_pending_alert_for_a_workload_pending_past_the_threshold(
    tmp_path: Path, controller_target: int
):
    from deploy.alerts import SloOptions

    starved = Workload("starved", "mlp_small", 50, 10)
    rules = render_all([starved], SloOptions(pending_for="3s"))[RULES_FILE]
    (tmp_path / RULES_FILE).write_text(rules)
    (tmp_path / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        f"rule_files: [{RULES_FILE}]\n"
        "scrape_configs:\n"
        f"  - job_name: stoke\n    static_configs: [{{targets: ['127.0.0.1:{controller_target}']}}]\n"
    )
    port = _free_port()
    with open(tmp_path / "prometheus.log", "w") as log:
        proc = subprocess.Popen(
            [
                "prometheus",
                f"--config.file={tmp_path / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp_path / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        states: dict[str, str] = {}
        while time.monotonic() < deadline:
            try:
                alerts = _query(base, 'ALERTS{alertname="StokeWorkloadPending"}')
            except OSError:
                if proc.poll() is not None:
                    raise RuntimeError((tmp_path / "prometheus.log").read_text()[-2000:]) from None
                time.sleep(0.3)
                continue
            states = {a["metric"]["workload"]: a["metric"]["alertstate"] for a in alerts}
            if states.get("starved") == "firing":
                break
            time.sleep(0.3)
        assert states == {"starved": "firing"}, states
        held = _query(base, 'ALERTS{alertname="StokePlanHeld"}')
        assert held == []  # a pending workload is not a held plan
    finally:
        stop_process(proc)
