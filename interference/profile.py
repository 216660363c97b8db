"""Fitted performance profiles: one GPU type and the models profiled on it.

A `DeviceProfile` is what the solver and the predictor consume. It is plain,
frozen data; reading and writing it (JSON with a format version) lives in
`interference.profile_io`, the only module here that touches files.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from foundation.errors import StokeError

#: Bumped whenever the saved JSON layout changes incompatibly.
PROFILE_FORMAT_VERSION = 1
#: A fitted model must hold over batches 1..this (the solvers' range, planner.solver.candidates.MAX_BATCH)
#: and every share step, not only at the profiled points (`interference.fit` checks it). Here, beside the
#: types, so the CLI can name it without importing the fit (scikit-learn, scipy).
DOMAIN_MAX_BATCH = 32


@dataclass(frozen=True)
class GpuProfile:
    """Coefficients of one GPU type (reference: inference-model.md)."""

    name: str
    max_freq_mhz: float  # F
    power_cap_w: float  # P_max
    idle_power_w: float  # P_idle
    pcie_bytes_per_ms: float  # B
    share_step_pct: float  # smallest MPS share increment (100 / (SMs/2))
    sched_slope_ms: float  # a_sch: per-kernel scheduling delay growth per co-located workload
    sched_intercept_ms: float  # b_sch
    freq_slope_mhz_per_w: float  # a_f (< 0): SM clock lost per watt above the cap

    def scheduling_delay_ms(self, colocated: int) -> float:
        """Per-kernel extra scheduling delay with `colocated` workloads on the GPU."""
        if colocated < 2:
            return 0.0
        return max(0.0, self.sched_slope_ms * colocated + self.sched_intercept_ms)


@dataclass(frozen=True)
class ModelProfile:
    """Coefficients of one model on one GPU type.

    Solo active time (ms) at batch b and share r (percent):
        k_act(b, r) = (k1*b^2 + k2*b + k3) / (r + k4) + k5
    Processing ability a = 1000*b / k_act (req/s) drives
        L2 utilisation c = l2_slope*a + l2_intercept  (percent) and
        power above idle p = power_slope*a + power_intercept  (W).
    """

    name: str
    kernels: int  # n_k
    idle_time_ms: float  # solo scheduling idle time of one inference
    k_act: tuple[float, float, float, float, float]
    power_slope_w: float  # kp
    power_intercept_w: float  # bp
    l2_slope: float  # kc
    l2_intercept: float  # bc
    cache_sensitivity: float  # alpha_cache
    bytes_in: int  # d_in per request
    bytes_out: int  # d_out per request

    def active_time_ms(self, batch: float, share_pct: float) -> float:
        k1, k2, k3, k4, k5 = self.k_act
        return (k1 * batch * batch + k2 * batch + k3) / (share_pct + k4) + k5


@dataclass(frozen=True)
class DeviceProfile:
    """A GPU type with the models profiled on it."""

    gpu: GpuProfile
    models: Mapping[str, ModelProfile] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "models", MappingProxyType(dict(self.models)))

    def model(self, name: str) -> ModelProfile:
        try:
            return self.models[name]
        except KeyError:
            known = ", ".join(sorted(self.models)) or "none"
            raise UnknownModelError(
                f"model {name!r} is not in the {self.gpu.name} profile (profiled models: {known}); "
                f"profile it and fit it with `stoke profile fit`, or use one of the profiled models"
            ) from None


class UnknownModelError(StokeError, KeyError):
    """A workload names a model that the GPU profile does not know."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])
