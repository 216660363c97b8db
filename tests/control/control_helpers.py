"""Shared helpers of the control-plane tests: a CPU profile of the demo models, fakes."""
from __future__ import annotations

import json

from interference.profile import DeviceProfile, GpuProfile, ModelProfile
from interference.profile_io import profile_to_dict

DEMO_MODELS = ("tiny_echo", "mlp_small", "conv_medium", "embed_large")


def cpu_profile(name: str = "CPU") -> DeviceProfile:
    """Plausible coefficients for the demo models on a CPU node (share = % of its cores)."""
    gpu = GpuProfile(name=name, max_freq_mhz=3000.0, power_cap_w=1000.0, idle_power_w=10.0,
                     pcie_bytes_per_ms=1e9, share_step_pct=5.0, sched_slope_ms=0.001, sched_intercept_ms=0.0,
                     freq_slope_mhz_per_w=-1.0)

    def model(n: str, k2: float, k3: float, k5: float) -> ModelProfile:
        return ModelProfile(name=n, kernels=4, idle_time_ms=0.05, k_act=(0.0, k2, k3, 0.0, k5),
                            power_slope_w=0.001, power_intercept_w=1.0, l2_slope=0.001, l2_intercept=1.0,
                            cache_sensitivity=0.001, bytes_in=256, bytes_out=64)

    return DeviceProfile(gpu=gpu, models={
        "tiny_echo": model("tiny_echo", 2.0, 20.0, 0.2),
        "mlp_small": model("mlp_small", 5.0, 30.0, 0.3),
        "conv_medium": model("conv_medium", 60.0, 40.0, 0.5),
        "embed_large": model("embed_large", 10.0, 40.0, 0.5),
    })


def cpu_profile_json(name: str = "CPU") -> str:
    return json.dumps(profile_to_dict(cpu_profile(name)))
