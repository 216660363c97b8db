"""Render a training plan as Kubernetes objects (plain dicts). Pure.

Parameter servers and workers become standard objects a user can apply to an
existing cluster: one headless Service + StatefulSet for the PS, and one per
worker instance type (pinned to that type with the well-known
`node.kubernetes.io/instance-type` label, asking for its GPUs). Every pod
gets the cluster layout in `TF_CONFIG` style environment (PS and worker host
lists built from the StatefulSets' stable DNS names), so a TensorFlow-style
PS job can start from it. `validate_manifests` checks the structure the
tests (and `stoke train render`) rely on.
"""
from __future__ import annotations

import json
import re
from typing import Any

from controller.training.spec import TrainingPlan

PS_PORT = 2222
NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def _dns(name: str) -> str:
    out = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")
    return out[:50] or "job"


def _hosts(job: str, group: str, count: int, namespace: str) -> list[str]:
    svc = f"{job}-{group}"
    return [f"{svc}-{i}.{svc}.{namespace}.svc:{PS_PORT}" for i in range(count)]


def render_manifests(plan: TrainingPlan, *, image: str = "tensorflow/tensorflow:2.15.0-gpu",
                     namespace: str = "default", command: list[str] | None = None,
                     gpus_per_type: dict[str, int] | None = None) -> list[dict[str, Any]]:
    """Services + StatefulSets for the plan's PS and workers, in apply order."""
    job = _dns(plan.job)
    gpus_per_type = gpus_per_type or {}
    groups: list[tuple[str, str, int, int, str | None]] = []   # (group, role, replicas, gpus, node type)
    ps_count = max(plan.ps_count, 1)
    ps_type = plan.ps_type or None
    groups.append(("ps", "ps", ps_count, 0, ps_type))
    for itype, count in plan.counts:
        if count > 0:
            groups.append((f"worker-{_dns(itype)}", "worker", count, gpus_per_type.get(itype, 1), itype))
    cluster = {"ps": _hosts(job, "ps", ps_count, namespace),
               "worker": [h for g, role, n, _, _ in groups if role == "worker" for h in _hosts(job, g, n, namespace)]}
    objects: list[dict[str, Any]] = []
    for group, role, replicas, gpus, node_type in groups:
        name = f"{job}-{group}"
        labels = {"app.kubernetes.io/name": job, "app.kubernetes.io/component": role, "stoke/group": group}
        objects.append({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
            "spec": {"clusterIP": "None", "selector": dict(labels),
                     "ports": [{"name": "grpc", "port": PS_PORT, "targetPort": PS_PORT}]},
        })
        container: dict[str, Any] = {
            "name": role, "image": image,
            "ports": [{"name": "grpc", "containerPort": PS_PORT}],
            "env": [{"name": "STOKE_ROLE", "value": role}, {"name": "STOKE_GROUP", "value": group},
                    {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                    {"name": "STOKE_CLUSTER", "value": json.dumps(cluster, sort_keys=True)}],
        }
        if command:
            container["command"] = list(command)
        if gpus:
            container["resources"] = {"limits": {"nvidia.com/gpu": gpus}}
        pod_spec: dict[str, Any] = {"containers": [container], "restartPolicy": "Always"}
        if node_type:
            pod_spec["nodeSelector"] = {"node.kubernetes.io/instance-type": node_type}
        if role == "worker":
            pod_spec["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
        objects.append({
            "apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
            "spec": {"serviceName": name, "replicas": replicas, "podManagementPolicy": "Parallel",
                     "selector": {"matchLabels": dict(labels)},
                     "template": {"metadata": {"labels": dict(labels)}, "spec": pod_spec}},
        })
    return objects


def validate_manifests(objects: list[dict[str, Any]]) -> list[str]:
    """Structural problems (empty when the manifests are well formed)."""
    problems = []
    services = {o["metadata"]["name"] for o in objects if o.get("kind") == "Service"}
    for i, obj in enumerate(objects):
        kind, meta = obj.get("kind"), obj.get("metadata", {})
        name = meta.get("name", "")
        where = f"objects[{i}] {kind} {name!r}"
        if kind not in ("Service", "StatefulSet"):
            problems.append(f"{where}: unexpected kind")
            continue
        if not NAME_RE.match(name) or len(name) > 63:
            problems.append(f"{where}: name is not a DNS-1123 label")
        if kind == "Service":
            if obj.get("apiVersion") != "v1" or obj["spec"].get("clusterIP") != "None" or not obj["spec"].get("selector"):
                problems.append(f"{where}: must be a headless v1 Service with a selector")
            continue
        spec = obj.get("spec", {})
        if obj.get("apiVersion") != "apps/v1":
            problems.append(f"{where}: apiVersion must be apps/v1")
        if spec.get("serviceName") not in services:
            problems.append(f"{where}: serviceName {spec.get('serviceName')!r} has no Service")
        if not isinstance(spec.get("replicas"), int) or spec["replicas"] < 1:
            problems.append(f"{where}: replicas must be a positive integer")
        template_labels = spec.get("template", {}).get("metadata", {}).get("labels", {})
        selector = spec.get("selector", {}).get("matchLabels", {})
        if not selector or any(template_labels.get(k) != v for k, v in selector.items()):
            problems.append(f"{where}: selector does not match the pod template labels")
        containers = spec.get("template", {}).get("spec", {}).get("containers", [])
        if not containers or not all(c.get("image") and c.get("name") for c in containers):
            problems.append(f"{where}: every container needs a name and an image")
    return problems
