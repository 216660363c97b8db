"""mlp_small: 3-layer MLP 64 -> 256 -> 256 -> 16 with ReLU (compute-light, ~86k MACs per sample).

Triton Python-backend model; numpy only, weights from a fixed seed (no weight files).
Requests that Triton's dynamic batcher hands over together are stacked into one
array, so the compute really grows with the batch (the point of this demo).
"""

import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        limit = int(config.get("parameters", {}).get("max_supported_batch", {}).get("string_value", "1024"))
        if int(config.get("max_batch_size", 0)) > limit:
            raise pb_utils.TritonModelException(
                f"max_batch_size {config['max_batch_size']} exceeds max_supported_batch {limit}"
            )
        rng = np.random.default_rng(1)
        self.w = [
            (rng.standard_normal((a, b), dtype=np.float32) / np.sqrt(a)).astype(np.float32)
            for a, b in ((64, 256), (256, 256), (256, 16))
        ]
        self.b = [np.zeros(b, dtype=np.float32) + np.float32(0.01) for b in (256, 256, 16)]

    def execute(self, requests):
        arrays = [pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() for r in requests]
        sizes = [a.shape[0] for a in arrays]
        y = self.forward(np.concatenate(arrays).astype(np.float32, copy=False))
        responses, start = [], 0
        for size in sizes:
            out = np.ascontiguousarray(y[start : start + size])
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", out)]))
            start += size
        return responses

    def forward(self, x):
        for i, (w, b) in enumerate(zip(self.w, self.b)):
            x = x @ w + b
            if i < len(self.w) - 1:
                np.maximum(x, 0, out=x)
        return x.astype(np.float32)
