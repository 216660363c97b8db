"""Control-plane commands: `stoke controller`, `stoke agent`, `stoke workload ...`, `stoke nodes`,
`stoke status`, `stoke profiles ...`, `stoke up`, and `remote_plan` for `stoke plan --remote`.

Client commands take `--controller HOST:PORT` (default $STOKE_CONTROLLER or
127.0.0.1:50051), `--token-file FILE` (default: $STOKE_TOKEN), `--tls-ca FILE`
(TLS with that CA; `--tls` for the system roots) and `--json`.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

from stoke.errors import UserError
from stoke.table import render_table

DEFAULT_CONTROLLER = "127.0.0.1:50051"


# ------------------------------------------------------------------ registration


def _client_args(p: argparse.ArgumentParser, json_help: str = "print JSON") -> None:
    p.add_argument("--controller", metavar="HOST:PORT",
                   default=os.environ.get("STOKE_CONTROLLER", DEFAULT_CONTROLLER),
                   help="controller address (default $STOKE_CONTROLLER or %(default)s)")
    p.add_argument("--token-file", metavar="FILE", help="bearer token file (default: $STOKE_TOKEN)")
    p.add_argument("--tls-ca", metavar="FILE", help="use TLS, trusting this CA certificate")
    p.add_argument("--tls", action="store_true", help="use TLS with the system's trusted roots")
    p.add_argument("--json", action="store_true", help=json_help)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("controller", help="run the control-plane controller (gRPC API, reconcile loop)",
                              description="Run the controller until Ctrl-C. The YAML config is documented in "
                                          "controller/server.py (listen, db, token_file, tls, heartbeat timeout, "
                                          "gpu_types, profiles).")
    p.add_argument("--config", metavar="FILE", help="controller YAML config")
    p.add_argument("--listen", metavar="HOST:PORT", help="override `listen`")
    p.add_argument("--db", metavar="FILE", help="override `db`")
    p.add_argument("--token-file", metavar="FILE", help="override `token_file`")
    p.add_argument("--metrics-listen", metavar="HOST:PORT", help="override `metrics_listen` ('' = off)")
    p.add_argument("--heartbeat-timeout", type=float, metavar="S", help="override `heartbeat_timeout_s`")
    p.add_argument("--heartbeat-interval", type=float, metavar="S", help="override `heartbeat_interval_s`")
    p.add_argument("--log-level", default="INFO", help="logging level (default %(default)s)")
    p.set_defaults(run=run_controller)

    p = subparsers.add_parser("agent", help="run the node agent (registers, heartbeats, runs Triton)",
                              description="Register this node with the controller and serve its assignments "
                                          "with Triton until Ctrl-C.")
    _client_args(p)
    p.add_argument("--device", choices=("auto", "cpu", "nvml"), default="auto", help="device backend")
    p.add_argument("--node-id", default=socket.gethostname(), help="node id (default: host name)")
    p.add_argument("--repository", default="triton_repo", help="Triton model repository (path or s3://)")
    p.add_argument("--workdir", help="where Triton processes keep their files (default: a temp dir)")
    p.add_argument("--gpu-type", default="", help="GPU type of this node's devices (default: decided by the "
                                                   "controller's gpu_types)")
    p.add_argument("--ready-timeout", type=float, default=60.0, help="seconds a Triton start may take")
    p.add_argument("--latency-histogram", action="store_true",
                   help="configure Triton's per-model latency histogram with a bucket at each SLO (used by the "
                        "SLO alert rules of `stoke alerts`; needs Triton >= 2.52, the bundled 2.51 refuses it)")
    p.add_argument("--metrics-port", type=int, default=-1, metavar="PORT",
                   help="serve this node's device metrics on http://127.0.0.1:PORT/metrics (0 = any; default off)")
    p.add_argument("--log-level", default="INFO", help="logging level (default %(default)s)")
    p.set_defaults(run=run_agent)

    w = subparsers.add_parser("workload", help="manage the workloads of a running controller")
    ws = w.add_subparsers(dest="workload_command", metavar="COMMAND", required=True)
    p = ws.add_parser("apply", help="create or update the workloads of a YAML file (all or nothing)")
    p.add_argument("-f", "--file", required=True, metavar="FILE", help="workloads YAML (see `stoke plan`)")
    _client_args(p)
    p.set_defaults(run=run_workload_apply)
    p = ws.add_parser("rm", help="delete a workload")
    p.add_argument("name")
    _client_args(p)
    p.set_defaults(run=run_workload_rm)
    p = ws.add_parser("ls", help="list the workloads")
    _client_args(p)
    p.set_defaults(run=run_workload_ls)

    p = subparsers.add_parser("nodes", help="list the nodes: devices, health, last heartbeat, what runs there")
    _client_args(p)
    p.set_defaults(run=run_nodes)

    p = subparsers.add_parser("status", help="per workload: planned share/batch/node, predicted vs observed")
    _client_args(p)
    p.add_argument("--watch", nargs="?", const=2.0, type=float, metavar="S",
                   help="refresh every S seconds (default 2) until Ctrl-C")
    p.set_defaults(run=run_status)

    pr = subparsers.add_parser("profiles", help="upload / list fitted profiles on a running controller")
    ps = pr.add_subparsers(dest="profiles_command", metavar="COMMAND", required=True)
    p = ps.add_parser("upload", help="upload a fitted profile (JSON from `stoke profile fit`)")
    p.add_argument("file")
    p.add_argument("--gpu-type", default="", help="store under this GPU type (default: the profile's gpu.name)")
    _client_args(p)
    p.set_defaults(run=run_profiles_upload)
    p = ps.add_parser("ls", help="list the fitted profiles per (model, GPU type)")
    _client_args(p)
    p.set_defaults(run=run_profiles_ls)

    p = subparsers.add_parser("up", help="run a complete local demo stack: controller, agent, Triton, load",
                              description="Start a controller, one agent with Triton on the demo models, apply "
                                          "demo workloads (the bundled examples scaled to CPU), send load, and "
                                          "print the status table until Ctrl-C or --seconds.")
    p.add_argument("--seconds", type=float, default=0.0, help="stop after this many seconds (0 = until Ctrl-C)")
    p.add_argument("--repository", default="triton_repo", help="model repository (default %(default)s)")
    p.add_argument("--workloads", metavar="FILE", help="workloads YAML instead of the demo set")
    p.add_argument("--profile", metavar="FILE", help="fitted CPU profile (default: triton_repo/profiles/*cpu*.json)")
    p.add_argument("--count", type=int, default=DEMO_COUNT, choices=(1, 2, 3),
                   help="demo workloads to run (default %(default)s; a third one exceeds one 2-core node and "
                        "shows as pending)")
    p.add_argument("--no-load", action="store_true", help="do not generate load")
    p.add_argument("--interval", type=float, default=3.0, help="status refresh seconds (default %(default)s)")
    p.add_argument("--json", action="store_true", help="print the final status as JSON")
    p.set_defaults(run=run_up)


# ------------------------------------------------------------------ client helpers


def _client(args: argparse.Namespace) -> Any:
    from controller.api.auth import read_token
    from controller.api.client import ControllerClient
    token = read_token(getattr(args, "token_file", None))
    return ControllerClient(args.controller, token=token, tls_ca=getattr(args, "tls_ca", None),
                            tls=bool(getattr(args, "tls", False)))


def _call(args: argparse.Namespace, fn: Callable[[Any], Any], source: str = "") -> Any:
    """Call the controller; its refusals become one line that says what to do (the fix depends on the call)."""
    from controller.messages import ApiError, FailedPrecondition, InvalidArgument, Unauthenticated, Unavailable
    client = _client(args)
    try:
        return fn(client)
    except Unavailable as err:
        raise UserError(f"{err}; start it with `stoke controller` or pass --controller HOST:PORT") from None
    except Unauthenticated as err:
        raise UserError(f"controller {args.controller} refused the call ({err}); pass --token-file FILE "
                        f"or set $STOKE_TOKEN") from None
    except (InvalidArgument, FailedPrecondition) as err:
        raise UserError(f"{source + ': ' if source else ''}{err}") from None
    except ApiError as err:
        raise UserError(f"controller {args.controller}: {err}") from None
    finally:
        client.close()


#: int64 fields, which proto3 JSON writes as strings; `--json` prints them as numbers.
_INT64_FIELDS = {"revision", "memory_bytes", "failures", "success", "applied_revision"}


def _to_dict(message: Any) -> dict[str, Any]:
    from google.protobuf.json_format import MessageToDict

    def fix(value: Any, key: str = "") -> Any:
        if isinstance(value, dict):
            return {k: fix(v, k) for k, v in value.items()}
        if isinstance(value, list):
            return [fix(v) for v in value]
        if key in _INT64_FIELDS and isinstance(value, str) and value.lstrip("-").isdigit():
            return int(value)
        return value
    return fix(MessageToDict(message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True))


def _ago(seconds: float) -> str:
    return f"{seconds:.1f}s ago" if seconds < 120 else f"{seconds / 60:.0f}m ago"


# ------------------------------------------------------------------ workloads


def run_workload_apply(args: argparse.Namespace) -> int:
    from controller.workload_file import read_workloads
    workloads = read_workloads(args.file)     # its gpu_types are ignored: the controller's nodes are the inventory
    reply = _call(args, lambda c: c.apply_workloads(workloads), source=args.file)
    if args.json:
        print(json.dumps(_to_dict(reply), indent=2))
    else:
        rows = ([[n, "created"] for n in reply.created] + [[n, "updated"] for n in reply.updated]
                + [[n, "unchanged"] for n in reply.unchanged])
        print(render_table(["workload", "result"], rows))
    return 0


def run_workload_rm(args: argparse.Namespace) -> int:
    deleted = _call(args, lambda c: c.delete_workload(args.name))
    if args.json:
        print(json.dumps({"name": args.name, "deleted": deleted}))
    elif deleted:
        print(f"workload {args.name} deleted")
    else:
        raise UserError(f"workload {args.name!r} does not exist; see `stoke workload ls`")
    return 0


def run_workload_ls(args: argparse.Namespace) -> int:
    workloads = _call(args, lambda c: c.list_workloads())
    if args.json:
        print(json.dumps([{"name": w.name, "model": w.model, "slo_ms": w.slo_ms, "rate_rps": w.rate_rps,
                           "gpu_type": w.gpu_type} for w in workloads], indent=2))
    else:
        print(render_table(["workload", "model", "slo_ms", "rate_rps", "gpu_type"],
                           [[w.name, w.model, w.slo_ms, w.rate_rps, w.gpu_type or "any"] for w in workloads]))
    return 0


# ------------------------------------------------------------------ plan (for `stoke plan --remote`)


def format_remote_plan(plan: Any) -> str:
    head = (f"plan revision {plan.revision} ({plan.strategy}): {len(plan.gpus)} device(s), "
            f"${plan.cost_per_hour:,.2f}/hour")
    rows = []
    for g in plan.gpus:
        where = f"{g.node_id}/{g.device}" if g.node_id else "(no free device)"
        for p in g.placements:
            rows.append([where, g.gpu_type, p.workload, f"{p.replica + 1}/{p.replicas}" if p.replicas > 1 else "",
                         p.model, p.slo_ms, p.rate_rps, p.share_pct, p.batch, p.queue_delay_ms,
                         p.predicted_latency_ms])
    lines = [head, "", render_table(["node/device", "type", "workload", "replica", "model", "slo_ms", "rate_rps",
                                     "share_%", "batch", "queue_ms", "pred_ms"], rows)]
    lines += [f"pending: {p.workload}: {p.reason}" for p in plan.pending]
    lines += [f"note: {n}" for n in plan.notes]
    return "\n".join(lines)


def remote_plan(args: argparse.Namespace) -> int:
    """`stoke plan --remote`: the controller's applied plan (`--preview`: solve now without acting)."""
    args.tls_ca = getattr(args, "tls_ca", None)
    preview = bool(getattr(args, "preview", False))
    reply = _call(args, lambda c: c.preview_plan() if preview else c.get_plan())
    if args.json:
        print(json.dumps(_to_dict(reply.plan), indent=2))
    else:
        print(format_remote_plan(reply.plan))
    return 0


# ------------------------------------------------------------------ nodes and status


def format_nodes(reply: Any) -> str:
    from controller.messages import Replica
    rows = []
    for n in reply.nodes:
        devices = ", ".join(f"{d.index}:{d.gpu_type or d.name}" for d in n.devices)
        running = ", ".join(str(Replica(a.workload, a.replica)) for a in n.running) or "-"
        rows.append([n.node_id, n.state, devices, _ago(n.seconds_since_heartbeat), len(n.assigned), running,
                     n.applied_revision])
    out = render_table(["node", "state", "devices", "heartbeat", "assigned", "running", "revision"], rows)
    events = [f"  {n.node_id}: {e}" for n in reply.nodes for e in list(n.events)[-3:]]
    return out + ("\n\nrecent events:\n" + "\n".join(events) if events else "")


def run_nodes(args: argparse.Namespace) -> int:
    reply = _call(args, lambda c: c.list_nodes())
    print(json.dumps(_to_dict(reply)["nodes"], indent=2) if args.json else format_nodes(reply))
    return 0


def format_status(s: Any) -> str:
    rows = []
    for w in s.workloads:
        nodes = ",".join(sorted({f"{r.node_id}/{r.device}" for r in w.replicas})) or "-"
        share = sum(r.share_pct for r in w.replicas) if w.replicas else None
        batch = "/".join(str(r.batch) for r in w.replicas) or "-"
        rows.append([w.name, w.model, w.state, nodes, share, batch, w.slo_ms,
                     w.predicted_latency_ms if w.replicas else None,
                     w.observed_latency_ms if w.observed else None, w.rate_rps,
                     sum(r.observed_rate_rps for r in w.replicas) if any(r.observed for r in w.replicas) else None,
                     f"{w.slo_attainment:.0%}" if w.observed else "-"])
    head = (f"plan revision {s.revision}: {s.gpus_in_use} device(s), ${s.cost_per_hour:,.2f}/hour; "
            f"nodes ready {s.nodes_ready}, lost {s.nodes_lost}")
    lines = [head, "", render_table(["workload", "model", "state", "node/dev", "share_%", "batch", "slo_ms",
                                     "pred_ms", "obs_ms", "rate_rps", "obs_rps", "slo_ok"], rows)]
    lines += [f"{w.name}: {w.reason}" for w in s.workloads if w.reason and w.state != "serving"]
    if s.last_error:
        lines.append(f"last reconcile error: {s.last_error}")
    lines.append("pred_ms: worst predicted latency (batch wait + inference); obs_ms: mean queue + compute "
                 "time reported by Triton; slo_ok: observed replicas within the SLO")
    return "\n".join(lines)


def run_status(args: argparse.Namespace) -> int:
    while True:
        reply = _call(args, lambda c: c.status())
        if args.json:
            print(json.dumps(_to_dict(reply), indent=2), flush=True)
        else:
            if args.watch:
                print("\033[2J\033[H", end="")
            print(format_status(reply), flush=True)
        if not args.watch:
            return 0
        time.sleep(args.watch)


# ------------------------------------------------------------------ profiles


def run_profiles_upload(args: argparse.Namespace) -> int:
    try:
        text = Path(args.file).read_text()
    except OSError as err:
        raise UserError(f"{args.file}: cannot read the profile ({err.strerror})") from None
    reply = _call(args, lambda c: c.upload_profile(text, args.gpu_type), source=args.file)
    if args.json:
        print(json.dumps(_to_dict(reply), indent=2))
    else:
        print(render_table(["gpu_type", "model"], [[p.gpu_type, p.model] for p in reply.profiles]))
    return 0


def run_profiles_ls(args: argparse.Namespace) -> int:
    reply = _call(args, lambda c: c.list_profiles())
    if args.json:
        print(json.dumps(_to_dict(reply)["profiles"], indent=2))
    else:
        print(render_table(["model", "gpu_type", "uploaded"],
                           [[p.model, p.gpu_type, time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(p.uploaded_unix))]
                            for p in reply.profiles]))
    return 0


# ------------------------------------------------------------------ long-running processes


def _until_signal(seconds: float = 0.0) -> threading.Event:
    """An event set on SIGINT / SIGTERM (or after `seconds` > 0)."""
    stop = threading.Event()

    def handler(signum: int, frame: object) -> None:
        stop.set()
    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
    if seconds > 0:
        timer = threading.Timer(seconds, stop.set)
        timer.daemon = True          # Ctrl-C before the deadline must not wait for it
        timer.start()
    return stop


def run_controller(args: argparse.Namespace) -> int:
    from controller.config import load_config
    from controller.server import ControllerServer
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    config = load_config(args.config, listen=args.listen, db=args.db, token_file=args.token_file,
                         metrics_listen=args.metrics_listen, heartbeat_timeout_s=args.heartbeat_timeout,
                         heartbeat_interval_s=args.heartbeat_interval)
    server = ControllerServer(config).start()
    print(f"stoke controller listening on {server.address} (metrics on port {server.metrics_port or 'off'})",
          flush=True)
    stop = _until_signal()
    stop.wait()
    server.stop()
    return 0


def run_agent(args: argparse.Namespace) -> int:
    _quiet_grpc()
    from dataclasses import replace

    from agents.agent import Agent, local_devices
    from agents.triton import TritonFleet
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    devices = local_devices(args.device)
    if args.gpu_type:
        devices = tuple(replace(d, gpu_type=args.gpu_type) for d in devices)
    kind = "gpu" if any(d.kind == "gpu" for d in devices) else "cpu"
    if "://" not in args.repository and not Path(args.repository).is_dir():
        raise UserError(f"--repository {args.repository}: no such model repository; pass the path of "
                        f"triton_repo/ (or an s3:// URL)")
    client = _client(args)
    fleet = TritonFleet(args.repository, device_kind=kind, workdir=args.workdir,
                        ready_timeout_s=args.ready_timeout, latency_histogram=args.latency_histogram)
    exporter = None
    if args.metrics_port >= 0:
        from agents.device import DeviceError, open_device
        from agents.device_exporter import serve_device_metrics
        try:
            exporter = serve_device_metrics(open_device(args.device), args.metrics_port)
        except (DeviceError, OSError) as err:
            fleet.close()
            raise UserError(f"--metrics-port {args.metrics_port}: cannot serve device metrics ({err})") from None
    agent = Agent(client, fleet, args.node_id, devices)
    agent.start()
    print(f"stoke agent {args.node_id}: {len(devices)} {kind} device(s), controller {args.controller}"
          + (f", device metrics {exporter.url}" if exporter else ""), flush=True)
    stop = _until_signal()
    stop.wait()
    agent.stop()
    client.close()
    if exporter is not None:
        exporter.close()
    return 0


# ------------------------------------------------------------------ stoke up

#: The bundled example workloads' models mapped to the demo models of triton_repo/.
DEMO_MODEL_FOR = {"alexnet": "mlp_small", "resnet50": "conv_medium", "vgg19": "conv_medium", "ssd": "embed_large"}
#: CPU scaling of the examples: rates divided, SLOs multiplied.
DEMO_RATE_DIVISOR = 25.0
DEMO_SLO_FACTOR = 4.0
#: Hourly price of the local CPU node in the demo (about a 2-vCPU cloud instance).
DEMO_CPU_PRICE = 0.08
DEMO_COUNT = 2     # a 2-core node holds two demo workloads at the fitted CPU profile's 50% share step


def demo_workloads(path: str | None, count: int = DEMO_COUNT) -> tuple[Any, ...]:
    """The workloads of `path`, or the bundled examples scaled to CPU (the first `count`, one per demo model)."""
    from controller.solver import Workload
    from controller.workload_file import example_workloads_path, load_workloads_file, read_workloads
    if path:
        return read_workloads(path)
    examples = load_workloads_file(example_workloads_path()).workloads
    out, used = [], set()
    for w in examples:
        model = DEMO_MODEL_FOR.get(w.model)
        if model is None or model in used:
            continue
        used.add(model)
        out.append(Workload(name=w.name, model=model, slo_ms=w.slo_ms * DEMO_SLO_FACTOR,
                            rate_rps=round(w.rate_rps / DEMO_RATE_DIVISOR, 1)))
        if len(out) == count:
            break
    return tuple(out)


def demo_cpu_profile(name: str = "CPU") -> Any:
    """Placeholder CPU coefficients for the demo models (share = % of the node's cores).

    Rough figures, not a fit: `stoke up` uses them only when no fitted CPU
    profile exists under triton_repo/profiles/ (and says so).
    """
    from interference.profile import DeviceProfile, GpuProfile, ModelProfile
    gpu = GpuProfile(name=name, max_freq_mhz=3000.0, power_cap_w=1000.0, idle_power_w=10.0, pcie_bytes_per_ms=1e9,
                     share_step_pct=5.0, sched_slope_ms=0.001, sched_intercept_ms=0.0, freq_slope_mhz_per_w=-1.0)

    def model(n: str, k2: float, k3: float, k5: float) -> ModelProfile:
        return ModelProfile(name=n, kernels=4, idle_time_ms=0.05, k_act=(0.0, k2, k3, 0.0, k5),
                            power_slope_w=0.001, power_intercept_w=1.0, l2_slope=0.001, l2_intercept=1.0,
                            cache_sensitivity=0.001, bytes_in=256, bytes_out=64)

    return DeviceProfile(gpu=gpu, models={"tiny_echo": model("tiny_echo", 2.0, 20.0, 0.2),
                                          "mlp_small": model("mlp_small", 5.0, 30.0, 0.3),
                                          "conv_medium": model("conv_medium", 60.0, 40.0, 0.5),
                                          "embed_large": model("embed_large", 10.0, 40.0, 0.5)})


def find_cpu_profile(repository: str, given: str | None, workdir: Path) -> str:
    """--profile, else triton_repo/profiles/*cpu*.json, else the placeholder written to `workdir`."""
    if given:
        return given
    from interference.profile_io import ProfileFileError, load_profile, save_profile
    folder = Path(repository, "profiles")
    candidates = sorted(folder.glob("*cpu*profile*.json")) + sorted(folder.glob("*cpu*.json"))
    for candidate in candidates:
        try:
            load_profile(candidate)       # skip raw measurement files beside the fitted profile
            return str(candidate)
        except ProfileFileError:
            continue
    path = workdir / "demo-cpu-profile.json"
    save_profile(demo_cpu_profile(), path)
    print(f"note: no fitted CPU profile in {repository}/profiles/; planning with placeholder coefficients "
          f"({path})", flush=True)
    return str(path)


def _quiet_grpc() -> None:
    """grpc core logs an INFO line whenever a Triton process is forked beside its threads; keep errors only."""
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")


def run_up(args: argparse.Namespace) -> int:
    _quiet_grpc()
    from agents.agent import Agent, local_devices
    from agents.latency_metrics import RequestLatencyExporter
    from agents.triton import TritonFleet
    from controller.api.client import ControllerClient
    from controller.config import ControllerConfig, GpuTypeConfig, ProfileSource, ServiceConfig
    from controller.server import ControllerServer
    from interference.profile_io import load_profile
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if not Path(args.repository).is_dir():
        raise UserError(f"--repository {args.repository}: no such model repository; run from the stoke checkout "
                        f"or pass --repository PATH")
    tmp = Path(tempfile.mkdtemp(prefix="stoke-up-"))
    profile_path = find_cpu_profile(args.repository, args.profile, tmp)
    profile = load_profile(profile_path)
    workloads = demo_workloads(args.workloads, args.count)
    started = time.monotonic()
    stop = _until_signal(args.seconds)
    token = secrets.token_urlsafe(16)
    (tmp / "token").write_text(token + "\n")
    service = ServiceConfig(heartbeat_interval_s=1.0, heartbeat_timeout_s=10.0, cpu_gpu_type=profile.gpu.name,
                            gpu_types=(GpuTypeConfig(profile.gpu.name, DEMO_CPU_PRICE, ("cpu",)),))
    config = ControllerConfig(listen="127.0.0.1:0", metrics_listen="127.0.0.1:0", db=str(tmp / "controller.db"),
                              token_file=str(tmp / "token"), reconcile_interval_s=0.5,
                              profiles=(ProfileSource(profile_path, profile.gpu.name),), service=service)
    loaders: list[threading.Thread] = []
    latency = RequestLatencyExporter(w.slo_ms for w in workloads)
    server = ControllerServer(config).start()
    client = ControllerClient(server.address, token=token)
    agent_client = ControllerClient(server.address, token=token)
    agent = None
    try:
        fleet = TritonFleet(args.repository, device_kind="cpu", workdir=str(tmp / "triton"), ready_timeout_s=60)
        agent = Agent(agent_client, fleet, "local", local_devices("cpu"), heartbeat_interval_s=1.0)
        agent.start()
        deadline = time.monotonic() + 30
        while not any(n.state == "ready" for n in client.list_nodes().nodes):
            if time.monotonic() > deadline or stop.is_set():
                raise UserError("the local agent did not register within 30 s")
            time.sleep(0.1)
        client.apply_workloads(workloads)
        latency_url = latency.serve(0)
        print(f"controller {server.address} (token in {tmp / 'token'}), metrics "
              f"http://127.0.0.1:{server.metrics_port}/metrics; agent 'local' with Triton on {args.repository}; "
              f"{len(workloads)} workload(s) applied; SLO histogram {latency_url}", flush=True)
        ready_at = None
        next_print = 0.0
        while not stop.is_set():
            status = client.status()
            if ready_at is None and status.workloads and all(w.state in ("serving", "pending")
                                                             for w in status.workloads) \
                    and any(w.state == "serving" for w in status.workloads):
                ready_at = time.monotonic() - started
                served = {w.name for w in status.workloads if w.state == "serving"}
                print(f"{len(served)} of {len(status.workloads)} workload(s) serving their planned configs after "
                      f"{ready_at:.1f}s", flush=True)
                if not args.no_load:
                    for w in (w for w in workloads if w.name in served):
                        t = threading.Thread(target=_drive_load, args=(fleet, w, stop, latency.recorder(w.name, w.model)),
                                             daemon=True)
                        t.start()
                        loaders.append(t)
            if time.monotonic() >= next_print and not args.json:
                print("\n" + format_status(status), flush=True)
                next_print = time.monotonic() + args.interval
            stop.wait(0.5)
        final = client.status()
        if args.json:
            print(json.dumps({"ready_after_s": ready_at, "status": _to_dict(final)}, indent=2))
        return 0 if ready_at is not None else 1
    finally:
        stop.set()
        for t in loaders:
            t.join(timeout=10)
        if agent is not None:
            agent.stop()
        agent_client.close()
        client.close()
        server.stop()
        latency.close()
        shutil.rmtree(tmp, ignore_errors=True)


def _drive_load(fleet: Any, workload: Any, stop: threading.Event, on_latency: Any = None) -> None:
    """Open-loop load at the workload's rate, in 2-second windows, following the model across moves."""
    from agents.loadgen import LoadError, LoadGenerator
    from controller.messages import Replica
    key = str(Replica(workload.name, 0))
    gen = LoadGenerator(lambda: fleet.endpoint(key), workload.model, on_latency=on_latency)
    try:
        while not stop.is_set():
            try:
                gen.run(workload.rate_rps, 2.0, arrival="poisson", slo_ms=workload.slo_ms)
            except (LoadError, KeyError):
                stop.wait(1.0)
    finally:
        gen.close()
