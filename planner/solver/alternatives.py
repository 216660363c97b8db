"""What stoke's plan is worth: the same workloads planned the ways an operator would otherwise plan them.

Every alternative is a `Plan` from the same solver over the same profiles (the same latency, batching
and interference model), so GPUs, cost and predicted misses compare like for like:

- the plan itself, named by its strategy (``stoke``, or ``igniter``/``ffd`` with ``--strategy``).
- ``one model per GPU``: no sharing; every replica gets a whole GPU (each workload's share floor set to
  100%, so nothing can sit beside it). What a cluster without MPS runs.
- ``equal MPS split (N per GPU)``: what Kubernetes' NVIDIA device plugin gives with MPS sharing
  (``sharing.mps.replicas: N``): every GPU cut into N equal slices, every replica on one slice. Planned
  with the share step and floor set to 100/N. A workload one slice cannot serve runs as the fewest pods
  (replicas of one slice each, splitting its rate) that can; one whose pod interference pushes past its
  slice cannot grow there and is listed in `Alternative.misses`. N is the best of the slice counts the
  GPU type's share step allows (up to `MAX_SLICES`); the others are kept in `Alternative.tried`.
- ``best configuration alone, packed by share``: each model at its best configuration alone (the
  share and batch stoke picks for it on an empty GPU: what a per-model sweep such as Model Analyzer's
  finds), packed first-fit by share with no interference check: a sweep per model, then packed by hand.
  Its predicted misses (interference) are listed.
- ``iGniter's rule alone, packed by share``: the same with iGniter's batch and share rule (the `ffd`
  strategy, `stoke plan --strategy ffd`).

Pure: no I/O, plain dataclasses in and out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from planner.solver.ffd import solve_ffd
from planner.solver.problem import GpuType, Plan, Problem, ProblemError, Workload
from planner.solver.solve import solve
from planner.solver.stoke import DEFAULT_OPTIONS, StokeOptions, stoke_items

#: Largest slice count tried for the equal MPS split.
MAX_SLICES = 10
#: Pod counts tried past the first estimate, per workload and slice size.
MAX_POD_TRIES = 4


@dataclass(frozen=True)
class Alternative:
    """One way to plan the workloads: its plan (None when it cannot serve them), and what it misses."""

    name: str
    plan: Plan | None
    misses: tuple[str, ...] = ()  # workloads predicted to miss their SLO (or that cannot run this way)
    note: str = ""
    tried: tuple[tuple[str, int | None], ...] = ()  # (variant, GPUs) of the variants compared

    @property
    def gpus(self) -> int | None:
        return None if self.plan is None else self.plan.gpu_count

    @property
    def cost_per_hour(self) -> float | None:
        return None if self.plan is None else self.plan.cost_per_hour


def _with_floor(problem: Problem, share_pct: float) -> Problem:
    return replace(problem, workloads=tuple(replace(w, min_share_pct=share_pct) for w in problem.workloads))


def one_model_per_gpu(problem: Problem, options: StokeOptions | None = None) -> Alternative:
    name = "one model per GPU"
    try:
        plan = solve(_with_floor(problem, 100.0), "stoke", options=options)
    except ProblemError as err:
        return Alternative(name, None, note=str(err))
    return Alternative(name, plan, tuple(plan.slo_misses), "every replica on a whole GPU (no MPS)")


def slice_counts(inventory: Sequence[GpuType]) -> list[int]:
    """Slice counts N (2..MAX_SLICES) whose slice 100/N is a whole number of every GPU type's share steps."""
    out = []
    for n in range(2, MAX_SLICES + 1):
        steps = [100.0 / n / g.profile.gpu.share_step_pct for g in inventory]
        if all(abs(s - round(s)) < 1e-9 and round(s) >= 1 for s in steps):
            out.append(n)
    return out


def _slice_inventory(problem: Problem, size: float) -> tuple[GpuType, ...]:
    return tuple(
        replace(g, profile=replace(g.profile, gpu=replace(g.profile.gpu, share_step_pct=size)))
        for g in problem.inventory
    )


def _pods(w: Workload, inventory: tuple[GpuType, ...], size: float, options: StokeOptions | None) -> list[Workload]:
    """`w` as k pods of one slice each, k the fewest whose share of the rate one slice serves alone."""
    alone = solve(Problem((replace(w, min_share_pct=size),), inventory), "stoke", options=options)
    k = max(1, math.ceil(sum(p.share_pct for _, p in alone.placements()) / size - 1e-9))
    for _ in range(MAX_POD_TRIES):
        pods = [replace(w, name=f"{w.name}.{i}", rate_rps=w.rate_rps / k, min_share_pct=size) for i in range(k)]
        one = solve(Problem((pods[0],), inventory), "stoke", options=options)
        if all(p.share_pct <= size + 1e-6 for _, p in one.placements()) and one.gpu_count == 1:
            return pods
        k += 1
    raise ProblemError(f"workload {w.name!r}: no pod count up to {k} fits one {size:g}% slice each")


def equal_split(problem: Problem, slices: int, options: StokeOptions | None = None) -> Alternative:
    """Every GPU in `slices` equal MPS slices; a workload runs as the fewest one-slice pods that serve it."""
    name = f"equal MPS split ({slices} per GPU)"
    size = round(100.0 / slices, 6)
    inventory = _slice_inventory(problem, size)
    try:
        pods = [p for w in problem.workloads for p in _pods(w, inventory, size, options)]
        plan = solve(Problem(tuple(pods), inventory), "stoke", options=options)
    except ProblemError as err:
        return Alternative(name, None, note=f"slices of {size:g}%: {err}")
    # a pod that interference pushed past its slice cannot grow on Kubernetes: it misses its SLO there
    grown = {p.name.rsplit(".", 1)[0] for _, p in plan.placements() if p.share_pct > size + 1e-6}
    misses = tuple(sorted(grown | {m.rsplit(".", 1)[0] for m in plan.slo_misses}))
    split = sorted({w.name for w in problem.workloads if sum(p.name.startswith(w.name + ".") for p in pods) > 1})
    note = f"slices of {size:g}%, {len(pods)} pod(s)"
    if split:
        note += f"; split into several pods: {', '.join(split)}"
    return Alternative(name, plan, misses, note)


def best_equal_split(problem: Problem, options: StokeOptions | None = None) -> Alternative:
    """The equal split with the fewest GPUs among those that serve every workload (else the fewest misses)."""
    counts = slice_counts(problem.inventory)
    if not counts:
        return Alternative("equal MPS split", None, note="no slice count fits the GPU types' share steps")
    tried = [equal_split(problem, n, options) for n in counts]

    def rank(a: Alternative) -> tuple[bool, float, float, float]:
        # one that cannot serve the workloads at all ranks last, whatever its (empty) list of misses
        return (a.plan is None, len(a.misses), math.inf if a.gpus is None else a.gpus, a.cost_per_hour or math.inf)

    best = min(tried, key=rank)
    return replace(best, tried=tuple((a.name, a.gpus) for a in tried))


def packed_alone(problem: Problem) -> Alternative:
    """iGniter's rule per model alone, packed first-fit by share: `stoke plan --strategy ffd`."""
    name = "iGniter's rule alone, packed by share"
    try:
        plan = solve(problem, "ffd")
    except ProblemError as err:
        return Alternative(name, None, note=str(err))
    return Alternative(name, plan, tuple(plan.slo_misses), "no interference check (stoke plan --strategy ffd)")


def best_alone_packed(problem: Problem, options: StokeOptions | None = None) -> Alternative:
    """Each model's best configuration alone (stoke's own choice for it on an empty GPU: what a
    per-model sweep finds), packed first-fit by share with no interference check."""
    name = "best configuration alone, packed by share"
    chosen = options or DEFAULT_OPTIONS
    try:
        plan = solve_ffd(problem, lambda w, cache: stoke_items(w, cache, chosen), "best-alone")
    except ProblemError as err:
        return Alternative(name, None, note=str(err))
    return Alternative(
        name, plan, tuple(plan.slo_misses), "each model's own best share and batch, neighbours ignored when packing"
    )


#: What the plan compared first is, by its strategy (`stoke plan --compare --strategy S`).
STRATEGY_NOTES = {
    "stoke": "shares, batches and placement chosen together",
    "igniter": "the iGniter heuristic (stoke plan --strategy igniter)",
    "ffd": "iGniter's rule per model, packed first-fit (stoke plan --strategy ffd)",
}


def alternatives(problem: Problem, plan: Plan, options: StokeOptions | None = None) -> list[Alternative]:
    """The `plan` first, named by its strategy (stoke's, or a baseline's with --strategy), then the alternatives of
    the module docstring, all from `problem`."""
    note = STRATEGY_NOTES.get(plan.strategy, f"the plan ({plan.strategy})")
    return [
        Alternative(plan.strategy, plan, tuple(plan.slo_misses), note),
        one_model_per_gpu(problem, options),
        best_equal_split(problem, options),
        best_alone_packed(problem, options),
        packed_alone(problem),
    ]
