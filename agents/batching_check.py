"""The batching latency model (`interference.batching`) against a real Triton server.

The demo model `batch_sleep` (triton_repo/) serves a batch of k requests in
exactly a + c*k ms (config parameters `sleep_base_ms`, `sleep_per_item_ms`).
`BatchingCheck` serves it on one `tritonserver` 2.51 (`TritonFleet`, the whole
machine, ONE model instance: the model describes one instance) with the
dynamic-batching config that `stoke triton render` writes (`render_config`:
max_batch_size = B, preferred batch [B], max queue delay d), drives it with
the open-loop Poisson load generator (`agents.loadgen`, latency counted from
each request's scheduled time) and compares the measured p50/p99 with
`latency_distribution`.

The serving overhead is measured once (`calibrate`) and split by where it
acts: what occupies the instance goes into O(k) = a + c*k + h0 + h1*k
(measured as the instance's throughput at saturation at batch 1 and at the
largest batch), what only adds latency is L(k) - O(k) (the median latency of
paced requests at low load minus O(1)).
`benchmarks/bench_triton_batching.py` says why.

Everything here is measured, so results depend on how busy the machine is.
"""

from __future__ import annotations

import math
import os
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from agents.loadgen import LoadGenerator, arrival_offsets
from agents.triton import ObservedModel, TritonError, TritonFleet, parse_metrics
from controller.messages import ModelAssignment
from controller.render import CONFIG_NAME, ModelConfig, queue_delay_us, read_config
from foundation.host_steal import MEAN_LIMIT as STEAL_LIMIT
from foundation.host_steal import WINDOW_LIMIT as STEAL_WINDOW_LIMIT
from foundation.host_steal import WINDOW_S as STEAL_WINDOW_S
from foundation.host_steal import StealMeter, cpu_times
from interference.batching import LatencyDistribution, ServiceCurve, fill_time_ms, latency_distribution, serve

MODEL = "batch_sleep"
DELAY_MODES = ("zero", "fill")
#: The goal: within 10% or 2 ms of the prediction, whichever is larger.
REL_TOLERANCE, ABS_TOLERANCE_MS = 0.10, 2.0
#: A run whose load generator sent a request this late (ms) was stalled by the machine; it is measured again.
LAG_LIMIT_MS = 15.0
#: A run during which other processes used more CPU than this (cores) measured the machine, not
#: Triton: the server's service time was no longer its own (seen: +11% at p99 with 1.3 cores busy).
OTHERS_LIMIT_CORES = 0.5


class CheckError(RuntimeError):
    """The server could not be set up or a measurement is unusable; the message says which."""


def within_goal(measured_ms: float, predicted_ms: float) -> bool:
    return abs(measured_ms - predicted_ms) <= max(REL_TOLERANCE * predicted_ms, ABS_TOLERANCE_MS)


# --------------------------------------------------------------------------- the service curve


@dataclass(frozen=True)
class Overhead:
    """Serving overhead on top of the model's sleep (ms), measured once by `BatchingCheck.calibrate`."""

    occupancy_base_ms: float  # h0: occupies the instance, once per batch
    occupancy_per_request_ms: float  # h1: occupies the instance, per request of the batch
    latency_ms: float  # L(k) - O(k): client, gRPC, response path
    occupancy_1_ms: float  # measured O(1) and O(B_cal), what h0 and h1 come from
    occupancy_top_ms: float
    top_batch: int
    compute_1_ms: float  # Triton's compute ms per request at batch 1: at saturation,
    compute_idle_1_ms: float  # and from idle (paced, low load), for comparison
    jitter_p99_ms: float  # p99 - p50 of unqueued batch-1 requests: the machine's noise

    def total_ms(self, sleep_1_ms: float) -> float:
        """Latency of one unqueued request beyond the model's own sleep at batch 1."""
        return self.occupancy_1_ms + self.latency_ms - sleep_1_ms


@dataclass(frozen=True)
class SleepModel:
    """The `batch_sleep` parameters: a batch of k sleeps base + per_item*k ms."""

    base_ms: float
    per_item_ms: float

    @classmethod
    def from_config(cls, config: ModelConfig) -> SleepModel:
        params = config.parameters
        try:
            return cls(float(params["sleep_base_ms"].string_value), float(params["sleep_per_item_ms"].string_value))
        except (KeyError, ValueError):
            raise CheckError(
                f"{MODEL}/{CONFIG_NAME}: parameters sleep_base_ms and sleep_per_item_ms must be numbers"
            ) from None

    def sleep_ms(self, k: int | np.ndarray) -> float | np.ndarray:
        return self.base_ms + self.per_item_ms * k

    def curve(self, overhead: Overhead, max_batch: int) -> ServiceCurve:
        k = np.arange(1, max_batch + 1)
        occupancy = self.sleep_ms(k) + overhead.occupancy_base_ms + overhead.occupancy_per_request_ms * k
        return ServiceCurve(
            latency_ms=tuple(float(v) for v in occupancy + overhead.latency_ms),
            occupancy_ms=tuple(float(v) for v in occupancy),
        )


# --------------------------------------------------------------------------- operating points


@dataclass(frozen=True)
class Point:
    """An operating point: max batch B, delay 0 or the fill time, utilisation lambda*O(B)/B."""

    batch: int
    delay: str
    utilisation: float
    requests: int = 4000

    def __post_init__(self) -> None:
        if self.delay not in DELAY_MODES:
            raise ValueError(f"delay must be one of {', '.join(DELAY_MODES)}, got {self.delay!r}")
        if not 0 < self.utilisation < 1 or self.batch < 1 or self.requests < 1:
            raise ValueError(f"need batch >= 1, 0 < utilisation < 1, requests >= 1: {self}")

    @property
    def label(self) -> str:
        return f"B={self.batch} d={self.delay} u={self.utilisation:g}"


@dataclass(frozen=True)
class Prediction:
    rate_rps: float
    delay_ms: float  # as served: the rendered microseconds
    distribution: LatencyDistribution
    curve: ServiceCurve


def predict(point: Point, sleep: SleepModel, overhead: Overhead) -> Prediction:
    """The rate of the point and the model's latency distribution there (pure)."""
    curve = sleep.curve(overhead, point.batch)
    rate = point.utilisation * point.batch / curve.occupancy_ms[-1] * 1000.0
    delay = 0.0 if point.delay == "zero" or point.batch == 1 else fill_time_ms(point.batch, rate)
    delay = queue_delay_us(_assignment(point.batch, delay, rate)) / 1000.0
    return Prediction(rate, delay, latency_distribution(rate, point.batch, delay, "poisson", curve), curve)


def simulate_same_arrivals(
    prediction: Prediction, batch: int, seconds: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Latency and batch size of every request of the discrete-event server on the very arrivals
    the load generator sent: the model free of the run's sampling noise."""
    arrivals = arrival_offsets(prediction.rate_rps, seconds, "poisson", seed) * 1000.0
    lat = np.concatenate([[0.0], prediction.curve.latency_ms])
    occ = np.concatenate([[0.0], prediction.curve.occupancy_ms])
    return serve(arrivals, batch, prediction.delay_ms, lat, occ)


def sampling_spread_ms(prediction: Prediction, point: Point, replicas: int = 16, seed: int = 7) -> float:
    """Standard deviation of a run's p99 from sampling alone: the discrete-event server on
    `replicas` independent Poisson streams of the point's length (the model is exact there)."""
    seconds = point.requests / prediction.rate_rps
    p99s = [
        np.percentile(simulate_same_arrivals(prediction, point.batch, seconds, seed + i)[0], 99)
        for i in range(replicas)
    ]
    return float(np.std(p99s, ddof=1))


@dataclass(frozen=True)
class PointResult:
    point: Point
    rate_rps: float
    delay_ms: float
    measured_p50_ms: float
    measured_p99_ms: float
    predicted_p50_ms: float
    predicted_p99_ms: float
    same_arrivals_p99_ms: float  # the discrete-event server on the sent arrivals: a measured p99 far
    # from it means the server differs, near it the run was short
    measured_mean_batch: float  # Triton's inferences / executions
    simulated_mean_batch: float
    measured_compute_ms: float  # Triton's compute time of a request's batch, mean over requests,
    simulated_sleep_ms: float  # and the sleep a + c*k of a request's batch in the simulation
    sent: int
    failed: int
    max_send_lag_ms: float  # how late the load generator itself sent, at worst
    seconds: float
    others_cores: float  # CPU other processes used during the run (cores)
    ours_cores: float  # CPU of this process, Triton and its stub
    attempts: int = 1
    steal: float = 0.0  # the share of the CPU time the VM's host took during the run
    steal_worst: float = 0.0  # and over its worst `foundation.host_steal.WINDOW_S`

    @property
    def disturbed(self) -> bool:
        """The machine interfered: the load generator fell behind its schedule by more than
        `LAG_LIMIT_MS`, other processes used more than `OTHERS_LIMIT_CORES`, or the VM's host took more of
        the CPU time than `foundation.host_steal` allows (steal, over the run or its worst stretch)."""
        return (
            self.max_send_lag_ms > LAG_LIMIT_MS
            or self.others_cores > OTHERS_LIMIT_CORES
            or self.steal > STEAL_LIMIT
            or self.steal_worst > STEAL_WINDOW_LIMIT
        )

    @property
    def p50_error(self) -> float:
        return self.measured_p50_ms / self.predicted_p50_ms - 1.0

    @property
    def p99_error(self) -> float:
        return self.measured_p99_ms / self.predicted_p99_ms - 1.0

    @property
    def passed(self) -> bool:
        return (
            self.failed == 0
            and within_goal(self.measured_p50_ms, self.predicted_p50_ms)
            and within_goal(self.measured_p99_ms, self.predicted_p99_ms)
        )


def _assignment(batch: int, delay_ms: float, rate_rps: float) -> ModelAssignment:
    return ModelAssignment(
        workload="batching",
        model=MODEL,
        device=0,
        share_pct=100.0,
        batch=batch,
        queue_delay_ms=delay_ms,
        slo_ms=1000.0,
        rate_rps=rate_rps,
    )


# --------------------------------------------------------------------------- how busy the machine is


def process_ticks(pid: int) -> int:
    """utime + stime of one process, in clock ticks (0 if it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0
    return int(fields[11]) + int(fields[12])


def process_tree(root: int) -> list[int]:
    """`root` and its descendants (a Triton server and its Python-backend stubs), from /proc."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    out, frontier = [], [root]
    while frontier:
        pid = frontier.pop()
        out.append(pid)
        frontier += [child for child, parent in parents.items() if parent == pid]
    return out


def _machine_busy_ticks() -> int:
    values = cpu_times()
    return sum(values[:7]) - sum(values[3:5])  # all but idle, iowait and steal (the host's, not a process's)


class CpuMeter:
    """CPU used over an interval by the whole machine and by our processes (this one, Triton and its stubs),
    in cores; the difference is what other processes took from the measurement."""

    def __init__(self, server_pid: int | None) -> None:
        self._pids = [os.getpid(), *(process_tree(server_pid) if server_pid else [])]
        self._start = self._read()
        self.steal = StealMeter().start()  # the CPU time the VM's host took

    def _read(self) -> tuple[float, int, int]:
        return time.monotonic(), _machine_busy_ticks(), sum(process_ticks(p) for p in self._pids)

    def stop(self) -> tuple[float, float]:
        """(cores used by other processes, cores used by ours) since the meter started."""
        t1, busy1, ours1 = self._read()
        t0, busy0, ours0 = self._start
        hz, seconds = os.sysconf("SC_CLK_TCK"), max(t1 - t0, 1e-9)
        ours = (ours1 - ours0) / hz / seconds
        self.steal.stop()
        return max(0.0, (busy1 - busy0) / hz / seconds - ours), ours


# --------------------------------------------------------------------------- the server


class BatchingCheck:
    """`batch_sleep` on one Triton process with one model instance; calibrate, then measure points."""

    KEY = "batching#0"

    def __init__(
        self,
        repository: str | Path,
        *,
        workdir: str | None = None,
        top_batch: int = 8,
        log: Callable[[str], None] = lambda line: None,
    ) -> None:
        self.repository = str(repository)
        self.sleep = SleepModel.from_config(read_config(Path(repository) / MODEL / CONFIG_NAME))
        self.top_batch = top_batch
        self.log = log
        self._tmp = None if workdir else tempfile.TemporaryDirectory(prefix="stoke-batching-")
        folder = workdir if self._tmp is None else self._tmp.name
        # one instance whatever the cores: the model under test is one instance's queue
        self.fleet = TritonFleet(self.repository, device_kind="cpu", workdir=folder, cpu_instance_per_core=False)

    def close(self) -> None:
        self.fleet.close()
        if self._tmp is not None:
            self._tmp.cleanup()

    def __enter__(self) -> BatchingCheck:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- plumbing
    def configure(self, batch: int, delay_ms: float, rate_rps: float) -> str:
        """Serve B / d as `stoke triton render` writes them; returns the gRPC endpoint."""
        report = self.fleet.apply([_assignment(batch, delay_ms, rate_rps)])
        if report.errors:
            raise CheckError(f"cannot serve {MODEL} at batch {batch}: {'; '.join(str(e) for e in report.errors)}")
        config = self.fleet.served_config(self.KEY)
        if config.instance_group[0].count != 1 or config.max_batch_size != batch:
            raise CheckError(
                f"{MODEL} is served with {config.instance_group[0].count} instances at max batch "
                f"{config.max_batch_size}; the check needs 1 instance at {batch}"
            )
        return self.fleet.endpoint(self.KEY)

    def _window(self) -> ObservedModel:
        """Triton's figures since the previous call (the first call starts a window)."""
        observed = [o for o in self.fleet.observe() if o.key == self.KEY]
        if not observed:
            raise CheckError(f"cannot scrape Triton's metrics for {MODEL}")
        return observed[0]

    # -- calibration
    def _counters(self) -> tuple[float, float, float, float]:
        """(time, executions, inferences, compute us) from Triton's metrics; the time is mid-scrape."""
        t0 = time.monotonic()
        try:
            text = self.fleet.metrics_text(self.KEY)
        except TritonError as err:
            raise CheckError(f"cannot scrape Triton's metrics for {MODEL}: {err}") from None
        t1 = time.monotonic()
        row = parse_metrics(text).get(MODEL, {})
        compute = sum(row.get(k, 0.0) for k in ("compute_input_us", "compute_infer_us", "compute_output_us"))
        return (t0 + t1) / 2.0, row.get("executions", 0.0), row.get("inferences", 0.0), compute

    def saturated_occupancy_ms(self, batch: int, seconds: float = 2.0) -> tuple[float, float]:
        """(wall ms per execution, Triton's compute ms per request) with the queue never empty, every batch full.

        Executions are counted every 0.1 s; the rate is the median slope between counts at least
        0.5 s apart (Theil-Sen), so a short stall of the machine does not set it."""
        guess = float(self.sleep.sleep_ms(batch)) + 1.0
        rate = 1.4 * batch / guess * 1000.0  # 40% over capacity: the queue only grows
        url = self.configure(batch, 0.0, rate)
        with LoadGenerator(url, MODEL, max_in_flight=100_000, timeout_s=60.0) as gen:
            gen.prepare()
            worker = threading.Thread(target=gen.run, args=(rate, seconds + 1.5))
            worker.start()
            time.sleep(0.75)  # a backlog builds first
            samples = [self._counters()]
            while samples[-1][0] - samples[0][0] < seconds:
                time.sleep(0.1)
                samples.append(self._counters())
            worker.join()
        t, executions, inferences, compute = (np.asarray(column) for column in zip(*samples))
        done = executions[-1] - executions[0]
        if done < 10 or abs(inferences[-1] - inferences[0] - batch * done) > 0.5:
            raise CheckError(
                f"calibration at batch {batch}: {done:.0f} executions of mean batch "
                f"{(inferences[-1] - inferences[0]) / max(done, 1):.2f}, not full batches of {batch}: "
                f"the server was not saturated (is the machine overloaded?)"
            )
        i, j = np.triu_indices(len(t), 1)
        apart = t[j] - t[i] >= 0.5
        per_second = np.median((executions[j] - executions[i])[apart] / (t[j] - t[i])[apart])
        return 1000.0 / per_second, (compute[-1] - compute[0]) / (inferences[-1] - inferences[0]) / 1000.0

    def unqueued_latency_ms(self, seconds: float = 5.0) -> tuple[float, float, float]:
        """Paced batch-1 requests far apart (no queueing): (p50, p99) latency, i.e. L(1) and L(1) plus the
        machine's own jitter, which the model (a deterministic service) lacks; and Triton's compute ms
        per request, to compare with saturation (an execution that starts from idle wakes its threads)."""
        interval_ms = 4.0 * (float(self.sleep.sleep_ms(1)) + 2.0)
        url = self.configure(1, 0.0, 1000.0 / interval_ms)
        with LoadGenerator(url, MODEL) as gen:
            gen.run(1000.0 / interval_ms, 0.5, arrival="constant")  # warm-up
            self._window()
            report = gen.run(1000.0 / interval_ms, seconds, arrival="constant")
            window = self._window()
        if report.failed:
            raise CheckError(
                f"calibration at low load: {report.failed} of {report.sent} requests failed "
                f"({'; '.join(str(e) for e in report.errors)})"
            )
        return report.p50_ms, report.p99_ms, window.mean_compute_ms

    def calibrate(self, seconds: float = 2.0) -> Overhead:
        """Measure the serving overhead once (see the module docstring)."""
        occ_1, compute_1 = self.saturated_occupancy_ms(1, seconds)
        occ_top, _ = self.saturated_occupancy_ms(self.top_batch, seconds)
        latency_1, latency_1_p99, compute_idle_1 = self.unqueued_latency_ms(2.5 * seconds)
        over_1 = occ_1 - float(self.sleep.sleep_ms(1))
        over_top = occ_top - float(self.sleep.sleep_ms(self.top_batch))
        # a negative slope is noise (per-request work cannot speed a batch up)
        per_request = max(0.0, (over_top - over_1) / (self.top_batch - 1))
        base = max(0.0, over_1 - per_request)
        overhead = Overhead(
            occupancy_base_ms=base,
            occupancy_per_request_ms=per_request,
            latency_ms=max(0.0, latency_1 - occ_1),
            occupancy_1_ms=occ_1,
            occupancy_top_ms=occ_top,
            top_batch=self.top_batch,
            compute_1_ms=compute_1,
            compute_idle_1_ms=compute_idle_1,
            jitter_p99_ms=latency_1_p99 - latency_1,
        )
        self.log(
            f"overhead: O(1) {occ_1:.2f} ms, O({self.top_batch}) {occ_top:.2f} ms at saturation "
            f"(sleep {self.sleep.sleep_ms(1):g} / {self.sleep.sleep_ms(self.top_batch):g} ms); "
            f"unqueued L(1) {latency_1:.2f} ms, its p99 {latency_1_p99:.2f} ms"
        )
        return overhead

    # -- one operating point
    def measure(self, point: Point, overhead: Overhead, *, seed: int = 1, warmup_s: float = 2.0) -> PointResult:
        prediction = predict(point, self.sleep, overhead)
        rate = prediction.rate_rps
        url = self.configure(point.batch, prediction.delay_ms, rate)
        seconds = point.requests / rate
        with LoadGenerator(url, MODEL, timeout_s=30.0) as gen:
            gen.run(rate, warmup_s, arrival="poisson", seed=seed + 10_000)  # stub, threads, channel warm
            self._window()
            meter = CpuMeter(int(self.fleet.processes()[self.KEY]["pid"]))
            try:
                report = gen.run(rate, seconds, arrival="poisson", seed=seed)
            finally:  # the meter's steal sampler stops with a failed run too
                others, ours = meter.stop()
            window = self._window()
        sim_latency, sim_sizes = simulate_same_arrivals(prediction, point.batch, seconds, seed)
        return PointResult(
            point=point,
            rate_rps=rate,
            delay_ms=prediction.delay_ms,
            measured_p50_ms=report.p50_ms,
            measured_p99_ms=report.p99_ms,
            predicted_p50_ms=prediction.distribution.p50_ms,
            predicted_p99_ms=prediction.distribution.p99_ms,
            same_arrivals_p99_ms=float(np.percentile(sim_latency, 99)),
            measured_mean_batch=window.mean_batch or math.nan,
            # a batch of k holds k requests of size k: batches = sum(1/size); Triton's mean is per execution
            simulated_mean_batch=float(len(sim_sizes) / np.sum(1.0 / sim_sizes)),
            measured_compute_ms=window.mean_compute_ms,
            simulated_sleep_ms=float(np.mean(self.sleep.sleep_ms(sim_sizes))),
            sent=report.sent,
            failed=report.failed,
            max_send_lag_ms=report.max_send_lag_ms,
            seconds=seconds,
            others_cores=others,
            ours_cores=ours,
            steal=meter.steal.mean,
            steal_worst=meter.steal.worst(STEAL_WINDOW_S),
        )

    def measure_undisturbed(self, point: Point, overhead: Overhead, *, seed: int = 1, attempts: int = 3) -> PointResult:
        """`measure`, again (new arrivals) while the machine disturbed the run, at most `attempts` times;
        the least disturbed run. The rule looks at the machine only (the generator's lag, other
        processes' CPU), never at the error."""
        best: PointResult | None = None
        for attempt in range(attempts):
            result = self.measure(point, overhead, seed=seed + 100 * attempt)
            if best is None or (result.disturbed, result.others_cores) < (best.disturbed, best.others_cores):
                best = result
            if not result.disturbed:
                break
            self.log(
                f"{point.label}: the machine disturbed the run (load generator {result.max_send_lag_ms:.0f} ms "
                f"late, others used {result.others_cores:.2f} cores, the host took {result.steal:.0%}); "
                "measuring again"
            )
        assert best is not None
        return replace(best, attempts=attempt + 1)


def scaled(points: Sequence[Point], factor: float) -> list[Point]:
    """The same points with `factor` times the requests (at least 500)."""
    return [replace(p, requests=max(500, int(round(p.requests * factor)))) for p in points]
