"""Render a training plan as Kubernetes objects (plain dicts) that run as they are. Pure.

Why StatefulSets and not a Kubeflow ``TFJob``: a TFJob has one pod template per
replica type, so every worker would share one instance type, while a spot plan
mixes several (each with its own GPU count). StatefulSets also need no operator
in the cluster. So the parameter servers get one headless Service +
StatefulSet, and the workers one per instance type, each pod:

- pinned to its instance type (``node.kubernetes.io/instance-type``); a spot
  plan's workers also select spot capacity (default Karpenter's
  ``karpenter.sh/capacity-type: spot``, so Karpenter launches exactly these
  spot types) and tolerate a taint on that key, GPU workers tolerate
  ``nvidia.com/gpu``;
- given resource requests as quoted quantities: every GPU of its instance
  (so one worker per instance, as planned), the instance's vCPUs less one
  for the node's own daemons, and `memory`; parameter servers are spread one
  per node (pod anti-affinity), as the plan counts one instance each;
- started through a small ``/bin/sh`` prelude that exports its own
  ``TF_CONFIG`` (the cluster, and ``task: {type, index}`` where the index is
  the group's offset plus the pod's StatefulSet ordinal), then ``exec``s the
  program: parameter servers run a ``tf.distribute.Server`` from TF_CONFIG
  (works with the stock TensorFlow image), workers run the user's training
  command, which reads TF_CONFIG;
- resolvable before it is ready (``publishNotReadyAddresses``): TensorFlow
  tasks look each other up while starting.

`validate_manifests` checks what `stoke train render` relies on; the tests also
load every object into the official ``kubernetes`` client models.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # an annotation only: the CLI reads this module's defaults without loading numpy
    from training.spec import TrainingPlan

PS_PORT = 2222
NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DEFAULT_IMAGE = "tensorflow/tensorflow:2.15.0-gpu"
DEFAULT_WORKER_COMMAND = ("python", "train.py")
DEFAULT_MEMORY = "8Gi"
DEFAULT_SPOT_LABEL = ("karpenter.sh/capacity-type", "spot")
#: A parameter server: serve the variables of the cluster described by TF_CONFIG until killed.
PS_PROGRAM = (
    "import tensorflow as tf\n"
    "r = tf.distribute.cluster_resolver.TFConfigClusterResolver()\n"
    "tf.distribute.Server(r.cluster_spec(), job_name=r.task_type, task_index=r.task_id,\n"
    "                     protocol=r.rpc_layer or 'grpc', start=True).join()\n"
)
#: Exports this pod's TF_CONFIG (its ordinal is the suffix of the StatefulSet pod name), then runs "$@".
TASK_PRELUDE = (
    'ordinal="${POD_NAME##*-}"\n'
    'export TF_CONFIG="{\\"cluster\\": $STOKE_CLUSTER, \\"task\\": {\\"type\\": \\"$STOKE_ROLE\\", '
    '\\"index\\": $((STOKE_TASK_OFFSET + ordinal))}}"\n'
    'exec "$@"\n'
)


def _dns(name: str) -> str:
    out = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")
    return out[:50] or "job"


def _hosts(job: str, group: str, count: int, namespace: str) -> list[str]:
    svc = f"{job}-{group}"
    return [f"{svc}-{i}.{svc}.{namespace}.svc:{PS_PORT}" for i in range(count)]


def render_manifests(
    plan: TrainingPlan,
    *,
    image: str = DEFAULT_IMAGE,
    namespace: str = "default",
    command: list[str] | tuple[str, ...] | None = None,
    gpus_per_type: dict[str, int] | None = None,
    vcpus_per_type: dict[str, int] | None = None,
    memory: str = DEFAULT_MEMORY,
    spot_label: tuple[str, str] | None = DEFAULT_SPOT_LABEL,
) -> list[dict[str, Any]]:
    """Services + StatefulSets for the plan's PS and workers, in apply order.

    `command` is the training program every worker runs (default ``python
    train.py`` in the image's working directory); `gpus_per_type` and
    `vcpus_per_type` come from the instance catalog (unknown types: 1 GPU,
    1 CPU); `spot_label` is the node label of spot capacity (None: none).
    """
    job = _dns(plan.job)
    gpus_per_type = gpus_per_type or {}
    vcpus_per_type = vcpus_per_type or {}
    worker_args = list(command or DEFAULT_WORKER_COMMAND)
    # (group, role, replicas, gpus, instance type, task index offset)
    groups: list[tuple[str, str, int, int, str | None, int]] = []
    ps_count = max(plan.ps_count, 1)
    groups.append(("ps", "ps", ps_count, 0, plan.ps_type or None, 0))
    offset = 0
    for itype, count in plan.counts:
        if count > 0:
            groups.append((f"worker-{_dns(itype)}", "worker", count, gpus_per_type.get(itype, 1), itype, offset))
            offset += count
    cluster = {
        "ps": _hosts(job, "ps", ps_count, namespace),
        "worker": [h for g, role, n, *_ in groups if role == "worker" for h in _hosts(job, g, n, namespace)],
    }
    spot = plan.strategy == "spot" and spot_label is not None
    objects: list[dict[str, Any]] = []
    for group, role, replicas, gpus, node_type, task_offset in groups:
        name = f"{job}-{group}"
        labels = {"app.kubernetes.io/name": job, "app.kubernetes.io/component": role, "stoke/group": group}
        objects.append(
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
                "spec": {
                    "clusterIP": "None",
                    "selector": dict(labels),
                    "publishNotReadyAddresses": True,
                    "ports": [{"name": "grpc", "port": PS_PORT, "targetPort": PS_PORT}],
                },
            }
        )
        cpus = max(1, (vcpus_per_type.get(node_type, 0) if node_type else 0) - 1)
        requests = {"cpu": str(cpus), "memory": memory}
        limits = {"memory": memory}
        if gpus:
            requests["nvidia.com/gpu"] = limits["nvidia.com/gpu"] = str(gpus)
        container: dict[str, Any] = {
            "name": role,
            "image": image,
            "command": ["/bin/sh", "-c", TASK_PRELUDE, "stoke-task"],
            "args": ["python", "-c", PS_PROGRAM] if role == "ps" else list(worker_args),
            "ports": [{"name": "grpc", "containerPort": PS_PORT}],
            "env": [
                {"name": "STOKE_ROLE", "value": role},
                {"name": "STOKE_GROUP", "value": group},
                {"name": "STOKE_TASK_OFFSET", "value": str(task_offset)},
                {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                {"name": "STOKE_CLUSTER", "value": json.dumps(cluster, sort_keys=True)},
            ],
            "resources": {"requests": requests, "limits": limits},
        }
        pod_spec: dict[str, Any] = {"containers": [container], "restartPolicy": "Always"}
        selector: dict[str, str] = {}
        tolerations: list[dict[str, str]] = []
        if node_type:
            selector["node.kubernetes.io/instance-type"] = node_type
        if role == "worker" and spot:
            key, value = spot_label  # type: ignore[misc]
            selector[key] = value
            tolerations.append({"key": key, "operator": "Exists", "effect": "NoSchedule"})
        if gpus:
            tolerations.append({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"})
        if selector:
            pod_spec["nodeSelector"] = selector
        if tolerations:
            pod_spec["tolerations"] = tolerations
        if role == "ps":
            pod_spec["affinity"] = {
                "podAntiAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": [
                        {"labelSelector": {"matchLabels": dict(labels)}, "topologyKey": "kubernetes.io/hostname"}
                    ]
                }
            }
        objects.append(
            {
                "apiVersion": "apps/v1",
                "kind": "StatefulSet",
                "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
                "spec": {
                    "serviceName": name,
                    "replicas": replicas,
                    "podManagementPolicy": "Parallel",
                    "selector": {"matchLabels": dict(labels)},
                    "template": {"metadata": {"labels": dict(labels)}, "spec": pod_spec},
                },
            }
        )
    return objects


_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")


def validate_manifests(objects: list[dict[str, Any]]) -> list[str]:
    """Structural problems (empty when the manifests are well formed and complete)."""
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
            if (
                obj.get("apiVersion") != "v1"
                or obj["spec"].get("clusterIP") != "None"
                or not obj["spec"].get("selector")
            ):
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
        for c in containers:
            if not c.get("command") and not c.get("args"):
                problems.append(f"{where}: container {c.get('name')!r} has no command")
            resources = c.get("resources", {})
            if not resources.get("requests"):
                problems.append(f"{where}: container {c.get('name')!r} has no resource requests")
            for part in ("requests", "limits"):
                for resource, value in resources.get(part, {}).items():
                    if not isinstance(value, str) or not _QUANTITY.match(value):
                        problems.append(
                            f"{where}: {part}.{resource} must be a quoted quantity such as '2' or '8Gi', got {value!r}"
                        )
    return problems
