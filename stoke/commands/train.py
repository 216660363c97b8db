"""`stoke train ...`: distributed-training provisioning commands.

    stoke train plan [SPEC.yaml] [--strategy spot|homogeneous] [--prices offline|live] [--json] [-o PLAN.json]
    stoke train fit-loss [CURVE.csv] [--batch N] [--json] [-o FIT.json]
    stoke train launch [PLAN.json] [--endpoint-url URL] [--region R]
    stoke train watch [PLAN.json] [--metadata-url URL] [--endpoint-url URL] [--max-polls N]
    stoke train terminate [--cluster NAME]
    stoke train render [PLAN.json] [-o FILE]
    stoke train comm-sim [PROFILE.yaml] [--scheduler fifo|priority|blocks|all] [--json]

With no file, each command uses the bundled examples (the ResNet-110 spot
fixture, an example loss curve, the ResNet-50-like gradient profile).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shlex
import sys
import time
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from foundation import validate as check
from foundation.errors import UserError
from foundation.files import atomic_write_text
from foundation.names import shown
from stoke.output import add_output_file_option, add_output_option, emit, writing
from stoke.progress import Progress
from stoke.table import print_table
from training.kube import DEFAULT_IMAGE, DEFAULT_MEMORY, DEFAULT_SPOT_LABEL, DEFAULT_WORKER_COMMAND

# The planners, estimators (numpy, scikit-learn) and YAML load inside the commands that use them, so
# that building the CLI's parser stays fast.
if TYPE_CHECKING:
    from training.spec import TrainingPlan

#: `stoke train comm-sim --scheduler` choices (training.comm_sim.SCHEDULERS; a test keeps them equal).
SCHEDULERS = ("fifo", "priority", "blocks")

#: What `train render` writes: YAML documents, or one JSON List (`--format`, or `-o json|yaml`).
RENDER_FORMATS = ("yaml", "json")

FIT_FORMAT_VERSION = 1


def _fmt(value: float, digits: int = 1) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value:.{digits}f}"


def _add_cloud_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--endpoint-url", help="EC2 endpoint (e.g. a moto server for tests); default: AWS")
    p.add_argument("--region", default="us-east-1", help="AWS region (default us-east-1)")
    p.add_argument("--cluster", help="cluster tag value (default: the plan's job name)")


def register(subparsers: argparse._SubParsersAction) -> None:
    train = subparsers.add_parser(
        "train",
        help="plan, launch and watch distributed training clusters",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = train.add_subparsers(dest="train_command", metavar="SUBCOMMAND", required=True)

    p = sub.add_parser("plan", help="cheapest cluster that reaches the target loss by the deadline")
    p.add_argument("spec", nargs="?", help="SPEC.yaml (default: the bundled ResNet-110 fixture)")
    p.add_argument("--strategy", choices=("spot", "homogeneous"), default="spot")
    p.add_argument(
        "--prices",
        choices=("offline", "live"),
        default="offline",
        help="offline: bundled catalog; live: EC2 spot history + pricing API (cached)",
    )
    p.add_argument(
        "--search",
        choices=("auto", "exact", "window"),
        default="auto",
        help="spot search: exact table, published sliding window, or auto (exact when small)",
    )
    p.add_argument("--deadline", type=float, help="override job.deadline_s")
    p.add_argument("--loss", type=float, help="override job.target_loss")
    p.add_argument("--price-cache", default=None, help="live price cache file (default: none)")
    add_output_option(p, flags=("--format",))
    add_output_file_option(p, metavar="PLAN.json", help="also write the plan JSON here (input of `train launch`)")
    p.add_argument("--endpoint-url", help="EC2/pricing endpoint for --prices live")
    p.add_argument("--region", default="us-east-1")
    p.set_defaults(run=run_plan)

    p = sub.add_parser("fit-loss", help="fit a convergence curve from a loss CSV")
    p.add_argument("curve", nargs="?", help="CURVE.csv: samples,loss | iteration,loss[,batch] | b_w,R,n,j,loss")
    p.add_argument("--batch", type=int, help="global batch when the CSV has iterations but no batch column")
    p.add_argument("--target", type=float, help="also report the samples to reach this loss")
    p.add_argument("--r-weight", type=float, default=1.0, help="heterogeneous fit: weight of R (0 = R term off)")
    add_output_option(p, flags=("--format",))
    add_output_file_option(p, metavar="FIT.json", help="write the fitted coefficients (JSON) here")
    p.set_defaults(run=run_fit_loss)

    p = sub.add_parser("launch", help="launch the plan's spot workers and PS (idempotent)")
    p.add_argument("plan", nargs="?", help="PLAN.json from `train plan -o` (default: plan the bundled spec)")
    p.add_argument("--image", default=None, help="AMI id of the training image")
    _add_cloud_options(p)
    p.set_defaults(run=run_launch)

    p = sub.add_parser(
        "watch",
        help="poll spot interruption notices; re-plan and replace on a notice",
        description="Poll every live spot worker's interruption notice (IMDSv2) every --interval seconds; on a "
        "notice, re-plan with the survivors and launch replacements. Progress shows the job's run time against "
        "the plan's predicted time, with the ETA of its end (a bar on a terminal, a line per poll when piped).",
    )
    p.add_argument("plan", nargs="?", help="PLAN.json (default: plan the bundled spec)")
    p.add_argument(
        "--spec",
        help="SPEC.yaml the plan came from: a revocation re-plans with it (required with a PLAN.json; "
        "without one, the bundled spec and its plan)",
    )
    p.add_argument(
        "--metadata-url",
        default="http://169.254.169.254",
        help="instance metadata base URL, or a template with {instance_id}",
    )
    p.add_argument("--interval", type=float, default=10.0, help="seconds between polls (default 10)")
    p.add_argument("--max-polls", type=int, default=None, help="stop after this many polls (default: forever)")
    _add_cloud_options(p)
    p.set_defaults(run=run_watch)

    p = sub.add_parser("terminate", help="terminate every instance of the cluster")
    p.add_argument("plan", nargs="?", help="PLAN.json (names the cluster when --cluster is not given)")
    _add_cloud_options(p)
    p.set_defaults(run=run_terminate)

    p = sub.add_parser("render", help="render the plan as Kubernetes Services + StatefulSets (YAML)")
    p.add_argument("plan", nargs="?", help="PLAN.json (default: plan the bundled spec)")
    p.add_argument("--image", default=DEFAULT_IMAGE, help="container image of every task (default %(default)s)")
    p.add_argument(
        "--command",
        default=" ".join(DEFAULT_WORKER_COMMAND),
        metavar="CMD",
        help="training program each worker runs, in the image; it reads TF_CONFIG "
        "(default '%(default)s'); parameter servers run a tf.distribute.Server",
    )
    p.add_argument(
        "--memory",
        default=DEFAULT_MEMORY,
        metavar="QUANTITY",
        help="memory request and limit of each task (default %(default)s)",
    )
    p.add_argument(
        "--spot-label",
        default="=".join(DEFAULT_SPOT_LABEL),
        metavar="KEY=VALUE",
        help="node label of spot capacity, selected (and its taint tolerated) by a spot plan's workers "
        "(default %(default)s; 'none' to leave it out)",
    )
    p.add_argument("--namespace", default="default")
    p.add_argument(
        "--format",
        dest="output_format",
        choices=RENDER_FORMATS,
        default="yaml",
        help="yaml (default: a multi-document stream for kubectl apply -f) or json (a List object)",
    )
    add_output_file_option(p, metavar="FILE", formats=RENDER_FORMATS, help="write the manifests here instead of stdout")
    p.set_defaults(run=run_render)

    p = sub.add_parser("comm-sim", help="simulate PS push/pull under FIFO, priority and block scheduling")
    p.add_argument("profile", nargs="?", help="PROFILE.yaml (default: bundled resnet50; see --model)")
    p.add_argument("--model", choices=("resnet50", "vgg19"), help="bundled profile to use when no file is given")
    p.add_argument("--scheduler", choices=SCHEDULERS + ("all",), default="all")
    p.add_argument("--bandwidth", type=float, help="override the profile's bandwidth (MB/s)")
    add_output_option(p)
    p.set_defaults(run=run_comm_sim)


# --------------------------------------------------------------------------- helpers


def _load_spec(
    path: str | None,
    strategy: str = "spot",
    prices: str = "offline",
    *,
    endpoint_url=None,
    region="us-east-1",
    cache=None,
):
    from training import readers
    from training.spec import spec_from_dict, spec_instance_types

    data, source = readers.read_spec(path)
    if prices == "live":
        from training.cloud import CloudError, PriceSource

        types = spec_instance_types(data, source)  # the spec's keys and names are checked before any request
        ec2, pricing = _clients(region, endpoint_url)
        src = PriceSource(ec2=ec2, pricing=pricing, region=region, cache_path=cache)
        try:
            catalog = src.live(types)
        except CloudError as err:
            raise UserError(f"{source}: live prices failed ({err}); retry with --prices offline") from None
        notes = src.notes
    else:
        catalog, notes = readers.offline_catalog(), []
    market = "spot" if strategy == "spot" else "on_demand"
    spec = spec_from_dict(data, catalog, source, market=market)
    if strategy == "spot" and spec.sync != "asp":  # the README: spot mixes instance types with ASP only
        raise UserError(
            f"{source}: job.sync is {spec.sync!r}, but the spot strategy plans asynchronous (ASP) training only; "
            "plan BSP with --strategy homogeneous, or set job.sync: asp"
        )
    return spec, catalog, notes


def _solve(spec, strategy: str, search: str = "auto") -> TrainingPlan:
    from training.homogeneous import provision_homogeneous
    from training.spot import provision_spot

    if strategy == "homogeneous":
        return provision_homogeneous(spec)
    return provision_spot(spec, search=search)


def _load_plan(path: str | None) -> TrainingPlan:
    from training import readers
    from training.spec import training_plan_from_dict

    if path is None:
        spec, _, _ = _load_spec(None)
        return _solve(spec, "spot")
    return training_plan_from_dict(readers.read_json(path, "plan"), path)


def _print_plan(plan: TrainingPlan, notes: list[str], catalog_line: str) -> None:
    print(
        f"job {plan.job}: {plan.strategy} plan, target loss {plan.target_loss}, deadline {plan.deadline_s:.0f} s "
        f"({catalog_line})"
    )
    if not plan.feasible:
        print(f"INFEASIBLE: {plan.reason}")
        return
    have = dict(plan.existing)
    rows = [[t, c, have.get(t, 0), c - have.get(t, 0)] for t, c in plan.counts]
    print_table(["instance type", "workers", "kept", "new"], rows)
    print(f"parameter servers: {plan.ps_count} x {plan.ps_type}")
    print(
        f"predicted time {_fmt(plan.predicted_time_s)} s, cost ${_fmt(plan.predicted_cost, 2)}, "
        f"bottleneck: {plan.bottleneck} ({plan.details.get('explanation', '')})"
    )
    print(f"searched {plan.candidates} candidates ({plan.search})")
    for note in notes:
        print(f"note: {note}")


# --------------------------------------------------------------------------- commands


def run_plan(args: argparse.Namespace) -> int:
    from training.spec import training_plan_to_dict, with_overrides

    spec, catalog, notes = _load_spec(
        args.spec,
        args.strategy,
        args.prices,
        endpoint_url=args.endpoint_url,
        region=args.region,
        cache=args.price_cache,
    )
    if args.deadline is not None or args.loss is not None:
        from training.spec import MAX_DEADLINE_S, MAX_LOSS

        for flag, value, maximum in (("--deadline", args.deadline, MAX_DEADLINE_S), ("--loss", args.loss, MAX_LOSS)):
            if value is not None:
                check.positive(value, flag, error=UserError, maximum=maximum)
        spec = with_overrides(spec, deadline_s=args.deadline, target_loss=args.loss)
    plan = _solve(spec, args.strategy, args.search)
    body = training_plan_to_dict(plan)
    body["prices"] = {"source": catalog.source, "as_of": catalog.prices_as_of, "notes": notes}
    if args.output:
        with writing(args.output, "output"):
            atomic_write_text(args.output, json.dumps(body, indent=2) + "\n")
    if args.json:
        emit(args, body)
    else:
        _print_plan(plan, notes, f"{catalog.source} prices as of {catalog.prices_as_of}")
    return 0 if plan.feasible else 1


def run_fit_loss(args: argparse.Namespace) -> int:
    from training import readers
    from training.estimators import LossCurveEstimator, SpotLossEstimator

    cols = readers.read_curve_csv(args.curve, args.batch)
    if {"b_w", "R", "n", "j"} <= set(cols):
        import numpy as np

        X = np.column_stack([cols["b_w"], cols["R"], cols["n"], cols["j"]])
        est = SpotLossEstimator(r_weight=args.r_weight).fit(X, cols["loss"])
        coeffs = {k: round(getattr(est.loss_, k), 6) for k in ("g1", "g2", "g3", "g4", "g5", "r_weight")}
        body = {
            "format_version": FIT_FORMAT_VERSION,
            "kind": "spot_loss",
            "loss": coeffs,
            "rmse": round(est.rmse_, 6),
            "points": len(cols["loss"]),
        }
        rows = [[k, f"{v:.6g}"] for k, v in coeffs.items()]  # as written to the JSON: the table's 0.00 would lose it
    else:
        t0 = time.perf_counter()
        est = LossCurveEstimator().fit(cols["samples"], cols["loss"])
        fit_ms = (time.perf_counter() - t0) * 1000
        c = est.curve_
        coeffs = {"beta0": float(f"{c.beta0:.6g}"), "beta1": float(f"{c.beta1:.6g}"), "beta2": float(f"{c.beta2:.6g}")}
        body = {
            "format_version": FIT_FORMAT_VERSION,
            "kind": "loss_curve",
            "curve": coeffs,
            "rmse": round(est.rmse_, 6),
            "points": est.n_points_,
            "fit_ms": round(fit_ms, 3),
        }
        rows = [[k, f"{v:.6g}"] for k, v in coeffs.items()]  # as written to the JSON: the table's 0.00 would lose it
        if args.target is not None:
            samples = est.samples_for(args.target)
            body["samples_to_target"] = samples
            rows.append([f"samples to loss {args.target}", _fmt(samples, 0)])
    if args.output:
        with writing(args.output, "output"):
            atomic_write_text(args.output, json.dumps(body, indent=2) + "\n")
    if args.json:
        emit(args, body)
    else:
        print(f"{body['kind']} fitted on {body['points']} points, rmse {body['rmse']}")
        print_table(["coefficient", "value"], rows)
        print("paste into SPEC.yaml under " + ("homogeneous.curve" if body["kind"] == "loss_curve" else "spot.loss"))
    return 0


#: An AWS region name: us-east-1, us-gov-west-1, ap-southeast-2, ...
_REGION = re.compile(r"[a-z]{2}(?:-[a-z]+)+-[0-9]+")
REGION_FIX = "give an AWS region name such as --region us-east-1"
ENDPOINT_FIX = "give an http(s) URL such as --endpoint-url http://127.0.0.1:5000, or leave it out for AWS"


def _clients(region: str, endpoint_url: str | None):
    """(ec2, pricing) clients, once --region and --endpoint-url are checked (botocore refuses a bad one with a
    traceback, before any request)."""
    from training.cloud import CloudError, make_clients

    # AWS's pattern; an EC2-compatible endpoint names its regions its own way (RegionOne): there botocore's own
    # check (a CloudError below, not a traceback) is the one that applies
    if endpoint_url is None and not _REGION.fullmatch(region):
        raise UserError(f"--region {shown(region)} is not an AWS region name; {REGION_FIX}")
    if endpoint_url is not None:
        parts = urlsplit(endpoint_url)
        try:
            parts.port  # noqa: B018 (raises on a port that is not a number from 0 to 65535)
        except ValueError:
            parts = parts._replace(netloc="")
        if (
            parts.scheme not in ("http", "https")
            or not parts.hostname
            or any(c.isspace() or not c.isprintable() for c in endpoint_url)
        ):
            raise UserError(f"--endpoint-url {shown(endpoint_url)} is not an http(s) URL; {ENDPOINT_FIX}")
    try:
        return make_clients(region, endpoint_url)
    except CloudError as err:
        raise _cloud_error(err) from None


def _cloud_error(err: Exception) -> UserError:
    """An EC2 failure as a one-line stoke error (exit 2) that ends with what to do."""
    from foundation.aws import AWS_CREDENTIALS_FIX

    if getattr(err, "reason", "") == "region":
        fix = REGION_FIX
    elif getattr(err, "reason", "") == "endpoint":
        fix = ENDPOINT_FIX
    elif getattr(err, "reason", "") == "credentials":
        fix = AWS_CREDENTIALS_FIX
    elif getattr(err, "reason", "") == "metadata":
        fix = (
            "run `train watch` on an EC2 instance that reaches the workers' metadata, or pass --metadata-url "
            "of a metadata relay (a base URL, or a template with {instance_id})"
        )
    else:
        fix = "check --region, --endpoint-url and the account's EC2 permissions"
    return UserError(f"{err}; {fix}")


def _launcher(args: argparse.Namespace, plan: TrainingPlan):
    from training.cloud import DEFAULT_IMAGE, SpotLauncher

    cluster = _cluster(args) or plan.job
    ec2, _ = _clients(args.region, args.endpoint_url)
    return SpotLauncher(ec2, cluster, image_id=getattr(args, "image", None) or DEFAULT_IMAGE)


def _cluster(args: argparse.Namespace) -> str | None:
    """--cluster, checked: it is a tag value and is printed."""
    from training.spec import cluster_tag

    return None if args.cluster is None else cluster_tag(args.cluster, "--cluster", error=UserError)


def _spot_plan_only(plan: TrainingPlan, path: str | None, command: str) -> None:
    if plan.strategy != "spot":
        raise UserError(
            f"{path or 'bundled plan'}: `stoke train {command}` handles spot plans; this one is "
            f"{plan.strategy!r} (priced on demand, no revocations): plan with --strategy spot"
        )


def run_launch(args: argparse.Namespace) -> int:
    from training.cloud import CloudError

    plan = _load_plan(args.plan)
    _spot_plan_only(plan, args.plan, "launch")
    if not plan.feasible:
        raise UserError(f"{args.plan or 'bundled plan'}: plan is infeasible ({plan.reason}); re-plan first")
    launcher = _launcher(args, plan)
    try:
        report = launcher.apply(plan)
        running = launcher.instances()
    except CloudError as err:
        raise _cloud_error(err) from None
    print(f"cluster {launcher.cluster}: {report.summary()}")
    print_table(["instance", "type", "role", "state"], [[i.id, i.type, i.role, i.state] for i in running])
    return 0


def run_terminate(args: argparse.Namespace) -> int:
    from training.cloud import CloudError

    if args.cluster is None and args.plan is None:
        raise UserError("name the cluster: --cluster NAME or a PLAN.json")
    plan = _load_plan(args.plan) if args.cluster is None else None
    launcher = _launcher(args, plan) if plan else None
    if launcher is None:
        from training.cloud import SpotLauncher
        from training.spec import cluster_tag

        cluster = cluster_tag(args.cluster, "--cluster", error=UserError)  # a tag value (printable), printed
        ec2, _ = _clients(args.region, args.endpoint_url)
        launcher = SpotLauncher(ec2, cluster)
    try:
        report = launcher.terminate()
    except CloudError as err:
        raise _cloud_error(err) from None
    print(f"cluster {launcher.cluster}: {report.summary()}")
    return 0


def run_watch(args: argparse.Namespace) -> int:
    from training.cloud import CloudError, RevocationWatcher

    plan = _load_plan(args.plan)
    _spot_plan_only(plan, args.plan, "watch")
    if args.plan is not None and args.spec is None:
        raise UserError(
            f"{args.plan}: give --spec SPEC.yaml, the spec this plan came from: a revocation re-plans with it"
        )
    spec, _, _ = _load_spec(args.spec)
    unknown = sorted({t for t, c in plan.counts if c} - {w.type for w in spec.workers})
    if spec.name != plan.job or unknown:
        raise UserError(
            f"{args.spec or 'bundled spec'}: spec {spec.name!r} does not match the plan of job "
            f"{plan.job!r}"
            + (f" (types {', '.join(unknown)} not in the spec)" if unknown else "")
            + "; give the spec the plan came from"
        )
    check.positive(args.interval, "--interval", error=UserError, unit="seconds")
    watcher = RevocationWatcher(_launcher(args, plan), spec, plan, args.metadata_url, interval_s=args.interval)

    bar = Progress(f"training {plan.job}", max(plan.predicted_time_s, 1.0), unit=" s", min_interval_s=0.0)

    def polled(polls: int) -> None:
        elapsed, predicted = watcher.training_progress()
        bar.total = max(predicted, 1.0)
        polls_text = f"{polls}/{args.max_polls}" if args.max_polls else str(polls)
        bar.update(
            elapsed,
            f"poll {polls_text}, {watcher.watched} spot worker(s) watched",
            eta_s=max(0.0, predicted - elapsed),
        )

    def report(result) -> None:
        print(f"revoked: {', '.join(result.revoked)}")
        if result.plan is not None and result.plan.feasible:
            adds = ", ".join(f"{c} x {t}" for t, c in result.plan.additions) or "nothing"
            launched = result.launch.summary() if result.launch else "-"
            print(
                f"re-plan: keep {result.plan.existing}, add {adds}; predicted {_fmt(result.plan.predicted_time_s)} "
                f"s, ${_fmt(result.plan.predicted_cost, 2)}; launch: {launched}"
            )
        elif result.plan is not None:
            print(f"re-plan infeasible: {result.plan.reason}")
        sys.stdout.flush()

    try:
        with bar:
            handled = watcher.run(max_polls=args.max_polls, on_event=report, on_poll=polled)
    except CloudError as err:
        raise _cloud_error(err) from None
    print(f"watch ended: {handled} revocation(s) handled")
    return 0


def _block_dumper() -> type:
    """Safe YAML that prints multi-line strings (the task prelude, the PS program) as literal blocks."""
    import yaml

    class BlockDumper(yaml.SafeDumper):
        pass

    BlockDumper.add_representer(
        str,
        lambda dumper, value: dumper.represent_scalar(
            "tag:yaml.org,2002:str", value, style="|" if "\n" in value else None
        ),
    )
    return BlockDumper


def run_render(args: argparse.Namespace) -> int:
    import yaml

    from deploy.crd import kubernetes_name
    from deploy.options import parse_image
    from training import readers
    from training.kube import memory_problem, render_manifests, spot_label_problem, validate_manifests

    # the options first: each is refused with its own fix, not found malformed in the rendered objects
    parse_image(args.image)
    kubernetes_name(args.namespace, "--namespace", "give --namespace a lower-case name, e.g. --namespace training")
    problem = memory_problem(args.memory)
    if problem:
        raise UserError(f"--memory {shown(args.memory)}: {problem}")
    try:
        command = shlex.split(args.command)
    except ValueError as err:
        raise UserError(f"--command {shown(args.command)}: {err}; quote it as one shell word list") from None
    if not command:
        raise UserError("--command is empty; give the training program each worker runs, e.g. 'python train.py'")
    if args.spot_label == "none":
        spot_label = None
    else:
        key, sep, value = args.spot_label.partition("=")
        if not (sep and key and value):
            raise UserError(
                f"--spot-label {shown(args.spot_label)}: give KEY=VALUE, e.g. karpenter.sh/capacity-type=spot"
            )
        problem = spot_label_problem(key, value)
        if problem:
            raise UserError(f"--spot-label {shown(args.spot_label)}: {problem}; e.g. karpenter.sh/capacity-type=spot")
        spot_label = (key, value)
    plan = _load_plan(args.plan)
    if not plan.feasible:
        raise UserError(f"{args.plan or 'bundled plan'}: plan is infeasible ({plan.reason}); nothing to render")
    catalog = readers.offline_catalog()
    gpus = {t: catalog.types[t].gpus for t, _ in plan.counts if t in catalog.types}
    vcpus = {name: t.vcpus for name, t in catalog.types.items()}
    objects = render_manifests(
        plan,
        image=args.image,
        namespace=args.namespace,
        command=command,
        gpus_per_type=gpus,
        vcpus_per_type=vcpus,
        memory=args.memory,
        spot_label=spot_label,
    )
    problems = validate_manifests(objects)
    if problems:
        raise UserError(f"rendered manifests are malformed: {problems[0]}")
    if args.output_format == "json":  # one kubectl-readable List, so `kubectl apply -f` takes the file whole
        text = json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}, indent=2) + "\n"
    else:
        text = yaml.dump_all(objects, Dumper=_block_dumper(), sort_keys=False)
    if args.output:
        with writing(args.output, "manifests"):
            atomic_write_text(args.output, text)
        print(f"wrote {len(objects)} objects to {args.output}")
    else:
        sys.stdout.write(text)
    return 0


def run_comm_sim(args: argparse.Namespace) -> int:
    from training import readers
    from training.blocks import gradient_profile_from_dict, plan_blocks
    from training.comm_sim import compare

    data, source = readers.read_gradient_profile(args.profile, args.model)
    profile = gradient_profile_from_dict(data, source)
    if args.bandwidth is not None:
        check.positive(args.bandwidth, "--bandwidth", error=UserError, unit="MB/s")
        from dataclasses import replace

        profile = replace(profile, bandwidth_mb_s=args.bandwidth)
    chosen = SCHEDULERS if args.scheduler == "all" else (args.scheduler,)
    t0 = time.perf_counter()
    blocks = plan_blocks(profile)
    planner_ms = (time.perf_counter() - t0) * 1000
    results = compare(profile, chosen)
    if args.json:
        emit(
            args,
            {
                "profile": profile.name,
                "bandwidth_mb_s": profile.bandwidth_mb_s,
                "planner_ms": round(planner_ms, 3),
                "blocks": len(blocks),
                "results": [
                    {
                        "scheduler": r.scheduler,
                        "iteration_ms": round(r.iteration_ms, 3),
                        "gpu_idle_ms": round(r.gpu_idle_ms, 3),
                        "link_utilisation": round(r.link_utilisation, 4),
                        "messages": r.messages,
                    }
                    for r in results
                ],
            },
        )
        return 0
    total_mb = sum(g.bytes for g in profile.gradients) / 1e6
    print(
        f"{profile.name}: {len(profile.gradients)} gradients, {total_mb:.1f} MB, "
        f"link {profile.bandwidth_mb_s:.0f} MB/s, compute {profile.backward_ms + profile.forward_ms:.1f} ms/iteration"
    )
    base = {r.scheduler: r.iteration_ms for r in results}
    rows = []
    for r in results:
        vs = [f"{base[s] / r.iteration_ms:.2f}x vs {s}" for s in ("fifo", "priority") if s in base and s != r.scheduler]
        rows.append(
            [
                r.scheduler,
                _fmt(r.iteration_ms, 2),
                _fmt(r.gpu_idle_ms, 2),
                f"{100 * r.link_utilisation:.1f}%",
                r.messages,
                ", ".join(vs),
            ]
        )
    print_table(["scheduler", "iteration ms", "GPU idle ms", "link util", "messages", "speed-up"], rows)
    print(f"block planner: {len(blocks)} blocks planned in {planner_ms:.2f} ms")
    return 0
