"""The SLO latency histogram, exported from the serving path.

Triton 2.51 (the server in nvidia-pytriton) has no per-model latency
histogram: `model_metrics` arrives in 2.52, and 2.51 exports only sums,
counts and summaries. A latency SLI needs counts of requests above the SLO,
so the side that sends the requests (stoke's load generator, or any client
that embeds this) exports `stoke_request_latency_ms{workload, model}` with a
bucket at every workload's SLO. A failed request is recorded as the client's
timeout (the load generator does this): for an SLO it is as bad as a late one,
and the histogram's sum stays finite. The generated alert rules read this histogram
by default (`controller.alerts`).
"""

from __future__ import annotations

import collections
import math
import random
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry, Histogram, start_http_server

METRIC = "stoke_request_latency_ms"
#: General-purpose bounds (ms); every SLO is added on top.
BASE_BUCKETS_MS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)


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
