"""Bearer-token authentication for the gRPC server, and token/TLS material loading.

The token comes from a file (first line) or an environment variable
(`STOKE_TOKEN`). Every call must carry `authorization: Bearer <token>`;
gRPC health checking and server reflection stay open (probes and grpcurl
discovery). A missing or wrong token is refused with UNAUTHENTICATED.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Callable
from pathlib import Path

import grpc

from controller.config import ConfigError

TOKEN_ENV = "STOKE_TOKEN"
OPEN_PREFIXES = (
    "/grpc.health.v1.Health/",
    "/grpc.reflection.v1alpha.ServerReflection/",
    "/grpc.reflection.v1.ServerReflection/",
)


def read_token(token_file: str | None = None, env: str = TOKEN_ENV) -> str | None:
    """The token from `token_file` if given, else from $STOKE_TOKEN, else None."""
    if token_file:
        try:
            text = Path(token_file).read_text().strip()
        except OSError as err:
            raise ConfigError(
                f"{token_file}: cannot read the token file ({err.strerror}); "
                f"check the path given as token_file / --token-file"
            ) from None
        token = text.splitlines()[0].strip() if text else ""
        if not token:
            raise ConfigError(f"{token_file}: the token file is empty; write the token on its first line")
        return token
    token = os.environ.get(env, "").strip()
    return token or None


def _abort(message: str) -> grpc.RpcMethodHandler:
    def deny(request, context):  # type: ignore[no-untyped-def]
        context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    return grpc.unary_unary_rpc_method_handler(deny)


class BearerTokenInterceptor(grpc.ServerInterceptor):
    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}".encode()

    def intercept_service(self, continuation: Callable, handler_call_details: grpc.HandlerCallDetails):  # type: ignore[override]
        method = handler_call_details.method or ""
        if method.startswith(OPEN_PREFIXES):
            return continuation(handler_call_details)
        metadata = dict(handler_call_details.invocation_metadata or ())
        given = metadata.get("authorization", "")
        if not given:
            return _abort(
                "missing bearer token: send metadata 'authorization: Bearer <token>' (--token-file or $STOKE_TOKEN)"
            )
        if not hmac.compare_digest(given.encode(), self._expected):
            return _abort("invalid bearer token")
        return continuation(handler_call_details)


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
