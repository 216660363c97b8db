"""tiny_echo: OUTPUT0 = INPUT0 * 2 + 1 (FP32 [8]); near-zero compute, for wiring tests."""

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

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            y = (x * np.float32(2.0) + np.float32(1.0)).astype(np.float32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", y)]))
        return responses
