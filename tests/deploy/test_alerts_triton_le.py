"""How a real Triton 2.51 prints histogram bucket bounds, and that the rules' `le` regex matches them.

Triton 2.51 has no per-model `nv_inference_first_response_histogram_ms` for ordinary
(non-decoupled) models and rejects `model_metrics` in config.pbtxt, but its Python
backend can export a custom histogram; the bounds go through the same prometheus-cpp
serializer. A probe model declares a bucket at every SLO of the bundled example.
"""

from __future__ import annotations

import re
import subprocess
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest
from processes import stop_process

from agents.triton import find_tritonserver, free_ports, prepare_backend_dir, triton_env
from deploy.alerts import le_matcher, le_text
from planner.workload_file import load_workloads_file

pytestmark = pytest.mark.triton

SLOS = sorted({w.slo_ms for w in load_workloads_file().workloads} | {2.5, 12.5})

MODEL = textwrap.dedent("""
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def initialize(self, args):
            self.family = pb_utils.MetricFamily(name="stoke_probe_latency_ms", description="probe",
                                                kind=pb_utils.MetricFamily.HISTOGRAM)
            self.hist = self.family.Metric(labels={"model": "latency_probe"}, buckets=BUCKETS)

        def execute(self, requests):
            out = []
            for r in requests:
                x = pb_utils.get_input_tensor_by_name(r, "IN")
                self.hist.observe(11.0)
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x.as_numpy())]))
            return out
""")

CONFIG = """name: "latency_probe"
backend: "python"
max_batch_size: 0
input { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] }
output { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] }
instance_group { kind: KIND_CPU count: 1 }
"""


@pytest.fixture
def triton_metrics(tmp_path: Path):
    model_dir = tmp_path / "repo" / "latency_probe"
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "1" / "model.py").write_text(MODEL.replace("BUCKETS", repr([float(s) for s in SLOS])))
    (model_dir / "config.pbtxt").write_text(CONFIG)
    http, grpc, metrics = free_ports(3)
    cmd = [
        str(find_tritonserver()),
        f"--model-repository={tmp_path / 'repo'}",
        f"--backend-directory={prepare_backend_dir(tmp_path)}",
        "--model-control-mode=explicit",
        "--load-model=latency_probe",
        f"--http-port={http}",
        f"--grpc-port={grpc}",
        f"--metrics-port={metrics}",
        "--http-address=127.0.0.1",
        "--grpc-address=127.0.0.1",
        "--metrics-address=127.0.0.1",
        "--allow-gpu-metrics=false",
        "--disable-auto-complete-config",
        "--exit-on-error=true",
        "--pinned-memory-pool-byte-size=0",
    ]
    log = open(tmp_path / "triton.log", "wb")
    proc = subprocess.Popen(cmd, env=triton_env(), stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{http}/v2/models/latency_probe/ready", timeout=1)
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        "tritonserver did not start: " + (tmp_path / "triton.log").read_text()[-2000:]
                    ) from None
                time.sleep(0.2)
        body = b'{"inputs":[{"name":"IN","shape":[1],"datatype":"FP32","data":[1.0]}]}'
        for _ in range(3):
            req = urllib.request.Request(
                f"http://127.0.0.1:{http}/v2/models/latency_probe/infer",
                data=body,
                headers={"Content-Type": "application/json"},
            )
            urllib.request.urlopen(req, timeout=10).read()
        yield urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=10).read().decode()
    finally:
        stop_process(proc, timeout_s=15)
        log.close()


def test_triton_bucket_bounds_match_the_rule_regex(triton_metrics: str):
    bounds = re.findall(r'^stoke_probe_latency_ms_bucket\{[^}]*le="([^"]+)"[^}]*\} (\S+)$', triton_metrics, re.M)
    printed = {le: float(v) for le, v in bounds}
    assert printed, triton_metrics[-2000:]
    for slo in SLOS:
        matching = [le for le in printed if re.fullmatch(le_matcher(slo), le)]
        assert matching == [le_text(slo)], (slo, sorted(printed))  # Triton prints '15', '12.5'
        assert printed[le_text(slo)] == (3.0 if slo >= 11.0 else 0.0)
    assert printed["+Inf"] == 3.0
