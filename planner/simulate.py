"""Discrete-event simulator that replays a plan without a GPU.

Each placement (a workload replica with its own share, hence its own Triton
instance) is a single server with Triton-style dynamic batching:

- requests arrive at the replica's rate, Poisson or constant: each
  workload's own kind from the plan, unless `arrivals` overrides all;
- when the server is free and requests wait, it starts a batch as soon as
  `batch` requests are queued or the oldest has waited the plan's queue
  delay, whichever comes first, taking at most `batch` requests;
- a batch of k requests completes after t_inf(k) and frees the server after
  t_gpu(k) + t_feedback(k) (input loading overlaps the previous batch),
  both from the co-located prediction with neighbours at their planned
  batch, times an optional log-normal noise factor (median 1).

The server itself is `interference.batching.serve`, the same rules the
batching model's table was simulated with.

Seeded with numpy's PCG64: the same plan, profiles and seed give the same
report. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from interference.batching import ServiceCurve, serve
from interference.latency import batch_curve, solo_point
from interference.profile import DeviceProfile
from planner.solver.problem import Placement, Plan


@dataclass(frozen=True)
class WorkloadReport:
    name: str
    slo_ms: float
    offered_rps: float
    throughput_rps: float
    p50_ms: float
    p99_ms: float
    over_slo: float  # fraction of requests slower than the SLO
    requests: int

    @property
    def meets_slo(self) -> bool:
        return self.p99_ms <= self.slo_ms

    @property
    def p99_slo_ratio(self) -> float:
        return self.p99_ms / self.slo_ms


@dataclass(frozen=True)
class SimulationReport:
    seconds: float
    seed: int
    workloads: tuple[WorkloadReport, ...]

    @property
    def attainment(self) -> float:
        """Fraction of workloads whose simulated p99 latency is within the SLO."""
        if not self.workloads:
            return 1.0
        return sum(w.meets_slo for w in self.workloads) / len(self.workloads)

    def slack_quantiles(self, probs: tuple[float, ...] = (0.1, 0.5, 0.9)) -> tuple[float, ...]:
        """Quantiles of simulated p99/SLO across workloads: a plan padded to 0.5 is as wrong as one at 1.2."""
        ratios = [w.p99_slo_ratio for w in self.workloads if w.requests]
        if not ratios:
            return tuple(float("nan") for _ in probs)
        return tuple(float(np.quantile(ratios, p)) for p in probs)


def service_curve(profile: DeviceProfile, placements: tuple[Placement, ...], index: int) -> ServiceCurve:
    """L(k) and O(k) of placement `index` for k = 1..batch, co-located with its neighbours at their
    planned batch and share."""
    me = placements[index]
    others = [solo_point(profile, p.model, p.batch, p.share_pct) for k, p in enumerate(placements) if k != index]
    return ServiceCurve(*batch_curve(profile, me.model, me.share_pct, me.batch, others))


def _arrivals(rng: np.random.Generator, rate_rps: float, seconds: float, poisson: bool) -> NDArray[Any]:
    rate_per_ms = rate_rps / 1000.0
    horizon = seconds * 1000.0
    if not poisson:
        return np.arange(0.0, horizon, 1.0 / rate_per_ms)
    expected = int(rate_per_ms * horizon)
    gaps = rng.exponential(1.0 / rate_per_ms, size=expected + 6 * int(np.sqrt(expected + 1)) + 16)
    times: NDArray[Any] = np.cumsum(gaps)
    return times[times < horizon]


def simulate(
    plan: Plan,
    profiles: Mapping[str, DeviceProfile],
    *,
    seconds: float = 30.0,
    seed: int = 0,
    arrivals: str | None = None,
    noise: float = 0.0,
    min_requests: int = 0,
) -> SimulationReport:
    """Replay `plan` for `seconds` and report per workload (replicas merged).

    `arrivals` ("poisson" or "constant") overrides every placement's own kind.
    `min_requests`: a replica whose rate gives fewer requests in `seconds` runs longer,
    so that a slow workload's p99 is measured rather than guessed from a few dozen samples
    (the p99 of 400 requests is their 4th slowest).
    """
    if arrivals not in (None, "poisson", "constant"):
        raise ValueError(f"arrivals must be 'poisson' or 'constant', got {arrivals!r}")
    rng = np.random.default_rng(seed)
    per_workload: dict[str, list[NDArray[Any]]] = {}
    meta: dict[str, Placement] = {}
    offered: dict[str, float] = {}
    served_rps: dict[str, float] = {}
    for gpu in plan.gpus:
        if gpu.gpu_type not in profiles:
            raise ValueError(f"no profile for GPU type {gpu.gpu_type!r}; give one with --profile")
        for index, placement in enumerate(gpu.placements):
            curve = service_curve(profiles[gpu.gpu_type], gpu.placements, index)
            kind = arrivals or placement.arrivals
            horizon = max(seconds, min_requests / placement.rate_rps)
            times = _arrivals(rng, placement.rate_rps, horizon, kind == "poisson")
            factor = (lambda: float(rng.lognormal(0.0, noise))) if noise > 0 else None
            latencies, _ = serve(
                times,
                placement.batch,
                placement.queue_delay_ms,
                np.concatenate([[0.0], curve.latency_ms]),
                np.concatenate([[0.0], curve.occupancy_ms]),
                factor,
            )
            per_workload.setdefault(placement.name, []).append(latencies)
            done = int(np.sum(times + latencies <= horizon * 1000.0))
            served_rps[placement.name] = served_rps.get(placement.name, 0.0) + done / horizon
            meta.setdefault(placement.name, placement)
            offered[placement.name] = offered.get(placement.name, 0.0) + placement.rate_rps
    reports = []
    for name in sorted(per_workload):
        latencies = np.concatenate(per_workload[name])
        slo = meta[name].slo_ms
        if latencies.size == 0:
            reports.append(WorkloadReport(name, slo, offered[name], 0.0, 0.0, 0.0, 0.0, 0))
            continue
        reports.append(
            WorkloadReport(
                name=name,
                slo_ms=slo,
                offered_rps=offered[name],
                throughput_rps=served_rps[name],
                p50_ms=float(np.percentile(latencies, 50)),
                p99_ms=float(np.percentile(latencies, 99)),
                over_slo=float(np.mean(latencies > slo)),
                requests=int(latencies.size),
            )
        )
    return SimulationReport(seconds=seconds, seed=seed, workloads=tuple(reports))
