"""Client commands of a running controller: `stoke workload ...`, `stoke nodes`, `stoke status`,
`stoke profiles ...`, and `remote_plan` for `stoke plan --remote`.

They share the controller connection options (`stoke.client_options`:
``--controller``, ``--token-file``, ``--tls-ca``, ``--tls``, with
``$STOKE_CONTROLLER`` and ``$STOKE_TOKEN``) and the output format option
(`stoke.output`: ``-o table|wide|json|yaml``, ``--json``). The daemons are
in `stoke.commands.daemons`, the local demo in `stoke.commands.demo`.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from foundation.errors import UserError
from stoke.client_options import add_client_options, connect, controller_address
from stoke.commands.daemons import interrupt_on_signals
from stoke.commands.inputs import read_text_input, warn_unused_gpu_types
from stoke.live import Block, LiveView, Tab
from stoke.output import add_output_option, emit
from stoke.plan_table import REMOTE, plan_table
from stoke.table import print_table

__all__ = ["register", "remote_plan", "to_dict"]


# ------------------------------------------------------------------ registration


def client_args(p: argparse.ArgumentParser, wide: str = "") -> None:
    """The controller connection options and the output format option."""
    add_client_options(p)
    add_output_option(p, wide=wide)


def register(subparsers: argparse._SubParsersAction) -> None:
    w = subparsers.add_parser("workload", help="manage the workloads of a running controller")
    ws = w.add_subparsers(dest="workload_command", metavar="COMMAND", required=True)
    p = ws.add_parser("apply", help="create or update the workloads of a YAML file (all or nothing)")
    p.add_argument(
        "-f", "--file", required=True, metavar="FILE", help="workloads YAML (see `stoke plan`); - reads stdin"
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="the controller checks the file and says what would be created, updated or left; nothing is stored",
    )
    client_args(p)
    p.set_defaults(run=run_workload_apply)
    p = ws.add_parser("rm", help="delete a workload")
    p.add_argument("name")
    client_args(p)
    p.set_defaults(run=run_workload_rm)
    p = ws.add_parser("ls", help="list the workloads")
    client_args(p)
    p.set_defaults(run=run_workload_ls)

    p = subparsers.add_parser(
        "nodes", help="list the nodes: address, devices, health, last heartbeat, what runs there and its endpoints"
    )
    client_args(p, wide="every event, and the Triton process behind each endpoint")
    p.set_defaults(run=run_nodes)

    p = subparsers.add_parser(
        "status", help="per workload: planned share/batch/node, predicted vs observed, and its endpoints"
    )
    client_args(p, wide="the Triton process behind each endpoint")
    p.add_argument(
        "--watch",
        nargs="?",
        const=2.0,
        type=float,
        metavar="S",
        help="refresh every S seconds (default 2) until Ctrl-C: in place on a terminal, one block per refresh "
        "when piped",
    )
    p.set_defaults(run=run_status)

    pr = subparsers.add_parser("profiles", help="upload / list fitted profiles on a running controller")
    ps = pr.add_subparsers(dest="profiles_command", metavar="COMMAND", required=True)
    p = ps.add_parser("upload", help="upload a fitted profile (JSON from `stoke profile fit`)")
    p.add_argument("file", help="fitted profile JSON; - reads stdin")
    p.add_argument("--gpu-type", default="", help="store under this GPU type (default: the profile's gpu.name)")
    client_args(p)
    p.set_defaults(run=run_profiles_upload)
    p = ps.add_parser(
        "ls", help="list the profiles per (model, GPU type): the fitted one and the active (recalibrated) version"
    )
    p.add_argument("--versions", action="store_true", help="list every version (0 = the fitted profile)")
    p.add_argument("--model", default="", help="only this model")
    client_args(p)
    p.set_defaults(run=run_profiles_ls)
    p = ps.add_parser(
        "rollback",
        help="make an earlier version active and pin it (recalibration pauses for it until `profiles resume`)",
    )
    p.add_argument("model")
    p.add_argument("--gpu-type", default="", help="the GPU type (needed when the model is profiled on several)")
    p.add_argument("--version", type=int, default=0, help="version to make active (default 0: the fitted profile)")
    client_args(p)
    p.set_defaults(run=run_profiles_rollback)
    p = ps.add_parser("resume", help="unpin a rolled-back profile: recalibration goes on from the active version")
    p.add_argument("model")
    p.add_argument("--gpu-type", default="", help="the GPU type (needed when the model is profiled on several)")
    client_args(p)
    p.set_defaults(run=run_profiles_resume)

    p = subparsers.add_parser(
        "observations",
        help="what the agents observed, per replica window, beside the prediction (newest first)",
    )
    p.add_argument("--workload", default="", help="only this workload")
    p.add_argument("--limit", type=int, default=20, help="windows to show (default %(default)s, at most 10000)")
    client_args(p)
    p.set_defaults(run=run_observations)


# ------------------------------------------------------------------ client helpers


def _call(args: argparse.Namespace, fn: Callable[[Any], Any], source: str = "", client: Any = None) -> Any:
    """Call the controller; its refusals become one line that says what to do (the fix depends on the call).

    `client`: an open client to use (and leave open); by default one is opened for this call."""
    from controller.api.client import UNRESOLVED
    from controller.messages import (
        ApiError,
        FailedPrecondition,
        InvalidArgument,
        TlsMismatch,
        Unauthenticated,
        Unavailable,
    )

    own = client is None
    client = connect(args) if own else client
    try:
        return fn(client)
    except TlsMismatch as err:  # reached, but TLS on one side only: the message says what to pass
        raise UserError(str(err)) from None
    except Unavailable as err:
        if UNRESOLVED in str(err):  # a mistyped name: starting a controller would not help
            raise UserError(
                f"{err}; check the host name in --controller HOST:PORT (or $STOKE_CONTROLLER), or give an IP address"
            ) from None
        raise UserError(
            f"{err}; start it (`stoke controller`), or point at the running one with --controller HOST:PORT "
            f"(or $STOKE_CONTROLLER)"
        ) from None
    except Unauthenticated as err:
        raise UserError(
            f"controller {controller_address(args)} refused the call ({err}); "
            f"pass --token-file FILE or set $STOKE_TOKEN"
        ) from None
    except (InvalidArgument, FailedPrecondition) as err:
        raise UserError(f"{source + ': ' if source else ''}{err}") from None
    except ApiError as err:
        raise UserError(f"controller {controller_address(args)}: {err}") from None
    finally:
        if own:
            client.close()


#: int64 fields, which proto3 JSON writes as strings; `--json` prints them as numbers.
_INT64_FIELDS = {
    "revision",
    "memory_bytes",
    "failures",
    "success",
    "applied_revision",
    "executions",
    "requests",
    "stored",
    "max_rows",
    "profile_version",
    "pending",
    "guard_moves",
    "active_version",
    "versions",
    "version",
    "evidence_executions",
}


def to_dict(message: Any) -> dict[str, Any]:
    from google.protobuf.json_format import MessageToDict

    def fix(value: Any, key: str = "") -> Any:
        if isinstance(value, dict):
            return {k: fix(v, k) for k, v in value.items()}
        if isinstance(value, list):
            return [fix(v) for v in value]
        if key in _INT64_FIELDS and isinstance(value, str) and value.lstrip("-").isdigit():
            return int(value)
        return value

    return fix(MessageToDict(message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True))


def status_dict(reply: Any) -> dict[str, Any]:
    """`stoke status`'s data: a figure not known yet is null, as the table's "-" (proto3 sends 0 for it, and a
    script read `slo_attainment: 0.0` of a pending workload as every request late)."""
    data = to_dict(reply)
    for w, message in zip(data.get("workloads", []), reply.workloads):
        if not (message.replicas and message.predicted_p99_ms > 0):
            w["predicted_p99_ms"] = w["predicted_latency_ms"] = None
        if not message.HasField("observed_p99_ms"):
            w["slo_attainment"] = None
        if not message.observed:
            w["observed_latency_ms"] = w["observed_rate_rps"] = None
    return data


def _ago(seconds: float) -> str:
    return f"{seconds:.1f}s ago" if seconds < 120 else f"{seconds / 60:.0f}m ago"


# ------------------------------------------------------------------ workloads


def run_workload_apply(args: argparse.Namespace) -> int:
    from planner.workload_file import parse_workloads_and_type_names

    text, source = read_text_input(args.file, "the workload file")
    workloads, gpu_types = parse_workloads_and_type_names(text, source)
    fix = ", priced by its config's gpu_types (max_count too), with the profiles uploaded to it "
    fix += "(`stoke profiles upload`)"
    warn_unused_gpu_types(source, gpu_types, "applied", fix)
    reply = _call(args, lambda c: c.apply_workloads(workloads, dry_run=args.dry_run), source=source)
    if args.json:
        emit(args, {**to_dict(reply), "dry_run": bool(args.dry_run)})
        return 0
    would = "would be " if args.dry_run else ""
    rows = (
        [[n, f"{would}created"] for n in reply.created]
        + [[n, f"{would}updated"] for n in reply.updated]
        + [[n, "unchanged"] for n in reply.unchanged]
    )
    print_table(["workload", "result"], rows)
    if args.dry_run:
        print(f"dry run: the controller accepted {source}; nothing stored (apply without --dry-run to store it)")
    return 0


def run_workload_rm(args: argparse.Namespace) -> int:
    deleted = _call(args, lambda c: c.delete_workload(args.name))
    if args.json:
        emit(args, {"name": args.name, "deleted": deleted})
    elif deleted:
        print(f"workload {args.name} deleted")
    else:
        raise UserError(f"workload {args.name!r} does not exist; see `stoke workload ls`")
    return 0


def run_workload_ls(args: argparse.Namespace) -> int:
    workloads = _call(args, lambda c: c.list_workloads())
    if args.json:
        emit(
            args,
            [
                {
                    "name": w.name,
                    "model": w.model,
                    "slo_ms": w.slo_ms,
                    "rate_rps": w.rate_rps,
                    "gpu_type": w.gpu_type,
                    "arrivals": w.arrivals,
                }
                | ({"rate_auto": True, "min_rps": w.min_rps, "max_rps": w.max_rps} if w.rate_auto else {})
                for w in workloads
            ],
        )
    else:
        print_table(
            ["workload", "model", "slo_ms", "rate_rps", "gpu_type", "arrivals"],
            [
                [
                    w.name,
                    w.model,
                    w.slo_ms,
                    f"auto {w.rate_rps:g}" if w.rate_auto else w.rate_rps,
                    w.gpu_type or "any",
                    w.arrivals,
                ]
                for w in workloads
            ],
        )
    return 0


# ------------------------------------------------------------------ plan (for `stoke plan --remote`)


def devices_in_use(plan: Any) -> tuple[int, float, int, float]:
    """(devices in use, their $/hour, planned GPUs without a free device, their $/hour) of a `pb.Plan`.

    "In use" is one definition for every view: a planned GPU bound to a node device. `stoke status`, the
    metrics `stoke_gpus_in_use` / `stoke_plan_cost_per_hour` and so the dashboard count the same
    (`controller.status.cluster_status`); a planned GPU no node device could take runs nothing and costs
    nothing, so it is listed apart."""
    bound = [g for g in plan.gpus if g.node_id]
    unbound = [g for g in plan.gpus if not g.node_id]
    return (
        len(bound),
        sum(g.price_per_hour for g in bound),
        len(unbound),
        sum(g.price_per_hour for g in unbound),
    )


def format_remote_plan(plan: Any, wide: bool = False) -> str:
    used, cost, waiting, waiting_cost = devices_in_use(plan)
    head = f"plan revision {plan.revision} ({plan.strategy}): {used} device(s) in use, ${cost:,.2f}/hour"
    if waiting:
        head += f"; {waiting} more planned GPU(s) without a free device (${waiting_cost:,.2f}/hour, not counted)"
    rows = (
        (f"{g.node_id}/{g.device}" if g.node_id else "(no free device)", g.gpu_type, p.workload, p)
        for g in plan.gpus
        for p in g.placements
    )
    lines = [head, "", plan_table(rows, REMOTE, wide=wide)]
    lines += [f"pending: {p.workload}: {p.reason}" for p in plan.pending]
    lines += [f"note: {n}" for n in plan.notes]
    return "\n".join(lines)


def remote_plan(args: argparse.Namespace) -> int:
    """`stoke plan --remote`: the controller's applied plan (`--preview`: solve now without acting)."""
    preview = bool(getattr(args, "preview", False))
    reply = _call(args, lambda c: c.preview_plan() if preview else c.get_plan())
    if args.json:
        used, cost, waiting, waiting_cost = devices_in_use(reply.plan)
        # cost_per_hour is the solver's, over every planned GPU; these are what `status` and the metrics count
        extra = {"devices_in_use": used, "cost_per_hour_in_use": cost, "devices_without_a_free_device": waiting}
        emit(args, {**to_dict(reply.plan), **extra})
    else:
        print(format_remote_plan(reply.plan, wide=bool(getattr(args, "wide", False))))
    return 0


# ------------------------------------------------------------------ nodes and status


def nodes_blocks(reply: Any, wide: bool = False) -> list[Block]:
    from controller.messages import Replica

    rows = []
    for n in reply.nodes:
        devices = ", ".join(f"{d.index}:{d.gpu_type or d.name}" for d in n.devices)
        running = ", ".join(str(Replica(a.workload, a.replica)) for a in n.running) or "-"
        rows.append(
            [
                n.node_id,
                n.state,
                n.address or "-",
                devices,
                _ago(n.seconds_since_heartbeat),
                len(n.assigned),
                running,
                n.applied_revision,
            ]
        )
    blocks: list[Block] = [
        Tab(["node", "state", "address", "devices", "heartbeat", "assigned", "running", "revision"], rows)
    ]
    endpoint_rows = [
        [n.node_id, e.key, e.grpc, e.http, e.metrics] + ([e.backend] if wide else [])
        for n in reply.nodes
        for e in n.endpoints
    ]
    if endpoint_rows:
        blocks += [
            "",
            "endpoints:",
            Tab(["node", "assignment", "grpc", "http", "metrics"] + (["backend"] * wide), endpoint_rows),
        ]
    events = [f"  {n.node_id}: {e}" for n in reply.nodes for e in (list(n.events) if wide else list(n.events)[-3:])]
    if events:
        blocks += ["", "recent events:", *events]
    return blocks


def run_nodes(args: argparse.Namespace) -> int:
    reply = _call(args, lambda c: c.list_nodes())
    if args.json:
        emit(args, to_dict(reply)["nodes"])
    else:
        _print_blocks(nodes_blocks(reply, args.wide))
    return 0


#: Client-side figures per workload (`stoke up`'s load): p99 latency (ms), share of requests over the SLO, requests.
ClientFigures = dict[str, tuple[float | None, float | None, int]]


def status_blocks(
    s: Any, wide: bool = False, client: ClientFigures | None = None, *, legend: bool = True, endpoints: bool = True
) -> list[Block]:
    """The status view: a head line, one row per workload, why some do not serve, the legend, the endpoints."""
    rows = []
    for w in s.workloads:
        nodes = ",".join(sorted({f"{r.node_id}/{r.device}" for r in w.replicas})) or "-"
        share = sum(r.share_pct for r in w.replicas) if w.replicas else None
        batch = "/".join(str(r.batch) for r in w.replicas) or "-"
        row = [
            w.name,
            w.model,
            w.state,
            nodes,
            share,
            batch,
            w.slo_ms,
            w.predicted_p99_ms if w.replicas and w.predicted_p99_ms > 0 else None,
            w.observed_p99_ms if w.HasField("observed_p99_ms") else None,
            f"{w.slo_attainment:.1%}" if w.HasField("observed_p99_ms") else "-",
            w.observed_latency_ms if w.observed else None,
            w.rate_rps,
            sum(r.observed_rate_rps for r in w.replicas) if any(r.observed for r in w.replicas) else None,
        ]
        if client is not None:
            p99, over, _ = client.get(w.name, (None, None, 0))
            row += [p99, None if over is None else f"{100 * over:.1f}%"]
        rows.append(row)
    head = (
        f"plan revision {s.revision}: {s.gpus_in_use} device(s) in use, ${s.cost_per_hour:,.2f}/hour; "
        f"nodes ready {s.nodes_ready}, lost {s.nodes_lost}" + (f", silent {s.nodes_silent}" if s.nodes_silent else "")
    )
    headers = [
        "workload",
        "model",
        "state",
        "node/dev",
        "share_%",
        "batch",
        "slo_ms",
        "plan_p99_ms",
        "p99_ms",
        "in_slo",
        "triton_ms",
        "rate_rps",
        "obs_rps",
    ]
    if client is not None:
        headers += ["client_p99_ms", "over_slo"]
    blocks: list[Block] = [head, "", Tab(headers, rows)]
    blocks += [f"{w.name}: {w.reason}" for w in s.workloads if w.reason and w.state != "serving"]
    blocks += [f"ALERT: {a}" for a in s.alerts]
    blocks += loop_lines(s)
    if s.last_error:
        blocks.append(f"last reconcile error: {s.last_error}")
    if legend:
        text = (
            "plan_p99_ms: the plan's p99 end to end (queueing + batch fill + inference + serving path); "
            "p99_ms: the p99 clients saw (SLI histogram, worst replica, last window); in_slo: share of those "
            "requests within the SLO; triton_ms: Triton's mean queue + compute time per request"
        )
        if client is not None:
            text += "; client_p99_ms / over_slo: p99 and share of requests over the SLO seen by the load (last 10 s)"
        blocks.append(text)
    endpoint_rows = [
        [w.name, r.replica, r.node_id, r.endpoint, r.http_endpoint or "-", r.metrics_endpoint or "-"]
        + ([r.backend or "-"] if wide else [])
        for w in s.workloads
        for r in w.replicas
        if r.endpoint
    ]
    if endpoint_rows and endpoints:
        headers = ["workload", "replica", "node", "grpc", "http", "metrics"] + (["backend"] if wide else [])
        blocks += ["", "endpoints (stable across share moves):", Tab(headers, endpoint_rows)]
    return blocks


def loop_lines(s: Any) -> list[str]:
    """The closed loop per workload (observed p99 against the plan's, error ratio, demand, guard), then its
    recent events."""
    lines = []
    for w in s.workloads:
        parts = []
        if w.HasField("observed_p99_ms"):
            verdict = "within" if w.observed_p99_ms <= w.slo_ms else "OVER"
            ratio = f", x{w.observed_p99_ms / w.predicted_p99_ms:.2f} of it" if w.predicted_p99_ms > 0 else ""
            parts.append(
                f"p99 {w.observed_p99_ms:.1f} ms {verdict} the SLO of {w.slo_ms:g} "
                f"(planned p99 {w.predicted_p99_ms:.1f}{ratio})"
            )
        if w.HasField("prediction_error_ratio"):
            parts.append(f"inference time observed/predicted {w.prediction_error_ratio:.2f}")
        if w.rate_auto:
            bounds = "".join((f" min {w.min_rps:g}" if w.min_rps else "", f" max {w.max_rps:g}" if w.max_rps else ""))
            parts.append(f"rate auto{bounds}: {w.demand or 'waiting'}")
        if w.guard:
            parts.append(f"guard ({w.guard_moves} move(s)): {w.guard}")
        if parts:
            lines.append(f"  {w.name}: " + "; ".join(parts))
    if lines:
        lines.insert(0, "closed loop:")
    if s.loop_events:
        lines += ["recent loop events:"] + [f"  {e}" for e in s.loop_events]
    return lines


def _print_blocks(blocks: Sequence[Block]) -> None:
    with LiveView() as view:
        view.show(blocks)


def run_status(args: argparse.Namespace) -> int:
    if args.watch is not None and args.watch <= 0:
        raise UserError(f"--watch must be a positive number of seconds, got {args.watch:g}")
    if not args.watch:
        reply = _call(args, lambda c: c.status())
        if args.json:
            emit(args, status_dict(reply))
        else:
            _print_blocks(status_blocks(reply, args.wide))
        return 0
    interrupt_on_signals()  # Ctrl-C ends the watch (exit 130), even when SIGINT was inherited ignored
    client = connect(args)  # one channel for the whole watch
    try:
        _watch_status(args, client)
    finally:
        client.close()
    return 0


def _watch_status(args: argparse.Namespace, client: Any) -> None:
    with LiveView() as view:
        shown: Any = None  # piped: the legend and endpoints print again only when they change
        while True:
            reply = _call(args, lambda c: c.status(), client=client)
            stamp = time.strftime("%H:%M:%S")
            if args.json:
                emit(args, {"time": stamp, **status_dict(reply)})
            else:
                key = endpoint_key(reply)
                again, shown = view.terminal or shown != key, key
                head = f"[{stamp}] every {args.watch:g}s, Ctrl-C stops"
                view.show([head, *status_blocks(reply, args.wide, legend=again, endpoints=again)])
            time.sleep(args.watch)


def endpoint_key(s: Any) -> tuple[tuple[str, ...], ...]:
    """What the endpoints table of a status shows (a live view prints it again when this changes)."""
    return tuple(
        (w.name, str(r.replica), r.node_id, r.endpoint, r.http_endpoint, r.backend)
        for w in s.workloads
        for r in w.replicas
    )


# ------------------------------------------------------------------ profiles


def run_profiles_upload(args: argparse.Namespace) -> int:
    text, source = read_text_input(args.file, "the profile")
    reply = _call(args, lambda c: c.upload_profile(text, args.gpu_type), source=source)
    nodes = _call(args, lambda c: c.list_nodes())
    warning = unmatched_gpu_type_warning({p.gpu_type for p in reply.profiles}, nodes)
    if args.json:
        emit(args, {**to_dict(reply), "warnings": [warning] if warning else []})
    else:
        print_table(["gpu_type", "model"], [[p.gpu_type, p.model] for p in reply.profiles])
    if warning:
        print(f"stoke: warning: {warning}", file=sys.stderr)
    return 0


def unmatched_gpu_type_warning(uploaded: set[str], nodes: Any) -> str:
    """ "" when a registered node has a device of every uploaded GPU type; else what to do, naming the types
    the nodes do have and where. A profile no device matches is stored, but plans nothing."""
    where: dict[str, list[str]] = {}
    for n in nodes.nodes:
        for d in n.devices:
            where.setdefault(d.gpu_type or d.name, []).append(f"{n.node_id}/{d.index}")
    missing = sorted(uploaded - set(where))
    if not missing:
        return ""
    have = "; ".join(
        f"{t} on {', '.join(sorted(ds)[:5])}{' ...' if len(ds) > 5 else ''}" for t, ds in sorted(where.items())
    )
    fix = (
        f"upload it again with --gpu-type {sorted(where)[0]}"
        if len(where) == 1
        else "upload it again with --gpu-type TYPE"
    )
    return (
        f"no registered node has a device of GPU type {', '.join(map(repr, missing))}, so no workload will be "
        f"planned with this profile; "
        + (
            f"the nodes' types: {have}; {fix} (or map device names to it with gpu_types[].match)"
            if where
            else "no node has registered yet: check that their devices map to this type (`stoke nodes` once they do)"
        )
    )


def _when(unix: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(unix))


def _active(p: Any) -> str:
    if not p.active_version:
        return "fitted" + (" (pinned)" if p.pinned else "")
    return f"v{p.active_version} x{p.correction:.3f}" + (" (pinned)" if p.pinned else "")


def profiles_blocks(reply: Any, versions: bool) -> list[Block]:
    blocks: list[Block] = [
        Tab(
            ["model", "gpu_type", "uploaded", "active", "recalibrated_versions"],
            [[p.model, p.gpu_type, _when(p.uploaded_unix), _active(p), p.versions] for p in reply.profiles],
        )
    ]
    if versions:
        rows = [
            [
                v.model,
                v.gpu_type,
                v.version,
                "*" if v.active else "",
                _when(v.created_unix),
                v.mode,
                f"x{v.correction:.3f}" + (f" / k5 x{v.correction_constant:.3f}" if v.mode == "refit" else ""),
                f"{v.evidence_windows:.1f}" if v.version else "-",
                v.reason,
            ]
            for v in reply.versions
        ]
        headers = ["model", "gpu_type", "version", "active", "created", "mode", "k_act", "windows", "reason"]
        blocks += ["", Tab(headers, rows)]
    return blocks


def run_profiles_ls(args: argparse.Namespace) -> int:
    reply = _call(args, lambda c: c.list_profiles(args.versions, args.model))
    if args.json:
        data = to_dict(reply)
        emit(args, data if args.versions else data["profiles"])
    else:
        _print_blocks(profiles_blocks(reply, args.versions))
    return 0


def run_profiles_rollback(args: argparse.Namespace) -> int:
    reply = _call(args, lambda c: c.rollback_profile(args.model, args.gpu_type, args.version))
    if args.json:
        emit(args, to_dict(reply)["profiles"])
    else:
        _print_blocks(profiles_blocks(reply, False))
    return 0


def run_profiles_resume(args: argparse.Namespace) -> int:
    reply = _call(args, lambda c: c.rollback_profile(args.model, args.gpu_type, resume=True))
    if args.json:
        emit(args, to_dict(reply)["profiles"])
    else:
        _print_blocks(profiles_blocks(reply, False))
    return 0


# ------------------------------------------------------------------ observations


def observations_blocks(reply: Any) -> list[Block]:
    rows = []
    for o in reply.observations:
        batches = " ".join(f"{b.batch}x{b.executions}" for b in o.batch_stats)
        rows.append(
            [
                time.strftime("%H:%M:%S", time.gmtime(o.unix)),
                f"{o.workload}#{o.replica}",
                f"{o.node_id}/{o.device}",
                o.share_pct,
                o.batch,
                o.rate_rps,
                batches or "-",
                o.queue_ms,
                o.observed_batch_ms or None,
                o.predicted_batch_ms or None,
                f"{o.error_ratio:.2f}" if o.error_ratio else "-",
                o.p99_ms if o.HasField("p99_ms") else None,
                f"{o.device_utilization_pct:.0f}%" if o.HasField("device_utilization_pct") else "-",
            ]
        )
    headers = [
        "time",
        "replica",
        "node/dev",
        "share_%",
        "batch",
        "rate_rps",
        "batches(size x n)",
        "queue_ms",
        "obs_infer_ms",
        "pred_infer_ms",
        "obs/pred",
        "p99_ms",
        "util",
    ]
    return [
        Tab(headers, rows),
        "",
        f"{reply.stored:,} window(s) stored (kept {reply.retention_s:g}s, at most {reply.max_rows:,}); "
        "obs_infer_ms / pred_infer_ms: one execution's inference time, observed / predicted by the active profile; "
        "p99_ms: the SLI's p99 of the window",
    ]


def run_observations(args: argparse.Namespace) -> int:
    if not 1 <= args.limit <= 10000:
        raise UserError(f"--limit must be in 1..10000, got {args.limit}")
    reply = _call(args, lambda c: c.list_observations(args.workload, args.limit))
    if args.json:
        emit(args, to_dict(reply))
    else:
        _print_blocks(observations_blocks(reply))
    return 0
