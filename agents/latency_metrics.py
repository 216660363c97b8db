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

import math
from collections.abc import Iterable
from typing import Any

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
