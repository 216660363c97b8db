"""What the operator wants to exist for one StokeWorkload, from the controller's status: pure functions.

- `status_fields`: the resource's status (`kubectl get stokeworkloads` columns) from `stoke status`'s
  `WorkloadStatus` of the workload (the protobuf message, read by attribute).
- `service` and `endpoint_slices`: the workload's Service, a stable DNS name
  (`NAME.NAMESPACE.svc`, gRPC port 8001, HTTP port 8000, Triton's own) in front of the node routers
  serving it. The Service has no selector: the operator writes its EndpointSlices from the replicas'
  router endpoints, which stay put through share moves, and rewrites them when the plan moves a
  replica to another node. Each slice holds the routers that listen on the same ports.

No Kubernetes client, no gRPC here (`deploy.kube` and `deploy.operator` do the talking).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from deploy import crd

GRPC_PORT = 8001
HTTP_PORT = 8000
MANAGED_BY = "stoke.dev-operator"
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
MANAGED_BY_LABEL = "endpointslice.kubernetes.io/managed-by"


@dataclass(frozen=True)
class RouterEndpoint:
    """One node router serving the workload: where its gRPC and HTTP ports listen."""

    host: str
    grpc_port: int
    http_port: int
    node: str

    @property
    def address_type(self) -> str:
        try:
            return "IPv4" if ipaddress.ip_address(self.host).version == 4 else "IPv6"
        except ValueError:
            return "FQDN"


def _split(endpoint: str) -> tuple[str, int] | None:
    host, sep, port = endpoint.rpartition(":")
    if not sep or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def routers(replicas: Iterable[Any]) -> tuple[RouterEndpoint, ...]:
    """The distinct node routers of a workload's serving replicas (`ReplicaStatus` messages)."""
    out: dict[tuple[str, int, int], RouterEndpoint] = {}
    for r in replicas:
        if not (r.serving and r.endpoint and r.http_endpoint):
            continue
        grpc = _split(r.endpoint)
        http = urlsplit(r.http_endpoint)
        if grpc is None or http.port is None:
            continue
        key = (grpc[0], grpc[1], http.port)
        out[key] = RouterEndpoint(host=grpc[0], grpc_port=grpc[1], http_port=http.port, node=r.node_id)
    return tuple(out[k] for k in sorted(out))


def owner_reference(name: str, uid: str) -> dict[str, Any]:
    """Kubernetes deletes the Service and its slices with the StokeWorkload (the finalizer deletes them too)."""
    return {
        "apiVersion": crd.API_VERSION,
        "kind": crd.KIND,
        "name": name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _labels(name: str) -> dict[str, str]:
    return {"app.kubernetes.io/part-of": "stoke", "stoke.dev/workload": name}


def service(name: str, namespace: str, owner: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": namespace, "labels": _labels(name), "ownerReferences": [owner]},
        "spec": {
            "type": "ClusterIP",
            "ports": [
                # targetPort as the API server defaults it (a selector-less Service takes the slices' ports),
                # so comparing with what the server holds finds no difference to patch on every pass
                {"name": "grpc", "port": GRPC_PORT, "targetPort": GRPC_PORT, "protocol": "TCP", "appProtocol": "grpc"},
                {"name": "http", "port": HTTP_PORT, "targetPort": HTTP_PORT, "protocol": "TCP", "appProtocol": "http"},
            ],
        },
    }


def endpoint_slices(
    name: str, namespace: str, serving: Sequence[RouterEndpoint], owner: Mapping[str, Any]
) -> dict[str, dict[str, Any]]:
    """Slice name -> EndpointSlice: one per (address type, gRPC port, HTTP port) of the routers."""
    groups: dict[tuple[str, int, int], list[RouterEndpoint]] = {}
    for r in serving:
        groups.setdefault((r.address_type, r.grpc_port, r.http_port), []).append(r)
    out: dict[str, dict[str, Any]] = {}
    for (kind, grpc_port, http_port), members in sorted(groups.items()):
        labels = {**_labels(name), SERVICE_NAME_LABEL: name, MANAGED_BY_LABEL: MANAGED_BY}
        slice_name = f"{name}-{kind.lower()}-{grpc_port}"
        out[slice_name] = {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": slice_name,
                "namespace": namespace,
                "labels": labels,
                "ownerReferences": [owner],
            },
            "addressType": kind,
            "ports": [
                {"name": "grpc", "port": grpc_port, "protocol": "TCP", "appProtocol": "grpc"},
                {"name": "http", "port": http_port, "protocol": "TCP", "appProtocol": "http"},
            ],
            "endpoints": [
                {"addresses": [m.host], "conditions": {"ready": True}, "nodeName": m.node}
                if kind != "FQDN"
                else {"addresses": [m.host], "conditions": {"ready": True}}
                for m in members
            ],
        }
    return out


def _condition(kind: str, ok: bool, reason: str, message: str, generation: int, now: str) -> dict[str, Any]:
    return {
        "type": kind,
        "status": "True" if ok else "False",
        "reason": reason,
        "message": message[:1024],
        "lastTransitionTime": now,
        "observedGeneration": generation,
    }


def merge_conditions(old: Sequence[Mapping[str, Any]], new: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """New conditions, keeping a condition's transition time while its status stays the same."""
    before = {c.get("type"): c for c in old if isinstance(c, Mapping)}
    out = []
    for c in new:
        prior = before.get(c["type"])
        if prior is not None and prior.get("status") == c["status"] and prior.get("lastTransitionTime"):
            c = {**c, "lastTransitionTime": prior["lastTransitionTime"]}
        out.append(c)
    return out


def invalid_status(message: str, generation: int, now: str) -> dict[str, Any]:
    """The status of a spec the workload file's loader or the controller refused."""
    return {
        "state": "Invalid",
        "reason": message[:1024],
        "observedGeneration": generation,
        "conditions": [_condition("Accepted", False, "InvalidSpec", message, generation, now)],
    }


def status_fields(
    workload: Any | None, service_host: str, serving: Sequence[RouterEndpoint], generation: int, now: str
) -> dict[str, Any]:
    """The status of an accepted workload from its `WorkloadStatus` (None: the controller has no status yet)."""
    accepted = _condition("Accepted", True, "Applied", "the controller stored the workload", generation, now)
    if workload is None:
        return {
            "state": "pending",
            "reason": "waiting for the controller's next plan",
            "replicas": 0,
            "ready": 0,
            "observedGeneration": generation,
            "conditions": [accepted, _condition("Serving", False, "NotPlanned", "not in a plan yet", generation, now)],
        }
    replicas = list(workload.replicas)
    ready = sum(1 for r in replicas if r.serving)
    out: dict[str, Any] = {
        "state": workload.state,
        "reason": workload.reason,
        "replicas": len(replicas),
        "ready": ready,
        "routers": [f"{r.host}:{r.grpc_port}" for r in serving],
        "observedGeneration": generation,
    }
    if workload.predicted_p99_ms > 0:
        out["predictedP99Ms"] = round(workload.predicted_p99_ms, 3)
    # present once the controller's plans carry an upper bound (issue "plans that hold"; either spelling)
    upper = _optional(workload, "p99_upper_ms")
    upper = upper if upper is not None else _optional(workload, "predicted_p99_upper_ms")
    if upper is not None:
        out["p99UpperMs"] = round(upper, 3)
    observed = _optional(workload, "observed_p99_ms")
    if observed is not None:
        out["observedP99Ms"] = round(observed, 3)
    if workload.observed:
        out["observedRateRps"] = round(workload.observed_rate_rps, 3)
    if serving:
        out["endpoint"] = f"{service_host}:{GRPC_PORT}"
        out["httpEndpoint"] = f"http://{service_host}:{HTTP_PORT}"
    is_serving = workload.state == "serving" and bool(serving)
    out["conditions"] = [
        accepted,
        _condition(
            "Serving",
            is_serving,
            "Serving" if is_serving else workload.state.capitalize() or "Unknown",
            workload.reason or f"{ready} of {len(replicas)} replicas serving",
            generation,
            now,
        ),
    ]
    return out


def _optional(message: Any, field: str) -> float | None:
    """A protobuf number field's value, or None: unset (a field with presence), 0 (one without), or not a field
    of this message (a controller older than the field)."""
    descriptor = type(message).DESCRIPTOR.fields_by_name.get(field)
    if descriptor is None:
        return None
    if descriptor.has_presence:
        return float(getattr(message, field)) if message.HasField(field) else None
    value = float(getattr(message, field))
    return value if value > 0 else None
