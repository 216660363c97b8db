"""Seeded random workload mixes for property tests and benchmarks (pure)."""

from __future__ import annotations

import numpy as np

from planner.solver.problem import Workload

#: SLO ranges (ms) per model, in the spirit of iGniter's evaluation mixes.
SLO_RANGES_MS = {"alexnet": (10.0, 25.0), "resnet50": (25.0, 60.0), "vgg19": (40.0, 100.0), "ssd": (60.0, 140.0)}
#: Rate ranges (req/s) per model: most services need a fraction of a V100 (where
#: co-location matters), the top of each range a whole one or more.
RATE_RANGES_RPS = {"alexnet": (100.0, 2500.0), "resnet50": (50.0, 900.0), "vgg19": (20.0, 400.0), "ssd": (10.0, 250.0)}


def random_workloads(
    count: int, seed: int, models: tuple[str, ...] = tuple(SLO_RANGES_MS), arrivals: str = "poisson"
) -> tuple[Workload, ...]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        model = models[int(rng.integers(len(models)))]
        low, high = SLO_RANGES_MS.get(model, (20.0, 100.0))
        out.append(
            Workload(
                name=f"w{i:04d}-{model}",
                model=model,
                slo_ms=round(float(rng.uniform(low, high)), 1),
                rate_rps=round(float(rng.uniform(*RATE_RANGES_RPS.get(model, (10.0, 500.0)))), 1),
                arrivals=arrivals,
            )
        )
    return tuple(out)


#: The fleet-scale mix of issue 16: four models, SLOs 20-80 ms and 50-400 req/s for every model.
FLEET_MODELS = ("alexnet", "resnet50", "vgg19", "ssd")
FLEET_SLO_MS = (20.0, 80.0)
FLEET_RATE_RPS = (50.0, 400.0)


def fleet_workloads(count: int, seed: int = 16) -> tuple[Workload, ...]:
    """`count` workloads of the fleet-scale mix; a smaller count gives a prefix of a larger one (the
    same draws row by row), so sizes compare like with like."""
    draws = np.random.default_rng(seed).random((count, 3))  # rows fill in order: prefix-stable
    width = max(4, len(str(count - 1)))
    out = []
    for i, (pick, slo, rate) in enumerate(draws):
        model = FLEET_MODELS[min(int(pick * len(FLEET_MODELS)), len(FLEET_MODELS) - 1)]
        out.append(
            Workload(
                name=f"f{i:0{width}d}-{model}",
                model=model,
                slo_ms=round(FLEET_SLO_MS[0] + float(slo) * (FLEET_SLO_MS[1] - FLEET_SLO_MS[0]), 1),
                rate_rps=round(FLEET_RATE_RPS[0] + float(rate) * (FLEET_RATE_RPS[1] - FLEET_RATE_RPS[0]), 1),
            )
        )
    return tuple(out)
