"""The controller's actual state: the nodes, rebuilt from what their agents report. In memory only.

A node registers with its devices and then heartbeats with what it runs, the
figures it observes and the assignments that failed. A node missing
heartbeats for `heartbeat_timeout_s` is marked lost and its slots leave the
inventory (`healthy_slots`), so the next reconcile re-plans its workloads
onto the others. After a controller restart the nodes of the applied plan
are "waiting" (`restore`: their slots stay in the inventory) until they
register again or miss twice the heartbeat timeout, so a restart does not
reshuffle anything.

Failures come back as constraints: when a node reports that every
assignment of one of its devices failed to start, that device leaves the
inventory for `failed_device_block_s` and the next solve places its
workloads elsewhere.

Every change that needs a reconcile calls `on_change`. Thread-safe.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from controller.config import ServiceConfig
from controller.messages import (
    AssignmentError,
    HeartbeatReport,
    ModelAssignment,
    NodeDevice,
    Observation,
    ServingEndpoint,
)
from controller.reconcile.slots import Binding


@dataclass
class NodeState:
    node_id: str
    devices: tuple[NodeDevice, ...]
    address: str = ""
    state: str = "ready"  # ready | lost | waiting
    last_heartbeat: float = 0.0
    running: tuple[ModelAssignment, ...] = ()
    observed: dict[str, Observation] = field(default_factory=dict)
    endpoints: dict[str, ServingEndpoint] = field(default_factory=dict)
    events: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=20))
    errors: tuple[AssignmentError, ...] = ()
    applied_revision: int = 0
    blocked: dict[int, float] = field(default_factory=dict)  # device index -> blocked until (clock)
    registered: bool = True  # False while its devices are only known from the stored plan


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
    def __init__(self, config: ServiceConfig, clock: Callable[[], float], on_change: Callable[[], None]) -> None:
        self.config = config
        self.clock = clock
        self._on_change = on_change
        self._lock = threading.Lock()
        self._nodes: dict[str, NodeState] = {}

    def restore(self, bindings: Iterable[Binding | None]) -> None:
        """The nodes of the applied plan, after a restart: waiting for them before re-planning."""
        now = self.clock()
        with self._lock:
            for b in bindings:
                if b is None:
                    continue
                node = self._nodes.setdefault(
                    b.node_id, NodeState(b.node_id, (), state="waiting", last_heartbeat=now, registered=False)
                )
                if all(d.index != b.device for d in node.devices):
                    device = NodeDevice(b.device, b.gpu_type, "unknown", gpu_type=b.gpu_type)
                    node.devices = tuple(sorted(node.devices + (device,), key=lambda d: d.index))

    def register(self, node_id: str, devices: Sequence[NodeDevice], address: str = "") -> None:
        """A node (back) with its devices; each device's GPU type is resolved by the config."""
        resolved = tuple(
            sorted((replace(d, gpu_type=self.config.gpu_type_for(d)) for d in devices), key=lambda d: d.index)
        )
        now = self.clock()
        with self._lock:
            node = self._nodes.get(node_id)
            if node is None:
                node = self._nodes[node_id] = NodeState(node_id, resolved)
                node.events.append(f"{stamp(now)} registered")
            else:
                if node.state != "ready":
                    node.events.append(f"{stamp(now)} back ({node.state} before)")
                node.devices = resolved
            node.address = address
            node.state = "ready"
            node.registered = True
            node.last_heartbeat = now
        self._on_change()

    def heartbeat(self, report: HeartbeatReport, revision: int, assigned: Sequence[ModelAssignment]) -> bool:
        """Record a report; False when the node must register (unknown, or known only from the stored plan).

        `revision` and `assigned` are the applied plan's revision and this node's part of it."""
        now = self.clock()
        with self._lock:
            node = self._nodes.get(report.node_id)
            if node is None or not node.registered:
                return False
            if node.state == "lost":
                node.events.append(f"{stamp(now)} back after being lost")
                node.state = "ready"
                self._on_change()
            node.last_heartbeat = now
            node.running = tuple(report.running)
            node.observed = {o.key: o for o in report.observed}
            node.endpoints = {e.key: e for e in report.endpoints}
            node.events.extend(report.events)
            node.errors = tuple(report.errors)
            node.applied_revision = report.applied_revision
            if report.errors_revision == revision:
                # only errors of the current cut say something about its devices: errors of an
                # older revision would block the device a workload has just been moved to
                self._block_failed_devices(node, assigned, now)
            return True

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
                f"{stamp(now)} device {device} blocked for {block_s:g}s: all {len(keys)} "
                f"assignment(s) failed ({'; '.join(map(str, node.errors))[:300]})"
            )
            self._on_change()

    def errors_of(self, node_id: str) -> dict[str, AssignmentError]:
        """{assignment key: error} the node reported for its last apply."""
        with self._lock:
            node = self._nodes.get(node_id)
            return {e.key: e for e in (node.errors if node else ())}

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
                    node.events.append(f"{stamp(now)} lost: no heartbeat for {now - node.last_heartbeat:.1f}s")
                    lost.append(node.node_id)
        if lost:
            self._on_change()
        return lost

    def views(self, cut: Mapping[str, tuple[ModelAssignment, ...]]) -> list[NodeView]:
        """Every node, sorted by id; `cut` is the applied plan per node (what each is assigned)."""
        now = self.clock()
        with self._lock:
            return [
                NodeView(
                    node_id=n.node_id,
                    devices=n.devices,
                    state=n.state,
                    last_heartbeat_unix=n.last_heartbeat,
                    seconds_since_heartbeat=max(0.0, now - n.last_heartbeat),
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

    def healthy_slots(self) -> tuple[Binding, ...]:
        """The device slots of ready and waiting nodes that are not blocked, sorted (expired blocks lift)."""
        now = self.clock()
        with self._lock:
            for n in self._nodes.values():
                for device, until in list(n.blocked.items()):
                    if until <= now:
                        del n.blocked[device]
                        n.events.append(f"{stamp(now)} device {device} unblocked")
            slots = [
                Binding(n.node_id, d.index, d.gpu_type or self.config.gpu_type_for(d))
                for n in self._nodes.values()
                if n.state in ("ready", "waiting")
                for d in n.devices
                if d.index not in n.blocked
            ]
        return tuple(sorted(slots, key=lambda s: (s.node_id, s.device)))
