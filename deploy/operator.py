"""`stoke k8s operator`: the kopf operator that turns StokeWorkloads into the controller's workloads.

For each StokeWorkload in its namespace, level-based (every pass computes everything from what is,
so a restart of the operator or of the controller converges and never duplicates):

1. check the spec with the workload file's loader (`deploy.crd.workload_from_resource`); a refused
   spec gets status state=Invalid and condition Accepted=False with the loader's message;
2. apply it to the controller (`ApplyWorkloads`: created, updated or unchanged, never twice);
3. read the controller's status of the workload and write it to the resource's status;
4. keep the workload's Service and EndpointSlices pointing at the node routers serving it.

Steps 1-2 run at once on create, update and resume (an operator start); all four run on a timer
(`--refresh`, default 5 s) for every resource. Deleting a StokeWorkload runs the delete handler
behind kopf's finalizer: the workload is deleted from the controller (absent is fine), then its
Service and slices; only then does the resource go.

The operator speaks to the controller only through its gRPC API client, with the admin token.
It also serves the agents' credential bootstrap (`deploy.bootstrap`) on `--bootstrap-listen`.
Names: a StokeWorkload's name is its workload's name in the controller and its Service's name, so it
must be a DNS label; the operator watches one namespace (the installation's).
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import threading
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import kopf

from controller.api.client import ControllerClient
from controller.messages import ApiError, InvalidArgument, NotFound, Unavailable
from deploy import crd, desired
from deploy.kube import KubeError, WorkloadObjects, connect

log = logging.getLogger("stoke.operator")
FINALIZER = "stoke.dev/workload"
#: Names of the installation's own Services: a workload may not take them.
RESERVED_NAMES = ("stoke-controller", "stoke-operator")


@dataclass(frozen=True)
class OperatorConfig:
    controller: str
    token: str | None
    namespace: str
    tls_ca: str | None = None
    tls: bool = False
    refresh_s: float = 5.0
    retry_s: float = 2.0
    bootstrap_listen: str = ""  # HOST:PORT of the agents' bootstrap endpoint ("" = off)
    bootstrap_audience: str = "stoke-bootstrap"


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Reconciler:
    """The handlers' work, over a controller client and the Kubernetes objects (both thread-safe)."""

    def __init__(self, config: OperatorConfig, client: ControllerClient, objects: WorkloadObjects | None) -> None:
        self.config = config
        self.client = client
        self.objects = objects
        # kopf runs a resource's timer beside its change handlers: one pass per workload at a time, so a refresh
        # that began before a deletion cannot re-apply the workload after the delete handler removed it
        self._locks: defaultdict[str, threading.Lock] = defaultdict(threading.Lock)
        self._locks_guard = threading.Lock()

    def lock(self, namespace: str, name: str) -> threading.Lock:
        with self._locks_guard:
            return self._locks[f"{namespace}/{name}"]

    def _workload(self, name: str, namespace: str, spec: Any) -> Any:
        where = f"StokeWorkload {namespace}/{name}"
        if name in RESERVED_NAMES:
            raise crd.StokeWorkloadError(f"{where}: the name {name!r} is the installation's own; rename it", "name")
        crd.kubernetes_name(name, f"{where}: name")
        return crd.workload_from_resource(name, spec, where)

    def apply(self, name: str, namespace: str, spec: Any, generation: int, patch: Any) -> bool:
        """Steps 1-2; False (and an Invalid status in `patch`) when the spec is refused."""
        try:
            workload = self._workload(name, namespace, spec)
            reply = self.client.apply_workloads([workload])
        except (crd.StokeWorkloadError, InvalidArgument) as err:
            patch.status.update(desired.invalid_status(str(err), generation, _now()))
            return False
        except Unavailable as err:
            raise kopf.TemporaryError(f"controller unavailable: {err}", delay=self.config.retry_s) from None
        except ApiError as err:
            raise kopf.TemporaryError(f"controller refused the apply: {err}", delay=self.config.retry_s) from None
        for verb in ("created", "updated"):
            if name in getattr(reply, verb):
                log.info("workload %s/%s %s in the controller", namespace, name, verb)
        return True

    def refresh(
        self, name: str, namespace: str, spec: Any, generation: int, uid: str, status: Mapping[str, Any], patch: Any
    ) -> None:
        """Steps 1-4."""
        if not self.apply(name, namespace, spec, generation, patch):
            return
        try:
            report = self.client.status()
        except Unavailable as err:
            raise kopf.TemporaryError(f"controller unavailable: {err}", delay=self.config.retry_s) from None
        workload = next((w for w in report.workloads if w.name == name), None)
        serving = desired.routers(workload.replicas) if workload is not None else ()
        if self.objects is not None:
            owner = desired.owner_reference(name, uid)
            try:
                self.objects.ensure_service(desired.service(name, namespace, owner))
                self.objects.ensure_slices(name, namespace, desired.endpoint_slices(name, namespace, serving, owner))
            except KubeError as err:
                raise kopf.TemporaryError(str(err), delay=self.config.retry_s) from None
        fields = desired.status_fields(workload, f"{name}.{namespace}.svc", serving, generation, _now())
        fields["conditions"] = desired.merge_conditions(status.get("conditions") or [], fields["conditions"])
        for key in ("predictedP99Ms", "p99UpperMs", "observedP99Ms", "observedRateRps", "endpoint", "httpEndpoint"):
            if key not in fields and key in status:
                fields[key] = None  # a merge patch removes what no longer holds
        patch.status.update(fields)

    def delete(self, name: str, namespace: str) -> None:
        try:
            self.client.delete_workload(name)
        except NotFound:
            pass
        except Unavailable as err:
            raise kopf.TemporaryError(f"controller unavailable: {err}", delay=self.config.retry_s) from None
        if self.objects is not None:
            try:
                self.objects.delete_all(name, namespace)
            except KubeError as err:
                raise kopf.TemporaryError(str(err), delay=self.config.retry_s) from None
        log.info("workload %s/%s deleted from the controller", namespace, name)


def build_registry(reconciler: Reconciler) -> kopf.OperatorRegistry:
    """The kopf handlers of StokeWorkloads, in a registry of their own (no module-level state)."""
    registry = kopf.OperatorRegistry()
    resource = (crd.GROUP, crd.VERSION, crd.PLURAL)
    config = reconciler.config

    @kopf.on.create(*resource, registry=registry, id="apply", backoff=config.retry_s)
    @kopf.on.update(*resource, registry=registry, id="apply", field="spec", backoff=config.retry_s)
    @kopf.on.resume(*resource, registry=registry, id="apply", backoff=config.retry_s)
    def apply(name: str, namespace: str | None, spec: kopf.Spec, meta: kopf.Meta, patch: kopf.Patch, **_: Any) -> None:
        with reconciler.lock(namespace or "", name):
            if not meta.get("deletionTimestamp"):  # `meta` is kopf's live view: a deletion shows here at once
                reconciler.apply(name, namespace or "", spec, int(meta.get("generation") or 0), patch)

    @kopf.timer(*resource, registry=registry, id="refresh", interval=config.refresh_s, backoff=config.retry_s)
    def refresh(
        name: str,
        namespace: str | None,
        spec: kopf.Spec,
        meta: kopf.Meta,
        status: kopf.Status,
        patch: kopf.Patch,
        **_: Any,
    ) -> None:
        with reconciler.lock(namespace or "", name):
            if not meta.get("deletionTimestamp"):
                generation = int(meta.get("generation") or 0)
                reconciler.refresh(name, namespace or "", spec, generation, meta["uid"], status, patch)

    @kopf.on.delete(*resource, registry=registry, id="delete", backoff=config.retry_s)
    def delete(name: str, namespace: str | None, **_: Any) -> None:
        with reconciler.lock(namespace or "", name):
            reconciler.delete(name, namespace or "")

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        # the kubernetes client's own config: the pod's service account, else $KUBECONFIG (as `deploy.kube`)
        return kopf.login_via_client(**kwargs)

    @kopf.on.startup(registry=registry)
    def settings(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.persistence.finalizer = FINALIZER
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="stoke.dev")
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix="stoke.dev")
        settings.posting.level = logging.WARNING
        # one known namespace, the CRD installed before the operator: no need to list namespaces or CRDs
        # cluster-wide (and no right to: see the Role in deploy.manifests)
        settings.scanning.disabled = True
        settings.watching.server_timeout = 60
        settings.networking.request_timeout = 30

    if config.bootstrap_listen:
        from deploy.bootstrap import BootstrapServer

        server: dict[str, BootstrapServer] = {}

        @kopf.on.startup(registry=registry)
        async def start_bootstrap(**_: Any) -> None:
            server["it"] = BootstrapServer(reconciler, config.bootstrap_listen, config.bootstrap_audience)
            await server["it"].start()

        @kopf.on.cleanup(registry=registry)
        async def stop_bootstrap(**_: Any) -> None:
            if "it" in server:
                await server["it"].stop()

    return registry


def run(config: OperatorConfig, liveness: str | None = None, kube: bool = True) -> None:
    """Run the operator until SIGINT/SIGTERM (kopf handles both)."""
    client = ControllerClient(config.controller, token=config.token, tls_ca=config.tls_ca, tls=config.tls)
    objects = WorkloadObjects(connect()) if kube else None
    reconciler = Reconciler(config, client, objects)
    try:
        asyncio.run(
            kopf.operator(
                registry=build_registry(reconciler),
                standalone=True,  # one operator (a Deployment of one, Recreate): no peering objects needed
                namespaces=[config.namespace],
                liveness_endpoint=liveness,
            )
        )
    finally:
        client.close()
