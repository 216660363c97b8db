"""Open-loop load generator for Triton over gRPC.

Requests are sent at scheduled arrival times (constant spacing or Poisson,
seeded) whether or not earlier ones have returned: a slow server does not slow
the sender down, so queueing shows up in the latencies (no coordinated
omission: a request's latency counts from its *scheduled* time). Responses come
back on gRPC's threads through `async_infer` callbacks.

The target is an address or a callable returning the current address, so a
run follows a model that the Triton fleet moves to another process.

The schedule is one continuous stream (`arrival_stream`): a run of any length,
or an open-ended run that ends when its `stop` event is set, draws every gap
from one seeded generator, so long runs are not the same short window
repeated.
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException, triton_to_np_dtype

from foundation.errors import StokeError
from foundation.names import clean_text

ARRIVALS = ("constant", "poisson")
#: Longest error message a report keeps (characters of its first line).
ERROR_TEXT_MAX = 300
#: Longest wait (s) for Triton's statistics to count the requests a step's clients were answered.
STATISTICS_WAIT_S = 1.0


class LoadError(StokeError, RuntimeError):
    """The target cannot be reached or the model's inputs cannot be built."""


@dataclass(frozen=True)
class LoadReport:
    model: str
    target: str
    arrival: str
    rate_rps: float  # requested
    seconds: float  # requested duration of the arrival schedule
    sent: int
    ok: int
    failed: int
    throughput_rps: float  # successful responses per second of the run
    p50_ms: float
    p95_ms: float
    p99_ms: float
    mean_ms: float
    max_ms: float
    slo_ms: float | None
    over_slo_share: float | None  # share of requests (failed ones included) slower than the SLO
    max_send_lag_ms: float  # how late the generator itself sent, at worst (its own overhead)
    errors: tuple[str, ...] = field(default=())  # distinct error messages (first 5)

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def percentile(values: Sequence[float], q: float) -> float:
    if not len(values):
        return math.nan
    return float(np.percentile(np.asarray(values, dtype=float), q))


def arrival_offsets(rate_rps: float, seconds: float, arrival: str = "constant", seed: int = 0) -> np.ndarray:
    """Send times (s from the start) of every request in [0, seconds): the times `arrival_stream` gives the
    load generator, so a simulation can replay the very arrivals it sent."""
    if rate_rps <= 0 or seconds <= 0:
        raise ValueError("rate_rps and seconds must be > 0")
    if arrival == "constant":  # as many as the load generator sends in `seconds`
        return np.arange(int(math.floor(rate_rps * seconds + 1e-9))) / rate_rps
    stream = arrival_stream(rate_rps, arrival, seed)
    return np.fromiter(itertools.takewhile(lambda t: t < seconds, stream), dtype=float)


def arrival_stream(rate_rps: float, arrival: str = "constant", seed: int = 0) -> Iterator[float]:
    """Send times (s from the start), without end: constant spacing, or Poisson gaps from one seeded generator."""
    if rate_rps <= 0:
        raise ValueError("rate_rps must be > 0")
    if arrival == "constant":
        return (i / rate_rps for i in itertools.count())
    if arrival == "poisson":

        def poisson() -> Iterator[float]:
            rng = np.random.default_rng(seed)
            t = 0.0
            while True:
                for gap in rng.exponential(1.0 / rate_rps, size=1024):
                    t += float(gap)
                    yield t

        return poisson()
    raise ValueError(f"arrival must be one of {', '.join(ARRIVALS)}, got {arrival!r}")


def _input_arrays(meta: dict, config: dict, model: str, batch: int, seed: int) -> list[tuple[str, str, np.ndarray]]:
    """(name, datatype, data) of random inputs matching the model's metadata (dynamic dims become 1, batch dim =
    `batch`), whichever protocol read the metadata."""
    batched = int(config.get("max_batch_size", 0)) > 0
    rng = np.random.default_rng(seed)
    arrays = []
    for spec in meta["inputs"]:
        shape = [int(d) if int(d) > 0 else 1 for d in spec["shape"]]
        if batched:
            shape[0] = batch
        dtype = triton_to_np_dtype(spec["datatype"])
        if dtype is None or dtype == np.object_:
            raise LoadError(f"model {model!r}: input {spec['name']} has unsupported type {spec['datatype']}")
        arrays.append((spec["name"], spec["datatype"], (rng.random(shape) * 10).astype(dtype)))
    return arrays


def build_inputs(
    client: grpcclient.InferenceServerClient, model: str, batch: int = 1, seed: int = 0
) -> list[grpcclient.InferInput]:
    """Random inputs matching the model's metadata (dynamic dims become 1, batch dim = `batch`)."""
    try:
        meta = client.get_model_metadata(model, as_json=True)
        config = client.get_model_config(model, as_json=True)["config"]
    except InferenceServerException as err:
        raise LoadError(f"model {model!r}: cannot read metadata ({err})") from None
    inputs = []
    for name, datatype, data in _input_arrays(meta, config, model, batch, seed):
        tensor = grpcclient.InferInput(name, list(data.shape), datatype)
        tensor.set_data_from_numpy(data)
        inputs.append(tensor)
    return inputs


class LoadGenerator:
    """Sends `model` requests open-loop to `target` (address or callable returning one)."""

    def __init__(
        self,
        target: str | Callable[[], str],
        model: str,
        *,
        batch: int = 1,
        max_in_flight: int = 2000,
        timeout_s: float = 10.0,
        clock: Callable[[], float] = time.perf_counter,
        sleep: Callable[[float], None] = time.sleep,
        on_latency: Callable[[float], None] | None = None,
        on_result: Callable[[float, bool], None] | None = None,
    ) -> None:
        """`on_latency(ms)` is called for every request, e.g. to feed
        `agents.latency_metrics.RequestLatencyExporter`; a failed request reports the client
        timeout (it is as bad as the slowest answer the client would wait for).
        `on_result(ms, ok)` is called for every request too, with whether it succeeded."""
        self._on_latency = on_latency
        self._on_result = on_result
        self._target = target if callable(target) else (lambda: target)
        self.model = model
        self.batch = batch
        self.max_in_flight = max_in_flight
        self.timeout_s = timeout_s
        self._clock = clock
        self._sleep = sleep
        self._clients: dict[str, grpcclient.InferenceServerClient] = {}
        self._inputs: list[grpcclient.InferInput] | None = None

    def _client(self, url: str) -> grpcclient.InferenceServerClient:
        client = self._clients.get(url)
        if client is None:
            client = self._clients[url] = grpcclient.InferenceServerClient(url)
        return client

    def close(self) -> None:
        for client in self._clients.values():
            try:
                client.close()
            except Exception:  # noqa: BLE001 - closing only
                pass
        self._clients.clear()

    def prepare(self) -> None:
        if self._inputs is None:
            url = self._target()
            try:
                self._inputs = build_inputs(self._client(url), self.model, self.batch)
            except InferenceServerException as err:
                raise LoadError(f"{url}: {err}") from None

    def warm_up(self, requests: int) -> None:
        """Send `requests` blocking requests, not recorded: the connection is open and the model has served."""
        self.prepare()
        url = self._target()
        try:
            for _ in range(requests):
                self._client(url).infer(self.model, self._inputs, client_timeout=self.timeout_s)
        except InferenceServerException as err:
            raise LoadError(f"{url}: {err}") from None

    def run(
        self,
        rate_rps: float,
        seconds: float,
        *,
        arrival: str = "constant",
        seed: int = 0,
        slo_ms: float | None = None,
        stop: threading.Event | None = None,
    ) -> LoadReport:
        """Send for `seconds` (``math.inf``: until `stop` is set) on one continuous schedule."""
        if not seconds > 0 or (math.isinf(seconds) and stop is None):
            raise ValueError("seconds must be > 0 (math.inf needs a stop event)")
        self.prepare()
        assert self._inputs is not None
        offsets = arrival_stream(rate_rps, arrival, seed)
        if arrival == "constant" and math.isfinite(seconds):  # exactly floor(rate x seconds) requests
            offsets = itertools.islice(offsets, int(math.floor(rate_rps * seconds + 1e-9)))
        latency: list[float] = []  # ms per scheduled request, NaN = failed / not answered
        errors: dict[str, int] = {}
        lock = threading.Lock()
        pending = [0]
        all_done = threading.Event()
        finished = [False]
        last_done = [0.0]

        def on_done(i: int, scheduled: float, result: object, error: object) -> None:
            now = self._clock()
            if error is None:
                latency[i] = (now - scheduled) * 1000.0
            if self._on_latency is not None:
                self._on_latency(latency[i] if error is None else self.timeout_s * 1000.0)
            if self._on_result is not None:
                self._on_result(latency[i] if error is None else self.timeout_s * 1000.0, error is None)
            if error is not None:
                _count(errors, lock, error)
            with lock:
                pending[0] -= 1
                last_done[0] = max(last_done[0], now)
                if finished[0] and pending[0] == 0:
                    all_done.set()

        max_lag = 0.0
        sent = 0
        start = self._clock() + 0.005
        for i, offset in enumerate(offsets):
            if offset >= seconds or (stop is not None and stop.is_set()):
                break
            latency.append(math.nan)
            due = start + offset
            wait = due - self._clock()
            if wait > 0.0005:
                if stop is not None:
                    if stop.wait(wait):
                        latency.pop()
                        break
                else:
                    self._sleep(wait)
            max_lag = max(max_lag, self._clock() - due)
            if pending[0] >= self.max_in_flight:
                with lock:
                    errors["dropped: too many requests in flight"] = (
                        errors.get("dropped: too many requests in flight", 0) + 1
                    )
                if self._on_latency is not None:  # a dropped request is a failed one for the SLI
                    self._on_latency(self.timeout_s * 1000.0)
                if self._on_result is not None:
                    self._on_result(self.timeout_s * 1000.0, False)
                continue
            with lock:
                pending[0] += 1
            try:
                url = self._target()
                self._client(url).async_infer(
                    self.model,
                    self._inputs,
                    client_timeout=self.timeout_s,
                    callback=lambda result, error, i=i, due=due: on_done(i, due, result, error),
                )
                sent += 1
            except Exception as err:  # noqa: BLE001 - a failed send is a failed request
                on_done(i, due, None, err)
        stopped = stop is not None and stop.is_set()
        sent_for = min(seconds, max(0.0, self._clock() - start)) if stopped or math.isinf(seconds) else seconds
        with lock:
            finished[0] = True
            if pending[0] == 0:
                all_done.set()
        all_done.wait(self.timeout_s + 5)
        with lock:
            values = np.array(latency, dtype=float)
        return _report(
            self.model,
            self._target(),
            values,
            start,
            max(last_done[0], start + sent_for),
            sent=sent,
            arrival=arrival,
            rate_rps=rate_rps,
            seconds=sent_for,
            slo_ms=slo_ms,
            max_lag_ms=max_lag * 1000.0,
            errors=errors,
        )

    def __enter__(self) -> LoadGenerator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- closed-loop helpers (profiling) ---------------------------------------------------------------


def sequential_latency_ms(url: str, model: str, batch: int, requests: int, warmup: int = 3) -> float:
    """Median latency (ms) of `requests` back-to-back requests of `batch` samples (LoadError on failure)."""
    client = grpcclient.InferenceServerClient(url)
    try:
        inputs = build_inputs(client, model, batch)
        for _ in range(warmup):
            client.infer(model, inputs)
        samples = []
        for _ in range(requests):
            started = time.perf_counter()
            client.infer(model, inputs)
            samples.append((time.perf_counter() - started) * 1000.0)
        return float(np.median(samples))
    except InferenceServerException as err:
        raise LoadError(f"{url} model {model!r}: {err}") from None
    finally:
        client.close()


def _served_ns(client: grpcclient.InferenceServerClient, model: str) -> tuple[int, int]:
    """(successful requests, their total time inside Triton in ns): Triton's statistics of `model`."""
    stats = client.get_inference_statistics(model, as_json=True).get("model_stats", [])
    success = stats[0].get("inference_stats", {}).get("success", {}) if stats else {}
    return int(success.get("count", 0)), int(success.get("ns", 0))


#: The quantile of the serving path `profile run` records.
SERVING_QUANTILE = 99.0


#: The rate (req/s) `serving_overhead_ms` sends at by default: the CPU demo's workloads run at 16-48 req/s.
SERVING_RATE_RPS = 20.0

#: The SLI window (s) the serving path's split is measured with: the controller's default heartbeat interval
#: (`controller.config.ControllerConfig.heartbeat_interval_s`), the window of each SLI p99 the closed loop reads.
#: At `SERVING_RATE_RPS` a window holds 40 requests, about as many as the tight CPU demo case's (48 req/s, 1 s).
SLI_WINDOW_S = 2.0


@dataclass(frozen=True)
class ServingSample:
    """One window of the serving-path measurement: each answered request's latency as the client saw it (ms,
    from its scheduled send), when it was answered (s, the client's clock), and Triton's own mean request time
    over the same requests (queue + compute, ms)."""

    latency_ms: tuple[float, ...]
    done_s: tuple[float, ...]
    inside_ms: float

    def p99_ms(self) -> float:
        """The serving path outside the batch as clients see it: the p99 of all requests less Triton's time
        (0 when there are none)."""
        if not self.latency_ms:
            return 0.0
        return max(0.0, float(np.percentile(self.latency_ms, SERVING_QUANTILE)) - self.inside_ms)

    def sli_p99_ms(self, window_s: float = SLI_WINDOW_S) -> float:
        """The same as the closed loop sees it: the median of the `window_s` windows' p99s read from the SLI
        histogram (`agents.latency_metrics.window_p99s_ms`), less Triton's time (0 when there are none)."""
        from agents.latency_metrics import window_p99s_ms

        p99s = window_p99s_ms(self.latency_ms, self.done_s, window_s)
        return max(0.0, float(np.median(p99s)) - self.inside_ms) if p99s else 0.0


def serving_overhead_ms(
    url: str,
    model: str,
    *,
    stats_url: str | None = None,
    requests: int = 200,
    rate_rps: float = SERVING_RATE_RPS,
    warmup: int = 5,
    seed: int = 0,
    clock: Callable[[], float] = time.perf_counter,
) -> ServingSample:
    """The serving path outside the batch, measured over one window of `requests` requests.

    Sent the way clients send: open-loop batch-1 requests on a Poisson schedule at `rate_rps`
    (`LoadGenerator`, gRPC, each latency from its scheduled time) to `url`, the endpoint clients use
    (the agent's router). Triton's own mean request time over the same requests (queue + compute, its
    statistics, read at `stats_url`: the Triton process itself; default `url`) is what the batching
    model predicts; the rest of each latency is the client library and its threads, the sender's
    lateness, the router, the loopback and Triton's frontend, both ways. Back-to-back requests from an
    idle client see a fraction of this (0.3 ms against 5-8 ms p99 on the 2-core machine): a client that
    sleeps between requests pays for waking up. LoadError when a request fails."""
    if requests < 1 or not 0 < rate_rps <= 10_000:
        raise ValueError(f"requests must be >= 1 and rate_rps in (0, 10000], got {requests}, {rate_rps}")
    stats = grpcclient.InferenceServerClient(stats_url or url)
    samples: list[tuple[float, float]] = []
    failed = [0]

    def record(ms: float, ok: bool) -> None:
        if ok:
            samples.append((ms, clock()))  # answered now: when the SLI histogram would count it
        else:
            failed[0] += 1

    gen = LoadGenerator(url, model, on_result=record)
    try:
        gen.warm_up(warmup)
        count_before, ns_before = _served_ns(stats, model)
        gen.run(rate_rps, requests / rate_rps, arrival="poisson", seed=seed)
        count_after, ns_after = _served_ns(stats, model)
    except InferenceServerException as err:
        raise LoadError(f"{url} model {model!r}: {err}") from None
    finally:
        gen.close()
        stats.close()
    if failed[0] or not samples:
        raise LoadError(f"{url} model {model!r}: {failed[0]} of {failed[0] + len(samples)} request(s) failed")
    served = count_after - count_before
    inside_ms = (ns_after - ns_before) / served / 1e6 if served > 0 else 0.0
    return ServingSample(tuple(ms for ms, _ in samples), tuple(at for _, at in samples), inside_ms)


def keep_busy(url: str, model: str, batch: int, stop: threading.Event) -> None:
    """Send back-to-back requests until `stop` is set (a busy neighbour)."""
    client = grpcclient.InferenceServerClient(url)
    try:
        inputs = build_inputs(client, model, batch)
        while not stop.is_set():
            client.infer(model, inputs)
    finally:
        client.close()


def tensor_bytes(url: str, model: str) -> tuple[int, int]:
    """Bytes of one sample's inputs and outputs, from the model's metadata."""
    sizes = {"FP32": 4, "FP16": 2, "INT64": 8, "INT32": 4, "FP64": 8, "INT8": 1, "UINT8": 1, "BOOL": 1}
    client = grpcclient.InferenceServerClient(url)
    try:
        meta = client.get_model_metadata(model, as_json=True)
    except InferenceServerException as err:
        raise LoadError(f"{url} model {model!r}: cannot read metadata ({err})") from None
    finally:
        client.close()

    def total(specs: list[dict]) -> int:
        return sum(int(np.prod([max(1, int(d)) for d in s["shape"][1:]])) * sizes.get(s["datatype"], 4) for s in specs)

    return total(meta["inputs"]), total(meta["outputs"])


# -- the operator's load tool: blocking clients per thread, both protocols, Triton's own latency split ---

PROTOCOLS = ("grpc", "http")
#: Triton's statistics parts that add up to its server-side latency of a request (perf_analyzer's split).
SERVER_PARTS = ("queue", "compute_input", "compute_infer", "compute_output")


def _strip_scheme(url: str) -> str:
    return url.split("://", 1)[1] if "://" in url else url


class TritonClients:
    """One blocking Triton client (and one set of inputs) per thread, over gRPC or HTTP.

    tritonclient's clients are not safe to share between threads, so each sender thread gets its own.
    `statistics()` reads Triton's statistics extension of the model (cumulative), for `server_split`."""

    def __init__(self, url: str, model: str, *, protocol: str = "grpc", batch: int = 1, timeout_s: float = 10.0):
        if protocol not in PROTOCOLS:
            raise ValueError(f"protocol must be one of {', '.join(PROTOCOLS)}, got {protocol!r}")
        self.url, self.model, self.protocol, self.batch, self.timeout_s = (
            _strip_scheme(url),
            model,
            protocol,
            batch,
            timeout_s,
        )
        self._local = threading.local()
        self._all: list[object] = []
        self._lock = threading.Lock()

    def _client(self) -> object:
        client = getattr(self._local, "client", None)
        if client is None:
            if self.protocol == "grpc":
                client = grpcclient.InferenceServerClient(self.url)
                self._local.inputs = build_inputs(client, self.model, self.batch)
            else:
                import tritonclient.http as httpclient

                client = httpclient.InferenceServerClient(
                    self.url, connection_timeout=self.timeout_s, network_timeout=self.timeout_s
                )
                self._local.inputs = _http_inputs(client, self.model, self.batch)
            self._local.client = client
            with self._lock:
                self._all.append(client)
        return client

    def prepare(self) -> None:
        """Open this thread's client and build the inputs: a bad URL or model fails here, with LoadError."""
        try:
            self._client()
        except InferenceServerException as err:
            raise LoadError(f"{self.url}: {err}") from None
        except OSError as err:
            raise LoadError(f"{self.url}: cannot connect ({err})") from None

    def infer(self) -> None:
        client = self._client()
        if self.protocol == "grpc":
            client.infer(self.model, self._local.inputs, client_timeout=self.timeout_s)  # type: ignore[attr-defined]
        else:
            client.infer(self.model, self._local.inputs)  # type: ignore[attr-defined]

    def statistics(self) -> dict[str, tuple[float, float]]:
        """Cumulative {part: (count, ns)} of the model's inference statistics, "success" included."""
        client = self._client()
        try:
            if self.protocol == "grpc":
                stats = client.get_inference_statistics(self.model, as_json=True)  # type: ignore[attr-defined]
            else:
                stats = client.get_inference_statistics(self.model)  # type: ignore[attr-defined]
        except InferenceServerException as err:
            raise LoadError(f"{self.url}: statistics of {self.model!r}: {err}") from None
        out: dict[str, tuple[float, float]] = {}
        for entry in stats.get("model_stats", ()):
            if entry.get("name") != self.model:
                continue
            for part in ("success", *SERVER_PARTS):
                figure = entry.get("inference_stats", {}).get(part, {})
                count, ns = out.get(part, (0.0, 0.0))
                out[part] = (count + float(figure.get("count", 0)), ns + float(figure.get("ns", 0)))
        return out

    def statistics_after(
        self, before: dict[str, tuple[float, float]], answered: int, timeout_s: float = STATISTICS_WAIT_S
    ) -> dict[str, tuple[float, float]]:
        """`statistics` once they count the `answered` requests since `before`: Triton counts a request when its
        response is released, a moment after the client has it, so a read at once can miss the last ones
        (they would count in the next step). After `timeout_s` the statistics are taken as they are."""
        deadline = time.monotonic() + timeout_s
        while True:
            after = self.statistics()
            counted = after.get("success", (0.0, 0.0))[0] - before.get("success", (0.0, 0.0))[0]
            if counted >= answered or time.monotonic() >= deadline:
                return after
            time.sleep(0.01)

    def close(self) -> None:
        with self._lock:
            clients, self._all = self._all, []
        for client in clients:
            try:
                client.close()  # type: ignore[attr-defined]
            except Exception:  # noqa: BLE001 - closing only
                pass


def _http_inputs(client: object, model: str, batch: int) -> list[object]:
    """`build_inputs` over HTTP (binary tensors)."""
    import tritonclient.http as httpclient

    try:
        meta = client.get_model_metadata(model)  # type: ignore[attr-defined]
        config = client.get_model_config(model)  # type: ignore[attr-defined]
    except InferenceServerException as err:
        raise LoadError(f"model {model!r}: cannot read metadata ({err})") from None
    inputs = []
    for name, datatype, data in _input_arrays(meta, config, model, batch, 0):
        tensor = httpclient.InferInput(name, list(data.shape), datatype)
        tensor.set_data_from_numpy(data, binary_data=True)
        inputs.append(tensor)
    return inputs


@dataclass(frozen=True)
class ServerSplit:
    """Triton's own account of one step, per request (ms): what perf_analyzer prints as the server side."""

    requests: int
    queue_ms: float
    compute_input_ms: float
    compute_infer_ms: float
    compute_output_ms: float

    @property
    def server_ms(self) -> float:
        return self.queue_ms + self.compute_input_ms + self.compute_infer_ms + self.compute_output_ms


def server_split(before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]]) -> ServerSplit:
    """The statistics between two reads, as per-request means (NaN with no request in between)."""
    requests = after.get("success", (0.0, 0.0))[0] - before.get("success", (0.0, 0.0))[0]

    def mean_ms(part: str) -> float:
        count = after.get(part, (0.0, 0.0))[0] - before.get(part, (0.0, 0.0))[0]
        ns = after.get(part, (0.0, 0.0))[1] - before.get(part, (0.0, 0.0))[1]
        return ns / count / 1e6 if count > 0 else math.nan

    return ServerSplit(int(requests), *(mean_ms(p) for p in SERVER_PARTS))


def _report(
    model: str,
    target: str,
    values: np.ndarray,
    started: float,
    ended: float,
    *,
    sent: int,
    arrival: str,
    rate_rps: float,
    seconds: float,
    slo_ms: float | None,
    max_lag_ms: float,
    errors: dict[str, int],
) -> LoadReport:
    """The report of one run: `values` is each request's latency (ms; NaN: failed or not answered), every
    load mode's summary (the async generator, the blocking rate and concurrency modes)."""
    good = values[~np.isnan(values)]
    n, ok = len(values), int(good.size)
    over = float((np.sum(good > slo_ms) + (n - ok)) / n) if slo_ms is not None and n else None
    return LoadReport(
        model=model,
        target=target,
        arrival=arrival,
        rate_rps=float(rate_rps),
        seconds=float(seconds),
        sent=sent,
        ok=ok,
        failed=n - ok,
        throughput_rps=ok / (ended - started) if ended > started else 0.0,
        p50_ms=percentile(good, 50),
        p95_ms=percentile(good, 95),
        p99_ms=percentile(good, 99),
        mean_ms=float(good.mean()) if ok else math.nan,
        max_ms=float(good.max()) if ok else math.nan,
        slo_ms=slo_ms,
        over_slo_share=over,
        max_send_lag_ms=max_lag_ms,
        errors=tuple(f"{m} (x{c})" for m, c in sorted(errors.items(), key=lambda kv: -kv[1])[:5]),
    )


def _one_line(err: object) -> str:
    """An error's first line, as the report lists it: printable only (the server wrote it), bounded."""
    text = str(err).strip()
    return clean_text(text.splitlines()[0], ERROR_TEXT_MAX) if text else type(err).__name__


def _count(errors: dict[str, int], lock: threading.Lock, err: object) -> None:
    """One more of `err`'s kind (its first line) in `errors`."""
    message = _one_line(err)
    with lock:
        errors[message] = errors.get(message, 0) + 1


def _timed_infer(
    clients: TritonClients, since: float, clock: Callable[[], float], errors: dict[str, int], lock: threading.Lock
) -> float:
    """One request through `clients`: its latency (ms) counted from `since`, or NaN with its error counted."""
    try:
        clients.infer()
        return (clock() - since) * 1000.0
    except Exception as err:  # noqa: BLE001 - a failed request is counted, not fatal
        _count(errors, lock, err)
        return math.nan


def run_concurrency(
    clients: TritonClients,
    concurrency: int,
    seconds: float,
    *,
    slo_ms: float | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> LoadReport:
    """Closed loop: `concurrency` senders, each sending its next request when the previous one answered
    (perf_analyzer's concurrency mode). Throughput is what the server sustains at that concurrency."""
    clients.prepare()
    latency: list[float] = []
    errors: dict[str, int] = {}
    lock = threading.Lock()
    started = clock()
    deadline = started + seconds

    def sender() -> None:
        try:
            clients.prepare()  # this thread's client, before its first timed request
        except LoadError as err:
            _count(errors, lock, err)
            return
        while clock() < deadline:
            value = _timed_infer(clients, clock(), clock, errors, lock)
            with lock:
                latency.append(value)

    threads = [threading.Thread(target=sender, daemon=True) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + clients.timeout_s + 5)
    return _report(
        clients.model,
        f"{clients.protocol}://{clients.url}",
        np.array(latency, dtype=float),
        started,
        clock(),
        sent=len(latency),
        arrival="closed",
        rate_rps=math.nan,
        seconds=seconds,
        slo_ms=slo_ms,
        max_lag_ms=0.0,
        errors=errors,
    )


def run_rate_blocking(
    clients: TritonClients,
    rate_rps: float,
    seconds: float,
    *,
    arrival: str = "poisson",
    seed: int = 0,
    slo_ms: float | None = None,
    max_in_flight: int = 32,
    clock: Callable[[], float] = time.perf_counter,
) -> LoadReport:
    """Open loop over blocking clients (any protocol): requests sent at their scheduled times by a pool of
    up to `max_in_flight` threads; latency counts from the scheduled time (no coordinated omission). A
    request that finds every thread busy waits for one, and that wait counts in its latency."""
    from concurrent.futures import ThreadPoolExecutor

    clients.prepare()
    latency: list[float] = []
    errors: dict[str, int] = {}
    lock = threading.Lock()

    def send(i: int, due: float) -> None:
        latency[i] = _timed_infer(clients, due, clock, errors, lock)

    offsets = arrival_stream(rate_rps, arrival, seed)
    max_lag = 0.0
    ready = threading.Barrier(max_in_flight)

    def open_client(_: int) -> None:
        ready.wait(30)  # every pool thread waits here, so the pool starts them all
        clients.prepare()

    with ThreadPoolExecutor(max_workers=max_in_flight, thread_name_prefix="stoke-load") as pool:
        list(pool.map(open_client, range(max_in_flight)))  # every thread opens its client before the clock starts
        started = clock() + 0.005
        for i, offset in enumerate(offsets):
            if offset >= seconds:
                break
            due = started + offset
            wait = due - clock()
            if wait > 0.0005:
                time.sleep(wait)
            max_lag = max(max_lag, clock() - due)
            latency.append(math.nan)
            pool.submit(send, i, due)
    return _report(
        clients.model,
        f"{clients.protocol}://{clients.url}",
        np.array(latency, dtype=float),
        started,
        clock(),
        sent=len(latency),
        arrival=arrival,
        rate_rps=rate_rps,
        seconds=seconds,
        slo_ms=slo_ms,
        max_lag_ms=max_lag * 1000.0,
        errors=errors,
    )
