"""A small hand-written stand-in for the pynvml module, with state setters (no GPU needed)."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace


class NVMLError(Exception):
    pass


class NVMLError_NotSupported(NVMLError):
    pass


@dataclass
class FakeGpu:
    name: str = "NVIDIA H200"
    uuid: str = "GPU-0000"
    sm_mhz: int = 1980
    sm_max_mhz: int = 1980
    power_mw: int = 350_000
    limit_mw: int = 700_000
    util: int = 42
    mem_used: int = 8 * 2**30
    mem_total: int = 141 * 2**30
    temp: int | None = 51
    throttle: int = 0
    compute: list[tuple[int, int | None]] = field(default_factory=list)  # (pid, used bytes)
    mps: list[tuple[int, int | None]] = field(default_factory=list)


class FakeNvml:
    """Implements the pynvml functions `agents.device.NvmlDevice` calls."""

    NVMLError = NVMLError
    NVML_CLOCK_SM = 1
    NVML_TEMPERATURE_GPU = 0

    def __init__(self, gpus: list[FakeGpu] | None = None, init_error: str | None = None) -> None:
        self.gpus = gpus if gpus is not None else [FakeGpu()]
        self.init_error = init_error
        self.initialised = 0
        self.shutdowns = 0
        self.calls = 0

    # state setters
    def set_throttle(self, index: int, mask: int) -> None:
        self.gpus[index].throttle = mask

    def set_power_mw(self, index: int, mw: int) -> None:
        self.gpus[index].power_mw = mw

    # NVML API
    def nvmlInit(self) -> None:
        if self.init_error:
            raise NVMLError(self.init_error)
        self.initialised += 1

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlSystemGetDriverVersion(self) -> str:
        return "560.35.03"

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> FakeGpu:
        return self.gpus[i]

    def nvmlDeviceGetName(self, h: FakeGpu) -> bytes:
        return h.name.encode()  # older pynvml returns bytes

    def nvmlDeviceGetUUID(self, h: FakeGpu) -> str:
        return h.uuid

    def nvmlDeviceGetMemoryInfo(self, h: FakeGpu) -> SimpleNamespace:
        self.calls += 1
        return SimpleNamespace(used=h.mem_used, total=h.mem_total, free=h.mem_total - h.mem_used)

    def nvmlDeviceGetUtilizationRates(self, h: FakeGpu) -> SimpleNamespace:
        return SimpleNamespace(gpu=h.util, memory=10)

    def nvmlDeviceGetClockInfo(self, h: FakeGpu, clock: int) -> int:
        assert clock == self.NVML_CLOCK_SM
        return h.sm_mhz

    def nvmlDeviceGetMaxClockInfo(self, h: FakeGpu, clock: int) -> int:
        assert clock == self.NVML_CLOCK_SM
        return h.sm_max_mhz

    def nvmlDeviceGetPowerUsage(self, h: FakeGpu) -> int:
        return h.power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, h: FakeGpu) -> int:
        return h.limit_mw

    def nvmlDeviceGetTemperature(self, h: FakeGpu, sensor: int) -> int:
        if h.temp is None:
            raise NVMLError_NotSupported("Not Supported")
        return h.temp

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: FakeGpu) -> int:
        return h.throttle

    def nvmlDeviceGetComputeRunningProcesses(self, h: FakeGpu) -> list[SimpleNamespace]:
        return [SimpleNamespace(pid=p, usedGpuMemory=m) for p, m in h.compute]

    def nvmlDeviceGetMPSComputeRunningProcesses(self, h: FakeGpu) -> list[SimpleNamespace]:
        return [SimpleNamespace(pid=p, usedGpuMemory=m) for p, m in h.mps]

    def nvmlSystemGetProcessName(self, pid: int) -> str:
        return f"/usr/bin/proc{pid}"
