"""What the agents, the API client and the controller's service say to each other. Plain data.

The node side (`agents`) and the client side (`controller.api.client`) import
this module and nothing of the controller's service, store or solver (an
import contract holds it). It depends on nothing heavy: dataclasses and
`foundation.errors`.

- `Replica`: the key of one replica of a workload, ``"name#replica"`` on the
  wire, in Triton's process names and in every report;
- `ModelAssignment`: what a node is asked to run (the plan, cut per node);
- `NodeDevice`, `Observation`, `AssignmentError`, `ServingEndpoint`,
  `HeartbeatReport`, `HeartbeatAnswer`: registration and the heartbeat;
- `MeasureRequest`, `MeasuredPoint`: verify before serving (the controller asks a node
  to measure a point in the heartbeat answer; the node reports it in a later heartbeat);
- the errors the API answers with (`InvalidArgument`, `NotFound`,
  `FailedPrecondition`) and the ones a client meets on the way
  (`Unavailable`, `Unauthenticated`, `PermissionDenied`), all under `ApiError`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from foundation.errors import InputError, StokeError
from foundation.names import name_problem

#: Separates the workload name from the replica index in a `Replica` key.
REPLICA_SEPARATOR = "#"


# ---------------------------------------------------------------- errors the API answers with


class ApiError(StokeError, RuntimeError):
    """The controller refused a call, or could not be reached; the message says why."""


class InvalidArgument(InputError, ApiError):
    """A request field is bad: `field` names it (e.g. ``workloads[1].slo_ms``)."""


class NotFound(ApiError):
    """The request names something the controller does not have."""


class FailedPrecondition(ApiError):
    """The stored state cannot do what was asked (e.g. its workloads cannot be planned); the request was fine."""


class Unavailable(ApiError):
    """The controller cannot be reached."""


class TlsMismatch(Unavailable):
    """The controller was reached, but TLS is on one side only: the message says what to pass."""


class Unauthenticated(ApiError):
    """The controller refused the token."""


class ResourceExhausted(ApiError):
    """Too many calls (a node heartbeating faster than its rate limit): retry later."""


class PermissionDenied(ApiError):
    """The token is valid but may not make this call (a user token on the agent API, an agent token on
    another node's behalf or on the user API)."""


def invalid(field: str, problem: str) -> InvalidArgument:
    """The error for a bad request field, worded ``field: problem``."""
    return InvalidArgument(f"{field}: {problem}", field)


def check_name(value: Any, field: str) -> str:
    """A workload, model, GPU type or node name, stripped; the rule is `foundation.names` (shared with the agent)."""
    name = value.strip() if isinstance(value, str) else value
    problem = name_problem(name)
    if problem:
        raise invalid(field, problem)
    return str(name)


# ---------------------------------------------------------------- assignments


@dataclass(frozen=True, order=True)
class Replica:
    """One replica of a workload; ``str()`` gives its key, ``"name#replica"``."""

    workload: str
    index: int = 0

    def __str__(self) -> str:
        return f"{self.workload}{REPLICA_SEPARATOR}{self.index}"

    @classmethod
    def parse(cls, key: str) -> Replica:
        name, _, index = key.rpartition(REPLICA_SEPARATOR)
        if not name or not index.isdigit():
            raise ValueError(f"{key!r} is not a replica key (name{REPLICA_SEPARATOR}index)")
        return cls(name, int(index))


class PlacedReplica(Protocol):
    """What a replica's config is read from: a plan's placement (`planner.solver.Placement`)."""

    @property
    def name(self) -> str: ...
    @property
    def model(self) -> str: ...
    @property
    def share_pct(self) -> float: ...
    @property
    def batch(self) -> int: ...
    @property
    def queue_delay_ms(self) -> float: ...
    @property
    def slo_ms(self) -> float: ...
    @property
    def rate_rps(self) -> float: ...
    @property
    def replica(self) -> int: ...


@dataclass(frozen=True)
class ModelAssignment:
    """One model to serve on one device of a node, with its share and batching."""

    workload: str  # workload name; with `replica` the unique key of the assignment
    model: str  # model name in the model repository
    device: int  # GPU index on a GPU node; 0 on a CPU node
    share_pct: float  # MPS active-thread % on a GPU node; % of the CPU cores on a CPU node
    batch: int  # max_batch_size / preferred batch
    queue_delay_ms: float  # dynamic batching max queue delay
    slo_ms: float
    rate_rps: float
    replica: int = 0

    @property
    def key(self) -> str:
        return str(Replica(self.workload, self.replica))

    @classmethod
    def of(cls, placement: PlacedReplica, device: int) -> ModelAssignment:
        """The assignment that serves `placement` on `device`: the one place a replica's config is copied."""
        p = placement
        return cls(
            workload=p.name,
            model=p.model,
            device=device,
            share_pct=float(p.share_pct),
            batch=int(p.batch),
            queue_delay_ms=float(p.queue_delay_ms),
            slo_ms=float(p.slo_ms),
            rate_rps=float(p.rate_rps),
            replica=int(p.replica),
        )


# ---------------------------------------------------------------- registration and heartbeat


@dataclass(frozen=True)
class NodeDevice:
    index: int
    name: str
    kind: str  # "gpu" | "cpu"
    memory_bytes: int = 0
    cores: int = 0
    gpu_type: str = ""  # "" = resolved by the controller (ServiceConfig.gpu_type_for)


#: Most batch sizes one observation may describe (Triton's batch statistics, one entry per size seen).
MAX_BATCH_STATS = 256


@dataclass(frozen=True)
class BatchStat:
    """Executions of one batch size in an observation window and their mean duration (Triton's batch
    statistics: compute input + infer + output of one execution, in ms)."""

    batch: int
    executions: int
    compute_ms: float


@dataclass(frozen=True)
class Observation:
    """Per-assignment figures an agent observed over its last window (Triton, the SLI histogram, the device).

    Rates, means and histograms cover the window of `window_s` seconds before the
    report; `failures` and `success` are the server's cumulative counters. Figures
    the node could not observe are None (latency percentiles need the SLI
    histogram of the serving path, device readings a device reader).
    """

    key: str
    model: str
    request_rate_rps: float = 0.0
    mean_batch: float = 0.0
    mean_queue_ms: float = 0.0
    mean_compute_ms: float = 0.0
    failures: int = 0
    success: int = 0
    endpoint: str = ""
    # ---- the window (closed loop: recorded by the controller, feeds recalibration, demand and the guard)
    seq: int = 0  # counts this replica's windows on its node; the controller stores each window once
    window_s: float = 0.0
    requests: int = 0  # requests completed in the window
    window_failures: int = 0  # requests failed in the window
    pending: int = 0  # requests waiting in Triton's queue at the end of the window
    batch_stats: tuple[BatchStat, ...] = ()  # per batch size: executions and mean duration
    compute_input_ms: float = 0.0  # per request, mean over the window
    compute_infer_ms: float = 0.0
    compute_output_ms: float = 0.0
    instances: int = 1  # model instances serving it
    latency_count: int = 0  # requests the SLI histogram saw in the window (0: no percentiles)
    latency_p50_ms: float | None = None
    latency_p95_ms: float | None = None
    latency_p99_ms: float | None = None
    over_slo_ratio: float | None = None  # share of the window's requests slower than the SLO
    device_utilization_pct: float | None = None
    sm_clock_mhz: float | None = None
    power_w: float | None = None

    @property
    def latency_ms(self) -> float:
        return self.mean_queue_ms + self.mean_compute_ms

    @property
    def success_in_window(self) -> bool:
        return self.request_rate_rps > 0 or self.mean_compute_ms > 0


@dataclass(frozen=True)
class AssignmentError:
    """Why one assignment (its `key`) failed to start, move or reload on a node."""

    key: str
    message: str

    def __str__(self) -> str:
        return f"{self.key}: {self.message}"


@dataclass(frozen=True)
class ServingEndpoint:
    """Where clients reach one assignment (`key`): the node's stable endpoints of its workload
    (`agents.router`: they survive share moves) and the Triton process behind them (`backend`)."""

    key: str
    grpc: str  # HOST:PORT, Triton's gRPC API
    http: str = ""  # http://HOST:PORT, Triton's HTTP API
    metrics: str = ""  # http://HOST:PORT/metrics, Prometheus
    backend: str = ""  # the Triton process's own gRPC address (loopback; changes when the process does)


@dataclass(frozen=True)
class MeasureRequest:
    """Verify before serving: measure `model` alone on `device` at `share_pct`, at each of `batches`
    (its solo active time per batch, the way `stoke profile verify` measures), over `requests` requests
    per measurement window. The controller keeps asking in every heartbeat answer until the results are
    in (level-based: a repeated answer measures nothing twice)."""

    model: str
    device: int
    share_pct: float
    batches: tuple[int, ...]
    requests: int = 20


@dataclass(frozen=True)
class MeasuredPoint:
    """One measured point of a `MeasureRequest`: the solo active time (ms) of `model` at `batch` on
    `device` at `share_pct`, or why it could not be measured (`error`, `active_ms` 0)."""

    model: str
    device: int
    share_pct: float
    batch: int
    active_ms: float = 0.0
    error: str = ""


@dataclass(frozen=True)
class HeartbeatReport:
    node_id: str
    running: tuple[ModelAssignment, ...] = ()
    observed: tuple[Observation, ...] = ()
    events: tuple[str, ...] = ()
    errors: tuple[AssignmentError, ...] = ()
    applied_revision: int = 0
    errors_revision: int = 0  # the plan revision whose apply produced `errors`
    endpoints: tuple[ServingEndpoint, ...] = ()
    #: Replay protection: `incarnation` names the agent process (random, made at its start), `sequence`
    #: counts its heartbeats from 1; the controller refuses one whose sequence is not above the last it took
    #: from that incarnation. 0: an older agent that does not number them (understood until the node sends a
    #: numbered one).
    sequence: int = 0
    incarnation: str = ""
    #: results of the `MeasureRequest`s the controller asked for (sent until it stops asking)
    measured: tuple[MeasuredPoint, ...] = ()


@dataclass(frozen=True)
class HeartbeatAnswer:
    registered: bool
    revision: int = 0
    assignments: tuple[ModelAssignment, ...] = ()
    heartbeat_interval_s: float = 0.0
    #: True: keep running what runs and ignore `assignments` (the controller is re-planning with this node
    #: back); never read as "stop everything"
    hold: bool = False
    #: points to measure before a new assignment serves (verify before serving; usually empty)
    measure: tuple[MeasureRequest, ...] = ()
