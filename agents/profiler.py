"""Runs a `ProfileSession` against real Triton processes on this node.

For each point the session asks for, the runner makes the fleet serve the
model at the point's share (one Triton process per share, as in
production), sends windows of sequential requests of the point's batch size
over gRPC until the window medians are stable (`interference.profiling.
Stability`, perf_analyzer's rule; a noisy point is measured again), and
tells the session the result. With neighbours, copies of the model at the
same share are kept busy by closed-loop threads meanwhile. After every point
the session is written (atomically) to the checkpoint file, so an
interrupted profile resumes where it stopped; each point reports progress
with an ETA.

The serving path outside the batch is measured once per model, the way
clients reach a replica: through the agent's router (its stable endpoint),
open-loop at a steady rate (`agents.loadgen.serving_overhead_ms`), split into
the part the closed loop's SLI windows show and what clients see beyond them.
A measurements file from before this (no serving term, or no split) gets it
on resume.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from agents.loadgen import (
    SERVING_RATE_RPS,
    SLI_WINDOW_S,
    LoadError,
    keep_busy,
    sequential_latency_ms,
    serving_overhead_ms,
    tensor_bytes,
)
from agents.router import Router
from agents.triton import TritonError, TritonFleet
from agents.triton.fleet import SHUTDOWN_S
from agents.triton.ledger import reap_orphans
from controller.messages import ModelAssignment
from foundation.errors import StokeError
from foundation.files import atomic_write_text
from interference.profiling import (
    Measurement,
    MeasurePoint,
    ProfileSession,
    Stability,
    eta_seconds,
    measure_until_stable,
)


class ProfilingError(StokeError, RuntimeError):
    """A measurement could not be taken (Triton would not serve, requests failed, a neighbour died)."""


def _assignment(point: MeasurePoint, copy: int) -> ModelAssignment:
    return ModelAssignment(
        workload=f"profile-{point.model}-{copy}",
        model=point.model,
        device=0,
        share_pct=point.share_pct,
        batch=max(32, point.batch),
        queue_delay_ms=0.0,
        slo_ms=1e6,
        rate_rps=1.0,
    )


@dataclass(frozen=True)
class PointDone:
    """Progress after one point: how far, what was measured, and the time left at this run's pace."""

    done: int
    total: int
    point: MeasurePoint
    measurement: Measurement
    eta_s: float | None

    def line(self) -> str:
        p, m = self.point, self.measurement
        eta = "" if self.eta_s is None else f", ETA {format_duration(self.eta_s)}"
        return (
            f"[{self.done}/{self.total}] {p.model} share {p.share_pct:g}% batch {p.batch}"
            f"{' +%d busy neighbour(s)' % p.neighbours if p.neighbours else ''}: {m.latency_ms:.2f} ms "
            f"({m.windows} windows, spread {m.spread_pct:.1f}%{'' if m.stable else ', UNSTABLE'}){eta}"
        )


def process_rss_mib(pid: object) -> float | None:
    """Resident memory of a process (MiB, /proc/PID/status VmRSS); None when it cannot be read.

    On a CPU node this is the device memory of a replica: Triton's own process, the model's weights
    and the buffers of the batch sizes it has served (`interference.fit.fit_measured` fits it).
    """
    if not isinstance(pid, int) or pid <= 0:
        return None
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    except (OSError, ValueError, IndexError):
        return None
    return None


def format_duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


DEFAULT_STABILITY = Stability()


def _window(url: str, model: str, batch: int, requests: int, index: int) -> float:
    """One measurement window: the median of `requests` sequential requests (the first window warms up)."""
    return sequential_latency_ms(url, model, batch, requests, warmup=3 if index == 0 else 0)


def run_session(
    session: ProfileSession,
    repository: str,
    checkpoint: str | Path,
    *,
    requests: int = 20,
    stability: Stability = DEFAULT_STABILITY,
    progress: Callable[[PointDone], None] = lambda event: print(event.line(), flush=True),
    clock: Callable[[], float] = time.monotonic,
    serving_rate_rps: float = SERVING_RATE_RPS,
    sli_window_s: float = SLI_WINDOW_S,
    on_serving: Callable[[str, float, float], None] = lambda model, ms, beyond: print(
        f"{model}: serving path p99 {ms + beyond:.2f} ms ({ms:.2f} seen by the SLI windows, {beyond:.2f} beyond)",
        flush=True,
    ),
) -> ProfileSession:
    """Measure every point the session still asks for; ProfilingError when one cannot be measured.

    Each window is `requests` sequential requests (the first window after a
    short warm-up); windows go on until `stability` holds or its
    `max_windows` are spent (the point is then recorded, marked unstable).
    The serving path of each model is measured in 3 windows of 10 x `requests` requests at `serving_rate_rps`
    (split with SLI windows of `sli_window_s`),
    also for the models of a finished session that lack it or its split (`on_serving` reports each: the part
    the SLI windows show and what clients see beyond them, ms).
    """
    try:
        fleet = TritonFleet(repository, device_kind="cpu", router=Router("127.0.0.1"))
    except TritonError as err:
        raise ProfilingError(str(err)) from None
    started, measured = clock(), 0
    try:
        while (point := session.ask()) is not None:
            copies = [_assignment(point, c) for c in range(1 + point.neighbours)]
            report = fleet.apply(copies)
            if report.errors:
                raise ProfilingError(
                    f"cannot serve {point.model} at {point.share_pct:g}%: {'; '.join(map(str, report.errors))}"
                )
            endpoints = fleet.endpoints()
            stop = threading.Event()
            threads = [
                threading.Thread(target=keep_busy, args=(endpoints[c.key], c.model, point.batch, stop), daemon=True)
                for c in copies[1:]
            ]
            for t in threads:
                t.start()
            try:
                if point.model not in session.model_bytes:
                    session.model_bytes[point.model] = tensor_bytes(endpoints[copies[0].key], point.model)
                if _needs_serving(session, point.model) and not point.neighbours:
                    # the serving path outside the batch, once per model (it does not depend on the share)
                    on_serving(
                        point.model,
                        *_measure_serving(fleet, copies[0], session, requests, serving_rate_rps, sli_window_s),
                    )
                measurement = measure_until_stable(
                    partial(_window, endpoints[copies[0].key], point.model, point.batch, requests), stability
                )
                if not all(t.is_alive() for t in threads):
                    raise ProfilingError(f"{point.key}: a busy neighbour stopped during the measurement")
            except LoadError as err:
                raise ProfilingError(f"{point.key}: {err}") from None
            finally:
                stop.set()
                for t in threads:
                    t.join(timeout=10)
            session.tell(point, measurement.latency_ms, measurement.spread_pct)
            if point.neighbours == 0:
                rss = process_rss_mib(fleet.processes()[copies[0].key].get("pid"))
                if rss is not None:
                    session.memory_mib[point.key] = rss
            atomic_write_text(checkpoint, json.dumps(session.to_dict(), indent=1) + "\n")
            measured += 1
            done, total = session.progress()
            progress(PointDone(done, total, point, measurement, eta_seconds(clock() - started, measured, total - done)))
        for model in [m for m in session.models if _needs_serving(session, m)]:  # a session from before
            solo = _assignment(MeasurePoint(model, session.shares[0], 1), 0)
            report = fleet.apply([solo])
            if report.errors:
                raise ProfilingError(f"cannot serve {model}: {'; '.join(map(str, report.errors))}")
            try:
                on_serving(model, *_measure_serving(fleet, solo, session, requests, serving_rate_rps, sli_window_s))
            except LoadError as err:
                raise ProfilingError(f"{model} serving path: {err}") from None
            atomic_write_text(checkpoint, json.dumps(session.to_dict(), indent=1) + "\n")
    finally:
        fleet.close()
    return session


#: Windows of the serving-path measurement; their p99s' median is recorded (one stall of the machine during one
#: window moves a p99 of 200 requests from ~7 ms to ~50 ms on the 2-core machine; the median of three does not move).
SERVING_WINDOWS = 3


def _needs_serving(session: ProfileSession, model: str) -> bool:
    """The model's serving path is not measured yet, or was measured before its split (a file from before)."""
    return model not in session.serving_p99_ms or model not in session.beyond_sli_p99_ms


def _measure_serving(
    fleet: TritonFleet,
    assignment: ModelAssignment,
    session: ProfileSession,
    requests: int,
    rate_rps: float,
    sli_window_s: float = SLI_WINDOW_S,
) -> tuple[float, float]:
    """The model's serving path p99 (ms), split into the part the closed loop's SLI windows show and what
    clients see beyond it, also into `session`: through the router's stable endpoint, Triton's own time
    read from the process behind it; `SERVING_WINDOWS` windows of 10 x `requests` requests each.

    Per window, clients see the p99 of all its requests (`ServingSample.p99_ms`); the loop sees the median
    of its SLI windows' p99s over the same requests (`ServingSample.sli_p99_ms`, windows of `sli_window_s`: the
    agents' heartbeat interval). Beyond the SLI is the
    median over windows of the difference (floored at 0); the SLI part is the median client p99 less that,
    so the two add up to what clients see."""
    samples = [
        serving_overhead_ms(
            fleet.serving_endpoint(assignment.key).grpc,
            assignment.model,
            stats_url=fleet.endpoints()[assignment.key],
            requests=10 * requests,
            rate_rps=rate_rps,
            seed=window,
        )
        for window in range(SERVING_WINDOWS)
    ]
    client = statistics.median(s.p99_ms() for s in samples)
    beyond = statistics.median(max(0.0, s.p99_ms() - s.sli_p99_ms(sli_window_s)) for s in samples)
    session.beyond_sli_p99_ms[assignment.model] = beyond
    session.serving_p99_ms[assignment.model] = max(0.0, client - beyond)
    return session.serving_p99_ms[assignment.model], beyond


class TritonMeasurer:
    """Measures single points on real Triton processes of this node, for `stoke profile verify`.

    `measurer(gpu_type, model, batch, share)` serves `model` alone at `share` (whole cores on CPU)
    and returns the median latency of stable windows of `requests` sequential requests of `batch`:
    on a CPU node that is the model's active time (`interference.fit.fit_measured` fits it so). Each
    measurement is printed through `progress`. `close()` stops the processes.
    """

    def __init__(
        self,
        repository: str,
        *,
        requests: int = 20,
        stability: Stability = DEFAULT_STABILITY,
        progress: Callable[[str], None] = lambda line: print(line, flush=True),
        workdir: str | None = None,
    ):
        """`workdir`: the fleet's working directory (None: a temporary one, removed by `close()`); a fixed one
        lets the next fleet there reap processes a killed owner left running."""
        try:
            self.fleet = TritonFleet(repository, device_kind="cpu", workdir=workdir)
        except TritonError as err:
            raise ProfilingError(str(err)) from None
        self.requests, self.stability, self.progress = requests, stability, progress
        self.closed = False

    def __call__(self, gpu_type: str, model: str, batch: int, share_pct: float) -> float:
        point = MeasurePoint(model, share_pct, batch)
        assignment = _assignment(point, 0)
        report = self.fleet.apply([assignment])
        if report.errors:
            raise ProfilingError(f"cannot serve {model} at {share_pct:g}%: {'; '.join(map(str, report.errors))}")
        url = self.fleet.endpoints()[assignment.key]
        try:
            measurement = measure_until_stable(partial(_window, url, model, batch, self.requests), self.stability)
        except LoadError as err:
            raise ProfilingError(f"{point.key}: {err}") from None
        self.progress(
            f"  measured {model} batch {batch} share {share_pct:g}% on {gpu_type}: {measurement.latency_ms:.3f} ms "
            f"({measurement.windows} windows, spread {measurement.spread_pct:.1f}%)"
        )
        return measurement.latency_ms

    def close(self, deadline_s: float = SHUTDOWN_S) -> None:
        """Stop the processes within `deadline_s`, a measurement in flight too (it then fails)."""
        self.closed = True
        self.fleet.close(deadline_s)


class AgentMeasurer:
    """Verify before serving on a CPU node: the agent's `agents.agent.PointMeasurer` over `TritonMeasurer`.

    The controller asks a node to measure a point before a new assignment serves there; this serves the
    model alone at that share in real Triton processes of its own (apart from the serving fleet, started
    on the first request, so an agent that is never asked starts nothing) and measures it like
    `stoke profile verify --device cpu`. The measurement runs beside what the node serves, on the same
    cores (its processes are not pinned apart from the serving replicas'): on a busy node it reads high,
    which errs on the safe side. Its processes live in `workdir` (the agent's own, `measure/` under it), so
    an agent killed mid-measurement has them reaped by the next one there. `close()` stops its processes
    (the agent closes it once nothing is left to measure; the next request starts them again); `abort()`
    and `stop()` do so without waiting for a measurement in flight (it fails), `stop()` for good.
    """

    def __init__(
        self, repository: str, *, workdir: str | None = None, progress: Callable[[str], None] = lambda line: None
    ) -> None:
        self.repository = repository
        self.workdir = workdir
        self.progress = progress
        self._measurer: TritonMeasurer | None = None
        self._lock = threading.Lock()  # one measurement at a time
        self._stopped = threading.Event()
        #: pids of measuring processes a killed agent left running in `workdir`, stopped now
        self.reaped = reap_orphans(workdir) if workdir is not None else []

    def __call__(self, model: str, device: int, share_pct: float, batch: int, requests: int) -> float:
        with self._lock:
            if self._stopped.is_set():
                raise ProfilingError("the agent is stopping: nothing more is measured")
            measurer = self._measurer
            if measurer is None or measurer.closed:  # never started, or aborted
                measurer = self._measurer = self._start(requests)
            measurer.requests = requests
            return measurer("this node", model, batch, share_pct)

    def _start(self, requests: int) -> TritonMeasurer:
        measurer = TritonMeasurer(self.repository, requests=requests, progress=self.progress, workdir=self.workdir)
        if self._stopped.is_set():  # stopped while it started: `stop` may not have seen it
            measurer.close()
            raise ProfilingError("the agent is stopping: nothing more is measured")
        return measurer

    def close(self) -> None:
        """Release the processes (nothing is measured meanwhile: waits for a measurement in flight)."""
        with self._lock:
            measurer, self._measurer = self._measurer, None
        if measurer is not None and not measurer.closed:
            measurer.close()

    def abort(self, deadline_s: float = SHUTDOWN_S) -> None:
        """End a measurement in flight without waiting for it (the lock it holds is not taken): its processes
        stop and it fails; the next call starts new ones."""
        measurer = self._measurer  # read without the lock, which a measurement in flight holds
        if measurer is not None and not measurer.closed:
            measurer.close(deadline_s)

    def stop(self, deadline_s: float = SHUTDOWN_S) -> None:
        """The agent stops: `abort`, and measure nothing more."""
        self._stopped.set()
        self.abort(deadline_s)
