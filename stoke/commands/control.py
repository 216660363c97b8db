"""Client commands of a running controller: `stoke workload ...`, `stoke nodes`, `stoke status`,
`stoke profiles ...`, and `remote_plan` for `stoke plan --remote`.

They take `--controller HOST:PORT` (default $STOKE_CONTROLLER or
127.0.0.1:50051), `--token-file FILE` (default: $STOKE_TOKEN), `--tls-ca FILE`
(TLS with that CA; `--tls` for the system roots) and `--json`. The daemons
are in `stoke.commands.daemons`, the local demo in `stoke.commands.demo`.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stoke.errors import UserError
from stoke.table import render_table

DEFAULT_CONTROLLER = "127.0.0.1:50051"


# ------------------------------------------------------------------ registration


def client_args(p: argparse.ArgumentParser, json_help: str = "print JSON") -> None:
    p.add_argument(
        "--controller",
        metavar="HOST:PORT",
        default=os.environ.get("STOKE_CONTROLLER", DEFAULT_CONTROLLER),
        help="controller address (default $STOKE_CONTROLLER or %(default)s)",
    )
    p.add_argument("--token-file", metavar="FILE", help="bearer token file (default: $STOKE_TOKEN)")
    p.add_argument("--tls-ca", metavar="FILE", help="use TLS, trusting this CA certificate")
    p.add_argument("--tls", action="store_true", help="use TLS with the system's trusted roots")
    p.add_argument("--json", action="store_true", help=json_help)


def register(subparsers: argparse._SubParsersAction) -> None:
    w = subparsers.add_parser("workload", help="manage the workloads of a running controller")
    ws = w.add_subparsers(dest="workload_command", metavar="COMMAND", required=True)
    p = ws.add_parser("apply", help="create or update the workloads of a YAML file (all or nothing)")
    p.add_argument("-f", "--file", required=True, metavar="FILE", help="workloads YAML (see `stoke plan`)")
    client_args(p)
    p.set_defaults(run=run_workload_apply)
    p = ws.add_parser("rm", help="delete a workload")
    p.add_argument("name")
    client_args(p)
    p.set_defaults(run=run_workload_rm)
    p = ws.add_parser("ls", help="list the workloads")
    client_args(p)
    p.set_defaults(run=run_workload_ls)

    p = subparsers.add_parser("nodes", help="list the nodes: devices, health, last heartbeat, what runs there")
    client_args(p)
    p.set_defaults(run=run_nodes)

    p = subparsers.add_parser("status", help="per workload: planned share/batch/node, predicted vs observed")
    client_args(p)
    p.add_argument(
        "--watch",
        nargs="?",
        const=2.0,
        type=float,
        metavar="S",
        help="refresh every S seconds (default 2) until Ctrl-C",
    )
    p.set_defaults(run=run_status)

    pr = subparsers.add_parser("profiles", help="upload / list fitted profiles on a running controller")
    ps = pr.add_subparsers(dest="profiles_command", metavar="COMMAND", required=True)
    p = ps.add_parser("upload", help="upload a fitted profile (JSON from `stoke profile fit`)")
    p.add_argument("file")
    p.add_argument("--gpu-type", default="", help="store under this GPU type (default: the profile's gpu.name)")
    client_args(p)
    p.set_defaults(run=run_profiles_upload)
    p = ps.add_parser("ls", help="list the fitted profiles per (model, GPU type)")
    client_args(p)
    p.set_defaults(run=run_profiles_ls)


# ------------------------------------------------------------------ client helpers


def connect(args: argparse.Namespace) -> Any:
    from controller.api.auth import read_token
    from controller.api.client import ControllerClient

    token = read_token(getattr(args, "token_file", None))
    return ControllerClient(
        args.controller, token=token, tls_ca=getattr(args, "tls_ca", None), tls=bool(getattr(args, "tls", False))
    )


def _call(args: argparse.Namespace, fn: Callable[[Any], Any], source: str = "") -> Any:
    """Call the controller; its refusals become one line that says what to do (the fix depends on the call)."""
    from controller.messages import ApiError, FailedPrecondition, InvalidArgument, Unauthenticated, Unavailable

    client = connect(args)
    try:
        return fn(client)
    except Unavailable as err:
        raise UserError(f"{err}; start it with `stoke controller` or pass --controller HOST:PORT") from None
    except Unauthenticated as err:
        raise UserError(
            f"controller {args.controller} refused the call ({err}); pass --token-file FILE or set $STOKE_TOKEN"
        ) from None
    except (InvalidArgument, FailedPrecondition) as err:
        raise UserError(f"{source + ': ' if source else ''}{err}") from None
    except ApiError as err:
        raise UserError(f"controller {args.controller}: {err}") from None
    finally:
        client.close()


#: int64 fields, which proto3 JSON writes as strings; `--json` prints them as numbers.
_INT64_FIELDS = {"revision", "memory_bytes", "failures", "success", "applied_revision"}


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


def _ago(seconds: float) -> str:
    return f"{seconds:.1f}s ago" if seconds < 120 else f"{seconds / 60:.0f}m ago"


# ------------------------------------------------------------------ workloads


def run_workload_apply(args: argparse.Namespace) -> int:
    from controller.workload_file import read_workloads

    workloads = read_workloads(args.file)  # its gpu_types are ignored: the controller's nodes are the inventory
    reply = _call(args, lambda c: c.apply_workloads(workloads), source=args.file)
    if args.json:
        print(json.dumps(to_dict(reply), indent=2))
    else:
        rows = (
            [[n, "created"] for n in reply.created]
            + [[n, "updated"] for n in reply.updated]
            + [[n, "unchanged"] for n in reply.unchanged]
        )
        print(render_table(["workload", "result"], rows))
    return 0


def run_workload_rm(args: argparse.Namespace) -> int:
    deleted = _call(args, lambda c: c.delete_workload(args.name))
    if args.json:
        print(json.dumps({"name": args.name, "deleted": deleted}))
    elif deleted:
        print(f"workload {args.name} deleted")
    else:
        raise UserError(f"workload {args.name!r} does not exist; see `stoke workload ls`")
    return 0


def run_workload_ls(args: argparse.Namespace) -> int:
    workloads = _call(args, lambda c: c.list_workloads())
    if args.json:
        print(
            json.dumps(
                [
                    {
                        "name": w.name,
                        "model": w.model,
                        "slo_ms": w.slo_ms,
                        "rate_rps": w.rate_rps,
                        "gpu_type": w.gpu_type,
                    }
                    for w in workloads
                ],
                indent=2,
            )
        )
    else:
        print(
            render_table(
                ["workload", "model", "slo_ms", "rate_rps", "gpu_type"],
                [[w.name, w.model, w.slo_ms, w.rate_rps, w.gpu_type or "any"] for w in workloads],
            )
        )
    return 0


# ------------------------------------------------------------------ plan (for `stoke plan --remote`)


def format_remote_plan(plan: Any) -> str:
    head = (
        f"plan revision {plan.revision} ({plan.strategy}): {len(plan.gpus)} device(s), ${plan.cost_per_hour:,.2f}/hour"
    )
    rows = []
    for g in plan.gpus:
        where = f"{g.node_id}/{g.device}" if g.node_id else "(no free device)"
        for p in g.placements:
            rows.append(
                [
                    where,
                    g.gpu_type,
                    p.workload,
                    f"{p.replica + 1}/{p.replicas}" if p.replicas > 1 else "",
                    p.model,
                    p.slo_ms,
                    p.rate_rps,
                    p.share_pct,
                    p.batch,
                    p.queue_delay_ms,
                    p.predicted_latency_ms,
                ]
            )
    lines = [
        head,
        "",
        render_table(
            [
                "node/device",
                "type",
                "workload",
                "replica",
                "model",
                "slo_ms",
                "rate_rps",
                "share_%",
                "batch",
                "queue_ms",
                "pred_ms",
            ],
            rows,
        ),
    ]
    lines += [f"pending: {p.workload}: {p.reason}" for p in plan.pending]
    lines += [f"note: {n}" for n in plan.notes]
    return "\n".join(lines)


def remote_plan(args: argparse.Namespace) -> int:
    """`stoke plan --remote`: the controller's applied plan (`--preview`: solve now without acting)."""
    args.tls_ca = getattr(args, "tls_ca", None)
    preview = bool(getattr(args, "preview", False))
    reply = _call(args, lambda c: c.preview_plan() if preview else c.get_plan())
    if args.json:
        print(json.dumps(to_dict(reply.plan), indent=2))
    else:
        print(format_remote_plan(reply.plan))
    return 0


# ------------------------------------------------------------------ nodes and status


def format_nodes(reply: Any) -> str:
    from controller.messages import Replica

    rows = []
    for n in reply.nodes:
        devices = ", ".join(f"{d.index}:{d.gpu_type or d.name}" for d in n.devices)
        running = ", ".join(str(Replica(a.workload, a.replica)) for a in n.running) or "-"
        rows.append(
            [n.node_id, n.state, devices, _ago(n.seconds_since_heartbeat), len(n.assigned), running, n.applied_revision]
        )
    out = render_table(["node", "state", "devices", "heartbeat", "assigned", "running", "revision"], rows)
    events = [f"  {n.node_id}: {e}" for n in reply.nodes for e in list(n.events)[-3:]]
    return out + ("\n\nrecent events:\n" + "\n".join(events) if events else "")


def run_nodes(args: argparse.Namespace) -> int:
    reply = _call(args, lambda c: c.list_nodes())
    print(json.dumps(to_dict(reply)["nodes"], indent=2) if args.json else format_nodes(reply))
    return 0


def format_status(s: Any) -> str:
    rows = []
    for w in s.workloads:
        nodes = ",".join(sorted({f"{r.node_id}/{r.device}" for r in w.replicas})) or "-"
        share = sum(r.share_pct for r in w.replicas) if w.replicas else None
        batch = "/".join(str(r.batch) for r in w.replicas) or "-"
        rows.append(
            [
                w.name,
                w.model,
                w.state,
                nodes,
                share,
                batch,
                w.slo_ms,
                w.predicted_latency_ms if w.replicas else None,
                w.observed_latency_ms if w.observed else None,
                w.rate_rps,
                sum(r.observed_rate_rps for r in w.replicas) if any(r.observed for r in w.replicas) else None,
                f"{w.slo_attainment:.0%}" if w.observed else "-",
            ]
        )
    head = (
        f"plan revision {s.revision}: {s.gpus_in_use} device(s), ${s.cost_per_hour:,.2f}/hour; "
        f"nodes ready {s.nodes_ready}, lost {s.nodes_lost}"
    )
    lines = [
        head,
        "",
        render_table(
            [
                "workload",
                "model",
                "state",
                "node/dev",
                "share_%",
                "batch",
                "slo_ms",
                "pred_ms",
                "obs_ms",
                "rate_rps",
                "obs_rps",
                "slo_ok",
            ],
            rows,
        ),
    ]
    lines += [f"{w.name}: {w.reason}" for w in s.workloads if w.reason and w.state != "serving"]
    if s.last_error:
        lines.append(f"last reconcile error: {s.last_error}")
    lines.append(
        "pred_ms: worst predicted latency (batch wait + inference); obs_ms: mean queue + compute "
        "time reported by Triton; slo_ok: observed replicas within the SLO"
    )
    return "\n".join(lines)


def run_status(args: argparse.Namespace) -> int:
    while True:
        reply = _call(args, lambda c: c.status())
        if args.json:
            print(json.dumps(to_dict(reply), indent=2), flush=True)
        else:
            if args.watch:
                print("\033[2J\033[H", end="")
            print(format_status(reply), flush=True)
        if not args.watch:
            return 0
        time.sleep(args.watch)


# ------------------------------------------------------------------ profiles


def run_profiles_upload(args: argparse.Namespace) -> int:
    try:
        text = Path(args.file).read_text()
    except OSError as err:
        raise UserError(f"{args.file}: cannot read the profile ({err.strerror})") from None
    reply = _call(args, lambda c: c.upload_profile(text, args.gpu_type), source=args.file)
    if args.json:
        print(json.dumps(to_dict(reply), indent=2))
    else:
        print(render_table(["gpu_type", "model"], [[p.gpu_type, p.model] for p in reply.profiles]))
    return 0


def run_profiles_ls(args: argparse.Namespace) -> int:
    reply = _call(args, lambda c: c.list_profiles())
    if args.json:
        print(json.dumps(to_dict(reply)["profiles"], indent=2))
    else:
        print(
            render_table(
                ["model", "gpu_type", "uploaded"],
                [
                    [p.model, p.gpu_type, time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(p.uploaded_unix))]
                    for p in reply.profiles
                ],
            )
        )
    return 0
