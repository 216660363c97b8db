"""The protocol-neutral control-plane service: what every gRPC handler calls. A thin facade.

State
- desired (persisted in `controller.store`): workloads, fitted profiles, the
  applied plans with their revision and GPU -> (node, device) bindings;
- actual (in memory, `controller.registry.NodeRegistry`, rebuilt from the
  agents): nodes with their devices, last heartbeat, what they run, the
  figures they observe and the assignments that failed.

The work is done by
- `NodeRegistry`: registration, heartbeats, lost nodes, blocked devices;
- `controller.reconcile.loop.Reconciler`: observe -> solve -> diff -> act,
  and the applied plan;
- `controller.status.cluster_status`: the pure status view.

This class checks requests (bad input raises `InvalidArgument` naming the
field; an unknown name `NotFound`) against the bounds of `controller.limits`,
keeps the fitted profiles, and wakes the reconcile loop on every change.
Nothing here knows about gRPC. Time comes from the injected `clock` (unix
seconds, for people) and `tick` (monotonic, for every duration: heartbeat
silence, device blocks, pauses).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from controller import limits
from controller.config import ServiceConfig
from controller.feedback import FeedbackLoop, LoopInput
from controller.identity import mint_agent_token
from controller.loop_output import NodeState
from controller.messages import (
    AssignmentError,
    FailedPrecondition,
    HeartbeatAnswer,
    HeartbeatReport,
    InvalidArgument,
    NodeDevice,
    NotFound,
    check_name,
    invalid,
)
from controller.observations import ObservationRecord
from controller.profiles import ProfileBook
from controller.reconcile.loop import ApplyOutcome, Observer, Reconciler, Solver
from controller.reconcile.planning import PlanView
from controller.registry import NodeRegistry, NodeView, stamp
from controller.status import ClusterStatus, cluster_status
from controller.store import ProfileRow, ProfileVersionRow, Store
from controller.verification import VerifyBeforeServing
from foundation import validate as check
from interference.latency import predict_gpu
from interference.profile import DeviceProfile
from interference.profile_io import ProfileFileError, parse_profile_json, profile_from_dict
from planner.solver import ProblemError, Workload, solve

log = logging.getLogger("stoke.controller.service")

#: A ready node silent for this many heartbeat intervals is "unconfirmed" in the status view until it is judged.
UNCONFIRMED_INTERVALS = 2.5
#: Most observation windows one listing returns; closed-loop events `status` shows.
MAX_OBSERVATIONS_LISTED = 10000
STATUS_EVENTS = 12


def _unplannable(err: ProblemError) -> FailedPrecondition:
    return FailedPrecondition(f"the stored workloads cannot be planned: {err}")


def validate_workload(fields: Mapping[str, Any], where: str, initial_rps: float = 1.0) -> Workload:
    """A Workload from plain fields; raises InvalidArgument naming e.g. ``workloads[0].rate_rps``.

    ``rate_rps: "auto"`` (with optional min_rps / max_rps) asks for demand tracking; the workload then
    starts at min_rps, else `initial_rps` (within max_rps)."""
    gpu_type = fields.get("gpu_type") or None
    auto = fields.get("rate_rps") == "auto"
    bounds = {}
    for key in ("min_rps", "max_rps"):
        value = fields.get(key)
        if value is not None and not auto:
            raise invalid(f"{where}.{key}", "applies to rate_rps: auto only; drop it or set rate_rps: auto")
        bounds[key] = (
            None
            if value is None
            else check.positive(value, f"{where}.{key}", error=InvalidArgument, maximum=limits.MAX_RATE_RPS)
        )
    if bounds["min_rps"] is not None and bounds["max_rps"] is not None and bounds["min_rps"] > bounds["max_rps"]:
        raise invalid(f"{where}.min_rps", f"{bounds['min_rps']:g} is above max_rps {bounds['max_rps']:g}")
    if auto:
        rate = bounds["min_rps"] or min(initial_rps, bounds["max_rps"] or initial_rps)
    else:
        rate = check.positive(
            fields.get("rate_rps"),
            f"{where}.rate_rps",
            error=InvalidArgument,
            maximum=limits.MAX_RATE_RPS,
            fix="split a larger service into several workloads",
        )
    return Workload(
        name=check_name(fields.get("name"), f"{where}.name"),
        model=check_name(fields.get("model"), f"{where}.model"),
        slo_ms=check.positive(
            fields.get("slo_ms"), f"{where}.slo_ms", error=InvalidArgument, maximum=limits.MAX_SLO_MS
        ),
        rate_rps=rate,
        gpu_type=None if gpu_type is None else check_name(gpu_type, f"{where}.gpu_type"),
        rate_auto=auto,
        min_rps=bounds["min_rps"],
        max_rps=bounds["max_rps"],
        arrivals=check.one_of(
            fields.get("arrivals") or "poisson", f"{where}.arrivals", ("poisson", "constant"), error=InvalidArgument
        ),
    )


class ControlService:
    def __init__(
        self,
        store: Store,
        config: ServiceConfig | None = None,
        *,
        clock: Callable[[], float] = time.time,
        tick: Callable[[], float] = time.monotonic,
        solver: Solver = solve,
        observer: Observer | None = None,
    ) -> None:
        self.store = store
        self.config = config or ServiceConfig()
        self.clock = clock
        self._changed = threading.Event()
        self.profiles = ProfileBook(store, measured_points=self.config.verification.enabled)
        self.nodes = NodeRegistry(self.config, clock, self.wake, tick)
        self.agent_key = store.agent_key()
        self._generations = store.token_generations()
        self._generations_lock = threading.Lock()
        self.feedback = FeedbackLoop(
            store,
            self.profiles,
            self.config,
            clock=clock,
            wake=self.wake,
            gpu_types_of=self.nodes.gpu_types_of,
        )
        self.verifier = VerifyBeforeServing(self.config.verification)
        self.reconciler = Reconciler(
            store,
            self.nodes,
            self.profiles,
            self.config,
            clock=clock,
            solver=solver,
            observer=observer,
            verifier=self.verifier,
        )
        applied = self.reconciler.applied
        if applied is not None:  # nodes of the applied plan: wait for them before re-planning
            self.nodes.restore(applied.bindings)
        self._changed.set()

    @property
    def observer(self) -> Observer:
        return self.reconciler.observer

    @observer.setter
    def observer(self, observer: Observer) -> None:
        self.reconciler.observer = observer

    def wake(self) -> None:
        """Something changed that needs a reconcile: make the next `wait_for_change` return at once."""
        self._changed.set()

    def wait_for_change(self, timeout: float) -> bool:
        """Block until something changed that needs a reconcile (or timeout); clears the flag."""
        fired = self._changed.wait(timeout)
        self._changed.clear()
        return fired

    # ------------------------------------------------------------ workloads

    def apply_workloads(
        self, items: Sequence[Mapping[str, Any] | Workload], *, dry_run: bool = False
    ) -> tuple[list[str], list[str], list[str]]:
        """Create or update by name, all or nothing; returns (created, updated, unchanged). `dry_run`: store nothing."""
        if not items:
            raise invalid("workloads", "give at least one workload")
        if len(items) > limits.MAX_WORKLOADS_PER_APPLY:
            raise invalid(
                "workloads", f"at most {limits.MAX_WORKLOADS_PER_APPLY} per apply, got {len(items)}; apply in parts"
            )
        profiles, _ = self.profiles.snapshot()
        workloads: list[Workload] = []
        seen: set[str] = set()
        for i, item in enumerate(items):
            w = self._checked_workload(item, f"workloads[{i}]", profiles, self.config.demand.initial_rps)
            if w.name in seen:
                raise invalid(f"workloads[{i}].name", f"{w.name!r} appears twice in the request; keep one")
            seen.add(w.name)
            workloads.append(w)
        for i, w in enumerate(workloads):
            self._check_slo_reachable(w, f"workloads[{i}]", profiles)
        result = self.store.upsert_workloads(workloads, self.clock(), dry_run=dry_run)
        if (result[0] or result[1]) and not dry_run:
            self.wake()
        return result

    @staticmethod
    def _checked_workload(
        item: Mapping[str, Any] | Workload, where: str, profiles: Mapping[str, DeviceProfile], initial_rps: float = 1.0
    ) -> Workload:
        """The workload, checked on its own and against the fitted profiles."""
        if isinstance(item, Workload):
            item = {
                "name": item.name,
                "model": item.model,
                "slo_ms": item.slo_ms,
                "rate_rps": "auto" if item.rate_auto else item.rate_rps,
                "gpu_type": item.gpu_type,
                "arrivals": item.arrivals,
                **({"min_rps": item.min_rps, "max_rps": item.max_rps} if item.rate_auto else {}),
            }
        w = validate_workload(item, where, initial_rps)
        known = sorted({m for p in profiles.values() for m in p.models})
        if w.model not in known:
            raise invalid(
                f"{where}.model",
                f"{w.model!r} has no fitted profile on this controller (profiled: "
                f"{', '.join(known) or 'none'}); upload one with "
                f"`stoke profiles upload FILE` or use a profiled model",
            )
        if w.gpu_type is not None and w.gpu_type not in profiles:
            raise invalid(
                f"{where}.gpu_type",
                f"{w.gpu_type!r} has no profile (known: "
                f"{', '.join(sorted(profiles)) or 'none'}); drop it or use a known "
                f"GPU type",
            )
        if w.gpu_type is not None and w.model not in profiles[w.gpu_type].models:
            raise invalid(
                f"{where}.gpu_type",
                f"{w.model!r} is not profiled on {w.gpu_type!r} (profiled there: "
                f"{', '.join(sorted(profiles[w.gpu_type].models))}); upload its "
                f"profile for that GPU type or drop gpu_type",
            )
        return w

    @staticmethod
    def _check_slo_reachable(w: Workload, where: str, profiles: Mapping[str, DeviceProfile]) -> None:
        """Refuse an SLO below the model's fastest inference on every profiled GPU type it may use (batch 1,
        the whole device, alone): `stoke plan` refuses it with the same words, so `apply --dry-run` and
        `apply` refuse it too instead of storing a workload that can only be pending. Only this certain,
        cheap case (one prediction per type); what needs a solve (queueing at the rate, replica limits)
        stays with the budgeted solver and shows as pending with its reason."""
        floors = {
            t: predict_gpu(p, [(w.model, 1, 100.0)])[0].latency_ms
            for t, p in sorted(profiles.items())
            if w.model in p.models and w.gpu_type in (None, t)
        }
        if floors and all(floor > w.slo_ms for floor in floors.values()):
            t, floor = min(floors.items(), key=lambda item: item[1])
            raise invalid(
                f"{where}.slo_ms",
                f"workload {w.name!r} cannot meet its SLO of {w.slo_ms:g} ms on a {t}: model {w.model!r} needs "
                f"at least {floor:.2f} ms per inference even alone (batch 1, 100%); relax the SLO or use a "
                f"faster GPU type (`stoke plan` refuses it too)",
            )

    def delete_workload(self, name: str) -> bool:
        try:
            name = check_name(name, "name")
        except InvalidArgument:
            # a row stored by an older version under a name today's rule refuses can still be deleted by it
            if not (isinstance(name, str) and len(name) <= 65536 and self.store.has_workload(name)):
                raise
        deleted = self.store.delete_workload(name)
        if deleted:
            self.wake()
        return deleted

    def list_workloads(self) -> tuple[Workload, ...]:
        return self.store.workloads()

    # ------------------------------------------------------------ profiles

    def upload_profile(self, profile_json: str, gpu_type: str = "") -> list[ProfileRow]:
        size = len(profile_json.encode("utf-8", "surrogatepass"))
        if size > limits.MAX_PROFILE_BYTES:
            raise invalid("profile_json", f"{size} bytes, more than the {limits.MAX_PROFILE_BYTES} allowed")
        try:
            # errors name the field themselves ("profile_json: ..."): not prefixed again
            profile = profile_from_dict(parse_profile_json(profile_json, "profile_json"), "profile_json")
        except ProfileFileError as err:
            raise InvalidArgument(str(err), "profile_json") from None
        name = check_name(gpu_type or profile.gpu.name, "gpu_type" if gpu_type else "profile_json: gpu.name")
        self.profiles.put(name, profile, self.clock())
        for model in profile.models:  # estimates under the old coefficients confirm nothing under the new
            self.feedback.reset(name, model)
        self.wake()
        return [r for r in self.store.profile_rows() if r.gpu_type == name]

    def list_profiles(self) -> list[ProfileRow]:
        return self.store.profile_rows()

    def profile_versions(self, model: str = "") -> list[ProfileVersionRow]:
        return self.store.profile_versions(check_name(model, "model") if model else "")

    def rollback_profile(
        self, model: str, gpu_type: str = "", version: int = 0, resume: bool = False
    ) -> list[ProfileRow]:
        """Make `version` of (GPU type, model) active and pin it (0: the fitted profile); `resume`: unpin
        instead, so recalibration goes on. Returns the pair's row."""
        model = check_name(model, "model")
        rows = [r for r in self.store.profile_rows() if r.model == model]
        if gpu_type:
            rows = [r for r in rows if r.gpu_type == check_name(gpu_type, "gpu_type")]
        if len(rows) != 1:
            known = ", ".join(f"{r.model}/{r.gpu_type}" for r in self.store.profile_rows()) or "none"
            if len(rows) > 1:
                raise NotFound(f"{model!r} has a profile on several GPU types; give --gpu-type (profiled: {known})")
            where = f" on {gpu_type!r}" if gpu_type else ""
            raise NotFound(f"{model!r} has no profile{where}; profiled: {known} (`stoke profiles ls`)")
        row = rows[0]
        if version < 0:
            raise invalid("version", f"must be >= 0, got {version}")
        if resume and not row.pinned:  # nothing to resume: no event, no reset of the loop's pending confirmations
            return rows
        try:
            if resume:
                self.store.set_profile_state(row.gpu_type, model, row.active_version, False)
            else:
                self.store.set_profile_state(row.gpu_type, model, version, True)
        except KeyError:
            have = [0, *(v.version for v in self.store.profile_versions(model) if v.gpu_type == row.gpu_type)]
            listed = ", ".join(f"v{v}" for v in have).replace("v0", "v0 (the fitted profile)")
            raise NotFound(f"{model}/{row.gpu_type} has no version {version}; its versions: {listed}") from None
        self.feedback.reset(row.gpu_type, model)
        what = "recalibration resumed" if resume else f"rolled back to v{version} (pinned)"
        self.store.add_event("rollback", "", f"{model} on {row.gpu_type}: {what}", self.clock())
        self.profiles.reload()
        self.wake()
        return [r for r in self.store.profile_rows() if (r.gpu_type, r.model) == (row.gpu_type, model)]

    # ------------------------------------------------------------ observations

    def list_observations(self, workload: str = "", limit: int = 100) -> list[ObservationRecord]:
        """Stored windows, newest first (at most 10,000)."""
        if not 0 <= limit <= MAX_OBSERVATIONS_LISTED:
            raise invalid("limit", f"must be in 0..{MAX_OBSERVATIONS_LISTED}, got {limit}")
        return self.store.observations(check_name(workload, "workload") if workload else "", limit or 100)

    # ------------------------------------------------------------ nodes

    def register(self, node_id: str, devices: Sequence[NodeDevice], address: str = "") -> float:
        node_id = check_name(node_id, "node_id")
        limits.check_devices(devices)
        limits.check_address(address)
        self.nodes.register(node_id, devices, address)
        return self.config.heartbeat_interval_s

    def heartbeat(self, report: HeartbeatReport) -> HeartbeatAnswer:
        check_name(report.node_id, "node_id")
        limits.check_report(report)
        revision, assigned, planned_at = self.reconciler.assigned_to(report.node_id)
        interval = self.config.heartbeat_interval_s
        # windows count only for this node's own replicas, at most a bound over their planned rates
        # (`limits.admit_observations`): checked here, before the registry and the closed loop see them
        observed, refused = limits.admit_observations(report.observed, assigned)
        if refused:
            report = replace(
                report,
                observed=observed,
                events=(
                    *report.events,
                    f"controller: {len(refused)} window(s) not counted: {'; '.join(refused[:3])}"[
                        : limits.MAX_EVENT_CHARS
                    ],
                )[-limits.MAX_EVENTS :],
            )
        if not self.nodes.heartbeat(report, revision, assigned):
            # unknown, or only known from the stored plan (waiting, or lost after waiting):
            # the agent must register its real devices
            return HeartbeatAnswer(registered=False, heartbeat_interval_s=interval)
        if refused:  # logged once the heartbeat is taken: a refused flood or replay must not flood the log
            log.warning("heartbeat of %s: %d window(s) not counted: %s", report.node_id, len(refused), refused[0])
        try:
            self.feedback.observe(report)  # the closed loop: store the windows; its next tick decides
        except Exception:  # a failing loop step must not cost the node its heartbeat (logged with its traceback)
            log.exception("recording the observations of %s failed", report.node_id)
        if report.measured:
            try:
                self._take_measured(report)
            except Exception:  # the store failing must not cost the node its heartbeat; it reports them again
                log.exception("recording the points %s measured failed", report.node_id)
        if self.nodes.awaiting_plan(report.node_id, planned_at):
            # back after being lost: its part of the plan was cut while it was away; keep what runs
            self.wake()
            return HeartbeatAnswer(registered=True, revision=revision, hold=True, heartbeat_interval_s=interval)
        return HeartbeatAnswer(
            registered=True,
            revision=revision,
            assignments=assigned,
            heartbeat_interval_s=interval,
            measure=self.verifier.requests_for(report.node_id),
        )

    def _take_measured(self, report: HeartbeatReport) -> None:
        """Verify before serving: the points this node measured join the profiles (stored first, so a restart
        loses none), and the next pass re-plans on them; what was given up is an event."""
        profiles, _ = self.profiles.snapshot()
        now = self.clock()
        accepted = self.verifier.take(report.node_id, report.measured, profiles, now)
        if accepted:
            # either raising before `recorded` leaves them asked: the node reports them again, none is lost
            self.store.add_measured_points(accepted, now)
            self.profiles.reload()
            self.verifier.recorded(accepted)  # bumps its version: the next pass re-plans on them
            models = sorted({f"{model} on {gpu_type}" for gpu_type, model, *_ in accepted})
            self.store.add_event(
                "verify", "", f"{report.node_id} measured {len(accepted)} point(s) of {', '.join(models)}", now
            )
        given_up = self.reconciler.record_verification_events()
        if accepted or given_up:
            self.wake()

    def errors_of(self, node_id: str) -> dict[str, AssignmentError]:
        """{assignment key: error} the node reported for its last apply."""
        return self.nodes.errors_of(node_id)

    def check_nodes(self) -> list[str]:
        """Mark nodes lost that missed heartbeats for the timeout; returns their ids."""
        return self.nodes.check_nodes()

    def list_nodes(self) -> list[NodeView]:
        return self.nodes.views(self.reconciler.cut())

    # ------------------------------------------------------------ agent credentials

    def mint_agent_token(self, node_id: str) -> tuple[str, str, int]:
        """(token, node id, generation): a new token for the node's agent; the node's previous one stops working."""
        node_id = check_name(node_id, "node_id")
        generation = self.store.next_token_generation(node_id, self.clock())
        with self._generations_lock:
            self._generations[node_id] = generation
        return mint_agent_token(self.agent_key, node_id, generation), node_id, generation

    def token_generation(self, node_id: str) -> int:
        """The node's current agent token generation (0: none minted)."""
        with self._generations_lock:
            return self._generations.get(node_id, 0)

    # ------------------------------------------------------------ plans

    def preview_plan(self) -> PlanView:
        """Solve against the current state without acting."""
        try:
            return self.reconciler.solve()
        except ProblemError as err:
            raise _unplannable(err) from None

    def current_plan(self) -> PlanView | None:
        return self.reconciler.applied

    def reconcile(self, force: bool = False) -> ApplyOutcome | None:
        """One tick of the closed loop (its one entry: windows -> guard, demand, recalibration -> floors),
        then one observe -> solve -> diff -> act pass that reads its output (see `controller.reconcile.loop`);
        None: nothing to do."""
        floors = self._loop_tick()
        return self.reconciler.reconcile(force, floors=floors)

    def apply_plan(self) -> ApplyOutcome:
        floors = self._loop_tick()
        try:
            outcome = self.reconciler.reconcile(force=True, floors=floors)
        except ProblemError as err:
            raise _unplannable(err) from None
        assert outcome is not None
        return outcome

    def _loop_tick(self) -> tuple[tuple[str, float], ...]:
        self.nodes.check_nodes()
        quiet_s = UNCONFIRMED_INTERVALS * self.config.heartbeat_interval_s
        nodes = tuple(
            NodeState(
                n.node_id, "unconfirmed" if n.state == "ready" and n.seconds_since_heartbeat > quiet_s else n.state
            )
            for n in self.nodes.views({})
        )
        inp = LoopInput(self.reconciler.applied, nodes, self.reconciler.floors_refused)
        self.reconciler.floors_refused = ()  # reported once
        try:
            return self.feedback.step(inp).floors
        except Exception:  # a failing loop tick must not stop the reconcile pass: the last floors stand (logged)
            log.exception("the closed loop's tick failed")
            return self.reconciler.floors

    @property
    def last_error(self) -> str:
        return self.reconciler.last_error

    # ------------------------------------------------------------ status

    def status(self) -> ClusterStatus:
        applied = self.reconciler.applied
        events = [f"{stamp(e.unix)} {e.kind}: {e.text}" for e in self.store.events(STATUS_EVENTS)]
        return cluster_status(
            applied,
            self.store.workloads(),
            self.list_nodes(),
            self.reconciler.last_error,
            self.nodes.alerts()
            + self.feedback.output.alerts
            + self.verifier.alerts(self.clock())
            + self.profiles.alerts(),
            feedback=self.feedback.workload_feedback(),
            loop_events=events,
            unconfirmed_after_s=UNCONFIRMED_INTERVALS * self.config.heartbeat_interval_s,
            verifying=self.verifier.holding(),
        )
