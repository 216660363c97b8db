"""The Kubernetes API, for the operator's own objects: the one module that imports the `kubernetes` client.

kopf watches and patches the StokeWorkloads itself; this module writes what it does not: each
workload's Service and EndpointSlices (create what is missing, merge-patch what differs, delete what
is no longer wanted: safe to repeat), and reviews the agents' bootstrap tokens (TokenReview).
Credentials come from the pod's service account, else from the kubeconfig ($KUBECONFIG), as kopf's.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import kubernetes
import urllib3
from kubernetes.client.rest import ApiException

from deploy.desired import MANAGED_BY, MANAGED_BY_LABEL, SERVICE_NAME_LABEL

log = logging.getLogger("stoke.k8s")
_MERGE = "application/merge-patch+json"


class KubeError(RuntimeError):
    """The Kubernetes API refused or failed a call the operator needs (kopf retries the handler)."""


def connect() -> kubernetes.client.ApiClient:
    """An API client: in-cluster service account first, else the kubeconfig."""
    try:
        kubernetes.config.load_incluster_config()
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config()
    return kubernetes.client.ApiClient()


def _changed(current: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    """Whether `wanted`'s keys differ in `current` (fields the server adds are not compared)."""
    for key, value in wanted.items():
        if isinstance(value, Mapping) and isinstance(current.get(key), Mapping):
            if _changed(current[key], value):
                return True
        elif current.get(key) != value:
            return True
    return False


@dataclass
class WorkloadObjects:
    """A workload's Service and EndpointSlices in one namespace."""

    api: kubernetes.client.ApiClient

    def __post_init__(self) -> None:
        self.core = kubernetes.client.CoreV1Api(self.api)
        self.discovery = kubernetes.client.DiscoveryV1Api(self.api)

    def _plain(self, obj: Any) -> dict[str, Any]:
        return dict(self.api.sanitize_for_serialization(obj))

    def ensure_service(self, body: Any) -> str:
        """Create or update the Service; 'created', 'updated' or 'unchanged'."""
        ns, name = body["metadata"]["namespace"], body["metadata"]["name"]
        return self._ensure(
            lambda: self.core.read_namespaced_service(name, ns),
            lambda: self.core.create_namespaced_service(ns, body),
            lambda patch: self.core.patch_namespaced_service(name, ns, patch, _content_type=_MERGE),
            {"metadata": {"labels": body["metadata"]["labels"]}, "spec": body["spec"]},
        )

    def ensure_slices(self, workload: str, namespace: str, slices: Mapping[str, Any]) -> dict[str, str]:
        """Make the workload's EndpointSlices exactly `slices`: create, update, delete the others."""
        out = {}
        for name, body in slices.items():
            wanted = {k: body[k] for k in ("addressType", "ports", "endpoints")}
            wanted["metadata"] = {"labels": body["metadata"]["labels"]}
            out[name] = self._ensure(
                lambda name=name: self.discovery.read_namespaced_endpoint_slice(name, namespace),
                lambda body=body: self.discovery.create_namespaced_endpoint_slice(namespace, body),
                lambda patch, name=name: self.discovery.patch_namespaced_endpoint_slice(
                    name, namespace, patch, _content_type=_MERGE
                ),
                wanted,
            )
        for name in self.slice_names(workload, namespace) - set(slices):
            self._delete(lambda name=name: self.discovery.delete_namespaced_endpoint_slice(name, namespace))
            out[name] = "deleted"
        return out

    def slice_names(self, workload: str, namespace: str) -> set[str]:
        selector = f"{SERVICE_NAME_LABEL}={workload},{MANAGED_BY_LABEL}={MANAGED_BY}"
        try:
            listed = self.discovery.list_namespaced_endpoint_slice(namespace, label_selector=selector)
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as err:
            raise KubeError(f"cannot list the EndpointSlices of {namespace}/{workload}: {err}") from None
        # the selector is applied here too: a server that ignores it must not make us delete other slices
        names = set()
        for item in listed.items:
            if item.metadata is None:
                continue
            labels = item.metadata.labels or {}
            if labels.get(SERVICE_NAME_LABEL) == workload and labels.get(MANAGED_BY_LABEL) == MANAGED_BY:
                names.add(str(item.metadata.name))
        return names

    def delete_all(self, workload: str, namespace: str) -> None:
        """Delete the workload's Service and slices (absent ones are fine)."""
        for name in self.slice_names(workload, namespace):
            self._delete(lambda name=name: self.discovery.delete_namespaced_endpoint_slice(name, namespace))
        self._delete(lambda: self.core.delete_namespaced_service(workload, namespace))

    def _ensure(self, read: Any, create: Any, patch: Any, wanted: dict[str, Any]) -> str:
        try:
            try:
                current = self._plain(read())
            except ApiException as err:
                if err.status != 404:
                    raise
                create()
                return "created"
            if not _changed(current, wanted):
                return "unchanged"
            patch(wanted)
            return "updated"
        except ApiException as err:
            raise KubeError(f"Kubernetes API: {err.status} {err.reason}: {(err.body or '')[:300]}") from None
        except (urllib3.exceptions.HTTPError, OSError) as err:
            raise KubeError(f"Kubernetes API unreachable: {err}") from None

    @staticmethod
    def _delete(call: Any) -> None:
        try:
            call()
        except ApiException as err:
            if err.status != 404:
                raise KubeError(f"Kubernetes API: {err.status} {err.reason}") from None
        except (urllib3.exceptions.HTTPError, OSError) as err:
            raise KubeError(f"Kubernetes API unreachable: {err}") from None


@dataclass(frozen=True)
class ReviewedToken:
    """Who a projected ServiceAccount token belongs to, by the API server's word."""

    username: str
    node_name: str


def review_token(api: kubernetes.client.ApiClient, token: str, audience: str) -> ReviewedToken | None:
    """The API server's TokenReview of `token` for `audience`; None when it is not authenticated.

    The node name comes from the token's pod-bound claims (`authentication.kubernetes.io/node-name`,
    in every projected token since Kubernetes 1.30).
    """
    review = kubernetes.client.V1TokenReview(
        spec=kubernetes.client.V1TokenReviewSpec(token=token, audiences=[audience])
    )
    try:
        result = kubernetes.client.AuthenticationV1Api(api).create_token_review(review)
    except ApiException as err:
        raise KubeError(f"TokenReview failed: {err.status} {err.reason}") from None
    except (urllib3.exceptions.HTTPError, OSError) as err:
        raise KubeError(f"TokenReview failed: the Kubernetes API is unreachable ({err})") from None
    except ValueError as err:  # the client's models refuse a malformed answer
        raise KubeError(f"TokenReview failed: a malformed answer ({str(err)[:200]})") from None
    status = result.status
    if status is None or not status.authenticated or status.user is None:
        return None
    if audience not in (status.audiences or [audience]):
        return None
    extra = status.user.extra or {}
    nodes = extra.get("authentication.kubernetes.io/node-name") or []
    return ReviewedToken(username=status.user.username or "", node_name=nodes[0] if nodes else "")
