"""The controller process: config, store, service, gRPC server, metrics endpoint, reconcile loop.

Configuration (YAML, every key optional; `stoke controller --config FILE`):

    listen: 127.0.0.1:50051         # gRPC address (host:port; port 0 = any free port)
    metrics_listen: 127.0.0.1:9470  # Prometheus /metrics ("" = off)
    db: stoke-controller.db         # SQLite file (WAL); relative to the config file
    token_file: token.txt           # bearer token (first line); else $STOKE_TOKEN; else no auth (a warning)
    tls:                            # optional: serve TLS
      cert: server.crt
      key: server.key
    heartbeat_interval_s: 2         # told to agents
    heartbeat_timeout_s: 10         # a node silent this long is lost and re-planned
    reconcile_interval_s: 1         # the loop's tick (it also wakes on every change)
    strategy: stoke                 # solver strategy
    gpu_types:                      # prices, and how device names map to GPU types
      - name: CPU
        price_per_hour: 0.10
        match: [cpu]                # case-insensitive substrings of the device name
    cpu_gpu_type: CPU               # GPU type of CPU devices no `match` claims
    failed_device_block_s: 120      # a device where every assignment failed to start leaves the inventory this long
    profiles:                       # fitted profiles uploaded at start (relative to the config file)
      - path: triton_repo/profiles/cpu.json
        gpu_type: CPU               # optional; default: the profile's gpu.name
"""
from __future__ import annotations

import logging
import os
import threading
import time
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import grpc
import yaml
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from controller.api import stoke_pb2, stoke_pb2_grpc
from controller.api.auth import AuthConfigError, BearerTokenInterceptor, read_token, server_credentials
from controller.api.handlers import AgentHandlers, ControllerHandlers
from controller.metrics import ControllerMetrics
from controller.service import ControlService, GpuTypeConfig, ServiceConfig
from controller.solver import solve
from controller.store import Store
from stoke.errors import InputError

log = logging.getLogger("stoke.controller")


class ConfigError(InputError):
    """The controller config is malformed; names the file, the field and the fix."""


@dataclass(frozen=True)
class ControllerConfig:
    listen: str = "127.0.0.1:50051"
    metrics_listen: str = "127.0.0.1:9470"
    db: str = "stoke-controller.db"
    token_file: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    heartbeat_interval_s: float = 2.0
    heartbeat_timeout_s: float = 10.0
    reconcile_interval_s: float = 1.0
    strategy: str = "stoke"
    gpu_types: tuple[GpuTypeConfig, ...] = (GpuTypeConfig("CPU", 0.10, ("cpu",)),)
    cpu_gpu_type: str = "CPU"
    failed_device_block_s: float = 120.0
    profiles: tuple[tuple[str, str], ...] = field(default=())   # (path, gpu_type or "")

    def service_config(self) -> ServiceConfig:
        return ServiceConfig(heartbeat_interval_s=self.heartbeat_interval_s,
                             heartbeat_timeout_s=self.heartbeat_timeout_s, strategy=self.strategy,
                             gpu_types=self.gpu_types, cpu_gpu_type=self.cpu_gpu_type,
                             failed_device_block_s=self.failed_device_block_s)


def load_config(path: str | os.PathLike[str] | None, **overrides: Any) -> ControllerConfig:
    """Read the YAML config (None: defaults); `overrides` (not None) win over the file."""
    data: dict[str, Any] = {}
    base = Path(".")
    source = "defaults"
    if path is not None:
        source = str(path)
        base = Path(path).resolve().parent
        try:
            loaded = yaml.safe_load(Path(path).read_text())
        except OSError as err:
            raise ConfigError(f"{path}: cannot read the controller config ({err.strerror})") from None
        except yaml.YAMLError as err:
            raise ConfigError(f"{path}: not valid YAML ({str(err).splitlines()[0]})") from None
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: the config must be a mapping of keys (listen, db, ...)")
        data = loaded
    known = {"listen", "metrics_listen", "db", "token_file", "tls", "heartbeat_interval_s", "heartbeat_timeout_s",
             "reconcile_interval_s", "strategy", "gpu_types", "cpu_gpu_type", "profiles", "failed_device_block_s"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"{source}: unknown key {unknown[0]!r}; known keys: {', '.join(sorted(known))}")
    # command-line overrides go through the same checks as the file; their paths are relative to the cwd
    paths = {k: str(Path(v).absolute()) for k, v in overrides.items() if k in ("db", "token_file") and v}
    data = {**data, **{k: v for k, v in overrides.items() if v is not None}, **paths}
    if any(v is not None for v in overrides.values()):
        source = f"{source} + command line"

    def rel(value: Any, key: str) -> str | None:
        if value is None or value == "":
            return None
        if not isinstance(value, str):
            raise ConfigError(f"{source}: {key} must be a path string, got {value!r}")
        p = Path(value)
        return str(p if p.is_absolute() else base / p)

    def positive(key: str, default: float) -> float:
        value = data.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise ConfigError(f"{source}: {key} must be a positive number of seconds, got {value!r}")
        return float(value)

    def address(key: str, default: str, allow_empty: bool = False) -> str:
        value = data.get(key, default)
        if value in ("", None) and allow_empty:
            return ""
        if not isinstance(value, str) or ":" not in value or not value.rsplit(":", 1)[1].isdigit():
            raise ConfigError(f"{source}: {key} must be HOST:PORT, got {value!r}")
        return value

    tls = data.get("tls") or {}
    if not isinstance(tls, dict) or (tls and not ({"cert", "key"} <= set(tls))):
        raise ConfigError(f"{source}: tls must be a mapping with both 'cert' and 'key' paths")
    gpu_types = []
    for i, item in enumerate(data.get("gpu_types") or [{"name": "CPU", "price_per_hour": 0.10, "match": ["cpu"]}]):
        if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not item["name"]:
            raise ConfigError(f"{source}: gpu_types[{i}].name must be a non-empty string")
        price = item.get("price_per_hour", 0.0)
        if isinstance(price, bool) or not isinstance(price, (int, float)) or price < 0:
            raise ConfigError(f"{source}: gpu_types[{i}].price_per_hour must be a number >= 0, got {price!r}")
        match = item.get("match", [])
        match = [match] if isinstance(match, str) else match
        if not isinstance(match, list) or not all(isinstance(m, str) and m for m in match):
            raise ConfigError(f"{source}: gpu_types[{i}].match must be a list of device-name substrings")
        gpu_types.append(GpuTypeConfig(item["name"], float(price), tuple(match)))
    profiles = []
    for i, item in enumerate(data.get("profiles") or []):
        item = {"path": item} if isinstance(item, str) else item
        if not isinstance(item, dict) or "path" not in item:
            raise ConfigError(f"{source}: profiles[{i}] must be a path or a mapping with 'path'")
        profiles.append((rel(item["path"], f"profiles[{i}].path") or "", str(item.get("gpu_type") or "")))
    strategy = data.get("strategy", "stoke")
    from controller.solver import STRATEGIES
    if strategy not in STRATEGIES:
        raise ConfigError(f"{source}: strategy {strategy!r} is unknown; choose one of {', '.join(STRATEGIES)}")
    values = dict(
        listen=address("listen", "127.0.0.1:50051"),
        metrics_listen=address("metrics_listen", "127.0.0.1:9470", allow_empty=True),
        db=rel(data.get("db", "stoke-controller.db"), "db") or "stoke-controller.db",
        token_file=rel(data.get("token_file"), "token_file"),
        tls_cert=rel(tls.get("cert"), "tls.cert"), tls_key=rel(tls.get("key"), "tls.key"),
        heartbeat_interval_s=positive("heartbeat_interval_s", 2.0),
        heartbeat_timeout_s=positive("heartbeat_timeout_s", 10.0),
        reconcile_interval_s=positive("reconcile_interval_s", 1.0),
        failed_device_block_s=positive("failed_device_block_s", 120.0),
        strategy=strategy, gpu_types=tuple(gpu_types), cpu_gpu_type=str(data.get("cpu_gpu_type", "CPU")),
        profiles=tuple(profiles))
    if values["heartbeat_timeout_s"] <= values["heartbeat_interval_s"]:
        raise ConfigError(f"{source}: heartbeat_timeout_s ({values['heartbeat_timeout_s']}) must be larger than "
                          f"heartbeat_interval_s ({values['heartbeat_interval_s']})")
    return ControllerConfig(**values)


class ControllerServer:
    """Everything of one controller process; `start()` then `stop()`."""

    def __init__(self, config: ControllerConfig, *, clock: Callable[[], float] = time.time,
                 solver: Callable[..., Any] = solve, max_workers: int = 16) -> None:
        self.config = config
        try:
            token = read_token(config.token_file)
        except AuthConfigError as err:
            raise ConfigError(str(err)) from None
        self.auth = token is not None
        if not self.auth:
            log.warning("no token (token_file / $STOKE_TOKEN): the API is open to anyone who can reach %s",
                        config.listen)
        self.store = Store(config.db)
        self.metrics = ControllerMetrics()
        self.service = ControlService(self.store, config.service_config(), clock=clock, solver=solver,
                                      observer=self.metrics)
        self.metrics.attach(self.service)
        for path, gpu_type in config.profiles:
            try:
                text = Path(path).read_text()
            except OSError as err:
                raise ConfigError(f"{path}: cannot read the profile named in profiles ({err.strerror})") from None
            try:
                self.service.upload_profile(text, gpu_type)
            except Exception as err:  # noqa: BLE001 - InvalidArgument with the field
                raise ConfigError(f"{path}: {err}") from None
        interceptors = [BearerTokenInterceptor(token)] if token else []
        self.grpc = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="stoke-rpc"),
                                interceptors=interceptors)
        stoke_pb2_grpc.add_StokeControllerServicer_to_server(ControllerHandlers(self.service), self.grpc)
        stoke_pb2_grpc.add_AgentGatewayServicer_to_server(AgentHandlers(self.service), self.grpc)
        self.health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.grpc)
        names = (stoke_pb2.DESCRIPTOR.services_by_name["StokeController"].full_name,
                 stoke_pb2.DESCRIPTOR.services_by_name["AgentGateway"].full_name,
                 health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME)
        reflection.enable_server_reflection(names, self.grpc)
        if config.tls_cert and config.tls_key:
            try:
                creds = server_credentials(config.tls_cert, config.tls_key)
            except AuthConfigError as err:
                raise ConfigError(str(err)) from None
            self.port = self.grpc.add_secure_port(config.listen, creds)
        else:
            self.port = self.grpc.add_insecure_port(config.listen)
        if not self.port:
            raise ConfigError(f"cannot listen on {config.listen} (in use?); change listen in the config")
        self.address = f"{config.listen.rsplit(':', 1)[0]}:{self.port}"
        self.metrics_port = 0
        self._metrics_server: Any = None
        self._stop = threading.Event()
        self._loop = threading.Thread(target=self._reconcile_loop, name="stoke-reconcile", daemon=True)

    def start(self) -> "ControllerServer":
        self.grpc.start()
        if self.config.metrics_listen:
            host, port = self.config.metrics_listen.rsplit(":", 1)
            try:
                self._metrics_server, _ = self.metrics.serve(host, int(port))
            except OSError as err:
                self.grpc.stop(0)
                raise ConfigError(f"cannot serve metrics on {self.config.metrics_listen} ({err.strerror}); "
                                  f"change metrics_listen") from None
            self.metrics_port = self._metrics_server.server_port
        for name in ("", "stoke.v1.StokeController", "stoke.v1.AgentGateway"):
            self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        self._loop.start()
        log.info("controller on %s (auth %s, tls %s), metrics on %s", self.address, "on" if self.auth else "off",
                 "on" if self.config.tls_cert else "off", self.metrics_port or "off")
        return self

    def _reconcile_loop(self) -> None:
        tick = min(self.config.reconcile_interval_s, self.config.heartbeat_timeout_s / 4)
        while not self._stop.is_set():
            try:
                outcome = self.service.reconcile()
                if outcome is not None and outcome.changed:
                    log.info("plan revision %d applied: %s", outcome.plan.revision,
                             "; ".join(f"{c.node_id}: +{len(c.start)} ~{len(c.reload)} >{len(c.move)} "
                                       f"-{len(c.stop)}" for c in outcome.changes) or "no node change")
            except Exception as err:  # noqa: BLE001 - recorded as last_error and a metric; the loop goes on
                log.warning("reconcile failed: %s", err)
            self.service.wait_for_change(tick)

    def stop(self, grace_s: float = 1.0) -> None:
        self._stop.set()
        self.service.wake()
        for name in ("", "stoke.v1.StokeController", "stoke.v1.AgentGateway"):
            self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        self.grpc.stop(grace_s).wait()
        if self._loop.is_alive():
            self._loop.join(timeout=30)
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
            self._metrics_server.server_close()
        self.store.close()
