"""`stoke triton render|up|sync`: a plan on a real Triton server (`stoke load` is in `stoke.commands.load`)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from foundation import inputs
from foundation import validate as check
from foundation.errors import UserError
from foundation.names import shown
from stoke.commands.daemons import interrupt_on_signals
from stoke.commands.inputs import add_repo_option, check_repo_dir, read_plan
from stoke.output import add_output_option, emit
from stoke.table import print_table


def _check_repo(repo: str, flag: str = "--repo") -> None:
    check_repo_dir(repo, "give a directory holding <model>/config.pbtxt (e.g. triton_repo)", flag=flag)


# --------------------------------------------------------------------------- render


def cmd_render(args: argparse.Namespace) -> int:
    from controller.render import config_diff
    from controller.render_plan import plan_configs, render_plan

    _check_repo(args.repo)
    plan = read_plan(args.plan)
    cpu_types = sorted({g.gpu_type for g in plan.gpus if "cpu" in g.gpu_type.lower()})
    if args.device_kind == "gpu" and cpu_types:  # as the controller's default gpu_types match device names
        print(
            f"stoke: warning: the plan's {', '.join(cpu_types)} looks like a CPU device type, and the configs are "
            "rendered KIND_GPU; give --device-kind cpu if it is",
            file=sys.stderr,
        )
    if args.dry_run:
        configs = plan_configs(plan, args.repo, args.device_kind, latency_histogram=args.latency_histogram)
        diffs = {path: diff for path, config in configs.items() if (diff := config_diff(path, config))}
        if args.json:
            emit(args, {"dry_run": True, "would_change": list(diffs), "diff": diffs})
        else:
            for diff in diffs.values():
                print(diff, end="")
            print(
                f"dry run: {len(diffs)} of {len(configs)} config(s) would change; nothing written"
                if diffs
                else f"{args.repo}: every config already matches the plan; nothing would change"
            )
        return 0
    changed = render_plan(plan, args.repo, args.device_kind, latency_histogram=args.latency_histogram)
    if args.json:
        emit(args, {"changed": changed})
    elif changed:
        print_table(["written"], [[p] for p in changed])
    else:
        print(f"{args.repo}: every config already matches the plan; nothing written")
    return 0


# --------------------------------------------------------------------------- up


def _default_assignments(repo: str) -> list[Any]:
    """Without a plan: every model of a local repository, whole machine, its base batch."""
    from controller.messages import ModelAssignment
    from controller.render import CONFIG_NAME, read_config

    if "://" in repo:
        raise UserError(f"--repo {repo}: a remote repository needs --plan PLAN.json naming the models to serve")
    out = []
    for path in sorted(Path(repo).glob(f"*/{CONFIG_NAME}")):
        base = read_config(path)
        batch = max(1, base.max_batch_size)
        delay_ms = base.dynamic_batching.max_queue_delay_microseconds / 1000.0
        out.append(
            ModelAssignment(
                workload=path.parent.name,
                model=path.parent.name,
                device=0,
                share_pct=100.0,
                batch=batch,
                queue_delay_ms=delay_ms,
                slo_ms=100.0,
                rate_rps=1.0,
            )
        )
    if not out:
        raise UserError(f"--repo {repo}: no <model>/{CONFIG_NAME} found; point --repo at a model repository")
    return out


def _node_devices(device_kind: str) -> tuple[int, list[int]]:
    """(devices, CPU cores) of this machine: a CPU node is one device of its usable cores; GPUs through NVML."""
    cores = sorted(os.sched_getaffinity(0))
    if device_kind == "cpu":
        return 1, cores
    from agents.device import DeviceError, open_device

    try:
        device = open_device("nvml")
        try:
            return len(device.describe()), cores
        finally:
            device.close()
    except DeviceError as err:
        raise UserError(
            f"--device-kind gpu: cannot count this node's GPUs ({err}); use --device-kind cpu on a machine without GPUs"
        ) from None


def _refuse_overcommit(args: argparse.Namespace, assignments: list[Any]) -> None:
    """A plan bigger than this node would share cores (or GPU shares) silently: refuse it."""
    from agents.triton import overcommit_problems

    devices, cores = _node_devices(args.device_kind)
    problems = overcommit_problems(assignments, device_kind=args.device_kind, devices=devices, cores=cores)
    if problems:
        raise UserError(
            f"--plan {args.plan}: does not fit this node: {'; '.join(problems)}; serving it would pin "
            f"several assignments to the same {'cores' if args.device_kind == 'cpu' else 'GPU'}. "
            f"Serve part of it with --models, plan for this node (a GPU type with max_count: "
            f"{devices}), or run the plan on several nodes with `stoke controller` and `stoke agent`"
        )


def cmd_up(args: argparse.Namespace) -> int:
    from agents.triton import TritonFleet
    from controller.render_plan import assignments_from_plan

    if args.seconds is not None:
        check.non_negative(args.seconds, "--seconds", error=UserError, fix="leave it out to serve until Ctrl-C")
    check.positive(args.ready_timeout, "--ready-timeout", error=UserError, unit="seconds")
    _check_repo(args.repo)
    assignments = assignments_from_plan(read_plan(args.plan)) if args.plan else _default_assignments(args.repo)
    if args.models:
        wanted = {m.strip() for m in args.models.split(",") if m.strip()}  # `a,b,` is a and b
        missing = sorted(wanted - {a.model for a in assignments} - {a.workload for a in assignments})
        if missing:  # a typo beside a good name was dropped in silence
            have = sorted({a.model for a in assignments} | {a.workload for a in assignments})
            raise UserError(
                f"--models: {', '.join(shown(m) for m in missing)} not in the plan or repository; "
                f"choose from {', '.join(have[:12])}"
            )
        assignments = [a for a in assignments if a.model in wanted or a.workload in wanted]
    if args.plan:
        _refuse_overcommit(args, assignments)
    mps = None
    if args.device_kind == "gpu":
        from agents.mps import MpsControl

        mps = MpsControl()
    restore_signals = interrupt_on_signals()
    report = None
    fleet = TritonFleet(
        args.repo, device_kind=args.device_kind, workdir=args.workdir, mps=mps, ready_timeout_s=args.ready_timeout
    )
    try:
        report = fleet.apply(assignments)
        endpoints, procs = fleet.endpoints(), fleet.processes()
        rows = [
            [
                a.key,
                a.model,
                f"{a.share_pct:g}%",
                a.batch,
                f"{a.queue_delay_ms:g}",
                ",".join(map(str, procs[a.key]["cpu_cores"])) or f"gpu{a.device}",
                endpoints[a.key],
            ]
            for a in fleet.running()
        ]
        if args.json:
            data = {"endpoints": endpoints, "processes": procs, "errors": [str(e) for e in report.errors]}
            if args.output_format == "yaml":
                emit(args, data)
            else:  # one line, so a caller can read it while the servers keep running
                print(json.dumps(data), flush=True)
        else:
            print_table(["assignment", "model", "share", "batch", "delay_ms", "cores", "grpc endpoint"], rows)
            for error in report.errors:
                print(f"error: {error}", file=sys.stderr)
            print(
                "serving; Ctrl-C stops every Triton process"
                if args.seconds is None
                else f"serving for {args.seconds:g} s",
                flush=True,
            )
        sys.stdout.flush()
        if not endpoints:
            return 1
        deadline = None if args.seconds is None else time.monotonic() + args.seconds
        while deadline is None or time.monotonic() < deadline:
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())) if deadline else 1.0)
            for event in fleet.check_health():
                print(f"health: {event}", flush=True)
    except KeyboardInterrupt:
        print("stopping Triton processes", file=sys.stderr)
    finally:
        fleet.close()
        restore_signals()
    return 1 if report is None or report.errors else 0


# --------------------------------------------------------------------------- sync


def cmd_sync(args: argparse.Namespace) -> int:
    from agents.repo_store import S3Store, StoreError, open_store

    _check_repo(args.repo, flag="")  # an argument (DIR), not --repo
    repo = Path(args.repo)
    if (repo / "config.pbtxt").is_file() or not any(repo.glob("*/config.pbtxt")):
        # the store is made to hold exactly DIR's files: a model's own folder would replace the whole repository
        raise UserError(
            f"{inputs.shown_path(args.repo)}: not a model repository (it holds no <model>/config.pbtxt"
            + (", and is itself a model's folder" if (repo / "config.pbtxt").is_file() else "")
            + "); give the folder that holds the models, e.g. triton_repo"
        )
    try:
        store = open_store(args.dest, endpoint_url=args.endpoint_url)
    except StoreError as err:
        raise UserError(str(err)) from None
    try:
        if isinstance(store, S3Store) and args.create_bucket and not args.dry_run:
            store.create_bucket()
        report = store.sync(args.repo, dry_run=args.dry_run)
    except StoreError as err:
        raise _with_store_fix(err) from None
    if args.json:
        emit(
            args,
            {
                "uploaded": list(report.uploaded),
                "deleted": list(report.deleted),
                "unchanged": len(report.unchanged),
                "dry_run": bool(args.dry_run),
            },
        )
    else:
        rows = [["upload", p] for p in report.uploaded] + [["delete", p] for p in report.deleted]
        if rows:
            print_table(["action", "path"], rows)
        else:
            print("already in sync")
        would = "would be " if args.dry_run else ""
        print(
            f"{len(report.uploaded)} {would}uploaded, {len(report.deleted)} {would}deleted, "
            f"{len(report.unchanged)} unchanged" + ("; dry run, nothing written" if args.dry_run else "")
        )
    return 0


def _with_store_fix(err: Exception) -> Exception:
    """agents.repo_store's S3 error plus what to do, for the failures a first sync meets."""
    from foundation.aws import AWS_CREDENTIALS_FIX

    fixes = {
        "credentials": AWS_CREDENTIALS_FIX,
        "no_bucket": "create it with --create-bucket, or check the bucket name in DEST",
    }
    fix = fixes.get(getattr(err, "reason", ""))
    return UserError(f"{err}; {fix}") if fix else err


# --------------------------------------------------------------------------- load


def register(subparsers: argparse._SubParsersAction) -> None:
    triton = subparsers.add_parser("triton", help="serve a plan on real Triton servers (render, up, sync)")
    sub = triton.add_subparsers(dest="triton_command", metavar="SUBCOMMAND", required=True)

    p = sub.add_parser("render", help="write config.pbtxt files for a plan")
    p.add_argument("plan", metavar="PLAN.json", help="output of `stoke plan --json`; - reads stdin")
    add_repo_option(p, "model repository directory", required=True)
    p.add_argument(
        "--device-kind",
        choices=("cpu", "gpu"),
        default="gpu",
        help="KIND_GPU with the plan's GPU index, or KIND_CPU (default gpu; a plan made with a CPU profile, such "
        "as examples/cpu-demo.yaml's, needs cpu)",
    )
    p.add_argument(
        "--latency-histogram",
        action="store_true",
        help="add model_metrics with an SLO bucket (needs Triton >= 2.52; 2.51 refuses it)",
    )
    p.add_argument("--dry-run", action="store_true", help="show the diff of every config that would change; write none")
    add_output_option(p)
    p.set_defaults(run=cmd_render)

    p = sub.add_parser("up", help="start Triton processes for a plan on this machine and print endpoints")
    add_repo_option(p, "model repository: a directory or s3://[host:port/]bucket/path", required=True)
    p.add_argument(
        "--plan",
        metavar="PLAN.json",
        help="plan to serve; refused if it needs more devices or cores than this node has "
        "(default: every model, each on the whole machine)",
    )
    p.add_argument("--models", help="comma-separated models/workloads to serve (default all)")
    p.add_argument(
        "--device-kind",
        choices=("cpu", "gpu"),
        default="cpu",
        help="serve on this machine's CPU cores (default), or its GPUs under MPS (starts the MPS daemon)",
    )
    p.add_argument("--workdir", help="where logs and the backend directory go (default a temp dir)")
    p.add_argument(
        "--ready-timeout", type=float, default=30.0, help="seconds to wait for each server (default %(default)s)"
    )
    p.add_argument("--seconds", type=float, help="stop after this many seconds (default: until Ctrl-C)")
    add_output_option(p)
    p.set_defaults(run=cmd_up)

    p = sub.add_parser("sync", help="sync a model repository into a store (S3 or a directory) by checksum")
    p.add_argument("repo", metavar="DIR", help="local model repository")
    p.add_argument("dest", metavar="DEST", help="s3://bucket/path, s3://host:port/bucket/path or a directory")
    p.add_argument("--endpoint-url", help="S3 endpoint (default from the AWS environment)")
    p.add_argument("--create-bucket", action="store_true")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="compare by checksum and list what would be uploaded and deleted; change nothing",
    )
    add_output_option(p)
    p.set_defaults(run=cmd_sync)
