"""`stoke k8s render`: the whole installation as a kustomize base (plain YAML, one file per part).

    DIR/kustomization.yaml      the base: `kubectl apply -k DIR` (namespace, image and labels set here)
    DIR/namespace.yaml
    DIR/crd.yaml                the StokeWorkload CustomResourceDefinition (`deploy.crd`)
    DIR/rbac.yaml               service accounts; the operator's Role and ClusterRole (least privilege)
    DIR/controller.yaml         config, StatefulSet (a volume for its SQLite DB), Service (gRPC, metrics)
    DIR/operator.yaml           Deployment and Service (node-credential bootstrap)
    DIR/agent.yaml              DaemonSet on GPU nodes: the agent, its MPS control daemon, its Triton servers
    DIR/dashboard.yaml          the Grafana dashboard in a ConfigMap (Grafana's sidecar picks it up by label)
    DIR/workloads.yaml          StokeWorkloads of --workloads FILE (only with it)
    DIR/monitoring/             ServiceMonitor and PrometheusRule (needs the Prometheus operator's CRDs:
                                a separate base, `kubectl apply -k DIR/monitoring`)

Everything is deterministic and built as plain dicts (no templates), so a test validates each manifest
against the pinned Kubernetes schemas. `RenderOptions` holds every parameter; the README lists them.

Credentials: the controller and the operator read the admin token from the Secret `stoke-admin-token`
(key `token`), which the installer creates: no secret value is ever rendered. Agents hold no shared
secret: each agent pod's init container exchanges its projected ServiceAccount token (audience
`stoke-bootstrap`, 10 minutes, bound to its pod and node) at the operator for a token of its own node
(`deploy.bootstrap`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from deploy import crd
from deploy.alerts import SloOptions, grafana_dashboard, prometheus_rules
from deploy.options import RenderOptions, parse_image
from foundation.files import atomic_write_text
from planner.solver import Workload

CONTROLLER_PORT = 50051
METRICS_PORT = 9470
OPERATOR_HEALTH_PORT = 8080
BOOTSTRAP_PORT = 8081
BOOTSTRAP_AUDIENCE = "stoke-bootstrap"
AGENT_EXPORTER_PORT = 9471
ADMIN_SECRET = "stoke-admin-token"
PART_OF = {"app.kubernetes.io/part-of": "stoke"}


def _labels(component: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": f"stoke-{component}", "app.kubernetes.io/component": component, **PART_OF}


def _meta(name: str, component: str, options: RenderOptions, **extra: Any) -> dict[str, Any]:
    return {"name": name, "namespace": options.namespace, "labels": _labels(component), **extra}


def _selector(component: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": f"stoke-{component}"}


_RESTRICTED = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "runAsNonRoot": True,
    "runAsUser": 1000,
    "runAsGroup": 1000,
    "seccompProfile": {"type": "RuntimeDefault"},
}


def namespace(options: RenderOptions) -> list[dict[str, Any]]:
    return [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": options.namespace, "labels": PART_OF}}]


def rbac(options: RenderOptions) -> list[dict[str, Any]]:
    """Service accounts and the operator's rights: nothing more than what its handlers call.

    The controller and the agents call no Kubernetes API (their service accounts have no role; the
    agents' account only gives their pods an identity for the bootstrap). The operator watches and
    patches StokeWorkloads, owns one Service and one EndpointSlice per workload, records Events,
    and reviews the agents' bootstrap tokens (cluster-scoped: TokenReview has no namespace).
    """
    ns = options.namespace
    accounts: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(f"stoke-{c}", c, options)}
        for c in ("controller", "operator", "agent")
    ]
    for account in accounts:  # only the operator needs a token to call the API server
        account["automountServiceAccountToken"] = account["metadata"]["name"] == "stoke-operator"
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": _meta("stoke-operator", "operator", options),
        "rules": [
            {"apiGroups": [crd.GROUP], "resources": [crd.PLURAL], "verbs": ["get", "list", "watch", "patch"]},
            {"apiGroups": [crd.GROUP], "resources": [f"{crd.PLURAL}/status"], "verbs": ["get", "patch"]},
            {"apiGroups": [""], "resources": ["services"], "verbs": ["get", "list", "create", "patch", "delete"]},
            {
                "apiGroups": ["discovery.k8s.io"],
                "resources": ["endpointslices"],
                "verbs": ["get", "list", "create", "patch", "delete"],
            },
            {"apiGroups": ["", "events.k8s.io"], "resources": ["events"], "verbs": ["create"]},
        ],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": _meta("stoke-operator", "operator", options),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "stoke-operator"},
        "subjects": [{"kind": "ServiceAccount", "name": "stoke-operator", "namespace": ns}],
    }
    cluster_name = f"stoke-operator-{ns}"
    cluster_role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": cluster_name, "labels": _labels("operator")},
        "rules": [
            # the agents' bootstrap tokens (kopf lists no namespaces and no CRDs: its scanning is off)
            {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]},
        ],
    }
    cluster_binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": cluster_name, "labels": _labels("operator")},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": cluster_name},
        "subjects": [{"kind": "ServiceAccount", "name": "stoke-operator", "namespace": ns}],
    }
    return [*accounts, role, binding, cluster_role, cluster_binding]


def _admin_token_volume() -> dict[str, Any]:
    return {
        "name": "admin-token",
        "secret": {"secretName": ADMIN_SECRET, "defaultMode": 0o400, "items": [{"key": "token", "path": "token"}]},
    }


def _container(name: str, options: RenderOptions, args: list[str], **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "image": options.image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["stoke"],
        "args": args,
        **extra,
    }


def controller(options: RenderOptions) -> list[dict[str, Any]]:
    """The controller: one replica (its SQLite DB is its state), a volume for the DB, gRPC + metrics Service."""
    config = {
        "listen": f"0.0.0.0:{CONTROLLER_PORT}",
        "metrics_listen": f"0.0.0.0:{METRICS_PORT}",
        "db": "/var/lib/stoke/controller.db",
        "token_file": "/etc/stoke/admin/token",
    }
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta("stoke-controller", "controller", options),
        "data": {"controller.yaml": yaml.safe_dump(config, sort_keys=False)},
    }
    grpc_probe = {"grpc": {"port": CONTROLLER_PORT}, "periodSeconds": 10, "timeoutSeconds": 3}
    container = _container(
        "controller",
        options,
        ["controller", "--config", "/etc/stoke/config/controller.yaml"],
        ports=[
            {"name": "grpc", "containerPort": CONTROLLER_PORT},
            {"name": "metrics", "containerPort": METRICS_PORT},
        ],
        startupProbe={**grpc_probe, "failureThreshold": 30},
        livenessProbe={**grpc_probe, "failureThreshold": 3},
        readinessProbe={**grpc_probe, "failureThreshold": 1},
        resources={"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"memory": "2Gi"}},
        securityContext={**_RESTRICTED, "readOnlyRootFilesystem": True},
        volumeMounts=[
            {"name": "data", "mountPath": "/var/lib/stoke"},
            {"name": "config", "mountPath": "/etc/stoke/config", "readOnly": True},
            {"name": "admin-token", "mountPath": "/etc/stoke/admin", "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
    )
    claim: dict[str, Any] = {
        "metadata": {"name": "data"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": options.db_storage}}},
    }
    if options.storage_class:
        claim["spec"]["storageClassName"] = options.storage_class
    stateful_set = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": _meta("stoke-controller", "controller", options),
        "spec": {
            "serviceName": "stoke-controller",
            "replicas": 1,  # one writer of the DB; a restart rebuilds the actual state from the agents
            "selector": {"matchLabels": _selector("controller")},
            "template": {
                "metadata": {"labels": _labels("controller")},
                "spec": {
                    "serviceAccountName": "stoke-controller",
                    "automountServiceAccountToken": False,
                    "securityContext": {"fsGroup": 1000},
                    "containers": [container],
                    "volumes": [
                        {"name": "config", "configMap": {"name": "stoke-controller"}},
                        _admin_token_volume(),
                        {"name": "tmp", "emptyDir": {}},
                    ],
                },
            },
            "volumeClaimTemplates": [claim],
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta("stoke-controller", "controller", options),
        "spec": {
            "selector": _selector("controller"),
            "ports": [
                {"name": "grpc", "port": CONTROLLER_PORT, "targetPort": "grpc", "appProtocol": "grpc"},
                {"name": "metrics", "port": METRICS_PORT, "targetPort": "metrics"},
            ],
        },
    }
    return [config_map, stateful_set, service]


def controller_address(options: RenderOptions) -> str:
    return f"stoke-controller.{options.namespace}.svc:{CONTROLLER_PORT}"


def operator(options: RenderOptions) -> list[dict[str, Any]]:
    """The operator: one replica (kopf's peering is off: a Deployment of one), its health and bootstrap ports."""
    container = _container(
        "operator",
        options,
        [
            "k8s",
            "operator",
            "--controller",
            controller_address(options),
            "--token-file",
            "/etc/stoke/admin/token",
            "--namespace",
            options.namespace,
            "--liveness",
            f"http://0.0.0.0:{OPERATOR_HEALTH_PORT}/healthz",
            "--bootstrap-listen",
            f"0.0.0.0:{BOOTSTRAP_PORT}",
        ],
        ports=[
            {"name": "health", "containerPort": OPERATOR_HEALTH_PORT},
            {"name": "bootstrap", "containerPort": BOOTSTRAP_PORT},
        ],
        livenessProbe={
            "httpGet": {"path": "/healthz", "port": "health"},
            "initialDelaySeconds": 10,
            "periodSeconds": 15,
            "timeoutSeconds": 5,
        },
        readinessProbe={"tcpSocket": {"port": "bootstrap"}, "periodSeconds": 10},
        resources={"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "512Mi"}},
        securityContext={**_RESTRICTED, "readOnlyRootFilesystem": True},
        volumeMounts=[
            {"name": "admin-token", "mountPath": "/etc/stoke/admin", "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
    )
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta("stoke-operator", "operator", options),
        "spec": {
            "replicas": 1,
            "strategy": {"type": "Recreate"},  # never two operators at once
            "selector": {"matchLabels": _selector("operator")},
            "template": {
                "metadata": {"labels": _labels("operator")},
                "spec": {
                    "serviceAccountName": "stoke-operator",
                    "containers": [container],
                    "volumes": [_admin_token_volume(), {"name": "tmp", "emptyDir": {}}],
                },
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta("stoke-operator", "operator", options),
        "spec": {
            "selector": _selector("operator"),
            "ports": [{"name": "bootstrap", "port": BOOTSTRAP_PORT, "targetPort": "bootstrap"}],
        },
    }
    return [deployment, service]


def agent(options: RenderOptions) -> list[dict[str, Any]]:
    """The agent on every GPU node: it owns the node's GPUs, runs their MPS control daemon and Triton.

    - GPUs: the NVIDIA container runtime (`runtimeClassName`, NVIDIA_VISIBLE_DEVICES=all) gives the
      pod every GPU of the node; the nodes are stoke's alone (no device plugin hands them out too).
    - MPS: the agent starts `nvidia-cuda-mps-control -d` itself (`stoke agent --mps`), so the control
      daemon, its MPS server and every Triton client are processes of one container: they share its
      IPC namespace and its /tmp pipe directory, and run under one user, which MPS requires of its
      clients. hostIPC is therefore not set; it would be needed only with the daemon in another pod
      (the device plugin's layout).
    - Non-root: all of it runs as uid 1000 (MPS needs no root; setting the GPUs' compute mode to
      EXCLUSIVE_PROCESS, advisable with MPS, is a node set-up step: see the README).
    - Credentials: the init container trades the pod's projected ServiceAccount token for a token
      of its own node (`stoke k8s bootstrap`), written to a memory-backed volume only this pod sees.
    """
    token_dir = "/run/stoke/agent"
    sa_token = "/var/run/secrets/stoke/bootstrap/token"
    env = [
        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
    ]
    bootstrap = _container(
        "bootstrap",
        options,
        [
            "k8s",
            "bootstrap",
            "--operator",
            f"http://stoke-operator.{options.namespace}.svc:{BOOTSTRAP_PORT}",
            "--service-account-token",
            sa_token,
            "--token-file",
            f"{token_dir}/token",
        ],
        resources={"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "128Mi"}},
        securityContext={**_RESTRICTED, "readOnlyRootFilesystem": True},
        volumeMounts=[
            {"name": "agent-token", "mountPath": token_dir},
            {"name": "bootstrap-token", "mountPath": "/var/run/secrets/stoke/bootstrap", "readOnly": True},
        ],
    )
    agent_args = [
        "agent",
        "--mps",  # the agent starts its node's MPS control daemon, and stops it on exit
        "--controller",
        controller_address(options),
        "--token-file",
        f"{token_dir}/token",
        "--node-id",
        "$(NODE_NAME)",
        "--device",
        "nvml",
        "--repo",
        options.repository,
        "--bind",
        "0.0.0.0",
        "--advertise",
        "$(POD_IP)",
        "--ports",
        options.agent_ports,
        "--workdir",
        "/var/lib/stoke/agent",
        "--metrics-port",
        str(AGENT_EXPORTER_PORT),
    ]
    if options.gpu_type:
        agent_args += ["--gpu-type", options.gpu_type]
    exporter_probe = {
        "exec": {
            "command": [
                "python",
                "-c",
                f"import urllib.request; urllib.request.urlopen('http://127.0.0.1:{AGENT_EXPORTER_PORT}/metrics', "
                "timeout=3)",
            ]
        },
        "periodSeconds": 15,
        "timeoutSeconds": 5,
    }
    main = {
        "name": "agent",
        "image": options.image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["stoke"],
        "args": agent_args,
        "env": [
            *env,
            {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
            {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "compute,utility"},
            {"name": "CUDA_MPS_PIPE_DIRECTORY", "value": "/tmp/nvidia-mps"},
            {"name": "CUDA_MPS_LOG_DIRECTORY", "value": "/tmp/nvidia-log"},
        ],
        "startupProbe": {**exporter_probe, "failureThreshold": 20},
        "livenessProbe": {**exporter_probe, "failureThreshold": 4},
        "readinessProbe": {**exporter_probe, "failureThreshold": 1},
        "resources": {"requests": {"cpu": "2", "memory": "8Gi"}},
        "securityContext": _RESTRICTED,
        "volumeMounts": [
            {"name": "agent-token", "mountPath": token_dir, "readOnly": True},
            {"name": "state", "mountPath": "/var/lib/stoke/agent"},
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "shm", "mountPath": "/dev/shm"},
        ],
    }
    daemon_set = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": _meta("stoke-agent", "agent", options),
        "spec": {
            "selector": {"matchLabels": _selector("agent")},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
            "template": {
                "metadata": {"labels": _labels("agent")},
                "spec": {
                    "serviceAccountName": "stoke-agent",
                    "automountServiceAccountToken": False,
                    "runtimeClassName": options.runtime_class,
                    "nodeSelector": dict(options.gpu_node_selector),
                    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                    "terminationGracePeriodSeconds": 60,  # the agent drains its routers and stops Triton
                    "securityContext": {"fsGroup": 1000},
                    "initContainers": [bootstrap],
                    "containers": [main],
                    "volumes": [
                        {"name": "agent-token", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
                        {
                            "name": "bootstrap-token",
                            "projected": {
                                "sources": [
                                    {
                                        "serviceAccountToken": {
                                            "audience": BOOTSTRAP_AUDIENCE,
                                            "expirationSeconds": 600,
                                            "path": "token",
                                        }
                                    }
                                ]
                            },
                        },
                        # the agent's workdir and pid ledger: kept across container restarts (its Triton
                        # processes die with the container, so nothing needs to outlive the pod; no hostPath)
                        {"name": "state", "emptyDir": {}},
                        {"name": "tmp", "emptyDir": {}},
                        {"name": "shm", "emptyDir": {"medium": "Memory"}},
                    ],
                },
            },
        },
    }
    return [daemon_set]


def dashboard(workloads: Sequence[Workload], options: RenderOptions) -> list[dict[str, Any]]:
    """The Grafana dashboard stoke generates, in a ConfigMap labelled for Grafana's dashboard sidecar."""
    board = grafana_dashboard(workloads or (_PLACEHOLDER,), SloOptions())
    return [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                **_meta("stoke-dashboard", "monitoring", options),
                "labels": {**_labels("monitoring"), "grafana_dashboard": "1"},
            },
            "data": {"stoke.json": json.dumps(board, indent=2, sort_keys=True) + "\n"},
        }
    ]


#: The dashboard reads every workload through a variable; it needs a workload only to be built.
_PLACEHOLDER = Workload(name="workload", model="model", slo_ms=100.0, rate_rps=1.0)


def monitoring(workloads: Sequence[Workload], options: RenderOptions) -> list[dict[str, Any]]:
    """ServiceMonitor for the controller's metrics; PrometheusRule with the SLO rules of `stoke alerts`."""
    docs: list[dict[str, Any]] = [
        {
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "ServiceMonitor",
            "metadata": _meta("stoke-controller", "monitoring", options),
            "spec": {
                "selector": {"matchLabels": _selector("controller")},
                "endpoints": [{"port": "metrics", "interval": "15s"}],
            },
        }
    ]
    if workloads:
        docs.append(
            {
                "apiVersion": "monitoring.coreos.com/v1",
                "kind": "PrometheusRule",
                "metadata": _meta("stoke-slo", "monitoring", options),
                "spec": prometheus_rules(workloads),
            }
        )
    return docs


def kustomization(resources: Sequence[str], options: RenderOptions) -> dict[str, Any]:
    name, tag, digest = parse_image(options.image)
    image: dict[str, Any] = {"name": name}
    if tag:
        image["newTag"] = tag
    if digest:
        image["digest"] = digest
    return {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "namespace": options.namespace,
        "resources": list(resources),
        # `kustomize edit set image NAME=REGISTRY/stoke:TAG` changes every container's image at once
        "images": [image],
    }


def render(workloads: Sequence[Workload], options: RenderOptions | None = None) -> dict[str, list[dict[str, Any]]]:
    """Every file of the installation as path -> its manifests (deterministic; `write` puts them on disk)."""
    options = options or RenderOptions()
    files: dict[str, list[dict[str, Any]]] = {
        "namespace.yaml": namespace(options),
        "crd.yaml": [crd.crd_manifest()],
        "rbac.yaml": rbac(options),
        "controller.yaml": controller(options),
        "operator.yaml": operator(options),
        "agent.yaml": agent(options),
        "dashboard.yaml": dashboard(workloads, options),
    }
    if workloads:
        files["workloads.yaml"] = [crd.resource_manifest(w, options.namespace) for w in workloads]
    files["kustomization.yaml"] = [kustomization(list(files), options)]
    files["monitoring/monitoring.yaml"] = monitoring(workloads, options)
    files["monitoring/kustomization.yaml"] = [kustomization(["monitoring.yaml"], options)]
    return files


HEADER = "# Generated by `stoke k8s render`; edit with kustomize overlays rather than by hand.\n"


def dump(manifests: Sequence[dict[str, Any]]) -> str:
    return HEADER + yaml.safe_dump_all(manifests, sort_keys=False, default_flow_style=False, width=120)


def write(directory: Path, files: dict[str, list[dict[str, Any]]]) -> list[tuple[Path, bool]]:
    """Write each file (atomically; unchanged bytes are left alone); (path, changed) per file."""
    out = []
    for name, manifests in files.items():
        path = directory / name
        path.parent.mkdir(parents=True, exist_ok=True)
        out.append((path, atomic_write_text(path, dump(manifests))))
    return out
