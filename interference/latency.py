"""Latency and throughput of workloads co-located on one GPU.

The model (inference-model.md), for workload i at batch b_i, share r_i:

    t_inf  = t_load + t_gpu + t_feedback,  t_load = d_in*b/B,  t_feedback = d_out*b/B
    t_gpu  = (t_sch + t_act) / (f / F)
    t_sch  = idle_solo + n_k * delta_sch(p)            (p = workloads on the GPU)
    t_act  = k_act(b, r) * (1 + alpha * sum_{i' != i} c_i')   (L2 interference)
    c_i    = kc*a_i + bc,  p_i = kp*a_i + bp,  a_i = 1000*b/k_act(b, r)
    f      = F + a_f*(P - P_max) if P = P_idle + sum p_i > P_max, else F
    h      = 1000*b / (t_gpu + t_feedback)    req/s (loading overlaps execution)

`solo_point` computes everything that depends on one workload alone, so a
solver can cache it per (model, batch, share) and re-evaluate a GPU cheaply
with `predict_points`. `VectorPredictor` is the vectorised path: many GPU
configurations in one call.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import NDArray

from interference.profile import DeviceProfile, GpuProfile, ModelProfile

#: The clock never drops below this fraction of F in the model (keeps the
#: linear clock-vs-power fit from extrapolating to nonsense far above the cap).
MIN_CLOCK_FRACTION = 0.3


@dataclass(frozen=True, slots=True)
class SoloPoint:
    """One workload's solo figures at (batch, share); inputs to co-location."""

    model: str
    batch: int
    share_pct: float
    active_ms: float  # k_act(b, r)
    ability_rps: float  # a = 1000*b/k_act
    l2_pct: float  # c
    power_w: float  # p (above idle)
    idle_ms: float
    kernels: int
    cache_sensitivity: float
    load_ms: float
    feedback_ms: float


class Prediction(NamedTuple):
    """One workload's prediction on its GPU (a tuple: solvers build millions of them)."""

    latency_ms: float  # t_inf: one batch, from input transfer to output transfer
    throughput_rps: float  # h
    gpu_ms: float  # t_gpu
    clock_mhz: float  # f on this GPU


def solo_point(profile: DeviceProfile, model: str, batch: int, share_pct: float) -> SoloPoint:
    m = profile.model(model)
    return _solo_point(profile.gpu, m, batch, share_pct)


def _solo_point(gpu: GpuProfile, m: ModelProfile, batch: int, share_pct: float) -> SoloPoint:
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    if not 0 < share_pct <= 100:
        raise ValueError(f"share must be in (0, 100] percent, got {share_pct}")
    active = m.active_time_ms(batch, share_pct)
    if active <= 0:
        raise ValueError(
            f"model {m.name!r}: fitted active time is not positive at batch {batch}, "
            f"share {share_pct}%; refit the profile"
        )
    ability = 1000.0 * batch / active
    return SoloPoint(
        model=m.name,
        batch=batch,
        share_pct=share_pct,
        active_ms=active,
        ability_rps=ability,
        l2_pct=max(0.0, m.l2_slope * ability + m.l2_intercept),
        power_w=max(0.0, m.power_slope_w * ability + m.power_intercept_w),
        idle_ms=m.idle_time_ms,
        kernels=m.kernels,
        cache_sensitivity=m.cache_sensitivity,
        load_ms=m.bytes_in * batch / gpu.pcie_bytes_per_ms,
        feedback_ms=m.bytes_out * batch / gpu.pcie_bytes_per_ms,
    )


def clock_mhz(gpu: GpuProfile, total_power_w: float) -> float:
    """SM clock under the power cap for a demanded total power."""
    if total_power_w <= gpu.power_cap_w:
        return gpu.max_freq_mhz
    f = gpu.max_freq_mhz + gpu.freq_slope_mhz_per_w * (total_power_w - gpu.power_cap_w)
    return max(f, MIN_CLOCK_FRACTION * gpu.max_freq_mhz)


def predict_points(gpu: GpuProfile, points: Sequence[SoloPoint]) -> list[Prediction]:
    """Predict every workload of one GPU from their solo points."""
    if not points:
        return []
    total_l2 = 0.0
    total_power = gpu.idle_power_w
    for p in points:
        total_l2 += p.l2_pct
        total_power += p.power_w
    clock = clock_mhz(gpu, total_power)
    slowdown = gpu.max_freq_mhz / clock
    delay = gpu.scheduling_delay_ms(len(points))
    out = []
    for p in points:
        t_act = p.active_ms * (1.0 + p.cache_sensitivity * (total_l2 - p.l2_pct))
        t_gpu = (p.idle_ms + p.kernels * delay + t_act) * slowdown
        busy = t_gpu + p.feedback_ms
        out.append(Prediction(p.load_ms + busy, 1000.0 * p.batch / busy, t_gpu, clock))
    return out


def batch_curve(
    profile: DeviceProfile, model: str, share_pct: float, max_batch: int, neighbours: Sequence[SoloPoint] = ()
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """L(k) = t_inf and server occupancy O(k) = t_gpu + t_feedback for k = 1..max_batch (ms),
    beside `neighbours` (solo points at their own batch and share): the batching model's input."""
    latency, occupancy = [], []
    for k in range(1, max_batch + 1):
        point = solo_point(profile, model, k, share_pct)
        prediction = predict_points(profile.gpu, [point, *neighbours])[0]
        latency.append(prediction.latency_ms)
        occupancy.append(prediction.gpu_ms + point.feedback_ms)
    return tuple(latency), tuple(occupancy)


def predict_gpu(profile: DeviceProfile, config: Sequence[tuple[str, int, float]]) -> list[Prediction]:
    """Predict each (model, batch, share_pct) co-located on one GPU of this type."""
    total = sum(share for _, _, share in config)
    if total > 100 + 1e-9:
        raise ValueError(f"shares on one GPU add up to {total:g}% > 100%")
    return predict_points(profile.gpu, [solo_point(profile, m, int(b), float(r)) for m, b, r in config])


class VectorPredictor:
    """Vectorised co-location prediction for many GPU configurations at once.

    Configurations are padded arrays of shape (N, K): model index (into
    `model_names`), batch, share and a mask of occupied slots. Same equations
    as `predict_points`.
    """

    def __init__(self, profile: DeviceProfile):
        self.profile = profile
        self.model_names = tuple(sorted(profile.models))
        self.index = {name: i for i, name in enumerate(self.model_names)}
        ms = [profile.models[n] for n in self.model_names]
        self._k = np.array([m.k_act for m in ms], dtype=float)  # (M, 5)
        self._col = {
            name: np.array([getattr(m, name) for m in ms], dtype=float)
            for name in (
                "power_slope_w",
                "power_intercept_w",
                "l2_slope",
                "l2_intercept",
                "cache_sensitivity",
                "idle_time_ms",
                "kernels",
                "bytes_in",
                "bytes_out",
            )
        }

    def encode(self, configs: Sequence[Sequence[tuple[str, int, float]]]) -> tuple[NDArray[Any], ...]:
        """Pad a list of configurations into (model, batch, share, mask) arrays."""
        width = max((len(c) for c in configs), default=0) or 1
        model = np.zeros((len(configs), width), dtype=np.intp)
        batch = np.ones((len(configs), width))
        share = np.full((len(configs), width), 100.0)
        mask = np.zeros((len(configs), width), dtype=bool)
        for i, config in enumerate(configs):
            for j, (name, b, r) in enumerate(config):
                if name not in self.index:
                    self.profile.model(name)  # raises the descriptive error
                model[i, j], batch[i, j], share[i, j], mask[i, j] = self.index[name], b, r, True
        return model, batch, share, mask

    def predict(
        self,
        model: NDArray[Any],
        batch: NDArray[Any],
        share: NDArray[Any],
        mask: NDArray[Any],
        active_ms: NDArray[Any] | None = None,
    ) -> tuple[NDArray[Any], NDArray[Any]]:
        """Latency (ms) and throughput (req/s), shape (N, K); NaN where mask is False.

        `active_ms` (N, K), when given, replaces the fitted k_act (e.g. measured points).
        """
        gpu, c = self.profile.gpu, self._col
        k = self._k[model]  # (N, K, 5)
        if active_ms is None:
            active = (k[..., 0] * batch * batch + k[..., 1] * batch + k[..., 2]) / (share + k[..., 3]) + k[..., 4]
        else:
            active = active_ms
        ability = 1000.0 * batch / active
        l2 = np.maximum(0.0, c["l2_slope"][model] * ability + c["l2_intercept"][model]) * mask
        power = np.maximum(0.0, c["power_slope_w"][model] * ability + c["power_intercept_w"][model]) * mask
        total_power = gpu.idle_power_w + power.sum(axis=1)
        clock = np.where(
            total_power <= gpu.power_cap_w,
            gpu.max_freq_mhz,
            np.maximum(
                gpu.max_freq_mhz + gpu.freq_slope_mhz_per_w * (total_power - gpu.power_cap_w),
                MIN_CLOCK_FRACTION * gpu.max_freq_mhz,
            ),
        )
        count = mask.sum(axis=1)
        delay = np.where(count >= 2, np.maximum(0.0, gpu.sched_slope_ms * count + gpu.sched_intercept_ms), 0.0)
        t_act = active * (1.0 + c["cache_sensitivity"][model] * (l2.sum(axis=1, keepdims=True) - l2))
        t_gpu = (c["idle_time_ms"][model] + c["kernels"][model] * delay[:, None] + t_act) * (gpu.max_freq_mhz / clock)[
            :, None
        ]
        load = c["bytes_in"][model] * batch / gpu.pcie_bytes_per_ms
        feedback = c["bytes_out"][model] * batch / gpu.pcie_bytes_per_ms
        latency = np.where(mask, load + t_gpu + feedback, np.nan)
        throughput = np.where(mask, 1000.0 * batch / (t_gpu + feedback), np.nan)
        return latency, throughput


def share_steps(gpu: GpuProfile) -> NDArray[Any]:
    """All shares a workload may get on this GPU type: multiples of the step up to 100%."""
    steps = int(math.floor(100.0 / gpu.share_step_pct + 1e-9))
    return np.round(np.arange(1, steps + 1) * gpu.share_step_pct, 6)
