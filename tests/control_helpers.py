"""Shared helpers of the control-plane tests: a CPU profile of the demo models, waiting for a condition."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from controller.messages import ApiError
from interference.profile_io import profile_to_dict

DEMO_MODELS = ("tiny_echo", "mlp_small", "conv_medium", "embed_large")


def cpu_profile(name: str = "CPU"):
    """Plausible coefficients for the demo models on a CPU node (share = % of its cores)."""
    # imported here: a solver worker that unpickles spinning_solver imports this module, and the CLI is heavy
    from profiles import demo_cpu_profile

    return demo_cpu_profile(name)


def cpu_profile_json(name: str = "CPU") -> str:
    return json.dumps(profile_to_dict(cpu_profile(name)))


def spinning_solver(problem, strategy="stoke", *, current=None):
    """The real solver, except that a problem holding a workload named spin-* never finishes (a runaway solve).

    Module-level, so the controller's solver worker process can import it (`controller.reconcile.budget`)."""
    from planner.solver import solve

    if any(w.name.startswith("spin") for w in problem.workloads):
        while True:
            pass
    return solve(problem, strategy, current=current)


def hungry_solver(problem, strategy="stoke", *, current=None):
    """The real solver, except that a workload named hog-* allocates memory without end."""
    from planner.solver import solve

    if any(w.name.startswith("hog") for w in problem.workloads):
        hoard = []
        while True:
            hoard.append(bytearray(64 * 1024 * 1024))
    return solve(problem, strategy, current=current)


def wait_for(what: str, fn: Callable[[], Any], timeout: float = 60.0, interval: float = 0.1) -> Any:
    """`fn()` once it is truthy; an API error while the system comes up counts as not yet."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = fn()
            if last:
                return last
        except ApiError as err:
            last = err
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last: {last!r}")
