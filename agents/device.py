"""The node's compute devices behind one interface: NVIDIA GPUs through NVML, or the CPU.

The one module that imports `pynvml` (package nvidia-ml-py).

    device = open_device("auto")      # NVML when nvmlInit() works, else the CPU
    device.describe()                 # -> [DeviceInfo]   (static: name, memory, cores, limits)
    device.sample()                   # -> [DeviceSample] (now: utilisation, clocks, power, memory, processes)
    device.close()

On a GPU node every sample reads NVML: SM clock and its maximum (MHz), power
and the enforced power limit (NVML gives milliwatts; converted to watts),
utilisation (%), memory used/total (bytes), temperature, the clock throttle
(event) reasons decoded from their bitmask to names, and the compute and MPS
client processes with their GPU memory. A reading NVML does not support on
that GPU is None, never a made-up number.

Elsewhere the CPU is one device: cores and memory from /proc, utilisation per
core and in total from /proc/stat deltas between two samples (the first
sample covers the time since the device was opened), memory used =
MemTotal - MemAvailable from /proc/meminfo. GPU fields stay None.

`agents.device_exporter.serve_device_metrics(device, port, host)` exports the
samples on the agent's own Prometheus endpoint (it imports this module, not
the other way round).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pynvml

from foundation.errors import StokeError

DEVICE_KINDS = ("auto", "cpu", "nvml")

#: NVML clock throttle ("clocks event") reason bits -> stable snake_case names.
THROTTLE_REASONS: tuple[tuple[int, str], ...] = (
    (0x0000000000000001, "gpu_idle"),
    (0x0000000000000002, "applications_clocks_setting"),
    (0x0000000000000004, "sw_power_cap"),
    (0x0000000000000008, "hw_slowdown"),
    (0x0000000000000010, "sync_boost"),
    (0x0000000000000020, "sw_thermal_slowdown"),
    (0x0000000000000040, "hw_thermal_slowdown"),
    (0x0000000000000080, "hw_power_brake_slowdown"),
    (0x0000000000000100, "display_clock_setting"),
    (0x0000000000000200, "board_limit"),
    (0x0000000000000400, "reliability"),
)
THROTTLE_REASON_NAMES = tuple(name for _, name in THROTTLE_REASONS)


class DeviceError(StokeError, RuntimeError):
    """A device cannot be opened or read; the message says why and what to do."""


@dataclass(frozen=True)
class DeviceInfo:
    """What a device is (does not change while it runs)."""

    index: int
    kind: str  # "gpu" | "cpu"
    name: str
    memory_bytes: int  # total memory (GPU memory, or the node's RAM for the CPU)
    cores: int = 0  # CPU cores (logical CPUs); 0 for a GPU
    uuid: str = ""
    sm_clock_max_mhz: float | None = None
    power_limit_w: float | None = None
    driver: str = ""


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    used_memory_bytes: int | None  # None when NVML cannot tell (e.g. some MPS/Windows setups)
    name: str = ""
    mps: bool = False  # an MPS client (from the MPS process list)


@dataclass(frozen=True)
class DeviceSample:
    """One reading of one device."""

    index: int
    kind: str
    timestamp: float  # time.time() of the reading
    utilization_pct: float | None  # 0..100
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    per_core_utilization_pct: tuple[float, ...] = ()  # CPU only
    sm_clock_mhz: float | None = None
    sm_clock_max_mhz: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    temperature_c: float | None = None
    throttle_reasons: tuple[str, ...] = ()
    throttle_mask: int | None = None
    processes: tuple[GpuProcess, ...] = ()

    @property
    def mps_processes(self) -> tuple[GpuProcess, ...]:
        return tuple(p for p in self.processes if p.mps)


class Device(Protocol):
    """What the agent needs from a node's devices."""

    kind: str

    def describe(self) -> list[DeviceInfo]: ...
    def sample(self) -> list[DeviceSample]: ...
    def close(self) -> None: ...


# --------------------------------------------------------------------------- pure decoding


def decode_throttle_reasons(mask: int) -> tuple[str, ...]:
    """NVML throttle/clocks-event bitmask -> reason names, in bit order; unknown bits as 'unknown_0x...'."""
    if mask < 0:
        raise ValueError(f"throttle reason mask must be >= 0, got {mask}")
    names = [name for bit, name in THROTTLE_REASONS if mask & bit]
    known = 0
    for bit, _ in THROTTLE_REASONS:
        known |= bit
    rest = mask & ~known
    bit = 1
    while rest:
        if rest & bit:
            names.append(f"unknown_{bit:#x}")
            rest &= ~bit
        bit <<= 1
    return tuple(names)


def milliwatts_to_watts(mw: float | None) -> float | None:
    return None if mw is None else float(mw) / 1000.0


def mhz_to_hz(mhz: float | None) -> float | None:
    return None if mhz is None else float(mhz) * 1e6


def _text(value: Any) -> str:
    """NVML strings are bytes in older pynvml, str in newer."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


@dataclass(frozen=True)
class CpuTimes:
    """Jiffies of one /proc/stat `cpu` line."""

    busy: int
    total: int


def parse_proc_stat(text: str) -> tuple[CpuTimes, tuple[CpuTimes, ...]]:
    """/proc/stat -> (all CPUs, per CPU in cpuN order). Busy = total - idle - iowait.

    Total is user+nice+system+idle+iowait+irq+softirq+steal (guest time is
    already inside user/nice).
    """
    total: CpuTimes | None = None
    cores: list[tuple[int, CpuTimes]] = []
    for line in text.splitlines():
        if not line.startswith("cpu"):
            continue
        parts = line.split()
        values = [int(v) for v in parts[1:9]] + [0] * max(0, 8 - len(parts[1:9]))
        idle = values[3] + values[4]
        times = CpuTimes(busy=sum(values) - idle, total=sum(values))
        if parts[0] == "cpu":
            total = times
        else:
            cores.append((int(parts[0][3:]), times))
    if total is None or not cores:
        raise DeviceError("/proc/stat has no cpu lines; is /proc mounted?")
    return total, tuple(t for _, t in sorted(cores))


def utilization_pct(before: CpuTimes, after: CpuTimes) -> float | None:
    """Busy share of the jiffies between two readings, 0..100; None when no time passed."""
    d_total = after.total - before.total
    if d_total <= 0:
        return None
    return max(0.0, min(100.0, 100.0 * (after.busy - before.busy) / d_total))


def parse_meminfo(text: str) -> dict[str, int]:
    """/proc/meminfo -> bytes per field (the kB unit converted)."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if not parts:
            continue
        try:
            value = int(parts[0])
        except ValueError:
            continue
        out[key.strip()] = value * 1024 if len(parts) > 1 and parts[1].lower() == "kb" else value
    return out


def cpu_model_name(cpuinfo: str) -> str:
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("model name", "Model", "Hardware", "cpu model") and value.strip():
            return value.strip()
    return ""


# --------------------------------------------------------------------------- CPU device


class CpuDevice:
    """The CPU as one device, read from /proc (`proc_root` for tests)."""

    kind = "cpu"

    def __init__(self, proc_root: str | os.PathLike[str] = "/proc", clock: Callable[[], float] = time.time) -> None:
        self.proc = Path(proc_root)
        self.clock = clock
        self._lock = threading.Lock()
        self._last = self._read_stat()
        self._last_util: tuple[float | None, tuple[float | None, ...]] | None = None

    def _read(self, name: str) -> str:
        try:
            return (self.proc / name).read_text()
        except OSError as err:
            raise DeviceError(f"cannot read {self.proc / name} ({err.strerror}); the CPU device needs /proc") from None

    def _read_stat(self) -> tuple[CpuTimes, tuple[CpuTimes, ...]]:
        return parse_proc_stat(self._read("stat"))

    def describe(self) -> list[DeviceInfo]:
        _, cores = self._read_stat()
        mem = parse_meminfo(self._read("meminfo"))
        try:
            name = cpu_model_name(self._read("cpuinfo"))
        except DeviceError:
            name = ""
        return [
            DeviceInfo(
                index=0, kind="cpu", name=name or "cpu", memory_bytes=int(mem.get("MemTotal", 0)), cores=len(cores)
            )
        ]

    def sample(self) -> list[DeviceSample]:
        now_total, now_cores = self._read_stat()
        mem = parse_meminfo(self._read("meminfo"))
        with self._lock:
            before_total, before_cores = self._last
            total = utilization_pct(before_total, now_total)
            cores = tuple(utilization_pct(b, a) for b, a in zip(before_cores, now_cores))
            if total is None:  # sampled twice within one jiffy: repeat the last figures
                if self._last_util is not None:
                    total, cores = self._last_util
                else:  # nothing yet: the average since boot
                    total = utilization_pct(CpuTimes(0, 0), now_total)
                    cores = tuple(utilization_pct(CpuTimes(0, 0), a) for a in now_cores)
            else:
                self._last = (now_total, now_cores)
                self._last_util = (total, cores)
        mem_total = mem.get("MemTotal")
        available = mem.get("MemAvailable", mem.get("MemFree"))
        used = None if mem_total is None or available is None else mem_total - available
        return [
            DeviceSample(
                index=0,
                kind="cpu",
                timestamp=self.clock(),
                utilization_pct=total,
                memory_used_bytes=used,
                memory_total_bytes=mem_total,
                per_core_utilization_pct=tuple(c if c is not None else 0.0 for c in cores),
            )
        ]

    def close(self) -> None:
        pass


# --------------------------------------------------------------------------- NVML device


class NvmlDevice:
    """Every NVIDIA GPU of the node, read through NVML.

    `nvml` is the pynvml module (injectable: tests pass a small fake with the
    same functions). Opening fails with DeviceError when NVML cannot start
    (no driver, no GPU) or sees no GPU.
    """

    kind = "gpu"

    def __init__(self, nvml: Any = pynvml, clock: Callable[[], float] = time.time) -> None:
        self.nvml = nvml
        self.clock = clock
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as err:
            raise DeviceError(
                f"NVML is not available here ({_text(err) or type(err).__name__}): no NVIDIA "
                f"driver or GPU on this machine; use --device cpu (or auto)"
            ) from None
        self._open = True
        try:
            count = int(nvml.nvmlDeviceGetCount())
            self._handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except nvml.NVMLError as err:
            self.close()
            raise DeviceError(f"NVML started but cannot list GPUs ({_text(err)}); check the NVIDIA driver") from None
        if not self._handles:
            self.close()
            raise DeviceError("NVML sees no GPU on this machine; use --device cpu (or auto)")

    def _get(self, fn: str, *args: Any) -> Any:
        """One NVML reading; None when this GPU/driver does not support it."""
        try:
            return getattr(self.nvml, fn)(*args)
        except (self.nvml.NVMLError, AttributeError):
            return None

    def describe(self) -> list[DeviceInfo]:
        driver = self._get("nvmlSystemGetDriverVersion")
        out = []
        for i, h in enumerate(self._handles):
            mem = self._get("nvmlDeviceGetMemoryInfo", h)
            out.append(
                DeviceInfo(
                    index=i,
                    kind="gpu",
                    name=_text(self._get("nvmlDeviceGetName", h) or f"gpu{i}"),
                    memory_bytes=int(mem.total) if mem is not None else 0,
                    uuid=_text(self._get("nvmlDeviceGetUUID", h) or ""),
                    sm_clock_max_mhz=_float(self._get("nvmlDeviceGetMaxClockInfo", h, self.nvml.NVML_CLOCK_SM)),
                    power_limit_w=milliwatts_to_watts(self._get("nvmlDeviceGetEnforcedPowerLimit", h)),
                    driver=_text(driver or ""),
                )
            )
        return out

    def _throttle_mask(self, h: Any) -> int | None:
        for fn in ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"):
            mask = self._get(fn, h)
            if mask is not None:
                return int(mask)
        return None

    def _process_name(self, pid: int) -> str:
        name = self._get("nvmlSystemGetProcessName", pid)
        if name:
            return os.path.basename(_text(name))
        try:
            return Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            return ""

    def _processes(self, h: Any) -> tuple[GpuProcess, ...]:
        out: dict[int, GpuProcess] = {}
        for fn, mps in (
            ("nvmlDeviceGetComputeRunningProcesses", False),
            ("nvmlDeviceGetMPSComputeRunningProcesses", True),
        ):
            for p in self._get(fn, h) or ():
                pid = int(p.pid)
                used = getattr(p, "usedGpuMemory", None)
                out[pid] = GpuProcess(
                    pid=pid,
                    used_memory_bytes=None if used is None else int(used),
                    name=self._process_name(pid),
                    mps=mps or (pid in out and out[pid].mps),
                )
        return tuple(sorted(out.values(), key=lambda p: p.pid))

    def sample(self) -> list[DeviceSample]:
        if not self._open:
            raise DeviceError("the NVML device is closed")
        now = self.clock()
        out = []
        nvml = self.nvml
        for i, h in enumerate(self._handles):
            mem = self._get("nvmlDeviceGetMemoryInfo", h)
            util = self._get("nvmlDeviceGetUtilizationRates", h)
            mask = self._throttle_mask(h)
            out.append(
                DeviceSample(
                    index=i,
                    kind="gpu",
                    timestamp=now,
                    utilization_pct=_float(util.gpu) if util is not None else None,
                    memory_used_bytes=int(mem.used) if mem is not None else None,
                    memory_total_bytes=int(mem.total) if mem is not None else None,
                    sm_clock_mhz=_float(self._get("nvmlDeviceGetClockInfo", h, nvml.NVML_CLOCK_SM)),
                    sm_clock_max_mhz=_float(self._get("nvmlDeviceGetMaxClockInfo", h, nvml.NVML_CLOCK_SM)),
                    power_w=milliwatts_to_watts(self._get("nvmlDeviceGetPowerUsage", h)),
                    power_limit_w=milliwatts_to_watts(self._get("nvmlDeviceGetEnforcedPowerLimit", h)),
                    temperature_c=_float(self._get("nvmlDeviceGetTemperature", h, nvml.NVML_TEMPERATURE_GPU)),
                    throttle_reasons=decode_throttle_reasons(mask) if mask is not None else (),
                    throttle_mask=mask,
                    processes=self._processes(h),
                )
            )
        return out

    def close(self) -> None:
        if getattr(self, "_open", False):
            self._open = False
            try:
                self.nvml.nvmlShutdown()
            except self.nvml.NVMLError:
                pass


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


# --------------------------------------------------------------------------- entry points


def open_device(kind: str = "auto", *, nvml: Any = pynvml, proc_root: str | os.PathLike[str] = "/proc") -> Device:
    """The node's devices: "nvml" (GPUs; DeviceError without one), "cpu", or "auto" (NVML if it starts)."""
    if kind == "cpu":
        return CpuDevice(proc_root)
    if kind == "nvml":
        return NvmlDevice(nvml)
    if kind == "auto":
        try:
            return NvmlDevice(nvml)
        except DeviceError:
            return CpuDevice(proc_root)
    raise DeviceError(f"unknown device kind {kind!r}; use one of {', '.join(DEVICE_KINDS)}")


def sample_to_dict(s: DeviceSample) -> dict[str, Any]:
    """JSON shape of a sample (`stoke device show --json`)."""
    return {
        "index": s.index,
        "kind": s.kind,
        "timestamp": s.timestamp,
        "utilization_pct": s.utilization_pct,
        "per_core_utilization_pct": list(s.per_core_utilization_pct),
        "memory_used_bytes": s.memory_used_bytes,
        "memory_total_bytes": s.memory_total_bytes,
        "sm_clock_mhz": s.sm_clock_mhz,
        "sm_clock_max_mhz": s.sm_clock_max_mhz,
        "power_w": s.power_w,
        "power_limit_w": s.power_limit_w,
        "temperature_c": s.temperature_c,
        "throttle_reasons": list(s.throttle_reasons),
        "throttle_mask": s.throttle_mask,
        "processes": [
            {"pid": p.pid, "name": p.name, "used_memory_bytes": p.used_memory_bytes, "mps": p.mps} for p in s.processes
        ],
    }


def info_to_dict(d: DeviceInfo) -> dict[str, Any]:
    return {
        "index": d.index,
        "kind": d.kind,
        "name": d.name,
        "uuid": d.uuid,
        "memory_bytes": d.memory_bytes,
        "cores": d.cores,
        "sm_clock_max_mhz": d.sm_clock_max_mhz,
        "power_limit_w": d.power_limit_w,
        "driver": d.driver,
    }


__all__: Sequence[str] = (
    "Device",
    "DeviceError",
    "DeviceInfo",
    "DeviceSample",
    "GpuProcess",
    "CpuDevice",
    "NvmlDevice",
    "open_device",
    "decode_throttle_reasons",
    "milliwatts_to_watts",
    "mhz_to_hz",
    "parse_proc_stat",
    "parse_meminfo",
    "utilization_pct",
    "sample_to_dict",
    "info_to_dict",
    "THROTTLE_REASONS",
    "THROTTLE_REASON_NAMES",
    "DEVICE_KINDS",
)
