"""Plans replayed on a truth that is not the fit (issue 15): SLOs kept per replica, utilisation, GPUs.

    .venv/bin/python benchmarks/bench_truth.py [--sizes 100,300,1000] [--arrivals poisson,constant]
        [--variants default,blunt] [--requests 50000] [--truth perturbed|measured|steps|bumps|fit]

The planner plans with the fitted V100 profile; every replica of its plan is then replayed by the
discrete-event server (`interference.batching.serve`, the plan simulator's) on `interference.truth`:
the same profile with the measurements' residuals put back, steps between batch sizes, +-5% bumps and
a different curve below the measured shares. Each replica runs for `--requests` requests of its own
arrival kind. Columns: GPUs, replicas, replicas whose replayed p99 <= SLO, workloads (all replicas)
within SLO, the highest true utilisation rate x O(B)/B and replicas over 1, and, where the plan
carries `p99_upper_ms`, replicas whose replayed p99 <= it.

Variants: `today` (stoke before issue 15: the central fit trusted everywhere, 5% p99 margin, 0.98
paced cap), `blunt` (today with --safety-margin 0.10 --max-utilisation 0.85, the wide-margin baseline
of issue 15), `error-aware` (stoke's defaults: the profile's domain and error bound) and `verified`
(error-aware, then `planner.solver.verify` measures the chosen points on the truth, the simulated
device: every batch size 1..B of a Poisson replica, B of a paced one, and their neighbours, one and
two share steps lower and the batch one larger (`--neighbours`), and re-plans until the plan and
its neighbours are measured; rounds and points are printed). `--variants oracle` is a reference, not a
planner: the error-aware planner given the truth as measured at every point (what verification would
find if it measured everything), the floor of a verified plan. `--variants blunt-tuned` is another
reference: the cheapest blunt margin on a grid (safety margin x utilisation cap, `BLUNT_MARGINS` x
`BLUNT_CAPS`) whose plan replays within issue 15's figures on this truth (>= 99.5% of replicas within
SLO, none over utilisation 1), tuned with a hindsight no operator has: what a blunt margin must cost
to hold as the verified plan holds.
Mixes as in bench_core: 100 and 1000 random workloads (seed 2026),
300 = issue 8's mix.
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import replace

import numpy as np

from interference.batching import serve
from interference.profile import DeviceProfile
from interference.profile_io import bundled_raw_path, read_raw
from interference.truth import measure_on, truth_profile
from planner.simulate import _arrivals, service_curve
from planner.solver import Plan, Problem, solve
from planner.solver.stoke import CENTRAL_OPTIONS, DEFAULT_OPTIONS
from planner.solver.verify import verify
from planner.workload_file import default_gpu_types
from stoke.progress import Progress

try:  # the mixes of bench_core (run from the repository root)
    from benchmarks.bench_core import mix
except ImportError:  # run as a script: benchmarks/ is on sys.path
    from bench_core import mix  # type: ignore[no-redef]

VARIANTS = {
    "today": CENTRAL_OPTIONS,
    "blunt": replace(CENTRAL_OPTIONS, safety_margin=0.10, max_utilisation=0.85),
    "error-aware": DEFAULT_OPTIONS,
    "verified": DEFAULT_OPTIONS,  # error-aware, then `verify` on the simulated device (the truth)
    "oracle": DEFAULT_OPTIONS,  # a reference, not a planner: every point of the truth given as measured
    "blunt-tuned": CENTRAL_OPTIONS,  # a reference: the cheapest blunt margin that holds on the truth (`blunt_tuned`)
}
DEFAULT_VARIANTS = ("today", "blunt", "error-aware", "verified")
#: `--truth`: which parts of `interference.truth` the replay (and verification's simulated device) uses.
TRUTHS: dict[str, dict[str, bool] | None] = {
    "perturbed": {},
    "measured": {"steps": False, "bumps": False},
    "steps": {"bumps": False},
    "bumps": {"steps": False},
    "fit": None,
}


def oracle_types(types: tuple, truth: dict) -> tuple:
    """`types` with the truth measured at every (batch 1..32, share step) of every model, as verification
    would find it if it measured everything (at `MEASURED_ERROR`): what the error-aware planner needs
    when nothing is left to verify, the floor of a verified plan."""
    out = []
    for gpu in types:
        if gpu.name not in truth:
            out.append(gpu)
            continue
        profile, step = gpu.profile, gpu.profile.gpu.share_step_pct
        models = {
            name: m.with_measured(
                {
                    (b, round(step * j, 6)): truth[gpu.name].model(name).active_time_ms(b, step * j)
                    for b in range(1, 33)
                    for j in range(1, int(round(100.0 / step)) + 1)
                }
            )
            for name, m in profile.models.items()
        }
        out.append(replace(gpu, profile=DeviceProfile(profile.gpu, models)))
    return tuple(out)


#: The grid `blunt-tuned` searches: today's options with a wider safety margin and a lower utilisation cap
#: (Poisson: `max_utilisation`; paced: `max_paced_utilisation`).
BLUNT_MARGINS = (0.05, 0.10, 0.15, 0.20, 0.25, 0.30, 0.35, 0.40, 0.50)
BLUNT_CAPS = {"poisson": (0.95, 0.85, 0.80, 0.75, 0.70, 0.65), "constant": (0.98, 0.95, 0.90, 0.85, 0.80, 0.70)}
#: The replay `blunt_tuned` chooses on: not the one the table reports (seed 1), so that a pair picked on lucky
#: noise shows it.
SELECT_SEED = 2
#: What a tuned blunt plan must reach on the replay (issue 15's acceptance).
HOLDS_WITHIN_SLO = 0.995


def holds(replicas: list[dict]) -> bool:
    """Issue 15's replay figures: >= 99.5% of replicas within SLO and none over utilisation 1."""
    within = np.mean([r["p99_ms"] <= r["slo_ms"] for r in replicas]) if replicas else 1.0
    return bool(within >= HOLDS_WITHIN_SLO and all(r["utilisation"] <= 1.0 for r in replicas))


def blunt_tuned(workloads: list, types: tuple, arrivals: str, truth: dict, requests: int) -> tuple[Plan, str]:
    """The cheapest plan of today's planner over the `BLUNT_MARGINS` x `BLUNT_CAPS` grid that `holds` on the
    truth (replayed in order of GPUs, cheapest first, on the `SELECT_SEED` arrivals), and the margin that made
    it; the dearest one if none holds."""
    plans = []
    for margin in BLUNT_MARGINS:
        for cap in BLUNT_CAPS[arrivals]:
            cap_field = "max_paced_utilisation" if arrivals == "constant" else "max_utilisation"
            options = replace(CENTRAL_OPTIONS, safety_margin=margin, **{cap_field: cap})
            plans.append((solve(Problem(workloads, types), "stoke", options=options), margin, cap))
    plans.sort(key=lambda p: (p[0].gpu_count, p[1], -p[2]))
    for plan, margin, cap in plans:  # chosen on another replay (seed) than the one `main` reports
        if holds(replay(plan, truth, requests, seed=SELECT_SEED)):
            return plan, f"safety margin {margin:.2f}, utilisation cap {cap:.2f}"
    plan, margin, cap = plans[-1]
    return plan, f"none of the grid holds; the dearest: safety margin {margin:.2f}, utilisation cap {cap:.2f}"


def _serve_kernel(arrivals, batch, delay, latency, occupancy, out):  # pragma: no cover - numba
    """`interference.batching.serve` as a plain loop (same rules), so numba can compile it."""
    n = len(arrivals)
    i, free_at = 0, 0.0
    while i < n:
        full_at = arrivals[i + batch - 1] if i + batch - 1 < n else np.inf
        start = max(free_at, arrivals[i], min(full_at, arrivals[i] + delay + 1e-9))
        if start >= full_at:
            k = batch
        else:
            k = 1
            while k < batch and i + k < n and arrivals[i + k] <= start:
                k += 1
        for j in range(i, i + k):
            out[j] = start + latency[k] - arrivals[j]
        free_at = start + occupancy[k]
        i += k


def _compiled_serve():
    """numba's compiled kernel when installed (`pip install -e '.[table]'`, ~100x faster), else `serve`."""
    try:
        from numba import njit
    except ImportError:
        return None
    return njit(cache=False)(_serve_kernel)


_SERVE = _compiled_serve()


def serve_fast(times, batch, delay, latency, occupancy):
    if _SERVE is None:
        return serve(times, batch, delay, latency, occupancy)[0]
    out = np.empty(len(times))
    _SERVE(times, batch, float(delay), latency, occupancy, out)
    return out


def replay(plan: Plan, truth: dict, requests: int, seed: int = 1) -> list[dict]:
    """Per replica: replayed p99, SLO, true utilisation and the plan's own p99 figures."""
    rng = np.random.default_rng(seed)
    out = []
    for gpu in plan.gpus:
        for index, p in enumerate(gpu.placements):
            curve = service_curve(truth[gpu.gpu_type], gpu.placements, index)
            seconds = requests / p.rate_rps
            times = _arrivals(rng, p.rate_rps, seconds, p.arrivals == "poisson")
            latencies = serve_fast(
                times,
                p.batch,
                p.queue_delay_ms,
                np.concatenate([[0.0], curve.latency_ms]),
                np.concatenate([[0.0], curve.occupancy_ms]),
            )
            warm = latencies[len(latencies) // 20 :]  # drop the first 5%: the queue starts empty
            out.append(
                {
                    "name": p.name,
                    "slo_ms": p.slo_ms,
                    "p99_ms": float(np.quantile(warm, 0.99)),
                    "utilisation": p.rate_rps * curve.occupancy_ms[-1] / (1000.0 * p.batch),
                    "predicted_p99_ms": p.predicted_p99_ms,
                    "p99_upper_ms": getattr(p, "p99_upper_ms", math.nan),
                }
            )
    return out


def row(size: int, arrivals: str, variant: str, plan: Plan, solve_s: float, replicas: list[dict]) -> str:
    ok = [r["p99_ms"] <= r["slo_ms"] for r in replicas]
    by_workload: dict[str, bool] = {}
    for r, good in zip(replicas, ok):
        by_workload[r["name"]] = by_workload.get(r["name"], True) and good
    util = np.array([r["utilisation"] for r in replicas])
    uppers = [(r["p99_ms"], r["p99_upper_ms"]) for r in replicas if math.isfinite(r["p99_upper_ms"])]
    under = f"{100 * np.mean([p <= u for p, u in uppers]):6.1f}%" if uppers else "     -"
    worst = max(r["p99_ms"] / r["slo_ms"] for r in replicas)
    return (
        f"{size:5d} {arrivals:8} {variant:12} {plan.gpu_count:5d} {len(replicas):6d} "
        f"{100 * np.mean(ok):8.2f}% {100 * np.mean(list(by_workload.values())):8.2f}% "
        f"{util.max():6.3f} {int(np.sum(util > 1.0)):4d} {under} {worst:9.2f} {solve_s:7.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100,300,1000")
    parser.add_argument("--arrivals", default="poisson,constant")
    parser.add_argument(
        "--variants",
        default=",".join(DEFAULT_VARIANTS),
        help=f"comma-separated, of {', '.join(VARIANTS)} (default %(default)s; oracle: the truth given to the "
        "planner as measured everywhere, the floor of a verified plan; blunt-tuned: the cheapest wider margin "
        "that holds on the truth, found by replaying a grid of them)",
    )
    parser.add_argument("--requests", type=int, default=200_000, help="requests replayed per replica (default 200,000)")
    parser.add_argument(
        "--truth",
        choices=tuple(TRUTHS),
        default="perturbed",
        help="what plans replay on: the perturbed truth (default); 'measured', its measurements and the curve "
        "below the measured shares without the synthetic steps and bumps (issue 15's own replay); 'steps' or "
        "'bumps', measured plus that one part; 'fit', the fit itself (the replay's own noise floor)",
    )
    args = parser.parse_args()
    types = default_gpu_types()
    fitted = types[0].profile
    parts = TRUTHS[args.truth]
    truth = {types[0].name: fitted if parts is None else truth_profile(fitted, read_raw(bundled_raw_path()), **parts)}
    sizes = [int(s) for s in args.sizes.split(",")]
    kinds = args.arrivals.split(",")
    variants = args.variants.split(",")
    print(f"Plans replayed on the {args.truth} truth, {args.requests:,} requests per replica:")
    print(
        f"{'mix':>5} {'arrivals':8} {'variant':12} {'gpus':>5} {'repl.':>6} {'repl.ok':>9} {'wl.ok':>9} "
        f"{'u.max':>6} {'u>1':>4} {'<=upper':>7} {'worst p99/SLO':>9} {'solve_s':>7}"
    )
    notes: list[str] = []
    with Progress("bench_truth", len(sizes) * len(kinds) * len(variants)) as bar:
        for arrivals in kinds:
            for size in sizes:
                workloads = mix(size, arrivals)
                for variant in variants:
                    started = time.perf_counter()
                    if variant == "verified":
                        checked = verify(Problem(workloads, types), measure_on(truth), neighbours=True)
                        plan = checked.plan
                        rounds = ", ".join(f"{r.measured} pts -> {r.gpus_after} GPUs" for r in checked.rounds)
                        notes.append(
                            f"{size} {arrivals}: verified in {len(checked.rounds)} round(s), {checked.points} points "
                            f"measured ({rounds}); holds on measured points: {checked.holds}"
                        )
                    elif variant == "blunt-tuned":
                        plan, margin = blunt_tuned(workloads, types, arrivals, truth, args.requests)
                        notes.append(f"{size} {arrivals}: blunt-tuned is {margin} ({plan.gpu_count} GPUs)")
                    elif variant == "oracle":
                        plan = solve(Problem(workloads, oracle_types(types, truth)), "stoke", options=DEFAULT_OPTIONS)
                    else:
                        plan = solve(Problem(workloads, types), "stoke", options=VARIANTS[variant])
                    solve_s = time.perf_counter() - started
                    replicas = replay(plan, truth, args.requests)
                    print(row(size, arrivals, variant, plan, solve_s, replicas), flush=True)
                    bar.advance(note=f"{arrivals} {size} {variant}")
    for note in notes:
        print(note)


if __name__ == "__main__":
    main()
