"""Synthetic device profiles that tests (and benchmarks) plan with.

`accel_sim_profile` is exact for the demo's simulated accelerator (triton_repo/accel_sim); the demo's
placeholder CPU profile is product code (`stoke up` writes it when no fitted CPU profile is bundled), so
it is handed on from there.
"""

from __future__ import annotations

from interference.profile import DeviceProfile, GpuProfile, ModelProfile
from stoke.commands.demo import demo_cpu_profile

__all__ = ["ACCEL_BASE_MS", "ACCEL_OVERHEAD_MS", "ACCEL_PER_SAMPLE_MS", "accel_sim_profile", "demo_cpu_profile"]

#: The demo's simulated accelerator (triton_repo/accel_sim): a batch of b takes (base + per_sample * b) / cores.
ACCEL_BASE_MS = 10.0
ACCEL_PER_SAMPLE_MS = 5.0
#: Triton's own share of an execution (Python backend round trip), measured on a 2-core machine.
ACCEL_OVERHEAD_MS = 2.0


def accel_sim_profile(cores: int, name: str = "CPU") -> DeviceProfile:
    """An exact profile of `accel_sim` on a CPU node of `cores` cores: one share step per core.

    At share r the model runs on r/100 * cores cores, so one execution of batch b takes
    (base + per_sample * b) * 100 / (cores * r) ms plus Triton's overhead:
    k_act = (k2 b + k3) / r + k5 with k2 = 100 per_sample / cores, k3 = 100 base / cores, k5 = overhead.
    """
    gpu = GpuProfile(
        name=name,
        max_freq_mhz=1.0,
        power_cap_w=1e9,
        idle_power_w=0.0,
        pcie_bytes_per_ms=1e12,
        share_step_pct=round(100.0 / cores, 6),
        sched_slope_ms=0.0,
        sched_intercept_ms=0.0,
        freq_slope_mhz_per_w=0.0,
    )
    model = ModelProfile(
        name="accel_sim",
        kernels=1,
        idle_time_ms=0.0,
        k_act=(0.0, 100.0 * ACCEL_PER_SAMPLE_MS / cores, 100.0 * ACCEL_BASE_MS / cores, 0.0, ACCEL_OVERHEAD_MS),
        power_slope_w=0.0,
        power_intercept_w=0.0,
        l2_slope=0.0,
        l2_intercept=1.0,
        cache_sensitivity=0.0,
        bytes_in=64,
        bytes_out=64,
    )
    return DeviceProfile(gpu=gpu, models={"accel_sim": model})
