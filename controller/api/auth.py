"""Authentication and roles for the gRPC server, and token/TLS material loading.

Every call must carry exactly one ``authorization: Bearer <token>`` header;
gRPC health checking and server reflection stay open (probes and grpcurl
discovery). The token decides the role (`controller.identity`):

- the user token may call `StokeController` (workloads, plans, nodes,
  status, profiles, minting agent tokens) and nothing else;
- an agent token may call `AgentGateway` (`Register`, `Heartbeat`) and only
  for the node it is bound to: the request's ``node_id`` must be that node.

A missing, malformed, repeated or unknown token is refused with
UNAUTHENTICATED; a valid token used outside its role with PERMISSION_DENIED.
Both name the fix.

The user token comes from a file (first line) or ``$STOKE_TOKEN``. A token
file readable by other users, and a token sent (or served) without TLS off
loopback, are warned about: the token is the key to the whole cluster.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

from controller.config import ConfigError
from controller.identity import Verifier
from foundation.names import shown

log = logging.getLogger("stoke.auth")
TOKEN_ENV = "STOKE_TOKEN"
OPEN_PREFIXES = (
    "/grpc.health.v1.Health/",
    "/grpc.reflection.v1alpha.ServerReflection/",
    "/grpc.reflection.v1.ServerReflection/",
)
USER_PREFIX = "/stoke.v1.StokeController/"
AGENT_PREFIX = "/stoke.v1.AgentGateway/"
LOOPBACK = ("127.", "localhost", "::1", "[::1]")


def is_loopback(address: str) -> bool:
    """True when HOST of HOST:PORT (or a bare host) is a loopback name or address."""
    host = address.rsplit(":", 1)[0] if address.count(":") == 1 or address.startswith("[") else address
    return host.startswith(LOOPBACK)


def read_token(token_file: str | None = None, env: str = TOKEN_ENV) -> str | None:
    """The token from `token_file` if given, else from $STOKE_TOKEN, else None."""
    if token_file:
        path = Path(token_file)
        try:
            text = path.read_text(encoding="utf-8").strip()
            mode = stat.S_IMODE(path.stat().st_mode)
        except OSError as err:
            raise ConfigError(
                f"{token_file}: cannot read the token file ({err.strerror}); "
                f"check the path given as token_file / --token-file"
            ) from None
        except UnicodeDecodeError:
            raise ConfigError(
                f"{token_file}: the token file is not UTF-8 text; write the token on its first line"
            ) from None
        if mode & 0o077:
            log.warning(
                "%s: the token file is readable by other users (mode %04o); anyone who reads it controls the "
                "cluster: chmod 600 %s",
                token_file,
                mode,
                token_file,
            )
        token = text.splitlines()[0].strip() if text else ""
        if not token:
            raise ConfigError(f"{token_file}: the token file is empty; write the token on its first line")
        return token
    token = os.environ.get(env, "").strip()
    return token or None


def _deny(code: grpc.StatusCode, message: str) -> grpc.RpcMethodHandler:
    def deny(request, context):  # type: ignore[no-untyped-def]
        context.abort(code, message)

    return grpc.unary_unary_rpc_method_handler(deny)


def _bound_to(node_id: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """`handler` (unary) that refuses requests whose `node_id` is not `node_id`."""
    inner: Callable[[Any, Any], Any] = handler.unary_unary

    def checked(request, context):  # type: ignore[no-untyped-def]
        if request.node_id != node_id:
            context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"this agent token belongs to node {node_id!r}; it cannot act as node {shown(request.node_id)} "
                f"(mint that node its own token: `stoke token agent NODE`)",
            )
        return inner(request, context)

    return grpc.unary_unary_rpc_method_handler(
        checked,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )


class AuthInterceptor(grpc.ServerInterceptor):
    """Authenticates every call (see the module docstring) with a `Verifier`."""

    def __init__(self, verifier: Verifier) -> None:
        self.verifier = verifier

    def intercept_service(self, continuation: Callable, handler_call_details: grpc.HandlerCallDetails):  # type: ignore[override]
        method = handler_call_details.method or ""
        if method.startswith(OPEN_PREFIXES):
            return continuation(handler_call_details)
        given = [v for k, v in (handler_call_details.invocation_metadata or ()) if k == "authorization"]
        if not given:
            return _deny(
                grpc.StatusCode.UNAUTHENTICATED,
                "missing bearer token: send metadata 'authorization: Bearer <token>' (--token-file or $STOKE_TOKEN)",
            )
        if len(given) > 1:
            return _deny(
                grpc.StatusCode.UNAUTHENTICATED, f"{len(given)} authorization headers; send exactly one bearer token"
            )
        value = given[0] if isinstance(given[0], str) else ""
        scheme, _, token = value.partition(" ")
        identity = self.verifier.identify(token.strip()) if scheme == "Bearer" else None
        if identity is None:
            return _deny(grpc.StatusCode.UNAUTHENTICATED, "invalid bearer token")
        if identity.role == "user":
            if method.startswith(AGENT_PREFIX):
                return _deny(
                    grpc.StatusCode.PERMISSION_DENIED,
                    f"{method}: a user token cannot act as an agent; give the agent its node's own token "
                    f"(`stoke token agent NODE`)",
                )
            return continuation(handler_call_details)
        if not method.startswith(AGENT_PREFIX):
            return _deny(
                grpc.StatusCode.PERMISSION_DENIED,
                f"{method}: the agent token of node {identity.node_id!r} may only register and heartbeat; "
                f"use the user token for this call",
            )
        handler = continuation(handler_call_details)
        return None if handler is None else _bound_to(identity.node_id, handler)


def server_credentials(cert_path: str, key_path: str) -> grpc.ServerCredentials:
    try:
        cert, key = Path(cert_path).read_bytes(), Path(key_path).read_bytes()
    except OSError as err:
        raise ConfigError(
            f"{err.filename}: cannot read TLS material ({err.strerror}); "
            f"check tls.cert / tls.key in the controller config"
        ) from None
    return grpc.ssl_server_credentials([(key, cert)])


def channel_credentials(ca_path: str | None) -> grpc.ChannelCredentials:
    root = None
    if ca_path:
        try:
            root = Path(ca_path).read_bytes()
        except OSError as err:
            raise ConfigError(f"{ca_path}: cannot read the CA certificate ({err.strerror}); check --tls-ca") from None
    return grpc.ssl_channel_credentials(root_certificates=root)
