"""`stoke alerts`: SLO alert rules, their unit tests and Grafana dashboards from the workloads."""

from __future__ import annotations

import argparse
import shutil
import subprocess
from pathlib import Path
from typing import Any

from deploy.slo_options import (
    DASHBOARD_FILE,
    DEFAULT_DATASOURCE_UID,
    DEFAULT_HISTOGRAM,
    DEFAULT_OBJECTIVE,
    DEFAULT_PERIOD_DAYS,
    GRAFANA_ALERTS_FILE,
    RULES_FILE,
    RULES_TEST_FILE,
    AlertConfigError,
    SloOptions,
    selector_problem,
)
from foundation.errors import UserError
from foundation.files import atomic_write_text
from foundation.names import shown
from stoke.commands.inputs import read_plan
from stoke.output import add_output_option, emit
from stoke.table import print_table


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "alerts",
        help="SLO alert rules and Grafana dashboards for the workloads",
        description="Generate Prometheus SLO rules (multi-window multi-burn-rate), their "
        "promtool unit tests, a Grafana dashboard and Grafana alert provisioning.",
    )
    sub = p.add_subparsers(dest="alerts_command", metavar="COMMAND", required=True)

    r = sub.add_parser(
        "render",
        help="write rules, rule tests, dashboard and Grafana alerts into a folder",
        description="Write prometheus-rules.yml, prometheus-rules.test.yml (promtool test rules), "
        "grafana-dashboard.json and grafana-alerts.yml for the workloads in "
        "WORKLOADS.yaml (default: the bundled example). Files are written only when "
        "their bytes change.",
    )
    r.add_argument(
        "workloads", nargs="?", metavar="WORKLOADS.yaml", help="workload file (- reads stdin); default: bundled example"
    )
    r.add_argument("--out", required=True, metavar="DIR", help="folder for the generated files (created)")
    r.add_argument(
        "--objective",
        type=float,
        default=DEFAULT_OBJECTIVE * 100,
        metavar="PCT",
        help=f"share of requests that must meet the SLO, in percent (default {DEFAULT_OBJECTIVE * 100:g})",
    )
    r.add_argument(
        "--period-days",
        type=int,
        default=DEFAULT_PERIOD_DAYS,
        metavar="DAYS",
        help=f"SLO period in days (default {DEFAULT_PERIOD_DAYS})",
    )
    r.add_argument(
        "--histogram",
        default=DEFAULT_HISTOGRAM,
        metavar="METRIC",
        help=f"latency histogram family in ms, with a bucket at each SLO (default {DEFAULT_HISTOGRAM})",
    )
    r.add_argument(
        "--selector",
        default=SloOptions().selector,
        metavar="MATCHERS",
        help='label matchers of a workload\'s series, label="value" joined by commas (operators = != =~ !~); '
        f"{{model}} and {{name}} in a value are replaced (default: '{SloOptions().selector}')",
    )
    r.add_argument(
        "--triton-selector",
        default=SloOptions().triton_selector,
        metavar="MATCHERS",
        help="label matchers of a workload's Triton series; Triton labels them by model only, so give "
        "each Triton scrape target a workload label "
        f"(default: '{SloOptions().triton_selector}')",
    )
    r.add_argument(
        "--dashboard-uid",
        default=SloOptions().dashboard_uid,
        metavar="UID",
        help="Grafana dashboard uid; it does not change with the workloads (default %(default)s)",
    )
    r.add_argument("--plan", metavar="PLAN.json", help="plan (`stoke plan --json`): adds a placement table panel")
    r.add_argument(
        "--datasource-uid",
        default=SloOptions().datasource_uid,
        metavar="UID",
        help="uid of the Grafana Prometheus data source that grafana-alerts.yml queries (Grafana: Connections > "
        "Data sources, the last part of its URL; default %(default)s, which matches only a data source "
        "provisioned with that uid)",
    )
    add_output_option(r)
    r.set_defaults(run=run_render)

    c = sub.add_parser(
        "check",
        help="check rendered rules with promtool (check rules + test rules)",
        description="Run `promtool check rules` and `promtool test rules` on a folder written by "
        "`stoke alerts render`. Needs promtool (`make tools`).",
    )
    c.add_argument("dir", metavar="DIR")
    add_output_option(c)
    c.set_defaults(run=run_check)


def _options(args: argparse.Namespace) -> SloOptions:
    if not 0 < args.objective < 100:
        raise UserError(f"--objective must be a percentage between 0 and 100 (e.g. 99.9), got {args.objective:g}")
    for flag, value, default in (
        ("--selector", args.selector, SloOptions().selector),
        ("--triton-selector", args.triton_selector, SloOptions().triton_selector),
    ):
        problem = selector_problem(value)
        if problem:
            raise UserError(f"{flag} {shown(value)}: {problem}; e.g. {flag} '{default}' (the default)")
    try:
        return SloOptions(
            objective=args.objective / 100.0,
            period_days=args.period_days,
            histogram=args.histogram,
            selector=args.selector,
            triton_selector=args.triton_selector,
            dashboard_uid=args.dashboard_uid,
            datasource_uid=args.datasource_uid,
        )
    except AlertConfigError as err:
        raise UserError(f"alerts options: {err}") from None


def run_render(args: argparse.Namespace) -> int:
    # the renderer (YAML, the planner's types) loads here, not while the parser is built
    from deploy.alerts import render_all, shared_selectors, summary_rows
    from planner.workload_file import load_workloads_file

    options = _options(args)
    workloads = load_workloads_file(args.workloads).workloads
    plan = read_plan(args.plan) if args.plan else None
    if plan is not None:
        models = {w.name: w.model for w in workloads}
        # a name the file gives another model is a plan of other workloads (cpu-demo.yaml reuses the example's names)
        unknown = sorted({p.name for _, p in plan.placements() if models.get(p.name) != p.model})
        if unknown:
            raise UserError(
                f"{args.plan}: plan places workloads not in the workload file, or with another model "
                f"({', '.join(unknown)}); "
                f"render with the workload file the plan was made from"
            )
    try:
        files = render_all(workloads, options, plan)
    except AlertConfigError as err:
        raise UserError(f"{args.workloads or 'bundled example workloads'}: {err}") from None
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out}: exists and is not a folder; give a folder path")
    written: dict[str, bool] = {}
    for name, text in files.items():
        try:
            written[name] = atomic_write_text(out / name, text)
        except OSError as err:
            raise UserError(f"--out {out}: cannot write {name} ({err.strerror})") from None
    if args.json:
        emit(
            args,
            {
                "out": str(out),
                "files": {n: ("written" if w else "unchanged") for n, w in written.items()},
                "workloads": summary_rows(workloads, options),
                "shared_selectors": shared_selectors(workloads, options),
                "grafana_datasource_uid": options.datasource_uid,
            },
        )
        return 0
    rows = [
        [
            r["workload"],
            r["model"],
            r["slo_ms"],
            f"{r['objective_pct']:g}%",
            f"{r['page_error_ratio']:.4g}",
            f"{r['ticket_error_ratio']:.4g}",
            r["selector"],
        ]
        for r in summary_rows(workloads, options)
    ]
    print_table(["workload", "model", "SLO ms", "objective", "page if error >", "ticket if error >", "series"], rows)
    print()
    print_table(["file", "status"], [[str(out / n), "written" if w else "unchanged"] for n, w in written.items()])
    for sel, names in shared_selectors(workloads, options).items():
        print(
            f"note: {', '.join(names)} share the series {{{sel}}}: their SLIs measure the same traffic "
            f"(give each its own with --selector, e.g. 'model=\"{{name}}\"')"
        )
    if options.datasource_uid == DEFAULT_DATASOURCE_UID:
        print(
            f"note: {GRAFANA_ALERTS_FILE} queries the Grafana data source with uid {DEFAULT_DATASOURCE_UID!r} (the "
            f"default); if your Prometheus data source has another uid (Grafana: Connections > Data sources, the "
            f"last part of its URL), render again with --datasource-uid UID"
        )
    print(f"\nhistogram: {options.histogram} (needs a bucket at each SLO); check with: stoke alerts check {out}")
    return 0


def run_check(args: argparse.Namespace) -> int:
    folder = Path(args.dir)
    promtool = shutil.which("promtool")
    if promtool is None:
        raise UserError("promtool not found on PATH; install it with `make tools` (Debian package prometheus)")
    for name in (RULES_FILE, RULES_TEST_FILE):
        if not (folder / name).is_file():
            raise UserError(f"{folder / name}: missing; write it with `stoke alerts render --out {folder}`")
    results: list[list[Any]] = []
    status = 0
    outputs: dict[str, str] = {}
    for cmd in (["check", "rules", RULES_FILE], ["test", "rules", RULES_TEST_FILE]):
        proc = subprocess.run([promtool, *cmd], cwd=folder, capture_output=True, text=True, timeout=300)
        ok = proc.returncode == 0
        status = status or (0 if ok else 1)
        results.append([f"promtool {' '.join(cmd)}", "ok" if ok else "FAILED"])
        if not ok:
            outputs[results[-1][0]] = (proc.stdout + proc.stderr).strip()
    missing = [str(folder / n) for n in (DASHBOARD_FILE, GRAFANA_ALERTS_FILE) if not (folder / n).is_file()]
    if args.json:
        emit(
            args,
            {
                "checks": [{"check": c, "result": r, "output": outputs.get(c, "")} for c, r in results],
                "missing": missing,
            },
        )
        return status
    for text in outputs.values():
        print(text)
    print_table(["check", "result"], results)
    for path in missing:
        print(f"note: {path} is missing")
    return status
