"""`stoke report`: a self-contained HTML report of a plan against the alternatives (see `stoke.report`).

`stoke plan --compare` prints the same comparison as a table (`compare_rows`), so the report's figures
and the command line agree by construction.
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any

from foundation.errors import UserError
from stoke.client_options import add_client_options
from stoke.output import emit, output_path
from stoke.table import print_table

DEFAULT_REPORT = "stoke-report.html"
OBSERVATION_WINDOWS = 2000  # newest windows drawn in the observed-vs-predicted figure


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "report",
        help="write one self-contained HTML report: the plan, GPUs and cost against the alternatives, packing, "
        "p99 against SLO (and, with --observed, observed against predicted p99 from a running controller)",
        description="Plan WORKLOADS.yaml as `stoke plan` does and write one HTML file with everything inside "
        "(figures as embedded PNG, no network needed to open it): the plan; GPUs and cost against one model "
        "per GPU, an equal MPS split (Kubernetes' device plugin), each model's best configuration alone "
        "packed by share, and iGniter's rule packed by share, all planned with the same model; per-GPU share "
        "packing; predicted p99 (and its upper bound where the plan has one) against each SLO. With --observed "
        "it also reads a running controller's observation windows and draws observed against predicted p99 "
        "over time.",
    )
    p.add_argument("workloads", nargs="?", help="workloads YAML (default: the bundled example); - reads stdin")
    p.add_argument("--profile", metavar="FILE", help="fitted profile JSON for every GPU type (as `stoke plan`)")
    p.add_argument("--strategy", choices=("stoke", "igniter", "ffd"), default="stoke", help="plan strategy")
    p.add_argument(
        "--out",
        default=DEFAULT_REPORT,
        metavar="FILE.html",
        type=output_path(),  # checked before planning; a missing folder is not created
        help="report file (default %(default)s)",
    )
    p.add_argument(
        "--observed",
        action="store_true",
        help="also draw observed against predicted p99 over time from a running controller (connection below)",
    )
    add_client_options(p, group_title="controller connection (--observed)")
    p.set_defaults(run=run_report)


def plan_and_alternatives(workloads: str | None, profile: str | None, strategy: str) -> tuple[Any, list[Any], str]:
    """(plan, alternatives, source) for a workload file, as `stoke plan` would plan it."""
    from planner.solver import ProblemError, solve
    from planner.solver.alternatives import alternatives
    from stoke.commands.inputs import load_problem

    source = workloads or "the bundled example workloads"
    problem = load_problem(workloads, profile).problem()
    try:
        plan = solve(problem, strategy)
    except ProblemError as err:
        raise UserError(f"{source}: {err}") from None
    return plan, alternatives(problem, plan), source


def compare_rows(options: list[Any]) -> list[dict[str, Any]]:
    return [
        {
            "name": a.name,
            "gpus": a.gpus,
            "cost_per_hour": None if a.cost_per_hour is None else round(a.cost_per_hour, 6),
            "predicted_misses": list(a.misses),
            "note": a.note,
            "tried": [{"name": n, "gpus": g} for n, g in a.tried],
        }
        for a in options
    ]


def print_comparison(args: argparse.Namespace, options: list[Any]) -> None:
    """`stoke plan --compare`: the alternatives as a table (or data with -o json|yaml)."""
    rows = compare_rows(options)
    if args.json:
        emit(args, rows)
        return
    print_table(
        ["way to plan", "gpus", "$/hour", "misses", "note"],
        [
            [r["name"], r["gpus"], r["cost_per_hour"], len(r["predicted_misses"]) if r["gpus"] else None, r["note"]]
            for r in rows
        ],
    )


def _observed(args: argparse.Namespace) -> tuple[list[Any], str]:
    from stoke.commands.control import _call
    from stoke.report import ObservedPoint

    reply = _call(args, lambda c: c.list_observations(limit=OBSERVATION_WINDOWS))
    points = [
        ObservedPoint(r.unix, r.workload, r.p99_ms, r.predicted_p99_ms)
        for r in reply.observations
        if r.HasField("p99_ms") and math.isfinite(r.p99_ms) and r.predicted_p99_ms > 0
    ]
    note = "" if points else "the controller has no observation window with both an observed and a predicted p99 yet"
    return points, note


def run_report(args: argparse.Namespace) -> int:
    from foundation.files import atomic_write_text
    from stoke.report import render_report

    if args.observed and args.workloads is None:  # the plan is made here, from a file, not read off the controller
        print(
            "stoke: warning: --observed without WORKLOADS.yaml: the report's plan is of the bundled example "
            "workloads, beside the controller's observations; give the file you applied to compare like with like",
            file=sys.stderr,
        )
    plan, options, source = plan_and_alternatives(args.workloads, args.profile, args.strategy)
    observed, note = (
        _observed(args)
        if args.observed
        else ([], "run with --observed against a running controller to draw observed against predicted p99 over time")
    )
    text = render_report(plan, options, source=source, observed=observed, observed_note=note)
    try:
        atomic_write_text(args.out, text)
    except OSError as err:
        raise UserError(f"--out {args.out}: cannot write the report ({err.strerror}); pick a writable path") from None
    best = min((a for a in options if a.gpus is not None and not a.misses), key=lambda a: a.gpus, default=None)
    print(
        f"report written to {args.out} ({len(text) / 1024:,.0f} KiB, self-contained): {plan.strategy} "
        f"{plan.gpu_count} GPU(s) ${plan.cost_per_hour:,.2f}/hour"
        + (" (misses)" if plan.slo_misses else "")
        + "".join(
            f"; {a.name} {a.gpus if a.gpus is not None else '-'}" + (" (misses)" if a.misses else "")
            for a in options[1:]
        )
        + (f"; fewest without a predicted miss: {best.name}" if best is not None else "")
        + (f"; {len(observed)} observation window(s)" if observed else "")
    )
    return 0
