"""The controller's actual state: the nodes, rebuilt from what their agents report. In memory only.

A node registers with its devices and then heartbeats with what it runs, the
figures it observes and the assignments that failed. A node missing
heartbeats for `heartbeat_timeout_s` is marked lost and its slots leave the
inventory (`healthy_slots`), so the next reconcile re-plans its workloads
onto the others. After a controller restart the nodes of the applied plan
are "waiting" (`restore`: their slots stay in the inventory) until they
register again or miss twice the heartbeat timeout, so a restart does not
reshuffle anything.

Silence is measured on the monotonic `tick` clock (a wall-clock step changes
nothing), and only while this controller runs: `watch_clock` notices when the
process itself did not run for longer than `pause_threshold_s` (SIGSTOP, a
suspended VM, a stalled loop) and silence then counts from the moment it
resumed, so a paused controller never concludes that its nodes died. When
more than `partition_fraction` of the nodes fall silent at once (past the
timeout, or missing their last two heartbeats when the first one is), a
controller-side or network fault is far likelier than that many node
failures: they are marked "silent", their slots stay in the inventory (the
plan is held) and `alerts()` says so; they become lost only once the silent
share drops to the fraction or below. A node that comes back after being lost
is held (`awaiting_plan`: its heartbeat answer says "keep what you run")
until a reconcile pass that observed it back has planned, so it never
receives a cut that was made while it was away (`returns` counts the
returns, so the order of a return and a pass's observation is exact).

Failures come back as constraints: when a node reports that every
assignment of one of its devices failed to start, that device leaves the
inventory for `failed_device_block_s` and the next solve places its
workloads elsewhere.

Every change that needs a reconcile calls `on_change`. Thread-safe.
"""

from __future__ import annotations

import collections
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from controller.config import ServiceConfig
from controller.messages import (
    AssignmentError,
    FailedPrecondition,
    HeartbeatReport,
    ModelAssignment,
    NodeDevice,
    Observation,
    ResourceExhausted,
    ServingEndpoint,
)
from controller.reconcile.slots import Binding

#: Heartbeats one node may send in a burst, and how many per heartbeat interval on average: an honest agent
#: sends one per interval; more is a bug or an attack, refused (RESOURCE_EXHAUSTED) before anything is stored.
HEARTBEAT_BURST = 10
HEARTBEATS_PER_INTERVAL = 4.0
#: Agent incarnations remembered per node for replay checks (the newest ones).
KEEP_INCARNATIONS = 8

log = logging.getLogger("stoke.controller.nodes")


@dataclass
class NodeState:
    node_id: str
    devices: tuple[NodeDevice, ...]
    address: str = ""
    state: str = "ready"  # ready | lost | waiting | silent
    last_heartbeat: float = 0.0  # wall clock (unix), for people
    last_seen: float = 0.0  # tick (monotonic) of the last heartbeat or registration: liveness
    returned_at: int = 0  # `NodeRegistry.returns` count when it came back after being lost (0: never)
    running: tuple[ModelAssignment, ...] = ()
    observed: dict[str, Observation] = field(default_factory=dict)
    endpoints: dict[str, ServingEndpoint] = field(default_factory=dict)
    events: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=20))
    errors: tuple[AssignmentError, ...] = ()
    applied_revision: int = 0
    blocked: dict[int, float] = field(default_factory=dict)  # device index -> blocked until (tick)
    registered: bool = True  # False while its devices are only known from the stored plan
    # replay protection (see `HeartbeatReport.sequence`): the incarnation heartbeating since the last
    # registration ("" = none yet), the last sequence taken per recent incarnation, and whether the node
    # ever numbered its heartbeats (then unnumbered ones are refused)
    incarnation: str = ""
    sequences: dict[str, int] = field(default_factory=dict)
    numbered: bool = False
    # rate limit: a token bucket (tokens left, tick of the last refill)
    bucket: float = float(HEARTBEAT_BURST)
    bucket_at: float = 0.0


@dataclass(frozen=True)
class NodeView:
    """A node as the API and the status view see it (a snapshot)."""

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
    errors: tuple[AssignmentError, ...] = ()
    observed: Mapping[str, Observation] = field(default_factory=dict)
    endpoints: Mapping[str, ServingEndpoint] = field(default_factory=dict)


def stamp(now: float) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(now))


class NodeRegistry:
    def __init__(
        self,
        config: ServiceConfig,
        clock: Callable[[], float],
        on_change: Callable[[], None],
        tick: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.clock = clock  # wall clock (unix seconds): what people read
        self.tick = tick  # monotonic: every duration (silence, blocks, pauses)
        self._on_change = on_change
        self._lock = threading.Lock()
        self._nodes: dict[str, NodeState] = {}
        self._last_tick: float | None = None
        self.resumed_at = -math.inf  # tick at which this process last resumed after a pause
        self.returns = 0  # counts nodes coming back after being lost (orders returns against plans)
        self._hold = ""  # why the plan is held ("" = not held)

    @property
    def pause_threshold_s(self) -> float:
        """A gap between two clock watches longer than this means the controller did not run.

        Half the slack between timeout and interval, at most one interval: a pause too short to be
        noticed cannot make a node look silent for the timeout on its own."""
        c = self.config
        return min(c.heartbeat_interval_s, (c.heartbeat_timeout_s - c.heartbeat_interval_s) / 2)

    def watch_clock(self) -> float:
        """One tick of the pause watch (the server calls it often; `check_nodes` too); returns the gap."""
        now = self.tick()
        with self._lock:
            gap = 0.0 if self._last_tick is None else now - self._last_tick
            self._last_tick = now
            if gap <= self.pause_threshold_s:
                return gap
            self.resumed_at = now
            for node in self._nodes.values():
                node.events.append(f"{stamp(self.clock())} controller resumed after {gap:.1f}s not running")
        log.warning(
            "this controller did not run for %.1fs (paused, suspended or stalled); silence of the nodes "
            "counts from now, none is marked lost for it",
            gap,
        )
        return gap

    def restore(self, bindings: Iterable[Binding | None]) -> None:
        """The nodes of the applied plan, after a restart: waiting for them before re-planning."""
        now, seen = self.clock(), self.tick()
        with self._lock:
            for b in bindings:
                if b is None:
                    continue
                node = self._nodes.setdefault(
                    b.node_id,
                    NodeState(b.node_id, (), state="waiting", last_heartbeat=now, last_seen=seen, registered=False),
                )
                if all(d.index != b.device for d in node.devices):
                    device = NodeDevice(b.device, b.gpu_type, "unknown", gpu_type=b.gpu_type)
                    node.devices = tuple(sorted(node.devices + (device,), key=lambda d: d.index))

    def register(self, node_id: str, devices: Sequence[NodeDevice], address: str = "") -> None:
        """A node (back) with its devices; each device's GPU type is resolved by the config."""
        resolved = tuple(
            sorted((replace(d, gpu_type=self.config.gpu_type_for(d)) for d in devices), key=lambda d: d.index)
        )
        now, seen = self.clock(), self.tick()
        with self._lock:
            node = self._nodes.get(node_id)
            if node is None:
                node = self._nodes[node_id] = NodeState(node_id, resolved)
                node.events.append(f"{stamp(now)} registered")
            else:
                if node.state != "ready":
                    node.events.append(f"{stamp(now)} back ({node.state} before)")
                if node.state == "lost":
                    self.returns += 1
                    node.returned_at = self.returns
                node.devices = resolved
                # a registering agent is a new process: what its predecessor reported running (and
                # serving on) is unknown until it reports, so status must not call it serving meanwhile
                node.running, node.endpoints, node.observed, node.errors = (), {}, {}, ()
            node.address = address
            node.state = "ready"
            node.registered = True
            node.incarnation = ""  # the next numbered heartbeat binds the (new) agent process
            node.last_heartbeat, node.last_seen = now, seen
        self._on_change()

    def heartbeat(self, report: HeartbeatReport, revision: int, assigned: Sequence[ModelAssignment]) -> bool:
        """Record a report; False when the node must register (unknown, or known only from the stored plan).

        `revision` and `assigned` are the applied plan's revision and this node's part of it."""
        now, seen = self.clock(), self.tick()
        with self._lock:
            node = self._nodes.get(report.node_id)
            if node is None or not node.registered:
                return False
            self._admit(node, report, seen)
            if node.state == "lost":
                node.events.append(f"{stamp(now)} back after being lost; held until the next plan")
                node.state = "ready"
                self.returns += 1
                node.returned_at = self.returns
                self._on_change()
            elif node.state == "silent":
                node.events.append(f"{stamp(now)} heard again after {seen - node.last_seen:.1f}s silent")
                node.state = "ready"
            node.last_heartbeat, node.last_seen = now, seen
            node.running = tuple(report.running)
            node.observed = {o.key: o for o in report.observed}
            node.endpoints = {e.key: e for e in report.endpoints}
            node.events.extend(report.events)
            node.errors = tuple(report.errors)
            node.applied_revision = report.applied_revision
            if report.errors_revision == revision:
                # only errors of the current cut say something about its devices: errors of an
                # older revision would block the device a workload has just been moved to
                self._block_failed_devices(node, assigned, seen)
            return True

    def _admit(self, node: NodeState, report: HeartbeatReport, seen: float) -> None:
        """Refuse a heartbeat over the node's rate limit (`ResourceExhausted`) or replayed / out of order
        (`FailedPrecondition`), before it changes anything; records its sequence when it passes."""
        rate = HEARTBEATS_PER_INTERVAL / self.config.heartbeat_interval_s
        node.bucket = min(float(HEARTBEAT_BURST), node.bucket + max(0.0, seen - node.bucket_at) * rate)
        node.bucket_at = seen
        if node.bucket < 1.0:
            raise ResourceExhausted(
                f"node {node.node_id}: more than {HEARTBEATS_PER_INTERVAL:g} heartbeats per interval "
                f"({self.config.heartbeat_interval_s:g}s); slow down"
            )
        node.bucket -= 1.0
        where = f"heartbeat of node {node.node_id}"
        if not report.sequence:
            if node.numbered:
                raise FailedPrecondition(
                    f"{where} refused: it is not numbered but this node's agent numbers its heartbeats (a replay "
                    f"of an old one, or an agent older than the controller: upgrade it)"
                )
            return
        last = node.sequences.get(report.incarnation)
        if node.incarnation and report.incarnation != node.incarnation:
            raise FailedPrecondition(
                f"{where} refused: it comes from agent process {report.incarnation[:16]}, not the one registered "
                f"({node.incarnation[:16]}): a replay, or two agents running with this node's token"
            )
        if last is not None and report.sequence <= last:
            raise FailedPrecondition(
                f"{where} refused: sequence {report.sequence} is not above the last one taken ({last}) from "
                f"this agent process: a replayed or reordered heartbeat"
            )
        node.incarnation, node.numbered = report.incarnation, True
        node.sequences.pop(report.incarnation, None)
        node.sequences[report.incarnation] = report.sequence
        while len(node.sequences) > KEEP_INCARNATIONS:
            del node.sequences[next(iter(node.sequences))]

    def awaiting_plan(self, node_id: str, planned_at: int) -> bool:
        """True while the node came back from lost after the last plan observed the registry (`returns` was
        `planned_at` then): its cut was made while it was away, so it must keep what it runs until the next pass."""
        with self._lock:
            node = self._nodes.get(node_id)
            return node is not None and node.returned_at > planned_at

    def _block_failed_devices(self, node: NodeState, assigned: Sequence[ModelAssignment], now: float) -> None:
        """A device where every assignment failed to start leaves the inventory for `failed_device_block_s`."""
        failed = {e.key for e in node.errors}
        running = {a.key for a in node.running}
        by_device: dict[int, list[str]] = {}
        for a in assigned:
            by_device.setdefault(a.device, []).append(a.key)
        block_s = self.config.failed_device_block_s
        for device, keys in by_device.items():
            if device in node.blocked or not all(k in failed and k not in running for k in keys):
                continue
            node.blocked[device] = now + block_s
            node.events.append(
                f"{stamp(self.clock())} device {device} blocked for {block_s:g}s: all {len(keys)} "
                f"assignment(s) failed ({'; '.join(map(str, node.errors))[:300]})"
            )
            self._on_change()

    def errors_of(self, node_id: str) -> dict[str, AssignmentError]:
        """{assignment key: error} the node reported for its last apply."""
        with self._lock:
            node = self._nodes.get(node_id)
            return {e.key: e for e in (node.errors if node else ())}

    def failed_keys(self, node_id: str) -> set[str]:
        """The assignment keys the node reports failed and does not run (a failed start; a failed reload keeps
        the old config serving, so it is not among them)."""
        with self._lock:
            node = self._nodes.get(node_id)
            if node is None:
                return set()
            running = {a.key for a in node.running}
            return {e.key for e in node.errors if e.key not in running}

    def check_nodes(self) -> list[str]:
        """Mark nodes lost that were silent for the timeout while this controller ran; returns their ids.

        More than `partition_fraction` of the nodes silent at once: they are "silent" instead and the
        plan is held (see the module docstring)."""
        self.watch_clock()
        now, wall = self.tick(), self.clock()
        lost: list[str] = []
        with self._lock:
            live = [n for n in self._nodes.values() if n.state != "lost"]
            overdue, quiet = [], []
            for node in live:
                # nodes known only from the stored plan (after a restart) get twice the timeout to come back
                limit = self.config.heartbeat_timeout_s * (2 if node.state == "waiting" else 1)
                silence = now - max(node.last_seen, self.resumed_at)
                if silence > limit:
                    overdue.append(node)
                # silenced at the same moment, nodes cross the timeout up to a heartbeat apart: those that
                # missed their last two heartbeats count as falling silent together with the overdue ones
                if silence > limit - min(2 * self.config.heartbeat_interval_s, limit / 2):
                    quiet.append(node.node_id)
            held = bool(overdue) and len(quiet) > self.config.partition_fraction * len(live)
            for node in overdue:
                silence = now - node.last_seen
                if held:
                    if node.state != "silent":
                        node.events.append(f"{stamp(wall)} silent for {silence:.1f}s with most nodes: plan held")
                        node.state = "silent"
                    continue
                node.events.append(f"{stamp(wall)} lost: no heartbeat for {silence:.1f}s")
                node.state = "lost"
                lost.append(node.node_id)
            named = ", ".join(sorted(quiet)[:5]) + (", ..." if len(quiet) > 5 else "")
            hold = (
                f"{len(quiet)} of {len(live)} nodes fell silent together ({named}): a network or "
                f"controller-side fault is likelier than "
                f"that many node failures, so the plan is held and their workloads stay where they are; "
                f"check the network between the controller and the nodes"
                if held
                else ""
            )
            started, ended = hold and not self._hold, self._hold and not hold
            self._hold = hold
        if started:
            log.error("%s", hold)
        elif ended:
            log.warning("the plan is no longer held: %d node(s) heard again or marked lost", len(overdue))
        if lost:
            self._on_change()
        return lost

    def alerts(self) -> tuple[str, ...]:
        """What needs a person's attention now (the plan held for silent nodes)."""
        with self._lock:
            return (self._hold,) if self._hold else ()

    def views(self, cut: Mapping[str, tuple[ModelAssignment, ...]]) -> list[NodeView]:
        """Every node, sorted by id; `cut` is the applied plan per node (what each is assigned)."""
        now = self.tick()
        with self._lock:
            return [
                NodeView(
                    node_id=n.node_id,
                    devices=n.devices,
                    state=n.state,
                    last_heartbeat_unix=n.last_heartbeat,
                    seconds_since_heartbeat=max(0.0, now - n.last_seen),
                    assigned=cut.get(n.node_id, ()),
                    running=n.running,
                    events=tuple(n.events),
                    address=n.address,
                    applied_revision=n.applied_revision,
                    errors=n.errors,
                    observed=dict(n.observed),
                    endpoints=dict(n.endpoints),
                )
                for n in sorted(self._nodes.values(), key=lambda n: n.node_id)
            ]

    def gpu_types_of(self, node_id: str) -> dict[int, str]:
        """{device index: GPU type} of one node (empty when unknown)."""
        with self._lock:
            node = self._nodes.get(node_id)
            devices = node.devices if node else ()
        return {d.index: d.gpu_type or self.config.gpu_type_for(d) for d in devices}

    def healthy_slots(self) -> tuple[Binding, ...]:
        """The device slots of ready, waiting and silent nodes that are not blocked, sorted (expired blocks
        lift)."""
        now = self.tick()
        with self._lock:
            for n in self._nodes.values():
                for device, until in list(n.blocked.items()):
                    if until <= now:
                        del n.blocked[device]
                        n.events.append(f"{stamp(self.clock())} device {device} unblocked")
            slots = [
                Binding(n.node_id, d.index, d.gpu_type or self.config.gpu_type_for(d))
                for n in self._nodes.values()
                if n.state in ("ready", "waiting", "silent")
                for d in n.devices
                if d.index not in n.blocked
            ]
        return tuple(sorted(slots, key=lambda s: (s.node_id, s.device)))
