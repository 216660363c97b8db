"""Shared set-up of the closed-loop tests on the real service (tmp SQLite, real solver, fake clock): the
accel_sim profile on a 2-core CPU node, a loop configuration that acts within seconds, and observation
windows computed from a "true" profile (the accel_sim profile times a factor: the injected bias)."""

from __future__ import annotations

from profiles import accel_sim_profile

from controller.config import DemandConfig, GuardConfig, RecalibrationConfig, ServiceConfig
from controller.messages import BatchStat, ModelAssignment, NodeDevice, Observation
from interference.latency import predict_gpu
from interference.profile import DeviceProfile
from interference.recalibration import Correction, apply_corrections

CPU = (NodeDevice(0, "cpu", "cpu", cores=2),)
PROFILE = accel_sim_profile(2)
CONFIG = ServiceConfig(
    heartbeat_interval_s=1.0,
    heartbeat_timeout_s=30.0,
    recalibration=RecalibrationConfig(interval_s=1.0, half_life_s=30.0, min_windows=5, min_executions=50),
    guard=GuardConfig(windows=3, min_requests=10, hold_s=60.0, cooldown_s=10.0),
    demand=DemandConfig(window_s=30.0, cooldown_s=40.0, up_heartbeats=2),
)


class Clock:
    """A clock the test moves by hand (`clock.t += seconds`)."""

    def __init__(self, t: float = 1_700_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def truth(factor: float) -> DeviceProfile:
    """The true device: accel_sim's profile with every batch `factor` times slower."""
    c = Correction("accel_sim", "scale", factor, factor, 0, 0, 0, 0, 0)
    return apply_corrections(PROFILE, {"accel_sim": c})


def window(
    a: ModelAssignment,
    seq: int,
    factor: float = 1.0,
    rate: float | None = None,
    seconds: float = 1.0,
    requests: int | None = None,
    **latency: float | None,
) -> Observation:
    """One window of `a` served by the true device at `rate` (default: its planned rate); `latency` sets the
    window's SLI fields (latency_p99_ms, latency_p50_ms, over_slo_ratio)."""
    r = a.rate_rps if rate is None else rate
    n = max(1, int(min(r, 1e5) * seconds)) if requests is None else requests
    stats = tuple(
        BatchStat(b, max(1, n // (2 * b)), predict_gpu(truth(factor), [(a.model, b, a.share_pct)])[0].latency_ms)
        for b in sorted({1, a.batch})
    )
    return Observation(
        a.key,
        a.model,
        request_rate_rps=r,
        seq=seq,
        window_s=seconds,
        requests=n,
        batch_stats=stats,
        latency_count=n,
        **latency,
    )
