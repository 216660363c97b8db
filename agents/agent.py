"""The node agent: register, heartbeat, apply assignments, report what runs.

Two threads, so a slow apply (starting Triton processes) never delays a
heartbeat and the controller never mistakes a busy node for a lost one:

- the *control* thread (`heartbeat_once`) registers the node with its devices,
  then heartbeats every interval with the last snapshot of what runs, the
  per-model figures scraped from Triton and the events since the last
  heartbeat. Assignments come back in every heartbeat answer (polling: the
  answer carries the node's full assignment list and the plan revision). If
  the controller is unreachable it retries with exponential backoff
  (`backoff_s` doubling up to `max_backoff_s`) while Triton keeps serving;
  an answer ``registered=False`` (a restarted controller) makes it register
  again. Both waits get random jitter (the heartbeat +-`jitter`, the backoff
  up to `backoff_jitter` shorter), from the injected `rng`, so agents started
  or cut off together do not heartbeat or reconnect in lockstep.
- it trusts no controller to name a path or size a process: every answer is
  checked (`controller.limits.assignment_problems`: the shared name rule,
  bounded figures, unique keys) before anything is applied. A refused answer
  changes nothing that runs; the refusal is reported as the errors of that
  revision. An answer ``hold=True`` (the controller is re-planning with this
  node back) keeps what runs as it is.
- the *fleet* thread (`fleet_once`) is the only one touching the Triton fleet:
  it applies the latest assignments when they differ from what it applied
  last (idempotent: `TritonFleet.apply` reloads on a batch change, moves on a
  share change, leaves the rest), retries a failed apply after
  `retry_apply_s`, restarts crashed Triton processes (`check_health`) and
  scrapes the figures (`observe`), then publishes a snapshot.

- verify before serving: an answer may carry `measure` requests (points the controller wants measured
  before a new assignment serves). They are checked (`limits.measure_request_problems`; a refused list
  measures nothing), and the *measure* thread (`measure_once`) measures each (request, batch) once with
  the injected `measurer` (the device backend: real Triton on CPU, the profiler's path; the simulated
  truth device in tests); results go out in every heartbeat while the controller still asks for them,
  and are dropped once it stops (it has recorded them). Once nothing is left to measure the measurer is
  closed (a Triton measurer stops its processes, and starts them again when asked). An agent without a
  measurer, a point on a device this node does not have, and a measurement past `measure_timeout_s`
  (then aborted) are answered with that point's error, so the controller serves the plan without
  waiting. `stop()` stops the measurer beside the fleet, never waiting for a measurement in flight.

The fleet is any object with `refusals` (why it will not run assignments: asked
before every apply, e.g. a device they over-commit), `apply`, `observe`, `check_health`,
`running`, `close`, and optionally `serving_endpoints` (where clients reach each
assignment; see `agents.triton.TritonFleet`); the client any object with
`register` and `heartbeat` (see `controller.api.client.ControllerClient`).
Time comes from the injected `clock`; waiting from the injected `sleep`.
"""

from __future__ import annotations

import collections
import logging
import math
import os
import platform
import random
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from controller import limits
from controller.messages import (
    MAX_BATCH_STATS,
    MAX_POOLED_WINDOWS,
    AssignmentError,
    BatchStat,
    FailedPrecondition,
    HeartbeatAnswer,
    HeartbeatReport,
    InvalidArgument,
    MeasuredPoint,
    MeasureRequest,
    ModelAssignment,
    NodeDevice,
    Observation,
    PermissionDenied,
    ServingEndpoint,
    Unauthenticated,
)
from foundation.names import clean_text

log = logging.getLogger("stoke.agent")


class Fleet(Protocol):
    def refusals(self, assignments: Sequence[ModelAssignment]) -> list[AssignmentError]: ...
    def apply(self, assignments: Sequence[ModelAssignment]) -> Any: ...
    def observe(self) -> list[Any]: ...
    def check_health(self) -> list[str]: ...
    def running(self) -> list[ModelAssignment]: ...
    def close(self) -> None: ...


class PointMeasurer(Protocol):
    """Measures one point for verify before serving: the solo active time (ms) of `model` at `batch`
    on `device` at `share_pct`, over windows of `requests` requests; raises when it cannot. Optional
    methods the agent calls where they exist: `close()` (nothing left to measure: release what it holds),
    `abort()` (a measurement ran past its deadline: end it without waiting for it) and `stop()` (the
    agent stops: end everything, never wait for a measurement in flight)."""

    def __call__(self, model: str, device: int, share_pct: float, batch: int, requests: int) -> float: ...


#: (model, device, share %, batch): one point a measure request names.
PointKey = tuple[str, int, float, int]


def point_keys(requests: Sequence[MeasureRequest]) -> list[PointKey]:
    """The points `requests` ask for, in order."""
    return [(m.model, m.device, round(float(m.share_pct), 6), int(b)) for m in requests for b in m.batches]


class Client(Protocol):
    def register(self, node_id: str, devices: Sequence[NodeDevice], address: str = "") -> float: ...
    def heartbeat(self, report: HeartbeatReport) -> HeartbeatAnswer: ...


def local_devices(kind: str = "auto") -> tuple[NodeDevice, ...]:
    """This node's devices, through `agents.device` when present, else the CPU as one device."""
    try:
        from agents.device import open_device  # NVML / CPU behind one interface
    except ImportError:  # no NVML bindings: the CPU as one device
        cores = len(os.sched_getaffinity(0))
        return (
            NodeDevice(index=0, name=f"cpu ({platform.processor() or platform.machine()})", kind="cpu", cores=cores),
        )
    device = open_device(kind)
    try:
        infos = device.describe()
    finally:
        close = getattr(device, "close", None)
        if close:
            close()
    return tuple(
        NodeDevice(
            index=int(d.index),
            name=str(d.name),
            kind=str(d.kind),
            memory_bytes=int(getattr(d, "memory_bytes", 0) or getattr(d, "memory", 0) or 0),
            cores=int(getattr(d, "cores", 0) or 0),
        )
        for d in infos
    )


def _figure(value: Any) -> float:
    """A figure the controller accepts: finite, >= 0 and bounded (a NaN from a broken scrape becomes 0)."""
    return _optional(value) or 0.0


def _optional(value: Any) -> float | None:
    """A figure the node may not have: None stays None, and so does one that is not a finite figure."""
    if value is None:
        return None
    x = float(value)
    return min(x, limits.MAX_FIGURE) if math.isfinite(x) and x >= 0 else None


def _batch_stats(stats: Any) -> tuple[BatchStat, ...]:
    """Per batch size executions and durations, bounded like everything an agent sends."""
    return tuple(
        BatchStat(int(b.batch), int(_figure(b.executions)), _figure(b.compute_ms))
        for b in tuple(stats)[:MAX_BATCH_STATS]
        if 1 <= int(b.batch) <= limits.MAX_BATCH
    )


def observation_of(o: Any, latency: Any = None, device: Any = None, pooled: Any = None) -> Observation:
    """An `agents.triton.ObservedModel` (or anything with its fields) as the controller's Observation,
    with the window's SLI latency (`agents.latency_metrics.LatencyWindow`), the p99 of the last windows
    pooled (`agents.latency_metrics.PooledLatency`) and device reading (`agents.device.DeviceSample`)
    when the node has them."""
    pooled_p99 = _optional(pooled.p99_ms) if pooled is not None and latency is not None else None
    # the pool holds this window: never fewer requests than it (a figure clipped at MAX_FIGURE stays consistent)
    window_count = int(_figure(latency.count)) if latency is not None else 0
    return Observation(
        key=o.key,
        model=o.model,
        request_rate_rps=_figure(o.request_rate_rps),
        mean_batch=_figure(o.mean_batch),
        mean_queue_ms=_figure(o.mean_queue_ms),
        mean_compute_ms=_figure(o.mean_compute_ms),
        failures=int(_figure(o.failures)),
        success=int(_figure(o.success)),
        endpoint=clean_text(str(o.endpoint), limits.MAX_TEXT_CHARS - 3),
        seq=int(_figure(getattr(o, "seq", 0))),
        window_s=_figure(getattr(o, "window_s", 0.0)),
        requests=int(_figure(getattr(o, "requests", 0))),
        window_failures=int(_figure(getattr(o, "window_failures", 0))),
        pending=int(_figure(getattr(o, "pending", 0))),
        batch_stats=_batch_stats(getattr(o, "batch_stats", ())),
        compute_input_ms=_figure(getattr(o, "compute_input_ms", 0.0)),
        compute_infer_ms=_figure(getattr(o, "compute_infer_ms", 0.0)),
        compute_output_ms=_figure(getattr(o, "compute_output_ms", 0.0)),
        instances=max(1, int(_figure(getattr(o, "instances", 1)))),
        latency_count=int(_figure(latency.count)) if latency is not None else 0,
        latency_p50_ms=_optional(latency.p50_ms) if latency is not None else None,
        latency_p95_ms=_optional(latency.p95_ms) if latency is not None else None,
        latency_p99_ms=_optional(latency.p99_ms) if latency is not None else None,
        over_slo_ratio=_optional(latency.over_slo_ratio) if latency is not None else None,
        pooled_p99_ms=pooled_p99,
        pooled_count=max(window_count, 1, int(_figure(pooled.count))) if pooled_p99 is not None else 0,
        pooled_windows=min(MAX_POOLED_WINDOWS, max(1, int(pooled.windows))) if pooled_p99 is not None else 0,
        device_utilization_pct=_optional(getattr(device, "utilization_pct", None)),
        sm_clock_mhz=_optional(getattr(device, "sm_clock_mhz", None)),
        power_w=_optional(getattr(device, "power_w", None)),
    )


def _error(e: AssignmentError) -> AssignmentError:
    return AssignmentError(e.key, clean_text(e.message, limits.MAX_MESSAGE_CHARS - 3))


#: Windows an agent pools into one p99 by default: the closed loop's `recalibration.recent_windows` default.
SLI_POOLED_WINDOWS = 10


class SliReader:
    """The SLI histogram of the serving path (`stoke_request_latency_ms`), read from its sources each
    window; `window(workload, slo_ms)` gives that workload's latency since the previous `read`, and
    `pooled(workload)` the p99 of its last `pooled_windows` windows' requests pooled
    (`agents.latency_metrics.pooled_latency`): it keeps their cumulative buckets, per workload
    (at most `MAX_SLI_WORKLOADS` x (`pooled_windows` + 1) histograms)."""

    def __init__(self, sources: Sequence[Callable[[], str]], pooled_windows: int = SLI_POOLED_WINDOWS) -> None:
        if not 1 <= pooled_windows <= MAX_POOLED_WINDOWS:
            raise ValueError(f"pooled windows must be from 1 to {MAX_POOLED_WINDOWS}, got {pooled_windows}")
        self.sources = tuple(sources)
        self.pooled_windows = pooled_windows
        self._before: dict[str, dict[float, float]] = {}
        self._after: dict[str, dict[float, float]] = {}
        self._history: dict[str, collections.deque[dict[float, float]]] = {}

    def read(self) -> None:
        from agents.latency_metrics import parse_sli

        merged: dict[str, dict[float, float]] = {}
        for source in self.sources:
            try:
                text = source()
            except Exception as err:  # noqa: BLE001 - an SLI endpoint that is down costs its figures, not the window
                log.debug("SLI source failed: %s", err)
                continue
            for workload, buckets in parse_sli(text).items():
                row = merged.setdefault(workload, {})
                for bound, count in buckets.items():
                    row[bound] = row.get(bound, 0.0) + count
        self._before, self._after = self._after, merged
        history = {}
        for workload, buckets in merged.items():  # workloads no longer exported are forgotten
            kept = self._history.get(workload) or collections.deque(maxlen=self.pooled_windows + 1)
            kept.append(buckets)
            history[workload] = kept
        self._history = history

    def window(self, workload: str, slo_ms: float | None) -> Any:
        from agents.latency_metrics import latency_window

        after = self._after.get(workload)
        if after is None or workload not in self._before:
            return None  # the first read of a workload has no window yet
        return latency_window(self._before.get(workload), after, slo_ms)

    def pooled(self, workload: str) -> Any:
        """The p99 of `workload`'s last windows pooled (`PooledLatency`), or None (no window yet, a reset)."""
        from agents.latency_metrics import pooled_latency

        history = self._history.get(workload)
        if not history:
            return None
        snapshots = list(history)
        # a restarted exporter: pool only the windows since (the counters went down between two reads)
        for i in range(len(snapshots) - 1, 0, -1):
            if any(snapshots[i].get(b, 0.0) < v for b, v in snapshots[i - 1].items()):
                snapshots = snapshots[i:]
                break
        return pooled_latency(snapshots)


@dataclass
class AgentState:
    registered: bool = False
    connected: bool = False
    failures: int = 0  # consecutive controller failures
    next_attempt: float = 0.0
    desired: tuple[ModelAssignment, ...] | None = None
    desired_revision: int = 0
    applied: tuple[ModelAssignment, ...] | None = None
    applied_revision: int = 0
    apply_errors: tuple[AssignmentError, ...] = ()
    errors_revision: int = 0  # the revision whose apply produced `apply_errors`
    last_apply: float = 0.0
    applies: int = 0
    running: tuple[ModelAssignment, ...] = ()
    observed: tuple[Observation, ...] = ()
    endpoints: tuple[ServingEndpoint, ...] = ()
    events: list[str] = field(default_factory=list)
    refused: tuple[AssignmentError, ...] = ()  # why the last answer was refused (nothing of it applied)
    refused_revision: int = 0
    #: why this node's serving endpoints cannot serve (the router's own probe); non-empty: no heartbeat
    serving_problems: tuple[str, ...] = ()
    #: verify before serving: what the controller asks to measure (checked), and the results so far
    measure_wanted: tuple[MeasureRequest, ...] = ()
    measured: dict[PointKey, MeasuredPoint] = field(default_factory=dict)
    measure_refused: tuple[str, ...] = ()  # why the last measure requests were refused


#: Most time one point's measurement may take (s); past it the point is reported failed (its error) and the
#: measurer aborted. A CPU point takes seconds (a Triton start and a few stable windows).
MEASURE_TIMEOUT_S = 60.0

#: The agent's shutdown bound (s): loops 2 s + the fleet's `SHUTDOWN_S` (20 s) + 3 s, documented as <= 30 s.
SHUTDOWN_S = 30.0


class Agent:
    def __init__(
        self,
        client: Client,
        fleet: Fleet,
        node_id: str,
        devices: Sequence[NodeDevice],
        *,
        address: str = "",
        heartbeat_interval_s: float = 2.0,
        backoff_s: float = 0.5,
        max_backoff_s: float = 2.0,
        retry_apply_s: float = 10.0,
        jitter: float = 0.1,
        backoff_jitter: float = 0.5,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
        sli_sources: Sequence[Callable[[], str]] = (),
        sli_pooled_windows: int = SLI_POOLED_WINDOWS,
        device: Any = None,
        measurer: PointMeasurer | None = None,
        measure_timeout_s: float = MEASURE_TIMEOUT_S,
    ) -> None:
        """`sli_sources` return the serving path's SLI histogram as Prometheus text (URLs, an in-process
        exporter: `agents.latency_metrics`), of which each observation also carries the p99 of the last
        `sli_pooled_windows` windows pooled (`SliReader`); `device` is an `agents.device` reader (`sample()`);
        `measurer` measures points for verify before serving (None: this node measures nothing, and says so),
        each within `measure_timeout_s`."""
        self.client = client
        self.fleet = fleet
        self.node_id = node_id
        self.devices = tuple(devices)
        self.address = address
        self.interval_s = heartbeat_interval_s
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.retry_apply_s = retry_apply_s
        self.jitter = jitter
        self.backoff_jitter = backoff_jitter
        self.rng = rng or random.Random()
        self.clock = clock
        self.sli = SliReader(sli_sources, sli_pooled_windows)
        self.device = device
        self.measurer = measurer
        self.measure_timeout_s = measure_timeout_s
        self.state = AgentState()
        #: this agent process, for the controller's replay check; heartbeats are numbered from 1 within it
        self.incarnation = secrets.token_hex(16)
        self._sequence = 0
        self._lock = threading.Lock()
        self._wake_fleet = threading.Event()
        self._wake_measure = threading.Event()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    # ------------------------------------------------------------ control side

    def note(self, text: str) -> None:
        """An event for the controller (sent with the next heartbeat)."""
        self._event(text)

    def _event(self, text: str) -> None:
        line = clean_text(f"{time.strftime('%H:%M:%S', time.gmtime())} {text}", limits.MAX_EVENT_CHARS - 3)
        with self._lock:
            self.state.events.append(line)
            del self.state.events[: -limits.MAX_EVENTS]

    def _next_sequence(self) -> int:
        self._sequence += 1
        return self._sequence

    def _next_beat(self) -> float:
        """The heartbeat interval, +-`jitter` at random."""
        return self.interval_s * (1.0 + self.jitter * (2.0 * self.rng.random() - 1.0))

    def heartbeat_once(self) -> float:
        """Register if needed, heartbeat once; returns the seconds to wait before the next call."""
        s = self.state
        now = self.clock()
        if now < s.next_attempt:
            return s.next_attempt - now
        with self._lock:
            serving_problems = s.serving_problems
        if serving_problems:
            # a node whose endpoints cannot serve must not look ready: no heartbeat, so the controller's
            # timeout marks it not ready and moves its workloads; beats resume once the probe passes
            log.error("not heartbeating: this node cannot serve (%s)", "; ".join(serving_problems[:3]))
            return self._next_beat()
        try:
            if not s.registered:
                interval = self.client.register(self.node_id, self.devices, self.address)
                if interval > 0:
                    self.interval_s = interval
                s.registered = True
                log.info("registered %s with %d device(s)", self.node_id, len(self.devices))
            with self._lock:
                events = list(s.events)
                errors, errors_revision = (
                    (s.refused, s.refused_revision) if s.refused else (s.apply_errors, s.errors_revision)
                )
                report = HeartbeatReport(
                    node_id=self.node_id,
                    running=s.running[: limits.MAX_ASSIGNMENTS],
                    observed=s.observed[: limits.MAX_ASSIGNMENTS],
                    events=tuple(events),
                    errors=tuple(_error(e) for e in errors[: limits.MAX_ASSIGNMENTS]),
                    applied_revision=s.applied_revision,
                    errors_revision=errors_revision,
                    endpoints=s.endpoints[: limits.MAX_ASSIGNMENTS],
                    sequence=self._next_sequence(),
                    incarnation=self.incarnation,
                    measured=tuple(s.measured.values())[: limits.MAX_MEASURED],
                )
            answer = self.client.heartbeat(report)
        except Exception as err:  # noqa: BLE001 - any client failure: back off, keep serving
            s.failures += 1
            delay = min(self.max_backoff_s, self.backoff_s * (2 ** min(s.failures - 1, 16)))
            delay *= 1.0 - self.backoff_jitter * self.rng.random()
            # say what serves meanwhile: only what runs keeps serving (nothing, before the first assignment)
            serving = "Triton keeps serving" if s.running else "nothing is served until it answers"
            if isinstance(err, (Unauthenticated, PermissionDenied, InvalidArgument, FailedPrecondition)):
                # retrying cannot help until someone fixes the token or the node's identity: say so loudly
                log.error(
                    "the controller refuses this agent (%s); fix the token (--token-file: this node's agent "
                    "token, `stoke token agent NODE`) or the node id; retrying in %.1fs, %s",
                    err,
                    delay,
                    serving,
                )
            elif s.connected or s.failures == 1:
                log.warning("controller unreachable (%s); retrying in %.1fs, %s", err, delay, serving)
            s.connected = False
            s.next_attempt = now + delay
            return delay
        with self._lock:
            del s.events[: len(events)]
        if not s.connected and s.failures:
            self._event(f"reconnected to the controller after {s.failures} failed attempt(s)")
        s.connected, s.failures, s.next_attempt = True, 0, 0.0
        if not answer.registered:
            s.registered = False  # the controller restarted or forgot us: register right away
            return 0.0
        if answer.heartbeat_interval_s > 0:
            self.interval_s = answer.heartbeat_interval_s
        if answer.hold:  # the controller re-plans with this node back: keep what runs
            return self._next_beat()
        self._take_measure_requests(answer.measure)
        refused = limits.assignment_problems(answer.assignments)
        with self._lock:
            if refused:
                if (s.refused, s.refused_revision) != (tuple(refused), answer.revision):
                    log.error(
                        "refused revision %d from the controller, nothing of it applied: %s",
                        answer.revision,
                        "; ".join(map(str, refused[:3])),
                    )
                s.refused, s.refused_revision = tuple(refused), answer.revision
            else:
                s.refused = ()
                if s.desired != tuple(answer.assignments) or s.desired_revision != answer.revision:
                    s.desired, s.desired_revision = tuple(answer.assignments), answer.revision
                    self._wake_fleet.set()
        return self._next_beat()

    def _take_measure_requests(self, requests: Sequence[MeasureRequest]) -> None:
        """Keep what the controller asks to measure now (checked: a refused list measures nothing) and the
        results it still asks for; results it no longer asks for were recorded, and are dropped."""
        problems = tuple(limits.measure_request_problems(requests))
        with self._lock:
            again = problems == self.state.measure_refused
            self.state.measure_refused = problems
            if problems:
                self.state.measure_wanted, self.state.measured = (), {}
        if problems:
            if not again:  # said once per refusal, not every heartbeat
                log.error("refused the controller's measure requests, nothing measured: %s", "; ".join(problems[:3]))
                self._event(f"measure requests refused: {problems[0]}")
            return
        keys = set(point_keys(requests))
        with self._lock:
            s = self.state
            s.measure_wanted = tuple(requests)
            s.measured = {k: v for k, v in s.measured.items() if k in keys}
            todo = len(keys) > len(s.measured)
        if todo:
            self._wake_measure.set()

    def measure_once(self) -> bool:
        """Measure the next point asked for and not measured yet; False when there is none."""
        with self._lock:
            s = self.state
            todo = [(k, m) for m in s.measure_wanted for k in point_keys([m]) if k not in s.measured]
        if not todo:
            return False
        (model, device, share, batch), request = todo[0]
        active, error = self._measure_point(model, device, share, batch, request.requests)
        point = MeasuredPoint(model, device, share, batch, active, clean_text(error, limits.MAX_MESSAGE_CHARS - 3))
        with self._lock:
            if (model, device, share, batch) in set(point_keys(s.measure_wanted)):  # still asked for
                s.measured[(model, device, share, batch)] = point
        self._event(
            f"measured {model} batch {batch} at {share:g}% on device {device}: "
            + (f"{active:.3f} ms" if not error else f"failed ({error})")
        )
        return True

    def _measure_point(self, model: str, device: int, share: float, batch: int, requests: int) -> tuple[float, str]:
        """(solo active ms, "") or (0, why not): on one of this node's own devices, within `measure_timeout_s`
        (a measurement past it is aborted: the measurer's `abort()`, where it has one, stops its processes)."""
        measurer = self.measurer
        if measurer is None:
            return 0.0, (
                "this node does not measure (its agent runs with --no-measure, or on a GPU node, where measuring "
                "through NVML/MPS is not built yet)"
            )
        own = sorted(d.index for d in self.devices)
        if device not in own:
            return 0.0, f"device {device} is not one of this node's (devices {', '.join(map(str, own))})"
        out: dict[str, Any] = {}

        def run() -> None:
            try:
                out["ms"] = float(measurer(model, device, share, batch, requests))
            except Exception as err:  # noqa: BLE001 - any device failure is this point's error, reported
                out["error"] = f"{type(err).__name__}: {err}"

        worker = threading.Thread(target=run, name="agent-measure-point", daemon=True)
        worker.start()
        end = time.monotonic() + self.measure_timeout_s
        while worker.is_alive() and not self._stop.is_set() and time.monotonic() < end:
            worker.join(0.1)
        if worker.is_alive():
            abort = getattr(measurer, "abort", None)
            if abort is not None:
                abort()
            if self._stop.is_set():
                return 0.0, "the agent stopped during the measurement"
            return 0.0, f"not measured within {self.measure_timeout_s:g} s (stopped)"
        if "error" in out:
            return 0.0, str(out["error"])
        active = float(out["ms"])
        if not (math.isfinite(active) and 0 < active <= limits.MAX_ACTIVE_MS):
            return 0.0, f"the measurement gave {active!r} ms"
        return active, ""

    # ------------------------------------------------------------ fleet side

    def fleet_once(self) -> None:
        """Apply if the desired assignments changed (or a failed apply is due a retry), heal, observe."""
        s = self.state
        with self._lock:
            desired, revision = s.desired, s.desired_revision
        now = self.clock()
        due = desired is not None and (
            desired != s.applied or (s.apply_errors and now - s.last_apply >= self.retry_apply_s)
        )
        if due:
            assert desired is not None
            refused = self.fleet.refusals(desired)
            if refused:  # nothing applied: what runs keeps running; retried after retry_apply_s
                s.last_apply, s.applied = now, desired
                with self._lock:
                    s.apply_errors, s.errors_revision = tuple(refused), revision
                self._event(f"refused revision {revision}: {refused[0].message}")
                desired = None
        if due and desired is not None:
            report = self.fleet.apply(desired)
            s.last_apply, s.applies = now, s.applies + 1
            s.applied = desired
            errors = tuple(getattr(report, "errors", ()))
            with self._lock:
                s.apply_errors, s.errors_revision = errors, revision
            if not errors:
                s.applied_revision = revision
            parts = [
                f"{name} {', '.join(keys)}"
                for name in ("started", "reloaded", "moved", "stopped")
                if (keys := getattr(report, name, ()))
            ]
            if parts or errors:
                self._event(
                    f"applied revision {revision}: "
                    + ("; ".join(parts) or "no change")
                    + (f"; errors: {' | '.join(map(str, errors))}" if errors else "")
                )
        for e in self.fleet.check_health():
            self._event(e)
        probe = getattr(self.fleet, "serving_problems", None)
        problems = tuple(probe()) if probe is not None else ()
        with self._lock:
            if problems and not s.serving_problems:
                s.events.append(f"endpoints cannot serve: {'; '.join(problems[:3])}"[: limits.MAX_EVENT_CHARS])
            s.serving_problems = problems
        observed = self._observe()
        running = tuple(self.fleet.running())
        endpoints_of = getattr(self.fleet, "serving_endpoints", None)
        endpoints = tuple(endpoints_of().values()) if endpoints_of is not None else ()
        with self._lock:
            s.observed, s.running, s.endpoints = observed, running, endpoints

    def _observe(self) -> tuple[Observation, ...]:
        """One window: Triton's figures per assignment, with the SLI latency and the device reading."""
        models = self.fleet.observe()
        if self.sli.sources:
            self.sli.read()
        samples: dict[int, Any] = {}
        if self.device is not None:
            try:
                samples = {int(d.index): d for d in self.device.sample()}
            except Exception as err:  # noqa: BLE001 - a failed reading costs the device figures only
                log.debug("device sample failed: %s", err)
        assigned = {a.key: a for a in (self.state.applied or ())}
        out = []
        for o in models:
            a = assigned.get(o.key)
            workload = a.workload if a else o.key.rpartition("#")[0]
            latency = self.sli.window(workload, a.slo_ms if a else None) if self.sli.sources else None
            pooled = self.sli.pooled(workload) if latency is not None else None
            out.append(observation_of(o, latency, samples.get(a.device if a else 0), pooled))
        return tuple(out)

    # ------------------------------------------------------------ threads

    def _control_loop(self) -> None:
        while not self._stop.is_set():
            try:
                wait = self.heartbeat_once()
            except Exception:  # never let the loop die (logged with its traceback)
                log.exception("heartbeat failed")
                wait = self.interval_s
            self._stop.wait(max(0.0, wait))

    def _fleet_loop(self) -> None:
        self._step_loop(self.fleet_once, self._wake_fleet, "fleet step")

    def _step_loop(self, step: Callable[[], object], wake: threading.Event, what: str) -> None:
        """`step` every interval, or as soon as `wake` is set, until stopped; a failing step is logged and the loop
        goes on (the fleet's and the measurer's loops)."""
        while not self._stop.is_set():
            try:
                step()
            except Exception:  # the same: logged, the loop goes on
                log.exception("%s failed", what)
            wake.wait(self.interval_s)
            wake.clear()

    def measure_pending(self) -> int:
        """Measure every point asked for and not measured yet (until stopped), then release the measurer: one
        holding processes lets them go until asked again. Returns how many points were measured."""
        count = 0
        while not self._stop.is_set() and self.measure_once():
            count += 1
        if count:
            close = getattr(self.measurer, "close", None)
            if close is not None:
                close()
        return count

    def _measure_loop(self) -> None:
        self._step_loop(self.measure_pending, self._wake_measure, "measure step")

    def start(self) -> None:
        loops = (
            (self._control_loop, "agent-control"),
            (self._fleet_loop, "agent-fleet"),
            (self._measure_loop, "agent-measure"),
        )
        for target, name in loops:
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self, close_fleet: bool = True) -> None:
        """Stop within `SHUTDOWN_S` whatever runs: the loops get a moment to finish their step, then the fleet
        closes with its own deadline (killing a Triton still starting or loading a model, which also ends a
        fleet step blocked on it), and the measurer stops beside it (`stop()`: a measurement in flight is not
        waited for), then the loops get another moment."""
        self._stop.set()
        self._wake_fleet.set()
        self._wake_measure.set()
        for t in self._threads:
            t.join(timeout=2.0)
        stopper = None
        stop_measurer = getattr(self.measurer, "stop", None) if close_fleet else None
        if stop_measurer is not None:  # beside the fleet's close, not after it: both have the fleet's deadline
            stopper = threading.Thread(target=stop_measurer, name="agent-measurer-stop", daemon=True)
            stopper.start()
        if close_fleet:
            self.fleet.close()
        if stopper is not None:
            stopper.join(timeout=1.0)
        for t in self._threads:
            t.join(timeout=3.0)
            if t.is_alive():
                log.warning("thread %s still running at shutdown; leaving it (daemon)", t.name)
        self._threads.clear()

    def wait(self, timeout: float | None = None) -> bool:
        return self._stop.wait(timeout)
