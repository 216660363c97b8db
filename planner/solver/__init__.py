"""Provisioning decisions as pure functions: `solve(problem, ...) -> Plan`."""

from planner.solver.problem import (
    GpuPlan,
    GpuType,
    Placement,
    Plan,
    Problem,
    ProblemError,
    Workload,
    plan_from_dict,
    plan_to_dict,
)
from planner.solver.solve import STRATEGIES, solve

__all__ = [
    "GpuPlan",
    "GpuType",
    "Placement",
    "Plan",
    "Problem",
    "ProblemError",
    "Workload",
    "STRATEGIES",
    "solve",
    "plan_from_dict",
    "plan_to_dict",
]
