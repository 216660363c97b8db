"""Closed-loop benchmark on real Triton (CPU): what the agents observe feeds the model and the plan.

Each scenario runs the whole stack in this process: a controller (gRPC on loopback), an agent
with real Triton processes, open-loop Poisson load on the workload's stable endpoint (the agent's router) and
feeds the SLI histogram the agent reads back. The workload serves `accel_sim`, the demo's
simulated accelerator (triton_repo/accel_sim): its batch time is exact, and its `slowdown`
file is the test hook that injects a slowdown at runtime. It prints a timeline and figures
(no pass/fail):

1. slowdown: steady state, then a 2x slowdown injected. Observed over predicted rises, the SLO
   guard moves the replica to a larger share, the estimator publishes a recalibrated profile,
   the re-plan keeps the larger share, and p99 is back within the SLO. Run with the guard and
   without it (recalibration alone).
2. surge: a `rate_rps: auto` workload at 10 req/s surges to 60 req/s. Demand tracking re-plans.
   Run with `auto` and with the rate fixed at what auto planned before the surge (guard off in
   both, to isolate demand tracking).
3. steady: noisy load (Poisson, rate oscillating +-20%) for a few minutes with every mechanism
   on: re-plans per hour once settled.

Figures per incident:
- time to detect: injection to the controller's first action (guard move, recalibrated profile,
  or demand decision);
- time to recover: injection until the client-side p99 (failed requests included) is back
  within the SLO: the start of the first 5-second window within it, after the first 2-second
  window over it;
- the fraction of requests over the SLO in the incident window (the same length with and
  without the fast path).

    .venv/bin/python benchmarks/bench_closed_loop.py [--quick] [--steady-s S] [--only slowdown|surge|steady]

tests/controller/test_closed_loop_e2e.py runs scenarios 1 and 2 (with the fast paths), shortened,
and asserts their outcomes.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import secrets
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # the synthetic profiles the tests plan with
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")  # before grpc loads: no fork notices from Triton starts

from profiles import accel_sim_profile  # noqa: E402

from agents.agent import Agent, local_devices  # noqa: E402
from agents.device import open_device  # noqa: E402
from agents.latency_metrics import RequestLatencyExporter, registry_source  # noqa: E402
from agents.loadgen import LoadGenerator  # noqa: E402
from agents.router import Router  # noqa: E402
from agents.triton import TritonFleet  # noqa: E402
from controller.api.client import ControllerClient  # noqa: E402
from controller.config import (  # noqa: E402
    ControllerConfig,
    DemandConfig,
    GpuTypeConfig,
    GuardConfig,
    ProfileSource,
    RecalibrationConfig,
    ServiceConfig,
)
from controller.server import ControllerServer  # noqa: E402
from foundation.host_steal import StealMeter  # noqa: E402
from interference.profile_io import profile_to_dict  # noqa: E402
from planner.solver import Workload  # noqa: E402

MODEL = "accel_sim"
SLO_MS = 80.0
RATE_RPS = 30.0
CORES = len(os.sched_getaffinity(0))


# --------------------------------------------------------------------------- the stack


@dataclass(frozen=True)
class Loop:
    """What the controller runs with: each fast path on or off, and its time constants (short, for a demo)."""

    guard: bool = True
    recalibration: bool = True
    heartbeat_s: float = 1.0
    half_life_s: float = 30.0
    hold_s: float = 300.0

    def service(self) -> ServiceConfig:
        return ServiceConfig(
            heartbeat_interval_s=self.heartbeat_s,
            heartbeat_timeout_s=max(10.0, 5 * self.heartbeat_s),
            gpu_types=(GpuTypeConfig("CPU", 0.10, ("cpu",)),),
            recalibration=RecalibrationConfig(
                enabled=self.recalibration,
                interval_s=self.heartbeat_s,
                half_life_s=self.half_life_s,
                min_windows=5.0,
                min_executions=50.0,
                recent_windows=6,
                replan_threshold=0.10,
                confirmations=2,
            ),
            guard=GuardConfig(enabled=self.guard, windows=3, min_requests=10, hold_s=self.hold_s, cooldown_s=10.0),
            demand=DemandConfig(window_s=60.0, quantile=0.95, headroom=0.25, up_heartbeats=2, cooldown_s=60.0),
        )


class Stack:
    """Controller, agent and Triton in this process, on a private copy of the demo repository."""

    def __init__(self, workdir: Path, loop: Loop) -> None:
        self.workdir = workdir
        self.loop = loop
        self.repo = workdir / "repo"
        shutil.copytree(ROOT / "triton_repo", self.repo, ignore=shutil.ignore_patterns("__pycache__"))
        token = secrets.token_urlsafe(12)
        (workdir / "token").write_text(token + "\n")
        (workdir / "token").chmod(0o600)
        profile = workdir / "accel-profile.json"
        profile.write_text(json.dumps(profile_to_dict(accel_sim_profile(CORES, "CPU"))))
        config = ControllerConfig(
            listen="127.0.0.1:0",
            metrics_listen="",
            db=str(workdir / "controller.db"),
            token_file=str(workdir / "token"),
            reconcile_interval_s=0.2,
            profiles=(ProfileSource(str(profile), "CPU"),),
            service=loop.service(),
        )
        self.server = ControllerServer(config).start()
        self.client = ControllerClient(self.server.address, token=token, timeout_s=10)
        agent_token = self.client.mint_agent_token("local").token  # the agent holds its node's own credential
        self.agent_client = ControllerClient(self.server.address, token=agent_token, timeout_s=10)
        self.exporter = RequestLatencyExporter([SLO_MS])
        self.fleet = TritonFleet(
            str(self.repo),
            device_kind="cpu",
            workdir=str(workdir / "triton"),
            ready_timeout_s=60,
            router=Router("127.0.0.1"),  # stable endpoints: a move switches the route once the new process is ready
        )
        self.device = open_device("cpu")
        self.agent = Agent(
            self.agent_client,
            self.fleet,
            "local",
            local_devices("cpu"),
            heartbeat_interval_s=loop.heartbeat_s,
            sli_sources=[registry_source(self.exporter)],
            sli_pooled_windows=6,  # the pool covers the windows the loop looks at (recent_windows above)
            device=self.device,
            address="127.0.0.1",
        )
        self.agent.start()
        wait_for("the agent registered", lambda: any(n.state == "ready" for n in self.client.list_nodes().nodes), 30)

    def slowdown(self, factor: float) -> None:
        """The test hook: every batch of accel_sim takes `factor` times longer from the next one on."""
        hook = self.repo / MODEL / "1" / "slowdown"
        if factor == 1.0:
            hook.unlink(missing_ok=True)
        else:
            hook.write_text(f"{factor:g}\n")

    def workload(self, name: str) -> Any:
        return next(w for w in self.client.status().workloads if w.name == name)

    def serving(self, name: str, timeout_s: float = 60.0) -> Any:
        return wait_for(
            f"{name} serving",
            lambda: (w := self.workload(name)).state == "serving" and all(r.endpoint for r in w.replicas) and w,
            timeout_s,
        )

    def close(self) -> None:
        self.agent.stop()
        self.agent_client.close()
        self.client.close()
        self.server.stop()
        self.exporter.close()
        self.device.close()


def wait_for(what: str, fn: Callable[[], Any], timeout_s: float, interval_s: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(interval_s)
    raise TimeoutError(f"timed out after {timeout_s:g}s waiting for {what}; last: {last!r}")


# --------------------------------------------------------------------------- load


class Load:
    """Open-loop Poisson load in back-to-back chunks at `rate(t)`, on the workload's stable endpoint.

    Every request's (completion time, latency ms, ok) is kept; a failed request counts as the
    client timeout (as in the SLI histogram)."""

    def __init__(self, stack: Stack, name: str, rate: Callable[[float], float], chunk_s: float = 1.0) -> None:
        self.stack, self.rate, self.chunk_s = stack, rate, chunk_s
        self.key = f"{name}#0"
        self.samples: list[tuple[float, float]] = []
        self.failed = 0
        self.sent = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        record = stack.exporter.recorder(name, MODEL)

        def on_latency(ms: float) -> None:
            record(ms)
            with self._lock:
                self.samples.append((time.monotonic(), ms))

        # the workload's stable endpoint (the router), read once, as a client elsewhere would use it
        self.endpoint = stack.fleet.serving_endpoint(self.key).grpc
        self.gen = LoadGenerator(self.endpoint, MODEL, on_latency=on_latency, timeout_s=10.0)
        self.gen.prepare()
        self.t0 = time.monotonic()
        self._threads: list[threading.Thread] = []
        self._driver = threading.Thread(target=self._drive, daemon=True)
        self._driver.start()

    def _drive(self) -> None:
        k = 0
        while not self._stop.is_set():
            due = self.t0 + k * self.chunk_s
            self._stop.wait(max(0.0, due - time.monotonic()))
            if self._stop.is_set():
                break
            rate = self.rate(time.monotonic() - self.t0)
            t = threading.Thread(target=self._chunk, args=(rate, k), daemon=True)
            t.start()
            self._threads = [x for x in self._threads if x.is_alive()] + [t]
            k += 1

    def _chunk(self, rate: float, seed: int) -> None:
        report = self.gen.run(rate, self.chunk_s, arrival="poisson", seed=seed, slo_ms=SLO_MS)
        with self._lock:
            self.failed += report.failed
            self.sent += report.sent

    def stop(self) -> None:
        self._stop.set()
        self._driver.join(timeout=5)
        for t in self._threads:
            t.join(timeout=15)
        self.gen.close()

    def between(self, start: float, end: float) -> list[float]:
        with self._lock:
            return [ms for t, ms in self.samples if start <= t < end]


def p99(values: list[float]) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]


def over_share(values: list[float]) -> float:
    return sum(1 for v in values if v > SLO_MS) / len(values) if values else math.nan


def recovered_after(
    load: Load, injected: float, end: float, window_s: float = 2.0, settle_s: float = 5.0
) -> float | None:
    """Seconds from the injection until the client-side p99 is back within the SLO: the start of the first
    `settle_s` window whose p99 is within it, after the first `window_s` window over it (0: never over;
    None: not back by the end)."""
    t = injected
    while t + window_s <= end and not p99(load.between(t, t + window_s)) > SLO_MS:
        t += 0.5
    if t + window_s > end:
        return 0.0
    while t + settle_s <= end:
        if p99(load.between(t, t + settle_s)) <= SLO_MS:
            return t - injected
        t += 0.5
    return None


# --------------------------------------------------------------------------- timeline


@dataclass
class Timeline:
    """Polls the controller's status and prints a line whenever the plan, the profile, the guard or the
    demand decision changes, and every `every_s` the observed figures."""

    stack: Stack
    name: str
    t0: float
    every_s: float = 5.0
    lines: list[str] = field(default_factory=list)
    actions: list[tuple[float, str]] = field(default_factory=list)  # (monotonic time, kind) of controller actions
    ratios: list[tuple[float, float]] = field(default_factory=list)  # (monotonic time, observed / predicted)
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> Timeline:
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def mark(self, text: str) -> None:
        self._line(text)

    def _line(self, text: str) -> None:
        line = f"  t={time.monotonic() - self.t0:6.1f}s  {text}"
        self.lines.append(line)
        print(line, flush=True)

    def _poll(self) -> None:
        last: dict[str, Any] = {}
        next_sample = 0.0
        while not self._stop.wait(0.25):
            try:
                w = self.stack.workload(self.name)
                profiles = self.stack.client.list_profiles().profiles
            except Exception:  # noqa: BLE001 - a busy controller: try again
                continue
            now = time.monotonic()
            if w.HasField("prediction_error_ratio"):
                self.ratios.append((now, w.prediction_error_ratio))
            plan = (w.state, tuple((r.share_pct, r.batch) for r in w.replicas), round(w.rate_rps, 1))
            profile = next(((p.active_version, round(p.correction, 3)) for p in profiles if p.model == MODEL), (0, 1.0))
            observed = (
                f"p99 {w.observed_p99_ms:.1f} ms" if w.HasField("observed_p99_ms") else "p99 -",
                f"observed/predicted {w.prediction_error_ratio:.2f}" if w.HasField("prediction_error_ratio") else "",
            )
            if plan != last.get("plan"):
                shares = ", ".join(f"{s:g}% b{b}" for s, b in plan[1]) or "-"
                self._line(f"plan: {w.state} at {shares}, planned for {w.rate_rps:g} req/s ({'; '.join(observed)})")
            if profile != last.get("profile") and "profile" in last:
                self._line(f"profile: v{profile[0]} x{profile[1]:.3f} (recalibrated)")
                self.actions.append((now, "recalibration"))
            if w.guard and w.guard != last.get("guard", ""):
                # the guard acts when it asks the planner for a floor; the move counts once the new share serves
                self._line(f"guard: {w.guard}")
                if "asked the planner" in w.guard:
                    self.actions.append((now, "guard"))
            demand = w.demand.split(":")[0]
            if w.rate_auto and (demand, round(w.rate_rps, 1)) != last.get("demand"):
                self._line(f"demand: {w.demand}")
                if demand in ("up", "down"):
                    self.actions.append((now, "demand"))
            if now >= next_sample:
                self._line("observed: " + "; ".join(x for x in observed if x))
                next_sample = now + self.every_s
            last.update(plan=plan, profile=profile, guard=w.guard, demand=(demand, round(w.rate_rps, 1)))


# --------------------------------------------------------------------------- scenarios


@dataclass
class Result:
    name: str
    detect_s: float | None
    recover_s: float | None
    over_slo: float  # share of the incident window's requests over the SLO
    requests: int
    failed: int
    p99_before_ms: float
    p99_end_ms: float
    final_share: float
    final_rate: float
    profile: tuple[int, float]
    guard_moves: int
    revisions: int  # plan revisions during the incident
    timeline: list[str]
    ratio_before: float  # observed over predicted, median in the steady state
    ratio_peak: float  # highest in the incident
    disturbance: str | None = None  # the host's steal over the run made it measure the host (StealMeter)
    other_pauses: str | None = None  # late wake-ups the host did not steal: printed, never an excuse
    share_at_injection: float = math.nan  # the workload's share when the incident began

    def summary(self) -> str:
        detect = "-" if self.detect_s is None else f"{self.detect_s:.1f} s"
        recover = "not recovered" if self.recover_s is None else f"{self.recover_s:.1f} s"
        return (
            f"{self.name}: detect {detect}, recover {recover}, {self.over_slo:.1%} of {self.requests} requests "
            f"over the SLO in the incident, {self.failed} failed; p99 {self.p99_before_ms:.1f} ms before, "
            f"{self.p99_end_ms:.1f} ms at the end; final share {self.final_share:g}%, planned "
            f"{self.final_rate:g} req/s, profile v{self.profile[0]} x{self.profile[1]:.3f}, "
            f"{self.guard_moves} guard move(s), {self.revisions} plan revision(s); observed/predicted "
            f"{self.ratio_before:.2f} before (median), {self.ratio_peak:.2f} at most in the incident"
            + (f"; DISTURBED: {self.disturbance}" if self.disturbance else "")
        )


def _finish(
    name: str,
    stack: Stack,
    load: Load,
    timeline: Timeline,
    injected: float,
    end: float,
    revision: int,
    steal: StealMeter,
    share_at_injection: float,
) -> Result:
    w = stack.workload("w")
    profile = next(((p.active_version, p.correction) for p in stack.client.list_profiles().profiles), (0, 1.0))
    actions = [t for t, _ in timeline.actions if t >= injected]
    incident = load.between(injected, end)
    steal.stop()
    other = steal.other_pauses()
    return Result(
        name=name,
        detect_s=min(actions) - injected if actions else None,
        recover_s=recovered_after(load, injected, end),
        over_slo=over_share(incident),
        requests=len(incident),
        failed=load.failed,
        p99_before_ms=p99(load.between(injected - 5.0, injected)),
        p99_end_ms=p99(load.between(end - 5.0, end)),
        final_share=sum(r.share_pct for r in w.replicas),
        final_rate=w.rate_rps,
        profile=profile,
        guard_moves=w.guard_moves,
        revisions=stack.client.status().revision - revision,
        timeline=timeline.lines + ([f"  {other}"] if other else []),
        ratio_before=statistics.median([r for t, r in timeline.ratios if t < injected] or [math.nan]),
        ratio_peak=max((r for t, r in timeline.ratios if t >= injected), default=math.nan),
        disturbance=steal.disturbance(),
        other_pauses=other,
        share_at_injection=share_at_injection,
    )


def _wait(steal: StealMeter, seconds: float, give_up: bool) -> bool:
    """Let the scenario run `seconds`; False when it gave up early (`give_up`), the host having disturbed it."""
    if give_up:
        return steal.sleep_unless_disturbed(seconds)
    time.sleep(seconds)
    return True


def run_slowdown(
    workdir: Path, loop: Loop, steady_s: float, incident_s: float, factor: float = 2.0, give_up: bool = False
) -> Result:
    """Steady state, then the slowdown hook at `factor`; the incident window is `incident_s`. `give_up`: end the
    run as soon as the host's steal has disturbed it for good (`StealMeter.sleep_unless_disturbed`)."""
    name = f"slowdown x{factor:g}, guard {'on' if loop.guard else 'off'}"
    print(f"\n== {name} (SLO {SLO_MS:g} ms, {RATE_RPS:g} req/s Poisson, {CORES} core(s))", flush=True)
    stack = Stack(workdir, loop)
    steal = StealMeter(watch_pauses=True)  # a quarter-second stall breaks a p99 too
    try:
        stack.client.apply_workloads([Workload("w", MODEL, SLO_MS, RATE_RPS)])
        stack.serving("w")
        t0 = time.monotonic()
        timeline = Timeline(stack, "w", t0).start()
        steal.start()
        load = Load(stack, "w", lambda t: RATE_RPS)
        calm = _wait(steal, steady_s, give_up)
        revision = stack.client.status().revision
        share = sum(r.share_pct for r in stack.workload("w").replicas)
        injected = time.monotonic()
        if calm:
            timeline.mark(f"inject: {factor:g}x slowdown (the accel_sim/1/slowdown hook)")
            stack.slowdown(factor)
            _wait(steal, incident_s, give_up)
        end = time.monotonic()
        load.stop()
        timeline.stop()
        return _finish(name, stack, load, timeline, injected, end, revision, steal, share)
    finally:
        steal.stop()
        stack.close()


def run_surge(
    workdir: Path,
    loop: Loop,
    steady_s: float,
    incident_s: float,
    auto: bool = True,
    before: float = 12.0,
    after: float = 100.0,
    min_rps: float | None = None,
    give_up: bool = False,
) -> Result:
    """A workload at `before` req/s surges to `after`; `auto`: rate_rps auto, else fixed at before x 1.25.
    `give_up`: as in `run_slowdown`."""
    name = f"surge {before:g} -> {after:g} req/s, rate {'auto' if auto else 'fixed'}"
    print(f"\n== {name} (SLO {SLO_MS:g} ms, {CORES} core(s))", flush=True)
    stack = Stack(workdir, loop)
    steal = StealMeter(watch_pauses=True)  # a quarter-second stall breaks a p99 too
    try:
        planned = before * 1.25
        spec = Workload(
            "w",
            MODEL,
            SLO_MS,
            planned,
            rate_auto=auto,
            min_rps=min_rps if auto else None,
            max_rps=400.0 if auto else None,
        )
        stack.client.apply_workloads([spec])
        stack.serving("w")
        t0 = time.monotonic()
        timeline = Timeline(stack, "w", t0).start()
        steal.start()
        state = {"rate": before}
        load = Load(stack, "w", lambda t: state["rate"])
        calm = _wait(steal, steady_s, give_up)
        if calm:
            stack.serving("w")
        revision = stack.client.status().revision
        share = sum(r.share_pct for r in stack.workload("w").replicas)
        injected = time.monotonic()
        if calm:
            timeline.mark(f"inject: rate {before:g} -> {after:g} req/s")
            state["rate"] = after
            _wait(steal, incident_s, give_up)
        end = time.monotonic()
        load.stop()
        timeline.stop()
        return _finish(name, stack, load, timeline, injected, end, revision, steal, share)
    finally:
        steal.stop()
        stack.close()


def run_steady(workdir: Path, loop: Loop, seconds: float, settle_s: float = 60.0) -> tuple[float, int, int, int]:
    """Noisy steady load on an auto workload: (hours, plan revisions, recalibrations, guard moves) after settling."""
    print(f"\n== steady noisy load: {seconds:g}s after {settle_s:g}s to settle", flush=True)
    stack = Stack(workdir, loop)
    try:
        stack.client.apply_workloads([Workload("w", MODEL, SLO_MS, RATE_RPS, rate_auto=True, max_rps=400.0)])
        stack.serving("w")
        load = Load(stack, "w", lambda t: RATE_RPS * (1.0 + 0.2 * math.sin(2 * math.pi * t / 20.0)))
        timeline = Timeline(stack, "w", time.monotonic(), every_s=30.0).start()
        time.sleep(settle_s)
        timeline.mark("settled")
        w = stack.workload("w")
        revision, moves = stack.client.status().revision, w.guard_moves
        versions = sum(p.versions for p in stack.client.list_profiles().profiles)
        print(f"  settled: plan revision {revision}, profile versions {versions}, planned {w.rate_rps:g} req/s")
        time.sleep(seconds)
        load.stop()
        timeline.stop()
        w = stack.workload("w")
        revisions = stack.client.status().revision - revision
        recalibrations = sum(p.versions for p in stack.client.list_profiles().profiles) - versions
        tail = p99(load.between(time.monotonic() - seconds, time.monotonic()))
        print(
            f"  after {seconds:g}s: {revisions} plan revision(s), {recalibrations} recalibration(s), "
            f"{w.guard_moves - moves} guard move(s); p99 {tail:.1f} ms"
        )
        return seconds / 3600.0, revisions, recalibrations, w.guard_moves - moves
    finally:
        stack.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter phases")
    parser.add_argument("--steady-s", type=float, default=300.0, help="steady noisy load, seconds (default 300)")
    parser.add_argument("--only", choices=("slowdown", "surge", "steady"), help="run one scenario")
    args = parser.parse_args()
    steady_s, incident_s = (10.0, 40.0) if args.quick else (20.0, 60.0)
    results = []
    with tempfile.TemporaryDirectory(prefix="stoke-bench-loop-") as tmp:
        base = Path(tmp)
        if args.only in (None, "slowdown"):
            for guard in (True, False):
                results.append(run_slowdown(base / f"slow-{guard}", Loop(guard=guard), steady_s, incident_s))
        if args.only in (None, "surge"):
            for auto in (True, False):
                results.append(run_surge(base / f"surge-{auto}", Loop(guard=False), steady_s, incident_s, auto=auto))
        steady = None
        if args.only in (None, "steady"):
            steady = run_steady(base / "steady", Loop(), 60.0 if args.quick else args.steady_s)
    print("\n== figures")
    for r in results:
        print("  " + r.summary())
    if steady is not None:
        hours, revisions, recalibrations, moves = steady
        print(
            f"  steady noisy load: {revisions / hours:.1f} re-plans per hour ({revisions} in {hours * 3600:.0f} s), "
            f"{recalibrations} recalibration(s), {moves} guard move(s)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
