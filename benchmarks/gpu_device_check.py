"""GPU device check (run on a machine with an NVIDIA GPU; ~30-60 s): NVML readings and MPS.

    python3 benchmarks/gpu_device_check.py [--json OUT.json]

Needs nvidia-ml-py (pynvml) and prometheus-client importable (both are in
the lent H200 image), and this repository on PYTHONPATH (run it from the
repository root). Steps, each printed as PASS / FAIL / SKIP:

 1. open_device("nvml"): describe() and sample() every GPU; sanity of units
    (SM clock <= max, power <= 1.1 x limit, 0 <= utilisation <= 100, memory
    used <= total) and the same readings from `nvidia-smi --query-gpu`.
 2. Load: a CUDA client (PyTorch matmuls, else a ctypes cuMemAlloc) runs
    while we sample: it shows up as a compute process with >= 256 MiB, and
    utilisation/SM clock/power rise above idle.
 3. MPS: start `nvidia-cuda-mps-control -d` with private pipe/log folders,
    run the client with CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25; expect an MPS
    server among the compute processes or the client among the MPS processes;
    then `quit` the daemon. SKIP when the MPS binary is absent.
 4. Exporter: serve_device_metrics on a free loopback port, scrape once,
    expect stoke_device_sm_clock_hertz / _power_watts / _throttle_reason.
 5. CPU cost of one NVML sample (mean over 200).
Exit status 0 when no step FAILed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agents.device import DeviceError, info_to_dict, open_device, sample_to_dict

RESULTS: list[tuple[str, str, str]] = []

CLIENT = textwrap.dedent("""
    import sys, time
    seconds = float(sys.argv[1])
    try:
        import torch
        x = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")      # 256 MiB held
        a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
        print("ready torch", flush=True)
        end = time.time() + seconds
        while time.time() < end:
            for _ in range(20):
                a = (a @ a).clamp_(-1, 1)
            torch.cuda.synchronize()
    except ImportError:
        import ctypes
        cuda = ctypes.CDLL("libcuda.so.1")
        ctx, dev, ptr = ctypes.c_void_p(), ctypes.c_int(), ctypes.c_uint64()
        assert cuda.cuInit(0) == 0 and cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
        assert cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev) == 0
        assert cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(256 << 20)) == 0
        print("ready ctypes", flush=True)
        time.sleep(seconds)
""")


def record(step: str, status: str, detail: str = "") -> None:
    RESULTS.append((step, status, detail))
    print(f"[{status}] {step}{': ' + detail if detail else ''}", flush=True)


def smi_query() -> list[dict[str, float]] | None:
    if shutil.which("nvidia-smi") is None:
        return None
    fields = [
        "clocks.sm",
        "clocks.max.sm",
        "power.draw",
        "power.limit",
        "memory.used",
        "memory.total",
        "utilization.gpu",
    ]
    proc = subprocess.run(
        ["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if proc.returncode != 0:
        return None
    rows = []
    for line in proc.stdout.strip().splitlines():
        values = [v.strip() for v in line.split(",")]
        rows.append(
            {f: (float(v) if v.replace(".", "", 1).isdigit() else float("nan")) for f, v in zip(fields, values)}
        )
    return rows


def start_client(seconds: float, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", CLIENT, str(seconds)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )
    line = proc.stdout.readline() if proc.stdout else ""
    if not line.startswith("ready"):
        err = proc.stderr.read() if proc.stderr else ""
        proc.kill()
        raise RuntimeError(f"CUDA client did not start: {line!r} {err[-500:]}")
    return proc


def main() -> int:
    parser = argparse.ArgumentParser(description="NVML readings and MPS on a real GPU")
    parser.add_argument("--json", metavar="OUT.json", help="also write every reading as JSON")
    args = parser.parse_args()
    report: dict[str, object] = {}

    # 1. describe + sample
    try:
        dev = open_device("nvml")
    except DeviceError as err:
        record("open_device('nvml')", "FAIL", str(err))
        return 1
    infos = dev.describe()
    idle = dev.sample()
    report["devices"] = [info_to_dict(d) for d in infos]
    report["idle"] = [sample_to_dict(s) for s in idle]
    for d, s in zip(infos, idle):
        print(
            f"gpu{d.index}: {d.name} uuid={d.uuid} mem={d.memory_bytes / 2**30:.1f} GiB driver={d.driver} "
            f"sm_max={d.sm_clock_max_mhz} MHz limit={d.power_limit_w} W"
        )
        print(
            f"  idle: util={s.utilization_pct}% sm={s.sm_clock_mhz} MHz power={s.power_w} W "
            f"temp={s.temperature_c} C mem={s.memory_used_bytes} B throttle={s.throttle_reasons} "
            f"(mask {s.throttle_mask}) processes={[(p.pid, p.name, p.mps) for p in s.processes]}"
        )
        problems = []
        if s.sm_clock_mhz is None or s.sm_clock_max_mhz is None or s.sm_clock_mhz > s.sm_clock_max_mhz * 1.01:
            problems.append(f"SM clock {s.sm_clock_mhz} vs max {s.sm_clock_max_mhz}")
        if s.power_w is None or s.power_limit_w is None or not 0 < s.power_w <= s.power_limit_w * 1.1:
            problems.append(f"power {s.power_w} W vs limit {s.power_limit_w} W")
        if s.utilization_pct is None or not 0 <= s.utilization_pct <= 100:
            problems.append(f"utilisation {s.utilization_pct}")
        if s.memory_used_bytes is None or s.memory_total_bytes is None or s.memory_used_bytes > s.memory_total_bytes:
            problems.append("memory used > total")
        record(f"gpu{d.index} readings in range", "FAIL" if problems else "PASS", "; ".join(problems))
    smi = smi_query()
    report["nvidia_smi"] = smi
    if smi is None:
        record("nvidia-smi agrees", "SKIP", "nvidia-smi absent or failed")
    else:
        s, q = idle[0], smi[0]
        diffs = []
        if abs(q["memory.total"] - s.memory_total_bytes / 2**20) > 0.02 * q["memory.total"] + 1:
            diffs.append(f"memory.total smi {q['memory.total']} MiB vs nvml {s.memory_total_bytes / 2**20:.0f}")
        if abs(q["power.limit"] - (s.power_limit_w or 0)) > 1.0:
            diffs.append(f"power.limit smi {q['power.limit']} W vs nvml {s.power_limit_w}")
        if abs(q["clocks.max.sm"] - (s.sm_clock_max_mhz or 0)) > 1.0:
            diffs.append(f"clocks.max.sm smi {q['clocks.max.sm']} vs nvml {s.sm_clock_max_mhz}")
        record(
            "nvidia-smi agrees (memory total, power limit, max SM clock)",
            "FAIL" if diffs else "PASS",
            "; ".join(diffs) or f"smi: {q}",
        )

    # 2. load: a CUDA client shows up; clocks/utilisation/power rise
    try:
        client = start_client(8.0)
        time.sleep(2.0)
        busy = []
        for _ in range(8):
            busy.append(dev.sample()[0])
            time.sleep(0.5)
        client.wait(timeout=30)
        report["busy"] = [sample_to_dict(s) for s in busy]
        peak = max(busy, key=lambda s: s.utilization_pct or 0)
        procs = {p.pid: p for s in busy for p in s.processes}
        big = [p for p in procs.values() if (p.used_memory_bytes or 0) >= 256 << 20]
        listed = [(p.pid, p.name, p.used_memory_bytes) for p in procs.values()]
        print(
            f"  busy peak: util={peak.utilization_pct}% sm={peak.sm_clock_mhz} MHz power={peak.power_w} W "
            f"throttle={peak.throttle_reasons} processes={listed}"
        )
        record(
            "client visible as a compute process (>= 256 MiB)",
            "PASS" if big else ("FAIL" if procs else "FAIL"),
            f"client pid {client.pid} (NVML pids may be host pids in a container); seen "
            f"{[(p.pid, p.used_memory_bytes) for p in procs.values()]}",
        )
        rises = [
            (peak.utilization_pct or 0) > (idle[0].utilization_pct or 0),
            (peak.power_w or 0) > (idle[0].power_w or 0),
        ]
        record(
            "utilisation and power rise under load",
            "PASS" if all(rises) else "FAIL",
            f"util {idle[0].utilization_pct}->{peak.utilization_pct}, power {idle[0].power_w}->{peak.power_w}, "
            f"sm {idle[0].sm_clock_mhz}->{peak.sm_clock_mhz}",
        )
    except Exception as err:  # noqa: BLE001 - a check script reports and carries on
        record("load client", "FAIL", repr(err)[:300])

    # 3. MPS
    mps = shutil.which("nvidia-cuda-mps-control")
    if mps is None:
        record("MPS", "SKIP", "nvidia-cuda-mps-control not found")
    else:
        folder = Path(tempfile.mkdtemp(prefix="stoke-mps-"))
        env = {"CUDA_MPS_PIPE_DIRECTORY": str(folder / "pipe"), "CUDA_MPS_LOG_DIRECTORY": str(folder / "log")}
        (folder / "pipe").mkdir()
        (folder / "log").mkdir()
        full_env = {**os.environ, **env}
        try:
            start = subprocess.run([mps, "-d"], env=full_env, capture_output=True, text=True, timeout=20)
            if start.returncode != 0:
                record("MPS daemon start", "FAIL", (start.stdout + start.stderr)[-300:])
            else:
                client = start_client(5.0, {**env, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25"})
                time.sleep(1.5)
                s = dev.sample()[0]
                client.wait(timeout=30)
                report["mps"] = sample_to_dict(s)
                names = [(p.pid, p.name, p.mps) for p in s.processes]
                seen = s.mps_processes or [p for p in s.processes if "mps" in p.name.lower()]
                record("MPS client or server visible through NVML", "PASS" if seen else "FAIL", f"processes {names}")
                logs = "".join(p.read_text(errors="replace") for p in (folder / "log").glob("*.log"))
                report["mps_log_tail"] = logs[-2000:]
        except Exception as err:  # noqa: BLE001
            record("MPS", "FAIL", repr(err)[:300])
        finally:
            subprocess.run([mps], input="quit\n", env=full_env, capture_output=True, text=True, timeout=20)
            shutil.rmtree(folder, ignore_errors=True)

    # 4. exporter
    try:
        from agents.device_exporter import serve_device_metrics

        with serve_device_metrics(dev, 0) as server:
            text = urllib.request.urlopen(server.url, timeout=10).read().decode()
        wanted = [
            "stoke_device_up 1.0",
            "stoke_device_sm_clock_hertz{",
            "stoke_device_power_watts{",
            "stoke_device_throttle_reason{",
            "stoke_device_processes{",
        ]
        missing = [w for w in wanted if w not in text]
        report["exposition"] = text
        record(
            "exporter scrape", "FAIL" if missing else "PASS", f"missing {missing}" if missing else f"{len(text)} bytes"
        )
    except Exception as err:  # noqa: BLE001
        record("exporter scrape", "FAIL", repr(err)[:300])

    # 5. cost
    t0 = time.process_time()
    for _ in range(200):
        dev.sample()
    cpu = (time.process_time() - t0) / 200
    report["cpu_seconds_per_sample"] = cpu
    record("CPU per NVML sample", "PASS", f"{cpu * 1e6:.0f} us")
    dev.close()

    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2, default=str))
    failed = [r for r in RESULTS if r[1] == "FAIL"]
    print(f"\n{len(RESULTS) - len(failed)} of {len(RESULTS)} steps passed or skipped; {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
