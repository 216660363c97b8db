"""Shared helpers of the control-plane tests: a CPU profile of the demo models."""

from __future__ import annotations

import json

from interference.profile_io import profile_to_dict
from stoke.commands.demo import demo_cpu_profile

DEMO_MODELS = ("tiny_echo", "mlp_small", "conv_medium", "embed_large")


def cpu_profile(name: str = "CPU"):
    """Plausible coefficients for the demo models on a CPU node (share = % of its cores)."""
    return demo_cpu_profile(name)


def cpu_profile_json(name: str = "CPU") -> str:
    return json.dumps(profile_to_dict(cpu_profile(name)))
