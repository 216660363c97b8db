"""Every bound of the control plane in one place, and the checks of what agents and controller send. Pure.

Both sides check what they receive against the same rules: the controller
checks what an agent registers and reports (`check_devices`, `check_report`),
and the agent checks the assignments a controller sends (`assignment_problems`),
because neither trusts the other to stay within bounds. Names follow
`foundation.names` everywhere; free text (events, error messages, device names) is
capped and must be printable.

A request outside the bounds is refused whole (`InvalidArgument` naming the
field); nothing of it is stored.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from controller.messages import (
    MAX_BATCH_STATS,
    AssignmentError,
    HeartbeatReport,
    MeasuredPoint,
    MeasureRequest,
    ModelAssignment,
    NodeDevice,
    Observation,
    Replica,
    invalid,
)
from foundation.names import name_problem, shown

# the bounds of one workload live one floor down, with the planner that checks them; named here too so that
# every bound of the control plane reads limits.NAME
from planner.bounds import MAX_RATE_RPS as MAX_RATE_RPS
from planner.bounds import MAX_REPLICAS as MAX_REPLICAS
from planner.bounds import MAX_SLO_MS as MAX_SLO_MS

# ---------------------------------------------------------------- workloads (checked with every Workload)

#: Most workloads one apply may carry.
MAX_WORKLOADS_PER_APPLY = 10_000

# ---------------------------------------------------------------- what an agent sends

#: Most devices one node may register.
MAX_DEVICES = 64
#: Most CPU cores one device may report.
MAX_CORES = 4096
#: Most assignments, observations or errors one heartbeat may carry (and one node may be sent).
MAX_ASSIGNMENTS = 256
#: Most events one heartbeat may carry, and the longest event (characters).
MAX_EVENTS = 50
MAX_EVENT_CHARS = 1000
#: Longest assignment error message, device name, address or endpoint (characters).
MAX_MESSAGE_CHARS = 2000
MAX_TEXT_CHARS = 256
#: Largest figure an observation may carry (rates, milliseconds, counters).
MAX_FIGURE = 1e15
#: Largest batch and queue delay an assignment may ask for.
MAX_BATCH = 4096
MAX_QUEUE_DELAY_MS = MAX_SLO_MS
#: Largest profile a user may upload (bytes of JSON).
MAX_PROFILE_BYTES = 4 * 1024 * 1024
#: Verify before serving: most measure requests one heartbeat answer may carry, most batch sizes one request
#: may name, most requests per measurement window, and the largest solo active time a node may report (ms).
MAX_MEASURE_REQUESTS = 32
MAX_MEASURE_BATCHES = 256
MAX_MEASURE_WINDOW_REQUESTS = 1_000
#: Most measured points one heartbeat may carry (every batch of every request).
MAX_MEASURED = MAX_MEASURE_REQUESTS * MAX_MEASURE_BATCHES
MAX_ACTIVE_MS = 1e6
#: The key an agent reports a refused assignment under when the assignment's own key is not safe to echo.
REFUSED_KEY = "refused#0"


def _name(value: Any, field: str) -> None:
    problem = name_problem(value)
    if problem:
        raise invalid(field, problem)


def _text(value: str, field: str, limit: int, allow_empty: bool = True) -> None:
    if not allow_empty and not value:
        raise invalid(field, "must not be empty")
    if len(value) > limit:
        raise invalid(field, f"must be at most {limit} characters, got {len(value)}")
    if not value.isprintable():
        raise invalid(field, f"must be printable text (no control or invisible characters), got {shown(value)}")


def _count(items: Sequence[Any], field: str, limit: int) -> None:
    if len(items) > limit:
        raise invalid(field, f"must hold at most {limit} entries, got {len(items)}")


def _figure(value: float, field: str, lo: float = 0.0, hi: float = MAX_FIGURE) -> None:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and lo <= value <= hi):
        raise invalid(field, f"must be a finite number from {lo:g} to {hi:g}, got {shown(value)}")


# ---------------------------------------------------------------- the controller checks the agent


def check_devices(devices: Sequence[NodeDevice]) -> None:
    """A node's registration: 1..`MAX_DEVICES` devices with unique indexes and bounded fields."""
    if not devices:
        raise invalid("devices", "report at least one device")
    _count(devices, "devices", MAX_DEVICES)
    for i, d in enumerate(devices):
        where = f"devices[{i}]"
        if not 0 <= d.index < MAX_DEVICES:
            raise invalid(f"{where}.index", f"must be from 0 to {MAX_DEVICES - 1}, got {d.index}")
        _text(d.name, f"{where}.name", MAX_TEXT_CHARS, allow_empty=False)
        if d.kind not in ("gpu", "cpu"):
            raise invalid(f"{where}.kind", f"must be 'gpu' or 'cpu', got {shown(d.kind)}")
        if not 0 <= d.cores <= MAX_CORES:
            raise invalid(f"{where}.cores", f"must be from 0 to {MAX_CORES}, got {d.cores}")
        if d.memory_bytes < 0:
            raise invalid(f"{where}.memory_bytes", f"must be >= 0, got {d.memory_bytes}")
        if d.gpu_type:
            _name(d.gpu_type, f"{where}.gpu_type")
    indexes = [d.index for d in devices]
    if len(set(indexes)) != len(indexes):
        raise invalid("devices", f"device indexes must be unique, got {indexes[:MAX_DEVICES]}")


def check_address(address: str) -> None:
    _text(address, "address", MAX_TEXT_CHARS)


def check_assignment(a: ModelAssignment, field: str) -> None:
    """One assignment's names and figures (the same rule on both sides)."""
    _name(a.workload, f"{field}.workload")
    _name(a.model, f"{field}.model")
    if not 0 <= a.replica < MAX_REPLICAS:
        raise invalid(f"{field}.replica", f"must be from 0 to {MAX_REPLICAS - 1}, got {a.replica}")
    if not 0 <= a.device < MAX_DEVICES:
        raise invalid(f"{field}.device", f"must be from 0 to {MAX_DEVICES - 1}, got {a.device}")
    if not (math.isfinite(a.share_pct) and 0 < a.share_pct <= 100):
        raise invalid(f"{field}.share_pct", f"must be more than 0 and at most 100, got {shown(a.share_pct)}")
    if not 1 <= a.batch <= MAX_BATCH:
        raise invalid(f"{field}.batch", f"must be from 1 to {MAX_BATCH}, got {a.batch}")
    _figure(a.queue_delay_ms, f"{field}.queue_delay_ms", 0.0, MAX_QUEUE_DELAY_MS)
    _figure(a.slo_ms, f"{field}.slo_ms", 0.0, MAX_SLO_MS)
    _figure(a.rate_rps, f"{field}.rate_rps", 0.0, MAX_RATE_RPS)


def check_report(r: HeartbeatReport) -> None:
    """A heartbeat: bounded counts, valid names, finite figures, printable text."""
    _count(r.running, "running", MAX_ASSIGNMENTS)
    _count(r.observed, "observed", MAX_ASSIGNMENTS)
    _count(r.errors, "errors", MAX_ASSIGNMENTS)
    _count(r.events, "events", MAX_EVENTS)
    _count(r.endpoints, "endpoints", MAX_ASSIGNMENTS)
    _count(r.measured, "measured", MAX_MEASURED)
    for i, m in enumerate(r.measured):
        check_measured_point(m, f"measured[{i}]")
    for i, a in enumerate(r.running):
        check_assignment(a, f"running[{i}]")
    for i, o in enumerate(r.observed):
        _check_observation(o, f"observed[{i}]")
    for i, e in enumerate(r.errors):
        _key(e.key, f"errors[{i}].key")
        _text(e.message, f"errors[{i}].message", MAX_MESSAGE_CHARS)
    for i, text in enumerate(r.events):
        _text(text, f"events[{i}]", MAX_EVENT_CHARS)
    for i, ep in enumerate(r.endpoints):
        _key(ep.key, f"endpoints[{i}].key")
        for name in ("grpc", "http", "metrics", "backend"):
            _text(getattr(ep, name), f"endpoints[{i}].{name}", MAX_TEXT_CHARS)
    for name in ("applied_revision", "errors_revision"):
        if getattr(r, name) < 0:
            raise invalid(name, f"must be >= 0, got {getattr(r, name)}")
    if not 0 <= r.sequence < 2**63:
        raise invalid("sequence", f"must be 0 <= sequence < 2**63, got {r.sequence}")
    if len(r.incarnation) > 64 or any(c not in "0123456789abcdef" for c in r.incarnation):
        raise invalid("incarnation", f"must be up to 64 lowercase hex digits, got {shown(r.incarnation, 80)}")
    if bool(r.sequence) != bool(r.incarnation):
        raise invalid("sequence", "a numbered heartbeat needs both sequence and incarnation (or neither)")


def _share(value: float, field: str) -> None:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and 0 < value <= 100):
        raise invalid(field, f"must be more than 0 and at most 100, got {shown(value)}")


def check_measured_point(m: MeasuredPoint, field: str) -> None:
    """One measured point a node reports: a valid model name, device, share and batch, and either a solo
    active time in (0, `MAX_ACTIVE_MS`] ms or an error (then `active_ms` is 0)."""
    _name(m.model, f"{field}.model")
    if not 0 <= m.device < MAX_DEVICES:
        raise invalid(f"{field}.device", f"must be from 0 to {MAX_DEVICES - 1}, got {m.device}")
    _share(m.share_pct, f"{field}.share_pct")
    if not 1 <= m.batch <= MAX_BATCH:
        raise invalid(f"{field}.batch", f"must be from 1 to {MAX_BATCH}, got {m.batch}")
    _text(m.error, f"{field}.error", MAX_MESSAGE_CHARS)
    if m.error:
        if m.active_ms != 0:
            raise invalid(f"{field}.active_ms", f"must be 0 with an error, got {shown(m.active_ms)}")
    elif not (isinstance(m.active_ms, (int, float)) and math.isfinite(m.active_ms) and 0 < m.active_ms):
        raise invalid(
            f"{field}.active_ms", f"must be a finite time above 0 ms (or give an error), got {shown(m.active_ms)}"
        )
    elif m.active_ms > MAX_ACTIVE_MS:
        raise invalid(f"{field}.active_ms", f"must be at most {MAX_ACTIVE_MS:g} ms, got {m.active_ms:g}")


def _key(key: str, field: str) -> None:
    try:
        replica = Replica.parse(key)
    except ValueError:
        raise invalid(field, f"must be an assignment key (name#replica), got {shown(key)}") from None
    _name(replica.workload, field)


#: The window's figures (the closed loop) that must be finite figures too, and those that may be absent.
_WINDOW_FIGURES = (
    "seq",
    "window_s",
    "requests",
    "window_failures",
    "pending",
    "compute_input_ms",
    "compute_infer_ms",
    "compute_output_ms",
    "instances",
    "latency_count",
)
_OPTIONAL_FIGURES = (
    "latency_p50_ms",
    "latency_p95_ms",
    "latency_p99_ms",
    "over_slo_ratio",
    "device_utilization_pct",
    "sm_clock_mhz",
    "power_w",
)


def _check_observation(o: Observation, field: str) -> None:
    _key(o.key, f"{field}.key")
    _name(o.model, f"{field}.model")
    for name in ("request_rate_rps", "mean_batch", "mean_queue_ms", "mean_compute_ms", "failures", "success"):
        _figure(getattr(o, name), f"{field}.{name}")
    _text(o.endpoint, f"{field}.endpoint", MAX_TEXT_CHARS)
    for name in _WINDOW_FIGURES:
        _figure(getattr(o, name), f"{field}.{name}")
    for name in _OPTIONAL_FIGURES:
        if getattr(o, name) is not None:
            _figure(getattr(o, name), f"{field}.{name}")
    _count(o.batch_stats, f"{field}.batch_stats", MAX_BATCH_STATS)
    for j, b in enumerate(o.batch_stats):
        if not 1 <= b.batch <= MAX_BATCH:
            raise invalid(f"{field}.batch_stats[{j}].batch", f"must be from 1 to {MAX_BATCH}, got {b.batch}")
        _figure(b.executions, f"{field}.batch_stats[{j}].executions")
        _figure(b.compute_ms, f"{field}.batch_stats[{j}].compute_ms")


# ---------------------------------------------------------------- the agent checks the controller


def assignment_problems(assignments: Sequence[ModelAssignment]) -> list[AssignmentError]:
    """Why assignments sent by a controller cannot be run as they are: one error per refused key (empty when
    all are fine). Names and figures follow `check_assignment`; keys must be unique; the list is bounded.
    Whether they fit the node's devices is the fleet's own check (`agents.triton.overcommit_problems`)."""
    problems: list[AssignmentError] = []
    if len(assignments) > MAX_ASSIGNMENTS:
        return [
            AssignmentError(REFUSED_KEY, f"{len(assignments)} assignments, more than the {MAX_ASSIGNMENTS} allowed")
        ]
    seen: set[str] = set()
    for i, a in enumerate(assignments):
        try:
            check_assignment(a, f"assignments[{i}]")
        except ValueError as err:
            problems.append(AssignmentError(_safe_key(a), f"refused: {err}"))
            continue
        if a.key in seen:
            problems.append(AssignmentError(a.key, "refused: the assignment key appears twice"))
        seen.add(a.key)
    return problems


def check_measure_request(m: MeasureRequest, field: str) -> None:
    """One measure request (the agent's check of what a controller asks it to run): a valid model name, a
    device and share like an assignment's, 1..`MAX_MEASURE_BATCHES` unique batch sizes in 1..`MAX_BATCH`, and
    1..`MAX_MEASURE_WINDOW_REQUESTS` requests per window."""
    _name(m.model, f"{field}.model")
    if not 0 <= m.device < MAX_DEVICES:
        raise invalid(f"{field}.device", f"must be from 0 to {MAX_DEVICES - 1}, got {m.device}")
    _share(m.share_pct, f"{field}.share_pct")
    if not 1 <= len(m.batches) <= MAX_MEASURE_BATCHES:
        raise invalid(f"{field}.batches", f"must name 1 to {MAX_MEASURE_BATCHES} batch sizes, got {len(m.batches)}")
    bad = [b for b in m.batches if not (isinstance(b, int) and 1 <= b <= MAX_BATCH)]
    if bad:
        raise invalid(f"{field}.batches", f"batch sizes must be from 1 to {MAX_BATCH}, got {shown(bad[0])}")
    if len(set(m.batches)) != len(m.batches):
        raise invalid(f"{field}.batches", "each batch size at most once")
    if not 1 <= m.requests <= MAX_MEASURE_WINDOW_REQUESTS:
        raise invalid(f"{field}.requests", f"must be from 1 to {MAX_MEASURE_WINDOW_REQUESTS}, got {m.requests}")


def measure_request_problems(requests: Sequence[MeasureRequest]) -> list[str]:
    """Why measure requests sent by a controller cannot be run (empty when all are fine): at most
    `MAX_MEASURE_REQUESTS`, each as `check_measure_request`, no (model, device, share) twice. The agent
    refuses the whole list then and measures nothing of it."""
    if len(requests) > MAX_MEASURE_REQUESTS:
        return [f"measure: {len(requests)} requests, more than the {MAX_MEASURE_REQUESTS} allowed"]
    problems: list[str] = []
    seen: set[tuple[str, int, float]] = set()
    for i, m in enumerate(requests):
        try:
            check_measure_request(m, f"measure[{i}]")
        except ValueError as err:
            problems.append(f"refused: {err}")
            continue
        point = (m.model, m.device, round(m.share_pct, 6))
        if point in seen:
            problems.append(f"refused: measure[{i}]: {m.model} on device {m.device} at {m.share_pct:g}% appears twice")
        seen.add(point)
    return problems


def _safe_key(a: ModelAssignment) -> str:
    """The key of an assignment to report it by, or a stand-in when its name is not safe to echo."""
    return a.key if not name_problem(a.workload) and 0 <= a.replica < MAX_REPLICAS else REFUSED_KEY


# ---------------------------------------------------------------- observations checked against assignments

#: A node's window counts for at most this many times the rate its replica was given (req/s): a demand
#: spike shows (an auto workload can still grow by this factor per plan), a lie of 1e6 req/s does not.
OBSERVED_RATE_BOUND = 4.0
#: ... plus this much (req/s), so a replica planned for a tiny rate can still show some load.
OBSERVED_RATE_SLACK_RPS = 10.0


def admit_observations(
    observed: Sequence[Observation], assigned: Sequence[ModelAssignment]
) -> tuple[tuple[Observation, ...], tuple[str, ...]]:
    """(the windows that count, why the others do not) for one node's heartbeat.

    A window counts only for a replica assigned to this node, with the model it was assigned; its rate
    (and request count) at most `OBSERVED_RATE_BOUND` x the replica's planned rate + `OBSERVED_RATE_SLACK_RPS`.
    So one node cannot speak for another node's replicas, invent workloads or models, or push a planned
    rate past the bound in one step."""
    by_key = {a.key: a for a in assigned}
    kept: list[Observation] = []
    refused: list[str] = []
    for o in observed:
        a = by_key.get(o.key)
        if a is None:
            refused.append(f"{shown(o.key, 80)}: not assigned to this node")
            continue
        if o.model != a.model:
            refused.append(f"{o.key}: model {shown(o.model, 80)} is not the assigned {a.model}")
            continue
        ceiling = a.rate_rps * OBSERVED_RATE_BOUND + OBSERVED_RATE_SLACK_RPS
        if o.request_rate_rps > ceiling:
            scale = ceiling / o.request_rate_rps
            o = replace(o, request_rate_rps=ceiling, requests=int(o.requests * scale))
            refused.append(f"{o.key}: rate cut to {ceiling:g} req/s ({OBSERVED_RATE_BOUND:g} x the planned rate)")
        kept.append(o)
    return tuple(kept), tuple(refused)
