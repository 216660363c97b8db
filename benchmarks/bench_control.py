"""Control-plane benchmark: prints figures (no pass/fail).

1. apply -> serving: time from `workload apply` (gRPC ApplyWorkloads) until the
   agent reports the model running with its planned config (real controller,
   one real agent with real Triton on CPU, in process), for a new workload and
   for a rate change that changes its batch (a reload).
2. scale: a controller *process* (`stoke controller`) with 100 simulated nodes
   (2 V100 each, agents simulated in this process: the real `Agent` loop over
   real gRPC, a fake Triton fleet) and 500 workloads: first reconcile and
   convergence (every node running its assignments), solve time, an
   incremental change (one workload's rate doubled: reconcile time and how
   many assignments moved), and the controller's memory (VmRSS / VmHWM).
   Then re-planning at fleet scale: the controller's planning step (observe -> solve -> bind, its
   solver memo kept) with 10,000 workloads placed, one workload's rate changed five times: time of
   each re-plan and the assignments it moved (`bench_scale.replan`).
3. agent overhead: CPU seconds the agent spends per Triton metrics scrape
   (`TritonFleet.observe`) with 3 models served.

    .venv/bin/python benchmarks/bench_control.py [--quick]
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")  # before grpc loads: no fork notices from Triton starts

from agents.agent import Agent  # noqa: E402
from controller.api.client import ControllerClient  # noqa: E402
from controller.messages import ModelAssignment, NodeDevice, Replica  # noqa: E402
from planner.solver import Workload  # noqa: E402
from stoke.progress import Progress  # noqa: E402

TOKEN = "bench-token"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait(fn, timeout: float, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError("condition not met in time")


# --------------------------------------------------------------------------- 1. apply -> serving


def bench_apply_to_serving(tmp: Path) -> None:
    from agents.triton import TritonFleet
    from controller.config import ControllerConfig, ProfileSource, ServiceConfig
    from controller.server import ControllerServer
    from interference.profile_io import save_profile
    from stoke.commands.demo import demo_cpu_profile

    save_profile(demo_cpu_profile(), tmp / "cpu.json")
    (tmp / "token").write_text(TOKEN)
    server = ControllerServer(
        ControllerConfig(
            listen="127.0.0.1:0",
            metrics_listen="",
            db=str(tmp / "apply.db"),
            token_file=str(tmp / "token"),
            reconcile_interval_s=0.1,
            profiles=(ProfileSource(str(tmp / "cpu.json"), "CPU"),),
            service=ServiceConfig(heartbeat_interval_s=0.2, heartbeat_timeout_s=5.0),
        )
    ).start()
    client = ControllerClient(server.address, token=TOKEN)
    fleet = TritonFleet(str(ROOT / "triton_repo"), device_kind="cpu", workdir=str(tmp / "triton"))
    agent = Agent(
        ControllerClient(server.address, token=client.mint_agent_token("n1").token),
        fleet,
        "n1",
        (NodeDevice(0, "cpu", "cpu"),),
        heartbeat_interval_s=0.2,
    )
    agent.start()
    try:
        wait(lambda: any(n.state == "ready" for n in client.list_nodes().nodes), 10)

        def serving_with(batch_min: int = 1):
            s = client.status()
            return all(w.state == "serving" and w.replicas[0].batch >= batch_min for w in s.workloads) and s.workloads

        t0 = time.monotonic()
        client.apply_workloads([Workload("web", "mlp_small", 100, 20)])
        wait(serving_with, 60)
        new_s = time.monotonic() - t0
        t0 = time.monotonic()
        client.apply_workloads([Workload("web", "mlp_small", 100, 300)])
        wait(lambda: serving_with(2), 60)
        reload_s = time.monotonic() - t0
        print(f"apply -> serving (new workload, Triton process start + load): {new_s:.2f} s")
        print(f"apply -> serving (rate change -> batch change, model reload):  {reload_s:.2f} s")
        t0 = time.process_time()
        n = 40
        for _ in range(n):
            fleet.observe()
        per = (time.process_time() - t0) / n
        print(f"agent CPU per metrics scrape (TritonFleet.observe, 1 model):   {per * 1000:.2f} ms")
        client.apply_workloads([Workload("emb", "embed_large", 100, 20), Workload("vis", "conv_medium", 200, 5)])
        wait(serving_with, 60)
        t0 = time.process_time()
        for _ in range(n):
            fleet.observe()
        per = (time.process_time() - t0) / n
        print(
            f"agent CPU per metrics scrape (TritonFleet.observe, 3 models):  {per * 1000:.2f} ms "
            f"(at a 2 s heartbeat: {per / 2 * 100:.2f}% of one core)"
        )
    finally:
        agent.stop()
        client.close()
        server.stop()


# --------------------------------------------------------------------------- 2. scale


class SimFleet:
    """Instant fleet: serves whatever it is told; observes nothing expensive."""

    def __init__(self) -> None:
        self.serving: dict[str, ModelAssignment] = {}

    def refusals(self, assignments):
        return []

    def apply(self, assignments):
        self.serving = {a.key: a for a in assignments}
        return type("Report", (), {"errors": (), "started": tuple(self.serving)})()

    def observe(self):
        return []

    def check_health(self):
        return []

    def running(self):
        return list(self.serving.values())

    def close(self):
        self.serving = {}


def rss_kib(pid: int) -> tuple[int, int]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0])
    return fields["VmRSS"], fields["VmHWM"]


def bench_scale(tmp: Path, nodes: int, workloads: int) -> None:
    from interference.profile_io import BUNDLED_PROFILE

    profile = ROOT / "interference" / "data" / BUNDLED_PROFILE
    port, metrics_port = free_port(), free_port()
    (tmp / "token").write_text(TOKEN)
    (tmp / "scale.yaml").write_text(
        f"listen: 127.0.0.1:{port}\nmetrics_listen: 127.0.0.1:{metrics_port}\ndb: scale.db\ntoken_file: token\n"
        f"heartbeat_interval_s: 1.0\nheartbeat_timeout_s: 15\nreconcile_interval_s: 0.2\n"
        f"gpu_types:\n  - {{name: V100, price_per_hour: 3.06, match: [V100]}}\n"
        f"profiles:\n  - path: {profile}\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "stoke", "controller", "--config", str(tmp / "scale.yaml"), "--log-level", "WARNING"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=open(tmp / "scale.log", "wb"),
    )
    address = f"127.0.0.1:{port}"
    client = ControllerClient(address, token=TOKEN, timeout_s=120)
    agents: list[Agent] = []
    try:
        wait(lambda: _up(client), 60, 0.2)
        base_rss, _ = rss_kib(proc.pid)
        devices = (NodeDevice(0, "Tesla V100-SXM2-16GB", "gpu"), NodeDevice(1, "Tesla V100-SXM2-16GB", "gpu"))
        for i in range(nodes):
            a = Agent(
                ControllerClient(address, token=client.mint_agent_token(f"node-{i:03d}").token, timeout_s=30),
                SimFleet(),
                f"node-{i:03d}",
                devices,
                heartbeat_interval_s=1.0,
            )
            a.start()
            agents.append(a)
        wait(lambda: sum(n.state == "ready" for n in client.list_nodes().nodes) == nodes, 120, 0.2)
        rng = random.Random(0)
        slo = {"alexnet": (15, 40), "resnet50": (40, 100), "vgg19": (60, 150), "ssd": (80, 200)}
        items = []
        for i in range(workloads):
            m = rng.choice(sorted(slo))
            items.append(Workload(f"w{i:03d}", m, round(rng.uniform(*slo[m]), 1), round(rng.uniform(10, 150), 1)))
        t0 = time.monotonic()
        client.apply_workloads(items)
        applied = wait(lambda: _plan_revision(client), 300, 0.05)
        plan_s = time.monotonic() - t0
        plan = client.get_plan().plan
        expected = {g.node_id: {str(Replica(p.workload, p.replica)) for p in g.placements} for g in plan.gpus}
        per_node: dict[str, set[str]] = {}
        for g in plan.gpus:
            per_node.setdefault(g.node_id, set()).update(str(Replica(p.workload, p.replica)) for p in g.placements)
        wait(lambda: all(set(a.fleet.serving) == per_node.get(a.node_id, set()) for a in agents), 120, 0.05)
        converge_s = time.monotonic() - t0
        del expected
        print(
            f"scale: {nodes} nodes x 2 V100, {workloads} workloads -> plan revision {applied}: "
            f"{len(plan.gpus)} GPUs, ${plan.cost_per_hour:,.2f}/h, pending {len(plan.pending)}"
        )
        print(f"  apply -> plan stored (solve + bind + store):              {plan_s:.2f} s")
        print(f"  apply -> all {nodes} simulated agents running their assignments: {converge_s:.2f} s")
        before = {
            str(Replica(p.workload, p.replica)): (g.node_id, g.device, p.share_pct, p.batch)
            for g in plan.gpus
            for p in g.placements
        }
        target = items[7]
        t0 = time.monotonic()
        client.apply_workloads([Workload(target.name, target.model, target.slo_ms, target.rate_rps * 2)])
        wait(lambda: _plan_revision(client) > applied, 120, 0.05)
        change_s = time.monotonic() - t0
        plan2 = client.get_plan().plan
        after = {
            str(Replica(p.workload, p.replica)): (g.node_id, g.device, p.share_pct, p.batch)
            for g in plan2.gpus
            for p in g.placements
        }
        moved = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
        moved_other = [k for k in moved if not k.startswith(target.name + "#")]
        print(
            f"  one workload's rate doubled -> new plan stored:         {change_s:.2f} s; assignments changed: "
            f"{len(moved)} ({len(moved_other)} of other workloads)"
        )
        t0 = time.monotonic()
        status = client.status()
        status_s = time.monotonic() - t0
        rss, hwm = rss_kib(proc.pid)
        print(f"  GetStatus with {len(status.workloads)} workloads: {status_s * 1000:.0f} ms")
        print(
            f"  controller memory: RSS {rss / 1024:.0f} MiB (peak {hwm / 1024:.0f} MiB; "
            f"{base_rss / 1024:.0f} MiB idle before nodes/workloads)"
        )
        import urllib.request

        text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
        values = {
            line.split()[0]: float(line.split()[1]) for line in text.splitlines() if line and not line.startswith("#")
        }
        for name, label in (
            ("stoke_plan_solve_seconds", "solver runs"),
            ("stoke_reconcile_duration_seconds", "reconcile passes (inputs changed)"),
        ):
            count, total = values.get(f"{name}_count", 0.0), values.get(f"{name}_sum", 0.0)
            print(f"  {label}: {count:.0f}, mean {total / count if count else 0:.3f} s (from /metrics)")
        t0 = time.monotonic()
        urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read()
        print(f"  /metrics scrape with {workloads} workloads: {(time.monotonic() - t0) * 1000:.0f} ms")
    finally:
        for a in agents:
            a._stop.set()
            a._wake_fleet.set()
        for a in agents:
            a.stop(close_fleet=True)
            a.client.close()
        client.close()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def _up(client: ControllerClient) -> bool:
    try:
        client.list_workloads()
        return True
    except Exception:  # noqa: BLE001
        return False


def _plan_revision(client: ControllerClient) -> int:
    try:
        return client.get_plan().plan.revision
    except Exception:  # noqa: BLE001 - no plan yet
        return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="20 nodes, 100 workloads")
    parser.add_argument("--skip-triton", action="store_true", help="skip the real-Triton part")
    parser.add_argument(
        "--replan-workloads",
        type=int,
        default=10_000,
        help="re-planning in the controller's planning step with this many workloads placed (0: skip)",
    )
    args = parser.parse_args()
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    steps = [] if args.skip_triton else [("apply to serving (real Triton)", bench_apply_to_serving)]
    nodes, workloads = (20, 100) if args.quick else (100, 500)
    steps.append((f"{nodes} nodes x {workloads} workloads", lambda tmp: bench_scale(tmp, nodes, workloads)))
    if args.replan_workloads:  # issue 16: the planning step alone, at fleet scale (in process, no agents)
        from bench_scale import replan

        steps.append((f"re-plan at {args.replan_workloads:,} workloads", lambda tmp: replan(args.replan_workloads)))
    with tempfile.TemporaryDirectory(prefix="bench-control-") as d:
        # progress with an ETA on stderr (a bar on a terminal, a line per step otherwise)
        with Progress("bench_control", len(steps)) as bar:
            for name, step in steps:
                step(Path(d))
                sys.stdout.flush()
                bar.advance(note=f"{name} done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
