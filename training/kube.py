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

Object names are ``JOB-ps`` and ``JOB-worker-TYPE``, TYPE the instance type with
``.`` written ``-`` (``p3.2xlarge``: ``worker-p3-2xlarge``). Nothing else is
rewritten: a job name or instance type that gives no Kubernetes name, or two
types that give the same one, are refused (`kube_names`), since a silently
mangled name can collide with another job's objects (``a_b`` and ``a.b``).

`validate_manifests` checks what `stoke train render` relies on; the tests also
load every object into the official ``kubernetes`` client models.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

from foundation.names import shown

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


#: Longest StatefulSet name: its pods carry a ``controller-revision-hash`` label of the name, a dash and a
#: 10-character hash, and a label value holds at most 63 characters.
STATEFULSET_NAME_MAX = 52
K8S_NAME_RULE = "a DNS label: a-z 0-9 -, from and to a letter or digit"
_QUANTITY = re.compile(r"(?P<number>[0-9]+(?:\.[0-9]+)?)(?P<suffix>m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?")
#: A label key: an optional DNS-subdomain prefix and '/', then a name of at most 63 characters; a label value.
_LABEL_NAME = r"[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_LABEL_KEY = re.compile(rf"(?:[a-z0-9](?:[-a-z0-9.]{{0,251}}[a-z0-9])?/)?{_LABEL_NAME}")
_LABEL_VALUE = re.compile(rf"(?:{_LABEL_NAME})?")


def _error(message: str) -> Exception:
    from training.models import TrainingError  # here: importing the models loads numpy

    return TrainingError(message)


def _suggest(name: str) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")[:40] or "job"


def kube_names(plan: TrainingPlan) -> tuple[str, dict[str, str]]:
    """(the job's name in object names, {instance type: its worker group}), or `TrainingError` naming what
    gives no Kubernetes name and how to mend it (see the module docstring)."""
    job = plan.job
    if not NAME_RE.match(job):
        raise _error(
            f"job name {shown(job)} is not a Kubernetes name ({K8S_NAME_RULE}); rename job.name in the spec, "
            f"e.g. {_suggest(job)!r}, and re-plan"
        )
    groups: dict[str, str] = {}
    seen: dict[str, str] = {}
    for itype, count in plan.counts:
        if count <= 0:
            continue
        group = "worker-" + itype.replace(".", "-")
        if not NAME_RE.match(group):
            raise _error(
                f"instance type {shown(itype)} gives no Kubernetes name ({shown(group)} is not {K8S_NAME_RULE}, "
                "with '.' written '-'); plan with catalog instance types such as p3.2xlarge"
            )
        if group in seen:
            raise _error(
                f"instance types {shown(seen[group])} and {shown(itype)} give the same Kubernetes name {group!r}; "
                "keep one of them in the spec and re-plan"
            )
        seen[group] = itype
        groups[itype] = group
    longest = max([f"{job}-ps", *(f"{job}-{g}" for g in groups.values())], key=len)
    if len(longest) > STATEFULSET_NAME_MAX:
        raise _error(
            f"job name {job!r} makes the StatefulSet name {longest!r} of {len(longest)} characters, over the "
            f"{STATEFULSET_NAME_MAX} a StatefulSet's pods can carry; shorten job.name in the spec "
            f"to at most {len(job) - len(longest) + STATEFULSET_NAME_MAX} characters and re-plan"
        )
    return job, groups


def memory_problem(memory: str) -> str:
    """Why `memory` is not a memory request (a positive Kubernetes quantity); "" when it is."""
    match = _QUANTITY.fullmatch(memory) if isinstance(memory, str) else None
    if match is None:
        return "give a Kubernetes quantity such as 8Gi (Ki Mi Gi Ti: powers of 1024; k M G T: of 1000)"
    if match["suffix"] == "m":
        return "the suffix m means thousandths of a byte; give Mi or Gi, e.g. 512Mi"
    if float(match["number"]) == 0:
        return "give a quantity above 0, such as 8Gi"
    return ""


def spot_label_problem(key: str, value: str) -> str:
    """Why (key, value) is not a node label; "" when it is."""
    if not _LABEL_KEY.fullmatch(key):
        return (
            "the key must be a label key: [PREFIX/]NAME, NAME up to 63 of A-Z a-z 0-9 - _ . (alphanumeric at the ends)"
        )
    if not _LABEL_VALUE.fullmatch(value):
        return "the value must be a label value: up to 63 of A-Z a-z 0-9 - _ . (alphanumeric at the ends)"
    return ""


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
    job, group_names = kube_names(plan)
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
            groups.append((group_names[itype], "worker", count, gpus_per_type.get(itype, 1), itype, offset))
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
                    if not isinstance(value, str) or not _QUANTITY.fullmatch(value):
                        problems.append(
                            f"{where}: {part}.{resource} must be a quoted quantity such as '2' or '8Gi', got {value!r}"
                        )
    return problems
