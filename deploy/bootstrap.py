"""Per-node agent credentials on Kubernetes: a pod's projected ServiceAccount token, traded for its node's token.

No shared agent secret sits in the DaemonSet. Each agent pod mounts a projected ServiceAccount token
(audience ``stoke-bootstrap``, 10 minutes, bound to the pod and, since Kubernetes 1.30, naming the
pod's node). Its init container, ``stoke k8s bootstrap``, sends that token to the operator:

    POST /v1/node-token        Authorization: Bearer <projected token>
    200 {"node_id": N, "token": T}

The operator asks the API server who the token belongs to (TokenReview, for that audience), accepts
only the agent ServiceAccount of its own namespace, takes the node from the token's bound claims,
and mints that node's token at the controller (`MintAgentToken`, which retires the node's previous
one). So a pod gets the credential of the node it runs on and of no other node; the token
goes to a memory volume only that pod mounts; the admin token never leaves the operator.

Between the pods and the operator the channel is the cluster network: run a mesh or a
NetworkPolicy-restricted namespace, or put TLS in front of the Service (see the README).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from aiohttp import web

from controller.messages import ApiError
from foundation import inputs
from foundation.errors import StokeError
from foundation.files import write_private_text

log = logging.getLogger("stoke.bootstrap")
PATH = "/v1/node-token"
AGENT_ACCOUNT = "stoke-agent"
MAX_TOKEN_BYTES = 16 * 1024


class BootstrapError(StokeError):
    """The agent could not get its node's token; the message says why and what to check."""


class BootstrapServer:
    """The operator's side: an aiohttp endpoint beside kopf's own loop."""

    def __init__(self, reconciler: Any, listen: str, audience: str) -> None:
        self.reconciler = reconciler
        host, _, port = listen.rpartition(":")
        self.host, self.port = host or "0.0.0.0", int(port)
        self.audience = audience
        self.runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application(client_max_size=MAX_TOKEN_BYTES * 2)
        app.router.add_post(PATH, self.handle)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        await web.TCPSite(self.runner, self.host, self.port).start()
        log.info("agent bootstrap listening on %s:%d", self.host, self.port)

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()

    async def handle(self, request: web.Request) -> web.Response:
        header = request.headers.get("Authorization", "")
        token = header.removeprefix("Bearer ").strip() if header.startswith("Bearer ") else ""
        if not token or len(token) > MAX_TOKEN_BYTES:
            return _error(401, "send the pod's projected ServiceAccount token as 'Authorization: Bearer TOKEN'")
        loop = asyncio.get_running_loop()
        try:
            node, minted = await loop.run_in_executor(None, self.exchange, token)
        except PermissionError as err:
            return _error(403, str(err))
        except (ApiError, RuntimeError) as err:
            log.warning("agent bootstrap failed: %s", err)
            return _error(503, f"cannot mint the node's token now ({err}); retry")
        log.info("minted the agent token of node %s", node)
        return web.json_response({"node_id": node, "token": minted})

    def exchange(self, token: str) -> tuple[str, str]:
        """(node, its new agent token) for a reviewed token; PermissionError when it is not an agent's."""
        from deploy.kube import review_token

        objects = self.reconciler.objects
        if objects is None:
            raise RuntimeError("the operator runs without the Kubernetes API")
        reviewed = review_token(objects.api, token, self.audience)
        namespace = self.reconciler.config.namespace
        expected = f"system:serviceaccount:{namespace}:{AGENT_ACCOUNT}"
        if reviewed is None:
            raise PermissionError(f"the API server did not authenticate the token for audience {self.audience}")
        if reviewed.username != expected:
            raise PermissionError(f"{reviewed.username} is not {expected}: only agent pods get node tokens")
        if not reviewed.node_name:
            raise PermissionError("the token names no node (a pod-bound projected token of Kubernetes >= 1.30 does)")
        reply = self.reconciler.client.mint_agent_token(reviewed.node_name)
        return reviewed.node_name, reply.token


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


def fetch_node_token(
    operator_url: str,
    service_account_token: Path,
    token_file: Path,
    *,
    timeout_s: float = 120.0,
    retry_s: float = 2.0,
) -> str:
    """The agent's side (`stoke k8s bootstrap`): trade the projected token, write the node token (0600).

    Retries while the operator is unreachable or answers 503, up to `timeout_s`; a 401/403 is final.
    Returns the node id.
    """
    try:
        projected = service_account_token.read_text().strip()
    except OSError as err:
        raise BootstrapError(
            f"{service_account_token}: cannot read the projected ServiceAccount token ({err.strerror}); "
            f"check the pod's projected volume"
        ) from None
    deadline = time.monotonic() + timeout_s
    last = ""
    while True:
        request = urllib.request.Request(
            operator_url.rstrip("/") + PATH, method="POST", data=b"", headers={"Authorization": f"Bearer {projected}"}
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as reply:
                answer = inputs.load_json(reply.read(MAX_TOKEN_BYTES))  # a repeated key refused
            node, token = str(answer["node_id"]), str(answer["token"])
            break
        except urllib.error.HTTPError as err:
            detail = _detail(err)
            if err.code in (401, 403):
                raise BootstrapError(f"{operator_url} refused this pod's token ({err.code}): {detail}") from None
            last = f"{err.code} {detail}"
        except (urllib.error.URLError, OSError, ValueError, KeyError) as err:
            last = str(getattr(err, "reason", err))
        if time.monotonic() + retry_s > deadline:
            raise BootstrapError(f"no node token from {operator_url} within {timeout_s:g}s; last: {last}")
        time.sleep(retry_s)
    write_private_text(token_file, token + "\n")
    return node


def _detail(err: urllib.error.HTTPError) -> str:
    try:
        return str(json.loads(err.read(4096)).get("error", ""))
    except (ValueError, OSError, AttributeError):
        return err.reason
