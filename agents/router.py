"""Stable per-workload endpoints on a node: a small gRPC and HTTP router in front of the Triton processes.

Why. Each assignment runs in its own Triton process on free loopback ports,
and a share move starts a new process (new ports), so a client cannot keep
an address. The router gives each workload on this node two ports on the
agent's ``--bind`` address that stay put while the workload stays on the
node (share moves, batch reloads, crash restarts):

- gRPC (``HOST:PORT``, Triton's KServe v2 gRPC API) and HTTP
  (``http://HOST:PORT``, Triton's v2 HTTP API), forwarded per call (layer 7,
  not per TCP connection) to one of the workload's current Triton processes
  on this node, round robin when the node holds several replicas. Bytes pass
  through untouched; gRPC metadata and deadlines are forwarded; so any stock
  Triton client works against it.
- ``http://HOST:PORT/metrics``: Triton's metrics of the workload's process
  (with several replicas on the node, every sample gets a ``replica`` label),
  so a Prometheus scrape target does not change with the process either.

What passes (an allow-list; everything else is refused with HTTP 403 /
gRPC PERMISSION_DENIED before it reaches Triton): inference, health, server
and model metadata, model config (read) and statistics; see `HTTP_ALLOWED`
and `GRPC_ALLOWED`. Triton's model control (load, which takes files and so
runs code, unload, the repository index, logging and trace settings,
shared-memory registration) is stoke's alone: the agent drives it on the
loopback ports, and an operator changes models through stoke's authenticated
API (`stoke workload apply`).

A move without a failed request: the fleet starts the new process, then
`set_backends` switches the route (a call picks its backend and counts
itself in flight atomically, so no call picks the old one afterwards), then
`drain` waits until the calls in flight on the old process have answered,
and only then is the old process stopped. A call whose backend vanished
before it was sent (connection refused: a crash) is retried once on the
current backend.

Ports: with ``ports=(LOW, HIGH)`` a workload prefers the pair at
``LOW + 2 * (crc32(name) % pairs)`` and probes upwards, so a workload keeps
its ports across agent restarts as long as they are free; without a range,
any free ports (kept for the agent's lifetime).

Cost (measured on this project's 2-core machine): see the README, "Serving
that other machines can use".
"""

from __future__ import annotations

import asyncio
import http.client
import logging
import re
import resource
import socket
import threading
import time
import zlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import aiohttp
import grpc
import grpc.aio
import uvloop
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from multidict import CIMultiDict

from foundation.errors import StokeError

log = logging.getLogger("stoke.router")

WILDCARDS = ("0.0.0.0", "::", "")
#: Triton's one streaming method; every other method of its gRPC service is unary.
STREAMING_METHODS = ("/inference.GRPCInferenceService/ModelStreamInfer",)
#: The router's own liveness (answered without a backend): the agent's probe of its router.
LIVE_PATH = "/stoke/router/live"
#: Channels to the node's own Triton processes (loopback, trusted): no size limit on answers.
_GRPC_OPTIONS = [
    ("grpc.max_receive_message_length", -1),
    ("grpc.max_send_message_length", -1),
]
#: Metadata a client sends that the proxy's own call sets itself.
_SKIP_METADATA = {"user-agent", "te", "content-type", "grpc-accept-encoding", "grpc-encoding", "grpc-timeout"}
_HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailers",
    "transfer-encoding",
    "upgrade",
    "content-length",
    "host",
}


#: The gRPC methods the router forwards: inference, health, metadata, config (read) and statistics.
GRPC_ALLOWED = frozenset(
    f"/inference.GRPCInferenceService/{name}"
    for name in (
        "ServerLive",
        "ServerReady",
        "ModelReady",
        "ServerMetadata",
        "ModelMetadata",
        "ModelConfig",
        "ModelStatistics",
        "ModelInfer",
        "ModelStreamInfer",
    )
) | {"/grpc.health.v1.Health/Check"}
_MODEL = r"/v2/models/[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}(?:/versions/[0-9]{1,19})?"
#: The HTTP requests the router forwards, (method, full-match regex of the path without its query); the
#: model-name pattern admits no '%', '..' or '/', so no encoding or dot segment reaches another handler.
HTTP_ALLOWED: tuple[tuple[frozenset[str], re.Pattern[str]], ...] = (
    (frozenset({"GET", "HEAD"}), re.compile(r"/v2|/v2/health/(?:live|ready)|/v2/models/stats|/metrics")),
    (frozenset({"GET", "HEAD"}), re.compile(_MODEL + r"(?:/ready|/stats|/config)?")),
    (frozenset({"POST"}), re.compile(_MODEL + r"/(?:infer|generate|generate_stream)")),
)
REFUSAL = (
    "the workload endpoints serve inference, health, metadata and statistics only; model control "
    "(load, unload, repository index, logging, trace, shared memory) is not served here: change what "
    "runs with stoke's authenticated API (`stoke workload apply`)"
)


def http_allowed(method: str, path: str) -> bool:
    """Whether the router forwards this HTTP request (`path` with or without its query)."""
    bare = path.split("?", 1)[0]
    return any(method in methods and pattern.fullmatch(bare) for methods, pattern in HTTP_ALLOWED)


def grpc_allowed(method: str) -> bool:
    """Whether the router forwards this gRPC method ('/package.Service/Method')."""
    return method in GRPC_ALLOWED


class RouterError(StokeError, RuntimeError):
    """The router cannot listen where it was asked to."""


@dataclass(frozen=True)
class RouterLimits:
    """What one client may cost the router. Defaults fit a node serving a few thousand concurrent calls."""

    max_body_bytes: int = 64 * 2**20  # one request (HTTP body, gRPC message); 413 / RESOURCE_EXHAUSTED over it
    max_header_bytes: int = 8190  # one header line (HTTP); gRPC metadata: 16 KiB in all
    max_headers: int = 100
    idle_timeout_s: float = 15.0  # a connection with no request in progress, half-sent headers included
    request_timeout_s: float = 60.0  # one whole call, body read to answer written; 504 over it
    max_connections: int = 4096  # per workload and protocol (HTTP); over it: 503 and close at once
    max_calls: int = 8192  # gRPC calls in progress per workload; RESOURCE_EXHAUSTED over it
    backlog: int = 1024  # the listen backlog (the kernel caps it at net.core.somaxconn)
    backend_connections: int = 512  # pooled HTTP connections to the node's Triton processes, in all

    def grpc_server_options(self) -> list[tuple[str, Any]]:
        return [
            ("grpc.max_receive_message_length", self.max_body_bytes),
            ("grpc.max_send_message_length", -1),
            ("grpc.max_metadata_size", 16 * 1024),
            # calls that arrived before a handler took them: gRPC's default (1,000) cancels a burst's tail
            ("grpc.server.max_pending_requests", self.max_calls),
            ("grpc.server.max_pending_requests_hard_limit", 2 * self.max_calls),
            ("grpc.max_connection_idle_ms", int(self.idle_timeout_s * 1000)),
            ("grpc.server_handshake_timeout_ms", int(self.idle_timeout_s * 1000)),
            ("grpc.so_reuseport", 0),
        ]


def raise_open_files_limit(wanted: int = 65536) -> int:
    """Raise this process's soft open-files limit towards `wanted` (up to the hard limit); returns the new soft one.

    Every client connection is a file descriptor: at the usual soft limit of 1,024 a thousand idle clients
    would leave the agent unable to open anything (its own Triton calls included)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return int(soft)


@dataclass(frozen=True)
class Backend:
    """One Triton process serving a replica of the workload: loopback addresses of its three ports."""

    key: str  # the replica's assignment key, "name#replica"
    grpc: str  # host:port
    http: str  # host:port
    metrics: str  # host:port


@dataclass(frozen=True)
class RouteEndpoints:
    """Where other machines reach one workload on this node."""

    workload: str
    grpc: str  # HOST:PORT
    http: str  # http://HOST:PORT
    metrics: str  # http://HOST:PORT/metrics


def host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


def advertised_host(bind: str, advertise: str | None) -> str:
    """`advertise`, else the bind address, else (a wildcard bind) this machine's fully qualified name."""
    if advertise:
        return advertise
    return socket.getfqdn() if bind in WILDCARDS else bind


def parse_port_range(text: str) -> tuple[int, int] | None:
    """'LOW-HIGH' -> (LOW, HIGH); '' or '0' -> None (any free port). ValueError when malformed."""
    text = text.strip()
    if text in ("", "0"):
        return None
    low_text, sep, high_text = text.partition("-")
    if not sep or not low_text.isdigit() or not high_text.isdigit():
        raise ValueError(f"must be LOW-HIGH (e.g. 8100-8199) or 0 for any free port, got {text!r}")
    low, high = int(low_text), int(high_text)
    if not 1 <= low < high <= 65535:
        raise ValueError(f"must satisfy 1 <= LOW < HIGH <= 65535, got {text!r}")
    return low, high


# --------------------------------------------------------------------------- metrics merge

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?(\s.*)$")


def label_metrics(texts: Sequence[tuple[str, str]], label: str = "replica") -> str:
    """Prometheus texts of several processes as one, each sample labelled ``label="<value>"``.

    `texts` is ``[(value, text), ...]``. Samples of one metric family stay together (the text
    format requires it); HELP and TYPE lines are kept once.
    """
    families: dict[str, tuple[list[str], list[str]]] = {}
    for value, text in texts:
        current = ""
        for line in text.splitlines():
            if not line.strip():
                continue
            if line.startswith("#"):
                parts = line.split(None, 3)
                if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                    current = parts[2]
                    head, _ = families.setdefault(current, ([], []))
                    if line not in head:
                        head.append(line)
                continue
            match = _SAMPLE.match(line)
            if match is None:
                continue
            name, _, labels, rest = match.groups()
            extra = f'{label}="{value}"'
            labelled = f"{name}{{{labels + ',' if labels else ''}{extra}}}{rest}"
            families.setdefault(current or name, ([], []))[1].append(labelled)
    return "".join("\n".join(head + samples) + "\n" for head, samples in families.values())


# --------------------------------------------------------------------------- one route


@dataclass
class _Route:
    workload: str
    backends: tuple[Backend, ...] = ()
    turn: int = 0
    grpc_port: int = 0
    http_port: int = 0
    grpc_server: Any = None
    http: Any = None  # _HttpRoute
    channels: dict[str, Any] = field(default_factory=dict)  # backend grpc address -> aio channel (loop thread only)
    hold_until: float = 0.0  # monotonic time: until then a call that finds no backend waits for one


class Router:
    """Per-workload gRPC + HTTP endpoints on `bind`, forwarding to the workload's current Triton processes."""

    def __init__(
        self,
        bind: str = "127.0.0.1",
        advertise: str | None = None,
        ports: tuple[int, int] | None = None,
        *,
        limits: RouterLimits | None = None,
    ) -> None:
        self.bind = bind
        self.host = advertised_host(bind, advertise)
        self.ports = ports
        self.limits = limits or RouterLimits()
        self.open_files_limit = raise_open_files_limit()
        self._routes: dict[str, _Route] = {}
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._in_flight: dict[str, int] = {}  # backend grpc address -> calls in flight
        # uvloop: a third less CPU per forwarded call than asyncio's own loop (measured: 2,000 HTTP calls,
        # 1.08 s against 1.55 s of router CPU); gRPC's aio runs on it too
        self._loop = uvloop.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="stoke-router", daemon=True)
        self._thread.start()
        self._closed = False
        self._session: aiohttp.ClientSession | None = None

    # -- the fleet's side

    def set_backends(self, workload: str, backends: Sequence[Backend]) -> RouteEndpoints:
        """Route `workload` to `backends` (opening its ports the first time); returns its endpoints."""
        with self._lock:
            route = self._routes.get(workload)
        if route is None:
            route = self._open(workload)
        with self._lock:
            route.backends = tuple(sorted(backends, key=lambda b: b.key))
            self._changed.notify_all()
        return self._endpoints(route)

    def hold(self, workload: str, seconds: float) -> None:
        """For `seconds`, calls to `workload` that find no backend wait for one (a replacement is starting)
        instead of failing at once; 0 ends the hold."""
        with self._lock:
            route = self._routes.get(workload)
            if route is not None:
                route.hold_until = time.monotonic() + seconds if seconds > 0 else 0.0

    async def _acquire_waiting(self, route: _Route) -> Backend | None:
        """`_acquire`, waiting while the route is held without a backend (the call's own timeout bounds it)."""
        backend = self._acquire(route)
        while backend is None and time.monotonic() < route.hold_until:
            await asyncio.sleep(0.05)
            backend = self._acquire(route)
        return backend

    def remove(self, workload: str) -> None:
        """Close the workload's ports (it left this node)."""
        with self._lock:
            route = self._routes.pop(workload, None)
        if route is not None:
            self._close_route(route)

    def in_flight(self, backend_grpc: str) -> int:
        with self._lock:
            return self._in_flight.get(backend_grpc, 0)

    def drain(self, backend_grpc: str, timeout_s: float = 30.0) -> bool:
        """Wait until no call is in flight on that backend (call after routing away from it)."""
        with self._lock:
            return self._changed.wait_for(lambda: self._in_flight.get(backend_grpc, 0) == 0, timeout=timeout_s)

    def endpoints(self) -> dict[str, RouteEndpoints]:
        with self._lock:
            routes = list(self._routes.values())
        return {r.workload: self._endpoints(r) for r in routes}

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with self._lock:
            routes, self._routes = list(self._routes.values()), {}
        for route in routes:
            self._close_route(route)
        if self._session is not None:
            try:
                self._call(self._session.close())
            except Exception as err:  # noqa: BLE001 - closing only
                log.debug("closing the router's client session: %s", err)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)

    def problems(self, timeout_s: float = 2.0) -> list[str]:
        """Why the router cannot serve, [] when it can: each workload's HTTP port answers the router's own
        liveness path, and its gRPC port takes a connection, within `timeout_s` (a wedged loop, exhausted file
        descriptors or a closed port all show here)."""

        out = []
        for workload, ep in sorted(self.endpoints().items()):
            with self._lock:
                route = self._routes.get(workload)
            if route is None:
                continue
            host = "127.0.0.1" if self.bind in WILDCARDS else self.bind
            try:
                conn = http.client.HTTPConnection(host.strip("[]"), route.http_port, timeout=timeout_s)
                try:
                    conn.request("GET", LIVE_PATH)
                    status = conn.getresponse().status
                finally:
                    conn.close()
                if status != 200:
                    out.append(f"router of {workload}: HTTP {ep.http} answers {status} to its liveness probe")
                with socket.create_connection((host.strip("[]"), route.grpc_port), timeout=timeout_s):
                    pass
            except OSError as err:
                out.append(f"router of {workload}: cannot be reached on its own ports ({err})")
        return out

    # -- calls' side (thread-safe)

    def session(self) -> aiohttp.ClientSession:
        """The pooled HTTP client to the node's Triton processes (loop thread only; made on first use)."""
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self.limits.backend_connections, force_close=False),
                timeout=aiohttp.ClientTimeout(total=self.limits.request_timeout_s),
                auto_decompress=False,  # bytes pass through untouched
                skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
            )
        return self._session

    def _acquire(self, route: _Route) -> Backend | None:
        with self._lock:
            if not route.backends:
                return None
            backend = route.backends[route.turn % len(route.backends)]
            route.turn += 1
            self._in_flight[backend.grpc] = self._in_flight.get(backend.grpc, 0) + 1
            return backend

    def _release(self, backend: Backend) -> None:
        with self._lock:
            left = self._in_flight.get(backend.grpc, 0) - 1
            if left > 0:
                self._in_flight[backend.grpc] = left
            else:
                self._in_flight.pop(backend.grpc, None)
                self._changed.notify_all()

    def _still_current(self, route: _Route, backend: Backend) -> bool:
        with self._lock:
            return backend in route.backends

    # -- opening and closing ports

    def _endpoints(self, route: _Route) -> RouteEndpoints:
        return RouteEndpoints(
            workload=route.workload,
            grpc=host_port(self.host, route.grpc_port),
            http=f"http://{host_port(self.host, route.http_port)}",
            metrics=f"http://{host_port(self.host, route.http_port)}/metrics",
        )

    def _candidates(self, workload: str) -> list[tuple[int, int]]:
        if self.ports is None:
            return [(0, 0)]
        low, high = self.ports
        pairs = (high - low + 1) // 2
        if pairs < 1:
            return []
        start = zlib.crc32(workload.encode()) % pairs
        return [(low + 2 * ((start + j) % pairs), low + 2 * ((start + j) % pairs) + 1) for j in range(pairs)]

    def _open(self, workload: str) -> _Route:
        route = _Route(workload)
        tried = []
        for grpc_port, http_port in self._candidates(workload):
            http_route = _HttpRoute(self, route)
            try:
                bound_http = self._call(http_route.start(self.bind, http_port))
            except OSError as err:
                tried.append(f"{http_port} ({err.strerror or err})")
                continue
            try:
                server, bound = self._call(self._start_grpc(route, grpc_port))
            except RuntimeError as err:
                self._call(http_route.stop())
                tried.append(f"{grpc_port} ({err})")
                continue
            route.grpc_server, route.grpc_port = server, bound
            route.http, route.http_port = http_route, bound_http
            with self._lock:
                self._routes[workload] = route
            log.info("workload %s: gRPC %s, HTTP %s", workload, route.grpc_port, route.http_port)
            return route
        where = f"ports {self.ports[0]}-{self.ports[1]}" if self.ports else "any free port"
        raise RouterError(
            f"workload {workload}: cannot listen on {self.bind} ({where}; tried {', '.join(tried[:4]) or 'none'}); "
            f"free some ports or widen the agent's --ports range"
        )

    def _call(self, coro: Any, timeout: float = 10.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    async def _start_grpc(self, route: _Route, port: int) -> tuple[Any, int]:
        server = grpc.aio.server(
            options=self.limits.grpc_server_options(), maximum_concurrent_rpcs=self.limits.max_calls
        )
        server.add_generic_rpc_handlers((_GrpcHandler(self, route),))
        try:
            bound = server.add_insecure_port(host_port(self.bind or "0.0.0.0", port))
        except RuntimeError as err:
            raise RuntimeError(str(err).splitlines()[0] or "bind failed") from None
        if not bound:
            raise RuntimeError("bind failed")
        await server.start()
        return server, bound

    async def _stop_grpc(self, route: _Route) -> None:
        if route.grpc_server is not None:
            await route.grpc_server.stop(grace=1.0)
        for channel in route.channels.values():
            await channel.close()
        route.channels.clear()

    def _close_route(self, route: _Route) -> None:
        try:
            if route.http is not None:
                self._call(route.http.stop())
            self._call(self._stop_grpc(route))
        except Exception as err:  # noqa: BLE001 - closing only
            log.warning("workload %s: closing its gRPC port: %s", route.workload, err)

    def channel(self, route: _Route, backend: Backend) -> Any:
        """The aio channel to a backend (created on the loop thread, on first use)."""
        channel = route.channels.get(backend.grpc)
        if channel is None:
            channel = route.channels[backend.grpc] = grpc.aio.insecure_channel(backend.grpc, options=_GRPC_OPTIONS)
            stale = [a for a in route.channels if a not in {b.grpc for b in route.backends} and a != backend.grpc]
            for address in stale:  # processes that are gone
                if self.in_flight(address) == 0:
                    asyncio.ensure_future(route.channels.pop(address).close())
        return channel


# --------------------------------------------------------------------------- gRPC


def _forwarded_metadata(context: Any) -> tuple[tuple[str, Any], ...]:
    return tuple(
        (k, v)
        for k, v in (context.invocation_metadata() or ())
        if not k.startswith(":") and k.lower() not in _SKIP_METADATA
    )


class _GrpcHandler(grpc.GenericRpcHandler):
    def __init__(self, router: Router, route: _Route) -> None:
        self.router, self.route = router, route

    def service(self, handler_call_details: Any) -> Any:
        method = handler_call_details.method
        if not grpc_allowed(method):
            return grpc.unary_unary_rpc_method_handler(partial(self._refuse, method))
        if method in STREAMING_METHODS:
            return grpc.stream_stream_rpc_method_handler(partial(self._stream, method))
        return grpc.unary_unary_rpc_method_handler(partial(self._unary, method))

    async def _refuse(self, method: str, request: bytes, context: Any) -> bytes:
        await context.abort(grpc.StatusCode.PERMISSION_DENIED, f"{method.rpartition('/')[2]}: {REFUSAL}")
        raise AssertionError("unreachable")

    async def _backend(self, context: Any) -> Backend:
        """The route's current backend, counted in flight (release it); the call aborted when there is none."""
        backend = await self.router._acquire_waiting(self.route)
        if backend is None:
            await context.abort(
                grpc.StatusCode.UNAVAILABLE, f"workload {self.route.workload}: no Triton process serves it here"
            )
        assert backend is not None  # abort raises
        return backend

    async def _unary(self, method: str, request: bytes, context: Any) -> bytes:
        for attempt in (0, 1):
            backend = await self._backend(context)
            try:
                call = self.router.channel(self.route, backend).unary_unary(method)
                remaining = context.time_remaining()
                return bytes(
                    await call(
                        request,
                        metadata=_forwarded_metadata(context),
                        timeout=min(remaining, self.router.limits.request_timeout_s)
                        if remaining is not None
                        else self.router.limits.request_timeout_s,
                    )
                )
            except grpc.aio.AioRpcError as err:
                # the process went away before the call reached it (a crash): once more on the current one
                if (
                    attempt == 0
                    and err.code() == grpc.StatusCode.UNAVAILABLE
                    and not self.router._still_current(self.route, backend)
                ):
                    continue
                await context.abort(err.code(), err.details() or "")
            finally:
                self.router._release(backend)
        raise AssertionError("unreachable")

    async def _stream(self, method: str, requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
        backend = await self._backend(context)
        try:
            call = self.router.channel(self.route, backend).stream_stream(method)
            async for response in call(requests, metadata=_forwarded_metadata(context)):
                yield response
        except grpc.aio.AioRpcError as err:
            await context.abort(err.code(), err.details() or "")
        finally:
            self.router._release(backend)


# --------------------------------------------------------------------------- HTTP (aiohttp)


class _Refuse(asyncio.Protocol):
    """A connection over the cap: one 503 and close (its fd is freed at once, nothing is read)."""

    BODY = b"too many connections to this workload endpoint; retry shortly\n"

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.WriteTransport)
        transport.write(
            b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nRetry-After: 1\r\n"
            + f"Content-Length: {len(self.BODY)}\r\n\r\n".encode()
            + self.BODY
        )
        transport.close()


class _DropClientErrors(logging.Filter):
    """Malformed requests are the client's problem (answered 400): no traceback in the agent's log for each."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, (HttpProcessingError, ConnectionResetError))


_HTTP_LOG = logging.getLogger("stoke.router.http")
_HTTP_LOG.addFilter(_DropClientErrors())


def _plain(status: int, text: str, close: bool = False) -> web.Response:
    reply = web.Response(status=status, text=text if text.endswith("\n") else text + "\n")
    if close:
        reply.force_close()
    return reply


class _HttpRoute:
    """One workload's HTTP port: aiohttp's parser and limits, a connection cap, forwarding on the router's loop."""

    def __init__(self, router: Router, route: _Route) -> None:
        self.router, self.route, self.limits = router, route, router.limits
        self.runner: web.AppRunner | None = None
        self.server: asyncio.AbstractServer | None = None

    async def start(self, bind: str, port: int) -> int:
        limits = self.limits
        app = web.Application(client_max_size=limits.max_body_bytes, handler_args={"max_headers": limits.max_headers})
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self.runner = web.AppRunner(
            app,
            handle_signals=False,
            access_log=None,
            keepalive_timeout=limits.idle_timeout_s,  # also closes a connection that never completes its headers
            max_line_size=limits.max_header_bytes,
            max_field_size=limits.max_header_bytes,
            handler_cancellation=True,  # a client that hangs up frees its backend call
            logger=_HTTP_LOG,
            lingering_time=1.0,  # after a refusal, discard a client's unread body for 1 s at most, then close
        )
        await self.runner.setup()
        factory = self.runner.server
        assert factory is not None

        def capped() -> asyncio.BaseProtocol:
            if len(factory.connections) >= limits.max_connections:
                return _Refuse()
            return factory()

        family = socket.AF_INET6 if ":" in bind else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((bind or "0.0.0.0", port))
            sock.setblocking(False)
            self.server = await asyncio.get_running_loop().create_server(capped, sock=sock, backlog=limits.backlog)
        except OSError:
            sock.close()
            await self.runner.cleanup()
            raise
        return int(sock.getsockname()[1])

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
        if self.runner is not None:
            await self.runner.shutdown()
            await self.runner.cleanup()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        route, limits = self.route, self.limits
        raw = request.raw_path  # not percent-decoded: the allow-list sees what Triton would see
        bare = raw.split("?", 1)[0]
        if bare == LIVE_PATH:
            return _plain(200, "ok")
        if not http_allowed(request.method, raw):
            return _plain(403, f"{request.method} {bare[:200]!r}: {REFUSAL}", close=request.body_exists)
        if request.headers.get("Transfer-Encoding", "").lower() == "chunked":
            return _plain(411, "send a Content-Length (chunked requests are not forwarded)", close=True)
        if (request.content_length or 0) > limits.max_body_bytes:
            return _plain(
                413,
                f"body of {request.content_length} bytes is over this endpoint's limit of {limits.max_body_bytes}",
                close=True,
            )
        try:
            async with asyncio.timeout(limits.request_timeout_s):
                body = await request.read() if request.body_exists else None
                if bare == "/metrics":
                    return await self._metrics()
                return await self._forward(request, raw, body)
        except TimeoutError:
            return _plain(504, f"workload {route.workload}: no answer within {limits.request_timeout_s:g}s", close=True)

    async def _forward(self, request: web.Request, raw: str, body: bytes | None) -> web.StreamResponse:
        router, route = self.router, self.route
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}
        for attempt in (0, 1):
            backend = await router._acquire_waiting(route)
            if backend is None:
                return _plain(503, f"workload {route.workload}: no Triton process serves it here")
            try:
                async with router.session().request(
                    request.method, f"http://{backend.http}{raw}", data=body, headers=headers
                ) as reply:
                    data = await reply.read()
                    out = [(k, v) for k, v in reply.headers.items() if k.lower() not in _HOP_BY_HOP]
                    return web.Response(status=reply.status, body=data, headers=CIMultiDict(out))
            except (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError, aiohttp.ClientOSError):
                if attempt == 0 and not router._still_current(route, backend):
                    continue  # the process went away (a crash, or killed as hung): once more on the current one
                return _plain(502, f"workload {route.workload}: its Triton process refused the connection")
            except aiohttp.ClientError as err:
                return _plain(502, f"workload {route.workload}: {type(err).__name__}: {err}")
            finally:
                router._release(backend)
        raise AssertionError("unreachable")

    async def _metrics(self) -> web.Response:
        route = self.route
        with self.router._lock:
            backends = route.backends
        texts = []
        for backend in backends:
            try:
                async with self.router.session().get(
                    f"http://{backend.metrics}/metrics", timeout=aiohttp.ClientTimeout(total=5)
                ) as reply:
                    texts.append((backend.key.rpartition("#")[2], (await reply.read()).decode("utf-8", "replace")))
            except (aiohttp.ClientError, TimeoutError):
                continue
        if not texts:
            return _plain(503, f"workload {route.workload}: no metrics (no Triton process answered)")
        body = texts[0][1] if len(texts) == 1 else label_metrics(texts)
        return web.Response(body=body.encode(), content_type="text/plain", charset="utf-8")
