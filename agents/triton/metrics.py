"""Triton's Prometheus text and its statistics extension -> per-model counters -> the figures of
one window."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from controller.messages import BatchStat

# --------------------------------------------------------------------------- metrics

COUNTERS = {
    "nv_inference_request_success": "success",
    "nv_inference_request_failure": "failure",
    "nv_inference_count": "inferences",
    "nv_inference_exec_count": "executions",
    "nv_inference_request_duration_us": "request_us",
    "nv_inference_queue_duration_us": "queue_us",
    "nv_inference_compute_input_duration_us": "compute_input_us",
    "nv_inference_compute_infer_duration_us": "compute_infer_us",
    "nv_inference_compute_output_duration_us": "compute_output_us",
}
HISTOGRAM = "nv_inference_first_response_histogram_ms"
#: Gauges read as they are (not as counters over the window).
GAUGES = {"nv_inference_pending_request_count": "pending"}
#: Most batch sizes read from one model's statistics (Triton keeps one entry per size executed).
MAX_BATCH_SIZES = 256


def parse_metrics(text: str) -> dict[str, dict[str, float]]:
    """Triton's Prometheus text -> {model: {counter: value summed over versions}}.

    Histogram buckets, when present, appear as ``le:<bound>`` keys.
    """
    out: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            model = sample.labels.get("model")
            if model is None:
                continue
            # prometheus_client names counter samples `<family>_total`; Triton's lack the suffix
            sample_name = family.name if sample.name == family.name + "_total" else sample.name
            name = COUNTERS.get(sample_name) or GAUGES.get(sample_name)
            if name is None and sample_name == HISTOGRAM + "_bucket":
                name = f"le:{sample.labels.get('le')}"
            if name is None:
                continue
            row = out.setdefault(model, {})
            row[name] = row.get(name, 0.0) + float(sample.value)
    return out


def parse_statistics(stats: Mapping[str, Any], model: str) -> dict[str, float]:
    """Triton's statistics JSON -> per batch size, cumulative ``exec:<b>`` executions and ``exec_ns:<b>``
    nanoseconds (compute input + infer + output), summed over versions; at most `MAX_BATCH_SIZES` sizes."""
    out: dict[str, float] = {}
    for entry in stats.get("model_stats", ()):
        if entry.get("name") != model:
            continue
        for b in entry.get("batch_stats", ())[:MAX_BATCH_SIZES]:
            size = int(b.get("batch_size", 0))
            if size < 1:
                continue
            count = float(b.get("compute_infer", {}).get("count", 0))
            ns = sum(
                float(b.get(part, {}).get("ns", 0)) for part in ("compute_input", "compute_infer", "compute_output")
            )
            out[f"exec:{size}"] = out.get(f"exec:{size}", 0.0) + count
            out[f"exec_ns:{size}"] = out.get(f"exec_ns:{size}", 0.0) + ns
    return out


@dataclass(frozen=True)
class ObservedModel:
    """One assignment's figures over the window since the previous scrape.

    Rates and means are over the window; `failures` and `success` are the
    server's cumulative counters (since the model's process started).
    """

    model: str
    key: str
    request_rate_rps: float
    mean_batch: float
    mean_queue_ms: float
    mean_compute_ms: float
    failures: int
    success: int
    endpoint: str
    mean_request_ms: float = 0.0
    window_s: float = 0.0
    latency_p99_ms: float | None = None  # from the per-model histogram, when the server emits one
    requests: int = 0  # completed in the window
    window_failures: int = 0  # failed in the window
    pending: int = 0  # waiting in the queue at the end of the window
    batch_stats: tuple[BatchStat, ...] = ()  # per batch size executed in the window
    compute_input_ms: float = 0.0  # per request, mean over the window
    compute_infer_ms: float = 0.0
    compute_output_ms: float = 0.0
    instances: int = 1
    seq: int = 0  # windows observed of this assignment so far


def _quantile_from_buckets(buckets: Mapping[float, float], q: float) -> float | None:
    if not buckets:
        return None
    bounds = sorted(buckets)
    total = buckets[bounds[-1]]
    if total <= 0:
        return None
    for bound in bounds:
        if buckets[bound] >= q * total:
            return bound
    return bounds[-1]


def observe_model(
    model: str, key: str, endpoint: str, previous: Mapping[str, float], current: Mapping[str, float], window_s: float
) -> ObservedModel:
    """Figures over the window between two scrapes (counters that went down count from zero)."""

    def delta(name: str) -> float:
        now, before = current.get(name, 0.0), previous.get(name, 0.0)
        return now - before if now >= before else now

    success = delta("success")
    executions = delta("executions")
    buckets = {float(k[3:]): delta(k) for k in current if k.startswith("le:")}
    compute_us = delta("compute_input_us") + delta("compute_infer_us") + delta("compute_output_us")
    batch_stats = []
    for name in sorted((k for k in current if k.startswith("exec:")), key=lambda k: int(k[5:])):
        size, count = int(name[5:]), delta(name)
        if count >= 1:
            mean_ms = delta(f"exec_ns:{size}") / count / 1e6
            batch_stats.append(BatchStat(size, int(count), max(0.0, mean_ms)))

    def per_request_ms(name: str) -> float:
        return delta(name) / success / 1000.0 if success else 0.0

    return ObservedModel(
        model=model,
        key=key,
        request_rate_rps=success / window_s if window_s > 0 else 0.0,
        mean_batch=delta("inferences") / executions if executions else 0.0,
        mean_queue_ms=delta("queue_us") / success / 1000.0 if success else 0.0,
        mean_compute_ms=compute_us / success / 1000.0 if success else 0.0,
        failures=int(current.get("failure", 0.0)),
        success=int(current.get("success", 0.0)),
        endpoint=endpoint,
        mean_request_ms=delta("request_us") / success / 1000.0 if success else 0.0,
        window_s=window_s,
        latency_p99_ms=_quantile_from_buckets(buckets, 0.99),
        requests=int(success),
        window_failures=int(delta("failure")),
        pending=int(current.get("pending", 0.0)),
        batch_stats=tuple(batch_stats),
        compute_input_ms=per_request_ms("compute_input_us"),
        compute_infer_ms=per_request_ms("compute_infer_us"),
        compute_output_ms=per_request_ms("compute_output_us"),
    )
