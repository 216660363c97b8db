"""End to end on loopback: a controller and two agents (CPU devices) as real processes, real Triton servers.

One shared stack, tests run in file order (each builds on the state the one before left: `earlier`).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from control_helpers import cpu_profile_json, wait_for

from controller.api import stoke_pb2 as pb
from controller.api.client import ControllerClient
from controller.messages import InvalidArgument, Unauthenticated
from interference.profile_io import load_profile
from planner.solver import Workload
from stoke.commands.demo import demo_workloads

pytestmark = [pytest.mark.e2e, pytest.mark.triton]

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "e2e-token"
HEARTBEAT_S = 0.3
TIMEOUT_S = 3.0

try:
    from agents.triton import find_tritonserver

    find_tritonserver()
except Exception as err:  # noqa: BLE001
    pytest.skip(f"tritonserver not available: {err}", allow_module_level=True)
if len(os.sched_getaffinity(0)) < 2:  # the bundled cpu-2core profile plans two workloads at 50% each
    pytest.skip("the planned shares need a second core", allow_module_level=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


class Proc:
    def __init__(self, name: str, args: list[str], log: Path) -> None:
        self.name, self.args, self.log = name, args, log
        self.popen: subprocess.Popen | None = None

    def start(self) -> Proc:
        handle = open(self.log, "ab")
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "stoke", *self.args],
            cwd=ROOT,
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        handle.close()
        return self

    def stop(self) -> None:
        if self.popen is None or self.popen.poll() is not None:
            return
        tree = descendants(self.popen.pid)
        self.popen.send_signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()
        self._kill(tree)

    def kill_hard(self) -> None:
        """SIGKILL the process and everything it started (its Triton servers): a dead node."""
        assert self.popen is not None
        tree = descendants(self.popen.pid)
        self.popen.kill()
        self.popen.wait()
        self._kill(tree)

    @staticmethod
    def _kill(pids: list[int]) -> None:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("e2e")
    (tmp / "token").write_text(TOKEN + "\n")
    (tmp / "token").chmod(0o600)
    (tmp / "cpu.json").write_text(cpu_profile_json())
    port = free_port()
    (tmp / "controller.yaml").write_text(
        f"listen: 127.0.0.1:{port}\nmetrics_listen: ''\ndb: controller.db\ntoken_file: token\n"
        f"heartbeat_interval_s: {HEARTBEAT_S}\nheartbeat_timeout_s: {TIMEOUT_S}\nreconcile_interval_s: 0.2\n"
        f"profiles:\n  - path: cpu.json\n"
    )
    address = f"127.0.0.1:{port}"
    controller = Proc(
        "controller",
        ["controller", "--config", str(tmp / "controller.yaml"), "--log-level", "WARNING"],
        tmp / "controller.log",
    )
    agents = {
        n: Proc(
            n,
            [
                "agent",
                "--controller",
                address,
                "--token-file",
                str(tmp / f"{n}.token"),
                "--node-id",
                n,
                "--device",
                "cpu",
                "--repository",  # the old spelling of --repo still works (hidden alias)
                str(ROOT / "triton_repo"),
                "--workdir",
                str(tmp / n),
                "--log-level",
                "WARNING",
                *(["--bind", "127.0.0.1", "--advertise", "localhost"] if n == "n1" else []),
            ],
            tmp / f"{n}.log",
        )
        for n in ("n1", "n2")
    }
    client = ControllerClient(address, token=TOKEN, timeout_s=5)
    stack = {"tmp": tmp, "address": address, "controller": controller, "agents": agents, "client": client}
    try:
        controller.start()
        wait_for("the controller", lambda: client.list_workloads() == [] or True, 30)
        for n, a in agents.items():  # each agent holds its own node's token
            (tmp / f"{n}.token").write_text(client.mint_agent_token(n).token + "\n")
            (tmp / f"{n}.token").chmod(0o600)
            a.start()
        wait_for(
            "two ready nodes",
            lambda: sorted(n.node_id for n in client.list_nodes().nodes if n.state == "ready") == ["n1", "n2"],
            30,
        )
        yield stack
    finally:
        client.close()
        for a in agents.values():
            a.stop()
        controller.stop()


def serving(client, names=None):
    status = client.status()
    items = [w for w in status.workloads if names is None or w.name in names]
    return (
        status if items and all(w.state == "serving" and all(r.endpoint for r in w.replicas) for w in items) else None
    )


def triton_config(endpoint: str, model: str):
    import tritonclient.grpc as grpcclient

    c = grpcclient.InferenceServerClient(endpoint)
    try:
        return c.get_model_config(model).config
    finally:
        c.close()


def earlier(stack: dict, key: str, test: str):
    """What an earlier test left in the shared stack; skipped, naming that test, when it failed first."""
    if key not in stack:
        pytest.skip(f"needs stack[{key!r}], which {test} sets: it failed or did not run")
    return stack[key]


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "stoke", *args], cwd=ROOT, capture_output=True, text=True, timeout=60)


def test_call_without_token_is_refused(stack):
    with ControllerClient(stack["address"]) as anon:
        with pytest.raises(Unauthenticated):
            anon.list_workloads()
    result = cli("workload", "ls", "--controller", stack["address"])
    assert result.returncode == 2 and "missing bearer token" in result.stderr


def test_malformed_workload_is_refused_and_nothing_stored(stack):
    client = stack["client"]
    request = pb.ApplyWorkloadsRequest(
        workloads=[
            pb.Workload(name="fine", model="mlp_small", slo_ms=100, rate_rps=10),
            pb.Workload(name="broken", model="mlp_small", slo_ms=-5, rate_rps=10),
        ]
    )
    with pytest.raises(InvalidArgument) as err:
        client.apply_raw(request)
    assert "workloads[1].slo_ms" in str(err.value)
    bad = stack["tmp"] / "bad.yaml"
    bad.write_text("workloads:\n  - {name: x, model: mlp_small, slo_ms: 100}\n")
    result = cli(
        "workload",
        "apply",
        "-f",
        str(bad),
        "--controller",
        stack["address"],
        "--token-file",
        str(stack["tmp"] / "token"),
    )
    assert result.returncode == 2 and "rate_rps" in result.stderr and str(bad) in result.stderr
    assert client.list_workloads() == []


def test_applied_workloads_are_served_with_planned_configs(stack):
    client = stack["client"]
    good = stack["tmp"] / "good.yaml"
    good.write_text(
        "workloads:\n  - {name: web, model: mlp_small, slo_ms: 100, rate_rps: 20}\n"
        "  - {name: emb, model: embed_large, slo_ms: 100, rate_rps: 20}\n"
    )
    started = time.monotonic()
    result = cli(
        "workload",
        "apply",
        "-f",
        str(good),
        "--controller",
        stack["address"],
        "--token-file",
        str(stack["tmp"] / "token"),
        "--json",
    )
    assert result.returncode == 0, result.stderr
    status = wait_for("both workloads serving", lambda: serving(client), 60)
    print(f"apply -> serving: {time.monotonic() - started:.1f}s")
    plan = client.get_plan().plan
    planned = {p.workload: (g.node_id, p.batch, p.share_pct) for g in plan.gpus for p in g.placements}
    assert set(planned) == {"web", "emb"}
    for w in status.workloads:
        r = w.replicas[0]
        assert (r.node_id, r.batch, r.share_pct) == planned[w.name]
        # the stable endpoints (the agent's router) reach the Triton process (r.backend) serving the planned config
        host = "localhost" if r.node_id == "n1" else "127.0.0.1"  # n1 runs with --advertise localhost
        assert r.endpoint.startswith(f"{host}:") and r.http_endpoint.startswith(f"http://{host}:")
        assert r.backend.startswith("127.0.0.1:") and r.backend != r.endpoint
        assert triton_config(r.endpoint, w.model).max_batch_size == r.batch
        with urllib.request.urlopen(r.metrics_endpoint, timeout=10) as reply:
            assert f'nv_inference_request_success{{model="{w.model}"' in reply.read().decode()
    stack["endpoints"] = {w.name: w.replicas[0].endpoint for w in status.workloads}
    stack["backends"] = {w.name: w.replicas[0].backend for w in status.workloads}
    # the CLI shows them: the status table (gRPC, HTTP, metrics per replica) and nodes --json
    token = ["--controller", stack["address"], "--token-file", str(stack["tmp"] / "token")]
    table = cli("status", *token)
    assert table.returncode == 0, table.stderr
    for w in status.workloads:
        r = w.replicas[0]
        row = next(line for line in table.stdout.splitlines() if line.startswith(w.name) and r.endpoint in line)
        assert row.split()[3:] == [r.endpoint, r.http_endpoint, r.metrics_endpoint]
    nodes = json.loads(cli("nodes", *token, "-o", "json").stdout)
    listed = {e["key"]: e for n in nodes for e in n["endpoints"]}
    assert {k: (e["grpc"], e["http"], e["metrics"]) for k, e in listed.items()} == {
        f"{w.name}#0": (w.replicas[0].endpoint, w.replicas[0].http_endpoint, w.replicas[0].metrics_endpoint)
        for w in status.workloads
    }
    assert {n["node_id"]: n["address"] for n in nodes} == {"n1": "localhost", "n2": "127.0.0.1"}


def test_rate_change_changes_batch_and_reaches_triton(stack):
    client = stack["client"]
    before = earlier(stack, "endpoints", "test_applied_workloads_are_served_with_planned_configs")
    backends = earlier(stack, "backends", "test_applied_workloads_are_served_with_planned_configs")
    revision = client.get_plan().plan.revision
    old_batch = next(p.batch for g in client.get_plan().plan.gpus for p in g.placements if p.workload == "web")
    client.apply_workloads([Workload("web", "mlp_small", 100, 300)])

    def new_batch():
        status = serving(client)
        if status is None or status.revision == revision:
            return None
        web = next(w for w in status.workloads if w.name == "web")
        return status if web.replicas[0].batch > old_batch else None

    status = wait_for("web reloaded with a larger batch", new_batch, 60)
    web = next(w for w in status.workloads if w.name == "web")
    emb = next(w for w in status.workloads if w.name == "emb")
    assert triton_config(web.replicas[0].endpoint, "mlp_small").max_batch_size == web.replicas[0].batch
    # a batch change reloads in place; the unrelated workload is untouched
    assert web.replicas[0].endpoint == before["web"] and emb.replicas[0].endpoint == before["emb"]
    assert web.replicas[0].backend == backends["web"]  # the same process, reloaded
    stack["endpoints"] = {w.name: w.replicas[0].endpoint for w in status.workloads}
    stack["backends"] = {w.name: w.replicas[0].backend for w in status.workloads}


def test_controller_restart_keeps_workloads_and_plan(stack):
    client = stack["client"]
    endpoints = earlier(stack, "endpoints", "test_applied_workloads_are_served_with_planned_configs")
    backends = earlier(stack, "backends", "test_applied_workloads_are_served_with_planned_configs")
    revision = client.get_plan().plan.revision
    workloads = client.list_workloads()
    stack["controller"].stop()
    stack["controller"].start()
    wait_for("the controller back", lambda: client.list_workloads() == workloads, 30)
    assert client.get_plan().plan.revision == revision
    wait_for(
        "both nodes back",
        lambda: sorted(n.node_id for n in client.list_nodes().nodes if n.state == "ready") == ["n1", "n2"],
        30,
    )
    status = wait_for("serving after the restart", lambda: serving(client), 30)
    assert status.revision == revision
    assert {w.name: w.replicas[0].backend for w in status.workloads} == backends  # no Triton restart
    assert {w.name: w.replicas[0].endpoint for w in status.workloads} == endpoints


def test_killed_agent_moves_its_workloads_to_the_other(stack):
    client = stack["client"]
    earlier(stack, "endpoints", "test_applied_workloads_are_served_with_planned_configs")  # something to move
    status = client.status()
    victim = status.workloads[0].replicas[0].node_id
    survivor = ({"n1", "n2"} - {victim}).pop()
    stack["agents"][victim].kill_hard()
    killed = time.monotonic()

    def replanned():
        nodes = {g.node_id for g in client.get_plan().plan.gpus}
        return nodes == {survivor}

    wait_for("a plan without the dead node", replanned, TIMEOUT_S + 5, interval=0.1)
    replanned_after = time.monotonic() - killed
    assert {n.node_id: n.state for n in client.list_nodes().nodes}[victim] == "lost"
    status = wait_for("serving on the survivor", lambda: serving(client), 60)
    print(f"killed node: re-planned after {replanned_after:.1f}s, serving after {time.monotonic() - killed:.1f}s")
    assert replanned_after <= TIMEOUT_S + 3
    assert {r.node_id for w in status.workloads for r in w.replicas} == {survivor}

    stack["survivor"] = survivor


def test_triton_crash_is_restarted_and_reported(stack):
    client = stack["client"]
    survivor = earlier(stack, "survivor", "test_killed_agent_moves_its_workloads_to_the_other")
    agent = stack["agents"][survivor].popen
    servers = [
        pid
        for pid in descendants(agent.pid)
        if b"tritonserver" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
    ]
    assert servers, "the surviving agent runs no Triton server"
    os.kill(servers[0], signal.SIGKILL)

    def reported():
        node = next(n for n in client.list_nodes().nodes if n.node_id == survivor)
        return any("restarted as pid" in e for e in node.events)

    wait_for("the crash restart reported by the agent", reported, 30)
    wait_for("serving again", lambda: serving(client), 30)


def test_stoke_up_serves_the_demo_within_a_minute_and_summarises_the_run(tmp_path):
    """`stoke up` piped: plain blocks (no escape codes), the client-side p99 and share over the SLO, a summary."""
    result = subprocess.run(
        [sys.executable, "-m", "stoke", "up", "--seconds", "16", "--interval", "2"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    out = result.stdout
    assert "\x1b" not in out
    ready = re.search(r"(\d+) of (\d+) workload\(s\) serving their planned configs after ([\d.]+)s", out)
    assert ready and ready.group(1) == ready.group(2) and float(ready.group(3)) < 60
    assert "client_p99_ms  over_slo" in out  # the live view shows what the load sees
    lines = out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("summary after"))
    assert lines[head + 1].split() == [
        "workload",
        "state",
        "slo_ms",
        "rate_rps",
        "start_p99_ms",
        "plan_p99_ms",
        "requests",
        "failed",
        "client_p50_ms",
        "client_p99_ms",
        "over_slo",
        "held",
    ]
    legend = ("client figures", "plan_p99_ms:")
    load_s = 16 - float(ready.group(3))  # the load starts once every workload serves, and ends at 16 s
    rows = [line.split() for line in lines[head + 3 :] if line and not line.startswith(legend)]
    assert len(rows) == 2
    profile = load_profile(ROOT / "interference" / "data" / "cpu-2core-profile.json")
    models = {w.name: w.model for w in demo_workloads(None)}
    for row in rows:
        name, state, rate, requests, failed = row[0], row[1], float(row[3]), int(row[6]), int(row[7])
        # degraded: still served, best effort, when the closed loop learnt (from its clients' pooled p99 on a slow
        # host) that the SLO can no longer be promised; no request may fail either way
        assert state in ("serving", "degraded") and failed == 0
        assert requests > 0.6 * rate * max(1.0, load_s - 1.0)  # one continuous schedule from the start to the end
        # the measured serving path is in the plan's p99, beside what the client saw and whether it held
        serving = profile.model(models[name]).serving_p99_ms
        assert serving > 0 and float(row[4]) > serving and float(row[5]) > serving
        assert float(row[9]) > 0 and row[11] in ("yes", "no")
