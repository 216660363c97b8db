"""A Kubernetes API mock server (kmock's emulator) on loopback, for the operator's tests.

kmock speaks the API over real HTTP (discovery, list, watch streams, merge patches, the status
subresource, finalizers and deletion), so the operator runs as in a cluster, through kopf's and the
`kubernetes` client's own HTTP code. The emulator runs on its own event loop in a thread; the tests
talk to it over HTTP too (`request`), as kubectl would. What the emulator does not do, and a real API
server does: admission (schemas, defaults), uids and resource versions (the tests give uids),
garbage collection by ownerReferences, and label selectors on lists.
"""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import kmock
import yaml

from deploy import crd

WORKLOADS = f"/apis/{crd.GROUP}/{crd.VERSION}/namespaces/{{ns}}/{crd.PLURAL}"


class MockKubernetes:
    def __init__(self) -> None:
        self._ready = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Event | None = None
        self._main: asyncio.Task[None] | None = None
        self.reviews: dict[str, dict[str, Any]] = {}  # token -> TokenReview status the API server answers
        self.url = ""
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="kmock", daemon=True)
        self._thread.start()
        if not self._ready.wait(30) or self._error:
            raise RuntimeError(f"kmock did not start: {self._error!r}")

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._serve())
        except BaseException as err:  # noqa: BLE001 - reported to the starting thread
            self._error = err
            self._ready.set()

    async def _serve(self) -> None:
        self._main = asyncio.current_task()
        self._stop = asyncio.Event()
        async with kmock.KubernetesEmulator() as api, kmock.Server(api) as server:
            api.resources[f"{crd.GROUP}/{crd.VERSION}/{crd.PLURAL}"] = kmock.ResourceInfo(
                kind=crd.KIND,
                singular=crd.SINGULAR,
                namespaced=True,
                verbs={"get", "list", "watch", "create", "patch", "update", "delete"},
                subresources={"status"},
            )
            # discovery only: kopf waits to see these resources exist (its scanning of them is off)
            api.resources["v1/namespaces"] = kmock.ResourceInfo(kind="Namespace", namespaced=False, verbs={"list"})
            api.resources["apiextensions.k8s.io/v1/customresourcedefinitions"] = kmock.ResourceInfo(
                kind="CustomResourceDefinition", namespaced=False, verbs={"list"}
            )
            for key, kind in (
                ("v1/services", "Service"),
                ("v1/events", "Event"),
                ("discovery.k8s.io/v1/endpointslices", "EndpointSlice"),
            ):
                api.resources[key] = kmock.ResourceInfo(
                    kind=kind, namespaced=True, verbs={"get", "list", "watch", "create", "patch", "delete"}
                )
            self._api = api
            api["post /apis/authentication.k8s.io/v1/tokenreviews"] << self._review
            self.url = str(server.url).rstrip("/")
            self._ready.set()
            await self._stop.wait()

    def _review(self, request: Any) -> dict[str, Any]:
        # a TokenReview is not stored by a real API server; the emulator stores every create: forget it
        for key in [k for k in self._api.objects if k[0].plural == "tokenreviews"]:
            del self._api.objects[key]
        token = request.data["spec"]["token"]
        status = self.reviews.get(token, {"authenticated": False})
        return {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": request.data["spec"],
            "status": status,
        }

    def close(self) -> None:
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(1.0)
        if self._thread.is_alive():
            # the server's graceful shutdown waits for the handlers of watch streams still open (up to aiohttp's
            # shutdown timeout, past the 10 s this waited for at every module's end): end them
            self._loop.call_soon_threadsafe(self._end_handlers)
            self._thread.join(10)

    def serving(self) -> bool:
        return self._thread.is_alive()

    def _end_handlers(self) -> None:
        for task in asyncio.all_tasks(self._loop):
            if task is not self._main:
                task.cancel()

    # ------------------------------------------------------------ a kubectl over HTTP

    def kubeconfig(self, path: Path) -> Path:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "mock", "cluster": {"server": self.url}}],
            "users": [{"name": "mock", "user": {"token": "mock-token"}}],
            "contexts": [{"name": "mock", "context": {"cluster": "mock", "user": "mock", "namespace": "stoke"}}],
            "current-context": "mock",
        }
        path.write_text(yaml.safe_dump(config))
        return path

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/merge-patch+json" if method == "PATCH" else "application/json"}
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=10) as reply:
                return reply.status, json.loads(reply.read() or b"null")
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read() or b"null")

    def apply_workload(self, name: str, spec: dict[str, Any], namespace: str = "stoke") -> dict[str, Any]:
        """Create (with a uid, as the API server would) or merge-patch the spec of a StokeWorkload."""
        base = WORKLOADS.format(ns=namespace)
        code, current = self.request("GET", f"{base}/{name}")
        if code == 200:
            generation = int(current["metadata"].get("generation", 1)) + 1
            patch = {"metadata": {"generation": generation}, "spec": spec}
            code, body = self.request("PATCH", f"{base}/{name}", patch)
        else:
            body = {
                "apiVersion": crd.API_VERSION,
                "kind": crd.KIND,
                "metadata": {
                    "name": name,
                    "namespace": namespace,
                    "uid": str(uuid.uuid4()),
                    "generation": 1,
                    "resourceVersion": "1",
                },
                "spec": spec,
            }
            code, body = self.request("POST", base, body)
        assert code in (200, 201), (code, body)
        return body

    def workload(self, name: str, namespace: str = "stoke") -> dict[str, Any] | None:
        code, body = self.request("GET", f"{WORKLOADS.format(ns=namespace)}/{name}")
        return body if code == 200 else None

    def delete_workload(self, name: str, namespace: str = "stoke") -> int:
        return self.request("DELETE", f"{WORKLOADS.format(ns=namespace)}/{name}")[0]

    def get(self, path: str) -> dict[str, Any] | None:
        code, body = self.request("GET", path)
        return body if code == 200 else None
