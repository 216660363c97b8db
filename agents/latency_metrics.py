"""The SLO latency histogram, exported from the serving path.

Triton 2.51 (the server in nvidia-pytriton) has no per-model latency
histogram: `model_metrics` arrives in 2.52, and 2.51 exports only sums,
counts and summaries. A latency SLI needs counts of requests above the SLO,
so the side that sends the requests (stoke's load generator, or any client
that embeds this) exports `stoke_request_latency_ms{workload, model}` with a
bucket at every workload's SLO. A failed request is recorded as the client's
timeout (the load generator does this): for an SLO it is as bad as a late one,
and the histogram's sum stays finite. The generated alert rules read this histogram
by default (`deploy.alerts`).

The node agent reads the same histogram back (`parse_sli`, from a URL or an
in-process exporter) and reports each window's percentiles and share over the
SLO per replica (`latency_window`): the closed loop's observed p99.
"""

from __future__ import annotations

import collections
import math
import random
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry, Histogram, start_http_server

METRIC = "stoke_request_latency_ms"
#: General-purpose bounds (ms); every SLO is added on top. A window's p99 is interpolated inside its bucket
#: (Prometheus' histogram_quantile), and the closed loop learns the serving path from it: with 1-2-5 steps a
#: 48-request window whose slowest request took 10.5 ms read 15.2 ms (the middle of 10-20), and the loop
#: taught the CPU demo a 13 ms serving path where its clients saw 10-12 ms. Steps of 1 ms up to 10 and at most
#: half the bound above keep that error within about a quarter of the bucket's bound.
BASE_BUCKETS_MS = (
    1, 1.5, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 15, 20, 25, 30, 40, 50, 70, 100, 150, 200, 300, 500, 1000, 2000, 5000,
)  # fmt: skip


class RequestLatencyExporter:
    """A histogram of request latency per workload, with a bucket at each given SLO."""

    def __init__(self, slos_ms: Iterable[float] = ()):
        bounds = sorted({float(b) for b in BASE_BUCKETS_MS} | {float(s) for s in slos_ms if s > 0})
        self.registry = CollectorRegistry()
        self._histogram = Histogram(
            METRIC,
            "Request latency seen by the client (ms); a failed request counts as the client timeout",
            ["workload", "model"],
            buckets=bounds + [math.inf],
            registry=self.registry,
        )
        self._server: Any = None
        self.port: int | None = None

    def observe(self, workload: str, model: str, latency_ms: float) -> None:
        self._histogram.labels(workload=workload, model=model).observe(latency_ms)

    def recorder(self, workload: str, model: str):
        """A callback for `LoadGenerator(on_latency=...)`."""
        child = self._histogram.labels(workload=workload, model=model)
        return child.observe

    def serve(self, port: int = 0, host: str = "127.0.0.1") -> str:
        """Serve /metrics on HOST:PORT (0 = any free port); returns the URL. OSError if it cannot bind."""
        try:
            self._server, _thread = start_http_server(port, addr=host, registry=self.registry)
        except OverflowError as err:  # a port outside 0..65535
            raise OSError(f"port {port}: {err}") from None
        self.port = self._server.server_port
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


@dataclass(frozen=True)
class ClientFigures:
    """Requests a client sent, and how they went: latency percentiles of the answered ones (ms), failures,
    and the share of all requests (failed ones included) slower than the SLO."""

    requests: int
    failed: int
    p50_ms: float | None
    p99_ms: float | None
    over_slo: float | None


class ClientLatencies:
    """Latency as one client sees it, over the last `window_s` seconds (live views) and the whole run (summaries).

    `record(ms, ok)` fits `LoadGenerator(on_result=...)`. The whole run keeps at most `keep` samples
    (a uniform reservoir beyond that), so a long run stays in bounded memory. Thread-safe.
    """

    def __init__(
        self,
        slo_ms: float,
        *,
        window_s: float = 10.0,
        keep: int = 1_000_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.slo_ms = slo_ms
        self.window_s = window_s
        self.keep = keep
        self.clock = clock
        self._lock = threading.Lock()
        self._recent: collections.deque[tuple[float, float, bool]] = collections.deque()
        self._all: list[float] = []
        self._seen_ok = 0
        self._requests = self._failed = self._over = 0
        self._rng = random.Random(0)

    def record(self, ms: float, ok: bool) -> None:
        now = self.clock()
        with self._lock:
            self._requests += 1
            self._failed += not ok
            self._over += (not ok) or ms > self.slo_ms
            self._recent.append((now, ms, ok))
            self._trim(now)
            if ok:
                self._seen_ok += 1
                if len(self._all) < self.keep:
                    self._all.append(ms)
                else:
                    slot = self._rng.randrange(self._seen_ok)
                    if slot < self.keep:
                        self._all[slot] = ms

    def _trim(self, now: float) -> None:
        while self._recent and self._recent[0][0] < now - self.window_s:
            self._recent.popleft()

    def window(self) -> ClientFigures:
        """The last `window_s` seconds."""
        with self._lock:
            self._trim(self.clock())
            recent = list(self._recent)
        answered = [ms for _, ms, ok in recent if ok]
        return _figures(len(recent), sum(1 for *_, ok in recent if not ok), answered, self.slo_ms)

    def total(self) -> ClientFigures:
        """The whole run."""
        with self._lock:
            answered, requests, failed, over = list(self._all), self._requests, self._failed, self._over
        figures = _figures(requests, failed, answered, self.slo_ms)
        return ClientFigures(requests, failed, figures.p50_ms, figures.p99_ms, over / requests if requests else None)


def _figures(requests: int, failed: int, answered: list[float], slo_ms: float) -> ClientFigures:
    if not requests:
        return ClientFigures(0, 0, None, None, None)
    over = failed + sum(1 for ms in answered if ms > slo_ms)
    p50 = float(np.percentile(answered, 50)) if answered else None
    p99 = float(np.percentile(answered, 99)) if answered else None
    return ClientFigures(requests, failed, p50, p99, over / requests)


# ---------------------------------------------------------------- reading it back (the agent's SLI window)

#: Most workloads and buckets read from one SLI scrape (bounds what a misbehaving endpoint can make an agent hold).
MAX_SLI_WORKLOADS = 1024
MAX_SLI_BUCKETS = 64

Buckets = dict[float, float]  # upper bound (ms; inf for +Inf) -> cumulative count


def parse_sli(text: str) -> dict[str, Buckets]:
    """`stoke_request_latency_ms` buckets per workload from Prometheus text (summed over other labels)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, Buckets] = {}
    for family in text_string_to_metric_families(text):
        if family.name != METRIC:
            continue
        for sample in family.samples:
            workload = sample.labels.get("workload")
            if sample.name != METRIC + "_bucket" or not workload or "le" not in sample.labels:
                continue
            if workload not in out and len(out) >= MAX_SLI_WORKLOADS:
                continue
            row = out.setdefault(workload, {})
            bound = float(sample.labels["le"])
            if bound in row or len(row) < MAX_SLI_BUCKETS:
                row[bound] = row.get(bound, 0.0) + float(sample.value)
    return out


def registry_source(exporter: RequestLatencyExporter):
    """An SLI source (a callable returning Prometheus text) reading an in-process exporter."""
    from prometheus_client import generate_latest

    return lambda: generate_latest(exporter.registry).decode()


def url_source(url: str, timeout_s: float = 2.0):
    """An SLI source scraping a /metrics URL (e.g. `stoke load --metrics-port`)."""
    import urllib.request

    def read() -> str:
        with urllib.request.urlopen(url, timeout=timeout_s) as reply:
            return reply.read(8 * 1024 * 1024).decode("utf-8", errors="replace")

    return read


@dataclass(frozen=True)
class LatencyWindow:
    """Request latency over one window, from the difference of two cumulative histograms."""

    count: int
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None
    over_slo_ratio: float | None  # exact when the histogram has a bucket at the SLO, else None


def _quantile(deltas: list[tuple[float, float]], total: float, q: float) -> float:
    """Linear interpolation inside the bucket holding the q-quantile (Prometheus' histogram_quantile)."""
    lower, below = 0.0, 0.0
    for bound, count in deltas:
        if count >= q * total:
            if math.isinf(bound):
                return lower  # beyond the last finite bucket: its bound, as Prometheus does
            inside = count - below
            return lower + (bound - lower) * ((q * total - below) / inside if inside > 0 else 1.0)
        lower, below = bound, count
    return lower


def latency_window(before: Buckets | None, after: Buckets, slo_ms: float | None = None) -> LatencyWindow:
    """Percentiles and the share over `slo_ms` of the requests recorded between two scrapes (a counter
    that went down, a restarted exporter, counts from zero)."""
    before = before or {}
    reset = any(after.get(b, 0.0) < v for b, v in before.items())
    deltas = sorted((b, max(0.0, v - (0.0 if reset else before.get(b, 0.0)))) for b, v in after.items())
    total = deltas[-1][1] if deltas and math.isinf(deltas[-1][0]) else max((c for _, c in deltas), default=0.0)
    if total < 1:
        return LatencyWindow(0, None, None, None, None)
    over = None
    if slo_ms is not None:
        at = [c for b, c in deltas if abs(b - slo_ms) <= 1e-9 * max(1.0, slo_ms)]
        over = (total - at[0]) / total if at else None
    return LatencyWindow(
        int(total), _quantile(deltas, total, 0.5), _quantile(deltas, total, 0.95), _quantile(deltas, total, 0.99), over
    )


def window_p99s_ms(latency_ms: Sequence[float], done_s: Sequence[float], window_s: float) -> list[float]:
    """The p99 of each `window_s` window of requests (by the time each was answered, the time the load generator
    records it in the histogram), as an agent reads it from the SLI histogram (`BASE_BUCKETS_MS`, interpolated
    inside the bucket: `latency_window`); windows without a request are left out. What the closed loop sees of
    these requests: it takes the median of such windows' p99s (`controller.recalibrate.SERVING_QUANTILE`)."""
    if len(latency_ms) != len(done_s) or not window_s > 0:
        raise ValueError("one answer time per latency, and a window of > 0 s")
    if not len(latency_ms):
        return []
    start = min(done_s)
    windows: dict[int, list[float]] = {}
    for ms, at in zip(latency_ms, done_s, strict=True):
        windows.setdefault(int((at - start) // window_s), []).append(ms)
    bounds = [float(b) for b in BASE_BUCKETS_MS] + [math.inf]
    out = []
    for _, values in sorted(windows.items()):
        counts = np.searchsorted(np.sort(values), bounds, side="right")  # cumulative: requests <= each bound
        p99 = latency_window(None, dict(zip(bounds, counts.astype(float), strict=True))).p99_ms
        if p99 is not None:
            out.append(p99)
    return out
