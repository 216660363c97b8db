"""accel_sim: a simulated accelerator. A batch of b requests takes (base_ms + per_sample_ms * b) / cores.

Triton Python-backend model; numpy only. `cores` is the number of CPU cores of its share (its
affinity): like a GPU under an MPS share, the model runs one batch at a time, and a larger share
runs it faster. It waits (sleeps) instead of computing, like a CPU thread waiting on a GPU, so
its service time is exact whatever else runs on the machine: the model of the closed-loop tests.
`base_ms` and `per_sample_ms` come from config.pbtxt; `stoke_cpu_instances: 1` asks stoke's
Triton fleet for one instance whatever the share. OUTPUT0 = 2 * INPUT0 + 1.

Test hook (see triton_repo/README.md): a file `slowdown` in this version directory holding a
multiplier (e.g. `2`) makes every batch take that many times longer, from the next batch on.
"""

import json
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class Slowdown:
    """The test hook: the multiplier in `<version dir>/slowdown` (absent or unreadable: 1), re-read when it changes."""

    def __init__(self, args):
        self.path = os.path.join(args["model_repository"], args["model_version"], "slowdown")
        self.stamp = None
        self.factor = 1.0

    def current(self):
        try:
            st = os.stat(self.path)
        except OSError:
            self.stamp, self.factor = None, 1.0
            return 1.0
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp != self.stamp:
            self.stamp = stamp
            try:
                with open(self.path) as f:
                    self.factor = min(100.0, max(1.0, float(f.read().strip() or "1")))
            except (OSError, ValueError):
                self.factor = 1.0
        return self.factor


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = config.get("parameters", {})
        limit = int(params.get("max_supported_batch", {}).get("string_value", "1024"))
        if int(config.get("max_batch_size", 0)) > limit:
            raise pb_utils.TritonModelException(
                f"max_batch_size {config['max_batch_size']} exceeds max_supported_batch {limit}"
            )
        self.base_ms = float(params.get("base_ms", {}).get("string_value", "10"))
        self.per_sample_ms = float(params.get("per_sample_ms", {}).get("string_value", "5"))
        self.slowdown = Slowdown(args)

    def execute(self, requests):
        started = time.perf_counter()
        arrays = [pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() for r in requests]
        batch = sum(a.shape[0] for a in arrays)
        cores = max(1, len(os.sched_getaffinity(0)))
        duration = (self.base_ms + self.per_sample_ms * batch) / cores * self.slowdown.current() / 1000.0
        responses = [
            pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", (2.0 * a + 1.0).astype(np.float32))]) for a in arrays
        ]
        left = started + duration - time.perf_counter()
        if left > 0:
            time.sleep(left)
        return responses
