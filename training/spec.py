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

from foundation import names
from foundation import validate as check
from foundation.errors import InputError
from training.models import LossCurve, PsJob, SpotJob, SpotLoss, TrainingError

PLAN_FORMAT_VERSION = 1
STRATEGIES = ("spot", "homogeneous")


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

# Bounds of a spec's numbers: generous for any real job, tight enough that a slip (a size in bytes, a deadline in
# milliseconds, a batch of 0.5) is refused with the field named instead of planned or failing deep in a model.
MAX_DEADLINE_S = 1e7  # about 16 weeks; also the most a revocation's recovery overhead may add
MAX_MODEL_MB = 1e6  # 1 TB of parameters
MAX_LOSS = 1e6
MAX_QUOTA = 1000  # instances of one type
MAX_PS = 64  # parameter servers
MAX_GPU_BATCH = 1 << 20  # samples per GPU per iteration
MAX_BATCH = 1 << 24  # samples per worker per iteration (homogeneous.reference_batch)
MAX_SPEED = 1e9  # samples/s of one worker
MAX_BANDWIDTH_MB_S = 1e6  # 1 TB/s
MAX_PRICE_PER_HOUR = 1e4  # $/hour of one instance
MAX_VCPUS = 1024
MAX_CPU_S_PER_MB = 100.0  # homogeneous.update_cpu_s_per_mb
MAX_BATCH_PENALTY = 100.0
MAX_COEFFICIENT = 1e12  # fitted curve, contention and loss coefficients, in magnitude


#: EC2 tag values are at most 256 characters.
MAX_TAG_CHARS = 256


def cluster_tag(value: Any, field: str, *, where: str = "", error: type[InputError] = InputError) -> str:
    """A cluster's name as its instances are tagged (`stoke-cluster`): printable text of 1-256 characters. Looser
    than the name rule new specs follow: a cluster an earlier stoke launched under any job name must still be
    found and terminated."""
    if not isinstance(value, str) or not 0 < len(value) <= MAX_TAG_CHARS or not value.isprintable():
        raise check.fail(
            field, f"printable text of 1-{MAX_TAG_CHARS} characters (an EC2 tag value)", value, where=where, error=error
        )
    return value


def _coefficient(value: Any, field: str, where: str, error: type[InputError]) -> float:
    if check.number(value, field, where=where, error=error) and abs(value) > MAX_COEFFICIENT:
        raise check.fail(
            field, f"a number from -{MAX_COEFFICIENT:g} to {MAX_COEFFICIENT:g}", value, where=where, error=error
        )
    return float(value)


COEFFICIENT = check.Rule(_coefficient, {"type": "number", "minimum": -MAX_COEFFICIENT, "maximum": MAX_COEFFICIENT})
POSITIVE_COEFFICIENT = check.positive_up_to(MAX_COEFFICIENT)
BANDWIDTH = check.positive_up_to(MAX_BANDWIDTH_MB_S, "MB/s")
PRICE = check.non_negative_up_to(MAX_PRICE_PER_HOUR)


@dataclass(frozen=True, kw_only=True)
class JobSection:
    """job: what to train, to what loss, by when."""

    name: str = check.setting("training-job", check.NAME, "the job's name: cluster tag, Kubernetes names")
    target_loss: float = check.setting(rule=check.positive_up_to(MAX_LOSS), doc="training loss to reach")
    deadline_s: float = check.setting(
        rule=check.positive_up_to(MAX_DEADLINE_S, "seconds"), doc="seconds the training may take"
    )
    model_mb: float = check.setting(rule=check.positive_up_to(MAX_MODEL_MB), doc="model size in MB (S)")
    sync: str = check.setting("asp", check.choice(("asp", "bsp")), "asp or bsp (the spot strategy is ASP only)")


@dataclass(frozen=True, kw_only=True)
class WorkerSection:
    """workers.<instance type>: the profiled figures of one worker of that type."""

    quota: int = check.setting(rule=check.whole_between(0, MAX_QUOTA), doc="most instances of the type (0: none)")
    speed: float = check.setting(rule=check.positive_up_to(MAX_SPEED), doc="profiled samples/s of one worker alone")
    gpu_batch: int = check.setting(rule=check.whole_between(1, MAX_GPU_BATCH), doc="samples per GPU per iteration")
    network_mb_s: float | None = check.setting(None, BANDWIDTH, "network MB/s (default: the catalog's)")
    price_per_hour: float | None = check.setting(None, PRICE, "$/hour (default: the catalog's spot or on-demand)")


@dataclass(frozen=True, kw_only=True)
class PsSection:
    """ps: the parameter servers."""

    type: str = check.setting("same", check.NAME, "an instance type, or 'same' (on the worker type)")
    max_count: int = check.setting(4, check.whole_between(1, MAX_PS), "most parameter servers")
    network_mb_s: float | None = check.setting(None, BANDWIDTH, "network MB/s (default: the catalog's)")
    vcpus: int | None = check.setting(None, check.whole_between(1, MAX_VCPUS), "vCPUs (default: the catalog's)")
    price_per_hour: float | None = check.setting(None, PRICE, "$/hour (default: the catalog's on-demand price)")


@dataclass(frozen=True, kw_only=True)
class CurveSection:
    """homogeneous.curve: loss(s) = 1/(beta0*s + beta1) + beta2 (fit with `stoke train fit-loss`)."""

    beta0: float = check.setting(rule=POSITIVE_COEFFICIENT)
    beta1: float = check.setting(rule=COEFFICIENT)
    beta2: float = check.setting(rule=COEFFICIENT)


@dataclass(frozen=True, kw_only=True)
class HomogeneousSection:
    """homogeneous: the one-type model's figures."""

    curve: CurveSection | None = check.setting(None, doc="the convergence curve")
    update_cpu_s_per_mb: float = check.setting(0.0, check.non_negative_up_to(MAX_CPU_S_PER_MB))
    batch_penalty: float = check.setting(0.0, check.non_negative_up_to(MAX_BATCH_PENALTY))
    reference_batch: int = check.setting(0, check.whole_between(0, MAX_BATCH))
    worker_bandwidth_mb_s: float | None = check.setting(None, BANDWIDTH, "cap on a worker's network MB/s")


@dataclass(frozen=True, kw_only=True)
class ContentionSection:
    """spot.contention: P(n) = min(a1*sqrt(n) + b1, 1)."""

    a1: float = check.setting(rule=POSITIVE_COEFFICIENT)
    b1: float = check.setting(rule=COEFFICIENT)


@dataclass(frozen=True, kw_only=True)
class SpotLossSection:
    """spot.loss: loss = (g2*b_w + g3) * sqrt((r_weight*R + g4)*n) / (j + g1) + g5."""

    g1: float = check.setting(rule=COEFFICIENT)
    g2: float = check.setting(rule=COEFFICIENT)
    g3: float = check.setting(rule=COEFFICIENT)
    g4: float = check.setting(rule=COEFFICIENT)
    g5: float = check.setting(rule=COEFFICIENT)
    r_weight: float = check.setting(1.0, check.non_negative_up_to(MAX_COEFFICIENT))


@dataclass(frozen=True, kw_only=True)
class SpotSection:
    """spot: the heterogeneous spot model's figures."""

    ps_bandwidth_mb_s: float | None = check.setting(None, BANDWIDTH, "B_ps (default: ps.network_mb_s)")
    required_bandwidth_mb_s: float = check.setting(rule=BANDWIDTH, doc="B_req: what one worker uses alone")
    pcie_mb_s: float = check.setting(10000.0, BANDWIDTH, "B_pcie")
    recovery_overhead_s: float = check.setting(
        30.0, check.non_negative_up_to(MAX_DEADLINE_S), "seconds a re-plan after a revocation adds"
    )
    contention: ContentionSection = check.setting(doc="the contention fit")
    loss: SpotLossSection = check.setting(doc="the loss fit")


def _instance_types(value: Any, field: str, where: str, error: type[InputError]) -> dict[str, Any]:
    """workers: a non-empty mapping whose keys are instance type names (each entry is read on its own)."""
    if not isinstance(value, Mapping) or not value:
        raise check.fail(
            field, "a mapping of instance type -> {quota, speed, gpu_batch}", value, where=where, error=error
        )
    for key in value:
        names.check_name(key, f"{field}: instance type", where=where, error=error)
    return {str(k).strip(): v for k, v in value.items()}


@dataclass(frozen=True, kw_only=True)
class SpecFile:
    """SPEC.yaml of `stoke train plan`."""

    job: JobSection = check.setting(doc="the job")
    workers: Mapping[str, Any] = check.setting(
        rule=check.Rule(
            _instance_types, {"type": "object", "minProperties": 1, "additionalProperties": {"type": "object"}}
        ),
        doc="instance type -> its worker figures (see WorkerSection)",
    )
    ps: PsSection = check.setting(PsSection(), doc="the parameter servers")
    homogeneous: HomogeneousSection = check.setting(HomogeneousSection(), doc="the homogeneous strategy's model")
    spot: SpotSection | None = check.setting(None, doc="the spot strategy's model")


def spec_instance_types(data: Any, source: str = "SPEC.yaml") -> list[str]:
    """The instance types a parsed SPEC.yaml names (workers and ps.type), checked as names; for the live prices
    that are fetched before the spec is read against its catalog."""
    spec = check.load(SpecFile, data, where=source, error=TrainingError)
    types = list(spec.workers)
    return types if spec.ps.type == "same" else [*types, spec.ps.type]


def spec_from_dict(data: Any, catalog: Catalog, source: str = "SPEC.yaml", *, market: str = "spot") -> TrainingSpec:
    """Build a `TrainingSpec` from the parsed SPEC.yaml.

    Every level refuses a key it does not know (a misspelt key would otherwise fall back to its default),
    and every number has the bounds above. `market` picks the worker price: "spot" (catalog spot price)
    or "on_demand"; a `price_per_hour` in the spec overrides either.
    """
    if not isinstance(data, Mapping):
        raise TrainingError(f"{source}: the spec must be a mapping with 'job', 'workers' and 'ps'")
    spec = check.load(SpecFile, data, where=source, error=TrainingError)
    job = spec.job
    workers = _workers(spec.workers, catalog, source, market)
    if all(w.quota == 0 for w in workers):
        raise TrainingError(
            f"{source}: workers: every instance type has quota 0, so no worker may run; "
            "give at least one workers.<type>.quota >= 1"
        )
    ps = _ps(spec.ps, catalog, source)
    homo = spec.homogeneous
    return TrainingSpec(
        name=job.name,
        target_loss=job.target_loss,
        deadline_s=job.deadline_s,
        model_mb=job.model_mb,
        workers=workers,
        ps=ps,
        sync=job.sync,
        curve=None if homo.curve is None else _curve(homo.curve, source),
        update_cpu_s_per_mb=homo.update_cpu_s_per_mb,
        batch_penalty=homo.batch_penalty,
        reference_batch=homo.reference_batch,
        worker_bandwidth_cap_mb_s=homo.worker_bandwidth_mb_s,
        spot=None if spec.spot is None else _spot(spec.spot, job, workers, ps, source),
        recovery_overhead_s=30.0 if spec.spot is None else spec.spot.recovery_overhead_s,
    )


def _workers(raw: Mapping[str, Any], catalog: Catalog, source: str, market: str) -> tuple[WorkerOption, ...]:
    """workers: {instance type: {quota, speed, gpu_batch, price_per_hour?, network_mb_s?}}."""
    workers = []
    for type_name, entry in raw.items():
        where = f"workers.{type_name}"
        inst = catalog.get(type_name, f"{source}: {where}")
        w = check.load(WorkerSection, entry, where=source, error=TrainingError, prefix=where + ".")
        default_price = inst.spot_per_hour if market == "spot" else inst.on_demand_per_hour
        workers.append(
            WorkerOption(
                type=type_name,
                quota=w.quota,
                speed=w.speed,
                batch=w.gpu_batch * inst.gpus,
                gpus=inst.gpus,
                network_mb_s=inst.network_mb_s if w.network_mb_s is None else w.network_mb_s,
                price_per_hour=default_price if w.price_per_hour is None else w.price_per_hour,
                on_demand_per_hour=inst.on_demand_per_hour,
                vcpus=inst.vcpus,
            )
        )
    return tuple(workers)


def _ps(raw: PsSection, catalog: Catalog, source: str) -> PsOption:
    """ps: {type: same | an instance type, max_count?, network_mb_s?, vcpus?, price_per_hour?}."""
    if raw.type == "same":
        return PsOption(type="same", max_count=raw.max_count, network_mb_s=0.0, vcpus=0, price_per_hour=0.0)
    inst = catalog.get(raw.type, f"{source}: ps.type")
    return PsOption(
        type=raw.type,
        max_count=raw.max_count,
        network_mb_s=inst.network_mb_s if raw.network_mb_s is None else raw.network_mb_s,
        vcpus=inst.vcpus if raw.vcpus is None else raw.vcpus,
        price_per_hour=inst.on_demand_per_hour if raw.price_per_hour is None else raw.price_per_hour,
    )


def _curve(raw: CurveSection, source: str) -> LossCurve:
    try:  # the model's own checks do not know the file
        return LossCurve(beta0=raw.beta0, beta1=raw.beta1, beta2=raw.beta2)
    except TrainingError as err:
        raise TrainingError(f"{source}: homogeneous.curve: {err}") from None


def _spot(raw: SpotSection, job: JobSection, workers: tuple[WorkerOption, ...], ps: PsOption, source: str) -> SpotJob:
    ps_bw = raw.ps_bandwidth_mb_s if raw.ps_bandwidth_mb_s is not None else ps.network_mb_s
    if not ps_bw:
        raise TrainingError(
            f"{source}: spot lacks field 'ps_bandwidth_mb_s'; add it (ps.type 'same' names no instance to take "
            "the PS bandwidth from)"
        )
    # The model's convention (training.models): a worker's profiled time per iteration (batch/speed) includes
    # pushing and pulling the model at B_req, 2*S/B_req; what is left is its compute time, which must be > 0.
    push_pull = 2 * job.model_mb / raw.required_bandwidth_mb_s
    for w in workers:
        if w.batch / w.speed <= push_pull:
            raise TrainingError(
                f"{source}: workers.{w.type}: gpu_batch x {w.gpus} GPU(s) / speed = {w.batch / w.speed:.4g} s per "
                f"iteration must exceed the push and pull of the model it includes, 2 x job.model_mb / "
                f"spot.required_bandwidth_mb_s = {push_pull:.4g} s; check workers.{w.type}.speed and gpu_batch, "
                "job.model_mb and spot.required_bandwidth_mb_s"
            )
    c, g = raw.contention, raw.loss
    try:  # the model's own checks do not know the file
        return SpotJob(
            model_mb=job.model_mb,
            ps_bw_mb_s=ps_bw,
            required_bw_mb_s=raw.required_bandwidth_mb_s,
            pcie_bw_mb_s=raw.pcie_mb_s,
            a1=c.a1,
            b1=c.b1,
            loss=SpotLoss(g1=g.g1, g2=g.g2, g3=g.g3, g4=g.g4, g5=g.g5, r_weight=g.r_weight),
            target_loss=job.target_loss,
        )
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


def _need(obj: Any, key: str, where: str, source: str) -> Any:
    if not isinstance(obj, Mapping) or key not in obj:
        raise TrainingError(f"{source}: {where} lacks field {key!r}; re-plan with `stoke train plan --json`")
    return obj[key]


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
            (
                names.check_name(t, f"{key}: instance type", where=source, error=TrainingError),
                check.whole(c, f"{key}.{t}", where=source, error=TrainingError, fix=fix),
            )
            for t, c in value.items()
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

    def name(key: str, default: str) -> str:  # printed, a cluster tag and part of Kubernetes names
        return names.check_name(data.get(key, default), key, where=source, error=TrainingError)

    return TrainingPlan(
        strategy=check.one_of(data.get("strategy", "spot"), "strategy", STRATEGIES, where=source, error=TrainingError),
        # a tag value, not held to the name rule here: a plan of an earlier stoke took any job name and tagged its
        # instances with it, and `train terminate PLAN` must still find them (render checks Kubernetes' rule)
        job=cluster_tag(data.get("job", "training-job"), "job", where=source, error=TrainingError),
        feasible=bool(_need(data, "feasible", "plan", source)),
        counts=counts("counts", _need(data, "counts", "plan", source)),
        ps_type="" if not data.get("ps_type") else name("ps_type", ""),
        ps_count=whole("ps_count"),
        predicted_time_s=num("predicted_time_s"),
        predicted_cost=num("predicted_cost"),
        deadline_s=num("deadline_s"),
        target_loss=num("target_loss", 0.0),
        bottleneck=names.clean_text(str(data.get("bottleneck", "")), 80),  # text the commands print
        reason=names.clean_text(str(data.get("reason", "")), 1000),
        details=dict(details),
        existing=counts("existing", data.get("existing") or {}),
        candidates=whole("candidates"),
        search=names.clean_text(str(data.get("search", "")), 80),
    )
