"""Load figures of the control plane (issue 10): prints them so regressions show (no pass/fail).

1. API load: a controller *process* (`stoke controller`) with 50 simulated nodes heartbeating and 100
   workloads; 20, then 64 client threads call it as fast as they can for `--seconds` each (a mix of
   GetStatus, ListNodes, ListWorkloads and, one call in five, ApplyWorkloads changing a rate, which
   re-plans). Prints calls/s, p50/p99 latency, errors, and the controller's RSS (VmRSS, peak VmHWM)
   after each level. The controller's solver worker is a child process: its RSS is printed apart.
2. Convergence at 1,000 simulated nodes (2 V100 each, every node with its own agent token): time to
   register them all, then from `workload apply` of 1,000 workloads to the plan stored and to every
   node running its assignments (a node "runs" what its last heartbeat answer gave it, and reports it
   in the next heartbeat, as a real agent does), and the controller's RSS.
3. The serving edge (issue 21): 2,000 concurrent inference requests (over 500 keep-alive connections over HTTP;
   one channel, 2,000 calls in flight, over gRPC) to a real Triton on CPU, straight to it and through the node's
   router (`agents.router`, in its own process as in the agent). Prints completed/2,000, wall time,
   p50/p99/max latency per path, and the router's RSS.
4. Re-planning at 10,000 workloads (`bench_scale.replan`): the controller's planning step with its
   solver memo, one workload's rate changed five times: re-plan time and assignments moved.

Nodes are simulated by a few threads over shared gRPC channels (raw stubs, one bearer token per node),
so 1,000 of them fit in this process.

    .venv/bin/python benchmarks/bench_load.py [--seconds 10] [--nodes 1000] [--workloads 1000] [--only router]
        [--replan-workloads 10000]
"""

from __future__ import annotations

import argparse
import os
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

import grpc  # noqa: E402

from controller.api import convert  # noqa: E402
from controller.api import stoke_pb2 as pb  # noqa: E402
from controller.api import stoke_pb2_grpc as pb_grpc  # noqa: E402
from controller.api.client import ControllerClient  # noqa: E402
from controller.messages import ApiError, HeartbeatReport, NodeDevice  # noqa: E402
from planner.solver import Workload  # noqa: E402
from planner.solver.random_mix import random_workloads  # noqa: E402

TOKEN = "bench-load-token"
V100 = (NodeDevice(0, "Tesla V100-SXM2-16GB", "gpu"), NodeDevice(1, "Tesla V100-SXM2-16GB", "gpu"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def status_kib(pid: int, *keys: str) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in keys:
            out[key] = int(value.split()[0])
    return out


def children(pid: int) -> list[int]:
    """Child processes of every thread of `pid` (the solver worker is started by the reconcile thread)."""
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out += [int(p) for p in (task / "children").read_text().split()]
        except OSError:
            continue
    return out


def memory(pid: int) -> str:
    m = status_kib(pid, "VmRSS", "VmHWM")
    worker = sum(status_kib(c, "VmRSS").get("VmRSS", 0) for c in children(pid))
    return f"RSS {m['VmRSS'] / 1024:.0f} MiB (peak {m['VmHWM'] / 1024:.0f} MiB; solver worker {worker / 1024:.0f} MiB)"


def wait(fn, timeout: float, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = fn()
        except ApiError:
            value = None
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError("condition not met in time")


class Controller:
    def __init__(self, tmp: Path, name: str) -> None:
        profile = ROOT / "interference" / "data" / "v100-profile.json"
        self.address = f"127.0.0.1:{free_port()}"
        (tmp / "token").write_text(TOKEN)
        (tmp / "token").chmod(0o600)
        (tmp / f"{name}.yaml").write_text(
            f"listen: {self.address}\nmetrics_listen: ''\ndb: {name}.db\ntoken_file: token\n"
            f"heartbeat_interval_s: 1.0\nheartbeat_timeout_s: 15\nreconcile_interval_s: 0.2\n"
            f"gpu_types:\n  - {{name: V100, price_per_hour: 3.06, match: [V100]}}\n"
            f"profiles:\n  - {{path: {profile}, gpu_type: V100}}\n"
        )
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "stoke",
                "controller",
                "--config",
                str(tmp / f"{name}.yaml"),
                "--log-level",
                "ERROR",
            ],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=open(tmp / f"{name}.log", "wb"),
        )
        self.client = ControllerClient(self.address, token=TOKEN, timeout_s=120)
        wait(lambda: self.client.list_profiles().profiles, 60, 0.2)

    def stop(self) -> None:
        self.client.close()
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class SimNodes:
    """`count` nodes heartbeating every second from `threads` threads over shared channels, each with its own
    token; a node runs what its last answer gave it (unless told to hold) and reports it."""

    def __init__(self, controller: Controller, count: int, threads: int = 16) -> None:
        self.ids = [f"node-{i:04d}" for i in range(count)]
        self.tokens = {n: controller.client.mint_agent_token(n).token for n in self.ids}
        self.channels = [grpc.insecure_channel(controller.address) for _ in range(4)]
        self.running: dict[str, tuple] = {n: () for n in self.ids}
        self.revision: dict[str, int] = {n: 0 for n in self.ids}
        self.errors = 0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._loop, args=(k, threads), daemon=True) for k in range(threads)]

    def _stub(self, k: int) -> pb_grpc.AgentGatewayStub:
        return pb_grpc.AgentGatewayStub(self.channels[k % len(self.channels)])

    def register(self) -> float:
        t0 = time.monotonic()
        devices = [convert.device_to_pb(d) for d in V100]

        def part(k: int, step: int) -> None:
            stub = self._stub(k)
            for n in self.ids[k::step]:
                meta = (("authorization", f"Bearer {self.tokens[n]}"),)
                stub.Register(pb.RegisterRequest(node_id=n, devices=devices), metadata=meta, timeout=60)

        workers = [threading.Thread(target=part, args=(k, 16)) for k in range(16)]
        for t in workers:
            t.start()
        for t in workers:
            t.join()
        return time.monotonic() - t0

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def _loop(self, k: int, step: int) -> None:
        stub, mine = self._stub(k), self.ids[k::step]
        while not self._stop.is_set():
            started = time.monotonic()
            for n in mine:
                report = HeartbeatReport(n, running=self.running[n], applied_revision=self.revision[n])
                meta = (("authorization", f"Bearer {self.tokens[n]}"),)
                try:
                    answer = convert.answer_from_pb(
                        stub.Heartbeat(convert.report_to_pb(report), metadata=meta, timeout=30)
                    )
                except grpc.RpcError:
                    self.errors += 1
                    continue
                if answer.registered and not answer.hold:
                    self.running[n], self.revision[n] = answer.assignments, answer.revision
            self._stop.wait(max(0.0, 1.0 - (time.monotonic() - started)))

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=30)
        for c in self.channels:
            c.close()


def load_level(controller: Controller, threads: int, seconds: float, names: list[str]) -> None:
    latencies: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    stop = threading.Event()

    def client_loop(k: int) -> None:
        rng = random.Random(k)
        client = ControllerClient(controller.address, token=TOKEN, timeout_s=60)
        calls = [client.status, client.list_nodes, client.list_workloads, client.status]
        mine, i = [], 0
        try:
            while not stop.is_set():
                t0 = time.perf_counter()
                try:
                    if i % 5 == 4:  # a write that re-plans
                        name = names[(k * 7 + i) % len(names)]
                        client.apply_workloads([Workload(name, "alexnet", 40.0, round(rng.uniform(50, 400), 1))])
                    else:
                        calls[i % len(calls)]()
                    mine.append(time.perf_counter() - t0)
                except ApiError as err:
                    with lock:
                        errors.append(str(err)[:200])
                i += 1
        finally:
            client.close()
            with lock:
                latencies.extend(mine)

    workers = [threading.Thread(target=client_loop, args=(k,), daemon=True) for k in range(threads)]
    t0 = time.monotonic()
    for t in workers:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in workers:
        t.join(timeout=120)
    took = time.monotonic() - t0
    latencies.sort()

    def q(p: float) -> float:
        return latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1000 if latencies else float("nan")

    print(
        f"  {threads:>2} client threads: {len(latencies) / took:7.0f} calls/s, p50 {q(0.5):6.1f} ms, "
        f"p99 {q(0.99):7.1f} ms, {len(errors)} errors of {len(latencies) + len(errors)} calls; "
        f"controller {memory(controller.proc.pid)}"
    )
    if errors:
        print(f"    first error: {errors[0]}")


def bench_load(tmp: Path, seconds: float) -> None:
    controller = Controller(tmp, "load")
    nodes = SimNodes(controller, 50, threads=4)
    try:
        nodes.register()
        nodes.start()
        names = [f"w{i:03d}" for i in range(100)]
        controller.client.apply_workloads([Workload(n, "alexnet", 40.0, 100.0) for n in names])
        wait(lambda: controller.client.get_plan().plan.revision, 120)
        print(f"API load: controller process, 50 simulated nodes x 2 V100, 100 workloads, {seconds:g} s per level")
        print(f"  idle: controller {memory(controller.proc.pid)}")
        for threads in (20, 64):
            load_level(controller, threads, seconds, names)
        print(f"  node heartbeats failed meanwhile: {nodes.errors}")
    finally:
        nodes.stop()
        controller.stop()


def bench_convergence(tmp: Path, count: int, workloads: int) -> None:
    controller = Controller(tmp, "scale")
    nodes = SimNodes(controller, count)
    try:
        idle = memory(controller.proc.pid)
        registered_s = nodes.register()
        nodes.start()
        items = random_workloads(workloads, seed=2026)
        t0 = time.monotonic()
        controller.client.apply_workloads(items)
        wait(lambda: controller.client.get_plan().plan.revision, 600)
        plan_s = time.monotonic() - t0
        plan = controller.client.get_plan().plan
        cut: dict[str, set[str]] = {}
        for g in plan.gpus:
            cut.setdefault(g.node_id, set()).update(f"{p.workload}#{p.replica}" for p in g.placements)

        def converged() -> bool:
            return all({a.key for a in nodes.running[n]} == cut.get(n, set()) for n in nodes.ids)

        wait(converged, 600)
        converge_s = time.monotonic() - t0
        serving = wait(
            lambda: (s := controller.client.status()) and all(w.state == "serving" for w in s.workloads) and s, 120
        )
        serving_s = time.monotonic() - t0
        print(
            f"convergence: {count} simulated nodes x 2 V100, {workloads} workloads -> {len(plan.gpus)} GPUs, "
            f"{len(plan.pending)} pending"
        )
        print(f"  {count} nodes registered (each with its own token):       {registered_s:.2f} s")
        print(f"  apply -> plan stored:                                     {plan_s:.2f} s")
        print(f"  apply -> every node running its assignments:              {converge_s:.2f} s")
        print(f"  apply -> status shows all {len(serving.workloads)} workloads serving:         {serving_s:.2f} s")
        print(f"  controller memory: {memory(controller.proc.pid)} ({idle} idle)")
        print(f"  node heartbeats failed: {nodes.errors}")
    finally:
        nodes.stop()
        controller.stop()


ROUTER_SCRIPT = """
import json, sys
from agents.router import Backend, Router
router = Router("127.0.0.1")
ep = router.set_backends("bench", [Backend("bench#0", *sys.argv[1:4])])
print(json.dumps([ep.grpc, ep.http]), flush=True)
sys.stdin.read()
router.close()
"""


async def burst_http(url: str, count: int, connections: int = 500) -> tuple[int, list[float], float, list[str]]:
    """`count` inference requests at once over HTTP on up to `connections` keep-alive connections (Triton's own
    HTTP server drops connections when 2,000 open at once); (ok, latencies s, wall s, errors)."""
    import asyncio

    import aiohttp

    body = {"inputs": [{"name": "INPUT0", "shape": [1, 8], "datatype": "FP32", "data": [1.0] * 8}]}
    latencies: list[float] = []
    errors: list[str] = []
    connector = aiohttp.TCPConnector(limit=connections)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=120)) as session:

        async def one() -> None:
            t0 = time.perf_counter()
            try:
                async with session.post(f"{url}/v2/models/tiny_echo/infer", json=body) as reply:
                    await reply.read()
                    if reply.status != 200:
                        errors.append(f"HTTP {reply.status}")
                        return
                latencies.append(time.perf_counter() - t0)
            except Exception as err:  # noqa: BLE001 - every failure is counted
                errors.append(type(err).__name__)

        t0 = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(count)))
    return len(latencies), latencies, time.perf_counter() - t0, errors


async def burst_grpc(url: str, count: int) -> tuple[int, list[float], float, list[str]]:
    import asyncio

    import numpy as np
    import tritonclient.grpc.aio as aioclient

    client = aioclient.InferenceServerClient(url)
    tensor = aioclient.InferInput("INPUT0", [1, 8], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 8), dtype=np.float32))
    latencies: list[float] = []
    errors: list[str] = []

    async def one() -> None:
        t0 = time.perf_counter()
        try:
            await client.infer("tiny_echo", [tensor], client_timeout=120)
            latencies.append(time.perf_counter() - t0)
        except Exception as err:  # noqa: BLE001
            errors.append(str(err).splitlines()[0][:80])

    t0 = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(count)))
    wall = time.perf_counter() - t0
    await client.close()
    return len(latencies), latencies, wall, errors


def bench_router(tmp: Path, count: int) -> None:
    import asyncio
    import json

    from agents.triton import TritonProcess

    print(f"\n== serving edge: {count} concurrent inference requests, straight to Triton vs through the router")
    process = TritonProcess(str(ROOT / "triton_repo"), workdir=tmp / "triton-router")
    process.start()
    router = None
    try:
        process.load("tiny_echo")
        http_addr = process.http_url.removeprefix("http://")
        router = subprocess.Popen(
            [sys.executable, "-c", ROUTER_SCRIPT, process.grpc_url, http_addr, f"127.0.0.1:{process.metrics_port}"],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        assert router.stdout is not None
        router_grpc, router_http = json.loads(router.stdout.readline())
        paths = [
            ("HTTP direct", burst_http, process.http_url),
            ("HTTP router", burst_http, router_http),
            ("gRPC direct", burst_grpc, process.grpc_url),
            ("gRPC router", burst_grpc, router_grpc),
        ]
        for name, burst, url in paths:
            asyncio.run(burst(url, 50))  # warm up
            ok, latencies, wall, errors = asyncio.run(burst(url, count))
            latencies.sort()

            def q(p: float, values: list[float] = latencies) -> float:
                return values[min(len(values) - 1, int(p * len(values)))] * 1000 if values else float("nan")

            kinds = sorted({e for e in errors})[:3]
            print(
                f"  {name}: {ok}/{count} ok in {wall:.2f} s; latency p50 {q(0.5):.0f} ms, p99 {q(0.99):.0f} ms, "
                f"max {q(1.0):.0f} ms" + (f"; errors: {len(errors)} ({', '.join(kinds)})" if errors else "")
            )
        print(f"  router memory: {memory(router.pid)}")
    finally:
        if router is not None:
            router.terminate()
            try:
                router.wait(timeout=10)
            except subprocess.TimeoutExpired:
                router.kill()
        process.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="seconds per load level")
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--workloads", type=int, default=1000)
    parser.add_argument("--concurrent", type=int, default=2000, help="concurrent requests of the serving edge")
    parser.add_argument("--only", choices=("api", "convergence", "router", "replan"), help="run one part only")
    parser.add_argument(
        "--replan-workloads",
        type=int,
        default=10_000,
        help="re-planning in the controller's planning step with this many workloads placed (0: skip)",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="stoke-bench-load-") as tmp:
        if args.only in (None, "api"):
            bench_load(Path(tmp), args.seconds)
        if args.only in (None, "convergence"):
            bench_convergence(Path(tmp), args.nodes, args.workloads)
        if args.only in (None, "router"):
            bench_router(Path(tmp), args.concurrent)
    if args.only in (None, "replan") and args.replan_workloads:  # issue 16: the planning step, in process
        from bench_scale import replan

        replan(args.replan_workloads)


if __name__ == "__main__":
    main()
