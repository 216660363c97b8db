"""What a bigger CPU share costs on this machine: one model at 50% and 100% of the cores, in turns.

For each share in turn, the agent's own fleet (`TritonFleet`, one instance per core of the share) serves the
model, an open-loop Poisson load runs through it, and the benchmark prints the client p50 / p99 / max and the
CPU the Triton process tree used (its processes' user + system time over the load, in cores). A share's
instances get one math-library thread per core of the share over its instances
(`agents.triton.environment.math_threads_env`): without it, numpy's OpenBLAS threads spin on every core of
the share, which the CPU column shows (188% of a core for mlp_small at 100% and 48 req/s, against 5% at 50%).
`--uncapped` gives every instance a thread per core of the machine, what OpenBLAS took by itself at a 100%
share before the cap, to compare.

    .venv/bin/python benchmarks/bench_cpu_share.py [--model mlp_small] [--rate 48] [--seconds 15]
        [--shares 50,100,50,100] [--uncapped]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agents.batching_check import process_ticks, process_tree  # noqa: E402
from agents.loadgen import LoadGenerator  # noqa: E402
from agents.triton import TritonFleet  # noqa: E402
from agents.triton.environment import MATH_THREAD_VARIABLES  # noqa: E402
from controller.messages import ModelAssignment  # noqa: E402
from stoke.progress import Progress  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mlp_small", help="demo model (default %(default)s)")
    parser.add_argument("--rate", type=float, default=48.0, help="Poisson rate, req/s (default %(default)g)")
    parser.add_argument("--seconds", type=float, default=15.0, help="load per share (default %(default)g)")
    parser.add_argument("--shares", default="50,100,50,100", help="shares in turn, %% (default %(default)s)")
    parser.add_argument(
        "--uncapped", action="store_true", help="a math-library thread per core of the machine in every instance"
    )
    args = parser.parse_args()
    shares = [float(s) for s in args.shares.split(",")]
    cores = len(os.sched_getaffinity(0))
    env = dict.fromkeys(MATH_THREAD_VARIABLES, str(cores)) if args.uncapped else None
    print(
        f"{args.model} at {args.rate:g} req/s (Poisson), {args.seconds:g} s per share, {cores} cores, "
        f"math-library threads {'one per core of the machine (uncapped)' if env else 'capped'}"
    )
    print(f"{'share_%':>7} {'cores':>5} {'p50_ms':>7} {'p99_ms':>7} {'max_ms':>7} {'ok':>5} {'triton_cpu':>10}")
    fleet = TritonFleet(str(ROOT / "triton_repo"), device_kind="cpu", workdir=tempfile.mkdtemp(), env=env)
    try:
        with Progress("bench_cpu_share", len(shares)) as bar:
            for share in shares:
                report = fleet.apply([ModelAssignment("w", args.model, 0, share, 1, 0.0, 100.0, args.rate)])
                if report.errors:
                    raise SystemExit(f"cannot serve {args.model} at {share:g}%: {report.errors[0].message}")
                process = fleet.processes()["w#0"]
                pids = process_tree(int(process["pid"]))
                time.sleep(1.0)
                used, started = sum(map(process_ticks, pids)), time.monotonic()
                with LoadGenerator(lambda: fleet.endpoint("w#0"), args.model) as gen:
                    load = gen.run(args.rate, args.seconds, arrival="poisson")
                used = (sum(map(process_ticks, pids)) - used) / os.sysconf("SC_CLK_TCK") / (time.monotonic() - started)
                print(
                    f"{share:7.1f} {len(process['cpu_cores']):5d} {load.p50_ms:7.2f} {load.p99_ms:7.2f} "
                    f"{load.max_ms:7.1f} {load.ok:5d} {100 * used:9.0f}%",
                    flush=True,
                )
                bar.advance(note=f"{share:g}%")
    finally:
        fleet.close()


if __name__ == "__main__":
    main()
