"""The protocol-neutral control-plane service: what every gRPC handler calls.

State
- desired (persisted in `controller.store`): workloads, fitted profiles, the
  applied plans with their revision and GPU -> (node, device) bindings;
- actual (in memory, rebuilt from the agents): nodes with their devices, last
  heartbeat, what they run and the per-model figures they observe.

Reconcile (`reconcile`): observe (nodes, workloads, profiles) -> solve (the
pure solver, asked to keep the current placements: `solve(..., current=plan)`
with the applied plan restricted to healthy nodes) -> bind plan GPUs to node
devices (`controller.reconcile.bind_gpus`, stable) -> diff against the
applied cut -> act: store the new revision; each node receives its assignments
with its next heartbeat (agents poll). A reconcile whose inputs did not change
since the last one does nothing.

Nodes: a node missing heartbeats for `heartbeat_timeout_s` is marked lost and
its slots leave the inventory, so the next reconcile re-plans its workloads
onto the others. After a controller restart, the nodes of the applied plan
are "waiting" (their slots stay in the inventory) until they register again or
miss twice the heartbeat timeout, so a restart does not reshuffle anything.

Failures come back as constraints: when a node reports that every assignment
of one of its devices failed to start, that device leaves the inventory for
`failed_device_block_s` and the next solve places its workloads elsewhere; a
single failing assignment shows as state "failing" with the agent's error (the
agent retries it).

Errors: bad input raises `InvalidArgument(field, message)`; an unknown name
raises `NotFound`. Nothing here knows about gRPC. Time comes from the injected
`clock` (unix seconds).
"""
from __future__ import annotations

import collections
import json
import math
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Protocol, Sequence

from controller.assignment import ModelAssignment
from controller.reconcile import (NodeChange, bind_gpus, diff_assignments, node_assignments, slot_key, slot_keys,
                                  without_slots)
from controller.solver import GpuType, Plan, Problem, ProblemError, Workload, plan_from_dict, plan_to_dict, solve
from controller.store import Binding, ProfileRow, Store, StoredPlan
from interference.profile import PROFILE_FORMAT_VERSION, DeviceProfile
from interference.profile_io import ProfileFileError, profile_from_dict, profile_to_dict
from stoke.errors import StokeError

NAME_MAX = 128


class ServiceError(StokeError):
    pass


class InvalidArgument(ServiceError):
    """A request field is bad: `field` names it (e.g. ``workloads[1].slo_ms``)."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name}: {message}")
        self.field = field_name


class NotFound(ServiceError):
    pass


class FailedPrecondition(ServiceError):
    """The stored state cannot do what was asked (e.g. its workloads cannot be planned); the request was fine."""


def _unplannable(err: ProblemError) -> FailedPrecondition:
    return FailedPrecondition(f"the stored workloads cannot be planned: {err}")


# ---------------------------------------------------------------- node-side data


@dataclass(frozen=True)
class NodeDevice:
    index: int
    name: str
    kind: str                 # "gpu" | "cpu"
    memory_bytes: int = 0
    cores: int = 0
    gpu_type: str = ""        # "" = resolved by the controller (ServiceConfig.gpu_type_for)


@dataclass(frozen=True)
class Observation:
    """Per-assignment figures an agent scraped from Triton."""

    key: str
    model: str
    request_rate_rps: float = 0.0
    mean_batch: float = 0.0
    mean_queue_ms: float = 0.0
    mean_compute_ms: float = 0.0
    failures: int = 0
    success: int = 0
    endpoint: str = ""

    @property
    def latency_ms(self) -> float:
        return self.mean_queue_ms + self.mean_compute_ms

    @property
    def success_in_window(self) -> bool:
        return self.request_rate_rps > 0 or self.mean_compute_ms > 0


@dataclass(frozen=True)
class HeartbeatReport:
    node_id: str
    running: tuple[ModelAssignment, ...] = ()
    observed: tuple[Observation, ...] = ()
    events: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()
    applied_revision: int = 0
    errors_revision: int = 0          # the plan revision whose apply produced `errors`


@dataclass(frozen=True)
class HeartbeatAnswer:
    registered: bool
    revision: int = 0
    assignments: tuple[ModelAssignment, ...] = ()
    heartbeat_interval_s: float = 0.0


@dataclass
class NodeState:
    node_id: str
    devices: tuple[NodeDevice, ...]
    address: str = ""
    state: str = "ready"               # ready | lost | waiting
    last_heartbeat: float = 0.0
    running: tuple[ModelAssignment, ...] = ()
    observed: dict[str, Observation] = field(default_factory=dict)
    events: collections.deque = field(default_factory=lambda: collections.deque(maxlen=20))
    errors: tuple[str, ...] = ()
    applied_revision: int = 0
    blocked: dict[int, float] = field(default_factory=dict)   # device index -> blocked until (clock)
    registered: bool = True            # False while its devices are only known from the stored plan


@dataclass(frozen=True)
class NodeView:
    node_id: str
    devices: tuple[NodeDevice, ...]
    state: str
    last_heartbeat_unix: float
    seconds_since_heartbeat: float
    assigned: tuple[ModelAssignment, ...]
    running: tuple[ModelAssignment, ...]
    events: tuple[str, ...]
    address: str
    applied_revision: int


# ---------------------------------------------------------------- plans and status


@dataclass(frozen=True)
class PlanView:
    revision: int                          # 0: a preview, never applied
    plan: Plan
    bindings: tuple[Binding | None, ...]
    pending: tuple[tuple[str, str], ...]
    created_unix: float

    def to_dict(self) -> dict[str, Any]:
        data = plan_to_dict(self.plan)
        data["revision"] = self.revision
        data["created_unix"] = self.created_unix
        for g, b in zip(data["gpus"], self.bindings):
            g["node_id"] = b.node_id if b else None
            g["device"] = b.device if b else None
        data["pending"] = [{"workload": w, "reason": r} for w, r in self.pending]
        return data


@dataclass(frozen=True)
class ApplyOutcome:
    plan: PlanView
    changed: bool
    changes: tuple[NodeChange, ...]


@dataclass(frozen=True)
class ReplicaStatus:
    replica: int
    node_id: str
    device: int
    share_pct: float
    batch: int
    predicted_latency_ms: float
    serving: bool
    observed: Observation | None


@dataclass(frozen=True)
class WorkloadStatus:
    workload: Workload
    state: str                  # serving | starting | failing | pending | degraded
    reason: str
    replicas: tuple[ReplicaStatus, ...]
    predicted_latency_ms: float
    observed_latency_ms: float | None
    observed_rate_rps: float | None
    slo_attainment: float | None


@dataclass(frozen=True)
class ClusterStatus:
    revision: int
    workloads: tuple[WorkloadStatus, ...]
    gpus_in_use: int
    cost_per_hour: float
    nodes_ready: int
    nodes_lost: int
    last_error: str


# ---------------------------------------------------------------- configuration


@dataclass(frozen=True)
class GpuTypeConfig:
    name: str
    price_per_hour: float
    match: tuple[str, ...] = ()     # case-insensitive substrings of a device name that mean this type


@dataclass(frozen=True)
class ServiceConfig:
    heartbeat_interval_s: float = 2.0
    heartbeat_timeout_s: float = 10.0
    strategy: str = "stoke"
    gpu_types: tuple[GpuTypeConfig, ...] = (GpuTypeConfig("CPU", 0.10, ("cpu",)),)
    cpu_gpu_type: str = "CPU"       # the GPU type of CPU devices no `match` claims
    failed_device_block_s: float = 120.0   # a device where every assignment failed leaves the inventory this long

    def gpu_type_for(self, device: NodeDevice) -> str:
        if device.gpu_type:
            return device.gpu_type
        name = device.name.lower()
        for t in self.gpu_types:
            if any(m.lower() in name for m in t.match):
                return t.name
        if device.kind == "cpu":
            return self.cpu_gpu_type
        # an unconfigured GPU: its NVML name ("NVIDIA H200") made into a valid GPU type name ("NVIDIA-H200"),
        # so profiles and workloads can name it
        return "-".join(device.name.split()).replace("#", "-").replace(":", "-").replace("/", "-") or "gpu"

    def price(self, gpu_type: str) -> float:
        for t in self.gpu_types:
            if t.name == gpu_type:
                return t.price_per_hour
        return 0.0


class Observer(Protocol):
    """Receives durations and errors (the Prometheus metrics module implements it)."""

    def solved(self, seconds: float) -> None: ...
    def reconciled(self, seconds: float, error: bool) -> None: ...


class _NullObserver:
    def solved(self, seconds: float) -> None:
        pass

    def reconciled(self, seconds: float, error: bool) -> None:
        pass


Solver = Callable[..., Plan]


# ---------------------------------------------------------------- validation


def validate_name(value: Any, field_name: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidArgument(field_name, "must be a non-empty string")
    value = value.strip()
    # '#' separates a replica in assignment keys and ':' an error from its key in agent reports
    if len(value) > NAME_MAX or any(c.isspace() or c in "#:/\\" for c in value):
        raise InvalidArgument(field_name, f"{value!r} must be at most {NAME_MAX} characters without "
                                          f"spaces, '#', ':', '/' or '\\'")
    return value


def validate_positive(value: Any, field_name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise InvalidArgument(field_name, f"must be a positive number, got {value!r}")
    return float(value)


def validate_workload(fields: Mapping[str, Any], where: str) -> Workload:
    """A Workload from plain fields; raises InvalidArgument naming e.g. ``workloads[0].rate_rps``."""
    name = validate_name(fields.get("name"), f"{where}.name")
    model = validate_name(fields.get("model"), f"{where}.model")
    slo = validate_positive(fields.get("slo_ms"), f"{where}.slo_ms")
    rate = validate_positive(fields.get("rate_rps"), f"{where}.rate_rps")
    gpu_type = fields.get("gpu_type") or None
    if gpu_type is not None:
        gpu_type = validate_name(gpu_type, f"{where}.gpu_type")
    return Workload(name=name, model=model, slo_ms=slo, rate_rps=rate, gpu_type=gpu_type)


# ---------------------------------------------------------------- the service


class ControlService:
    def __init__(self, store: Store, config: ServiceConfig | None = None, *,
                 clock: Callable[[], float] = time.time, solver: Solver = solve,
                 observer: Observer | None = None) -> None:
        self.store = store
        self.config = config or ServiceConfig()
        self.clock = clock
        self._solver = solver
        self.observer: Observer = observer or _NullObserver()
        self._lock = threading.RLock()            # guards in-memory state
        self._reconcile_lock = threading.Lock()   # one reconcile at a time
        self._changed = threading.Event()
        self._nodes: dict[str, NodeState] = {}
        self._last_inputs: Any = None
        self._last_error = ""
        self._applied: StoredPlan | None = store.latest_plan()
        self._applied_plan: Plan = self._plan_of(self._applied)
        self._cut: dict[str, tuple[ModelAssignment, ...]] = self._cut_of(self._applied)
        self._profiles_version = 0
        self._profiles_cache: dict[str, DeviceProfile] = self._load_profiles()
        now = self.clock()
        if self._applied is not None:   # nodes of the applied plan: wait for them before re-planning
            for b in self._applied.bindings:
                if b is None:
                    continue
                node = self._nodes.setdefault(b.node_id, NodeState(b.node_id, (), state="waiting",
                                                                   last_heartbeat=now, registered=False))
                if all(d.index != b.device for d in node.devices):
                    node.devices = tuple(sorted(node.devices + (NodeDevice(b.device, b.gpu_type, "unknown",
                                                                           gpu_type=b.gpu_type),),
                                                key=lambda d: d.index))
        self._changed.set()

    # ------------------------------------------------------------ helpers

    @staticmethod
    def _plan_of(stored: StoredPlan | None) -> Plan:
        if stored is None:
            return Plan(strategy="none", gpus=())
        return plan_from_dict(stored.plan, f"plan revision {stored.revision}")

    def _cut_of(self, stored: StoredPlan | None) -> dict[str, tuple[ModelAssignment, ...]]:
        if stored is None:
            return {}
        return node_assignments(self._plan_of(stored), stored.bindings)

    def _load_profiles(self) -> dict[str, DeviceProfile]:
        out = {}
        for gpu_type, data in self.store.profile_dicts().items():
            if not data["models"]:
                continue
            out[gpu_type] = profile_from_dict({"format_version": PROFILE_FORMAT_VERSION, "gpu": data["gpu"], "models": data["models"]},
                                              f"stored profile {gpu_type}")
        return out

    def _mark_changed(self) -> None:
        self._changed.set()

    def wake(self) -> None:
        """Make the next `wait_for_change` return at once."""
        self._changed.set()

    def wait_for_change(self, timeout: float) -> bool:
        """Block until something changed that needs a reconcile (or timeout); clears the flag."""
        fired = self._changed.wait(timeout)
        self._changed.clear()
        return fired

    # ------------------------------------------------------------ workloads

    def apply_workloads(self, items: Sequence[Mapping[str, Any] | Workload]) -> tuple[list[str], list[str], list[str]]:
        """Create or update by name, all or nothing; returns (created, updated, unchanged)."""
        if not items:
            raise InvalidArgument("workloads", "give at least one workload")
        workloads, seen = [], set()
        profiles = self._profiles_cache
        known = sorted({m for p in profiles.values() for m in p.models})
        for i, item in enumerate(items):
            where = f"workloads[{i}]"
            if isinstance(item, Workload):
                item = {"name": item.name, "model": item.model, "slo_ms": item.slo_ms,
                        "rate_rps": item.rate_rps, "gpu_type": item.gpu_type}
            w = validate_workload(item, where)
            if w.name in seen:
                raise InvalidArgument(f"{where}.name", f"{w.name!r} appears twice in the request; keep one")
            seen.add(w.name)
            if w.model not in known:
                raise InvalidArgument(f"{where}.model", f"{w.model!r} has no fitted profile on this controller "
                                      f"(profiled: {', '.join(known) or 'none'}); upload one with "
                                      f"`stoke profiles upload FILE` or use a profiled model")
            if w.gpu_type is not None and w.gpu_type not in profiles:
                raise InvalidArgument(f"{where}.gpu_type", f"{w.gpu_type!r} has no profile "
                                      f"(known: {', '.join(sorted(profiles)) or 'none'}); drop it or use a "
                                      f"known GPU type")
            if w.gpu_type is not None and w.model not in profiles[w.gpu_type].models:
                raise InvalidArgument(f"{where}.gpu_type", f"{w.model!r} is not profiled on {w.gpu_type!r} "
                                      f"(profiled there: {', '.join(sorted(profiles[w.gpu_type].models))}); "
                                      f"upload its profile for that GPU type or drop gpu_type")
            workloads.append(w)
        result = self.store.upsert_workloads(workloads, self.clock())
        if result[0] or result[1]:
            self._mark_changed()
        return result

    def delete_workload(self, name: str) -> bool:
        name = validate_name(name, "name")
        deleted = self.store.delete_workload(name)
        if deleted:
            self._mark_changed()
        return deleted

    def list_workloads(self) -> tuple[Workload, ...]:
        return self.store.workloads()

    # ------------------------------------------------------------ profiles

    def upload_profile(self, profile_json: str, gpu_type: str = "") -> list[ProfileRow]:
        try:
            data = json.loads(profile_json)
        except (TypeError, json.JSONDecodeError) as err:
            raise InvalidArgument("profile_json", f"not valid JSON ({err}); send a fitted profile file") from None
        try:
            profile = profile_from_dict(data, "profile_json")
        except ProfileFileError as err:
            raise InvalidArgument("profile_json", str(err)) from None
        name = validate_name(gpu_type or profile.gpu.name, "gpu_type")
        stored = profile_to_dicts(profile)
        self.store.put_profile(name, stored["gpu"], stored["models"], self.clock())
        with self._lock:
            self._profiles_cache = self._load_profiles()
            self._profiles_version += 1
        self._mark_changed()
        return [r for r in self.store.profile_rows() if r.gpu_type == name]

    def list_profiles(self) -> list[ProfileRow]:
        return self.store.profile_rows()

    # ------------------------------------------------------------ nodes

    def register(self, node_id: str, devices: Sequence[NodeDevice], address: str = "") -> float:
        node_id = validate_name(node_id, "node_id")
        if not devices:
            raise InvalidArgument("devices", "report at least one device")
        indexes = [d.index for d in devices]
        if len(set(indexes)) != len(indexes) or min(indexes) < 0:
            raise InvalidArgument("devices", f"device indexes must be unique and >= 0, got {indexes}")
        resolved = tuple(sorted((replace(d, gpu_type=self.config.gpu_type_for(d)) for d in devices),
                                key=lambda d: d.index))
        with self._lock:
            node = self._nodes.get(node_id)
            if node is None:
                node = self._nodes[node_id] = NodeState(node_id, resolved)
                node.events.append(f"{_stamp(self.clock())} registered")
            else:
                if node.state != "ready":
                    node.events.append(f"{_stamp(self.clock())} back ({node.state} before)")
                node.devices = resolved
            node.address = address
            node.state = "ready"
            node.registered = True
            node.last_heartbeat = self.clock()
        self._mark_changed()
        return self.config.heartbeat_interval_s

    def heartbeat(self, report: HeartbeatReport) -> HeartbeatAnswer:
        now = self.clock()
        with self._lock:
            node = self._nodes.get(report.node_id)
            if node is None or not node.registered:
                # unknown, or only known from the stored plan (waiting, or lost after waiting):
                # the agent must register its real devices
                return HeartbeatAnswer(registered=False, heartbeat_interval_s=self.config.heartbeat_interval_s)
            if node.state == "lost":
                node.events.append(f"{_stamp(now)} back after being lost")
                node.state = "ready"
                self._mark_changed()
            node.last_heartbeat = now
            node.running = tuple(report.running)
            node.observed = {o.key: o for o in report.observed}
            for e in report.events:
                node.events.append(e)
            node.errors = tuple(report.errors)
            node.applied_revision = report.applied_revision
            revision = self._applied.revision if self._applied else 0
            if report.errors_revision == revision:
                # only errors of the current cut say something about its devices: errors of an
                # older revision would block the device a workload has just been moved to
                self._block_failed_devices(node, now)
            return HeartbeatAnswer(registered=True, revision=revision,
                                   assignments=self._cut.get(report.node_id, ()),
                                   heartbeat_interval_s=self.config.heartbeat_interval_s)

    def _block_failed_devices(self, node: NodeState, now: float) -> None:
        """Failures come back as constraints: a device where every assignment failed to start leaves the
        inventory for `failed_device_block_s`, so the next solve places its workloads elsewhere."""
        failed = {e.split(":", 1)[0].strip() for e in node.errors}
        by_device: dict[int, list[str]] = {}
        for a in self._cut.get(node.node_id, ()):
            by_device.setdefault(a.device, []).append(a.key)
        running = {a.key for a in node.running}
        for device, keys in by_device.items():
            if device in node.blocked or not keys:
                continue
            if all(k in failed and k not in running for k in keys):
                node.blocked[device] = now + self.config.failed_device_block_s
                node.events.append(f"{_stamp(now)} device {device} blocked for "
                                   f"{self.config.failed_device_block_s:g}s: all {len(keys)} assignment(s) failed "
                                   f"({'; '.join(e for e in node.errors)[:300]})")
                self._mark_changed()

    def errors_of(self, node_id: str) -> dict[str, str]:
        """{assignment key: error} the node reported for its last apply."""
        with self._lock:
            node = self._nodes.get(node_id)
            return {e.split(":", 1)[0].strip(): e for e in (node.errors if node else ())}

    def check_nodes(self) -> list[str]:
        """Mark nodes lost that missed heartbeats for the timeout; returns their ids."""
        now = self.clock()
        lost = []
        with self._lock:
            for node in self._nodes.values():
                # nodes known only from the stored plan (after a restart) get twice the timeout to come back
                limit = self.config.heartbeat_timeout_s * (2 if node.state == "waiting" else 1)
                if node.state != "lost" and now - node.last_heartbeat > limit:
                    node.state = "lost"
                    node.events.append(f"{_stamp(now)} lost: no heartbeat for "
                                       f"{now - node.last_heartbeat:.1f}s")
                    lost.append(node.node_id)
        if lost:
            self._mark_changed()
        return lost

    def list_nodes(self) -> list[NodeView]:
        now = self.clock()
        with self._lock:
            return [NodeView(node_id=n.node_id, devices=n.devices, state=n.state,
                             last_heartbeat_unix=n.last_heartbeat,
                             seconds_since_heartbeat=max(0.0, now - n.last_heartbeat),
                             assigned=self._cut.get(n.node_id, ()), running=n.running,
                             events=tuple(n.events), address=n.address, applied_revision=n.applied_revision)
                    for n in sorted(self._nodes.values(), key=lambda n: n.node_id)]

    def _healthy_slots(self) -> list[Binding]:
        with self._lock:
            now = self.clock()
            for n in self._nodes.values():
                for device, until in list(n.blocked.items()):
                    if until <= now:
                        del n.blocked[device]
                        n.events.append(f"{_stamp(now)} device {device} unblocked")
            return [Binding(n.node_id, d.index, d.gpu_type or self.config.gpu_type_for(d))
                    for n in self._nodes.values() if n.state in ("ready", "waiting") for d in n.devices
                    if d.index not in n.blocked]

    # ------------------------------------------------------------ plans

    def _observe(self) -> tuple[Any, ...]:
        """The inputs of a solve: (workloads, profiles, profiles version, healthy slots, applied plan)."""
        workloads = self.store.workloads()
        with self._lock:
            profiles = dict(self._profiles_cache)
            profiles_version = self._profiles_version
            applied = (self._applied, self._applied_plan)
        slots = tuple(sorted(self._healthy_slots(), key=lambda s: (s.node_id, s.device)))
        return workloads, profiles, profiles_version, slots, applied

    @staticmethod
    def _fingerprint(inputs: tuple[Any, ...]) -> Any:
        workloads, _, profiles_version, slots, (applied, _) = inputs
        return (workloads, profiles_version, slots, applied.revision if applied else 0)

    def _solve(self, inputs: tuple[Any, ...] | None = None) -> PlanView:
        """Solve the observed state; returns the plan view (revision 0, not applied)."""
        workloads, profiles, _, slots, (applied, applied_plan) = inputs or self._observe()
        counts = collections.Counter(s.gpu_type for s in slots)
        usable = {t: p for t, p in profiles.items() if counts.get(t)}
        pending: list[tuple[str, str]] = []
        schedulable = []
        for w in workloads:
            allowed = [w.gpu_type] if w.gpu_type else sorted(usable)
            if w.gpu_type and w.gpu_type not in usable:
                pending.append((w.name, f"no ready node has GPU type {w.gpu_type}" if w.gpu_type in profiles
                                else f"GPU type {w.gpu_type} has no profile"))
            elif not any(w.model in usable[t].models for t in allowed if t in usable):
                pending.append((w.name, f"no ready node has a GPU type profiled for model {w.model}"
                                if usable else "no ready node"))
            else:
                schedulable.append(w)
        plan = Plan(strategy=self.config.strategy, gpus=())
        if schedulable:
            kept_plan = without_slots(applied_plan, applied.bindings, slots)[0] if applied is not None else None
            bounded = tuple(GpuType(name=t, price_per_hour=self.config.price(t), profile=p, max_count=counts[t])
                            for t, p in sorted(usable.items()))
            unbounded = tuple(replace(g, max_count=None) for g in bounded)

            def run(ws: Sequence[Workload], inventory: tuple[GpuType, ...]) -> Plan:
                current = None
                if kept_plan is not None:
                    names = {w.name for w in ws}
                    gpus = tuple(replace(g, placements=tuple(p for p in g.placements if p.name in names))
                                 for g in kept_plan.gpus if g.gpu_type in usable)
                    current = Plan(strategy=kept_plan.strategy, gpus=tuple(g for g in gpus if g.placements),
                                   notes=kept_plan.notes)
                started = time.perf_counter()
                try:
                    return self._solver(Problem(tuple(ws), inventory), self.config.strategy, current=current)
                finally:
                    self.observer.solved(time.perf_counter() - started)

            try:
                plan = run(schedulable, bounded)
            except ProblemError:
                # Not enough devices: plan as if there were (the GPUs beyond the ready devices stay unbound
                # and their workloads pending); a workload infeasible on its own is pending with its reason.
                try:
                    plan = run(schedulable, unbounded)
                except ProblemError:
                    rest = []
                    for w in schedulable:
                        try:
                            run([w], unbounded)
                            rest.append(w)
                        except ProblemError as err:
                            pending.append((w.name, str(err)))
                    if len(rest) == len(schedulable):
                        raise
                    schedulable = rest
                    plan = run(rest, unbounded) if rest else plan
        previous = slot_keys(applied_plan, applied.bindings) if applied else {}
        bindings = bind_gpus(plan, slots, previous)
        # a GPU's identity is its slot: stored plans carry it, the next solve keeps it
        plan = replace(plan, gpus=tuple(replace(g, key=slot_key(b) if b else None)
                                        for g, b in zip(plan.gpus, bindings)))
        placed = {p.name for g, b in zip(plan.gpus, bindings) if b is not None for p in g.placements}
        for g, b in zip(plan.gpus, bindings):
            if b is None:
                for p in g.placements:
                    pending.append((p.name, f"no free {g.gpu_type} device on the ready nodes"))
        for w in schedulable:
            if w.name not in placed and all(w.name != name for name, _ in pending):
                pending.append((w.name, "the solver did not place it: " + ("; ".join(plan.notes) or "no reason given")))
        return PlanView(revision=0, plan=plan, bindings=bindings, pending=tuple(sorted(set(pending))),
                        created_unix=self.clock())

    def preview_plan(self) -> PlanView:
        """Solve against the current state without acting."""
        try:
            view = self._solve()
        except ProblemError as err:
            raise _unplannable(err) from None
        return view

    def current_plan(self) -> PlanView | None:
        with self._lock:
            a = self._applied
            if a is None:
                return None
            return PlanView(a.revision, self._applied_plan, a.bindings, a.pending, a.created_unix)

    def reconcile(self, force: bool = False) -> ApplyOutcome | None:
        """One observe -> solve -> diff -> act pass. Returns None when nothing needed doing."""
        with self._reconcile_lock:
            started = time.perf_counter()
            error = skipped = False
            fingerprint = None
            try:
                self.check_nodes()
                inputs = self._observe()
                fingerprint = self._fingerprint(inputs)
                if not force and fingerprint == self._last_inputs:
                    skipped = True
                    return None
                outcome = self._act(self._solve(inputs))
                # what was just solved, with the revision it produced (a change meanwhile triggers another pass)
                self._last_inputs = fingerprint[:3] + (outcome.plan.revision,)
                self._last_error = ""
                return outcome
            except ProblemError as err:
                error = True
                self._last_error = f"solve failed: {err}"
                self._last_inputs = fingerprint      # re-solve on the next change, not every tick
                raise
            except Exception as err:
                error = True
                self._last_error = f"reconcile failed: {type(err).__name__}: {err}"
                raise
            finally:
                if not skipped:      # passes with nothing to do are not timed
                    self.observer.reconciled(time.perf_counter() - started, error)

    def apply_plan(self) -> ApplyOutcome:
        try:
            outcome = self.reconcile(force=True)
        except ProblemError as err:
            raise _unplannable(err) from None
        assert outcome is not None
        return outcome

    def _act(self, view: PlanView) -> ApplyOutcome:
        applied = self._applied
        if applied is None and not view.plan.gpus and not view.pending:
            return ApplyOutcome(plan=view, changed=False, changes=())   # nothing to run, nothing to record
        if applied is not None:
            old = self.current_plan()
            assert old is not None
            if _signature(old) == _signature(view):   # same placements, bindings and pending: nothing to do
                return ApplyOutcome(plan=old, changed=False, changes=())
        cut = node_assignments(view.plan, view.bindings)
        changes = tuple(c for c in diff_assignments(self._cut, cut) if not c.empty)
        now = self.clock()
        revision = self.store.add_plan(plan_to_dict(view.plan), view.bindings, view.pending, now)
        stored = StoredPlan(revision, plan_to_dict(view.plan), view.bindings, view.pending, now)
        with self._lock:
            self._applied = stored
            self._applied_plan = view.plan
            self._cut = cut
        return ApplyOutcome(plan=replace(view, revision=revision, created_unix=now), changed=True, changes=changes)

    @property
    def last_error(self) -> str:
        return self._last_error

    # ------------------------------------------------------------ status

    def status(self) -> ClusterStatus:
        plan_view = self.current_plan()
        workloads = self.store.workloads()
        with self._lock:
            nodes = {n.node_id: n for n in self._nodes.values()}
            running = {(n.node_id, a.key): a for n in nodes.values() for a in n.running}
            errors = {(n.node_id, e.split(":", 1)[0].strip()): e for n in nodes.values() for e in n.errors}
            observed = {(n.node_id, k): o for n in nodes.values() for k, o in n.observed.items()}
        replicas: dict[str, list[ReplicaStatus]] = collections.defaultdict(list)
        pending: dict[str, str] = {}
        if plan_view is not None:
            pending = dict(plan_view.pending)
            for gpu, b in zip(plan_view.plan.gpus, plan_view.bindings):
                if b is None:
                    continue
                for p in gpu.placements:
                    key = f"{p.name}#{p.replica}"
                    want = (b.device, float(p.share_pct), int(p.batch), float(p.queue_delay_ms))
                    have = running.get((b.node_id, key))
                    serving = have is not None and (have.device, have.share_pct, have.batch,
                                                     have.queue_delay_ms) == want
                    replicas[p.name].append(ReplicaStatus(
                        replica=p.replica, node_id=b.node_id, device=b.device, share_pct=p.share_pct,
                        batch=p.batch, predicted_latency_ms=p.predicted_worst_ms, serving=serving,
                        observed=observed.get((b.node_id, key))))
        out = []
        for w in workloads:
            reps = tuple(sorted(replicas.get(w.name, ()), key=lambda r: r.replica))
            obs = [r.observed for r in reps if r.observed is not None]
            busy = [o for o in obs if o.success_in_window]     # latency is only known where requests came
            observed_latency = max((o.latency_ms for o in busy), default=None) if busy else None
            observed_rate = sum(o.request_rate_rps for o in obs) if obs else None
            attainment = (sum(1 for o in busy if o.latency_ms <= w.slo_ms) / len(busy)) if busy else None
            if not reps:
                state, reason = "pending", pending.get(w.name, "not planned yet")
            elif any(nodes.get(r.node_id) is None or nodes[r.node_id].state != "ready" for r in reps):
                state, reason = "degraded", "a node of this workload is not ready"
            elif w.name in pending:     # some replicas placed, the rest could not be
                state, reason = "degraded", pending[w.name]
            elif all(r.serving for r in reps):
                state, reason = "serving", ""
            elif failing := [errors[(r.node_id, f"{w.name}#{r.replica}")] for r in reps
                             if not r.serving and (r.node_id, f"{w.name}#{r.replica}") in errors]:
                state, reason = "failing", failing[0]
            else:
                state, reason = "starting", "the node has not reported the planned config yet"
            out.append(WorkloadStatus(workload=w, state=state, reason=reason, replicas=reps,
                                      predicted_latency_ms=max((r.predicted_latency_ms for r in reps), default=0.0),
                                      observed_latency_ms=observed_latency, observed_rate_rps=observed_rate,
                                      slo_attainment=attainment))
        plan = plan_view.plan if plan_view else Plan("none", ())
        bound = [g for g, b in zip(plan.gpus, plan_view.bindings) if b is not None] if plan_view else []
        return ClusterStatus(revision=plan_view.revision if plan_view else 0, workloads=tuple(out),
                             gpus_in_use=len(bound), cost_per_hour=sum(g.price_per_hour for g in bound),
                             nodes_ready=sum(1 for n in nodes.values() if n.state == "ready"),
                             nodes_lost=sum(1 for n in nodes.values() if n.state == "lost"),
                             last_error=self._last_error)


def profile_to_dicts(profile: DeviceProfile) -> dict[str, Any]:
    data = profile_to_dict(profile)
    return {"gpu": data["gpu"], "models": data["models"]}


def _signature(view: PlanView) -> Any:
    """What makes two plans the same for the nodes (notes and strategy text aside)."""
    data = view.to_dict()
    return (data["gpus"], data["pending"])


def _stamp(now: float) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(now))
