"""The long-running processes: `stoke controller` and `stoke agent`."""

from __future__ import annotations

import argparse
import logging
import os
import re
import signal
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from foundation import validate as check
from foundation.errors import UserError
from foundation.names import check_name, shown
from stoke.client_options import add_client_options, connect, controller_address
from stoke.commands.inputs import add_repo_option, check_repo_dir


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "controller",
        help="run the control-plane controller (gRPC API, reconcile loop)",
        description="Run the controller until Ctrl-C. The YAML config (listen, db, "
        "token_file, tls, heartbeat timeout, gpu_types, profiles) is declared in "
        "controller/config.py; its JSON Schema is "
        "controller/data/controller-config.schema.json.",
    )
    p.add_argument(
        "action",
        nargs="?",
        choices=("run", "recover"),
        default="run",
        help="run (default), or recover a damaged database (the controller stopped): keep it aside, restore the "
        "newest good backup or salvage what is readable",
    )
    p.add_argument("--config", metavar="FILE", help="controller YAML config")
    p.add_argument("--listen", metavar="HOST:PORT", help="override `listen`")
    p.add_argument("--db", metavar="FILE", help="override `db`")
    p.add_argument("--token-file", metavar="FILE", help="override `token_file`")
    p.add_argument("--metrics-listen", metavar="HOST:PORT", help="override `metrics_listen` ('' = off)")
    p.add_argument("--heartbeat-timeout", type=float, metavar="S", help="override `heartbeat_timeout_s`")
    p.add_argument("--heartbeat-interval", type=float, metavar="S", help="override `heartbeat_interval_s`")
    p.add_argument("--log-level", default="INFO", help="logging level (default %(default)s)")
    p.set_defaults(run=run_controller)

    p = subparsers.add_parser(
        "agent",
        help="run the node agent (registers, heartbeats, runs Triton)",
        description="Register this node with the controller and serve its assignments with Triton until Ctrl-C. "
        "Each workload on the node gets stable gRPC, HTTP and metrics endpoints on --bind (a small router in "
        "front of its Triton processes, so share moves do not change them); `stoke status` and `stoke nodes` "
        "list them under the --advertise host.",
    )
    add_client_options(p)
    p.add_argument("--device", choices=("auto", "cpu", "nvml"), default="auto", help="device backend")
    p.add_argument("--node-id", help="node id (default: the node its agent token is bound to, else the host name)")
    add_repo_option(p, "Triton model repository: a directory or s3://[host:port/]bucket/path (default %(default)s)")
    p.add_argument(
        "--bind",
        default="127.0.0.1",
        metavar="ADDRESS",
        help="address the workloads' endpoints listen on (default %(default)s: this machine only; "
        "0.0.0.0 or :: for every interface)",
    )
    p.add_argument(
        "--advertise",
        metavar="HOST",
        help="host name or address other machines reach the endpoints at (default: the --bind address, "
        "or this machine's fully qualified name when --bind is a wildcard)",
    )
    p.add_argument(
        "--ports",
        default="0",
        metavar="LOW-HIGH",
        help="port range of the endpoints, two ports (gRPC, HTTP) per workload, chosen from the workload's "
        "name so they stay put across restarts (default 0: any free ports)",
    )
    p.add_argument(
        "--workdir",
        help="where Triton processes keep their files and pids, kept across restarts so a restarted agent reaps "
        "what a crashed one left (default: $XDG_STATE_HOME/stoke/agent-NODE, else ~/.local/state/stoke/agent-NODE)",
    )
    p.add_argument(
        "--gpu-type",
        default="",
        help="GPU type of this node's devices (default: decided by the controller's gpu_types)",
    )
    p.add_argument(
        "--mps",
        action="store_true",
        help="start the MPS control daemon of this node's GPUs (nvidia-cuda-mps-control -d, with "
        "$CUDA_MPS_PIPE_DIRECTORY/$CUDA_MPS_LOG_DIRECTORY) before serving, and stop it on exit; without it a "
        "daemon must already run (GPU nodes only; the Kubernetes DaemonSet uses it)",
    )
    p.add_argument("--ready-timeout", type=float, default=60.0, help="seconds a Triton start may take")
    p.add_argument(
        "--latency-histogram",
        action="store_true",
        help="configure Triton's per-model latency histogram with a bucket at each SLO (used by the "
        "SLO alert rules of `stoke alerts`; needs Triton >= 2.52, the bundled 2.51 refuses it)",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        default=-1,
        metavar="PORT",
        help="serve this node's device metrics on http://127.0.0.1:PORT/metrics (0 = any; default off)",
    )
    p.add_argument(
        "--sli-metrics",
        action="append",
        default=[],
        metavar="URL",
        help="read the serving path's SLI histogram (stoke_request_latency_ms, e.g. `stoke load --metrics-port`) "
        "from this /metrics URL each window and report each replica's p50/p95/p99 and share over its SLO "
        "(repeatable); the SLO guard and `stoke observations` use them",
    )
    p.add_argument(
        "--sli-pooled-windows",
        type=int,
        default=10,
        metavar="N",
        help="with --sli-metrics, also report the p99 of the last N windows' requests pooled (1-32, default "
        "%(default)s: the controller's recalibration.recent_windows); the closed loop learns the serving path "
        "from it, since slow requests that come in bursts hide in the median of the windows' p99s",
    )
    p.add_argument(
        "--no-measure",
        action="store_true",
        help="refuse the controller's measure requests (verify before serving); by default a CPU node measures "
        "a requested point in Triton processes of its own at that share; a GPU node cannot yet and says so",
    )
    p.add_argument("--log-level", default="INFO", help="logging level (default %(default)s)")
    p.set_defaults(run=run_agent)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def interrupt_on_signals() -> Callable[[], None]:
    """From now on SIGINT and SIGTERM raise KeyboardInterrupt, also in a process that inherited SIGINT
    ignored (a background job of a script), which Python's own Ctrl-C handling leaves ignored.

    Returns what puts the previous handlers back. Outside the main thread it changes nothing."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGTERM, signal.SIGINT)}

    def restore() -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    return restore


def until_signal(seconds: float = 0.0) -> threading.Event:
    """An event set on SIGINT / SIGTERM (or after `seconds` > 0)."""
    stop = threading.Event()

    def handler(signum: int, frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
    if seconds > 0:
        timer = threading.Timer(seconds, stop.set)
        timer.daemon = True  # Ctrl-C before the deadline must not wait for it
        timer.start()
    return stop


def run_controller(args: argparse.Namespace) -> int:
    from controller.config import load_config
    from controller.server import ControllerServer

    logging.basicConfig(level=log_level(args.log_level), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    config = load_config(
        args.config,
        listen=args.listen,
        db=args.db,
        token_file=args.token_file,
        metrics_listen=args.metrics_listen,
        heartbeat_timeout_s=args.heartbeat_timeout,
        heartbeat_interval_s=args.heartbeat_interval,
    )
    if args.action == "recover":
        from controller.server import lock_database

        lock = lock_database(config.db)  # refused while a controller runs on it
        try:
            return recover_database(config.db, config.backup_dir)
        finally:
            if lock is not None:
                lock.close()
    server = ControllerServer(config).start()
    print(f"stoke controller listening on {server.address} ({server.metrics_said})", flush=True)
    stop = until_signal()
    stop.wait()
    server.stop()
    return 0


def recover_database(db: str, backup_dir: str | None) -> int:
    from controller.store import recover

    result = recover(db, backup_dir)
    if result.action == "sound":
        print(f"{db}: passes its integrity check; nothing to recover")
        return 0
    print(f"{db}: damaged; kept aside as {result.kept_aside}" if result.kept_aside else f"{db}: missing")
    if result.action == "restored":
        print(f"restored from the backup {result.source}")
    else:
        print("no good backup: salvaged what was readable into a fresh database")
    for line in result.lost:
        print(f"  lost: {line}")
    for line in result.notes:
        print(f"  note: {line}")
    return 0 if not result.lost else 1


def run_agent(args: argparse.Namespace) -> int:
    quiet_grpc()
    from dataclasses import replace

    from agents.agent import Agent, local_devices
    from agents.triton import TritonFleet
    from controller.messages import MAX_POOLED_WINDOWS

    logging.basicConfig(level=log_level(args.log_level), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if not 1 <= args.sli_pooled_windows <= MAX_POOLED_WINDOWS:
        raise UserError(
            f"--sli-pooled-windows must be from 1 to {MAX_POOLED_WINDOWS}, got {args.sli_pooled_windows}; "
            "pass the controller's recalibration.recent_windows (10 by default)"
        )
    controller_address(args)  # a bad --controller or --metrics-port before anything starts
    check.whole(
        args.metrics_port,
        "--metrics-port",
        minimum=-1,
        maximum=check.PORT_MAX,
        error=UserError,
        fix="0 = any, -1 = off",
    )
    node_id = agent_node_id(args)
    _check_agent_options(args, node_id)
    devices = local_devices(args.device)
    if args.gpu_type:
        devices = tuple(replace(d, gpu_type=args.gpu_type) for d in devices)
    kind = "gpu" if any(d.kind == "gpu" for d in devices) else "cpu"
    check_repo_dir(args.repo, "pass the path of triton_repo/ (or an s3:// URL)")
    mps = None
    if args.mps:
        if kind != "gpu":
            raise UserError("--mps needs GPU devices (--device nvml or auto on a GPU node); this node has none")
        from agents.mps import MpsControl

        mps = MpsControl()
        mps.start()  # now, so a missing MPS binary stops the agent instead of failing every assignment
    try:
        router = open_router(args.bind, args.advertise, args.ports)
        client = connect(args)
    except BaseException:
        if mps is not None:
            mps.quit()  # the fleet that would stop it never came to be
        raise
    fleet = TritonFleet(
        args.repo,
        device_kind=kind,
        workdir=args.workdir or str(default_workdir(node_id)),
        ready_timeout_s=args.ready_timeout,
        latency_histogram=args.latency_histogram,
        router=router,
        devices=sum(1 for d in devices if d.kind == "gpu") if kind == "gpu" else None,
        mps=mps,  # the fleet stops the daemon when it closes (only one it started)
    )
    exporter = None
    if args.metrics_port >= 0:
        from agents.device import DeviceError, open_device
        from agents.device_exporter import serve_device_metrics

        try:
            exporter = serve_device_metrics(open_device(args.device), args.metrics_port)
        except (DeviceError, OSError) as err:
            fleet.close()
            raise UserError(f"--metrics-port {args.metrics_port}: cannot serve device metrics ({err})") from None
    from agents.device import DeviceError, open_device
    from agents.latency_metrics import url_source

    try:
        reader = open_device(args.device)  # device readings in each window
    except DeviceError as err:
        logging.getLogger("stoke.agent").warning("no device readings in the observations: %s", err)
        reader = None
    sli = [url_source(url) for url in args.sli_metrics]
    measurer = None
    if kind == "cpu" and not args.no_measure:  # measuring through NVML/MPS on a GPU is not built yet
        from agents.profiler import AgentMeasurer

        # under the agent's own workdir: a killed agent's measuring processes are reaped by the next one
        measurer = AgentMeasurer(
            args.repo, workdir=str(Path(fleet.workdir) / "measure"), progress=logging.getLogger("stoke.agent").info
        )
    agent = Agent(
        client,
        fleet,
        node_id,
        devices,
        address=router.host,
        sli_sources=sli,
        sli_pooled_windows=args.sli_pooled_windows,
        device=reader,
        measurer=measurer,
    )
    if fleet.reaped:
        agent.note(
            f"reaped {len(fleet.reaped)} Triton process(es) a previous agent left running in {fleet.workdir} "
            f"(pids {', '.join(map(str, fleet.reaped))})"
        )
    agent.start()
    print(
        f"stoke agent {node_id}: {len(devices)} {kind} device(s), controller {controller_address(args)}, "
        f"workload endpoints on {args.bind} as {router.host}"
        + (f", device metrics {exporter.url}" if exporter else ""),
        flush=True,
    )
    stop = until_signal()
    stop.wait()
    agent.stop()  # stops the measurer too, beside the fleet (within the agent's shutdown bound)
    client.close()
    if reader is not None:
        reader.close()
    if exporter is not None:
        exporter.close()
    return 0


def open_router(bind: str, advertise: str | None, ports: str) -> Any:
    """The agent's router for stable per-workload endpoints; a bad --bind or --ports is one clear line."""
    from agents.router import Router, parse_port_range

    try:
        port_range = parse_port_range(ports)
    except ValueError as err:
        raise UserError(f"--ports {ports}: {err}") from None
    family = socket.AF_INET6 if ":" in bind else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind((bind, 0))
    except OSError as err:
        raise UserError(
            f"--bind {bind}: cannot listen there ({err.strerror or err}); give an address of this machine, "
            f"127.0.0.1, or 0.0.0.0 for every interface"
        ) from None
    return Router(bind, advertise, port_range)


LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
#: A host name or an address, as --advertise names one (a bracketed IPv6 address too).
_HOST = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,252})|\[[0-9A-Fa-f:.]+\]|[0-9A-Fa-f:.]+")  # '_': compose names
MAX_READY_TIMEOUT_S = 3600.0


def log_level(value: str) -> str:
    """--log-level as `logging` takes it, or a clear error (logging raised ValueError: a traceback)."""
    if not isinstance(value, str) or value.lower() not in LOG_LEVELS:
        raise UserError(f"--log-level {shown(value)}: give one of {', '.join(LOG_LEVELS)}")
    return value.upper()


def _check_agent_options(args: argparse.Namespace, node_id: str) -> None:
    """What the agent would otherwise find wrong only once started (retrying forever, or echoing escapes)."""
    check_name(node_id, "--node-id", error=UserError)
    if args.gpu_type:
        check_name(args.gpu_type, "--gpu-type", error=UserError)
    check.positive(args.ready_timeout, "--ready-timeout", error=UserError, maximum=MAX_READY_TIMEOUT_S, unit="seconds")
    if args.advertise is not None and not _HOST.fullmatch(args.advertise):
        raise UserError(f"--advertise {shown(args.advertise)}: not a host name or address; e.g. --advertise node-1.lan")
    for url in args.sli_metrics:
        if not re.fullmatch(r"https?://[^\s/]+(?:/\S*)?", url):
            raise UserError(
                f"--sli-metrics {shown(url)}: not an http(s) /metrics URL; e.g. http://127.0.0.1:9400/metrics"
            )
    if args.workdir and Path(args.workdir).exists() and not Path(args.workdir).is_dir():
        raise UserError(f"--workdir {shown(args.workdir)}: exists and is not a folder; give a folder (it is created)")


def agent_node_id(args: argparse.Namespace) -> str:
    """--node-id, else the node the agent token is bound to, else the host name; a mismatch is refused."""
    from controller.api.auth import read_token
    from controller.identity import agent_token_node

    token = read_token(getattr(args, "token_file", None))
    bound = agent_token_node(token) if token else None
    if token and bound is None:
        # the user token (or anything else) can never register a node: the controller would refuse every
        # heartbeat, so an agent started with it would retry forever while serving nothing
        where = f"--token-file {args.token_file}" if getattr(args, "token_file", None) else "$STOKE_TOKEN"
        node = args.node_id or "NODE"
        raise UserError(
            f"{where}: not an agent token (agent tokens look like stoke-node:NODE:...; the user token cannot "
            f"register a node); mint one with `stoke token agent {node} --file {node}.token` (with the user "
            f"token) and start the agent with --token-file {node}.token"
        )
    if args.node_id and bound and args.node_id != bound:
        raise UserError(
            f"--node-id {args.node_id}: the agent token is bound to node {bound!r}; drop --node-id or mint a token "
            f"for {args.node_id} (`stoke token agent {args.node_id}`)"
        )
    return str(args.node_id or bound or socket.gethostname())


def default_workdir(node_id: str) -> Path:
    """A stable per-node state folder, so a restarted agent finds (and reaps) what a crashed one left."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "stoke" / f"agent-{node_id}"


def quiet_grpc() -> None:
    """grpc core logs an INFO line whenever a Triton process is forked beside its threads; keep errors only."""
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
