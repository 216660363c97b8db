"""The closed loop end to end on real Triton (CPU): the benchmark's scenarios, shortened, with outcomes asserted.

A controller (gRPC on loopback), an agent with real Triton processes and open-loop Poisson load
run in this process (`benchmarks/bench_closed_loop.py` builds them). The workload serves
`accel_sim`, whose `slowdown` file is the test hook. Times are generous and only outcomes are
asserted: who acted, what the plan and the profile became, that p99 came back within the SLO and
that no request failed. A run the host disturbed (its steal time), or one whose plan left its steady
state before the incident, is run again, then skipped; a run is given up as soon as the host has
disturbed it for good (its worst 5 s past the limit), not run to its end.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.triton]

ROOT = Path(__file__).resolve().parents[2]

try:
    from agents.triton import find_tritonserver

    find_tritonserver()
except Exception as err:  # noqa: BLE001
    pytest.skip(f"tritonserver not available: {err}", allow_module_level=True)
if len(os.sched_getaffinity(0)) < 2:
    pytest.skip("a larger share needs a second core", allow_module_level=True)

sys.path.insert(0, str(ROOT / "benchmarks"))
import bench_closed_loop as bench  # noqa: E402

#: A garbage collector pass this long or longer is printed with the run (a stall the clients see).
GC_PASS_SHOWN_S = 0.05


@contextlib.contextmanager
def suite_heap_frozen() -> Iterator[list[str]]:
    """The suite's own heap kept out of the garbage collector's passes for the run (`gc.freeze`), and the passes
    that still take `GC_PASS_SHOWN_S` or longer listed. The controller, the agent and the clients run in this
    process, so a full pass over everything the tests before left holds all of them at once: after the planner,
    interference and controller tests, 181k objects took 146 ms to collect on a calm host. A fresh-clone run
    saw a wake-up 209 ms late, none of it stolen by the host, and the clients' p99 over the last 5 s at 251 ms
    (the cause was not caught in the act: such passes are now listed). A controller's own process has no such
    heap; the run's own objects are still collected."""
    passes: list[str] = []
    started: list[float] = []

    def timed(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[:] = [time.perf_counter()]
        elif started and (took := time.perf_counter() - started[0]) >= GC_PASS_SHOWN_S:
            passes.append(f"garbage collection, generation {info.get('generation')}: {took * 1000:.0f} ms")

    gc.collect()
    gc.freeze()
    gc.callbacks.append(timed)
    try:
        yield passes
    finally:
        gc.callbacks.remove(timed)
        gc.unfreeze()


def undisturbed(
    run: Callable[[Path], bench.Result], workdir: Path, share_at_injection: float | None = None, attempts: int = 2
) -> bench.Result:
    """The scenario's first run the host did not disturb (its steal or a pause, `foundation.host_steal`) and that
    reached the incident from the steady state it starts from (`share_at_injection`), run again at most
    `attempts` times; skipped when none did. The rule looks at the host and the precondition only, never
    at the outcome under test."""
    reasons = []
    for attempt in range(attempts):
        with suite_heap_frozen() as passes:
            result = run(workdir / f"attempt-{attempt}")
        for line in passes:  # shown with the timeline when an assertion fails (never an excuse)
            print(line, flush=True)
        reason = result.disturbance
        if reason is None and share_at_injection is not None and result.share_at_injection != share_at_injection:
            reason = (
                f"the plan had moved to {result.share_at_injection:g}% before the incident (from "
                f"{share_at_injection:g}%): the steady state did not hold on this machine"
            )
        if reason is None:
            return result
        reasons.append(reason)
        print(f"attempt {attempt + 1}: {reason}; running again", flush=True)
    pytest.skip(f"no run of {attempts} could test the incident: {'; '.join(reasons)}")


def test_a_slowdown_is_guarded_recalibrated_and_replanned(tmp_path, monkeypatch):
    # A 90 ms SLO, not the benchmark's 80: at 50% the clients' p99 over 10 windows, bursts included, is
    # 47-87 ms and the loop learns it; at 80 ms the re-plan could move to 100% before the slowdown
    # (seen in a run the host did not disturb), leaving the guard nothing to do. 2x slower at 50%, the
    # windows' p99s are 98-150 ms: over 90 ms (at 100 ms some runs stayed under it and the guard waited).
    monkeypatch.setattr(bench, "SLO_MS", 90.0)
    r = undisturbed(
        lambda path: bench.run_slowdown(path, bench.Loop(guard=True), steady_s=8.0, incident_s=25.0, give_up=True),
        tmp_path,
        share_at_injection=50.0,
    )
    text = "\n".join(r.timeline)
    assert r.failed == 0, text  # the move to the larger share included
    assert r.ratio_peak >= 1.5 > r.ratio_before, text  # observed over predicted rises with the 2x slowdown
    # The guard or the recalibrated re-plan, whichever acts first, moves it to 100%: the slowed windows'
    # p99s scatter around the SLO on this VM, and one under it restarts the guard's count of 3. A guard
    # that acted says so once the move serves (tests/controller/test_closed_loop.py tests the guard step by step).
    assert r.guard_moves == 0 or "moved from 50% to 100%" in text, text
    assert r.profile[0] >= 1 and 1.5 <= r.profile[1] <= 2.5, text  # a recalibrated profile near 2x
    assert r.final_share == 100.0, text  # the re-plan keeps the larger share
    assert r.recover_s is not None and r.p99_end_ms <= bench.SLO_MS, text  # p99 back within the SLO


def test_a_rate_surge_is_tracked_and_replanned(tmp_path):
    # to 60 req/s, not the benchmark's 100: tracking is under test here, not the 2-core node's capacity
    r = undisturbed(
        lambda path: bench.run_surge(
            path,
            bench.Loop(guard=False),
            steady_s=6.0,
            incident_s=20.0,
            auto=True,
            min_rps=15.0,
            after=60.0,
            give_up=True,
        ),
        tmp_path,
    )
    text = "\n".join(r.timeline)
    assert r.failed == 0, text
    assert "demand: up: 2 heartbeat(s)" in text.split("inject:")[1], text  # re-planned after 2 heartbeats over
    assert r.detect_s is not None and r.final_rate >= 60.0, text
    assert r.recover_s is not None and r.p99_end_ms <= bench.SLO_MS, text
