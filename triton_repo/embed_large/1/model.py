"""embed_large: embedding bag: 16 hashed ids per sample gathered from a 131072 x 64 FP32 table (32 MiB) and
averaged (memory-heavy, little compute).

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
        rng = np.random.default_rng(3)
        self.table = rng.standard_normal((131072, 64), dtype=np.float32)

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
        ids = (np.abs(x.astype(np.float64)) * 1e6).astype(np.int64) % self.table.shape[0]
        return self.table[ids].mean(axis=1).astype(np.float32)
