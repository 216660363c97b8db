"""Problem and plan types of the provisioning solver: plain frozen data.

`plan_to_dict` / `plan_from_dict` convert a plan to and from its JSON shape
(the `stoke plan --json` output); they do no I/O.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from foundation import names
from foundation import validate as check
from foundation.errors import InputError
from planner.bounds import (
    MAX_BATCH,
    MAX_GPU_COUNT,
    MAX_MEMORY_MIB,
    MAX_PRICE_PER_HOUR,
    MAX_RATE_RPS,
    MAX_REPLICAS,
    MAX_SLO_MS,
)

# Only named in annotations: the plan types load without numpy, so a client that only reads plans and
# workloads (`stoke status`, the gRPC client) starts quickly.
if TYPE_CHECKING:
    from interference.profile import DeviceProfile


class ProblemError(InputError):
    """The problem cannot be solved as stated (bad input or an impossible SLO)."""


def too_many_replicas(workload: Workload, needed: float, gpu_type: str) -> ProblemError:
    """The error of a workload that would need more than `MAX_REPLICAS` replicas on `gpu_type`."""
    count = f"{needed:.0f}" if needed < 1e15 else f"{needed:.3g}"
    return ProblemError(
        f"workload {workload.name!r} needs {count} replicas at {workload.rate_rps:g} req/s on a {gpu_type}, "
        f"more than the limit of {MAX_REPLICAS} per workload; lower rate_rps, split it into several "
        f"workloads, or use a faster GPU type"
    )


@dataclass(frozen=True)
class Workload:
    """A model served under a latency SLO at a request rate."""

    name: str
    model: str
    slo_ms: float
    rate_rps: float
    gpu_type: str | None = None  # optional preference: only GPUs of this type
    arrivals: str = "poisson"  # "poisson" (independent users) or "constant" (paced clients)
    # `rate_rps: auto` (demand tracking, done by the controller): rate_rps is then the rate planned for
    # now, kept within [min_rps, max_rps]; the solver plans for rate_rps either way
    rate_auto: bool = False
    min_rps: float | None = None
    max_rps: float | None = None
    #: No replica gets a smaller share (the controller's SLO guard raises it; 0 = no floor). The `stoke`
    #: strategy honours it; the baselines ignore it.
    min_share_pct: float = 0.0

    def __post_init__(self) -> None:
        if self.arrivals not in ("poisson", "constant"):
            raise ProblemError(
                f"workload {self.name!r}: arrivals must be 'poisson' or 'constant', got {self.arrivals!r}"
            )
        names.check_name(self.name, "name", where="workload", error=ProblemError)
        where = f"workload {self.name!r}"
        names.check_name(self.model, "model", where=where, error=ProblemError)
        if self.gpu_type is not None:
            names.check_name(self.gpu_type, "gpu_type", where=where, error=ProblemError)
        check.positive(self.slo_ms, "slo_ms", where=where, error=ProblemError, maximum=MAX_SLO_MS)
        check.positive(
            self.rate_rps,
            "rate_rps",
            where=where,
            error=ProblemError,
            maximum=MAX_RATE_RPS,
            fix="split a larger service into several workloads",
        )
        for attr in ("min_rps", "max_rps"):
            if getattr(self, attr) is not None:
                check.positive(getattr(self, attr), attr, where=where, error=ProblemError, maximum=MAX_RATE_RPS)
        if self.min_rps is not None and self.max_rps is not None and self.min_rps > self.max_rps:
            raise ProblemError(f"{where}: min_rps ({self.min_rps:g}) must not exceed max_rps ({self.max_rps:g})")
        if not 0.0 <= self.min_share_pct <= 100.0:
            raise ProblemError(f"{where}: min_share_pct must be in [0, 100], got {self.min_share_pct!r}")


@dataclass(frozen=True)
class GpuType:
    """A GPU type of the inventory: its hourly price, optional count limit and fitted profile."""

    name: str
    price_per_hour: float
    profile: DeviceProfile
    max_count: int | None = None

    def __post_init__(self) -> None:
        where = f"GPU type {self.name!r}"
        check.non_negative(
            self.price_per_hour, "price_per_hour", where=where, error=ProblemError, maximum=MAX_PRICE_PER_HOUR
        )
        if self.max_count is not None:
            check.whole(self.max_count, "max_count", where=where, error=ProblemError, maximum=MAX_GPU_COUNT)


@dataclass(frozen=True)
class Problem:
    workloads: tuple[Workload, ...]
    inventory: tuple[GpuType, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "workloads", tuple(self.workloads))
        object.__setattr__(self, "inventory", tuple(self.inventory))
        if not self.inventory:
            raise ProblemError("the GPU inventory is empty; give at least one GPU type")
        duplicates = sorted(n for n, k in Counter(w.name for w in self.workloads).items() if k > 1)
        if duplicates:
            raise ProblemError(f"workload names must be unique; repeated: {', '.join(duplicates)}")
        types = {g.name for g in self.inventory}
        if len(types) != len(self.inventory):
            repeated = sorted(n for n, k in Counter(g.name for g in self.inventory).items() if k > 1)
            raise ProblemError(f"GPU type names in the inventory must be unique; repeated: {', '.join(repeated)}")
        checked: set[tuple[str | None, str]] = set()  # (gpu_type, model) pairs found servable: each once
        for w in self.workloads:
            if (w.gpu_type, w.model) in checked:
                continue
            if w.gpu_type is not None and w.gpu_type not in types:
                raise ProblemError(
                    f"workload {w.name!r}: gpu_type {w.gpu_type!r} is not in the inventory ({', '.join(sorted(types))})"
                )
            allowed = [g for g in self.inventory if w.gpu_type in (None, g.name)]
            checked.add((w.gpu_type, w.model))
            if not any(w.model in g.profile.models for g in allowed):
                raise ProblemError(
                    f"workload {w.name!r}: model {w.model!r} is not profiled on "
                    f"{'/'.join(g.name for g in allowed)}; profiled models: "
                    f"{', '.join(sorted({m for g in allowed for m in g.profile.models}))}"
                )


@dataclass(frozen=True)
class Placement:
    """One workload (or one replica of it) on one GPU."""

    name: str  # workload name
    model: str
    slo_ms: float  # the real SLO
    rate_rps: float  # rate this replica serves
    share_pct: float
    batch: int
    queue_delay_ms: float  # dynamic batching: longest wait for the batch to fill
    predicted_latency_ms: float  # inference of one batch, co-located (t_inf)
    predicted_throughput_rps: float
    replica: int = 0
    replicas: int = 1
    arrivals: str = "poisson"  # the workload's arrival kind (what the plan was sized for)
    #: p99 request latency of this replica (batching model: queueing + batch fill + inference);
    #: NaN in plans written before it existed.
    predicted_p99_ms: float = math.nan
    #: What keeps the share from one step less (`candidates.binding_constraint`); "" when unknown.
    binding: str = ""
    #: The serving path outside the batch, p99 (ms), included in `predicted_p99_ms`
    #: (`interference.batching.end_to_end_p99_ms`); 0 in plans written before it was modelled.
    serving_p99_ms: float = 0.0
    #: What clients see beyond the SLI windows, p99 (ms; `ModelProfile.beyond_sli_p99_ms`), also included in
    #: `predicted_p99_ms`; 0 in plans written before it was measured.
    beyond_sli_p99_ms: float = 0.0
    #: p99 with L and O raised to the profile's error bound at this point (share, batch); NaN in plans
    #: written before profiles recorded their error.
    p99_upper_ms: float = math.nan
    #: Device memory of this replica (process context + weights + activations), MiB; 0 when not recorded.
    memory_mib: float = 0.0

    @property
    def predicted_worst_ms(self) -> float:
        """Batch fill wait plus co-located inference: what a request sees at most without queueing."""
        return self.queue_delay_ms + self.predicted_latency_ms

    @property
    def p99_slo_ratio(self) -> float:
        """Predicted p99 over the SLO: the slack figure (1 is exactly at the SLO)."""
        return self.predicted_p99_ms / self.slo_ms

    @property
    def meets_slo(self) -> bool:
        """Predicted p99 within the SLO (fill + inference for plans without a p99) and throughput >= rate."""
        latency = self.predicted_worst_ms if math.isnan(self.predicted_p99_ms) else self.predicted_p99_ms
        return latency <= self.slo_ms + 1e-9 and self.predicted_throughput_rps >= self.rate_rps - 1e-9


@dataclass(frozen=True)
class GpuPlan:
    """One GPU of the plan.

    `key` is an opaque, stable identity the caller may give GPUs of a
    current plan (e.g. "node-a/0"); `solve(..., current=plan)` carries it
    over to the GPU that keeps those workloads, so callers can map plan GPUs
    to real devices without reshuffling. New GPUs get key None.
    """

    gpu_type: str
    price_per_hour: float
    placements: tuple[Placement, ...]
    key: str | None = None

    @property
    def share_pct(self) -> float:
        return sum(p.share_pct for p in self.placements)

    @property
    def memory_mib(self) -> float:
        return sum(p.memory_mib for p in self.placements)


@dataclass(frozen=True)
class Plan:
    strategy: str
    gpus: tuple[GpuPlan, ...]
    notes: tuple[str, ...] = field(default=())
    #: (GPU type, `profile_digest` of the profile it was planned with), as `stoke plan` writes it; empty: not
    #: recorded (a plan the controller made, or one written before plans recorded it)
    profiles: tuple[tuple[str, str], ...] = field(default=())

    @property
    def gpu_count(self) -> int:
        return len(self.gpus)

    @property
    def cost_per_hour(self) -> float:
        return sum(g.price_per_hour for g in self.gpus)

    @property
    def slo_misses(self) -> tuple[str, ...]:
        """Workloads (names) with at least one replica predicted to miss its SLO or rate."""
        return tuple(sorted({p.name for g in self.gpus for p in g.placements if not p.meets_slo}))

    def placements(self) -> list[tuple[int, Placement]]:
        return [(i, p) for i, g in enumerate(self.gpus) for p in g.placements]


def batch_queue_delay_ms(batch: int, rate_rps: float) -> float:
    """Time for a batch of `batch` requests to fill at `rate_rps`, counted from the first one.

    Triton's `max_queue_delay_microseconds` is set to this, so a batch never
    waits longer for stragglers than the plan budgeted.
    """
    return 1000.0 * (batch - 1) / rate_rps


def _finite_or_none(value: float) -> float | None:
    """JSON has no NaN/inf: unknown or unbounded figures are written as null."""
    return round(value, 6) if math.isfinite(value) else None


def _rounded(value: float) -> float:
    return round(value, 6) if math.isfinite(value) else value


def plan_to_dict(plan: Plan) -> dict[str, Any]:
    recorded = {"profiles": dict(plan.profiles)} if plan.profiles else {}
    return {
        "strategy": plan.strategy,
        "gpu_count": plan.gpu_count,
        "cost_per_hour": round(plan.cost_per_hour, 6),
        "slo_misses": list(plan.slo_misses),
        "notes": list(plan.notes),
        "gpus": [
            {
                "gpu_type": g.gpu_type,
                "key": g.key,
                "price_per_hour": g.price_per_hour,
                "share_pct": round(g.share_pct, 6),
                "memory_mib": round(g.memory_mib, 3),
                "workloads": [
                    {
                        "name": p.name,
                        "model": p.model,
                        "slo_ms": p.slo_ms,
                        "rate_rps": round(p.rate_rps, 6),
                        "share_pct": p.share_pct,
                        "batch": p.batch,
                        "queue_delay_ms": round(p.queue_delay_ms, 6),
                        "predicted_latency_ms": round(p.predicted_latency_ms, 6),
                        "predicted_p99_ms": _finite_or_none(p.predicted_p99_ms),
                        # from the rounded p99, so that a plan read back writes the same figures
                        "p99_upper_ms": _finite_or_none(p.p99_upper_ms),
                        "memory_mib": round(p.memory_mib, 3),
                        "p99_slo_ratio": _finite_or_none(_rounded(p.predicted_p99_ms) / p.slo_ms),
                        "serving_p99_ms": round(p.serving_p99_ms, 6),
                        "beyond_sli_p99_ms": round(p.beyond_sli_p99_ms, 6),
                        "binding": p.binding,
                        "predicted_throughput_rps": round(p.predicted_throughput_rps, 6),
                        "replica": p.replica,
                        "replicas": p.replicas,
                        "arrivals": p.arrivals,
                    }
                    for p in g.placements
                ],
            }
            for g in plan.gpus
        ],
        **recorded,
    }


def plan_from_dict(data: Mapping[str, Any], source: str = "plan") -> Plan:
    """Inverse of `plan_to_dict`; raises ProblemError naming the bad field (and its value)."""
    fix = "produce the plan with `stoke plan --json`"

    def need(obj: Any, key: str, where: str) -> Any:
        if not isinstance(obj, Mapping):
            raise ProblemError(f"{source}: {where} must be an object; {fix}", where)
        return check.require(obj, key, where=f"{source}: {where}", error=ProblemError, fix=fix)

    def items(obj: Any, key: str, where: str) -> list[Any]:
        value = need(obj, key, where)
        if not isinstance(value, list):
            raise check.fail(f"{where}.{key}", "a list", value, where=source, error=ProblemError, fix=fix)
        return value

    def num(
        obj: Mapping[str, Any], key: str, where: str, default: Any = None, *, low: float = 0.0, high: float = math.inf
    ) -> float:
        """A finite number in [low, high] (every figure of a plan is >= 0 and bounded)."""
        value = need(obj, key, where) if default is None else obj.get(key, default)
        number = check.number(value, f"{where}.{key}", where=source, error=ProblemError, fix=fix)
        if not low <= number <= high:
            span = ("a positive number" if low > 0 else f"a number >= {low:g}") + (
                f" up to {high:g}" if math.isfinite(high) else ""
            )
            raise check.fail(f"{where}.{key}", span, value, where=source, error=ProblemError, fix=fix)
        return number

    def whole(obj: Mapping[str, Any], key: str, where: str, default: Any = None, *, low: int, high: int) -> int:
        value = need(obj, key, where) if default is None else obj.get(key, default)
        return check.whole(
            value, f"{where}.{key}", minimum=low, maximum=high, where=source, error=ProblemError, fix=fix
        )

    def name(obj: Mapping[str, Any], key: str, where: str) -> str:
        # a plan's names become paths (the model repository) and reach terminals: the one name rule
        return names.check_name(need(obj, key, where), f"{where}.{key}", where=source, error=ProblemError)

    def optional_p99(w: Mapping[str, Any], key: str, where: str) -> float:
        # null: unbounded (an unstable queue); absent: a plan from before p99s were predicted
        if key not in w:
            return math.nan
        return math.inf if w[key] is None else num(w, key, where)

    if not isinstance(data, Mapping):
        raise ProblemError(f"{source}: a plan must be a JSON object; {fix}")
    gpus = []
    seen: set[tuple[str, int]] = set()
    for gi, g in enumerate(items(data, "gpus", "plan")):
        placements = []
        for wi, w in enumerate(items(g, "workloads", f"gpus[{gi}]")):
            where = f"gpus[{gi}].workloads[{wi}]"
            rate = num(w, "rate_rps", where, low=1e-9, high=MAX_RATE_RPS)
            batch = whole(w, "batch", where, low=1, high=MAX_BATCH)
            placement = Placement(
                name=name(w, "name", where),
                model=name(w, "model", where),
                slo_ms=num(w, "slo_ms", where, low=1e-9, high=MAX_SLO_MS),
                rate_rps=rate,
                share_pct=num(w, "share_pct", where, low=1e-9, high=100.0),
                batch=batch,
                queue_delay_ms=num(w, "queue_delay_ms", where, batch_queue_delay_ms(batch, rate), high=MAX_SLO_MS),
                predicted_latency_ms=num(w, "predicted_latency_ms", where),
                predicted_throughput_rps=num(w, "predicted_throughput_rps", where),
                replica=whole(w, "replica", where, 0, low=0, high=MAX_REPLICAS - 1),
                replicas=whole(w, "replicas", where, 1, low=1, high=MAX_REPLICAS),
                arrivals=check.one_of(
                    w.get("arrivals", "poisson"),
                    f"{where}.arrivals",
                    ("poisson", "constant"),
                    where=source,
                    error=ProblemError,
                ),
                binding=names.clean_text(str(w.get("binding", "")), 40),
                serving_p99_ms=num(w, "serving_p99_ms", where, 0.0, high=MAX_SLO_MS),
                beyond_sli_p99_ms=num(w, "beyond_sli_p99_ms", where, 0.0, high=MAX_SLO_MS),
                memory_mib=num(w, "memory_mib", where, 0.0, high=MAX_MEMORY_MIB),
                predicted_p99_ms=optional_p99(w, "predicted_p99_ms", where),
                p99_upper_ms=optional_p99(w, "p99_upper_ms", where),
            )
            if (placement.name, placement.replica) in seen:
                raise ProblemError(
                    f"{source}: {where} is workload {placement.name!r} replica {placement.replica} a second time; "
                    f"{fix}",
                    where,
                )
            seen.add((placement.name, placement.replica))
            placements.append(placement)
        if sum(p.share_pct for p in placements) > 100.0 + 1e-6:
            total = sum(p.share_pct for p in placements)
            raise ProblemError(f"{source}: gpus[{gi}] shares add up to {total:g}% > 100%; {fix}", f"gpus[{gi}]")
        key = g.get("key")
        gpus.append(
            GpuPlan(
                gpu_type=name(g, "gpu_type", f"gpus[{gi}]"),
                price_per_hour=num(g, "price_per_hour", f"gpus[{gi}]", 0.0, high=MAX_PRICE_PER_HOUR),
                placements=tuple(placements),
                key=None if key is None else names.clean_text(str(key), names.NAME_MAX),
            )
        )
    notes = data.get("notes", ())
    if not isinstance(notes, (list, tuple)) or len(notes) > 1000:
        raise check.fail("notes", "a list of up to 1000 strings", notes, where=source, error=ProblemError, fix=fix)
    return Plan(
        strategy=names.clean_text(str(data.get("strategy", "unknown")), 40),
        gpus=tuple(gpus),
        notes=tuple(names.clean_text(str(n), 2000) for n in notes),
        profiles=_profiles(data.get("profiles", {}), source, fix),
    )


#: A profile's digest as a plan records it (`interference.profile_io.profile_digest`: SHA-256, hex).
_DIGEST = re.compile(r"[0-9a-f]{64}")


def _profiles(value: Any, source: str, fix: str) -> tuple[tuple[str, str], ...]:
    """A plan's `profiles`: {GPU type: digest of the profile it was planned with} (absent in older plans)."""
    rule = "an object of GPU type names to profile digests (64 hex digits), at most 1000"
    if not isinstance(value, Mapping) or len(value) > 1000:
        raise check.fail("profiles", rule, value, where=source, error=ProblemError, fix=fix)
    out = []
    for gpu_type, digest in value.items():
        names.check_name(gpu_type, "a GPU type in 'profiles'", where=source, error=ProblemError)
        if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
            raise check.fail(f"profiles.{gpu_type}", rule, digest, where=source, error=ProblemError, fix=fix)
        out.append((gpu_type, digest))
    return tuple(out)
