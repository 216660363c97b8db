"""The controller process: config, store, service, gRPC server, metrics endpoint, reconcile loop.

The configuration (`stoke controller --config FILE`) is declared in
`controller.config`; its JSON Schema is `controller/data/controller-config.schema.json`.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from concurrent import futures
from pathlib import Path
from typing import IO, Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from controller.api import stoke_pb2, stoke_pb2_grpc
from controller.api.auth import AuthInterceptor, is_loopback, read_token, server_credentials
from controller.api.handlers import AgentHandlers, ControllerHandlers
from controller.config import ConfigError, ControllerConfig
from controller.identity import Verifier
from controller.messages import InvalidArgument
from controller.metrics import ControllerMetrics
from controller.reconcile.budget import close_worker
from controller.service import ControlService
from controller.store import BackupSchedule, DatabaseError, Store
from foundation import inputs
from planner.solver import solve

log = logging.getLogger("stoke.controller")
SERVICES = ("", "stoke.v1.StokeController", "stoke.v1.AgentGateway")
#: Largest request the server accepts (bytes); larger ones are refused by gRPC before any handler runs.
MAX_REQUEST_BYTES = 8 * 1024 * 1024


def bind_problem(address: str) -> str:
    """Why `address` (HOST:PORT) cannot be listened on, in a few words, from a bind of our own: gRPC says only
    "Failed to bind"."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]") or "0.0.0.0"
    try:
        infos = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (OSError, ValueError, OverflowError) as err:
        return f"{host} is not an address of this machine: {getattr(err, 'strerror', None) or err}"
    family, kind, proto, _, sockaddr = infos[0]
    try:
        with socket.socket(family, kind, proto) as probe:
            probe.bind(sockaddr)
    except OSError as err:
        if err.errno == errno.EADDRINUSE:
            return "the port is in use: another controller, or another program, listens there"
        if err.errno == errno.EADDRNOTAVAIL:
            return f"{host} is not an address of this machine"
        return err.strerror or str(err)
    return "gRPC could not bind it"


def lock_database(db: str) -> IO[str] | None:
    """Hold ``DB.lock`` (an exclusive `fcntl.flock`) while the returned file stays open, so a second controller
    on the same database is refused: two reconcile loops would plan over each other's writes. The kernel drops
    the lock when the process ends, however it ends (a kill -9 leaves no stale lock). None for ":memory:"."""
    if db == ":memory:":
        return None
    path = Path(f"{db}.lock")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = os.fdopen(os.open(path, os.O_RDWR | os.O_CREAT, 0o600), "r+")
    except OSError as err:
        raise ConfigError(
            f"{path}: cannot open the database's lock file ({err.strerror}); make the database's directory "
            "writable by the controller, or point db at another path",
            "db",
        ) from None
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = handle.read().strip()
        handle.close()
        raise ConfigError(
            f"{db}: another controller uses this database ({'pid ' + holder if holder.isdigit() else 'it'} holds "
            f"{path}); stop it first, or give this one another db (--db)",
            "db",
        ) from None
    try:  # the pid is only for the message above: a disk too full to take it does not stop the controller
        handle.truncate(0)
        handle.write(f"{os.getpid()}\n")
        handle.flush()
    except OSError:
        pass
    return handle


class ControllerServer:
    """Everything of one controller process; `start()` then `stop()`."""

    def __init__(
        self,
        config: ControllerConfig,
        *,
        clock: Callable[[], float] = time.time,
        solver: Callable[..., Any] = solve,
        max_workers: int = 16,
    ) -> None:
        self.config = config
        token = read_token(config.token_file)
        self.auth = token is not None
        self._lock = lock_database(config.db)  # first: a second controller touches nothing of the first one's
        try:
            self.store = Store(config.db, reserve_bytes=config.service.observations.reserve_mib * 2**20)
        except BaseException:
            self._unlock()
            raise
        self._warn_about_auth()
        try:
            self.backups = BackupSchedule(
                self.store, config.backup_dir or f"{config.db}.backups", config.backup_interval_s, config.backup_keep
            )
            self.metrics = ControllerMetrics()
            self.service = ControlService(self.store, config.service, clock=clock, solver=solver, observer=self.metrics)
            self.metrics.attach(self.service, self.backups)
            self._upload_profiles()
            self.grpc = self._grpc_server(token, max_workers)
            self.port = self._serve_grpc()
            self.address = f"{config.listen.rsplit(':', 1)[0]}:{self.port}"
        except BaseException:  # a port in use, a bad profile: nothing of this process stays open
            self.store.close()
            self._unlock()
            raise
        self.metrics_port = 0
        self._metrics_server: Any = None
        self._stop = threading.Event()
        self._loop = threading.Thread(target=self._reconcile_loop, name="stoke-reconcile", daemon=True)
        self._watch = threading.Thread(target=self._watch_clock, name="stoke-clock", daemon=True)

    def _warn_about_auth(self) -> None:
        listen = self.config.listen
        if not self.auth:
            log.warning("no token (token_file / $STOKE_TOKEN): the API is open to anyone who can reach %s", listen)
        elif self.config.tls is None and not is_loopback(listen):
            log.warning(
                "tokens travel in clear text: %s is not a loopback address and TLS is off; set tls in the config",
                listen,
            )

    def _grpc_server(self, token: str | None, max_workers: int) -> Any:
        interceptors = (
            [AuthInterceptor(Verifier(token, self.service.agent_key, self.service.token_generation))] if token else []
        )
        return grpc.server(
            futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="stoke-rpc"),
            interceptors=interceptors,
            options=[
                ("grpc.max_receive_message_length", MAX_REQUEST_BYTES),
                # gRPC sets SO_REUSEPORT by default: a second controller on a port in use would bind too and
                # share the port with the first (each connection going to either) instead of being refused
                ("grpc.so_reuseport", 0),
            ],
        )

    def _upload_profiles(self) -> None:
        for source in self.config.profiles:
            # bounded, as every input file (a path to /dev/zero or a log must not fill memory)
            text = inputs.read_text(
                source.path, "the profile named in profiles", error=ConfigError, fix="check the path in profiles"
            )
            try:
                self.service.upload_profile(text, source.gpu_type)
            except InvalidArgument as err:
                raise ConfigError(f"{source.path}: {err}", "profiles") from None
            except DatabaseError as err:  # the database's fault, not the profile's: name the database
                raise ConfigError(f"{err} (while storing the profile {source.path})", "db") from None

    def _serve_grpc(self) -> int:
        stoke_pb2_grpc.add_StokeControllerServicer_to_server(ControllerHandlers(self.service), self.grpc)
        stoke_pb2_grpc.add_AgentGatewayServicer_to_server(AgentHandlers(self.service), self.grpc)
        self.health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.grpc)
        names = (
            stoke_pb2.DESCRIPTOR.services_by_name["StokeController"].full_name,
            stoke_pb2.DESCRIPTOR.services_by_name["AgentGateway"].full_name,
            health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
            reflection.SERVICE_NAME,
        )
        reflection.enable_server_reflection(names, self.grpc)
        tls = self.config.tls
        try:
            if tls is not None:
                port = self.grpc.add_secure_port(self.config.listen, server_credentials(tls.cert, tls.key))
            else:
                port = self.grpc.add_insecure_port(self.config.listen)
        except RuntimeError:  # grpcio >= 1.5x raises "Failed to bind to address ..." instead of returning 0
            port = 0
        if not port:
            problem = bind_problem(self.config.listen)
            fix = "stop what listens there, or change" if problem.startswith("the port is in use") else "change"
            raise ConfigError(
                f"cannot listen on {self.config.listen} ({problem}); {fix} listen in the config (or --listen)", "listen"
            )
        return port

    def start(self) -> ControllerServer:
        self.grpc.start()
        if self.config.metrics_listen:
            host, port = self.config.metrics_listen.rsplit(":", 1)
            try:
                self._metrics_server, _ = self.metrics.serve(host, int(port))
            except OSError as err:
                self.grpc.stop(0)
                self.store.close()
                self._unlock()
                raise ConfigError(
                    f"cannot serve metrics on {self.config.metrics_listen} ({err.strerror or err}); change "
                    "metrics_listen in the config (or --metrics-listen; '' turns metrics off)",
                    "metrics_listen",
                ) from None
            self.metrics_port = self._metrics_server.server_port
        for name in SERVICES:
            self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        self._loop.start()
        self._watch.start()
        log.info(
            "controller on %s (auth %s, tls %s), %s",
            self.address,
            "on" if self.auth else "off",
            "on" if self.config.tls else "off",
            self.metrics_said,
        )
        return self

    @property
    def metrics_said(self) -> str:
        """Where the /metrics endpoint serves, in words for the startup lines: "metrics on URL" or "metrics off"."""
        if not self._metrics_server:
            return "metrics off"
        host = self.config.metrics_listen.rsplit(":", 1)[0] or "0.0.0.0"
        return f"metrics on http://{host}:{self.metrics_port}/metrics"

    def _watch_clock(self) -> None:
        """Notice when this process did not run (SIGSTOP, suspend): see `NodeRegistry.watch_clock`."""
        period = self.service.nodes.pause_threshold_s / 4
        while not self._stop.wait(period):
            self.service.nodes.watch_clock()

    def _store_health(self, degraded: str) -> str:
        """Health follows the store: NOT_SERVING with the cause in `last_error` while it cannot write (a probe
        write each tick notices the cause is gone), SERVING again after. Returns the current failure reason."""
        state = self.store.health()
        if not state.ok and self.store.probe_write():
            state = self.store.health()
        if not state.ok:
            # the cause first: whoever sees NOT_SERVING finds it in the status already
            self.service.reconciler.last_error = f"store ({state.reason}): {state.error}"
            if degraded != state.reason:
                log.error("store: %s", state.error)
                for name in SERVICES:
                    self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
            return state.reason
        if degraded:
            log.info("store: writes work again")
            for name in SERVICES:
                self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
            if self.service.reconciler.last_error.startswith("store ("):
                self.service.reconciler.last_error = ""
        self.backups.maybe_run(time.time())
        return ""

    def _reconcile_loop(self) -> None:
        tick = min(self.config.reconcile_interval_s, self.config.service.heartbeat_timeout_s / 4)
        broken = False
        degraded = ""
        while not self._stop.is_set():
            try:
                self.store.check()
            except DatabaseError as err:
                if not broken:  # once, loudly; every API call says it too
                    log.error("%s", err)
                    for name in SERVICES:
                        self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
                    self.service.reconciler.last_error = str(err)
                broken = True
                self.service.wait_for_change(tick)
                continue
            degraded = self._store_health(degraded)
            try:
                outcome = self.service.reconcile()
                if outcome is not None and outcome.changed:
                    log.info(
                        "plan revision %d applied: %s",
                        outcome.plan.revision,
                        "; ".join(
                            f"{c.node_id}: +{len(c.start)} ~{len(c.reload)} >{len(c.move)} -{len(c.stop)}"
                            for c in outcome.changes
                        )
                        or "no node change",
                    )
                elif outcome is not None and outcome.held:
                    log.info("new plan held: verify before serving measures its points first")
            except Exception as err:  # noqa: BLE001 - recorded as last_error and a metric; the loop goes on
                log.warning("reconcile failed: %s", err)
            self.service.wait_for_change(tick)

    def stop(self, grace_s: float = 1.0) -> None:
        self._stop.set()
        self.service.wake()
        for name in SERVICES:
            self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        self.grpc.stop(grace_s).wait()
        if self._loop.is_alive():
            self._loop.join(timeout=30)
        if self._watch.is_alive():
            self._watch.join(timeout=5)
        close_worker()
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
            self._metrics_server.server_close()
        self.store.close()
        self._unlock()

    def _unlock(self) -> None:
        if self._lock is not None:
            self._lock.close()  # closing the file releases the flock
            self._lock = None
