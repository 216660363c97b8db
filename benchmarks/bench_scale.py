"""Planning at fleet scale (issue 16): prints figures (no pass/fail), side by side in one run.

1. The scale table: `stoke plan` of the fleet mix (`planner.solver.random_mix.fleet_workloads`:
   four models, SLOs 20-80 ms, 50-400 req/s, Poisson; a smaller size is a prefix of a larger one)
   at 1k, 2k, 4k and 10k workloads (100k with --with-100k), each a fresh `stoke plan FILE --json`
   process: workloads, GPUs, GPUs per workload, the plan's gap to its own lower bound, wall time
   of the whole command (read, check, plan, print) and its ratio to the first size's, its CPU
   time (what a busy machine does not inflate) and its peak RSS.
2. Re-planning in the controller: the reconcile planning step (the workloads read from the controller's
   store, then `plan_observed`: solve, bind) with 10,000 workloads placed on 2-GPU nodes, then one
   workload's rate changed, several times: time of each re-plan and the assignments it moved. Twice:
   with the solver in its worker process (the controller's default, the pipe sending only what
   changed) and in this process (`solver_budget_s: 0`).
3. CLI start-up: `stoke --help`, `stoke status` against nothing and `stoke plan` of the bundled
   example (median of 5 runs each), and reading + checking a 10,000-workload file.

    .venv/bin/python benchmarks/bench_scale.py [--sizes 1000,2000,4000,10000] [--with-100k] [--skip-cli]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from planner.solver.random_mix import fleet_workloads  # noqa: E402


def write_workloads(path: Path, count: int) -> None:
    with path.open("w") as f:
        f.write("workloads:\n")
        for w in fleet_workloads(count):
            f.write(f"  - {{name: {w.name}, model: {w.model}, slo_ms: {w.slo_ms:g}, rate_rps: {w.rate_rps:g}}}\n")


def timed_process(argv: list[str], stdout: Path | None = None) -> tuple[float, float, int, float]:
    """(wall seconds, peak RSS in MiB, exit code, CPU seconds) of one process."""
    started = time.perf_counter()
    out = stdout.open("wb") if stdout else subprocess.DEVNULL
    try:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.DEVNULL, cwd=ROOT)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    finally:
        if stdout:
            out.close()  # type: ignore[union-attr]
    return time.perf_counter() - started, usage.ru_maxrss / 1024, proc.returncode, usage.ru_utime + usage.ru_stime


def scale_table(sizes: list[int], tmp: Path) -> None:
    print("\nScale: `stoke plan FILE --json` of the fleet mix, one process per size")
    print(
        f"{'workloads':>9} {'GPUs':>7} {'GPUs/wl':>8} {'vs 1k':>6} {'bound':>7} {'gap':>6} "
        f"{'wall s':>7} {'x 1k':>5} {'CPU s':>6} {'RSS MiB':>8}"
    )
    first: tuple[float, float] | None = None
    for size in sizes:
        source, output = tmp / f"fleet-{size}.yaml", tmp / f"plan-{size}.json"
        write_workloads(source, size)
        wall, rss, code, cpu = timed_process([sys.executable, "-m", "stoke", "plan", str(source), "--json"], output)
        if code != 0:
            print(f"{size:9,d} failed with exit code {code}")
            continue
        plan = json.loads(output.read_text())
        gpus = plan["gpu_count"]
        note = next((n for n in plan["notes"] if n.startswith("lower bound")), "")
        bound = int(note.split()[2]) if note else 0
        per = gpus / size
        if first is None:
            first = (per, wall)
        print(
            f"{size:9,d} {gpus:7,d} {per:8.3f} {per / first[0] - 1:+6.1%} {bound:7,d} "
            f"{(gpus / bound - 1) if bound else float('nan'):+6.1%} {wall:7.1f} {wall / first[1]:5.1f} "
            f"{cpu:6.1f} {rss:8.0f}",
            flush=True,
        )


def replan(workloads: int, changes: int = 5) -> None:
    """The controller's planning step at `workloads`, then `changes` one-rate changes: through the solver
    worker process (the controller's default, `solver_budget_s` 30) and in this process (`solver_budget_s: 0`)."""
    from controller.config import ServiceConfig
    from controller.reconcile.budget import budgeted, close_worker
    from controller.reconcile.planning import Observed, plan_observed
    from controller.reconcile.slots import Binding
    from controller.store import Store
    from planner.solver import solve
    from planner.workload_file import default_gpu_types

    profile = default_gpu_types()[0].profile
    nodes = workloads // 3  # 2 GPUs each: room to spare
    slots = tuple(Binding(f"node-{n:05d}", d, "V100") for n in range(nodes) for d in (0, 1))
    print(
        f"\nRe-planning in the controller (its planning step: read the store, solve, bind): {workloads:,} workloads "
        f"on {nodes:,} nodes x 2 V100"
    )
    for label, config in (
        ("solver worker (the default)", ServiceConfig()),
        ("in process (solver_budget_s: 0)", replace(ServiceConfig(), solver_budget_s=0.0)),
    ):
        mix = list(fleet_workloads(workloads))
        solver = budgeted(solve, config.solver_budget_s, config.solver_memory_mib)  # what the controller runs
        # the workloads live in the controller's store, read back at every pass as `observe` does
        folder = tempfile.TemporaryDirectory(prefix="bench-replan-")
        store = Store(Path(folder.name) / "controller.db")
        store.upsert_workloads(mix, 0.0)

        def run_solver(problem, current, solver=solver, config=config):
            return solver(problem, config.strategy, current=current)

        def cells(view):
            return {
                (p.name, p.replica): (b.node_id, b.device, p.share_pct, p.batch) if b else None
                for g, b in zip(view.plan.gpus, view.bindings)
                for p in g.placements
            }

        def observed(applied, store=store):
            return Observed(store.workload_rows()[0], {"V100": profile}, 1, slots, applied)

        started = time.perf_counter()
        view = replace(plan_observed(observed(None), config, run_solver, 0.0), revision=1)
        print(
            f"  {label}: first plan {len(view.plan.gpus):,} GPUs, {len(view.pending)} pending, "
            f"{time.perf_counter() - started:.1f} s"
        )
        started = time.perf_counter()
        view = replace(plan_observed(observed(view), config, run_solver, 0.0), revision=2)
        print(f"    the same inputs again: {(time.perf_counter() - started) * 1000:.0f} ms")
        took_ms = []
        for step in range(changes):
            k = (step * 1931 + 17) % len(mix)
            mix[k] = replace(mix[k], rate_rps=round(mix[k].rate_rps * (1.6 if step % 2 == 0 else 0.6), 1))
            store.upsert_workloads([mix[k]], float(step))  # the apply; the re-plan reads it back
            started, cpu = time.perf_counter(), time.process_time()
            new = replace(plan_observed(observed(view), config, run_solver, 0.0), revision=3 + step)
            took, cpu = time.perf_counter() - started, time.process_time() - cpu
            took_ms.append(took * 1000)
            before, after = cells(view), cells(new)
            moved = sum(1 for key in set(before) | set(after) if before.get(key) != after.get(key))
            print(
                f"    {mix[k].name} to {mix[k].rate_rps:g} req/s: re-planned in {took * 1000:.0f} ms "
                f"({cpu * 1000:.0f} ms CPU in this process), {moved} of {len(after):,} assignments moved "
                f"({moved / len(after):.2%}), GPUs {len(view.plan.gpus):,} -> {len(new.plan.gpus):,}"
            )
            view = new
        print(f"    median re-plan {statistics.median(took_ms):.0f} ms, max {max(took_ms):.0f} ms")
        close_worker()
        store.close()
        folder.cleanup()


def cli_startup(tmp: Path) -> None:
    print("\nCLI start-up (median of 5 whole processes)")
    env_status = ["--controller", "127.0.0.1:9"]
    for label, args in (
        ("stoke --help", ["--help"]),
        ("stoke status (nothing there)", ["status", *env_status]),
        ("stoke plan (example)", ["plan"]),
    ):
        runs = sorted(timed_process([sys.executable, "-m", "stoke", *args])[0] for _ in range(5))
        print(f"  {label:30} {statistics.median(runs):.2f} s")
    source = tmp / "fleet-10000.yaml"
    if not source.exists():
        write_workloads(source, 10_000)
    probe = (
        "import sys, time; t = time.perf_counter(); from planner.workload_file import load_workloads_file; "
        "n = len(load_workloads_file(sys.argv[1]).problem().workloads); print(n, time.perf_counter() - t)"
    )
    done = subprocess.run([sys.executable, "-c", probe, str(source)], capture_output=True, text=True, cwd=ROOT)
    count, seconds = done.stdout.split()
    print(f"  read + check {int(count):,} workloads from YAML: {float(seconds):.2f} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000,2000,4000,10000", help="workload counts (the first is the base)")
    parser.add_argument("--with-100k", action="store_true", help="also 100,000 workloads (a minute or more)")
    parser.add_argument("--replan-workloads", type=int, default=10_000, help="workloads placed before re-planning")
    parser.add_argument("--skip-cli", action="store_true")
    parser.add_argument("--skip-replan", action="store_true")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")] + ([100_000] if args.with_100k else [])
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as d:
        tmp = Path(d)
        scale_table(sizes, tmp)
        if not args.skip_replan:
            replan(args.replan_workloads)
        if not args.skip_cli:
            cli_startup(tmp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
