"""batch_sleep: OUTPUT0 = INPUT0 (FP32 [8]); a batch of k samples takes exactly a + c*k ms.

A model with a known, deterministic service curve, for checking the batching
latency model (`interference.batching`) against Triton's real dynamic batcher
(`benchmarks/bench_triton_batching.py`). a and c are the config parameters
`sleep_base_ms` and `sleep_per_item_ms`. The time is counted from the moment
`execute` is entered, and the model sleeps until then + a + c*k: reading the
inputs and building the responses happen inside that time, so per-request
Python work does not add to the service time. It sleeps (no CPU use), so on a
small machine it leaves the cores to Triton and the load generator.
"""

import json
import time

import triton_python_backend_utils as pb_utils


def _param(config, key, default):
    return config.get("parameters", {}).get(key, {}).get("string_value", default)


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        limit = int(_param(config, "max_supported_batch", "1024"))
        if int(config.get("max_batch_size", 0)) > limit:
            raise pb_utils.TritonModelException(
                f"max_batch_size {config['max_batch_size']} exceeds max_supported_batch {limit}"
            )
        try:
            self.base_s = float(_param(config, "sleep_base_ms", "6")) / 1000.0
            self.per_item_s = float(_param(config, "sleep_per_item_ms", "1.5")) / 1000.0
        except ValueError as err:
            raise pb_utils.TritonModelException(f"sleep_base_ms / sleep_per_item_ms must be numbers: {err}") from None
        if self.base_s < 0 or self.per_item_s < 0:
            raise pb_utils.TritonModelException("sleep_base_ms and sleep_per_item_ms must be >= 0")

    def execute(self, requests):
        started = time.perf_counter()
        responses, samples = [], 0
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            samples += x.shape[0]
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x.copy())]))
        remaining = started + self.base_s + self.per_item_s * samples - time.perf_counter()
        if remaining > 0:
            time.sleep(remaining)
        return responses
