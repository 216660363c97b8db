"""The controller's configuration, declared once: keys, defaults, checks and meaning.

`ControllerConfig` is what `stoke controller --config FILE` reads (YAML,
every key optional); it contains the `ServiceConfig` the service runs with,
whose keys sit at the top level of the file beside the process's own
(listen, db, tls, ...). Each field is a `foundation.validate.setting`: its default,
its rule and one line of meaning. From the same declarations come the error
messages (file, field, value, fix), the list of known keys and the JSON
Schema, `controller/data/controller-config.schema.json` (``make schema``
rewrites it; a test fails when it is stale). An example::

    listen: 127.0.0.1:50051
    db: stoke-controller.db        # relative paths are relative to the config file
    tls: {cert: server.crt, key: server.key}
    heartbeat_timeout_s: 10
    gpu_types:
      - {name: CPU, price_per_hour: 0.10, match: [cpu]}
    profiles:
      - cpu-profile.json                             # or {path: ..., gpu_type: ...}
"""

from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controller.messages import NodeDevice
from foundation import inputs
from foundation import validate as check
from foundation.errors import InputError
from foundation.names import NAME_MAX
from planner.solver import STRATEGIES

SCHEMA_FILE = Path(__file__).resolve().parent / "data" / "controller-config.schema.json"


class ConfigError(InputError):
    """The controller config, or a file it or a flag names (token, TLS material), is unusable; names the file,
    the field and the fix."""


@dataclass(frozen=True)
class GpuTypeConfig:
    """A GPU type the controller prices and recognises by device name."""

    name: str = check.setting(rule=check.NAME, doc="GPU type name, as profiles and workloads name it")
    price_per_hour: float = check.setting(0.0, check.NON_NEGATIVE, "price of one device of this type per hour")
    match: tuple[str, ...] = check.setting(
        (),
        check.STRINGS,
        "case-insensitive substrings of a device name that mean this type; `cpu` or `gpu` alone claims every "
        "device of that kind",
    )


@dataclass(frozen=True)
class ObservationsConfig:
    """What the agents observe, as stored data (`stoke observations`): bounded in age and in rows."""

    retention_s: float = check.setting(86400.0, check.POSITIVE_SECONDS, "windows older than this are deleted")
    max_rows: int = check.setting(
        200000, check.POSITIVE_WHOLE, "at most this many windows are kept (the oldest go first)"
    )
    reserve_mib: int = check.setting(
        64,
        check.WHOLE,
        "free space (MiB, at most a quarter of the filesystem) kept for desired state: below it no window is "
        "stored and the oldest are deleted",
    )


@dataclass(frozen=True)
class RecalibrationConfig:
    """Online recalibration of the active-time coefficients per (model, GPU type) from the observations."""

    enabled: bool = check.setting(True, doc="recalibrate the profiles from what the agents observe")
    interval_s: float = check.setting(5.0, check.POSITIVE_SECONDS, "how often the estimator runs")
    half_life_s: float = check.setting(
        300.0, check.POSITIVE_SECONDS, "exponential forgetting: an observation this old weighs half"
    )
    min_windows: float = check.setting(5.0, check.POSITIVE, "evidence needed: observation windows after forgetting")
    min_executions: float = check.setting(100.0, check.POSITIVE, "evidence needed: executions after forgetting")
    recent_windows: int = check.setting(
        10, check.POSITIVE_WHOLE, "a regime change: the newest windows alone win when they differ by over 10%"
    )
    replan_threshold: float = check.setting(
        0.10,
        check.POSITIVE,
        "publish (and re-plan) only when a placed replica's predicted p99 moves by more than this share of its SLO "
        "(a new serving term: see refresh_within_accuracy)",
    )
    confirmations: int = check.setting(
        2,
        check.POSITIVE_WHOLE,
        "consecutive estimates from new windows that must cross the threshold, agreeing within half of it",
    )
    refresh_within_accuracy: bool = check.setting(
        True,
        doc="also publish a serving-path correction that moves a placed replica's predicted p99 by more than the "
        "accuracy goal though under the re-plan threshold (a loose SLO's threshold is many times its p99): the "
        "predictions stay within the goal of what clients see",
    )
    accuracy: float = check.setting(
        0.2, check.FRACTION, "the accuracy goal of a prediction: this share of it, or accuracy_ms, whichever is wider"
    )
    accuracy_ms: float = check.setting(2.0, check.positive_up_to(60_000.0, "ms"), "the accuracy goal's floor (ms)")
    min_interval_s: float = check.setting(
        300.0,
        check.POSITIVE_SECONDS,
        "at least this long between two versions of one (model, GPU type), unless the SLI p99 is above the "
        "active prediction (a prediction below what clients see skips the interval)",
    )


@dataclass(frozen=True)
class DemandConfig:
    """Demand tracking of workloads with `rate_rps: auto`."""

    window_s: float = check.setting(60.0, check.POSITIVE_SECONDS, "sliding window of observed rates")
    quantile: float = check.setting(0.95, check.POSITIVE, "plan for this quantile of the window's rates (0..1]")
    headroom: float = check.setting(0.25, check.NON_NEGATIVE, "plan for the quantile times (1 + headroom)")
    up_heartbeats: int = check.setting(
        2, check.POSITIVE_WHOLE, "scale up after this many heartbeats in a row above the planned rate"
    )
    cooldown_s: float = check.setting(
        120.0, check.POSITIVE_SECONDS, "scale down only after this long without a change, from the whole window"
    )
    down_tolerance: float = check.setting(
        0.2, check.NON_NEGATIVE, "scale down only when the new rate is this much below the planned one"
    )
    initial_rps: float = check.setting(1.0, check.POSITIVE, "planned rate of a new auto workload without min_rps")

    def __post_init__(self) -> None:
        if not 0.0 < self.quantile <= 1.0:
            raise ConfigError(f"demand.quantile must be in (0, 1], got {self.quantile:g}", "demand.quantile")


@dataclass(frozen=True)
class GuardConfig:
    """The SLO guard: a replica over its SLO moves to a larger share without waiting for recalibration."""

    enabled: bool = check.setting(True, doc="move replicas whose observed p99 stays over the SLO")
    windows: int = check.setting(3, check.POSITIVE_WHOLE, "consecutive heartbeat windows with p99 over the SLO")
    min_requests: int = check.setting(20, check.POSITIVE_WHOLE, "a window counts only with this many requests")
    hold_s: float = check.setting(
        600.0, check.POSITIVE_SECONDS, "the larger share is a floor for the planner this long"
    )
    cooldown_s: float = check.setting(
        20.0, check.POSITIVE_SECONDS, "after a move, the same workload waits this long before another"
    )


@dataclass(frozen=True)
class VerificationConfig:
    """Verify before serving: a new assignment's (model, batch, share) points are measured by its node
    before it serves, and the workloads re-planned on the measurements (`controller.verification`)."""

    enabled: bool = check.setting(
        False,
        doc="before a new or changed assignment serves at a point the profile has not measured, its node measures "
        "it and the plan is re-planned on the measurement (the applied plan keeps serving meanwhile)",
    )
    max_points: int = check.setting(
        64, check.whole_at_least(1), "most points (batch sizes at a share) asked for in one round"
    )
    rounds: int = check.setting(
        4, check.whole_at_least(1), "re-plans on measured points before the plan serves as it stands"
    )
    timeout_s: float = check.setting(
        120.0,
        check.POSITIVE_SECONDS,
        "a point not measured within this (node gone, device failing) is given up and reported; the plan serves "
        "without it",
    )
    requests: int = check.setting(20, check.whole_at_least(1), "requests per measurement window")

    def __post_init__(self) -> None:
        if self.requests > 1_000:  # limits.MAX_MEASURE_WINDOW_REQUESTS: what an agent runs
            raise ConfigError(
                f"verification.requests must be at most 1000, got {self.requests}", "verification.requests"
            )
        if self.max_points > 4096:
            raise ConfigError(
                f"verification.max_points must be at most 4096, got {self.max_points}", "verification.max_points"
            )
        if self.rounds > 100:
            raise ConfigError(f"verification.rounds must be at most 100, got {self.rounds}", "verification.rounds")


@dataclass(frozen=True)
class ServiceConfig:
    """How the control-plane service plans and watches the nodes."""

    heartbeat_interval_s: float = check.setting(2.0, check.POSITIVE_SECONDS, "heartbeat interval told to agents")
    heartbeat_timeout_s: float = check.setting(
        10.0, check.POSITIVE_SECONDS, "a node silent this long is lost and its workloads re-planned"
    )
    strategy: str = check.setting("stoke", check.choice(tuple(STRATEGIES)), "solver strategy")
    gpu_types: tuple[GpuTypeConfig, ...] = check.setting(
        (GpuTypeConfig("CPU", 0.10, ("cpu",)),), doc="prices, and how device names map to GPU types"
    )
    cpu_gpu_type: str = check.setting("CPU", check.NAME, "GPU type of CPU devices no `match` claims")
    failed_device_block_s: float = check.setting(
        120.0, check.POSITIVE_SECONDS, "a device where every assignment failed to start leaves the inventory this long"
    )
    partition_fraction: float = check.setting(
        0.5,
        check.FRACTION,
        "when more than this fraction of the nodes fall silent together, the plan is held (a network or "
        "controller fault is assumed) instead of re-planning their workloads; 1 turns the hold off (clusters "
        "of one or two nodes)",
    )
    solver_budget_s: float = check.setting(
        30.0,
        check.NON_NEGATIVE,
        "longest one solver run may take (a killable worker process); a workload that cannot be planned "
        "within it is pending with the reason (0 = solve in the controller process, without a budget)",
    )
    solver_memory_mib: int = check.setting(
        4096, check.whole_at_least(256), "memory limit of the solver worker process (MiB)"
    )
    observations: ObservationsConfig = check.setting(ObservationsConfig(), doc="stored observation windows")
    recalibration: RecalibrationConfig = check.setting(RecalibrationConfig(), doc="online recalibration")
    demand: DemandConfig = check.setting(DemandConfig(), doc="demand tracking (rate_rps: auto)")
    guard: GuardConfig = check.setting(GuardConfig(), doc="the SLO guard")
    verification: VerificationConfig = check.setting(VerificationConfig(), doc="verify before serving (off by default)")

    def __post_init__(self) -> None:
        if self.heartbeat_timeout_s <= self.heartbeat_interval_s:
            raise ConfigError(
                f"heartbeat_timeout_s ({self.heartbeat_timeout_s:g}) must be larger than "
                f"heartbeat_interval_s ({self.heartbeat_interval_s:g})",
                "heartbeat_timeout_s",
            )
        self._check_gpu_types()

    def _check_gpu_types(self) -> None:
        """One entry per GPU type, and a `match` string claims devices for one type only: with two, the first
        listed won silently (a price or a match given twice is ambiguous, not a refinement)."""
        first_name: dict[str, int] = {}
        first_match: dict[str, int] = {}
        for i, t in enumerate(self.gpu_types):
            if t.name in first_name:
                j = first_name[t.name]
                raise ConfigError(
                    f"gpu_types[{i}].name {t.name!r} repeats gpu_types[{j}].name; give each GPU type one entry "
                    "(its price and every match string)",
                    f"gpu_types[{i}].name",
                )
            first_name[t.name] = i
            for m in dict.fromkeys(m.lower() for m in t.match):  # matching ignores case
                if m in first_match:
                    j = first_match[m]
                    raise ConfigError(
                        f"gpu_types[{i}].match {m!r} is also in gpu_types[{j}].match: devices it matches would be "
                        f"{self.gpu_types[j].name}, never {t.name}; keep it in one of the two",
                        f"gpu_types[{i}].match",
                    )
                first_match[m] = i

    def gpu_type_for(self, device: NodeDevice) -> str:
        if device.gpu_type:
            return device.gpu_type
        name, kind = device.name.lower(), device.kind.lower()
        for t in self.gpu_types:
            # `match: [cpu]` reads as "CPU devices": a CPU's name ("AMD EPYC 7B13") rarely says so
            if any(m.lower() in name or m.lower() == kind for m in t.match):
                return t.name
        if device.kind == "cpu":
            return self.cpu_gpu_type
        # an unconfigured GPU: its NVML name ("NVIDIA H200") made into a valid GPU type name ("NVIDIA-H200",
        # `foundation.names`' rule), so profiles and workloads can name it
        name = re.sub(r"[^A-Za-z0-9._-]+", "-", device.name).strip("-._")[:NAME_MAX]
        return name or "gpu"

    def price(self, gpu_type: str) -> float:
        for t in self.gpu_types:
            if t.name == gpu_type:
                return t.price_per_hour
        return 0.0


@dataclass(frozen=True)
class TlsConfig:
    """Serve TLS with this certificate and key."""

    cert: str = check.setting(rule=check.PATH, doc="PEM certificate file")
    key: str = check.setting(rule=check.PATH, doc="PEM private key file")


@dataclass(frozen=True)
class ProfileSource:
    """A fitted profile uploaded when the controller starts."""

    SHORTHAND = "path"  # a bare string is the path

    path: str = check.setting(rule=check.PATH, doc="fitted profile JSON (`stoke profile fit`)")
    gpu_type: str = check.setting("", doc="store it under this GPU type (default: the profile's gpu.name)")


@dataclass(frozen=True)
class ControllerConfig:
    """The controller process: where it listens, what it stores, and the service it runs."""

    listen: str = check.setting("127.0.0.1:50051", check.ADDRESS, "gRPC address (port 0 = any free port)")
    metrics_listen: str = check.setting(
        "127.0.0.1:9470", check.ADDRESS_OR_OFF, 'Prometheus /metrics address ("" = off)'
    )
    db: str = check.setting("stoke-controller.db", check.PATH, "SQLite file (WAL)")
    token_file: str | None = check.setting(
        None, check.PATH, "bearer token file (first line); else $STOKE_TOKEN; else no auth (a warning)"
    )
    tls: TlsConfig | None = check.setting(None, doc="serve TLS")
    reconcile_interval_s: float = check.setting(
        1.0, check.POSITIVE_SECONDS, "the reconcile loop's tick (it also wakes on every change)"
    )
    profiles: tuple[ProfileSource, ...] = check.setting((), doc="fitted profiles uploaded at start")
    backup_dir: str | None = check.setting(
        None, check.PATH, "online backups of the database go here (default: DB.backups beside the database)"
    )
    backup_interval_s: float = check.setting(
        3600.0, check.NON_NEGATIVE, "seconds between online backups (SQLite's backup API); 0 = none"
    )
    backup_keep: int = check.setting(24, check.POSITIVE_WHOLE, "newest backups kept")
    service: ServiceConfig = check.setting(ServiceConfig(), flatten=True)


#: Keys the command line may override (`stoke controller --listen ...`); paths given there are relative to the cwd.
PATH_OVERRIDES = ("db", "token_file", "backup_dir")


def load_config(path: str | os.PathLike[str] | None, **overrides: Any) -> ControllerConfig:
    """Read the YAML config (None: defaults); `overrides` (not None) win over the file."""
    data: Any = {}
    base: Path | None = None
    source = "defaults"
    if path is not None:
        source, base = str(path), Path(path).resolve().parent
        data = _read_yaml(Path(path))
        if not isinstance(data, dict):
            known = ", ".join(check.keys(ControllerConfig))
            raise ConfigError(f"{path}: the config must be a mapping of keys ({known})")
    given = {k: v for k, v in overrides.items() if v is not None}
    if given:
        flags = ", ".join("--" + k.removesuffix("_s").replace("_", "-") for k in sorted(given))
        source = f"{source} + command line ({flags})"  # which flag a bad value came from
        # command-line paths are relative to the cwd, not to the config file
        given.update({k: str(Path(v).absolute()) for k, v in given.items() if k in PATH_OVERRIDES and v})
        data = {**data, **given}
    return check.load(ControllerConfig, data, where=source, error=ConfigError, base_dir=base)


def _read_yaml(path: Path) -> Any:
    text = inputs.read_text(path, "the controller config", error=ConfigError)
    return inputs.parse_yaml(text, inputs.shown_path(path), "the controller config", error=ConfigError) or {}


def config_schema() -> dict[str, Any]:
    return check.json_schema(ControllerConfig, "stoke controller config")


def schema_text() -> str:
    return json.dumps(config_schema(), indent=2) + "\n"


if __name__ == "__main__":  # `make schema`: rewrite the committed JSON Schema
    from foundation.files import atomic_write_text

    print(
        f"{SCHEMA_FILE}: {'written' if atomic_write_text(SCHEMA_FILE, schema_text()) else 'unchanged'}", file=sys.stderr
    )
