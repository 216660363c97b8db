"""Core commands: plan, predict, simulate, profile fit."""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from foundation import inputs
from foundation.errors import StokeError, UserError
from foundation.names import check_name, shown
from interference.bounds import MAX_BATCH as DOMAIN_MAX_BATCH
from stoke.client_options import add_client_options
from stoke.commands.inputs import (
    add_repo_option,
    load_problem,
    load_profile_arg,
    read_plan,
    read_text_input,
    source_name,
)
from stoke.output import (
    FORMATS,
    PLOT_SUFFIXES,
    add_output_file_option,
    add_output_option,
    emit,
    output_path,
    writing,
)
from stoke.plan_table import LOCAL, p99_cell, plan_table
from stoke.table import render_table

# The solver (numpy), the simulator and the fit (scikit-learn, scipy) load inside the commands that use
# them, so `stoke --help` and every other command start at once (test_cli_start.py checks it).
#: `stoke plan --strategy` choices (planner.solver.STRATEGIES) and `profile run`'s stability defaults
#: (interference.profiling.Stability): copied here because building the parser should load none of those modules;
#: test_cli_start.py keeps the copies equal. The batch range `profile fit` checks imports nothing heavy.
STRATEGIES = ("stoke", "igniter", "ffd")
STABILITY_TOLERANCE_PCT = 10.0
STABILITY_MAX_WINDOWS = 10

if TYPE_CHECKING:
    from interference.fit import FitReport
    from interference.profile import DeviceProfile
    from interference.profiling import ProfileSession
    from planner.simulate import SimulationReport
    from planner.solver import GpuType, Plan


class _StokeDefaultsFormatter(argparse.HelpFormatter):
    """Help text may name the stoke strategy's defaults as %(stoke_<option>)g: they are looked up only when
    help is printed, so building the parser does not load the solver."""

    def _expand_help(self, action: argparse.Action) -> str:
        if "%(stoke_" in (action.help or ""):
            from dataclasses import asdict

            from planner.solver.stoke import DEFAULT_OPTIONS

            for option, value in asdict(DEFAULT_OPTIONS).items():
                setattr(action, f"stoke_{option}", value)  # argparse fills %(name)s from the action's fields
        return super()._expand_help(action)


def register(subparsers: argparse._SubParsersAction) -> None:
    _register_plan(subparsers)
    _register_predict(subparsers)
    _register_simulate(subparsers)
    _register_profile(subparsers)


def _register_plan(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "plan",
        help="place workloads on GPUs: shares, batches, predicted latency, cost",
        description="Plan GPU shares and batch sizes for the workloads in WORKLOADS.yaml (default: a bundled "
        "example of eight services on V100s) and print the plan.",
        formatter_class=_StokeDefaultsFormatter,
    )
    p.add_argument(
        "workloads",
        nargs="?",
        metavar="WORKLOADS.yaml",
        help="workload file (format: README, schema: planner/data/workloads.schema.json; - reads stdin); "
        "default: bundled example",
    )
    p.add_argument(
        "--strategy",
        choices=STRATEGIES,
        default="stoke",
        help="stoke (default: ours), igniter (published heuristic, flaws fixed), ffd (iGniter's rule packed by "
        "share alone, no interference check)",
    )
    p.add_argument("--profile", metavar="FILE", help="fitted profile JSON to use for every GPU type")
    p.add_argument(
        "--safety-margin",
        type=float,
        metavar="M",
        help="stoke: share of each SLO kept free for model error and jitter (default %(stoke_safety_margin)g)",
    )
    p.add_argument(
        "--max-utilisation",
        type=float,
        metavar="U",
        help="stoke: highest planned utilisation of a replica, rate/throughput, for Poisson clients "
        "(default %(stoke_max_utilisation)g)",
    )
    p.add_argument(
        "--max-paced-utilisation",
        type=float,
        metavar="U",
        help="stoke: the same for paced (constant-rate) clients, which do not queue below 1 "
        "(default %(stoke_max_paced_utilisation)g)",
    )
    p.add_argument(
        "--allow-extrapolation",
        dest="extrapolate",
        action="store_const",
        const=True,
        help="stoke: also use shares and batches outside the profile's measured domain (`stoke profile show`), "
        "at an error bound widened by 15 points per octave beyond it (default: stay inside)",
    )
    p.add_argument(
        "--no-error-bound",
        dest="error_bound",
        action="store_const",
        const=False,
        help="stoke: trust the fitted curve (central prediction) instead of raising L and O to the profile's "
        "out-of-sample error; give --safety-margin 0.05 --max-paced-utilisation 0.98 for stoke before issue 15",
    )
    add_output_option(
        p,
        wide="each replica's predicted throughput and utilisation (rate/throughput), and a local plan's arrivals",
    )
    p.add_argument(
        "--fail-on-miss",
        action="store_true",
        help="exit with code 3 (not 0) when a workload is predicted to miss its SLO (with --compare: in the plan "
        "compared first)",
    )
    p.add_argument(
        "--explain",
        metavar="WORKLOAD",
        help="stoke: after the plan, show the candidates around WORKLOAD's choice and why each was not taken",
    )
    p.add_argument(
        "--plot",
        metavar="FILE.png",
        type=output_path(PLOT_SUFFIXES),
        help="also draw shares per GPU and predicted latency vs SLO (.png, .svg or .pdf; with more than "
        "a page of GPUs, detail pages beside it)",
    )
    p.add_argument(
        "--compare",
        action="store_true",
        help="instead of the plan, compare its GPUs and cost with one model per GPU, an equal MPS split, each "
        "model's best configuration alone packed by share, and iGniter's rule packed by share (the same model; "
        "what `stoke report` draws)",
    )
    p.add_argument("--remote", action="store_true", help="ask a running controller for its current plan")
    add_client_options(p, group_title="controller connection (--remote)")
    p.set_defaults(run=run_plan)


def _register_predict(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "predict",
        help="predict latency/throughput of co-located models on one GPU",
        description='Each line of CASES.jsonl is one GPU: a JSON list of {"model", "batch", "share_pct"}. '
        "Each output line is the same list with predicted_latency_ms and predicted_throughput_rps.",
    )
    p.add_argument("--profile", metavar="FILE", help="fitted profile JSON (default: bundled V100)")
    p.add_argument(
        "--cases", metavar="CASES.jsonl", required=True, help="one GPU configuration per line; - reads stdin"
    )
    add_output_option(p)
    p.set_defaults(run=run_predict)


def _register_simulate(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "simulate",
        help="replay a plan in a discrete-event simulator",
        description="Replay PLAN.json (from `stoke plan --json`) with Poisson (or constant) arrivals and "
        "Triton-style dynamic batching; report p50/p99 latency, share over SLO, throughput.",
    )
    p.add_argument("plan", metavar="PLAN.json", help="output of `stoke plan --json`; - reads stdin")
    p.add_argument("--seconds", type=float, default=30.0, help="simulated seconds (default 30)")
    p.add_argument(
        "--min-requests",
        type=int,
        default=100_000,
        metavar="N",
        help="replicas too slow to send N requests in --seconds run longer, so every p99 is measured "
        "(default %(default)s; 0 = exactly --seconds)",
    )
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument(
        "--arrivals",
        choices=("poisson", "constant"),
        default=None,
        help="override every workload's arrival kind (default: each workload's own, from the plan)",
    )
    p.add_argument(
        "--noise",
        type=float,
        default=0.0,
        help="log-normal sigma of multiplicative service-time noise, 0 to 1 (default 0)",
    )
    p.add_argument(
        "--profile",
        metavar="[TYPE=]FILE",
        action="append",
        default=[],
        help="fitted profile JSON for every GPU type, or TYPE=FILE for one (repeatable); default: the bundled "
        "profile of each bundled device (V100, cpu-2core). A plan from `stoke plan --json` records each type's "
        "profile: another one is refused",
    )
    add_output_option(p)
    p.add_argument(
        "--fail-on-miss",
        action="store_true",
        help="exit with code 3 (not 0) when a workload's simulated p99 is over its SLO",
    )
    p.set_defaults(run=run_simulate)


def _register_profile(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "profile", help="measure (run), fit, show and verify the latency profiles the planner uses"
    )
    profile = p.add_subparsers(dest="profile_command", metavar="COMMAND", required=True)
    f = profile.add_parser(
        "fit",
        help="fit a GPU-type profile from raw measurements (JSON lines)",
        description="Fit the interference model from raw profile measurements (the published "
        "iGniter JSON-lines layout, or `stoke profile run` output), report how well it "
        "fits (per-point error, MAPE, R^2) and write the fitted profile (JSON, "
        "versioned) only when every model is positive and monotone over batch "
        f"1..{DOMAIN_MAX_BATCH} x every share step and within --max-mape; otherwise "
        "exit 1 with the reason, or write it anyway with --force.",
    )
    f.add_argument(
        "raw", metavar="RAW.jsonl", help="raw measurements (iGniter JSON lines or `profile run` output); - reads stdin"
    )
    add_output_file_option(f, metavar="PROFILE.json", required=True, help="the fitted profile to write")
    f.add_argument("--gpu-name", default="V100", help="GPU type name stored in the profile (default V100)")
    f.add_argument(
        "--max-mape",
        type=float,
        default=DEFAULT_MAX_MAPE,
        metavar="PCT",
        help="refuse a model whose fit misses its points by more than this on average (default %(default)g%%)",
    )
    f.add_argument("--force", action="store_true", help="write the profile even when a check fails")
    add_output_option(f, flags=("--format",))
    f.set_defaults(run=run_profile_fit)
    r = profile.add_parser(
        "run",
        help="measure models on this node's Triton (CPU) and write measurements for `profile fit`",
        description="Profile models served by real Triton processes on this machine: latency at every batch in "
        "--batches and every whole-core share, plus one co-location point per model. Each point is "
        "measured in windows of --requests requests until the last 3 window medians lie within "
        "--stability-percentage of their mean (perf_analyzer's rule), at most --max-windows. Progress "
        "(with an ETA) is checkpointed to OUTPUT after every point; run again with the same OUTPUT to "
        "resume. Once per model it also measures the serving path outside the batch: 3 windows of 10 x --requests "
        "batch-1 requests through the agent's router over gRPC, open-loop at --serving-rate, less Triton's own "
        "time. Their median p99 is split into what the closed loop's SLI windows (--sli-window) show, the profile's "
        "serving_p99_ms (the loop re-learns it), and what clients see beyond them, beyond_sli_p99_ms (the loop "
        "keeps it); a measurements file without them gets them on resume.",
    )
    add_repo_option(r, "model repository (default %(default)s)")
    r.add_argument(
        "--models",
        default="mlp_small,conv_medium,embed_large",
        help="comma-separated models (default: the three demo models)",
    )
    r.add_argument("--batches", default="1,8,16,32", help="batch sizes (default 1,8,16,32)")
    r.add_argument("--requests", type=int, default=20, help="requests per window (its median is taken; default 20)")
    r.add_argument(
        "--stability-percentage",
        type=float,
        default=STABILITY_TOLERANCE_PCT,
        metavar="PCT",
        help="the last 3 window medians must lie within this of their mean (default %(default)g)",
    )
    r.add_argument(
        "--max-windows",
        type=int,
        default=STABILITY_MAX_WINDOWS,
        metavar="N",
        help="windows per point before it is recorded as unstable (default %(default)s)",
    )
    r.add_argument(
        "--serving-rate",
        type=float,
        default=20.0,  # agents.loadgen.SERVING_RATE_RPS (not imported here: it loads tritonclient)
        metavar="RPS",
        help="Poisson rate of the serving-path measurement, req/s (default %(default)g)",
    )
    r.add_argument(
        "--sli-window",
        type=float,
        default=2.0,  # agents.loadgen.SLI_WINDOW_S: the controller's default heartbeat_interval_s
        metavar="S",
        help="the SLI window the serving path is split with: the heartbeat interval of the agents that will "
        "serve the profile (default %(default)g, the controller's default; `stoke up` uses 1)",
    )
    r.add_argument("--device-name", default=None, help="device type name (default cpu-<N>core)")
    add_output_file_option(
        r, metavar="MEASUREMENTS.json", required=True, help="the measurements to write (and resume from)"
    )
    r.set_defaults(run=run_profile_run)
    sh = profile.add_parser(
        "show",
        help="show a fitted profile's models: measured domain and the fit's out-of-sample error",
        description="Per model: the batch sizes and shares the profile measured (the domain the planner stays "
        "in), and the fit's leave-one-out error there (each measured point left out, the model refitted "
        "without it, and the point predicted): its 90% quantile and worst, the error floor, and the error "
        "grid. A profile saved before profiles recorded this shows the conservative default. serving_p99_ms is "
        "the measured serving path outside the batch (client, router, Triton's frontend) as the closed loop's "
        "SLI windows show it, beyond_sli_p99_ms what clients see beyond those windows (0 in profiles measured "
        "before it); both are added to every p99 the planner predicts for the model.",
    )
    sh.add_argument(
        "profile", nargs="?", metavar="PROFILE.json", help="fitted profile (default: the bundled V100 profile)"
    )
    add_output_option(sh, wide="the leave-one-out error at every measured point")
    sh.set_defaults(run=run_profile_show)
    v = profile.add_parser(
        "verify",
        help="measure the points a plan chose, put them in the profile and re-plan until the plan holds on them",
        description="Verify before serving: each (model, batch, share) the plan chose is measured on the device, "
        "the measurement replaces the fit there (and raises its neighbourhood when slower), and the workloads "
        "are planned again; a round that chooses only measured points ends it (at most --rounds). A Poisson "
        "replica is measured at every batch size 1..B it runs, a paced one at B. Devices: "
        "'simulated', the perturbed V100 truth of interference/truth.py (benchmarks and tests), or 'cpu', real "
        "Triton processes on this node (the plan must be made with a CPU profile: --profile). Measuring "
        "through NVML/MPS on a GPU is not built yet.",
    )
    v.add_argument("plan", metavar="PLAN.json", help="a plan from `stoke plan --json` (- reads stdin)")
    v.add_argument(
        "--device",
        choices=("simulated", "cpu"),
        default="simulated",
        help="where to measure: 'simulated' (the perturbed V100 truth; the default) or 'cpu' (real Triton on this "
        "node)",
    )
    add_repo_option(v, "cpu: the model repository to serve from (default %(default)s)")
    v.add_argument(
        "--profile", metavar="FILE", help="cpu: the fitted profile the plan was made with (default: bundled CPU)"
    )
    v.add_argument("--requests", type=int, default=20, help="cpu: requests per measurement window (default 20)")
    v.add_argument("--rounds", type=int, default=8, help="at most this many measure/re-plan rounds (default 8)")
    v.add_argument(
        "--neighbours",
        action="store_true",
        help="also measure each chosen point's neighbours, one and two share steps lower and the batch one "
        "larger (2-4x the points), until the plan's neighbours are measured: where the error bound "
        "kept the plan from them, a measurement may show they hold",
    )
    v.add_argument("--plan-out", metavar="FILE", type=output_path(), help="write the verified plan (JSON) here")
    v.add_argument(
        "--profile-out", metavar="FILE", type=output_path(), help="write the profile with the measured points here"
    )
    v.set_defaults(run=run_profile_verify)


# -- plan ------------------------------------------------------------------------------------------


def run_plan(args: argparse.Namespace) -> int:
    from foundation.gc_pause import collection_paused

    with collection_paused():  # reading, solving and printing a large fleet: see foundation.gc_pause
        return _run_plan(args)


def _run_plan(args: argparse.Namespace) -> int:
    from planner.solver import ProblemError, plan_to_dict, solve
    from planner.solver.stoke import DEFAULT_OPTIONS, StokeOptions

    if args.remote:
        from stoke.commands.control import remote_plan

        return remote_plan(args)
    if args.compare and args.wide:
        raise UserError("-o wide widens the plan's table; --compare has no wide table: use -o table, json or yaml")
    if args.compare and (args.plot or args.explain is not None):
        flag = "--plot" if args.plot else "--explain"
        raise UserError(f"{flag} is about one plan and --compare prints a comparison of plans; drop one of them")
    source = args.workloads or "the bundled example workloads"
    workloads_file = load_problem(args.workloads, args.profile)
    options = None
    knobs = {
        "safety_margin": args.safety_margin,
        "max_utilisation": args.max_utilisation,
        "max_paced_utilisation": args.max_paced_utilisation,
        "extrapolate": getattr(args, "extrapolate", None),
        "error_bound": getattr(args, "error_bound", None),
    }
    given = {k: v for k, v in knobs.items() if v is not None}
    if given:
        flag_names = {"extrapolate": "allow-extrapolation", "error_bound": "no-error-bound"}
        flags = "/".join("--" + flag_names.get(k, k.replace("_", "-")) for k in given)
        if args.strategy != "stoke":
            one = len(given) == 1
            raise UserError(
                f"{flags} {'tunes' if one else 'tune'} the stoke strategy; drop {'it' if one else 'them'} "
                f"or use --strategy stoke"
            )
        try:
            options = StokeOptions(**given)
        except ProblemError as err:
            raise UserError(f"{flags}: {err}") from None
    if args.explain is not None:  # checked before planning, so a typo (or '') fails at once and prints no plan
        if args.strategy != "stoke":
            raise UserError("--explain shows the stoke strategy's candidates; drop it or use --strategy stoke")
        names = sorted(w.name for w in workloads_file.problem().workloads)
        if args.explain not in names:
            raise UserError(
                f"--explain: no workload {args.explain!r} in {source}; workloads: {', '.join(names[:10])}"
                + (", ..." if len(names) > 10 else "")
            )
    try:
        plan = solve(workloads_file.problem(), args.strategy, options=options)
    except ProblemError as err:
        raise UserError(f"{source}: {err}") from None
    if args.compare:
        from planner.solver.alternatives import alternatives
        from stoke.commands.report import print_comparison

        print_comparison(args, alternatives(workloads_file.problem(), plan, options))
        return _fail_on_miss(args, plan)
    if args.json:
        emit(args, plan_to_dict(with_profiles(plan, workloads_file.gpu_types)))
    else:
        print(format_plan(plan, wide=args.wide))
    if args.explain is not None:
        from planner.solver.explain import explain

        try:
            explanation = explain(workloads_file.problem(), plan, args.explain, options or DEFAULT_OPTIONS)
        except ProblemError as err:
            raise UserError(f"--explain: {err}") from None
        print("\n" + format_explanation(explanation), file=sys.stderr if args.json else sys.stdout)
    if args.plot:
        from stoke.plots import plot_plan

        try:
            written = plot_plan(plan, args.plot)
        except OSError as err:
            raise UserError(
                f"--plot {args.plot}: cannot write the plot ({err.strerror}); pick a writable path"
            ) from None
        print(f"\nplot written to {', '.join(written)}", file=sys.stderr if args.json else sys.stdout)
    return _fail_on_miss(args, plan)


def _fail_on_miss(args: argparse.Namespace, plan: Plan) -> int:
    """`--fail-on-miss`: EXIT_MISS when the plan (with --compare: the plan compared first) predicts a miss."""
    if args.fail_on_miss and plan.slo_misses:
        print(
            f"stoke: {len(plan.slo_misses)} workload(s) predicted to miss their SLO: {', '.join(plan.slo_misses[:10])}",
            file=sys.stderr,
        )
        return EXIT_MISS
    return 0


def format_plan(plan: Plan, wide: bool = False) -> str:
    types = sorted({g.gpu_type for g in plan.gpus})
    head = f"strategy {plan.strategy}: {plan.gpu_count} GPU(s) ({', '.join(types)}), ${plan.cost_per_hour:,.2f}/hour"
    rows = ((index, gpu.gpu_type, p.name, p) for index, gpu in enumerate(plan.gpus) for p in gpu.placements)
    table = plan_table(rows, LOCAL, wide=wide)
    lines = [head, "", table]
    per_gpu = ", ".join(f"{i}: {g.share_pct:g}%" for i, g in enumerate(plan.gpus))
    lines += ["", f"GPU shares in use: {per_gpu}"]
    if any(g.memory_mib for g in plan.gpus):
        memory = ", ".join(f"{i}: {g.memory_mib / 1024:.1f}" for i, g in enumerate(plan.gpus))
        lines.append(f"GPU memory in use (GiB; process contexts, weights, activations): {memory}")
    ratios = sorted(p.p99_slo_ratio for _, p in plan.placements() if math.isfinite(p.p99_slo_ratio))
    unstable = sorted({p.name for _, p in plan.placements() if math.isinf(p.p99_slo_ratio)})
    if ratios:
        lines.append(
            f"predicted p99/SLO: min {ratios[0]:.2f}, median {ratios[len(ratios) // 2]:.2f}, max {ratios[-1]:.2f}"
            + (f" (and {len(unstable)} unstable: {', '.join(unstable[:10])})" if unstable else "")
        )
    elif unstable:
        lines.append(f"predicted p99/SLO: every workload unstable ({', '.join(unstable[:10])})")
    if plan.slo_misses:
        lines.append(f"predicted to miss their SLO: {', '.join(plan.slo_misses)}")
    lines += [f"note: {n}" for n in plan.notes]
    lines.append(
        "p99_ms: predicted 99th-percentile request latency end to end (queueing + batch fill + co-located "
        "inference + the serving path); p99_upper: the same with L and O raised to the profile's error bound "
        "there and partial batches on a line at or above every raised O(k); serving_ms: the serving path's p99 "
        "outside the batch (client, router, Triton's frontend) as the closed loop's SLI windows show it, and "
        "beyond_sli_ms: what clients see beyond those windows, both from the profile and both in p99_ms; "
        "infer_ms: one batch's inference time; delay_ms: Triton's max queue delay; unstable: the requests "
        "arrive faster than the replica serves them, so its queue and p99 grow without bound."
    )
    return "\n".join(lines)


def format_explanation(explanation: Any) -> str:
    lines = list(explanation.summary)
    for replica in explanation.replicas:
        p = replica.placement
        label = f"replica {p.replica + 1}/{p.replicas}" if p.replicas > 1 else "placement"
        lines += [
            "",
            f"{label}: GPU {replica.gpu_index}, {p.rate_rps:g} req/s, share {p.share_pct:g}%, batch {p.batch}, "
            f"delay {p.queue_delay_ms:.2f} ms; predicted p99 {p.predicted_p99_ms:.2f} ms "
            f"({p.p99_slo_ratio:.2f} x SLO), {p.p99_upper_ms:.2f} ms at the error bound; binding: {p.binding}",
        ]
        rows = [
            [r.share_pct, r.batch, r.delay, r.queue_delay_ms, p99_cell(r.p99_ms), r.utilisation, r.verdict]
            for r in replica.rows
        ]
        p99_head = "p99_upper (alone)" if explanation.error_bound else "p99_ms (alone)"
        lines.append(render_table(["share_%", "batch", "delay", "delay_ms", p99_head, "util", "verdict"], rows))
    return "\n".join(lines)


# -- predict ---------------------------------------------------------------------------------------


#: A case's fields: what it asks, and what `predict` writes (so its output can be fed back).
_CASE_FIELDS = {"model", "batch", "share_pct", "predicted_latency_ms", "predicted_throughput_rps", "in_domain"}


def _case_list(line: str, where: str, share_step_pct: float) -> list[dict[str, Any]]:
    layout = 'each line must be a JSON list of {"model", "batch", "share_pct"}'
    items = inputs.parse_json(line, where, "case list", error=UserError, fix=layout)  # a repeated key refused
    if not isinstance(items, list) or not items:
        raise UserError(f'{where}: each line must be a non-empty JSON list of {{"model", "batch", "share_pct"}}')
    for k, item in enumerate(items):
        if not isinstance(item, dict):
            raise UserError(f"{where}: entry {k} must be an object with model, batch, share_pct")
        for field in ("model", "batch", "share_pct"):
            if field not in item:
                raise UserError(f"{where}: entry {k} lacks field {field!r}; add it")
        unknown = sorted(set(item) - _CASE_FIELDS)
        if unknown:  # a misspelt field would be ignored silently
            raise UserError(
                f"{where}: entry {k} has unknown field {shown(unknown[0])}; the fields are model, batch, share_pct "
                "(and the predicted ones predict writes, which it replaces)"
            )
        batch, share = item["batch"], item["share_pct"]
        if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= DOMAIN_MAX_BATCH:
            raise UserError(
                f"{where}: entry {k} field 'batch' must be a whole number from 1 to {DOMAIN_MAX_BATCH} (the largest "
                f"batch a profile describes), got {shown(batch)}"
            )
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not share_step_pct <= share <= 100:
            raise UserError(
                f"{where}: entry {k} field 'share_pct' must be from {share_step_pct:g} (one share step of the "
                f"profile) to 100, got {shown(share)}"
            )
    total = sum(float(i["share_pct"]) for i in items)
    if total > 100 + 1e-9:
        raise UserError(f"{where}: shares add up to {total:g}% > 100%; one line is one GPU")
    return items


def run_predict(args: argparse.Namespace) -> int:
    from interference.latency import predict_gpu
    from interference.profile import UnknownModelError
    from interference.profile_io import bundled_profile

    profile = load_profile_arg(args.profile) or bundled_profile()
    text, source = read_text_input(args.cases, "cases")
    lines = text.splitlines()
    rows, out = [], []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{source}:{number}"
        items = _case_list(line, where, profile.gpu.share_step_pct)
        try:
            predictions = predict_gpu(profile, [(i["model"], int(i["batch"]), float(i["share_pct"])) for i in items])
        except (UnknownModelError, ValueError) as err:
            raise UserError(f"{where}: {err}") from None
        result = [
            dict(
                i,
                predicted_latency_ms=round(p.latency_ms, 6),
                predicted_throughput_rps=round(p.throughput_rps, 6),
                # off the shares and batches the profile measured, the fit extrapolates (the planner does not go
                # there without --allow-extrapolation)
                in_domain=profile.model(i["model"]).in_domain(int(i["batch"]), float(i["share_pct"])),
            )
            for i, p in zip(items, predictions)
        ]
        out.append(result)
        rows += [
            [
                number,
                r["model"],
                r["batch"],
                float(r["share_pct"]),
                r["predicted_latency_ms"],
                r["predicted_throughput_rps"],
                "inside" if r["in_domain"] else "OUTSIDE",
            ]
            for r in result
        ]
    if not out:
        raise UserError(f'{source}: no case; each line is one GPU, a JSON list of {{"model", "batch", "share_pct"}}')
    if args.output_format == "yaml":
        emit(args, out)
    elif args.json:
        for result in out:
            print(json.dumps(result))
    else:
        print(render_table(["gpu(line)", "model", "batch", "share_%", "infer_ms", "pred_rps", "domain"], rows))
    outside = sum(1 for result in out for r in result if not r["in_domain"])
    if outside:
        print(
            f"stoke: warning: {outside} point(s) lie outside the shares and batches the profile measured: the fit "
            "extrapolates there (`stoke profile show` lists each model's domain)",
            file=sys.stderr,
        )
    return 0


# -- simulate --------------------------------------------------------------------------------------


def run_simulate(args: argparse.Namespace) -> int:
    from interference.profile import UnknownModelError
    from planner.simulate import simulate

    plan = read_plan(args.plan)
    if not 0 < args.seconds <= MAX_SIMULATED_SECONDS:
        raise UserError(f"--seconds must be in (0, {MAX_SIMULATED_SECONDS:g}], got {args.seconds}")
    if not 0 <= args.min_requests <= MAX_MIN_REQUESTS:
        raise UserError(f"--min-requests must be in [0, {MAX_MIN_REQUESTS:,}], got {args.min_requests}")
    # each request is an event: memory and time grow with their number. A replica too slow to send
    # --min-requests in --seconds runs longer (`planner.simulate`), so it counts that many.
    rates = [p.rate_rps for _, p in plan.placements()]
    offered = sum(max(rate * args.seconds, args.min_requests) for rate in rates)
    if offered > MAX_SIMULATED_REQUESTS:
        extended = sum(1 for rate in rates if rate * args.seconds < args.min_requests)
        longer = f" ({extended} replica(s) run to --min-requests {args.min_requests:,})" if extended else ""
        raise UserError(
            f"{source_name(args.plan)}: simulating {args.seconds:g} s of the plan's {sum(rates):,.0f} req/s is "
            f"{offered:,.0f} requests{longer}, more than {MAX_SIMULATED_REQUESTS:,}; lower --seconds"
            + (" or --min-requests" if extended else "")
        )
    if not 0 <= args.noise <= 1:  # NaN fails too
        raise UserError(f"--noise must be a log-normal sigma from 0 to 1, got {args.noise}")
    if not 0 <= args.seed < 2**64:  # numpy's generator takes no negative seed
        raise UserError(f"--seed must be a whole number from 0 to 2**64 - 1, got {args.seed}")
    profiles = simulated_profiles(plan, args.profile, source_name(args.plan))
    try:
        report = simulate(
            plan,
            profiles,
            seconds=args.seconds,
            seed=args.seed,
            arrivals=args.arrivals,
            noise=args.noise,
            min_requests=args.min_requests,
        )
    except (ValueError, UnknownModelError) as err:
        raise UserError(f"{source_name(args.plan)}: {err}") from None
    if args.json:
        emit(args, report_to_dict(report))
    else:
        print(format_report(report))
    missed = [w.name for w in report.workloads if not w.meets_slo]
    if args.fail_on_miss and missed:
        print(
            f"stoke: {len(missed)} workload(s) over their SLO in simulation: {', '.join(missed[:10])}", file=sys.stderr
        )
        return EXIT_MISS
    return 0


def with_profiles(plan: Plan, gpu_types: Sequence[GpuType]) -> Plan:
    """`plan` recording the profile each of its GPU types was planned with (`Plan.profiles`)."""
    from dataclasses import replace

    from interference.profile_io import profile_digest

    used = {g.gpu_type for g in plan.gpus}
    return replace(plan, profiles=tuple((g.name, profile_digest(g.profile)) for g in gpu_types if g.name in used))


def simulated_profiles(plan: Plan, given: Sequence[str], source: str) -> dict[str, DeviceProfile]:
    """{GPU type: the profile `simulate` replays it on}: `--profile FILE` (every type) or `--profile TYPE=FILE`,
    else the bundled profile of a bundled device. A profile other than the one the plan records is refused: a
    replay on another profile reports figures the plan never promised (a plan for a slower device, replayed
    on the bundled V100, showed a p99 of 10.5 ms where it promised 26.1)."""
    from interference.profile_io import bundled_cpu_profile, bundled_profile, profile_digest

    types = sorted({g.gpu_type for g in plan.gpus})
    chosen: dict[str, tuple[DeviceProfile, str]] = {}
    for value in given:
        gpu_type, _, path = value.partition("=")
        if not path or Path(value).exists():  # FILE (a file's name may hold "=")
            gpu_type, path = "", value
        elif gpu_type not in types:
            raise UserError(
                f"--profile {shown(value)}: {source} has no GPU type {shown(gpu_type)} (its types: "
                f"{', '.join(types) or 'none'}); give --profile TYPE=FILE for one of them, or FILE for all"
            )
        profile = load_profile_arg(path)
        if profile is not None:
            for t in [gpu_type] if gpu_type else types:
                chosen[t] = (profile, f"--profile {path}")
    bundled = {p.gpu.name: p for p in (bundled_profile(), bundled_cpu_profile())}
    recorded = dict(plan.profiles)
    out: dict[str, DeviceProfile] = {}
    for t in types:
        if t not in chosen and t not in bundled:
            raise UserError(
                f"{source}: no profile for GPU type {t!r}: give the one it was planned with, --profile {t}=FILE"
            )
        profile, what = chosen.get(t) or (bundled[t], f"the bundled {t} profile")
        if t in recorded and profile_digest(profile) != recorded[t]:
            raise UserError(
                f"{source}: GPU type {t!r} was planned with another profile than {what} (the plan records "
                f"{recorded[t][:12]}..., this one is {profile_digest(profile)[:12]}...); give the one it was "
                f"planned with: --profile {t}=FILE"
            )
        out[t] = profile
    return out


#: Exit code of `plan`/`simulate --fail-on-miss` when a workload misses its SLO (2 is bad input).
EXIT_MISS = 3
MAX_SIMULATED_SECONDS = 86_400.0
MAX_MIN_REQUESTS = 10_000_000
#: The most requests `simulate` draws in one run (about 2 GB and minutes at this many; every request is an event).
MAX_SIMULATED_REQUESTS = 20_000_000


def _rounded(value: float, digits: int) -> float | None:
    """`value` rounded, or None (JSON null) where it is not a number (the quantiles of no workload): JSON has
    no NaN, and `json.dumps` would write one no parser but Python's reads."""
    return round(value, digits) if math.isfinite(value) else None


def report_to_dict(report: SimulationReport) -> dict[str, Any]:
    p10, p50, p90 = report.slack_quantiles()
    return {
        "seconds": report.seconds,
        "seed": report.seed,
        "attainment": report.attainment,
        "p99_slo_ratio": {"p10": _rounded(p10, 4), "median": _rounded(p50, 4), "p90": _rounded(p90, 4)},
        "workloads": [
            {
                "name": w.name,
                "slo_ms": w.slo_ms,
                "offered_rps": round(w.offered_rps, 3),
                "throughput_rps": round(w.throughput_rps, 3),
                "p50_ms": _rounded(w.p50_ms, 3) if w.requests else None,
                "p99_ms": _rounded(w.p99_ms, 3) if w.requests else None,
                "p99_slo_ratio": _rounded(w.p99_slo_ratio, 4) if w.requests else None,
                "over_slo": round(w.over_slo, 6),
                "requests": w.requests,
                "meets_slo": w.meets_slo,
            }
            for w in report.workloads
        ],
    }


def format_report(report: SimulationReport) -> str:
    rows = [
        [
            w.name,
            w.slo_ms,
            w.offered_rps,
            w.throughput_rps,
            *((w.p50_ms, w.p99_ms, f"{w.p99_slo_ratio:.2f}") if w.requests else ("-", "-", "-")),
            f"{100 * w.over_slo:.2f}%",
            ("ok" if w.meets_slo else "MISS") if w.requests else "no requests",
        ]
        for w in report.workloads
    ]
    table = render_table(
        ["workload", "slo_ms", "offered_rps", "served_rps", "p50_ms", "p99_ms", "p99/slo", "over_slo", "p99<=slo"], rows
    )
    head = f"simulated {report.seconds:g} s, seed {report.seed}: "
    if not report.workloads:  # an empty plan: no quantile to show, and no workload to keep within its SLO
        return f"{head}the plan places no workload\n\n{table}"
    silent = sum(1 for w in report.workloads if not w.requests)
    if silent == len(report.workloads):
        return f"{head}no workload sent a request: raise --seconds or --min-requests\n\n{table}"
    p10, p50, p90 = report.slack_quantiles()
    unmeasured = f" ({silent} sent no request: raise --seconds or --min-requests)" if silent else ""
    return (
        f"{head}{100 * report.attainment:.1f}% of workloads keep p99 within SLO{unmeasured}\n"
        f"simulated p99/SLO across workloads: p10 {p10:.2f}, median {p50:.2f}, p90 {p90:.2f} "
        f"(near 1 is a tight plan; far below 1 is a padded one)\n\n{table}"
    )


def _measurements(text: str) -> dict[str, Any] | None:
    """`stoke profile run` output (one JSON object) rather than iGniter JSON lines; None when it is not."""
    from interference.profiling import MEASUREMENTS_FORMAT

    try:
        data = inputs.load_json(text)
    except inputs.RepeatedKeyError:
        raise  # JSON, but a key given twice: refused (the caller names the file), not read as iGniter lines
    except (ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) and data.get("format") == MEASUREMENTS_FORMAT else None


def run_profile_run(args: argparse.Namespace) -> int:
    import os

    from agents.profiler import ProfilingError, run_session
    from interference.profile import DOMAIN_MAX_BATCH, MIN_SHARE_STEP_PCT, share_step_count
    from interference.profiling import ProfileSession, Stability

    try:
        batches = [int(b) for b in args.batches.split(",")]
    except ValueError:
        raise UserError(f"--batches must be comma-separated whole numbers, got {args.batches!r}") from None
    if not all(1 <= b <= DOMAIN_MAX_BATCH for b in batches):  # a profile's domain (and the planner) stops there
        raise UserError(f"--batches must be batch sizes from 1 to {DOMAIN_MAX_BATCH}, got {args.batches!r}")
    if args.device_name is not None:
        check_name(args.device_name, "--device-name", error=UserError)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    missing = [m for m in models if not (Path(args.repo) / m / "config.pbtxt").is_file()]
    if missing:
        raise UserError(
            f"{args.repo}: no model {missing[0]!r} (no {missing[0]}/config.pbtxt); pick models from the repository"
        )
    cores = len(os.sched_getaffinity(0))
    if share_step_count(100.0 / cores) is None:  # one share step per core, and a profile's step is at least 1%
        raise UserError(
            f"this process may run on {cores} cores, and a profile has at most {round(100 / MIN_SHARE_STEP_PCT)} "
            "share steps (one per core); run it on fewer cores (taskset -c 0-63 stoke profile run ...)"
        )
    output = Path(args.output)
    if output.exists():
        fix = "remove the file to start afresh"
        text = inputs.read_text(output, "measurements to resume", error=UserError, fix=fix)
        data = inputs.parse_json(text, inputs.shown_path(output), "measurements", error=UserError, fix=fix)
        try:
            session = ProfileSession.from_dict(data, inputs.shown_path(output))
        except (ValueError, TypeError, AttributeError) as err:
            raise UserError(f"{err}; {fix}") from None
        print(f"resuming {output}: {session.progress()[0]}/{session.progress()[1]} points measured")
    else:
        session = ProfileSession(
            device=args.device_name or f"cpu-{cores}core", cores=cores, models=models, batches=batches
        )
    if args.requests < 1:
        raise UserError(f"--requests must be >= 1, got {args.requests}")
    if not 0 < args.serving_rate <= 1000:
        raise UserError(f"--serving-rate must be a rate in (0, 1000] req/s, got {args.serving_rate:g}")
    if not 0.1 <= args.sli_window <= 3600:
        raise UserError(
            f"--sli-window must be a heartbeat interval in [0.1, 3600] s, got {args.sli_window:g}; "
            "pass the agents' heartbeat interval (the controller's heartbeat_interval_s)"
        )
    try:
        stability = Stability(tolerance_pct=args.stability_percentage, max_windows=args.max_windows)
    except ValueError as err:
        raise UserError(f"--stability-percentage/--max-windows: {err}") from None
    unstable: list[str] = []
    before = dict(session.retries)
    with _progress_display(session) as show:

        def progress(event: Any) -> None:
            if not event.measurement.stable:
                unstable.append(f"{event.point.key} (spread {event.measurement.spread_pct:.1f}%)")
            show(event)

        try:
            run_session(
                session,
                args.repo,
                output,
                requests=args.requests,
                stability=stability,
                progress=progress,
                serving_rate_rps=args.serving_rate,
                sli_window_s=args.sli_window,
                on_serving=lambda model, ms, beyond: print(
                    f"{model}: serving path p99 {ms + beyond:.2f} ms (through the router at {args.serving_rate:g} "
                    f"req/s; {ms:.2f} ms seen by the SLI's {args.sli_window:g} s windows, {beyond:.2f} ms beyond them)",
                    flush=True,
                ),
            )
        except ProfilingError as err:
            done, total = session.progress()
            raise UserError(
                f"{output}: profiling stopped at {done}/{total} points: {err}; "
                f"fix it and run the same command again to resume"
            ) from None
    if unstable:
        print(
            f"warning: {len(unstable)} point(s) never stabilised within {stability.tolerance_pct:g}% in "
            f"{stability.max_windows} windows: {', '.join(unstable)}; the machine is busy or the point is noisy"
        )
    remeasured = sorted(k for k, n in session.retries.items() if n > before.get(k, 0))
    if remeasured:
        print(f"re-measured {len(remeasured)} non-monotone point(s): {', '.join(remeasured)}")
    for key, why in sorted(session.rejected().items()):
        print(f"rejected {key}: {why}; `profile fit` leaves it out")
    print(f"measurements written to {output}; fit them with `stoke profile fit {output} -o PROFILE.json`")
    return 0


@contextmanager
def _progress_display(session: ProfileSession) -> Iterator[Callable[[Any], None]]:
    """A rich progress bar with the ETA on a terminal; one plain line per point (with the ETA) otherwise."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    console = Console()
    if not console.is_terminal:
        yield lambda event: print(event.line(), flush=True)
        return
    done, total = session.progress()
    with Progress(
        TextColumn("profiling"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=console,
        transient=False,
    ) as bar:
        task = bar.add_task("profile", total=total, completed=done)

        def show(event: Any) -> None:
            bar.console.print(event.line().split(", ETA")[0], highlight=False)
            bar.update(task, completed=event.done)

        yield show


# -- profile show ----------------------------------------------------------------------------------


def profile_domain_dict(profile: DeviceProfile) -> dict[str, Any]:
    from interference.profile import DEFAULT_FIT_ERROR, UNMEASURED_ERROR

    models: dict[str, Any] = {}
    for name, m in sorted(profile.models.items()):
        d = m.domain
        # unmeasured_error: added to the bound at every point the fit did not measure
        models[name] = {
            "serving_p99_ms": m.serving_p99_ms,
            "beyond_sli_p99_ms": m.beyond_sli_p99_ms,
            "unmeasured_error": UNMEASURED_ERROR,
        } | (
            {"recorded": False, "default_error": DEFAULT_FIT_ERROR}
            if d is None
            else {
                "recorded": True,
                "batches": list(d.batches),
                "shares_pct": list(d.shares),
                "loo_error_p90": round(d.quantile(0.9), 6),
                "loo_error_max": round(d.quantile(1.0), 6),
                "error_floor": d.floor,
                # the table's `unmeasured`: the least bound off the measured points (floor + unmeasured_error)
                "unmeasured_bound": round(d.floor + UNMEASURED_ERROR, 6),
                "loo_error": [list(row) for row in d.error],
            }
        )
    return {"gpu": profile.gpu.name, "share_step_pct": profile.gpu.share_step_pct, "models": models}


def run_profile_show(args: argparse.Namespace) -> int:
    from interference.profile import DEFAULT_FIT_ERROR, UNMEASURED_ERROR
    from interference.profile_io import bundled_profile

    def serving(m: Any) -> str:  # the serving path outside the batch, added to every p99 the planner predicts
        return f"{m.serving_p99_ms:.2f}" if m.serving_p99_ms > 0 else "0 (not measured)"

    def beyond(m: Any) -> str:  # what clients see beyond the SLI windows, added too (0: measured before it)
        return f"{m.beyond_sli_p99_ms:.2f}"

    profile = load_profile_arg(args.profile) or bundled_profile()
    if args.json:
        emit(args, profile_domain_dict(profile))
        return 0
    rows = []
    for name, m in sorted(profile.models.items()):
        d = m.domain
        if d is None:
            default = f"{DEFAULT_FIT_ERROR:.1%} (default)"
            rows.append([name, "not recorded", "not recorded", default, "-", "-", default, serving(m), beyond(m)])
            continue
        rows.append(
            [
                name,
                ",".join(str(b) for b in d.batches),
                ",".join(f"{r:g}" for r in d.shares),
                f"{d.quantile(0.9):.1%}",
                f"{d.quantile(1.0):.1%}",
                f"{d.floor:.1%}",
                f"{d.floor + UNMEASURED_ERROR:.1%}",
                serving(m),
                beyond(m),
            ]
        )
    print(f"{profile.gpu.name} (share step {profile.gpu.share_step_pct:g}%)")
    columns = ["model", "batches", "shares_%", "LOO_err_p90", "LOO_err_max", "floor", "unmeasured"]
    columns += ["serving_p99_ms", "beyond_sli_ms"]
    print(render_table(columns, rows))
    if getattr(args, "output_format", "table") == "wide":
        print()
        print(
            render_table(
                ["model", "batch", "share_%", "LOO_err"],
                [
                    [name, b, f"{r:g}", f"{m.domain.error[i][j]:.1%}"]
                    for name, m in sorted(profile.models.items())
                    if m.domain is not None
                    for i, b in enumerate(m.domain.batches)
                    for j, r in enumerate(m.domain.shares)
                ],
            )
        )
    print(
        f"unmeasured: the least bound off the measured points: leave-one-out error there (>= floor) + "
        f"{UNMEASURED_ERROR:.0%} (tile steps, scatter the points cannot show); `stoke profile verify` measures"
    )
    if any(m.domain is None for m in profile.models.values()):
        print(
            f"note: models without a recorded domain were fitted before stoke recorded it: the planner treats "
            f"every point as measured at a {DEFAULT_FIT_ERROR:.0%} error, less than a refit's bound off its "
            f"measured points; refit with `stoke profile fit`"
        )
    return 0


# -- profile verify --------------------------------------------------------------------------------


def run_profile_verify(args: argparse.Namespace) -> int:
    from foundation.files import atomic_write_text
    from interference.profile_io import ProfileFileError, bundled_raw_path, load_profile, save_profile
    from interference.profile_io import read_raw as read_raw_file
    from interference.truth import measure_on, truth_profile
    from planner.solver import GpuType, Problem, ProblemError, Workload, plan_to_dict
    from planner.solver.verify import verify
    from planner.workload_file import default_gpu_types

    if args.plan_out and args.profile_out and Path(args.plan_out).resolve() == Path(args.profile_out).resolve():
        raise UserError(f"--plan-out and --profile-out both name {args.plan_out}; give two files")
    for flag, out in (("--plan-out", args.plan_out), ("--profile-out", args.profile_out)):
        if out and args.plan != "-" and Path(out).resolve() == Path(args.plan).resolve():
            raise UserError(f"{flag} {out} is the plan being verified; write to another file (it would be replaced)")
        if out in FORMATS:  # `--plan-out json` meant the format: a file named json is written
            raise UserError(
                f"{flag} {out}: {out!r} is an output format here; give a file (./{out} for one of that name)"
            )
    plan = read_plan(args.plan)
    if not plan.gpus:
        raise UserError(f"{args.plan}: the plan places no workload; nothing to verify")
    rates: dict[str, float] = {}
    first: dict[str, Any] = {}
    for _, p in plan.placements():
        rates[p.name] = rates.get(p.name, 0.0) + p.rate_rps
        first.setdefault(p.name, p)
    try:
        workloads = tuple(
            Workload(n, p.model, p.slo_ms, rates[n], arrivals=p.arrivals) for n, p in sorted(first.items())
        )
        if args.device == "simulated":
            types = default_gpu_types()
            unknown = sorted({g.gpu_type for g in plan.gpus} - {t.name for t in types})
            if unknown:
                raise UserError(f"{args.plan}: GPU type {unknown[0]!r} has no simulated device; plan for V100")
            truth = {t.name: truth_profile(t.profile, read_raw_file(bundled_raw_path())) for t in types}
            measure: Any = measure_on(truth)
        else:
            kinds = sorted({g.gpu_type for g in plan.gpus})
            if len(kinds) != 1:
                raise UserError(f"{args.plan}: --device cpu verifies a plan of one device type, got {kinds}")
            from interference.profile_io import BUNDLED_CPU_PROFILE, bundled_data_dir

            profile_path = args.profile or bundled_data_dir() / BUNDLED_CPU_PROFILE
            profile = load_profile(profile_path)
            unknown = sorted({p.model for _, p in plan.placements()} - set(profile.models))
            if unknown:
                raise UserError(
                    f"{args.plan}: a plan for {kinds[0]} serving {unknown[0]!r}, which the CPU profile {profile_path} "
                    f"does not hold; --device cpu verifies a plan made with that profile (`stoke plan --profile "
                    f"{profile_path} --json`)"
                )
            types = (GpuType(kinds[0], plan.gpus[0].price_per_hour, profile),)
            _same_profiles(plan, types, args)  # before the measurer prepares its Triton folder
            from agents.profiler import ProfilingError, TritonMeasurer

            try:
                measure = TritonMeasurer(args.repo, requests=args.requests)
            except ProfilingError as err:
                raise UserError(f"--device cpu: {err}") from None
        if args.device == "simulated":
            _same_profiles(plan, types, args)
        problem = Problem(workloads, types)

        def progress(done: Any) -> None:
            print(
                f"round {done.number}: measured {done.measured} point(s) (worst measured/fitted "
                f"{done.worst_ratio:.3f}); re-planned: {done.gpus_before} -> {done.gpus_after} GPU(s)",
                flush=True,
            )

        try:
            checked = verify(
                problem, measure, plan=plan, max_rounds=args.rounds, progress=progress, neighbours=args.neighbours
            )
        finally:
            if hasattr(measure, "close"):
                measure.close()
    except ProblemError as err:
        raise UserError(f"{args.plan}: {err}") from None
    except ProfileFileError as err:
        raise UserError(str(err)) from None
    except StokeError as err:  # the device failed to measure (ProfilingError)
        raise UserError(f"--device {args.device}: {err}") from None
    if args.plan_out:
        with writing(args.plan_out, "verified plan"):
            verified = with_profiles(checked.plan, checked.problem.inventory)  # the profile --profile-out writes
            atomic_write_text(args.plan_out, json.dumps(plan_to_dict(verified), indent=2) + "\n")
    if args.profile_out:
        with writing(args.profile_out, "profile"):
            save_profile(checked.problem.inventory[0].profile, args.profile_out)
    status = "holds on measured points" if checked.holds else "still uses unmeasured points"
    print(
        f"verified in {len(checked.rounds)} round(s), {checked.points} point(s) measured: "
        f"{checked.plan.gpu_count} GPU(s), the plan {status}"
    )
    return 0 if checked.holds else 1


def _same_profiles(plan: Plan, types: Sequence[GpuType], args: argparse.Namespace) -> None:
    """Verification re-plans on `types`' profiles: a plan that records another profile (`stoke plan --json`) is
    refused, as `simulate` refuses it, rather than re-planned on a device it was not made for."""
    from interference.profile_io import profile_digest

    recorded = dict(plan.profiles)
    for t in types:
        if t.name in recorded and profile_digest(t.profile) != recorded[t.name]:
            where = "the simulated device's (the bundled V100 profile)" if args.device == "simulated" else "--profile's"
            raise UserError(
                f"{args.plan}: GPU type {t.name!r} was planned with another profile than {where}; verify a plan made "
                "with it (`stoke plan --json`)"
                + (", or give the plan's profile with --profile" if args.device != "simulated" else "")
            )


# -- profile fit -----------------------------------------------------------------------------------

DEFAULT_MAX_MAPE = 25.0


def fit_failures(reports: dict[str, FitReport], max_mape: float) -> list[str]:
    """Why the fitted profile is not usable, one reason per line (empty when it is)."""
    out = [f"{name}: {problem}" for name, r in sorted(reports.items()) for problem in r.problems]
    out += [
        f"{name}: the fit misses its points by {r.mape_pct:.1f}% on average (MAPE), more than --max-mape {max_mape:g}%"
        for name, r in sorted(reports.items())
        if r.mape_pct > max_mape
    ]
    return out


def _report_dict(r: FitReport) -> dict[str, Any]:
    return {
        "mape_pct": round(r.mape_pct, 3),
        "r2": None if r.r2 != r.r2 else round(r.r2, 5),
        "at_bounds": list(r.at_bounds),
        "problems": list(r.problems),
        "excluded": list(r.excluded),
        "points": [
            {
                "batch": p.batch,
                "share_pct": p.share_pct,
                "measured_ms": round(p.measured_ms, 5),
                "fitted_ms": round(p.fitted_ms, 5),
                "error_pct": round(p.error_pct, 3),
            }
            for p in r.points
        ],
    }


def _coefficient(value: float) -> str:
    """A fitted coefficient in a table: 4 significant figures (a table's 2 decimals would show 0.0024 as 0.00)."""
    return f"{value:.4g}"


def run_profile_fit(args: argparse.Namespace) -> int:
    # the fit is a scikit-learn estimator over scipy: imported here, not when `stoke --help` loads this module
    from interference.fit import InterferenceModel, RawProfileError, fit_measured
    from interference.profile_io import ProfileFileError, parse_raw, profile_from_dict, profile_to_dict, save_profile
    from interference.profiling import ProfileSession

    if not args.max_mape > 0:
        raise UserError(f"--max-mape must be a positive percentage, got {args.max_mape:g}")
    check_name(args.gpu_name, "--gpu-name", error=UserError)  # profiles hold a GPU type name (the one name rule)
    if args.raw != "-" and Path(args.raw).resolve() == Path(args.output).resolve():
        raise UserError(f"-o {args.output} is the measurements file itself; write the profile to another file")
    text, source = read_text_input(args.raw, "raw profile")
    try:
        if (measurements := _measurements(text)) is not None:
            profile, reports = fit_measured(ProfileSession.from_dict(measurements, source))
        else:
            model = InterferenceModel(gpu_name=args.gpu_name).fit(parse_raw(text, source))
            profile, reports = model.profile_, model.reports_
    except (ProfileFileError, RawProfileError, ValueError, TypeError, AttributeError) as err:
        message = str(err)
        raise UserError(message if message.startswith(source) else f"{source}: {message}") from None
    failures = fit_failures(reports, args.max_mape)
    written = not failures or args.force
    unloadable = ""
    if written:
        try:  # what is written must load: even --force does not write what every reader would refuse
            profile_from_dict(json.loads(json.dumps(profile_to_dict(profile))), "the fitted profile")
        except ProfileFileError as err:
            unloadable, written = str(err), False
    if written:
        with writing(args.output, "fitted profile"):
            save_profile(profile, args.output)
    if args.json:
        emit(
            args,
            {
                "output": args.output,
                "written": written,
                "failures": failures,
                "models": {n: _report_dict(r) for n, r in sorted(reports.items())},
            },
        )
    else:
        rows = [
            [name, m.kernels, *[_coefficient(k) for k in m.k_act], _coefficient(m.cache_sensitivity)]
            for name, m in sorted(profile.models.items())
        ]
        print(render_table(["model", "kernels", "k1", "k2", "k3", "k4", "k5", "alpha_cache"], rows))
        print()
        print(
            render_table(
                ["model", "batch", "share_%", "measured_ms", "fitted_ms", "error_%"],
                [
                    [
                        name,
                        p.batch,
                        f"{p.share_pct:g}",
                        f"{p.measured_ms:.4g}",
                        f"{p.fitted_ms:.4g}",
                        f"{p.error_pct:+.1f}",
                    ]
                    for name, r in sorted(reports.items())
                    for p in r.points
                ],
            )
        )
        print()
        print(
            render_table(
                ["model", "points", "MAPE_%", "R2", "worst_%", "check"],
                [
                    [
                        name,
                        len(r.points),
                        f"{r.mape_pct:.2f}",
                        "-" if r.r2 != r.r2 else f"{r.r2:.4f}",
                        f"{max(abs(p.error_pct) for p in r.points):.1f}",
                        "ok" if r.ok and r.mape_pct <= args.max_mape else "FAILED",
                    ]
                    for name, r in sorted(reports.items())
                ],
            )
        )
        for name, r in sorted(reports.items()):
            for bound in r.at_bounds:
                print(f"note: {name}: {bound}: the measurements do not pin it down (more batches or shares would)")
        excluded = [line for r in reports.values() for line in r.excluded]
        if excluded:
            print(
                f"note: {len(excluded)} non-monotone point(s) left out of the fit. On a CPU node a share is whole "
                f"cores, one model instance each, and a batch runs on one core: a bigger share adds throughput, "
                f"not speed, and where its cores also run the load it is slower. That is contention, not the "
                f"model (the slower point of each disagreeing pair is left out):"
            )
            for line in excluded:
                print(f"  {line}")
        if written:
            print(
                f"fitted {profile.gpu.name}: {len(profile.models)} model(s) ({', '.join(sorted(profile.models))}) "
                f"-> {args.output}" + (" (written despite failed checks: --force)" if failures else "")
            )
    if unloadable:
        print(
            f"stoke: error: {args.raw}: {unloadable}; {args.output} not written, not even with --force: no reader "
            f"would load it; re-measure (e.g. `stoke profile run` with more --requests or batches)",
            file=sys.stderr,
        )
        return 1
    if failures and not args.force:
        print(
            f"stoke: error: {args.raw}: the fitted profile is not usable, {args.output} not written: "
            f"{'; '.join(failures)}; re-measure (e.g. `stoke profile run` with more --requests or batches) "
            f"or write it anyway with --force",
            file=sys.stderr,
        )
        return 1
    return 0
