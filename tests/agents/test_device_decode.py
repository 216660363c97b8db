"""Pure decoding of NVML and /proc readings, and the NVML device over a hand-written fake."""

from __future__ import annotations

from pathlib import Path

import pynvml
import pytest
from device_fakes import FakeGpu, FakeNvml

from agents.device import (
    THROTTLE_REASONS,
    CpuDevice,
    CpuTimes,
    DeviceError,
    NvmlDevice,
    decode_throttle_reasons,
    mhz_to_hz,
    milliwatts_to_watts,
    open_device,
    parse_meminfo,
    parse_proc_stat,
    utilization_pct,
)

STAT = """cpu  100 0 50 800 50 0 0 0 0 0
cpu0 60 0 30 400 10 0 0 0 0 0
cpu1 40 0 20 400 40 0 0 0 0 0
intr 12345
ctxt 999
"""


def test_throttle_bits_decode_to_names_matching_pynvml_constants():
    assert decode_throttle_reasons(0) == ()
    assert decode_throttle_reasons(0x4 | 0x40) == ("sw_power_cap", "hw_thermal_slowdown")
    assert decode_throttle_reasons(0x1) == ("gpu_idle",)
    assert decode_throttle_reasons(0x800 | 0x8) == ("hw_slowdown", "unknown_0x800")
    with pytest.raises(ValueError):
        decode_throttle_reasons(-1)
    # the table agrees with the SDK's own constants
    assert dict(THROTTLE_REASONS)[pynvml.nvmlClocksThrottleReasonSwPowerCap] == "sw_power_cap"
    assert dict(THROTTLE_REASONS)[pynvml.nvmlClocksThrottleReasonHwThermalSlowdown] == "hw_thermal_slowdown"
    assert dict(THROTTLE_REASONS)[pynvml.nvmlClocksThrottleReasonBoardLimit] == "board_limit"
    everything = 0
    for bit, _ in THROTTLE_REASONS:
        everything |= bit
    assert everything == pynvml.nvmlClocksThrottleReasonAll


def test_unit_conversions():
    assert milliwatts_to_watts(350_000) == 350.0 and milliwatts_to_watts(None) is None
    assert mhz_to_hz(1980) == 1.98e9 and mhz_to_hz(None) is None


def test_proc_stat_and_meminfo_parsing():
    total, cores = parse_proc_stat(STAT)
    assert total == CpuTimes(busy=150, total=1000)
    assert cores == (CpuTimes(busy=90, total=500), CpuTimes(busy=60, total=500))
    assert utilization_pct(CpuTimes(0, 0), CpuTimes(25, 100)) == 25.0
    assert utilization_pct(CpuTimes(5, 100), CpuTimes(5, 100)) is None
    mem = parse_meminfo("MemTotal:       16000 kB\nMemFree:  1000 kB\nMemAvailable:   4000 kB\nHugePages_Total: 0\n")
    assert mem["MemTotal"] == 16000 * 1024 and mem["MemAvailable"] == 4000 * 1024 and mem["HugePages_Total"] == 0
    with pytest.raises(DeviceError, match="no cpu lines"):
        parse_proc_stat("intr 1\n")


def _proc(tmp: Path, stat: str) -> Path:
    (tmp / "stat").write_text(stat)
    (tmp / "meminfo").write_text("MemTotal: 1000 kB\nMemAvailable: 250 kB\n")
    (tmp / "cpuinfo").write_text("processor: 0\nmodel name\t: Test CPU 9000\n")
    return tmp


def test_cpu_device_over_a_fake_proc_tree(tmp_path: Path):
    proc = _proc(tmp_path, STAT)
    dev = CpuDevice(proc, clock=lambda: 123.0)
    [info] = dev.describe()
    assert (info.kind, info.name, info.cores, info.memory_bytes) == ("cpu", "Test CPU 9000", 2, 1000 * 1024)
    # cpu0: +50 busy of +100; cpu1: +0 busy of +100 -> total 25 %
    (proc / "stat").write_text(
        "cpu  150 0 50 950 50 0 0 0 0 0\ncpu0 110 0 30 450 10 0 0 0 0 0\ncpu1 40 0 20 500 40 0 0 0 0 0\n"
    )
    [s] = dev.sample()
    assert s.utilization_pct == 25.0 and s.per_core_utilization_pct == (50.0, 0.0)
    assert s.memory_used_bytes == 750 * 1024 and s.memory_total_bytes == 1000 * 1024 and s.timestamp == 123.0
    assert s.sm_clock_mhz is None and s.power_w is None and s.processes == ()  # no invented GPU numbers
    [again] = dev.sample()  # no jiffy passed: the last figures, not a division by zero
    assert again.utilization_pct == 25.0


def test_cpu_device_without_proc_says_so(tmp_path: Path):
    with pytest.raises(DeviceError, match="needs /proc"):
        CpuDevice(tmp_path / "missing")


def test_nvml_device_reads_and_converts_every_field():
    nvml = FakeNvml(
        [
            FakeGpu(compute=[(4242, 2**30)], mps=[(5151, None)], throttle=0x4),
            FakeGpu(name="NVIDIA H200 #2", uuid="GPU-1111", temp=None, util=0),
        ]
    )
    dev = NvmlDevice(nvml, clock=lambda: 7.0)
    infos = dev.describe()
    assert [i.name for i in infos] == ["NVIDIA H200", "NVIDIA H200 #2"]
    assert infos[0].kind == "gpu" and infos[0].memory_bytes == 141 * 2**30 and infos[0].power_limit_w == 700.0
    assert infos[0].sm_clock_max_mhz == 1980.0 and infos[0].driver == "560.35.03" and infos[1].uuid == "GPU-1111"
    s0, s1 = dev.sample()
    assert (s0.sm_clock_mhz, s0.power_w, s0.power_limit_w, s0.utilization_pct) == (1980.0, 350.0, 700.0, 42.0)
    assert s0.throttle_reasons == ("sw_power_cap",) and s0.throttle_mask == 0x4
    assert [(p.pid, p.name, p.used_memory_bytes, p.mps) for p in s0.processes] == [
        (4242, "proc4242", 2**30, False),
        (5151, "proc5151", None, True),
    ]
    assert [p.pid for p in s0.mps_processes] == [5151]
    assert s1.temperature_c is None and s0.temperature_c == 51.0  # NotSupported -> None, not 0
    nvml.set_throttle(0, 0x40 | 0x1)
    nvml.set_power_mw(0, 123_456)
    s0, _ = dev.sample()
    assert s0.throttle_reasons == ("gpu_idle", "hw_thermal_slowdown") and s0.power_w == 123.456
    dev.close()
    dev.close()
    assert nvml.shutdowns == 1
    with pytest.raises(DeviceError, match="closed"):
        dev.sample()


def test_nvml_failures_are_clear_errors():
    with pytest.raises(DeviceError, match="NVML is not available here .*Driver Not Loaded.*--device cpu"):
        NvmlDevice(FakeNvml(init_error="Driver Not Loaded"))
    nvml = FakeNvml([])
    with pytest.raises(DeviceError, match="sees no GPU"):
        NvmlDevice(nvml)
    assert nvml.shutdowns == 1
    assert isinstance(open_device("auto", nvml=FakeNvml([])), CpuDevice)
    assert isinstance(open_device("auto", nvml=FakeNvml()), NvmlDevice)
    with pytest.raises(DeviceError, match="unknown device kind 'tpu'"):
        open_device("tpu")
