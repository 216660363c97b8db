"""Shared machinery of the strategies: solo points, latency targets and co-location.

Estimate, then optimise: every strategy builds, per workload and GPU type, a
candidate (batch, minimum share) from the solo model, and then asks
`colocate` whether a set of candidates fits one GPU, raising the share of
each workload that misses its target one step at a time (the published
iGniter rule) until all meet it or the GPU's shares pass 100%.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Sequence

from controller.solver.problem import GpuType, Placement, ProblemError, Workload, batch_queue_delay_ms
import numpy as np

from interference.latency import Prediction, SoloPoint, VectorPredictor, predict_points, share_steps, solo_point

#: Largest batch any strategy considers (the profiled range is 1..32).
MAX_BATCH = 32
EPS = 1e-9


#: Squared CV of service times allowed for in the queueing term (GPU jitter).
SERVICE_CV2 = 0.02
#: Squared CV of request inter-arrival times per arrival kind. Poisson's true
#: value is 1; 1.25 is calibrated with the plan simulator (Kingman's formula is
#: an approximation for batch service; with 1.25, >= 99% of random Poisson mixes
#: keep p99 within SLO, with 1.0 about 97-98%).
ARRIVAL_CV2 = {"poisson": 1.25, "constant": 0.0}


def wait_p99_ms(utilisation: Any, batch: Any, service_ms: Any, arrival_cv2: float = 1.0) -> Any:
    """99th-percentile wait for a busy server (Kingman's G/G/1 mean, exponential tail).

    Batches are the customers: b requests with inter-arrival squared CV ca^2
    (1 for Poisson, 0 for paced clients) arrive with squared CV ca^2/b;
    service has squared CV `SERVICE_CV2`. Mean wait
    E[W] = rho/(1-rho) * (ca^2/b + cs^2)/2 * s. The tail is exponential with
    mass rho at 0+: P(W > t) ~ rho*exp(-rho*t/E[W]) (exact for M/M/1), so
    W99 = E[W]/rho * ln(100 rho). Works on floats and numpy arrays alike.
    """
    rho = np.clip(utilisation, 1e-9, 0.999999)
    mean = rho / (1.0 - rho) * (arrival_cv2 / batch + SERVICE_CV2) / 2.0 * service_ms
    return mean / rho * np.log(np.maximum(100.0 * rho, 1.0))


@dataclass(frozen=True, slots=True)
class Target:
    """What a workload replica must achieve on its GPU, judged from a co-located prediction.

    Plain (iGniter): inference latency t_inf <= `latency_budget_ms` and
    throughput >= rate. Queueing (stoke): t_inf plus the p99 wait behind
    earlier batches (`wait_p99_ms`) <= `latency_budget_ms`, and utilisation
    rate/throughput <= `max_utilisation`.
    """

    latency_budget_ms: float
    rate_rps: float
    batch: int = 1
    queueing: bool = False
    max_utilisation: float = 1.0
    arrival_cv2: float = 1.0

    def met_by(self, prediction: Prediction) -> bool:
        """Scalar twin of `met_by_arrays` (plain floats: numpy on scalars is slow on this hot path)."""
        latency, throughput = prediction.latency_ms, prediction.throughput_rps
        if not self.queueing:
            return latency <= self.latency_budget_ms + EPS and throughput >= self.rate_rps - EPS
        rho = self.rate_rps / throughput
        if rho > self.max_utilisation + EPS:
            return False
        rho = min(max(rho, 1e-9), 0.999999)
        service = 1000.0 * self.batch / throughput
        wait = 1.0 / (1.0 - rho) * (self.arrival_cv2 / self.batch + SERVICE_CV2) / 2.0 * service   # E[W] / rho
        wait *= math.log(max(100.0 * rho, 1.0))
        return latency + wait <= self.latency_budget_ms + EPS

    def met_by_arrays(self, latency_ms: Any, throughput_rps: Any) -> Any:
        """Vectorised check over arrays of predicted latency and throughput."""
        if not self.queueing:
            return (latency_ms <= self.latency_budget_ms + EPS) & (throughput_rps >= self.rate_rps - EPS)
        utilisation = self.rate_rps / throughput_rps
        service_ms = 1000.0 * self.batch / throughput_rps
        total = latency_ms + wait_p99_ms(utilisation, self.batch, service_ms, self.arrival_cv2)
        return (utilisation <= self.max_utilisation + EPS) & (total <= self.latency_budget_ms + EPS)


@dataclass(frozen=True, slots=True)
class Item:
    """A workload replica to place: its batch, minimum share and target on one GPU type."""

    workload: Workload
    rate_rps: float
    batch: int
    min_share: float
    target: Target
    replica: int = 0
    replicas: int = 1

    @property
    def key(self) -> tuple[str, int]:
        return (self.workload.name, self.replica)


class PointCache:
    """Memoised solo points of one GPU type: (model, batch, share) -> SoloPoint."""

    def __init__(self, gpu_type: GpuType):
        self.gpu_type = gpu_type
        self.profile = gpu_type.profile
        self.step = gpu_type.profile.gpu.share_step_pct
        self._points: dict[tuple[str, int, float], SoloPoint] = {}
        self._tables: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self.shares = share_steps(self.profile.gpu)

    def solo_table(self, model: str) -> tuple[np.ndarray, np.ndarray]:
        """Solo latency and throughput of `model`, shape (MAX_BATCH, shares): batch 1.. x share step.."""
        table = self._tables.get(model)
        if table is None:
            self.profile.model(model)  # unknown model -> descriptive error
            predictor = VectorPredictor(self.profile)
            batches, shares = np.meshgrid(np.arange(1, MAX_BATCH + 1, dtype=float), self.shares, indexing="ij")
            index = np.full((batches.size, 1), predictor.index[model], dtype=np.intp)
            latency, throughput = predictor.predict(index, batches.reshape(-1, 1), shares.reshape(-1, 1),
                                                    np.ones((batches.size, 1), dtype=bool))
            table = self._tables[model] = (latency.reshape(batches.shape), throughput.reshape(batches.shape))
        return table

    def point(self, model: str, batch: int, share: float) -> SoloPoint:
        key = (model, batch, share)
        found = self._points.get(key)
        if found is None:
            found = self._points[key] = solo_point(self.profile, model, batch, share)
        return found

    def predict(self, items: Sequence[Item], shares: Sequence[float]) -> list[Prediction]:
        return predict_points(self.profile.gpu, [self.point(i.workload.model, i.batch, s)
                                                 for i, s in zip(items, shares)])

    def round_up(self, share: float) -> float:
        """Round a share up to the GPU's step, at least one step."""
        steps = max(1, math.ceil(share / self.step - 1e-9))
        return round(steps * self.step, 6)


def colocate(cache: PointCache, items: Sequence[Item], shares: Sequence[float] | None = None,
             max_added: float = math.inf) -> tuple[list[float], list[Prediction]] | None:
    """Shares (from `shares`, default each item's minimum) at which every target is met.

    iGniter's greedy rule, not a global minimum: each round predicts the GPU
    and adds one share step to every workload that misses its target. Returns (shares, predictions), or None when the
    shares would pass 100% or more than `max_added` would be added.
    """
    current = [i.min_share for i in items] if shares is None else list(shares)
    start = sum(current)
    step = cache.step
    while True:
        total = sum(current)
        if total > 100.0 + EPS or total - start > max_added + EPS:
            return None
        predictions = cache.predict(items, current)
        missing = [k for k, (item, p) in enumerate(zip(items, predictions)) if not item.target.met_by(p)]
        if not missing:
            return current, predictions
        for k in missing:
            if current[k] + step > 100.0 + EPS:
                return None
            current[k] = round(current[k] + step, 6)


def min_share_solo(cache: PointCache, model: str, batch: int, target: Target) -> float | None:
    """Smallest share (on the step grid) at which `model` meets `target` alone on a GPU."""
    latency, throughput = cache.solo_table(model)
    ok = np.asarray(target.met_by_arrays(latency[batch - 1], throughput[batch - 1]))
    if not ok.any():
        return None
    return float(cache.shares[int(np.argmax(ok))])


def smallest_latency_ms(cache: PointCache, model: str) -> float:
    """Smallest latency the model reaches alone on a whole GPU (batch 1, 100%)."""
    return float(cache.solo_table(model)[0][0, -1])


def reject(workload: Workload, cache: PointCache, budget_ms: float, rule: str) -> ProblemError:
    return ProblemError(
        f"workload {workload.name!r} cannot meet its SLO of {workload.slo_ms:g} ms even alone on a whole "
        f"{cache.gpu_type.name}: model {workload.model!r} needs at least "
        f"{smallest_latency_ms(cache, workload.model):.2f} ms per inference (batch 1, 100%) but {rule} leaves "
        f"{budget_ms:.2f} ms; relax the SLO or use a faster GPU type")


def to_placement(item: Item, share: float, prediction: Prediction) -> Placement:
    return Placement(
        name=item.workload.name, model=item.workload.model, slo_ms=item.workload.slo_ms,
        rate_rps=item.rate_rps, share_pct=share, batch=item.batch,
        queue_delay_ms=batch_queue_delay_ms(item.batch, item.rate_rps),
        predicted_latency_ms=prediction.latency_ms, predicted_throughput_rps=prediction.throughput_rps,
        replica=item.replica, replicas=item.replicas, arrivals=item.workload.arrivals)


def with_replicas(items: list[Item]) -> list[Item]:
    """Number replicas of each workload 0..n-1 and record n."""
    counts: dict[str, int] = {}
    for item in items:
        counts[item.workload.name] = counts.get(item.workload.name, 0) + 1
    seen: dict[str, int] = {}
    out = []
    for item in items:
        k = seen.get(item.workload.name, 0)
        seen[item.workload.name] = k + 1
        out.append(replace(item, replica=k, replicas=counts[item.workload.name]))
    return out


def allowed_types(workload: Workload, inventory: Sequence[GpuType]) -> list[GpuType]:
    return [g for g in inventory
            if workload.gpu_type in (None, g.name) and workload.model in g.profile.models]

