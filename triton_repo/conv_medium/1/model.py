"""conv_medium: two 3x3 convolutions (3->16, pool, 16->32) on 3x32x32, global average pool, dense 32 -> 10
(compute-heavy, ~1.2M MACs per sample).

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
        rng = np.random.default_rng(2)
        self.k1 = (rng.standard_normal((27, 16), dtype=np.float32) / np.sqrt(27)).astype(np.float32)
        self.k2 = (rng.standard_normal((144, 32), dtype=np.float32) / np.sqrt(144)).astype(np.float32)
        self.dense = (rng.standard_normal((32, 10), dtype=np.float32) / np.sqrt(32)).astype(np.float32)

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

    @staticmethod
    def conv3x3(x, kernel):
        """Valid 3x3 convolution of x (N, C, H, W) as im2col + matmul; kernel is (C*9, K)."""
        n, c, h, w = x.shape
        win = np.lib.stride_tricks.sliding_window_view(x, (3, 3), axis=(2, 3))  # N, C, H-2, W-2, 3, 3
        cols = win.transpose(0, 2, 3, 1, 4, 5).reshape(n * (h - 2) * (w - 2), c * 9)
        out = cols @ kernel
        return np.maximum(out, 0).reshape(n, h - 2, w - 2, -1).transpose(0, 3, 1, 2)

    def forward(self, x):
        x = self.conv3x3(x, self.k1)  # N, 16, 30, 30
        n, c, h, w = x.shape
        x = x.reshape(n, c, h // 2, 2, w // 2, 2).max(axis=(3, 5))  # N, 16, 15, 15
        x = self.conv3x3(np.ascontiguousarray(x), self.k2)  # N, 32, 13, 13
        return (x.mean(axis=(2, 3)) @ self.dense).astype(np.float32)
