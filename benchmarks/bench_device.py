"""Device-metrics benchmark: agent CPU cost per device sample and per Prometheus scrape.

    .venv/bin/python benchmarks/bench_device.py [--samples 2000] [--scrapes 300] [--device auto|cpu|nvml]

Figures (CPU seconds, from time.process_time, so other load on the machine
does not count):
  * per `device.sample()`                      (reading /proc or NVML)
  * per scrape, in-process                     (collector + text exposition, what the HTTP handler runs)
  * per scrape over loopback HTTP              (exporter and client in this process: an upper bound)
  * wall time per HTTP scrape (p50 / p99)
  * exporter share of one core at a 15 s scrape interval
"""

from __future__ import annotations

import argparse
import statistics
import time
import urllib.request

from prometheus_client import CollectorRegistry, generate_latest

from agents.device import open_device
from agents.device_exporter import DeviceCollector, serve_device_metrics
from stoke.table import render_table


def per_call_cpu(fn, n: int) -> float:  # type: ignore[no-untyped-def]
    fn()  # warm-up
    start = time.process_time()
    for _ in range(n):
        fn()
    return (time.process_time() - start) / n


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--scrapes", type=int, default=300)
    parser.add_argument("--device", choices=("auto", "cpu", "nvml"), default="auto")
    args = parser.parse_args()

    device = open_device(args.device)
    infos = device.describe()
    print(f"device: {device.kind} ({', '.join(d.name for d in infos)}), {len(infos)} device(s)")

    sample_cpu = per_call_cpu(device.sample, args.samples)

    registry = CollectorRegistry(auto_describe=False)
    registry.register(DeviceCollector(device))
    body = generate_latest(registry)
    scrape_cpu = per_call_cpu(lambda: generate_latest(registry), args.scrapes)

    server = serve_device_metrics(device, 0)
    walls = []
    try:
        urllib.request.urlopen(server.url, timeout=10).read()
        start_cpu = time.process_time()
        for _ in range(args.scrapes):
            t0 = time.perf_counter()
            urllib.request.urlopen(server.url, timeout=10).read()
            walls.append(time.perf_counter() - t0)
        http_cpu = (time.process_time() - start_cpu) / args.scrapes
    finally:
        server.close()
        device.close()
    walls.sort()
    p50 = statistics.median(walls)
    p99 = walls[min(len(walls) - 1, int(0.99 * len(walls)))]
    rows = [
        ["CPU s per device.sample()", f"{sample_cpu * 1e6:.1f} us", args.samples],
        ["CPU s per scrape (in-process exposition)", f"{scrape_cpu * 1e6:.1f} us", args.scrapes],
        ["CPU s per scrape over HTTP (server + client)", f"{http_cpu * 1e6:.1f} us", args.scrapes],
        ["wall per HTTP scrape p50 / p99", f"{p50 * 1e3:.2f} / {p99 * 1e3:.2f} ms", args.scrapes],
        ["exposition size", f"{len(body)} bytes", 1],
        ["share of one core at 15 s scrapes", f"{100 * http_cpu / 15:.4f} %", ""],
    ]
    print(render_table(["figure", "value", "n"], rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
