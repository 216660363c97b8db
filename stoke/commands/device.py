"""`stoke device`: what this node's devices are and read now; serve them to Prometheus."""

from __future__ import annotations

import argparse
import signal
import threading
import time
from typing import Any

from foundation.errors import UserError
from stoke.output import add_output_option, emit
from stoke.table import print_table

#: `--device` choices (agents.device.DEVICE_KINDS, a module that loads pynvml; test_cli_start.py keeps them equal).
DEVICE_KINDS = ("auto", "cpu", "nvml")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "device",
        help="this node's GPUs (NVML) or CPU: readings and a metrics endpoint",
        description="Read this node's devices through NVML (GPUs) or /proc (CPU).",
    )
    sub = p.add_subparsers(dest="device_command", metavar="COMMAND", required=True)

    s = sub.add_parser(
        "show",
        help="describe the devices and take one sample",
        description="Print each device (name, memory, cores, limits) and one reading: utilisation, "
        "memory, SM clock, power, temperature, throttle reasons, GPU/MPS processes.",
    )
    s.add_argument(
        "--device",
        choices=DEVICE_KINDS,
        default="auto",
        help="auto (NVML when it starts, else CPU; default), cpu, or nvml (fails without a GPU)",
    )
    s.add_argument(
        "--interval",
        type=float,
        default=0.5,
        metavar="S",
        help="seconds between opening and sampling, the CPU utilisation window (default 0.5)",
    )
    add_output_option(s)
    s.set_defaults(run=run_show)

    v = sub.add_parser(
        "serve",
        help="serve device metrics for Prometheus on /metrics",
        description="Serve the device readings in the Prometheus text format; every scrape samples.",
    )
    v.add_argument("--port", type=int, required=True, help="TCP port (0: any free port, printed)")
    v.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    v.add_argument("--device", choices=DEVICE_KINDS, default="auto")
    v.add_argument("--duration", type=float, default=None, metavar="S", help="stop after S seconds (default: never)")
    v.set_defaults(run=run_serve)


def _open(kind: str) -> Any:
    from agents.device import DeviceError, open_device

    try:
        return open_device(kind)
    except DeviceError as err:
        raise UserError(f"--device {kind}: {err}") from None


def _mib(value: int | None) -> float | None:
    return None if value is None else value / 2**20


def run_show(args: argparse.Namespace) -> int:
    if args.interval < 0:
        raise UserError(f"--interval must be >= 0 seconds, got {args.interval:g}")
    from agents.device import info_to_dict, sample_to_dict

    device = _open(args.device)
    try:
        infos = device.describe()
        time.sleep(args.interval)
        samples = device.sample()
    finally:
        device.close()
    if args.json:
        emit(
            args,
            {
                "kind": device.kind,
                "devices": [info_to_dict(d) for d in infos],
                "samples": [sample_to_dict(s) for s in samples],
            },
        )
        return 0
    by_index = {d.index: d for d in infos}
    rows = []
    for s in samples:
        d = by_index.get(s.index)
        rows.append(
            [
                s.index,
                s.kind,
                d.name if d else "",
                d.cores if d and d.cores else None,
                s.utilization_pct,
                _mib(s.memory_used_bytes),
                _mib(s.memory_total_bytes),
                s.sm_clock_mhz,
                s.sm_clock_max_mhz,
                s.power_w,
                s.power_limit_w,
                s.temperature_c,
                ",".join(s.throttle_reasons) or ("none" if s.throttle_mask is not None else None),
                (f"{len(s.processes)} ({len(s.mps_processes)} MPS)" if s.kind == "gpu" else None),
            ]
        )
    print_table(
        [
            "dev",
            "kind",
            "name",
            "cores",
            "util %",
            "mem used MiB",
            "mem total MiB",
            "SM MHz",
            "SM max MHz",
            "power W",
            "limit W",
            "temp C",
            "throttle",
            "processes",
        ],
        rows,
    )
    for s in samples:
        if s.per_core_utilization_pct:
            print("per-core util %: " + "  ".join(f"cpu{i} {u:.1f}" for i, u in enumerate(s.per_core_utilization_pct)))
        for p in s.processes:
            mem = "n/a" if p.used_memory_bytes is None else f"{p.used_memory_bytes / 2**20:.0f} MiB"
            print(f"gpu{s.index} pid {p.pid} {p.name or '?'} {mem}{' (MPS client)' if p.mps else ''}")
    return 0


def run_serve(args: argparse.Namespace) -> int:
    from agents.device import DeviceError
    from agents.device_exporter import serve_device_metrics  # prometheus_client: only for this command

    if not 0 <= args.port <= 65535:
        raise UserError(f"--port must be 0..65535, got {args.port}")
    if args.duration is not None and args.duration < 0:
        raise UserError(f"--duration must be >= 0 seconds (leave it out to serve until Ctrl-C), got {args.duration:g}")
    device = _open(args.device)
    try:
        server = serve_device_metrics(device, args.port, args.host)
    except DeviceError as err:
        device.close()
        raise UserError(f"--port {args.port}: {err}") from None
    print(f"serving {device.kind} device metrics on {server.url}", flush=True)
    stop = threading.Event()
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())  # stop cleanly on SIGTERM too
    try:
        stop.wait(args.duration)
    except KeyboardInterrupt:
        pass
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        server.close()
        device.close()
    print("stopped", flush=True)
    return 0
