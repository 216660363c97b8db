"""The agent's own Prometheus endpoint for device metrics (a thin edge over `agents.device`).

A custom collector samples the device on every scrape (no background
thread, no stale numbers) and converts `DeviceSample`s into metric families;
readings the device does not have (GPU clocks on a CPU) are left out rather
than exported as zero. Metric names follow Prometheus base units:

    stoke_device_up                               1 when the last sample worked, else 0
    stoke_device_info{device,kind,name,uuid}      1
    stoke_device_cores{device,kind}
    stoke_device_utilization_ratio{device,kind}   0..1
    stoke_device_core_utilization_ratio{device,kind,core}     (CPU)
    stoke_device_memory_used_bytes / _memory_total_bytes
    stoke_device_sm_clock_hertz / _sm_clock_max_hertz         (GPU)
    stoke_device_power_watts / _power_limit_watts             (GPU)
    stoke_device_temperature_celsius                          (GPU)
    stoke_device_throttle_reason{device,kind,reason}          1 active / 0 not, every known reason (GPU)
    stoke_device_processes{device,kind,type=compute|mps}      (GPU)
    stoke_device_process_memory_bytes{device,kind,pid,name,type}  (GPU)
    stoke_device_sample_duration_seconds          time the sample took
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from agents.device import THROTTLE_REASON_NAMES, Device, DeviceError, DeviceInfo, DeviceSample, mhz_to_hz


class DeviceCollector(Collector):
    """Samples `device` at each scrape."""

    def __init__(self, device: Device) -> None:
        self.device = device
        self._lock = threading.Lock()
        self._infos: list[DeviceInfo] | None = None

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return iter(())  # no sampling at registration time

    def _info(self) -> list[DeviceInfo]:
        if self._infos is None:
            self._infos = self.device.describe()
        return self._infos

    def collect(self) -> Iterator[GaugeMetricFamily]:
        start = time.perf_counter()
        up = GaugeMetricFamily("stoke_device_up", "1 when the device could be sampled", labels=[])
        with self._lock:
            try:
                infos = self._info()
                samples = self.device.sample()
            except (DeviceError, OSError) as err:
                up.add_metric([], 0.0)
                yield up
                yield _gauge(
                    "stoke_device_sample_error", "1: the last sample failed", ["error"], [([str(err)[:200]], 1.0)]
                )
                return
        up.add_metric([], 1.0)
        yield up
        yield from (f for f in families(infos, samples) if f.samples)  # a CPU has no GPU families
        yield _gauge(
            "stoke_device_sample_duration_seconds",
            "Seconds the device sample of this scrape took",
            [],
            [([], time.perf_counter() - start)],
        )


def _gauge(
    name: str, doc: str, labels: list[str], values: list[tuple[list[str], float]], unit: str = ""
) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=labels, unit=unit)
    for label_values, value in values:
        family.add_metric(label_values, value)
    return family


def families(infos: list[DeviceInfo], samples: list[DeviceSample]) -> Iterator[GaugeMetricFamily]:
    """Metric families of one scrape (pure conversion; tested without HTTP)."""
    base = ["device", "kind"]
    yield _gauge(
        "stoke_device_info",
        "Device identity",
        base + ["name", "uuid"],
        [([str(d.index), d.kind, d.name, d.uuid], 1.0) for d in infos],
    )
    yield _gauge(
        "stoke_device_cores",
        "Logical CPU cores of the device (CPU)",
        base,
        [([str(d.index), d.kind], float(d.cores)) for d in infos if d.cores],
    )

    def per_sample(name: str, doc: str, get) -> GaugeMetricFamily:  # type: ignore[no-untyped-def]
        return _gauge(
            name, doc, base, [([str(s.index), s.kind], float(v)) for s in samples if (v := get(s)) is not None]
        )

    yield per_sample(
        "stoke_device_utilization_ratio",
        "Busy share of the device, 0..1",
        lambda s: None if s.utilization_pct is None else s.utilization_pct / 100.0,
    )
    yield _gauge(
        "stoke_device_core_utilization_ratio",
        "Busy share of one CPU core, 0..1",
        base + ["core"],
        [
            ([str(s.index), s.kind, str(c)], u / 100.0)
            for s in samples
            for c, u in enumerate(s.per_core_utilization_pct)
        ],
    )
    yield per_sample("stoke_device_memory_used_bytes", "Memory in use", lambda s: s.memory_used_bytes)
    yield per_sample("stoke_device_memory_total_bytes", "Memory in all", lambda s: s.memory_total_bytes)
    yield per_sample("stoke_device_sm_clock_hertz", "Current SM clock", lambda s: mhz_to_hz(s.sm_clock_mhz))
    yield per_sample("stoke_device_sm_clock_max_hertz", "Maximum SM clock", lambda s: mhz_to_hz(s.sm_clock_max_mhz))
    yield per_sample("stoke_device_power_watts", "Power draw", lambda s: s.power_w)
    yield per_sample("stoke_device_power_limit_watts", "Enforced power limit", lambda s: s.power_limit_w)
    yield per_sample("stoke_device_temperature_celsius", "GPU temperature", lambda s: s.temperature_c)
    yield _gauge(
        "stoke_device_throttle_reason",
        "1 when this clock throttle reason is active",
        base + ["reason"],
        [
            ([str(s.index), s.kind, r], 1.0 if r in s.throttle_reasons else 0.0)
            for s in samples
            if s.throttle_mask is not None
            for r in THROTTLE_REASON_NAMES + tuple(x for x in s.throttle_reasons if x not in THROTTLE_REASON_NAMES)
        ],
    )
    yield _gauge(
        "stoke_device_processes",
        "GPU processes (compute; MPS clients)",
        base + ["type"],
        [
            ([str(s.index), s.kind, t], float(sum(1 for p in s.processes if p.mps == (t == "mps"))))
            for s in samples
            if s.kind == "gpu"
            for t in ("compute", "mps")
        ],
    )
    yield _gauge(
        "stoke_device_process_memory_bytes",
        "GPU memory of one process",
        base + ["pid", "name", "type"],
        [
            ([str(s.index), s.kind, str(p.pid), p.name, "mps" if p.mps else "compute"], float(p.used_memory_bytes))
            for s in samples
            for p in s.processes
            if p.used_memory_bytes is not None
        ],
    )


class MetricsServer:
    """A running exporter: `.port`, `.url`, `.close()` (idempotent)."""

    def __init__(self, server, thread: threading.Thread, registry: CollectorRegistry, host: str) -> None:  # type: ignore[no-untyped-def]
        self._server = server
        self._thread = thread
        self.registry = registry
        self.host = host
        self.port = int(server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(timeout=5)
            self._server = None

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def serve_device_metrics(device: Device, port: int, host: str = "127.0.0.1") -> MetricsServer:
    """Start the exporter on host:port (0: a free port) in a daemon thread."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DeviceCollector(device))
    try:
        server, thread = start_http_server(port, addr=host, registry=registry)
    except OSError as err:
        raise DeviceError(f"cannot serve device metrics on {host}:{port} ({err.strerror}); pick a free port") from None
    return MetricsServer(server, thread, registry, host)
