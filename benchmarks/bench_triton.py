"""Triton integration figures on this machine (real tritonserver 2.51 on CPU, loopback).

Prints: start-to-ready time, model reload time, request failures during a
batch change and during a share change under steady open-loop load, the load
generator's own ceiling (highest rate it sustains), and what a CPU share does
to a compute-heavy model's latency.

    .venv/bin/python benchmarks/bench_triton.py [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agents.loadgen import LoadGenerator  # noqa: E402
from agents.triton import TritonFleet, TritonProcess  # noqa: E402
from controller.messages import ModelAssignment  # noqa: E402
from controller.render import read_config, render_config  # noqa: E402
from stoke.progress import Progress  # noqa: E402

REPO = ROOT / "triton_repo"


def a(model: str, *, batch: int = 8, share: float = 100.0, delay: float = 1.0, workload: str = "w") -> ModelAssignment:
    return ModelAssignment(
        workload=workload,
        model=model,
        device=0,
        share_pct=share,
        batch=batch,
        queue_delay_ms=delay,
        slo_ms=50.0,
        rate_rps=100.0,
    )


def fmt(values: list[float], unit: str = "s") -> str:
    return (
        f"median {statistics.median(values):.3f} {unit}  min {min(values):.3f}  max {max(values):.3f}  "
        f"(n={len(values)})"
    )


def bench_start_and_reload(workdir: Path, repeats: int) -> None:
    starts, loads, reloads = [], [], []
    base = read_config(REPO / "mlp_small" / "config.pbtxt")
    for i in range(repeats):
        process = TritonProcess(str(REPO), workdir=workdir, name=f"bench-start-{i}")
        try:
            starts.append(process.start())
            loads.append(process.load("mlp_small", render_config(base, a("mlp_small"), device_kind="cpu")))
            for batch in (16, 8, 16):
                reloads.append(
                    process.load("mlp_small", render_config(base, a("mlp_small", batch=batch), device_kind="cpu"))
                )
        finally:
            process.stop()
    print(f"triton start-to-ready (no model)     {fmt(starts)}")
    print(f"first model load (mlp_small)         {fmt(loads)}")
    print(f"model reload, config override        {fmt(reloads)}")


def under_load(fleet: TritonFleet, key: str, model: str, rate: float, seconds: float, change) -> tuple:
    results: dict = {}
    with LoadGenerator(lambda: fleet.endpoint(key), model) as gen:
        gen.prepare()
        worker = threading.Thread(target=lambda: results.update(r=gen.run(rate, seconds)))
        worker.start()
        time.sleep(seconds / 3)
        t0 = time.monotonic()
        report = change()
        took = time.monotonic() - t0
        worker.join()
    return results["r"], report, took


def bench_changes(workdir: Path, rate: float, seconds: float, repeats: int) -> None:
    with TritonFleet(str(REPO), workdir=str(workdir / "fleet")) as fleet:
        fleet.apply([a("mlp_small", batch=8, share=50.0)])
        batch_rows, share_rows = [], []
        for i in range(repeats):
            batch = 16 if i % 2 == 0 else 8
            load, report, took = under_load(
                fleet,
                "w#0",
                "mlp_small",
                rate,
                seconds,
                lambda b=batch: fleet.apply([a("mlp_small", batch=b, share=50.0)]),
            )
            assert report.reloaded == ("w#0",), report
            batch_rows.append((load.sent, load.failed, took, load.p99_ms))
        for i in range(repeats):
            share = 100.0 if i % 2 == 0 else 50.0
            batch = 16 if repeats % 2 else 8
            load, report, took = under_load(
                fleet,
                "w#0",
                "mlp_small",
                rate,
                seconds,
                lambda s=share, b=batch: fleet.apply([a("mlp_small", batch=b, share=s)]),
            )
            assert report.moved == ("w#0",), report
            share_rows.append((load.sent, load.failed, took, load.p99_ms))
    for name, rows in (("batch change (reload)", batch_rows), ("share change (new process)", share_rows)):
        sent = sum(r[0] for r in rows)
        failed = sum(r[1] for r in rows)
        p99 = statistics.median(r[3] for r in rows)
        print(
            f"{name:<27} at {rate:g} rps: {failed} failed of {sent} requests over {len(rows)} changes; "
            f"apply {fmt([r[2] for r in rows])}; p99 during run median {p99:.1f} ms"
        )


def bench_loadgen_ceiling(workdir: Path, seconds: float, rates: list[float]) -> None:
    with TritonFleet(str(REPO), workdir=str(workdir / "ceiling")) as fleet:
        fleet.apply([a("tiny_echo", batch=32, delay=0.2)])
        best = 0.0
        with LoadGenerator(fleet.endpoint("w#0"), "tiny_echo") as gen:
            for rate in rates:
                r = gen.run(rate, seconds, arrival="constant")
                # sustained: every request answered, the rate achieved, and the sender on schedule
                # (a send lag over 50 ms means the generator itself, not the server, fell behind)
                ok = r.failed == 0 and r.throughput_rps >= 0.95 * rate and r.max_send_lag_ms <= 50.0
                print(
                    f"loadgen at {rate:>6g} rps: throughput {r.throughput_rps:8.1f} rps, failed {r.failed}, "
                    f"p50 {r.p50_ms:6.2f} ms, p99 {r.p99_ms:7.2f} ms, max send lag {r.max_send_lag_ms:7.2f} ms"
                    f"{'' if ok else '  <- not sustained'}"
                )
                if ok:
                    best = rate
                else:
                    break
    print(f"load generator sustains >= {best:g} rps on this machine (tiny_echo, one Triton, same 2 cores)")


def bench_share_effect(workdir: Path, seconds: float, rate: float = 300.0) -> None:
    with TritonFleet(str(REPO), workdir=str(workdir / "share")) as fleet:
        for share in (50.0, 100.0):
            fleet.apply([a("conv_medium", batch=8, delay=5.0, share=share)])
            with LoadGenerator(fleet.endpoint("w#0"), "conv_medium") as gen:
                r = gen.run(rate, seconds, arrival="poisson", seed=1)
            obs = {o.key: o for o in fleet.observe()}["w#0"]
            cores = len(fleet.processes()["w#0"]["cpu_cores"])
            print(
                f"conv_medium at {rate:g} rps, share {share:>3g}% ({cores} cores): "
                f"p50 {r.p50_ms:6.2f} ms, p99 {r.p99_ms:7.2f} ms, mean batch {obs.mean_batch:.2f}, "
                f"compute {obs.mean_compute_ms:.2f} ms/request"
            )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats, shorter runs")
    args = parser.parse_args()
    repeats = 2 if args.quick else 4
    steps = [
        ("start and reload", lambda work: bench_start_and_reload(work, repeats)),
        (
            "changes under load",
            lambda work: bench_changes(work, rate=200.0, seconds=3.0 if args.quick else 4.5, repeats=repeats),
        ),
        (
            "load generator ceiling",
            lambda work: bench_loadgen_ceiling(work, seconds=2.0, rates=[250, 500, 1000, 2000, 3000, 4000, 6000]),
        ),
        ("share effect", lambda work: bench_share_effect(work, seconds=3.0 if args.quick else 5.0)),
    ]
    with tempfile.TemporaryDirectory(prefix="bench-triton-") as tmp:
        # progress with an ETA on stderr (a bar on a terminal, a line per step otherwise)
        with Progress("bench_triton", len(steps)) as bar:
            for name, step in steps:
                step(Path(tmp))
                sys.stdout.flush()
                bar.advance(note=f"{name} done")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
