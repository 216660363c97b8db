from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Workload(_message.Message):
    __slots__ = ("name", "model", "slo_ms", "rate_rps", "gpu_type", "rate_auto", "min_rps", "max_rps", "arrivals")
    NAME_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    SLO_MS_FIELD_NUMBER: _ClassVar[int]
    RATE_RPS_FIELD_NUMBER: _ClassVar[int]
    GPU_TYPE_FIELD_NUMBER: _ClassVar[int]
    RATE_AUTO_FIELD_NUMBER: _ClassVar[int]
    MIN_RPS_FIELD_NUMBER: _ClassVar[int]
    MAX_RPS_FIELD_NUMBER: _ClassVar[int]
    ARRIVALS_FIELD_NUMBER: _ClassVar[int]
    name: str
    model: str
    slo_ms: float
    rate_rps: float
    gpu_type: str
    rate_auto: bool
    min_rps: float
    max_rps: float
    arrivals: str
    def __init__(self, name: _Optional[str] = ..., model: _Optional[str] = ..., slo_ms: _Optional[float] = ..., rate_rps: _Optional[float] = ..., gpu_type: _Optional[str] = ..., rate_auto: _Optional[bool] = ..., min_rps: _Optional[float] = ..., max_rps: _Optional[float] = ..., arrivals: _Optional[str] = ...) -> None: ...

class ApplyWorkloadsRequest(_message.Message):
    __slots__ = ("workloads", "dry_run")
    WORKLOADS_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    workloads: _containers.RepeatedCompositeFieldContainer[Workload]
    dry_run: bool
    def __init__(self, workloads: _Optional[_Iterable[_Union[Workload, _Mapping]]] = ..., dry_run: _Optional[bool] = ...) -> None: ...

class ApplyWorkloadsResponse(_message.Message):
    __slots__ = ("created", "updated", "unchanged")
    CREATED_FIELD_NUMBER: _ClassVar[int]
    UPDATED_FIELD_NUMBER: _ClassVar[int]
    UNCHANGED_FIELD_NUMBER: _ClassVar[int]
    created: _containers.RepeatedScalarFieldContainer[str]
    updated: _containers.RepeatedScalarFieldContainer[str]
    unchanged: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, created: _Optional[_Iterable[str]] = ..., updated: _Optional[_Iterable[str]] = ..., unchanged: _Optional[_Iterable[str]] = ...) -> None: ...

class DeleteWorkloadRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class DeleteWorkloadResponse(_message.Message):
    __slots__ = ("deleted",)
    DELETED_FIELD_NUMBER: _ClassVar[int]
    deleted: bool
    def __init__(self, deleted: _Optional[bool] = ...) -> None: ...

class ListWorkloadsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListWorkloadsResponse(_message.Message):
    __slots__ = ("workloads",)
    WORKLOADS_FIELD_NUMBER: _ClassVar[int]
    workloads: _containers.RepeatedCompositeFieldContainer[Workload]
    def __init__(self, workloads: _Optional[_Iterable[_Union[Workload, _Mapping]]] = ...) -> None: ...

class Placement(_message.Message):
    __slots__ = ("workload", "model", "slo_ms", "rate_rps", "share_pct", "batch", "queue_delay_ms", "predicted_latency_ms", "predicted_throughput_rps", "replica", "replicas")
    WORKLOAD_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    SLO_MS_FIELD_NUMBER: _ClassVar[int]
    RATE_RPS_FIELD_NUMBER: _ClassVar[int]
    SHARE_PCT_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    QUEUE_DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_LATENCY_MS_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_THROUGHPUT_RPS_FIELD_NUMBER: _ClassVar[int]
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    workload: str
    model: str
    slo_ms: float
    rate_rps: float
    share_pct: float
    batch: int
    queue_delay_ms: float
    predicted_latency_ms: float
    predicted_throughput_rps: float
    replica: int
    replicas: int
    def __init__(self, workload: _Optional[str] = ..., model: _Optional[str] = ..., slo_ms: _Optional[float] = ..., rate_rps: _Optional[float] = ..., share_pct: _Optional[float] = ..., batch: _Optional[int] = ..., queue_delay_ms: _Optional[float] = ..., predicted_latency_ms: _Optional[float] = ..., predicted_throughput_rps: _Optional[float] = ..., replica: _Optional[int] = ..., replicas: _Optional[int] = ...) -> None: ...

class PlanGpu(_message.Message):
    __slots__ = ("gpu_type", "price_per_hour", "node_id", "device", "placements")
    GPU_TYPE_FIELD_NUMBER: _ClassVar[int]
    PRICE_PER_HOUR_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    PLACEMENTS_FIELD_NUMBER: _ClassVar[int]
    gpu_type: str
    price_per_hour: float
    node_id: str
    device: int
    placements: _containers.RepeatedCompositeFieldContainer[Placement]
    def __init__(self, gpu_type: _Optional[str] = ..., price_per_hour: _Optional[float] = ..., node_id: _Optional[str] = ..., device: _Optional[int] = ..., placements: _Optional[_Iterable[_Union[Placement, _Mapping]]] = ...) -> None: ...

class Pending(_message.Message):
    __slots__ = ("workload", "reason")
    WORKLOAD_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    workload: str
    reason: str
    def __init__(self, workload: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class Plan(_message.Message):
    __slots__ = ("revision", "strategy", "gpus", "notes", "cost_per_hour", "pending", "created_unix")
    REVISION_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    NOTES_FIELD_NUMBER: _ClassVar[int]
    COST_PER_HOUR_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    CREATED_UNIX_FIELD_NUMBER: _ClassVar[int]
    revision: int
    strategy: str
    gpus: _containers.RepeatedCompositeFieldContainer[PlanGpu]
    notes: _containers.RepeatedScalarFieldContainer[str]
    cost_per_hour: float
    pending: _containers.RepeatedCompositeFieldContainer[Pending]
    created_unix: float
    def __init__(self, revision: _Optional[int] = ..., strategy: _Optional[str] = ..., gpus: _Optional[_Iterable[_Union[PlanGpu, _Mapping]]] = ..., notes: _Optional[_Iterable[str]] = ..., cost_per_hour: _Optional[float] = ..., pending: _Optional[_Iterable[_Union[Pending, _Mapping]]] = ..., created_unix: _Optional[float] = ...) -> None: ...

class NodeChange(_message.Message):
    __slots__ = ("node_id", "start", "reload", "move", "stop")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    RELOAD_FIELD_NUMBER: _ClassVar[int]
    MOVE_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    start: _containers.RepeatedScalarFieldContainer[str]
    reload: _containers.RepeatedScalarFieldContainer[str]
    move: _containers.RepeatedScalarFieldContainer[str]
    stop: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, node_id: _Optional[str] = ..., start: _Optional[_Iterable[str]] = ..., reload: _Optional[_Iterable[str]] = ..., move: _Optional[_Iterable[str]] = ..., stop: _Optional[_Iterable[str]] = ...) -> None: ...

class PreviewPlanRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetPlanRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ApplyPlanRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PlanResponse(_message.Message):
    __slots__ = ("plan", "changed", "changes")
    PLAN_FIELD_NUMBER: _ClassVar[int]
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    CHANGES_FIELD_NUMBER: _ClassVar[int]
    plan: Plan
    changed: bool
    changes: _containers.RepeatedCompositeFieldContainer[NodeChange]
    def __init__(self, plan: _Optional[_Union[Plan, _Mapping]] = ..., changed: _Optional[bool] = ..., changes: _Optional[_Iterable[_Union[NodeChange, _Mapping]]] = ...) -> None: ...

class Device(_message.Message):
    __slots__ = ("index", "name", "kind", "memory_bytes", "cores", "gpu_type")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    CORES_FIELD_NUMBER: _ClassVar[int]
    GPU_TYPE_FIELD_NUMBER: _ClassVar[int]
    index: int
    name: str
    kind: str
    memory_bytes: int
    cores: int
    gpu_type: str
    def __init__(self, index: _Optional[int] = ..., name: _Optional[str] = ..., kind: _Optional[str] = ..., memory_bytes: _Optional[int] = ..., cores: _Optional[int] = ..., gpu_type: _Optional[str] = ...) -> None: ...

class Assignment(_message.Message):
    __slots__ = ("workload", "model", "device", "share_pct", "batch", "queue_delay_ms", "slo_ms", "rate_rps", "replica")
    WORKLOAD_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    SHARE_PCT_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    QUEUE_DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    SLO_MS_FIELD_NUMBER: _ClassVar[int]
    RATE_RPS_FIELD_NUMBER: _ClassVar[int]
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    workload: str
    model: str
    device: int
    share_pct: float
    batch: int
    queue_delay_ms: float
    slo_ms: float
    rate_rps: float
    replica: int
    def __init__(self, workload: _Optional[str] = ..., model: _Optional[str] = ..., device: _Optional[int] = ..., share_pct: _Optional[float] = ..., batch: _Optional[int] = ..., queue_delay_ms: _Optional[float] = ..., slo_ms: _Optional[float] = ..., rate_rps: _Optional[float] = ..., replica: _Optional[int] = ...) -> None: ...

class BatchStat(_message.Message):
    __slots__ = ("batch", "executions", "compute_ms")
    BATCH_FIELD_NUMBER: _ClassVar[int]
    EXECUTIONS_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_MS_FIELD_NUMBER: _ClassVar[int]
    batch: int
    executions: int
    compute_ms: float
    def __init__(self, batch: _Optional[int] = ..., executions: _Optional[int] = ..., compute_ms: _Optional[float] = ...) -> None: ...

class Observed(_message.Message):
    __slots__ = ("key", "model", "request_rate_rps", "mean_batch", "mean_queue_ms", "mean_compute_ms", "failures", "success", "endpoint", "seq", "window_s", "requests", "window_failures", "pending", "batch_stats", "compute_input_ms", "compute_infer_ms", "compute_output_ms", "instances", "latency_count", "latency_p50_ms", "latency_p95_ms", "latency_p99_ms", "over_slo_ratio", "device_utilization_pct", "sm_clock_mhz", "power_w", "pooled_p99_ms", "pooled_count", "pooled_windows")
    KEY_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    REQUEST_RATE_RPS_FIELD_NUMBER: _ClassVar[int]
    MEAN_BATCH_FIELD_NUMBER: _ClassVar[int]
    MEAN_QUEUE_MS_FIELD_NUMBER: _ClassVar[int]
    MEAN_COMPUTE_MS_FIELD_NUMBER: _ClassVar[int]
    FAILURES_FIELD_NUMBER: _ClassVar[int]
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    WINDOW_S_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FAILURES_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    BATCH_STATS_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_INPUT_MS_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_INFER_MS_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_OUTPUT_MS_FIELD_NUMBER: _ClassVar[int]
    INSTANCES_FIELD_NUMBER: _ClassVar[int]
    LATENCY_COUNT_FIELD_NUMBER: _ClassVar[int]
    LATENCY_P50_MS_FIELD_NUMBER: _ClassVar[int]
    LATENCY_P95_MS_FIELD_NUMBER: _ClassVar[int]
    LATENCY_P99_MS_FIELD_NUMBER: _ClassVar[int]
    OVER_SLO_RATIO_FIELD_NUMBER: _ClassVar[int]
    DEVICE_UTILIZATION_PCT_FIELD_NUMBER: _ClassVar[int]
    SM_CLOCK_MHZ_FIELD_NUMBER: _ClassVar[int]
    POWER_W_FIELD_NUMBER: _ClassVar[int]
    POOLED_P99_MS_FIELD_NUMBER: _ClassVar[int]
    POOLED_COUNT_FIELD_NUMBER: _ClassVar[int]
    POOLED_WINDOWS_FIELD_NUMBER: _ClassVar[int]
    key: str
    model: str
    request_rate_rps: float
    mean_batch: float
    mean_queue_ms: float
    mean_compute_ms: float
    failures: int
    success: int
    endpoint: str
    seq: int
    window_s: float
    requests: int
    window_failures: int
    pending: int
    batch_stats: _containers.RepeatedCompositeFieldContainer[BatchStat]
    compute_input_ms: float
    compute_infer_ms: float
    compute_output_ms: float
    instances: int
    latency_count: int
    latency_p50_ms: float
    latency_p95_ms: float
    latency_p99_ms: float
    over_slo_ratio: float
    device_utilization_pct: float
    sm_clock_mhz: float
    power_w: float
    pooled_p99_ms: float
    pooled_count: int
    pooled_windows: int
    def __init__(self, key: _Optional[str] = ..., model: _Optional[str] = ..., request_rate_rps: _Optional[float] = ..., mean_batch: _Optional[float] = ..., mean_queue_ms: _Optional[float] = ..., mean_compute_ms: _Optional[float] = ..., failures: _Optional[int] = ..., success: _Optional[int] = ..., endpoint: _Optional[str] = ..., seq: _Optional[int] = ..., window_s: _Optional[float] = ..., requests: _Optional[int] = ..., window_failures: _Optional[int] = ..., pending: _Optional[int] = ..., batch_stats: _Optional[_Iterable[_Union[BatchStat, _Mapping]]] = ..., compute_input_ms: _Optional[float] = ..., compute_infer_ms: _Optional[float] = ..., compute_output_ms: _Optional[float] = ..., instances: _Optional[int] = ..., latency_count: _Optional[int] = ..., latency_p50_ms: _Optional[float] = ..., latency_p95_ms: _Optional[float] = ..., latency_p99_ms: _Optional[float] = ..., over_slo_ratio: _Optional[float] = ..., device_utilization_pct: _Optional[float] = ..., sm_clock_mhz: _Optional[float] = ..., power_w: _Optional[float] = ..., pooled_p99_ms: _Optional[float] = ..., pooled_count: _Optional[int] = ..., pooled_windows: _Optional[int] = ...) -> None: ...

class ServingEndpoint(_message.Message):
    __slots__ = ("key", "grpc", "http", "metrics", "backend")
    KEY_FIELD_NUMBER: _ClassVar[int]
    GRPC_FIELD_NUMBER: _ClassVar[int]
    HTTP_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    key: str
    grpc: str
    http: str
    metrics: str
    backend: str
    def __init__(self, key: _Optional[str] = ..., grpc: _Optional[str] = ..., http: _Optional[str] = ..., metrics: _Optional[str] = ..., backend: _Optional[str] = ...) -> None: ...

class Node(_message.Message):
    __slots__ = ("node_id", "devices", "state", "last_heartbeat_unix", "seconds_since_heartbeat", "assigned", "running", "events", "address", "applied_revision", "endpoints")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    LAST_HEARTBEAT_UNIX_FIELD_NUMBER: _ClassVar[int]
    SECONDS_SINCE_HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    ASSIGNED_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    APPLIED_REVISION_FIELD_NUMBER: _ClassVar[int]
    ENDPOINTS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    devices: _containers.RepeatedCompositeFieldContainer[Device]
    state: str
    last_heartbeat_unix: float
    seconds_since_heartbeat: float
    assigned: _containers.RepeatedCompositeFieldContainer[Assignment]
    running: _containers.RepeatedCompositeFieldContainer[Assignment]
    events: _containers.RepeatedScalarFieldContainer[str]
    address: str
    applied_revision: int
    endpoints: _containers.RepeatedCompositeFieldContainer[ServingEndpoint]
    def __init__(self, node_id: _Optional[str] = ..., devices: _Optional[_Iterable[_Union[Device, _Mapping]]] = ..., state: _Optional[str] = ..., last_heartbeat_unix: _Optional[float] = ..., seconds_since_heartbeat: _Optional[float] = ..., assigned: _Optional[_Iterable[_Union[Assignment, _Mapping]]] = ..., running: _Optional[_Iterable[_Union[Assignment, _Mapping]]] = ..., events: _Optional[_Iterable[str]] = ..., address: _Optional[str] = ..., applied_revision: _Optional[int] = ..., endpoints: _Optional[_Iterable[_Union[ServingEndpoint, _Mapping]]] = ...) -> None: ...

class ListNodesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListNodesResponse(_message.Message):
    __slots__ = ("nodes",)
    NODES_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[Node]
    def __init__(self, nodes: _Optional[_Iterable[_Union[Node, _Mapping]]] = ...) -> None: ...

class RegisterRequest(_message.Message):
    __slots__ = ("node_id", "devices", "address")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    devices: _containers.RepeatedCompositeFieldContainer[Device]
    address: str
    def __init__(self, node_id: _Optional[str] = ..., devices: _Optional[_Iterable[_Union[Device, _Mapping]]] = ..., address: _Optional[str] = ...) -> None: ...

class RegisterResponse(_message.Message):
    __slots__ = ("heartbeat_interval_s",)
    HEARTBEAT_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    heartbeat_interval_s: float
    def __init__(self, heartbeat_interval_s: _Optional[float] = ...) -> None: ...

class AssignmentError(_message.Message):
    __slots__ = ("key", "message")
    KEY_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    key: str
    message: str
    def __init__(self, key: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class MeasureRequest(_message.Message):
    __slots__ = ("model", "device", "share_pct", "batches", "requests")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    SHARE_PCT_FIELD_NUMBER: _ClassVar[int]
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    model: str
    device: int
    share_pct: float
    batches: _containers.RepeatedScalarFieldContainer[int]
    requests: int
    def __init__(self, model: _Optional[str] = ..., device: _Optional[int] = ..., share_pct: _Optional[float] = ..., batches: _Optional[_Iterable[int]] = ..., requests: _Optional[int] = ...) -> None: ...

class MeasuredPoint(_message.Message):
    __slots__ = ("model", "device", "share_pct", "batch", "active_ms", "error")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    SHARE_PCT_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_MS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    model: str
    device: int
    share_pct: float
    batch: int
    active_ms: float
    error: str
    def __init__(self, model: _Optional[str] = ..., device: _Optional[int] = ..., share_pct: _Optional[float] = ..., batch: _Optional[int] = ..., active_ms: _Optional[float] = ..., error: _Optional[str] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("node_id", "running", "observed", "events", "applied_revision", "errors_revision", "errors", "endpoints", "sequence", "incarnation", "measured")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    OBSERVED_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    APPLIED_REVISION_FIELD_NUMBER: _ClassVar[int]
    ERRORS_REVISION_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    ENDPOINTS_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    MEASURED_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    running: _containers.RepeatedCompositeFieldContainer[Assignment]
    observed: _containers.RepeatedCompositeFieldContainer[Observed]
    events: _containers.RepeatedScalarFieldContainer[str]
    applied_revision: int
    errors_revision: int
    errors: _containers.RepeatedCompositeFieldContainer[AssignmentError]
    endpoints: _containers.RepeatedCompositeFieldContainer[ServingEndpoint]
    sequence: int
    incarnation: str
    measured: _containers.RepeatedCompositeFieldContainer[MeasuredPoint]
    def __init__(self, node_id: _Optional[str] = ..., running: _Optional[_Iterable[_Union[Assignment, _Mapping]]] = ..., observed: _Optional[_Iterable[_Union[Observed, _Mapping]]] = ..., events: _Optional[_Iterable[str]] = ..., applied_revision: _Optional[int] = ..., errors_revision: _Optional[int] = ..., errors: _Optional[_Iterable[_Union[AssignmentError, _Mapping]]] = ..., endpoints: _Optional[_Iterable[_Union[ServingEndpoint, _Mapping]]] = ..., sequence: _Optional[int] = ..., incarnation: _Optional[str] = ..., measured: _Optional[_Iterable[_Union[MeasuredPoint, _Mapping]]] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("registered", "revision", "assignments", "heartbeat_interval_s", "hold", "measure")
    REGISTERED_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENTS_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    HOLD_FIELD_NUMBER: _ClassVar[int]
    MEASURE_FIELD_NUMBER: _ClassVar[int]
    registered: bool
    revision: int
    assignments: _containers.RepeatedCompositeFieldContainer[Assignment]
    heartbeat_interval_s: float
    hold: bool
    measure: _containers.RepeatedCompositeFieldContainer[MeasureRequest]
    def __init__(self, registered: _Optional[bool] = ..., revision: _Optional[int] = ..., assignments: _Optional[_Iterable[_Union[Assignment, _Mapping]]] = ..., heartbeat_interval_s: _Optional[float] = ..., hold: _Optional[bool] = ..., measure: _Optional[_Iterable[_Union[MeasureRequest, _Mapping]]] = ...) -> None: ...

class ReplicaStatus(_message.Message):
    __slots__ = ("replica", "node_id", "device", "share_pct", "batch", "predicted_latency_ms", "serving", "observed", "observed_latency_ms", "observed_rate_rps", "endpoint", "http_endpoint", "metrics_endpoint", "backend")
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    SHARE_PCT_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_LATENCY_MS_FIELD_NUMBER: _ClassVar[int]
    SERVING_FIELD_NUMBER: _ClassVar[int]
    OBSERVED_FIELD_NUMBER: _ClassVar[int]
    OBSERVED_LATENCY_MS_FIELD_NUMBER: _ClassVar[int]
    OBSERVED_RATE_RPS_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    HTTP_ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    METRICS_ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    replica: int
    node_id: str
    device: int
    share_pct: float
    batch: int
    predicted_latency_ms: float
    serving: bool
    observed: bool
    observed_latency_ms: float
    observed_rate_rps: float
    endpoint: str
    http_endpoint: str
    metrics_endpoint: str
    backend: str
    def __init__(self, replica: _Optional[int] = ..., node_id: _Optional[str] = ..., device: _Optional[int] = ..., share_pct: _Optional[float] = ..., batch: _Optional[int] = ..., predicted_latency_ms: _Optional[float] = ..., serving: _Optional[bool] = ..., observed: _Optional[bool] = ..., observed_latency_ms: _Optional[float] = ..., observed_rate_rps: _Optional[float] = ..., endpoint: _Optional[str] = ..., http_endpoint: _Optional[str] = ..., metrics_endpoint: _Optional[str] = ..., backend: _Optional[str] = ...) -> None: ...

class WorkloadStatus(_message.Message):
    __slots__ = ("name", "model", "slo_ms", "rate_rps", "state", "reason", "replicas", "predicted_latency_ms", "observed", "observed_latency_ms", "observed_rate_rps", "slo_attainment", "rate_auto", "min_rps", "max_rps", "demand", "observed_p99_ms", "prediction_error_ratio", "guard", "guard_moves", "predicted_p99_ms")
    NAME_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    SLO_MS_FIELD_NUMBER: _ClassVar[int]
    RATE_RPS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_LATENCY_MS_FIELD_NUMBER: _ClassVar[int]
    OBSERVED_FIELD_NUMBER: _ClassVar[int]
    OBSERVED_LATENCY_MS_FIELD_NUMBER: _ClassVar[int]
    OBSERVED_RATE_RPS_FIELD_NUMBER: _ClassVar[int]
    SLO_ATTAINMENT_FIELD_NUMBER: _ClassVar[int]
    RATE_AUTO_FIELD_NUMBER: _ClassVar[int]
    MIN_RPS_FIELD_NUMBER: _ClassVar[int]
    MAX_RPS_FIELD_NUMBER: _ClassVar[int]
    DEMAND_FIELD_NUMBER: _ClassVar[int]
    OBSERVED_P99_MS_FIELD_NUMBER: _ClassVar[int]
    PREDICTION_ERROR_RATIO_FIELD_NUMBER: _ClassVar[int]
    GUARD_FIELD_NUMBER: _ClassVar[int]
    GUARD_MOVES_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_P99_MS_FIELD_NUMBER: _ClassVar[int]
    name: str
    model: str
    slo_ms: float
    rate_rps: float
    state: str
    reason: str
    replicas: _containers.RepeatedCompositeFieldContainer[ReplicaStatus]
    predicted_latency_ms: float
    observed: bool
    observed_latency_ms: float
    observed_rate_rps: float
    slo_attainment: float
    rate_auto: bool
    min_rps: float
    max_rps: float
    demand: str
    observed_p99_ms: float
    prediction_error_ratio: float
    guard: str
    guard_moves: int
    predicted_p99_ms: float
    def __init__(self, name: _Optional[str] = ..., model: _Optional[str] = ..., slo_ms: _Optional[float] = ..., rate_rps: _Optional[float] = ..., state: _Optional[str] = ..., reason: _Optional[str] = ..., replicas: _Optional[_Iterable[_Union[ReplicaStatus, _Mapping]]] = ..., predicted_latency_ms: _Optional[float] = ..., observed: _Optional[bool] = ..., observed_latency_ms: _Optional[float] = ..., observed_rate_rps: _Optional[float] = ..., slo_attainment: _Optional[float] = ..., rate_auto: _Optional[bool] = ..., min_rps: _Optional[float] = ..., max_rps: _Optional[float] = ..., demand: _Optional[str] = ..., observed_p99_ms: _Optional[float] = ..., prediction_error_ratio: _Optional[float] = ..., guard: _Optional[str] = ..., guard_moves: _Optional[int] = ..., predicted_p99_ms: _Optional[float] = ...) -> None: ...

class GetStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatusResponse(_message.Message):
    __slots__ = ("revision", "workloads", "gpus_in_use", "cost_per_hour", "nodes_ready", "nodes_lost", "last_error", "nodes_silent", "alerts", "loop_events")
    REVISION_FIELD_NUMBER: _ClassVar[int]
    WORKLOADS_FIELD_NUMBER: _ClassVar[int]
    GPUS_IN_USE_FIELD_NUMBER: _ClassVar[int]
    COST_PER_HOUR_FIELD_NUMBER: _ClassVar[int]
    NODES_READY_FIELD_NUMBER: _ClassVar[int]
    NODES_LOST_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    NODES_SILENT_FIELD_NUMBER: _ClassVar[int]
    ALERTS_FIELD_NUMBER: _ClassVar[int]
    LOOP_EVENTS_FIELD_NUMBER: _ClassVar[int]
    revision: int
    workloads: _containers.RepeatedCompositeFieldContainer[WorkloadStatus]
    gpus_in_use: int
    cost_per_hour: float
    nodes_ready: int
    nodes_lost: int
    last_error: str
    nodes_silent: int
    alerts: _containers.RepeatedScalarFieldContainer[str]
    loop_events: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, revision: _Optional[int] = ..., workloads: _Optional[_Iterable[_Union[WorkloadStatus, _Mapping]]] = ..., gpus_in_use: _Optional[int] = ..., cost_per_hour: _Optional[float] = ..., nodes_ready: _Optional[int] = ..., nodes_lost: _Optional[int] = ..., last_error: _Optional[str] = ..., nodes_silent: _Optional[int] = ..., alerts: _Optional[_Iterable[str]] = ..., loop_events: _Optional[_Iterable[str]] = ...) -> None: ...

class UploadProfileRequest(_message.Message):
    __slots__ = ("profile_json", "gpu_type")
    PROFILE_JSON_FIELD_NUMBER: _ClassVar[int]
    GPU_TYPE_FIELD_NUMBER: _ClassVar[int]
    profile_json: str
    gpu_type: str
    def __init__(self, profile_json: _Optional[str] = ..., gpu_type: _Optional[str] = ...) -> None: ...

class ProfileInfo(_message.Message):
    __slots__ = ("gpu_type", "model", "uploaded_unix", "active_version", "correction", "pinned", "versions")
    GPU_TYPE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    UPLOADED_UNIX_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_VERSION_FIELD_NUMBER: _ClassVar[int]
    CORRECTION_FIELD_NUMBER: _ClassVar[int]
    PINNED_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    gpu_type: str
    model: str
    uploaded_unix: float
    active_version: int
    correction: float
    pinned: bool
    versions: int
    def __init__(self, gpu_type: _Optional[str] = ..., model: _Optional[str] = ..., uploaded_unix: _Optional[float] = ..., active_version: _Optional[int] = ..., correction: _Optional[float] = ..., pinned: _Optional[bool] = ..., versions: _Optional[int] = ...) -> None: ...

class ProfileVersion(_message.Message):
    __slots__ = ("gpu_type", "model", "version", "created_unix", "mode", "correction", "correction_constant", "evidence_windows", "evidence_executions", "reason", "active")
    GPU_TYPE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CREATED_UNIX_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    CORRECTION_FIELD_NUMBER: _ClassVar[int]
    CORRECTION_CONSTANT_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_WINDOWS_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_EXECUTIONS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_FIELD_NUMBER: _ClassVar[int]
    gpu_type: str
    model: str
    version: int
    created_unix: float
    mode: str
    correction: float
    correction_constant: float
    evidence_windows: float
    evidence_executions: int
    reason: str
    active: bool
    def __init__(self, gpu_type: _Optional[str] = ..., model: _Optional[str] = ..., version: _Optional[int] = ..., created_unix: _Optional[float] = ..., mode: _Optional[str] = ..., correction: _Optional[float] = ..., correction_constant: _Optional[float] = ..., evidence_windows: _Optional[float] = ..., evidence_executions: _Optional[int] = ..., reason: _Optional[str] = ..., active: _Optional[bool] = ...) -> None: ...

class UploadProfileResponse(_message.Message):
    __slots__ = ("profiles",)
    PROFILES_FIELD_NUMBER: _ClassVar[int]
    profiles: _containers.RepeatedCompositeFieldContainer[ProfileInfo]
    def __init__(self, profiles: _Optional[_Iterable[_Union[ProfileInfo, _Mapping]]] = ...) -> None: ...

class ListProfilesRequest(_message.Message):
    __slots__ = ("versions", "model")
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    versions: bool
    model: str
    def __init__(self, versions: _Optional[bool] = ..., model: _Optional[str] = ...) -> None: ...

class ListProfilesResponse(_message.Message):
    __slots__ = ("profiles", "versions")
    PROFILES_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    profiles: _containers.RepeatedCompositeFieldContainer[ProfileInfo]
    versions: _containers.RepeatedCompositeFieldContainer[ProfileVersion]
    def __init__(self, profiles: _Optional[_Iterable[_Union[ProfileInfo, _Mapping]]] = ..., versions: _Optional[_Iterable[_Union[ProfileVersion, _Mapping]]] = ...) -> None: ...

class RollbackProfileRequest(_message.Message):
    __slots__ = ("model", "gpu_type", "version", "resume")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    GPU_TYPE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    RESUME_FIELD_NUMBER: _ClassVar[int]
    model: str
    gpu_type: str
    version: int
    resume: bool
    def __init__(self, model: _Optional[str] = ..., gpu_type: _Optional[str] = ..., version: _Optional[int] = ..., resume: _Optional[bool] = ...) -> None: ...

class RollbackProfileResponse(_message.Message):
    __slots__ = ("profiles",)
    PROFILES_FIELD_NUMBER: _ClassVar[int]
    profiles: _containers.RepeatedCompositeFieldContainer[ProfileInfo]
    def __init__(self, profiles: _Optional[_Iterable[_Union[ProfileInfo, _Mapping]]] = ...) -> None: ...

class ObservationRecord(_message.Message):
    __slots__ = ("unix", "node_id", "device", "gpu_type", "workload", "replica", "model", "share_pct", "batch", "queue_delay_ms", "neighbours", "window_s", "rate_rps", "requests", "failures", "mean_batch", "batch_stats", "queue_ms", "compute_ms", "observed_batch_ms", "predicted_batch_ms", "error_ratio", "predicted_p99_ms", "profile_version", "instances", "p50_ms", "p95_ms", "p99_ms", "over_slo_ratio", "device_utilization_pct", "sm_clock_mhz", "power_w", "pending")
    UNIX_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    GPU_TYPE_FIELD_NUMBER: _ClassVar[int]
    WORKLOAD_FIELD_NUMBER: _ClassVar[int]
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    SHARE_PCT_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    QUEUE_DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    NEIGHBOURS_FIELD_NUMBER: _ClassVar[int]
    WINDOW_S_FIELD_NUMBER: _ClassVar[int]
    RATE_RPS_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    FAILURES_FIELD_NUMBER: _ClassVar[int]
    MEAN_BATCH_FIELD_NUMBER: _ClassVar[int]
    BATCH_STATS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_MS_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_MS_FIELD_NUMBER: _ClassVar[int]
    OBSERVED_BATCH_MS_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_BATCH_MS_FIELD_NUMBER: _ClassVar[int]
    ERROR_RATIO_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_P99_MS_FIELD_NUMBER: _ClassVar[int]
    PROFILE_VERSION_FIELD_NUMBER: _ClassVar[int]
    INSTANCES_FIELD_NUMBER: _ClassVar[int]
    P50_MS_FIELD_NUMBER: _ClassVar[int]
    P95_MS_FIELD_NUMBER: _ClassVar[int]
    P99_MS_FIELD_NUMBER: _ClassVar[int]
    OVER_SLO_RATIO_FIELD_NUMBER: _ClassVar[int]
    DEVICE_UTILIZATION_PCT_FIELD_NUMBER: _ClassVar[int]
    SM_CLOCK_MHZ_FIELD_NUMBER: _ClassVar[int]
    POWER_W_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    unix: float
    node_id: str
    device: int
    gpu_type: str
    workload: str
    replica: int
    model: str
    share_pct: float
    batch: int
    queue_delay_ms: float
    neighbours: _containers.RepeatedScalarFieldContainer[str]
    window_s: float
    rate_rps: float
    requests: int
    failures: int
    mean_batch: float
    batch_stats: _containers.RepeatedCompositeFieldContainer[BatchStat]
    queue_ms: float
    compute_ms: float
    observed_batch_ms: float
    predicted_batch_ms: float
    error_ratio: float
    predicted_p99_ms: float
    profile_version: int
    instances: int
    p50_ms: float
    p95_ms: float
    p99_ms: float
    over_slo_ratio: float
    device_utilization_pct: float
    sm_clock_mhz: float
    power_w: float
    pending: int
    def __init__(self, unix: _Optional[float] = ..., node_id: _Optional[str] = ..., device: _Optional[int] = ..., gpu_type: _Optional[str] = ..., workload: _Optional[str] = ..., replica: _Optional[int] = ..., model: _Optional[str] = ..., share_pct: _Optional[float] = ..., batch: _Optional[int] = ..., queue_delay_ms: _Optional[float] = ..., neighbours: _Optional[_Iterable[str]] = ..., window_s: _Optional[float] = ..., rate_rps: _Optional[float] = ..., requests: _Optional[int] = ..., failures: _Optional[int] = ..., mean_batch: _Optional[float] = ..., batch_stats: _Optional[_Iterable[_Union[BatchStat, _Mapping]]] = ..., queue_ms: _Optional[float] = ..., compute_ms: _Optional[float] = ..., observed_batch_ms: _Optional[float] = ..., predicted_batch_ms: _Optional[float] = ..., error_ratio: _Optional[float] = ..., predicted_p99_ms: _Optional[float] = ..., profile_version: _Optional[int] = ..., instances: _Optional[int] = ..., p50_ms: _Optional[float] = ..., p95_ms: _Optional[float] = ..., p99_ms: _Optional[float] = ..., over_slo_ratio: _Optional[float] = ..., device_utilization_pct: _Optional[float] = ..., sm_clock_mhz: _Optional[float] = ..., power_w: _Optional[float] = ..., pending: _Optional[int] = ...) -> None: ...

class ListObservationsRequest(_message.Message):
    __slots__ = ("workload", "limit")
    WORKLOAD_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    workload: str
    limit: int
    def __init__(self, workload: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class ListObservationsResponse(_message.Message):
    __slots__ = ("observations", "stored", "retention_s", "max_rows")
    OBSERVATIONS_FIELD_NUMBER: _ClassVar[int]
    STORED_FIELD_NUMBER: _ClassVar[int]
    RETENTION_S_FIELD_NUMBER: _ClassVar[int]
    MAX_ROWS_FIELD_NUMBER: _ClassVar[int]
    observations: _containers.RepeatedCompositeFieldContainer[ObservationRecord]
    stored: int
    retention_s: float
    max_rows: int
    def __init__(self, observations: _Optional[_Iterable[_Union[ObservationRecord, _Mapping]]] = ..., stored: _Optional[int] = ..., retention_s: _Optional[float] = ..., max_rows: _Optional[int] = ...) -> None: ...

class MintAgentTokenRequest(_message.Message):
    __slots__ = ("node_id",)
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    def __init__(self, node_id: _Optional[str] = ...) -> None: ...

class MintAgentTokenResponse(_message.Message):
    __slots__ = ("token", "node_id", "generation")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    token: str
    node_id: str
    generation: int
    def __init__(self, token: _Optional[str] = ..., node_id: _Optional[str] = ..., generation: _Optional[int] = ...) -> None: ...
