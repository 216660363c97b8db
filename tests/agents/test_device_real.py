"""The CPU device against this machine's /proc, the exporter over real HTTP, and `stoke device`."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pynvml
import pytest
from device_fakes import FakeGpu, FakeNvml
from prometheus_client.parser import text_string_to_metric_families

from agents.device import CpuDevice, DeviceError, NvmlDevice, open_device
from agents.device_exporter import serve_device_metrics
from stoke.cli import main


def _nvml_works() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


def _scrape(url: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return out


def _proc_stat_cores() -> int:
    """The cpuN lines of /proc/stat: what the CPU device counts (agents.device.parse_proc_stat). Not
    sysconf(SC_NPROCESSORS_ONLN), which reads /sys: under lxcfs or gVisor the two can differ."""
    return sum(ln.startswith("cpu") and ln[3].isdigit() for ln in Path("/proc/stat").read_text().splitlines())


def test_cpu_device_matches_proc():
    mem_total_kb = next(
        int(ln.split()[1]) for ln in Path("/proc/meminfo").read_text().splitlines() if ln.startswith("MemTotal:")
    )
    dev = open_device("cpu")
    [info] = dev.describe()
    assert info.kind == "cpu" and info.cores == _proc_stat_cores() > 0
    assert info.memory_bytes == mem_total_kb * 1024
    end = time.monotonic() + 0.3
    while time.monotonic() < end:  # keep one core busy for the sampling window
        pass
    [s] = dev.sample()
    assert len(s.per_core_utilization_pct) == info.cores
    assert 0 <= s.utilization_pct <= 100 and all(0 <= u <= 100 for u in s.per_core_utilization_pct)
    assert max(s.per_core_utilization_pct) > 20  # our busy loop shows up
    assert 0 < s.memory_used_bytes < s.memory_total_bytes == info.memory_bytes
    assert s.sm_clock_mhz is None and s.power_w is None and s.throttle_reasons == ()


@pytest.mark.skipif(_nvml_works(), reason="this machine has a working NVML; the no-GPU error cannot happen")
def test_nvml_on_a_machine_without_gpu_fails_clearly(capsys: pytest.CaptureFixture[str]):
    with pytest.raises(DeviceError, match=r"NVML is not available here .*use --device cpu"):
        open_device("nvml")
    assert isinstance(open_device("auto"), CpuDevice)
    assert main(["device", "show", "--device", "nvml"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("stoke: error: --device nvml: NVML is not available here") and err.count("\n") == 1


def test_exporter_serves_cpu_metrics_over_http():
    server = serve_device_metrics(CpuDevice(), 0)
    try:
        assert server.port > 0 and server.url == f"http://127.0.0.1:{server.port}/metrics"
        m = _scrape(server.url)
        assert m["stoke_device_up"] == [({}, 1.0)]
        assert m["stoke_device_cores"][0] == ({"device": "0", "kind": "cpu"}, float(_proc_stat_cores()))
        [(labels, util)] = m["stoke_device_utilization_ratio"]
        assert labels == {"device": "0", "kind": "cpu"} and 0.0 <= util <= 1.0
        assert len(m["stoke_device_core_utilization_ratio"]) == _proc_stat_cores()
        assert m["stoke_device_memory_total_bytes"][0][1] > m["stoke_device_memory_used_bytes"][0][1] > 0
        assert not any(
            k.startswith(("stoke_device_sm_clock", "stoke_device_power", "stoke_device_throttle")) for k in m
        )  # honest: no GPU numbers on a CPU
        assert m["stoke_device_sample_duration_seconds"][0][1] < 1.0
    finally:
        server.close()
        server.close()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", server.port), timeout=1).close()


def test_exporter_serves_gpu_metrics_in_base_units():
    nvml = FakeNvml([FakeGpu(compute=[(10, 2**30)], mps=[(11, 512)], throttle=0x4 | 0x40)])
    with serve_device_metrics(NvmlDevice(nvml), 0) as server:
        m = _scrape(server.url)
        gpu = {"device": "0", "kind": "gpu"}
        assert m["stoke_device_sm_clock_hertz"] == [(gpu, 1.98e9)]
        assert m["stoke_device_power_watts"] == [(gpu, 350.0)] and m["stoke_device_power_limit_watts"] == [(gpu, 700.0)]
        assert m["stoke_device_utilization_ratio"] == [(gpu, 0.42)]
        active = {lab["reason"] for lab, v in m["stoke_device_throttle_reason"] if v == 1.0}
        assert active == {"sw_power_cap", "hw_thermal_slowdown"} and len(m["stoke_device_throttle_reason"]) == 11
        assert sorted((lab["type"], v) for lab, v in m["stoke_device_processes"]) == [("compute", 1.0), ("mps", 1.0)]
        assert ({**gpu, "pid": "11", "name": "proc11", "type": "mps"}, 512.0) in m["stoke_device_process_memory_bytes"]
        assert m["stoke_device_info"][0][0]["name"] == "NVIDIA H200"
        calls = nvml.calls
        _scrape(server.url)
        assert nvml.calls > calls  # every scrape samples afresh


class _Broken:
    kind = "cpu"

    def describe(self):
        return []

    def sample(self):
        raise DeviceError("sensor gone")

    def close(self):
        pass


def test_exporter_reports_a_failing_device_as_down():
    with serve_device_metrics(_Broken(), 0) as server:
        m = _scrape(server.url)
        assert m["stoke_device_up"] == [({}, 0.0)]
        assert m["stoke_device_sample_error"] == [({"error": "sensor gone"}, 1.0)]


def test_exporter_port_in_use_is_a_clear_error():
    with serve_device_metrics(CpuDevice(), 0) as server:
        with pytest.raises(DeviceError, match="pick a free port"):
            serve_device_metrics(CpuDevice(), server.port)


def test_cli_show_json_and_table(capsys: pytest.CaptureFixture[str]):
    assert main(["device", "show", "--device", "cpu", "--json", "--interval", "0.1"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["kind"] == "cpu" and doc["devices"][0]["cores"] == _proc_stat_cores()
    assert 0 <= doc["samples"][0]["utilization_pct"] <= 100 and doc["samples"][0]["sm_clock_mhz"] is None
    assert main(["device", "show", "--device", "cpu", "--interval", "0"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split()[:5] == ["dev", "kind", "name", "cores", "util"] and "per-core util %" in out


@pytest.mark.slow
def test_cli_serve_runs_as_a_process_and_answers_scrapes():
    proc = subprocess.Popen(
        [sys.executable, "-m", "stoke", "device", "serve", "--port", "0", "--device", "cpu", "--duration", "20"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline()
        assert line.startswith("serving cpu device metrics on http://127.0.0.1:")
        m = _scrape(line.split(" on ")[1].strip())
        assert m["stoke_device_up"] == [({}, 1.0)]
        proc.terminate()  # SIGTERM: a clean stop
        out, _ = proc.communicate(timeout=10)
        assert proc.returncode == 0 and "stopped" in out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
