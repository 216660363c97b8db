"""Training provisioning problem and plan types: plain frozen data, no I/O.

`spec_from_dict` turns the parsed SPEC.yaml (plus an instance catalog) into a
`TrainingSpec`; `training_plan_to_dict` / `training_plan_from_dict` convert a `TrainingPlan` to
and from its JSON shape (the `stoke train plan --json` output, the input of
`stoke train launch`). Errors name the field and the fix.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from foundation import validate as check
from training.models import LossCurve, PsJob, SpotJob, SpotLoss, TrainingError

PLAN_FORMAT_VERSION = 1


@dataclass(frozen=True)
class InstanceType:
    """One cloud instance type of the catalog (prices in $/hour, network in MB/s)."""

    name: str
    gpus: int
    vcpus: int
    gpu_memory_gb: float
    network_mb_s: float
    on_demand_per_hour: float
    spot_per_hour: float


@dataclass(frozen=True)
class Catalog:
    """Instance types with prices, and where the prices come from."""

    types: Mapping[str, InstanceType]
    source: str = "offline"  # "offline" or "live"
    prices_as_of: str = ""  # ISO-8601 timestamp of the prices
    region: str = "us-east-1"

    def get(self, name: str, where: str = "spec") -> InstanceType:
        if name not in self.types:
            raise TrainingError(
                f"{where}: instance type {name!r} is not in the catalog; "
                f"use one of {', '.join(sorted(self.types))} or add it to the catalog"
            )
        return self.types[name]


@dataclass(frozen=True)
class WorkerOption:
    """A worker instance type the job may use, with its profiled figures for this job."""

    type: str
    quota: int
    speed: float  # profiled samples/s of one worker (alone, one PS)
    batch: int  # samples per iteration of one worker (per-GPU batch x GPUs)
    gpus: int
    network_mb_s: float
    price_per_hour: float  # the price the plan pays (spot or on-demand, see the strategy)
    on_demand_per_hour: float
    vcpus: int = 8


@dataclass(frozen=True)
class PsOption:
    type: str  # "same" = PS on the worker type (homogeneous strategy)
    max_count: int
    network_mb_s: float
    vcpus: int
    price_per_hour: float


@dataclass(frozen=True)
class TrainingSpec:
    name: str
    target_loss: float
    deadline_s: float
    model_mb: float
    workers: tuple[WorkerOption, ...]
    ps: PsOption
    sync: str = "asp"
    # homogeneous model
    curve: LossCurve | None = None
    update_cpu_s_per_mb: float = 0.0
    batch_penalty: float = 0.0
    reference_batch: int = 0
    worker_bandwidth_cap_mb_s: float | None = None
    # heterogeneous spot model
    spot: SpotJob | None = None
    recovery_overhead_s: float = 30.0

    def worker(self, name: str) -> WorkerOption:
        for w in self.workers:
            if w.type == name:
                return w
        raise TrainingError(
            f"instance type {name!r} is not among the spec's workers ({', '.join(w.type for w in self.workers)})"
        )

    def ps_job(self, batch: int) -> PsJob:
        if self.curve is None:
            raise TrainingError(
                "spec lacks 'homogeneous.curve' (beta0, beta1, beta2); "
                "fit it with `stoke train fit-loss CURVE.csv` and paste the result"
            )
        return PsJob(
            model_mb=self.model_mb,
            batch_per_worker=batch,
            curve=self.curve,
            target_loss=self.target_loss,
            sync=self.sync,
            update_cpu_s_per_mb=self.update_cpu_s_per_mb,
            batch_penalty=self.batch_penalty,
            reference_batch=self.reference_batch,
        )


@dataclass(frozen=True)
class TrainingPlan:
    """A provisioning decision with its prediction, or the reason it is infeasible."""

    strategy: str  # "homogeneous" or "spot"
    job: str
    feasible: bool
    counts: tuple[tuple[str, int], ...]  # workers per instance type, in spec order
    ps_type: str
    ps_count: int
    predicted_time_s: float
    predicted_cost: float
    deadline_s: float
    target_loss: float
    bottleneck: str = ""
    reason: str = ""
    details: Mapping[str, Any] = field(default_factory=dict)
    existing: tuple[tuple[str, int], ...] = ()  # survivors kept in the plan (spot re-plan)
    candidates: int = 0
    search: str = ""

    @property
    def workers(self) -> int:
        return sum(c for _, c in self.counts)

    def count(self, type_name: str) -> int:
        return dict(self.counts).get(type_name, 0)

    @property
    def additions(self) -> tuple[tuple[str, int], ...]:
        """Instances to launch on top of the survivors."""
        have = dict(self.existing)
        return tuple((t, c - have.get(t, 0)) for t, c in self.counts if c - have.get(t, 0) > 0)


# --------------------------------------------------------------------------- spec parsing


def _need(obj: Any, key: str, where: str, source: str) -> Any:
    if not isinstance(obj, Mapping) or key not in obj:
        raise TrainingError(
            f"{source}: {where} lacks field {key!r}; see the bundled example (`stoke train plan` with no file uses it)"
        )
    return obj[key]


def _num(
    obj: Mapping[str, Any],
    key: str,
    where: str,
    source: str,
    *,
    default: Any = None,
    positive: bool = True,
    allow_zero: bool = False,
) -> float:
    value = obj.get(key, default) if isinstance(obj, Mapping) else default
    if value is None:
        value = _need(obj, key, where, source)
    field = f"{where}.{key}"
    if not positive:
        return check.number(value, field, where=source, error=TrainingError)
    if allow_zero:
        return check.non_negative(value, field, where=source, error=TrainingError)
    return check.positive(value, field, where=source, error=TrainingError)


def spec_from_dict(data: Any, catalog: Catalog, source: str = "SPEC.yaml", *, market: str = "spot") -> TrainingSpec:
    """Build a `TrainingSpec` from the parsed SPEC.yaml.

    `market` picks the worker price: "spot" (catalog spot price) or
    "on_demand"; a `price_per_hour` in the spec overrides either.
    """
    if not isinstance(data, Mapping):
        raise TrainingError(f"{source}: the spec must be a mapping with 'job', 'workers' and 'ps'")
    job = _need(data, "job", "spec", source)
    name = str(job.get("name", "training-job")) if isinstance(job, Mapping) else "training-job"
    target = _num(job, "target_loss", "job", source)
    deadline = _num(job, "deadline_s", "job", source)
    model_mb = _num(job, "model_mb", "job", source)
    sync = str(job.get("sync", "asp"))
    if sync not in ("asp", "bsp"):
        raise TrainingError(f"{source}: job.sync must be 'asp' or 'bsp', got {sync!r}")
    workers = _workers(_need(data, "workers", "spec", source), catalog, source, market)
    for section in ("ps", "homogeneous", "spot"):
        if data.get(section) is not None and not isinstance(data[section], Mapping):
            raise TrainingError(
                f"{source}: {section} must be a mapping of keys (e.g. ps: {{type: m5.xlarge}}), got {data[section]!r}"
            )
    ps = _ps(data.get("ps", {}) or {}, catalog, source)
    homo = data.get("homogeneous", {}) or {}
    spot_raw = data.get("spot")
    cap = homo.get("worker_bandwidth_mb_s")
    return TrainingSpec(
        name=name,
        target_loss=target,
        deadline_s=deadline,
        model_mb=model_mb,
        workers=workers,
        ps=ps,
        sync=sync,
        curve=_curve(homo["curve"], source) if "curve" in homo else None,
        update_cpu_s_per_mb=_num(homo, "update_cpu_s_per_mb", "homogeneous", source, default=0.0, allow_zero=True),
        batch_penalty=_num(homo, "batch_penalty", "homogeneous", source, default=0.0, allow_zero=True),
        reference_batch=int(_num(homo, "reference_batch", "homogeneous", source, default=0, allow_zero=True)),
        worker_bandwidth_cap_mb_s=None if cap is None else _num(homo, "worker_bandwidth_mb_s", "homogeneous", source),
        spot=None if spot_raw is None else _spot(spot_raw, model_mb, target, ps, source),
        recovery_overhead_s=_num(spot_raw or {}, "recovery_overhead_s", "spot", source, default=30.0, allow_zero=True),
    )


def _workers(raw: Any, catalog: Catalog, source: str, market: str) -> tuple[WorkerOption, ...]:
    """workers: {instance type: {quota, speed, gpu_batch, price_per_hour?, network_mb_s?}}."""
    if not isinstance(raw, Mapping) or not raw:
        raise TrainingError(f"{source}: workers must map instance type -> {{quota, speed, gpu_batch}}")
    workers = []
    for type_name, w in raw.items():
        where = f"workers.{type_name}"
        inst = catalog.get(str(type_name), f"{source}: {where}")
        quota = _num(w, "quota", where, source, allow_zero=True)
        if quota != int(quota):
            raise TrainingError(f"{source}: {where}.quota must be a whole number, got {quota!r}")
        gpu_batch = _num(w, "gpu_batch", where, source)
        default_price = inst.spot_per_hour if market == "spot" else inst.on_demand_per_hour
        workers.append(
            WorkerOption(
                type=str(type_name),
                quota=int(quota),
                speed=_num(w, "speed", where, source),
                batch=int(gpu_batch) * inst.gpus,
                gpus=inst.gpus,
                network_mb_s=_num(w, "network_mb_s", where, source, default=inst.network_mb_s),
                price_per_hour=_num(w, "price_per_hour", where, source, default=default_price, allow_zero=True),
                on_demand_per_hour=inst.on_demand_per_hour,
                vcpus=inst.vcpus,
            )
        )
    return tuple(workers)


def _ps(raw: Mapping[str, Any], catalog: Catalog, source: str) -> PsOption:
    """ps: {type: same | an instance type, max_count?, network_mb_s?, vcpus?, price_per_hour?}."""
    ps_type = str(raw.get("type", "same"))
    max_count = int(_num(raw, "max_count", "ps", source, default=4))
    if ps_type == "same":
        return PsOption(type="same", max_count=max_count, network_mb_s=0.0, vcpus=0, price_per_hour=0.0)
    inst = catalog.get(ps_type, f"{source}: ps.type")
    return PsOption(
        type=ps_type,
        max_count=max_count,
        network_mb_s=_num(raw, "network_mb_s", "ps", source, default=inst.network_mb_s),
        vcpus=int(_num(raw, "vcpus", "ps", source, default=inst.vcpus)),
        price_per_hour=_num(raw, "price_per_hour", "ps", source, default=inst.on_demand_per_hour, allow_zero=True),
    )


def _curve(raw: Any, source: str) -> LossCurve:
    """homogeneous.curve: {beta0, beta1, beta2}."""
    beta0 = _num(raw, "beta0", "homogeneous.curve", source)
    beta1 = _num(raw, "beta1", "homogeneous.curve", source, positive=False)
    beta2 = _num(raw, "beta2", "homogeneous.curve", source, positive=False)
    try:  # the model's own checks do not know the file
        return LossCurve(beta0=beta0, beta1=beta1, beta2=beta2)
    except TrainingError as err:
        raise TrainingError(f"{source}: homogeneous.curve: {err}") from None


def _spot(raw: Any, model_mb: float, target: float, ps: PsOption, source: str) -> SpotJob:
    """spot: {ps_bandwidth_mb_s?, required_bandwidth_mb_s, pcie_mb_s?, contention: {a1, b1}, loss: {g1..g5}}."""
    loss = _need(raw, "loss", "spot", source)
    contention = _need(raw, "contention", "spot", source)
    numbers = dict(
        ps_bw_mb_s=_num(
            raw, "ps_bandwidth_mb_s", "spot", source, default=ps.network_mb_s if ps.network_mb_s > 0 else None
        ),
        required_bw_mb_s=_num(raw, "required_bandwidth_mb_s", "spot", source),
        pcie_bw_mb_s=_num(raw, "pcie_mb_s", "spot", source, default=10000.0),
        a1=_num(contention, "a1", "spot.contention", source),
        b1=_num(contention, "b1", "spot.contention", source, positive=False),
    )
    g = {k: _num(loss, k, "spot.loss", source, positive=False) for k in ("g1", "g2", "g3", "g4", "g5")}
    r_weight = _num(loss, "r_weight", "spot.loss", source, default=1.0, allow_zero=True)
    try:  # the model's own checks do not know the file
        return SpotJob(model_mb=model_mb, loss=SpotLoss(**g, r_weight=r_weight), target_loss=target, **numbers)
    except TrainingError as err:
        raise TrainingError(f"{source}: spot: {err}") from None


def with_overrides(
    spec: TrainingSpec, *, deadline_s: float | None = None, target_loss: float | None = None
) -> TrainingSpec:
    """The same spec with a new deadline and/or target loss."""
    spec = replace(
        spec,
        deadline_s=spec.deadline_s if deadline_s is None else deadline_s,
        target_loss=spec.target_loss if target_loss is None else target_loss,
    )
    if spec.spot is not None:
        spec = replace(spec, spot=replace(spec.spot, target_loss=spec.target_loss))
    return spec


# --------------------------------------------------------------------------- plan JSON


def training_plan_to_dict(plan: TrainingPlan) -> dict[str, Any]:
    return {
        "format_version": PLAN_FORMAT_VERSION,
        "strategy": plan.strategy,
        "job": plan.job,
        "feasible": plan.feasible,
        "counts": {t: c for t, c in plan.counts},
        "existing": {t: c for t, c in plan.existing},
        "ps_type": plan.ps_type,
        "ps_count": plan.ps_count,
        "predicted_time_s": None if not math.isfinite(plan.predicted_time_s) else round(plan.predicted_time_s, 3),
        "predicted_cost": None if not math.isfinite(plan.predicted_cost) else round(plan.predicted_cost, 6),
        "deadline_s": plan.deadline_s,
        "target_loss": plan.target_loss,
        "bottleneck": plan.bottleneck,
        "reason": plan.reason,
        "details": dict(plan.details),
        "candidates": plan.candidates,
        "search": plan.search,
    }


def training_plan_from_dict(data: Any, source: str = "PLAN.json") -> TrainingPlan:
    """Inverse of `training_plan_to_dict`; raises TrainingError naming the field, its value and the fix."""
    fix = "re-plan with `stoke train plan --json`"
    if not isinstance(data, Mapping):
        raise TrainingError(f"{source}: a plan must be a JSON object (write it with `stoke train plan --json`)")
    if data.get("format_version") != PLAN_FORMAT_VERSION:
        raise TrainingError(
            f"{source}: format_version {data.get('format_version')!r} is not supported "
            f"(expected {PLAN_FORMAT_VERSION}); {fix}"
        )

    def counts(key: str, value: Any) -> tuple[tuple[str, int], ...]:
        if not isinstance(value, Mapping):
            raise check.fail(
                key,
                "a mapping of instance type -> whole number of workers",
                value,
                where=source,
                error=TrainingError,
                fix=fix,
            )
        return tuple(
            (str(t), check.whole(c, f"{key}.{t}", where=source, error=TrainingError, fix=fix)) for t, c in value.items()
        )

    def num(key: str, default: float = math.inf) -> float:
        value = data.get(key)  # null: inf (an infeasible plan's prediction); Infinity: an open deadline
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
            raise check.fail(key, "a number", value, where=source, error=TrainingError, fix=fix)
        return float(value)

    def whole(key: str) -> int:
        return check.whole(data.get(key, 0), key, where=source, error=TrainingError, fix=fix)

    details = data.get("details") or {}
    if not isinstance(details, Mapping):
        raise check.fail("details", "a mapping", details, where=source, error=TrainingError, fix=fix)
    return TrainingPlan(
        strategy=str(data.get("strategy", "spot")),
        job=str(data.get("job", "training-job")),
        feasible=bool(_need(data, "feasible", "plan", source)),
        counts=counts("counts", _need(data, "counts", "plan", source)),
        ps_type=str(data.get("ps_type", "")),
        ps_count=whole("ps_count"),
        predicted_time_s=num("predicted_time_s"),
        predicted_cost=num("predicted_cost"),
        deadline_s=num("deadline_s"),
        target_loss=num("target_loss", 0.0),
        bottleneck=str(data.get("bottleneck", "")),
        reason=str(data.get("reason", "")),
        details=dict(details),
        existing=counts("existing", data.get("existing") or {}),
        candidates=whole("candidates"),
        search=str(data.get("search", "")),
    )
