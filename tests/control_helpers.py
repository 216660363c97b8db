"""Shared helpers of the control-plane tests: a CPU profile of the demo models."""

from __future__ import annotations

import json

from interference.profile_io import profile_to_dict
from stoke.commands.demo import demo_cpu_profile

DEMO_MODELS = ("tiny_echo", "mlp_small", "conv_medium", "embed_large")


def cpu_profile(name: str = "CPU"):
    """Plausible coefficients for the demo models on a CPU node (share = % of its cores)."""
    return demo_cpu_profile(name)


def cpu_profile_json(name: str = "CPU") -> str:
    return json.dumps(profile_to_dict(cpu_profile(name)))


def spinning_solver(problem, strategy="stoke", *, current=None):
    """The real solver, except that a problem holding a workload named spin-* never finishes (a runaway solve).

    Module-level, so the controller's solver worker process can import it (`controller.reconcile.budget`)."""
    from controller.solver import solve

    if any(w.name.startswith("spin") for w in problem.workloads):
        while True:
            pass
    return solve(problem, strategy, current=current)


def hungry_solver(problem, strategy="stoke", *, current=None):
    """The real solver, except that a workload named hog-* allocates memory without end."""
    from controller.solver import solve

    if any(w.name.startswith("hog") for w in problem.workloads):
        hoard = []
        while True:
            hoard.append(bytearray(64 * 1024 * 1024))
    return solve(problem, strategy, current=current)
