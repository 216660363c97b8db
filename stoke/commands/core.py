"""Core commands: plan, predict, simulate, profile fit."""
from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from controller.simulate import SimulationReport, simulate
from controller.solver.stoke import StokeOptions
from controller.solver import STRATEGIES, Plan, ProblemError, plan_to_dict, solve
from controller.workload_file import WorkloadFileError, WorkloadsFile, default_gpu_types, load_workloads_file
from interference.fit import InterferenceModel, RawProfileError, fit_measured_profile
from interference.latency import predict_gpu
from interference.profile import DeviceProfile, UnknownModelError
from interference.profiling import MEASUREMENTS_FORMAT, ProfileSession
from interference.profile_io import ProfileFileError, bundled_profile, load_profile, read_raw, save_profile
from stoke.commands.inputs import read_plan
from stoke.errors import UserError
from stoke.table import render_table


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "plan", help="place workloads on GPUs: shares, batches, predicted latency, cost",
        description="Plan GPU shares and batch sizes for the workloads in WORKLOADS.yaml (default: a bundled "
                    "example of eight services on V100s) and print the plan.")
    p.add_argument("workloads", nargs="?", metavar="WORKLOADS.yaml",
                   help="workload file (see controller/workload_file.py for the format); default: bundled example")
    p.add_argument("--strategy", choices=STRATEGIES, default="stoke",
                   help="stoke (default: ours), igniter (published heuristic, flaws fixed), ffd (naive baseline)")
    p.add_argument("--profile", metavar="FILE", help="fitted profile JSON to use for every GPU type")
    p.add_argument("--safety-margin", type=float, metavar="M",
                   help="stoke: share of each SLO kept free for model error and jitter (default 0.10)")
    p.add_argument("--max-utilisation", type=float, metavar="U",
                   help="stoke: highest planned utilisation of a replica, rate/throughput (default 0.90)")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.add_argument("--plot", metavar="FILE.png", help="also draw shares per GPU and predicted latency vs SLO")
    p.add_argument("--remote", action="store_true", help="ask a running controller for its current plan")
    p.add_argument("--controller", metavar="HOST:PORT", default="127.0.0.1:50051", help="controller address (--remote)")
    p.add_argument("--token-file", metavar="FILE", help="bearer token file for the controller (--remote)")
    p.set_defaults(run=run_plan)

    p = subparsers.add_parser(
        "predict", help="predict latency/throughput of co-located models on one GPU",
        description="Each line of CASES.jsonl is one GPU: a JSON list of {\"model\", \"batch\", \"share_pct\"}. "
                    "Each output line is the same list with predicted_latency_ms and predicted_throughput_rps.")
    p.add_argument("--profile", metavar="FILE", help="fitted profile JSON (default: bundled V100)")
    p.add_argument("--cases", metavar="CASES.jsonl", required=True, help="one GPU configuration per line")
    p.add_argument("--json", action="store_true", help="JSON lines out (default: a table)")
    p.set_defaults(run=run_predict)

    p = subparsers.add_parser(
        "simulate", help="replay a plan in a discrete-event simulator",
        description="Replay PLAN.json (from `stoke plan --json`) with Poisson (or constant) arrivals and "
                    "Triton-style dynamic batching; report p50/p99 latency, share over SLO, throughput.")
    p.add_argument("plan", metavar="PLAN.json")
    p.add_argument("--seconds", type=float, default=30.0, help="simulated seconds (default 30)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--arrivals", choices=("poisson", "constant"), default=None,
                   help="override every workload's arrival kind (default: each workload's own, from the plan)")
    p.add_argument("--noise", type=float, default=0.0,
                   help="log-normal sigma of multiplicative service-time noise (default 0)")
    p.add_argument("--profile", metavar="FILE", help="fitted profile JSON for every GPU type (default: bundled V100)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=run_simulate)

    p = subparsers.add_parser("profile", help="fit profiles from raw measurements")
    profile = p.add_subparsers(dest="profile_command", metavar="COMMAND", required=True)
    f = profile.add_parser("fit", help="fit a GPU-type profile from raw measurements (JSON lines)",
                           description="Fit the interference model from raw profile measurements in the published "
                                       "iGniter JSON-lines layout and write the fitted profile (JSON, versioned).")
    f.add_argument("raw", metavar="RAW.jsonl")
    f.add_argument("-o", "--output", metavar="PROFILE.json", required=True)
    f.add_argument("--gpu-name", default="V100", help="GPU type name stored in the profile (default V100)")
    f.set_defaults(run=run_profile_fit)
    r = profile.add_parser(
        "run", help="measure models on this node's Triton (CPU) and write measurements for `profile fit`",
        description="Profile models served by real Triton processes on this machine: latency at every batch in "
                    "--batches and every whole-core share, plus one co-location point per model. Progress is "
                    "checkpointed to OUTPUT after every point; run again with the same OUTPUT to resume.")
    r.add_argument("--repo", default="triton_repo", help="model repository (default: triton_repo)")
    r.add_argument("--models", default="mlp_small,conv_medium,embed_large",
                   help="comma-separated models (default: the three demo models)")
    r.add_argument("--batches", default="1,8,16,32", help="batch sizes (default 1,8,16,32)")
    r.add_argument("--requests", type=int, default=20, help="requests per point (median taken; default 20)")
    r.add_argument("--device-name", default=None, help="device type name (default cpu-<N>core)")
    r.add_argument("-o", "--output", metavar="MEASUREMENTS.json", required=True)
    r.set_defaults(run=run_profile_run)


# -- plan ------------------------------------------------------------------------------------------

def _load_profile_arg(path: str | None) -> DeviceProfile | None:
    if path is None:
        return None
    try:
        return load_profile(path)
    except ProfileFileError as err:
        raise UserError(str(err)) from None


def load_problem(path: str | None, profile_path: str | None) -> WorkloadsFile:
    try:
        workloads_file = load_workloads_file(path)
    except WorkloadFileError as err:
        raise UserError(str(err)) from None
    profile = _load_profile_arg(profile_path)
    if profile is not None:
        workloads_file = WorkloadsFile(workloads_file.workloads, tuple(
            replace(g, profile=profile) for g in workloads_file.gpu_types))
        try:
            workloads_file.problem()
        except ProblemError as err:
            raise UserError(f"{profile_path}: {err}") from None
    return workloads_file


def run_plan(args: argparse.Namespace) -> int:
    if args.remote:
        from stoke.commands.control import remote_plan
        return remote_plan(args)
    source = args.workloads or "the bundled example workloads"
    workloads_file = load_problem(args.workloads, args.profile)
    options = None
    if args.safety_margin is not None or args.max_utilisation is not None:
        if args.strategy != "stoke":
            raise UserError("--safety-margin and --max-utilisation tune the stoke strategy; drop them or use "
                            "--strategy stoke")
        try:
            options = StokeOptions(**{k: v for k, v in (("safety_margin", args.safety_margin),
                                                        ("max_utilisation", args.max_utilisation)) if v is not None})
        except ProblemError as err:
            raise UserError(f"--safety-margin/--max-utilisation: {err}") from None
    try:
        plan = solve(workloads_file.problem(), args.strategy, options=options)
    except ProblemError as err:
        raise UserError(f"{source}: {err}") from None
    if args.json:
        print(json.dumps(plan_to_dict(plan), indent=2))
    else:
        print(format_plan(plan))
    if args.plot:
        from stoke.plots import plot_plan
        plot_plan(plan, args.plot)
        if not args.json:
            print(f"\nplot written to {args.plot}")
    return 0


def format_plan(plan: Plan) -> str:
    types = sorted({g.gpu_type for g in plan.gpus})
    head = (f"strategy {plan.strategy}: {plan.gpu_count} GPU(s) ({', '.join(types)}), "
            f"${plan.cost_per_hour:,.2f}/hour")
    rows = []
    for index, gpu in enumerate(plan.gpus):
        for p in gpu.placements:
            replica = f"{p.replica + 1}/{p.replicas}" if p.replicas > 1 else ""
            rows.append([index, gpu.gpu_type, p.name, replica, p.model, p.slo_ms, p.rate_rps, p.share_pct, p.batch,
                         p.queue_delay_ms, p.predicted_latency_ms, p.predicted_throughput_rps,
                         "ok" if p.meets_slo else "MISS"])
    table = render_table(["gpu", "type", "workload", "replica", "model", "slo_ms", "rate_rps", "share_%", "batch",
                          "queue_ms", "pred_ms", "pred_rps", "slo"], rows)
    lines = [head, "", table]
    per_gpu = ", ".join(f"{i}: {g.share_pct:g}%" for i, g in enumerate(plan.gpus))
    lines += ["", f"GPU shares in use: {per_gpu}"]
    if plan.slo_misses:
        lines.append(f"predicted to miss their SLO: {', '.join(plan.slo_misses)}")
    lines += [f"note: {n}" for n in plan.notes]
    lines.append("pred_ms is one batch's co-located inference latency; a request also waits up to queue_ms "
                 "for its batch to fill.")
    return "\n".join(lines)


# -- predict ---------------------------------------------------------------------------------------

def _case_list(line: str, where: str) -> list[dict[str, Any]]:
    try:
        items = json.loads(line)
    except json.JSONDecodeError as err:
        raise UserError(f"{where}: not valid JSON ({err.msg}); each line must be a JSON list of "
                        f"{{\"model\", \"batch\", \"share_pct\"}}") from None
    if not isinstance(items, list) or not items:
        raise UserError(f"{where}: each line must be a non-empty JSON list of {{\"model\", \"batch\", \"share_pct\"}}")
    for k, item in enumerate(items):
        if not isinstance(item, dict):
            raise UserError(f"{where}: entry {k} must be an object with model, batch, share_pct")
        for field in ("model", "batch", "share_pct"):
            if field not in item:
                raise UserError(f"{where}: entry {k} lacks field {field!r}; add it")
        batch, share = item["batch"], item["share_pct"]
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise UserError(f"{where}: entry {k} field 'batch' must be a whole number >= 1, got {batch!r}")
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share <= 100:
            raise UserError(f"{where}: entry {k} field 'share_pct' must be in (0, 100], got {share!r}")
    total = sum(float(i["share_pct"]) for i in items)
    if total > 100 + 1e-9:
        raise UserError(f"{where}: shares add up to {total:g}% > 100%; one line is one GPU")
    return items


def run_predict(args: argparse.Namespace) -> int:
    profile = _load_profile_arg(args.profile) or bundled_profile()
    try:
        lines = Path(args.cases).read_text().splitlines()
    except OSError as err:
        raise UserError(f"{args.cases}: cannot read cases ({err.strerror})") from None
    rows, out = [], []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{args.cases}:{number}"
        items = _case_list(line, where)
        try:
            predictions = predict_gpu(profile, [(i["model"], int(i["batch"]), float(i["share_pct"])) for i in items])
        except (UnknownModelError, ValueError) as err:
            raise UserError(f"{where}: {err}") from None
        result = [dict(i, predicted_latency_ms=round(p.latency_ms, 6),
                       predicted_throughput_rps=round(p.throughput_rps, 6)) for i, p in zip(items, predictions)]
        out.append(result)
        rows += [[number, r["model"], r["batch"], float(r["share_pct"]), r["predicted_latency_ms"],
                  r["predicted_throughput_rps"]] for r in result]
    if args.json:
        for result in out:
            print(json.dumps(result))
    else:
        print(render_table(["gpu(line)", "model", "batch", "share_%", "pred_ms", "pred_rps"], rows))
    return 0


# -- simulate --------------------------------------------------------------------------------------

def run_simulate(args: argparse.Namespace) -> int:
    plan = read_plan(args.plan)
    if args.seconds <= 0:
        raise UserError(f"--seconds must be > 0, got {args.seconds}")
    profile = _load_profile_arg(args.profile)
    profiles = {g.name: g.profile for g in default_gpu_types()}
    if profile is not None:
        profiles = {g.gpu_type: profile for g in plan.gpus}
    try:
        report = simulate(plan, profiles, seconds=args.seconds, seed=args.seed,
                          arrivals=args.arrivals, noise=args.noise)
    except (ValueError, UnknownModelError) as err:
        raise UserError(f"{args.plan}: {err}") from None
    if args.json:
        print(json.dumps(report_to_dict(report), indent=2))
    else:
        print(format_report(report))
    return 0


def report_to_dict(report: SimulationReport) -> dict[str, Any]:
    return {"seconds": report.seconds, "seed": report.seed, "attainment": report.attainment,
            "workloads": [{"name": w.name, "slo_ms": w.slo_ms, "offered_rps": round(w.offered_rps, 3),
                           "throughput_rps": round(w.throughput_rps, 3), "p50_ms": round(w.p50_ms, 3),
                           "p99_ms": round(w.p99_ms, 3), "over_slo": round(w.over_slo, 6),
                           "requests": w.requests, "meets_slo": w.meets_slo} for w in report.workloads]}


def format_report(report: SimulationReport) -> str:
    rows = [[w.name, w.slo_ms, w.offered_rps, w.throughput_rps, w.p50_ms, w.p99_ms, f"{100 * w.over_slo:.2f}%",
             "ok" if w.meets_slo else "MISS"] for w in report.workloads]
    table = render_table(["workload", "slo_ms", "offered_rps", "served_rps", "p50_ms", "p99_ms", "over_slo",
                          "p99<=slo"], rows)
    return (f"simulated {report.seconds:g} s, seed {report.seed}: {100 * report.attainment:.1f}% of workloads "
            f"keep p99 within SLO\n\n{table}")


def _is_measurements(path: str) -> bool:
    """`stoke profile run` output (one JSON object) rather than iGniter JSON lines."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and data.get("format") == MEASUREMENTS_FORMAT


def run_profile_run(args: argparse.Namespace) -> int:
    import os

    from agents.profiler import ProfilingError, run_session
    try:
        batches = [int(b) for b in args.batches.split(",")]
    except ValueError:
        raise UserError(f"--batches must be comma-separated whole numbers, got {args.batches!r}") from None
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    missing = [m for m in models if not (Path(args.repo) / m / "config.pbtxt").is_file()]
    if missing:
        raise UserError(f"{args.repo}: no model {missing[0]!r} (no {missing[0]}/config.pbtxt); "
                        f"pick models from the repository")
    cores = len(os.sched_getaffinity(0))
    output = Path(args.output)
    if output.exists():
        try:
            session = ProfileSession.from_dict(json.loads(output.read_text()), str(output))
        except ValueError as err:
            raise UserError(f"{err}; remove the file to start afresh") from None
        print(f"resuming {output}: {session.progress()[0]}/{session.progress()[1]} points measured")
    else:
        session = ProfileSession(device=args.device_name or f"cpu-{cores}core", cores=cores, models=models,
                                 batches=batches)
    try:
        run_session(session, args.repo, output, requests=args.requests)
    except ProfilingError as err:
        done, total = session.progress()
        raise UserError(f"{output}: profiling stopped at {done}/{total} points: {err}; "
                        f"fix it and run the same command again to resume") from None
    print(f"measurements written to {output}; fit them with `stoke profile fit {output} -o PROFILE.json`")
    return 0


# -- profile fit -----------------------------------------------------------------------------------

def run_profile_fit(args: argparse.Namespace) -> int:
    try:
        if _is_measurements(args.raw):
            profile = fit_measured_profile(ProfileSession.from_dict(json.loads(Path(args.raw).read_text()), args.raw))
        else:
            profile = InterferenceModel(gpu_name=args.gpu_name).fit(read_raw(args.raw)).profile_
    except (ProfileFileError, RawProfileError, ValueError) as err:
        message = str(err)
        raise UserError(message if message.startswith(args.raw) else f"{args.raw}: {message}") from None
    save_profile(profile, args.output)
    print(f"fitted {profile.gpu.name}: {len(profile.models)} model(s) ({', '.join(sorted(profile.models))}) "
          f"-> {args.output}")
    rows = [[name, m.kernels, *[round(k, 4) for k in m.k_act], round(m.cache_sensitivity, 5)]
            for name, m in sorted(profile.models.items())]
    print(render_table(["model", "kernels", "k1", "k2", "k3", "k4", "k5", "alpha_cache"], rows))
    return 0
