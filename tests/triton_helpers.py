"""Shared constants and helpers of the tests that run Triton: the demo repository, ports, inference."""

from __future__ import annotations

import socket
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
DEMO_REPO = REPO_ROOT / "triton_repo"
DEMO_MODELS = ("tiny_echo", "mlp_small", "conv_medium", "embed_large")
#: Every model of triton_repo/: the demo models, batch_sleep (the batching check's model) and accel_sim (the
#: closed loop's simulated accelerator).
REPO_MODELS = (*DEMO_MODELS, "batch_sleep", "accel_sim")
INPUT_SHAPES = {
    "tiny_echo": (8,),
    "mlp_small": (64,),
    "conv_medium": (3, 32, 32),
    "embed_large": (16,),
    "batch_sleep": (8,),
    "accel_sim": (16,),
}
OUTPUT_SHAPES = {
    "tiny_echo": (8,),
    "mlp_small": (16,),
    "conv_medium": (10,),
    "embed_large": (64,),
    "batch_sleep": (8,),
    "accel_sim": (16,),
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def infer(url: str, model: str, batch: int = 2, seed: int = 0) -> np.ndarray:
    import tritonclient.grpc as grpcclient

    data = np.random.default_rng(seed).random((batch, *INPUT_SHAPES[model])).astype(np.float32)
    tensor = grpcclient.InferInput("INPUT0", list(data.shape), "FP32")
    tensor.set_data_from_numpy(data)
    client = grpcclient.InferenceServerClient(url)
    try:
        return client.infer(model, [tensor]).as_numpy("OUTPUT0")
    finally:
        client.close()
