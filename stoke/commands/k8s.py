"""`stoke k8s render | operator | bootstrap`: stoke on Kubernetes (see `deploy` and README "Kubernetes")."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from foundation import validate as check
from foundation.errors import UserError
from stoke.client_options import add_client_options, controller_address
from stoke.commands.inputs import warn_unused_gpu_types

#: How to mend a --namespace that is not a Kubernetes name.
NAMESPACE_FIX = "give --namespace a lower-case name, e.g. --namespace ml-serving"


def register(subparsers: argparse._SubParsersAction) -> None:
    from deploy.options import RenderOptions

    defaults = RenderOptions()
    k8s = subparsers.add_parser(
        "k8s", help="stoke on Kubernetes: render the installation, run the operator, bootstrap an agent"
    )
    sub = k8s.add_subparsers(dest="k8s_command", metavar="COMMAND", required=True)

    p = sub.add_parser(
        "render",
        help="write the installation as a kustomize base (CRD, RBAC, controller, operator, agent DaemonSet, ...)",
        description="Write the Kubernetes installation of stoke to DIR as a kustomize base: `kubectl apply -k DIR`. "
        "DIR/monitoring is a second base for clusters with the Prometheus operator. Files whose bytes do not "
        "change are left alone.",
    )
    p.add_argument("-o", "--output", required=True, metavar="DIR", help="directory to write (created)")
    p.add_argument(
        "--workloads", metavar="FILE", help="also render StokeWorkloads and SLO rules for this workload file"
    )
    p.add_argument("--namespace", default=defaults.namespace, help="namespace (default %(default)s)")
    p.add_argument(
        "--image",
        default=defaults.image,
        metavar="IMAGE",
        help="stoke's container image, [REGISTRY[:PORT]/]PATH[:TAG][@DIGEST] (default %(default)s)",
    )
    p.add_argument(
        "--repo",
        default=defaults.repository,
        help="Triton model repository of the agents: a path in their image or s3://bucket/path (default %(default)s)",
    )
    p.add_argument(
        "--gpu-node-label",
        action="append",
        metavar="KEY=VALUE",
        help="node label of the GPU nodes the agents run on (repeatable; default nvidia.com/gpu.present=true)",
    )
    p.add_argument(
        "--runtime-class",
        default=defaults.runtime_class,
        help="RuntimeClass giving the agent pod the node's GPUs (default %(default)s)",
    )
    p.add_argument("--gpu-type", default="", help="the GPU nodes' GPU type (default: left to the controller)")
    p.add_argument("--agent-ports", default=defaults.agent_ports, help="router port range (default %(default)s)")
    p.add_argument("--db-storage", default=defaults.db_storage, help="controller DB volume size (default %(default)s)")
    p.add_argument("--storage-class", default="", help="StorageClass of the DB volume (default: the cluster's)")
    p.set_defaults(run=run_render)

    p = sub.add_parser(
        "operator",
        help="run the StokeWorkload operator (kopf) against the cluster of $KUBECONFIG or its service account",
        description="Reconcile the StokeWorkloads of --namespace into the controller: apply, status, a Service per "
        "workload routed to the node routers serving it; delete through a finalizer. Also serves the agents' "
        "node-token bootstrap on --bootstrap-listen. Needs the admin token (--token-file / $STOKE_TOKEN).",
    )
    add_client_options(p)
    p.add_argument("--namespace", default=defaults.namespace, help="namespace to watch (default %(default)s)")
    p.add_argument("--refresh", type=float, default=5.0, metavar="S", help="status refresh period (default 5)")
    p.add_argument("--liveness", metavar="URL", help="kopf's liveness endpoint, e.g. http://0.0.0.0:8080/healthz")
    p.add_argument(
        "--bootstrap-listen", default="", metavar="HOST:PORT", help="serve the agents' bootstrap here (default off)"
    )
    p.add_argument("--log-level", default="INFO", help="logging level (default %(default)s)")
    p.set_defaults(run=run_operator)

    p = sub.add_parser(
        "bootstrap",
        help="(an agent pod's init container) trade the pod's ServiceAccount token for its node's agent token",
    )
    p.add_argument("--operator", required=True, metavar="URL", help="the operator's bootstrap URL")
    p.add_argument("--service-account-token", required=True, metavar="FILE", help="the projected ServiceAccount token")
    p.add_argument("--token-file", required=True, metavar="FILE", help="where to write the node token (0600)")
    p.add_argument("--timeout", type=float, default=120.0, metavar="S", help="give up after S seconds (default 120)")
    p.set_defaults(run=run_bootstrap)


def _labels(items: list[str] | None) -> tuple[tuple[str, str], ...] | None:
    if not items:
        return None
    out = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UserError(f"--gpu-node-label {item!r} must be KEY=VALUE, e.g. nvidia.com/gpu.present=true")
        out.append((key, value))
    return tuple(out)


def run_render(args: argparse.Namespace) -> int:
    from deploy.crd import kubernetes_name
    from deploy.manifests import render, write
    from deploy.options import RenderOptions, parse_image
    from planner.workload_file import read_workloads_and_type_names

    parse_image(args.image)
    workloads, gpu_types = read_workloads_and_type_names(args.workloads) if args.workloads else ((), ())
    warn_unused_gpu_types(
        args.workloads,
        gpu_types,
        "carried into the manifests",
        ". Give their prices and device-name matches in controller.yaml's gpu_types, and their profiles with "
        '`stoke profiles upload` (README, "Controller configuration")',
    )
    for w in workloads:
        kubernetes_name(w.name, f"{args.workloads}: workload name")
    options = RenderOptions(
        namespace=kubernetes_name(args.namespace, "--namespace", NAMESPACE_FIX),
        image=args.image,
        repository=args.repo,
        gpu_node_selector=_labels(args.gpu_node_label) or RenderOptions().gpu_node_selector,
        runtime_class=args.runtime_class,
        gpu_type=args.gpu_type,
        agent_ports=args.agent_ports,
        db_storage=args.db_storage,
        storage_class=args.storage_class,
    )
    directory = Path(args.output)
    try:
        written = write(directory, render(workloads, options))
    except OSError as err:
        raise UserError(f"-o {directory}: cannot write ({err.strerror}); check the path and its permissions") from None
    for path, changed in written:
        print(f"{path}: {'written' if changed else 'unchanged'}", file=sys.stderr)
    print(f"apply with: kubectl apply -k {directory}   (monitoring: kubectl apply -k {directory / 'monitoring'})")
    return 0


def run_operator(args: argparse.Namespace) -> int:
    from controller.api.auth import read_token
    from deploy.crd import kubernetes_name
    from deploy.operator import OperatorConfig, run

    kubernetes_name(args.namespace, "--namespace", NAMESPACE_FIX)
    check.address(args.bootstrap_listen, "--bootstrap-listen", error=UserError, any_port=True, allow_empty=True)

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = OperatorConfig(
        controller=controller_address(args),
        token=read_token(args.token_file),
        namespace=args.namespace,
        tls_ca=args.tls_ca,
        tls=args.tls,
        refresh_s=args.refresh,
        bootstrap_listen=args.bootstrap_listen,
    )
    run(config, liveness=args.liveness)
    return 0


def run_bootstrap(args: argparse.Namespace) -> int:
    from deploy.bootstrap import fetch_node_token

    node = fetch_node_token(
        args.operator, Path(args.service_account_token), Path(args.token_file), timeout_s=args.timeout
    )
    print(f"agent token of node {node} written to {args.token_file}", file=sys.stderr)
    return 0
